/*
 * sluice/discovery.h — per-backend ceiling discovery: the probing / backoff
 * / locked state machine that drives one gate's limit from live traffic.
 *
 * What it is: one `struct sluice_discovery` per adaptive backend ("node").
 * The pool feeds it every finished generation call and asks it whether new
 * calls must wait for a provider's Retry-After (sluice_discovery_hold_until,
 * from call_begin). Discovery folds samples into windows, lets its policy
 * (sluice/policy.h; default: sluice/policy/discover.h) propose a limit at
 * each window's close, and applies the answer to the gate it was given. It
 * keeps a status snapshot, an event ring (sluice/events.h) and, through a
 * store (sluice/store.h), the locked ceiling.
 *
 * States (the glyph is what status lines show):
 *   probing  📈  climbing from the jumpstart (default 5, or the provider's
 *                suggestion) towards the ceiling
 *   backoff  🌧️  a congestion signal just cut the limit; no growth until a
 *                clean window of calls started after the cut, and until any
 *                Retry-After hold has passed ("recovery" event)
 *   locked   🔒  a ceiling is locked for lock_ttl_s (default 24 h); the
 *                limit never grows above it, though it may back off and
 *                recover up to it. Snapshots and status lines compare the
 *                expiry with the wall clock, so a lock that ran out on an
 *                idle node shows as probing (ceiling 0) at once, before the
 *                next window close or poll records the "expiry" event.
 * A node whose policy is not adaptive (sluice/policy/fixed.h) is FIXED: no
 * glyph, no probing, no lock, and clear leaves it alone.
 *
 * Lock criterion (needs real evidence: a congestion signal, then a stable
 * window). The first congestion signal (429/503/timeout, or a latency knee)
 * opens a bracket: `bad` is the limit at which it struck, and from then on
 * growth is capped at bad−1. Every later congestion moves `bad` to where it
 * struck. A *stable* window is one whose calls all started under the
 * current limit, in which demand reached that limit (saturated), that saw
 * no fresh overload and no knee, and that served at least
 * min(limit, window_samples)/2 calls. The node locks when a stable window
 * runs at bad−1: the highest limit the provider took cleanly, directly below
 * the one it refused — unless the policy's verdict on that window steps
 * down (it wants to measure below first, or it is still smoothing). If the
 * last congestion was a latency knee, the policy's estimate of the
 * queue-free limit caps the ceiling as well (latency cannot tell C from a
 * little more than C as sharply as a 429 can). A node that never sees congestion locks at max_limit after a stable
 * window there. Refusals count against the limit their call *started*
 * under (sluice_sample.limit_at_start): a timeout surfaces a second after
 * its call started, when slow start has long moved on, and it is fresh as
 * long as the limit is not yet below the one it struck at; `bad` and the
 * cut go by the lowest such limit in the window. While locked, a
 * congestion signal at the ceiling is only a backoff (a transient), unless
 * its call started before the window that confirmed the ceiling (it was
 * part of that window after all: the ceiling is lowered); an overload (not
 * a knee) that strikes below the ceiling, while recovering towards it, is
 * evidence that capacity fell, and lowers the ceiling to just under where
 * it struck (a "lock" event with reason "lowered"). A lowered ceiling is a
 * guess until a stable window runs at it (another "lock" event, reason
 * "bracket"); until then an overload at the ceiling lowers it again, so a
 * cut cap is tracked down to the last limit it accepts and the 429s stop.
 * A confirmed ceiling refused again before SLUICE_DISCOVERY_FORGIVE stable
 * windows ran there since its last refusal is lowered too: a cap one below
 * it is hit only when every call is in service at once, and a clean window
 * there proves little; so is one that SLUICE_DISCOVERY_KNEE_STRIKES visits
 * in a row end in a latency knee (lowered one step: a gateway that queues
 * before it refuses, locked on one window that read within the knee by
 * chance). (The bracket stays on limits, not on the calls in
 * flight a refusal saw: a provider frees a slot a moment after the client
 * has its answer, so under load the client's count runs a call or two
 * below the provider's, and a bracket on it locks under the cap; the cut
 * goes by the count, the bisection back up by limits.) The ceiling is never raised
 * while locked: only expiry or clear reopen probing.
 *
 * What a signal means: only an OVERLOAD sample (sluice/policy.h) is
 * evidence about the caller's concurrency cap. A CENSORED sample (a call
 * its caller's deadline cut) is a latency, measured with the served calls
 * (a lower bound: see sluice_window.n_censored), never a refusal. A refusal that names
 * another cause is never a cut and counts as ignored in its window:
 *   - a rate limit (SLUICE_OUTCOME_RATE) holds new calls until the reset
 *     the provider named, and brackets probing where it struck (the limit
 *     steps under the bracket only if it stands above; at a lock, a second
 *     one within the forgiveness run lowers it by one:
 *     sluice__discovery_rate_bracket_locked);
 *   - a platform-wide overload (SLUICE_OUTCOME_PLATFORM) holds them
 *     briefly, and never moves a lock;
 *   - a quota or billing refusal (SLUICE_OUTCOME_QUOTA) moves nothing and
 *     holds nothing, since waiting does not help.
 * An OK sample that carries a hold (the provider said its request budget
 * is spent until then) paces new calls the same way. Each becomes an
 * event: "hold" (cause rate_limit or platform) when a hold starts, not for
 * every refusal of the burst that extends it, and "quota" per quota
 * refusal, told by the next sample that finds the update lock free, or by
 * poll. A provider's stated rate moves the starting point to rate ×
 * latency and brackets it there (sluice_discovery_hint_rate), as long as
 * no evidence says otherwise.
 *
 * Windows are start-time cohorts. A window measures the calls that
 * *started* during its first part, [from, until), which lasts window_span
 * mean latencies (longer at small limits, so it sees ~window_samples calls),
 * and it closes window_tail mean latencies after `until`, once nearly all of
 * them have finished. Where a sample's latency is less than its call (a
 * streamed answer's time to first token), the windows are timed by the
 * calls' mean duration, start to sample, instead: a cohort must last long
 * enough to see its calls end, whatever part of them the signal measures;
 * such a window closes as soon as every call it measures has ended, if
 * that is before its tail is out (sluice__discovery_count_down). Closing after a fixed number of *completions* instead
 * would bias every window towards the calls that happened to be short (the
 * first to finish), and a lognormal provider then looks slower in steady
 * state than it did right after each change: false latency knees. A window
 * also closes at once on a *fresh* overload — one from a call that started
 * at or after the last cut (or under a limit no higher than today's), with
 * no more calls in flight than the limit now allows, so the burst of 429s a
 * cut was already made for does not cut again: blocking threads whose 429s
 * return in a millisecond start their next call at once, after the cut, at
 * a concurrency the cut already excludes — an echo — and never later than
 * window_max_ns after it opened.
 * (A call stamped with the very tick of the cut counts as fresh. Ties need
 * a clock coarser than the calls: with a nanosecond clock they do not
 * happen. Where they do, the calls in that tick mostly started *after* the
 * cut — a pool records the sample, then releases the permit the next call
 * starts on — so treating them as stale would let more 429s through.) The
 * next window
 * opens when the previous one closes, so every window's calls started
 * under a single limit.
 *
 * Two steps per sample: record, then flush.
 *   sluice_discovery_record   the in-memory part: add the sample to the
 *       open window; the completion that finds the window due closes it
 *       under the update lock (policy update, state, limit, event ring,
 *       "persist this lock").
 *   sluice_discovery_flush    the effects, after every lock is dropped:
 *       hand out the gate grants a limit raise made (their async-waiter
 *       callbacks run here), persist the latest lock record (store save,
 *       or clear), deliver pending events to on_event in seq order.
 * sluice_discovery_on_sample does both (standalone users). A pool records,
 * releases the call's permit, then flushes, so neither store I/O nor a user
 * callback ever delays the next call in line. clear and poll do their
 * locked work, then flush.
 *
 * Who runs the effects: flush is the non-blocking combiner of
 * sluice/effects.h (its header gives the progress and ordering argument).
 * The store and the event callback run on the thread whose call caused the
 * effect, or on another thread that was already flushing that node; never
 * under a core lock, never twice at once for one node, and events in seq
 * order. No caller waits for another thread's I/O — except
 * sluice_discovery_sync, which exists to wait (tests, shutdown, sluicectl),
 * also for a store that writes on a thread of its own
 * (sluice_store_ops.sync, e.g. the state file, whose save only hands the
 * write over). Persistence is "latest wins": the flusher saves the newest
 * record, so an older save never lands after a newer clear. A store failure
 * (load, save or clear returning an error) becomes a "store" event;
 * discovery keeps serving from memory.
 *
 * Progress: record never waits for a lock: it adds to the window with
 * atomic RMWs (the accumulator of sluice/window_recorder.h), and the one completion that finds the window due tries the
 * update lock (sluice_spinlock_trylock); if another thread holds it, it
 * skips, and the next completion tries again. Everything under the update
 * lock is bounded in-memory work; the closer's only wait is for samples
 * already adding to the closing window to finish their few RMWs (a spin,
 * then sched_yield if one of them was preempted). hold_until, status and
 * the event readers are wait-free. clear and poll take the update lock
 * with sluice_spinlock_lock (slow paths, bounded waits). flush waits for
 * nobody's I/O; it takes the update lock only to copy a record to persist
 * or to record a store failure (bounded). sync blocks, parked on a futex
 * word, never spinning for the length of an I/O.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same discovery, except init/create/destroy. Store callbacks and event
 * callbacks may call any function of this node except sync (which would
 * wait for the flush they run in); gate async-waiter callbacks likewise.
 * Different nodes may share a store, which must then be thread-safe.
 *
 * In flight (events and snapshots): generation calls started and not yet
 * ended. A pool hands discovery its count after init
 * (sluice_discovery_count_in_flight; calls still waiting out a Retry-After
 * hold are not in flight); a standalone node counts the permits held on
 * its gate.
 *
 * Memory ordering: each window's counters live in the two-buffer
 * accumulator of sluice/window_recorder.h, whose Dekker handshake lands a sample
 * whole in one window. Windows are named by a sequence number, published
 * with release once the new window is set up and read with acquire by a
 * completion that tests whether the window is due, so it never closes a
 * window it did not see due (with a coarse clock, two windows can open in
 * one tick). The update lock (acquire/release) orders each update after
 * the previous one, so the policy, the bracket and the lock record need no
 * atomics of their own. Fields that readers outside the lock see (limit,
 * state, ceiling, expiry, hold, window bounds, last cut) are relaxed
 * atomics: a status snapshot is a set of recent values, not one instant,
 * and a completion that reads stale window bounds merely counts or skips
 * one sample. The gate publishes limit changes with its own (seq_cst)
 * protocol; the grants a raise makes are handed out after the lock
 * (sluice_gate_set_limit_collect). Effects reach the flusher through
 * sluice/effects.h's handshake, posted before the lock is dropped.
 *
 * Time: the discovery clock (struct sluice_clock, monotonic) times windows,
 * holds and events; the wall clock (ns since the Unix epoch) stamps lock
 * expiry, which the store persists as epoch seconds. Both default to the
 * real clocks; tests pass virtual ones.
 *
 * Allocation: only in sluice_discovery_create (through the allocator hook);
 * sluice_discovery_init uses caller storage for the event ring.
 *
 * Why one header of this size: what is left here is one state machine
 * (probing, backoff, locked; the bracket, the strikes, holds and hints)
 * whose every transition runs under one update lock on one struct, plus
 * its description and status view; the accumulator (sluice/window_recorder.h) and
 * the effects combiner (sluice/effects.h) are already apart. Nearly 500
 * of its lines are comments, 200 of them this one: the manual of the lock
 * criterion and of what each signal means, beside the code it governs.
 */
#ifndef SLUICE_DISCOVERY_H
#define SLUICE_DISCOVERY_H

#include "effects.h"
#include "events.h"
#include "gate.h"
#include "policy.h"
#include "policy/discover.h"
#include "store.h"
#include "time.h"
#include "window_recorder.h"

#ifdef __cplusplus
static_assert(SLUICE_POLICY_LIMIT_MAX == SLUICE_GATE_LIMIT_MAX, "policy and gate limits agree");
#else
_Static_assert(SLUICE_POLICY_LIMIT_MAX == SLUICE_GATE_LIMIT_MAX, "policy and gate limits agree");
#endif

enum sluice_discovery_state {
    SLUICE_DISCOVERY_PROBING = 0,
    SLUICE_DISCOVERY_BACKOFF,
    SLUICE_DISCOVERY_LOCKED,
    SLUICE_DISCOVERY_FIXED,
};

/* The status-line glyph: "📈", "🌧️", "🔒"; "" for fixed nodes. */
SLUICE_INLINE const char *sluice_discovery_state_glyph(enum sluice_discovery_state s)
{
    switch (s) {
    case SLUICE_DISCOVERY_PROBING:
        return "\xF0\x9F\x93\x88"; /* U+1F4C8 */
    case SLUICE_DISCOVERY_BACKOFF:
        return "\xF0\x9F\x8C\xA7\xEF\xB8\x8F"; /* U+1F327 U+FE0F */
    case SLUICE_DISCOVERY_LOCKED:
        return "\xF0\x9F\x94\x92"; /* U+1F512 */
    case SLUICE_DISCOVERY_FIXED:
        break;
    }
    return "";
}

SLUICE_INLINE const char *sluice_discovery_state_name(enum sluice_discovery_state s)
{
    switch (s) {
    case SLUICE_DISCOVERY_PROBING:
        return "probing";
    case SLUICE_DISCOVERY_BACKOFF:
        return "backoff";
    case SLUICE_DISCOVERY_LOCKED:
        return "locked";
    case SLUICE_DISCOVERY_FIXED:
        break;
    }
    return "fixed";
}

/* ---- configuration --------------------------------------------------------- */

/* Bounds that keep every `now + span` in int64 ns (and epoch seconds) finite. */
#define SLUICE_DISCOVERY_TTL_MAX_S (INT64_C(10) * 366 * 86400) /* ten years */
#define SLUICE_DISCOVERY_WINDOW_MAX_NS (INT64_C(86400) * SLUICE_NS_PER_SEC) /* a day */
#define SLUICE_DISCOVERY_EVENTS_MAX (UINT32_C(1) << 20)
#define SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX (UINT32_C(1) << 16)
#define SLUICE_DISCOVERY_SPAN_MAX 1000.0 /* mean latencies, for window_span and window_tail */
/* A normal's mean absolute deviation per standard deviation: sqrt(2/π). */
#define SLUICE__SD_TO_MAD 0.7978845608028654
/* A latency longer than this counts as this long (sums stay far from overflow). */
#define SLUICE_DISCOVERY_LATENCY_MAX_NS SLUICE_DISCOVERY_WINDOW_MAX_NS
/* Clock skew a restored lock's locked_at_s may show before it is called invalid. */
#define SLUICE_DISCOVERY_SKEW_S 60
/* Stable windows at a locked ceiling that forgive one refusal there: a cap a
 * count-race or a neighbour's burst touched once is kept; a second refusal
 * within this run of windows lowers it (a lock is held for a day). */
#define SLUICE_DISCOVERY_FORGIVE 8
/* Latency knees at a locked ceiling, with fewer than SLUICE_DISCOVERY_FORGIVE
 * stable windows there between them, that lower it by one. A knee is noisier
 * than a refusal, so it takes more of them; but a ceiling that every visit
 * ends in a knee is one the provider queues at (a gateway that queues, then
 * refuses, locked on one lucky window), and would otherwise be held, and
 * backed off from every second, for a day. */
#define SLUICE_DISCOVERY_KNEE_STRIKES 4
/* The share of rate × latency a provider's hint starts (and brackets) at: one
 * window's mean latency is a sample, and on the simulator its error reaches
 * 12 %; at the full product a rate refuses ~10 % of calls, at 0.9 of it
 * none (tests/sim/dialects.c). */
#define SLUICE_DISCOVERY_HINT_SHARE 0.9
/* Calls whose latencies a hint averages before it applies: one lognormal
 * call is often a fast one (on the simulator, a fifth of first calls read
 * R·L 30 % low); four halve the error, and arrive within one round trip of
 * the jumpstart's calls. */
#define SLUICE_DISCOVERY_HINT_CALLS 4u

/* What each field of struct sluice_discovery_desc left at zero becomes. */
#define SLUICE_DISCOVERY_JUMPSTART_DEFAULT UINT32_C(5)
#define SLUICE_DISCOVERY_MIN_LIMIT_DEFAULT UINT32_C(1)
#define SLUICE_DISCOVERY_MAX_LIMIT_DEFAULT UINT32_C(1024)
#define SLUICE_DISCOVERY_LOCK_TTL_S_DEFAULT INT64_C(86400) /* a day */
#define SLUICE_DISCOVERY_WINDOW_MIN_NS_DEFAULT (50 * SLUICE_NS_PER_MS)
#define SLUICE_DISCOVERY_WINDOW_MAX_NS_DEFAULT (300 * SLUICE_NS_PER_SEC)
#define SLUICE_DISCOVERY_WINDOW_SAMPLES_DEFAULT UINT32_C(16)
#define SLUICE_DISCOVERY_WINDOW_SPAN_DEFAULT 2.0 /* mean latencies */
#define SLUICE_DISCOVERY_WINDOW_TAIL_DEFAULT 2.0 /* mean latencies */
#define SLUICE_DISCOVERY_RETRY_AFTER_MAX_NS_DEFAULT (60 * SLUICE_NS_PER_SEC)
#define SLUICE_DISCOVERY_EVENTS_DEFAULT UINT32_C(256)

struct sluice_discovery_desc {
    const char *node_id;          /* required; copied (at most SLUICE_NODE_ID_MAX-1 bytes),
                                     e.g. "cloud:default_ollama" */
    struct sluice_gate *gate;     /* required: the gate whose limit discovery drives */
    const struct sluice_policy *policy; /* a prototype, read only at init: its ops->size bytes
                                     are copied into the node, so it need not outlive the
                                     node and one prototype may seed many nodes (see
                                     sluice/policy.h); initialise it with its
                                     sluice_policy_*_init first (default: discover with
                                     default parameters) */
    uint32_t jumpstart;           /* starting limit: the provider's suggestion when known, in
                                     [min_limit, max_limit] (default: 5, clamped to them) */
    uint32_t min_limit;           /* the limit never falls below this, at most max_limit
                                     (default: 1) */
    uint32_t max_limit;           /* ... nor rises above this, at most SLUICE_GATE_LIMIT_MAX
                                     (default: 1024) */
    int64_t lock_ttl_s;           /* how long a discovered ceiling stays locked, in
                                     [0, SLUICE_DISCOVERY_TTL_MAX_S] (default: 86400, i.e. 24 h);
                                     a restored lock never lasts longer than this from now */
    int64_t window_min_ns;        /* a window's start period lasts at least this, in
                                     [0, window_max_ns] (default: 50 ms) */
    int64_t window_max_ns;        /* a window closes at this age whatever it holds, in
                                     [0, SLUICE_DISCOVERY_WINDOW_MAX_NS] (default: 300 s) */
    uint32_t window_samples;      /* calls a window aims to measure when the limit is smaller,
                                     at most SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX (default: 16) */
    double window_span;           /* mean latencies a window's start period lasts, finite, in
                                     (0, SLUICE_DISCOVERY_SPAN_MAX] (default: 0 = 2) */
    double window_tail;           /* mean latencies a window then waits for its slowest calls,
                                     finite, in (0, SLUICE_DISCOVERY_SPAN_MAX] (default: 0 = 2) */
    int64_t retry_after_max_ns;   /* Retry-After is honoured up to this, >= 0; INT64_MAX
                                     honours any (default: 60 s) */
    uint32_t events;              /* event ring capacity, rounded up to a power of two, at most
                                     SLUICE_DISCOVERY_EVENTS_MAX (default: 256) */
    const struct sluice_store_ops *store;  /* copied (default: none: locks live in memory) */
    const struct sluice_clock *clock;      /* copied (default: CLOCK_MONOTONIC) */
    const struct sluice_clock *wall_clock; /* ns since the Unix epoch, copied
                                              (default: CLOCK_REALTIME) */
    sluice_event_fn on_event;     /* called once per event, see sluice_event_fn (default: none) */
    void *on_event_ctx;
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
    char *error;       /* receives a message naming the field when create, init or validate
                          fails (default: NULL = no message); "" on success. A pool or engine
                          checks the description it is given itself and writes to its own
                          desc's error, naming the field that holds it */
    size_t error_size; /* bytes at error, NUL included (default: 0) */
};

/* The resolved configuration (defaults applied). sluice__discovery_resolve fills it
 * from the description in this field order. */
struct sluice__discovery_cfg {
    uint32_t jumpstart, min_limit, max_limit, window_samples, events;
    int64_t lock_ttl_s, window_min_ns, window_max_ns, retry_after_max_ns;
    double window_span, window_tail;
};

/* A window_span / window_tail value: 0 (default) or finite in (0, SPAN_MAX]. NaN fails. */
SLUICE_INLINE bool sluice__discovery_span_ok(double v)
{
    return v >= 0.0 && v <= SLUICE_DISCOVERY_SPAN_MAX;
}

/* A policy prototype discovery can copy: initialised, complete, small enough. Messages
 * name the field under `root` (see sluice__discovery_resolve). */
SLUICE_INLINE int sluice__discovery_check_policy(const struct sluice_policy *p, const char *root,
                                                 char *err, size_t err_size)
{
    if (!p)
        return SLUICE_OK;
    if (!p->ops)
        return sluice__fail(err, err_size,
                            "%s.policy was never initialised: call its "
                            "sluice_policy_*_init (e.g. sluice_policy_discover_init) first",
                            root);
    if (!p->ops->reset || !p->ops->update)
        return sluice__fail(err, err_size, "%s.policy->ops needs reset and update callbacks",
                            root);
    if (p->ops->size < sizeof(struct sluice_policy) || p->ops->size > SLUICE_POLICY_STATE_MAX)
        return sluice__fail(err, err_size,
                            "%s.policy->ops->size must be sizeof the policy struct, at most "
                            "SLUICE_POLICY_STATE_MAX",
                            root);
    return SLUICE_OK;
}

/*
 * Resolve defaults and check a description. Returns SLUICE_OK or
 * SLUICE_EINVAL with a message in err (may be NULL) naming the field as
 * `<root>.<field>`: "sluice_discovery_desc" for the description itself, or
 * the path of the field that holds it ("sluice_pool_desc.discovery",
 * "backends[2].discovery", "sluice_fleet_desc"), so the caller is told
 * what it wrote.
 */
SLUICE_INLINE int sluice__discovery_resolve(const struct sluice_discovery_desc *d,
                                            struct sluice__discovery_cfg *c, const char *root,
                                            char *err, size_t err_size)
{
    if (!d)
        return sluice__fail(err, err_size, "%s is required", root);
    if (!d->node_id || !d->node_id[0])
        return sluice__fail(err, err_size, "%s.node_id is required", root);
    if (strlen(d->node_id) >= SLUICE_NODE_ID_MAX)
        return sluice__fail(err, err_size,
                            "%s.node_id is longer than SLUICE_NODE_ID_MAX-1 bytes", root);
    if (!d->gate)
        return sluice__fail(err, err_size, "%s.gate is required", root);
    if (sluice__discovery_check_policy(d->policy, root, err, err_size) != SLUICE_OK)
        return SLUICE_EINVAL;
    /* Each field as given, then defaulted where it is checked: later checks compare
     * with the resolved values. */
    struct sluice__discovery_cfg given = {
        d->jumpstart, d->min_limit, d->max_limit, d->window_samples, d->events,
        d->lock_ttl_s, d->window_min_ns, d->window_max_ns, d->retry_after_max_ns,
        d->window_span, d->window_tail};
    *c = given;
    SLUICE__DEFAULT(c->min_limit, SLUICE_DISCOVERY_MIN_LIMIT_DEFAULT);
    SLUICE__DEFAULT(c->max_limit, SLUICE_DISCOVERY_MAX_LIMIT_DEFAULT);
    if (c->max_limit > SLUICE_GATE_LIMIT_MAX)
        return sluice__fail(err, err_size, "%s.max_limit exceeds SLUICE_GATE_LIMIT_MAX", root);
    if (c->min_limit > c->max_limit)
        return sluice__fail(err, err_size,
                            "%s.min_limit exceeds max_limit (lower min_limit or raise "
                            "max_limit)",
                            root);
    /* The bounds as resolved (defaults applied) are what the caller must compare with. */
    if (d->jumpstart && (d->jumpstart < c->min_limit || d->jumpstart > c->max_limit))
        return sluice__fail(err, err_size,
                            "%s.jumpstart = %u must lie within [min_limit, max_limit] = "
                            "[%u, %u]",
                            root, (unsigned)d->jumpstart, (unsigned)c->min_limit,
                            (unsigned)c->max_limit);
    SLUICE__DEFAULT(c->jumpstart, SLUICE_DISCOVERY_JUMPSTART_DEFAULT);
    c->jumpstart = c->jumpstart < c->min_limit ? c->min_limit
                   : c->jumpstart > c->max_limit ? c->max_limit
                                                 : c->jumpstart;
    if (d->lock_ttl_s < 0 || d->lock_ttl_s > SLUICE_DISCOVERY_TTL_MAX_S)
        return sluice__fail(err, err_size,
                            "%s.lock_ttl_s must be in [0, SLUICE_DISCOVERY_TTL_MAX_S] "
                            "(ten years; 0 = 24 h)",
                            root);
    SLUICE__DEFAULT(c->lock_ttl_s, SLUICE_DISCOVERY_LOCK_TTL_S_DEFAULT);
    if (d->window_min_ns < 0 || d->window_max_ns < 0 ||
        d->window_max_ns > SLUICE_DISCOVERY_WINDOW_MAX_NS)
        return sluice__fail(err, err_size,
                            "%s.window_min_ns and window_max_ns must be in "
                            "[0, SLUICE_DISCOVERY_WINDOW_MAX_NS] (a day)",
                            root);
    SLUICE__DEFAULT(c->window_min_ns, SLUICE_DISCOVERY_WINDOW_MIN_NS_DEFAULT);
    SLUICE__DEFAULT(c->window_max_ns, SLUICE_DISCOVERY_WINDOW_MAX_NS_DEFAULT);
    if (c->window_min_ns > c->window_max_ns)
        return sluice__fail(err, err_size, "%s.window_min_ns exceeds window_max_ns", root);
    if (d->window_samples > SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX)
        return sluice__fail(err, err_size,
                            "%s.window_samples exceeds SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX", root);
    SLUICE__DEFAULT(c->window_samples, SLUICE_DISCOVERY_WINDOW_SAMPLES_DEFAULT);
    const char *bad_span = !sluice__discovery_span_ok(d->window_span)   ? "window_span"
                           : !sluice__discovery_span_ok(d->window_tail) ? "window_tail"
                                                                         : NULL;
    if (bad_span)
        return sluice__fail(err, err_size,
                            "%s.%s must be positive and finite, at most "
                            "SLUICE_DISCOVERY_SPAN_MAX (1000 mean latencies; 0 = 2)",
                            root, bad_span);
    SLUICE__DEFAULT(c->window_span, SLUICE_DISCOVERY_WINDOW_SPAN_DEFAULT);
    SLUICE__DEFAULT(c->window_tail, SLUICE_DISCOVERY_WINDOW_TAIL_DEFAULT);
    if (d->retry_after_max_ns < 0)
        return sluice__fail(err, err_size, "%s.retry_after_max_ns must not be negative", root);
    SLUICE__DEFAULT(c->retry_after_max_ns, SLUICE_DISCOVERY_RETRY_AFTER_MAX_NS_DEFAULT);
    if (d->events > SLUICE_DISCOVERY_EVENTS_MAX)
        return sluice__fail(err, err_size, "%s.events exceeds SLUICE_DISCOVERY_EVENTS_MAX", root);
    SLUICE__DEFAULT(c->events, SLUICE_DISCOVERY_EVENTS_DEFAULT);
    c->events = (uint32_t)sluice_next_pow2(c->events);
    if (d->store && (!d->store->load || !d->store->save || !d->store->clear))
        return sluice__fail(err, err_size, "%s.store needs load, save and clear callbacks", root);
    return SLUICE_OK;
}

/* Resolve a description handed to discovery's own calls: messages name
 * sluice_discovery_desc and go to its error buffer, which success empties. */
SLUICE_INLINE int sluice__discovery_resolve_own(const struct sluice_discovery_desc *d,
                                                struct sluice__discovery_cfg *c)
{
    if (!d)
        return SLUICE_EINVAL;
    if (d->error && d->error_size)
        d->error[0] = '\0';
    return sluice__discovery_resolve(d, c, "sluice_discovery_desc", d->error, d->error_size);
}

/* Check a description without creating anything: SLUICE_OK, or SLUICE_EINVAL with a
 * message naming the field in desc->error (a NULL desc has nowhere to put one). */
SLUICE_INLINE int sluice_discovery_validate(const struct sluice_discovery_desc *desc)
{
    struct sluice__discovery_cfg c;
    return sluice__discovery_resolve_own(desc, &c);
}

/* ---- the discovery object -------------------------------------------------- */

/* Refusals that name another cause than the caller's cap, each told in an event. */
enum sluice__signal {
    SLUICE__SIGNAL_RATE,     /* SLUICE_OUTCOME_RATE, or an OK sample pacing a hold */
    SLUICE__SIGNAL_PLATFORM, /* SLUICE_OUTCOME_PLATFORM */
    SLUICE__SIGNAL_QUOTA,    /* SLUICE_OUTCOME_QUOTA */
    SLUICE__SIGNALS
};

/* A provider's hint since init, clear or expiry (sluice_discovery_hint_rate). */
enum sluice__hint_state {
    SLUICE__HINT_NONE = 0,   /* none offered yet */
    SLUICE__HINT_COLLECTING, /* offers counted, fewer than SLUICE_DISCOVERY_HINT_CALLS */
    SLUICE__HINT_PENDING,    /* applied from those calls: refined at the next window close */
    SLUICE__HINT_DONE,     /* applied, or evidence came first */
};

/* judged_tag while a close runs between its flip and the new window's limit: no window's. */
#define SLUICE__MIDCLOSE UINT64_MAX

struct sluice_discovery {
    /* Completions write here: the open window's buffer and the closed one. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) struct sluice_window_recorder acc;
    /* A streamed window's calls still out once its start period ended: the window's
     * sequence number (low 32 bits) above, count + 1 below; 0 below = not yet counted
     * (sluice__discovery_count_down). */
    _Atomic(uint64_t) cohort_left;

    /* Written by the updater, read by completions and status readers. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(int64_t) cohort_from_ns; /* the window opened */
    _Atomic(int64_t) cohort_until_ns; /* calls started in [from, until) are measured */
    _Atomic(int64_t) cohort_due_ns;   /* ... and the window closes here */
    _Atomic(int64_t) last_cut_ns;     /* overloads from calls started before this are stale;
                                         INT64_MIN = no cut yet */
    _Atomic(int64_t) latency_ref_ns;  /* average of recent window means; 0 = none yet */
    _Atomic(int64_t) duration_ref_ns; /* the same of the calls' durations (start to sample);
                                         times windows with latency_ref_ns (see Windows) */
    _Atomic(int64_t) hold_until_ns;   /* no new call before this (Retry-After); 0 = none */
    _Atomic(uint32_t) hinted;         /* enum sluice__hint_state (written under the lock) */
    _Atomic(uint32_t) signals[SLUICE__SIGNALS]; /* refusals of another cause not yet told in an
                                         event, by enum sluice__signal */
    _Atomic(uint32_t) rate_struck;    /* lowest limit a rate refusal not yet told started
                                         under; UINT32_MAX = none */
    _Atomic(uint64_t) window_seq;     /* windows opened so far: names the open window
                                         (bumped, release, once it is fully set up) */
    _Atomic(uint64_t) judged_tag;     /* the recorder tag of the open window once its limit
                                         and last cut are in place (release); SLUICE__MIDCLOSE
                                         from a close's flip until then: what a refusal's
                                         freshness was judged against (on_sample) */
    _Atomic(uint32_t) limit;
    _Atomic(uint32_t) ceiling;       /* locked ceiling; 0 = not locked */
    _Atomic(int64_t) lock_expires_s; /* wall clock; 0 = not locked */
    _Atomic(int) state;              /* enum sluice_discovery_state */
    /* Calls in flight, for events and snapshots: a pool sets it after init to its
     * count of calls started and not yet ended; NULL = the gate's permits held. */
    const _Atomic(uint32_t) *in_flight_src;
    /* Of those, the calls whose sample is already in (a pool's lingering permits); NULL =
     * none. */
    const _Atomic(uint32_t) *lingering_src;

    /* Effects, handed from the update lock to the flusher (sluice/effects.h). */
    struct sluice_effects fx;

    /* Only under `lock`. */
    sluice_spinlock lock;
    bool congested;         /* a congestion signal (or a provider's hint) opened the bracket */
    bool bad_by_latency;    /* the last congestion before the lock was a latency knee */
    bool refusal_lock;      /* the ceiling is a refusal bracket's: latency never judged it */
    double hint_rate;       /* the hint's rate, calls per second */
    uint32_t hint_bad;      /* the bracket the hint set (another means evidence moved it) */
    uint32_t hint_calls;    /* offers counted so far, and their latencies' sum */
    int64_t hint_sum_ns;
    enum sluice_cause hint_source;
    bool confirmed;         /* a stable window ran at the locked ceiling */
    int64_t confirmed_ns;   /* when it did: a refusal at the ceiling from a call started
                               earlier was part of that window after all (a late timeout) */
    uint32_t bad;           /* the limit at which the last congestion struck */
    uint32_t strikes;       /* refusals at the confirmed ceiling not yet forgiven */
    uint32_t knee_strikes;  /* latency knees at the ceiling not yet forgiven */
    uint32_t clean_run;     /* stable windows at the ceiling since the last of them */
    uint32_t served_before; /* the last window's served_in_flight */
    bool ref_guessed;       /* latency_ref_ns is still the first latency's guess (doubled):
                               the open window is the first, and has no previous mean */
    uint32_t knee_estimate; /* the policy's queue-free estimate at the last knee; 0 = none */
    union {
        max_align_t align;
        unsigned char bytes[SLUICE_POLICY_STATE_MAX];
    } policy; /* this node's copy of the policy (see sluice__discovery_policy) */

    /* Immutable after init. */
    struct sluice__discovery_cfg cfg;
    char node[SLUICE_NODE_ID_MAX];
    struct sluice_gate *gate;
    struct sluice_event_ring events;
    struct sluice_clock clock, wall_clock;
    struct sluice_store_ops store;
    bool has_store, fixed;
    sluice_event_fn on_event;
    void *on_event_ctx;
    struct sluice_allocator allocator;
    bool owns_memory;
};

/* The node's own policy state (a copy of the description's prototype). */
SLUICE_INLINE struct sluice_policy *sluice__discovery_policy(struct sluice_discovery *d)
{
    return (struct sluice_policy *)(void *)d->policy.bytes;
}

SLUICE_INLINE int64_t sluice__wall_ns(const struct sluice_clock *wall)
{
    if (wall->now_ns)
        return wall->now_ns(wall->ctx);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return sluice_timespec_ns(&ts);
}

SLUICE_INLINE int64_t sluice__discovery_wall_s(const struct sluice_discovery *d)
{
    return sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_SEC;
}

SLUICE_INLINE enum sluice_discovery_state sluice__discovery_state(const struct sluice_discovery *d)
{
    return (enum sluice_discovery_state)atomic_load_explicit(
        &((struct sluice_discovery *)d)->state, SLUICE_RELAXED);
}

SLUICE_INLINE void sluice__discovery_set_state(struct sluice_discovery *d,
                                               enum sluice_discovery_state s)
{
    atomic_store_explicit(&d->state, (int)s, SLUICE_RELAXED);
}

/* Calls in flight (see the header comment). */
SLUICE_INLINE uint32_t sluice__discovery_in_flight(const struct sluice_discovery *d)
{
    if (d->in_flight_src)
        return atomic_load_explicit(d->in_flight_src, SLUICE_RELAXED);
    return sluice_gate_stats(d->gate).in_flight;
}

/*
 * Count the calls in flight (events, snapshots) from `src` from now on,
 * instead of the permits held on the gate: a pool points it at its count of
 * calls started and not yet ended, which also covers a call that lingers
 * after its caller gave up (sluice/pool_linger.h). `src` must outlive the node;
 * NULL goes back to the gate's count. Call after init, before any other
 * thread uses the node.
 */
SLUICE_INLINE void sluice_discovery_count_in_flight(struct sluice_discovery *d,
                                                    const _Atomic(uint32_t) *src)
{
    d->in_flight_src = src;
}

/*
 * Of the calls in flight, count those whose sample is already in from `src`:
 * a pool's lingering permits (sluice/pool_linger.h), still in flight for the
 * provider, never reported again. A streamed window that counts its calls
 * still out leaves them out (sluice__discovery_count_down); without it, a
 * window with a lingering permit waits out its whole tail. `src` must be
 * decremented before the in-flight count is, and must outlive the node;
 * NULL = none. Call after init, before any other thread uses the node.
 */
SLUICE_INLINE void sluice_discovery_count_lingering(struct sluice_discovery *d,
                                                    const _Atomic(uint32_t) *src)
{
    d->lingering_src = src;
}

/* Of the calls in flight, those whose sample is already in (sluice_discovery_count_lingering). */
SLUICE_INLINE uint32_t sluice__discovery_lingering(const struct sluice_discovery *d)
{
    return d->lingering_src ? atomic_load_explicit(d->lingering_src, SLUICE_RELAXED) : 0u;
}

/* Calls in flight that will still report a sample: in flight, less those lingering (read
 * after, so a release between the two reads counts a call too many, never too few). */
SLUICE_INLINE uint32_t sluice__discovery_reporting(const struct sluice_discovery *d)
{
    uint32_t n = sluice__discovery_in_flight(d);
    uint32_t done = sluice__discovery_lingering(d);
    return n > done ? n - done : 0u;
}

/* Record an event in the ring for the flusher to deliver. Also during init. */
SLUICE_INLINE void sluice__discovery_emit_locked(struct sluice_discovery *d, int64_t now,
                                                 enum sluice_event_kind kind, enum sluice_cause cause,
                                                 uint32_t old_limit, uint32_t new_limit)
{
    struct sluice_event ev;
    memset(&ev, 0, sizeof ev);
    ev.t_ns = now;
    ev.wall_ms = sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_MS;
    ev.kind = kind;
    ev.cause = cause;
    ev.old_limit = old_limit;
    ev.new_limit = new_limit;
    ev.in_flight = sluice__discovery_in_flight(d);
    ev.ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    sluice_event_ring_push(&d->events, &ev);
    sluice_effects_mark_locked(&d->fx);
}

SLUICE_INLINE void sluice__discovery_unlock(struct sluice_discovery *d)
{
    sluice_effects_post_locked(&d->fx);
    sluice_spinlock_unlock(&d->lock);
}

/* Move the gate's limit and start a new operating point. The waiters a raise
 * grants are handed out by the next flush. Also during init. */
SLUICE_INLINE void sluice__discovery_set_limit_locked(struct sluice_discovery *d, uint32_t next,
                                                      int64_t now)
{
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    if (next == old)
        return;
    struct sluice_gate_node *granted = sluice_gate_set_limit_collect(d->gate, next);
    if (granted)
        sluice_effects_stash_grants_locked(&d->fx, granted);
    atomic_store_explicit(&d->limit, next, SLUICE_RELAXED);
    if (next < old)
        atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
}

SLUICE_INLINE uint32_t sluice__discovery_clamp(const struct sluice_discovery *d, uint32_t v)
{
    return v < d->cfg.min_limit ? d->cfg.min_limit : v > d->cfg.max_limit ? d->cfg.max_limit : v;
}

/* Ask the flusher to persist `ceiling` (0: clear the stored record). */
SLUICE_INLINE void sluice__discovery_persist_locked(struct sluice_discovery *d, uint32_t ceiling,
                                                    int64_t expires_s, int64_t locked_at_s)
{
    if (!d->has_store)
        return;
    struct sluice_lock_record r;
    memset(&r, 0, sizeof r);
    r.ceiling = ceiling;
    r.expires_s = expires_s;
    r.locked_at_s = locked_at_s;
    const char *name = sluice__discovery_policy(d)->ops->name;
    if (ceiling && name)
        strncpy(r.policy, name, sizeof r.policy - 1);
    sluice_effects_set_record_locked(&d->fx, &r);
}

/* Record a lock at `ceiling` (a new one, or a lower one) and have it persisted. */
SLUICE_INLINE void sluice__discovery_record_lock_locked(struct sluice_discovery *d,
                                                        uint32_t ceiling)
{
    int64_t now_s = sluice__discovery_wall_s(d);
    int64_t expires_s = now_s + d->cfg.lock_ttl_s;
    atomic_store_explicit(&d->ceiling, ceiling, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, expires_s, SLUICE_RELAXED);
    sluice__discovery_persist_locked(d, ceiling, expires_s, now_s);
}

/* Forget the bracket and any lock (expiry, clear). */
SLUICE_INLINE void sluice__discovery_forget_locked(struct sluice_discovery *d)
{
    atomic_store_explicit(&d->ceiling, 0u, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, 0, SLUICE_RELAXED);
    d->congested = false;
    d->bad_by_latency = d->refusal_lock = false;
    d->confirmed = false;
    d->confirmed_ns = INT64_MIN;
    d->strikes = d->knee_strikes = d->clean_run = 0;
    d->served_before = 0;
    d->bad = 0;
    d->knee_estimate = 0;
    atomic_store_explicit(&d->hinted, SLUICE__HINT_NONE, SLUICE_RELAXED);
}

/* Lock expiry by the wall clock: probing resumes from the current limit. */
SLUICE_INLINE void sluice__discovery_check_expiry_locked(struct sluice_discovery *d, int64_t now)
{
    int64_t expires = atomic_load_explicit(&d->lock_expires_s, SLUICE_RELAXED);
    if (!expires || sluice__discovery_wall_s(d) < expires)
        return;
    sluice__discovery_forget_locked(d);
    if (sluice__discovery_state(d) == SLUICE_DISCOVERY_LOCKED)
        sluice__discovery_set_state(d, SLUICE_DISCOVERY_PROBING);
    uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_emit_locked(d, now, SLUICE_EVENT_EXPIRY, SLUICE_CAUSE_TTL, limit, limit);
}

/*
 * Schedule the window opening at `from`: its start period lasts
 * window_span mean latencies (stretched at small limits to reach
 * window_samples calls), then it waits window_tail mean latencies for
 * stragglers. With no latency known yet, the first ok sample schedules it
 * (see record). Saturating: a huge latency means a window as long as
 * window_max_ns allows, never one that wraps into the past.
 */
SLUICE_INLINE void sluice__discovery_schedule(struct sluice_discovery *d, int64_t from, int64_t ref)
{
    int64_t until = INT64_MAX, due = sluice_add_ns(from, d->cfg.window_max_ns);
    if (ref > 0) {
        uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
        double stretch = limit && limit * d->cfg.window_span < d->cfg.window_samples
                             ? (double)d->cfg.window_samples / (double)limit
                             : d->cfg.window_span;
        int64_t span = sluice__sat_i64((double)ref * stretch);
        until = sluice_add_ns(from, span > d->cfg.window_min_ns ? span : d->cfg.window_min_ns);
        int64_t wait = sluice_add_ns(until, sluice__sat_i64((double)ref * d->cfg.window_tail));
        if (wait < due)
            due = wait;
    }
    atomic_store_explicit(&d->cohort_until_ns, until, SLUICE_RELAXED);
    atomic_store_explicit(&d->cohort_due_ns, due, SLUICE_RELAXED);
}

/* *ref = floor((*ref + mean) / 2) without the overflow of the sum (both >= 0); mean alone
 * while *ref is 0. */
SLUICE_INLINE void sluice__discovery_average_locked(_Atomic(int64_t) *ref, int64_t mean)
{
    int64_t r = atomic_load_explicit(ref, SLUICE_RELAXED);
    atomic_store_explicit(ref, r ? r / 2 + mean / 2 + (r % 2 + mean % 2) / 2 : mean,
                          SLUICE_RELAXED);
}

/* What times a window: the mean latency, or the calls' mean duration where it is longer. */
SLUICE_INLINE int64_t sluice__discovery_timing_ref(const struct sluice_discovery *d)
{
    int64_t latency = atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED);
    int64_t duration = atomic_load_explicit(&d->duration_ref_ns, SLUICE_RELAXED);
    return duration > latency ? duration : latency;
}

/* Take the closing window's totals and open the next one at `now` (the caller
 * then schedules it and publishes it with sluice__discovery_opened_locked). */
SLUICE_INLINE struct sluice_window sluice__discovery_take_locked(struct sluice_discovery *d,
                                                                 int64_t now)
{
    atomic_store_explicit(&d->judged_tag, SLUICE__MIDCLOSE, SLUICE_SEQ_CST);
    struct sluice_window_totals t = sluice_window_recorder_close(&d->acc);
    struct sluice_window w;
    memset(&w, 0, sizeof w);
    w.start_ns = atomic_exchange_explicit(&d->cohort_from_ns, now, SLUICE_RELAXED);
    w.end_ns = now;
    w.limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    w.n_ok = t.n_ok;
    w.n_censored = t.n_censored;
    w.n_overload = t.n_overload;
    w.n_fresh_overload = t.n_fresh;
    w.n_ignore = t.n_ignore;
    w.n_served = t.n_ok + t.n_ok_other;
    w.max_in_flight = t.max_in_flight;
    w.overload_limit = t.overload_limit;
    w.overload_start_ns = t.overload_start_ns;
    w.overload_latency_ns = t.overload_latency_ns;
    w.overload_in_flight = t.overload_in_flight;
    w.refused_in_flight = t.refused_in_flight;
    w.served_in_flight = t.served_in_flight > d->served_before ? t.served_in_flight : d->served_before;
    d->served_before = t.served_in_flight;
    w.retry_after_ns = t.retry_after_ns;
    if (w.n_ok) {
        w.latency_mean_ns = t.latency_sum_ns / w.n_ok;
        w.duration_mean_ns = t.duration_sum_ns / w.n_ok;
        w.latency_mad_ns = t.latency_dev_ns / w.n_ok;
        w.latency_min_ns = t.latency_min_ns == INT64_MAX ? 0 : t.latency_min_ns;
        struct sluice_window_line line = sluice_window_totals_line(&t);
        w.in_flight_mean = line.in_flight_mean;
        w.latency_per_call_ns = line.slope_ns;
        w.latency_per_call_se_ns = line.slope_se_ns;
        /* The first window's calls deviated from a guess (twice the first latency), not
         * from a mean: that distance is no noise. Its noise is its calls' spread about
         * their own mean, as the mean absolute deviation a normal with that σ has. (The
         * guess read a constant 100 ms provider as cv² 1.5, which the policy's average
         * takes ten windows to forget: slow start doubted levels that had not moved, and
         * a knee at 2.6 times the latency took a second window to leave the noise.) */
        if (d->ref_guessed)
            w.latency_mad_ns = (int64_t)(line.latency_sd_ns * SLUICE__SD_TO_MAD);
        d->ref_guessed = false;
        sluice__discovery_average_locked(&d->latency_ref_ns, w.latency_mean_ns);
        sluice__discovery_average_locked(&d->duration_ref_ns, w.duration_mean_ns);
    }
    /* "Reached the limit", with 1/8 slack: arrivals are bursty and the count
     * is read at each call's start, not continuously. */
    w.saturated = w.n_ok && w.max_in_flight >= w.limit - w.limit / 8;
    w.lingering = sluice__discovery_lingering(d);
    w.reporting = sluice__discovery_reporting(d);
    if (d->congested)
        w.probe_cap = d->bad > 1 ? d->bad - 1 : 1;
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    if (ceiling && (!w.probe_cap || ceiling < w.probe_cap))
        w.probe_cap = ceiling;
    return w;
}

/* The window opened by the last take is fully set up (buffer, bounds, due time):
 * publish its sequence number. A completion that reads it (acquire) sees all of
 * that, so it never judges the new window by the old one's numbers. */
SLUICE_INLINE void sluice__discovery_opened_locked(struct sluice_discovery *d)
{
    atomic_store_explicit(&d->judged_tag, sluice_window_recorder_open_tag(&d->acc),
                          SLUICE_RELEASE);
    atomic_fetch_add_explicit(&d->window_seq, 1u, SLUICE_RELEASE);
}

/* A congestion verdict: cut, move the bracket or lower the lock. */
SLUICE_INLINE void sluice__discovery_congestion_locked(struct sluice_discovery *d, int64_t now,
                                                       const struct sluice_window *w,
                                                       const struct sluice_verdict *v, uint32_t old)
{
    /* Where it struck: the limit the refused calls started under, which a
     * late refusal (a timeout) reports after the limit moved on. (The calls
     * in flight a refusal saw set the cut, not the bracket: see "Lock
     * criterion".) */
    uint32_t struck = w->overload_limit && w->overload_limit < old ? w->overload_limit : old;
    if (v->cause == SLUICE_CAUSE_LATENCY)
        struck = old;
    uint32_t next = v->limit < struck ? v->limit : (struck > 1 ? struck - 1 : 1);
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    uint32_t lowered = 0;
    /* A refusal at the ceiling from a call that started before the window that
     * confirmed it was one of that window's calls: the confirmation was early. */
    bool unconfirmed = !d->confirmed || w->overload_start_ns < d->confirmed_ns;
    bool refused = v->cause != SLUICE_CAUSE_LATENCY &&
                   (struck < ceiling || (struck == ceiling && unconfirmed));
    /* A refusal at a confirmed ceiling is a transient once; a second one
     * before SLUICE_DISCOVERY_FORGIVE stable windows ran there says the
     * ceiling is refused some of the time (a cap one below, hit whenever
     * every call is in service at once), and lowers it. */
    bool at_ceiling = ceiling && v->cause != SLUICE_CAUSE_LATENCY && struck == ceiling;
    if (at_ceiling && !refused && d->strikes)
        refused = true;
    else if (at_ceiling && !refused) {
        d->strikes++;
        d->clean_run = 0;
    }
    /* Only a refusal bracket's ceiling: where a knee made the bracket, latency
     * already judged the ceiling, and a provider that slows with every call
     * (no queue, no cap) knees at every level and would be walked down to 1. */
    bool knee_at_ceiling = ceiling && d->refusal_lock && v->cause == SLUICE_CAUSE_LATENCY &&
                           old == ceiling;
    if (knee_at_ceiling) {
        d->clean_run = 0;
        if (++d->knee_strikes >= SLUICE_DISCOVERY_KNEE_STRIKES)
            refused = true;
    }
    if (ceiling && refused) {
        d->strikes = d->knee_strikes = d->clean_run = 0;
        /* Refused below the lock while recovering towards it: capacity fell.
         * (Latency lowers a lock only by repetition at the ceiling, one step
         * at a time, never to the knee's estimate: it is noisier, and a
         * provider that is merely slow today would ratchet it down.) */
        lowered = struck > 1 ? struck - 1 : 1;
        if (v->estimate && v->estimate < lowered && !knee_at_ceiling)
            lowered = v->estimate;
        lowered = sluice__discovery_clamp(d, lowered);
        sluice__discovery_record_lock_locked(d, lowered);
        d->confirmed = false;
        if (next > lowered)
            next = lowered;
    } else if (!ceiling) {
        d->congested = true;
        d->bad_by_latency = v->cause == SLUICE_CAUSE_LATENCY;
        d->bad = struck;
        d->knee_estimate = v->cause == SLUICE_CAUSE_LATENCY ? v->estimate : 0;
    }
    next = sluice__discovery_clamp(d, next);
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_BACKOFF);
    sluice__discovery_set_limit_locked(d, next, now);
    atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
    sluice__discovery_emit_locked(d, now, SLUICE_EVENT_BACKOFF, v->cause, old, next);
    if (lowered)
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_LOCK, SLUICE_CAUSE_LOWERED, old, next);
}

/* A window that held all calls at the limit, cleanly, with enough of them. */
SLUICE_INLINE bool sluice__discovery_stable(const struct sluice_discovery *d,
                                            const struct sluice_window *w)
{
    uint32_t need = (w->limit < d->cfg.window_samples ? w->limit : d->cfg.window_samples) / 2;
    return w->saturated && w->n_fresh_overload == 0 && w->n_ok >= (need ? need : 1);
}

/* A healthy verdict: recover, lock, or grow within the cap. */
SLUICE_INLINE void sluice__discovery_healthy_locked(struct sluice_discovery *d, int64_t now,
                                                    const struct sluice_window *w,
                                                    const struct sluice_verdict *v, uint32_t old)
{
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    if (sluice__discovery_state(d) == SLUICE_DISCOVERY_BACKOFF) {
        if (w->n_ok && w->n_fresh_overload == 0 &&
            now >= atomic_load_explicit(&d->hold_until_ns, SLUICE_RELAXED)) {
            sluice__discovery_set_state(d, ceiling ? SLUICE_DISCOVERY_LOCKED
                                                   : SLUICE_DISCOVERY_PROBING);
            sluice__discovery_emit_locked(d, now, SLUICE_EVENT_RECOVERY, SLUICE_CAUSE_HEALTHY, old,
                                          old);
        }
        return; /* the window that ends a backoff grows nothing */
    }
    if (ceiling && (d->strikes || d->knee_strikes) && old == ceiling &&
        sluice__discovery_stable(d, w) && ++d->clean_run >= SLUICE_DISCOVERY_FORGIVE)
        d->strikes = d->knee_strikes = d->clean_run = 0;
    if (ceiling && !d->confirmed && old == ceiling && sluice__discovery_stable(d, w)) {
        d->confirmed = true;
        d->confirmed_ns = now;
        sluice__discovery_record_lock_locked(d, ceiling); /* re-persist with a fresh expiry */
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_LOCK, SLUICE_CAUSE_BRACKET, old, old);
        return;
    }
    /* A policy that asks to step down (to measure below, or smoothing) is
     * not settled: no lock on this window. */
    if (!ceiling && sluice__discovery_stable(d, w) && v->limit >= old &&
        (d->congested ? old + 1 >= d->bad : old >= d->cfg.max_limit)) {
        uint32_t at = old;
        if (d->congested && d->knee_estimate && d->knee_estimate < at)
            at = sluice__discovery_clamp(d, d->knee_estimate);
        sluice__discovery_record_lock_locked(d, at);
        d->refusal_lock = d->congested && !d->bad_by_latency;
        d->confirmed = at == old;
        d->confirmed_ns = now;
        sluice__discovery_set_state(d, SLUICE_DISCOVERY_LOCKED);
        sluice__discovery_set_limit_locked(d, at, now);
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_LOCK,
                                      d->congested ? SLUICE_CAUSE_BRACKET : SLUICE_CAUSE_MAX_LIMIT,
                                      old, at);
        return;
    }
    uint32_t cap = ceiling ? ceiling : d->congested ? (d->bad > 1 ? d->bad - 1 : 1)
                                                    : d->cfg.max_limit;
    uint32_t next = sluice__discovery_clamp(d, v->limit);
    if (next > old && next > cap)
        next = cap > old ? cap : old;
    if (next == old)
        return;
    sluice__discovery_set_limit_locked(d, next, now);
    /* A policy may also step down without calling it congestion (a smoothing controller, a
     * re-measure): its cause says why; CEILING only when the clamp itself lowered it. */
    sluice__discovery_emit_locked(d, now, next > old ? SLUICE_EVENT_PROBE : SLUICE_EVENT_BACKOFF,
                                  v->cause != SLUICE_CAUSE_NONE ? v->cause : SLUICE_CAUSE_CEILING, old,
                                  next);
}

SLUICE_INLINE void sluice__discovery_restart_locked(struct sluice_discovery *d, int64_t now);

/*
 * Start from a provider's hint: SLUICE_DISCOVERY_HINT_SHARE of rate ×
 * `latency_ns`, rounded down (one call more than the rate keeps busy
 * overdraws it every window), clamped, and bracketed there. A "hint" event
 * when the limit moves.
 */
SLUICE_INLINE void sluice__discovery_hint_at_locked(struct sluice_discovery *d, int64_t now,
                                                    int64_t latency_ns)
{
    uint32_t at = sluice__discovery_clamp(
        d, sluice__sat_u32(floor(SLUICE_DISCOVERY_HINT_SHARE * d->hint_rate *
                                 (double)latency_ns / SLUICE_NS_PER_SEC)));
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    uint32_t next = sluice__discovery_clamp(
        d, sluice_policy_reset(sluice__discovery_policy(d), at, false));
    d->congested = true; /* the bracket: the rate keeps `at` calls busy, no more */
    d->bad_by_latency = false;
    d->bad = d->hint_bad = sluice__sat_add(at, 1);
    d->knee_estimate = 0;
    sluice__discovery_set_limit_locked(d, next, now);
    sluice__discovery_restart_locked(d, now);
    if (next != old)
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_HINT, d->hint_source, old, next);
}

/*
 * At a window close, a hint taken from one call's latency is refined once
 * from the window's mean, unless evidence came since (a refusal moved the
 * bracket, a lock). True when it restarted (the window's verdict is then
 * moot).
 */
SLUICE_INLINE bool sluice__discovery_apply_hint_locked(struct sluice_discovery *d, int64_t now,
                                                       const struct sluice_window *w)
{
    if (atomic_load_explicit(&d->hinted, SLUICE_RELAXED) != SLUICE__HINT_PENDING || !w->n_ok)
        return false;
    atomic_store_explicit(&d->hinted, SLUICE__HINT_DONE, SLUICE_RELAXED);
    if (d->bad != d->hint_bad || atomic_load_explicit(&d->ceiling, SLUICE_RELAXED) ||
        sluice__discovery_state(d) != SLUICE_DISCOVERY_PROBING)
        return false;
    /* Little's law needs how long a call holds its slot: the whole call, not the time to
     * its first byte (the latency a streamed answer's sample measures). */
    sluice__discovery_hint_at_locked(d, now, w->duration_mean_ns);
    return true;
}

/* Close the open window and act on it. */
SLUICE_INLINE void sluice__discovery_close_locked(struct sluice_discovery *d, int64_t now)
{
    struct sluice_window w = sluice__discovery_take_locked(d, now);
    sluice__discovery_check_expiry_locked(d, now);
    if (sluice__discovery_apply_hint_locked(d, now, &w))
        return; /* restarted: the new window is scheduled and open */
    struct sluice_verdict v = sluice_policy_update(sluice__discovery_policy(d), &w);
    uint32_t old = w.limit;
    if (sluice_cause_is_congestion(v.cause))
        sluice__discovery_congestion_locked(d, now, &w, &v, old);
    else
        sluice__discovery_healthy_locked(d, now, &w, &v, old);
    sluice__discovery_schedule(d, now, sluice__discovery_timing_ref(d));
    sluice__discovery_opened_locked(d);
}

/*
 * A streamed window need not wait out its tail once every call it measures
 * has ended. Its tail is window_tail mean *durations* (see Windows), and a
 * streamed answer's duration is mostly its length, about the same for
 * every call: two whole streams of tail held each slow-start window of a
 * streaming service (5 calls of 0.9 s at the jumpstart) a stream longer
 * than its calls took. So, where the calls last longer than their samples
 * measure (a mean duration over SLUICE__DISCOVERY_STREAMED mean latencies),
 * the first sample after `until` counts the calls then in flight that will
 * still report (every call of the cohort still out, and older ones), less
 * its own; each later sample of a call that started before `until` takes
 * one off, and at 0 the window is due. A count that includes a call which
 * never reports (a lingering permit the node was not told of, a call that
 * started after `until`) never reaches 0: the window closes at its due time,
 * as an unstreamed one always does (its tail is in latencies, and its
 * slowest calls do take that long). Exact where the sample is recorded
 * while its call still counts as in flight (a pool decrements after
 * recording; a standalone node counts the gate's permits, so feed the
 * sample before releasing the permit); otherwise it may close with a call
 * still out. The count carries the window's sequence number,
 * so a sample that raced a close never counts against the next window.
 */
#define SLUICE__DISCOVERY_STREAMED 1.5
SLUICE_INLINE void sluice__discovery_count_down(struct sluice_discovery *d, int64_t started,
                                                int64_t now)
{
    uint64_t seq = atomic_load_explicit(&d->window_seq, SLUICE_ACQUIRE);
    int64_t until = atomic_load_explicit(&d->cohort_until_ns, SLUICE_RELAXED);
    if (now < until ||
        (double)atomic_load_explicit(&d->duration_ref_ns, SLUICE_RELAXED) <=
            SLUICE__DISCOVERY_STREAMED * (double)atomic_load_explicit(&d->latency_ref_ns,
                                                                      SLUICE_RELAXED))
        return;
    uint64_t tag = seq << 32, mine = started < until ? 1u : 0u;
    uint64_t cur = atomic_load_explicit(&d->cohort_left, SLUICE_RELAXED), next;
    do {
        uint32_t count = (uint32_t)cur;
        if ((cur >> 32) != (uint32_t)seq || !count) {
            uint32_t n = sluice__discovery_reporting(d);
            next = tag | ((n > mine ? n - mine : 0u) + 1u);
        } else if (!mine || count == 1u) {
            return;
        } else {
            next = cur - 1u;
        }
    } while (!atomic_compare_exchange_weak_explicit(&d->cohort_left, &cur, next, SLUICE_RELAXED,
                                                    SLUICE_RELAXED));
}

/* Should the open window close now? Lock-free; may be wrong by a sample. */
SLUICE_INLINE bool sluice__discovery_due(struct sluice_discovery *d, int64_t now)
{
    if (sluice_window_recorder_has_fresh(&d->acc) ||
        now >= atomic_load_explicit(&d->cohort_due_ns, SLUICE_RELAXED))
        return true;
    /* The count first: an unstreamed window never has one, and pays one load. */
    uint64_t left = atomic_load_explicit(&d->cohort_left, SLUICE_RELAXED);
    if ((uint32_t)left != 1u)
        return false;
    uint64_t seq = atomic_load_explicit(&d->window_seq, SLUICE_ACQUIRE);
    return (left >> 32) == (uint32_t)seq &&
           now >= atomic_load_explicit(&d->cohort_until_ns, SLUICE_RELAXED);
}

/* Close the window if it is due and nobody else is closing it. */
SLUICE_INLINE void sluice__discovery_maybe_close(struct sluice_discovery *d, int64_t now)
{
    /* The window is named by its sequence number, not its start time: with a
     * coarse or virtual clock two windows can open in the same tick, and a
     * completion that saw the first one due must not close the second.
     * Acquire: the due test below then reads this window's numbers, or a
     * later one's (and the check under the lock skips). */
    uint64_t seq = atomic_load_explicit(&d->window_seq, SLUICE_ACQUIRE);
    if (!sluice__discovery_due(d, now) || !sluice_spinlock_trylock(&d->lock))
        return;
    /* Read the time again under the lock, so every update's `now` is at least
     * the previous one's and window bounds never run backwards. */
    if (atomic_load_explicit(&d->window_seq, SLUICE_RELAXED) == seq)
        sluice__discovery_close_locked(d, sluice_clock_now(&d->clock));
    sluice__discovery_unlock(d);
}

/* The first latency ever seen (or since a clear) schedules the open window. */
SLUICE_INLINE void sluice__discovery_first_latency(struct sluice_discovery *d, int64_t latency_ns,
                                                   int64_t duration_ns)
{
    /* It is the fastest of the calls then in flight, so double it rather
     * than cut the window's slow calls off. A streamed call's duration gets
     * the same margin, not twice its own: what varies is mostly the wait for
     * the first token, and the rest of the stream is about as long for every
     * call (doubled, a 0.3 s first token in a 0.9 s stream held the first
     * window at the jumpstart for 7 s). Under the update lock, like every
     * other schedule, so a racing close or clear cannot interleave with it;
     * if the lock is busy the next completion schedules instead. */
    if (!sluice_spinlock_trylock(&d->lock))
        return;
    if (!atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED)) {
        int64_t guess = sluice_add_ns(latency_ns, latency_ns);
        atomic_store_explicit(&d->latency_ref_ns, guess, SLUICE_RELAXED);
        atomic_store_explicit(&d->duration_ref_ns, sluice_add_ns(duration_ns, latency_ns),
                              SLUICE_RELAXED);
        d->ref_guessed = true;
        sluice__discovery_schedule(d, atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED),
                                   sluice__discovery_timing_ref(d));
    }
    sluice__discovery_unlock(d);
}

/*
 * The hold a sample asks for ("What a signal means"): an overload's or a
 * rate limit's Retry-After (for a rate limit, the reset the provider
 * named), a platform overload's (SLUICE_PLATFORM_HOLD_NS when it names
 * none), and an OK sample's when the provider said its request budget is
 * spent until then (pacing: new calls wait for the reset instead of being
 * refused). Quota refusals and ignored calls hold nothing: waiting does not
 * help them. Clamped to retry_after_max_ns. A sample that starts a hold
 * (none was running) is noted for a "hold" event, every quota refusal for
 * a "quota" event (sluice__discovery_tell_signals).
 */
SLUICE_INLINE void sluice__discovery_hold_for(struct sluice_discovery *d,
                                              const struct sluice_sample *s, int64_t now)
{
    int64_t ask = s->retry_after_ns;
    enum sluice__signal signal = SLUICE__SIGNALS;
    switch (s->outcome) {
    case SLUICE_OUTCOME_OK:
        signal = ask > 0 ? SLUICE__SIGNAL_RATE : SLUICE__SIGNALS;
        break;
    case SLUICE_OUTCOME_RATE:
        signal = SLUICE__SIGNAL_RATE;
        break;
    case SLUICE_OUTCOME_PLATFORM:
        signal = SLUICE__SIGNAL_PLATFORM;
        if (ask <= 0)
            ask = SLUICE_PLATFORM_HOLD_NS;
        break;
    case SLUICE_OUTCOME_QUOTA:
        signal = SLUICE__SIGNAL_QUOTA;
        ask = 0;
        break;
    case SLUICE_OUTCOME_OVERLOAD:
        break;
    case SLUICE_OUTCOME_IGNORE:
    default:
        ask = 0;
        break;
    }
    bool starts = false; /* this sample opens a hold: none was running */
    if (ask > 0) {
        int64_t hold = ask < d->cfg.retry_after_max_ns ? ask : d->cfg.retry_after_max_ns;
        starts = atomic_load_explicit(&d->hold_until_ns, SLUICE_RELAXED) <= now;
        /* retry_after_max_ns may be INT64_MAX: saturate, never wrap into the past. */
        sluice__atomic_max_i64(&d->hold_until_ns, sluice_add_ns(now, hold));
    }
    /* One "hold" event per hold, not per refusal of the burst that extends it. */
    if (signal == SLUICE__SIGNAL_QUOTA || (signal != SLUICE__SIGNALS && starts))
        atomic_fetch_add_explicit(&d->signals[signal], 1u, SLUICE_RELAXED);
    if (s->outcome == SLUICE_OUTCOME_RATE && s->limit_at_start)
        sluice__atomic_min_u32(&d->rate_struck, s->limit_at_start);
}

/*
 * A rate refusal brackets the probe where it struck: the provider's budget
 * ran out with that many calls in flight, so growing past it buys only
 * refusals. No cut (the hold waits out the reset): the limit steps to just
 * under the bracket only if it already stands above. At a lock, one rate
 * refusal is forgiven (the strikes of "Lock criterion"); a second before
 * SLUICE_DISCOVERY_FORGIVE stable windows ran there says the lock overdraws
 * the rate, and lowers it by one.
 */
SLUICE_INLINE void sluice__discovery_rate_bracket_locked(struct sluice_discovery *d, int64_t now)
{
    uint32_t struck = atomic_exchange_explicit(&d->rate_struck, UINT32_MAX, SLUICE_RELAXED);
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    if (struck == UINT32_MAX || (ceiling && struck < ceiling))
        return;
    if (ceiling) {
        if (!d->strikes++) {
            d->clean_run = 0;
            return;
        }
        uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
        uint32_t lowered = sluice__discovery_clamp(d, ceiling > 1 ? ceiling - 1 : 1);
        d->strikes = d->knee_strikes = d->clean_run = 0;
        sluice__discovery_record_lock_locked(d, lowered);
        if (old > lowered)
            sluice__discovery_set_limit_locked(d, lowered, now);
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_LOCK, SLUICE_CAUSE_RATE_LIMIT, old,
                                      old > lowered ? lowered : old);
        return;
    }
    if (!d->congested || struck < d->bad) {
        d->congested = true;
        d->bad_by_latency = false;
        d->bad = struck;
        d->knee_estimate = 0;
    }
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    uint32_t next = sluice__discovery_clamp(d, d->bad > 1 ? d->bad - 1 : 1);
    if (next < old) {
        sluice__discovery_set_limit_locked(d, next, now);
        sluice__discovery_emit_locked(d, now, SLUICE_EVENT_BACKOFF, SLUICE_CAUSE_RATE_LIMIT, old,
                                      next);
    }
}

/*
 * Turn the noted signals into events: one per kind of signal per call, however
 * many refusals it covers (a burst is one piece of news). Locked work:
 * `wait` takes the update lock (slow paths), else only a free lock is taken
 * and a busy one leaves the signals for the next sample or poll. Flush
 * delivers the events.
 */
SLUICE_INLINE void sluice__discovery_tell_signals(struct sluice_discovery *d, bool wait)
{
    bool any = atomic_load_explicit(&d->rate_struck, SLUICE_RELAXED) != UINT32_MAX;
    for (int i = 0; i < SLUICE__SIGNALS; i++)
        any |= atomic_load_explicit(&d->signals[i], SLUICE_RELAXED) != 0;
    if (!any)
        return;
    if (wait)
        sluice_spinlock_lock(&d->lock);
    else if (!sluice_spinlock_trylock(&d->lock))
        return;
    static const struct {
        enum sluice_event_kind kind;
        enum sluice_cause cause;
    } told[SLUICE__SIGNALS] = {{SLUICE_EVENT_HOLD, SLUICE_CAUSE_RATE_LIMIT},
                               {SLUICE_EVENT_HOLD, SLUICE_CAUSE_PLATFORM},
                               {SLUICE_EVENT_QUOTA, SLUICE_CAUSE_QUOTA}};
    int64_t now = sluice_clock_now(&d->clock);
    uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    for (int i = 0; i < SLUICE__SIGNALS; i++)
        if (atomic_exchange_explicit(&d->signals[i], 0u, SLUICE_RELAXED))
            sluice__discovery_emit_locked(d, now, told[i].kind, told[i].cause, limit, limit);
    sluice__discovery_rate_bracket_locked(d, now);
    sluice__discovery_unlock(d);
}

/*
 * Feed one finished generation call: the in-memory half of on_sample (see
 * "Two steps per sample"). Never blocks and runs no callback and no store
 * call; the caller runs sluice_discovery_hand_out_grants and
 * sluice_discovery_flush afterwards, with no lock held (a pool, after
 * releasing the call's permit: see sluice/pool_call.h). Calls that started
 * before the last clear count for nothing; a latency beyond
 * SLUICE_DISCOVERY_LATENCY_MAX_NS counts as that much, a negative one as 0.
 * Any thread, concurrently with every other call on the node.
 */
SLUICE_INLINE void sluice_discovery_record(struct sluice_discovery *d,
                                           const struct sluice_sample *s)
{
    if (d->fixed)
        return;
    int64_t now = sluice_clock_now(&d->clock);
    int64_t latency = s->latency_ns < 0                                 ? 0
                      : s->latency_ns > SLUICE_DISCOVERY_LATENCY_MAX_NS ? SLUICE_DISCOVERY_LATENCY_MAX_NS
                                                                        : s->latency_ns;
    /* A sample may measure less than its whole call (time to first byte of a
     * streamed answer): its own start, when given, places it in its window. */
    int64_t started = s->start_ns ? s->start_ns : sluice_add_ns(now, -latency);
    bool fresh = false, measured = false;
    int64_t ref = atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED);
    sluice__discovery_hold_for(d, s, now);
    int64_t duration = now - started < latency                           ? latency
                       : now - started > SLUICE_DISCOVERY_LATENCY_MAX_NS ? SLUICE_DISCOVERY_LATENCY_MAX_NS
                                                                         : now - started;
    uint64_t judged = 0;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD) {
        /* News, not an echo ("What a refusal says"): started after the last
         * cut, or under a limit no higher than today's (a late timeout still
         * counts against the limit it started under), and with no more calls
         * in flight than the limit now allows: a refusal at a concurrency
         * already cut below repeats what the cut was made for, however soon
         * after the cut its call started. */
        judged = atomic_load_explicit(&d->judged_tag, SLUICE_ACQUIRE);
        uint32_t limit_now = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
        fresh = (started >= atomic_load_explicit(&d->last_cut_ns, SLUICE_RELAXED) ||
                 (s->limit_at_start && s->limit_at_start <= limit_now)) &&
                (!s->in_flight_at_start || s->in_flight_at_start <= limit_now);
    } else if (s->outcome == SLUICE_OUTCOME_OK || s->outcome == SLUICE_OUTCOME_CENSORED) {
        /* A censored call is measured with the served ones ("What a signal means"). */
        measured = started >= atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED) &&
                   started < atomic_load_explicit(&d->cohort_until_ns, SLUICE_RELAXED);
        if (measured && !ref)
            sluice__discovery_first_latency(d, latency, duration);
    }
    struct sluice_window_buffer *a = sluice_window_recorder_enter(&d->acc);
    bool taken = s->outcome == SLUICE_OUTCOME_OK || s->outcome == SLUICE_OUTCOME_CENSORED;
    if (taken) /* the provider took it at that concurrency (a cut call too) */
        sluice_window_buffer_add_served(a, s->in_flight_at_start);
    /* Judged by the limit and cut of another window than the one it landed in (a close
     * flipped the windows before its new limit was in place, or between the judging and
     * this enter): an echo of the burst that close answered, where the new window's numbers
     * may say so. Counted fresh there, the refusals that closed a window cut the next one
     * too, and its bracket went by that window's lower limit: beside a provider stalled
     * for 60 ms (SIGSTOP, bench/early_stalls.py) 5 of 32 blocking runs locked a cap of 24
     * at 18-22 so. */
    if (fresh && sluice_window_buffer_tag(a) != judged)
        fresh = false;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD) {
        sluice_window_buffer_add_overload(a, fresh, s->in_flight_at_start, s->limit_at_start, started,
                                          latency, s->retry_after_ns);
    } else if (measured) {
        int64_t dev = latency - (ref ? ref : latency);
        sluice_window_buffer_add_measured(a, latency, duration, dev < 0 ? -dev : dev,
                                          s->in_flight_at_start,
                                          s->outcome == SLUICE_OUTCOME_CENSORED);
    } else {
        sluice_window_buffer_add_ignored(a, taken);
    }
    sluice_window_recorder_leave(a);
    sluice__discovery_count_down(d, started, now);
    sluice__discovery_maybe_close(d, now);
    sluice__discovery_tell_signals(d, false);
}

/* A store call failed: say so in an event. Called by the flusher, outside the lock. */
SLUICE_INLINE void sluice__discovery_store_failed(struct sluice_discovery *d)
{
    sluice_spinlock_lock(&d->lock);
    uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_emit_locked(d, sluice_clock_now(&d->clock), SLUICE_EVENT_STORE,
                                  SLUICE_CAUSE_STORE_ERROR, limit, limit);
    sluice__discovery_unlock(d);
}

/* Save (or clear) the newest lock record, if it changed since the last one applied. */
SLUICE_INLINE void sluice__discovery_apply_persist(struct sluice_discovery *d)
{
    struct sluice_lock_record rec;
    if (!sluice_effects_take_record(&d->fx, &d->lock, &rec))
        return;
    int status = rec.ceiling ? d->store.save(d->store.ctx, d->node, &rec)
                             : d->store.clear(d->store.ctx, d->node);
    if (status != SLUICE_OK)
        sluice__discovery_store_failed(d);
}

/* One round of this node's effects (a sluice_effects_run_fn): persist the
 * newest lock record, then deliver the pending events to on_event. */
SLUICE_INLINE void sluice__discovery_run_effects(void *ctx)
{
    struct sluice_discovery *d = (struct sluice_discovery *)ctx;
    if (d->has_store)
        sluice__discovery_apply_persist(d);
    sluice_effects_deliver(&d->fx, &d->events, d->on_event, d->on_event_ctx);
}

/*
 * Hand out the gate grants the node's limit raises made since the last
 * flush: their sync waiters are woken, their async-waiter callbacks run on
 * this thread. Part of sluice_discovery_flush, which does it first; a pool
 * calls it on its own before the flush, so that async callbacks run only
 * after every sync waiter its call end granted is woken. Call with no lock
 * held; any thread; never blocks but for the gate's short spinlock.
 */
SLUICE_INLINE void sluice_discovery_hand_out_grants(struct sluice_discovery *d)
{
    sluice_effects_hand_out_grants(&d->fx);
}

/*
 * Apply the effects recorded so far (see "Two steps per sample" and "Who
 * runs the effects"): hand out gate grants from limit raises, then — unless
 * another thread is already doing it, which then does ours too — persist
 * the newest lock record and deliver pending events to on_event. Never
 * waits for another thread's store or callback. Call with no lock held.
 */
SLUICE_INLINE void sluice_discovery_flush(struct sluice_discovery *d)
{
    sluice_effects_flush(&d->fx, sluice__discovery_run_effects, d);
}

/*
 * Wait until every effect recorded before this call (store writes, event
 * deliveries) has been applied, running them itself when nobody else is,
 * and — for a store that writes in the background (sluice_store_ops.sync)
 * — until those writes have landed; a background write that failed
 * becomes a "store" event, delivered before this returns. Blocks: parks on
 * a futex word while another thread's store call or callback runs, and in
 * the store's sync. For tests, shutdown and tools; not from an event or
 * store callback (it would wait for itself).
 */
SLUICE_INLINE void sluice_discovery_sync(struct sluice_discovery *d)
{
    sluice_effects_sync(&d->fx, sluice__discovery_run_effects, d);
    if (d->has_store && d->store.sync && d->store.sync(d->store.ctx, d->node) != SLUICE_OK) {
        sluice__discovery_store_failed(d);
        sluice_effects_sync(&d->fx, sluice__discovery_run_effects, d);
    }
}

/*
 * Feed one finished generation call and apply its effects: record, then
 * flush (for standalone use; a pool splits the two around its permit
 * release). Never blocks on another thread; see "Progress" above.
 */
SLUICE_INLINE void sluice_discovery_on_sample(struct sluice_discovery *d,
                                              const struct sluice_sample *s)
{
    sluice_discovery_record(d, s);
    sluice_discovery_flush(d);
}

/*
 * The instant (discovery clock, ns) before which no new call may start
 * because the provider sent Retry-After; 0 or a past instant = no hold.
 * The pool checks it in call_begin.
 */
SLUICE_INLINE int64_t sluice_discovery_hold_until(const struct sluice_discovery *d)
{
    return atomic_load_explicit(&((struct sluice_discovery *)d)->hold_until_ns, SLUICE_RELAXED);
}

SLUICE_INLINE uint32_t sluice_discovery_limit(const struct sluice_discovery *d)
{
    return atomic_load_explicit(&((struct sluice_discovery *)d)->limit, SLUICE_RELAXED);
}

/* The locked ceiling; 0 = not locked (relaxed: a value, not a publication). */
SLUICE_INLINE uint32_t sluice_discovery_ceiling(const struct sluice_discovery *d)
{
    return atomic_load_explicit(&((struct sluice_discovery *)d)->ceiling, SLUICE_RELAXED);
}

/* A lock whose expiry the wall clock has passed, though no close or poll has
 * recorded it yet: readers show it as gone. */
SLUICE_INLINE bool sluice__discovery_lock_lapsed(const struct sluice_discovery *d,
                                                 int64_t lock_expires_s)
{
    return lock_expires_s && sluice__discovery_wall_s(d) >= lock_expires_s;
}

/* The node's state as status views show it (a lapsed lock reads as probing). */
SLUICE_INLINE enum sluice_discovery_state sluice_discovery_state(const struct sluice_discovery *d)
{
    enum sluice_discovery_state s = sluice__discovery_state(d);
    if (s == SLUICE_DISCOVERY_LOCKED &&
        sluice__discovery_lock_lapsed(
            d, atomic_load_explicit(&((struct sluice_discovery *)d)->lock_expires_s,
                                    SLUICE_RELAXED)))
        s = SLUICE_DISCOVERY_PROBING;
    return s;
}

/* The node's event ring, for sluice_event_ring_read / _write_json. */
SLUICE_INLINE const struct sluice_event_ring *sluice_discovery_events(const struct sluice_discovery *d)
{
    return &d->events;
}

/*
 * Apply time-based transitions without traffic: a lock that expired, a
 * window older than window_max_ns; then flush. Call from a timer if nodes
 * may sit idle.
 */
SLUICE_INLINE void sluice_discovery_poll(struct sluice_discovery *d)
{
    if (d->fixed)
        return;
    sluice_spinlock_lock(&d->lock);
    int64_t now = sluice_clock_now(&d->clock); /* under the lock: see maybe_close */
    if (sluice__discovery_due(d, now))
        sluice__discovery_close_locked(d, now);
    else
        sluice__discovery_check_expiry_locked(d, now);
    sluice__discovery_unlock(d);
    sluice__discovery_tell_signals(d, true);
    sluice_discovery_flush(d);
}

/*
 * Close the open window now, however young, and act on the policy's answer
 * at once: for a policy steered from outside the pool (a fleet's follower,
 * sluice/fleet.h), whose answer changes between the pool's own windows.
 * The window's calls count as usual; its latency statistics cover fewer
 * calls. A slow path, like poll: takes the update lock (bounded), then
 * flushes on this thread.
 */
SLUICE_INLINE void sluice_discovery_update_now(struct sluice_discovery *d)
{
    if (d->fixed)
        return;
    sluice_spinlock_lock(&d->lock);
    /* now under the lock: see maybe_close */
    sluice__discovery_close_locked(d, sluice_clock_now(&d->clock));
    sluice__discovery_unlock(d);
    sluice_discovery_flush(d);
}

/* Empty the open window and make every call in flight count for nothing.
 * A Retry-After hold stays (see sluice_discovery_clear). */
SLUICE_INLINE void sluice__discovery_restart_locked(struct sluice_discovery *d, int64_t now)
{
    sluice__discovery_take_locked(d, now);
    atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
    atomic_store_explicit(&d->latency_ref_ns, 0, SLUICE_RELAXED);
    atomic_store_explicit(&d->duration_ref_ns, 0, SLUICE_RELAXED);
    d->ref_guessed = false;
    sluice__discovery_schedule(d, now, 0);
    sluice__discovery_opened_locked(d);
}

/*
 * Clear this node: drop its persisted lock, reset it to probing and restart
 * discovery from the jumpstart (the gate's limit moves there now, so the
 * next call is admitted under it). Calls in flight are not interrupted and
 * their outcomes do not count towards the new windows. A live Retry-After
 * hold is kept, and so is one a call in flight brings back later: it is
 * the provider's word about now, and waking the held calls would only send
 * a burst into more 429s. Other nodes are untouched; a fixed node is left
 * alone. The store's clear runs in the flush that follows (here, or on a
 * thread already flushing); its failure is a "store" event. Returns
 * SLUICE_OK.
 */
SLUICE_INLINE int sluice_discovery_clear(struct sluice_discovery *d)
{
    if (d->fixed)
        return SLUICE_OK;
    sluice_spinlock_lock(&d->lock);
    int64_t now = sluice_clock_now(&d->clock); /* under the lock: see maybe_close */
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_forget_locked(d);
    sluice__discovery_persist_locked(d, 0, 0, 0);
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_PROBING);
    uint32_t next = sluice__discovery_clamp(
        d, sluice_policy_reset(sluice__discovery_policy(d), d->cfg.jumpstart, false));
    sluice__discovery_set_limit_locked(d, next, now);
    sluice__discovery_restart_locked(d, now);
    sluice__discovery_emit_locked(d, now, SLUICE_EVENT_CLEAR, SLUICE_CAUSE_API, old, next);
    sluice__discovery_unlock(d);
    sluice_discovery_flush(d);
    return SLUICE_OK;
}

/*
 * The request rate the provider states (per second; the shim reads it from
 * a response's rate-limit headers, sluice_curl_stated_rate) and how long
 * the call that said so took (`latency_ns`): a probing node that has seen
 * no congestion, holds no lock and took no hint yet averages the latencies
 * of SLUICE_DISCOVERY_HINT_CALLS such offers, then moves to Little's law,
 * rate × latency, the most calls the rate keeps busy at once — times
 * SLUICE_DISCOVERY_HINT_SHARE, rounded down, clamped to [min_limit,
 * max_limit] (a pool's max_limit is never above its `active`) — and
 * brackets probing there (growing past it only runs the budget dry), so
 * it locks there after a stable window unless a refusal says lower. A few
 * calls' latency is a sample: at the next window close the limit is
 * worked out once more from the window's mean latency. A "hint" event
 * records each move, with `source` as its cause (SLUICE_CAUSE_PROVIDER_RATE).
 * Evidence wins over a hint: a restored or discovered lock, or a bracket a
 * refusal opened first. A node weighs one hint until a clear or the lock's
 * expiry; every later offer returns at once on one relaxed load, so the
 * shim may offer one per response. The first offers take the update lock
 * (bounded), then flush on this thread. Returns true when the offer was
 * counted.
 */
SLUICE_INLINE bool sluice_discovery_hint_rate(struct sluice_discovery *d, double rate_per_s,
                                              int64_t latency_ns, enum sluice_cause source)
{
    if (d->fixed || !(rate_per_s > 0) || latency_ns <= 0 ||
        atomic_load_explicit(&d->hinted, SLUICE_RELAXED) > SLUICE__HINT_COLLECTING)
        return false;
    sluice_spinlock_lock(&d->lock);
    bool take = atomic_load_explicit(&d->hinted, SLUICE_RELAXED) <= SLUICE__HINT_COLLECTING &&
                !d->congested && !atomic_load_explicit(&d->ceiling, SLUICE_RELAXED) &&
                sluice__discovery_state(d) == SLUICE_DISCOVERY_PROBING;
    enum sluice__hint_state next = SLUICE__HINT_DONE; /* evidence came first */
    if (take) {
        if (atomic_load_explicit(&d->hinted, SLUICE_RELAXED) == SLUICE__HINT_NONE)
            d->hint_sum_ns = d->hint_calls = 0;
        d->hint_rate = rate_per_s;
        d->hint_source = source;
        d->hint_sum_ns = sluice_add_ns(d->hint_sum_ns, latency_ns);
        next = ++d->hint_calls < SLUICE_DISCOVERY_HINT_CALLS ? SLUICE__HINT_COLLECTING
                                                             : SLUICE__HINT_PENDING;
        if (next == SLUICE__HINT_PENDING)
            sluice__discovery_hint_at_locked(d, sluice_clock_now(&d->clock),
                                             d->hint_sum_ns / (int64_t)d->hint_calls);
    }
    atomic_store_explicit(&d->hinted, next, SLUICE_RELAXED);
    sluice__discovery_unlock(d);
    sluice_discovery_flush(d);
    return take;
}

/* A "store" event about the stored record, during init. */
SLUICE_INLINE void sluice__discovery_store_event(struct sluice_discovery *d, int64_t now,
                                                 enum sluice_cause cause)
{
    uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_emit_locked(d, now, SLUICE_EVENT_STORE, cause, limit, limit);
}

/*
 * Restore a live stored lock, if any. Call during init (no lock needed:
 * nobody else sees the node yet). A record is trusted within bounds: one
 * locked in the future (beyond SLUICE_DISCOVERY_SKEW_S of clock skew) or
 * expiring before it was locked is invalid and dropped; one expiring later
 * than lock_ttl_s from now is cut to now + lock_ttl_s; an expired one is
 * ignored. The first two are "store" events, like a failing load.
 */
SLUICE_INLINE void sluice__discovery_restore(struct sluice_discovery *d, int64_t now)
{
    struct sluice_lock_record rec;
    memset(&rec, 0, sizeof rec);
    int loaded = d->store.load(d->store.ctx, d->node, &rec);
    if (loaded != SLUICE_OK) {
        sluice__discovery_store_event(d, now,
                                      loaded == SLUICE_EINVAL ? SLUICE_CAUSE_STORE_CORRUPT
                                                              : SLUICE_CAUSE_STORE_ERROR);
        return;
    }
    if (rec.ceiling == 0)
        return; /* nothing stored */
    int64_t now_s = sluice__discovery_wall_s(d);
    if (rec.locked_at_s > now_s + SLUICE_DISCOVERY_SKEW_S || rec.expires_s <= rec.locked_at_s) {
        sluice__discovery_store_event(d, now, SLUICE_CAUSE_INVALID_RECORD);
        return;
    }
    if (now_s >= rec.expires_s)
        return; /* expired: ignored */
    if (rec.expires_s - now_s > d->cfg.lock_ttl_s) {
        rec.expires_s = now_s + d->cfg.lock_ttl_s;
        sluice__discovery_store_event(d, now, SLUICE_CAUSE_EXPIRY_CAPPED);
    }
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    uint32_t ceiling = sluice__discovery_clamp(d, rec.ceiling);
    sluice_policy_reset(sluice__discovery_policy(d), ceiling, true);
    atomic_store_explicit(&d->ceiling, ceiling, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, rec.expires_s, SLUICE_RELAXED);
    d->confirmed = true; /* it was confirmed when it was stored */
    d->confirmed_ns = INT64_MIN;
    d->strikes = d->knee_strikes = d->clean_run = 0;
    d->refusal_lock = false; /* how it was found is not stored: knees do not lower it */
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_LOCKED);
    sluice__discovery_set_limit_locked(d, ceiling, now);
    sluice__discovery_emit_locked(d, now, SLUICE_EVENT_RESTORE, SLUICE_CAUSE_STORE, old, ceiling);
}

/*
 * Initialise over caller storage: `slots` holds `capacity` event slots
 * (a power of two; desc->events is ignored). Copies the policy prototype
 * into the node, sets the gate's limit to the jumpstart, or to a live
 * stored ceiling (a "restore" event, delivered to the callback before this
 * returns; the store's load runs here, on the calling thread). Returns
 * SLUICE_OK or SLUICE_EINVAL with a message naming the field in
 * desc->error (a NULL desc has nowhere to put one).
 */
SLUICE_INLINE int sluice_discovery_init(struct sluice_discovery *d,
                                        const struct sluice_discovery_desc *desc,
                                        struct sluice_event_slot *slots, uint32_t capacity)
{
    struct sluice__discovery_cfg cfg;
    int status = sluice__discovery_resolve_own(desc, &cfg);
    if (status != SLUICE_OK)
        return status;
    if (!d || !slots || !sluice_is_pow2(capacity))
        return sluice__fail(desc->error, desc->error_size,
                            "event ring storage must hold a power of two of slots");
    memset((void *)d, 0, sizeof *d); /* (void *): it holds atomics, which C++ frowns on */
    d->cfg = cfg;
    strcpy(d->node, desc->node_id);
    d->gate = desc->gate;
    if (desc->policy) {
        memcpy(d->policy.bytes, (const void *)desc->policy, desc->policy->ops->size);
    } else {
        struct sluice_policy_discover def;
        sluice_policy_discover_init(&def, NULL, NULL, 0);
        memcpy(d->policy.bytes, (const void *)&def, sizeof def);
    }
    struct sluice_policy *policy = sluice__discovery_policy(d);
    d->fixed = !policy->ops->adaptive;
    if (desc->clock)
        d->clock = *desc->clock;
    if (desc->wall_clock)
        d->wall_clock = *desc->wall_clock;
    d->has_store = desc->store != NULL;
    if (desc->store)
        d->store = *desc->store;
    d->on_event = desc->on_event;
    d->on_event_ctx = desc->on_event_ctx;
    sluice_event_ring_init(&d->events, slots, capacity, d->node);
    sluice_spinlock_init(&d->lock);
    sluice_window_recorder_init(&d->acc);
    int64_t now = sluice_clock_now(&d->clock);
    atomic_init(&d->cohort_from_ns, now);
    atomic_init(&d->cohort_until_ns, INT64_MAX);
    atomic_init(&d->cohort_due_ns, sluice_add_ns(now, cfg.window_max_ns));
    atomic_init(&d->last_cut_ns, INT64_MIN); /* no cut yet: every overload is fresh */
    atomic_init(&d->latency_ref_ns, 0);
    atomic_init(&d->duration_ref_ns, 0);
    atomic_init(&d->hold_until_ns, 0);
    atomic_init(&d->hinted, SLUICE__HINT_NONE);
    atomic_init(&d->rate_struck, UINT32_MAX);
    for (int i = 0; i < SLUICE__SIGNALS; i++)
        atomic_init(&d->signals[i], 0u);
    atomic_init(&d->window_seq, 0u);
    atomic_init(&d->cohort_left, 0u);
    atomic_init(&d->judged_tag, 0u); /* the recorder's first window */
    atomic_init(&d->ceiling, 0u);
    atomic_init(&d->lock_expires_s, 0);
    atomic_init(&d->state, (int)(d->fixed ? SLUICE_DISCOVERY_FIXED : SLUICE_DISCOVERY_PROBING));
    d->in_flight_src = NULL;
    d->lingering_src = NULL;
    sluice_effects_init(&d->fx);
    uint32_t start = sluice_policy_reset(policy, cfg.jumpstart, false);
    if (!d->fixed)
        start = sluice__discovery_clamp(d, start);
    atomic_init(&d->limit, start);
    sluice_gate_set_limit(d->gate, start);
    if (!d->fixed && d->has_store)
        sluice__discovery_restore(d, now);
    sluice_effects_post_locked(&d->fx);
    sluice_discovery_flush(d);
    return SLUICE_OK;
}

/* Allocate and initialise (the only allocation discovery makes); failures as
 * sluice_discovery_init's, or SLUICE_ENOMEM. */
SLUICE_INLINE int sluice_discovery_create(const struct sluice_discovery_desc *desc,
                                          struct sluice_discovery **out)
{
    struct sluice__discovery_cfg cfg;
    *out = NULL;
    int status = sluice__discovery_resolve_own(desc, &cfg);
    if (status != SLUICE_OK)
        return status;
    const struct sluice_allocator *a = desc->allocator;
    if (!sluice__allocator_valid(a))
        return sluice__fail(desc->error, desc->error_size,
                            "sluice_discovery_desc.allocator sets only one of alloc and free "
                            "(set both, or leave it NULL)");
    struct sluice_discovery *d =
        (struct sluice_discovery *)sluice__alloc(a, sizeof *d, SLUICE_CACHELINE);
    struct sluice_event_slot *slots = (struct sluice_event_slot *)sluice__alloc(
        a, SLUICE_EVENT_RING_SIZE(cfg.events), SLUICE_CACHELINE);
    if (!d || !slots) {
        sluice__free(a, d, sizeof *d);
        sluice__free(a, slots, SLUICE_EVENT_RING_SIZE(cfg.events));
        return SLUICE_ENOMEM;
    }
    sluice_discovery_init(d, desc, slots, cfg.events);
    if (a)
        d->allocator = *a;
    d->owns_memory = true;
    *out = d;
    return SLUICE_OK;
}

/* Free a discovery made by sluice_discovery_create. No thread may be using it
 * (call sluice_discovery_sync first if effects may still be pending). */
SLUICE_INLINE void sluice_discovery_destroy(struct sluice_discovery *d)
{
    if (!d || !d->owns_memory)
        return;
    struct sluice_allocator a = d->allocator;
    sluice__free(&a, d->events.slots, SLUICE_EVENT_RING_SIZE(d->events.mask + 1));
    sluice__free(&a, d, sizeof *d);
}

/* ---- observability ------------------------------------------------------- */

struct sluice_discovery_status {
    const char *node;
    enum sluice_discovery_state state;
    uint32_t in_flight;        /* calls in flight (see the header comment) */
    uint32_t limit;            /* current limit */
    uint32_t ceiling;          /* locked ceiling; 0 = not locked (or the lock ran out) */
    int64_t lock_expires_s;    /* wall clock epoch seconds; 0 = not locked */
    int64_t hold_until_ns;     /* Retry-After hold (discovery clock); 0 = none */
    struct sluice_event last_event; /* last_event.seq == 0: no event yet */
};

/*
 * A snapshot of one node (padding zeroed, so snapshots compare with memcmp).
 * A lock whose expiry the wall clock has passed shows as gone (probing,
 * ceiling 0) even before a close or poll records its "expiry" event.
 */
SLUICE_INLINE void sluice_discovery_snapshot(const struct sluice_discovery *disc,
                                             struct sluice_discovery_status *st)
{
    struct sluice_discovery *d = (struct sluice_discovery *)disc;
    memset(st, 0, sizeof *st);
    st->node = d->node;
    st->state = sluice__discovery_state(d);
    st->in_flight = sluice__discovery_in_flight(d);
    st->limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    st->ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    st->lock_expires_s = atomic_load_explicit(&d->lock_expires_s, SLUICE_RELAXED);
    st->hold_until_ns = atomic_load_explicit(&d->hold_until_ns, SLUICE_RELAXED);
    if (sluice__discovery_lock_lapsed(d, st->lock_expires_s)) {
        if (st->state == SLUICE_DISCOVERY_LOCKED)
            st->state = SLUICE_DISCOVERY_PROBING;
        st->ceiling = 0;
        st->lock_expires_s = 0;
    }
    if (!sluice_event_ring_last(&d->events, &st->last_event))
        memset(&st->last_event, 0, sizeof st->last_event);
}

/*
 * Format "NODE INFLIGHT/LIMIT GLYPH" (e.g. "cloud:default_ollama 5/52 📈";
 * fixed nodes have no glyph: "local:gpu 2/4"; a limit of 0 — only an
 * unlimited fixed node has one, see sluice_engine_status — prints as "∞":
 * "free 3/∞"). snprintf semantics: returns the full length; a return >= size
 * means the line was truncated.
 */
SLUICE_INLINE int sluice_status_line(char *buf, size_t size, const struct sluice_discovery_status *st)
{
    const char *glyph = sluice_discovery_state_glyph(st->state);
    char limit[16];
    if (st->limit)
        snprintf(limit, sizeof limit, "%" PRIu32, st->limit);
    else
        snprintf(limit, sizeof limit, "%s", "\xE2\x88\x9E"); /* U+221E */
    return snprintf(buf, size, "%s %" PRIu32 "/%s%s%s", st->node ? st->node : "", st->in_flight,
                    limit, glyph[0] ? " " : "", glyph);
}

#endif /* SLUICE_DISCOVERY_H */
