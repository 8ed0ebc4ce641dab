/*
 * curl.c — sluice_curl_classify: what one response says about a provider's
 * capacity (the rule is SLUICE_CURL_KIND_MAP in sluice/curl.h), and the
 * header parsers behind it.
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
#define SLUICE__CURL_KIND_NAME(name, str, outcome, statuses)                                       \
    case SLUICE_CURL_##name:                                                                       \
        return str;
        SLUICE_CURL_KIND_MAP(SLUICE__CURL_KIND_NAME, )
#undef SLUICE__CURL_KIND_NAME
    }
    return "unknown";
}

enum sluice_outcome sluice_curl_kind_outcome(enum sluice_curl_kind kind)
{
    switch (kind) {
#define SLUICE__CURL_KIND_OUTCOME(name, str, outcome, statuses)                                    \
    case SLUICE_CURL_##name:                                                                       \
        return SLUICE_OUTCOME_##outcome;
        SLUICE_CURL_KIND_MAP(SLUICE__CURL_KIND_OUTCOME, )
#undef SLUICE__CURL_KIND_OUTCOME
    }
    return SLUICE_OUTCOME_IGNORE;
}

static const char *const sluice__dialect_names[] = {
#define SLUICE__CURL_DIALECT_NAME(name, str) str,
    SLUICE_CURL_DIALECT_MAP(SLUICE__CURL_DIALECT_NAME)
#undef SLUICE__CURL_DIALECT_NAME
};
#define SLUICE__DIALECTS (sizeof sluice__dialect_names / sizeof sluice__dialect_names[0])

const char *sluice_curl_dialect_name(enum sluice_curl_dialect dialect)
{
    return (unsigned)dialect < SLUICE__DIALECTS ? sluice__dialect_names[dialect] : "unknown";
}

int sluice_curl_dialect_parse(const char *name, enum sluice_curl_dialect *out)
{
    if (!out)
        return SLUICE_EINVAL;
    for (size_t i = 0; name && i < SLUICE__DIALECTS; i++)
        if (strcmp(name, sluice__dialect_names[i]) == 0) {
            *out = (enum sluice_curl_dialect)i;
            return SLUICE_OK;
        }
    return SLUICE_EINVAL;
}

static const struct {
    const char *name;
    int64_t seconds;
} sluice__windows[] = {
#define SLUICE__CURL_WINDOW_ROW(name, str, seconds) {str, seconds},
    SLUICE_CURL_WINDOW_MAP(SLUICE__CURL_WINDOW_ROW)
#undef SLUICE__CURL_WINDOW_ROW
};

#define SLUICE__WINDOWS (sizeof sluice__windows / sizeof sluice__windows[0])

const char *sluice_curl_window_name(enum sluice_curl_window window)
{
    return (unsigned)window < SLUICE__WINDOWS ? sluice__windows[window].name : "unknown";
}

int64_t sluice_curl_window_seconds(enum sluice_curl_window window)
{
    return (unsigned)window < SLUICE__WINDOWS ? sluice__windows[window].seconds : 0;
}

double sluice_curl_stated_rate(const struct sluice_curl_result *res)
{
    if (!res)
        return 0;
    const struct sluice_curl_budget *b = &res->ratelimit.requests;
    int64_t window_s = sluice_curl_window_seconds(b->window);
    if (res->kind != SLUICE_CURL_SUCCESS || b->limit <= 0 || window_s <= 0 || window_s > 60)
        return 0;
    return (double)b->limit / (double)window_s;
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

/* ns from now (whole seconds) until epoch ms `at_ms`; 0 when it has passed. */
static int64_t sluice__ns_until_ms(int64_t at_ms, int64_t now_s)
{
    int64_t left_ms = at_ms - now_s * 1000;
    return left_ms <= 0 ? 0
                        : (left_ms > INT64_MAX / SLUICE_NS_PER_MS ? INT64_MAX
                                                                   : left_ms * SLUICE_NS_PER_MS);
}

/* `n` digits at s as a number, or -1. */
static int sluice__digits(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's days_from_civil). */
static int64_t sluice__days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/*
 * An RFC 3339 date-time as Anthropic writes its resets
 * ("2024-06-01T12:00:30Z", "...30.5+02:00") into epoch ms. False for
 * anything else.
 */
static bool sluice__parse_rfc3339_ms(const char *s, int64_t *out_ms)
{
    size_t n = strlen(s);
    if (n < 20 || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || s[4] != '-' || s[7] != '-' ||
        s[13] != ':' || s[16] != ':')
        return false;
    int y = sluice__digits(s, 4), mo = sluice__digits(s + 5, 2), d = sluice__digits(s + 8, 2);
    int h = sluice__digits(s + 11, 2), mi = sluice__digits(s + 14, 2),
        sec = sluice__digits(s + 17, 2);
    if (y < 0 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 ||
        sec < 0 || sec > 60)
        return false;
    const char *p = s + 19;
    int64_t ms = 0;
    if (*p == '.') {
        int64_t scale = 100;
        bool any = false;
        for (p++; *p >= '0' && *p <= '9'; p++, any = true) {
            ms += (*p - '0') * scale;
            scale /= 10;
        }
        if (!any)
            return false;
    }
    int64_t offset_s = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
        int oh = sluice__digits(p + 1, 2), om = sluice__digits(p + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59)
            return false;
        offset_s = (*p == '+' ? 1 : -1) * (oh * 3600 + om * 60);
        p += 6;
    } else {
        return false;
    }
    if (*p)
        return false;
    int64_t epoch_s = sluice__days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - offset_s;
    *out_ms = epoch_s * 1000 + ms;
    return true;
}

/*
 * Parameter `key` of the first item of an IETF structured-field list
 * (RateLimit: "default";r=50;t=30, RateLimit-Policy: "default";q=100;w=60)
 * as a non-negative integer. False when it is absent or not one.
 */
static bool sluice__sf_param(const char *v, char key, int64_t *out)
{
    const char *end = strchr(v, ',');
    if (!end)
        end = v + strlen(v);
    bool quoted = false;
    for (const char *p = v; p < end; p++) {
        if (*p == '"')
            quoted = !quoted;
        if (quoted || *p != ';')
            continue;
        const char *k = p + 1;
        while (k < end && *k == ' ')
            k++;
        if (k + 1 < end && *k == key && k[1] == '=') {
            const char *num = k + 2, *stop = num;
            while (stop < end && *stop != ';')
                stop++;
            return sluice__parse_scaled(num, stop, 1, out);
        }
    }
    return false;
}

/* ---- error bodies ------------------------------------------------------------------ */

/* The part of an error body classify reads: none below 400, at most SLUICE_CURL_BODY_MAX. */
struct sluice__body {
    const char *p;
    size_t n;
};

static struct sluice__body sluice__body_of(const struct sluice_curl_response *r)
{
    struct sluice__body b = {NULL, 0};
    if (r->body && r->http_status >= 400) {
        b.p = r->body;
        b.n = r->body_len < SLUICE_CURL_BODY_MAX ? r->body_len : SLUICE_CURL_BODY_MAX;
    }
    return b;
}

/* Where `needle` starts in the body, or NULL (a bounded memmem). */
static const char *sluice__body_find(struct sluice__body b, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; b.p && k && i + k <= b.n; i++)
        if (memcmp(b.p + i, needle, k) == 0)
            return b.p + i;
    return NULL;
}

/*
 * The value after JSON key `key` (its quotes included in `key`): `"k": 12`
 * or `"k": "22s"`, read as a duration (a bare number is seconds). False when
 * absent or not one.
 */
static bool sluice__body_duration(struct sluice__body b, const char *key, int64_t *out)
{
    const char *at = sluice__body_find(b, key);
    if (!at)
        return false;
    const char *p = at + strlen(key), *end = b.p + b.n;
    while (p < end && (*p == ' ' || *p == ':' || *p == '"'))
        p++;
    char buf[32];
    size_t n = 0;
    while (p < end && n < sizeof buf - 1 &&
           ((*p >= '0' && *p <= '9') || *p == '.' || (*p >= 'a' && *p <= 'z')))
        buf[n++] = *p++;
    buf[n] = '\0';
    return n && sluice__parse_duration(buf, out);
}

/* ---- the dialects ------------------------------------------------------------------ */

enum sluice__rl_field { SLUICE__LIMIT, SLUICE__REMAINING, SLUICE__RESET, SLUICE__FIELDS };
enum sluice__rl_format {
    SLUICE__INT,       /* "500" */
    SLUICE__DURATION,  /* "6m0s", "20ms", "1.5" (seconds) */
    SLUICE__EPOCH,     /* a bare number: epoch ms if >= 1e12, epoch s if >= 1e9, else seconds */
    SLUICE__RFC3339,   /* "2024-06-01T12:00:30Z" */
    SLUICE__SF_POLICY, /* IETF RateLimit-Policy: q= is the limit, w= its window in seconds */
    SLUICE__SF_LIMIT,  /* IETF RateLimit: r= is what remains, t= seconds to the reset */
};

/* One header a dialect reads. When two fill one field, the lower rank wins whatever the
 * order (the -requests form beats the plain one). */
struct sluice__rl_header {
    const char *name;
    unsigned char tokens; /* 0: the request budget, 1: the token budget */
    unsigned char field;  /* enum sluice__rl_field (the SF formats fill two) */
    unsigned char format; /* enum sluice__rl_format */
    unsigned char rank;
};

#define SLUICE__OPENAI_HEADERS(rank)                                                               \
    {"x-ratelimit-limit-requests", 0, SLUICE__LIMIT, SLUICE__INT, rank},                           \
        {"x-ratelimit-remaining-requests", 0, SLUICE__REMAINING, SLUICE__INT, rank},               \
        {"x-ratelimit-reset-requests", 0, SLUICE__RESET, SLUICE__DURATION, rank},                  \
        {"x-ratelimit-limit-tokens", 1, SLUICE__LIMIT, SLUICE__INT, rank},                         \
        {"x-ratelimit-remaining-tokens", 1, SLUICE__REMAINING, SLUICE__INT, rank},                 \
        {"x-ratelimit-reset-tokens", 1, SLUICE__RESET, SLUICE__DURATION, rank}
#define SLUICE__PLAIN_HEADERS(rank)                                                                \
    {"x-ratelimit-limit", 0, SLUICE__LIMIT, SLUICE__INT, rank},                                    \
        {"x-ratelimit-remaining", 0, SLUICE__REMAINING, SLUICE__INT, rank},                        \
        {"x-ratelimit-reset", 0, SLUICE__RESET, SLUICE__EPOCH, rank}
#define SLUICE__ANTHROPIC_HEADERS(budget, tokens, rank)                                            \
    {"anthropic-ratelimit-" budget "-limit", tokens, SLUICE__LIMIT, SLUICE__INT, rank},            \
        {"anthropic-ratelimit-" budget "-remaining", tokens, SLUICE__REMAINING, SLUICE__INT, rank}, \
        {"anthropic-ratelimit-" budget "-reset", tokens, SLUICE__RESET, SLUICE__RFC3339, rank}

static const struct sluice__rl_header sluice__openai_headers[] = {SLUICE__OPENAI_HEADERS(0)};
static const struct sluice__rl_header sluice__generic_headers[] = {SLUICE__OPENAI_HEADERS(0),
                                                                   SLUICE__PLAIN_HEADERS(1)};
static const struct sluice__rl_header sluice__plain_headers[] = {SLUICE__PLAIN_HEADERS(0)};
static const struct sluice__rl_header sluice__anthropic_headers[] = {
    SLUICE__ANTHROPIC_HEADERS("requests", 0, 0), SLUICE__ANTHROPIC_HEADERS("tokens", 1, 0),
    SLUICE__ANTHROPIC_HEADERS("input-tokens", 1, 1)};
static const struct sluice__rl_header sluice__together_headers[] = {
    SLUICE__PLAIN_HEADERS(0),
    {"x-tokenlimit-limit", 1, SLUICE__LIMIT, SLUICE__INT, 0},
    {"x-tokenlimit-remaining", 1, SLUICE__REMAINING, SLUICE__INT, 0}};
static const struct sluice__rl_header sluice__mistral_headers[] = {
    {"x-ratelimitbysize-limit-minute", 1, SLUICE__LIMIT, SLUICE__INT, 0},
    {"x-ratelimitbysize-remaining-minute", 1, SLUICE__REMAINING, SLUICE__INT, 0},
    SLUICE__OPENAI_HEADERS(1)};
static const struct sluice__rl_header sluice__ietf_headers[] = {
    {"ratelimit-policy", 0, SLUICE__LIMIT, SLUICE__SF_POLICY, 0},
    {"ratelimit", 0, SLUICE__REMAINING, SLUICE__SF_LIMIT, 0},
    {"ratelimit-limit", 0, SLUICE__LIMIT, SLUICE__INT, 1}, /* the draft's earlier fields */
    {"ratelimit-remaining", 0, SLUICE__REMAINING, SLUICE__INT, 1},
    {"ratelimit-reset", 0, SLUICE__RESET, SLUICE__DURATION, 1}};

/*
 * One row per provider family (adding one is one row): the headers it reads,
 * the windows its documentation gives its budgets, the header prefixes only
 * it sends (how AUTO finds it), and whether its 503 means platform capacity
 * rather than the caller's cap. Ordered as enum sluice_curl_dialect.
 */
static const struct sluice__dialect_row {
    enum sluice_curl_dialect id;
    const struct sluice__rl_header *headers;
    size_t n_headers;
    enum sluice_curl_window requests_window, tokens_window;
    const char *detect[2];
    bool platform_503;
} sluice__dialects[] = {
#define SLUICE__ROW(id, headers, rw, tw, d1, d2, p503)                                             \
    {SLUICE_CURL_DIALECT_##id, headers, sizeof headers / sizeof headers[0],                        \
     SLUICE_CURL_WINDOW_##rw, SLUICE_CURL_WINDOW_##tw, {d1, d2}, p503}
    SLUICE__ROW(AUTO, sluice__generic_headers, UNKNOWN, UNKNOWN, NULL, NULL, false),
    SLUICE__ROW(GENERIC, sluice__generic_headers, UNKNOWN, UNKNOWN, NULL, NULL, false),
    /* OpenAI: RPM and TPM (platform.openai.com/docs/guides/rate-limits). */
    SLUICE__ROW(OPENAI, sluice__openai_headers, MINUTE, MINUTE, NULL, NULL, false),
    /* Azure OpenAI: per-minute quotas; "-1" answers read as not stated. */
    SLUICE__ROW(AZURE, sluice__openai_headers, MINUTE, MINUTE, NULL, NULL, false),
    /* Anthropic: RPM, TPM (input/output tokens per minute as the fallback). */
    SLUICE__ROW(ANTHROPIC, sluice__anthropic_headers, MINUTE, MINUTE, "anthropic-ratelimit-", NULL,
                false),
    /* OpenRouter: the headers do not say whether they carry the per-minute or the
     * per-day cap of a free model, so no window. */
    SLUICE__ROW(OPENROUTER, sluice__plain_headers, UNKNOWN, UNKNOWN, NULL, NULL, false),
    /* Together: per-second values; 503 at or below the dynamic rate is platform capacity. */
    SLUICE__ROW(TOGETHER, sluice__together_headers, SECOND, SECOND, "x-ratelimit-limit-dynamic",
                "x-tokenlimit-", true),
    /* Groq: the request limit is per day (RPD), the token limit per minute (TPM). */
    SLUICE__ROW(GROQ, sluice__openai_headers, DAY, MINUTE, NULL, NULL, false),
    SLUICE__ROW(MISTRAL, sluice__mistral_headers, MINUTE, MINUTE, "x-ratelimitbysize-", NULL, false),
    /* Gemini: no rate headers; its 503 UNAVAILABLE is the platform's. */
    SLUICE__ROW(GEMINI, sluice__openai_headers, UNKNOWN, UNKNOWN, NULL, NULL, true),
    SLUICE__ROW(IETF, sluice__ietf_headers, UNKNOWN, UNKNOWN, "ratelimit", NULL, false),
#undef SLUICE__ROW
};
_Static_assert(sizeof sluice__dialects / sizeof sluice__dialects[0] == SLUICE__DIALECTS,
               "one row per dialect, in enum order");

/* The body of a Gemini (Google RPC) error. */
static bool sluice__gemini_body(struct sluice__body b)
{
    return sluice__body_find(b, "RESOURCE_EXHAUSTED") || sluice__body_find(b, "google.rpc") ||
           sluice__body_find(b, "\"UNAVAILABLE\"");
}

/* AUTO: the family whose own headers (or body) came, else GENERIC. */
static enum sluice_curl_dialect sluice__detect(const struct sluice_curl_response *r,
                                               struct sluice__body b)
{
    for (size_t i = 0; i < r->n_headers && r->headers; i++) {
        const char *name = r->headers[i].name;
        if (!name || !r->headers[i].value)
            continue;
        for (size_t k = 0; k < SLUICE__DIALECTS; k++)
            for (int j = 0; j < 2; j++) {
                const char *pre = sluice__dialects[k].detect[j];
                if (pre && strncasecmp(name, pre, strlen(pre)) == 0)
                    return sluice__dialects[k].id;
            }
    }
    return sluice__gemini_body(b) ? SLUICE_CURL_DIALECT_GEMINI : SLUICE_CURL_DIALECT_GENERIC;
}

static enum sluice_curl_window sluice__window_of_seconds(int64_t seconds)
{
    for (size_t i = 1; i < SLUICE__WINDOWS; i++)
        if (sluice__windows[i].seconds == seconds)
            return (enum sluice_curl_window)i;
    return SLUICE_CURL_WINDOW_UNKNOWN;
}

/* Budget fields as read so far, with the rank of the header that filled each. */
struct sluice__rl_read {
    int64_t v[2][SLUICE__FIELDS]; /* reset as ns from now */
    unsigned char rank[2][SLUICE__FIELDS];
    int64_t window_s; /* IETF w=; -1 = not stated */
};

static void sluice__rl_set(struct sluice__rl_read *rd, int tokens, int field, int64_t v,
                           unsigned char rank)
{
    if (rank <= rd->rank[tokens][field]) {
        rd->v[tokens][field] = v;
        rd->rank[tokens][field] = rank;
    }
}

/* One header a dialect reads, parsed into *rd (nothing on garbage). */
static void sluice__rl_parse(const struct sluice__rl_header *h, const char *value, int64_t now_s,
                             struct sluice__rl_read *rd)
{
    int64_t v, w;
    switch ((enum sluice__rl_format)h->format) {
    case SLUICE__INT:
        if (sluice__parse_int(value, &v))
            sluice__rl_set(rd, h->tokens, h->field, v, h->rank);
        break;
    case SLUICE__DURATION:
        if (sluice__parse_duration(value, &v))
            sluice__rl_set(rd, h->tokens, h->field, v, h->rank);
        break;
    case SLUICE__EPOCH:
        if (sluice__parse_reset(value, now_s, &v))
            sluice__rl_set(rd, h->tokens, h->field, v, h->rank);
        break;
    case SLUICE__RFC3339:
        if (sluice__parse_rfc3339_ms(value, &v))
            sluice__rl_set(rd, h->tokens, h->field, sluice__ns_until_ms(v, now_s), h->rank);
        break;
    case SLUICE__SF_POLICY:
        if (sluice__sf_param(value, 'q', &v))
            sluice__rl_set(rd, h->tokens, SLUICE__LIMIT, v, h->rank);
        if (sluice__sf_param(value, 'w', &w))
            rd->window_s = w;
        break;
    case SLUICE__SF_LIMIT:
        if (sluice__sf_param(value, 'r', &v))
            sluice__rl_set(rd, h->tokens, SLUICE__REMAINING, v, h->rank);
        if (sluice__sf_param(value, 't', &v))
            sluice__rl_set(rd, h->tokens, SLUICE__RESET,
                           v > INT64_MAX / SLUICE_NS_PER_SEC ? INT64_MAX : v * SLUICE_NS_PER_SEC,
                           h->rank);
        break;
    }
}

static struct sluice_curl_budget sluice__budget(const struct sluice__rl_read *rd, int tokens,
                                                enum sluice_curl_window window, int64_t now_s)
{
    struct sluice_curl_budget b;
    b.limit = rd->v[tokens][SLUICE__LIMIT];
    b.remaining = rd->v[tokens][SLUICE__REMAINING];
    b.reset_ns = rd->v[tokens][SLUICE__RESET];
    b.reset_at_ms = b.reset_ns < 0 ? -1 : now_s * 1000 + b.reset_ns / SLUICE_NS_PER_MS;
    b.window = b.limit < 0 ? SLUICE_CURL_WINDOW_UNKNOWN : window;
    return b;
}

/* Read the rate-limit headers of `row` into *rl. */
static void sluice__read_ratelimit(const struct sluice_curl_response *r,
                                   const struct sluice__dialect_row *row, int64_t now_s,
                                   struct sluice_curl_ratelimit *rl)
{
    struct sluice__rl_read rd;
    for (int t = 0; t < 2; t++)
        for (int f = 0; f < SLUICE__FIELDS; f++) {
            rd.v[t][f] = -1;
            rd.rank[t][f] = UCHAR_MAX;
        }
    rd.window_s = -1;
    bool any = false;
    for (size_t i = 0; i < r->n_headers && r->headers; i++) {
        const char *name = r->headers[i].name, *value = r->headers[i].value;
        if (!name || !value)
            continue;
        for (size_t k = 0; k < row->n_headers; k++)
            if (strcasecmp(name, row->headers[k].name) == 0) {
                sluice__rl_parse(&row->headers[k], value, now_s, &rd);
                any = true;
            }
    }
    enum sluice_curl_window rw = rd.window_s >= 0 ? sluice__window_of_seconds(rd.window_s)
                                                  : row->requests_window;
    rl->source = any ? row->id : SLUICE_CURL_DIALECT_AUTO;
    rl->requests = sluice__budget(&rd, 0, rw, now_s);
    rl->tokens = sluice__budget(&rd, 1, row->tokens_window, now_s);
}

/* Retry-After and retry-after-ms (ns; -1 = absent or garbage). */
static void sluice__read_retry_after(const struct sluice_curl_response *r, int64_t now_s,
                                     int64_t *retry_after, int64_t *retry_after_ms)
{
    *retry_after = *retry_after_ms = -1;
    for (size_t i = 0; i < r->n_headers && r->headers; i++) {
        const char *name = r->headers[i].name, *value = r->headers[i].value;
        int64_t v;
        if (!name || !value)
            continue;
        if (strcasecmp(name, "retry-after") == 0) {
            if (sluice__parse_retry_after(value, now_s, &v))
                *retry_after = v;
        } else if (strcasecmp(name, "retry-after-ms") == 0) {
            if (sluice__parse_scaled(value, value + strlen(value), SLUICE_NS_PER_MS, &v))
                *retry_after_ms = v;
        }
    }
}

/* ---- the rule ---------------------------------------------------------------------- */

/* Steps 1 and 2 of SLUICE_CURL_KIND_MAP: the transfer, then the first row whose statuses hold
 * the final one, before the body and the budgets are heard. */
static enum sluice_curl_kind sluice__status_kind(const struct sluice_curl_response *r)
{
    if (r->code == CURLE_OPERATION_TIMEDOUT && r->request_sent)
        return SLUICE_CURL_PROVIDER_TIMEOUT;
    if (r->code != CURLE_OK)
        return SLUICE_CURL_TRANSPORT;
    long status = r->http_status;
#define SLUICE__CURL_HTTP(lo, hi) || (status >= (lo) && status <= (hi))
#define SLUICE__CURL_KIND_OF_STATUS(name, str, outcome, statuses)                                  \
    if (0 statuses)                                                                                \
        return SLUICE_CURL_##name;
    SLUICE_CURL_KIND_MAP(SLUICE__CURL_KIND_OF_STATUS, SLUICE__CURL_HTTP)
#undef SLUICE__CURL_KIND_OF_STATUS
#undef SLUICE__CURL_HTTP
    return SLUICE_CURL_UNEXPECTED;
}

/* A budget the provider says is spent, with when it comes back (ns; 0 = not named, or past). */
static bool sluice__spent(const struct sluice_curl_budget *b, int64_t *reset_ns)
{
    *reset_ns = b->reset_ns > 0 ? b->reset_ns : 0;
    return b->remaining == 0;
}

/*
 * Step 3 of SLUICE_CURL_KIND_MAP: a refusal (429, 503, 529) heard out, in
 * the map's order of precedence (QUOTA, PLATFORM_OVERLOAD, RATE_LIMITED; each
 * row's comment says what makes it), and the hold it asks for in *hold.
 */
static enum sluice_curl_kind sluice__refine(const struct sluice_curl_response *r,
                                            const struct sluice__dialect_row *row,
                                            struct sluice__body b,
                                            const struct sluice_curl_ratelimit *rl,
                                            enum sluice_curl_kind kind, int64_t retry,
                                            int64_t *hold)
{
    bool gemini_exhausted = sluice__body_find(b, "RESOURCE_EXHAUSTED") != NULL;
    *hold = retry;
    if (sluice__body_find(b, "insufficient_quota") ||
        (gemini_exhausted && sluice__body_find(b, "limit: 0")))
        return SLUICE_CURL_QUOTA;
    if (sluice__body_find(b, "overloaded_error") || (r->http_status == 503 && row->platform_503))
        return SLUICE_CURL_PLATFORM_OVERLOAD;
    if (kind != SLUICE_CURL_OVERLOADED || r->http_status != 429)
        return kind;
    int64_t req_reset, tok_reset;
    bool req = sluice__spent(&rl->requests, &req_reset), tok = sluice__spent(&rl->tokens, &tok_reset);
    int64_t reset = (req && req_reset > *hold) ? req_reset : *hold;
    reset = (tok && tok_reset > reset) ? tok_reset : reset;
    /* A reset the provider named but that has passed by the time the answer is read (an epoch
     * or a date a busy client reads late) still says the budget, not the cap, refused it. */
    bool named = (req && rl->requests.reset_ns >= 0) || (tok && rl->tokens.reset_ns >= 0);
    if (((req || tok) && (reset > 0 || named)) || (gemini_exhausted && retry > 0)) {
        *hold = reset;
        return SLUICE_CURL_RATE_LIMITED;
    }
    return kind;
}

enum sluice_curl_kind sluice_curl_classify(const struct sluice_curl_response *r,
                                           struct sluice_curl_result *out)
{
    /* Any input is safe: no response classifies as an empty one, into a scratch result. */
    static const struct sluice_curl_response none = {0};
    struct sluice_curl_result scratch;
    if (!r)
        r = &none;
    if (!out)
        out = &scratch;
    int64_t now_s = r->now_s ? r->now_s : (int64_t)time(NULL);
    /* A clock past year 100000 or before 1970 is nonsense; clamped, the date arithmetic
     * below (now_s * 1000, date - now_s) cannot overflow whatever the caller passed. */
    now_s = now_s < 0 ? 0 : now_s > (INT64_C(1) << 42) ? (INT64_C(1) << 42) : now_s;
    int64_t max_ns =
        r->retry_after_max_ns > 0 ? r->retry_after_max_ns : SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS;
    struct sluice__body body = sluice__body_of(r);
    enum sluice_curl_dialect id = (unsigned)r->dialect < SLUICE__DIALECTS ? r->dialect
                                                                          : SLUICE_CURL_DIALECT_AUTO;
    if (id == SLUICE_CURL_DIALECT_AUTO)
        id = sluice__detect(r, body);
    const struct sluice__dialect_row *row = &sluice__dialects[id];
    struct sluice_curl_ratelimit rl;
    sluice__read_ratelimit(r, row, now_s, &rl);

    int64_t retry, retry_ms, from_body;
    sluice__read_retry_after(r, now_s, &retry, &retry_ms);
    /* CURLINFO_RETRY_AFTER, when the transfer read it, is the same header parsed by
     * curl; retry-after-ms wins over either for its precision; a body's hint stands in
     * for a missing header. */
    if (r->retry_after_s >= 0)
        retry = r->retry_after_s > INT64_MAX / SLUICE_NS_PER_SEC
                    ? INT64_MAX
                    : r->retry_after_s * SLUICE_NS_PER_SEC;
    if (retry_ms >= 0)
        retry = retry_ms;
    if (retry < 0 && (sluice__body_duration(body, "\"retry_after_seconds\"", &from_body) ||
                      sluice__body_duration(body, "\"retryDelay\"", &from_body)))
        retry = from_body;
    out->retry_after_ns = sluice__clamp_ns(retry, max_ns);
    out->ratelimit = rl;
    out->http_status = r->http_status;
    out->curl_code = r->code;

    enum sluice_curl_kind kind = sluice__status_kind(r);
    int64_t hold = 0, reset;
    if (kind == SLUICE_CURL_OVERLOADED || kind == SLUICE_CURL_PLATFORM_OVERLOAD)
        kind = sluice__refine(r, row, body, &rl, kind, out->retry_after_ns, &hold);
    else if (kind == SLUICE_CURL_SUCCESS && sluice__spent(&rl.requests, &reset))
        hold = reset; /* pacing: new calls wait for the reset instead of being refused */
    out->hold_ns = kind == SLUICE_CURL_QUOTA ? 0 : sluice__clamp_ns(hold, max_ns);
    out->kind = kind;
    out->outcome = sluice_curl_kind_outcome(kind);
    return kind;
}
