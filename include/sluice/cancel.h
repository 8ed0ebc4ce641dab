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
 * releases everything it held, and returns SLUICE_ECANCELED. If a wait is
 * both cancelled and past its deadline, SLUICE_ECANCELED wins. Firing a
 * token never interrupts work that already started (an in-flight model
 * call); it only ends waits.
 *
 * Concurrency: fire, fired, register and unregister may all run
 * concurrently. Hooks run on the thread that calls fire, under the token's
 * lock: they must be short and must not touch the token. After
 * sluice_cancel_unregister() returns, the hook will not run and its memory
 * may be reused. A token must outlive every wait that uses it.
 */
#ifndef SLUICE_CANCEL_H
#define SLUICE_CANCEL_H

#include "cc.h"
#include "status.h"
#include "time.h"

struct sluice_cancel_hook {
    struct sluice_cancel_hook *next, *prev;
    void (*fn)(struct sluice_cancel_hook *hook); /* runs at most once */
};

struct sluice_cancel {
    _Atomic(uint32_t) fired;
    sluice_spinlock lock;
    struct sluice_cancel_hook *hooks; /* guarded by lock */
};

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

/* Fire the token: idempotent; wakes every registered wait exactly once. */
SLUICE_INLINE void sluice_cancel_fire(struct sluice_cancel *c)
{
    if (atomic_exchange_explicit(&c->fired, 1u, SLUICE_SEQ_CST) != 0u)
        return;
    sluice_spinlock_lock(&c->lock);
    struct sluice_cancel_hook *h = c->hooks;
    c->hooks = NULL;
    while (h) {
        struct sluice_cancel_hook *next = h->next;
        h->next = h->prev = NULL;
        h->fn(h);
        h = next;
    }
    sluice_spinlock_unlock(&c->lock);
}

/*
 * Register `hook` to run when the token fires. Returns false (and does not
 * register) when the token has already fired: the caller must act as if
 * cancelled.
 */
SLUICE_INLINE bool sluice_cancel_register(struct sluice_cancel *c, struct sluice_cancel_hook *hook)
{
    sluice_spinlock_lock(&c->lock);
    bool live = atomic_load_explicit(&c->fired, SLUICE_SEQ_CST) == 0u;
    if (live) {
        hook->prev = NULL;
        hook->next = c->hooks;
        if (c->hooks)
            c->hooks->prev = hook;
        c->hooks = hook;
    }
    sluice_spinlock_unlock(&c->lock);
    return live;
}

SLUICE_INLINE void sluice_cancel_unregister(struct sluice_cancel *c, struct sluice_cancel_hook *hook)
{
    sluice_spinlock_lock(&c->lock);
    /* fire() unlinks hooks it has run; a hook absent from the list is done. */
    if (hook->prev)
        hook->prev->next = hook->next;
    else if (c->hooks == hook)
        c->hooks = hook->next;
    if (hook->next)
        hook->next->prev = hook->prev;
    hook->next = hook->prev = NULL;
    sluice_spinlock_unlock(&c->lock);
}

/* Re-arm a token for reuse. Only valid when no wait is using it. */
SLUICE_INLINE void sluice_cancel_reset(struct sluice_cancel *c)
{
    atomic_store_explicit(&c->fired, 0u, SLUICE_SEQ_CST);
}

/*
 * Why a wait must stop now: SLUICE_ECANCELED if `cancel` (may be NULL) has
 * fired, SLUICE_ETIMEDOUT if `deadline` (may be NULL) has passed, else
 * SLUICE_OK. Cancel beats the deadline when both hold.
 */
SLUICE_INLINE int sluice_wait_stop_reason(const struct timespec *deadline,
                                          const struct sluice_cancel *cancel)
{
    if (sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (sluice_deadline_passed(deadline))
        return SLUICE_ETIMEDOUT;
    return SLUICE_OK;
}

#endif /* SLUICE_CANCEL_H */
