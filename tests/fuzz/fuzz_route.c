/*
 * fuzz_route — sluice-proxy's routing (shim/tools/sluice-proxy/route.c) on
 * any request body and path: route_model with an output buffer of 1 to
 * PROXY_MODEL_MAX bytes, cut to exactly that size so ASan sees any byte
 * past it, then route_pick and route_url over four backends (two prefixes,
 * two model lists, a default).
 *
 * Checked for every input:
 *   - route_model's answer is what jansson, a whole JSON parser, reads:
 *     where the body parses as one JSON object, a model is found exactly
 *     when the object's "model" is a string that fits, and it is that string
 *     (jansson, like the providers' parsers, keeps the last of a key that
 *     stands twice); whatever the body, the answer is a NUL-terminated
 *     string inside its buffer, empty when none is found;
 *   - route_pick returns a backend (there is a default), "org/m3", which one
 *     backend lists, routes to it, and route_url writes a URL that
 *     starts with that backend's upstream, NUL-terminated inside its buffer,
 *     or says it does not fit.
 *
 * The first byte sets the output size, the second the path's length; the
 * path follows, then the body.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_input.h"
#include "sluice-proxy/proxy.h"

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_route: %s\n", what);
        abort();
    }
}

/* route_pick reads a backend's header from the request; no backend here routes by one. */
bool http_header(const struct request *r, const char *name, const char **value, size_t *len)
{
    (void)r, (void)name, (void)value, (void)len;
    check(false, "a backend without a header asked for one");
    return false;
}

static char up_a[] = "http://127.0.0.1:1/base/", up_b[] = "http://127.0.0.1:2",
            up_m[] = "http://127.0.0.1:3/v1", up_d[] = "http://127.0.0.1:4";
static char id_a[] = "a", id_b[] = "b", id_m[] = "m", id_d[] = "d";
static char pre_a[] = "/a", pre_b[] = "/v1/", pre_root[] = "/";
static char m1[] = "m1", m3[] = "org/m3", cafe[] = "caf\xc3\xa9";
static struct options opts = {
    .backends = {{.id = id_a, .upstream = up_a, .prefix = pre_a},
                 {.id = id_b, .upstream = up_b, .prefix = pre_b},
                 {.id = id_m, .upstream = up_m, .prefix = pre_root, .models = {m1, m3, cafe},
                  .n_models = 3},
                 {.id = id_d, .upstream = up_d, .prefix = pre_root, .is_default = true}},
    .n_backends = 4};

/* The model a whole JSON parser reads in body, into out (size bytes): 1 found, 0 none, -1 the
 * body is no JSON object jansson takes. */
static int model_by_jansson(const char *body, size_t len, char *out, size_t size)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return -1;
    }
    json_t *m = json_object_get(root, "model");
    int found = json_is_string(m) && json_string_length(m) < size;
    if (found)
        memcpy(out, json_string_value(m), json_string_length(m) + 1);
    json_decref(root);
    return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool prepared;
    if (!prepared) {
        routes_prepare(&opts);
        prepared = true;
    }
    struct fuzz_in in = {data, size};
    size_t out_size = 1 + fuzz_pick(&in, PROXY_MODEL_MAX);
    size_t path_len = fuzz_u8(&in);
    if (path_len > in.n)
        path_len = in.n;
    char path[256];
    memcpy(path, in.p, path_len);
    path[path_len] = '\0';
    in.p += path_len;
    in.n -= path_len;

    /* Exactly the input's bytes, so reading past them is caught. */
    char *body = malloc(in.n ? in.n : 1);
    memcpy(body, in.p, in.n);
    char *model = malloc(out_size);
    bool found = route_model(body, in.n, model, out_size);
    size_t model_len = strnlen(model, out_size);
    check(model_len < out_size, "the model is NUL-terminated inside its buffer");
    check(found || model_len == 0, "no model leaves the buffer empty");

    if (in.n <= PROXY_MODEL_READ_MAX && !memchr(body, '\0', in.n)) {
        char want[PROXY_MODEL_MAX];
        int j = model_by_jansson(body, in.n, want, out_size);
        if (j >= 0) {
            check(found == (j == 1), "route_model and jansson disagree whether there is a model");
            check(!found || !strcmp(model, want), "route_model read another model than jansson");
        }
    }

    struct backend *b = route_pick(&opts, path, NULL, found ? model : NULL);
    check(b != NULL, "a request with a default backend routes somewhere");
    check(!found || strcmp(model, "org/m3") || b == &opts.backends[2],
          "a listed model routes to its backend");
    char url[128];
    if (route_url(b, path, url, sizeof url) == 0) {
        check(strnlen(url, sizeof url) < sizeof url, "the URL is NUL-terminated");
        check(!strncmp(url, b->upstream, b->upstream_len), "the URL starts at the upstream");
    }
    free(model);
    free(body);
    return 0;
}
