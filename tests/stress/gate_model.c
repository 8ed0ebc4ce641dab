/*
 * A randomized linearizability check of the gate:
 * three threads run a few random operations each (acquire with a short
 * deadline and a shared token, tryacquire, release of a permit held, cancel
 * = fire the token, set_limit), every call stamped at invocation and response
 * on one global counter. The history must then have a linearization: an order
 * that respects real time (a call that returned before another began comes
 * first) in which every call is legal for a sequential semaphore. The search
 * is Wing and Gong's: try each call that may go next, apply it to the model,
 * recurse, undo.
 *
 * The sequential semaphore: `limit` and `held`. take (a granted acquire or
 * tryacquire) needs held < limit; give (release) decrements held; set_limit
 * replaces the limit (held may exceed a lowered one); a tryacquire that fails
 * needs held >= limit, or an acquire in flight that may be in line (tryacquire
 * never jumps a waiter); an acquire that timed out needs held >= limit at some
 * point of its call (it had to wait); one that was cancelled needs a fire that
 * began before it returned.
 */
#include <criterion/criterion.h>
#include <sluice/gate.h>

#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "common.h"

enum { THREADS = 3, OPS = 4, CALLS = THREADS * OPS };

enum op_kind { OP_ACQUIRE, OP_TRY, OP_RELEASE, OP_CANCEL, OP_LIMIT };

struct call {
    enum op_kind kind;
    int thread;
    uint32_t arg; /* OP_LIMIT: the new limit */
    int64_t inv, resp;
    int status;
};

struct history {
    struct sluice_gate *g;
    struct sluice_cancel token;
    _Atomic(int64_t) clock;
    _Atomic(int) ready;
    _Atomic(int) finished;
    struct call calls[CALLS];
    int n;
};

struct worker {
    struct history *h;
    int thread;
    uint64_t rng;
};

static int64_t tick(struct history *h)
{
    return atomic_fetch_add(&h->clock, 1);
}

static void *run_worker(void *p)
{
    struct worker *w = p;
    struct history *h = w->h;
    int held = 0;
    atomic_fetch_add(&h->ready, 1);
    while (atomic_load(&h->ready) < THREADS)
        sluice_cpu_relax();
    for (int i = 0; i < OPS; i++) {
        struct call *c = &h->calls[w->thread * OPS + i];
        uint64_t r = test_rand(&w->rng) % 100;
        c->thread = w->thread;
        c->kind = held && r < 40 ? OP_RELEASE
                  : r < 45       ? OP_CANCEL
                  : r < 55       ? OP_LIMIT
                  : r < 75       ? OP_TRY
                                 : OP_ACQUIRE;
        c->arg = 1 + (uint32_t)(test_rand(&w->rng) % 2);
        struct timespec dl;
        sluice_deadline_in(&dl, 200000);
        c->inv = tick(h);
        switch (c->kind) {
        case OP_ACQUIRE:
            c->status = sluice_gate_acquire(h->g, &dl, &h->token);
            held += c->status == SLUICE_OK;
            break;
        case OP_TRY:
            c->status = sluice_gate_tryacquire(h->g);
            held += c->status == SLUICE_OK;
            break;
        case OP_RELEASE:
            sluice_gate_release(h->g);
            held--;
            c->status = SLUICE_OK;
            break;
        case OP_CANCEL:
            sluice_cancel_fire(&h->token);
            c->status = SLUICE_OK;
            break;
        case OP_LIMIT:
            c->status = sluice_gate_set_limit(h->g, c->arg);
            break;
        }
        c->resp = tick(h);
    }
    /* Give back what is still held, once every thread's history is done
     * (a release now would be a call the history does not show). */
    atomic_fetch_add(&h->finished, 1);
    while (atomic_load(&h->finished) < THREADS)
        sched_yield();
    while (held-- > 0)
        sluice_gate_release(h->g);
    return NULL;
}

/* ---- the search ------------------------------------------------------------- */

struct model {
    uint32_t limit, held;
};

struct search {
    struct history *h;
    bool done[CALLS];
    bool saw_blocked[CALLS]; /* a timed-out acquire found held >= limit at some point */
    long nodes;
};

/* Could call j still be in line (an acquire in flight) when call i ran? */
static bool waiter_in_flight(const struct history *h, int i)
{
    for (int j = 0; j < CALLS; j++) {
        const struct call *c = &h->calls[j];
        if (j != i && c->kind == OP_ACQUIRE && c->status != SLUICE_EINVAL &&
            c->inv < h->calls[i].resp && c->resp > h->calls[i].inv)
            return true;
    }
    return false;
}

static bool fire_before(const struct history *h, int i)
{
    for (int j = 0; j < CALLS; j++)
        if (h->calls[j].kind == OP_CANCEL && h->calls[j].inv < h->calls[i].resp)
            return true;
    return false;
}

static bool linearize(struct search *s, struct model m, int left)
{
    if (left == 0)
        return true;
    if (++s->nodes > 2000000)
        return true; /* give up searching (never seen with 12 calls); not a failure */
    struct history *h = s->h;
    /* A call may go next if no pending call returned before it began. */
    int64_t first_resp = INT64_MAX;
    for (int i = 0; i < CALLS; i++)
        if (!s->done[i] && h->calls[i].resp < first_resp)
            first_resp = h->calls[i].resp;
    /* Note held >= limit for every acquire in flight that timed out. */
    bool noted[CALLS] = {false};
    if (m.held >= m.limit)
        for (int i = 0; i < CALLS; i++)
            if (!s->done[i] && h->calls[i].inv < first_resp && h->calls[i].kind == OP_ACQUIRE &&
                h->calls[i].status == SLUICE_ETIMEDOUT && !s->saw_blocked[i])
                noted[i] = s->saw_blocked[i] = true;
    bool ok = false;
    for (int i = 0; i < CALLS && !ok; i++) {
        const struct call *c = &h->calls[i];
        if (s->done[i] || c->inv > first_resp)
            continue;
        struct model next = m;
        bool legal;
        switch (c->kind) {
        case OP_ACQUIRE:
        case OP_TRY:
            if (c->status == SLUICE_OK) {
                legal = m.held < m.limit;
                next.held++;
            } else if (c->kind == OP_TRY) {
                legal = m.held >= m.limit || waiter_in_flight(h, i);
            } else if (c->status == SLUICE_ECANCELED) {
                legal = fire_before(h, i);
            } else {
                legal = c->status == SLUICE_ETIMEDOUT && (s->saw_blocked[i] || m.held >= m.limit);
            }
            break;
        case OP_RELEASE:
            legal = m.held > 0;
            next.held--;
            break;
        case OP_LIMIT:
            legal = true;
            next.limit = c->arg;
            break;
        default:
            legal = true;
            break;
        }
        if (!legal)
            continue;
        s->done[i] = true;
        ok = linearize(s, next, left - 1);
        s->done[i] = false;
    }
    for (int i = 0; i < CALLS; i++)
        if (noted[i])
            s->saw_blocked[i] = false;
    return ok;
}

static const char *op_name(enum op_kind k)
{
    static const char *const names[] = {"acquire", "tryacquire", "release", "cancel",
                                        "set_limit"};
    return names[k];
}

Test(gate_model, random_three_thread_histories_linearize_against_a_sequential_semaphore,
     .timeout = 120)
{
    struct history *h = calloc(1, sizeof *h);
    cr_assert_not_null(h);
    long rounds = SCALED(500), searched = 0;
    for (long round = 0; round < rounds; round++) {
        memset(h, 0, sizeof *h);
        uint32_t limit = 1 + (uint32_t)(round % 2);
        cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = limit}, &h->g),
                     SLUICE_OK);
        sluice_cancel_init(&h->token);
        struct worker w[THREADS];
        pthread_t tids[THREADS];
        for (int t = 0; t < THREADS; t++) {
            w[t] = (struct worker){h, t, (uint64_t)round * 7919 + (uint64_t)t};
            pthread_create(&tids[t], NULL, run_worker, &w[t]);
        }
        for (int t = 0; t < THREADS; t++)
            pthread_join(tids[t], NULL);
        struct search s = {.h = h};
        bool ok = linearize(&s, (struct model){limit, 0}, CALLS);
        searched += s.nodes;
        if (!ok) {
            for (int i = 0; i < CALLS; i++) {
                const struct call *c = &h->calls[i];
                cr_log_warn("t%d %-10s arg %u [%lld, %lld] -> %s", c->thread, op_name(c->kind),
                             c->arg, (long long)c->inv, (long long)c->resp,
                             sluice_status_name(c->status));
            }
            cr_assert_fail("round %ld (limit %u): the history above has no linearization", round,
                           limit);
        }
        struct sluice_gate_counts c = sluice_gate_stats(h->g);
        cr_assert_eq(c.in_flight, 0, "round %ld: %u permits still held", round, c.in_flight);
        cr_assert_eq(c.waiting, 0);
        sluice_gate_destroy(h->g);
    }
    cr_log_info("%ld histories, %ld search nodes", rounds, searched);
    free(h);
}
