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
 * Implementations, all in this process, all cache-line aligned:
 *   sluice        sluice_gate_acquire / sluice_gate_release (strict FIFO;
 *                 cancel_storm: sluice_gate_acquire with a deadline)
 *   sem_t         POSIX sem_wait / sem_post (a releaser may barge back in;
 *                 cancel_storm: sem_clockwait)
 *   condvar_fifo  mutex + explicit FIFO queue of waiters, one condvar per
 *                 waiter, direct hand-off on release (strict FIFO, no herd)
 *   atomic_pair   fetch_add + fetch_sub on one counter: the floor for the
 *                 uncontended case (not a gate, so not in handoff)
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
 * Why one file of this size: every case runs the same implementations
 * (sluice, sem_t, condvar_fifo, ...) through one adapter table and one set
 * of thread drivers; split by case, each file would need the adapters again.
 */
#include "harness.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int gb_warnings;

__attribute__((format(printf, 1, 2))) static void gb_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  !!! WARNING: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    gb_warnings++;
}

static void *gb_alloc_line(size_t size)
{
    size_t rounded = (size + SLUICE_CACHELINE - 1) / SLUICE_CACHELINE * SLUICE_CACHELINE;
    void *p = aligned_alloc(SLUICE_CACHELINE, rounded);
    if (!p) {
        fprintf(stderr, "gate bench: out of memory\n");
        exit(1);
    }
    memset(p, 0, rounded);
    return p;
}

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

/* ---- sluice -----------------------------------------------------------------
 * Spelled once for any gate with sluice's API: P is its name prefix, id the
 * bench's short name, so an A/B of a second gate with the same API is one
 * more instantiation. */

#define GB_SLUICE_FNS(id, P)                                                                       \
    static void *gb_##id##_create(uint32_t limit)                                                  \
    {                                                                                              \
        struct P *g;                                                                               \
        int rc = P##_create(&(struct P##_desc){.limit = limit}, &g);                               \
        if (rc != SLUICE_OK) {                                                                     \
            fprintf(stderr, "gate bench: " #P "_create: %s\n", sluice_strerror(rc));               \
            exit(1);                                                                               \
        }                                                                                          \
        return g;                                                                                  \
    }                                                                                              \
    static void gb_##id##_destroy(void *gate)                                                      \
    {                                                                                              \
        P##_destroy(gate);                                                                         \
    }                                                                                              \
    GB_ALWAYS_INLINE void gb_##id##_acquire(void *gate, struct gb_waiter *w)                       \
    {                                                                                              \
        (void)w;                                                                                   \
        int rc = P##_acquire(gate, NULL, NULL);                                                    \
        if (SLUICE_UNLIKELY(rc != SLUICE_OK))                                                      \
            gb_sluice_failed(rc);                                                                  \
    }                                                                                              \
    GB_ALWAYS_INLINE bool gb_##id##_acquire_until(void *gate, struct gb_waiter *w,                 \
                                                  const struct timespec *deadline)                 \
    {                                                                                              \
        (void)w;                                                                                   \
        int rc = P##_acquire(gate, deadline, NULL);                                                \
        if (SLUICE_UNLIKELY(rc != SLUICE_OK && rc != SLUICE_ETIMEDOUT))                            \
            gb_sluice_failed(rc);                                                                  \
        return rc == SLUICE_OK;                                                                    \
    }                                                                                              \
    GB_ALWAYS_INLINE void gb_##id##_release(void *gate)                                            \
    {                                                                                              \
        P##_release(gate);                                                                         \
    }                                                                                              \
    /* Quiet: stats say nobody holds or waits, and exactly `limit` permits                         \
     * can be taken (and no more) through the public API. */                                      \
    static bool gb_##id##_quiet(void *gate, uint32_t limit, char *why, size_t len)                 \
    {                                                                                              \
        struct P *g = gate;                                                                        \
        struct P##_counts st = P##_stats(g);                                                       \
        if (st.in_flight != 0 || st.waiting != 0 || st.limit != limit) {                           \
            snprintf(why, len, "stats limit %u in_flight %u waiting %u (want %u/0/0)", st.limit,   \
                     st.in_flight, st.waiting, limit);                                             \
            return false;                                                                          \
        }                                                                                          \
        uint32_t taken = 0;                                                                        \
        while (taken <= limit && P##_tryacquire(g) == SLUICE_OK)                                   \
            taken++;                                                                               \
        for (uint32_t i = 0; i < taken; i++)                                                       \
            P##_release(g);                                                                        \
        if (taken != limit) {                                                                      \
            snprintf(why, len, "tryacquire took %u permits on a quiet gate (want %u)", taken,      \
                     limit);                                                                       \
            return false;                                                                          \
        }                                                                                          \
        st = P##_stats(g);                                                                         \
        if (st.in_flight != 0 || st.waiting != 0) {                                                \
            snprintf(why, len, "after tryacquire/release: in_flight %u waiting %u", st.in_flight,  \
                     st.waiting);                                                                  \
            return false;                                                                          \
        }                                                                                          \
        return true;                                                                               \
    }

static void gb_sluice_failed(int rc)
{
    fprintf(stderr, "gate bench: acquire returned %s with no cancel token\n",
            sluice_status_name(rc));
    abort();
}

GB_SLUICE_FNS(sluice, sluice_gate)

/* ---- sem_t ---------------------------------------------------------------- */

static void *gb_sem_create(uint32_t limit)
{
    sem_t *s = gb_alloc_line(sizeof *s);
    if (sem_init(s, 0, limit) != 0) {
        perror("gate bench: sem_init");
        exit(1);
    }
    return s;
}

static void gb_sem_destroy(void *gate)
{
    sem_destroy(gate);
    free(gate);
}

GB_ALWAYS_INLINE void gb_sem_acquire(void *gate, struct gb_waiter *w)
{
    (void)w;
    while (SLUICE_UNLIKELY(sem_wait(gate) != 0)) {
        if (errno != EINTR) {
            perror("gate bench: sem_wait");
            abort();
        }
    }
}

GB_ALWAYS_INLINE bool gb_sem_acquire_until(void *gate, struct gb_waiter *w,
                                          const struct timespec *deadline)
{
    (void)w;
    for (;;) {
        if (sem_clockwait(gate, CLOCK_MONOTONIC, deadline) == 0)
            return true;
        if (errno == ETIMEDOUT)
            return false;
        if (errno != EINTR) {
            perror("gate bench: sem_clockwait");
            abort();
        }
    }
}

GB_ALWAYS_INLINE void gb_sem_release(void *gate)
{
    sem_post(gate);
}

static bool gb_sem_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    int value = -1;
    sem_getvalue(gate, &value);
    if (value != (int)limit) {
        snprintf(why, len, "sem_getvalue %d (want %u)", value, limit);
        return false;
    }
    return true;
}

/* ---- condvar_fifo ----------------------------------------------------------
 * A FIFO counting semaphore the classic way. Invariant: the queue is
 * non-empty only while `avail` is 0, because release hands its permit
 * straight to the head waiter instead of incrementing `avail`; so an arrival
 * can never barge past a queued waiter. Each waiter sleeps on its own
 * condvar (no herd). The signal is sent after unlocking, so the woken waiter
 * does not run into a held mutex; that is safe because waiter records live
 * until every thread of the run has been joined, and a stray signal is just
 * a spurious wake-up of a loop that re-checks `granted`.
 */

struct gb_cvq {
    pthread_mutex_t mu;
    uint32_t avail;
    struct gb_waiter *head, *tail;
};

static void *gb_cvq_create(uint32_t limit)
{
    struct gb_cvq *q = gb_alloc_line(sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    q->avail = limit;
    return q;
}

static void gb_cvq_destroy(void *gate)
{
    struct gb_cvq *q = gate;
    pthread_mutex_destroy(&q->mu);
    free(q);
}

GB_ALWAYS_INLINE void gb_cvq_acquire(void *gate, struct gb_waiter *w)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    if (q->avail > 0) {
        q->avail--;
        pthread_mutex_unlock(&q->mu);
        return;
    }
    w->granted = false;
    w->next = NULL;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    do
        pthread_cond_wait(&w->cv, &q->mu);
    while (!w->granted);
    pthread_mutex_unlock(&q->mu);
}

GB_ALWAYS_INLINE void gb_cvq_release(void *gate)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    struct gb_waiter *w = q->head;
    if (w) {
        q->head = w->next;
        if (!q->head)
            q->tail = NULL;
        w->granted = true;
    } else {
        q->avail++;
    }
    pthread_mutex_unlock(&q->mu);
    if (w)
        pthread_cond_signal(&w->cv);
}

static bool gb_cvq_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    bool ok = q->avail == limit && q->head == NULL && q->tail == NULL;
    if (!ok)
        snprintf(why, len, "avail %u queue %s (want %u, empty)", q->avail,
                 q->head ? "non-empty" : "empty", limit);
    pthread_mutex_unlock(&q->mu);
    return ok;
}

/* ---- atomic_pair (uncontended floor only) --------------------------------- */

static void *gb_pair_create(uint32_t limit)
{
    _Atomic(uint64_t) *c = gb_alloc_line(sizeof *c);
    atomic_init(c, limit);
    return (void *)c;
}

static void gb_pair_destroy(void *gate)
{
    free(gate);
}

GB_ALWAYS_INLINE void gb_pair_acquire(void *gate, struct gb_waiter *w)
{
    (void)w;
    uint64_t before = atomic_fetch_sub_explicit((_Atomic(uint64_t) *)gate, 1, SLUICE_SEQ_CST);
    BENCH_KEEP(before);
}

GB_ALWAYS_INLINE void gb_pair_release(void *gate)
{
    atomic_fetch_add_explicit((_Atomic(uint64_t) *)gate, 1, SLUICE_SEQ_CST);
}

static bool gb_pair_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    uint64_t v = atomic_load((_Atomic(uint64_t) *)gate);
    if (v != limit) {
        snprintf(why, len, "counter %llu (want %u)", (unsigned long long)v, limit);
        return false;
    }
    return true;
}

/* ---- the two timed loops, instantiated per implementation ---------------- */

static void gb_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Busy work that costs about the same on every call; calibrated below. */
GB_ALWAYS_INLINE void gb_spin(uint32_t iters)
{
    uint64_t x = iters;
    for (uint32_t i = 0; i < iters; i++) {
        x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        BENCH_KEEP(x);
    }
}

/* Holders in the low half, entries in the high half: one RMW per side. */
#define GB_CS_ENTRY ((UINT64_C(1) << 32) | 1u)

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

GB_ALWAYS_INLINE void gb_pairs_loop(void *gate, struct gb_waiter *w, uint64_t pairs,
                                    gb_acquire_fn acquire, gb_release_fn release)
{
    for (uint64_t i = 0; i < pairs; i++) {
        acquire(gate, w);
        release(gate);
    }
}

GB_ALWAYS_INLINE void gb_handoff_loop(struct gb_thread *t, gb_acquire_fn acquire,
                                      gb_release_fn release)
{
    struct gb_run *run = t->run;
    void *gate = run->gate;
    const uint32_t limit = run->limit, cs = run->cs_iters, think = run->think_iters;
    uint32_t *samples = t->samples;
    const size_t cap = t->cap;
    size_t n = 0;
    uint64_t over = 0;
    while (!atomic_load_explicit(&run->stop, SLUICE_RELAXED)) {
        int64_t t0 = bench_now_ns();
        acquire(gate, &t->waiter);
        int64_t waited = bench_now_ns() - t0;
        /* Relaxed is enough: the gate orders one holder's exit before the
         * next holder's entry, and RMWs on one word are totally ordered. */
        uint64_t before =
            atomic_fetch_add_explicit(&run->cs_word, GB_CS_ENTRY, SLUICE_RELAXED);
        over += (uint32_t)before >= limit;
        gb_spin(cs);
        atomic_fetch_sub_explicit(&run->cs_word, 1, SLUICE_RELAXED);
        release(gate);
        samples[n++] = waited > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)waited;
        if (SLUICE_UNLIKELY(n == cap)) {
            atomic_store_explicit(&run->stop, true, SLUICE_RELAXED);
            break;
        }
        gb_spin(think);
    }
    t->ops = n;
    t->n_samples = n;
    t->over_limit = over;
}

/* Enter and leave the bench's critical section: counts entries, and whether
 * `limit` holders were already inside. */
GB_ALWAYS_INLINE uint64_t gb_cs_enter(struct gb_run *run)
{
    uint64_t before = atomic_fetch_add_explicit(&run->cs_word, GB_CS_ENTRY, SLUICE_RELAXED);
    return (uint32_t)before >= run->limit;
}

GB_ALWAYS_INLINE void gb_cs_exit(struct gb_run *run)
{
    atomic_fetch_sub_explicit(&run->cs_word, 1, SLUICE_RELAXED);
}

/* Busy until `until` (ns on bench_now_ns's clock): work that holds the CPU. */
GB_ALWAYS_INLINE void gb_busy_until(int64_t until)
{
    while (bench_now_ns() < until)
        gb_spin(16);
}

/*
 * gate.handoff_latency: hold each permit for GB_HOLD_NS of busy work; stamp
 * the release; the next thread other than the stamper to return from acquire
 * takes the stamp and records the time from that release() call to its own
 * return. A thread that barges back in on its own release leaves the stamp
 * for the next waiter.
 */
GB_ALWAYS_INLINE void gb_latency_loop(struct gb_thread *t, gb_acquire_fn acquire,
                                      gb_release_fn release)
{
    struct gb_run *run = t->run;
    void *gate = run->gate;
    const uint64_t me = (uint64_t)t->index + 1;
    uint32_t *samples = t->samples;
    const size_t cap = t->cap;
    size_t n = 0;
    uint64_t ops = 0, over = 0;
    while (!atomic_load_explicit(&run->stop, SLUICE_RELAXED) && n < cap) {
        acquire(gate, &t->waiter);
        int64_t back = bench_now_ns();
        uint64_t stamp = atomic_exchange_explicit(&run->release_stamp, 0, SLUICE_ACQ_REL);
        if (stamp && (stamp & 0xff) != me) {
            int64_t lat = back - run->start_ns - (int64_t)(stamp >> 8);
            samples[n++] = lat < 0 ? 0 : lat > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)lat;
        } else if (stamp) {
            uint64_t none = 0; /* our own: keep it for the next waiter */
            atomic_compare_exchange_strong_explicit(&run->release_stamp, &none, stamp,
                                                    SLUICE_ACQ_REL, SLUICE_RELAXED);
        }
        ops++;
        over += gb_cs_enter(run);
        gb_busy_until(back + GB_HOLD_NS);
        gb_cs_exit(run);
        uint64_t rel = (uint64_t)(bench_now_ns() - run->start_ns);
        atomic_store_explicit(&run->release_stamp, rel << 8 | me, SLUICE_RELEASE);
        release(gate);
    }
    if (n == cap)
        atomic_store_explicit(&run->stop, true, SLUICE_RELAXED);
    t->ops = ops;
    t->n_samples = n;
    t->over_limit = over;
}

/*
 * gate.cancel_storm, limit 2: thread 0 is the slow holder (one permit for
 * the whole run); threads 1 and 2 cycle the other permit (wait, GB_STORM_WORK_NS
 * of work, release) and record their waits; every other thread waits at
 * most GB_STORM_PATIENCE_NS and gives up, again and again, releasing at once
 * the few permits it does get (their waits are recorded too: they did not
 * time out). So most tickets are abandoned, behind a holder that never moves.
 */
GB_ALWAYS_INLINE void gb_storm_loop(struct gb_thread *t, gb_acquire_fn acquire,
                                    gb_acquire_until_fn acquire_until, gb_release_fn release)
{
    struct gb_run *run = t->run;
    void *gate = run->gate;
    uint32_t *samples = t->samples;
    const size_t cap = t->cap;
    size_t n = 0;
    uint64_t ops = 0, over = 0, timeouts = 0;
    if (t->index == 0) {
        acquire(gate, &t->waiter);
        ops++;
        over += gb_cs_enter(run);
        while (!atomic_load_explicit(&run->stop, SLUICE_RELAXED))
            gb_sleep_ns(1000000);
        gb_cs_exit(run);
        release(gate);
    }
    while (t->index != 0 && !atomic_load_explicit(&run->stop, SLUICE_RELAXED) && n < cap) {
        int64_t t0 = bench_now_ns();
        bool got;
        if (t->index <= 2) {
            acquire(gate, &t->waiter);
            got = true;
        } else {
            int64_t until = t0 + GB_STORM_PATIENCE_NS;
            struct timespec dl = {.tv_sec = (time_t)(until / 1000000000),
                                  .tv_nsec = (long)(until % 1000000000)};
            got = acquire_until(gate, &t->waiter, &dl);
        }
        int64_t back = bench_now_ns();
        if (!got) {
            timeouts++;
            continue;
        }
        int64_t waited = back - t0;
        samples[n++] = waited > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)waited;
        ops++;
        over += gb_cs_enter(run);
        if (t->index <= 2)
            gb_busy_until(back + GB_STORM_WORK_NS);
        gb_cs_exit(run);
        release(gate);
    }
    if (n == cap)
        atomic_store_explicit(&run->stop, true, SLUICE_RELAXED);
    t->ops = ops;
    t->n_samples = n;
    t->over_limit = over;
    t->timeouts = timeouts;
}

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

/* The loops inline each implementation's acquire/release: no indirect call
 * inside the timed region, so the uncontended floor is not padded. */
#define GB_IMPL_LOOPS(id)                                                                          \
    static void gb_##id##_pairs(void *gate, struct gb_waiter *w, uint64_t pairs)                   \
    {                                                                                              \
        gb_pairs_loop(gate, w, pairs, gb_##id##_acquire, gb_##id##_release);                       \
    }                                                                                              \
    static void gb_##id##_handoff(struct gb_thread *t)                                             \
    {                                                                                              \
        gb_handoff_loop(t, gb_##id##_acquire, gb_##id##_release);                                  \
    }                                                                                              \
    static void gb_##id##_latency(struct gb_thread *t)                                             \
    {                                                                                              \
        gb_latency_loop(t, gb_##id##_acquire, gb_##id##_release);                                  \
    }
#define GB_IMPL_STORM(id)                                                                          \
    static void gb_##id##_storm(struct gb_thread *t)                                               \
    {                                                                                              \
        gb_storm_loop(t, gb_##id##_acquire, gb_##id##_acquire_until, gb_##id##_release);           \
    }
#define GB_IMPL(id, label, gate_loops, storm_loop)                                                 \
    static const struct gb_impl gb_impl_##id = {label,                                             \
                                                 gb_##id##_create,                                 \
                                                 gb_##id##_destroy,                                \
                                                 gb_##id##_quiet,                                  \
                                                 gb_##id##_pairs,                                  \
                                                 gate_loops ? gb_##id##_handoff : NULL,            \
                                                 gate_loops ? gb_##id##_latency : NULL,            \
                                                 storm_loop};

GB_IMPL_LOOPS(sluice)
GB_IMPL_STORM(sluice)
GB_IMPL_LOOPS(sem)
GB_IMPL_STORM(sem)
GB_IMPL_LOOPS(cvq)
GB_IMPL_LOOPS(pair)
GB_IMPL(sluice, "sluice", true, gb_sluice_storm)
GB_IMPL(sem, "sem_t", true, gb_sem_storm)
GB_IMPL(cvq, "condvar_fifo", true, NULL)
GB_IMPL(pair, "atomic_pair", false, NULL)

static const struct gb_impl *const gb_impls[] = {&gb_impl_sluice, &gb_impl_sem, &gb_impl_cvq,
                                                 &gb_impl_pair};
#define GB_N_IMPLS ((int)(sizeof gb_impls / sizeof gb_impls[0]))

/* ---- statistics ------------------------------------------------------------ */

static double gb_median_of(double *v, int n)
{
    return bench_median(v, (size_t)n);
}

/* Hoare quickselect: afterwards a[k] holds the k-th smallest, with nothing
 * larger before it and nothing smaller after it. O(n) on average, so the
 * millions of wait samples per run need no full sort. */
static void gb_select(uint32_t *a, ptrdiff_t n, ptrdiff_t k)
{
    ptrdiff_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        uint32_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        ptrdiff_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                uint32_t tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return;
    }
}

/* Same rank rule as bench_percentile. */
static ptrdiff_t gb_rank(size_t n, double pct)
{
    size_t idx = (size_t)ceil(pct / 100.0 * (double)n);
    idx = idx == 0 ? 0 : idx - 1;
    return (ptrdiff_t)(idx < n ? idx : n - 1);
}

struct gb_waits {
    double p50, p99, p999, max;
    size_t n;
};

static struct gb_waits gb_wait_stats(uint32_t *a, size_t n)
{
    struct gb_waits w = {0, 0, 0, 0, n};
    if (n == 0)
        return w;
    ptrdiff_t k50 = gb_rank(n, 50), k99 = gb_rank(n, 99), k999 = gb_rank(n, 99.9);
    gb_select(a, (ptrdiff_t)n, k50);
    gb_select(a + k50, (ptrdiff_t)n - k50, k99 - k50);
    gb_select(a + k99, (ptrdiff_t)n - k99, k999 - k99);
    uint32_t max = 0;
    for (size_t i = (size_t)k999; i < n; i++)
        max = a[i] > max ? a[i] : max;
    w.p50 = a[k50];
    w.p99 = a[k99];
    w.p999 = a[k999];
    w.max = max;
    return w;
}

/* Spin iterations that take `ns` on this machine (best of several tries). */
static uint32_t gb_spin_iters_for(int64_t ns)
{
    const uint32_t probe = 200000;
    int64_t best = INT64_MAX;
    for (int i = 0; i < 9; i++) {
        int64_t t0 = bench_now_ns();
        gb_spin(probe);
        int64_t dt = bench_now_ns() - t0;
        best = dt < best ? dt : best;
    }
    uint64_t iters = (uint64_t)ns * probe / (uint64_t)(best > 0 ? best : 1);
    return iters ? (uint32_t)iters : 1;
}

static int gb_repeats(const struct bench_opts *opts)
{
    return opts->repeats < GB_MAX_REPEATS ? opts->repeats : GB_MAX_REPEATS;
}

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

/* ---- gate.cancel_fire ------------------------------------------------------ */

#define GB_FIRE_WAITERS 3000
#define GB_FIRE_STACK (64 * 1024) /* waiter thread stacks: they only sleep */

struct gb_fire_run {
    struct sluice_gate *gate;
    _Atomic(int) returned;
};

struct gb_fire_waiter {
    struct gb_fire_run *run;
    struct sluice_cancel *token;
    int64_t returned_ns;
    int status;
};

static void *gb_fire_waiter_thread(void *arg)
{
    struct gb_fire_waiter *w = arg;
    w->status = sluice_gate_acquire(w->run->gate, NULL, w->token);
    w->returned_ns = bench_now_ns();
    atomic_fetch_add(&w->run->returned, 1);
    return NULL;
}

struct gb_fire_result {
    double median, p99, last, fire, per_s;
};

/* Start up to n waiters (fewer if threads run out), queue them all, cancel
 * them all; false if they did not all return ECANCELED in time. *started
 * says how many ran. */
static bool gb_fire_once(int n, bool shared, struct gb_fire_waiter *w, struct sluice_cancel *tokens,
                         pthread_t *tids, double *lat, int *started, struct gb_fire_result *out)
{
    struct gb_fire_run run = {.gate = gb_sluice_create(1)};
    atomic_init(&run.returned, 0);
    if (sluice_gate_acquire(run.gate, NULL, NULL) != SLUICE_OK)
        abort();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, GB_FIRE_STACK);
    int k = 0;
    for (; k < n; k++) {
        sluice_cancel_init(&tokens[k]);
        w[k] = (struct gb_fire_waiter){&run, shared ? &tokens[0] : &tokens[k], 0, 1};
        if (pthread_create(&tids[k], &attr, gb_fire_waiter_thread, &w[k]) != 0)
            break;
    }
    pthread_attr_destroy(&attr);
    *started = k;
    bool ok = true;
    int64_t until = bench_now_ns() + 60 * INT64_C(1000000000);
    while (sluice_gate_stats(run.gate).waiting < (uint32_t)k && (ok = bench_now_ns() < until))
        gb_sleep_ns(1000000);
    gb_sleep_ns(20000000); /* the last arrivals get into the kernel */
    int64_t t0 = bench_now_ns();
    for (int i = 0; i < (shared ? 1 : k); i++)
        sluice_cancel_fire(&tokens[i]);
    int64_t fired = bench_now_ns();
    until = fired + 60 * INT64_C(1000000000);
    while (atomic_load(&run.returned) < k && (ok = bench_now_ns() < until))
        gb_sleep_ns(100000);
    if (!ok) { /* leave the stragglers: their gate, run and tokens leak */
        gb_warn("gate.cancel_fire %s: %d of %d waiters not back 60 s after the fire; abandoning",
                shared ? "sluice" : "own_tokens", k - atomic_load(&run.returned), k);
        for (int i = 0; i < k; i++)
            pthread_detach(tids[i]);
        return false;
    }
    int64_t last = t0;
    int wrong = 0;
    for (int i = 0; i < k; i++) {
        pthread_join(tids[i], NULL);
        lat[i] = (double)(w[i].returned_ns - t0);
        last = w[i].returned_ns > last ? w[i].returned_ns : last;
        wrong += w[i].status != SLUICE_ECANCELED;
    }
    if (wrong)
        gb_warn("gate.cancel_fire: %d of %d waiters returned something other than ECANCELED",
                wrong, k);
    sluice_gate_release(run.gate);
    char why[160];
    if (!gb_sluice_quiet(run.gate, 1, why, sizeof why))
        gb_warn("gate.cancel_fire: gate not quiet after the run: %s", why);
    sluice_gate_destroy(run.gate);
    out->median = bench_median(lat, (size_t)k);
    out->p99 = bench_percentile(lat, (size_t)k, 99);
    out->last = (double)(last - t0);
    out->fire = (double)(fired - t0);
    out->per_s = out->last > 0 ? k * 1e9 / out->last : 0;
    return true;
}

static void gb_case_cancel_fire(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "gate.cancel_fire"))
        return;
    int n = (int)bench_iters(opts, GB_FIRE_WAITERS, 50);
    int repeats = gb_repeats(opts);
    /* The tokens of abandoned runs may still be in use: never freed then. */
    struct gb_fire_waiter *w = calloc((size_t)n, sizeof *w);
    struct sluice_cancel *tokens = calloc((size_t)n, sizeof *tokens);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    double *lat = calloc((size_t)n, sizeof *lat);
    if (!w || !tokens || !tids || !lat)
        exit(1);
    static double med[2][GB_MAX_REPEATS], p99[2][GB_MAX_REPEATS], last[2][GB_MAX_REPEATS],
        fire[2][GB_MAX_REPEATS], per_s[2][GB_MAX_REPEATS];
    int ok[2] = {0, 0}, started = n;
    bool healthy = true;
    printf("  (cancel_fire: %d waiters asleep on one held permit; median/p99 = first fire to the "
           "last waiter back, over repetitions)\n",
           n);
    for (int r = 0; r < repeats && healthy; r++) {
        for (int k = 0; k < 2 && healthy; k++) {
            int impl = (k + r) % 2; /* 0: one shared token, 1: a token each */
            struct gb_fire_result res;
            int got;
            healthy = gb_fire_once(started, impl == 0, w, tokens, tids, lat, &got, &res);
            if (got < started) {
                printf("  (cancel_fire: only %d threads could start; using %d)\n", got, got);
                started = got;
            }
            if (healthy && got == started) {
                int j = ok[impl]++;
                med[impl][j] = res.median;
                p99[impl][j] = res.p99;
                last[impl][j] = res.last;
                fire[impl][j] = res.fire;
                per_s[impl][j] = res.per_s;
            }
        }
    }
    static const char *const names[2] = {"sluice", "own_tokens"};
    for (int i = 0; i < 2; i++) {
        struct bench_row row = bench_row_make("gate.cancel_fire", names[i], started);
        if (ok[i]) {
            row.median_ns = gb_median_of(last[i], ok[i]);
            row.p99_ns = bench_percentile(last[i], (size_t)ok[i], 99);
            row.ops_per_s = gb_median_of(per_s[i], ok[i]);
            bench_row_extra(&row, "wake_median_ns", gb_median_of(med[i], ok[i]));
            bench_row_extra(&row, "wake_p99_ns", gb_median_of(p99[i], ok[i]));
            bench_row_extra(&row, "fire_ns", gb_median_of(fire[i], ok[i]));
        }
        bench_emit(&row);
    }
    free(lat);
    if (healthy) {
        free(w);
        free(tokens);
        free(tids);
    }
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
