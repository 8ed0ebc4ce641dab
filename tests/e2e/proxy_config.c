/*
 * sluice-proxy with --config: routing by path prefix, header and the body's
 * model (404 listing the routes otherwise), the API key taken from the
 * environment and set upstream in place of the client's (and never
 * logged), hop-by-hop headers dropped and the body forwarded unchanged, and
 * configuration errors that name the file, the line and the field (exit 2).
 * The upstream is an echo server (proxy_fixture.h): its answer is the
 * request the proxy sent.
 */
#include "proxy_fixture.h"

static void setup(void)
{
    px_dir_setup("config");
}

TestSuite(proxy_config, .init = setup, .fini = px_dir_teardown, .timeout = 30);

/* Write `text` (a printf format taking the echo port, as %1$d) to DIR/name; its path in out. */
static void write_config(const char *name, const char *text, int port, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", px_dir, name);
    FILE *f = fopen(out, "w");
    cr_assert_not_null(f);
    fprintf(f, text, port);
    fclose(f);
}

static const char routes_conf[] =
    "# three backends, one per way to route\n"
    "backends = (\n"
    "  { id = \"cloud:by-prefix\"; upstream = \"http://127.0.0.1:%1$d/base\"; prefix = \"/a\";\n"
    "    api_key_env = \"PX_TEST_KEY\"; },\n"
    "  { id = \"cloud:by-header\"; upstream = \"http://127.0.0.1:%1$d\"; header = \"X-Provider\";\n"
    "    header_value = \"b\"; },\n"
    "  { id = \"cloud:by-model\"; upstream = \"http://127.0.0.1:%1$d\"; models = [\"m1\", \"m2\",\n"
    "    \"org/m3\", \"café\", \"llama🦙\"];\n"
    "    api_key_env = \"PX_TEST_KEY\"; api_key_header = \"x-api-key\";\n"
    "    pass_client_key = true; }\n"
    ");\n";

static char log_path[128]; /* DIR/access.log, the routes' access log */

static void start_routes(void)
{
    char conf[128];
    snprintf(log_path, sizeof log_path, "%s/access.log", px_dir);
    write_config("routes.conf", routes_conf, px_echo_start(), conf, sizeof conf);
    setenv("PX_TEST_KEY", "sk-upstream-secret", 1);
    const char *args[] = {"--config", conf, "--state", "off", "--access-log", log_path, NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
}

Test(proxy_config, routes_by_prefix_header_and_model_else_404_listing_them)
{
    start_routes();
    struct px_reply r;
    px_request(&px_main, "/a/v1/chat/completions", "{}", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(!strncmp(r.body, "POST /base/v1/chat/completions HTTP/1.1\r\n", 41),
              "the prefix is replaced by the upstream's base: %s", r.body);
    px_request(&px_main, "/v1/chat/completions", "{}", "X-Provider: b", &r);
    cr_assert_eq(r.status, 200);
    cr_assert(!strncmp(r.body, "POST /v1/chat/completions ", 26), "%s", r.body);
    px_request(&px_main, "/v1/chat/completions", "{\"messages\":[],\"model\" : \"m2\"}", NULL, &r);
    cr_assert_eq(r.status, 200, "the body's model routes: %s", r.body);
    /* Only the top-level object's own key: a "model" in the messages or metadata, or in a
     * string, does not route, wherever it stands. */
    px_request(&px_main, "/v1/chat/completions",
               "{\"metadata\":{\"model\":\"m2\"},\"messages\":[{\"content\":\"\\\"model\\\": \\\"m2\\\"\"}],"
               "\"model\":\"other\"}",
               NULL, &r);
    cr_assert_eq(r.status, 404, "a nested model routed: %s", r.body);
    px_request(&px_main, "/v1/chat/completions",
               "{\"metadata\":{\"model\":\"other\"},\"model\":\"m2\"}", NULL, &r);
    cr_assert_eq(r.status, 200, "the top-level model after a nested one: %s", r.body);
    /* The model's escapes are decoded, as a JSON parser would: PHP's json_encode escapes
     * every '/', Python's json.dumps every non-ASCII character (a surrogate pair past
     * U+FFFF). A bad escape, or half a pair, is no model at all. The key is read the same
     * way, and where it stands twice the last counts, as for the provider's own parser. */
    static const struct {
        const char *body;
        int status;
    } spelled[] = {
        {"{\"model\":\"org\\/m3\"}", 200},
        {"{\"model\":\"\\u006d2\"}", 200},
        {"{\"model\":\"caf\\u00e9\"}", 200},
        {"{\"model\":\"caf\\u00E9\"}", 200},
        {"{\"model\":\"llama\\ud83e\\udd99\"}", 200},
        {"{\"model\":\"llama\\ud83e\"}", 404},
        {"{\"model\":\"llama\\udd99\\ud83e\"}", 404},
        {"{\"model\":\"m2\\q\"}", 404},
        {"{\"model\":\"m\\u00\"}", 404},
        {"{\"model\":\"m2\\u0000\"}", 404},
        {"{\"model\":\"org\\\\/m3\"}", 404},
        {"{\"\\u006dodel\":\"m2\"}", 200},
        {"{\"mod\\u0065l\":\"m2\",\"models\":\"x\"}", 200},
        {"{\"model\":\"other\",\"messages\":[],\"model\":\"m2\"}", 200},
        {"{\"model\":\"m2\",\"model\":\"other\"}", 404},
        {"{\"model\":\"m2\",\"model\":2}", 404},
    };
    for (size_t i = 0; i < sizeof spelled / sizeof *spelled; i++) {
        px_request(&px_main, "/v1/chat/completions", spelled[i].body, NULL, &r);
        cr_assert_eq(r.status, spelled[i].status, "%s: %d", spelled[i].body, r.status);
    }
    px_request(&px_main, "/v1/chat/completions", "[{\"model\":\"m2\"}]", NULL, &r);
    cr_assert_eq(r.status, 404, "not an object: %s", r.body);
    px_request(&px_main, "/v1/chat/completions", "{\"model\":\"other\"}", NULL, &r);
    cr_assert_eq(r.status, 404);
    px_assert_error_body(&r, "no_route");
    cr_assert_not_null(strstr(r.body, "/a -> cloud:by-prefix"), "the 404 lists routes: %s",
                       r.body);
    cr_assert_not_null(strstr(r.body, "X-Provider: b -> cloud:by-header"), "%s", r.body);
}

Test(proxy_config, the_api_key_replaces_the_clients_and_is_never_logged)
{
    start_routes();
    struct px_reply r;
    px_request(&px_main, "/a/v1/chat/completions", "{}", "Authorization: Bearer sk-client", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body, "\r\nAuthorization: Bearer sk-upstream-secret\r\n"), "%s",
                       r.body);
    cr_assert_null(strstr(r.body, "sk-client"), "the client's key went upstream: %s", r.body);
    /* pass_client_key: the client's own x-api-key stays. */
    px_request(&px_main, "/v1/chat/completions", "{\"model\":\"m1\"}", "x-api-key: sk-client",
               &r);
    cr_assert_not_null(strstr(r.body, "\r\nx-api-key: sk-client\r\n"), "%s", r.body);
    px_request(&px_main, "/a/v1/chat/completions", "{}", "X-Sluice-Deadline-Ms: soon", &r);
    cr_assert_eq(r.status, 400);
    px_stop(&px_main); /* the log is flushed at exit */
    FILE *f = fopen(log_path, "r");
    cr_assert_not_null(f);
    char text[8192] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert_not_null(strstr(text, "cloud:by-prefix \"POST /a/v1/chat/completions\" 200"),
                       "one line per request: %s", text);
    cr_assert_null(strstr(text, "secret"), "a key was logged: %s", text);
    const char *bad = strstr(text, "\" 400 bad_request ");
    cr_assert_not_null(bad, "the proxy's own answers are logged too: %s", text);
    const char *duration = strstr(bad, "duration=");
    cr_assert(duration && atof(duration + 9) < 10000.0,
              "a request's duration runs from its first byte: %s", bad);
    /* Its body named no model, and no provider answered it: both "-". */
    cr_assert_not_null(strstr(bad, " model=- request_id=-\n"), "%s", bad);
    cr_assert_not_null(strstr(text, "cloud:by-model \"POST /v1/chat/completions\" 200 success "),
                       "%s", text);
    cr_assert_not_null(strstr(text, " model=m1 request_id=-\n"), "the model it routed by: %s",
                       text);
    cr_assert_null(strstr(text, "sk-client"), "a key was logged: %s", text);
}

Test(proxy_config, hop_by_hop_headers_are_dropped_and_the_body_is_unchanged)
{
    start_routes();
    struct curl_slist *h = curl_slist_append(NULL, "Keep-Alive: timeout=5");
    h = curl_slist_append(h, "TE: trailers");
    h = curl_slist_append(h, "X-Custom: kept");
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "X-Sluice-Deadline-Ms: 5000");
    static const char body[] = "{\"model\":\"m1\",\"messages\":[{\"role\":\"user\",\"content\":"
                               "\"\\u00e9 \\\"quoted\\\"\"}]}";
    struct px_reply r;
    CURL *e = px_easy(&px_main, "/v1/chat/completions", body, h, &r);
    r.code = curl_easy_perform(e);
    px_finish(e, &r);
    curl_slist_free_all(h);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body, "\r\nX-Custom: kept\r\n"), "%s", r.body);
    cr_assert_null(strcasestr(r.body, "keep-alive:"), "%s", r.body);
    cr_assert_null(strcasestr(r.body, "\r\nte:"), "%s", r.body);
    cr_assert_null(strcasestr(r.body, "x-sluice-deadline-ms"), "the proxy's own header: %s",
                   r.body);
    const char *sent = strstr(r.body, "\r\n\r\n");
    cr_assert_not_null(sent);
    cr_assert_str_eq(sent + 4, body, "the body changed on the way");
}

Test(proxy_config, a_chunked_body_split_across_reads_routes_by_its_model_and_goes_up_whole)
{
    start_routes();
    /* "model" is cut inside its name, between a size line and its data, and inside a CRLF:
     * each part is its own read. Only the by-model backend serves this path. */
    static const char body[] = "{\"messages\":[],\"model\":\"m2\"}";
    const char *parts[] = {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n",
                           "12\r\n{\"messages\":[],\"mo", "\r", "\n", "a\r\ndel\":\"m2\"}\r\n", "0\r",
                           "\n\r\n", NULL};
    static char got[65536];
    px_raw(&px_main, parts, 30, 1, got, sizeof got);
    cr_assert(!strncmp(got, "HTTP/1.1 200 ", 13), "the body's model did not route: %s", got);
    char want[64];
    snprintf(want, sizeof want, "\r\nContent-Length: %zu\r\n", strlen(body));
    cr_assert_not_null(strstr(got, want), "upstream gets the decoded length: %s", got);
    cr_assert_null(strcasestr(got, "transfer-encoding"), "%s", got);
    const char *sent = strstr(strstr(got, "\r\n\r\n") + 4, "\r\n\r\n");
    cr_assert_not_null(sent, "%s", got);
    cr_assert_str_eq(sent + 4, body, "the body changed on the way");
}

Test(proxy_config, the_model_is_read_from_a_bounded_prefix_of_the_body_split_or_not)
{
    start_routes();
    /* A Content-Length body whose "model" straddles two reads routes as one read would. */
    static const char body[] = "{\"messages\":[],\"model\":\"m1\"}";
    char head[256];
    snprintf(head, sizeof head,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n"
             "{\"messages\":[],\"mod",
             strlen(body));
    static char got[65536];
    px_raw(&px_main, (const char *[]){head, "el\":\"m1\"}", NULL}, 30, 1, got, sizeof got);
    cr_assert(!strncmp(got, "HTTP/1.1 200 ", 13), "%s", got);
    /* Past the first PROXY_MODEL_READ_MAX (64 KiB) bytes the model is not looked for: the
     * prompt is never scanned whole, and this path has no other route. */
    enum { PAD = 70000 };
    static char pad[PAD + 1], big[PAD + 64];
    memset(pad, 'a', PAD);
    snprintf(big, sizeof big, "{\"messages\":[{\"content\":\"%s\"}],\"model\":\"m1\"}", pad);
    struct px_reply r;
    px_request(&px_main, "/v1/chat/completions", big, NULL, &r);
    cr_assert_eq(r.status, 404, "a model past the bounded prefix was read: %s", r.body);
    snprintf(big, sizeof big, "{\"model\":\"m1\",\"messages\":[{\"content\":\"%s\"}]}", pad);
    px_request(&px_main, "/v1/chat/completions", big, NULL, &r);
    cr_assert_eq(r.status, 200, "the same body with its model first: %s", r.body);
    /* Chunked, the buffer grows (and moves) under the parsed head as the chunks come. */
    px_request(&px_main, "/v1/chat/completions", big, "Transfer-Encoding: chunked", &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    char want[64];
    snprintf(want, sizeof want, "\r\nContent-Length: %zu\r\n", strlen(big));
    cr_assert_not_null(strstr(r.body, want), "%s", r.body);
    cr_assert_not_null(strstr(r.body, "\r\nContent-Type: application/json\r\n"),
                       "the head's headers survive the move: %s", r.body);
}

/* A head with Expect: 100-continue for a body of `length` bytes. */
static void expect_head(char *out, size_t size, const char *path, size_t length)
{
    snprintf(out, size,
             "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nExpect: 100-continue\r\n\r\n",
             path, length);
}

/* A flag beside --config wins over the file's top-level setting of the same number: a body
 * limit of 100 in the file, 2000 on the command line, and a declared 1000 bytes is let in. */
/* One backend of one permit, no queue, in front of the fixture's simulator; `extra` is the rest
 * of its group ("" or a setting). */
static void start_one_permit(const char *extra)
{
    char text[512], conf[128];
    snprintf(text, sizeof text,
             "backends = ( { id = \"cloud:sim\"; upstream = \"http://127.0.0.1:%%1$d\";\n"
             "  discovery = false; active = 1; waiting = 0; %s } );\n",
             extra);
    write_config("one.conf", text, fx_sim.port, conf, sizeof conf);
    const char *args[] = {"--config", conf, "--state", "off", "--access-log", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
}

/* With the one permit held by a 2 s generation, POST each of `paths` (n of them): one whose
 * `through` is set must be answered by the upstream (the simulator's 404 for a path it does not
 * serve), the others by the proxy's 503; then the backend must have counted one call. */
static void expect_through(const char *const *paths, const bool *through, size_t n)
{
    struct px_held held;
    px_hold(&held, &px_main);
    long refused = 0;
    for (size_t i = 0; i < n; i++) {
        struct px_reply r;
        px_request(&px_main, paths[i], "{\"purpose\": \"batch\"}", NULL, &r);
        if (through[i])
            cr_expect_eq(r.status, 404, "POST %s went through the pool: %ld %s", paths[i],
                         r.status, r.body);
        else
            cr_expect_eq(r.status, 503, "POST %s went around the pool: %ld %s", paths[i],
                         r.status, r.body);
        refused += !through[i];
    }
    px_hold_end(&held);
    cr_assert_eq(held.reply.status, 200);
    cr_expect_eq(px_node_count(&px_main, "cloud:sim", "requests_total"), 1,
                 "a request around the pool was a call");
    cr_expect_eq(px_node_count(&px_main, "cloud:sim", "refused_capacity_total"), refused);
}

/* An upload, a batch, a token count generate nothing while they run: by default they go around
 * the pool as reads do (a 40 MB upload's minute read as a generation's latency would be a knee),
 * matched by whole path segments; a backend's unpooled_paths replaces the list. */
Test(proxy_config, uploads_batches_and_token_counts_take_no_permit_and_a_backend_can_say_which)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 2000,
                                   .fixed_latency = true});
    start_one_permit("");
    const char *paths[] = {"/v1/files", "/v1/batches?limit=1", "/v1/messages/count_tokens",
                           "/v1/filesystem", "/v1/messages"};
    expect_through(paths, (const bool[]){true, true, true, false, false}, 5);
    px_stop(&px_main);
    start_one_permit("unpooled_paths = [\"/v1/messages/\"];");
    expect_through(paths, (const bool[]){false, false, true, false, false}, 5);
    px_stop(&px_main);
    start_one_permit("unpooled_paths = [];");
    expect_through(paths, (const bool[]){false, false, false, false, false}, 5);
}

Test(proxy_config, a_flag_wins_over_the_files_setting_of_the_same_number)
{
    char conf[128], head[512];
    write_config("flag.conf",
                 "max_body_bytes = 100;\n"
                 "backends = ( { id = \"cloud:a\"; upstream = \"http://127.0.0.1:%1$d\"; } );\n",
                 px_echo_start(), conf, sizeof conf);
    cr_assert_eq(px_start(&px_main, (const char *[]){"--config", conf, "--state", "off",
                                                    "--max-body-bytes", "2000", NULL}),
                 0);
    static char got[4096];
    expect_head(head, sizeof head, "/v1/chat/completions", 1000);
    int fd = px_connect(&px_main);
    cr_assert_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
    cr_assert(px_read_head(fd, got, sizeof got), "%s", got);
    close(fd);
    cr_assert_str_eq(got, "HTTP/1.1 100 Continue\r\n\r\n", "the file's 100 bytes won");
}

/* A request the proxy refuses whatever its body gets that refusal in place of 100 Continue,
 * and the connection closes (its body was not read); one it may serve gets the 100. */
Test(proxy_config, expect_100_continue_gets_the_refusal_instead_when_the_head_decides_it)
{
    char conf[128], head[512];
    write_config("prefix.conf",
                 "max_body_bytes = 100;\n"
                 "backends = ( { id = \"cloud:a\"; upstream = \"http://127.0.0.1:%1$d\"; "
                 "prefix = \"/a\"; } );\n",
                 px_echo_start(), conf, sizeof conf);
    cr_assert_eq(px_start(&px_main, (const char *[]){"--config", conf, "--state", "off", NULL}),
                 0);
    static char got[65536];
    /* No backend serves this path, and no backend routes by the body's model: 404 now. */
    expect_head(head, sizeof head, "/v1/chat/completions", 2);
    cr_assert(px_raw(&px_main, (const char *[]){head, NULL}, 0, 1, got, sizeof got),
              "the connection stayed open with its body unread: %s", got);
    cr_assert(!strncmp(got, "HTTP/1.1 404 ", 13), "not the 404 in place of the 100: %s", got);
    cr_assert_not_null(strstr(got, "\r\nConnection: close\r\n"), "%s", got);
    cr_assert_not_null(strstr(got, "\"code\":\"no_route\""), "%s", got);
    /* A declared body over max_body_bytes: 413 with the head. */
    expect_head(head, sizeof head, "/a/v1/chat/completions", 1000);
    cr_assert(px_raw(&px_main, (const char *[]){head, NULL}, 0, 1, got, sizeof got), "%s", got);
    cr_assert(!strncmp(got, "HTTP/1.1 413 ", 13), "%s", got);
    /* A path it serves: 100, then the body, then the answer. */
    expect_head(head, sizeof head, "/a/v1/chat/completions", 2);
    int fd = px_connect(&px_main);
    cr_assert_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
    cr_assert(px_read_head(fd, got, sizeof got), "%s", got);
    cr_assert_str_eq(got, "HTTP/1.1 100 Continue\r\n\r\n");
    px_raw_on(fd, (const char *[]){"{}", NULL}, 0, 1, got, sizeof got);
    cr_assert(!strncmp(got, "HTTP/1.1 200 ", 13), "%s", got);
    /* A drain: a request whose head comes after SIGTERM is refused with 503 in place of the
     * 100 (the connection, begun before, is waited for), saying when to retry. */
    static const char line[] = "POST /a/v1/chat/completions HTTP/1.1\r\n";
    cr_assert_eq(write(fd, line, strlen(line)), (ssize_t)strlen(line));
    kill(px_main.pid, SIGTERM);
    WAIT_UNTIL(!px_listening(&px_main));
    px_raw_on(fd, (const char *[]){strstr(head, "\r\n") + 2, NULL}, 0, 1, got, sizeof got);
    close(fd);
    cr_assert(!strncmp(got, "HTTP/1.1 503 ", 13), "not the 503 in place of the 100: %s", got);
    cr_assert_not_null(strstr(got, "\"code\":\"shutting_down\""), "%s", got);
    /* Come back at once, elsewhere (this instance takes no new connections), spread. */
    cr_assert_not_null(strstr(got, "\r\nRetry-After: 0\r\n"), "%s", got);
    const char *ms = strstr(got, "\r\nretry-after-ms: ");
    cr_assert_not_null(ms, "%s", got);
    long v = atol(ms + 18);
    cr_assert(v >= 50 && v <= 150, "retry-after-ms %ld for a drain: %s", v, got);
    px_stop(&px_main);
    cr_assert(WIFEXITED(px_main.status) && WEXITSTATUS(px_main.status) == 0);
}

/* Run the proxy on a config (a write_config format, given `port`) and return its exit status;
 * its stderr in err. No --listen or --admin: the file's own are what some configs get wrong. */
static int run_config(const char *text, int port, char *err, size_t size)
{
    char conf[128], cmd[512];
    write_config("bad.conf", text, port, conf, sizeof conf);
    /* timeout: a configuration wrongly accepted would otherwise serve until the suite's end */
    snprintf(cmd, sizeof cmd, "timeout 10 '%s' --config '%s' --state off 2>&1",
             SLUICE_PROXY_PATH, conf);
    FILE *f = popen(cmd, "r");
    size_t n = fread(err, 1, size - 1, f);
    err[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Bad configurations, each with what its error must say after "DIR/bad.conf:": the line, the
 * field, and what is wrong. */
static const struct {
    const char *text, *want;
} bad_configs[] = {
    {"backends = (\n { id = \"a\"; upstream = \"http://x\";\n   active = 0; }\n);\n",
     "3: backends[0].active: must be a whole number"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; actve = 3; }\n);\n",
     "2: backends[0].actve: is not a known setting"},
    {"drain_ms = \"soon\";\nbackends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "1: drain_ms: must be a whole number"},
    {"backends = ( { id = \"a\" upstream = ; } );\n", "1: syntax error"},
    /* Two backends claiming one route: the first would take all of it, silently. */
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; prefix = \"/v1\"; },\n"
     " { id = \"b\"; upstream = \"http://y\";\n   prefix = \"/v1\"; }\n);\n",
     "4: backends[1].prefix: \"/v1\" is backends[0]'s (a) too: a path routes to one backend"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; },\n"
     " { id = \"b\"; upstream = \"http://y\"; }\n);\n",
     "3: backends[1].prefix: \"/\" (the default) is backends[0]'s (a) too"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; models = [\"m1\", \"m2\"]; },\n"
     " { id = \"b\"; upstream = \"http://y\";\n   models = [\"m3\", \"m2\"]; }\n);\n",
     "4: backends[1].models: \"m2\" is listed by backends[0] (a) too: a model routes to one "
     "backend"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; header = \"X-P\"; header_value = "
     "\"v\"; },\n { id = \"b\"; upstream = \"http://y\"; header = \"x-p\";\n   header_value = "
     "\"v\"; }\n);\n",
     "4: backends[1].header_value: x-p: v routes to backends[0] (a) already"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; deadline_ms = 5000;\n"
     "   start_deadline_ms = 9000; }\n);\n",
     "3: backends[0].start_deadline_ms: 9000 is longer than deadline_ms (5000): a call cannot "
     "start after it must have ended; make it at most 5000"},
    /* Routes that cannot be: each names its line and field as the rest do. */
    {"backends = (\n { id = \"a\"; upstream = \"http://x\";\n   prefix = \"v1\"; }\n);\n",
     "3: backends[0].prefix: \"v1\" must start with '/': it is the path's start, e.g. \"/v1\""},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\";\n   header = \"X-P\"; }\n);\n",
     "3: backends[0].header: needs header_value too"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; prefix = \"/a\"; },\n"
     " { id = \"a\"; upstream = \"http://y\"; prefix = \"/b\"; }\n);\n",
     "3: backends[1].id: \"a\" is backends[0]'s too"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; prefix = \"/a\"; default = true; },\n"
     " { id = \"b\"; upstream = \"http://y\"; prefix = \"/b\";\n   default = true; }\n);\n",
     "4: backends[1].default: backends[0] (a) is the default already"},
    /* Upstream URLs that would fail only at the first request, or go somewhere unmeant. */
    {"backends = (\n { id = \"a\";\n   upstream = \"http://\"; }\n);\n",
     "3: backends[0].upstream: 'http://' has no host: write http://HOST[:PORT][/PATH]"},
    {"backends = ( { id = \"a\"; upstream = \"localhost:11434\"; } );\n",
     "1: backends[0].upstream: 'localhost:11434' has no scheme: write http://localhost:11434"},
    {"backends = ( { id = \"a\"; upstream = \"ftp://x\"; } );\n",
     "1: backends[0].upstream: 'ftp://x' is not http:// or https://"},
    {"backends = ( { id = \"a\"; upstream = \"http://x:99999/v1\"; } );\n",
     "1: backends[0].upstream: 'http://x:99999/v1' has a bad port"},
    {"backends = ( { id = \"a\"; upstream = \"http://x/v1?key=k\"; } );\n",
     "1: backends[0].upstream: 'http://x/v1?key=k' has a query or fragment"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\"; fleet_floor = 2; }\n);\n",
     "2: backends[0].fleet_floor: needs redis: it is the least served while Redis is unreachable"},
    {"backends = (\n { id = \"a\"; upstream = \"https://x\";\n"
     "   ca_file = \"/nonexistent/ca.pem\"; }\n);\n",
     "2: backends[0].ca_file: /nonexistent/ca.pem: No such file or directory"},
    {"backends = (\n { id = \"a\"; upstream = \"http://x\";\n"
     "   api_key_env = \"SLUICE_PX_TEST_NEVER_SET\"; }\n);\n",
     "2: backends[0].api_key_env: $SLUICE_PX_TEST_NEVER_SET is not set"},
    /* Addresses, checked when bound: the file's line and key, not the flag it did not use. */
    {"listen = \"0.0.0.0:0\";\nbackends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "1: listen: 0.0.0.0 is not a loopback address: add --allow-remote"},
    {"listen = \"localhost:0\";\nbackends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "1: listen: 'localhost' is not a numeric IPv4 or IPv6 address"},
    {"listen = \"127.0.0.1:0\";\nadmin = \"0.0.0.0:0\";\n"
     "backends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "2: admin: 0.0.0.0 is not a loopback address: add --allow-remote"},
    {"listen = \"127.0.0.1:0\";\nadmin = \"example:0\";\n"
     "backends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "2: admin: 'example' is not a numeric IPv4 or IPv6 address"},
    /* Every dialect the library's table accepts, not three and "...". */
    {"backends = ( { id = \"a\"; upstream = \"http://x\"; dialect = \"openapi\"; } );\n",
     "1: backends[0].dialect: must name a dialect (auto, generic, openai, azure, anthropic, "
     "openrouter, together, groq, mistral, gemini, ietf): 'openapi'"},
    {"max_body_bytes = 0;\nbackends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
     "1: max_body_bytes: must be a whole number from 1 to"},
    {"backends = ( { id = \"a\"; upstream = \"http://x\";\n"
     "  unpooled_paths = [\"v1/files\"]; } );\n",
     "2: backends[0].unpooled_paths: must be a list of paths starting with \"/\""},
    {"backends = ( { id = \"a\"; upstream = \"http://x\"; unpooled_paths = \"/v1/files\"; } );\n",
     "1: backends[0].unpooled_paths: must be a list of up to 64 paths"},
    /* The engine's own ID rules (found fuzzing the file): exit 2 at the backend's line, as
     * the rest, not 1 in the library's words. */
    {"backends = (\n { id = \"a\\x01b\"; upstream = \"http://x\"; }\n);\n",
     "2: backends[0].id has a control character at byte 1"},
};

Test(proxy_config, errors_name_the_file_the_line_and_the_field_and_exit_2)
{
    char err[1024], want[512];
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        cr_assert_eq(run_config(bad_configs[i].text, 1, err, sizeof err), 2, "%s: %s",
                     bad_configs[i].text, err);
        snprintf(want, sizeof want, "%s/bad.conf:%s", px_dir, bad_configs[i].want);
        cr_assert_not_null(strstr(err, want), "want '%s', got '%s'", want, err);
    }
    /* A listen address taken already: the proxy cannot start (1), and says where it was set. */
    int taken = px_echo_start();
    cr_assert_eq(run_config("listen = \"127.0.0.1:%1$d\";\n"
                            "backends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
                            taken, err, sizeof err),
                 1, "%s", err);
    snprintf(want, sizeof want, "Address already in use (%s/bad.conf:1: listen)", px_dir);
    cr_assert_not_null(strstr(err, want), "want '%s', got '%s'", want, err);
    /* An admin port the file names and another holds: an error as with --admin, not a quiet
     * move to a free port. */
    cr_assert_eq(run_config("listen = \"127.0.0.1:0\";\nadmin = \"127.0.0.1:%1$d\";\n"
                            "backends = ( { id = \"a\"; upstream = \"http://x\"; } );\n",
                            taken, err, sizeof err),
                 1, "%s", err);
    snprintf(want, sizeof want, "(%s/bad.conf:2: admin: write another \"HOST:PORT\"", px_dir);
    cr_assert_not_null(strstr(err, want), "want '%s', got '%s'", want, err);
}

/* Bad flags, each with what its error must say: the flag, the value, what to write. */
static const struct {
    const char *flags, *want;
} bad_flags[] = {
    /* An empty --state (a "$STATE" never set) is a mistake, not a wish for no state file. */
    {"--upstream http://127.0.0.1:9 --state ''", "--state needs a file, or off"},
    {"--upstream http://", "--upstream 'http://' has no host: write http://HOST[:PORT][/PATH]"},
    {"--upstream http://:8080", "--upstream 'http://:8080' has no host"},
    {"--upstream 127.0.0.1:8080", "--upstream '127.0.0.1:8080' has no scheme: write "
                                  "http://127.0.0.1:8080"},
    {"--upstream ftp://x", "--upstream 'ftp://x' is not http:// or https://"},
    {"--upstream http://x:0", "--upstream 'http://x:0' has a bad port (a whole number from 1 "
                              "to 65535)"},
    {"--upstream 'http://[::1'", "--upstream 'http://[::1' has an unclosed ["},
    /* A password in a URL is shown as *** (here: the error quotes the URL). */
    {"--upstream http://user:s3cret@x:0", "--upstream 'http://user:***@x:0' has a bad port"},
    {"--upstream http://127.0.0.1:9 --deadline-ms 5000 --start-deadline-ms 9000",
     "--start-deadline-ms 9000 is longer than --deadline-ms (5000): a call cannot start after it "
     "must have ended; make it at most 5000"},
    /* The admin's address in the flags' words, not the library's (sluice_admin_desc.address,
     * .allow_remote), and before the state file opens. */
    {"--upstream http://127.0.0.1:9 --admin 0.0.0.0:0",
     "--admin 0.0.0.0 is not a loopback address: add --allow-remote (the admin endpoint has no "
     "authentication"},
    {"--upstream http://127.0.0.1:9 --admin example.com:8400",
     "--admin: 'example.com' is not a numeric IPv4 or IPv6 address"},
    /* A key variable never exported: the flag named, exit 2 as for any bad configuration. */
    {"--upstream http://127.0.0.1:9 --api-key-env SLUICE_PX_TEST_NEVER_SET",
     "--api-key-env: $SLUICE_PX_TEST_NEVER_SET is not set"},
    /* A CA file that would fail every https call at its first: named at start, exit 2. */
    {"--upstream https://127.0.0.1:9 --upstream-ca /nonexistent/ca.pem",
     "--upstream-ca /nonexistent/ca.pem: No such file or directory"},
    {"--upstream https://127.0.0.1:9 --upstream-ca /dev/null",
     "--upstream-ca /dev/null: holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)"},
    {"--upstream http://127.0.0.1:9 --upstream-ca /dev/null",
     "--upstream-ca /dev/null: is for an https:// upstream, and this one is http://"},
    /* A fleet floor is the limit while Redis is unreachable: nothing without Redis, and no
     * more than the most calls in flight (the library's words named a C field). */
    {"--upstream http://127.0.0.1:9 --fleet-floor 2",
     "--fleet-floor: needs --redis: it is the least served while Redis is unreachable"},
    {"--upstream http://127.0.0.1:9 --redis 127.0.0.1:6379 --active 4 --fleet-floor 5",
     "--fleet-floor: 5 is above --active (4)"},
    /* A flag without its value does not take the next flag as one, whatever kind it is. */
    {"--node --upstream http://127.0.0.1:9", "--node needs a value"},
    {"--upstream http://127.0.0.1:9 --active --drain-ms 5", "--active needs a value"},
    {"--upstream http://127.0.0.1:9 --admin", "--admin needs a value"},
    /* An empty node ID (a "$NODE" never set): the flag named, not the engine's field. */
    {"--upstream http://127.0.0.1:9 --node ''", "--node needs a node ID such as cloud:openai"},
    /* The engine's ID rules, in the flag's words and exit 2 (they were exit 1, "backends[0].id
     * ... (SLUICE_BACKEND_ID_MAX)"). */
    {"--upstream http://127.0.0.1:9 --node \"$(printf 'a\\001b')\"",
     "--node has a control character at byte 1"},
    {"--upstream http://127.0.0.1:9 --node $(printf %0300d 0)",
     "--node is 300 bytes, above the maximum 255\n"},
    /* Why a config file cannot be read, in the OS's words. */
    {"--config /nonexistent/sluice-proxy.conf",
     "--config /nonexistent/sluice-proxy.conf: cannot read it: No such file or directory"},
    /* A flag that sets --upstream's one backend would set nothing beside --config (the file's
     * backends take their own): refused with the key to write instead, before the file is
     * read. */
    {"--config proxy.conf --redis redis://127.0.0.1:6379",
     "--redis sets --upstream's backend only; with --config, write redis = "
     "\"redis://HOST:PORT\"; in each backend of proxy.conf it is meant for"},
    {"--config=proxy.conf --redis=redis://127.0.0.1:6379", "--redis sets --upstream's"},
    {"--node cloud:x --config proxy.conf", "--node sets --upstream's backend only; with "
                                           "--config, write id = \"ID\"; in each backend"},
    {"--config proxy.conf --active 4", "--active sets --upstream's backend only"},
    {"--config proxy.conf --waiting 0", "--waiting sets --upstream's backend only"},
    {"--config proxy.conf --no-discovery", "write discovery = false; in each backend"},
    {"--config proxy.conf --deadline-ms 5000", "write deadline_ms = MS; in each backend"},
    {"--config proxy.conf --start-deadline-ms 5000", "write start_deadline_ms = MS;"},
    {"--config proxy.conf --api-key-env KEY", "write api_key_env = \"VAR\"; in each backend"},
    {"--config proxy.conf --api-key-header x-api-key", "--api-key-header sets --upstream's"},
    {"--config proxy.conf --upstream-ca ca.pem", "write ca_file = \"FILE\"; in each backend"},
    {"--config proxy.conf --fleet-floor 2", "write fleet_floor = N; in each backend"},
    /* 0 would refuse every POST with 413: refused at start, with the least it takes. */
    {"--upstream http://127.0.0.1:9 --max-body-bytes 0",
     "--max-body-bytes needs a whole number from 1 to"},
};

/* A state file it cannot open stops the proxy (exit 1) in the words of --state, not of the
 * C field the library names. */
Test(proxy_config, a_state_file_it_cannot_open_is_named_in_the_flags_words)
{
    char err[1024], cmd[512];
    snprintf(cmd, sizeof cmd,
             "timeout 10 '%s' --listen 127.0.0.1:0 --admin off --upstream http://127.0.0.1:9 "
             "--state /etc/passwd/ceilings.json 2>&1",
             SLUICE_PROXY_PATH);
    FILE *f = popen(cmd, "r");
    size_t n = fread(err, 1, sizeof err - 1, f);
    err[n] = '\0';
    int status = pclose(f);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s", err);
    cr_assert(strstr(err, "--state") && strstr(err, "/etc/passwd") &&
                  !strstr(err, "sluice_statefile_desc"),
              "%s", err);
}

Test(proxy_config, flag_errors_name_the_flag_and_the_value_and_exit_2)
{
    char err[1024], cmd[512];
    for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++) {
        snprintf(cmd, sizeof cmd,
                 "timeout 10 '%s' --listen 127.0.0.1:0 --admin off --state off %s 2>&1",
                 SLUICE_PROXY_PATH, bad_flags[i].flags);
        FILE *f = popen(cmd, "r");
        size_t n = fread(err, 1, sizeof err - 1, f);
        err[n] = '\0';
        int status = pclose(f);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "%s: %s", bad_flags[i].flags,
                  err);
        cr_assert_not_null(strstr(err, bad_flags[i].want), "want '%s', got '%s'",
                           bad_flags[i].want, err);
    }
}

/* stdout's second line is the admin URL a script or sluicectl --admin takes as it is: an IPv6
 * address in brackets, as its first line has it. */
Test(proxy_config, an_ipv6_admin_address_is_printed_as_a_url_that_answers)
{
    const char *args[] = {"--upstream", "http://127.0.0.1:1", "--admin", "[::1]:0",
                          "--state", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
    cr_assert_eq(strncmp(px_main.admin, "http://[::1]:", 13), 0, "admin URL %s", px_main.admin);
    char body[16384];
    cr_assert_eq(px_admin(&px_main, "GET", "/compute/concurrency", body, sizeof body), 200);
}

/* One backend of one permit, lingering as `linger` says ("" = the default, learned), before a
 * provider that streams every answer in 0.55 s (50 ms to the first token, then 25 tokens 20 ms
 * apart) and keeps generating one whose client left: four whole streams (so the pool knows how
 * long a call takes; with `short_first`, four answers not streamed, of 50 ms), then one whose
 * client hangs up after STOP_AFTER of its events, about 0.25 s in. The permit would linger
 * about a whole call after the hang-up (the calls' high quantile), and the answer has 0.25 s
 * less than that left to run: the margin a loaded machine's delays must not eat. The
 * simulator's counts once it is idle. */
#define STOP_AFTER 10

static struct fx_stats stop_a_stream(const char *linger, bool short_first)
{
    px_sim_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 50,
                                       .fixed_latency = true, .stream = true,
                                       .answer_tokens = 25, .fixed_answer = true, .token_ms = 20},
                 NULL);
    start_one_permit(linger);
    static const char body[] = "{\"model\":\"sim\",\"stream\":true,\"messages\":[]}";
    static const char whole[] = "{\"model\":\"sim\",\"messages\":[]}";
    for (int i = 0; i < 4; i++) {
        struct px_reply r;
        px_request(&px_main, "/v1/chat/completions", short_first ? whole : body, NULL, &r);
        cr_assert_eq(r.status, 200, "stream %d: %ld %s", i, r.status, r.body);
    }
    int fd = px_connect(&px_main);
    char req[512], got[8192];
    px_raw_chat(req, sizeof req, body);
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t len = 0;
    int events = 0;
    got[0] = '\0';
    while (events < STOP_AFTER && len + 1 < sizeof got) {
        ssize_t n = read(fd, got + len, sizeof got - 1 - len);
        cr_assert_gt(n, 0, "the proxy closed after %d events: %s", events, got);
        len += (size_t)n;
        got[len] = '\0';
        events = 0;
        for (const char *e = got; (e = strstr(e, "data:")); e++)
            events++;
    }
    close(fd);
    return fx_stats_settled();
}

/* A client that stops a stream leaves a provider that keeps generating (a hosted API) running
 * it: where the backend keeps an abandoned call's permit anyway (lingering learned, no trial:
 * here a fixed pool), the proxy reads the rest of the answer and drops it, so the permit comes
 * back when the provider is done rather than when the estimate says; the pool hears a whole
 * call, not a cancel whose permit lingers. With lingering off (a server that aborts on
 * disconnect, as vLLM does) it hangs up at once. */
static void expect_read_to_its_end(struct fx_stats s)
{
    cr_assert_eq(s.cancelled, 0, "the proxy hung up on the stopped stream");
    cr_assert_eq(s.ok, 5, "%ld answers ended whole at the provider", s.ok);
    WAIT_UNTIL(px_node_count(&px_main, "cloud:sim", "in_flight") == 0);
    cr_assert_eq(px_node_count(&px_main, "cloud:sim", "lingered_total"), 0, "its permit lingered");
    cr_assert_eq(px_node_count(&px_main, "cloud:sim", "cancels_total"), 0);
}

Test(proxy_config, a_stopped_stream_is_read_to_its_end_where_its_permit_would_linger)
{
    expect_read_to_its_end(stop_a_stream("", false));
}

/* The same after calls of 50 ms: the stream outlives the pool's estimate (the high quantile of
 * those calls) by far, and while it is still coming the provider is still running it, so it is
 * read to its end (cut at the estimate, the provider went on behind a permit let go). */
Test(proxy_config, a_stopped_stream_is_read_to_its_end_past_the_pools_estimate)
{
    expect_read_to_its_end(stop_a_stream("", true));
}

/* An endless stream of 4 KiB tokens to a client that never reads: its socket and the proxy's
 * buffer fill, the transfer pauses, and after --client-timeout-ms without reading the client
 * is gone. Its permit would linger, so the answer is read on, but no longer than
 * linger_max_ms from the call's start: then the upstream call is cancelled. */
Test(proxy_config, a_client_that_stops_reading_an_endless_stream_loses_its_call)
{
    px_sim_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 5, .stream = true,
                                       .stream_endless = true, .token_ms = 1,
                                       .token_bytes = 4096, .abandoned_free = true},
                 NULL);
    char text[512], conf[128];
    snprintf(text, sizeof text, "%s",
             "backends = ( { id = \"cloud:sim\"; upstream = \"http://127.0.0.1:%1$d\";\n"
             "  linger_max_ms = 1000; } );\n");
    write_config("endless.conf", text, fx_sim.port, conf, sizeof conf);
    const char *args[] = {"--config", conf, "--state", "off", "--access-log", "off",
                          "--client-timeout-ms", "300", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = px__addr(&px_main);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[512];
    px_raw_chat(req, sizeof req, "{\"model\":\"sim\",\"stream\":true,\"messages\":[]}");
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    /* ... and never read. */
    int64_t deadline = fx_now_ms() + 15000;
    struct fx_stats s;
    while ((s = fx_stats()).cancelled < 1 && fx_now_ms() < deadline)
        fx_sleep_ms(100);
    close(fd);
    cr_assert_eq(s.cancelled, 1, "a client that reads nothing kept its upstream call");
}

Test(proxy_config, a_stopped_stream_is_hung_up_on_at_once_where_lingering_is_off)
{
    struct fx_stats s = stop_a_stream("linger = \"off\";", false);
    cr_assert_eq(s.cancelled, 1, "the proxy read on a stream whose provider stops on a hang-up");
    cr_assert_eq(s.ok, 4);
}
