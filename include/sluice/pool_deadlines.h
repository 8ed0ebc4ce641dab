/*
 * sluice/pool_deadlines.h — the deadline rules: a queue that never holds
 * what cannot be served in time. Part of sluice/pool.h, which is what to
 * include.
 *
 * Deadlines (limited pools; the rules read sluice/service_time.h's estimates of
 * the node's service time and of its time to first byte — quantiles of
 * the product-limit estimate over recent calls, finished or cut by their
 * deadline — and are off until they have samples). A call may carry two deadlines (sluice/time.h): a *start*
 * deadline (it must have begun by then; for a stream, delivered its first
 * byte) and the whole-call deadline. The model, in the shape of HAProxy's
 * `maxconn` + `timeout queue` and CoDel's sojourn rule: a queue is only
 * worth joining for a call that can still be served in time, so the queue
 * never holds what cannot be.
 *   - Refuse at admission what the queue cannot serve in time (the
 *     default for a call with a deadline; sluice_deadline_desc.queue_late
 *     turns it off). sluice_pool_admit_by predicts the wait: when every
 *     permit is taken, a newcomer waits for the calls queued ahead of it
 *     and itself to be handed permits, which come free at `limit` per
 *     median service time (Little's law: the median, a robust stand-in for
 *     the mean of a skewed duration): wait = (queued + 1) x median / limit;
 *     with a free permit, 0. A run whose wait plus the service time it
 *     needs passes its deadline, or whose wait plus the time to its first
 *     byte passes its start deadline, gets SLUICE_ELATE at once, so a
 *     server can shed it or fail over within its own latency budget, and
 *     the provider's permits go to calls that can finish. How wrong it can
 *     be: it cannot see runs admitted but still preparing (they queue
 *     later, ahead of nobody yet; calls on their way to the line, such as
 *     an event loop's submissions, are counted once marked with
 *     sluice_pool_arrive), nor a Retry-After hold, nor a limit that
 *     discovery is about to raise or cut; calls lingering after an abandon
 *     release on their own schedule. It is an estimate for shedding load,
 *     never a promise: a run it admits can still time out.
 *     What a call needs is the median while calls queue (every permit is
 *     taken: under overload a permit spent on a call with less than an
 *     even chance is one a caller with time to spare does not get) and
 *     the low quantile with a permit free (it would otherwise go unused).
 *   - Before anything is known, one round of queue. Until the first calls
 *     say how long a call takes, no wait can be predicted; a call with a
 *     deadline then joins the queue only while fewer calls wait than there
 *     are permits (the round the permits in use hand on), else it gets
 *     SLUICE_ELATE. Why: a cold start under load queued every caller behind
 *     the jumpstart's permits (64 streaming clients on 5 permits, a 2 s
 *     start deadline: 52 answers were 504s after waiting the whole 2 s,
 *     where a 503 at once lets the caller retry or go elsewhere); what a
 *     caller gives a deadline is meant to fit in it, so one round of calls
 *     ahead can, and more is a guess. It lasts until the estimates have
 *     samples, a few calls.
 *   - Leave the line when it can no longer start in time. A queued call
 *     waits for its permit only until the last instant it could still be
 *     started usefully (sluice_pool_wait_bound: its deadline less the
 *     median service time, its start deadline less the median time to
 *     first byte); then it leaves with SLUICE_ETIMEDOUT and refused_late
 *     set, instead of timing out at the head of the line and taking a
 *     permit from a caller with time to spare.
 *   - A queue that stands is cut to a target (CoDel's sojourn rule: a
 *     queue that absorbs bursts is good, one that never drains only adds
 *     latency, since the provider is saturated either way). The target is
 *     two hand-offs of a permit (SLUICE_POOL_STANDING_HANDOFFS x the median
 *     service time / the limit: enough queue that a caller is waiting
 *     whenever a permit comes free, so the provider stays as busy as a
 *     longer queue would keep it), at most the median time to first byte;
 *     the interval is the median service time. From when every call
 *     started over an interval waited longer than the target until a
 *     newcomer finds a permit free (the queue drained) an interval after
 *     the rule last refused a call (no excess since: a permit free for
 *     a moment between hand-offs, while refused callers are still
 *     coming back, is no drained queue), the queue stands, and
 *     admission also refuses
 *     (SLUICE_ELATE) a call with a deadline whose predicted wait passes
 *     the target, however far its deadline. (It stands until it drains,
 *     not until one interval's waits fall under the target: they do as
 *     soon as the rule works, and a queue let grow again each time would
 *     swing between the two.) So under sustained overload a served call
 *     waits about two hand-offs (a streamed answer's first byte comes
 *     about as soon as with a free permit), every permit stays busy, and
 *     the excess is refused at once instead of queueing towards its
 *     deadline: 250 ms deadlines on a 200 ms provider capped at 24 queued
 *     up to 50 ms with the first-byte target, and every call so started
 *     had less time to finish than one that found a free permit. A burst
 *     into a queue that drains is admitted as far as the deadlines allow.
 *     Off with queue_late.
 *   - Don't start what cannot finish. A call that gets its permit (any
 *     hold over) with less of its deadline left than the expected service
 *     time (or of its start deadline than the expected time to first byte)
 *     is not started: call_begin gives the permit to the next in line and
 *     returns SLUICE_ETIMEDOUT with call->refused_late set (an async
 *     call's callback gets SLUICE_ETIMEDOUT, if its waiter names a
 *     deadline). The client is never called; stats count it in
 *     refused_late. Why: the FIFO gate hands a permit to the oldest
 *     waiter, which under overload has the least time left; started, it
 *     would be aborted mid-transfer and cost the provider work thrown
 *     away. Configured by sluice_deadline_desc.start_quantile (0 disables
 *     every estimate-based rule). While other calls queue behind it, a call
 *     is also not started with less time left than the median service time
 *     (less than an even chance): its permit goes to the next in line,
 *     which arrived later and so (with deadlines of one length, a server's
 *     usual case) has more time left. With nobody behind it, a call starts
 *     on the low quantile alone: the permit would otherwise go unused.
 *   - A service time the cuts hide. When most recent calls were cut by
 *     their deadlines, the median is only known to be longer than the
 *     time they had (sluice_service_hidden), and no wait is known to be
 *     affordable: a call with a deadline is admitted only onto a free
 *     permit, a queued one leaves the line, and one handed a permit
 *     while others queue is not started. Calls then start with their
 *     whole budget, which is what lets them finish and the median be
 *     seen again. (Off, the rules let every call queue towards its
 *     deadline, so each started with no time left and was cut: 3 calls
 *     served in 12 s beside an oracle's 619, a loaded machine's cold
 *     start, two runs in five.)
 *   - What a cut call teaches. A call its caller's deadline ended after
 *     the request was sent, at time t, says "this call takes longer than
 *     t", not "overload": sluice_pool_call_abandon gives discovery a
 *     SLUICE_OUTCOME_CENSORED sample (sluice/policy.h), which it uses.
 *   - Lingering permits: a call given up on mid-transfer may keep its
 *     permit while the provider may still be working on it
 *     (sluice/pool_linger.h). At a cold start this refuses calls: until
 *     discovery locks a ceiling, the default linger (LEARNED; a fixed pool
 *     always) keeps the permit of every call cut after its request was
 *     sent, for the high quantile of recent service times after the cut,
 *     at most linger_max_ms (30 s by default) from its start. With start
 *     deadlines tighter than the provider's first token a cold start cuts
 *     many calls, and while their permits count as taken, calls with
 *     deadlines are refused with SLUICE_ELATE: for up to linger_max_ms.
 *     SLUICE_LINGER_OFF (a provider that stops working on a request whose
 *     client hangs up) frees them at once; a lower linger_max_ms bounds it.
 *
 * Progress: every rule is lock-free and never blocks: a few relaxed loads
 * and, for the standing-queue test (fed by every call that starts), a CAS
 * by the one call that rolls an interval. A call without deadlines skips
 * the admission and start rules.
 *
 * Memory ordering: the rules' own state (the standing-queue test) is
 * relaxed values read as estimates, never publications.
 */
#ifndef SLUICE_POOL_DEADLINES_H
#define SLUICE_POOL_DEADLINES_H

#include "pool_admit.h"
#include "pool_linger.h"
#include "pool_state.h"

/*
 * An admitted call that is on its way to the line, ahead of whoever is
 * admitted after it, but not in it yet: an event loop's submission still in
 * its inbox (sluice_curl_loop_submit admits on the submitting thread; the
 * loop thread joins the line later). Mark it once admitted, and unmark it
 * once it has joined the line or ended without joining; meanwhile the
 * prediction counts it queued ahead of a newcomer. Unmarked, a burst of
 * submissions made before the loop thread takes them in was each predicted
 * a free line and admitted whole, however far past its deadline the burst
 * queued. (A run still preparing needs no mark: it queues later, behind the
 * newcomer.) Wait-free: a relaxed fetch-add each.
 */
SLUICE_INLINE void sluice_pool_arrive(struct sluice_pool *p)
{
    atomic_fetch_add_explicit(&p->arriving, 1u, SLUICE_RELAXED);
}

SLUICE_INLINE void sluice_pool_arrived(struct sluice_pool *p)
{
    atomic_fetch_sub_explicit(&p->arriving, 1u, SLUICE_RELAXED);
}

/* The gate as a newcomer will find it: the calls on their way to the line (sluice_pool_arrive)
 * take the free permits first and queue for the rest. */
SLUICE_INLINE struct sluice_gate_counts sluice__pool_line(struct sluice_pool *p)
{
    struct sluice_gate_counts g = sluice_gate_stats(&p->gate);
    uint32_t arriving = atomic_load_explicit(&p->arriving, SLUICE_RELAXED);
    uint32_t free_permits = g.in_flight < g.limit ? g.limit - g.in_flight : 0;
    uint32_t take = arriving < free_permits ? arriving : free_permits;
    g.in_flight += take;
    g.waiting += arriving - take;
    return g;
}

/* Calls waiting for a permit: in the gate's line (sluice__pool_line), or holding one through a
 * Retry-After hold. */
SLUICE_INLINE uint32_t sluice__pool_queued(struct sluice_pool *p, const struct sluice_gate_counts *g)
{
    return g->waiting + atomic_load_explicit(&p->holding, SLUICE_RELAXED);
}

/*
 * The wait a call queueing now should expect before its permit, ns (pool
 * clock; the header comment says how it is made and how wrong it can
 * be): 0 while a permit is free, else (queued + 1) x median / limit; -1
 * when the service time is not known yet; INT64_MAX behind a taken permit
 * while the cut calls hide it (sluice_service_hidden: no wait is known to
 * be affordable).
 */
SLUICE_INLINE int64_t sluice_pool_predicted_wait(const struct sluice_pool *pool)
{
    struct sluice_pool *p = (struct sluice_pool *)pool;
    int64_t median = sluice_service_median(&p->service);
    bool hidden = median <= 0 && sluice_service_hidden(&p->service);
    if (!p->active || (median <= 0 && !hidden))
        return -1;
    struct sluice_gate_counts g = sluice__pool_line(p);
    uint32_t queued = sluice__pool_queued(p, &g);
    if (g.limit == 0 || (queued == 0 && g.in_flight < g.limit))
        return 0;
    if (hidden)
        return INT64_MAX;
    double wait = ((double)queued + 1.0) * (double)median / (double)g.limit;
    return wait < (double)INT64_MAX ? (int64_t)wait : INT64_MAX;
}

/*
 * The time a call needs to finish (`first`: to its first byte) for the
 * deadline rules: the median while calls queue (`busy`: every permit taken,
 * so a permit spent on a call with less than an even chance is one a
 * caller with time to spare does not get), the low quantile with a permit
 * free (it would otherwise go unused). 0 = not known yet; INT64_MAX while
 * the cut calls hide the median (see "A service time the cuts hide").
 */
SLUICE_INLINE int64_t sluice__pool_need(const struct sluice_pool *p, bool busy, bool first)
{
    const struct sluice_service_time *s = first ? &p->first_byte : &p->service;
    if (!busy)
        return sluice_service_expected(s);
    /* Hidden by the cut calls: no wait is known to be affordable, so none is (INT64_MAX). */
    int64_t mid = sluice_service_median(s);
    return mid > 0 || !sluice_service_hidden(s) ? mid : INT64_MAX;
}

/* Permit hand-offs a standing queue is cut to (see "A queue that stands"). */
#define SLUICE_POOL_STANDING_HANDOFFS 2u

/* The standing-queue target (see "A queue that stands"): SLUICE_POOL_STANDING_HANDOFFS
 * permit hand-offs (median service time ÷ limit each), at most the median time to first
 * byte; 0 = not known yet (no rule). */
SLUICE_INLINE int64_t sluice__pool_sojourn_target(const struct sluice_pool *p)
{
    int64_t first = sluice_service_median(&p->first_byte);
    uint32_t limit = sluice_gate_limit(&p->gate);
    if (first <= 0 || !limit)
        return first;
    double handoffs = (double)SLUICE_POOL_STANDING_HANDOFFS *
                      (double)sluice_service_median(&p->service) / (double)limit;
    return handoffs > 0 && handoffs < (double)first ? (int64_t)handoffs : first;
}

/*
 * A call started after waiting `waited` (pool clock `now`): fold it into
 * the interval's least wait, and at the interval's end decide whether the
 * queue stood through it. Lock-free: one winner rolls the interval (a CAS
 * on its end); a call racing the roll may land its wait in either
 * interval, which only blurs the boundary by a call. A call that did not
 * wait costs two relaxed loads once the interval's least wait is 0.
 */
SLUICE_INLINE void sluice__pool_sojourn(struct sluice_pool *p, int64_t waited, int64_t now)
{
    int64_t interval = sluice_service_median(&p->service); /* CoDel's: the time to react */
    int64_t target = sluice__pool_sojourn_target(p);
    if (interval <= 0 || target <= 0)
        return;
    int64_t until = atomic_load_explicit(&p->sojourn_until, SLUICE_RELAXED);
    if (now >= until && atomic_compare_exchange_strong_explicit(&p->sojourn_until, &until,
                                                                sluice_add_ns(now, interval),
                                                                SLUICE_RELAXED, SLUICE_RELAXED)) {
        int64_t least = atomic_exchange_explicit(&p->sojourn_min, waited, SLUICE_RELAXED);
        if (least != INT64_MAX && least > target)
            atomic_store_explicit(&p->standing, 1u, SLUICE_RELAXED);
        return;
    }
    sluice__atomic_min_i64(&p->sojourn_min, waited);
}

/* Whether the deadline rules that read the estimates are on for this pool. */
SLUICE_INLINE bool sluice__pool_rules_on(const struct sluice_pool *p)
{
    return p->active && p->start_percent;
}

/*
 * The last instant (CLOCK_MONOTONIC ns) at which a call with these
 * deadlines could still be started usefully: its deadline less the median
 * service time, its start deadline less the median time to first byte
 * (a call that queues finds every permit taken: sluice__pool_need),
 * whichever is earlier; the deadline itself for an estimate
 * not known yet, or with queue_late; INT64_MAX with neither deadline. A
 * queued call leaves the line then (see the header comment); an event loop that
 * times its own waits (sluice_pool_call_begin_async) arms its timer for it
 * and cancels.
 */
SLUICE_INLINE int64_t sluice_pool_wait_bound(const struct sluice_pool *p,
                                             const struct timespec *start_deadline,
                                             const struct timespec *deadline)
{
    bool early = sluice__pool_rules_on(p) && !p->queue_late;
    int64_t bound = INT64_MAX;
    if (deadline)
        bound = sluice_timespec_ns(deadline) - (early ? sluice__pool_need(p, true, false) : 0);
    if (start_deadline) {
        int64_t at = sluice_timespec_ns(start_deadline) -
                     (early ? sluice__pool_need(p, true, true) : 0);
        if (at < bound)
            bound = at;
    }
    return bound;
}

/* Before the service time is known (see "Before anything is known"): whether as many calls
 * wait as there are permits, a round, so a caller with a deadline is not queued behind more. */
SLUICE_INLINE bool sluice__pool_round_waits(struct sluice_pool *p)
{
    struct sluice_gate_counts g = sluice__pool_line(p);
    return g.limit && sluice__pool_queued(p, &g) >= g.limit;
}

/*
 * Which deadline makes a call that would wait `wait` ns and then need
 * `need_first` to its first byte and `need_whole` to its end too late
 * (SLUICE_EXPIRED_NONE: neither; a need of 0 is unknown: no verdict). `now`
 * is CLOCK_MONOTONIC ns.
 */
SLUICE_INLINE enum sluice_expiry sluice__pool_late_by(int64_t now, int64_t wait,
                                                      const struct timespec *start_deadline,
                                                      const struct timespec *deadline,
                                                      int64_t need_whole, int64_t need_first)
{
    /* A deadline already passed is no prediction: the wait's own check says ETIMEDOUT. */
    int64_t start_left = start_deadline ? sluice_timespec_ns(start_deadline) - now : 0;
    int64_t left = deadline ? sluice_timespec_ns(deadline) - now : 0;
    if (start_left > 0 && need_first > 0 && sluice_add_ns(wait, need_first) > start_left)
        return SLUICE_EXPIRED_START;
    if (left > 0 && need_whole > 0 && sluice_add_ns(wait, need_whole) > left)
        return SLUICE_EXPIRED_CALL;
    return SLUICE_EXPIRED_NONE;
}

/*
 * sluice_pool_admit_by, saying in *late (may be NULL) which deadline a
 * SLUICE_ELATE refused the run for: SLUICE_EXPIRED_START or
 * SLUICE_EXPIRED_CALL, the one its predicted wait plus the time it needs
 * passes; for a refusal that predicts no deadline of its own (a queue that
 * stands, a round before anything is known) the earlier one, which its
 * wait would reach first. SLUICE_EXPIRED_NONE with any other status. So a
 * caller refused at once can say which of its deadlines the queue cannot
 * meet, as one that timed out says which expired.
 */
SLUICE_INLINE int sluice_pool_admit_late(struct sluice_pool *p,
                                         const struct timespec *start_deadline,
                                         const struct timespec *deadline, enum sluice_expiry *late)
{
    enum sluice_expiry which = SLUICE_EXPIRED_NONE;
    /* A deadline already passed is no prediction: the wait's own check says ETIMEDOUT. */
    if ((deadline || start_deadline) && sluice__pool_rules_on(p) && !p->queue_late &&
        !sluice_deadline_passed(sluice_deadline_first(start_deadline, deadline)) &&
        !atomic_load_explicit(&p->closed, SLUICE_RELAXED)) {
        sluice__pool_reap(p);
        int64_t wait = sluice_pool_predicted_wait(p);
        bool stands = atomic_load_explicit(&p->standing, SLUICE_RELAXED);
        int64_t now = stands ? sluice_clock_now(&p->clock) : 0;
        if (stands && wait == 0) { /* the queue drained: and no excess came for an interval? */
            int64_t refused = atomic_load_explicit(&p->standing_refused, SLUICE_RELAXED);
            if (refused == INT64_MIN || now - refused >= sluice_service_median(&p->service))
                atomic_store_explicit(&p->standing, 0u, SLUICE_RELAXED);
        }
        stands = stands && wait > sluice__pool_sojourn_target(p);
        if (stands)
            atomic_store_explicit(&p->standing_refused, now, SLUICE_RELAXED);
        if (wait >= 0 && !stands)
            which = sluice__pool_late_by(sluice_monotonic_ns(), wait, start_deadline, deadline,
                                         sluice__pool_need(p, wait > 0, false),
                                         sluice__pool_need(p, wait > 0, true));
        else if (wait < 0 ? sluice__pool_round_waits(p) : stands)
            which = sluice_deadline_which(start_deadline, deadline);
    }
    if (late)
        *late = which;
    if (which != SLUICE_EXPIRED_NONE) {
        sluice__pool_count(p, SLUICE__POOL_EARLY);
        return SLUICE_ELATE;
    }
    return sluice_pool_admit(p);
}

/*
 * sluice_pool_admit for a run with deadlines (absolute CLOCK_MONOTONIC;
 * either may be NULL = none): unless the pool's queue_late is set, a run
 * whose predicted wait plus the time it needs already passes `deadline`
 * (or its first byte's, `start_deadline`; sluice__pool_need: the median
 * while calls queue, the low quantile with a permit free) is refused at
 * once with SLUICE_ELATE, and so is one whose predicted wait passes the
 * target of a queue that stands (see "A queue that stands"), and, before
 * the service time is known, one that would queue behind a round of calls
 * (see "Before anything is known") (counted in refused_early; nothing is
 * reserved), so the caller can shed it or go elsewhere while it still has
 * time. Otherwise exactly sluice_pool_admit.
 * Lock-free: a few relaxed loads more than sluice_pool_admit, and only for
 * a run with a deadline; first it releases the lingering permits whose time
 * has come (two relaxed loads when none lingers), since a permit it counts
 * as taken refuses calls, and callers refused at admission never reach the
 * call paths that would release it (blocking callers stalled at 6 calls in
 * 12 s, every permit lingering long past its time).
 */
SLUICE_INLINE int sluice_pool_admit_by(struct sluice_pool *p, const struct timespec *start_deadline,
                                       const struct timespec *deadline)
{
    return sluice_pool_admit_late(p, start_deadline, deadline, NULL);
}

/*
 * The start rule: which deadline a call holding a permit can no longer
 * meet (SLUICE_EXPIRED_NONE: start it). Too late: less of its deadline
 * left than the expected service time, or of its start deadline than the
 * expected time to first byte; while other calls queue behind it, less
 * than the medians (never without deadlines, with the rules off, or before
 * the estimates have samples). See the header comment.
 */
SLUICE_INLINE enum sluice_expiry sluice__pool_too_late(struct sluice_pool *p,
                                                       const struct timespec *start_deadline,
                                                       const struct timespec *deadline)
{
    if ((!deadline && !start_deadline) || !p->start_percent)
        return SLUICE_EXPIRED_NONE;
    int64_t now = sluice_monotonic_ns();
    if (start_deadline && sluice_timespec_ns(start_deadline) <= now)
        return SLUICE_EXPIRED_START;
    if (deadline && sluice_timespec_ns(deadline) <= now)
        return SLUICE_EXPIRED_CALL;
    bool busy = sluice_gate_stats(&p->gate).waiting > 0;
    return sluice__pool_late_by(now, 0, start_deadline, deadline, sluice__pool_need(p, busy, false),
                                sluice__pool_need(p, busy, true));
}

#endif /* SLUICE_POOL_DEADLINES_H */
