/*
 * Slow and hostile clients of the admin endpoint: slowloris connections
 * that fill every connection slot, some silent, some dribbling a byte at a
 * time in the head or in the body, a client renewing never-ending heads as
 * fast as they are cut, and oversized requests. Each ends in bounded time
 * with the right answer, and the operator is served meanwhile or afterwards.
 *
 * The admin mostly runs with max_connections 4 and timeout_s 1, so the
 * bounds below (an order of magnitude above those) are the endpoint's own
 * limits at work, not the test's patience; the tests of who gets a slot use
 * timeout_s 10, so that the request deadline is not what lets anyone in.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* The admin with `slots` connections, of which `streams` may be event streams, and
 * timeout_s `idle_s`. */
static void start_with(uint32_t slots, uint32_t streams, uint32_t idle_s)
{
    struct sluice_admin_desc d;
    memset(&d, 0, sizeof d);
    d.max_connections = slots;
    d.max_streams = streams;
    d.timeout_s = idle_s;
    fixture_start(&fx, NULL, &d);
}

static void start(void)
{
    start_with(SLOTS, 1, IDLE_S);
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

/* `method` `path` over a fresh connection: the HTTP status, 0 if refused or cut (then
 * `why`, if not NULL, says how). */
static long probe(const char *method, const char *path, char *why, size_t why_size)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", fx.base, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, reply_body);
    struct reply r;
    memset(&r, 0, sizeof r);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    long status = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else if (why)
        snprintf(why, why_size, "%s", curl_easy_strerror(rc));
    curl_easy_cleanup(c);
    reply_free(&r);
    return status;
}

/* GET /compute/concurrency over a fresh connection: the HTTP status, 0 if refused or cut. */
static long probe_status(void)
{
    return probe("GET", "/compute/concurrency", NULL, 0);
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
    start_with(SLOTS, 1, 10); /* 4 slots, 1 stream; no deadline cuts within the test */
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
    /* Heads that never end are not requests in progress: once past their grace the
     * operator takes one's slot (before the fix: 503, the endpoint "full"). */
    for (int i = 1; i < SLOTS; i++) {
        close(socks[i]);
        socks[i] = connect_admin();
        send_all(socks[i], "GET /compute/concurr", 20);
    }
    usleep(100 * 1000);
    char why[CURL_ERROR_SIZE] = "";
    cr_expect_eq(probe("GET", "/compute/concurrency", why, sizeof why), 200,
                 "the operator behind %d never-ending heads and a stream: %s", SLOTS - 1, why);
    cr_expect(!closed_by_server(socks[0]), "a stream in progress was cut");
}

/* Only requests that have arrived fill the endpoint: with every slot an event stream,
 * the operator hears a JSON 503 naming max_connections, not a reset. */
HOSTILE_ADMIN_TEST(an_endpoint_full_of_streams_answers_503_not_a_reset)
{
    start_with(2, 2, 10);
    static const char stream[] = "GET /compute/concurrency/events?node_id=cloud:locked&follow=1 "
                                 "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (int i = 0; i < 2; i++) {
        socks[i] = connect_admin();
        send_all(socks[i], stream, sizeof stream - 1);
        cr_assert_eq(read_answer(socks[i]), 200, "stream %d", i);
    }
    struct reply r = http("GET", fx.base, "/compute/concurrency", NULL, NULL);
    cr_expect_eq(r.status, 503, "full of streams: %ld %s", r.status, r.body);
    cr_expect(strstr(r.body, "max_connections") != NULL, "it says what to raise: %s", r.body);
    reply_free(&r);
    for (int i = 0; i < 2; i++)
        cr_expect(!closed_by_server(socks[i]), "stream %d was cut", i);
}

/* ---- a client that renews never-ending heads as fast as they are cut ---------------- */

#define HOG_SLOTS 8                  /* sluice_admin_desc.max_connections */
#define HOG_CONNS (HOG_SLOTS + 8 + 4) /* past max_connections and the 8 spare 503 slots */

static int hog_fds[HOG_CONNS];
static atomic_bool hog_stop;
static atomic_uint hog_renewals;

/* A raw connect (no Criterion assert: this runs on the hog's thread); -1 on failure. */
static int hog_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Keep HOG_CONNS connections open, each a request head that never ends (a byte every
 * 300 ms, so no idle timeout fires), and reconnect each the moment it is cut. */
static void *hog_main(void *arg)
{
    uint16_t port = (uint16_t)(uintptr_t)arg;
    int64_t next_byte = now_ms();
    while (!atomic_load(&hog_stop)) {
        bool dribble = now_ms() >= next_byte;
        for (int i = 0; i < HOG_CONNS; i++) {
            if (hog_fds[i] > 0 && !closed_by_server(hog_fds[i])) {
                if (dribble)
                    send_all(hog_fds[i], "a", 1);
                continue;
            }
            if (hog_fds[i] > 0) {
                close(hog_fds[i]);
                atomic_fetch_add(&hog_renewals, 1);
            }
            hog_fds[i] = hog_connect(port);
            if (hog_fds[i] > 0)
                send_all(hog_fds[i], dribbled_head, sizeof dribbled_head - 1);
        }
        if (dribble)
            next_byte += 300;
        nanosleep(&(struct timespec){0, 5 * 1000000L}, NULL);
    }
    return NULL;
}

/*
 * The first integrator's attack: one local client holds more never-ending request
 * heads than the endpoint has connections (max_connections and the 8 spare) and
 * renews each as soon as it is cut. Before the fix libmicrohttpd's own limit was
 * full and the operator's connections were closed unanswered (1 answer in 43
 * tries); now each head gets half a second, the listener takes newcomers in order,
 * and the operator's GET status and POST clear are answered. The idle timeout is
 * 10 s, longer than the test: the request deadline is not what lets it in.
 */
HOSTILE_ADMIN_TEST(a_client_renewing_never_ending_heads_cannot_shut_the_operator_out)
{
    start_with(HOG_SLOTS, 1, 10);
    atomic_store(&hog_stop, false);
    atomic_store(&hog_renewals, 0);
    pthread_t hog;
    cr_assert_eq(pthread_create(&hog, NULL, hog_main, (void *)(uintptr_t)sluice_admin_port(fx.admin)),
                 0);
    usleep(300 * 1000); /* every connection open, the endpoint full of heads */
    int answered = 0, tries = 0;
    for (int round = 0; round < 2; round++) {
        static const struct {
            const char *method, *path;
        } asks[] = {{"GET", "/compute/concurrency"},
                    {"POST", "/compute/concurrency/clear?node_id=cloud:locked"}};
        for (size_t k = 0; k < sizeof asks / sizeof asks[0]; k++) {
            char why[CURL_ERROR_SIZE] = "";
            long status = probe(asks[k].method, asks[k].path, why, sizeof why);
            tries++;
            answered += status == 200;
            cr_expect_eq(status, 200, "round %d: %s %s got %ld %s", round, asks[k].method,
                         asks[k].path, status, why);
        }
    }
    atomic_store(&hog_stop, true);
    pthread_join(hog, NULL);
    cr_log_info("renewing hog: %d of %d operator requests answered, %u renewals", answered,
                tries, atomic_load(&hog_renewals));
    cr_expect_gt(atomic_load(&hog_renewals), 0, "the hog was never cut: the test proves nothing");
    for (int i = 0; i < HOG_CONNS; i++)
        if (hog_fds[i] > 0) {
            close(hog_fds[i]);
            hog_fds[i] = 0;
        }
}
