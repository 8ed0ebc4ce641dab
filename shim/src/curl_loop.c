/*
 * curl_loop.c — sluice_curl_loop: many requests, one loop thread, one
 * curl_multi, permits from the pools' async path.
 *
 * A request's life, and who touches its record when:
 *
 *   submitter       admit on the backend's pool (ECAPACITY here, at once),
 *                   pop a free record, fill it, push it on `inbox`, wake;
 *   loop thread     pop it; register its token hook; queue it for a permit
 *                   (sluice_pool_call_begin_async)                 WAITING
 *   any thread      the pool settles the waiter: the callback pushes the
 *                   record on `granted` (or, on the loop thread itself,
 *                   straight onto the loop's own FIFO) and wakes the loop
 *   loop thread     with a permit: arm the deadline, curl_multi_add_handle
 *                                                                   TRANSFERRING
 *                   CURLMSG_DONE: classify, sluice_pool_call_end (sample
 *                   fed, permit back), leave the pool, recycle the record,
 *                   then call `done`.
 * So libcurl only ever holds requests that hold a permit, and the loop
 * thread never waits for one.
 *
 * Wake-ups: whoever makes work for the loop sets `wake_pending` and, only
 * if it was clear, calls curl_multi_wakeup (own thread) or writes the
 * eventfd (embedder's loop): one syscall per burst, not per request. The
 * loop clears the flag (seq_cst exchange) before it drains, so a push
 * after the drain finds the flag clear and wakes it again.
 *
 * Cancellation by id or token never touches a record's loop-side state
 * from another thread: it raises the record's `cancel_id` to the id
 * (atomic max, so a late cancel of an older request in the same slot can
 * never hide a newer one) and sets `cancel_pending`; the loop then scans
 * the live records for cancel_id == live id. Ids are (generation << 20 |
 * slot), never reused. A record popped from the inbox checks its
 * cancel_id first, which covers a cancel that beat the loop to it.
 *
 * Memory: every record, both rings and the deadline heap are allocated at
 * create (the process's malloc, cache-line aligned) and freed at destroy;
 * nothing is allocated per request: submitters take ready records from the
 * `free` ring, so a submit never takes an allocator lock and a burst never
 * grows the loop.
 */
#define _GNU_SOURCE
#include "alloc_internal.h"
#include "curl_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sluice/ring.h>

#define SLUICE__SLOT_BITS 20 /* SLUICE_CURL_LOOP_REQUESTS_MAX = 1 << 20 */
#define SLUICE__SLOT_MASK ((UINT64_C(1) << SLUICE__SLOT_BITS) - 1)
#define SLUICE__NO_HEAP SIZE_MAX
#define SLUICE__IDLE_POLL_MS 1000

enum sluice__stage {
    SLUICE__FREE = 0,     /* in the free ring, or being filled by a submitter */
    SLUICE__INBOX,        /* pushed, not yet popped by the loop */
    SLUICE__WAITING,      /* queued for a permit or a hold; or settled, not yet processed */
    SLUICE__SETTLED,      /* its settlement is being processed */
    SLUICE__TRANSFERRING, /* in curl_multi */
};

struct sluice__rec {
    /* Written by the submitter that owns the record, read by the loop after the
     * inbox hand-off (the ring's release/acquire orders them). req.deadline points
     * at `deadline` (the value at submit) and req.backend at the engine's copy of the
     * ID: the caller's own timespec and string may be gone once submit returns. */
    struct sluice_curl_request req;
    struct timespec deadline;
    struct sluice_pool *pool;
    uint32_t pool_index; /* into loop->pools */
    uint64_t id;
    uint64_t generation;
    int64_t admitted_ns;
    /* Any thread: cancels by id or token. */
    _Atomic(uint64_t) cancel_id;
    struct sluice_cancel_hook hook;
    /* The pool settles the waiter on any thread; `settled` and the link are
     * written before the release push onto `granted`. */
    struct sluice_pool_waiter waiter;
    int settled;
    struct sluice__rec *granted_next;
    /* Loop thread only. */
    struct sluice_curl_loop *loop;
    uint64_t live_id; /* 0 = not live in the loop */
    enum sluice__stage stage;
    int stop;    /* why it must end early (ECANCELED, ETIMEDOUT, ECLOSED); 0 = no */
    bool hooked; /* its token hook is registered */
    size_t heap_index;
    int64_t deadline_ns;
    int64_t queued_ns; /* admission to permit, set when the permit came */
    uint64_t hook_id;  /* the id its token hook cancels */
    void *caller_private;
};

struct sluice__pool_entry {
    struct sluice_pool *pool;
    uint32_t waiting; /* this loop's records waiting on it */
};

struct sluice_curl_loop {
    /* Submitters and cancellers. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint32_t) wake_pending;
    _Atomic(uint32_t) cancel_pending;
    _Atomic(uint32_t) closing;
    _Atomic(uint32_t) callers;  /* submit/cancel calls in progress: close waits them out */
    _Atomic(uint32_t) settling; /* other threads between pushing on `granted` and waking */
    _Atomic(struct sluice__rec *) granted; /* settled waiters from other threads (LIFO) */
    /* Read by everyone, written at create. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) const struct sluice_engine *engine;
    struct sluice_ring free_ring, inbox;
    struct sluice__rec *recs;
    uint32_t n_recs;
    CURLM *multi;
    int wake_fd; /* embedder's loop: eventfd; -1 in own-thread mode */
    void *wake_socketp; /* the embedder's pointer for wake_fd (watch's socketp) */
    bool embedded;
    sluice_curl_watch_fn watch;
    sluice_curl_timer_fn timer;
    void *ctx;
    /* Stats: written by the loop, read anywhere. */
    _Atomic(uint32_t) n_live, n_waiting, n_transferring;
    _Atomic(uint64_t) n_completed;
    /* Loop thread only. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) struct sluice_ring_slot *free_slots, *inbox_slots;
    struct sluice__rec *local_head, *local_tail; /* settled on the loop thread, FIFO */
    struct sluice__rec **heap_recs;              /* deadline min-heap of WAITING records */
    size_t heap_n;
    struct sluice__pool_entry *pools; /* one per engine backend, and the endpoint-only one */
    size_t n_pools;
    int64_t curl_due_ns;  /* embedder's loop: when curl wants its timeout (-1 = never) */
    int64_t timer_due_ns; /* the instant last handed to desc.timer (-1 = none) */
    bool self_work;       /* the loop's own thread queued work (a `done` resubmitting):
                             look again before sleeping instead of waking itself */
    bool closed;          /* close finished: every request completed */
    bool finished;        /* the multi and the arrays are gone */
    /* Own-thread mode. */
    pthread_t thread;
    sem_t ready;
    int init_status;
};

/* The loop whose code runs on this thread now: a waiter settled here needs no wake-up. */
static _Thread_local struct sluice_curl_loop *sluice__tl_loop;

/* ---- waking the loop ------------------------------------------------------------ */

static void sluice__loop_wake(struct sluice_curl_loop *loop)
{
    if (sluice__tl_loop == loop) { /* no syscall to wake ourselves */
        loop->self_work = true;
        return;
    }
    if (atomic_exchange_explicit(&loop->wake_pending, 1u, SLUICE_SEQ_CST) != 0u)
        return;
    if (loop->embedded) {
        uint64_t one = 1;
        ssize_t n = write(loop->wake_fd, &one, sizeof one); /* EAGAIN: already readable */
        (void)n;
    } else {
        curl_multi_wakeup(loop->multi);
    }
}

/* ---- the deadline heap (records WAITING with a deadline) ---------------------------- */

static void sluice__heap_swap(struct sluice_curl_loop *loop, size_t a, size_t b)
{
    struct sluice__rec *t = loop->heap_recs[a];
    loop->heap_recs[a] = loop->heap_recs[b];
    loop->heap_recs[b] = t;
    loop->heap_recs[a]->heap_index = a;
    loop->heap_recs[b]->heap_index = b;
}

static void sluice__heap_fix(struct sluice_curl_loop *loop, size_t i)
{
    struct sluice__rec **h = loop->heap_recs;
    while (i > 0 && h[(i - 1) / 2]->deadline_ns > h[i]->deadline_ns) {
        sluice__heap_swap(loop, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < loop->heap_n && h[l]->deadline_ns < h[m]->deadline_ns)
            m = l;
        if (r < loop->heap_n && h[r]->deadline_ns < h[m]->deadline_ns)
            m = r;
        if (m == i)
            return;
        sluice__heap_swap(loop, i, m);
        i = m;
    }
}

static void sluice__heap_push(struct sluice_curl_loop *loop, struct sluice__rec *rec)
{
    rec->heap_index = loop->heap_n++;
    loop->heap_recs[rec->heap_index] = rec;
    sluice__heap_fix(loop, rec->heap_index);
}

static void sluice__heap_remove(struct sluice_curl_loop *loop, struct sluice__rec *rec)
{
    size_t i = rec->heap_index;
    if (i == SLUICE__NO_HEAP)
        return;
    rec->heap_index = SLUICE__NO_HEAP;
    if (i != --loop->heap_n) {
        loop->heap_recs[i] = loop->heap_recs[loop->heap_n];
        loop->heap_recs[i]->heap_index = i;
        sluice__heap_fix(loop, i);
    }
}

/* ---- completion ------------------------------------------------------------------------- */

static void sluice__set_waiting(struct sluice__rec *rec, bool waiting)
{
    struct sluice_curl_loop *loop = rec->loop;
    loop->pools[rec->pool_index].waiting += waiting ? 1u : (uint32_t)-1;
    atomic_fetch_add_explicit(&loop->n_waiting, waiting ? 1u : (uint32_t)-1, SLUICE_RELAXED);
}

/*
 * Deliver a request's result: everything it held goes back first (token
 * hook, admission, the record itself), so `done` may resubmit at once.
 */
static void sluice__complete(struct sluice__rec *rec, struct sluice_curl_result *res)
{
    struct sluice_curl_loop *loop = rec->loop;
    sluice__heap_remove(loop, rec);
    if (rec->stage == SLUICE__WAITING)
        sluice__set_waiting(rec, false);
    if (rec->hooked)
        sluice_cancel_unregister(rec->req.cancel, &rec->hook);
    rec->hooked = false;
    sluice_pool_leave(rec->pool);
    CURL *easy = rec->req.easy;
    sluice_curl_done_fn done = rec->req.done;
    void *data = rec->req.data;
    rec->live_id = 0;
    rec->stage = SLUICE__FREE;
    atomic_fetch_sub_explicit(&loop->n_live, 1u, SLUICE_RELAXED);
    atomic_fetch_add_explicit(&loop->n_completed, 1u, SLUICE_RELAXED);
    sluice_ring_trypush(&loop->free_ring, rec); /* cannot fail: as many slots as records */
    done(res, easy, data);
}

/* Complete a request that holds no permit: it never transferred. */
static void sluice__complete_status(struct sluice__rec *rec, int status, bool refused_late)
{
    struct sluice_curl_result res;
    sluice__curl_result_init(&res);
    if (status == SLUICE_EINVAL) /* the only argument the loop checks after submit */
        sluice__curl_check_deadline(rec->req.deadline, &res);
    res.status = status;
    res.refused_late = refused_late;
    res.queued_ns = rec->queued_ns;
    sluice__complete(rec, &res);
}

/* A request that holds a permit ends without a transfer: the permit goes back unused. */
static void sluice__complete_unused(struct sluice__rec *rec, int status)
{
    struct sluice_curl_result res;
    sluice__curl_result_init(&res);
    res.status = status;
    res.queued_ns = rec->queued_ns;
    res.in_flight_at_start = rec->waiter.call.in_flight_at_start;
    sluice__curl_end_call(rec->pool, &rec->waiter.call, &res);
    sluice__complete(rec, &res);
}

/* A transfer ended (CURLMSG_DONE, stop RAN) or is being aborted (stop CANCELED/CLOSED). */
static void sluice__complete_transfer(struct sluice__rec *rec, CURLcode code,
                                      enum sluice__curl_stop stop)
{
    struct sluice_curl_loop *loop = rec->loop;
    CURL *easy = rec->req.easy;
    curl_multi_remove_handle(loop->multi, easy); /* mid-transfer: aborts, closes the connection */
    atomic_fetch_sub_explicit(&loop->n_transferring, 1u, SLUICE_RELAXED);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, rec->caller_private);
    struct sluice_curl_result res;
    sluice__curl_result_init(&res);
    sluice__curl_finish(easy, code, stop, rec->req.deadline, rec->req.retry_after_max_ns,
                        rec->req.dialect, NULL, 0, &res);
    sluice__curl_disarm_deadline(easy, rec->req.deadline);
    res.queued_ns = rec->queued_ns;
    res.in_flight_at_start = rec->waiter.call.in_flight_at_start;
    if (rec->req.finish)
        rec->req.finish(rec->req.data, easy, &res);
    sluice__curl_end_call(rec->pool, &rec->waiter.call, &res);
    sluice__complete(rec, &res);
}

/* ---- permits ---------------------------------------------------------------------------- */

/* The pool settled a waiter (any thread): hand the record to the loop. */
static void sluice__on_settled(struct sluice_pool_waiter *w, int status)
{
    struct sluice__rec *rec = (struct sluice__rec *)w->data;
    struct sluice_curl_loop *loop = rec->loop;
    rec->settled = status;
    rec->granted_next = NULL;
    if (sluice__tl_loop == loop) {
        if (loop->local_tail)
            loop->local_tail->granted_next = rec;
        else
            loop->local_head = rec;
        loop->local_tail = rec;
        return;
    }
    /* `settling` keeps the loop (and its multi) alive until the wake-up is made. */
    atomic_fetch_add_explicit(&loop->settling, 1u, SLUICE_SEQ_CST);
    struct sluice__rec *head = atomic_load_explicit(&loop->granted, SLUICE_RELAXED);
    do
        rec->granted_next = head;
    while (!atomic_compare_exchange_weak_explicit(&loop->granted, &head, rec, SLUICE_RELEASE,
                                                  SLUICE_RELAXED));
    sluice__loop_wake(loop);
    atomic_fetch_sub_explicit(&loop->settling, 1u, SLUICE_RELEASE);
}

/* With a permit in hand: hand the transfer to curl_multi. */
static void sluice__start_transfer(struct sluice__rec *rec)
{
    struct sluice_curl_loop *loop = rec->loop;
    CURL *easy = rec->req.easy;
    if (!sluice__curl_arm_deadline(easy, rec->req.deadline)) {
        sluice__complete_unused(rec, SLUICE_ETIMEDOUT);
        return;
    }
    rec->caller_private = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &rec->caller_private);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, rec);
    CURLMcode mc = curl_multi_add_handle(loop->multi, easy);
    if (mc != CURLM_OK) {
        curl_easy_setopt(easy, CURLOPT_PRIVATE, rec->caller_private);
        sluice__curl_disarm_deadline(easy, rec->req.deadline);
        sluice__complete_unused(rec, mc == CURLM_OUT_OF_MEMORY ? SLUICE_ENOMEM : SLUICE_EINVAL);
        return;
    }
    rec->stage = SLUICE__TRANSFERRING;
    atomic_fetch_add_explicit(&loop->n_transferring, 1u, SLUICE_RELAXED);
}

/* Act on a settled waiter, on the loop thread. */
static void sluice__process_settled(struct sluice__rec *rec)
{
    sluice__heap_remove(rec->loop, rec);
    sluice__set_waiting(rec, false);
    rec->stage = SLUICE__SETTLED;
    rec->queued_ns = sluice_monotonic_ns() - rec->admitted_ns;
    if (rec->settled != SLUICE_OK)
        sluice__complete_status(rec, rec->stop ? rec->stop : rec->settled,
                                rec->settled == SLUICE_ETIMEDOUT && rec->waiter.call.refused_late);
    else if (rec->stop)
        sluice__complete_unused(rec, rec->stop);
    else
        sluice__start_transfer(rec);
}

/* Process every settled waiter, ours first (FIFO), then other threads' (reversed to FIFO). */
static void sluice__drain_settled(struct sluice_curl_loop *loop)
{
    for (;;) {
        struct sluice__rec *rec = loop->local_head;
        if (!rec && atomic_load_explicit(&loop->granted, SLUICE_RELAXED)) {
            struct sluice__rec *lifo =
                atomic_exchange_explicit(&loop->granted, NULL, SLUICE_ACQUIRE);
            while (lifo) {
                struct sluice__rec *next = lifo->granted_next;
                lifo->granted_next = rec;
                rec = lifo;
                lifo = next;
            }
            loop->local_head = rec;
            for (loop->local_tail = rec; loop->local_tail && loop->local_tail->granted_next;)
                loop->local_tail = loop->local_tail->granted_next;
        }
        if (!rec)
            return;
        loop->local_head = rec->granted_next;
        if (!loop->local_head)
            loop->local_tail = NULL;
        sluice__process_settled(rec);
    }
}

/* End a live request early with `status`, whatever stage it is in. */
static void sluice__stop(struct sluice__rec *rec, int status)
{
    if (rec->stop)
        return;
    rec->stop = status;
    if (rec->stage == SLUICE__WAITING) {
        sluice__heap_remove(rec->loop, rec);
        /* OK: it settles now, ECANCELED, onto our FIFO. EAGAIN: a settlement is on its
         * way and will see rec->stop. */
        sluice_pool_call_cancel_async(rec->pool, &rec->waiter);
    } else if (rec->stage == SLUICE__TRANSFERRING) {
        sluice__complete_transfer(rec, CURLE_ABORTED_BY_CALLBACK,
                                  status == SLUICE_ECLOSED ? SLUICE__CURL_CLOSED
                                                           : SLUICE__CURL_CANCELED);
    }
}

/* ---- intake ------------------------------------------------------------------------------- */

static void sluice__on_token(struct sluice_cancel_hook *hook);

static void sluice__raise_cancel(struct sluice_curl_loop *loop, struct sluice__rec *rec,
                                 uint64_t id)
{
    uint64_t cur = atomic_load_explicit(&rec->cancel_id, SLUICE_RELAXED);
    while (cur < id && !atomic_compare_exchange_weak_explicit(&rec->cancel_id, &cur, id,
                                                              SLUICE_RELAXED, SLUICE_RELAXED))
        ;
    atomic_store_explicit(&loop->cancel_pending, 1u, SLUICE_SEQ_CST);
    sluice__loop_wake(loop);
}

/* A request's token fired (on the firing thread, under the token's lock). */
static void sluice__on_token(struct sluice_cancel_hook *hook)
{
    struct sluice__rec *rec =
        (struct sluice__rec *)(void *)((char *)hook - offsetof(struct sluice__rec, hook));
    sluice__raise_cancel(rec->loop, rec, rec->hook_id);
}

/* A submission reached the loop: queue it for a permit, unless it is already over. */
static void sluice__accept(struct sluice__rec *rec)
{
    struct sluice_curl_loop *loop = rec->loop;
    rec->live_id = rec->id;
    rec->stage = SLUICE__INBOX;
    rec->stop = 0;
    rec->queued_ns = 0;
    rec->hooked = false;
    rec->heap_index = SLUICE__NO_HEAP;
    if (atomic_load_explicit(&loop->closing, SLUICE_RELAXED)) {
        sluice__complete_status(rec, SLUICE_ECLOSED, false);
        return;
    }
    int status = atomic_load_explicit(&rec->cancel_id, SLUICE_RELAXED) == rec->id
                     ? SLUICE_ECANCELED
                     : sluice_wait_stop_reason(rec->req.deadline, rec->req.cancel);
    if (status == SLUICE_OK && rec->req.cancel) {
        rec->hook_id = rec->id;
        rec->hook.fn = sluice__on_token;
        rec->hooked = sluice_cancel_register(rec->req.cancel, &rec->hook);
        if (!rec->hooked)
            status = SLUICE_ECANCELED;
    }
    if (status != SLUICE_OK) {
        sluice__complete_status(rec, status, false);
        return;
    }
    rec->stage = SLUICE__WAITING;
    sluice__set_waiting(rec, true);
    if (rec->req.deadline) {
        rec->deadline_ns = sluice_timespec_ns(rec->req.deadline);
        sluice__heap_push(loop, rec);
    }
    rec->waiter.deadline = rec->req.deadline; /* the start rule: too late to start is ETIMEDOUT */
    sluice_pool_call_begin_async(rec->pool, &rec->waiter); /* may settle inline, onto our FIFO */
}

static void sluice__scan_cancels(struct sluice_curl_loop *loop)
{
    for (uint32_t i = 0; i < loop->n_recs; i++) {
        struct sluice__rec *rec = &loop->recs[i];
        if (rec->live_id && atomic_load_explicit(&rec->cancel_id, SLUICE_RELAXED) == rec->live_id)
            sluice__stop(rec, SLUICE_ECANCELED);
    }
}

/* Time out waiting requests whose deadline passed; the next deadline (INT64_MAX = none). */
static int64_t sluice__expire(struct sluice_curl_loop *loop)
{
    int64_t now = sluice_monotonic_ns();
    while (loop->heap_n && loop->heap_recs[0]->deadline_ns <= now)
        sluice__stop(loop->heap_recs[0], SLUICE_ETIMEDOUT);
    return loop->heap_n ? loop->heap_recs[0]->deadline_ns : INT64_MAX;
}

/* Poll `pool` if `until` (its clock) has come, else lower *next (monotonic) to it. */
static void sluice__poll_at(struct sluice_pool *pool, int64_t until, int64_t *next)
{
    int64_t left = until - sluice_clock_now(&pool->clock);
    if (left > 0) {
        int64_t at = sluice_add_ns(sluice_monotonic_ns(), left);
        *next = at < *next ? at : *next;
    } else {
        sluice_pool_poll(pool);
    }
}

/*
 * Start calls whose Retry-After hold is over, and release lingering permits
 * whose time has come (they count against the limit after an abandoned
 * transfer; this timer is what releases them when no other call ends).
 * Returns when the next hold ends or permit is due (INT64_MAX = none).
 */
static int64_t sluice__poll_holds(struct sluice_curl_loop *loop)
{
    int64_t next = INT64_MAX;
    bool waiting = atomic_load_explicit(&loop->n_waiting, SLUICE_RELAXED) != 0;
    for (size_t i = 0; i < loop->n_pools; i++) {
        struct sluice_pool *pool = loop->pools[i].pool;
        int64_t until = waiting && loop->pools[i].waiting ? sluice_pool_hold_until(pool) : 0;
        if (until)
            sluice__poll_at(pool, until, &next);
        int64_t release = sluice_pool_next_release(pool);
        if (release != INT64_MAX)
            sluice__poll_at(pool, release, &next);
    }
    return next;
}

/*
 * Everything but curl's own work: submissions, settlements, cancels,
 * deadlines, holds. Returns when the loop must look again (monotonic ns;
 * INT64_MAX = only when woken).
 */
static int64_t sluice__service(struct sluice_curl_loop *loop)
{
    atomic_exchange_explicit(&loop->wake_pending, 0u, SLUICE_SEQ_CST);
    loop->self_work = false;
    if (loop->embedded) {
        uint64_t n;
        ssize_t got = read(loop->wake_fd, &n, sizeof n); /* EAGAIN: nothing to clear */
        (void)got;
    }
    void *item;
    while (sluice_ring_trypop(&loop->inbox, &item) == SLUICE_OK)
        sluice__accept((struct sluice__rec *)item);
    sluice__drain_settled(loop);
    if (atomic_exchange_explicit(&loop->cancel_pending, 0u, SLUICE_SEQ_CST)) {
        sluice__scan_cancels(loop);
        sluice__drain_settled(loop);
    }
    int64_t next = sluice__expire(loop);
    sluice__drain_settled(loop);
    int64_t hold = sluice__poll_holds(loop);
    sluice__drain_settled(loop);
    return hold < next ? hold : next;
}

/* Deliver every finished transfer curl reports. */
static void sluice__read_done(struct sluice_curl_loop *loop)
{
    int queued;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(loop->multi, &queued))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct sluice__rec *rec = NULL;
        CURLcode code = msg->data.result;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &rec);
        sluice__complete_transfer(rec, code, SLUICE__CURL_RAN);
    }
    sluice__drain_settled(loop); /* permits the completions gave back */
}

/*
 * Complete everything with SLUICE_ECLOSED (closing is set). Waits out
 * submitters still inside submit, and settlements other threads are making.
 */
static void sluice__drain_for_close(struct sluice_curl_loop *loop)
{
    while (atomic_load_explicit(&loop->callers, SLUICE_SEQ_CST))
        sched_yield();
    sluice__service(loop); /* the inbox, with closing set: ECLOSED */
    for (uint32_t i = 0; i < loop->n_recs; i++)
        if (loop->recs[i].live_id)
            sluice__stop(&loop->recs[i], SLUICE_ECLOSED);
    sluice__drain_settled(loop);
    while (atomic_load_explicit(&loop->n_live, SLUICE_ACQUIRE)) {
        sched_yield();
        sluice__drain_settled(loop);
    }
    while (atomic_load_explicit(&loop->settling, SLUICE_ACQUIRE))
        sched_yield();
    loop->closed = true;
}

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
    long host = d->max_host_connections ? d->max_host_connections : cap;
    long total = d->max_total_connections ? d->max_total_connections : cap;
    long streams = d->max_concurrent_streams ? d->max_concurrent_streams
                                             : (largest > 100 ? (long)largest : 100);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_HOST_CONNECTIONS, host);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, total);
    curl_multi_setopt(loop->multi, CURLMOPT_MAX_CONCURRENT_STREAMS, streams);
    /* Keep every connection the caps allow alive for reuse (libcurl's default keeps
     * 4 per easy handle added now, which a burst's end would cut down). */
    if (total > 0)
        curl_multi_setopt(loop->multi, CURLMOPT_MAXCONNECTS, total);
}

static int sluice__loop_init(struct sluice_curl_loop *loop, const struct sluice_curl_loop_desc *d)
{
    uint32_t n = d->max_requests ? d->max_requests : SLUICE_CURL_LOOP_REQUESTS_DEFAULT;
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
        rec->waiter.cb = sluice__on_settled;
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
        int64_t next = sluice__service(loop);
        int running;
        curl_multi_perform(loop->multi, &running);
        sluice__read_done(loop);
        if (atomic_load_explicit(&loop->closing, SLUICE_SEQ_CST)) {
            sluice__drain_for_close(loop);
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
    sluice__read_done(loop);
    int64_t next = INT64_MAX;
    /* Bounded: curl asks for an immediate timeout after new handles, and a `done` may
     * submit more; serve a few rounds here, then let the timer bring us back. */
    for (int round = 0; round < 8; round++) {
        next = sluice__service(loop);
        bool curl_due = loop->curl_due_ns >= 0 && loop->curl_due_ns <= sluice_monotonic_ns();
        if (curl_due) {
            loop->curl_due_ns = -1;
            curl_multi_socket_action(loop->multi, CURL_SOCKET_TIMEOUT, 0, &running);
            sluice__read_done(loop);
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
        return sluice__shim_fail(d->error, d->error_size, "engine is NULL (required)");
    if (!d->watch != !d->timer)
        return sluice__shim_fail(d->error, d->error_size,
                                 "%s is set but %s is NULL (the embedder's-loop mode needs both; "
                                 "leave both NULL for the loop's own thread)",
                                 d->watch ? "watch" : "timer", d->watch ? "timer" : "watch");
    if (d->max_requests > SLUICE_CURL_LOOP_REQUESTS_MAX)
        return sluice__shim_fail(d->error, d->error_size,
                                 "max_requests = %" PRIu32 " is above SLUICE_CURL_LOOP_REQUESTS_MAX "
                                 "(%" PRIu32 ")",
                                 d->max_requests, SLUICE_CURL_LOOP_REQUESTS_MAX);
    return SLUICE_OK;
}

int sluice_curl_loop_create(const struct sluice_curl_loop_desc *desc, struct sluice_curl_loop **out)
{
    *out = NULL;
    if (!desc)
        return SLUICE_EINVAL;
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

int sluice_curl_loop_submit(struct sluice_curl_loop *loop, const struct sluice_curl_request *req,
                            uint64_t *id)
{
    if (!loop || !req || !req->easy || !req->done)
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
    if ((status = sluice_pool_admit_by(b->pool, req->deadline)) != SLUICE_OK)
        goto out;
    void *item;
    if (sluice_ring_trypop(&loop->free_ring, &item) != SLUICE_OK) {
        sluice_pool_leave(b->pool);
        status = SLUICE_EAGAIN;
        goto out;
    }
    rec = (struct sluice__rec *)item;
    rec->req = *req;
    rec->req.backend = b->id;
    if (req->deadline) {
        rec->deadline = *req->deadline;
        rec->req.deadline = &rec->deadline;
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

int sluice_curl_loop_cancel(struct sluice_curl_loop *loop, uint64_t id)
{
    if (!loop)
        return SLUICE_EINVAL;
    uint64_t slot = id & SLUICE__SLOT_MASK;
    if (id >> SLUICE__SLOT_BITS == 0 || slot >= loop->n_recs)
        return SLUICE_EINVAL;
    atomic_fetch_add_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    if (!atomic_load_explicit(&loop->closing, SLUICE_SEQ_CST))
        sluice__raise_cancel(loop, &loop->recs[slot], id);
    atomic_fetch_sub_explicit(&loop->callers, 1u, SLUICE_SEQ_CST);
    return SLUICE_OK;
}

const struct sluice_engine *sluice_curl_loop_engine(const struct sluice_curl_loop *loop)
{
    return loop->engine;
}

struct sluice_curl_loop_counts sluice_curl_loop_stats(const struct sluice_curl_loop *loop)
{
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
        sluice__drain_for_close(loop);
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
