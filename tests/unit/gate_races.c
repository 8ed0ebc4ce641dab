/*
 * The races that broke kotlinx.coroutines' CQS semaphore, and the CQS gate's
 * own memory promise, as gate tests: they hold for any sluice gate (issue
 * 14 ran them against the CQS candidate too, which lost its A/B).
 *   #1477  a release and a cancel racing on one waiter admitted two holders;
 *   #2390 / #2396  a permit granted to a waiter that was being cancelled leaked;
 *   #1898  tryacquire was not linearizable (it could succeed past a waiter).
 */
#include <criterion/criterion.h>
#include <sluice/gate.h>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

/* The waits here poll with sched_yield, not a 200 µs sleep, so that each
 * step of a race follows the last as closely as the scheduler allows. */
#define WAIT_PAUSE() sched_yield()
#include "common.h"

/* The gate is back to `limit` free permits with nobody waiting. */
static void assert_quiet(struct sluice_gate *g, uint32_t limit, int round)
{
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.in_flight, 0, "round %d: in_flight %u", round, c.in_flight);
    cr_assert_eq(c.waiting, 0, "round %d: waiting %u", round, c.waiting);
    uint32_t taken = 0;
    while (taken <= limit && sluice_gate_tryacquire(g) == SLUICE_OK)
        taken++;
    cr_assert_eq(taken, limit, "round %d: %u permits free, want %u", round, taken, limit);
    for (uint32_t i = 0; i < taken; i++)
        sluice_gate_release(g);
}

/* Two threads released together by a spin barrier, to make the race tight. */
struct start_line {
    _Atomic(int) arrived;
};

static void line_up(struct start_line *s, int n)
{
    atomic_fetch_add(&s->arrived, 1);
    while (atomic_load(&s->arrived) < n)
        sluice_cpu_relax();
}

/* ---- #1477: a release and a cancel race on one waiter ----------------------- */

struct holder_probe {
    struct sluice_gate *g;
    struct sluice_cancel *cancel;
    const struct timespec *deadline;
    _Atomic(int) *inside;
    _Atomic(int) *violations;
    int status;
    _Atomic(int) returned;
};

/* Acquire; if granted, check nobody else holds the only permit, then release. */
static void *acquire_check_release(void *p)
{
    struct holder_probe *h = p;
    h->status = sluice_gate_acquire(h->g, h->deadline, h->cancel);
    if (h->status == SLUICE_OK) {
        if (atomic_fetch_add(h->inside, 1) != 0)
            atomic_fetch_add(h->violations, 1);
        for (int i = 0; i < 50; i++)
            sluice_cpu_relax();
        atomic_fetch_sub(h->inside, 1);
        sluice_gate_release(h->g);
    }
    atomic_store(&h->returned, 1);
    return NULL;
}

struct racer {
    struct start_line *line;
    struct sluice_cancel *token;
};

static void *fire_on_the_line(void *p)
{
    struct racer *r = p;
    line_up(r->line, 2);
    sluice_cancel_fire(r->token);
    return NULL;
}

Test(gate_races, a_release_racing_a_cancel_never_admits_two_holders, .timeout = 60)
{
    _Atomic(int) inside = 0, violations = 0;
    for (int round = 0; round < SCALED(400); round++) {
        struct sluice_gate *g = make_gate(1);
        struct sluice_cancel token;
        sluice_cancel_init(&token);
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        atomic_store(&inside, 1); /* the main thread holds it */
        struct holder_probe w = {g, &token, NULL, &inside, &violations, 99, 0};
        struct holder_probe x = {g, NULL, NULL, &inside, &violations, 99, 0};
        pthread_t tw, tx, tf;
        pthread_create(&tw, NULL, acquire_check_release, &w);
        WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
        pthread_create(&tx, NULL, acquire_check_release, &x); /* behind w */
        WAIT_UNTIL(sluice_gate_stats(g).waiting == 2);
        struct start_line line = {0};
        struct racer fire = {&line, &token};
        pthread_create(&tf, NULL, fire_on_the_line, &fire);
        line_up(&line, 2);
        atomic_store(&inside, 0);
        sluice_gate_release(g);
        pthread_join(tf, NULL);
        pthread_join(tw, NULL);
        pthread_join(tx, NULL);
        cr_assert(w.status == SLUICE_OK || w.status == SLUICE_ECANCELED, "round %d: %s", round,
                  sluice_status_name(w.status));
        cr_assert_eq(x.status, SLUICE_OK, "round %d: the waiter behind got %s", round,
                     sluice_status_name(x.status));
        cr_assert_eq(atomic_load(&violations), 0, "round %d: two holders of one permit", round);
        assert_quiet(g, 1, round);
        sluice_gate_destroy(g);
    }
}

/* ---- #2390/#2396: a grant racing a cancel or a deadline is passed on -------- */

Test(gate_races, a_grant_racing_a_cancel_or_a_deadline_is_passed_on_never_leaked, .timeout = 60)
{
    _Atomic(int) inside = 0, violations = 0;
    uint64_t rng = 1477;
    int outcomes[3] = {0, 0, 0}; /* OK, ECANCELED, ETIMEDOUT */
    for (int round = 0; round < SCALED(500); round++) {
        struct sluice_gate *g = make_gate(1);
        struct sluice_cancel token;
        sluice_cancel_init(&token);
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        atomic_store(&inside, 1);
        bool by_deadline = round % 2;
        struct timespec dl;
        /* A deadline a few hundred microseconds out, released about then. */
        int64_t patience = 100000 + (int64_t)(test_rand(&rng) % 300000);
        struct holder_probe w = {g, by_deadline ? NULL : &token,
                                 by_deadline ? sluice_deadline_in(&dl, patience) : NULL, &inside,
                                 &violations, 99, 0};
        pthread_t tw, tf;
        pthread_create(&tw, NULL, acquire_check_release, &w);
        /* (A short deadline may pass before the waiter is even seen.) */
        WAIT_UNTIL(sluice_gate_stats(g).waiting == 1 || atomic_load(&w.returned));
        struct start_line line = {0};
        struct racer fire = {&line, &token};
        if (!by_deadline)
            pthread_create(&tf, NULL, fire_on_the_line, &fire);
        else
            usleep((useconds_t)(test_rand(&rng) % 400));
        if (!by_deadline)
            line_up(&line, 2);
        atomic_store(&inside, 0);
        sluice_gate_release(g);
        if (!by_deadline)
            pthread_join(tf, NULL);
        pthread_join(tw, NULL);
        outcomes[w.status == SLUICE_OK ? 0 : w.status == SLUICE_ECANCELED ? 1 : 2]++;
        cr_assert(w.status == SLUICE_OK ||
                      w.status == (by_deadline ? SLUICE_ETIMEDOUT : SLUICE_ECANCELED),
                  "round %d: %s", round, sluice_status_name(w.status));
        cr_assert_eq(atomic_load(&violations), 0);
        /* Whoever won, the permit is free again: none leaked to a waiter
         * that left. */
        assert_quiet(g, 1, round);
        sluice_gate_destroy(g);
    }
    cr_log_info("outcomes: %d granted, %d cancelled, %d timed out", outcomes[0], outcomes[1],
                outcomes[2]);
}

/* ---- #1898: tryacquire never succeeds past a waiter that is in line --------- */

struct trier {
    struct sluice_gate *g;
    _Atomic(int) *waiter_done; /* the waiter has had its turn and released */
    _Atomic(int) *stop;
    long barged, tries;
    _Atomic(bool) got_it_after;
};

static void *try_until_it_works(void *p)
{
    struct trier *t = p;
    while (!atomic_load(t->stop)) {
        t->tries++;
        int done_before = atomic_load(t->waiter_done);
        if (sluice_gate_tryacquire(t->g) == SLUICE_OK) {
            if (!done_before && !atomic_load(t->waiter_done))
                t->barged++;
            atomic_store(&t->got_it_after, true);
            sluice_gate_release(t->g);
            break;
        }
    }
    return NULL;
}

struct waiter_marks {
    struct sluice_gate *g;
    _Atomic(int) *done;
    int status;
};

static void *acquire_mark_release(void *p)
{
    struct waiter_marks *w = p;
    w->status = sluice_gate_acquire(w->g, NULL, NULL);
    if (w->status == SLUICE_OK) {
        atomic_store(w->done, 1); /* from here on a tryacquire may win */
        sluice_gate_release(w->g);
    }
    return NULL;
}

Test(gate_races, tryacquire_never_succeeds_past_a_counted_waiter_and_succeeds_once_free,
     .timeout = 60)
{
    for (int round = 0; round < SCALED(1000); round++) {
        struct sluice_gate *g = make_gate(1);
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        _Atomic(int) done = 0, stop = 0;
        struct waiter_marks w = {g, &done, 99};
        struct trier t = {g, &done, &stop, 0, 0, false};
        pthread_t tw, tt;
        pthread_create(&tw, NULL, acquire_mark_release, &w);
        WAIT_UNTIL(sluice_gate_stats(g).waiting == 1);
        pthread_create(&tt, NULL, try_until_it_works, &t);
        /* The released permit belongs to the waiter, even in the instant
         * before it has taken its cell or woken. */
        sluice_gate_release(g);
        pthread_join(tw, NULL);
        int64_t until = sluice_monotonic_ns() + 10 * SLUICE_NS_PER_SEC;
        while (!atomic_load(&t.got_it_after) && sluice_monotonic_ns() < until)
            usleep(100);
        atomic_store(&stop, 1);
        pthread_join(tt, NULL);
        cr_assert_eq(w.status, SLUICE_OK);
        cr_assert_eq(t.barged, 0, "round %d: tryacquire won while the waiter was in line", round);
        cr_assert(atomic_load(&t.got_it_after),
                  "round %d: a free permit with nobody waiting was refused", round);
        assert_quiet(g, 1, round);
        sluice_gate_destroy(g);
    }
}

/* ---- cancelled neighbours trimmed while the next waiter is granted ---------- */

enum { NEIGHBOURS = 33 * 40 }; /* 40 runs of 32 doomed waiters, each followed by a live one */

struct neighbour {
    struct sluice_gate_waiter w;
    struct sluice_gate *g;
    _Atomic(int) calls;
    _Atomic(int) status;
    _Atomic(long) *grant_seq;
    long granted_at;
};

static void neighbour_cb(struct sluice_gate_waiter *w, int status)
{
    struct neighbour *n = (struct neighbour *)w;
    atomic_store(&n->status, status);
    if (status == SLUICE_OK) {
        n->granted_at = atomic_fetch_add(n->grant_seq, 1);
        sluice_gate_release(n->g); /* on to the next in line */
    }
    atomic_fetch_add(&n->calls, 1);
}

struct canceller {
    struct neighbour *recs;
    struct start_line *line;
    int cancelled_ok;
};

static void *cancel_the_doomed(void *p)
{
    struct canceller *c = p;
    line_up(c->line, 2);
    for (int k = 0; k < NEIGHBOURS; k++)
        if (k % 33 != 32 && sluice_gate_cancel_async(c->recs[k].g, &c->recs[k].w) == SLUICE_OK)
            c->cancelled_ok++;
    return NULL;
}

Test(gate_races, cancelled_neighbours_leave_the_line_while_the_live_waiter_behind_them_is_granted,
     .timeout = 60)
{
    struct neighbour *recs = calloc(NEIGHBOURS, sizeof *recs);
    cr_assert_not_null(recs);
    for (int round = 0; round < SCALED(20); round++) {
        struct sluice_gate *g = make_gate(1);
        _Atomic(long) seq = 0;
        cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
        for (int k = 0; k < NEIGHBOURS; k++) {
            recs[k] = (struct neighbour){.w = {.cb = neighbour_cb}, .g = g, .grant_seq = &seq,
                                         .granted_at = -1};
            atomic_store(&recs[k].status, 99);
            sluice_gate_acquire_async(g, &recs[k].w);
        }
        struct start_line line = {0};
        struct canceller c = {recs, &line, 0};
        pthread_t tc;
        pthread_create(&tc, NULL, cancel_the_doomed, &c);
        line_up(&line, 2);
        sluice_gate_release(g); /* grants run down the line as the cancels land */
        pthread_join(tc, NULL);
        long last = -1;
        int cancelled = 0;
        for (int k = 0; k < NEIGHBOURS; k++) {
            cr_assert_eq(atomic_load(&recs[k].calls), 1, "round %d: waiter %d: %d callbacks",
                         round, k, atomic_load(&recs[k].calls));
            int st = atomic_load(&recs[k].status);
            if (k % 33 == 32)
                cr_assert_eq(st, SLUICE_OK, "round %d: live waiter %d got %s", round, k,
                             sluice_status_name(st));
            if (st == SLUICE_ECANCELED) {
                cancelled++;
                continue;
            }
            cr_assert_eq(st, SLUICE_OK);
            cr_assert_gt(recs[k].granted_at, last, "round %d: waiter %d granted out of order",
                         round, k);
            last = recs[k].granted_at;
        }
        cr_assert_eq(cancelled, c.cancelled_ok, "round %d", round);
        assert_quiet(g, 1, round);
        sluice_gate_destroy(g);
    }
    free(recs);
}

/* ---- a million timeouts behind one slow holder: memory stays flat ----------- */

struct queue_watch {
    struct sluice_gate *g;
    _Atomic(bool) done;
    long seen_waiting; /* samples that found a waiter queued */
};

static void *watch_queue(void *arg)
{
    struct queue_watch *w = arg;
    while (!atomic_load(&w->done)) {
        w->seen_waiting += sluice_gate_stats(w->g).waiting > 0;
        usleep(100); /* a sample now and then, not a core taken from the waiters */
    }
    return NULL;
}

Test(gate_races, a_million_timeouts_behind_one_slow_holder_leave_memory_flat, .timeout = 120)
{
    struct counting_alloc counts = {.fail_at = -1};
    struct sluice_allocator a = counting_allocator(&counts);
    struct sluice_gate *g;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 1, .allocator = &a}, &g),
                 SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK); /* the slow holder */
    /* Each waiter's deadline is a few microseconds out, so it really joins
     * the line behind the holder and leaves it on timeout (a deadline
     * already past would return before queueing and prove nothing). */
    struct timespec dl;
    for (int i = 0; i < 1000; i++) /* warm up: whatever a steady state needs */
        cr_assert_eq(sluice_gate_acquire(g, sluice_deadline_in(&dl, 2000), NULL),
                     SLUICE_ETIMEDOUT);
    long live = counts.live;
    struct queue_watch w = {g, false, 0};
    pthread_t watcher;
    pthread_create(&watcher, NULL, watch_queue, &w);
    long n = SCALED(1000000);
    for (long i = 0; i < n; i++) {
        if (sluice_gate_acquire(g, sluice_deadline_in(&dl, 2000), NULL) != SLUICE_ETIMEDOUT)
            cr_assert_fail("timeout %ld did not time out", i);
    }
    atomic_store(&w.done, true);
    pthread_join(watcher, NULL);
    cr_assert_gt(w.seen_waiting, 0, "the timed-out waiters were queued");
    cr_assert_leq(counts.live, live + 2, "%ld timeouts grew the gate from %ld to %ld blocks", n,
                  live, counts.live);
    struct sluice_gate_counts c = sluice_gate_stats(g);
    cr_assert_eq(c.waiting, 0);
    cr_assert_eq(c.in_flight, 1);
    sluice_gate_release(g); /* and the abandoned waits cost the release nothing */
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    sluice_gate_destroy(g);
    cr_assert_eq(counts.live, 0);
}
