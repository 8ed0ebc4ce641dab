/*
 * A small streaming chat service on libuv, written as a user of sluice
 * would: each HTTP request becomes one streamed chat completion through
 * sluice_chat_submit on a sluice_curl_loop that runs inside the same libuv
 * loop (loop_uv.h), and the reply's pieces go to the client as server-sent
 * events the moment they arrive.
 *
 *   example_stream_server [options] BASE_URL
 *     --port N        loopback port to listen on (default 0: pick one)
 *     --start-ms MS   first-token deadline of each request (default 2000)
 *     --call-ms MS    whole-call deadline of each request (default 60000)
 *     --fixed N       the gate fixed at N calls, no waiting, no discovery
 *                     (the oracle of bench/stream_service_cases.c; default:
 *                     adaptive, at most 64 at once)
 *     --quiet         no status line per second on stderr
 *
 * e.g. with sluice-provider-sim --port 8080 --stream --cap 12:
 *   example_stream_server --port 9000 http://127.0.0.1:8080/v1
 *   curl -N 'http://127.0.0.1:9000/chat?q=hello'
 *
 * It prints the port it listens on as the first line of stdout, then runs
 * until SIGINT or SIGTERM (exit 0; 1 when it cannot start, 2 on a bad flag).
 *
 * HTTP: one request per connection (every answer says Connection: close),
 * HTTP/1.x only, the head and body at most REQ_MAX bytes together.
 *   GET /chat?q=TEXT, POST /chat (the body is the prompt)
 *       200 text/event-stream, chunked: one `data:` event per delta, then
 *       `data: [DONE]`; a stream that fails once it has started ends with
 *       `event: error` and no [DONE] (the client's sign of a cut answer);
 *       503 at once when sluice refuses at admission (SLUICE_ECAPACITY,
 *       SLUICE_ELATE: the predicted wait leaves too little of the start
 *       deadline) or the provider refused (429/503); 504 when the first
 *       token did not come by the start deadline (or the call's, whichever
 *       was first); 502 for any other provider failure.
 *   GET /status
 *       the backend's status as JSON: its status line, limit, ceiling,
 *       state, and the service's own counters.
 * A client that hangs up (the socket reads EOF or fails) cancels its chat
 * by firing its cancel token, which closes the connection to the
 * provider, so an inference server that aborts on disconnect stops
 * generating. (A client that half-closes after sending its request is
 * taken as gone too.) A client that reads slower than the stream arrives
 * is cut once WRITE_QUEUE_MAX bytes wait for it.
 */
#include <ctype.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <sluice/client.h>

#include "loop_uv.h"

#define BACKEND "provider"
#define ADAPTIVE_ACTIVE 64 /* the most discovery may allow */
#define REQ_MAX 8192
#define WRITE_QUEUE_MAX (1u << 20)
#define STATUS_PERIOD_MS 1000
#define EVENT_DONE "data: [DONE]\n\n"

struct options {
    int port;
    int64_t start_ns, call_ns;
    uint32_t fixed; /* 0 = adaptive */
    bool quiet;
    const char *base_url;
};

/* How requests ended, for the status line and /status. */
#define OUTCOMES(X)                                                                                \
    X(served)    /* 200, the stream ended with [DONE] */                                           \
    X(refused)   /* 503: not admitted, or the provider refused */                                  \
    X(timeouts)  /* 504: no first token by the deadline */                                         \
    X(cut)       /* 200 whose stream failed after its first piece */                               \
    X(failed)    /* 502/500: the provider or the transport failed */                               \
    X(cancelled) /* the client hung up first */

struct counters {
#define COUNTER_FIELD(name) uint64_t name;
    OUTCOMES(COUNTER_FIELD)
#undef COUNTER_FIELD
};

struct server {
    struct options opt;
    uv_loop_t *uv;
    uv_tcp_t listener;
    uv_timer_t status_timer;
    uv_signal_t sigint, sigterm;
    struct loop_uv lu;
    struct sluice_engine *engine;
    struct counters count;
    struct conn *conns; /* open connections, for shutdown */
};

/* One client connection, and the chat it asked for. Freed once its socket is closed and its
 * chat is done (whichever comes last). */
struct conn {
    uv_tcp_t tcp;
    struct server *srv;
    struct conn *prev, *next;
    char req[REQ_MAX + 1];
    size_t len;
    bool parsed;        /* the request was read whole */
    bool in_chat;       /* submitted; `done` has not run yet */
    bool headers_sent;  /* the 200 and the first piece went out */
    bool closing;       /* uv_close or uv_shutdown was called */
    bool closed;        /* the socket's close callback ran */
    struct sluice_chat *chat;
    struct sluice_cancel cancel; /* fired when the client is gone: ends the chat at any stage */
};

/* ---- writing ------------------------------------------------------------------------- */

struct write_req {
    uv_write_t req;
    char data[];
};

static void conn_free_if_done(struct conn *c)
{
    if (!c->closed || c->in_chat)
        return;
    struct server *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    sluice_chat_destroy(c->chat);
    free(c);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    c->closed = true;
    conn_free_if_done(c);
}

/* Close the socket now (pending writes are dropped) and cancel the chat if it runs. */
static void conn_abort(struct conn *c)
{
    sluice_cancel_fire(&c->cancel); /* safe inside on_delta too (sluice/client.h) */
    if (!c->closing) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    }
}

static void on_written(uv_write_t *req, int status)
{
    struct conn *c = req->handle->data;
    free(req);
    if (status < 0 && status != UV_ECANCELED)
        conn_abort(c);
}

/* Queue `len` bytes for the client; a slow reader that lets WRITE_QUEUE_MAX pile up is cut. */
static void conn_write(struct conn *c, const char *data, size_t len)
{
    if (c->closing)
        return;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > WRITE_QUEUE_MAX) {
        conn_abort(c);
        return;
    }
    struct write_req *w = malloc(sizeof *w + len);
    if (!w) {
        conn_abort(c);
        return;
    }
    memcpy(w->data, data, len);
    uv_buf_t buf = uv_buf_init(w->data, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) {
        free(w);
        conn_abort(c);
    }
}

static void conn_printf(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_printf(struct conn *c, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    conn_write(c, buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    struct conn *c = req->handle->data;
    free(req);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* The answer is complete: close once the queued writes have gone out. */
static void conn_finish(struct conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        free(req);
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    }
}

/* A whole answer with a body, then close. */
static void conn_reply(struct conn *c, int code, const char *reason, const char *type,
                       const char *body)
{
    conn_printf(c,
                "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                "Connection: close\r\n\r\n%s",
                code, reason, type, strlen(body), code == 503 ? "Retry-After: 1\r\n" : "", body);
    conn_finish(c);
}

/* One HTTP chunk of `len` bytes. */
static void conn_chunk(struct conn *c, const char *data, size_t len)
{
    conn_printf(c, "%zx\r\n", len);
    conn_write(c, data, len);
    conn_write(c, "\r\n", 2);
}

/* One server-sent event whose data is `text` (each line of it a `data:` line). */
static void conn_event(struct conn *c, const char *event, const char *text, size_t len)
{
    size_t lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    size_t cap = len + lines * 7 + (event ? strlen(event) + 8 : 0) + 2;
    char *buf = malloc(cap), *p = buf;
    if (!buf) {
        conn_abort(c);
        return;
    }
    if (event)
        p += sprintf(p, "event: %s\n", event);
    const char *line = text, *end = text + len;
    for (;;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t n = (size_t)((nl ? nl : end) - line);
        memcpy(p, "data: ", 6);
        memcpy(p + 6, line, n);
        p += 6 + n;
        *p++ = '\n';
        if (!nl)
            break;
        line = nl + 1;
    }
    *p++ = '\n';
    conn_chunk(c, buf, (size_t)(p - buf));
    free(buf);
}

static void conn_stream_start(struct conn *c)
{
    if (c->headers_sent)
        return;
    c->headers_sent = true;
    conn_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: "
                   "no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
}

static void conn_stream_end(struct conn *c)
{
    conn_write(c, "0\r\n\r\n", 5);
    conn_finish(c);
}

/* ---- the chat ------------------------------------------------------------------------ */

static void on_delta(void *ctx, struct sluice_chat *chat, const char *text, size_t len)
{
    (void)chat;
    struct conn *c = ctx;
    conn_stream_start(c);
    conn_event(c, NULL, text, len);
}

/* What an answer that never started says to the client, by sluice's status. */
static void reply_failure(struct conn *c, int status)
{
    struct counters *n = &c->srv->count;
    const struct sluice_curl_result *r = c->chat ? sluice_chat_result(c->chat) : NULL;
    bool provider_refused = r && (r->kind == SLUICE_CURL_OVERLOADED ||
                                  r->kind == SLUICE_CURL_RATE_LIMITED ||
                                  r->kind == SLUICE_CURL_PLATFORM_OVERLOAD);
    char body[160];
    snprintf(body, sizeof body, "%s%s\n", sluice_status_name(status),
             !r || status != SLUICE_ETIMEDOUT  ? ""
             : r->expired == SLUICE_EXPIRED_START ? ": no first token by the start deadline"
                                                  : ": the call's deadline passed");
    if (status == SLUICE_ETIMEDOUT) {
        n->timeouts++;
        conn_reply(c, 504, "Gateway Timeout", "text/plain", body);
    } else if (status == SLUICE_ECAPACITY || status == SLUICE_ELATE || status == SLUICE_EAGAIN ||
               status == SLUICE_ECLOSED || provider_refused) {
        n->refused++;
        conn_reply(c, 503, "Service Unavailable", "text/plain", body);
    } else {
        n->failed++;
        conn_reply(c, 502, "Bad Gateway", "text/plain", body);
    }
}

static void on_chat_done(struct sluice_chat *chat, int status, void *data)
{
    struct conn *c = data;
    c->in_chat = false;
    struct counters *n = &c->srv->count;
    if (c->closing) { /* the client hung up (or was cut as a slow reader) */
        n->cancelled++;
    } else if (status == SLUICE_OK) {
        n->served++;
        if (!c->headers_sent) { /* the provider answered in one piece */
            const char *reply = sluice_chat_reply(chat);
            conn_stream_start(c);
            conn_event(c, NULL, reply, strlen(reply));
        }
        conn_chunk(c, EVENT_DONE, strlen(EVENT_DONE));
        conn_stream_end(c);
    } else if (c->headers_sent) {
        n->cut++;
        const char *name = sluice_status_name(status);
        conn_event(c, "error", name, strlen(name));
        conn_stream_end(c);
    } else {
        reply_failure(c, status);
    }
    conn_free_if_done(c);
}

static void start_chat(struct conn *c, const char *prompt)
{
    struct server *srv = c->srv;
    char err[160];
    int status = sluice_chat_create(&(struct sluice_chat_desc){.base_url = srv->opt.base_url,
                                                               .model = "any",
                                                               .prompt = prompt,
                                                               .stream = true,
                                                               .on_delta = on_delta,
                                                               .delta_ctx = c,
                                                               .error = err,
                                                               .error_size = sizeof err},
                                    &c->chat);
    if (status == SLUICE_EINVAL) {
        conn_reply(c, 400, "Bad Request", "text/plain", "the prompt must be UTF-8 text\n");
        return;
    }
    struct timespec start, call;
    if (status == SLUICE_OK)
        status = sluice_chat_submit(
            srv->lu.loop, c->chat,
            &(struct sluice_chat_request){
                .backend = BACKEND,
                .deadline = sluice_deadline_in(&call, srv->opt.call_ns),
                .start_deadline = sluice_deadline_in(&start, srv->opt.start_ns),
                .cancel = &c->cancel,
                .done = on_chat_done,
                .data = c},
            NULL);
    if (status == SLUICE_OK)
        c->in_chat = true;
    else
        reply_failure(c, status);
}

/* ---- requests ------------------------------------------------------------------------ */

static int hex_value(char ch)
{
    return isdigit((unsigned char)ch) ? ch - '0' : tolower((unsigned char)ch) - 'a' + 10;
}

/* Decode a query value in place ('+' and %XX); stops at '&'. */
static char *query_decode(char *s)
{
    char *out = s;
    for (char *in = s; *in && *in != '&'; in++) {
        if (*in == '+') {
            *out++ = ' ';
        } else if (in[0] == '%' && isxdigit((unsigned char)in[1]) &&
                   isxdigit((unsigned char)in[2])) {
            *out++ = (char)(hex_value(in[1]) * 16 + hex_value(in[2]));
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return s;
}

/* The value of header `name` (case-insensitive) in a head ending "\r\n\r\n"; NULL = none. */
static const char *header_value(const char *head, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line && line[2] != '\r';
         line = strstr(line + 2, "\r\n"))
        if (!strncasecmp(line + 2, name, n) && line[2 + n] == ':')
            return line + 3 + n + strspn(line + 3 + n, " \t");
    return NULL;
}

static void route_chat(struct conn *c, char *target, char *body)
{
    if (body) {
        start_chat(c, body);
        return;
    }
    char *q = strstr(target, "?q=");
    if (!q)
        q = strstr(target, "&q=");
    start_chat(c, q ? query_decode(q + 3) : "Say hi");
}

static void route_status(struct conn *c, char *target, char *body)
{
    (void)target;
    (void)body;
    struct server *srv = c->srv;
    struct sluice_discovery_status st;
    char line[128], json[768];
    sluice_engine_status(srv->engine, BACKEND, &st);
    sluice_engine_status_line(srv->engine, BACKEND, line, sizeof line);
    int n = snprintf(json, sizeof json,
                     "{\"line\":\"%s\",\"state\":\"%s\",\"limit\":%" PRIu32 ",\"ceiling\":%" PRIu32
                     ",\"in_flight\":%" PRIu32,
                     line, sluice_discovery_state_name(st.state), st.limit, st.ceiling,
                     st.in_flight);
#define COUNTER_JSON(name)                                                                         \
    n += snprintf(json + n, sizeof json - (size_t)n, ",\"" #name "\":%" PRIu64, srv->count.name);
    OUTCOMES(COUNTER_JSON)
#undef COUNTER_JSON
    snprintf(json + n, sizeof json - (size_t)n, "}\n");
    conn_reply(c, 200, "OK", "application/json", json);
}

/* The routes: one row each (method, path, handler; body = a POST's body, else NULL). */
static const struct route {
    const char *method, *path;
    void (*handle)(struct conn *c, char *target, char *body);
} routes[] = {
    {"GET", "/chat", route_chat},
    {"POST", "/chat", route_chat},
    {"GET", "/status", route_status},
};

/* Dispatch a complete request: head NUL-terminated at its blank line, body after it. */
static void dispatch(struct conn *c, char *head, char *body)
{
    char *method = head, *target = strchr(head, ' ');
    char *version = target ? strchr(target + 1, ' ') : NULL;
    if (!version || strncmp(version + 1, "HTTP/1.", 7)) {
        conn_reply(c, 400, "Bad Request", "text/plain", "not an HTTP/1.x request\n");
        return;
    }
    *target++ = '\0';
    *version = '\0';
    size_t path_len = strcspn(target, "?");
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strlen(routes[i].path) != path_len || strncmp(target, routes[i].path, path_len))
            continue;
        path_known = true;
        if (!strcmp(method, routes[i].method)) {
            routes[i].handle(c, target, !strcmp(method, "POST") ? body : NULL);
            return;
        }
    }
    if (path_known)
        conn_reply(c, 405, "Method Not Allowed", "text/plain", "use GET or POST\n");
    else
        conn_reply(c, 404, "Not Found", "text/plain", "try /chat?q=hello or /status\n");
}

/* Is the request in c->req whole? Dispatch it once it is. */
static void parse(struct conn *c)
{
    char *end = strstr(c->req, "\r\n\r\n");
    if (!end) {
        if (c->len == REQ_MAX) {
            c->parsed = true;
            conn_reply(c, 431, "Request Header Fields Too Large", "text/plain", "head too long\n");
        }
        return;
    }
    const char *cl = header_value(c->req, "Content-Length");
    char *stop;
    unsigned long body_len = cl ? strtoul(cl, &stop, 10) : 0;
    size_t head_len = (size_t)(end - c->req) + 4;
    if (body_len > REQ_MAX - head_len) {
        c->parsed = true;
        conn_reply(c, 413, "Content Too Large", "text/plain", "request too long\n");
        return;
    }
    if (c->len < head_len + body_len)
        return;
    c->parsed = true;
    end[2] = '\0';
    c->req[head_len + body_len] = '\0';
    dispatch(c, c->req, c->req + head_len);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    static char sink[512]; /* after the request: only EOF matters */
    *buf = c->parsed ? uv_buf_init(sink, sizeof sink)
                     : uv_buf_init(c->req + c->len, (unsigned)(REQ_MAX - c->len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct conn *c = s->data;
    if (nread < 0) { /* EOF or an error: the client is gone */
        conn_abort(c);
        return;
    }
    if (c->parsed || nread == 0)
        return;
    c->len += (size_t)nread;
    c->req[c->len] = '\0';
    parse(c);
}

static void on_connection(uv_stream_t *listener, int status)
{
    struct server *srv = listener->data;
    if (status < 0)
        return;
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = srv;
    sluice_cancel_init(&c->cancel);
    uv_tcp_init(srv->uv, &c->tcp);
    c->tcp.data = c;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    }
}

/* ---- the process ----------------------------------------------------------------------- */

static void on_status_timer(uv_timer_t *t)
{
    struct server *srv = t->data;
    char line[128];
    sluice_engine_status_line(srv->engine, BACKEND, line, sizeof line);
    const struct counters *n = &srv->count;
    fprintf(stderr,
            "%s · served %" PRIu64 " refused %" PRIu64 " 504 %" PRIu64 " cut %" PRIu64
            " failed %" PRIu64 " hung up %" PRIu64 "\n",
            line, n->served, n->refused, n->timeouts, n->cut, n->failed, n->cancelled);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    (void)signum;
    uv_stop(sig->loop);
}

static int usage(const char *prog, const char *why)
{
    if (why)
        fprintf(stderr, "%s: %s\n", prog, why);
    fprintf(stderr,
            "usage: %s [--port N] [--start-ms MS] [--call-ms MS] [--fixed N] [--quiet] BASE_URL\n",
            prog);
    return 2;
}

/* A whole number in [lo, hi] from flag's value; false when it is not one. */
static bool parse_number(const char *v, long lo, long hi, long *out)
{
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || n < lo || n > hi)
        return false;
    *out = n;
    return true;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.start_ns = 2000 * SLUICE_NS_PER_MS, .call_ns = 60000 * SLUICE_NS_PER_MS};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--quiet")) {
            o->quiet = true;
            continue;
        }
        if (a[0] != '-') {
            if (o->base_url)
                return usage(argv[0], "one BASE_URL only");
            o->base_url = a;
            continue;
        }
        bool port = !strcmp(a, "--port"), fixed = !strcmp(a, "--fixed");
        bool start = !strcmp(a, "--start-ms"), call = !strcmp(a, "--call-ms");
        if (!port && !fixed && !start && !call)
            return usage(argv[0], "unknown option");
        if (!parse_number(v, port ? 0 : 1, port ? 65535 : fixed ? SLUICE_POOL_ACTIVE_MAX : 86400000,
                          &n))
            return usage(argv[0], "an option's value is not a number in range");
        i++;
        if (port)
            o->port = (int)n;
        else if (fixed)
            o->fixed = (uint32_t)n;
        else if (start)
            o->start_ns = n * SLUICE_NS_PER_MS;
        else
            o->call_ns = n * SLUICE_NS_PER_MS;
    }
    return o->base_url ? 0 : usage(argv[0], "BASE_URL is required (e.g. http://127.0.0.1:8080/v1)");
}

/* The provider's backend: adaptive by default, or the fixed gate of --fixed. */
static int create_engine(struct server *srv)
{
    static const struct sluice_discovery_desc discovery = {0}; /* every default */
    struct sluice_backend_desc b = {.id = BACKEND, .active = ADAPTIVE_ACTIVE,
                                    .discovery = &discovery};
    if (srv->opt.fixed)
        b = (struct sluice_backend_desc){
            .id = BACKEND, .active = srv->opt.fixed, .waiting = SLUICE_SOME(0)};
    char err[256];
    int status = sluice_engine_create(&(struct sluice_engine_desc){.backends = &b,
                                                                   .n_backends = 1,
                                                                   .omit_openrouter = true,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &srv->engine);
    if (status != SLUICE_OK)
        fprintf(stderr, "sluice_engine_create: %s\n", err);
    return status;
}

/* Listen on 127.0.0.1:port and print the bound port. */
static int listen_loopback(struct server *srv)
{
    struct sockaddr_in addr;
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_ip4_addr("127.0.0.1", srv->opt.port, &addr);
    int rc = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    if (!rc)
        rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
    if (!rc)
        rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &len);
    if (rc) {
        fprintf(stderr, "listen on 127.0.0.1:%d: %s\n", srv->opt.port, uv_strerror(rc));
        return -1;
    }
    printf("%d\n", ntohs(((struct sockaddr_in *)&bound)->sin_port));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    static struct server srv;
    int bad = parse_options(argc, argv, &srv.opt);
    if (bad)
        return bad;
    /* libuv asserts that it never closes descriptors 0 to 2: started with one of them closed
     * (a test runner's stdin), a socket would land there. Fill them with /dev/null. */
    int fd;
    while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= STDERR_FILENO) {
    }
    if (fd > STDERR_FILENO)
        close(fd);
    /* A client that hangs up while its stream is being written makes the next write fail with
     * EPIPE: that is a hang-up to handle (on_written), not a reason to die of SIGPIPE, which
     * libuv leaves to the program. */
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    srv.uv = uv_default_loop();
    uv_tcp_init(srv.uv, &srv.listener);
    srv.listener.data = &srv;
    int status = create_engine(&srv);
    int created = loop_uv_create(&srv.lu, srv.uv, srv.engine); /* EINVAL without an engine */
    int rc = status == SLUICE_OK && created == SLUICE_OK && listen_loopback(&srv) == 0 ? 0 : 1;
    uv_timer_init(srv.uv, &srv.status_timer);
    srv.status_timer.data = &srv;
    uv_signal_init(srv.uv, &srv.sigint);
    uv_signal_init(srv.uv, &srv.sigterm);
    if (!rc) {
        if (!srv.opt.quiet)
            uv_timer_start(&srv.status_timer, on_status_timer, STATUS_PERIOD_MS, STATUS_PERIOD_MS);
        uv_signal_start(&srv.sigint, on_signal, SIGINT);
        uv_signal_start(&srv.sigterm, on_signal, SIGTERM);
        uv_run(srv.uv, UV_RUN_DEFAULT);
    }

    /* Shutdown (loop_uv.h): the sluice loop first (every chat's `done` runs, ECLOSED), then
     * the connections and our own handles, then the closes run out. */
    loop_uv_destroy(&srv.lu);
    for (struct conn *c = srv.conns; c; c = c->next)
        if (!c->closing) {
            c->closing = true;
            uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        }
    uv_close((uv_handle_t *)&srv.listener, NULL);
    uv_close((uv_handle_t *)&srv.status_timer, NULL);
    uv_close((uv_handle_t *)&srv.sigint, NULL);
    uv_close((uv_handle_t *)&srv.sigterm, NULL);
    uv_run(srv.uv, UV_RUN_DEFAULT);
    uv_loop_close(srv.uv);
    sluice_engine_destroy(srv.engine);
    curl_global_cleanup();
    return rc;
}
