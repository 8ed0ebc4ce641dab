/*
 * sluice/gate_cqs.h — gate v2 (issue 14): the FIFO permit gate of
 * sluice/gate.h rebuilt on CQS tickets (Koval, Khalanskiy, Alistarh, PLDI
 * 2023; kotlinx.coroutines' Semaphore), with the same public API and the same
 * private hooks (sluice__gate_set_limit_collect / sluice__gate_notify_chain).
 * It defines SLUICE_GATE_H, so include it instead of sluice/gate.h, never
 * beside it. It is measured against the queue gate in bench/gate_cases.c.
 *
 * What it is: `limit` permits, FIFO by ticket, deadlines, cancel tokens
 * (cancel wins), async waiters with an exactly-once callback, a limit that
 * moves (a cut is a debt that releases repay before anyone is granted), close.
 *
 * How it works: the word of gate.h (available, signed; waiters; plus a
 * CLOSED bit above the waiters) decides who waits: the uncontended acquire
 * and release are one CAS each, and an arrival never overtakes a counted
 * waiter. A counted waiter then takes a ticket (one fetch-add on `enq`) and
 * writes its node into cell `ticket` of an unbounded array of cells, emulated
 * by a list of 32-cell segments. A release that finds waiters counted takes
 * one off the word and serves cell `deq` (one fetch-add): it claims the node
 * there (cell -> TAKEN) and wakes that one thread, or, when it arrives first,
 * leaves a PERMIT the waiter picks up on arrival (no waiting on either side,
 * and no BROKEN cells needed: the waiter was counted before its ticket, so a
 * tryacquire that fails in between fails against a real waiter: #1898).
 *
 * Cancellation is "smart" (the paper's Listing 15): a leaving waiter claims
 * its cell (node -> CANCELLING), then takes itself off the word's waiter
 * count. If it could (some waiter was still counted), its cell becomes SKIP
 * and the release that reaches it moves to the next ticket without counting
 * it; if it could not, a release already committed to it, so its cell
 * becomes REFUSE and that release puts its permit back through the word.
 * A release that meets CANCELLING leaves its job in the cell (HANDOFF) and
 * the canceller finishes it. So `waiters` is always exact (stats, and the
 * unchanged tests that read it), a cancel costs O(1), and a release never
 * waits. The paper's simple mode would leave cancelled waiters counted until
 * a release skips them, one CAS each, with the count wrong meanwhile.
 *
 * Memory: segments are reclaimed with ck_epoch, not ck_hp: every traversal is
 * a short section (a ticket, a walk of a few segments, one cell CAS), so an
 * epoch section costs one exchange where hazard pointers would cost a
 * store-load fence per segment visited. A sleeping waiter holds no section:
 * a segment is retired only once every cell in it is finished on both sides
 * (counted per segment), so the segment of a blocked waiter cannot go. The
 * epoch domain and its records belong to the gate (records are taken from and
 * returned to a ck_stack per slow-path operation, allocated lazily, never
 * seen by the embedder, and there is nothing to do at thread exit); so a
 * destroyed gate leaves no deferred callback behind in some thread's record.
 * Retired segments are recycled through a ck_stack free list: a steady state
 * allocates nothing, and a segment's memory stays the gate's until fini, so a
 * late look at a cell that was recycled meanwhile reads a value that is not
 * the looker's node, and is harmless. Segments are unlinked at the front of the list once
 * both sides are done with them; a front segment whose unserved cells are all
 * SKIP is unlinked at once and the dequeue ticket jumps over it, so timeouts
 * behind a slow holder leave memory flat. Known limit: a fully cancelled
 * segment behind a still-waiting one is only skipped, not unlinked, until it
 * reaches the front (the list has no middle removal).
 *
 * Progress: acquire blocks; every other path is lock-free (no lock at all;
 * a new segment or epoch record is allocated through the gate's allocator,
 * and running out of memory there aborts). The next waiter in line spins
 * SLUICE_PARK_SPIN pauses, the others park at once, each on the futex word of
 * its own cell (so a wake reaches exactly one thread); a grant also rouses
 * the waiter behind, as in gate.h.
 *
 * Concurrency: every function may run concurrently with every other on the
 * same gate, except init/create/destroy/fini.
 *
 * Memory ordering: fast paths as in gate.h (acquire CAS / release CAS on the
 * word); a slow-path grant claims the cell with an acq_rel CAS and hands over
 * through the node's state word (seq_cst exchange, acquire load), so a holder
 * sees everything the previous holder wrote before release().
 *
 * Async outcomes run through the same per-thread trampoline as gate.h.
 */
#ifndef SLUICE_GATE_H
#define SLUICE_GATE_H
#define SLUICE_GATE_CQS 1

#include "cancel.h"
#include "park.h"
#include "status.h"
#include "time.h"

#include <stdio.h>

#include <ck_epoch.h>
#include <ck_stack.h>

#define SLUICE_GATE_LIMIT_MAX (UINT32_C(1) << 30)
#define SLUICE__CQS_CELLS 32 /* cells per segment */

/* ---- ThreadSanitizer: ck's atomics are inline assembly it cannot see ------ */

#if SLUICE_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define SLUICE__CK(stmt)                                                                           \
    do {                                                                                           \
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);                                              \
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);                                             \
        stmt;                                                                                      \
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);                                               \
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);                                                \
    } while (0)
#define SLUICE__TSAN_RELEASE(p) __tsan_release((void *)(p))
#define SLUICE__TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define SLUICE__CK(stmt)                                                                           \
    do {                                                                                           \
        stmt;                                                                                      \
    } while (0)
#define SLUICE__TSAN_RELEASE(p) ((void)0)
#define SLUICE__TSAN_ACQUIRE(p) ((void)0)
#endif

struct sluice__cqs_segment;

/* A waiter's record. Sync waiters keep theirs on the stack; async waiters
 * embed one in struct sluice_gate_waiter. Written by the gate before use. */
struct sluice_gate_node {
    struct sluice_gate_node *next;    /* a grant batch, or the thread's trampoline */
    bool queued;                      /* the node sits in a cell (owner's view only) */
    _Atomic(uint32_t) state;          /* SLUICE__NODE_*; sync: the futex word; async: the verdict */
    struct sluice_gate_waiter *async; /* NULL for a sync waiter */
    struct sluice__cqs_segment *seg;  /* the cell's segment while queued */
    uint64_t ticket;                  /* the cell's ticket while queued */
};

struct sluice_gate_waiter;
typedef void (*sluice_gate_cb)(struct sluice_gate_waiter *waiter, int status);

struct sluice_gate_waiter {
    sluice_gate_cb cb;
    void *data;
    struct sluice_gate_node sluice__node;
};

struct sluice_gate_counts {
    uint32_t limit;
    uint32_t in_flight;
    uint32_t waiting;
};

/* Cells hold a node pointer or one of these (nodes are aligned, so a node
 * never reads as a small number). */
enum {
    SLUICE__CELL_EMPTY = 0,
    SLUICE__CELL_PERMIT = 1,     /* a release came first: the arriving waiter is granted */
    SLUICE__CELL_CLOSED = 2,     /* close came first: the arriving waiter gets ECLOSED */
    SLUICE__CELL_TAKEN = 3,      /* finished by a grant, a close, or a picked-up PERMIT */
    SLUICE__CELL_CANCELLING = 4, /* its waiter is leaving, outcome pending */
    SLUICE__CELL_SKIP = 5,       /* left and uncounted: a release moves past it */
    SLUICE__CELL_REFUSE = 6,     /* left too late: the release that comes puts its permit back */
    SLUICE__CELL_HANDOFF_GRANT = 7, /* a release met CANCELLING and left its grant to the canceller */
    SLUICE__CELL_HANDOFF_CLOSE = 8  /* the same for close */
};

/* A queued waiter's cell holds its node pointer; the waiter sets this bit
 * when it goes to sleep, on the cell itself (the low 32 bits are its futex
 * word). A waker clears it (or replaces the pointer) and wakes the cell, so
 * nobody ever needs to touch a node they have not claimed: a node may be gone
 * the moment it leaves its cell, the cell's segment is not. */
#define SLUICE__CELL_SLEEPING ((uintptr_t)2)

SLUICE_INLINE bool sluice__cell_is_node(uintptr_t v)
{
    return v > SLUICE__CELL_HANDOFF_CLOSE;
}

SLUICE_INLINE struct sluice_gate_node *sluice__cell_node(uintptr_t v)
{
    return (struct sluice_gate_node *)(v & ~SLUICE__CELL_SLEEPING);
}

/* The futex word of a cell: its low 32 bits. */
SLUICE_INLINE _Atomic(uint32_t) *sluice__cell_futex(_Atomic(uintptr_t) *cell)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (_Atomic(uint32_t) *)(void *)cell;
#else
    return (_Atomic(uint32_t) *)(void *)cell + (sizeof(uintptr_t) / sizeof(uint32_t) - 1);
#endif
}

/* Clear a sleeping waiter's bit and wake it, so it looks at the gate again
 * (a token fired, or it is next in line now). */
SLUICE_INLINE void sluice__cell_rouse(_Atomic(uintptr_t) *cell, uintptr_t node)
{
    uintptr_t v = node | SLUICE__CELL_SLEEPING;
    if (atomic_compare_exchange_strong_explicit(cell, &v, node, SLUICE_SEQ_CST, SLUICE_RELAXED))
        sluice_futex_wake(sluice__cell_futex(cell));
}

/* Serving a cell hands it one of two things: a permit, or "closed". */
enum { SLUICE__SERVE_GRANT = 0, SLUICE__SERVE_CLOSE = 1 };

struct sluice__cqs_segment {
    ck_stack_entry_t link;   /* the free list */
    ck_epoch_entry_t retire; /* the deferred return to the free list */
    struct sluice_gate *gate;
    uint64_t id; /* cells id*32 .. id*32+31 */
    _Atomic(struct sluice__cqs_segment *) next;
    _Atomic(uint32_t) enq_done; /* cells whose waiter side is finished (32 = all) */
    _Atomic(uint32_t) deq_done; /* cells whose release side is finished */
    _Atomic(uintptr_t) cells[SLUICE__CQS_CELLS];
};

struct sluice__cqs_record {
    ck_epoch_record_t rec;
    ck_stack_entry_t link;          /* the idle records */
    struct sluice__cqs_record *all; /* every record of the gate, for fini */
};

struct sluice_gate {
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) word;
    /* The waiters' side and the releasers' side each get a line. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) enq;
    _Atomic(struct sluice__cqs_segment *) tail;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) deq;
    _Atomic(struct sluice__cqs_segment *) head;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(struct sluice__cqs_segment *) first;
    SLUICE_ALIGNED(16) ck_stack_t free_segs;
    SLUICE_ALIGNED(16) ck_stack_t idle_recs;
    _Atomic(struct sluice__cqs_record *) all_recs;
    ck_epoch_t epoch;
    _Atomic(uint32_t) limit;
    _Atomic(uint32_t) closed;
    struct sluice_allocator allocator;
    bool owns_memory;
};

struct sluice_gate_desc {
    uint32_t limit; /* permits (default: 1; at most SLUICE_GATE_LIMIT_MAX) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
};

enum { SLUICE__NODE_WAITING = 0, SLUICE__NODE_SLEEPING = 1, SLUICE__NODE_GRANTED = 2,
       SLUICE__NODE_CLOSED = 3, SLUICE__NODE_CANCELED = 4 };

/* ---- the word: (waiters | CLOSED) * 2^32 + available (signed) -------------- */

#define SLUICE__GATE_ONE_WAITER (UINT64_C(1) << 32)
#define SLUICE__GATE_CLOSED_BIT UINT32_C(0x80000000)

SLUICE_INLINE int32_t sluice__gate_available(uint64_t word)
{
    return (int32_t)(uint32_t)word;
}

/* The high half: the waiter count, with the CLOSED bit on top. */
SLUICE_INLINE uint32_t sluice__gate_high(uint64_t word)
{
    return (uint32_t)((word - (uint64_t)(int64_t)sluice__gate_available(word)) >> 32);
}

SLUICE_INLINE uint32_t sluice__gate_waiters(uint64_t word)
{
    return sluice__gate_high(word) & ~SLUICE__GATE_CLOSED_BIT;
}

SLUICE_INLINE uint64_t sluice__gate_word(int32_t available, uint32_t high)
{
    return ((uint64_t)high << 32) + (uint64_t)(int64_t)available;
}

/* ---- memory: segments and epoch records ------------------------------------ */

SLUICE_INLINE void *sluice__cqs_alloc(struct sluice_gate *g, size_t size)
{
    void *p = sluice__alloc(&g->allocator, size, SLUICE_CACHELINE);
    if (SLUICE_UNLIKELY(!p)) {
        fprintf(stderr, "sluice gate: out of memory for a ticket segment\n");
        abort();
    }
    return p;
}

SLUICE_INLINE void sluice__cqs_segment_reset(struct sluice__cqs_segment *s, struct sluice_gate *g,
                                             uint64_t id)
{
    s->gate = g;
    s->id = id;
    atomic_store_explicit(&s->next, (struct sluice__cqs_segment *)NULL, SLUICE_RELAXED);
    atomic_store_explicit(&s->enq_done, 0u, SLUICE_RELAXED);
    atomic_store_explicit(&s->deq_done, 0u, SLUICE_RELAXED);
    for (int i = 0; i < SLUICE__CQS_CELLS; i++)
        atomic_store_explicit(&s->cells[i], (uintptr_t)SLUICE__CELL_EMPTY, SLUICE_RELAXED);
}

/* A segment from the free list, or a new one. Its fields are published by
 * the release CAS that links it. */
SLUICE_INLINE struct sluice__cqs_segment *sluice__cqs_segment_new(struct sluice_gate *g, uint64_t id)
{
    ck_stack_entry_t *e;
    SLUICE__CK(e = ck_stack_pop_mpmc(&g->free_segs));
    struct sluice__cqs_segment *s;
    if (e) {
        s = (struct sluice__cqs_segment *)((char *)e - offsetof(struct sluice__cqs_segment, link));
        /* Its last readers finished their sections before it came back. */
        SLUICE__TSAN_ACQUIRE(&g->epoch);
        SLUICE__TSAN_ACQUIRE(s);
    } else {
        s = (struct sluice__cqs_segment *)sluice__cqs_alloc(g, sizeof *s);
    }
    sluice__cqs_segment_reset(s, g, id);
    return s;
}

SLUICE_INLINE void sluice__cqs_segment_free(struct sluice_gate *g, struct sluice__cqs_segment *s)
{
    SLUICE__TSAN_RELEASE(s);
    SLUICE__CK(ck_stack_push_mpmc(&g->free_segs, &s->link));
}

/* ck_epoch callback: the grace period is over, recycle. */
static inline void sluice__cqs_segment_retired(ck_epoch_entry_t *e)
{
    struct sluice__cqs_segment *s =
        (struct sluice__cqs_segment *)((char *)e - offsetof(struct sluice__cqs_segment, retire));
    sluice__cqs_segment_free(s->gate, s);
}

/* Start an epoch section on an idle record of this gate (a new one if none
 * is idle: their number is the most slow-path calls ever in flight at once). */
SLUICE_INLINE struct sluice__cqs_record *sluice__cqs_enter(struct sluice_gate *g)
{
    ck_stack_entry_t *e;
    SLUICE__CK(e = ck_stack_pop_mpmc(&g->idle_recs));
    struct sluice__cqs_record *r;
    if (e) {
        r = (struct sluice__cqs_record *)((char *)e - offsetof(struct sluice__cqs_record, link));
        SLUICE__TSAN_ACQUIRE(r);
    } else {
        r = (struct sluice__cqs_record *)sluice__cqs_alloc(g, sizeof *r);
        SLUICE__CK(ck_epoch_register(&g->epoch, &r->rec, NULL));
        struct sluice__cqs_record *top = atomic_load_explicit(&g->all_recs, SLUICE_RELAXED);
        do
            r->all = top;
        while (!atomic_compare_exchange_weak_explicit(&g->all_recs, &top, r, SLUICE_RELEASE,
                                                      SLUICE_RELAXED));
    }
    SLUICE__CK(ck_epoch_begin(&r->rec, NULL));
    return r;
}

SLUICE_INLINE void sluice__cqs_leave(struct sluice_gate *g, struct sluice__cqs_record *r)
{
    SLUICE__TSAN_RELEASE(&g->epoch);
    SLUICE__CK(ck_epoch_end(&r->rec, NULL));
    if (r->rec.n_pending)
        SLUICE__CK(ck_epoch_poll(&r->rec));
    SLUICE__TSAN_RELEASE(r);
    SLUICE__CK(ck_stack_push_mpmc(&g->idle_recs, &r->link));
}

/* ---- the list of segments (callers are inside a section) ------------------- */

/* Move *hint forward to s (never back). */
SLUICE_INLINE void sluice__cqs_advance(_Atomic(struct sluice__cqs_segment *) *hint,
                                       struct sluice__cqs_segment *s)
{
    struct sluice__cqs_segment *cur = atomic_load_explicit(hint, SLUICE_ACQUIRE);
    while (cur->id < s->id &&
           !atomic_compare_exchange_weak_explicit(hint, &cur, s, SLUICE_ACQ_REL, SLUICE_ACQUIRE))
        ;
}

/*
 * The segment holding cell-segment `id`, walking forward from `from` (a hint
 * read before the ticket was taken, so never past it) and appending segments
 * as needed; then move *hint up to it. A result with a larger id means `id`
 * was unlinked (every cell in it was skipped).
 */
SLUICE_INLINE struct sluice__cqs_segment *
sluice__cqs_find(struct sluice_gate *g, _Atomic(struct sluice__cqs_segment *) *hint,
                 struct sluice__cqs_segment *from, uint64_t id)
{
    struct sluice__cqs_segment *s = from;
    while (s->id < id) {
        struct sluice__cqs_segment *n = atomic_load_explicit(&s->next, SLUICE_ACQUIRE);
        if (!n) {
            struct sluice__cqs_segment *fresh = sluice__cqs_segment_new(g, s->id + 1);
            if (atomic_compare_exchange_strong_explicit(&s->next, &n, fresh, SLUICE_ACQ_REL,
                                                        SLUICE_ACQUIRE))
                n = fresh;
            else
                sluice__cqs_segment_free(g, fresh); /* never visible: no grace needed */
        }
        s = n;
    }
    sluice__cqs_advance(hint, s);
    return s;
}

/*
 * Unlink and retire front segments nobody needs any more: both sides done
 * with every cell, or the waiter side done and every cell not yet served a
 * SKIP (then `deq` jumps past it, so no release serves them one by one).
 */
SLUICE_INLINE void sluice__cqs_trim(struct sluice_gate *g, struct sluice__cqs_record *r)
{
    for (;;) {
        struct sluice__cqs_segment *s = atomic_load_explicit(&g->first, SLUICE_ACQUIRE);
        struct sluice__cqs_segment *n = atomic_load_explicit(&s->next, SLUICE_ACQUIRE);
        if (!n || atomic_load_explicit(&s->enq_done, SLUICE_ACQUIRE) != SLUICE__CQS_CELLS)
            return;
        uint64_t start = s->id * SLUICE__CQS_CELLS, end = start + SLUICE__CQS_CELLS;
        uint64_t d = atomic_load_explicit(&g->deq, SLUICE_ACQUIRE);
        uint32_t served = d >= end ? SLUICE__CQS_CELLS : (uint32_t)(d - start);
        if (atomic_load_explicit(&s->deq_done, SLUICE_ACQUIRE) != served)
            return; /* a release is still at work in it */
        if (d < end) {
            for (uint32_t i = served; i < SLUICE__CQS_CELLS; i++)
                if (atomic_load_explicit(&s->cells[i], SLUICE_ACQUIRE) != SLUICE__CELL_SKIP)
                    return;
            /* Nothing left to serve here: jump, unless a release took a
             * ticket meanwhile (then look again). */
            if (!atomic_compare_exchange_strong_explicit(&g->deq, &d, end, SLUICE_ACQ_REL,
                                                         SLUICE_ACQUIRE))
                continue;
        }
        struct sluice__cqs_segment *expect = s;
        atomic_compare_exchange_strong_explicit(&g->head, &expect, n, SLUICE_ACQ_REL, SLUICE_RELAXED);
        expect = s;
        atomic_compare_exchange_strong_explicit(&g->tail, &expect, n, SLUICE_ACQ_REL, SLUICE_RELAXED);
        expect = s;
        if (atomic_compare_exchange_strong_explicit(&g->first, &expect, n, SLUICE_ACQ_REL,
                                                    SLUICE_RELAXED))
            SLUICE__CK(ck_epoch_call(&r->rec, &s->retire, sluice__cqs_segment_retired));
    }
}

/* ---- init, create, fini, destroy ------------------------------------------- */

SLUICE_INLINE void sluice__gate_setup(struct sluice_gate *g, uint32_t limit,
                                      const struct sluice_allocator *a)
{
    atomic_init(&g->word, sluice__gate_word((int32_t)limit, 0));
    atomic_init(&g->enq, (uint64_t)0);
    atomic_init(&g->deq, (uint64_t)0);
    ck_stack_init(&g->free_segs);
    ck_stack_init(&g->idle_recs);
    atomic_init(&g->all_recs, (struct sluice__cqs_record *)NULL);
    ck_epoch_init(&g->epoch);
    atomic_init(&g->limit, limit);
    atomic_init(&g->closed, 0u);
    g->allocator.alloc = a ? a->alloc : NULL;
    g->allocator.free = a ? a->free : NULL;
    g->allocator.ctx = a ? a->ctx : NULL;
    g->owns_memory = false;
    struct sluice__cqs_segment *s = sluice__cqs_segment_new(g, 0);
    atomic_init(&g->head, s);
    atomic_init(&g->tail, s);
    atomic_init(&g->first, s);
    /* One record up front, so the first wait allocates nothing. */
    sluice__cqs_leave(g, sluice__cqs_enter(g));
}

/* Initialise a gate in caller storage (it allocates its first segment with
 * aligned_alloc; sluice_gate_fini frees what it allocated). */
SLUICE_INLINE int sluice_gate_init(struct sluice_gate *g, uint32_t limit)
{
    if (!g || limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    sluice__gate_setup(g, limit, NULL);
    return SLUICE_OK;
}

SLUICE_INLINE int sluice_gate_create(const struct sluice_gate_desc *desc, struct sluice_gate **out)
{
    uint32_t limit = desc && desc->limit ? desc->limit : 1;
    const struct sluice_allocator *a = desc ? desc->allocator : NULL;
    *out = NULL;
    if (limit > SLUICE_GATE_LIMIT_MAX || !sluice__allocator_valid(a))
        return SLUICE_EINVAL;
    struct sluice_gate *g = (struct sluice_gate *)sluice__alloc(a, sizeof *g, SLUICE_CACHELINE);
    if (!g)
        return SLUICE_ENOMEM;
    sluice__gate_setup(g, limit, a);
    g->owns_memory = true;
    *out = g;
    return SLUICE_OK;
}

/* Free every segment and record (linked, retired, free). No thread may be
 * using the gate: records still holding deferred segments are drained too. */
SLUICE_INLINE void sluice_gate_fini(struct sluice_gate *g)
{
    struct sluice__cqs_record *r = atomic_load_explicit(&g->all_recs, SLUICE_ACQUIRE);
    for (struct sluice__cqs_record *i = r; i; i = i->all)
        SLUICE__CK(ck_epoch_barrier(&i->rec)); /* deferred segments -> free list */
    struct sluice__cqs_segment *s = atomic_load_explicit(&g->first, SLUICE_ACQUIRE);
    while (s) {
        struct sluice__cqs_segment *n = atomic_load_explicit(&s->next, SLUICE_RELAXED);
        sluice__free(&g->allocator, s, sizeof *s);
        s = n;
    }
    ck_stack_entry_t *e;
    while ((e = ck_stack_pop_npsc(&g->free_segs)) != NULL)
        sluice__free(&g->allocator, (char *)e - offsetof(struct sluice__cqs_segment, link),
                     sizeof(struct sluice__cqs_segment));
    while (r) {
        struct sluice__cqs_record *n = r->all;
        sluice__free(&g->allocator, r, sizeof *r);
        r = n;
    }
    atomic_store_explicit(&g->all_recs, (struct sluice__cqs_record *)NULL, SLUICE_RELAXED);
    atomic_store_explicit(&g->first, (struct sluice__cqs_segment *)NULL, SLUICE_RELAXED);
}

SLUICE_INLINE void sluice_gate_destroy(struct sluice_gate *g)
{
    if (!g || !g->owns_memory)
        return;
    sluice_gate_fini(g);
    struct sluice_allocator a = g->allocator;
    sluice__free(&a, g, sizeof *g);
}

/* ---- async outcomes: the per-thread trampoline (as in gate.h) ------------- */

struct sluice__gate_trampoline {
    struct sluice_gate_node *head, *tail;
    bool running;
};

static SLUICE_THREAD_LOCAL struct sluice__gate_trampoline sluice__gate_pending SLUICE_UNUSED;

SLUICE_INLINE void sluice__gate_defer(struct sluice_gate_node *n, uint32_t verdict)
{
    struct sluice__gate_trampoline *t = &sluice__gate_pending;
    n->next = NULL;
    /* Release: cancel_async reads it to know the cell is no longer its own. */
    atomic_store_explicit(&n->state, verdict, SLUICE_RELEASE);
    if (t->tail)
        t->tail->next = n;
    else
        t->head = n;
    t->tail = n;
}

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
        uint32_t verdict = atomic_load_explicit(&n->state, SLUICE_RELAXED);
        int status = verdict == SLUICE__NODE_GRANTED  ? (int)SLUICE_OK
                     : verdict == SLUICE__NODE_CLOSED ? (int)SLUICE_ECLOSED
                                                      : (int)SLUICE_ECANCELED;
        w->cb(w, status);
    }
    t->running = false;
}

/*
 * Hand a verdict to a node whose cell was claimed for it. The waiter may
 * still touch its cell until it sees the verdict, so the waiter side of the
 * cell is finished only after (its segment is read first: the node may be
 * gone once the verdict lands).
 */
SLUICE_INLINE void sluice__gate_notify(struct sluice_gate_node *n, uint32_t verdict)
{
    struct sluice__cqs_segment *s = n->seg;
    if (n->async)
        sluice__gate_defer(n, verdict);
    else if (atomic_exchange_explicit(&n->state, verdict, SLUICE_SEQ_CST) == SLUICE__NODE_SLEEPING)
        sluice_futex_wake(&n->state);
    atomic_fetch_add_explicit(&s->enq_done, 1u, SLUICE_ACQ_REL);
}

/* ---- serving cells ---------------------------------------------------------- */

SLUICE_INLINE void sluice__cqs_put_permit(struct sluice_gate *g, struct sluice__cqs_record *r,
                                          struct sluice_gate_node ***chain);

/*
 * Serve the next cell that still wants it with `kind`, after the caller took
 * one waiter off the word (grant) or all of them (close, once per waiter).
 * A claimed node goes on *chain when chain is given (the caller notifies it
 * later), else it is notified now.
 */
SLUICE_INLINE void sluice__cqs_serve(struct sluice_gate *g, struct sluice__cqs_record *r, int kind,
                                     struct sluice_gate_node ***chain)
{
    for (;;) {
        struct sluice__cqs_segment *from = atomic_load_explicit(&g->head, SLUICE_ACQUIRE);
        uint64_t t = atomic_fetch_add_explicit(&g->deq, 1, SLUICE_ACQ_REL);
        struct sluice__cqs_segment *s = sluice__cqs_find(g, &g->head, from, t / SLUICE__CQS_CELLS);
        if (s->id != t / SLUICE__CQS_CELLS)
            continue; /* its segment was all SKIP and is gone */
        _Atomic(uintptr_t) *cell = &s->cells[t % SLUICE__CQS_CELLS];
        uintptr_t v = atomic_load_explicit(cell, SLUICE_ACQUIRE);
        for (;;) {
            uintptr_t to;
            if (v == SLUICE__CELL_EMPTY)
                to = kind == SLUICE__SERVE_GRANT ? SLUICE__CELL_PERMIT : SLUICE__CELL_CLOSED;
            else if (v == SLUICE__CELL_CANCELLING)
                to = kind == SLUICE__SERVE_GRANT ? SLUICE__CELL_HANDOFF_GRANT
                                                 : SLUICE__CELL_HANDOFF_CLOSE;
            else if (v == SLUICE__CELL_SKIP || v == SLUICE__CELL_REFUSE)
                break;
            else
                to = SLUICE__CELL_TAKEN; /* a node */
            if (atomic_compare_exchange_weak_explicit(cell, &v, to, SLUICE_ACQ_REL, SLUICE_ACQUIRE))
                break;
        }
        if (sluice__cell_is_node(v)) {
            if (v & SLUICE__CELL_SLEEPING)
                sluice_futex_wake(sluice__cell_futex(cell));
            if (kind == SLUICE__SERVE_GRANT) {
                /* Rouse the waiter now next in line, so its wake-up overlaps
                 * the use of this permit rather than following it. */
                uint64_t nt = t + 1;
                struct sluice__cqs_segment *ns =
                    nt % SLUICE__CQS_CELLS ? s : atomic_load_explicit(&s->next, SLUICE_ACQUIRE);
                if (ns) {
                    _Atomic(uintptr_t) *next = &ns->cells[nt % SLUICE__CQS_CELLS];
                    uintptr_t nv = atomic_load_explicit(next, SLUICE_RELAXED);
                    if (sluice__cell_is_node(nv) && (nv & SLUICE__CELL_SLEEPING))
                        sluice__cell_rouse(next, nv & ~SLUICE__CELL_SLEEPING);
                }
            }
        }
        atomic_fetch_add_explicit(&s->deq_done, 1u, SLUICE_ACQ_REL);
        if (v == SLUICE__CELL_SKIP)
            continue; /* its waiter left uncounted: serve the next one */
        if (v == SLUICE__CELL_REFUSE) {
            if (kind == SLUICE__SERVE_GRANT)
                sluice__cqs_put_permit(g, r, chain); /* its waiter left: the permit goes back */
            return;
        }
        if (sluice__cell_is_node(v)) { /* a node, now ours */
            struct sluice_gate_node *n = sluice__cell_node(v);
            if (chain && kind == SLUICE__SERVE_GRANT) {
                **chain = n;
                *chain = &n->next;
            } else {
                sluice__gate_notify(n, kind == SLUICE__SERVE_GRANT ? SLUICE__NODE_GRANTED
                                                                   : SLUICE__NODE_CLOSED);
            }
        }
        return; /* EMPTY (a PERMIT or CLOSED left) or CANCELLING (handed off) */
    }
}

/*
 * Give one permit back through the word: repay a limit cut first, else
 * serve the next counted waiter, else make it available.
 */
SLUICE_INLINE void sluice__cqs_put_permit(struct sluice_gate *g, struct sluice__cqs_record *r,
                                          struct sluice_gate_node ***chain)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    for (;;) {
        bool serve = sluice__gate_available(w) >= 0 && sluice__gate_waiters(w) > 0;
        uint64_t next = serve ? w - SLUICE__GATE_ONE_WAITER : w + 1;
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, next, SLUICE_ACQ_REL,
                                                  SLUICE_RELAXED)) {
            if (serve)
                sluice__cqs_serve(g, r, SLUICE__SERVE_GRANT, chain);
            return;
        }
    }
}

/* ---- release ---------------------------------------------------------------- */

SLUICE_INLINE void sluice__gate_release_slow(struct sluice_gate *g)
{
    struct sluice__cqs_record *r = sluice__cqs_enter(g);
    sluice__cqs_put_permit(g, r, NULL);
    sluice__cqs_trim(g, r);
    sluice__cqs_leave(g, r);
    sluice__gate_run_callbacks();
}

/* Give a permit back. Wakes at most the one waiter next in line. */
SLUICE_INLINE void sluice_gate_release(struct sluice_gate *g)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    while (sluice__gate_high(w) == 0) {
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, w + 1, SLUICE_RELEASE,
                                                  SLUICE_RELAXED))
            return;
    }
    sluice__gate_release_slow(g);
}

/* ---- acquire ---------------------------------------------------------------- */

/* Take an available permit if nobody is counted waiting and the gate is
 * open (the CLOSED bit makes the high half non-zero); never jumps the queue. */
SLUICE_INLINE bool sluice__gate_take_fast(struct sluice_gate *g)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    while (sluice__gate_available(w) > 0 && sluice__gate_high(w) == 0) {
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, w - 1, SLUICE_ACQUIRE,
                                                  SLUICE_RELAXED))
            return true;
    }
    return false;
}

SLUICE_INLINE void sluice__gate_node_init(struct sluice_gate_node *n,
                                          struct sluice_gate_waiter *async)
{
    n->next = NULL;
    n->queued = false;
    n->async = async;
    n->seg = NULL;
    n->ticket = 0;
    atomic_store_explicit(&n->state, SLUICE__NODE_WAITING, SLUICE_RELAXED);
}

/*
 * Take a permit that became free since the fast path failed, or count
 * ourselves a waiter and take a cell. Returns SLUICE_OK (granted, not
 * queued), SLUICE_EAGAIN (queued: the node is in its cell) or SLUICE_ECLOSED.
 */
SLUICE_INLINE int sluice__gate_join(struct sluice_gate *g, struct sluice_gate_node *n)
{
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    bool free_permit;
    for (;;) {
        if (sluice__gate_high(w) & SLUICE__GATE_CLOSED_BIT)
            return SLUICE_ECLOSED;
        free_permit = sluice__gate_available(w) > 0 && sluice__gate_high(w) == 0;
        uint64_t next = free_permit ? w - 1 : w + SLUICE__GATE_ONE_WAITER;
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, next, SLUICE_ACQ_REL,
                                                  SLUICE_RELAXED))
            break;
    }
    if (free_permit)
        return SLUICE_OK;
    struct sluice__cqs_record *r = sluice__cqs_enter(g);
    struct sluice__cqs_segment *from = atomic_load_explicit(&g->tail, SLUICE_ACQUIRE);
    uint64_t t = atomic_fetch_add_explicit(&g->enq, 1, SLUICE_ACQ_REL);
    struct sluice__cqs_segment *s = sluice__cqs_find(g, &g->tail, from, t / SLUICE__CQS_CELLS);
    _Atomic(uintptr_t) *cell = &s->cells[t % SLUICE__CQS_CELLS];
    /* Written before the CAS publishes the node: after it, a grant may run
     * an async callback that reuses the record. */
    n->seg = s;
    n->ticket = t;
    n->queued = true;
    uintptr_t v = SLUICE__CELL_EMPTY;
    int status = SLUICE_EAGAIN;
    if (!atomic_compare_exchange_strong_explicit(cell, &v, (uintptr_t)n, SLUICE_ACQ_REL,
                                                 SLUICE_ACQUIRE)) {
        /* A release (or close) served this cell before we arrived. */
        n->queued = false;
        atomic_store_explicit(cell, (uintptr_t)SLUICE__CELL_TAKEN, SLUICE_RELAXED);
        atomic_fetch_add_explicit(&s->enq_done, 1u, SLUICE_ACQ_REL);
        status = v == SLUICE__CELL_PERMIT ? (int)SLUICE_OK : (int)SLUICE_ECLOSED;
    }
    sluice__cqs_leave(g, r);
    return status;
}

/*
 * Leave the queue. Returns true if the node left (it holds nothing); false if
 * its cell was already claimed by a grant or close, whose verdict is on its
 * way (the caller waits for it).
 */
SLUICE_INLINE bool sluice__gate_leave(struct sluice_gate *g, struct sluice_gate_node *n)
{
    struct sluice__cqs_record *r = sluice__cqs_enter(g);
    uint32_t st = atomic_load_explicit(&n->state, SLUICE_ACQUIRE);
    if (st != SLUICE__NODE_WAITING && st != SLUICE__NODE_SLEEPING) {
        sluice__cqs_leave(g, r); /* decided, and the cell may be gone */
        return false;
    }
    struct sluice__cqs_segment *s = n->seg;
    _Atomic(uintptr_t) *cell = &s->cells[n->ticket % SLUICE__CQS_CELLS];
    uintptr_t v = atomic_load_explicit(cell, SLUICE_ACQUIRE);
    do {
        if (!sluice__cell_is_node(v) || sluice__cell_node(v) != n) {
            sluice__cqs_leave(g, r); /* claimed by a grant or close */
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(cell, &v, (uintptr_t)SLUICE__CELL_CANCELLING,
                                                    SLUICE_ACQ_REL, SLUICE_ACQUIRE));
    n->queued = false;
    /* Uncount ourselves if a waiter is still counted; otherwise a release
     * (or close) is already committed to this cell. */
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    bool uncounted = false;
    while (sluice__gate_waiters(w) > 0) {
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, w - SLUICE__GATE_ONE_WAITER,
                                                  SLUICE_ACQ_REL, SLUICE_RELAXED)) {
            uncounted = true;
            break;
        }
    }
    v = SLUICE__CELL_CANCELLING;
    uintptr_t to = uncounted ? SLUICE__CELL_SKIP : SLUICE__CELL_REFUSE;
    if (!atomic_compare_exchange_strong_explicit(cell, &v, to, SLUICE_ACQ_REL, SLUICE_ACQUIRE)) {
        /* A server came meanwhile and left its job to us. */
        int kind = v == SLUICE__CELL_HANDOFF_GRANT ? SLUICE__SERVE_GRANT : SLUICE__SERVE_CLOSE;
        if (uncounted)
            sluice__cqs_serve(g, r, kind, NULL); /* it was meant for a waiter after us */
        else if (kind == SLUICE__SERVE_GRANT)
            sluice__cqs_put_permit(g, r, NULL); /* it was meant for us: give it back */
    }
    atomic_fetch_add_explicit(&s->enq_done, 1u, SLUICE_ACQ_REL);
    sluice__cqs_trim(g, r);
    sluice__cqs_leave(g, r);
    return true;
}

struct sluice__gate_cancel_hook {
    struct sluice_cancel_hook hook;
    struct sluice_gate_node *node;
};

/* Move a node sleeping on its state back to WAITING without a verdict.
 * Returns true if it was asleep (then wake it). */
SLUICE_INLINE bool sluice__gate_unsleep(struct sluice_gate_node *n)
{
    uint32_t sleeping = SLUICE__NODE_SLEEPING;
    return atomic_compare_exchange_strong_explicit(&n->state, &sleeping, SLUICE__NODE_WAITING,
                                                   SLUICE_SEQ_CST, SLUICE_SEQ_CST);
}

/* A token fired: wake the waiter without granting, so it sees the token and
 * leaves (it sleeps on its cell, or on its node while a verdict is due). */
static inline void sluice__gate_on_cancel(struct sluice_cancel_hook *hook)
{
    struct sluice_gate_node *n = ((struct sluice__gate_cancel_hook *)hook)->node;
    sluice__cell_rouse(&n->seg->cells[n->ticket % SLUICE__CQS_CELLS], (uintptr_t)n);
    if (sluice__gate_unsleep(n))
        sluice_futex_wake(&n->state);
}

SLUICE_INLINE uint32_t sluice__gate_verdict(struct sluice_gate_node *n)
{
    uint32_t s = atomic_load_explicit(&n->state, SLUICE_ACQUIRE);
    return s == SLUICE__NODE_GRANTED || s == SLUICE__NODE_CLOSED ? s : (uint32_t)SLUICE__NODE_WAITING;
}

/* The waiter gives up: leave, or wait for the verdict already on its way and
 * pass a grant on. */
SLUICE_INLINE int sluice__gate_abandon(struct sluice_gate *g, struct sluice_gate_node *n, int status)
{
    if (sluice__gate_leave(g, n))
        return status;
    uint32_t verdict = sluice_park_while(&n->state, SLUICE__NODE_WAITING, SLUICE__NODE_SLEEPING);
    if (verdict == SLUICE__NODE_GRANTED)
        sluice_gate_release(g);
    return verdict == SLUICE__NODE_CLOSED ? (int)SLUICE_ECLOSED : status;
}

SLUICE_INLINE int sluice__gate_failed(int status, const struct sluice_cancel *cancel)
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
        return status == SLUICE_OK ? status : sluice__gate_failed(status, cancel);
    struct sluice__gate_cancel_hook hook;
    hook.hook.fn = sluice__gate_on_cancel;
    hook.node = &node;
    bool hooked = cancel && sluice_cancel_register(cancel, &hook.hook);
    _Atomic(uintptr_t) *cell = &node.seg->cells[node.ticket % SLUICE__CQS_CELLS];
    const uintptr_t mine = (uintptr_t)&node;
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
        if ((atomic_load_explicit(cell, SLUICE_ACQUIRE) & ~SLUICE__CELL_SLEEPING) != mine) {
            /* Claimed by a grant or close whose verdict is still on its way
             * (a collect caller may hand it out late): sleep on the node's
             * state until it lands, or the deadline or token says stop. */
            uint32_t waiting = SLUICE__NODE_WAITING;
            if (atomic_compare_exchange_strong_explicit(&node.state, &waiting,
                                                        SLUICE__NODE_SLEEPING, SLUICE_SEQ_CST,
                                                        SLUICE_SEQ_CST)) {
                if (sluice_wait_stop_reason(deadline, cancel) == SLUICE_OK)
                    sluice_futex_wait(&node.state, SLUICE__NODE_SLEEPING, deadline);
                sluice__gate_unsleep(&node);
            }
            continue;
        }
        /* Next in line (deq == ticket), or already being served (deq past
         * it, the server about to claim the cell): the grant is moments away. */
        for (int i = 0; i < SLUICE_PARK_SPIN &&
                        atomic_load_explicit(&g->deq, SLUICE_RELAXED) >= node.ticket &&
                        atomic_load_explicit(cell, SLUICE_RELAXED) == mine;
             i++)
            sluice_cpu_relax();
        /* Announce sleep on the cell, re-check, sleep: a grant, a close, a
         * fired token or a rouse all change the cell first, then wake it. */
        uintptr_t v = mine;
        if (!atomic_compare_exchange_strong_explicit(cell, &v, mine | SLUICE__CELL_SLEEPING,
                                                     SLUICE_SEQ_CST, SLUICE_SEQ_CST))
            continue;
        int slept = SLUICE_OK;
        if (sluice_wait_stop_reason(deadline, cancel) == SLUICE_OK)
            slept = sluice_futex_wait(sluice__cell_futex(cell),
                                      (uint32_t)(mine | SLUICE__CELL_SLEEPING), deadline);
        v = mine | SLUICE__CELL_SLEEPING;
        atomic_compare_exchange_strong_explicit(cell, &v, mine, SLUICE_SEQ_CST, SLUICE_RELAXED);
        if (SLUICE_UNLIKELY(slept == SLUICE_EINVAL)) {
            status = sluice__gate_abandon(g, &node, slept);
            break;
        }
    }
    if (hooked)
        sluice_cancel_unregister(cancel, &hook.hook);
    return status == SLUICE_OK ? status : sluice__gate_failed(status, cancel);
}

/* See sluice/gate.h: the same contract. */
SLUICE_INLINE int sluice_gate_acquire(struct sluice_gate *g, const struct timespec *deadline,
                                      struct sluice_cancel *cancel)
{
    if (SLUICE_UNLIKELY(!sluice_deadline_valid(deadline)))
        return SLUICE_EINVAL;
    if (cancel && sluice_cancel_fired(cancel))
        return SLUICE_ECANCELED;
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    if (SLUICE_LIKELY(sluice__gate_take_fast(g)))
        return SLUICE_OK;
    return sluice__gate_wait(g, deadline, cancel);
}

SLUICE_INLINE int sluice_gate_tryacquire(struct sluice_gate *g)
{
    if (SLUICE_UNLIKELY(atomic_load_explicit(&g->closed, SLUICE_RELAXED)))
        return SLUICE_ECLOSED;
    return sluice__gate_take_fast(g) ? SLUICE_OK : SLUICE_EAGAIN;
}

SLUICE_INLINE void sluice_gate_acquire_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    struct sluice_gate_node *n = &w->sluice__node;
    sluice__gate_node_init(n, w);
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

SLUICE_INLINE int sluice_gate_cancel_async(struct sluice_gate *g, struct sluice_gate_waiter *w)
{
    if (!w->sluice__node.queued || !sluice__gate_leave(g, &w->sluice__node))
        return SLUICE_EAGAIN;
    sluice__gate_defer(&w->sluice__node, SLUICE__NODE_CANCELED);
    sluice__gate_run_callbacks();
    return SLUICE_OK;
}

/* ---- limit, stats, close -------------------------------------------------- */

/*
 * Change the limit and return the waiters it granted, chained through `next`,
 * for sluice__gate_notify_chain (discovery hands them out after dropping its
 * own lock). Concurrent calls compose: each applies the difference from the
 * limit it replaced.
 */
SLUICE_INLINE struct sluice_gate_node *sluice__gate_set_limit_collect(struct sluice_gate *g,
                                                                     uint32_t limit)
{
    struct sluice_gate_node *granted = NULL, **last = &granted;
    uint32_t old = atomic_exchange_explicit(&g->limit, limit, SLUICE_ACQ_REL);
    if (limit < old) {
        atomic_fetch_add_explicit(&g->word, (uint64_t)0 - (old - limit), SLUICE_ACQ_REL);
        return NULL;
    }
    uint32_t extra = limit - old;
    if (!extra)
        return NULL;
    /* One CAS: repay a cut first, then count off the waiters to grant, then
     * the rest becomes available. */
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    uint32_t serve;
    for (;;) {
        int32_t available = sluice__gate_available(w);
        uint32_t left = extra, repay = 0;
        if (available < 0) {
            repay = (uint32_t)-available < left ? (uint32_t)-available : left;
            left -= repay;
        }
        uint32_t waiters = sluice__gate_waiters(w);
        serve = waiters < left ? waiters : left;
        uint64_t next = w + repay + (left - serve) - (uint64_t)serve * SLUICE__GATE_ONE_WAITER;
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, next, SLUICE_ACQ_REL,
                                                  SLUICE_RELAXED))
            break;
    }
    if (serve) {
        struct sluice__cqs_record *r = sluice__cqs_enter(g);
        for (uint32_t i = 0; i < serve; i++)
            sluice__cqs_serve(g, r, SLUICE__SERVE_GRANT, &last);
        sluice__cqs_leave(g, r);
    }
    *last = NULL;
    return granted;
}

SLUICE_INLINE void sluice__gate_notify_chain(struct sluice_gate_node *granted)
{
    while (granted) {
        struct sluice_gate_node *next = granted->next;
        sluice__gate_notify(granted, SLUICE__NODE_GRANTED);
        granted = next;
    }
    sluice__gate_run_callbacks();
}

SLUICE_INLINE int sluice_gate_set_limit(struct sluice_gate *g, uint32_t limit)
{
    if (limit > SLUICE_GATE_LIMIT_MAX)
        return SLUICE_EINVAL;
    sluice__gate_notify_chain(sluice__gate_set_limit_collect(g, limit));
    return SLUICE_OK;
}

SLUICE_INLINE uint32_t sluice_gate_limit(const struct sluice_gate *g)
{
    return atomic_load_explicit(&((struct sluice_gate *)g)->limit, SLUICE_RELAXED);
}

SLUICE_INLINE struct sluice_gate_counts sluice_gate_stats(const struct sluice_gate *gate)
{
    struct sluice_gate *g = (struct sluice_gate *)gate;
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_ACQUIRE);
    uint32_t limit = atomic_load_explicit(&g->limit, SLUICE_RELAXED);
    int64_t in_flight = (int64_t)limit - sluice__gate_available(w);
    struct sluice_gate_counts c;
    c.limit = limit;
    c.in_flight = in_flight < 0 ? 0 : (uint32_t)in_flight;
    c.waiting = sluice__gate_waiters(w);
    return c;
}

/*
 * Close: every counted waiter gets SLUICE_ECLOSED (a sync waiter whose token
 * has fired: SLUICE_ECANCELED), and so does every later acquire. Holders may
 * still release. Idempotent.
 */
SLUICE_INLINE void sluice_gate_close(struct sluice_gate *g)
{
    atomic_store_explicit(&g->closed, 1u, SLUICE_RELEASE);
    uint64_t w = atomic_load_explicit(&g->word, SLUICE_RELAXED);
    uint32_t count;
    for (;;) {
        if (sluice__gate_high(w) & SLUICE__GATE_CLOSED_BIT)
            return;
        count = sluice__gate_waiters(w);
        uint64_t next = sluice__gate_word(sluice__gate_available(w), SLUICE__GATE_CLOSED_BIT);
        if (atomic_compare_exchange_weak_explicit(&g->word, &w, next, SLUICE_ACQ_REL,
                                                  SLUICE_RELAXED))
            break;
    }
    if (count) {
        struct sluice__cqs_record *r = sluice__cqs_enter(g);
        for (uint32_t i = 0; i < count; i++)
            sluice__cqs_serve(g, r, SLUICE__SERVE_CLOSE, NULL);
        sluice__cqs_trim(g, r);
        sluice__cqs_leave(g, r);
    }
    sluice__gate_run_callbacks();
}

#endif /* SLUICE_GATE_H */
