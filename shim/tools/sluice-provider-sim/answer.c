/*
 * answer.c — how the simulator answers: JSON bodies (a chat.completion, an
 * OpenAI-shaped error), the headers a dialect adds to this thread's next
 * answer, and libmicrohttpd's log, quiet about a MHD_NO given on purpose.
 */
#define _GNU_SOURCE
#include "sim.h"

_Thread_local bool mhd_no_on_purpose;

/* Headers the dialect wants on the answer this thread is building
 * (dialect_header adds them, respond_json sends and empties them). */
#define MAX_DIALECT_HEADERS 6
static _Thread_local struct {
    size_t n;
    char name[MAX_DIALECT_HEADERS][40];
    char value[MAX_DIALECT_HEADERS][48];
} dialect_headers;

/* Add one header to the answer this thread builds next. */
void dialect_header(const char *name, const char *fmt, ...)
{
    if (dialect_headers.n == MAX_DIALECT_HEADERS)
        return;
    size_t i = dialect_headers.n++;
    snprintf(dialect_headers.name[i], sizeof dialect_headers.name[i], "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dialect_headers.value[i], sizeof dialect_headers.value[i], fmt, ap);
    va_end(ap);
}


void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (mhd_no_on_purpose) {
        mhd_no_on_purpose = false;
        return;
    }
    fputs(PROG ": libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

enum MHD_Result add_dialect_headers(struct MHD_Response *res)
{
    enum MHD_Result ok = MHD_YES;
    for (size_t i = 0; ok == MHD_YES && i < dialect_headers.n; i++)
        ok = MHD_add_response_header(res, dialect_headers.name[i], dialect_headers.value[i]);
    dialect_headers.n = 0; /* one answer's */
    return ok;
}

enum MHD_Result respond_json(struct MHD_Connection *conn, unsigned status, json_t *body,
                                    const char *retry_after)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text)
        return MHD_NO;
    struct MHD_Response *res =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
    free(text);
    if (!res)
        return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (ok == MHD_YES && retry_after)
        ok = MHD_add_response_header(res, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (ok == MHD_YES)
        ok = add_dialect_headers(res);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, status, res);
    MHD_destroy_response(res);
    return ok;
}

json_t *error_body(const char *message, const char *type, const char *code)
{
    return json_pack("{s:{s:s, s:s, s:s}}", "error", "message", message, "type", type, "code", code);
}

/* The "model" of the request body, if it is JSON with one. */
void request_model(const struct req *r, char *out, size_t n)
{
    snprintf(out, n, "sluice-sim");
    json_t *root = r->body_len ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
    const char *m = json_string_value(json_object_get(root, "model"));
    if (m)
        snprintf(out, n, "%s", m);
    json_decref(root);
}

json_t *completion_body(const struct req *r)
{
    char id[48], model[256], content[64];
    snprintf(id, sizeof id, "chatcmpl-sim-%" PRIu64, r->id);
    snprintf(content, sizeof content, "sluice-provider-sim reply %" PRIu64, r->id);
    request_model(r, model, sizeof model);
    json_int_t prompt = (json_int_t)(r->body_len + 3) / 4, completion = 5;
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], s:{s:I, s:I, s:I}}",
                     "id", id, "object", "chat.completion", "created", (json_int_t)time(NULL),
                     "model", model, "choices", "index", 0, "message", "role", "assistant",
                     "content", content, "finish_reason", "stop", "usage", "prompt_tokens", prompt,
                     "completion_tokens", completion, "total_tokens", prompt + completion);
}

