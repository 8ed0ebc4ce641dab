/*
 * Adaptive backends: ceiling discovery wired into the engine's pools.
 * Samples come from real runs (sluice_run with a client that reports OK or
 * OVERLOAD); time that discovery reasons about is virtual, and the only
 * real-time waits are Retry-After holds, checked by order, never by length.
 *
 * Why one file of this size: these tests share the engine fixture, the
 * scripted virtual clock and the reporting client; they are one concept
 * (discovery inside the engine's pools).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sluice/policy/fixed.h>
#include <sluice/run.h>

#include "common.h"
#include "run_fixtures.h"

#define SEC SLUICE_NS_PER_SEC
#define MS SLUICE_NS_PER_MS
#define WALL_START (INT64_C(1700000000) * SEC)

/* ---- a client the test steers ------------------------------------------- */

/* Every generation of a wave parks in the client until the test opens the
 * latch, or releases it by its arrival number. */
struct client {
    struct latch latch;           /* arrivals are counted in latch.arrived */
    _Atomic(int) released;        /* generations with an arrival number below this may return */
    _Atomic(int) finished;        /* runs (on runner threads) that have returned */
    enum sluice_outcome outcome;  /* what every generation reports */
    int64_t retry_after_ns;       /* with OVERLOAD */
    _Atomic(int) calls;           /* generations that reached the client */
    _Atomic(int64_t) entered_ns;  /* real CLOCK_MONOTONIC when the last one entered */
};

static int client_generate(void *ctx, struct sluice_generation *gen)
{
    struct client *c = (struct client *)ctx;
    atomic_store(&c->entered_ns, sluice_monotonic_ns());
    atomic_fetch_add(&c->calls, 1);
    int arrival = atomic_fetch_add(&c->latch.arrived, 1);
    while (!atomic_load(&c->latch.open) && atomic_load(&c->released) <= arrival)
        sched_yield();
    gen->outcome = c->outcome;
    gen->retry_after_ns = c->retry_after_ns;
    /* A 429 is an error to the caller and an overload to discovery. */
    return c->outcome == SLUICE_OUTCOME_OVERLOAD ? SLUICE_EAGAIN : SLUICE_OK;
}

static const struct sluice_run_ops client_ops = {.generate = client_generate};

static void client_init(struct client *c, enum sluice_outcome outcome, int64_t retry_after_ns,
                        bool open)
{
    memset(c, 0, sizeof *c);
    c->outcome = outcome;
    c->retry_after_ns = retry_after_ns;
    if (open)
        latch_open(&c->latch);
}

struct runner {
    struct sluice_engine *engine;
    struct sluice_run_desc desc;
    struct sluice_run_result result;
    pthread_t tid;
};

static void *runner_main(void *arg)
{
    struct runner *r = (struct runner *)arg;
    sluice_run(r->engine, &r->desc, &r->result);
    atomic_fetch_add(&((struct client *)r->desc.ctx)->finished, 1);
    return NULL;
}

static void runner_start(struct runner *r, struct sluice_engine *e, const char *backend,
                         struct client *c)
{
    memset(r, 0, sizeof *r);
    r->engine = e;
    r->desc.backend = backend;
    r->desc.ops = &client_ops;
    r->desc.ctx = c;
    pthread_create(&r->tid, NULL, runner_main, r);
}

/* One run on this thread through a client that never parks. */
static int run_once(struct sluice_engine *e, const char *backend,
                    enum sluice_outcome outcome, int64_t retry_after_ns,
                    struct sluice_run_result *result)
{
    struct client c;
    client_init(&c, outcome, retry_after_ns, true);
    struct sluice_run_desc d = {.backend = backend, .ops = &client_ops, .ctx = &c};
    return sluice_run(e, &d, result);
}

/* ---- an engine in virtual time ------------------------------------------- */

struct world {
    struct fake_clock mono, wall;
    struct sluice_clock mono_hook, wall_hook;
    struct sluice_memstore *store;
    struct sluice_store_ops store_ops;
    struct sluice_policy_discover policy; /* counts windows of any size */
    struct sluice_event seen[32];
    _Atomic(int) n_seen;
    struct sluice_engine *engine;
};

static void remember(void *ctx, const struct sluice_event *ev)
{
    struct world *w = (struct world *)ctx;
    int i = atomic_fetch_add(&w->n_seen, 1);
    if (i < 32)
        w->seen[i] = *ev;
}

static void world_init(struct world *w)
{
    memset(w, 0, sizeof *w);
    atomic_store(&w->mono.now, 1000 * SEC);
    atomic_store(&w->wall.now, WALL_START);
    w->mono_hook = fake_clock_hook(&w->mono);
    w->wall_hook = fake_clock_hook(&w->wall);
    cr_assert_eq(sluice_memstore_create(8, NULL, &w->store), SLUICE_OK);
    w->store_ops = sluice_memstore_ops(w->store);
    struct sluice_policy_discover_params params = {.min_samples = 1};
    cr_assert_eq(sluice_policy_discover_init(&w->policy, &params, NULL, 0), SLUICE_OK);
}

/* Put a lock for `node` in the store, locked a day ago and expiring `ttl_s` from the
 * virtual wall clock (ttl_s < 0: a lock that has run out). */
static void world_store_lock(struct world *w, const char *node, uint32_t ceiling, int64_t ttl_s)
{
    struct sluice_lock_record rec = {.ceiling = ceiling,
                                     .expires_s = atomic_load(&w->wall.now) / SEC + ttl_s,
                                     .locked_at_s = atomic_load(&w->wall.now) / SEC - 86400};
    cr_assert_eq(w->store_ops.save(w->store_ops.ctx, node, &rec), SLUICE_OK);
}

static uint32_t world_stored_ceiling(struct world *w, const char *node)
{
    struct sluice_lock_record rec;
    cr_assert_eq(w->store_ops.load(w->store_ops.ctx, node, &rec), SLUICE_OK);
    return rec.ceiling;
}

static void world_create(struct world *w, const struct sluice_backend_desc *b, size_t n)
{
    char err[256];
    struct sluice_engine_desc d = {.backends = b, .n_backends = n, .clock = &w->mono_hook,
                                   .wall_clock = &w->wall_hook, .store = &w->store_ops,
                                   .on_event = remember, .on_event_ctx = w, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &w->engine), SLUICE_OK, "%s", err);
}

static void world_destroy(struct world *w)
{
    sluice_engine_destroy(w->engine);
    sluice_memstore_destroy(w->store);
}

static void advance(struct world *w, int64_t ns)
{
    fake_clock_advance(&w->mono, ns);
    fake_clock_advance(&w->wall, ns);
}

static struct sluice_discovery_status status_of(struct world *w, const char *node)
{
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(w->engine, node, &st), SLUICE_OK, "%s", node);
    return st;
}

static const char *line_of(struct world *w, const char *node, char *buf, size_t size)
{
    int n = sluice_engine_status_line(w->engine, node, buf, size);
    cr_assert_geq(n, 0, "%s: %s", node, sluice_status_name(n));
    return buf;
}

static uint32_t limit_of(struct world *w, const char *backend)
{
    struct sluice_gate *gate = sluice__pool_gate(sluice_engine_pool(w->engine, backend));
    cr_assert_not_null(gate);
    uint32_t gate_limit = gate ? sluice_gate_limit(gate) : 0;
    struct sluice_pool *p = sluice_engine_pool(w->engine, backend);
    cr_assert_eq(sluice_pool_stats(p).active, gate_limit);
    cr_assert_eq(status_of(w, backend).limit, gate_limit, "discovery and the gate agree");
    return gate_limit;
}

/*
 * One wave: as many runs as the limit, all in the client at once (so the
 * window is saturated), each taking `latency_ns` of virtual time; then
 * time moves past the window's close and the engine polls it shut. The
 * calls end one at a time: concurrent completions may land a sample on
 * either side of a window's close (by design, see sluice/discovery.h),
 * which would make the expected steps a matter of scheduling.
 */
static void wave(struct world *w, const char *backend, enum sluice_outcome outcome,
                 int64_t latency_ns)
{
    enum { MAX = 64 };
    uint32_t n = limit_of(w, backend);
    cr_assert_leq(n, MAX);
    struct client c;
    client_init(&c, outcome, 0, false);
    struct runner r[MAX];
    for (uint32_t i = 0; i < n; i++)
        runner_start(&r[i], w->engine, backend, &c);
    wait_for_count(&c.latch.arrived, (int)n);
    advance(w, latency_ns);
    for (int i = 0; i < (int)n; i++) {
        atomic_store(&c.released, i + 1);
        wait_for_count(&c.finished, i + 1);
    }
    for (uint32_t i = 0; i < n; i++) {
        pthread_join(r[i].tid, NULL);
        cr_assert_eq(r[i].result.status,
                     outcome == SLUICE_OUTCOME_OVERLOAD ? SLUICE_ECLIENT : SLUICE_OK);
    }
    advance(w, 60 * SEC);
    sluice_engine_poll(w->engine);
}

/* ---- probing and backoff through runs ------------------------------------- */

Test(adaptive, an_adaptive_backend_starts_at_the_jumpstart_and_its_limit_grows_with_run_samples)
{
    struct world w;
    world_init(&w);
    struct sluice_discovery_desc disc = {.jumpstart = 4, .policy = &w.policy.base};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &disc}};
    world_create(&w, b, 1);
    struct sluice_pool *p = sluice_engine_pool(w.engine, "cloud:a");
    cr_assert_not_null(sluice_pool_discovery(p));
    cr_assert_eq(limit_of(&w, "cloud:a"), 4, "the gate starts at the jumpstart");
    cr_assert_eq(sluice_pool_stats(p).active_max, 64);
    char line[128];
    cr_assert_str_eq(line_of(&w, "cloud:a", line, sizeof line), "cloud:a 0/4 📈");

    wave(&w, "cloud:a", SLUICE_OUTCOME_OK, SEC);
    cr_assert_eq(limit_of(&w, "cloud:a"), 8, "a healthy saturated window doubles the limit");
    struct sluice_discovery_status st = status_of(&w, "cloud:a");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_PROBE);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_SLOW_START);
    cr_assert_eq(st.last_event.old_limit, 4);
    cr_assert_eq(st.last_event.new_limit, 8);

    wave(&w, "cloud:a", SLUICE_OUTCOME_OK, SEC);
    cr_assert_eq(limit_of(&w, "cloud:a"), 16);
    cr_assert_str_eq(line_of(&w, "cloud:a", line, sizeof line), "cloud:a 0/16 📈");
    cr_assert_eq(atomic_load(&w.n_seen), 2, "the engine's callback saw both probe steps");
    assert_capacity_intact(p);
    world_destroy(&w);
}

Test(adaptive, growth_never_passes_active_the_hard_maximum)
{
    struct world w;
    world_init(&w);
    struct sluice_discovery_desc disc = {.jumpstart = 4, .policy = &w.policy.base};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 12, .discovery = &disc}};
    world_create(&w, b, 1);
    for (int i = 0; i < 6; i++) {
        wave(&w, "cloud:a", SLUICE_OUTCOME_OK, SEC);
        cr_assert_leq(limit_of(&w, "cloud:a"), 12);
    }
    struct sluice_discovery_status st = status_of(&w, "cloud:a");
    cr_assert_eq(st.limit, 12);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED, "no congestion: locks at the maximum");
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_MAX_LIMIT);
    cr_assert_eq(world_stored_ceiling(&w, "cloud:a"), 12, "the lock reached the engine's store");
    world_destroy(&w);
}

Test(adaptive, an_overload_reported_by_a_run_backs_the_limit_off_once_per_burst)
{
    struct world w;
    world_init(&w);
    struct sluice_discovery_desc disc = {.jumpstart = 10, .policy = &w.policy.base};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &disc}};
    world_create(&w, b, 1);
    advance(&w, SEC);
    /* Ten calls refused together, started with 1 to 10 in flight: one burst,
     * one cut, to under the concurrency the first refusal started with. */
    wave(&w, "cloud:a", SLUICE_OUTCOME_OVERLOAD, SEC);
    struct sluice_discovery_status st = status_of(&w, "cloud:a");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_BACKOFF);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_BACKOFF);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_OVERLOAD);
    cr_assert_eq(st.last_event.seq, 1, "one burst, one cut (the first event of the node)");
    cr_assert_eq(st.last_event.old_limit, 10);
    cr_assert_lt(st.last_event.new_limit, 10);
    uint32_t cut = limit_of(&w, "cloud:a");
    cr_assert_eq(cut, st.last_event.new_limit);
    /* A run refused with one call in flight is news at any limit: 0.9 x 1,
     * at least 1. */
    advance(&w, SEC);
    struct sluice_run_result r;
    cr_assert_eq(run_once(w.engine, "cloud:a", SLUICE_OUTCOME_OVERLOAD, 0, &r), SLUICE_ECLIENT);
    cr_assert_eq(r.last.outcome, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(r.last.in_flight_at_start, 1);
    cr_assert_eq(limit_of(&w, "cloud:a"), 1);
    char line[128];
    cr_assert_str_eq(line_of(&w, "cloud:a", line, sizeof line), "cloud:a 0/1 🌧️");
    /* Ignored outcomes (a transport error) never cut. */
    advance(&w, SEC);
    cr_assert_eq(run_once(w.engine, "cloud:a", SLUICE_OUTCOME_IGNORE, 0, &r), SLUICE_OK);
    cr_assert_eq(limit_of(&w, "cloud:a"), 1);
    assert_capacity_intact(sluice_engine_pool(w.engine, "cloud:a"));
    world_destroy(&w);
}

/* A call_begin on its own thread. */
struct beginner {
    struct sluice_pool *pool;
    const struct timespec *deadline;
    struct sluice_cancel *cancel;
    struct sluice_call call;
    int status;
    pthread_t tid;
};

static void *beginner_main(void *arg)
{
    struct beginner *b = (struct beginner *)arg;
    b->status = sluice_pool_call_begin(b->pool, b->deadline, b->cancel, &b->call);
    return NULL;
}

Test(adaptive, call_end_feeds_discovery_before_the_permit_moves_on)
{
    struct fake_clock fc = {SEC};
    struct sluice_clock hook = fake_clock_hook(&fc);
    struct sluice_discovery_desc disc = {.node_id = "cloud:p", .jumpstart = 2};
    struct sluice_pool_desc d = {.active = 8, .clock = &hook, .discovery = &disc};
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).active, 2, "a standalone adaptive pool starts at the jumpstart");
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    struct beginner third = {.pool = p, .status = -1};
    pthread_create(&third.tid, NULL, beginner_main, &third);
    while (sluice_pool_stats(p).queued < 1)
        sched_yield();
    fake_clock_advance(&fc, SEC);
    /* The 429 cuts 2 -> 1 before its permit is released, so the release
     * repays the cut instead of admitting the queued call. */
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OVERLOAD, 0);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.active, 1);
    cr_assert_eq(c.queued, 1, "the queued call was admitted past the cut");
    cr_assert_eq(c.in_flight, 1);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    pthread_join(third.tid, NULL);
    cr_assert_eq(third.status, SLUICE_OK);
    sluice_pool_call_end(p, &third.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

/* An event loop's callback that takes a while: it waits (boundedly) for the
 * sync waiter to return, and notes whether it had. */
struct slow_async {
    struct sluice_pool_waiter w;
    _Atomic(int) *sync_returned;
    _Atomic(int) status;
    _Atomic(int) saw_sync_return; /* -1 until the callback ends */
};

static void slow_async_cb(struct sluice_pool_waiter *w, int status)
{
    struct slow_async *a = (struct slow_async *)w->data;
    int64_t give_up = sluice_monotonic_ns() + 5 * SEC; /* a failure must not hang */
    while (!atomic_load(a->sync_returned) && sluice_monotonic_ns() < give_up)
        sched_yield();
    atomic_store(&a->status, status);
    atomic_store(&a->saw_sync_return, atomic_load(a->sync_returned));
}

struct sync_beginner {
    struct beginner b;
    _Atomic(int) returned;
};

static void *sync_beginner_main(void *arg)
{
    struct sync_beginner *s = (struct sync_beginner *)arg;
    beginner_main(&s->b);
    atomic_store(&s->returned, 1);
    return NULL;
}

static void *call_end_main(void *arg)
{
    struct beginner *b = (struct beginner *)arg;
    sluice_pool_call_end(b->pool, &b->call, SLUICE_OUTCOME_OK, 0);
    return NULL;
}

Test(adaptive, a_sync_waiter_granted_by_a_limit_raise_is_woken_before_async_callbacks_run,
     .timeout = 30)
{
    struct fake_clock fc = {1000 * SEC};
    struct sluice_clock hook = fake_clock_hook(&fc);
    struct sluice_policy_discover quick;
    struct sluice_policy_discover_params params = {.min_samples = 1};
    cr_assert_eq(sluice_policy_discover_init(&quick, &params, NULL, 0), SLUICE_OK);
    struct sluice_discovery_desc disc = {.node_id = "cloud:r", .jumpstart = 1, .policy = &quick.base};
    struct sluice_pool_desc d = {.active = 8, .clock = &hook, .discovery = &disc};
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    /* One call teaches discovery its latency and opens the first window. */
    struct sluice_call first;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &first), SLUICE_OK);
    fake_clock_advance(&fc, SEC);
    sluice_pool_call_end(p, &first, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).active, 1);
    /* The one permit is held; a sync call queues first, an async one behind it. */
    struct beginner holder = {.pool = p};
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder.call), SLUICE_OK);
    fake_clock_advance(&fc, SEC);
    struct sync_beginner sync = {.b = {.pool = p, .status = -1}};
    pthread_create(&sync.b.tid, NULL, sync_beginner_main, &sync);
    WAIT_UNTIL(sluice_pool_stats(p).queued == 1);
    struct slow_async a = {.w = {.cb = slow_async_cb}, .sync_returned = &sync.returned,
                           .status = 1, .saw_sync_return = -1};
    a.w.data = &a;
    sluice_pool_call_begin_async(p, &a.w);
    cr_assert_eq(sluice_pool_stats(p).queued, 2);
    /* Past the window's close: this call_end raises the limit 1 -> 2, which
     * grants the sync call at the head, and its release grants the async one. */
    fake_clock_advance(&fc, 60 * SEC);
    pthread_t ender;
    pthread_create(&ender, NULL, call_end_main, &holder);
    pthread_join(ender, NULL);
    pthread_join(sync.b.tid, NULL);
    cr_assert_eq(sluice_pool_stats(p).active, 2, "the close raised the limit");
    cr_assert_eq(sync.b.status, SLUICE_OK);
    cr_assert_eq(atomic_load(&a.status), SLUICE_OK);
    cr_assert_eq(atomic_load(&a.saw_sync_return), 1,
                 "the sync waiter the raise granted stayed asleep until the async callback "
                 "ended");
    sluice_pool_call_end(p, &sync.b.call, SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &a.w.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

/* ---- clear ------------------------------------------------------------------- */

Test(adaptive, clear_resets_only_that_node_and_drops_its_stored_lock)
{
    struct world w;
    world_init(&w);
    world_store_lock(&w, "cloud:a", 20, 3600);
    world_store_lock(&w, "cloud:b", 30, 3600);
    struct sluice_discovery_desc disc_a = {.jumpstart = 4}, disc_b = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &disc_a},
                                      {.id = "cloud:b", .active = 64, .discovery = &disc_b},
                                      {.id = "local", .active = 4},
                                      {.id = "free"}};
    world_create(&w, b, 4);
    cr_assert_eq(status_of(&w, "cloud:a").state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(status_of(&w, "cloud:b").state, SLUICE_DISCOVERY_LOCKED);

    /* A request in flight on the node being cleared. */
    struct client c;
    client_init(&c, SLUICE_OUTCOME_OVERLOAD, 0, false);
    struct runner inflight;
    runner_start(&inflight, w.engine, "cloud:a", &c);
    wait_for_count(&c.latch.arrived, 1);

    const char *others[] = {"cloud:b", "local", "free", "openrouter"};
    struct sluice_discovery_status before[4], after[4];
    for (int i = 0; i < 4; i++)
        before[i] = status_of(&w, others[i]);
    uint64_t b_events = sluice_event_ring_count(sluice_engine_events(w.engine, "cloud:b"));

    advance(&w, SEC); /* the request started before the clear */
    cr_assert_eq(sluice_engine_clear(w.engine, "cloud:a"), SLUICE_OK);

    for (int i = 0; i < 4; i++) {
        after[i] = status_of(&w, others[i]);
        cr_expect_eq(memcmp(&before[i], &after[i], sizeof before[i]), 0, "%s changed", others[i]);
    }
    cr_expect_eq(sluice_event_ring_count(sluice_engine_events(w.engine, "cloud:b")), b_events);
    cr_expect_eq(world_stored_ceiling(&w, "cloud:b"), 30, "another node's stored lock is kept");
    cr_expect_eq(world_stored_ceiling(&w, "cloud:a"), 0, "the cleared node's lock is dropped");
    cr_expect_eq(w.store->clears, 1);

    struct sluice_discovery_status st = status_of(&w, "cloud:a");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.limit, 4, "back to the jumpstart");
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(st.lock_expires_s, 0);
    cr_assert_eq(st.in_flight, 1, "the request in flight is not interrupted");
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_CLEAR);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_API);
    cr_assert_eq(st.last_event.old_limit, 20);
    cr_assert_eq(st.last_event.new_limit, 4);
    cr_assert_eq(limit_of(&w, "cloud:a"), 4, "the next request runs under the jumpstart");

    /* Fixed nodes: a no-op that never reaches the store. Unknown nodes: EINVAL. */
    cr_assert_eq(sluice_engine_clear(w.engine, "local"), SLUICE_OK);
    cr_assert_eq(sluice_engine_clear(w.engine, "free"), SLUICE_OK);
    after[1] = status_of(&w, "local");
    cr_assert_eq(memcmp(&before[1], &after[1], sizeof before[1]), 0);
    cr_assert_eq(w.store->clears, 1);
    cr_assert_eq(sluice_engine_clear(w.engine, "cloud:zzz"), SLUICE_EINVAL);
    cr_assert_eq(sluice_engine_clear(w.engine, NULL), SLUICE_EINVAL);

    /* The old request finishes normally; its 429 started before the clear and counts for nothing. */
    uint64_t a_events = sluice_event_ring_count(sluice_engine_events(w.engine, "cloud:a"));
    advance(&w, SEC);
    latch_open(&c.latch);
    pthread_join(inflight.tid, NULL);
    cr_assert_eq(inflight.result.status, SLUICE_ECLIENT);
    cr_assert_eq(inflight.result.generations, 1);
    cr_assert_eq(limit_of(&w, "cloud:a"), 4);
    cr_assert_eq(sluice_event_ring_count(sluice_engine_events(w.engine, "cloud:a")), a_events);
    assert_capacity_intact(sluice_engine_pool(w.engine, "cloud:a"));
    world_destroy(&w);
}

/* ---- the store --------------------------------------------------------------- */

static _Atomic(int) own_events;

static void count_own(void *ctx, const struct sluice_event *ev)
{
    (void)ctx;
    (void)ev;
    atomic_fetch_add(&own_events, 1);
}

Test(adaptive, a_live_stored_lock_is_restored_when_the_engine_is_created)
{
    struct world w;
    world_init(&w);
    world_store_lock(&w, "cloud:a", 24, 3600);
    world_store_lock(&w, "cloud:b", 40, -1);   /* expired */
    world_store_lock(&w, "cloud:c", 100, 600); /* above cloud:c's active */
    world_store_lock(&w, "cloud:d", 7, 600);
    struct sluice_discovery_desc plain = {0};
    struct sluice_discovery_desc own = {.on_event = count_own};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &plain},
                                      {.id = "cloud:b", .active = 64, .discovery = &plain},
                                      {.id = "cloud:c", .active = 32, .discovery = &plain},
                                      {.id = "cloud:d", .active = 64, .discovery = &own}};
    atomic_store(&own_events, 0);
    world_create(&w, b, 4);

    struct sluice_discovery_status st = status_of(&w, "cloud:a");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.limit, 24);
    cr_assert_eq(st.ceiling, 24);
    cr_assert_eq(st.lock_expires_s, WALL_START / SEC + 3600);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_RESTORE);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_STORE);
    cr_assert_eq(limit_of(&w, "cloud:a"), 24, "the gate runs at the restored ceiling at once");
    char line[128];
    cr_assert_str_eq(line_of(&w, "cloud:a", line, sizeof line), "cloud:a 0/24 🔒");

    st = status_of(&w, "cloud:b");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING, "an expired lock is ignored");
    cr_assert_eq(st.limit, 5, "the default jumpstart");
    cr_assert_eq(st.last_event.seq, 0);

    cr_assert_eq(limit_of(&w, "cloud:c"), 32, "a stored ceiling never passes active");
    cr_assert_eq(status_of(&w, "cloud:c").ceiling, 32);
    cr_assert_eq(limit_of(&w, "cloud:d"), 7);

    /* Restore events reached the callbacks during create: the engine's for a
     * and c, cloud:d's own for d. */
    cr_assert_eq(atomic_load(&w.n_seen), 2);
    cr_assert_str_eq(w.seen[0].node, "cloud:a");
    cr_assert_eq(w.seen[0].kind, SLUICE_EVENT_RESTORE);
    cr_assert_eq(w.seen[0].new_limit, 24);
    cr_assert_str_eq(w.seen[1].node, "cloud:c");
    cr_assert_eq(atomic_load(&own_events), 1, "a backend's own on_event wins");
    world_destroy(&w);
}

/* ---- Retry-After holds (real time: checked by order, never by length) ------- */

static struct sluice_engine *hold_engine(struct sluice_discovery_desc *disc)
{
    static struct sluice_backend_desc b[1];
    b[0] = (struct sluice_backend_desc){.id = "cloud:h", .active = 8, .discovery = disc};
    struct sluice_engine *e;
    char err[256];
    struct sluice_engine_desc d = {.backends = b, .n_backends = 1, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK, "%s", err);
    return e;
}

static int64_t hold_of(struct sluice_engine *e)
{
    return sluice_discovery_hold_until(sluice_pool_discovery(sluice_engine_pool(e, "cloud:h")));
}

Test(adaptive, a_retry_after_hold_makes_the_next_call_wait_until_it_ends, .timeout = 30)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OVERLOAD, 30 * MS, &r), SLUICE_ECLIENT);
    int64_t hold = hold_of(e);
    cr_assert_gt(hold, 0, "the 429's Retry-After set a hold");
    struct client c;
    client_init(&c, SLUICE_OUTCOME_OK, 0, true);
    struct sluice_run_desc d = {.backend = "cloud:h", .ops = &client_ops, .ctx = &c};
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_OK);
    cr_assert_geq(atomic_load(&c.entered_ns), hold, "the client was called before the hold ended");
    cr_assert_gt(r.queued_ns, 0, "the hold counts as queueing");
    assert_capacity_intact(sluice_engine_pool(e, "cloud:h"));
    sluice_engine_destroy(e);
}

Test(adaptive, a_deadline_shorter_than_the_hold_times_out_without_calling_the_client,
     .timeout = 30)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OVERLOAD, 30 * SEC, &r), SLUICE_ECLIENT);
    struct client c;
    client_init(&c, SLUICE_OUTCOME_OK, 0, true);
    struct timespec deadline = deadline_in(20 * MS);
    struct sluice_run_desc d = {.backend = "cloud:h", .ops = &client_ops, .ctx = &c,
                                .deadline = &deadline};
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ETIMEDOUT);
    cr_assert_eq(atomic_load(&c.calls), 0, "the client was called during the hold");
    cr_assert_eq(r.generations, 0);
    cr_assert(sluice_deadline_passed(&deadline), "timed out before the deadline");
    assert_capacity_intact(sluice_engine_pool(e, "cloud:h"));
    sluice_engine_destroy(e);
}

Test(adaptive, a_call_waiting_out_an_endless_hold_sleeps_until_its_deadline, .timeout = 30)
{
    /* A hold that ends at INT64_MAX (discovery saturates it) must be slept
     * on, not turned into a wake-up time that wrapped into the past. */
    struct sluice_discovery_desc disc = {.jumpstart = 4, .retry_after_max_ns = INT64_MAX};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OVERLOAD, INT64_MAX, &r), SLUICE_ECLIENT);
    cr_assert_eq(hold_of(e), INT64_MAX);
    struct client c;
    client_init(&c, SLUICE_OUTCOME_OK, 0, true);
    struct timespec deadline = deadline_in(200 * MS);
    struct sluice_run_desc d = {.backend = "cloud:h", .ops = &client_ops, .ctx = &c,
                                .deadline = &deadline};
    struct timespec cpu0, cpu1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ETIMEDOUT);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    cr_assert_eq(atomic_load(&c.calls), 0, "the client was called during the hold");
    cr_assert_lt(sluice_timespec_ns(&cpu1) - sluice_timespec_ns(&cpu0), 100 * MS,
                 "the hold wait spun instead of sleeping");
    assert_capacity_intact(sluice_engine_pool(e, "cloud:h"));
    sluice_engine_destroy(e);
}

/* Start a run that will wait out a 30 s hold; returns once it is waiting. */
static void start_held_run(struct sluice_engine *e, struct runner *held, struct client *c,
                           struct sluice_cancel *token)
{
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OVERLOAD, 30 * SEC, &r), SLUICE_ECLIENT);
    client_init(c, SLUICE_OUTCOME_OK, 0, true);
    memset(held, 0, sizeof *held);
    held->engine = e;
    held->desc.backend = "cloud:h";
    held->desc.ops = &client_ops;
    held->desc.ctx = c;
    held->desc.cancel = token;
    pthread_create(&held->tid, NULL, runner_main, held);
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:h");
    while (sluice_pool_stats(p).queued < 1)
        sched_yield();
    struct sluice_pool_counts counts = sluice_pool_stats(p);
    cr_assert_eq(counts.in_flight, 0, "a call waiting out a hold is not in flight");
    cr_assert_eq(sluice_gate_stats(sluice__pool_gate(p)).waiting, 0, "it holds its permit");
    struct sluice_discovery_status st;
    sluice_engine_status(e, "cloud:h", &st);
    cr_assert_eq(st.in_flight, 0);
}

Test(adaptive, a_fired_token_ends_a_hold_wait_with_ecanceled, .timeout = 20)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    struct runner held;
    struct client c;
    start_held_run(e, &held, &c, &token);
    sluice_cancel_fire(&token);
    pthread_join(held.tid, NULL);
    cr_assert_eq(held.result.status, SLUICE_ECANCELED);
    cr_assert_eq(atomic_load(&c.calls), 0, "the client was called after the cancel");
    cr_assert_gt(hold_of(e), sluice_monotonic_ns(), "the hold had not ended: the token woke it");
    assert_capacity_intact(sluice_engine_pool(e, "cloud:h"));
    sluice_engine_destroy(e);
}

Test(adaptive, clear_keeps_a_live_retry_after_hold_and_the_calls_waiting_it_out, .timeout = 20)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    struct runner held;
    struct client c;
    start_held_run(e, &held, &c, &token);
    int64_t hold = hold_of(e);
    cr_assert_eq(sluice_engine_clear(e, "cloud:h"), SLUICE_OK);
    cr_assert_eq(hold_of(e), hold, "the provider's Retry-After outlives a clear");
    struct sluice_discovery_status st;
    sluice_engine_status(e, "cloud:h", &st);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING, "the clear itself happened");
    struct sluice_event last;
    cr_assert(sluice_event_ring_last(sluice_engine_events(e, "cloud:h"), &last));
    cr_assert_eq(last.kind, SLUICE_EVENT_CLEAR);
    cr_assert_eq(last.in_flight, st.in_flight,
                 "events and status count in flight alike: the held call has not started");
    cr_assert_eq(last.in_flight, 0);
    /* Had the clear woken it, the held call would reach the client at once. */
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    cr_assert_eq(atomic_load(&c.calls), 0, "a clear sent a held call into the provider's hold");
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, "cloud:h")).queued, 1);
    sluice_cancel_fire(&token);
    pthread_join(held.tid, NULL);
    cr_assert_eq(held.result.status, SLUICE_ECANCELED);
    assert_capacity_intact(sluice_engine_pool(e, "cloud:h"));
    sluice_engine_destroy(e);
}

/* An async call: counts its callbacks, keeps the last status. */
struct held_async {
    struct sluice_pool_waiter w;
    _Atomic(int) calls;
    _Atomic(int) status;
};

static void held_async_cb(struct sluice_pool_waiter *w, int status)
{
    struct held_async *h = (struct held_async *)w->data;
    atomic_store(&h->status, status);
    atomic_fetch_add(&h->calls, 1);
}

Test(adaptive, async_calls_wait_out_a_retry_after_hold_until_a_poll_after_it_ends, .timeout = 20)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:h");
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OVERLOAD, 50 * MS, &r), SLUICE_ECLIENT);
    int64_t hold = sluice_pool_hold_until(p);
    cr_assert_gt(hold, sluice_monotonic_ns(), "a hold is in force");
    struct held_async a = {.w = {.cb = held_async_cb, .data = &a}};
    struct held_async b = {.w = {.cb = held_async_cb, .data = &b}};
    sluice_pool_call_begin_async(p, &a.w);
    sluice_pool_call_begin_async(p, &b.w);
    sluice_pool_poll(p);
    cr_assert_eq(atomic_load(&a.calls), 0, "granted a permit, but the hold is not over");
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.queued, 2, "calls waiting out a hold count as queued");
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &b.w), SLUICE_OK, "withdrawn during the hold");
    cr_assert_eq(atomic_load(&b.status), SLUICE_ECANCELED);
    while (sluice_monotonic_ns() < hold)
        sched_yield();
    sluice_pool_poll(p);
    cr_assert_eq(atomic_load(&a.calls), 1);
    cr_assert_eq(atomic_load(&a.status), SLUICE_OK);
    cr_assert_geq(a.w.call.start_ns, hold, "started only once the hold was over");
    cr_assert_gt(a.w.call.queued_ns, 0, "the hold counts as queueing");
    cr_assert_eq(sluice_pool_stats(p).in_flight, 1);
    sluice_pool_call_end(p, &a.w.call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(atomic_load(&b.calls), 1, "one callback each");
    assert_capacity_intact(p);
    sluice_engine_destroy(e);
}

Test(adaptive, closing_the_engine_settles_calls_waiting_out_a_hold_with_eclosed, .timeout = 20)
{
    struct sluice_discovery_desc disc = {.jumpstart = 4};
    struct sluice_engine *e = hold_engine(&disc);
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:h");
    struct runner held;
    struct client c;
    start_held_run(e, &held, &c, NULL);
    struct held_async a = {.w = {.cb = held_async_cb, .data = &a}};
    sluice_pool_call_begin_async(p, &a.w);
    cr_assert_eq(sluice_pool_stats(p).queued, 2);
    sluice_engine_close(e);
    pthread_join(held.tid, NULL);
    cr_assert_eq(held.result.status, SLUICE_ECLOSED, "got %s", sluice_status_name(held.result.status));
    cr_assert_eq(atomic_load(&c.calls), 0);
    cr_assert_eq(atomic_load(&a.status), SLUICE_ECLOSED);
    cr_assert_eq(atomic_load(&a.calls), 1);
    struct sluice_pool_counts counts = sluice_pool_stats(p);
    cr_assert_eq(counts.queued, 0);
    cr_assert_eq(counts.admitted, 0);
    cr_assert_eq(sluice_gate_stats(sluice__pool_gate(p)).in_flight, 0, "every permit came back");
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:h", SLUICE_OUTCOME_OK, 0, &r), SLUICE_ECLOSED);
    sluice_engine_destroy(e);
}

/*
 * A virtual pool clock with one scripted moment: the `at`-th read from now
 * (1 = the next) runs `act` once, then reads on. Tests use it to land an
 * event (the hold ends, a token fires, the pool closes) between two steps
 * of a single thread's call, where a race would put it.
 */
struct script_clock {
    _Atomic(int64_t) now;
    int reads_left; /* 0: disarmed */
    void (*act)(struct script_clock *c);
    struct sluice_pool *pool;
    struct sluice_cancel *token;
    int64_t jump_to;
};

static int64_t script_clock_now(void *ctx)
{
    struct script_clock *c = (struct script_clock *)ctx;
    int64_t t = atomic_load(&c->now);
    if (c->reads_left > 0 && --c->reads_left == 0)
        c->act(c);
    return t;
}

/* A pool on a script clock, held by a 30 s Retry-After from a 429. */
static struct sluice_pool *held_pool(struct script_clock *sc, struct sluice_clock *hook)
{
    memset(sc, 0, sizeof *sc);
    atomic_store(&sc->now, SEC);
    *hook = (struct sluice_clock){script_clock_now, sc};
    struct sluice_discovery_desc disc = {.node_id = "cloud:h", .jumpstart = 4};
    struct sluice_pool_desc d = {.active = 8, .clock = hook, .discovery = &disc};
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OVERLOAD, 30 * SEC);
    cr_assert_gt(sluice_pool_hold_until(p), atomic_load(&sc->now), "the 429 set a hold");
    sc->pool = p;
    return p;
}

/* The hold ends and the event loop's timer polls at once. */
static void hold_ends_and_poll(struct script_clock *c)
{
    atomic_store(&c->now, c->jump_to);
    sluice_pool_poll(c->pool);
}

Test(adaptive, an_async_call_granted_as_a_hold_ends_is_started_not_stranded)
{
    struct script_clock sc;
    struct sluice_clock hook;
    struct sluice_pool *p = held_pool(&sc, &hook);
    /* Read 1 stamps the arrival, read 2 is the grant's look at the hold:
     * right after it the hold ends and the timer's poll finds nothing held. */
    sc.jump_to = sluice_pool_hold_until(p);
    sc.act = hold_ends_and_poll;
    sc.reads_left = 2;
    struct held_async a = {.w = {.cb = held_async_cb, .data = &a}};
    sluice_pool_call_begin_async(p, &a.w);
    cr_assert_eq(sc.reads_left, 0, "the script ran");
    cr_assert_eq(atomic_load(&a.calls), 1,
                 "the hold is over and no poll will come: the call must start now");
    cr_assert_eq(atomic_load(&a.status), SLUICE_OK);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.queued, 0, "nothing waits out a hold that is over");
    cr_assert_eq(c.in_flight, 1);
    sluice_pool_call_end(p, &a.w.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

/* The token fires, then the pool closes, before the call looks at either. */
static void fire_then_close(struct script_clock *c)
{
    sluice_cancel_fire(c->token);
    sluice_pool_close(c->pool);
}

Test(adaptive, during_a_hold_a_fired_token_wins_over_a_close)
{
    struct script_clock sc;
    struct sluice_clock hook;
    struct sluice_pool *p = held_pool(&sc, &hook);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    sc.token = &token;
    sc.act = fire_then_close;
    sc.reads_left = 1; /* the start stamp of a call whose permit was free: then the hold */
    struct sluice_call call;
    int status = sluice_pool_call_begin(p, NULL, &token, &call);
    cr_assert_eq(sc.reads_left, 0, "the script ran");
    cr_assert_eq(status, SLUICE_ECANCELED, "cancel wins over close; got %s",
                 sluice_status_name(status));
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.queued, 0);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(sluice_gate_stats(sluice__pool_gate(p)).in_flight, 0, "the permit came back");
    sluice_pool_destroy(p);
}

/* ---- admission follows the discovered limit ---------------------------------------- */

Test(adaptive, admission_capacity_is_the_current_limit_plus_waiting)
{
    struct world w;
    world_init(&w);
    struct sluice_discovery_desc disc = {.jumpstart = 5};
    struct sluice_backend_desc b[] = {
        {.id = "cloud:a", .active = 64, .waiting = SLUICE_SOME(0), .discovery = &disc},
        {.id = "cloud:q", .active = 64, .waiting = SLUICE_SOME(3), .discovery = &disc}};
    world_create(&w, b, 2);
    struct sluice_pool *a = sluice_engine_pool(w.engine, "cloud:a");
    uint32_t n = 0;
    while (n < 100 && sluice_pool_admit(a) == SLUICE_OK)
        n++;
    cr_assert_eq(n, 5, "waiting = 0 admits no backlog beyond the limit in force, got %u", n);
    struct sluice_pool *q = sluice_engine_pool(w.engine, "cloud:q");
    uint32_t m = 0;
    while (m < 100 && sluice_pool_admit(q) == SLUICE_OK)
        m++;
    cr_assert_eq(m, 8, "limit 5 + waiting 3");
    /* A cut never evicts admitted runs; it only refuses new ones until they leave. */
    cr_assert_eq(sluice_gate_set_limit(sluice__pool_gate(q), 2), SLUICE_OK); /* as a cut would */
    cr_assert_eq(sluice_pool_stats(q).admitted, 8);
    cr_assert_eq(sluice_pool_admit(q), SLUICE_ECAPACITY);
    for (uint32_t i = 0; i < 3; i++)
        sluice_pool_leave(q);
    cr_assert_eq(sluice_pool_admit(q), SLUICE_ECAPACITY, "5 admitted, capacity 2 + 3 = 5");
    sluice_pool_leave(q);
    cr_assert_eq(sluice_pool_admit(q), SLUICE_OK);
    for (uint32_t i = 0; i < 5; i++)
        sluice_pool_leave(q);
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_leave(a);
    world_destroy(&w);
}

/* ---- effects run off the permit path ------------------------------------------------- */

struct ender {
    struct sluice_pool *pool;
    struct sluice_call call;
    pthread_t tid;
};

static void *ender_main(void *arg)
{
    struct ender *en = (struct ender *)arg;
    sluice_pool_call_end(en->pool, &en->call, SLUICE_OUTCOME_OK, 0);
    return NULL;
}

Test(adaptive, a_slow_store_never_delays_the_permit_hand_off_or_a_clear, .timeout = 30)
{
    struct world w;
    world_init(&w);
    struct held_store held;
    w.store_ops = held_store_init(&held, w.store_ops);
    /* max_limit 1 and no congestion: the first stable window locks, and saves. */
    struct sluice_discovery_desc disc = {.jumpstart = 1, .max_limit = 1, .policy = &w.policy.base};
    struct sluice_backend_desc b[] = {{.id = "cloud:s", .active = 1, .discovery = &disc}};
    world_create(&w, b, 1);
    struct sluice_pool *p = sluice_engine_pool(w.engine, "cloud:s");
    /* One call teaches discovery its latency and schedules the first window,
     * which the next call_end will close (and lock, then save). */
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    advance(&w, SEC);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(status_of(&w, "cloud:s").state, SLUICE_DISCOVERY_PROBING);

    struct ender en = {.pool = p};
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &en.call), SLUICE_OK);
    advance(&w, SEC);
    /* The next call queues behind it; the window closes (and locks) in call_end, whose
     * thread then runs the save, which blocks until released below. */
    struct runner next;
    struct client c;
    client_init(&c, SLUICE_OUTCOME_OK, 0, true);
    runner_start(&next, w.engine, "cloud:s", &c);
    while (sluice_pool_stats(p).queued < 1)
        sched_yield();
    advance(&w, 60 * SEC); /* past the window's close */
    pthread_create(&en.tid, NULL, ender_main, &en);
    wait_for_count(&c.calls, 1);
    cr_assert_eq(atomic_load(&held.n_ops), 0,
                 "the next call got its permit only after the save ended");
    while (!atomic_load(&held.saving))
        sched_yield();
    cr_assert_eq(status_of(&w, "cloud:s").state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(sluice_engine_clear(w.engine, "cloud:s"), SLUICE_OK);
    cr_assert(atomic_load(&held.saving) && atomic_load(&held.n_ops) == 0,
              "clear waited for another thread's save");
    held_store_release(&held);
    pthread_join(en.tid, NULL);
    pthread_join(next.tid, NULL);
    cr_assert_eq(next.result.status, SLUICE_OK);
    sluice_discovery_sync(sluice_pool_discovery(p));
    cr_assert(held.n_ops == 2 && held.ops[0] == 'S' && held.ops[1] == 'C',
              "store calls: %d, %c%c", (int)held.n_ops, held.ops[0], held.ops[1]);
    cr_assert_eq(world_stored_ceiling(&w, "cloud:s"), 0, "the later clear won over the earlier save");
    world_destroy(&w);
}

/* ---- configuration ------------------------------------------------------------ */

static void expect_invalid(const struct sluice_engine_desc *base, const char *expect)
{
    struct sluice_engine_desc d = *base;
    char err[320] = "untouched";
    d.error = err;
    d.error_size = sizeof err;
    struct sluice_engine *e = (struct sluice_engine *)1;
    cr_expect_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL, "expected: %s", expect);
    cr_expect_null(e);
    cr_expect(strstr(err, expect), "message \"%s\" does not contain \"%s\"", err, expect);
}

Test(adaptive, invalid_discovery_configuration_fails_naming_the_field)
{
    struct sluice_discovery_desc disc;
    struct sluice_backend_desc b[2];
    struct sluice_engine_desc d = {.backends = b, .n_backends = 2};
    struct sluice_gate gate;
    struct sluice_clock clock = {NULL, NULL};
    struct sluice_allocator alloc = {NULL, NULL, NULL};
    struct sluice_policy_fixed fixed;
    sluice_policy_fixed_init(&fixed, NULL, NULL, 0);
    struct sluice_policy_discover never_initialised;
    memset(&never_initialised, 0, sizeof never_initialised);
    struct sluice_store_ops no_clear = sluice_memstore_ops(NULL);
    no_clear.clear = NULL;
    char long_id[SLUICE_NODE_ID_MAX + 1];
    memset(long_id, 'n', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';

#define CASE(mutation, expect)                                                                     \
    do {                                                                                           \
        memset(&disc, 0, sizeof disc);                                                             \
        b[0] = (struct sluice_backend_desc){.id = "local", .active = 2};                           \
        b[1] = (struct sluice_backend_desc){.id = "cloud:x", .active = 16, .discovery = &disc};    \
        d.store = NULL;                                                                            \
        mutation;                                                                                  \
        expect_invalid(&d, expect);                                                                \
    } while (0)

    CASE(b[1].active = 0, "backends[1].discovery needs an active limit: the most calls "
                          "discovery may allow (set backends[1].active)");
    CASE(disc.max_limit = 17, "backends[1].discovery.max_limit = 17 is above backends[1].active");
    CASE(disc.min_limit = 20, "backends[1].discovery.min_limit exceeds max_limit");
    CASE(disc.jumpstart = 40, "backends[1].discovery.jumpstart = 40 must lie within "
                              "[min_limit, max_limit] = [1, 16]");
    CASE((disc.jumpstart = 2, disc.min_limit = 3, disc.max_limit = 9),
         "backends[1].discovery.jumpstart = 2 must lie within [min_limit, max_limit] = [3, 9]");
    CASE(disc.window_tail = -1, "backends[1].discovery.window_tail must be positive");
    CASE(disc.lock_ttl_s = -5, "backends[1].discovery.lock_ttl_s must be in [0, SLUICE_DISCOVERY_TTL_MAX_S]");
    CASE(disc.store = &no_clear, "backends[1].discovery.store needs load, save and clear");
    CASE(disc.node_id = "other", "backends[1].discovery.node_id must be NULL");
    CASE(disc.gate = &gate, "backends[1].discovery.gate must be NULL");
    CASE(disc.clock = &clock, "backends[1].discovery.clock must be NULL");
    CASE(disc.allocator = &alloc, "backends[1].discovery.allocator must be NULL");
    CASE(disc.policy = &fixed.base, "backends[1].discovery.policy is not adaptive");
    CASE(disc.policy = &never_initialised.base,
         "backends[1].discovery.policy was never initialised");
    CASE(b[1].id = long_id, "backends[1].id is 128 bytes, above the maximum 127 for an adaptive");
    CASE(d.store = &no_clear, "store needs load, save and clear callbacks");
#undef CASE

    /* Omitted max_limit is active; a small active clamps the default jumpstart. */
    memset(&disc, 0, sizeof disc);
    b[1] = (struct sluice_backend_desc){.id = "cloud:x", .active = 3, .discovery = &disc};
    d.store = NULL;
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, "cloud:x")).active, 3);
    sluice_engine_destroy(e);

    /* A standalone pool applies the same rules. */
    struct sluice_pool *p = (struct sluice_pool *)1;
    struct sluice_discovery_desc named = {.node_id = "cloud:p"};
    struct sluice_pool_desc pd = {.discovery = &named};
    cr_assert_eq(sluice_pool_create(&pd, &p), SLUICE_EINVAL, "discovery without active");
    cr_assert_null(p);
    named.node_id = NULL;
    pd.active = 4;
    cr_assert_eq(sluice_pool_create(&pd, &p), SLUICE_EINVAL, "a standalone node needs its id");
}

/* ---- allocation ----------------------------------------------------------------- */

/* cloud:a starts at the limit the store holds, and nothing after create allocates. */
static void check_adaptive_engine_allocates_only_in_create(void *obj, struct counting_alloc *c)
{
    struct sluice_engine *e = (struct sluice_engine *)obj;
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, "cloud:a")).active, 9);
    long calls = c->calls;
    /* Nothing after create allocates: runs, samples, clear, status, events. */
    struct sluice_run_result r;
    cr_assert_eq(run_once(e, "cloud:b", SLUICE_OUTCOME_OVERLOAD, 0, &r), SLUICE_ECLIENT);
    cr_assert_eq(run_once(e, "cloud:a", SLUICE_OUTCOME_OK, 0, &r), SLUICE_OK);
    cr_assert_eq(sluice_engine_clear(e, "cloud:a"), SLUICE_OK);
    char line[64];
    sluice_engine_status_line(e, "cloud:b", line, sizeof line);
    sluice_engine_poll(e);
    cr_assert_eq(c->calls, calls, "allocated after create");
}

Test(adaptive, engine_allocation_failure_with_adaptive_backends_leaks_nothing)
{
    struct world w;
    world_init(&w);
    world_store_lock(&w, "cloud:a", 9, 3600);
    struct sluice_discovery_desc disc = {.jumpstart = 3, .events = 16};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc},
                                      {.id = "local", .active = 2},
                                      {.id = "cloud:b", .active = 8, .discovery = &disc},
                                      {.id = "free"}};
    struct sluice_engine_desc d = {.backends = b, .n_backends = 4, .clock = &w.mono_hook,
                                   .wall_clock = &w.wall_hook, .store = &w.store_ops};
    long allocs = assert_allocation_failures_leak_nothing(&(struct alloc_failure_case){
        .desc = &d,
        .create = engine_create_with,
        .destroy = engine_destroy_any,
        .check = check_adaptive_engine_allocates_only_in_create});
    cr_assert_geq(allocs, 8, "every allocation point was exercised");
    sluice_memstore_destroy(w.store);
}

static void check_pool_has_node_at_default_jumpstart(void *obj, struct counting_alloc *c)
{
    (void)c;
    struct sluice_pool *p = (struct sluice_pool *)obj;
    cr_assert_not_null(sluice_pool_discovery(p));
    cr_assert_eq(sluice_pool_stats(p).active, 5, "the default jumpstart");
}

Test(adaptive, an_adaptive_pool_is_still_one_allocation_that_leaks_nothing_when_it_fails)
{
    struct sluice_discovery_desc disc = {.node_id = "cloud:p", .events = 64};
    struct sluice_pool_desc d = {.active = 8, .discovery = &disc};
    long allocs = assert_allocation_failures_leak_nothing(&(struct alloc_failure_case){
        .desc = &d,
        .create = pool_create_with,
        .destroy = pool_destroy_any,
        .check = check_pool_has_node_at_default_jumpstart});
    cr_assert_eq(allocs, 1, "pool, node and event ring share one block");
}

/* ---- status and events ------------------------------------------------------------ */

Test(adaptive, status_lines_of_adaptive_fixed_and_unlimited_nodes)
{
    struct world w;
    world_init(&w);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 52, .discovery = &disc},
                                      {.id = "local", .active = 4},
                                      {.id = "free"}};
    world_create(&w, b, 3);
    const char *ids[] = {"cloud:a", "local", "free", "openrouter"};
    cr_assert_eq(sluice_engine_backend_count(w.engine), 4);
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(sluice_engine_backend_id(w.engine, i), ids[i], "node %zu", i);
    cr_assert_null(sluice_engine_backend_id(w.engine, 4));

    /* 1, 2 and 3 calls in flight. */
    struct sluice_call calls[6];
    const char *on[] = {"cloud:a", "local", "local", "free", "free", "free"};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(sluice_pool_call_begin(sluice_engine_pool(w.engine, on[i]), NULL, NULL,
                                            &calls[i]),
                     SLUICE_OK);
    char line[128];
    cr_assert_str_eq(line_of(&w, "cloud:a", line, sizeof line), "cloud:a 1/5 📈");
    cr_assert_str_eq(line_of(&w, "local", line, sizeof line), "local 2/4");
    cr_assert_str_eq(line_of(&w, "free", line, sizeof line), "free 3/∞");
    cr_assert_str_eq(line_of(&w, "openrouter", line, sizeof line), "openrouter 0/16");

    struct sluice_discovery_status st = status_of(&w, "local");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_FIXED);
    cr_assert_str_eq(st.node, "local");
    cr_assert_eq(st.limit, 4);
    cr_assert_eq(st.in_flight, 2);
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(st.last_event.seq, 0);
    st = status_of(&w, "free");
    cr_assert_eq(st.limit, 0, "unlimited");
    cr_assert_eq(st.in_flight, 3);

    /* snprintf semantics, and unknown nodes. */
    char small[8];
    int n = sluice_engine_status_line(w.engine, "cloud:a", small, sizeof small);
    cr_assert_eq(n, (int)strlen("cloud:a 1/5 📈"));
    cr_assert_str_eq(small, "cloud:a");
    cr_assert_eq(sluice_engine_status_line(w.engine, "nope", line, sizeof line), SLUICE_EINVAL);
    cr_assert_str_eq(line, "");
    cr_assert_eq(sluice_engine_status(w.engine, NULL, &st), SLUICE_EINVAL,
                 "the endpoint-only backend is not a node");

    for (int i = 0; i < 6; i++)
        sluice_pool_call_end(sluice_engine_pool(w.engine, on[i]), &calls[i], SLUICE_OUTCOME_OK, 0);
    world_destroy(&w);
}

Test(adaptive, a_nodes_events_read_back_as_json_lines)
{
    struct world w;
    world_init(&w);
    world_store_lock(&w, "cloud:a", 10, 3600);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc},
                                      {.id = "local", .active = 4}};
    world_create(&w, b, 2);
    advance(&w, SEC);
    struct sluice_run_result r;
    run_once(w.engine, "cloud:a", SLUICE_OUTCOME_OVERLOAD, 0, &r);
    sluice_engine_clear(w.engine, "cloud:a");

    const struct sluice_event_ring *ring = sluice_engine_events(w.engine, "cloud:a");
    cr_assert_not_null(ring);
    cr_assert_null(sluice_engine_events(w.engine, "local"), "fixed nodes have no events");
    cr_assert_null(sluice_engine_events(w.engine, "nope"));
    struct sluice_event ev[8];
    uint64_t cursor = 0;
    size_t n = sluice_event_ring_read(ring, &cursor, ev, 8, NULL);
    /* A 429 at a confirmed lock is a transient: a backoff, not a lowered lock. */
    const char *kinds[] = {"restore", "backoff", "clear"};
    cr_assert_eq(n, 3, "restore, backoff, clear");
    for (size_t i = 0; i < n; i++) {
        char json[512], want[64];
        size_t len = sluice_event_format_json(&ev[i], json, sizeof json);
        cr_assert_lt(len, sizeof json);
        cr_assert_eq(json[len - 1], '\n', "one record per line");
        cr_assert(strstr(json, "\"node\":\"cloud:a\""), "%s", json);
        snprintf(want, sizeof want, "\"event\":\"%s\"", kinds[i]);
        cr_assert(strstr(json, want), "%s lacks %s", json, want);
    }
    world_destroy(&w);
}
