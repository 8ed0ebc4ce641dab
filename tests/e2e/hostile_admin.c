/*
 * Slow and hostile clients of the admin endpoint: slowloris connections
 * that fill every connection slot, some silent, some dribbling a byte at a
 * time in the head or in the body, and oversized requests. Each ends in bounded time with the right
 * answer, and the endpoint serves normal requests afterwards.
 *
 * The admin runs with max_connections 4 and timeout_s 1, so the bounds
 * below (an order of magnitude above those) are the endpoint's own limits
 * at work, not the test's patience.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "admin_fixture.h"

#define SLOTS 4        /* sluice_admin_desc.max_connections */
#define IDLE_S 1       /* sluice_admin_desc.timeout_s */
#define BOUND_MS 10000 /* "bounded": ten times the idle timeout */

static struct fixture fx;
static int socks[SLOTS + 2];

__attribute__((unused)) static void teardown(void) /* .fini; the TSan stand-in ignores it */
{
    for (size_t i = 0; i < sizeof socks / sizeof socks[0]; i++)
        if (socks[i] > 0) {
            close(socks[i]);
            socks[i] = 0;
        }
    fixture_stop(&fx);
}

#define HOSTILE_ADMIN_TEST(name) Test(hostile_admin, name, .fini = teardown, .timeout = 60)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void start(void)
{
    struct sluice_admin_desc d;
    memset(&d, 0, sizeof d);
    d.max_connections = SLOTS;
    d.max_streams = 1;
    d.timeout_s = IDLE_S;
    fixture_start(&fx, NULL, &d);
}

static int connect_admin(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(sluice_admin_port(fx.admin)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* Has the server closed fd (EOF or reset)? Reads and drops what it sent. */
static bool closed_by_server(int fd)
{
    char buf[4096];
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, 0) > 0) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return true;
        if (n < 0)
            return false;
    }
    return false;
}

/* GET /compute/concurrency over a fresh connection: the HTTP status, 0 if refused or cut. */
static long probe_status(void)
{
    char url[128];
    snprintf(url, sizeof url, "%s/compute/concurrency", fx.base);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, reply_body);
    struct reply r;
    memset(&r, 0, sizeof r);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    reply_free(&r);
    return status;
}

/* The dribbling clients' request head, sent a byte at a time (then 'a' forever). */
static const char dribbled_head[] =
    "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";

/* Wait until every socket in [0, n) is closed by the server, or BOUND_MS; with a
 * `dribble` text, each still-open socket sends one more byte of it every 300 ms
 * meanwhile, then one 'a' every 300 ms. */
static int64_t wait_all_cut(int n, const char *dribble)
{
    size_t len = dribble ? strlen(dribble) : 0;
    int64_t t0 = now_ms(), next_byte = t0;
    size_t sent = 0;
    for (;;) {
        int open = 0;
        for (int i = 0; i < n; i++)
            open += !closed_by_server(socks[i]);
        if (!open)
            return now_ms() - t0;
        cr_assert_lt(now_ms() - t0, BOUND_MS,
                     "%d of %d slow connections still open after %d ms%s", open, n, BOUND_MS,
                     dribble ? " (one byte every 300 ms keeps an idle timeout from firing: the "
                               "endpoint needs a deadline for the whole request)"
                             : "");
        if (dribble && now_ms() >= next_byte) {
            for (int i = 0; i < n; i++)
                send_all(socks[i], sent < len ? &dribble[sent] : "a", 1);
            sent++;
            next_byte += 300;
        }
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
}

HOSTILE_ADMIN_TEST(silent_slowloris_connections_are_cut_after_the_idle_timeout_and_service_resumes)
{
    start();
    cr_assert_eq(probe_status(), 200);
    for (int i = 0; i < SLOTS; i++) {
        socks[i] = connect_admin();
        send_all(socks[i], "GET /compute/concurr", 20); /* then nothing */
    }
    int64_t took = wait_all_cut(SLOTS, NULL);
    cr_log_info("silent slowloris: all %d cut after %lld ms", SLOTS, (long long)took);
    cr_assert_eq(probe_status(), 200, "the endpoint serves again once they are gone");
}

/*
 * libmicrohttpd's connection timeout is an idle timeout: a client that
 * sends one byte every 300 ms (under timeout_s) would hold its slot until
 * max_request_bytes is reached (16 KiB: over an hour), and max_connections
 * such clients would shut the endpoint to everyone. The admin's request
 * deadline (timeout_s for the whole request, enforced from the sampler's
 * tick) cuts them.
 */
HOSTILE_ADMIN_TEST(dribbling_slowloris_connections_are_cut_in_bounded_time_and_service_resumes)
{
    start();
    for (int i = 0; i < SLOTS; i++)
        socks[i] = connect_admin();
    int64_t took = wait_all_cut(SLOTS, dribbled_head);
    cr_log_info("dribbling slowloris: all %d cut after %lld ms", SLOTS, (long long)took);
    cr_assert_eq(probe_status(), 200, "the endpoint serves again once they are gone");
}

/* The deadline covers the whole request, not just its head: a body announced
 * under max_body_bytes but dribbled (4000 bytes at one every 300 ms: 20 min)
 * is cut just the same. */
HOSTILE_ADMIN_TEST(a_dribbled_request_body_is_cut_in_bounded_time_and_service_resumes)
{
    static const char head[] = "POST /compute/concurrency/clear?node_id=n HTTP/1.1\r\n"
                               "Host: 127.0.0.1\r\nContent-Length: 4000\r\n\r\n";
    start();
    for (int i = 0; i < SLOTS; i++) {
        socks[i] = connect_admin();
        send_all(socks[i], head, sizeof head - 1);
    }
    int64_t took = wait_all_cut(SLOTS, "");
    cr_log_info("dribbled bodies: all %d cut after %lld ms", SLOTS, (long long)took);
    cr_assert_eq(probe_status(), 200, "the endpoint serves again once they are gone");
}

HOSTILE_ADMIN_TEST(a_request_head_beyond_max_request_bytes_is_refused_at_once)
{
    start();
    socks[0] = connect_admin();
    char head[8192];
    int n = snprintf(head, sizeof head, "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                        "X-Big: ");
    memset(head + n, 'b', sizeof head - (size_t)n);
    for (int k = 0; k < 4; k++) /* 32 KiB of header against the 16 KiB default */
        send_all(socks[0], head, sizeof head);
    char reply[512] = "";
    int64_t t0 = now_ms();
    size_t len = 0;
    while (len < sizeof reply - 1 && now_ms() - t0 < BOUND_MS) {
        struct pollfd p = {socks[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t got = recv(socks[0], reply + len, sizeof reply - 1 - len, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    reply[len] = '\0';
    cr_assert(strncmp(reply, "HTTP/1.1 431", 12) == 0 || strncmp(reply, "HTTP/1.1 414", 12) == 0,
              "an oversized head gets 431 (or 414): %.80s", reply);
    cr_assert_eq(probe_status(), 200);
}

/* Read one answer to a request on fd (head and Content-Length body); its status, 0 if cut. */
static long read_answer(int fd)
{
    char buf[65536];
    size_t len = 0;
    int64_t t0 = now_ms();
    while (len < sizeof buf - 1 && now_ms() - t0 < BOUND_MS) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t got = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (got <= 0)
            return 0;
        len += (size_t)got;
        buf[len] = '\0';
        const char *end = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "Content-Length: ");
        if (end && cl && (size_t)(end + 4 - buf) + strtoul(cl + 16, NULL, 10) <= len)
            return strtol(buf + 9, NULL, 10);
        if (end && strstr(buf, "text/event-stream"))
            return strtol(buf + 9, NULL, 10); /* a stream: its head is the answer */
    }
    return 0;
}

/*
 * One local client holds every slot the ordinary way: max_streams follow=1
 * streams and kept-alive connections that each had an answer and wait for
 * the next request. The operator still gets in (an idle kept-alive slot is
 * reclaimed), the hog's connections keep working when it asks again on a
 * fresh one, and once only requests in progress fill the endpoint the
 * operator gets a 503 that says so, never a reset.
 */
HOSTILE_ADMIN_TEST(kept_alive_connections_and_streams_cannot_shut_the_operator_out)
{
    start(); /* 4 slots, 1 stream */
    static const char stream[] = "GET /compute/concurrency/events?node_id=cloud:locked&follow=1 "
                                 "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    static const char status[] = "GET /compute/concurrency HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    socks[0] = connect_admin();
    send_all(socks[0], stream, sizeof stream - 1);
    cr_assert_eq(read_answer(socks[0]), 200, "the hog's stream");
    for (int i = 1; i < SLOTS; i++) {
        socks[i] = connect_admin();
        send_all(socks[i], status, sizeof status - 1);
        cr_assert_eq(read_answer(socks[i]), 200, "the hog's kept-alive request %d", i);
    }
    for (int round = 0; round < 6; round++)
        cr_expect_eq(probe_status(), 200, "the operator, round %d, with every slot kept alive", round);
    /* The hog's stream was never the one reclaimed. */
    cr_expect(!closed_by_server(socks[0]), "a stream in progress was cut");
    for (int i = 1; i < SLOTS; i++) {
        close(socks[i]);
        socks[i] = connect_admin();
        send_all(socks[i], "GET /compute/concurr", 20); /* requests under way: not reclaimable */
    }
    usleep(100 * 1000);
    struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 503, "full of requests in progress: %ld %s", r.status, r.body);
    cr_expect(strstr(r.body, "max_connections") != NULL, "it says what to raise: %s", r.body);
    reply_free(&r);
}
