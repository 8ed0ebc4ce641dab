/*
 * upstream.c — one request on the curl loop: the client's request goes to
 * its backend's upstream unchanged but for hop-by-hop headers (and the API
 * key, where the backend sets one), through the backend's sluice pool (a
 * request that only reads goes around it: only_reads); the
 * answer streams back as libcurl hands it over, and how the call ended
 * becomes what the client sees.
 *
 * Pass-through: the upstream's status line, headers and body go to the
 * client as they arrive, a 429 or 503 of the provider's own included, with
 * its Retry-After and rate-limit headers, less the hop-by-hop fields (each
 * way: the fixed ones below, and those a Connection header names, RFC 9110
 * 7.6.1). libcurl is not asked to decode anything (no
 * CURLOPT_ACCEPT_ENCODING), so the bytes are the provider's; a
 * Content-Length answer keeps its length, anything else is re-chunked.
 * The client's Accept-Encoding stays here too: the answer is read on the
 * way (below), and a compressed one would hide what it says (the OpenAI
 * Node SDK asks for gzip, and a gzipped insufficient_quota read as the cap).
 * A server-sent event leaves in the loop iteration whose read brought it.
 * An error answer's body (a 429's insufficient_quota, a 503's
 * overloaded_error) is read on the way by the curl loop for classification
 * (sluice_curl_request.write), so the pool and discovery hear a quota or a
 * platform overload as such and not as the cap's refusal.
 * The events of a 2xx stream are read on the way for an error event (a
 * provider that fails a call mid-stream cannot take its 200 back): the
 * client gets it as sent, and the pool, discovery and the access log hear
 * the call as the error it stands for (sluice_curl_classify_event, the
 * rule the chat client follows too).
 *
 * The proxy's own answers (nothing came from upstream yet) — the rows of
 * `refusals` below: not admitted (503, X-Sluice-Refused + Retry-After),
 * too late to be worth queueing (503), a deadline that expired before an
 * answer began (504, X-Sluice-Timeout saying where), an upstream that did
 * not answer (502 naming it). A failure after the status line went out
 * cannot change the status: the connection is closed instead, so the
 * client sees a cut answer rather than a complete-looking one.
 *
 * Back-pressure: past OUT_HIGH bytes unsent to a slow client the transfer
 * is paused (CURL_WRITEFUNC_PAUSE) until the client has read them all; a
 * client that reads nothing for client_timeout_ms loses its call (http.c).
 * The loop's reader of an error body passes the pause on, and libcurl hands
 * the paused bytes over again; the reader keeps a chunk only once on_write
 * has taken it, so classify reads each byte once.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <sluice/sse.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define OUT_HIGH (256 * 1024)
#define CONNECT_TIMEOUT_MS 10000L
/* Bytes of one event read for an error event: an error event is small (classify reads 4 KiB
 * of a body), a chunk with logprobs or a tool call's arguments a few KiB; a longer event is
 * passed on unread, and reading resumes after it. */
#define EVENT_MAX (64 * 1024)

/* Hop-by-hop (RFC 9110 §7.6.1) and what libcurl sets itself: never forwarded either way. */
static const char *const hop_by_hop[] = {
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authenticate", "proxy-authorization", "host", "content-length", "expect",
    PROXY_DEADLINE_HEADER, PROXY_START_DEADLINE_HEADER,
};

static bool is_hop_by_hop(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof hop_by_hop / sizeof hop_by_hop[0]; i++)
        if (http_header_is(name, len, hop_by_hop[i]))
            return true;
    return false;
}

/* Is `name` one of the comma-separated options of a Connection value (any case, optional white
 * space)? Such a field is for this hop only. */
static bool connection_lists(const char *v, size_t vl, const char *name, size_t nl)
{
    for (size_t i = 0; i < vl;) {
        while (i < vl && (v[i] == ',' || v[i] == ' ' || v[i] == '\t'))
            i++;
        size_t start = i;
        while (i < vl && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == nl && !strncasecmp(v + start, name, nl))
            return true;
    }
    return false;
}

/* Named by one of the request's Connection headers (there may be several). */
static bool request_connection_lists(const struct request *r, const char *name, size_t nl)
{
    for (size_t i = 0; i < r->n_h; i++)
        if (http_header_is(r->h[i].name, r->h[i].name_len, "connection") &&
            connection_lists(r->h[i].value, r->h[i].value_len, name, nl))
            return true;
    return false;
}

static bool is_key_header(const char *name, size_t len)
{
    return http_header_is(name, len, "authorization") || http_header_is(name, len, "x-api-key");
}

/* ---- the answer, as libcurl hands it over ---------------------------------------------------- */

/* A 2xx stream's events as they pass (conn.up_events): from its first body byte to its end. */
struct proxy_events {
    struct sluice_sse sse;
    bool error;                     /* an error event came */
    bool done;                      /* its last event came (answer_end): the answer is whole */
    struct sluice_curl_result said; /* what the first one said */
    char buf[EVENT_MAX];
};

/* The event after which a stream has nothing more to say: OpenAI's `data: [DONE]`, Anthropic's
 * `event: message_stop` (the Messages API sends no [DONE]). */
static bool answer_end(const struct sluice_sse_event *ev)
{
    return (ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6)) ||
           !strcmp(ev->type, "message_stop");
}

static int on_event(void *ctx, const struct sluice_sse_event *ev)
{
    struct conn *c = ctx;
    struct proxy_events *e = c->up_events;
    e->done = e->done || answer_end(ev);
    if (!e->error)
        e->error = sluice_curl_classify_event(ev->data, ev->data_len, c->backend->dialect,
                                              &e->said);
    return SLUICE_OK;
}

static void events_parse_anew(struct conn *c)
{
    sluice_sse_init(&c->up_events->sse,
                    &(struct sluice_sse_desc){.buf = c->up_events->buf, .size = EVENT_MAX,
                                              .on_event = on_event, .ctx = c});
}

/* Read the body's bytes for an error event, if it is a 2xx stream. Without memory the call is
 * still served, unread. */
static void read_events(struct conn *c, const char *data, size_t len)
{
    if (!c->up_sse || c->up_status < 200 || c->up_status > 299)
        return;
    if (!c->up_events) {
        if (!(c->up_events = malloc(sizeof *c->up_events)))
            return;
        c->up_events->error = c->up_events->done = false;
        events_parse_anew(c);
    }
    if (sluice_sse_feed(&c->up_events->sse, data, len) != SLUICE_OK)
        events_parse_anew(c); /* an event past EVENT_MAX: what follows its end is read */
}

/* Before the pool and discovery hear the call: a stream that ended in an error event was that
 * error, whatever its status line said (the status the client got stays in up_status). One
 * whose last event ([DONE], message_stop: answer_end) came was a success however its transfer
 * ended: the OpenAI and Anthropic SDKs may hang up at that event, often before the body's last
 * chunk (a packet of its own) arrives, and a provider may hold its connection after it;
 * neither is an abandoned call whose permit lingers, a deadline or a silent upstream, and the
 * client that is still there gets the answer's end. */
static void on_finish(void *data, CURL *easy, struct sluice_curl_result *r)
{
    (void)easy;
    const struct conn *c = data;
    const struct proxy_events *e = c->up_events;
    if (e && !e->error && e->done && r->status != SLUICE_OK) {
        r->status = SLUICE_OK;
        r->abandoned = false;
        r->kind = SLUICE_CURL_SUCCESS;
        r->outcome = sluice_curl_kind_outcome(SLUICE_CURL_SUCCESS);
        r->error[0] = '\0';
        return;
    }
    if (c->up_silent_ns && r->status == SLUICE_ECANCELED) {
        /* upstream_sweep's cut goes through the loop's cancel, but it is no client's: the
         * provider timed out, as libcurl's own timeout would have said (sluice/curl.h's map),
         * and the pool and discovery count it so. */
        r->status = SLUICE_EIO;
        r->abandoned = false;
        r->kind = SLUICE_CURL_PROVIDER_TIMEOUT;
        r->outcome = sluice_curl_kind_outcome(SLUICE_CURL_PROVIDER_TIMEOUT);
        r->curl_code = CURLE_OPERATION_TIMEDOUT;
        if (!r->latency_ns) /* no first byte: the whole transfer, as for a timeout libcurl's */
            r->latency_ns = r->transfer_ns;
        snprintf(r->error, sizeof r->error, "the upstream sent nothing for %" PRId64 " ms",
                 c->up_silent_ns / 1000000);
    }
    if (!e || !e->error)
        return;
    r->kind = e->said.kind;
    r->outcome = e->said.outcome;
    r->retry_after_ns = e->said.retry_after_ns;
    r->hold_ns = e->said.hold_ns;
}

static struct patience *backend_patience(const struct conn *c)
{
    return &c->p->patience[c->backend - c->p->o->backends];
}

/* The head (and what the answer held back) goes out: from now on a failure can only cut it. */
static void emit_head(struct conn *c)
{
    buf_put(&c->out, c->up_head.p, c->up_head.len);
    c->up_head.len = 0;
    c->head_sent = true;
    c->t_first_ns = proxy_now_ns();
    if (!c->reads)
        patience_answered(backend_patience(c), c->t_first_ns - c->t_start_ns);
    http_mark_dirty(c);
}

/* The header line at *pos of a head whose lines each end in CRLF (the status line is skipped
 * when *pos is 0): its bytes, CRLF included, [*line, *line + *len), and its name's length in
 * *nl (0: no colon). *pos moves past it; false at the end. */
static bool head_field(const struct buf *h, size_t *pos, const char **line, size_t *len,
                       size_t *nl)
{
    if (*pos == 0) {
        const char *eol = memmem(h->p, h->len, "\r\n", 2);
        *pos = eol ? (size_t)(eol + 2 - h->p) : h->len;
    }
    if (*pos >= h->len)
        return false;
    *line = h->p + *pos;
    const char *eol = memmem(*line, h->len - *pos, "\r\n", 2);
    *len = eol ? (size_t)(eol + 2 - *line) : h->len - *pos;
    const char *colon = memchr(*line, ':', *len);
    *nl = colon ? (size_t)(colon - *line) : 0;
    *pos += *len;
    return true;
}

/* The upstream's head less its Connection headers and the fields they name. A Content-Length
 * named there goes too, and the answer is re-chunked. */
static void drop_connection_fields(struct conn *c)
{
    struct buf *head = &c->up_head, listed = {0}, kept = {0};
    const char *line;
    size_t pos = 0, len, nl;
    bool ok = true, any = false;
    while (head_field(head, &pos, &line, &len, &nl))
        if (http_header_is(line, nl, "connection")) {
            any = true; /* its value, without the CRLF, after a comma */
            ok = ok && buf_put(&listed, ",", 1) && buf_put(&listed, line + nl + 1, len - nl - 3);
        }
    if (!any)
        return;
    pos = (size_t)((const char *)memmem(head->p, head->len, "\r\n", 2) + 2 - head->p);
    ok = ok && buf_put(&kept, head->p, pos);
    bool length_dropped = false;
    while (ok && head_field(head, &pos, &line, &len, &nl)) {
        bool drop = http_header_is(line, nl, "connection") ||
                    (nl && connection_lists(listed.p, listed.len, line, nl));
        length_dropped = length_dropped || (drop && http_header_is(line, nl, "content-length"));
        ok = drop || buf_put(&kept, line, len);
    }
    free(listed.p);
    if (!ok) { /* out of memory: the head goes as it came */
        free(kept.p);
        return;
    }
    free(head->p);
    *head = kept;
    c->up_has_length = c->up_has_length && !length_dropped;
}

/* With a start deadline the head is held until the answer has begun, so that a provider that
 * sends its headers (and SSE comments) at once and its first token too late still gets a 504
 * rather than a 200 cut short. */
static void start_answer(struct conn *c)
{
    drop_connection_fields(c);
    const char *m = c->req.method;
    c->no_body = (c->req.method_len == 4 && !strncmp(m, "HEAD", 4)) || c->up_status == 204 ||
                 c->up_status == 304;
    /* An HTTP/1.0 client knows no chunking: its answer runs to the close (RFC 9112 6.3). */
    c->chunked = !c->no_body && !c->up_has_length && c->req.minor >= 1;
    if (c->chunked)
        buf_printf(&c->up_head, "Transfer-Encoding: chunked\r\n");
    if (c->closing)
        buf_printf(&c->up_head, "Connection: close\r\n");
    buf_put(&c->up_head, "\r\n", 2);
    c->head_ready = true;
    if (!c->hold_head)
        emit_head(c);
}

/* Has the answer begun with these bytes: any byte, or for server-sent events a `data:` line
 * (comments such as ": processing" are keep-alives, not the first token). */
static bool begins(const struct conn *c, const char *data, size_t len)
{
    return !c->up_sse || memmem(data, len, "data:", 5) != NULL;
}

static bool began(void *data)
{
    return ((struct conn *)data)->begun;
}

/* A header field's value, v to end, without the white space around it, into out (what fits). */
static void header_value(const char *v, const char *end, char *out, size_t size)
{
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    snprintf(out, size, "%.*s", (int)(end - v), v);
}

static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    struct conn *c = ud;
    size_t len = size * n, line = len;
    c->up_last_ns = proxy_now_ns();
    while (line && (data[line - 1] == '\n' || data[line - 1] == '\r'))
        line--;
    if (c->gone || c->head_ready)
        return len; /* trailers, or a call whose client left */
    if (len >= 5 && !memcmp(data, "HTTP/", 5)) {
        const char *sp = memchr(data, ' ', line);
        c->up_status = sp ? strtol(sp + 1, NULL, 10) : 0;
        c->up_has_length = c->up_sse = false;
        c->up_head.len = 0;
        c->request_id[0] = '\0';
        const char *reason = sp && (size_t)(sp + 4 - data) < line ? sp + 5 : NULL;
        if (reason && reason < data + line)
            buf_printf(&c->up_head, "HTTP/1.1 %ld %.*s\r\n", c->up_status,
                       (int)(data + line - reason), reason);
        else
            buf_printf(&c->up_head, "HTTP/1.1 %ld %s\r\n", c->up_status,
                       http_reason((int)c->up_status));
        return len;
    }
    if (line == 0) { /* the end of a head: an interim 1xx one is not forwarded */
        if (c->up_status >= 200)
            start_answer(c);
        return len;
    }
    const char *colon = memchr(data, ':', line);
    if (!colon)
        return len;
    size_t name_len = (size_t)(colon - data);
    if (!c->request_id[0] && (http_header_is(data, name_len, "x-request-id") ||
                              http_header_is(data, name_len, "request-id")))
        header_value(colon + 1, data + line, c->request_id, sizeof c->request_id);
    if (http_header_is(data, name_len, "content-type"))
        c->up_sse = memmem(colon, line - name_len, "text/event-stream", 17) != NULL;
    if (http_header_is(data, name_len, "content-length"))
        c->up_has_length = true;
    else if (is_hop_by_hop(data, name_len) && !http_header_is(data, name_len, "connection"))
        return len; /* Connection stays until the head is whole: it may name a field before it */
    buf_put(&c->up_head, data, line);
    buf_put(&c->up_head, "\r\n", 2);
    return len;
}

static size_t on_write(char *data, size_t size, size_t n, void *ud)
{
    struct conn *c = ud;
    size_t len = size * n;
    c->up_last_ns = proxy_now_ns();
    if (c->read_on) /* dropped, but an error event in it is still what the pool hears */
        read_events(c, data, len);
    if (c->gone || c->no_body || !len)
        return len;
    if (c->out.len - c->out_off > OUT_HIGH) {
        if (!c->paused) /* a client that reads nothing for this long loses its call */
            c->deadline_ns = proxy_now_ns() + (int64_t)c->p->o->client_timeout_ms * 1000000;
        c->paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    c->begun = c->begun || begins(c, data, len);
    read_events(c, data, len);
    struct buf *to = c->head_sent ? &c->out : &c->up_head; /* held with the head */
    if (c->chunked)
        buf_printf(to, "%zx\r\n", len);
    buf_put(to, data, len);
    if (c->chunked)
        buf_put(to, "\r\n", 2);
    c->bytes_out += len;
    if (!c->head_sent && c->begun)
        emit_head(c);
    http_mark_dirty(c);
    return len;
}

void upstream_resume(struct conn *c)
{
    c->paused = false;
    if (c->in_call && c->up_last_ns)
        c->up_last_ns = proxy_now_ns(); /* the client's slowness is not the upstream's silence */
    if (c->in_call)
        curl_easy_pause(c->easy, CURLPAUSE_CONT);
}

/* The request is about to go out on its connection: the upstream's silence counts from here,
 * not from the queue (a permit may be long in coming) or the connect (CONNECT_TIMEOUT_MS). */
static int on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    (void)conn_primary_ip, (void)conn_local_ip, (void)conn_primary_port, (void)conn_local_port;
    ((struct conn *)ud)->up_last_ns = proxy_now_ns();
    return CURL_PREREQFUNC_OK;
}

/* A request body still going up is the upstream taking it, not its silence: a large body to a
 * slow upstream may take longer than --upstream-idle-ms while its bytes move. (The body goes
 * as CURLOPT_POSTFIELDS, through no read callback; the loop sets no progress callback.) */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal;
    struct conn *c = ud;
    if (ulnow != c->up_sent) {
        c->up_sent = ulnow;
        c->up_last_ns = proxy_now_ns();
    }
    return 0;
}

/*
 * From the sweep (main.c, every SWEEP_MS): a transfer whose upstream has sent nothing for
 * --upstream-idle-ms is cut, so within a sweep of the setting. libcurl's low-speed limit cannot
 * say this: it counts whole seconds and averages the speed over several, and cut 1000 ms of
 * silence after 3 s, 2000 ms mid-stream after 8. The cut is the loop's cancel; on_finish
 * makes it the provider timeout it is.
 */
void upstream_sweep(struct conn *c, int64_t now)
{
    int64_t silent = now - c->up_last_ns;
    if (!c->in_call || c->paused || !c->up_last_ns || c->up_silent_ns ||
        silent < (int64_t)c->p->o->upstream_idle_ms * 1000000)
        return;
    c->up_silent_ns = silent;
    sluice_curl_loop_cancel(c->p->loop, c->call_id);
}

/* ---- how a call ended ----------------------------------------------------------------------- */

/*
 * The proxy's own answer for a status of the loop: one row per case, walked
 * by one loop (nginx's status table). `when` narrows a status: REFUSED_LATE
 * (the permit came with too little of the deadline left), TRANSFERRED (the
 * transfer started), ANY.
 */
enum when { ANY, START_EXPIRED, TRANSFERRED, REFUSED_LATE, WAITING };
static const struct refusal {
    int status;
    enum when when;
    int http;
    const char *code, *header, *message;
} refusals[] = {
    {SLUICE_ECAPACITY, ANY, 503, "capacity", "X-Sluice-Refused: capacity",
     "backend %s is at capacity (active + waiting calls); retry later"},
    {SLUICE_ELATE, ANY, 503, "late", "X-Sluice-Refused: late",
     "backend %s would start this call too late for its deadline; retry later or elsewhere"},
    {SLUICE_EAGAIN, ANY, 503, "busy", "X-Sluice-Refused: busy",
     "the proxy has too many calls in progress (backend %s); retry later"},
    {SLUICE_ECLOSED, ANY, 503, "shutting_down", "X-Sluice-Refused: shutting_down",
     "the proxy is shutting down (backend %s); retry on another instance"},
    {SLUICE_ETIMEDOUT, START_EXPIRED, 504, "deadline_start", "X-Sluice-Timeout: start",
     "backend %s did not start the call (its first token) before its start deadline"},
    {SLUICE_ETIMEDOUT, REFUSED_LATE, 504, "deadline_start", "X-Sluice-Timeout: start",
     "backend %s could not start the call before its deadline"},
    {SLUICE_ETIMEDOUT, TRANSFERRED, 504, "deadline_upstream", "X-Sluice-Timeout: upstream",
     "upstream of backend %s did not answer before the deadline"},
    {SLUICE_ETIMEDOUT, WAITING, 504, "deadline_queue", "X-Sluice-Timeout: queue",
     "the deadline expired while waiting for a slot of backend %s"},
};

static void refuse(struct conn *c, int status, const struct sluice_curl_result *r)
{
    enum when when = !r                                     ? ANY
                     : r->expired == SLUICE_EXPIRED_START ? START_EXPIRED
                     : r->refused_late                    ? REFUSED_LATE
                     : r->transferred                     ? TRANSFERRED
                                                          : WAITING;
    const char *id = c->backend->id;
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        const struct refusal *f = &refusals[i];
        if (f->status != status || (f->when != ANY && f->when != when))
            continue;
        char headers[160], message[256], learned[256] = "";
        if (f->http == 503)
            refusal_headers(c->p, f->header, headers, sizeof headers);
        else
            snprintf(headers, sizeof headers, "%s\r\n", f->header);
        snprintf(message, sizeof message, f->message, id);
        if (c->patience_ms >= 0 && (status == SLUICE_ELATE || status == SLUICE_ETIMEDOUT))
            snprintf(learned, sizeof learned,
                     " (the request named none: its start deadline was the %" PRId64
                     " ms after which this backend's clients have been hanging up; send "
                     PROXY_START_DEADLINE_HEADER " to choose one)",
                     c->patience_ms);
        http_error(c, f->http, f->http == 503 ? "server_error" : "timeout_error", f->code,
                   headers, "%s%s", message, learned);
        return;
    }
    char shown[1024];
    url_shown(c->backend->upstream, shown, sizeof shown);
    if (status == SLUICE_EIO && r && r->kind == SLUICE_CURL_PROVIDER_TIMEOUT)
        http_error(c, 502, "upstream_error", "upstream_silent", NULL,
                   "upstream %s (backend %s) sent nothing for %" PRId64 " ms: cut at "
                   "sluice-proxy --upstream-idle-ms %u",
                   shown, id, c->up_silent_ns / 1000000, c->p->o->upstream_idle_ms);
    else if (status == SLUICE_EIO && r && (c->up_errno == EMFILE || c->up_errno == ENFILE))
        http_error(c, 502, "upstream_error", "upstream_unreachable", NULL,
                   "upstream %s (backend %s) was not called: no file descriptor left for its "
                   "connection (%s); raise ulimit -n (LimitNOFILE= under systemd) or lower "
                   "--max-connections",
                   shown, id, strerror(c->up_errno));
    else if (status == SLUICE_EIO && r) {
        /* libcurl's own words where it kept some (which host, which TLS check), and the OS's
         * reason unless they say it already. */
        const char *why = c->up_error[0] ? c->up_error : curl_easy_strerror(r->curl_code);
        const char *os = c->up_errno ? strerror(c->up_errno) : NULL;
        bool said = os && strstr(why, os);
        bool untrusted = r->curl_code == CURLE_PEER_FAILED_VERIFICATION && !c->backend->ca_file;
        http_error(c, 502, "upstream_error", "upstream_unreachable", NULL,
                   "upstream %s (backend %s) did not answer: %s%s%s%s%s", shown, id, why,
                   os && !said ? " (" : "", os && !said ? os : "", os && !said ? ")" : "",
                   untrusted ? " (sluice-proxy --upstream-ca FILE trusts a private CA's "
                               "certificates)"
                             : "");
    }
    else
        http_error(c, 502, "upstream_error", "proxy_error", NULL, "backend %s: %s", id,
                   sluice_strerror(status));
}

/* A finished call's handle goes to the spares: an idle connection holds none. */
static void easy_give_back(struct proxy *p, CURL *easy)
{
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, NULL); /* the call's record may go first */
    if (p->n_spare < PROXY_SPARE_EASY)
        p->spare_easy[p->n_spare++] = easy;
    else
        curl_easy_cleanup(easy);
}

/* What is left of the learned patience for this request, which arrived at t_start_ns; -1 =
 * none learned. The whole of it goes to c->patience_ms, for a refusal to name. */
static int64_t learned_start_ms(struct conn *c)
{
    int64_t now = proxy_now_ns();
    c->patience_ms = patience_start_ms(backend_patience(c), c->backend->id, now);
    if (c->patience_ms < 0)
        return -1;
    int64_t ms = c->patience_ms - (now - c->t_start_ns) / 1000000;
    return ms > 0 ? ms : 0;
}

/* Off the proxy's reading_on list (upstream_client_gone). */
static void read_on_unlink(struct conn *c)
{
    if (c->read_on_prev)
        c->read_on_prev->read_on_next = c->read_on_next;
    else
        c->p->reading_on = c->read_on_next;
    if (c->read_on_next)
        c->read_on_next->read_on_prev = c->read_on_prev;
    c->read_on_prev = c->read_on_next = NULL;
    c->read_on_until_ns = 0;
}

/* libcurl keeps no errno when it cannot open a socket, and a 502 that only says "Couldn't
 * connect" sends the operator to the upstream: EMFILE or ENFILE when no descriptor is left
 * (asked by opening one), else 0. */
static int descriptors_gone(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    return errno == EMFILE || errno == ENFILE ? errno : 0;
}

/* What the client hears of a call that ended, or whose deadline passed (on_cut). */
static void answer_client(struct conn *c, const struct sluice_curl_result *r, bool error_event)
{
    if (r->status == SLUICE_OK && c->head_ready && !c->head_sent)
        emit_head(c); /* held for a start deadline, and the answer never said more */
    if (r->status == SLUICE_OK && c->head_sent) {
        if (c->chunked)
            buf_put(&c->out, "0\r\n\r\n", 5);
        c->status_out = (int)c->up_status;
        c->outcome = sluice_curl_kind_name(r->kind);
        http_request_done(c);
    } else if (c->head_sent) {
        /* The status is out: only a cut tells the client the answer is not whole. A stream
         * that broke off after an error event is logged as the error, as the pool heard it. */
        c->closing = true;
        c->status_out = (int)c->up_status;
        c->outcome = error_event                    ? sluice_curl_kind_name(r->kind)
                     : r->status == SLUICE_ETIMEDOUT ? "cut_deadline"
                     : r->status == SLUICE_ECLOSED   ? "cut_drain" /* --drain-ms ran out */
                     : c->up_silent_ns               ? "cut_upstream_silent" /* upstream_sweep */
                                                     : "cut_upstream";
        http_request_done(c);
    } else {
        refuse(c, r->status == SLUICE_OK ? SLUICE_EIO : r->status, r);
    }
}

/*
 * The request's deadline passed mid-transfer where the pool would keep the permit anyway (the
 * loop's `cut`, sluice/curl.h): the client is answered now as on_done would answer it (a 504,
 * or its stream cut), and the loop reads the upstream's answer on and drops it, so the permit
 * comes back when the provider is done, not when an estimate says. The connection closes after
 * this answer: its upstream half is busy until the loop's done, which then only tidies. A
 * client that left first was upstream_client_gone's, and on_done answers for it as before.
 */
static void on_cut(const struct sluice_curl_result *r, void *data)
{
    struct conn *c = data;
    if (c->gone)
        return;
    c->answered_at_cut = true;
    c->paused = false; /* the loop resumed the transfer: nobody waits for its bytes now */
    c->closing = true;
    answer_client(c, r, false);
}

static void on_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    struct conn *c = data;
    long os_errno = 0;
    if (r->status == SLUICE_EIO) /* refuse() names it; a call that ended otherwise has none */
        curl_easy_getinfo(easy, CURLINFO_OS_ERRNO, &os_errno);
    c->up_errno = os_errno ? (int)os_errno : r->status == SLUICE_EIO ? descriptors_gone() : 0;
    easy_give_back(c->p, easy);
    bool error_event = c->up_events && c->up_events->error; /* r says what it was (on_finish) */
    free(c->up_events);
    c->up_events = NULL;
    c->easy = NULL;
    c->in_call = false;
    c->paused = false;
    c->queued_ns = r->queued_ns;
    curl_slist_free_all(c->up_headers);
    c->up_headers = NULL;
    if (c->read_on_until_ns)
        read_on_unlink(c);
    if (c->answered_at_cut) {
        c->answered_at_cut = false;
        http_call_over(c);
        return;
    }
    if (c->gone) {
        int64_t now = proxy_now_ns();
        if (!c->head_sent && !c->reads) /* it gave up before any answer began: its patience */
            patience_hung_up(backend_patience(c), c->backend->id, now - c->t_start_ns, now);
        /* After its last event the answer was whole (on_finish): logged as the pool heard it. */
        c->outcome = c->head_sent && r->status == SLUICE_OK && !c->read_on
                         ? sluice_curl_kind_name(r->kind)
                         : "client_gone";
        c->status_out = c->head_sent ? (int)c->up_status : 499; /* nginx's "client closed" */
        http_request_done(c);
        return;
    }
    answer_client(c, r, error_event);
}

/* ---- the request, out ---------------------------------------------------------------------- */

static void add_header(struct conn *c, const char *name, size_t nl, const char *value, size_t vl)
{
    char line[8192];
    if (nl + vl + 3 > sizeof line)
        return; /* bounded by max_header_bytes in practice */
    /* "Name;" is libcurl's spelling of a header with an empty value ("Name:" removes it). */
    int n = vl ? snprintf(line, sizeof line, "%.*s: %.*s", (int)nl, name, (int)vl, value)
               : snprintf(line, sizeof line, "%.*s;", (int)nl, name);
    if (n > 0) {
        struct curl_slist *s = curl_slist_append(c->up_headers, line);
        if (s)
            c->up_headers = s;
    }
}

static void build_headers(struct conn *c, const struct backend *b, bool has_body)
{
    bool replace_key = b->key && !b->pass_client_key;
    bool has_type = false, has_accept = false;
    const struct request *r = &c->req;
    for (size_t i = 0; i < r->n_h; i++) {
        const char *name = r->h[i].name;
        size_t nl = r->h[i].name_len;
        if (is_hop_by_hop(name, nl) || request_connection_lists(r, name, nl) ||
            (replace_key && is_key_header(name, nl)) || http_header_is(name, nl, "accept-encoding"))
            continue;
        has_type = has_type || http_header_is(name, nl, "content-type");
        has_accept = has_accept || http_header_is(name, nl, "accept");
        add_header(c, name, nl, r->h[i].value, r->h[i].value_len);
    }
    if (replace_key) {
        const char *name = b->key_header == KEY_BEARER ? "Authorization" : "x-api-key";
        char value[4096];
        snprintf(value, sizeof value, "%s%s", b->key_header == KEY_BEARER ? "Bearer " : "",
                 b->key);
        add_header(c, name, strlen(name), value, strlen(value));
    }
    /* What libcurl would add on its own: nothing the client did not send. */
    c->up_headers = curl_slist_append(c->up_headers, "Expect:");
    if (!has_accept)
        c->up_headers = curl_slist_append(c->up_headers, "Accept:");
    if (!has_type && has_body)
        c->up_headers = curl_slist_append(c->up_headers, "Content-Type:");
}

static bool method_is(const struct request *r, const char *m)
{
    return r->method_len == strlen(m) && !strncmp(r->method, m, r->method_len);
}

/*
 * Whether the request only reads (GET, HEAD or OPTIONS, no body): a model list, a file's
 * content, a health check. It goes straight upstream, outside the backend's pool (the
 * engine's unlimited endpoint-only pool carries it): a provider caps its generations, not
 * these, so they take no permit, never queue behind generations nor get a 503 for the
 * generations' overload (a readiness probe would call a busy provider down), and teach discovery
 * nothing (a 5 ms listing is no sample of a generation's latency), nor the clients' learned
 * patience (patience.c). The backend's own deadlines still apply. So does a request to one of
 * the backend's unpooled paths (route_unpooled), whatever its method: an upload, a batch, a
 * token count generate nothing while they run, and a 40 MB upload's minute, read as a
 * generation's latency, would be a knee that halves the limit.
 */
static bool only_reads(const struct request *r, size_t body_len)
{
    return !body_len && (method_is(r, "GET") || method_is(r, "HEAD") || method_is(r, "OPTIONS"));
}

static void set_method(CURL *e, const struct request *r, const char *body, size_t body_len)
{
    if (method_is(r, "GET") && !body_len) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
        return;
    }
    if (method_is(r, "HEAD")) {
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        return;
    }
    if (!method_is(r, "POST")) {
        char m[32];
        snprintf(m, sizeof m, "%.*s", (int)r->method_len, r->method);
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, m);
        if (!body_len)
            return;
    }
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
}

static struct timespec *relative_deadline(struct timespec *ts, int64_t ms)
{
    if (ms < 0)
        return NULL;
    int64_t t = proxy_now_ns() + ms * 1000000;
    ts->tv_sec = t / 1000000000;
    ts->tv_nsec = t % 1000000000;
    return ts;
}

void upstream_start(struct conn *c, struct backend *b, const char *path, const char *body,
                    size_t body_len)
{
    const struct request *r = &c->req;
    char url[4096]; /* libcurl copies it */
    if (route_url(b, path, url, sizeof url) != 0) {
        http_error(c, 414, "invalid_request_error", "target_too_long", NULL,
                   "the target is too long for backend %s", b->id);
        return;
    }
    struct proxy *p = c->p;
    c->easy = p->n_spare ? p->spare_easy[--p->n_spare] : curl_easy_init();
    if (!c->easy) {
        http_error(c, 500, "server_error", "no_memory", NULL, "out of memory");
        return;
    }
    CURL *e = c->easy;
    curl_easy_reset(e);
    c->up_error[0] = '\0';
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->up_error);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (b->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, b->ca_file);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
    /* An upstream that accepts and then says nothing would hold its permit for good:
     * upstream_sweep cuts it (a provider timeout, which discovery counts) after
     * upstream_idle_ms without a byte either way, counted from here. */
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    set_method(e, r, body, body_len);
    if (body_len) {
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, c);
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    }
    build_headers(c, b, body_len > 0);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->up_headers);
    c->head_sent = c->head_ready = c->chunked = c->no_body = c->paused = c->begun = false;
    c->up_status = 0;
    c->up_last_ns = c->up_silent_ns = 0;
    c->up_sent = 0;
    c->closing = c->closing || !r->keep_alive;
    struct timespec dl, sdl;
    int64_t ms = r->deadline_ms >= 0 ? r->deadline_ms : b->deadline_ms ? (int64_t)b->deadline_ms
                                                                       : -1;
    int64_t start_ms = r->start_deadline_ms >= 0 ? r->start_deadline_ms
                       : b->start_deadline_ms    ? (int64_t)b->start_deadline_ms
                                                 : -1;
    c->patience_ms = -1;
    c->reads = only_reads(r, body_len) || route_unpooled(b, path);
    /* No deadline named: the clients' own timeout, where learned (a generation's: a read
     * neither learns nor takes it, a health check's 1 s timeout is no chat client's). */
    if (ms < 0 && start_ms < 0 && !c->reads)
        start_ms = learned_start_ms(c);
    c->hold_head = start_ms >= 0;
    struct sluice_curl_request req = {.backend = c->reads ? NULL : b->id, .easy = e,
                                      .deadline = relative_deadline(&dl, ms),
                                      .start_deadline = relative_deadline(&sdl, start_ms),
                                      .begun = began, .done = on_done,
                                      .data = c, .dialect = b->dialect, .finish = on_finish,
                                      .write = on_write, .write_data = c, .cut = on_cut};
    int status = sluice_curl_loop_submit(c->p->loop, &req, &c->call_id);
    if (status != SLUICE_OK) {
        easy_give_back(p, e);
        c->easy = NULL;
        curl_slist_free_all(c->up_headers);
        c->up_headers = NULL;
        refuse(c, status, NULL);
        return;
    }
    c->in_call = true;
    c->state = C_CALL;
    p->kick = true;
}

/*
 * The client hung up. Its call is cancelled (the loop's cancel: a queued call leaves the line,
 * a transfer is cut and its permit lingers as the pool decides; after the answer's last event
 * it was a success, on_finish), except where the answer has begun, is not whole, and the pool
 * would keep the permit anyway (sluice_pool_read_on_left: a provider that keeps generating what
 * its client stopped, as hosted APIs do). Then the answer is read on and dropped, and the call
 * ends as any other when the answer does: its permit comes back when the provider is done,
 * not when an estimate says. Past linger_max_ms from its start, or when the upstream falls
 * silent, it is cancelled after all (upstream_sweep_read_on). Over HTTP
 * (bench/openai_sdk_rate.py --case stream: every 4th chat stopped after 3 chunks, answers
 * spread tenfold) the estimate's permits counted 1-2 of the 3-4 stopped streams the provider
 * still ran at three of the refusals that cut the limit.
 */
void upstream_client_gone(struct conn *c)
{
    struct proxy *p = c->p;
    if (c->answered_at_cut) /* the loop reads on already (on_cut) */
        return;
    bool whole = c->up_events && c->up_events->done; /* on_finish: a success */
    struct sluice_pool *pool = c->begun && !whole && !c->reads && !c->up_silent_ns
                                   ? sluice_engine_pool(p->engine, c->backend->id)
                                   : NULL;
    int64_t now = proxy_now_ns();
    int64_t left = pool ? sluice_pool_read_on_left(pool, now - c->t_start_ns) : 0;
    if (left <= 0) {
        sluice_curl_loop_cancel(p->loop, c->call_id);
        return;
    }
    c->read_on = true;
    c->read_on_until_ns = now + left;
    c->read_on_prev = NULL;
    c->read_on_next = p->reading_on;
    if (p->reading_on)
        p->reading_on->read_on_prev = c;
    p->reading_on = c;
    if (c->paused)
        upstream_resume(c); /* nothing waits for its bytes now */
}

/* From the sweep: an answer read on past linger_max_ms is cancelled (see upstream_client_gone);
 * one whose upstream falls silent is cut as any other (upstream_sweep). */
void upstream_sweep_read_on(struct proxy *p, int64_t now)
{
    for (struct conn *c = p->reading_on, *next; c; c = next) {
        next = c->read_on_next;
        if (now >= c->read_on_until_ns) {
            read_on_unlink(c);
            sluice_curl_loop_cancel(p->loop, c->call_id);
        } else {
            upstream_sweep(c, now);
        }
    }
}

void upstream_free(struct conn *c)
{
    free(c->up_events);
    curl_slist_free_all(c->up_headers);
    if (c->easy)
        curl_easy_cleanup(c->easy);
}

void upstream_free_spares(struct proxy *p)
{
    while (p->n_spare)
        curl_easy_cleanup(p->spare_easy[--p->n_spare]);
}
