/*
 * sluice/pool_admit.h — immediate admission: a run reserves its slot
 * before any expensive preparation and gives it back when it is done. Part
 * of sluice/pool.h, which is what to include.
 *
 * The model: a pool admits at most active + waiting runs (an adaptive
 * pool: its current limit + waiting). sluice_pool_admit either reserves a
 * slot or returns SLUICE_ECAPACITY at once; it never waits and never calls
 * the client. A run with deadlines is admitted through sluice_pool_admit_by
 * (sluice/pool_deadlines.h), which may also refuse it with SLUICE_ELATE.
 *
 * Progress: admit is lock-free and never blocks or enters the kernel: a full
 * pool is rejected with one atomic load and counted in this thread's own
 * shard (a load and a store: no shared RMW); an admission is a load and a CAS.
 * leave is wait-free.
 *
 * Memory ordering: the admission count is a counter, not a publication:
 * relaxed RMWs, read relaxed by stats (exact when the pool is quiet).
 */
#ifndef SLUICE_POOL_ADMIT_H
#define SLUICE_POOL_ADMIT_H

#include "pool_state.h"

#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer)
#define SLUICE__POOL_THREAD_POINTER 1
#endif
#endif

/* This thread's identity for the refusal shards: nonzero, unique among live threads. */
SLUICE_INLINE uintptr_t sluice__pool_thread(void)
{
#ifdef SLUICE__POOL_THREAD_POINTER
    return (uintptr_t)__builtin_thread_pointer(); /* one register read */
#else
    static SLUICE_THREAD_LOCAL char me;
    return (uintptr_t)&me;
#endif
}

/* Count one SLUICE_ECAPACITY (see struct sluice__pool_shard). */
SLUICE_INLINE void sluice__pool_count_refusal(struct sluice_pool *p)
{
    uintptr_t me = sluice__pool_thread();
    /* Thread pointers sit whole stacks apart: take the top bits of a Fibonacci hash. */
    uint32_t first = (uint32_t)(((uint64_t)me * UINT64_C(0x9e3779b97f4a7c15)) >> 56);
    for (uint32_t i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++) {
        struct sluice__pool_shard *s =
            &p->refusals[(first + i) % SLUICE__POOL_REFUSAL_SHARDS];
        uintptr_t owner = atomic_load_explicit(&s->owner, SLUICE_RELAXED);
        if (owner == me || (owner == 0 && atomic_compare_exchange_strong_explicit(
                                              &s->owner, &owner, me, SLUICE_RELAXED,
                                              SLUICE_RELAXED))) {
            atomic_store_explicit(&s->refused,
                                  atomic_load_explicit(&s->refused, SLUICE_RELAXED) + 1u,
                                  SLUICE_RELAXED);
            return;
        }
    }
    sluice__pool_count(p, SLUICE__POOL_CAPACITY);
}

/* Give an admission back: once per successful sluice_pool_admit. */
SLUICE_INLINE void sluice_pool_leave(struct sluice_pool *p)
{
    if (p->active)
        atomic_fetch_sub_explicit(&p->admitted, 1u, SLUICE_RELAXED);
}

/*
 * Reserve one run slot. Returns SLUICE_OK (call sluice_pool_leave later),
 * SLUICE_ECAPACITY at once when active + waiting runs are already admitted
 * (for an adaptive pool: the current limit + waiting), or SLUICE_ECLOSED
 * once the pool is closed. Never blocks, never enters the kernel, never
 * calls anything.
 */
SLUICE_INLINE int sluice_pool_admit(struct sluice_pool *p)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&p->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    if (!p->active)
        return SLUICE_OK;
    uint32_t cap = SLUICE_UNLIKELY(p->discovery != NULL)
                       ? sluice_gate_limit(&p->gate) + p->waiting
                       : p->admit_max;
    uint32_t n = atomic_load_explicit(&p->admitted, SLUICE_RELAXED);
    do {
        if (n >= cap) {
            sluice__pool_count_refusal(p);
            return SLUICE_ECAPACITY;
        }
    } while (!atomic_compare_exchange_weak_explicit(&p->admitted, &n, n + 1, SLUICE_RELAXED,
                                                    SLUICE_RELAXED));
    return SLUICE_OK;
}

#endif /* SLUICE_POOL_ADMIT_H */
