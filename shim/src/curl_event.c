/*
 * curl_event.c — sluice_curl_classify_event: an error event in a streamed
 * answer, read as the error response it stands for and classified by the
 * one rule (sluice_curl_classify), so the chat client and sluice-proxy
 * hear a mid-stream refusal the same way.
 */
#define _GNU_SOURCE /* memmem */
#include "curl_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An error's code as an HTTP status (a number or a numeric string, 400..599); 0 else. */
static long sluice__event_code_status(json_t *code)
{
    long v = 0;
    if (json_is_integer(code)) {
        json_int_t i = json_integer_value(code);
        v = i >= 400 && i < 600 ? (long)i : 0;
    } else if (json_is_string(code)) {
        const char *s = json_string_value(code);
        char *end = NULL;
        long i = strtol(s, &end, 10);
        v = *s >= '0' && *s <= '9' && end && !*end && i >= 400 && i < 600 ? i : 0;
    }
    return v;
}

/* The status of the answer an error type or code names, where a provider sends it without a
 * number; the body decides the kind from there (an overloaded_error or insufficient_quota
 * refines a refusal as SLUICE_CURL_KIND_MAP says). */
static const struct {
    const char *name;
    long status;
} sluice__event_names[] = {
    {"rate_limit_exceeded", 429}, /* OpenAI's code */
    {"rate_limit_error", 429},    /* Anthropic's type */
    {"insufficient_quota", 429},  /* OpenAI's, as its 429 */
    {"overloaded_error", 529},    /* Anthropic's, as its 529 */
};

static long sluice__event_name_status(json_t *name)
{
    const char *s = json_string_value(name);
    for (size_t i = 0; s && i < sizeof sluice__event_names / sizeof sluice__event_names[0]; i++)
        if (strcmp(s, sluice__event_names[i].name) == 0)
            return sluice__event_names[i].status;
    return 0;
}

bool sluice_curl_classify_event(const char *data, size_t len, enum sluice_curl_dialect dialect,
                                struct sluice_curl_result *out)
{
    /* Both shapes hold the string: an "error" key, or finish_reason "error". */
    if (!data || !out || !memmem(data, len, "\"error\"", 7))
        return false;
    json_t *root = json_loadb(data, len, 0, NULL);
    json_t *error = json_object_get(root, "error");
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    if (!json_is_object(error) && !(finish && strcmp(finish, "error") == 0)) {
        json_decref(root);
        return false;
    }
    json_t *code = json_object_get(error, "code"), *type = json_object_get(error, "type");
    long status = sluice__event_code_status(code);
    if (!status)
        status = sluice__event_name_status(code);
    if (!status)
        status = sluice__event_name_status(type);
    struct sluice_curl_response as_answer = {.http_status = status, .code = CURLE_OK,
                                             .request_sent = true, .retry_after_s = -1,
                                             .dialect = dialect, .body = data, .body_len = len};
    sluice_curl_classify(&as_answer, out);
    if (!status) { /* it says the call failed, and no more */
        out->kind = SLUICE_CURL_SERVER_ERROR;
        out->outcome = sluice_curl_kind_outcome(out->kind);
        out->retry_after_ns = out->hold_ns = 0;
    }
    const char *named = json_is_string(code) ? json_string_value(code)
                        : json_is_string(type) ? json_string_value(type)
                                               : NULL;
    const char *message = json_string_value(json_object_get(error, "message"));
    char number[24];
    if (json_is_integer(code)) {
        snprintf(number, sizeof number, "%lld", (long long)json_integer_value(code));
        named = number;
    }
    snprintf(out->error, sizeof out->error,
             "the provider ended the stream with an error event (%s: %.60s)",
             named ? named : "no code", message ? message : "no message");
    json_decref(root);
    return true;
}
