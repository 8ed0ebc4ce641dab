/*
 * Runs against an adaptive backend whose limit moves under them: worker
 * threads run requests whose client answers OK, 429 (some with a short
 * Retry-After, so calls wait out holds), or fails; some runs carry short
 * deadlines, and a canceller fires armed tokens at random moments (in the
 * permit queue, in a hold, in the client). Meanwhile an observer reads
 * status lines and the event feed, polls, and clears the node, which moves
 * the limit back to the jumpstart and wakes calls waiting out a hold.
 *
 * Checked: every run ends with a status its plan allows (ECANCELED only if
 * its token fired, ETIMEDOUT only if its deadline passed or the start rule
 * refused it, ELATE only with a deadline and before any call, never ECAPACITY:
 * admission is sized for the hard maximum, not the moving limit); the
 * client never has more calls at once than `active`, the hard maximum; the
 * limit moved; and afterwards the pool reports 0 admitted / 0 in flight /
 * 0 waiting, discovery and the gate agree on the limit, and the whole
 * capacity is usable.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sluice/run.h>

#include "common.h"
#include "run_fixtures.h"

#define WORKERS 6
#define RUNS_PER_WORKER SCALED(6000)
#define ACTIVE 4 /* below WORKERS, so the hard maximum is tested */

struct worker {
    uint64_t rng;
    struct sluice_engine *engine;
    struct sluice_cancel token;
    _Atomic(int) armed; /* 0 idle, 1 the canceller may fire, 2 it is firing */
    struct timespec deadline;
    bool has_deadline;
    unsigned outcome_roll, work;
    long violations, runs, by_status[5];
};

static _Atomic(int) in_client, max_in_client, stop;
static struct worker workers[WORKERS];

static int stress_generate(void *ctx, struct sluice_generation *gen)
{
    struct worker *w = ctx;
    int now = atomic_fetch_add(&in_client, 1) + 1;
    int max = atomic_load(&max_in_client);
    while (now > max && !atomic_compare_exchange_weak(&max_in_client, &max, now))
        ;
    for (unsigned i = 0; i < w->work; i++)
        sluice_cpu_relax();
    if (w->work % 8 == 0)
        sched_yield();
    atomic_fetch_sub(&in_client, 1);
    unsigned roll = w->outcome_roll;
    if (roll < 4) { /* 429: a quarter of them with a Retry-After of up to 300 µs */
        gen->outcome = SLUICE_OUTCOME_OVERLOAD;
        gen->retry_after_ns = roll == 0 ? (int64_t)(w->work * 1000) : 0;
        return SLUICE_EAGAIN;
    }
    if (roll < 6)
        return -EIO; /* transport error: ignored by discovery */
    return SLUICE_OK;
}

static const struct sluice_run_ops stress_ops = {.generate = stress_generate};

/* A run's status, with a client failure told apart by the client's own code. A
 * timeout before its deadline is allowed only as the start rule's refusal. */
static long check(struct worker *w, int status, int client_status, bool refused_late)
{
    switch (status) {
    case SLUICE_OK:
        return w->outcome_roll < 6;
    case SLUICE_ECLIENT:
        if (client_status == SLUICE_EAGAIN)
            return w->outcome_roll >= 4;
        if (client_status == -EIO)
            return w->outcome_roll < 4 || w->outcome_roll >= 6;
        return 1;
    case SLUICE_ECANCELED:
        return !sluice_cancel_fired(&w->token);
    case SLUICE_ETIMEDOUT:
        return !w->has_deadline || (!sluice_deadline_passed(&w->deadline) && !refused_late);
    case SLUICE_ELATE: /* admission predicted it could not finish by its deadline */
        return !w->has_deadline;
    default:
        return 1; /* ECAPACITY or anything else: never allowed here */
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (long i = 0; i < RUNS_PER_WORKER; i++) {
        w->outcome_roll = (unsigned)(test_rand(&w->rng) % 100);
        w->work = (unsigned)(test_rand(&w->rng) % 300);
        sluice_cancel_reset(&w->token);
        struct sluice_run_desc d = {.backend = "cloud:stress", .ops = &stress_ops, .ctx = w,
                                    .cancel = &w->token, .max_repairs = SLUICE_SOME(0)};
        w->has_deadline = test_rand(&w->rng) % 10 == 0;
        if (w->has_deadline) {
            w->deadline = deadline_in((int64_t)(test_rand(&w->rng) % 300000));
            d.deadline = &w->deadline;
        }
        bool external = test_rand(&w->rng) % 5 == 0;
        if (external)
            cancel_arm(&w->armed);
        struct sluice_run_result r;
        int status = sluice_run(w->engine, &d, &r);
        if (external)
            cancel_disarm(&w->armed);
        w->violations += check(w, status, r.client_status, r.refused_late);
        w->runs++;
        bool client = status == SLUICE_ECLIENT;
        w->by_status[status == SLUICE_OK                      ? 0
                     : client && r.client_status == SLUICE_EAGAIN ? 1
                     : client && r.client_status == -EIO          ? 2
                     : status == SLUICE_ECANCELED                 ? 3
                                                                  : 4]++;
    }
    return NULL;
}

static void *canceller_main(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    while (!atomic_load(&stop)) {
        struct worker *w = &workers[test_rand(&rng) % WORKERS];
        if (test_rand(&rng) % 3 == 0)
            cancel_fire_if_armed(&w->armed, &w->token, NULL, NULL);
        random_pause(&rng, 300);
    }
    return NULL;
}

struct observer {
    struct sluice_engine *engine;
    long clears, lines, events, max_waiting;
};

static void *observer_main(void *arg)
{
    struct observer *o = arg;
    struct sluice_pool *pool = sluice_engine_pool(o->engine, "cloud:stress");
    const struct sluice_event_ring *ring = sluice_engine_events(o->engine, "cloud:stress");
    struct sluice_event batch[8];
    uint64_t cursor = 0;
    char line[128];
    for (long i = 0; !atomic_load(&stop); i++) {
        if (sluice_engine_status_line(o->engine, "cloud:stress", line, sizeof line) > 0)
            o->lines++;
        o->events += (long)sluice_event_ring_read(ring, &cursor, batch, 8, NULL);
        uint32_t waiting = sluice_pool_stats(pool).queued;
        o->max_waiting = waiting > o->max_waiting ? waiting : o->max_waiting;
        if (i % 64 == 0)
            sluice_engine_poll(o->engine);
        if (i % 512 == 0 && sluice_engine_clear(o->engine, "cloud:stress") == SLUICE_OK)
            o->clears++;
        sched_yield();
    }
    return NULL;
}

Test(adaptive_runs, runs_against_a_moving_limit_keep_identity_and_release_all_capacity,
     .timeout = 300)
{
    struct sluice_discovery_desc disc = {.jumpstart = 2,
                                         .window_min_ns = 1,
                                         .window_max_ns = SLUICE_NS_PER_MS,
                                         .window_samples = 8,
                                         .retry_after_max_ns = 300 * 1000,
                                         .events = 64};
    struct sluice_backend_desc b[] = {
        {.id = "cloud:stress", .active = ACTIVE, .waiting = SLUICE_SOME(WORKERS), .discovery = &disc}};
    struct sluice_memstore *store;
    cr_assert_eq(sluice_memstore_create(4, NULL, &store), SLUICE_OK);
    struct sluice_store_ops ops = sluice_memstore_ops(store);
    struct sluice_engine *e;
    char err[256];
    struct sluice_engine_desc d = {.backends = b, .n_backends = 1, .store = &ops, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK, "%s", err);
    for (int i = 0; i < WORKERS; i++) {
        workers[i] = (struct worker){.rng = (uint64_t)i * 7919 + 3, .engine = e};
        sluice_cancel_init(&workers[i].token);
    }
    struct observer obs = {.engine = e};
    pthread_t canceller, observer;
    pthread_create(&canceller, NULL, canceller_main, (void *)(uintptr_t)99);
    pthread_create(&observer, NULL, observer_main, &obs);
    test_run_threads(WORKERS, worker_main, workers, sizeof workers[0]);
    atomic_store(&stop, 1);
    pthread_join(canceller, NULL);
    pthread_join(observer, NULL);

    long runs = 0, by_status[5] = {0};
    for (int i = 0; i < WORKERS; i++) {
        cr_expect_eq(workers[i].violations, 0, "worker %d broke %ld promises", i,
                     workers[i].violations);
        runs += workers[i].runs;
        for (int k = 0; k < 5; k++)
            by_status[k] += workers[i].by_status[k];
    }
    uint64_t events = sluice_event_ring_count(sluice_engine_events(e, "cloud:stress"));
    cr_log_info("%ld runs: %ld ok, %ld 429, %ld failed, %ld cancelled, %ld timed out; "
                "%" PRIu64 " events, %ld clears, deepest wait %ld, max in client %d",
                runs, by_status[0], by_status[1], by_status[2], by_status[3], by_status[4],
                events, obs.clears, obs.max_waiting, atomic_load(&max_in_client));
    cr_assert_eq(runs, (long)WORKERS * RUNS_PER_WORKER);
    cr_assert_gt(by_status[0], 0);
    cr_assert_gt(by_status[1], 0, "no 429 ever reached discovery: the mix is too tame");
    cr_assert_gt(events, 1, "the limit never moved");
    cr_assert_gt(obs.clears, 0);
    cr_assert_leq(atomic_load(&max_in_client), ACTIVE, "more calls at once than the hard maximum");

    struct sluice_pool *pool = sluice_engine_pool(e, "cloud:stress");
    struct sluice_pool_counts c = sluice_pool_stats(pool);
    cr_assert_eq(c.admitted, 0);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.queued, 0);
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(e, "cloud:stress", &st), SLUICE_OK);
    struct sluice_gate *gate = sluice__pool_gate(pool);
    cr_assert_not_null(gate);
    cr_assert_eq(st.limit, gate ? sluice_gate_limit(gate) : 0, "discovery and gate agree");
    cr_assert(st.limit >= 1 && st.limit <= ACTIVE, "limit %u out of [1, %d]", st.limit, ACTIVE);
    assert_capacity_intact(pool);
    sluice_engine_destroy(e);
    sluice_memstore_destroy(store);
}
