/*
 * The discovery state machine (sluice/discovery.h) driven sample by sample
 * in virtual time: growth, backoff, brackets, locks and their expiry, holds,
 * clears, hints, the store and the events, with stub policies where a test
 * needs a verdict of its own.
 *
 * The node on its hand-driven clock is in discovery_node.h, shared with
 * the tests of the window and effects promises discovery keeps (window.c:
 * windows under extreme parameters, cut calls, torn samples; effects.c:
 * store, grants and events after the lock).
 */
#include <criterion/criterion.h>
#include <sluice/discovery.h>
#include <sluice/policy/fixed.h>

#include <math.h>
#include <pthread.h>
#include <time.h>

#include "common.h"
#include "discovery_node.h"

/* ---- a hand-driven clock and node ------------------------------------------ */

/* The usual node: "cloud:x", the default policy, starting at `jumpstart`. */
static void node_start(struct node *n, uint32_t jumpstart)
{
    node_init(n);
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    d.jumpstart = jumpstart;
    node_create(n, &d);
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
    char why[256];
    struct sluice_discovery *disc = NULL;

#define EXPECT_EINVAL(mutation, field)                                                             \
    do {                                                                                           \
        d = base;                                                                                  \
        mutation;                                                                                  \
        why[0] = '\0';                                                                             \
        d.error = why;                                                                             \
        d.error_size = sizeof why;                                                                 \
        cr_expect_eq(sluice_discovery_create(&d, &disc), SLUICE_EINVAL, "%s", #mutation);          \
        cr_assert_null(disc);                                                                      \
        cr_expect(strstr(why, field), "%s: message '%s' does not name %s", #mutation, why,         \
                  field);                                                                          \
        d.error = NULL;                                                                            \
        cr_expect_eq(sluice_discovery_validate(&d), SLUICE_EINVAL);                                \
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
    EXPECT_EINVAL(d.window_tail = 1e12, "window_tail");
    EXPECT_EINVAL(d.window_tail = INFINITY, "window_tail");
    EXPECT_EINVAL(d.window_tail = NAN, "window_tail");
    EXPECT_EINVAL(d.window_span = SLUICE_DISCOVERY_SPAN_MAX * 1.001, "window_span");
    EXPECT_EINVAL(d.window_span = -INFINITY, "window_span");
    EXPECT_EINVAL(d.window_span = NAN, "window_span");
    EXPECT_EINVAL(d.window_samples = SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX + 1, "window_samples");
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
    cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_OK);
    cr_assert_eq(sluice_discovery_limit(disc), 3);
    sluice_discovery_destroy(disc);
}

Test(discovery, policy_parameters_are_validated_with_their_field_named)
{
    char why[256] = "";
    struct sluice_policy_discover p;
    struct sluice_policy_discover_params bad = {0};
    bad.backoff = 1.5;
    cr_assert_eq(sluice_policy_discover_init(&p, &bad, why, sizeof why), SLUICE_EINVAL);
    cr_assert_not_null(strstr(why, "sluice_policy_discover_params.backoff"), "%s", why);
}

/* ---- store: restore, expiry, clear ------------------------------------------- */

Test(discovery, a_live_stored_lock_is_restored_at_start)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    struct sluice_lock_record rec = {.ceiling = 52, .expires_s = n.time.wall_ns / SEC + 3600};
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
    struct sluice_lock_record rec = {.ceiling = 52, .expires_s = n.time.wall_ns / SEC - 1};
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

/* Blocking threads whose 429s come back in a millisecond: the limit stands at
 * 40 but only 25 calls are in flight when the provider (cap 24) refuses. */
Test(discovery, a_burst_refused_far_below_the_limit_cuts_once_to_where_it_struck)
{
    struct node n;
    node_start(&n, 40);
    advance(&n, SEC);
    feed(&n, SEC / 1000, 25, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(sluice_discovery_limit(n.disc), 22, "one cut from 25 in flight (x 0.9), not 40");
    /* The rest of the burst: calls started after the cut, still with 25 or
     * 26 in flight (the gate has not drained to 22 yet). Echoes: no cut. */
    for (int i = 0; i < 9; i++) {
        advance(&n, SEC / 5000);
        feed(&n, SEC / 1000, 25 + (uint32_t)(i % 2), SLUICE_OUTCOME_OVERLOAD, 0);
    }
    cr_assert_eq(sluice_discovery_limit(n.disc), 22, "echoes of the level already cut below");
    /* Recovery bisects back up by limits; every limit past 24 is refused
     * again with 25 in flight, and the lock lands at 24. */
    for (int i = 0; i < 40 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++) {
        if (sluice_discovery_limit(n.disc) > 24) {
            advance(&n, SEC);
            feed(&n, SEC / 1000, 25, SLUICE_OUTCOME_OVERLOAD, 0);
        }
        run_window(&n, 32, SEC);
    }
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.ceiling, 24, "locked just under the concurrency that was refused");
    /* A refusal at a concurrency the limit allows is news, and cuts. */
    advance(&n, SEC);
    feed(&n, SEC / 1000, 24, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_lt(sluice_discovery_limit(n.disc), 24);
    sluice_discovery_destroy(n.disc);
}

/*
 * A close flips the windows before its new limit is in place; a refusal another thread
 * records in between is judged by the old limit and lands in the new window. It is the
 * burst that close answered: an echo there. Counted fresh, it closed the new window at once
 * and cut it again (blocking callers beside a stalled provider locked a cap of 24 at 18-22).
 * The close runs here by its steps, as the other thread would, around the refusal.
 */
Test(discovery, a_refusal_recorded_while_a_close_runs_is_judged_by_the_window_it_lands_in)
{
    struct node n;
    node_start(&n, 40);
    advance(&n, SEC);
    struct sluice_discovery *d = n.disc;
    int64_t now = n.time.mono_ns;
    sluice_spinlock_lock(&d->lock);
    (void)sluice__discovery_take_locked(d, now);
    struct sluice_sample raced = {SEC / 1000, 25, SLUICE_OUTCOME_OVERLOAD, 0, now - SEC / 1000,
                                  40};
    sluice_discovery_record(d, &raced); /* fresh by the limit it read (40): 25 <= 40 */
    sluice__discovery_set_limit_locked(d, 22, now);
    sluice__discovery_schedule(d, now, sluice__discovery_timing_ref(d));
    sluice__discovery_opened_locked(d);
    sluice__discovery_unlock(d);
    cr_assert_not(sluice_window_recorder_has_fresh(&d->acc),
                  "25 in flight is past the window's limit of 22: an echo there");
    run_window(&n, 32, SEC);
    uint32_t limit = sluice_discovery_limit(d);
    cr_assert(limit >= 22 && status_of(&n).last_event.kind != SLUICE_EVENT_BACKOFF,
              "no second cut for the burst the first answered (limit %u)", limit);
    /* Judged by the window it lands in, a refusal at a concurrency the limit allows is news. */
    advance(&n, SEC);
    feed(&n, SEC / 1000, limit - 1, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_lt(sluice_discovery_limit(d), limit, "a refusal with %u in flight cuts", limit - 1);
    sluice_discovery_destroy(d);
}

Test(discovery, update_now_closes_a_young_window_and_acts_on_the_policys_answer)
{
    struct node n;
    node_start(&n, 5);
    advance(&n, SEC);
    for (int i = 0; i < 16; i++)
        feed(&n, SEC, 5, SLUICE_OUTCOME_OK, 0);
    sluice_discovery_poll(n.disc);
    cr_assert_eq(sluice_discovery_limit(n.disc), 5, "the window is not due yet");
    sluice_discovery_update_now(n.disc);
    cr_assert_eq(sluice_discovery_limit(n.disc), 10, "closed now: slow start doubled");
    cr_assert_eq(status_of(&n).last_event.kind, SLUICE_EVENT_PROBE);
    sluice_discovery_destroy(n.disc);
}

/* A node at jumpstart 10 that sees one refusal there (bracket [?, 9]) and
 * then clean saturated windows until it locks. Returns when the window that
 * locked it started. */
static int64_t lock_after_a_refusal_at_10(struct node *n)
{
    node_init(n);
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    d.jumpstart = 10;
    node_create(n, &d);
    advance(n, SEC);
    feed(n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(sluice_discovery_limit(n->disc), 9);
    int64_t started = 0;
    for (int i = 0; i < 10 && sluice_discovery_state(n->disc) != SLUICE_DISCOVERY_LOCKED; i++) {
        started = n->time.mono_ns;
        run_window(n, 16, SEC);
    }
    return started;
}

Test(discovery, locks_just_below_the_limit_that_was_refused)
{
    struct node n;
    lock_after_a_refusal_at_10(&n);
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

/* A call that ends now, having run since `start_ns` under `limit_at_start`. */
static void feed_started(struct node *n, int64_t start_ns, uint32_t limit_at_start,
                         enum sluice_outcome o)
{
    struct sluice_sample s = {n->time.mono_ns - start_ns, limit_at_start, o, 0, start_ns,
                              limit_at_start};
    sluice_discovery_on_sample(n->disc, &s);
}

Test(discovery, a_late_timeout_counts_against_the_limit_its_call_started_under)
{
    struct node n;
    node_start(&n, 20);
    int64_t t0 = n.time.mono_ns;
    /* Started under limit 6, a second ago; the limit is 20 now. The timeout
     * says 6 was too many: cut below 6 at once, not to 20 x 0.9. */
    advance(&n, SEC);
    feed_started(&n, t0, 6, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(sluice_discovery_limit(n.disc), 5, "cut to below where it struck");
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_BACKOFF);
    cr_assert_eq(st.last_event.old_limit, 20);
    /* Another call from before the cut that struck at 6: already acted on. */
    feed_started(&n, t0, 6, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(sluice_discovery_limit(n.disc), 5);
    /* One from before the cut that started under 5: 5 is refused too. */
    advance(&n, SEC / 10);
    feed_started(&n, t0, 5, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(sluice_discovery_limit(n.disc), 4, "a late refusal at the current limit is news");
    /* And the bracket sits under 5: the lock lands at 4. */
    for (int i = 0; i < 10 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).ceiling, 4);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_refusal_from_the_window_that_confirmed_the_ceiling_lowers_it)
{
    struct node n;
    int64_t before_lock = lock_after_a_refusal_at_10(&n);
    cr_assert_eq(status_of(&n).ceiling, 9);
    /* A call of the confirming window times out only now: 9 was one too many
     * after all. The ceiling comes down instead of merely backing off. */
    advance(&n, SEC);
    feed_started(&n, before_lock, 9, SLUICE_OUTCOME_OVERLOAD);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.ceiling, 8, "lowered");
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_LOCK);
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_LOWERED);
    /* Once a window confirms 8, a refusal at 8 from a call that started
     * after that is a transient: back off, keep the ceiling. */
    for (int i = 0; i < 10 && !(status_of(&n).last_event.kind == SLUICE_EVENT_LOCK &&
                                status_of(&n).last_event.cause == SLUICE_CAUSE_BRACKET);
         i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).last_event.cause, SLUICE_CAUSE_BRACKET, "8 confirmed");
    advance(&n, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 8, SLUICE_OUTCOME_OVERLOAD);
    st = status_of(&n);
    cr_assert_eq(st.ceiling, 8, "kept");
    cr_assert_eq(st.last_event.kind, SLUICE_EVENT_BACKOFF);
    cr_assert_eq(sluice_discovery_limit(n.disc), 7);
    sluice_discovery_destroy(n.disc);
}

/* Refused again at its own height: recover to the ceiling after a transient,
 * and a second refusal there before SLUICE_DISCOVERY_FORGIVE stable windows
 * lowers it; after that many clean windows, one refusal is a transient again. */
static void refuse_at_the_ceiling(struct node *n)
{
    uint32_t ceiling = status_of(n).ceiling;
    advance(n, SEC);
    feed_started(n, n->time.mono_ns - SEC / 10, ceiling, SLUICE_OUTCOME_OVERLOAD);
}

static void recover_to_the_ceiling(struct node *n, int stable_windows_there)
{
    uint32_t ceiling = status_of(n).ceiling;
    for (int i = 0; i < 20 && sluice_discovery_limit(n->disc) < ceiling; i++)
        run_window(n, 16, SEC);
    cr_assert_eq(sluice_discovery_limit(n->disc), ceiling);
    for (int i = 0; i < stable_windows_there; i++)
        run_window(n, 16, SEC);
}

Test(discovery, a_ceiling_refused_twice_before_it_held_for_a_while_is_lowered)
{
    struct node n;
    lock_after_a_refusal_at_10(&n);
    cr_assert_eq(status_of(&n).ceiling, 9);
    refuse_at_the_ceiling(&n);
    cr_assert_eq(status_of(&n).ceiling, 9, "the first refusal at a confirmed ceiling: a transient");
    recover_to_the_ceiling(&n, 2);
    refuse_at_the_ceiling(&n);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.ceiling, 8, "refused again before it held for a while: lowered");
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_LOWERED);
    /* 8 holds (a window confirms it), then SLUICE_DISCOVERY_FORGIVE clean
     * windows forgive a refusal there: the next is a transient again. */
    recover_to_the_ceiling(&n, 1 + SLUICE_DISCOVERY_FORGIVE);
    refuse_at_the_ceiling(&n);
    cr_assert_eq(status_of(&n).ceiling, 8, "a transient once more");
    recover_to_the_ceiling(&n, SLUICE_DISCOVERY_FORGIVE);
    refuse_at_the_ceiling(&n);
    cr_assert_eq(status_of(&n).ceiling, 8, "forgiven after FORGIVE clean windows");
    sluice_discovery_destroy(n.disc);
}

/* A policy that grows by one on every healthy window, cuts on a refusal, and,
 * while `knee` is set, answers a saturated window with a latency knee: the
 * discovery layer's rules for knees at a lock, without a latency model. */
struct knee_policy {
    struct sluice_policy base;
    bool knee;
};

static uint32_t knee_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)self, (void)warm;
    return jumpstart;
}

static struct sluice_verdict knee_update(struct sluice_policy *self, const struct sluice_window *w)
{
    if (w->n_fresh_overload)
        return sluice__verdict_overload(w, 0.9);
    if (((struct knee_policy *)self)->knee && w->saturated)
        return sluice_verdict_make(w->limit - 1, SLUICE_CAUSE_LATENCY, 0);
    return sluice_verdict_make(w->limit + 1, SLUICE_CAUSE_ADDITIVE, 0);
}

static const struct sluice_policy_ops knee_ops = {"knee", true, knee_reset, knee_update,
                                                  sizeof(struct knee_policy)};

/* Lock at 9 under the knee policy, the bracket made at 10 by a refusal or
 * (by_knee) by a latency knee; returns the node's copy of the policy. */
static struct knee_policy *lock_at_9_with_knees(struct node *n, bool by_knee)
{
    node_init(n);
    struct knee_policy policy = {{&knee_ops}, false};
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    d.policy = &policy.base;
    d.jumpstart = 10;
    node_create(n, &d);
    struct knee_policy *p = (struct knee_policy *)sluice__discovery_policy(n->disc);
    if (by_knee) {
        p->knee = true;
        run_window(n, 16, SEC);
        p->knee = false;
    } else {
        advance(n, SEC);
        feed(n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, 0);
    }
    for (int i = 0; i < 10 && sluice_discovery_state(n->disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(n, 16, SEC);
    cr_assert_eq(status_of(n).ceiling, 9);
    return p;
}

/* One visit to the ceiling that ends in a knee, then back to the ceiling
 * with `stable` stable windows there. */
static void knee_at_the_ceiling(struct node *n, struct knee_policy *p, int stable)
{
    cr_assert_eq(sluice_discovery_limit(n->disc), status_of(n).ceiling);
    p->knee = true;
    run_window(n, 16, SEC);
    cr_assert_eq(status_of(n).last_event.cause, SLUICE_CAUSE_LATENCY, "no knee");
    p->knee = false;
    recover_to_the_ceiling(n, stable);
}

Test(discovery, a_ceiling_that_every_visit_ends_in_a_latency_knee_is_lowered_one_step)
{
    struct node n;
    struct knee_policy *p = lock_at_9_with_knees(&n, false);
    for (int k = 1; k < SLUICE_DISCOVERY_KNEE_STRIKES; k++) {
        knee_at_the_ceiling(&n, p, 0);
        cr_assert_eq(status_of(&n).ceiling, 9, "knee %d at the lock: a transient", k);
    }
    p->knee = true;
    run_window(&n, 16, SEC);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.ceiling, 8, "every visit ended in a knee: lowered by one");
    cr_assert_eq(st.last_event.cause, SLUICE_CAUSE_LOWERED);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, latency_knees_far_apart_at_a_ceiling_are_forgiven)
{
    struct node n;
    struct knee_policy *p = lock_at_9_with_knees(&n, false);
    for (int k = 0; k < 2 * SLUICE_DISCOVERY_KNEE_STRIKES; k++)
        knee_at_the_ceiling(&n, p, SLUICE_DISCOVERY_FORGIVE);
    cr_assert_eq(status_of(&n).ceiling, 9, "knees with FORGIVE stable windows between them");
    sluice_discovery_destroy(n.disc);
}

/* A provider that slows with every call knees at every level: where latency
 * made the bracket it has judged the ceiling already, and knees there must
 * not walk the lock down one step at a time. */
Test(discovery, latency_knees_never_lower_a_ceiling_that_latency_bracketed)
{
    struct node n;
    struct knee_policy *p = lock_at_9_with_knees(&n, true);
    for (int k = 0; k < 2 * SLUICE_DISCOVERY_KNEE_STRIKES; k++)
        knee_at_the_ceiling(&n, p, 0);
    cr_assert_eq(status_of(&n).ceiling, 9);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_fixed_node_ignores_samples_and_clear)
{
    struct node n;
    node_init(&n);
    struct sluice_policy_fixed fixed;
    struct sluice_policy_fixed_params params = {4};
    sluice_policy_fixed_init(&fixed, &params, NULL, 0);
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

Test(discovery, allocates_only_at_create_through_the_allocator_hook)
{
    struct node n;
    node_init(&n);
    struct counting_alloc c = {.fail_at = -1};
    struct sluice_allocator a = counting_allocator(&c);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.allocator = &a;
    node_create(&n, &d);
    long after_create = c.calls;
    cr_assert_gt(after_create, 0);
    for (int i = 0; i < 30; i++)
        run_window(&n, 16, SEC);
    sluice_discovery_clear(n.disc);
    cr_assert_eq(c.calls, after_create, "samples, windows and clear allocate nothing");
    sluice_discovery_destroy(n.disc);
    cr_assert_eq(c.live, 0);
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
                                  r % 97 == 0 ? 1000 : 0, 0, 0};
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
    cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_OK);
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

/* ---- what a saved lock records; a failing store ------------------------------- */

static int64_t stored_locked_at(struct sluice_store_ops *ops, char policy[SLUICE_POLICY_NAME_MAX])
{
    struct sluice_lock_record rec;
    ops->load(ops->ctx, "cloud:x", &rec);
    memcpy(policy, rec.policy, SLUICE_POLICY_NAME_MAX);
    return rec.locked_at_s;
}

Test(discovery, a_saved_lock_records_when_it_was_locked_and_by_which_policy)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    lock_at_max(&n, &d, 8);
    char policy[SLUICE_POLICY_NAME_MAX];
    cr_assert_eq(stored_locked_at(&ops, policy), n.time.wall_ns / SEC);
    cr_assert_str_eq(policy, "discover");
    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);
}

/* A store whose every call fails. */
static int failing_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    (void)ctx, (void)node;
    memset(out, 0, sizeof *out);
    return SLUICE_EIO;
}

static int failing_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    (void)ctx, (void)node, (void)rec;
    return SLUICE_EIO;
}

static int failing_clear(void *ctx, const char *node)
{
    (void)ctx, (void)node;
    return SLUICE_EIO;
}

static int count_kind(const struct node *n, enum sluice_event_kind kind, enum sluice_cause cause)
{
    int count = 0;
    for (int i = 0; i < n->n_seen; i++)
        count += n->seen[i].kind == kind && n->seen[i].cause == cause;
    return count;
}

Test(discovery, store_failures_are_events_and_the_node_keeps_serving_from_memory)
{
    struct node n;
    node_init(&n);
    struct sluice_store_ops ops = {failing_load, failing_save, failing_clear, NULL, NULL};
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.store = &ops;
    lock_at_max(&n, &d, 8);
    cr_assert_eq(count_kind(&n, SLUICE_EVENT_STORE, SLUICE_CAUSE_STORE_ERROR), 2,
                 "the failed load at init and the failed save of the lock");
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED, "the lock holds in memory");
    cr_assert_eq(st.ceiling, 8);
    cr_assert_eq(sluice_discovery_clear(n.disc), SLUICE_OK, "a failed store clear is no error");
    cr_assert_eq(count_kind(&n, SLUICE_EVENT_STORE, SLUICE_CAUSE_STORE_ERROR), 3);
    cr_assert_eq(n.seen[n.n_seen - 1].kind, SLUICE_EVENT_STORE, "reported after the clear");
    cr_assert_eq(sluice_discovery_state(n.disc), SLUICE_DISCOVERY_PROBING);
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_STORE), "store");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_STORE_ERROR), "store_error");
    sluice_discovery_destroy(n.disc);
}

/* ---- restored locks are trusted within bounds ---------------------------------- */

static struct sluice_discovery_status restore_from(struct node *n, struct sluice_lock_record rec,
                                                   int64_t ttl_s)
{
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(n, &store, &ops);
    d.lock_ttl_s = ttl_s;
    cr_assert_eq(ops.save(ops.ctx, "cloud:x", &rec), SLUICE_OK);
    node_create(n, &d);
    struct sluice_discovery_status st = status_of(n);
    sluice_discovery_destroy(n->disc);
    sluice_memstore_destroy(store);
    return st;
}

Test(discovery, a_restored_lock_never_outlives_lock_ttl_from_now)
{
    struct node n;
    int64_t now_s = 1700000000; /* node_init's wall clock */
    struct sluice_lock_record rec = {.ceiling = 52,
                                     .expires_s = now_s + 10 * 365 * 86400,
                                     .locked_at_s = now_s - 60};
    struct sluice_discovery_status st = restore_from(&n, rec, 3600);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.ceiling, 52);
    cr_assert_eq(st.lock_expires_s, now_s + 3600, "expiry cut to now + lock_ttl_s");
    cr_assert_eq(n.n_seen, 2);
    cr_assert_eq(n.seen[0].kind, SLUICE_EVENT_STORE);
    cr_assert_eq(n.seen[0].cause, SLUICE_CAUSE_EXPIRY_CAPPED);
    cr_assert_eq(n.seen[1].kind, SLUICE_EVENT_RESTORE);
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_EXPIRY_CAPPED), "expiry_capped");

    /* Within the TTL: restored as stored, one event. */
    rec.expires_s = now_s + 600;
    st = restore_from(&n, rec, 3600);
    cr_assert_eq(st.lock_expires_s, now_s + 600);
    cr_assert_eq(n.n_seen, 1);
}

Test(discovery, a_stored_lock_from_the_future_or_expiring_before_it_was_locked_is_dropped)
{
    struct node n;
    int64_t now_s = 1700000000;
    struct sluice_lock_record cases[] = {
        {.ceiling = 52, .expires_s = now_s + 7200, .locked_at_s = now_s + 3600},
        {.ceiling = 52, .expires_s = now_s + 100, .locked_at_s = now_s + 200},
        {.ceiling = 52, .expires_s = now_s + 100, .locked_at_s = now_s + 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sluice_discovery_status st = restore_from(&n, cases[i], 86400);
        cr_expect_eq(st.state, SLUICE_DISCOVERY_PROBING, "case %zu restored", i);
        cr_expect_eq(st.ceiling, 0, "case %zu", i);
        cr_expect_eq(st.limit, 5, "case %zu: not at the jumpstart", i);
        cr_assert_eq(n.n_seen, 1, "case %zu", i);
        cr_expect_eq(n.seen[0].kind, SLUICE_EVENT_STORE, "case %zu", i);
        cr_expect_eq(n.seen[0].cause, SLUICE_CAUSE_INVALID_RECORD, "case %zu", i);
    }
    /* A minute of clock skew is tolerated. */
    struct sluice_lock_record skewed = {
        .ceiling = 52, .expires_s = now_s + 3600, .locked_at_s = now_s + SLUICE_DISCOVERY_SKEW_S};
    cr_assert_eq(restore_from(&n, skewed, 86400).ceiling, 52);
}

/* ---- what status views show ------------------------------------------------------ */

Test(discovery, a_lock_past_its_expiry_shows_as_probing_before_any_poll)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.lock_ttl_s = 600;
    lock_at_max(&n, &d, 8);
    cr_assert_eq(status_of(&n).state, SLUICE_DISCOVERY_LOCKED);
    advance(&n, 601 * SEC); /* idle: no sample, no poll */
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING);
    cr_assert_eq(st.ceiling, 0);
    cr_assert_eq(st.lock_expires_s, 0);
    cr_assert_eq(sluice_discovery_state(n.disc), SLUICE_DISCOVERY_PROBING);
    char line[128];
    sluice_status_line(line, sizeof line, &st);
    cr_assert_str_eq(line, "cloud:x 0/8 📈");
    /* The poll then records the expiry as an event. */
    sluice_discovery_poll(n.disc);
    cr_assert_eq(status_of(&n).last_event.kind, SLUICE_EVENT_EXPIRY);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, events_and_snapshots_count_in_flight_from_one_source)
{
    struct node n;
    node_start(&n, 10);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_gate_tryacquire(&n.gate), SLUICE_OK);
    cr_assert_eq(status_of(&n).in_flight, 3, "standalone: the gate's permits held");
    /* A pool counts calls started, not permits held (a call may hold a
     * permit while it waits out a Retry-After hold). */
    _Atomic(uint32_t) started = 2;
    sluice_discovery_count_in_flight(n.disc, &started);
    cr_assert_eq(status_of(&n).in_flight, 2);
    advance(&n, SEC);
    feed(&n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(n.n_seen, 1);
    cr_assert_eq(n.seen[0].in_flight, 2, "the event counts like the snapshot");
    sluice_discovery_destroy(n.disc);
}

Test(discovery, clear_keeps_a_live_retry_after_hold)
{
    struct node n;
    node_start(&n, 10);
    advance(&n, SEC);
    int64_t now = n.time.mono_ns;
    feed(&n, SEC / 10, 10, SLUICE_OUTCOME_OVERLOAD, 5 * SEC);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), now + 5 * SEC);
    cr_assert_eq(sluice_discovery_clear(n.disc), SLUICE_OK);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), now + 5 * SEC,
                 "the provider's Retry-After outlives a clear");
    cr_assert_eq(sluice_discovery_limit(n.disc), 10, "the clear itself happened: 9 -> jumpstart");
    sluice_discovery_destroy(n.disc);
}

/* ---- every node owns its policy state -------------------------------------------- */

struct two_nodes {
    struct sluice_gate gates[2];
    struct sluice_discovery *disc[2];
};

static void *sample_node(void *arg)
{
    struct sluice_discovery *d = (struct sluice_discovery *)arg;
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < SCALED(20000); i++) {
        uint64_t r = test_rand(&seed);
        struct sluice_sample s = {(int64_t)(r % 100000), 4,
                                  r % 20 == 0 ? SLUICE_OUTCOME_OVERLOAD : SLUICE_OUTCOME_OK, 0, 0, 0};
        sluice_discovery_on_sample(d, &s);
        if (r % 500 == 1)
            sluice_discovery_clear(d);
    }
    return NULL;
}

Test(discovery, nodes_built_from_one_description_share_no_policy_state)
{
    struct sluice_policy_discover proto;
    struct sluice_policy_discover_params params = {.min_samples = 2};
    cr_assert_eq(sluice_policy_discover_init(&proto, &params, NULL, 0), SLUICE_OK);
    struct sluice_policy_discover pristine = proto;
    struct two_nodes t;
    struct sluice_discovery_desc d;
    memset(&d, 0, sizeof d);
    d.node_id = "cloud:shared";
    d.policy = &proto.base;
    d.window_min_ns = 1;
    d.window_max_ns = SLUICE_NS_PER_MS;
    for (int i = 0; i < 2; i++) {
        sluice_gate_init(&t.gates[i], 1);
        d.gate = &t.gates[i];
        cr_assert_eq(sluice_discovery_create(&d, &t.disc[i]), SLUICE_OK);
    }
    /* Concurrent samples and clears on both nodes: under TSan, any policy
     * state they shared would be a data race in the policy update. */
    pthread_t tids[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&tids[i], NULL, sample_node, t.disc[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(tids[i], NULL);
    cr_assert_eq(memcmp(&proto, &pristine, sizeof proto), 0, "the prototype was written to");

    /* Node 0 leaves slow start on an overload; clearing node 1 must not put it back. */
    struct sluice_sample overload = {0, 4, SLUICE_OUTCOME_OVERLOAD, 0, 0, 0};
    sluice_discovery_clear(t.disc[0]);
    sluice_discovery_on_sample(t.disc[0], &overload);
    const struct sluice_policy_discover *own =
        (const struct sluice_policy_discover *)sluice__discovery_policy(t.disc[0]);
    cr_assert_not(own->slow_start, "node 0 is out of slow start");
    unsigned char before[sizeof proto];
    memcpy(before, own, sizeof before);
    cr_assert_eq(sluice_discovery_clear(t.disc[1]), SLUICE_OK);
    cr_assert_eq(memcmp(before, own, sizeof before), 0, "clearing node 1 changed node 0's policy");
    cr_assert_not(own->slow_start);
    for (int i = 0; i < 2; i++)
        sluice_discovery_destroy(t.disc[i]);
}

Test(discovery, a_policy_prototype_must_be_initialised_and_fit_the_node)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    struct sluice_discovery *disc = NULL;
    char why[256] = "";
    d.error = why;
    d.error_size = sizeof why;
    struct sluice_policy_discover never; /* sluice_policy_discover_init never called */
    memset(&never, 0, sizeof never);
    d.policy = &never.base;
    cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_EINVAL);
    cr_assert_not_null(strstr(why, "sluice_discovery_desc.policy was never initialised"), "%s", why);
    cr_assert_null(disc);

    struct sluice_policy_discover big;
    sluice_policy_discover_init(&big, NULL, NULL, 0);
    struct sluice_policy_ops ops = *big.base.ops;
    struct sluice_policy *proto = &big.base;
    proto->ops = &ops;
    d.policy = proto;
    size_t sizes[] = {0, SLUICE_POLICY_STATE_MAX + 1};
    for (size_t i = 0; i < 2; i++) {
        ops.size = sizes[i];
        why[0] = '\0';
        cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_EINVAL, "size %zu", sizes[i]);
        cr_assert_not_null(strstr(why, "sluice_discovery_desc.policy->ops->size"), "%s", why);
    }
    ops.size = sizeof big;
    cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_OK);
    cr_assert_str_empty(why, "success empties the message");
    sluice_discovery_destroy(disc);
}

/* ---- refusals that name another cause, and the provider's hint ------------------ */

/* Events of `kind` (and `cause`) the callback saw. */
static int seen_events(const struct node *n, enum sluice_event_kind kind, enum sluice_cause cause)
{
    int count = 0;
    for (int i = 0; i < n->n_seen; i++)
        count += n->seen[i].kind == kind && n->seen[i].cause == cause;
    return count;
}

/* A node locked at 8 (no store), its events forgotten. */
static void locked_at_8(struct node *n)
{
    node_init(n);
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    lock_at_max(n, &d, 8);
    cr_assert_eq(sluice_discovery_state(n->disc), SLUICE_DISCOVERY_LOCKED);
    n->n_seen = 0;
}

Test(discovery, a_quota_refusal_moves_neither_the_limit_nor_the_lock_and_says_so)
{
    struct node n;
    locked_at_8(&n);
    advance(&n, SEC);
    for (int i = 0; i < 20; i++)
        feed(&n, SEC / 100, 8, SLUICE_OUTCOME_QUOTA, 5 * SEC);
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.limit, 8, "a quota refusal is not an overload");
    cr_assert_eq(st.ceiling, 8, "nor evidence against the lock");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_leq(sluice_discovery_hold_until(n.disc), n.time.mono_ns,
                  "waiting does not help a quota refusal: no hold, whatever it asked");
    cr_assert_geq(seen_events(&n, SLUICE_EVENT_QUOTA, SLUICE_CAUSE_QUOTA), 1,
                  "the node says it was a quota refusal");
    /* Windows full of quota refusals keep the lock too. */
    for (int i = 0; i < 5; i++) {
        advance(&n, SEC);
        for (int k = 0; k < 16; k++)
            feed(&n, SEC / 100, 8, SLUICE_OUTCOME_QUOTA, 0);
        advance(&n, 60 * SEC);
        sluice_discovery_poll(n.disc);
    }
    cr_assert_eq(sluice_discovery_limit(n.disc), 8);
    cr_assert_eq(status_of(&n).ceiling, 8);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, quota_refusals_while_probing_open_no_bracket)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.max_limit = 16;
    node_create(&n, &d);
    advance(&n, SEC);
    feed(&n, SEC / 100, 5, SLUICE_OUTCOME_QUOTA, 0);
    cr_assert_eq(sluice_discovery_limit(n.disc), 5, "no cut");
    /* With no bracket the node grows on to max_limit and locks there. */
    for (int i = 0; i < 12 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).ceiling, 16, "the quota refusal left no bracket below max_limit");
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_platform_overload_burst_under_a_lock_holds_briefly_and_keeps_the_ceiling)
{
    struct node n;
    locked_at_8(&n);
    advance(&n, SEC);
    int64_t at = n.time.mono_ns;
    for (int i = 0; i < 30; i++)
        feed(&n, SEC / 100, 8, SLUICE_OUTCOME_PLATFORM, 0);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), at + SLUICE_PLATFORM_HOLD_NS,
                 "no Retry-After: the platform hold");
    struct sluice_discovery_status st = status_of(&n);
    cr_assert_eq(st.limit, 8, "a platform-wide overload is not about this caller's cap");
    cr_assert_eq(st.ceiling, 8);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HOLD, SLUICE_CAUSE_PLATFORM), 1,
                 "one hold event for the burst");
    /* A named Retry-After is honoured instead; the lock still stands after it. */
    advance(&n, 2 * SEC);
    feed(&n, SEC / 100, 8, SLUICE_OUTCOME_PLATFORM, 3 * SEC);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), n.time.mono_ns + 3 * SEC);
    for (int i = 0; i < 4; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).ceiling, 8);
    cr_assert_eq(sluice_discovery_limit(n.disc), 8);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_rate_limit_with_a_named_reset_holds_until_it_instead_of_cutting)
{
    struct node n;
    node_start(&n, 10);
    advance(&n, SEC);
    int64_t at = n.time.mono_ns;
    for (int i = 0; i < 10; i++)
        feed(&n, SEC / 1000, 10, SLUICE_OUTCOME_RATE, 800 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_discovery_limit(n.disc), 10, "a hold, not a series of cuts");
    cr_assert_eq(sluice_discovery_hold_until(n.disc), at + 800 * SLUICE_NS_PER_MS,
                 "held until the reset the provider named");
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HOLD, SLUICE_CAUSE_RATE_LIMIT), 1);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_BACKOFF, SLUICE_CAUSE_RETRY_AFTER), 0);
    /* The same refusals read as overloads do cut: the difference is the outcome. */
    feed(&n, SEC / 1000, 10, SLUICE_OUTCOME_OVERLOAD, 800 * SLUICE_NS_PER_MS);
    cr_assert_lt(sluice_discovery_limit(n.disc), 10);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_spent_request_budget_on_a_success_paces_new_calls_until_its_reset)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    node_create(&n, &d);
    advance(&n, SEC);
    feed(&n, SEC / 10, 5, SLUICE_OUTCOME_OK, 0);
    cr_assert_leq(sluice_discovery_hold_until(n.disc), n.time.mono_ns, "an OK alone holds nothing");
    feed(&n, SEC / 10, 5, SLUICE_OUTCOME_OK, 2 * SEC);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), n.time.mono_ns + 2 * SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 5);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HOLD, SLUICE_CAUSE_RATE_LIMIT), 1);
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_stated_rate_moves_a_fresh_node_to_rate_times_latency_and_locks_there)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.max_limit = 64;
    node_create(&n, &d);
    /* The offering calls took 700 to 900 ms: 0.9 x 10/s x 0.8 s = 7, once four came. */
    static const int64_t took_ms[] = {700, 900, 750, 850};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(sluice_discovery_limit(n.disc), 5, "not yet: %d offers", i);
        cr_assert(sluice_discovery_hint_rate(n.disc, 10.0, took_ms[i] * SLUICE_NS_PER_MS,
                                             SLUICE_CAUSE_PROVIDER_RATE));
    }
    cr_assert_eq(sluice_discovery_limit(n.disc), 7, "from the offering calls' mean");
    cr_assert_not(sluice_discovery_hint_rate(n.disc, 20.0, SEC, SLUICE_CAUSE_PROVIDER_RATE),
                  "one hint per node");
    /* The next window measures 1 s calls: refined once. */
    run_window(&n, 16, SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 9,
                 "10 calls a second x 1 s = 10 at once, of which SLUICE_DISCOVERY_HINT_SHARE");
    cr_assert_eq(sluice_gate_limit(&n.gate), 9);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HINT, SLUICE_CAUSE_PROVIDER_RATE), 2,
                 "the start and its refinement");
    const struct sluice_event *first = NULL, *last = NULL;
    for (int i = 0; i < n.n_seen; i++)
        if (n.seen[i].kind == SLUICE_EVENT_HINT) {
            first = first ? first : &n.seen[i];
            last = &n.seen[i];
        }
    cr_assert_eq(first->old_limit, 5);
    cr_assert_eq(first->new_limit, 7);
    cr_assert_eq(last->new_limit, 9);
    /* Probing past it only runs the budget dry: bracketed, it locks there. */
    for (int i = 0; i < 8 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).ceiling, 9);
    /* After a clear a new rate applies, clamped to max_limit (<= active). */
    sluice_discovery_clear(n.disc);
    for (int i = 0; i < 4; i++)
        sluice_discovery_hint_rate(n.disc, 1000.0, SEC, SLUICE_CAUSE_PROVIDER_RATE);
    cr_assert_eq(sluice_discovery_limit(n.disc), 64, "never above max_limit");
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_lock_or_a_bracket_wins_over_a_hint)
{
    struct node n;
    struct sluice_memstore *store;
    struct sluice_store_ops ops;
    struct sluice_discovery_desc d = node_with_memstore(&n, &store, &ops);
    struct sluice_lock_record rec = {.ceiling = 7, .expires_s = n.time.wall_ns / SEC + 3600};
    ops.save(ops.ctx, "cloud:x", &rec);
    node_create(&n, &d);
    cr_assert_not(sluice_discovery_hint_rate(n.disc, 20.0, SEC, SLUICE_CAUSE_PROVIDER_RATE));
    run_window(&n, 16, SEC);
    cr_assert_eq(sluice_discovery_limit(n.disc), 7, "the restored lock wins");
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HINT, SLUICE_CAUSE_PROVIDER_RATE), 0);
    sluice_discovery_destroy(n.disc);
    sluice_memstore_destroy(store);

    node_init(&n);
    struct sluice_discovery_desc fresh = node_desc(&n, "cloud:y");
    node_create(&n, &fresh);
    advance(&n, SEC);
    feed(&n, SEC / 1000, 5, SLUICE_OUTCOME_OVERLOAD, 0);
    uint32_t cut = sluice_discovery_limit(n.disc);
    cr_assert_not(sluice_discovery_hint_rate(n.disc, 20.0, SEC, SLUICE_CAUSE_PROVIDER_RATE),
                  "a refusal's bracket is evidence; the hint (20 x 1 s) is a guess");
    cr_assert_eq(sluice_discovery_limit(n.disc), cut);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_HINT, SLUICE_CAUSE_PROVIDER_RATE), 0);
    sluice_discovery_destroy(n.disc);

    /* A refusal between the hint and its refinement keeps the refusal's bracket. */
    node_init(&n);
    struct sluice_discovery_desc again = node_desc(&n, "cloud:z");
    node_create(&n, &again);
    for (int i = 0; i < 4; i++)
        cr_assert(sluice_discovery_hint_rate(n.disc, 20.0, SEC, SLUICE_CAUSE_PROVIDER_RATE));
    cr_assert_eq(sluice_discovery_limit(n.disc), 18);
    advance(&n, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 12, SLUICE_OUTCOME_RATE);
    run_window(&n, 16, 2 * SEC); /* would refine to 0.9 x 20 x 2 = 36 */
    cr_assert_leq(sluice_discovery_limit(n.disc), 11, "the rate refused at 12");
    sluice_discovery_destroy(n.disc);
}

Test(discovery, a_rate_refusal_brackets_where_it_struck_and_a_repeated_one_lowers_a_lock_by_one)
{
    struct node n;
    node_start(&n, 12);
    advance(&n, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 12, SLUICE_OUTCOME_RATE);
    cr_assert_eq(sluice_discovery_limit(n.disc), 11, "one step under where it struck, no x0.9");
    for (int i = 0; i < 8 && sluice_discovery_state(n.disc) != SLUICE_DISCOVERY_LOCKED; i++)
        run_window(&n, 16, SEC);
    cr_assert_eq(status_of(&n).ceiling, 11, "the probe never went back past the rate");
    /* At the lock one rate refusal is forgiven; a second soon after lowers it by one. */
    advance(&n, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 11, SLUICE_OUTCOME_RATE);
    cr_assert_eq(sluice_discovery_limit(n.disc), 11);
    cr_assert_eq(status_of(&n).ceiling, 11);
    advance(&n, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 11, SLUICE_OUTCOME_RATE);
    cr_assert_eq(status_of(&n).ceiling, 10, "the lock overdrew the rate");
    cr_assert_eq(sluice_discovery_limit(n.disc), 10);
    cr_assert_eq(seen_events(&n, SLUICE_EVENT_LOCK, SLUICE_CAUSE_RATE_LIMIT), 1);
    /* One refusal a while later (after the forgiveness run) is forgiven again. */
    for (int i = 0; i < SLUICE_DISCOVERY_FORGIVE + 1; i++)
        run_window(&n, 16, SEC);
    feed_started(&n, n.time.mono_ns - SEC / 10, 10, SLUICE_OUTCOME_RATE);
    cr_assert_eq(status_of(&n).ceiling, 10);
    sluice_discovery_destroy(n.disc);
}
