/*
 * sluice/gate.h — a ticket-based FIFO permit gate (a counting semaphore that
 * serves waiters strictly in arrival order).
 *
 * What it is: `limit` permits. acquire() takes one, waiting in FIFO order if
 * none is free; release() gives one back. The limit can move at run time:
 * raising it wakes the newly eligible waiters at once; lowering it takes
 * effect as holders release (holders are never interrupted).
 *
 * How it works: an arrival takes a ticket with one fetch-add on `tail`. A
 * ticket is granted once it is below the grant frontier (`frontier`), which
 * every release advances by one. The uncontended acquire+release is two
 * atomic RMWs (tail, frontier) and two loads. A waiter that must wait
 * publishes itself in its own slot (ticket mod capacity) and parks on that
 * slot's futex word, so a release wakes exactly the next thread in line:
 * no herd. A release that advances the frontier onto a ticket whose waiter
 * was cancelled skips it (marks the slot free and advances again): a
 * cancelled ticket is credited to the frontier only when the frontier
 * reaches it, never at cancel time, which would let limit+1 holders in.
 *
 * Slot state machine (tag = ticket, so a slot never confuses two laps):
 *   EMPTY(t') --waiter publishes--> WAITING(t)
 *   WAITING(t) --release grants--> GRANTED(t) --waiter consumes--> EMPTY(t)
 *   WAITING(t) --waiter sees frontier > t--> EMPTY(t)            (self-serve)
 *   WAITING(t) --cancel/timeout/close--> CANCELLED(t) --frontier skips--> EMPTY(t)
 * Every transition out of WAITING is a CAS, so a cancel that races a grant
 * has exactly one winner: if the grant won, the waiter owns a permit and
 * passes it on with release() before returning its error.
 *
 * Progress: tryacquire, release, set_limit, stats and cancel_async are
 * lock-free (set_limit serialises only against other set_limit calls).
 * acquire blocks: it spins SLUICE_PARK_SPIN times, then parks in the kernel.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same gate, except init/create/destroy. At most `capacity` waiters should
 * be queued at once; a waiter beyond that yields until its slot frees and
 * honours its deadline only once it holds a slot. Pools size their gates so
 * this never happens.
 *
 * Memory ordering: tail, frontier and slot states use seq_cst, because
 * lost-wake-up freedom rests on two store/load (Dekker) pairs: an arrival
 * (RMW tail, load frontier) against a release (RMW frontier, load tail), and
 * a publishing waiter (store slot, load frontier) against a release (RMW
 * frontier, load slot). In each pair at least one side sees the other. A
 * grant happens-before the acquire that returns it, so a holder sees
 * everything the previous holder wrote before release().
 *
 * Async waiters (event loops): sluice_gate_acquire_async() queues a waiter
 * record whose callback runs exactly once, with SLUICE_OK (granted),
 * SLUICE_ECANCELED (sluice_gate_cancel_async) or SLUICE_ECLOSED
 * (sluice_gate_close). It runs inline on the calling thread when the
 * outcome is known at once (permit free, gate closed), otherwise on the
 * thread that releases the permit, cancels, or closes. It must not block.
 */
#ifndef SLUICE_GATE_H
#define SLUICE_GATE_H

#include "cancel.h"
#include "park.h"
#include "status.h"
#include "time.h"

#define SLUICE_GATE_LIMIT_MAX (UINT32_C(1) << 30)
#define SLUICE_GATE_CAPACITY_MAX (UINT32_C(1) << 24)

struct sluice_gate_waiter;
typedef void (*sluice_gate_cb)(struct sluice_gate_waiter *waiter, int status);

/* An async waiter: set `cb` (and `data`), keep it alive until cb has run. */
struct sluice_gate_waiter {
    sluice_gate_cb cb;
    void *data;
    uint64_t sluice__ticket;
};

struct sluice_gate_slot {
    _Atomic(uint64_t) state; /* ticket << 2 | SLUICE__SLOT_* */
    _Atomic(uint32_t) park;  /* the waiter's futex word (sluice/park.h) */
    _Atomic(struct sluice_gate_waiter *) async;
} SLUICE_ALIGNED(SLUICE_CACHELINE);

struct sluice_gate_counts {
    uint32_t limit;
    uint32_t in_flight; /* permits held (exact when the gate is quiet) */
    uint32_t waiting;   /* waiters queued for a permit */
};

struct sluice_gate {
    /* Arrivals write `tail`; releases write `frontier`: separate lines. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) tail;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) frontier;
    SLUICE_ALIGNED(SLUICE_CACHELINE) struct sluice_gate_slot *slots;
    uint64_t mask;
    _Atomic(uint32_t) limit;
    _Atomic(uint32_t) closed;
    _Atomic(int64_t) n_waiting;        /* published, unresolved waiters */
    _Atomic(int64_t) n_cancel_pending; /* cancelled tickets the frontier has not skipped */
    sluice_spinlock limit_lock;
    struct sluice_allocator allocator;
    bool owns_memory;
};

struct sluice_gate_desc {
    uint32_t limit;    /* permits (default: 1; at most SLUICE_GATE_LIMIT_MAX) */
    uint32_t capacity; /* most waiters queued at once, rounded up to a power of two
                          (default: 1024) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
};

enum { SLUICE__SLOT_EMPTY = 0, SLUICE__SLOT_WAITING = 1, SLUICE__SLOT_GRANTED = 2,
       SLUICE__SLOT_CANCELLED = 3 };

SLUICE_INLINE uint64_t sluice__slot_word(uint64_t ticket, unsigned state)
{
    return ticket << 2 | state;
}

/* Bytes of slot storage sluice_gate_init needs for `capacity` (a power of two). */
#define SLUICE_GATE_SLOTS_SIZE(capacity) ((size_t)(capacity) * sizeof(struct sluice_gate_slot))

/*
 * Initialise a gate over caller-provided, cache-line-aligned slot storage.
 * `capacity` must be a power of two. Returns SLUICE_EINVAL otherwise.
 */
SLUICE_INLINE int sluice_gate_init(struct sluice_gate *g, struct sluice_gate_slot *slots,
                                   uint32_t capacity, uint32_t limit)
{
    if (!g || !slots || !sluice_is_pow2(capacity) || capacity > SLUICE_GATE_CAPACITY_MAX ||
        limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    atomic_init(&g->tail, 0);
    atomic_init(&g->frontier, limit);
    g->slots = slots;
    g->mask = capacity - 1;
    atomic_init(&g->limit, limit);
    atomic_init(&g->closed, 0u);
    atomic_init(&g->n_waiting, 0);
    atomic_init(&g->n_cancel_pending, 0);
    sluice_spinlock_init(&g->limit_lock);
    g->allocator.alloc = NULL;
    g->allocator.free = NULL;
    g->allocator.ctx = NULL;
    g->owns_memory = false;
    for (uint32_t i = 0; i < capacity; i++) {
        atomic_init(&slots[i].state, sluice__slot_word(i, SLUICE__SLOT_EMPTY));
        atomic_init(&slots[i].park, SLUICE_PARK_AWAKE);
        atomic_init(&slots[i].async, (struct sluice_gate_waiter *)NULL);
    }
    return SLUICE_OK;
}

/* Allocate and initialise a gate (the only allocation the gate ever makes). */
SLUICE_INLINE int sluice_gate_create(const struct sluice_gate_desc *desc, struct sluice_gate **out)
{
    uint32_t limit = desc && desc->limit ? desc->limit : 1;
    uint64_t cap = sluice_next_pow2(desc && desc->capacity ? desc->capacity : 1024);
    const struct sluice_allocator *a = desc ? desc->allocator : NULL;
    *out = NULL;
    if (limit > SLUICE_GATE_LIMIT_MAX || cap > SLUICE_GATE_CAPACITY_MAX)
        return SLUICE_EINVAL;
    struct sluice_gate *g = (struct sluice_gate *)sluice__alloc(a, sizeof *g, SLUICE_CACHELINE);
    struct sluice_gate_slot *slots =
        (struct sluice_gate_slot *)sluice__alloc(a, SLUICE_GATE_SLOTS_SIZE(cap), SLUICE_CACHELINE);
    if (!g || !slots) {
        sluice__free(a, g, sizeof *g);
        sluice__free(a, slots, SLUICE_GATE_SLOTS_SIZE(cap));
        return SLUICE_ENOMEM;
    }
    sluice_gate_init(g, slots, (uint32_t)cap, limit);
    if (a)
        g->allocator = *a;
    g->owns_memory = true;
    *out = g;
    return SLUICE_OK;
}

/* Free a gate made by sluice_gate_create. No thread may be using it. */
SLUICE_INLINE void sluice_gate_destroy(struct sluice_gate *g)
{
    if (!g || !g->owns_memory)
        return;
    struct sluice_allocator a = g->allocator;
    sluice__free(&a, g->slots, SLUICE_GATE_SLOTS_SIZE(g->mask + 1));
    sluice__free(&a, g, sizeof *g);
}

SLUICE_INLINE struct sluice_gate_slot *sluice__gate_slot(struct sluice_gate *g, uint64_t ticket)
{
    return &g->slots[ticket & g->mask];
}

/*
 * Hand the permit that just made ticket `f` eligible to f's waiter. If f's
 * waiter was cancelled, skip it: the permit moves on to the next ticket.
 * If f's holder has not published a wait, it will see the frontier itself.
 */
SLUICE_INLINE void sluice__gate_grant(struct sluice_gate *g, uint64_t f)
{
    for (;;) {
        if (f >= atomic_load_explicit(&g->tail, SLUICE_SEQ_CST))
            return;
        struct sluice_gate_slot *slot = sluice__gate_slot(g, f);
        uint64_t s = atomic_load_explicit(&slot->state, SLUICE_SEQ_CST);
        if (s == sluice__slot_word(f, SLUICE__SLOT_WAITING)) {
            struct sluice_gate_waiter *async = atomic_load_explicit(&slot->async, SLUICE_ACQUIRE);
            if (!atomic_compare_exchange_strong_explicit(
                    &slot->state, &s, sluice__slot_word(f, SLUICE__SLOT_GRANTED), SLUICE_SEQ_CST,
                    SLUICE_SEQ_CST))
                continue;
            if (async) {
                /* Async waiters never consume their grant; do it for them. */
                atomic_store_explicit(&slot->state, sluice__slot_word(f, SLUICE__SLOT_EMPTY),
                                      SLUICE_RELEASE);
                atomic_fetch_sub_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
                async->cb(async, SLUICE_OK);
            } else {
                sluice_park_wake(&slot->park);
            }
            return;
        }
        if (s == sluice__slot_word(f, SLUICE__SLOT_CANCELLED)) {
            if (!atomic_compare_exchange_strong_explicit(
                    &slot->state, &s, sluice__slot_word(f, SLUICE__SLOT_EMPTY), SLUICE_SEQ_CST,
                    SLUICE_SEQ_CST))
                continue;
            atomic_fetch_sub_explicit(&g->n_cancel_pending, 1, SLUICE_RELAXED);
            f = atomic_fetch_add_explicit(&g->frontier, 1, SLUICE_SEQ_CST);
            continue;
        }
        return; /* not yet published, or already resolved */
    }
}

/* Give a permit back. Wakes at most the one waiter next in line. */
SLUICE_INLINE void sluice_gate_release(struct sluice_gate *g)
{
    sluice__gate_grant(g, atomic_fetch_add_explicit(&g->frontier, 1, SLUICE_SEQ_CST));
}

SLUICE_INLINE bool sluice__gate_eligible(struct sluice_gate *g, uint64_t ticket)
{
    return ticket < atomic_load_explicit(&g->frontier, SLUICE_SEQ_CST);
}

/* Wait until `ticket`'s slot is free for this lap, then publish WAITING. */
SLUICE_INLINE struct sluice_gate_slot *sluice__gate_publish(struct sluice_gate *g, uint64_t ticket,
                                                           struct sluice_gate_waiter *async)
{
    struct sluice_gate_slot *slot = sluice__gate_slot(g, ticket);
    atomic_fetch_add_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
    for (unsigned spins = 0;; spins++) {
        uint64_t s = atomic_load_explicit(&slot->state, SLUICE_SEQ_CST);
        if ((s & 3u) == SLUICE__SLOT_EMPTY && (s >> 2) <= ticket) {
            atomic_store_explicit(&slot->async, async, SLUICE_RELAXED);
            if (atomic_compare_exchange_strong_explicit(
                    &slot->state, &s, sluice__slot_word(ticket, SLUICE__SLOT_WAITING),
                    SLUICE_SEQ_CST, SLUICE_SEQ_CST))
                return slot;
            continue;
        }
        /* An earlier lap still owns the slot: more waiters than capacity. */
        if (spins < SLUICE_PARK_SPIN)
            sluice_cpu_relax();
        else
            sched_yield();
    }
}

/*
 * Try to leave the line with WAITING(t) -> CANCELLED(t). Returns true if the
 * waiter left; false if a grant won the race (the slot is GRANTED(t)).
 */
SLUICE_INLINE bool sluice__gate_withdraw(struct sluice_gate *g, struct sluice_gate_slot *slot,
                                         uint64_t ticket)
{
    uint64_t waiting = sluice__slot_word(ticket, SLUICE__SLOT_WAITING);
    /* Count the pending skip before it becomes visible, so stats never go negative. */
    atomic_fetch_add_explicit(&g->n_cancel_pending, 1, SLUICE_RELAXED);
    if (atomic_compare_exchange_strong_explicit(&slot->state, &waiting,
                                                sluice__slot_word(ticket, SLUICE__SLOT_CANCELLED),
                                                SLUICE_SEQ_CST, SLUICE_SEQ_CST)) {
        atomic_fetch_sub_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
        return true;
    }
    atomic_fetch_sub_explicit(&g->n_cancel_pending, 1, SLUICE_RELAXED);
    return false;
}

/*
 * Resolve a published wait once the frontier has passed `ticket` or a grant
 * arrived: WAITING(t) -> EMPTY(t) (self-serve) or GRANTED(t) -> EMPTY(t).
 * Returns false if the slot is still WAITING with no grant (keep waiting).
 */
SLUICE_INLINE bool sluice__gate_try_take(struct sluice_gate *g, struct sluice_gate_slot *slot,
                                         uint64_t ticket)
{
    uint64_t granted = sluice__slot_word(ticket, SLUICE__SLOT_GRANTED);
    uint64_t empty = sluice__slot_word(ticket, SLUICE__SLOT_EMPTY);
    uint64_t s = atomic_load_explicit(&slot->state, SLUICE_SEQ_CST);
    if (s != granted) {
        if (!sluice__gate_eligible(g, ticket))
            return false;
        /* Eligible but not granted: the releaser may have looked before we
         * published. Take the permit ourselves unless its grant lands first. */
        uint64_t waiting = sluice__slot_word(ticket, SLUICE__SLOT_WAITING);
        if (atomic_compare_exchange_strong_explicit(&slot->state, &waiting, empty, SLUICE_SEQ_CST,
                                                    SLUICE_SEQ_CST)) {
            atomic_fetch_sub_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
            return true;
        }
    }
    atomic_store_explicit(&slot->state, empty, SLUICE_RELEASE);
    atomic_fetch_sub_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
    return true;
}

struct sluice__gate_cancel_hook {
    struct sluice_cancel_hook hook;
    struct sluice_gate_slot *slot;
};

static inline void sluice__gate_on_cancel(struct sluice_cancel_hook *hook)
{
    sluice_park_wake(&((struct sluice__gate_cancel_hook *)hook)->slot->park);
}

/* The reason a wait must stop now, or SLUICE_OK. Cancel beats the deadline. */
SLUICE_INLINE int sluice__gate_stop_reason(struct sluice_gate *g, const struct timespec *deadline,
                                           const struct sluice_cancel *cancel)
{
    if (sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (atomic_load_explicit(&g->closed, SLUICE_SEQ_CST))
        return SLUICE_ECLOSED;
    if (sluice_deadline_passed(deadline))
        return SLUICE_ETIMEDOUT;
    return SLUICE_OK;
}

SLUICE_INLINE int sluice__gate_wait(struct sluice_gate *g, uint64_t ticket,
                                    const struct timespec *deadline, struct sluice_cancel *cancel)
{
    struct sluice_gate_slot *slot = sluice__gate_publish(g, ticket, NULL);
    for (int i = 0; i < SLUICE_PARK_SPIN; i++) {
        if (sluice__gate_try_take(g, slot, ticket))
            return SLUICE_OK;
        sluice_cpu_relax();
    }
    struct sluice__gate_cancel_hook hook;
    hook.hook.fn = sluice__gate_on_cancel;
    hook.slot = slot;
    bool hooked = cancel && sluice_cancel_register(cancel, &hook.hook);
    int status;
    for (;;) {
        if (sluice__gate_try_take(g, slot, ticket)) {
            status = SLUICE_OK;
            break;
        }
        status = sluice__gate_stop_reason(g, deadline, cancel);
        if (status != SLUICE_OK) {
            if (!sluice__gate_withdraw(g, slot, ticket)) {
                /* A grant won the race: we hold a permit we will not use. */
                sluice__gate_try_take(g, slot, ticket);
                sluice_gate_release(g);
            }
            break;
        }
        sluice_park_prepare(&slot->park);
        if (atomic_load_explicit(&slot->state, SLUICE_SEQ_CST) ==
                sluice__slot_word(ticket, SLUICE__SLOT_WAITING) &&
            !sluice__gate_eligible(g, ticket) &&
            sluice__gate_stop_reason(g, deadline, cancel) == SLUICE_OK)
            sluice_park_sleep(&slot->park, deadline);
        else
            sluice_park_cancel(&slot->park);
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &hook.hook);
    return status;
}

/*
 * Take a permit, waiting in FIFO order until `deadline` (absolute
 * CLOCK_MONOTONIC; NULL = none) or until `cancel` fires (NULL = none).
 * Returns SLUICE_OK (caller holds a permit and must release it),
 * SLUICE_ECANCELED, SLUICE_ETIMEDOUT or SLUICE_ECLOSED (caller holds nothing).
 */
SLUICE_INLINE int sluice_gate_acquire(struct sluice_gate *g, const struct timespec *deadline,
                                      struct sluice_cancel *cancel)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    uint64_t ticket = atomic_fetch_add_explicit(&g->tail, 1, SLUICE_SEQ_CST);
    if (SLUICE_LIKELY(sluice__gate_eligible(g, ticket)))
        return SLUICE_OK;
    return sluice__gate_wait(g, ticket, deadline, cancel);
}

/*
 * Take a permit only if one is free and nobody is waiting: never jumps the
 * queue. Returns SLUICE_OK, SLUICE_EAGAIN or SLUICE_ECLOSED.
 */
SLUICE_INLINE int sluice_gate_tryacquire(struct sluice_gate *g)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    uint64_t t = atomic_load_explicit(&g->tail, SLUICE_SEQ_CST);
    while (t < atomic_load_explicit(&g->frontier, SLUICE_SEQ_CST)) {
        if (atomic_compare_exchange_weak_explicit(&g->tail, &t, t + 1, SLUICE_SEQ_CST,
                                                  SLUICE_SEQ_CST))
            return SLUICE_OK;
    }
    return SLUICE_EAGAIN;
}

/*
 * Queue `w` for a permit; w->cb runs exactly once (see the header comment
 * for its thread). `w` must stay valid until then.
 */
SLUICE_INLINE void sluice_gate_acquire_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    if (atomic_load_explicit(&g->closed, SLUICE_SEQ_CST)) {
        w->cb(w, SLUICE_ECLOSED);
        return;
    }
    uint64_t ticket = atomic_fetch_add_explicit(&g->tail, 1, SLUICE_SEQ_CST);
    w->sluice__ticket = ticket;
    if (sluice__gate_eligible(g, ticket)) {
        w->cb(w, SLUICE_OK);
        return;
    }
    struct sluice_gate_slot *slot = sluice__gate_publish(g, ticket, w);
    /* Published: from here a release may run cb, so `w` is not ours to touch
     * unless we win the slot back ourselves. */
    uint64_t waiting = sluice__slot_word(ticket, SLUICE__SLOT_WAITING);
    if (sluice__gate_eligible(g, ticket) &&
        atomic_compare_exchange_strong_explicit(&slot->state, &waiting,
                                                sluice__slot_word(ticket, SLUICE__SLOT_EMPTY),
                                                SLUICE_SEQ_CST, SLUICE_SEQ_CST)) {
        atomic_fetch_sub_explicit(&g->n_waiting, 1, SLUICE_RELAXED);
        w->cb(w, SLUICE_OK);
        return;
    }
    if (atomic_load_explicit(&g->closed, SLUICE_SEQ_CST))
        /* Close may have swept the slots before we published. */
        if (sluice__gate_withdraw(g, slot, ticket))
            w->cb(w, SLUICE_ECLOSED);
}

/*
 * Withdraw an async waiter. If it was still queued, its callback runs now
 * with SLUICE_ECANCELED and this returns SLUICE_OK. If the callback already
 * ran or is running (granted or closed), returns SLUICE_EAGAIN.
 * Call only after sluice_gate_acquire_async has returned.
 */
SLUICE_INLINE int sluice_gate_cancel_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    uint64_t ticket = w->sluice__ticket;
    struct sluice_gate_slot *slot = sluice__gate_slot(g, ticket);
    if (atomic_load_explicit(&slot->state, SLUICE_SEQ_CST) !=
            sluice__slot_word(ticket, SLUICE__SLOT_WAITING) ||
        !sluice__gate_withdraw(g, slot, ticket))
        return SLUICE_EAGAIN;
    w->cb(w, SLUICE_ECANCELED);
    return SLUICE_OK;
}

/*
 * Change the limit. Raising it grants the newly eligible waiters now;
 * lowering it lets current holders finish and grants nobody new until the
 * number of holders is below the new limit. Returns SLUICE_EINVAL if
 * `limit` exceeds SLUICE_GATE_LIMIT_MAX.
 */
SLUICE_INLINE int sluice_gate_set_limit(struct sluice_gate *g, uint32_t limit)
{
    if (limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    sluice_spinlock_lock(&g->limit_lock);
    uint32_t old = atomic_load_explicit(&g->limit, SLUICE_RELAXED);
    atomic_store_explicit(&g->limit, limit, SLUICE_RELAXED);
    if (limit > old) {
        uint64_t first =
            atomic_fetch_add_explicit(&g->frontier, (uint64_t)(limit - old), SLUICE_SEQ_CST);
        for (uint64_t f = first; f < first + (limit - old); f++)
            sluice__gate_grant(g, f);
    } else if (limit < old) {
        /* Tickets between the new and old frontier that already hold a
         * permit stay holders; when releases walk the frontier back over
         * them, the grant finds nothing to wake, which is the repayment. */
        atomic_fetch_sub_explicit(&g->frontier, (uint64_t)(old - limit), SLUICE_SEQ_CST);
    }
    sluice_spinlock_unlock(&g->limit_lock);
    return SLUICE_OK;
}

SLUICE_INLINE uint32_t sluice_gate_limit(const struct sluice_gate *g)
{
    return atomic_load_explicit(&((struct sluice_gate *)g)->limit, SLUICE_RELAXED);
}

/* A snapshot of limit, holders and waiters; exact when the gate is quiet. */
SLUICE_INLINE struct sluice_gate_counts sluice_gate_stats(const struct sluice_gate *gate)
{
    struct sluice_gate *g = (struct sluice_gate *)gate;
    int64_t waiting = atomic_load_explicit(&g->n_waiting, SLUICE_ACQUIRE);
    int64_t cancelled = atomic_load_explicit(&g->n_cancel_pending, SLUICE_ACQUIRE);
    uint64_t frontier = atomic_load_explicit(&g->frontier, SLUICE_ACQUIRE);
    uint64_t tail = atomic_load_explicit(&g->tail, SLUICE_ACQUIRE);
    uint32_t limit = atomic_load_explicit(&g->limit, SLUICE_RELAXED);
    /* Permits = limit; free ones are tickets not yet issued below the frontier. */
    int64_t in_flight = (int64_t)(tail - frontier) + (int64_t)limit - waiting - cancelled;
    struct sluice_gate_counts st;
    st.limit = limit;
    st.in_flight = in_flight < 0 ? 0 : (uint32_t)in_flight;
    st.waiting = waiting < 0 ? 0 : (uint32_t)waiting;
    return st;
}

/*
 * Close the gate: every queued waiter gets SLUICE_ECLOSED, and so does
 * every later acquire. Holders may still release. Idempotent.
 */
SLUICE_INLINE void sluice_gate_close(struct sluice_gate *g)
{
    if (atomic_exchange_explicit(&g->closed, 1u, SLUICE_SEQ_CST))
        return;
    for (uint64_t i = 0; i <= g->mask; i++) {
        struct sluice_gate_slot *slot = &g->slots[i];
        uint64_t s = atomic_load_explicit(&slot->state, SLUICE_SEQ_CST);
        if ((s & 3u) != SLUICE__SLOT_WAITING)
            continue;
        struct sluice_gate_waiter *async = atomic_load_explicit(&slot->async, SLUICE_ACQUIRE);
        if (!async)
            sluice_park_wake(&slot->park);
        else if (sluice__gate_withdraw(g, slot, s >> 2))
            async->cb(async, SLUICE_ECLOSED);
    }
}

#endif /* SLUICE_GATE_H */
