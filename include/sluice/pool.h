/*
 * sluice/pool.h — one backend's capacity pool: bounded, immediate admission
 * of runs plus a FIFO gate of generation permits, optionally driven by
 * ceiling discovery. This is the header to include: it brings in the
 * pool's other headers (below) and holds its lifecycle and its views.
 *
 * What it is: the two controls a backend registration carries.
 *   `active`   most generation (model) calls in flight at once;
 *   `waiting`  how many admitted runs may exist beyond the active ones.
 * A run calls sluice_pool_admit() once, before any expensive preparation,
 * and sluice_pool_leave() once when it is done, whatever happened. Every
 * model call of an admitted run — the first one and every repair — sits
 * between sluice_pool_call_begin() and sluice_pool_call_end(), which take
 * and give back one permit of the gate. Those two functions are the only
 * place permits move, so ceiling discovery hooks into them alone.
 *
 *   admit  ->  [prepare]  ->  call_begin .. model call .. call_end  ->  [validate]
 *          ->  (repair: call_begin .. call_end again, no re-admission)  ->  leave
 *
 * A pool with active = 0 is unlimited: admission always succeeds and calls
 * never touch a gate; the pool only counts calls in flight for its stats.
 *
 * Adaptive pools: a pool created with a discovery description
 * (sluice/discovery.h) carries one discovery node whose limit drives the
 * gate. `active` is then the hard maximum (discovery's max_limit defaults
 * to it and may not exceed it); the gate starts at the jumpstart, or at a
 * live lock read back from the store. call_end feeds discovery every
 * call's sample before the permit moves on (sluice/pool_call.h), and
 * call_begin honours the provider's Retry-After (sluice/pool_hold.h).
 * Admission capacity moves with the discovered limit: current limit +
 * waiting, so an explicit `waiting = SLUICE_SOME(0)` means no backlog
 * beyond the limit in force (runs already admitted are never evicted when
 * it falls). Fixed and unlimited pools pay one pointer test for all of
 * this.
 *
 * In flight, everywhere (stats, status lines, events): generation calls
 * started (permit in hand, any hold over) and not yet ended. Calls still
 * waiting out a hold count as queued.
 *
 * Shutdown: sluice_pool_close() makes every later admit return
 * SLUICE_ECLOSED, wakes every queued call (sync and async, and those
 * waiting out a hold) with SLUICE_ECLOSED, and lets calls in flight finish.
 *
 * The pool's headers, lowest first; each includes only those above it, and
 * each opens with its model and its progress, locking and ordering story.
 * They split one concept around one struct: only pool.h is meant to be
 * included, and their sluice__pool_* helpers are private to the pool.
 *   sluice/pool_state.h      descriptions, limits, defaults and their checks; struct sluice_pool
 *   sluice/pool_admit.h      immediate admission: admit, leave, refusals counted per thread
 *   sluice/pool_hold.h       Retry-After holds, waited out permit in hand
 *   sluice/pool_linger.h     lingering permits, their reaper and watcher; LEARNED's trial
 *   sluice/pool_deadlines.h  the deadline rules: predicted wait, standing queue, start rule
 *   sluice/pool_call.h       the blocking and async call paths, and ending a call
 *   sluice/pool.h            create, destroy, clear, close, stats
 *
 * Progress: create allocates once; destroy waits for a store write still
 * on its way; close takes the gate's and the hold lock briefly and runs
 * the woken async calls' callbacks on its thread; stats reads counters and
 * the gate's snapshot.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same pool, except create and destroy. Async callbacks run on the thread
 * that settles them (see sluice_pool_call_begin_async); they may call back
 * into the pool, including clear and poll.
 *
 * Memory ordering: stats reads every counter relaxed, so each field is
 * exact when the pool is quiet; the rest is in the header that owns it.
 *
 * Allocation: one block per pool, at create, through the allocator hook:
 * the pool, for an adaptive pool its discovery node and event ring, and
 * three slots per permit (lingering permits, trial phantoms and shadows). The
 * gate is embedded and its waiters queue on their own stacks, as do calls
 * waiting out a hold, so the number of waiting runs needs no storage
 * reserved for it.
 */
#ifndef SLUICE_POOL_H
#define SLUICE_POOL_H

#include "pool_admit.h"
#include "pool_call.h"
#include "pool_deadlines.h"
#include "pool_hold.h"
#include "pool_linger.h"
#include "pool_state.h"

/* Start the discovery node that lives in the pool's block, after the pool. */
SLUICE_INLINE void sluice__pool_start_discovery(struct sluice_pool *p,
                                                const struct sluice_discovery_desc *desc,
                                                uint32_t events)
{
    struct sluice_discovery_desc dd = *desc;
    dd.gate = &p->gate;
    dd.clock = &p->clock; /* one clock for call start times and discovery's cut times */
    SLUICE__DEFAULT(dd.max_limit, p->active);
    struct sluice_discovery *d = (struct sluice_discovery *)(void *)(p + 1);
    struct sluice_event_slot *slots = (struct sluice_event_slot *)(void *)(d + 1);
    sluice_discovery_init(d, &dd, slots, events); /* checked: cannot fail */
    sluice_discovery_count_in_flight(d, &p->in_flight); /* one "in flight": started calls */
    sluice_discovery_count_lingering(d, &p->lingering);
    p->discovery = d;
}

/* Resolve the deadline rules and set up the lingering, phantom and shadow slots (`slots`:
 * active of each). */
SLUICE_INLINE void sluice__pool_init_deadlines(struct sluice_pool *p,
                                               const struct sluice_deadline_desc *dl, void *slots)
{
    bool limited = p->active != 0;
    struct sluice_deadline_desc r = *dl;
    SLUICE__DEFAULT_OPT(r.start_quantile, SLUICE_POOL_START_QUANTILE_DEFAULT);
    SLUICE__DEFAULT_OPT(r.linger_max_ms, SLUICE_POOL_LINGER_MAX_MS_DEFAULT);
    p->start_percent = limited ? r.start_quantile.value : 0u;
    p->queue_late = dl->queue_late;
    p->linger = dl->linger;
    atomic_init(&p->linger_learned, (uint32_t)SLUICE_LINGER_LEARNED);
    atomic_init(&p->phantoms, 0u);
    atomic_init(&p->shadows, 0u);
    atomic_init(&p->trial_served, 0u);
    atomic_init(&p->sojourn_min, INT64_MAX);
    atomic_init(&p->sojourn_until, INT64_MIN);
    atomic_init(&p->standing_refused, INT64_MIN);
    atomic_init(&p->standing, 0u);
    p->linger_max_ns = limited ? (int64_t)r.linger_max_ms.value * SLUICE_NS_PER_MS : 0;
    /* The estimate also serves the operator's views; its quantile only the start rule. */
    uint32_t percent = p->start_percent ? p->start_percent : SLUICE_POOL_START_QUANTILE_DEFAULT;
    sluice_service_init(&p->service, percent);
    sluice_service_init(&p->first_byte, percent);
    for (int i = 0; i < SLUICE__POOL_COUNTERS; i++)
        atomic_init(&p->counted[i], 0u);
    for (int i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++) {
        atomic_init(&p->refusals[i].owner, (uintptr_t)0);
        atomic_init(&p->refusals[i].refused, 0u);
    }
    sluice_histogram_init(&p->queue_wait);
    sluice_histogram_init(&p->call_time);
    atomic_init(&p->lingering, 0u);
    atomic_init(&p->linger_epoch, 0u);
    atomic_init(&p->linger_next, INT64_MAX);
    sluice_spinlock_init(&p->linger_lock);
    atomic_init(&p->linger_hint, 0u);
    p->watchers = NULL;
    p->linger_slots = (_Atomic(int64_t) *)slots;
    p->phantom_slots = p->linger_slots + p->active;
    p->shadow_slots = p->phantom_slots + p->active;
    for (uint32_t i = 0; i < 3 * p->active; i++)
        atomic_init(&p->linger_slots[i], SLUICE__LINGER_FREE);
}

/*
 * Create a pool: its only allocation. Returns SLUICE_EINVAL for an invalid
 * description (with a message naming the field in desc->error, e.g.
 * "sluice_pool_desc.waiting set without an active limit ...") or
 * SLUICE_ENOMEM. An adaptive pool's discovery restores a live stored lock
 * here, delivering the "restore" event to its callback before this returns.
 */
SLUICE_INLINE int sluice_pool_create(const struct sluice_pool_desc *desc, struct sluice_pool **out)
{
    struct sluice_pool_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    *out = NULL;
    if (d.error && d.error_size)
        d.error[0] = '\0';
    int status = sluice__allocator_valid(d.allocator)
                     ? sluice__pool_check(d.active, d.waiting, "sluice_pool_desc", d.error,
                                          d.error_size)
                     : sluice__fail(d.error, d.error_size,
                                    "sluice_pool_desc.allocator sets only one of alloc and "
                                    "free (set both, or pass NULL for the default)");
    if (status == SLUICE_OK)
        status = sluice__pool_check_deadlines(d.active, &d.deadlines, "sluice_pool_desc", d.error,
                                              d.error_size);
    struct sluice__discovery_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    size_t size = sizeof(struct sluice_pool);
    if (status == SLUICE_OK && d.discovery) {
        status = sluice__pool_check_discovery(d.active, d.discovery, "sluice_pool_desc", d.error,
                                              d.error_size, &cfg);
        size += sizeof(struct sluice_discovery) + SLUICE_EVENT_RING_SIZE(cfg.events);
    }
    if (status != SLUICE_OK)
        return status;
    size_t slots_at = (size + SLUICE_CACHELINE - 1) / SLUICE_CACHELINE * SLUICE_CACHELINE;
    size = slots_at + 3 * (size_t)d.active * sizeof(_Atomic(int64_t));
    struct sluice_pool *p = (struct sluice_pool *)sluice__alloc(d.allocator, size, SLUICE_CACHELINE);
    if (!p)
        return SLUICE_ENOMEM;
    memset((void *)p, 0, sizeof *p);
    atomic_init(&p->admitted, 0u);
    atomic_init(&p->arriving, 0u);
    atomic_init(&p->in_flight, 0u);
    for (int i = 0; i < 4; i++)
        atomic_init(&p->ended[i], 0u);
    atomic_init(&p->holding, 0u);
    atomic_init(&p->n_async_held, 0u);
    atomic_init(&p->hold_epoch, 0u);
    atomic_init(&p->closed, 0u);
    sluice_spinlock_init(&p->hold_lock);
    p->active = d.active;
    p->waiting = sluice__pool_waiting(d.active, d.waiting);
    p->admit_max = p->active + p->waiting;
    p->block_size = size;
    if (d.clock)
        p->clock = *d.clock;
    if (d.allocator)
        p->allocator = *d.allocator;
    if (p->active)
        sluice_gate_init(&p->gate, p->active);
    sluice__pool_init_deadlines(p, &d.deadlines, (char *)p + slots_at);
    if (d.discovery)
        sluice__pool_start_discovery(p, d.discovery, cfg.events);
    *out = p;
    return SLUICE_OK;
}

/* Free a pool (and its discovery node). No run may be using it. */
SLUICE_INLINE void sluice_pool_destroy(struct sluice_pool *p)
{
    if (!p)
        return;
    if (p->discovery)
        sluice_discovery_sync(p->discovery); /* a store write still on its way lands first */
    struct sluice_allocator a = p->allocator;
    sluice__free(&a, p, p->block_size);
}

/* The pool's gate (tests and diagnostics only); NULL when unlimited. */
SLUICE_INLINE struct sluice_gate *sluice__pool_gate(struct sluice_pool *p)
{
    return p->active ? &p->gate : NULL;
}

/* The pool's discovery node; NULL for a fixed or unlimited pool. */
SLUICE_INLINE struct sluice_discovery *sluice_pool_discovery(const struct sluice_pool *p)
{
    return p->discovery;
}

/*
 * Clear an adaptive pool's discovery node (sluice_discovery_clear: drop the
 * persisted lock, back to probing from the jumpstart). A live Retry-After
 * hold stays in force: it is the provider's word about now. Returns
 * SLUICE_OK, also for a fixed or unlimited pool, which it leaves alone.
 * Callable from any thread, including an async callback.
 */
SLUICE_INLINE int sluice_pool_clear(struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_clear(p->discovery) : SLUICE_OK;
}

/*
 * Close the pool: every later admit and call_begin returns SLUICE_ECLOSED;
 * every queued call — blocked, async, or waiting out a hold — is woken with
 * SLUICE_ECLOSED and holds nothing; calls in flight finish and end as
 * usual, and admitted runs still leave. Idempotent. Async callbacks of the
 * woken calls run on this thread.
 */
SLUICE_INLINE void sluice_pool_close(struct sluice_pool *p)
{
    atomic_store_explicit(&p->closed, 1u, SLUICE_SEQ_CST);
    if (!p->active)
        return;
    sluice_gate_close(&p->gate);
    /* Calls waiting out a hold: wake the sleepers (they see `closed`) ... */
    atomic_fetch_add_explicit(&p->hold_epoch, 1u, SLUICE_SEQ_CST);
    sluice_spinlock_lock(&p->hold_lock);
    for (struct sluice__pool_holder *h = p->holders; h; h = h->next)
        if (sluice__pool_rouse(h))
            sluice_futex_wake(&h->state);
    sluice_spinlock_unlock(&p->hold_lock);
    /* ... and settle the async ones here. */
    for (struct sluice_pool_waiter *w = sluice__pool_take_async(p, true); w;) {
        struct sluice_pool_waiter *next = w->sluice__next;
        w->sluice__next = NULL;
        sluice_gate_release(&p->gate);
        sluice_gate_settle_async(&w->sluice__gate, SLUICE_ECLOSED);
        w = next;
    }
}

/* A snapshot of the pool; all zero for NULL (e.g. the pool of an unknown ID). */
SLUICE_INLINE struct sluice_pool_counts sluice_pool_stats(const struct sluice_pool *pool)
{
    struct sluice_pool *p = (struct sluice_pool *)pool;
    struct sluice_pool_counts c;
    memset(&c, 0, sizeof c);
    if (!p)
        return c;
    c.admitted = atomic_load_explicit(&p->admitted, SLUICE_RELAXED);
    c.in_flight = atomic_load_explicit(&p->in_flight, SLUICE_RELAXED);
    c.queued = (p->active ? sluice_gate_stats(&p->gate).waiting : 0u) +
               atomic_load_explicit(&p->holding, SLUICE_RELAXED);
    c.active = p->active ? sluice_gate_limit(&p->gate) : 0u;
    c.active_max = p->active;
    c.waiting_capacity = p->waiting;
    c.closed = atomic_load_explicit(&p->closed, SLUICE_RELAXED) != 0u;
    c.calls_ok = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_OK], SLUICE_RELAXED);
    c.calls_overload = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_OVERLOAD], SLUICE_RELAXED);
    c.calls_ignored = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_IGNORE], SLUICE_RELAXED);
    c.calls_censored = atomic_load_explicit(&p->ended[3], SLUICE_RELAXED);
    c.lingering = atomic_load_explicit(&p->lingering, SLUICE_RELAXED);
    c.linger = p->linger;
    c.linger_now = sluice_pool_linger_now(p);
    c.expected_ns = sluice_service_expected(&p->service);
    c.expected_first_ns = sluice_service_expected(&p->first_byte);
    uint64_t *to[SLUICE__POOL_COUNTERS] = {&c.refused_capacity, &c.refused_early, &c.refused_late,
                                           &c.timeouts,         &c.cancels,       &c.lingered};
    for (int i = 0; i < SLUICE__POOL_COUNTERS; i++)
        *to[i] = atomic_load_explicit(&p->counted[i], SLUICE_RELAXED);
    for (int i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++)
        c.refused_capacity += atomic_load_explicit(&p->refusals[i].refused, SLUICE_RELAXED);
    return c;
}

/*
 * The pool's histograms: queue wait of every call that left the queue
 * (started, refused late, timed out or cancelled while queued) and the
 * duration of every call that ended (start to end, abandoned ones
 * excluded). Zero for NULL or an unlimited pool, which records none.
 */
SLUICE_INLINE void sluice_pool_histograms(const struct sluice_pool *p,
                                          struct sluice_histogram_counts *queue_wait,
                                          struct sluice_histogram_counts *call_time)
{
    if (queue_wait)
        memset(queue_wait, 0, sizeof *queue_wait);
    if (call_time)
        memset(call_time, 0, sizeof *call_time);
    if (!p)
        return;
    if (queue_wait)
        *queue_wait = sluice_histogram_read(&p->queue_wait);
    if (call_time)
        *call_time = sluice_histogram_read(&p->call_time);
}

#endif /* SLUICE_POOL_H */
