/*
 * statefile_store.c — the state file as a store: load, foreach, save,
 * clear, sync and the store ops. Saves and clears are handed to a writer
 * thread of the handle (started at the first write), which writes each
 * node's newest record, round robin, so a save's disk
 * I/O never runs on the thread that saves (the engine's call_end, a curl
 * loop). sluice_statefile_save/clear wait for their write to land; the
 * store ops (sluice_statefile_ops) return at once and report a background
 * failure at the node's next save or sync. Without a writer thread (it
 * could not be started) a write runs on the caller's thread.
 */
#include "statefile_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The next node with a record not yet written, round robin so that no node's
 * stream of saves starves another's; NULL if none. Call under wmu. */
static struct sluice__sf_pending *sf_next_queued(struct sluice_statefile *f)
{
    for (size_t i = 0; i < f->n_pending; i++) {
        struct sluice__sf_pending *e = &f->pending[(f->cursor + i) % f->n_pending];
        if (e->queued > e->landed) {
            f->cursor = (size_t)(e - f->pending) + 1;
            return e;
        }
    }
    return NULL;
}

/* Write each node's newest record until the queue is empty and close asks to stop. */
static void *sf_writer(void *arg)
{
    struct sluice_statefile *f = arg;
    pthread_mutex_lock(&f->wmu);
    for (;;) {
        struct sluice__sf_pending *e = sf_next_queued(f);
        if (!e) {
            if (f->stopping)
                break;
            pthread_cond_wait(&f->work, &f->wmu);
            continue;
        }
        size_t at = (size_t)(e - f->pending); /* the array may move while we write */
        char node[SLUICE_NODE_ID_MAX];
        memcpy(node, e->node, sizeof node);
        struct sluice_lock_record rec = e->rec;
        uint64_t seq = e->queued;
        pthread_mutex_unlock(&f->wmu);
        int status = sluice__sf_modify(f, node, rec.ceiling ? &rec : NULL);
        pthread_mutex_lock(&f->wmu);
        e = &f->pending[at];
        e->landed = seq;
        e->last_status = status;
        if (status != SLUICE_OK) {
            e->unreported = status;
            e->unreported_seq = seq;
        }
        pthread_cond_broadcast(&f->landed);
    }
    pthread_mutex_unlock(&f->wmu);
    return NULL;
}

/* The pending entry of `node`, made if needed; NULL when out of memory. Call under wmu. */
static struct sluice__sf_pending *sf_entry(struct sluice_statefile *f, const char *node, bool make)
{
    for (size_t i = 0; i < f->n_pending; i++)
        if (!strcmp(f->pending[i].node, node))
            return &f->pending[i];
    if (!make)
        return NULL;
    if (f->n_pending == f->cap_pending) {
        size_t cap = f->cap_pending ? 2 * f->cap_pending : 8;
        struct sluice__sf_pending *grown = realloc(f->pending, cap * sizeof *grown);
        if (!grown)
            return NULL;
        f->pending = grown;
        f->cap_pending = cap;
    }
    struct sluice__sf_pending *e = &f->pending[f->n_pending++];
    memset(e, 0, sizeof *e);
    snprintf(e->node, sizeof e->node, "%s", node);
    return e;
}

/*
 * Hand `node`'s record (rec NULL: drop it) to the writer thread, replacing
 * any record of that node it has not written yet. Returns SLUICE_OK and the
 * write's ticket in *ticket; SLUICE_EAGAIN when there is no writer thread
 * (it could not be started: the caller writes itself); or SLUICE_ENOMEM.
 * *reported (NULL: leave it for someone else) takes a background failure of
 * that node nobody was told of yet.
 */
static int sf_enqueue(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec, uint64_t *ticket, int *reported)
{
    int status = SLUICE_OK;
    pthread_mutex_lock(&f->wmu);
    if (!f->writer_running && !f->writer_failed) {
        if (pthread_create(&f->writer, NULL, sf_writer, f) == 0)
            f->writer_running = true;
        else
            f->writer_failed = true;
    }
    struct sluice__sf_pending *e = f->writer_running ? sf_entry(f, node, true) : NULL;
    if (!f->writer_running) {
        status = SLUICE_EAGAIN;
    } else if (!e) {
        status = SLUICE_ENOMEM;
    } else {
        if (rec)
            e->rec = *rec;
        else
            memset(&e->rec, 0, sizeof e->rec);
        e->queued = *ticket = ++f->seq;
        if (reported) {
            *reported = e->unreported;
            e->unreported = SLUICE_OK;
        }
        pthread_cond_signal(&f->work);
    }
    pthread_mutex_unlock(&f->wmu);
    if (status == SLUICE_ENOMEM) {
        pthread_mutex_lock(&f->mu);
        status = sluice__sf_fail(
            f, SLUICE_ENOMEM, "%s: out of memory queueing the write of node \"%s\"", f->path, node);
        pthread_mutex_unlock(&f->mu);
    }
    return status;
}

/*
 * Wait until `node`'s write `ticket` (or a newer one) has landed. Returns
 * that write's status, or (report_any) the background failure nobody was
 * told of yet, if any; either way that failure counts as told.
 */
static int sf_wait(struct sluice_statefile *f, const char *node, uint64_t ticket, bool report_any)
{
    pthread_mutex_lock(&f->wmu);
    struct sluice__sf_pending *e = sf_entry(f, node, false);
    size_t at = e ? (size_t)(e - f->pending) : 0;
    while (e && f->pending[at].landed < ticket)
        pthread_cond_wait(&f->landed, &f->wmu);
    int status = SLUICE_OK;
    if (e) {
        e = &f->pending[at];
        status = report_any ? e->unreported : e->last_status;
        if (report_any || e->unreported_seq >= ticket)
            e->unreported = SLUICE_OK; /* this caller is told */
    }
    pthread_mutex_unlock(&f->wmu);
    return status;
}

/* Wait until every write handed in so far has landed (or been replaced by one that has). */
static void sf_wait_all(struct sluice_statefile *f)
{
    pthread_mutex_lock(&f->wmu);
    uint64_t target = f->seq;
    for (size_t i = 0; i < f->n_pending; i++)
        while (f->pending[i].landed <
               (f->pending[i].queued < target ? f->pending[i].queued : target))
            pthread_cond_wait(&f->landed, &f->wmu);
    pthread_mutex_unlock(&f->wmu);
}

/* ---- reading -------------------------------------------------------------------- */

/* The file's validated JSON in *root (NULL: no file, or a problem, recorded). Under mu. */
static int sf_load_root(struct sluice_statefile *f, json_t **root)
{
    struct sluice__sf_text t;
    *root = NULL;
    int status = sluice__sf_read(f, &t);
    if (status == SLUICE_OK && t.p) {
        status = sluice__sf_parse(f, &t, root);
        free(t.p);
    }
    return status;
}

int sluice_statefile_load(struct sluice_statefile *f, const char *node,
                          struct sluice_lock_record *out)
{
    if (!out)
        return SLUICE_EINVAL;
    memset(out, 0, sizeof *out);
    if (!f)
        return SLUICE_EINVAL;
    sf_wait_all(f); /* read this process's own writes */
    pthread_mutex_lock(&f->mu);
    json_t *root = NULL;
    int status = sluice__sf_check_node(f, node);
    if (status == SLUICE_OK)
        status = sf_load_root(f, &root);
    json_t *entry = root ? json_object_get(json_object_get(root, "nodes"), node) : NULL;
    if (entry) {
        char buf[200];
        const char *why = sluice__sf_record(f, entry, out, buf, sizeof buf);
        if (why)
            status = sluice__sf_fail(f, SLUICE_EINVAL,
                                     "%s: node \"%s\": %s; the node starts without a lock", f->path,
                                     node, why);
    }
    json_decref(root);
    pthread_mutex_unlock(&f->mu);
    return status;
}

int sluice_statefile_foreach(struct sluice_statefile *f,
                             int (*fn)(void *ctx, const char *node,
                                       const struct sluice_lock_record *rec, const char *problem),
                             void *ctx)
{
    if (!f || !fn)
        return SLUICE_EINVAL;
    sf_wait_all(f);
    pthread_mutex_lock(&f->mu);
    json_t *root = NULL;
    int status = sf_load_root(f, &root);
    pthread_mutex_unlock(&f->mu);
    const char *key;
    json_t *entry;
    json_object_foreach(json_object_get(root, "nodes"), key, entry)
    {
        struct sluice_lock_record rec;
        char buf[200];
        const char *why = sluice__sf_record(f, entry, &rec, buf, sizeof buf);
        int r = fn(ctx, key, why ? NULL : &rec, why);
        if (r) {
            status = r;
            break;
        }
    }
    json_decref(root);
    return status;
}

/* ---- writing -------------------------------------------------------------------- */

/*
 * Hand a write to the writer thread. `wait`: wait for it to land and return
 * its status (direct calls; ordered with every other write, as they share
 * the thread); else return at once, with an earlier background failure of
 * that node if one was never reported (the store ops).
 */
static int sf_write(struct sluice_statefile *f, const char *node,
                    const struct sluice_lock_record *rec, bool wait)
{
    if (!f)
        return SLUICE_EINVAL;
    /* f->mu only to record a bad node ID: the writer thread holds it while it waits up to
     * lock_wait_ms for another process's flock, and a store op must not wait on that (it
     * runs in the engine's call_end). Taking it for every write hung a test's 100 saves
     * behind a held flock, 1 run in 40 on a loaded machine. */
    if (!sluice__sf_node_ok(node)) {
        pthread_mutex_lock(&f->mu);
        int bad = sluice__sf_check_node(f, node);
        pthread_mutex_unlock(&f->mu);
        return bad;
    }
    uint64_t ticket = 0;
    int reported = SLUICE_OK;
    int status = sf_enqueue(f, node, rec, &ticket, wait ? NULL : &reported);
    if (status == SLUICE_EAGAIN)
        return sluice__sf_modify(f, node, rec);
    if (status != SLUICE_OK)
        return status;
    return wait ? sf_wait(f, node, ticket, false) : reported;
}

int sluice_statefile_save(struct sluice_statefile *f, const char *node,
                          const struct sluice_lock_record *rec)
{
    return sf_write(f, node, rec && rec->ceiling ? rec : NULL, true); /* ceiling 0: "no record" */
}

int sluice_statefile_clear(struct sluice_statefile *f, const char *node)
{
    return sf_write(f, node, NULL, true);
}

int sluice_statefile_sync(struct sluice_statefile *f, const char *node)
{
    if (!f)
        return SLUICE_EINVAL;
    if (!node) {
        sf_wait_all(f);
        return SLUICE_OK;
    }
    pthread_mutex_lock(&f->wmu);
    struct sluice__sf_pending *e = sf_entry(f, node, false);
    uint64_t ticket = e ? e->queued : 0;
    pthread_mutex_unlock(&f->wmu);
    return sf_wait(f, node, ticket, true);
}

static int sf_ops_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    return sluice_statefile_load((struct sluice_statefile *)ctx, node, out);
}

static int sf_ops_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    return sf_write((struct sluice_statefile *)ctx, node, rec && rec->ceiling ? rec : NULL, false);
}

static int sf_ops_clear(void *ctx, const char *node)
{
    return sf_write((struct sluice_statefile *)ctx, node, NULL, false);
}

static int sf_ops_sync(void *ctx, const char *node)
{
    return sluice_statefile_sync((struct sluice_statefile *)ctx, node);
}

struct sluice_store_ops sluice_statefile_ops(struct sluice_statefile *f)
{
    if (!f) /* no callbacks: an engine given these refuses them, naming the store */
        return (struct sluice_store_ops){0};
    struct sluice_store_ops ops = {.load = sf_ops_load,
                                   .save = sf_ops_save,
                                   .clear = sf_ops_clear,
                                   .ctx = f,
                                   .sync = sf_ops_sync};
    return ops;
}
