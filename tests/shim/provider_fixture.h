/*
 * provider_fixture.h — one provider fixture (tests/fixtures/providers/NAME.http:
 * status line, headers, blank line, body; written from each provider's public
 * docs), parsed in place into the response sluice_curl_classify reads. Used by
 * tests/shim/provider_dialects.c (classified as it is) and tests/e2e/curl_paths.c
 * (served over loopback and classified by every transport).
 */
#ifndef SLUICE_TESTS_SHIM_PROVIDER_FIXTURE_H
#define SLUICE_TESTS_SHIM_PROVIDER_FIXTURE_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <sluice/curl.h>

struct provider_fixture {
    char name[64];           /* NAME */
    const char *status_line; /* "HTTP/1.1 429 Too Many Requests" */
    struct sluice_curl_header headers[32];
    /* http_status, headers and body as the file has them; CURLE_OK after the request was
     * sent, no Retry-After read by curl; now_s and dialect 0 (now, AUTO) for the caller to
     * set. */
    struct sluice_curl_response resp;
    char text[8192];
};

static inline void provider_fixture_load(struct provider_fixture *f, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/providers/%s.http", SLUICE_TEST_FIXTURES, name);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "fixture %s", path);
    size_t len = fread(f->text, 1, sizeof f->text - 1, fp);
    fclose(fp);
    f->text[len] = '\0';
    snprintf(f->name, sizeof f->name, "%s", name);
    memset(&f->resp, 0, sizeof f->resp);
    char *line = f->text, *next = strchr(line, '\n');
    cr_assert_not_null(next, "%s: a status line", name);
    *next = '\0';
    f->status_line = line;
    cr_assert_eq(sscanf(line, "HTTP/1.1 %ld", &f->resp.http_status), 1, "%s: status line", name);
    size_t n = 0;
    for (line = next + 1; (next = strchr(line, '\n')) && next != line; line = next + 1) {
        *next = '\0';
        char *colon = strchr(line, ':');
        cr_assert_not_null(colon, "%s: header line \"%s\"", name, line);
        cr_assert_lt(n, sizeof f->headers / sizeof f->headers[0], "%s: too many headers", name);
        *colon = '\0';
        f->headers[n++] = (struct sluice_curl_header){line, colon + 2};
    }
    f->resp.headers = f->headers;
    f->resp.n_headers = n;
    f->resp.body = next ? next + 1 : "";
    f->resp.body_len = strlen(f->resp.body);
    f->resp.code = CURLE_OK;
    f->resp.request_sent = true;
    f->resp.retry_after_s = -1;
}

#endif
