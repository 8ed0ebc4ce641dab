/*
 * gate_stats.c — the gate bench's statistics kit (medians over repetitions,
 * percentiles of millions of wait samples by quickselect) and the small
 * helpers every gate file uses (warnings, cache-line allocation, sleep).
 */
#include "gate_bench.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

int gb_warnings;

__attribute__((format(printf, 1, 2))) void gb_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  !!! WARNING: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    gb_warnings++;
}

void *gb_alloc_line(size_t size)
{
    size_t rounded = (size + SLUICE_CACHELINE - 1) / SLUICE_CACHELINE * SLUICE_CACHELINE;
    void *p = aligned_alloc(SLUICE_CACHELINE, rounded);
    if (!p) {
        fprintf(stderr, "gate bench: out of memory\n");
        exit(1);
    }
    memset(p, 0, rounded);
    return p;
}

void gb_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int gb_repeats(const struct bench_opts *opts)
{
    return opts->repeats < GB_MAX_REPEATS ? opts->repeats : GB_MAX_REPEATS;
}

/* ---- statistics ------------------------------------------------------------ */

double gb_median_of(double *v, int n)
{
    return bench_median(v, (size_t)n);
}

/* Hoare quickselect: afterwards a[k] holds the k-th smallest, with nothing
 * larger before it and nothing smaller after it. O(n) on average, so the
 * millions of wait samples per run need no full sort. */
static void gb_select(uint32_t *a, ptrdiff_t n, ptrdiff_t k)
{
    ptrdiff_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        uint32_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        ptrdiff_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                uint32_t tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return;
    }
}

/* Same rank rule as bench_percentile. */
static ptrdiff_t gb_rank(size_t n, double pct)
{
    size_t idx = (size_t)ceil(pct / 100.0 * (double)n);
    idx = idx == 0 ? 0 : idx - 1;
    return (ptrdiff_t)(idx < n ? idx : n - 1);
}

struct gb_waits gb_wait_stats(uint32_t *a, size_t n)
{
    struct gb_waits w = {0, 0, 0, 0, n};
    if (n == 0)
        return w;
    ptrdiff_t k50 = gb_rank(n, 50), k99 = gb_rank(n, 99), k999 = gb_rank(n, 99.9);
    gb_select(a, (ptrdiff_t)n, k50);
    gb_select(a + k50, (ptrdiff_t)n - k50, k99 - k50);
    gb_select(a + k99, (ptrdiff_t)n - k99, k999 - k99);
    uint32_t max = 0;
    for (size_t i = (size_t)k999; i < n; i++)
        max = a[i] > max ? a[i] : max;
    w.p50 = a[k50];
    w.p99 = a[k99];
    w.p999 = a[k999];
    w.max = max;
    return w;
}
