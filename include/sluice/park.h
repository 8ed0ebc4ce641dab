/*
 * sluice/park.h — spin-then-futex parking of one waiter on its own word.
 *
 * What it is: the blocking substrate under the gate. Each waiter owns a
 * 32-bit park word; a waker that needs to wake *that* waiter touches only
 * that word, so a release wakes exactly one thread and there is no herd.
 *
 * Protocol (the Dekker pair that makes lost wake-ups impossible):
 *   waiter: sluice_park_prepare(w)   -> stores SLUICE_PARK_SLEEPING (seq_cst)
 *           re-check its condition   -> if satisfied, sluice_park_cancel(w)
 *           sluice_park_sleep(w, dl) -> futex-waits while the word is SLEEPING
 *   waker:  publish the condition (seq_cst), then sluice_park_wake(w), which
 *           exchanges the word to AWAKE and issues FUTEX_WAKE only if the
 *           waiter had announced it would sleep.
 * Either the waiter sees the condition or the waker sees SLEEPING; both may.
 *
 * Progress: sleep is blocking (the kernel parks the thread); wake is
 * wait-free apart from the syscall it may issue. Spurious returns are
 * allowed; callers loop on their own condition.
 */
#ifndef SLUICE_PARK_H
#define SLUICE_PARK_H

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "time.h"

#define SLUICE_PARK_AWAKE 0u
#define SLUICE_PARK_SLEEPING 1u

/* Iterations a waiter spins before it parks in the kernel. */
#ifndef SLUICE_PARK_SPIN
#define SLUICE_PARK_SPIN 256
#endif

SLUICE_INLINE void sluice_park_prepare(_Atomic(uint32_t) *word)
{
    atomic_store_explicit(word, SLUICE_PARK_SLEEPING, SLUICE_SEQ_CST);
}

SLUICE_INLINE void sluice_park_cancel(_Atomic(uint32_t) *word)
{
    atomic_store_explicit(word, SLUICE_PARK_AWAKE, SLUICE_RELAXED);
}

/*
 * Sleep while *word is SLEEPING, until woken or until the absolute
 * CLOCK_MONOTONIC deadline (NULL = none). Returns false once the deadline
 * has passed, true otherwise (woken, spurious or interrupted).
 */
SLUICE_INLINE bool sluice_park_sleep(_Atomic(uint32_t) *word, const struct timespec *deadline)
{
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout, so a
     * deadline shared by several waits needs no re-computation. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG,
            SLUICE_PARK_SLEEPING, deadline, NULL, FUTEX_BITSET_MATCH_ANY);
    atomic_store_explicit(word, SLUICE_PARK_AWAKE, SLUICE_RELAXED);
    return !sluice_deadline_passed(deadline);
}

SLUICE_INLINE void sluice_park_wake(_Atomic(uint32_t) *word)
{
    if (atomic_exchange_explicit(word, SLUICE_PARK_AWAKE, SLUICE_SEQ_CST) == SLUICE_PARK_SLEEPING)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}

#endif /* SLUICE_PARK_H */
