/*
 * sluice/time.h — monotonic deadlines and the clock hook.
 *
 * Deadlines are absolute CLOCK_MONOTONIC instants (struct timespec). Every
 * waiting call takes `const struct timespec *deadline`; NULL means "no
 * deadline". Absolute deadlines compose: a run that waits twice uses one
 * deadline for both waits.
 *
 * A call may have two: a *start* deadline (it must have begun by then — a
 * streamed answer, delivered its first byte: what a streaming server
 * bounds is the time to the first token) and the whole-call deadline.
 * Either may be NULL; a call ended by one says which (enum sluice_expiry).
 *
 * Clock hook: layers that reason about elapsed time (discovery windows,
 * lock expiry, the event feed) read time through `struct sluice_clock`, so
 * tests can drive them in deterministic virtual time. A NULL clock means
 * the real CLOCK_MONOTONIC. Blocking waits always use the real clock: the
 * kernel sleeps on it.
 *
 * A deadline must be normalised (0 <= tv_nsec < 10^9, which
 * sluice_deadline_in and sluice_ns_timespec guarantee); every waiting call
 * rejects any other with SLUICE_EINVAL up front, since the kernel refuses it
 * and a wait would otherwise spin until the instant passed.
 *
 * Concurrency: stateless; callable from any thread. A custom clock's
 * now_ns must be thread-safe if the object using it is shared.
 */
#ifndef SLUICE_TIME_H
#define SLUICE_TIME_H

#include "cc.h" /* first: it checks the feature macros before <time.h> reads them */

#include <time.h>

#include "status.h"

#define SLUICE_NS_PER_SEC INT64_C(1000000000)
#define SLUICE_NS_PER_MS INT64_C(1000000)

struct sluice_clock {
    int64_t (*now_ns)(void *ctx); /* nanoseconds on a monotonic scale */
    void *ctx;
};

/* Nanoseconds of a timespec, saturating: a deadline centuries away is
 * "never" rather than a wrapped instant in the past. */
SLUICE_INLINE int64_t sluice_timespec_ns(const struct timespec *ts)
{
    if (ts->tv_sec >= INT64_MAX / SLUICE_NS_PER_SEC)
        return INT64_MAX;
    if (ts->tv_sec <= INT64_MIN / SLUICE_NS_PER_SEC)
        return INT64_MIN;
    return (int64_t)ts->tv_sec * SLUICE_NS_PER_SEC + ts->tv_nsec;
}

/* a + b, clamped to the int64 range instead of wrapping. */
SLUICE_INLINE int64_t sluice_add_ns(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

SLUICE_INLINE struct timespec sluice_ns_timespec(int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / SLUICE_NS_PER_SEC);
    ts.tv_nsec = (long)(ns % SLUICE_NS_PER_SEC);
    if (ts.tv_nsec < 0) {
        ts.tv_sec -= 1;
        ts.tv_nsec += SLUICE_NS_PER_SEC;
    }
    return ts;
}

/* Real CLOCK_MONOTONIC time in nanoseconds. */
SLUICE_INLINE int64_t sluice_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return sluice_timespec_ns(&ts);
}

/* Time from `clock`, or CLOCK_MONOTONIC when clock is NULL. */
SLUICE_INLINE int64_t sluice_clock_now(const struct sluice_clock *clock)
{
    return clock && clock->now_ns ? clock->now_ns(clock->ctx) : sluice_monotonic_ns();
}

/* Set *deadline to `ns` nanoseconds from now (CLOCK_MONOTONIC); returns deadline. */
SLUICE_INLINE struct timespec *sluice_deadline_in(struct timespec *deadline, int64_t ns)
{
    *deadline = sluice_ns_timespec(sluice_add_ns(sluice_monotonic_ns(), ns));
    return deadline;
}

/* True when `deadline` is NULL (none) or normalised: 0 <= tv_nsec < 10^9. */
SLUICE_INLINE bool sluice_deadline_valid(const struct timespec *deadline)
{
    return !deadline || (deadline->tv_nsec >= 0 && deadline->tv_nsec < SLUICE_NS_PER_SEC);
}

/*
 * The furthest ahead a deadline may lie: one further is on the wrong clock.
 * CLOCK_MONOTONIC counts from boot, so a CLOCK_REALTIME reading (seconds
 * since 1970) lands about 56 years ahead of it, less only the machine's
 * uptime, and a wait bound by it would never end; no model call waits a
 * year. A year sits far from both.
 */
#define SLUICE_DEADLINE_AHEAD_MAX_NS (INT64_C(366) * 86400 * SLUICE_NS_PER_SEC)

/* True when `deadline` (not NULL) lies more than SLUICE_DEADLINE_AHEAD_MAX_NS past `now_ns`
 * (CLOCK_MONOTONIC): a time read from another clock, most likely CLOCK_REALTIME. */
SLUICE_INLINE bool sluice_deadline_too_far(const struct timespec *deadline, int64_t now_ns)
{
    return sluice_timespec_ns(deadline) > sluice_add_ns(now_ns, SLUICE_DEADLINE_AHEAD_MAX_NS);
}

/*
 * Check a caller's deadline (NULL = none) before anything waits on it:
 * SLUICE_OK, or SLUICE_EINVAL with a message in `err` (`err_size` bytes;
 * may be NULL or 0) naming the field (`name`) and the fix: not normalised,
 * or more than a year ahead (CLOCK_REALTIME). Reads the clock.
 */
SLUICE_INLINE int sluice_deadline_check(const struct timespec *deadline, const char *name,
                                        char *err, size_t err_size)
{
    if (!sluice_deadline_valid(deadline))
        return sluice__fail(err, err_size,
                            "%s is not normalised: tv_nsec = %ld is outside [0, 999999999] "
                            "(build it with sluice_deadline_in or sluice_ns_timespec)",
                            name, (long)deadline->tv_nsec);
    int64_t now = deadline ? sluice_monotonic_ns() : 0;
    if (deadline && sluice_deadline_too_far(deadline, now))
        return sluice__fail(err, err_size,
                            "%s is %lld days ahead: not a CLOCK_MONOTONIC time (from "
                            "CLOCK_REALTIME?); build it with sluice_deadline_in",
                            name, (long long)((sluice_timespec_ns(deadline) - now) / 86400 /
                                              SLUICE_NS_PER_SEC));
    return SLUICE_OK;
}

/* Which of a call's two deadlines ended it. */
enum sluice_expiry {
    SLUICE_EXPIRED_NONE = 0, /* neither (or the call was not ended by a deadline) */
    SLUICE_EXPIRED_START,    /* the start deadline: the call had not begun (a stream: no first
                                byte yet), or could no longer begin in time */
    SLUICE_EXPIRED_CALL,     /* the whole-call deadline */
};

/* The earlier of two deadlines (either may be NULL = never); NULL when both are. */
SLUICE_INLINE const struct timespec *sluice_deadline_first(const struct timespec *a,
                                                           const struct timespec *b)
{
    if (!a || !b)
        return a ? a : b;
    return sluice_timespec_ns(a) <= sluice_timespec_ns(b) ? a : b;
}

/* Which of a call's deadlines comes first, so ends a wait bound by both: START or CALL
 * (CALL when neither is set, for a timeout that came from elsewhere). */
SLUICE_INLINE enum sluice_expiry sluice_deadline_which(const struct timespec *start_deadline,
                                                       const struct timespec *deadline)
{
    const struct timespec *first = sluice_deadline_first(start_deadline, deadline);
    return first && first == start_deadline ? SLUICE_EXPIRED_START : SLUICE_EXPIRED_CALL;
}

/* True when `deadline` (may be NULL = never) has passed. */
SLUICE_INLINE bool sluice_deadline_passed(const struct timespec *deadline)
{
    return deadline && sluice_monotonic_ns() >= sluice_timespec_ns(deadline);
}

#endif /* SLUICE_TIME_H */
