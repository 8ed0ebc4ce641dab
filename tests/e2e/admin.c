/*
 * The admin endpoint over loopback: every route, every error status with a
 * JSON body that says what to fix, the event stream, Prometheus text that
 * parses, and the limits that protect it from slow or hostile clients.
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "admin_fixture.h"
#include "common.h"
#include "prometheus.h"

static struct fixture fx;

__attribute__((unused)) static void stop_all(void)
{
    fixture_stop(&fx);
}

/* Per-test options rather than TestSuite: the TSan build's Criterion stand-in
 * (tests/tsan/) has no TestSuite. */
#define ADMIN_TEST(name) Test(admin, name, .fini = stop_all, .timeout = 20)

static json_t *parse(const struct reply *r)
{
    json_error_t e;
    json_t *j = json_loads(r->body, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, r->body);
    return j;
}

static json_t *find_node(json_t *status, const char *id)
{
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(status, "nodes"), i, n) {
        if (!strcmp(json_string_value(json_object_get(n, "node")), id))
            return n;
    }
    return NULL;
}

/* An error answer: the status, JSON with "error" and "fix". */
static void expect_error(struct reply r, long status, const char *mentions)
{
    cr_expect_eq(r.status, status, "status %ld, want %ld: %s", r.status, status, r.body);
    cr_expect(strstr(r.content_type, "application/json") != NULL, "type %s", r.content_type);
    json_t *j = parse(&r);
    const char *err = json_string_value(json_object_get(j, "error"));
    const char *fix = json_string_value(json_object_get(j, "fix"));
    cr_expect(err && *err, "no error message: %s", r.body);
    cr_expect(fix && *fix, "no fix: %s", r.body);
    if (mentions)
        cr_expect(err && strstr(err, mentions), "error \"%s\" does not mention %s", err, mentions);
    json_decref(j);
    reply_free(&r);
}

ADMIN_TEST(status_lists_every_node_with_state_glyph_and_status_line)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_expect(strstr(r.content_type, "application/json") != NULL);
    json_t *s = parse(&r);
    cr_expect_eq(json_array_size(json_object_get(s, "nodes")), 4, "the registered nodes");

    json_t *locked = find_node(s, "cloud:locked");
    cr_assert_not_null(locked);
    cr_expect_str_eq(json_string_value(json_object_get(locked, "state")), "locked");
    cr_expect_str_eq(json_string_value(json_object_get(locked, "glyph")), "🔒");
    cr_expect_eq(json_integer_value(json_object_get(locked, "ceiling")), FIXTURE_LOCKED_CEILING);
    cr_expect_eq(json_integer_value(json_object_get(locked, "limit")), FIXTURE_LOCKED_CEILING);
    cr_expect_str_eq(json_string_value(json_object_get(locked, "status_line")), "cloud:locked 0/12 🔒");
    json_int_t left = json_integer_value(json_object_get(locked, "lock_left_s"));
    cr_expect(left > 3500 && left <= 3600, "lock_left_s %lld", (long long)left);
    cr_expect(json_integer_value(json_object_get(locked, "lock_expires_s")) > fixture_now_s());

    json_t *probing = find_node(s, "cloud:default_ollama");
    cr_assert_not_null(probing);
    cr_expect_str_eq(json_string_value(json_object_get(probing, "status_line")),
                     "cloud:default_ollama 0/5 📈");
    cr_expect_eq(json_integer_value(json_object_get(probing, "ceiling")), 0);

    json_t *rainy = find_node(s, "cloud:rainy");
    cr_assert_not_null(rainy);
    cr_expect_str_eq(json_string_value(json_object_get(rainy, "state")), "backoff");
    cr_expect_str_eq(json_string_value(json_object_get(rainy, "glyph")), "🌧️");
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_object_get(rainy, "last_event"), "event")), "backoff");

    json_t *gpu = find_node(s, "local:gpu");
    cr_assert_not_null(gpu);
    cr_expect(json_is_false(json_object_get(gpu, "adaptive")));
    cr_expect_str_eq(json_string_value(json_object_get(gpu, "state")), "fixed");
    cr_expect_str_eq(json_string_value(json_object_get(gpu, "status_line")), "local:gpu 0/4");
    cr_expect_null(find_node(s, "openrouter"), "the unused built-in preset is not listed");
    json_decref(s);
    reply_free(&r);
}

/*
 * The built-in openrouter preset (active 16, waiting 1024) is in every engine, but a
 * program that never uses it should not see it in every view: the status JSON (so the
 * page and sluicectl), the chart history and /metrics list it once it has had traffic,
 * and from then on; asked for by name it answers all along. Before the fix every view
 * listed it.
 */
ADMIN_TEST(the_openrouter_preset_is_listed_only_once_it_has_traffic)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect(strstr(r.body, "openrouter") == NULL, "status: %s", r.body);
    reply_free(&r);
    r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_expect(strstr(r.body, "node=\"openrouter\"") == NULL, "metrics list it unused");
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency/history", NULL, NULL);
    cr_expect(strstr(r.body, "openrouter") == NULL, "history: %s", r.body);
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency/history?node_id=openrouter", NULL, NULL);
    cr_expect_eq(r.status, 200, "by name it answers: %s", r.body);
    reply_free(&r);

    struct sluice_pool *p = sluice_engine_pool(fx.engine, SLUICE_OPENROUTER_ID);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    json_t *s = parse(&r);
    json_t *o = find_node(s, "openrouter");
    cr_assert_not_null(o, "listed once used: %s", r.body);
    cr_expect_str_eq(json_string_value(json_object_get(o, "status_line")), "openrouter 0/16");
    json_decref(s);
    reply_free(&r);
    r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_expect(strstr(r.body, "sluice_limit{node=\"openrouter\"} 16") != NULL, "metrics: %s",
              r.body);
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency/history", NULL, NULL);
    cr_expect(strstr(r.body, "\"openrouter\"") != NULL, "history: %s", r.body);
    reply_free(&r);
}

ADMIN_TEST(events_route_answers_json_lines_after_a_seq)
{
    fixture_start(&fx, NULL, NULL);
    sluice_engine_clear(fx.engine, "cloud:locked"); /* restore, then clear */
    struct reply r = http("GET", fx.base, "/compute/concurrency/events?node_id=cloud:locked", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_expect(strstr(r.content_type, "application/x-ndjson") != NULL, "type %s", r.content_type);
    char *save = NULL;
    int lines = 0;
    bool restore = false, clear = false;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *ev = json_loads(line, 0, NULL);
        cr_assert_not_null(ev, "line %d is not JSON: %s", lines, line);
        const char *kind = json_string_value(json_object_get(ev, "event"));
        restore |= !strcmp(kind, "restore");
        clear |= !strcmp(kind, "clear");
        cr_expect_str_eq(json_string_value(json_object_get(ev, "node")), "cloud:locked");
        json_decref(ev);
        lines++;
    }
    cr_expect(restore && clear, "restore %d clear %d", restore, clear);
    reply_free(&r);

    /* after=SEQ: only newer events. */
    r = http("GET", fx.base, "/compute/concurrency/events?node_id=cloud:locked&after=1", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_expect(strstr(r.body, "\"seq\":1,") == NULL, "seq 1 is not after 1: %s", r.body);
    cr_expect(strstr(r.body, "\"event\":\"clear\"") != NULL);
    reply_free(&r);

    /* A fixed node has an empty feed. */
    r = http("GET", fx.base, "/compute/concurrency/events?node_id=local:gpu", NULL, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.len, 0);
    reply_free(&r);
}

ADMIN_TEST(post_clear_resets_only_that_node_and_answers_its_new_state)
{
    fixture_start(&fx, NULL, NULL);
    struct reply before = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    json_t *sb = parse(&before);

    struct reply r = http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse(&r);
    json_t *n = json_object_get(j, "node");
    cr_expect(json_is_true(json_object_get(j, "cleared")));
    cr_expect_str_eq(json_string_value(json_object_get(n, "state")), "probing");
    cr_expect_eq(json_integer_value(json_object_get(n, "limit")), 5, "back at the jumpstart");
    cr_expect_eq(json_integer_value(json_object_get(n, "ceiling")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(n, "status_line")), "cloud:locked 0/5 📈");
    json_decref(j);
    reply_free(&r);
    /* Cleared again with nothing since: "cleared" is false and the feed gains nothing. */
    r = http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    j = parse(&r);
    cr_expect(json_is_false(json_object_get(j, "cleared")), "already clear: %s", r.body);
    json_decref(j);
    reply_free(&r);
    cr_expect_eq(sluice_event_ring_count(sluice_engine_events(fx.engine, "cloud:locked")), 2,
                 "restore and one clear");

    /* The persisted lock is gone ... */
    struct sluice_lock_record rec;
    cr_expect_eq(fx.ops.load(fx.ops.ctx, "cloud:locked", &rec), SLUICE_OK);
    cr_expect_eq(rec.ceiling, 0);
    /* ... and every other node is as it was. */
    struct reply after = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    json_t *sa = parse(&after);
    const char *others[] = {"cloud:default_ollama", "cloud:rainy", "local:gpu"};
    for (size_t i = 0; i < 3; i++) {
        json_t *x = find_node(sb, others[i]), *y = find_node(sa, others[i]);
        cr_expect_str_eq(json_string_value(json_object_get(y, "status_line")),
                         json_string_value(json_object_get(x, "status_line")), "%s", others[i]);
        cr_expect_str_eq(json_string_value(json_object_get(y, "state")),
                         json_string_value(json_object_get(x, "state")), "%s", others[i]);
    }
    json_decref(sa);
    json_decref(sb);
    reply_free(&before);
    reply_free(&after);
}

ADMIN_TEST(missing_or_malformed_node_id_is_400)
{
    fixture_start(&fx, NULL, NULL);
    expect_error(http("POST", fx.base, "/compute/concurrency/clear", NULL, NULL), 400, "missing node_id");
    expect_error(http("GET", fx.base, "/compute/concurrency/events", NULL, NULL), 400, "missing node_id");
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=", NULL, NULL), 400, "malformed");
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=a%01b", NULL, NULL), 400, "malformed");
    char path[600];
    snprintf(path, sizeof path, "/compute/concurrency/clear?node_id=%0300d", 7);
    expect_error(http("POST", fx.base, path, NULL, NULL), 400, "malformed");
    /* The fix gives the limits the engine holds IDs to (before: "1..255" typed in, and no
     * word of the adaptive nodes' shorter one). */
    struct reply r = http("POST", fx.base, path, NULL, NULL);
    json_t *j = parse(&r);
    const char *fix = json_string_value(json_object_get(j, "fix"));
    char id_max[32], node_max[32];
    snprintf(id_max, sizeof id_max, "1..%d bytes", SLUICE_BACKEND_ID_MAX);
    snprintf(node_max, sizeof node_max, "at most %d", SLUICE_NODE_ID_MAX - 1);
    cr_expect(fix && strstr(fix, id_max) && strstr(fix, node_max), "%s", r.body);
    json_decref(j);
    reply_free(&r);
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=cloud:locked&after=x", NULL, NULL),
                 400, "after");
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=cloud:locked&follow=yes", NULL, NULL),
                 400, "follow");
}

ADMIN_TEST(node_ids_that_are_not_utf8_or_hide_a_nul_get_their_json_error)
{
    fixture_start(&fx, NULL, NULL);
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=%FF", NULL, NULL), 400,
                 "not UTF-8");
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:%C3", NULL, NULL),
                 400, "not UTF-8");
    /* %00 ends the C string early: it must not name cloud:locked. */
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked%00junk", NULL,
                      NULL), 400, "malformed");
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED, "the NUL-cut ID cleared the node");
    /* Echoed paths that are not UTF-8, or cut mid-character by the echo's bound. */
    expect_error(http("GET", fx.base, "/%FF", NULL, NULL), 404, "no route");
    char path[2048] = "/";
    for (int i = 0; i < 120; i++)
        strcat(path, "%E2%82%AC"); /* €: 3 bytes, so a 200-byte echo ends inside one */
    expect_error(http("GET", fx.base, path, NULL, NULL), 404, "no route");
    const char *host[] = {"Host: \xff\xfe", NULL};
    expect_error(http("GET", fx.base, "/compute/concurrency", host, NULL), 403, "Host");
}

ADMIN_TEST(node_ids_reach_json_and_prometheus_labels_escaped)
{
    static const struct sluice_discovery_desc adaptive = {.lock_ttl_s = 86400};
    const struct sluice_backend_desc backends[] = {
        {.id = "cloud:q\"uo\\te", .active = 8, .discovery = &adaptive},
        {.id = "cloud:café ☁", .active = 8},
    };
    fixture_start_backends(&fx, backends, 2);
    struct reply r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.body, "sluice_limit{node=\"cloud:q\\\"uo\\\\te\"} 5\n") != NULL,
              "quote and backslash escaped: %s", r.body);
    cr_expect(strstr(r.body, "sluice_limit{node=\"cloud:café ☁\"} 8\n") != NULL, "%s", r.body);
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    json_t *s = parse(&r);
    cr_expect_not_null(find_node(s, "cloud:q\"uo\\te"));
    cr_expect_not_null(find_node(s, "cloud:café ☁"));
    json_decref(s);
    reply_free(&r);
}

ADMIN_TEST(unknown_node_or_route_is_404)
{
    fixture_start(&fx, NULL, NULL);
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:nope", NULL, NULL),
                 404, "cloud:nope");
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=nope", NULL, NULL), 404, "nope");
    expect_error(http("GET", fx.base, "/compute/nothing", NULL, NULL), 404, "no route");
}

/* ---- one list of routes: the table in admin_routes.c -------------------------------- */

#define MAX_ROUTES 32

/* Routes as "METHOD /path" (the query left out), each once. */
struct routes {
    size_t n;
    char at[MAX_ROUTES][128];
};

static void routes_add(struct routes *r, const char *method, const char *path)
{
    char one[128];
    snprintf(one, sizeof one, "%s %.*s", method, (int)strcspn(path, "?[ \t\n`,\""), path);
    for (size_t k = 0; k < r->n; k++)
        if (!strcmp(r->at[k], one))
            return;
    cr_assert_lt(r->n, MAX_ROUTES, "more routes than the test keeps");
    memcpy(r->at[r->n++], one, sizeof one);
}

static bool routes_have(const struct routes *r, const char *route)
{
    for (size_t k = 0; k < r->n; k++)
        if (!strcmp(r->at[k], route))
            return true;
    return false;
}

static void expect_same_routes(const struct routes *table, const struct routes *doc,
                               const char *where)
{
    for (size_t k = 0; k < table->n; k++)
        cr_expect(routes_have(doc, table->at[k]), "%s does not list %s", where, table->at[k]);
    for (size_t k = 0; k < doc->n; k++)
        cr_expect(routes_have(table, doc->at[k]),
                  "%s lists %s, which the route table does not have", where, doc->at[k]);
}

/* The 404 answer lists the route table ("routes: GET /, ..., POST
 * /compute/concurrency/clear?node_id=N, ..."); sluice/admin.h's route list and the README's
 * (between its admin-routes markers) name exactly those routes, with their methods (the
 * README names a method only where it is POST), and the admin fuzzer's dictionary has each
 * path, whole or its last part. The fuzzer itself takes its paths from the same answer. */
ADMIN_TEST(admin_h_the_readme_and_the_fuzz_dictionary_follow_the_route_table)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/no/such/route", NULL, NULL);
    json_t *j = parse(&r);
    char list[1024];
    snprintf(list, sizeof list, "%s", json_string_value(json_object_get(j, "fix")));
    json_decref(j);
    reply_free(&r);
    cr_assert(!strncmp(list, "routes: ", 8), "the 404 answer lists the routes: %s", list);
    struct routes table = {0};
    for (char *route = strtok(list + 8, ","); route; route = strtok(NULL, ",")) {
        char method[8];
        int at = 0;
        cr_assert(sscanf(route, " %7s %n", method, &at) == 1 && route[at] == '/', "%s", route);
        routes_add(&table, method, route + at);
    }
    cr_assert_geq(table.n, 2, "%s", list);

    struct routes header = {0};
    const char *block =
        test_source_part("shim/include/sluice/admin.h", "Routes:\n", "\n *\n * Which");
    for (const char *line = strchr(block, '\n'); line; line = strchr(line + 1, '\n')) {
        char method[8];
        int at = 0;
        if (sscanf(line, "\n *   %7[A-Z] %n", method, &at) == 1 && line[at] == '/')
            routes_add(&header, method, line + at);
    }
    expect_same_routes(&table, &header, "sluice/admin.h");

    struct routes readme = {0};
    char *part = test_source_part("README.md", "<!-- admin routes", "<!-- end of admin routes -->");
    for (char *tick = strchr(part, '`'); tick; tick = strchr(tick + 1, '`')) {
        char *word = tick + 1;
        tick = strchr(word, '`');
        cr_assert_not_null(tick, "README.md: an unclosed ` in the admin routes");
        bool post = !strncmp(word, "POST /", 6);
        const char *method = post ? "POST" : "GET";
        word += post ? 5 : 0;
        if (*word == '/')
            routes_add(&readme, method, word);
    }
    expect_same_routes(&table, &readme, "README.md");

    const char *dict = test_source_part("tests/fuzz/corpus/admin.dict", "\"", NULL);
    for (size_t k = 0; k < table.n; k++) {
        const char *path = strchr(table.at[k], '/'), *last = strrchr(path, '/');
        char whole[140], tail[140];
        snprintf(whole, sizeof whole, "\n\"%s\"\n", path);
        snprintf(tail, sizeof tail, "\n\"%s\"\n", last);
        cr_expect(!strcmp(path, "/") || strstr(dict, whole) || strstr(dict, tail),
                  "admin.dict has neither \"%s\" nor \"%s\"", path, last);
    }
}

ADMIN_TEST(wrong_method_is_405_with_allow)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", NULL, NULL);
    cr_expect_str_eq(r.allow, "POST");
    expect_error(r, 405, "GET");
    r = http("DELETE", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_str_eq(r.allow, "GET, HEAD");
    expect_error(r, 405, "DELETE");
    r = http("POST", fx.base, "/metrics", NULL, NULL);
    cr_expect_str_eq(r.allow, "GET, HEAD");
    expect_error(r, 405, NULL);
    /* The GET side was not cleared by the refused GET /clear. */
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED);
}

struct chunks {
    long left; /* bytes still to send; < 0: endless */
};

static size_t chunk_read(char *buf, size_t size, size_t n, void *ctx)
{
    struct chunks *c = ctx;
    size_t want = size * n < 4096 ? size * n : 4096;
    if (c->left >= 0 && (long)want > c->left)
        want = (size_t)c->left;
    memset(buf, 'x', want);
    if (c->left >= 0)
        c->left -= (long)want;
    return want;
}

/* POST a chunked body of `bytes` (< 0: endless, stopped by a 10 s timeout at worst). */
static CURLcode chunked_post(const char *base, long bytes, long *status)
{
    char url[256];
    snprintf(url, sizeof url, "%s/compute/concurrency/clear?node_id=cloud:locked", base);
    struct chunks c = {bytes};
    struct reply sink = {0};
    CURL *e = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Transfer-Encoding: chunked");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "POST");
    curl_easy_setopt(e, CURLOPT_READFUNCTION, chunk_read);
    curl_easy_setopt(e, CURLOPT_READDATA, &c);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, reply_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(e);
    *status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    free(sink.body);
    return rc;
}

ADMIN_TEST(oversized_body_is_413)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.max_body_bytes = 1024});
    char *big = malloc(64 * 1024 + 1);
    memset(big, 'x', 64 * 1024);
    big[64 * 1024] = '\0';
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", NULL, big),
                 413, "over the limit");
    free(big);
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED, "the refused request cleared nothing");

    /* Chunked, without Content-Length: 413 once it ends; an endless one is cut off. */
    long status = 0;
    CURLcode rc = chunked_post(fx.base, 20 * 1024, &status);
    cr_expect_eq(rc, CURLE_OK, "%s", curl_easy_strerror(rc));
    cr_expect_eq(status, 413);
    rc = chunked_post(fx.base, -1, &status);
    cr_expect_neq(rc, CURLE_OK, "an endless body was drained instead of cut off");
    struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 200, "still serving");
    reply_free(&r);
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED);
}

ADMIN_TEST(clearing_a_fixed_node_is_409_saying_why)
{
    fixture_start(&fx, NULL, NULL);
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=local:gpu", NULL, NULL),
                 409, "fixed limit");
}

ADMIN_TEST(foreign_origin_post_and_non_loopback_host_are_403)
{
    fixture_start(&fx, NULL, NULL);
    const char *evil[] = {"Origin: http://evil.example", NULL};
    expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", evil, NULL),
                 403, "evil.example");
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    const char *rebound[] = {"Host: attacker.example", NULL};
    expect_error(http("GET", fx.base, "/compute/concurrency", rebound, NULL), 403, "attacker.example");
    /* The page itself may clear: its Origin is the endpoint. */
    char own[128];
    snprintf(own, sizeof own, "Origin: %s", fx.base);
    const char *same[] = {own, NULL};
    struct reply r = http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", same, NULL);
    cr_expect_eq(r.status, 200, "%s", r.body);
    reply_free(&r);
}

ADMIN_TEST(only_loopback_address_literals_and_localhost_pass_the_host_and_origin_checks)
{
    fixture_start(&fx, NULL, NULL);
    unsigned port = sluice_admin_port(fx.admin);
    /* Names that only look loopback: whoever owns them can rebind them to 127.0.0.1. */
    const char *rebindable[] = {"127.attacker.example", "127.0.0.1.nip.io", "localhost.evil",
                                "127.0.0.1.", "[::1].evil", "127.0.0.1:80x", "[::2]", "1.2.3.4"};
    for (size_t i = 0; i < sizeof rebindable / sizeof *rebindable; i++) {
        char host[128], origin[160];
        snprintf(host, sizeof host, "Host: %s:%u", rebindable[i], port);
        snprintf(origin, sizeof origin, "Origin: http://%s:%u", rebindable[i], port);
        const char *get[] = {host, NULL};
        expect_error(http("GET", fx.base, "/compute/concurrency", get, NULL), 403, "loopback");
        /* A page served from that name, after the rebinding, posts with a matching Origin. */
        const char *post[] = {host, origin, NULL};
        expect_error(http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked",
                          post, NULL), 403, NULL);
    }
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED, "no rebound page cleared the lock");
    /* Address literals and localhost, with or without a port, are served. */
    char lit[6][64];
    snprintf(lit[0], sizeof lit[0], "127.0.0.1");
    snprintf(lit[1], sizeof lit[1], "127.0.0.1:%u", port);
    snprintf(lit[2], sizeof lit[2], "127.1.2.3:%u", port);
    snprintf(lit[3], sizeof lit[3], "localhost:%u", port);
    snprintf(lit[4], sizeof lit[4], "[::1]:%u", port);
    snprintf(lit[5], sizeof lit[5], "[::1]");
    for (size_t i = 0; i < 6; i++) {
        char host[96];
        snprintf(host, sizeof host, "Host: %.63s", lit[i]);
        const char *h[] = {host, NULL};
        struct reply r = http("GET", fx.base, "/compute/concurrency", h, NULL);
        cr_expect_eq(r.status, 200, "Host %s: %ld %s", lit[i], r.status, r.body);
        reply_free(&r);
    }
    char host[96], origin[128];
    snprintf(host, sizeof host, "Host: [::1]:%u", port);
    snprintf(origin, sizeof origin, "Origin: http://[::1]:%u", port);
    const char *page[] = {host, origin, NULL};
    struct reply r = http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", page, NULL);
    cr_expect_eq(r.status, 200, "the page at [::1] may clear: %s", r.body);
    reply_free(&r);
}

ADMIN_TEST(page_and_head_are_served)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/", NULL, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.content_type, "text/html") != NULL);
    cr_expect(strstr(r.body, "Concurrency Health") != NULL);
    cr_expect(strstr(r.body, "http://") == NULL || strstr(r.body, "<script src") == NULL,
              "self-contained: no external scripts");
    reply_free(&r);
    r = http("HEAD", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 200);
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency/history?node_id=cloud:locked", NULL, NULL);
    cr_expect_eq(r.status, 200);
    json_t *h = parse(&r);
    cr_expect(json_is_array(json_object_get(json_object_get(h, "nodes"), "cloud:locked")));
    json_decref(h);
    reply_free(&r);
}

/* ---- Prometheus text format (prometheus.h) ------------------------------------- */

ADMIN_TEST(metrics_parse_as_prometheus_text_with_node_labels)
{
    fixture_start(&fx, NULL, NULL);
    struct reply r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_expect(strstr(r.content_type, "text/plain; version=0.0.4") != NULL, "%s", r.content_type);
    int samples = prom_check(r.body);
    cr_expect_gt(samples, 20);
    const char *t = r.body;
    cr_expect_eq(prom_value(t, "sluice_ceiling{node=\"cloud:locked\"}"), 12);
    cr_expect_eq(prom_value(t, "sluice_limit{node=\"cloud:default_ollama\"}"), 5);
    cr_expect_eq(prom_value(t, "sluice_limit{node=\"local:gpu\"}"), 4);
    cr_expect_eq(prom_value(t, "sluice_inflight{node=\"cloud:locked\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_waiting{node=\"cloud:locked\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_state{node=\"cloud:locked\",state=\"locked\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_state{node=\"cloud:locked\",state=\"probing\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_state{node=\"local:gpu\",state=\"fixed\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_backoffs_total{node=\"cloud:rainy\",cause=\"overload\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_backoffs_total{node=\"cloud:locked\",cause=\"overload\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_events_total{node=\"cloud:locked\",event=\"restore\"}"), 1);
    for (int k = 0; k < SLUICE_EVENT_KINDS; k++) { /* every kind has its series, hold to hint */
        char series[128];
        snprintf(series, sizeof series, "sluice_events_total{node=\"cloud:locked\",event=\"%s\"}",
                 sluice_event_kind_name((enum sluice_event_kind)k));
        cr_expect(strstr(t, series) != NULL, "no %s", series);
    }
    cr_expect_eq(prom_value(t, "sluice_requests_total{node=\"cloud:rainy\",outcome=\"overload\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_requests_total{node=\"cloud:rainy\",outcome=\"ok\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_requests_total{node=\"local:gpu\",outcome=\"ignore\"}"), 0);
    cr_expect(prom_value(t, "sluice_lock_expiry_timestamp_seconds{node=\"cloud:locked\"}") >
              (double)fixture_now_s());
    reply_free(&r);

    /* A second backoff shows up in the counter. */
    fixture_backoff(fx.engine, "cloud:default_ollama");
    r = http("GET", fx.base, "/metrics", NULL, NULL);
    prom_check(r.body);
    cr_expect_eq(prom_value(r.body, "sluice_backoffs_total{node=\"cloud:default_ollama\",cause=\"overload\"}"), 1);
    cr_expect_eq(prom_value(r.body, "sluice_requests_total{node=\"cloud:default_ollama\",outcome=\"overload\"}"),
                 1, "every ended call is counted by its outcome");
    reply_free(&r);
}

/* desc.metrics: a program's own families, after the admin's (sluice-proxy's connections). */
static char *own_families(void *ctx)
{
    return ctx ? strdup((const char *)ctx) : NULL;
}

ADMIN_TEST(metrics_end_with_the_programs_own_families)
{
    static const char own[] = "# HELP app_widgets_total Widgets made.\n"
                              "# TYPE app_widgets_total counter\napp_widgets_total 7\n";
    fixture_start(&fx, NULL,
                  &(struct sluice_admin_desc){.metrics = own_families, .metrics_ctx = (void *)own});
    struct reply r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    prom_check(r.body);
    size_t n = strlen(r.body), k = strlen(own);
    cr_assert(n > k && !strcmp(r.body + n - k, own), "does not end with the program's: %s",
              r.body);
    cr_expect_eq(prom_value(r.body, "sluice_ceiling{node=\"cloud:locked\"}"), 12);
    reply_free(&r);
    /* NULL from the callback adds nothing, and the admin's families stay whole. */
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.metrics = own_families});
    r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    prom_check(r.body);
    cr_expect(strstr(r.body, "app_widgets") == NULL, "%s", r.body);
    cr_expect_eq(prom_value(r.body, "sluice_ceiling{node=\"cloud:locked\"}"), 12);
    reply_free(&r);
}

ADMIN_TEST(metrics_and_status_show_the_deadline_counters_histograms_and_lingering_calls)
{
    fixture_start(&fx, NULL, NULL);
    struct sluice_pool *pool = sluice_engine_pool(fx.engine, "local:gpu");
    for (int i = 0; i < 20; i++) { /* 20 calls of about a second: the estimate knows them */
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(pool, NULL, NULL, &call), SLUICE_OK);
        call.start_ns -= SLUICE_NS_PER_SEC;
        sluice_pool_call_end(pool, &call, i < 3 ? SLUICE_OUTCOME_OVERLOAD : SLUICE_OUTCOME_OK, 0);
    }
    struct timespec past = {0, 0};
    struct sluice_call late, gone;
    cr_assert_eq(sluice_pool_call_begin(pool, &past, NULL, &late), SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_call_begin(pool, NULL, NULL, &gone), SLUICE_OK);
    sluice_pool_call_abandon(pool, &gone, SLUICE_ECANCELED); /* lingers about a second */
    int admitted = 0;
    while (sluice_pool_admit(pool) == SLUICE_OK)
        admitted++;
    struct reply r = http("GET", fx.base, "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    prom_check(r.body);
    const char *t = r.body;
    cr_expect_eq(prom_value(t, "sluice_call_seconds_count{node=\"local:gpu\"}"), 20);
    cr_expect_eq(prom_value(t, "sluice_call_seconds_bucket{node=\"local:gpu\",le=\"0.5\"}"), 0);
    cr_expect_eq(prom_value(t, "sluice_call_seconds_bucket{node=\"local:gpu\",le=\"+Inf\"}"), 20);
    cr_expect_eq(prom_value(t, "sluice_queue_wait_seconds_count{node=\"local:gpu\"}"), 21);
    cr_expect_eq(prom_value(t, "sluice_timeouts_total{node=\"local:gpu\"}"), 1,
                 "a call whose deadline passed before it started timed out");
    cr_expect_eq(prom_value(t, "sluice_cancels_total{node=\"local:gpu\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_overloads_total{node=\"local:gpu\"}"), 3);
    cr_expect_eq(prom_value(t, "sluice_lingering{node=\"local:gpu\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_lingered_total{node=\"local:gpu\"}"), 1);
    cr_expect_eq(prom_value(t, "sluice_inflight{node=\"local:gpu\"}"), 1, "a lingering call is in flight");
    cr_expect_eq(prom_value(t, "sluice_admissions_refused_total{node=\"local:gpu\",reason=\"capacity\"}"), 1);
    cr_expect(prom_value(t, "sluice_expected_service_seconds{node=\"local:gpu\"}") >= 1.0);
    reply_free(&r);
    r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    json_t *root = json_loads(r.body, 0, NULL);
    cr_assert_not_null(root);
    json_t *nodes = json_object_get(root, "nodes"), *gpu = NULL, *n;
    size_t i;
    json_array_foreach(nodes, i, n)
        if (!strcmp(json_string_value(json_object_get(n, "node")), "local:gpu"))
            gpu = n;
    cr_assert_not_null(gpu);
    cr_expect_eq(json_integer_value(json_object_get(gpu, "lingering")), 1);
    cr_expect_eq(json_integer_value(json_object_get(gpu, "overloads_total")), 3);
    cr_expect_eq(json_integer_value(json_object_get(gpu, "refused_capacity_total")), 1);
    cr_expect(json_is_number(json_object_get(gpu, "request_rate")));
    /* Over the last RECENT_S s of samples: null when the sampler's last tick already saw
     * every wait above (no wait since), else the 0 ms waits. */
    for (int k = 0; k < 2; k++) {
        json_t *q = json_object_get(gpu, k ? "queue_wait_p99_ms" : "queue_wait_p50_ms");
        cr_expect(q && (json_is_null(q) || (json_is_number(q) && json_number_value(q) <= 1.0)));
    }
    json_decref(root);
    reply_free(&r);
    while (admitted--)
        sluice_pool_leave(pool);
}

/* ---- the event stream --------------------------------------------------------- */

struct follower {
    char url[1024];
    char buf[16384];
    size_t len;
    pthread_mutex_t mu;
    CURLcode rc;
    long status;
};

static size_t follow_write(char *p, size_t size, size_t n, void *ctx)
{
    struct follower *f = ctx;
    pthread_mutex_lock(&f->mu);
    size_t take = size * n < sizeof f->buf - 1 - f->len ? size * n : sizeof f->buf - 1 - f->len;
    memcpy(f->buf + f->len, p, take);
    f->len += take;
    f->buf[f->len] = '\0';
    pthread_mutex_unlock(&f->mu);
    return size * n;
}

static void *follow_main(void *arg)
{
    struct follower *f = arg;
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, f->url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, follow_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 15000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    f->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
    curl_easy_cleanup(c);
    return NULL;
}

/* Whether `what`, and `then` after it where given, reached the stream within `within_ms`. */
static bool follower_saw(struct follower *f, const char *what, const char *then, int within_ms)
{
    for (int waited = 0; waited <= within_ms; waited += 20) {
        pthread_mutex_lock(&f->mu);
        const char *at = strstr(f->buf, what);
        bool seen = at && (!then || strstr(at, then));
        pthread_mutex_unlock(&f->mu);
        if (seen)
            return true;
        usleep(20 * 1000);
    }
    return false;
}

ADMIN_TEST(follow_streams_new_events_as_sse_and_stop_ends_the_stream)
{
    fixture_start(&fx, NULL, NULL);
    static struct follower f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    snprintf(f.url, sizeof f.url, "%s/compute/concurrency/events?node_id=cloud:locked&follow=1", fx.base);
    pthread_t t;
    pthread_create(&t, NULL, follow_main, &f);
    cr_assert(follower_saw(&f, "event: restore\n", NULL, 3000), "backlog first: %s", f.buf);
    sluice_engine_clear(fx.engine, "cloud:locked");
    cr_assert(follower_saw(&f, "event: clear\ndata: {", NULL, 3000), "live event: %s", f.buf);
    cr_expect(strstr(f.buf, "id: 2\n") != NULL, "ids are seqs: %s", f.buf);

    /* Stop with the stream open: it ends, and stop returns (no thread outlives it). */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sluice_admin_stop(fx.admin);
    fx.admin = NULL;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, NULL);
    cr_expect_eq(f.status, 200);
    cr_expect_lt(t1.tv_sec - t0.tv_sec, 5, "stop waited for the stream");
}

/* Events whose lines are long (a node id of quotes, each escaped to two bytes) fill the
 * stream's 8 KiB of frames before a batch of 16 is framed: the rest of the batch goes out
 * in the next fill. Every event arrives once, in order. */
ADMIN_TEST(follow_sends_every_event_once_when_long_lines_fill_its_frames)
{
    enum { CLEARS = 20 }; /* more than one batch; their frames fit the follower's buffer */
    static const struct sluice_discovery_desc adaptive = {.lock_ttl_s = 86400};
    char id[SLUICE_NODE_ID_MAX];
    memset(id, '"', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    const struct sluice_backend_desc backends[] = {{.id = id, .active = 8, .discovery = &adaptive}};
    fixture_start_backends(&fx, backends, 1);
    for (int k = 0; k < CLEARS; k++)
        cr_assert_eq(sluice_engine_clear(fx.engine, id), SLUICE_OK);

    static struct follower f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    int used = snprintf(f.url, sizeof f.url, "%s/compute/concurrency/events?follow=1&node_id=", fx.base);
    for (size_t k = 0; k + 1 < sizeof id; k++)
        used += snprintf(f.url + used, sizeof f.url - (size_t)used, "%%22");
    cr_assert_lt((size_t)used, sizeof f.url);
    pthread_t t;
    pthread_create(&t, NULL, follow_main, &f);
    char last[32];
    snprintf(last, sizeof last, "id: %d\n", CLEARS);
    bool all = follower_saw(&f, last, "\n\n", 5000); /* the last frame whole: a blank line */
    sluice_admin_stop(fx.admin);
    fx.admin = NULL;
    pthread_join(t, NULL);
    cr_assert(all, "the stream never reached event %d (%zu bytes): %s", CLEARS, f.len, f.buf);
    cr_assert_lt(f.len, sizeof f.buf - 1, "the follower's buffer filled: raise it or clear less");
    /* Each event once, in order: id: 1, 2, ..., CLEARS, each a clear with its JSON. */
    int next = 1;
    for (const char *at = strstr(f.buf, "id: "); at; at = strstr(at + 1, "id: ")) {
        cr_expect_eq(atoi(at + 4), next, "event %d where %d was due: %s", atoi(at + 4), next, f.buf);
        cr_expect(!strncmp(strchr(at, '\n'), "\nevent: clear\ndata: {", 21), "event %d", next);
        next++;
    }
    cr_expect_eq(next, CLEARS + 1, "%d events of %d arrived", next - 1, CLEARS);
}

ADMIN_TEST(streams_beyond_max_streams_are_503)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.max_streams = 1});
    static struct follower f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    snprintf(f.url, sizeof f.url, "%s/compute/concurrency/events?node_id=cloud:locked&follow=1", fx.base);
    pthread_t t;
    pthread_create(&t, NULL, follow_main, &f);
    cr_assert(follower_saw(&f, "event: restore", NULL, 3000));
    expect_error(http("GET", fx.base, "/compute/concurrency/events?node_id=cloud:locked&follow=1", NULL, NULL),
                 503, "max_streams");
    sluice_admin_stop(fx.admin);
    fx.admin = NULL;
    pthread_join(t, NULL);
}

/* ---- binding and hostile clients ------------------------------------------------ */

ADMIN_TEST(binds_loopback_and_refuses_other_addresses_without_allow_remote)
{
    fixture_start(&fx, NULL, NULL);
    char err[256];
    struct sluice_admin *a = NULL;
    struct sluice_admin_desc d = {.engine = fx.engine, .address = "0.0.0.0", .port = SLUICE_SOME(0),
                                  .error = err, .error_size = sizeof err};
    cr_expect_eq(sluice_admin_start(&d, &a), SLUICE_EINVAL);
    cr_expect(strstr(err, "allow_remote") != NULL, "%s", err);
    cr_expect_null(a);
    /* The same port twice: the error says which field to change. */
    d.address = NULL;
    d.port = SLUICE_SOME(sluice_admin_port(fx.admin));
    cr_expect_eq(sluice_admin_start(&d, &a), SLUICE_EINVAL);
    cr_expect(strstr(err, "sluice_admin_desc.port") != NULL, "%s", err);
    d.port = SLUICE_SOME(0);
    d.address = "not-an-address";
    cr_expect_eq(sluice_admin_start(&d, &a), SLUICE_EINVAL);
    cr_expect(strstr(err, "sluice_admin_desc.address") != NULL, "%s", err);
    d.address = "::1";
    if (sluice_admin_start(&d, &a) == SLUICE_OK) { /* hosts without IPv6 skip this */
        char base[64];
        snprintf(base, sizeof base, "http://[::1]:%u", sluice_admin_port(a));
        struct reply r = http("GET", base, "/compute/concurrency", NULL, NULL);
        cr_expect_eq(r.status, 200);
        reply_free(&r);
        sluice_admin_stop(a);
    }
}

static int connect_admin(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Milliseconds until the server closes fd (reads and drops what it sends), or -1 past limit. */
static int closed_within(int fd, int limit_ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        int spent = (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (spent > limit_ms)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, limit_ms - spent) > 0) {
            char buf[1024];
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0)
                return spent;
        }
    }
}

ADMIN_TEST(slow_clients_time_out_and_connections_are_capped)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.timeout_s = 1, .max_connections = 2});
    uint16_t port = sluice_admin_port(fx.admin);
    /* A client that sends half a request and stalls is dropped after timeout_s. */
    int slow = connect_admin(port);
    const char half[] = "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    cr_assert_eq(send(slow, half, sizeof half - 1, 0), (ssize_t)(sizeof half - 1));
    int ms = closed_within(slow, 5000);
    cr_expect(ms >= 0, "a stalled client kept its connection past 5 s");
    close(slow);

    /* Two event streams (requests that have arrived and are being answered) fill
     * max_connections; a third is answered 503 (JSON, then closed) at once, not reset
     * and not served. */
    const char stream[] = "GET /compute/concurrency/events?node_id=cloud:locked&follow=1 "
                          "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    int a = connect_admin(port), b = connect_admin(port);
    send(a, stream, sizeof stream - 1, 0);
    send(b, stream, sizeof stream - 1, 0);
    usleep(100 * 1000);
    int c = connect_admin(port);
    const char get[] = "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    cr_assert_eq(send(c, get, sizeof get - 1, 0), (ssize_t)(sizeof get - 1));
    char answer[2048] = "";
    size_t got = 0;
    for (ssize_t n; got < sizeof answer - 1 &&
                    (n = recv(c, answer + got, sizeof answer - 1 - got, 0)) > 0;)
        got += (size_t)n;
    answer[got] = '\0';
    cr_expect(strncmp(answer, "HTTP/1.1 503", 12) == 0, "beyond max_connections: %s", answer);
    cr_expect(strstr(answer, "max_connections") != NULL, "the JSON says what to raise: %s", answer);
    close(a);
    close(b);
    close(c);
    /* Once they are gone it serves again (a stream notices its client left when it next
     * writes: within a sampler tick). */
    long status = 0;
    for (int tries = 0; tries < 30 && status != 200; tries++) {
        usleep(100 * 1000);
        struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
        status = r.status;
        reply_free(&r);
    }
    cr_expect_eq(status, 200, "still refused 3 s after the streams' clients left");
}

ADMIN_TEST(oversized_headers_are_refused_not_crashed_on)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.max_request_bytes = 4096});
    char *big = malloc(20000);
    snprintf(big, 20000, "X-Big: ");
    memset(big + 7, 'a', 19000);
    big[19007] = '\0';
    const char *h[] = {big, NULL};
    struct reply r = http("GET", fx.base, "/compute/concurrency", h, NULL);
    cr_expect(r.status == 431 || r.status == 413, "status %ld", r.status);
    reply_free(&r);
    free(big);
    r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 200, "still serving");
    reply_free(&r);
}

/* `req` sent as it is over a fresh connection, the answer read until the server closes or
 * its Content-Length is in: status 0 when it closed without one. */
static struct reply raw_request(const char *req)
{
    int fd = connect_admin(sluice_admin_port(fx.admin));
    cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    char buf[16384];
    size_t len = 0;
    const char *end = NULL;
    while (len < sizeof buf - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n = poll(&p, 1, 5000) > 0 ? recv(fd, buf + len, sizeof buf - 1 - len, 0) : -1;
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
        const char *cl = end ? strcasestr(buf, "\r\nContent-Length: ") : NULL;
        if (cl && cl < end && (size_t)(end + 4 - buf) + strtoul(cl + 18, NULL, 10) <= len)
            break;
    }
    close(fd);
    buf[len] = '\0';
    struct reply r;
    memset(&r, 0, sizeof r);
    end = strstr(buf, "\r\n\r\n");
    if (!end || strncmp(buf, "HTTP/1.", 7) != 0) {
        r.body = calloc(1, 1);
        return r;
    }
    r.status = strtol(buf + 9, NULL, 10);
    const char *ct = strcasestr(buf, "\r\nContent-Type: ");
    if (ct && ct < end)
        snprintf(r.content_type, sizeof r.content_type, "%.*s", (int)strcspn(ct + 16, "\r\n"),
                 ct + 16);
    r.body = strdup(end + 4);
    r.len = strlen(r.body);
    return r;
}

/*
 * Every answer the endpoint makes itself is its JSON error, also to requests curl would
 * not send: an oversized body announced by Content-Length (refused before it is read),
 * a method no route takes, HTTP/1.0 without a Host, a node_id that is not UTF-8. The
 * requests libmicrohttpd refuses before the endpoint sees them (admin.h lists them) get
 * its answer and a closed connection, and the endpoint serves on.
 */
ADMIN_TEST(raw_requests_get_json_errors_and_unparsable_ones_get_libmicrohttpd_answer)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.max_body_bytes = 1024});
    expect_error(raw_request("POST /compute/concurrency/clear?node_id=cloud:locked HTTP/1.1\r\n"
                             "Host: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"),
                 413, "over the limit");
    expect_error(raw_request("BREW /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
                 405, "BREW");
    expect_error(raw_request("GET /nowhere HTTP/1.0\r\n\r\n"), 404, "no route");
    expect_error(raw_request("GET /compute/concurrency/events?node_id=%FF HTTP/1.1\r\n"
                             "Host: 127.0.0.1\r\n\r\n"),
                 400, "not UTF-8");
    struct reply r = raw_request("GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\n\r\n");
    cr_expect_eq(r.status, 200, "%s", r.body);
    cr_expect(strstr(r.content_type, "application/json") != NULL, "type %s", r.content_type);
    json_decref(parse(&r));
    reply_free(&r);

    static const struct {
        const char *req;
        long status;
    } unparsable[] = {
        {"GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 505},
        {"GET / HTTP/3.0\r\n\r\n", 505},
        {"GET / FOO/1.1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n", 400},
    };
    for (size_t k = 0; k < sizeof unparsable / sizeof *unparsable; k++) {
        r = raw_request(unparsable[k].req);
        cr_expect_eq(r.status, unparsable[k].status, "%s: %ld %s", unparsable[k].req, r.status,
                     r.body);
        reply_free(&r);
    }
    r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 200, "still serving");
    reply_free(&r);
}

/*
 * A clear the state file cannot take (another program's file at its path) is no success:
 * the lock is gone from memory only, and a restart would bring it back. The answer is a
 * 500 in the file's words (its path and why); the engine still dropped it in memory.
 */
ADMIN_TEST(a_clear_the_state_file_cannot_write_is_an_error_naming_the_file)
{
    char dir[64], path[128];
    fixture_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ceilings.json", dir);
    struct sluice_statefile *sf = NULL;
    fixture_start_unwritable_state(&fx, path, &sf);
    struct reply r = http("POST", fx.base, "/compute/concurrency/clear?node_id=cloud:locked", NULL,
                          NULL);
    cr_expect_eq(r.status, 500, "%s", r.body);
    cr_expect(strstr(r.content_type, "application/json") != NULL, "type %s", r.content_type);
    json_t *j = parse(&r);
    const char *err = json_string_value(json_object_get(j, "error"));
    cr_expect(err && strstr(err, path) && strstr(err, "another program"),
              "the error names the file and why: %s", r.body);
    cr_expect(err && strstr(err, "restart"), "and what it means: %s", r.body);
    json_decref(j);
    reply_free(&r);
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_PROBING, "cleared in memory all the same");
    fixture_stop(&fx);
    sluice_statefile_close(sf);
    fixture_rmtree(dir);
}
