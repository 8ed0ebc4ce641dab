/*
 * sluice/gate.h — a FIFO permit gate: a counting semaphore that serves
 * waiters strictly in arrival order, with deadlines, cancel tokens, async
 * waiters and a limit that can move at run time.
 *
 * What it is: `limit` permits. acquire() takes one, waiting in FIFO order if
 * none is free; release() gives one back. Raising the limit grants the newly
 * eligible waiters at once; lowering it takes effect as holders release
 * (holders are never interrupted, and nobody new is granted while the
 * number of holders is at or above the new limit).
 *
 * How it works: one 64-bit word packs `available` (signed: negative after a
 * limit cut, until releases repay it) and `waiters` (queued waiters). The
 * uncontended acquire is one CAS (available > 0 and nobody waiting ->
 * available - 1) and the uncontended release one CAS (nobody waiting ->
 * available + 1): two atomic RMWs for the pair. Because the fast acquire
 * requires waiters == 0, an arrival can never overtake a queued waiter.
 *
 * Contended path: a waiter links its own node into an intrusive FIFO queue
 * under a spinlock held for a few dozen instructions (sluice/cc.h: it backs
 * off and yields when contended); the waiter next in line spins briefly on
 * its node, every other one parks on its node's futex word at once
 * (spinning behind the head only steals CPU from holders). A grant to the
 * head also rouses the new head, so its wake-up latency overlaps the
 * permit's use rather than following it. A release that finds waiters pops
 * the head and hands the permit to that node directly (the permit never
 * becomes "available", so nobody can barge), waking exactly that one
 * thread: no herd. Cancellation and timeout remove the node from the queue
 * under the same lock, so nothing is left behind for a later release to
 * skip, and a cancelled waiter can never be credited a permit. If a grant
 * wins the race (the node was already popped), the waiter waits for that
 * verdict (a brief spin, then a park on its node: the popper may be slow to
 * hand it over, see below), and passes a permit on with release() before
 * returning its error.
 *
 * Why not tickets and a slot array (the first design; docs/design.md has
 * its history): an abandoned ticket keeps its slot until the grant frontier
 * reaches it, so repeated timeouts behind a slow holder create unboundedly
 * many outstanding tickets; a fixed slot array then laps, and a later
 * ticket can occupy the slot of an earlier, still-unpublished one, stalling
 * the gate for good. The queue keeps the same FIFO order, exactly-one
 * wake-ups and two-RMW fast path, with no capacity limit and no lapping.
 *
 * Progress: tryacquire and the uncontended acquire/release are lock-free.
 * Contended release, set_limit, close and cancel take the spinlock briefly;
 * no callback or syscall runs under it. acquire blocks: the waiter next in
 * line spins up to SLUICE_PARK_SPIN pauses, every waiter parks in the
 * kernel after that (or at once when it is not next). Every waker issues
 * the futex wakes it owes before it runs any async callback, so a slow
 * callback never delays a sync waiter's wake-up.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same gate, except init/create/destroy.
 *
 * Memory ordering: a successful fast acquire is an acquire CAS and a fast
 * release a release CAS on the same word; slow paths publish under the
 * spinlock and hand over through the node's state word (seq_cst exchange
 * by the granter, acquire load by the waiter). So a holder always sees
 * everything the previous holder wrote before release().
 *
 * Deadlines and cancellation (sluice/cancel.h has the contract): a deadline
 * that is not normalised fails with SLUICE_EINVAL before anything else (one
 * more than a year ahead, a CLOCK_REALTIME reading, once the call waits). A
 * wait that ends without a permit returns SLUICE_ECANCELED if its token has
 * fired by then, whatever else happened (deadline passed, gate closed): cancel
 * wins. A permit granted before the wait noticed the token is kept (OK).
 *
 * Async waiters (event loops): sluice_gate_acquire_async() queues a waiter
 * record whose callback runs exactly once, with SLUICE_OK (granted),
 * SLUICE_ECANCELED (sluice_gate_cancel_async) or SLUICE_ECLOSED
 * (sluice_gate_close). The record belongs to the gate from the moment
 * acquire_async is called until its callback starts (whatever it held
 * before is overwritten). The callback runs on the thread whose gate call
 * decided the outcome: the caller of acquire_async when it is known at once
 * (permit free, gate closed), otherwise the thread that releases the permit,
 * raises the limit, cancels, or closes, always after the gate's lock is
 * dropped. It must not block, and may call back into the gate (any gate).
 *
 * The trampoline: a callback that releases grants the next async waiter,
 * whose callback would release in turn; run as nested calls, a queue of a
 * million such waiters would need a million stack frames. So outcomes are
 * not delivered by nesting: each thread keeps a FIFO list of decided async
 * outcomes (thread-local, one per thread in the whole program: every
 * translation unit that includes this header shares it), and only the
 * outermost gate call on the thread runs it, one callback after another,
 * until it is empty. A gate call made from inside a callback — from any .c
 * file — appends to the list and returns; the outcomes it decided run right
 * after the current callback returns, before the outermost call does. So
 * no callback ever runs inside another, stack depth stays constant whatever
 * the queue length, and no outcome is left behind when the outermost call
 * returns. An async node that stands for a blocked caller (the pool's
 * waiters when permits linger) is not queued there: its callback only
 * wakes that thread, so it runs as soon as it is decided, like a sync
 * waiter's wake. The one rule: the list is one symbol (sluice__gate_pending, a
 * weak definition with default visibility), so a module that hides it from
 * the dynamic linker — a shared library linked with -Bsymbolic or a version
 * script that makes it local, a library dlopen'ed into a program that does
 * not export it — gets a list of its own, and a callback that crosses into
 * such a module may run one callback nested inside it (once per module
 * boundary, never unboundedly).
 *
 * Building on the gate (the pool, sluice/pool_call.h): a layer whose
 * callers wait on more than a permit uses six calls beyond acquire and
 * release. sluice_gate_failed says how such a wait ends (cancel wins);
 * sluice_gate_acquire_async_wake queues a blocked thread through the async
 * path, woken the moment its outcome is decided; sluice_gate_waiter_init and
 * sluice_gate_settle_async deliver an outcome the layer decided itself
 * through the trampoline, like the gate's own; sluice_gate_hold_callbacks
 * and sluice_gate_resume_callbacks bracket one operation that releases and
 * grants, so every sync waiter it grants is woken before any callback runs.
 * Each one's contract is at its definition.
 */
#ifndef SLUICE_GATE_H
#define SLUICE_GATE_H

#include "cancel.h"
#include "park.h"
#include "status.h"
#include "time.h"

#define SLUICE_GATE_LIMIT_MAX (UINT32_C(1) << 30)
#define SLUICE_GATE_LIMIT_DEFAULT UINT32_C(1) /* sluice_gate_desc.limit left at zero */

/* A queued waiter. Sync waiters keep theirs on the stack during the wait;
 * async waiters embed one in struct sluice_gate_waiter. Every field is
 * written by the gate before the node is used (sluice__gate_node_init). */
struct sluice_gate_node {
    /* Queue links, guarded by the gate's lock while queued; once popped,
     * `next` chains the node in a grant batch or the thread's trampoline. */
    struct sluice_gate_node *next, *prev;
    bool queued;                      /* guarded by the gate's lock */
    bool wake;                        /* async, but its callback only wakes a blocked thread */
    _Atomic(uint32_t) state;          /* SLUICE__NODE_*; sync: the futex word; async: the verdict */
    struct sluice_gate_waiter *async; /* NULL for a sync waiter */
};

struct sluice_gate_waiter;
typedef void (*sluice_gate_fn)(struct sluice_gate_waiter *waiter, int status);

/* An async waiter: set `cb` (and `data`), keep it alive until cb has run.
 * sluice__node is the gate's: acquire_async initialises it. */
struct sluice_gate_waiter {
    sluice_gate_fn cb;
    void *data;
    struct sluice_gate_node sluice__node;
};

struct sluice_gate_counts {
    uint32_t limit;
    uint32_t in_flight; /* permits held */
    uint32_t waiting;   /* waiters queued for a permit */
};

struct sluice_gate {
    /* The hot word gets its own line; the queue and lock another. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) word;
    SLUICE_ALIGNED(SLUICE_CACHELINE) sluice_spinlock lock;
    struct sluice_gate_node *head, *tail; /* guarded by lock */
    /* A lock-free copy of `head`, read by spinning waiters: only the next in
     * line spins, the rest park at once and leave the CPU to the holders. */
    _Atomic(struct sluice_gate_node *) head_hint;
    _Atomic(uint32_t) limit;
    _Atomic(uint32_t) closed;
    struct sluice_allocator allocator;
    bool owns_memory;
};

struct sluice_gate_desc {
    uint32_t limit; /* permits (default: 1; at most SLUICE_GATE_LIMIT_MAX) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
};

/* WAITING and SLEEPING: no verdict yet (SLEEPING: the sync owner is parked,
 * or about to, and must be woken). GRANTED, CLOSED, CANCELED: verdicts
 * (CANCELED only for async nodes, whose sync twin reads the token). */
enum { SLUICE__NODE_WAITING = 0, SLUICE__NODE_SLEEPING = 1, SLUICE__NODE_GRANTED = 2,
       SLUICE__NODE_CLOSED = 3, SLUICE__NODE_CANCELED = 4 };

/* ---- the packed word: waiters * 2^32 + available (available is signed) ----
 * It is one 64-bit number, not two bit fields: adding -1 to available when
 * it is 0 borrows from the waiter half, so decoding subtracts it back out. */

#define SLUICE__GATE_ONE_WAITER (UINT64_C(1) << 32)

SLUICE_INLINE int32_t sluice__gate_available(uint64_t word)
{
    return (int32_t)(uint32_t)word;
}

SLUICE_INLINE uint32_t sluice__gate_waiters(uint64_t word)
{
    return (uint32_t)((word - (uint64_t)(int64_t)sluice__gate_available(word)) >> 32);
}

SLUICE_INLINE uint64_t sluice__gate_word(int32_t available, uint32_t waiters)
{
    return ((uint64_t)waiters << 32) + (uint64_t)(int64_t)available;
}

/* Initialise a gate in caller storage. Returns SLUICE_EINVAL for a bad limit. */
SLUICE_INLINE int sluice_gate_init(struct sluice_gate *g, uint32_t limit)
{
    if (!g || limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    atomic_init(&g->word, sluice__gate_word((int32_t)limit, 0));
    sluice_spinlock_init(&g->lock);
    g->head = g->tail = NULL;
    atomic_init(&g->head_hint, (struct sluice_gate_node *)NULL);
    atomic_init(&g->limit, limit);
    atomic_init(&g->closed, 0u);
    g->allocator.alloc = NULL;
    g->allocator.free = NULL;
    g->allocator.ctx = NULL;
    g->owns_memory = false;
    return SLUICE_OK;
}

/* Allocate and initialise a gate (the only allocation the gate ever makes).
 * SLUICE_EINVAL for a limit above SLUICE_GATE_LIMIT_MAX or an allocator with
 * only one of alloc and free. */
SLUICE_INLINE int sluice_gate_create(const struct sluice_gate_desc *desc, struct sluice_gate **out)
{
    uint32_t limit = desc ? desc->limit : 0;
    SLUICE__DEFAULT(limit, SLUICE_GATE_LIMIT_DEFAULT);
    const struct sluice_allocator *a = desc ? desc->allocator : NULL;
    *out = NULL;
    if (limit > SLUICE_GATE_LIMIT_MAX || !sluice__allocator_valid(a))
        return SLUICE_EINVAL;
    struct sluice_gate *g = (struct sluice_gate *)sluice__alloc(a, sizeof *g, SLUICE_CACHELINE);
    if (!g)
        return SLUICE_ENOMEM;
    sluice_gate_init(g, limit);
    if (a)
        g->allocator = *a;
    g->owns_memory = true;
    *out = g;
    return SLUICE_OK;
}

/* Free a gate made by sluice_gate_create. No thread may be using it. */
SLUICE_INLINE void sluice_gate_destroy(struct sluice_gate *g)
{
    if (!g || !g->owns_memory)
        return;
    struct sluice_allocator a = g->allocator;
    sluice__free(&a, g, sizeof *g);
}

/* ---- the queue (callers hold g->lock) ------------------------------------- */

SLUICE_INLINE void sluice__gate_enqueue(struct sluice_gate *g, struct sluice_gate_node *n)
{
    n->next = NULL;
    n->prev = g->tail;
    if (g->tail)
        g->tail->next = n;
    else
        g->head = n;
    g->tail = n;
    n->queued = true;
    atomic_store_explicit(&g->head_hint, g->head, SLUICE_RELAXED);
}

SLUICE_INLINE void sluice__gate_unlink(struct sluice_gate *g, struct sluice_gate_node *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        g->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        g->tail = n->prev;
    n->next = n->prev = NULL;
    n->queued = false;
    atomic_store_explicit(&g->head_hint, g->head, SLUICE_RELAXED);
}

/* Add `delta` to the word. Callers hold the lock; a fetch-add is enough
 * because fast paths only ever move `available` while nobody waits, and a
 * waiter joins only while no permit is available. */
SLUICE_INLINE void sluice__gate_add(struct sluice_gate *g, uint64_t delta)
{
    atomic_fetch_add_explicit(&g->word, delta, SLUICE_ACQ_REL);
}

/* Move a sleeping waiter back to WAITING without granting anything, so it
 * re-checks its condition. Returns true if it was asleep (then wake it). */
SLUICE_INLINE bool sluice__gate_unsleep(struct sluice_gate_node *n)
{
    uint32_t sleeping = SLUICE__NODE_SLEEPING;
    return atomic_compare_exchange_strong_explicit(&n->state, &sleeping, SLUICE__NODE_WAITING,
                                                   SLUICE_SEQ_CST, SLUICE_SEQ_CST);
}

/*
 * With the lock held, give one permit to the queue's head if there is one
 * and no limit cut is outstanding; otherwise make it available. Returns the
 * node to hand the permit to (after unlocking), or NULL. If the new head is
 * asleep, it is roused and *rouse set: waking it now, while the permit it
 * will get is still in use, hides the wake-up latency behind that use.
 */
SLUICE_INLINE struct sluice_gate_node *sluice__gate_give_locked(struct sluice_gate *g,
                                                               _Atomic(uint32_t) **rouse)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_ACQUIRE);
    if (sluice__gate_available(w) < 0 || !g->head) {
        sluice__gate_add(g, 1);
        return NULL;
    }
    struct sluice_gate_node *n = g->head;
    sluice__gate_unlink(g, n);
    sluice__gate_add(g, (uint64_t)0 - SLUICE__GATE_ONE_WAITER);
    struct sluice_gate_node *next = g->head;
    if (rouse && next && !next->async && sluice__gate_unsleep(next))
        *rouse = &next->state;
    return n;
}

/* ---- async outcomes: the per-thread trampoline ---------------------------- */

/* Decided async outcomes whose callbacks have not run yet, in decision
 * order, and whether a frame of this thread is already running them. It is
 * empty whenever no gate call is in progress on the thread. */
struct sluice__gate_trampoline {
    struct sluice_gate_node *head, *tail; /* linked through node->next */
    bool running;
};

/* One list per thread for the whole program, not one per translation unit
 * (which a `static` would make): a callback that gives its permit back
 * through code in another .c file must find the list its caller is already
 * running. Every unit that includes this header emits a weak definition and
 * the linker keeps one; default visibility lets the dynamic linker bind a
 * shared library's references to the same one. */
extern SLUICE_THREAD_LOCAL struct sluice__gate_trampoline sluice__gate_pending;
__attribute__((weak, visibility("default"))) SLUICE_THREAD_LOCAL
    struct sluice__gate_trampoline sluice__gate_pending;

/* The status an async callback gets for a verdict. */
SLUICE_INLINE int sluice__gate_status(uint32_t verdict)
{
    return verdict == SLUICE__NODE_GRANTED  ? (int)SLUICE_OK
           : verdict == SLUICE__NODE_CLOSED ? (int)SLUICE_ECLOSED
                                            : (int)SLUICE_ECANCELED;
}

/* Queue an async node's verdict for its callback (a wake node's runs now). */
SLUICE_INLINE void sluice__gate_defer(struct sluice_gate_node *n, uint32_t verdict)
{
    struct sluice__gate_trampoline *t = &sluice__gate_pending;
    if (n->wake) {
        /* A blocked caller behind an async node (a pool with lingering
         * permits): woken now, like a sync waiter, never behind callbacks. */
        struct sluice_gate_waiter *w = n->async;
        w->cb(w, sluice__gate_status(verdict));
        return;
    }
    atomic_store_explicit(&n->state, verdict, SLUICE_RELAXED);
    n->next = NULL;
    if (t->tail)
        t->tail->next = n;
    else
        t->head = n;
    t->tail = n;
}

/*
 * Run the deferred callbacks, unless an outer frame of this thread already
 * is (it will reach them after its current callback returns). Every gate
 * call that may have deferred one ends with this, so a callback that calls
 * back into a gate never nests another callback inside itself.
 */
SLUICE_INLINE void sluice__gate_run_callbacks(void)
{
    struct sluice__gate_trampoline *t = &sluice__gate_pending;
    if (t->running || !t->head)
        return;
    t->running = true;
    struct sluice_gate_node *n;
    while ((n = t->head) != NULL) {
        t->head = n->next;
        if (!t->head)
            t->tail = NULL;
        struct sluice_gate_waiter *w = n->async;
        int status = sluice__gate_status(atomic_load_explicit(&n->state, SLUICE_RELAXED));
        w->cb(w, status); /* last touch: the record is the owner's again */
    }
    t->running = false;
}

/*
 * Hold this thread's async callbacks back, as if a callback were running,
 * until sluice_gate_resume_callbacks(outer) with what this returned (true:
 * this frame is the outermost and will run them). For a caller whose one
 * operation both releases and hands out other grants (the pool's call_end:
 * a release, then the grants of a limit raise): every sync waiter it
 * grants is woken before any callback runs. Outcomes decided meanwhile
 * queue on the thread's trampoline; none is lost. Pairs nest: an inner
 * pair (or a call from inside a callback) gets false and leaves the
 * running to the outermost. Call both on the same thread, with no lock
 * held that a callback might take around the resume.
 */
SLUICE_INLINE bool sluice_gate_hold_callbacks(void)
{
    struct sluice__gate_trampoline *t = &sluice__gate_pending;
    bool outer = !t->running;
    t->running = true;
    return outer;
}

/* End a sluice_gate_hold_callbacks; `outer` is what it returned. When true,
 * runs every callback decided meanwhile, in decision order, on this thread. */
SLUICE_INLINE void sluice_gate_resume_callbacks(bool outer)
{
    if (!outer)
        return;
    sluice__gate_pending.running = false;
    sluice__gate_run_callbacks();
}

/*
 * Hand a verdict (GRANTED or CLOSED) to a popped node: a sync waiter is
 * woken now; an async one is deferred to the trampoline, so the caller must
 * end with sluice__gate_run_callbacks. Last touch of a sync node.
 */
SLUICE_INLINE void sluice__gate_notify(struct sluice_gate_node *n, uint32_t verdict)
{
    if (n->async) {
        sluice__gate_defer(n, verdict);
        return;
    }
    /* After this exchange the waiter may return and free its node; a
     * FUTEX_WAKE on a dead private address is harmless (glibc relies on
     * the same for mutex unlock). */
    if (atomic_exchange_explicit(&n->state, verdict, SLUICE_SEQ_CST) == SLUICE__NODE_SLEEPING)
        sluice_futex_wake(&n->state);
}

/* ---- release -------------------------------------------------------------- */

SLUICE_INLINE void sluice__gate_release_slow(struct sluice_gate *g)
{
    _Atomic(uint32_t) *rouse = NULL;
    sluice_spinlock_lock(&g->lock);
    struct sluice_gate_node *n = sluice__gate_give_locked(g, &rouse);
    sluice_spinlock_unlock(&g->lock);
    if (n)
        sluice__gate_notify(n, SLUICE__NODE_GRANTED);
    /* The roused waiter looks awake to every later waker (a grant or its
     * token, possibly from the callback below), so nobody else will wake
     * it: this wake must come before any callback runs. */
    if (rouse)
        sluice_futex_wake(rouse);
    sluice__gate_run_callbacks();
}

/* Give a permit back. Wakes at most the one waiter next in line. */
SLUICE_INLINE void sluice_gate_release(struct sluice_gate *g)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    while (sluice__gate_waiters(w) == 0) {
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, w + 1, SLUICE_RELEASE,
                                                  SLUICE_RELAXED))
            return;
    }
    sluice__gate_release_slow(g);
}

/* ---- acquire -------------------------------------------------------------- */

/* Take an available permit if nobody is queued; never jumps the queue. */
SLUICE_INLINE bool sluice__gate_take_fast(struct sluice_gate *g)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    while (sluice__gate_available(w) > 0 && sluice__gate_waiters(w) == 0) {
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, w - 1, SLUICE_ACQUIRE,
                                                  SLUICE_RELAXED))
            return true;
    }
    return false;
}

/* Make every field of a node the gate's, whatever the memory held before. */
SLUICE_INLINE void sluice__gate_node_init(struct sluice_gate_node *n,
                                          struct sluice_gate_waiter *async)
{
    n->next = n->prev = NULL;
    n->queued = false;
    n->wake = false;
    n->async = async;
    atomic_store_explicit(&n->state, SLUICE__NODE_WAITING, SLUICE_RELAXED);
}

/*
 * Under the lock: take a permit that became free since the fast path
 * failed, or join the queue with an initialised node. Returns SLUICE_OK
 * (granted, not queued), SLUICE_EAGAIN (queued) or SLUICE_ECLOSED.
 */
SLUICE_INLINE int sluice__gate_join(struct sluice_gate *g, struct sluice_gate_node *n)
{
    sluice_spinlock_lock(&g->lock);
    int status;
    if (atomic_load_explicit(&g->closed, SLUICE_ACQUIRE)) {
        status = SLUICE_ECLOSED;
    } else {
        /* One CAS decides, against fast releases racing us: either a permit
         * is free (take it) or we count ourselves as a waiter, after which
         * no release can make a permit available without seeing us. */
        uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
        for (;;) {
            bool free_permit = sluice__gate_available(w) > 0 && sluice__gate_waiters(w) == 0;
            uint64_t next = free_permit ? w - 1 : w + SLUICE__GATE_ONE_WAITER;
            if (atomic_compare_exchange_weak_explicit(&g->word, &w, next, SLUICE_ACQ_REL,
                                                      SLUICE_RELAXED)) {
                status = free_permit ? SLUICE_OK : SLUICE_EAGAIN;
                break;
            }
        }
        if (status == SLUICE_EAGAIN)
            sluice__gate_enqueue(g, n);
    }
    sluice_spinlock_unlock(&g->lock);
    return status;
}

/*
 * Leave the queue. Returns true if the node was still queued (it holds
 * nothing); false if it was already popped by a grant or close, whose
 * verdict is on its way.
 */
SLUICE_INLINE bool sluice__gate_leave(struct sluice_gate *g, struct sluice_gate_node *n)
{
    sluice_spinlock_lock(&g->lock);
    bool queued = n->queued;
    if (queued) {
        sluice__gate_unlink(g, n);
        sluice__gate_add(g, (uint64_t)0 - SLUICE__GATE_ONE_WAITER);
    }
    sluice_spinlock_unlock(&g->lock);
    return queued;
}

struct sluice__gate_cancel_hook {
    struct sluice_cancel_hook hook;
    struct sluice_gate_node *node;
};

static inline void sluice__gate_on_cancel(struct sluice_cancel_hook *hook)
{
    struct sluice_gate_node *n = ((struct sluice__gate_cancel_hook *)hook)->node;
    /* Wake without granting: the waiter sees the token and leaves. */
    if (sluice__gate_unsleep(n))
        sluice_futex_wake(&n->state);
}

SLUICE_INLINE uint32_t sluice__gate_verdict(struct sluice_gate_node *n)
{
    uint32_t s = atomic_load_explicit(&n->state, SLUICE_ACQUIRE);
    return s == SLUICE__NODE_GRANTED || s == SLUICE__NODE_CLOSED ? s : (uint32_t)SLUICE__NODE_WAITING;
}

/*
 * The waiter gives up: leave the queue, or pass on a grant that won the
 * race. A popped node's verdict is on its way, but the popper may deliver
 * it late (preempted, or a set_limit_collect caller finishing work under
 * its own lock first): spin briefly, then park until it lands.
 */
SLUICE_INLINE int sluice__gate_abandon(struct sluice_gate *g, struct sluice_gate_node *n, int status)
{
    if (sluice__gate_leave(g, n))
        return status;
    uint32_t verdict = sluice_park_while(&n->state, SLUICE__NODE_WAITING, SLUICE__NODE_SLEEPING);
    if (verdict == SLUICE__NODE_GRANTED)
        sluice_gate_release(g);
    return verdict == SLUICE__NODE_CLOSED ? (int)SLUICE_ECLOSED : status;
}

/*
 * How a wait that got no permit ends: `status` (ETIMEDOUT, ECLOSED, ...)
 * unless `cancel` (may be NULL) has fired by now, then SLUICE_ECANCELED;
 * SLUICE_EINVAL stays itself (an argument error is no wait). The gate's own
 * waits end through it, and a layer that waits on more than the gate (the
 * pool: a permit, then a Retry-After hold) ends its failures through it
 * too, so "cancel wins" means the same everywhere (sluice/cancel.h).
 */
SLUICE_INLINE int sluice_gate_failed(int status, const struct sluice_cancel *cancel)
{
    return status != SLUICE_EINVAL && sluice_cancel_fired(cancel) ? (int)SLUICE_ECANCELED : status;
}

SLUICE_INLINE int sluice__gate_wait(struct sluice_gate *g, const struct timespec *deadline,
                                    struct sluice_cancel *cancel)
{
    struct sluice_gate_node node;
    sluice__gate_node_init(&node, NULL);
    int status = sluice__gate_join(g, &node);
    if (status != SLUICE_EAGAIN)
        return status == SLUICE_OK ? status : sluice_gate_failed(status, cancel);
    struct sluice__gate_cancel_hook hook;
    hook.hook.fn = sluice__gate_on_cancel;
    hook.node = &node;
    bool hooked = cancel && sluice_cancel_register(cancel, &hook.hook);
    for (;;) {
        uint32_t verdict = sluice__gate_verdict(&node);
        if (verdict != SLUICE__NODE_WAITING) {
            status = verdict == SLUICE__NODE_GRANTED ? (int)SLUICE_OK : (int)SLUICE_ECLOSED;
            break;
        }
        status = sluice_wait_stop_reason(deadline, cancel);
        if (status != SLUICE_OK) {
            status = sluice__gate_abandon(g, &node, status);
            break;
        }
        /* Next in line: the grant is probably moments away. */
        for (int i = 0; i < SLUICE_PARK_SPIN &&
                        atomic_load_explicit(&g->head_hint, SLUICE_RELAXED) == &node &&
                        sluice__gate_verdict(&node) == SLUICE__NODE_WAITING;
             i++)
            sluice_cpu_relax();
        uint32_t waiting = SLUICE__NODE_WAITING;
        if (!atomic_compare_exchange_strong_explicit(&node.state, &waiting, SLUICE__NODE_SLEEPING,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue; /* a verdict just landed */
        /* Re-check after announcing sleep: a token fired in between found us
         * WAITING and did not wake us. */
        int slept = SLUICE_OK;
        if (sluice_wait_stop_reason(deadline, cancel) == SLUICE_OK)
            slept = sluice_futex_wait(&node.state, SLUICE__NODE_SLEEPING, deadline);
        sluice__gate_unsleep(&node);
        if (SLUICE_UNLIKELY(slept == SLUICE_EINVAL)) {
            /* The kernel refuses to sleep: looping would spin, so give up. */
            status = sluice__gate_abandon(g, &node, slept);
            break;
        }
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &hook.hook);
    return status == SLUICE_OK ? status : sluice_gate_failed(status, cancel);
}

/*
 * Take a permit, waiting in FIFO order until `deadline` (absolute
 * CLOCK_MONOTONIC; NULL = none) or until `cancel` fires (NULL = none).
 * Returns SLUICE_OK (caller holds a permit and must release it),
 * SLUICE_ECANCELED, SLUICE_ETIMEDOUT or SLUICE_ECLOSED (caller holds nothing),
 * or SLUICE_EINVAL for a deadline that is not normalised (time.h). A token
 * that has already fired fails at once, even on a closed gate; a deadline
 * that has passed, or one more than a year ahead (SLUICE_EINVAL: read from
 * CLOCK_REALTIME), is only noticed once the call has to wait.
 */
SLUICE_INLINE int sluice_gate_acquire(struct sluice_gate *g, const struct timespec *deadline,
                                      struct sluice_cancel *cancel)
{
    /* Checked whether or not the call waits, so a bad deadline cannot hide
     * until the gate is contended. */
    if (SLUICE_UNLIKELY(!sluice_deadline_valid(deadline)))
        return SLUICE_EINVAL;
    /* A fired token fails every acquire, even one that would not wait, so
     * "cancel wins before the call starts" needs no check by the caller. */
    if (cancel && sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return sluice_gate_failed(SLUICE_ECLOSED, cancel); /* a token firing meanwhile wins */
    if (SLUICE_LIKELY(sluice__gate_take_fast(g)))
        return SLUICE_OK;
    return sluice__gate_wait(g, deadline, cancel);
}

/*
 * Take a permit only if one is free and nobody is waiting: never jumps the
 * queue. Returns SLUICE_OK, SLUICE_EAGAIN or SLUICE_ECLOSED.
 */
SLUICE_INLINE int sluice_gate_tryacquire(struct sluice_gate *g)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    return sluice__gate_take_fast(g) ? SLUICE_OK : SLUICE_EAGAIN;
}

/* acquire_async; `wake`: w->cb only wakes a blocked thread, so it runs
 * when decided, before any queued callback (never nested in one's place). */
SLUICE_INLINE void sluice__gate_acquire_async(struct sluice_gate *g, struct sluice_gate_waiter *w,
                                              bool wake)
{
    struct sluice_gate_node *n = &w->sluice__node;
    sluice__gate_node_init(n, w);
    n->wake = wake;
    int status;
    if (atomic_load_explicit(&g->closed, SLUICE_RELAXED))
        status = SLUICE_ECLOSED;
    else if (sluice__gate_take_fast(g))
        status = SLUICE_OK;
    else
        status = sluice__gate_join(g, n);
    if (status == SLUICE_EAGAIN)
        return;
    sluice__gate_defer(n, status == SLUICE_OK ? SLUICE__NODE_GRANTED : SLUICE__NODE_CLOSED);
    sluice__gate_run_callbacks();
}

/*
 * Queue `w` for a permit; w->cb runs exactly once (see the header comment
 * for its thread). `w` must stay valid until then; its sluice__node may hold
 * anything beforehand (a reused record): the gate initialises it first.
 */
SLUICE_INLINE void sluice_gate_acquire_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    sluice__gate_acquire_async(g, w, false);
}

/*
 * sluice_gate_acquire_async for a record that stands for a blocked thread
 * (the pool's waiters when permits linger: they queue through the async
 * path so they can also wake for a timer of their own): w->cb only wakes
 * that thread, so it runs the moment its outcome is decided, from inside
 * the deciding gate call and before any queued callback, as a sync
 * waiter's wake would — not deferred to the trampoline. Same FIFO line,
 * same exactly-once outcomes (OK, ECANCELED through
 * sluice_gate_cancel_async, ECLOSED). So w->cb must be short, must not
 * block, and must not call back into a gate.
 */
SLUICE_INLINE void sluice_gate_acquire_async_wake(struct sluice_gate *g,
                                                  struct sluice_gate_waiter *w)
{
    sluice__gate_acquire_async(g, w, true);
}

/*
 * Make a record the gate's without queueing it, for an outcome its owner
 * decides without the gate (see sluice_gate_settle_async): whatever the
 * memory held before, it is then a fresh, unqueued waiter. Set `cb` and
 * `data` before or after; acquire_async does this itself.
 */
SLUICE_INLINE void sluice_gate_waiter_init(struct sluice_gate_waiter *w)
{
    sluice__gate_node_init(&w->sluice__node, w);
}

/* The node verdict an async outcome's status stands for (sluice__gate_status reversed). */
SLUICE_INLINE uint32_t sluice__gate_verdict_of(int status)
{
    return status == SLUICE_OK       ? (uint32_t)SLUICE__NODE_GRANTED
           : status == SLUICE_ECLOSED ? (uint32_t)SLUICE__NODE_CLOSED
                                      : (uint32_t)SLUICE__NODE_CANCELED;
}

/*
 * Deliver an outcome decided without this gate's queue — `status`
 * SLUICE_OK, SLUICE_ECLOSED or SLUICE_ECANCELED: a pool that is unlimited
 * or closed, or one settling a call that waited out a hold — to w->cb
 * through the trampoline, exactly as the gate delivers its own: now, or
 * right after the current callback when called from one, so a callback
 * that starts the next call from inside itself never nests another
 * (constant stack however long the chain). `w` is a fresh record
 * (sluice_gate_waiter_init) or one the gate let go of: granted (popped, or
 * taken at once) and never settled since. Only its trampoline fields are
 * written, never `queued`, which a racing sluice_gate_cancel_async reads
 * under the gate's lock. Settling a record the gate still queues, or one
 * twice, breaks exactly-once.
 */
SLUICE_INLINE void sluice_gate_settle_async(struct sluice_gate_waiter *w, int status)
{
    sluice__gate_defer(&w->sluice__node, sluice__gate_verdict_of(status));
    sluice__gate_run_callbacks();
}

/*
 * Withdraw an async waiter. If it was still queued, its callback runs with
 * SLUICE_ECANCELED (now, or right after the current callback when called
 * from one) and this returns SLUICE_OK. If the outcome was already decided
 * (granted, closed, or decided inline by acquire_async), returns
 * SLUICE_EAGAIN: the callback has run or is about to, with that outcome.
 * Call only after sluice_gate_acquire_async has returned, and before the
 * record is reused.
 */
SLUICE_INLINE int sluice_gate_cancel_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    if (!sluice__gate_leave(g, &w->sluice__node))
        return SLUICE_EAGAIN;
    sluice__gate_defer(&w->sluice__node, SLUICE__NODE_CANCELED);
    sluice__gate_run_callbacks();
    return SLUICE_OK;
}

/* ---- limit, stats, close -------------------------------------------------- */

/*
 * The two halves of sluice_gate_set_limit, for a caller that changes the
 * limit under a lock of its own (discovery's update lock) and must not
 * wake anyone or run a callback there.
 *
 * sluice_gate_set_limit_collect changes the limit under the gate's lock,
 * exactly as sluice_gate_set_limit does, and returns the waiters the change
 * granted (NULL: none), chained through `next` and already dequeued: each
 * holds its permit, but none has been told. The caller owns the chain
 * until it passes it, once, to sluice_gate_notify_chain, which it must do
 * after dropping its own lock and before the gate is closed or destroyed
 * (a granted waiter stays parked until then). It may keep several chains
 * and splice them (the `next` of a chain's last node is NULL; order
 * between chains does not matter, within one it is FIFO order). `limit`
 * must be at most SLUICE_GATE_LIMIT_MAX. Blocking like set_limit (the
 * gate's short spinlock); callable from any thread, concurrently with
 * every gate call.
 *
 * sluice_gate_notify_chain hands the grants out: sync waiters are woken
 * first (a futex wake each), then async callbacks run on this thread
 * (through the gate's trampoline: after the current callback when called
 * from one). Call with no lock held that a callback might take.
 */
SLUICE_INLINE struct sluice_gate_node *sluice_gate_set_limit_collect(struct sluice_gate *g,
                                                                     uint32_t limit)
{
    struct sluice_gate_node *granted = NULL, **last = &granted;
    sluice_spinlock_lock(&g->lock);
    uint32_t old = atomic_load_explicit(&g->limit, SLUICE_RELAXED);
    atomic_store_explicit(&g->limit, limit, SLUICE_RELAXED);
    if (limit < old)
        sluice__gate_add(g, (uint64_t)0 - (old - limit));
    /* New permits repay a cut first, then go to waiters in order; the rest
     * become available in one step. */
    for (uint32_t extra = limit > old ? limit - old : 0; extra > 0;) {
        int32_t available = sluice__gate_available(atomic_load_explicit(&g->word, SLUICE_ACQUIRE));
        uint32_t bulk = available < 0 ? ((uint32_t)-available < extra ? (uint32_t)-available : extra)
                        : !g->head  ? extra
                                    : 0;
        if (bulk) {
            sluice__gate_add(g, bulk);
            extra -= bulk;
            continue;
        }
        struct sluice_gate_node *n = sluice__gate_give_locked(g, NULL);
        *last = n; /* reuse the popped node's link to batch the grants */
        last = &n->next;
        extra--;
    }
    *last = NULL;
    sluice_spinlock_unlock(&g->lock);
    return granted;
}

SLUICE_INLINE void sluice_gate_notify_chain(struct sluice_gate_node *granted)
{
    while (granted) {
        struct sluice_gate_node *next = granted->next;
        sluice__gate_notify(granted, SLUICE__NODE_GRANTED);
        granted = next;
    }
    sluice__gate_run_callbacks();
}

/*
 * Change the limit. Raising it grants the newly eligible waiters now;
 * lowering it lets current holders finish and grants nobody new until the
 * number of holders is below the new limit. Returns SLUICE_EINVAL if
 * `limit` exceeds SLUICE_GATE_LIMIT_MAX.
 */
SLUICE_INLINE int sluice_gate_set_limit(struct sluice_gate *g, uint32_t limit)
{
    if (limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    sluice_gate_notify_chain(sluice_gate_set_limit_collect(g, limit));
    return SLUICE_OK;
}

SLUICE_INLINE uint32_t sluice_gate_limit(const struct sluice_gate *g)
{
    return atomic_load_explicit(&((struct sluice_gate *)g)->limit, SLUICE_RELAXED);
}

/* A snapshot of limit, holders and waiters. */
SLUICE_INLINE struct sluice_gate_counts sluice_gate_stats(const struct sluice_gate *gate)
{
    struct sluice_gate *g = (struct sluice_gate *)gate;
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_ACQUIRE);
    uint32_t limit = atomic_load_explicit(&g->limit, SLUICE_RELAXED);
    /* Every permit is either available or held (a cut shows as negative
     * availability), so holders = limit - available. */
    int64_t in_flight = (int64_t)limit - sluice__gate_available(w);
    struct sluice_gate_counts c;
    c.limit = limit;
    c.in_flight = in_flight < 0 ? 0 : (uint32_t)in_flight;
    c.waiting = sluice__gate_waiters(w);
    return c;
}

/*
 * Close the gate: every queued waiter gets SLUICE_ECLOSED (a sync waiter
 * whose token has fired gets SLUICE_ECANCELED), and so does every later
 * acquire. Holders may still release. Idempotent.
 */
SLUICE_INLINE void sluice_gate_close(struct sluice_gate *g)
{
    sluice_spinlock_lock(&g->lock);
    atomic_store_explicit(&g->closed, 1u, SLUICE_RELEASE);
    struct sluice_gate_node *n = g->head;
    uint32_t count = 0;
    for (struct sluice_gate_node *i = n; i; i = i->next, count++)
        i->queued = false;
    g->head = g->tail = NULL;
    atomic_store_explicit(&g->head_hint, (struct sluice_gate_node *)NULL, SLUICE_RELAXED);
    sluice__gate_add(g, (uint64_t)0 - count * SLUICE__GATE_ONE_WAITER);
    sluice_spinlock_unlock(&g->lock);
    while (n) {
        struct sluice_gate_node *next = n->next;
        sluice__gate_notify(n, SLUICE__NODE_CLOSED);
        n = next;
    }
    sluice__gate_run_callbacks();
}

#endif /* SLUICE_GATE_H */
