/*
 * The soak: mixed threaded load on three pools for a configurable time,
 * stopped every QUIESCE_MS at a quiescent point where every invariant is
 * checked exactly.
 *
 * Pools:
 *   fixed     active 4, waiting 2; the controller moves its gate limit in
 *             1..4 at random moments (what a limit change does to queued and
 *             in-flight calls, without discovery in the way);
 *   adaptive  active 4, waiting 1, discovery with 1 ms windows and
 *             Retry-After holds of at most 2 ms; calls report 429s (some
 *             with a Retry-After) so discovery cuts, holds and recovers; the
 *             controller clears it;
 *   doomed    active 2, waiting 1; the controller closes it at a random
 *             moment of each round while calls queue on it, and makes a new
 *             one at the next quiescent point.
 * Workers (WORKERS threads) loop over random operations on random pools:
 * runs of 1..3 calls (admit, call_begin/_end, leave) whose waits have no
 * limit, a short deadline, a passed deadline, a token the canceller thread
 * may fire, or a token fired in advance; async calls
 * (sluice_pool_call_begin_async), some withdrawn with _cancel_async at a
 * random moment; and admission bursts (several admits held at once, so the
 * pools really run out). A canceller thread fires armed tokens; an observer
 * thread reads every pool's stats without pause.
 *
 * Checked all the time: every call returns a status its plan allows
 * (ECANCELED only when its token fired, ETIMEDOUT only when its deadline
 * passed, ECLOSED only on a closed pool, ECAPACITY only from admit); a
 * withdrawn async call's callback has run with ECANCELED by the time
 * _cancel_async returns OK, and every async callback runs exactly once;
 * calls in flight never exceed the largest limit in force since the last
 * quiescent point (fixed, doomed) or `active` (adaptive: discovery moves
 * the limit on its own), counted both by the workers and by the pools'
 * stats; admissions never exceed active + waiting.
 * Checked at every quiescent point (all threads parked, holding nothing):
 * every pool reports 0 admitted, 0 in flight, 0 queued; the fixed pool's
 * limit is the one last set; every async callback has run once; and the
 * whole capacity is usable (assert_capacity_intact: exactly limit +
 * waiting admissions, exactly `limit` permits). At the end every pool is
 * closed under load and the final counters are zero. The mix must not be
 * tame: every kind of outcome must have happened. One of them, a pool closed on
 * a queued async call, the controller makes itself at a quiescent point until
 * the mix has (close_with_an_async_call_queued): under two busy loops the mix
 * once went 10 s without one.
 *
 * Length: SLUICE_SOAK_SECONDS in the environment, else the build's
 * default (tests/soak/CMakeLists.txt, cache variable SLUICE_SOAK_SECONDS).
 * Seed: SLUICE_SOAK_SEED, else the clock; printed for a rerun.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <sluice/sluice.h>

#include "common.h"
#include "run_fixtures.h"

#ifndef SLUICE_SOAK_DEFAULT_S
#define SLUICE_SOAK_DEFAULT_S 10
#endif

#define WORKERS 8
#define QUIESCE_MS 200 /* a quiescent point at least this often */
#define STUCK_S 60     /* threads that do not park within this are stuck: fail */
#define ASYNC_PENDING 1 /* statuses are <= 0 */

enum { FIXED, ADAPTIVE, DOOMED, N_POOLS };
static const char *const pool_names[N_POOLS] = {"fixed", "adaptive", "doomed"};
static const uint32_t pool_active[N_POOLS] = {4, 4, 2};
static const uint32_t pool_waiting[N_POOLS] = {2, 1, 1};

/* Outcomes the mix must produce at least once. */
#define TALLY_MAP(X)                                                                               \
    X(CALL_OK) X(CALL_CANCELED) X(CALL_TIMEDOUT) X(CALL_CLOSED) X(ADMIT_FULL) X(ADMIT_CLOSED)      \
    X(ASYNC_OK) X(ASYNC_WITHDRAWN) X(ASYNC_TOO_LATE) X(ASYNC_CLOSED) X(OVERLOADS) X(HOLDS)         \
    X(LIMIT_SETS) X(CLEARS) X(CLOSES) X(QUIESCENT)
enum tally {
#define TALLY_ENUM(name) T_##name,
    TALLY_MAP(TALLY_ENUM)
#undef TALLY_ENUM
    N_TALLIES
};
static const char *const tally_names[N_TALLIES] = {
#define TALLY_NAME(name) #name,
    TALLY_MAP(TALLY_NAME)
#undef TALLY_NAME
};

struct target {
    _Atomic(struct sluice_pool *) pool; /* swapped only at quiescent points */
    _Atomic(uint32_t) inflight_bound;   /* largest limit in force since the last quiescent point */
    _Atomic(int) inside;                /* calls the workers hold on this pool */
    _Atomic(uint64_t) closed_at;        /* tick its close began at, 0 = open */
};

struct async_rec {
    struct sluice_pool_waiter w;
    _Atomic(int) status; /* ASYNC_PENDING until the callback ran */
    _Atomic(int) runs;
};

struct worker {
    int id;
    uint64_t rng;
    struct sluice_cancel token;
    _Atomic(int) armed; /* run_fixtures.h's cancel_arm protocol */
    _Atomic(uint64_t) fired_at; /* tick the canceller fired this run's token at, 0 = not */
    struct async_rec async;
    _Atomic(const char *) doing; /* for the stuck-thread report */
};

static struct target targets[N_POOLS];
static struct worker workers[WORKERS];
static _Atomic(uint64_t) tallies[N_TALLIES];
static _Atomic(uint64_t) async_begun, async_callbacks;
static _Atomic(uint64_t) ticks; /* orders fires against closes (cancel beats close) */
static _Atomic(int) pause_req, parked, stop;
static _Atomic(long) violations;
static char first_violation[512];
static pthread_mutex_t violation_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t fixed_limit; /* controller only */

static void count(enum tally t)
{
    atomic_fetch_add_explicit(&tallies[t], 1, memory_order_relaxed);
}

__attribute__((format(printf, 1, 2))) static void violation(const char *fmt, ...)
{
    if (atomic_fetch_add(&violations, 1) == 0) {
        pthread_mutex_lock(&violation_mu);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_violation, sizeof first_violation, fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&violation_mu);
    }
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int64_t now_ms(void)
{
    return sluice_monotonic_ns() / SLUICE_NS_PER_MS;
}

/* ---- pools ------------------------------------------------------------------ */

static struct sluice_pool *make_pool(int which)
{
    struct sluice_discovery_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.node_id = pool_names[which];
    dd.window_min_ns = SLUICE_NS_PER_MS;
    dd.retry_after_max_ns = 2 * SLUICE_NS_PER_MS;
    char err[256];
    struct sluice_pool_desc d;
    memset(&d, 0, sizeof d);
    d.active = pool_active[which];
    d.waiting = SLUICE_SOME(pool_waiting[which]);
    d.discovery = which == ADAPTIVE ? &dd : NULL;
    d.error = err;
    d.error_size = sizeof err;
    struct sluice_pool *p = NULL;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK, "%s pool: %s", pool_names[which], err);
    return p;
}

/* The largest number of calls the pool may have in flight now. */
static uint32_t inflight_bound(int which)
{
    return which == ADAPTIVE ? pool_active[which] : atomic_load(&targets[which].inflight_bound);
}

/* Close target k's pool, stamping when the close began. */
static void close_target(int k)
{
    atomic_store(&targets[k].closed_at, atomic_fetch_add(&ticks, 1) + 1);
    sluice_pool_close(atomic_load(&targets[k].pool));
}

/* ECLOSED is only allowed from a pool that is closed. */
static bool closed_ok(struct sluice_pool *p, int status)
{
    return status != SLUICE_ECLOSED || sluice_pool_stats(p).closed;
}

/* ---- the calls -------------------------------------------------------------- */

/* A model call: hold the permit for a random while, then end it with a random outcome. */
static void make_call(struct worker *w, int which, struct sluice_pool *p,
                      const struct sluice_call *call)
{
    struct target *t = &targets[which];
    int inside = atomic_fetch_add(&t->inside, 1) + 1;
    if ((uint32_t)inside > inflight_bound(which))
        violation("%s: %d calls in flight, above the bound %u", pool_names[which], inside,
                  inflight_bound(which));
    uint64_t r = test_rand(&w->rng);
    if (r % 8 == 0)
        sleep_us((long)(r >> 8) % 80);
    else
        for (unsigned i = 0; i < (unsigned)(r >> 8) % 2000; i++)
            sluice_cpu_relax();
    atomic_fetch_sub(&t->inside, 1);
    enum sluice_outcome outcome = SLUICE_OUTCOME_OK;
    int64_t retry_after = 0;
    unsigned roll = (unsigned)(r >> 20) % 100;
    if (which == ADAPTIVE && roll < 8) {
        outcome = SLUICE_OUTCOME_OVERLOAD;
        count(T_OVERLOADS);
        if (roll < 3) {
            retry_after = 100000 + (int64_t)((r >> 32) % 900000); /* 0.1 .. 1 ms */
            count(T_HOLDS);
        }
    } else if (roll < 12) {
        outcome = SLUICE_OUTCOME_IGNORE;
    }
    sluice_pool_call_end(p, call, outcome, retry_after);
}

enum wait_kind { W_PLAIN, W_DEADLINE, W_PASSED, W_TOKEN, W_FIRED, W_ASYNC };

static enum wait_kind pick_wait(struct worker *w)
{
    unsigned r = (unsigned)(test_rand(&w->rng) % 100);
    return r < 30 ? W_PLAIN : r < 50 ? W_DEADLINE : r < 55 ? W_PASSED : r < 75 ? W_TOKEN
         : r < 80 ? W_FIRED : W_ASYNC;
}

/* One blocking call_begin with the plan `kind`; checks the status it may end with. */
static void sync_call(struct worker *w, int which, struct sluice_pool *p, enum wait_kind kind)
{
    struct timespec dl;
    const struct timespec *deadline = NULL;
    struct sluice_cancel *token = NULL;
    if (kind == W_DEADLINE)
        deadline = sluice_deadline_in(&dl, (int64_t)(test_rand(&w->rng) % 400000));
    if (kind == W_PASSED)
        deadline = sluice_deadline_in(&dl, -1000);
    if (kind == W_TOKEN || kind == W_FIRED) {
        token = &w->token;
        if (kind == W_FIRED)
            sluice_cancel_fire(token);
        else {
            atomic_store(&w->fired_at, 0);
            cancel_arm(&w->armed);
        }
    }
    struct sluice_call call;
    atomic_store(&w->doing, "call_begin");
    int status = sluice_pool_call_begin(p, deadline, token, &call);
    atomic_store(&w->doing, "call");
    if (kind == W_TOKEN)
        cancel_disarm(&w->armed);
    bool fired = token && sluice_cancel_fired(token);
    /* Cancel beats close: a token fired before the close began must win. One
     * the canceller fired after the call returned (before the disarm) says
     * nothing about the call. */
    uint64_t fired_at = kind == W_TOKEN ? atomic_load(&w->fired_at) : 0;
    uint64_t closed_at = atomic_load(&targets[which].closed_at);
    bool fired_first = kind == W_FIRED || (fired_at && closed_at && fired_at < closed_at);
    bool allowed;
    switch (status) {
    case SLUICE_OK:
        allowed = kind != W_FIRED && kind != W_PASSED;
        break;
    case SLUICE_ECANCELED:
        allowed = fired;
        break;
    case SLUICE_ETIMEDOUT: /* or, holding a permit, less time left than the expected service */
        allowed = !fired && deadline && (sluice_deadline_passed(deadline) || call.refused_late);
        break;
    case SLUICE_ECLOSED:
        allowed = !fired_first && kind != W_PASSED && closed_ok(p, status);
        break;
    default:
        allowed = false;
    }
    if (!allowed)
        violation("%s: call_begin (plan %d, token fired %d) returned %s", pool_names[which],
                  (int)kind, (int)fired, sluice_status_name(status));
    count(status == SLUICE_OK           ? T_CALL_OK
          : status == SLUICE_ECANCELED  ? T_CALL_CANCELED
          : status == SLUICE_ETIMEDOUT  ? T_CALL_TIMEDOUT
                                        : T_CALL_CLOSED);
    if (status == SLUICE_OK)
        make_call(w, which, p, &call);
    if (token)
        sluice_cancel_reset(token); /* no wait uses it any more */
}

static void on_async(struct sluice_pool_waiter *pw, int status)
{
    struct async_rec *r = pw->data;
    atomic_fetch_add(&r->runs, 1);
    atomic_fetch_add(&async_callbacks, 1);
    atomic_store(&r->status, status); /* last touch: the worker may reuse the record */
}

/* sluice_pool_call_cancel_async, checked; true if it withdrew the call. */
static bool async_withdraw(int which, struct sluice_pool *p, struct async_rec *r)
{
    int c = sluice_pool_call_cancel_async(p, &r->w);
    if (c == SLUICE_OK && atomic_load(&r->status) != SLUICE_ECANCELED)
        violation("%s: cancel_async returned OK but the callback said %d", pool_names[which],
                  atomic_load(&r->status));
    if (c != SLUICE_OK && c != SLUICE_EAGAIN)
        violation("%s: cancel_async returned %s", pool_names[which], sluice_status_name(c));
    if (c == SLUICE_EAGAIN)
        count(T_ASYNC_TOO_LATE);
    return c == SLUICE_OK;
}

/* One async call; withdrawn at a random moment (or after it settled) one time in three. */
static void async_call(struct worker *w, int which, struct sluice_pool *p)
{
    struct async_rec *r = &w->async;
    atomic_store(&r->status, ASYNC_PENDING);
    atomic_store(&r->runs, 0);
    r->w.cb = on_async;
    r->w.data = r;
    atomic_fetch_add(&async_begun, 1);
    atomic_store(&w->doing, "async wait");
    sluice_pool_call_begin_async(p, &r->w);
    uint64_t roll = test_rand(&w->rng);
    long cancel_at = roll % 3 == 0 ? (long)((roll >> 8) % 64) : -1;
    bool withdrawn = false, tried = false;
    for (long spin = 0; atomic_load(&r->status) == ASYNC_PENDING; spin++) {
        if (spin == cancel_at) {
            tried = true;
            withdrawn = async_withdraw(which, p, r);
        }
        sluice_pool_poll(p); /* what an event loop's hold timer does */
        if (spin % 8 == 7)
            sleep_us(20);
        else
            sched_yield();
    }
    if (cancel_at >= 0 && !tried && async_withdraw(which, p, r)) /* its callback has run */
        violation("%s: cancel_async withdrew a call whose callback had run", pool_names[which]);
    atomic_store(&w->doing, "async call");
    int status = atomic_load(&r->status);
    if (atomic_load(&r->runs) != 1)
        violation("%s: an async callback ran %d times", pool_names[which], atomic_load(&r->runs));
    bool allowed = status == SLUICE_OK || (status == SLUICE_ECANCELED && withdrawn) ||
                   (status == SLUICE_ECLOSED && closed_ok(p, status));
    if (!allowed)
        violation("%s: async call ended %s (withdrawn %d)", pool_names[which],
                  sluice_status_name(status), (int)withdrawn);
    count(status == SLUICE_OK ? T_ASYNC_OK : status == SLUICE_ECANCELED ? T_ASYNC_WITHDRAWN
                                                                          : T_ASYNC_CLOSED);
    if (status == SLUICE_OK)
        make_call(w, which, p, &r->w.call);
}

/* admit; 1..3 calls; leave. */
static void op_run(struct worker *w, int which, struct sluice_pool *p)
{
    int status = sluice_pool_admit(p);
    if (status != SLUICE_OK) {
        if (status != SLUICE_ECAPACITY && !(status == SLUICE_ECLOSED && closed_ok(p, status)))
            violation("%s: admit returned %s", pool_names[which], sluice_status_name(status));
        count(status == SLUICE_ECAPACITY ? T_ADMIT_FULL : T_ADMIT_CLOSED);
        return;
    }
    int calls = 1 + (int)(test_rand(&w->rng) % 3);
    for (int i = 0; i < calls; i++) {
        enum wait_kind kind = pick_wait(w);
        if (kind == W_ASYNC)
            async_call(w, which, p);
        else
            sync_call(w, which, p, kind);
    }
    sluice_pool_leave(p);
}

/* Hold 1..6 admissions at once, then give them all back. */
static void op_burst(struct worker *w, int which, struct sluice_pool *p)
{
    int want = 1 + (int)(test_rand(&w->rng) % 6), got = 0;
    for (; got < want; got++) {
        int status = sluice_pool_admit(p);
        if (status == SLUICE_OK)
            continue;
        if (status != SLUICE_ECAPACITY && !(status == SLUICE_ECLOSED && closed_ok(p, status)))
            violation("%s: admit returned %s", pool_names[which], sluice_status_name(status));
        count(status == SLUICE_ECAPACITY ? T_ADMIT_FULL : T_ADMIT_CLOSED);
        break;
    }
    sched_yield();
    while (got--)
        sluice_pool_leave(p);
}

/* Threads other than the controller park here while a quiescent point is checked. */
static void park_if_asked(void)
{
    if (!atomic_load(&pause_req))
        return;
    atomic_fetch_add(&parked, 1);
    while (atomic_load(&pause_req))
        sleep_us(200);
    atomic_fetch_sub(&parked, 1);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    while (!atomic_load(&stop)) {
        atomic_store(&w->doing, "parked");
        park_if_asked();
        atomic_store(&w->doing, "admit");
        int which = (int)(test_rand(&w->rng) % N_POOLS);
        struct sluice_pool *p = atomic_load(&targets[which].pool);
        if (test_rand(&w->rng) % 5 == 0)
            op_burst(w, which, p);
        else
            op_run(w, which, p);
    }
    atomic_store(&w->doing, "done");
    return NULL;
}

static void *canceller_main(void *arg)
{
    uint64_t rng = *(uint64_t *)arg;
    while (!atomic_load(&stop)) {
        park_if_asked();
        struct worker *w = &workers[test_rand(&rng) % WORKERS];
        cancel_fire_if_armed(&w->armed, &w->token, &ticks, &w->fired_at);
        random_pause(&rng, 200);
    }
    return NULL;
}

/* Reads every pool's stats all the time: the bounds hold at every instant. */
static void *observer_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        park_if_asked();
        for (int k = 0; k < N_POOLS; k++) {
            struct sluice_pool_counts c = sluice_pool_stats(atomic_load(&targets[k].pool));
            uint32_t bound = inflight_bound(k); /* read after: bounds only grow within a round */
            if (c.in_flight > bound)
                violation("%s: stats say %u in flight, above the bound %u", pool_names[k],
                          c.in_flight, bound);
            if (c.admitted > pool_active[k] + pool_waiting[k])
                violation("%s: stats say %u admitted, above active + waiting = %u",
                          pool_names[k], c.admitted, pool_active[k] + pool_waiting[k]);
            if (c.active < 1 || c.active > pool_active[k])
                violation("%s: limit %u outside 1..%u", pool_names[k], c.active, pool_active[k]);
        }
        sched_yield();
    }
    return NULL;
}

/* ---- the controller (the test's own thread) -------------------------------------- */

static void set_fixed_limit(uint32_t limit)
{
    struct target *t = &targets[FIXED];
    if (limit > atomic_load(&t->inflight_bound))
        atomic_store(&t->inflight_bound, limit); /* before the gate can grant under it */
    cr_assert_eq(sluice_gate_set_limit(sluice__pool_gate(atomic_load(&t->pool)), limit),
                 SLUICE_OK);
    fixed_limit = limit;
    count(T_LIMIT_SETS);
}

static void report_stuck(void)
{
    for (int i = 0; i < WORKERS; i++)
        fprintf(stderr, "soak: worker %d: %s\n", i, atomic_load(&workers[i].doing));
    for (int k = 0; k < N_POOLS; k++) {
        struct sluice_pool_counts c = sluice_pool_stats(atomic_load(&targets[k].pool));
        fprintf(stderr, "soak: %s: admitted %u, in flight %u, queued %u, limit %u, closed %d\n",
                pool_names[k], c.admitted, c.in_flight, c.queued, c.active, (int)c.closed);
    }
}

/* Close pool k with every permit held and an async call queued behind them: its callback
 * hears ECLOSED. The controller runs it at a quiescent point (every other thread parked)
 * while the random mix has not closed a pool on a queued async call yet, which two busy
 * loops on a 2-core machine once kept it from doing in 10 s. */
static void close_with_an_async_call_queued(int k)
{
    struct sluice_pool *p = atomic_load(&targets[k].pool);
    struct sluice_call held[8];
    uint32_t n = sluice_pool_stats(p).active;
    cr_assert_leq(n, 8);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &held[i]), SLUICE_OK);
    static struct async_rec r;
    atomic_store(&r.status, ASYNC_PENDING);
    atomic_store(&r.runs, 0);
    r.w.cb = on_async;
    r.w.data = &r;
    atomic_fetch_add(&async_begun, 1);
    sluice_pool_call_begin_async(p, &r.w);
    cr_assert_eq(atomic_load(&r.status), ASYNC_PENDING, "%s: every permit is held, yet the "
                                                        "async call did not queue", pool_names[k]);
    close_target(k);
    count(T_CLOSES);
    WAIT_UNTIL((sluice_pool_poll(p), atomic_load(&r.status) != ASYNC_PENDING));
    cr_assert_eq(atomic_load(&r.status), SLUICE_ECLOSED, "%s: the queued async call ended %s",
                 pool_names[k], sluice_status_name(atomic_load(&r.status)));
    cr_assert_eq(atomic_load(&r.runs), 1);
    count(T_ASYNC_CLOSED);
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_call_end(p, &held[i], SLUICE_OUTCOME_OK, 0);
}

/* Park every other thread, check everything, start a new round. */
static void quiesce(int helpers, bool final)
{
    atomic_store(&pause_req, 1);
    int64_t give_up = now_ms() + STUCK_S * 1000;
    while (atomic_load(&parked) < helpers) {
        if (now_ms() > give_up) {
            report_stuck();
            cr_assert_fail("threads did not reach a quiescent point within %d s: a lost wake-up "
                           "or a leaked permit (state above)",
                           STUCK_S);
        }
        sleep_us(200);
    }
    cr_assert_eq(atomic_load(&violations), 0, "%ld violations; the first: %s",
                 atomic_load(&violations), first_violation);
    cr_assert_eq(atomic_load(&async_callbacks), atomic_load(&async_begun),
                 "async callbacks ran %" PRIu64 " times for %" PRIu64 " async calls",
                 atomic_load(&async_callbacks), atomic_load(&async_begun));
    for (int k = 0; k < N_POOLS; k++) {
        struct sluice_pool *p = atomic_load(&targets[k].pool);
        struct sluice_pool_counts c = sluice_pool_stats(p);
        cr_assert_eq(c.admitted, 0, "%s: %u admissions leaked", pool_names[k], c.admitted);
        cr_assert_eq(c.in_flight, 0, "%s: %u calls still in flight", pool_names[k], c.in_flight);
        cr_assert_eq(c.queued, 0, "%s: %u calls still queued", pool_names[k], c.queued);
        cr_assert_eq(atomic_load(&targets[k].inside), 0);
        if (k == FIXED)
            cr_assert_eq(c.active, fixed_limit, "fixed: limit %u, set %u", c.active, fixed_limit);
        if (k == FIXED && !c.closed) /* the capacity check expects the configured limit */
            set_fixed_limit(pool_active[FIXED]);
        if (c.closed) {
            cr_assert_eq(sluice_pool_admit(p), SLUICE_ECLOSED, "%s admits after close",
                         pool_names[k]);
            if (!final) { /* the doomed pool: a fresh one for the next round */
                sluice_pool_destroy(p);
                atomic_store(&targets[k].pool, make_pool(k));
                atomic_store(&targets[k].closed_at, 0);
            }
            continue;
        }
        assert_capacity_intact(p);
    }
    if (!final) {
        atomic_store(&targets[FIXED].inflight_bound, fixed_limit);
        atomic_store(&targets[DOOMED].inflight_bound, pool_active[DOOMED]);
        if (!atomic_load(&tallies[T_ASYNC_CLOSED]))
            close_with_an_async_call_queued(DOOMED);
    }
    count(T_QUIESCENT);
    atomic_store(&pause_req, 0);
}

static int soak_seconds(void)
{
    const char *env = getenv("SLUICE_SOAK_SECONDS");
    int s = env && *env ? atoi(env) : SLUICE_SOAK_DEFAULT_S;
    return s > 0 ? s : 1;
}

Test(soak, mixed_load_keeps_every_invariant_at_every_quiescent_point)
{
    int seconds = soak_seconds();
    const char *seed_env = getenv("SLUICE_SOAK_SEED");
    uint64_t seed = seed_env && *seed_env ? strtoull(seed_env, NULL, 0)
                                          : (uint64_t)sluice_monotonic_ns();
    fprintf(stderr, "soak: %d s, %d workers, SLUICE_SOAK_SEED=%" PRIu64 "\n", seconds, WORKERS,
            seed);
    for (int k = 0; k < N_POOLS; k++) {
        atomic_store(&targets[k].pool, make_pool(k));
        atomic_store(&targets[k].inflight_bound, pool_active[k]);
    }
    fixed_limit = pool_active[FIXED];
    pthread_t tids[WORKERS + 2];
    for (int i = 0; i < WORKERS; i++) {
        workers[i].id = i;
        workers[i].rng = seed + (uint64_t)i * 7919u;
        sluice_cancel_init(&workers[i].token);
        atomic_store(&workers[i].doing, "starting");
        pthread_create(&tids[i], NULL, worker_main, &workers[i]);
    }
    uint64_t canceller_seed = seed ^ 0xC0FFEEu, rng = seed ^ 0xB0A7u;
    pthread_create(&tids[WORKERS], NULL, canceller_main, &canceller_seed);
    pthread_create(&tids[WORKERS + 1], NULL, observer_main, NULL);
    const int helpers = WORKERS + 2;

    int64_t start = now_ms(), end = start + (int64_t)seconds * 1000;
    int64_t round_end = start + QUIESCE_MS;
    int64_t close_at = start + QUIESCE_MS / 4 + (int64_t)(test_rand(&rng) % QUIESCE_MS);
    bool final_close = false;
    while (now_ms() < end) {
        sleep_us(500 + (long)(test_rand(&rng) % 4500));
        struct sluice_pool *doomed = atomic_load(&targets[DOOMED].pool);
        if (!final_close && now_ms() >= end - 100) {
            /* The last 100 ms: every pool closes under load. */
            for (int k = 0; k < N_POOLS; k++)
                close_target(k);
            count(T_CLOSES);
            final_close = true;
        }
        if (final_close)
            continue;
        unsigned action = (unsigned)(test_rand(&rng) % 4);
        if (action == 0)
            set_fixed_limit(1 + (uint32_t)(test_rand(&rng) % pool_active[FIXED]));
        else if (action == 1) {
            cr_assert_eq(sluice_pool_clear(atomic_load(&targets[ADAPTIVE].pool)), SLUICE_OK);
            count(T_CLEARS);
        }
        if (now_ms() >= close_at && !sluice_pool_stats(doomed).closed) {
            close_target(DOOMED);
            count(T_CLOSES);
        }
        if (now_ms() >= round_end) {
            quiesce(helpers, false);
            round_end = now_ms() + QUIESCE_MS;
            close_at = now_ms() + QUIESCE_MS / 4 + (int64_t)(test_rand(&rng) % QUIESCE_MS);
        }
    }
    if (!final_close)
        for (int k = 0; k < N_POOLS; k++)
            close_target(k);
    quiesce(helpers, true);
    atomic_store(&stop, 1);
    for (int i = 0; i < helpers; i++)
        pthread_join(tids[i], NULL);

    for (int k = 0; k < N_POOLS; k++) {
        struct sluice_pool *p = atomic_load(&targets[k].pool);
        struct sluice_pool_counts c = sluice_pool_stats(p);
        cr_assert(c.closed, "%s was closed", pool_names[k]);
        cr_assert_eq(c.admitted + c.in_flight + c.queued, 0,
                     "%s: final counters %u admitted, %u in flight, %u queued", pool_names[k],
                     c.admitted, c.in_flight, c.queued);
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_ECLOSED);
        sluice_pool_destroy(p);
    }
    char summary[1024];
    size_t len = 0;
    for (int t = 0; t < N_TALLIES; t++)
        len += (size_t)snprintf(summary + len, sizeof summary - len, " %s=%" PRIu64,
                                tally_names[t], atomic_load(&tallies[t]));
    fprintf(stderr, "soak: %.1f s:%s\n", (double)(now_ms() - start) / 1000.0, summary);
    cr_assert_eq(atomic_load(&violations), 0, "%ld violations; the first: %s",
                 atomic_load(&violations), first_violation);
    for (int t = 0; t < N_TALLIES; t++)
        cr_assert_gt(atomic_load(&tallies[t]), 0, "the mix never produced %s: too tame",
                     tally_names[t]);
}
