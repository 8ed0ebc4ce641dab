/*
 * The HTTP provider simulator (shim/tools/sluice-provider-sim) keeps the
 * promises the other e2e tests build on: its cap modes, Retry-After, cap
 * changes, the queue timeout, /stats, hang-up detection, abandoned calls
 * that keep their slot, keep-alive, its command line and a clean stop. Plain libcurl (easy + multi) against a simulator on a free
 * loopback port; every call has a timeout, every file run stays under ~20 s.
 *
 * Timing assertions are lower bounds the simulator's own clock guarantees
 * (a queued call cannot finish before the calls ahead of it), never upper
 * bounds on how fast this machine is, except where a bound is an order of
 * magnitude away from the expected time.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>

#include "sluice-provider-sim/sim_process.h"

static struct sim_process sim;

__attribute__((unused)) static void setup(void) /* unused by the TSan stand-in */
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

__attribute__((unused)) static void teardown(void)
{
    sim_process_stop(&sim);
    curl_global_cleanup();
}

/* Per-test options rather than TestSuite: the TSan build's Criterion
 * stand-in (tests/tsan/) has no TestSuite and ignores .init/.fini, so start()
 * also stops a simulator left by the previous test. */
#define SIM_TEST(name) Test(provider_sim, name, .init = setup, .fini = teardown, .timeout = 20)

static void start(const char *const args[])
{
    sim_process_stop(&sim);
    cr_assert_eq(sim_process_start(&sim, args), 0, "the simulator did not start");
}

/* ---- calls -------------------------------------------------------------------- */

struct call {
    CURL *easy;
    CURLcode result;
    long status;           /* 0 when no answer came */
    double seconds;        /* total time of the transfer */
    char body[4096];
    size_t len;
    char retry_after[128]; /* the Retry-After header value, "" if none */
    pthread_t thread;      /* call_start_background */
};

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    struct call *c = ctx;
    size_t bytes = size * n;
    size_t room = sizeof c->body - 1 - c->len;
    size_t keep = bytes < room ? bytes : room;
    memcpy(c->body + c->len, data, keep);
    c->len += keep;
    c->body[c->len] = '\0';
    return bytes;
}

static size_t on_header(char *data, size_t size, size_t n, void *ctx)
{
    struct call *c = ctx;
    size_t bytes = size * n;
    const char name[] = "Retry-After:";
    if (bytes > sizeof name - 1 && !strncasecmp(data, name, sizeof name - 1)) {
        const char *v = data + sizeof name - 1;
        size_t len = bytes - (sizeof name - 1);
        while (len && (*v == ' ' || *v == '\t'))
            v++, len--;
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n'))
            len--;
        snprintf(c->retry_after, sizeof c->retry_after, "%.*s", (int)len, v);
    }
    return bytes;
}

static const char chat_request[] =
    "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";

/* A chat-completions POST that gives up after timeout_ms. */
static void call_init(struct call *c, long timeout_ms)
{
    char url[64];
    memset(c, 0, sizeof *c);
    c->easy = curl_easy_init();
    cr_assert_not_null(c->easy);
    curl_easy_setopt(c->easy, CURLOPT_URL, sim_process_url(&sim, "/v1/chat/completions", url, sizeof url));
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, chat_request);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c->easy, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
}

static void call_finish(struct call *c, CURLcode result)
{
    c->result = result;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->status);
    curl_easy_getinfo(c->easy, CURLINFO_TOTAL_TIME, &c->seconds);
}

static void call_cleanup(struct call *c)
{
    curl_easy_cleanup(c->easy);
    c->easy = NULL;
}

/* n calls at once (one connection each), until all have ended. */
static void run_together(struct call *calls, int n, long timeout_ms)
{
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < n; i++) {
        call_init(&calls[i], timeout_ms);
        curl_multi_add_handle(multi, calls[i].easy);
    }
    int running = n;
    while (running) {
        cr_assert_eq(curl_multi_perform(multi, &running), CURLM_OK);
        if (running)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(multi, &left)))
        if (msg->msg == CURLMSG_DONE)
            for (int i = 0; i < n; i++)
                if (calls[i].easy == msg->easy_handle)
                    call_finish(&calls[i], msg->data.result);
    for (int i = 0; i < n; i++) {
        curl_multi_remove_handle(multi, calls[i].easy);
        call_cleanup(&calls[i]);
    }
    curl_multi_cleanup(multi);
}

static void *call_thread(void *arg)
{
    struct call *c = arg;
    call_finish(c, curl_easy_perform(c->easy));
    return NULL;
}

/* One call on its own thread; call_join waits for it. */
static void call_start_background(struct call *c, long timeout_ms)
{
    call_init(c, timeout_ms);
    cr_assert_eq(pthread_create(&c->thread, NULL, call_thread, c), 0);
}

static void call_join(struct call *c)
{
    pthread_join(c->thread, NULL);
    call_cleanup(c);
}

/* The longest transfer among `n` calls, in seconds. */
static double slowest_seconds(const struct call *calls, int n)
{
    double slowest = 0;
    for (int i = 0; i < n; i++)
        slowest = calls[i].seconds > slowest ? calls[i].seconds : slowest;
    return slowest;
}

static int count_status(const struct call *calls, int n, long status)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += calls[i].status == status;
    return k;
}

/* ---- /stats ------------------------------------------------------------------------ */

static json_t *http_json(const char *path, bool post)
{
    struct call c;
    char url[96];
    call_init(&c, 5000);
    curl_easy_setopt(c.easy, CURLOPT_URL, sim_process_url(&sim, path, url, sizeof url));
    if (!post)
        curl_easy_setopt(c.easy, CURLOPT_HTTPGET, 1L);
    call_finish(&c, curl_easy_perform(c.easy));
    call_cleanup(&c);
    cr_assert_eq(c.result, CURLE_OK, "%s: %s", path, curl_easy_strerror(c.result));
    cr_assert_eq(c.status, 200, "%s answered %ld", path, c.status);
    json_t *j = json_loads(c.body, 0, NULL);
    cr_assert_not_null(j, "%s is not JSON: %s", path, c.body);
    return j;
}

/* A number from /stats: "peak_in_flight", or "by_status.429". */
static long long stats_get(const char *key)
{
    json_t *s = http_json("/stats", false);
    json_t *v = s;
    if (!strncmp(key, "by_status.", 10))
        v = json_object_get(json_object_get(s, "by_status"), key + 10);
    else
        v = json_object_get(s, key);
    cr_assert(json_is_integer(v), "/stats has no integer %s", key);
    long long x = json_integer_value(v);
    json_decref(s);
    return x;
}

/* Poll /stats until key == want; false if it does not within ms. */
static bool stat_becomes(const char *key, long long want, int ms)
{
    int64_t deadline = sim__ms() + ms;
    for (;;) {
        if (stats_get(key) == want)
            return true;
        if (sim__ms() >= deadline)
            return false;
        sim__sleep_ms(10);
    }
}

/* ---- modes ------------------------------------------------------------------------- */

SIM_TEST(reject_mode_answers_429_past_the_cap_and_peaks_at_the_cap)
{
    start((const char *[]){"--mode", "reject", "--cap", "4", "--median-ms", "1500", "--sigma", "0", NULL});
    struct call calls[12];
    run_together(calls, 12, 10000);
    cr_expect_eq(count_status(calls, 12, 200), 4, "exactly the cap is served");
    cr_expect_eq(count_status(calls, 12, 429), 8, "everyone past the cap is refused");
    for (int i = 0; i < 12; i++) {
        cr_expect(!calls[i].retry_after[0], "Retry-After '%s' was not configured", calls[i].retry_after);
        json_t *body = json_loads(calls[i].body, 0, NULL);
        cr_assert_not_null(body, "answer %d is not JSON: %s", i, calls[i].body);
        if (calls[i].status == 200) { /* OpenAI-shaped */
            json_t *msg = json_object_get(json_array_get(json_object_get(body, "choices"), 0), "message");
            cr_expect_str_eq(json_string_value(json_object_get(body, "object")), "chat.completion");
            cr_expect_str_eq(json_string_value(json_object_get(body, "model")), "test-model");
            cr_expect(json_is_string(json_object_get(body, "id")));
            cr_expect_str_eq(json_string_value(json_object_get(msg, "role")), "assistant");
            cr_expect(json_is_string(json_object_get(msg, "content")));
            cr_expect_gt(json_integer_value(json_object_get(json_object_get(body, "usage"), "total_tokens")), 0);
        } else {
            cr_expect(json_is_string(json_object_get(json_object_get(body, "error"), "message")));
        }
        json_decref(body);
    }
    cr_expect_eq(stats_get("peak_in_flight"), 4);
    cr_expect_eq(stats_get("by_status.200"), 4);
    cr_expect_eq(stats_get("by_status.429"), 8);
    cr_expect_eq(stats_get("requests"), 12);
    cr_expect_eq(stats_get("in_flight"), 0);
}

SIM_TEST(reject_mode_sends_retry_after_in_seconds_when_configured)
{
    start((const char *[]){"--cap", "0", "--retry-after", "7", NULL});
    struct call c;
    run_together(&c, 1, 5000);
    cr_assert_eq(c.status, 429);
    cr_expect_str_eq(c.retry_after, "7");
}

SIM_TEST(reject_mode_sends_retry_after_as_an_http_date_when_asked)
{
    start((const char *[]){"--cap", "0", "--retry-after", "30", "--retry-after-date", NULL});
    struct call c;
    run_together(&c, 1, 5000);
    cr_assert_eq(c.status, 429);
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(c.retry_after, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    cr_assert(end && !*end, "Retry-After '%s' is not an HTTP date", c.retry_after);
    long long ahead = (long long)(timegm(&tm) - time(NULL));
    cr_expect(ahead >= 25 && ahead <= 31, "Retry-After '%s' is %lld s ahead, not ~30", c.retry_after, ahead);
}

SIM_TEST(rate_mode_serves_its_rate_per_window_and_refuses_the_rest_with_retry_after)
{
    start((const char *[]){"--mode", "rate", "--rate", "5", "--rate-window", "10", "--median-ms",
                           "0", "--retry-after", "3", NULL});
    struct call calls[12];
    run_together(calls, 12, 10000);
    /* 5 a second over a 10 s window: 50 may pass, so all 12 do; the cap is unused. */
    cr_expect_eq(count_status(calls, 12, 200), 12);
    start((const char *[]){"--mode", "rate", "--rate", "1", "--rate-window", "4", "--median-ms",
                           "0", "--retry-after", "3", NULL});
    run_together(calls, 12, 10000);
    cr_expect_eq(count_status(calls, 12, 200), 4, "1 a second over 4 s: four pass");
    cr_expect_eq(count_status(calls, 12, 429), 8);
    for (int i = 0; i < 12; i++)
        if (calls[i].status == 429) {
            cr_expect_str_eq(calls[i].retry_after, "3");
            cr_expect(strstr(calls[i].body, "rate limit"), "%s", calls[i].body);
        }
}

SIM_TEST(drop_mode_never_answers_past_the_cap_and_frees_the_slot_when_the_client_leaves)
{
    start((const char *[]){"--mode", "drop", "--cap", "2", "--median-ms", "200", "--sigma", "0",
                           NULL});
    struct call calls[5];
    run_together(calls, 5, 1500);
    cr_expect_eq(count_status(calls, 5, 200), 2, "the cap is served");
    cr_expect_eq(count_status(calls, 5, 0), 3, "the rest time out unanswered");
    cr_expect(stat_becomes("in_flight", 0, 2000), "dropped calls left when their client did");
    cr_expect_eq(stats_get("cancelled"), 3);
    cr_expect_eq(stats_get("peak_in_service"), 2);
}

SIM_TEST(slow_mode_slows_every_call_as_more_are_in_service)
{
    start((const char *[]){"--mode", "slow", "--cap", "2", "--knee-slope", "1", "--median-ms",
                           "200", "--sigma", "0", NULL});
    struct call one;
    run_together(&one, 1, 10000);
    struct call calls[6];
    run_together(calls, 6, 10000);
    cr_expect_eq(count_status(calls, 6, 200), 6, "no cap: everyone is served");
    double slowest = slowest_seconds(calls, 6);
    /* The sixth in service takes 0.2·(1 + 5/2) = 0.7 s; alone, 0.2 s. */
    cr_expect_lt(one.seconds, 0.45, "alone it took %.3f s", one.seconds);
    cr_expect_geq(slowest, 0.6, "six at once: the slowest took %.3f s", slowest);
}

SIM_TEST(queue_mode_queues_past_the_cap_so_later_calls_take_longer)
{
    start((const char *[]){"--mode", "queue", "--cap", "2", "--queue-bound", "10", "--median-ms", "300",
                           "--sigma", "0", NULL});
    struct call calls[6];
    run_together(calls, 6, 10000);
    cr_expect_eq(count_status(calls, 6, 200), 6, "everyone within the queue bound is served");
    double slowest = slowest_seconds(calls, 6);
    /* Two at a time, 0.3 s each: the last pair cannot finish before 0.9 s. */
    cr_expect_geq(slowest, 0.85, "the last call took %.3f s; it did not wait its turn", slowest);
    cr_expect_eq(stats_get("peak_in_service"), 2);
    cr_expect_eq(stats_get("peak_in_flight"), 6);
}

SIM_TEST(queue_mode_answers_503_past_the_queue_bound)
{
    start((const char *[]){"--mode", "queue", "--cap", "1", "--queue-bound", "2", "--median-ms", "500",
                           "--sigma", "0", NULL});
    struct call calls[6];
    run_together(calls, 6, 10000);
    cr_expect_eq(count_status(calls, 6, 200), 3, "one in service and two queued are served");
    cr_expect_eq(count_status(calls, 6, 503), 3, "the rest are turned away");
    cr_expect_eq(stats_get("by_status.503"), 3);
    cr_expect_eq(stats_get("peak_in_flight"), 3);
}

/* Cap 1, 300 ms each, 500 ms queue timeout, four at once: the first is served
 * at once, the second after 300 ms of waiting, and the last two would start
 * at 600 and 900 ms, so at 500 ms they leave the queue with a 503. */
SIM_TEST(queue_mode_answers_503_to_a_call_that_waited_past_the_queue_timeout)
{
    start((const char *[]){"--mode", "queue", "--cap", "1", "--queue-bound", "10", "--median-ms",
                           "300", "--sigma", "0", "--queue-timeout", "500", NULL});
    struct call calls[4];
    run_together(calls, 4, 10000);
    cr_expect_eq(count_status(calls, 4, 200), 2, "the calls that waited less than 500 ms are served");
    cr_expect_eq(count_status(calls, 4, 503), 2, "the calls that would wait longer are refused");
    for (int i = 0; i < 4; i++) {
        if (calls[i].status != 503)
            continue;
        cr_expect_geq(calls[i].seconds, 0.49, "a 503 came after %.3f s, before the timeout",
                      calls[i].seconds);
        json_t *body = json_loads(calls[i].body, 0, NULL);
        json_t *error = json_object_get(body, "error");
        cr_expect_str_eq(json_string_value(json_object_get(error, "code")), "queue_timeout", "%s",
                         calls[i].body);
        cr_expect(json_is_string(json_object_get(error, "message")), "%s", calls[i].body);
        json_decref(body);
    }
    cr_expect_eq(stats_get("queue_timeouts"), 2);
    cr_expect_eq(stats_get("by_status.503"), 2);
    cr_expect_eq(stats_get("by_status.200"), 2);
    cr_expect_eq(stats_get("cancelled"), 0);
    cr_expect_eq(stats_get("queued"), 0, "the expired calls left the queue");
    cr_expect_eq(stats_get("requests"), 4, "nothing was lost: 2 served + 2 timed out");
    cr_expect_eq(stats_get("peak_in_service"), 1);
}

/* A call that waits less than the queue timeout is served, as without one. */
SIM_TEST(queue_mode_serves_every_call_that_starts_before_its_queue_timeout)
{
    start((const char *[]){"--mode", "queue", "--cap", "2", "--median-ms", "100", "--sigma", "0",
                           "--queue-timeout", "1000", NULL});
    struct call calls[4];
    run_together(calls, 4, 10000);
    cr_expect_eq(count_status(calls, 4, 200), 4, "the second pair waits ~100 ms, well inside 1 s");
    cr_expect_eq(stats_get("queue_timeouts"), 0);
}

SIM_TEST(knee_mode_serves_everyone_but_slows_down_past_the_cap)
{
    start((const char *[]){"--mode", "knee", "--cap", "2", "--knee-slope", "2", "--median-ms", "200",
                           "--sigma", "0", NULL});
    struct call calls[6];
    run_together(calls, 6, 10000);
    cr_expect_eq(count_status(calls, 6, 200), 6, "knee mode refuses nobody");
    double slowest = slowest_seconds(calls, 6);
    /* The call admitted with n in service takes 0.2·(1 + 2·(n−2)/2) s: 1.0 s for n = 6.
     * Without the knee every call would take 0.2 s. */
    cr_expect_geq(slowest, 0.6, "the slowest call took %.3f s: no slow-down past the cap", slowest);
    cr_expect_eq(stats_get("peak_in_service"), 6);
}

SIM_TEST(cap_at_changes_the_cap_at_the_given_time)
{
    start((const char *[]){"--cap", "1", "--cap-at", "1500ms:3", "--median-ms", "300", "--sigma", "0", NULL});
    struct call before[3], after[3];
    run_together(before, 3, 5000);
    cr_expect_eq(count_status(before, 3, 200), 1, "cap 1 before the change");
    cr_expect_eq(count_status(before, 3, 429), 2);
    cr_assert(stat_becomes("cap", 3, 5000), "the cap never became 3");
    cr_expect_geq(stats_get("uptime_ms"), 1500, "the cap changed before its time");
    run_together(after, 3, 5000);
    cr_expect_eq(count_status(after, 3, 200), 3, "cap 3 after the change");
}

/* ---- hang-ups ------------------------------------------------------------------------ */

SIM_TEST(a_client_that_hangs_up_mid_call_is_counted_and_frees_its_slot_with_abandoned_free)
{
    start((const char *[]){"--cap", "1", "--median-ms", "4000", "--sigma", "0", "--abandoned",
                           "free", NULL});
    struct call a, b;
    run_together(&a, 1, 200); /* curl gives up and closes the connection */
    cr_assert_eq(a.result, CURLE_OPERATION_TIMEDOUT);
    /* Well before its 4 s service time would have ended. */
    cr_assert(stat_becomes("cancelled", 1, 2000), "the hang-up was not counted");
    cr_expect_eq(stats_get("in_flight"), 0, "the hung-up call still holds its slot");
    /* With the slot free, the next call is admitted (and hangs up too), not refused. */
    run_together(&b, 1, 500);
    cr_expect_eq(b.result, CURLE_OPERATION_TIMEDOUT, "got status %ld instead of being served", b.status);
    cr_expect(stat_becomes("cancelled", 2, 2000));
    cr_expect_eq(stats_get("by_status.429"), 0);
    cr_expect_eq(stats_get("requests"), 2);
}

/* The default (--abandoned hold): the provider keeps generating for a client
 * that left, so the slot stays taken until the call's service time is over. (A 4 s service
 * leaves the simulator 3 s to notice the hang-up: under ASan beside two busy loops, 1 s of a
 * 1.5 s service was once not enough.) */
SIM_TEST(a_client_that_hangs_up_mid_call_keeps_its_slot_until_its_service_time_ends)
{
    start((const char *[]){"--cap", "1", "--median-ms", "4000", "--sigma", "0", NULL});
    struct call a, b, c;
    int64_t t0 = sim__ms();
    run_together(&a, 1, 200); /* curl gives up and closes the connection */
    cr_assert_eq(a.result, CURLE_OPERATION_TIMEDOUT);
    cr_assert(stat_becomes("cancelled", 1, 3000), "the hang-up was not counted");
    cr_expect_eq(stats_get("lingering"), 1, "the abandoned call does not linger");
    cr_expect_eq(stats_get("in_service"), 1, "the abandoned call gave its slot back");
    cr_expect_eq(stats_get("in_flight"), 0, "nobody waits for that answer any more");
    run_together(&b, 1, 5000);
    cr_expect_eq(b.status, 429, "the held slot was given to the next call (%ld)", b.status);
    cr_assert(stat_becomes("in_service", 0, 8000), "the slot was never given back");
    int64_t held_ms = sim__ms() - t0;
    cr_expect_geq(held_ms, 3950, "the slot was given back after %lld ms, before the 4 s service",
                  (long long)held_ms);
    cr_expect_eq(stats_get("lingering"), 0);
    run_together(&c, 1, 5000);
    cr_expect_eq(c.status, 200, "after the service time the slot is free (%ld)", c.status);
    cr_expect_eq(stats_get("by_status.200"), 1, "the abandoned call is not counted as answered");
    cr_expect_eq(stats_get("cancelled"), 1);
    cr_expect_eq(stats_get("requests"), 3, "nothing lost: 1 abandoned + 1 refused + 1 served");
}

SIM_TEST(sigterm_stops_it_cleanly_while_abandoned_calls_linger)
{
    start((const char *[]){"--cap", "2", "--median-ms", "10000", "--sigma", "0", NULL});
    struct call a;
    run_together(&a, 1, 200);
    cr_assert(stat_becomes("lingering", 1, 2000));
    int64_t t0 = sim__ms();
    int status = sim_process_stop(&sim);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "wait status 0x%x, not a clean exit", status);
    cr_expect_lt(sim__ms() - t0, 2000, "stopping took %lld ms", (long long)(sim__ms() - t0));
}

SIM_TEST(a_queued_client_that_hangs_up_leaves_the_queue)
{
    start((const char *[]){"--mode", "queue", "--cap", "1", "--queue-bound", "1", "--median-ms", "4000",
                           "--sigma", "0", NULL});
    struct call served, queued, next;
    call_start_background(&served, 1500);
    cr_assert(stat_becomes("in_service", 1, 2000));
    run_together(&queued, 1, 300); /* waits behind `served`, then gives up */
    cr_assert_eq(queued.result, CURLE_OPERATION_TIMEDOUT);
    cr_assert(stat_becomes("cancelled", 1, 2000), "the queued hang-up was not counted");
    cr_expect_eq(stats_get("queued"), 0);
    /* Its place is free: the next call queues (and gives up) instead of a 503. */
    run_together(&next, 1, 300);
    cr_expect_eq(next.result, CURLE_OPERATION_TIMEDOUT, "got status %ld instead of a queue place", next.status);
    cr_expect_eq(stats_get("by_status.503"), 0);
    call_join(&served);
}

/* ---- plumbing -------------------------------------------------------------------------- */

SIM_TEST(keep_alive_reuses_one_connection_and_median_0_answers_at_once)
{
    start((const char *[]){"--median-ms", "0", NULL});
    struct call c;
    call_init(&c, 5000);
    for (int i = 0; i < 3; i++) {
        c.len = 0;
        call_finish(&c, curl_easy_perform(c.easy));
        cr_assert_eq(c.status, 200);
        long connects = -1;
        curl_easy_getinfo(c.easy, CURLINFO_NUM_CONNECTS, &connects);
        cr_expect_eq(connects, i == 0 ? 1 : 0, "call %d opened %ld connections", i, connects);
    }
    call_cleanup(&c);
    cr_expect_eq(stats_get("by_status.200"), 3);
}

SIM_TEST(stats_reset_zeroes_the_counters)
{
    start((const char *[]){"--median-ms", "0", NULL});
    struct call c;
    run_together(&c, 1, 5000);
    cr_assert_eq(stats_get("requests"), 1);
    json_decref(http_json("/stats/reset", true));
    cr_expect_eq(stats_get("requests"), 0);
    cr_expect_eq(stats_get("by_status.200"), 0);
    cr_expect_eq(stats_get("peak_in_flight"), 0);
}

SIM_TEST(sigterm_stops_it_cleanly_with_calls_in_flight)
{
    start((const char *[]){"--cap", "4", "--median-ms", "10000", "--sigma", "0", NULL});
    struct call calls[3];
    for (int i = 0; i < 3; i++)
        call_start_background(&calls[i], 8000);
    cr_assert(stat_becomes("in_flight", 3, 5000));
    int64_t t0 = sim__ms();
    int status = sim_process_stop(&sim);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "wait status 0x%x, not a clean exit", status);
    cr_expect_lt(sim__ms() - t0, 2000, "stopping took %lld ms", (long long)(sim__ms() - t0));
    for (int i = 0; i < 3; i++) {
        call_join(&calls[i]);
        cr_expect_neq(calls[i].status, 200, "a call was answered after the stop");
    }
}

/* ---- the command line ------------------------------------------------------------------ */

static void expect_usage_error(const char *const args[], const char *names)
{
    char out[256], err[512];
    int status = sim_process_run(args, out, sizeof out, err, sizeof err);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "%s: wait status 0x%x, not exit 2", args[0],
              status);
    cr_expect(!out[0], "%s: wrote to stdout: %s", args[0], out);
    cr_expect(strstr(err, names), "%s: the message does not name %s: %s", args[0], names, err);
    const char *nl = strchr(err, '\n');
    cr_expect(nl && nl[1] == '\0', "%s: not one line: %s", args[0], err);
}

SIM_TEST(a_bad_flag_exits_2_with_one_line_naming_it)
{
    expect_usage_error((const char *[]){"--bogus", NULL}, "--bogus");
    expect_usage_error((const char *[]){"--cap", NULL}, "--cap");
    expect_usage_error((const char *[]){"--cap", "many", NULL}, "--cap");
    expect_usage_error((const char *[]){"--mode", "fast", NULL}, "--mode");
    expect_usage_error((const char *[]){"--cap-at", "soon:3", NULL}, "--cap-at");
    expect_usage_error((const char *[]){"--retry-after-date", NULL}, "--retry-after");
    expect_usage_error((const char *[]){"--mode", "knee", "--cap", "0", NULL}, "--cap");
    expect_usage_error((const char *[]){"--mode", "slow", "--cap", "0", NULL}, "--cap");
    expect_usage_error((const char *[]){"--mode", "rate", NULL}, "--rate");
    expect_usage_error((const char *[]){"--mode", "rate", "--rate", "-1", NULL}, "--rate");
    expect_usage_error((const char *[]){"--mode", "queue", "--rate", "5", NULL}, "--rate");
    expect_usage_error((const char *[]){"--mode", "rate", "--rate", "5", "--rate-window", "0.0001",
                                        NULL},
                       "--rate-window");
    expect_usage_error((const char *[]){"--mode", "queue", "--retry-after", "2", NULL},
                       "--retry-after");
    expect_usage_error((const char *[]){"--queue-timeout", "100", NULL}, "--queue-timeout");
    expect_usage_error((const char *[]){"--mode", "queue", "--queue-timeout", "soon", NULL},
                       "--queue-timeout");
    expect_usage_error((const char *[]){"--mode", "queue", "--queue-timeout", "-5", NULL},
                       "--queue-timeout");
    expect_usage_error((const char *[]){"--mode", "queue", "--queue-timeout", NULL},
                       "--queue-timeout");
    expect_usage_error((const char *[]){"--abandoned", "maybe", NULL}, "--abandoned");
    expect_usage_error((const char *[]){"--abandoned", NULL}, "--abandoned");
}

SIM_TEST(help_prints_the_flags_and_exits_0)
{
    char out[4096], err[256];
    int status = sim_process_run((const char *[]){"--help", NULL}, out, sizeof out, err, sizeof err);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cr_expect(strstr(out, "--cap-at") && strstr(out, "--retry-after-date") &&
                  strstr(out, "--queue-timeout") && strstr(out, "--abandoned"),
              "usage: %s", out);
}

SIM_TEST(start_reports_a_simulator_that_exits_at_once_and_leaves_nothing_running)
{
    struct sim_process p;
    cr_expect_eq(sim_process_start(&p, (const char *[]){"--bogus", NULL}), -1);
    cr_expect_eq(p.pid, 0);
    cr_expect(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 2);
}
