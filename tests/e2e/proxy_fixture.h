/*
 * proxy_fixture.h — what the sluice-proxy end-to-end tests share: the proxy
 * as a child process (started with --listen 127.0.0.1:0 and --admin
 * 127.0.0.1:0, its two URLs read from its first stdout lines), requests to
 * it with the status, headers and body captured, and its node as the admin
 * endpoint shows it; loopback upstreams a test writes (px_serve) and a
 * suite's temporary directory (px_dir). The simulator behind it comes from
 * curl_fixture.h.
 *
 * The proxy is never left running: px_stop sends SIGTERM and waits (then
 * SIGKILL); the child asks for SIGKILL when the test process dies
 * (PR_SET_PDEATHSIG). Call px_stop from the test (its exit status is what
 * the drain test checks) and from .fini.
 *
 * Everything is static: each test file gets its own copy.
 */
#ifndef SLUICE_TESTS_E2E_PROXY_FIXTURE_H
#define SLUICE_TESTS_E2E_PROXY_FIXTURE_H

#include "curl_fixture.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#ifndef SLUICE_PROXY_PATH
#error "SLUICE_PROXY_PATH must name the sluice-proxy binary (tests/CMakeLists.txt sets it)"
#endif

#define PX_START_MS 10000
#define PX_STOP_MS 10000

struct px {
    pid_t pid;
    char url[64], admin[64];
    int status;
};

static struct px px_main;

/* Read one line from fd within the deadline (ms on fx_now_ms's clock). */
static bool px__line(int fd, char *buf, size_t size, int64_t deadline)
{
    size_t n = 0;
    while (n + 1 < size) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - fx_now_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return false;
        if (read(fd, buf + n, 1) != 1)
            return false;
        if (buf[n] == '\n') {
            buf[n] = '\0';
            return true;
        }
        n++;
    }
    return false;
}

/* Start sluice-proxy with `args` (NULL-terminated) after --listen/--admin on free ports and
 * --access-log off (a test may pass its own). 0, or -1 with the reason printed. */
static inline int px_start(struct px *p, const char *const *args)
{
    const char *argv[64] = {SLUICE_PROXY_PATH, "--listen", "127.0.0.1:0", "--admin",
                            "127.0.0.1:0", "--access-log", "off"};
    int n = 7;
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int out[2];
    if (pipe(out) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    *p = (struct px){.pid = pid};
    int64_t deadline = fx_now_ms() + PX_START_MS;
    bool ok = px__line(out[0], p->url, sizeof p->url, deadline) &&
              px__line(out[0], p->admin, sizeof p->admin, deadline);
    close(out[0]);
    if (!ok) {
        fprintf(stderr, "sluice-proxy did not print its URLs\n");
        kill(pid, SIGKILL);
        waitpid(pid, &p->status, 0);
        p->pid = 0;
        return -1;
    }
    return 0;
}

/* SIGTERM, wait up to PX_STOP_MS, then SIGKILL; the wait status (a stopped proxy: its last). */
static inline int px_stop(struct px *p)
{
    if (p->pid <= 0)
        return p->status;
    kill(p->pid, SIGTERM);
    int64_t deadline = fx_now_ms() + PX_STOP_MS;
    while (waitpid(p->pid, &p->status, WNOHANG) == 0) {
        if (fx_now_ms() > deadline) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &p->status, 0);
            break;
        }
        fx_sleep_ms(10);
    }
    p->pid = 0;
    return p->status;
}

/* ---- a suite's temporary directory -------------------------------------------------------- */

static char px_dir[64]; /* for the files a test writes (configs, access logs) */

/* A suite's .init, with `name` in its directory's: fx_setup and a fresh px_dir. */
static inline void px_dir_setup(const char *name)
{
    fx_setup();
    snprintf(px_dir, sizeof px_dir, "/tmp/sluice-proxy-%s-XXXXXX", name);
    cr_assert_not_null(mkdtemp(px_dir));
}

/* The proxy stopped, px_dir and what is in it removed: the start of every .fini of a suite
 * that px_dir_setup began. */
static inline void px_dir_remove(void)
{
    px_stop(&px_main);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", px_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", px_dir);
}

/* Its .fini: px_dir_remove, fx_teardown. */
__attribute__((unused)) static void px_dir_teardown(void)
{
    px_dir_remove();
    fx_teardown();
}

/* Start the fixture's simulator (fx_sim) as provider `p` with `extra` flags (NULL-terminated)
 * that struct fx_provider has no field for, stopping any earlier one. */
static inline void px_sim_start(const struct fx_provider *p, const char *const *extra)
{
    struct fx_argv a;
    fx_provider_argv(p, &a);
    for (int i = 0; extra && extra[i]; i++)
        fx__arg(&a, extra[i], NULL);
    sim_process_stop(&fx_sim);
    cr_assert_eq(sim_process_start(&fx_sim, a.v), 0, "the simulator did not start");
}

/* ---- requests ---------------------------------------------------------------------------- */

struct px_reply {
    long status;
    char headers[8192];
    char body[65536];
    size_t headers_len, body_len;
    CURLcode code;
    int64_t first_byte_ms, last_byte_ms; /* fx_now_ms when the first / last body byte came */
    int64_t total_ms;                     /* the request's whole time, as curl saw it */
};

/* Append what fits of data to buf (cap bytes, NUL kept); returns len, as curl wants. */
static size_t px__append(char *buf, size_t cap, size_t *used, const char *data, size_t len)
{
    size_t keep = cap - 1 - *used < len ? cap - 1 - *used : len;
    memcpy(buf + *used, data, keep);
    *used += keep;
    buf[*used] = '\0';
    return len;
}

static size_t px__body(char *data, size_t size, size_t n, void *ctx)
{
    struct px_reply *r = ctx;
    if (!r->first_byte_ms)
        r->first_byte_ms = fx_now_ms();
    r->last_byte_ms = fx_now_ms();
    return px__append(r->body, sizeof r->body, &r->body_len, data, size * n);
}

static size_t px__header(char *data, size_t size, size_t n, void *ctx)
{
    struct px_reply *r = ctx;
    return px__append(r->headers, sizeof r->headers, &r->headers_len, data, size * n);
}

/* An easy handle for `method path` on the proxy, capturing into *r; `headers` may be NULL. */
static inline CURL *px_easy(const struct px *p, const char *path, const char *body,
                            struct curl_slist *headers, struct px_reply *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", p->url, path);
    memset(r, 0, sizeof *r);
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, px__body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, px__header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 20000L);
    return e;
}

static inline void px_finish(CURL *e, struct px_reply *r)
{
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_off_t us = 0;
    curl_easy_getinfo(e, CURLINFO_TOTAL_TIME_T, &us);
    r->total_ms = (int64_t)(us / 1000);
    curl_easy_cleanup(e);
}

/* One blocking request; `header` (one "Name: value", or NULL) is added. */
static inline void px_request(const struct px *p, const char *path, const char *body,
                              const char *header, struct px_reply *r)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (header)
        h = curl_slist_append(h, header);
    CURL *e = px_easy(p, path, body, h, r);
    r->code = curl_easy_perform(e);
    px_finish(e, r);
    curl_slist_free_all(h);
}

/* A generation holding a permit while a test does something else: on its own curl_multi,
 * already in service at the fixture's simulator once px_hold returns. Stays in place (its
 * reply is written through a pointer). */
struct px_held {
    CURLM *m;
    CURL *e;
    int running;
    struct px_reply reply;
};

static inline void px_hold(struct px_held *h, const struct px *p)
{
    h->m = curl_multi_init();
    h->e = px_easy(p, "/v1/chat/completions", FX_REQUEST, NULL, &h->reply);
    curl_multi_add_handle(h->m, h->e);
    h->running = 1;
    for (int64_t until = fx_now_ms() + 5000; fx_stats().in_flight < 1 && fx_now_ms() < until;) {
        curl_multi_perform(h->m, &h->running);
        curl_multi_poll(h->m, NULL, 0, 20, NULL);
    }
    cr_assert_eq(fx_stats().in_flight, 1, "the generation never reached the provider");
}

/* The held generation run to its end; its answer is in h->reply. */
static inline void px_hold_end(struct px_held *h)
{
    while (h->running) {
        curl_multi_perform(h->m, &h->running);
        curl_multi_poll(h->m, NULL, 0, 50, NULL);
    }
    curl_multi_remove_handle(h->m, h->e);
    px_finish(h->e, &h->reply);
    curl_multi_cleanup(h->m);
}

/* Run the handles at once (a curl_multi), each to its end. */
static inline void px_all(CURL **easy, struct px_reply **replies, int n)
{
    CURLM *m = curl_multi_init();
    for (int i = 0; i < n; i++)
        curl_multi_add_handle(m, easy[i]);
    int running = n;
    while (running) {
        curl_multi_perform(m, &running);
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
        for (int i = 0; i < n; i++)
            if (msg->easy_handle == easy[i])
                replies[i]->code = msg->data.result;
    for (int i = 0; i < n; i++) {
        curl_multi_remove_handle(m, easy[i]);
        px_finish(easy[i], replies[i]);
    }
    curl_multi_cleanup(m);
}

/* The value of header `name` in r (case-insensitive), copied into buf; NULL when absent. */
static inline const char *px_header(const struct px_reply *r, const char *name, char *buf,
                                    size_t size)
{
    size_t nl = strlen(name);
    for (const char *line = r->headers; line && *line;) {
        const char *eol = strstr(line, "\r\n");
        if (!eol)
            break;
        if (!strncasecmp(line, name, nl) && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(buf, size, "%.*s", (int)(eol - v), v);
            return buf;
        }
        line = eol + 2;
    }
    return NULL;
}

/* The proxy's own answer is the OpenAI error shape: {"error":{"message","type","code"}}. */
static inline void px_assert_error_body(const struct px_reply *r, const char *code)
{
    json_t *root = json_loads(r->body, 0, NULL);
    cr_assert_not_null(root, "not JSON: %s", r->body);
    json_t *err = json_object_get(root, "error");
    cr_assert(json_is_string(json_object_get(err, "message")), "no error.message: %s", r->body);
    cr_assert(json_is_string(json_object_get(err, "type")), "no error.type: %s", r->body);
    cr_assert_str_eq(json_string_value(json_object_get(err, "code")), code, "%s", r->body);
    json_decref(root);
}

/* A body kept whole up to its buffer (fx_collect keeps 4 KiB: /metrics is longer). */
struct px_sink {
    char *buf;
    size_t size, len;
};

static inline size_t px_sink_put(char *data, size_t size, size_t n, void *ctx)
{
    struct px_sink *k = (struct px_sink *)ctx;
    size_t bytes = size * n, keep = bytes < k->size - 1 - k->len ? bytes : k->size - 1 - k->len;
    memcpy(k->buf + k->len, data, keep);
    k->len += keep;
    k->buf[k->len] = '\0';
    return bytes;
}

/* `method` (GET or POST) `path` on the proxy's admin endpoint, its answer into body (size
 * bytes, NUL-terminated); its HTTP status. */
static inline long px_admin(const struct px *p, const char *method, const char *path, char *body,
                            size_t size)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", p->admin, path);
    struct px_sink sink = {.buf = body, .size = size};
    body[0] = '\0';
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (!strcmp(method, "POST"))
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, px_sink_put);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    cr_assert_eq(curl_easy_perform(e), CURLE_OK, "%s %s failed", method, url);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    return status;
}

/* GET `path` on the proxy's admin endpoint into body (size bytes, NUL-terminated). */
static inline void px_admin_get(const struct px *p, const char *path, char *body, size_t size)
{
    px_admin(p, "GET", path, body, size);
}

/* The node's entry on the admin endpoint (GET /compute/concurrency); json_decref the root. */
static inline json_t *px_node(const struct px *p, const char *node, json_t **root)
{
    char body[16384];
    px_admin_get(p, "/compute/concurrency", body, sizeof body);
    *root = json_loads(body, 0, NULL);
    cr_assert_not_null(*root, "not JSON: %s", body);
    json_t *nodes = json_object_get(*root, "nodes");
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        json_t *n = json_array_get(nodes, i);
        if (!strcmp(json_string_value(json_object_get(n, "node")), node))
            return n;
    }
    return NULL;
}

/* A counter of `node` on the admin endpoint's JSON (requests_total, cancels_total, ...). */
static inline long px_node_count(const struct px *p, const char *node, const char *key)
{
    json_t *root;
    json_t *n = px_node(p, node, &root);
    cr_assert_not_null(n, "%s is not on the admin endpoint", node);
    long v = (long)json_integer_value(json_object_get(n, key));
    json_decref(root);
    return v;
}

/* ---- raw requests: what libcurl will not send ------------------------------------------- */

/* The proxy's listener's address. */
static inline struct sockaddr_in px__addr(const struct px *p)
{
    int port = atoi(strrchr(p->url, ':') + 1);
    return (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
}

/* A plain TCP connection to the proxy's listener; the fd. */
static inline int px_connect(const struct px *p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = px__addr(p);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    int one = 1; /* each part leaves as its own segment */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One "POST /v1/chat/completions" with a Content-Length body, for a raw connection. */
static inline void px_raw_chat(char *out, size_t size, const char *body)
{
    snprintf(out, size,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
}

/* Does the proxy's listener take connections (it is not draining)? */
static inline bool px_listening(const struct px *p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = px__addr(p);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Does got (len bytes) hold `answers` whole answers, each with a Content-Length? */
static bool px__answers_in(const char *got, size_t len, int answers)
{
    const char *p = got, *end = got + len;
    for (int i = 0; i < answers; i++) {
        const char *head = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        const char *cl = head ? strcasestr(p, "\r\nContent-Length:") : NULL;
        if (!cl || cl > head)
            return false;
        p = head + 4 + atol(cl + 17);
        if (p > end)
            return false;
    }
    return true;
}

/*
 * Write `parts` (NULL-terminated) on connection fd, gap_ms apart (so that
 * the proxy reads them one by one), then read until `answers` answers are
 * whole, the proxy closes, or 5 s pass. What came back is in got (NUL
 * terminated); returns whether the proxy closed the connection. fd stays
 * open: the caller may hold it.
 */
static inline bool px_raw_on(int fd, const char *const *parts, int gap_ms, int answers,
                             char *got, size_t size)
{
    for (int i = 0; parts[i]; i++) {
        if (i && gap_ms)
            fx_sleep_ms(gap_ms);
        size_t n = strlen(parts[i]);
        cr_assert_eq(write(fd, parts[i], n), (ssize_t)n);
    }
    size_t len = 0;
    bool closed = false;
    got[0] = '\0';
    for (int64_t end = fx_now_ms() + 5000; !px__answers_in(got, len, answers);) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (fx_now_ms() > end || len + 1 >= size)
            break;
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = read(fd, got + len, size - 1 - len);
        if (n <= 0) {
            closed = true;
            break;
        }
        len += (size_t)n;
        got[len] = '\0';
    }
    if (!closed) { /* answered: does the proxy close now? (a refusal of framing must) */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        char byte;
        closed = poll(&pfd, 1, 200) == 1 && read(fd, &byte, 1) == 0;
    }
    return closed;
}

/* Read from fd until got holds a head (to its blank line): whether one came before the proxy
 * closed or 5 s passed. */
static inline bool px_read_head(int fd, char *got, size_t size)
{
    size_t len = 0;
    got[0] = '\0';
    for (int64_t end = fx_now_ms() + 5000; !strstr(got, "\r\n\r\n");) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (fx_now_ms() > end || len + 1 >= size)
            return false;
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = read(fd, got + len, size - 1 - len);
        if (n <= 0)
            return false;
        len += (size_t)n;
        got[len] = '\0';
    }
    return true;
}

/* px_raw_on on a new connection, closed after. */
static inline bool px_raw(const struct px *p, const char *const *parts, int gap_ms,
                          int answers, char *got, size_t size)
{
    int fd = px_connect(p);
    bool closed = px_raw_on(fd, parts, gap_ms, answers, got, size);
    close(fd);
    return closed;
}

/* ---- loopback upstreams ------------------------------------------------------------------ */

struct px__server {
    int fd;
    void *(*conn)(void *);
};

static void *px__accept(void *arg)
{
    struct px__server *s = arg;
    for (;;) {
        int fd = accept(s->fd, NULL, NULL);
        if (fd < 0)
            break;
        pthread_t t;
        pthread_create(&t, NULL, s->conn, (void *)(intptr_t)fd);
        pthread_detach(t);
    }
    free(s);
    return NULL;
}

/* A loopback server: a thread per connection runs conn with the connection's fd (cast to a
 * pointer; conn closes it). It lives until the test process ends; its port. */
static inline int px_serve(void *(*conn)(void *))
{
    struct px__server *s = malloc(sizeof *s);
    cr_assert_not_null(s);
    *s = (struct px__server){.fd = socket(AF_INET, SOCK_STREAM, 0), .conn = conn};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    cr_assert_eq(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->fd, 64), 0);
    getsockname(s->fd, (struct sockaddr *)&a, &al);
    pthread_t t;
    pthread_create(&t, NULL, px__accept, s);
    pthread_detach(t);
    return ntohs(a.sin_port);
}

/* ---- an upstream that echoes ------------------------------------------------------------ */

/*
 * A loopback HTTP/1.1 server whose answer (200, text/plain) is the request
 * exactly as it arrived, head and body: what the proxy sent upstream. A
 * thread per connection, keep-alive; it lives until the test process ends.
 */
static void *px__echo_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    static __thread char buf[1 << 17];
    size_t len = 0;
    for (;;) {
        char *end = len ? memmem(buf, len, "\r\n\r\n", 4) : NULL;
        if (end) {
            size_t head = (size_t)(end - buf) + 4, body = 0;
            const char *cl = strcasestr(buf, "\r\ncontent-length:");
            if (cl && cl < end)
                body = (size_t)atol(cl + 17);
            if (len >= head + body) {
                char h[128];
                int hl = snprintf(h, sizeof h,
                                  "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                  "Content-Length: %zu\r\n\r\n",
                                  head + body);
                if (write(fd, h, (size_t)hl) != hl || write(fd, buf, head + body) < 0)
                    break;
                memmove(buf, buf + head + body, len - head - body);
                len -= head + body;
                continue;
            }
        }
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    return NULL;
}

/* Start the echo server; its port. */
static inline int px_echo_start(void)
{
    return px_serve(px__echo_conn);
}

#endif /* SLUICE_TESTS_E2E_PROXY_FIXTURE_H */
