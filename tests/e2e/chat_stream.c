/*
 * chat_stream.c — streamed chat completions (sluice/client.h's `stream`)
 * through sluice_run against `sluice-provider-sim --stream` over loopback:
 * the reply assembled from its deltas, usage, time to first token as the
 * sample, a 429 error event mid-stream, cancel and deadline mid-stream (the
 * simulator sees the connection close), an endless stream cut at the reply
 * cap, and a provider that ignores "stream". Every promise is checked on
 * the simulator's own counters as well as on what the client returned.
 */
#include "e2e/curl_fixture.h"

#include <sluice/client.h>
#include <sluice/run.h>

#define STREAM_TEST(name)                                                                          \
    Test(chat_stream, name, .init = fx_setup, .fini = fx_teardown, .timeout = 60)

/* What the delta callback saw. */
struct deltas {
    int n;
    char text[256];
    size_t len;
    int cancel_after; /* fire `cancel` at this delta (0 = never) */
    struct sluice_cancel *cancel;
    long sent_at_cancel; /* the tokens the provider had sent when the client fired it */
};

static long stream_stat(const char *key);

static void on_delta(void *ctx, struct sluice_chat *chat, const char *text, size_t len)
{
    (void)chat;
    struct deltas *d = ctx;
    d->n++;
    size_t keep = len < sizeof d->text - 1 - d->len ? len : sizeof d->text - 1 - d->len;
    memcpy(d->text + d->len, text, keep);
    d->len += keep;
    d->text[d->len] = '\0';
    if (d->cancel_after && d->n == d->cancel_after) {
        d->sent_at_cancel = stream_stat("tokens");
        sluice_cancel_fire(d->cancel);
    }
}

/* A streaming chat whose deltas go to *d (NULL: none). */
static struct sluice_chat *stream_chat(struct deltas *d)
{
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.model = "m",
                                                               .prompt = "hi",
                                                               .stream = true,
                                                               .on_delta = d ? on_delta : NULL,
                                                               .delta_ctx = d},
                                    &chat),
                 SLUICE_OK);
    return chat;
}

static int run_chat(struct sluice_engine *e, struct sluice_chat *chat,
                    const struct timespec *deadline, struct sluice_cancel *cancel,
                    struct sluice_run_result *rr)
{
    return sluice_run(e,
                      &(struct sluice_run_desc){.backend = FX_BACKEND,
                                                .ops = &sluice_chat_ops,
                                                .ctx = chat,
                                                .deadline = deadline,
                                                .cancel = cancel,
                                                .max_repairs = SLUICE_SOME(0)},
                      rr);
}

/* A number from the simulator's /stats "stream" object. */
static long stream_stat(const char *key)
{
    json_t *root = fx_stats_json();
    json_t *v = json_object_get(json_object_get(root, "stream"), key);
    cr_assert(json_is_integer(v), "/stats has no stream.%s", key);
    long n = (long)json_integer_value(v);
    json_decref(root);
    return n;
}

/* Poll until stream.key reaches want (bounded: 5 s); its last value. */
static long stream_stat_reaches(const char *key, long want)
{
    long v = stream_stat(key);
    for (int i = 0; i < 500 && v < want; i++) {
        fx_sleep_ms(10);
        v = stream_stat(key);
    }
    return v;
}

/* Five tokens streamed by a simulator speaking `dialect` (NULL: none), assembled. */
static void expect_an_assembled_reply(const char *dialect)
{
    fx_start(&(struct fx_provider){.median_ms = 5, .fixed_latency = true, .stream = true,
                                   .answer_tokens = 5, .fixed_answer = true, .token_ms = 1,
                                   .dialect = dialect});
    struct sluice_engine *e = fx_engine_at_sim();
    struct deltas d = {0};
    struct sluice_chat *chat = stream_chat(&d);
    struct sluice_run_result rr;
    int status = run_chat(e, chat, NULL, NULL, &rr);
    cr_assert_eq(status, SLUICE_OK, "run: %s (client %s: %s)", sluice_status_name(status),
                 sluice_status_name(rr.client_status), sluice_chat_result(chat)->error);
    cr_assert_eq(d.n, 5, "one delta per token, got %d", d.n);
    cr_assert_str_eq(d.text, "aaaabbbbccccddddeeee");
    cr_assert_str_eq(sluice_chat_reply(chat), d.text, "the reply is the deltas in order");
    struct sluice_chat_usage u = sluice_chat_last_usage(chat);
    cr_assert_eq(u.completion_tokens, 5);
    cr_assert_gt(u.prompt_tokens, 0);
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_OK);
    cr_assert_eq(stream_stat("completed"), 1);
    cr_assert_eq(stream_stat("tokens"), 5);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

STREAM_TEST(a_streamed_reply_is_assembled_from_its_deltas_and_reports_usage)
{
    expect_an_assembled_reply(NULL);
}

/* A simulator speaking a provider's dialect streams too (it answered in plain JSON). */
STREAM_TEST(a_simulator_in_a_dialect_streams_what_is_asked_to_stream)
{
    expect_an_assembled_reply("openai");
}

STREAM_TEST(the_sample_of_a_streamed_call_is_its_time_to_first_token)
{
    /* Headers and a comment at once, the first token after 100 ms, then 20 tokens 25 ms
     * apart: time to first byte is ~0, time to first token >= 100 ms, the whole call
     * >= 600 ms. The sample must be the middle one. */
    fx_start(&(struct fx_provider){.median_ms = 100, .fixed_latency = true, .stream = true,
                                   .answer_tokens = 20, .fixed_answer = true, .token_ms = 25});
    struct sluice_engine *e = fx_engine_at_sim();
    struct deltas d = {0};
    struct sluice_chat *chat = stream_chat(&d);
    struct sluice_run_result rr;
    cr_assert_eq(run_chat(e, chat, NULL, NULL, &rr), SLUICE_OK, "%s",
                 sluice_chat_result(chat)->error);
    int64_t ttft = rr.last.latency_ns;
    cr_assert_geq(ttft, 100 * SLUICE_NS_PER_MS,
                  "the sample (%lld ns) is not the time to first byte: the comment came first",
                  (long long)ttft);
    cr_assert_lt(ttft + 250 * SLUICE_NS_PER_MS, rr.elapsed_ns,
                 "the sample (%lld ns) leaves out the 475 ms of tokens (call: %lld ns)",
                 (long long)ttft, (long long)rr.elapsed_ns);
    cr_assert_eq(sluice_chat_result(chat)->latency_ns, ttft, "the result shows the same sample");
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

STREAM_TEST(a_429_error_event_mid_stream_ends_the_generation_as_an_overload_sample)
{
    fx_start(&(struct fx_provider){.median_ms = 5, .fixed_latency = true, .stream = true,
                                   .stream_fail_after = 2, .answer_tokens = 10,
                                   .fixed_answer = true, .token_ms = 1});
    struct sluice_engine *e = fx_engine_at_sim();
    struct deltas d = {0};
    struct sluice_chat *chat = stream_chat(&d);
    struct sluice_run_result rr;
    int status = run_chat(e, chat, NULL, NULL, &rr);
    cr_assert_eq(status, SLUICE_ECLIENT, "run: %s", sluice_status_name(status));
    cr_assert_eq(rr.client_status, SLUICE_EIO);
    const struct sluice_curl_result *res = sluice_chat_result(chat);
    cr_assert_eq(res->kind, SLUICE_CURL_OVERLOADED, "kind %s", sluice_curl_kind_name(res->kind));
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_OVERLOAD, "discovery gets an overload sample");
    cr_assert_eq(res->http_status, 200, "the HTTP status stays the response's own");
    cr_assert(strstr(res->error, "429"), "the error quotes the event: %s", res->error);
    cr_assert_eq(d.n, 2, "the deltas before the error were delivered");
    cr_assert_null(sluice_chat_reply(chat), "a failed stream leaves no reply");
    cr_assert_eq(stream_stat("failed"), 1);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* A long stream (1000 tokens, 20 ms apart: 20 s) that the caller ends early. */
static const struct fx_provider long_stream = {.median_ms = FX_ZERO, .abandoned_free = true,
                                               .stream = true, .answer_tokens = 1000,
                                               .fixed_answer = true, .token_ms = 20};

/* The simulator sends a token every 20 ms whatever the client reads, and watches the
 * socket between tokens: a client that closes at once leaves it a token or two past the
 * cancel; 10 leave room for a loaded machine, where a close left to curl's 1 s poll shows
 * 50. Counted from what the provider had sent when the client cancelled, not from the 3
 * tokens the client asked for: a client whose thread runs late finds more tokens waiting
 * than it takes (19 sent once in CI, under ASan beside a test that spun both cores). */
static void assert_closed_soon_after_the_cancel(const struct deltas *d)
{
    long sent = stream_stat("tokens");
    cr_assert_leq(sent - d->sent_at_cancel, 10,
                  "the provider sent %ld tokens after the cancel (%ld before) until it saw the "
                  "close", sent - d->sent_at_cancel, d->sent_at_cancel);
}

STREAM_TEST(a_cancel_mid_stream_closes_the_connection_and_the_provider_sees_it_at_once)
{
    fx_start(&long_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    struct sluice_cancel cancel;
    sluice_cancel_init(&cancel);
    struct deltas d = {.cancel_after = 3, .cancel = &cancel};
    struct sluice_chat *chat = stream_chat(&d);
    struct sluice_run_result rr;
    int status = run_chat(e, chat, NULL, &cancel, &rr);
    cr_assert(status == SLUICE_ECANCELED ||
                  (status == SLUICE_ECLIENT && rr.client_status == SLUICE_ECANCELED),
              "run: %s (client %s)", sluice_status_name(status),
              sluice_status_name(rr.client_status));
    cr_assert_eq(stream_stat_reaches("cut", 1), 1, "the simulator saw the client hang up");
    cr_assert_eq(stream_stat("completed"), 0);
    assert_closed_soon_after_the_cancel(&d);
    cr_assert_eq(fx_stats_settled().in_flight, 0, "the provider's slot is free");
    cr_assert_eq(fx_counts(e).admitted, 0, "the run's admission was given back");
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

STREAM_TEST(a_deadline_mid_stream_ends_the_generation_and_the_provider_sees_the_close)
{
    fx_start(&long_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    struct deltas d = {0};
    struct sluice_chat *chat = stream_chat(&d);
    struct timespec deadline;
    sluice_deadline_in(&deadline, 300 * SLUICE_NS_PER_MS);
    struct sluice_run_result rr;
    int status = run_chat(e, chat, &deadline, NULL, &rr);
    cr_assert(status == SLUICE_ETIMEDOUT ||
                  (status == SLUICE_ECLIENT && rr.client_status == SLUICE_ETIMEDOUT),
              "run: %s (client %s)", sluice_status_name(status),
              sluice_status_name(rr.client_status));
    cr_assert_gt(d.n, 0, "the stream had started");
    cr_assert_eq(stream_stat_reaches("cut", 1), 1, "the simulator saw the client hang up");
    cr_assert_lt(stream_stat("tokens"), 1000);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

/* An endless stream of 16 KiB tokens, sent as fast as the client reads. */
static const struct fx_provider endless_stream = {.median_ms = FX_ZERO, .stream = true,
                                                  .stream_endless = true, .token_ms = FX_ZERO,
                                                  .token_bytes = 16384};

/* Calls of 10 s seen by the pool, so an abandoned call's permit lingers (sluice/pool_linger.h). */
#define LINGER_AFTER_NS (10 * SLUICE_NS_PER_SEC)

/* The client cut a stream the provider was still sending: it ended as a cancelled call does
 * (sluice_pool_call_abandon: a cancel, its permit lingering), not as an ordinary end. */
static void assert_ended_abandoned(struct sluice_engine *e, struct sluice_chat *chat)
{
    cr_assert(sluice_chat_result(chat)->abandoned, "the result says the call was abandoned");
    struct sluice_pool_counts c = fx_counts(e);
    cr_assert_eq(c.cancels, 1, "counted as a cancel (sluice_pool_call_abandon), got %llu",
                 (unsigned long long)c.cancels);
    cr_assert_eq(c.lingered, 1, "its permit lingers while the provider may still generate");
    cr_assert_eq(c.lingering, 1);
    cr_assert_eq(c.admitted, 0, "the admission was given back");
}

STREAM_TEST(an_endless_stream_ends_at_the_reply_cap)
{
    fx_start(&endless_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    struct sluice_chat *chat = stream_chat(NULL);
    struct timespec deadline;
    sluice_deadline_in(&deadline, 30 * SLUICE_NS_PER_SEC);
    struct sluice_run_result rr;
    int status = run_chat(e, chat, &deadline, NULL, &rr);
    cr_assert_eq(status, SLUICE_ECLIENT, "run: %s", sluice_status_name(status));
    cr_assert_eq(rr.client_status, SLUICE_EIO, "client: %s",
                 sluice_status_name(rr.client_status));
    cr_assert(strstr(sluice_chat_result(chat)->error, "SLUICE_CHAT_REPLY_MAX"), "error: %s",
              sluice_chat_result(chat)->error);
    cr_assert_eq(sluice_chat_result(chat)->outcome, SLUICE_OUTCOME_IGNORE);
    /* Abandoned after its first token: discovery got that latency as a served call's
     * (sluice_pool_call_abandon_latency), not the cut. */
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_OK);
    cr_assert_eq(stream_stat_reaches("cut", 1), 1, "the transfer was ended, not drained");
    long sent = stream_stat("tokens");
    cr_assert_lt((double)sent * 16384, 2.0 * SLUICE_CHAT_REPLY_MAX,
                 "the provider sent %ld tokens of 16 KiB", sent);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

STREAM_TEST(a_stream_cut_at_the_reply_cap_ends_abandoned_like_a_cancelled_call)
{
    fx_start(&endless_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    fx_teach_service(e, LINGER_AFTER_NS, 16);
    struct sluice_chat *chat = stream_chat(NULL);
    struct sluice_run_result rr;
    cr_assert_eq(run_chat(e, chat, NULL, NULL, &rr), SLUICE_ECLIENT);
    cr_assert_eq(rr.client_status, SLUICE_EIO);
    assert_ended_abandoned(e, chat);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

STREAM_TEST(a_provider_that_ignores_stream_is_read_as_one_json_body)
{
    fx_start(&(struct fx_provider){.median_ms = 5}); /* no .stream: a JSON answer */
    struct sluice_engine *e = fx_engine_at_sim();
    struct deltas d = {0};
    struct sluice_chat *chat = stream_chat(&d);
    struct sluice_run_result rr;
    cr_assert_eq(run_chat(e, chat, NULL, NULL, &rr), SLUICE_OK, "%s",
                 sluice_chat_result(chat)->error);
    cr_assert(strstr(sluice_chat_reply(chat), "sluice-provider-sim reply"));
    cr_assert_eq(d.n, 0, "no deltas without a stream");
    cr_assert_eq(sluice_chat_last_usage(chat).completion_tokens, 5, "usage from the JSON body");
    cr_assert_eq(stream_stat("started"), 0);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

STREAM_TEST(the_simulators_stream_flags_without_stream_exit_2_naming_them)
{
    char out[256], err[512];
    const char *args[] = {"--token-ms", "5", NULL};
    int status = sim_process_run(args, out, sizeof out, err, sizeof err);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", (unsigned)status);
    cr_assert(strstr(err, "--token-ms") && strstr(err, "need --stream"), "stderr: %s", err);
    const char *both[] = {"--stream", "--stream-endless", "--stream-fail-after", "1", NULL};
    status = sim_process_run(both, out, sizeof out, err, sizeof err);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", (unsigned)status);
    cr_assert(strstr(err, "exclude each other"), "stderr: %s", err);
    const char *bytes[] = {"--stream", "--token-bytes", "0", NULL};
    status = sim_process_run(bytes, out, sizeof out, err, sizeof err);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", (unsigned)status);
    cr_assert(strstr(err, "--token-bytes"), "stderr: %s", err);
}

/* ---- the same chat on the curl loop (sluice_chat_submit) ------------------------------- */

struct loop_done {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    pthread_t done_thread;
};

/* Deltas with the thread they ran on (the loop's). */
struct loop_deltas {
    struct deltas d; /* first: on_delta's ctx */
    pthread_t thread;
    bool one_thread;
};

static void on_loop_delta(void *ctx, struct sluice_chat *chat, const char *text, size_t len)
{
    struct loop_deltas *ld = ctx;
    if (ld->d.n == 0)
        ld->thread = pthread_self();
    ld->one_thread = (ld->d.n == 0 || ld->one_thread) && pthread_equal(ld->thread, pthread_self());
    on_delta(&ld->d, chat, text, len);
}

static void on_chat_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    struct loop_done *w = data;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->done_thread = pthread_self();
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Submit `chat` to a fresh own-thread loop and wait (bounded) for its completion. */
static int run_on_loop(struct sluice_engine *e, struct sluice_chat *chat, struct sluice_cancel *cancel,
                       struct loop_done *w)
{
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = false;
    struct timespec deadline;
    sluice_deadline_in(&deadline, 20 * SLUICE_NS_PER_SEC);
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){.backend = FX_BACKEND,
                                                                  .deadline = &deadline,
                                                                  .cancel = cancel,
                                                                  .done = on_chat_done,
                                                                  .data = w},
                                    NULL),
                 SLUICE_OK);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0) {
    }
    bool done = w->done;
    int status = w->status;
    pthread_mutex_unlock(&w->mu);
    cr_assert(done, "the chat's completion never ran");
    cr_assert_not(pthread_equal(w->done_thread, pthread_self()), "done ran on the loop thread");
    sluice_curl_loop_destroy(loop);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return status;
}

static struct sluice_chat *loop_chat(struct loop_deltas *ld)
{
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.model = "m",
                                                               .prompt = "hi",
                                                               .stream = true,
                                                               .on_delta = on_loop_delta,
                                                               .delta_ctx = ld},
                                    &chat),
                 SLUICE_OK);
    return chat;
}

STREAM_TEST(on_the_curl_loop_deltas_and_completion_run_on_the_loop_thread_with_the_same_sample)
{
    fx_start(&(struct fx_provider){.median_ms = 100, .fixed_latency = true, .stream = true,
                                   .answer_tokens = 20, .fixed_answer = true, .token_ms = 25});
    struct sluice_engine *e = fx_engine_at_sim();
    struct loop_deltas ld = {0};
    struct sluice_chat *chat = loop_chat(&ld);
    struct loop_done w;
    int status = run_on_loop(e, chat, NULL, &w);
    cr_assert_eq(status, SLUICE_OK, "%s: %s", sluice_status_name(status),
                 sluice_chat_result(chat)->error);
    cr_assert_eq(ld.d.n, 20);
    cr_assert(ld.one_thread && pthread_equal(ld.thread, w.done_thread),
              "every delta and the completion ran on the loop thread");
    cr_assert_eq(strlen(sluice_chat_reply(chat)), 20 * 4);
    cr_assert_str_eq(sluice_chat_reply(chat), ld.d.text);
    cr_assert_eq(sluice_chat_last_usage(chat).completion_tokens, 20);
    /* result.latency_ns is the sample the loop gave discovery (the finish hook ran first). */
    const struct sluice_curl_result *res = sluice_chat_result(chat);
    cr_assert_geq(res->latency_ns, 100 * SLUICE_NS_PER_MS, "sample %lld ns is not TTFB",
                  (long long)res->latency_ns);
    cr_assert_lt(res->latency_ns + 250 * SLUICE_NS_PER_MS, res->transfer_ns,
                 "sample %lld ns leaves out the tokens (transfer %lld ns)",
                 (long long)res->latency_ns, (long long)res->transfer_ns);
    cr_assert_eq(res->outcome, SLUICE_OUTCOME_OK);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

STREAM_TEST(on_the_curl_loop_a_429_event_mid_stream_is_an_overload_sample)
{
    fx_start(&(struct fx_provider){.median_ms = 5, .fixed_latency = true, .stream = true,
                                   .stream_fail_after = 3, .answer_tokens = 10,
                                   .fixed_answer = true, .token_ms = 1});
    struct sluice_engine *e = fx_engine_at_sim();
    struct loop_deltas ld = {0};
    struct sluice_chat *chat = loop_chat(&ld);
    struct loop_done w;
    cr_assert_eq(run_on_loop(e, chat, NULL, &w), SLUICE_EIO);
    const struct sluice_curl_result *res = sluice_chat_result(chat);
    cr_assert_eq(res->kind, SLUICE_CURL_OVERLOADED, "kind %s", sluice_curl_kind_name(res->kind));
    cr_assert_eq(res->outcome, SLUICE_OUTCOME_OVERLOAD, "the loop gave discovery an overload");
    cr_assert_eq(ld.d.n, 3);
    cr_assert_eq(stream_stat("failed"), 1);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

STREAM_TEST(on_the_curl_loop_a_cancel_mid_stream_closes_the_connection)
{
    fx_start(&long_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    struct sluice_cancel cancel;
    sluice_cancel_init(&cancel);
    struct loop_deltas ld = {.d = {.cancel_after = 3, .cancel = &cancel}};
    struct sluice_chat *chat = loop_chat(&ld);
    struct loop_done w;
    cr_assert_eq(run_on_loop(e, chat, &cancel, &w), SLUICE_ECANCELED);
    cr_assert_eq(stream_stat_reaches("cut", 1), 1, "the simulator saw the client hang up");
    assert_closed_soon_after_the_cancel(&ld.d);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

STREAM_TEST(on_the_curl_loop_a_stream_cut_at_the_reply_cap_ends_abandoned_like_a_cancelled_call)
{
    fx_start(&endless_stream);
    struct sluice_engine *e = fx_engine_at_sim();
    fx_teach_service(e, LINGER_AFTER_NS, 16);
    struct loop_deltas ld = {0};
    struct sluice_chat *chat = loop_chat(&ld);
    struct loop_done w;
    cr_assert_eq(run_on_loop(e, chat, NULL, &w), SLUICE_EIO);
    cr_assert(strstr(sluice_chat_result(chat)->error, "SLUICE_CHAT_REPLY_MAX"), "error: %s",
              sluice_chat_result(chat)->error);
    assert_ended_abandoned(e, chat);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}
