/*
 * classify_event.c — sluice_curl_classify_event: an error event that ends a
 * streamed answer, in each provider's shape, is the error response it
 * stands for under SLUICE_CURL_KIND_MAP; every other event is no error. No
 * socket: each event's data is written by hand.
 */
#include <criterion/criterion.h>

#include <sluice/curl.h>

#include <string.h>

/* The event's classification; *error says whether it was an error event. */
static struct sluice_curl_result event(const char *data, bool *error)
{
    struct sluice_curl_result out;
    memset(&out, 0x5a, sizeof out);
    *error = sluice_curl_classify_event(data, strlen(data), SLUICE_CURL_DIALECT_AUTO, &out);
    return out;
}

static void assert_error_event(const char *data, enum sluice_curl_kind kind,
                               enum sluice_outcome outcome, long status)
{
    bool error;
    struct sluice_curl_result r = event(data, &error);
    cr_assert(error, "not read as an error event: %s", data);
    cr_assert_eq(r.kind, kind, "%s: kind %s", data, sluice_curl_kind_name(r.kind));
    cr_assert_eq(r.outcome, outcome, "%s", data);
    cr_assert_eq(r.http_status, status, "%s: stands for %ld", data, r.http_status);
    cr_assert(strstr(r.error, "error event"), "result.error quotes it: %s", r.error);
}

Test(classify_event, a_rate_limit_mid_stream_is_the_429_it_stands_for_in_every_shape)
{
    /* OpenRouter: a numeric code, with finish_reason "error". */
    assert_error_event("{\"choices\":[{\"delta\":{},\"finish_reason\":\"error\"}],"
                       "\"error\":{\"code\":429,\"message\":\"cap\"}}",
                       SLUICE_CURL_OVERLOADED, SLUICE_OUTCOME_OVERLOAD, 429);
    assert_error_event("{\"error\":{\"code\":\"429\",\"message\":\"cap\"}}",
                       SLUICE_CURL_OVERLOADED, SLUICE_OUTCOME_OVERLOAD, 429);
    /* OpenAI: the code is a name. */
    assert_error_event("{\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\","
                       "\"code\":\"rate_limit_exceeded\"}}",
                       SLUICE_CURL_OVERLOADED, SLUICE_OUTCOME_OVERLOAD, 429);
    /* Anthropic: `event: error`, the type names it. */
    assert_error_event("{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\","
                       "\"message\":\"slow down\"}}",
                       SLUICE_CURL_OVERLOADED, SLUICE_OUTCOME_OVERLOAD, 429);
}

Test(classify_event, the_body_rules_of_a_refusal_apply_to_the_event)
{
    assert_error_event("{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                       "\"message\":\"Overloaded\"}}",
                       SLUICE_CURL_PLATFORM_OVERLOAD, SLUICE_OUTCOME_PLATFORM, 529);
    assert_error_event("{\"error\":{\"message\":\"You exceeded your current quota\","
                       "\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}",
                       SLUICE_CURL_QUOTA, SLUICE_OUTCOME_QUOTA, 429);
    /* A body's retry hint is the hold, as on a 429 answer. */
    bool error;
    struct sluice_curl_result r =
        event("{\"error\":{\"code\":429,\"metadata\":{\"retry_after_seconds\":3}}}", &error);
    cr_assert(error);
    cr_assert_eq(r.retry_after_ns, 3 * SLUICE_NS_PER_SEC);
}

Test(classify_event, an_error_that_names_no_refusal_is_a_server_error)
{
    assert_error_event("{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}",
                       SLUICE_CURL_SERVER_ERROR, SLUICE_OUTCOME_IGNORE, 0);
    assert_error_event("{\"choices\":[{\"delta\":{},\"finish_reason\":\"error\"}]}",
                       SLUICE_CURL_SERVER_ERROR, SLUICE_OUTCOME_IGNORE, 0);
    assert_error_event("{\"error\":{\"code\":500,\"message\":\"internal\"}}",
                       SLUICE_CURL_SERVER_ERROR, SLUICE_OUTCOME_IGNORE, 500);
}

Test(classify_event, other_events_are_no_error_and_leave_the_result_alone)
{
    static const char *const others[] = {
        "[DONE]",
        "{\"choices\":[{\"delta\":{\"content\":\"error\"},\"finish_reason\":null}]}",
        "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}",
        "{\"type\":\"message_start\"}",
        "{\"error\":\"a string, not an error object\"}",
        "\"error\" but not JSON {",
        "",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        bool error;
        struct sluice_curl_result r = event(others[i], &error);
        cr_assert_not(error, "read as an error: %s", others[i]);
        unsigned char untouched[sizeof r];
        memset(untouched, 0x5a, sizeof untouched);
        cr_assert_eq(memcmp(&r, untouched, sizeof r), 0, "%s wrote the result", others[i]);
    }
    cr_assert_not(sluice_curl_classify_event(NULL, 0, SLUICE_CURL_DIALECT_AUTO, NULL));
}
