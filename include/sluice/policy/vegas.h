/*
 * sluice/policy/vegas.h — a queue-estimate controller after TCP Vegas.
 *
 * What it is: with limit L, no-load latency minRTT and current latency RTT,
 * the provider is holding about  q = L·(1 − minRTT/RTT)  requests in a queue
 * (L·minRTT/RTT is what it can serve without one). Thresholds scale with
 * lg = max(1, log10 L), as in Netflix's VegasLimit: q <= lg grows by
 * beta·lg (far from any queue), q < alpha·lg grows by lg, q > beta·lg
 * shrinks by lg, anything between holds. A fresh overload cuts to
 * L·backoff.
 *
 * minRTT is the lowest window mean seen (means, not single calls: the
 * minimum of single calls falls as windows grow). It drifts up by `drift`
 * per window so a provider that became slower for good is re-learned
 * instead of reading as a permanent queue.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_VEGAS_H
#define SLUICE_POLICY_VEGAS_H

#include "../policy.h"

struct sluice_policy_vegas_params {
    double alpha;   /* grow while q < alpha·lg, in (0, 1000] (default: 3) */
    double beta;    /* shrink while q > beta·lg, in (alpha, 1000] (default: 6) */
    double drift;   /* per-window upward drift of minRTT, in [0, 1) (default: 0.01) */
    double backoff; /* factor applied on a fresh overload, in (0, 1) (default: 0.9) */
};

struct sluice_policy_vegas {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_vegas_params params;
    double min_rtt_ns; /* 0 before the first window */
};

SLUICE_INLINE uint32_t sluice__vegas_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)warm;
    ((struct sluice_policy_vegas *)self)->min_rtt_ns = 0;
    return jumpstart;
}

SLUICE_INLINE struct sluice_verdict sluice__vegas_update(struct sluice_policy *self,
                                                         const struct sluice_window *w)
{
    struct sluice_policy_vegas *p = (struct sluice_policy_vegas *)self;
    if (w->n_fresh_overload)
        return sluice__verdict_overload(w, p->params.backoff);
    if (!w->n_ok)
        return sluice__verdict_hold(w);
    double rtt = (double)w->latency_mean_ns;
    p->min_rtt_ns *= 1.0 + p->params.drift;
    if (p->min_rtt_ns <= 0 || rtt < p->min_rtt_ns)
        p->min_rtt_ns = rtt;
    double limit = w->limit;
    double queue = limit * (1.0 - p->min_rtt_ns / rtt);
    double lg = log10((double)limit);
    if (lg < 1.0)
        lg = 1.0;
    uint32_t step = (uint32_t)lg;
    if (queue > p->params.beta * lg) {
        uint32_t next = w->limit > step ? w->limit - step : 1;
        return sluice_verdict_make(next, SLUICE_CAUSE_LATENCY, next);
    }
    if (!w->saturated)
        return sluice__verdict_hold(w);
    if (queue <= lg)
        return sluice_verdict_make(sluice__sat_add(w->limit, sluice__sat_u32(p->params.beta * lg)),
                               SLUICE_CAUSE_ADDITIVE, 0);
    if (queue < p->params.alpha * lg)
        return sluice_verdict_make(sluice__sat_add(w->limit, step), SLUICE_CAUSE_ADDITIVE, 0);
    return sluice__verdict_hold(w);
}

SLUICE__POLICY_OPS(vegas, true)

/* The parameters: X(field, default, lo, hi, hi_inclusive, message); see SLUICE__POLICY_RESOLVE. */
#define SLUICE__VEGAS_PARAMS(X)                                                                    \
    X(alpha, 3.0, 0.0, 1000.0, true, "sluice_policy_vegas_params.alpha must be in (0, 1000]")      \
    X(beta, 6.0, r.alpha, 1000.0, true,                                                            \
      "sluice_policy_vegas_params.beta must exceed alpha and be at most 1000")                     \
    X(drift, 0.01, -1e-12, 1.0, false, "sluice_policy_vegas_params.drift must be in [0, 1)")       \
    X(backoff, 0.9, 0.0, 1.0, false, "sluice_policy_vegas_params.backoff must be in (0, 1)")

/* Initialise in caller storage; SLUICE_EINVAL on a bad value, with a message naming the
 * field in `error` (error_size bytes; NULL = no message). */
SLUICE_INLINE int sluice_policy_vegas_init(struct sluice_policy_vegas *p,
                                           const struct sluice_policy_vegas_params *params,
                                           char *error, size_t error_size)
{
    struct sluice_policy_vegas_params r;
    SLUICE__POLICY_RESOLVE(SLUICE__VEGAS_PARAMS);
    p->base.ops = sluice__vegas_ops();
    p->params = r;
    p->min_rtt_ns = 0;
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_VEGAS_H */
