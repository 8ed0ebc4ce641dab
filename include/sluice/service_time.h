/*
 * sluice/service_time.h — how long a backend's calls take: the expected
 * service time (a running low quantile of recent successful calls) and
 * fixed-bucket latency histograms for the operator's views.
 *
 * What it is: two small, allocation-free recorders a pool embeds.
 *
 * struct sluice_service_time — the expected service time. It keeps the last
 * SLUICE_SERVICE_SAMPLES durations of calls (a pool keeps two: call start
 * to end, the whole transfer, what a call needs to *finish*; and start to
 * the latency signal, a stream's first byte, what it needs to *begin*) in
 * a ring: of successful calls, and of calls their caller cut, by a deadline
 * or by hanging up (sluice_service_add_censored: "longer than this"). Every
 * SLUICE_SERVICE_REFRESH samples (every sample while the ring fills) one
 * recorder copies the ring, sorts the copy and publishes three quantiles
 * of the product-limit (Kaplan–Meier) estimate — the survival-analysis
 * estimate of a distribution seen through censoring, which needs no model
 * of it. Why: against tight deadlines the successful calls alone are the
 * short ones (a 250 ms deadline on a 200 ms median provider cuts the
 * slowest third), so their quantiles read low and the rules start calls
 * that will be cut; with the cut calls counted as still running at their
 * cut, the estimate follows the whole distribution as far as the cuts let
 * it be seen; past that the low quantile and the median are unknown (the
 * rules that read them stand aside until calls finish again) and the high
 * quantile is the longest time seen (a lower bound).
 * Without cut calls it is the plain nearest-rank quantile. The three:
 *   low   the `percent` quantile (a pool's start_quantile; default 10):
 *         "almost every call takes at least this long". A call with less
 *         time left than this would finish only if it were among the
 *         fastest `percent` of calls, so not starting it loses at most that
 *         share of calls that could have made it, and saves the provider
 *         the work of every one that could not. A low quantile, not the
 *         median, because the rule must not refuse calls that had an even
 *         chance, and not the minimum, which one lucky call sets for good.
 *   mid   the median: "a call with less time left than this has less than
 *         an even chance". The start rule uses it instead of `low` while
 *         other calls queue behind the one being granted (sluice/pool_deadlines.h).
 *   high  the SLUICE_SERVICE_HIGH_PERCENT (90 %) quantile: how long a call
 *         that has already outlived a typical one may still run at the
 *         provider. Lingering permits (sluice/pool_linger.h) use it.
 *   floor the SLUICE_SERVICE_FLOOR_PERCENT (10 %) quantile, whatever
 *         `percent` is: until then from its start a call is still running
 *         9 times in 10 (more once it has run a while). The linger trial's
 *         phantoms count that long (sluice/pool_linger.h): what a trial
 *         concludes from their absence must not depend on start_quantile.
 * Why a ring and a sort instead of a streaming estimator (P², stochastic
 * quantiles): a ring forgets completely in SLUICE_SERVICE_SAMPLES calls, so
 * the estimate follows a provider that slowed down within one ring's worth
 * of traffic, with no step size to tune; P² needs five markers updated in
 * order under one lock by every sample, and stochastic estimators move by a
 * fixed step per sample, so they lag a latency shift by many times the ring.
 * Sorting 64 integers every 8 samples is ~400 comparisons amortised to ~50
 * per call (the first 64 calls sort what they have at every sample), off
 * the permit path's critical section (the recorder has already released
 * its permit, see sluice_pool_call_end). Every value is 0 ("unknown":
 * every rule that uses them is off) until SLUICE_SERVICE_MIN_SAMPLES of
 * the ring's calls succeeded (the high quantile, a lingering permit's
 * bound: until the ring holds that many calls, finished or cut). Few,
 * because the rules matter most at a cold start: against deadlines near the service time, a pool
 * without an estimate starts calls with no time left, those are abandoned,
 * and successes to learn from stop coming (64 callers, 250 ms deadlines,
 * a 200 ms provider: 13 successes in 12 s). The first successes of a cold
 * start are the fast ones, so an early estimate errs low, which makes the
 * rules lenient, never strict, until the ring fills.
 *
 * struct sluice_histogram — counts of durations in fixed buckets
 * (SLUICE_HISTOGRAM_BOUNDS_NS, Prometheus' `le` upper bounds) plus their
 * sum, for `sluice_queue_wait_seconds` and `sluice_call_seconds`, and
 * sluice_histogram_quantile for the p50/p99 the admin page and sluicectl
 * show (interpolated inside a bucket, so as exact as the bucket is narrow).
 *
 * Progress: every function is wait-free except sluice_service_add's
 * refresh, which runs under a try-lock (a recorder that finds it taken
 * skips; the next refresh point retries): no recorder ever waits for
 * another. Readers are single relaxed loads.
 *
 * Concurrency: any number of threads may add and read at once.
 *
 * Memory ordering: all relaxed. A ring slot is a counter-indexed relaxed
 * store, so a refresh may read a slot that is being overwritten and see the
 * older or the newer duration: either is a recent sample, and a quantile
 * over 64 of them does not care. A published estimate is a value, not a
 * publication of other memory.
 *
 * Allocation: none; both structs live inside their owner (a pool's block).
 */
#ifndef SLUICE_SERVICE_TIME_H
#define SLUICE_SERVICE_TIME_H

#include "cc.h"
#include "time.h"

#define SLUICE_SERVICE_SAMPLES 64u     /* successful calls the estimate covers (power of two) */
#define SLUICE_SERVICE_REFRESH 8u      /* samples between two refreshes of the estimate */
#define SLUICE_SERVICE_MIN_SAMPLES 4u /* fewer successes than this: no estimate yet */
#define SLUICE_SERVICE_HIGH_PERCENT 90u
#define SLUICE_SERVICE_FLOOR_PERCENT 10u
#define SLUICE_SERVICE_PERCENT_MAX 50u /* a "low" quantile: above the median it refuses calls
                                          that were more likely than not to finish */

struct sluice_service_time {
    _Atomic(uint64_t) added;                      /* samples ever added */
    _Atomic(int64_t) ring[SLUICE_SERVICE_SAMPLES]; /* slot added % SAMPLES; a cut call's time
                                                     is stored negated */
    _Atomic(int64_t) low_ns;                      /* 0 = unknown */
    _Atomic(int64_t) mid_ns;                      /* 0 = unknown */
    _Atomic(int64_t) high_ns;                     /* 0 = unknown */
    _Atomic(int64_t) floor_ns;                    /* 0 = unknown */
    _Atomic(bool) hidden;                         /* enough calls, but the cut ones hide
                                                     the median (sluice_service_hidden) */
    sluice_spinlock refresh;
    uint32_t percent; /* the low quantile, in [1, SLUICE_SERVICE_PERCENT_MAX] */
};

SLUICE_INLINE void sluice_service_init(struct sluice_service_time *s, uint32_t percent)
{
    atomic_init(&s->added, 0u);
    for (uint32_t i = 0; i < SLUICE_SERVICE_SAMPLES; i++)
        atomic_init(&s->ring[i], 0);
    atomic_init(&s->low_ns, 0);
    atomic_init(&s->mid_ns, 0);
    atomic_init(&s->high_ns, 0);
    atomic_init(&s->floor_ns, 0);
    atomic_init(&s->hidden, false);
    sluice_spinlock_init(&s->refresh);
    s->percent = percent;
}

/* A ring entry's time (a cut call is stored negated) and its sort key: by time, and at a tie
 * a finished call before a cut one (the product-limit convention: a call cut at t was still
 * at risk at t). */
SLUICE_INLINE int64_t sluice__service_time(int64_t x)
{
    return x < 0 ? -x : x;
}

SLUICE_INLINE bool sluice__service_before(int64_t a, int64_t b)
{
    int64_t ta = sluice__service_time(a), tb = sluice__service_time(b);
    return ta < tb || (ta == tb && a > 0 && b < 0);
}

/*
 * The `percent` quantile of the product-limit (Kaplan–Meier) estimate over
 * n sorted entries: the first finished call at which the share of calls
 * still running falls to 1 - percent/100 or below. Where the cut calls hide
 * that point (too few finished calls beyond them): with `bound`, the
 * longest time seen, a lower bound (how long to keep a permit); without, 0,
 * unknown. Not a lower bound there: the rules that read the low quantile
 * and the median refuse calls by it, and a bound past the deadline would
 * refuse every call, so none would start and teach it otherwise. Without
 * cut calls this is the nearest-rank quantile of the finished ones.
 */
SLUICE_INLINE int64_t sluice__service_quantile(const int64_t *sorted, uint32_t n, uint32_t percent,
                                               bool bound)
{
    double running = 1.0, want = 1.0 - (double)percent / 100.0 + 1e-9;
    for (uint32_t i = 0; i < n; i++) {
        if (sorted[i] < 0)
            continue;
        running *= (double)(n - i - 1u) / (double)(n - i);
        if (running <= want)
            return sorted[i];
    }
    return bound ? sluice__service_time(sorted[n - 1u]) : 0;
}

/* Recompute the estimates from the ring. */
SLUICE_INLINE void sluice__service_refresh_locked(struct sluice_service_time *s, uint64_t added)
{
    int64_t v[SLUICE_SERVICE_SAMPLES];
    uint32_t n = added < SLUICE_SERVICE_SAMPLES ? (uint32_t)added : SLUICE_SERVICE_SAMPLES;
    uint32_t finished = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t x = atomic_load_explicit(&s->ring[i], SLUICE_RELAXED);
        finished += x > 0;
        uint32_t j = i;
        for (; j > 0 && sluice__service_before(x, v[j - 1]); j--) /* insertion sort: 64 values */
            v[j] = v[j - 1];
        v[j] = x;
    }
    if (n < SLUICE_SERVICE_MIN_SAMPLES)
        return;
    /* How long to keep a permit is known from cut calls alone: they ran at least that long.
     * Every call of a cold start can be cut (a loaded machine, deadlines near the service
     * time); released at once, their slots at a provider that keeps working filled its cap
     * behind a count of 1 to 5, and its 429s locked discovery at 1, two runs in ten. */
    atomic_store_explicit(&s->high_ns,
                          sluice__service_quantile(v, n, SLUICE_SERVICE_HIGH_PERCENT, true),
                          SLUICE_RELAXED);
    /* The rest unknown until enough calls finished (not the last values: a ring whose calls
     * are now all cut no longer says how long calls take). */
    bool known = finished >= SLUICE_SERVICE_MIN_SAMPLES;
    int64_t mid = known ? sluice__service_quantile(v, n, 50u, false) : 0;
    atomic_store_explicit(&s->low_ns, known ? sluice__service_quantile(v, n, s->percent, false) : 0,
                          SLUICE_RELAXED);
    atomic_store_explicit(&s->mid_ns, mid, SLUICE_RELAXED);
    atomic_store_explicit(
        &s->floor_ns, known ? sluice__service_quantile(v, n, SLUICE_SERVICE_FLOOR_PERCENT, false) : 0,
        SLUICE_RELAXED);
    atomic_store_explicit(&s->hidden, mid == 0, SLUICE_RELAXED);
}

SLUICE_INLINE void sluice__service_put(struct sluice_service_time *s, int64_t entry);

/* Record the duration of one successful call (ns; clamped to at least 1). */
SLUICE_INLINE void sluice_service_add(struct sluice_service_time *s, int64_t ns)
{
    sluice__service_put(s, ns > 0 ? ns : 1);
}

/* Record a call its caller cut after `ns` (clamped to at least 1): it takes longer than that.
 * The quantiles are then the product-limit estimate's, not the finished calls' alone, which
 * a deadline biases low (only the calls short enough to finish in time are seen). */
SLUICE_INLINE void sluice_service_add_censored(struct sluice_service_time *s, int64_t ns)
{
    sluice__service_put(s, ns > 0 ? -ns : -1);
}

/* Store one ring entry, and refresh the estimates at a refresh point. */
SLUICE_INLINE void sluice__service_put(struct sluice_service_time *s, int64_t entry)
{
    uint64_t i = atomic_fetch_add_explicit(&s->added, 1u, SLUICE_RELAXED);
    atomic_store_explicit(&s->ring[i % SLUICE_SERVICE_SAMPLES], entry, SLUICE_RELAXED);
    uint64_t added = i + 1u;
    if (added < SLUICE_SERVICE_MIN_SAMPLES ||
        (added > SLUICE_SERVICE_SAMPLES && added % SLUICE_SERVICE_REFRESH != 0u))
        return;
    if (!sluice_spinlock_trylock(&s->refresh))
        return; /* someone is refreshing: the next refresh point catches this sample */
    sluice__service_refresh_locked(s, added);
    sluice_spinlock_unlock(&s->refresh);
}

/* The expected service time (the low quantile), ns; 0 = not known yet. */
SLUICE_INLINE int64_t sluice_service_expected(const struct sluice_service_time *s)
{
    return atomic_load_explicit(&((struct sluice_service_time *)s)->low_ns, SLUICE_RELAXED);
}

/* The median, ns; 0 = not known yet. */
SLUICE_INLINE int64_t sluice_service_median(const struct sluice_service_time *s)
{
    return atomic_load_explicit(&((struct sluice_service_time *)s)->mid_ns, SLUICE_RELAXED);
}

/*
 * Whether the ring holds enough calls but the cut ones hide the median: most
 * calls end at their callers' deadlines, so how long one takes is only
 * known to be longer than the time they had. The deadline rules then let a
 * call start only on a free permit (sluice/pool_deadlines.h).
 */
SLUICE_INLINE bool sluice_service_hidden(const struct sluice_service_time *s)
{
    return atomic_load_explicit(&((struct sluice_service_time *)s)->hidden, SLUICE_RELAXED);
}

/* The high quantile (SLUICE_SERVICE_HIGH_PERCENT), ns; 0 = not known yet. */
SLUICE_INLINE int64_t sluice_service_high(const struct sluice_service_time *s)
{
    return atomic_load_explicit(&((struct sluice_service_time *)s)->high_ns, SLUICE_RELAXED);
}

/* The floor quantile (SLUICE_SERVICE_FLOOR_PERCENT), ns; 0 = not known yet. */
SLUICE_INLINE int64_t sluice_service_floor(const struct sluice_service_time *s)
{
    return atomic_load_explicit(&((struct sluice_service_time *)s)->floor_ns, SLUICE_RELAXED);
}

/*
 * Until when a call abandoned at `now_ns` (started at `start_ns`) is likely
 * still running at the provider: the high quantile of service times after
 * now (and after its start); before the ring holds enough calls for one,
 * the time this call has run, itself a cut call's "at least this long"
 * (the estimate it would make alone: released at once instead, a cold
 * start's cut calls left the provider running them behind a count of 0,
 * and 4 callers with a 1 s timeout against a 2 s provider capped at 4 drew
 * 429s for every call that followed). From now, not from the start: the successes
 * the estimate sees are censored by the callers' own deadlines (only calls
 * that finished in time are seen), so against tight deadlines the high
 * quantile is no longer than the deadline itself, while a call that
 * outlived its deadline is a long one. Measured (sluice-bench robustness
 * rows abandoned_*: 64 callers, 250 ms deadlines, a 200 ms provider capped
 * at 24): from the start, locks at 19-20; one low quantile after now, 12 of
 * 20 seeds below 0.85·C; one high quantile after now, every seed at C. At
 * most `cap_ns` after the start; 0 = none (cap_ns == 0, or a call that never ran).
 */
SLUICE_INLINE int64_t sluice_service_linger_until(const struct sluice_service_time *s, int64_t start_ns,
                                                  int64_t now_ns, int64_t cap_ns)
{
    int64_t high = sluice_service_high(s);
    if (high <= 0)
        high = now_ns - start_ns;
    if (!cap_ns || high <= 0)
        return 0;
    int64_t from = now_ns > start_ns ? now_ns : start_ns;
    int64_t until = sluice_add_ns(from, high), most = sluice_add_ns(start_ns, cap_ns);
    return until < most ? until : most;
}

/* ---- histograms ------------------------------------------------------------- */

/* Bucket upper bounds ("le"), ns; the last bucket is +Inf. */
#define SLUICE_HISTOGRAM_BOUNDS_NS                                                                 \
    {INT64_C(1000000),    INT64_C(2500000),    INT64_C(5000000),    INT64_C(10000000),            \
     INT64_C(25000000),   INT64_C(50000000),   INT64_C(100000000),  INT64_C(250000000),           \
     INT64_C(500000000),  INT64_C(1000000000), INT64_C(2500000000), INT64_C(5000000000),          \
     INT64_C(10000000000), INT64_C(30000000000), INT64_C(60000000000)}
#define SLUICE_HISTOGRAM_BUCKETS 16u /* the bounds above, then +Inf */

struct sluice_histogram {
    _Atomic(uint64_t) bucket[SLUICE_HISTOGRAM_BUCKETS]; /* not cumulative */
    _Atomic(int64_t) sum_ns;
};

/* A snapshot: counts per bucket (not cumulative), their total and sum. */
struct sluice_histogram_counts {
    uint64_t bucket[SLUICE_HISTOGRAM_BUCKETS];
    uint64_t count;
    int64_t sum_ns;
};

SLUICE_INLINE void sluice_histogram_init(struct sluice_histogram *h)
{
    for (uint32_t i = 0; i < SLUICE_HISTOGRAM_BUCKETS; i++)
        atomic_init(&h->bucket[i], 0u);
    atomic_init(&h->sum_ns, 0);
}

/* The upper bound of bucket i, ns (INT64_MAX for the last, +Inf). */
SLUICE_INLINE int64_t sluice_histogram_bound(uint32_t i)
{
    static const int64_t bounds[SLUICE_HISTOGRAM_BUCKETS - 1] = SLUICE_HISTOGRAM_BOUNDS_NS;
    return i < SLUICE_HISTOGRAM_BUCKETS - 1 ? bounds[i] : INT64_MAX;
}

/* Count one duration (ns; negative counts as 0). Two relaxed RMWs. */
SLUICE_INLINE void sluice_histogram_add(struct sluice_histogram *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    uint32_t i = 0;
    while (i < SLUICE_HISTOGRAM_BUCKETS - 1 && ns > sluice_histogram_bound(i))
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1u, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&h->sum_ns, ns, SLUICE_RELAXED);
}

SLUICE_INLINE struct sluice_histogram_counts sluice_histogram_read(const struct sluice_histogram *hist)
{
    struct sluice_histogram *h = (struct sluice_histogram *)hist;
    struct sluice_histogram_counts c;
    c.count = 0;
    for (uint32_t i = 0; i < SLUICE_HISTOGRAM_BUCKETS; i++)
        c.count += c.bucket[i] = atomic_load_explicit(&h->bucket[i], SLUICE_RELAXED);
    c.sum_ns = atomic_load_explicit(&h->sum_ns, SLUICE_RELAXED);
    return c;
}

/*
 * The q quantile (0 < q < 1) of a snapshot, ns, interpolated linearly inside
 * its bucket (the +Inf bucket answers with the last finite bound); -1 when
 * the snapshot is empty. Subtract two snapshots first for a recent window.
 */
SLUICE_INLINE int64_t sluice_histogram_quantile(const struct sluice_histogram_counts *c, double q)
{
    if (c->count == 0)
        return -1;
    double want = q * (double)c->count;
    uint64_t below = 0;
    for (uint32_t i = 0; i < SLUICE_HISTOGRAM_BUCKETS; i++) {
        if (c->bucket[i] && (double)(below + c->bucket[i]) >= want) {
            if (i == SLUICE_HISTOGRAM_BUCKETS - 1)
                return sluice_histogram_bound(i - 1);
            int64_t lo = i ? sluice_histogram_bound(i - 1) : 0, hi = sluice_histogram_bound(i);
            double frac = (want - (double)below) / (double)c->bucket[i];
            return lo + (int64_t)(frac * (double)(hi - lo));
        }
        below += c->bucket[i];
    }
    return sluice_histogram_bound(SLUICE_HISTOGRAM_BUCKETS - 2);
}

#endif /* SLUICE_SERVICE_TIME_H */
