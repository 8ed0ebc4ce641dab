/*
 * sluice/pool_state.h — what one pool is made of: its descriptions (with
 * their limits, defaults and checks), the record of a call, and struct
 * sluice_pool itself. Part of sluice/pool.h, which is what to include.
 *
 * The model: a pool is one block, allocated at create (sluice/pool.h),
 * holding its configuration (immutable after create), the counters every
 * call path writes, the state of Retry-After holds (sluice/pool_hold.h),
 * lingering permits (sluice/pool_linger.h) and the deadline rules
 * (sluice/pool_deadlines.h), the service-time estimates and the gate. Every
 * other pool header reads and writes this one struct: its fields are
 * grouped by who writes them and when, and fields written at different
 * moments of a run sit on different cache lines.
 *
 * Checks: sluice__pool_check, _check_deadlines and _check_discovery are
 * shared by pool and engine creation, so both name a bad field the same
 * way (`<owner>.<field>`). They only read their arguments.
 *
 * Locking and memory ordering: nothing here takes a lock; sluice__pool_count
 * is a relaxed fetch-add (a counter, not a publication). Beside each shared
 * field is the lock that guards it or what kind of atomic it is; the header
 * that uses a field says why that is enough.
 */
#ifndef SLUICE_POOL_STATE_H
#define SLUICE_POOL_STATE_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "discovery.h"
#include "gate.h"
#include "policy.h"
#include "service_time.h"

#define SLUICE_POOL_ACTIVE_MAX UINT32_C(65536)       /* <= SLUICE_GATE_LIMIT_MAX */
#define SLUICE_POOL_WAITING_MAX (UINT32_C(1) << 20)
#define SLUICE_POOL_WAITING_DEFAULT UINT32_C(1024)
#define SLUICE_POOL_START_QUANTILE_DEFAULT UINT32_C(10) /* percent; see sluice/service_time.h */
#define SLUICE_POOL_LINGER_MAX_MS_DEFAULT UINT32_C(30000)
#define SLUICE_POOL_LINGER_MAX_MS UINT32_C(3600000) /* an hour: longer is a leak, not a call */

/*
 * Whether a call abandoned after its request was sent still counts against
 * the provider's cap until it would have finished (sluice/pool_linger.h).
 */
enum sluice_linger {
    SLUICE_LINGER_LEARNED = 0, /* follow the evidence (the default): keep permits (the safe
                                  assumption) until a trial at the locked ceiling shows the
                                  provider frees the slot of an abandoned call (then release
                                  at once) or keeps working (keep them for good): see
                                  sluice__pool_linger_verdict. Fixed pools keep them */
    SLUICE_LINGER_ON,          /* always keep them (hosted APIs that keep generating) */
    SLUICE_LINGER_OFF,         /* release at once (servers that abort on disconnect) */
};

/* The name of a linger mode or learned state ("learned", "on", "off"); never NULL. */
SLUICE_INLINE const char *sluice_linger_name(enum sluice_linger mode)
{
    return mode == SLUICE_LINGER_ON ? "on" : mode == SLUICE_LINGER_OFF ? "off" : "learned";
}

/*
 * The deadline rules of one pool (sluice/pool_deadlines.h), zero = default.
 * Every field needs an active limit when set: an unlimited pool never
 * queues and has no permits to keep.
 */
struct sluice_deadline_desc {
    struct sluice_opt_u32 start_quantile; /* percent of recent successful calls faster than
                                             the expected service time; a call with less
                                             time left is not started, nor, while others
                                             queue behind it, one with less than the
                                             median (default: 10; SLUICE_SOME(0) = start
                                             every call, both rules off; at most
                                             SLUICE_SERVICE_PERCENT_MAX = 50) */
    bool queue_late;                      /* admit and queue a call with a deadline even when
                                             the predicted wait makes it too late, and keep it
                                             queued until its deadline (default: false: such a
                                             call gets SLUICE_ELATE at admission, and a queued
                                             one leaves the line once it can no longer start
                                             in time) */
    enum sluice_linger linger;            /* whether an abandoned call keeps its permit
                                             (default: SLUICE_LINGER_LEARNED) */
    struct sluice_opt_u32 linger_max_ms;  /* most an abandoned call keeps its permit, from
                                             its start; while cut calls' permits linger,
                                             as at a cold start, calls with deadlines may
                                             be refused with SLUICE_ELATE
                                             (sluice/pool_deadlines.h) (default: 30000;
                                             SLUICE_SOME(0) = release at once; at most
                                             SLUICE_POOL_LINGER_MAX_MS) */
};

struct sluice_pool_desc {
    uint32_t active;               /* most generation calls in flight; with `discovery`, the
                                      most discovery may ever allow (default: 0 = unlimited;
                                      at most SLUICE_POOL_ACTIVE_MAX) */
    struct sluice_opt_u32 waiting; /* admitted runs beyond `active` (default: 1024 when active
                                      is set; SLUICE_SOME(0) = none; only with active;
                                      at most SLUICE_POOL_WAITING_MAX) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
    const struct sluice_clock *clock;         /* times calls, and discovery (default:
                                                 CLOCK_MONOTONIC) */
    /* Ceiling discovery, copied at create (default: NULL = the limit stays at `active`).
     * Needs `active`; its max_limit defaults to `active` and may not exceed it; its policy
     * must be adaptive; gate, clock and allocator must be NULL (the pool's are used). */
    const struct sluice_discovery_desc *discovery;
    struct sluice_deadline_desc deadlines; /* (default: all defaults, see there) */
    char *error;       /* receives a message naming the field when create fails
                          (default: NULL = no message); "" on success */
    size_t error_size; /* bytes at error, NUL included (default: 0) */
};

/* A snapshot; each field is exact when the pool is quiet. */
struct sluice_pool_counts {
    uint32_t admitted;         /* runs holding an admission (limited pools; 0 when unlimited) */
    uint32_t in_flight;        /* generation calls started and not yet ended */
    uint32_t queued;           /* generation calls waiting to start: queued for a permit, or
                                  holding one until a Retry-After hold ends */
    uint32_t active;           /* the current active limit (0 = unlimited); discovery moves it */
    uint32_t active_max;       /* the configured active limit (0 = unlimited) */
    uint32_t waiting_capacity; /* the configured waiting capacity: admitted runs beyond
                                  `active`, so admission capacity is active + waiting_capacity */
    bool closed;               /* sluice_pool_close was called */
    uint64_t calls_ok;         /* calls ended with SLUICE_OUTCOME_OK, since create */
    uint64_t calls_overload;   /* ... with SLUICE_OUTCOME_OVERLOAD (429/503, provider timeout) */
    uint64_t calls_ignored;    /* ... with SLUICE_OUTCOME_IGNORE (transport errors, aborts) */
    uint64_t calls_censored;   /* ... with SLUICE_OUTCOME_CENSORED (cut by the caller's
                                  deadline after the request was sent) */
    /* The deadline rules and what the operator's views count (since create). */
    uint32_t lingering;            /* abandoned calls still holding their permit (counted in
                                      in_flight too) */
    enum sluice_linger linger;     /* the configured linger mode */
    enum sluice_linger linger_now; /* what abandoned calls do now: ON, OFF, or LEARNED while
                                      the trial has not decided (they keep their permits,
                                      or are released on trial) */
    int64_t expected_ns;           /* expected service time (sluice/service_time.h); 0 = unknown */
    int64_t expected_first_ns;     /* expected time to first byte (the latency signal); 0 =
                                      unknown */
    uint64_t refused_capacity;     /* admissions refused with SLUICE_ECAPACITY */
    uint64_t refused_early;        /* ... with SLUICE_ELATE (the deadline rules) */
    uint64_t refused_late;         /* calls not started: too little time left (ETIMEDOUT) */
    uint64_t timeouts;             /* calls whose deadline passed while queued or, abandoned
                                      or read on (sluice_pool_call_read_on), in transfer */
    uint64_t cancels;              /* ... whose token fired while queued or in transfer */
    uint64_t lingered;             /* abandoned calls that kept their permit for a while */
};

/* Which counter of struct sluice_pool_counts' second half; indexes sluice_pool.counted. */
enum sluice__pool_counter {
    SLUICE__POOL_CAPACITY = 0,
    SLUICE__POOL_EARLY,
    SLUICE__POOL_LATE,
    SLUICE__POOL_TIMEOUT,
    SLUICE__POOL_CANCEL,
    SLUICE__POOL_LINGERED,
    SLUICE__POOL_COUNTERS
};

/* One generation call, filled by sluice_pool_call_begin. */
struct sluice_call {
    int64_t start_ns;            /* pool clock when the call started (permit in hand, any
                                    Retry-After hold over) */
    int64_t queued_ns;           /* pool clock time spent waiting for the permit and any hold */
    uint32_t in_flight_at_start; /* calls in flight once this one started, itself included */
    uint32_t limit_at_start;     /* the discovered limit when it started (0 = not adaptive) */
    bool refused_late;           /* SLUICE_ETIMEDOUT from call_begin: not started, because it
                                    could no longer be in time (left the line, or granted with
                                    too little left: see sluice/pool_deadlines.h) */
    enum sluice_expiry expired;  /* with SLUICE_ETIMEDOUT: which deadline ended (or would have
                                    ended) the call */
    uint32_t phantoms_at_start;  /* abandoned calls released on trial and surely still running
                                    at the provider when this one started (LEARNED lingering) */
    uint32_t shadows_at_start;   /* ... and those perhaps still running (the phantoms among
                                    them): sluice__pool_trial */
};

/*
 * Refusals on a full pool are counted per thread, not on one shared word: a
 * fetch-add every rejecting thread shares would make the refusal, which
 * must stay about one load, several times dearer (a locked instruction,
 * and a line bouncing between the rejecting threads). A thread claims a
 * shard once (a CAS on its owner word) and from then on counts there with a
 * plain load and store, which is exact because it is the shard's only
 * writer; stats sums the shards. A thread that finds every shard it may use
 * taken by others falls back to the shared fetch-add. A thread's identity
 * is its thread pointer, unique among live threads; a new thread that
 * inherits a dead one's goes on counting in its shard, which is still exact.
 */
#define SLUICE__POOL_REFUSAL_SHARDS 8

struct sluice__pool_shard {
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uintptr_t) owner; /* 0 = unclaimed */
    _Atomic(uint64_t) refused; /* written by the owner only */
};

struct sluice_pool_waiter;   /* sluice/pool_call.h */
struct sluice__pool_holder;  /* sluice/pool_hold.h */
struct sluice__pool_watcher; /* sluice/pool_linger.h */

struct sluice_pool {
    /* Admissions and calls are written by different moments of a run. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) admitted;
    _Atomic(uint32_t) arriving; /* admitted calls not yet in the line (sluice_pool_arrive);
                                   written with `admitted`, by the same callers */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) in_flight;
    _Atomic(uint64_t) ended[4]; /* calls ended: OK, OVERLOAD, IGNORE (the rest), CENSORED;
                                   call_end already owns this line, so counting costs no
                                   extra cache miss */
    /* Immutable after create, read by every call. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) uint32_t active; /* configured; 0 = unlimited, no gate */
    uint32_t waiting;
    uint32_t admit_max; /* active + waiting (fixed pools; adaptive ones use the current limit) */
    struct sluice_discovery *discovery; /* in this block; NULL: a fixed or unlimited pool */
    size_t block_size;
    struct sluice_clock clock;
    struct sluice_allocator allocator;
    /* Retry-After holds (adaptive pools only): touched when a call must wait one out. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) sluice_spinlock hold_lock;
    struct sluice__pool_holder *holders;       /* calls asleep on a hold; guarded by hold_lock */
    struct sluice_pool_waiter *async_held;     /* async calls waiting out a hold; hold_lock */
    _Atomic(uint32_t) holding;                 /* calls waiting out a hold (both kinds), for stats */
    _Atomic(uint32_t) n_async_held;            /* entries on async_held, and calls about to
                                                  park there: call_end's cheap test */
    _Atomic(uint32_t) hold_epoch;              /* bumped when close wakes the sleepers */
    _Atomic(uint32_t) closed;
    /* Deadline rules (immutable after create; 0 = off). */
    uint32_t start_percent;
    bool queue_late;
    enum sluice_linger linger;
    int64_t linger_max_ns;
    /* LEARNED lingering: what the trial found (SLUICE_LINGER_LEARNED while undecided, then
     * _ON: the provider keeps working, or _OFF: it frees the slot), and the trial's state. */
    _Atomic(uint32_t) linger_learned;
    _Atomic(uint32_t) phantoms;      /* abandoned calls released on trial, surely still running */
    _Atomic(uint32_t) shadows;       /* ... perhaps still running (the phantoms among them) */
    _Atomic(uint32_t) trial_served;  /* calls served above the ceiling with phantoms around */
    /* The standing-queue test (CoDel's): the least queue wait of the calls started in the
     * current interval, when it ends (pool clock), and whether the last one's passed the
     * target (sluice/pool_deadlines.h, "A queue that stands"), and when it last refused a call. */
    _Atomic(int64_t) sojourn_min;
    _Atomic(int64_t) sojourn_until;
    _Atomic(uint32_t) standing;
    _Atomic(int64_t) standing_refused; /* INT64_MIN = never */
    _Atomic(int64_t) *phantom_slots; /* until when each counts (sluice__pool_phantom_until);
                                        SLUICE__LINGER_FREE = empty */
    _Atomic(int64_t) *shadow_slots;  /* the same for the shadows (sluice__pool_trial) */
    /* Lingering permits: one slot per permit (active of them), after the discovery block. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) lingering;
    _Atomic(uint32_t) linger_epoch;  /* bumped when a linger is added: watchers re-time */
    _Atomic(int64_t) linger_next;    /* earliest release (pool clock); INT64_MAX = none */
    sluice_spinlock linger_lock;     /* the reaper's try-lock */
    _Atomic(uint32_t) linger_hint;   /* where to look for a free slot first (a hint) */
    _Atomic(int64_t) *linger_slots;  /* release instants; SLUICE__LINGER_FREE = empty */
    struct sluice__pool_watcher *watchers; /* blocked calls queued for a permit; hold_lock */
    /* What the operator's views count; recorded after permits move. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) counted[SLUICE__POOL_COUNTERS];
    struct sluice__pool_shard refusals[SLUICE__POOL_REFUSAL_SHARDS]; /* + counted[CAPACITY] */
    struct sluice_histogram queue_wait, call_time;
    struct sluice_service_time service;    /* whole calls: what a call needs to finish */
    struct sluice_service_time first_byte; /* the latency signal: what a call needs to begin */
    struct sluice_gate gate; /* initialised only when active > 0 */
};

#define SLUICE__LINGER_FREE INT64_MIN

/*
 * Check a pool's two controls. On failure returns SLUICE_EINVAL and writes a
 * message naming the field as `<owner>.<field>` into err (may be NULL).
 * Shared by pool and engine creation so both say the same thing.
 */
SLUICE_INLINE int sluice__pool_check(uint32_t active, struct sluice_opt_u32 waiting,
                                     const char *owner, char *err, size_t err_size)
{
    char msg[256];
    if (waiting.set && active == 0)
        snprintf(msg, sizeof msg,
                 "%s.waiting set without an active limit (set %s.active or drop waiting)", owner,
                 owner);
    else if (active > SLUICE_POOL_ACTIVE_MAX)
        snprintf(msg, sizeof msg, "%s.active = %u is above the maximum %u (SLUICE_POOL_ACTIVE_MAX)",
                 owner, (unsigned)active, (unsigned)SLUICE_POOL_ACTIVE_MAX);
    else if (waiting.set && waiting.value > SLUICE_POOL_WAITING_MAX)
        snprintf(msg, sizeof msg,
                 "%s.waiting = %u is above the maximum %u (SLUICE_POOL_WAITING_MAX)", owner,
                 (unsigned)waiting.value, (unsigned)SLUICE_POOL_WAITING_MAX);
    else
        return SLUICE_OK;
    return sluice__fail(err, err_size, "%s", msg);
}

/*
 * Check a pool's deadline rules (see struct sluice_deadline_desc). Messages
 * name the field as `<owner>.deadlines.<field>`. Shared by pool and engine
 * creation.
 */
SLUICE_INLINE int sluice__pool_check_deadlines(uint32_t active, const struct sluice_deadline_desc *dl,
                                               const char *owner, char *err, size_t err_size)
{
    char msg[256];
    const char *field = dl->start_quantile.set  ? "start_quantile"
                        : dl->linger_max_ms.set ? "linger_max_ms"
                        : dl->queue_late        ? "queue_late"
                        : dl->linger            ? "linger"
                                                : NULL;
    if (field && active == 0)
        snprintf(msg, sizeof msg,
                 "%s.deadlines.%s set without an active limit (an unlimited pool never queues; "
                 "set %s.active or drop it)",
                 owner, field, owner);
    else if (dl->start_quantile.value > SLUICE_SERVICE_PERCENT_MAX)
        snprintf(msg, sizeof msg,
                 "%s.deadlines.start_quantile = %u is above %u (SLUICE_SERVICE_PERCENT_MAX: "
                 "a higher quantile refuses calls that were likely to finish)",
                 owner, (unsigned)dl->start_quantile.value, (unsigned)SLUICE_SERVICE_PERCENT_MAX);
    else if ((unsigned)dl->linger > (unsigned)SLUICE_LINGER_OFF)
        snprintf(msg, sizeof msg,
                 "%s.deadlines.linger = %u is not a mode (SLUICE_LINGER_LEARNED, _ON or _OFF)",
                 owner, (unsigned)dl->linger);
    else if (dl->linger_max_ms.value > SLUICE_POOL_LINGER_MAX_MS)
        snprintf(msg, sizeof msg,
                 "%s.deadlines.linger_max_ms = %u is above the maximum %u "
                 "(SLUICE_POOL_LINGER_MAX_MS)",
                 owner, (unsigned)dl->linger_max_ms.value, (unsigned)SLUICE_POOL_LINGER_MAX_MS);
    else
        return SLUICE_OK;
    return sluice__fail(err, err_size, "%s", msg);
}

/*
 * Check the discovery description of a pool with `active` (node_id already
 * filled in by an engine) and resolve it into *cfg (may be NULL). Messages,
 * discovery's own included, name the field as `<owner>.discovery.<field>`.
 */
SLUICE_INLINE int sluice__pool_check_discovery(uint32_t active,
                                               const struct sluice_discovery_desc *dd,
                                               const char *owner, char *err, size_t err_size,
                                               struct sluice__discovery_cfg *cfg)
{
    char msg[384];
    if (active == 0)
        snprintf(msg, sizeof msg,
                 "%s.discovery needs an active limit: the most calls discovery may allow "
                 "(set %s.active)",
                 owner, owner);
    else if (dd->gate)
        snprintf(msg, sizeof msg,
                 "%s.discovery.gate must be NULL: discovery drives the pool's own gate", owner);
    else if (dd->clock)
        snprintf(msg, sizeof msg,
                 "%s.discovery.clock must be NULL: discovery shares the clock that times the "
                 "pool's calls",
                 owner);
    else if (dd->allocator)
        snprintf(msg, sizeof msg,
                 "%s.discovery.allocator must be NULL: discovery lives in the pool's block",
                 owner);
    else if (dd->policy && !dd->policy->ops)
        snprintf(msg, sizeof msg,
                 "%s.discovery.policy was never initialised (call its sluice_policy_*_init "
                 "first)",
                 owner);
    else if (dd->policy && !dd->policy->ops->adaptive)
        snprintf(msg, sizeof msg,
                 "%s.discovery.policy is not adaptive (for a fixed limit drop %s.discovery and "
                 "keep %s.active)",
                 owner, owner, owner);
    else if (dd->max_limit > active)
        snprintf(msg, sizeof msg,
                 "%s.discovery.max_limit = %u is above %s.active = %u (active is the most calls "
                 "discovery may allow)",
                 owner, (unsigned)dd->max_limit, owner, (unsigned)active);
    else {
        /* Validation only checks that a gate is given; the real one is the pool's. */
        struct sluice_gate stand_in;
        struct sluice_discovery_desc probe = *dd;
        struct sluice__discovery_cfg resolved;
        probe.gate = &stand_in;
        SLUICE__DEFAULT(probe.max_limit, active);
        char root[64];
        snprintf(root, sizeof root, "%s.discovery", owner);
        if (sluice__discovery_resolve(&probe, &resolved, root, err, err_size) != SLUICE_OK)
            return SLUICE_EINVAL;
        if (cfg)
            *cfg = resolved;
        return SLUICE_OK;
    }
    return sluice__fail(err, err_size, "%s", msg);
}

/* The waiting capacity a valid description resolves to. */
SLUICE_INLINE uint32_t sluice__pool_waiting(uint32_t active, struct sluice_opt_u32 waiting)
{
    SLUICE__DEFAULT_OPT(waiting, SLUICE_POOL_WAITING_DEFAULT);
    return active ? waiting.value : 0;
}

/* One more of what the operator's views count (struct sluice_pool_counts' second half). */
SLUICE_INLINE void sluice__pool_count(struct sluice_pool *p, enum sluice__pool_counter which)
{
    atomic_fetch_add_explicit(&p->counted[which], 1u, SLUICE_RELAXED);
}

#endif /* SLUICE_POOL_STATE_H */
