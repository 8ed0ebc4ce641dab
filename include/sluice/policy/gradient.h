/*
 * sluice/policy/gradient.h — a long/short latency-ratio controller.
 *
 * What it is: the gradient family (after Netflix's Gradient2). The short
 * latency is the window's mean; the long latency is an exponential average
 * across windows. Their ratio, times a tolerance and clamped to [0.5, 1],
 * is the gradient g: 1 when latency is at or under its long-term level,
 * below 1 when requests are queueing. Each saturated window moves a
 * fractional estimate towards limit·g + queue by `smoothing`, so the limit
 * creeps up by about smoothing·queue per window while latency is flat and
 * falls as soon as latency rises by more than the tolerance. A fresh
 * overload cuts the estimate to limit·backoff (Gradient2 itself ignores
 * rejections; a provider's 429 is too clear a signal to drop).
 *
 * When the long average sits above twice the short one (latency recovered
 * after a long episode of load) it is pulled down by 10% per window, so the
 * controller does not keep treating the old, slow latency as normal.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_GRADIENT_H
#define SLUICE_POLICY_GRADIENT_H

#include "../policy.h"

struct sluice_policy_gradient_params {
    double tolerance; /* short latency may exceed long·tolerance before the limit falls,
                         in [1, 100] (default: 1.5) */
    double smoothing; /* weight of each new estimate, in (0, 1] (default: 0.2) */
    double long_weight; /* weight of a window in the long average, in (0, 1] (default: 0.05) */
    double queue;     /* headroom added per window while latency is flat, in (0, 1e6]
                         (default: 4) */
    double backoff;   /* factor applied on a fresh overload, in (0, 1) (default: 0.9) */
};

struct sluice_policy_gradient {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_gradient_params params;
    double estimate; /* fractional limit; the applied limit is its floor */
    double long_ns;  /* long-term latency average; 0 before the first window */
};

SLUICE_INLINE uint32_t sluice__gradient_reset(struct sluice_policy *self, uint32_t jumpstart,
                                              bool warm)
{
    (void)warm;
    struct sluice_policy_gradient *p = (struct sluice_policy_gradient *)self;
    p->estimate = jumpstart;
    p->long_ns = 0;
    return jumpstart;
}

SLUICE_INLINE struct sluice_verdict sluice__gradient_update(struct sluice_policy *self,
                                                            const struct sluice_window *w)
{
    struct sluice_policy_gradient *p = (struct sluice_policy_gradient *)self;
    const struct sluice_policy_gradient_params *k = &p->params;
    /* Discovery may have clamped or moved the limit since our last answer. */
    if (p->estimate < w->limit || p->estimate >= w->limit + 1.0)
        p->estimate = w->limit;
    if (w->n_fresh_overload) {
        struct sluice_verdict v = sluice__verdict_overload(w, k->backoff);
        p->estimate = v.limit;
        return v;
    }
    if (!w->n_ok || w->latency_mean_ns <= 0) /* a zero mean would divide by zero below */
        return sluice__verdict_hold(w);
    double short_ns = (double)w->latency_mean_ns;
    p->long_ns = p->long_ns > 0 ? p->long_ns + k->long_weight * (short_ns - p->long_ns) : short_ns;
    if (p->long_ns > 2.0 * short_ns)
        p->long_ns *= 0.9;
    if (!w->saturated)
        return sluice__verdict_hold(w);
    double g = k->tolerance * p->long_ns / short_ns;
    g = g < 0.5 ? 0.5 : g > 1.0 ? 1.0 : g;
    double target = p->estimate * g + k->queue;
    p->estimate = p->estimate * (1.0 - k->smoothing) + target * k->smoothing;
    if (p->estimate < 1.0)
        p->estimate = 1.0;
    uint32_t next = sluice__sat_u32(p->estimate);
    if (next > w->limit)
        return sluice_verdict_make(next, SLUICE_CAUSE_ADDITIVE, 0);
    if (next < w->limit)
        return sluice_verdict_make(next, SLUICE_CAUSE_LATENCY, next);
    return sluice__verdict_hold(w);
}

SLUICE__POLICY_OPS(gradient, true)

/* The parameters: X(field, default, lo, hi, hi_inclusive, message); see SLUICE__POLICY_RESOLVE. */
#define SLUICE__GRADIENT_PARAMS(X)                                                                 \
    X(tolerance, 1.5, 0.999999, 100.0, true,                                                       \
      "sluice_policy_gradient_params.tolerance must be in [1, 100]")                               \
    X(smoothing, 0.2, 0.0, 1.0, true, "sluice_policy_gradient_params.smoothing must be in (0, 1]") \
    X(long_weight, 0.05, 0.0, 1.0, true,                                                           \
      "sluice_policy_gradient_params.long_weight must be in (0, 1]")                               \
    X(queue, 4.0, 0.0, 1e6, true, "sluice_policy_gradient_params.queue must be in (0, 1e6]")       \
    X(backoff, 0.9, 0.0, 1.0, false, "sluice_policy_gradient_params.backoff must be in (0, 1)")

/* Initialise in caller storage; SLUICE_EINVAL on a bad value, with a message naming the
 * field in `error` (error_size bytes; NULL = no message). */
SLUICE_INLINE int sluice_policy_gradient_init(struct sluice_policy_gradient *p,
                                              const struct sluice_policy_gradient_params *params,
                                              char *error, size_t error_size)
{
    struct sluice_policy_gradient_params r;
    SLUICE__POLICY_RESOLVE(SLUICE__GRADIENT_PARAMS);
    p->base.ops = sluice__gradient_ops();
    p->params = r;
    sluice__gradient_reset(&p->base, 1, false);
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_GRADIENT_H */
