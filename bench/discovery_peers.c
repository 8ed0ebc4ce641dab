/*
 * discovery_peers.c — the peer baselines of the discovery bench: Netflix
 * concurrency-limits' AIMDLimit and Gradient2Limit (behind its
 * WindowedLimit) and Vector's adaptive request concurrency, written here
 * from their published update rules, not ported. Each drives the
 * simulator's gate directly from each sample, from sluice's jumpstart and
 * within its bounds, so only the update rule differs.
 */
#include "discovery_bench.h"

#include <math.h>

/* ---- the peer baselines: their update rules, our code ----------------------- */

static void peer_apply(struct peer *p)
{
    if (p->limit < 1)
        p->limit = 1;
    if (p->limit > MAX_LIMIT)
        p->limit = MAX_LIMIT;
    uint32_t next = (uint32_t)p->limit;
    if (next != p->applied) {
        sluice_gate_set_limit(p->gate, next);
        p->applied = next;
    }
}

/*
 * Netflix AIMDLimit: on a drop (or an RTT past the 5 s timeout) the limit
 * becomes max(1, min(limit - 1, floor(limit * 0.9))); otherwise, when the
 * call started with in-flight * 2 >= limit, it grows by one. Per sample.
 */
void netflix_aimd_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    (void)now;
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    double limit = floor(p->limit);
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD || s->latency_ns > 5 * SLUICE_NS_PER_SEC)
        p->limit = fmax(1, fmin(limit - 1, floor(limit * 0.9)));
    else if (s->in_flight_at_start * 2 >= limit)
        p->limit = limit + 1;
    peer_apply(p);
}

/*
 * Netflix Gradient2Limit behind WindowedLimit. A window collects samples
 * (drops included) and closes at its deadline, set when the previous one
 * closed to clamp(2 x that window's min RTT, 1 s, 30 s); a window with
 * fewer than 10 samples is dropped. Gradient2 sees a ready window's
 * average RTT and peak in-flight:
 *   long  = average of the first 10 windows, then an EMA over 600 windows;
 *           pulled down 10% when long > 2 x short
 *   skip when in-flight < limit / 2 (app-limited)
 *   g     = clamp(long / short, 0.5, 1)
 *   new   = limit * (1 - 0.2) + (g * limit + 4) * 0.2
 * Gradient2 does not react to drops themselves.
 */
void netflix_gradient2_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    p->win_rtt_sum += (double)s->latency_ns;
    if (!p->win_n || (double)s->latency_ns < p->win_min_rtt)
        p->win_min_rtt = (double)s->latency_ns;
    p->win_n++;
    if (s->in_flight_at_start > p->win_max_inflight)
        p->win_max_inflight = s->in_flight_at_start;
    p->win_drop |= s->outcome == SLUICE_OUTCOME_OVERLOAD;
    if (now < p->next_update_ns)
        return;
    double short_rtt = p->win_n ? p->win_rtt_sum / p->win_n : 0;
    bool ready = p->win_n >= 10;
    uint32_t inflight = p->win_max_inflight;
    double span = fmin(fmax(2 * p->win_min_rtt, 1e9), 30e9);
    p->next_update_ns = now + (int64_t)span;
    p->win_rtt_sum = 0;
    p->win_n = p->win_max_inflight = 0;
    p->win_drop = false;
    if (!ready)
        return;
    if (p->long_n < 10)
        p->long_rtt = (p->long_rtt * p->long_n + short_rtt) / (p->long_n + 1);
    else
        p->long_rtt += (short_rtt - p->long_rtt) * (2.0 / 601.0);
    p->long_n++;
    if (p->long_rtt / short_rtt > 2)
        p->long_rtt *= 0.9;
    if (inflight < p->limit / 2)
        return;
    double g = fmax(0.5, fmin(1.0, p->long_rtt / short_rtt));
    double next = g * p->limit + 4;
    p->limit = p->limit * 0.8 + next * 0.2;
    peer_apply(p);
}

/*
 * Vector ARC. Every response: back pressure (429/503/timeout) is noted;
 * a served call's RTT joins the current mean. Once per interval (one past
 * mean RTT): if the limit was reached, there was no back pressure and the
 * current mean is at most the past mean, the limit grows by one; else, on
 * back pressure or a current mean at or past past_mean + 2.5 x past
 * deviation, it becomes floor(limit * 0.9). The past RTT is an EWMA
 * (alpha 0.4) with variance.
 */
void vector_arc_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->in_flight_at_start >= p->applied)
        p->reached_limit = true;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD)
        p->had_back_pressure = true;
    if (s->outcome == SLUICE_OUTCOME_OK) {
        p->cur_sum += (double)s->latency_ns / 1e9;
        p->cur_n++;
    }
    double cur = p->cur_n ? p->cur_sum / p->cur_n : -1;
    if (p->round_us && cur >= 0)
        cur = round(cur * 1e6) / 1e6;
    if (!p->past_set) {
        if (cur >= 0) {
            p->past_mean = cur;
            p->past_var = 0;
            p->past_set = true;
            p->arc_next_ns = now + (int64_t)(cur * 1e9);
        }
        return;
    }
    if (now < p->arc_next_ns)
        return;
    double threshold = sqrt(p->past_var) * 2.5;
    if (p->limit < MAX_LIMIT && p->reached_limit && !p->had_back_pressure && cur >= 0 &&
        cur <= p->past_mean)
        p->limit = floor(p->limit) + 1;
    else if (p->limit > 1 && (p->had_back_pressure || cur >= p->past_mean + threshold))
        p->limit = fmax(1, floor(floor(p->limit) * 0.9));
    if (cur >= 0) {
        double diff = cur - p->past_mean, inc = 0.4 * diff;
        p->past_mean += inc;
        p->past_var = 0.6 * (p->past_var + diff * inc);
    }
    p->arc_next_ns = now + (int64_t)(p->past_mean * 1e9);
    p->cur_sum = 0;
    p->cur_n = 0;
    p->had_back_pressure = p->reached_limit = false;
    peer_apply(p);
}

void peer_on_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct peer *p = (struct peer *)ctx;
    p->on_sample(p, s, now);
}
