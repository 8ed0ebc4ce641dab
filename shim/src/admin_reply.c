/*
 * admin_reply.c — how the admin endpoint answers: a body, JSON, a JSON
 * error ({"error", "fix", "status"}, always valid UTF-8), and the query
 * parameters the routes take, whose mistakes are answered with a 400 or
 * 404 naming what to fix. Runs on a connection's thread.
 */
#define _GNU_SOURCE
#include "admin_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- answers ------------------------------------------------------------------- */

/* `j` as compact JSON and a newline (so `curl` output ends cleanly), for free(); NULL
 * when out of memory. */
static char *json_line(json_t *j, size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s)
        return NULL;
    *len = strlen(s);
    char *t = realloc(s, *len + 2);
    if (t) {
        s = t;
        s[(*len)++] = '\n';
        s[*len] = '\0';
    }
    return s;
}

static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result sluice__admin_send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                        char *body, size_t len, void (*release)(void *))
{
    struct MHD_Response *r =
        release ? MHD_create_response_from_buffer_with_free_callback(len, body, release)
                : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (release)
            release(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    return queue(c, status, r);
}

enum MHD_Result sluice__admin_send_json(struct MHD_Connection *c, unsigned status, json_t *body)
{
    size_t len = 0;
    char *s = json_line(body, &len);
    json_decref(body);
    if (!s)
        return MHD_NO;
    return sluice__admin_send_body(c, status, "application/json; charset=utf-8", s, len, free);
}

/* Copy src as valid UTF-8 (jansson refuses anything else, and the answer would be lost):
 * a byte that starts no sequence (a client's %FF, or one `%.200s` cut) becomes "\xFF".
 * dst takes 4 bytes per byte of src, plus the NUL. */
static void utf8_clean(char *dst, size_t size, const char *src)
{
    size_t o = 0;
    for (const char *p = src; *p;) {
        size_t n = sluice_utf8_len(p), w = n ? n : 4;
        if (o + w >= size)
            break;
        if (n)
            memcpy(dst + o, p, n);
        else
            snprintf(dst + o, 5, "\\x%02X", (unsigned char)*p);
        o += w;
        p += n ? n : 1;
    }
    dst[o] = '\0';
}

enum MHD_Result sluice__admin_send_error(struct MHD_Connection *c, unsigned status,
                                         const char *allow, const char *fix, const char *fmt, ...)
{
    char raw[1600], msg[4 * sizeof raw]; /* room for a state file's message */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    utf8_clean(msg, sizeof msg, raw);
    json_t *o = json_pack("{s:s,s:s,s:i}", "error", msg, "fix", fix, "status", (int)status);
    size_t len = 0;
    char *s = o ? json_line(o, &len) : NULL;
    json_decref(o);
    if (!s)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, s, free);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (allow)
        MHD_add_response_header(r, "Allow", allow);
    if (status == 503) /* full: give the slot back rather than keep the connection */
        MHD_add_response_header(r, "Connection", "close");
    return queue(c, status, r);
}

/* ---- query parameters --------------------------------------------------------------- */

ptrdiff_t sluice__admin_want_node(struct sluice_admin *a, struct MHD_Connection *c, bool required,
                                  enum MHD_Result *answered)
{
    const char *id = NULL;
    size_t len = 0;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "node_id", 7, &id, &len) != MHD_YES)
        id = NULL;
    if (!id && !required)
        return -2;
    if (!id) {
        *answered = sluice__admin_send_error(
            c, 400, NULL, "add ?node_id=NODE (GET /compute/concurrency lists the nodes)",
            "missing node_id");
        return -1;
    }
    /* A %00 decodes to a NUL inside the value: "cloud:a%00junk" must not name cloud:a. */
    bool control = strlen(id) != len, utf8 = true;
    for (const char *p = id; *p && utf8;) {
        size_t n = sluice_utf8_len(p);
        control |= (unsigned char)*p < 0x20 || *p == 0x7f;
        utf8 = n != 0;
        p += n;
    }
    if (len == 0 || len > SLUICE_BACKEND_ID_MAX || control || !utf8) {
        /* A fixed node's ID may be longer than an adaptive one's (its node ID, stored). */
        char fix[256];
        snprintf(fix, sizeof fix,
                 "node_id must be a backend ID: 1..%d bytes of UTF-8 (an adaptive node's at "
                 "most %d), no control characters (GET /compute/concurrency lists the nodes)",
                 SLUICE_BACKEND_ID_MAX, SLUICE_NODE_ID_MAX - 1);
        *answered = sluice__admin_send_error(c, 400, NULL, fix, "malformed node_id (%s)",
                                             len == 0  ? "empty"
                                             : control ? "control character"
                                             : !utf8   ? "not UTF-8"
                                                       : "too long");
        return -1;
    }
    ptrdiff_t i = sluice__admin_node_index(a, id);
    if (i < 0) {
        json_t *known = json_array();
        for (size_t k = 0; k < a->n_nodes; k++)
            json_array_append_new(known, json_string(a->nodes[k].id));
        char *list = json_dumps(known, JSON_COMPACT);
        json_decref(known);
        *answered = sluice__admin_send_error(c, 404, NULL, "use one of the registered nodes",
                                             "unknown node_id \"%.255s\"; known nodes: %.300s", id,
                                             list ? list : "[]");
        free(list);
    }
    return i;
}

bool sluice__admin_want_u64(struct MHD_Connection *c, const char *name, uint64_t *out,
                            enum MHD_Result *answered)
{
    const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    *out = 0;
    if (!s)
        return true;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-' || s[0] == '+' || s[0] == ' ') {
        *answered = sluice__admin_send_error(c, 400, NULL, "pass a decimal event seq, e.g. after=0",
                                             "malformed %s \"%.64s\"", name, s);
        return false;
    }
    *out = v;
    return true;
}

bool sluice__admin_want_flag(struct MHD_Connection *c, const char *name, bool *out,
                             enum MHD_Result *answered)
{
    const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    *out = s && (!strcmp(s, "1") || !strcmp(s, "true"));
    if (!s || *out || !strcmp(s, "0") || !strcmp(s, "false"))
        return true;
    *answered = sluice__admin_send_error(c, 400, NULL, "use 1/true or 0/false",
                                         "malformed %s \"%.64s\"", name, s);
    return false;
}
