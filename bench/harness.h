/*
 * sluice-bench harness: case registry, latency statistics, the printed
 * table and the JSON writer. Every case runs sluice and its baselines in the
 * same process, so the ratios it prints compare like with like.
 */
#ifndef SLUICE_BENCH_HARNESS_H
#define SLUICE_BENCH_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bench_opts {
    int repeats;        /* independent repetitions; medians are taken across them (default 5) */
    double scale;       /* multiplies iteration counts; --quick sets 0.1 */
    bool discovery;     /* --discovery: run the discovery scoreboard too */
    const char *filter; /* run only cases whose name starts with this */
};

/* One row of output. Unused optional metrics are negative and omitted from JSON. */
struct bench_row {
    char case_name[64];
    char impl[48];
    int threads;
    double median_ns, p99_ns, ops_per_s;
    double p999_ns, max_wait_ns; /* handoff cases only */
    /* Free-form extra numeric columns (discovery scoreboard). */
    int n_extra;
    struct {
        char key[32];
        double value;
    } extra[12];
};

typedef void (*bench_case_fn)(const struct bench_opts *opts);

void bench_register(const char *group, bench_case_fn fn, bool discovery_only);
#define BENCH_REGISTER(group, fn, discovery_only)                                                  \
    __attribute__((constructor)) static void bench__register_##group(void)                        \
    {                                                                                              \
        bench_register(#group, fn, discovery_only);                                                \
    }

/* Start a row with everything optional unset. */
struct bench_row bench_row_make(const char *case_name, const char *impl, int threads);
void bench_row_extra(struct bench_row *row, const char *key, double value);
/* An extra column's value, or `fallback` where the row has none by that key. */
double bench_row_extra_value(const struct bench_row *row, const char *key, double fallback);
void bench_emit(const struct bench_row *row);
bool bench_case_enabled(const struct bench_opts *opts, const char *case_name);

/* Statistics over a sample array (sorted in place). */
double bench_percentile(double *samples, size_t n, double pct);
double bench_median(double *samples, size_t n);

/* Monotonic nanoseconds and a cheap cycle-free timestamp for sampling. */
int64_t bench_now_ns(void);

/* Scale an iteration count by opts->scale, never below `floor`. */
uint64_t bench_iters(const struct bench_opts *opts, uint64_t base, uint64_t floor);

/* Prevent the compiler from deleting a computed value. */
#define BENCH_KEEP(x) __asm__ volatile("" : : "g"(x) : "memory")

/* Pin the calling thread to CPU (i mod ncpu); best effort. */
void bench_pin(int i);

/* The whole number in environment variable `name` (`fallback` when unset or empty, and, with
 * a warning naming the variable, when it is not a number), clamped to [lo, hi]. */
int bench_env_int(const char *name, int fallback, int lo, int hi);

/* A loaded machine, as the targets are stated on: n processes that each keep one core busy
 * until bench_busy_stop (or until this process dies). SLUICE_BENCH_BUSY=N asks for N (at
 * most `most`; unset: 0). */
int bench_busy_count(int most);
void bench_busy_start(int *pids, int n);
void bench_busy_stop(const int *pids, int n);

#endif
