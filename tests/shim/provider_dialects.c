/*
 * provider_dialects.c — every provider family's rate-limit dialect, read
 * from a recorded-style response (tests/fixtures/providers/NAME.http: status
 * line, headers, blank line, body; written from each provider's public
 * docs) and classified as SLUICE_CURL_KIND_MAP in sluice/curl.h says: the kind, the
 * sample, the hold, and the normalised budgets with their window and
 * source. No socket.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>

#include <sluice/curl.h>

#include "shim/provider_fixture.h"

#define NOW_S INT64_C(1764547200) /* 2025-12-01T00:00:00Z */
#define SEC SLUICE_NS_PER_SEC
#define MS SLUICE_NS_PER_MS

/* A fixture as the backend with `dialect` reads it, at NOW_S. */
static void fixture_load(struct provider_fixture *f, const char *name,
                         enum sluice_curl_dialect dialect)
{
    provider_fixture_load(f, name);
    f->resp.now_s = NOW_S;
    f->resp.dialect = dialect;
}

static struct sluice_curl_result classify_fixture(const char *name, enum sluice_curl_dialect d)
{
    static struct provider_fixture f;
    fixture_load(&f, name, d);
    struct sluice_curl_result out;
    memset(&out, 0x5a, sizeof out);
    cr_assert_eq(sluice_curl_classify(&f.resp, &out), out.kind);
    return out;
}

/* The table, one row per fixture. hold -1 = not checked. */
static const struct row {
    const char *fixture;
    enum sluice_curl_dialect dialect; /* as the backend would set it */
    enum sluice_curl_kind kind;
    int64_t hold_ns;
    enum sluice_curl_dialect source;
    int64_t requests_limit;
    enum sluice_curl_window requests_window;
} rows[] = {
    {"openai_429_rate", SLUICE_CURL_DIALECT_OPENAI, SLUICE_CURL_RATE_LIMITED, SEC,
     SLUICE_CURL_DIALECT_OPENAI, 60, SLUICE_CURL_WINDOW_MINUTE},
    {"openai_429_quota", SLUICE_CURL_DIALECT_OPENAI, SLUICE_CURL_QUOTA, 0,
     SLUICE_CURL_DIALECT_OPENAI, 60, SLUICE_CURL_WINDOW_MINUTE},
    {"openai_200_spent", SLUICE_CURL_DIALECT_OPENAI, SLUICE_CURL_SUCCESS, 800 * MS,
     SLUICE_CURL_DIALECT_OPENAI, 60, SLUICE_CURL_WINDOW_MINUTE},
    {"azure_429", SLUICE_CURL_DIALECT_AZURE, SLUICE_CURL_RATE_LIMITED, 2500 * MS,
     SLUICE_CURL_DIALECT_AZURE, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"azure_429_minus1", SLUICE_CURL_DIALECT_AZURE, SLUICE_CURL_OVERLOADED, 0,
     SLUICE_CURL_DIALECT_AZURE, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"anthropic_429", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_RATE_LIMITED, 20 * SEC,
     SLUICE_CURL_DIALECT_ANTHROPIC, 50, SLUICE_CURL_WINDOW_MINUTE},
    {"anthropic_529", SLUICE_CURL_DIALECT_ANTHROPIC, SLUICE_CURL_PLATFORM_OVERLOAD, 0,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"openrouter_429", SLUICE_CURL_DIALECT_OPENROUTER, SLUICE_CURL_RATE_LIMITED, 12 * SEC,
     SLUICE_CURL_DIALECT_OPENROUTER, 20, SLUICE_CURL_WINDOW_UNKNOWN},
    {"openrouter_402", SLUICE_CURL_DIALECT_OPENROUTER, SLUICE_CURL_QUOTA, 0,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"openrouter_429_upstream", SLUICE_CURL_DIALECT_OPENROUTER, SLUICE_CURL_OVERLOADED, 7 * SEC,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"together_200", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_SUCCESS, 0,
     SLUICE_CURL_DIALECT_TOGETHER, 10, SLUICE_CURL_WINDOW_SECOND},
    {"together_503", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_PLATFORM_OVERLOAD, 0,
     SLUICE_CURL_DIALECT_TOGETHER, 10, SLUICE_CURL_WINDOW_SECOND},
    {"together_429", SLUICE_CURL_DIALECT_TOGETHER, SLUICE_CURL_RATE_LIMITED, SEC,
     SLUICE_CURL_DIALECT_TOGETHER, 10, SLUICE_CURL_WINDOW_SECOND},
    {"groq_429", SLUICE_CURL_DIALECT_GROQ, SLUICE_CURL_RATE_LIMITED, 8 * SEC,
     SLUICE_CURL_DIALECT_GROQ, 14400, SLUICE_CURL_WINDOW_DAY},
    {"mistral_429", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_OVERLOADED, 0,
     SLUICE_CURL_DIALECT_MISTRAL, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"gemini_429", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_RATE_LIMITED, 22 * SEC,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"gemini_429_limit0", SLUICE_CURL_DIALECT_GEMINI, SLUICE_CURL_QUOTA, 0,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"gemini_503", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_PLATFORM_OVERLOAD, 0,
     SLUICE_CURL_DIALECT_AUTO, -1, SLUICE_CURL_WINDOW_UNKNOWN},
    {"ietf_429", SLUICE_CURL_DIALECT_AUTO, SLUICE_CURL_RATE_LIMITED, 30 * SEC,
     SLUICE_CURL_DIALECT_IETF, 100, SLUICE_CURL_WINDOW_MINUTE},
};

Test(dialects, every_provider_fixture_is_classified_as_the_table_says)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const struct row *w = &rows[i];
        struct sluice_curl_result r = classify_fixture(w->fixture, w->dialect);
        cr_expect_eq(r.kind, w->kind, "%s: kind %s, want %s", w->fixture,
                     sluice_curl_kind_name(r.kind), sluice_curl_kind_name(w->kind));
        cr_expect_eq(r.outcome, sluice_curl_kind_outcome(w->kind), "%s: outcome", w->fixture);
        cr_expect_eq(r.hold_ns, w->hold_ns, "%s: hold %lld ns", w->fixture, (long long)r.hold_ns);
        cr_expect_eq(r.ratelimit.source, w->source, "%s: source %s", w->fixture,
                     sluice_curl_dialect_name(r.ratelimit.source));
        cr_expect_eq(r.ratelimit.requests.limit, w->requests_limit, "%s: requests limit",
                     w->fixture);
        cr_expect_eq(r.ratelimit.requests.window, w->requests_window, "%s: window %s", w->fixture,
                     sluice_curl_window_name(r.ratelimit.requests.window));
    }
}

Test(dialects, anthropic_resets_are_absolute_times_from_rfc_3339)
{
    struct sluice_curl_result r = classify_fixture("anthropic_429", SLUICE_CURL_DIALECT_ANTHROPIC);
    cr_assert_eq(r.ratelimit.requests.reset_at_ms, (NOW_S + 20) * 1000);
    cr_assert_eq(r.ratelimit.requests.reset_ns, 20 * SEC);
    cr_assert_eq(r.ratelimit.tokens.limit, 40000);
    cr_assert_eq(r.ratelimit.tokens.reset_ns, SEC);
    cr_assert_eq(r.ratelimit.tokens.window, SLUICE_CURL_WINDOW_MINUTE);
}

Test(dialects, groq_states_its_request_limit_per_day_and_its_tokens_per_minute)
{
    struct sluice_curl_result r = classify_fixture("groq_429", SLUICE_CURL_DIALECT_GROQ);
    cr_assert_eq(r.ratelimit.tokens.remaining, 0);
    cr_assert_eq(r.ratelimit.tokens.window, SLUICE_CURL_WINDOW_MINUTE);
    cr_assert_eq(r.ratelimit.requests.reset_ns, 179 * SEC + 560 * MS);
    /* The same headers read as OpenAI's would call 14400 a per-minute figure. */
    r = classify_fixture("groq_429", SLUICE_CURL_DIALECT_OPENAI);
    cr_assert_eq(r.ratelimit.requests.window, SLUICE_CURL_WINDOW_MINUTE);
}

Test(dialects, a_body_is_read_only_for_error_responses_and_only_up_to_the_bound)
{
    static struct provider_fixture f;
    fixture_load(&f, "openai_429_quota", SLUICE_CURL_DIALECT_OPENAI);
    struct sluice_curl_result r;
    f.resp.http_status = 200; /* the same bytes after a 200 are a reply, not an error */
    sluice_curl_classify(&f.resp, &r);
    cr_assert_eq(r.kind, SLUICE_CURL_SUCCESS);
    /* A marker past SLUICE_CURL_BODY_MAX is not read. */
    static char big[SLUICE_CURL_BODY_MAX + 64];
    memset(big, ' ', sizeof big);
    memcpy(big + SLUICE_CURL_BODY_MAX, "insufficient_quota", 18);
    f.resp.http_status = 429;
    f.resp.body = big;
    f.resp.body_len = sizeof big;
    sluice_curl_classify(&f.resp, &r);
    cr_assert_eq(r.kind, SLUICE_CURL_OVERLOADED, "the marker lies beyond the bound");
    memcpy(big + SLUICE_CURL_BODY_MAX - 32, "insufficient_quota", 18);
    sluice_curl_classify(&f.resp, &r);
    cr_assert_eq(r.kind, SLUICE_CURL_QUOTA, "within the bound it is read");
}

Test(dialects, a_stated_rate_per_second_or_minute_is_offered_and_per_day_never)
{
    struct sluice_curl_result r = classify_fixture("together_200", SLUICE_CURL_DIALECT_TOGETHER);
    cr_assert_float_eq(sluice_curl_stated_rate(&r), 10.0, 1e-9, "10 per second");
    r.ratelimit.requests.window = SLUICE_CURL_WINDOW_MINUTE;
    r.ratelimit.requests.limit = 600;
    cr_assert_float_eq(sluice_curl_stated_rate(&r), 10.0, 1e-9, "600 per minute");
    r.ratelimit.requests.window = SLUICE_CURL_WINDOW_DAY;
    cr_assert_eq(sluice_curl_stated_rate(&r), 0, "never from a per-day figure");
    r.ratelimit.requests.window = SLUICE_CURL_WINDOW_UNKNOWN;
    cr_assert_eq(sluice_curl_stated_rate(&r), 0, "nor from one whose window is unknown");
    r.ratelimit.requests.window = SLUICE_CURL_WINDOW_MINUTE;
    r.kind = SLUICE_CURL_RATE_LIMITED;
    cr_assert_eq(sluice_curl_stated_rate(&r), 0, "only from a success");
}

Test(dialects, dialect_names_round_trip_and_a_bad_one_is_refused)
{
    enum sluice_curl_dialect d = SLUICE_CURL_DIALECT_AUTO;
    cr_assert_eq(sluice_curl_dialect_parse("anthropic", &d), SLUICE_OK);
    cr_assert_eq(d, SLUICE_CURL_DIALECT_ANTHROPIC);
    cr_assert_str_eq(sluice_curl_dialect_name(SLUICE_CURL_DIALECT_IETF), "ietf");
    cr_assert_eq(sluice_curl_dialect_parse("claude", &d), SLUICE_EINVAL);
    cr_assert_eq(d, SLUICE_CURL_DIALECT_ANTHROPIC, "untouched on a bad name");
    cr_assert_str_eq(sluice_curl_dialect_name((enum sluice_curl_dialect)99), "unknown");
}

/* The README's classification table lists exactly these fixtures, each with its kind. */
Test(dialects, the_readme_classification_table_matches_the_fixtures)
{
    static char text[1 << 18];
    FILE *fp = fopen(SLUICE_TEST_FIXTURES "/../../README.md", "rb");
    cr_assert_not_null(fp, "README.md");
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    char *table = strstr(text, "<!-- classification table");
    char *end = table ? strstr(table, "<!-- end of classification table -->") : NULL;
    cr_assert(table && end, "README.md has the classification table between its markers");
    *end = '\0';
    size_t listed = 0;
    for (char *line = strchr(table, '\n'); line && *++line; line = strchr(line, '\n')) {
        /* | provider | response | `kind` | `fixture` | */
        char kind[40], fixture[64];
        char *cols[6] = {NULL};
        int n = 0;
        for (char *p = line; *p && *p != '\n' && n < 6; p++)
            if (*p == '|')
                cols[n++] = p;
        if (n < 5 || strncmp(cols[2], "| `", 3) != 0)
            continue; /* the header and separator rows */
        cr_assert_eq(sscanf(cols[2], "| `%39[^`]` | `%63[^`]`", kind, fixture), 2,
                     "a row names its kind and fixture in backticks: %.80s", line);
        size_t i = 0;
        while (i < sizeof rows / sizeof rows[0] && strcmp(rows[i].fixture, fixture) != 0)
            i++;
        cr_assert_lt(i, sizeof rows / sizeof rows[0], "README lists %s, which has no test row",
                     fixture);
        cr_expect_str_eq(kind, sluice_curl_kind_name(rows[i].kind), "README's kind for %s",
                         fixture);
        listed++;
    }
    cr_assert_eq(listed, sizeof rows / sizeof rows[0], "every fixture is in the README table");
}
