/*
 * fuzz_engine_config — sluice_engine_create with any description: up to 8
 * backends with fuzzed IDs (empty, long, non-ASCII, duplicated, the
 * built-in "openrouter"), endpoints, active and waiting limits, and
 * discovery descriptions whose every field and policy parameter is fuzzed
 * (NaN, infinities, limits and their neighbours, uninitialised policies);
 * a store whose stored locks are fuzzed too (restored during create), an
 * allocator that fails on a chosen allocation, and an error buffer of any
 * size.
 *
 * Checked for every input:
 *   - the status is OK, EINVAL or ENOMEM (ENOMEM only when the allocator
 *     refused), and on failure *out is NULL and nothing is left allocated;
 *   - EINVAL writes a NUL-terminated message within error_size that names
 *     the field to fix (it mentions backends, store or allocator); OK
 *     leaves "" there;
 *   - after OK, every backend is found by its ID, its pool carries the
 *     configured limits (active, waiting with its 1024 default), an
 *     adaptive one sits in [min_limit, active]; when small enough, exactly
 *     limit + waiting admissions succeed; status lines fit any buffer and
 *     stay NUL-terminated; and destroy frees every allocation.
 */
#include <stdio.h>
#include <stdlib.h>

#include <sluice/sluice.h>

#include "fuzz_input.h"

#define MAX_BACKENDS 8

/* ---- an allocator that counts and fails on request -------------------------------- */

struct fuzz_alloc {
    long allocs, frees, fail_at; /* fail_at: the allocation number to refuse (0 = none) */
};

static void *fa_alloc(void *ctx, size_t size, size_t align)
{
    struct fuzz_alloc *a = ctx;
    if (++a->allocs == a->fail_at)
        return NULL;
    size_t rounded = (size + align - 1) / align * align;
    return aligned_alloc(align, rounded ? rounded : align);
}

static void fa_free(void *ctx, void *ptr, size_t size)
{
    (void)size;
    struct fuzz_alloc *a = ctx;
    if (ptr)
        a->frees++;
    free(ptr);
}

/* ---- a store whose records come from the input ------------------------------------- */

struct fuzz_store {
    struct sluice_lock_record rec[MAX_BACKENDS];
    int load_status[MAX_BACKENDS];
    char nodes[MAX_BACKENDS][SLUICE_NODE_ID_MAX];
    int n;
};

static int fs_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    struct fuzz_store *s = ctx;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->nodes[i], node)) {
            *out = s->rec[i];
            return s->load_status[i];
        }
    return SLUICE_OK;
}

static int fs_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    (void)ctx, (void)node, (void)rec;
    return SLUICE_OK;
}

static int fs_clear(void *ctx, const char *node)
{
    (void)ctx, (void)node;
    return SLUICE_OK;
}

/* ---- building a description ---------------------------------------------------------- */

union any_policy {
    struct sluice_policy base;
    struct sluice_policy_aimd aimd;
    struct sluice_policy_discover discover;
    struct sluice_policy_fixed fixed;
    struct sluice_policy_gradient gradient;
    struct sluice_policy_vegas vegas;
};

/* A policy prototype: none, never initialised, or a built-in with fuzzed parameters
 * (left as init left it when a parameter is refused). */
static const struct sluice_policy *make_policy(struct fuzz_in *in, union any_policy *p)
{
    memset(p, 0, sizeof *p);
    char why[256]; /* written as a caller's would be, never read: a refused init is input too */
    switch (fuzz_pick(in, 7)) {
    case 0:
        return NULL;
    case 1:
        return &p->base; /* ops == NULL: never initialised */
    case 2: {
        struct sluice_policy_aimd_params k = {fuzz_double(in), fuzz_u32(in), fuzz_i64(in)};
        sluice_policy_aimd_init(&p->aimd, fuzz_bool(in) ? &k : NULL, why, sizeof why);
        return &p->base;
    }
    case 3: {
        struct sluice_policy_discover_params k = {fuzz_double(in), fuzz_double(in),
                                                  fuzz_double(in), fuzz_double(in),
                                                  fuzz_double(in), fuzz_u32(in), fuzz_u32(in)};
        sluice_policy_discover_init(&p->discover, fuzz_bool(in) ? &k : NULL, why, sizeof why);
        return &p->base;
    }
    case 4: {
        struct sluice_policy_fixed_params k = {fuzz_u32(in)};
        sluice_policy_fixed_init(&p->fixed, &k, why, sizeof why);
        return &p->base;
    }
    case 5: {
        struct sluice_policy_gradient_params k = {fuzz_double(in), fuzz_double(in),
                                                  fuzz_double(in), fuzz_double(in),
                                                  fuzz_double(in)};
        sluice_policy_gradient_init(&p->gradient, &k, why, sizeof why);
        return &p->base;
    }
    default: {
        struct sluice_policy_vegas_params k = {fuzz_double(in), fuzz_double(in), fuzz_double(in),
                                               fuzz_double(in)};
        sluice_policy_vegas_init(&p->vegas, &k, why, sizeof why);
        return &p->base;
    }
    }
}

static void make_discovery(struct fuzz_in *in, struct sluice_discovery_desc *dd,
                           union any_policy *policy)
{
    memset(dd, 0, sizeof *dd);
    dd->policy = make_policy(in, policy);
    uint8_t fields = fuzz_u8(in); /* which fields are set at all: most inputs leave defaults */
    if (fields & 1) {
        dd->jumpstart = fuzz_u32(in);
        dd->min_limit = fuzz_u32(in);
        dd->max_limit = fuzz_u32(in);
    }
    if (fields & 2) {
        dd->lock_ttl_s = fuzz_i64(in);
        dd->retry_after_max_ns = fuzz_i64(in);
    }
    if (fields & 4) {
        dd->window_min_ns = fuzz_i64(in);
        dd->window_max_ns = fuzz_i64(in);
        dd->window_samples = fuzz_u32(in);
    }
    if (fields & 8) {
        dd->window_span = fuzz_double(in);
        dd->window_tail = fuzz_double(in);
    }
    if (fields & 16) { /* not the accepted maximum: 2^20 events per node is a lot of memory */
        static const uint32_t events[] = {0, 1, 3, 256, 4096, SLUICE_DISCOVERY_EVENTS_MAX + 1,
                                          UINT32_MAX};
        uint32_t k = fuzz_pick(in, 8);
        dd->events = k < 7 ? events[k] : fuzz_u32(in) % 8192;
    }
    if (fields & 32) /* fields the engine owns: must be refused */
        dd->node_id = "mine";
    if (fields & 64)
        dd->clock = &(const struct sluice_clock){0};
}

static const char *const known_ids[] = {"openrouter", "cloud:a", "cloud:b", "local:gpu", "",
                                        "cloud:a"};

/* ---- checks ---------------------------------------------------------------------------- */

static void check(bool ok, const char *what, const char *detail)
{
    if (!ok) {
        fprintf(stderr, "fuzz_engine_config: %s (%s)\n", what, detail ? detail : "");
        abort();
    }
}

/* Exactly limit + waiting admissions succeed (when that is small enough to try). */
static void check_admission(struct sluice_pool *p)
{
    struct sluice_pool_counts c = sluice_pool_stats(p);
    if (!c.active_max || (uint64_t)c.active + c.waiting_capacity > 4096)
        return;
    uint32_t n = 0;
    while (n <= c.active + c.waiting_capacity && sluice_pool_admit(p) == SLUICE_OK)
        n++;
    check(n == c.active + c.waiting_capacity, "admission capacity is limit + waiting", NULL);
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_leave(p);
}

static void check_engine(struct sluice_engine *e, const struct sluice_backend_desc *b, size_t n,
                         struct fuzz_in *in)
{
    for (size_t i = 0; i < n; i++) {
        struct sluice_pool *p = sluice_engine_pool(e, b[i].id);
        check(p != NULL, "every backend is found by its ID", b[i].id);
        struct sluice_pool_counts c = sluice_pool_stats(p);
        check(c.active_max == b[i].active, "the pool has the configured active", b[i].id);
        uint32_t waiting = b[i].active ? (b[i].waiting.set ? b[i].waiting.value : 1024u) : 0u;
        check(c.waiting_capacity == waiting, "the pool has the configured waiting", b[i].id);
        if (b[i].discovery)
            check(c.active >= 1 && c.active <= b[i].active, "an adaptive limit is in 1..active",
                  b[i].id);
        else
            check(c.active == b[i].active, "a fixed limit is active", b[i].id);
        check_admission(p);
        char line[96];
        size_t size = fuzz_pick(in, sizeof line + 1);
        memset(line, 'Z', sizeof line);
        int len = sluice_engine_status_line(e, b[i].id, size ? line : NULL, size);
        check(len >= 0, "a status line for a known node", b[i].id);
        if (size)
            check(memchr(line, '\0', size) != NULL, "a status line is NUL-terminated in size",
                  b[i].id);
    }
    check(sluice_engine_pool(e, "no such backend, surely") == NULL, "unknown IDs find nothing",
          NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    static char ids[MAX_BACKENDS][300], endpoints[MAX_BACKENDS][64];
    struct sluice_backend_desc b[MAX_BACKENDS];
    struct sluice_discovery_desc dd[MAX_BACKENDS];
    union any_policy policies[MAX_BACKENDS];
    memset(b, 0, sizeof b);
    size_t n = fuzz_pick(&in, MAX_BACKENDS + 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t how = fuzz_u8(&in);
        if (how % 8 == 0)
            b[i].id = NULL;
        else if (how % 8 < 4)
            b[i].id = known_ids[fuzz_pick(&in, sizeof known_ids / sizeof known_ids[0])];
        else
            b[i].id = fuzz_str(&in, ids[i], sizeof ids[i] - 1);
        b[i].endpoint = how & 8 ? fuzz_str(&in, endpoints[i], sizeof endpoints[i] - 1) : NULL;
        b[i].active = fuzz_u32(&in);
        if (how & 16) {
            b[i].waiting.set = true;
            b[i].waiting.value = fuzz_u32(&in);
        }
        if (how & 32) {
            make_discovery(&in, &dd[i], &policies[i]);
            b[i].discovery = &dd[i];
        }
    }
    uint8_t opts = fuzz_u8(&in);
    struct fuzz_alloc fa = {0, 0, opts & 1 ? (long)fuzz_pick(&in, 16) + 1 : 0};
    struct sluice_allocator alloc = {fa_alloc, fa_free, &fa};
    struct sluice_allocator half = {fa_alloc, NULL, &fa};
    struct fuzz_store fs;
    memset(&fs, 0, sizeof fs);
    struct sluice_store_ops store = {fs_load, fs_save, fs_clear, &fs, NULL};
    if (opts & 2) {
        fs.n = (int)n;
        for (size_t i = 0; i < n; i++) {
            if (b[i].id)
                snprintf(fs.nodes[i], sizeof fs.nodes[i], "%s", b[i].id);
            fs.rec[i].ceiling = fuzz_u32(&in);
            fs.rec[i].locked_at_s = fuzz_i64(&in);
            fs.rec[i].expires_s = fuzz_i64(&in);
            fs.load_status[i] = fuzz_bool(&in) ? SLUICE_EIO : SLUICE_OK;
        }
    }
    char error[300];
    size_t error_size = opts & 4 ? fuzz_pick(&in, sizeof error + 1) : sizeof error;
    memset(error, 'Z', sizeof error);
    struct sluice_engine_desc d = {
        .backends = opts & 8 ? NULL : b,
        .n_backends = opts & 16 ? (size_t)fuzz_u32(&in) : n,
        .allocator = opts & 32 ? &half : &alloc,
        .store = opts & 2 ? &store : NULL,
        .error = error_size ? error : NULL,
        .error_size = error_size,
    };
    if (d.backends && d.n_backends > n)
        d.n_backends = n; /* the array really has n entries */
    struct sluice_engine *e = (struct sluice_engine *)&d; /* must be overwritten */
    int status = sluice_engine_create(&d, &e);

    check(status == SLUICE_OK || status == SLUICE_EINVAL || status == SLUICE_ENOMEM,
          "create returns OK, EINVAL or ENOMEM", sluice_status_name(status));
    check(status != SLUICE_ENOMEM || (fa.fail_at && fa.allocs >= fa.fail_at),
          "ENOMEM only when the allocator refused", NULL);
    if (error_size)
        check(memchr(error, '\0', error_size) != NULL, "the message is NUL-terminated in size",
              NULL);
    if (status == SLUICE_EINVAL && error_size >= 12) /* the field leads every message */
        check(strstr(error, "backends") || strstr(error, "store") || strstr(error, "allocator"),
              "an EINVAL message names the field", error);
    if (status != SLUICE_OK) {
        check(e == NULL, "*out is NULL on failure", NULL);
        check(fa.allocs - (fa.fail_at && fa.allocs >= fa.fail_at) == fa.frees,
              "a failed create frees what it allocated", NULL);
        return 0;
    }
    if (error_size)
        check(error[0] == '\0', "success leaves \"\" in error", error);
    check_engine(e, d.backends, d.n_backends, &in);
    sluice_engine_close(e);
    sluice_engine_destroy(e);
    check(fa.allocs == fa.frees, "destroy frees every allocation", NULL);
    return 0;
}
