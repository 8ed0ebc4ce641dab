/*
 * sluice/policy.h — the ceiling-discovery policy interface.
 *
 * What it is: the contract between a backend's discovery state machine
 * (sluice/discovery.h) and the algorithm that proposes its concurrency
 * limit. The pool turns each finished generation call into a
 * `struct sluice_sample`; discovery folds samples into a window and, when
 * the window closes, hands the policy a `struct sluice_window` summary. The
 * policy answers with a `struct sluice_verdict`: the limit it wants and why.
 * Discovery owns everything around that answer — min/max clamps, the locked
 * ceiling, Retry-After holds, events and persistence — so a policy is a
 * small pure-ish function of its own state and the window.
 *
 * Built-ins (one header each under sluice/policy/):
 *   fixed.h     never moves (non-adaptive nodes)
 *   aimd.h      additive increase, multiplicative decrease on overload
 *   gradient.h  long/short latency-ratio controller
 *   vegas.h     queue estimate L·(1 − minRTT/RTT)
 *   discover.h  the default: slow start, bisection, backoff on overload;
 *               queueing judged against a min-filtered no-queue latency,
 *               Little's law for what the provider serves
 *
 * Writing a policy: embed `struct sluice_policy` as the first member of your
 * state struct, point its `ops` at a static ops table whose `size` is
 * sizeof your struct, and downcast in the callbacks. Parameters follow the
 * sokol convention: zero means default, resolved in one function per
 * policy, and every parameter has a documented, checked range (finite
 * values only), so no arithmetic on it can overflow.
 *
 * A policy object is a value. The object you initialise is a prototype:
 * discovery copies its `ops->size` bytes into storage inside each node at
 * init (at most SLUICE_POLICY_STATE_MAX), and from then on every node
 * updates its own copy. So one description can build many nodes, pools and
 * engines that share no policy state, and the prototype need not outlive
 * them. A policy must therefore be plain data: no pointer into itself (it
 * would still point into the prototype after the copy), and nothing a copy
 * must not duplicate (a lock, a file). Pointers to shared, immutable,
 * long-lived data are fine.
 *
 * Progress and concurrency: policies are plain sequential code with no
 * atomics. Discovery calls reset/update on a node's copy only while it
 * holds that node's update lock, so one policy state is never entered by
 * two threads at once; a policy must not block (it runs on the thread whose
 * completion closed the window). Pure helpers in this header are callable
 * from any thread.
 *
 * Memory ordering: none here. The update lock in discovery.h orders each
 * update after the previous one (acquire/release), which is all the policy
 * state needs.
 */
#ifndef SLUICE_POLICY_H
#define SLUICE_POLICY_H

#include <math.h>
#include <string.h>

#include "cc.h"
#include "status.h"

/*
 * How one generation call ended, as far as the provider's capacity goes.
 * Only OVERLOAD is evidence about the caller's concurrency cap. The last
 * three are refusals that name another cause (see discovery.h, "What a
 * signal means"): they never cut the limit by a factor (only a rate
 * refusal moves the bracket, by where it struck), count as IGNORE in a
 * window, and each becomes an event.
 */
enum sluice_outcome {
    SLUICE_OUTCOME_OK = 0,   /* the provider served the call */
    SLUICE_OUTCOME_OVERLOAD, /* over the caller's concurrency cap (429/503 that names no other
                                cause, a provider timeout): back off */
    SLUICE_OUTCOME_IGNORE,   /* transport error or caller cancel: says nothing about capacity */
    SLUICE_OUTCOME_RATE,     /* a request or token budget ran out and the provider named its
                                reset (retry_after_ns): hold new calls until then; probing is
                                bracketed where it struck, never cut by a factor */
    SLUICE_OUTCOME_PLATFORM, /* the provider's whole platform is overloaded (Anthropic 529,
                                Together 503 below the dynamic rate, Gemini 503): hold new
                                calls briefly (retry_after_ns, or SLUICE_PLATFORM_HOLD_NS) */
    SLUICE_OUTCOME_QUOTA,    /* quota or billing refusal (402, insufficient_quota): waiting
                                does not help; nothing moves, no hold */
    SLUICE_OUTCOME_CENSORED, /* the caller's deadline cut the call after its request was sent,
                                latency_ns after it started: the provider took it, and it
                                takes longer than that — a censored sample, not an overload.
                                Measured with the served calls: its latency enters the
                                window's mean as latency_ns (a restricted mean: see
                                sluice_window.n_censored) */
};

/* The hold a platform overload gets when the provider names none: long enough
 * for a burst of its 529s to pass, short next to a lock (a day). */
#define SLUICE_PLATFORM_HOLD_NS (INT64_C(1000000000))

/* One completed generation call. */
struct sluice_sample {
    int64_t latency_ns;          /* what the call's latency signal measured: call start to end,
                                    or to the first byte of a streamed answer; queue wait
                                    excluded */
    uint32_t in_flight_at_start; /* calls in flight when the call started, itself included */
    enum sluice_outcome outcome;
    int64_t retry_after_ns;      /* provider's Retry-After, 0 = none */
    int64_t start_ns;            /* discovery clock when the call started (0 = unknown: taken
                                    as now - latency_ns) */
    uint32_t limit_at_start;     /* the limit in force when the call started; an overload
                                    counts against it, however late it surfaces (a timeout).
                                    0 = unknown: freshness then goes by start time alone */
};

/*
 * Why a limit moved. Policies report the growth and backoff causes;
 * discovery adds the ones that come from its own state machine. Every event
 * in sluice/events.h carries one. X(NAME, "json name", "what it says, for a
 * person"): the sentence is the event's "why" (the page shows it on the
 * event) and the README's table of causes, which a test holds to it.
 */
#define SLUICE_CAUSE_MAP(X)                                                                        \
    X(NONE, "none", "nothing: the limit did not move")                                             \
    X(SLOW_START, "slow_start", "every permit in use and no congestion yet: the limit doubles")    \
    X(ADDITIVE, "additive",                                                                        \
      "every permit in use, clean, after congestion (or under a bracket): it grows by a step")     \
    X(OVERLOAD, "overload",                                                                        \
      "HTTP 429 or 503, or a provider timeout: cut from where the refusals struck")                \
    X(RETRY_AFTER, "retry_after", "an overload that carried Retry-After")                          \
    X(LATENCY, "latency",                                                                          \
      "latency rose past the knee over the no-queue latency: calls queue at the provider")         \
    X(BRACKET, "bracket", "probed up to just below the last congestion and held there: locked")    \
    X(MAX_LIMIT, "max_limit", "reached the configured max_limit with no congestion: locked")       \
    X(LOWERED, "lowered", "an overload below a locked ceiling: the ceiling came down")             \
    X(CEILING, "ceiling",                                                                          \
      "clamped to the locked ceiling, or to the bracket under the last congestion")                \
    X(HEALTHY, "healthy", "a clean window after a backoff")                                        \
    X(TTL, "ttl", "the lock's time to live ran out: probing again")                                \
    X(STORE, "store", "a live lock was read back from the store at start")                         \
    X(API, "api",                                                                                  \
      "a caller cleared the node (sluice_discovery_clear, the admin's clear, sluicectl clear)")    \
    X(STORE_ERROR, "store_error",                                                                  \
      "the store (a state file, a fleet's Redis) failed a load, save or clear: memory serves")     \
    X(STORE_CORRUPT, "store_corrupt",                                                              \
      "the state file holds data it cannot read (sluice_statefile_last_error says what)")          \
      /* load said SLUICE_EINVAL */                                                                \
    X(INVALID_RECORD, "invalid_record",                                                            \
      "a stored lock was locked in the future, or expires before it was locked: dropped")          \
    X(EXPIRY_CAPPED, "expiry_capped",                                                              \
      "a stored lock expired later than lock_ttl_s from now: its expiry was cut to that")          \
    X(RATE_LIMIT, "rate_limit",                                                                    \
      "the provider's rate budget ran out: new calls held") /* a "hold" event */                   \
    X(PLATFORM, "platform", "a platform-wide overload: new calls held") /* a "hold" event */       \
    X(QUOTA, "quota",                                                                              \
      "a quota or billing refusal: nothing moved, waiting will not help") /* a "quota" event */    \
    X(PROVIDER_RATE, "provider_rate",                                                              \
      "the jumpstart moved to the request rate the provider states times the latency")             \
      /* a "hint" event */                                                                         \
    X(REMEASURE, "remeasure",                                                                      \
      "a brief step down to measure the no-queue latency levels are judged by; nothing refused")   \
      /* BBR's PROBE_RTT */                                                                        \
    X(MEASURE_BELOW, "measure_below",                                                              \
      "one step down to measure the level under the bracket's last step; nothing refused")         \
    X(RESUME, "resume",                                                                            \
      "back up from a re-measure to the level it left (or the knee's cut): no news of headroom")

#define SLUICE__CAUSE_ENUM(name, str, text) SLUICE_CAUSE_##name,
#define SLUICE__CAUSE_CASE(name, str, text) SLUICE__NAME_CASE(SLUICE_CAUSE_##name, str)
/* enum sluice_cause, and sluice_cause_name: the cause's snake_case name
 * ("retry_after"); never NULL. */
SLUICE__ENUM_WITH_NAMES(sluice_cause, sluice_cause_name, SLUICE_CAUSE_MAP, SLUICE__CAUSE_ENUM,
                        SLUICE__CAUSE_CASE)
#undef SLUICE__CAUSE_ENUM
#undef SLUICE__CAUSE_CASE

/* What a cause says, one line of ASCII for a person (the event's "why"); "unknown" for a
 * value outside the map. */
SLUICE_INLINE const char *sluice_cause_text(enum sluice_cause cause)
{
#define SLUICE__CAUSE_TEXT_CASE(name, str, text) SLUICE__NAME_CASE(SLUICE_CAUSE_##name, text)
    switch (cause) {
        SLUICE_CAUSE_MAP(SLUICE__CAUSE_TEXT_CASE)
    }
#undef SLUICE__CAUSE_TEXT_CASE
    return "unknown";
}

/* How many causes there are (each in [0, SLUICE_CAUSE_COUNT)): the size of a per-cause
 * table, which then follows a new cause by itself. Outside the enum, so a switch over
 * the causes need not name it. */
#define SLUICE__CAUSE_ONE(name, str, text) +1
enum { SLUICE_CAUSE_COUNT = 0 SLUICE_CAUSE_MAP(SLUICE__CAUSE_ONE) };
#undef SLUICE__CAUSE_ONE

/* True for the causes that are congestion signals (the reasons to back off). */
SLUICE_INLINE bool sluice_cause_is_congestion(enum sluice_cause cause)
{
    return cause == SLUICE_CAUSE_OVERLOAD || cause == SLUICE_CAUSE_RETRY_AFTER ||
           cause == SLUICE_CAUSE_LATENCY;
}

/*
 * A closed sampling window. Latency statistics cover only calls that
 * started under `limit` (after the last limit change), so each window
 * measures one operating point; overloads also count from calls that
 * started earlier, unless discovery has already backed off for them.
 */
struct sluice_window {
    int64_t start_ns, end_ns;   /* discovery clock */
    uint32_t limit;             /* the limit in force while the window ran */
    uint32_t probe_cap;         /* highest limit discovery will accept next; 0 = none */
    uint32_t n_ok;              /* measured calls started under `limit`: served, or cut by their
                                   caller's deadline (n_censored of them) */
    uint32_t n_censored;        /* of n_ok, calls cut by their caller's deadline: each counts at
                                   the time it had run, a lower bound on its latency, so the
                                   latency statistics are a restricted mean, E[min(L, t)] —
                                   the survival-analysis estimate that needs no model of the
                                   tail. It compares levels fairly while the cut times do not
                                   depend on the level, which the pool's admission rule
                                   (sluice/pool_deadlines.h) keeps so: a call is admitted
                                   only when its predicted wait leaves it the time to finish,
                                   at any limit. Without it (a queue that ate most of each
                                   deadline at low limits) the served calls alone would
                                   read slower at higher limits, where more slow calls have
                                   the time to finish: a false knee */
    uint32_t n_overload;        /* overloads seen in the window, stale ones included */
    uint32_t n_fresh_overload;  /* overloads that are news: refused at a concurrency the limit
                                   still allows (see discovery.h, "What a refusal says"); the
                                   rest echo a level already cut below */
    uint32_t n_ignore;          /* ignored outcomes and calls from an older operating point */
    uint32_t max_in_flight;     /* highest in_flight_at_start among the n_ok calls */
    bool saturated;             /* demand reached the limit (max_in_flight ~ limit) */
    int64_t latency_mean_ns;    /* mean latency of the n_ok calls; 0 when n_ok == 0 */
    int64_t duration_mean_ns;   /* their mean duration, start to sample (a streamed answer's
                                   whole call, where its latency is time to first byte); 0
                                   when n_ok == 0 */
    int64_t latency_min_ns;     /* their minimum; 0 when n_ok == 0 */
    int64_t latency_mad_ns;     /* their mean absolute deviation from the previous windows'
                                   running mean (the first window, which has none: from its
                                   own mean, as a normal with their spread would show) */
    int64_t retry_after_ns;     /* largest Retry-After among the overloads; 0 = none */
    uint32_t n_served;          /* calls that ended OK while the window was open, measured or
                                   not: n_served / (end_ns - start_ns) is the completion rate */
    uint32_t overload_limit;    /* the lowest limit under which a fresh overload's call
                                   started: where the provider refused (0 = none known) */
    int64_t overload_start_ns;  /* the earliest start among the fresh overloads' calls
                                   (INT64_MAX = none) */
    int64_t overload_latency_ns; /* the longest a fresh overload took (0 = none): a provider
                                    that refuses at its door answers far sooner than it
                                    serves; a gateway that queues first, only after a wait */
    uint32_t overload_in_flight; /* the lowest in_flight_at_start among the fresh overloads:
                                   the provider was over its cap with this many calls in
                                   flight (0 = none known) */
    uint32_t refused_in_flight; /* the same over every overload of the window, echoes
                                   included (0 = none known) */
    uint32_t served_in_flight;  /* the most calls in flight any served call started with, in
                                   this window or the one before (0 = none known) */
    uint32_t lingering;         /* permits kept, when the window closed, by calls whose sample
                                   is in (a pool's lingering permits): counted in flight, held
                                   by no call of ours */
    uint32_t reporting;         /* calls in flight when the window closed that will still
                                   report a sample (0 where the node runs no calls of its own,
                                   as a fleet's leader, fed the fleet's reports) */
    /* The least-squares line of the n_ok calls' latency on the calls in flight at their
     * start: latency ~ latency_mean_ns + latency_per_call_ns·(x − in_flight_mean). It says
     * whether latency rose with load inside one window (the calls of a window that has just
     * opened start at different counts), before any other level is measured. */
    double in_flight_mean;      /* mean in_flight_at_start of the n_ok calls */
    double latency_per_call_ns; /* the slope, ns per call in flight; 0 = the counts never
                                   varied, or fewer than 3 calls */
    double latency_per_call_se_ns; /* its standard error (0 = unknown, as above) */
};

/* A policy's answer to one window. */
struct sluice_verdict {
    uint32_t limit;          /* the limit it wants (discovery clamps it) */
    enum sluice_cause cause; /* NONE, a growth cause, or a congestion cause */
    uint32_t estimate;       /* on congestion: its estimate of the limit that does not congest
                                (0 = no estimate; discovery then uses the current limit) */
};

struct sluice_policy;

/* The most bytes a policy object may take: the size of the per-node copy
 * (see "A policy object is a value"). discover takes 416 (its per-limit
 * statistics); the other built-ins under 128. */
#define SLUICE_POLICY_STATE_MAX 512

/* The highest limit any policy parameter may name (= SLUICE_GATE_LIMIT_MAX). */
#define SLUICE_POLICY_LIMIT_MAX (UINT32_C(1) << 30)

struct sluice_policy_ops {
    const char *name; /* "aimd", shown in benchmarks and logs, persisted with a lock
                         (at most SLUICE_POLICY_NAME_MAX-1 bytes are kept) */
    bool adaptive;    /* false: discovery never probes, locks or clears this node */
    /* Forget everything learned and return the starting limit. `jumpstart`
     * is discovery's starting point; `warm` is true when a previously
     * discovered ceiling is being restored, so fast probing would only
     * overshoot. */
    uint32_t (*reset)(struct sluice_policy *self, uint32_t jumpstart, bool warm);
    /* Propose a limit for the window that just closed. */
    struct sluice_verdict (*update)(struct sluice_policy *self, const struct sluice_window *w);
    /* sizeof the policy's struct: the bytes discovery copies into each node, in
       [sizeof(struct sluice_policy), SLUICE_POLICY_STATE_MAX] (last, so a table
       written positionally before it existed is rejected, not misread). */
    size_t size;
};

/* The header every policy object starts with. */
struct sluice_policy {
    const struct sluice_policy_ops *ops;
};

SLUICE_INLINE uint32_t sluice_policy_reset(struct sluice_policy *p, uint32_t jumpstart, bool warm)
{
    return p->ops->reset(p, jumpstart, warm);
}

SLUICE_INLINE struct sluice_verdict sluice_policy_update(struct sluice_policy *p,
                                                         const struct sluice_window *w)
{
    return p->ops->update(p, w);
}

/* ---- helpers shared by the built-in policies ----------------------------- */

/* A verdict: propose `limit` for `cause` (SLUICE_CAUSE_NONE: no change of
 * operating point), with `estimate` the policy's queue-free limit (0 = none).
 * For any policy's update, built-in or not (the shim's fleet follower).
 * Pure; any thread. */
SLUICE_INLINE struct sluice_verdict sluice_verdict_make(uint32_t limit, enum sluice_cause cause,
                                                        uint32_t estimate)
{
    struct sluice_verdict v;
    v.limit = limit;
    v.cause = cause;
    v.estimate = estimate;
    return v;
}

/* Keep the limit where it is. */
SLUICE_INLINE struct sluice_verdict sluice__verdict_hold(const struct sluice_window *w)
{
    return sluice_verdict_make(w->limit, SLUICE_CAUSE_NONE, 0);
}

/* limit·factor rounded down, always at least one below `limit` and at least 1. */
SLUICE_INLINE uint32_t sluice__policy_cut(uint32_t limit, double factor)
{
    double cut = (double)limit * factor;
    uint32_t n = cut < 1.0 ? 1u : (uint32_t)cut;
    if (n >= limit)
        n = limit > 1 ? limit - 1 : 1;
    return n;
}

/* Where the window's fresh overloads struck: the fewest calls in flight any
 * of them started with — a cap refuses only above itself — where no call
 * was just served with as many in flight (else the refusal is not about
 * concurrency: a rate window refuses at any level); otherwise the lowest
 * limit they started under. Never above the limit. */
SLUICE_INLINE uint32_t sluice_window_struck(const struct sluice_window *w)
{
    uint32_t at = w->limit;
    if (w->overload_limit && w->overload_limit < at)
        at = w->overload_limit;
    if (w->overload_in_flight > w->served_in_flight && w->overload_in_flight < at)
        at = w->overload_in_flight;
    return at;
}

/* The verdict every loss-based policy gives a window with a fresh overload:
 * one cut, from where the refusals struck (so a burst that arrived while
 * the limit stood far above the calls in flight does not need one cut per
 * step down to them). */
SLUICE_INLINE struct sluice_verdict sluice__verdict_overload(const struct sluice_window *w,
                                                             double factor)
{
    uint32_t cut = sluice__policy_cut(sluice_window_struck(w), factor);
    if (cut >= w->limit)
        cut = w->limit > 1 ? w->limit - 1 : 1;
    return sluice_verdict_make(cut,
                           w->retry_after_ns > 0 ? SLUICE_CAUSE_RETRY_AFTER
                                                 : SLUICE_CAUSE_OVERLOAD,
                           0);
}

SLUICE_INLINE uint32_t sluice__sat_add(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

/* A double as uint32_t, saturating: NaN and negatives give 0, anything past
 * UINT32_MAX gives UINT32_MAX (a plain cast of those is undefined). */
SLUICE_INLINE uint32_t sluice__sat_u32(double v)
{
    return v >= 4294967295.0 ? UINT32_MAX : v > 0.0 ? (uint32_t)v : 0u;
}

/* A double as int64_t, saturating the same way to [INT64_MIN, INT64_MAX]
 * (NaN gives 0). 2^63 is exact in a double; INT64_MAX is not. */
SLUICE_INLINE int64_t sluice__sat_i64(double v)
{
    return isnan(v) ? 0
           : v >= 9223372036854775808.0 ? INT64_MAX
           : v <= -9223372036854775808.0 ? INT64_MIN
                                          : (int64_t)v;
}

/*
 * Check lo < v < hi (or lo < v <= hi when hi_inclusive); on failure write
 * `msg` (which names the field) to err (sluice__fail) and return
 * SLUICE_EINVAL. NaN and infinities fail every finite range.
 */
SLUICE_INLINE int sluice__check_range(double v, double lo, double hi, bool hi_inclusive,
                                      const char *msg, char *err, size_t err_size)
{
    bool ok = v > lo && (hi_inclusive ? v <= hi : v < hi);
    return ok ? SLUICE_OK : sluice__fail(err, err_size, "%s", msg);
}

/*
 * A built-in policy's parameters as one table. PARAMS(X) lists one row per
 * field, X(field, default, lo, hi, hi_inclusive, message): a zero field
 * takes `default`, then every field must pass sluice__check_range(field,
 * lo, hi, hi_inclusive) in row order, and the first that fails writes
 * `message`, which names it, to the init's `error`. Within the rows, `r` is
 * the parameters being resolved, so a bound may be another field (vegas:
 * beta above r.alpha). SLUICE__POLICY_RESOLVE(PARAMS) is the body of an
 * init function with arguments `params` (NULL = all defaults), `error` and
 * `error_size`, and a local `r` of the params type: it fills `r`, or
 * returns SLUICE_EINVAL from that function. (A statement macro rather than
 * a function, so an init that cannot fail, with constant params, still
 * folds to a plain copy.)
 */
#define SLUICE__PARAM_DEFAULT(field, def, lo, hi, hi_inclusive, msg) SLUICE__DEFAULT(r.field, def);
#define SLUICE__PARAM_CHECK(field, def, lo, hi, hi_inclusive, msg)                                \
    sluice__check_range((double)r.field, lo, hi, hi_inclusive, msg, error, error_size) ||
#define SLUICE__POLICY_RESOLVE(PARAMS)                                                             \
    do {                                                                                           \
        memset(&r, 0, sizeof r);                                                                   \
        if (params)                                                                                \
            r = *params;                                                                           \
        PARAMS(SLUICE__PARAM_DEFAULT)                                                              \
        if (PARAMS(SLUICE__PARAM_CHECK) false)                                                     \
            return SLUICE_EINVAL;                                                                  \
    } while (0)

/* Define the ops table of a built-in policy `name` (struct sluice_policy_<name>)
 * with its two callbacks and its size. */
#define SLUICE__POLICY_OPS(name, is_adaptive)                                                      \
    SLUICE_INLINE const struct sluice_policy_ops *sluice__##name##_ops(void)                       \
    {                                                                                              \
        static const struct sluice_policy_ops ops = {#name, is_adaptive, sluice__##name##_reset,   \
                                                     sluice__##name##_update,                      \
                                                     sizeof(struct sluice_policy_##name)};         \
        return &ops;                                                                               \
    }

#endif /* SLUICE_POLICY_H */
