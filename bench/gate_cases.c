/*
 * gate_cases.c — the FIFO permit gate (sluice/gate.h) next to its baselines.
 *
 * gate.uncontended   one thread, acquire+release in a loop, limit 1. Rows are
 *                    ns per acquire+release pair: median and p99 over batches
 *                    of GB_BATCH pairs, and pairs per second.
 * gate.handoff.lN    2, 4 and 8 threads (or SLUICE_BENCH_GATE_THREADS, e.g.
 *                    "4,8,16") contending for N permits (N = 1, 2, 4).
 *                    Each thread loops: acquire, a fixed critical section,
 *                    release, a fixed think time. Rows are total acquires per
 *                    second and the wait-time distribution (call of acquire
 *                    to holding the permit): median, p99, p99.9, max. With
 *                    more threads than cores and no work per permit this
 *                    mostly measures the scheduler.
 * gate.handoff_latency.lN  the figure a server feels (N = 1, 4; the same
 *                    thread counts): each holder works GB_HOLD_NS (100 us)
 *                    busy, stamps the time, releases; the next thread other
 *                    than the stamper to return from acquire records the time
 *                    from that release() call to its own return. p50, p99,
 *                    max of those; ops_per_s = acquires per second. With no
 *                    more threads than permits nobody waits: no samples.
 * gate.cancel_storm  limit 2, 4 or more threads: one slow holder keeps a
 *                    permit for the whole run, two threads cycle the other
 *                    (GB_STORM_WORK_NS of work each), every other thread
 *                    waits at most GB_STORM_PATIENCE_NS and gives up, again
 *                    and again: most tickets are abandoned. ops_per_s =
 *                    grants; timeouts_per_s = abandoned waits; p50/p99/max =
 *                    the waits that got a permit (the longest wait of the
 *                    waiters that did not time out). Only implementations
 *                    with a timed acquire (not condvar_fifo).
 * gate.cancel_fire   N threads asleep in sluice_gate_acquire on a gate whose
 *                    only permit is held, then cancelled: impl "sluice" with
 *                    one token shared by all N (one sluice_cancel_fire),
 *                    impl "own_tokens" with a token each (N fires in queue
 *                    order). Rows: fire-to-last-wake time (first fire call
 *                    to the last waiter back from acquire), median and p99
 *                    over repetitions; ops_per_s = waiters woken per second
 *                    up to the last one. Extra fields: wake_median_ns and
 *                    wake_p99_ns (each waiter's own fire-to-return time,
 *                    medians over repetitions) and fire_ns (time inside the
 *                    fire call or calls). N = 3000, scaled by --quick, fewer
 *                    if the machine will not start that many threads.
 *
 * Implementations, all in this process: sluice, sem_t, condvar_fifo and
 * atomic_pair (gate_impls.c says what each one is).
 *
 * Every number is a median across opts->repeats repetitions; the order of
 * the implementations rotates between repetitions so that a noisy neighbour
 * does not always hit the same one. After each handoff run, outside timing,
 * the bench checks that the ops the threads counted equal the ops that
 * entered the critical section, that no more than `limit` threads were ever
 * inside it, and that the gate is quiet again (all permits free, nobody
 * waiting); a failure prints a "!!! WARNING" line.
 *
 * Extra columns: min_share is the least busy thread's share of the acquires
 * relative to an even split (1.0 = every thread got the same number).
 * HUNG_runs counts runs whose threads were still inside acquire
 * GB_WATCHDOG_NS after stop; those threads are abandoned (see
 * gb_abandon_stuck), the run is left out of the medians, and a warning says
 * so. A hang is a bug in the implementation under test, never noise.
 *
 * The implementations and their timed loops are in gate_impls.c (the
 * baselines in gate_baselines.h), the statistics in gate_stats.c,
 * gate.cancel_fire in gate_cancel_fire.c; gate_bench.h is what they share.
 */
#include "gate_bench.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- gate.uncontended -------------------------------------------------------- */

struct gb_uncontended {
    const struct bench_opts *opts;
    uint64_t batches;
    double *per_pair; /* one sample per batch, ns per pair */
    double median[GB_N_IMPLS][GB_MAX_REPEATS];
    double p99[GB_N_IMPLS][GB_MAX_REPEATS];
    double ops[GB_N_IMPLS][GB_MAX_REPEATS];
};

static void gb_uncontended_once(struct gb_uncontended *u, int impl_i, int rep, bool record)
{
    const struct gb_impl *impl = gb_impls[impl_i];
    struct gb_waiter w;
    memset(&w, 0, sizeof w);
    pthread_cond_init(&w.cv, NULL);
    void *gate = impl->create(1);
    uint64_t batches = record ? u->batches : u->batches / 10 + 1;
    int64_t total = 0;
    for (uint64_t b = 0; b < batches; b++) {
        int64_t t0 = bench_now_ns();
        impl->pairs(gate, &w, GB_BATCH);
        int64_t dt = bench_now_ns() - t0;
        total += dt;
        u->per_pair[b] = (double)dt / GB_BATCH;
    }
    char why[160];
    if (!impl->quiet(gate, 1, why, sizeof why))
        gb_warn("gate.uncontended %s: gate not quiet after the loop: %s", impl->name, why);
    impl->destroy(gate);
    pthread_cond_destroy(&w.cv);
    if (!record)
        return;
    u->median[impl_i][rep] = bench_median(u->per_pair, batches);
    u->p99[impl_i][rep] = bench_percentile(u->per_pair, batches, 99);
    u->ops[impl_i][rep] = (double)(batches * GB_BATCH) * 1e9 / (double)total;
}

static void *gb_uncontended_thread(void *arg)
{
    struct gb_uncontended *u = arg;
    int repeats = gb_repeats(u->opts);
    bench_pin(0);
    for (int i = 0; i < GB_N_IMPLS; i++)
        gb_uncontended_once(u, i, 0, false); /* warm-up */
    for (int r = 0; r < repeats; r++)
        for (int k = 0; k < GB_N_IMPLS; k++)
            gb_uncontended_once(u, (k + r) % GB_N_IMPLS, r, true);
    return NULL;
}

static void gb_case_uncontended(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "gate.uncontended"))
        return;
    struct gb_uncontended *u = calloc(1, sizeof *u);
    if (!u)
        exit(1);
    u->opts = opts;
    u->batches = bench_iters(opts, 2000, 100);
    u->per_pair = calloc(u->batches, sizeof *u->per_pair);
    if (!u->per_pair)
        exit(1);
    /* A pinned helper thread, so the main thread's affinity stays as it was. */
    pthread_t th;
    if (pthread_create(&th, NULL, gb_uncontended_thread, u) != 0)
        exit(1);
    pthread_join(th, NULL);
    int repeats = gb_repeats(opts);
    for (int i = 0; i < GB_N_IMPLS; i++) {
        struct bench_row row = bench_row_make("gate.uncontended", gb_impls[i]->name, 1);
        row.median_ns = gb_median_of(u->median[i], repeats);
        row.p99_ns = gb_median_of(u->p99[i], repeats);
        row.ops_per_s = gb_median_of(u->ops[i], repeats);
        bench_emit(&row);
    }
    free(u->per_pair);
    free(u);
}

/* ---- gate.handoff.lN --------------------------------------------------------- */

/* What one run's threads write into: wait samples (pre-faulted, reused by
 * every run) and the thread records. A run whose threads never drain leaves
 * them behind with its arena, and later runs get a fresh one. */
struct gb_arena {
    struct gb_thread threads[GB_MAX_THREADS];
    uint32_t *samples; /* GB_SAMPLES_TOTAL */
};

struct gb_handoff {
    struct gb_arena *arena;
    uint32_t cs_iters, think_iters;
    int64_t run_ns;
};

struct gb_result {
    double ops_per_s, min_share, timeouts_per_s;
    struct gb_waits waits;
};

/* Which loop a run's threads execute. */
enum gb_body { GB_HANDOFF, GB_LATENCY, GB_STORM };

static void (*gb_body_of(const struct gb_impl *impl, enum gb_body body))(struct gb_thread *)
{
    return body == GB_HANDOFF ? impl->handoff : body == GB_LATENCY ? impl->latency : impl->storm;
}

static struct gb_arena *gb_arena_new(void)
{
    struct gb_arena *a = gb_alloc_line(sizeof *a);
    a->samples = gb_alloc_line((size_t)GB_SAMPLES_TOTAL * sizeof *a->samples);
    return a;
}

static void gb_arena_free(struct gb_arena *a)
{
    free(a->samples);
    free(a);
}

static void *gb_handoff_thread(void *arg)
{
    struct gb_thread *t = arg;
    struct gb_run *run = t->run;
    bench_pin(t->index);
    atomic_fetch_add(&run->ready, 1);
    while (!atomic_load_explicit(&run->go, SLUICE_ACQUIRE))
        sched_yield();
    run->body(t);
    t->end_ns = bench_now_ns();
    atomic_store(&t->done, true);
    atomic_fetch_add(&run->finished, 1);
    return NULL;
}

/* After the threads are joined: the counts agree and the gate is quiet. */
static void gb_handoff_verify(const char *label, const struct gb_impl *impl, struct gb_run *run,
                              struct gb_thread *threads, int n_threads)
{
    uint64_t counted = 0, over = 0;
    for (int i = 0; i < n_threads; i++) {
        counted += threads[i].ops;
        over += threads[i].over_limit;
    }
    uint64_t word = atomic_load(&run->cs_word);
    uint64_t entered = word >> 32, inside = word & UINT32_MAX;
    if (entered != (counted & UINT32_MAX) || inside != 0)
        gb_warn("%s: threads counted %llu ops, %llu entered the critical section, %llu still "
                "inside",
                label, (unsigned long long)counted, (unsigned long long)entered,
                (unsigned long long)inside);
    if (over)
        gb_warn("%s: %llu entries found >= limit %u holders already inside (limit broken)",
                label, (unsigned long long)over, run->limit);
    char why[160];
    if (!impl->quiet(run->gate, run->limit, why, sizeof why))
        gb_warn("%s: gate not quiet after the run: %s", label, why);
}

/*
 * Threads that have not returned GB_WATCHDOG_NS after stop are stuck inside
 * acquire. Report it, then abandon them: lowest CPU priority, detached, and
 * their gate, run and arena leaked (they still point into them), so the
 * remaining cases can run on an honest machine.
 */
static void gb_abandon_stuck(struct gb_handoff *h, const struct gb_impl *impl, struct gb_run *run,
                             const pthread_t *tids, int n_threads, const char *label)
{
    gb_warn("%s: %d of %d threads still inside acquire %.0f s after stop (stuck waiter); "
            "abandoning them",
            label, n_threads - atomic_load(&run->finished), n_threads, GB_WATCHDOG_NS / 1e9);
    if (impl == &gb_impl_sluice) {
        struct sluice_gate_counts st = sluice_gate_stats(run->gate);
        gb_warn("%s: sluice_gate_stats: limit %u in_flight %u waiting %u", label, st.limit,
                st.in_flight, st.waiting);
    }
    for (int i = 0; i < n_threads; i++) {
        if (atomic_load(&h->arena->threads[i].done)) {
            pthread_join(tids[i], NULL);
            continue;
        }
        struct sched_param idle = {.sched_priority = 0};
        pthread_setschedparam(tids[i], SCHED_IDLE, &idle);
        pthread_detach(tids[i]);
    }
    h->arena = gb_arena_new();
}

/* One timed run; false if its threads did not drain (nothing to report). */
static bool gb_handoff_once(struct gb_handoff *h, const struct gb_impl *impl, const char *case_name,
                            uint32_t limit, int n_threads, enum gb_body body, struct gb_result *out)
{
    char label[128];
    snprintf(label, sizeof label, "%s %s %d thr", case_name, impl->name, n_threads);
    struct gb_arena *arena = h->arena;
    struct gb_run *run = gb_alloc_line(sizeof *run);
    run->gate = impl->create(limit);
    run->limit = limit;
    run->cs_iters = h->cs_iters;
    run->think_iters = h->think_iters;
    run->body = gb_body_of(impl, body);
    size_t cap = GB_SAMPLES_TOTAL / (size_t)n_threads;
    pthread_t tids[GB_MAX_THREADS];
    for (int i = 0; i < n_threads; i++) {
        struct gb_thread *t = &arena->threads[i];
        memset(t, 0, sizeof *t);
        t->run = run;
        t->impl = impl;
        t->index = i;
        t->samples = arena->samples + (size_t)i * cap;
        t->cap = cap;
        pthread_cond_init(&t->waiter.cv, NULL);
        if (pthread_create(&tids[i], NULL, gb_handoff_thread, t) != 0) {
            fprintf(stderr, "gate bench: pthread_create failed\n");
            exit(1);
        }
    }
    while (atomic_load(&run->ready) < n_threads)
        sched_yield();
    int64_t start = bench_now_ns();
    run->start_ns = start;
    atomic_store_explicit(&run->go, true, SLUICE_RELEASE);
    gb_sleep_ns(h->run_ns);
    atomic_store(&run->stop, true);
    int64_t stopped = bench_now_ns();
    while (atomic_load(&run->finished) < n_threads) {
        if (bench_now_ns() - stopped > GB_WATCHDOG_NS) {
            gb_abandon_stuck(h, impl, run, tids, n_threads, label);
            return false;
        }
        gb_sleep_ns(1000000);
    }
    int64_t end = start;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(tids[i], NULL);
        end = arena->threads[i].end_ns > end ? arena->threads[i].end_ns : end;
    }
    gb_handoff_verify(label, impl, run, arena->threads, n_threads);

    /* Gather the samples contiguously; thread i's segment starts at i*cap. */
    size_t total = 0;
    uint64_t min_ops = UINT64_MAX, ops = 0, timeouts = 0;
    for (int i = 0; i < n_threads; i++) {
        struct gb_thread *t = &arena->threads[i];
        memmove(arena->samples + total, t->samples, t->n_samples * sizeof *t->samples);
        total += t->n_samples;
        ops += t->ops;
        timeouts += t->timeouts;
        min_ops = t->ops < min_ops ? t->ops : min_ops;
        pthread_cond_destroy(&t->waiter.cv);
    }
    out->ops_per_s = (double)ops * 1e9 / (double)(end - start);
    out->timeouts_per_s = (double)timeouts * 1e9 / (double)(end - start);
    out->min_share = ops ? (double)min_ops * n_threads / (double)ops : 0;
    out->waits = gb_wait_stats(arena->samples, total);
    impl->destroy(run->gate);
    free(run);
    return true;
}

/* One row per implementation: every repetition runs each implementation once,
 * in an order that rotates, and the row reports medians over repetitions. */
static void gb_handoff_row(struct gb_handoff *h, const struct bench_opts *opts,
                           const char *case_name, uint32_t limit, int n_threads, enum gb_body body)
{
    enum { N = GB_N_IMPLS };
    int repeats = gb_repeats(opts);
    static double ops[N][GB_MAX_REPEATS], p50[N][GB_MAX_REPEATS], p99[N][GB_MAX_REPEATS],
        p999[N][GB_MAX_REPEATS], max[N][GB_MAX_REPEATS], share[N][GB_MAX_REPEATS],
        tmo[N][GB_MAX_REPEATS], samples[N][GB_MAX_REPEATS];
    int ok[N] = {0}, hung[N] = {0};
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < N; k++) {
            int i = (k + r) % N;
            if (!gb_body_of(gb_impls[i], body))
                continue;
            struct gb_result res;
            if (!gb_handoff_once(h, gb_impls[i], case_name, limit, n_threads, body, &res)) {
                hung[i]++;
                continue;
            }
            int j = ok[i]++;
            ops[i][j] = res.ops_per_s;
            p50[i][j] = res.waits.p50;
            p99[i][j] = res.waits.p99;
            p999[i][j] = res.waits.p999;
            max[i][j] = res.waits.max;
            share[i][j] = res.min_share;
            tmo[i][j] = res.timeouts_per_s;
            samples[i][j] = (double)res.waits.n;
        }
    }
    for (int i = 0; i < N; i++) {
        if (!gb_body_of(gb_impls[i], body))
            continue;
        struct bench_row row = bench_row_make(case_name, gb_impls[i]->name, n_threads);
        if (ok[i]) {
            row.ops_per_s = gb_median_of(ops[i], ok[i]);
            row.median_ns = gb_median_of(p50[i], ok[i]);
            row.p99_ns = gb_median_of(p99[i], ok[i]);
            row.p999_ns = gb_median_of(p999[i], ok[i]);
            row.max_wait_ns = gb_median_of(max[i], ok[i]);
            bench_row_extra(&row, "min_share", gb_median_of(share[i], ok[i]));
            bench_row_extra(&row, "samples", gb_median_of(samples[i], ok[i]));
            if (body == GB_STORM)
                bench_row_extra(&row, "timeouts_per_s", gb_median_of(tmo[i], ok[i]));
        }
        if (hung[i])
            bench_row_extra(&row, "HUNG_runs", hung[i]);
        bench_emit(&row);
    }
}

/* Thread counts for the contended cases: 2, 4, 8, or the comma-separated
 * list in SLUICE_BENCH_GATE_THREADS (e.g. "4,8,16" on a larger machine; at
 * most GB_MAX_THREADS each). */
static int gb_thread_counts(int *out, int cap)
{
    const char *env = getenv("SLUICE_BENCH_GATE_THREADS");
    int n = 0;
    if (env) {
        for (const char *p = env; *p && n < cap;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (v >= 1 && v <= GB_MAX_THREADS)
                out[n++] = (int)v;
            p = *end == ',' ? end + 1 : end;
        }
    }
    if (n == 0) {
        static const int defaults[] = {2, 4, 8};
        for (n = 0; n < 3; n++)
            out[n] = defaults[n];
    }
    return n;
}

/* Calibrate once and size the runs: GB_ROW_BUDGET_NS per row, all repeats. */
static void gb_handoff_setup(struct gb_handoff *h, const struct bench_opts *opts)
{
    if (h->arena)
        return;
    h->arena = gb_arena_new();
    h->cs_iters = gb_spin_iters_for(GB_CS_NS);
    h->think_iters = gb_spin_iters_for(GB_THINK_NS);
    int64_t per_run = (int64_t)(GB_ROW_BUDGET_NS * opts->scale) / gb_repeats(opts);
    h->run_ns = per_run > GB_MIN_RUN_NS ? per_run : GB_MIN_RUN_NS;
}

/* One handoff-style case at each of `limits` and every thread count: the
 * zero-hold throughput rows (gate.handoff.lN) and the 100 us-hold latency
 * rows (gate.handoff_latency.lN) differ only in their mode and legend. */
static void gb_case_limits(const struct bench_opts *opts, struct gb_handoff *h,
                           const char *prefix, const uint32_t *limits, size_t n_limits,
                           enum gb_body mode)
{
    int threads[8], n_threads = gb_thread_counts(threads, 8);
    for (size_t l = 0; l < n_limits; l++) {
        char case_name[40];
        snprintf(case_name, sizeof case_name, "%s.l%u", prefix, limits[l]);
        if (!bench_case_enabled(opts, case_name))
            continue;
        gb_handoff_setup(h, opts);
        if (mode == GB_HANDOFF)
            printf("  (%s: critical section %d ns = %u spins, think %d ns = %u spins, "
                   "%.0f ms per run; wait = acquire call to permit held; values are medians "
                   "over repeats)\n",
                   case_name, GB_CS_NS, h->cs_iters, GB_THINK_NS, h->think_iters,
                   (double)h->run_ns / 1e6);
        else
            printf("  (%s: each holder works %d us busy; p50/p99/max = release() call to "
                   "another thread's return from acquire; ops_per_s = acquires; no waiter when "
                   "threads <= limit, so no samples)\n",
                   case_name, GB_HOLD_NS / 1000);
        for (int t = 0; t < n_threads; t++)
            gb_handoff_row(h, opts, case_name, limits[l], threads[t], mode);
    }
}

static void gb_case_handoff(const struct bench_opts *opts, struct gb_handoff *h)
{
    static const uint32_t limits[] = {1, 2, 4};
    gb_case_limits(opts, h, "gate.handoff", limits, sizeof limits / sizeof limits[0], GB_HANDOFF);
}

/* ---- gate.handoff_latency.lN and gate.cancel_storm ------------------------- */

static void gb_case_latency(const struct bench_opts *opts, struct gb_handoff *h)
{
    static const uint32_t limits[] = {1, 4};
    gb_case_limits(opts, h, "gate.handoff_latency", limits, sizeof limits / sizeof limits[0],
                   GB_LATENCY);
}

static void gb_case_storm(const struct bench_opts *opts, struct gb_handoff *h)
{
    if (!bench_case_enabled(opts, "gate.cancel_storm"))
        return;
    int threads[8], n_threads = gb_thread_counts(threads, 8);
    gb_handoff_setup(h, opts);
    printf("  (gate.cancel_storm, limit 2: 1 slow holder keeps a permit all run, 2 threads "
           "cycle the other (%d us work), the rest wait %d us and give up, again and again; "
           "ops_per_s = grants, timeouts_per_s = abandoned waits, p50/p99/max = waits that "
           "got the permit; condvar_fifo has no timed wait)\n",
           GB_STORM_WORK_NS / 1000, GB_STORM_PATIENCE_NS / 1000);
    for (int t = 0; t < n_threads; t++)
        if (threads[t] >= 4)
            gb_handoff_row(h, opts, "gate.cancel_storm", 2, threads[t], GB_STORM);
}

static void bench_gate(const struct bench_opts *opts)
{
    gb_warnings = 0;
    struct gb_handoff h = {0};
    gb_case_uncontended(opts);
    gb_case_handoff(opts, &h);
    gb_case_latency(opts, &h);
    gb_case_storm(opts, &h);
    if (h.arena)
        gb_arena_free(h.arena);
    gb_case_cancel_fire(opts);
    if (gb_warnings)
        printf("  !!! gate: %d verification warning(s) above\n", gb_warnings);
}

BENCH_REGISTER(gate, bench_gate, false)
