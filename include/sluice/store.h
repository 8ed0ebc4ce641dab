/*
 * sluice/store.h — the seam between the core and persistence: the lock
 * record a node saves, the store interface it saves through, and an
 * in-memory store.
 *
 * What it is: discovery (sluice/discovery.h) persists a node's locked
 * ceiling through `struct sluice_store_ops`, keyed by node ID, so a
 * restarted process resumes at the ceiling instead of probing again. The
 * shim's state file (sluice/statefile.h) implements these ops on disk; the
 * memory store below implements them in a fixed table, for tests and for
 * embedders who do not persist.
 *
 * Which thread calls a store: discovery calls load while a node is
 * initialised, and save and clear from sluice_discovery_flush — on the
 * thread whose call caused the change (a completion after its permit was
 * released, a clear, a poll) or on another thread already flushing that
 * node — never under a core lock and never twice at once for one node.
 * Different nodes may share one store, which must then be thread-safe
 * (the memory store is). A store may block (disk, network): nobody waits
 * for it but the thread that runs it and sluice_discovery_sync. A store
 * whose writes must stay off those threads altogether (the state file:
 * call_end may run on an event loop) hands save and clear to a thread of
 * its own and returns, and implements `sync`, which sluice_discovery_sync
 * calls on its own thread to wait until the node's writes have landed.
 *
 * Progress: the memory store takes a spinlock around a linear scan of its
 * table (capacity entries): bounded, short, blocking.
 *
 * Memory ordering: the memory store's spinlock (acquire/release) orders
 * every access to its table; the counters it keeps are read under it.
 */
#ifndef SLUICE_STORE_H
#define SLUICE_STORE_H

#include <string.h>

#include "cc.h"
#include "status.h"

#define SLUICE_NODE_ID_MAX 128    /* bytes, terminator included */
#define SLUICE_POLICY_NAME_MAX 32 /* bytes of sluice_lock_record.policy, terminator included */

/* A persisted lock. ceiling 0 means "no record". */
struct sluice_lock_record {
    uint32_t ceiling;
    int64_t expires_s;   /* wall clock, seconds since the Unix epoch */
    int64_t locked_at_s; /* when the ceiling was locked (same clock); 0 = unknown (an older
                            record), trusted as "not in the future" */
    char policy[SLUICE_POLICY_NAME_MAX]; /* the policy that found it ("discover"), NUL-terminated;
                                            informational: a restore does not check it */
};

/*
 * Persistence of locks, keyed by node id. Every callback returns SLUICE_OK
 * or an error status; load reports "nothing stored" as SLUICE_OK with
 * out->ceiling = 0, and stored data it cannot read (corrupt) as
 * SLUICE_EINVAL, which the "store" event names store_corrupt (any other
 * error is store_error); the store keeps the text that says what. See the header comment for the thread each runs on.
 * A failing store never stops discovery: the node keeps its lock in memory
 * and reports the failure as a "store" event (sluice/events.h).
 */
struct sluice_store_ops {
    int (*load)(void *ctx, const char *node, struct sluice_lock_record *out);
    int (*save)(void *ctx, const char *node, const struct sluice_lock_record *rec);
    int (*clear)(void *ctx, const char *node);
    void *ctx;
    /* For a store that writes in the background: wait until every save and
     * clear of `node` handed to it so far has landed; return SLUICE_OK, or
     * the error of one that failed and was not yet returned by a later save
     * or clear (each failure is reported once, so it becomes one "store"
     * event). (default: NULL = save and clear have landed when they return) */
    int (*sync)(void *ctx, const char *node);
};

/* ---- the memory store ------------------------------------------------------ */

/* A fixed table of records, thread-safe behind a spinlock. */
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

/* Initialise over caller storage: `entries` holds `capacity` records. */
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

/* Allocate and initialise a memory store of `capacity` records. */
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

/* Free a memory store made by sluice_memstore_create. */
SLUICE_INLINE void sluice_memstore_destroy(struct sluice_memstore *m)
{
    if (!m || !m->owns_memory)
        return;
    struct sluice_allocator a = m->allocator;
    sluice__free(&a, m->entries, (size_t)m->capacity * sizeof *m->entries);
    sluice__free(&a, m, sizeof *m);
}

/* The entry for `node`, or (when `claim`) a free one; NULL if none. */
SLUICE_INLINE struct sluice_memstore_entry *sluice__memstore_find_locked(struct sluice_memstore *m,
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
    struct sluice_memstore_entry *e = sluice__memstore_find_locked(m, node, false);
    if (e)
        *out = e->rec;
    else
        memset(out, 0, sizeof *out);
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
    struct sluice_memstore_entry *e = sluice__memstore_find_locked(m, node, true);
    if (e) {
        strcpy(e->node, node);
        e->rec = *rec;
        e->rec.policy[SLUICE_POLICY_NAME_MAX - 1] = '\0';
        m->saves++;
    }
    sluice_spinlock_unlock(&m->lock);
    return e ? SLUICE_OK : SLUICE_ENOMEM;
}

SLUICE_INLINE int sluice__memstore_clear(void *ctx, const char *node)
{
    struct sluice_memstore *m = (struct sluice_memstore *)ctx;
    sluice_spinlock_lock(&m->lock);
    struct sluice_memstore_entry *e = sluice__memstore_find_locked(m, node, false);
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
    ops.sync = NULL; /* its writes land before they return */
    return ops;
}

#endif /* SLUICE_STORE_H */
