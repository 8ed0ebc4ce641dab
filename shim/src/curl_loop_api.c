/*
 * curl_loop_api.c — sluice_curl_loop's set-up and tear-down (on the loop's
 * thread), its two ways to run (its own thread; the embedder's loop through
 * watch/timer and sluice_curl_loop_action), and the public calls: create,
 * submit, cancel, stats, close, destroy. A request's life on the loop is
 * curl_loop.c, whose top comment tells it.
 */
#define _GNU_SOURCE
#include "alloc_internal.h"
#include "curl_loop_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- set-up and tear-down (on the loop's thread) ---------------------------------------- */

/* The embedder's pointer for the socket rides on curl's own (curl_multi_assign). */
static int sluice__socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)easy;
    struct sluice_curl_loop *loop = (struct sluice_curl_loop *)userp;
    void *assigned = socketp;
    loop->watch(loop->ctx, fd, what, &assigned);
    if (assigned != socketp && what != CURL_POLL_REMOVE)
        curl_multi_assign(loop->multi, fd, assigned);
    return 0;
}

static int sluice__timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct sluice_curl_loop *loop = (struct sluice_curl_loop *)userp;
    loop->curl_due_ns =
        timeout_ms < 0 ? -1 : sluice_add_ns(sluice_monotonic_ns(), timeout_ms * SLUICE_NS_PER_MS);
    return 0;
}

/* libcurl's own CURLMOPT_MAX_CONCURRENT_STREAMS: the default asks for no fewer. */
#define SLUICE__CURL_STREAMS_LIBCURL 100

/* Connection caps that never make libcurl queue a request holding a permit. */
static void sluice__set_caps(struct sluice_curl_loop *loop, const struct sluice_curl_loop_desc *d)
{
    uint64_t sum = 0;
    uint32_t largest = 0;
    bool limited = true;
    for (size_t i = 0; i < sluice_engine_backend_count(loop->engine); i++) {
        uint32_t a = sluice_pool_stats(sluice_engine_backend_at(loop->engine, i)->pool).active_max;
        limited = limited && a > 0;
        sum += a;
        largest = a > largest ? a : largest;
    }
    long cap = limited ? (long)(sum < LONG_MAX ? sum : LONG_MAX) : 0;
    long host = d->max_host_connections;
    long total = d->max_total_connections;
    long streams = d->max_concurrent_streams;
    loop->derived_host = host ? 0 : cap;
    loop->derived_total = total ? 0 : cap;
    SLUICE__DEFAULT(host, cap);
    SLUICE__DEFAULT(total, cap);
    SLUICE__DEFAULT(streams, largest > SLUICE__CURL_STREAMS_LIBCURL
                                 ? (long)largest
                                 : SLUICE__CURL_STREAMS_LIBCURL);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_HOST_CONNECTIONS, host);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, total);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_CONCURRENT_STREAMS, streams);
    /* Keep every connection the caps allow alive for reuse (libcurl's default keeps
     * 4 per easy handle added now, which a burst's end would cut down). */
    if (total > 0)
        curl_multi_setopt(loop->multi, CURLMOPT_MAXCONNECTS, total);
}

/* A connection cap derived from the permits leaves no room for a transfer without one: each
 * endpoint-only transfer running raises it by one, or a request holding a permit could wait
 * inside libcurl for the connection of a health check or a model list. */
void sluice__loop_endpoint_caps(struct sluice__rec *rec, int delta)
{
    struct sluice_curl_loop *loop = rec->loop;
    if (rec->pool_index != loop->n_pools - 1)
        return; /* a backend's request: its permit counted its connection */
    loop->n_endpoint_transfers += (uint32_t)delta;
    if (loop->derived_host)
        curl_multi_setopt(loop->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                          loop->derived_host + (long)loop->n_endpoint_transfers);
    if (loop->derived_total)
        curl_multi_setopt(loop->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS,
                          loop->derived_total + (long)loop->n_endpoint_transfers);
}

static int sluice__loop_init(struct sluice_curl_loop *loop, const struct sluice_curl_loop_desc *d)
{
    uint32_t n = d->max_requests;
    SLUICE__DEFAULT(n, SLUICE_CURL_LOOP_REQUESTS_DEFAULT);
    uint32_t ring_cap = (uint32_t)sluice_next_pow2(n < 2 ? 2 : n);
    const struct sluice_engine *e = loop->engine;
    loop->n_recs = n;
    loop->n_pools = sluice_engine_backend_count(e) + 1;
    loop->curl_due_ns = -1;
    loop->timer_due_ns = -1;
    loop->free_slots = sluice__zalloc_aligned(SLUICE_RING_SLOTS_SIZE(ring_cap), SLUICE_CACHELINE);
    loop->inbox_slots = sluice__zalloc_aligned(SLUICE_RING_SLOTS_SIZE(ring_cap), SLUICE_CACHELINE);
    loop->recs = sluice__zalloc_aligned((size_t)n * sizeof *loop->recs, SLUICE_CACHELINE);
    loop->heap_recs = sluice__zalloc_aligned((size_t)n * sizeof *loop->heap_recs, SLUICE_CACHELINE);
    loop->pools = sluice__zalloc_aligned(loop->n_pools * sizeof *loop->pools, SLUICE_CACHELINE);
    loop->multi = curl_multi_init();
    if (!loop->free_slots || !loop->inbox_slots || !loop->recs || !loop->heap_recs ||
        !loop->pools || !loop->multi)
        return SLUICE_ENOMEM;
    sluice_ring_init(&loop->free_ring, loop->free_slots, ring_cap);
    sluice_ring_init(&loop->inbox, loop->inbox_slots, ring_cap);
    for (size_t i = 0; i + 1 < loop->n_pools; i++)
        loop->pools[i].pool = sluice_engine_backend_at(e, i)->pool;
    loop->pools[loop->n_pools - 1].pool = sluice_engine_pool(e, NULL);
    for (uint32_t i = 0; i < n; i++) {
        struct sluice__rec *rec = &loop->recs[i];
        atomic_init(&rec->cancel_id, 0);
        rec->loop = loop;
        rec->heap_index = SLUICE__NO_HEAP;
        rec->waiter.cb = sluice__loop_on_settled;
        rec->waiter.data = rec;
        sluice_ring_trypush(&loop->free_ring, rec);
    }
    sluice__set_caps(loop, d);
    if (loop->embedded) {
        loop->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (loop->wake_fd < 0)
            return errno == ENOMEM ? SLUICE_ENOMEM : SLUICE_EIO;
        curl_multi_setopt(loop->multi, CURLMOPT_SOCKETFUNCTION, sluice__socket_cb);
        curl_multi_setopt(loop->multi, CURLMOPT_SOCKETDATA, loop);
        curl_multi_setopt(loop->multi, CURLMOPT_TIMERFUNCTION, sluice__timer_cb);
        curl_multi_setopt(loop->multi, CURLMOPT_TIMERDATA, loop);
        loop->watch(loop->ctx, loop->wake_fd, CURL_POLL_IN, &loop->wake_socketp);
    }
    return SLUICE_OK;
}

/* Free what init made; on the loop's thread (the multi is driven there), after close. */
static void sluice__loop_fini(struct sluice_curl_loop *loop)
{
    if (loop->finished)
        return;
    loop->finished = true;
    if (loop->multi)
        curl_multi_cleanup(loop->multi);
    loop->multi = NULL;
    if (loop->embedded && loop->wake_fd >= 0) {
        loop->watch(loop->ctx, loop->wake_fd, CURL_POLL_REMOVE, &loop->wake_socketp);
        close(loop->wake_fd);
    }
    free(loop->free_slots);
    free(loop->inbox_slots);
    for (uint32_t i = 0; loop->recs && i < loop->n_recs; i++)
        free(loop->recs[i].tee.body);
    free(loop->recs);
    free(loop->heap_recs);
    free(loop->pools);
}

/* ---- own-thread mode ------------------------------------------------------------------ */

struct sluice__start {
    struct sluice_curl_loop *loop;
    const struct sluice_curl_loop_desc *desc;
};

static void *sluice__loop_main(void *arg)
{
    struct sluice__start *start = (struct sluice__start *)arg;
    struct sluice_curl_loop *loop = start->loop;
    sluice__tl_loop = loop;
    loop->init_status = sluice__loop_init(loop, start->desc);
    sem_post(&loop->ready); /* `start` is gone after this */
    while (loop->init_status == SLUICE_OK) {
        int64_t next = sluice__loop_service(loop);
        int running;
        curl_multi_perform(loop->multi, &running);
        sluice__loop_read_done(loop);
        if (atomic_load_explicit(&loop->closing, SLUICE_SEQ_CST)) {
            sluice__loop_drain_for_close(loop);
            break;
        }
        int timeout = SLUICE__IDLE_POLL_MS;
        if (loop->self_work || loop->local_head ||
            atomic_load_explicit(&loop->granted, SLUICE_RELAXED))
            timeout = 0;
        else if (next != INT64_MAX) {
            int64_t left = next - sluice_monotonic_ns();
            left = left <= 0 ? 0 : (left + SLUICE_NS_PER_MS - 1) / SLUICE_NS_PER_MS;
            timeout = left < timeout ? (int)left : timeout;
        }
        curl_multi_poll(loop->multi, NULL, 0, timeout, NULL);
    }
    sluice__loop_fini(loop);
    return NULL;
}

/* ---- embedder's-loop mode ------------------------------------------------------------- */

/* Tell the embedder when to call back: curl's timeout, a deadline or a hold ending. */
static void sluice__update_timer(struct sluice_curl_loop *loop, int64_t next)
{
    int64_t due = next == INT64_MAX ? -1 : next;
    if (loop->curl_due_ns >= 0 && (due < 0 || loop->curl_due_ns < due))
        due = loop->curl_due_ns;
    if (loop->self_work || loop->local_head || atomic_load_explicit(&loop->granted, SLUICE_RELAXED))
        due = sluice_monotonic_ns();
    if (due == loop->timer_due_ns)
        return;
    loop->timer_due_ns = due;
    long ms = -1;
    if (due >= 0) {
        int64_t left = due - sluice_monotonic_ns();
        ms = left <= 0 ? 0 : (long)((left + SLUICE_NS_PER_MS - 1) / SLUICE_NS_PER_MS);
    }
    loop->timer(loop->ctx, ms);
}

int sluice_curl_loop_action(struct sluice_curl_loop *loop, curl_socket_t fd, int events)
{
    if (!loop || !loop->embedded || loop->closed)
        return SLUICE_EINVAL;
    struct sluice_curl_loop *outer = sluice__tl_loop;
    sluice__tl_loop = loop;
    int running;
    if (fd == CURL_SOCKET_TIMEOUT)
        loop->timer_due_ns = -1; /* the embedder's timer has fired */
    else if (fd != loop->wake_fd)
        curl_multi_socket_action(loop->multi, fd, events, &running);
    else
        loop->wake_fd_ready = true;
    sluice__loop_read_done(loop);
    int64_t next = INT64_MAX;
    /* Bounded: curl asks for an immediate timeout after new handles, and a `done` may
     * submit more; serve a few rounds here, then let the timer bring us back. */
    for (int round = 0; round < 8; round++) {
        next = sluice__loop_service(loop);
        bool curl_due = loop->curl_due_ns >= 0 && loop->curl_due_ns <= sluice_monotonic_ns();
        if (curl_due) {
            loop->curl_due_ns = -1;
            curl_multi_socket_action(loop->multi, CURL_SOCKET_TIMEOUT, 0, &running);
            sluice__loop_read_done(loop);
        } else if (!loop->self_work) {
            break;
        }
    }
    sluice__update_timer(loop, next);
    sluice__tl_loop = outer;
    return SLUICE_OK;
}

/* ---- the public calls --------------------------------------------------------------- */

/* A description's mistakes, named in desc->error; "" when there are none. */
static int sluice__loop_check(const struct sluice_curl_loop_desc *d)
{
    if (d->error && d->error_size)
        d->error[0] = '\0';
    if (!d->engine)
        return sluice__fail(d->error, d->error_size, "engine is NULL (required)");
    if (!d->watch != !d->timer)
        return sluice__fail(d->error, d->error_size,
                            "%s is set but %s is NULL (the embedder's-loop mode needs both; "
                            "leave both NULL for the loop's own thread)",
                            d->watch ? "watch" : "timer", d->watch ? "timer" : "watch");
    if (d->max_requests > SLUICE_CURL_LOOP_REQUESTS_MAX)
        return sluice__fail(d->error, d->error_size,
                            "max_requests = %" PRIu32 " is above SLUICE_CURL_LOOP_REQUESTS_MAX "
                            "(%" PRIu32 ")",
                            d->max_requests, SLUICE_CURL_LOOP_REQUESTS_MAX);
    /* libcurl refuses a negative cap and keeps its own default, so it would pass unnoticed. */
    const struct {
        const char *name;
        long value;
    } caps[] = {{"max_host_connections", d->max_host_connections},
                {"max_total_connections", d->max_total_connections},
                {"max_concurrent_streams", d->max_concurrent_streams}};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++)
        if (caps[i].value < 0)
            return sluice__fail(d->error, d->error_size,
                                "%s = %ld is negative (leave it 0 for the cap derived from the "
                                "engine's backends, or set a positive cap)",
                                caps[i].name, caps[i].value);
    return SLUICE_OK;
}

int sluice_curl_loop_create(const struct sluice_curl_loop_desc *desc, struct sluice_curl_loop **out)
{
    if (out)
        *out = NULL;
    if (!desc)
        return SLUICE_EINVAL;
    if (!out)
        return sluice__fail(desc->error, desc->error_size,
                            "out is NULL (pass the address of a struct sluice_curl_loop *)");
    int status = sluice__loop_check(desc);
    if (status != SLUICE_OK)
        return status;
    struct sluice_curl_loop *loop = sluice__zalloc_aligned(sizeof *loop, SLUICE_CACHELINE);
    if (!loop)
        return SLUICE_ENOMEM;
    atomic_init(&loop->wake_pending, 0u);
    atomic_init(&loop->cancel_pending, 0u);
    atomic_init(&loop->closing, 0u);
    atomic_init(&loop->callers, 0u);
    atomic_init(&loop->settling, 0u);
    atomic_init(&loop->granted, NULL);
    atomic_init(&loop->n_live, 0u);
    atomic_init(&loop->n_waiting, 0u);
    atomic_init(&loop->n_transferring, 0u);
    atomic_init(&loop->n_completed, 0u);
    loop->engine = desc->engine;
    loop->embedded = desc->watch != NULL;
    loop->watch = desc->watch;
    loop->timer = desc->timer;
    loop->ctx = desc->ctx;
    loop->wake_fd = -1;
    if (loop->embedded) {
        loop->thread = pthread_self();
        status = sluice__loop_init(loop, desc);
        if (status != SLUICE_OK)
            sluice__loop_fini(loop);
    } else {
        struct sluice__start start = {loop, desc};
        sem_init(&loop->ready, 0, 0);
        if (pthread_create(&loop->thread, NULL, sluice__loop_main, &start) != 0) {
            status = SLUICE_ENOMEM;
        } else {
            while (sem_wait(&loop->ready) != 0)
                ;
            status = loop->init_status;
            if (status != SLUICE_OK)
                pthread_join(loop->thread, NULL);
        }
        sem_destroy(&loop->ready);
    }
    if (status != SLUICE_OK) {
        free(loop);
        return status;
    }
    *out = loop;
    return SLUICE_OK;
}

int sluice__curl_loop_submit(struct sluice_curl_loop *loop, const struct sluice_curl_request *req,
                             uint64_t *id, enum sluice_expiry *late)
{
    if (late)
        *late = SLUICE_EXPIRED_NONE;
    if (!loop || !req || !req->easy || !req->done || (req->cut && !req->write))
        return SLUICE_EINVAL;
    atomic_fetch_add_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    int status = SLUICE_ECLOSED;
    const struct sluice_backend *b = NULL;
    struct sluice__rec *rec = NULL;
    if (atomic_load_explicit(&loop->closing, SLUICE_SEQ_CST))
        goto out;
    status = SLUICE_EINVAL;
    if (!(b = sluice_engine_find(loop->engine, req->backend)))
        goto out;
    if ((status = sluice_pool_admit_late(b->pool, req->start_deadline, req->deadline, late)) !=
        SLUICE_OK)
        goto out;
    void *item;
    if (sluice_ring_trypop(&loop->free_ring, &item) != SLUICE_OK) {
        sluice_pool_leave(b->pool);
        status = SLUICE_EAGAIN;
        goto out;
    }
    rec = (struct sluice__rec *)item;
    sluice_pool_arrive(b->pool); /* ahead of later submissions until the loop takes it in */
    rec->req = *req;
    rec->req.backend = b->id;
    if (req->deadline) {
        rec->deadline = *req->deadline;
        rec->req.deadline = &rec->deadline;
    }
    if (req->start_deadline) {
        rec->start_deadline = *req->start_deadline;
        rec->req.start_deadline = &rec->start_deadline;
    }
    rec->pool = b->pool;
    rec->pool_index = b == &loop->engine->endpoint_only ? (uint32_t)(loop->n_pools - 1)
                                                        : (uint32_t)(b - loop->engine->backends);
    rec->admitted_ns = sluice_monotonic_ns();
    rec->id = (++rec->generation << SLUICE__SLOT_BITS) | (uint64_t)(rec - loop->recs);
    if (id)
        *id = rec->id;
    atomic_fetch_add_explicit(&loop->n_live, 1u, SLUICE_RELAXED);
    sluice_ring_trypush(&loop->inbox, rec); /* cannot fail: as many slots as records */
    sluice__loop_wake(loop);
    status = SLUICE_OK;
out:
    atomic_fetch_sub_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    return status;
}

int sluice_curl_loop_submit(struct sluice_curl_loop *loop, const struct sluice_curl_request *req,
                            uint64_t *id)
{
    return sluice__curl_loop_submit(loop, req, id, NULL);
}

int sluice_curl_loop_cancel(struct sluice_curl_loop *loop, uint64_t id)
{
    if (!loop)
        return SLUICE_EINVAL;
    uint64_t slot = id & SLUICE__SLOT_MASK;
    if (id >> SLUICE__SLOT_BITS == 0 || slot >= loop->n_recs)
        return SLUICE_EINVAL;
    atomic_fetch_add_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    if (!atomic_load_explicit(&loop->closing, SLUICE_SEQ_CST))
        sluice__loop_raise_cancel(loop, &loop->recs[slot], id);
    atomic_fetch_sub_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    return SLUICE_OK;
}

const struct sluice_engine *sluice_curl_loop_engine(const struct sluice_curl_loop *loop)
{
    return loop ? loop->engine : NULL;
}

struct sluice_curl_loop_counts sluice_curl_loop_stats(const struct sluice_curl_loop *loop)
{
    if (!loop)
        return (struct sluice_curl_loop_counts){0};
    struct sluice_curl_loop *l = (struct sluice_curl_loop *)loop;
    struct sluice_curl_loop_counts s = {
        .live = atomic_load_explicit(&l->n_live, SLUICE_RELAXED),
        .waiting = atomic_load_explicit(&l->n_waiting, SLUICE_RELAXED),
        .transferring = atomic_load_explicit(&l->n_transferring, SLUICE_RELAXED),
        .completed = atomic_load_explicit(&l->n_completed, SLUICE_RELAXED),
    };
    return s;
}

void sluice_curl_loop_close(struct sluice_curl_loop *loop)
{
    if (!loop)
        return;
    /* Counted as a caller until its wake-up is made: the loop thread waits for callers
     * before it frees the multi that wake-up goes through. */
    atomic_fetch_add_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    bool first = !atomic_exchange_explicit(&loop->closing, 1u, SLUICE_SEQ_CST);
    if (first && !loop->embedded)
        sluice__loop_wake(loop);
    atomic_fetch_sub_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    if (!first)
        return;
    if (loop->embedded) {
        struct sluice_curl_loop *outer = sluice__tl_loop;
        sluice__tl_loop = loop;
        sluice__loop_drain_for_close(loop);
        sluice__tl_loop = outer;
        loop->timer(loop->ctx, -1);
    } else {
        pthread_join(loop->thread, NULL);
    }
}

void sluice_curl_loop_destroy(struct sluice_curl_loop *loop)
{
    if (!loop)
        return;
    sluice_curl_loop_close(loop);
    if (loop->embedded)
        sluice__loop_fini(loop);
    free(loop);
}

