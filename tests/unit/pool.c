/* sluice/pool.h: immediate bounded admission and FIFO generation permits. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sluice/pool.h>

#include "run_fixtures.h"

static struct sluice_pool *make_pool(uint32_t active, struct sluice_opt_u32 waiting)
{
    struct sluice_pool *p;
    struct sluice_pool_desc d = {.active = active, .waiting = waiting};
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    return p;
}

static const struct sluice_opt_u32 omitted = {0};

/* Admit until rejected; returns how many got in (bounded so a bug cannot loop forever). */
static uint32_t admit_until_full(struct sluice_pool *p, uint32_t bound)
{
    uint32_t n = 0;
    while (n < bound && sluice_pool_admit(p) == SLUICE_OK)
        n++;
    return n;
}

static void leave_n(struct sluice_pool *p, uint32_t n)
{
    while (n--)
        sluice_pool_leave(p);
}

/* ---- admission ------------------------------------------------------------ */

Test(pool, admits_active_plus_waiting_runs_then_reports_ecapacity)
{
    struct sluice_pool *p = make_pool(4, SLUICE_SOME(3));
    cr_assert_eq(admit_until_full(p, 100), 7);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    cr_assert_eq(sluice_pool_stats(p).admitted, 7);
    leave_n(p, 7);
    sluice_pool_destroy(p);
}

Test(pool, omitted_waiting_defaults_to_1024_once_active_is_set)
{
    struct sluice_pool *p = make_pool(2, omitted);
    cr_assert_eq(sluice_pool_stats(p).waiting_capacity, 1024);
    cr_assert_eq(admit_until_full(p, 5000), 2 + 1024);
    leave_n(p, 2 + 1024);
    sluice_pool_destroy(p);
}

Test(pool, explicit_zero_waiting_admits_exactly_active_runs)
{
    struct sluice_pool *p = make_pool(3, SLUICE_SOME(0));
    cr_assert_eq(admit_until_full(p, 100), 3);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    leave_n(p, 3);
    sluice_pool_destroy(p);
}

Test(pool, leave_makes_the_admission_usable_again)
{
    struct sluice_pool *p = make_pool(1, SLUICE_SOME(1));
    cr_assert_eq(admit_until_full(p, 10), 2);
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    leave_n(p, 2);
    cr_assert_eq(sluice_pool_stats(p).admitted, 0);
    cr_assert_eq(admit_until_full(p, 10), 2);
    leave_n(p, 2);
    sluice_pool_destroy(p);
}

Test(pool, unlimited_pool_never_rejects_and_has_no_gate)
{
    struct sluice_pool *p = make_pool(0, omitted);
    cr_assert_null(sluice_pool_gate(p));
    cr_assert_eq(admit_until_full(p, 100000), 100000);
    struct sluice_call calls[64];
    for (int i = 0; i < 64; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &calls[i]), SLUICE_OK);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.in_flight, 64);
    cr_assert_eq(c.active, 0);
    for (int i = 0; i < 64; i++)
        sluice_pool_call_end(p, &calls[i], SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    leave_n(p, 100000);
    sluice_pool_destroy(p);
}

/* ---- configuration -------------------------------------------------------- */

Test(pool, create_rejects_waiting_without_an_active_limit)
{
    struct sluice_pool *p = (struct sluice_pool *)1;
    struct sluice_pool_desc d = {.waiting = SLUICE_SOME(0)};
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_EINVAL);
    cr_assert_null(p);
    char msg[128];
    cr_assert_eq(sluice__pool_check(0, SLUICE_SOME(4), "backends[2]", msg, sizeof msg),
                 SLUICE_EINVAL);
    cr_assert_str_eq(msg, "backends[2].waiting set without an active limit "
                          "(set backends[2].active or drop waiting)");
}

Test(pool, create_rejects_limits_above_the_documented_maxima)
{
    struct sluice_pool *p;
    struct sluice_pool_desc d = {.active = SLUICE_POOL_ACTIVE_MAX + 1};
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_EINVAL);
    d.active = 1;
    d.waiting = SLUICE_SOME(SLUICE_POOL_WAITING_MAX + 1);
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_EINVAL);
    d.active = SLUICE_POOL_ACTIVE_MAX;
    d.waiting = SLUICE_SOME(0);
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    sluice_pool_destroy(p);
}

Test(pool, allocates_only_through_the_hook_and_leaks_nothing_when_it_fails)
{
    struct sluice_pool_desc d = {.active = 8};
    long allocs = assert_allocation_failures_leak_nothing(&(struct alloc_failure_case){
        .desc = &d, .create = pool_create_with, .destroy = pool_destroy_any});
    cr_assert_eq(allocs, 1, "a pool makes exactly one allocation");
}

/* ---- generation permits ---------------------------------------------------- */

Test(pool, call_begin_takes_a_permit_and_call_end_gives_it_back)
{
    struct sluice_pool *p = make_pool(2, omitted);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &b), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 2);
    cr_assert_eq(sluice_gate_tryacquire(sluice_pool_gate(p)), SLUICE_EAGAIN);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice_pool_gate(p)), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(sluice_pool_gate(p)), SLUICE_OK);
    sluice_pool_destroy(p);
}

Test(pool, call_end_builds_the_sample_from_the_clock_hook)
{
    struct fake_clock fc = {1000};
    struct sluice_clock hook = fake_clock_hook(&fc);
    struct sluice_pool_desc d = {.active = 4, .clock = &hook};
    struct sluice_pool *p;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    struct sluice_call first, second;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &first), SLUICE_OK);
    fake_clock_advance(&fc, 50);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &second), SLUICE_OK);
    cr_assert_eq(first.in_flight_at_start, 1, "the call counts itself");
    cr_assert_eq(second.in_flight_at_start, 2);
    cr_assert_eq(second.queued_ns, 0);
    fake_clock_advance(&fc, 700);
    struct sluice_sample s = sluice_pool_call_end(p, &first, SLUICE_OUTCOME_OVERLOAD, 3000);
    cr_assert_eq(s.latency_ns, 750);
    cr_assert_eq(s.in_flight_at_start, 1);
    cr_assert_eq(s.outcome, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(s.retry_after_ns, 3000);
    s = sluice_pool_call_end(p, &second, SLUICE_OUTCOME_IGNORE, 0);
    cr_assert_eq(s.latency_ns, 700);
    cr_assert_eq(s.in_flight_at_start, 2);
    sluice_pool_destroy(p);
}

struct waiter {
    struct sluice_pool *pool;
    struct sluice_cancel cancel;
    const struct timespec *deadline;
    _Atomic(int) *next_grant; /* grant order is recorded here */
    int order;
    int status;
    struct sluice_call call;
};

static void *wait_for_permit(void *arg)
{
    struct waiter *w = (struct waiter *)arg;
    w->status = sluice_pool_call_begin(w->pool, w->deadline, &w->cancel, &w->call);
    if (w->status == SLUICE_OK) {
        w->order = atomic_fetch_add(w->next_grant, 1);
        sluice_pool_call_end(w->pool, &w->call, SLUICE_OUTCOME_OK, 0);
    }
    return NULL;
}

/* Start n waiters one at a time, each queued before the next arrives. */
static void queue_waiters(struct waiter *w, pthread_t *tids, int n, struct sluice_pool *p,
                          _Atomic(int) *next_grant)
{
    for (int i = 0; i < n; i++) {
        w[i].pool = p;
        w[i].next_grant = next_grant;
        w[i].order = -1;
        sluice_cancel_init(&w[i].cancel);
        pthread_create(&tids[i], NULL, wait_for_permit, &w[i]);
        while (sluice_pool_stats(p).waiting < (uint32_t)i + 1)
            sched_yield();
    }
}

Test(pool, waiting_calls_are_served_in_arrival_order)
{
    enum { N = 6 };
    struct sluice_pool *p = make_pool(1, omitted);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct waiter w[N] = {0};
    pthread_t tids[N];
    _Atomic(int) next_grant = 0;
    queue_waiters(w, tids, N, p, &next_grant);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    for (int i = 0; i < N; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(w[i].status, SLUICE_OK);
        cr_assert_eq(w[i].order, i, "waiter %d was served %d-th", i, w[i].order);
    }
    sluice_pool_destroy(p);
}

Test(pool, a_cancelled_waiter_leaves_the_line_and_the_next_one_is_served)
{
    struct sluice_pool *p = make_pool(1, omitted);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct waiter w[3] = {0};
    pthread_t tids[3];
    _Atomic(int) next_grant = 0;
    queue_waiters(w, tids, 3, p, &next_grant);
    sluice_cancel_fire(&w[1].cancel);
    pthread_join(tids[1], NULL);
    cr_assert_eq(w[1].status, SLUICE_ECANCELED);
    cr_assert_eq(sluice_pool_stats(p).waiting, 2);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    pthread_join(tids[0], NULL);
    pthread_join(tids[2], NULL);
    cr_assert_eq(w[0].order, 0);
    cr_assert_eq(w[2].order, 1);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice_pool_gate(p)), SLUICE_OK, "no permit was lost");
    sluice_pool_destroy(p);
}

Test(pool, deadline_expiry_while_queued_returns_etimedout_holding_nothing)
{
    struct sluice_pool *p = make_pool(1, omitted);
    struct sluice_call holder, late;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct timespec dl = deadline_in(2 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_pool_call_begin(p, &dl, NULL, &late), SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 1);
    cr_assert_eq(sluice_pool_stats(p).waiting, 0);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice_pool_gate(p)), SLUICE_OK, "no permit was lost");
    sluice_pool_destroy(p);
}

Test(pool, fired_token_fails_call_begin_even_when_a_permit_is_free)
{
    struct sluice_opt_u32 waitings[] = {omitted, {0}};
    for (int unlimited = 0; unlimited < 2; unlimited++) {
        struct sluice_pool *p = make_pool(unlimited ? 0 : 4, waitings[unlimited]);
        struct sluice_cancel token;
        sluice_cancel_init(&token);
        sluice_cancel_fire(&token);
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, &token, &call), SLUICE_ECANCELED);
        cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
        sluice_pool_destroy(p);
    }
}

Test(pool, passed_deadline_fails_call_begin_even_when_a_permit_is_free)
{
    struct sluice_pool *p = make_pool(4, omitted);
    struct timespec past = deadline_in(-SLUICE_NS_PER_MS);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, &past, NULL, &call), SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    sluice_pool_destroy(p);
}

Test(pool, cancel_wins_over_a_passed_deadline)
{
    struct sluice_pool *p = make_pool(1, omitted);
    struct sluice_call holder, call;
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    sluice_cancel_fire(&token);
    struct timespec past = deadline_in(-SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_pool_call_begin(p, &past, &token, &call), SLUICE_ECANCELED);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, &past, &token, &call), SLUICE_ECANCELED);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

Test(pool, every_admitted_run_can_queue_at_once_and_each_wait_honours_its_token)
{
    enum { ACTIVE = 2, WAITING = 6 };
    struct sluice_pool *p = make_pool(ACTIVE, SLUICE_SOME(WAITING));
    cr_assert_eq(admit_until_full(p, 100), ACTIVE + WAITING);
    struct sluice_call holders[ACTIVE];
    for (int i = 0; i < ACTIVE; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holders[i]), SLUICE_OK);
    struct waiter w[WAITING] = {0};
    pthread_t tids[WAITING];
    _Atomic(int) next_grant = 0;
    queue_waiters(w, tids, WAITING, p, &next_grant);
    cr_assert_eq(sluice_pool_stats(p).waiting, WAITING);
    for (int i = 0; i < WAITING; i++)
        sluice_cancel_fire(&w[i].cancel);
    for (int i = 0; i < WAITING; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(w[i].status, SLUICE_ECANCELED);
    }
    for (int i = 0; i < ACTIVE; i++)
        sluice_pool_call_end(p, &holders[i], SLUICE_OUTCOME_OK, 0);
    leave_n(p, ACTIVE + WAITING);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.admitted + c.in_flight + c.waiting, 0);
    sluice_pool_destroy(p);
}

/*
 * Abandoned waits behind a slow holder must leave nothing behind that a later
 * wait has to get past: with the first, ticket-and-slot gate, the wait after
 * them spun for a slot, deaf to its deadline, until the holder finished (this
 * test hung; the timeout turns that into a failure), and capacity after the
 * failures must equal capacity before.
 */
Test(pool, abandoned_waits_never_hold_a_later_wait_past_its_deadline, .timeout = 60)
{
    enum { ACTIVE = 1, WAITING = 1, TRIES = 16 * (ACTIVE + WAITING) };
    struct sluice_pool *p = make_pool(ACTIVE, SLUICE_SOME(WAITING));
    struct sluice_call holder, late;
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    for (int i = 0; i < TRIES; i++) {
        cr_assert_eq(sluice_pool_admit(p), SLUICE_OK, "abandoned wait %d cost capacity", i);
        struct timespec dl = deadline_in(SLUICE_NS_PER_MS);
        cr_assert_eq(sluice_pool_call_begin(p, &dl, NULL, &late), SLUICE_ETIMEDOUT);
        sluice_pool_leave(p);
    }
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_leave(p);
    cr_assert_eq(admit_until_full(p, 100), ACTIVE + WAITING, "capacity came back in full");
    leave_n(p, ACTIVE + WAITING);
    sluice_pool_destroy(p);
}

/* ---- stats and the discovery seam ---------------------------------------- */

Test(pool, stats_report_admitted_in_flight_waiting_and_both_limits)
{
    struct sluice_pool *p = make_pool(1, SLUICE_SOME(5));
    cr_assert_eq(admit_until_full(p, 3), 3);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct waiter w[1] = {0};
    pthread_t tid;
    _Atomic(int) next_grant = 0;
    queue_waiters(w, &tid, 1, p, &next_grant);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.admitted, 3);
    cr_assert_eq(c.in_flight, 1);
    cr_assert_eq(c.waiting, 1);
    cr_assert_eq(c.active, 1);
    cr_assert_eq(c.waiting_capacity, 5);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    pthread_join(tid, NULL);
    leave_n(p, 3);
    sluice_pool_destroy(p);
}

Test(pool, a_limit_set_on_the_pool_gate_governs_later_calls)
{
    struct sluice_pool *p = make_pool(4, omitted);
    cr_assert_eq(sluice_gate_set_limit(sluice_pool_gate(p), 1), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).active, 1);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    struct timespec past = deadline_in(SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_pool_call_begin(p, &past, NULL, &b), SLUICE_ETIMEDOUT);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}
