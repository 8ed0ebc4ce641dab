/*
 * sluice/cancel.h — cancel tokens.
 *
 * What it is: a token that any number of concurrent waits may observe.
 * sluice_cancel_fire() is idempotent, callable from any thread (including
 * a signal-free helper thread or a callback), and promptly wakes every wait
 * currently using the token: waits register a hook on the token while they
 * sleep, and fire runs each hook once. No polling is involved.
 *
 * Cancellation contract: a wait that observes a fired token stops waiting,
 * releases everything it held, and returns SLUICE_ECANCELED. Cancel wins
 * over every other way a wait can fail: a wait that ends without its
 * resource (deadline passed, gate closed) returns SLUICE_ECANCELED if the
 * token has fired by then. A wait that was granted before it noticed the
 * token returns success (the grant came first); callers that must not start
 * work after a fire re-check with sluice_wait_stop_reason (the pool does).
 * Firing a token never interrupts work that already started (an in-flight
 * model call); it only ends waits. A deadline that is not normalised, or
 * more than a year ahead (a CLOCK_REALTIME reading), is an argument error:
 * SLUICE_EINVAL, before any of the above.
 *
 * Concurrency: fire, fired, register and unregister may all run
 * concurrently. fire detaches the whole hook list under the token's
 * spinlock, then runs the hooks one by one on the firing thread with no lock
 * held, so waiters that fire wakes never queue behind the remaining wake-ups
 * on that lock. A hook may read the token, and register or unregister hooks
 * on other tokens; it must be short, must not block, and must not
 * unregister a hook of the token that is firing (that would wait for
 * itself). sluice_cancel_unregister() of a hook that fire has detached but
 * not yet run waits until fire has run it (a brief spin, then a futex park):
 * after unregister returns, the hook will not run and its memory may be
 * reused. A token must outlive every wait that uses it.
 *
 * Progress: fired is wait-free; register, and unregister of a hook fire has
 * not taken, hold the token's spinlock for a few instructions; fire is
 * blocking only in that it takes the spinlock once; unregister of a detached
 * hook blocks until the firing thread reaches it.
 *
 * Memory ordering: `fired` is seq_cst, so a waiter that announced sleep and
 * then saw the token unfired is certain to be found by fire's hook walk.
 * Each hook's state word hands the hook back from fire to its owner with a
 * release exchange (fire) and an acquire load (unregister).
 */
#ifndef SLUICE_CANCEL_H
#define SLUICE_CANCEL_H

#include "cc.h"
#include "park.h"
#include "status.h"
#include "time.h"

struct sluice_cancel_hook {
    struct sluice_cancel_hook *next, *prev; /* guarded by the token's lock while linked */
    void (*fn)(struct sluice_cancel_hook *hook); /* set by the caller; runs at most once */
    _Atomic(uint32_t) sluice__state; /* SLUICE__HOOK_*; set by register, private */
};

struct sluice_cancel {
    _Atomic(uint32_t) fired;
    sluice_spinlock lock;
    struct sluice_cancel_hook *hooks; /* guarded by lock */
};

/* A hook's life: LINKED on the token's list; DETACHED once fire took it;
 * PARKED when unregister sleeps waiting for fire to reach it; RUN once fire
 * is done with it (fire's last touch). */
enum { SLUICE__HOOK_LINKED = 0, SLUICE__HOOK_DETACHED = 1, SLUICE__HOOK_PARKED = 2,
       SLUICE__HOOK_RUN = 3 };

SLUICE_INLINE void sluice_cancel_init(struct sluice_cancel *c)
{
    atomic_init(&c->fired, 0u);
    sluice_spinlock_init(&c->lock);
    c->hooks = NULL;
}

SLUICE_INLINE bool sluice_cancel_fired(const struct sluice_cancel *c)
{
    return c && atomic_load_explicit(&((struct sluice_cancel *)c)->fired, SLUICE_SEQ_CST) != 0u;
}

/* Fire the token: idempotent; runs every registered hook exactly once, on
 * this thread, after dropping the token's lock. */
SLUICE_INLINE void sluice_cancel_fire(struct sluice_cancel *c)
{
    if (atomic_exchange_explicit(&c->fired, 1u, SLUICE_SEQ_CST) != 0u)
        return;
    sluice_spinlock_lock(&c->lock);
    struct sluice_cancel_hook *h = c->hooks;
    c->hooks = NULL;
    for (struct sluice_cancel_hook *i = h; i; i = i->next)
        atomic_store_explicit(&i->sluice__state, SLUICE__HOOK_DETACHED, SLUICE_RELAXED);
    sluice_spinlock_unlock(&c->lock);
    while (h) {
        /* Until the exchange below, unregister waits, so h stays valid. */
        struct sluice_cancel_hook *next = h->next;
        h->fn(h);
        if (atomic_exchange_explicit(&h->sluice__state, SLUICE__HOOK_RUN, SLUICE_ACQ_REL) ==
            SLUICE__HOOK_PARKED)
            sluice_futex_wake(&h->sluice__state); /* harmless if its owner already left */
        h = next;
    }
}

/*
 * Register `hook` (its fn set) to run when the token fires. Returns false
 * (and does not register) when the token has already fired: the caller must
 * act as if cancelled, and must not unregister.
 */
SLUICE_INLINE bool sluice_cancel_register(struct sluice_cancel *c, struct sluice_cancel_hook *hook)
{
    sluice_spinlock_lock(&c->lock);
    bool live = atomic_load_explicit(&c->fired, SLUICE_SEQ_CST) == 0u;
    if (live) {
        atomic_store_explicit(&hook->sluice__state, SLUICE__HOOK_LINKED, SLUICE_RELAXED);
        hook->prev = NULL;
        hook->next = c->hooks;
        if (c->hooks)
            c->hooks->prev = hook;
        c->hooks = hook;
    }
    sluice_spinlock_unlock(&c->lock);
    return live;
}

/*
 * Undo a successful register. Returns once the hook is off the token and
 * not running: at once if fire has not taken it (it will never run) or has
 * already run it; otherwise after fire has run it. A NULL token (a wait
 * without one) is a no-op.
 */
SLUICE_INLINE void sluice_cancel_unregister(struct sluice_cancel *c, struct sluice_cancel_hook *hook)
{
    /* Waits call this under `if (hooked)`, where hooked = cancel && register(...). GCC's
     * IPA-CP does not carry that relation: for a caller that passes a NULL token it clones
     * this function with c = NULL, and without this test the clone's lock accesses at
     * address 4 draw -Warray-bounds from ck_pr.h in every unit that waits. */
    if (!c)
        return;
    sluice_spinlock_lock(&c->lock);
    bool linked =
        atomic_load_explicit(&hook->sluice__state, SLUICE_RELAXED) == SLUICE__HOOK_LINKED;
    if (linked) {
        if (hook->prev)
            hook->prev->next = hook->next;
        else
            c->hooks = hook->next;
        if (hook->next)
            hook->next->prev = hook->prev;
        hook->next = hook->prev = NULL;
    }
    sluice_spinlock_unlock(&c->lock);
    if (!linked) /* fire has it: wait for its last touch */
        sluice_park_while(&hook->sluice__state, SLUICE__HOOK_DETACHED, SLUICE__HOOK_PARKED);
}

/* Re-arm a token for reuse. Only valid when no wait is using it. */
SLUICE_INLINE void sluice_cancel_reset(struct sluice_cancel *c)
{
    atomic_store_explicit(&c->fired, 0u, SLUICE_SEQ_CST);
}

/*
 * Why a wait must stop now: SLUICE_EINVAL if `deadline` is not normalised,
 * or lies more than a year ahead (SLUICE_DEADLINE_AHEAD_MAX_NS: read from
 * CLOCK_REALTIME, not CLOCK_MONOTONIC; see time.h), SLUICE_ECANCELED if
 * `cancel` (may be NULL) has fired, SLUICE_ETIMEDOUT if `deadline` (may be
 * NULL) has passed, else SLUICE_OK. Cancel beats the deadline when both hold.
 */
SLUICE_INLINE int sluice_wait_stop_reason(const struct timespec *deadline,
                                          const struct sluice_cancel *cancel)
{
    if (SLUICE_UNLIKELY(!sluice_deadline_valid(deadline)))
        return SLUICE_EINVAL;
    int64_t now = deadline ? sluice_monotonic_ns() : 0;
    /* Caught here, where the clock is read anyway: a wall-clock deadline would bound nothing,
     * so the wait it was meant to end would go on until the provider answered. */
    if (deadline && SLUICE_UNLIKELY(sluice_deadline_too_far(deadline, now)))
        return SLUICE_EINVAL;
    if (sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (deadline && now >= sluice_timespec_ns(deadline))
        return SLUICE_ETIMEDOUT;
    return SLUICE_OK;
}

#endif /* SLUICE_CANCEL_H */
