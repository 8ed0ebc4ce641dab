/* Shared helpers for sluice's tests. */
#ifndef SLUICE_TESTS_COMMON_H
#define SLUICE_TESTS_COMMON_H

#include <pthread.h>
#include <stdint.h>

/* Threaded tests scale their iteration counts down under ThreadSanitizer. */
#ifndef SLUICE_TEST_SCALE
#define SLUICE_TEST_SCALE 1
#endif
#define SCALED(n) ((n) / SLUICE_TEST_SCALE > 0 ? (n) / SLUICE_TEST_SCALE : 1)

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

#endif
