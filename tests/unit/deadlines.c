/*
 * The deadline rules of sluice/pool.h, in virtual time: the expected service
 * time (sluice/service_time.h), don't start what cannot finish, the opt-in early
 * refusal at admission, lingering permits, and the counters that show them.
 *
 * Service times are virtual (a fake pool clock moved by the fake client);
 * deadlines are real CLOCK_MONOTONIC instants seconds away, compared with
 * virtual service times of tens of seconds, so no assertion depends on how
 * fast this machine runs.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sluice/run.h>
#include <sluice/service_time.h>

#include "run_fixtures.h"

#define SEC SLUICE_NS_PER_SEC
#define MS SLUICE_NS_PER_MS

static struct fake_clock clk = {1000 * SEC};

/* A client whose every call takes `duration` of virtual time. */
struct fake_client {
    int64_t duration;
    _Atomic(int) calls;
    bool abandon; /* give up after the request was sent, as a deadline mid-transfer does */
};

static int fake_generate(void *ctx, struct sluice_generation *gen)
{
    struct fake_client *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    fake_clock_advance(&clk, c->duration);
    if (c->abandon) {
        gen->abandoned = true;
        return -ETIMEDOUT;
    }
    return 0;
}

static const struct sluice_run_ops fake_ops = {.generate = fake_generate};

static struct sluice_engine *make_engine(uint32_t active, struct sluice_deadline_desc dl)
{
    struct sluice_clock hook = fake_clock_hook(&clk);
    struct sluice_backend_desc b = {.id = "b", .active = active, .deadlines = dl};
    struct sluice_engine *e;
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = &b,
                                                                   .n_backends = 1,
                                                                   .clock = &hook,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &e),
                 SLUICE_OK, "%s", err);
    return e;
}

static struct sluice_pool *make_pool(uint32_t active, struct sluice_deadline_desc dl)
{
    static struct sluice_clock hook;
    hook = fake_clock_hook(&clk);
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&(struct sluice_pool_desc){.active = active,
                                                               .clock = &hook,
                                                               .deadlines = dl},
                                    &p),
                 SLUICE_OK);
    return p;
}

/* n successful calls of `duration` virtual ns each on pool p. */
static void warm_up(struct sluice_pool *p, int n, int64_t duration)
{
    for (int i = 0; i < n; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        fake_clock_advance(&clk, duration);
        sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    }
}

static int run_by(struct sluice_engine *e, struct fake_client *c, int64_t deadline_ns,
                  struct sluice_run_result *r)
{
    struct timespec dl = deadline_in(deadline_ns);
    return sluice_run(e, &(struct sluice_run_desc){.backend = "b", .ops = &fake_ops, .ctx = c,
                                                   .deadline = &dl},
                      r);
}

/* ---- the expected service time --------------------------------------------- */

Test(deadlines, expected_service_time_is_unknown_until_enough_calls_succeeded)
{
    struct sluice_service_time s;
    sluice_service_init(&s, 10);
    for (uint32_t i = 0; i + 1 < SLUICE_SERVICE_MIN_SAMPLES; i++)
        sluice_service_add(&s, 100 * MS);
    cr_assert_eq(sluice_service_expected(&s), 0);
    sluice_service_add(&s, 100 * MS);
    cr_assert_eq(sluice_service_expected(&s), 100 * MS);
}

Test(deadlines, expected_service_time_is_the_low_quantile_and_follows_a_slower_provider)
{
    struct sluice_service_time s;
    sluice_service_init(&s, 10);
    for (int64_t i = 1; i <= 64; i++) /* 1..64 ms: p10 is the 7th, p90 the 58th */
        sluice_service_add(&s, i * MS);
    cr_assert_eq(sluice_service_expected(&s), 7 * MS);
    cr_assert_eq(sluice_service_high(&s), 58 * MS);
    for (int i = 0; i < 64; i++) /* one ring's worth of slower calls replaces the old ones */
        sluice_service_add(&s, 500 * MS);
    cr_assert_eq(sluice_service_expected(&s), 500 * MS);
}

Test(deadlines, histogram_quantiles_interpolate_inside_their_bucket)
{
    struct sluice_histogram h;
    sluice_histogram_init(&h);
    struct sluice_histogram_counts c = sluice_histogram_read(&h);
    cr_assert_eq(sluice_histogram_quantile(&c, 0.5), -1);
    for (int i = 0; i < 100; i++)
        sluice_histogram_add(&h, 150 * MS); /* bucket (100 ms, 250 ms] */
    c = sluice_histogram_read(&h);
    cr_assert_eq(c.count, 100);
    cr_assert_eq(c.sum_ns, 100 * 150 * MS);
    int64_t p50 = sluice_histogram_quantile(&c, 0.5);
    cr_assert(p50 > 100 * MS && p50 <= 250 * MS, "p50 %lld", (long long)p50);
}

/* ---- don't start what cannot finish --------------------------------------- */

Test(deadlines, a_run_with_less_time_left_than_the_expected_service_never_reaches_the_client)
{
    /* queue_late: past admission (which by default refuses this run at once, see
     * admission_refuses_by_default_...), the start rule is what stops it. */
    struct sluice_engine *e = make_engine(2, (struct sluice_deadline_desc){.queue_late = true});
    struct sluice_pool *p = sluice_engine_pool(e, "b");
    warm_up(p, 16, 20 * SEC);
    struct fake_client c = {.duration = 20 * SEC};
    struct sluice_run_result r;
    cr_assert_eq(run_by(e, &c, 2 * SEC, &r), SLUICE_ETIMEDOUT);
    cr_assert(r.refused_late);
    cr_assert_eq(r.generations, 0);
    cr_assert_eq(atomic_load(&c.calls), 0, "the client was called");
    struct sluice_pool_counts st = sluice_pool_stats(p);
    cr_assert_eq(st.refused_late, 1);
    cr_assert_eq(st.timeouts, 0, "a refusal before the start is not a timeout");
    assert_capacity_intact(p);
    /* With time enough, the same run is started. */
    cr_assert_eq(run_by(e, &c, 600 * SEC, &r), SLUICE_OK);
    cr_assert_not(r.refused_late);
    cr_assert_eq(atomic_load(&c.calls), 1);
    sluice_engine_destroy(e);
}

Test(deadlines, the_start_rule_is_off_without_samples_and_when_disabled)
{
    struct fake_client c = {.duration = 20 * SEC};
    struct sluice_run_result r;
    struct sluice_engine *e = make_engine(2, (struct sluice_deadline_desc){0});
    cr_assert_eq(run_by(e, &c, 2 * SEC, &r), SLUICE_OK, "no samples yet: nothing to refuse by");
    sluice_engine_destroy(e);
    e = make_engine(2, (struct sluice_deadline_desc){.start_quantile = SLUICE_SOME(0)});
    warm_up(sluice_engine_pool(e, "b"), 16, 20 * SEC);
    cr_assert_eq(run_by(e, &c, 2 * SEC, &r), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, "b")).refused_late, 0);
    sluice_engine_destroy(e);
}

static void record_status(struct sluice_pool_waiter *w, int status)
{
    *(int *)w->data = status;
}

Test(deadlines, an_async_call_granted_too_late_settles_etimedout_and_its_permit_moves_on)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 20 * SEC);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct timespec soon = deadline_in(2 * SEC), later = deadline_in(600 * SEC);
    int first = 1, second = 1;
    struct sluice_pool_waiter w1 = {.cb = record_status, .data = &first, .deadline = &soon};
    struct sluice_pool_waiter w2 = {.cb = record_status, .data = &second, .deadline = &later};
    sluice_pool_call_begin_async(p, &w1);
    sluice_pool_call_begin_async(p, &w2);
    cr_assert_eq(first, 1, "queued: not settled yet");
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(first, SLUICE_ETIMEDOUT);
    cr_assert(w1.call.refused_late);
    cr_assert_eq(second, SLUICE_OK, "the permit went to the next in line");
    cr_assert_eq(sluice_pool_stats(p).refused_late, 1);
    sluice_pool_call_end(p, &w2.call, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

/* 16 successes of 2, 4, ..., 32 s: the low quantile (p10) is 4 s, the median 16 s. */
static void warm_up_spread(struct sluice_pool *p)
{
    for (int64_t i = 1; i <= 16; i++)
        warm_up(p, 1, 2 * i * SEC);
    cr_assert_eq(sluice_service_expected(&p->service), 4 * SEC);
    cr_assert_eq(sluice_service_median(&p->service), 16 * SEC);
}

Test(deadlines, a_call_with_less_than_an_even_chance_yields_its_permit_to_a_caller_behind_it)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up_spread(p);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    /* 10 s left: above the low quantile, below the median. */
    struct timespec short_dl = deadline_in(10 * SEC), long_dl = deadline_in(600 * SEC);
    int first = 1, second = 1;
    struct sluice_pool_waiter w1 = {.cb = record_status, .data = &first, .deadline = &short_dl};
    struct sluice_pool_waiter w2 = {.cb = record_status, .data = &second, .deadline = &long_dl};
    sluice_pool_call_begin_async(p, &w1);
    sluice_pool_call_begin_async(p, &w2);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(first, SLUICE_ETIMEDOUT, "started with less than an even chance while "
                                          "another caller waited");
    cr_assert(w1.call.refused_late);
    cr_assert_eq(second, SLUICE_OK, "the permit went to the caller behind it");
    /* With nobody behind it, the same 10 s is enough to start: the permit would idle. */
    struct timespec again = deadline_in(10 * SEC);
    int third = 1;
    struct sluice_pool_waiter w3 = {.cb = record_status, .data = &third, .deadline = &again};
    sluice_pool_call_begin_async(p, &w3);
    sluice_pool_call_end(p, &w2.call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(third, SLUICE_OK);
    cr_assert_not(w3.call.refused_late);
    sluice_pool_call_end(p, &w3.call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).refused_late, 1);
    sluice_pool_destroy(p);
}

/* ---- refuse at admission what cannot be served in time (the default) ------------------------------------------------------------ */

Test(deadlines, admission_refuses_by_default_only_when_the_predicted_wait_passes_the_deadline)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    struct timespec dl15 = deadline_in(15 * SEC), dl35 = deadline_in(35 * SEC),
                    dl60 = deadline_in(60 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl15), SLUICE_OK, "no estimate: no prediction");
    sluice_pool_leave(p);
    warm_up(p, 16, 10 * SEC);
    cr_assert_eq(sluice_pool_predicted_wait(p), 0, "a permit is free");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl15), SLUICE_OK, "10 s of service fit in 15 s");
    sluice_pool_leave(p);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    cr_assert_eq(sluice_pool_predicted_wait(p), 10 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl15), SLUICE_ELATE, "10 s wait + 10 s service > 15 s");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl35), SLUICE_OK);
    sluice_pool_leave(p);
    /* Two calls queued ahead: (2 + 1) x 10 s of wait. */
    int s1 = 1, s2 = 1;
    struct sluice_pool_waiter w1 = {.cb = record_status, .data = &s1};
    struct sluice_pool_waiter w2 = {.cb = record_status, .data = &s2};
    sluice_pool_call_begin_async(p, &w1);
    sluice_pool_call_begin_async(p, &w2);
    cr_assert_eq(sluice_pool_predicted_wait(p), 30 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl35), SLUICE_ELATE);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl60), SLUICE_OK);
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, NULL), SLUICE_OK, "no deadline: never too late");
    sluice_pool_leave(p);
    struct sluice_pool_counts st = sluice_pool_stats(p);
    cr_assert_eq(st.refused_early, 2);
    cr_assert_eq(st.refused_capacity, 0, "ELATE is not a full pool");
    cr_assert_eq(sluice_pool_call_cancel_async(p, &w1), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &w2), SLUICE_OK);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, calls_marked_on_their_way_to_the_line_take_free_permits_then_queue_ahead_of_a_newcomer)
{
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 10 * SEC);
    struct timespec dl25 = deadline_in(25 * SEC);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    cr_assert_eq(sluice_pool_predicted_wait(p), 0, "a permit is free");
    sluice_pool_arrive(p);
    cr_assert_eq(sluice_pool_predicted_wait(p), 5 * SEC, "the arriving call takes the free one");
    sluice_pool_arrive(p);
    sluice_pool_arrive(p);
    cr_assert_eq(sluice_pool_predicted_wait(p), 15 * SEC, "two queue ahead: (2 + 1) x 10 s / 2");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl25), SLUICE_ELATE, "15 s wait + 10 s > 25 s");
    for (int i = 0; i < 3; i++)
        sluice_pool_arrived(p);
    cr_assert_eq(sluice_pool_predicted_wait(p), 0);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl25), SLUICE_OK);
    sluice_pool_leave(p);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, before_the_service_time_is_known_a_call_with_a_deadline_queues_behind_one_round_at_most)
{
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    struct timespec dl = deadline_in(60 * SEC);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    cr_assert_eq(sluice_pool_predicted_wait(p), -1, "no call has said how long calls take");
    /* A round is two: as many as the permits the calls in service will hand on. */
    int s[3] = {1, 1, 1};
    struct sluice_pool_waiter w[3];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_OK, "waiter %d of the round", i);
        w[i] = (struct sluice_pool_waiter){.cb = record_status, .data = &s[i]};
        sluice_pool_call_begin_async(p, &w[i]);
    }
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_ELATE, "behind a whole round");
    cr_assert_eq(sluice_pool_admit_by(p, &dl, NULL), SLUICE_ELATE, "a start deadline too");
    /* No prediction names a deadline here: the refusal names the one the wait reaches first. */
    struct timespec later = deadline_in(90 * SEC);
    enum sluice_expiry late = SLUICE_EXPIRED_NONE;
    cr_assert_eq(sluice_pool_admit_late(p, &dl, &later, &late), SLUICE_ELATE);
    cr_assert_eq(late, SLUICE_EXPIRED_START);
    cr_assert_eq(sluice_pool_admit_late(p, &later, &dl, &late), SLUICE_ELATE);
    cr_assert_eq(late, SLUICE_EXPIRED_CALL);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, NULL), SLUICE_OK, "no deadline: queues as ever");
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_stats(p).refused_early, 4);
    /* Once calls have said how long they take, the prediction decides: 2 + 1 calls of
     * 1 s ahead on 2 permits fit in 60 s. */
    cr_assert_eq(sluice_pool_call_cancel_async(p, &w[0]), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &w[1]), SLUICE_OK);
    fake_clock_advance(&clk, SEC);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    warm_up(p, 4, SEC);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    for (int i = 0; i < 3; i++) {
        w[i] = (struct sluice_pool_waiter){.cb = record_status, .data = &s[i]};
        sluice_pool_call_begin_async(p, &w[i]);
    }
    cr_assert_gt(sluice_pool_predicted_wait(p), 0);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_OK, "a known wait that fits");
    sluice_pool_leave(p);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_pool_call_cancel_async(p, &w[i]), SLUICE_OK);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, with_queue_late_admission_ignores_the_prediction)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){.queue_late = true});
    warm_up(p, 16, 10 * SEC);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct timespec dl = deadline_in(15 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_OK);
    sluice_pool_leave(p);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, a_run_refused_early_calls_nothing_and_returns_elate)
{
    struct sluice_engine *e = make_engine(1, (struct sluice_deadline_desc){0});
    struct sluice_pool *p = sluice_engine_pool(e, "b");
    warm_up(p, 16, 10 * SEC);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct fake_client c = {.duration = 10 * SEC};
    struct sluice_run_result r;
    cr_assert_eq(run_by(e, &c, 15 * SEC, &r), SLUICE_ELATE);
    cr_assert_eq(atomic_load(&c.calls), 0);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_CALL, "the refusal says which deadline");
    cr_assert_str_eq(sluice_status_name(SLUICE_ELATE), "ELATE");
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_engine_destroy(e);
}

/* ---- lingering permits ---------------------------------------------------------- */

Test(deadlines, an_abandoned_call_keeps_its_permit_until_its_expected_service_has_passed)
{
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 100 * MS); /* high quantile: 100 ms */
    struct sluice_call a;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    fake_clock_advance(&clk, 30 * MS);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    struct sluice_pool_counts st = sluice_pool_stats(p);
    cr_assert_eq(st.lingering, 1);
    cr_assert_eq(st.in_flight, 1, "still running at the provider");
    cr_assert_eq(st.lingered, 1);
    cr_assert_eq(st.timeouts, 1);
    /* The high quantile after it was given up: a call that outlived its
     * deadline is a long one (sluice_service_linger_until). */
    cr_assert_eq(sluice_pool_next_release(p), a.start_ns + 130 * MS);
    /* The next call counts it in flight. */
    struct sluice_call b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    cr_assert_eq(b.in_flight_at_start, 2);
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_EAGAIN, "both permits held");
    fake_clock_advance(&clk, 99 * MS);
    sluice_pool_poll(p);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1, "1 ms early");
    fake_clock_advance(&clk, 1 * MS);
    sluice_pool_poll(p);
    st = sluice_pool_stats(p);
    cr_assert_eq(st.lingering, 0);
    cr_assert_eq(st.in_flight, 1);
    cr_assert_eq(sluice_pool_next_release(p), INT64_MAX);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(deadlines, an_abandoned_call_is_released_at_once_when_lingering_cannot_apply)
{
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    struct sluice_call a;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    sluice_pool_call_abandon(p, &a, SLUICE_ECANCELED);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0, "no estimate, and it never ran");
    cr_assert_eq(sluice_pool_stats(p).cancels, 1);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);

    p = make_pool(2, (struct sluice_deadline_desc){.linger_max_ms = SLUICE_SOME(120)});
    warm_up(p, 16, 100 * MS);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    fake_clock_advance(&clk, 150 * MS);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0, "it already ran past linger_max_ms");
    assert_capacity_intact(p);
    sluice_pool_destroy(p);

    p = make_pool(2, (struct sluice_deadline_desc){.linger_max_ms = SLUICE_SOME(0)});
    warm_up(p, 16, 100 * MS);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0, "lingering disabled");
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(deadlines, a_linger_is_capped_by_linger_max_ms)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){.linger_max_ms = SLUICE_SOME(50)});
    warm_up(p, 16, 100 * MS);
    struct sluice_call a;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_next_release(p), a.start_ns + 50 * MS);
    fake_clock_advance(&clk, 50 * MS);
    sluice_pool_poll(p);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(deadlines, a_run_whose_client_abandons_mid_transfer_leaves_its_permit_lingering)
{
    struct sluice_engine *e = make_engine(1, (struct sluice_deadline_desc){0});
    struct sluice_pool *p = sluice_engine_pool(e, "b");
    warm_up(p, 16, 100 * MS);
    struct fake_client c = {.duration = 10 * MS, .abandon = true};
    struct sluice_run_result r;
    cr_assert_eq(run_by(e, &c, 600 * SEC, &r), SLUICE_ECLIENT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1);
    fake_clock_advance(&clk, 100 * MS);
    sluice_engine_poll(e); /* the engine's poll releases it too */
    cr_assert_eq(sluice_pool_stats(p).lingering, 0);
    assert_capacity_intact(p);
    sluice_engine_destroy(e);
}

struct blocked {
    struct sluice_pool *pool;
    _Atomic(int) status;
    _Atomic(int) done;
    struct sluice_call call;
};

static void *blocked_begin(void *arg)
{
    struct blocked *b = arg;
    atomic_store(&b->status, sluice_pool_call_begin(b->pool, NULL, NULL, &b->call));
    atomic_store(&b->done, 1);
    return NULL;
}

Test(deadlines, blocked_callers_drain_when_every_permit_lingers_and_nothing_else_runs)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 100 * MS);
    struct sluice_call a;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    struct blocked b = {.pool = p, .status = 1};
    pthread_t t;
    pthread_create(&t, NULL, blocked_begin, &b);
    WAIT_UNTIL(sluice_pool_stats(p).queued == 1);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT); /* the only permit now lingers */
    cr_assert_eq(sluice_pool_stats(p).lingering, 1);
    cr_assert_eq(atomic_load(&b.done), 0);
    /* Nobody calls anything on the pool: only the waiter itself can release it. */
    fake_clock_advance(&clk, 100 * MS);
    WAIT_UNTIL(atomic_load(&b.done));
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&b.status), SLUICE_OK);
    cr_assert_eq(b.call.in_flight_at_start, 1);
    sluice_pool_call_end(p, &b.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(deadlines, a_queued_async_call_starts_when_a_poll_releases_a_lingering_permit)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 100 * MS);
    struct sluice_call a;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    int s = 1;
    struct sluice_pool_waiter w = {.cb = record_status, .data = &s};
    sluice_pool_call_begin_async(p, &w);
    sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    sluice_pool_poll(p);
    cr_assert_eq(s, 1, "still lingering");
    fake_clock_advance(&clk, 100 * MS);
    sluice_pool_poll(p);
    cr_assert_eq(s, SLUICE_OK);
    sluice_pool_call_end(p, &w.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

/* ---- counters ---------------------------------------------------------------------- */

Test(deadlines, the_counters_count_refusals_timeouts_cancels_and_waits)
{
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&(struct sluice_pool_desc){.active = 1,
                                                               .waiting = SLUICE_SOME(1)},
                                    &p),
                 SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    struct timespec past = deadline_in(0);
    cr_assert_eq(sluice_pool_call_begin(p, &past, NULL, &b), SLUICE_ETIMEDOUT);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    sluice_cancel_fire(&token);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, &token, &b), SLUICE_ECANCELED);
    struct timespec soon = deadline_in(1 * MS);
    cr_assert_eq(sluice_pool_call_begin(p, &soon, NULL, &b), SLUICE_ETIMEDOUT, "timed out queued");
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OVERLOAD, 0);
    struct sluice_pool_counts st = sluice_pool_stats(p);
    cr_assert_eq(st.refused_capacity, 1);
    cr_assert_eq(st.timeouts, 2);
    cr_assert_eq(st.cancels, 1);
    cr_assert_eq(st.calls_overload, 1);
    struct sluice_histogram_counts qw, ct;
    sluice_pool_histograms(p, &qw, &ct);
    cr_assert_eq(qw.count, 2, "the started call and the one that timed out in the queue");
    cr_assert_eq(ct.count, 1);
    sluice_pool_leave(p);
    sluice_pool_leave(p);
    sluice_pool_destroy(p);
}

/* ---- configuration ---------------------------------------------------------------- */

static void assert_rejected(struct sluice_backend_desc b, const char *needle)
{
    char err[256];
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = &b,
                                                                   .n_backends = 1,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &e),
                 SLUICE_EINVAL);
    cr_assert(strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
}

Test(deadlines, invalid_deadline_rules_fail_creation_naming_the_field)
{
    assert_rejected((struct sluice_backend_desc){.id = "x", .deadlines.queue_late = true},
                    "backends[0].deadlines.queue_late set without an active limit");
    assert_rejected((struct sluice_backend_desc){.id = "x", .active = 2,
                                                 .deadlines.start_quantile = SLUICE_SOME(60)},
                    "backends[0].deadlines.start_quantile = 60 is above 50");
    assert_rejected((struct sluice_backend_desc){.id = "x", .active = 2,
                                                 .deadlines.linger = (enum sluice_linger)7},
                    "backends[0].deadlines.linger = 7 is not a mode");
    assert_rejected((struct sluice_backend_desc){.id = "x", .active = 2,
                                                 .deadlines.linger_max_ms = SLUICE_SOME(4000000)},
                    "backends[0].deadlines.linger_max_ms = 4000000 is above the maximum");
}

/* ---- two deadlines: a queue that never holds what cannot be served in time ------------ */

/* n successful calls on p, each `first` virtual ns to its latency signal and `whole` to its
 * end (a stream's time to first byte and its whole call). */
static void warm_up_stream(struct sluice_pool *p, int n, int64_t first, int64_t whole)
{
    for (int i = 0; i < n; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        fake_clock_advance(&clk, whole);
        sluice_pool_call_end_latency(p, &call, SLUICE_OUTCOME_OK, 0, first);
    }
}

Test(deadlines, a_queued_call_leaves_the_line_once_it_can_no_longer_finish_in_time)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 3 * SEC); /* every call needs 3 s */
    struct sluice_call holder, late;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct timespec dl = deadline_in(3 * SEC + 200 * MS);
    /* Started after 200 ms it could not finish: it leaves then, not at its deadline. */
    cr_assert_eq(sluice_pool_call_begin(p, &dl, NULL, &late), SLUICE_ETIMEDOUT);
    cr_assert(!sluice_deadline_passed(&dl), "it left the line ~3 s before its deadline");
    cr_assert(late.refused_late);
    cr_assert_eq(late.expired, SLUICE_EXPIRED_CALL);
    cr_assert_eq(sluice_pool_stats(p).refused_late, 1);
    cr_assert_eq(sluice_pool_stats(p).queued, 0, "nothing is left in the line");
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, a_queued_call_leaves_the_line_once_its_first_byte_cannot_come_in_time)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up_stream(p, 16, 2 * SEC, 6 * SEC); /* first byte after 2 s, done after 6 s */
    cr_assert_eq(sluice_pool_stats(p).expected_first_ns, 2 * SEC);
    struct sluice_call holder, late;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct timespec start = deadline_in(2 * SEC + 200 * MS);
    cr_assert_eq(sluice_pool_call_begin_by(p, &start, NULL, NULL, &late), SLUICE_ETIMEDOUT);
    cr_assert(!sluice_deadline_passed(&start), "it left ~2 s before its start deadline");
    cr_assert(late.refused_late);
    cr_assert_eq(late.expired, SLUICE_EXPIRED_START);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    /* With a permit free and time for the first byte, the same call starts. */
    start = deadline_in(60 * SEC);
    cr_assert_eq(sluice_pool_call_begin_by(p, &start, NULL, NULL, &late), SLUICE_OK);
    sluice_pool_call_end(p, &late, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, a_start_deadline_that_has_passed_fails_the_wait_as_a_start_expiry)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    struct timespec past = deadline_in(-SEC), later = deadline_in(60 * SEC);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin_by(p, &past, &later, NULL, &call), SLUICE_ETIMEDOUT);
    cr_assert_eq(call.expired, SLUICE_EXPIRED_START);
    cr_assert(!call.refused_late, "it passed: not a prediction");
    struct timespec bad = {.tv_sec = 1, .tv_nsec = -1};
    cr_assert_eq(sluice_pool_call_begin_by(p, &bad, NULL, NULL, &call), SLUICE_EINVAL);
    sluice_pool_destroy(p);
}

Test(deadlines, admission_refuses_a_call_whose_predicted_wait_passes_its_start_deadline)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up_stream(p, 16, 2 * SEC, 3 * SEC);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    cr_assert_eq(sluice_pool_predicted_wait(p), 3 * SEC, "one call ahead, 3 s each");
    struct timespec soon = deadline_in(4 * SEC), ample = deadline_in(6 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, &soon, NULL), SLUICE_ELATE, "3 s wait + 2 s > 4 s");
    cr_assert_eq(sluice_pool_admit_by(p, &ample, NULL), SLUICE_OK, "3 s wait + 2 s <= 6 s");
    sluice_pool_leave(p);
    /* Which deadline the refusal was for: the start one (3 s wait + 2 s > 4 s), or, with the
     * start fitting in 6 s, the whole call's (3 s wait + 3 s > 5 s). */
    struct timespec whole = deadline_in(5 * SEC), roomy = deadline_in(60 * SEC);
    enum sluice_expiry late = SLUICE_EXPIRED_NONE;
    cr_assert_eq(sluice_pool_admit_late(p, &soon, &roomy, &late), SLUICE_ELATE);
    cr_assert_eq(late, SLUICE_EXPIRED_START);
    cr_assert_eq(sluice_pool_admit_late(p, &ample, &whole, &late), SLUICE_ELATE);
    cr_assert_eq(late, SLUICE_EXPIRED_CALL, "6 s for the first byte, 5 s for the whole call");
    cr_assert_eq(sluice_pool_admit_late(p, &ample, &roomy, &late), SLUICE_OK);
    cr_assert_eq(late, SLUICE_EXPIRED_NONE);
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_stats(p).refused_early, 3);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, a_run_reports_which_deadline_expired)
{
    struct sluice_engine *e = make_engine(1, (struct sluice_deadline_desc){0});
    struct fake_client c = {.duration = SEC};
    struct timespec past = deadline_in(-SEC), later = deadline_in(60 * SEC);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &(struct sluice_run_desc){.backend = "b", .ops = &fake_ops, .ctx = &c,
                                                         .start_deadline = &past,
                                                         .deadline = &later},
                            &r),
                 SLUICE_ETIMEDOUT);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_START);
    cr_assert_eq(atomic_load(&c.calls), 0);
    sluice_engine_destroy(e);
}

/* A client whose call its start deadline ended, as the chat client's transfer ends. */
static int start_cut_generate(void *ctx, struct sluice_generation *gen)
{
    (void)ctx;
    gen->abandoned = true;
    gen->expired = SLUICE_EXPIRED_START;
    return SLUICE_ETIMEDOUT;
}

Test(deadlines, a_deadline_that_ends_the_clients_call_is_its_eclient_and_says_which_deadline)
{
    struct sluice_engine *e = make_engine(1, (struct sluice_deadline_desc){0});
    const struct sluice_run_ops ops = {.generate = start_cut_generate};
    struct timespec start = deadline_in(60 * SEC), whole = deadline_in(120 * SEC);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &(struct sluice_run_desc){.backend = "b", .ops = &ops,
                                                         .start_deadline = &start,
                                                         .deadline = &whole},
                            &r),
                 SLUICE_ECLIENT, "a callback's error, as README.md and run.h say");
    cr_assert_eq(r.client_status, SLUICE_ETIMEDOUT);
    cr_assert_eq(r.client_stage, SLUICE_STAGE_GENERATE);
    cr_assert_eq(r.expired, SLUICE_EXPIRED_START);
    sluice_engine_destroy(e);
}

static _Atomic(int) prepares;

static int count_prepare(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&prepares, 1);
    return 0;
}

Test(deadlines, a_run_with_either_deadline_unnormalised_is_einval_before_prepare)
{
    struct sluice_engine *e = make_engine(1, (struct sluice_deadline_desc){0});
    struct fake_client c = {.duration = SEC};
    const struct sluice_run_ops ops = {.prepare = count_prepare, .generate = fake_generate};
    /* The bad one later than the good one: the earlier deadline alone looks fine. */
    struct timespec good = deadline_in(60 * SEC), bad = deadline_in(120 * SEC);
    bad.tv_nsec = SLUICE_NS_PER_SEC;
    const struct timespec *pairs[][2] = {{&good, &bad}, {&bad, &good}, {NULL, &bad}, {&bad, NULL}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        struct sluice_run_result r;
        cr_assert_eq(sluice_run(e, &(struct sluice_run_desc){.backend = "b", .ops = &ops, .ctx = &c,
                                                             .start_deadline = pairs[i][0],
                                                             .deadline = pairs[i][1]},
                                &r),
                     SLUICE_EINVAL, "pair %zu", i);
        cr_assert_eq(atomic_load(&prepares), 0, "pair %zu: prepared for a run that was refused", i);
    }
    cr_assert_eq(atomic_load(&c.calls), 0);
    cr_assert_eq(sluice_pool_stats(sluice_engine_pool(e, "b")).admitted, 0);
    sluice_engine_destroy(e);
}

/* ---- what a cut call teaches, and whether it keeps its permit -------------------------- */

Test(deadlines, a_call_cut_by_its_deadline_is_censored_and_a_cancelled_one_ignored)
{
    struct sluice_pool *p = make_pool(3, (struct sluice_deadline_desc){.linger = SLUICE_LINGER_OFF});
    struct sluice_call a, b, c;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &c), SLUICE_OK);
    fake_clock_advance(&clk, 250 * MS);
    struct sluice_sample s = sluice_pool_call_abandon(p, &a, SLUICE_ETIMEDOUT);
    cr_assert_eq(s.outcome, SLUICE_OUTCOME_CENSORED, "its deadline: longer than 250 ms");
    cr_assert_eq(s.latency_ns, 250 * MS);
    s = sluice_pool_call_abandon(p, &b, SLUICE_ECANCELED);
    cr_assert_eq(s.outcome, SLUICE_OUTCOME_IGNORE, "a cancel says nothing");
    s = sluice_pool_call_abandon_latency(p, &c, SLUICE_ETIMEDOUT, 80 * MS);
    cr_assert_eq(s.outcome, SLUICE_OUTCOME_OK, "its first byte came: a measured latency");
    cr_assert_eq(s.latency_ns, 80 * MS);
    struct sluice_pool_counts st = sluice_pool_stats(p);
    cr_assert_eq(st.calls_ok, 0, "a cut call is not a served one for the operator");
    cr_assert_eq(st.expected_ns, 0, "nor does it teach how long calls take");
    sluice_pool_destroy(p);
}

Test(deadlines, linger_off_releases_and_linger_on_keeps_an_abandoned_calls_permit)
{
    enum sluice_linger modes[] = {SLUICE_LINGER_OFF, SLUICE_LINGER_ON, SLUICE_LINGER_LEARNED};
    uint32_t expect[] = {0, 1, 1}; /* LEARNED keeps it until a trial decides (a fixed pool: never) */
    for (int i = 0; i < 3; i++) {
        struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){.linger = modes[i]});
        warm_up(p, 16, SEC);
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        fake_clock_advance(&clk, 100 * MS);
        sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
        struct sluice_pool_counts st = sluice_pool_stats(p);
        cr_assert_eq(st.lingering, expect[i], "%s", sluice_linger_name(modes[i]));
        cr_assert_eq(st.in_flight, expect[i]);
        cr_assert_eq(st.linger, modes[i]);
        sluice_pool_destroy(p);
    }
}

/* An adaptive pool of `active` whose discovery has locked its ceiling at `active`. */
static struct sluice_pool *locked_pool(uint32_t active)
{
    static struct sluice_clock hook;
    hook = fake_clock_hook(&clk);
    struct sluice_discovery_desc disc = {.node_id = "cloud:t", .jumpstart = active};
    struct sluice_pool *p;
    char err[256];
    cr_assert_eq(sluice_pool_create(&(struct sluice_pool_desc){.active = active,
                                                               .clock = &hook,
                                                               .discovery = &disc,
                                                               .error = err,
                                                               .error_size = sizeof err},
                                    &p),
                 SLUICE_OK, "%s", err);
    struct sluice_call calls[8];
    for (int round = 0; round < 400 && !sluice_discovery_ceiling(sluice_pool_discovery(p));
         round++) {
        for (uint32_t i = 0; i < active; i++)
            cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
        fake_clock_advance(&clk, SEC);
        for (uint32_t i = 0; i < active; i++)
            sluice_pool_call_end(p, &calls[i], SLUICE_OUTCOME_OK, 0);
    }
    cr_assert_eq(sluice_discovery_ceiling(sluice_pool_discovery(p)), active,
                 "a node that never sees congestion locks at its max");
    return p;
}

/* Rounds of: abandon one call 100 ms in (a trial phantom: calls take 1 s), then run
 * `active` calls of 1 s, ending the last, which started with the phantom above the ceiling,
 * with `outcome`. */
static void trial_rounds(struct sluice_pool *p, uint32_t active, enum sluice_outcome outcome,
                         int rounds)
{
    struct sluice_call cut, calls[8];
    for (int r = 0; r < rounds; r++) {
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cut), SLUICE_OK);
        fake_clock_advance(&clk, 100 * MS);
        sluice_pool_call_abandon(p, &cut, SLUICE_ETIMEDOUT);
        cr_assert_eq(sluice_pool_stats(p).lingering, 0, "released on trial");
        for (uint32_t i = 0; i < active; i++)
            cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
        cr_assert_geq(calls[active - 1].phantoms_at_start, 1);
        fake_clock_advance(&clk, SEC);
        for (uint32_t i = 0; i + 1 < active; i++)
            sluice_pool_call_end(p, &calls[i], SLUICE_OUTCOME_OK, 0);
        sluice_pool_call_end(p, &calls[active - 1], outcome, 0);
    }
}

Test(deadlines, learned_lingering_turns_off_when_calls_above_the_ceiling_are_served_beside_phantoms)
{
    struct sluice_pool *p = locked_pool(4);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_LEARNED);
    trial_rounds(p, 4, SLUICE_OUTCOME_OK, (int)SLUICE_POOL_LINGER_TRIAL_CALLS - 1);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_LEARNED, "one short of the trial");
    trial_rounds(p, 4, SLUICE_OUTCOME_OK, 1);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_OFF,
                 "the provider served past its ceiling: abandoned calls freed their slots");
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0);
    sluice_pool_destroy(p);
}

Test(deadlines, learned_lingering_stays_on_when_a_call_above_the_ceiling_is_refused_beside_phantoms)
{
    struct sluice_pool *p = locked_pool(4);
    trial_rounds(p, 4, SLUICE_OUTCOME_OVERLOAD, 1);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_ON,
                 "refused with the phantoms still running: the provider keeps working");
    cr_assert_eq(sluice_pool_stats(p).calls_overload, 1, "the operator still sees the 429");
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    fake_clock_advance(&clk, 100 * MS);
    sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1, "kept for good");
    sluice_pool_destroy(p);
}

/* How much longer a call abandoned now would keep its permit (what sluice-proxy reads a
 * stopped stream on for): the high quantile of service times (every call took 1 s) where the
 * pool keeps it, capped by linger_max_ms from the call's start; none where lingering is off,
 * nor where LEARNED may release it on trial (at a locked ceiling, a call young enough to be a
 * phantom), until the trial says on; a call too old for the trial is kept, as abandon keeps it. */
Test(deadlines, linger_left_is_how_long_an_abandoned_calls_permit_would_be_kept)
{
    enum sluice_linger modes[] = {SLUICE_LINGER_OFF, SLUICE_LINGER_ON, SLUICE_LINGER_LEARNED};
    int64_t expect[] = {0, SEC, SEC}; /* LEARNED in a fixed pool keeps it: no trial */
    for (int i = 0; i < 3; i++) {
        struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){.linger = modes[i]});
        warm_up(p, 16, SEC);
        cr_assert_eq(sluice_pool_linger_left(p, 100 * MS), expect[i], "%s: %" PRId64 " ns",
                     sluice_linger_name(modes[i]), sluice_pool_linger_left(p, 100 * MS));
        sluice_pool_destroy(p);
    }
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){
                                             .linger = SLUICE_LINGER_ON,
                                             .linger_max_ms = SLUICE_SOME(1500)});
    warm_up(p, 16, SEC);
    cr_assert_eq(sluice_pool_linger_left(p, 800 * MS), 700 * MS, "capped 1.5 s from its start");
    cr_assert_eq(sluice_pool_linger_left(p, 1600 * MS), 0, "past the cap: released at once");
    sluice_pool_destroy(p);
    p = locked_pool(4);
    cr_assert_eq(sluice_pool_linger_left(p, 100 * MS), 0,
                 "at the lock, LEARNED may release it on trial");
    cr_assert_gt(sluice_pool_linger_left(p, 1100 * MS), 0, "past the floor: no phantom, kept");
    struct sluice_call old;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &old), SLUICE_OK);
    fake_clock_advance(&clk, 1100 * MS);
    sluice_pool_call_abandon(p, &old, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1, "... as abandon keeps it");
    fake_clock_advance(&clk, 2 * SEC); /* its permit comes back */
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &old), SLUICE_OK);
    sluice_pool_call_end(p, &old, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0);
    trial_rounds(p, 4, SLUICE_OUTCOME_OVERLOAD, 1);
    cr_assert_gt(sluice_pool_linger_left(p, 100 * MS), 0, "the trial said on: kept");
    sluice_pool_destroy(p);
}

/* A trial phantom counts only while its call would still be running 9 times in 10 if the
 * provider kept working on it: until the floor quantile of service times (every call here
 * took 1 s) from its start. A call abandoned later is no phantom and keeps its permit; one
 * abandoned early is forgotten at that floor, not a whole call after it was given up, so
 * calls served once it has likely finished say nothing about the provider. */
Test(deadlines, a_trial_phantom_counts_only_while_its_call_would_surely_still_run)
{
    struct sluice_pool *p = locked_pool(4);
    struct sluice_call late, early, calls[2];
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &late), SLUICE_OK);
    fake_clock_advance(&clk, 1100 * MS);
    sluice_pool_call_abandon(p, &late, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1,
                 "abandoned after the floor: no phantom, it keeps its permit");
    fake_clock_advance(&clk, 1100 * MS); /* its permit comes back */
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &early), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0);
    fake_clock_advance(&clk, 100 * MS);
    sluice_pool_call_abandon(p, &early, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0, "abandoned before the floor: released on trial");
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[0]), SLUICE_OK);
    cr_assert_eq(calls[0].phantoms_at_start, 1, "a phantom while its call would surely run");
    fake_clock_advance(&clk, 950 * MS); /* 1.05 s after its start */
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[1]), SLUICE_OK);
    cr_assert_eq(calls[1].phantoms_at_start, 0, "forgotten at the floor, counted from its start");
    for (int i = 0; i < 2; i++)
        sluice_pool_call_end(p, &calls[i], SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_LEARNED);
    sluice_pool_destroy(p);
}

/* The trial's refusal is its answer, not a cap come down: the call started with its own count
 * at the ceiling and a phantom above it, exactly where the lock says the provider refuses. */
Test(deadlines, a_refusal_the_trials_phantoms_explain_leaves_the_limit_at_the_lock)
{
    struct sluice_pool *p = locked_pool(4);
    struct sluice_call cut, calls[4];
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cut), SLUICE_OK);
    fake_clock_advance(&clk, 100 * MS);
    sluice_pool_call_abandon(p, &cut, SLUICE_ETIMEDOUT); /* released on trial: a phantom */
    for (int round = 0; round < 6; round++) { /* at the pace of the lock: 4 calls a second */
        cr_assert_eq(sluice_pool_stats(p).active, 4, "the limit stays at the lock");
        for (int i = 0; i < 4; i++)
            cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
        if (round == 0)
            cr_assert_eq(calls[3].phantoms_at_start, 1);
        fake_clock_advance(&clk, SEC);
        for (int i = 0; i < 4; i++)
            sluice_pool_call_end(p, &calls[i],
                                 round == 0 && i == 3 ? SLUICE_OUTCOME_OVERLOAD : SLUICE_OUTCOME_OK,
                                 0);
    }
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_ON);
    cr_assert_eq(sluice_pool_stats(p).calls_overload, 1, "the operator still sees the 429");
    cr_assert_eq(sluice_pool_stats(p).active, 4, "the limit stays at the lock");
    cr_assert_eq(sluice_discovery_ceiling(sluice_pool_discovery(p)), 4);
    sluice_pool_destroy(p);
}

/* Past its phantom's end (the floor quantile from its start) a call released on trial most
 * likely still runs: until its lingering permit would have ended it is a shadow, and a refusal
 * beside it at the ceiling is the trial's answer too (lingering on), not a cap come down. */
Test(deadlines, a_refusal_a_released_call_may_still_explain_leaves_the_limit_at_the_lock)
{
    struct sluice_pool *p = locked_pool(4);
    struct sluice_call cut, calls[4];
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cut), SLUICE_OK);
    fake_clock_advance(&clk, 100 * MS);
    /* Released on trial: a phantom until 1 s from its start, a shadow until 1.1 s. */
    sluice_pool_call_abandon(p, &cut, SLUICE_ETIMEDOUT);
    fake_clock_advance(&clk, 950 * MS);
    for (int round = 0; round < 6; round++) { /* at the pace of the lock: 4 calls a second */
        cr_assert_eq(sluice_pool_stats(p).active, 4, "the limit stays at the lock");
        for (int i = 0; i < 4; i++)
            cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
        if (round == 0) {
            cr_assert_eq(calls[3].phantoms_at_start, 0, "past the floor: no phantom");
            cr_assert_eq(calls[3].shadows_at_start, 1, "... but perhaps still running");
        }
        fake_clock_advance(&clk, SEC);
        for (int i = 0; i < 4; i++)
            sluice_pool_call_end(p, &calls[i],
                                 round == 0 && i == 3 ? SLUICE_OUTCOME_OVERLOAD : SLUICE_OUTCOME_OK,
                                 0);
    }
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_ON,
                 "refused beside a call it released: the provider keeps working");
    cr_assert_eq(sluice_pool_stats(p).active, 4, "the limit stays at the lock");
    cr_assert_eq(sluice_discovery_ceiling(sluice_pool_discovery(p)), 4);
    sluice_pool_destroy(p);
}

/* A call released on trial while every shadow slot is taken is a phantom without a shadow, and
 * may outlive the shadows that were full: a call that starts then, with that phantom alone above
 * the ceiling, is refused beside it, and that is still the trial's answer (lingering on), not a
 * cap come down. Two permits; every call takes 1 s. */
Test(deadlines, a_refusal_beside_a_phantom_without_a_shadow_is_still_the_trials_answer)
{
    struct sluice_pool *p = locked_pool(2);
    struct sluice_call fill[2], late, calls[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &fill[i]), SLUICE_OK);
    fake_clock_advance(&clk, 100 * MS);
    for (int i = 0; i < 2; i++) /* phantoms until 1 s from their start, shadows until 1.1 s */
        sluice_pool_call_abandon(p, &fill[i], SLUICE_ETIMEDOUT);
    fake_clock_advance(&clk, 100 * MS);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &late), SLUICE_OK);
    fake_clock_advance(&clk, 850 * MS); /* 1.05 s: their phantoms are gone, their shadows not */
    sluice_pool_call_abandon(p, &late, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0, "released on trial: a phantom until 1.2 s");
    fake_clock_advance(&clk, 60 * MS); /* 1.11 s: the full shadows are gone, the phantom not */
    for (int i = 0; i < 2; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
    cr_assert_eq(calls[1].phantoms_at_start, 1);
    cr_assert_eq(calls[1].shadows_at_start, 0, "its shadow found every slot taken");
    fake_clock_advance(&clk, SEC);
    sluice_pool_call_end(p, &calls[0], SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &calls[1], SLUICE_OUTCOME_OVERLOAD, 0);
    cr_assert_eq(sluice_pool_stats(p).linger_now, SLUICE_LINGER_ON,
                 "refused beside a call it released: the provider keeps working");
    cr_assert_eq(sluice_pool_stats(p).active, 2, "the limit stays at the lock");
    cr_assert_eq(sluice_discovery_ceiling(sluice_pool_discovery(p)), 2);
    sluice_pool_destroy(p);
}

/* ---- a queue that stands is cut to its target (CoDel's sojourn rule) --------------------- */

Test(deadlines, a_queue_that_stands_refuses_what_would_wait_past_its_target_however_far_the_deadline)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){0});
    warm_up_stream(p, 16, 1 * SEC, 3 * SEC); /* target: 1 s to first byte; interval: 3 s */
    struct timespec far = deadline_in(600 * SEC);
    /* Each call waits 2 s for the permit of the one before: past the 1 s target, interval
     * after interval, the queue stands. */
    struct sluice_call cur;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur), SLUICE_OK);
    struct sluice_pool_waiter w[4];
    int status[4];
    for (int i = 0; i < 4; i++) {
        status[i] = 1;
        w[i] = (struct sluice_pool_waiter){.cb = record_status, .data = &status[i]};
        sluice_pool_call_begin_async(p, &w[i]);
        fake_clock_advance(&clk, 2 * SEC);
        sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0); /* w[i] starts, 2 s late */
        cr_assert_eq(status[i], SLUICE_OK);
        cr_assert_eq(w[i].call.queued_ns, 2 * SEC);
        cur = w[i].call;
    }
    cr_assert_eq(sluice_pool_predicted_wait(p), 3 * SEC, "one call ahead, 3 s each");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_ELATE,
                 "a 3 s wait into a standing queue: refused, though its deadline is 600 s off");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, NULL), SLUICE_OK, "no deadline: FIFO as ever");
    sluice_pool_leave(p);
    sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0);
    /* Calls that start without waiting do not end it: a queue held at its target waits less
     * than the target too. */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur), SLUICE_OK);
        fake_clock_advance(&clk, 2 * SEC);
        sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0);
    }
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_ELATE, "it still stands");
    sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0);
    /* A permit free right after a refusal is a gap between hand-offs, not a drained queue. */
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_OK, "a free permit: admitted");
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_ELATE,
                 "it stands: the rule refused a call less than an interval ago");
    sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0);
    /* An interval with no refusal, then a newcomer finds the permit free: the queue drained,
     * and the same call is admitted as far as its deadline allows. */
    fake_clock_advance(&clk, 3 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_OK);
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_OK);
    sluice_pool_leave(p);
    sluice_pool_call_end(p, &cur, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

/* With many permits the target is two hand-offs of a permit, not the time to first byte: a
 * newcomer may queue behind one call, not two. */
Test(deadlines, a_standing_queue_over_many_permits_is_cut_to_two_hand_offs)
{
    struct sluice_pool *p = make_pool(4, (struct sluice_deadline_desc){0});
    warm_up(p, 16, 4 * SEC); /* 4 s to the first byte and to the end: a permit frees every 1 s */
    struct timespec far = deadline_in(600 * SEC);
    struct sluice_call cur[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &cur[i]), SLUICE_OK);
    /* Every call now waits 3 s for its permit, past the 2 s target, interval after interval. */
    struct sluice_pool_waiter w[8];
    int status[8];
    for (int i = 0; i < 8; i++) {
        status[i] = 1;
        w[i] = (struct sluice_pool_waiter){.cb = record_status, .data = &status[i]};
        sluice_pool_call_begin_async(p, &w[i]);
        fake_clock_advance(&clk, 3 * SEC);
        sluice_pool_call_end(p, &cur[i % 4], SLUICE_OUTCOME_OK, 0);
        cr_assert_eq(status[i], SLUICE_OK);
        cur[i % 4] = w[i].call;
    }
    struct sluice_pool_waiter queued = {.cb = record_status, .data = &status[0]};
    sluice_pool_call_begin_async(p, &queued);
    cr_assert_eq(sluice_pool_predicted_wait(p), 2 * SEC, "one call ahead: two hand-offs");
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_OK, "a wait of 2 s: admitted");
    sluice_pool_leave(p);
    struct sluice_pool_waiter second = {.cb = record_status, .data = &status[1]};
    sluice_pool_call_begin_async(p, &second);
    cr_assert_eq(sluice_pool_predicted_wait(p), 3 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_ELATE,
                 "a 3 s wait (two calls ahead) into a standing queue whose target is 2 hand-offs "
                 "of 1 s: refused, though the 4 s to first byte would have admitted it");
    sluice_pool_call_end(p, &cur[0], SLUICE_OUTCOME_OK, 0); /* `queued` starts */
    sluice_pool_call_end(p, &cur[1], SLUICE_OUTCOME_OK, 0); /* `second` starts */
    cur[0] = queued.call;
    cur[1] = second.call;
    for (int i = 0; i < 4; i++)
        sluice_pool_call_end(p, &cur[i], SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

/* ---- the service estimate through deadlines (product-limit) ---------------------------------- */

Test(deadlines, the_service_estimate_counts_cut_calls_as_still_running_at_their_cut)
{
    struct sluice_service_time s;
    sluice_service_init(&s, 10);
    int64_t finished[] = {100, 120, 140, 160};
    for (int i = 0; i < 4; i++)
        sluice_service_add(&s, finished[i] * MS);
    for (int i = 0; i < 6; i++)
        sluice_service_add_censored(&s, 130 * MS); /* cut at 130 ms: longer than that */
    cr_assert_eq(sluice_service_expected(&s), 100 * MS);
    cr_assert_eq(sluice_service_median(&s), 140 * MS,
                 "the finished calls alone would say 120 ms: the cut ones outlived that");
    cr_assert_eq(sluice_service_high(&s), 160 * MS);
}

/* A refused caller never reaches the call paths that release lingering permits, so
 * admission releases those whose time has come before it counts the permits taken. */
Test(deadlines, admission_releases_a_lingering_permit_whose_time_has_come)
{
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){.linger = SLUICE_LINGER_ON});
    warm_up(p, 16, 1 * SEC);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    fake_clock_advance(&clk, 500 * MS);
    sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1);
    fake_clock_advance(&clk, 3 * SEC); /* long past its time; nothing else ran */
    /* 1.9 s fits a call on a free permit (1 s), not behind the lingering one (2 s). */
    struct timespec dl = deadline_in(1900 * MS);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).lingering, 0);
    sluice_pool_leave(p);
    sluice_pool_destroy(p);
}

/* A cold start's first SLUICE_SERVICE_MIN_SAMPLES + 1 calls, one at a time, each abandoned
 * for `why` after `ran` ns, each told to discovery as `outcome`. Until the last, no estimate
 * says how long calls run, so each keeps its permit as long again as it ran (its own cut
 * time is all that is known), and the next starts once that is over. */
static void cut_cold_calls(struct sluice_pool *p, int64_t ran, int why, enum sluice_outcome outcome)
{
    for (uint32_t i = 0; i <= SLUICE_SERVICE_MIN_SAMPLES; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        fake_clock_advance(&clk, ran);
        cr_assert_eq(sluice_pool_call_abandon(p, &call, why).outcome, outcome);
        cr_assert_eq(sluice_pool_stats(p).lingering, 1, "call %u: its permit lingers", i);
        cr_assert_eq(sluice_pool_next_release(p), fake_clock_now(&clk) + ran, "call %u", i);
        if (i < SLUICE_SERVICE_MIN_SAMPLES) {
            fake_clock_advance(&clk, ran);
            sluice_pool_poll(p);
            cr_assert_eq(sluice_pool_stats(p).lingering, 0, "call %u: released as long after", i);
        }
    }
}

/* A cold start whose every call is cut still keeps the permits of calls the provider may be
 * running: how long to keep them is known from the cut calls alone. */
Test(deadlines, a_cold_start_whose_every_call_is_cut_still_knows_how_long_to_linger)
{
    struct sluice_service_time s;
    sluice_service_init(&s, 10);
    for (int i = 0; i < (int)SLUICE_SERVICE_MIN_SAMPLES - 1; i++)
        sluice_service_add_censored(&s, (240 + i) * MS);
    cr_assert_eq(sluice_service_high(&s), 0, "too few calls yet");
    sluice_service_add_censored(&s, 250 * MS);
    cr_assert_eq(sluice_service_high(&s), 250 * MS, "every call ran at least this long");
    cr_assert_eq(sluice_service_median(&s), 0, "no call finished: the rules stay off");
    cr_assert_eq(sluice_service_expected(&s), 0);
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    cut_cold_calls(p, 250 * MS, SLUICE_ETIMEDOUT, SLUICE_OUTCOME_CENSORED);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1,
                 "once the cut calls say how long calls run, a cut call keeps its permit, "
                 "though no call has finished");
    /* A cut call after a short one: the estimate, not its own time, says how long. */
    struct sluice_call call;
    fake_clock_advance(&clk, 250 * MS);
    sluice_pool_poll(p);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    fake_clock_advance(&clk, 50 * MS);
    sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_next_release(p), fake_clock_now(&clk) + 250 * MS);
    sluice_pool_destroy(p);
}

/* The same when the callers hang up mid-call instead (a cancel, not a deadline: an HTTP
 * client's own timeout seen by sluice-proxy): discovery ignores those calls, but each ran at
 * least that long, so the estimate learns how long to keep their permits. */
Test(deadlines, a_cold_start_whose_callers_hang_up_mid_call_learns_how_long_to_linger)
{
    struct sluice_pool *p = make_pool(2, (struct sluice_deadline_desc){0});
    /* A cancel still says nothing to discovery (IGNORE). */
    cut_cold_calls(p, 200 * MS, SLUICE_ECANCELED, SLUICE_OUTCOME_IGNORE);
    cr_assert_eq(sluice_pool_stats(p).lingering, 1, "the cancelled calls said how long calls run");
    cr_assert_eq(sluice_pool_next_release(p), fake_clock_now(&clk) + 200 * MS);
    sluice_pool_destroy(p);
}

Test(deadlines, a_quantile_the_cut_calls_hide_is_unknown_so_the_rules_never_refuse_every_call)
{
    struct sluice_service_time s;
    sluice_service_init(&s, 10);
    for (int64_t i = 0; i < 4; i++)
        sluice_service_add(&s, (100 + 10 * i) * MS);
    for (int i = 0; i < 40; i++)
        sluice_service_add_censored(&s, 250 * MS); /* nearly every call cut at its deadline */
    cr_assert_eq(sluice_service_expected(&s), 0, "unknown, not 250 ms: a bound past every "
                                                 "deadline would refuse every call for good");
    cr_assert_eq(sluice_service_median(&s), 0);
    cr_assert_eq(sluice_service_high(&s), 250 * MS, "for lingering, the longest time seen");
    /* And a pool whose estimate is hidden so admits a call with a deadline. */
    struct sluice_pool *p = make_pool(1, (struct sluice_deadline_desc){.linger = SLUICE_LINGER_OFF});
    for (int i = 0; i < 4; i++)
        warm_up(p, 1, (100 + 10 * i) * MS);
    for (int i = 0; i < 40; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        fake_clock_advance(&clk, 250 * MS);
        sluice_pool_call_abandon(p, &call, SLUICE_ETIMEDOUT);
    }
    cr_assert_eq(sluice_pool_stats(p).expected_ns, 0);
    cr_assert(sluice_service_hidden(&s));
    struct timespec dl = deadline_in(250 * MS), far = deadline_in(600 * SEC);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &dl), SLUICE_OK, "a free permit: admitted");
    sluice_pool_leave(p);
    /* But no wait is known to be affordable: behind a taken permit, refused however far the
     * deadline, so calls start with their whole budget and the median shows again. */
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, &far), SLUICE_ELATE);
    cr_assert_eq(sluice_pool_admit_by(p, NULL, NULL), SLUICE_OK, "no deadline: FIFO as ever");
    sluice_pool_leave(p);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}
