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
#include <sluice/pool.h>

/* Counts live allocations and bytes; allocation number fail_at (0-based) fails. */
struct counting_alloc {
    long fail_at; /* -1: never fail */
    long calls;
    long live;
    long live_bytes;
    bool misaligned; /* set if a caller ever asked for an alignment it did not get */
};

static inline void *counting_alloc_fn(void *ctx, size_t size, size_t align)
{
    struct counting_alloc *c = (struct counting_alloc *)ctx;
    if (c->calls++ == c->fail_at)
        return NULL;
    void *p = aligned_alloc(align, (size + align - 1) / align * align);
    if (p) {
        memset(p, 0xA5, size); /* callers must not rely on zeroed memory */
        c->live++;
        c->live_bytes += (long)size;
        if ((uintptr_t)p % align)
            c->misaligned = true;
    }
    return p;
}

static inline void counting_free_fn(void *ctx, void *ptr, size_t size)
{
    struct counting_alloc *c = (struct counting_alloc *)ctx;
    c->live--;
    c->live_bytes -= (long)size;
    free(ptr);
}

static inline struct sluice_allocator counting_allocator(struct counting_alloc *c)
{
    struct sluice_allocator a = {counting_alloc_fn, counting_free_fn, c};
    return a;
}

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

/* A deadline `ns` from now. */
static inline struct timespec deadline_in(int64_t ns)
{
    struct timespec ts;
    sluice_deadline_in(&ts, ns);
    return ts;
}

/*
 * The pool is idle and its whole capacity is usable again: exactly
 * active_max + waiting admissions succeed and the next is refused, and
 * exactly the current limit's permits can be taken at once (for an adaptive
 * pool, the limit discovery has set). Leaves the pool as it found it.
 */
static inline void assert_capacity_intact(struct sluice_pool *p)
{
    cr_assert_not_null(p);
    struct sluice_pool_counts c = sluice_pool_stats(p);
    cr_assert_eq(c.admitted, 0, "%u runs still admitted", c.admitted);
    cr_assert_eq(c.in_flight, 0, "%u calls still in flight", c.in_flight);
    cr_assert_eq(c.waiting, 0, "%u calls still queued", c.waiting);
    uint32_t n = 0;
    while (n < c.active_max + c.waiting_capacity + 1 && sluice_pool_admit(p) == SLUICE_OK)
        n++;
    if (c.active_max)
        cr_assert_eq(n, c.active_max + c.waiting_capacity, "admitted %u of %u", n,
                     c.active_max + c.waiting_capacity);
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_leave(p);
    struct sluice_gate *g = sluice_pool_gate(p);
    for (uint32_t i = 0; g && i < c.active; i++)
        cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_OK, "permit %u of %u is gone", i, c.active);
    cr_assert(!g || sluice_gate_tryacquire(g) == SLUICE_EAGAIN, "more permits than the limit");
    for (uint32_t i = 0; g && i < c.active; i++)
        sluice_gate_release(g);
}

#endif
