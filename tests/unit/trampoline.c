/*
 * The trampoline (sluice/gate.h) is one per thread in the whole program,
 * not one per translation unit: an async callback that gives its permit
 * back through code in another .c file never runs the next callback
 * nested inside itself. The other file is trampoline_tu/other_tu.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sluice/pool.h>

#include "common.h"
#include "trampoline_tu/other_tu.h"

Test(trampoline, every_translation_unit_shares_the_threads_trampoline)
{
    cr_assert_eq(other_tu_trampoline(), (const void *)&sluice__gate_pending,
                 "this file and trampoline_tu/other_tu.c keep separate lists");
}

/* A callback that holds an error-checking mutex while it releases through
 * the other file, as an event loop's handler holding its loop lock would:
 * a callback nested inside it would get EDEADLK. */
struct nesting {
    pthread_mutex_t mu;
    int depth, max_depth, deadlocks, calls;
};

static void nesting_init(struct nesting *n)
{
    memset(n, 0, sizeof *n);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&n->mu, &a);
    pthread_mutexattr_destroy(&a);
}

/* Enter a callback; false if the mutex says it is nested. */
static bool nesting_enter(struct nesting *n)
{
    n->calls++;
    if (++n->depth > n->max_depth)
        n->max_depth = n->depth;
    if (pthread_mutex_lock(&n->mu) == EDEADLK) {
        n->deadlocks++;
        n->depth--;
        return false;
    }
    return true;
}

static void nesting_leave(struct nesting *n)
{
    pthread_mutex_unlock(&n->mu);
    n->depth--;
}

/* All `calls` callbacks ran, none inside another. */
static void nesting_check(struct nesting *n, int calls)
{
    cr_assert_eq(n->calls, calls);
    cr_assert_eq(n->deadlocks, 0, "a callback ran inside another and its lock said EDEADLK");
    cr_assert_eq(n->max_depth, 1, "callbacks nested %d deep", n->max_depth);
    pthread_mutex_destroy(&n->mu);
}

struct gate_rec {
    struct sluice_gate_waiter w;
    struct sluice_gate *g;
    struct nesting *n;
};

static void release_elsewhere(struct sluice_gate_waiter *w, int status)
{
    struct gate_rec *r = (struct gate_rec *)w->data;
    if (!nesting_enter(r->n))
        return;
    if (status == SLUICE_OK)
        other_tu_gate_release(r->g); /* grants the next waiter, from the other file */
    nesting_leave(r->n);
}

Test(trampoline, a_gate_callback_releasing_through_another_file_never_nests_the_next)
{
    enum { N = 3 };
    struct sluice_gate *g = make_gate(1);
    struct nesting n;
    nesting_init(&n);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct gate_rec r[N];
    for (int i = 0; i < N; i++) {
        r[i] = (struct gate_rec){.w = {.cb = release_elsewhere, .data = &r[i]}, .g = g, .n = &n};
        sluice_gate_acquire_async(g, &r[i].w);
    }
    sluice_gate_release(g);
    nesting_check(&n, N);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

struct pool_rec {
    struct sluice_pool_waiter w;
    struct sluice_pool *p;
    struct nesting *n;
};

static void end_elsewhere(struct sluice_pool_waiter *w, int status)
{
    struct pool_rec *r = (struct pool_rec *)w->data;
    if (!nesting_enter(r->n))
        return;
    if (status == SLUICE_OK)
        other_tu_call_end(r->p, &w->call);
    nesting_leave(r->n);
}

Test(trampoline, a_pool_callback_ending_its_call_in_another_file_never_nests_the_next)
{
    enum { N = 3 };
    struct sluice_pool *p = other_tu_make_pool(&(struct sluice_pool_desc){.active = 1});
    cr_assert_not_null(p);
    struct nesting n;
    nesting_init(&n);
    struct sluice_call first;
    struct sluice_cancel unused; /* not NULL: GCC's constant propagation of a NULL token
                                  * into the pool's wait path trips -Warray-bounds */
    sluice_cancel_init(&unused);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, &unused, &first), SLUICE_OK);
    struct pool_rec r[N];
    for (int i = 0; i < N; i++) {
        r[i] = (struct pool_rec){.w = {.cb = end_elsewhere, .data = &r[i]}, .p = p, .n = &n};
        sluice_pool_call_begin_async(p, &r[i].w);
    }
    sluice_pool_call_end(p, &first, SLUICE_OUTCOME_OK, 0);
    nesting_check(&n, N);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    sluice_pool_destroy(p);
}
