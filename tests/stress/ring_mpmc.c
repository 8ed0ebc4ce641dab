/*
 * Threaded invariant checkers for sluice/ring.h: producers push records
 * tagged (producer, sequence); consumers check each record's contents,
 * mark it seen, and check that every producer's sequence numbers arrive
 * strictly increasing. At the end every record must have been seen exactly
 * once and the ring must be empty. A lost item cannot hang the test: the
 * threads give up when nothing has been consumed for a while, and the
 * checks then report what is missing.
 */
#include <criterion/criterion.h>
#include <sluice/ring.h>

#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"

#define MAX_THREADS 16
#define GIVE_UP_AFTER_NS (5 * INT64_C(1000000000)) /* with no item consumed */

struct record {
    uint32_t producer;
    uint32_t seq;
    uint64_t check; /* a function of (producer, seq): catches torn or stale reads */
};

struct mpmc_run {
    struct sluice_ring *ring;
    uint32_t capacity;
    int n_producers, n_consumers;
    uint32_t per_producer;
    struct record *records;  /* [producer][seq] */
    _Atomic(uint8_t) *seen;  /* [producer][seq]: times popped */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) consumed;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) full_hits;
    _Atomic(uint64_t) empty_hits;
    _Atomic(uint64_t) duplicates;
    _Atomic(uint64_t) corrupt;
    _Atomic(uint64_t) out_of_order;
    _Atomic(uint64_t) size_out_of_range;
    _Atomic(int) gave_up;
    _Atomic(int) finished; /* threads that returned */
};

struct worker {
    struct mpmc_run *run;
    int id; /* producers 0..P-1, then consumers */
} SLUICE_ALIGNED(SLUICE_CACHELINE);

static uint64_t record_check(uint32_t producer, uint32_t seq)
{
    uint64_t s = (uint64_t)producer << 32 | seq;
    return test_rand(&s);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Full or empty: spin briefly, then let the other side run (2 cores, up to
 * 8 threads). Returns false once the run has given up: when no item has
 * been consumed for GIVE_UP_AFTER_NS, something was lost or is stuck.
 */
struct backoff {
    unsigned fails;
    uint64_t consumed_seen;
    int64_t since_ns;
};

static bool back_off(struct mpmc_run *run, struct backoff *b)
{
    if (++b->fails % 64 != 0) {
        sluice_cpu_relax();
        return true;
    }
    sched_yield();
    if (b->fails % 1024 == 0) {
        uint64_t consumed = atomic_load_explicit(&run->consumed, SLUICE_RELAXED);
        int64_t now = now_ns();
        if (consumed != b->consumed_seen || b->since_ns == 0) {
            b->consumed_seen = consumed;
            b->since_ns = now;
        } else if (now - b->since_ns > GIVE_UP_AFTER_NS) {
            atomic_store(&run->gave_up, 1);
        }
    }
    return !atomic_load_explicit(&run->gave_up, SLUICE_RELAXED);
}

static void *producer_main(void *arg)
{
    struct worker *w = arg;
    struct mpmc_run *run = w->run;
    uint64_t full = 0;
    for (uint32_t seq = 0; seq < run->per_producer; seq++) {
        struct record *rec = &run->records[(size_t)w->id * run->per_producer + seq];
        /* Written just before the push: the ring must publish it. */
        rec->producer = (uint32_t)w->id;
        rec->seq = seq;
        rec->check = record_check((uint32_t)w->id, seq);
        struct backoff b = {0};
        while (sluice_ring_trypush(run->ring, rec) == SLUICE_EAGAIN) {
            full++;
            if (!back_off(run, &b))
                goto out;
        }
    }
out:
    atomic_fetch_add(&run->full_hits, full);
    return NULL;
}

static void consume_one(struct mpmc_run *run, struct record *rec, int64_t *last_seq)
{
    size_t total = (size_t)run->n_producers * run->per_producer;
    size_t idx = (size_t)(rec - run->records);
    if (rec < run->records || idx >= total) {
        atomic_fetch_add(&run->corrupt, 1);
        return;
    }
    uint32_t producer = (uint32_t)(idx / run->per_producer), seq = (uint32_t)(idx % run->per_producer);
    if (rec->producer != producer || rec->seq != seq || rec->check != record_check(producer, seq))
        atomic_fetch_add(&run->corrupt, 1);
    if (atomic_fetch_add(&run->seen[idx], 1) != 0)
        atomic_fetch_add(&run->duplicates, 1);
    if ((int64_t)seq <= last_seq[producer])
        atomic_fetch_add(&run->out_of_order, 1);
    last_seq[producer] = seq;
}

static void *consumer_main(void *arg)
{
    struct worker *w = arg;
    struct mpmc_run *run = w->run;
    uint64_t total = (uint64_t)run->n_producers * run->per_producer, empty = 0;
    int64_t last_seq[MAX_THREADS];
    for (int p = 0; p < MAX_THREADS; p++)
        last_seq[p] = -1;
    struct backoff b = {0};
    while (atomic_load_explicit(&run->consumed, SLUICE_RELAXED) < total) {
        void *item;
        if (sluice_ring_trypop(run->ring, &item) == SLUICE_EAGAIN) {
            empty++;
            if (!back_off(run, &b))
                break;
            continue;
        }
        b.fails = 0;
        consume_one(run, item, last_seq);
        if (sluice_ring_size(run->ring) > run->capacity)
            atomic_fetch_add(&run->size_out_of_range, 1);
        atomic_fetch_add_explicit(&run->consumed, 1, SLUICE_RELAXED);
    }
    atomic_fetch_add(&run->empty_hits, empty);
    return NULL;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (w->id < w->run->n_producers)
        producer_main(w);
    else
        consumer_main(w);
    atomic_fetch_add(&w->run->finished, 1);
    return NULL;
}

/*
 * Run the workers and join them, unless they stop making progress: a
 * broken ring can spin forever inside trypush/trypop, where no give-up
 * check reaches. Then fail the test; Criterion's per-test process takes
 * the stuck threads with it.
 */
static void run_workers(struct mpmc_run *run, struct worker *workers, int n)
{
    pthread_t tids[MAX_THREADS];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&tids[i], NULL, worker_main, &workers[i]), 0);
    uint64_t last_consumed = UINT64_MAX;
    int64_t last_change = now_ns();
    while (atomic_load(&run->finished) < n) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        uint64_t consumed = atomic_load(&run->consumed);
        if (consumed != last_consumed) {
            last_consumed = consumed;
            last_change = now_ns();
        }
        cr_assert_lt(now_ns() - last_change, 2 * GIVE_UP_AFTER_NS,
                     "threads stuck inside the ring: %d of %d finished, %llu items consumed",
                     atomic_load(&run->finished), n, (unsigned long long)consumed);
    }
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
}

/* Run P producers x C consumers over a ring of `capacity`, then check every
 * invariant; returns the run so tests can look at the edge counters. */
static struct mpmc_run run_mpmc(int n_producers, int n_consumers, uint32_t capacity,
                                uint32_t per_producer)
{
    cr_assert_leq(n_producers + n_consumers, MAX_THREADS);
    struct mpmc_run run = {.capacity = capacity,
                           .n_producers = n_producers,
                           .n_consumers = n_consumers,
                           .per_producer = per_producer};
    size_t total = (size_t)n_producers * per_producer;
    cr_assert_eq(sluice_ring_create(&(struct sluice_ring_desc){.capacity = capacity}, &run.ring),
                 SLUICE_OK);
    run.records = calloc(total, sizeof *run.records);
    run.seen = calloc(total, sizeof *run.seen);
    cr_assert(run.records && run.seen);

    struct worker workers[MAX_THREADS];
    for (int i = 0; i < n_producers + n_consumers; i++)
        workers[i] = (struct worker){.run = &run, .id = i};
    run_workers(&run, workers, n_producers + n_consumers);

    size_t missing = 0, first_missing = total;
    for (size_t i = 0; i < total; i++)
        if (atomic_load(&run.seen[i]) == 0 && missing++ == 0)
            first_missing = i;
    void *leftover;
    size_t n_left = 0;
    while (sluice_ring_trypop(run.ring, &leftover) == SLUICE_OK)
        n_left++;

    cr_expect_eq(atomic_load(&run.gave_up), 0, "gave up: nothing consumed for %lld s",
                 (long long)(GIVE_UP_AFTER_NS / 1000000000));
    cr_expect_eq(missing, 0, "%zu of %zu items never popped (first: producer %zu seq %zu)",
                 missing, total, first_missing / per_producer, first_missing % per_producer);
    cr_expect_eq(atomic_load(&run.duplicates), 0, "items popped more than once");
    cr_expect_eq(atomic_load(&run.corrupt), 0, "popped records with wrong contents");
    cr_expect_eq(atomic_load(&run.out_of_order), 0,
                 "a consumer saw a producer's sequence numbers go backwards");
    cr_expect_eq(atomic_load(&run.size_out_of_range), 0, "size() outside 0..capacity");
    cr_expect_eq(n_left, 0, "items left in the ring after every item was consumed");
    cr_expect_eq(sluice_ring_size(run.ring), 0);

    sluice_ring_destroy(run.ring);
    free(run.records);
    free((void *)run.seen);
    run.ring = NULL;
    run.records = NULL;
    run.seen = NULL;
    return run;
}

Test(ring_mpmc, every_item_is_popped_exactly_once_with_4_producers_and_4_consumers)
{
    run_mpmc(4, 4, 64, SCALED(1000000));
}

Test(ring_mpmc, each_consumer_sees_each_producers_items_in_push_order)
{
    /* A large ring lets consumers fall far behind, so order is tested across
     * many interleavings of claim and publish, not just hand-to-hand. */
    run_mpmc(2, 2, 1024, SCALED(1000000));
}

Test(ring_mpmc, tiny_ring_loses_nothing_through_constant_full_and_empty_edges)
{
    struct mpmc_run run = run_mpmc(3, 3, 4, SCALED(800000));
    cr_assert_gt(atomic_load(&run.full_hits), 0, "the ring never filled: edge not exercised");
    cr_assert_gt(atomic_load(&run.empty_hits), 0, "the ring never emptied: edge not exercised");
}

Test(ring_mpmc, two_slot_ring_keeps_every_item_in_order_with_unbalanced_sides)
{
    /* Capacity 2 is the smallest legal ring: "full" and "free for the next
     * lap" seq values are one apart, and every push waits for the pop a lap
     * behind. One producer against three consumers, then the reverse. */
    run_mpmc(1, 3, 2, SCALED(400000));
    run_mpmc(3, 1, 2, SCALED(200000));
}
