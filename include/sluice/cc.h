/*
 * sluice/cc.h — compiler and portability helpers shared by every core header.
 *
 * What it is: inline/alignment/branch-hint macros, the optional-value type
 * used by description structs (SLUICE_SOME), a tiny test-and-set spinlock for
 * rare slow paths, the CPU relax hint, and the allocator hook through which
 * the core does all of its (create-time only) allocation.
 *
 * Concurrency: everything here is stateless except sluice_spinlock, which is
 * a plain test-and-test-and-set lock with acquire/release ordering. It guards
 * slow paths only (cancel-token registration, limit changes); never a hot path.
 *
 * C++: the core uses C11 <stdatomic.h>. C++ translation units need C++23
 * (which provides <stdatomic.h> and the _Atomic(T) macro).
 */
#ifndef SLUICE_CC_H
#define SLUICE_CC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <ck_pr.h>

#define SLUICE_INLINE static inline
#define SLUICE_CACHELINE 64
#define SLUICE_ALIGNED(n) __attribute__((aligned(n)))
#define SLUICE_LIKELY(x) __builtin_expect(!!(x), 1)
#define SLUICE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SLUICE_UNUSED __attribute__((unused))

/* Memory-order shorthands: every atomic in the core names its ordering. */
#define SLUICE_RELAXED memory_order_relaxed
#define SLUICE_ACQUIRE memory_order_acquire
#define SLUICE_RELEASE memory_order_release
#define SLUICE_ACQ_REL memory_order_acq_rel
#define SLUICE_SEQ_CST memory_order_seq_cst

/*
 * An optional unsigned value for description structs where zero is a real
 * setting and "omitted" must stay distinguishable (sokol-style defaults):
 *   .waiting = SLUICE_SOME(0)   explicit zero
 *   (field left out)            default applies
 */
struct sluice_opt_u32 {
    bool set;
    uint32_t value;
};
#ifdef __cplusplus
#define SLUICE_SOME(v) (sluice_opt_u32{true, (uint32_t)(v)})
#else
#define SLUICE_SOME(v) ((struct sluice_opt_u32){.set = true, .value = (uint32_t)(v)})
#endif

SLUICE_INLINE uint32_t sluice_opt_or(struct sluice_opt_u32 o, uint32_t fallback)
{
    return o.set ? o.value : fallback;
}

/* Pause inside a spin loop (PAUSE on x86, YIELD on arm) via Concurrency Kit. */
SLUICE_INLINE void sluice_cpu_relax(void)
{
    ck_pr_stall();
}

SLUICE_INLINE bool sluice_is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

SLUICE_INLINE uint64_t sluice_next_pow2(uint64_t x)
{
    if (x <= 1)
        return 1;
    return (uint64_t)1 << (64 - __builtin_clzll(x - 1));
}

/*
 * A test-and-test-and-set spinlock. Held for a few dozen instructions on
 * slow paths only, so fairness and parking are not worth their cost.
 */
typedef struct sluice_spinlock {
    _Atomic(uint32_t) held;
} sluice_spinlock;

SLUICE_INLINE void sluice_spinlock_init(sluice_spinlock *l)
{
    atomic_init(&l->held, 0u);
}

SLUICE_INLINE bool sluice_spinlock_trylock(sluice_spinlock *l)
{
    return atomic_load_explicit(&l->held, SLUICE_RELAXED) == 0u &&
           atomic_exchange_explicit(&l->held, 1u, SLUICE_ACQUIRE) == 0u;
}

SLUICE_INLINE void sluice_spinlock_lock(sluice_spinlock *l)
{
    while (!sluice_spinlock_trylock(l))
        sluice_cpu_relax();
}

SLUICE_INLINE void sluice_spinlock_unlock(sluice_spinlock *l)
{
    atomic_store_explicit(&l->held, 0u, SLUICE_RELEASE);
}

/*
 * Allocator hook. The core allocates only in *_create functions and frees
 * only in *_destroy; pass NULL anywhere an allocator is taken to use
 * aligned_alloc/free. `size` is passed to free so arena or counting
 * allocators need no header.
 */
struct sluice_allocator {
    void *(*alloc)(void *ctx, size_t size, size_t align);
    void (*free)(void *ctx, void *ptr, size_t size);
    void *ctx;
};

/* An allocator sets both alloc and free, or neither (NULL is the default). */
SLUICE_INLINE bool sluice__allocator_valid(const struct sluice_allocator *a)
{
    return !a || (a->alloc == NULL) == (a->free == NULL);
}

SLUICE_INLINE void *sluice__alloc(const struct sluice_allocator *a, size_t size, size_t align)
{
    if (a && a->alloc)
        return a->alloc(a->ctx, size, align);
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t rounded = (size + align - 1) / align * align;
    return aligned_alloc(align, rounded ? rounded : align);
}

SLUICE_INLINE void sluice__free(const struct sluice_allocator *a, void *ptr, size_t size)
{
    if (!ptr)
        return;
    if (a && a->free)
        a->free(a->ctx, ptr, size);
    else
        free(ptr);
}

#endif /* SLUICE_CC_H */
