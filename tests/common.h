/* Shared helpers for sluice's tests. */
#ifndef SLUICE_TESTS_COMMON_H
#define SLUICE_TESTS_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <criterion/criterion.h>
#include <sluice/cc.h>
#include <sluice/gate.h>
#include <sluice/store.h>
#include <sluice/time.h>

/* The part of the file at `rel` (from the source root) from `from` up to `to` (NULL: to its
 * end); static storage. */
static inline char *test_source_part(const char *rel, const char *from, const char *to)
{
    static char text[1 << 18];
    char path[512];
    snprintf(path, sizeof path, "%s/../../%s", SLUICE_TEST_FIXTURES, rel);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    char *start = strstr(text, from);
    char *end = !start ? NULL : to ? strstr(start, to) : start + strlen(start);
    cr_assert(start && end, "%s has \"%s\" and then \"%s\"", rel, from, to ? to : "its end");
    *end = '\0';
    return start;
}

/* Threaded tests scale their iteration counts down under ThreadSanitizer. */
#ifndef SLUICE_TEST_SCALE
#define SLUICE_TEST_SCALE 1
#endif
#define SCALED(n) ((n) / SLUICE_TEST_SCALE > 0 ? (n) / SLUICE_TEST_SCALE : 1)

/* Bounded wait for a condition another thread makes true; guards against a
 * hang, it is not a timing claim (10 s is orders of magnitude above need).
 * WAIT_PAUSE() runs between looks: a 200 µs sleep, unless the file defines
 * its own before including this one. */
#ifndef WAIT_PAUSE
#define WAIT_PAUSE() usleep(200)
#endif
#define WAIT_UNTIL(cond)                                                                           \
    do {                                                                                           \
        int64_t wait_until_deadline = sluice_monotonic_ns() + 10 * SLUICE_NS_PER_SEC;               \
        while (!(cond)) {                                                                          \
            cr_assert_lt(sluice_monotonic_ns(), wait_until_deadline, "timed out: " #cond);         \
            WAIT_PAUSE();                                                                          \
        }                                                                                          \
    } while (0)

/*
 * A store whose save blocks until the test calls held_store_release, logging
 * the order of its calls: a test checks that something does not wait for a
 * save by finding the save still blocked when it returns, an order that no
 * amount of load on the machine changes (a sleeping save and a time budget
 * would). A save never released goes on after 10 s, so a call that wrongly
 * waits for it fails the test instead of hanging it.
 */
struct held_store {
    struct sluice_store_ops inner;
    _Atomic(int) saving;  /* a save is blocked right now */
    _Atomic(int) release; /* set by held_store_release: blocked saves go on */
    _Atomic(int) n_ops;
    char ops[8]; /* 'S'ave / 'C'lear, in order (written by one flusher at a time) */
};

static inline int held_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    struct held_store *s = (struct held_store *)ctx;
    return s->inner.load(s->inner.ctx, node, out);
}

static inline int held_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    struct held_store *s = (struct held_store *)ctx;
    atomic_store(&s->saving, 1);
    for (int64_t give_up = sluice_monotonic_ns() + 10 * SLUICE_NS_PER_SEC;
         !atomic_load(&s->release) && sluice_monotonic_ns() < give_up;)
        usleep(200);
    int status = s->inner.save(s->inner.ctx, node, rec);
    s->ops[atomic_fetch_add(&s->n_ops, 1) & 7] = 'S';
    atomic_store(&s->saving, 0);
    return status;
}

static inline int held_clear(void *ctx, const char *node)
{
    struct held_store *s = (struct held_store *)ctx;
    int status = s->inner.clear(s->inner.ctx, node);
    s->ops[atomic_fetch_add(&s->n_ops, 1) & 7] = 'C';
    return status;
}

/* Wrap `inner`; the ops to give the engine or node point into *s. */
static inline struct sluice_store_ops held_store_init(struct held_store *s,
                                                     struct sluice_store_ops inner)
{
    memset(s, 0, sizeof *s);
    s->inner = inner;
    return (struct sluice_store_ops){held_load, held_save, held_clear, s, NULL};
}

static inline void held_store_release(struct held_store *s)
{
    atomic_store(&s->release, 1);
}

/* A gate with `limit` permits; the test fails if it cannot be made. */
static inline struct sluice_gate *make_gate(uint32_t limit)
{
    struct sluice_gate *g = NULL;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = limit}, &g), SLUICE_OK);
    return g;
}

/* splitmix64: a tiny deterministic per-thread RNG. */
static inline uint64_t test_rand(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Run fn(arg_i) on n threads, args spaced `stride` bytes apart, and join. */
static inline void test_run_threads(int n, void *(*fn)(void *), void *args, size_t stride)
{
    pthread_t tids[64];
    for (int i = 0; i < n; i++)
        pthread_create(&tids[i], NULL, fn, (char *)args + (size_t)i * stride);
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
}

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

#endif
