/*
 * sluice/policy/aimd.h — additive increase, multiplicative decrease.
 *
 * What it is: the loss-based classic. Each window with a fresh overload
 * (429/503/timeout, or a mean latency above `timeout_ns` when set) cuts the
 * limit to limit·backoff; each healthy window in which demand reached the
 * limit adds `increase`. It ignores latency otherwise, so against a provider
 * that queues instead of rejecting it grows until the provider's own queue
 * overflows.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_AIMD_H
#define SLUICE_POLICY_AIMD_H

#include "../policy.h"

struct sluice_policy_aimd_params {
    double backoff;     /* factor applied on overload, in (0, 1) (default: 0.9) */
    uint32_t increase;  /* added per healthy saturated window, at most SLUICE_POLICY_LIMIT_MAX
                           (default: 1) */
    int64_t timeout_ns; /* a window mean above this counts as overload, >= 0
                           (default: 0 = off) */
};

struct sluice_policy_aimd {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_aimd_params params;
};

SLUICE_INLINE uint32_t sluice__aimd_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)self;
    (void)warm;
    return jumpstart;
}

SLUICE_INLINE struct sluice_verdict sluice__aimd_update(struct sluice_policy *self,
                                                        const struct sluice_window *w)
{
    struct sluice_policy_aimd *p = (struct sluice_policy_aimd *)self;
    if (w->n_fresh_overload)
        return sluice__verdict_overload(w, p->params.backoff);
    if (p->params.timeout_ns && w->n_ok && w->latency_mean_ns > p->params.timeout_ns)
        return sluice_verdict_make(sluice__policy_cut(w->limit, p->params.backoff),
                               SLUICE_CAUSE_LATENCY, 0);
    if (w->saturated && w->n_ok)
        return sluice_verdict_make(sluice__sat_add(w->limit, p->params.increase),
                               SLUICE_CAUSE_ADDITIVE, 0);
    return sluice__verdict_hold(w);
}

SLUICE__POLICY_OPS(aimd, true)

/* The parameters: X(field, default, lo, hi, hi_inclusive, message); see SLUICE__POLICY_RESOLVE. */
#define SLUICE__AIMD_PARAMS(X)                                                                     \
    X(backoff, 0.9, 0.0, 1.0, false, "sluice_policy_aimd_params.backoff must be in (0, 1)")        \
    X(increase, 1, 0.0, (double)SLUICE_POLICY_LIMIT_MAX, true,                                     \
      "sluice_policy_aimd_params.increase must be at most SLUICE_POLICY_LIMIT_MAX")                \
    X(timeout_ns, 0, -1.0, 1e30, false, "sluice_policy_aimd_params.timeout_ns must not be negative")

/* Initialise in caller storage; SLUICE_EINVAL on a bad value, with a message naming the
 * field in `error` (error_size bytes; NULL = no message). */
SLUICE_INLINE int sluice_policy_aimd_init(struct sluice_policy_aimd *p,
                                          const struct sluice_policy_aimd_params *params,
                                          char *error, size_t error_size)
{
    struct sluice_policy_aimd_params r;
    SLUICE__POLICY_RESOLVE(SLUICE__AIMD_PARAMS);
    p->base.ops = sluice__aimd_ops();
    p->params = r;
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_AIMD_H */
