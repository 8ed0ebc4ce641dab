/*
 * route.c — which backend serves a request, and the URL it goes to.
 *
 * Rules, first match wins:
 *   1. a backend whose `header` the request carries with `header_value`;
 *   2. a backend listing the JSON body's "model" in `models` (the top-level
 *      object's own key, its escapes decoded, the last where it stands twice;
 *      only the first PROXY_MODEL_READ_MAX bytes of the body are read:
 *      routing never parses a whole prompt);
 *   3. the backend with the longest `prefix` the path starts with, among
 *      those that route by prefix (no header, no models);
 *   4. the default backend (`default = true`), else 404 listing the routes.
 * Only configured upstreams are reachable: the URL is always the chosen
 * backend's base plus the path with its prefix removed.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <jansson.h>
#include <string.h>

static bool prefix_matches(const struct backend *b, const char *path)
{
    if (strncmp(path, b->prefix, b->prefix_len))
        return false;
    char next = path[b->prefix_len];
    return b->prefix[b->prefix_len - 1] == '/' || next == '\0' || next == '/' || next == '?';
}

static bool routes_by_prefix(const struct backend *b)
{
    return !b->header && !b->n_models;
}

/* The index just past the JSON white space at or after i in s[0, n). */
static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* A string longer than this is searched with memchr: a prompt is most of a body, and a walk a
 * byte at a time took 19 us over a 64 KiB one (0.8 us with memchr; gcc -O2). Keys and short
 * values are walked, where memchr's set-up costs more than it saves. */
#define ROUTE_WALK_MAX 32

/* string_end past its first ROUTE_WALK_MAX bytes, from i inside the string: a quote ends it
 * unless an odd run of backslashes stands before it (the opening quote ends any run). */
static size_t string_end_long(const char *s, size_t i, size_t n)
{
    for (const char *q; i < n && (q = memchr(s + i, '"', n - i)) != NULL;) {
        size_t at = (size_t)(q - s), run = 0;
        while (s[at - run - 1] == '\\')
            run++;
        if (run % 2 == 0)
            return at + 1;
        i = at + 1;
    }
    return n;
}

/* The index just past the string whose opening quote is at i (n if it does not end). */
static inline size_t string_end(const char *s, size_t i, size_t n)
{
    size_t walk_end = n - i > ROUTE_WALK_MAX ? i + ROUTE_WALK_MAX : n;
    for (i++; i < walk_end; i++)
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    return string_end_long(s, i, n);
}

/*
 * The JSON string token s[i, n) (from its opening quote) decoded into out, by jansson (already
 * the proxy's JSON reader). Clients escape what they please: PHP's json_encode writes
 * "meta-llama\/Llama-3-70b", Python's json.dumps writes any non-ASCII as \uXXXX; each is
 * the same model as the plain spelling. False for what is not one JSON string (unended, a bad
 * escape, half a surrogate pair, a NUL) or one that does not fit.
 */
static bool json_string_decode(const char *s, size_t i, size_t n, char *out, size_t size)
{
    json_t *v = json_loadb(s + i, string_end(s, i, n) - i, JSON_DECODE_ANY, NULL);
    bool ok = json_is_string(v) && json_string_length(v) < size;
    if (ok)
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
    json_decref(v);
    return ok;
}

/* Whether the string token s[i, end) says "model", however it is escaped ("\u006dodel" is
 * the same key to every JSON parser upstream). */
static bool is_model_key(const char *s, size_t i, size_t end)
{
    if (end - i == 7 && !memcmp(s + i, "\"model\"", 7))
        return true;
    char key[8];
    return memchr(s + i, '\\', end - i) && json_string_decode(s, i, end, key, sizeof key) &&
           !strcmp(key, "model");
}

/*
 * The body's own "model": "NAME", its escapes decoded: a key of the top-level object only, so
 * a "model" inside the messages or metadata never routes (a nested one read first sent a call
 * to another provider, with that provider's key). Where the key stands twice the last one
 * counts, as it does for the provider's own parser (Python's json, JavaScript's JSON.parse,
 * jansson): routing by the first sent a call for one model to another's backend. False (and
 * out empty) if there is none in the first PROXY_MODEL_READ_MAX bytes, or the last one is no
 * string that fits. Routing and the access log read it.
 */
bool route_model(const char *body, size_t len, char *out, size_t size)
{
    if (len > PROXY_MODEL_READ_MAX)
        len = PROXY_MODEL_READ_MAX;
    bool found = false;
    size_t i = skip_ws(body, 0, len);
    bool object = i < len && body[i] == '{';
    int depth = 0; /* objects and arrays open; the top-level object's members are at 1 */
    for (; object && i < len; i++) {
        char c = body[i];
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0)
                break;
        } else if (c == '"') {
            size_t end = string_end(body, i, len), colon = skip_ws(body, end, len);
            if (depth == 1 && colon < len && body[colon] == ':' && is_model_key(body, i, end)) {
                size_t v = skip_ws(body, colon + 1, len);
                found = v < len && body[v] == '"' && json_string_decode(body, v, len, out, size);
            }
            i = end - 1;
        }
    }
    if (!found && size)
        out[0] = '\0';
    return found;
}

/* The backend for a request whose body's "model" is `model` (route_model; NULL = none). */
struct backend *route_pick(struct options *o, const char *path, const struct request *r,
                           const char *model)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        const char *v;
        size_t vl;
        if (b->header && http_header(r, b->header, &v, &vl) && vl == strlen(b->header_value) &&
            !memcmp(v, b->header_value, vl))
            return b;
    }
    for (size_t i = 0; model && i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        for (size_t m = 0; m < b->n_models; m++)
            if (!strcmp(b->models[m], model))
                return b;
    }
    struct backend *best = NULL, *fallback = NULL;
    for (size_t i = 0; i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        if (b->is_default)
            fallback = b;
        if (routes_by_prefix(b) && prefix_matches(b, path) &&
            (!best || b->prefix_len > best->prefix_len))
            best = b;
    }
    return best ? best : fallback;
}

/* The part of `path` that goes upstream: without the backend's prefix. */
static const char *route_rest(const struct backend *b, const char *path)
{
    if (!prefix_matches(b, path))
        return path;
    return path + b->prefix_len - (b->prefix[b->prefix_len - 1] == '/' ? 1 : 0);
}

bool route_unpooled(const struct backend *b, const char *path)
{
    const char *rest = route_rest(b, path);
    for (size_t i = 0; i < b->n_unpooled; i++) {
        size_t n = strlen(b->unpooled[i]);
        if (!strncmp(rest, b->unpooled[i], n) &&
            (rest[n] == '\0' || rest[n] == '/' || rest[n] == '?' || b->unpooled[i][n - 1] == '/'))
            return true;
    }
    return false;
}

int route_url(const struct backend *b, const char *path, char *out, size_t size)
{
    const char *rest = route_rest(b, path);
    int n = snprintf(out, size, "%s%s%s", b->upstream, rest[0] == '/' || rest[0] == '?' ||
                                                              !rest[0] ? "" : "/", rest);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

void routes_list(const struct options *o, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < o->n_backends && n < size; i++) {
        const struct backend *b = &o->backends[i];
        int w;
        if (b->header)
            w = snprintf(out + n, size - n, "%s%s: %s -> %s", n ? ", " : "", b->header,
                         b->header_value, b->id);
        else if (b->n_models)
            w = snprintf(out + n, size - n, "%smodel %s%s -> %s", n ? ", " : "", b->models[0],
                         b->n_models > 1 ? ",..." : "", b->id);
        else
            w = snprintf(out + n, size - n, "%s%s -> %s", n ? ", " : "", b->prefix, b->id);
        if (w < 0)
            return;
        n += (size_t)w;
    }
}

/* The backends as routing reads them: each upstream without its trailing slashes, the lengths
 * kept. What a backend list must be is checked before (options.c, config.c). */
void routes_prepare(struct options *o)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        size_t ul = strlen(b->upstream);
        while (ul > 0 && b->upstream[ul - 1] == '/')
            b->upstream[--ul] = '\0';
        b->upstream_len = ul;
        b->prefix_len = strlen(b->prefix);
    }
}
