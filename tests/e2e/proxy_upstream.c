/*
 * sluice-proxy's upstream side: a stream the provider ends with an error
 * event (a rate limit mid-stream) reaches the client as sent while the pool,
 * discovery and the access log hear the call as the error it stands for;
 * an error answer (a 429's insufficient_quota, a 503's overloaded_error) is
 * heard by its body, its bytes unchanged; and the header fields a Connection
 * header names are this hop's only, in
 * the request and in the answer (RFC 9110 7.6.1).
 * Upstreams: the simulator (its --stream-fail-after error event), a canned
 * server below (one answer per path, in each provider's shape), and the
 * fixture's echo server (its answer is the request the proxy sent).
 */
#include "proxy_fixture.h"
#include "e2e/curl_loopback.h"
#include "tls_fixture.h"

#define NODE "cloud:up"

static char log_path[128];

static void setup(void)
{
    px_dir_setup("upstream");
    snprintf(log_path, sizeof log_path, "%s/access.log", px_dir);
}

TestSuite(proxy_upstream, .init = setup, .fini = px_dir_teardown, .timeout = 60);

/* The proxy in front of 127.0.0.1:port, its access log at log_path, with `extra` flags
 * (NULL-terminated, or NULL). */
static void start_proxy_with(int port, const char *const *extra)
{
    char upstream[64];
    snprintf(upstream, sizeof upstream, "http://127.0.0.1:%d", port);
    const char *args[32] = {"--upstream", upstream, "--node",       NODE,     "--state",
                            "off",        "--access-log", log_path};
    int n = 8;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert_eq(px_start(&px_main, args), 0, "sluice-proxy did not start");
}

static void start_proxy(int port)
{
    start_proxy_with(port, NULL);
}

/* The whole access log, once the proxy has stopped (it is flushed at exit). */
static void read_log(char *text, size_t size)
{
    px_stop(&px_main);
    FILE *f = fopen(log_path, "r");
    cr_assert_not_null(f, "no access log at %s", log_path);
    size_t n = fread(text, 1, size - 1, f);
    text[n] = '\0';
    fclose(f);
}

static long node_count(const char *key)
{
    return px_node_count(&px_main, NODE, key);
}

/* Anthropic's overloaded_error held the node's new calls: a platform `hold` event. */
static void assert_platform_hold(void)
{
    char events[8192];
    px_admin_get(&px_main, "/compute/concurrency/events?node_id=" NODE, events, sizeof events);
    cr_assert_not_null(strstr(events, "\"event\":\"hold\",\"reason\":\"platform\""),
                       "Anthropic's overloaded_error holds new calls: %s", events);
}

static const char stream_body[] =
    "{\"model\":\"sim\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

/* ---- an error event mid-stream ------------------------------------------------------------ */

Test(proxy_upstream, a_429_error_event_mid_stream_reaches_the_client_and_is_a_refusal_upstream)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 5, .stream = true,
                                   .stream_fail_after = 2, .answer_tokens = 10,
                                   .fixed_answer = true, .token_ms = 1});
    start_proxy(fx_sim.port);
    struct px_reply r;
    px_request(&px_main, "/v1/chat/completions", stream_body, NULL, &r);
    cr_assert_eq(r.code, CURLE_OK, "%s", curl_easy_strerror(r.code));
    cr_assert_eq(r.status, 200, "the status line was out before the error: %ld", r.status);
    cr_assert_not_null(strstr(r.body, "chat.completion.chunk"), "the tokens came: %s", r.body);
    cr_assert_not_null(strstr(r.body, "\"error\":{\"code\":429"),
                       "the error event came as the provider sent it: %s", r.body);
    /* The pool heard a refusal, as from a 429 answer, and no success. */
    cr_assert_eq(node_count("overloads_total"), 1, "the pool did not count the refusal");
    cr_assert_eq(node_count("requests_total"), 1);
    char text[4096];
    read_log(text, sizeof text);
    cr_assert_not_null(strstr(text, "\"POST /v1/chat/completions\" 200 overloaded "),
                       "the access log says what the call was: %s", text);
}

/*
 * A loopback server (px_serve) with one canned answer per path (struct canned), sent
 * whole and then closed (an answer without Content-Length ends at the close),
 * or held open (canned_hold: a chunked answer whose last chunk never comes).
 * An answer may fall silent for canned_pause_ms where it holds CANNED_PAUSE.
 * A thread per connection; it lives until the test process ends.
 */
struct canned {
    const char *path, *answer;
};

#define CANNED_PAUSE "\x1f"

static const struct canned *canned_table;
static bool canned_hold; /* a connection stays open after its answer, until the proxy closes it */
static int canned_pause_ms;

/* `answer`, silent at each CANNED_PAUSE; the proxy may cut the connection in one (no SIGPIPE). */
static void canned_send(int fd, const char *answer)
{
    for (;;) {
        size_t n = strcspn(answer, CANNED_PAUSE);
        if (send(fd, answer, n, MSG_NOSIGNAL) < 0)
            return;
        if (!answer[n])
            return;
        nanosleep(&(struct timespec){canned_pause_ms / 1000, canned_pause_ms % 1000 * 1000000L},
                  NULL);
        answer += n + 1;
    }
}

static void *canned_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[16384];
    size_t len = 0;
    const char *end = NULL;
    while (len + 1 < sizeof buf) { /* the head and its body (Content-Length) */
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
        const char *cl = end ? strcasestr(buf, "\r\ncontent-length:") : NULL;
        if (end && (size_t)(end + 4 - buf) + (cl && cl < end ? (size_t)atol(cl + 17) : 0) <= len)
            break;
    }
    const char *path = strchr(buf, ' ');
    for (const struct canned *c = canned_table; end && path && c->path; c++)
        if (!strncmp(path + 1, c->path, strlen(c->path)) && path[1 + strlen(c->path)] == ' ') {
            canned_send(fd, c->answer);
            break;
        }
    if (!canned_hold)
        shutdown(fd, SHUT_WR);
    while (read(fd, buf, sizeof buf) > 0) /* until the proxy closes: no reset */
        ;
    close(fd);
    return NULL;
}

/* Serve `table` (ended by a row with a NULL path); the port. */
static int canned_start(const struct canned *table)
{
    canned_table = table;
    return px_serve(canned_conn);
}

/* A stream's head, with `fields` ("Name: value\r\n" each) in it. */
#define SSE_HEAD_WITH(fields)                                                                      \
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" fields "Connection: close\r\n\r\n"
#define SSE_HEAD SSE_HEAD_WITH("")
#define CHUNK(text) "data: {\"choices\":[{\"delta\":{\"content\":\"" text "\"}}]}\n\n"

/* Each provider's way to fail a stream, and the kind of call each is. */
static const struct canned shapes[] = {
    /* A word "error" in a chunk is no error. */
    {"/ok", SSE_HEAD CHUNK("error") "data: [DONE]\n\n"},
    /* OpenAI: the error object in a chunk's place, its code a name; its x-request-id. */
    {"/openai", SSE_HEAD_WITH("x-request-id: req_0penai1\r\n") CHUNK("Hi") "data: {\"error\":{\"message\":\"Rate limit reached\","
                                     "\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n"},
    /* An error that names no refusal: the provider failed the call. */
    {"/broken", SSE_HEAD CHUNK("Hi") "data: {\"error\":{\"message\":\"boom\","
                                     "\"type\":\"server_error\",\"code\":null}}\n\n"},
    /* Anthropic: `event: error` with its overloaded_error, a platform overload; its
     * request-id, white space around it. */
    {"/anthropic", SSE_HEAD_WITH("request-id:\t req_011Anthropic \r\n") "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
                   "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                   "\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"},
    {NULL, NULL},
};

Test(proxy_upstream, each_providers_error_event_is_logged_and_counted_as_the_error_it_stands_for)
{
    start_proxy(canned_start(shapes));
    for (const struct canned *c = shapes; c->path; c++) {
        char path[64];
        snprintf(path, sizeof path, "%s", c->path);
        struct px_reply r;
        px_request(&px_main, path, stream_body, NULL, &r);
        cr_assert_eq(r.code, CURLE_OK, "%s: %s", path, curl_easy_strerror(r.code));
        cr_assert_eq(r.status, 200, "%s", path);
        const char *sent = strstr(c->answer, "\r\n\r\n") + 4;
        cr_assert_str_eq(r.body, sent, "%s: the client got other bytes", path);
    }
    cr_assert_eq(node_count("requests_total"), 4);
    cr_assert_eq(node_count("overloads_total"), 1, "only OpenAI's rate limit is a cap refusal");
    assert_platform_hold();
    char text[8192];
    read_log(text, sizeof text);
    /* Each line ends with the body's model and the provider's request id, what an SDK's error
     * shows ("-" when the answer had none). */
    static const struct {
        const char *call, *end;
    } lines[] = {
        {"\"POST /ok\" 200 success ", " model=sim request_id=-\n"},
        {"\"POST /openai\" 200 overloaded ", " model=sim request_id=req_0penai1\n"},
        {"\"POST /broken\" 200 server_error ", " model=sim request_id=-\n"},
        {"\"POST /anthropic\" 200 platform_overload ", " model=sim request_id=req_011Anthropic\n"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        const char *line = strstr(text, lines[i].call), *nl = line ? strchr(line, '\n') : NULL;
        size_t n = strlen(lines[i].end);
        cr_expect(nl && (size_t)(nl + 1 - line) >= n && !strncmp(nl + 1 - n, lines[i].end, n),
                  "no %s...%s in the access log: %s", lines[i].call, lines[i].end, text);
    }
}

/* A stream that sends an error event and then breaks off (its chunked body never finished). */
static const struct canned cut_after_error[] = {
    {"/cut", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nx-request-id: req_\"cut\"\r\n"
             "Transfer-Encoding: chunked\r\n\r\n"
             "61\r\ndata: {\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\","
             "\"code\":\"rate_limit_exceeded\"}}\n\n\r\n"},
    {NULL, NULL},
};

Test(proxy_upstream, a_stream_cut_after_an_error_event_is_logged_as_that_error)
{
    start_proxy_with(canned_start(cut_after_error), (const char *const[]){"--log-json", NULL});
    struct px_reply r;
    px_request(&px_main, "/cut", stream_body, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_neq(r.code, CURLE_OK, "the client saw the cut");
    cr_assert_not_null(strstr(r.body, "rate_limit_exceeded"), "the event came: %s", r.body);
    cr_assert_eq(node_count("overloads_total"), 1, "the pool heard the rate limit");
    char text[4096];
    read_log(text, sizeof text);
    /* One JSON object: what the pool heard, the body's model and the provider's request id
     * (escaped). */
    json_error_t err;
    json_t *line = json_loads(text, JSON_DISABLE_EOF_CHECK, &err);
    cr_assert_not_null(line, "%s: %s", err.text, text);
    cr_expect_str_eq(json_string_value(json_object_get(line, "path")), "/cut", "%s", text);
    cr_expect_eq(json_integer_value(json_object_get(line, "status")), 200, "%s", text);
    cr_expect_str_eq(json_string_value(json_object_get(line, "outcome")), "overloaded",
                     "the log says what the pool heard: %s", text);
    cr_expect_str_eq(json_string_value(json_object_get(line, "model")), "sim", "%s", text);
    cr_expect_str_eq(json_string_value(json_object_get(line, "request_id")), "req_\"cut\"",
                     "%s", text);
    cr_expect(json_is_number(json_object_get(line, "ttfb_ms")), "the stream's first byte: %s",
              text);
    json_decref(line);
}

/* ---- after [DONE] ----------------------------------------------------------------------------- */

/* A stream whose [DONE] comes and whose body's end (its last chunk) does not; and one whose
 * [DONE] does not come either. */
static const struct canned done_then_held[] = {
    {"/held", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
              "Transfer-Encoding: chunked\r\n\r\n"
              "3e\r\n" CHUNK("Hi") "data: [DONE]\n\n\r\n"},
    {"/unfinished", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n"
                    "30\r\n" CHUNK("Hi") "\r\n"},
    {NULL, NULL},
};

/* The OpenAI SDKs stop reading at [DONE] and close, often before the body's last chunk, a
 * packet of its own, has come: the call was a success, not a cancel whose permit lingers. A
 * client still there when its deadline comes after the [DONE] gets the answer's end, and the
 * call is no timeout either. */
/* A raw client's streamed call to `path`, sent whole; the connection's fd. */
static int raw_call(const char *path)
{
    int fd = px_connect(&px_main);
    char req[512];
    snprintf(req, sizeof req,
             "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             path, strlen(stream_body), stream_body);
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    return fd;
}

/* A streamed call to `path` by a client that hangs up as soon as `last` (its answer's last
 * event) has come; then the pool heard one call, a success: no cancel, no lingering permit. */
static void hang_up_at(const char *path, const char *last)
{
    int fd = raw_call(path);
    char got[4096];
    size_t len = 0;
    got[0] = '\0';
    while (!strstr(got, last) && len + 1 < sizeof got) {
        ssize_t n = read(fd, got + len, sizeof got - 1 - len);
        cr_assert_gt(n, 0, "the proxy closed before %s: %s", last, got);
        len += (size_t)n;
        got[len] = '\0';
    }
    close(fd);
    WAIT_UNTIL(node_count("requests_total") == 1);
    cr_assert_eq(node_count("cancels_total"), 0, "the call was heard as a cancel");
    cr_assert_eq(node_count("lingered_total"), 0, "its permit lingered");
    cr_assert_eq(node_count("in_flight"), 0);
}

Test(proxy_upstream, a_client_that_hangs_up_after_done_had_a_successful_call)
{
    canned_hold = true;
    start_proxy(canned_start(done_then_held));
    hang_up_at("/held", "data: [DONE]");

    struct px_reply r;
    px_request(&px_main, "/held", stream_body, "X-Sluice-Deadline-Ms: 500", &r);
    cr_assert_eq(r.code, CURLE_OK, "the answer was cut: %s", curl_easy_strerror(r.code));
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body, "data: [DONE]"), "%s", r.body);
    cr_assert_eq(node_count("requests_total"), 2);
    cr_assert_eq(node_count("timeouts_total"), 0, "the call was heard as a timeout");
    /* Without its [DONE] (after calls that had one) the deadline still cuts the stream. */
    px_request(&px_main, "/unfinished", stream_body, "X-Sluice-Deadline-Ms: 500", &r);
    cr_assert_neq(r.code, CURLE_OK, "a stream the deadline cut looks whole: %s", r.body);
    cr_assert_eq(node_count("timeouts_total"), 1);
    char text[4096];
    read_log(text, sizeof text);
    const char *first = strstr(text, "\"POST /held\" 200 success ");
    cr_assert_not_null(first, "the access log says what the pool heard: %s", text);
    cr_assert_not_null(strstr(first + 1, "\"POST /held\" 200 success "), "%s", text);
}

/* Anthropic's Messages API ends a stream with message_stop, no [DONE]; its body's end does not
 * come. */
static const char anthropic_stop[] =
    "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
    "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
    "{\"stop_reason\":\"end_turn\"}}\n\n"
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/* Its SDKs, like OpenAI's, may hang up at the stream's last event: the call was a success. */
Test(proxy_upstream, a_client_that_hangs_up_after_message_stop_had_a_successful_call)
{
    char answer[1024];
    snprintf(answer, sizeof answer,
             "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n",
             strlen(anthropic_stop), anthropic_stop);
    static struct canned held[] = {{"/v1/messages", NULL}, {NULL, NULL}};
    held[0].answer = answer;
    canned_hold = true;
    start_proxy(canned_start(held));
    hang_up_at("/v1/messages", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    char text[4096];
    read_log(text, sizeof text);
    cr_assert_not_null(strstr(text, "\"POST /v1/messages\" 200 success "),
                       "the access log says what the pool heard: %s", text);
}

/* ---- an error answer's body ---------------------------------------------------------------- */

/* Refusals that only their body tells apart from the cap's (no Content-Length: each ends at the
 * close, and reaches the client re-chunked). */
static const struct canned error_bodies[] = {
    /* OpenAI: out of credit. Retrying moves nothing; it is no sign of the cap. */
    {"/quota", "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n\r\n"
               "{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":"
               "\"insufficient_quota\",\"param\":null,\"code\":\"insufficient_quota\"}}"},
    /* Anthropic: the platform is overloaded, whoever calls. */
    {"/overloaded", "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\r\n"
                    "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                    "\"message\":\"Overloaded\"}}"},
    {NULL, NULL},
};

Test(proxy_upstream, a_plain_error_answer_is_classified_by_its_body_and_passes_unchanged)
{
    start_proxy(canned_start(error_bodies));
    static const long statuses[] = {429, 503};
    for (size_t i = 0; error_bodies[i].path; i++) {
        const struct canned *c = &error_bodies[i];
        struct px_reply r;
        px_request(&px_main, c->path, stream_body, NULL, &r);
        cr_assert_eq(r.code, CURLE_OK, "%s: %s", c->path, curl_easy_strerror(r.code));
        cr_assert_eq(r.status, statuses[i], "%s: %s", c->path, r.body);
        const char *sent = strstr(c->answer, "\r\n\r\n") + 4;
        cr_assert_str_eq(r.body, sent, "%s: the client got other bytes", c->path);
    }
    cr_assert_eq(node_count("requests_total"), 2);
    cr_assert_eq(node_count("overloads_total"), 0,
                 "neither is the cap's refusal: no overload may back discovery off");
    assert_platform_hold();
    char text[8192];
    read_log(text, sizeof text);
    cr_expect_not_null(strstr(text, "\"POST /quota\" 429 quota "), "%s", text);
    cr_expect_not_null(strstr(text, "\"POST /overloaded\" 503 platform_overload "), "%s", text);
}

/* A client that reads slowly: its receive buffer as small as the kernel allows. */
static int small_rcvbuf(void *ctx, curl_socket_t fd, curlsocktype purpose)
{
    (void)ctx;
    (void)purpose;
    int size = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    return CURL_SOCKOPT_OK;
}

/* An error body far past what the proxy keeps unsent (OUT_HIGH, 256 KiB) to a client with a
 * small window: the transfer pauses and resumes through the loop's reader of error bodies, and
 * every byte arrives once, in order. */
Test(proxy_upstream, a_long_error_body_to_a_slow_client_arrives_whole_and_is_classified)
{
    enum { FILL = 4 << 20 };
    static const char head[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                               "application/json\r\n\r\n",
                      open[] = "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                               "\"message\":\"",
                      close_[] = "\"}}";
    size_t body_len = strlen(open) + FILL + strlen(close_);
    char *answer = malloc(strlen(head) + body_len + 1);
    cr_assert_not_null(answer);
    char *body = answer + strlen(head), *p = body + strlen(open);
    memcpy(answer, head, strlen(head));
    memcpy(body, open, strlen(open));
    for (size_t i = 0; i < FILL; i++) /* no run of equal bytes: a repeat or a gap shows */
        p[i] = (char)('a' + i % 23);
    memcpy(p + FILL, close_, strlen(close_) + 1);
    static struct canned long_error[] = {{"/long", NULL}, {NULL, NULL}};
    long_error[0].answer = answer;
    start_proxy(canned_start(long_error));
    char *got = malloc(body_len + 1);
    struct px_sink sink = {.buf = got, .size = body_len + 1};
    struct px_reply r;
    CURL *e = px_easy(&px_main, "/long", stream_body, NULL, &r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, px_sink_put);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, small_rcvbuf);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 1024L);
    r.code = curl_easy_perform(e);
    px_finish(e, &r);
    cr_assert_eq(r.code, CURLE_OK, "%s", curl_easy_strerror(r.code));
    cr_assert_eq(r.status, 503);
    cr_assert_eq(sink.len, body_len, "%zu of %zu bytes", sink.len, body_len);
    cr_assert(!memcmp(got, body, body_len), "the client got other bytes");
    free(got);
    cr_assert_eq(node_count("overloads_total"), 0, "a platform overload, not the cap's");
    char text[4096];
    read_log(text, sizeof text);
    cr_expect_not_null(strstr(text, "\"POST /long\" 503 platform_overload "), "%s", text);
    free(answer);
}

/* ---- the proxy's own answers in the access log --------------------------------------------- */

/* An upstream that takes the request and answers nothing, its connection held. */
static const struct canned silent[] = {{"/silent", ""}, {NULL, NULL}};

/* The bytes= of the access log's line that holds `what`. */
static long logged_bytes(const char *text, const char *what)
{
    const char *line = strstr(text, what);
    cr_assert_not_null(line, "no %s in the access log: %s", what, text);
    const char *bytes = strstr(line, " bytes="), *eol = strchr(line, '\n');
    cr_assert(bytes && (!eol || bytes < eol), "no bytes= on its line: %s", line);
    return atol(bytes + 7);
}

/* The proxy's own 503 and 504 are logged with the body bytes it sent, as a provider's answer
 * is: not 0; and they carry a Date, as a provider's answer does. */
Test(proxy_upstream, the_proxys_own_refusals_carry_a_date_and_log_the_bytes_they_sent)
{
    canned_hold = true;
    start_proxy_with(canned_start(silent),
                     (const char *const[]){"--no-discovery", "--active", "1", "--waiting", "1",
                                           NULL});
    int busy = raw_call("/silent"); /* the one slot, taken until it hangs up */
    WAIT_UNTIL(node_count("in_flight") == 1);
    struct px_reply late, refused;
    px_request(&px_main, "/silent", stream_body, "X-Sluice-Deadline-Ms: 100", &late);
    cr_assert_eq(late.status, 504, "%s", late.body);
    int queued = raw_call("/silent"); /* the one place in the queue */
    WAIT_UNTIL(node_count("waiting") == 1);
    px_request(&px_main, "/silent", stream_body, NULL, &refused);
    cr_assert_eq(refused.status, 503, "%s", refused.body);
    /* An origin server with a clock sends Date (RFC 9110 6.6.1), as IMF-fixdate. */
    char date[64];
    struct tm tm;
    cr_assert_not_null(px_header(&refused, "Date", date, sizeof date), "%s", refused.headers);
    const char *end = strptime(date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    cr_assert(end && !*end, "not an IMF-fixdate: '%s'", date);
    close(queued);
    close(busy);
    char text[8192];
    read_log(text, sizeof text);
    cr_assert_gt(late.body_len, 0);
    cr_assert_eq(logged_bytes(text, "\" 504 deadline_queue "), (long)late.body_len, "%s", text);
    cr_assert_eq(logged_bytes(text, "\" 503 capacity "), (long)refused.body_len, "%s", text);
}

/* A client that hangs up while its call is queued: the pool counts a cancel, as
 * sluice_cancels_total's help says ("token fired while queued"), and its access log line says
 * 499 client_gone. */
Test(proxy_upstream, a_client_that_hangs_up_while_queued_is_counted_as_a_cancel)
{
    canned_hold = true;
    start_proxy_with(canned_start(silent),
                     (const char *const[]){"--no-discovery", "--active", "1", NULL});
    int busy = raw_call("/silent"); /* the one slot, taken until it hangs up */
    WAIT_UNTIL(node_count("in_flight") == 1);
    int queued = raw_call("/silent");
    WAIT_UNTIL(node_count("waiting") == 1);
    close(queued);
    WAIT_UNTIL(node_count("waiting") == 0);
    cr_assert_eq(node_count("cancels_total"), 1, "the queued call's hang-up is not counted");
    char metrics[65536];
    px_admin_get(&px_main, "/metrics", metrics, sizeof metrics);
    cr_assert_not_null(strstr(metrics, "sluice_cancels_total{node=\"" NODE "\"} 1"), "%s",
                       strstr(metrics, "sluice_cancels_total") ?: metrics);
    close(busy);
    WAIT_UNTIL(node_count("in_flight") == 0);
    char text[8192];
    read_log(text, sizeof text);
    const char *gone = strstr(text, "\" 499 client_gone ");
    cr_assert_not_null(gone, "%s", text);
    cr_assert_not_null(strstr(gone, " ttfb=- duration="), "no byte went out, no time to it: %s",
                       gone);
}

/* ---- an upstream that falls silent --------------------------------------------------------- */

/* Silent for 10 times --upstream-idle-ms, before its head and after its first event; it
 * speaks again after that, so a cut that comes late (libcurl's low-speed limit cut 1000 ms
 * of silence after 3 s, mid-stream after 7) lets its late words through. */
#define SILENT_IDLE_MS 200
static const struct canned falls_silent[] = {
    {"/before", CANNED_PAUSE SSE_HEAD CHUNK("late") "data: [DONE]\n\n"},
    {"/within", SSE_HEAD CHUNK("Hi") CANNED_PAUSE CHUNK("late") "data: [DONE]\n\n"},
    {NULL, NULL},
};

Test(proxy_upstream, a_silent_upstream_is_cut_after_the_idle_setting_before_it_speaks_again)
{
    canned_hold = true;
    canned_pause_ms = 10 * SILENT_IDLE_MS;
    char idle[16];
    snprintf(idle, sizeof idle, "%d", SILENT_IDLE_MS);
    start_proxy_with(canned_start(falls_silent),
                     (const char *const[]){"--upstream-idle-ms", idle, NULL});
    struct px_reply before, within;
    int64_t t0 = fx_now_ms();
    px_request(&px_main, "/before", stream_body, NULL, &before);
    int64_t waited = fx_now_ms() - t0;
    cr_assert_eq(before.status, 502, "cut before its head: %s", before.body);
    px_assert_error_body(&before, "upstream_silent");
    cr_assert_not_null(strstr(before.body, "cut at sluice-proxy --upstream-idle-ms 200"),
                       "the 502 names the flag and its value: %s", before.body);
    /* Never early: the request went out after t0, and its silence is counted from there. */
    cr_assert_geq(waited, SILENT_IDLE_MS, "cut after %lld ms", (long long)waited);
    px_request(&px_main, "/within", stream_body, NULL, &within);
    cr_assert_eq(within.status, 200, "the head was out before the silence");
    cr_assert_neq(within.code, CURLE_OK, "the answer is cut, not complete-looking");
    cr_assert_not_null(strstr(within.body, "Hi"), "the first event came: %s", within.body);
    cr_assert_null(strstr(within.body, "late"), "cut after its late words: %s", within.body);
    /* The pool heard two provider timeouts (an overload, as discovery counts them), not
     * cancels; the permits came back. */
    cr_assert_eq(node_count("overloads_total"), 2);
    cr_assert_eq(node_count("cancels_total"), 0);
    cr_assert_eq(node_count("in_flight"), 0);
    char text[8192];
    read_log(text, sizeof text);
    cr_assert_not_null(strstr(text, "\"POST /before\" 502 upstream_silent "), "%s", text);
    cr_assert_not_null(strstr(text, "\"POST /within\" 200 cut_upstream_silent "), "%s", text);
}

/* ---- a request body the upstream takes slowly ---------------------------------------------- */

/* An upstream that reads a request body of SLOW_BODY bytes a piece at a time, SLOW_GAP_MS
 * apart, and answers once it has the whole: taking it lasts several times SLOW_IDLE_MS (the
 * kernel's socket buffers hold a few MiB of it), while the proxy's sends stay a few ms apart.
 * Cut as silent before the fix (the idle clock counted only bytes received). */
#define SLOW_IDLE_MS 250
#define SLOW_GAP_MS 2
#define SLOW_PIECE (64 * 1024)
#define SLOW_BODY (24u << 20)

static void *slow_reader_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    static __thread char buf[SLOW_PIECE];
    size_t len = 0, body = 0;
    char *end = NULL;
    while (!end && len < sizeof buf) { /* the head, and the body's first bytes after it */
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        end = memmem(buf, len, "\r\n\r\n", 4);
    }
    if (end)
        body = len - (size_t)(end + 4 - buf);
    while (end && body < SLOW_BODY) {
        nanosleep(&(struct timespec){0, SLOW_GAP_MS * 1000000L}, NULL);
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        body += (size_t)n;
    }
    static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 "Content-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}";
    if (body == SLOW_BODY)
        send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    while (read(fd, buf, sizeof buf) > 0) /* until the proxy closes: no reset */
        ;
    close(fd);
    return NULL;
}

Test(proxy_upstream, a_request_body_the_upstream_takes_slowly_is_not_its_silence)
{
    char idle[16], max_body[16];
    snprintf(idle, sizeof idle, "%d", SLOW_IDLE_MS);
    snprintf(max_body, sizeof max_body, "%u", SLOW_BODY);
    start_proxy_with(px_serve(slow_reader_conn),
                     (const char *const[]){"--upstream-idle-ms", idle, "--max-body-bytes",
                                           max_body, NULL});
    static const char head[] = "{\"model\":\"sim\",\"pad\":\"", tail[] = "\"}";
    char *body = malloc(SLOW_BODY + 1);
    cr_assert_not_null(body);
    memset(body, 'x', SLOW_BODY);
    memcpy(body, head, sizeof head - 1);
    memcpy(body + SLOW_BODY - (sizeof tail - 1), tail, sizeof tail);
    struct px_reply r;
    px_request(&px_main, "/v1/chat/completions", body, NULL, &r);
    free(body);
    cr_assert_eq(r.status, 200, "the upstream was taking the body, not silent: %s", r.body);
    cr_assert_str_eq(r.body, "{\"ok\":true}");
    cr_assert_eq(node_count("overloads_total"), 0, "no provider timeout was heard");
}

/* ---- hop-by-hop fields a Connection header names ------------------------------------------ */

Test(proxy_upstream, fields_the_clients_connection_header_names_do_not_go_upstream)
{
    start_proxy(px_echo_start());
    struct curl_slist *h = curl_slist_append(NULL, "X-Hop-Before: dropped");
    h = curl_slist_append(h, "Connection: keep-alive, X-Hop-Before ,x-hop-after");
    h = curl_slist_append(h, "X-Hop-After: dropped");
    h = curl_slist_append(h, "X-Kept: kept");
    h = curl_slist_append(h, "Content-Type: application/json");
    struct px_reply r;
    CURL *e = px_easy(&px_main, "/v1/chat/completions", FX_REQUEST, h, &r);
    r.code = curl_easy_perform(e);
    px_finish(e, &r);
    curl_slist_free_all(h);
    cr_assert_eq(r.status, 200, "%s", r.body);
    /* The echo's body is the request the proxy sent. */
    cr_assert_not_null(strstr(r.body, "\r\nX-Kept: kept\r\n"), "%s", r.body);
    cr_assert_null(strcasestr(r.body, "x-hop-before"), "a field before its naming: %s", r.body);
    cr_assert_null(strcasestr(r.body, "x-hop-after"), "a field after its naming: %s", r.body);
    cr_assert_null(strcasestr(r.body, "\r\nconnection:"), "%s", r.body);
}

/* The answer is read on the way (an error body, a stream's events): the provider must not
 * compress it, whatever the client accepts (the OpenAI Node SDK sends gzip, deflate). */
Test(proxy_upstream, the_clients_accept_encoding_does_not_go_upstream)
{
    start_proxy(px_echo_start());
    struct px_reply r;
    px_request(&px_main, "/v1/chat/completions", FX_REQUEST, "Accept-Encoding: gzip, deflate", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_null(strcasestr(r.body, "\r\naccept-encoding:"), "%s", r.body);
}

static const struct canned hops[] = {
    {"/named", "HTTP/1.1 200 OK\r\nX-Hop-Before: dropped\r\nContent-Type: text/plain\r\n"
               "Connection: close, X-Hop-Before\r\nconnection:\tx-hop-after \r\n"
               "X-Hop-After: dropped\r\nX-Kept: kept\r\nContent-Length: 5\r\n\r\nhello"},
    /* A Content-Length only for this hop: the answer goes on re-chunked, whole. */
    {"/length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: Content-Length\r\n\r\nhello"},
    {NULL, NULL},
};

Test(proxy_upstream, fields_the_upstreams_connection_header_names_do_not_reach_the_client)
{
    start_proxy(canned_start(hops));
    struct px_reply r;
    px_request(&px_main, "/named", "{}", NULL, &r);
    cr_assert_eq(r.code, CURLE_OK, "%s", curl_easy_strerror(r.code));
    cr_assert_eq(r.status, 200);
    char v[64];
    cr_assert_str_eq(px_header(&r, "X-Kept", v, sizeof v), "kept", "%s", r.headers);
    cr_assert_null(px_header(&r, "X-Hop-Before", v, sizeof v), "a field before its naming: %s",
                   r.headers);
    cr_assert_null(px_header(&r, "X-Hop-After", v, sizeof v), "a field after its naming: %s",
                   r.headers);
    cr_assert_null(px_header(&r, "Connection", v, sizeof v), "%s", r.headers);
    cr_assert_str_eq(r.body, "hello");
    px_request(&px_main, "/length", "{}", NULL, &r);
    cr_assert_eq(r.code, CURLE_OK, "%s", curl_easy_strerror(r.code));
    cr_assert_null(px_header(&r, "Content-Length", v, sizeof v), "%s", r.headers);
    cr_assert_str_eq(px_header(&r, "Transfer-Encoding", v, sizeof v), "chunked", "%s",
                     r.headers);
    cr_assert_str_eq(r.body, "hello");
}

/* ---- an https:// upstream behind a private CA ----------------------------------------------- */

/* A provider behind a private CA (a self-signed certificate for 127.0.0.1, as a TLS-inspecting
 * gateway or a lab's vLLM has): without --upstream-ca its 502 says which TLS check failed, in
 * libcurl's words (it said only "did not answer: SSL peer certificate or SSH remote key was
 * not OK"), and the flag that fixes it; with it, the answer comes through. */
Test(proxy_upstream, an_https_upstream_is_verified_against_the_ca_upstream_ca_names)
{
    if (!tls_available())
        cr_skip_test("openssl is not installed (the test preset's bootstrap installs it)");
    char upstream[64], cert[128];
    tls_make_cert(px_dir);
    snprintf(cert, sizeof cert, "%s/cert.pem", px_dir);
    int port = loopback_dead_port();
    pid_t server = tls_server_start(px_dir, port);
    snprintf(upstream, sizeof upstream, "https://127.0.0.1:%d", port);
    const char *args[] = {"--upstream", upstream, "--node", NODE, "--state", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0, "sluice-proxy did not start");
    struct px_reply r;
    px_request(&px_main, "/v1/models", NULL, NULL, &r);
    cr_assert_eq(r.status, 502, "%s", r.body);
    px_assert_error_body(&r, "upstream_unreachable");
    cr_assert_not_null(strstr(r.body, "SSL certificate problem"), "%s", r.body);
    cr_assert_not_null(strstr(r.body, "--upstream-ca"), "the 502 names the flag: %s", r.body);
    px_stop(&px_main);
    const char *trusting[] = {"--upstream", upstream, "--node",        NODE, "--state",
                              "off",        "--upstream-ca", cert, NULL};
    cr_assert_eq(px_start(&px_main, trusting), 0, "sluice-proxy did not start");
    px_request(&px_main, "/v1/models", NULL, NULL, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_not_null(strstr(r.body, "\"object\":\"list\""), "%s", r.body);
    tls_server_stop(server);
}

/* The same behind HTTP/2 (nginx over TLS, as a hosted provider's front speaks it: libcurl
 * offers h2 and multiplexes the calls on one connection): an answer's head comes as
 * "HTTP/2 200" with lowercase fields and may have no length, and each goes to the client as
 * HTTP/1.1, a chat whole and a stream event by event to its [DONE]. */
Test(proxy_upstream, an_https_upstream_speaking_http2_serves_chats_and_streams)
{
    if (!tls_h2_available())
        cr_skip_test("openssl or nginx is not installed (the test preset's bootstrap installs "
                     "both)");
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 5, .stream = true,
                                   .answer_tokens = 5, .token_ms = 1});
    tls_make_cert(px_dir);
    char upstream[64], cert[128];
    snprintf(cert, sizeof cert, "%s/cert.pem", px_dir);
    int port = loopback_dead_port();
    pid_t server = tls_h2_start(px_dir, port, fx_sim.port);
    snprintf(upstream, sizeof upstream, "https://127.0.0.1:%d", port);
    const char *args[] = {"--upstream", upstream, "--node", NODE,       "--state",
                          "off",        "--upstream-ca", cert, NULL};
    cr_assert_eq(px_start(&px_main, args), 0, "sluice-proxy did not start");
    struct px_reply r;
    px_request(&px_main, "/v1/chat/completions", FX_REQUEST, NULL, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    /* h2 has no reason phrase: the client gets the status's own */
    cr_assert(!strncmp(r.headers, "HTTP/1.1 200 OK\r\n", 17), "%s", r.headers);
    cr_assert_not_null(strstr(r.body, "\"chat.completion\""), "%s", r.body);
    px_request(&px_main, "/v1/chat/completions", stream_body, NULL, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(!strncmp(r.headers, "HTTP/1.1 200 OK\r\n", 17), "%s", r.headers);
    cr_assert_not_null(strstr(r.body, "chat.completion.chunk"), "%s", r.body);
    cr_assert_not_null(strstr(r.body, "data: [DONE]"), "%s", r.body);
    cr_assert_eq(node_count("requests_total"), 2);
    tls_server_stop(server);
}
