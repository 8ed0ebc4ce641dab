/*
 * client.c — the built-in chat-completions client (sluice/client.h).
 *
 * Request bodies are built and replies parsed with jansson; the conversation
 * is a jansson array that grows by two messages per repair. The response
 * body, the reply and every copied string come from malloc.
 */
#include <sluice/client.h>
#include <sluice/sse.h>

#include "curl_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SLUICE__CHAT_REPAIR_DEFAULT "That answer was rejected; answer again, correctly."

/* How the current response's body is read: decided at its first byte. */
enum sluice__chat_body_mode {
    SLUICE__CHAT_BODY_UNDECIDED = 0,
    SLUICE__CHAT_BODY_JSON, /* one chat.completion (or an error) */
    SLUICE__CHAT_BODY_SSE,  /* a 2xx text/event-stream: chat.completion.chunk events */
};

/* What the current stream said, event by event. */
struct sluice__chat_stream {
    struct sluice_sse sse;
    int64_t first_event_ns; /* the first event (comments excluded) arrived; 0 = none yet */
    bool done;              /* data: [DONE] came */
    bool finished;          /* a finish_reason other than "error" came */
    bool failed;            /* an error event came, or an event that is not a chunk */
    bool error_event;       /* the provider ended the stream with an error event */
    bool nomem;             /* the reply could not grow */
    struct sluice_curl_result said; /* when it failed: its kind, sample, hold and why
                                       (sluice_curl_classify_event for an error event) */
};

struct sluice_chat {
    char *base_url, *model, *api_key, *repair_prompt, *next_repair;
    long max_tokens;
    int64_t retry_after_max_ns;
    enum sluice_curl_dialect dialect;
    int (*validate)(void *ctx, struct sluice_chat *chat, unsigned attempt, bool *repair);
    void *validate_ctx;
    bool stream;
    sluice_chat_delta_fn on_delta;
    void *delta_ctx;
    json_t *messages;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* the last response body; when streaming, the reply assembled so far */
    size_t body_len, body_cap;
    size_t received; /* bytes of response body read, against SLUICE_CHAT_REPLY_MAX */
    bool body_truncated;
    enum sluice__chat_body_mode body_mode;
    char *sse_buf; /* SLUICE_CHAT_EVENT_MAX bytes, from the first streamed answer on */
    struct sluice__chat_stream st;
    char *reply;
    struct sluice_chat_usage usage;
    struct sluice_curl_result result;
    /* On the curl loop (sluice_chat_submit): the caller's completion and the conclusion the
     * finish hook reached; loop thread only after submit. */
    sluice_chat_done_fn loop_done;
    sluice_chat_done_fn loop_cut; /* the caller's cut (sluice_chat_request.cut) */
    void *loop_data;
    int loop_status;
    bool loop_finished;
    bool loop_was_cut; /* the caller had its answer at the deadline; the loop reads on */
};

static char *sluice__dup(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Overwrite a secret before its memory goes back. */
static void sluice__wipe(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
}

/* SLUICE_OK when `s` (may be NULL) is UTF-8, as a JSON string must be (jansson's own check:
 * json_string refuses anything else); SLUICE_EINVAL when not; SLUICE_ENOMEM. */
static int sluice__chat_utf8(const char *s)
{
    if (!s)
        return SLUICE_OK;
    json_t *checked = json_string(s);
    json_t *unchecked = checked ? NULL : json_string_nocheck(s);
    int status = checked ? SLUICE_OK : unchecked ? SLUICE_EINVAL : SLUICE_ENOMEM;
    json_decref(checked);
    json_decref(unchecked);
    return status;
}

/* The first text field of `d` that is not UTF-8, named in d->error. */
static int sluice__chat_check_text(const struct sluice_chat_desc *d)
{
    const struct {
        const char *name, *value;
    } fields[] = {{"model", d->model},
                  {"system", d->system},
                  {"prompt", d->prompt},
                  {"repair_prompt", d->repair_prompt}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        int status = sluice__chat_utf8(fields[i].value);
        if (status == SLUICE_EINVAL)
            return sluice__fail(d->error, d->error_size,
                                "sluice_chat_desc.%s is not valid UTF-8 (JSON strings must "
                                "be; convert it, e.g. with iconv)",
                                fields[i].name);
        if (status != SLUICE_OK)
            return status;
    }
    return SLUICE_OK;
}

static int sluice__chat_add(json_t *messages, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && json_array_append_new(messages, m) == 0 ? SLUICE_OK : SLUICE_ENOMEM;
}

/* Append to c->body (kept NUL-terminated); false when memory runs out. */
static bool sluice__chat_append(struct sluice_chat *c, const char *data, size_t bytes)
{
    if (c->body_len + bytes + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + bytes + 1)
            cap *= 2;
        char *grown = realloc(c->body, cap);
        if (!grown)
            return false;
        c->body = grown;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, data, bytes);
    c->body_len += bytes;
    c->body[c->body_len] = '\0';
    return true;
}

/* A streamed chat asked for SSE and a 2xx text/event-stream came: read it as events.
 * Anything else (an error's JSON, a provider that ignores "stream") is one body. */
static enum sluice__chat_body_mode sluice__chat_body_mode(struct sluice_chat *c)
{
    long http = 0;
    char *type = NULL;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(c->easy, CURLINFO_CONTENT_TYPE, &type);
    static const char sse[] = "text/event-stream";
    bool events = c->stream && http >= 200 && http < 300 && type &&
                  strncasecmp(type, sse, sizeof sse - 1) == 0;
    return events ? SLUICE__CHAT_BODY_SSE : SLUICE__CHAT_BODY_JSON;
}

static bool sluice__chat_stream_open(struct sluice_chat *c);

static size_t sluice__chat_body(char *data, size_t size, size_t n, void *ctx)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    size_t bytes = size * n;
    if (bytes > SLUICE_CHAT_REPLY_MAX - c->received) {
        /* Past the cap nothing more is kept, so nothing more is read: a short count makes
         * curl end the transfer (CURLE_WRITE_ERROR) instead of draining an endless body. */
        c->body_truncated = true;
        return 0;
    }
    c->received += bytes;
    if (c->body_mode == SLUICE__CHAT_BODY_UNDECIDED &&
        (c->body_mode = sluice__chat_body_mode(c)) == SLUICE__CHAT_BODY_SSE &&
        !sluice__chat_stream_open(c))
        return 0;
    if (c->body_mode == SLUICE__CHAT_BODY_SSE) /* an error event or a bad stream stops it */
        return sluice_sse_feed(&c->st.sse, data, bytes) == SLUICE_OK ? bytes : 0;
    return sluice__chat_append(c, data, bytes) ? bytes : 0; /* 0: CURLE_WRITE_ERROR */
}

void sluice_chat_destroy(struct sluice_chat *c)
{
    if (!c)
        return;
    for (struct curl_slist *h = c->headers; h; h = h->next)
        sluice__wipe(h->data);
    curl_slist_free_all(c->headers);
    if (c->easy)
        curl_easy_cleanup(c->easy);
    sluice__wipe(c->api_key);
    json_decref(c->messages);
    free(c->base_url);
    free(c->model);
    free(c->api_key);
    free(c->repair_prompt);
    free(c->next_repair);
    free(c->body);
    free(c->sse_buf);
    free(c->reply);
    free(c);
}

/* The Authorization and Content-Type headers; the key's copies are wiped on the way. */
static struct curl_slist *sluice__chat_headers(const char *api_key)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h && api_key && *api_key) {
        size_t n = strlen("Authorization: Bearer ") + strlen(api_key) + 1;
        char *line = malloc(n);
        struct curl_slist *more = NULL;
        if (line) {
            strcpy(line, "Authorization: Bearer ");
            strcat(line, api_key);
            more = curl_slist_append(h, line);
            explicit_bzero(line, n);
            free(line);
        }
        if (!more) {
            for (struct curl_slist *p = h; p; p = p->next)
                sluice__wipe(p->data);
            curl_slist_free_all(h);
            return NULL;
        }
        h = more;
    }
    return h;
}

int sluice_chat_create(const struct sluice_chat_desc *d, struct sluice_chat **out)
{
    if (out)
        *out = NULL;
    if (!d)
        return SLUICE_EINVAL;
    if (d->error && d->error_size)
        d->error[0] = '\0';
    if (!out)
        return sluice__fail(d->error, d->error_size,
                            "out is NULL (pass the address of a struct sluice_chat *)");
    if (!d->model || !d->prompt)
        return sluice__fail(d->error, d->error_size,
                            "%s is NULL (set sluice_chat_desc.%s%s)",
                            !d->model ? "model" : "prompt", !d->model ? "model" : "prompt",
                            !d->model ? ", e.g. \"openai/gpt-4o-mini\"" : "");
    int checked = sluice__chat_check_text(d);
    if (checked != SLUICE_OK)
        return checked;
    struct sluice_chat *c = calloc(1, sizeof *c);
    if (!c)
        return SLUICE_ENOMEM;
    const char *key = d->api_key;
    SLUICE__DEFAULT(key, getenv(SLUICE_CHAT_API_KEY_ENV));
    SLUICE__DEFAULT(key, getenv(SLUICE_CHAT_API_KEY_ENV_OPENROUTER));
    const char *repair = d->repair_prompt;
    SLUICE__DEFAULT(repair, SLUICE__CHAT_REPAIR_DEFAULT);
    c->base_url = sluice__dup(d->base_url);
    c->model = sluice__dup(d->model);
    c->api_key = sluice__dup(key);
    c->repair_prompt = sluice__dup(repair);
    c->max_tokens = d->max_tokens;
    c->retry_after_max_ns = d->retry_after_max_ns;
    c->dialect = d->dialect;
    c->validate = d->validate;
    c->validate_ctx = d->validate_ctx;
    c->stream = d->stream;
    c->on_delta = d->on_delta;
    c->delta_ctx = d->delta_ctx;
    c->usage = (struct sluice_chat_usage){-1, -1};
    c->messages = json_array();
    c->easy = curl_easy_init();
    c->headers = sluice__chat_headers(c->api_key);
    sluice__curl_result_init(&c->result);
    int status = (!c->model || !c->repair_prompt || (d->base_url && !c->base_url) ||
                  (key && !c->api_key) || !c->messages || !c->easy || !c->headers)
                     ? SLUICE_ENOMEM
                     : SLUICE_OK;
    if (status == SLUICE_OK && d->system)
        status = sluice__chat_add(c->messages, "system", d->system);
    if (status == SLUICE_OK)
        status = sluice__chat_add(c->messages, "user", d->prompt);
    if (status != SLUICE_OK) {
        sluice_chat_destroy(c);
        return status;
    }
    curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, sluice__chat_body);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->easy, CURLOPT_ACCEPT_ENCODING, "");
    /* A Content-Length above the cap is refused before its body (CURLE_FILESIZE_EXCEEDED);
     * an unknown length (chunked, compressed) is cut in sluice__chat_body. */
    curl_easy_setopt(c->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)SLUICE_CHAT_REPLY_MAX);
    *out = c;
    return SLUICE_OK;
}

int sluice_chat_set_repair(struct sluice_chat *c, const char *message)
{
    if (!c)
        return SLUICE_EINVAL;
    int status = sluice__chat_utf8(message);
    if (status != SLUICE_OK)
        return status;
    char *copy = NULL;
    if (message && !(copy = strdup(message)))
        return SLUICE_ENOMEM;
    free(c->next_repair);
    c->next_repair = copy;
    return SLUICE_OK;
}

const char *sluice_chat_reply(const struct sluice_chat *c)
{
    return c ? c->reply : NULL;
}

CURL *sluice_chat_easy(struct sluice_chat *c)
{
    return c ? c->easy : NULL;
}

const struct sluice_curl_result *sluice_chat_result(const struct sluice_chat *c)
{
    return c ? &c->result : NULL;
}

struct sluice_chat_usage sluice_chat_last_usage(const struct sluice_chat *c)
{
    return c ? c->usage : (struct sluice_chat_usage){-1, -1}; /* no chat: none known */
}

/* A repair resends the conversation with the rejected reply and the repair message. */
static int sluice__chat_extend(struct sluice_chat *c)
{
    int status = sluice__chat_add(c->messages, "assistant", c->reply ? c->reply : "");
    if (status == SLUICE_OK)
        status = sluice__chat_add(c->messages, "user",
                                  c->next_repair ? c->next_repair : c->repair_prompt);
    free(c->next_repair);
    c->next_repair = NULL;
    return status;
}

static void sluice__chat_read_usage(struct sluice_chat *c, json_t *usage)
{
    json_t *prompt = json_object_get(usage, "prompt_tokens");
    json_t *completion = json_object_get(usage, "completion_tokens");
    if (json_is_integer(prompt))
        c->usage.prompt_tokens = json_integer_value(prompt);
    if (json_is_integer(completion))
        c->usage.completion_tokens = json_integer_value(completion);
}

/* choices[0].message.content of a 2xx body, copied into c->reply; usage when sent. */
static int sluice__chat_parse(struct sluice_chat *c)
{
    json_t *root = c->body ? json_loadb(c->body, c->body_len, 0, NULL) : NULL;
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message"), "content");
    int status = SLUICE_EIO;
    if (json_is_string(content)) {
        free(c->reply);
        c->reply = strndup(json_string_value(content), json_string_length(content));
        status = c->reply ? SLUICE_OK : SLUICE_ENOMEM;
        sluice__chat_read_usage(c, json_object_get(root, "usage"));
    }
    json_decref(root);
    return status;
}

/* ---- streaming ------------------------------------------------------------------- */

/* A stream the client cannot read: the provider failed the call (SERVER_ERROR, no hold). */
static int sluice__chat_stream_fail(struct sluice__chat_stream *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int sluice__chat_stream_fail(struct sluice__chat_stream *st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->said.error, sizeof st->said.error, fmt, ap);
    va_end(ap);
    st->failed = true;
    st->said.kind = SLUICE_CURL_SERVER_ERROR;
    st->said.outcome = sluice_curl_kind_outcome(st->said.kind);
    st->said.retry_after_ns = st->said.hold_ns = 0;
    return SLUICE_EIO;
}

/* One chat.completion.chunk (an error event was heard before: sluice__chat_event). */
static int sluice__chat_chunk(struct sluice_chat *c, json_t *root)
{
    struct sluice__chat_stream *st = &c->st;
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    if (!json_is_object(root))
        return sluice__chat_stream_fail(st, "an event's data is not a JSON object");
    json_t *usage = json_object_get(root, "usage");
    if (json_is_object(usage))
        sluice__chat_read_usage(c, usage);
    json_t *content = json_object_get(json_object_get(choice, "delta"), "content");
    size_t len = json_string_length(content);
    if (len) {
        const char *text = json_string_value(content);
        if (!sluice__chat_append(c, text, len)) {
            st->nomem = true;
            return SLUICE_ENOMEM;
        }
        if (c->on_delta)
            c->on_delta(c->delta_ctx, c, text, len);
    }
    if (finish)
        st->finished = true;
    return SLUICE_OK;
}

static int sluice__chat_event(void *ctx, const struct sluice_sse_event *ev)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    if (!c->st.first_event_ns)
        c->st.first_event_ns = sluice_monotonic_ns();
    static const char done[] = "[DONE]";
    if (ev->data_len == sizeof done - 1 && memcmp(ev->data, done, sizeof done - 1) == 0) {
        c->st.done = true;
        return SLUICE_OK;
    }
    if (sluice_curl_classify_event(ev->data, ev->data_len, c->dialect, &c->st.said)) {
        c->st.failed = c->st.error_event = true;
        return SLUICE_EIO;
    }
    json_t *root = json_loadb(ev->data, ev->data_len, 0, NULL);
    int status = root ? sluice__chat_chunk(c, root)
                      : sluice__chat_stream_fail(&c->st, "an event's data is not JSON");
    json_decref(root);
    return status;
}

/* Before a streamed generation's transfer. */
static void sluice__chat_stream_begin(struct sluice_chat *c)
{
    memset(&c->st, 0, sizeof c->st);
}

/* A stream arrived: the parser, with the event buffer allocated now (after admission and the
 * permit, so a refused request never paid for it) and kept for the chat's next streams. False
 * when memory runs out (st.nomem). */
static bool sluice__chat_stream_open(struct sluice_chat *c)
{
    if (!c->sse_buf && !(c->sse_buf = malloc(SLUICE_CHAT_EVENT_MAX))) {
        c->st.nomem = true;
        return false;
    }
    sluice_sse_init(&c->st.sse, &(struct sluice_sse_desc){.buf = c->sse_buf,
                                                          .size = SLUICE_CHAT_EVENT_MAX,
                                                          .on_event = sluice__chat_event,
                                                          .ctx = c});
    return true;
}

/* What a streamed response ends as; `status` is the transfer's. Corrects c->result (kind,
 * outcome, error) to what the stream said. (Its latency is already the time to the first
 * event: the transport times it by sluice__chat_begun, as for any caller that declares
 * `write`.) */
static int sluice__chat_stream_end(struct sluice_chat *c, int status)
{
    struct sluice__chat_stream *st = &c->st;
    if (st->nomem)
        return SLUICE_ENOMEM;
    const char *bad_stream = sluice_sse_error(&st->sse);
    if (!st->failed && *bad_stream)
        sluice__chat_stream_fail(st, "the event stream is invalid: %s", bad_stream);
    if (st->failed) {
        /* The transfer was stopped here on purpose: what the stream said is the kind, not
         * the CURLE_WRITE_ERROR that stopping it left; the status line stays the answer's. */
        c->result.kind = st->said.kind;
        c->result.outcome = st->said.outcome;
        c->result.retry_after_ns = st->said.retry_after_ns;
        c->result.hold_ns = st->said.hold_ns;
        snprintf(c->result.error, sizeof c->result.error, "%s", st->said.error);
        return SLUICE_EIO;
    }
    if (status != SLUICE_OK)
        return status;
    if (!st->done && !st->finished) {
        c->result.outcome = SLUICE_OUTCOME_IGNORE;
        snprintf(c->result.error, sizeof c->result.error,
                 "the event stream ended before data: [DONE] or a finish_reason (cut short)");
        return SLUICE_EIO;
    }
    free(c->reply);
    c->reply = strndup(c->body ? c->body : "", c->body_len);
    return c->reply ? SLUICE_OK : SLUICE_ENOMEM;
}

/* ---- one generation, on either path ------------------------------------------------ */

/* The request body: the conversation, and the stream flags when streaming. */
static char *sluice__chat_request(const struct sluice_chat *c)
{
    json_t *req = json_pack("{s:s, s:O}", "model", c->model, "messages", c->messages);
    if (req && c->max_tokens > 0)
        json_object_set_new(req, "max_tokens", json_integer(c->max_tokens));
    if (req && c->stream) {
        json_object_set_new(req, "stream", json_true());
        json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return body;
}

/* Set the easy handle up for the next generation against `endpoint` (the chat's base_url
 * wins) and reset what one response leaves behind. */
static int sluice__chat_prepare(struct sluice_chat *c, const char *endpoint)
{
    const char *base = c->base_url ? c->base_url : endpoint;
    if (!base) {
        sluice__curl_result_init(&c->result);
        return c->result.status = sluice__fail(
                   c->result.error, sizeof c->result.error,
                   "no URL to send the chat to: set sluice_chat_desc.base_url, or an endpoint on "
                   "the backend, the run or the request");
    }
    size_t base_len = strlen(base);
    while (base_len && base[base_len - 1] == '/')
        base_len--;
    static const char path[] = "/chat/completions";
    char *url = malloc(base_len + sizeof path);
    char *body = sluice__chat_request(c);
    if (!url || !body) {
        free(url);
        free(body);
        return SLUICE_ENOMEM;
    }
    memcpy(url, base, base_len);
    memcpy(url + base_len, path, sizeof path);
    curl_easy_setopt(c->easy, CURLOPT_URL, url);
    curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, body);
    free(url);
    free(body);
    c->body_len = c->received = 0;
    c->body_truncated = false;
    c->body_mode = SLUICE__CHAT_BODY_UNDECIDED;
    c->usage = (struct sluice_chat_usage){-1, -1};
    if (c->stream)
        sluice__chat_stream_begin(c);
    return SLUICE_OK;
}

/* After the transfer (c->result filled, `status` its return): what the generation returns,
 * with c->result corrected to what the body said. */
static int sluice__chat_answer(struct sluice_chat *c, int status)
{
    if (c->body_truncated || c->result.curl_code == CURLE_FILESIZE_EXCEEDED) {
        snprintf(c->result.error, sizeof c->result.error,
                 "the response body passed SLUICE_CHAT_REPLY_MAX (%u bytes); the transfer was "
                 "ended (ask the provider for a shorter reply, e.g. max_tokens)",
                 SLUICE_CHAT_REPLY_MAX);
        return SLUICE_EIO;
    }
    if (c->body_mode == SLUICE__CHAT_BODY_SSE)
        return sluice__chat_stream_end(c, status);
    if (status != SLUICE_OK)
        return status;
    if (c->result.kind != SLUICE_CURL_SUCCESS)
        return SLUICE_EIO;
    return sluice__chat_parse(c);
}

/* sluice__chat_answer, with c->result's outcome the sample discovery gets on either path: a
 * failed generation cannot say the provider served it (sluice_run's own rule). */
static int sluice__chat_conclude(struct sluice_chat *c, int status)
{
    status = sluice__chat_answer(c, status);
    if (status != SLUICE_OK && c->result.outcome == SLUICE_OUTCOME_OK)
        c->result.outcome = SLUICE_OUTCOME_IGNORE;
    /* The client stopped a stream the provider was still sending (a short write: the reply
     * cap, an SSE bound, an event it could not read, no memory): the provider may still be
     * generating, so the call ends abandoned, as a cancelled one does, and the pool decides
     * whether its permit lingers. An error event is the provider's own end. */
    if (c->body_mode == SLUICE__CHAT_BODY_SSE && c->result.curl_code == CURLE_WRITE_ERROR &&
        !c->st.error_event)
        c->result.abandoned = true;
    return status;
}

/* A streamed answer's sample is its time to first token; any other is the whole call. */
static bool sluice__chat_timed_first_token(const struct sluice_chat *c)
{
    return c->body_mode == SLUICE__CHAT_BODY_SSE && c->st.first_event_ns;
}

/* The start deadline's test (sluice_curl_call.begun): a stream has begun at its first event,
 * not at the headers and comments a provider may send before it; any other answer at its
 * first byte. */
static bool sluice__chat_begun(void *data)
{
    const struct sluice_chat *c = (const struct sluice_chat *)data;
    return c->body_mode == SLUICE__CHAT_BODY_SSE ? c->st.first_event_ns != 0
                                                 : c->body_mode != SLUICE__CHAT_BODY_UNDECIDED;
}

static int sluice__chat_generate(void *ctx, struct sluice_generation *gen)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    if (gen->attempt > 0 && sluice__chat_extend(c) != SLUICE_OK)
        return SLUICE_ENOMEM;
    int status = sluice__chat_prepare(c, gen->endpoint);
    if (status != SLUICE_OK)
        return status;
    struct sluice_curl_call call = {.easy = c->easy,
                                    .deadline = gen->deadline,
                                    .start_deadline = gen->start_deadline,
                                    .begun = sluice__chat_begun,
                                    .begun_data = c,
                                    .cancel = gen->cancel,
                                    .retry_after_max_ns = c->retry_after_max_ns,
                                    .dialect = c->dialect,
                                    .write = sluice__chat_body, /* error bodies are classified */
                                    .write_data = c};
    status = sluice__chat_conclude(c, sluice_curl_transfer(&call, &c->result));
    gen->outcome = c->result.outcome;
    gen->abandoned = c->result.abandoned;
    gen->retry_after_ns = c->result.hold_ns;
    gen->expired = c->result.expired;
    gen->stated_rate = sluice_curl_stated_rate(&c->result); /* as the loop offers it */
    if (sluice__chat_timed_first_token(c))
        gen->latency_ns = c->result.latency_ns;
    return status;
}

/* ---- on the curl loop -------------------------------------------------------------- */

/* The loop's finish hook: the same conclusion as sluice_run's, before discovery's sample. */
static void sluice__chat_loop_finish(void *data, CURL *easy, struct sluice_curl_result *res)
{
    (void)easy;
    struct sluice_chat *c = (struct sluice_chat *)data;
    c->result = *res;
    c->loop_status = sluice__chat_conclude(c, res->status);
    c->loop_finished = true;
    c->result.status = c->loop_status;
    *res = c->result;
}

/* The loop's cut: the finish hook concluded the generation just before, as for any end. */
static void sluice__chat_loop_cut(const struct sluice_curl_result *res, void *data)
{
    struct sluice_chat *c = (struct sluice_chat *)data;
    int status = c->loop_finished ? c->loop_status : res->status;
    c->loop_finished = false;
    c->loop_was_cut = true;
    c->loop_cut(c, status, c->loop_data);
}

static void sluice__chat_loop_done(const struct sluice_curl_result *res, CURL *easy, void *data)
{
    (void)easy;
    struct sluice_chat *c = (struct sluice_chat *)data;
    if (c->loop_was_cut) { /* read on to its end: the result stays what the caller was told */
        c->loop_was_cut = false;
        c->loop_done(c, res->status, c->loop_data);
        return;
    }
    if (!c->loop_finished) /* it never transferred: the loop's status is the answer */
        c->result = *res;
    int status = c->loop_finished ? c->loop_status : res->status;
    c->loop_finished = false;
    c->loop_done(c, status, c->loop_data);
}

int sluice_chat_submit(struct sluice_curl_loop *loop, struct sluice_chat *c,
                       const struct sluice_chat_request *req, uint64_t *id)
{
    if (!loop || !c || !req || !req->done)
        return SLUICE_EINVAL;
    sluice__curl_result_init(&c->result);
    /* Looked up before the URL: a misspelt ID is the mistake to name, not the missing URL
     * that an unknown backend's absent endpoint would otherwise report. */
    const struct sluice_engine *engine = sluice_curl_loop_engine(loop);
    int status = sluice__curl_check_backend(engine, req->backend, &c->result);
    if (status != SLUICE_OK)
        return c->result.status = status;
    const struct sluice_backend *b = sluice_engine_find(engine, req->backend);
    const char *endpoint = req->endpoint ? req->endpoint : b->endpoint;
    status = sluice__chat_prepare(c, endpoint);
    if (status != SLUICE_OK)
        return status;
    c->loop_done = req->done;
    c->loop_cut = req->cut;
    c->loop_data = req->data;
    c->loop_finished = false;
    c->loop_was_cut = false;
    status = sluice__curl_loop_submit(loop,
                                    &(struct sluice_curl_request){
                                        .backend = req->backend,
                                        .easy = c->easy,
                                        .deadline = req->deadline,
                                        .start_deadline = req->start_deadline,
                                        .begun = sluice__chat_begun,
                                        .cancel = req->cancel,
                                        .done = sluice__chat_loop_done,
                                        .data = c,
                                        .retry_after_max_ns = c->retry_after_max_ns,
                                        .dialect = c->dialect,
                                        .write = sluice__chat_body, /* as sluice_run's */
                                        .write_data = c,
                                        .finish = sluice__chat_loop_finish,
                                        .cut = req->cut ? sluice__chat_loop_cut : NULL,
                                    },
                                    id, &c->result.expired);
    /* Refused: `done` never runs, so the result says so itself, not the last call's. */
    if (status != SLUICE_OK) {
        c->result.status = status;
        if (status == SLUICE_ELATE)
            sluice__curl_explain_late(&c->result);
        else
            snprintf(c->result.error, sizeof c->result.error, "not submitted: %s",
                     sluice_strerror(status));
    }
    return status;
}

static int sluice__chat_validate(void *ctx, unsigned attempt, bool *repair)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    return c->validate ? c->validate(c->validate_ctx, c, attempt, repair) : SLUICE_OK;
}

const struct sluice_run_ops sluice_chat_ops = {
    .prepare = NULL,
    .generate = sluice__chat_generate,
    .validate = sluice__chat_validate,
};
