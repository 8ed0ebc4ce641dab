/*
 * sluice/pool_hold.h — Retry-After holds: when the provider asks for a
 * pause, no call starts until it is over. Part of sluice/pool.h, which is
 * what to include.
 *
 * The model (adaptive pools): call_begin honours the provider's
 * Retry-After (sluice_discovery_hold_until): a call granted its permit
 * while the hold lasts waits it out, permit in hand, until the hold ends,
 * its deadline passes (SLUICE_ETIMEDOUT) or its token fires
 * (SLUICE_ECANCELED); either way it releases the permit and the client is
 * never called. Waiting with the permit keeps FIFO order (the hold only
 * delays calls that were next anyway) and bounds the calls waiting out a
 * hold by the limit. sluice_pool_clear() clears the node but keeps a live
 * hold: it is the provider's word about now, and waking the held calls
 * would only send a burst into more 429s. A call waiting out a hold counts
 * as queued, not in flight. A blocking call sleeps it out here; an async
 * one waits on the pool's list of async holders (sluice/pool_call.h).
 *
 * Progress: a hold is slept out on a futex (real CLOCK_MONOTONIC,
 * re-checked against the pool clock on waking); a fired token wakes the
 * sleeper through its cancel hook, a close through the pool's list of
 * sleepers: no polling. Without a hold, an adaptive pool's call pays one
 * relaxed load here; a fixed or unlimited pool's a pointer test.
 *
 * Locking and memory ordering: hold_lock, a spinlock held for a few list
 * operations (no call or syscall under it), guards the list of sleepers,
 * and also the lingering permits' watchers (sluice/pool_linger.h) and the
 * async holders (sluice/pool_call.h). A hold sleeper and a close meet
 * through seq_cst operations on the hold epoch and the sleeper's futex
 * word (announce sleep, then re-check the epoch; bump the epoch, then wake
 * sleepers), so a close never misses a sleeper.
 */
#ifndef SLUICE_POOL_HOLD_H
#define SLUICE_POOL_HOLD_H

#include "pool_state.h"

/* A call waiting out a Retry-After hold: on its own stack, linked into the pool. */
struct sluice__pool_holder {
    struct sluice__pool_holder *next, *prev; /* guarded by the pool's hold_lock */
    _Atomic(uint32_t) state;                 /* SLUICE__HOLDER_*; the futex word */
    struct sluice_cancel_hook hook;
};

enum { SLUICE__HOLDER_AWAKE = 0, SLUICE__HOLDER_ASLEEP = 1 };

/* Move a sleeping holder back to AWAKE; true if it was asleep (then wake it). */
SLUICE_INLINE bool sluice__pool_rouse(struct sluice__pool_holder *h)
{
    uint32_t asleep = SLUICE__HOLDER_ASLEEP;
    return atomic_compare_exchange_strong_explicit(&h->state, &asleep, SLUICE__HOLDER_AWAKE,
                                                   SLUICE_SEQ_CST, SLUICE_SEQ_CST);
}

static inline void sluice__pool_on_cancel(struct sluice_cancel_hook *hook)
{
    struct sluice__pool_holder *h =
        (struct sluice__pool_holder *)(void *)((char *)hook -
                                               offsetof(struct sluice__pool_holder, hook));
    if (sluice__pool_rouse(h))
        sluice_futex_wake(&h->state);
}

/* The real CLOCK_MONOTONIC instant to sleep until: the hold's end, or the deadline if sooner. */
SLUICE_INLINE struct timespec sluice__pool_wake_at(int64_t hold_left_ns,
                                                   const struct timespec *deadline)
{
    struct timespec at = sluice_ns_timespec(sluice_add_ns(sluice_monotonic_ns(), hold_left_ns));
    if (deadline && sluice_timespec_ns(deadline) < sluice_timespec_ns(&at))
        at = *deadline;
    return at;
}

/* Why a call waiting out a hold must stop now: cancel, close, deadline (in that order:
 * cancel wins over close, as in the gate; close over a deadline, as a closed gate's verdict). */
SLUICE_INLINE int sluice__pool_stop_reason(struct sluice_pool *p, const struct timespec *deadline,
                                           struct sluice_cancel *cancel)
{
    int status = sluice_wait_stop_reason(deadline, cancel);
    if (status != SLUICE_ECANCELED && status != SLUICE_EINVAL &&
        atomic_load_explicit(&p->closed, SLUICE_SEQ_CST))
        return SLUICE_ECLOSED;
    return status;
}

/*
 * Sleep until the discovery hold (pool clock) is over, the pool closes,
 * `deadline` passes or `cancel` fires; SLUICE_OK, SLUICE_ECLOSED,
 * SLUICE_ECANCELED or SLUICE_ETIMEDOUT (any of them beats a hold that ends
 * at the same moment: the call has not started). The kernel sleeps on the
 * real clock, so the hold's remaining pool-clock time is slept in real time
 * and re-checked on waking (with a virtual pool clock, that is a real sleep
 * of the virtual remainder). Wake-ups: the timeout, the token's hook, or
 * sluice_pool_close through the pool's list of sleepers. It lives here, not
 * in park.h or cancel.h, because what it waits for is the pool's own state.
 */
SLUICE_INLINE int sluice__pool_sleep_until(struct sluice_pool *p, const struct timespec *deadline,
                                           struct sluice_cancel *cancel)
{
    struct sluice__pool_holder h;
    atomic_init(&h.state, (uint32_t)SLUICE__HOLDER_AWAKE);
    h.prev = NULL;
    sluice_spinlock_lock(&p->hold_lock);
    h.next = p->holders;
    if (p->holders)
        p->holders->prev = &h;
    p->holders = &h;
    sluice_spinlock_unlock(&p->hold_lock);
    atomic_fetch_add_explicit(&p->holding, 1u, SLUICE_RELAXED);
    h.hook.fn = sluice__pool_on_cancel;
    bool hooked = cancel && sluice_cancel_register(cancel, &h.hook);
    int status;
    for (;;) {
        uint32_t epoch = atomic_load_explicit(&p->hold_epoch, SLUICE_SEQ_CST);
        if ((status = sluice__pool_stop_reason(p, deadline, cancel)) != SLUICE_OK)
            break;
        int64_t left = sluice_discovery_hold_until(p->discovery) - sluice_clock_now(&p->clock);
        if (left <= 0)
            break;
        uint32_t awake = SLUICE__HOLDER_AWAKE;
        if (!atomic_compare_exchange_strong_explicit(&h.state, &awake, SLUICE__HOLDER_ASLEEP,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue;
        /* Re-check after announcing sleep: a token that fired, or a close,
         * in between found us awake and woke nobody. */
        if (sluice__pool_stop_reason(p, deadline, cancel) == SLUICE_OK &&
            atomic_load_explicit(&p->hold_epoch, SLUICE_SEQ_CST) == epoch) {
            struct timespec at = sluice__pool_wake_at(left, deadline);
            sluice_futex_wait(&h.state, SLUICE__HOLDER_ASLEEP, &at);
        }
        sluice__pool_rouse(&h);
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &h.hook);
    sluice_spinlock_lock(&p->hold_lock);
    if (h.prev)
        h.prev->next = h.next;
    else
        p->holders = h.next;
    if (h.next)
        h.next->prev = h.prev;
    sluice_spinlock_unlock(&p->hold_lock);
    atomic_fetch_sub_explicit(&p->holding, 1u, SLUICE_RELAXED);
    return status;
}

/* With its permit in hand, wait out a Retry-After hold; on failure give the permit back. */
SLUICE_INLINE int sluice__pool_hold(struct sluice_pool *p, const struct timespec *deadline,
                                    struct sluice_cancel *cancel, struct sluice_call *call)
{
    if (SLUICE_LIKELY(sluice_discovery_hold_until(p->discovery) <= call->start_ns))
        return SLUICE_OK;
    int status = sluice__pool_sleep_until(p, deadline, cancel);
    if (status != SLUICE_OK)
        sluice_gate_release(&p->gate);
    int64_t now = sluice_clock_now(&p->clock);
    call->queued_ns += now - call->start_ns;
    call->start_ns = now;
    return status;
}

/*
 * The instant (pool clock, ns) before which no call starts because the
 * provider sent Retry-After; 0 or a past instant = no hold. Event loops
 * with async calls arm a timer for it and call sluice_pool_poll.
 */
SLUICE_INLINE int64_t sluice_pool_hold_until(const struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_hold_until(p->discovery) : 0;
}

#endif /* SLUICE_POOL_HOLD_H */
