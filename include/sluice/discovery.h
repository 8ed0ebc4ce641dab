/*
 * sluice/discovery.h — per-backend ceiling discovery: the probing / backoff
 * / locked state machine that drives one gate's limit from live traffic.
 *
 * What it is: one `struct sluice_discovery` per adaptive backend ("node").
 * The pool feeds it every finished generation call
 * (sluice_discovery_on_sample, from call_end) and asks it whether new calls
 * must wait for a provider's Retry-After (sluice_discovery_hold_until, from
 * call_begin). Discovery folds samples into windows, lets its policy
 * (sluice/policy.h; default: sluice/policy/discover.h) propose a limit at
 * each window's close, and applies the answer to the gate it was given with
 * sluice_gate_set_limit. It keeps a status snapshot, an event ring
 * (sluice/events.h) and, through a store, the locked ceiling.
 *
 * States (the glyph is what status lines show):
 *   probing  📈  climbing from the jumpstart (default 5, or the provider's
 *                suggestion) towards the ceiling
 *   backoff  🌧️  a congestion signal just cut the limit; no growth until a
 *                clean window of calls started after the cut, and until any
 *                Retry-After hold has passed ("recovery" event)
 *   locked   🔒  a ceiling is locked for lock_ttl_s (default 24 h); the
 *                limit never grows above it, though it may back off and
 *                recover up to it
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
 * the one it refused. If the last congestion was a latency knee, the
 * policy's estimate of the queue-free limit caps the ceiling as well
 * (latency cannot tell C from a little more than C as sharply as a 429
 * can). A node that never sees congestion locks at max_limit after a stable
 * window there. While locked, a congestion signal at the ceiling is only a
 * backoff (a transient); an overload (not a knee) that strikes below the
 * ceiling, while recovering towards it, is evidence that capacity fell, and
 * lowers the ceiling to just under where it struck (a "lock" event with
 * reason "lowered"). A lowered ceiling is a guess until a stable window
 * runs at it (another "lock" event, reason "bracket"); until then an
 * overload at the ceiling lowers it again, so a cut cap is tracked down to
 * the last limit it accepts and the 429s stop. The ceiling is never raised
 * while locked: only expiry or clear reopen probing.
 *
 * Windows are start-time cohorts. A window measures the calls that
 * *started* during its first part, [from, until), which lasts window_span
 * mean latencies (longer at small limits, so it sees ~window_samples calls),
 * and it closes window_tail mean latencies after `until`, once nearly all of
 * them have finished. Closing after a fixed number of *completions* instead
 * would bias every window towards the calls that happened to be short (the
 * first to finish), and a lognormal provider then looks slower in steady
 * state than it did right after each change: false latency knees. A window
 * also closes at once on a *fresh* overload — one from a call that started
 * after the last cut, so the burst of 429s a cut was already made for does
 * not cut again — and never later than window_max_ns after it opened. The
 * next window opens when the previous one closes, so every window's calls
 * started under a single limit.
 *
 * Progress: on_sample is lock-free for the caller: it adds to the window
 * with relaxed atomic RMWs, and the one completion that finds the window
 * due tries the update lock (sluice_spinlock_trylock); if another thread
 * holds it, it skips, and the next completion tries again. The update
 * itself is bounded work plus, rarely (lock, lowering, clear), one store
 * call. hold_until, status and the event readers are wait-free. clear and
 * poll take the update lock with sluice_spinlock_lock (slow paths).
 *
 * Concurrency: every function may run concurrently with every other on the
 * same discovery, except init/create/destroy. Store callbacks run under the
 * update lock, so one node never calls its store twice at once (different
 * nodes may share a store, which must then be thread-safe; the memory store
 * below is). Event callbacks run after the lock is released. A limit raise
 * runs the gate's async-waiter callbacks (sluice/gate.h) on the thread that
 * closed the window, while it holds the update lock: such a callback may
 * call on_sample or hold_until (a nested close just skips), but not clear or
 * poll, which would wait for the lock its own thread holds.
 *
 * Memory ordering: window counters are relaxed: a sample that races a
 * close may land in either window, which only moves one data point. The
 * update lock (acquire/release) orders each update after the previous one,
 * so the policy, the bracket and the lock record need no atomics of their
 * own. Fields that readers outside the lock see (limit, state, ceiling,
 * expiry, hold, window bounds, last cut) are relaxed atomics: a status
 * snapshot is a set of recent values, not one instant, and a completion
 * that reads stale window bounds merely counts or skips one sample. The gate publishes limit changes with its own (seq_cst) protocol.
 *
 * Time: the discovery clock (struct sluice_clock, monotonic) times windows,
 * holds and events; the wall clock (ns since the Unix epoch) stamps lock
 * expiry, which the store persists as epoch seconds. Both default to the
 * real clocks; tests pass virtual ones.
 *
 * Allocation: only in sluice_discovery_create (through the allocator hook);
 * sluice_discovery_init uses caller storage for the event ring.
 */
#ifndef SLUICE_DISCOVERY_H
#define SLUICE_DISCOVERY_H

#include "events.h"
#include "gate.h"
#include "policy.h"
#include "policy/discover.h"
#include "time.h"

#define SLUICE_NODE_ID_MAX 128 /* bytes, terminator included */

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

/* ---- store: where locked ceilings outlive the process --------------------- */

/* A persisted lock. ceiling 0 means "no record". */
struct sluice_lock_record {
    uint32_t ceiling;
    int64_t expires_s; /* wall clock, seconds since the Unix epoch */
};

/*
 * Persistence of locks, keyed by node id. Every callback returns SLUICE_OK
 * or an error status; load reports "nothing stored" as SLUICE_OK with
 * out->ceiling = 0. Discovery calls them under the node's update lock.
 * A failing store never stops discovery: the lock stays in force in memory.
 */
struct sluice_store_ops {
    int (*load)(void *ctx, const char *node, struct sluice_lock_record *out);
    int (*save)(void *ctx, const char *node, const struct sluice_lock_record *rec);
    int (*clear)(void *ctx, const char *node);
    void *ctx;
};

/* An in-memory store (tests, and embedders who do not persist): a fixed
 * table of records, thread-safe behind a spinlock. */
struct sluice_memstore_entry {
    char node[SLUICE_NODE_ID_MAX];
    struct sluice_lock_record rec; /* rec.ceiling 0 = free entry */
};

struct sluice_memstore {
    sluice_spinlock lock;
    struct sluice_memstore_entry *entries;
    uint32_t capacity;
    uint32_t saves, clears; /* calls served, for tests and diagnostics (under lock) */
    struct sluice_allocator allocator;
    bool owns_memory;
};

SLUICE_INLINE void sluice_memstore_init(struct sluice_memstore *m,
                                        struct sluice_memstore_entry *entries, uint32_t capacity)
{
    sluice_spinlock_init(&m->lock);
    m->entries = entries;
    m->capacity = capacity;
    m->saves = m->clears = 0;
    memset(&m->allocator, 0, sizeof m->allocator);
    m->owns_memory = false;
    memset(entries, 0, (size_t)capacity * sizeof *entries);
}

SLUICE_INLINE int sluice_memstore_create(uint32_t capacity, const struct sluice_allocator *a,
                                         struct sluice_memstore **out)
{
    *out = NULL;
    if (capacity == 0)
        return SLUICE_EINVAL;
    size_t table = (size_t)capacity * sizeof(struct sluice_memstore_entry);
    struct sluice_memstore *m =
        (struct sluice_memstore *)sluice__alloc(a, sizeof *m, SLUICE_CACHELINE);
    struct sluice_memstore_entry *e =
        (struct sluice_memstore_entry *)sluice__alloc(a, table, SLUICE_CACHELINE);
    if (!m || !e) {
        sluice__free(a, m, sizeof *m);
        sluice__free(a, e, table);
        return SLUICE_ENOMEM;
    }
    sluice_memstore_init(m, e, capacity);
    if (a)
        m->allocator = *a;
    m->owns_memory = true;
    *out = m;
    return SLUICE_OK;
}

SLUICE_INLINE void sluice_memstore_destroy(struct sluice_memstore *m)
{
    if (!m || !m->owns_memory)
        return;
    struct sluice_allocator a = m->allocator;
    sluice__free(&a, m->entries, (size_t)m->capacity * sizeof *m->entries);
    sluice__free(&a, m, sizeof *m);
}

/* The entry for `node`, or (when `claim`) a free one; NULL if none. Call locked. */
SLUICE_INLINE struct sluice_memstore_entry *sluice__memstore_find(struct sluice_memstore *m,
                                                                  const char *node, bool claim)
{
    struct sluice_memstore_entry *free_entry = NULL;
    for (uint32_t i = 0; i < m->capacity; i++) {
        struct sluice_memstore_entry *e = &m->entries[i];
        if (e->rec.ceiling && strcmp(e->node, node) == 0)
            return e;
        if (!e->rec.ceiling && !free_entry)
            free_entry = e;
    }
    return claim ? free_entry : NULL;
}

SLUICE_INLINE int sluice__memstore_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    struct sluice_memstore *m = (struct sluice_memstore *)ctx;
    sluice_spinlock_lock(&m->lock);
    struct sluice_memstore_entry *e = sluice__memstore_find(m, node, false);
    out->ceiling = e ? e->rec.ceiling : 0;
    out->expires_s = e ? e->rec.expires_s : 0;
    sluice_spinlock_unlock(&m->lock);
    return SLUICE_OK;
}

SLUICE_INLINE int sluice__memstore_save(void *ctx, const char *node,
                                        const struct sluice_lock_record *rec)
{
    struct sluice_memstore *m = (struct sluice_memstore *)ctx;
    if (strlen(node) >= SLUICE_NODE_ID_MAX)
        return SLUICE_EINVAL;
    sluice_spinlock_lock(&m->lock);
    struct sluice_memstore_entry *e = sluice__memstore_find(m, node, true);
    if (e) {
        strcpy(e->node, node);
        e->rec = *rec;
        m->saves++;
    }
    sluice_spinlock_unlock(&m->lock);
    return e ? SLUICE_OK : SLUICE_ENOMEM;
}

SLUICE_INLINE int sluice__memstore_clear(void *ctx, const char *node)
{
    struct sluice_memstore *m = (struct sluice_memstore *)ctx;
    sluice_spinlock_lock(&m->lock);
    struct sluice_memstore_entry *e = sluice__memstore_find(m, node, false);
    if (e)
        memset(e, 0, sizeof *e);
    m->clears++;
    sluice_spinlock_unlock(&m->lock);
    return SLUICE_OK;
}

/* The store ops of a memory store, to put in sluice_discovery_desc.store. */
SLUICE_INLINE struct sluice_store_ops sluice_memstore_ops(struct sluice_memstore *m)
{
    struct sluice_store_ops ops;
    ops.load = sluice__memstore_load;
    ops.save = sluice__memstore_save;
    ops.clear = sluice__memstore_clear;
    ops.ctx = m;
    return ops;
}

/* ---- configuration --------------------------------------------------------- */

struct sluice_discovery_desc {
    const char *node_id;          /* required; copied (at most SLUICE_NODE_ID_MAX-1 bytes),
                                     e.g. "cloud:default_ollama" */
    struct sluice_gate *gate;     /* required: the gate whose limit discovery drives */
    struct sluice_policy *policy; /* caller storage, outlives the discovery
                                     (default: discover with default parameters) */
    uint32_t jumpstart;           /* starting limit: the provider's suggestion when known
                                     (default: 5, clamped to [min_limit, max_limit]) */
    uint32_t min_limit;           /* the limit never falls below this (default: 1) */
    uint32_t max_limit;           /* ... nor rises above this (default: 1024) */
    int64_t lock_ttl_s;           /* how long a discovered ceiling stays locked
                                     (default: 86400, i.e. 24 h; at most
                                     SLUICE_DISCOVERY_TTL_MAX_S) */
    int64_t window_min_ns;        /* a window's start period lasts at least this (default: 50 ms) */
    int64_t window_max_ns;        /* a window closes at this age whatever it holds
                                     (default: 300 s; at most SLUICE_DISCOVERY_WINDOW_MAX_NS) */
    uint32_t window_samples;      /* calls a window aims to measure when the limit is smaller
                                     (default: 16) */
    double window_span;           /* mean latencies a window's start period lasts, > 0
                                     (default: 2) */
    double window_tail;           /* mean latencies a window then waits for its slowest calls,
                                     > 0 (default: 2) */
    int64_t retry_after_max_ns;   /* Retry-After is honoured up to this (default: 60 s) */
    uint32_t events;              /* event ring capacity, rounded up to a power of two
                                     (default: 256) */
    const struct sluice_store_ops *store;  /* copied (default: none: locks live in memory) */
    const struct sluice_clock *clock;      /* copied (default: CLOCK_MONOTONIC) */
    const struct sluice_clock *wall_clock; /* ns since the Unix epoch, copied
                                              (default: CLOCK_REALTIME) */
    sluice_event_fn on_event;     /* called once per event (default: none) */
    void *on_event_ctx;
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
};

/* Bounds that keep every `now + span` in int64 ns (and epoch seconds) finite. */
#define SLUICE_DISCOVERY_TTL_MAX_S (INT64_C(10) * 366 * 86400) /* ten years */
#define SLUICE_DISCOVERY_WINDOW_MAX_NS (INT64_C(86400) * SLUICE_NS_PER_SEC) /* a day */
#define SLUICE_DISCOVERY_EVENTS_MAX (UINT32_C(1) << 20)

/* The resolved configuration (defaults applied). */
struct sluice__discovery_cfg {
    uint32_t jumpstart, min_limit, max_limit, window_samples, events;
    int64_t lock_ttl_s, window_min_ns, window_max_ns, retry_after_max_ns;
    double window_span, window_tail;
};

SLUICE_INLINE int sluice__discovery_fail(const char **why, const char *msg)
{
    if (why)
        *why = msg;
    return SLUICE_EINVAL;
}

/*
 * Resolve defaults and check a description. Returns SLUICE_OK or
 * SLUICE_EINVAL with *why (may be NULL) set to a message naming the field.
 */
SLUICE_INLINE int sluice__discovery_resolve(const struct sluice_discovery_desc *d,
                                            struct sluice__discovery_cfg *c, const char **why)
{
    if (!d)
        return sluice__discovery_fail(why, "sluice_discovery_desc is required");
    if (!d->node_id || !d->node_id[0])
        return sluice__discovery_fail(why, "sluice_discovery_desc.node_id is required");
    if (strlen(d->node_id) >= SLUICE_NODE_ID_MAX)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.node_id is longer than SLUICE_NODE_ID_MAX-1 bytes");
    if (!d->gate)
        return sluice__discovery_fail(why, "sluice_discovery_desc.gate is required");
    c->min_limit = d->min_limit ? d->min_limit : 1;
    c->max_limit = d->max_limit ? d->max_limit : 1024;
    if (c->max_limit > SLUICE_GATE_LIMIT_MAX)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.max_limit exceeds SLUICE_GATE_LIMIT_MAX");
    if (c->min_limit > c->max_limit)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.min_limit exceeds max_limit (lower min_limit or raise "
                 "max_limit)");
    if (d->jumpstart && (d->jumpstart < c->min_limit || d->jumpstart > c->max_limit))
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.jumpstart must lie within [min_limit, max_limit]");
    c->jumpstart = d->jumpstart ? d->jumpstart : 5;
    c->jumpstart = c->jumpstart < c->min_limit ? c->min_limit
                   : c->jumpstart > c->max_limit ? c->max_limit
                                                 : c->jumpstart;
    if (d->lock_ttl_s < 0 || d->lock_ttl_s > SLUICE_DISCOVERY_TTL_MAX_S)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.lock_ttl_s must be in [0, SLUICE_DISCOVERY_TTL_MAX_S] "
                 "(ten years; 0 = 24 h)");
    c->lock_ttl_s = d->lock_ttl_s ? d->lock_ttl_s : 86400;
    if (d->window_min_ns < 0 || d->window_max_ns < 0 ||
        d->window_max_ns > SLUICE_DISCOVERY_WINDOW_MAX_NS)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.window_min_ns and window_max_ns must be in "
                 "[0, SLUICE_DISCOVERY_WINDOW_MAX_NS] (a day)");
    c->window_min_ns = d->window_min_ns ? d->window_min_ns : 50 * SLUICE_NS_PER_MS;
    c->window_max_ns = d->window_max_ns ? d->window_max_ns : 300 * SLUICE_NS_PER_SEC;
    if (c->window_min_ns > c->window_max_ns)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.window_min_ns exceeds window_max_ns");
    c->window_samples = d->window_samples ? d->window_samples : 16;
    if (d->window_span < 0)
        return sluice__discovery_fail(why, "sluice_discovery_desc.window_span must be positive");
    if (d->window_tail < 0)
        return sluice__discovery_fail(why, "sluice_discovery_desc.window_tail must be positive");
    c->window_span = d->window_span > 0 ? d->window_span : 2.0;
    c->window_tail = d->window_tail > 0 ? d->window_tail : 2.0;
    if (d->retry_after_max_ns < 0)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.retry_after_max_ns must not be negative");
    c->retry_after_max_ns = d->retry_after_max_ns ? d->retry_after_max_ns : 60 * SLUICE_NS_PER_SEC;
    if (d->events > SLUICE_DISCOVERY_EVENTS_MAX)
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.events exceeds SLUICE_DISCOVERY_EVENTS_MAX");
    c->events = (uint32_t)sluice_next_pow2(d->events ? d->events : 256);
    if (d->store && (!d->store->load || !d->store->save || !d->store->clear))
        return sluice__discovery_fail(
            why, "sluice_discovery_desc.store needs load, save and clear callbacks");
    return SLUICE_OK;
}

/* Check a description without creating anything (*why as above). */
SLUICE_INLINE int sluice_discovery_validate(const struct sluice_discovery_desc *desc,
                                            const char **why)
{
    struct sluice__discovery_cfg c;
    return sluice__discovery_resolve(desc, &c, why);
}

/* ---- the discovery object -------------------------------------------------- */

/* The open window, written by every completion. */
struct sluice__window_acc {
    _Atomic(uint32_t) n_ok, n_overload, n_fresh, n_ignore, max_in_flight;
    _Atomic(int64_t) latency_sum, latency_min, latency_dev, retry_after;
};

struct sluice_discovery {
    /* Completions write here: its own cache line. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) struct sluice__window_acc acc;

    /* Written by the updater, read by completions and status readers. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(int64_t) cohort_from_ns; /* the window opened */
    _Atomic(int64_t) cohort_until_ns; /* calls started in [from, until) are measured */
    _Atomic(int64_t) cohort_due_ns;   /* ... and the window closes here */
    _Atomic(int64_t) last_cut_ns;     /* overloads from calls started before this are stale */
    _Atomic(int64_t) latency_ref_ns;  /* average of recent window means; 0 = none yet */
    _Atomic(int64_t) hold_until_ns;   /* no new call before this (Retry-After); 0 = none */
    _Atomic(uint32_t) limit;
    _Atomic(uint32_t) ceiling;       /* locked ceiling; 0 = not locked */
    _Atomic(int64_t) lock_expires_s; /* wall clock; 0 = not locked */
    _Atomic(int) state;              /* enum sluice_discovery_state */

    /* Only under `lock`. */
    sluice_spinlock lock;
    bool congested;         /* a congestion signal opened the bracket */
    bool confirmed;         /* a stable window ran at the locked ceiling */
    uint32_t bad;           /* the limit at which the last congestion struck */
    uint32_t knee_estimate; /* the policy's queue-free estimate at the last knee; 0 = none */

    /* Immutable after init. */
    struct sluice__discovery_cfg cfg;
    char node[SLUICE_NODE_ID_MAX];
    struct sluice_gate *gate;
    struct sluice_policy *policy;
    struct sluice_policy_discover default_policy;
    struct sluice_event_ring events;
    struct sluice_clock clock, wall_clock;
    struct sluice_store_ops store;
    bool has_store, fixed;
    sluice_event_fn on_event;
    void *on_event_ctx;
    struct sluice_allocator allocator;
    bool owns_memory;
};

/* Events made under the lock, delivered to the callback after it. */
struct sluice__discovery_fx {
    struct sluice_event ev[6];
    int n;
};

SLUICE_INLINE int64_t sluice__wall_ns(const struct sluice_clock *wall)
{
    if (wall->now_ns)
        return wall->now_ns(wall->ctx);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return sluice_timespec_ns(&ts);
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

/* Record an event in the ring and queue it for the callback. Call locked. */
SLUICE_INLINE void sluice__discovery_emit(struct sluice_discovery *d, struct sluice__discovery_fx *fx,
                                          int64_t now, enum sluice_event_kind kind,
                                          enum sluice_cause cause, uint32_t old_limit,
                                          uint32_t new_limit)
{
    struct sluice_event ev;
    memset(&ev, 0, sizeof ev);
    ev.t_ns = now;
    ev.wall_ms = sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_MS;
    ev.kind = kind;
    ev.cause = cause;
    ev.old_limit = old_limit;
    ev.new_limit = new_limit;
    ev.in_flight = sluice_gate_stats(d->gate).in_flight;
    ev.ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    sluice_event_ring_push(&d->events, &ev);
    if (fx && fx->n < (int)(sizeof fx->ev / sizeof fx->ev[0]))
        fx->ev[fx->n++] = ev;
}

SLUICE_INLINE void sluice__discovery_deliver(struct sluice_discovery *d,
                                             const struct sluice__discovery_fx *fx)
{
    if (!d->on_event)
        return;
    for (int i = 0; i < fx->n; i++)
        d->on_event(d->on_event_ctx, &fx->ev[i]);
}

/* Move the gate's limit and start a new operating point. Call locked. */
SLUICE_INLINE void sluice__discovery_set_limit(struct sluice_discovery *d, uint32_t next,
                                               int64_t now)
{
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    if (next == old)
        return;
    sluice_gate_set_limit(d->gate, next);
    atomic_store_explicit(&d->limit, next, SLUICE_RELAXED);
    if (next < old)
        atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
}

SLUICE_INLINE uint32_t sluice__discovery_clamp(const struct sluice_discovery *d, uint32_t v)
{
    return v < d->cfg.min_limit ? d->cfg.min_limit : v > d->cfg.max_limit ? d->cfg.max_limit : v;
}

/* Record and persist a lock at `ceiling` (a new one, or a lower one). Call locked. */
SLUICE_INLINE void sluice__discovery_lock(struct sluice_discovery *d, uint32_t ceiling)
{
    struct sluice_lock_record rec;
    rec.ceiling = ceiling;
    rec.expires_s = sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_SEC + d->cfg.lock_ttl_s;
    atomic_store_explicit(&d->ceiling, ceiling, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, rec.expires_s, SLUICE_RELAXED);
    if (d->has_store)
        d->store.save(d->store.ctx, d->node, &rec);
}

/* Forget the bracket and any lock (expiry, clear). Call locked. */
SLUICE_INLINE void sluice__discovery_forget(struct sluice_discovery *d)
{
    atomic_store_explicit(&d->ceiling, 0u, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, 0, SLUICE_RELAXED);
    d->congested = false;
    d->confirmed = false;
    d->bad = 0;
    d->knee_estimate = 0;
}

/* Lock expiry by the wall clock: probing resumes from the current limit. Call locked. */
SLUICE_INLINE void sluice__discovery_check_expiry(struct sluice_discovery *d,
                                                  struct sluice__discovery_fx *fx, int64_t now)
{
    int64_t expires = atomic_load_explicit(&d->lock_expires_s, SLUICE_RELAXED);
    if (!expires || sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_SEC < expires)
        return;
    sluice__discovery_forget(d);
    if (sluice__discovery_state(d) == SLUICE_DISCOVERY_LOCKED)
        sluice__discovery_set_state(d, SLUICE_DISCOVERY_PROBING);
    uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_emit(d, fx, now, SLUICE_EVENT_EXPIRY, SLUICE_CAUSE_TTL, limit, limit);
}

/*
 * Schedule the window opening at `from`: its start period lasts
 * window_span mean latencies (stretched at small limits to reach
 * window_samples calls), then it waits window_tail mean latencies for
 * stragglers. With no latency known
 * yet, the first ok sample schedules it (see on_sample).
 */
SLUICE_INLINE void sluice__discovery_schedule(struct sluice_discovery *d, int64_t from, int64_t ref)
{
    int64_t until = INT64_MAX, due = from + d->cfg.window_max_ns;
    if (ref > 0) {
        uint32_t limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
        double stretch = limit && limit * d->cfg.window_span < d->cfg.window_samples
                             ? (double)d->cfg.window_samples / (double)limit
                             : d->cfg.window_span;
        int64_t span = (int64_t)((double)ref * stretch);
        until = from + (span > d->cfg.window_min_ns ? span : d->cfg.window_min_ns);
        int64_t wait = until + (int64_t)((double)ref * d->cfg.window_tail);
        if (wait < due)
            due = wait;
    }
    atomic_store_explicit(&d->cohort_until_ns, until, SLUICE_RELAXED);
    atomic_store_explicit(&d->cohort_due_ns, due, SLUICE_RELAXED);
}

/* Take the closing window's totals and open the next one at `now`. Call locked. */
SLUICE_INLINE struct sluice_window sluice__discovery_take(struct sluice_discovery *d, int64_t now)
{
    struct sluice__window_acc *a = &d->acc;
    struct sluice_window w;
    memset(&w, 0, sizeof w);
    w.start_ns = atomic_exchange_explicit(&d->cohort_from_ns, now, SLUICE_RELAXED);
    w.end_ns = now;
    w.limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    w.n_ok = atomic_exchange_explicit(&a->n_ok, 0u, SLUICE_RELAXED);
    w.n_overload = atomic_exchange_explicit(&a->n_overload, 0u, SLUICE_RELAXED);
    w.n_fresh_overload = atomic_exchange_explicit(&a->n_fresh, 0u, SLUICE_RELAXED);
    w.n_ignore = atomic_exchange_explicit(&a->n_ignore, 0u, SLUICE_RELAXED);
    w.max_in_flight = atomic_exchange_explicit(&a->max_in_flight, 0u, SLUICE_RELAXED);
    int64_t sum = atomic_exchange_explicit(&a->latency_sum, 0, SLUICE_RELAXED);
    int64_t dev = atomic_exchange_explicit(&a->latency_dev, 0, SLUICE_RELAXED);
    int64_t min = atomic_exchange_explicit(&a->latency_min, INT64_MAX, SLUICE_RELAXED);
    w.retry_after_ns = atomic_exchange_explicit(&a->retry_after, 0, SLUICE_RELAXED);
    if (w.n_ok) {
        w.latency_mean_ns = sum / w.n_ok;
        w.latency_mad_ns = dev / w.n_ok;
        w.latency_min_ns = min == INT64_MAX ? 0 : min;
        int64_t ref = atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED);
        atomic_store_explicit(&d->latency_ref_ns, ref ? (ref + w.latency_mean_ns) / 2
                                                     : w.latency_mean_ns, SLUICE_RELAXED);
    }
    /* "Reached the limit", with 1/8 slack: arrivals are bursty and the count
     * is read at each call's start, not continuously. */
    w.saturated = w.n_ok && w.max_in_flight >= w.limit - w.limit / 8;
    if (d->congested)
        w.probe_cap = d->bad > 1 ? d->bad - 1 : 1;
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    if (ceiling && (!w.probe_cap || ceiling < w.probe_cap))
        w.probe_cap = ceiling;
    return w;
}

/* A congestion verdict: cut, move the bracket or lower the lock. Call locked. */
SLUICE_INLINE void sluice__discovery_congestion(struct sluice_discovery *d,
                                                struct sluice__discovery_fx *fx, int64_t now,
                                                const struct sluice_verdict *v, uint32_t old)
{
    uint32_t next = v->limit < old ? v->limit : (old > 1 ? old - 1 : 1);
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    uint32_t lowered = 0;
    bool refused = v->cause != SLUICE_CAUSE_LATENCY &&
                   (old < ceiling || (old == ceiling && !d->confirmed));
    if (ceiling && refused) {
        /* Refused below the lock while recovering towards it: capacity fell.
         * (Only an explicit refusal lowers a lock: latency is noisier, and a
         * provider that is merely slow today would ratchet it down.) */
        lowered = old > 1 ? old - 1 : 1;
        if (v->estimate && v->estimate < lowered)
            lowered = v->estimate;
        lowered = sluice__discovery_clamp(d, lowered);
        sluice__discovery_lock(d, lowered);
        d->confirmed = false;
        if (next > lowered)
            next = lowered;
    } else if (!ceiling) {
        d->congested = true;
        d->bad = old;
        d->knee_estimate = v->cause == SLUICE_CAUSE_LATENCY ? v->estimate : 0;
    }
    next = sluice__discovery_clamp(d, next);
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_BACKOFF);
    sluice__discovery_set_limit(d, next, now);
    atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
    sluice__discovery_emit(d, fx, now, SLUICE_EVENT_BACKOFF, v->cause, old, next);
    if (lowered)
        sluice__discovery_emit(d, fx, now, SLUICE_EVENT_LOCK, SLUICE_CAUSE_LOWERED, old, next);
}

/* A window that held all calls at the limit, cleanly, with enough of them. */
SLUICE_INLINE bool sluice__discovery_stable(const struct sluice_discovery *d,
                                            const struct sluice_window *w)
{
    uint32_t need = (w->limit < d->cfg.window_samples ? w->limit : d->cfg.window_samples) / 2;
    return w->saturated && w->n_fresh_overload == 0 && w->n_ok >= (need ? need : 1);
}

/* A healthy verdict: recover, lock, or grow within the cap. Call locked. */
SLUICE_INLINE void sluice__discovery_healthy(struct sluice_discovery *d,
                                             struct sluice__discovery_fx *fx, int64_t now,
                                             const struct sluice_window *w,
                                             const struct sluice_verdict *v, uint32_t old)
{
    uint32_t ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    if (sluice__discovery_state(d) == SLUICE_DISCOVERY_BACKOFF) {
        if (w->n_ok && w->n_fresh_overload == 0 &&
            now >= atomic_load_explicit(&d->hold_until_ns, SLUICE_RELAXED)) {
            sluice__discovery_set_state(d, ceiling ? SLUICE_DISCOVERY_LOCKED
                                                   : SLUICE_DISCOVERY_PROBING);
            sluice__discovery_emit(d, fx, now, SLUICE_EVENT_RECOVERY, SLUICE_CAUSE_HEALTHY, old,
                                   old);
        }
        return; /* the window that ends a backoff grows nothing */
    }
    if (ceiling && !d->confirmed && old == ceiling && sluice__discovery_stable(d, w)) {
        d->confirmed = true;
        sluice__discovery_lock(d, ceiling); /* re-persist with a fresh expiry */
        sluice__discovery_emit(d, fx, now, SLUICE_EVENT_LOCK, SLUICE_CAUSE_BRACKET, old, old);
        return;
    }
    if (!ceiling && sluice__discovery_stable(d, w) &&
        (d->congested ? old + 1 >= d->bad : old >= d->cfg.max_limit)) {
        uint32_t at = old;
        if (d->congested && d->knee_estimate && d->knee_estimate < at)
            at = sluice__discovery_clamp(d, d->knee_estimate);
        sluice__discovery_lock(d, at);
        d->confirmed = at == old;
        sluice__discovery_set_state(d, SLUICE_DISCOVERY_LOCKED);
        sluice__discovery_set_limit(d, at, now);
        sluice__discovery_emit(d, fx, now, SLUICE_EVENT_LOCK,
                               d->congested ? SLUICE_CAUSE_BRACKET : SLUICE_CAUSE_MAX_LIMIT, old,
                               at);
        return;
    }
    uint32_t cap = ceiling ? ceiling : d->congested ? (d->bad > 1 ? d->bad - 1 : 1)
                                                    : d->cfg.max_limit;
    uint32_t next = sluice__discovery_clamp(d, v->limit);
    if (next > old && next > cap)
        next = cap > old ? cap : old;
    if (next == old)
        return;
    sluice__discovery_set_limit(d, next, now);
    /* A policy may also step down without calling it congestion (a smoothing controller). */
    sluice__discovery_emit(d, fx, now, next > old ? SLUICE_EVENT_PROBE : SLUICE_EVENT_BACKOFF,
                           v->cause != SLUICE_CAUSE_NONE ? v->cause : SLUICE_CAUSE_CEILING, old,
                           next);
}

/* Close the open window and act on it. Call locked. */
SLUICE_INLINE void sluice__discovery_close(struct sluice_discovery *d,
                                           struct sluice__discovery_fx *fx, int64_t now)
{
    struct sluice_window w = sluice__discovery_take(d, now);
    sluice__discovery_check_expiry(d, fx, now);
    struct sluice_verdict v = sluice_policy_update(d->policy, &w);
    uint32_t old = w.limit;
    if (sluice_cause_is_congestion(v.cause))
        sluice__discovery_congestion(d, fx, now, &v, old);
    else
        sluice__discovery_healthy(d, fx, now, &w, &v, old);
    sluice__discovery_schedule(d, now, atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED));
}

/* Should the open window close now? Lock-free; may be wrong by a sample. */
SLUICE_INLINE bool sluice__discovery_due(struct sluice_discovery *d, int64_t now)
{
    return atomic_load_explicit(&d->acc.n_fresh, SLUICE_RELAXED) ||
           now >= atomic_load_explicit(&d->cohort_due_ns, SLUICE_RELAXED);
}

/* Close the window if it is due and nobody else is closing it. */
SLUICE_INLINE void sluice__discovery_maybe_close(struct sluice_discovery *d, int64_t now)
{
    int64_t from = atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED);
    if (!sluice__discovery_due(d, now) || !sluice_spinlock_trylock(&d->lock))
        return;
    struct sluice__discovery_fx fx;
    fx.n = 0;
    /* Another thread may have closed this window between our look and the
     * lock. Read the time again under the lock, so every update's `now` is
     * at least the previous one's and window bounds never run backwards. */
    if (atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED) == from)
        sluice__discovery_close(d, &fx, sluice_clock_now(&d->clock));
    sluice_spinlock_unlock(&d->lock);
    sluice__discovery_deliver(d, &fx);
}

/* Relaxed atomic max/min: a CAS loop that stops as soon as `v` would not win. */
#define SLUICE__ATOMIC_EXTREMUM(name, type, better)                                                \
    SLUICE_INLINE void sluice__atomic_##name(_Atomic(type) *a, type v)                             \
    {                                                                                              \
        type cur = atomic_load_explicit(a, SLUICE_RELAXED);                                        \
        while (v better cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, SLUICE_RELAXED,  \
                                                                      SLUICE_RELAXED)) {           \
        }                                                                                          \
    }
SLUICE__ATOMIC_EXTREMUM(max_u32, uint32_t, >)
SLUICE__ATOMIC_EXTREMUM(max_i64, int64_t, >)
SLUICE__ATOMIC_EXTREMUM(min_i64, int64_t, <)
#undef SLUICE__ATOMIC_EXTREMUM

/*
 * Feed one finished generation call (from the pool's call_end). Never
 * blocks; see "Progress" above. Calls that started before the last clear
 * count for nothing.
 */
SLUICE_INLINE void sluice_discovery_on_sample(struct sluice_discovery *d,
                                              const struct sluice_sample *s)
{
    if (d->fixed)
        return;
    struct sluice__window_acc *a = &d->acc;
    int64_t now = sluice_clock_now(&d->clock);
    int64_t started = now - s->latency_ns;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD) {
        if (s->retry_after_ns > 0) {
            int64_t hold = s->retry_after_ns < d->cfg.retry_after_max_ns ? s->retry_after_ns
                                                                        : d->cfg.retry_after_max_ns;
            /* retry_after_max_ns may be INT64_MAX: saturate, never wrap into the past. */
            sluice__atomic_max_i64(&d->hold_until_ns,
                                   now > 0 && hold > INT64_MAX - now ? INT64_MAX : now + hold);
        }
        atomic_fetch_add_explicit(&a->n_overload, 1u, SLUICE_RELAXED);
        if (started >= atomic_load_explicit(&d->last_cut_ns, SLUICE_RELAXED)) {
            sluice__atomic_max_i64(&a->retry_after, s->retry_after_ns);
            atomic_fetch_add_explicit(&a->n_fresh, 1u, SLUICE_RELAXED);
        }
    } else if (s->outcome == SLUICE_OUTCOME_OK &&
               started >= atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED) &&
               started < atomic_load_explicit(&d->cohort_until_ns, SLUICE_RELAXED)) {
        int64_t ref = atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED);
        if (!ref && sluice_spinlock_trylock(&d->lock)) {
            /* The first latency ever seen (or since a clear) schedules the
             * window. It is the fastest of the calls then in flight, so
             * double it rather than cut the window's slow calls off. Under
             * the update lock, like every other schedule, so a racing close
             * or clear cannot interleave with it; if the lock is busy the
             * next completion schedules instead. */
            if (!atomic_load_explicit(&d->latency_ref_ns, SLUICE_RELAXED)) {
                int64_t guess = 2 * s->latency_ns;
                atomic_store_explicit(&d->latency_ref_ns, guess, SLUICE_RELAXED);
                sluice__discovery_schedule(
                    d, atomic_load_explicit(&d->cohort_from_ns, SLUICE_RELAXED), guess);
            }
            sluice_spinlock_unlock(&d->lock);
        }
        if (!ref)
            ref = s->latency_ns;
        int64_t dev = s->latency_ns - ref;
        atomic_fetch_add_explicit(&a->latency_sum, s->latency_ns, SLUICE_RELAXED);
        atomic_fetch_add_explicit(&a->latency_dev, dev < 0 ? -dev : dev, SLUICE_RELAXED);
        sluice__atomic_min_i64(&a->latency_min, s->latency_ns);
        sluice__atomic_max_u32(&a->max_in_flight, s->in_flight_at_start);
        atomic_fetch_add_explicit(&a->n_ok, 1u, SLUICE_RELAXED);
    } else {
        atomic_fetch_add_explicit(&a->n_ignore, 1u, SLUICE_RELAXED);
    }
    sluice__discovery_maybe_close(d, now);
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

SLUICE_INLINE enum sluice_discovery_state sluice_discovery_state(const struct sluice_discovery *d)
{
    return sluice__discovery_state(d);
}

/* The node's event ring, for sluice_event_ring_read / _write_json. */
SLUICE_INLINE const struct sluice_event_ring *sluice_discovery_events(const struct sluice_discovery *d)
{
    return &d->events;
}

/*
 * Apply time-based transitions without traffic: a lock that expired, a
 * window older than window_max_ns. Call from a timer if nodes may sit idle.
 */
SLUICE_INLINE void sluice_discovery_poll(struct sluice_discovery *d)
{
    struct sluice__discovery_fx fx;
    fx.n = 0;
    sluice_spinlock_lock(&d->lock);
    int64_t now = sluice_clock_now(&d->clock); /* under the lock: see maybe_close */
    if (sluice__discovery_due(d, now))
        sluice__discovery_close(d, &fx, now);
    else
        sluice__discovery_check_expiry(d, &fx, now);
    sluice_spinlock_unlock(&d->lock);
    sluice__discovery_deliver(d, &fx);
}

/* Empty the open window and make every call in flight count for nothing. Call locked. */
SLUICE_INLINE void sluice__discovery_restart(struct sluice_discovery *d, int64_t now)
{
    sluice__discovery_take(d, now);
    atomic_store_explicit(&d->last_cut_ns, now, SLUICE_RELAXED);
    atomic_store_explicit(&d->latency_ref_ns, 0, SLUICE_RELAXED);
    atomic_store_explicit(&d->hold_until_ns, 0, SLUICE_RELAXED);
    sluice__discovery_schedule(d, now, 0);
}

/*
 * Clear this node: drop its persisted lock, reset it to probing and restart
 * discovery from the jumpstart (the gate's limit moves there now, so the
 * next call is admitted under it). Calls in flight are not interrupted and
 * their outcomes do not count towards the new windows; a Retry-After one of
 * them brings back is still honoured, since it is the provider's word about
 * now. Other nodes are untouched. A fixed node is
 * left alone. Returns SLUICE_OK, or the store's error from its clear (the
 * in-memory reset happens regardless).
 */
SLUICE_INLINE int sluice_discovery_clear(struct sluice_discovery *d)
{
    if (d->fixed)
        return SLUICE_OK;
    struct sluice__discovery_fx fx;
    fx.n = 0;
    sluice_spinlock_lock(&d->lock);
    int64_t now = sluice_clock_now(&d->clock); /* under the lock: see maybe_close */
    int status = d->has_store ? d->store.clear(d->store.ctx, d->node) : SLUICE_OK;
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    sluice__discovery_forget(d);
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_PROBING);
    uint32_t next =
        sluice__discovery_clamp(d, sluice_policy_reset(d->policy, d->cfg.jumpstart, false));
    sluice__discovery_set_limit(d, next, now);
    sluice__discovery_restart(d, now);
    sluice__discovery_emit(d, &fx, now, SLUICE_EVENT_CLEAR, SLUICE_CAUSE_API, old, next);
    sluice_spinlock_unlock(&d->lock);
    sluice__discovery_deliver(d, &fx);
    return status;
}

/* Restore a live stored lock, if any. Call during init. */
SLUICE_INLINE void sluice__discovery_restore(struct sluice_discovery *d,
                                             struct sluice__discovery_fx *fx, int64_t now)
{
    struct sluice_lock_record rec;
    memset(&rec, 0, sizeof rec);
    if (!d->has_store || d->store.load(d->store.ctx, d->node, &rec) != SLUICE_OK ||
        rec.ceiling == 0 || sluice__wall_ns(&d->wall_clock) / SLUICE_NS_PER_SEC >= rec.expires_s)
        return; /* nothing stored, or expired: ignored */
    uint32_t old = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    uint32_t ceiling = sluice__discovery_clamp(d, rec.ceiling);
    sluice_policy_reset(d->policy, ceiling, true);
    atomic_store_explicit(&d->ceiling, ceiling, SLUICE_RELAXED);
    atomic_store_explicit(&d->lock_expires_s, rec.expires_s, SLUICE_RELAXED);
    d->confirmed = true; /* it was confirmed when it was stored */
    sluice__discovery_set_state(d, SLUICE_DISCOVERY_LOCKED);
    sluice__discovery_set_limit(d, ceiling, now);
    sluice__discovery_emit(d, fx, now, SLUICE_EVENT_RESTORE, SLUICE_CAUSE_STORE, old, ceiling);
}

/*
 * Initialise over caller storage: `slots` holds `capacity` event slots
 * (a power of two; desc->events is ignored). Sets the gate's limit to the
 * jumpstart, or to a live stored ceiling (a "restore" event, delivered to
 * the callback before this returns). Returns SLUICE_OK or SLUICE_EINVAL
 * with *why (may be NULL) naming the field.
 */
SLUICE_INLINE int sluice_discovery_init(struct sluice_discovery *d,
                                        const struct sluice_discovery_desc *desc,
                                        struct sluice_event_slot *slots, uint32_t capacity,
                                        const char **why)
{
    struct sluice__discovery_cfg cfg;
    int status = sluice__discovery_resolve(desc, &cfg, why);
    if (status != SLUICE_OK)
        return status;
    if (!d || !slots || !sluice_is_pow2(capacity))
        return sluice__discovery_fail(why, "event ring storage must hold a power of two of slots");
    memset((void *)d, 0, sizeof *d); /* (void *): it holds atomics, which C++ frowns on */
    d->cfg = cfg;
    strcpy(d->node, desc->node_id);
    d->gate = desc->gate;
    d->policy = desc->policy;
    if (!d->policy) {
        sluice_policy_discover_init(&d->default_policy, NULL, NULL);
        d->policy = &d->default_policy.base;
    }
    d->fixed = !d->policy->ops->adaptive;
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
    struct sluice__window_acc *a = &d->acc;
    atomic_init(&a->n_ok, 0u);
    atomic_init(&a->n_overload, 0u);
    atomic_init(&a->n_fresh, 0u);
    atomic_init(&a->n_ignore, 0u);
    atomic_init(&a->max_in_flight, 0u);
    atomic_init(&a->latency_sum, 0);
    atomic_init(&a->latency_min, INT64_MAX);
    atomic_init(&a->latency_dev, 0);
    atomic_init(&a->retry_after, 0);
    int64_t now = sluice_clock_now(&d->clock);
    atomic_init(&d->cohort_from_ns, now);
    atomic_init(&d->cohort_until_ns, INT64_MAX);
    atomic_init(&d->cohort_due_ns, now + cfg.window_max_ns);
    atomic_init(&d->last_cut_ns, now);
    atomic_init(&d->latency_ref_ns, 0);
    atomic_init(&d->hold_until_ns, 0);
    atomic_init(&d->ceiling, 0u);
    atomic_init(&d->lock_expires_s, 0);
    atomic_init(&d->state, (int)(d->fixed ? SLUICE_DISCOVERY_FIXED : SLUICE_DISCOVERY_PROBING));
    uint32_t start = sluice_policy_reset(d->policy, cfg.jumpstart, false);
    if (!d->fixed)
        start = sluice__discovery_clamp(d, start);
    atomic_init(&d->limit, start);
    sluice_gate_set_limit(d->gate, start);
    struct sluice__discovery_fx fx;
    fx.n = 0;
    if (!d->fixed)
        sluice__discovery_restore(d, &fx, now);
    sluice__discovery_deliver(d, &fx);
    return SLUICE_OK;
}

/* Allocate and initialise (the only allocation discovery makes). */
SLUICE_INLINE int sluice_discovery_create(const struct sluice_discovery_desc *desc,
                                          struct sluice_discovery **out, const char **why)
{
    struct sluice__discovery_cfg cfg;
    *out = NULL;
    int status = sluice__discovery_resolve(desc, &cfg, why);
    if (status != SLUICE_OK)
        return status;
    const struct sluice_allocator *a = desc->allocator;
    struct sluice_discovery *d =
        (struct sluice_discovery *)sluice__alloc(a, sizeof *d, SLUICE_CACHELINE);
    struct sluice_event_slot *slots = (struct sluice_event_slot *)sluice__alloc(
        a, SLUICE_EVENT_RING_SIZE(cfg.events), SLUICE_CACHELINE);
    if (!d || !slots) {
        sluice__free(a, d, sizeof *d);
        sluice__free(a, slots, SLUICE_EVENT_RING_SIZE(cfg.events));
        return SLUICE_ENOMEM;
    }
    sluice_discovery_init(d, desc, slots, cfg.events, why);
    if (a)
        d->allocator = *a;
    d->owns_memory = true;
    *out = d;
    return SLUICE_OK;
}

/* Free a discovery made by sluice_discovery_create. No thread may be using it. */
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
    uint32_t in_flight;        /* permits held (the gate's count) */
    uint32_t limit;            /* current limit */
    uint32_t ceiling;          /* locked ceiling; 0 = not locked */
    int64_t lock_expires_s;    /* wall clock epoch seconds; 0 = not locked */
    int64_t hold_until_ns;     /* Retry-After hold (discovery clock); 0 = none */
    struct sluice_event last_event; /* last_event.seq == 0: no event yet */
};

/* A snapshot of one node (padding zeroed, so snapshots compare with memcmp). */
SLUICE_INLINE void sluice_discovery_snapshot(const struct sluice_discovery *disc,
                                             struct sluice_discovery_status *st)
{
    struct sluice_discovery *d = (struct sluice_discovery *)disc;
    memset(st, 0, sizeof *st);
    st->node = d->node;
    st->state = sluice__discovery_state(d);
    st->in_flight = sluice_gate_stats(d->gate).in_flight;
    st->limit = atomic_load_explicit(&d->limit, SLUICE_RELAXED);
    st->ceiling = atomic_load_explicit(&d->ceiling, SLUICE_RELAXED);
    st->lock_expires_s = atomic_load_explicit(&d->lock_expires_s, SLUICE_RELAXED);
    st->hold_until_ns = atomic_load_explicit(&d->hold_until_ns, SLUICE_RELAXED);
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
