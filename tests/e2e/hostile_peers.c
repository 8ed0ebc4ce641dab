/*
 * Hostile providers: what a peer can do to the transport, and that every
 * such call ends in bounded time with the right status and gives its
 * admission and permit back.
 *
 * A raw socket server in this file plays the peers libmicrohttpd would never
 * be: a response that never starts, a body that never finishes, a 429 whose
 * Retry-After is negative, overflowing, garbage or a date far ahead, and a
 * connection reset (RST) mid-body. The provider simulator plays a provider
 * that silently drops calls past its cap (--mode drop) and one whose 429s
 * carry an HTTP-date a day ahead.
 *
 * "Bounded" is an order of magnitude: a 300 ms deadline ends the call in
 * well under 5 s. "Capacity intact": the backend's pool is idle, exactly its
 * limit + waiting admissions and its limit of permits can be taken
 * (assert_capacity_intact), and a normal call afterwards succeeds.
 */
#define _GNU_SOURCE
#include <netinet/tcp.h>

#include "e2e/curl_fixture.h"
#include "run_fixtures.h"

#include <sluice/client.h>

/* ---- the raw server -------------------------------------------------------------- */

enum raw_script {
    RAW_OK,             /* 200 with a small JSON body, keep-alive */
    RAW_SILENT,         /* read the request, never answer */
    RAW_STALL_BODY,     /* headers promise 1000 bytes, 10 come, then nothing */
    RAW_RESET_MID_BODY, /* headers promise 1000 bytes, 100 come, then RST */
    RAW_429,            /* 429 with Retry-After: raw.retry_after */
    RAW_ENDLESS,        /* 200, chunked, a body that never ends (no length) */
    RAW_HUGE_LENGTH,    /* 200 whose Content-Length says 1 TiB, then bytes without end */
};

#define RAW_CONNS 64

struct raw_server {
    int fd, port;
    pthread_t acceptor;
    bool running;
    _Atomic(int) stop, script, requests;
    _Atomic(long long) endless_sent; /* body bytes the endless scripts got out */
    char retry_after[160]; /* written only while no request is in flight */
    pthread_mutex_t mu;
    int conn_fd[RAW_CONNS];
    pthread_t conn_thread[RAW_CONNS];
    int n_conns;
};

static struct raw_server raw = {.fd = -1};

/* Wait up to 50 ms for fd to be readable; false when the server stops. */
static bool raw_wait_readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return !atomic_load(&raw.stop) && poll(&p, 1, 50) >= 0;
}

/* Read one request (headers and a Content-Length body); false on EOF or stop. */
static bool raw_read_request(int fd)
{
    char buf[8192];
    size_t len = 0;
    long body = -1;
    for (;;) {
        if (!raw_wait_readable(fd))
            return false;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            return false;
        len += (size_t)n;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && body < 0) {
            char *cl = strcasestr(buf, "\r\nContent-Length:");
            body = cl && cl < end ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (end && (long)(len - (size_t)(end + 4 - buf)) >= body)
            return true;
        if (len == sizeof buf - 1)
            return false;
    }
}

static void raw_send(int fd, const char *s)
{
    size_t len = strlen(s);
    while (len) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        s += n;
        len -= (size_t)n;
    }
}

/* Hold the connection open, reading and dropping, until the client leaves or we stop. */
static void raw_hold(int fd)
{
    char sink[512];
    while (raw_wait_readable(fd)) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0 && read(fd, sink, sizeof sink) <= 0)
            return;
    }
}

/* Body bytes, as fast as the client takes them, until it leaves or we stop. */
static void raw_send_forever(int fd, bool chunked)
{
    static char block[1 << 16];
    memset(block, 'x', sizeof block);
    char head[16];
    snprintf(head, sizeof head, "%zx\r\n", sizeof block);
    while (!atomic_load(&raw.stop)) {
        if (chunked && send(fd, head, strlen(head), MSG_NOSIGNAL) <= 0)
            return;
        ssize_t n = send(fd, block, sizeof block, MSG_NOSIGNAL);
        if (n <= 0 || (chunked && send(fd, "\r\n", 2, MSG_NOSIGNAL) <= 0))
            return;
        atomic_fetch_add(&raw.endless_sent, (long long)n);
    }
}

static void *raw_conn_main(void *arg)
{
    int slot = (int)(intptr_t)arg;
    pthread_mutex_lock(&raw.mu);
    int fd = raw.conn_fd[slot];
    pthread_mutex_unlock(&raw.mu);
    while (raw_read_request(fd)) {
        atomic_fetch_add(&raw.requests, 1);
        char head[512];
        switch (atomic_load(&raw.script)) {
        case RAW_OK:
            raw_send(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: 11\r\n\r\n{\"ok\":true}");
            continue;
        case RAW_429:
            pthread_mutex_lock(&raw.mu);
            snprintf(head, sizeof head,
                     "HTTP/1.1 429 Too Many Requests\r\nRetry-After: %s\r\n"
                     "Content-Length: 0\r\n\r\n",
                     raw.retry_after);
            pthread_mutex_unlock(&raw.mu);
            raw_send(fd, head);
            continue;
        case RAW_SILENT:
            raw_hold(fd);
            return NULL;
        case RAW_ENDLESS:
            raw_send(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n");
            raw_send_forever(fd, true);
            return NULL;
        case RAW_HUGE_LENGTH:
            raw_send(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1099511627776\r\n\r\n");
            raw_send_forever(fd, false);
            return NULL;
        case RAW_STALL_BODY:
            raw_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789");
            raw_hold(fd);
            return NULL;
        case RAW_RESET_MID_BODY: {
            raw_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
            char part[101];
            memset(part, 'x', 100);
            part[100] = '\0';
            raw_send(fd, part);
            struct linger lg = {1, 0}; /* close sends RST, not FIN */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            pthread_mutex_lock(&raw.mu);
            close(fd);
            raw.conn_fd[slot] = -1; /* raw_stop must not close a reused number */
            pthread_mutex_unlock(&raw.mu);
            return NULL;
        }
        }
    }
    return NULL;
}

static void *raw_accept_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&raw.stop)) {
        struct pollfd p = {raw.fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept4(raw.fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        pthread_mutex_lock(&raw.mu);
        if (raw.n_conns == RAW_CONNS) {
            pthread_mutex_unlock(&raw.mu);
            close(c);
            continue;
        }
        int i = raw.n_conns++;
        raw.conn_fd[i] = c;
        pthread_create(&raw.conn_thread[i], NULL, raw_conn_main, (void *)(intptr_t)i);
        pthread_mutex_unlock(&raw.mu);
    }
    return NULL;
}

static void raw_start(enum raw_script script)
{
    memset(&raw, 0, sizeof raw);
    pthread_mutex_init(&raw.mu, NULL);
    atomic_store(&raw.script, script);
    raw.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(raw.fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    cr_assert_eq(bind(raw.fd, (struct sockaddr *)&a, sizeof a), 0, "bind: %s", strerror(errno));
    cr_assert_eq(listen(raw.fd, 64), 0);
    getsockname(raw.fd, (struct sockaddr *)&a, &alen);
    raw.port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&raw.acceptor, NULL, raw_accept_main, NULL), 0);
    raw.running = true;
}

/* Stop the acceptor and every connection thread; safe to call twice and from .fini. */
static void raw_stop(void)
{
    if (!raw.running)
        return;
    atomic_store(&raw.stop, 1);
    pthread_join(raw.acceptor, NULL);
    for (int i = 0; i < raw.n_conns; i++) {
        pthread_mutex_lock(&raw.mu);
        if (raw.conn_fd[i] >= 0)
            shutdown(raw.conn_fd[i], SHUT_RDWR);
        pthread_mutex_unlock(&raw.mu);
        pthread_join(raw.conn_thread[i], NULL);
        if (raw.conn_fd[i] >= 0)
            close(raw.conn_fd[i]);
    }
    close(raw.fd);
    raw.fd = -1;
    raw.running = false;
}

static void raw_set_retry_after(const char *value)
{
    pthread_mutex_lock(&raw.mu);
    snprintf(raw.retry_after, sizeof raw.retry_after, "%s", value);
    pthread_mutex_unlock(&raw.mu);
}

static CURL *raw_easy(void)
{
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", raw.port);
    return fx_easy_url(url);
}

__attribute__((unused)) static void teardown(void) /* .fini; the TSan stand-in ignores it */
{
    raw_stop();
    fx_teardown();
}

#define HOSTILE_TEST(name)                                                                         \
    Test(hostile_peers, name, .init = fx_setup, .fini = teardown, .timeout = 60)

/* ---- what every case checks afterwards ----------------------------------------------- */

/* The pool is idle, its whole capacity usable, and a normal call goes through. */
static void assert_recovered(struct sluice_engine *e, CURL *(*make)(void))
{
    fx_assert_idle(e);
    assert_capacity_intact(sluice_engine_pool(e, FX_BACKEND));
    if (make == raw_easy)
        atomic_store(&raw.script, RAW_OK);
    CURL *easy = make();
    struct sluice_curl_result r;
    struct timespec dl = deadline_in(5 * SLUICE_NS_PER_SEC);
    cr_assert_eq(sluice_curl_perform(e, FX_BACKEND, easy, &dl, NULL, &r), SLUICE_OK,
                 "a normal call after the hostile one: %s (curl %d)",
                 sluice_status_name(r.status), (int)r.curl_code);
    cr_assert_eq(r.http_status, 200);
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
}

/* A blocking call with a deadline `ms` from now (or none, with CURLOPT_TIMEOUT_MS = ms);
 * returns how long it took, in ms, and checks it ended within 10x + 2 s. */
static int64_t timed_perform(struct sluice_engine *e, CURL *easy, int ms, bool deadline,
                             struct sluice_curl_result *r)
{
    struct timespec dl = deadline_in((int64_t)ms * SLUICE_NS_PER_MS);
    if (!deadline)
        curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)ms);
    int64_t t0 = fx_now_ms();
    int status = sluice_curl_perform(e, FX_BACKEND, easy, deadline ? &dl : NULL, NULL, r);
    int64_t took = fx_now_ms() - t0;
    cr_assert_eq(status, r->status);
    cr_assert_lt(took, 10 * ms + 2000, "the call took %lld ms for a %d ms bound", (long long)took,
                 ms);
    return took;
}

/* ---- responses that never finish ---------------------------------------------------- */

HOSTILE_TEST(a_response_that_never_starts_ends_at_the_deadline_or_the_curl_timeout)
{
    raw_start(RAW_SILENT);
    struct sluice_engine *e = fx_engine(2, 1, NULL);
    CURL *easy = raw_easy();
    struct sluice_curl_result r;
    timed_perform(e, easy, 300, true, &r);
    cr_assert_eq(r.status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(r.status));
    cr_assert_eq(r.kind, SLUICE_CURL_ABORTED, "%s", sluice_curl_kind_name(r.kind));
    fx_assert_idle(e);
    /* Without a deadline the caller's own timeout is the provider's: an overload sample. */
    timed_perform(e, easy, 300, false, &r);
    cr_assert_eq(r.status, SLUICE_EIO, "%s", sluice_status_name(r.status));
    cr_assert_eq(r.kind, SLUICE_CURL_PROVIDER_TIMEOUT, "%s", sluice_curl_kind_name(r.kind));
    cr_assert_eq(r.outcome, SLUICE_OUTCOME_OVERLOAD);
    curl_easy_cleanup(easy);
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

HOSTILE_TEST(a_body_that_never_finishes_ends_at_the_deadline_or_the_curl_timeout)
{
    raw_start(RAW_STALL_BODY);
    struct sluice_engine *e = fx_engine(2, 1, NULL);
    CURL *easy = raw_easy();
    struct sluice_curl_result r;
    timed_perform(e, easy, 300, true, &r);
    cr_assert_eq(r.status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(r.status));
    cr_assert_eq(r.kind, SLUICE_CURL_ABORTED);
    timed_perform(e, easy, 300, false, &r);
    cr_assert_eq(r.status, SLUICE_EIO);
    cr_assert_eq(r.kind, SLUICE_CURL_PROVIDER_TIMEOUT, "%s", sluice_curl_kind_name(r.kind));
    curl_easy_cleanup(easy);
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

/* The chat client keeps at most SLUICE_CHAT_REPLY_MAX bytes of a body: past it the
 * transfer ends (no deadline needed), SLUICE_EIO with a message; a Content-Length above
 * the cap is refused before the body is read. The 20 s deadline only bounds a failure. */
static void chat_against_raw(enum raw_script script)
{
    raw_start(script);
    struct sluice_engine *e = fx_engine(2, 1, NULL);
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/v1", raw.port);
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.base_url = base, .model = "m",
                                                               .prompt = "hi"},
                                    &chat),
                 SLUICE_OK);
    struct timespec dl = deadline_in(20 * SLUICE_NS_PER_SEC);
    struct sluice_run_result rr;
    int status = sluice_run(e,
                            &(struct sluice_run_desc){.backend = FX_BACKEND,
                                                      .ops = &sluice_chat_ops,
                                                      .ctx = chat,
                                                      .deadline = &dl},
                            &rr);
    const struct sluice_curl_result *cr = sluice_chat_result(chat);
    cr_assert_eq(status, SLUICE_ECLIENT, "run: %s", sluice_status_name(status));
    cr_assert_eq(rr.client_status, SLUICE_EIO, "client: %s (curl %d)",
                 sluice_status_name(rr.client_status), (int)cr->curl_code);
    cr_assert(strstr(cr->error, "SLUICE_CHAT_REPLY_MAX"), "message: \"%s\"", cr->error);
    cr_assert_eq(cr->outcome, SLUICE_OUTCOME_IGNORE, "a big body says nothing about capacity");
    if (script == RAW_HUGE_LENGTH)
        cr_assert_eq(cr->curl_code, CURLE_FILESIZE_EXCEEDED, "curl %d: read before refusing",
                     (int)cr->curl_code);
    /* The client stopped reading: what got out is the cap plus what socket buffers hold. */
    long long sent = atomic_load(&raw.endless_sent);
    cr_assert_lt(sent, 2LL * SLUICE_CHAT_REPLY_MAX, "%lld bytes sent", sent);
    sluice_chat_destroy(chat);
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

HOSTILE_TEST(an_endless_body_ends_the_chat_generation_at_the_reply_cap)
{
    chat_against_raw(RAW_ENDLESS);
}

HOSTILE_TEST(a_content_length_above_the_reply_cap_is_refused_before_the_body)
{
    chat_against_raw(RAW_HUGE_LENGTH);
}

struct loop_done {
    _Atomic(int) done;
    struct sluice_curl_result r;
};

static void on_loop_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    (void)easy;
    struct loop_done *d = data;
    d->r = *r;
    atomic_store(&d->done, 1);
}

HOSTILE_TEST(the_event_loop_ends_stalled_transfers_at_their_deadlines_and_keeps_its_capacity)
{
    raw_start(RAW_STALL_BODY);
    struct sluice_engine *e = fx_engine(2, 4, NULL);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    enum { N = 4 }; /* twice the limit: two stall in transfer, two wait for a permit */
    struct loop_done d[N];
    CURL *easy[N];
    struct timespec dl = deadline_in(400 * SLUICE_NS_PER_MS);
    int64_t t0 = fx_now_ms();
    for (int i = 0; i < N; i++) {
        memset(&d[i], 0, sizeof d[i]);
        easy[i] = raw_easy();
        struct sluice_curl_request rq = {.backend = FX_BACKEND, .easy = easy[i], .deadline = &dl,
                                         .done = on_loop_done, .data = &d[i]};
        cr_assert_eq(sluice_curl_loop_submit(loop, &rq, NULL), SLUICE_OK);
    }
    for (int i = 0; i < N; i++) {
        while (!atomic_load(&d[i].done)) {
            cr_assert_lt(fx_now_ms() - t0, 6000, "request %d never completed", i);
            fx_sleep_ms(5);
        }
        cr_assert_eq(d[i].r.status, SLUICE_ETIMEDOUT, "request %d: %s", i,
                     sluice_status_name(d[i].r.status));
    }
    struct sluice_curl_loop_counts ls = sluice_curl_loop_stats(loop);
    cr_assert_eq(ls.live, 0);
    sluice_curl_loop_destroy(loop);
    for (int i = 0; i < N; i++)
        curl_easy_cleanup(easy[i]);
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

/* ---- a connection reset mid-body ------------------------------------------------------ */

HOSTILE_TEST(a_connection_reset_mid_body_is_a_transport_failure_that_frees_the_permit)
{
    raw_start(RAW_RESET_MID_BODY);
    struct sluice_engine *e = fx_engine(1, 0, NULL);
    for (int i = 0; i < 3; i++) { /* a lost permit would block the second call forever */
        CURL *easy = raw_easy();
        struct sluice_curl_result r;
        timed_perform(e, easy, 2000, true, &r);
        cr_assert_eq(r.status, SLUICE_EIO, "%s (curl %d)", sluice_status_name(r.status),
                     (int)r.curl_code);
        cr_assert_eq(r.kind, SLUICE_CURL_TRANSPORT, "%s", sluice_curl_kind_name(r.kind));
        cr_assert_eq(r.outcome, SLUICE_OUTCOME_IGNORE, "a reset says nothing about the cap");
        curl_easy_cleanup(easy);
        fx_assert_idle(e);
    }
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

/* ---- absurd Retry-After values -------------------------------------------------------- */

#define RA_CLAMP_NS (60 * SLUICE_NS_PER_SEC) /* the transport's default clamp */

static const struct {
    const char *value;
    int64_t want_ns; /* -1: the clamp */
} absurd[] = {
    {"-5", 0},
    {"-99999999999999999999", 0},
    {"99999999999999999999", -1},
    {"18446744073709551616", -1},
    {"86400000", -1},
    {"Fri, 31 Dec 9999 23:59:59 GMT", -1},
    {"Thu, 01 Jan 1970 00:00:00 GMT", 0},
    {"Sun, 06 Nov 1994 08:49:37 GMT", 0},
    {"garbage", 0},
    {"1e9", 0},
    {"12abc", 0},
    {"", 0},
    {"0", 0},
};

HOSTILE_TEST(absurd_retry_after_values_are_clamped_and_never_stall_the_backend)
{
    raw_start(RAW_429);
    struct sluice_discovery_desc dd = fx_discovery();
    dd.retry_after_max_ns = 200 * SLUICE_NS_PER_MS; /* how long discovery honours a hold */
    struct sluice_engine *e = fx_engine(4, 4, &dd);
    CURL *easy = raw_easy();
    for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
        raw_set_retry_after(absurd[i].value);
        atomic_store(&raw.script, RAW_429);
        struct sluice_curl_result r;
        timed_perform(e, easy, 2000, true, &r);
        cr_assert_eq(r.status, SLUICE_OK, "Retry-After \"%s\": %s", absurd[i].value,
                     sluice_status_name(r.status));
        cr_assert_eq(r.kind, SLUICE_CURL_OVERLOADED);
        int64_t want = absurd[i].want_ns < 0 ? RA_CLAMP_NS : absurd[i].want_ns;
        cr_expect_eq(r.retry_after_ns, want,
                     "Retry-After \"%s\": %lld ns, want %lld (negative, garbage and past = 0, "
                     "overflowing and far dates = the clamp)",
                     absurd[i].value, (long long)r.retry_after_ns, (long long)want);
        cr_assert(r.retry_after_ns >= 0 && r.retry_after_ns <= RA_CLAMP_NS);
        /* The next call waits out at most discovery's retry_after_max_ns, not the header. */
        atomic_store(&raw.script, RAW_OK);
        int64_t took = timed_perform(e, easy, 3000, true, &r);
        cr_assert_eq(r.status, SLUICE_OK, "after \"%s\": %s", absurd[i].value,
                     sluice_status_name(r.status));
        cr_assert_eq(r.http_status, 200);
        cr_assert_lt(took, 2000, "after \"%s\" the next call waited %lld ms", absurd[i].value,
                     (long long)took);
    }
    curl_easy_cleanup(easy);
    assert_recovered(e, raw_easy);
    sluice_engine_destroy(e);
}

/* ---- against the simulator ------------------------------------------------------------ */

struct sim_caller {
    struct sluice_engine *e;
    struct sluice_curl_result r;
    int64_t took_ms;
};

static void *sim_caller_main(void *arg)
{
    struct sim_caller *c = arg;
    CURL *easy = fx_easy();
    struct timespec dl = deadline_in(500 * SLUICE_NS_PER_MS);
    int64_t t0 = fx_now_ms();
    sluice_curl_perform(c->e, FX_BACKEND, easy, &dl, NULL, &c->r);
    c->took_ms = fx_now_ms() - t0;
    curl_easy_cleanup(easy);
    return NULL;
}

HOSTILE_TEST(calls_a_provider_silently_drops_end_at_their_deadlines_on_both_sides)
{
    fx_start(&(struct fx_provider){.mode = "drop", .cap = 1, .median_ms = 10000});
    struct sluice_engine *e = fx_engine(4, 0, NULL);
    enum { N = 4 };
    struct sim_caller c[N];
    for (int i = 0; i < N; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].e = e;
    }
    test_run_threads(N, sim_caller_main, c, sizeof c[0]);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(c[i].r.status, SLUICE_ETIMEDOUT, "caller %d: %s", i,
                     sluice_status_name(c[i].r.status));
        cr_assert_lt(c[i].took_ms, 5000, "caller %d took %lld ms", i, (long long)c[i].took_ms);
    }
    fx_assert_idle(e);
    assert_capacity_intact(sluice_engine_pool(e, FX_BACKEND));
    /* The simulator saw every caller hang up: nothing of ours is left in it. */
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.in_flight, 0, "the simulator still holds %ld calls", s.in_flight);
    cr_assert_eq(s.cancelled, N, "the simulator saw %ld hang-ups", s.cancelled);
    sluice_engine_destroy(e);
}

HOSTILE_TEST(a_retry_after_date_a_day_ahead_is_clamped_and_the_backend_recovers)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = FX_ZERO, .retry_after = 86400,
                                   .retry_after_date = true});
    struct sluice_discovery_desc dd = fx_discovery();
    dd.retry_after_max_ns = 200 * SLUICE_NS_PER_MS;
    struct sluice_engine *e = fx_engine(4, 4, &dd);
    CURL *easy = fx_easy();
    for (int i = 0; i < 3; i++) {
        struct sluice_curl_result r;
        timed_perform(e, easy, 3000, true, &r);
        cr_assert_eq(r.status, SLUICE_OK, "%s", sluice_status_name(r.status));
        cr_assert_eq(r.http_status, 429);
        cr_assert_eq(r.retry_after_ns, RA_CLAMP_NS, "a day ahead is the clamp: %lld",
                     (long long)r.retry_after_ns);
    }
    curl_easy_cleanup(easy);
    fx_assert_idle(e);
    assert_capacity_intact(sluice_engine_pool(e, FX_BACKEND));
    sluice_engine_destroy(e);
}
