/*
 * Fixtures shared by the pool, engine and run tests: a counting allocator
 * that can fail on demand, a virtual clock, and a latch for holding a
 * callback until the test lets it go.
 */
#ifndef SLUICE_TESTS_RUN_FIXTURES_H
#define SLUICE_TESTS_RUN_FIXTURES_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <sluice/engine.h>
#include <sluice/pool.h>

#include "common.h"

/*
 * One object to build under allocation failure: `create` builds it from
 * `desc` with allocator `a`, leaving it (or NULL) in *obj; `check`, if set,
 * runs on the built object before `destroy`.
 */
struct alloc_failure_case {
    const void *desc;
    int (*create)(const void *desc, const struct sluice_allocator *a, void **obj);
    void (*destroy)(void *obj);
    void (*check)(void *obj, struct counting_alloc *c);
};

/*
 * Fails allocation 0, then 1, 2, ... until create succeeds. Every failed
 * create must return SLUICE_ENOMEM, NULL its out-param and leave nothing
 * allocated; the one that succeeds must be aligned, pass `check`, and leave
 * nothing once destroyed. Returns how many allocations that create made.
 */
static inline long assert_allocation_failures_leak_nothing(const struct alloc_failure_case *k)
{
    for (long fail_at = 0;; fail_at++) {
        struct counting_alloc c = {.fail_at = fail_at};
        struct sluice_allocator a = counting_allocator(&c);
        void *obj = (void *)1; /* create must overwrite it, on failure with NULL */
        int status = k->create(k->desc, &a, &obj);
        if (status == SLUICE_OK) {
            cr_assert_not_null(obj);
            cr_assert_not(c.misaligned);
            cr_assert_eq(c.calls, fail_at, "create made %ld allocations, not %ld", c.calls,
                         fail_at);
            if (k->check)
                k->check(obj, &c);
            k->destroy(obj);
            cr_assert_eq(c.live, 0, "destroy left %ld blocks", c.live);
            cr_assert_eq(c.live_bytes, 0, "destroy left %ld bytes", c.live_bytes);
            return fail_at;
        }
        cr_assert_eq(status, SLUICE_ENOMEM, "allocation %ld", fail_at);
        cr_assert_null(obj, "failing allocation %ld left the out-param set", fail_at);
        cr_assert_eq(c.live, 0, "failing allocation %ld leaked %ld blocks", fail_at, c.live);
        cr_assert_eq(c.live_bytes, 0, "failing allocation %ld leaked %ld bytes", fail_at,
                     c.live_bytes);
    }
}

/*
 * alloc_failure_case.create/destroy for a sluice_<kind> (desc: a
 * sluice_<kind>_desc): <kind>_create_with and <kind>_destroy_any.
 */
#define ALLOC_FAILURE_ADAPTERS(kind)                                                               \
    static inline int kind##_create_with(const void *desc, const struct sluice_allocator *a,     \
                                         void **obj)                                               \
    {                                                                                              \
        struct sluice_##kind##_desc d = *(const struct sluice_##kind##_desc *)desc;               \
        d.allocator = a;                                                                           \
        struct sluice_##kind *o = (struct sluice_##kind *)*obj;                                    \
        int status = sluice_##kind##_create(&d, &o);                                               \
        *obj = o;                                                                                  \
        return status;                                                                             \
    }                                                                                              \
    static inline void kind##_destroy_any(void *obj)                                               \
    {                                                                                              \
        sluice_##kind##_destroy((struct sluice_##kind *)obj);                                      \
    }

ALLOC_FAILURE_ADAPTERS(pool)
ALLOC_FAILURE_ADAPTERS(engine)

/* A virtual clock tests move by hand. */
struct fake_clock {
    _Atomic(int64_t) now;
};

static inline int64_t fake_clock_now(void *ctx)
{
    return atomic_load(&((struct fake_clock *)ctx)->now);
}

static inline struct sluice_clock fake_clock_hook(struct fake_clock *c)
{
    struct sluice_clock h = {fake_clock_now, c};
    return h;
}

static inline void fake_clock_advance(struct fake_clock *c, int64_t ns)
{
    atomic_fetch_add(&c->now, ns);
}

/* A one-shot gate a callback waits on until the test opens it. */
struct latch {
    _Atomic(int) open;
    _Atomic(int) arrived; /* how many threads reached latch_wait */
};

static inline void latch_wait(struct latch *l)
{
    atomic_fetch_add(&l->arrived, 1);
    while (!atomic_load(&l->open))
        sched_yield();
}

static inline void latch_open(struct latch *l)
{
    atomic_store(&l->open, 1);
}

/* Yield until *v reaches at least n (the caller's liveness, not a timing claim). */
static inline void wait_for_count(_Atomic(int) *v, int n)
{
    while (atomic_load(v) < n)
        sched_yield();
}

/*
 * A run's cancel token that another thread may fire only while the run is
 * armed: *armed is 0 idle, 1 the canceller may fire, 2 it is firing. Arm
 * before the run, disarm after: disarm waits out a fire in progress, so a
 * fire never lands on the token once the run is over.
 */
static inline void cancel_arm(_Atomic(int) *armed)
{
    atomic_store(armed, 1);
}

static inline void cancel_disarm(_Atomic(int) *armed)
{
    int expect = 1;
    while (!atomic_compare_exchange_weak(armed, &expect, 0)) {
        expect = 1;
        sched_yield(); /* the canceller is firing this token right now */
    }
}

/* The canceller's side: fires `token` if it is armed; says whether it did.
 * With `fired_at`, stores `*clock`'s next tick there once the fire is done and
 * before the token can be disarmed, so the run's owner can order the fire
 * against its own ticks (what happened first: the fire, or the run's return). */
static inline bool cancel_fire_if_armed(_Atomic(int) *armed, struct sluice_cancel *token,
                                        _Atomic(uint64_t) *clock, _Atomic(uint64_t) *fired_at)
{
    int expect = 1;
    if (!atomic_compare_exchange_strong(armed, &expect, 2))
        return false;
    sluice_cancel_fire(token);
    if (fired_at)
        atomic_store(fired_at, atomic_fetch_add(clock, 1) + 1);
    atomic_store(armed, 1);
    return true;
}

/* Jitter between a canceller's shots: a yield one time in eight, else `spins` pauses. */
static inline void random_pause(uint64_t *rng, int spins)
{
    if (test_rand(rng) % 8 == 0)
        sched_yield();
    else
        for (int i = 0; i < spins; i++)
            sluice_cpu_relax();
}

/* A deadline `ns` from now. */
static inline struct timespec deadline_in(int64_t ns)
{
    struct timespec ts;
    sluice_deadline_in(&ts, ns);
    return ts;
}

/*
 * The pool is idle and its whole capacity is usable again: exactly
 * active + waiting admissions succeed and the next is refused, and exactly
 * `active` permits can be taken at once (`active` is the current limit: for
 * an adaptive pool, the limit discovery has set). Leaves the pool as it
 * found it.
 */
static inline void assert_capacity_intact(struct sluice_pool *p)
{
    cr_assert_not_null(p);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.admitted, 0, "%u runs still admitted", c.admitted);
    cr_assert_eq(c.in_flight, 0, "%u calls still in flight", c.in_flight);
    cr_assert_eq(c.queued, 0, "%u calls still queued", c.queued);
    uint32_t n = 0;
    while (n < c.active_max + c.waiting_capacity + 1 && sluice_pool_admit(p) == SLUICE_OK)
        n++;
    if (c.active_max)
        cr_assert_eq(n, c.active + c.waiting_capacity, "admitted %u of %u", n,
                     c.active + c.waiting_capacity);
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_leave(p);
    struct sluice_gate *g = sluice__pool_gate(p);
    for (uint32_t i = 0; g && i < c.active; i++)
        cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK, "permit %u of %u is gone", i, c.active);
    cr_assert(!g || sluice_gate_tryacquire(g) == SLUICE_EAGAIN, "more permits than the limit");
    for (uint32_t i = 0; g && i < c.active; i++)
        sluice_gate_release(g);
}

#endif
