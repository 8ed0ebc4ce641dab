/*
 * curl_perform.c — the blocking call (sluice_curl_perform) against the HTTP
 * provider simulator: discovery of a hidden cap from live 429s, Retry-After
 * holds, cancel and deadline mid-transfer, admission, transport errors,
 * keep-alive, the caller's own progress callback, and an error body the
 * caller pauses.
 */
#include "e2e/curl_fixture.h"
#include "e2e/curl_loopback.h"

#define PERFORM_TEST(name)                                                                         \
    Test(curl_perform, name, .init = fx_setup, .fini = fx_teardown, .timeout = 30)

/* ---- discovery from closed-loop callers ---------------------------------------------- */

struct worker {
    struct sluice_engine *engine;
    _Atomic(bool) *stop;
    long calls, overloads, failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    CURL *easy = fx_easy();
    while (!atomic_load(w->stop)) {
        struct sluice_curl_result r;
        int status = sluice_curl_perform(w->engine, FX_BACKEND, easy, NULL, NULL, &r);
        w->calls++;
        if (status != SLUICE_OK)
            w->failures++;
        else if (r.kind == SLUICE_CURL_OVERLOADED)
            w->overloads++;
    }
    curl_easy_cleanup(easy);
    return NULL;
}

PERFORM_TEST(reject_mode_cap_24_is_discovered_with_at_most_2_percent_429s)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 24,
                                   .median_ms = FX_DISCOVERY_MEDIAN_MS});
    struct sluice_discovery_desc dd = fx_discovery();
    struct sluice_engine *e = fx_engine(64, -1, &dd);
    enum { N = 2 * 24 + 8 };
    _Atomic(bool) stop = false;
    struct worker w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        w[i] = (struct worker){.engine = e, .stop = &stop};
        pthread_create(&t[i], NULL, worker_main, &w[i]);
    }
    /* Discovery, then 3 s of steady state at the lock: the share is over the whole run. */
    int64_t until = fx_now_ms() + 20000, locked_at = 0;
    long rejected_at_lock = 0;
    while (fx_now_ms() < until && (!locked_at || fx_now_ms() < locked_at + 3000)) {
        if (!locked_at && fx_status(e).state == SLUICE_DISCOVERY_LOCKED) {
            locked_at = fx_now_ms();
            rejected_at_lock = fx_stats().rejected;
        }
        fx_sleep_ms(10);
    }
    atomic_store(&stop, true);
    long calls = 0, overloads = 0, failures = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        calls += w[i].calls;
        overloads += w[i].overloads;
        failures += w[i].failures;
    }
    struct sluice_discovery_status st = fx_status(e);
    double share = (double)overloads / (double)(calls ? calls : 1);
    char path[2048];
    fx_event_path(e, path, sizeof path);
    fprintf(stderr,
            "curl_perform discovery: %s ceiling %u limit %u after %.2f s; %ld calls, 429 share "
            "%.4f (%ld of %ld 429s before the lock); path:%s\n",
            sluice_discovery_state_name(st.state), st.ceiling, st.limit,
            locked_at ? (double)(locked_at - (until - 20000)) / 1000.0 : -1.0, calls, share,
            rejected_at_lock, overloads, path);
    cr_assert_eq(failures, 0, "%ld calls failed", failures);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED, "not locked after 20 s: %s",
                 sluice_discovery_state_name(st.state));
    cr_assert(st.ceiling >= 0.85 * 24 && st.ceiling <= 24, "locked ceiling %u outside [0.85C, C]",
              st.ceiling);
    cr_assert_leq(share, 0.02, "429 share %.4f above 2%%", share);
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.rejected, overloads, "the simulator's 429s are the ones classified overload");
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- Retry-After ------------------------------------------------------------------------- */

struct bg_call {
    struct sluice_engine *engine;
    CURL *easy;
    const struct timespec *deadline;
    struct sluice_cancel *cancel;
    struct sluice_curl_result r;
    int status;
    int64_t returned_ns;
    pthread_t thread;
};

static void *bg_main(void *arg)
{
    struct bg_call *c = (struct bg_call *)arg;
    c->status = sluice_curl_perform(c->engine, FX_BACKEND, c->easy, c->deadline, c->cancel, &c->r);
    c->returned_ns = sluice_monotonic_ns();
    return NULL;
}

static void bg_start(struct bg_call *c, struct sluice_engine *e, const struct timespec *deadline,
                     struct sluice_cancel *cancel)
{
    *c = (struct bg_call){.engine = e, .easy = fx_easy(), .deadline = deadline, .cancel = cancel};
    pthread_create(&c->thread, NULL, bg_main, c);
}

static void bg_join(struct bg_call *c)
{
    pthread_join(c->thread, NULL);
    curl_easy_cleanup(c->easy);
}

/* Wait (bounded) until the simulator has `n` calls in flight. */
static void wait_in_flight(long n)
{
    int64_t until = fx_now_ms() + 5000;
    while (fx_stats().in_flight < n)
        cr_assert_lt(fx_now_ms(), until, "the simulator never saw %ld calls in flight", n);
}

PERFORM_TEST(no_request_goes_out_while_a_retry_after_hold_lasts)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 1, .median_ms = 400,
                                   .fixed_latency = true, .retry_after = 1});
    struct sluice_discovery_desc dd = fx_discovery();
    dd.jumpstart = 4;
    struct sluice_engine *e = fx_engine(4, -1, &dd);
    struct bg_call busy;
    bg_start(&busy, e, NULL, NULL); /* holds the simulator's only slot for 400 ms */
    wait_in_flight(1);
    CURL *easy = fx_easy();
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_OK);
    int64_t refused_at = sluice_monotonic_ns();
    cr_assert_eq(r.http_status, 429);
    cr_assert_eq(r.kind, SLUICE_CURL_OVERLOADED);
    cr_assert_eq(r.retry_after_ns, SLUICE_NS_PER_SEC, "Retry-After: 1 read as %lld ns",
                 (long long)r.retry_after_ns);
    long before = fx_stats().requests;
    struct bg_call held;
    bg_start(&held, e, NULL, NULL);
    fx_sleep_ms(700); /* the busy call ends meanwhile: its permit must not start the held one */
    cr_assert_eq(fx_stats().requests, before, "a request went out during the hold");
    bg_join(&held);
    bg_join(&busy);
    cr_assert_eq(held.status, SLUICE_OK);
    cr_assert_eq(held.r.http_status, 200, "after the hold the cap is free again");
    cr_assert_geq(held.returned_ns - refused_at, 900 * SLUICE_NS_PER_MS,
                  "the held call ended %lld ms after the 429",
                  (long long)((held.returned_ns - refused_at) / SLUICE_NS_PER_MS));
    cr_assert_geq(held.r.queued_ns, 500 * SLUICE_NS_PER_MS, "the hold counts as queue wait");
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- cancel and deadline mid-transfer ----------------------------------------------------- */

/* The call would take 5 s: a cancel that returns in a fraction of that aborted it (how
 * fast is a matter for bench/, not for a test on a machine others keep busy). */
#define LONG_CALL_MS 5000
PERFORM_TEST(a_token_fired_mid_transfer_aborts_it_and_frees_the_provider_slot)
{
    /* --abandoned free: a provider that frees the slot when the client leaves. */
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = LONG_CALL_MS,
                                   .fixed_latency = true, .abandoned_free = true});
    struct sluice_engine *e = fx_engine(2, 0, NULL);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    struct bg_call c;
    bg_start(&c, e, NULL, &token);
    wait_in_flight(1);
    fx_sleep_ms(20);
    int64_t fired = sluice_monotonic_ns();
    sluice_cancel_fire(&token);
    bg_join(&c);
    int64_t took_ms = (c.returned_ns - fired) / SLUICE_NS_PER_MS;
    cr_assert_eq(c.status, SLUICE_ECANCELED, "status %s", sluice_status_name(c.status));
    cr_assert_eq(c.r.kind, SLUICE_CURL_ABORTED);
    cr_assert_eq(c.r.outcome, SLUICE_OUTCOME_IGNORE);
    cr_assert_lt(took_ms, LONG_CALL_MS / 2, "the cancel waited %lld ms: the transfer ran on",
                 (long long)took_ms);
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.cancelled, 1, "the simulator did not see the connection close");
    cr_assert_eq(s.in_flight, 0);
    fx_assert_idle(e);
    /* Capacity intact: both admissions and both permits are there to take again. */
    struct sluice_pool *p = sluice_engine_pool(e, FX_BACKEND);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_IGNORE, 0);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_IGNORE, 0);
    sluice_pool_leave(p);
    sluice_pool_leave(p);
    sluice_engine_destroy(e);
}

PERFORM_TEST(a_deadline_shorter_than_the_service_time_times_out_and_keeps_capacity)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 600,
                                   .fixed_latency = true});
    struct sluice_discovery_desc dd = fx_discovery();
    struct sluice_engine *e = fx_engine(8, -1, &dd);
    uint32_t limit = fx_status(e).limit;
    CURL *easy = fx_easy();
    struct timespec deadline;
    struct sluice_curl_result r;
    int64_t t0 = sluice_monotonic_ns();
    int status = sluice_curl_perform(
        e, FX_BACKEND, easy, sluice_deadline_in(&deadline, 100 * SLUICE_NS_PER_MS), NULL, &r);
    int64_t took_ms = (sluice_monotonic_ns() - t0) / SLUICE_NS_PER_MS;
    cr_assert_eq(status, SLUICE_ETIMEDOUT, "status %s", sluice_status_name(status));
    cr_assert_eq(r.kind, SLUICE_CURL_ABORTED);
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE, "the caller's deadline is not an overload");
    cr_assert(took_ms >= 95 && took_ms < 500, "returned after %lld ms", (long long)took_ms);
    cr_assert_eq(fx_stats_settled().cancelled, 1, "the simulator did not see the close");
    fx_assert_idle(e);
    cr_assert_eq(fx_status(e).limit, limit, "the limit moved");
    /* The same handle works again with time to spare: the deadline's timeout was undone. */
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_OK);
    cr_assert_eq(r.http_status, 200);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

PERFORM_TEST(a_deadline_that_passes_while_queued_never_starts_the_transfer)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 400,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    struct bg_call busy;
    bg_start(&busy, e, NULL, NULL);
    wait_in_flight(1);
    CURL *easy = fx_easy();
    struct timespec deadline;
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy,
                                     sluice_deadline_in(&deadline, 100 * SLUICE_NS_PER_MS), NULL,
                                     &r),
                 SLUICE_ETIMEDOUT);
    cr_assert_not(r.transferred);
    cr_assert_geq(r.queued_ns, 90 * SLUICE_NS_PER_MS);
    bg_join(&busy);
    cr_assert_eq(fx_stats_settled().requests, 1, "the queued call reached the simulator");
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

PERFORM_TEST(a_call_with_less_time_left_than_the_expected_service_never_starts_its_transfer)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 50});
    struct sluice_engine *e = fx_engine(2, -1, NULL);
    fx_teach_service(e, 10 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_MIN_SAMPLES);
    CURL *easy = fx_easy();
    struct timespec deadline;
    struct sluice_curl_result r;
    /* By default admission refuses it at once: 10 s of service cannot fit in 2 s. */
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy,
                                     sluice_deadline_in(&deadline, 2 * SLUICE_NS_PER_SEC), NULL,
                                     &r),
                 SLUICE_ELATE);
    cr_assert_not(r.transferred);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_CALL, "the refusal says which deadline");
    cr_assert(strstr(r.error, "refused at admission: the predicted wait leaves too little of the "
                              "deadline (allow more, or set the backend's deadlines.queue_late)"),
              "\"%s\"", r.error);
    struct timespec start;
    struct sluice_curl_call call = {.backend = FX_BACKEND, .easy = easy, .start_deadline = &start};
    sluice_deadline_in(&start, SLUICE_NS_PER_SEC);
    cr_assert_eq(sluice_curl_perform_call(e, &call, &r), SLUICE_ELATE);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_START);
    cr_assert(strstr(r.error, "too little of the start deadline"), "\"%s\"", r.error);
    cr_assert_eq(fx_counts(e).refused_early, 2);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
    /* With queue_late it is admitted, and the start rule is what stops it. */
    e = fx_engine_with(2, -1, NULL, &(struct sluice_deadline_desc){.queue_late = true});
    fx_teach_service(e, 10 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_MIN_SAMPLES);
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy,
                                     sluice_deadline_in(&deadline, 2 * SLUICE_NS_PER_SEC), NULL,
                                     &r),
                 SLUICE_ETIMEDOUT);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_CALL);
    cr_assert(r.refused_late);
    cr_assert_not(r.transferred);
    cr_assert_eq(fx_stats_settled().requests, 0, "the provider got the request");
    cr_assert_eq(fx_counts(e).refused_late, 1);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

PERFORM_TEST(a_transfer_abandoned_at_its_deadline_keeps_its_permit_until_the_provider_is_done)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 600,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(2, -1, NULL);
    /* Half the recent calls took 50 ms, half 2 s: a 400 ms deadline is worth starting (p10
     * 50 ms), and a call abandoned at 400 ms may run at the provider until 2 s (p90). */
    fx_teach_service(e, 50 * SLUICE_NS_PER_MS, SLUICE_SERVICE_SAMPLES / 2);
    fx_teach_service(e, 2 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_SAMPLES / 2);
    CURL *easy = fx_easy();
    struct timespec deadline;
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy,
                                     sluice_deadline_in(&deadline, 400 * SLUICE_NS_PER_MS),
                                     NULL, &r),
                 SLUICE_ETIMEDOUT);
    cr_assert(r.transferred);
    cr_assert(r.abandoned, "the request was sent, then abandoned");
    struct sluice_pool_counts c = fx_counts(e);
    cr_assert_eq(c.timeouts, 1);
    cr_assert_eq(c.lingering, 1);
    cr_assert_eq(c.in_flight, 1, "the provider still runs it");
    WAIT_UNTIL((sluice_engine_poll(e), fx_counts(e).lingering == 0));
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- admission, transport errors, keep-alive, the caller's callbacks ---------------------- */

PERFORM_TEST(a_full_pool_rejects_at_once_and_never_starts_the_transfer)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 300,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(1, 0, NULL);
    struct bg_call busy;
    bg_start(&busy, e, NULL, NULL);
    wait_in_flight(1);
    CURL *easy = fx_easy();
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_ECAPACITY);
    int64_t rejected = sluice_monotonic_ns();
    cr_assert_not(r.transferred);
    bg_join(&busy);
    cr_assert_lt(rejected, busy.returned_ns, "the rejection waited for the busy call to end");
    cr_assert_eq(fx_stats_settled().requests, 1);
    cr_assert_eq(sluice_curl_perform(e, "nobody", easy, NULL, NULL, &r), SLUICE_EINVAL);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* Bad arguments: SLUICE_EINVAL with result.error naming what to fix, before admission (the
 * pool keeps its whole capacity), and no transfer. */
PERFORM_TEST(bad_arguments_fail_with_einval_and_a_message_naming_what_to_fix)
{
    struct sluice_engine *e = fx_engine(1, 0, NULL);
    CURL *easy = fx_easy_url("http://127.0.0.1:1/");
    struct sluice_curl_result r;
    struct timespec denormal = {.tv_sec = 1, .tv_nsec = SLUICE_NS_PER_SEC};
    struct timespec negative = {.tv_sec = 1, .tv_nsec = -1};
    const struct {
        const char *backend;
        CURL *easy;
        const struct timespec *deadline;
        const char *expect;
    } cases[] = {
        {"nobody", easy, NULL,
         "backend \"nobody\" is not registered in the engine (register it in "
         "sluice_engine_desc.backends, or pass NULL for the endpoint-only backend)"},
        {FX_BACKEND, NULL, NULL, "easy is NULL"},
        {FX_BACKEND, easy, &denormal,
         "deadline is not normalised: tv_nsec = 1000000000 is outside [0, 999999999]"},
        {FX_BACKEND, easy, &negative, "deadline is not normalised: tv_nsec = -1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&r, 0xA5, sizeof r);
        int status = sluice_curl_perform(e, cases[i].backend, cases[i].easy, cases[i].deadline,
                                         NULL, &r);
        cr_assert_eq(status, SLUICE_EINVAL, "case %zu: %s", i, sluice_status_name(status));
        cr_assert(strstr(r.error, cases[i].expect), "case %zu: \"%s\" lacks \"%s\"", i,
                  r.error, cases[i].expect);
        cr_assert_not(r.transferred);
        cr_assert_eq(fx_counts(e).admitted, 0, "case %zu kept an admission", i);
    }
    cr_assert_eq(sluice_curl_perform(NULL, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "engine is NULL"), "\"%s\"", r.error);
    /* A bad start deadline is named as the field the caller set, not as the deadline. */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const struct timespec *bad_starts[] = {&negative, &wall};
    const char *start_expect[] = {"start_deadline is not normalised: tv_nsec = -1",
                                  "start_deadline is "};
    for (size_t i = 0; i < 2; i++) {
        struct sluice_curl_call bad = {.backend = FX_BACKEND, .easy = easy,
                                       .start_deadline = bad_starts[i]};
        cr_assert_eq(sluice_curl_perform_call(e, &bad, &r), SLUICE_EINVAL);
        cr_assert(strstr(r.error, start_expect[i]) == r.error, "start case %zu: \"%s\"", i,
                  r.error);
    }
    /* The transfer alone (the chat client's path) says the same of a deadline. */
    struct sluice_curl_call call = {.easy = easy, .deadline = &denormal};
    cr_assert_eq(sluice_curl_transfer(&call, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "tv_nsec = 1000000000"), "\"%s\"", r.error);
    /* A good call has no message. */
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_EIO);
    cr_assert_str_empty(r.error);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

PERFORM_TEST(transport_errors_are_reported_and_do_not_move_the_limit)
{
    struct sluice_discovery_desc dd = fx_discovery();
    struct sluice_engine *e = fx_engine(16, -1, &dd);
    struct sluice_discovery_status before = fx_status(e);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", loopback_dead_port());
    CURL *easy = fx_easy_url(url);
    for (int i = 0; i < 40; i++) {
        struct sluice_curl_result r;
        cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_EIO);
        cr_assert_eq(r.kind, SLUICE_CURL_TRANSPORT);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
        cr_assert_eq(r.curl_code, CURLE_COULDNT_CONNECT, "curl said %s",
                     curl_easy_strerror(r.curl_code));
        cr_assert_eq(r.http_status, 0);
    }
    fx_sleep_ms(100); /* let any window close */
    sluice_engine_poll(e);
    struct sluice_discovery_status after = fx_status(e);
    cr_assert_eq(after.limit, before.limit, "limit %u -> %u", before.limit, after.limit);
    cr_assert_eq(after.state, SLUICE_DISCOVERY_PROBING);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

PERFORM_TEST(calls_on_one_thread_reuse_one_connection)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = FX_ZERO});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    long connects = 0;
    for (int i = 0; i < 5; i++) {
        CURL *easy = fx_easy(); /* a new handle each time: the connection lives in the multi */
        struct sluice_curl_result r;
        cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, NULL, NULL, &r), SLUICE_OK);
        cr_assert_eq(r.kind, SLUICE_CURL_SUCCESS);
        cr_assert_gt(r.latency_ns, 0);
        cr_assert_leq(r.latency_ns, r.transfer_ns, "time to first byte within the transfer");
        long n = 0;
        curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &n);
        connects += n;
        curl_easy_cleanup(easy);
    }
    cr_assert_eq(connects, 1, "%ld connections for 5 calls", connects);
    sluice_engine_destroy(e);
}

struct progress {
    int calls;
    int abort_after; /* 0 = never */
};

static int count_progress(void *clientp, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct progress *p = (struct progress *)clientp;
    p->calls++;
    return p->abort_after && p->calls >= p->abort_after;
}

PERFORM_TEST(the_callers_own_xferinfo_callback_keeps_working)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 100,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    CURL *easy = fx_easy();
    struct progress p = {0, 0};
    struct sluice_curl_call call = {
        .backend = FX_BACKEND, .easy = easy, .xferinfo = count_progress, .xferinfo_data = &p};
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform_call(e, &call, &r), SLUICE_OK);
    cr_assert_gt(p.calls, 0, "the chained callback never ran");
    /* Afterwards the handle carries the caller's callback, not sluice's. */
    int during = p.calls;
    cr_assert_eq(curl_easy_perform(easy), CURLE_OK);
    cr_assert_gt(p.calls, during, "the caller's callback was not left installed");
    /* Its non-zero return aborts the call, as a cancel. */
    p = (struct progress){0, 2};
    cr_assert_eq(sluice_curl_perform_call(e, &call, &r), SLUICE_ECANCELED);
    cr_assert_eq(r.kind, SLUICE_CURL_ABORTED);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- an error body the caller pauses ------------------------------------------------------ */

/*
 * A 429 whose body comes in two sends: first 3000 bytes of message, then, once the caller has
 * taken them, the "insufficient_quota" that makes it a QUOTA. Read once, the body's first
 * SLUICE_CURL_BODY_MAX (4096) bytes hold the word; with the first send read twice they do not.
 */
#define SPLIT_PAD 3000
static const char split_tail[] = "\",\"type\":\"insufficient_quota\"}}";

struct split_server {
    int listen_fd, port;
    pthread_t thread;
    _Atomic(bool) first_taken;
};

static void *split_main(void *arg)
{
    struct split_server *s = arg;
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char request[4096], head[256], first[SPLIT_PAD];
    loopback_read_request(fd, request, sizeof request);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     sizeof first + strlen(split_tail));
    static const char open[] = "{\"error\":{\"message\":\"";
    memcpy(first, open, strlen(open));
    for (size_t i = strlen(open); i < sizeof first; i++)
        first[i] = (char)('a' + i % 23);
    send(fd, head, (size_t)n, MSG_NOSIGNAL);
    send(fd, first, sizeof first, MSG_NOSIGNAL);
    /* A hang guard, not a timing claim: the caller takes the first send after one resume. */
    for (int64_t until = fx_now_ms() + 10000; !atomic_load(&s->first_taken) && fx_now_ms() < until;)
        fx_sleep_ms(1);
    send(fd, split_tail, strlen(split_tail), MSG_NOSIGNAL);
    close(fd);
    return NULL;
}

/* A caller that pauses the first chunk it is given and resumes from its progress callback, as
 * a proxy pauses for a slow client and resumes once it has read. */
struct pausing_writer {
    CURL *easy;
    _Atomic(bool) *first_taken;
    int pauses, resumes;
    size_t took;
};

static size_t pause_first(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    struct pausing_writer *w = ctx;
    if (!w->pauses++)
        return CURL_WRITEFUNC_PAUSE;
    w->took += size * n;
    atomic_store(w->first_taken, true);
    return size * n;
}

static int resume_paused(void *clientp, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct pausing_writer *w = clientp;
    if (w->pauses == 1 && !w->resumes++)
        curl_easy_pause(w->easy, CURLPAUSE_CONT);
    return 0;
}

PERFORM_TEST(an_error_body_the_caller_paused_is_read_once)
{
    struct split_server s = {.first_taken = false};
    s.listen_fd = loopback_listen(1, &s.port);
    pthread_create(&s.thread, NULL, split_main, &s);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", s.port);
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    CURL *easy = fx_easy_url(url);
    struct pausing_writer w = {.easy = easy, .first_taken = &s.first_taken};
    struct sluice_curl_result r;
    cr_assert_eq(sluice_curl_perform_call(e,
                                          &(struct sluice_curl_call){.backend = FX_BACKEND,
                                                                     .easy = easy,
                                                                     .write = pause_first,
                                                                     .write_data = &w,
                                                                     .xferinfo = resume_paused,
                                                                     .xferinfo_data = &w},
                                          &r),
                 SLUICE_OK, "%s", r.error);
    cr_assert_eq(w.resumes, 1, "the transfer was paused and resumed once");
    cr_assert_eq(w.took, SPLIT_PAD + strlen(split_tail), "the caller got every byte once");
    cr_assert_eq(r.kind, SLUICE_CURL_QUOTA,
                 "classified %s: the paused chunk was kept twice, pushing insufficient_quota "
                 "past the 4096 bytes classify reads",
                 sluice_curl_kind_name(r.kind));
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
    loopback_stop(s.listen_fd, s.thread);
}
