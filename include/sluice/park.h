/*
 * sluice/park.h — the futex primitives waiters park on.
 *
 * What it is: wait on / wake one 32-bit word, with an absolute
 * CLOCK_MONOTONIC deadline. The gate gives each waiter its own word, so a
 * wake reaches exactly the thread it is meant for: no herd.
 *
 * Protocol (the caller's job): a waiter announces it will sleep by moving
 * its word to a "sleeping" value with a seq_cst RMW, re-checks its wake
 * condition, and only then calls sluice_futex_wait with that value; a waker
 * publishes the condition, then moves the word away from "sleeping" with a
 * seq_cst RMW and calls sluice_futex_wake only if it saw "sleeping". Either
 * the waiter sees the condition or the waker sees it asleep; both may.
 *
 * Progress: sluice_futex_wait blocks; spurious returns are allowed, so
 * callers loop on their own condition. sluice_futex_wake never blocks.
 * Waking a word whose owner has already returned (and freed it) is harmless
 * for private futexes: the kernel only hashes the address.
 */
#ifndef SLUICE_PARK_H
#define SLUICE_PARK_H

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "time.h"

/* Pause iterations the next waiter in line spins before it parks. */
#ifndef SLUICE_PARK_SPIN
#define SLUICE_PARK_SPIN 256
#endif

/* Sleep while *word == expected, until woken or `deadline` (NULL = none). */
SLUICE_INLINE void sluice_futex_wait(_Atomic(uint32_t) *word, uint32_t expected,
                                     const struct timespec *deadline)
{
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout, so a
     * deadline shared by several waits needs no re-computation. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, deadline,
            NULL, FUTEX_BITSET_MATCH_ANY);
}

/* Wake one thread sleeping on `word`. */
SLUICE_INLINE void sluice_futex_wake(_Atomic(uint32_t) *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}

#endif /* SLUICE_PARK_H */
