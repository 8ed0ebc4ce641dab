/* Deadlines and the clock hook. */
#include <criterion/criterion.h>
#include <sluice/time.h>

static int64_t fixed_clock(void *ctx)
{
    return *(int64_t *)ctx;
}

Test(time, a_deadline_in_the_far_future_saturates_instead_of_wrapping_into_the_past)
{
    struct timespec dl;
    sluice_deadline_in(&dl, INT64_MAX);
    cr_assert_geq(sluice_timespec_ns(&dl), INT64_MAX - SLUICE_NS_PER_SEC, "saturated near INT64_MAX");
    cr_assert_not(sluice_deadline_passed(&dl), "a deadline at the end of time has not passed");
    struct timespec far = {.tv_sec = (time_t)(INT64_MAX / 2), .tv_nsec = 0};
    cr_assert_eq(sluice_timespec_ns(&far), INT64_MAX);
    cr_assert_not(sluice_deadline_passed(&far));
}

Test(time, a_deadline_in_the_past_has_passed_and_null_never_passes)
{
    struct timespec dl;
    cr_assert(sluice_deadline_passed(sluice_deadline_in(&dl, -SLUICE_NS_PER_SEC)));
    cr_assert_not(sluice_deadline_passed(NULL));
    cr_assert_not(sluice_deadline_passed(sluice_deadline_in(&dl, 60 * SLUICE_NS_PER_SEC)));
}

Test(time, timespec_round_trips_and_normalises_negative_nanoseconds)
{
    struct timespec ts = sluice_ns_timespec(-1);
    cr_assert_eq(ts.tv_sec, -1);
    cr_assert_eq(ts.tv_nsec, SLUICE_NS_PER_SEC - 1);
    cr_assert_eq(sluice_timespec_ns(&ts), -1);
    ts = sluice_ns_timespec(5 * SLUICE_NS_PER_SEC + 7);
    cr_assert_eq(sluice_timespec_ns(&ts), 5 * SLUICE_NS_PER_SEC + 7);
}

Test(time, the_clock_hook_replaces_the_monotonic_clock_and_null_means_real_time)
{
    int64_t virtual_now = 42;
    struct sluice_clock clock = {fixed_clock, &virtual_now};
    cr_assert_eq(sluice_clock_now(&clock), 42);
    virtual_now = 7 * SLUICE_NS_PER_SEC;
    cr_assert_eq(sluice_clock_now(&clock), 7 * SLUICE_NS_PER_SEC);
    int64_t real = sluice_clock_now(NULL);
    cr_assert_gt(real, 0);
    cr_assert_leq(real, sluice_monotonic_ns());
}

Test(time, add_ns_clamps_at_both_ends)
{
    cr_assert_eq(sluice_add_ns(INT64_MAX - 1, 5), INT64_MAX);
    cr_assert_eq(sluice_add_ns(INT64_MIN + 1, -5), INT64_MIN);
    cr_assert_eq(sluice_add_ns(10, -3), 7);
}

Test(time, a_wall_clock_deadline_is_too_far_ahead_and_a_monotonic_one_is_not)
{
    struct timespec wall, mono;
    clock_gettime(CLOCK_REALTIME, &wall);
    wall.tv_sec += 1; /* "in a second", on the wrong clock */
    int64_t now = sluice_monotonic_ns();
    cr_assert(sluice_deadline_too_far(&wall, now), "CLOCK_REALTIME is decades past the uptime");
    cr_assert_not(sluice_deadline_too_far(sluice_deadline_in(&mono, SLUICE_NS_PER_SEC), now));
    struct timespec year = sluice_ns_timespec(now + SLUICE_DEADLINE_AHEAD_MAX_NS);
    cr_assert_not(sluice_deadline_too_far(&year, now), "a year from now is the furthest allowed");
    year = sluice_ns_timespec(now + SLUICE_DEADLINE_AHEAD_MAX_NS + 1);
    cr_assert(sluice_deadline_too_far(&year, now));
    struct timespec past = {.tv_sec = (time_t)(INT64_MIN / 2), .tv_nsec = 0};
    cr_assert_not(sluice_deadline_too_far(&past, now), "long past, not too far (and no overflow)");
    struct timespec end = {.tv_sec = (time_t)(INT64_MAX / 2), .tv_nsec = 0};
    cr_assert(sluice_deadline_too_far(&end, now), "the end of time is no deadline either");
}

Test(time, deadline_valid_accepts_null_and_normalised_deadlines_only)
{
    struct timespec ok = {.tv_sec = 5, .tv_nsec = SLUICE_NS_PER_SEC - 1};
    struct timespec zero = {.tv_sec = 0, .tv_nsec = 0};
    struct timespec over = {.tv_sec = 5, .tv_nsec = SLUICE_NS_PER_SEC};
    struct timespec negative = {.tv_sec = 5, .tv_nsec = -1};
    cr_assert(sluice_deadline_valid(NULL), "NULL means no deadline");
    cr_assert(sluice_deadline_valid(&ok));
    cr_assert(sluice_deadline_valid(&zero));
    cr_assert_not(sluice_deadline_valid(&over));
    cr_assert_not(sluice_deadline_valid(&negative));
    struct timespec made;
    cr_assert(sluice_deadline_valid(sluice_deadline_in(&made, -7)), "deadline_in normalises");
}
