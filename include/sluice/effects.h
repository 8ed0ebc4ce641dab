/*
 * sluice/effects.h — the effects combiner: what a locked section leaves to
 * be done after every lock is dropped, and who does it.
 *
 * What it is: discovery (sluice/discovery.h) changes a node's state under
 * its update lock, but the consequences that may be slow or call out (a
 * store save or clear, the event callback, the async-waiter callbacks of a
 * limit raise) must not run there, nor delay the next call in line. A
 * `struct sluice_effects` carries them from the locked section to a
 * flusher:
 *   - gate grants (sluice_effects_stash_grants_locked): the waiters a limit raise
 *     granted, handed out by whoever flushes next, even while another
 *     thread runs the slow effects (a grant is a wake-up, not I/O);
 *   - the latest lock record to persist (sluice_effects_set_record_locked):
 *     "latest wins", so an older save never lands after a newer clear;
 *   - the events recorded in the owner's event ring, delivered in seq order
 *     (sluice_effects_deliver).
 * The owner says what one round of its effects is (a sluice_effects_run_fn:
 * discovery's persists the record and delivers the events); this header
 * decides who runs it and when.
 *
 * Who runs the effects: sluice_effects_flush is a non-blocking combiner.
 * Whoever finds effects pending and nobody flushing becomes the flusher and
 * runs rounds until none are left; anyone else returns at once, and the
 * running flusher picks their work up before it stops. So the effects run
 * on the thread whose call caused them, or on another thread that was
 * already flushing that owner; never under the owner's lock, never twice at
 * once, and rounds in order. No caller waits for another thread's effects,
 * except sluice_effects_sync, which exists to wait.
 *
 * Progress: post, mark, set_record and stash_grants are lock-free (the
 * caller holds its own lock). flush never waits: it either runs the rounds
 * itself or leaves them to the thread already running them; a round takes
 * the owner's lock only to copy the record (bounded). sync blocks, parked
 * on a futex word while another thread runs a round, never spinning for
 * the length of an I/O.
 *
 * Concurrency: mark, set_record and post from one locked section at a time
 * (the owner's lock); stash_grants likewise (one pusher at a time; flushers
 * only ever take the whole stack, so there is no ABA). flush and sync from
 * any thread, holding no lock of the owner; a round (the run function) may
 * call flush (it returns at once) but never sync, which would wait for
 * itself.
 *
 * Memory ordering: effects are handed over Dekker-style. Whoever records
 * an effect bumps `posted` (seq_cst, before dropping its lock) and then
 * tries the `flushing` flag (seq_cst exchange); a flusher clears the flag
 * (seq_cst) before it re-reads `posted`, so at least one of them sees the
 * other's write and no effect is stranded. A round ends by storing the
 * `posted` value it started from into `done` (release); sync reads `done`
 * with acquire, so every effect of the rounds it waited for happened
 * before it returns. Sleepers in sync announce themselves (seq_cst) before
 * re-checking; the flusher bumps the futex word (seq_cst) before reading
 * the sleeper count, so a wake is never lost. The grant stack is pushed
 * with release and taken whole with acquire.
 */
#ifndef SLUICE_EFFECTS_H
#define SLUICE_EFFECTS_H

#include <string.h>

#include "events.h"
#include "gate.h"
#include "park.h"
#include "store.h"

struct sluice_effects {
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) posted; /* bumped per locked section
                                                                  that left effects */
    _Atomic(uint64_t) done;        /* posted as of the last completed round */
    _Atomic(uint64_t) record_gen;  /* bumped per lock record to persist (under the lock) */
    _Atomic(uint32_t) flushing;    /* 1 while a thread runs the rounds */
    _Atomic(uint32_t) epoch;       /* futex word for sync: bumped when a round ends */
    _Atomic(uint32_t) sleepers;    /* threads parked in sync */
    _Atomic(struct sluice_gate_node *) grants; /* gate grants not yet handed out (a stack of
                                                  chains) */
    uint64_t applied_gen; /* the flusher's own: record_gen it last took */
    uint64_t delivered;   /* the flusher's own: seq of the last event delivered */
    bool dirty;           /* under the owner's lock: this locked section left effects */
    struct sluice_lock_record record; /* under the owner's lock: the latest record;
                                         ceiling 0 = clear the stored one */
};

/* One round of the owner's effects, run by the flusher (see the header comment). */
typedef void (*sluice_effects_run_fn)(void *ctx);

/* Nothing pending. Before any other call; not concurrent. */
SLUICE_INLINE void sluice_effects_init(struct sluice_effects *fx)
{
    atomic_init(&fx->posted, 0u);
    atomic_init(&fx->done, 0u);
    atomic_init(&fx->record_gen, 0u);
    atomic_init(&fx->flushing, 0u);
    atomic_init(&fx->epoch, 0u);
    atomic_init(&fx->sleepers, 0u);
    atomic_init(&fx->grants, (struct sluice_gate_node *)NULL);
    fx->applied_gen = 0;
    fx->delivered = 0;
    fx->dirty = false;
    memset(&fx->record, 0, sizeof fx->record);
}

/* This locked section left effects (an event, a record). */
SLUICE_INLINE void sluice_effects_mark_locked(struct sluice_effects *fx)
{
    fx->dirty = true;
}

/* Publish the effects this locked section left, if any: before the lock is
 * dropped, so a sync called after it sees them. */
SLUICE_INLINE void sluice_effects_post_locked(struct sluice_effects *fx)
{
    if (!fx->dirty)
        return;
    fx->dirty = false;
    atomic_fetch_add_explicit(&fx->posted, 1u, SLUICE_SEQ_CST);
}

/* Make `rec` the record the next round persists (latest wins). */
SLUICE_INLINE void sluice_effects_set_record_locked(struct sluice_effects *fx,
                                                    const struct sluice_lock_record *rec)
{
    fx->record = *rec;
    atomic_fetch_add_explicit(&fx->record_gen, 1u, SLUICE_RELAXED);
    fx->dirty = true;
}

/* In a round: copy the latest record into *out if it changed since the last
 * one taken (false: nothing new). Takes the owner's `lock` for the copy. */
SLUICE_INLINE bool sluice_effects_take_record(struct sluice_effects *fx, sluice_spinlock *lock,
                                              struct sluice_lock_record *out)
{
    if (atomic_load_explicit(&fx->record_gen, SLUICE_RELAXED) == fx->applied_gen)
        return false;
    sluice_spinlock_lock(lock); /* bounded: nothing slow runs under it */
    *out = fx->record;
    uint64_t gen = atomic_load_explicit(&fx->record_gen, SLUICE_RELAXED);
    sluice_spinlock_unlock(lock);
    fx->applied_gen = gen;
    return true;
}

/* In a round: hand the events `ring` recorded since the last delivery to
 * `fn` (NULL: skip them), in seq order. */
SLUICE_INLINE void sluice_effects_deliver(struct sluice_effects *fx,
                                          const struct sluice_event_ring *ring, sluice_event_fn fn,
                                          void *ctx)
{
    uint64_t end = sluice_event_ring_count(ring);
    if (!fn) {
        fx->delivered = end;
        return;
    }
    struct sluice_event batch[8];
    while (fx->delivered < end) {
        uint64_t left = end - fx->delivered;
        size_t n = sluice_event_ring_read(ring, &fx->delivered, batch,
                                          left < 8 ? (size_t)left : 8, NULL);
        for (size_t i = 0; i < n; i++)
            fn(ctx, &batch[i]);
    }
}

/* Keep a chain of gate grants (sluice_gate_set_limit_collect) for the next
 * flush. */
SLUICE_INLINE void sluice_effects_stash_grants_locked(struct sluice_effects *fx,
                                                      struct sluice_gate_node *granted)
{
    struct sluice_gate_node *tail = granted;
    while (tail->next)
        tail = tail->next;
    struct sluice_gate_node *top = atomic_load_explicit(&fx->grants, SLUICE_RELAXED);
    do
        tail->next = top;
    while (!atomic_compare_exchange_weak_explicit(&fx->grants, &top, granted, SLUICE_RELEASE,
                                                  SLUICE_RELAXED));
}

/* Hand out the stashed gate grants: sync waiters are woken, async callbacks
 * run (on this thread). Call with no lock of the owner held. */
SLUICE_INLINE void sluice_effects_hand_out_grants(struct sluice_effects *fx)
{
    if (atomic_load_explicit(&fx->grants, SLUICE_RELAXED))
        sluice_gate_notify_chain(atomic_exchange_explicit(
            &fx->grants, (struct sluice_gate_node *)NULL, SLUICE_ACQUIRE));
}

/* Wake the threads parked in sync so they re-check (a round ended). */
SLUICE_INLINE void sluice__effects_wake_syncers(struct sluice_effects *fx)
{
    atomic_fetch_add_explicit(&fx->epoch, 1u, SLUICE_SEQ_CST);
    uint32_t n = atomic_load_explicit(&fx->sleepers, SLUICE_SEQ_CST);
    for (uint32_t i = 0; i < n; i++) /* each wake reaches one sleeper; extras are no-ops */
        sluice_futex_wake(&fx->epoch);
}

/* Run rounds until none are pending. Only the thread holding `flushing`. */
SLUICE_INLINE void sluice__effects_run(struct sluice_effects *fx, sluice_effects_run_fn run,
                                       void *ctx)
{
    uint64_t posted;
    while ((posted = atomic_load_explicit(&fx->posted, SLUICE_SEQ_CST)) !=
           atomic_load_explicit(&fx->done, SLUICE_RELAXED)) {
        run(ctx);
        atomic_store_explicit(&fx->done, posted, SLUICE_RELEASE);
        sluice__effects_wake_syncers(fx);
    }
}

/*
 * Hand out the stashed grants, then, unless another thread is already
 * running rounds (it then runs ours too), run `run` until no posted effect
 * is left. Never waits for another thread's round. Call with no lock of
 * the owner held.
 */
SLUICE_INLINE void sluice_effects_flush(struct sluice_effects *fx, sluice_effects_run_fn run,
                                        void *ctx)
{
    sluice_effects_hand_out_grants(fx);
    while (atomic_load_explicit(&fx->posted, SLUICE_SEQ_CST) !=
           atomic_load_explicit(&fx->done, SLUICE_RELAXED)) {
        if (atomic_exchange_explicit(&fx->flushing, 1u, SLUICE_SEQ_CST))
            return; /* the flusher re-reads `posted` after it lets go: it sees ours */
        sluice__effects_run(fx, run, ctx);
        atomic_store_explicit(&fx->flushing, 0u, SLUICE_SEQ_CST);
        sluice__effects_wake_syncers(fx);
    }
}

/*
 * Wait until every effect posted before this call has run, running rounds
 * itself when nobody else is. Blocks (see Progress); never from inside a
 * round.
 */
SLUICE_INLINE void sluice_effects_sync(struct sluice_effects *fx, sluice_effects_run_fn run,
                                       void *ctx)
{
    uint64_t target = atomic_load_explicit(&fx->posted, SLUICE_SEQ_CST);
    for (;;) {
        sluice_effects_flush(fx, run, ctx);
        if (atomic_load_explicit(&fx->done, SLUICE_ACQUIRE) >= target)
            return;
        uint32_t epoch = atomic_load_explicit(&fx->epoch, SLUICE_SEQ_CST);
        atomic_fetch_add_explicit(&fx->sleepers, 1u, SLUICE_SEQ_CST);
        /* Sleep only while a flusher is at work: it bumps the epoch when it
         * ends a round or lets go, after we registered. Nobody flushing:
         * loop and flush ourselves. */
        if (atomic_load_explicit(&fx->done, SLUICE_SEQ_CST) < target &&
            atomic_load_explicit(&fx->flushing, SLUICE_SEQ_CST))
            sluice_futex_wait(&fx->epoch, epoch, NULL);
        atomic_fetch_sub_explicit(&fx->sleepers, 1u, SLUICE_SEQ_CST);
    }
}

#endif /* SLUICE_EFFECTS_H */
