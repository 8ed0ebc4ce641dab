/*
 * http_discovery_cases.c — ceiling discovery over real HTTP: how often a lock lands inside the band when
 * real programs drive sluice against sluice-provider-sim on loopback.
 *
 * Cases, discovery.http.<driver>.<provider>:
 *   drivers
 *     probe     `sluicectl probe URL --method POST --json` with its defaults
 *               (128 workers, default discovery), as a new user runs it
 *     closed64  64 blocking threads in this process on one adaptive
 *               backend (default discovery, active 256): half call
 *               sluice_curl_perform, half the built-in chat client
 *               (sluice_run + sluice_chat_ops); each starts its next call
 *               the moment the last one ends, a refusal included
 *   providers                                              band
 *     reject_c16, reject_c24, reject_c52   429 past C,     [0.85·C, C]
 *                                          200 ms median
 *     queue503_c10, queue503_c48           FIFO past C, no [0.8·C, 1.25·C]
 *                                          bound, 503 after 100 ms
 *                                          waiting (--queue-timeout 100),
 *                                          100 ms median
 * Service times are the simulator's lognormal (sigma 0.4); each run gets
 * its own seed.
 *
 * A run ends at the lock or after HTTP_RUN_LIMIT_S; a run that did not lock
 * is a miss (printed as "-"). Each row prints how many runs locked inside
 * the band and every locked value; its JSON row carries runs, in_band,
 * no_lock, cap, band_lo, band_hi, lock_min, lock_median, lock_max and busy.
 *
 * Environment:
 *   SLUICE_BENCH_HTTP_RUNS  runs per row (default 20; --quick: 5)
 *   SLUICE_BENCH_HTTP_SEED  added to every run's simulator seed, for a
 *                           second batch of other runs (default 0)
 *   SLUICE_BENCH_BUSY       busy-loop processes kept running during the
 *                           runs: 0, 1, 2, or "issue" (1 for probe rows, 2
 *                           for closed64 rows: the machine of the issue,
 *                           where other processes keep one core busy, and
 *                           both for the 64-thread client) (default 0)
 *
 * Not a default case (it runs for minutes): `sluice-bench --only-discovery
 * --filter discovery.http`. Built only with the shim (SLUICE_BENCH_CURL)
 * and sluicectl (SLUICE_BENCH_SLUICECTL_PATH).
 */
#include "harness.h"

#if defined(SLUICE_BENCH_CURL) && defined(SLUICE_BENCH_SLUICECTL_PATH)

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/client.h>
#include <sluice/curl.h>

#include "sluice-provider-sim/sim_process.h"

#define HTTP_RUN_LIMIT_S 30      /* a run that has not locked by then is a miss */
#define HTTP_PROBE_KILL_MS 45000 /* sluicectl stops itself at HTTP_RUN_LIMIT_S; this is the backstop */
#define HTTP_RUNS_DEFAULT 20
#define HTTP_RUNS_QUICK 5
#define HTTP_RUNS_MAX 200
#define HTTP_THREADS 64
#define HTTP_MAX_BUSY 2
#define HTTP_CALL_TIMEOUT_MS 30000L
#define HTTP_BODY "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

struct http_provider {
    const char *name;
    const char *mode;
    uint32_t cap;
    const char *median_ms;
    double band_lo, band_hi; /* fractions of the cap */
};

static const struct http_provider http_providers[] = {
    {"reject_c16", "reject", 16, "200", 0.85, 1.0},
    {"reject_c24", "reject", 24, "200", 0.85, 1.0},
    {"reject_c52", "reject", 52, "200", 0.85, 1.0},
    {"queue503_c10", "queue", 10, "100", 0.8, 1.25},
    {"queue503_c48", "queue", 48, "100", 0.8, 1.25},
};

enum http_driver { HTTP_PROBE, HTTP_CLOSED64 };
static const char *const http_driver_names[] = {"probe", "closed64"};

/* ---- the stage: simulator and busy loops -------------------------------------------- */

static bool http_sim_start(struct sim_process *sim, const struct http_provider *p, int seed)
{
    char cap[16], seed_s[16];
    snprintf(cap, sizeof cap, "%u", p->cap);
    snprintf(seed_s, sizeof seed_s, "%d", seed);
    const char *reject[] = {"--mode", "reject", "--cap", cap, "--median-ms", p->median_ms,
                            "--seed", seed_s, NULL};
    const char *queue[] = {"--mode", "queue", "--cap", cap, "--median-ms", p->median_ms,
                           "--queue-timeout", "100", "--queue-bound", "1000000", "--seed",
                           seed_s, NULL};
    return sim_process_start(sim, strcmp(p->mode, "queue") ? reject : queue) == 0;
}

/* Busy loops for a row of `driver` (SLUICE_BENCH_BUSY). */
static int http_busy_count(enum http_driver driver)
{
    const char *env = getenv("SLUICE_BENCH_BUSY");
    if (env && !strcmp(env, "issue"))
        return driver == HTTP_PROBE ? 1 : 2;
    return bench_busy_count(HTTP_MAX_BUSY);
}

static int http_runs(const struct bench_opts *opts)
{
    return bench_env_int("SLUICE_BENCH_HTTP_RUNS",
                         opts->scale < 1.0 ? HTTP_RUNS_QUICK : HTTP_RUNS_DEFAULT, 1, HTTP_RUNS_MAX);
}

/* ---- driver: sluicectl probe ---------------------------------------------------------- */

/* The locked ceiling `sluicectl probe --json` reports; 0 when it did not lock. */
static uint32_t http_run_probe(const char *url)
{
    int out[2];
    if (!sim__pipe(out))
        return 0;
    char limit[16];
    snprintf(limit, sizeof limit, "%d", HTTP_RUN_LIMIT_S);
    pid_t pid = fork();
    if (pid == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
        int devnull = open("/dev/null", O_RDWR);
        if (dup2(out[1], STDOUT_FILENO) < 0 || devnull < 0 || dup2(devnull, STDERR_FILENO) < 0 ||
            dup2(devnull, STDIN_FILENO) < 0)
            _exit(127);
        execl(SLUICE_BENCH_SLUICECTL_PATH, "sluicectl", "probe", url, "--method", "POST", "--json",
              "--timeout", limit, "--requests", "1000000", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    static char buf[1 << 20];
    size_t len = 0;
    int64_t deadline = sim__ms() + HTTP_PROBE_KILL_MS;
    while (pid > 0 && len + 1 < sizeof buf) {
        struct pollfd p = {out[0], POLLIN, 0};
        int64_t left = deadline - sim__ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        ssize_t got = read(out[0], buf + len, sizeof buf - 1 - len);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    close(out[0]);
    if (pid > 0) {
        kill(pid, SIGKILL); /* a no-op once it has exited */
        waitpid(pid, NULL, 0);
    }
    const char *locked = strstr(buf, "\"locked\": true");
    const char *found = strstr(buf, "\"discovered_ceiling\":");
    unsigned n = 0;
    if (!locked || !found || sscanf(found, "\"discovered_ceiling\": %u", &n) != 1)
        return 0;
    return n;
}

/* ---- driver: 64 blocking threads -------------------------------------------------------- */

struct http_closed {
    struct sluice_engine *engine;
    char url[96], base[96];
    struct sluice_cancel cancel;
    atomic_bool stop;
};

static size_t http_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* A handle that POSTs the chat body to c->url and discards the answer. */
static CURL *http_easy(const struct http_closed *c)
{
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, c->url);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, HTTP_BODY);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, http_discard);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, HTTP_CALL_TIMEOUT_MS);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

static void *http_perform_thread(void *arg)
{
    struct http_closed *c = arg;
    CURL *easy = http_easy(c);
    while (!atomic_load(&c->stop)) {
        struct sluice_curl_result r;
        sluice_curl_perform(c->engine, "sim", easy, NULL, &c->cancel, &r);
    }
    curl_easy_cleanup(easy);
    return NULL;
}

static void *http_chat_thread(void *arg)
{
    struct http_closed *c = arg;
    struct sluice_chat *chat = NULL;
    if (sluice_chat_create(&(struct sluice_chat_desc){.base_url = c->base, .model = "m",
                                                      .prompt = "hi"},
                           &chat) != SLUICE_OK)
        return NULL;
    while (!atomic_load(&c->stop)) {
        struct sluice_run_result rr;
        sluice_run(c->engine,
                   &(struct sluice_run_desc){.backend = "sim", .ops = &sluice_chat_ops,
                                             .ctx = chat, .cancel = &c->cancel},
                   &rr);
    }
    sluice_chat_destroy(chat);
    return NULL;
}

/* The locked ceiling after at most HTTP_RUN_LIMIT_S of 64 blocking callers; 0 = no lock. */
static uint32_t http_run_closed64(const struct sim_process *sim)
{
    static struct http_closed c; /* one run at a time */
    memset(&c, 0, sizeof c);
    sim_process_url(sim, "/v1/chat/completions", c.url, sizeof c.url);
    sim_process_url(sim, "/v1", c.base, sizeof c.base);
    sluice_cancel_init(&c.cancel);
    atomic_init(&c.stop, false);
    struct sluice_discovery_desc dd;
    memset(&dd, 0, sizeof dd); /* the defaults, as a user starts */
    struct sluice_backend_desc b = {.id = "sim", .active = 256, .discovery = &dd};
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1},
                             &c.engine) != SLUICE_OK)
        return 0;
    pthread_t threads[HTTP_THREADS];
    int started = 0;
    for (; started < HTTP_THREADS; started++)
        if (pthread_create(&threads[started], NULL,
                           started % 2 ? http_chat_thread : http_perform_thread, &c) != 0)
            break;
    struct sluice_discovery_status st = {0};
    for (int64_t end = sim__ms() + HTTP_RUN_LIMIT_S * 1000; sim__ms() < end; sim__sleep_ms(10)) {
        sluice_engine_status(c.engine, "sim", &st);
        if (st.state == SLUICE_DISCOVERY_LOCKED)
            break;
    }
    atomic_store(&c.stop, true);
    sluice_cancel_fire(&c.cancel); /* waiting callers leave, transfers abort */
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    sluice_engine_close(c.engine);
    sluice_engine_destroy(c.engine);
    return st.state == SLUICE_DISCOVERY_LOCKED ? st.ceiling : 0;
}

/* ---- rows --------------------------------------------------------------------------- */

static void http_row(const struct bench_opts *opts, enum http_driver driver,
                     const struct http_provider *p, int seed_base)
{
    char name[64];
    snprintf(name, sizeof name, "discovery.http.%s.%s", http_driver_names[driver], p->name);
    if (!bench_case_enabled(opts, name))
        return;
    int runs = http_runs(opts), busy = http_busy_count(driver);
    int busy_pids[HTTP_MAX_BUSY] = {0};
    bench_busy_start(busy_pids, busy);
    double lo = p->band_lo * p->cap, hi = p->band_hi * p->cap;
    double locks[HTTP_RUNS_MAX];
    int n_locks = 0, in_band = 0;
    printf("  %s: cap %u, band [%.1f, %.1f], %d busy loop%s, %d runs:", name, p->cap, lo, hi, busy,
           busy == 1 ? "" : "s", runs);
    fflush(stdout);
    for (int r = 0; r < runs; r++) {
        struct sim_process sim;
        uint32_t lock = 0;
        if (http_sim_start(&sim, p, seed_base + r)) {
            char url[96];
            sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
            lock = driver == HTTP_PROBE ? http_run_probe(url) : http_run_closed64(&sim);
            sim_process_stop(&sim);
        } else {
            printf(" !!! WARNING: the simulator did not start;");
        }
        if (lock) {
            locks[n_locks++] = lock;
            in_band += lock >= lo && lock <= hi;
            printf(" %u", lock);
        } else {
            printf(" -");
        }
        fflush(stdout);
    }
    bench_busy_stop(busy_pids, busy);
    printf("\n  %s: %d of %d inside [%.1f, %.1f]\n", name, in_band, runs, lo, hi);
    struct bench_row row = bench_row_make(name, "discover", driver == HTTP_PROBE ? 128 : HTTP_THREADS);
    bench_row_extra(&row, "cap", p->cap);
    bench_row_extra(&row, "runs", runs);
    bench_row_extra(&row, "in_band", in_band);
    bench_row_extra(&row, "no_lock", runs - n_locks);
    bench_row_extra(&row, "band_lo", lo);
    bench_row_extra(&row, "band_hi", hi);
    if (n_locks) {
        bench_row_extra(&row, "lock_min", bench_percentile(locks, (size_t)n_locks, 0.0));
        bench_row_extra(&row, "lock_median", bench_median(locks, (size_t)n_locks));
        bench_row_extra(&row, "lock_max", bench_percentile(locks, (size_t)n_locks, 100.0));
    }
    bench_row_extra(&row, "busy", busy);
    bench_emit(&row);
}

/* ---- a rate limit with retrying clients: nginx limit_req ---------------------------------
 *
 * nginx in front of the simulator (cap far out of reach, 100 ms median) with
 * `limit_req rate=100r/s burst=10 nodelay` answering 429, and 32 threads that
 * retry a 429 after 1, 1, 2, 3, then 5 s, as the OpenAI SDKs do (the permit is
 * given back between attempts: each attempt is one call). R·L = 100 x the
 * simulator's mean latency (~0.108 s): the band is [0.8, 1.25]·R·L and every run
 * must lock in it, no lock ever below. */

#define HTTP_NGINX_RATE 100
#define HTTP_NGINX_RL (HTTP_NGINX_RATE * 0.108)
#define HTTP_NGINX_THREADS 32
#define HTTP_NGINX_RUN_S 60

static const int http_retry_ladder_s[] = {1, 1, 2, 3, 5};

struct http_nginx {
    pid_t pid;
    int port;
    char dir[64];
};

static bool http_nginx_start(struct http_nginx *n, int upstream_port)
{
    snprintf(n->dir, sizeof n->dir, "/tmp/sluice-nginx-XXXXXX");
    if (!mkdtemp(n->dir))
        return false;
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* a free port: bind to 0, read it, close */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    n->port = ntohs(a.sin_port);
    close(fd);
    char conf[96];
    snprintf(conf, sizeof conf, "%s/nginx.conf", n->dir);
    FILE *f = fopen(conf, "w");
    if (!f)
        return false;
    fprintf(f,
            "worker_processes 1; error_log /dev/null; pid %s/nginx.pid;\n"
            "events { worker_connections 1024; }\n"
            "http { access_log off; client_body_temp_path %s; proxy_temp_path %s;\n"
            "  fastcgi_temp_path %s; uwsgi_temp_path %s; scgi_temp_path %s;\n"
            "  limit_req_zone $binary_remote_addr zone=rate:1m rate=%dr/s;\n"
            "  upstream sim { server 127.0.0.1:%d; keepalive 64; }\n"
            "  server { listen 127.0.0.1:%d;\n"
            "    location / { limit_req zone=rate burst=10 nodelay; limit_req_status 429;\n"
            "      proxy_pass http://sim; proxy_http_version 1.1;\n"
            "      proxy_set_header Connection \"\"; } } }\n",
            n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, HTTP_NGINX_RATE, upstream_port,
            n->port);
    fclose(f);
    n->pid = fork();
    if (n->pid == 0) {
        setpgid(0, 0); /* its own group, workers included: stopped together */
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
        }
        execlp("nginx", "nginx", "-p", n->dir, "-c", conf, "-g", "daemon off;", (char *)NULL);
        _exit(127);
    }
    if (n->pid > 0)
        setpgid(n->pid, n->pid); /* as the child does: whichever runs first */
    for (int64_t end = sim__ms() + 5000; n->pid > 0 && sim__ms() < end; sim__sleep_ms(20))
        if (sim__accepts(n->port))
            return true;
    return false;
}

static void http_nginx_stop(struct http_nginx *n)
{
    /* The whole group: a SIGKILL to the master alone leaves its worker listening. */
    if (n->pid > 0) {
        kill(-n->pid, SIGKILL);
        waitpid(n->pid, NULL, 0);
    }
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", n->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", n->dir);
}

static void *http_retry_thread(void *arg)
{
    struct http_closed *c = arg;
    CURL *easy = http_easy(c);
    size_t step = 0, steps = sizeof http_retry_ladder_s / sizeof http_retry_ladder_s[0];
    while (!atomic_load(&c->stop)) {
        struct sluice_curl_result r;
        sluice_curl_perform(c->engine, "nginx", easy, NULL, &c->cancel, &r);
        if (r.http_status != 429) {
            step = 0;
            continue;
        }
        for (int ms = http_retry_ladder_s[step] * 1000; ms > 0 && !atomic_load(&c->stop); ms -= 50)
            sim__sleep_ms(50);
        step += step + 1 < steps;
    }
    curl_easy_cleanup(easy);
    return NULL;
}

/* Every lock event: the lowest ceiling locked (discovery calls this under its lock). */
static void http_lowest_lock(void *ctx, const struct sluice_event *ev)
{
    uint32_t *lowest = ctx;
    if (getenv("SLUICE_BENCH_VERBOSE"))
        sluice_event_write_json(stderr, ev);
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling && (!*lowest || ev->ceiling < *lowest))
        *lowest = ev->ceiling;
}

/* One run: the lock (0 = none by HTTP_NGINX_RUN_S) and the lowest lock taken. */
static uint32_t http_run_nginx(int port, uint32_t *lowest)
{
    static struct http_closed c; /* one run at a time */
    memset(&c, 0, sizeof c);
    snprintf(c.url, sizeof c.url, "http://127.0.0.1:%d/v1/chat/completions", port);
    sluice_cancel_init(&c.cancel);
    atomic_init(&c.stop, false);
    struct sluice_discovery_desc dd;
    memset(&dd, 0, sizeof dd);
    *lowest = 0;
    dd.on_event = http_lowest_lock;
    dd.on_event_ctx = lowest;
    struct sluice_backend_desc b = {.id = "nginx", .active = 256, .discovery = &dd};
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1},
                             &c.engine) != SLUICE_OK)
        return 0;
    pthread_t threads[HTTP_NGINX_THREADS];
    int started = 0;
    for (; started < HTTP_NGINX_THREADS; started++)
        if (pthread_create(&threads[started], NULL, http_retry_thread, &c) != 0)
            break;
    struct sluice_discovery_status st = {0};
    for (int64_t end = sim__ms() + HTTP_NGINX_RUN_S * 1000; sim__ms() < end; sim__sleep_ms(10)) {
        sluice_engine_status(c.engine, "nginx", &st);
        if (st.state == SLUICE_DISCOVERY_LOCKED && sim__ms() > end - HTTP_NGINX_RUN_S * 500)
            break; /* locked, and half the run has gone by: a lock lowered later counts too */
    }
    atomic_store(&c.stop, true);
    sluice_cancel_fire(&c.cancel);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    sluice_engine_close(c.engine);
    sluice_engine_destroy(c.engine);
    return st.state == SLUICE_DISCOVERY_LOCKED ? st.ceiling : 0;
}

static void http_nginx_row(const struct bench_opts *opts)
{
    const char *name = "discovery.http.retry32.nginx_rate100";
    if (!bench_case_enabled(opts, name))
        return;
    int runs = http_runs(opts) < 5 ? http_runs(opts) : 5;
    double lo = 0.8 * HTTP_NGINX_RL, hi = 1.25 * HTTP_NGINX_RL;
    int in_band = 0;
    printf("  %s: R·L %.1f, band [%.1f, %.1f], %d runs (lock/lowest):", name, HTTP_NGINX_RL, lo,
           hi, runs);
    fflush(stdout);
    for (int r = 0; r < runs; r++) {
        struct sim_process sim;
        struct http_nginx ngx;
        memset(&ngx, 0, sizeof ngx);
        uint32_t lock = 0, lowest = 0;
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 7001 + r);
        const char *args[] = {"--mode", "reject", "--cap", "100000", "--median-ms", "100",
                              "--seed", seed, NULL};
        if (sim_process_start(&sim, args) == 0) {
            if (http_nginx_start(&ngx, sim.port))
                lock = http_run_nginx(ngx.port, &lowest);
            else
                printf(" !!! WARNING: nginx did not start;");
            http_nginx_stop(&ngx);
            sim_process_stop(&sim);
        }
        in_band += lock >= lo && lock <= hi && lowest >= lo;
        printf(" %u/%u", lock, lowest);
        fflush(stdout);
    }
    printf("\n  %s: %d of %d locked inside [%.1f, %.1f], none below\n", name, in_band, runs, lo, hi);
    struct bench_row row = bench_row_make(name, "discover", HTTP_NGINX_THREADS);
    bench_row_extra(&row, "runs", runs);
    bench_row_extra(&row, "in_band", in_band);
    bench_row_extra(&row, "band_lo", lo);
    bench_row_extra(&row, "band_hi", hi);
    bench_emit(&row);
}

static void http_discovery_cases(const struct bench_opts *opts)
{
    int offset = bench_env_int("SLUICE_BENCH_HTTP_SEED", 0, 0, 1000000);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    size_t n = sizeof http_providers / sizeof *http_providers;
    for (int d = HTTP_PROBE; d <= HTTP_CLOSED64; d++)
        for (size_t i = 0; i < n; i++)
            http_row(opts, (enum http_driver)d, &http_providers[i],
                     1000 * (int)(d * n + i) + 1 + offset);
    http_nginx_row(opts);
    curl_global_cleanup();
}

BENCH_REGISTER(discovery_http, http_discovery_cases, true)

#endif /* SLUICE_BENCH_CURL && SLUICE_BENCH_SLUICECTL_PATH */
