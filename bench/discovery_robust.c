/*
 * discovery_robust.c — the robustness table (rows discovery.robust.*,
 * described in discovery_cases.c): every policy and peer over many seeds
 * per mode and cap, seeds run in parallel.
 */
#include "discovery_bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the robustness table -------------------------------------------------- */

static const uint32_t robust_queue_caps[] = {8, 12, 16, 24, 52, 200};
static const uint32_t robust_reject_caps[] = {3, 8, 16, 52, 200};
static const uint32_t robust_stream_caps[] = {8, 16, 52};
/* A streamed chat answer: 0.3 s to the first token (lognormal, the usual 0.4), then a median
 * of 100 tokens (lognormal sigma 1: a few words to thousands) at 20 ms each. */
#define STREAM_TTFT_S 0.3
#define STREAM_TOKENS 100.0
#define STREAM_TOKENS_SIGMA 1.0
#define STREAM_TOKEN_S 0.02
#define ROBUST_MAX_ROWS 64

bool robust_impl(const struct impl *im)
{
    if (im->kind != IMPL_SLUICE && im->kind != IMPL_PEER)
        return false;
    const char *only = getenv("SLUICE_BENCH_IMPLS");
    if (!only)
        return true;
    size_t n = strlen(im->name);
    for (const char *at = strstr(only, im->name); at; at = strstr(at + 1, im->name))
        if ((at == only || at[-1] == ',') && (at[n] == ',' || at[n] == 0))
            return true;
    return false;
}

/* One row of the table: a scenario, run for every seed by every impl. */
struct robust_job {
    struct scenario sc;
    char name[64];
    int seeds;
    struct result *runs; /* [seed][impl] (N_IMPLS per seed; fixed rows unused) */
    _Atomic int next;    /* the next seed to run */
    _Atomic int done;
};

static void robust_run_seed(struct robust_job *job, int k)
{
    uint64_t seed = 1 + (uint64_t)k;
    for (size_t i = 0; i < N_IMPLS; i++)
        if (robust_impl(&impls[i]) || impls[i].kind == IMPL_ORACLE)
            job->runs[(size_t)k * N_IMPLS + i] = run_one(&job->sc, &impls[i], seed);
}

static void *robust_worker(void *arg)
{
    struct robust_job *job = (struct robust_job *)arg;
    int k;
    while ((k = atomic_fetch_add(&job->next, 1)) < job->seeds) {
        robust_run_seed(job, k);
        atomic_fetch_add(&job->done, 1);
    }
    return NULL;
}

static int robust_threads(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return bench_env_int("SLUICE_BENCH_THREADS", ncpu > 64 ? 64 : (int)ncpu, 1, 64);
}

int robust_seeds(const struct bench_opts *opts)
{
    double n = 300 * opts->scale + 0.5;
    return bench_env_int("SLUICE_BENCH_SEEDS", n > 100000 ? 100000 : (int)n, 1, 100000);
}

/* Run every seed of one row on `threads` threads, printing progress to stderr. */
static void robust_run(struct robust_job *job, int threads)
{
    pthread_t tid[64];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tid[started], NULL, robust_worker, job) == 0)
            started++;
    robust_worker(job); /* this thread works too; it returns when no seed is left */
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
}

static void robust_emit(struct robust_job *job)
{
    int n = job->seeds;
    double *gp = (double *)malloc(sizeof(double) * (size_t)n);
    double *p99 = (double *)malloc(sizeof(double) * (size_t)n);
    double *p50 = (double *)malloc(sizeof(double) * (size_t)n);
    for (size_t i = 0; i < N_IMPLS; i++) {
        if (!robust_impl(&impls[i]))
            continue;
        int outside = 0;
        for (int k = 0; k < n; k++) {
            const struct result *r = &job->runs[(size_t)k * N_IMPLS + i];
            const struct result *o = &job->runs[(size_t)k * N_IMPLS + N_IMPLS - 1];
            outside += !r->target_met;
            gp[k] = o->served > 0 ? r->served / o->served : 0;
            p99[k] = o->p99_s > 0 ? r->p99_s / o->p99_s : 0;
            p50[k] = o->p50_s > 0 ? r->p50_s / o->p50_s : 0;
        }
        double worst = gp[0];
        for (int k = 1; k < n; k++)
            worst = gp[k] < worst ? gp[k] : worst;
        struct bench_row row = bench_row_make(job->name, impls[i].name, 1);
        if (outside && !strcmp(impls[i].name, "discover")) {
            /* Which seeds missed, and where they locked: what to look at first. */
            fprintf(stderr, "  [robust] %s discover missed on seed(s):", job->name);
            for (int k = 0, shown = 0; k < n && shown < 12; k++) {
                const struct result *r = &job->runs[(size_t)k * N_IMPLS + i];
                if (!r->target_met && ++shown)
                    fprintf(stderr, " %d (%.0f)", k + 1, r->ceiling);
            }
            fputc('\n', stderr);
        }
        bench_row_extra(&row, "seeds", n);
        bench_row_extra(&row, "outside_band", outside);
        bench_row_extra(&row, "gp_median", bench_median(gp, (size_t)n));
        bench_row_extra(&row, "gp_worst", worst);
        bench_row_extra(&row, "p50_ratio", bench_median(p50, (size_t)n));
        bench_row_extra(&row, "p99_ratio", bench_median(p99, (size_t)n));
        bench_emit(&row);
    }
    free(gp);
    free(p99);
    free(p50);
}

/* The rows of the table, in order: queue, knee, reject, then the scenarios. */
static int robust_rows(struct scenario *rows)
{
    int n = 0;
    static const enum sim_mode modes[] = {SIM_QUEUE, SIM_KNEE, SIM_REJECT};
    for (size_t m = 0; m < 3; m++) {
        const uint32_t *caps = modes[m] == SIM_REJECT ? robust_reject_caps : robust_queue_caps;
        size_t n_caps = modes[m] == SIM_REJECT
                            ? sizeof robust_reject_caps / sizeof robust_reject_caps[0]
                            : sizeof robust_queue_caps / sizeof robust_queue_caps[0];
        for (size_t c = 0; c < n_caps; c++) {
            struct scenario sc = {.name = sim_mode_name(modes[m]), .mode = modes[m], .cap = caps[c]};
            rows[n++] = sc;
        }
    }
    /* Queue mode with streamed answers of lognormal length (sigma 1): the sample is the time
     * to first token (what a streamed chat reports), or the whole call, side by side. */
    for (size_t c = 0; c < sizeof robust_stream_caps / sizeof robust_stream_caps[0]; c++)
        for (int ttft = 1; ttft >= 0; ttft--)
            rows[n++] = (struct scenario){.name = ttft ? "queue_stream_ttft" : "queue_stream_whole",
                                          .mode = SIM_QUEUE,
                                          .cap = robust_stream_caps[c],
                                          .median_s = STREAM_TTFT_S,
                                          .answer_tokens = STREAM_TOKENS,
                                          .answer_sigma = STREAM_TOKENS_SIGMA,
                                          .token_s = STREAM_TOKEN_S,
                                          .sample_ttft = ttft};
    for (size_t k = 0; k < n_scenarios; k++)
        if (scenarios[k].target != TARGET_BAND)
            rows[n++] = scenarios[k];
    for (size_t k = 0; k < n_real_traffic; k++)
        rows[n++] = real_traffic[k];
    return n;
}

void discovery_robustness(const struct bench_opts *opts)
{
    struct scenario rows[ROBUST_MAX_ROWS];
    int n_rows = robust_rows(rows), seeds = robust_seeds(opts), threads = robust_threads();
    printf("  (%d seeds per row, %d threads; outside_band = seeds that missed the band or target)\n",
           seeds, threads);
    int64_t t0 = bench_now_ns();
    for (int r = 0; r < n_rows; r++) {
        struct robust_job *job = (struct robust_job *)calloc(1, sizeof *job);
        job->sc = rows[r];
        if (rows[r].target == TARGET_BAND)
            snprintf(job->name, sizeof job->name, "discovery.robust.%s_c%u", rows[r].name,
                     rows[r].cap);
        else
            snprintf(job->name, sizeof job->name, "discovery.robust.%s", rows[r].name);
        if (!bench_case_enabled(opts, job->name)) {
            free(job);
            continue;
        }
        job->seeds = seeds;
        job->runs = (struct result *)calloc((size_t)seeds * N_IMPLS, sizeof *job->runs);
        int64_t t_row = bench_now_ns();
        robust_run(job, threads);
        fprintf(stderr, "  [robust] row %d/%d %-34s %6.1f s (%.0f s so far)\n", r + 1, n_rows,
                job->name, (double)(bench_now_ns() - t_row) / 1e9,
                (double)(bench_now_ns() - t0) / 1e9);
        robust_emit(job);
        free(job->runs);
        free(job);
    }
}
