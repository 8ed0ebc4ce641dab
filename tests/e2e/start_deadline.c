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

static struct sluice_engine *engine_at_sim(void)
{
    static char base[64];
    sim_process_url(&fx_sim, "/v1", base, sizeof base);
    struct sluice_backend_desc b = {.id = FX_BACKEND, .endpoint = base, .active = 4};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    return e;
}

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
    struct sluice_engine *e = engine_at_sim();
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
    struct sluice_engine *e = engine_at_sim();
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
    struct sluice_engine *e = engine_at_sim();
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
