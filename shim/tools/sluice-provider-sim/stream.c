/*
 * stream.c — answers as server-sent events (--stream): a chunk per token,
 * the last chunk, usage and [DONE], or an error event (see main.c,
 * "Streaming").
 */
#define _GNU_SOURCE
#include "sim.h"

/* ---- streaming (--stream) ---------------------------------------------------------- */

/* The request body asks for a streamed answer ("stream": true). */
bool request_streams(const struct req *r)
{
    json_t *root = r->body_len ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
    bool yes = json_is_true(json_object_get(root, "stream"));
    json_decref(root);
    return yes;
}

/* Under lock: the answer's length, from the --answer-tokens distribution. */
static uint32_t draw_answer_tokens(struct server *sv)
{
    double n = sim_lognormal(&sv->rng, sv->stream.answer_tokens, sv->stream.answer_sigma) + 0.5;
    return n < 1 ? 1 : n > MAX_ANSWER_TOKENS ? MAX_ANSWER_TOKENS : (uint32_t)n;
}

enum stream_wake { STREAM_DUE, STREAM_HUNG_UP, STREAM_STOPPING };

/* Sleep until `at`, watching the client's socket and the stop eventfd. */
static enum stream_wake stream_wait(struct server *sv, const struct stream *st, int64_t at)
{
    struct pollfd fds[2] = {{.fd = st->fd, .events = POLLRDHUP}, {.fd = sv->stop_fd, .events = POLLIN}};
    for (;;) {
        int64_t left = at - sim_clock_ns();
        struct timespec ts = {(time_t)(left > 0 ? left / NS_PER_S : 0),
                              (long)(left > 0 ? left % NS_PER_S : 0)};
        int n = ppoll(fds, 2, &ts, NULL); /* a zero timeout still reports a hang-up */
        if (n < 0 && errno != EINTR)
            return STREAM_HUNG_UP;
        if (n > 0)
            return fds[1].revents ? STREAM_STOPPING : STREAM_HUNG_UP;
        if (n == 0 && left <= 0)
            return STREAM_DUE;
    }
}

/* One chat.completion.chunk event (`delta` and `finish` are JSON) into buf; its length. */
static ssize_t stream_chunk(const struct req *r, char *buf, size_t max, const char *delta,
                            const char *finish, const char *more)
{
    int n = snprintf(buf, max,
                     "data: {\"id\":\"chatcmpl-sim-%" PRIu64 "\",\"object\":\"chat.completion."
                     "chunk\",\"created\":%lld,\"model\":%s,\"choices\":[{\"index\":0,\"delta\":%s,"
                     "\"finish_reason\":%s}]%s}\n\n",
                     r->id, (long long)time(NULL), r->stream->model_json, delta, finish, more);
    return n < 0 || (size_t)n >= max ? MHD_CONTENT_READER_END_WITH_ERROR : (ssize_t)n;
}

/* The next token's chunk: token_bytes letters (the first one carries the role). */
static ssize_t stream_token(struct server *sv, const struct req *r, char *buf, size_t max)
{
    static const char head[] = "{\"role\":\"assistant\",\"content\":\"";
    char delta[MAX_TOKEN_BYTES + sizeof head + 4];
    const struct stream *st = r->stream;
    size_t at = r->stream->sent ? (size_t)snprintf(delta, sizeof delta, "{\"content\":\"")
                                : (size_t)snprintf(delta, sizeof delta, "%s", head);
    if (sv->stream.stamp) /* the check above keeps token_bytes >= 20 digits */
        snprintf(delta + at, sv->stream.token_bytes + 1, "%0*" PRId64,
                 (int)sv->stream.token_bytes, sim_clock_ns());
    else
        memset(delta + at, 'a' + (int)(st->sent % 26), sv->stream.token_bytes);
    snprintf(delta + at + sv->stream.token_bytes, 3, "\"}");
    return stream_chunk(r, buf, max, delta, "null", "");
}

/* The last events: finish_reason "stop", `usage`, [DONE]. */
static ssize_t stream_last(const struct req *r, char *buf, size_t max)
{
    ssize_t n = stream_chunk(r, buf, max, "{}", "\"stop\"", "");
    char usage[160];
    json_int_t prompt = (json_int_t)(r->body_len + 3) / 4, completion = r->stream->sent;
    snprintf(usage, sizeof usage,
             ",\"usage\":{\"prompt_tokens\":%" JSON_INTEGER_FORMAT ",\"completion_tokens\":%"
             JSON_INTEGER_FORMAT ",\"total_tokens\":%" JSON_INTEGER_FORMAT "}",
             prompt, completion, prompt + completion);
    ssize_t u = n < 0 ? n : stream_chunk(r, buf + n, max - (size_t)n, "{}", "null", usage);
    static const char done[] = "data: [DONE]\n\n";
    if (u < 0 || (size_t)(n + u) + sizeof done > max)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    memcpy(buf + n + u, done, sizeof done - 1);
    return n + u + (ssize_t)sizeof done - 1;
}

/* The error event OpenRouter sends when a call fails mid-stream. */
static ssize_t stream_error(const struct req *r, char *buf, size_t max)
{
    return stream_chunk(r, buf, max, "{\"content\":\"\"}", "\"error\"",
                        ",\"error\":{\"code\":429,\"message\":\"the provider's concurrency cap "
                        "is reached mid-stream\"}");
}

/* The stream ended as planned (completed, or failed with its error event). */
static void stream_end(struct server *sv, struct req *r, bool failed)
{
    pthread_mutex_lock(&sv->lock);
    if (failed)
        sv->total.stream.failed++;
    else
        sv->total.stream.completed++;
    if (r->state == REQ_SERVING)
        finish_service(sv, r); /* HTTP 200 went out: counted there */
    pthread_mutex_unlock(&sv->lock);
    r->stream->over = true;
}

/* The client hung up mid-stream: with --abandoned hold the slot is kept until the stream's
 * planned end. on_completed then counts the cut and gives the slot back. */
static ssize_t stream_cut(struct server *sv, struct req *r)
{
    bool hold = false;
    pthread_mutex_lock(&sv->lock);
    if (r->state == REQ_SERVING && sv->abandoned == ABANDONED_HOLD && !sv->stream.endless) {
        abandon_call(sv, r);
        hold = true;
    }
    pthread_mutex_unlock(&sv->lock);
    if (hold) {
        struct stream quiet = *r->stream;
        quiet.fd = -1; /* only the stop eventfd ends the wait */
        (void)stream_wait(sv, &quiet, r->stream->end_ns);
    }
    mhd_no_on_purpose = true;
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* After the last event (its slot is free already): the body's end, --stream-end-ms later, as
 * a provider's last packet can come apart from its [DONE]. A client that hangs up in between
 * had the whole answer: nothing to count. */
static ssize_t stream_end_of_body(struct server *sv, const struct stream *st)
{
    if (sv->stream.end_ms > 0 &&
        stream_wait(sv, st, sim_clock_ns() + (int64_t)(sv->stream.end_ms * 1e6)) != STREAM_DUE) {
        mhd_no_on_purpose = true;
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* MHD's content reader for a streamed answer: blocks its connection thread until the next
 * event is due (MHD_USE_THREAD_PER_CONNECTION allows it), then returns that event. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct server *sv = &server;
    struct req *r = cls;
    struct stream *st = r->stream;
    if (st->over)
        return stream_end_of_body(sv, st);
    if (!st->began) {
        static const char comment[] = ": sluice-provider-sim processing\n\n";
        st->began = true;
        memcpy(buf, comment, sizeof comment - 1); /* max is STREAM_BLOCK, never less */
        return (ssize_t)sizeof comment - 1;
    }
    enum stream_wake wake = stream_wait(sv, st, st->next_ns);
    if (wake == STREAM_HUNG_UP)
        return stream_cut(sv, r);
    if (wake == STREAM_STOPPING) {
        mhd_no_on_purpose = true;
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    st->next_ns += (int64_t)(sv->stream.token_ms * 1e6);
    if (sv->stream.fail_set && st->sent == sv->stream.fail_after) {
        ssize_t n = stream_error(r, buf, max);
        stream_end(sv, r, true);
        return n;
    }
    if (sv->stream.endless || st->sent < st->tokens) {
        ssize_t n = stream_token(sv, r, buf, max);
        st->sent++;
        pthread_mutex_lock(&sv->lock);
        sv->total.stream.tokens++;
        pthread_mutex_unlock(&sv->lock);
        return n;
    }
    ssize_t n = stream_last(r, buf, max);
    stream_end(sv, r, false);
    return n;
}

/* Answer a streamed call that has its slot: headers and the opening comment at once, then
 * the tokens from stream_read. */
enum MHD_Result respond_stream(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    struct stream *st = r->stream;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    char model[256];
    request_model(r, model, sizeof model);
    json_t *name = json_string(model);
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    snprintf(st->model_json, sizeof st->model_json, "%s", quoted ? quoted : "\"sluice-sim\"");
    free(quoted);
    json_decref(name);
    pthread_mutex_lock(&sv->lock);
    st->tokens = draw_answer_tokens(sv);
    st->next_ns = r->due_ns;
    st->end_ns = r->due_ns + (int64_t)(sv->stream.token_ms * 1e6) * st->tokens;
    sv->total.stream.started++;
    pthread_mutex_unlock(&sv->lock);
    struct MHD_Response *res =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r, NULL);
    if (!res)
        return MHD_NO;
    enum MHD_Result ok =
        MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    if (ok == MHD_YES)
        ok = MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (ok == MHD_YES)
        ok = add_dialect_headers(res);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, 200, res);
    MHD_destroy_response(res);
    return ok;
}

