/*
 * stream_service.c — examples/stream_server.c (a streaming chat service on
 * libuv, each request one sluice_chat_submit on the curl loop) driven by
 * real HTTP clients, in front of sluice-provider-sim --stream. It checks
 * what the service promises its clients, not how fast: a reply streams in
 * pieces and ends with [DONE]; a burst beyond capacity is answered 503
 * while the admitted streams still run; a client that hangs up cancels the
 * call at the provider; a first token that cannot come by the start
 * deadline is a 504.
 */
#define _GNU_SOURCE /* before any system header: curl_fixture.h wants it */
#include "stream_server_process.h"

#include "e2e/curl_fixture.h"

static struct sim_process server;

static void setup(void)
{
    fx_setup();
}

static void teardown(void)
{
    int status = sim_process_stop(&server);
    fx_teardown();
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the server did not exit cleanly on SIGTERM (wait status 0x%x)", (unsigned)status);
}

/* The simulator as provider `p`, then the server in front of it with `flags`. */
static void start(const struct fx_provider *p, const char *const flags[])
{
    fx_start(p);
    cr_assert_eq(stream_server_start(&server, &fx_sim, flags), 0, "the server did not start");
}

/* One client request and what came back. */
struct client {
    CURL *easy;
    char body[8192];
    size_t len;
    int pieces;          /* write callbacks with data */
    int hang_up_after;   /* hang up after this many pieces (0 = never) */
    long code;
    CURLcode result;
};

static size_t client_write(char *data, size_t size, size_t n, void *ctx)
{
    struct client *c = ctx;
    size_t bytes = size * n, keep = bytes < sizeof c->body - 1 - c->len ? bytes : sizeof c->body - 1 - c->len;
    memcpy(c->body + c->len, data, keep);
    c->len += keep;
    c->body[c->len] = '\0';
    c->pieces += bytes > 0;
    return c->hang_up_after && c->pieces >= c->hang_up_after ? 0 : bytes; /* 0: curl hangs up */
}

static void client_init(struct client *c, const char *path)
{
    char url[128];
    memset(c, 0, sizeof *c);
    c->easy = curl_easy_init();
    cr_assert_not_null(c->easy);
    curl_easy_setopt(c->easy, CURLOPT_URL, sim_process_url(&server, path, url, sizeof url));
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, client_write);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, 20000L); /* a hang fails, not stalls */
}

static void client_finish(struct client *c, CURLcode result)
{
    c->result = result;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->code);
    curl_easy_cleanup(c->easy);
    c->easy = NULL;
}

static void client_get(struct client *c, const char *path)
{
    client_init(c, path);
    client_finish(c, curl_easy_perform(c->easy));
}

/* The server's counter `key` from GET /status. */
static long server_counter(const char *key)
{
    struct client c;
    client_get(&c, "/status");
    cr_assert_eq(c.code, 200, "GET /status: %ld", c.code);
    json_t *root = json_loads(c.body, 0, NULL);
    cr_assert_not_null(root, "/status is not JSON: %s", c.body);
    long v = fx_json_long(root, key);
    json_decref(root);
    return v;
}

static int count_of(const char *haystack, const char *needle)
{
    int n = 0;
    for (const char *at = strstr(haystack, needle); at; at = strstr(at + 1, needle))
        n++;
    return n;
}

/* Per-test .init/.fini: the TSan build's Criterion stand-in has no TestSuite. */
#define SERVICE_TEST(name) Test(stream_service, name, .init = setup, .fini = teardown, .timeout = 60)

SERVICE_TEST(a_reply_streams_in_pieces_and_ends_with_done)
{
    start(&(struct fx_provider){.mode = "reject", .cap = 12, .median_ms = 50, .fixed_latency = true,
                                .stream = true, .answer_tokens = 8, .fixed_answer = true,
                                .token_ms = 30},
          NULL);
    struct client c;
    client_get(&c, "/chat?q=hello");
    cr_assert_eq(c.result, CURLE_OK, "%s", curl_easy_strerror(c.result));
    cr_assert_eq(c.code, 200);
    cr_assert_gt(c.pieces, 1, "the reply came in one piece: %s", c.body);
    cr_assert_eq(count_of(c.body, "data: "), 8 + 1, "8 tokens and [DONE]: %s", c.body);
    cr_assert_not_null(strstr(c.body, "data: [DONE]\n\n"), "no [DONE]: %s", c.body);
    cr_assert_eq(server_counter("served"), 1);
}

/* With the gate fixed at 2 and no waiting, 8 requests at once: the 2 admitted stream for
 * two seconds while the other 6 are answered 503, each before any stream has ended. */
SERVICE_TEST(a_burst_beyond_capacity_is_refused_while_the_admitted_streams_run)
{
    enum { N = 8, FIXED = 2 };
    start(&(struct fx_provider){.mode = "reject", .cap = 12, .median_ms = 50, .fixed_latency = true,
                                .stream = true, .answer_tokens = 20, .fixed_answer = true,
                                .token_ms = 100},
          (const char *[]){"--fixed", "2", NULL});
    static struct client c[N];
    CURLM *multi = curl_multi_init();
    for (int i = 0; i < N; i++) {
        client_init(&c[i], "/chat?q=hi");
        curl_easy_setopt(c[i].easy, CURLOPT_PRIVATE, &c[i]);
        curl_multi_add_handle(multi, c[i].easy);
    }
    int running = N, ok = 0, refused = 0, refused_after_a_stream = 0;
    while (running) {
        curl_multi_perform(multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(multi, &left))) {
            struct client *done;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&done);
            curl_multi_remove_handle(multi, m->easy_handle);
            client_finish(done, m->data.result);
            cr_assert_eq(done->result, CURLE_OK, "%s", curl_easy_strerror(done->result));
            ok += done->code == 200;
            refused += done->code == 503;
            refused_after_a_stream += done->code == 503 && ok > 0;
        }
        if (running)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    curl_multi_cleanup(multi);
    cr_assert_eq(ok, FIXED, "%d streams served", ok);
    cr_assert_eq(refused, N - FIXED, "%d refused", refused);
    cr_assert_eq(refused_after_a_stream, 0, "a refusal waited for a stream to end");
    cr_assert_eq(server_counter("refused"), N - FIXED);
}

/* Ten clients in turn hang up mid-stream while the server is writing a token a millisecond:
 * each call is cancelled at the provider, and writing to the closed sockets does not kill
 * the server (the teardown asserts its clean exit). */
SERVICE_TEST(a_client_that_hangs_up_cancels_the_call_at_the_provider)
{
    enum { HANG_UPS = 10 };
    start(&(struct fx_provider){.mode = "reject", .cap = 12, .median_ms = 50, .fixed_latency = true,
                                .stream = true, .stream_endless = true, .token_ms = 1},
          NULL);
    for (int i = 0; i < HANG_UPS; i++) {
        struct client c;
        client_init(&c, "/chat?q=hi");
        c.hang_up_after = 2;
        client_finish(&c, curl_easy_perform(c.easy));
        cr_assert_eq(c.result, CURLE_WRITE_ERROR, "the client did not hang up: %s",
                     curl_easy_strerror(c.result));
    }
    int64_t give_up = fx_now_ms() + 5000;
    while (fx_stats().cancelled < HANG_UPS && fx_now_ms() < give_up)
        fx_sleep_ms(10);
    cr_assert_eq(fx_stats_settled().cancelled, HANG_UPS, "the provider did not see every call end");
    cr_assert_eq(server_counter("cancelled"), HANG_UPS);
}

/* The provider takes 5 s to its first token; the start deadline is 300 ms and the call's is
 * the default minute: the client gets 504 and the provider sees the call abandoned. */
SERVICE_TEST(no_first_token_by_the_start_deadline_is_a_504)
{
    start(&(struct fx_provider){.mode = "reject", .cap = 12, .median_ms = 5000,
                                .fixed_latency = true, .stream = true},
          (const char *[]){"--start-ms", "300", NULL});
    struct client c;
    client_get(&c, "/chat?q=hi");
    cr_assert_eq(c.result, CURLE_OK, "%s", curl_easy_strerror(c.result));
    cr_assert_eq(c.code, 504, "HTTP %ld: %s", c.code, c.body);
    cr_assert_eq(server_counter("timeouts"), 1);
    cr_assert_eq(fx_stats_settled().cancelled, 1, "the provider still runs the call");
}
