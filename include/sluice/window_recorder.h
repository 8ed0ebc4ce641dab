/*
 * sluice/window_recorder.h — the lock-free two-buffer sample accumulator behind
 * discovery's windows.
 *
 * What it is: a `struct sluice_window_recorder` holds the totals of one open
 * window (counts, sums, extremes of the calls that finished in it) in one
 * of two buffers. Every finished call adds to the open buffer; the one
 * thread closing the window flips which buffer is open, waits for the
 * samples still adding to the old one, and takes its totals (resetting
 * the buffer for its next turn). Discovery (sluice/discovery.h) decides
 * what a sample counts as (measured, fresh overload, ...) and turns the
 * totals into a `struct sluice_window` for its policy; this header only
 * keeps the numbers whole.
 *
 * Progress: enter, the add functions and leave are lock-free: a handful of
 * atomic RMWs, no lock and no call out. enter retries only when a close
 * flipped the buffers between its two reads (once per close at most).
 * close is blocking, but only on the scheduler: it spins
 * SLUICE_DISCOVERY_DRAIN_SPIN pauses for the writers of the closed buffer,
 * then sched_yields, and those writers wait for nothing, so a closer waits
 * only for a preempted writer to run again; never for a lock, a store or a
 * callback.
 *
 * Concurrency: any number of threads may enter / add / leave at once and
 * with a close. At most one close at a time per accumulator (discovery
 * closes under its update lock); init before any other call.
 *
 * Memory ordering: a sample announces itself in the open buffer's writer
 * count (seq_cst RMW), then re-reads which buffer is open (seq_cst) and,
 * if a close flipped it meanwhile, withdraws and tries the other; it adds
 * its fields relaxed and leaves with a release decrement. The closer flips
 * the open buffer (seq_cst store) and waits for the old buffer's writers
 * to leave (seq_cst loads) before reading it. That is Dekker's pattern:
 * either the writer's re-read sees the flip (it moves to the new buffer),
 * or the closer's load sees the writer's announcement (it waits), so a
 * sample lands whole in one window, never its latency in one and its count
 * in the next, which would skew both windows' means. The closer reads and
 * resets the drained buffer with relaxed exchanges: the writers' release
 * decrements, read by its seq_cst loads, order their adds before them.
 * Each close numbers the buffer it opens (its tag, one more than the closed
 * one's) before the flip, so a writer whose re-read sees the flip sees the
 * tag too: a sample can tell which window it landed in.
 */
#ifndef SLUICE_WINDOW_RECORDER_H
#define SLUICE_WINDOW_RECORDER_H

#include "cc.h"

#include <math.h>
#include <sched.h>
#include <string.h>

/* Pauses a closer spins for the samples still adding to the window it closes
 * before it yields the CPU to them: each is a handful of RMWs, so only a
 * preempted writer outlasts the spin. */
#ifndef SLUICE_DISCOVERY_DRAIN_SPIN
#define SLUICE_DISCOVERY_DRAIN_SPIN 1024
#endif

/* Relaxed atomic max/min: a CAS loop that stops as soon as `v` would not win. */
#define SLUICE__ATOMIC_EXTREMUM(name, type, better)                                                \
    SLUICE_INLINE void sluice__atomic_##name(_Atomic(type) *a, type v)                             \
    {                                                                                              \
        type cur = atomic_load_explicit(a, SLUICE_RELAXED);                                        \
        while (v better cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, SLUICE_RELAXED,  \
                                                                      SLUICE_RELAXED)) {           \
        }                                                                                          \
    }
SLUICE__ATOMIC_EXTREMUM(max_u32, uint32_t, >)
SLUICE__ATOMIC_EXTREMUM(min_u32, uint32_t, <)
SLUICE__ATOMIC_EXTREMUM(max_i64, int64_t, >)
SLUICE__ATOMIC_EXTREMUM(min_i64, int64_t, <)
#undef SLUICE__ATOMIC_EXTREMUM

/* Relaxed atomic add of a double kept as its bits: a CAS loop. Sums of
 * products (latency x in flight, latency squared) overflow any integer of
 * nanoseconds within one window of long calls; a double does not. */
SLUICE_INLINE void sluice__atomic_add_f64(_Atomic(uint64_t) *a, double v)
{
    uint64_t cur = atomic_load_explicit(a, SLUICE_RELAXED), next;
    do {
        double d;
        memcpy(&d, &cur, sizeof d);
        d += v;
        memcpy(&next, &d, sizeof next);
    } while (!atomic_compare_exchange_weak_explicit(a, &cur, next, SLUICE_RELAXED, SLUICE_RELAXED));
}

SLUICE_INLINE double sluice__atomic_take_f64(_Atomic(uint64_t) *a)
{
    uint64_t bits = atomic_exchange_explicit(a, 0u, SLUICE_RELAXED); /* 0 is +0.0 */
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* One buffer: one window's totals, written by every completion. The fields
 * are the accumulator's; read them through sluice_window_recorder_close. */
struct sluice_window_buffer {
    _Atomic(uint32_t) writers; /* samples adding to this buffer right now */
    _Atomic(uint64_t) tag;     /* which window it collects for: closes so far when it opened */
    _Atomic(uint32_t) n_ok, n_overload, n_fresh, n_ignore, max_in_flight;
    _Atomic(uint32_t) n_ok_other; /* served calls outside the measured cohort (in n_ignore too) */
    _Atomic(uint32_t) n_censored; /* measured calls cut by their caller's deadline (in n_ok too) */
    _Atomic(uint32_t) overload_limit; /* lowest limit_at_start of a fresh overload; UINT32_MAX =
                                         none known */
    _Atomic(int64_t) overload_start;  /* earliest start of a fresh overload; INT64_MAX = none */
    _Atomic(int64_t) overload_latency; /* longest a fresh overload took; 0 = none */
    _Atomic(uint32_t) overload_in_flight; /* fewest in flight at a fresh overload's start;
                                             UINT32_MAX = none known */
    _Atomic(uint32_t) refused_in_flight;  /* the same over every overload, echoes included */
    _Atomic(uint32_t) served_in_flight;   /* most in flight at a served call's start */
    _Atomic(int64_t) latency_sum, latency_min, latency_dev, retry_after;
    _Atomic(int64_t) duration_sum; /* the measured calls' start-to-sample times */
    /* For the least-squares line of latency on calls in flight at start (x): sums of x and
     * x² (integers), of x·latency and latency² (doubles, in ns). */
    _Atomic(uint64_t) in_flight_sum, in_flight_sq, cross_sum, latency_sq;
};

/* The totals a close takes: plain values, "none" as 0 where the field says so. */
struct sluice_window_totals {
    uint32_t n_ok;               /* measured calls: served, or cut by their caller's deadline */
    uint32_t n_censored;         /* of n_ok, those cut by their caller's deadline */
    uint32_t n_overload;         /* overloads, echoes included */
    uint32_t n_fresh;            /* fresh overloads */
    uint32_t n_ignore;           /* calls that count for nothing (n_ok_other included) */
    uint32_t n_ok_other;         /* served calls outside the measured cohort */
    uint32_t max_in_flight;      /* most in flight at a measured call's start */
    uint32_t overload_limit;     /* lowest limit a fresh overload started under; 0 = none */
    int64_t overload_start_ns;   /* earliest start of a fresh overload; INT64_MAX = none */
    int64_t overload_latency_ns; /* longest a fresh overload took; 0 = none */
    uint32_t overload_in_flight; /* fewest in flight at a fresh overload's start; 0 = none */
    uint32_t refused_in_flight;  /* the same over every overload; 0 = none */
    uint32_t served_in_flight;   /* most in flight at any served call's start */
    int64_t latency_sum_ns, duration_sum_ns, latency_dev_ns;
    int64_t latency_min_ns;      /* INT64_MAX = no measured call */
    int64_t retry_after_ns;      /* longest Retry-After of a fresh overload; 0 = none */
    uint64_t in_flight_sum, in_flight_sq; /* measured calls: sums of x and x², x = in flight
                                             at start */
    double cross_sum, latency_sq; /* and of x·latency and latency², in ns */
};

/* The two buffers and which one is open. */
struct sluice_window_recorder {
    struct sluice_window_buffer buf[2];
    _Atomic(uint32_t) open; /* which buf[] the open window adds to */
};

SLUICE_INLINE void sluice__window_buffer_init(struct sluice_window_buffer *a)
{
    atomic_init(&a->writers, 0u);
    atomic_init(&a->tag, 0u);
    atomic_init(&a->n_ok, 0u);
    atomic_init(&a->n_overload, 0u);
    atomic_init(&a->n_fresh, 0u);
    atomic_init(&a->n_ignore, 0u);
    atomic_init(&a->n_ok_other, 0u);
    atomic_init(&a->n_censored, 0u);
    atomic_init(&a->max_in_flight, 0u);
    atomic_init(&a->overload_limit, UINT32_MAX);
    atomic_init(&a->overload_start, INT64_MAX);
    atomic_init(&a->overload_latency, 0);
    atomic_init(&a->overload_in_flight, UINT32_MAX);
    atomic_init(&a->refused_in_flight, UINT32_MAX);
    atomic_init(&a->served_in_flight, 0u);
    atomic_init(&a->latency_sum, 0);
    atomic_init(&a->duration_sum, 0);
    atomic_init(&a->latency_min, INT64_MAX);
    atomic_init(&a->latency_dev, 0);
    atomic_init(&a->retry_after, 0);
    atomic_init(&a->in_flight_sum, 0u);
    atomic_init(&a->in_flight_sq, 0u);
    atomic_init(&a->cross_sum, 0u);
    atomic_init(&a->latency_sq, 0u);
}

/* Both buffers empty, buffer 0 open. Before any other call; not concurrent. */
SLUICE_INLINE void sluice_window_recorder_init(struct sluice_window_recorder *w)
{
    sluice__window_buffer_init(&w->buf[0]);
    sluice__window_buffer_init(&w->buf[1]);
    atomic_init(&w->open, 0u);
}

/* The buffer the open window adds to, with this sample counted in its
 * writers. Pair with sluice_window_recorder_leave. Lock-free. */
SLUICE_INLINE struct sluice_window_buffer *sluice_window_recorder_enter(struct sluice_window_recorder *w)
{
    for (;;) {
        uint32_t open = atomic_load_explicit(&w->open, SLUICE_RELAXED);
        struct sluice_window_buffer *a = &w->buf[open];
        atomic_fetch_add_explicit(&a->writers, 1u, SLUICE_SEQ_CST);
        if (atomic_load_explicit(&w->open, SLUICE_SEQ_CST) == open)
            return a;
        atomic_fetch_sub_explicit(&a->writers, 1u, SLUICE_RELAXED); /* flipped: try the other */
    }
}

/* The window `a` (from sluice_window_recorder_enter) collects for: the number of closes
 * before it opened. */
SLUICE_INLINE uint64_t sluice_window_buffer_tag(const struct sluice_window_buffer *a)
{
    return atomic_load_explicit(&a->tag, SLUICE_RELAXED);
}

/* The open window's tag. By the closer, or while no close runs. */
SLUICE_INLINE uint64_t sluice_window_recorder_open_tag(const struct sluice_window_recorder *w)
{
    return sluice_window_buffer_tag(&w->buf[atomic_load_explicit(&w->open, SLUICE_RELAXED)]);
}

/* This sample is done adding to `a` (release: its adds come before). */
SLUICE_INLINE void sluice_window_recorder_leave(struct sluice_window_buffer *a)
{
    atomic_fetch_sub_explicit(&a->writers, 1u, SLUICE_RELEASE);
}

/* Whether the open window holds a fresh overload. Relaxed, lock-free; may be
 * wrong by a sample (a due test). */
SLUICE_INLINE bool sluice_window_recorder_has_fresh(struct sluice_window_recorder *w)
{
    uint32_t open = atomic_load_explicit(&w->open, SLUICE_RELAXED);
    return atomic_load_explicit(&w->buf[open].n_fresh, SLUICE_RELAXED) != 0;
}

/* A served call (measured or not): the most calls in flight at one's start. */
SLUICE_INLINE void sluice_window_buffer_add_served(struct sluice_window_buffer *a, uint32_t in_flight)
{
    sluice__atomic_max_u32(&a->served_in_flight, in_flight);
}

/* An overload. `in_flight` and `limit_at_start` are 0 where unknown; only a
 * fresh one adds its start, how long it took, its limit, in-flight count and Retry-After. */
SLUICE_INLINE void sluice_window_buffer_add_overload(struct sluice_window_buffer *a, bool fresh,
                                                     uint32_t in_flight, uint32_t limit_at_start,
                                                     int64_t started_ns, int64_t latency_ns,
                                                     int64_t retry_after_ns)
{
    atomic_fetch_add_explicit(&a->n_overload, 1u, SLUICE_RELAXED);
    if (in_flight)
        sluice__atomic_min_u32(&a->refused_in_flight, in_flight);
    if (!fresh)
        return;
    if (in_flight)
        sluice__atomic_min_u32(&a->overload_in_flight, in_flight);
    sluice__atomic_max_i64(&a->retry_after, retry_after_ns);
    if (limit_at_start)
        sluice__atomic_min_u32(&a->overload_limit, limit_at_start);
    sluice__atomic_min_i64(&a->overload_start, started_ns);
    sluice__atomic_max_i64(&a->overload_latency, latency_ns);
    atomic_fetch_add_explicit(&a->n_fresh, 1u, SLUICE_RELAXED);
}

/* A measured call, served or (`censored`) cut by its caller's deadline after latency_ns:
 * its latency, its duration (start to sample), its absolute deviation from the reference
 * latency, its in-flight count at start. */
SLUICE_INLINE void sluice_window_buffer_add_measured(struct sluice_window_buffer *a, int64_t latency_ns,
                                                     int64_t duration_ns, int64_t dev_ns,
                                                     uint32_t in_flight, bool censored)
{
    if (censored)
        atomic_fetch_add_explicit(&a->n_censored, 1u, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&a->latency_sum, latency_ns, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&a->duration_sum, duration_ns, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&a->latency_dev, dev_ns, SLUICE_RELAXED);
    sluice__atomic_min_i64(&a->latency_min, latency_ns);
    sluice__atomic_max_u32(&a->max_in_flight, in_flight);
    atomic_fetch_add_explicit(&a->in_flight_sum, in_flight, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&a->in_flight_sq, (uint64_t)in_flight * in_flight, SLUICE_RELAXED);
    sluice__atomic_add_f64(&a->cross_sum, (double)latency_ns * in_flight);
    sluice__atomic_add_f64(&a->latency_sq, (double)latency_ns * (double)latency_ns);
    atomic_fetch_add_explicit(&a->n_ok, 1u, SLUICE_RELAXED);
}

/* A call that counts for nothing; `served` if it was served all the same. */
SLUICE_INLINE void sluice_window_buffer_add_ignored(struct sluice_window_buffer *a, bool served)
{
    if (served)
        atomic_fetch_add_explicit(&a->n_ok_other, 1u, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&a->n_ignore, 1u, SLUICE_RELAXED);
}

/* Wait until no sample is adding to `a` (it is no longer open, so none can
 * join). A writer there takes no lock and calls nothing: it finishes as
 * soon as it runs, so this waits for the scheduler only. */
SLUICE_INLINE void sluice__window_buffer_drain(struct sluice_window_buffer *a)
{
    for (int i = 0; atomic_load_explicit(&a->writers, SLUICE_SEQ_CST) != 0; i++) {
        if (i < SLUICE_DISCOVERY_DRAIN_SPIN)
            sluice_cpu_relax();
        else
            sched_yield();
    }
}

/* Take the totals of `a` (drained) and reset it for its next turn. */
SLUICE_INLINE struct sluice_window_totals sluice__window_buffer_take(struct sluice_window_buffer *a)
{
    struct sluice_window_totals t;
    t.n_ok = atomic_exchange_explicit(&a->n_ok, 0u, SLUICE_RELAXED);
    t.n_overload = atomic_exchange_explicit(&a->n_overload, 0u, SLUICE_RELAXED);
    t.n_fresh = atomic_exchange_explicit(&a->n_fresh, 0u, SLUICE_RELAXED);
    t.n_ignore = atomic_exchange_explicit(&a->n_ignore, 0u, SLUICE_RELAXED);
    t.n_ok_other = atomic_exchange_explicit(&a->n_ok_other, 0u, SLUICE_RELAXED);
    t.n_censored = atomic_exchange_explicit(&a->n_censored, 0u, SLUICE_RELAXED);
    t.max_in_flight = atomic_exchange_explicit(&a->max_in_flight, 0u, SLUICE_RELAXED);
    uint32_t refused_at = atomic_exchange_explicit(&a->overload_limit, UINT32_MAX, SLUICE_RELAXED);
    t.overload_limit = refused_at == UINT32_MAX ? 0 : refused_at;
    t.overload_start_ns = atomic_exchange_explicit(&a->overload_start, INT64_MAX, SLUICE_RELAXED);
    t.overload_latency_ns = atomic_exchange_explicit(&a->overload_latency, 0, SLUICE_RELAXED);
    uint32_t fewest = atomic_exchange_explicit(&a->overload_in_flight, UINT32_MAX, SLUICE_RELAXED);
    t.overload_in_flight = fewest == UINT32_MAX ? 0 : fewest;
    uint32_t echoed = atomic_exchange_explicit(&a->refused_in_flight, UINT32_MAX, SLUICE_RELAXED);
    t.refused_in_flight = echoed == UINT32_MAX ? 0 : echoed;
    t.served_in_flight = atomic_exchange_explicit(&a->served_in_flight, 0u, SLUICE_RELAXED);
    t.latency_sum_ns = atomic_exchange_explicit(&a->latency_sum, 0, SLUICE_RELAXED);
    t.duration_sum_ns = atomic_exchange_explicit(&a->duration_sum, 0, SLUICE_RELAXED);
    t.latency_dev_ns = atomic_exchange_explicit(&a->latency_dev, 0, SLUICE_RELAXED);
    t.latency_min_ns = atomic_exchange_explicit(&a->latency_min, INT64_MAX, SLUICE_RELAXED);
    t.retry_after_ns = atomic_exchange_explicit(&a->retry_after, 0, SLUICE_RELAXED);
    t.in_flight_sum = atomic_exchange_explicit(&a->in_flight_sum, 0u, SLUICE_RELAXED);
    t.in_flight_sq = atomic_exchange_explicit(&a->in_flight_sq, 0u, SLUICE_RELAXED);
    t.cross_sum = sluice__atomic_take_f64(&a->cross_sum);
    t.latency_sq = sluice__atomic_take_f64(&a->latency_sq);
    return t;
}

/* The least-squares line of latency on the calls in flight at start, over the measured
 * calls of `t` (struct sluice_window says what it is for): the mean count, the slope in ns
 * per call and its standard error. Slope and error are 0 with fewer than 3 calls or
 * counts that never varied; an error of 0 with a slope is a perfect fit. And the calls'
 * latency spread about their own mean, from the same sums (0 with fewer than 2 calls). */
struct sluice_window_line {
    double in_flight_mean, slope_ns, slope_se_ns;
    double latency_sd_ns;
};

SLUICE_INLINE struct sluice_window_line sluice_window_totals_line(const struct sluice_window_totals *t)
{
    struct sluice_window_line line = {0, 0, 0, 0};
    if (!t->n_ok)
        return line;
    double n = t->n_ok, sx = (double)t->in_flight_sum, sy = (double)t->latency_sum_ns;
    double syy = t->latency_sq - sy * sy / n; /* sums of squared deviations */
    if (t->n_ok >= 2 && syy > 0)
        line.latency_sd_ns = sqrt(syy / (n - 1.0));
    line.in_flight_mean = sx / n;
    double sxx = (double)t->in_flight_sq - sx * sx / n;
    if (t->n_ok < 3 || sxx < 0.5) /* x is an integer: any spread makes sxx >= (n-1)/n */
        return line;
    double sxy = t->cross_sum - sx * sy / n;
    line.slope_ns = sxy / sxx;
    double residual = (syy - line.slope_ns * sxy) / (n - 2.0);
    line.slope_se_ns = residual > 0 ? sqrt(residual / sxx) : 0;
    return line;
}

/* Close the open window: flip the buffers (later samples add to the other),
 * wait for the samples still adding to this one, take its totals and reset
 * it. One closer at a time (see Concurrency). */
SLUICE_INLINE struct sluice_window_totals sluice_window_recorder_close(struct sluice_window_recorder *w)
{
    uint32_t open = atomic_load_explicit(&w->open, SLUICE_RELAXED);
    struct sluice_window_buffer *a = &w->buf[open];
    atomic_store_explicit(&w->buf[open ^ 1u].tag, sluice_window_buffer_tag(a) + 1u,
                          SLUICE_RELAXED);
    atomic_store_explicit(&w->open, open ^ 1u, SLUICE_SEQ_CST);
    sluice__window_buffer_drain(a);
    return sluice__window_buffer_take(a);
}

#endif /* SLUICE_WINDOW_RECORDER_H */
