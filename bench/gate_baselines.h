/*
 * gate_baselines.h — the baselines sluice's gate is measured against, as
 * gate adapters (create, destroy, acquire, release, quiet):
 *   sem_t         POSIX sem_wait / sem_post (a releaser may barge back in;
 *                 cancel_storm: sem_clockwait)
 *   condvar_fifo  mutex + explicit FIFO queue of waiters, one condvar per
 *                 waiter, direct hand-off on release (strict FIFO, no herd)
 *   atomic_pair   fetch_add + fetch_sub on one counter: the floor for the
 *                 uncontended case (not a gate, so not in handoff)
 *
 * Included by gate_impls.c only: its timed loops inline each acquire and
 * release, so the adapters are static in that one translation unit.
 */
#ifndef SLUICE_BENCH_GATE_BASELINES_H
#define SLUICE_BENCH_GATE_BASELINES_H

#include "gate_bench.h"

#include <errno.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- sem_t ---------------------------------------------------------------- */

static void *gb_sem_create(uint32_t limit)
{
    sem_t *s = gb_alloc_line(sizeof *s);
    if (sem_init(s, 0, limit) != 0) {
        perror("gate bench: sem_init");
        exit(1);
    }
    return s;
}

static void gb_sem_destroy(void *gate)
{
    sem_destroy(gate);
    free(gate);
}

GB_ALWAYS_INLINE void gb_sem_acquire(void *gate, struct gb_waiter *w)
{
    (void)w;
    while (SLUICE_UNLIKELY(sem_wait(gate) != 0)) {
        if (errno != EINTR) {
            perror("gate bench: sem_wait");
            abort();
        }
    }
}

GB_ALWAYS_INLINE bool gb_sem_acquire_until(void *gate, struct gb_waiter *w,
                                          const struct timespec *deadline)
{
    (void)w;
    for (;;) {
        if (sem_clockwait(gate, CLOCK_MONOTONIC, deadline) == 0)
            return true;
        if (errno == ETIMEDOUT)
            return false;
        if (errno != EINTR) {
            perror("gate bench: sem_clockwait");
            abort();
        }
    }
}

GB_ALWAYS_INLINE void gb_sem_release(void *gate)
{
    sem_post(gate);
}

static bool gb_sem_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    int value = -1;
    sem_getvalue(gate, &value);
    if (value != (int)limit) {
        snprintf(why, len, "sem_getvalue %d (want %u)", value, limit);
        return false;
    }
    return true;
}

/* ---- condvar_fifo ----------------------------------------------------------
 * A FIFO counting semaphore the classic way. Invariant: the queue is
 * non-empty only while `avail` is 0, because release hands its permit
 * straight to the head waiter instead of incrementing `avail`; so an arrival
 * can never barge past a queued waiter. Each waiter sleeps on its own
 * condvar (no herd). The signal is sent after unlocking, so the woken waiter
 * does not run into a held mutex; that is safe because waiter records live
 * until every thread of the run has been joined, and a stray signal is just
 * a spurious wake-up of a loop that re-checks `granted`.
 */

struct gb_cvq {
    pthread_mutex_t mu;
    uint32_t avail;
    struct gb_waiter *head, *tail;
};

static void *gb_cvq_create(uint32_t limit)
{
    struct gb_cvq *q = gb_alloc_line(sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    q->avail = limit;
    return q;
}

static void gb_cvq_destroy(void *gate)
{
    struct gb_cvq *q = gate;
    pthread_mutex_destroy(&q->mu);
    free(q);
}

GB_ALWAYS_INLINE void gb_cvq_acquire(void *gate, struct gb_waiter *w)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    if (q->avail > 0) {
        q->avail--;
        pthread_mutex_unlock(&q->mu);
        return;
    }
    w->granted = false;
    w->next = NULL;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    do
        pthread_cond_wait(&w->cv, &q->mu);
    while (!w->granted);
    pthread_mutex_unlock(&q->mu);
}

GB_ALWAYS_INLINE void gb_cvq_release(void *gate)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    struct gb_waiter *w = q->head;
    if (w) {
        q->head = w->next;
        if (!q->head)
            q->tail = NULL;
        w->granted = true;
    } else {
        q->avail++;
    }
    pthread_mutex_unlock(&q->mu);
    if (w)
        pthread_cond_signal(&w->cv);
}

static bool gb_cvq_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    struct gb_cvq *q = gate;
    pthread_mutex_lock(&q->mu);
    bool ok = q->avail == limit && q->head == NULL && q->tail == NULL;
    if (!ok)
        snprintf(why, len, "avail %u queue %s (want %u, empty)", q->avail,
                 q->head ? "non-empty" : "empty", limit);
    pthread_mutex_unlock(&q->mu);
    return ok;
}

/* ---- atomic_pair (uncontended floor only) --------------------------------- */

static void *gb_pair_create(uint32_t limit)
{
    _Atomic(uint64_t) *c = gb_alloc_line(sizeof *c);
    atomic_init(c, limit);
    return (void *)c;
}

static void gb_pair_destroy(void *gate)
{
    free(gate);
}

GB_ALWAYS_INLINE void gb_pair_acquire(void *gate, struct gb_waiter *w)
{
    (void)w;
    uint64_t before = atomic_fetch_sub_explicit((_Atomic(uint64_t) *)gate, 1, SLUICE_SEQ_CST);
    BENCH_KEEP(before);
}

GB_ALWAYS_INLINE void gb_pair_release(void *gate)
{
    atomic_fetch_add_explicit((_Atomic(uint64_t) *)gate, 1, SLUICE_SEQ_CST);
}

static bool gb_pair_quiet(void *gate, uint32_t limit, char *why, size_t len)
{
    uint64_t v = atomic_load((_Atomic(uint64_t) *)gate);
    if (v != limit) {
        snprintf(why, len, "counter %llu (want %u)", (unsigned long long)v, limit);
        return false;
    }
    return true;
}

#endif
