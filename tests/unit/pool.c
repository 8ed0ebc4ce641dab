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

/* Refusals are counted per thread (struct sluice__pool_shard): with more threads than shards,
 * some share the fallback counter. Every refusal must be counted exactly once either way. */
#define REFUSALS_PER_THREAD SCALED(200000)

struct refuser {
    struct sluice_pool *pool;
    pthread_barrier_t *start; /* all at once, so that threads sharing a counter overlap */
    long refused;
};

static void *refuse_many(void *arg)
{
    struct refuser *r = (struct refuser *)arg;
    pthread_barrier_wait(r->start);
    for (int i = 0; i < REFUSALS_PER_THREAD; i++)
        r->refused += sluice_pool_admit(r->pool) == SLUICE_ECAPACITY;
    return NULL;
}

Test(pool, every_refusal_on_a_full_pool_is_counted_once_whatever_the_number_of_threads)
{
    enum { THREADS = 3 * SLUICE__POOL_REFUSAL_SHARDS };
    struct sluice_pool *p = make_pool(2, SLUICE_SOME(0));
    cr_assert_eq(admit_until_full(p, 10), 2);
    long expected = 1; /* admit_until_full's last try */
    for (int round = 0; round < 2; round++) { /* the second round counts in claimed shards */
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, THREADS);
        struct refuser r[THREADS];
        for (int i = 0; i < THREADS; i++)
            r[i] = (struct refuser){.pool = p, .start = &start};
        test_run_threads(THREADS, refuse_many, r, sizeof r[0]);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < THREADS; i++) {
            cr_assert_eq(r[i].refused, REFUSALS_PER_THREAD, "the pool is full: every admit refuses");
            expected += r[i].refused;
        }
        cr_assert_eq(sluice_pool_stats(p).refused_capacity, (uint64_t)expected,
                     "round %d: %ld refusals, %llu counted", round, expected,
                     (unsigned long long)sluice_pool_stats(p).refused_capacity);
    }
    cr_assert_eq(sluice_pool_stats(p).admitted, 2, "a refusal reserves nothing");
    leave_n(p, 2);
    sluice_pool_destroy(p);
}

Test(pool, unlimited_pool_never_rejects_and_has_no_gate)
{
    struct sluice_pool *p = make_pool(0, omitted);
    cr_assert_null(sluice__pool_gate(p));
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
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_EAGAIN);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_call_end(p, &b, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_OK);
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
        while (sluice_pool_stats(p).queued < (uint32_t)i + 1)
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
    cr_assert_eq(sluice_pool_stats(p).queued, 2);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    pthread_join(tids[0], NULL);
    pthread_join(tids[2], NULL);
    cr_assert_eq(w[0].order, 0);
    cr_assert_eq(w[2].order, 1);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_OK, "no permit was lost");
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
    cr_assert_eq(sluice_pool_stats(p).queued, 0);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_gate_tryacquire(sluice__pool_gate(p)), SLUICE_OK, "no permit was lost");
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

Test(pool, a_wall_clock_deadline_of_either_kind_fails_call_begin_with_einval_holding_nothing)
{
    struct sluice_pool *p = make_pool(4, omitted);
    struct timespec wall, soon = deadline_in(60 * SLUICE_NS_PER_SEC);
    clock_gettime(CLOCK_REALTIME, &wall);
    wall.tv_sec += 1; /* "in a second" from the wrong clock: 56 years ahead of CLOCK_MONOTONIC */
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin_by(p, NULL, &wall, NULL, &call), SLUICE_EINVAL);
    cr_assert_eq(sluice_pool_call_begin_by(p, &wall, NULL, NULL, &call), SLUICE_EINVAL);
    /* The later of two deadlines is checked too, though the earlier one ends any wait. */
    cr_assert_eq(sluice_pool_call_begin_by(p, &soon, &wall, NULL, &call), SLUICE_EINVAL);
    cr_assert_eq(sluice_pool_call_begin_by(p, &wall, &soon, NULL, &call), SLUICE_EINVAL);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    cr_assert_eq(sluice_pool_call_begin_by(p, &soon, &soon, NULL, &call), SLUICE_OK);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
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
    cr_assert_eq(sluice_pool_stats(p).queued, WAITING);
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
    cr_assert_eq(c.admitted + c.in_flight + c.queued, 0);
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
    cr_assert_eq(c.queued, 1);
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
    cr_assert_eq(sluice_gate_set_limit(sluice__pool_gate(p), 1), SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).active, 1);
    struct sluice_call a, b;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &a), SLUICE_OK);
    struct timespec past = deadline_in(SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_pool_call_begin(p, &past, NULL, &b), SLUICE_ETIMEDOUT);
    sluice_pool_call_end(p, &a, SLUICE_OUTCOME_OK, 0);
    sluice_pool_destroy(p);
}

/* ---- the async call path ----------------------------------------------------- */

/* An async call that records its callback and, when told, ends its call at once. */
struct async_call {
    struct sluice_pool_waiter w;
    int calls;       /* callback invocations */
    int status;      /* the last one's status */
    int order;       /* start order among OK callbacks */
    bool end_inline; /* call_end from inside the callback */
    _Atomic(int) *next_start;
};

static void async_cb(struct sluice_pool_waiter *w, int status)
{
    struct async_call *a = (struct async_call *)w->data;
    a->calls++;
    a->status = status;
    if (status == SLUICE_OK) {
        a->order = atomic_fetch_add(a->next_start, 1);
        if (a->end_inline)
            sluice_pool_call_end(w->sluice__pool, &w->call, SLUICE_OUTCOME_OK, 0);
    }
}

static void async_init(struct async_call *a, _Atomic(int) *next_start, bool end_inline)
{
    memset(a, 0xA5, sizeof *a); /* the pool owns every field but cb, data and the deadlines */
    a->w.cb = async_cb;
    a->w.data = a;
    a->w.deadline = NULL;
    a->w.start_deadline = NULL;
    a->calls = 0;
    a->status = 1;
    a->order = -1;
    a->end_inline = end_inline;
    a->next_start = next_start;
}

Test(pool, async_calls_join_the_fifo_line_with_blocking_calls_and_call_back_exactly_once)
{
    enum { N = 5 };
    struct sluice_pool *p = make_pool(1, omitted);
    _Atomic(int) next_start = 0;
    struct async_call first;
    async_init(&first, &next_start, false);
    sluice_pool_call_begin_async(p, &first.w);
    cr_assert_eq(first.calls, 1, "a free permit is granted inline");
    cr_assert_eq(first.status, SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 1, "an async call counts as in flight");
    struct async_call a[N];
    for (int i = 0; i < N; i++) {
        async_init(&a[i], &next_start, true);
        sluice_pool_call_begin_async(p, &a[i].w);
        cr_assert_eq(a[i].calls, 0);
    }
    cr_assert_eq(sluice_pool_stats(p).queued, N);
    sluice_pool_call_end(p, &first.w.call, SLUICE_OUTCOME_OK, 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(a[i].calls, 1, "call %d called back %d times", i, a[i].calls);
        cr_assert_eq(a[i].status, SLUICE_OK);
        cr_assert_eq(a[i].order, i + 1, "call %d started %d-th", i, a[i].order);
    }
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.in_flight, 0, "call_end balanced every async start (no underflow)");
    cr_assert_eq(c.queued, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(pool, cancel_async_withdraws_a_queued_call_and_says_eagain_once_it_started)
{
    struct sluice_pool *p = make_pool(1, omitted);
    _Atomic(int) next_start = 0;
    struct async_call holder, queued, after;
    async_init(&holder, &next_start, false);
    async_init(&queued, &next_start, false);
    async_init(&after, &next_start, false);
    sluice_pool_call_begin_async(p, &holder.w);
    sluice_pool_call_begin_async(p, &queued.w);
    sluice_pool_call_begin_async(p, &after.w);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &queued.w), SLUICE_OK);
    cr_assert_eq(queued.calls, 1);
    cr_assert_eq(queued.status, SLUICE_ECANCELED);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &holder.w), SLUICE_EAGAIN, "it already started");
    cr_assert_eq(holder.calls, 1, "no second callback");
    sluice_pool_call_end(p, &holder.w.call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(after.status, SLUICE_OK, "the withdrawn call left the line");
    cr_assert_eq(queued.calls, 1, "the withdrawn call was never granted");
    sluice_pool_call_end(p, &after.w.call, SLUICE_OUTCOME_OK, 0);
    assert_capacity_intact(p);
    sluice_pool_destroy(p);
}

Test(pool, async_calls_on_an_unlimited_pool_start_at_once)
{
    struct sluice_pool *p = make_pool(0, omitted);
    _Atomic(int) next_start = 0;
    struct async_call a;
    async_init(&a, &next_start, false);
    sluice_pool_call_begin_async(p, &a.w);
    cr_assert_eq(a.status, SLUICE_OK);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 1);
    cr_assert_eq(sluice_pool_call_cancel_async(p, &a.w), SLUICE_EAGAIN);
    sluice_pool_call_end(p, &a.w.call, SLUICE_OUTCOME_OK, 0);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    sluice_pool_destroy(p);
}

/* An event loop's chain: each callback ends its call and starts the next one. */
struct chain {
    struct sluice_pool_waiter w;
    long left;              /* calls still to start */
    long ok, closed;        /* callbacks by status */
    int depth, max_depth;   /* callbacks running on this thread, nested */
};

static void chain_cb(struct sluice_pool_waiter *w, int status)
{
    struct chain *c = (struct chain *)w->data;
    if (++c->depth > c->max_depth)
        c->max_depth = c->depth;
    if (status == SLUICE_OK) {
        c->ok++;
        sluice_pool_call_end(w->sluice__pool, &w->call, SLUICE_OUTCOME_OK, 0);
    } else {
        c->closed += status == SLUICE_ECLOSED;
    }
    if (--c->left > 0)
        sluice_pool_call_begin_async(w->sluice__pool, w); /* the record is ours again */
    c->depth--;
}

/* Run a chain of n calls on p and check that no callback ever ran inside another. */
static struct chain run_chain(struct sluice_pool *p, long n)
{
    struct chain c = {.w = {.cb = chain_cb}, .left = n};
    c.w.data = &c;
    sluice_pool_call_begin_async(p, &c.w);
    cr_assert_eq(c.left, 0, "%ld of %ld calls started", n - c.left, n);
    cr_assert_eq(c.max_depth, 1, "callbacks nested %d deep: one stack frame per call",
                 c.max_depth);
    return c;
}

Test(pool, a_chain_of_async_calls_on_an_unlimited_or_closed_pool_runs_in_constant_stack,
     .timeout = 60)
{
    /* A million nested frames would overflow any thread's stack (SIGSEGV). */
    const long n = SCALED(1000000);
    struct sluice_pool *p = make_pool(0, omitted);
    struct chain c = run_chain(p, n);
    cr_assert_eq(c.ok, n);
    cr_assert_eq(sluice_pool_stats(p).in_flight, 0);
    sluice_pool_close(p);
    c = run_chain(p, n);
    cr_assert_eq(c.closed, n, "a closed unlimited pool says ECLOSED to every call");
    sluice_pool_destroy(p);
    struct sluice_pool *limited = make_pool(1, omitted);
    sluice_pool_close(limited);
    c = run_chain(limited, n);
    cr_assert_eq(c.closed, n, "a closed limited pool likewise");
    sluice_pool_destroy(limited);
}

/* ---- close ---------------------------------------------------------------------- */

Test(pool, close_refuses_new_runs_and_wakes_every_queued_call_with_eclosed, .timeout = 20)
{
    struct sluice_pool *p = make_pool(1, SLUICE_SOME(4));
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &holder), SLUICE_OK);
    struct waiter w[2] = {0};
    pthread_t tids[2];
    _Atomic(int) next_grant = 0;
    queue_waiters(w, tids, 2, p, &next_grant);
    _Atomic(int) next_start = 0;
    struct async_call a;
    async_init(&a, &next_start, false);
    sluice_pool_call_begin_async(p, &a.w);
    cr_assert_eq(sluice_pool_stats(p).queued, 3);

    sluice_pool_close(p);
    for (int i = 0; i < 2; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(w[i].status, SLUICE_ECLOSED, "blocked call %d: %s", i,
                     sluice_status_name(w[i].status));
    }
    cr_assert_eq(a.calls, 1);
    cr_assert_eq(a.status, SLUICE_ECLOSED);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECLOSED, "no new admission");
    struct sluice_call late;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &late), SLUICE_ECLOSED);
    struct async_call b;
    async_init(&b, &next_start, false);
    sluice_pool_call_begin_async(p, &b.w);
    cr_assert_eq(b.status, SLUICE_ECLOSED, "a closed pool settles async calls inline");

    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert(c.closed);
    cr_assert_eq(c.in_flight, 1, "the call in flight was not interrupted");
    cr_assert_eq(c.queued, 0);
    sluice_pool_call_end(p, &holder, SLUICE_OUTCOME_OK, 0);
    sluice_pool_leave(p);
    cr_assert_eq(sluice_pool_stats(p).admitted, 0);
    sluice_pool_close(p); /* idempotent */
    sluice_pool_destroy(p);
}

Test(pool, an_unlimited_pool_can_be_closed_too)
{
    struct sluice_pool *p = make_pool(0, omitted);
    sluice_pool_close(p);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECLOSED);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_ECLOSED);
    sluice_pool_destroy(p);
}

/* ---- configuration messages ------------------------------------------------------- */

Test(pool, create_failures_name_the_field_to_fix)
{
    char err[256];
    struct sluice_pool *p = (struct sluice_pool *)1;
    struct sluice_pool_desc d = {.waiting = SLUICE_SOME(3), .error = err, .error_size = sizeof err};
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_EINVAL);
    cr_assert_null(p);
    cr_assert_str_eq(err, "sluice_pool_desc.waiting set without an active limit (set "
                          "sluice_pool_desc.active or drop waiting)");
    struct counting_alloc counter = {.fail_at = -1};
    struct sluice_allocator half = counting_allocator(&counter);
    half.free = NULL;
    d = (struct sluice_pool_desc){.active = 2, .allocator = &half, .error = err,
                                  .error_size = sizeof err};
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_EINVAL, "alloc without free is refused");
    cr_assert(strstr(err, "sluice_pool_desc.allocator"), "%s", err);
    cr_assert_eq(counter.calls, 0, "nothing was allocated with it");
    d.allocator = NULL;
    cr_assert_eq(sluice_pool_create(&d, &p), SLUICE_OK);
    cr_assert_str_eq(err, "", "success clears the message");
    sluice_pool_destroy(p);
}

Test(pool, stats_count_ended_calls_by_outcome)
{
    struct sluice_pool *p = make_pool(2, omitted);
    const enum sluice_outcome outcomes[] = {SLUICE_OUTCOME_OK, SLUICE_OUTCOME_OK,
                                            SLUICE_OUTCOME_OVERLOAD, SLUICE_OUTCOME_IGNORE,
                                            (enum sluice_outcome)77};
    for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        sluice_pool_call_end(p, &call, outcomes[i], 0);
    }
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.calls_ok, 2);
    cr_assert_eq(c.calls_overload, 1);
    cr_assert_eq(c.calls_ignored, 2, "an out-of-range outcome counts as ignored");
    sluice_pool_destroy(p);
}
