/*
 * sluice/policy/fixed.h — a policy that never moves the limit.
 *
 * What it is: the policy of non-adaptive nodes (a local model whose
 * concurrency is bounded by VRAM, a backend with a contractual limit).
 * Discovery treats a node with this policy as fixed: it never probes,
 * locks, persists or clears it, and its status line carries no glyph.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_FIXED_H
#define SLUICE_POLICY_FIXED_H

#include "../policy.h"

struct sluice_policy_fixed_params {
    uint32_t limit; /* the limit, at most SLUICE_POLICY_LIMIT_MAX (default: 0 = the discovery
                       jumpstart) */
};

struct sluice_policy_fixed {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_fixed_params params;
};

SLUICE_INLINE uint32_t sluice__fixed_reset(struct sluice_policy *self, uint32_t jumpstart,
                                           bool warm)
{
    (void)warm;
    struct sluice_policy_fixed *p = (struct sluice_policy_fixed *)self;
    return p->params.limit ? p->params.limit : jumpstart;
}

SLUICE_INLINE struct sluice_verdict sluice__fixed_update(struct sluice_policy *self,
                                                         const struct sluice_window *w)
{
    (void)self;
    return sluice__verdict_hold(w);
}

SLUICE__POLICY_OPS(fixed, false)

/* Initialise in caller storage; SLUICE_EINVAL on a bad value, with a message naming the
 * field in `error` (error_size bytes; NULL = no message). */
SLUICE_INLINE int sluice_policy_fixed_init(struct sluice_policy_fixed *p,
                                           const struct sluice_policy_fixed_params *params,
                                           char *error, size_t error_size)
{
    uint32_t limit = params ? params->limit : 0;
    if (limit > SLUICE_POLICY_LIMIT_MAX)
        return sluice__fail(error, error_size, "sluice_policy_fixed_params.limit must be at most "
                                               "SLUICE_POLICY_LIMIT_MAX");
    p->base.ops = sluice__fixed_ops();
    p->params.limit = limit;
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_FIXED_H */
