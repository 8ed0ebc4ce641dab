/*
 * sluice/pool.h — one backend's capacity pool: bounded, immediate admission
 * of runs plus a FIFO gate of generation permits, optionally driven by
 * ceiling discovery.
 *
 * What it is: the two controls a backend registration carries.
 *   `active`   most generation (model) calls in flight at once;
 *   `waiting`  how many admitted runs may exist beyond the active ones.
 * A run calls sluice_pool_admit() once, before any expensive preparation,
 * and sluice_pool_leave() once when it is done, whatever happened. Every
 * model call of an admitted run — the first one and every repair — sits
 * between sluice_pool_call_begin() and sluice_pool_call_end(), which take
 * and give back one permit of the gate. Those two functions are the only
 * place permits move, so ceiling discovery hooks into them alone.
 *
 *   admit  ->  [prepare]  ->  call_begin .. model call .. call_end  ->  [validate]
 *          ->  (repair: call_begin .. call_end again, no re-admission)  ->  leave
 *
 * A pool with active = 0 is unlimited: admission always succeeds and calls
 * never touch a gate; the pool only counts calls in flight for its stats.
 *
 * Adaptive pools: a pool created with a discovery description
 * (sluice/discovery.h) carries one discovery node whose limit drives the
 * gate. `active` is then the hard maximum (discovery's max_limit defaults
 * to it and may not exceed it); the gate starts at the jumpstart, or at a
 * live lock read back from the store. call_end records every call's
 * sample (sluice_discovery_record) *before* giving the permit back, so a
 * cut made for an overload takes effect before the permit moves on, and
 * runs discovery's effects after it (sluice_discovery_hand_out_grants,
 * then sluice_discovery_flush), so no store call or callback delays the
 * next call in line. call_begin
 * honours the provider's Retry-After (sluice_discovery_hold_until): a call
 * granted its permit while the hold lasts waits it out, permit in hand,
 * until the hold ends, its deadline passes (SLUICE_ETIMEDOUT) or its token
 * fires (SLUICE_ECANCELED); either way it releases the permit and the
 * client is never called. Waiting with the permit keeps FIFO order (the
 * hold only delays calls that were next anyway) and bounds the calls
 * waiting out a hold by the limit. sluice_pool_clear() clears the node but
 * keeps a live hold: it is the provider's word about now, and waking the
 * held calls would only send a burst into more 429s. Admission capacity
 * moves with the discovered limit: current limit + waiting, so an explicit
 * `waiting = SLUICE_SOME(0)` means no backlog beyond the limit in force
 * (runs already admitted are never evicted when it falls). Fixed and
 * unlimited pools pay one pointer test for all of this.
 *
 * Effects off the permit path: call_end feeds the sample to discovery
 * (bounded in-memory work under discovery's update try-lock), releases the
 * permit and hands out the grants of a limit raise that sample made
 * (waking every sync waiter granted before any async callback runs), and
 * only then runs discovery's effects (sluice_discovery_flush: store
 * hand-off, event callbacks). So no store call and no user callback delays
 * the next call in line.
 *
 * Two call paths with one queue: sluice_pool_call_begin blocks the calling
 * thread; sluice_pool_call_begin_async (event loops) queues a waiter whose
 * callback runs exactly once. Both join the same FIFO gate, wait out the
 * same Retry-After hold (the async one on the pool's list of async holders,
 * started by sluice_pool_poll or by the next call_end once the hold is
 * over) and share the same accounting. A pool's callers never need its gate.
 *
 * In flight, everywhere (stats, status lines, events): generation calls
 * started (permit in hand, any hold over) and not yet ended. Calls still
 * waiting out a hold count as queued.
 *
 * Shutdown: sluice_pool_close() makes every later admit return
 * SLUICE_ECLOSED, wakes every queued call (sync and async, and those
 * waiting out a hold) with SLUICE_ECLOSED, and lets calls in flight finish.
 *
 * Deadlines (limited pools; the rules read sluice/service.h's estimates of
 * the node's service time and of its time to first byte — quantiles of
 * the product-limit estimate over recent calls, finished or cut by their
 * deadline — and are off until they have samples). A call may carry two deadlines (sluice/time.h): a *start*
 * deadline (it must have begun by then; for a stream, delivered its first
 * byte) and the whole-call deadline. The model, in the shape of HAProxy's
 * `maxconn` + `timeout queue` and CoDel's sojourn rule: a queue is only
 * worth joining for a call that can still be served in time, so the queue
 * never holds what cannot be.
 *   - Refuse at admission what the queue cannot serve in time (the
 *     default for a call with a deadline; sluice_deadline_desc.queue_late
 *     turns it off). sluice_pool_admit_by predicts the wait: when every
 *     permit is taken, a newcomer waits for the calls queued ahead of it
 *     and itself to be handed permits, which come free at `limit` per
 *     median service time (Little's law: the median, a robust stand-in for
 *     the mean of a skewed duration): wait = (queued + 1) x median / limit;
 *     with a free permit, 0. A run whose wait plus the service time it
 *     needs passes its deadline, or whose wait plus the time to its first
 *     byte passes its start deadline, gets SLUICE_ELATE at once, so a
 *     server can shed it or fail over within its own latency budget, and
 *     the provider's permits go to calls that can finish. How wrong it can
 *     be: it cannot see runs admitted but still preparing (they queue
 *     later, ahead of nobody yet), nor a Retry-After hold, nor a limit that
 *     discovery is about to raise or cut; calls lingering after an abandon
 *     release on their own schedule. It is an estimate for shedding load,
 *     never a promise: a run it admits can still time out.
 *     What a call needs is the median while calls queue (every permit is
 *     taken: under overload a permit spent on a call with less than an
 *     even chance is one a caller with time to spare does not get) and
 *     the low quantile with a permit free (it would otherwise go unused).
 *   - Leave the line when it can no longer start in time. A queued call
 *     waits for its permit only until the last instant it could still be
 *     started usefully (sluice_pool_wait_bound: its deadline less the
 *     median service time, its start deadline less the median time to
 *     first byte); then it leaves with SLUICE_ETIMEDOUT and refused_late
 *     set, instead of timing out at the head of the line and taking a
 *     permit from a caller with time to spare.
 *   - A queue that stands is cut to a target (CoDel's sojourn rule: a
 *     queue that absorbs bursts is good, one that never drains only adds
 *     latency, since the provider is saturated either way). The target is
 *     two hand-offs of a permit (SLUICE_POOL_STANDING_HANDOFFS x the median
 *     service time / the limit: enough queue that a caller is waiting
 *     whenever a permit comes free, so the provider stays as busy as a
 *     longer queue would keep it), at most the median time to first byte;
 *     the interval is the median service time. From when every call
 *     started over an interval waited longer than the target until a
 *     newcomer finds a permit free (the queue drained) an interval after
 *     the rule last refused a call (no excess since: a permit free for
 *     a moment between hand-offs, while refused callers are still
 *     coming back, is no drained queue), the queue stands, and
 *     admission also refuses
 *     (SLUICE_ELATE) a call with a deadline whose predicted wait passes
 *     the target, however far its deadline. (It stands until it drains,
 *     not until one interval's waits fall under the target: they do as
 *     soon as the rule works, and a queue let grow again each time would
 *     swing between the two.) So under sustained overload a served call
 *     waits about two hand-offs (a streamed answer's first byte comes
 *     about as soon as with a free permit), every permit stays busy, and
 *     the excess is refused at once instead of queueing towards its
 *     deadline: 250 ms deadlines on a 200 ms provider capped at 24 queued
 *     up to 50 ms with the first-byte target, and every call so started
 *     had less time to finish than one that found a free permit. A burst
 *     into a queue that drains is admitted as far as the deadlines allow.
 *     Off with queue_late.
 *   - Don't start what cannot finish. A call that gets its permit (any
 *     hold over) with less of its deadline left than the expected service
 *     time (or of its start deadline than the expected time to first byte)
 *     is not started: call_begin gives the permit to the next in line and
 *     returns SLUICE_ETIMEDOUT with call->refused_late set (an async
 *     call's callback gets SLUICE_ETIMEDOUT, if its waiter names a
 *     deadline). The client is never called; stats count it in
 *     refused_late. Why: the FIFO gate hands a permit to the oldest
 *     waiter, which under overload has the least time left; started, it
 *     would be aborted mid-transfer and cost the provider work thrown
 *     away. Configured by sluice_deadline_desc.start_quantile (0 disables
 *     every estimate-based rule). While other calls queue behind it, a call
 *     is also not started with less time left than the median service time
 *     (less than an even chance): its permit goes to the next in line,
 *     which arrived later and so (with deadlines of one length, a server's
 *     usual case) has more time left. With nobody behind it, a call starts
 *     on the low quantile alone: the permit would otherwise go unused.
 *   - A service time the cuts hide. When most recent calls were cut by
 *     their deadlines, the median is only known to be longer than the
 *     time they had (sluice_service_hidden), and no wait is known to be
 *     affordable: a call with a deadline is admitted only onto a free
 *     permit, a queued one leaves the line, and one handed a permit
 *     while others queue is not started. Calls then start with their
 *     whole budget, which is what lets them finish and the median be
 *     seen again. (Off, the rules let every call queue towards its
 *     deadline, so each started with no time left and was cut: 3 calls
 *     served in 12 s beside an oracle's 619, a loaded machine's cold
 *     start, two runs in five.)
 *   - What a cut call teaches. A call its caller's deadline ended after
 *     the request was sent, at time t, says "this call takes longer than
 *     t", not "overload": sluice_pool_call_abandon gives discovery a
 *     SLUICE_OUTCOME_CENSORED sample (sluice/policy.h), which it uses.
 *   - Lingering permits. A call the caller gives up on after its request
 *     was sent (its deadline or token fired mid-transfer) may still be
 *     running at the provider, which then keeps counting it against its
 *     cap (hosted APIs may keep generating; inference servers such as vLLM
 *     abort a request whose client hung up). sluice_deadline_desc.linger
 *     says which (SLUICE_LINGER_ON, _OFF, or _LEARNED, the default: see
 *     enum sluice_linger). Where it keeps working, ending the call
 *     with sluice_pool_call_abandon keeps its permit and its place in the
 *     in-flight count (so the next call's in_flight_at_start counts it)
 *     for the high quantile of recent service times after it was given up
 *     (sluice_service_linger_until: a call that has outlived its deadline
 *     is a long one, and the successes seen are censored by the deadlines),
 *     capped by sluice_deadline_desc.linger_max_ms from its start (0
 *     disables); then the permit is released. Who releases it, so that no
 *     permit is lost and nothing stalls without traffic: the next
 *     call_begin or call_end on the pool, sluice_pool_poll (and so
 *     sluice_engine_poll; event loops arm a timer for
 *     sluice_pool_next_release, as the curl loop does), and — for blocking
 *     callers queued for a permit — one of them: in a pool with lingering
 *     enabled, a contended call_begin queues through the gate's async path
 *     and parks on its own futex word; the newest such waiter also sets its
 *     wake-up to the earliest lingering release, and a waiter that leaves
 *     hands that duty to the next. So a queue of blocked callers drains
 *     even when every permit is lingering and nothing else runs.
 *
 * Progress: admit is lock-free and never blocks or enters the kernel: a full
 * pool is rejected with one atomic load and counted in this thread's own
 * shard (a load and a store: no shared RMW); an admission is a load and a CAS.
 * leave is wait-free. call_end does not block: it releases the permit (the
 * gate's release: one CAS when nobody queues, else a short spinlock hand-off
 * to the one waiter next in line) and returns; in an adaptive pool it first
 * feeds discovery, which is lock-free for the caller (the completion that
 * closes a window runs the update under a try-lock: bounded work, a gate
 * limit change, and rarely one store call).
 * call_begin blocks (FIFO, see sluice/gate.h) until a permit, the deadline
 * or the cancel token, then — adaptive pools only — until any Retry-After
 * hold ends. A hold is slept out on a futex (real CLOCK_MONOTONIC, re-checked
 * against the pool clock on waking); a fired token wakes the sleeper through
 * its cancel hook, a clear through the pool's list of sleepers: no polling.
 * stats reads counters and the gate's snapshot.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same pool, except create and destroy. Async callbacks run on the thread
 * that settles them (see sluice_pool_call_begin_async); they may call back
 * into the pool, including clear and poll.
 *
 * Memory ordering: the deadline rules' own state (the standing-queue test,
 * LEARNED lingering's trial) is relaxed values read as estimates, never
 * publications. The admission count and the in-flight count are
 * counters, not publications: relaxed RMWs, read relaxed by stats (exact when
 * the pool is quiet). Permits inherit the gate's story: a call that gets a
 * permit sees everything the previous holder did before call_end. The
 * in-flight count is decremented before the permit is released, so
 * in_flight_at_start never exceeds the limit the gate enforced. A hold
 * sleeper and a clear meet through seq_cst operations on the hold epoch and
 * the sleeper's futex word (announce sleep, then re-check the epoch; bump
 * the epoch, then wake sleepers), so a clear never misses a sleeper.
 *
 * Allocation: one block per pool, at create, through the allocator hook:
 * the pool, for an adaptive pool its discovery node and event ring, and
 * two slots per permit (lingering permits, trial phantoms). The
 * gate is embedded and its waiters queue on their own stacks, as do calls
 * waiting out a hold, so the number of waiting runs needs no storage
 * reserved for it.
 *
 * Why one header of this size: admission, the sync and async call paths,
 * Retry-After holds, lingering permits and call_end all read and write the
 * same `struct sluice_pool` under one set of ordering rules (above), and
 * each call path is the same steps (admit, hold, start rule, permit, end)
 * in two shapes that must stay in step. Split by section, each part would
 * need the others' private helpers and the ordering argument would live in
 * several files; the sections below (holds, lingering permits, the async
 * call path, ending a call) are the seams to read by.
 */
#ifndef SLUICE_POOL_H
#define SLUICE_POOL_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "discovery.h"
#include "gate.h"
#include "policy.h"
#include "service.h"

#define SLUICE_POOL_ACTIVE_MAX UINT32_C(65536)       /* <= SLUICE_GATE_LIMIT_MAX */
#define SLUICE_POOL_WAITING_MAX (UINT32_C(1) << 20)
#define SLUICE_POOL_WAITING_DEFAULT UINT32_C(1024)
#define SLUICE_POOL_START_QUANTILE_DEFAULT UINT32_C(10) /* percent; see sluice/service.h */
#define SLUICE_POOL_LINGER_MAX_MS_DEFAULT UINT32_C(30000)
#define SLUICE_POOL_LINGER_MAX_MS UINT32_C(3600000) /* an hour: longer is a leak, not a call */

/*
 * Whether a call abandoned after its request was sent still counts against
 * the provider's cap until it would have finished (see "Lingering permits").
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
 * The deadline rules of one pool (see the header comment), zero = default.
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
                                             its start (default: 30000;
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
    int64_t expected_ns;           /* expected service time (sluice/service.h); 0 = unknown */
    int64_t expected_first_ns;     /* expected time to first byte (the latency signal); 0 =
                                      unknown */
    uint64_t refused_capacity;     /* admissions refused with SLUICE_ECAPACITY */
    uint64_t refused_early;        /* ... with SLUICE_ELATE (the deadline rules) */
    uint64_t refused_late;         /* calls not started: too little time left (ETIMEDOUT) */
    uint64_t timeouts;             /* calls whose deadline passed while queued or, abandoned,
                                      in transfer */
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
                                    too little left: see "Deadlines") */
    enum sluice_expiry expired;  /* with SLUICE_ETIMEDOUT: which deadline ended (or would have
                                    ended) the call */
    uint32_t phantoms_at_start;  /* abandoned calls released on trial and perhaps still running
                                    at the provider when this one started (LEARNED lingering) */
};

/* A call waiting out a Retry-After hold: on its own stack, linked into the pool. */
struct sluice__pool_holder {
    struct sluice__pool_holder *next, *prev; /* guarded by the pool's hold_lock */
    _Atomic(uint32_t) state;                 /* SLUICE__HOLDER_*; the futex word */
    struct sluice_cancel_hook hook;
};

enum { SLUICE__HOLDER_AWAKE = 0, SLUICE__HOLDER_ASLEEP = 1 };

/* A blocked call queued for a permit in a pool with lingering permits: on its own stack. */
struct sluice__pool_watcher {
    struct sluice__pool_watcher *next, *prev; /* guarded by the pool's hold_lock; newest first */
    _Atomic(uint32_t) state;                  /* SLUICE__WATCH_*; the futex word */
    int verdict;                              /* the gate's status, written before SETTLED */
    struct sluice_gate_waiter gw;
    struct sluice_cancel_hook hook;
};

enum { SLUICE__WATCH_AWAKE = 0, SLUICE__WATCH_ASLEEP = 1, SLUICE__WATCH_SETTLED = 2 };

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

struct sluice_pool;
struct sluice_pool_waiter;
/* Runs exactly once per sluice_pool_call_begin_async; see there. */
typedef void (*sluice_pool_fn)(struct sluice_pool_waiter *waiter, int status);

/*
 * An async generation call: set `cb` (and `data`), keep the record alive
 * until cb has run. Every other field belongs to the pool from the moment
 * sluice_pool_call_begin_async is called (stale contents are overwritten).
 */
struct sluice_pool_waiter {
    sluice_pool_fn cb;
    void *data;
    const struct timespec *deadline; /* for the start rule only: a grant with less time left
                                        than the expected service time settles ETIMEDOUT
                                        (default: NULL = none; the event loop still times
                                        the wait itself, until sluice_pool_wait_bound) */
    const struct timespec *start_deadline; /* the same for the start deadline, against the
                                              expected time to first byte (default: none) */
    struct sluice_call call; /* filled before cb runs with SLUICE_OK */
    /* private */
    struct sluice_gate_waiter sluice__gate;
    struct sluice_pool *sluice__pool;
    struct sluice_pool_waiter *sluice__next, *sluice__prev; /* async holders; under hold_lock */
    int64_t sluice__arrived;
    bool sluice__held; /* on the async holders list; under hold_lock */
};

struct sluice_pool {
    /* Admissions and calls are written by different moments of a run. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) admitted;
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
    _Atomic(uint32_t) phantoms;      /* abandoned calls released on trial, perhaps still running */
    _Atomic(uint32_t) trial_served;  /* calls served above the ceiling with phantoms around */
    /* The standing-queue test (CoDel's): the least queue wait of the calls started in the
     * current interval, when it ends (pool clock), and whether the last one's passed the
     * target (see "A queue that stands"), and when it last refused a call. */
    _Atomic(int64_t) sojourn_min;
    _Atomic(int64_t) sojourn_until;
    _Atomic(uint32_t) standing;
    _Atomic(int64_t) standing_refused; /* INT64_MIN = never */
    _Atomic(int64_t) *phantom_slots; /* their likely ends; SLUICE__LINGER_FREE = empty */
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
    struct sluice_service service;    /* whole calls: what a call needs to finish */
    struct sluice_service first_byte; /* the latency signal: what a call needs to begin */
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

/* Start the discovery node that lives in the pool's block, after the pool. */
SLUICE_INLINE void sluice__pool_start_discovery(struct sluice_pool *p,
                                                const struct sluice_discovery_desc *desc,
                                                uint32_t events)
{
    struct sluice_discovery_desc dd = *desc;
    dd.gate = &p->gate;
    dd.clock = &p->clock; /* one clock for call start times and discovery's cut times */
    SLUICE__DEFAULT(dd.max_limit, p->active);
    struct sluice_discovery *d = (struct sluice_discovery *)(void *)(p + 1);
    struct sluice_event_slot *slots = (struct sluice_event_slot *)(void *)(d + 1);
    sluice_discovery_init(d, &dd, slots, events); /* checked: cannot fail */
    sluice_discovery_count_in_flight(d, &p->in_flight); /* one "in flight": started calls */
    p->discovery = d;
}

/* Resolve the deadline rules and set up the lingering and phantom slots (`slots`: active of
 * each). */
SLUICE_INLINE void sluice__pool_init_deadlines(struct sluice_pool *p,
                                               const struct sluice_deadline_desc *dl, void *slots)
{
    bool limited = p->active != 0;
    struct sluice_deadline_desc r = *dl;
    SLUICE__DEFAULT_OPT(r.start_quantile, SLUICE_POOL_START_QUANTILE_DEFAULT);
    SLUICE__DEFAULT_OPT(r.linger_max_ms, SLUICE_POOL_LINGER_MAX_MS_DEFAULT);
    p->start_percent = limited ? r.start_quantile.value : 0u;
    p->queue_late = dl->queue_late;
    p->linger = dl->linger;
    atomic_init(&p->linger_learned, (uint32_t)SLUICE_LINGER_LEARNED);
    atomic_init(&p->phantoms, 0u);
    atomic_init(&p->trial_served, 0u);
    atomic_init(&p->sojourn_min, INT64_MAX);
    atomic_init(&p->sojourn_until, INT64_MIN);
    atomic_init(&p->standing_refused, INT64_MIN);
    atomic_init(&p->standing, 0u);
    p->linger_max_ns = limited ? (int64_t)r.linger_max_ms.value * SLUICE_NS_PER_MS : 0;
    /* The estimate also serves the operator's views; its quantile only the start rule. */
    uint32_t percent = p->start_percent ? p->start_percent : SLUICE_POOL_START_QUANTILE_DEFAULT;
    sluice_service_init(&p->service, percent);
    sluice_service_init(&p->first_byte, percent);
    for (int i = 0; i < SLUICE__POOL_COUNTERS; i++)
        atomic_init(&p->counted[i], 0u);
    for (int i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++) {
        atomic_init(&p->refusals[i].owner, (uintptr_t)0);
        atomic_init(&p->refusals[i].refused, 0u);
    }
    sluice_histogram_init(&p->queue_wait);
    sluice_histogram_init(&p->call_time);
    atomic_init(&p->lingering, 0u);
    atomic_init(&p->linger_epoch, 0u);
    atomic_init(&p->linger_next, INT64_MAX);
    sluice_spinlock_init(&p->linger_lock);
    atomic_init(&p->linger_hint, 0u);
    p->watchers = NULL;
    p->linger_slots = (_Atomic(int64_t) *)slots;
    p->phantom_slots = p->linger_slots + p->active;
    for (uint32_t i = 0; i < 2 * p->active; i++)
        atomic_init(&p->linger_slots[i], SLUICE__LINGER_FREE);
}

/*
 * Create a pool: its only allocation. Returns SLUICE_EINVAL for an invalid
 * description (with a message naming the field in desc->error, e.g.
 * "sluice_pool_desc.waiting set without an active limit ...") or
 * SLUICE_ENOMEM. An adaptive pool's discovery restores a live stored lock
 * here, delivering the "restore" event to its callback before this returns.
 */
SLUICE_INLINE int sluice_pool_create(const struct sluice_pool_desc *desc, struct sluice_pool **out)
{
    struct sluice_pool_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    *out = NULL;
    if (d.error && d.error_size)
        d.error[0] = '\0';
    int status = sluice__allocator_valid(d.allocator)
                     ? sluice__pool_check(d.active, d.waiting, "sluice_pool_desc", d.error,
                                          d.error_size)
                     : sluice__fail(d.error, d.error_size,
                                    "sluice_pool_desc.allocator sets only one of alloc and "
                                    "free (set both, or pass NULL for the default)");
    if (status == SLUICE_OK)
        status = sluice__pool_check_deadlines(d.active, &d.deadlines, "sluice_pool_desc", d.error,
                                              d.error_size);
    struct sluice__discovery_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    size_t size = sizeof(struct sluice_pool);
    if (status == SLUICE_OK && d.discovery) {
        status = sluice__pool_check_discovery(d.active, d.discovery, "sluice_pool_desc", d.error,
                                              d.error_size, &cfg);
        size += sizeof(struct sluice_discovery) + SLUICE_EVENT_RING_SIZE(cfg.events);
    }
    if (status != SLUICE_OK)
        return status;
    size_t slots_at = (size + SLUICE_CACHELINE - 1) / SLUICE_CACHELINE * SLUICE_CACHELINE;
    size = slots_at + 2 * (size_t)d.active * sizeof(_Atomic(int64_t));
    struct sluice_pool *p = (struct sluice_pool *)sluice__alloc(d.allocator, size, SLUICE_CACHELINE);
    if (!p)
        return SLUICE_ENOMEM;
    memset((void *)p, 0, sizeof *p);
    atomic_init(&p->admitted, 0u);
    atomic_init(&p->in_flight, 0u);
    for (int i = 0; i < 4; i++)
        atomic_init(&p->ended[i], 0u);
    atomic_init(&p->holding, 0u);
    atomic_init(&p->n_async_held, 0u);
    atomic_init(&p->hold_epoch, 0u);
    atomic_init(&p->closed, 0u);
    sluice_spinlock_init(&p->hold_lock);
    p->active = d.active;
    p->waiting = sluice__pool_waiting(d.active, d.waiting);
    p->admit_max = p->active + p->waiting;
    p->block_size = size;
    if (d.clock)
        p->clock = *d.clock;
    if (d.allocator)
        p->allocator = *d.allocator;
    if (p->active)
        sluice_gate_init(&p->gate, p->active);
    sluice__pool_init_deadlines(p, &d.deadlines, (char *)p + slots_at);
    if (d.discovery)
        sluice__pool_start_discovery(p, d.discovery, cfg.events);
    *out = p;
    return SLUICE_OK;
}

/* Free a pool (and its discovery node). No run may be using it. */
SLUICE_INLINE void sluice_pool_destroy(struct sluice_pool *p)
{
    if (!p)
        return;
    if (p->discovery)
        sluice_discovery_sync(p->discovery); /* a store write still on its way lands first */
    struct sluice_allocator a = p->allocator;
    sluice__free(&a, p, p->block_size);
}

SLUICE_INLINE void sluice__pool_count(struct sluice_pool *p, enum sluice__pool_counter which)
{
    atomic_fetch_add_explicit(&p->counted[which], 1u, SLUICE_RELAXED);
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer)
#define SLUICE__POOL_THREAD_POINTER 1
#endif
#endif

/* This thread's identity for the refusal shards: nonzero, unique among live threads. */
SLUICE_INLINE uintptr_t sluice__pool_thread(void)
{
#ifdef SLUICE__POOL_THREAD_POINTER
    return (uintptr_t)__builtin_thread_pointer(); /* one register read */
#else
    static SLUICE_THREAD_LOCAL char me;
    return (uintptr_t)&me;
#endif
}

/* Count one SLUICE_ECAPACITY (see struct sluice__pool_shard). */
SLUICE_INLINE void sluice__pool_count_refusal(struct sluice_pool *p)
{
    uintptr_t me = sluice__pool_thread();
    /* Thread pointers sit whole stacks apart: take the top bits of a Fibonacci hash. */
    uint32_t first = (uint32_t)(((uint64_t)me * UINT64_C(0x9e3779b97f4a7c15)) >> 56);
    for (uint32_t i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++) {
        struct sluice__pool_shard *s =
            &p->refusals[(first + i) % SLUICE__POOL_REFUSAL_SHARDS];
        uintptr_t owner = atomic_load_explicit(&s->owner, SLUICE_RELAXED);
        if (owner == me || (owner == 0 && atomic_compare_exchange_strong_explicit(
                                              &s->owner, &owner, me, SLUICE_RELAXED,
                                              SLUICE_RELAXED))) {
            atomic_store_explicit(&s->refused,
                                  atomic_load_explicit(&s->refused, SLUICE_RELAXED) + 1u,
                                  SLUICE_RELAXED);
            return;
        }
    }
    sluice__pool_count(p, SLUICE__POOL_CAPACITY);
}

/* Count a call that ended without finishing, by why it stopped. */
SLUICE_INLINE void sluice__pool_count_stop(struct sluice_pool *p, int status)
{
    if (status == SLUICE_ETIMEDOUT)
        sluice__pool_count(p, SLUICE__POOL_TIMEOUT);
    else if (status == SLUICE_ECANCELED)
        sluice__pool_count(p, SLUICE__POOL_CANCEL);
}

/* Give an admission back: once per successful sluice_pool_admit. */
SLUICE_INLINE void sluice_pool_leave(struct sluice_pool *p)
{
    if (p->active)
        atomic_fetch_sub_explicit(&p->admitted, 1u, SLUICE_RELAXED);
}

/*
 * Reserve one run slot. Returns SLUICE_OK (call sluice_pool_leave later),
 * SLUICE_ECAPACITY at once when active + waiting runs are already admitted
 * (for an adaptive pool: the current limit + waiting), or SLUICE_ECLOSED
 * once the pool is closed. Never blocks, never enters the kernel, never
 * calls anything.
 */
SLUICE_INLINE int sluice_pool_admit(struct sluice_pool *p)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&p->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    if (!p->active)
        return SLUICE_OK;
    uint32_t cap = SLUICE_UNLIKELY(p->discovery != NULL)
                       ? sluice_gate_limit(&p->gate) + p->waiting
                       : p->admit_max;
    uint32_t n = atomic_load_explicit(&p->admitted, SLUICE_RELAXED);
    do {
        if (n >= cap) {
            sluice__pool_count_refusal(p);
            return SLUICE_ECAPACITY;
        }
    } while (!atomic_compare_exchange_weak_explicit(&p->admitted, &n, n + 1, SLUICE_RELAXED,
                                                    SLUICE_RELAXED));
    return SLUICE_OK;
}

/*
 * The wait a call queueing now should expect before its permit, ns (pool
 * clock; "Deadlines" at the top says how it is made and how wrong it can
 * be): 0 while a permit is free, else (queued + 1) x median / limit; -1
 * when the service time is not known yet; INT64_MAX behind a taken permit
 * while the cut calls hide it (sluice_service_hidden: no wait is known to
 * be affordable).
 */
SLUICE_INLINE int64_t sluice_pool_predicted_wait(const struct sluice_pool *pool)
{
    struct sluice_pool *p = (struct sluice_pool *)pool;
    int64_t median = sluice_service_median(&p->service);
    bool hidden = median <= 0 && sluice_service_hidden(&p->service);
    if (!p->active || (median <= 0 && !hidden))
        return -1;
    struct sluice_gate_counts g = sluice_gate_stats(&p->gate);
    uint32_t queued = g.waiting + atomic_load_explicit(&p->holding, SLUICE_RELAXED);
    if (g.limit == 0 || (queued == 0 && g.in_flight < g.limit))
        return 0;
    if (hidden)
        return INT64_MAX;
    double wait = ((double)queued + 1.0) * (double)median / (double)g.limit;
    return wait < (double)INT64_MAX ? (int64_t)wait : INT64_MAX;
}

/*
 * The time a call needs to finish (`first`: to its first byte) for the
 * deadline rules: the median while calls queue (`busy`: every permit taken,
 * so a permit spent on a call with less than an even chance is one a
 * caller with time to spare does not get), the low quantile with a permit
 * free (it would otherwise go unused). 0 = not known yet; INT64_MAX while
 * the cut calls hide the median (see "A service time the cuts hide").
 */
SLUICE_INLINE int64_t sluice__pool_need(const struct sluice_pool *p, bool busy, bool first)
{
    const struct sluice_service *s = first ? &p->first_byte : &p->service;
    if (!busy)
        return sluice_service_expected(s);
    /* Hidden by the cut calls: no wait is known to be affordable, so none is (INT64_MAX). */
    int64_t mid = sluice_service_median(s);
    return mid > 0 || !sluice_service_hidden(s) ? mid : INT64_MAX;
}

/* Permit hand-offs a standing queue is cut to (see "A queue that stands"). */
#define SLUICE_POOL_STANDING_HANDOFFS 2u

/* The standing-queue target (see "A queue that stands"): SLUICE_POOL_STANDING_HANDOFFS
 * permit hand-offs (median service time ÷ limit each), at most the median time to first
 * byte; 0 = not known yet (no rule). */
SLUICE_INLINE int64_t sluice__pool_sojourn_target(const struct sluice_pool *p)
{
    int64_t first = sluice_service_median(&p->first_byte);
    uint32_t limit = sluice_gate_limit(&p->gate);
    if (first <= 0 || !limit)
        return first;
    double handoffs = (double)SLUICE_POOL_STANDING_HANDOFFS *
                      (double)sluice_service_median(&p->service) / (double)limit;
    return handoffs > 0 && handoffs < (double)first ? (int64_t)handoffs : first;
}

/*
 * A call started after waiting `waited` (pool clock `now`): fold it into
 * the interval's least wait, and at the interval's end decide whether the
 * queue stood through it. Lock-free: one winner rolls the interval (a CAS
 * on its end); a call racing the roll may land its wait in either
 * interval, which only blurs the boundary by a call. A call that did not
 * wait costs two relaxed loads once the interval's least wait is 0.
 */
SLUICE_INLINE void sluice__pool_sojourn(struct sluice_pool *p, int64_t waited, int64_t now)
{
    int64_t interval = sluice_service_median(&p->service); /* CoDel's: the time to react */
    int64_t target = sluice__pool_sojourn_target(p);
    if (interval <= 0 || target <= 0)
        return;
    int64_t until = atomic_load_explicit(&p->sojourn_until, SLUICE_RELAXED);
    if (now >= until && atomic_compare_exchange_strong_explicit(&p->sojourn_until, &until,
                                                                sluice_add_ns(now, interval),
                                                                SLUICE_RELAXED, SLUICE_RELAXED)) {
        int64_t least = atomic_exchange_explicit(&p->sojourn_min, waited, SLUICE_RELAXED);
        if (least != INT64_MAX && least > target)
            atomic_store_explicit(&p->standing, 1u, SLUICE_RELAXED);
        return;
    }
    sluice__atomic_min_i64(&p->sojourn_min, waited);
}

/* Whether the deadline rules that read the estimates are on for this pool. */
SLUICE_INLINE bool sluice__pool_rules_on(const struct sluice_pool *p)
{
    return p->active && p->start_percent;
}

/*
 * The last instant (CLOCK_MONOTONIC ns) at which a call with these
 * deadlines could still be started usefully: its deadline less the median
 * service time, its start deadline less the median time to first byte
 * (a call that queues finds every permit taken: sluice__pool_need),
 * whichever is earlier; the deadline itself for an estimate
 * not known yet, or with queue_late; INT64_MAX with neither deadline. A
 * queued call leaves the line then (see "Deadlines"); an event loop that
 * times its own waits (sluice_pool_call_begin_async) arms its timer for it
 * and cancels.
 */
SLUICE_INLINE int64_t sluice_pool_wait_bound(const struct sluice_pool *p,
                                             const struct timespec *start_deadline,
                                             const struct timespec *deadline)
{
    bool early = sluice__pool_rules_on(p) && !p->queue_late;
    int64_t bound = INT64_MAX;
    if (deadline)
        bound = sluice_timespec_ns(deadline) - (early ? sluice__pool_need(p, true, false) : 0);
    if (start_deadline) {
        int64_t at = sluice_timespec_ns(start_deadline) -
                     (early ? sluice__pool_need(p, true, true) : 0);
        if (at < bound)
            bound = at;
    }
    return bound;
}

/*
 * Which deadline makes a call that would wait `wait` ns and then need
 * `need_first` to its first byte and `need_whole` to its end too late
 * (SLUICE_EXPIRED_NONE: neither; a need of 0 is unknown: no verdict). `now`
 * is CLOCK_MONOTONIC ns.
 */
SLUICE_INLINE enum sluice_expiry sluice__pool_late_by(int64_t now, int64_t wait,
                                                      const struct timespec *start_deadline,
                                                      const struct timespec *deadline,
                                                      int64_t need_whole, int64_t need_first)
{
    /* A deadline already passed is no prediction: the wait's own check says ETIMEDOUT. */
    int64_t start_left = start_deadline ? sluice_timespec_ns(start_deadline) - now : 0;
    int64_t left = deadline ? sluice_timespec_ns(deadline) - now : 0;
    if (start_left > 0 && need_first > 0 && sluice_add_ns(wait, need_first) > start_left)
        return SLUICE_EXPIRED_START;
    if (left > 0 && need_whole > 0 && sluice_add_ns(wait, need_whole) > left)
        return SLUICE_EXPIRED_CALL;
    return SLUICE_EXPIRED_NONE;
}

/*
 * sluice_pool_admit for a run with deadlines (absolute CLOCK_MONOTONIC;
 * either may be NULL = none): unless the pool's queue_late is set, a run
 * whose predicted wait plus the time it needs already passes `deadline`
 * (or its first byte's, `start_deadline`; sluice__pool_need: the median
 * while calls queue, the low quantile with a permit free) is refused at
 * once with SLUICE_ELATE, and so is one whose predicted wait passes the
 * target of a queue that stands (see "A queue that stands") (counted in
 * refused_early; nothing is reserved), so the caller can shed it or go
 * elsewhere while it still has time. Otherwise exactly sluice_pool_admit.
 * Lock-free: a few relaxed loads more than sluice_pool_admit, and only for
 * a run with a deadline; first it releases the lingering permits whose time
 * has come (two relaxed loads when none lingers), since a permit it counts
 * as taken refuses calls, and callers refused at admission never reach the
 * call paths that would release it (blocking callers stalled at 6 calls in
 * 12 s, every permit lingering long past its time).
 */
SLUICE_INLINE void sluice__pool_reap(struct sluice_pool *p);

SLUICE_INLINE int sluice_pool_admit_by(struct sluice_pool *p, const struct timespec *start_deadline,
                                       const struct timespec *deadline)
{
    /* A deadline already passed is no prediction: the wait's own check says ETIMEDOUT. */
    if ((deadline || start_deadline) && sluice__pool_rules_on(p) && !p->queue_late &&
        !sluice_deadline_passed(sluice_deadline_first(start_deadline, deadline)) &&
        !atomic_load_explicit(&p->closed, SLUICE_RELAXED)) {
        sluice__pool_reap(p);
        int64_t wait = sluice_pool_predicted_wait(p);
        bool stands = atomic_load_explicit(&p->standing, SLUICE_RELAXED);
        int64_t now = stands ? sluice_clock_now(&p->clock) : 0;
        if (stands && wait == 0) { /* the queue drained: and no excess came for an interval? */
            int64_t refused = atomic_load_explicit(&p->standing_refused, SLUICE_RELAXED);
            if (refused == INT64_MIN || now - refused >= sluice_service_median(&p->service))
                atomic_store_explicit(&p->standing, 0u, SLUICE_RELAXED);
        }
        stands = stands && wait > sluice__pool_sojourn_target(p);
        if (stands)
            atomic_store_explicit(&p->standing_refused, now, SLUICE_RELAXED);
        if (wait >= 0 && (stands || sluice__pool_late_by(sluice_monotonic_ns(), wait,
                                                         start_deadline, deadline,
                                                         sluice__pool_need(p, wait > 0, false),
                                                         sluice__pool_need(p, wait > 0, true)) !=
                                        SLUICE_EXPIRED_NONE)) {
            sluice__pool_count(p, SLUICE__POOL_EARLY);
            return SLUICE_ELATE;
        }
    }
    return sluice_pool_admit(p);
}

/* ---- Retry-After holds (adaptive pools) ----------------------------------- */

/* Move a sleeping holder back to AWAKE; true if it was asleep (then wake it). */
SLUICE_INLINE bool sluice__pool_rouse(struct sluice__pool_holder *h)
{
    uint32_t asleep = SLUICE__HOLDER_ASLEEP;
    return atomic_compare_exchange_strong_explicit(&h->state, &asleep, SLUICE__HOLDER_AWAKE,
                                                   SLUICE_SEQ_CST, SLUICE_SEQ_CST);
}

static inline void sluice__pool_on_cancel(struct sluice_cancel_hook *hook)
{
    struct sluice__pool_holder *h =
        (struct sluice__pool_holder *)(void *)((char *)hook -
                                               offsetof(struct sluice__pool_holder, hook));
    if (sluice__pool_rouse(h))
        sluice_futex_wake(&h->state);
}

/* The real CLOCK_MONOTONIC instant to sleep until: the hold's end, or the deadline if sooner. */
SLUICE_INLINE struct timespec sluice__pool_wake_at(int64_t hold_left_ns,
                                                   const struct timespec *deadline)
{
    struct timespec at = sluice_ns_timespec(sluice_add_ns(sluice_monotonic_ns(), hold_left_ns));
    if (deadline && sluice_timespec_ns(deadline) < sluice_timespec_ns(&at))
        at = *deadline;
    return at;
}

/* Why a call waiting out a hold must stop now: cancel, close, deadline (in that order:
 * cancel wins over close, as in the gate; close over a deadline, as a closed gate's verdict). */
SLUICE_INLINE int sluice__pool_stop_reason(struct sluice_pool *p, const struct timespec *deadline,
                                           struct sluice_cancel *cancel)
{
    int status = sluice_wait_stop_reason(deadline, cancel);
    if (status != SLUICE_ECANCELED && status != SLUICE_EINVAL &&
        atomic_load_explicit(&p->closed, SLUICE_SEQ_CST))
        return SLUICE_ECLOSED;
    return status;
}

/*
 * Sleep until the discovery hold (pool clock) is over, the pool closes,
 * `deadline` passes or `cancel` fires; SLUICE_OK, SLUICE_ECLOSED,
 * SLUICE_ECANCELED or SLUICE_ETIMEDOUT (any of them beats a hold that ends
 * at the same moment: the call has not started). The kernel sleeps on the
 * real clock, so the hold's remaining pool-clock time is slept in real time
 * and re-checked on waking (with a virtual pool clock, that is a real sleep
 * of the virtual remainder). Wake-ups: the timeout, the token's hook, or
 * sluice_pool_close through the pool's list of sleepers. It lives here, not
 * in park.h or cancel.h, because what it waits for is the pool's own state.
 */
SLUICE_INLINE int sluice__pool_sleep_until(struct sluice_pool *p, const struct timespec *deadline,
                                           struct sluice_cancel *cancel)
{
    struct sluice__pool_holder h;
    atomic_init(&h.state, (uint32_t)SLUICE__HOLDER_AWAKE);
    h.prev = NULL;
    sluice_spinlock_lock(&p->hold_lock);
    h.next = p->holders;
    if (p->holders)
        p->holders->prev = &h;
    p->holders = &h;
    sluice_spinlock_unlock(&p->hold_lock);
    atomic_fetch_add_explicit(&p->holding, 1u, SLUICE_RELAXED);
    h.hook.fn = sluice__pool_on_cancel;
    bool hooked = cancel && sluice_cancel_register(cancel, &h.hook);
    int status;
    for (;;) {
        uint32_t epoch = atomic_load_explicit(&p->hold_epoch, SLUICE_SEQ_CST);
        if ((status = sluice__pool_stop_reason(p, deadline, cancel)) != SLUICE_OK)
            break;
        int64_t left = sluice_discovery_hold_until(p->discovery) - sluice_clock_now(&p->clock);
        if (left <= 0)
            break;
        uint32_t awake = SLUICE__HOLDER_AWAKE;
        if (!atomic_compare_exchange_strong_explicit(&h.state, &awake, SLUICE__HOLDER_ASLEEP,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue;
        /* Re-check after announcing sleep: a token that fired, or a close,
         * in between found us awake and woke nobody. */
        if (sluice__pool_stop_reason(p, deadline, cancel) == SLUICE_OK &&
            atomic_load_explicit(&p->hold_epoch, SLUICE_SEQ_CST) == epoch) {
            struct timespec at = sluice__pool_wake_at(left, deadline);
            sluice_futex_wait(&h.state, SLUICE__HOLDER_ASLEEP, &at);
        }
        sluice__pool_rouse(&h);
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &h.hook);
    sluice_spinlock_lock(&p->hold_lock);
    if (h.prev)
        h.prev->next = h.next;
    else
        p->holders = h.next;
    if (h.next)
        h.next->prev = h.prev;
    sluice_spinlock_unlock(&p->hold_lock);
    atomic_fetch_sub_explicit(&p->holding, 1u, SLUICE_RELAXED);
    return status;
}

/* With its permit in hand, wait out a Retry-After hold; on failure give the permit back. */
SLUICE_INLINE int sluice__pool_hold(struct sluice_pool *p, const struct timespec *deadline,
                                    struct sluice_cancel *cancel, struct sluice_call *call)
{
    if (SLUICE_LIKELY(sluice_discovery_hold_until(p->discovery) <= call->start_ns))
        return SLUICE_OK;
    int status = sluice__pool_sleep_until(p, deadline, cancel);
    if (status != SLUICE_OK)
        sluice_gate_release(&p->gate);
    int64_t now = sluice_clock_now(&p->clock);
    call->queued_ns += now - call->start_ns;
    call->start_ns = now;
    return status;
}

/* ---- lingering permits ------------------------------------------------------ */

/* Lower linger_next to `at` unless it is already earlier. */
SLUICE_INLINE void sluice__pool_linger_lower(struct sluice_pool *p, int64_t at)
{
    int64_t cur = atomic_load_explicit(&p->linger_next, SLUICE_SEQ_CST);
    while (at < cur && !atomic_compare_exchange_weak_explicit(&p->linger_next, &cur, at,
                                                              SLUICE_SEQ_CST, SLUICE_SEQ_CST))
        ;
}

/* Forget the trial phantoms whose likely end has passed (see enum sluice_linger). Call with
 * linger_lock held. */
SLUICE_INLINE void sluice__pool_reap_phantoms_locked(struct sluice_pool *p, int64_t now)
{
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t at = atomic_load_explicit(&p->phantom_slots[i], SLUICE_RELAXED);
        if (at != SLUICE__LINGER_FREE && at <= now) {
            atomic_store_explicit(&p->phantom_slots[i], SLUICE__LINGER_FREE, SLUICE_RELAXED);
            atomic_fetch_sub_explicit(&p->phantoms, 1u, SLUICE_RELAXED);
        }
    }
}

/*
 * Release every lingering permit whose time has come (and forget the trial
 * phantoms whose time has come). Cheap when none lingers (two relaxed
 * loads) or none is due. One reaper at a time (a try-lock: a caller that
 * finds it taken leaves the work to the holder). The reaper first resets
 * linger_next, then scans and lowers it to what is left: an abandon that
 * lands during the scan lowers it after the reset, so no release instant
 * is ever lost. Permits go back after the lock is dropped, each after its
 * in-flight count (as call_end does).
 */
SLUICE_INLINE void sluice__pool_reap(struct sluice_pool *p)
{
    bool phantoms = atomic_load_explicit(&p->phantoms, SLUICE_RELAXED) != 0;
    if (SLUICE_LIKELY(!atomic_load_explicit(&p->lingering, SLUICE_RELAXED) && !phantoms))
        return;
    int64_t now = sluice_clock_now(&p->clock);
    if ((!phantoms && now < atomic_load_explicit(&p->linger_next, SLUICE_SEQ_CST)) ||
        !sluice_spinlock_trylock(&p->linger_lock))
        return;
    if (phantoms)
        sluice__pool_reap_phantoms_locked(p, now);
    atomic_store_explicit(&p->linger_next, INT64_MAX, SLUICE_SEQ_CST);
    uint32_t freed = 0;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t at = atomic_load_explicit(&p->linger_slots[i], SLUICE_SEQ_CST);
        if (at == SLUICE__LINGER_FREE)
            continue;
        if (at <= now) {
            atomic_store_explicit(&p->linger_slots[i], SLUICE__LINGER_FREE, SLUICE_RELAXED);
            freed++;
        } else if (at < next) {
            next = at;
        }
    }
    sluice__pool_linger_lower(p, next);
    sluice_spinlock_unlock(&p->linger_lock);
    for (uint32_t i = 0; i < freed; i++) {
        atomic_fetch_sub_explicit(&p->lingering, 1u, SLUICE_RELAXED);
        atomic_fetch_sub_explicit(&p->in_flight, 1u, SLUICE_RELAXED);
        sluice_gate_release(&p->gate);
    }
}

/*
 * When the next lingering permit is released (pool clock, ns); INT64_MAX
 * when none lingers. Event loops arm a timer for it and call
 * sluice_pool_poll, so a queue drains even when nothing else completes.
 */
SLUICE_INLINE int64_t sluice_pool_next_release(const struct sluice_pool *p)
{
    struct sluice_pool *q = (struct sluice_pool *)p;
    return atomic_load_explicit(&q->lingering, SLUICE_RELAXED)
               ? atomic_load_explicit(&q->linger_next, SLUICE_SEQ_CST)
               : INT64_MAX;
}

/* Move a watcher from ASLEEP to AWAKE and wake it; a settled one stays settled. */
SLUICE_INLINE void sluice__pool_watch_rouse(struct sluice__pool_watcher *w)
{
    uint32_t asleep = SLUICE__WATCH_ASLEEP;
    if (atomic_compare_exchange_strong_explicit(&w->state, &asleep, SLUICE__WATCH_AWAKE,
                                                SLUICE_SEQ_CST, SLUICE_SEQ_CST))
        sluice_futex_wake(&w->state);
}

/* The watcher that times the lingering releases (the newest) must look again. Any thread. */
SLUICE_INLINE void sluice__pool_watch_poke(struct sluice_pool *p)
{
    sluice_spinlock_lock(&p->hold_lock);
    if (p->watchers)
        sluice__pool_watch_rouse(p->watchers);
    sluice_spinlock_unlock(&p->hold_lock);
}

/* The gate settled a watcher's wait (any thread). Its last touch is the wake. */
static inline void sluice__pool_watch_settled(struct sluice_gate_waiter *gw, int status)
{
    struct sluice__pool_watcher *w = (struct sluice__pool_watcher *)gw->data;
    w->verdict = status;
    if (atomic_exchange_explicit(&w->state, SLUICE__WATCH_SETTLED, SLUICE_SEQ_CST) ==
        SLUICE__WATCH_ASLEEP)
        sluice_futex_wake(&w->state);
}

static inline void sluice__pool_watch_on_cancel(struct sluice_cancel_hook *hook)
{
    sluice__pool_watch_rouse((struct sluice__pool_watcher *)(void *)((char *)hook -
                                                                       offsetof(
                                                                           struct sluice__pool_watcher,
                                                                           hook)));
}

/* Wait for a watcher's verdict that is on its way (its withdrawal lost the race). */
SLUICE_INLINE int sluice__pool_watch_verdict(struct sluice__pool_watcher *w)
{
    sluice_park_while(&w->state, SLUICE__WATCH_AWAKE, SLUICE__WATCH_ASLEEP);
    return w->verdict;
}

/* Link (newest first) or unlink a watcher; unlinking the timer hands its duty on. */
SLUICE_INLINE bool sluice__pool_watch_link(struct sluice_pool *p, struct sluice__pool_watcher *w,
                                           bool link)
{
    sluice_spinlock_lock(&p->hold_lock);
    bool newest = p->watchers == w;
    if (link) {
        w->prev = NULL;
        w->next = p->watchers;
        if (p->watchers)
            p->watchers->prev = w;
        p->watchers = w;
    } else {
        if (w->prev)
            w->prev->next = w->next;
        else
            p->watchers = w->next;
        if (w->next)
            w->next->prev = w->prev;
        if (newest && p->watchers && atomic_load_explicit(&p->lingering, SLUICE_RELAXED))
            sluice__pool_watch_rouse(p->watchers);
    }
    newest = p->watchers == w;
    sluice_spinlock_unlock(&p->hold_lock);
    return newest;
}

/* When a watcher sleeps until: its deadline, and for the newest the next linger release. */
SLUICE_INLINE bool sluice__pool_watch_wake_at(struct sluice_pool *p,
                                              struct sluice__pool_watcher *w,
                                              const struct timespec *deadline, struct timespec *at)
{
    int64_t release = INT64_MAX;
    sluice_spinlock_lock(&p->hold_lock);
    if (p->watchers == w)
        release = sluice_pool_next_release(p);
    sluice_spinlock_unlock(&p->hold_lock);
    if (release == INT64_MAX) {
        if (deadline)
            *at = *deadline;
        return deadline != NULL;
    }
    int64_t left = release - sluice_clock_now(&p->clock);
    *at = sluice__pool_wake_at(left > 0 ? left : 0, deadline);
    return true;
}

/*
 * The contended wait of a pool with lingering permits: queue through the
 * gate's async path (same FIFO line), park on our own word, and wake for
 * the grant, the deadline, the token, or — for the newest waiter — the
 * next lingering release, which we then perform (sluice__pool_reap).
 * Returns the gate's verdict (SLUICE_OK with the permit, ECLOSED) or the
 * stop reason (ETIMEDOUT, ECANCELED) with no permit held.
 */
SLUICE_INLINE int sluice__pool_watch(struct sluice_pool *p, const struct timespec *deadline,
                                     struct sluice_cancel *cancel)
{
    struct sluice__pool_watcher w;
    atomic_init(&w.state, (uint32_t)SLUICE__WATCH_AWAKE);
    w.verdict = SLUICE_OK;
    w.gw.cb = sluice__pool_watch_settled;
    w.gw.data = &w;
    w.hook.fn = sluice__pool_watch_on_cancel;
    sluice__pool_watch_link(p, &w, true);
    bool hooked = cancel && sluice_cancel_register(cancel, &w.hook);
    sluice__gate_acquire_async(&p->gate, &w.gw, true); /* woken first, like a sync waiter */
    int status;
    for (;;) {
        uint32_t epoch = atomic_load_explicit(&p->linger_epoch, SLUICE_SEQ_CST);
        if (atomic_load_explicit(&w.state, SLUICE_ACQUIRE) == SLUICE__WATCH_SETTLED) {
            status = w.verdict;
            break;
        }
        if ((status = sluice_wait_stop_reason(deadline, cancel)) != SLUICE_OK) {
            if (sluice_gate_cancel_async(&p->gate, &w.gw) != SLUICE_OK &&
                sluice__pool_watch_verdict(&w) == SLUICE_OK)
                sluice_gate_release(&p->gate); /* granted as we gave up: pass it on */
            break;
        }
        sluice__pool_reap(p);
        struct timespec at;
        bool timed = sluice__pool_watch_wake_at(p, &w, deadline, &at);
        uint32_t awake = SLUICE__WATCH_AWAKE;
        if (!atomic_compare_exchange_strong_explicit(&w.state, &awake, SLUICE__WATCH_ASLEEP,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue;
        /* Re-check after announcing sleep: a token or a new linger in between woke nobody. */
        if (sluice_wait_stop_reason(deadline, cancel) == SLUICE_OK &&
            atomic_load_explicit(&p->linger_epoch, SLUICE_SEQ_CST) == epoch)
            sluice_futex_wait(&w.state, SLUICE__WATCH_ASLEEP, timed ? &at : NULL);
        sluice__pool_watch_rouse(&w);
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &w.hook);
    sluice__pool_watch_link(p, &w, false);
    return status;
}

/* The contended path of call_begin: queue for the permit until `bound` (the wait bound, a
 * CLOCK_MONOTONIC instant; INT64_MAX = none), timing the wait. */
SLUICE_INLINE int sluice__pool_wait(struct sluice_pool *p, int64_t bound,
                                    struct sluice_cancel *cancel, struct sluice_call *call)
{
    int64_t arrived = sluice_clock_now(&p->clock);
    struct timespec until = sluice_ns_timespec(bound);
    const struct timespec *wait_until = bound == INT64_MAX ? NULL : &until;
    int status = p->linger_max_ns ? sluice__pool_watch(p, wait_until, cancel)
                                  : sluice_gate_acquire(&p->gate, wait_until, cancel);
    /* A grant can land after the token fired or the bound passed: the
     * call has not started, so the stop wins and the permit moves on. */
    if (status == SLUICE_OK &&
        (status = sluice_wait_stop_reason(wait_until, cancel)) != SLUICE_OK)
        sluice_gate_release(&p->gate);
    call->start_ns = sluice_clock_now(&p->clock);
    call->queued_ns = call->start_ns - arrived;
    return status;
}

/*
 * The start rule: which deadline a call holding a permit can no longer
 * meet (SLUICE_EXPIRED_NONE: start it). Too late: less of its deadline
 * left than the expected service time, or of its start deadline than the
 * expected time to first byte; while other calls queue behind it, less
 * than the medians (never without deadlines, with the rules off, or before
 * the estimates have samples). See "Deadlines" at the top.
 */
SLUICE_INLINE enum sluice_expiry sluice__pool_too_late(struct sluice_pool *p,
                                                       const struct timespec *start_deadline,
                                                       const struct timespec *deadline)
{
    if ((!deadline && !start_deadline) || !p->start_percent)
        return SLUICE_EXPIRED_NONE;
    int64_t now = sluice_monotonic_ns();
    if (start_deadline && sluice_timespec_ns(start_deadline) <= now)
        return SLUICE_EXPIRED_START;
    if (deadline && sluice_timespec_ns(deadline) <= now)
        return SLUICE_EXPIRED_CALL;
    bool busy = sluice_gate_stats(&p->gate).waiting > 0;
    return sluice__pool_late_by(now, 0, start_deadline, deadline, sluice__pool_need(p, busy, false),
                                sluice__pool_need(p, busy, true));
}

/* Count how a limited pool's call_begin ended; the queue-wait histogram sees every wait. */
SLUICE_INLINE void sluice__pool_began(struct sluice_pool *p, const struct sluice_call *call,
                                      int status, bool waited)
{
    if (status == SLUICE_OK || waited || call->refused_late)
        sluice_histogram_add(&p->queue_wait, call->queued_ns);
    if (call->refused_late)
        sluice__pool_count(p, SLUICE__POOL_LATE);
    else
        sluice__pool_count_stop(p, status);
}

/* The call has its permit and no hold stands in its way: count it as started. */
SLUICE_INLINE void sluice__pool_start(struct sluice_pool *p, struct sluice_call *call)
{
    call->in_flight_at_start = atomic_fetch_add_explicit(&p->in_flight, 1u, SLUICE_RELAXED) + 1u;
    call->limit_at_start = p->discovery ? sluice_discovery_limit(p->discovery) : 0;
    call->phantoms_at_start = atomic_load_explicit(&p->phantoms, SLUICE_RELAXED);
    if (p->active && p->start_percent && !p->queue_late)
        sluice__pool_sojourn(p, call->queued_ns, call->start_ns);
}

/*
 * Take a generation permit for one model call of an admitted run, waiting
 * in FIFO order until it can no longer start in time (sluice_pool_wait_bound
 * of `start_deadline` and `deadline`, absolute CLOCK_MONOTONIC; NULL =
 * none) or `cancel` fires (NULL = none); in an adaptive pool, then wait out
 * any Retry-After hold, permit in hand, under the same deadlines and token.
 * Fills *call. Returns SLUICE_OK (make the call, then sluice_pool_call_end),
 * or, holding no permit: SLUICE_ECANCELED / SLUICE_ETIMEDOUT — also when the
 * token fired or a deadline passed before the wait, while the permit was
 * being granted, or during a hold, so a call whose cancel won before it
 * started is never made (a token that has fired by the time the call
 * gives up wins over the deadline and over close); call->expired says
 * which deadline, call->refused_late that the call left before it passed
 * (the start rule) — SLUICE_ECLOSED once the pool is closed, or
 * SLUICE_EINVAL for a deadline whose tv_nsec is outside [0, 1e9).
 */
SLUICE_INLINE int sluice_pool_call_begin_by(struct sluice_pool *p,
                                            const struct timespec *start_deadline,
                                            const struct timespec *deadline,
                                            struct sluice_cancel *cancel, struct sluice_call *call)
{
    const struct timespec *first = sluice_deadline_first(start_deadline, deadline);
    int status = sluice_deadline_valid(start_deadline) && sluice_deadline_valid(deadline)
                     ? sluice_wait_stop_reason(first, cancel)
                     : SLUICE_EINVAL;
    if (status == SLUICE_OK && SLUICE_UNLIKELY(atomic_load_explicit(&p->closed, SLUICE_RELAXED)))
        status = SLUICE_ECLOSED;
    call->refused_late = false;
    call->expired = SLUICE_EXPIRED_NONE;
    call->phantoms_at_start = 0;
    if (p->active)
        sluice__pool_reap(p); /* a permit whose linger is over is free for this call */
    /* tryacquire never jumps the queue; only a call that must queue pays
     * for timing its wait. */
    bool waited = status == SLUICE_OK && p->active && sluice_gate_tryacquire(&p->gate) != SLUICE_OK;
    if (waited) {
        int64_t by_start = sluice_pool_wait_bound(p, start_deadline, NULL);
        int64_t by_call = sluice_pool_wait_bound(p, NULL, deadline);
        status = sluice__pool_wait(p, by_start < by_call ? by_start : by_call, cancel, call);
        if (status == SLUICE_ETIMEDOUT)
            call->expired = by_start <= by_call ? SLUICE_EXPIRED_START : SLUICE_EXPIRED_CALL;
        /* Left the line at its bound, before its deadline passed: too late to start. */
        call->refused_late = status == SLUICE_ETIMEDOUT && !sluice_deadline_passed(first) &&
                             !sluice_cancel_fired(cancel);
    } else {
        call->start_ns = sluice_clock_now(&p->clock);
        call->queued_ns = 0;
    }
    if (SLUICE_UNLIKELY(p->discovery != NULL) && status == SLUICE_OK)
        status = sluice__pool_hold(p, first, cancel, call);
    enum sluice_expiry late = status == SLUICE_OK
                                  ? sluice__pool_too_late(p, start_deadline, deadline)
                                  : SLUICE_EXPIRED_NONE;
    if (late != SLUICE_EXPIRED_NONE) {
        sluice_gate_release(&p->gate);
        call->refused_late = true;
        call->expired = late;
        status = SLUICE_ETIMEDOUT;
    }
    if (status != SLUICE_OK && !call->refused_late) /* a token that fired meanwhile wins */
        status = sluice__gate_failed(status, cancel);
    if (status != SLUICE_ETIMEDOUT)
        call->expired = SLUICE_EXPIRED_NONE;
    else if (call->expired == SLUICE_EXPIRED_NONE)
        call->expired = sluice_deadline_which(start_deadline, deadline);
    call->in_flight_at_start = call->limit_at_start = 0;
    if (p->active)
        sluice__pool_began(p, call, status, waited);
    if (status == SLUICE_OK)
        sluice__pool_start(p, call);
    return status;
}

/* sluice_pool_call_begin_by with one deadline for the whole call (NULL = none). */
SLUICE_INLINE int sluice_pool_call_begin(struct sluice_pool *p, const struct timespec *deadline,
                                         struct sluice_cancel *cancel, struct sluice_call *call)
{
    return sluice_pool_call_begin_by(p, NULL, deadline, cancel, call);
}

/* ---- the async call path (event loops) ------------------------------------ */

/* Start an async call whose permit is in hand and whose hold is over (or refuse it: too late). */
SLUICE_INLINE void sluice__pool_async_start(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    w->call.start_ns = sluice_clock_now(&p->clock);
    w->call.queued_ns = w->call.start_ns - w->sluice__arrived;
    w->call.expired = p->active ? sluice__pool_too_late(p, w->start_deadline, w->deadline)
                                : SLUICE_EXPIRED_NONE;
    w->call.refused_late = w->call.expired != SLUICE_EXPIRED_NONE;
    if (p->active)
        sluice__pool_began(p, &w->call, SLUICE_OK, w->call.queued_ns > 0);
    if (w->call.refused_late) {
        sluice_gate_release(&p->gate);
        w->cb(w, SLUICE_ETIMEDOUT);
        return;
    }
    sluice__pool_start(p, &w->call);
    w->cb(w, SLUICE_OK);
}

/* Unlink an async holder. Call with hold_lock held. */
SLUICE_INLINE void sluice__pool_async_unlink(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    if (w->sluice__prev)
        w->sluice__prev->sluice__next = w->sluice__next;
    else
        p->async_held = w->sluice__next;
    if (w->sluice__next)
        w->sluice__next->sluice__prev = w->sluice__prev;
    w->sluice__next = w->sluice__prev = NULL;
    w->sluice__held = false;
    atomic_fetch_sub_explicit(&p->n_async_held, 1u, SLUICE_RELAXED);
    atomic_fetch_sub_explicit(&p->holding, 1u, SLUICE_RELAXED);
}

/* Every outcome of an async call comes here, through the gate's trampoline
 * (so callbacks never nest): start it, park it on the hold, or pass the
 * failure on. */
static inline void sluice__pool_async_granted(struct sluice_gate_waiter *gw, int status)
{
    struct sluice_pool_waiter *w = (struct sluice_pool_waiter *)gw->data;
    struct sluice_pool *p = w->sluice__pool;
    if (status != SLUICE_OK) {
        w->cb(w, status);
        return;
    }
    if (p->discovery &&
        sluice_discovery_hold_until(p->discovery) > sluice_clock_now(&p->clock)) {
        /* Counted before the re-check below (seq_cst, as a poll's cheap test
         * reads it): a poll that finds the hold over after that re-check
         * found it live also finds this call counted, and takes the lock. */
        atomic_fetch_add_explicit(&p->n_async_held, 1u, SLUICE_SEQ_CST);
        sluice_spinlock_lock(&p->hold_lock);
        bool closed = atomic_load_explicit(&p->closed, SLUICE_ACQUIRE) != 0u;
        /* Re-checked under the lock: had the hold ended since the test above,
         * and a poll run in between, nobody would ever start a parked call. */
        bool held = !closed &&
                    sluice_discovery_hold_until(p->discovery) > sluice_clock_now(&p->clock);
        if (held) {
            w->sluice__prev = NULL;
            w->sluice__next = p->async_held;
            if (p->async_held)
                p->async_held->sluice__prev = w;
            p->async_held = w;
            w->sluice__held = true;
            atomic_fetch_add_explicit(&p->holding, 1u, SLUICE_RELAXED);
        } else {
            atomic_fetch_sub_explicit(&p->n_async_held, 1u, SLUICE_RELAXED);
        }
        sluice_spinlock_unlock(&p->hold_lock);
        if (held)
            return; /* sluice_pool_poll or a later call_end starts it */
        if (closed) {
            sluice_gate_release(&p->gate);
            w->cb(w, SLUICE_ECLOSED);
            return;
        }
    }
    sluice__pool_async_start(p, w);
}

/*
 * Queue an async generation call of an admitted run (event loops: never
 * blocks). It joins the same FIFO line as sluice_pool_call_begin and waits
 * out the same Retry-After hold. w->cb runs exactly once:
 *   SLUICE_OK         permit in hand, hold over, w->call filled: make the
 *                     call, then sluice_pool_call_end(p, &w->call, ...);
 *   SLUICE_ECANCELED  withdrawn by sluice_pool_call_cancel_async;
 *   SLUICE_ETIMEDOUT  granted, but with less of w->deadline left than the
 *                     expected service time (or of w->start_deadline than
 *                     the expected time to first byte): not started
 *                     (w->call's refused_late and expired are set), the
 *                     permit went to the next in line (the start rule, see
 *                     the header comment);
 *   SLUICE_ECLOSED    the pool is (or was meanwhile) closed.
 * It runs inline when the outcome is known at once (a permit is free, the
 * pool is unlimited or closed), otherwise on the thread that releases the
 * permit it gets (a call_end), raises the limit (discovery's flush),
 * cancels, closes, or calls sluice_pool_poll after a hold. It must not
 * block; it may call back into the pool, and may start its next call with
 * the same record. Callbacks never nest (sluice/gate.h, "The trampoline"):
 * one started from inside a callback runs right after it returns, so a
 * chain of calls started from callbacks runs in constant stack. Deadlines
 * are the event loop's business: arm a timer for sluice_pool_wait_bound
 * and cancel. `w` must stay valid until cb has run.
 */
SLUICE_INLINE void sluice_pool_call_begin_async(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    w->sluice__pool = p;
    w->sluice__next = w->sluice__prev = NULL;
    w->sluice__held = false;
    w->sluice__arrived = sluice_clock_now(&p->clock);
    w->call.in_flight_at_start = w->call.limit_at_start = w->call.phantoms_at_start = 0;
    w->call.refused_late = false;
    w->call.expired = SLUICE_EXPIRED_NONE;
    w->sluice__gate.cb = sluice__pool_async_granted;
    w->sluice__gate.data = w;
    /* Outcomes known at once go through the trampoline too: a callback that
     * ends its call and starts the next must not recurse once per call. */
    bool closed = atomic_load_explicit(&p->closed, SLUICE_RELAXED) != 0u;
    if (SLUICE_LIKELY(p->active && !closed)) {
        sluice_gate_acquire_async(&p->gate, &w->sluice__gate);
        return;
    }
    sluice__gate_node_init(&w->sluice__gate.sluice__node, &w->sluice__gate);
    sluice__gate_settle_async(&w->sluice__gate, closed ? SLUICE__NODE_CLOSED : SLUICE__NODE_GRANTED);
}

/*
 * Withdraw an async call that has not started. Returns SLUICE_OK if it was
 * still queued for a permit or waiting out a hold (its callback has run
 * with SLUICE_ECANCELED, and any permit it held went to the next in line),
 * or SLUICE_EAGAIN if its callback already ran or is about to run with
 * another status. Call only after sluice_pool_call_begin_async returned.
 */
SLUICE_INLINE int sluice_pool_call_cancel_async(struct sluice_pool *p, struct sluice_pool_waiter *w)
{
    if (!p->active)
        return SLUICE_EAGAIN;
    if (sluice_gate_cancel_async(&p->gate, &w->sluice__gate) == SLUICE_OK)
        return SLUICE_OK; /* sluice__pool_async_granted passed ECANCELED on */
    sluice_spinlock_lock(&p->hold_lock);
    bool held = w->sluice__held;
    if (held)
        sluice__pool_async_unlink(p, w);
    sluice_spinlock_unlock(&p->hold_lock);
    if (!held)
        return SLUICE_EAGAIN;
    sluice_gate_release(&p->gate);
    sluice__gate_settle_async(&w->sluice__gate, SLUICE__NODE_CANCELED);
    return SLUICE_OK;
}

/*
 * The instant (pool clock, ns) before which no call starts because the
 * provider sent Retry-After; 0 or a past instant = no hold. Event loops
 * with async calls arm a timer for it and call sluice_pool_poll.
 */
SLUICE_INLINE int64_t sluice_pool_hold_until(const struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_hold_until(p->discovery) : 0;
}

/* Detach the async holders, all of them or (hold over) those now free to start. */
SLUICE_INLINE struct sluice_pool_waiter *sluice__pool_take_async(struct sluice_pool *p, bool all)
{
    /* The empty test is only a shortcut for polls: close must look under the
     * lock, or an async grant racing it could park a call after it looked. */
    if (!all && !atomic_load_explicit(&p->n_async_held, SLUICE_SEQ_CST))
        return NULL;
    struct sluice_pool_waiter *list = NULL;
    sluice_spinlock_lock(&p->hold_lock);
    if (all || sluice_discovery_hold_until(p->discovery) <= sluice_clock_now(&p->clock)) {
        while (p->async_held) {
            struct sluice_pool_waiter *w = p->async_held;
            sluice__pool_async_unlink(p, w);
            w->sluice__next = list; /* reversed: the list was newest first */
            list = w;
        }
    }
    sluice_spinlock_unlock(&p->hold_lock);
    return list;
}

/*
 * Release the lingering permits whose time has come, then start the async
 * calls that were waiting out a Retry-After hold, if it is over (their
 * callbacks run here). call_end does both too; an event loop calls this
 * from a timer at sluice_pool_hold_until and sluice_pool_next_release so
 * held calls start, and lingering permits come back, even when nothing
 * else completes. Cheap when nothing is held or lingering.
 */
SLUICE_INLINE void sluice_pool_poll(struct sluice_pool *p)
{
    if (p->active)
        sluice__pool_reap(p);
    for (struct sluice_pool_waiter *w = sluice__pool_take_async(p, false); w;) {
        struct sluice_pool_waiter *next = w->sluice__next;
        w->sluice__next = NULL;
        sluice__gate_settle_async(&w->sluice__gate, SLUICE__NODE_GRANTED); /* starts it */
        w = next;
    }
}

/* ---- ending a call ---------------------------------------------------------- */

/* The sample a call ends with; its latency is start to now when latency_ns < 0. */
SLUICE_INLINE struct sluice_sample sluice__pool_sample(const struct sluice_call *call,
                                                       enum sluice_outcome outcome,
                                                       int64_t retry_after_ns, int64_t latency_ns,
                                                       int64_t now)
{
    struct sluice_sample sample;
    sample.latency_ns = latency_ns >= 0 ? latency_ns : now - call->start_ns;
    sample.in_flight_at_start = call->in_flight_at_start;
    sample.outcome = outcome;
    sample.retry_after_ns = retry_after_ns;
    sample.start_ns = call->start_ns;
    sample.limit_at_start = call->limit_at_start;
    return sample;
}

/* Calls a trial needs served above the ceiling, with phantoms around, before LEARNED
 * lingering decides the provider frees the slots of abandoned calls: one could be luck (a
 * phantom that had just finished), eight in a row are not. */
#define SLUICE_POOL_LINGER_TRIAL_CALLS 8u

/* The ceiling the trial of LEARNED lingering measures against: the locked ceiling of an
 * adaptive pool, where the provider refused or queued (0 = none yet: no trial). A fixed
 * pool's limit is the operator's, not a point where the provider refuses: serving above it
 * proves nothing, so a fixed pool never runs the trial (LEARNED keeps permits there). */
SLUICE_INLINE uint32_t sluice__pool_trial_ceiling(const struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_ceiling(p->discovery) : 0;
}

/* The trial's ceiling when the call started with its own count plus the phantoms
 * (abandoned calls released on trial, perhaps still running) above it, where the provider
 * refuses if they still run; 0 when it did not (or there is no trial). */
SLUICE_INLINE uint32_t sluice__pool_phantoms_passed(const struct sluice_pool *p,
                                                    const struct sluice_call *call)
{
    if (SLUICE_LIKELY(!call->phantoms_at_start))
        return 0;
    uint32_t ceiling = sluice__pool_trial_ceiling(p);
    return ceiling && call->in_flight_at_start + call->phantoms_at_start > ceiling ? ceiling : 0;
}

/*
 * LEARNED lingering, the trial's verdict from one ended call whose phantoms
 * passed the ceiling (sluice__pool_phantoms_passed): refused, the phantoms
 * were still running there (it keeps working: lingering on for good);
 * served, they were not — after SLUICE_POOL_LINGER_TRIAL_CALLS of them it
 * frees the slot of an abandoned call (lingering off for good).
 */
SLUICE_INLINE void sluice__pool_linger_verdict(struct sluice_pool *p, const struct sluice_call *call,
                                               enum sluice_outcome outcome)
{
    if (SLUICE_LIKELY(!call->phantoms_at_start) || p->linger != SLUICE_LINGER_LEARNED ||
        atomic_load_explicit(&p->linger_learned, SLUICE_RELAXED) != SLUICE_LINGER_LEARNED ||
        !sluice__pool_phantoms_passed(p, call))
        return;
    if (outcome == SLUICE_OUTCOME_OVERLOAD)
        atomic_store_explicit(&p->linger_learned, (uint32_t)SLUICE_LINGER_ON, SLUICE_RELAXED);
    else if (outcome == SLUICE_OUTCOME_OK &&
             atomic_fetch_add_explicit(&p->trial_served, 1u, SLUICE_RELAXED) + 1u >=
                 SLUICE_POOL_LINGER_TRIAL_CALLS)
        atomic_store_explicit(&p->linger_learned, (uint32_t)SLUICE_LINGER_OFF, SLUICE_RELAXED);
}

/* A refusal the trial's phantoms explain: the call started with its own count at or under
 * the ceiling and the phantoms above it, so the provider refused exactly where the lock
 * says it would if the phantoms were still running (which is what the trial asks). It says
 * nothing new about the cap: discovery hears it as IGNORE, not as a refusal at the lock,
 * which would back the limit off (it cut 24 to 21, one run in two, over HTTP). */
SLUICE_INLINE bool sluice__pool_phantom_refusal(const struct sluice_pool *p,
                                                const struct sluice_call *call,
                                                enum sluice_outcome outcome)
{
    if (SLUICE_LIKELY(!call->phantoms_at_start) || outcome != SLUICE_OUTCOME_OVERLOAD)
        return false;
    uint32_t ceiling = sluice__pool_phantoms_passed(p, call);
    return ceiling && call->in_flight_at_start <= ceiling;
}

/* LEARNED lingering, undecided, with a ceiling to test against: release an abandoned call's
 * permit at once and remember it as a phantom until `until`. False: no trial (no ceiling, or
 * every phantom slot is taken): keep the permit instead. */
SLUICE_INLINE bool sluice__pool_trial(struct sluice_pool *p, int64_t until)
{
    if (!sluice__pool_trial_ceiling(p))
        return false;
    for (uint32_t i = 0; i < p->active; i++) {
        int64_t free_slot = SLUICE__LINGER_FREE;
        if (atomic_compare_exchange_strong_explicit(&p->phantom_slots[i], &free_slot, until,
                                                    SLUICE_RELAXED, SLUICE_RELAXED)) {
            atomic_fetch_add_explicit(&p->phantoms, 1u, SLUICE_RELAXED);
            return true;
        }
    }
    return false;
}

/* What an abandoned call does with its permit now: SLUICE_LINGER_ON (keep it), _OFF (release
 * it), or _LEARNED (undecided: keep it, or release it on trial). */
SLUICE_INLINE enum sluice_linger sluice_pool_linger_now(const struct sluice_pool *p)
{
    return p->linger != SLUICE_LINGER_LEARNED
               ? p->linger
               : (enum sluice_linger)atomic_load_explicit(
                     &((struct sluice_pool *)p)->linger_learned, SLUICE_RELAXED);
}

/*
 * Keep an abandoned call's permit until `until` (pool clock): claim a free
 * slot (one exists: every lingering call holds one of the `active` permits),
 * lower linger_next, and tell the watcher that times releases. The call
 * stays in the in-flight count.
 */
SLUICE_INLINE void sluice__pool_linger(struct sluice_pool *p, int64_t until)
{
    atomic_fetch_add_explicit(&p->lingering, 1u, SLUICE_RELAXED);
    for (uint32_t i = atomic_load_explicit(&p->linger_hint, SLUICE_RELAXED) % p->active;;
         i = (i + 1u) % p->active) {
        int64_t free_slot = SLUICE__LINGER_FREE;
        if (atomic_compare_exchange_strong_explicit(&p->linger_slots[i], &free_slot, until,
                                                    SLUICE_SEQ_CST, SLUICE_RELAXED)) {
            atomic_store_explicit(&p->linger_hint, (i + 1u) % p->active, SLUICE_RELAXED);
            break;
        }
    }
    sluice__pool_linger_lower(p, until);
    atomic_fetch_add_explicit(&p->linger_epoch, 1u, SLUICE_SEQ_CST);
    sluice__pool_count(p, SLUICE__POOL_LINGERED);
    sluice__pool_watch_poke(p);
}

/*
 * Everything call_end and call_abandon share: count, record the sample,
 * then give the permit back — or, with `linger_until` > now, keep it (and
 * the in-flight count) until then — and run discovery's effects.
 */
SLUICE_INLINE struct sluice_sample sluice__pool_end(struct sluice_pool *p,
                                                    const struct sluice_call *call,
                                                    enum sluice_outcome outcome,
                                                    int64_t retry_after_ns, int64_t latency_ns,
                                                    int64_t now, bool abandoned,
                                                    int64_t linger_until)
{
    struct sluice_sample sample =
        sluice__pool_sample(call, outcome, retry_after_ns, latency_ns, now);
    bool linger = linger_until > now;
    if (!linger)
        atomic_fetch_sub_explicit(&p->in_flight, 1u, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&p->ended[outcome == SLUICE_OUTCOME_CENSORED ? 3u
                                        : !abandoned && (unsigned)outcome <= SLUICE_OUTCOME_IGNORE
                                            ? (unsigned)outcome
                                            : (unsigned)SLUICE_OUTCOME_IGNORE],
                              1u, SLUICE_RELAXED);
    if (SLUICE_UNLIKELY(p->discovery != NULL)) {
        struct sluice_sample heard = sample;
        if (sluice__pool_phantom_refusal(p, call, outcome))
            heard.outcome = SLUICE_OUTCOME_IGNORE;
        sluice_discovery_record(p->discovery, &heard);
    }
    /* The sample may have raised the limit, granting waiters too: async
     * callbacks wait until every sync waiter this end granted is woken. */
    bool outer = SLUICE_UNLIKELY(p->discovery != NULL) && sluice__gate_hold_callbacks();
    if (linger)
        sluice__pool_linger(p, linger_until);
    else if (p->active)
        sluice_gate_release(&p->gate);
    if (p->active) {
        /* The operator's figures, and the estimates, after the permit moved on: only a
         * call that ran to its end says how long calls take. */
        if (!abandoned) {
            sluice_histogram_add(&p->call_time, now - call->start_ns);
            if (outcome == SLUICE_OUTCOME_OK) {
                sluice_service_add(&p->service, now - call->start_ns);
                sluice_service_add(&p->first_byte, sample.latency_ns);
            }
        } else if (outcome == SLUICE_OUTCOME_OK || outcome == SLUICE_OUTCOME_CENSORED) {
            /* A call cut at t takes longer than t: without it the estimates would see only
             * the calls short enough to beat their deadlines (sluice/service.h). */
            sluice_service_add_censored(&p->service, now - call->start_ns);
            if (outcome == SLUICE_OUTCOME_OK) /* its first byte came */
                sluice_service_add(&p->first_byte, sample.latency_ns);
            else
                sluice_service_add_censored(&p->first_byte, now - call->start_ns);
        }
        sluice__pool_linger_verdict(p, call, outcome);
        sluice__pool_reap(p);
    }
    if (SLUICE_UNLIKELY(p->discovery != NULL)) {
        sluice_discovery_hand_out_grants(p->discovery);
        sluice__gate_resume_callbacks(outer);
        sluice_discovery_flush(p->discovery);
        sluice_pool_poll(p);
    }
    return sample;
}

/*
 * End a call with the latency signal the caller measured (see
 * sluice_pool_call_end): `latency_ns` is what discovery learns from — for a
 * streamed answer, time to first byte, because total time measures output
 * length, not queueing; a negative value means "start to now". The sample
 * keeps the call's own start, so it lands in the window it started in.
 * The expected service time (sluice/service.h) learns the call's whole
 * duration, start to now, from every OK call: it asks how long a call
 * takes to finish.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_end_latency(struct sluice_pool *p,
                                                                const struct sluice_call *call,
                                                                enum sluice_outcome outcome,
                                                                int64_t retry_after_ns,
                                                                int64_t latency_ns)
{
    return sluice__pool_end(p, call, outcome, retry_after_ns, latency_ns,
                            sluice_clock_now(&p->clock), false, 0);
}

/*
 * End a call the caller gave up on after its request was sent: `why` is
 * SLUICE_ETIMEDOUT (a deadline) or SLUICE_ECANCELED (its token), counted in
 * the pool's timeouts or cancels. `latency_ns` is the latency signal if it
 * was seen before the call was cut (a stream's first byte; then discovery
 * gets it as a served call's), else negative: a call cut by its deadline
 * at t then teaches discovery "longer than t" (SLUICE_OUTCOME_CENSORED,
 * latency t), a cancelled one nothing (IGNORE). Whether the call keeps its
 * permit follows the pool's linger mode (enum sluice_linger): where the
 * provider keeps working it stays in flight until sluice_service_linger_until
 * (the high quantile of recent service times after now; capped by
 * linger_max_ms from its start): a lingering permit, released by whoever
 * comes by first (see the header comment). Released at once when lingering
 * is off, the estimate has no samples yet, or the call has already run
 * that long. Returns the sample. Never blocks.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_abandon_latency(struct sluice_pool *p,
                                                                    const struct sluice_call *call,
                                                                    int why, int64_t latency_ns)
{
    int64_t now = sluice_clock_now(&p->clock);
    int64_t until = 0;
    if (p->active) {
        sluice__pool_count_stop(p, why);
        enum sluice_linger mode = sluice_pool_linger_now(p);
        if (mode != SLUICE_LINGER_OFF)
            until = sluice_service_linger_until(&p->service, call->start_ns, now,
                                                p->linger_max_ns);
        if (mode == SLUICE_LINGER_LEARNED && until > now && sluice__pool_trial(p, until))
            until = 0;
    }
    enum sluice_outcome outcome = latency_ns >= 0          ? SLUICE_OUTCOME_OK
                                  : why == SLUICE_ETIMEDOUT ? SLUICE_OUTCOME_CENSORED
                                                            : SLUICE_OUTCOME_IGNORE;
    return sluice__pool_end(p, call, outcome, 0, latency_ns, now, true, until);
}

/* sluice_pool_call_abandon_latency with no latency signal seen. */
SLUICE_INLINE struct sluice_sample sluice_pool_call_abandon(struct sluice_pool *p,
                                                            const struct sluice_call *call, int why)
{
    return sluice_pool_call_abandon_latency(p, call, why, -1);
}

/*
 * End a call that sluice_pool_call_begin (or an async call's SLUICE_OK)
 * started: give its permit back (waking the next call in line) and return
 * its sample, whose latency is start to now. `outcome` says what the call
 * showed about the provider's capacity; `retry_after_ns` is the hold the
 * provider asked for (0 = none): its Retry-After with an overload, the
 * named reset with SLUICE_OUTCOME_RATE, the reset of a spent request budget
 * with SLUICE_OUTCOME_OK (see discovery.h, "What a signal means"). An adaptive pool
 * feeds the sample to its discovery first, so a limit cut or hold it causes
 * is in force before the permit moves on; discovery's effects (grants after
 * a raise, store I/O, event callbacks) run after the permit is released, on
 * this thread unless another thread is already running them.
 */
SLUICE_INLINE struct sluice_sample sluice_pool_call_end(struct sluice_pool *p,
                                                        const struct sluice_call *call,
                                                        enum sluice_outcome outcome,
                                                        int64_t retry_after_ns)
{
    return sluice_pool_call_end_latency(p, call, outcome, retry_after_ns, -1);
}

/* The pool's gate (tests and diagnostics only); NULL when unlimited. */
SLUICE_INLINE struct sluice_gate *sluice__pool_gate(struct sluice_pool *p)
{
    return p->active ? &p->gate : NULL;
}

/* The pool's discovery node; NULL for a fixed or unlimited pool. */
SLUICE_INLINE struct sluice_discovery *sluice_pool_discovery(const struct sluice_pool *p)
{
    return p->discovery;
}

/*
 * Clear an adaptive pool's discovery node (sluice_discovery_clear: drop the
 * persisted lock, back to probing from the jumpstart). A live Retry-After
 * hold stays in force: it is the provider's word about now. Returns
 * SLUICE_OK, also for a fixed or unlimited pool, which it leaves alone.
 * Callable from any thread, including an async callback.
 */
SLUICE_INLINE int sluice_pool_clear(struct sluice_pool *p)
{
    return p->discovery ? sluice_discovery_clear(p->discovery) : SLUICE_OK;
}

/*
 * Close the pool: every later admit and call_begin returns SLUICE_ECLOSED;
 * every queued call — blocked, async, or waiting out a hold — is woken with
 * SLUICE_ECLOSED and holds nothing; calls in flight finish and end as
 * usual, and admitted runs still leave. Idempotent. Async callbacks of the
 * woken calls run on this thread.
 */
SLUICE_INLINE void sluice_pool_close(struct sluice_pool *p)
{
    atomic_store_explicit(&p->closed, 1u, SLUICE_SEQ_CST);
    if (!p->active)
        return;
    sluice_gate_close(&p->gate);
    /* Calls waiting out a hold: wake the sleepers (they see `closed`) ... */
    atomic_fetch_add_explicit(&p->hold_epoch, 1u, SLUICE_SEQ_CST);
    sluice_spinlock_lock(&p->hold_lock);
    for (struct sluice__pool_holder *h = p->holders; h; h = h->next)
        if (sluice__pool_rouse(h))
            sluice_futex_wake(&h->state);
    sluice_spinlock_unlock(&p->hold_lock);
    /* ... and settle the async ones here. */
    for (struct sluice_pool_waiter *w = sluice__pool_take_async(p, true); w;) {
        struct sluice_pool_waiter *next = w->sluice__next;
        w->sluice__next = NULL;
        sluice_gate_release(&p->gate);
        sluice__gate_settle_async(&w->sluice__gate, SLUICE__NODE_CLOSED);
        w = next;
    }
}

/* A snapshot of the pool; all zero for NULL (e.g. the pool of an unknown ID). */
SLUICE_INLINE struct sluice_pool_counts sluice_pool_stats(const struct sluice_pool *pool)
{
    struct sluice_pool *p = (struct sluice_pool *)pool;
    struct sluice_pool_counts c;
    memset(&c, 0, sizeof c);
    if (!p)
        return c;
    c.admitted = atomic_load_explicit(&p->admitted, SLUICE_RELAXED);
    c.in_flight = atomic_load_explicit(&p->in_flight, SLUICE_RELAXED);
    c.queued = (p->active ? sluice_gate_stats(&p->gate).waiting : 0u) +
               atomic_load_explicit(&p->holding, SLUICE_RELAXED);
    c.active = p->active ? sluice_gate_limit(&p->gate) : 0u;
    c.active_max = p->active;
    c.waiting_capacity = p->waiting;
    c.closed = atomic_load_explicit(&p->closed, SLUICE_RELAXED) != 0u;
    c.calls_ok = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_OK], SLUICE_RELAXED);
    c.calls_overload = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_OVERLOAD], SLUICE_RELAXED);
    c.calls_ignored = atomic_load_explicit(&p->ended[SLUICE_OUTCOME_IGNORE], SLUICE_RELAXED);
    c.calls_censored = atomic_load_explicit(&p->ended[3], SLUICE_RELAXED);
    c.lingering = atomic_load_explicit(&p->lingering, SLUICE_RELAXED);
    c.linger = p->linger;
    c.linger_now = sluice_pool_linger_now(p);
    c.expected_ns = sluice_service_expected(&p->service);
    c.expected_first_ns = sluice_service_expected(&p->first_byte);
    uint64_t *to[SLUICE__POOL_COUNTERS] = {&c.refused_capacity, &c.refused_early, &c.refused_late,
                                           &c.timeouts,         &c.cancels,       &c.lingered};
    for (int i = 0; i < SLUICE__POOL_COUNTERS; i++)
        *to[i] = atomic_load_explicit(&p->counted[i], SLUICE_RELAXED);
    for (int i = 0; i < SLUICE__POOL_REFUSAL_SHARDS; i++)
        c.refused_capacity += atomic_load_explicit(&p->refusals[i].refused, SLUICE_RELAXED);
    return c;
}

/*
 * The pool's histograms: queue wait of every call that left the queue
 * (started, refused late, timed out or cancelled while queued) and the
 * duration of every call that ended (start to end, abandoned ones
 * excluded). Zero for NULL or an unlimited pool, which records none.
 */
SLUICE_INLINE void sluice_pool_histograms(const struct sluice_pool *p,
                                          struct sluice_histogram_counts *queue_wait,
                                          struct sluice_histogram_counts *call_time)
{
    if (queue_wait)
        memset(queue_wait, 0, sizeof *queue_wait);
    if (call_time)
        memset(call_time, 0, sizeof *call_time);
    if (!p)
        return;
    if (queue_wait)
        *queue_wait = sluice_histogram_read(&p->queue_wait);
    if (call_time)
        *call_time = sluice_histogram_read(&p->call_time);
}

#endif /* SLUICE_POOL_H */
