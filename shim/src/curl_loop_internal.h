/*
 * curl_loop_internal.h — what the two halves of sluice_curl_loop share:
 * the request record and the loop (their fields say which thread touches
 * them), and the calls the public half makes into the request life.
 * curl_loop.c is that life on the loop thread (wake-ups, the deadline heap,
 * permits, intake, completion); curl_loop_api.c is set-up, tear-down, the
 * two ways to run the loop and the public calls. Private to shim/src.
 */
#ifndef SLUICE_SHIM_CURL_LOOP_INTERNAL_H
#define SLUICE_SHIM_CURL_LOOP_INTERNAL_H

#include "curl_internal.h"

#include <pthread.h>
#include <semaphore.h>

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
    struct timespec deadline, start_deadline;
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
    int64_t deadline_ns; /* waiting: when it must leave the line (sluice_pool_wait_bound);
                            transferring: its start deadline, until the answer begins; then,
                            with req.cut, its deadline; reading on, when to give up */
    enum sluice_expiry expired; /* which deadline `deadline_ns` stands for */
    bool reading_on;     /* answered through req.cut: the answer is read on and dropped until
                            it ends, or until deadline_ns (sluice_pool_call_read_on) */
    bool left_early;     /* it left the line before the deadline itself passed */
    int64_t queued_ns; /* admission to permit, set when the permit came */
    uint64_t hook_id;  /* the id its token hook cancels */
    void *caller_private;
    struct sluice__tee tee; /* req.write's error body; its buffer stays with the record */
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
    /* The connection caps derived from the permits (0 = given by the embedder, or none),
     * and the endpoint-only transfers running, which hold no permit and get a connection
     * more each (sluice__loop_endpoint_caps). */
    long derived_host, derived_total;
    uint32_t n_endpoint_transfers;
    int64_t curl_due_ns;  /* embedder's loop: when curl wants its timeout (-1 = never) */
    int64_t timer_due_ns; /* the instant last handed to desc.timer (-1 = none) */
    bool self_work;       /* the loop's own thread queued work (a `done` resubmitting):
                             look again before sleeping instead of waking itself */
    bool wake_fd_ready;   /* embedder's loop: this action is for the wake-up descriptor */
    bool closed;          /* close finished: every request completed */
    bool finished;        /* the multi and the arrays are gone */
    /* The loop's thread: its own, or in embedder's-loop mode the thread that created it
     * (where every action runs). */
    pthread_t thread;
    sem_t ready;
    int init_status;
};

/* The loop whose code runs on this thread now: a waiter settled here needs no wake-up. */
extern _Thread_local struct sluice_curl_loop *sluice__tl_loop;

/* Make sure the loop looks at its queues soon (any thread; one syscall per burst). */
void sluice__loop_wake(struct sluice_curl_loop *loop);

/* Loop thread: rec's transfer started (+1) or ended (-1); counted when it is endpoint-only. */
void sluice__loop_endpoint_caps(struct sluice__rec *rec, int delta);

/* The pool settled a waiter (any thread): hand the record to the loop. */
void sluice__loop_on_settled(struct sluice_pool_waiter *w, int status);

/* Ask the loop to cancel request `id` in `rec` (any thread). */
void sluice__loop_raise_cancel(struct sluice_curl_loop *loop, struct sluice__rec *rec, uint64_t id);

/* Loop thread: everything but curl's own work; when to look again (monotonic ns; INT64_MAX =
 * only when woken). */
int64_t sluice__loop_service(struct sluice_curl_loop *loop);

/* Loop thread: deliver every finished transfer curl reports. */
void sluice__loop_read_done(struct sluice_curl_loop *loop);

/* Loop thread, with closing set: complete everything with SLUICE_ECLOSED. */
void sluice__loop_drain_for_close(struct sluice_curl_loop *loop);

#endif
