/*
 * http.c — sluice-proxy's front end: an HTTP/1.1 server on the proxy's own
 * epoll loop (the thread that also drives the curl loop, see main.c).
 *
 * Why its own and not libmicrohttpd: MHD runs a thread per connection or
 * its own select/epoll loop, so every answer byte the curl loop receives
 * would cross threads (a queue and a wake-up per server-sent event) and a
 * client's hang-up would be seen on another thread than the transfer it
 * must cancel. On one loop a write callback puts the bytes in the
 * client's buffer and the loop writes them before it sleeps again; and
 * MHD does not watch a suspended connection (a call waiting for its permit
 * or first token) for the client's hang-up, which must cancel the call.
 * bench/RESULTS.md has its figures beside nginx and HAProxy, and the A/B
 * against MHD serving the same fixed answer (bench/http_front_ab.py: MHD's
 * epoll thread about 1 µs of CPU a request cheaper, of the 52 µs a proxied
 * request costs).
 *
 * What it accepts: request lines "METHOD /path HTTP/1.0|1.1", headers up to
 * max_header_bytes (431 past it), a body by Content-Length or chunked
 * (HTTP/1.1), up to max_body_bytes either way (413 past it), no
 * absolute-form targets (400: it is not a forward proxy). A chunked body is
 * decoded as it arrives and goes upstream with a Content-Length: the whole
 * body is needed anyway before routing (the body's "model") and before the
 * call is submitted, and a provider need not accept chunked uploads. Both
 * Content-Length and Transfer-Encoding, a transfer coding other than
 * chunked, or chunking that does not parse are refused and the connection
 * closed (RFC 9112 §6: what follows cannot be framed; the pair is how
 * requests are smuggled past a proxy). Keep-alive as HTTP/1.1 says (HTTP/1.0 closes), pipelined
 * requests answered in order. A request must arrive in full within
 * client_timeout_ms of its first byte (408 and close), a kept-alive
 * connection idle for idle_timeout_ms is closed, and one whose answer the
 * client does not read within client_timeout_ms is closed too (a call
 * paused for such a client is cancelled, so it holds no permit forever).
 * Expect: 100-continue gets its 100 once the head is accepted, or the final
 * answer in its place when the head alone decides a refusal
 * (refused_before_body). Past max_connections a new connection is answered 503 (with
 * Retry-After and retry-after-ms, as the other refusals) and closed; a
 * connection closed after an answer lingers (conn_linger), so that the client
 * reads the answer rather than a reset.
 *
 * Lifetimes: a connection whose client hangs up during its call keeps its
 * record (`gone`, socket closed) until the call's completion has run; a
 * record is freed only at the end of a loop iteration (main.c), so an
 * event already fetched for it never points at freed memory.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 16384
#define CHUNK_LINE_MAX 4096 /* a chunk's size line with its extensions */
/* A connection closed after its answer lingers this long at most (conn_linger), and at most
 * this many at once: a bound on the descriptors and time a flood of refused clients costs. */
#define LINGER_MS 1000
#define LINGER_MAX 256
/* A drain's 503 tells the client to come back this soon (spread as retry_after_ms spreads):
 * refuse_draining says why. */
#define DRAIN_RETRY_MS 100u

/* ---- buffers ------------------------------------------------------------------------------ */

static bool buf_reserve(struct buf *b, size_t want)
{
    if (want <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < want)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q)
        return false;
    b->p = q;
    b->cap = cap;
    return true;
}

bool buf_put(struct buf *b, const void *data, size_t n)
{
    if (!buf_reserve(b, b->len + n))
        return false;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return true;
}

bool buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if (b->len + (size_t)n + 1 > b->cap) {
        if (!buf_reserve(b, b->len + (size_t)n + 1))
            return false;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return true;
}

/* ---- connections ---------------------------------------------------------------------------- */

static const char *const reasons[][2] = {
    {"100", "Continue"},           {"200", "OK"},
    {"400", "Bad Request"},        {"404", "Not Found"},
    {"408", "Request Timeout"},    {"411", "Length Required"},
    {"413", "Content Too Large"},  {"431", "Request Header Fields Too Large"},
    {"500", "Internal Server Error"}, {"501", "Not Implemented"},
    {"502", "Bad Gateway"},        {"503", "Service Unavailable"},
    {"504", "Gateway Timeout"},    {"505", "HTTP Version Not Supported"},
};

const char *http_reason(int status)
{
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
        if (!strcmp(reasons[i][0], code))
            return reasons[i][1];
    return "Unknown";
}

void http_watch(struct conn *c, uint32_t events)
{
    if (c->gone || events == c->events)
        return;
    struct epoll_event ev = {.events = events, .data.ptr = &c->w};
    epoll_ctl(c->p->ep, EPOLL_CTL_MOD, c->w.fd, &ev);
    c->events = events;
}

/* What the connection waits for: its next bytes (during a call too, so that the common case
 * never changes what epoll watches: a hang-up reads as EOF; bytes a client pipelined behind
 * its request make it watch only for a hang-up until the answer is out), and room to write
 * while output is pending. */
static void conn_update(struct conn *c)
{
    uint32_t ev = c->pipelined ? 0 : EPOLLRDHUP; /* (a half-close behind pipelined bytes
                                                     would otherwise fire until the answer) */
    if (!c->pipelined && c->state != C_FLUSH)
        ev |= EPOLLIN;
    if (c->out.len > c->out_off)
        ev |= EPOLLOUT;
    http_watch(c, ev);
}

void http_mark_dirty(struct conn *c)
{
    if (c->dirty || c->gone)
        return;
    c->dirty = true;
    c->next_dirty = c->p->dirty;
    c->p->dirty = c;
}

/* Free the record once nothing points at it any more: no call, not on the flush list. */
static void conn_release(struct conn *c)
{
    if (c->in_call || c->dirty)
        return;
    struct proxy *p = c->p;
    c->next_dirty = p->dead;
    p->dead = c;
}

void conn_free(struct conn *c)
{
    upstream_free(c);
    free(c->in.p);
    free(c->out.p);
    free(c->up_head.p);
    free(c);
}

/* n_conns moved by `by`: the admin's copy follows. */
static void conns_add(struct proxy *p, int by)
{
    p->n_conns += (uint32_t)by;
    atomic_store_explicit(&p->counts.connections, p->n_conns, memory_order_relaxed);
}

static void conn_close(struct conn *c)
{
    if (c->gone)
        return;
    struct proxy *p = c->p;
    epoll_ctl(p->ep, EPOLL_CTL_DEL, c->w.fd, NULL);
    close(c->w.fd);
    c->gone = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        p->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->uncounted)
        p->n_lingering--;
    else
        conns_add(p, -1);
    if (c->in_call)
        upstream_client_gone(c);
    conn_release(c);
}

/*
 * Close after an answer, lingering: the write side is shut (the client reads the answer, then
 * EOF) and what the client still sends is read and dropped until it closes too, or for
 * LINGER_MS. A plain close() with unread bytes in the socket sends a reset instead of a FIN,
 * and a client's TCP may drop an answer it has not read yet when the reset comes (Windows
 * does, and any stack does when the reset overtakes a lost segment of the answer): a client
 * refused before it finished sending (past --max-connections, a 413, a final status in place
 * of 100 Continue) would see "connection reset" rather than the answer that says why. A
 * lingering connection is not one of --max-connections; past LINGER_MAX of them a connection
 * is closed at once (a reset, as before), so a flood holds few descriptors.
 */
static void conn_linger(struct conn *c)
{
    struct proxy *p = c->p;
    if (!c->uncounted) {
        if (p->n_lingering >= LINGER_MAX) {
            conn_close(c);
            return;
        }
        conns_add(p, -1);
        p->n_lingering++;
        c->uncounted = true;
    }
    shutdown(c->w.fd, SHUT_WR);
    free(c->in.p);
    c->in = (struct buf){0};
    c->state = C_LINGER;
    c->pipelined = false;
    c->deadline_ns = proxy_now_ns() + LINGER_MS * INT64_C(1000000);
    conn_update(c);
}

/* A lingering connection's bytes are dropped; its EOF (or an error) closes it. */
static void linger_read(struct conn *c)
{
    char sink[READ_CHUNK];
    ssize_t n = recv(c->w.fd, sink, sizeof sink, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        conn_close(c);
}

/* When a refused client may come back, in ms: `base` spread over half to one and a half times
 * itself. Every client of a burst told the same second comes back in the same millisecond (50
 * OpenAI SDK calls retrying after "1" met the same full backend: 19 of 50 served); SDKs that
 * read retry-after-ms (OpenAI's do) come back spread. */
static unsigned retry_after_ms(uint64_t base)
{
    static uint64_t x;
    if (!x)
        x = (uint64_t)proxy_now_ns() | 1u;
    x ^= x << 13; /* xorshift64 */
    x ^= x >> 7;
    x ^= x << 17;
    return (unsigned)(base / 2 + (base ? x % (base + 1) : 0));
}

/* Now as a Date field's value: an origin server with a clock sends Date (RFC 9110 6.6.1) on its
 * own answers (a provider's answer has its own). IMF-fixdate, in the C locale the proxy never
 * leaves. */
static void http_date(char *out, size_t size)
{
    struct tm tm;
    time_t now = time(NULL);
    strftime(out, size, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
}

/* The head fields of a 503 the proxy refuses with: `refused` (X-Sluice-Refused: REASON), then
 * Retry-After (--retry-after) and retry-after-ms, each ending in CRLF. */
void refusal_headers(const struct proxy *p, const char *refused, char *out, size_t size)
{
    snprintf(out, size, "%s\r\nRetry-After: %u\r\nretry-after-ms: %u\r\n", refused,
             p->o->retry_after_s, retry_after_ms((uint64_t)p->o->retry_after_s * 1000u));
}

/* An answer with `status` went out (or was queued): for /metrics, as the access log has it. */
static void count_answer(struct proxy *p, int status)
{
    if (status >= 100 && status < 600)
        atomic_fetch_add_explicit(&p->counts.answers[status], 1, memory_order_relaxed);
}

/* Past --max-connections: a 503 the client can act on, then a lingering close (above). The
 * answer is small and the socket new, so its one write never blocks the loop; the request is
 * not read first (it need not have arrived, and would cost this loop a wait). */
static void refuse_connection(struct conn *c)
{
    const struct options *o = c->p->o;
    char headers[160];
    refusal_headers(c->p, "X-Sluice-Refused: connections", headers, sizeof headers);
    c->closing = true;
    c->t_start_ns = proxy_now_ns();
    http_error(c, 503, "server_error", "too_many_connections", headers,
               PROG " has %u client connections open, its most (--max-connections); retry "
                    "later",
               o->max_connections);
}

/* See proxy.h. A client's connection and an upstream one each, the lingering closes, and the
 * rest (the engine, the admin, the state file, libcurl's): short of that, said at start, not
 * at the first client refused. */
void http_prepare_descriptors(struct proxy *p)
{
    unsigned long want = 2ul * p->o->max_connections + LINGER_MAX + 64;
    unsigned long have = tool_raise_fd_limit(want);
    if (have && have < want)
        fprintf(stderr,
                PROG ": ulimit -n is %lu, short of the %lu descriptors --max-connections %u may "
                     "need (a client's and an upstream's each): clients past what it allows get "
                     "503; raise ulimit -n (LimitNOFILE= under systemd) or lower "
                     "--max-connections\n",
                have, want, p->o->max_connections);
    p->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Watch the listener for `events` (EPOLLIN, or 0 while no descriptor is left for a client). */
static void listener_watch(struct proxy *p, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = &p->listener};
    epoll_ctl(p->ep, EPOLL_CTL_MOD, p->listener.fd, &ev);
    p->listener_asleep = !events;
}

/*
 * No descriptor left (EMFILE, ENFILE: ulimit -n, or the system's): the client waiting in the
 * backlog cannot be accepted, and the listener stays readable, so the loop would wake for it
 * at once, forever, while the client hangs (ulimit -n 64 and 100 connections: a core at
 * 100 %, the clients past it never answered). The spare descriptor held for this is let go,
 * the client accepted on it and told 503 in one write (the socket is new: it never blocks),
 * closed, logged and counted (/metrics), and the spare taken back. Said once on stderr until
 * an accept finds a descriptor again. false: no client answered (no spare to lend, or none
 * waiting after all).
 */
static bool refuse_without_descriptors(struct proxy *p)
{
    if (p->spare_fd < 0)
        return false;
    close(p->spare_fd);
    int fd = accept4(p->listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        char headers[160], date[64], answer[704];
        static const char body[] = "{\"error\":{\"message\":\"" PROG " has no file descriptor "
                                   "left for another connection; retry later\",\"type\":"
                                   "\"server_error\",\"code\":\"too_many_connections\"}}";
        refusal_headers(p, "X-Sluice-Refused: connections", headers, sizeof headers);
        http_date(date, sizeof date);
        int n = snprintf(answer, sizeof answer,
                         "HTTP/1.1 503 Service Unavailable\r\nDate: %s\r\nContent-Type: "
                         "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n%s",
                         date, sizeof body - 1, headers, body);
        int64_t t = proxy_now_ns();
        ssize_t sent = send(fd, answer, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        shutdown(fd, SHUT_WR); /* the answer, then the end: a FIN, not a reset */
        close(fd);
        atomic_fetch_add_explicit(&p->counts.refused[REFUSED_DESCRIPTORS], 1,
                                  memory_order_relaxed);
        count_answer(p, 503);
        int64_t took = proxy_now_ns() - t;
        access_log(p, &(struct access){.status = 503, .outcome = "too_many_connections",
                                       .queued_ns = 0, .ttfb_ns = sent > 0 ? took : -1,
                                       .duration_ns = took,
                                       .bytes = sent > 0 ? sizeof body - 1 : 0});
    }
    p->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!p->out_of_fds) {
        struct rlimit rl = {0, 0};
        getrlimit(RLIMIT_NOFILE, &rl);
        fprintf(stderr,
                PROG ": no file descriptor left (ulimit -n %llu, %u client connections open): new "
                     "ones get 503 until some close; raise ulimit -n (LimitNOFILE= under "
                     "systemd) or lower --max-connections\n",
                (unsigned long long)rl.rlim_cur, p->n_conns);
        p->out_of_fds = true;
    }
    return fd >= 0;
}

void http_accept(struct proxy *p)
{
    for (int i = 0; i < 64; i++) { /* a bounded batch: clients already connected get a turn */
        int fd = accept4(p->listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EMFILE && errno != ENFILE)
                return;
            if (refuse_without_descriptors(p))
                continue;
            if (p->spare_fd < 0) /* none to lend next time either: sleep until the sweep, */
                listener_watch(p, 0); /* not spin (http_sweep wakes it) */
            return;
        }
        p->out_of_fds = false;
        bool over = p->n_conns >= p->o->max_connections;
        if (over)
            atomic_fetch_add_explicit(&p->counts.refused[REFUSED_MAX_CONNECTIONS], 1,
                                      memory_order_relaxed);
        if (over && p->n_lingering >= LINGER_MAX) {
            close(fd); /* a flood past --max-connections: no answer is affordable, a reset */
            continue;
        }
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->w = (struct watch){.kind = W_CLIENT, .fd = fd};
        c->p = p;
        c->state = C_HEAD;
        c->events = EPOLLIN | EPOLLRDHUP;
        c->deadline_ns = proxy_now_ns() + (int64_t)p->o->idle_timeout_ms * 1000000;
        struct epoll_event ev = {.events = c->events, .data.ptr = &c->w};
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = p->conns;
        if (p->conns)
            p->conns->prev = c;
        p->conns = c;
        c->uncounted = over;
        if (over) {
            p->n_lingering++;
            refuse_connection(c);
        } else {
            conns_add(p, 1);
        }
    }
}

/* ---- answers ------------------------------------------------------------------------------- */

/* The request is answered in full (its answer queued): log it, and write. */
void http_request_done(struct conn *c)
{
    struct proxy *p = c->p;
    int64_t t = proxy_now_ns();
    count_answer(p, c->status_out);
    access_log(p, &(struct access){
                      .backend = c->backend, .method = c->req.method,
                      .method_len = c->req.method_len, .path = c->req.target,
                      .path_len = c->req.target_len, .status = c->status_out,
                      .outcome = c->outcome, .queued_ns = c->queued_ns,
                      .ttfb_ns = c->t_first_ns ? c->t_first_ns - c->t_start_ns : -1,
                      .duration_ns = t - c->t_start_ns, .bytes = c->bytes_out,
                      .model = c->model, .request_id = c->request_id});
    c->state = C_FLUSH;
    c->deadline_ns = t + (int64_t)p->o->client_timeout_ms * 1000000;
    if (c->gone) {
        conn_release(c);
        return;
    }
    http_mark_dirty(c);
}

/* The upstream call of a request answered already (upstream.c, on_cut) is over: a connection
 * its client has closed meanwhile can go. */
void http_call_over(struct conn *c)
{
    if (c->gone)
        conn_release(c);
}

/*
 * The proxy's own answer, before any byte of an upstream one: a small JSON
 * body in the OpenAI error shape, so SDKs show `message`. A 4xx about
 * framing closes the connection (what follows cannot be trusted).
 */
void http_error(struct conn *c, int status, const char *type, const char *code,
                const char *extra_headers, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *body = json_pack("{s:{s:s,s:s,s:s}}", "error", "message", msg, "type", type, "code",
                             code);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (status == 400 || status == 408 || status == 411 || status == 413 || status == 431 ||
        status == 501 || status == 505)
        c->closing = true;
    size_t len = text ? strlen(text) : 0;
    char date[64];
    http_date(date, sizeof date);
    buf_printf(&c->out,
               "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %zu\r\n%s%s\r\n",
               status, http_reason(status), date, len, extra_headers ? extra_headers : "",
               c->closing ? "Connection: close\r\n" : "");
    bool head = c->req.method_len == 4 && !strncmp(c->req.method, "HEAD", 4);
    if (text && !head)
        buf_put(&c->out, text, len);
    c->bytes_out = text && !head ? len : 0; /* the body's, as upstream.c counts a provider's */
    free(text);
    c->status_out = status;
    if (!c->outcome)
        c->outcome = code;
    c->t_first_ns = proxy_now_ns();
    http_request_done(c);
}

/* ---- parsing ------------------------------------------------------------------------------- */

bool http_header_is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && !strncasecmp(name, want, len);
}

bool http_header(const struct request *r, const char *name, const char **value, size_t *len)
{
    for (size_t i = 0; i < r->n_h; i++)
        if (http_header_is(r->h[i].name, r->h[i].name_len, name)) {
            *value = r->h[i].value;
            *len = r->h[i].value_len;
            return true;
        }
    return false;
}

static bool has_token(const char *v, size_t len, const char *token)
{
    size_t n = strlen(token);
    for (size_t i = 0; i + n <= len; i++)
        if (!strncasecmp(v + i, token, n) && (i == 0 || v[i - 1] == ' ' || v[i - 1] == ',') &&
            (i + n == len || v[i + n] == ' ' || v[i + n] == ','))
            return true;
    return false;
}

/* A header's value as milliseconds, or false (then the 400 names the header). */
static bool header_ms(const char *v, size_t len, int64_t *out)
{
    char tmp[24];
    uint64_t ms;
    if (len == 0 || len >= sizeof tmp)
        return false;
    memcpy(tmp, v, len);
    tmp[len] = '\0';
    if (!tool_parse_u64(tmp, UINT64_C(86400000), &ms)) /* a day: longer is a typo */
        return false;
    *out = (int64_t)ms;
    return true;
}

static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           strchr("!#$%&'*+-.^_`|~", ch);
}

/* [p, end) is an RFC 9110 token (a method, a header name). */
static bool is_token(const char *p, const char *end)
{
    for (; p < end; p++)
        if (!is_tchar(*p))
            return false;
    return true;
}

/* A Transfer-Encoding value: 0 when it is "chunked" alone, else the status to refuse it with. */
static int transfer_coding(const char *v, size_t len, bool again, char *msg, size_t size)
{
    if (again) {
        snprintf(msg, size, "more than one Transfer-Encoding");
        return 400;
    }
    if (http_header_is(v, len, "chunked"))
        return 0;
    const char *last = v + len; /* the final coding: it frames the body */
    while (last > v && last[-1] != ',')
        last--;
    while (last < v + len && (*last == ' ' || *last == '\t'))
        last++;
    bool framed = http_header_is(last, (size_t)(v + len - last), "chunked");
    snprintf(msg, size, framed ? "transfer codings other than chunked are not served: %.*s"
                               : "the final transfer coding must be chunked: %.*s",
             (int)(len < 64 ? len : 64), v);
    return framed ? 501 : 400;
}

/* Parse the head at c->in (head_len bytes). 0, or the status to refuse it with (msg says why). */
static int parse_head(struct conn *c, char *msg, size_t size)
{
    struct request *r = &c->req;
    *r = (struct request){.deadline_ms = -1, .start_deadline_ms = -1};
    char *p = c->in.p, *end = c->in.p + c->head_len - 2; /* the blank line's CRLF */
    char *eol = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
    char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1) {
        snprintf(msg, size, "malformed request line");
        return 400;
    }
    if (!is_token(p, sp1)) {
        snprintf(msg, size, "malformed method");
        return 400;
    }
    r->method = p;
    r->method_len = (size_t)(sp1 - p);
    r->target = sp1 + 1;
    r->target_len = (size_t)(sp2 - sp1 - 1);
    if (eol - sp2 - 1 != 8 || strncmp(sp2 + 1, "HTTP/1.", 7) || (sp2[8] != '0' && sp2[8] != '1')) {
        snprintf(msg, size, "only HTTP/1.0 and HTTP/1.1 are served");
        return 505;
    }
    r->minor = sp2[8] - '0';
    if (r->target[0] != '/') {
        snprintf(msg, size, "the target must be a path (/v1/...): this is not a forward proxy");
        return 400;
    }
    for (size_t i = 0; i < r->target_len; i++)
        if ((unsigned char)r->target[i] <= ' ' || r->target[i] == 0x7f) {
            snprintf(msg, size, "malformed target");
            return 400;
        }
    bool has_length = false, has_te = false, close = r->minor == 0, keep = false;
    for (p = eol + 2; p < end; p = eol + 2) {
        eol = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
        char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p) {
            snprintf(msg, size, "malformed header line");
            return 400;
        }
        if (!is_token(p, colon)) {
            snprintf(msg, size, "malformed header name");
            return 400;
        }
        if (r->n_h == HDR_MAX) {
            snprintf(msg, size, "more than %d headers", HDR_MAX);
            return 431;
        }
        char *v = colon + 1, *ve = eol;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (char *q = v; q < ve; q++)
            if ((*q < ' ' && *q != '\t') || *q == 0x7f) {
                snprintf(msg, size, "control character in a header value");
                return 400;
            }
        size_t nl = (size_t)(colon - p), vl = (size_t)(ve - v);
        r->h[r->n_h++] = (struct header){p, v, nl, vl};
        if (http_header_is(p, nl, "content-length")) {
            char tmp[24];
            uint64_t n;
            if (vl == 0 || vl >= sizeof tmp) {
                snprintf(msg, size, "malformed Content-Length");
                return 400;
            }
            memcpy(tmp, v, vl);
            tmp[vl] = '\0';
            if (!tool_parse_u64(tmp, UINT64_MAX, &n) || (has_length && n != r->content_length)) {
                snprintf(msg, size, "malformed or conflicting Content-Length");
                return 400;
            }
            r->content_length = n;
            has_length = true;
        } else if (http_header_is(p, nl, "transfer-encoding")) {
            int status = transfer_coding(v, vl, has_te, msg, size);
            if (status)
                return status;
            has_te = r->chunked = true;
        } else if (http_header_is(p, nl, "connection")) {
            close = close || has_token(v, vl, "close");
            keep = keep || has_token(v, vl, "keep-alive");
        } else if (http_header_is(p, nl, "expect")) {
            r->expect_continue = has_token(v, vl, "100-continue");
        } else if (http_header_is(p, nl, PROXY_DEADLINE_HEADER)) {
            if (!header_ms(v, vl, &r->deadline_ms)) {
                snprintf(msg, size, PROXY_DEADLINE_HEADER " must be whole milliseconds (0..86400000)");
                return 400;
            }
        } else if (http_header_is(p, nl, PROXY_START_DEADLINE_HEADER)) {
            if (!header_ms(v, vl, &r->start_deadline_ms)) {
                snprintf(msg, size,
                         PROXY_START_DEADLINE_HEADER " must be whole milliseconds (0..86400000)");
                return 400;
            }
        }
    }
    if (has_te && (has_length || r->minor == 0)) {
        snprintf(msg, size, has_length ? "both Content-Length and Transfer-Encoding"
                                       : "Transfer-Encoding in an HTTP/1.0 request");
        return 400;
    }
    r->keep_alive = r->minor == 1 ? !close : keep && !close;
    if (r->minor == 0)
        r->keep_alive = false; /* HTTP/1.0 keep-alive would need Content-Length on every answer */
    return 0;
}

/* A chunk's size line (CRLF excluded): hex digits, then nothing or extensions after ";". */
static bool chunk_size(const char *p, size_t len, uint64_t *out)
{
    size_t i = 0;
    uint64_t n = 0;
    for (; i < len; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0)
            break;
        if (n > UINT64_MAX >> 4)
            return false;
        n = n << 4 | (uint64_t)d;
    }
    size_t j = i;
    while (j < len && (p[j] == ' ' || p[j] == '\t'))
        j++;
    if (i == 0 || (j < len && p[j] != ';'))
        return false;
    for (; j < len; j++) /* extensions are ignored, but a bare LF or a NUL is not a line */
        if (((unsigned char)p[j] < ' ' && p[j] != '\t') || p[j] == 0x7f)
            return false;
    *out = n;
    return true;
}

/*
 * Decode what has arrived of a chunked body, in place: the decoded bytes
 * follow the head and what is not decoded yet moves down behind them, so
 * the buffer holds the body so far plus at most a partial line, however
 * small the chunks. 1 once the last chunk and its trailer are in (then
 * content_length is the body's length and any pipelined bytes follow the
 * body, as they do a Content-Length one), 0 for more bytes, or the status
 * to refuse the request with (msg says why). Trailer fields are read,
 * bounded like a head, and dropped: nothing upstream would read them.
 */
static int chunk_decode(struct conn *c, char *msg, size_t size)
{
    const struct options *o = c->p->o;
    size_t pos = c->head_len + c->ck_body, end = c->in.len;
    int result = 0;
    while (result == 0 && pos < end) {
        char *p = c->in.p + pos;
        size_t avail = end - pos;
        if (c->ck_state == CK_DATA) {
            size_t n = avail < c->ck_left ? avail : (size_t)c->ck_left;
            memmove(c->in.p + c->head_len + c->ck_body, p, n);
            c->ck_body += n;
            c->ck_left -= n;
            pos += n;
            if (!c->ck_left)
                c->ck_state = CK_DATA_END;
            continue;
        }
        if (c->ck_state == CK_DATA_END) {
            if (avail < 2)
                break;
            if (p[0] != '\r' || p[1] != '\n') {
                snprintf(msg, size, "malformed chunked body: a chunk's data must end with CRLF");
                return 400;
            }
            pos += 2;
            c->ck_state = CK_SIZE;
            continue;
        }
        char *lf = memchr(p, '\n', avail);
        if (lf && (lf == p || lf[-1] != '\r')) { /* at once: a client that ends lines with LF
                                                  would otherwise wait for a 408 */
            snprintf(msg, size, "malformed chunked body: a line must end with CRLF");
            return 400;
        }
        bool eol = lf != NULL;
        size_t line = lf ? (size_t)(lf - 1 - p) : avail;
        if (c->ck_state == CK_SIZE) {
            uint64_t n;
            if (line > CHUNK_LINE_MAX) {
                snprintf(msg, size, "malformed chunked body: a size line over %d bytes",
                         CHUNK_LINE_MAX);
                return 400;
            }
            if (!eol)
                break;
            if (!chunk_size(p, line, &n)) {
                snprintf(msg, size, "malformed chunked body: bad chunk size line");
                return 400;
            }
            if (n > o->max_body_bytes - c->ck_body) {
                snprintf(msg, size,
                         "chunked request body exceeds %u bytes (sluice-proxy --max-body-bytes)",
                         o->max_body_bytes);
                return 413;
            }
            c->ck_left = n;
            c->ck_state = n ? CK_DATA : CK_TRAILER;
        } else { /* CK_TRAILER: fields until an empty line */
            if (c->ck_trailer + line > o->max_header_bytes) {
                snprintf(msg, size, "chunked trailer fields exceed %u bytes "
                                    "(sluice-proxy --max-header-bytes)",
                         o->max_header_bytes);
                return 431;
            }
            if (!eol)
                break;
            if (line && !memchr(p, ':', line)) {
                snprintf(msg, size, "malformed chunked body: bad trailer field");
                return 400;
            }
            c->ck_trailer += line + 2;
            result = line == 0;
        }
        pos += line + 2;
    }
    size_t to = c->head_len + c->ck_body;
    if (pos > to) {
        memmove(c->in.p + to, c->in.p + pos, end - pos);
        c->in.len -= pos - to;
    }
    if (result)
        c->req.content_length = c->ck_body;
    return result;
}

/* ---- the request cycle ------------------------------------------------------------------------ */

static void conn_process(struct conn *c);

/* The answer is written: the next request (pipelined bytes first), or close. */
static void next_request(struct conn *c)
{
    size_t used = c->head_len + c->req.content_length;
    if (c->closing || c->p->draining) {
        conn_linger(c);
        return;
    }
    memmove(c->in.p, c->in.p + used, c->in.len - used);
    c->in.len -= used;
    /* Its method, path and headers point into the buffer just moved (or freed below): a head
     * refused before it parses (431, 408) is answered and logged as no request's, "-". */
    c->req = (struct request){0};
    /* An idle kept-alive connection holds no buffers: 1000 of them cost their records. */
    if (c->in.len == 0) {
        free(c->in.p);
        c->in = (struct buf){0};
    }
    free(c->out.p);
    c->out = (struct buf){0};
    free(c->up_head.p);
    c->up_head = (struct buf){0};
    c->head_len = c->scanned = 0;
    c->out.len = c->out_off = 0;
    c->state = C_HEAD;
    c->pipelined = false;
    c->backend = NULL;
    c->outcome = NULL;
    c->status_out = 0;
    c->queued_ns = 0;
    c->t_first_ns = 0;
    c->bytes_out = 0;
    c->model[0] = c->request_id[0] = '\0';
    c->deadline_ns = proxy_now_ns() + (int64_t)c->p->o->idle_timeout_ms * 1000000;
    conn_process(c);
    if (!c->gone && !c->dirty) /* (as in http_on_event) */
        conn_update(c);
}

/* Write what is pending; false when the connection was closed. */
static bool conn_write(struct conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->w.fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            conn_close(c);
            return false;
        }
        c->out_off += (size_t)n;
    }
    if (c->out_off == c->out.len) {
        c->out.len = c->out_off = 0;
        if (c->paused)
            upstream_resume(c);
        if (c->state == C_FLUSH) {
            next_request(c);
            return !c->gone;
        }
    }
    conn_update(c);
    return true;
}

void http_flush_dirty(struct proxy *p)
{
    while (p->dirty) {
        struct conn *c = p->dirty;
        p->dirty = c->next_dirty;
        c->dirty = false;
        if (c->gone)
            conn_release(c);
        else
            conn_write(c);
    }
}

/* A draining proxy takes no new connections, so waiting for it helps no one: a retry reaches
 * another instance (a load balancer's next server, the restarted unit) or nothing, and should
 * go at once. Retry-After says 0, the least its whole seconds can; retry-after-ms says about
 * DRAIN_RETRY_MS rather than 0, which the OpenAI SDKs read as no hint at all (they back off
 * half a second or more instead), spread so that the kept-alive clients a drain refuses do not
 * all reconnect in one millisecond. Not --retry-after: that says when this instance may have
 * room again, and it will not. */
static void refuse_draining(struct conn *c)
{
    char headers[160];
    snprintf(headers, sizeof headers,
             "X-Sluice-Refused: shutting_down\r\nRetry-After: 0\r\nretry-after-ms: %u\r\n",
             retry_after_ms(DRAIN_RETRY_MS));
    c->closing = true;
    http_error(c, 503, "server_error", "shutting_down", headers,
               PROG " is shutting down; retry on another instance");
}

static void refuse_no_route(struct conn *c, const char *path)
{
    char routes[1024];
    routes_list(c->p->o, routes, sizeof routes);
    http_error(c, 404, "invalid_request_error", "no_route", NULL,
               "no backend serves %s; routes: %s", path, routes);
}

/* The request's target as a string, cut to fit. */
static void request_path(const struct conn *c, char *path, size_t size)
{
    size_t n = c->req.target_len < size ? c->req.target_len : size - 1;
    memcpy(path, c->req.target, n);
    path[n] = '\0';
}

/* A whole request is in: route it and send it upstream (or answer it here). */
static void dispatch(struct conn *c)
{
    struct proxy *p = c->p;
    const char *body = c->in.p + c->head_len;
    size_t body_len = (size_t)c->req.content_length;
    if (p->draining) {
        refuse_draining(c);
        return;
    }
    char path[2048];
    request_path(c, path, sizeof path);
    bool has_model = route_model(body, body_len, c->model, sizeof c->model);
    struct backend *b = route_pick(p->o, path, &c->req, has_model ? c->model : NULL);
    if (!b) {
        refuse_no_route(c, path);
        return;
    }
    c->backend = b;
    upstream_start(c, b, path, body, body_len);
}

/*
 * Expect: 100-continue, with the head in and the body not: a refusal that the head alone
 * decides is sent in place of the 100 (RFC 9110 §10.1.1 allows a final status instead), and
 * the connection is closed, as its body was not read (lingering drops it, if the client sends
 * it anyway). True when it answered. What the head decides: a drain (503); a path no backend
 * serves (404), but only when no backend routes by the body's "model", which might route it;
 * a declared body over --max-body-bytes is refused with the head already (413). Not the
 * backend's admission: whether it has a slot is decided when the call is submitted, after the
 * body, and a slot may free while the body comes, so a refusal now would be a guess.
 */
static bool refused_before_body(struct conn *c)
{
    struct proxy *p = c->p;
    if (p->draining) {
        refuse_draining(c);
        return true;
    }
    for (size_t i = 0; i < p->o->n_backends; i++)
        if (p->o->backends[i].n_models)
            return false;
    char path[2048];
    request_path(c, path, sizeof path);
    if (route_pick(p->o, path, &c->req, NULL))
        return false;
    c->closing = true;
    refuse_no_route(c, path);
    return true;
}

static void conn_process(struct conn *c)
{
    const struct options *o = c->p->o;
    char msg[256];
    bool head = false; /* the head is complete in this call: a 100 Continue may be due */
    if (c->state == C_HEAD) {
        if (c->in.len == 0)
            return;
        if (c->scanned == 0) { /* a request's first byte: its clocks start */
            c->t_start_ns = proxy_now_ns();
            c->deadline_ns = c->t_start_ns + (int64_t)o->client_timeout_ms * 1000000;
        }
        size_t from = c->scanned > 3 ? c->scanned - 3 : 0;
        char *e = memmem(c->in.p + from, c->in.len - from, "\r\n\r\n", 4);
        if (!e) {
            c->scanned = c->in.len;
            if (c->in.len > o->max_header_bytes) {
                http_error(c, 431, "invalid_request_error", "header_too_large", NULL,
                           "request line and headers exceed %u bytes (sluice-proxy "
                           "--max-header-bytes)",
                           o->max_header_bytes);
            }
            return;
        }
        c->head_len = (size_t)(e - c->in.p) + 4;
        int status = c->head_len > o->max_header_bytes ? 431 : parse_head(c, msg, sizeof msg);
        if (status == 431 && c->head_len > o->max_header_bytes)
            snprintf(msg, sizeof msg,
                     "request line and headers exceed %u bytes (sluice-proxy --max-header-bytes)",
                     o->max_header_bytes);
        if (status == 0 && c->req.content_length > o->max_body_bytes) {
            status = 413;
            snprintf(msg, sizeof msg,
                     "request body of %llu bytes exceeds %u (sluice-proxy --max-body-bytes)",
                     (unsigned long long)c->req.content_length, o->max_body_bytes);
        }
        if (status) {
            c->req.content_length = 0;
            http_error(c, status, "invalid_request_error",
                       status == 413   ? "body_too_large"
                       : status == 431 ? "header_too_large"
                       : status == 501 ? "unsupported_transfer_coding"
                                       : "bad_request",
                       NULL, "%s", msg);
            return;
        }
        /* The body goes where the head is: reserve it now, so that the head's pointers stay. */
        char *before = c->in.p;
        if (!buf_reserve(&c->in, c->head_len + c->req.content_length + 1)) {
            conn_close(c);
            return;
        }
        if (c->in.p != before)
            parse_head(c, msg, sizeof msg);
        c->state = C_BODY;
        c->ck_state = CK_SIZE;
        c->ck_left = 0;
        c->ck_body = c->ck_trailer = 0;
        head = true;
    }
    if (c->state != C_BODY)
        return;
    int done = c->req.chunked ? chunk_decode(c, msg, sizeof msg)
                              : c->in.len >= c->head_len + c->req.content_length;
    if (done > 1) {
        c->req.content_length = 0;
        http_error(c, done, "invalid_request_error",
                   done == 413   ? "body_too_large"
                   : done == 431 ? "header_too_large"
                                 : "bad_request",
                   NULL, "%s", msg);
    } else if (done) {
        dispatch(c);
    } else if (head && c->req.expect_continue && !refused_before_body(c)) {
        buf_printf(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
        http_mark_dirty(c);
    }
}

/* Read what the client sent; false when the connection was closed. */
static bool conn_read(struct conn *c)
{
    size_t want = READ_CHUNK;
    char *before = c->in.p;
    if (c->state == C_BODY && !c->req.chunked) /* never past the body: it was reserved */
        want = c->head_len + c->req.content_length - c->in.len;
    else if (!buf_reserve(&c->in, c->in.len + want)) {
        conn_close(c);
        return false;
    }
    if (c->state == C_BODY && c->in.p != before) { /* a chunked body grew: the head moved */
        char msg[256];
        parse_head(c, msg, sizeof msg);
    }
    ssize_t n = recv(c->w.fd, c->in.p + c->in.len, want, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(c);
        return false;
    }
    if (n > 0)
        c->in.len += (size_t)n;
    return true;
}

void http_on_event(struct conn *c, uint32_t events)
{
    if (c->gone)
        return;
    if (events & (EPOLLERR | EPOLLHUP)) {
        conn_close(c);
        return;
    }
    if ((events & EPOLLOUT) && !conn_write(c))
        return;
    if (c->state == C_LINGER) {
        linger_read(c);
        return;
    }
    if (c->state == C_CALL || c->state == C_FLUSH) {
        char byte;
        ssize_t n = (events & (EPOLLIN | EPOLLRDHUP))
                        ? recv(c->w.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT)
                        : -1;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR && (events & EPOLLRDHUP)))
            conn_close(c); /* the client hung up: its call is cancelled */
        else if (n > 0) {
            c->pipelined = true; /* the next request waits in the kernel until this answer */
            conn_update(c);
        }
        return;
    }
    if ((events & EPOLLIN) && conn_read(c)) {
        conn_process(c);
        /* With an answer made at once (the proxy's own: a refusal, an error) the connection is
         * on the flush list, whose write updates it: updating it here too would cost two
         * epoll_ctl calls a request (EPOLLOUT on, then off). */
        if (!c->gone && !c->dirty)
            conn_update(c);
    } else if (!c->gone && (events & EPOLLRDHUP)) {
        conn_close(c);
    }
}

/* Every SWEEP_MS (main.c): slow clients, idle connections and silent upstreams. */
void http_sweep(struct proxy *p, int64_t now)
{
    if (p->listener_asleep && !p->draining) { /* refuse_without_descriptors lost its spare */
        if (p->spare_fd < 0)
            p->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        listener_watch(p, EPOLLIN);
    }
    for (struct conn *c = p->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_CALL && !c->paused) {
            upstream_sweep(c, now);
            continue;
        }
        if (now < c->deadline_ns)
            continue;
        if (c->state == C_CALL) {
            conn_close(c); /* paused for a client that does not read: the call is cancelled */
        } else if (c->state == C_HEAD && c->in.len == 0) {
            conn_close(c); /* idle keep-alive */
        } else if (c->state == C_FLUSH) {
            conn_close(c); /* the client does not read its answer */
        } else if (c->state == C_LINGER) {
            conn_close(c);
        } else {
            c->req.content_length = 0;
            http_error(c, 408, "invalid_request_error", "request_timeout", NULL,
                       "the request did not arrive in full within %u ms (sluice-proxy "
                       "--client-timeout-ms)",
                       p->o->client_timeout_ms);
        }
    }
}

/* SIGTERM: no new connections, idle ones closed now, busy ones after their answer. */
void http_drain(struct proxy *p)
{
    p->draining = true;
    if (p->listener.fd >= 0) {
        epoll_ctl(p->ep, EPOLL_CTL_DEL, p->listener.fd, NULL);
        close(p->listener.fd);
        p->listener.fd = -1;
    }
    for (struct conn *c = p->conns, *next; c; c = next) {
        next = c->next;
        c->closing = true;
        if (c->state == C_HEAD && c->in.len == 0 && c->out.len == c->out_off)
            conn_close(c);
    }
}

/* The end: every connection still open is closed (their calls were ended first). */
void http_close_all(struct proxy *p)
{
    while (p->conns)
        conn_close(p->conns);
}
