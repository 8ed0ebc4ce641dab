/*
 * curl.c — sluice_curl_classify: what one response says about a provider's
 * capacity (the table in sluice/curl.h), and the header parsers behind it.
 *
 * Everything here is pure and allocation-free so that tests and the fuzzer
 * can feed it any bytes. Numbers are parsed by hand rather than with strtoll
 * or strtod because the rules differ from theirs in ways that matter here:
 * no sign, no hex, no locale, saturation instead of ERANGE, and a strict
 * "whole value or nothing" so that "12abc" is garbage, not 12.
 */
#include "curl_internal.h"

#include <limits.h>
#include <string.h>
#include <strings.h>
#include <time.h>

const char *sluice_curl_kind_name(enum sluice_curl_kind kind)
{
    switch (kind) {
#define SLUICE__CURL_KIND_NAME(name, str)                                                          \
    case SLUICE_CURL_##name:                                                                       \
        return str;
        SLUICE_CURL_KIND_MAP(SLUICE__CURL_KIND_NAME)
#undef SLUICE__CURL_KIND_NAME
    }
    return "unknown";
}

static bool sluice__is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/*
 * Parse a non-negative decimal with an optional fraction ("12", "1.5") that
 * makes up the whole of [s, end) once surrounding blanks are trimmed, scaled
 * by `unit` (e.g. ns per second). Saturates at INT64_MAX. Returns false for
 * anything else (empty, signs, exponents, trailing text).
 */
static bool sluice__parse_scaled(const char *s, const char *end, int64_t unit, int64_t *out)
{
    while (s < end && sluice__is_space(*s))
        s++;
    while (end > s && sluice__is_space(end[-1]))
        end--;
    if (s == end)
        return false;
    int64_t whole = 0;
    bool saturated = false, digits = false;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        digits = true;
        int d = *s - '0';
        if (whole > (INT64_MAX - d) / 10)
            saturated = true;
        else
            whole = whole * 10 + d;
    }
    int64_t frac = 0; /* in units of `unit` */
    if (s < end && *s == '.') {
        s++;
        int64_t scale = unit;
        bool frac_digits = false;
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
            frac_digits = true;
            scale /= 10;
            frac += (*s - '0') * scale;
        }
        if (!frac_digits)
            return false;
    }
    if (!digits || s != end)
        return false;
    if (saturated || whole > (INT64_MAX - frac) / (unit ? unit : 1))
        *out = INT64_MAX;
    else
        *out = whole * unit + frac;
    return true;
}

static bool sluice__parse_int(const char *s, int64_t *out)
{
    return s && sluice__parse_scaled(s, s + strlen(s), 1, out);
}

/*
 * A duration as OpenAI writes x-ratelimit-reset-*: one or more
 * number+unit terms ("6m0s", "1h2m3.5s", "20ms", "150us"), or a bare number
 * of seconds. Saturates. Returns false for anything else.
 */
static bool sluice__parse_duration(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        int64_t ns;
    } units[] = {{"ns", 1},
                 {"us", 1000},
                 {"\xC2\xB5s", 1000}, /* µs */
                 {"ms", 1000000},
                 {"s", INT64_C(1000000000)},
                 {"m", INT64_C(60000000000)},
                 {"h", INT64_C(3600000000000)}};
    const char *end = s + strlen(s);
    while (s < end && sluice__is_space(*s))
        s++;
    while (end > s && sluice__is_space(end[-1]))
        end--;
    if (sluice__parse_scaled(s, end, SLUICE_NS_PER_SEC, out))
        return true;
    int64_t total = 0;
    bool any = false;
    while (s < end) {
        const char *num = s;
        while (s < end && ((*s >= '0' && *s <= '9') || *s == '.'))
            s++;
        const char *unit = s;
        while (s < end && !((*s >= '0' && *s <= '9') || *s == '.'))
            s++;
        size_t ulen = (size_t)(s - unit);
        int64_t scale = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strlen(units[i].unit) == ulen && memcmp(units[i].unit, unit, ulen) == 0)
                scale = units[i].ns;
        int64_t v;
        if (!scale || !sluice__parse_scaled(num, unit, scale, &v))
            return false;
        total = sluice_add_ns(total, v);
        any = true;
    }
    if (!any)
        return false;
    *out = total;
    return true;
}

/* x-ratelimit-reset: a bare number is epoch ms, epoch s or seconds from now (see the header). */
static bool sluice__parse_reset(const char *s, int64_t now_s, int64_t *out)
{
    int64_t v;
    if (!sluice__parse_int(s, &v))
        return sluice__parse_duration(s, out);
    int64_t at_ms;
    if (v >= INT64_C(1000000000000))
        at_ms = v;
    else if (v >= INT64_C(1000000000))
        at_ms = v * 1000;
    else {
        *out = v > INT64_MAX / SLUICE_NS_PER_SEC ? INT64_MAX : v * SLUICE_NS_PER_SEC;
        return true;
    }
    int64_t left_ms = at_ms - now_s * 1000;
    *out = left_ms <= 0
               ? 0
               : (left_ms > INT64_MAX / SLUICE_NS_PER_MS ? INT64_MAX : left_ms * SLUICE_NS_PER_MS);
    return true;
}

/*
 * Retry-After's value in ns: delay-seconds, or an HTTP-date (curl_getdate,
 * the parser behind CURLINFO_RETRY_AFTER) minus now. Past dates are 0.
 */
static bool sluice__parse_retry_after(const char *s, int64_t now_s, int64_t *out)
{
    if (sluice__parse_scaled(s, s + strlen(s), SLUICE_NS_PER_SEC, out))
        return true;
    time_t at = curl_getdate(s, NULL);
    if (at == (time_t)-1)
        return false;
    int64_t left = (int64_t)at - now_s;
    *out = left <= 0
               ? 0
               : (left > INT64_MAX / SLUICE_NS_PER_SEC ? INT64_MAX : left * SLUICE_NS_PER_SEC);
    return true;
}

static int64_t sluice__clamp_ns(int64_t v, int64_t max)
{
    return v < 0 ? 0 : (v > max ? max : v);
}

/*
 * Read every header sluice keeps: the rate-limit family into *rl, and
 * Retry-After and retry-after-ms (ns; -1 = absent or garbage).
 */
static void sluice__read_headers(const struct sluice_curl_response *r, int64_t now_s,
                                 struct sluice_curl_ratelimit *rl, int64_t *retry_after,
                                 int64_t *retry_after_ms)
{
    static const struct {
        const char *name;
        size_t field;  /* offset in struct sluice_curl_ratelimit */
        int parse;     /* 0 integer, 1 duration, 2 reset (bare number = epoch or seconds) */
        bool fallback; /* the plain form: used only when the specific one is absent */
    } known[] = {
        {"x-ratelimit-limit-requests", offsetof(struct sluice_curl_ratelimit, limit_requests), 0,
         false},
        {"x-ratelimit-remaining-requests",
         offsetof(struct sluice_curl_ratelimit, remaining_requests), 0, false},
        {"x-ratelimit-reset-requests", offsetof(struct sluice_curl_ratelimit, reset_requests_ns), 1,
         false},
        {"x-ratelimit-limit-tokens", offsetof(struct sluice_curl_ratelimit, limit_tokens), 0,
         false},
        {"x-ratelimit-remaining-tokens", offsetof(struct sluice_curl_ratelimit, remaining_tokens),
         0, false},
        {"x-ratelimit-reset-tokens", offsetof(struct sluice_curl_ratelimit, reset_tokens_ns), 1,
         false},
        {"x-ratelimit-limit", offsetof(struct sluice_curl_ratelimit, limit_requests), 0, true},
        {"x-ratelimit-remaining", offsetof(struct sluice_curl_ratelimit, remaining_requests), 0,
         true},
        {"x-ratelimit-reset", offsetof(struct sluice_curl_ratelimit, reset_requests_ns), 2, true},
    };
    *retry_after = *retry_after_ms = -1;
    bool specific[sizeof known / sizeof known[0]] = {false};
    for (size_t i = 0; i < r->n_headers && r->headers; i++) {
        const char *name = r->headers[i].name, *value = r->headers[i].value;
        if (!name || !value)
            continue;
        int64_t v;
        if (strcasecmp(name, "retry-after") == 0) {
            if (sluice__parse_retry_after(value, now_s, &v))
                *retry_after = v;
        } else if (strcasecmp(name, "retry-after-ms") == 0) {
            if (sluice__parse_scaled(value, value + strlen(value), SLUICE_NS_PER_MS, &v))
                *retry_after_ms = v;
        } else if (strncasecmp(name, "x-ratelimit-", 12) == 0) {
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
                if (strcasecmp(name, known[k].name) != 0)
                    continue;
                bool ok = known[k].parse == 0   ? sluice__parse_int(value, &v)
                          : known[k].parse == 1 ? sluice__parse_duration(value, &v)
                                                : sluice__parse_reset(value, now_s, &v);
                int64_t *field = (int64_t *)(void *)((char *)rl + known[k].field);
                /* The -requests form beats the plain one whatever the order. */
                size_t twin = known[k].fallback ? k - 6 : k;
                if (ok && (!known[k].fallback || !specific[twin])) {
                    *field = v;
                    if (!known[k].fallback)
                        specific[k] = true;
                }
            }
        }
    }
}

enum sluice_curl_kind sluice_curl_classify(const struct sluice_curl_response *r,
                                           struct sluice_curl_result *out)
{
    int64_t now_s = r->now_s ? r->now_s : (int64_t)time(NULL);
    /* A clock past year 100000 or before 1970 is nonsense; clamped, the date arithmetic
     * below (now_s * 1000, date - now_s) cannot overflow whatever the caller passed. */
    now_s = now_s < 0 ? 0 : now_s > (INT64_C(1) << 42) ? (INT64_C(1) << 42) : now_s;
    int64_t max_ns =
        r->retry_after_max_ns > 0 ? r->retry_after_max_ns : SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS;
    struct sluice_curl_ratelimit rl = {-1, -1, -1, -1, -1, -1};
    int64_t retry, retry_ms;
    sluice__read_headers(r, now_s, &rl, &retry, &retry_ms);
    /* CURLINFO_RETRY_AFTER, when the transfer read it, is the same header parsed by
     * curl; retry-after-ms wins over either for its precision. */
    if (r->retry_after_s >= 0)
        retry = r->retry_after_s > INT64_MAX / SLUICE_NS_PER_SEC
                    ? INT64_MAX
                    : r->retry_after_s * SLUICE_NS_PER_SEC;
    if (retry_ms >= 0)
        retry = retry_ms;
    out->retry_after_ns = sluice__clamp_ns(retry, max_ns);
    out->ratelimit = rl;
    out->http_status = r->http_status;
    out->curl_code = r->code;

    long s = r->http_status;
    enum sluice_curl_kind kind;
    if (r->code == CURLE_OPERATION_TIMEDOUT && r->request_sent)
        kind = SLUICE_CURL_PROVIDER_TIMEOUT;
    else if (r->code != CURLE_OK)
        kind = SLUICE_CURL_TRANSPORT;
    else if (s >= 200 && s < 300)
        kind = SLUICE_CURL_SUCCESS;
    else if (s == 429 || s == 503 || s == 529)
        kind = SLUICE_CURL_OVERLOADED;
    else if (s == 504)
        kind = SLUICE_CURL_PROVIDER_TIMEOUT;
    else if (s >= 400 && s < 500)
        kind = SLUICE_CURL_CLIENT_ERROR;
    else if (s >= 500 && s < 600)
        kind = SLUICE_CURL_SERVER_ERROR;
    else
        kind = SLUICE_CURL_UNEXPECTED;
    out->kind = kind;
    out->outcome = sluice__curl_kind_outcome(kind);
    return kind;
}
