/* The FIFO permit gate: each test is named after the promise it checks. */
#include <criterion/criterion.h>
#include <sluice/gate.h>

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

Test(gate, uncontended_acquire_release_tracks_in_flight)
{
    struct sluice_gate *g = make_gate(2);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 2);
    cr_assert_eq(c.waiting, 0);
    cr_assert_eq(c.limit, 2);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

Test(gate, create_init_and_set_limit_reject_an_out_of_range_limit)
{
    struct sluice_gate *g = NULL;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = SLUICE_GATE_LIMIT_MAX + 1}, &g),
                 SLUICE_EINVAL);
    cr_assert_null(g);
    struct sluice_gate gate;
    cr_assert_eq(sluice_gate_init(&gate, SLUICE_GATE_LIMIT_MAX + 1), SLUICE_EINVAL);
    cr_assert_eq(sluice_gate_init(&gate, 0), SLUICE_OK, "limit 0 is a valid, closed-off gate");
    cr_assert_eq(sluice_gate_tryacquire(&gate), SLUICE_EAGAIN);
    cr_assert_eq(sluice_gate_set_limit(&gate, SLUICE_GATE_LIMIT_MAX + 1), SLUICE_EINVAL);
}

/* ---- FIFO ---------------------------------------------------------------- */

struct fifo_ctx {
    struct sluice_gate *g;
    _Atomic(int) order[32];
    _Atomic(int) n_served;
};

struct fifo_arg {
    struct fifo_ctx *ctx;
    int id;
};

static void *fifo_waiter(void *p)
{
    struct fifo_arg *a = p;
    cr_assert_eq(sluice_gate_acquire(a->ctx->g, NULL, NULL), SLUICE_OK);
    int pos = atomic_fetch_add(&a->ctx->n_served, 1);
    atomic_store(&a->ctx->order[pos], a->id);
    sluice_gate_release(a->ctx->g);
    return NULL;
}

Test(gate, grants_follow_ticket_order_under_contention)
{
    enum { N = 16 };
    struct fifo_ctx ctx = {.g = make_gate(1)};
    struct fifo_arg args[N];
    pthread_t tids[N];
    cr_assert_eq(sluice_gate_acquire(ctx.g, NULL, NULL), SLUICE_OK);
    for (int i = 0; i < N; i++) {
        args[i] = (struct fifo_arg){&ctx, i};
        pthread_create(&tids[i], NULL, fifo_waiter, &args[i]);
        /* Thread i is queued before thread i+1 takes its ticket. */
        WAIT_UNTIL(sluice_gate_stats(ctx.g).waiting == (uint32_t)i + 1);
    }
    sluice_gate_release(ctx.g);
    for (int i = 0; i < N; i++)
        pthread_join(tids[i], NULL);
    for (int i = 0; i < N; i++)
        cr_assert_eq(atomic_load(&ctx.order[i]), i, "grant %d went to thread %d", i,
                     atomic_load(&ctx.order[i]));
    struct sluice_gate_counts c = sluice_gate_stats(ctx.g);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_destroy(ctx.g);
}

static void *acquire_and_hold(void *p)
{
    struct sluice_gate *g = p;
    return (void *)(intptr_t)sluice_gate_acquire(g, NULL, NULL);
}

Test(gate, tryacquire_never_barges_past_a_queued_waiter)
{
    struct sluice_gate *g = make_gate(1);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    pthread_t waiter;
    pthread_create(&waiter, NULL, acquire_and_hold, g);
    WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    /* The released permit belongs to the queued waiter, even before it wakes. */
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    void *rc;
    pthread_join(waiter, &rc);
    cr_assert_eq((int)(intptr_t)rc, SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN, "the waiter still holds the permit");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

/* ---- deadlines and cancellation ------------------------------------------ */

Test(gate, deadline_expiry_returns_etimedout_and_loses_no_permit)
{
    struct sluice_gate *g = make_gate(1);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct timespec dl;
    cr_assert_eq(sluice_gate_acquire(g, sluice_deadline_in(&dl, 5 * SLUICE_NS_PER_MS), NULL),
                 SLUICE_ETIMEDOUT);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.waiting, 0);
    cr_assert_eq(c.in_flight, 1);
    sluice_gate_release(g); /* the frontier skips the abandoned ticket */
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN, "a skipped ticket must not add a permit");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

struct cancel_arg {
    struct sluice_gate *g;
    struct sluice_cancel *cancel;
    const struct timespec *deadline;
    int status;
};

static void *acquire_with_cancel(void *p)
{
    struct cancel_arg *a = p;
    a->status = sluice_gate_acquire(a->g, a->deadline, a->cancel);
    return NULL;
}

Test(gate, firing_a_token_wakes_every_wait_using_it_with_ecanceled)
{
    enum { N = 4 };
    struct sluice_gate *g = make_gate(1);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct cancel_arg args[N];
    pthread_t tids[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct cancel_arg){.g = g, .cancel = &token, .status = 99};
        pthread_create(&tids[i], NULL, acquire_with_cancel, &args[i]);
    }
    WAIT_UNTIL(sluice_gate_stats(g).waiting == N);
    usleep(2000); /* let them get past spinning into the kernel */
    sluice_cancel_fire(&token);
    sluice_cancel_fire(&token); /* idempotent */
    for (int i = 0; i < N; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(args[i].status, SLUICE_ECANCELED);
    }
    /* The holder was never interrupted, and every cancelled ticket is skipped. */
    cr_assert_eq(sluice_gate_stats(g).in_flight, 1);
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

Test(gate, cancel_wins_over_an_expired_deadline)
{
    struct sluice_gate *g = make_gate(1);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct timespec past;
    sluice_deadline_in(&past, -SLUICE_NS_PER_SEC);
    sluice_cancel_fire(&token);
    cr_assert_eq(sluice_gate_acquire(g, &past, &token), SLUICE_ECANCELED);
    sluice_gate_release(g);
    /* A fired token fails even an acquire that would not have had to wait. */
    cr_assert_eq(sluice_gate_acquire(g, NULL, &token), SLUICE_ECANCELED);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

/* ---- limit changes ------------------------------------------------------- */

static _Atomic(int) granted_count;

static void *acquire_count_release_later(void *p)
{
    struct sluice_gate *g = p;
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    atomic_fetch_add(&granted_count, 1);
    return NULL;
}

Test(gate, raising_the_limit_wakes_the_newly_eligible_waiters)
{
    enum { N = 3 };
    struct sluice_gate *g = make_gate(1);
    atomic_store(&granted_count, 0);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    pthread_t tids[N];
    for (int i = 0; i < N; i++)
        pthread_create(&tids[i], NULL, acquire_count_release_later, g);
    WAIT_UNTIL(sluice_gate_stats(g).waiting == N);
    cr_assert_eq(sluice_gate_set_limit(g, 3), SLUICE_OK);
    WAIT_UNTIL(atomic_load(&granted_count) == 2);
    cr_assert_eq(sluice_gate_stats(g).waiting, 1, "limit 3 with 3 holders leaves one queued");
    cr_assert_eq(sluice_gate_set_limit(g, 4), SLUICE_OK);
    for (int i = 0; i < N; i++)
        pthread_join(tids[i], NULL);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 4);
    for (int i = 0; i < 4; i++)
        sluice_gate_release(g);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

Test(gate, lowering_the_limit_lets_holders_finish_and_grants_nobody_above_it)
{
    struct sluice_gate *g = make_gate(3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_set_limit(g, 1), SLUICE_OK);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.limit, 1);
    cr_assert_eq(c.in_flight, 3, "holders are never interrupted");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN, "2 holders > limit 1");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN, "1 holder = limit 1");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    /* Lower to zero with free permits: nothing is granted until raised again. */
    cr_assert_eq(sluice_gate_set_limit(g, 0), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    cr_assert_eq(sluice_gate_set_limit(g, 2), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

struct counted_grant {
    struct sluice_gate_waiter w;
    int status, calls;
};

static void counted_grant_cb(struct sluice_gate_waiter *w, int status)
{
    struct counted_grant *c = (struct counted_grant *)w;
    c->status = status;
    c->calls++;
}

Test(gate, a_waiter_behind_a_limit_cut_is_granted_only_once_holders_drop_below_the_new_limit)
{
    struct sluice_gate *g = make_gate(3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_set_limit(g, 1), SLUICE_OK);
    struct counted_grant waiter = {.w = {.cb = counted_grant_cb}, .status = 99};
    sluice_gate_acquire_async(g, &waiter.w);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.waiting, 1, "waiting %u while a cut is outstanding", c.waiting);
    cr_assert_eq(c.in_flight, 3);
    sluice_gate_release(g);
    sluice_gate_release(g);
    cr_assert_eq(waiter.calls, 0, "1 holder left, limit 1: no grant yet");
    cr_assert_eq(sluice_gate_stats(g).waiting, 1);
    sluice_gate_release(g);
    cr_assert_eq(waiter.calls, 1);
    cr_assert_eq(waiter.status, SLUICE_OK);
    c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 1);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

/* ---- close --------------------------------------------------------------- */

Test(gate, close_wakes_every_waiter_with_eclosed_and_refuses_later_acquires)
{
    enum { N = 5 };
    struct sluice_gate *g = make_gate(1);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct cancel_arg args[N];
    pthread_t tids[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct cancel_arg){.g = g, .status = 99};
        pthread_create(&tids[i], NULL, acquire_with_cancel, &args[i]);
    }
    WAIT_UNTIL(sluice_gate_stats(g).waiting == N);
    usleep(2000);
    sluice_gate_close(g);
    for (int i = 0; i < N; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(args[i].status, SLUICE_ECLOSED);
    }
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_ECLOSED);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_ECLOSED);
    sluice_gate_release(g); /* holders may still release after close */
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    cr_assert_eq(sluice_gate_stats(g).waiting, 0);
    sluice_gate_destroy(g);
}

/* ---- async waiters ------------------------------------------------------- */

struct async_probe {
    struct sluice_gate_waiter w;
    int calls;
    int status;
};

static void async_cb(struct sluice_gate_waiter *w, int status)
{
    struct async_probe *p = w->data;
    p->calls++;
    p->status = status;
}

static void async_arm(struct async_probe *p)
{
    *p = (struct async_probe){.calls = 0, .status = 99};
    p->w.cb = async_cb;
    p->w.data = p;
}

static void async_start(struct sluice_gate *g, struct async_probe *p)
{
    async_arm(p);
    sluice_gate_acquire_async(g, &p->w);
}

Test(gate, async_callback_runs_exactly_once_for_grant_cancel_and_close)
{
    struct sluice_gate *g = make_gate(1);
    struct async_probe now, queued, cancelled, closed;
    async_start(g, &now);
    cr_assert_eq(now.calls, 1, "a free permit is granted inline");
    cr_assert_eq(now.status, SLUICE_OK);

    async_start(g, &queued);
    async_start(g, &cancelled);
    async_start(g, &closed);
    cr_assert_eq(queued.calls + cancelled.calls + closed.calls, 0);
    cr_assert_eq(sluice_gate_stats(g).waiting, 3);

    cr_assert_eq(sluice_gate_cancel_async(g, &cancelled.w), SLUICE_OK);
    cr_assert_eq(cancelled.calls, 1);
    cr_assert_eq(cancelled.status, SLUICE_ECANCELED);
    cr_assert_eq(sluice_gate_cancel_async(g, &cancelled.w), SLUICE_EAGAIN, "only once");

    sluice_gate_release(g); /* permit passes to `queued`, skipping nobody else */
    cr_assert_eq(queued.calls, 1);
    cr_assert_eq(queued.status, SLUICE_OK);
    cr_assert_eq(sluice_gate_cancel_async(g, &queued.w), SLUICE_EAGAIN, "too late to cancel a grant");
    cr_assert_eq(queued.calls, 1);

    sluice_gate_close(g);
    cr_assert_eq(closed.calls, 1);
    cr_assert_eq(closed.status, SLUICE_ECLOSED);
    sluice_gate_close(g);
    cr_assert_eq(closed.calls, 1, "close is idempotent");

    struct async_probe late;
    async_start(g, &late);
    cr_assert_eq(late.calls, 1);
    cr_assert_eq(late.status, SLUICE_ECLOSED);
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}

Test(gate, async_grant_skips_a_cancelled_async_waiter)
{
    struct sluice_gate *g = make_gate(1);
    struct async_probe holder, a, b;
    async_start(g, &holder);
    async_start(g, &a);
    async_start(g, &b);
    cr_assert_eq(sluice_gate_cancel_async(g, &a.w), SLUICE_OK);
    sluice_gate_release(g);
    cr_assert_eq(b.calls, 1);
    cr_assert_eq(b.status, SLUICE_OK);
    cr_assert_eq(a.calls, 1);
    cr_assert_eq(a.status, SLUICE_ECANCELED);
    sluice_gate_release(g);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_destroy(g);
}

/* ---- allocation ---------------------------------------------------------- */

Test(gate, create_refuses_an_allocator_with_only_one_of_alloc_and_free)
{
    struct counting_alloc counts = {.fail_at = -1};
    struct sluice_allocator half = {counting_alloc_fn, NULL, &counts};
    struct sluice_gate *g = (struct sluice_gate *)1;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 2, .allocator = &half}, &g),
                 SLUICE_EINVAL);
    cr_assert_null(g);
    cr_assert_eq(counts.calls, 0, "nothing allocated through a half allocator");
}

Test(gate, acquire_and_release_never_allocate)
{
    struct counting_alloc counts = {.fail_at = -1};
    struct sluice_allocator a = counting_allocator(&counts);
    struct sluice_gate *g;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 2, .allocator = &a}, &g),
                 SLUICE_OK);
    long after_create = counts.calls;
    cr_assert_gt(after_create, 0);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    struct timespec dl;
    for (int i = 0; i < 1000000; i++) {
        cr_assert_eq(sluice_gate_acquire(g, NULL, &token), SLUICE_OK);
        cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
        sluice_gate_release(g);
        sluice_gate_release(g);
    }
    /* The waiting path too: a timed-out wait and a cancelled wait. */
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, sluice_deadline_in(&dl, SLUICE_NS_PER_MS), &token),
                 SLUICE_ETIMEDOUT);
    sluice_gate_release(g);
    sluice_gate_release(g);
    cr_assert_eq(counts.calls, after_create);
    cr_assert_eq(counts.live, after_create, "nothing freed either");
    sluice_gate_destroy(g);
    cr_assert_eq(counts.live, 0);
}

/* ---- async callbacks that call back into the gate ------------------------- */

struct chained {
    struct sluice_gate_waiter w;
    struct sluice_gate *g;
    int calls;
    int status;
};

static long chained_calls;

static void release_from_callback(struct sluice_gate_waiter *w, int status)
{
    struct chained *c = (struct chained *)w;
    c->calls++;
    c->status = status;
    chained_calls++;
    if (status == SLUICE_OK)
        sluice_gate_release(c->g); /* grants the next async waiter from inside this callback */
}

Test(gate, a_release_inside_an_async_callback_hands_off_iteratively_not_recursively, .timeout = 60)
{
    /* One frame per queued waiter would need far more stack than a thread
     * has: the hand-offs must run one after another on the outermost frame. */
    const long n = SCALED(1000000);
    struct sluice_gate *g = make_gate(1);
    struct chained *recs = calloc((size_t)n, sizeof *recs);
    cr_assert_not_null(recs);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    chained_calls = 0;
    for (long i = 0; i < n; i++) {
        recs[i].w.cb = release_from_callback;
        recs[i].g = g;
        recs[i].status = 99;
        sluice_gate_acquire_async(g, &recs[i].w);
    }
    cr_assert_eq(sluice_gate_stats(g).waiting, (uint32_t)n);
    sluice_gate_release(g);
    cr_assert_eq(chained_calls, n, "%ld of %ld callbacks ran", chained_calls, n);
    for (long i = 0; i < n; i++) {
        if (recs[i].calls != 1 || recs[i].status != SLUICE_OK)
            cr_assert_fail("waiter %ld: %d calls, status %d", i, recs[i].calls, recs[i].status);
    }
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.waiting, 0);
    free(recs);
    sluice_gate_destroy(g);
}

/* A record the caller reuses without clearing: acquire_async must not trust
 * anything the gate's private fields held before the call. */
static void dirty_record(struct counted_grant *rec, bool stale_queued)
{
    memset(rec, 0xA5, sizeof *rec);
    if (stale_queued) {
        memset(&rec->w.sluice__node, 0, sizeof rec->w.sluice__node);
        rec->w.sluice__node.queued = true;
    }
    rec->w.cb = counted_grant_cb;
    rec->calls = 0;
    rec->status = 99;
}

Test(gate, cancel_async_after_an_inline_outcome_returns_eagain_whatever_the_record_held)
{
    for (int stale = 0; stale < 2; stale++) {
        struct sluice_gate *g = make_gate(2);
        struct counted_grant holder, granted;
        /* A queued waiter whose links a corrupted unlink would overwrite. */
        struct counted_grant queued = {.w = {.cb = counted_grant_cb}, .status = 99};
        dirty_record(&holder, stale);
        sluice_gate_acquire_async(g, &holder.w);
        dirty_record(&granted, stale);
        sluice_gate_acquire_async(g, &granted.w);
        cr_assert_eq(granted.calls, 1, "a free permit is granted inline");
        cr_assert_eq(granted.status, SLUICE_OK);
        sluice_gate_acquire_async(g, &queued.w);
        cr_assert_eq(sluice_gate_cancel_async(g, &granted.w), SLUICE_EAGAIN, "stale=%d", stale);
        cr_assert_eq(granted.calls, 1, "the callback ran once");
        struct sluice_gate_counts c = sluice_gate_stats(g);
        cr_assert_eq(c.in_flight, 2);
        cr_assert_eq(c.waiting, 1, "stale=%d: waiting %u", stale, c.waiting);
        sluice_gate_release(g);
        cr_assert_eq(queued.calls, 1, "the queued waiter is still in line");
        cr_assert_eq(queued.status, SLUICE_OK);

        /* Closed: the inline outcome is ECLOSED, and cancel is too late. */
        sluice_gate_close(g);
        struct counted_grant late;
        dirty_record(&late, stale);
        sluice_gate_acquire_async(g, &late.w);
        cr_assert_eq(late.calls, 1);
        cr_assert_eq(late.status, SLUICE_ECLOSED);
        cr_assert_eq(sluice_gate_cancel_async(g, &late.w), SLUICE_EAGAIN);
        cr_assert_eq(late.calls, 1);
        sluice_gate_release(g);
        sluice_gate_release(g);
        c = sluice_gate_stats(g);
        cr_assert_eq(c.in_flight, 0);
        cr_assert_eq(c.waiting, 0);
        sluice_gate_destroy(g);
    }
}

/* ---- a slow async callback does not delay the sync waiter behind it ------- */

struct slow_cb {
    struct sluice_gate_waiter w;
    struct sluice_gate *g;
    struct sluice_cancel *fire; /* NULL: pass the permit on instead */
    _Atomic(int) *sync_done;
    _Atomic(int) saw_sync_done;
};

/* Granted the permit, then: let the sync waiter behind it go (grant or cancel),
 * and "work" up to 300 ms, noting whether that waiter returned meanwhile. */
static void slow_callback(struct sluice_gate_waiter *w, int status)
{
    struct slow_cb *s = (struct slow_cb *)w;
    cr_assert_eq(status, SLUICE_OK);
    if (s->fire)
        sluice_cancel_fire(s->fire);
    else
        sluice_gate_release(s->g);
    int64_t until = sluice_monotonic_ns() + 300 * SLUICE_NS_PER_MS;
    while (!atomic_load(s->sync_done) && sluice_monotonic_ns() < until)
        usleep(500);
    atomic_store(&s->saw_sync_done, atomic_load(s->sync_done));
    if (s->fire)
        sluice_gate_release(s->g);
}

struct sync_waiter {
    struct sluice_gate *g;
    struct sluice_cancel *cancel;
    _Atomic(int) done;
    int status;
};

static void *sync_waiter_thread(void *p)
{
    struct sync_waiter *s = p;
    s->status = sluice_gate_acquire(s->g, NULL, s->cancel);
    atomic_store(&s->done, 1);
    return NULL;
}

static void run_slow_callback_case(bool cancel_case)
{
    struct sluice_gate *g = make_gate(1);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct sync_waiter s = {.g = g, .cancel = cancel_case ? &token : NULL, .status = 99};
    struct slow_cb a = {.w = {.cb = slow_callback}, .g = g, .sync_done = &s.done};
    a.fire = cancel_case ? &token : NULL;
    sluice_gate_acquire_async(g, &a.w);
    pthread_t tid;
    pthread_create(&tid, NULL, sync_waiter_thread, &s);
    WAIT_UNTIL(sluice_gate_stats(g).waiting == 2);
    usleep(5000); /* the sync waiter, not next in line, is asleep in the kernel */
    sluice_gate_release(g); /* A is granted, S becomes next in line; A's callback runs here */
    pthread_join(tid, NULL);
    cr_assert(atomic_load(&a.saw_sync_done),
              "the sync waiter returned only after the 300 ms callback ended");
    cr_assert_eq(s.status, cancel_case ? SLUICE_ECANCELED : SLUICE_OK);
    if (!cancel_case)
        sluice_gate_release(g);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_destroy(g);
}

Test(gate, a_sync_waiter_granted_from_a_slow_async_callback_returns_while_it_still_runs,
     .timeout = 20)
{
    run_slow_callback_case(false);
}

Test(gate, a_sync_waiter_cancelled_from_a_slow_async_callback_returns_while_it_still_runs,
     .timeout = 20)
{
    run_slow_callback_case(true);
}

/* ---- a waiter whose grant is in transit parks rather than spins ----------- */

struct timed_waiter {
    struct sluice_gate *g;
    struct timespec deadline;
    int status;
    int64_t cpu_ns;
};

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return sluice_timespec_ns(&ts);
}

static void *timed_waiter_thread(void *p)
{
    struct timed_waiter *t = p;
    int64_t cpu0 = thread_cpu_ns();
    t->status = sluice_gate_acquire(t->g, &t->deadline, NULL);
    t->cpu_ns = thread_cpu_ns() - cpu0;
    return NULL;
}

Test(gate, a_timed_out_waiter_whose_grant_is_still_in_transit_parks_instead_of_spinning,
     .timeout = 20)
{
    struct sluice_gate *g = make_gate(1);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct timed_waiter t = {.g = g, .status = 99};
    sluice_deadline_in(&t.deadline, 100 * SLUICE_NS_PER_MS);
    pthread_t tid;
    pthread_create(&tid, NULL, timed_waiter_thread, &t);
    WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
    /* Pop the waiter's grant, then hand it out only 400 ms later (as a
     * caller of collect does after a slow stretch under its own lock): the
     * waiter times out meanwhile and must wait for its verdict. */
    struct sluice_gate_node *granted = sluice_gate_set_limit_collect(g, 2);
    cr_assert_not_null(granted, "the waiter left before the grant; machine too slow");
    usleep(400000);
    sluice_gate_notify_chain(granted);
    pthread_join(tid, NULL);
    cr_assert_eq(t.status, SLUICE_ETIMEDOUT);
    cr_assert_lt(t.cpu_ns, 100 * SLUICE_NS_PER_MS,
                 "the waiter burnt %.0f ms of CPU waiting for a verdict", t.cpu_ns / 1e6);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 1, "the grant that came too late was passed on");
    cr_assert_eq(c.waiting, 0);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

/* ---- deadlines must be normalised ------------------------------------------ */

Test(gate, an_unnormalised_deadline_is_rejected_with_einval_not_busy_waited, .timeout = 10)
{
    struct sluice_gate *g = make_gate(1);
    struct timespec future;
    sluice_deadline_in(&future, 200 * SLUICE_NS_PER_MS);
    struct timespec bad[] = {{.tv_sec = future.tv_sec, .tv_nsec = SLUICE_NS_PER_SEC},
                             {.tv_sec = future.tv_sec, .tv_nsec = -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* Whether or not the call would have to wait. */
        cr_assert_eq(sluice_gate_acquire(g, &bad[i], NULL), SLUICE_EINVAL);
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        int64_t t0 = sluice_monotonic_ns();
        cr_assert_eq(sluice_gate_acquire(g, &bad[i], NULL), SLUICE_EINVAL);
        cr_assert_lt(sluice_monotonic_ns() - t0, 100 * SLUICE_NS_PER_MS, "rejected, not waited");
        struct sluice_gate_counts c = sluice_gate_stats(g);
        cr_assert_eq(c.in_flight, 1);
        cr_assert_eq(c.waiting, 0);
        sluice_gate_release(g);
    }
    _Atomic(uint32_t) word = 1;
    cr_assert_eq(sluice_futex_wait(&word, 1, &bad[0]), SLUICE_EINVAL);
    struct timespec past;
    cr_assert_eq(sluice_futex_wait(&word, 1, sluice_deadline_in(&past, -SLUICE_NS_PER_MS)),
                 SLUICE_ETIMEDOUT);
    cr_assert_eq(sluice_futex_wait(&word, 0, NULL), SLUICE_OK, "the word already moved on");
    sluice_gate_destroy(g);
}

Test(gate, a_wall_clock_deadline_is_einval_once_the_call_must_wait_not_a_wait_without_end,
     .timeout = 10)
{
    struct sluice_gate *g = make_gate(1);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    wall.tv_sec += 1;
    cr_assert_eq(sluice_gate_acquire(g, &wall, NULL), SLUICE_OK, "a free permit needs no wait");
    int64_t t0 = sluice_monotonic_ns();
    cr_assert_eq(sluice_gate_acquire(g, &wall, NULL), SLUICE_EINVAL);
    cr_assert_lt(sluice_monotonic_ns() - t0, 2 * SLUICE_NS_PER_SEC, "refused, not waited out");
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 1);
    cr_assert_eq(c.waiting, 0, "it left the line");
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK, "no permit was lost");
    sluice_gate_release(g);
    sluice_gate_destroy(g);
}

/* ---- cancel wins over close ------------------------------------------------ */

Test(gate, cancel_wins_over_close_when_both_land_while_a_waiter_sleeps, .timeout = 30)
{
    for (int round = 0; round < SCALED(100); round++) {
        struct sluice_gate *g = make_gate(1);
        struct sluice_cancel token;
        sluice_cancel_init(&token);
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        struct sync_waiter s = {.g = g, .cancel = &token, .status = 99};
        pthread_t tid;
        pthread_create(&tid, NULL, sync_waiter_thread, &s);
        WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
        sluice_cancel_fire(&token);
        sluice_gate_close(g);
        pthread_join(tid, NULL);
        cr_assert_eq(s.status, SLUICE_ECANCELED, "round %d: %s", round,
                     sluice_status_name(s.status));
        sluice_gate_release(g);
        struct sluice_gate_counts c = sluice_gate_stats(g);
        cr_assert_eq(c.in_flight, 0);
        cr_assert_eq(c.waiting, 0);
        sluice_gate_destroy(g);
    }
}

/* ---- the hand-off to layers built on the gate (the pool) -------------------- */

/* Every permit back, nobody queued: nothing the test did leaked or stranded one. */
static void assert_idle_and_destroy(struct sluice_gate *g)
{
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.waiting, 0);
    sluice_gate_destroy(g);
}

Test(gate, failed_lets_a_fired_token_win_over_every_status_but_einval)
{
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    const int stops[] = {SLUICE_ETIMEDOUT, SLUICE_ECLOSED, SLUICE_ECANCELED};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        cr_assert_eq(sluice_gate_failed(stops[i], NULL), stops[i], "no token: the status stands");
        cr_assert_eq(sluice_gate_failed(stops[i], &token), stops[i], "a token yet to fire");
    }
    sluice_cancel_fire(&token);
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++)
        cr_assert_eq(sluice_gate_failed(stops[i], &token), SLUICE_ECANCELED, "%s",
                     sluice_status_name(stops[i]));
    cr_assert_eq(sluice_gate_failed(SLUICE_EINVAL, &token), SLUICE_EINVAL,
                 "an argument error is no wait");
}

Test(gate, settle_async_delivers_an_outcome_decided_outside_the_gate_once_with_its_status)
{
    struct sluice_gate *g = make_gate(1);
    const int outcomes[] = {SLUICE_OK, SLUICE_ECLOSED, SLUICE_ECANCELED};
    for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++) {
        struct counted_grant p;
        dirty_record(&p, true); /* a reused record: stale links, `queued` set */
        sluice_gate_waiter_init(&p.w);
        cr_assert_eq(sluice_gate_cancel_async(g, &p.w), SLUICE_EAGAIN,
                     "an initialised record is not in the gate's line");
        cr_assert_eq(p.calls, 0, "init delivers nothing");
        sluice_gate_settle_async(&p.w, outcomes[i]);
        cr_assert_eq(p.calls, 1);
        cr_assert_eq(p.status, outcomes[i]);
    }
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0, "settling moves no permit");
    cr_assert_eq(c.waiting, 0);

    /* A record the gate granted is its owner's to settle again (the pool
     * re-delivers a grant that waited out a Retry-After hold). */
    struct async_probe granted;
    async_start(g, &granted);
    cr_assert_eq(granted.calls, 1);
    sluice_gate_settle_async(&granted.w, SLUICE_OK);
    cr_assert_eq(granted.calls, 2);
    cr_assert_eq(granted.status, SLUICE_OK);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 1, "still the one permit the grant took");
    sluice_gate_release(g);
    assert_idle_and_destroy(g);
}

/* A callback that settles the next record from inside itself, as a pool
 * callback that starts its next call on an unlimited pool does. */
struct settle_chain {
    struct sluice_gate_waiter w;
    int depth, max_depth, calls, limit;
};

static void settle_next(struct sluice_gate_waiter *w, int status)
{
    struct settle_chain *c = w->data;
    cr_assert_eq(status, SLUICE_OK);
    c->depth++;
    if (c->depth > c->max_depth)
        c->max_depth = c->depth;
    if (++c->calls < c->limit) {
        sluice_gate_waiter_init(&c->w);
        sluice_gate_settle_async(&c->w, SLUICE_OK);
    }
    c->depth--;
}

Test(gate, settle_async_from_inside_a_callback_runs_after_it_never_nested)
{
    struct settle_chain c = {.w = {.cb = settle_next}, .limit = 100000};
    c.w.data = &c;
    sluice_gate_waiter_init(&c.w);
    sluice_gate_settle_async(&c.w, SLUICE_OK);
    cr_assert_eq(c.calls, c.limit, "every settled outcome ran before the outermost call returned");
    cr_assert_eq(c.max_depth, 1, "a callback ran inside another");
}

Test(gate, callbacks_held_back_run_at_resume_after_every_sync_waiter_is_woken, .timeout = 20)
{
    struct sluice_gate *g = make_gate(1);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    struct sync_waiter s = {.g = g, .status = 99};
    pthread_t tid;
    pthread_create(&tid, NULL, sync_waiter_thread, &s);
    WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
    struct async_probe a;
    async_start(g, &a);
    cr_assert_eq(sluice_gate_stats(g).waiting, 2);

    bool outer = sluice_gate_hold_callbacks();
    cr_assert(outer, "no frame of this thread was running callbacks");
    cr_assert_not(sluice_gate_hold_callbacks(), "an inner pair leaves the running to the outer");
    cr_assert_eq(sluice_gate_set_limit(g, 3), SLUICE_OK); /* grants both */
    sluice_gate_resume_callbacks(false);
    WAIT_UNTIL(atomic_load(&s.done));
    cr_assert_eq(s.status, SLUICE_OK, "the sync waiter was woken while callbacks were held");
    cr_assert_eq(a.calls, 0, "the async grant waits for the resume");
    sluice_gate_resume_callbacks(outer);
    cr_assert_eq(a.calls, 1);
    cr_assert_eq(a.status, SLUICE_OK);
    pthread_join(tid, NULL);
    for (int i = 0; i < 3; i++)
        sluice_gate_release(g);
    assert_idle_and_destroy(g);
}

Test(gate, acquire_async_wake_keeps_fifo_and_runs_its_callback_when_decided_even_while_held)
{
    struct sluice_gate *g = make_gate(1);
    struct async_probe inline_grant;
    async_arm(&inline_grant);
    sluice_gate_acquire_async_wake(g, &inline_grant.w);
    cr_assert_eq(inline_grant.calls, 1, "a free permit is granted inline");
    cr_assert_eq(inline_grant.status, SLUICE_OK);

    struct async_probe plain, wake, cancelled, closed;
    async_start(g, &plain); /* first in line */
    struct async_probe *waking[] = {&wake, &cancelled, &closed};
    for (int i = 0; i < 3; i++) {
        async_arm(waking[i]);
        sluice_gate_acquire_async_wake(g, &waking[i]->w);
    }
    cr_assert_eq(sluice_gate_stats(g).waiting, 4);

    bool outer = sluice_gate_hold_callbacks();
    sluice_gate_release(g);
    cr_assert_eq(plain.calls, 0, "the plain record, first in line, waits for the resume");
    cr_assert_eq(wake.calls, 0, "FIFO: the wake record is behind it");
    sluice_gate_release(g); /* plain's permit, handed on */
    cr_assert_eq(wake.calls, 1, "decided and run at once, callbacks held or not");
    cr_assert_eq(wake.status, SLUICE_OK);
    cr_assert_eq(sluice_gate_cancel_async(g, &cancelled.w), SLUICE_OK);
    cr_assert_eq(cancelled.calls, 1);
    cr_assert_eq(cancelled.status, SLUICE_ECANCELED);
    sluice_gate_close(g);
    cr_assert_eq(closed.calls, 1);
    cr_assert_eq(closed.status, SLUICE_ECLOSED);
    cr_assert_eq(plain.calls, 0);
    sluice_gate_resume_callbacks(outer);
    cr_assert_eq(plain.calls, 1);
    cr_assert_eq(plain.status, SLUICE_OK);
    sluice_gate_release(g); /* wake's permit; plain's went on to wake */
    assert_idle_and_destroy(g);
}
