/*
 * gate_impls.c — the implementations the gate cases run, all in this
 * process, all cache-line aligned, and the timed loops each one runs:
 *   sluice        sluice_gate_acquire / sluice_gate_release (strict FIFO;
 *                 cancel_storm: sluice_gate_acquire with a deadline)
 *   sem_t         POSIX sem_wait / sem_post (a releaser may barge back in;
 *                 cancel_storm: sem_clockwait)
 *   condvar_fifo  mutex + explicit FIFO queue of waiters, one condvar per
 *                 waiter, direct hand-off on release (strict FIFO, no herd)
 *   atomic_pair   fetch_add + fetch_sub on one counter: the floor for the
 *                 uncontended case (not a gate, so not in handoff)
 *
 * The baselines' adapters are in gate_baselines.h. The loops are
 * instantiated once per implementation with its acquire and release
 * inlined, so every adapter and loop lives in this translation unit; the
 * cases (gate_cases.c) reach them through the gb_impls table.
 */
#include "gate_bench.h"
#include "gate_baselines.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

/* ---- the two timed loops, instantiated per implementation ---------------- */

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
    const struct gb_impl gb_impl_##id = {label,                                                    \
                                          gb_##id##_create,                                        \
                                          gb_##id##_destroy,                                       \
                                          gb_##id##_quiet,                                         \
                                          gb_##id##_pairs,                                         \
                                          gate_loops ? gb_##id##_handoff : NULL,                   \
                                          gate_loops ? gb_##id##_latency : NULL,                   \
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

const struct gb_impl *const gb_impls[] = {&gb_impl_sluice, &gb_impl_sem, &gb_impl_cvq,
                                          &gb_impl_pair};
_Static_assert(sizeof gb_impls / sizeof gb_impls[0] == GB_N_IMPLS, "GB_N_IMPLS counts gb_impls");

/* Spin iterations that take `ns` on this machine (best of several tries). */
uint32_t gb_spin_iters_for(int64_t ns)
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
