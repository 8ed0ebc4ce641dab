/*
 * provider_signals.c — what a provider says, heard over loopback: the
 * simulator speaks a provider's dialect (--dialect), the blocking call
 * classifies its headers and error bodies, and discovery acts on the kind.
 * One test per rule: a quota refusal moves neither the limit nor the lock;
 * a burst of Anthropic 529s under a lock keeps the lock; a rate-limit 429
 * that names its reset holds new calls instead of cutting the limit.
 */
#include "e2e/curl_fixture.h"

#include <math.h>

#include <sluice/store.h>

#define SIGNAL_TEST(name)                                                                          \
    Test(provider_signals, name, .init = fx_setup, .fini = fx_teardown, .timeout = 30)

#define LOCKED_AT 6u

/* Closed-loop callers for a while, tallying the kinds that came back. */
struct tally {
    struct sluice_engine *engine;
    enum sluice_curl_dialect dialect; /* the backend's, as its caller sets it */
    int64_t until_ms;
    long calls, by_kind[16];
    int64_t slowest_ns; /* the longest successful transfer */
};

static void *caller_main(void *arg)
{
    struct tally *t = (struct tally *)arg;
    CURL *easy = fx_easy();
    struct sluice_curl_call call = {.backend = FX_BACKEND,
                                    .easy = easy,
                                    .dialect = t->dialect,
                                    .write = fx_discard}; /* declared: error bodies are read */
    while (fx_now_ms() < t->until_ms) {
        struct sluice_curl_result r;
        if (sluice_curl_perform_call(t->engine, &call, &r) == SLUICE_OK) {
            t->calls++;
            t->by_kind[r.kind < 16 ? r.kind : 15]++;
            if (r.kind == SLUICE_CURL_SUCCESS && r.transfer_ns > t->slowest_ns)
                t->slowest_ns = r.transfer_ns;
        }
    }
    curl_easy_cleanup(easy);
    return NULL;
}

/* `n` callers for `ms` (reading the dialect sum->dialect names); their kinds summed
 * into *sum. */
static void run_callers(struct sluice_engine *e, int n, int ms, struct tally *sum)
{
    enum sluice_curl_dialect dialect = sum->dialect;
    struct tally t[16];
    pthread_t tid[16];
    memset(sum, 0, sizeof *sum);
    sum->dialect = dialect;
    for (int i = 0; i < n; i++) {
        t[i] = (struct tally){.engine = e, .dialect = dialect, .until_ms = fx_now_ms() + ms};
        pthread_create(&tid[i], NULL, caller_main, &t[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(tid[i], NULL);
        sum->calls += t[i].calls;
        for (int k = 0; k < 16; k++)
            sum->by_kind[k] += t[i].by_kind[k];
        if (t[i].slowest_ns > sum->slowest_ns)
            sum->slowest_ns = t[i].slowest_ns;
    }
}

/* Events of the backend's node with `kind` (and `cause`, unless NONE). */
static int events_of(struct sluice_engine *e, enum sluice_event_kind kind, enum sluice_cause cause)
{
    const struct sluice_event_ring *ring =
        sluice_discovery_events(sluice_pool_discovery(sluice_engine_pool(e, FX_BACKEND)));
    struct sluice_event ev[64];
    uint64_t cursor = 0;
    int count = 0;
    size_t n;
    while ((n = sluice_event_ring_read(ring, &cursor, ev, 64, NULL)) > 0)
        for (size_t i = 0; i < n; i++)
            count += ev[i].kind == kind && (cause == SLUICE_CAUSE_NONE || ev[i].cause == cause);
    return count;
}

static struct sluice_memstore *mem;

/* An adaptive backend (active 16) whose node restores a lock at LOCKED_AT. */
static struct sluice_engine *locked_engine(void)
{
    cr_assert_eq(sluice_memstore_create(4, NULL, &mem), SLUICE_OK);
    static struct sluice_store_ops ops;
    ops = sluice_memstore_ops(mem);
    int64_t now_s = (int64_t)time(NULL);
    struct sluice_lock_record rec = {
        .ceiling = LOCKED_AT, .expires_s = now_s + 3600, .locked_at_s = now_s};
    cr_assert_eq(ops.save(ops.ctx, FX_BACKEND, &rec), SLUICE_OK);
    static struct sluice_discovery_desc dd;
    dd = fx_discovery();
    dd.store = &ops;
    struct sluice_engine *e = fx_engine(16, -1, &dd);
    cr_assert_eq(fx_status(e).state, SLUICE_DISCOVERY_LOCKED, "the lock was restored");
    return e;
}

static void done_with(struct sluice_engine *e)
{
    sluice_engine_destroy(e);
    sluice_memstore_destroy(mem);
}

SIGNAL_TEST(quota_refusals_leave_the_lock_and_the_caller_tells_them_from_a_429)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 10,
                                   .dialect = "openai", .quota_at = "0s:60000"});
    struct sluice_engine *e = locked_engine();
    struct tally sum = {.dialect = SLUICE_CURL_DIALECT_AUTO};
    run_callers(e, 8, 1500, &sum);
    cr_assert_gt(sum.calls, 20, "the callers ran");
    cr_assert_eq(sum.by_kind[SLUICE_CURL_QUOTA], sum.calls,
                 "every 429 insufficient_quota is QUOTA, not OVERLOADED (%ld of %ld)",
                 sum.by_kind[SLUICE_CURL_QUOTA], sum.calls);
    struct sluice_discovery_status st = fx_status(e);
    cr_assert_eq(st.ceiling, LOCKED_AT, "the lock did not move");
    cr_assert_eq(st.limit, LOCKED_AT, "nor the limit");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_gt(events_of(e, SLUICE_EVENT_QUOTA, SLUICE_CAUSE_QUOTA), 0, "the node said so");
    cr_assert_eq(events_of(e, SLUICE_EVENT_BACKOFF, SLUICE_CAUSE_NONE), 0, "no backoff");
    done_with(e);
}

SIGNAL_TEST(a_burst_of_anthropic_529s_under_a_lock_keeps_the_lock)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 10,
                                   .dialect = "anthropic", .platform_at = "500ms:600"});
    struct sluice_engine *e = locked_engine();
    struct tally sum = {.dialect = SLUICE_CURL_DIALECT_AUTO};
    run_callers(e, 8, 2500, &sum);
    cr_assert_gt(sum.by_kind[SLUICE_CURL_PLATFORM_OVERLOAD], 0, "the burst of 529s came");
    cr_assert_gt(sum.by_kind[SLUICE_CURL_SUCCESS], 0, "and calls were served around it");
    struct sluice_discovery_status st = fx_status(e);
    cr_assert_eq(st.ceiling, LOCKED_AT, "a platform overload never lowers a locked ceiling");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(events_of(e, SLUICE_EVENT_LOCK, SLUICE_CAUSE_LOWERED), 0);
    cr_assert_gt(events_of(e, SLUICE_EVENT_HOLD, SLUICE_CAUSE_PLATFORM), 0, "a short hold");
    done_with(e);
}

SIGNAL_TEST(a_rate_limit_429_that_names_its_reset_holds_instead_of_cutting)
{
    fx_start(&(struct fx_provider){.mode = "rate", .median_ms = 10, .rate = 40, .rate_window = 1,
                                   .dialect = "openai"});
    struct sluice_discovery_desc dd = fx_discovery();
    dd.jumpstart = 8;
    struct sluice_engine *e = fx_engine(16, -1, &dd);
    struct tally sum = {.dialect = SLUICE_CURL_DIALECT_AUTO};
    run_callers(e, 8, 2500, &sum);
    cr_assert_gt(sum.calls, 40, "the callers ran");
    cr_assert_eq(sum.by_kind[SLUICE_CURL_OVERLOADED], 0,
                 "a 429 naming a spent budget and its reset is a rate limit, not the cap");
    cr_assert_gt(events_of(e, SLUICE_EVENT_HOLD, SLUICE_CAUSE_RATE_LIMIT), 0,
                 "new calls were held until the reset");
    cr_assert_eq(events_of(e, SLUICE_EVENT_BACKOFF, SLUICE_CAUSE_OVERLOAD) +
                     events_of(e, SLUICE_EVENT_BACKOFF, SLUICE_CAUSE_RETRY_AFTER),
                 0, "no cut for the provider's rate");
    sluice_engine_destroy(e);
}

SIGNAL_TEST(a_stated_request_rate_moves_the_jumpstart_to_rate_times_latency)
{
    /* 200 calls a second (stated as 12000 a minute), each taking 50 ms: 10 in service, of
     * which the hint takes SLUICE_DISCOVERY_HINT_SHARE, once a window measured them. */
    fx_start(&(struct fx_provider){.mode = "rate", .median_ms = 50, .fixed_latency = true,
                                   .rate = 200, .dialect = "openai"});
    struct sluice_discovery_desc dd = fx_discovery();
    struct sluice_engine *e = fx_engine(16, -1, &dd);
    cr_assert_eq(fx_status(e).limit, 5, "the default jumpstart first");
    struct tally sum = {.dialect = SLUICE_CURL_DIALECT_OPENAI}; /* AUTO cannot tell per minute */
    run_callers(e, 12, 3000, &sum);
    const struct sluice_event_ring *ring =
        sluice_discovery_events(sluice_pool_discovery(sluice_engine_pool(e, FX_BACKEND)));
    struct sluice_event ev[64];
    uint64_t cursor = 0;
    size_t n = sluice_event_ring_read(ring, &cursor, ev, 64, NULL);
    cr_assert_gt(n, 0, "an event");
    cr_assert_eq(ev[0].kind, SLUICE_EVENT_HINT, "the first event is the hint");
    cr_assert_eq(ev[0].cause, SLUICE_CAUSE_PROVIDER_RATE);
    cr_assert_eq(ev[0].old_limit, 5);
    /* The calls took 50 ms at least (the simulator's service time) and, on a loaded
     * machine, up to the slowest one seen. */
    double most = floor(0.9 * 200 * (double)sum.slowest_ns / SLUICE_NS_PER_SEC);
    cr_assert(ev[0].new_limit >= 8 && ev[0].new_limit <= most,
              "0.9 x 200/s x [50 ms, the slowest call] = [9, %.0f] (8 for rounding), got %u", most,
              ev[0].new_limit);
    int hints = events_of(e, SLUICE_EVENT_HINT, SLUICE_CAUSE_NONE);
    cr_assert(hints == 1 || hints == 2, "the start and at most one refinement, got %d", hints);
    sluice_engine_destroy(e);
}
