#include <criterion/criterion.h>
#include <sluice/discovery.h>
#include <sluice/policy/fixed.h>

#include <pthread.h>

#include "common.h"

/* ---- a hand-driven clock and node ------------------------------------------ */

struct fake_time {
    int64_t mono_ns, wall_ns;
};

static int64_t fake_mono(void *ctx)
{
    return ((struct fake_time *)ctx)->mono_ns;
}

static int64_t fake_wall(void *ctx)
{
    return ((struct fake_time *)ctx)->wall_ns;
}

struct node {
    struct fake_time time;
    struct sluice_clock mono, wall;
    struct sluice_gate gate;
    struct sluice_discovery *disc;
    struct sluice_event seen[64];
    int n_seen;
};

static void remember(void *ctx, const struct sluice_event *ev)
{
    struct node *n = (struct node *)ctx;
    if (n->n_seen < 64)
        n->seen[n->n_seen++] = *ev;
}

#define SEC SLUICE_NS_PER_SEC

static struct sluice_discovery_desc node_desc(struct node *n, const char *id)
{
    struct sluice_discovery_desc d;
    memset(&d, 0, sizeof d);
    d.node_id = id;
    d.gate = &n->gate;
    d.clock = &n->mono;
    d.wall_clock = &n->wall;
    d.window_max_ns = 60 * SEC;
    d.on_event = remember;
    d.on_event_ctx = n;
    return d;
}

static void node_init(struct node *n)
{
    memset(n, 0, sizeof *n);
    n->time.mono_ns = 1000 * SEC;
    n->time.wall_ns = 1700000000 * SEC;
    n->mono.now_ns = fake_mono;
    n->mono.ctx = &n->time;
    n->wall.now_ns = fake_wall;
    n->wall.ctx = &n->time;
    sluice_gate_init(&n->gate, 1);
}

static void node_create(struct node *n, struct sluice_discovery_desc *d)
{
    const char *why = NULL;
    cr_assert_eq(sluice_discovery_create(d, &n->disc, &why), SLUICE_OK, "%s", why);
}

static void advance(struct node *n, int64_t ns)
{
    n->time.mono_ns += ns;
    n->time.wall_ns += ns;
}

static void feed(struct node *n, int64_t latency_ns, uint32_t in_flight, enum sluice_outcome o,
                 int64_t retry_after_ns)
{
    struct sluice_sample s = {latency_ns, in_flight, o, retry_after_ns};
    sluice_discovery_on_sample(n->disc, &s);
}

/* One window: `count` calls that all started now and took 1 s, with the
 * limit saturated, then time moves past the window's close and it closes. */
static void run_window(struct node *n, uint32_t count, int64_t latency_ns)
{
    uint32_t limit = sluice_discovery_limit(n->disc);
    advance(n, latency_ns);
    for (uint32_t i = 0; i < count; i++)
        feed(n, latency_ns, limit, SLUICE_OUTCOME_OK, 0);
    advance(n, 60 * SEC);
    sluice_discovery_poll(n->disc);
}

static struct sluice_discovery_status status_of(struct node *n)
{
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(n->disc, &st);
    return st;
}

/* ---- status line ----------------------------------------------------------- */

static const char *line_for(const char *node, uint32_t in_flight, uint32_t limit,
                            enum sluice_discovery_state state, char *buf, size_t size)
{
    struct sluice_discovery_status st;
    memset(&st, 0, sizeof st);
    st.node = node;
    st.in_flight = in_flight;
    st.limit = limit;
    st.state = state;
    int n = sluice_status_line(buf, size, &st);
    cr_assert_eq((size_t)n, strlen(buf));
    return buf;
}

Test(discovery, status_line_has_the_exact_format_for_each_state)
{
    char buf[128];
    cr_assert_str_eq(line_for("cloud:default_ollama", 5, 52, SLUICE_DISCOVERY_PROBING, buf, 128),
                     "cloud:default_ollama 5/52 \xF0\x9F\x93\x88");
    cr_assert_str_eq(line_for("cloud:default_ollama", 50, 52, SLUICE_DISCOVERY_LOCKED, buf, 128),
                     "cloud:default_ollama 50/52 \xF0\x9F\x94\x92");
    cr_assert_str_eq(line_for("cloud:default_ollama", 8, 12, SLUICE_DISCOVERY_BACKOFF, buf, 128),
                     "cloud:default_ollama 8/12 \xF0\x9F\x8C\xA7\xEF\xB8\x8F");
    cr_assert_str_eq(line_for("local:gpu", 2, 4, SLUICE_DISCOVERY_FIXED, buf, 128), "local:gpu 2/4");
    cr_assert_str_eq(sluice_discovery_state_glyph(SLUICE_DISCOVERY_PROBING), "📈");
    cr_assert_str_eq(sluice_discovery_state_glyph(SLUICE_DISCOVERY_LOCKED), "🔒");
    cr_assert_str_eq(sluice_discovery_state_glyph(SLUICE_DISCOVERY_BACKOFF), "🌧️");
}

Test(discovery, a_new_node_shows_its_jumpstart_and_in_flight_calls)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:default_ollama");
    node_create(&n, &d);
    cr_assert_eq(sluice_gate_limit(&n.gate), 5, "the gate starts at the jumpstart");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_gate_tryacquire(&n.gate), SLUICE_OK);
    struct sluice_discovery_status st = status_of(&n);
    char buf[128];
    sluice_status_line(buf, sizeof buf, &st);
    cr_assert_str_eq(buf, "cloud:default_ollama 3/5 📈");
    cr_assert_eq(st.last_event.seq, 0, "no event yet");
    sluice_discovery_destroy(n.disc);
}

/* ---- configuration ----------------------------------------------------------- */

Test(discovery, invalid_configuration_fails_with_einval_naming_the_field)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc base = node_desc(&n, "cloud:x");
    struct sluice_discovery_desc d;
    const char *why;
    struct sluice_discovery *disc = NULL;

#define EXPECT_EINVAL(mutation, field)                                                             \
    do {                                                                                           \
        d = base;                                                                                  \
        mutation;                                                                                  \
        why = NULL;                                                                                \
        cr_expect_eq(sluice_discovery_create(&d, &disc, &why), SLUICE_EINVAL, "%s", #mutation);   \
        cr_assert_null(disc);                                                                      \
        cr_expect(why && strstr(why, field), "%s: message '%s' does not name %s", #mutation,      \
                  why ? why : "(none)", field);                                                    \
        cr_expect_eq(sluice_discovery_validate(&d, NULL), SLUICE_EINVAL);                          \
    } while (0)

    EXPECT_EINVAL((d.min_limit = 10, d.max_limit = 3), "min_limit");
    EXPECT_EINVAL(d.node_id = NULL, "node_id");
    EXPECT_EINVAL(d.node_id = "", "node_id");
    EXPECT_EINVAL(d.gate = NULL, "gate");
    EXPECT_EINVAL((d.jumpstart = 50, d.max_limit = 20), "jumpstart");
    EXPECT_EINVAL(d.max_limit = SLUICE_GATE_LIMIT_MAX + 1, "max_limit");
    EXPECT_EINVAL(d.lock_ttl_s = -1, "lock_ttl_s");
    EXPECT_EINVAL(d.lock_ttl_s = SLUICE_DISCOVERY_TTL_MAX_S + 1, "lock_ttl_s");
    EXPECT_EINVAL(d.window_max_ns = INT64_MAX, "window_max_ns");
    EXPECT_EINVAL((d.window_min_ns = 10 * SEC, d.window_max_ns = SEC), "window_min_ns");
    EXPECT_EINVAL(d.window_tail = -1, "window_tail");
    EXPECT_EINVAL(d.retry_after_max_ns = -1, "retry_after_max_ns");
    EXPECT_EINVAL(d.events = SLUICE_DISCOVERY_EVENTS_MAX + 1, "events");
    char long_id[SLUICE_NODE_ID_MAX + 8];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    EXPECT_EINVAL(d.node_id = long_id, "node_id");
#undef EXPECT_EINVAL

    /* The default jumpstart is clamped, not an error, when only max_limit is small. */
    d = base;
    d.max_limit = 3;
    cr_assert_eq(sluice_discovery_create(&d, &disc, NULL), SLUICE_OK);
    cr_assert_eq(sluice_discovery_limit(disc), 3);
    sluice_discovery_destroy(disc);
}

Test(discovery, policy_parameters_are_validated_with_their_field_named)
{
    const char *why = NULL;
    struct sluice_policy_discover p;
    struct sluice_policy_discover_params bad = {0};
    bad.backoff = 1.5;
    cr_assert_eq(sluice_policy_discover_init(&p, &bad, &why), SLUICE_EINVAL);
    cr_assert_not_null(strstr(why, "sluice_policy_discover_params.backoff"), "%s", why);
}

/* ---- store: restore, expiry, clear ------------------------------------------- */

/* Node "cloud:x" with a fresh four-lock memstore; returns its description, store set. */
static struct sluice_discovery_desc node_with_memstore(struct node *n,
                                                       struct sluice_memstore **store,
                                                       struct sluice_store_ops *ops)
{
    node_init(n);
    cr_assert_eq(sluice_memstore_create(4, NULL, store), SLUICE_OK);
    *ops = sluice_memstore_ops(*store);
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    d.store = ops;
    return d;
}

Test(discovery, a_live_stored_lock_is_restored_at_start)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    struct sluice_lock_record rec = {52, n.time.wall_ns / SEC + 3600};
    cr_assert_eq(ops.save(ops.ctx, "cloud:x", &rec), SLUICE_OK);
    node_create(&n, &d);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.limit, 52);
    cr_assert_eq(st.ceiling, 52);
    cr_assert_eq(st.lock_expires_s, rec.expires_s);
    cr_assert_eq(sluice_gate_limit(&n.gate), 52);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_RESTORE);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_STORE);
    cr_assert_eq(n.n_seen, 1, "the callback saw the restore");
    cr_assert_eq(n.seen[0].kind, SLUICE_EVENT_RESTORE);
    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);
}

Test(discovery, an_expired_stored_lock_is_ignored)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    struct sluice_lock_record rec = {52, n.time.wall_ns / SEC - 1};
    ops.save(ops.ctx, "cloud:x", &rec);
    node_create(&n, &d);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.limit, 5);
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(n.n_seen, 0);
    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);
}

/* Drive a node to a lock at its max_limit: slow start, then a stable window there. */
static void lock_at_max(struct node *n, struct sluice_discovery_desc *d, uint32_t max)
{
    d->jumpstart = 2;
    d->max_limit = max;
    node_create(n, d);
    for (int i = 0; i < 12 && sluice_discovery_state(n->disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(n, 16, SEC);
}

Test(discovery, a_node_that_never_congests_locks_at_max_limit_and_persists_it)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    d.lock_ttl_s = 600;
    lock_at_max(&n, &d, 8);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.ceiling, 8);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_LOCK);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_MAX_LIMIT);
    struct sluice_lock_record rec;
    ops.load(ops.ctx, "cloud:x", &rec);
    cr_assert_eq(rec.ceiling, 8);
    cr_assert_eq(rec.expires_s, st.lock_expires_s);
    cr_assert_eq(rec.expires_s, n.time.wall_ns / SEC + 600, "expiry is wall clock + ttl");

    /* Expiry, by the wall clock: probing resumes, the stored record stays. */
    advance(&n, 601 * SEC);
    sluice_discovery_poll(n.disc);
    st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_EXPIRY);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_TTL);

    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);
}

Test(discovery, clear_drops_the_stored_lock_and_restarts_from_the_jumpstart)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    lock_at_max(&n, &d, 8);
    cr_assert_eq(sluice_discovery_state(n.disc), SLUICE_DISCOVERY_LOCKED);
    /* Three calls in flight at the moment of the clear. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_gate_tryacquire(&n.gate), SLUICE_OK);

    cr_assert_eq(sluice_discovery_clear(n.disc), SLUICE_OK);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.limit, 2, "back to the jumpstart");
    cr_assert_eq(sluice_gate_limit(&n.gate), 2);
    cr_assert_eq(st.in_flight, 3, "in-flight calls keep their permits");
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_CLEAR);
    cr_assert_eq(st.last_event.old_limit, 8);
    cr_assert_eq(st.last_event.new_limit, 2);
    struct sluice_lock_record rec;
    ops.load(ops.ctx, "cloud:x", &rec);
    cr_assert_eq(rec.ceiling, 0, "the stored lock is gone");
    cr_assert_eq(store->clears, 1);

    /* Their completions count for nothing: they started before the clear. */
    uint64_t events = sluice_event_ring_count(sluice_discovery_events(n.disc));
    advance(&n, SEC / 2);
    for (int i = 0; i < 3; i++) {
        feed(&n, 2 * SEC, 8, SLUICE_OUTCOME_OVERLOAD, 0);
        sluice_gate_release(&n.gate);
    }
    cr_assert_eq(sluice_discovery_limit(n.disc), 2, "stale overloads did not cut");
    cr_assert_eq(sluice_event_ring_count(sluice_discovery_events(n.disc)), events);
    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);
}

/* ---- congestion -------------------------------------------------------------- */

Test(discovery, one_overload_burst_cuts_once_and_holds_for_retry_after)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.jumpstart = 40;
    d.retry_after_max_ns = 30 * SEC;
    node_create(&n, &d);
    advance(&n, SEC);
    int64_t now = n.time.mono_ns;
    /* A 429 from a call that started after the last cut: cut at once, hold. */
    feed(&n, SEC / 10, 40, SLUICE_OUTCOME_OVERLOAD, 5 * SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 36, "cut to 40 x 0.9");
    cr_assert_eq(sluice_discovery_state(n.disc), SLUICE_DISCOVERY_BACKOFF);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), now + 5 * SEC);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_BACKOFF);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_RETRY_AFTER);
    /* More 429s from the same burst (started before the cut): no second cut. */
    advance(&n, SEC / 10);
    for (int i = 0; i < 10; i++)
        feed(&n, SEC / 2, 40, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(sluice_discovery_limit(n.disc), 36);
    /* One from a call started after the cut does cut again. */
    advance(&n, SEC);
    feed(&n, SEC / 10, 36, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(sluice_discovery_limit(n.disc), 32);
    /* An absurd Retry-After is clamped to retry_after_max_ns. */
    now = n.time.mono_ns;
    feed(&n, SEC / 10, 36, SLUICE_OUTCOME_OVERLOAD, 3600 * SEC);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), now + 30 * SEC);
    /* Ignored outcomes (transport errors, cancels) never cut. */
    advance(&n, SEC);
    uint32_t limit = sluice_discovery_limit(n.disc);
    for (int i = 0; i < 50; i++)
        feed(&n, SEC / 10, 36, SLUICE_OUTCOME_IGNORE, 0);
    cr_assert_eq(sluice_discovery_limit(n.disc), limit);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, locks_just_below_the_limit_that_was_refused)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.jumpstart = 10;
    node_create(&n, &d);
    advance(&n, SEC);
    feed(&n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, 0); /* refused at 10: bracket [?, 9] */
    cr_assert_eq(sluice_discovery_limit(n.disc), 9);
    for (int i = 0; i < 10 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(&n, 16, SEC);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.ceiling, 9);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_BRACKET);
    /* Healthy saturated windows never raise a held lock. */
    for (int i = 0; i < 20; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 9);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_fixed_node_ignores_samples_and_clear)
{
    struct node n;
    node_init(&n);
    struct sluice_policy_fixed fixed;
    struct sluice_policy_fixed_params params = {4};
    sluice_policy_fixed_init(&fixed, &params, NULL);
    struct sluice_discovery_desc d = node_desc(&n, "local:gpu");
    d.policy = &fixed.base;
    node_create(&n, &d);
    cr_assert_eq(sluice_gate_limit(&n.gate), 4);
    feed(&n, SEC, 4, SLUICE_OUTCOME_OVERLOAD, 10 * SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 4);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), 0);
    cr_assert_eq(sluice_discovery_clear(n.disc), SLUICE_OK);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_FIXED);
    cr_assert_eq(st.limit, 4);
    cr_assert_eq(st.last_event.seq, 0, "no events for a fixed node");
    sluice_discovery_destroy(n.disc);
}

/* ---- allocation ---------------------------------------------------------------- */

struct counting {
    long allocs, frees;
};

static void *count_alloc(void *ctx, size_t size, size_t align)
{
    ((struct counting *)ctx)->allocs++;
    return aligned_alloc(align, (size + align - 1) / align * align);
}

static void count_free(void *ctx, void *p, size_t size)
{
    (void)size;
    ((struct counting *)ctx)->frees++;
    free(p);
}

Test(discovery, allocates_only_at_create_through_the_allocator_hook)
{
    struct node n;
    node_init(&n);
    struct counting c = {0, 0};
    struct sluice_allocator a = {count_alloc, count_free, &c};
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.allocator = &a;
    node_create(&n, &d);
    long after_create = c.allocs;
    cr_assert_gt(after_create, 0);
    for (int i = 0; i < 30; i++)
        run_window(&n, 16, SEC);
    sluice_discovery_clear(n.disc);
    cr_assert_eq(c.allocs, after_create, "samples, windows and clear allocate nothing");
    sluice_discovery_destroy(n.disc);
    cr_assert_eq(c.frees, c.allocs);
}

/* ---- threads ------------------------------------------------------------------- */

struct hammer {
    struct sluice_discovery *disc;
    struct sluice_gate *gate;
    uint64_t seed;
    int iterations;
};

static void *complete_calls(void *arg)
{
    struct hammer *h = (struct hammer *)arg;
    for (int i = 0; i < h->iterations; i++) {
        uint64_t r = test_rand(&h->seed);
        if (sluice_gate_tryacquire(h->gate) != SLUICE_OK)
            continue;
        struct sluice_gate_counts c = sluice_gate_stats(h->gate);
        enum sluice_outcome o = r % 50 == 0   ? SLUICE_OUTCOME_OVERLOAD
                                : r % 50 == 1 ? SLUICE_OUTCOME_IGNORE
                                              : SLUICE_OUTCOME_OK;
        struct sluice_sample s = {(int64_t)(r % 200000), c.in_flight, o,
                                  r % 97 == 0 ? 1000 : 0};
        sluice_discovery_on_sample(h->disc, &s);
        sluice_gate_release(h->gate);
    }
    return NULL;
}

static void *observe(void *arg)
{
    struct hammer *h = (struct hammer *)arg;
    char line[256];
    struct sluice_event batch[8];
    uint64_t cursor = 0;
    for (int i = 0; i < h->iterations / 50; i++) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(h->disc, &st);
        sluice_status_line(line, sizeof line, &st);
        sluice_event_ring_read(sluice_discovery_events(h->disc), &cursor, batch, 8, NULL);
        if (i % 100 == 0)
            sluice_discovery_clear(h->disc);
        sluice_discovery_poll(h->disc);
    }
    return NULL;
}

Test(discovery, concurrent_completions_clears_and_readers_keep_the_limit_in_bounds)
{
    struct sluice_gate *gate;
    sluice_gate_create(NULL, &gate);
    struct sluice_discovery_desc d;
    memset(&d, 0, sizeof d);
    d.node_id = "cloud:threads";
    d.gate = gate;
    d.min_limit = 2;
    d.max_limit = 64;
    d.window_min_ns = 1;
    d.window_max_ns = 2 * SLUICE_NS_PER_MS;
    d.events = 16;
    struct sluice_discovery *disc;
    cr_assert_eq(sluice_discovery_create(&d, &disc, NULL), SLUICE_OK);
    enum { WORKERS = 3 };
    struct hammer h[WORKERS + 1];
    pthread_t tids[WORKERS + 1];
    for (int i = 0; i <= WORKERS; i++) {
        h[i] = (struct hammer){disc, gate, (uint64_t)i + 1, SCALED(100000)};
        pthread_create(&tids[i], NULL, i < WORKERS ? complete_calls : observe, &h[i]);
    }
    for (int i = 0; i <= WORKERS; i++)
        pthread_join(tids[i], NULL);
    uint32_t limit = sluice_discovery_limit(disc);
    cr_assert(limit >= 2 && limit <= 64, "limit %u out of [2, 64]", limit);
    cr_assert_eq(sluice_gate_limit(gate), limit, "gate and discovery agree");
    cr_assert_eq(sluice_gate_stats(gate).in_flight, 0);
    sluice_discovery_destroy(disc);
    sluice_gate_destroy(gate);
}

Test(discovery, a_retry_after_at_the_configured_maximum_saturates_the_hold)
{
    /* retry_after_max_ns may be as large as INT64_MAX ("honour any"): now +
     * Retry-After must saturate, not wrap into the past and drop the hold. */
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.jumpstart = 10;
    d.retry_after_max_ns = INT64_MAX;
    node_create(&n, &d);
    advance(&n, SEC);
    feed(&n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, INT64_MAX);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), INT64_MAX);
    sluice_discovery_destroy(n.disc);
}
