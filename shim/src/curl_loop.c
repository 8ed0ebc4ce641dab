/*
 * curl_loop.c — sluice_curl_loop: many requests, one loop thread, one
 * curl_multi, permits from the pools' async path. This file is a request's
 * life on the loop; curl_loop_api.c creates, runs and closes the loop and
 * holds the public calls (curl_loop_internal.h is what they share).
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
 * after the drain finds the flag clear and wakes it again; it reads the
 * eventfd only when the flag was set or the embedder reports the eventfd
 * readable (a write that lands after the read makes it readable again, so
 * nothing is lost), not on every pass. The loop's own thread never wakes
 * itself: inside an action it notes `self_work`; an embedder's thread
 * between actions (a proxy submitting from its client's read handler) asks
 * for the embedder's timer at 0 ms instead, a call rather than two syscalls.
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
 * grows the loop. The one exception is on the loop thread, not on submit:
 * a record's first error body of a request that declared `write` gets a
 * SLUICE_CURL_BODY_MAX buffer, which the record keeps until destroy (so at
 * most once per record, and never for a loop whose callers declare none).
 */
#define _GNU_SOURCE
#include "curl_loop_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Thread_local struct sluice_curl_loop *sluice__tl_loop;

/* ---- waking the loop ------------------------------------------------------------ */

void sluice__loop_wake(struct sluice_curl_loop *loop)
{
    if (sluice__tl_loop == loop) { /* no syscall to wake ourselves */
        loop->self_work = true;
        return;
    }
    if (loop->embedded && pthread_equal(pthread_self(), loop->thread) &&
        !atomic_load_explicit(&loop->closing, SLUICE_RELAXED)) { /* (after close: no timer) */
        if (!loop->self_work) {
            loop->self_work = true;
            loop->timer_due_ns = sluice_monotonic_ns();
            loop->timer(loop->ctx, 0);
        }
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
    sluice__curl_explain_timeout(res, sluice_deadline_first(rec->req.start_deadline,
                                                            rec->req.deadline),
                                 rec->admitted_ns);
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
    if (status == SLUICE_EINVAL) /* the only arguments the loop checks after submit */
        sluice__curl_check_deadlines(rec->req.start_deadline, rec->req.deadline, &res);
    res.status = status;
    res.refused_late = refused_late || (status == SLUICE_ETIMEDOUT && rec->left_early);
    if (status == SLUICE_ETIMEDOUT)
        res.expired = rec->expired != SLUICE_EXPIRED_NONE ? rec->expired
                      : rec->waiter.call.expired != SLUICE_EXPIRED_NONE
                          ? rec->waiter.call.expired
                          : sluice_deadline_which(rec->req.start_deadline, rec->req.deadline);
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
    sluice__curl_end_call(rec->pool, &rec->waiter.call, &res, false);
    sluice__complete(rec, &res);
}

/* What rec's transfer says, ended or cut now (code and stop as sluice__curl_finish takes). */
static void sluice__transfer_result(struct sluice__rec *rec, CURLcode code,
                                    enum sluice__curl_stop stop, struct sluice_curl_result *res)
{
    sluice__curl_result_init(res);
    sluice__curl_finish(rec->req.easy, code, stop, rec->req.deadline, rec->req.retry_after_max_ns,
                        rec->req.dialect, rec->tee.body, rec->tee.body_len, res);
    sluice__tee_latency(&rec->tee, res);
    res->queued_ns = rec->queued_ns;
    res->in_flight_at_start = rec->waiter.call.in_flight_at_start;
}

/* Take a transfer out of curl_multi and give the caller's handle its own settings back. */
static void sluice__detach_transfer(struct sluice__rec *rec)
{
    struct sluice_curl_loop *loop = rec->loop;
    CURL *easy = rec->req.easy;
    curl_multi_remove_handle(loop->multi, easy); /* mid-transfer: aborts, closes the connection */
    atomic_fetch_sub_explicit(&loop->n_transferring, 1u, SLUICE_RELAXED);
    sluice__loop_endpoint_caps(rec, -1);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, rec->caller_private);
    rec->tee.write = rec->req.write; /* read on, the tee dropped the body: the caller's again */
    rec->tee.write_data = rec->req.write_data;
    sluice__tee_remove(&rec->tee);
    sluice__curl_disarm_deadline(easy, rec->req.deadline);
}

/* A transfer ended (CURLMSG_DONE, stop RAN) or is being aborted (stop CANCELED/CLOSED). */
static void sluice__complete_transfer(struct sluice__rec *rec, CURLcode code,
                                      enum sluice__curl_stop stop)
{
    sluice__detach_transfer(rec);
    struct sluice_curl_result res;
    sluice__transfer_result(rec, code, stop, &res);
    if (rec->req.finish && !rec->reading_on) /* the caller had its answer at the cut */
        rec->req.finish(rec->req.data, rec->req.easy, &res);
    sluice__curl_end_call(rec->pool, &rec->waiter.call, &res, rec->reading_on);
    sluice__complete(rec, &res);
}

static size_t sluice__drop(char *bytes, size_t size, size_t n, void *data)
{
    (void)bytes, (void)data;
    return size * n;
}

/*
 * A transfer with `cut` reached its deadline: answer the caller now and read
 * the answer on while the pool would keep the permit anyway
 * (sluice_pool_call_read_on), else cut it there as curl's own timeout would.
 */
static void sluice__deadline_reached(struct sluice__rec *rec)
{
    struct sluice_curl_result res;
    sluice__transfer_result(rec, CURLE_OPERATION_TIMEDOUT, SLUICE__CURL_RAN, &res);
    if (rec->req.finish)
        rec->req.finish(rec->req.data, rec->req.easy, &res);
    /* Not abandoned: never sent, or whole by the caller's reading (a stream's last event came,
     * and the connection is merely held): it ends here. */
    int64_t left = res.abandoned ? sluice_pool_call_read_on(rec->pool, &rec->waiter.call) : 0;
    if (left <= 0) {
        sluice__detach_transfer(rec);
        sluice__curl_end_call(rec->pool, &rec->waiter.call, &res, false);
        sluice__complete(rec, &res);
        return;
    }
    rec->reading_on = true;
    rec->tee.write = sluice__drop;
    rec->tee.write_data = NULL;
    rec->tee.begun = NULL;
    curl_easy_pause(rec->req.easy, CURLPAUSE_CONT); /* nobody waits for a paused body now */
    rec->deadline_ns = sluice_add_ns(sluice_monotonic_ns(), left);
    sluice__heap_push(rec->loop, rec);
    rec->req.cut(&res, rec->req.data);
}

/* ---- permits ---------------------------------------------------------------------------- */

/* The pool settled a waiter (any thread): hand the record to the loop. */
void sluice__loop_on_settled(struct sluice_pool_waiter *w, int status)
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

/* Time a transfer at its next instant: its start deadline until the answer begins, then (with
 * `cut`) its deadline. */
static void sluice__watch_transfer(struct sluice__rec *rec)
{
    const struct timespec *at = NULL;
    if (rec->expired == SLUICE_EXPIRED_NONE && rec->req.start_deadline) {
        at = rec->req.start_deadline;
        rec->expired = SLUICE_EXPIRED_START;
    } else if (rec->req.cut && rec->req.deadline) {
        at = rec->req.deadline;
        rec->expired = SLUICE_EXPIRED_CALL;
    }
    if (at) {
        rec->deadline_ns = sluice_timespec_ns(at);
        sluice__heap_push(rec->loop, rec);
    }
}

/* With a permit in hand: hand the transfer to curl_multi. */
static void sluice__start_transfer(struct sluice__rec *rec)
{
    struct sluice_curl_loop *loop = rec->loop;
    CURL *easy = rec->req.easy;
    /* With `cut` the loop times the deadline itself (sluice__deadline_reached), not curl. */
    if ((rec->req.cut && rec->req.deadline && sluice_deadline_passed(rec->req.deadline)) ||
        !sluice__curl_arm_deadline(easy, rec->req.cut ? NULL : rec->req.deadline)) {
        sluice__complete_unused(rec, SLUICE_ETIMEDOUT);
        return;
    }
    rec->caller_private = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &rec->caller_private);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, rec);
    rec->tee.easy = easy;
    rec->tee.write = rec->req.write;
    rec->tee.write_data = rec->req.write_data;
    rec->tee.begun = rec->req.begun;
    rec->tee.begun_data = rec->req.data;
    sluice__tee_install(&rec->tee);
    sluice__loop_endpoint_caps(rec, +1); /* before the add: libcurl looks for its connection */
    CURLMcode mc = curl_multi_add_handle(loop->multi, easy);
    if (mc != CURLM_OK) {
        sluice__loop_endpoint_caps(rec, -1);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, rec->caller_private);
        sluice__tee_remove(&rec->tee);
        sluice__curl_disarm_deadline(easy, rec->req.deadline);
        sluice__complete_unused(rec, mc == CURLM_OUT_OF_MEMORY ? SLUICE_ENOMEM : SLUICE_EINVAL);
        return;
    }
    rec->stage = SLUICE__TRANSFERRING;
    atomic_fetch_add_explicit(&loop->n_transferring, 1u, SLUICE_RELAXED);
    rec->expired = SLUICE_EXPIRED_NONE;
    rec->reading_on = false;
    sluice__watch_transfer(rec);
}

/* A transfer watched for its start deadline: has the answer begun? */
static bool sluice__transfer_begun(struct sluice__rec *rec)
{
    if (rec->req.begun)
        return rec->req.begun(rec->req.data);
    curl_off_t body = 0;
    curl_easy_getinfo(rec->req.easy, CURLINFO_SIZE_DOWNLOAD_T, &body);
    return body > 0;
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
        /* OK: it settles now, ECANCELED, onto our FIFO, counted as `status`. EAGAIN: a
         * settlement is on its way and will see rec->stop. */
        sluice_pool_call_withdraw_async(rec->pool, &rec->waiter, status,
                                        status == SLUICE_ETIMEDOUT && rec->left_early);
    } else if (rec->stage == SLUICE__TRANSFERRING) {
        sluice__complete_transfer(rec, CURLE_ABORTED_BY_CALLBACK,
                                  status == SLUICE_ECLOSED     ? SLUICE__CURL_CLOSED
                                  : status == SLUICE_ETIMEDOUT ? SLUICE__CURL_START
                                                               : SLUICE__CURL_CANCELED);
    }
}

/* ---- intake ------------------------------------------------------------------------------- */

static void sluice__on_token(struct sluice_cancel_hook *hook);

void sluice__loop_raise_cancel(struct sluice_curl_loop *loop, struct sluice__rec *rec,
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
    sluice__loop_raise_cancel(rec->loop, rec, rec->hook_id);
}

/* A submission reached the loop: queue it for a permit, unless it is already over. */
static void sluice__accept(struct sluice__rec *rec)
{
    struct sluice_curl_loop *loop = rec->loop;
    sluice_pool_arrived(rec->pool); /* in the line from here (or ended), counted by the gate */
    rec->live_id = rec->id;
    rec->stage = SLUICE__INBOX;
    rec->stop = 0;
    rec->queued_ns = 0;
    rec->hooked = false;
    rec->expired = SLUICE_EXPIRED_NONE;
    rec->left_early = false;
    rec->heap_index = SLUICE__NO_HEAP;
    if (atomic_load_explicit(&loop->closing, SLUICE_RELAXED)) {
        sluice__complete_status(rec, SLUICE_ECLOSED, false);
        return;
    }
    const struct timespec *first = sluice_deadline_first(rec->req.start_deadline, rec->req.deadline);
    struct sluice_curl_result unused; /* the message is complete_status's to write */
    int status = atomic_load_explicit(&rec->cancel_id, SLUICE_RELAXED) == rec->id ? SLUICE_ECANCELED
                 : sluice__curl_check_deadlines(rec->req.start_deadline, rec->req.deadline,
                                                &unused) != SLUICE_OK
                     ? SLUICE_EINVAL
                     : sluice_wait_stop_reason(first, rec->req.cancel);
    if (status == SLUICE_OK && rec->req.cancel) {
        rec->hook_id = rec->id;
        rec->hook.fn = sluice__on_token;
        rec->hooked = sluice_cancel_register(rec->req.cancel, &rec->hook);
        if (!rec->hooked)
            status = SLUICE_ECANCELED;
    }
    if (status != SLUICE_OK) {
        /* In the pool's timeouts or cancels, as a blocking call stopped at its wait is: a
         * cancel or a deadline that beat the loop to the request is still one. */
        sluice__pool_count_stop(rec->pool, status);
        sluice__complete_status(rec, status, false);
        return;
    }
    rec->stage = SLUICE__WAITING;
    sluice__set_waiting(rec, true);
    /* It waits only as long as it can still start in time (sluice/pool_deadlines.h). */
    int64_t by_start = sluice_pool_wait_bound(rec->pool, rec->req.start_deadline, NULL);
    int64_t by_call = sluice_pool_wait_bound(rec->pool, NULL, rec->req.deadline);
    if (by_start != INT64_MAX || by_call != INT64_MAX) {
        rec->deadline_ns = by_start < by_call ? by_start : by_call;
        rec->expired = by_start <= by_call ? SLUICE_EXPIRED_START : SLUICE_EXPIRED_CALL;
        sluice__heap_push(loop, rec);
    }
    rec->waiter.deadline = rec->req.deadline; /* the start rule: too late to start is ETIMEDOUT */
    rec->waiter.start_deadline = rec->req.start_deadline;
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
    while (loop->heap_n && loop->heap_recs[0]->deadline_ns <= now) {
        struct sluice__rec *rec = loop->heap_recs[0];
        if (rec->stage == SLUICE__TRANSFERRING) {
            sluice__heap_remove(loop, rec);
            if (rec->reading_on) /* past linger_max_ms: cut after all */
                sluice__complete_transfer(rec, CURLE_OPERATION_TIMEDOUT, SLUICE__CURL_RAN);
            else if (rec->expired == SLUICE_EXPIRED_CALL)
                sluice__deadline_reached(rec);
            else if (!sluice__transfer_begun(rec)) /* its start deadline */
                sluice__stop(rec, SLUICE_ETIMEDOUT);
            else
                sluice__watch_transfer(rec);
            continue;
        }
        rec->left_early = !sluice_deadline_passed(
            rec->expired == SLUICE_EXPIRED_START ? rec->req.start_deadline : rec->req.deadline);
        sluice__stop(rec, SLUICE_ETIMEDOUT);
    }
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
int64_t sluice__loop_service(struct sluice_curl_loop *loop)
{
    uint32_t woken = atomic_exchange_explicit(&loop->wake_pending, 0u, SLUICE_SEQ_CST);
    loop->self_work = false;
    if (loop->embedded && (woken || loop->wake_fd_ready)) {
        uint64_t n;
        ssize_t got = read(loop->wake_fd, &n, sizeof n); /* EAGAIN: the write is yet to land */
        (void)got;
        loop->wake_fd_ready = false;
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
void sluice__loop_read_done(struct sluice_curl_loop *loop)
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
void sluice__loop_drain_for_close(struct sluice_curl_loop *loop)
{
    while (atomic_load_explicit(&loop->callers, SLUICE_SEQ_CST))
        sched_yield();
    sluice__loop_service(loop); /* the inbox, with closing set: ECLOSED */
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
