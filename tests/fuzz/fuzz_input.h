/*
 * fuzz_input.h — reading typed values off a libFuzzer input, front to back
 * (libFuzzer's FuzzedDataProvider, in C). Every read is defined for any
 * input: past the end it yields zeros, so a short input is a valid, small
 * test case rather than an early return.
 *
 * Integers come either raw or, one time in four, from a table of edge
 * values (0, 1, limits and their neighbours), because the interesting
 * behaviour of a validator sits at its bounds and a mutator rarely hits
 * 65537 by chance.
 */
#ifndef SLUICE_TESTS_FUZZ_INPUT_H
#define SLUICE_TESTS_FUZZ_INPUT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* libFuzzer's entry point, defined by each target. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fuzz_in {
    const uint8_t *p;
    size_t n;
};

static inline uint64_t fuzz_bytes(struct fuzz_in *in, size_t k)
{
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++) {
        v = (v << 8) | (in->n ? *in->p : 0);
        if (in->n) {
            in->p++;
            in->n--;
        }
    }
    return v;
}

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
    return (uint8_t)fuzz_bytes(in, 1);
}

static inline bool fuzz_bool(struct fuzz_in *in)
{
    return fuzz_u8(in) & 1u;
}

/* A value in [0, n) (n > 0). */
static inline uint32_t fuzz_pick(struct fuzz_in *in, uint32_t n)
{
    return (uint32_t)(fuzz_bytes(in, 2) % n);
}

static inline uint32_t fuzz_u32(struct fuzz_in *in)
{
    static const uint32_t edge[] = {0,     1,     2,         4,          5,          16,
                                    1023,  1024,  1025,      65535,      65536,      65537,
                                    1u << 20,  (1u << 20) + 1, 1u << 30, (1u << 30) + 1,
                                    INT32_MAX, UINT32_MAX - 1, UINT32_MAX};
    uint8_t how = fuzz_u8(in);
    if (how % 4 == 0)
        return edge[fuzz_pick(in, sizeof edge / sizeof edge[0])];
    return (uint32_t)fuzz_bytes(in, how % 4);
}

static inline int64_t fuzz_i64(struct fuzz_in *in)
{
    static const int64_t edge[] = {0, 1, -1, 1000, 1000000, 1000000000, INT64_C(60000000000),
                                   INT64_C(86400), INT64_C(316224000), INT64_C(316224001),
                                   INT64_C(86400000000000), INT64_C(86400000000001),
                                   INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1};
    uint8_t how = fuzz_u8(in);
    if (how % 4 == 0)
        return edge[fuzz_pick(in, sizeof edge / sizeof edge[0])];
    return (int64_t)fuzz_bytes(in, 1 + how % 8);
}

static inline double fuzz_double(struct fuzz_in *in)
{
    static const double edge[] = {0.0, -0.0, 1e-300, 0.125, 0.5, 0.9, 1.0, 2.0, 1000.0,
                                  1000.0000001, 1e6, 1e300, -1.0};
    uint8_t how = fuzz_u8(in);
    if (how % 8 == 1)
        return NAN;
    if (how % 8 == 2)
        return how & 8 ? INFINITY : -INFINITY;
    if (how % 8 == 3) {
        uint64_t bits = fuzz_bytes(in, 8);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    return edge[fuzz_pick(in, sizeof edge / sizeof edge[0])];
}

/* Up to `max` bytes (length from the input) into buf, NUL-terminated; may hold any byte
 * but NUL. Returns buf. */
static inline char *fuzz_str(struct fuzz_in *in, char *buf, size_t max)
{
    size_t len = fuzz_u8(in);
    if (len & 0x80)
        len = (len & 0x7f) << 2 | (fuzz_u8(in) & 3); /* up to 511 */
    if (len > max)
        len = max;
    size_t i = 0;
    for (; i < len && in->n; i++) {
        buf[i] = (char)(*in->p ? *in->p : 'x');
        in->p++;
        in->n--;
    }
    buf[i] = '\0';
    return buf;
}

#endif
