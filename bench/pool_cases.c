/*
 * pool_cases.c — admission and the run lifecycle (sluice/pool.h, run.h)
 * next to their baselines.
 *
 * pool.admit_reject  one thread, a full pool (active 1, waiting 0, one run
 *                    admitted), sluice_pool_admit in a loop: the cost of an
 *                    immediate rejection, counted (refused_capacity) as
 *                    the metrics need. Baseline: sem_trywait on an
 *                    exhausted sem_t (impl sem_trywait). Rows are ns per
 *                    attempt: median and p99 over batches of PB_BATCH.
 * run.overhead       sluice_run with a no-op client on a backend with
 *                    active 16 (never waits at <= 16 threads), at 1 and 4
 *                    threads, next to calling the same client through the
 *                    same function pointer directly (impl direct). Rows are
 *                    ns per run (median, p99 over batches of PB_RUN_BATCH
 *                    runs per thread) and runs per second over all threads.
 *
 * Every number is a median across opts->repeats repetitions, and the order
 * of the implementations alternates between repetitions. After each run the
 * bench checks that every rejection was a rejection, counted once, and that
 * the pool is idle again; a failure prints a "!!! WARNING" line.
 */
#include "harness.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/run.h>

#define PB_BATCH 1000     /* attempts per timed batch (admit_reject) */
#define PB_RUN_BATCH 100  /* runs per timed batch (run.overhead) */
#define PB_MAX_THREADS 4
#define PB_MAX_REPEATS 64

static void pb_warn(const char *what)
{
    printf("  !!! WARNING: %s\n", what);
    fflush(stdout);
}

/* The median of per-repeat values (the harness's percentile sorts in place). */
static double pb_median_of(double *v, int n)
{
    return bench_median(v, (size_t)n);
}

struct pb_summary {
    double median[PB_MAX_REPEATS], p99[PB_MAX_REPEATS], ops[PB_MAX_REPEATS];
    int n;
};

static void pb_summarise(struct pb_summary *s, double *samples, size_t n, double ops_per_s)
{
    s->median[s->n] = bench_median(samples, n);
    s->p99[s->n] = bench_percentile(samples, n, 99.0);
    s->ops[s->n] = ops_per_s;
    s->n++;
}

static void pb_emit(const char *case_name, const char *impl, int threads, struct pb_summary *s)
{
    struct bench_row row = bench_row_make(case_name, impl, threads);
    row.median_ns = pb_median_of(s->median, s->n);
    row.p99_ns = pb_median_of(s->p99, s->n);
    row.ops_per_s = pb_median_of(s->ops, s->n);
    bench_emit(&row);
}

/* ---- pool.admit_reject ----------------------------------------------------- */

/* Time `batches` batches of PB_BATCH evaluations of `attempt`; count failures in *misses. */
#define PB_TIME_BATCHES(samples, batches, attempt, misses)                                         \
    do {                                                                                           \
        for (size_t b_ = 0; b_ < (batches); b_++) {                                                \
            int64_t t0_ = bench_now_ns();                                                          \
            for (int i_ = 0; i_ < PB_BATCH; i_++)                                                  \
                (misses) += (attempt) == 0;                                                        \
            (samples)[b_] = (double)(bench_now_ns() - t0_) / PB_BATCH;                             \
        }                                                                                          \
    } while (0)

static void pb_admit_reject(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "pool.admit_reject"))
        return;
    size_t batches = bench_iters(opts, 4000, 200);
    double *samples = malloc(batches * sizeof *samples);
    struct sluice_pool *pool;
    struct sluice_pool_desc desc = {.active = 1, .waiting = SLUICE_SOME(0)};
    sem_t sem;
    if (!samples || sluice_pool_create(&desc, &pool) != SLUICE_OK || sem_init(&sem, 0, 0) != 0) {
        pb_warn("pool.admit_reject: setup failed");
        free(samples);
        return;
    }
    sluice_pool_admit(pool); /* now full */
    struct pb_summary sluice = {0}, sem_s = {0};
    long wrongly_admitted = 0;
    uint64_t attempts = 0;
    bench_pin(0);
    int repeats = opts->repeats < PB_MAX_REPEATS ? opts->repeats : PB_MAX_REPEATS;
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < 2; k++) {
            if ((k + r) % 2 == 0) {
                PB_TIME_BATCHES(samples, batches, sluice_pool_admit(pool), wrongly_admitted);
                attempts += (uint64_t)batches * PB_BATCH;
                pb_summarise(&sluice, samples, batches, 1e9 / bench_median(samples, batches));
            } else {
                PB_TIME_BATCHES(samples, batches, sem_trywait(&sem), wrongly_admitted);
                pb_summarise(&sem_s, samples, batches, 1e9 / bench_median(samples, batches));
            }
        }
    }
    if (wrongly_admitted || sluice_pool_stats(pool).admitted != 1)
        pb_warn("pool.admit_reject: a full pool or an empty semaphore let a caller in");
    if (sluice_pool_stats(pool).refused_capacity != attempts)
        pb_warn("pool.admit_reject: refused_capacity is not the number of refusals");
    pb_emit("pool.admit_reject", "sluice", 1, &sluice);
    pb_emit("pool.admit_reject", "sem_trywait", 1, &sem_s);
    sluice_pool_leave(pool);
    sluice_pool_destroy(pool);
    sem_destroy(&sem);
    free(samples);
}

/* ---- run.overhead ---------------------------------------------------------- */

static int pb_noop_generate(void *ctx, struct sluice_generation *gen)
{
    (void)gen;
    BENCH_KEEP(ctx);
    return SLUICE_OK;
}

/* Read through a volatile pointer so neither path can inline the client. */
static const struct sluice_run_ops pb_ops = {NULL, pb_noop_generate, NULL};
static const struct sluice_run_ops *volatile pb_ops_ptr = &pb_ops;

struct pb_thread {
    pthread_t tid;
    int index;
    bool direct;
    struct sluice_engine *engine;
    pthread_barrier_t *start;
    size_t batches;
    double *samples; /* batches entries */
    long failures;
    int64_t began, ended; /* the thread's own span, for throughput */
};

static void *pb_run_thread(void *arg)
{
    struct pb_thread *t = arg;
    bench_pin(t->index);
    const struct sluice_run_ops *ops = pb_ops_ptr;
    struct sluice_run_desc desc = {.backend = "bench", .ops = ops};
    struct sluice_generation gen;
    memset(&gen, 0, sizeof gen);
    pthread_barrier_wait(t->start);
    t->began = bench_now_ns();
    for (size_t b = 0; b < t->batches; b++) {
        int64_t t0 = bench_now_ns();
        for (int i = 0; i < PB_RUN_BATCH; i++)
            t->failures += (t->direct ? ops->generate(NULL, &gen)
                                      : sluice_run(t->engine, &desc, NULL)) != SLUICE_OK;
        t->samples[b] = (double)(bench_now_ns() - t0) / PB_RUN_BATCH;
    }
    t->ended = bench_now_ns();
    return NULL;
}

/* One repetition at `threads` threads; appends to *s. Returns false on a broken run. */
static bool pb_run_once(struct sluice_engine *e, int threads, bool direct, size_t batches,
                        double *all_samples, struct pb_summary *s)
{
    struct pb_thread t[PB_MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        t[i] = (struct pb_thread){.index = i, .direct = direct, .engine = e, .start = &start,
                                  .batches = batches, .samples = all_samples + (size_t)i * batches};
        pthread_create(&t[i].tid, NULL, pb_run_thread, &t[i]);
    }
    pthread_barrier_wait(&start);
    long failures = 0;
    int64_t began = INT64_MAX, ended = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i].tid, NULL);
        failures += t[i].failures;
        began = t[i].began < began ? t[i].began : began;
        ended = t[i].ended > ended ? t[i].ended : ended;
    }
    /* Measured by the workers: the main thread may be scheduled late. */
    double wall_ns = (double)(ended - began);
    pthread_barrier_destroy(&start);
    double runs = (double)threads * (double)batches * PB_RUN_BATCH;
    size_t n = (size_t)threads * batches;
    pb_summarise(s, all_samples, n, runs / wall_ns * 1e9);
    return failures == 0;
}

static void pb_run_overhead(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "run.overhead"))
        return;
    struct sluice_backend_desc backend = {.id = "bench", .active = 16};
    struct sluice_engine_desc desc = {.backends = &backend, .n_backends = 1};
    struct sluice_engine *e;
    size_t batches = bench_iters(opts, 5000, 200);
    double *samples = malloc((size_t)PB_MAX_THREADS * batches * sizeof *samples);
    if (!samples || sluice_engine_create(&desc, &e) != SLUICE_OK) {
        pb_warn("run.overhead: setup failed");
        free(samples);
        return;
    }
    static const int thread_counts[] = {1, 4};
    int repeats = opts->repeats < PB_MAX_REPEATS ? opts->repeats : PB_MAX_REPEATS;
    for (size_t tc = 0; tc < sizeof thread_counts / sizeof thread_counts[0]; tc++) {
        int threads = thread_counts[tc];
        struct pb_summary sluice = {0}, direct = {0};
        bool ok = true;
        for (int r = 0; r < repeats; r++)
            for (int k = 0; k < 2; k++) {
                bool is_direct = (k + r) % 2 == 1;
                ok &= pb_run_once(e, threads, is_direct, batches, samples,
                                  is_direct ? &direct : &sluice);
            }
        struct sluice_pool_counts c = sluice_pool_stats(sluice_engine_pool(e, "bench"));
        if (!ok || c.admitted || c.in_flight || c.queued)
            pb_warn("run.overhead: a run failed or the pool is not idle afterwards");
        pb_emit("run.overhead", "sluice", threads, &sluice);
        pb_emit("run.overhead", "direct", threads, &direct);
    }
    sluice_engine_destroy(e);
    free(samples);
}

static void pool_cases(const struct bench_opts *opts)
{
    pb_admit_reject(opts);
    pb_run_overhead(opts);
}

BENCH_REGISTER(pool, pool_cases, false)
