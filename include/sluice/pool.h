/*
 * sluice/pool.h — one backend's capacity pool: bounded, immediate admission
 * of runs plus a FIFO gate of generation permits.
 *
 * What it is: the two controls a backend registration carries.
 *   `active`   most generation (model) calls in flight at once;
 *   `waiting`  how many admitted runs may exist beyond the active ones.
 * A run calls sluice_pool_admit() once, before any expensive preparation,
 * and sluice_pool_leave() once when it is done, whatever happened. Every
 * model call of an admitted run — the first one and every repair — sits
 * between sluice_pool_call_begin() and sluice_pool_call_end(), which take
 * and give back one permit of the gate. Those two functions are the only
 * place permits move, so ceiling discovery hooks into call_end alone.
 *
 *   admit  ->  [prepare]  ->  call_begin .. model call .. call_end  ->  [validate]
 *          ->  (repair: call_begin .. call_end again, no re-admission)  ->  leave
 *
 * A pool with active = 0 is unlimited: admission always succeeds and calls
 * never touch a gate; the pool only counts calls in flight for its stats.
 *
 * Progress: admit is lock-free and never blocks or enters the kernel: a full
 * pool is rejected with one atomic load, an admission is a load and a CAS.
 * leave is wait-free. call_end does not block: it releases the permit (the
 * gate's release: one CAS when nobody queues, else a short spinlock hand-off
 * to the one waiter next in line) and returns.
 * call_begin blocks (FIFO, see sluice/gate.h) until a permit, the deadline
 * or the cancel token. stats reads counters and the gate's snapshot.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same pool, except create and destroy.
 *
 * Memory ordering: the admission count and the in-flight count are
 * counters, not publications: relaxed RMWs, read relaxed by stats (exact when
 * the pool is quiet). Permits inherit the gate's story: a call that gets a
 * permit sees everything the previous holder did before call_end. The
 * in-flight count is decremented before the permit is released, so
 * in_flight_at_start never exceeds the limit the gate enforced.
 *
 * Allocation: one block per pool, at create, through the allocator hook;
 * the gate is embedded and its waiters queue on their own stacks, so the
 * number of waiting runs needs no storage reserved for it.
 */
#ifndef SLUICE_POOL_H
#define SLUICE_POOL_H

#include <stdio.h>
#include <string.h>

#include "gate.h"
#include "policy.h"

#define SLUICE_POOL_ACTIVE_MAX UINT32_C(65536)       /* <= SLUICE_GATE_LIMIT_MAX */
#define SLUICE_POOL_WAITING_MAX (UINT32_C(1) << 20)
#define SLUICE_POOL_WAITING_DEFAULT UINT32_C(1024)

struct sluice_pool_desc {
    uint32_t active;               /* most generation calls in flight (default: 0 = unlimited;
                                      at most SLUICE_POOL_ACTIVE_MAX) */
    struct sluice_opt_u32 waiting; /* admitted runs beyond `active` (default: 1024 when active
                                      is set; SLUICE_SOME(0) = none; only with active;
                                      at most SLUICE_POOL_WAITING_MAX) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
    const struct sluice_clock *clock;         /* times calls (default: CLOCK_MONOTONIC) */
};

/* A snapshot; each field is exact when the pool is quiet. */
struct sluice_pool_counts {
    uint32_t admitted;         /* runs holding an admission (limited pools; 0 when unlimited) */
    uint32_t in_flight;        /* generation calls between call_begin and call_end */
    uint32_t waiting;          /* generation calls queued for a permit */
    uint32_t active;           /* the current active limit (0 = unlimited) */
    uint32_t waiting_capacity; /* the configured waiting capacity */
};

/* One generation call, filled by sluice_pool_call_begin. */
struct sluice_call {
    int64_t start_ns;            /* pool clock when the call got its permit */
    int64_t queued_ns;           /* pool clock time spent waiting for the permit */
    uint32_t in_flight_at_start; /* calls in flight once this one started, itself included */
};

struct sluice_pool {
    /* Admissions and calls are written by different moments of a run. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) admitted;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) in_flight;
    /* Immutable after create, read by every call. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) uint32_t active; /* configured; 0 = unlimited, no gate */
    uint32_t waiting;
    uint32_t admit_max; /* active + waiting */
    struct sluice_clock clock;
    struct sluice_allocator allocator;
    struct sluice_gate gate; /* initialised only when active > 0 */
};

/*
 * Check a pool's two controls. On failure returns SLUICE_EINVAL and writes a
 * message naming the field as `<owner>.<field>` into err (may be NULL).
 * Shared by pool and engine creation so both say the same thing.
 */
SLUICE_INLINE int sluice__pool_check(uint32_t active, struct sluice_opt_u32 waiting,
                                     const char *owner, char *err, size_t err_size)
{
    char msg[256];
    if (waiting.set && active == 0)
        snprintf(msg, sizeof msg,
                 "%s.waiting set without an active limit (set %s.active or drop waiting)", owner,
                 owner);
    else if (active > SLUICE_POOL_ACTIVE_MAX)
        snprintf(msg, sizeof msg, "%s.active = %u is above the maximum %u (SLUICE_POOL_ACTIVE_MAX)",
                 owner, (unsigned)active, (unsigned)SLUICE_POOL_ACTIVE_MAX);
    else if (waiting.set && waiting.value > SLUICE_POOL_WAITING_MAX)
        snprintf(msg, sizeof msg,
                 "%s.waiting = %u is above the maximum %u (SLUICE_POOL_WAITING_MAX)", owner,
                 (unsigned)waiting.value, (unsigned)SLUICE_POOL_WAITING_MAX);
    else
        return SLUICE_OK;
    if (err && err_size) {
        size_t n = strlen(msg) < err_size ? strlen(msg) : err_size - 1;
        memcpy(err, msg, n);
        err[n] = '\0';
    }
    return SLUICE_EINVAL;
}

/* The waiting capacity a valid description resolves to. */
SLUICE_INLINE uint32_t sluice__pool_waiting(uint32_t active, struct sluice_opt_u32 waiting)
{
    return active ? sluice_opt_or(waiting, SLUICE_POOL_WAITING_DEFAULT) : 0;
}

/*
 * Create a pool: its only allocation. Returns SLUICE_EINVAL for an invalid
 * description (see sluice__pool_check) or SLUICE_ENOMEM.
 */
SLUICE_INLINE int sluice_pool_create(const struct sluice_pool_desc *desc, struct sluice_pool **out)
{
    struct sluice_pool_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    *out = NULL;
    int status = sluice__pool_check(d.active, d.waiting, "sluice_pool_desc", NULL, 0);
    if (status != SLUICE_OK)
        return status;
    struct sluice_pool *p =
        (struct sluice_pool *)sluice__alloc(d.allocator, sizeof *p, SLUICE_CACHELINE);
    if (!p)
        return SLUICE_ENOMEM;
    memset((void *)p, 0, sizeof *p);
    atomic_init(&p->admitted, 0u);
    atomic_init(&p->in_flight, 0u);
    p->active = d.active;
    p->waiting = sluice__pool_waiting(d.active, d.waiting);
    p->admit_max = p->active + p->waiting;
    if (d.clock)
        p->clock = *d.clock;
    if (d.allocator)
        p->allocator = *d.allocator;
    if (p->active)
        sluice_gate_init(&p->gate, p->active);
    *out = p;
    return SLUICE_OK;
}

/* Free a pool. No run may be using it. */
SLUICE_INLINE void sluice_pool_destroy(struct sluice_pool *p)
{
    if (!p)
        return;
    struct sluice_allocator a = p->allocator;
    sluice__free(&a, p, sizeof *p);
}

/* Give an admission back: once per successful sluice_pool_admit. */
SLUICE_INLINE void sluice_pool_leave(struct sluice_pool *p)
{
    if (p->active)
        atomic_fetch_sub_explicit(&p->admitted, 1u, SLUICE_RELAXED);
}

/*
 * Reserve one run slot. Returns SLUICE_OK (call sluice_pool_leave later) or
 * SLUICE_ECAPACITY at once when active + waiting runs are already admitted.
 * Never blocks, never enters the kernel, never calls anything.
 */
SLUICE_INLINE int sluice_pool_admit(struct sluice_pool *p)
{
    if (!p->active)
        return SLUICE_OK;
    uint32_t n = atomic_load_explicit(&p->admitted, SLUICE_RELAXED);
    do {
        if (n >= p->admit_max)
            return SLUICE_ECAPACITY;
    } while (!atomic_compare_exchange_weak_explicit(&p->admitted, &n, n + 1, SLUICE_RELAXED,
                                                    SLUICE_RELAXED));
    return SLUICE_OK;
}

/* Why a wait must not start or go on, or SLUICE_OK. Cancel beats the deadline. */
SLUICE_INLINE int sluice__pool_stop_reason(const struct timespec *deadline,
                                           const struct sluice_cancel *cancel)
{
    if (sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (sluice_deadline_passed(deadline))
        return SLUICE_ETIMEDOUT;
    return SLUICE_OK;
}

/* The contended path of call_begin: queue for the permit, timing the wait. */
SLUICE_INLINE int sluice__pool_wait(struct sluice_pool *p, const struct timespec *deadline,
                                    struct sluice_cancel *cancel, struct sluice_call *call)
{
    int64_t arrived = sluice_clock_now(&p->clock);
    int status = sluice_gate_acquire(&p->gate, deadline, cancel);
    /* A grant can land after the token fired or the deadline passed: the
     * call has not started, so the stop wins and the permit moves on. */
    if (status == SLUICE_OK && (status = sluice__pool_stop_reason(deadline, cancel)) != SLUICE_OK)
        sluice_gate_release(&p->gate);
    call->start_ns = sluice_clock_now(&p->clock);
    call->queued_ns = call->start_ns - arrived;
    return status;
}

/*
 * Take a generation permit for one model call of an admitted run, waiting
 * in FIFO order until `deadline` (absolute CLOCK_MONOTONIC; NULL = none) or
 * `cancel` fires (NULL = none). Fills *call. Returns SLUICE_OK (make the
 * call, then sluice_pool_call_end), or SLUICE_ECANCELED / SLUICE_ETIMEDOUT
 * holding no permit — also when the token fired or the deadline passed
 * before the wait, or while the permit was being granted, so a call whose
 * cancel won before it started is never made. Cancel wins over the deadline.
 */
SLUICE_INLINE int sluice_pool_call_begin(struct sluice_pool *p, const struct timespec *deadline,
                                         struct sluice_cancel *cancel, struct sluice_call *call)
{
    int status = sluice__pool_stop_reason(deadline, cancel);
    /* tryacquire never jumps the queue; only a call that must queue pays
     * for timing its wait. */
    if (status == SLUICE_OK && p->active && sluice_gate_tryacquire(&p->gate) != SLUICE_OK) {
        status = sluice__pool_wait(p, deadline, cancel, call);
    } else {
        call->start_ns = sluice_clock_now(&p->clock);
        call->queued_ns = 0;
    }
    call->in_flight_at_start = 0;
    if (status == SLUICE_OK)
        call->in_flight_at_start =
            atomic_fetch_add_explicit(&p->in_flight, 1u, SLUICE_RELAXED) + 1u;
    return status;
}

/*
 * End a call that sluice_pool_call_begin started: give its permit back
 * (waking the next call in line) and return its sample. `outcome` says what
 * the call showed about the provider's capacity; `retry_after_ns` is the
 * provider's Retry-After with SLUICE_OUTCOME_OVERLOAD (0 = none).
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_end(struct sluice_pool *p,
                                                        const struct sluice_call *call,
                                                        enum sluice_outcome outcome,
                                                        int64_t retry_after_ns)
{
    struct sluice_sample sample;
    sample.latency_ns = sluice_clock_now(&p->clock) - call->start_ns;
    sample.in_flight_at_start = call->in_flight_at_start;
    sample.outcome = outcome;
    sample.retry_after_ns = retry_after_ns;
    atomic_fetch_sub_explicit(&p->in_flight, 1u, SLUICE_RELAXED);
    if (p->active)
        sluice_gate_release(&p->gate);
    /* Ceiling discovery feeds on `sample` here, the one place every call ends. */
    return sample;
}

/* The pool's gate, for changing its limit at run time; NULL when unlimited. */
SLUICE_INLINE struct sluice_gate *sluice_pool_gate(struct sluice_pool *p)
{
    return p->active ? &p->gate : NULL;
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
    c.waiting = p->active ? sluice_gate_stats(&p->gate).waiting : 0u;
    c.active = p->active ? sluice_gate_limit(&p->gate) : 0u;
    c.waiting_capacity = p->waiting;
    return c;
}

#endif /* SLUICE_POOL_H */
