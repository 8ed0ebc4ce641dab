/*
 * sluice/engine.h — the backend registry: every backend a program talks to,
 * each with its own capacity pool, fixed when the engine is created.
 *
 * What it is: sluice_engine_create() copies a description holding every
 * backend registration (ID, default endpoint, active and waiting limits) into
 * immutable engine-owned state and creates one pool (sluice/pool.h) per
 * backend. Runs name their backend by ID; sluice_engine_find() resolves it in
 * O(1) without allocating (open addressing over a table built at create).
 *
 * Policy rules (from reference/backend-concurrency.md):
 *   - the built-in backend "openrouter" is present in every engine with
 *     active 16 and waiting 1024;
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
 * Progress: create and destroy allocate and free (through the allocator
 * hook) and are not thread-safe; everything else is wait-free reads of
 * immutable state.
 *
 * Concurrency: after create returns, any number of threads may look up
 * backends and use their pools concurrently. Destroy only once no thread
 * uses the engine. Handing the engine pointer to other threads needs the
 * usual happens-before (thread creation, a release store, a lock).
 *
 * Memory ordering: the registry is written only inside create and read-only
 * afterwards, so lookups need no atomics; pools carry their own ordering.
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include <stdarg.h>

#include "pool.h"

#define SLUICE_BACKEND_ID_MAX 255          /* bytes in a backend ID, NUL excluded */
#define SLUICE_ENGINE_BACKENDS_MAX 4096    /* consumer registrations per engine */

#define SLUICE_OPENROUTER_ID "openrouter"
#define SLUICE_OPENROUTER_ENDPOINT "https://openrouter.ai/api/v1"
#define SLUICE_OPENROUTER_ACTIVE UINT32_C(16)
#define SLUICE_OPENROUTER_WAITING UINT32_C(1024)

struct sluice_backend_desc {
    const char *id;                /* ID runs select the backend by; copied (required;
                                      1..SLUICE_BACKEND_ID_MAX bytes, unique per engine) */
    const char *endpoint;          /* endpoint runs use unless they override it; copied
                                      (default: NULL = none) */
    uint32_t active;               /* most generation calls in flight (default: 0 = unlimited;
                                      at most SLUICE_POOL_ACTIVE_MAX) */
    struct sluice_opt_u32 waiting; /* admitted runs beyond `active` (default: 1024 when active
                                      is set; SLUICE_SOME(0) = none; only with active;
                                      at most SLUICE_POOL_WAITING_MAX) */
};

struct sluice_engine_desc {
    const struct sluice_backend_desc *backends; /* consumer registrations (default: none,
                                                   only the built-in openrouter) */
    size_t n_backends;                          /* entries in backends (default: 0; at most
                                                   SLUICE_ENGINE_BACKENDS_MAX) */
    const struct sluice_allocator *allocator;   /* (default: aligned_alloc/free) */
    const struct sluice_clock *clock;           /* times runs and calls (default:
                                                   CLOCK_MONOTONIC) */
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
    struct sluice_backend *backends; /* consumer registrations in order, then the built-in */
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

/* Writes the formatted message to desc->error (if any) and returns SLUICE_EINVAL. */
SLUICE_INLINE int sluice__engine_fail(const struct sluice_engine_desc *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
SLUICE_INLINE int sluice__engine_fail(const struct sluice_engine_desc *d, const char *fmt, ...)
{
    if (d->error && d->error_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->error, d->error_size, fmt, ap);
        va_end(ap);
    }
    return SLUICE_EINVAL;
}

/* Every check that needs no allocation; duplicates are caught while indexing. */
SLUICE_INLINE int sluice__engine_check(const struct sluice_engine_desc *d)
{
    if (d->n_backends && !d->backends)
        return sluice__engine_fail(
            d, "backends is NULL but n_backends is %zu (set backends or n_backends = 0)",
            d->n_backends);
    if (d->n_backends > SLUICE_ENGINE_BACKENDS_MAX)
        return sluice__engine_fail(
            d, "n_backends = %zu is above the maximum %d (SLUICE_ENGINE_BACKENDS_MAX)",
            d->n_backends, SLUICE_ENGINE_BACKENDS_MAX);
    for (size_t i = 0; i < d->n_backends; i++) {
        const struct sluice_backend_desc *b = &d->backends[i];
        if (!b->id || !b->id[0])
            return sluice__engine_fail(
                d, "backends[%zu].id is %s (every backend needs an ID)", i,
                b->id ? "empty" : "NULL");
        size_t len = strlen(b->id);
        if (len > SLUICE_BACKEND_ID_MAX)
            return sluice__engine_fail(
                d, "backends[%zu].id is %zu bytes, above the maximum %d (SLUICE_BACKEND_ID_MAX)",
                i, len, SLUICE_BACKEND_ID_MAX);
        char owner[32];
        snprintf(owner, sizeof owner, "backends[%zu]", i);
        if (sluice__pool_check(b->active, b->waiting, owner, d->error, d->error_size) != SLUICE_OK)
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
 * (unlimited); an ID nobody registered resolves to NULL. O(1), no allocation.
 */
SLUICE_INLINE const struct sluice_backend *sluice_engine_find(const struct sluice_engine *e,
                                                              const char *id)
{
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

/* Registered backends (built-in included), for status views: 0 <= i < count. */
SLUICE_INLINE size_t sluice_engine_backend_count(const struct sluice_engine *e)
{
    return e->n_backends;
}

SLUICE_INLINE const struct sluice_backend *sluice_engine_backend_at(const struct sluice_engine *e,
                                                                    size_t i)
{
    return i < e->n_backends ? &e->backends[i] : NULL;
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
            return sluice__engine_fail(d,
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
        }
        int status = sluice_pool_create(&pd, &e->backends[i].pool);
        if (status != SLUICE_OK)
            return status;
    }
    return SLUICE_OK;
}

/*
 * Create an engine from `desc` (NULL = only the built-in openrouter).
 * Returns SLUICE_OK, SLUICE_EINVAL (message in desc->error) or SLUICE_ENOMEM;
 * on failure *out is NULL and nothing is left allocated.
 */
SLUICE_INLINE int sluice_engine_create(const struct sluice_engine_desc *desc,
                                       struct sluice_engine **out)
{
    struct sluice_engine_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    *out = NULL;
    if (d.error && d.error_size)
        d.error[0] = '\0';
    int status = sluice__engine_check(&d);
    if (status != SLUICE_OK)
        return status;
    bool add_builtin = true;
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
    /* Zeroed as soon as they exist: destroy must be able to undo any prefix. */
    e->backends = (struct sluice_backend *)sluice__alloc(d.allocator, n * sizeof *e->backends,
                                                         SLUICE_CACHELINE);
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
    if (e->backends && e->index && e->strings) {
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
