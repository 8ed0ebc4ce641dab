/*
 * fuzz_sse — the server-sent-events parser (sluice/sse.h) on any bytes, with
 * a buffer of 3 to 1026 bytes and any line_max the buffer allows, fed once
 * whole and once in fragments whose sizes come from the input.
 *
 * Checked for every input:
 *   - fragmentation changes nothing: the same events (type, data, length,
 *     in order), the same comment count, the same final status and error;
 *   - every event's data is NUL-terminated at data_len, fits the buffer,
 *     and its type fits SLUICE_SSE_TYPE_MAX;
 *   - a stream that is not OK is SLUICE_EIO with a message, and stays so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/sse.h>

#include "fuzz_input.h"

#define BUF_MAX 1026

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_sse: %s\n", what);
        abort();
    }
}

struct run {
    size_t size;
    uint64_t hash; /* FNV-1a over every event's type, length and data */
    size_t events;
};

static void mix(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        *h = (*h ^ b[i]) * UINT64_C(1099511628211);
}

static int on_event(void *ctx, const struct sluice_sse_event *ev)
{
    struct run *r = ctx;
    check(ev->data_len < r->size, "the data fits the buffer");
    check(ev->data[ev->data_len] == '\0', "the data is NUL-terminated");
    size_t type_len = strlen(ev->type);
    check(type_len < SLUICE_SSE_TYPE_MAX, "the type fits SLUICE_SSE_TYPE_MAX");
    mix(&r->hash, ev->type, type_len + 1);
    mix(&r->hash, &ev->data_len, sizeof ev->data_len);
    mix(&r->hash, ev->data, ev->data_len);
    r->events++;
    return SLUICE_OK;
}

static int parse(const uint8_t *text, size_t n, size_t size, size_t line_max,
                 struct fuzz_in *cuts, struct run *r, struct sluice_sse *p)
{
    static char buf[BUF_MAX];
    memset(r, 0, sizeof *r);
    r->size = size;
    r->hash = UINT64_C(14695981039346656037);
    check(sluice_sse_init(p, &(struct sluice_sse_desc){.buf = buf,
                                                       .size = size,
                                                       .line_max = line_max,
                                                       .on_event = on_event,
                                                       .ctx = r}) == SLUICE_OK,
          "init accepts line_max <= size - 2");
    int status = SLUICE_OK;
    for (size_t at = 0; at < n;) {
        size_t k = cuts ? 1 + fuzz_u8(cuts) % 17 : n - at;
        if (k > n - at)
            k = n - at;
        status = sluice_sse_feed(p, (const char *)text + at, k);
        at += k;
        if (status != SLUICE_OK)
            break;
    }
    return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    size_t buf_size = 3 + fuzz_pick(&in, BUF_MAX - 2);
    size_t line_max = fuzz_bool(&in) ? fuzz_pick(&in, (uint32_t)buf_size - 1) : 0;
    /* The cut sizes are read from the same bytes as the stream: any input is both. */
    const uint8_t *text = in.p;
    size_t n = in.n;
    struct fuzz_in cuts = {text, n};
    struct run whole, pieces;
    struct sluice_sse a, b;
    int sa = parse(text, n, buf_size, line_max, NULL, &whole, &a);
    int sb = parse(text, n, buf_size, line_max, &cuts, &pieces, &b);
    check(sa == sb, "fragmentation does not change the status");
    check(whole.events == pieces.events && whole.hash == pieces.hash,
          "fragmentation does not change the events");
    check(sluice_sse_comments(&a) == sluice_sse_comments(&b), "nor the comments counted");
    check(strcmp(sluice_sse_error(&a), sluice_sse_error(&b)) == 0, "nor the error");
    check(sa == SLUICE_OK || sa == SLUICE_EIO, "a failed stream is SLUICE_EIO");
    check((sa == SLUICE_OK) == (*sluice_sse_error(&a) == '\0'), "a failure has a message");
    if (sa == SLUICE_EIO)
        check(sluice_sse_feed(&a, "\n\n", 2) == SLUICE_EIO, "the failure is sticky");
    return 0;
}
