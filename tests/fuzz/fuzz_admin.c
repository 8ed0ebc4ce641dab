/*
 * fuzz_admin — the admin endpoint's request handling (method, path, query,
 * headers, body) over a loopback socket. The admin has no entry point below
 * libmicrohttpd's connection (its handler takes an MHD_Connection, which
 * only MHD makes), so each input is sent to a real endpoint started once
 * per process: an engine with an adaptive node (cloud:a), a fixed one
 * (local:gpu) and the built-in openrouter, timeout_s 1, max_streams 1.
 *
 * Inputs have two shapes, picked by the first byte:
 *   'R'...  the rest is sent as raw bytes (request smuggling, broken lines,
 *           pipelining, bodies);
 *   other   a request built from the input: method (from a table, or the
 *           input's own word), path (one of the endpoint's, as its 404
 *           answer lists its route table, or none) and query (bytes below
 *           0x21 and above 0x7e percent-encoded, so the query decoder sees
 *           them), then optional headers and a body from the rest.
 * The client half-closes after sending and reads until the server closes
 * or 1.5 s pass (a follow=1 stream is left once its headers arrived).
 *
 * Checked for every input: the endpoint answers with an HTTP/1.x status
 * line whose code is one the endpoint or libmicrohttpd documents (or
 * closes without an answer), every JSON error carries "error" and "fix",
 * and afterwards the engine is intact: every node's status reads, and the
 * endpoint still answers GET /compute/concurrency with 200.
 *
 * Leaks: ctest runs this target with -detect_leaks=0. libFuzzer's check after
 * each input stops the world while the admin's threads are still answering
 * (a pipelined request outlives the input that sent it); after 140 000
 * inputs it once called a history answer in the making a leak, which neither
 * replaying the input nor 40 s of the same requests from four threads could
 * reproduce. LeakSanitizer still checks at exit, once stop() has joined
 * every admin thread.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sluice/admin.h>
#include <sluice/sluice.h>

#include "fuzz_input.h"

static struct sluice_engine *engine;
static struct sluice_admin *admin;
static struct sluice_memstore *mem;
static uint16_t port;

static void check(bool ok, const char *what, const char *detail)
{
    if (!ok) {
        fprintf(stderr, "fuzz_admin: %s\n%.2000s\n", what, detail ? detail : "");
        abort();
    }
}

static void stop(void)
{
    sluice_admin_stop(admin);
    if (engine) {
        sluice_engine_close(engine);
        sluice_engine_destroy(engine);
    }
    sluice_memstore_destroy(mem);
}

static void setup(void)
{
    static const struct sluice_discovery_desc adaptive = {.lock_ttl_s = 86400};
    static const struct sluice_backend_desc backends[] = {
        {.id = "cloud:a", .active = 64, .discovery = &adaptive},
        {.id = "local:gpu", .active = 4},
    };
    check(sluice_memstore_create(8, NULL, &mem) == SLUICE_OK, "memstore", NULL);
    struct sluice_store_ops ops = sluice_memstore_ops(mem);
    char err[256];
    check(sluice_engine_create(&(struct sluice_engine_desc){.backends = backends,
                                                           .n_backends = 2, .store = &ops,
                                                           .error = err,
                                                           .error_size = sizeof err},
                               &engine) == SLUICE_OK,
          "engine", err);
    struct sluice_admin_desc d = {.engine = engine, .port = SLUICE_SOME(0), .timeout_s = 1,
                                  .max_connections = 8, .max_streams = 1, .error = err,
                                  .error_size = sizeof err};
    check(sluice_admin_start(&d, &admin) == SLUICE_OK, "admin", err);
    port = sluice_admin_port(admin);
    atexit(stop);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send `req`, half-close, read the answer into `reply` (NUL-terminated); its length. */
static size_t exchange(const char *req, size_t len, char *reply, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    check(fd >= 0, "socket", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* libFuzzer's SIGALRM (its -timeout watchdog) interrupts system calls: an interrupted
     * connect goes on in the background, so wait for it rather than call it again. */
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        check(errno == EINTR, "connect", strerror(errno));
        struct pollfd p = {fd, POLLOUT, 0};
        int err = 0;
        socklen_t el = sizeof err;
        while (poll(&p, 1, 1000) < 0 && errno == EINTR) {
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        check(err == 0, "connect", strerror(err));
    }
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the server may hang up on garbage before reading it all */
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    int64_t give_up = now_ms() + 1500;
    while (got < cap - 1) {
        int64_t left = give_up - now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        int ready = left > 0 ? poll(&p, 1, (int)left) : 0;
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            break;
        ssize_t n = recv(fd, reply + got, cap - 1 - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        reply[got] = '\0';
        if (strstr(reply, "text/event-stream") && strstr(reply, "\r\n\r\n"))
            break; /* a follow=1 stream: its head is enough */
    }
    reply[got] = '\0';
    struct linger lg = {1, 0}; /* no TIME_WAIT per input: a long run would use up the ports */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    return got;
}

/* Codes the endpoint (sluice/admin.h) or libmicrohttpd may answer. */
static bool known_code(int code)
{
    static const int codes[] = {200, 400, 403, 404, 405, 409, 413, 414, 417, 431,
                                500, 501, 503, 505};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (code == codes[i])
            return true;
    return false;
}

static void check_reply(const char *reply, size_t len)
{
    if (len == 0)
        return; /* closed without an answer: allowed for garbage */
    static const char interim[] = "HTTP/1.1 100 Continue\r\n\r\n"; /* for Expect: */
    if (!strncmp(reply, interim, sizeof interim - 1)) {
        reply += sizeof interim - 1;
        len -= sizeof interim - 1;
        if (len == 0)
            return;
    }
    check(len >= 12 && (!strncmp(reply, "HTTP/1.1 ", 9) || !strncmp(reply, "HTTP/1.0 ", 9)),
          "the answer starts with an HTTP/1.x status line", reply);
    int code = atoi(reply + 9);
    check(known_code(code), "the status is one the endpoint documents", reply);
    /* The first answer's body (pipelined answers may follow; a HEAD answer has none). */
    const char *end = strstr(reply, "\r\n\r\n");
    const char *type = strcasestr(reply, "\r\nContent-Type: application/json");
    const char *clen = strcasestr(reply, "\r\nContent-Length: ");
    if (code == 200 || !end || !type || type > end || !clen || clen > end ||
        !strncmp(end + 4, "HTTP/1.", 7))
        return;
    char body[4096];
    size_t want = strtoul(clen + 18, NULL, 10);
    snprintf(body, sizeof body, "%.*s", (int)(want < sizeof body ? want : sizeof body - 1),
             end + 4);
    if (strlen(body) == want) /* all of it arrived */
        check(strstr(body, "\"error\"") && strstr(body, "\"fix\""),
              "a JSON error says what is wrong and how to fix it", reply);
}

static void check_alive(void)
{
    for (size_t i = 0; i < sluice_engine_backend_count(engine); i++) {
        struct sluice_discovery_status st;
        check(sluice_engine_status(engine, sluice_engine_backend_id(engine, i), &st) ==
                  SLUICE_OK,
              "every node's status still reads", sluice_engine_backend_id(engine, i));
    }
    static char reply[1 << 16];
    static const char get[] = "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    exchange(get, sizeof get - 1, reply, sizeof reply);
    check(!strncmp(reply, "HTTP/1.1 200", 12), "the endpoint still serves", reply);
}

static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS",
                                      "PATCH", "CONNECT", "TRACE"};

/* The endpoint's own paths, learnt from its route table: a 404 answer's "fix" lists the
 * table ("routes: GET /, ..., POST /compute/concurrency/clear?node_id=N, GET /metrics"). */
static char route_list[1024];
static const char *paths[16];
static size_t n_paths;

static void learn_paths(void)
{
    static char reply[1 << 14];
    static const char get[] = "GET /no/such/route HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    exchange(get, sizeof get - 1, reply, sizeof reply);
    const char *list = strstr(reply, "routes: ");
    check(list != NULL, "a 404 answer lists the routes", reply);
    snprintf(route_list, sizeof route_list, "%s", list + 8);
    route_list[strcspn(route_list, "\"")] = '\0'; /* the JSON string ends there */
    for (char *p = route_list; (p = strchr(p, '/')) && n_paths < 16;) {
        paths[n_paths++] = p;
        p += strcspn(p, "?,"); /* the path ends at its query or at the next route */
        if (!*p)
            break;
        *p++ = '\0';
    }
    check(n_paths > 0, "the 404 answer names a path", reply);
}

/* Percent-encode what cannot go raw into a request line. */
static size_t put_url(char *out, size_t cap, const uint8_t *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            k += (size_t)snprintf(out + k, cap - k, "%%%02X", s[i]);
        else
            out[k++] = (char)s[i];
    }
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!admin) {
        setup();
        learn_paths();
    }
    static char req[1 << 17], reply[1 << 17];
    size_t len = 0;
    if (size && data[0] == 'R') {
        len = size - 1 < sizeof req ? size - 1 : sizeof req;
        memcpy(req, data + 1, len);
    } else {
        struct fuzz_in in = {data, size};
        uint8_t how = fuzz_u8(&in);
        const char *method = methods[fuzz_pick(&in, sizeof methods / sizeof methods[0])];
        len += (size_t)snprintf(req + len, sizeof req - len, "%s ", method);
        if (how & 1) /* a known path, then the fuzzed query */
            len += (size_t)snprintf(req + len, sizeof req - len, "%s",
                                    paths[fuzz_pick(&in, (uint32_t)n_paths)]);
        size_t qlen = fuzz_u8(&in);
        qlen = qlen < in.n ? qlen : in.n;
        len += put_url(req + len, sizeof req - len - 256, in.p, qlen);
        in.p += qlen;
        in.n -= qlen;
        len += (size_t)snprintf(req + len, sizeof req - len, " HTTP/1.%d\r\n%s", (how >> 1) & 1,
                                how & 4 ? "" : "Host: 127.0.0.1\r\n");
        /* The rest: extra header lines (as they are), a blank line, and maybe a body. */
        size_t rest = in.n < sizeof req - len - 8 ? in.n : sizeof req - len - 8;
        const uint8_t *split = memchr(in.p, 0, rest);
        size_t hlen = split ? (size_t)(split - in.p) : rest;
        memcpy(req + len, in.p, hlen);
        len += hlen;
        if (hlen && req[len - 1] != '\n')
            len += (size_t)snprintf(req + len, sizeof req - len, "\r\n");
        len += (size_t)snprintf(req + len, sizeof req - len, "\r\n");
        if (split) {
            size_t blen = rest - hlen - 1;
            memcpy(req + len, split + 1, blen);
            len += blen;
        }
    }
    size_t got = exchange(req, len, reply, sizeof reply);
    check_reply(reply, got);
    static unsigned runs;
    if (++runs % 64 == 0)
        check_alive();
    return 0;
}
