/*
 * sluice/pool_call.h — one generation call: taking its permit (the
 * blocking path, or the async one for event loops) and ending it. Part of
 * sluice/pool.h, which is what to include.
 *
 * The model: every model call of an admitted run — the first one and
 * every repair — sits between call_begin and call_end, the only place
 * permits move. Two call paths with one queue: sluice_pool_call_begin blocks the calling
 * thread; sluice_pool_call_begin_async (event loops) queues a waiter whose
 * callback runs exactly once. Both join the same FIFO gate, wait out the
 * same Retry-After hold (the async one on the pool's list of async holders,
 * started by sluice_pool_poll or by the next call_end once the hold is
 * over) and share the same accounting. A pool's callers never need its gate.
 * Each path is the same steps — the permit (sluice/gate.h; through the
 * watcher where permits linger, sluice/pool_linger.h), the hold
 * (sluice/pool_hold.h), the start rule (sluice/pool_deadlines.h), then
 * counted as started — in two shapes that must stay in step.
 *
 * Ending a call: call_end records every call's sample
 * (sluice_discovery_record) *before* giving the permit back, so a cut made
 * for an overload takes effect before the permit moves on. Effects off the
 * permit path: call_end feeds the sample to discovery
 * (bounded in-memory work under discovery's update try-lock), releases the
 * permit and hands out the grants of a limit raise that sample made
 * (waking every sync waiter granted before any async callback runs), and
 * only then runs discovery's effects (sluice_discovery_flush: store
 * hand-off, event callbacks). So no store call and no user callback delays
 * the next call in line. call_abandon ends a call its caller gave up on
 * mid-transfer; its permit may linger (sluice/pool_linger.h).
 *
 * Progress: call_begin blocks (FIFO, see sluice/gate.h) until a permit, the
 * deadline or the cancel token, then — adaptive pools only — until any
 * Retry-After hold ends (sluice/pool_hold.h). call_begin_async never
 * blocks. call_end does not block: it releases the permit (the
 * gate's release: one CAS when nobody queues, else a short spinlock hand-off
 * to the one waiter next in line) and returns; in an adaptive pool it first
 * feeds discovery, which is lock-free for the caller (the completion that
 * closes a window runs the update under a try-lock: bounded work, a gate
 * limit change, and rarely one store call).
 *
 * Memory ordering: permits inherit the gate's story: a call that gets a
 * permit sees everything the previous holder did before call_end. The
 * in-flight count is a counter, not a publication (relaxed RMWs, read
 * relaxed by stats); it is decremented before the permit is released, so
 * in_flight_at_start never exceeds the limit the gate enforced. The async
 * holders are linked under the pool's hold_lock (sluice/pool_hold.h).
 */
#ifndef SLUICE_POOL_CALL_H
#define SLUICE_POOL_CALL_H

#include "pool_deadlines.h"
#include "pool_hold.h"
#include "pool_linger.h"
#include "pool_state.h"

/* Count a call that ended without finishing, by why it stopped. */
SLUICE_INLINE void sluice__pool_count_stop(struct sluice_pool *p, int status)
{
    if (status == SLUICE_ETIMEDOUT)
        sluice__pool_count(p, SLUICE__POOL_TIMEOUT);
    else if (status == SLUICE_ECANCELED)
        sluice__pool_count(p, SLUICE__POOL_CANCEL);
}

/* ---- the blocking call path ------------------------------------------------ */

/* The contended path of call_begin: queue for the permit until `bound` (the wait bound, a
 * CLOCK_MONOTONIC instant; INT64_MAX = none), timing the wait. */
SLUICE_INLINE int sluice__pool_wait(struct sluice_pool *p, int64_t bound,
                                    struct sluice_cancel *cancel, struct sluice_call *call)
{
    int64_t arrived = sluice_clock_now(&p->clock);
    struct timespec until = sluice_ns_timespec(bound);
    const struct timespec *wait_until = bound == INT64_MAX ? NULL : &until;
    int status = p->linger_max_ns ? sluice__pool_watch(p, wait_until, cancel)
                                  : sluice_gate_acquire(&p->gate, wait_until, cancel);
    /* A grant can land after the token fired or the bound passed: the
     * call has not started, so the stop wins and the permit moves on. */
    if (status == SLUICE_OK &&
        (status = sluice_wait_stop_reason(wait_until, cancel)) != SLUICE_OK)
        sluice_gate_release(&p->gate);
    call->start_ns = sluice_clock_now(&p->clock);
    call->queued_ns = call->start_ns - arrived;
    return status;
}

/* Count how a limited pool's call_begin ended; the queue-wait histogram sees every wait. */
SLUICE_INLINE void sluice__pool_began(struct sluice_pool *p, const struct sluice_call *call,
                                      int status, bool waited)
{
    if (status == SLUICE_OK || waited || call->refused_late)
        sluice_histogram_add(&p->queue_wait, call->queued_ns);
    if (call->refused_late)
        sluice__pool_count(p, SLUICE__POOL_LATE);
    else
        sluice__pool_count_stop(p, status);
}

/* The call has its permit and no hold stands in its way: count it as started. */
SLUICE_INLINE void sluice__pool_start(struct sluice_pool *p, struct sluice_call *call)
{
    call->in_flight_at_start = atomic_fetch_add_explicit(&p->in_flight, 1u, SLUICE_RELAXED) + 1u;
    call->limit_at_start = p->discovery ? sluice_discovery_limit(p->discovery) : 0;
    call->phantoms_at_start = atomic_load_explicit(&p->phantoms, SLUICE_RELAXED);
    call->shadows_at_start = atomic_load_explicit(&p->shadows, SLUICE_RELAXED);
    if (p->active && p->start_percent && !p->queue_late)
        sluice__pool_sojourn(p, call->queued_ns, call->start_ns);
}

/*
 * Take a generation permit for one model call of an admitted run, waiting
 * in FIFO order until it can no longer start in time (sluice_pool_wait_bound
 * of `start_deadline` and `deadline`, absolute CLOCK_MONOTONIC; NULL =
 * none) or `cancel` fires (NULL = none); in an adaptive pool, then wait out
 * any Retry-After hold, permit in hand, under the same deadlines and token.
 * Fills *call. Returns SLUICE_OK (make the call, then sluice_pool_call_end),
 * or, holding no permit: SLUICE_ECANCELED / SLUICE_ETIMEDOUT — also when the
 * token fired or a deadline passed before the wait, while the permit was
 * being granted, or during a hold, so a call whose cancel won before it
 * started is never made (a token that has fired by the time the call
 * gives up wins over the deadline and over close); call->expired says
 * which deadline, call->refused_late that the call left before it passed
 * (the start rule) — SLUICE_ECLOSED once the pool is closed, or
 * SLUICE_EINVAL for a deadline whose tv_nsec is outside [0, 1e9) or that lies
 * more than a year ahead (SLUICE_DEADLINE_AHEAD_MAX_NS: a CLOCK_REALTIME
 * reading, which would bound nothing).
 */
SLUICE_INLINE int sluice_pool_call_begin_by(struct sluice_pool *p,
                                            const struct timespec *start_deadline,
                                            const struct timespec *deadline,
                                            struct sluice_cancel *cancel, struct sluice_call *call)
{
    const struct timespec *first = sluice_deadline_first(start_deadline, deadline);
    const struct timespec *later = first == deadline ? start_deadline : deadline;
    int status = sluice_deadline_valid(start_deadline) && sluice_deadline_valid(deadline)
                     ? sluice_wait_stop_reason(first, cancel) /* the first one's clock checked */
                     : SLUICE_EINVAL;
    if (status == SLUICE_OK && later && sluice_deadline_too_far(later, sluice_monotonic_ns()))
        status = SLUICE_EINVAL;
    if (status == SLUICE_OK && SLUICE_UNLIKELY(atomic_load_explicit(&p->closed, SLUICE_RELAXED)))
        status = SLUICE_ECLOSED;
    call->refused_late = false;
    call->expired = SLUICE_EXPIRED_NONE;
    call->phantoms_at_start = call->shadows_at_start = 0;
    if (p->active)
        sluice__pool_reap(p); /* a permit whose linger is over is free for this call */
    /* tryacquire never jumps the queue; only a call that must queue pays
     * for timing its wait. */
    bool waited = status == SLUICE_OK && p->active && sluice_gate_tryacquire(&p->gate) != SLUICE_OK;
    if (waited) {
        int64_t by_start = sluice_pool_wait_bound(p, start_deadline, NULL);
        int64_t by_call = sluice_pool_wait_bound(p, NULL, deadline);
        status = sluice__pool_wait(p, by_start < by_call ? by_start : by_call, cancel, call);
        if (status == SLUICE_ETIMEDOUT)
            call->expired = by_start <= by_call ? SLUICE_EXPIRED_START : SLUICE_EXPIRED_CALL;
        /* Left the line at its bound, before its deadline passed: too late to start. */
        call->refused_late = status == SLUICE_ETIMEDOUT && !sluice_deadline_passed(first) &&
                             !sluice_cancel_fired(cancel);
    } else {
        call->start_ns = sluice_clock_now(&p->clock);
        call->queued_ns = 0;
    }
    if (SLUICE_UNLIKELY(p->discovery != NULL) && status == SLUICE_OK)
        status = sluice__pool_hold(p, first, cancel, call);
    enum sluice_expiry late = status == SLUICE_OK
                                  ? sluice__pool_too_late(p, start_deadline, deadline)
                                  : SLUICE_EXPIRED_NONE;
    if (late != SLUICE_EXPIRED_NONE) {
        sluice_gate_release(&p->gate);
        call->refused_late = true;
        call->expired = late;
        status = SLUICE_ETIMEDOUT;
    }
    if (status != SLUICE_OK && !call->refused_late) /* a token that fired meanwhile wins */
        status = sluice_gate_failed(status, cancel);
    if (status != SLUICE_ETIMEDOUT)
        call->expired = SLUICE_EXPIRED_NONE;
    else if (call->expired == SLUICE_EXPIRED_NONE)
        call->expired = sluice_deadline_which(start_deadline, deadline);
    call->in_flight_at_start = call->limit_at_start = 0;
    if (p->active)
        sluice__pool_began(p, call, status, waited);
    if (status == SLUICE_OK)
        sluice__pool_start(p, call);
    return status;
}

/* sluice_pool_call_begin_by with one deadline for the whole call (NULL = none). */
SLUICE_INLINE int sluice_pool_call_begin(struct sluice_pool *p, const struct timespec *deadline,
                                         struct sluice_cancel *cancel, struct sluice_call *call)
{
    return sluice_pool_call_begin_by(p, NULL, deadline, cancel, call);
}

/* ---- the async call path (event loops) ------------------------------------ */

/* Runs exactly once per sluice_pool_call_begin_async; see there. */
typedef void (*sluice_pool_fn)(struct sluice_pool_waiter *waiter, int status);

/*
 * An async generation call: set `cb` (and `data`), keep the record alive
 * until cb has run. Every other field belongs to the pool from the moment
 * sluice_pool_call_begin_async is called (stale contents are overwritten).
 */
struct sluice_pool_waiter {
    sluice_pool_fn cb;
    void *data;
    const struct timespec *deadline; /* for the start rule only: a grant with less time left
                                        than the expected service time settles ETIMEDOUT
                                        (default: NULL = none; the event loop still times
                                        the wait itself, until sluice_pool_wait_bound) */
    const struct timespec *start_deadline; /* the same for the start deadline, against the
                                              expected time to first byte (default: none) */
    struct sluice_call call; /* filled before cb runs with SLUICE_OK */
    /* private */
    struct sluice_gate_waiter sluice__gate;
    struct sluice_pool *sluice__pool;
    struct sluice_pool_waiter *sluice__next, *sluice__prev; /* async holders; under hold_lock */
    int64_t sluice__arrived;
    bool sluice__held; /* on the async holders list; under hold_lock */
};

/* Start an async call whose permit is in hand and whose hold is over (or refuse it: too late). */
SLUICE_INLINE void sluice__pool_async_start(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    w->call.start_ns = sluice_clock_now(&p->clock);
    w->call.queued_ns = w->call.start_ns - w->sluice__arrived;
    w->call.expired = p->active ? sluice__pool_too_late(p, w->start_deadline, w->deadline)
                                : SLUICE_EXPIRED_NONE;
    w->call.refused_late = w->call.expired != SLUICE_EXPIRED_NONE;
    if (p->active)
        sluice__pool_began(p, &w->call, SLUICE_OK, w->call.queued_ns > 0);
    if (w->call.refused_late) {
        sluice_gate_release(&p->gate);
        w->cb(w, SLUICE_ETIMEDOUT);
        return;
    }
    sluice__pool_start(p, &w->call);
    w->cb(w, SLUICE_OK);
}

/* Unlink an async holder (hold_lock is the lock). */
SLUICE_INLINE void sluice__pool_async_unlink_locked(struct sluice_pool *p,
                                                    struct sluice_pool_waiter *w)
{
    if (w->sluice__prev)
        w->sluice__prev->sluice__next = w->sluice__next;
    else
        p->async_held = w->sluice__next;
    if (w->sluice__next)
        w->sluice__next->sluice__prev = w->sluice__prev;
    w->sluice__next = w->sluice__prev = NULL;
    w->sluice__held = false;
    atomic_fetch_sub_explicit(&p->n_async_held, 1u, SLUICE_RELAXED);
    atomic_fetch_sub_explicit(&p->holding, 1u, SLUICE_RELAXED);
}

/* Every outcome of an async call comes here, through the gate's trampoline
 * (so callbacks never nest): start it, park it on the hold, or pass the
 * failure on. */
static inline void sluice__pool_async_granted(struct sluice_gate_waiter *gw, int status)
{
    struct sluice_pool_waiter *w = (struct sluice_pool_waiter *)gw->data;
    struct sluice_pool *p = w->sluice__pool;
    if (status != SLUICE_OK) {
        w->cb(w, status);
        return;
    }
    if (p->discovery &&
        sluice_discovery_hold_until(p->discovery) > sluice_clock_now(&p->clock)) {
        /* Counted before the re-check below (seq_cst, as a poll's cheap test
         * reads it): a poll that finds the hold over after that re-check
         * found it live also finds this call counted, and takes the lock. */
        atomic_fetch_add_explicit(&p->n_async_held, 1u, SLUICE_SEQ_CST);
        sluice_spinlock_lock(&p->hold_lock);
        bool closed = atomic_load_explicit(&p->closed, SLUICE_ACQUIRE) != 0u;
        /* Re-checked under the lock: had the hold ended since the test above,
         * and a poll run in between, nobody would ever start a parked call. */
        bool held = !closed &&
                    sluice_discovery_hold_until(p->discovery) > sluice_clock_now(&p->clock);
        if (held) {
            w->sluice__prev = NULL;
            w->sluice__next = p->async_held;
            if (p->async_held)
                p->async_held->sluice__prev = w;
            p->async_held = w;
            w->sluice__held = true;
            atomic_fetch_add_explicit(&p->holding, 1u, SLUICE_RELAXED);
        } else {
            atomic_fetch_sub_explicit(&p->n_async_held, 1u, SLUICE_RELAXED);
        }
        sluice_spinlock_unlock(&p->hold_lock);
        if (held)
            return; /* sluice_pool_poll or a later call_end starts it */
        if (closed) {
            sluice_gate_release(&p->gate);
            w->cb(w, SLUICE_ECLOSED);
            return;
        }
    }
    sluice__pool_async_start(p, w);
}

/*
 * Queue an async generation call of an admitted run (event loops: never
 * blocks). It joins the same FIFO line as sluice_pool_call_begin and waits
 * out the same Retry-After hold. w->cb runs exactly once:
 *   SLUICE_OK         permit in hand, hold over, w->call filled: make the
 *                     call, then sluice_pool_call_end(p, &w->call, ...);
 *   SLUICE_ECANCELED  withdrawn by sluice_pool_call_cancel_async;
 *   SLUICE_ETIMEDOUT  granted, but with less of w->deadline left than the
 *                     expected service time (or of w->start_deadline than
 *                     the expected time to first byte): not started
 *                     (w->call's refused_late and expired are set), the
 *                     permit went to the next in line (the start rule, see
 *                     sluice/pool_deadlines.h);
 *   SLUICE_ECLOSED    the pool is (or was meanwhile) closed.
 * It runs inline when the outcome is known at once (a permit is free, the
 * pool is unlimited or closed), otherwise on the thread that releases the
 * permit it gets (a call_end), raises the limit (discovery's flush),
 * cancels, closes, or calls sluice_pool_poll after a hold. It must not
 * block; it may call back into the pool, and may start its next call with
 * the same record. Callbacks never nest (sluice/gate.h, "The trampoline"):
 * one started from inside a callback runs right after it returns, so a
 * chain of calls started from callbacks runs in constant stack. Deadlines
 * are the event loop's business: arm a timer for sluice_pool_wait_bound
 * and withdraw the call then (sluice_pool_call_withdraw_async, which counts
 * it as a blocking call's wait ending so is counted). `w` must stay valid
 * until cb has run.
 */
SLUICE_INLINE void sluice_pool_call_begin_async(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    w->sluice__pool = p;
    w->sluice__next = w->sluice__prev = NULL;
    w->sluice__held = false;
    w->sluice__arrived = sluice_clock_now(&p->clock);
    w->call.in_flight_at_start = w->call.limit_at_start = 0;
    w->call.phantoms_at_start = w->call.shadows_at_start = 0;
    w->call.refused_late = false;
    w->call.expired = SLUICE_EXPIRED_NONE;
    w->sluice__gate.cb = sluice__pool_async_granted;
    w->sluice__gate.data = w;
    /* Outcomes known at once go through the trampoline too: a callback that
     * ends its call and starts the next must not recurse once per call. */
    bool closed = atomic_load_explicit(&p->closed, SLUICE_RELAXED) != 0u;
    if (SLUICE_LIKELY(p->active && !closed)) {
        sluice_gate_acquire_async(&p->gate, &w->sluice__gate);
        return;
    }
    sluice_gate_waiter_init(&w->sluice__gate);
    sluice_gate_settle_async(&w->sluice__gate, closed ? SLUICE_ECLOSED : SLUICE_OK);
}

/* sluice_pool_call_withdraw_async; `count` says whether the pool counts the withdrawal. */
SLUICE_INLINE int sluice__pool_withdraw_async(struct sluice_pool *p, struct sluice_pool_waiter *w,
                                              int why, bool refused_late, bool count)
{
    if (!p->active)
        return SLUICE_EAGAIN;
    /* Read before the callback runs: it may start its next call with the same record. */
    struct sluice_call left;
    left.queued_ns = sluice_clock_now(&p->clock) - w->sluice__arrived;
    left.refused_late = refused_late;
    if (sluice_gate_cancel_async(&p->gate, &w->sluice__gate) != SLUICE_OK) {
        sluice_spinlock_lock(&p->hold_lock);
        bool held = w->sluice__held;
        if (held)
            sluice__pool_async_unlink_locked(p, w);
        sluice_spinlock_unlock(&p->hold_lock);
        if (!held)
            return SLUICE_EAGAIN;
        sluice_gate_release(&p->gate);
        sluice_gate_settle_async(&w->sluice__gate, SLUICE_ECANCELED);
    } /* else sluice__pool_async_granted passed ECANCELED on */
    if (count)
        sluice__pool_began(p, &left, why, true);
    return SLUICE_OK;
}

/*
 * Withdraw an async call that has not started. Returns SLUICE_OK if it was
 * still queued for a permit or waiting out a hold (its callback has run
 * with SLUICE_ECANCELED, and any permit it held went to the next in line),
 * or SLUICE_EAGAIN if its callback already ran or is about to run with
 * another status. Call only after sluice_pool_call_begin_async returned.
 * The pool counts nothing for it: an event loop withdrawing a call for its
 * deadline or its token says so with sluice_pool_call_withdraw_async.
 */
SLUICE_INLINE int sluice_pool_call_cancel_async(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    return sluice__pool_withdraw_async(p, w, SLUICE_ECANCELED, false, false);
}

/*
 * sluice_pool_call_cancel_async for an event loop that times its calls'
 * waits and watches their tokens itself, counted as a blocking call's wait
 * ending the same way would be: `why` is SLUICE_ETIMEDOUT (its wait bound
 * or deadline came) or SLUICE_ECANCELED (its token fired), any other status
 * (a shutdown) counted as neither; `refused_late` says it left at its wait
 * bound before its deadline (sluice_pool_wait_bound: refused_late, not a
 * timeout). Either way its wait joins the queue-wait histogram. The
 * callback still gets SLUICE_ECANCELED; the loop reports `why`. So the
 * stats, /metrics and the admin page count the curl loop's calls that
 * could not start in time as they count the blocking path's.
 */
SLUICE_INLINE int sluice_pool_call_withdraw_async(struct sluice_pool *p,
                                                  struct sluice_pool_waiter *w, int why,
                                                  bool refused_late)
{
    return sluice__pool_withdraw_async(p, w, why, refused_late, true);
}

/* Detach the async holders, all of them or (hold over) those now free to start. */
SLUICE_INLINE struct sluice_pool_waiter *sluice__pool_take_async(struct sluice_pool *p, bool all)
{
    /* The empty test is only a shortcut for polls: close must look under the
     * lock, or an async grant racing it could park a call after it looked. */
    if (!all && !atomic_load_explicit(&p->n_async_held, SLUICE_SEQ_CST))
        return NULL;
    struct sluice_pool_waiter *list = NULL;
    sluice_spinlock_lock(&p->hold_lock);
    if (all || sluice_discovery_hold_until(p->discovery) <= sluice_clock_now(&p->clock)) {
        while (p->async_held) {
            struct sluice_pool_waiter *w = p->async_held;
            sluice__pool_async_unlink_locked(p, w);
            w->sluice__next = list; /* reversed: the list was newest first */
            list = w;
        }
    }
    sluice_spinlock_unlock(&p->hold_lock);
    return list;
}

/*
 * Release the lingering permits whose time has come, then start the async
 * calls that were waiting out a Retry-After hold, if it is over (their
 * callbacks run here). call_end does both too; an event loop calls this
 * from a timer at sluice_pool_hold_until and sluice_pool_next_release so
 * held calls start, and lingering permits come back, even when nothing
 * else completes. Cheap when nothing is held or lingering.
 */
SLUICE_INLINE void sluice_pool_poll(struct sluice_pool *p)
{
    if (p->active)
        sluice__pool_reap(p);
    for (struct sluice_pool_waiter *w = sluice__pool_take_async(p, false); w;) {
        struct sluice_pool_waiter *next = w->sluice__next;
        w->sluice__next = NULL;
        sluice_gate_settle_async(&w->sluice__gate, SLUICE_OK); /* starts it */
        w = next;
    }
}

/* ---- ending a call ---------------------------------------------------------- */

/* The sample a call ends with; its latency is start to now when latency_ns < 0. */
SLUICE_INLINE struct sluice_sample sluice__pool_sample(const struct sluice_call *call,
                                                       enum sluice_outcome outcome,
                                                       int64_t retry_after_ns, int64_t latency_ns,
                                                       int64_t now)
{
    struct sluice_sample sample;
    sample.latency_ns = latency_ns >= 0 ? latency_ns : now - call->start_ns;
    sample.in_flight_at_start = call->in_flight_at_start;
    sample.outcome = outcome;
    sample.retry_after_ns = retry_after_ns;
    sample.start_ns = call->start_ns;
    sample.limit_at_start = call->limit_at_start;
    return sample;
}

/*
 * Everything call_end and call_abandon share: count, record the sample,
 * then give the permit back — or, with `linger_until` > now, keep it (and
 * the in-flight count) until then — and run discovery's effects.
 */
SLUICE_INLINE struct sluice_sample sluice__pool_end(struct sluice_pool *p,
                                                    const struct sluice_call *call,
                                                    enum sluice_outcome outcome,
                                                    int64_t retry_after_ns, int64_t latency_ns,
                                                    int64_t now, bool abandoned,
                                                    int64_t linger_until)
{
    struct sluice_sample sample =
        sluice__pool_sample(call, outcome, retry_after_ns, latency_ns, now);
    bool linger = linger_until > now;
    atomic_fetch_add_explicit(&p->ended[outcome == SLUICE_OUTCOME_CENSORED ? 3u
                                        : !abandoned && (unsigned)outcome <= SLUICE_OUTCOME_IGNORE
                                            ? (unsigned)outcome
                                            : (unsigned)SLUICE_OUTCOME_IGNORE],
                              1u, SLUICE_RELAXED);
    if (SLUICE_UNLIKELY(p->discovery != NULL)) {
        struct sluice_sample heard = sample;
        if (sluice__pool_phantom_refusal(p, call, outcome))
            heard.outcome = SLUICE_OUTCOME_IGNORE;
        sluice_discovery_record(p->discovery, &heard);
    }
    /* After the record: a streamed window counts its calls still out by the calls in
     * flight, and this one is in the count until its sample is in
     * (sluice__discovery_count_down). */
    if (!linger)
        atomic_fetch_sub_explicit(&p->in_flight, 1u, SLUICE_RELAXED);
    /* The sample may have raised the limit, granting waiters too: async
     * callbacks wait until every sync waiter this end granted is woken. */
    bool outer = SLUICE_UNLIKELY(p->discovery != NULL) && sluice_gate_hold_callbacks();
    if (linger)
        sluice__pool_linger(p, linger_until);
    else if (p->active)
        sluice_gate_release(&p->gate);
    if (p->active) {
        /* The operator's figures, and the estimates, after the permit moved on: only a
         * call that ran to its end says how long calls take. */
        if (!abandoned) {
            sluice_histogram_add(&p->call_time, now - call->start_ns);
            if (outcome == SLUICE_OUTCOME_OK) {
                sluice_service_add(&p->service, now - call->start_ns);
                sluice_service_add(&p->first_byte, sample.latency_ns);
            }
        } else {
            /* A call cut at t takes longer than t, whether its deadline or its caller cut it:
             * without it the estimates would see only the calls short enough to beat their
             * deadlines (sluice/service_time.h), and a cold start whose callers all hang up
             * would never learn how long to keep their permits (sluice-proxy behind an SDK's
             * 250 ms timeout: released at once, 26 calls in 15 ms filled a provider's cap of
             * 24 behind a count of 5, and its 429s cut discovery to 1). */
            sluice_service_add_censored(&p->service, now - call->start_ns);
            if (outcome == SLUICE_OUTCOME_OK) /* its first byte came */
                sluice_service_add(&p->first_byte, sample.latency_ns);
            else
                sluice_service_add_censored(&p->first_byte, now - call->start_ns);
        }
        sluice__pool_linger_verdict(p, call, outcome);
        sluice__pool_reap(p);
    }
    if (SLUICE_UNLIKELY(p->discovery != NULL)) {
        sluice_discovery_hand_out_grants(p->discovery);
        sluice_gate_resume_callbacks(outer);
        sluice_discovery_flush(p->discovery);
        sluice_pool_poll(p);
    }
    return sample;
}

/*
 * End a call with the latency signal the caller measured (see
 * sluice_pool_call_end): `latency_ns` is what discovery learns from — for a
 * streamed answer, time to first byte, because total time measures output
 * length, not queueing; a negative value means "start to now". The sample
 * keeps the call's own start, so it lands in the window it started in.
 * The expected service time (sluice/service_time.h) learns the call's whole
 * duration, start to now, from every OK call: it asks how long a call
 * takes to finish.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_end_latency(struct sluice_pool *p,
                                                                const struct sluice_call *call,
                                                                enum sluice_outcome outcome,
                                                                int64_t retry_after_ns,
                                                                int64_t latency_ns)
{
    return sluice__pool_end(p, call, outcome, retry_after_ns, latency_ns,
                            sluice_clock_now(&p->clock), false, 0);
}

/*
 * End a call the caller gave up on after its request was sent: `why` is
 * SLUICE_ETIMEDOUT (a deadline) or SLUICE_ECANCELED (its token), counted in
 * the pool's timeouts or cancels, or 0 for a call read on past its deadline
 * (sluice_pool_call_read_on, which counted it): cut as a deadline's, counted
 * nowhere again. `latency_ns` is the latency signal if it
 * was seen before the call was cut (a stream's first byte; then discovery
 * gets it as a served call's), else negative: a call cut by its deadline
 * at t then teaches discovery "longer than t" (SLUICE_OUTCOME_CENSORED,
 * latency t), a cancelled one nothing (IGNORE); either way the service
 * estimate learns that the call ran longer than t. Whether the call keeps its
 * permit follows the pool's linger mode (enum sluice_linger): where the
 * provider keeps working it stays in flight until sluice_service_linger_until
 * (the high quantile of recent service times after now, or before there is
 * one the time the call has run; capped by linger_max_ms from its start): a
 * lingering permit, released by whoever comes by first (see
 * sluice/pool_linger.h). Released at once when lingering is off, or the call
 * has already run that long. Returns the sample. Never blocks.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_abandon_latency(struct sluice_pool *p,
                                                                    const struct sluice_call *call,
                                                                    int why, int64_t latency_ns)
{
    int64_t now = sluice_clock_now(&p->clock);
    int64_t until = 0;
    if (p->active) {
        sluice__pool_count_stop(p, why);
        enum sluice_linger mode = sluice_pool_linger_now(p);
        if (mode != SLUICE_LINGER_OFF)
            until = sluice_service_linger_until(&p->service, call->start_ns, now,
                                                p->linger_max_ns);
        if (mode == SLUICE_LINGER_LEARNED && until > now &&
            sluice__pool_trial(p, sluice__pool_phantom_until(p, call->start_ns, now, until),
                               until))
            until = 0;
    }
    enum sluice_outcome outcome = latency_ns >= 0                  ? SLUICE_OUTCOME_OK
                                  : why == SLUICE_ETIMEDOUT || !why ? SLUICE_OUTCOME_CENSORED
                                                                    : SLUICE_OUTCOME_IGNORE;
    return sluice__pool_end(p, call, outcome, 0, latency_ns, now, true, until);
}

/*
 * A running call's caller is answered at its deadline, and the transport
 * can still read the answer: should it? Returns how long to read it on (ns),
 * or 0 where the call is to be cut and abandoned now (then call
 * sluice_pool_call_abandon as before): where the pool would not keep its
 * permit anyway (sluice_pool_read_on_left: lingering off, LEARNED at a
 * locked ceiling for a call young enough to be a trial phantom,
 * linger_max_ms passed). Where it returns more (until linger_max_ms from the
 * call's start), the call is counted in the timeouts (its caller's deadline)
 * and stays in flight with its permit; the transport drops what comes and
 * ends the call as any other when the answer ends
 * (sluice_pool_call_end_latency: discovery sees the whole call, not a
 * censored one, and the permit comes back when the provider is done, not
 * when an estimate says), or, once the returned time has passed, abandons it
 * with `why` 0. Why: a permit kept for an estimate cannot tell the calls the
 * provider still runs from those it has finished, and under deadlines that
 * cut a third of the calls the estimate's phantoms hold the limit one or two
 * above a cap of 52 (bench/RESULTS.md, the censored rows; reading on meets
 * the band in every seed). Never blocks.
 */
SLUICE_INLINE int64_t sluice_pool_call_read_on(struct sluice_pool *p,
                                               const struct sluice_call *call)
{
    int64_t left = sluice_pool_read_on_left(p, sluice_clock_now(&p->clock) - call->start_ns);
    if (left > 0)
        sluice__pool_count_stop(p, SLUICE_ETIMEDOUT);
    return left;
}

/* sluice_pool_call_abandon_latency with no latency signal seen. */
SLUICE_INLINE struct sluice_sample sluice_pool_call_abandon(struct sluice_pool *p,
                                                            const struct sluice_call *call, int why)
{
    return sluice_pool_call_abandon_latency(p, call, why, -1);
}

/*
 * End a call that sluice_pool_call_begin (or an async call's SLUICE_OK)
 * started: give its permit back (waking the next call in line) and return
 * its sample, whose latency is start to now. `outcome` says what the call
 * showed about the provider's capacity; `retry_after_ns` is the hold the
 * provider asked for (0 = none): its Retry-After with an overload, the
 * named reset with SLUICE_OUTCOME_RATE, the reset of a spent request budget
 * with SLUICE_OUTCOME_OK (see discovery.h, "What a signal means"). An adaptive pool
 * feeds the sample to its discovery first, so a limit cut or hold it causes
 * is in force before the permit moves on; discovery's effects (grants after
 * a raise, store I/O, event callbacks) run after the permit is released, on
 * this thread unless another thread is already running them. The pool's
 * clock also counts the wait between the permit and this thread running
 * again, which on a loaded machine is the caller's delay, read as the
 * provider's: where the transport measures the call itself (curl's
 * CURLINFO_STARTTRANSFER_TIME_T, as the shim gives), pass that to
 * sluice_pool_call_end_latency instead.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_end(struct sluice_pool *p,
                                                        const struct sluice_call *call,
                                                        enum sluice_outcome outcome,
                                                        int64_t retry_after_ns)
{
    return sluice_pool_call_end_latency(p, call, outcome, retry_after_ns, -1);
}

#endif /* SLUICE_POOL_CALL_H */
