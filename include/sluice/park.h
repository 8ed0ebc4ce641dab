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
 * callers loop on their own condition, and it says why it returned: a
 * caller must not loop on SLUICE_EINVAL (the kernel refused the wait, so
 * retrying would spin). sluice_futex_wake never blocks.
 * Waking a word whose owner has already returned (and freed it) is harmless
 * for private futexes: the kernel only hashes the address.
 */
#ifndef SLUICE_PARK_H
#define SLUICE_PARK_H

#include "time.h" /* first: cc.h checks the feature macros before system headers */
#include "status.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Pause iterations the next waiter in line spins before it parks. */
#ifndef SLUICE_PARK_SPIN
#define SLUICE_PARK_SPIN 256
#endif

/*
 * Sleep while *word == expected, until woken or `deadline` (NULL = none).
 * Returns SLUICE_OK (woken, interrupted, or *word no longer matched: re-check
 * and maybe wait again), SLUICE_ETIMEDOUT (the deadline passed), or
 * SLUICE_EINVAL (a deadline that is not normalised, or any other refusal:
 * waiting again would fail the same way at once).
 */
SLUICE_INLINE int sluice_futex_wait(_Atomic(uint32_t) *word, uint32_t expected,
                                    const struct timespec *deadline)
{
    if (!sluice_deadline_valid(deadline))
        return SLUICE_EINVAL;
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout, so a
     * deadline shared by several waits needs no re-computation. */
    if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected,
                deadline, NULL, FUTEX_BITSET_MATCH_ANY) == 0)
        return SLUICE_OK;
    switch (errno) {
    case EAGAIN: /* *word != expected */
    case EINTR:
        return SLUICE_OK;
    case ETIMEDOUT:
        return SLUICE_ETIMEDOUT;
    default:
        return SLUICE_EINVAL;
    }
}

/* Wake one thread sleeping on `word`. */
SLUICE_INLINE void sluice_futex_wake(_Atomic(uint32_t) *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}

/*
 * Wait for a one-way hand-off: return once *word holds a value other than
 * `pending` and `asleep` (the value it returns, read with acquire). Spins
 * SLUICE_PARK_SPIN pauses, then announces sleep by moving the word
 * pending -> asleep and parks. The other side stores its final value with a
 * seq_cst exchange and calls sluice_futex_wake if the exchange returned
 * `asleep`. A third party may move the word asleep -> pending to make the
 * waiter look again; it simply parks again. For waits that the other side is
 * already committed to finish (no deadline): a hand-off in flight may be
 * delayed by a preempted or busy thread, and spinning through that delay
 * would take the CPU it needs.
 */
SLUICE_INLINE uint32_t sluice_park_while(_Atomic(uint32_t) *word, uint32_t pending,
                                         uint32_t asleep)
{
    for (int i = 0; i < SLUICE_PARK_SPIN; i++) {
        uint32_t v = atomic_load_explicit(word, SLUICE_ACQUIRE);
        if (v != pending && v != asleep)
            return v;
        sluice_cpu_relax();
    }
    for (;;) {
        uint32_t v = pending;
        if (!atomic_compare_exchange_strong_explicit(word, &v, asleep, SLUICE_SEQ_CST,
                                                     SLUICE_SEQ_CST) &&
            v != asleep)
            return v;
        sluice_futex_wait(word, asleep, NULL);
    }
}

#endif /* SLUICE_PARK_H */
