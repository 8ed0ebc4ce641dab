#include <criterion/criterion.h>
#include <sluice/ring.h>

#include "common.h"

#include <stdint.h>
#include <stdlib.h>

/* Items are small integers disguised as pointers; 0 stays a legal item. */
#define ITEM(n) ((void *)(uintptr_t)(n))
#define VALUE(p) ((uintptr_t)(p))

struct counting_allocator {
    long allocs, frees;
    size_t live_bytes;
};

static void *counting_alloc(void *ctx, size_t size, size_t align)
{
    struct counting_allocator *c = ctx;
    c->allocs++;
    c->live_bytes += size;
    return aligned_alloc(align, (size + align - 1) / align * align);
}

static void counting_free(void *ctx, void *ptr, size_t size)
{
    struct counting_allocator *c = ctx;
    c->frees++;
    c->live_bytes -= size;
    free(ptr);
}

static struct sluice_ring *make_ring(uint32_t capacity)
{
    struct sluice_ring *r;
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.capacity = capacity}, &r),
                 SLUICE_OK);
    cr_assert_eq(sluice_ring_capacity(r), capacity);
    return r;
}

Test(ring, init_rejects_capacity_that_is_not_a_power_of_two_of_at_least_two)
{
    static struct sluice_ring_slot slots[1024];
    struct sluice_ring r;
    /* 1 is a power of two, but a one-slot Vyukov ring cannot tell full from free. */
    const uint32_t bad[] = {0, 1, 3, 6, 1000, 1023, 1025, UINT32_MAX, (UINT32_C(1) << 31) + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(sluice_ring_init(&r, slots, bad[i]), SLUICE_EINVAL, "capacity %u accepted",
                     bad[i]);
    cr_assert_eq(sluice_ring_init(&r, NULL, 8), SLUICE_EINVAL);
    cr_assert_eq(sluice_ring_init(NULL, slots, 8), SLUICE_EINVAL);
    cr_assert_eq(sluice_ring_init(&r, slots, 2), SLUICE_OK);
    cr_assert_eq(sluice_ring_init(&r, slots, 1024), SLUICE_OK);
    cr_assert_eq(sluice_ring_capacity(&r), 1024);
}

Test(ring, create_rejects_bad_capacity_and_leaves_out_null)
{
    struct sluice_ring *r = (struct sluice_ring *)&r;
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.capacity = 1000}, &r),
                 SLUICE_EINVAL);
    cr_assert_null(r);
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.capacity = 1}, &r), SLUICE_EINVAL);
    cr_assert_null(r);
}

Test(ring, create_with_zero_capacity_defaults_to_1024)
{
    struct sluice_ring *r;
    cr_assert_eq(sluice_ring_create(NULL, &r), SLUICE_OK);
    cr_assert_eq(sluice_ring_capacity(r), 1024);
    sluice_ring_destroy(r);
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){0}, &r), SLUICE_OK);
    cr_assert_eq(sluice_ring_capacity(r), 1024);
    sluice_ring_destroy(r);
}

Test(ring, push_until_full_returns_eagain_exactly_at_capacity)
{
    const uint32_t caps[] = {2, 8, 1024};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        uint32_t cap = caps[c];
        struct sluice_ring *r = make_ring(cap);
        for (uint32_t i = 0; i < cap; i++) {
            cr_assert_eq(sluice_ring_trypush(r, ITEM(i)), SLUICE_OK, "push %u of %u", i, cap);
            cr_assert_eq(sluice_ring_size(r), i + 1);
        }
        cr_assert_eq(sluice_ring_trypush(r, ITEM(cap)), SLUICE_EAGAIN, "capacity %u", cap);
        cr_assert_eq(sluice_ring_trypush(r, ITEM(cap)), SLUICE_EAGAIN, "capacity %u", cap);
        cr_assert_eq(sluice_ring_size(r), cap);
        /* One pop frees exactly one slot. */
        void *out;
        cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
        cr_assert_eq(VALUE(out), 0);
        cr_assert_eq(sluice_ring_trypush(r, ITEM(cap)), SLUICE_OK);
        cr_assert_eq(sluice_ring_trypush(r, ITEM(cap + 1)), SLUICE_EAGAIN);
        sluice_ring_destroy(r);
    }
}

Test(ring, pop_from_empty_returns_eagain_and_leaves_out_untouched)
{
    struct sluice_ring *r = make_ring(4);
    void *out = ITEM(0xdead);
    cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_EAGAIN);
    cr_assert_eq(VALUE(out), 0xdead);
    cr_assert_eq(sluice_ring_size(r), 0);
    /* Empty again after a round trip, including on a later lap. */
    for (int lap = 0; lap < 3; lap++) {
        for (uintptr_t i = 0; i < 4; i++)
            cr_assert_eq(sluice_ring_trypush(r, ITEM(i)), SLUICE_OK);
        for (uintptr_t i = 0; i < 4; i++)
            cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
        out = ITEM(0xbeef);
        cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_EAGAIN, "lap %d", lap);
        cr_assert_eq(VALUE(out), 0xbeef);
    }
    sluice_ring_destroy(r);
}

Test(ring, null_is_an_ordinary_item)
{
    struct sluice_ring *r = make_ring(2);
    void *out = ITEM(1);
    cr_assert_eq(sluice_ring_trypush(r, NULL), SLUICE_OK);
    cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
    cr_assert_null(out);
    sluice_ring_destroy(r);
}

Test(ring, fifo_order_holds_across_many_wraparounds)
{
    /* Random fill levels make head and tail cross the wrap point at every
     * offset: 8 slots, 400k items, about 50k laps. */
    struct sluice_ring *r = make_ring(8);
    uint64_t rng = 42;
    uintptr_t next_push = 0, next_pop = 0;
    while (next_pop < 400000) {
        unsigned n_push = (unsigned)(test_rand(&rng) % 9);
        for (unsigned i = 0; i < n_push; i++) {
            int st = sluice_ring_trypush(r, ITEM(next_push));
            cr_assert_eq(st, next_push - next_pop < 8 ? SLUICE_OK : SLUICE_EAGAIN,
                         "push with %lu inside", (unsigned long)(next_push - next_pop));
            next_push += st == SLUICE_OK;
        }
        cr_assert_eq(sluice_ring_size(r), next_push - next_pop);
        unsigned n_pop = (unsigned)(test_rand(&rng) % 9);
        for (unsigned i = 0; i < n_pop; i++) {
            void *out;
            int st = sluice_ring_trypop(r, &out);
            if (next_pop == next_push) {
                cr_assert_eq(st, SLUICE_EAGAIN);
                break;
            }
            cr_assert_eq(st, SLUICE_OK);
            cr_assert_eq(VALUE(out), next_pop, "popped %lu, expected %lu",
                         (unsigned long)VALUE(out), (unsigned long)next_pop);
            next_pop++;
        }
    }
    sluice_ring_destroy(r);
}

Test(ring, works_over_caller_storage_and_destroy_leaves_it_alone)
{
    struct sluice_ring *r = aligned_alloc(SLUICE_CACHELINE, sizeof *r);
    struct sluice_ring_slot *slots = aligned_alloc(SLUICE_CACHELINE, SLUICE_RING_SLOTS_SIZE(4));
    cr_assert_eq(sluice_ring_init(r, slots, 4), SLUICE_OK);
    void *out;
    for (uintptr_t i = 0; i < 100; i++) {
        cr_assert_eq(sluice_ring_trypush(r, ITEM(i)), SLUICE_OK);
        cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
        cr_assert_eq(VALUE(out), i);
    }
    /* Not ours to free: if destroy freed it, the frees below would be
     * double frees (glibc aborts, sanitizers report). */
    sluice_ring_destroy(r);
    cr_assert_eq(sluice_ring_trypush(r, ITEM(7)), SLUICE_OK);
    cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
    cr_assert_eq(VALUE(out), 7);
    free(slots);
    free(r);
}

Test(ring, allocates_only_in_create_and_frees_it_all_in_destroy)
{
    struct counting_allocator counts = {0};
    struct sluice_allocator a = {.alloc = counting_alloc, .free = counting_free, .ctx = &counts};
    struct sluice_ring *r;
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.capacity = 64, .allocator = &a},
                                    &r),
                 SLUICE_OK);
    long allocs_after_create = counts.allocs;
    cr_assert_gt(allocs_after_create, 0, "create must go through the allocator hook");
    cr_assert_geq(counts.live_bytes, SLUICE_RING_SLOTS_SIZE(64));

    /* A million operations, through full and empty edges. */
    void *out;
    for (uintptr_t i = 0; i < 500000 / 64; i++) {
        for (uintptr_t k = 0; k < 64; k++)
            cr_assert_eq(sluice_ring_trypush(r, ITEM(k)), SLUICE_OK);
        cr_assert_eq(sluice_ring_trypush(r, ITEM(0)), SLUICE_EAGAIN);
        for (uintptr_t k = 0; k < 64; k++)
            cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_OK);
        cr_assert_eq(sluice_ring_trypop(r, &out), SLUICE_EAGAIN);
    }
    cr_assert_eq(counts.allocs, allocs_after_create, "push/pop allocated");
    cr_assert_eq(counts.frees, 0, "push/pop freed");

    sluice_ring_destroy(r);
    cr_assert_eq(counts.frees, counts.allocs);
    cr_assert_eq(counts.live_bytes, 0, "destroy must free exactly what create allocated");
}

static void *failing_alloc(void *ctx, size_t size, size_t align)
{
    (void)ctx, (void)size, (void)align;
    return NULL;
}

static void never_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx, (void)size;
    cr_assert_null(ptr, "freed a pointer the allocator never returned");
}

Test(ring, create_reports_enomem_when_the_allocator_fails)
{
    struct sluice_allocator a = {.alloc = failing_alloc, .free = never_free};
    struct sluice_ring *r = (struct sluice_ring *)&r;
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.allocator = &a}, &r),
                 SLUICE_ENOMEM);
    cr_assert_null(r);
}
