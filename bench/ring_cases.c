/*
 * Ring cases: sluice's MPMC ring next to Concurrency Kit's ck_ring (mpmc
 * calls), a textbook Vyukov bounded queue and a mutex-guarded array ring,
 * all with RING_CAPACITY slots, run in the same process and interleaved
 * repeat by repeat, in an order that rotates each repeat (whichever ran
 * first was measurably slower on a shared 2-CPU machine), so machine noise
 * hits every implementation alike.
 *
 *   ring.uncontended  one thread: push one item, pop it, repeat. Per-op ns
 *                     (an op is one push or one pop) per batch: median and
 *                     p99 over batches; ops/s over the whole run.
 *   ring.mpmc         2 and 4 threads, half producers, half consumers, one
 *                     producer and one consumer per CPU where there are
 *                     enough. Throughput in ops/s, and per-op ns of each
 *                     thread's batches (waits for full/empty included).
 *
 * Every number is the median across opts->repeats repetitions. A full or
 * empty ring is retried the same way for every implementation: spin, then
 * yield (this machine may have fewer CPUs than threads).
 */
#include "harness.h"

#include <ck_ring.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/ring.h>

#define RING_CAPACITY 1024u
#define BATCH 256 /* ops per latency sample */
#define MAX_THREADS 4
#define MAX_REPEATS 64

/* ---- implementations: a state type, NAME_init/fini/push/pop -------------- */

struct sluice_state {
    struct sluice_ring ring;
    struct sluice_ring_slot slots[RING_CAPACITY];
};

static void sluice_init(struct sluice_state *s)
{
    if (sluice_ring_init(&s->ring, s->slots, RING_CAPACITY) != SLUICE_OK)
        abort();
}

static void sluice_fini(struct sluice_state *s)
{
    (void)s;
}

static inline bool sluice_push(struct sluice_state *s, void *item)
{
    return sluice_ring_trypush(&s->ring, item) == SLUICE_OK;
}

static inline bool sluice_pop(struct sluice_state *s, void **out)
{
    return sluice_ring_trypop(&s->ring, out) == SLUICE_OK;
}

/* ck_ring keeps one slot open to tell full from empty: 1023 usable. */
struct ck_state {
    ck_ring_t ring;
    ck_ring_buffer_t buffer[RING_CAPACITY] __attribute__((aligned(64)));
};

static void ck_init(struct ck_state *s)
{
    ck_ring_init(&s->ring, RING_CAPACITY);
}

static void ck_fini(struct ck_state *s)
{
    (void)s;
}

static inline bool ck_push(struct ck_state *s, void *item)
{
    return ck_ring_enqueue_mpmc(&s->ring, s->buffer, item);
}

static inline bool ck_pop(struct ck_state *s, void **out)
{
    return ck_ring_dequeue_mpmc(&s->ring, s->buffer, out);
}

/*
 * The textbook bounded MPMC queue (D. Vyukov, 1024cores.net), transcribed
 * to C11 as published: padded positions, acquire/release on the cell
 * sequence, relaxed weak CAS on the position.
 */
struct vyukov_cell {
    _Atomic(size_t) sequence;
    void *data;
};

struct vyukov_state {
    char pad0[64];
    struct vyukov_cell *buffer;
    size_t buffer_mask;
    char pad1[64];
    _Atomic(size_t) enqueue_pos;
    char pad2[64];
    _Atomic(size_t) dequeue_pos;
    char pad3[64];
    struct vyukov_cell cells[RING_CAPACITY];
};

static void vyukov_init(struct vyukov_state *s)
{
    s->buffer = s->cells;
    s->buffer_mask = RING_CAPACITY - 1;
    for (size_t i = 0; i < RING_CAPACITY; i++)
        atomic_init(&s->cells[i].sequence, i);
    atomic_init(&s->enqueue_pos, 0);
    atomic_init(&s->dequeue_pos, 0);
}

static void vyukov_fini(struct vyukov_state *s)
{
    (void)s;
}

static inline bool vyukov_push(struct vyukov_state *s, void *data)
{
    struct vyukov_cell *cell;
    size_t pos = atomic_load_explicit(&s->enqueue_pos, memory_order_relaxed);
    for (;;) {
        cell = &s->buffer[pos & s->buffer_mask];
        size_t seq = atomic_load_explicit(&cell->sequence, memory_order_acquire);
        intptr_t dif = (intptr_t)seq - (intptr_t)pos;
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&s->enqueue_pos, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                break;
        } else if (dif < 0) {
            return false;
        } else {
            pos = atomic_load_explicit(&s->enqueue_pos, memory_order_relaxed);
        }
    }
    cell->data = data;
    atomic_store_explicit(&cell->sequence, pos + 1, memory_order_release);
    return true;
}

static inline bool vyukov_pop(struct vyukov_state *s, void **data)
{
    struct vyukov_cell *cell;
    size_t pos = atomic_load_explicit(&s->dequeue_pos, memory_order_relaxed);
    for (;;) {
        cell = &s->buffer[pos & s->buffer_mask];
        size_t seq = atomic_load_explicit(&cell->sequence, memory_order_acquire);
        intptr_t dif = (intptr_t)seq - (intptr_t)(pos + 1);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&s->dequeue_pos, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                break;
        } else if (dif < 0) {
            return false;
        } else {
            pos = atomic_load_explicit(&s->dequeue_pos, memory_order_relaxed);
        }
    }
    *data = cell->data;
    atomic_store_explicit(&cell->sequence, pos + s->buffer_mask + 1, memory_order_release);
    return true;
}

/* A pthread mutex around a plain array ring: what a careful person writes first. */
struct mutex_state {
    pthread_mutex_t lock;
    uint64_t head, tail;
    void *items[RING_CAPACITY];
};

static void mutex_init(struct mutex_state *s)
{
    pthread_mutex_init(&s->lock, NULL);
    s->head = s->tail = 0;
}

static void mutex_fini(struct mutex_state *s)
{
    pthread_mutex_destroy(&s->lock);
}

static inline bool mutex_push(struct mutex_state *s, void *item)
{
    pthread_mutex_lock(&s->lock);
    bool ok = s->tail - s->head < RING_CAPACITY;
    if (ok)
        s->items[s->tail++ % RING_CAPACITY] = item;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

static inline bool mutex_pop(struct mutex_state *s, void **out)
{
    pthread_mutex_lock(&s->lock);
    bool ok = s->tail != s->head;
    if (ok)
        *out = s->items[s->head++ % RING_CAPACITY];
    pthread_mutex_unlock(&s->lock);
    return ok;
}

/* ---- the measured loops, stamped out once per implementation -------------- */

/* Full or empty: spin a little, then give the CPU to the other side. */
#define RING_RETRY(op)                                                                             \
    do {                                                                                           \
        unsigned fails_ = 0;                                                                       \
        while (!(op)) {                                                                            \
            if (++fails_ % 64 == 0)                                                                \
                sched_yield();                                                                     \
            else                                                                                   \
                sluice_cpu_relax();                                                                \
        }                                                                                          \
    } while (0)

struct mpmc_thread {
    void *state;
    int index;
    bool producer;
    uint64_t n_items; /* this thread pushes or pops exactly this many */
    double *samples;  /* per-op ns of each BATCH */
    uint64_t n_samples;
    uint64_t sum; /* of popped items: proves nothing was lost */
    _Atomic(int) *ready;
    _Atomic(int) *go;
} __attribute__((aligned(64)));

static void mpmc_wait_for_go(struct mpmc_thread *t)
{
    bench_pin(t->index);
    atomic_fetch_add(t->ready, 1);
    while (!atomic_load_explicit(t->go, memory_order_acquire))
        sched_yield();
}

/* Items are 1..n so that a lost or duplicated item changes the sum. */
#define RING_IMPL_DEFINE(name)                                                                     \
    static void name##_uncontended(void *state, uint64_t n_batches, double *samples)               \
    {                                                                                              \
        struct name##_state *s = state;                                                            \
        void *out = NULL;                                                                          \
        for (uint64_t b = 0; b < n_batches; b++) {                                                 \
            int64_t t0 = bench_now_ns();                                                           \
            for (uintptr_t i = 1; i <= BATCH; i++) {                                               \
                if (!name##_push(s, (void *)i) || !name##_pop(s, &out))                            \
                    abort();                                                                       \
            }                                                                                      \
            samples[b] = (double)(bench_now_ns() - t0) / (2.0 * BATCH);                            \
            BENCH_KEEP(out);                                                                       \
        }                                                                                          \
    }                                                                                              \
    static void *name##_mpmc_main(void *arg)                                                       \
    {                                                                                              \
        struct mpmc_thread *t = arg;                                                               \
        struct name##_state *s = t->state;                                                         \
        uint64_t sum = 0, done = 0;                                                                \
        mpmc_wait_for_go(t);                                                                       \
        for (uint64_t b = 0; done < t->n_items; b++) {                                             \
            uint64_t n = t->n_items - done < BATCH ? t->n_items - done : BATCH;                    \
            int64_t t0 = bench_now_ns();                                                           \
            for (uint64_t i = 0; i < n; i++) {                                                     \
                if (t->producer) {                                                                 \
                    void *item = (void *)(uintptr_t)(done + i + 1);                                \
                    RING_RETRY(name##_push(s, item));                                              \
                } else {                                                                           \
                    void *item;                                                                    \
                    RING_RETRY(name##_pop(s, &item));                                              \
                    sum += (uintptr_t)item;                                                        \
                }                                                                                  \
            }                                                                                      \
            if (n == BATCH)                                                                        \
                t->samples[t->n_samples++] = (double)(bench_now_ns() - t0) / BATCH;                \
            done += n;                                                                             \
        }                                                                                          \
        t->sum = sum;                                                                              \
        return NULL;                                                                               \
    }                                                                                              \
    static void *name##_create(void)                                                               \
    {                                                                                              \
        size_t size = (sizeof(struct name##_state) + 63) / 64 * 64;                                \
        struct name##_state *s = aligned_alloc(64, size);                                          \
        if (!s)                                                                                    \
            abort();                                                                               \
        memset(s, 0, size);                                                                        \
        name##_init(s);                                                                            \
        return s;                                                                                  \
    }                                                                                              \
    static void name##_destroy(void *state)                                                        \
    {                                                                                              \
        name##_fini(state);                                                                        \
        free(state);                                                                               \
    }

RING_IMPL_DEFINE(sluice)
RING_IMPL_DEFINE(ck)
RING_IMPL_DEFINE(vyukov)
RING_IMPL_DEFINE(mutex)

struct ring_impl {
    const char *name;
    void *(*create)(void);
    void (*destroy)(void *state);
    void (*uncontended)(void *state, uint64_t n_batches, double *samples);
    void *(*mpmc_main)(void *arg);
};

#define RING_IMPL_ENTRY(label, name)                                                               \
    {label, name##_create, name##_destroy, name##_uncontended, name##_mpmc_main}

/* sluice first: the harness compares every other row of a case with it. */
static const struct ring_impl ring_impls[] = {
    RING_IMPL_ENTRY("sluice", sluice),
    RING_IMPL_ENTRY("ck_ring", ck),
    RING_IMPL_ENTRY("vyukov", vyukov),
    RING_IMPL_ENTRY("mutex", mutex),
};
#define N_IMPLS (sizeof ring_impls / sizeof ring_impls[0])

/* One repetition's numbers for one implementation. */
struct rep_result {
    double median_ns, p99_ns, ops_per_s;
};

static struct rep_result summarize(double *samples, size_t n, double ops, double elapsed_ns)
{
    struct rep_result r;
    r.median_ns = bench_median(samples, n);
    r.p99_ns = bench_percentile(samples, n, 99.0);
    r.ops_per_s = ops / (elapsed_ns / 1e9);
    return r;
}

static void emit_medians(const char *case_name, const char *impl, int threads,
                         const struct rep_result *reps, int n_reps)
{
    double med[MAX_REPEATS], p99[MAX_REPEATS], ops[MAX_REPEATS];
    for (int i = 0; i < n_reps; i++) {
        med[i] = reps[i].median_ns;
        p99[i] = reps[i].p99_ns;
        ops[i] = reps[i].ops_per_s;
    }
    struct bench_row row = bench_row_make(case_name, impl, threads);
    row.median_ns = bench_median(med, (size_t)n_reps);
    row.p99_ns = bench_median(p99, (size_t)n_reps);
    row.ops_per_s = bench_median(ops, (size_t)n_reps);
    bench_emit(&row);
}

static int repeats(const struct bench_opts *opts)
{
    return opts->repeats < MAX_REPEATS ? opts->repeats : MAX_REPEATS;
}

static struct rep_result uncontended_once(const struct ring_impl *impl, uint64_t n_batches,
                                          double *samples)
{
    void *state = impl->create();
    impl->uncontended(state, n_batches / 10 + 1, samples); /* warm caches and branch predictors */
    int64_t t0 = bench_now_ns();
    impl->uncontended(state, n_batches, samples);
    double elapsed = (double)(bench_now_ns() - t0);
    impl->destroy(state);
    return summarize(samples, n_batches, 2.0 * BATCH * (double)n_batches, elapsed);
}

/*
 * Runs on its own pinned thread. That also makes the process
 * multi-threaded before anything is measured: glibc skips the atomics in
 * pthread_mutex_lock while a process has only ever had one thread, which
 * would flatter the mutex baseline beyond what any real MPMC user sees.
 */
static void *ring_uncontended_main(void *arg)
{
    const struct bench_opts *opts = arg;
    uint64_t n_batches = bench_iters(opts, 8000, 200);
    double *samples = malloc(n_batches * sizeof *samples);
    static struct rep_result reps[N_IMPLS][MAX_REPEATS];
    if (!samples)
        abort();
    bench_pin(0);
    for (int r = 0; r < repeats(opts); r++)
        for (size_t k = 0; k < N_IMPLS; k++) {
            size_t i = (k + (size_t)r) % N_IMPLS; /* rotate: no impl always goes first */
            reps[i][r] = uncontended_once(&ring_impls[i], n_batches, samples);
        }
    for (size_t i = 0; i < N_IMPLS; i++)
        emit_medians("ring.uncontended", ring_impls[i].name, 1, reps[i], repeats(opts));
    free(samples);
    return NULL;
}

static void ring_uncontended(const struct bench_opts *opts)
{
    pthread_t tid;
    if (pthread_create(&tid, NULL, ring_uncontended_main, (void *)opts) != 0)
        abort();
    pthread_join(tid, NULL);
}

static struct rep_result mpmc_once(const struct ring_impl *impl, int n_threads, uint64_t n_items)
{
    int half = n_threads / 2;
    uint64_t per_thread = n_items / (uint64_t)half;
    uint64_t max_samples = per_thread / BATCH + 1;
    struct mpmc_thread threads[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    _Atomic(int) ready = 0, go = 0;
    void *state = impl->create();
    double *samples = malloc((size_t)n_threads * max_samples * sizeof *samples);
    if (!samples)
        abort();
    for (int i = 0; i < n_threads; i++) {
        /* Thread i runs on CPU i mod ncpu, producers first: on 2 CPUs
         * each CPU gets one producer and one consumer. */
        threads[i] = (struct mpmc_thread){.state = state,
                                          .index = i,
                                          .producer = i < half,
                                          .n_items = per_thread,
                                          .samples = samples + (size_t)i * max_samples,
                                          .ready = &ready,
                                          .go = &go};
        if (pthread_create(&tids[i], NULL, impl->mpmc_main, &threads[i]) != 0)
            abort();
    }
    while (atomic_load(&ready) < n_threads)
        sched_yield();
    int64_t t0 = bench_now_ns();
    atomic_store_explicit(&go, 1, memory_order_release);
    for (int i = 0; i < n_threads; i++)
        pthread_join(tids[i], NULL);
    double elapsed = (double)(bench_now_ns() - t0);

    uint64_t sum = 0, expected = (uint64_t)half * (per_thread * (per_thread + 1) / 2);
    size_t n_samples = 0;
    for (int i = 0; i < n_threads; i++) {
        sum += threads[i].sum;
        memmove(samples + n_samples, threads[i].samples, threads[i].n_samples * sizeof *samples);
        n_samples += threads[i].n_samples;
    }
    if (sum != expected) {
        fprintf(stderr, "ring.mpmc: %s lost or duplicated items (sum %llu, expected %llu)\n",
                impl->name, (unsigned long long)sum, (unsigned long long)expected);
        abort();
    }
    impl->destroy(state);
    struct rep_result r = summarize(samples, n_samples, 2.0 * (double)half * (double)per_thread,
                                    elapsed);
    free(samples);
    return r;
}

static void ring_mpmc(const struct bench_opts *opts)
{
    static const int thread_counts[] = {2, 4};
    uint64_t n_items = bench_iters(opts, 1000000, 20000);
    for (size_t c = 0; c < sizeof thread_counts / sizeof thread_counts[0]; c++) {
        int n = thread_counts[c];
        struct rep_result reps[N_IMPLS][MAX_REPEATS];
        for (size_t i = 0; i < N_IMPLS; i++) /* warm-up, discarded */
            mpmc_once(&ring_impls[i], n, n_items / 10);
        for (int r = 0; r < repeats(opts); r++)
            for (size_t k = 0; k < N_IMPLS; k++) {
                size_t i = (k + (size_t)r) % N_IMPLS; /* rotate: no impl always goes first */
                reps[i][r] = mpmc_once(&ring_impls[i], n, n_items);
            }
        for (size_t i = 0; i < N_IMPLS; i++)
            emit_medians("ring.mpmc", ring_impls[i].name, n, reps[i], repeats(opts));
    }
}

static void ring_cases(const struct bench_opts *opts)
{
    if (bench_case_enabled(opts, "ring.uncontended"))
        ring_uncontended(opts);
    if (bench_case_enabled(opts, "ring.mpmc"))
        ring_mpmc(opts);
}

BENCH_REGISTER(ring, ring_cases, false)
