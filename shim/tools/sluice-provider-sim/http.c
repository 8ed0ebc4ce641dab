/*
 * http.c — the HTTP side: libmicrohttpd's callbacks, the routes (a chat
 * call's answer: plain, in a dialect or streamed) and the /stats counters.
 */
#define _GNU_SOURCE
#include "sim.h"

/* The Retry-After value for a 429, or NULL when none is configured. */
static const char *retry_after_value(const struct server *sv, char *buf, size_t n)
{
    if (!(sv->model.retry_after_s > 0))
        return NULL;
    if (!sv->retry_after_date) {
        snprintf(buf, n, "%.0f", sv->model.retry_after_s);
        return buf;
    }
    time_t at = time(NULL) + (time_t)sv->model.retry_after_s;
    struct tm tm;
    gmtime_r(&at, &tm);
    strftime(buf, n, "%a, %d %b %Y %H:%M:%S GMT", &tm); /* IMF-fixdate; the C locale */
    return buf;
}


static enum MHD_Result answer_chat(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    int status;
    if (r->too_large) {
        pthread_mutex_lock(&sv->lock);
        sv->total.requests++;
        sv->total.by_status[413]++;
        pthread_mutex_unlock(&sv->lock);
        return respond_json(conn, 413, error_body("request body over 1 MiB", "invalid_request_error",
                                                  "request_too_large"), NULL);
    }
    if (sv->dialect.id != DIALECT_NONE && in_signal_span(sv))
        return answer_signal(sv, conn);
    if (sv->stream.on && !r->stream && request_streams(r)) {
        r->stream = calloc(1, sizeof *r->stream);
        if (!r->stream)
            return MHD_NO;
    }
    status = arrive(sv, r);
    if (status == 0)
        status = wait_for_answer(sv, conn, r);
    if (status < 0) { /* on_completed counts it and frees the slot */
        mhd_no_on_purpose = true;
        return MHD_NO;
    }
    if (sv->dialect.id != DIALECT_NONE && (status == 200 || status == 429))
        return answer_in_dialect(sv, conn, r, status);
    if (status == 429) {
        char ra[64];
        return respond_json(conn, 429,
                            error_body(sv->model.mode == SIM_RATE
                                           ? "the provider's rate limit is reached"
                                           : "the provider's concurrency cap is reached",
                                       "rate_limit_error", "rate_limit_exceeded"),
                            retry_after_value(sv, ra, sizeof ra));
    }
    if (status == 503 && r->queued_ns) /* it was queued: it waited past --queue-timeout */
        return respond_json(conn, 503, error_body("the call waited in the provider's queue past "
                                                  "its timeout", "server_error", "queue_timeout"),
                            NULL);
    if (status == 503)
        return respond_json(conn, 503, error_body("the provider's queue is full", "server_error",
                                                  "overloaded"), NULL);
    if (r->stream)
        return respond_stream(sv, conn, r);
    return respond_json(conn, 200, completion_body(r), NULL);
}

/* ---- stats ----------------------------------------------------------------------- */

/*
 * {"uptime_ms":N, "mode":"reject", "abandoned":"hold", "cap":N, "in_flight":N,
 *  "in_service":N, "lingering":N, "queued":N, "peak_in_flight":N,
 *  "peak_in_service":N, "requests":N, "cancelled":N, "queue_timeouts":N,
 *  "by_status":{"200":N, "429":N, "503":N, ...}}
 * in_service counts the slots taken, lingering calls included: what the cap
 * sees. lingering = calls whose client hung up mid-call but which keep their
 * slot until their service time ends (--abandoned hold); they were counted
 * in cancelled when the client left. in_flight = calls a client still waits
 * on = in_service − lingering + queued. requests counts chat calls that
 * reached the provider: requests = sum(by_status) + cancelled + in_flight
 * (until a reset). queue_timeouts counts the 503s of calls that waited
 * --queue-timeout (they are in by_status["503"] too). by_status always has
 * "200", "429" and "503"; other codes (413) appear once seen.
 * "stream": {"started", "completed", "failed", "cut", "tokens"} counts
 * streamed answers (struct stream_counters); a streamed call is in
 * by_status["200"] once it completed or failed with its error event (its
 * HTTP status was 200), in cancelled when its client hung up.
 */
static json_t *stream_stats_json(const struct stream_counters *c)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I}", "started", (json_int_t)c->started, "completed",
                     (json_int_t)c->completed, "failed", (json_int_t)c->failed, "cut",
                     (json_int_t)c->cut, "tokens", (json_int_t)c->tokens);
}

static json_t *stats_json(struct server *sv)
{
    pthread_mutex_lock(&sv->lock);
    struct counters c = sv->total;
    struct sim_provider m = sv->model;
    uint32_t in_service = sv->in_service, waiting = sv->waiting, lingering = sv->lingering;
    uint32_t flying = in_flight(sv);
    uint32_t peak = sv->peak_in_flight, peak_service = sv->peak_in_service;
    pthread_mutex_unlock(&sv->lock);
    json_t *by = json_object();
    for (unsigned s = 100; s < 600; s++)
        if (c.by_status[s] || s == 200 || s == 429 || s == 503) {
            char key[8];
            snprintf(key, sizeof key, "%u", s);
            json_object_set_new(by, key, json_integer((json_int_t)c.by_status[s]));
        }
    json_t *stats = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
                     "uptime_ms", (json_int_t)((sim_clock_ns() - sv->t0_ns) / 1000000), "mode",
                     sim_mode_name(m.mode), "abandoned",
                     sv->abandoned == ABANDONED_HOLD ? "hold" : "free", "cap", (json_int_t)m.cap,
                     "in_flight", (json_int_t)flying, "in_service", (json_int_t)in_service,
                     "lingering", (json_int_t)lingering, "queued", (json_int_t)waiting,
                     "peak_in_flight", (json_int_t)peak, "peak_in_service", (json_int_t)peak_service,
                     "requests", (json_int_t)c.requests, "cancelled", (json_int_t)c.cancelled,
                     "queue_timeouts", (json_int_t)c.queue_timeouts, "by_status", by);
    json_object_set_new(stats, "stream", stream_stats_json(&c.stream));
    return stats;
}

static void stats_reset(struct server *sv)
{
    pthread_mutex_lock(&sv->lock);
    memset(&sv->total, 0, sizeof sv->total);
    sv->peak_in_flight = sv->peak_in_service = 0;
    note_peaks(sv);
    pthread_mutex_unlock(&sv->lock);
}

/* ---- libmicrohttpd callbacks ------------------------------------------------------ */

enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    struct server *sv = cls;
    struct req *r = *con_cls;
    if (!r) { /* headers are in; the body (if any) comes in the next calls */
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->wake_fd = -1;
        r->is_chat = !strcmp(url, CHAT_PATH) && !strcmp(method, MHD_HTTP_METHOD_POST);
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (!r->is_chat || r->too_large)
            return MHD_YES;
        if (r->body_len + n > MAX_BODY) {
            r->too_large = true;
            return MHD_YES;
        }
        char *grown = realloc(r->body, r->body_len + n);
        if (!grown)
            return MHD_NO;
        memcpy(grown + r->body_len, upload, n);
        r->body = grown;
        r->body_len += n;
        return MHD_YES;
    }
    if (r->is_chat)
        return answer_chat(sv, conn, r);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!strcmp(url, "/stats") && get)
        return respond_json(conn, 200, stats_json(sv), NULL);
    if (!strcmp(url, "/stats/reset") && post) {
        stats_reset(sv);
        return respond_json(conn, 200, stats_json(sv), NULL);
    }
    if (!strcmp(url, "/stats") || !strcmp(url, "/stats/reset") || !strcmp(url, CHAT_PATH))
        return respond_json(conn, 405, error_body("method not allowed here", "invalid_request_error",
                                                  "method_not_allowed"), NULL);
    return respond_json(conn, 404, error_body("no such endpoint", "invalid_request_error",
                                              "not_found"), NULL);
}

/* Every request ends here, answered or not (MHD_REQUEST_TERMINATED_*): a call
 * that still holds a slot or a FIFO place lost its client (or the server is
 * stopping), so it is counted as cancelled and its place given back. */
void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    struct server *sv = cls;
    struct req *r = *con_cls;
    if (!r)
        return;
    pthread_mutex_lock(&sv->lock);
    if (r->stream && r->state == REQ_SERVING) /* seen between tokens, or by a failed write */
        sv->total.stream.cut++;
    if (r->state == REQ_WAITING || r->state == REQ_SERVING)
        cancel_call(sv, r);
    pthread_mutex_unlock(&sv->lock);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    free(r->body);
    free(r->stream);
    free(r);
    *con_cls = NULL;
}

