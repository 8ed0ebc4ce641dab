/*
 * curl_client.c — the built-in chat-completions client (sluice/client.h)
 * as sluice_run's client: against the provider simulator (base URL
 * overridden, the backend's pool kept), and against a one-shot capture
 * server that shows exactly what went over the wire (API key, model,
 * messages, the repair turn).
 */
#include "e2e/curl_fixture.h"
#include "e2e/curl_loopback.h"

#include <malloc.h>
#include <sys/socket.h>

#include <sluice/client.h>

#define CLIENT_TEST(name)                                                                          \
    Test(curl_client, name, .init = fx_setup, .fini = fx_teardown, .timeout = 30)

static char *sim_base(char *buf, size_t n)
{
    return (char *)sim_process_url(&fx_sim, "/v1", buf, n);
}

static struct sluice_chat *chat_new(const struct sluice_chat_desc *d)
{
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(d, &chat), SLUICE_OK);
    return chat;
}

CLIENT_TEST(a_run_with_the_chat_client_gets_the_providers_reply)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 10});
    char base[64];
    struct sluice_backend_desc b = {
        .id = FX_BACKEND, .endpoint = sim_base(base, sizeof base), .active = 4};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    cr_assert_null(sluice_chat_reply(chat));
    struct sluice_run_result rr;
    int status = sluice_run(
        e, &(struct sluice_run_desc){.backend = FX_BACKEND, .ops = &sluice_chat_ops, .ctx = chat},
        &rr);
    cr_assert_eq(status, SLUICE_OK, "run: %s (client %s)", sluice_status_name(status),
                 sluice_status_name(rr.client_status));
    cr_assert_not_null(sluice_chat_reply(chat));
    cr_assert_gt(strlen(sluice_chat_reply(chat)), 0);
    cr_assert_eq(sluice_chat_result(chat)->http_status, 200);
    cr_assert_eq(rr.generations, 1);
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_OK);
    cr_assert_eq(fx_stats_settled().requests, 1);
    sluice_chat_destroy(chat);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* sluice_chat_easy: a transport option the chat client leaves alone holds for its
 * generations. Here a resolve override (a base URL whose host exists nowhere but there), as
 * a program sets CURLOPT_CAINFO for a provider behind a private CA. */
CLIENT_TEST(a_transport_option_set_on_the_chats_handle_holds_for_its_generations)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 10});
    char base[96], resolve[96];
    snprintf(base, sizeof base, "http://provider.invalid:%d/v1", fx_sim.port);
    snprintf(resolve, sizeof resolve, "provider.invalid:%d:127.0.0.1", fx_sim.port);
    struct sluice_backend_desc b = {.id = FX_BACKEND, .endpoint = base, .active = 4};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    cr_assert_null(sluice_chat_easy(NULL));
    struct curl_slist *hosts = curl_slist_append(NULL, resolve);
    cr_assert_eq(curl_easy_setopt(sluice_chat_easy(chat), CURLOPT_RESOLVE, hosts), CURLE_OK);
    for (int k = 0; k < 2; k++) {
        struct sluice_run_result rr;
        int status = sluice_run(e,
                                &(struct sluice_run_desc){.backend = FX_BACKEND,
                                                          .ops = &sluice_chat_ops, .ctx = chat},
                                &rr);
        cr_assert_eq(status, SLUICE_OK, "run %d: %s (client %s, curl: %s)", k,
                     sluice_status_name(status), sluice_status_name(rr.client_status),
                     curl_easy_strerror(sluice_chat_result(chat)->curl_code));
        cr_assert_eq(sluice_chat_result(chat)->http_status, 200);
    }
    cr_assert_eq(fx_stats_settled().requests, 2);
    sluice_chat_destroy(chat);
    curl_slist_free_all(hosts);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- the openrouter preset, overridden to the simulator ------------------------------ */

struct runner {
    struct sluice_engine *engine;
    const char *endpoint;
    int status;
};

static void *runner_main(void *arg)
{
    struct runner *r = (struct runner *)arg;
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    r->status = sluice_run(r->engine,
                           &(struct sluice_run_desc){.backend = SLUICE_OPENROUTER_ID,
                                                     .endpoint = r->endpoint,
                                                     .ops = &sluice_chat_ops,
                                                     .ctx = chat},
                           NULL);
    sluice_chat_destroy(chat);
    return NULL;
}

CLIENT_TEST(the_openrouter_preset_with_an_endpoint_override_keeps_its_16_permits)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 100, .median_ms = 200,
                                   .fixed_latency = true});
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){0}, &e), SLUICE_OK);
    cr_assert_str_eq(sluice_engine_find(e, SLUICE_OPENROUTER_ID)->endpoint,
                     "https://openrouter.ai/api/v1", "the preset's real base URL");
    char base[64];
    sim_base(base, sizeof base);
    enum { N = 24 };
    struct runner r[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        r[i] = (struct runner){e, base, -1};
        pthread_create(&t[i], NULL, runner_main, &r[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(r[i].status, SLUICE_OK, "run %d: %s", i, sluice_status_name(r[i].status));
    }
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.requests, N);
    cr_assert_leq(s.peak_in_flight, SLUICE_OPENROUTER_ACTIVE, "peak %ld", s.peak_in_flight);
    cr_assert_geq(s.peak_in_flight, 8, "the runs did not overlap: peak %ld", s.peak_in_flight);
    sluice_engine_destroy(e);
}

CLIENT_TEST(a_429_fails_the_run_as_a_client_error_and_backs_discovery_off)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 1, .median_ms = 400,
                                   .fixed_latency = true, .retry_after = 2});
    char base[64];
    struct sluice_discovery_desc dd = fx_discovery();
    dd.jumpstart = 4;
    struct sluice_backend_desc b = {
        .id = FX_BACKEND, .endpoint = sim_base(base, sizeof base), .active = 8, .discovery = &dd};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    CURL *busy = fx_easy();
    CURLM *multi = curl_multi_init(); /* hold the simulator's only slot, outside sluice */
    curl_multi_add_handle(multi, busy);
    int running;
    int64_t until = fx_now_ms() + 5000;
    while (fx_stats().in_flight < 1 && fx_now_ms() < until) {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 10, NULL);
    }
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    struct sluice_run_result rr;
    int status = sluice_run(
        e, &(struct sluice_run_desc){.backend = FX_BACKEND, .ops = &sluice_chat_ops, .ctx = chat},
        &rr);
    cr_assert_eq(status, SLUICE_ECLIENT);
    cr_assert_eq(rr.client_status, SLUICE_EIO);
    cr_assert_eq(rr.client_stage, SLUICE_STAGE_GENERATE);
    cr_assert_eq(sluice_chat_result(chat)->http_status, 429);
    cr_assert_eq(sluice_chat_result(chat)->kind, SLUICE_CURL_OVERLOADED);
    cr_assert_eq(rr.last.outcome, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(rr.last.retry_after_ns, 2 * SLUICE_NS_PER_SEC);
    struct sluice_discovery_status st = fx_status(e);
    cr_assert_lt(st.limit, 4, "discovery did not back off: limit %u", st.limit);
    cr_assert_gt(st.hold_until_ns, 0, "no Retry-After hold");
    sluice_chat_destroy(chat);
    curl_multi_remove_handle(multi, busy);
    curl_multi_cleanup(multi);
    curl_easy_cleanup(busy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- a capture server: what exactly went over the wire -------------------------------- */

#define CAPTURE_MAX 2

struct capture {
    int listen_fd, port;
    int n; /* requests served */
    char req[CAPTURE_MAX][8192];
    pthread_t thread;
};

static void *capture_main(void *arg)
{
    struct capture *c = (struct capture *)arg;
    static const char answer[] =
        "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
        "{\"role\":\"assistant\",\"content\":\"captured reply\"},\"finish_reason\":\"stop\"}]}";
    for (int i = 0; i < CAPTURE_MAX; i++) {
        int fd = accept(c->listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        loopback_read_request(fd, c->req[i], sizeof c->req[i]);
        char head[256];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         "%zu\r\nConnection: close\r\n\r\n",
                         sizeof answer - 1);
        send(fd, head, (size_t)n, MSG_NOSIGNAL);
        send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
        close(fd);
        c->n = i + 1;
    }
    return NULL;
}

static void capture_start(struct capture *c)
{
    memset(c, 0, sizeof *c);
    c->listen_fd = loopback_listen(4, &c->port);
    pthread_create(&c->thread, NULL, capture_main, c);
}

static void capture_stop(struct capture *c)
{
    loopback_stop(c->listen_fd, c->thread);
}

static int reject_first(void *ctx, struct sluice_chat *chat, unsigned attempt, bool *repair)
{
    (void)ctx;
    cr_assert_str_eq(sluice_chat_reply(chat), "captured reply");
    if (attempt == 0) {
        sluice_chat_set_repair(chat, "please fix the JSON");
        *repair = true;
        return SLUICE_EINVAL;
    }
    return SLUICE_OK;
}

CLIENT_TEST(the_request_carries_the_key_from_the_environment_the_model_and_the_repair_turn)
{
    struct capture cap;
    capture_start(&cap);
    setenv(SLUICE_CHAT_API_KEY_ENV, "sk-test-5ec2e7", 1);
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/api/v1/", cap.port);
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.base_url = base,
                                                                   .model = "vendor/model-1",
                                                                   .system = "be brief",
                                                                   .prompt = "2+2?",
                                                                   .max_tokens = 7,
                                                                   .validate = reject_first});
    unsetenv(SLUICE_CHAT_API_KEY_ENV);
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){0}, &e), SLUICE_OK);
    struct sluice_run_result rr;
    int status =
        sluice_run(e, &(struct sluice_run_desc){.ops = &sluice_chat_ops, .ctx = chat}, &rr);
    capture_stop(&cap);
    cr_assert_eq(status, SLUICE_OK, "run: %s (client %s)", sluice_status_name(status),
                 sluice_status_name(rr.client_status));
    cr_assert_eq(rr.generations, 2);
    cr_assert_eq(cap.n, 2);
    const char *first = cap.req[0], *second = cap.req[1];
    cr_assert(strncmp(first, "POST /api/v1/chat/completions HTTP/1.1", 38) == 0, "%.60s", first);
    cr_assert_not_null(strstr(first, "Authorization: Bearer sk-test-5ec2e7\r\n"));
    cr_assert_not_null(strcasestr(first, "Content-Type: application/json"));
    const char *body = strstr(first, "\r\n\r\n") + 4;
    json_t *j = json_loads(body, 0, NULL);
    cr_assert_not_null(j, "body is not JSON: %s", body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "vendor/model-1");
    cr_assert_eq(json_integer_value(json_object_get(j, "max_tokens")), 7);
    json_t *msgs = json_object_get(j, "messages");
    cr_assert_eq(json_array_size(msgs), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                     "2+2?");
    json_decref(j);
    j = json_loads(strstr(second, "\r\n\r\n") + 4, 0, NULL);
    msgs = json_object_get(j, "messages");
    cr_assert_eq(json_array_size(msgs), 4, "the repair resends the conversation plus two turns");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 2), "content")),
                     "captured reply");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 3), "content")),
                     "please fix the JSON");
    json_decref(j);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

/* JSON strings are UTF-8: text that is not is the caller's mistake (EINVAL naming the
 * field), not a failed allocation. */
CLIENT_TEST(text_that_is_not_utf8_is_refused_with_einval_naming_the_field)
{
    static const char *const fields[] = {"model", "system", "prompt", "repair_prompt"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        struct sluice_chat_desc d = {.model = "m", .prompt = "hi"};
        const char *bad = i % 2 ? "caf\xc3" : "\xff\xfe";
        if (i == 0)
            d.model = bad;
        else if (i == 1)
            d.system = bad;
        else if (i == 2)
            d.prompt = bad;
        else
            d.repair_prompt = bad;
        char err[256] = "untouched", expect[96];
        d.error = err;
        d.error_size = sizeof err;
        snprintf(expect, sizeof expect, "sluice_chat_desc.%s is not valid UTF-8", fields[i]);
        struct sluice_chat *chat = (struct sluice_chat *)1;
        int status = sluice_chat_create(&d, &chat);
        cr_assert_eq(status, SLUICE_EINVAL, "%s: %s", fields[i], sluice_status_name(status));
        cr_assert_null(chat);
        cr_assert(strstr(err, expect), "%s: \"%s\"", fields[i], err);
    }
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    cr_assert_eq(sluice_chat_set_repair(chat, "bad \x80 byte"), SLUICE_EINVAL);
    cr_assert_eq(sluice_chat_set_repair(chat, "caf\xc3\xa9 is fine"), SLUICE_OK);
    sluice_chat_destroy(chat);
}

static void never_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    (void)data;
    cr_assert_fail("a refused submission has no completion (status %s)",
                   sluice_status_name(status));
}

CLIENT_TEST(without_a_url_or_a_model_the_client_says_einval_naming_what_to_set)
{
    struct sluice_chat *chat = NULL;
    char err[256] = "untouched";
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.prompt = "hi",
                                                               .error = err,
                                                               .error_size = sizeof err},
                                    &chat),
                 SLUICE_EINVAL);
    cr_assert_null(chat);
    cr_assert(strstr(err, "model is NULL (set sluice_chat_desc.model"), "\"%s\"", err);
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.model = "m",
                                                               .error = err,
                                                               .error_size = sizeof err},
                                    &chat),
                 SLUICE_EINVAL);
    cr_assert(strstr(err, "prompt is NULL (set sluice_chat_desc.prompt"), "\"%s\"", err);
    chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){0}, &e), SLUICE_OK);
    struct sluice_run_result rr;
    cr_assert_eq(
        sluice_run(e, &(struct sluice_run_desc){.ops = &sluice_chat_ops, .ctx = chat}, &rr),
        SLUICE_ECLIENT);
    cr_assert_eq(rr.client_status, SLUICE_EINVAL, "the endpoint-only backend has no URL");
    const char *why = sluice_chat_result(chat)->error;
    cr_assert(strstr(why, "no URL") && strstr(why, "sluice_chat_desc.base_url"),
              "the result names what to set: \"%s\"", why);
    /* On the loop, refused at submit with the same words. */
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    sluice_chat_destroy(chat);
    chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    cr_assert_eq(sluice_chat_submit(loop, chat, &(struct sluice_chat_request){.done = never_done},
                                    NULL),
                 SLUICE_EINVAL);
    why = sluice_chat_result(chat)->error;
    cr_assert(strstr(why, "no URL") && strstr(why, "sluice_chat_desc.base_url"), "\"%s\"", why);
    sluice_curl_loop_destroy(loop);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}

CLIENT_TEST(a_chat_submitted_to_an_unknown_backend_is_told_so_not_that_it_lacks_a_url)
{
    struct sluice_backend_desc b = {.id = FX_BACKEND, .endpoint = "http://127.0.0.1:9/v1",
                                    .active = 4};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    /* Without a base URL (the backend's endpoint was meant), and with one. */
    for (int with_base = 0; with_base < 2; with_base++) {
        struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){
            .model = "m", .prompt = "hi", .base_url = with_base ? "http://127.0.0.1:9/v1" : NULL});
        cr_assert_eq(sluice_chat_submit(loop, chat,
                                        &(struct sluice_chat_request){.backend = FX_BACKEND "-typo",
                                                                      .done = never_done},
                                        NULL),
                     SLUICE_EINVAL);
        const char *why = sluice_chat_result(chat)->error;
        cr_assert(strstr(why, "backend \"" FX_BACKEND "-typo\" is not registered") &&
                      strstr(why, "sluice_engine_desc.backends") && !strstr(why, "no URL"),
                  "base_url %d: \"%s\"", with_base, why);
        sluice_chat_destroy(chat);
    }
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, FX_BACKEND)).admitted, 0);
    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(e);
}

/* Bytes the process's malloc has handed out and not taken back (glibc: heap and mmapped). */
static size_t malloc_in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

CLIENT_TEST(a_refused_streaming_chat_never_paid_for_its_event_buffer)
{
    size_t before = malloc_in_use();
    char *volatile probe = malloc(SLUICE_CHAT_EVENT_MAX); /* volatile: kept, not elided */
    memset(probe, 1, SLUICE_CHAT_EVENT_MAX);
    bool seen = malloc_in_use() - before >= SLUICE_CHAT_EVENT_MAX;
    free(probe);
    if (!seen)
        cr_skip_test("mallinfo2 does not see this build's allocator (a sanitizer's)");
    struct sluice_engine *e = fx_engine(1, 0, NULL); /* one run at a time, no waiting room */
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    struct sluice_pool *pool = sluice_engine_pool(e, FX_BACKEND);
    cr_assert_eq(sluice_pool_admit(pool), SLUICE_OK, "the pool is full from here");
    before = malloc_in_use();
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){
        .base_url = "http://127.0.0.1:1/v1", .model = "m", .prompt = "hi", .stream = true});
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){.backend = FX_BACKEND,
                                                                  .done = never_done},
                                    NULL),
                 SLUICE_ECAPACITY);
    size_t paid = malloc_in_use() - before;
    cr_assert_lt(paid, SLUICE_CHAT_EVENT_MAX / 4,
                 "a streaming chat created and refused holds %zu bytes (the event buffer is %u)",
                 paid, SLUICE_CHAT_EVENT_MAX);
    sluice_chat_destroy(chat);
    sluice_pool_leave(pool);
    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(e);
}

CLIENT_TEST(a_refused_submit_leaves_its_code_in_the_chats_result)
{
    struct sluice_engine *e = fx_engine(1, 0, NULL); /* one run at a time, no waiting room */
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    struct sluice_pool *pool = sluice_engine_pool(e, FX_BACKEND);
    cr_assert_eq(sluice_pool_admit(pool), SLUICE_OK, "the pool is full from here");
    struct sluice_chat *chat = chat_new(
        &(struct sluice_chat_desc){.base_url = "http://127.0.0.1:1/v1", .model = "m", .prompt = "hi"});
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){.backend = FX_BACKEND,
                                                                  .done = never_done},
                                    NULL),
                 SLUICE_ECAPACITY);
    const struct sluice_curl_result *r = sluice_chat_result(chat);
    cr_assert_eq(r->status, SLUICE_ECAPACITY, "the result says the submit was refused: \"%s\"",
                 r->error);
    cr_assert(strstr(r->error, sluice_strerror(SLUICE_ECAPACITY)), "\"%s\"", r->error);
    sluice_chat_destroy(chat);
    sluice_pool_leave(pool);
    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(e);
}

/* What a chat on the loop was told, and when (sluice_chat_request.cut and .done). */
struct told {
    _Atomic(int) cut, done;
    int cut_status, done_status, done_at_cut;
    enum sluice_expiry cut_expired;
};

static void told_cut(struct sluice_chat *chat, int status, void *data)
{
    struct told *t = data;
    t->cut_status = status;
    t->cut_expired = sluice_chat_result(chat)->expired;
    t->done_at_cut = atomic_load(&t->done);
    atomic_store(&t->cut, 1);
}

static void told_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    struct told *t = data;
    t->done_status = status;
    atomic_store(&t->done, 1);
}

/* A chat on the loop whose deadline passes mid-answer, where the pool keeps the permit (calls
 * seen to take 2 s, lingering on): the caller is told at the deadline, the answer is read on,
 * and the permit comes back when the provider is done. */
CLIENT_TEST(a_chat_on_the_loop_past_its_deadline_is_told_then_and_read_on_to_the_providers_end)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 900,
                                   .fixed_latency = true});
    char base[64];
    struct sluice_backend_desc b = {
        .id = FX_BACKEND, .endpoint = sim_base(base, sizeof base), .active = 2,
        .deadlines = {.start_quantile = SLUICE_SOME(0), .linger = SLUICE_LINGER_ON}};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    fx_teach_service(e, 2 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_MIN_SAMPLES);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    struct sluice_chat *chat = chat_new(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"});
    struct told t = {0};
    struct timespec d;
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){
                                        .backend = FX_BACKEND,
                                        .deadline = sluice_deadline_in(&d, 300 * SLUICE_NS_PER_MS),
                                        .done = told_done, .cut = told_cut, .data = &t},
                                    NULL),
                 SLUICE_OK);
    WAIT_UNTIL(atomic_load(&t.cut));
    cr_assert_eq(t.done_at_cut, 0);
    cr_assert_eq(t.cut_status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(t.cut_status));
    cr_assert_eq(t.cut_expired, SLUICE_EXPIRED_CALL);
    struct sluice_pool_counts c = fx_counts(e); /* read before the provider is known unfinished */
    if (fx_stats().ok == 0) {
        cr_assert_eq(c.in_flight, 1, "read on, the call keeps its permit");
        cr_assert_eq(c.lingering, 0);
    }
    WAIT_UNTIL(atomic_load(&t.done));
    cr_assert_eq(t.done_status, SLUICE_OK, "the provider finished it: %s",
                 sluice_status_name(t.done_status));
    cr_assert_eq(sluice_chat_result(chat)->status, SLUICE_ETIMEDOUT, "what cut said");
    cr_assert_eq(fx_stats_settled().ok, 1);
    cr_assert_eq(fx_counts(e).lingered, 0);
    cr_assert_eq(fx_counts(e).timeouts, 1);
    fx_assert_idle(e);
    sluice_curl_loop_destroy(loop);
    sluice_chat_destroy(chat);
    sluice_engine_destroy(e);
}
