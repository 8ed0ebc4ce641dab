/*
 * source.c — where sluicectl's figures come from: a running process's admin
 * endpoint over HTTP (libcurl, every call bounded by a timeout), or the state
 * file.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t fetched_write(char *p, size_t size, size_t n, void *ctx)
{
    struct fetched *f = ctx;
    size_t add = size * n;
    if (f->len + add > (64u << 20))
        return 0; /* an admin answer is small; a flood is not one */
    char *b = realloc(f->body, f->len + add + 1);
    if (!b)
        return 0;
    memcpy(b + f->len, p, add);
    f->len += add;
    b[f->len] = '\0';
    f->body = b;
    return add;
}

/* See sluicectl.h. */
char *admin_url(const char *base, const char *path, const char *node, const char *extra)
{
    size_t blen = strlen(base);
    while (blen && base[blen - 1] == '/')
        blen--;
    char *escaped = node ? curl_easy_escape(NULL, node, 0) : NULL;
    size_t size = blen + strlen(path) + (escaped ? strlen(escaped) : 0) + 64 + (extra ? strlen(extra) : 0);
    char *url = malloc(size);
    if (url)
        snprintf(url, size, "%.*s%s%s%s%s", (int)blen, base, path, escaped ? "?node_id=" : "",
                 escaped ? escaped : "", extra ? extra : "");
    curl_free(escaped);
    return url;
}

void admin_fetch(const char *method, const char *url, struct fetched *f)
{
    memset(f, 0, sizeof *f);
    CURL *c = curl_easy_init();
    if (!c) {
        f->rc = CURLE_OUT_OF_MEMORY;
        snprintf(f->error, sizeof f->error, "out of memory");
        return;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "POST"))
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fetched_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, f->error);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 15000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    f->rc = curl_easy_perform(c);
    if (f->rc != CURLE_OK && !f->error[0])
        snprintf(f->error, sizeof f->error, "%s", curl_easy_strerror(f->rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
    const char *type = NULL;
    if (curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type) == CURLE_OK && type)
        snprintf(f->content_type, sizeof f->content_type, "%s", type);
    curl_easy_cleanup(c);
}

/* See sluicectl.h. */
bool content_type_is(const char *type, const char *want)
{
    size_t n = strlen(want);
    return type && !strncasecmp(type, want, n) && (!type[n] || type[n] == ';' || type[n] == ' ');
}

/* See sluicectl.h. */
int admin_type_ok(const char *url, const char *type, const char *want)
{
    if (content_type_is(type, want))
        return EXIT_OK;
    char *shown = type && *type ? text_clean(type, false) : NULL;
    int rc = fail("%s did not answer as a sluice admin endpoint: HTTP 200 with %s%s, where one "
                  "sends %s (check that --admin is the program's admin endpoint: the second URL "
                  "sluice-proxy prints at start, http://127.0.0.1:8400 by default, not its API "
                  "address or another web server)",
                  url, shown ? "Content-Type " : "no Content-Type", shown ? shown : "", want);
    free(shown);
    return rc;
}

/* See sluicectl.h. */
int admin_answer_ok(const char *base, const char *url, const struct fetched *f)
{
    if (f->rc != CURLE_OK)
        return fail("cannot reach the admin endpoint at %s: %s", base, f->error);
    if (f->status == 200)
        return EXIT_OK;
    json_t *j = f->body ? json_loads(f->body, 0, NULL) : NULL;
    const char *err = json_string_value(json_object_get(j, "error"));
    const char *fix = json_string_value(json_object_get(j, "fix"));
    int rc = err ? fail_answer(err, fix)
                 : fail("%s answered HTTP %ld: is it a sluice admin endpoint?", url, f->status);
    json_decref(j);
    return rc;
}

/* See sluicectl.h. */
json_t *admin_json(const char *method, const char *base, const char *path,
                          const char *node)
{
    char *url = admin_url(base, path, node, NULL);
    if (!url) {
        fail("out of memory");
        return NULL;
    }
    struct fetched f;
    admin_fetch(method, url, &f);
    json_t *j = NULL;
    if (admin_answer_ok(base, url, &f) == EXIT_OK) {
        j = f.body ? json_loads(f.body, 0, NULL) : NULL;
        if (!json_is_object(j)) {
            fail("%s did not answer JSON: is it a sluice admin endpoint?", url);
            json_decref(j);
            j = NULL;
        }
    }
    free(f.body);
    free(url);
    return j;
}

int open_state(const struct opts *o, const char *flag, struct sluice_statefile **f)
{
    char err[512];
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = o->state, .error = err,
                                                              .error_size = sizeof err},
                              f) == SLUICE_OK)
        return EXIT_OK;
    return fail_state_open(flag, err);
}
