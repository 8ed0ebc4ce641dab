/*
 * fuzz_classify — sluice_curl_classify on any response: a status, a curl
 * code, whether the request left, a CURLINFO_RETRY_AFTER value or none, a
 * clock, a clamp, a dialect (AUTO or any row, or a value outside the map),
 * up to 32 headers parsed from the rest of the input ("Name: value" lines;
 * some with NULL names or values) and, after a blank line, a body. The
 * seeds hold Retry-After in both forms (delay-seconds and HTTP-date),
 * retry-after-ms, every dialect's header family (OpenAI, Anthropic's RFC
 * 3339 resets, the IETF structured fields, ...) and error bodies (Gemini's
 * RetryInfo, OpenRouter's retry_after_seconds, insufficient_quota).
 *
 * Checked for every input (the rule in sluice/curl.h):
 *   - the kind follows SLUICE_CURL_KIND_MAP from the status and the curl code, a
 *     refusal (429/503/529) refined only to what its body or budgets may
 *     make it (quota, platform, and rate for a 429), the outcome follows the
 *     kind, and the return value is the kind;
 *   - 0 <= retry_after_ns <= the clamp; rate-limit fields are -1 or >= 0;
 *   - a lone delay-seconds Retry-After (no retry-after-ms, no
 *     CURLINFO value) is exactly min(seconds, clamp);
 *   - only the fields the header names are written, and a second call on
 *     the same input gives the same bytes (pure).
 *
 * And sluice_curl_classify_event with the whole input as an event's data
 * (the seeds event_* are error events in each provider's shape), checked as
 * its header promises: data without "error" is no error event; a non-error
 * event leaves *out untouched; an error event's status is 0 or 400 to 599,
 * its kind SERVER_ERROR where it names no status and else the map's for
 * that status (refined as a refusal may be), its outcome the kind's, its
 * Retry-After and hold within the default clamp, and its message a string.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>

#include <sluice/curl.h>

#include "fuzz_input.h"

#define MAX_HEADERS 32

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_classify: %s\n", what);
        abort();
    }
}

static enum sluice_curl_kind expected_kind(long s, CURLcode code, bool sent)
{
    if (code == CURLE_OPERATION_TIMEDOUT && sent)
        return SLUICE_CURL_PROVIDER_TIMEOUT;
    if (code != CURLE_OK)
        return SLUICE_CURL_TRANSPORT;
    if (s >= 200 && s < 300)
        return SLUICE_CURL_SUCCESS;
    if (s == 402)
        return SLUICE_CURL_QUOTA;
    if (s == 429 || s == 503)
        return SLUICE_CURL_OVERLOADED;
    if (s == 529)
        return SLUICE_CURL_PLATFORM_OVERLOAD;
    if (s == 504)
        return SLUICE_CURL_PROVIDER_TIMEOUT;
    if (s >= 400 && s < 500)
        return SLUICE_CURL_CLIENT_ERROR;
    if (s >= 500 && s < 600)
        return SLUICE_CURL_SERVER_ERROR;
    return SLUICE_CURL_UNEXPECTED;
}

/* What a refusal of status `s` may be refined to, once its body and budgets are heard. */
static bool refined_from(enum sluice_curl_kind got, enum sluice_curl_kind want, long s)
{
    if (got == want)
        return true;
    if (want != SLUICE_CURL_OVERLOADED && want != SLUICE_CURL_PLATFORM_OVERLOAD)
        return false;
    return got == SLUICE_CURL_QUOTA || got == SLUICE_CURL_PLATFORM_OVERLOAD ||
           (got == SLUICE_CURL_RATE_LIMITED && s == 429);
}

static enum sluice_outcome expected_outcome(enum sluice_curl_kind k)
{
    switch (k) {
    case SLUICE_CURL_SUCCESS:
        return SLUICE_OUTCOME_OK;
    case SLUICE_CURL_OVERLOADED:
    case SLUICE_CURL_PROVIDER_TIMEOUT:
        return SLUICE_OUTCOME_OVERLOAD;
    case SLUICE_CURL_RATE_LIMITED:
        return SLUICE_OUTCOME_RATE;
    case SLUICE_CURL_PLATFORM_OVERLOAD:
        return SLUICE_OUTCOME_PLATFORM;
    case SLUICE_CURL_QUOTA:
        return SLUICE_OUTCOME_QUOTA;
    default:
        return SLUICE_OUTCOME_IGNORE;
    }
}

/* Digits only (no blanks, sign or fraction), at most 18 of them: the value, else -1. */
static int64_t plain_seconds(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > 18 || strspn(v, "0123456789") != n)
        return -1;
    return strtoll(v, NULL, 10);
}

/* The input as one event's data, in the dialect the classify part drew. */
static void check_event(const uint8_t *data, size_t size, enum sluice_curl_dialect dialect)
{
    struct sluice_curl_result out, pristine;
    memset(&out, 0xA5, sizeof out);
    memset(&pristine, 0xA5, sizeof pristine);
    bool error = sluice_curl_classify_event((const char *)data, size, dialect, &out);
    if (!error) {
        check(memcmp(&out, &pristine, sizeof out) == 0, "a non-error event leaves *out untouched");
        return;
    }
    check(memmem(data, size, "error", 5) != NULL, "data without \"error\" is no error event");
    long s = out.http_status;
    check(s == 0 || (s >= 400 && s <= 599), "an event's status is 0 or 400..599");
    check(s ? refined_from(out.kind, expected_kind(s, CURLE_OK, true), s)
            : out.kind == SLUICE_CURL_SERVER_ERROR,
          "an event's kind is its status's, or SERVER_ERROR where it names none");
    check(out.outcome == expected_outcome(out.kind), "an event's outcome follows its kind");
    check(out.retry_after_ns >= 0 && out.retry_after_ns <= SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS &&
              out.hold_ns >= 0 && out.hold_ns <= SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS,
          "an event's Retry-After and hold are clamped");
    check(memchr(out.error, '\0', sizeof out.error) != NULL, "an event's message is a string");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    static const long statuses[] = {0, 100, 199, 200, 204, 299, 300, 302, 399, 400, 404, 428,
                                    429, 430, 499, 500, 502, 503, 504, 505, 529, 599, 600, -1};
    struct sluice_curl_response r;
    memset(&r, 0, sizeof r);
    uint8_t how = fuzz_u8(&in);
    r.http_status = how & 1 ? (long)(int32_t)fuzz_u32(&in)
                            : statuses[fuzz_pick(&in, sizeof statuses / sizeof statuses[0])];
    r.code = how & 2 ? (CURLcode)(fuzz_u8(&in) % 100) : CURLE_OK;
    r.request_sent = how & 4;
    r.retry_after_s = how & 8 ? fuzz_i64(&in) : -1;
    r.now_s = how & 16 ? fuzz_i64(&in) : INT64_C(1764547200); /* 0 would read time() */
    if (r.now_s == 0)
        r.now_s = 1;
    r.retry_after_max_ns = how & 32 ? fuzz_i64(&in) : 0;
    r.dialect = (enum sluice_curl_dialect)(fuzz_u8(&in) % 13); /* 11 rows, two outside */

    /* The rest: header lines. */
    static char text[1 << 16];
    size_t len = in.n < sizeof text - 1 ? in.n : sizeof text - 1;
    memcpy(text, in.p, len);
    text[len] = '\0';
    /* A blank line ends the headers; the rest is the body (not NUL-terminated for classify). */
    char *blank = strstr(text, "\n\n");
    if (blank) {
        *blank = '\0';
        r.body = blank + 2;
        r.body_len = len - (size_t)(blank + 2 - text);
    }
    struct sluice_curl_header h[MAX_HEADERS];
    size_t n = 0;
    for (char *line = text; line && *line && n < MAX_HEADERS;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *colon = strchr(line, ':');
        if (colon) {
            *colon = '\0';
            char *v = colon + 1;
            while (*v == ' ')
                v++;
            h[n].name = line[0] == '!' ? NULL : line; /* "!" marks a NULL name ... */
            h[n].value = v[0] == '!' ? NULL : v;      /* ... or value */
            n++;
        }
        line = next;
    }
    r.headers = n ? h : (how & 64 ? h : NULL);
    r.n_headers = n;

    struct sluice_curl_result out, again;
    memset(&out, 0xA5, sizeof out);
    memset(&again, 0xA5, sizeof again);
    enum sluice_curl_kind kind = sluice_curl_classify(&r, &out);
    sluice_curl_classify(&r, &again);
    check(memcmp(&out, &again, sizeof out) == 0, "classify is pure: same input, same bytes");

    enum sluice_curl_kind want = expected_kind(r.http_status, r.code, r.request_sent);
    check(kind == out.kind, "the return value is out->kind");
    check(refined_from(kind, want, r.http_status), "the kind follows SLUICE_CURL_KIND_MAP");
    check(out.outcome == expected_outcome(kind), "the outcome follows the kind");
    check(out.http_status == r.http_status && out.curl_code == r.code, "status and code copied");
    check(strcmp(sluice_curl_kind_name(kind), "unknown") != 0, "every kind has a name");
    int64_t max = r.retry_after_max_ns > 0 ? r.retry_after_max_ns
                                           : SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS;
    check(out.retry_after_ns >= 0 && out.retry_after_ns <= max, "Retry-After is clamped");
    const struct sluice_curl_budget *budgets[] = {&out.ratelimit.requests, &out.ratelimit.tokens};
    for (int i = 0; i < 2; i++) {
        const struct sluice_curl_budget *b = budgets[i];
        check(b->limit >= -1 && b->remaining >= -1 && b->reset_ns >= -1 && b->reset_at_ms >= -1,
              "a rate-limit field is -1 or a value");
        check((b->reset_ns < 0) == (b->reset_at_ms < 0), "a reset has both forms or neither");
        check(strcmp(sluice_curl_window_name(b->window), "unknown") != 0 ||
                  b->window == SLUICE_CURL_WINDOW_UNKNOWN,
              "the window is one of the map");
        check(b->limit >= 0 || b->window == SLUICE_CURL_WINDOW_UNKNOWN,
              "no window without a limit");
    }
    check(strcmp(sluice_curl_dialect_name(out.ratelimit.source), "unknown") != 0,
          "the source is a dialect");
    check(out.hold_ns >= 0 && out.hold_ns <= max, "the hold is clamped");
    check(out.kind != SLUICE_CURL_QUOTA || out.hold_ns == 0, "a quota refusal holds nothing");
    double rate = sluice_curl_stated_rate(&out);
    check(rate >= 0, "a rate is never negative");
    check(rate == 0 || (out.kind == SLUICE_CURL_SUCCESS && out.ratelimit.requests.limit > 0 &&
                        out.ratelimit.requests.window != SLUICE_CURL_WINDOW_DAY),
          "a rate only from a success that states a request limit, never per day");

    /* A lone delay-seconds Retry-After is exactly its value, clamped. */
    int retry_after = 0, retry_after_ms = 0;
    int64_t seconds = -1;
    for (size_t i = 0; i < n; i++) {
        if (!h[i].name || !h[i].value)
            continue;
        if (!strcasecmp(h[i].name, "retry-after")) {
            retry_after++;
            seconds = plain_seconds(h[i].value);
        }
        retry_after_ms += !strcasecmp(h[i].name, "retry-after-ms");
    }
    if (retry_after == 1 && !retry_after_ms && r.retry_after_s < 0 && seconds >= 0) {
        int64_t ns = seconds > INT64_MAX / SLUICE_NS_PER_SEC ? INT64_MAX
                                                             : seconds * SLUICE_NS_PER_SEC;
        check(out.retry_after_ns == (ns < max ? ns : max), "delay-seconds is read exactly");
    }

    /* Fields classify does not own are untouched. */
    struct sluice_curl_result pristine;
    memset(&pristine, 0xA5, sizeof pristine);
    check(out.status == pristine.status && out.latency_ns == pristine.latency_ns &&
              out.transfer_ns == pristine.transfer_ns && out.queued_ns == pristine.queued_ns &&
              out.in_flight_at_start == pristine.in_flight_at_start,
          "classify writes only the fields its header names");

    check_event(data, size, r.dialect);
    return 0;
}
