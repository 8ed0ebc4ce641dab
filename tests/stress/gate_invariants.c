/*
 * Threaded invariant checkers for the gate: threads x iterations x limit.
 * Holders are counted outside the gate (incremented after a grant,
 * decremented before a release), so the count never exceeds the true number
 * of holders and any excess it shows is a real violation.
 */
#include <criterion/criterion.h>
#include <sluice/gate.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

#define THREADS 4

/* ---- random acquire / cancel / timeout / release with a fixed limit ------- */

struct chaos {
    struct sluice_gate *g;
    uint32_t limit;
    _Atomic(int) holders;
    _Atomic(int) max_holders;
    _Atomic(int) stop;
    struct sluice_cancel tokens[THREADS];
    _Atomic(long) ops[5];
};

struct worker {
    struct chaos *c;
    int id;
    long iters;
};

static void hold(struct chaos *c, uint64_t *rng)
{
    int h = atomic_fetch_add(&c->holders, 1) + 1;
    int m = atomic_load(&c->max_holders);
    while (h > m && !atomic_compare_exchange_weak(&c->max_holders, &m, h))
        ;
    cr_assert_leq(h, (int)c->limit, "%d holders with limit %u", h, c->limit);
    for (uint64_t spin = test_rand(rng) % 64; spin > 0; spin--)
        sluice_cpu_relax();
    atomic_fetch_sub(&c->holders, 1);
    sluice_gate_release(c->g);
}

static void *chaos_worker(void *p)
{
    struct worker *w = p;
    struct chaos *c = w->c;
    uint64_t rng = (uint64_t)w->id * 7919 + 1;
    struct sluice_cancel *token = &c->tokens[w->id];
    for (long i = 0; i < w->iters; i++) {
        uint64_t r = test_rand(&rng) % 100;
        int status;
        struct timespec dl;
        if (r < 55) { /* plain blocking acquire */
            status = sluice_gate_acquire(c->g, NULL, NULL);
            cr_assert_eq(status, SLUICE_OK);
            atomic_fetch_add(&c->ops[0], 1);
        } else if (r < 75) { /* tryacquire */
            status = sluice_gate_tryacquire(c->g);
            cr_assert(status == SLUICE_OK || status == SLUICE_EAGAIN);
            atomic_fetch_add(&c->ops[1], 1);
        } else if (r < 80) { /* a deadline that may expire while queued */
            int64_t ns = (int64_t)(test_rand(&rng) % 50000);
            status = sluice_gate_acquire(c->g, sluice_deadline_in(&dl, ns), NULL);
            cr_assert(status == SLUICE_OK || status == SLUICE_ETIMEDOUT);
            atomic_fetch_add(&c->ops[2], 1);
        } else { /* a token the canceller thread may fire at any moment */
            sluice_cancel_reset(token);
            status = sluice_gate_acquire(c->g, NULL, token);
            cr_assert(status == SLUICE_OK || status == SLUICE_ECANCELED);
            atomic_fetch_add(&c->ops[3], 1);
        }
        if (status == SLUICE_OK)
            hold(c, &rng);
        else
            atomic_fetch_add(&c->ops[4], 1);
    }
    return NULL;
}

static void *canceller(void *p)
{
    struct chaos *c = p;
    uint64_t rng = 99;
    while (!atomic_load(&c->stop)) {
        sluice_cancel_fire(&c->tokens[test_rand(&rng) % THREADS]);
        for (uint64_t spin = test_rand(&rng) % 2000; spin > 0; spin--)
            sluice_cpu_relax();
    }
    return NULL;
}

static void run_chaos(uint32_t limit, long iters_per_thread)
{
    struct chaos c = {.limit = limit};
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = limit}, &c.g),
                 SLUICE_OK);
    for (int i = 0; i < THREADS; i++)
        sluice_cancel_init(&c.tokens[i]);
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++)
        w[i] = (struct worker){&c, i, iters_per_thread};
    pthread_t cancel_thread;
    pthread_create(&cancel_thread, NULL, canceller, &c);
    test_run_threads(THREADS, chaos_worker, w, sizeof w[0]);
    atomic_store(&c.stop, 1);
    pthread_join(cancel_thread, NULL);

    struct sluice_gate_counts counts = sluice_gate_stats(c.g);
    cr_assert_eq(counts.in_flight, 0, "in flight after quiescence: %u", counts.in_flight);
    cr_assert_eq(counts.waiting, 0, "waiting after quiescence: %u", counts.waiting);
    /* No permit lost or duplicated: exactly `limit` can be taken now. */
    for (uint32_t i = 0; i < limit; i++)
        cr_assert_eq(sluice_gate_tryacquire(c.g), SLUICE_OK, "permit %u of %u lost", i, limit);
    cr_assert_eq(sluice_gate_tryacquire(c.g), SLUICE_EAGAIN, "a permit was duplicated");
    cr_assert_gt(atomic_load(&c.ops[4]), 0, "the run never exercised a failed wait");
    cr_assert_eq(atomic_load(&c.max_holders), (int)limit, "the run never saturated the gate");
    sluice_gate_destroy(c.g);
}

Test(gate_stress, no_permit_lost_or_duplicated_under_random_acquire_cancel_timeout_release_limit1)
{
    run_chaos(1, SCALED(150000));
}

Test(gate_stress, no_permit_lost_or_duplicated_under_random_acquire_cancel_timeout_release_limit3)
{
    run_chaos(3, SCALED(150000));
}

/* ---- the limit moves while threads acquire -------------------------------- */

#define HISTORY 8192

struct moving {
    struct sluice_gate *g;
    _Atomic(int) holders;
    _Atomic(int) stop;
    /* limits[e] is the limit of epoch e. Raising: the new epoch is published
     * before set_limit; lowering: after it, once no grant can use the old
     * frontier any more. So a grant must fit under the largest limit of any
     * epoch that overlapped its acquire call. */
    _Atomic(uint32_t) limits[HISTORY];
    _Atomic(uint32_t) epoch;
    _Atomic(long) grants;
};

static void *moving_worker(void *p)
{
    struct worker *w = p;
    struct moving *m = (struct moving *)(void *)w->c;
    uint64_t rng = (uint64_t)w->id + 17;
    for (long i = 0; i < w->iters; i++) {
        uint32_t e0 = atomic_load(&m->epoch);
        struct timespec dl;
        int status = sluice_gate_acquire(m->g, sluice_deadline_in(&dl, 20 * SLUICE_NS_PER_MS), NULL);
        if (status != SLUICE_OK) {
            cr_assert_eq(status, SLUICE_ETIMEDOUT);
            continue;
        }
        int h = atomic_fetch_add(&m->holders, 1) + 1;
        uint32_t e1 = atomic_load(&m->epoch);
        uint32_t bound = 0;
        for (uint32_t e = e0; e <= e1; e++)
            bound = atomic_load(&m->limits[e]) > bound ? atomic_load(&m->limits[e]) : bound;
        cr_assert_leq((uint32_t)h, bound, "%d holders, largest limit in epochs %u..%u is %u", h, e0,
                      e1, bound);
        atomic_fetch_add(&m->grants, 1);
        for (uint64_t spin = test_rand(&rng) % 128; spin > 0; spin--)
            sluice_cpu_relax();
        atomic_fetch_sub(&m->holders, 1);
        sluice_gate_release(m->g);
    }
    return NULL;
}

static void *limit_mover(void *p)
{
    struct moving *m = p;
    uint64_t rng = 5;
    uint32_t current = atomic_load(&m->limits[0]);
    while (!atomic_load(&m->stop) && atomic_load(&m->epoch) + 1 < HISTORY) {
        uint32_t next = 1 + (uint32_t)(test_rand(&rng) % 6);
        uint32_t e = atomic_load(&m->epoch);
        if (next > current) {
            atomic_store(&m->limits[e + 1], next);
            atomic_store(&m->epoch, e + 1);
            cr_assert_eq(sluice_gate_set_limit(m->g, next), SLUICE_OK);
        } else {
            cr_assert_eq(sluice_gate_set_limit(m->g, next), SLUICE_OK);
            atomic_store(&m->limits[e + 1], next);
            atomic_store(&m->epoch, e + 1);
        }
        current = next;
        for (uint64_t spin = test_rand(&rng) % 20000; spin > 0; spin--)
            sluice_cpu_relax();
    }
    return NULL;
}

Test(gate_stress, never_more_holders_than_the_limit_while_it_moves_up_and_down)
{
    struct moving m = {0};
    atomic_store(&m.limits[0], 2);
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 2}, &m.g),
                 SLUICE_OK);
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++)
        w[i] = (struct worker){(struct chaos *)(void *)&m, i, SCALED(100000)};
    pthread_t mover;
    pthread_create(&mover, NULL, limit_mover, &m);
    test_run_threads(THREADS, moving_worker, w, sizeof w[0]);
    atomic_store(&m.stop, 1);
    pthread_join(mover, NULL);

    cr_assert_gt(atomic_load(&m.epoch), 10, "the limit barely moved");
    cr_assert_gt(atomic_load(&m.grants), 0);
    uint32_t final_limit = sluice_gate_stats(m.g).limit;
    struct sluice_gate_counts counts = sluice_gate_stats(m.g);
    cr_assert_eq(counts.in_flight, 0);
    cr_assert_eq(counts.waiting, 0);
    for (uint32_t i = 0; i < final_limit; i++)
        cr_assert_eq(sluice_gate_tryacquire(m.g), SLUICE_OK, "permit %u of %u lost", i, final_limit);
    cr_assert_eq(sluice_gate_tryacquire(m.g), SLUICE_EAGAIN, "a permit was duplicated");
    sluice_gate_destroy(m.g);
}

/* ---- async waiters racing cancels and grants ------------------------------ */

struct async_race {
    struct sluice_gate *g;
    _Atomic(long) callbacks;
    _Atomic(long) granted;
};

struct async_rec {
    struct sluice_gate_waiter w;
    struct async_race *race;
    _Atomic(int) calls;
    _Atomic(int) status;
};

static void async_race_cb(struct sluice_gate_waiter *w, int status)
{
    struct async_rec *r = (struct async_rec *)w;
    atomic_fetch_add(&r->race->callbacks, 1);
    atomic_store(&r->status, status);
    /* Last touch: once calls is 1 the owner may reuse the record. */
    atomic_fetch_add(&r->calls, 1);
}

static void *async_racer(void *p)
{
    struct worker *w = p;
    struct async_race *race = (struct async_race *)(void *)w->c;
    uint64_t rng = (uint64_t)w->id * 31 + 3;
    for (long i = 0; i < w->iters; i++) {
        struct async_rec rec = {.race = race};
        rec.w.cb = async_race_cb;
        sluice_gate_acquire_async(race->g, &rec.w);
        if (test_rand(&rng) % 2 && atomic_load(&rec.calls) == 0) {
            int rc = sluice_gate_cancel_async(race->g, &rec.w);
            cr_assert(rc == SLUICE_OK || rc == SLUICE_EAGAIN);
        }
        /* The callback runs exactly once, on some thread: wait for it. */
        while (atomic_load(&rec.calls) == 0)
            sched_yield();
        cr_assert_eq(atomic_load(&rec.calls), 1);
        if (atomic_load(&rec.status) == SLUICE_OK) {
            atomic_fetch_add(&race->granted, 1);
            sluice_gate_release(race->g);
        } else {
            cr_assert_eq(atomic_load(&rec.status), SLUICE_ECANCELED);
        }
        cr_assert_eq(atomic_load(&rec.calls), 1, "callback ran twice");
    }
    return NULL;
}

Test(gate_stress, async_callback_runs_exactly_once_when_cancels_race_grants)
{
    struct async_race race = {0};
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 1}, &race.g),
                 SLUICE_OK);
    struct worker w[THREADS];
    long iters = SCALED(100000);
    for (int i = 0; i < THREADS; i++)
        w[i] = (struct worker){(struct chaos *)(void *)&race, i, iters};
    test_run_threads(THREADS, async_racer, w, sizeof w[0]);
    cr_assert_eq(atomic_load(&race.callbacks), iters * THREADS);
    cr_assert_gt(atomic_load(&race.granted), 0);
    struct sluice_gate_counts counts = sluice_gate_stats(race.g);
    cr_assert_eq(counts.in_flight, 0);
    cr_assert_eq(counts.waiting, 0);
    cr_assert_eq(sluice_gate_tryacquire(race.g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(race.g), SLUICE_EAGAIN);
    sluice_gate_destroy(race.g);
}

/* ---- one token shared by many sleeping waiters ----------------------------- */

struct shared_token {
    struct sluice_gate *g;
    struct sluice_cancel token;
    _Atomic(int) returned;
    _Atomic(int) cancelled;
};

static void *shared_token_waiter(void *p)
{
    struct shared_token *s = p;
    if (sluice_gate_acquire(s->g, NULL, &s->token) == SLUICE_ECANCELED)
        atomic_fetch_add(&s->cancelled, 1);
    atomic_fetch_add(&s->returned, 1);
    return NULL;
}

/* The canceller runs at the lowest priority (a background thread on a busy
 * machine): woken waiters get the CPU before it does. */
static void *low_priority_fire(void *token)
{
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    sluice_cancel_fire(token);
    return NULL;
}

Test(gate_stress, firing_a_token_shared_by_hundreds_of_sleeping_waiters_wakes_them_all_promptly,
     .timeout = 120)
{
    /* Firing used to wake each waiter under the token's spinlock while the
     * woken ones spun on it to unregister: a convoy that grew with the
     * square of the waiters on a small machine. */
    const int n = SCALED(500);
    struct shared_token s = {0};
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 1}, &s.g), SLUICE_OK);
    sluice_cancel_init(&s.token);
    cr_assert_eq(sluice_gate_acquire(s.g, NULL, NULL), SLUICE_OK); /* nobody else gets in */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    cr_assert_not_null(tids);
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&tids[i], &attr, shared_token_waiter, &s), 0);
    pthread_attr_destroy(&attr);
    int64_t deadline = sluice_monotonic_ns() + 60 * SLUICE_NS_PER_SEC;
    while (sluice_gate_stats(s.g).waiting < (uint32_t)n) {
        cr_assert_lt(sluice_monotonic_ns(), deadline, "waiters never queued");
        usleep(1000);
    }
    usleep(20000); /* let the last ones park */
    int64_t t0 = sluice_monotonic_ns();
    pthread_t firer;
    cr_assert_eq(pthread_create(&firer, NULL, low_priority_fire, &s.token), 0);
    while (atomic_load(&s.returned) < n) {
        cr_assert_lt(sluice_monotonic_ns() - t0, 60 * SLUICE_NS_PER_SEC, "waiters never woke");
        usleep(1000);
    }
    int64_t took = sluice_monotonic_ns() - t0;
    pthread_join(firer, NULL);
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    fprintf(stderr, "shared token: %d waiters woke in %.1f ms\n", n, took / 1e6);
    cr_assert_eq(atomic_load(&s.cancelled), n);
    /* Generous: a healthy fire takes milliseconds; the convoy took seconds. */
    cr_assert_lt(took, 3 * SLUICE_NS_PER_SEC, "fire to last wake took %.2f s", took / 1e9);
    struct sluice_gate_counts c = sluice_gate_stats(s.g);
    cr_assert_eq(c.in_flight, 1);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_release(s.g);
    sluice_gate_destroy(s.g);
}
