#include "harness.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define BENCH_MAX_CASES 32
#define BENCH_MAX_ROWS 1024

static struct {
    const char *group;
    bench_case_fn fn;
    bool discovery_only;
} cases[BENCH_MAX_CASES];
static int n_cases;
static struct bench_row rows[BENCH_MAX_ROWS];
static int n_rows;

void bench_register(const char *group, bench_case_fn fn, bool discovery_only)
{
    if (n_cases < BENCH_MAX_CASES)
        cases[n_cases++] = (typeof(cases[0])){group, fn, discovery_only};
}

struct bench_row bench_row_make(const char *case_name, const char *impl, int threads)
{
    struct bench_row r;
    memset(&r, 0, sizeof r);
    snprintf(r.case_name, sizeof r.case_name, "%s", case_name);
    snprintf(r.impl, sizeof r.impl, "%s", impl);
    r.threads = threads;
    r.median_ns = r.p99_ns = r.ops_per_s = r.p999_ns = r.max_wait_ns = -1;
    return r;
}

void bench_row_extra(struct bench_row *row, const char *key, double value)
{
    if (row->n_extra >= (int)(sizeof row->extra / sizeof row->extra[0]))
        return;
    snprintf(row->extra[row->n_extra].key, sizeof row->extra[0].key, "%s", key);
    row->extra[row->n_extra++].value = value;
}

double bench_row_extra_value(const struct bench_row *row, const char *key, double fallback)
{
    for (int k = 0; k < row->n_extra; k++)
        if (!strcmp(row->extra[k].key, key))
            return row->extra[k].value;
    return fallback;
}

void bench_emit(const struct bench_row *row)
{
    if (n_rows < BENCH_MAX_ROWS)
        rows[n_rows++] = *row;
    printf("  %-28s %-16s %3d thr", row->case_name, row->impl, row->threads);
    if (row->median_ns >= 0)
        printf("  median %9.1f ns  p99 %9.1f ns", row->median_ns, row->p99_ns);
    if (row->ops_per_s >= 0)
        printf("  %12.0f ops/s", row->ops_per_s);
    if (row->p999_ns >= 0)
        printf("  p99.9 %10.0f ns  max %11.0f ns", row->p999_ns, row->max_wait_ns);
    for (int i = 0; i < row->n_extra; i++)
        printf("  %s %.3f", row->extra[i].key, row->extra[i].value);
    printf("\n");
    fflush(stdout);
}

bool bench_case_enabled(const struct bench_opts *opts, const char *case_name)
{
    return !opts->filter || strncmp(case_name, opts->filter, strlen(opts->filter)) == 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_percentile(double *samples, size_t n, double pct)
{
    if (n == 0)
        return 0;
    qsort(samples, n, sizeof *samples, cmp_double);
    size_t idx = (size_t)ceil(pct / 100.0 * (double)n);
    idx = idx == 0 ? 0 : idx - 1;
    return samples[idx < n ? idx : n - 1];
}

double bench_median(double *samples, size_t n)
{
    return bench_percentile(samples, n, 50.0);
}

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

uint64_t bench_iters(const struct bench_opts *opts, uint64_t base, uint64_t floor)
{
    uint64_t n = (uint64_t)((double)base * opts->scale);
    return n < floor ? floor : n;
}

void bench_pin(int i)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(i % (ncpu > 0 ? ncpu : 1)), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* Ratios: for each (case, threads) group, every row is compared with the
 * sluice row — by median latency where rows have one, else by throughput. */
static void print_ratios(void)
{
    printf("\nratios (baseline / sluice; > 1 means sluice is ahead):\n");
    for (int i = 0; i < n_rows; i++) {
        const struct bench_row *s = &rows[i];
        if (strcmp(s->impl, "sluice") != 0 && strcmp(s->impl, "discover") != 0)
            continue;
        for (int j = 0; j < n_rows; j++) {
            const struct bench_row *b = &rows[j];
            if (j == i || strcmp(b->case_name, s->case_name) != 0 || b->threads != s->threads)
                continue;
            if (s->median_ns > 0 && b->median_ns > 0 && s->ops_per_s < 0)
                printf("  %-28s %3d thr  %-16s latency x%.2f\n", s->case_name, s->threads, b->impl,
                       b->median_ns / s->median_ns);
            else if (s->ops_per_s > 0 && b->ops_per_s > 0)
                printf("  %-28s %3d thr  %-16s throughput x%.2f\n", s->case_name, s->threads,
                       b->impl, s->ops_per_s / b->ops_per_s);
        }
    }
}

static void json_number(FILE *f, const char *key, double v)
{
    if (v >= 0 && isfinite(v))
        fprintf(f, ", \"%s\": %.6g", key, v);
}

static int write_json(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "sluice-bench: cannot write --json %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "[\n");
    for (int i = 0; i < n_rows; i++) {
        const struct bench_row *r = &rows[i];
        fprintf(f, "  {\"case\": \"%s\", \"impl\": \"%s\", \"threads\": %d", r->case_name, r->impl,
                r->threads);
        json_number(f, "median_ns", r->median_ns);
        json_number(f, "p99_ns", r->p99_ns);
        json_number(f, "ops_per_s", r->ops_per_s);
        json_number(f, "p999_ns", r->p999_ns);
        json_number(f, "max_wait_ns", r->max_wait_ns);
        for (int k = 0; k < r->n_extra; k++)
            fprintf(f, ", \"%s\": %.6g", r->extra[k].key, r->extra[k].value);
        fprintf(f, "}%s\n", i + 1 < n_rows ? "," : "");
    }
    fprintf(f, "]\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "sluice-bench: cannot write --json %s: %s\n", path, strerror(errno));
        return 1;
    }
    printf("\nwrote %d rows to %s\n", n_rows, path);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice-bench [--json FILE] [--discovery] [--only-discovery] [--quick]\n"
               "                    [--repeats N] [--filter CASE_PREFIX]\n"
               "  Runs sluice next to its baselines in one process; prints medians, p99\n"
               "  and ratios. Repeat runs on small, noisy machines before trusting a number.\n");
}

int main(int argc, char **argv)
{
    struct bench_opts opts = {.repeats = 5, .scale = 1.0};
    const char *json = NULL;
    bool only_discovery = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(a, "--discovery"))
            opts.discovery = true;
        else if (!strcmp(a, "--only-discovery"))
            opts.discovery = only_discovery = true;
        else if (!strcmp(a, "--quick"))
            opts.scale = 0.1, opts.repeats = 3;
        else if (!strcmp(a, "--repeats") && i + 1 < argc) {
            opts.repeats = atoi(argv[++i]);
            if (opts.repeats < 1) {
                fprintf(stderr, "sluice-bench: --repeats needs a whole number >= 1\n");
                return 2;
            }
        } else if (!strcmp(a, "--filter") && i + 1 < argc)
            opts.filter = argv[++i];
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "sluice-bench: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    printf("sluice-bench: %ld CPUs online, %d repeats, scale %.2f\n",
           sysconf(_SC_NPROCESSORS_ONLN), opts.repeats, opts.scale);
    for (int i = 0; i < n_cases; i++) {
        if (cases[i].discovery_only ? !opts.discovery : only_discovery)
            continue;
        printf("\n[%s]\n", cases[i].group);
        cases[i].fn(&opts);
    }
    print_ratios();
    return json ? write_json(json) : 0;
}

int bench_env_int(const char *name, int fallback, int lo, int hi)
{
    const char *env = getenv(name);
    long v = fallback;
    if (env && *env) {
        char *end;
        errno = 0;
        v = strtol(env, &end, 10);
        if (*end || errno) {
            printf("  !!! WARNING: %s=%s is not a whole number; using %d\n", name, env, fallback);
            v = fallback;
        }
    }
    return v < lo ? lo : v > hi ? hi : (int)v;
}

int bench_busy_count(int most)
{
    return bench_env_int("SLUICE_BENCH_BUSY", 0, 0, most);
}

void bench_busy_start(int *pids, int n)
{
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
#ifdef __linux__
            prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
            for (volatile uint64_t spin = 0;; spin++) {
            }
        }
        pids[i] = (int)pid;
    }
}

void bench_busy_stop(const int *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
}
