/*
 * fleet_cases.c — what a fleet (sluice/fleet.h) costs a call, next to the
 * same pool without one, in the same process and run.
 *
 * fleet.hot_path  one thread, sluice_pool_call_begin + sluice_pool_call_end
 *                 per op, OK outcomes: an adaptive pool (active 64) that
 *                 follows a fleet attached to a private redis-server (impl
 *                 fleet: the follower policy, the agent beating every
 *                 200 ms in the background) and the same pool with its own
 *                 discovery (impl local: the default policy, no Redis).
 *                 Rows: ns per op (median and p99 of batch means), ops per
 *                 second; the fleet row carries ratio_vs_local (its median
 *                 over local's; the promise is ~1: the hot path never
 *                 talks to Redis).
 *
 * The order of the implementations alternates between repetitions. The
 * case starts redis-server on a free loopback port (--save "" --appendonly
 * no) and kills it after; without redis-server on PATH it prints why and
 * emits nothing. Built only with the shim's fleet (SLUICE_BENCH_FLEET).
 */
#include "harness.h"

#ifdef SLUICE_BENCH_FLEET

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sluice/fleet.h>

#define FH_BATCH 1000
#define FH_MAX_REPEATS 64

static void fh_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int fh_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* redis-server on `port`, or -1 when it cannot be started. */
static pid_t fh_redis(int port)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        return -1;
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* ns per op of `batches` batches of call_begin + call_end. */
static void fh_measure(struct sluice_pool *pool, double *samples, size_t batches)
{
    for (size_t b = 0; b < batches; b++) {
        int64_t t0 = bench_now_ns();
        for (int i = 0; i < FH_BATCH; i++) {
            struct sluice_call call;
            sluice_pool_call_begin(pool, NULL, NULL, &call);
            sluice_pool_call_end(pool, &call, SLUICE_OUTCOME_OK, 0);
        }
        samples[b] = (double)(bench_now_ns() - t0) / FH_BATCH;
    }
}

struct fh_summary {
    double median[FH_MAX_REPEATS], p99[FH_MAX_REPEATS], ops[FH_MAX_REPEATS];
    int n;
};

static struct bench_row fh_row(const char *impl, struct fh_summary *s)
{
    struct bench_row row = bench_row_make("fleet.hot_path", impl, 1);
    row.median_ns = bench_median(s->median, (size_t)s->n);
    row.p99_ns = bench_median(s->p99, (size_t)s->n);
    row.ops_per_s = bench_median(s->ops, (size_t)s->n);
    return row;
}

static void fh_run(const struct bench_opts *opts, struct sluice_pool *fleet_pool,
                   struct sluice_pool *local_pool)
{
    size_t batches = (size_t)bench_iters(opts, 2000, 50);
    double *samples = malloc(batches * sizeof *samples);
    struct fh_summary sf = {0}, sl = {0};
    int repeats = opts->repeats < FH_MAX_REPEATS ? opts->repeats : FH_MAX_REPEATS;
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < 2; k++) {
            bool fleet_turn = (k == 0) == (r % 2 == 0);
            struct fh_summary *s = fleet_turn ? &sf : &sl;
            int64_t t0 = bench_now_ns();
            fh_measure(fleet_turn ? fleet_pool : local_pool, samples, batches);
            double secs = (double)(bench_now_ns() - t0) / 1e9;
            s->median[s->n] = bench_median(samples, batches);
            s->p99[s->n] = bench_percentile(samples, batches, 99.0);
            s->ops[s->n] = (double)(batches * FH_BATCH) / secs;
            s->n++;
        }
    }
    struct bench_row frow = fh_row("fleet", &sf), lrow = fh_row("local", &sl);
    bench_row_extra(&frow, "ratio_vs_local", frow.median_ns / lrow.median_ns);
    bench_emit(&frow);
    bench_emit(&lrow);
    free(samples);
}

static void fleet_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "fleet.hot_path"))
        return;
    int port = fh_free_port();
    pid_t redis = port > 0 ? fh_redis(port) : -1;
    if (redis < 0) {
        printf("  fleet.hot_path skipped: redis-server is not on PATH (apt-get install "
               "redis-server)\n");
        return;
    }
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    struct sluice_fleet *fleet = NULL;
    struct sluice_pool *fp = NULL, *lp = NULL;
    struct sluice_discovery_desc fdd = {0}, ldd = {.node_id = "bench:local"};
    if (sluice_fleet_create(&(struct sluice_fleet_desc){.redis_url = url, .node_id = "bench"},
                            &fleet) != SLUICE_OK)
        goto out;
    sluice_fleet_discovery(fleet, &fdd);
    if (sluice_pool_create(&(struct sluice_pool_desc){.active = 64, .discovery = &fdd}, &fp) !=
            SLUICE_OK ||
        sluice_pool_create(&(struct sluice_pool_desc){.active = 64, .discovery = &ldd}, &lp) !=
            SLUICE_OK ||
        sluice_fleet_attach(fleet, fp) != SLUICE_OK)
        goto out;
    struct sluice_fleet_status st;
    for (int i = 0; i < 250 && (sluice_fleet_snapshot(fleet, &st), !st.connected); i++)
        fh_sleep_ms(20);
    if (!st.connected)
        printf("  !!! WARNING: fleet.hot_path: the fleet did not connect to %s\n", url);
    else
        fh_run(opts, fp, lp);
out:
    sluice_fleet_destroy(fleet);
    sluice_pool_destroy(fp);
    sluice_pool_destroy(lp);
    kill(redis, SIGKILL);
    waitpid(redis, NULL, 0);
}

BENCH_REGISTER(fleet, fleet_cases, false)

#endif /* SLUICE_BENCH_FLEET */
