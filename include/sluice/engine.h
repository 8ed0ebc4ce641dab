/*
 * sluice/engine.h — the backend registry: every backend a program talks to,
 * each with its own capacity pool, fixed when the engine is created.
 *
 * What it is: sluice_engine_create() copies a description holding every
 * backend registration (ID, default endpoint, active and waiting limits,
 * optional ceiling discovery) into immutable engine-owned state and creates
 * one pool (sluice/pool.h) per backend. Runs name their backend by ID;
 * sluice_engine_find() resolves it in O(1) without allocating (open
 * addressing over a table built at create).
 *
 * Policy rules:
 *   - the built-in backend "openrouter" is present in every engine with
 *     active 16 and waiting 1024, unless the description sets
 *     omit_openrouter (then it is in no status view and not found);
 *   - a consumer registration whose ID is "openrouter" replaces the built-in
 *     one wholesale (policy and endpoint), so like every consumer backend it
 *     is unlimited unless it sets `active`; copy SLUICE_OPENROUTER_ACTIVE /
 *     _WAITING to keep the preset's numbers;
 *   - consumer backends are unlimited unless they set `active`; with
 *     `active` set and `waiting` omitted, waiting is 1024;
 *   - a run with no backend ID (endpoint only) resolves to the engine's
 *     endpoint-only backend, which is unlimited; an endpoint override on a
 *     run keeps the pool of the backend it names;
 *   - two engines never share capacity, even for the same backend ID.
 * Invalid configuration fails creation with SLUICE_EINVAL and a message in
 * desc->error naming the field, e.g.
 *   "backends[2].waiting set without an active limit (set backends[2].active or drop waiting)".
 *
 * Ceiling discovery: a backend with `discovery` set is adaptive, a
 * discovery node whose ID is the backend ID. Its `active` is the hard
 * maximum (discovery's max_limit defaults to it and may not exceed it;
 * admission capacity stays active + waiting); its gate starts at the
 * jumpstart (default 5), or at a live lock the engine's store holds for
 * that ID, restored during create (a "restore" event). The store, wall
 * clock and event callback are engine-wide (a backend's own discovery
 * fields, when set, win); the node ID, gate, clock and allocator are the
 * engine's and must be left NULL. Every other backend is fixed: its limit
 * is `active` (or unlimited), it never probes, locks or persists.
 * sluice_engine_clear(ID) clears a node: it drops that node's persisted
 * lock, resets it to probing and moves its limit back to the jumpstart, so
 * the next request restarts discovery from there; calls in flight keep
 * their permits and finish (their outcomes are ignored), and a live
 * Retry-After hold stays; other nodes, fixed nodes (a no-op) and the saved
 * configuration are untouched; sluice_engine_sync(ID) waits until the
 * store has the clear (and every earlier effect). Status views walk the nodes with
 * sluice_engine_backend_count / sluice_engine_backend_id and read
 * sluice_engine_status (a discovery snapshot; fixed nodes show state FIXED,
 * their limit, 0 = unlimited), sluice_engine_status_line ("cloud:x 5/52 📈",
 * fixed "local 2/4", unlimited "free 3/∞") and sluice_engine_events (JSON
 * Lines via sluice/events.h).
 *
 * Progress: create and destroy allocate and free (through the allocator
 * hook) and are not thread-safe; lookups, status, status lines and event
 * reads are wait-free reads; clear and poll take the node's update lock
 * (held for bounded in-memory work) and then run the node's effects (store
 * calls, event callbacks) unless another thread is already running them.
 *
 * Concurrency: after create returns, any number of threads may look up
 * backends, use their pools, and read status, clear, poll or close nodes
 * concurrently, also from async callbacks. Store calls and event callbacks
 * run on the thread whose call caused them (a completion after its permit
 * is released, a clear, a poll, create for "restore") or on a thread
 * already running that node's effects, never under a core lock, one at a
 * time per node and in order. Destroy only once no thread uses the engine
 * (close it first to wake queued calls). Handing the
 * engine pointer to other threads needs the usual happens-before (thread
 * creation, a release store, a lock).
 *
 * Memory ordering: the registry is written only inside create and read-only
 * afterwards, so lookups need no atomics; pools and discovery nodes carry
 * their own ordering.
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include "pool.h"

#define SLUICE_BACKEND_ID_MAX 255          /* bytes in a backend ID, NUL excluded */
#define SLUICE_ENGINE_BACKENDS_MAX 4096    /* consumer registrations per engine */

#define SLUICE_OPENROUTER_ID "openrouter"
#define SLUICE_OPENROUTER_ENDPOINT "https://openrouter.ai/api/v1"
#define SLUICE_OPENROUTER_ACTIVE UINT32_C(16)
#define SLUICE_OPENROUTER_WAITING UINT32_C(1024)

struct sluice_backend_desc {
    const char *id;                /* ID runs select the backend by; copied (required;
                                      1..SLUICE_BACKEND_ID_MAX bytes of UTF-8 text without
                                      control characters, as it names the node in JSON,
                                      /metrics and terminals; unique per engine; an
                                      adaptive backend's ID is its node ID, so at most
                                      SLUICE_NODE_ID_MAX - 1 = 127 bytes) */
    const char *endpoint;          /* endpoint runs use unless they override it; copied
                                      (default: NULL = none) */
    uint32_t active;               /* most generation calls in flight (default: 0 = unlimited;
                                      at most SLUICE_POOL_ACTIVE_MAX) */
    struct sluice_opt_u32 waiting; /* admitted runs beyond `active` (default: 1024 when active
                                      is set; SLUICE_SOME(0) = none; only with active;
                                      at most SLUICE_POOL_WAITING_MAX) */
    /* Ceiling discovery, copied at create (default: NULL = fixed limit at `active`). Needs
     * `active`: the most calls discovery may allow (max_limit defaults to it, may not exceed
     * it). node_id, gate, clock and allocator must be NULL (the engine's are used); store,
     * wall_clock and on_event default to the engine's. */
    const struct sluice_discovery_desc *discovery;
    /* Deadline rules: don't start what cannot finish, refuse at admission what cannot
     * start in time, lingering permits (sluice/pool_deadlines.h, sluice/pool_linger.h;
     * default: start_quantile 10, queue_late off, linger learned, linger_max_ms 30000 once
     * `active` is set; every field needs `active`). */
    struct sluice_deadline_desc deadlines;
};

struct sluice_engine_desc {
    const struct sluice_backend_desc *backends; /* consumer registrations (default: none,
                                                   only the built-in openrouter, or nothing
                                                   with omit_openrouter) */
    size_t n_backends;                          /* entries in backends (default: 0; at most
                                                   SLUICE_ENGINE_BACKENDS_MAX) */
    const struct sluice_allocator *allocator;   /* (default: aligned_alloc/free) */
    const struct sluice_clock *clock;           /* times runs, calls and discovery (default:
                                                   CLOCK_MONOTONIC) */
    const struct sluice_store_ops *store;       /* persists adaptive backends' locks, keyed by
                                                   backend ID; copied (default: NULL = locks
                                                   live in memory only) */
    const struct sluice_clock *wall_clock;      /* ns since the Unix epoch, for lock expiry and
                                                   event stamps (default: CLOCK_REALTIME) */
    sluice_event_fn on_event;                   /* every adaptive backend's events (default:
                                                   none; see sluice/events.h) */
    void *on_event_ctx;
    bool omit_openrouter; /* leave the built-in openrouter backend out: it then appears in no
                             status view (admin page, /metrics, sluicectl) and a run naming
                             "openrouter" is an unknown backend, unless `backends` registers
                             one (default: false = present, active 16, waiting 1024) */
    char *error;       /* receives a message naming the field when create fails
                          (default: NULL = no message); "" on success */
    size_t error_size; /* bytes at error, NUL included (default: 0) */
};

/* One registered backend; engine-owned and immutable. */
struct sluice_backend {
    const char *id;           /* NULL for the endpoint-only backend */
    const char *endpoint;     /* default endpoint, or NULL */
    struct sluice_pool *pool; /* this backend's capacity, never shared */
    bool builtin;             /* the built-in openrouter preset */
    uint64_t sluice__hash;
};

struct sluice_engine {
    struct sluice_backend *backends; /* consumer registrations in order, then the built-in
                                        (NULL when there are none) */
    size_t n_backends;
    struct sluice_backend endpoint_only; /* runs without a backend ID: unlimited */
    uint32_t *index;                     /* open addressing: position + 1; 0 = empty */
    uint32_t index_mask;
    char *strings; /* every ID and endpoint, NUL-terminated */
    size_t strings_size;
    struct sluice_clock clock;
    struct sluice_allocator allocator;
};

/* FNV-1a: IDs are short; any decent spread will do for linear probing. */
SLUICE_INLINE uint64_t sluice__engine_hash(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    return h;
}

/*
 * Backend i's discovery description as its pool gets it: the node ID is the
 * backend ID, and the engine's store, wall clock and event callback fill in
 * what the backend leaves unset. Checked; a failure names the field.
 */
SLUICE_INLINE int sluice__engine_discovery(const struct sluice_engine_desc *d, size_t i,
                                           struct sluice_discovery_desc *out)
{
    const struct sluice_backend_desc *b = &d->backends[i];
    *out = *b->discovery;
    if (out->node_id)
        return sluice__fail(
            d->error, d->error_size,
            "backends[%zu].discovery.node_id must be NULL: the node ID is backends[%zu].id", i, i);
    size_t len = strlen(b->id);
    if (len >= SLUICE_NODE_ID_MAX)
        return sluice__fail(d->error, d->error_size,
                            "backends[%zu].id is %zu bytes, above the maximum %d for an "
                            "adaptive backend (its node ID; SLUICE_NODE_ID_MAX - 1)",
                            i, len, SLUICE_NODE_ID_MAX - 1);
    out->node_id = b->id;
    SLUICE__DEFAULT(out->store, d->store);
    SLUICE__DEFAULT(out->wall_clock, d->wall_clock);
    if (!out->on_event) { /* the callback with its own ctx, or neither */
        out->on_event = d->on_event;
        out->on_event_ctx = d->on_event_ctx;
    }
    char owner[32];
    snprintf(owner, sizeof owner, "backends[%zu]", i);
    return sluice__pool_check_discovery(b->active, out, owner, d->error, d->error_size, NULL);
}

/* The offset of the first byte of `id` that is not UTF-8 or starts a control character
 * (C0, DEL, C1), or strlen(id) when there is none. */
SLUICE_INLINE size_t sluice__engine_id_flaw(const char *id)
{
    const unsigned char *p = (const unsigned char *)id;
    size_t i = 0;
    for (size_t n; p[i]; i += n) {
        n = sluice__utf8_len(p + i);
        if (n == 0 || p[i] < 0x20 || p[i] == 0x7f || (p[i] == 0xc2 && p[i + 1] < 0xa0))
            break;
    }
    return i;
}

/* Every check that needs no allocation; duplicates are caught while indexing. */
SLUICE_INLINE int sluice__engine_check(const struct sluice_engine_desc *d)
{
    if (d->store && (!d->store->load || !d->store->save || !d->store->clear))
        return sluice__fail(d->error, d->error_size, "store needs load, save and clear callbacks");
    if (d->n_backends && !d->backends)
        return sluice__fail(
            d->error, d->error_size,
            "backends is NULL but n_backends is %zu (set backends or n_backends = 0)",
            d->n_backends);
    if (d->n_backends > SLUICE_ENGINE_BACKENDS_MAX)
        return sluice__fail(
            d->error, d->error_size,
            "n_backends = %zu is above the maximum %d (SLUICE_ENGINE_BACKENDS_MAX)",
            d->n_backends, SLUICE_ENGINE_BACKENDS_MAX);
    for (size_t i = 0; i < d->n_backends; i++) {
        const struct sluice_backend_desc *b = &d->backends[i];
        if (!b->id || !b->id[0])
            return sluice__fail(d->error, d->error_size,
                                "backends[%zu].id is %s (every backend needs an ID)", i,
                                b->id ? "empty" : "NULL");
        size_t len = strlen(b->id);
        if (len > SLUICE_BACKEND_ID_MAX)
            return sluice__fail(
                d->error, d->error_size,
                "backends[%zu].id is %zu bytes, above the maximum %d (SLUICE_BACKEND_ID_MAX)",
                i, len, SLUICE_BACKEND_ID_MAX);
        size_t flaw = sluice__engine_id_flaw(b->id);
        if (flaw < len)
            return sluice__fail(
                d->error, d->error_size,
                "backends[%zu].id has %s at byte %zu (an ID must be UTF-8 text without "
                "control characters)",
                i, sluice__utf8_len((const unsigned char *)b->id + flaw) ? "a control character"
                                                                         : "a byte that is not UTF-8",
                flaw);
        char owner[32];
        snprintf(owner, sizeof owner, "backends[%zu]", i);
        if (sluice__pool_check(b->active, b->waiting, owner, d->error, d->error_size) != SLUICE_OK ||
            sluice__pool_check_deadlines(b->active, &b->deadlines, owner, d->error,
                                         d->error_size) != SLUICE_OK)
            return SLUICE_EINVAL;
        struct sluice_discovery_desc discovery;
        if (b->discovery && sluice__engine_discovery(d, i, &discovery) != SLUICE_OK)
            return SLUICE_EINVAL;
    }
    return SLUICE_OK;
}

/* The position of `id` in e->backends, or -1. */
SLUICE_INLINE ptrdiff_t sluice__engine_lookup(const struct sluice_engine *e, const char *id,
                                              uint64_t hash)
{
    for (uint32_t i = (uint32_t)hash & e->index_mask;; i = (i + 1) & e->index_mask) {
        uint32_t slot = e->index[i];
        if (slot == 0)
            return -1;
        const struct sluice_backend *b = &e->backends[slot - 1];
        if (b->sluice__hash == hash && strcmp(b->id, id) == 0)
            return (ptrdiff_t)(slot - 1);
    }
}

/*
 * Resolve a run's backend ID. NULL resolves to the endpoint-only backend
 * (unlimited); an ID nobody registered, or a NULL engine, resolves to NULL.
 * O(1), no allocation.
 */
SLUICE_INLINE const struct sluice_backend *sluice_engine_find(const struct sluice_engine *e,
                                                              const char *id)
{
    if (!e)
        return NULL;
    if (!id)
        return &e->endpoint_only;
    ptrdiff_t pos = sluice__engine_lookup(e, id, sluice__engine_hash(id));
    return pos < 0 ? NULL : &e->backends[pos];
}

/* The pool of backend `id` (NULL: the endpoint-only pool), or NULL if unknown. */
SLUICE_INLINE struct sluice_pool *sluice_engine_pool(const struct sluice_engine *e, const char *id)
{
    const struct sluice_backend *b = sluice_engine_find(e, id);
    return b ? b->pool : NULL;
}

/* Registered backends (built-in included), for status views: 0 <= i < count (0 for NULL). */
SLUICE_INLINE size_t sluice_engine_backend_count(const struct sluice_engine *e)
{
    return e ? e->n_backends : 0;
}

SLUICE_INLINE const struct sluice_backend *sluice_engine_backend_at(const struct sluice_engine *e,
                                                                    size_t i)
{
    return i < sluice_engine_backend_count(e) ? &e->backends[i] : NULL;
}

/* The ID of backend i — a node ID for the calls below — or NULL when i >= count. */
SLUICE_INLINE const char *sluice_engine_backend_id(const struct sluice_engine *e, size_t i)
{
    const struct sluice_backend *b = sluice_engine_backend_at(e, i);
    return b ? b->id : NULL;
}

/* ---- nodes: clear, status, events ------------------------------------------ */

/* The registered backend `node_id`; NULL for a NULL engine, a NULL ID (not a node) or an
 * unknown one. */
SLUICE_INLINE const struct sluice_backend *sluice__engine_node(const struct sluice_engine *e,
                                                               const char *node_id)
{
    return node_id ? sluice_engine_find(e, node_id) : NULL;
}

/*
 * Clear node `node_id`: drop its persisted lock, reset it to probing and
 * move its limit back to the jumpstart, so its next request restarts
 * discovery from there. Calls in flight are not interrupted (their outcomes
 * no longer count); other nodes are untouched. A live Retry-After hold
 * stays in force, and the calls waiting it out keep waiting: it is the
 * provider's word about now, and waking them would only send a burst into
 * more 429s.
 * The store's clear runs after the node's lock is dropped; a store failure
 * is a "store" event, never an error here. Returns SLUICE_OK — also for a
 * fixed node, which it leaves alone — or SLUICE_EINVAL for an unknown or
 * NULL ID or a NULL engine.
 */
SLUICE_INLINE int sluice_engine_clear(struct sluice_engine *e, const char *node_id)
{
    const struct sluice_backend *b = sluice__engine_node(e, node_id);
    return b ? sluice_pool_clear(b->pool) : (int)SLUICE_EINVAL;
}

/*
 * Wait until node `node_id`'s effects recorded before this call (store
 * saves and clears, event deliveries) have run and a store that writes in
 * the background has landed them (sluice_discovery_sync): after a clear,
 * before reading the state file or reporting a node's last events. Blocks;
 * for tools, tests and shutdown, never from an event or store callback (it
 * would wait for itself). Returns SLUICE_OK — also for a fixed node, which
 * has no effects to wait for — or SLUICE_EINVAL for an unknown or NULL ID
 * or a NULL engine.
 */
SLUICE_INLINE int sluice_engine_sync(struct sluice_engine *e, const char *node_id)
{
    const struct sluice_backend *b = sluice__engine_node(e, node_id);
    if (!b)
        return SLUICE_EINVAL;
    struct sluice_discovery *d = sluice_pool_discovery(b->pool);
    if (d)
        sluice_discovery_sync(d);
    return SLUICE_OK;
}

/*
 * A snapshot of node `node_id` (padding zeroed, so snapshots compare with
 * memcmp): an adaptive node's discovery snapshot (sluice/discovery.h); for
 * a fixed node state SLUICE_DISCOVERY_FIXED, its limit (0 = unlimited) and
 * nothing else. in_flight counts calls started and not yet ended (the
 * pool's count), so a call that holds a permit while it waits out a
 * Retry-After hold is not in flight yet. Returns SLUICE_OK, or
 * SLUICE_EINVAL (st zeroed) for an unknown or NULL ID, a NULL engine or a
 * NULL st.
 */
SLUICE_INLINE int sluice_engine_status(const struct sluice_engine *e, const char *node_id,
                                       struct sluice_discovery_status *st)
{
    if (!st)
        return SLUICE_EINVAL;
    memset(st, 0, sizeof *st);
    const struct sluice_backend *b = sluice__engine_node(e, node_id);
    if (!b)
        return SLUICE_EINVAL;
    struct sluice_pool_counts c = sluice_pool_stats(b->pool);
    const struct sluice_discovery *disc = sluice_pool_discovery(b->pool);
    if (disc) {
        sluice_discovery_snapshot(disc, st);
    } else {
        st->node = b->id;
        st->state = SLUICE_DISCOVERY_FIXED;
        st->limit = c.active;
    }
    st->in_flight = c.in_flight;
    return SLUICE_OK;
}

/*
 * Format node `node_id`'s status line, "NODE INFLIGHT/LIMIT GLYPH" with
 * sluice_status_line: "cloud:x 5/52 📈" (probing), "... 🔒" (locked),
 * "... 🌧️" (backoff); a fixed node has no glyph ("local 2/4") and an
 * unlimited one shows its limit as "∞" ("free 3/∞"). snprintf semantics:
 * returns the full length (>= size: truncated), or SLUICE_EINVAL (buf set
 * to "") for an unknown or NULL ID, a NULL engine, or a NULL buf with a
 * nonzero size (NULL with size 0 measures, as with snprintf).
 */
SLUICE_INLINE int sluice_engine_status_line(const struct sluice_engine *e, const char *node_id,
                                            char *buf, size_t size)
{
    struct sluice_discovery_status st;
    int status = !buf && size ? (int)SLUICE_EINVAL : sluice_engine_status(e, node_id, &st);
    if (status != SLUICE_OK) {
        if (buf && size)
            buf[0] = '\0';
        return status;
    }
    return sluice_status_line(buf, size, &st);
}

/*
 * Node `node_id`'s event ring, for sluice_event_ring_read and
 * sluice_event_ring_write_json (JSON Lines); NULL for a fixed node, which
 * has no events, or an unknown or NULL ID.
 */
SLUICE_INLINE const struct sluice_event_ring *sluice_engine_events(const struct sluice_engine *e,
                                                                  const char *node_id)
{
    const struct sluice_backend *b = sluice__engine_node(e, node_id);
    const struct sluice_discovery *disc = b ? sluice_pool_discovery(b->pool) : NULL;
    return disc ? sluice_discovery_events(disc) : NULL;
}

/*
 * Apply time-based transitions to every adaptive node without traffic: a
 * lock whose time to live ran out, a window past window_max_ns
 * (sluice_discovery_poll); and start async calls whose Retry-After hold is
 * over (sluice_pool_poll). Call from a timer if nodes may sit idle. A NULL
 * engine is a no-op.
 */
SLUICE_INLINE void sluice_engine_poll(struct sluice_engine *e)
{
    for (size_t i = 0; i < sluice_engine_backend_count(e); i++) {
        struct sluice_discovery *disc = sluice_pool_discovery(e->backends[i].pool);
        if (disc)
            sluice_discovery_poll(disc);
        sluice_pool_poll(e->backends[i].pool);
    }
}

/*
 * Close every pool (sluice_pool_close): new runs fail with SLUICE_ECLOSED,
 * queued calls wake with SLUICE_ECLOSED, calls in flight finish. Then
 * destroy the engine once no thread uses it. Idempotent; a NULL engine is
 * a no-op.
 */
SLUICE_INLINE void sluice_engine_close(struct sluice_engine *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n_backends; i++)
        sluice_pool_close(e->backends[i].pool);
    sluice_pool_close(e->endpoint_only.pool);
}

/* Free an engine and its pools; tolerates a half-built one. No run may be using it. */
SLUICE_INLINE void sluice_engine_destroy(struct sluice_engine *e)
{
    if (!e)
        return;
    struct sluice_allocator a = e->allocator;
    if (e->backends)
        for (size_t i = 0; i < e->n_backends; i++)
            sluice_pool_destroy(e->backends[i].pool);
    sluice_pool_destroy(e->endpoint_only.pool);
    sluice__free(&a, e->backends, e->n_backends * sizeof *e->backends);
    sluice__free(&a, e->index, ((size_t)e->index_mask + 1) * sizeof *e->index);
    sluice__free(&a, e->strings, e->strings_size);
    sluice__free(&a, e, sizeof *e);
}

/* Copy `s` (may be NULL) into the string arena at *cursor. */
SLUICE_INLINE const char *sluice__engine_copy(char **cursor, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *copy = *cursor;
    memcpy(copy, s, n);
    *cursor += n;
    return copy;
}

/*
 * Copy registrations into e->backends (consumer ones in order, then the
 * built-in unless replaced) and index them. Fails only on a duplicate ID.
 */
SLUICE_INLINE int sluice__engine_register(struct sluice_engine *e,
                                          const struct sluice_engine_desc *d, bool add_builtin)
{
    char *cursor = e->strings;
    for (size_t i = 0; i < e->n_backends; i++) {
        struct sluice_backend *b = &e->backends[i];
        bool builtin = add_builtin && i == d->n_backends;
        b->id = sluice__engine_copy(&cursor, builtin ? SLUICE_OPENROUTER_ID : d->backends[i].id);
        b->endpoint = sluice__engine_copy(&cursor, builtin ? SLUICE_OPENROUTER_ENDPOINT
                                                           : d->backends[i].endpoint);
        b->builtin = builtin;
        b->sluice__hash = sluice__engine_hash(b->id);
        ptrdiff_t dup = sluice__engine_lookup(e, b->id, b->sluice__hash);
        if (dup >= 0)
            return sluice__fail(d->error, d->error_size,
                                "backends[%zu].id \"%s\" duplicates backends[%td].id "
                                "(backend IDs must be unique)",
                                i, b->id, dup);
        uint32_t slot = (uint32_t)b->sluice__hash & e->index_mask;
        while (e->index[slot])
            slot = (slot + 1) & e->index_mask;
        e->index[slot] = (uint32_t)i + 1;
    }
    return SLUICE_OK;
}

/* Give every backend and the endpoint-only backend its own pool. */
SLUICE_INLINE int sluice__engine_make_pools(struct sluice_engine *e,
                                            const struct sluice_engine_desc *d, bool add_builtin)
{
    struct sluice_pool_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.allocator = d->allocator;
    pd.clock = d->clock;
    if (sluice_pool_create(&pd, &e->endpoint_only.pool) != SLUICE_OK)
        return SLUICE_ENOMEM;
    for (size_t i = 0; i < e->n_backends; i++) {
        if (add_builtin && i == d->n_backends) {
            pd.active = SLUICE_OPENROUTER_ACTIVE;
            pd.waiting.set = true;
            pd.waiting.value = SLUICE_OPENROUTER_WAITING;
        } else {
            pd.active = d->backends[i].active;
            pd.waiting = d->backends[i].waiting;
            pd.deadlines = d->backends[i].deadlines;
        }
        struct sluice_discovery_desc discovery;
        pd.discovery = NULL;
        if (!(add_builtin && i == d->n_backends) && d->backends[i].discovery) {
            sluice__engine_discovery(d, i, &discovery); /* checked by sluice__engine_check */
            discovery.node_id = e->backends[i].id;
            pd.discovery = &discovery;
        }
        int status = sluice_pool_create(&pd, &e->backends[i].pool);
        if (status != SLUICE_OK)
            return status;
    }
    return SLUICE_OK;
}

/*
 * Create an engine from `desc` (required: a NULL desc would silently give
 * an engine without the caller's backends; `&(struct sluice_engine_desc){0}`
 * is the engine with only the built-in openrouter) into *out (required).
 * Returns SLUICE_OK, SLUICE_EINVAL (message in desc->error; a NULL desc has
 * nowhere to put one) or SLUICE_ENOMEM; on failure *out is NULL (when out
 * is not) and nothing is left allocated. Each adaptive backend's node loads
 * its lock from the store here; a live one is restored at once (its
 * "restore" event reaches on_event before this returns).
 */
SLUICE_INLINE int sluice_engine_create(const struct sluice_engine_desc *desc,
                                       struct sluice_engine **out)
{
    if (out)
        *out = NULL;
    if (!desc)
        return SLUICE_EINVAL;
    struct sluice_engine_desc d = *desc;
    if (d.error && d.error_size)
        d.error[0] = '\0';
    if (!out)
        return sluice__fail(d.error, d.error_size,
                            "out is NULL (pass the address of a struct sluice_engine * to "
                            "receive the engine)");
    if (!sluice__allocator_valid(d.allocator))
        return sluice__fail(d.error, d.error_size,
                            "allocator sets only one of alloc and free (set both, or pass NULL "
                            "for the default)");
    int status = sluice__engine_check(&d);
    if (status != SLUICE_OK)
        return status;
    bool add_builtin = !d.omit_openrouter;
    size_t strings = sizeof SLUICE_OPENROUTER_ID + sizeof SLUICE_OPENROUTER_ENDPOINT;
    for (size_t i = 0; i < d.n_backends; i++) {
        const struct sluice_backend_desc *b = &d.backends[i];
        if (strcmp(b->id, SLUICE_OPENROUTER_ID) == 0)
            add_builtin = false;
        strings += strlen(b->id) + 1 + (b->endpoint ? strlen(b->endpoint) + 1 : 0);
    }
    struct sluice_engine *e =
        (struct sluice_engine *)sluice__alloc(d.allocator, sizeof *e, SLUICE_CACHELINE);
    if (!e)
        return SLUICE_ENOMEM;
    memset((void *)e, 0, sizeof *e);
    if (d.allocator)
        e->allocator = *d.allocator;
    if (d.clock)
        e->clock = *d.clock;
    size_t n = d.n_backends + (add_builtin ? 1 : 0);
    size_t index_size = (size_t)sluice_next_pow2(2 * n);
    /* Zeroed as soon as they exist: destroy must be able to undo any prefix. No backend at
     * all (omit_openrouter, none registered) allocates no array. */
    e->backends = n ? (struct sluice_backend *)sluice__alloc(
                          d.allocator, n * sizeof *e->backends, SLUICE_CACHELINE)
                    : NULL;
    if (e->backends) {
        memset((void *)e->backends, 0, n * sizeof *e->backends);
        e->n_backends = n;
    }
    e->index = (uint32_t *)sluice__alloc(d.allocator, index_size * sizeof *e->index,
                                         SLUICE_CACHELINE);
    if (e->index) {
        memset(e->index, 0, index_size * sizeof *e->index);
        e->index_mask = (uint32_t)(index_size - 1);
    }
    e->strings = (char *)sluice__alloc(d.allocator, strings, SLUICE_CACHELINE);
    e->strings_size = strings;
    status = SLUICE_ENOMEM;
    if ((e->backends || !n) && e->index && e->strings) {
        status = sluice__engine_register(e, &d, add_builtin);
        if (status == SLUICE_OK)
            status = sluice__engine_make_pools(e, &d, add_builtin);
    }
    if (status != SLUICE_OK) {
        sluice_engine_destroy(e);
        return status;
    }
    *out = e;
    return SLUICE_OK;
}

#endif /* SLUICE_ENGINE_H */
