/*
 * sluice/policy/discover.h — the default ceiling-discovery policy.
 *
 * What it is: a congestion controller tuned for remote model providers,
 * whose concurrency cap is hidden and whose calls take seconds.
 *
 *   slow start   From the jumpstart, every healthy window in which demand
 *                reached the limit doubles it (bounded by the calls the
 *                window actually served), until the first congestion signal.
 *   additive     After congestion, each healthy saturated window grows by
 *                half the distance to discovery's probe cap (the limit just
 *                below the last congestion, or the locked ceiling), at least
 *                1: a binary search that slows to +1 near the edge.
 *   overload     A fresh 429/503/timeout cuts the limit to limit·backoff at
 *                once (discovery closes the window on the first fresh one).
 *   latency knee A window whose mean latency exceeds the baseline by more
 *                than `knee` — and by more than noise_z standard errors of
 *                the window mean, so small windows do not cry wolf — is
 *                suspect: the limit holds. `confirm` suspect windows in a
 *                row mean requests are queueing: the limit is cut to
 *                limit·max(knee_floor, baseline/mean), i.e. to about what
 *                the provider serves without a queue, and the verdict's
 *                estimate is that figure plus half the knee tolerance.
 *                (One 3-sigma window in a few hundred is noise; two in a
 *                row almost never are, and a real queue persists.)
 *
 * The baseline is learnt from every window that is not suspect: a running
 * mean over the first windows, then an exponential average, each step
 * clipped to two standard errors (see sluice__discover_learn). "Standard
 * error" is that of the difference between the window's mean and the
 * baseline, so a young baseline, itself uncertain, is not trusted to call a
 * knee on its own.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_DISCOVER_H
#define SLUICE_POLICY_DISCOVER_H

#include "../policy.h"

struct sluice_policy_discover_params {
    double backoff;       /* factor applied on a fresh overload, in (0, 1) (default: 0.9) */
    double knee;          /* relative latency rise over the baseline that marks a knee,
                             in (0, 100] (default: 0.15, i.e. +15%) */
    double knee_floor;    /* deepest single cut on a knee, in (0, 1) (default: 0.5) */
    double noise_z;       /* standard errors of the window mean a knee must also clear,
                             in (0, 100] (default: 3) */
    double baseline_weight; /* averaging weight of a healthy window, in (0, 1] (default: 0.125) */
    uint32_t confirm;     /* suspect windows in a row that make a knee, in [1, 1000]
                             (default: 2) */
    uint32_t min_samples; /* served calls a window needs before its latency counts,
                             in [1, 65536] (default: 8) */
};

struct sluice_policy_discover {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_discover_params params;
    bool slow_start;
    uint32_t suspect;   /* suspect windows in a row */
    double baseline_ns; /* 0 until the first window with enough samples */
    double baseline_n;  /* calls behind the baseline, for the running-mean start */
};

SLUICE_INLINE uint32_t sluice__discover_reset(struct sluice_policy *self, uint32_t jumpstart,
                                              bool warm)
{
    struct sluice_policy_discover *p = (struct sluice_policy_discover *)self;
    p->slow_start = !warm;
    p->suspect = 0;
    p->baseline_ns = 0;
    p->baseline_n = 0;
    return jumpstart;
}

/* Relative spread (coefficient of variation) of a window's latencies,
 * from their mean absolute deviation: sigma = sqrt(pi/2)·MAD for a normal. */
SLUICE_INLINE double sluice__window_cv(const struct sluice_window *w)
{
    return 1.2533141373155 * (double)w->latency_mad_ns / (double)w->latency_mean_ns;
}

/* Relative standard error of (window mean − baseline): both are estimates. */
SLUICE_INLINE double sluice__discover_se(const struct sluice_policy_discover *p,
                                         const struct sluice_window *w)
{
    /* An exponential average remembers about n_ok/weight calls. */
    double remembered = (double)w->n_ok / p->params.baseline_weight;
    double n_base = p->baseline_n < remembered ? p->baseline_n : remembered;
    double var = 1.0 / (double)w->n_ok + (n_base > 0 ? 1.0 / n_base : 1.0 / (double)w->n_ok);
    return sluice__window_cv(w) * sqrt(var);
}

/*
 * Move the baseline towards a healthy window's mean: by a running-mean
 * weight at first, then by baseline_weight, and by at most two standard
 * errors per window in either direction. The clip makes it a robust
 * (median-like) estimate: one wild window cannot drag it far, and a queue
 * creeping in below the knee can only pull it up slowly. (Tighter clips
 * were tried: they also slow the recovery from an unlucky first window, and
 * a baseline left 20% low calls false knees in reject mode.)
 */
SLUICE_INLINE void sluice__discover_learn(struct sluice_policy_discover *p,
                                          const struct sluice_window *w, double mean, double se)
{
    p->baseline_n += w->n_ok;
    double weight = (double)w->n_ok / p->baseline_n;
    if (weight < p->params.baseline_weight)
        weight = p->params.baseline_weight;
    double step = mean - p->baseline_ns, clip = 2.0 * se * p->baseline_ns;
    step = step > clip ? clip : step < -clip ? -clip : step;
    p->baseline_ns += weight * step;
}

SLUICE_INLINE struct sluice_verdict sluice__discover_knee(struct sluice_policy_discover *p,
                                                          const struct sluice_window *w,
                                                          double ratio)
{
    double factor = 1.0 / ratio;
    if (factor < p->params.knee_floor)
        factor = p->params.knee_floor;
    double serves = (double)w->limit / ratio * (1.0 + 0.5 * p->params.knee);
    uint32_t estimate = serves < 1.0 ? 1u : sluice__sat_u32(serves);
    p->slow_start = false;
    return sluice__verdict(sluice__policy_cut(w->limit, factor), SLUICE_CAUSE_LATENCY, estimate);
}

SLUICE_INLINE struct sluice_verdict sluice__discover_update(struct sluice_policy *self,
                                                            const struct sluice_window *w)
{
    struct sluice_policy_discover *p = (struct sluice_policy_discover *)self;
    const struct sluice_policy_discover_params *k = &p->params;
    if (w->n_fresh_overload) {
        p->slow_start = false;
        return sluice__verdict_overload(w, k->backoff);
    }
    if (w->n_ok < k->min_samples || w->latency_mean_ns <= 0)
        return sluice__verdict_hold(w);
    double mean = (double)w->latency_mean_ns;
    if (p->baseline_ns <= 0)
        p->baseline_ns = mean;
    double ratio = mean / p->baseline_ns;
    double se = sluice__discover_se(p, w);
    double noise = k->noise_z * se;
    double threshold = noise > k->knee ? noise : k->knee;
    if (ratio > 1.0 + threshold) {
        if (++p->suspect >= k->confirm) {
            p->suspect = 0;
            return sluice__discover_knee(p, w, ratio);
        }
        return sluice__verdict_hold(w);
    }
    p->suspect = 0;
    sluice__discover_learn(p, w, mean, se);
    if (!w->saturated)
        return sluice__verdict_hold(w);
    if (p->slow_start) {
        uint32_t step = w->n_ok < w->limit ? w->n_ok : w->limit;
        return sluice__verdict(sluice__sat_add(w->limit, step), SLUICE_CAUSE_SLOW_START, 0);
    }
    uint32_t step = w->probe_cap > w->limit ? (w->probe_cap - w->limit) / 2 : 0;
    return sluice__verdict(sluice__sat_add(w->limit, step ? step : 1), SLUICE_CAUSE_ADDITIVE, 0);
}

SLUICE__POLICY_OPS(discover, true)

/* Initialise in caller storage; SLUICE_EINVAL (with *why naming the field) on a bad value. */
SLUICE_INLINE int sluice_policy_discover_init(struct sluice_policy_discover *p,
                                              const struct sluice_policy_discover_params *params,
                                              const char **why)
{
    struct sluice_policy_discover_params r;
    memset(&r, 0, sizeof r);
    if (params)
        r = *params;
    SLUICE__DEFAULT(r.backoff, 0.9);
    SLUICE__DEFAULT(r.knee, 0.15);
    SLUICE__DEFAULT(r.knee_floor, 0.5);
    SLUICE__DEFAULT(r.noise_z, 3.0);
    SLUICE__DEFAULT(r.baseline_weight, 0.125);
    SLUICE__DEFAULT(r.confirm, 2);
    SLUICE__DEFAULT(r.min_samples, 8);
    if (sluice__check_range(r.backoff, 0.0, 1.0, false,
                            "sluice_policy_discover_params.backoff must be in (0, 1)", why) ||
        sluice__check_range(r.knee, 0.0, 100.0, true,
                            "sluice_policy_discover_params.knee must be in (0, 100]", why) ||
        sluice__check_range(r.knee_floor, 0.0, 1.0, false,
                            "sluice_policy_discover_params.knee_floor must be in (0, 1)", why) ||
        sluice__check_range(r.noise_z, 0.0, 100.0, true,
                            "sluice_policy_discover_params.noise_z must be in (0, 100]", why) ||
        sluice__check_range(r.baseline_weight, 0.0, 1.0, true,
                            "sluice_policy_discover_params.baseline_weight must be in (0, 1]",
                            why) ||
        sluice__check_range((double)r.confirm, 0.0, 1000.0, true,
                            "sluice_policy_discover_params.confirm must be in [1, 1000]", why) ||
        sluice__check_range((double)r.min_samples, 0.0, 65536.0, true,
                            "sluice_policy_discover_params.min_samples must be in [1, 65536]",
                            why))
        return SLUICE_EINVAL;
    p->base.ops = sluice__discover_ops();
    p->params = r;
    sluice__discover_reset(&p->base, 1, false);
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_DISCOVER_H */
