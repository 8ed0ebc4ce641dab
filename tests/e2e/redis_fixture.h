/*
 * redis_fixture.h — what the fleet's end-to-end tests share: a private
 * redis-server on a free loopback port, commands against it, and fleet
 * worker processes that drive the provider simulator (curl_fixture.h)
 * through one pool each, coordinated by a sluice_fleet.
 *
 *   rfx_start();                          // redis-server --port P --save "" --appendonly no
 *   fx_start(&(struct fx_provider){.mode = "reject", .cap = 12});  // the simulator
 *   rfx_spawn(&w[i], &(struct rfx_worker_cfg){.threads = 4}, i);
 *   redisReply *r = rfx_cmd("ZCARD %s", rfx_key("holders"));
 *   rfx_teardown();                       // .fini: workers, then redis, then the simulator
 *
 * The server is never left running: rfx_teardown kills it (call it from
 * .fini), an atexit handler covers an assertion that ends the test early,
 * and the child asks for SIGKILL when the test process dies
 * (PR_SET_PDEATHSIG). Workers are forked from the test process (one thread
 * at that point) and never return into Criterion: they serve until killed.
 * Each writes its fleet events as "KIND CAUSE" lines to its own log file.
 *
 * Every helper is static; each test file gets its own copy.
 */
#ifndef SLUICE_TESTS_E2E_REDIS_FIXTURE_H
#define SLUICE_TESTS_E2E_REDIS_FIXTURE_H

#include "e2e/curl_fixture.h"

#include <hiredis/hiredis.h>
#include <stdarg.h>

#include <sluice/fleet.h>

#define RFX_NODE "sim"
#define RFX_START_MS 5000
#define RFX_MAX_WORKERS 16

struct rfx_redis {
    pid_t pid;
    int port;
    redisContext *c;
};

static struct rfx_redis rfx;

struct rfx_worker_cfg {
    int threads;           /* calls each worker keeps trying to make at once */
    uint32_t max_limit;    /* the fleet's S never rises above (default 1024) */
    uint32_t jumpstart;    /* S at the start (default 5) */
    int64_t heartbeat_ms;  /* (default 100) */
    uint32_t lease;        /* k (default 2) */
};

struct rfx_worker {
    pid_t pid;
    char id[32];
    char log[64];
};

static struct rfx_worker rfx_workers[RFX_MAX_WORKERS];

static inline const char *rfx_key(const char *suffix)
{
    static char key[8][96];
    static int next;
    char *k = key[next++ & 7];
    snprintf(k, sizeof key[0], "sluice:{%s}:%s", RFX_NODE, suffix);
    return k;
}

static inline void rfx_url(char *buf, size_t n)
{
    snprintf(buf, n, "redis://127.0.0.1:%d", rfx.port);
}

/* A port nobody listens on right now (bound, then released). */
static inline int rfx_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline void rfx_kill_all(void)
{
    for (int i = 0; i < RFX_MAX_WORKERS; i++)
        if (rfx_workers[i].pid > 0) {
            kill(rfx_workers[i].pid, SIGKILL);
            waitpid(rfx_workers[i].pid, NULL, 0);
            rfx_workers[i].pid = 0;
        }
    if (rfx.pid > 0) {
        kill(rfx.pid, SIGKILL);
        waitpid(rfx.pid, NULL, 0);
        rfx.pid = 0;
    }
}

/* Start redis-server on rfx.port (0: pick one) and connect to it. */
static inline void rfx_launch(void)
{
    static bool registered;
    if (!registered) {
        atexit(rfx_kill_all);
        registered = true;
    }
    if (!rfx.port)
        rfx.port = rfx_free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", rfx.port);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, STDOUT_FILENO);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    rfx.pid = pid;
    for (int64_t until = fx_now_ms() + RFX_START_MS; fx_now_ms() < until; fx_sleep_ms(10)) {
        redisContext *c = redisConnect("127.0.0.1", rfx.port);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            bool up = r && r->type == REDIS_REPLY_STATUS;
            if (r)
                freeReplyObject(r);
            if (up) {
                if (rfx.c)
                    redisFree(rfx.c);
                rfx.c = c;
                return;
            }
        }
        if (c)
            redisFree(c);
    }
    cr_assert_fail("redis-server did not answer on port %d within %d ms", rfx.port, RFX_START_MS);
}

static inline void rfx_start(void)
{
    rfx.port = 0;
    rfx_launch();
}

/* Kill the server (SIGKILL: as abrupt as an outage); rfx_launch brings it back on the port. */
static inline void rfx_stop_server(void)
{
    if (rfx.pid > 0) {
        kill(rfx.pid, SIGKILL);
        waitpid(rfx.pid, NULL, 0);
        rfx.pid = 0;
    }
    if (rfx.c)
        redisFree(rfx.c);
    rfx.c = NULL;
}

/* A command against the test's server; the caller frees the reply. */
static inline redisReply *rfx_cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = rfx.c ? redisvCommand(rfx.c, fmt, ap) : NULL;
    va_end(ap);
    cr_assert_not_null(r, "redis command failed: %s", fmt);
    return r;
}

static inline long long rfx_int(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = rfx.c ? redisvCommand(rfx.c, fmt, ap) : NULL;
    va_end(ap);
    cr_assert_not_null(r, "redis command failed: %s", fmt);
    long long v = r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10)
                                                  : 0;
    freeReplyObject(r);
    return v;
}

/* One field of the fleet's shared state ("limit", "ceiling"); 0 when unset. */
static inline long long rfx_shared(const char *field)
{
    return rfx_int("HGET %s %s", rfx_key("state"), field);
}

/* Sum of the permits every process leases (the held hash). */
static inline long long rfx_leased_total(void)
{
    redisReply *r = rfx_cmd("HVALS %s", rfx_key("held"));
    long long total = 0;
    for (size_t i = 0; i < r->elements; i++)
        total += strtoll(r->element[i]->str, NULL, 10);
    freeReplyObject(r);
    return total;
}

/* Is `id` among the live holders? */
static inline bool rfx_holder(const char *id)
{
    redisReply *r = rfx_cmd("ZSCORE %s %s", rfx_key("holders"), id);
    bool live = r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return live;
}

/* The leader's process id ("" when none). */
static inline void rfx_leader(char *out, size_t n)
{
    redisReply *r = rfx_cmd("GET %s", rfx_key("leader"));
    snprintf(out, n, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
}

static inline void rfx_teardown(void)
{
    rfx_kill_all();
    if (rfx.c)
        redisFree(rfx.c);
    rfx.c = NULL;
    for (int i = 0; i < RFX_MAX_WORKERS; i++)
        if (rfx_workers[i].log[0])
            unlink(rfx_workers[i].log);
    fx_teardown();
}

/* Zero the simulator's counters: its peaks restart from now. */
static inline void rfx_sim_reset(void)
{
    char url[96];
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, sim_process_url(&fx_sim, "/stats/reset", url, sizeof url));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, fx_discard);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 5000L);
    cr_assert_eq(curl_easy_perform(easy), CURLE_OK, "POST /stats/reset failed");
    curl_easy_cleanup(easy);
}

/* ---- fleet workers -------------------------------------------------------------- */

struct rfx_child {
    struct sluice_pool *pool;
    FILE *log;
};

static void rfx_child_event(void *ctx, const struct sluice_event *ev)
{
    struct rfx_child *c = ctx;
    fprintf(c->log, "%s %s %u %u at %lld\n", sluice_event_kind_name(ev->kind),
            sluice_cause_name(ev->cause), (unsigned)ev->old_limit, (unsigned)ev->new_limit,
            (long long)fx_now_ms());
    fflush(c->log);
}

/* One thread of a worker: calls through the pool, forever. */
static void *rfx_child_caller(void *arg)
{
    struct rfx_child *c = arg;
    CURL *easy = fx_easy();
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 10000L);
    for (;;) {
        if (sluice_pool_admit(c->pool) != SLUICE_OK) {
            fx_sleep_ms(1);
            continue;
        }
        struct sluice_call call;
        if (sluice_pool_call_begin(c->pool, NULL, NULL, &call) == SLUICE_OK) {
            long status = 0;
            curl_off_t ttfb = 0;
            CURLcode rc = curl_easy_perform(easy);
            curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
            curl_easy_getinfo(easy, CURLINFO_STARTTRANSFER_TIME_T, &ttfb);
            enum sluice_outcome outcome = rc != CURLE_OK                    ? SLUICE_OUTCOME_IGNORE
                                          : status == 429 || status == 503 ? SLUICE_OUTCOME_OVERLOAD
                                          : status / 100 == 2              ? SLUICE_OUTCOME_OK
                                                                           : SLUICE_OUTCOME_IGNORE;
            /* Time to first byte, as curl saw it: what the shim gives discovery
             * (sluice__curl_end_call). The pool's own clock would add the wait between
             * the permit and this thread running again, which on two loaded cores is
             * the caller's delay, not the provider's. */
            sluice_pool_call_end_latency(c->pool, &call, outcome, 0,
                                         ttfb > 0 ? (int64_t)ttfb * 1000 : -1);
            if (outcome != SLUICE_OUTCOME_OK) /* a client's pause before it tries again */
                fx_sleep_ms(20);
        }
        sluice_pool_leave(c->pool);
    }
    return NULL;
}

/* Start the worker's callers and wait to be killed. */
static __attribute__((noreturn)) void rfx_child_run(const struct rfx_worker_cfg *cfg,
                                                    struct rfx_child *child)
{
    for (int i = 0; i < cfg->threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, rfx_child_caller, child);
    }
    for (;;)
        pause();
}

static __attribute__((noreturn)) void rfx_child_main(const struct rfx_worker_cfg *cfg,
                                                     const struct rfx_worker *w)
{
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    static struct rfx_child child;
    child.log = fopen(w->log, "w");
    if (!child.log)
        _exit(2);
    char url[64], err[256];
    rfx_url(url, sizeof url);
    struct sluice_fleet *fleet;
    int status = sluice_fleet_create(
        &(struct sluice_fleet_desc){.redis_url = url,
                                    .node_id = RFX_NODE,
                                    .process_id = w->id,
                                    .lease = SLUICE_SOME(cfg->lease ? cfg->lease : 2),
                                    .heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : 100,
                                    .max_limit = cfg->max_limit,
                                    .jumpstart = cfg->jumpstart,
                                    .on_event = rfx_child_event,
                                    .on_event_ctx = &child,
                                    .error = err,
                                    .error_size = sizeof err},
        &fleet);
    if (status != SLUICE_OK) {
        fprintf(child.log, "create %s\n", err);
        _exit(3);
    }
    struct sluice_discovery_desc dd = {0};
    sluice_fleet_discovery(fleet, &dd);
    if (sluice_pool_create(&(struct sluice_pool_desc){.active = 64, .discovery = &dd},
                           &child.pool) != SLUICE_OK ||
        sluice_fleet_attach(fleet, child.pool) != SLUICE_OK)
        _exit(4);
    rfx_child_run(cfg, &child);
}

/* Fork worker `i` (process id "w<i>"). */
static inline void rfx_spawn(int i, const struct rfx_worker_cfg *cfg)
{
    struct rfx_worker *w = &rfx_workers[i];
    snprintf(w->id, sizeof w->id, "w%d", i);
    snprintf(w->log, sizeof w->log, "/tmp/sluice-fleet-%d-w%d.log", (int)getpid(), i);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0)
        rfx_child_main(cfg, w);
    w->pid = pid;
}

/* The usual stage: redis, a provider simulator that takes 1000 at once, and
 * `n` workers of 6 callers each whose fleet may run 16 at most. */
static inline void rfx_setup_workers(int n)
{
    fx_setup();
    rfx_start();
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 1000, .median_ms = 20});
    for (int i = 0; i < n; i++)
        rfx_spawn(i, &(struct rfx_worker_cfg){.threads = 6, .max_limit = 16});
}

/* Join this test process to the fleet `d` describes with a pool of 8 that
 * the fleet steers; both are the caller's to destroy (fleet first). */
static inline struct sluice_fleet *rfx_join(const struct sluice_fleet_desc *d,
                                            struct sluice_pool **pool)
{
    struct sluice_fleet *f;
    cr_assert_eq(sluice_fleet_create(d, &f), SLUICE_OK);
    struct sluice_discovery_desc dd = {0};
    sluice_fleet_discovery(f, &dd);
    cr_assert_eq(sluice_pool_create(&(struct sluice_pool_desc){.active = 8, .discovery = &dd},
                                    pool),
                 SLUICE_OK);
    cr_assert_eq(sluice_fleet_attach(f, *pool), SLUICE_OK);
    return f;
}

/* Kill worker i now (SIGKILL: no goodbye to Redis). */
static inline void rfx_kill(int i)
{
    struct rfx_worker *w = &rfx_workers[i];
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        w->pid = 0;
    }
}

/* How many lines of worker i's event log start with `prefix` ("store store_error"); the
 * first of them into first (size bytes, "" if none) unless it is NULL. */
static inline int rfx_events_first(int i, const char *prefix, char *first, size_t size)
{
    if (first)
        first[0] = '\0';
    FILE *f = fopen(rfx_workers[i].log, "r");
    if (!f)
        return 0;
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, prefix, strlen(prefix)) && n++ == 0 && first)
            snprintf(first, size, "%s", line);
    fclose(f);
    return n;
}

static inline int rfx_events(int i, const char *prefix)
{
    return rfx_events_first(i, prefix, NULL, 0);
}

/* The shared state as one line ("limit 16 ceiling 16 state locked leader w2"), for
 * failure messages: a test that waited in vain says where the fleet stood. */
static inline const char *rfx_state_text(void)
{
    static char text[256];
    redisReply *r = rfx_cmd("HMGET %s limit ceiling state leader", rfx_key("state"));
    const char *name[] = {"limit", "ceiling", "state", "leader"};
    size_t at = 0;
    for (size_t i = 0; i < 4 && i < r->elements && at < sizeof text; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s%s %s", i ? " " : "", name[i],
                               r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "-");
    freeReplyObject(r);
    return text;
}

/* Copy every worker's event log to stderr (after a failure: what the fleet did). */
static inline void rfx_dump_logs(void)
{
    for (int i = 0; i < RFX_MAX_WORKERS; i++) {
        FILE *f = rfx_workers[i].log[0] ? fopen(rfx_workers[i].log, "r") : NULL;
        if (!f)
            continue;
        fprintf(stderr, "---- %s events\n", rfx_workers[i].id);
        char line[256];
        while (fgets(line, sizeof line, f))
            fputs(line, stderr);
        fclose(f);
    }
}

/* How long a test waits for something the fleet will do (join, lock, recover): a hang
 * guard, not a timing claim, so generous enough for a machine that other work keeps
 * busy (several processes share two cores in every fleet test); a passing run never
 * waits it out. */
#define RFX_PATIENCE_MS 60000

/* Poll `cond` every 10 ms for up to `ms`; true once it holds. */
#define RFX_WAIT_UNTIL(cond, ms)                                                                   \
    ({                                                                                             \
        bool rfx__ok = false;                                                                      \
        for (int64_t rfx__end = fx_now_ms() + (ms); !(rfx__ok = (cond)) && fx_now_ms() < rfx__end;) \
            fx_sleep_ms(10);                                                                       \
        rfx__ok;                                                                                   \
    })

#endif /* SLUICE_TESTS_E2E_REDIS_FIXTURE_H */
