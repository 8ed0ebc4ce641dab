/*
 * sluice/cc.h — compiler and portability helpers shared by every core header.
 *
 * What it is: inline/alignment/branch-hint/thread-local macros, the
 * optional-value type used by description structs (SLUICE_SOME), the
 * macros that give their fields defaults (SLUICE__DEFAULT), a
 * spinlock with backoff for slow paths (Concurrency Kit's ck_spinlock_fas
 * word, taken test-and-test-and-set style), the CPU relax
 * hint, and the allocator hook through which the core does all of its
 * (create-time only) allocation.
 *
 * Concurrency: everything here is stateless except sluice_spinlock, a
 * ck_spinlock_fas lock with acquire/release ordering. It guards slow
 * paths only (cancel-token registration, the gate's waiter queue, limit
 * changes), never the uncontended acquire/release. Those slow paths can still
 * be contended (hundreds of waiters woken by one cancel token all leave the
 * same queue), so a waiter backs off: exponentially growing pause runs, then
 * sched_yield, so that a preempted holder gets the CPU back.
 *
 * Requirements: Linux, CLOCK_MONOTONIC and syscall(). Compile with
 * -D_DEFAULT_SOURCE (or _GNU_SOURCE; the sluice::core target and
 * sluice-core.pc pass it). A strict -std=c11 build without it stops at one
 * #error below that names the macro, rather than at a missing
 * CLOCK_MONOTONIC deep in time.h.
 *
 * C++: the core uses C11 <stdatomic.h>. C++23 provides it (with the
 * _Atomic(T) macro); for C++17 and C++20, which do not, the block below
 * spells the same names with <atomic>, as libstdc++'s C++23 <stdatomic.h>
 * does. So every header compiles as C11 and as C++17 or later.
 */
#ifndef SLUICE_CC_H
#define SLUICE_CC_H

/* Checked before any system header, while defining the macro still helps:
 * glibc implies _DEFAULT_SOURCE unless the compiler runs in a strict mode
 * (-std=c11) or the program picked a standard (_POSIX_C_SOURCE,
 * _XOPEN_SOURCE) itself, and neither of those declares syscall(). Defining
 * it after the #error keeps that error the only one. C++ compilers define
 * _GNU_SOURCE on their own. */
#if !defined(__cplusplus) && !defined(_DEFAULT_SOURCE) && !defined(_GNU_SOURCE) &&               \
    !defined(_BSD_SOURCE) && !defined(_SVID_SOURCE) &&                                           \
    (defined(__STRICT_ANSI__) || defined(_POSIX_C_SOURCE) || defined(_XOPEN_SOURCE))
#error "sluice needs CLOCK_MONOTONIC and syscall(): compile with -D_DEFAULT_SOURCE (or _GNU_SOURCE)"
#define _DEFAULT_SOURCE 1
#endif

#if defined(__cplusplus) && __cplusplus <= 202002L
/* C++17/20: std::atomic<T> has the layout and operations of C11's _Atomic(T)
 * on every ABI sluice targets, and the free functions below are the C11
 * names. Skipped when a C++ <stdatomic.h> already defined the macro. */
#include <atomic>
#ifndef _Atomic
#define _Atomic(T) std::atomic<T>
using std::atomic_compare_exchange_strong_explicit;
using std::atomic_compare_exchange_weak_explicit;
using std::atomic_exchange_explicit;
using std::atomic_fetch_add_explicit;
using std::atomic_fetch_sub_explicit;
using std::atomic_init;
using std::atomic_load_explicit;
using std::atomic_store_explicit;
using std::memory_order;
using std::memory_order_acq_rel;
using std::memory_order_acquire;
using std::memory_order_relaxed;
using std::memory_order_release;
using std::memory_order_seq_cst;
#endif
#else
#include <stdatomic.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <sched.h>

#include <ck_pr.h>
#include <spinlock/fas.h>


#define SLUICE_INLINE static inline
#define SLUICE_CACHELINE 64
#define SLUICE_ALIGNED(n) __attribute__((aligned(n)))
#define SLUICE_LIKELY(x) __builtin_expect(!!(x), 1)
#define SLUICE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SLUICE_UNUSED __attribute__((unused))

/* Per-thread storage, the same spelling in C11 and C++. */
#ifdef __cplusplus
#define SLUICE_THREAD_LOCAL thread_local
#else
#define SLUICE_THREAD_LOCAL _Thread_local
#endif

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

/*
 * The one way a description field gets its default (nginx's
 * ngx_conf_merge_*_value): on the resolved copy, in place, from a named
 * constant defined beside the struct, so the number lives in one place that
 * the field's "(default: ...)" comment and every reader can name.
 * SLUICE__DEFAULT is for fields where zero (or NULL) means omitted;
 * SLUICE__DEFAULT_OPT for struct sluice_opt_u32 fields, where zero is a
 * real setting and only "not set" is omitted.
 */
#define SLUICE__DEFAULT(field, value)                                                              \
    do {                                                                                           \
        if ((field) == 0)                                                                          \
            (field) = (value);                                                                     \
    } while (0)
#define SLUICE__DEFAULT_OPT(field, value)                                                          \
    do {                                                                                           \
        if (!(field).set)                                                                          \
            (field) = SLUICE_SOME(value);                                                          \
    } while (0)

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
 * ThreadSanitizer cannot see Concurrency Kit's atomics (inline assembly on
 * x86-64), so code built with -fsanitize=thread describes them to it:
 * SLUICE_TSAN is 1 there, and the sluice__tsan_* helpers below tell it
 * about the lock (and the gate's recycled memory) instead.
 */
#if defined(__SANITIZE_THREAD__)
#define SLUICE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLUICE_TSAN 1
#endif
#endif
#ifndef SLUICE_TSAN
#define SLUICE_TSAN 0
#endif
#if SLUICE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/*
 * The spinlock for slow paths: Concurrency Kit's fetch-and-store lock
 * (ck_spinlock_fas), taken test-and-test-and-set style. The holder runs a
 * few dozen instructions, but on a machine with more runnable threads than
 * CPUs it can be preempted inside them; a waiter that only paused would then
 * burn its whole time slice while the holder waits for a CPU (a convoy). So
 * the contended path pauses in runs that double up to
 * SLUICE_SPIN_BACKOFF_MAX, then yields the CPU between runs. ck's own
 * ck_spinlock_fas_lock_eb backs off too, but never yields, which is the part
 * that matters when threads outnumber cores; so the lock word and its
 * acquire/release fences are ck's, the waiting policy is ours. Not fair, and
 * not meant to be.
 */
#ifndef SLUICE_SPIN_BACKOFF_MAX
#define SLUICE_SPIN_BACKOFF_MAX 64 /* pauses in the longest run before yielding */
#endif

typedef struct sluice_spinlock {
    ck_spinlock_fas_t ck;
} sluice_spinlock;

SLUICE_INLINE void sluice_spinlock_init(sluice_spinlock *l)
{
    ck_spinlock_fas_init(&l->ck);
}

/* One attempt: a plain load first, so a waiter polls its cache line instead
 * of bouncing it with exchanges (the "test" before the test-and-set). */
SLUICE_INLINE bool sluice__spinlock_try(sluice_spinlock *l)
{
    return !ck_spinlock_fas_locked(&l->ck) && ck_spinlock_fas_trylock(&l->ck);
}

SLUICE_INLINE bool sluice_spinlock_trylock(sluice_spinlock *l)
{
#if SLUICE_TSAN
    __tsan_mutex_pre_lock(l, __tsan_mutex_try_lock);
    bool got = sluice__spinlock_try(l);
    __tsan_mutex_post_lock(l, __tsan_mutex_try_lock | (got ? 0u : __tsan_mutex_try_lock_failed), 0);
    return got;
#else
    return sluice__spinlock_try(l);
#endif
}

/* The contended path, out of line in spirit: the fast path stays one exchange. */
SLUICE_INLINE void sluice__spinlock_contended(sluice_spinlock *l)
{
    uint32_t run = 1;
    do {
        for (uint32_t i = 0; i < run; i++)
            sluice_cpu_relax();
        if (run < SLUICE_SPIN_BACKOFF_MAX)
            run *= 2;
        else
            sched_yield();
    } while (!sluice__spinlock_try(l));
}

SLUICE_INLINE void sluice_spinlock_lock(sluice_spinlock *l)
{
#if SLUICE_TSAN
    __tsan_mutex_pre_lock(l, 0);
#endif
    if (SLUICE_UNLIKELY(!sluice__spinlock_try(l)))
        sluice__spinlock_contended(l);
#if SLUICE_TSAN
    __tsan_mutex_post_lock(l, 0, 0);
#endif
}

SLUICE_INLINE void sluice_spinlock_unlock(sluice_spinlock *l)
{
#if SLUICE_TSAN
    __tsan_mutex_pre_unlock(l, 0);
#endif
    ck_spinlock_fas_unlock(&l->ck);
#if SLUICE_TSAN
    __tsan_mutex_post_unlock(l, 0);
#endif
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

/*
 * An enum and its name function from one X-macro map (libuv's UV_ERRNO_MAP
 * shape): `enum type { ... }` from ROW_ENUM(name, str) rows (each expands
 * to `CONSTANT,`) and `const char *name_fn(enum type)` from ROW_CASE rows
 * (each expands to SLUICE__NAME_CASE(CONSTANT, str)), returning "unknown"
 * for a value outside the map. The map is the one place a value is listed.
 */
#define SLUICE__NAME_CASE(constant, str)                                                           \
    case constant:                                                                                 \
        return str;
#define SLUICE__ENUM_WITH_NAMES(type, name_fn, MAP, ROW_ENUM, ROW_CASE)                            \
    enum type { MAP(ROW_ENUM) };                                                                   \
    SLUICE_INLINE const char *name_fn(enum type value)                                             \
    {                                                                                              \
        switch (value) {                                                                           \
            MAP(ROW_CASE)                                                                          \
        }                                                                                          \
        return "unknown";                                                                          \
    }

#endif /* SLUICE_CC_H */
