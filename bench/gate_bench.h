/*
 * gate_bench.h — what the gate bench's files share: the records the timed
 * loops write into, the table of implementations (gate_impls.c, the
 * baselines in gate_baselines.h), the statistics kit and the helpers
 * (gate_stats.c). The cases are in gate_cases.c, which says what each one
 * measures, and gate_cancel_fire.c.
 */
#ifndef SLUICE_BENCH_GATE_BENCH_H
#define SLUICE_BENCH_GATE_BENCH_H

#include "harness.h"

#include <pthread.h>
#include <time.h>

#include <sluice/gate.h>

#define GB_ALWAYS_INLINE static inline __attribute__((always_inline))
#define GB_BATCH 1000             /* pairs per timed batch (uncontended) */
#define GB_CS_NS 150              /* critical section length (handoff) */
#define GB_THINK_NS 100           /* think time outside the gate (handoff) */
#define GB_ROW_BUDGET_NS 800000000 /* handoff: wall time per row, all repeats */
#define GB_MIN_RUN_NS 50000000    /* handoff: shortest single run */
#define GB_SAMPLES_TOTAL (UINT32_C(8) << 20) /* wait samples kept per run */
#define GB_WATCHDOG_NS (INT64_C(3) * 1000000000) /* a run that does not drain */
#define GB_MAX_THREADS 16
#define GB_HOLD_NS 100000           /* handoff_latency: busy work per permit held */
#define GB_STORM_WORK_NS 20000      /* cancel_storm: the cycling workers' work per permit */
#define GB_STORM_PATIENCE_NS 200000 /* cancel_storm: how long the others wait before giving up */
#define GB_MAX_REPEATS 64

/* ---- helpers (gate_stats.c) ------------------------------------------------ */

extern int gb_warnings; /* "!!! WARNING" lines since bench_gate began */
__attribute__((format(printf, 1, 2))) void gb_warn(const char *fmt, ...);
void *gb_alloc_line(size_t size);
void gb_sleep_ns(int64_t ns);
int gb_repeats(const struct bench_opts *opts);

/* ---- per-thread waiter record (used by condvar_fifo, ignored by others) --- */

struct gb_waiter {
    pthread_cond_t cv;
    bool granted;
    struct gb_waiter *next;
};

typedef void (*gb_acquire_fn)(void *gate, struct gb_waiter *w);
typedef bool (*gb_acquire_until_fn)(void *gate, struct gb_waiter *w,
                                    const struct timespec *deadline);
typedef void (*gb_release_fn)(void *gate);

/* ---- what a run's threads share and write into ------------------------------ */

struct gb_thread;

struct gb_run {
    void *gate;
    uint32_t limit;
    uint32_t cs_iters, think_iters;
    _Atomic(int) ready;
    _Atomic(int) finished;
    _Atomic(bool) go;
    _Atomic(bool) stop;
    void (*body)(struct gb_thread *t); /* the impl's loop for this case */
    int64_t start_ns;                   /* the threads' time origin (handoff_latency) */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) cs_word;
    /* handoff_latency: the latest release not yet followed by another
     * thread's return from acquire, as (ns since start_ns) << 8 | index + 1. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) release_stamp;
};

struct gb_thread {
    struct gb_run *run;
    const struct gb_impl *impl;
    int index;
    uint32_t *samples; /* preallocated and pre-faulted */
    size_t cap;
    uint64_t ops, over_limit;
    size_t n_samples;  /* samples[] written (wait times, or release-to-return latencies) */
    uint64_t timeouts; /* cancel_storm: timed waits that gave up */
    int64_t end_ns;
    _Atomic(bool) done;
    struct gb_waiter waiter;
} SLUICE_ALIGNED(SLUICE_CACHELINE);

struct gb_impl {
    const char *name;
    void *(*create)(uint32_t limit);
    void (*destroy)(void *gate);
    /* Is the gate back to `limit` free permits and nobody waiting? */
    bool (*quiet)(void *gate, uint32_t limit, char *why, size_t len);
    void (*pairs)(void *gate, struct gb_waiter *w, uint64_t pairs);
    void (*handoff)(struct gb_thread *t); /* NULL: not a gate (uncontended only) */
    void (*latency)(struct gb_thread *t); /* NULL: not a gate */
    void (*storm)(struct gb_thread *t);   /* NULL: no timed acquire */
};

/* sluice, sem_t, condvar_fifo, atomic_pair (gate_impls.c): the cases rotate
 * through them in this order. */
#define GB_N_IMPLS 4
extern const struct gb_impl *const gb_impls[GB_N_IMPLS];
extern const struct gb_impl gb_impl_sluice;

/* Spin iterations that take `ns` on this machine (gate_impls.c). */
uint32_t gb_spin_iters_for(int64_t ns);

/* ---- statistics (gate_stats.c) ---------------------------------------------- */

double gb_median_of(double *v, int n);

struct gb_waits {
    double p50, p99, p999, max;
    size_t n;
};

/* p50, p99, p99.9 and max of `a` (reordered in place), by the rank rule of
 * bench_percentile. */
struct gb_waits gb_wait_stats(uint32_t *a, size_t n);

/* gate.cancel_fire (gate_cancel_fire.c). */
void gb_case_cancel_fire(const struct bench_opts *opts);

#endif
