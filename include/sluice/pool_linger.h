/*
 * sluice/pool_linger.h — lingering permits: a call given up on while the
 * provider may still be working on it keeps its permit for a while. Part
 * of sluice/pool.h, which is what to include.
 *
 * The model: a call the caller gives up on after its request was sent (its
 * deadline or token fired mid-transfer) may still be running at the
 * provider, which then keeps counting it against its cap (hosted APIs may
 * keep generating; inference servers such as vLLM abort a request whose
 * client hung up). sluice_deadline_desc.linger says which
 * (SLUICE_LINGER_ON, _OFF, or _LEARNED, the default: see enum
 * sluice_linger; LEARNED decides by a trial at the locked ceiling,
 * sluice__pool_trial and sluice__pool_linger_verdict below). Where it
 * keeps working, ending the call with sluice_pool_call_abandon keeps its
 * permit and its place in the in-flight count (so the next call's
 * in_flight_at_start counts it) for the high quantile of recent service
 * times after it was given up (sluice_service_linger_until: a call that
 * has outlived its deadline is a long one, and the successes seen are
 * censored by the deadlines), capped by sluice_deadline_desc.linger_max_ms
 * from its start (0 disables); then the permit is released. Who releases
 * it, so that no permit is lost and nothing stalls without traffic: the
 * next call_begin or call_end on the pool, sluice_pool_admit_by,
 * sluice_pool_poll (and so sluice_engine_poll; event loops arm a timer for
 * sluice_pool_next_release, as the curl loop does), and — for blocking
 * callers queued for a permit — one of them: in a pool with lingering
 * enabled, a contended call_begin queues through the gate's async path
 * (sluice_gate_acquire_async_wake) and parks on its own futex word (a
 * watcher); the newest watcher also sets its wake-up to the earliest
 * lingering release, and a watcher that leaves hands that duty to the next.
 * So a queue of blocked callers drains even when every permit is
 * lingering and nothing else runs.
 *
 * Progress: keeping a permit never blocks: a CAS on a free slot (one
 * exists for every permit), then a brief hold_lock to poke the newest
 * watcher. Reaping is cheap when none lingers (two relaxed loads) or
 * none is due, and one thread reaps at a time (a try-lock: a caller that
 * finds it taken leaves the work to the holder). A watcher's wait blocks,
 * like the gate's.
 *
 * Locking and memory ordering: linger_lock is the reaper's try-lock;
 * sluice__pool_reap says how its reset of linger_next and an abandon
 * racing the scan never lose a release instant. The watchers are linked
 * under the pool's hold_lock (sluice/pool_hold.h). A watcher and a new
 * linger meet through seq_cst operations on linger_epoch and the
 * watcher's futex word (announce sleep, then re-check the epoch; bump the
 * epoch, then poke the watcher), so no new release instant goes unseen.
 * LEARNED lingering's trial state (phantoms, shadows, trial_served, linger_learned)
 * is relaxed values read as estimates, never publications.
 */
#ifndef SLUICE_POOL_LINGER_H
#define SLUICE_POOL_LINGER_H

#include "pool_hold.h"
#include "pool_state.h"

/* A blocked call queued for a permit in a pool with lingering permits: on its own stack. */
struct sluice__pool_watcher {
    struct sluice__pool_watcher *next, *prev; /* guarded by the pool's hold_lock; newest first */
    _Atomic(uint32_t) state;                  /* SLUICE__WATCH_*; the futex word */
    int verdict;                              /* the gate's status, written before SETTLED */
    struct sluice_gate_waiter gw;
    struct sluice_cancel_hook hook;
};

enum { SLUICE__WATCH_AWAKE = 0, SLUICE__WATCH_ASLEEP = 1, SLUICE__WATCH_SETTLED = 2 };

/* Lower linger_next to `at` unless it is already earlier. */
SLUICE_INLINE void sluice__pool_linger_lower(struct sluice_pool *p, int64_t at)
{
    int64_t cur = atomic_load_explicit(&p->linger_next, SLUICE_SEQ_CST);
    while (at < cur && !atomic_compare_exchange_weak_explicit(&p->linger_next, &cur, at,
                                                              SLUICE_SEQ_CST, SLUICE_SEQ_CST))
        ;
}

/* Forget the trial's phantoms (or shadows: `slots` and their `count`) whose time has passed
 * (sluice__pool_trial). Call with linger_lock held. */
SLUICE_INLINE void sluice__pool_reap_trial_locked(struct sluice_pool *p, _Atomic(int64_t) *slots,
                                                  _Atomic(uint32_t) *count, int64_t now)
{
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t at = atomic_load_explicit(&slots[i], SLUICE_RELAXED);
        if (at != SLUICE__LINGER_FREE && at <= now) {
            atomic_store_explicit(&slots[i], SLUICE__LINGER_FREE, SLUICE_RELAXED);
            atomic_fetch_sub_explicit(count, 1u, SLUICE_RELAXED);
        }
    }
}

/*
 * Release every lingering permit whose time has come (and forget the trial
 * phantoms and shadows whose time has come). Cheap when none lingers (three
 * relaxed loads) or none is due. One reaper at a time (a try-lock: a caller that
 * finds it taken leaves the work to the holder). The reaper first resets
 * linger_next, then scans and lowers it to what is left: an abandon that
 * lands during the scan lowers it after the reset, so no release instant
 * is ever lost. Permits go back after the lock is dropped, each after its
 * in-flight count (as call_end does).
 */
SLUICE_INLINE void sluice__pool_reap(struct sluice_pool *p)
{
    bool phantoms = atomic_load_explicit(&p->phantoms, SLUICE_RELAXED) != 0 ||
                    atomic_load_explicit(&p->shadows, SLUICE_RELAXED) != 0;
    if (SLUICE_LIKELY(!atomic_load_explicit(&p->lingering, SLUICE_RELAXED) && !phantoms))
        return;
    int64_t now = sluice_clock_now(&p->clock);
    if ((!phantoms && now < atomic_load_explicit(&p->linger_next, SLUICE_SEQ_CST)) ||
        !sluice_spinlock_trylock(&p->linger_lock))
        return;
    if (phantoms) {
        sluice__pool_reap_trial_locked(p, p->phantom_slots, &p->phantoms, now);
        sluice__pool_reap_trial_locked(p, p->shadow_slots, &p->shadows, now);
    }
    atomic_store_explicit(&p->linger_next, INT64_MAX, SLUICE_SEQ_CST);
    uint32_t freed = 0;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t at = atomic_load_explicit(&p->linger_slots[i], SLUICE_SEQ_CST);
        if (at == SLUICE__LINGER_FREE)
            continue;
        if (at <= now) {
            atomic_store_explicit(&p->linger_slots[i], SLUICE__LINGER_FREE, SLUICE_RELAXED);
            freed++;
        } else if (at < next) {
            next = at;
        }
    }
    sluice__pool_linger_lower(p, next);
    sluice_spinlock_unlock(&p->linger_lock);
    for (uint32_t i = 0; i < freed; i++) {
        atomic_fetch_sub_explicit(&p->lingering, 1u, SLUICE_RELAXED);
        atomic_fetch_sub_explicit(&p->in_flight, 1u, SLUICE_RELAXED);
        sluice_gate_release(&p->gate);
    }
}

/*
 * When the next lingering permit is released (pool clock, ns); INT64_MAX
 * when none lingers. Event loops arm a timer for it and call
 * sluice_pool_poll, so a queue drains even when nothing else completes.
 */
SLUICE_INLINE int64_t sluice_pool_next_release(const struct sluice_pool *p)
{
    struct sluice_pool *q = (struct sluice_pool *)p;
    return atomic_load_explicit(&q->lingering, SLUICE_RELAXED)
               ? atomic_load_explicit(&q->linger_next, SLUICE_SEQ_CST)
               : INT64_MAX;
}

/* Move a watcher from ASLEEP to AWAKE and wake it; a settled one stays settled. */
SLUICE_INLINE void sluice__pool_watch_rouse(struct sluice__pool_watcher *w)
{
    uint32_t asleep = SLUICE__WATCH_ASLEEP;
    if (atomic_compare_exchange_strong_explicit(&w->state, &asleep, SLUICE__WATCH_AWAKE,
                                                SLUICE_SEQ_CST, SLUICE_SEQ_CST))
        sluice_futex_wake(&w->state);
}

/* The watcher that times the lingering releases (the newest) must look again. Any thread. */
SLUICE_INLINE void sluice__pool_watch_poke(struct sluice_pool *p)
{
    sluice_spinlock_lock(&p->hold_lock);
    if (p->watchers)
        sluice__pool_watch_rouse(p->watchers);
    sluice_spinlock_unlock(&p->hold_lock);
}

/* The gate settled a watcher's wait (any thread). Its last touch is the wake. */
static inline void sluice__pool_watch_settled(struct sluice_gate_waiter *gw, int status)
{
    struct sluice__pool_watcher *w = (struct sluice__pool_watcher *)gw->data;
    w->verdict = status;
    if (atomic_exchange_explicit(&w->state, SLUICE__WATCH_SETTLED, SLUICE_SEQ_CST) ==
        SLUICE__WATCH_ASLEEP)
        sluice_futex_wake(&w->state);
}

static inline void sluice__pool_watch_on_cancel(struct sluice_cancel_hook *hook)
{
    sluice__pool_watch_rouse((struct sluice__pool_watcher *)(void *)((char *)hook -
                                                                       offsetof(
                                                                           struct sluice__pool_watcher,
                                                                           hook)));
}

/* Wait for a watcher's verdict that is on its way (its withdrawal lost the race). */
SLUICE_INLINE int sluice__pool_watch_verdict(struct sluice__pool_watcher *w)
{
    sluice_park_while(&w->state, SLUICE__WATCH_AWAKE, SLUICE__WATCH_ASLEEP);
    return w->verdict;
}

/* Link (newest first) or unlink a watcher; unlinking the timer hands its duty on. */
SLUICE_INLINE bool sluice__pool_watch_link(struct sluice_pool *p, struct sluice__pool_watcher *w,
                                           bool link)
{
    sluice_spinlock_lock(&p->hold_lock);
    bool newest = p->watchers == w;
    if (link) {
        w->prev = NULL;
        w->next = p->watchers;
        if (p->watchers)
            p->watchers->prev = w;
        p->watchers = w;
    } else {
        if (w->prev)
            w->prev->next = w->next;
        else
            p->watchers = w->next;
        if (w->next)
            w->next->prev = w->prev;
        if (newest && p->watchers && atomic_load_explicit(&p->lingering, SLUICE_RELAXED))
            sluice__pool_watch_rouse(p->watchers);
    }
    newest = p->watchers == w;
    sluice_spinlock_unlock(&p->hold_lock);
    return newest;
}

/* When a watcher sleeps until: its deadline, and for the newest the next linger release. */
SLUICE_INLINE bool sluice__pool_watch_wake_at(struct sluice_pool *p,
                                              struct sluice__pool_watcher *w,
                                              const struct timespec *deadline, struct timespec *at)
{
    int64_t release = INT64_MAX;
    sluice_spinlock_lock(&p->hold_lock);
    if (p->watchers == w)
        release = sluice_pool_next_release(p);
    sluice_spinlock_unlock(&p->hold_lock);
    if (release == INT64_MAX) {
        if (deadline)
            *at = *deadline;
        return deadline != NULL;
    }
    int64_t left = release - sluice_clock_now(&p->clock);
    *at = sluice__pool_wake_at(left > 0 ? left : 0, deadline);
    return true;
}

/*
 * The contended wait of a pool with lingering permits: queue through the
 * gate's async path (same FIFO line), park on our own word, and wake for
 * the grant, the deadline, the token, or — for the newest waiter — the
 * next lingering release, which we then perform (sluice__pool_reap).
 * Returns the gate's verdict (SLUICE_OK with the permit, ECLOSED) or the
 * stop reason (ETIMEDOUT, ECANCELED) with no permit held.
 */
SLUICE_INLINE int sluice__pool_watch(struct sluice_pool *p, const struct timespec *deadline,
                                     struct sluice_cancel *cancel)
{
    struct sluice__pool_watcher w;
    atomic_init(&w.state, (uint32_t)SLUICE__WATCH_AWAKE);
    w.verdict = SLUICE_OK;
    w.gw.cb = sluice__pool_watch_settled;
    w.gw.data = &w;
    w.hook.fn = sluice__pool_watch_on_cancel;
    sluice__pool_watch_link(p, &w, true);
    bool hooked = cancel && sluice_cancel_register(cancel, &w.hook);
    sluice_gate_acquire_async_wake(&p->gate, &w.gw); /* woken first, like a sync waiter */
    int status;
    for (;;) {
        uint32_t epoch = atomic_load_explicit(&p->linger_epoch, SLUICE_SEQ_CST);
        if (atomic_load_explicit(&w.state, SLUICE_ACQUIRE) == SLUICE__WATCH_SETTLED) {
            status = w.verdict;
            break;
        }
        if ((status = sluice_wait_stop_reason(deadline, cancel)) != SLUICE_OK) {
            if (sluice_gate_cancel_async(&p->gate, &w.gw) != SLUICE_OK &&
                sluice__pool_watch_verdict(&w) == SLUICE_OK)
                sluice_gate_release(&p->gate); /* granted as we gave up: pass it on */
            break;
        }
        sluice__pool_reap(p);
        struct timespec at;
        bool timed = sluice__pool_watch_wake_at(p, &w, deadline, &at);
        uint32_t awake = SLUICE__WATCH_AWAKE;
        if (!atomic_compare_exchange_strong_explicit(&w.state, &awake, SLUICE__WATCH_ASLEEP,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue;
        /* Re-check after announcing sleep: a token or a new linger in between woke nobody. */
        if (sluice_wait_stop_reason(deadline, cancel) == SLUICE_OK &&
            atomic_load_explicit(&p->linger_epoch, SLUICE_SEQ_CST) == epoch)
            sluice_futex_wait(&w.state, SLUICE__WATCH_ASLEEP, timed ? &at : NULL);
        sluice__pool_watch_rouse(&w);
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &w.hook);
    sluice__pool_watch_link(p, &w, false);
    return status;
}

/* Calls a trial needs served above the ceiling, with phantoms around, before LEARNED
 * lingering decides the provider frees the slots of abandoned calls: one could be luck (a
 * phantom that had just finished), eight in a row are not. */
#define SLUICE_POOL_LINGER_TRIAL_CALLS 8u

/* The ceiling the trial of LEARNED lingering measures against: the locked ceiling of an
 * adaptive pool, where the provider refused or queued (0 = none yet: no trial). A fixed
 * pool's limit is the operator's, not a point where the provider refuses: serving above it
 * proves nothing, so a fixed pool never runs the trial (LEARNED keeps permits there). */
SLUICE_INLINE uint32_t sluice__pool_trial_ceiling(const struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_ceiling(p->discovery) : 0;
}

/* The trial's ceiling when the call started with its own count plus `released` (its
 * phantoms or its shadows, sluice__pool_trial) above it, where the provider refuses if they
 * still run; 0 when it did not (or there is no trial). */
SLUICE_INLINE uint32_t sluice__pool_trial_passed(const struct sluice_pool *p,
                                                 const struct sluice_call *call, uint32_t released)
{
    uint32_t ceiling = released ? sluice__pool_trial_ceiling(p) : 0;
    return ceiling && call->in_flight_at_start + released > ceiling ? ceiling : 0;
}

/* The released calls perhaps still running when the call started: its shadows, or its phantoms
 * where more (a phantom whose shadow found every slot taken, sluice__pool_trial). */
SLUICE_INLINE uint32_t sluice__pool_shadows_at_start(const struct sluice_call *call)
{
    return call->shadows_at_start > call->phantoms_at_start ? call->shadows_at_start
                                                            : call->phantoms_at_start;
}

/*
 * LEARNED lingering, the trial's verdict from one ended call that started with
 * released calls above the ceiling: refused beside its shadows, they were
 * still running there (it keeps working: lingering on for good); served
 * beside its phantoms, which would surely still be running, they were not —
 * after SLUICE_POOL_LINGER_TRIAL_CALLS of them it frees the slot of an
 * abandoned call (lingering off for good).
 */
SLUICE_INLINE void sluice__pool_linger_verdict(struct sluice_pool *p, const struct sluice_call *call,
                                               enum sluice_outcome outcome)
{
    uint32_t shadows = sluice__pool_shadows_at_start(call);
    if (SLUICE_LIKELY(!shadows) || p->linger != SLUICE_LINGER_LEARNED ||
        atomic_load_explicit(&p->linger_learned, SLUICE_RELAXED) != SLUICE_LINGER_LEARNED)
        return;
    if (outcome == SLUICE_OUTCOME_OVERLOAD && sluice__pool_trial_passed(p, call, shadows))
        atomic_store_explicit(&p->linger_learned, (uint32_t)SLUICE_LINGER_ON, SLUICE_RELAXED);
    else if (outcome == SLUICE_OUTCOME_OK &&
             sluice__pool_trial_passed(p, call, call->phantoms_at_start) &&
             atomic_fetch_add_explicit(&p->trial_served, 1u, SLUICE_RELAXED) + 1u >=
                 SLUICE_POOL_LINGER_TRIAL_CALLS)
        atomic_store_explicit(&p->linger_learned, (uint32_t)SLUICE_LINGER_OFF, SLUICE_RELAXED);
}

/* A refusal the trial's released calls explain: the call started with its own count at or
 * under the ceiling and its shadows above it, so the provider refused exactly where the lock
 * says it would if they were still running (which is what the trial asks). It says nothing
 * new about the cap: discovery hears it as IGNORE, not as a refusal at the lock, which would
 * back the limit off (it cut 24 to 21, one run in two, over HTTP). */
SLUICE_INLINE bool sluice__pool_phantom_refusal(const struct sluice_pool *p,
                                                const struct sluice_call *call,
                                                enum sluice_outcome outcome)
{
    uint32_t shadows = sluice__pool_shadows_at_start(call);
    if (SLUICE_LIKELY(!shadows) || outcome != SLUICE_OUTCOME_OVERLOAD)
        return false;
    uint32_t ceiling = sluice__pool_trial_passed(p, call, shadows);
    return ceiling && call->in_flight_at_start <= ceiling;
}

/*
 * Until when an abandoned call (started at start_ns, given up at now) counts as a trial
 * phantom: while it would still be running 9 times in 10 if the provider kept working on it,
 * that is until the floor quantile of service times from its start (sluice_service_floor),
 * and never past `until`, its lingering permit's end. Only then does a call served beside
 * it say the provider freed its slot. 0: it has already run that long (or nothing is known
 * yet), and its absence would prove nothing, so it is no phantom and keeps its permit.
 * (Counted until the high quantile after now, as a permit lingers, phantoms of 250 ms cuts of
 * a 200 ms provider outlived their calls about fivefold; the calls served beside them turned
 * lingering off against a provider that kept working, 1 run in 3 of
 * bench/openai_sdk_rate.py --case overload, and its refusals then walked the limit from 25
 * down to 16.)
 */
SLUICE_INLINE int64_t sluice__pool_phantom_until(const struct sluice_pool *p, int64_t start_ns,
                                                 int64_t now, int64_t until)
{
    int64_t floor_ns = sluice_service_floor(&p->service);
    int64_t sure = floor_ns > 0 ? sluice_add_ns(start_ns, floor_ns) : 0;
    return sure <= now ? 0 : sure < until ? sure : until;
}

/* Claim a free one of `slots` until `until` and count it; false when all are taken. */
SLUICE_INLINE bool sluice__pool_trial_claim(struct sluice_pool *p, _Atomic(int64_t) *slots,
                                            _Atomic(uint32_t) *count, int64_t until)
{
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t free_slot = SLUICE__LINGER_FREE;
        if (atomic_compare_exchange_strong_explicit(&slots[i], &free_slot, until, SLUICE_RELAXED,
                                                    SLUICE_RELAXED)) {
            atomic_fetch_add_explicit(count, 1u, SLUICE_RELAXED);
            return true;
        }
    }
    return false;
}

/*
 * LEARNED lingering, undecided, with a ceiling to test against: release an abandoned call's
 * permit at once and remember it as a phantom until `sure` (sluice__pool_phantom_until: calls
 * served beside it say the provider freed its slot), and as a shadow until `until`, its
 * lingering permit's end (refusals beside it are its doing, if the provider still runs it).
 * Why both: past `sure` the call most likely still runs (bench/openai_sdk_rate.py --case
 * stream stops streams 0.36 s into answers of about 1.3 s); forgotten there, the refusals it
 * caused read as a cap come down at the lock. False: no trial (no ceiling, `sure` 0, or every
 * phantom slot taken once those whose time has passed are reaped): keep the permit instead.
 * (Without that reap, slots nobody had reaped since their time passed kept a call's permit.)
 */
SLUICE_INLINE bool sluice__pool_trial(struct sluice_pool *p, int64_t sure, int64_t until)
{
    if (!sure || !sluice__pool_trial_ceiling(p))
        return false;
    sluice__pool_reap(p); /* slots whose time has passed are free, reaped or not */
    if (!sluice__pool_trial_claim(p, p->phantom_slots, &p->phantoms, sure))
        return false;
    sluice__pool_trial_claim(p, p->shadow_slots, &p->shadows, until); /* none free: unexplained */
    return true;
}

/* What an abandoned call does with its permit now: SLUICE_LINGER_ON (keep it), _OFF (release
 * it), or _LEARNED (undecided: keep it, or release it on trial). */
SLUICE_INLINE enum sluice_linger sluice_pool_linger_now(const struct sluice_pool *p)
{
    return p->linger != SLUICE_LINGER_LEARNED
               ? p->linger
               : (enum sluice_linger)atomic_load_explicit(
                     &((struct sluice_pool *)p)->linger_learned, SLUICE_RELAXED);
}

/*
 * How much longer a call abandoned now, after running age_ns, would keep its
 * permit (ns): 0 where it would not keep it or a trial may release it at once
 * (lingering off; LEARNED at a locked ceiling for a call young enough to be
 * a trial phantom, sluice__pool_phantom_until; linger_max_ms 0 or passed).
 * A call older than that keeps its permit under a trial too, so it counts:
 * after a lock, calls cut at deadlines past the floor quantile are most cut
 * calls (over HTTP, cap 24, 250 ms deadlines: 769 of 769 lingered in 30 s).
 * The estimate is the high quantile of service times after now
 * (sluice_service_linger_until). A caller that can still see the answer reads
 * it on instead (sluice_pool_read_on_left).
 */
SLUICE_INLINE int64_t sluice_pool_linger_left(const struct sluice_pool *p, int64_t age_ns)
{
    enum sluice_linger mode = sluice_pool_linger_now(p);
    if (!p->active || mode == SLUICE_LINGER_OFF)
        return 0;
    int64_t now = sluice_clock_now(&p->clock);
    int64_t until = sluice_service_linger_until(&p->service, now - age_ns, now, p->linger_max_ns);
    if (mode == SLUICE_LINGER_LEARNED && sluice__pool_trial_ceiling(p) &&
        sluice__pool_phantom_until(p, now - age_ns, now, until)) /* as abandon decides */
        return 0;
    return until > now ? until - now : 0;
}

/*
 * How long to read on the answer of a call whose caller is gone, after running age_ns (ns),
 * for a transport that can still see it (sluice-proxy, a stream its client stopped; the curl
 * loop's `cut`, sluice_pool_call_read_on): 0 where the pool would not keep the permit
 * (sluice_pool_linger_left), else until linger_max_ms from the call's start. While the permit
 * is held anyway, the provider's own end is better evidence than any estimate: the call ends
 * as any other when the answer does. Not until the estimate, which is for permits kept blind:
 * an answer still coming is a call the provider still runs, and cut at the estimate the long
 * answers (the tail the estimate leaves out) ran on at the provider behind a count that had
 * let them go. Over HTTP, streams whose lengths spread tenfold, stopped after three chunks,
 * held 3-4 slots at a provider where lingering permits counted 1-2 at three of the refusals
 * that cut its limit.
 */
SLUICE_INLINE int64_t sluice_pool_read_on_left(const struct sluice_pool *p, int64_t age_ns)
{
    return sluice_pool_linger_left(p, age_ns) > 0 ? p->linger_max_ns - age_ns : 0;
}

/*
 * Keep an abandoned call's permit until `until` (pool clock): claim a free
 * slot (one exists: every lingering call holds one of the `active` permits),
 * lower linger_next, and tell the watcher that times releases. The call
 * stays in the in-flight count.
 */
SLUICE_INLINE void sluice__pool_linger(struct sluice_pool *p, int64_t until)
{
    atomic_fetch_add_explicit(&p->lingering, 1u, SLUICE_RELAXED);
    for (uint32_t i = atomic_load_explicit(&p->linger_hint, SLUICE_RELAXED) % p->active;;
         i = (i + 1u) % p->active) {
        int64_t free_slot = SLUICE__LINGER_FREE;
        if (atomic_compare_exchange_strong_explicit(&p->linger_slots[i], &free_slot, until,
                                                    SLUICE_SEQ_CST, SLUICE_RELAXED)) {
            atomic_store_explicit(&p->linger_hint, (i + 1u) % p->active, SLUICE_RELAXED);
            break;
        }
    }
    sluice__pool_linger_lower(p, until);
    atomic_fetch_add_explicit(&p->linger_epoch, 1u, SLUICE_SEQ_CST);
    sluice__pool_count(p, SLUICE__POOL_LINGERED);
    sluice__pool_watch_poke(p);
}

#endif /* SLUICE_POOL_LINGER_H */
