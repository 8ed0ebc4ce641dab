/*
 * admin_routes.c — the admin endpoint's routes: one row per route in
 * `routes` below, holding its method, path and handler (as Redis's command
 * table), and the handlers. Adding a route is adding a row and its
 * handler, and saying so in sluice/admin.h's route list and the README's:
 * the 404 answer lists the table, the admin fuzzer takes its paths from
 * that answer, and e2e/admin.c fails while admin.h, the README or the fuzz
 * dictionary lists other routes than the table.
 *
 * A handler runs on its connection's thread once the request has passed
 * admin_http.c's checks, and answers through admin_reply.c; its
 * return value is libmicrohttpd's (MHD_NO drops the connection).
 */
#include "admin_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/statefile.h>

#include "strbuf_internal.h"

/* The page, turned into bytes by shim/CMakeLists.txt. */
extern const unsigned char sluice__admin_page[];
extern const size_t sluice__admin_page_size;

static enum MHD_Result route_page(struct sluice_admin *a, struct MHD_Connection *c)
{
    (void)a;
    struct MHD_Response *r = MHD_create_response_from_buffer(
        sluice__admin_page_size, (void *)sluice__admin_page, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; img-src data:; "
                            "frame-ancestors 'none'");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result route_status(struct sluice_admin *a, struct MHD_Connection *c)
{
    char *body = sluice_admin_status_json(a);
    if (!body)
        return MHD_NO;
    return sluice__admin_send_body(c, 200, "application/json; charset=utf-8", body, strlen(body),
                                   free);
}

/* The events of `ring` after seq `after` as JSON Lines, oldest first. */
static enum MHD_Result send_event_lines(struct MHD_Connection *c,
                                        const struct sluice_event_ring *ring, uint64_t after)
{
    struct sluice__strbuf b = {0};
    uint64_t cursor = after;
    struct sluice_event batch[32];
    size_t got;
    uint64_t end = ring ? sluice_event_ring_count(ring) : 0;
    while (ring && cursor < end &&
           (got = sluice_event_ring_read(ring, &cursor, batch, 32, NULL)) > 0)
        for (size_t k = 0; k < got; k++) {
            char line[SLUICE_EVENT_JSON_MAX];
            size_t n = sluice_event_format_json(&batch[k], line, sizeof line);
            if (n < sizeof line)
                sluice__strbuf_put(&b, line, n);
        }
    char *body = sluice__strbuf_take(&b);
    if (!body)
        return MHD_NO;
    return sluice__admin_send_body(c, 200, "application/x-ndjson; charset=utf-8", body,
                                   strlen(body), free);
}

static enum MHD_Result route_events(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = sluice__admin_want_node(a, c, true, &answered);
    if (i < 0)
        return answered;
    uint64_t after;
    bool follow;
    if (!sluice__admin_want_u64(c, "after", &after, &answered) ||
        !sluice__admin_want_flag(c, "follow", &follow, &answered))
        return answered;
    if (follow)
        return sluice__admin_send_stream(a, c, (size_t)i, after);
    return send_event_lines(c, a->nodes[i].ring, after);
}

static enum MHD_Result route_history(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = sluice__admin_want_node(a, c, false, &answered);
    if (i == -1)
        return answered;
    json_t *root = json_object();
    json_t *nodes = json_object();
    json_object_set_new(root, "interval_ms", json_integer(1000));
    json_object_set_new(root, "fields", json_pack("[s,s,s,s,s]", "wall_ms", "limit", "in_flight",
                                                  "ceiling", "waiting"));
    pthread_mutex_lock(&a->mutex);
    for (size_t k = 0; k < a->n_nodes; k++)
        if ((size_t)i == k || (i == -2 && sluice__admin_node_listed(a, k)))
            json_object_set_new(nodes, a->nodes[k].id, sluice__admin_history_json(a, &a->nodes[k]));
    pthread_mutex_unlock(&a->mutex);
    json_object_set_new(root, "nodes", nodes);
    return sluice__admin_send_json(c, 200, root);
}

/* Is node `id` as a clear would leave it: probing without a lock, and nothing has happened
 * to it since its last clear (or ever)? Then a clear has nothing to do, and saying
 * "cleared" (with one more clear event in its feed) would be news of nothing. A node whose
 * last event is a store failure is not: the clear retries the store. */
static bool already_clear(const struct sluice_engine *e, const char *id)
{
    struct sluice_discovery_status st;
    return sluice_engine_status(e, id, &st) == SLUICE_OK &&
           st.state == SLUICE_DISCOVERY_PROBING && st.ceiling == 0 &&
           (st.last_event.seq == 0 || st.last_event.kind == SLUICE_EVENT_CLEAR);
}

/* Did the node's store fail since event seq `since` (a "store" event in its feed)? A
 * failing store never fails the clear itself (sluice_engine_clear): the event is how it
 * tells. */
static bool store_failed_since(const struct sluice_event_ring *ring, uint64_t since)
{
    struct sluice_event batch[32];
    size_t got;
    while ((got = sluice_event_ring_read(ring, &since, batch, 32, NULL)) > 0)
        for (size_t k = 0; k < got; k++)
            if (batch[k].kind == SLUICE_EVENT_STORE)
                return true;
    return false;
}

/* The node's lock is gone from memory but not from its store: a restart would bring it
 * back, so the clear did not do what was asked. Say why in the state file's words when the
 * program named its state file (desc.statefile). */
static enum MHD_Result clear_not_stored(struct sluice_admin *a, struct MHD_Connection *c,
                                        const char *id)
{
    char why[1024] = "";
    if (a->cfg.statefile)
        sluice_statefile_last_error(a->cfg.statefile, why, sizeof why);
    if (why[0])
        return sluice__admin_send_error(c, 500, NULL,
                                        "fix what it says (the folder not writable, a full "
                                        "disk, another program's file at that path), then clear "
                                        "again",
                                        "\"%s\" is cleared in memory, but its state file was "
                                        "not written, so a restart brings the lock back: %s",
                                        id, why);
    return sluice__admin_send_error(c, 500, NULL,
                                    "see the program's log for its store's error, fix it, then "
                                    "clear again",
                                    "\"%s\" is cleared in memory, but its store failed to drop "
                                    "the lock (a \"store\" event in its feed), so a restart "
                                    "brings it back",
                                    id);
}

static enum MHD_Result route_clear(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = sluice__admin_want_node(a, c, true, &answered);
    if (i < 0)
        return answered;
    const char *id = a->nodes[i].id;
    if (!a->nodes[i].ring)
        return sluice__admin_send_error(c, 409, NULL,
                                        "only adaptive nodes have a discovered ceiling to clear; "
                                        "change a fixed node's limit in its backend "
                                        "configuration (active)",
                                        "node \"%s\" has a fixed limit: it never probes or "
                                        "locks, so there is nothing to clear",
                                        id);
    uint64_t seen = sluice_event_ring_count(a->nodes[i].ring);
    bool cleared = !already_clear(a->engine, id);
    int status = cleared ? sluice_engine_clear(a->engine, id) : SLUICE_OK;
    if (status != SLUICE_OK)
        return sluice__admin_send_error(c, 500, NULL, "retry; see the node's event feed",
                                        "clearing \"%s\" failed: %s", id, sluice_strerror(status));
    /* Answer once the store has dropped the lock, so a reader of the state file sees it. */
    sluice_engine_sync(a->engine, id);
    if (cleared && store_failed_since(a->nodes[i].ring, seen))
        return clear_not_stored(a, c, id);
    json_t *node = sluice__admin_node_json(a, (size_t)i);
    json_t *root = json_object();
    json_object_set_new(root, "cleared", json_boolean(cleared));
    json_object_set_new(root, "node", node ? node : json_null());
    return sluice__admin_send_json(c, 200, root);
}

static enum MHD_Result route_metrics(struct sluice_admin *a, struct MHD_Connection *c)
{
    char *body = sluice_admin_metrics(a);
    if (!body)
        return MHD_NO;
    return sluice__admin_send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", body,
                                   strlen(body), free);
}

/* ---- the table ------------------------------------------------------------------- */

struct route {
    const char *method; /* "GET" (which takes HEAD too) or "POST" */
    const char *path;   /* matched exactly; the query string is the handler's */
    const char *query;  /* the parameters it needs, as the 404 answer lists them */
    enum MHD_Result (*handler)(struct sluice_admin *a, struct MHD_Connection *c);
};

static const struct route routes[] = {
    {"GET", "/", "", route_page},
    {"GET", "/compute/concurrency", "", route_status},
    {"GET", "/compute/concurrency/events", "?node_id=N", route_events},
    {"GET", "/compute/concurrency/history", "", route_history},
    {"POST", "/compute/concurrency/clear", "?node_id=N", route_clear},
    {"GET", "/metrics", "", route_metrics},
};

enum { N_ROUTES = sizeof routes / sizeof *routes };

/* "routes: GET /, GET /compute/concurrency, ..." from the table. */
static void routes_list(char *buf, size_t size)
{
    int n = snprintf(buf, size, "routes:");
    for (size_t k = 0; k < N_ROUTES && n >= 0 && (size_t)n < size; k++)
        n += snprintf(buf + n, size - (size_t)n, "%s %s %s%s", k ? "," : "", routes[k].method,
                      routes[k].path, routes[k].query);
}

enum MHD_Result sluice__admin_route(struct sluice_admin *a, struct MHD_Connection *c,
                                    const char *url, const char *method)
{
    const struct route *r = NULL;
    for (size_t k = 0; k < N_ROUTES && !r; k++)
        if (!strcmp(url, routes[k].path))
            r = &routes[k];
    if (!r) {
        char fix[512];
        routes_list(fix, sizeof fix);
        return sluice__admin_send_error(c, 404, NULL, fix, "no route %.200s", url);
    }
    bool post = !strcmp(r->method, "POST");
    bool takes = post ? !strcmp(method, "POST") : !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!takes)
        return sluice__admin_send_error(c, 405, post ? "POST" : "GET, HEAD",
                                        post ? "send it as POST, e.g. curl -X POST" : "use GET",
                                        "%s does not take %.16s", url, method);
    return r->handler(a, c);
}
