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
 * begun is never cut for it. It is forgotten a while after the newest
 * hang-up (patience_fresh_ns): a client that waits longer than the learned
 * time then gets the proxy's 504 and never hangs up itself, so without fresh
 * hang-ups the learned time is no longer evidence. How long a while: once it
 * is learned, the proxy's refusals keep every client from waiting that long,
 * so no client hangs up, and forgetting it is the only way to see whether
 * they still would; the price is one wave of requests queued without a
 * deadline until the clients hang up again, a learned time long. So it is
 * forgotten PATIENCE_FRESH_S after the newest hang-up, or PATIENCE_EXPLORE
 * learned times after it where that is longer, which keeps those waves to
 * about an eighth of the time. Measured (bench/openai_sdk_rate.py --case
 * stream: the SDK's 5 s timeout, streams through a proxy capped at 8):
 * forgotten after 10 s, a wave of 5 s waits came every 15 s, four in 90 s;
 * kept 35 s, it was forgotten 2 times in three 60 s runs against 8 (how much
 * that moves the first token is within those runs' noise: bench/RESULTS.md).
 *
 * Not every common time is a timeout. A client that closes all its
 * connections at once (a load test ending, a process exiting, a pool
 * recycled) cuts every call it had in flight, and on a busy proxy those calls
 * arrived together and are heard late together: wrk's end at 64 connections
 * taught 2-4 ms, and the next run was refused 85 % of its calls. Two things
 * tell it from a timeout, and both must hold before a time is first believed:
 * - it recurs: the hang-ups agree on it again PATIENCE_CONFIRM_NS or more
 *   after they first did (one moment's hang-ups, however many, could be one
 *   client leaving; clients with a timeout keep calling and keep leaving);
 * - the clients that waited about as long were mostly not answered: since
 *   the time was first agreed on, the hang-ups that agree with it are at
 *   least a quarter of the answers that began after half of it or more (a
 *   client with a timeout is never answered after it, and the calls it would
 *   have been answered on late are the ones it left; a load test's clients
 *   were answered thousands of times at the same waits between its ends).
 * The second keeps being checked while the time is believed: clients
 * answered later than it unlearn it at the next hang-up.
 *
 * What it learns is said where the operator looks: a line on stderr when a
 * backend's learned time is first believed, moves past PATIENCE_SPREAD of
 * what was said, or is forgotten; the admin page and /metrics while it holds
 * (patience_shown_ms, through main.c's sluice_admin_desc.start_deadline);
 * and the 503/504 of a request it refused names it (upstream.c), since that
 * client named no deadline of its own.
 *
 * State: per backend, in struct proxy; one thread (proxy.h), no locks. The
 * admin's threads read the learned time and the newest hang-up's, atomics.
 */
#include "proxy.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATIENCE_MIN 8u
#define PATIENCE_SPREAD 1.25
#define PATIENCE_FRESH_S 10
#define PATIENCE_FRESH_NS (PATIENCE_FRESH_S * INT64_C(1000000000))
#define PATIENCE_EXPLORE 7
#define PATIENCE_CONFIRM_NS INT64_C(100000000)

/* How long after the newest hang-up a time learned as `learned_ns` (0: none) stays evidence. */
static int64_t patience_fresh_ns(int64_t learned_ns)
{
    int64_t explore = PATIENCE_EXPLORE * learned_ns;
    return explore > PATIENCE_FRESH_NS ? explore : PATIENCE_FRESH_NS;
}

/* Two waits within PATIENCE_SPREAD of each other: the same patience. */
static bool agree(int64_t a, int64_t b)
{
    return (double)a * PATIENCE_SPREAD >= (double)b && (double)a <= (double)b * PATIENCE_SPREAD;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Say on stderr what the proxy now does for requests of `backend` that name no deadline,
 * when it changed: `ns` learned (0 = none), `why` the reason when it is none. */
static void announce(struct patience *pt, const char *backend, int64_t ns, const char *why)
{
    int64_t was = pt->announced_ns;
    if (ns && was && (double)ns <= (double)was * PATIENCE_SPREAD &&
        (double)was <= (double)ns * PATIENCE_SPREAD)
        return;
    if (!ns && !was)
        return;
    pt->announced_ns = ns;
    if (ns)
        fprintf(stderr,
                PROG ": backend %s: clients that name no deadline hang up after about %" PRId64
                     " ms when no answer has begun; that is now their start deadline (a call "
                     "that cannot start by then is refused at once; "
                     PROXY_START_DEADLINE_HEADER " or start_deadline_ms overrides it)\n",
                backend, ns / 1000000);
    else
        fprintf(stderr,
                PROG ": backend %s: %s; requests that name no deadline wait for a slot as long "
                     "as it takes again\n",
                backend, why);
}

/* An answer began `waited_ns` after its request arrived: its client waited that long
 * without hanging up. */
void patience_answered(struct patience *pt, int64_t waited_ns)
{
    pt->candidate_answered += pt->candidate_ns && 2 * waited_ns >= pt->candidate_ns;
}

/* A client of `backend` hung up `waited_ns` after its request arrived, before any answer
 * began. */
void patience_hung_up(struct patience *pt, const char *backend, int64_t waited_ns, int64_t now)
{
    if (now - pt->last_ns > patience_fresh_ns(pt->learned_ns))
        pt->candidate_ns = 0; /* what agreed before is no longer evidence */
    pt->ns[pt->added % PATIENCE_SAMPLES] = waited_ns;
    pt->added++;
    pt->last_ns = now;
    pt->candidate_hung += pt->candidate_ns && agree(waited_ns, pt->candidate_ns);
    uint32_t n = pt->added < PATIENCE_SAMPLES ? (uint32_t)pt->added : PATIENCE_SAMPLES;
    if (n < PATIENCE_MIN) /* nothing learned yet: n only grows */
        return;
    int64_t sorted[PATIENCE_SAMPLES];
    memcpy(sorted, pt->ns, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_i64);
    int64_t median = sorted[n / 2];
    uint32_t near = 0;
    for (uint32_t i = 0; i < n; i++)
        near += agree(sorted[i], median);
    const char *why = NULL;
    if (4 * near < 3 * n) {
        why = "its clients' last hang-ups no longer agree on a time";
        pt->candidate_ns = 0;
    } else {
        if (!pt->candidate_ns || !agree(median, pt->candidate_ns)) {
            pt->candidate_ns = median;
            pt->candidate_at = now;
            pt->candidate_hung = near;
            pt->candidate_answered = 0;
        }
        if (!pt->learned_ns && now - pt->candidate_at < PATIENCE_CONFIRM_NS)
            return; /* one moment's hang-ups: wait for them to recur */
        if (4 * pt->candidate_hung < pt->candidate_answered)
            why = "most of its clients that waited that long were answered, not gone";
    }
    pt->learned_ns = why ? 0 : median; /* one store: the admin reads it */
    announce(pt, backend, pt->learned_ns, why);
}

/* The learned start deadline of `backend`, ms from the request's arrival; -1 = none (not
 * learned, or no hang-up for patience_fresh_ns). */
int64_t patience_start_ms(struct patience *pt, const char *backend, int64_t now)
{
    int64_t fresh = patience_fresh_ns(pt->learned_ns);
    if (pt->learned_ns && now - pt->last_ns > fresh) {
        pt->learned_ns = 0;
        char why[64];
        snprintf(why, sizeof why, "no client has hung up for %" PRId64 " s", fresh / 1000000000);
        announce(pt, backend, 0, why);
    }
    return pt->learned_ns ? pt->learned_ns / 1000000 : -1;
}

/* What patience_start_ms would answer now, for the admin's threads: the same freshness rule,
 * without forgetting (that, and saying so, is the proxy thread's). */
int64_t patience_shown_ms(const struct patience *pt, int64_t now)
{
    int64_t learned = pt->learned_ns;
    return learned && now - pt->last_ns <= patience_fresh_ns(learned) ? learned / 1000000 : -1;
}
