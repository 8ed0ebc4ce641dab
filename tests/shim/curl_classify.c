/*
 * curl_classify.c — sluice_curl_classify, the one rule that turns a
 * response into a sample for discovery (SLUICE_CURL_KIND_MAP in
 * sluice/curl.h). No socket: every input is built by hand, as the fuzzer
 * will.
 */
#include <criterion/criterion.h>

#include <sluice/curl.h>

#define NOW_S INT64_C(1700000000) /* Tue, 14 Nov 2023 22:13:20 GMT */
#define SEC SLUICE_NS_PER_SEC

static struct sluice_curl_result classify_h(long http, CURLcode code, bool sent,
                                            const struct sluice_curl_header *h, size_t n)
{
    struct sluice_curl_response r = {.http_status = http,
                                     .code = code,
                                     .request_sent = sent,
                                     .retry_after_s = -1,
                                     .headers = h,
                                     .n_headers = n,
                                     .now_s = NOW_S};
    struct sluice_curl_result out;
    memset(&out, 0x5a, sizeof out);
    enum sluice_curl_kind kind = sluice_curl_classify(&r, &out);
    cr_assert_eq(kind, out.kind, "the return value is out->kind");
    return out;
}

static struct sluice_curl_result classify(long http, CURLcode code, bool sent)
{
    return classify_h(http, code, sent, NULL, 0);
}

/* The Retry-After that a 429 carrying one header name: value gets. */
static int64_t retry_after_of(const char *name, const char *value)
{
    struct sluice_curl_header h = {name, value};
    return classify_h(429, CURLE_OK, true, &h, 1).retry_after_ns;
}

Test(classify, every_2xx_is_success_and_an_ok_sample)
{
    for (long s = 200; s < 300; s++) {
        struct sluice_curl_result r = classify(s, CURLE_OK, true);
        cr_assert_eq(r.kind, SLUICE_CURL_SUCCESS, "status %ld", s);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_OK);
        cr_assert_eq(r.http_status, s);
        cr_assert_eq(r.retry_after_ns, 0);
    }
}

Test(classify, a_bare_429_or_503_is_overload_529_is_the_platform_and_402_is_quota)
{
    long overloads[] = {429, 503};
    for (size_t i = 0; i < 2; i++) {
        struct sluice_curl_result r = classify(overloads[i], CURLE_OK, true);
        cr_assert_eq(r.kind, SLUICE_CURL_OVERLOADED, "status %ld", overloads[i]);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_OVERLOAD);
    }
    struct sluice_curl_result r = classify(529, CURLE_OK, true);
    cr_assert_eq(r.kind, SLUICE_CURL_PLATFORM_OVERLOAD, "529 is Anthropic's platform overload");
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_PLATFORM);
    r = classify(402, CURLE_OK, true);
    cr_assert_eq(r.kind, SLUICE_CURL_QUOTA);
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_QUOTA);
}

Test(classify, a_timeout_after_the_request_was_sent_is_a_provider_timeout_and_an_overload)
{
    struct sluice_curl_result r = classify(0, CURLE_OPERATION_TIMEDOUT, true);
    cr_assert_eq(r.kind, SLUICE_CURL_PROVIDER_TIMEOUT);
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(r.curl_code, CURLE_OPERATION_TIMEDOUT);
    r = classify(504, CURLE_OK, true);
    cr_assert_eq(r.kind, SLUICE_CURL_PROVIDER_TIMEOUT, "a gateway timeout is the provider's");
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_OVERLOAD);
}

Test(classify, a_timeout_before_the_request_left_is_a_transport_error_and_ignored)
{
    struct sluice_curl_result r = classify(0, CURLE_OPERATION_TIMEDOUT, false);
    cr_assert_eq(r.kind, SLUICE_CURL_TRANSPORT);
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
}

Test(classify, other_4xx_are_client_errors_and_ignored)
{
    long statuses[] = {400, 401, 403, 404, 408, 413, 422, 499}; /* 402 is quota */
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        struct sluice_curl_result r = classify(statuses[i], CURLE_OK, true);
        cr_assert_eq(r.kind, SLUICE_CURL_CLIENT_ERROR, "status %ld", statuses[i]);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
    }
}

Test(classify, other_5xx_are_server_errors_and_ignored)
{
    long statuses[] = {500, 501, 502, 505, 520, 599};
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        struct sluice_curl_result r = classify(statuses[i], CURLE_OK, true);
        cr_assert_eq(r.kind, SLUICE_CURL_SERVER_ERROR, "status %ld", statuses[i]);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
    }
}

Test(classify, connection_failures_are_transport_errors_and_ignored)
{
    CURLcode codes[] = {CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_SSL_CONNECT_ERROR,
                        CURLE_RECV_ERROR,      CURLE_SEND_ERROR,           CURLE_GOT_NOTHING};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        struct sluice_curl_result r = classify(0, codes[i], i % 2 == 0);
        cr_assert_eq(r.kind, SLUICE_CURL_TRANSPORT, "code %d", (int)codes[i]);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
        cr_assert_eq(r.curl_code, codes[i]);
    }
}

Test(classify, a_final_1xx_or_3xx_or_no_status_is_unexpected_and_ignored)
{
    long statuses[] = {0, 101, 301, 304};
    for (size_t i = 0; i < 4; i++) {
        struct sluice_curl_result r = classify(statuses[i], CURLE_OK, true);
        cr_assert_eq(r.kind, SLUICE_CURL_UNEXPECTED, "status %ld", statuses[i]);
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE);
    }
}

Test(classify, retry_after_in_seconds_is_kept)
{
    cr_assert_eq(retry_after_of("Retry-After", "7"), 7 * SEC);
    cr_assert_eq(retry_after_of("retry-after", " 30 "), 30 * SEC, "names are case-insensitive");
    cr_assert_eq(retry_after_of("Retry-After", "0"), 0);
    cr_assert_eq(retry_after_of("Retry-After", "1.5"), 3 * SEC / 2);
}

Test(classify, retry_after_as_an_http_date_is_the_time_left_until_it)
{
    /* NOW_S + 50 s */
    cr_assert_eq(retry_after_of("Retry-After", "Tue, 14 Nov 2023 22:14:10 GMT"), 50 * SEC);
    cr_assert_eq(retry_after_of("Retry-After", "Tue, 14 Nov 2023 22:00:00 GMT"), 0,
                 "a past date is no hold");
}

Test(classify, garbage_and_negative_retry_after_is_no_hold)
{
    const char *bad[] = {"", "soon", "-5", "12abc", "0x10", "1e3", "+3", ". ", "1.", "\xff\xfe"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(retry_after_of("Retry-After", bad[i]), 0, "value \"%s\"", bad[i]);
}

Test(classify, huge_retry_after_is_clamped_to_the_maximum)
{
    cr_assert_eq(retry_after_of("Retry-After", "99999999999999999999999999"),
                 SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS);
    cr_assert_eq(retry_after_of("Retry-After", "3600"), SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS);
    cr_assert_eq(retry_after_of("Retry-After", "Fri, 01 Jan 2100 00:00:00 GMT"),
                 SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS);
    struct sluice_curl_header h = {"Retry-After", "30"};
    struct sluice_curl_response r = {.http_status = 429,
                                     .retry_after_s = -1,
                                     .headers = &h,
                                     .n_headers = 1,
                                     .retry_after_max_ns = 10 * SEC};
    struct sluice_curl_result out;
    sluice_curl_classify(&r, &out);
    cr_assert_eq(out.retry_after_ns, 10 * SEC, "the caller's maximum wins");
}

Test(classify, retry_after_ms_is_preferred_for_its_precision)
{
    cr_assert_eq(retry_after_of("retry-after-ms", "1500"), 1500 * SLUICE_NS_PER_MS);
    struct sluice_curl_header both[] = {{"Retry-After", "2"}, {"retry-after-ms", "1250"}};
    cr_assert_eq(classify_h(429, CURLE_OK, true, both, 2).retry_after_ns, 1250 * SLUICE_NS_PER_MS);
    struct sluice_curl_header bad_ms[] = {{"Retry-After", "2"}, {"retry-after-ms", "x"}};
    cr_assert_eq(classify_h(429, CURLE_OK, true, bad_ms, 2).retry_after_ns, 2 * SEC,
                 "an unparseable retry-after-ms falls back to Retry-After");
}

Test(classify, curlinfo_retry_after_is_used_when_the_transfer_read_it)
{
    struct sluice_curl_header h = {"Retry-After", "Tue, 14 Nov 2023 22:14:50 GMT"};
    struct sluice_curl_response r = {
        .http_status = 503, .retry_after_s = 4, .headers = &h, .n_headers = 1, .now_s = NOW_S};
    struct sluice_curl_result out;
    sluice_curl_classify(&r, &out);
    cr_assert_eq(out.retry_after_ns, 4 * SEC);
    cr_assert_eq(out.kind, SLUICE_CURL_OVERLOADED);
}

Test(classify, openai_rate_limit_headers_are_parsed)
{
    struct sluice_curl_header h[] = {
        {"x-ratelimit-limit-requests", "500"},     {"x-ratelimit-remaining-requests", "499"},
        {"x-ratelimit-reset-requests", "120ms"},   {"x-ratelimit-limit-tokens", "30000"},
        {"x-ratelimit-remaining-tokens", "29000"}, {"x-ratelimit-reset-tokens", "6m0.5s"},
    };
    struct sluice_curl_result r = classify_h(200, CURLE_OK, true, h, 6);
    cr_assert_eq(r.ratelimit.requests.limit, 500);
    cr_assert_eq(r.ratelimit.requests.remaining, 499);
    cr_assert_eq(r.ratelimit.requests.reset_ns, 120 * SLUICE_NS_PER_MS);
    cr_assert_eq(r.ratelimit.tokens.limit, 30000);
    cr_assert_eq(r.ratelimit.tokens.remaining, 29000);
    cr_assert_eq(r.ratelimit.tokens.reset_ns, 360 * SEC + SEC / 2);
    cr_assert_eq(r.ratelimit.source, SLUICE_CURL_DIALECT_GENERIC, "detected: the shared names");
    cr_assert_eq(r.ratelimit.requests.window, SLUICE_CURL_WINDOW_UNKNOWN,
                 "OpenAI's names alone do not say per minute or per day (Groq)");
}

Test(classify, openrouter_rate_limit_headers_are_parsed_with_an_epoch_ms_reset)
{
    struct sluice_curl_header h[] = {{"X-RateLimit-Limit", "20"},
                                     {"X-RateLimit-Remaining", "0"},
                                     {"X-RateLimit-Reset", "1700000012000"}};
    struct sluice_curl_result r = classify_h(429, CURLE_OK, true, h, 3);
    cr_assert_eq(r.ratelimit.requests.limit, 20);
    cr_assert_eq(r.ratelimit.requests.remaining, 0);
    cr_assert_eq(r.ratelimit.requests.reset_ns, 12 * SEC);
    cr_assert_eq(r.ratelimit.requests.reset_at_ms, 1700000012000);
    cr_assert_eq(r.ratelimit.tokens.limit, -1, "absent headers read -1");
    cr_assert_eq(r.retry_after_ns, 0, "rate-limit headers are not a Retry-After");
    cr_assert_eq(r.kind, SLUICE_CURL_RATE_LIMITED, "a spent budget with its reset");
    cr_assert_eq(r.hold_ns, 12 * SEC, "held until the reset");
}

Test(classify, a_429_whose_named_reset_has_already_passed_is_still_a_rate_limit)
{
    /* Read late on a busy machine: each dialect's reset is already behind `now` (an epoch, a
     * date, a zero duration), or only Retry-After is left to wait. Still the budget's refusal:
     * no cut, and no hold beyond Retry-After. */
    struct sluice_curl_header openrouter[] = {{"X-RateLimit-Limit", "20"},
                                              {"X-RateLimit-Remaining", "0"},
                                              {"X-RateLimit-Reset", "1699999999500"}};
    struct sluice_curl_header anthropic[] = {
        {"anthropic-ratelimit-requests-limit", "50"},
        {"anthropic-ratelimit-requests-remaining", "0"},
        {"anthropic-ratelimit-requests-reset", "2023-11-14T22:13:19Z"}};
    struct sluice_curl_header openai[] = {{"x-ratelimit-remaining-tokens", "0"},
                                          {"x-ratelimit-reset-tokens", "0s"},
                                          {"Retry-After", "2"}};
    const struct {
        const char *who;
        const struct sluice_curl_header *h;
        int64_t hold_ns;
    } cases[] = {{"openrouter (epoch ms)", openrouter, 0},
                 {"anthropic (RFC 3339)", anthropic, 0},
                 {"openai tokens (0s, Retry-After 2)", openai, 2 * SEC}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sluice_curl_result r = classify_h(429, CURLE_OK, true, cases[i].h, 3);
        cr_assert_eq(r.kind, SLUICE_CURL_RATE_LIMITED, "%s: kind %s", cases[i].who,
                     sluice_curl_kind_name(r.kind));
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_RATE, "%s: no cut", cases[i].who);
        cr_assert_eq(r.hold_ns, cases[i].hold_ns, "%s: hold %lld", cases[i].who,
                     (long long)r.hold_ns);
    }
    /* Nothing spent (remaining 1), or spent with no reset named: the caller's cap. */
    struct sluice_curl_header left[] = {{"x-ratelimit-remaining-requests", "1"},
                                        {"x-ratelimit-reset-requests", "0s"}};
    cr_assert_eq(classify_h(429, CURLE_OK, true, left, 2).kind, SLUICE_CURL_OVERLOADED);
    struct sluice_curl_header unnamed[] = {{"x-ratelimit-remaining-requests", "0"}};
    cr_assert_eq(classify_h(429, CURLE_OK, true, unnamed, 1).kind, SLUICE_CURL_OVERLOADED);
}

Test(classify, the_specific_rate_limit_header_beats_the_plain_one_in_any_order)
{
    struct sluice_curl_header h[] = {{"x-ratelimit-limit-requests", "500"},
                                     {"x-ratelimit-limit", "7"},
                                     {"x-ratelimit-remaining", "3"},
                                     {"x-ratelimit-remaining-requests", "400"}};
    struct sluice_curl_result r = classify_h(200, CURLE_OK, true, h, 4);
    cr_assert_eq(r.ratelimit.requests.limit, 500);
    cr_assert_eq(r.ratelimit.requests.remaining, 400);
}

Test(classify, malformed_headers_are_skipped_without_harm)
{
    struct sluice_curl_header h[] = {{NULL, "5"},
                                     {"Retry-After", NULL},
                                     {"x-ratelimit-limit-requests", "-3"},
                                     {"x-ratelimit-reset-requests", "5parsecs"},
                                     {"x-ratelimit-remaining-tokens", "99999999999999999999999"},
                                     {"x-ratelimit-reset-tokens", "1h1h1h"},
                                     {"", ""}};
    struct sluice_curl_result r = classify_h(429, CURLE_OK, true, h, 7);
    cr_assert_eq(r.kind, SLUICE_CURL_OVERLOADED);
    cr_assert_eq(r.retry_after_ns, 0);
    cr_assert_eq(r.ratelimit.requests.limit, -1);
    cr_assert_eq(r.ratelimit.requests.reset_ns, -1);
    cr_assert_eq(r.ratelimit.tokens.remaining, INT64_MAX, "overflow saturates");
    cr_assert_eq(r.ratelimit.tokens.reset_ns, 3 * 3600 * SEC);
}

Test(classify, every_kind_has_a_name)
{
    cr_assert_str_eq(sluice_curl_kind_name(SLUICE_CURL_SUCCESS), "success");
    cr_assert_str_eq(sluice_curl_kind_name(SLUICE_CURL_PROVIDER_TIMEOUT), "provider_timeout");
    cr_assert_str_eq(sluice_curl_kind_name(SLUICE_CURL_ABORTED), "aborted");
    cr_assert_str_eq(sluice_curl_kind_name((enum sluice_curl_kind)99), "unknown");
}
