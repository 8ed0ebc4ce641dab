/*
 * patience.c — the clients' patience, learned per backend, as the start
 * deadline of requests that name none.
 *
 * Why: a client that sends no X-Sluice-*-Deadline-Ms header, through a
 * backend that sets no default, still has a deadline: its own timeout (an
 * OpenAI SDK's `timeout`, an HTTP client's read timeout), after which it
 * hangs up if no answer has begun. The proxy cannot see it, so its queue is
 * the plain FIFO (waiting 1024): under overload every caller waits there
 * until it leaves, a call granted just before its caller leaves is cut a few
 * milliseconds in (the provider may keep working on it), and discovery hears
 * only cancels, which say nothing. Measured (bench/openai_sdk_rate.py --case
 * overload: the OpenAI Node SDK with `timeout: 250`, 64 callers, a provider
 * capped at 24): the limit fell to 1-3 and the proxy served 0.01-0.02 of
 * what the same proxy fixed at the cap served.
 *
 * The model: hang-ups before any answer began, timed from the request's
 * arrival, cluster at the clients' timeout when there is one; a user who
 * closes a tab hangs up at any time. So once PATIENCE_MIN of the last
 * PATIENCE_SAMPLES hang-ups are in, and three quarters of them lie within
 * PATIENCE_SPREAD of their median, that median is the start deadline of
 * every request that names no deadline (not a lower quantile: a deadline
 * before a client's own cuts calls it would have waited for, and the lower
 * quartile served 0.54 of the oracle in one run of three; one after it costs
 * little, the client leaves first, and those hang-ups keep the evidence
 * fresh): the pool refuses at once what it cannot start by then (a 503 the
 * client can retry elsewhere or later), a queued call that can no longer
 * start leaves the line, and a call cut there teaches discovery "longer than
 * t" (sluice/pool_deadlines.h). A start deadline, not a whole-call one: a
 * client's timeout runs until the answer begins, and a long stream that has
 * begun is never cut for it. It is forgotten PATIENCE_FRESH_NS after the
 * newest hang-up: a client that waits longer than the learned time then gets
 * the proxy's 504 and never hangs up itself, so without fresh hang-ups the
 * learned time is no longer evidence.
 *
 * State: per backend, in struct proxy; one thread (proxy.h), no locks.
 */
#include "proxy.h"

#include <stdlib.h>
#include <string.h>

#define PATIENCE_MIN 8u
#define PATIENCE_SPREAD 1.25
#define PATIENCE_FRESH_NS (10 * INT64_C(1000000000))

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A client hung up `waited_ns` after its request arrived, before any answer began. */
void patience_hung_up(struct patience *pt, int64_t waited_ns, int64_t now)
{
    pt->ns[pt->added % PATIENCE_SAMPLES] = waited_ns;
    pt->added++;
    pt->last_ns = now;
    uint32_t n = pt->added < PATIENCE_SAMPLES ? (uint32_t)pt->added : PATIENCE_SAMPLES;
    pt->learned_ns = 0;
    if (n < PATIENCE_MIN)
        return;
    int64_t sorted[PATIENCE_SAMPLES];
    memcpy(sorted, pt->ns, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_i64);
    double median = (double)sorted[n / 2];
    uint32_t near = 0;
    for (uint32_t i = 0; i < n; i++)
        near += (double)sorted[i] * PATIENCE_SPREAD >= median &&
                (double)sorted[i] <= median * PATIENCE_SPREAD;
    if (4 * near >= 3 * n)
        pt->learned_ns = sorted[n / 2];
}

/* The learned start deadline, ms from the request's arrival; -1 = none (not learned, or
 * no hang-up for PATIENCE_FRESH_NS). */
int64_t patience_start_ms(const struct patience *pt, int64_t now)
{
    if (!pt->learned_ns || now - pt->last_ns > PATIENCE_FRESH_NS)
        return -1;
    return pt->learned_ns / 1000000;
}
