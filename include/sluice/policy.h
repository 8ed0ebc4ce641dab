/*
 * sluice/policy.h — the ceiling-discovery policy interface.
 *
 * (Seam only: the sample types the pool feeds to discovery. The policy ops
 * and built-in algorithms land with the discovery layer.)
 */
#ifndef SLUICE_POLICY_H
#define SLUICE_POLICY_H

#include "cc.h"

/* How one generation call ended, as far as the provider's capacity goes. */
enum sluice_outcome {
    SLUICE_OUTCOME_OK = 0,   /* the provider served the call */
    SLUICE_OUTCOME_OVERLOAD, /* HTTP 429/503 or a provider timeout: back off */
    SLUICE_OUTCOME_IGNORE,   /* transport error or caller cancel: says nothing about capacity */
};

/* One completed generation call. */
struct sluice_sample {
    int64_t latency_ns;          /* call start to end, queue wait excluded */
    uint32_t in_flight_at_start; /* permits held when the call started, itself included */
    enum sluice_outcome outcome;
    int64_t retry_after_ns;      /* provider's Retry-After, 0 = none */
};

#endif /* SLUICE_POLICY_H */
