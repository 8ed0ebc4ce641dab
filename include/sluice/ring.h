/*
 * sluice/ring.h — a bounded multi-producer multi-consumer ring of pointers.
 *
 * What it is: a fixed array of `capacity` slots (a power of two, at least 2)
 * that any number of threads push `void *` items into and pop them out of, in
 * FIFO order. trypush returns SLUICE_EAGAIN when the ring is full, trypop
 * when it is empty; neither ever waits, sleeps or allocates. Callers that
 * want to wait put a gate or a park word in front of it.
 *
 * How it works (Dmitry Vyukov's bounded MPMC queue): every slot carries a
 * 64-bit sequence number that says which position the slot is ready for.
 * For position p in slot p mod capacity:
 *   seq == p               free, waiting for the producer of p
 *   seq == p + 1           holds the item of p, waiting for its consumer
 *   seq == p + capacity    consumed; free for the producer of p + capacity
 * A producer reads `tail` (the next push position), checks the slot's seq,
 * and only when the slot is ready claims the position with one CAS on
 * `tail`; then it writes the item and publishes seq = p + 1. Consumers do
 * the same on `head` and publish seq = p + capacity. One uncontended
 * push+pop is two CASes and three plain stores, and a push never touches `head`
 * (nor a pop `tail`), so producers and consumers only meet on the slot
 * they hand over. Capacity 1 is refused because there "full for p" (p + 1)
 * and "free for the next lap" (p + capacity) would be the same number.
 * Positions are 64-bit and never wrap in practice (584 years at 1 ns/op).
 * Tried and dropped: letting the pop's CAS on `head` free the slot (read
 * the item first, skip the seq store). It saves a store per pop, but then
 * a producer can only learn that a slot is free from `head`, and producers
 * polling a full ring keep stealing the line every pop writes: 1 producer
 * + 1 consumer ran at half the throughput of this layout.
 *
 * Progress — read this before relying on it: claiming a position is
 * lock-free (a failed CAS means another thread claimed one), and no call
 * ever blocks. But the ring as a whole is NOT lock-free in the strict
 * sense. A producer that stalls (is preempted, faults, is stopped in a
 * debugger) between claiming position p and publishing it leaves slot p
 * unready: every consumer that reaches p gets SLUICE_EAGAIN, as if the ring
 * were empty, even when items pushed after p are already published, until
 * that producer runs again. Symmetrically, a consumer stalled between claim
 * and release makes its slot look full to the producer a lap later. The
 * window is a handful of instructions, but it is there; nothing in sluice
 * holds a ring position across a blocking call.
 *
 * Concurrency: trypush, trypop, size and capacity may run concurrently with
 * each other from any number of threads. init, create and destroy may not
 * run concurrently with anything on the same ring. Each producer's items
 * come out in the order it pushed them (one consumer sees them in that
 * order; items of different producers interleave in claim order).
 * SLUICE_EAGAIN is a snapshot: "full" may also mean "the consumer of the
 * slot a lap back has not finished", and "empty" may mean "the producer of
 * the next item has claimed but not yet published".
 *
 * Memory ordering: the slot's seq is the only hand-off between threads.
 * A producer writes the item, then release-stores seq = p + 1; the consumer
 * acquire-loads that value before it reads the item; it then release-stores
 * seq = p + capacity, which the next lap's producer acquire-loads before it
 * overwrites the slot. So everything a thread wrote before trypush
 * happens-before everything after the trypop that returns the item, and a
 * slot is never written while it is being read. `head` and `tail` are
 * updated with relaxed CASes: they carry no data, they only decide which
 * thread owns a position. A thread CASes position p only after it saw the
 * slot's seq say "ready for p", and that seq cannot move again until the
 * owner of p finishes, so winning the CAS is exclusive ownership. The CAS is
 * weak: a spurious failure just reloads the position and rechecks.
 */
#ifndef SLUICE_RING_H
#define SLUICE_RING_H

#include "status.h"

/* Largest capacity accepted by init and create. */
#define SLUICE_RING_CAPACITY_MAX (UINT32_C(1) << 31)
#define SLUICE_RING_CAPACITY_DEFAULT UINT32_C(1024) /* sluice_ring_desc.capacity left at zero */

/* 16 bytes, 16-aligned: a slot never straddles a cache line. */
struct sluice_ring_slot {
    _Atomic(uint64_t) seq;
    void *item; /* ordered by seq; never read or written without owning the position */
} SLUICE_ALIGNED(16);

struct sluice_ring {
    /* Producers CAS `tail`, consumers `head`: each on its own line, with the
     * read-only fields between them so that even a 128-byte (adjacent-line)
     * prefetch pair never holds both positions. */
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) tail; /* next position to push */
    SLUICE_ALIGNED(SLUICE_CACHELINE) struct sluice_ring_slot *slots;
    uint64_t mask; /* capacity - 1 */
    struct sluice_allocator allocator;
    bool owns_memory;
    SLUICE_ALIGNED(SLUICE_CACHELINE) _Atomic(uint64_t) head; /* next position to pop */
};

struct sluice_ring_desc {
    uint32_t capacity; /* slots: a power of two, 2..SLUICE_RING_CAPACITY_MAX (default: 1024) */
    const struct sluice_allocator *allocator; /* (default: aligned_alloc/free) */
};

/* Bytes of slot storage sluice_ring_init needs for `capacity` slots. */
#define SLUICE_RING_SLOTS_SIZE(capacity) ((size_t)(capacity) * sizeof(struct sluice_ring_slot))

SLUICE_INLINE bool sluice__ring_capacity_ok(uint64_t capacity)
{
    return capacity >= 2 && capacity <= SLUICE_RING_CAPACITY_MAX && sluice_is_pow2(capacity);
}

/*
 * Initialise an empty ring over caller-provided slot storage of
 * SLUICE_RING_SLOTS_SIZE(capacity) bytes, aligned to at least 16 (a cache
 * line is best). The ring does not own the storage. Returns SLUICE_EINVAL
 * unless `capacity` is a power of two in 2..SLUICE_RING_CAPACITY_MAX.
 */
SLUICE_INLINE int sluice_ring_init(struct sluice_ring *r, struct sluice_ring_slot *slots,
                                   uint32_t capacity)
{
    if (!r || !slots || !sluice__ring_capacity_ok(capacity))
        return SLUICE_EINVAL;
    atomic_init(&r->tail, 0);
    atomic_init(&r->head, 0);
    r->slots = slots;
    r->mask = (uint64_t)capacity - 1;
    r->allocator.alloc = NULL;
    r->allocator.free = NULL;
    r->allocator.ctx = NULL;
    r->owns_memory = false;
    for (uint32_t i = 0; i < capacity; i++) {
        atomic_init(&slots[i].seq, (uint64_t)i);
        slots[i].item = NULL;
    }
    return SLUICE_OK;
}

/*
 * Allocate and initialise a ring: the only allocation the ring ever makes.
 * `desc` may be NULL for all defaults. Returns SLUICE_EINVAL for a bad
 * capacity (see sluice_ring_desc.capacity), SLUICE_ENOMEM if the allocator
 * fails; *out is NULL on failure.
 */
SLUICE_INLINE int sluice_ring_create(const struct sluice_ring_desc *desc, struct sluice_ring **out)
{
    uint32_t cap = desc ? desc->capacity : 0;
    SLUICE__DEFAULT(cap, SLUICE_RING_CAPACITY_DEFAULT);
    const struct sluice_allocator *a = desc ? desc->allocator : NULL;
    if (!out)
        return SLUICE_EINVAL;
    *out = NULL;
    if (!sluice__ring_capacity_ok(cap))
        return SLUICE_EINVAL;
    struct sluice_ring *r = (struct sluice_ring *)sluice__alloc(a, sizeof *r, SLUICE_CACHELINE);
    struct sluice_ring_slot *slots =
        (struct sluice_ring_slot *)sluice__alloc(a, SLUICE_RING_SLOTS_SIZE(cap), SLUICE_CACHELINE);
    if (!r || !slots) {
        sluice__free(a, r, sizeof *r);
        sluice__free(a, slots, SLUICE_RING_SLOTS_SIZE(cap));
        return SLUICE_ENOMEM;
    }
    sluice_ring_init(r, slots, cap);
    if (a)
        r->allocator = *a;
    r->owns_memory = true;
    *out = r;
    return SLUICE_OK;
}

/*
 * Free a ring made by sluice_ring_create (a ring from sluice_ring_init is
 * left alone: its storage is the caller's). No thread may be using it.
 * Items still inside are not touched: drain them first if they own memory.
 */
SLUICE_INLINE void sluice_ring_destroy(struct sluice_ring *r)
{
    if (!r || !r->owns_memory)
        return;
    struct sluice_allocator a = r->allocator;
    sluice__free(&a, r->slots, SLUICE_RING_SLOTS_SIZE(r->mask + 1));
    sluice__free(&a, r, sizeof *r);
}

/*
 * Claim the next position on `pos_word` whose slot's seq equals that
 * position + `ready_offset` (0 for a push, 1 for a pop). Returns false when
 * the slot at the current position is a lap behind (full for a push, empty
 * for a pop). Push and pop share this so that the subtle part exists once.
 */
SLUICE_INLINE bool sluice__ring_claim(struct sluice_ring *r, _Atomic(uint64_t) *pos_word,
                                      uint64_t ready_offset, struct sluice_ring_slot **claimed_slot,
                                      uint64_t *claimed_pos)
{
    struct sluice_ring_slot *slots = r->slots;
    const uint64_t mask = r->mask;
    uint64_t pos = atomic_load_explicit(pos_word, SLUICE_RELAXED);
    for (;;) {
        struct sluice_ring_slot *slot = &slots[pos & mask];
        uint64_t seq = atomic_load_explicit(&slot->seq, SLUICE_ACQUIRE);
        int64_t lag = (int64_t)(seq - (pos + ready_offset));
        if (SLUICE_LIKELY(lag == 0)) {
            /* Ready for us: try to own it. On failure `pos` is reloaded. */
            if (SLUICE_LIKELY(atomic_compare_exchange_weak_explicit(
                    pos_word, &pos, pos + 1, SLUICE_RELAXED, SLUICE_RELAXED))) {
                *claimed_slot = slot;
                *claimed_pos = pos;
                return true;
            }
        } else if (lag < 0) {
            /* The slot still serves the previous lap: full (push) or empty (pop). */
            return false;
        } else {
            /* Someone claimed `pos` since we read it: catch up. */
            pos = atomic_load_explicit(pos_word, SLUICE_RELAXED);
        }
    }
}

/* Push `item` (any pointer, NULL included). SLUICE_OK, or SLUICE_EAGAIN if full. */
SLUICE_INLINE int sluice_ring_trypush(struct sluice_ring *r, void *item)
{
    struct sluice_ring_slot *slot;
    uint64_t pos;
    if (SLUICE_UNLIKELY(!sluice__ring_claim(r, &r->tail, 0, &slot, &pos)))
        return SLUICE_EAGAIN;
    slot->item = item;
    atomic_store_explicit(&slot->seq, pos + 1, SLUICE_RELEASE);
    return SLUICE_OK;
}

/*
 * Pop the oldest item into *out. SLUICE_OK, or SLUICE_EAGAIN if empty (and
 * *out is left untouched).
 */
SLUICE_INLINE int sluice_ring_trypop(struct sluice_ring *r, void **out)
{
    struct sluice_ring_slot *slot;
    uint64_t pos;
    if (SLUICE_UNLIKELY(!sluice__ring_claim(r, &r->head, 1, &slot, &pos)))
        return SLUICE_EAGAIN;
    *out = slot->item;
    atomic_store_explicit(&slot->seq, pos + r->mask + 1, SLUICE_RELEASE);
    return SLUICE_OK;
}

SLUICE_INLINE uint32_t sluice_ring_capacity(const struct sluice_ring *r)
{
    return (uint32_t)(r->mask + 1);
}

/*
 * Items in the ring, as a snapshot that may be stale by the time it
 * returns; exact when the ring is quiet. Claimed-but-unfinished operations
 * count as done. Always within 0..capacity.
 */
SLUICE_INLINE uint32_t sluice_ring_size(const struct sluice_ring *ring)
{
    struct sluice_ring *r = (struct sluice_ring *)ring;
    uint64_t head = atomic_load_explicit(&r->head, SLUICE_ACQUIRE);
    uint64_t tail = atomic_load_explicit(&r->tail, SLUICE_ACQUIRE);
    /* The two loads are not one snapshot: clamp what a race can skew. */
    if (tail <= head)
        return 0;
    return tail - head > r->mask ? (uint32_t)(r->mask + 1) : (uint32_t)(tail - head);
}

#endif /* SLUICE_RING_H */
