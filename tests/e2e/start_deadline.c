/*
 * start_deadline.c — a call's start deadline over loopback, against
 * `sluice-provider-sim --stream`, which sends its headers and an opening SSE
 * comment at once and the first token only after its service time: the
 * start deadline bounds the wait for the first *token* (sluice_chat's
 * `begun`), through sluice_run and on the curl loop; it ends the call with
 * SLUICE_ETIMEDOUT and expired == SLUICE_EXPIRED_START, delivers no delta,
 * and the provider sees the client hang up; a stream that has begun runs
 * past it to its end; and a plain transfer with a start deadline ends at it
 * when no byte comes.
 */
#include "e2e/curl_fixture.h"

#include <sluice/client.h>
#include <sluice/run.h>

#define START_TEST(name)                                                                           \
    Test(start_deadline, name, .init = fx_setup, .fini = fx_teardown, .timeout = 60)

static void count_delta(void *ctx, struct sluice_chat *chat, const char *text, size_t len)
{
    (void)chat, (void)text, (void)len;
    (*(int *)ctx)++;
}

static struct sluice_chat *stream_chat(int *deltas)
{
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.model = "m",
                                                               .prompt = "hi",
                                                               .stream = true,
                                                               .on_delta = count_delta,
                                                               .delta_ctx = deltas},
                                    &chat),
                 SLUICE_OK);
    return chat;
}

static long stream_stat(const char *key)
{
    json_t *root = fx_stats_json();
    json_t *v = json_object_get(json_object_get(root, "stream"), key);
    long n = json_is_integer(v) ? (long)json_integer_value(v) : -1;
    json_decref(root);
    return n;
}

/* The first token after 3 s: far past a 300 ms start deadline, well inside a 20 s deadline. */
static const struct fx_provider slow_first_token = {.median_ms = 3000, .fixed_latency = true,
                                                    .abandoned_free = true, .stream = true,
                                                    .answer_tokens = 5, .fixed_answer = true,
                                                    .token_ms = 10};

START_TEST(a_stream_whose_first_token_misses_its_start_deadline_ends_as_a_start_expiry)
{
    fx_start(&slow_first_token);
    struct sluice_engine *e = fx_engine_at_sim();
    int deltas = 0;
    struct sluice_chat *chat = stream_chat(&deltas);
    struct timespec start, whole;
    struct sluice_run_result rr;
    int status = sluice_run(
        e,
        &(struct sluice_run_desc){.backend = FX_BACKEND, .ops = &sluice_chat_ops, .ctx = chat,
                                  .start_deadline = sluice_deadline_in(&start, 300 * SLUICE_NS_PER_MS),
                                  .deadline = sluice_deadline_in(&whole, 20 * SLUICE_NS_PER_SEC)},
        &rr);
    cr_assert(status == SLUICE_ETIMEDOUT ||
                  (status == SLUICE_ECLIENT && rr.client_status == SLUICE_ETIMEDOUT),
              "run: %s (client %s)", sluice_status_name(status),
              sluice_status_name(rr.client_status));
    cr_assert_eq(rr.expired, SLUICE_EXPIRED_START);
    cr_assert_eq(sluice_chat_result(chat)->expired, SLUICE_EXPIRED_START);
    cr_assert(sluice_chat_result(chat)->abandoned, "the request was sent: an abandoned call");
    cr_assert_eq(deltas, 0, "no token came");
    cr_assert_not(sluice_deadline_passed(&whole), "it ended at the start deadline");
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_CENSORED, "discovery learns: longer than that");
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

struct loop_done {
    _Atomic(int) status;
    _Atomic(bool) done;
};

static void on_chat_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    struct loop_done *d = data;
    atomic_store(&d->status, status);
    atomic_store(&d->done, true);
}

START_TEST(a_streamed_chat_on_the_loop_ends_at_its_start_deadline_and_the_provider_sees_it)
{
    fx_start(&slow_first_token);
    struct sluice_engine *e = fx_engine_at_sim();
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    int deltas = 0;
    struct sluice_chat *chat = stream_chat(&deltas);
    struct loop_done d = {0};
    struct timespec start, whole;
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){
                                        .backend = FX_BACKEND,
                                        .start_deadline =
                                            sluice_deadline_in(&start, 300 * SLUICE_NS_PER_MS),
                                        .deadline = sluice_deadline_in(&whole, 20 * SLUICE_NS_PER_SEC),
                                        .done = on_chat_done,
                                        .data = &d},
                                    NULL),
                 SLUICE_OK);
    for (int i = 0; i < 1000 && !atomic_load(&d.done); i++)
        fx_sleep_ms(10);
    cr_assert(atomic_load(&d.done), "the chat never completed");
    cr_assert_eq(atomic_load(&d.status), SLUICE_ETIMEDOUT, "%s",
                 sluice_status_name(atomic_load(&d.status)));
    cr_assert_eq(sluice_chat_result(chat)->expired, SLUICE_EXPIRED_START);
    cr_assert_eq(deltas, 0);
    cr_assert_not(sluice_deadline_passed(&whole));
    long cut = stream_stat("cut");
    for (int i = 0; i < 300 && cut < 1; i++, fx_sleep_ms(10))
        cut = stream_stat("cut");
    cr_assert_eq(cut, 1, "the simulator saw the client hang up");
    sluice_curl_loop_destroy(loop);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

START_TEST(a_stream_that_has_begun_runs_past_its_start_deadline_to_its_end)
{
    /* First token at once, then 40 tokens 20 ms apart: 800 ms, past a 300 ms start deadline. */
    fx_start(&(struct fx_provider){.median_ms = FX_ZERO, .stream = true, .answer_tokens = 40,
                                   .fixed_answer = true, .token_ms = 20});
    struct sluice_engine *e = fx_engine_at_sim();
    int deltas = 0;
    struct sluice_chat *chat = stream_chat(&deltas);
    struct timespec start;
    struct sluice_run_result rr;
    int status = sluice_run(
        e,
        &(struct sluice_run_desc){.backend = FX_BACKEND, .ops = &sluice_chat_ops, .ctx = chat,
                                  .start_deadline = sluice_deadline_in(&start, 300 * SLUICE_NS_PER_MS)},
        &rr);
    cr_assert_eq(status, SLUICE_OK, "run: %s (client %s)", sluice_status_name(status),
                 sluice_status_name(rr.client_status));
    cr_assert_eq(deltas, 40);
    cr_assert(sluice_deadline_passed(&start), "the stream outlived its start deadline");
    cr_assert_eq(rr.expired, SLUICE_EXPIRED_NONE);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

START_TEST(a_transfer_with_no_byte_by_its_start_deadline_ends_as_a_start_expiry)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 3000,
                                   .fixed_latency = true, .abandoned_free = true});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    CURL *easy = fx_easy();
    struct timespec start;
    struct sluice_curl_result r;
    int status = sluice_curl_perform_call(
        e,
        &(struct sluice_curl_call){.backend = FX_BACKEND, .easy = easy,
                                   .start_deadline = sluice_deadline_in(&start, 300 * SLUICE_NS_PER_MS)},
        &r);
    cr_assert_eq(status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(status));
    cr_assert_eq(r.expired, SLUICE_EXPIRED_START);
    cr_assert(r.transferred && r.abandoned);
    cr_assert_eq(fx_counts(e).timeouts, 1);
    curl_easy_cleanup(easy);
    sluice_engine_destroy(e);
}

/* ---- where the latency sample ends: the answer's beginning, not its headers ---------- */

/* A caller that streams: its write callback notes the first `data:` line, which `begun`
 * reports (the simulator's headers and SSE comment come at once, its first token later). */
struct sse_sink {
    bool data;       /* a `data:` line came */
    _Atomic(bool) done;
    struct sluice_curl_result result; /* the loop's, copied in done */
};

static size_t sse_write(char *p, size_t size, size_t n, void *ctx)
{
    struct sse_sink *s = ctx;
    s->data = s->data || memmem(p, size * n, "data:", 5) != NULL;
    return size * n;
}

static bool sse_begun(void *ctx)
{
    return ((struct sse_sink *)ctx)->data;
}

static void sse_done(const struct sluice_curl_result *r, CURL *easy, void *ctx)
{
    (void)easy;
    struct sse_sink *s = ctx;
    s->result = *r;
    atomic_store(&s->done, true);
}

#define STREAM_REQUEST                                                                             \
    "{\"model\":\"sim\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static CURL *stream_easy(struct sse_sink *s)
{
    CURL *easy = fx_easy();
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, STREAM_REQUEST);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, s);
    return easy;
}

/* The first token after 400 ms, then 3 tokens 10 ms apart. */
static const struct fx_provider first_token_400 = {.median_ms = 400, .fixed_latency = true,
                                                   .abandoned_free = true, .stream = true,
                                                   .answer_tokens = 3, .fixed_answer = true,
                                                   .token_ms = 10};

START_TEST(a_blocking_streams_latency_ends_at_its_first_token_and_a_cut_one_reports_none)
{
    fx_start(&first_token_400);
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct sse_sink s = {0};
    CURL *easy = stream_easy(&s);
    struct sluice_curl_call call = {.backend = FX_BACKEND, .easy = easy, .write = sse_write,
                                    .write_data = &s, .begun = sse_begun, .begun_data = &s};
    struct sluice_curl_result r;
    int status = sluice_curl_perform_call(e, &call, &r);
    cr_assert_eq(status, SLUICE_OK, "%s: %s", sluice_status_name(status), r.error);
    cr_assert(s.data, "the stream's tokens came");
    /* Timed at the headers (the simulator's come at once) it read about 1 ms. */
    cr_assert_geq(r.latency_ns, 350 * SLUICE_NS_PER_MS, "latency %lld ns: the headers', not the "
                  "first token's", (long long)r.latency_ns);
    cr_assert_leq(r.latency_ns, r.transfer_ns);

    /* Cut by its deadline after the headers, before the first token: the signal was never
     * seen, so no latency (a header time here taught the pool's first-byte estimate 1 ms). */
    s.data = false;
    struct timespec dl;
    call.deadline = sluice_deadline_in(&dl, 200 * SLUICE_NS_PER_MS);
    status = sluice_curl_perform_call(e, &call, &r);
    cr_assert_eq(status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(status));
    cr_assert(r.transferred && r.abandoned);
    cr_assert_eq(r.latency_ns, 0, "a call cut before its first token reported %lld ns",
                 (long long)r.latency_ns);
    curl_easy_cleanup(easy);
    sluice_engine_destroy(e);
}

START_TEST(a_streams_latency_on_the_loop_ends_at_its_first_token)
{
    fx_start(&first_token_400);
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    struct sse_sink s = {0};
    CURL *easy = stream_easy(&s);
    cr_assert_eq(sluice_curl_loop_submit(loop,
                                         &(struct sluice_curl_request){.backend = FX_BACKEND,
                                                                       .easy = easy,
                                                                       .write = sse_write,
                                                                       .write_data = &s,
                                                                       .begun = sse_begun,
                                                                       .done = sse_done,
                                                                       .data = &s},
                                         NULL),
                 SLUICE_OK);
    for (int i = 0; i < 1000 && !atomic_load(&s.done); i++)
        fx_sleep_ms(10);
    cr_assert(atomic_load(&s.done), "the request never completed");
    cr_assert_eq(s.result.status, SLUICE_OK, "%s: %s", sluice_status_name(s.result.status),
                 s.result.error);
    cr_assert_geq(s.result.latency_ns, 350 * SLUICE_NS_PER_MS,
                  "latency %lld ns: the headers', not the first token's",
                  (long long)s.result.latency_ns);
    cr_assert_leq(s.result.latency_ns, s.result.transfer_ns);
    sluice_curl_loop_destroy(loop);
    curl_easy_cleanup(easy);
    sluice_engine_destroy(e);
}
