/*
 * sluice/events.h — the discovery event feed: a bounded per-node ring of
 * events and a JSON Lines writer.
 *
 * What it is: every probe step, backoff (with its cause), recovery, lock,
 * expiry, restore-from-store, clear and store failure becomes a
 * `struct sluice_event` with the time, node, old and new limit, in-flight
 * count and reason (its cause, named, and what the cause says: "why").
 * Discovery pushes each one into its node's ring (old
 * events are overwritten, the writer never waits); later, after its locks
 * are dropped, it hands them to an optional callback in seq order (see
 * sluice_event_fn). Readers copy events out by sequence number from any
 * thread, and can render them as JSON Lines to a FILE* or a buffer.
 *
 * In flight, in every event: generation calls started and not yet ended
 * (the pool's count; calls still waiting out a Retry-After hold are not in
 * flight). A standalone discovery node counts the permits held on its gate.
 *
 * Progress: push is wait-free. Readers are lock-free: a read that races the
 * writer overwriting the same slot notices and reports the event as dropped
 * rather than returning a torn copy. Formatting is plain sequential code.
 *
 * Concurrency: one writer at a time per ring (discovery pushes only while it
 * holds the node's update lock); any number of concurrent readers. A reader
 * that falls more than the ring's capacity behind loses the oldest events
 * (counted as dropped), never the writer's time.
 *
 * Memory ordering: each slot is a seqlock built from atomics alone (no
 * fences, which ThreadSanitizer cannot model). The writer marks the slot
 * busy (odd stamp), stores each field with release, then publishes the even
 * stamp with release and advances `head` with release. A reader loads the
 * stamp with acquire, loads each field with acquire, and reloads the stamp.
 * If it copied any field of a newer write, that field's release store
 * synchronised with its acquire load, so the odd stamp written before it is
 * visible to the reload, which then differs: equal, even stamps that match
 * the wanted sequence mean the copy is whole. Every field is an atomic, so
 * the race the seqlock tolerates is not a data race in C11 terms. (On x86
 * all of this compiles to plain moves.)
 */
#ifndef SLUICE_EVENTS_H
#define SLUICE_EVENTS_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "policy.h"

/* X(NAME, "json name") */
#define SLUICE_EVENT_KIND_MAP(X)                                                                   \
    X(PROBE, "probe")       /* the limit grew while probing (or recovering) */                    \
    X(BACKOFF, "backoff")   /* the limit fell: overload, latency knee, or a clamp */              \
    X(RECOVERY, "recovery") /* a clean window after a backoff: growth may resume */               \
    X(LOCK, "lock")         /* a ceiling was locked (or lowered while locked) */                  \
    X(EXPIRY, "expiry")     /* the lock's time to live ran out: probing resumes */                \
    X(RESTORE, "restore")   /* a live lock was restored from the store at start */                \
    X(CLEAR, "clear")       /* the node was cleared: back to the jumpstart */                     \
    X(STORE, "store")       /* the store failed or held a bad record (cause store_error,          \
                               store_corrupt, invalid_record or expiry_capped); the node serves   \
                               from memory */                                                     \
    X(HOLD, "hold")         /* a rate limit (cause rate_limit) or a platform overload (platform)  \
                               held new calls; the limit and any lock stay */                     \
    X(QUOTA, "quota")       /* a quota or billing refusal: nothing moved, waiting will not help */ \
    X(HINT, "hint")         /* the jumpstart moved to the provider's stated rate × latency        \
                               (cause provider_rate) */

#define SLUICE__EVENT_ENUM(name, str) SLUICE_EVENT_##name,
#define SLUICE__EVENT_CASE(name, str) SLUICE__NAME_CASE(SLUICE_EVENT_##name, str)
/* enum sluice_event_kind, and sluice_event_kind_name: the kind's name ("probe"). */
SLUICE__ENUM_WITH_NAMES(sluice_event_kind, sluice_event_kind_name, SLUICE_EVENT_KIND_MAP,
                        SLUICE__EVENT_ENUM, SLUICE__EVENT_CASE)
#undef SLUICE__EVENT_ENUM
#undef SLUICE__EVENT_CASE
#define SLUICE__EVENT_ONE(name, str) +1
/* How many kinds there are: every value of enum sluice_event_kind is below it. */
enum { SLUICE_EVENT_KINDS = 0 SLUICE_EVENT_KIND_MAP(SLUICE__EVENT_ONE) };
#undef SLUICE__EVENT_ONE

struct sluice_event {
    uint64_t seq;            /* per node, from 1; a gap means events were dropped */
    int64_t t_ns;            /* discovery clock (monotonic, or virtual in tests) */
    int64_t wall_ms;         /* wall clock, milliseconds since the Unix epoch */
    const char *node;        /* node id; owned by the ring's owner, valid while it lives */
    enum sluice_event_kind kind;
    enum sluice_cause cause; /* the reason */
    uint32_t old_limit, new_limit;
    uint32_t in_flight;      /* calls in flight when the event happened (see the header) */
    uint32_t ceiling;        /* locked ceiling after the event; 0 = not locked */
};

/*
 * Event callback. Discovery calls it from sluice_discovery_flush: on the
 * thread whose call caused the event (a completion — after its permit was
 * released, when it comes through a pool — a clear, a poll, init for
 * "restore"), or on another thread that is already flushing the same node
 * and takes the work over. Never under a core lock, so it may read status,
 * clear or poll; it should not block for long, since later events of the
 * node (and its store writes) wait behind it.
 *
 * For one node, calls never overlap and come in `seq` order, each event at
 * most once. If the callback falls more than the ring's capacity behind,
 * the events the ring has overwritten meanwhile are skipped: the next call
 * shows a gap in `seq` (read them nowhere; they are gone).
 */
typedef void (*sluice_event_fn)(void *ctx, const struct sluice_event *ev);

struct sluice_event_slot {
    _Atomic(uint64_t) stamp;  /* 2·pos+1 while being written, 2·pos+2 once whole */
    _Atomic(int64_t) t_ns;
    _Atomic(int64_t) wall_ms;
    _Atomic(uint64_t) limits; /* old << 32 | new */
    _Atomic(uint64_t) meta;   /* kind | cause << 8 | in_flight << 32 */
    _Atomic(uint32_t) ceiling;
};

struct sluice_event_ring {
    _Atomic(uint64_t) head; /* events ever pushed; the next one gets seq head+1 */
    struct sluice_event_slot *slots;
    uint64_t mask;
    const char *node;
};

#define SLUICE_EVENT_RING_SIZE(capacity) ((size_t)(capacity) * sizeof(struct sluice_event_slot))

/* Initialise over caller storage; `capacity` must be a power of two. */
SLUICE_INLINE int sluice_event_ring_init(struct sluice_event_ring *r,
                                         struct sluice_event_slot *slots, uint32_t capacity,
                                         const char *node)
{
    if (!r || !slots || !sluice_is_pow2(capacity))
        return SLUICE_EINVAL;
    atomic_init(&r->head, 0);
    r->slots = slots;
    r->mask = capacity - 1;
    r->node = node;
    for (uint32_t i = 0; i < capacity; i++) {
        atomic_init(&slots[i].stamp, 0);
        atomic_init(&slots[i].t_ns, 0);
        atomic_init(&slots[i].wall_ms, 0);
        atomic_init(&slots[i].limits, 0);
        atomic_init(&slots[i].meta, 0);
        atomic_init(&slots[i].ceiling, 0u);
    }
    return SLUICE_OK;
}

/* Append an event (its seq and node are assigned here); overwrites the oldest. */
SLUICE_INLINE uint64_t sluice_event_ring_push(struct sluice_event_ring *r, struct sluice_event *ev)
{
    uint64_t pos = atomic_load_explicit(&r->head, SLUICE_RELAXED);
    struct sluice_event_slot *s = &r->slots[pos & r->mask];
    ev->seq = pos + 1;
    ev->node = r->node;
    atomic_store_explicit(&s->stamp, 2 * pos + 1, SLUICE_RELAXED);
    atomic_store_explicit(&s->t_ns, ev->t_ns, SLUICE_RELEASE);
    atomic_store_explicit(&s->wall_ms, ev->wall_ms, SLUICE_RELEASE);
    atomic_store_explicit(&s->limits, (uint64_t)ev->old_limit << 32 | ev->new_limit,
                          SLUICE_RELEASE);
    atomic_store_explicit(&s->meta,
                          (uint64_t)ev->kind | (uint64_t)ev->cause << 8 |
                              (uint64_t)ev->in_flight << 32,
                          SLUICE_RELEASE);
    atomic_store_explicit(&s->ceiling, ev->ceiling, SLUICE_RELEASE);
    atomic_store_explicit(&s->stamp, 2 * pos + 2, SLUICE_RELEASE);
    atomic_store_explicit(&r->head, pos + 1, SLUICE_RELEASE);
    return ev->seq;
}

/* Copy the event at position `pos` (seq pos+1); false if it was overwritten. */
SLUICE_INLINE bool sluice__event_ring_copy(const struct sluice_event_ring *ring, uint64_t pos,
                                           struct sluice_event *out)
{
    struct sluice_event_ring *r = (struct sluice_event_ring *)ring;
    struct sluice_event_slot *s = &r->slots[pos & r->mask];
    uint64_t stamp = atomic_load_explicit(&s->stamp, SLUICE_ACQUIRE);
    if (stamp != 2 * pos + 2)
        return false;
    uint64_t limits = atomic_load_explicit(&s->limits, SLUICE_ACQUIRE);
    uint64_t meta = atomic_load_explicit(&s->meta, SLUICE_ACQUIRE);
    out->t_ns = atomic_load_explicit(&s->t_ns, SLUICE_ACQUIRE);
    out->wall_ms = atomic_load_explicit(&s->wall_ms, SLUICE_ACQUIRE);
    out->ceiling = atomic_load_explicit(&s->ceiling, SLUICE_ACQUIRE);
    if (atomic_load_explicit(&s->stamp, SLUICE_RELAXED) != stamp)
        return false;
    out->seq = pos + 1;
    out->node = r->node;
    out->old_limit = (uint32_t)(limits >> 32);
    out->new_limit = (uint32_t)limits;
    out->kind = (enum sluice_event_kind)(meta & 0xff);
    out->cause = (enum sluice_cause)((meta >> 8) & 0xff);
    out->in_flight = (uint32_t)(meta >> 32);
    return true;
}

/* Events ever pushed (the seq of the newest one). */
SLUICE_INLINE uint64_t sluice_event_ring_count(const struct sluice_event_ring *r)
{
    return atomic_load_explicit(&((struct sluice_event_ring *)r)->head, SLUICE_ACQUIRE);
}

/*
 * Copy up to `max` events, oldest first, starting after `*cursor` (a seq;
 * start at 0) and advance the cursor. Events the ring has already dropped
 * are skipped and added to *dropped (may be NULL). Returns the number copied.
 */
SLUICE_INLINE size_t sluice_event_ring_read(const struct sluice_event_ring *r, uint64_t *cursor,
                                            struct sluice_event *out, size_t max,
                                            uint64_t *dropped)
{
    uint64_t head = sluice_event_ring_count(r);
    uint64_t capacity = r->mask + 1;
    uint64_t pos = *cursor;
    size_t n = 0;
    if (head > capacity && pos < head - capacity) {
        if (dropped)
            *dropped += head - capacity - pos;
        pos = head - capacity;
    }
    for (; pos < head && n < max; pos++) {
        if (sluice__event_ring_copy(r, pos, &out[n]))
            n++;
        else if (dropped)
            (*dropped)++;
    }
    *cursor = pos;
    return n;
}

/* The newest event; false when there is none (or it is being overwritten). */
SLUICE_INLINE bool sluice_event_ring_last(const struct sluice_event_ring *r,
                                          struct sluice_event *out)
{
    uint64_t head = sluice_event_ring_count(r);
    return head > 0 && sluice__event_ring_copy(r, head - 1, out);
}

/* ---- JSON Lines ---------------------------------------------------------- */

/* Output sink for the JSON writer: a FILE* or a buffer with snprintf semantics. */
struct sluice__jout {
    FILE *file;
    char *buf;
    size_t size, len; /* len counts every byte produced, even past `size` */
    bool failed;
};

SLUICE_INLINE void sluice__jout_write(struct sluice__jout *o, const char *s, size_t n)
{
    if (o->file) {
        if (fwrite(s, 1, n, o->file) != n)
            o->failed = true;
    } else if (o->len < o->size) {
        size_t room = o->size - o->len - 1; /* keep one byte for the terminator */
        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len += n;
}

SLUICE_INLINE void sluice__jout_printf(struct sluice__jout *o, const char *fmt, ...)
{
    char tmp[160];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sluice__jout_write(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
SLUICE_INLINE size_t sluice__utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                : c >= 0xf0 && c <= 0xf4                ? 4
                                                        : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    /* Overlong 3/4-byte forms, UTF-16 surrogates and code points past U+10FFFF. */
    if ((n == 3 && c == 0xe0 && s[1] < 0xa0) || (n == 3 && c == 0xed && s[1] >= 0xa0) ||
        (n == 4 && c == 0xf0 && s[1] < 0x90) || (n == 4 && c == 0xf4 && s[1] >= 0x90))
        return 0;
    return n;
}

/*
 * Length of the UTF-8 sequence that starts at s (1..4), or 0 where none does (a
 * stray or cut byte, an overlong form, a surrogate, a code point past U+10FFFF).
 * Reads no further than the first NUL. For code that checks or cleans text
 * before it reaches JSON or a terminal.
 */
SLUICE_INLINE size_t sluice_utf8_len(const char *s)
{
    return sluice__utf8_len((const unsigned char *)s);
}

/* Write `s` as a JSON string literal: quotes, backslash and control characters
 * escaped, valid UTF-8 passed through, invalid bytes replaced by U+FFFD. */
SLUICE_INLINE void sluice__jout_string(struct sluice__jout *o, const char *s)
{
    sluice__jout_write(o, "\"", 1);
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        size_t n = sluice__utf8_len(p);
        unsigned c = *p;
        if (n == 0) {
            sluice__jout_write(o, "\\ufffd", 6);
            p++;
            continue;
        }
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sluice__jout_write(o, esc, 2);
        } else if (c < 0x20 || c == 0x7f) {
            const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                              : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (named)
                sluice__jout_write(o, named, 2);
            else
                sluice__jout_printf(o, "\\u%04x", c);
        } else {
            sluice__jout_write(o, (const char *)p, n);
        }
        p += n;
    }
    sluice__jout_write(o, "\"", 1);
}

SLUICE_INLINE void sluice__jout_event(struct sluice__jout *o, const struct sluice_event *ev)
{
    sluice__jout_printf(o, "{\"seq\":%" PRIu64 ",\"t_ns\":%" PRId64 ",\"wall_ms\":%" PRId64,
                        ev->seq, ev->t_ns, ev->wall_ms);
    sluice__jout_write(o, ",\"node\":", 8);
    sluice__jout_string(o, ev->node);
    sluice__jout_write(o, ",\"event\":", 9);
    sluice__jout_string(o, sluice_event_kind_name(ev->kind));
    sluice__jout_write(o, ",\"reason\":", 10);
    sluice__jout_string(o, sluice_cause_name(ev->cause));
    sluice__jout_write(o, ",\"why\":", 7);
    sluice__jout_string(o, sluice_cause_text(ev->cause));
    sluice__jout_printf(o, ",\"old_limit\":%" PRIu32 ",\"new_limit\":%" PRIu32, ev->old_limit,
                        ev->new_limit);
    sluice__jout_printf(o, ",\"in_flight\":%" PRIu32 ",\"ceiling\":%" PRIu32 "}\n", ev->in_flight,
                        ev->ceiling);
}

/* A buffer this long holds any event's JSON Lines record: its numbers, names and "why"
 * (under 400 bytes) and a node id of SLUICE_NODE_ID_MAX-1 bytes escaped at 6 bytes each
 * (events::every_event_line_fits_sluice_event_json_max holds it to that). */
#define SLUICE_EVENT_JSON_MAX 1280

/*
 * Render one event as a JSON Lines record (one object and '\n') into `buf`,
 * snprintf-style: at most size-1 bytes plus a terminator are written, and
 * the return value is the full length, so a return >= size means truncated.
 */
SLUICE_INLINE size_t sluice_event_format_json(const struct sluice_event *ev, char *buf, size_t size)
{
    struct sluice__jout o;
    memset(&o, 0, sizeof o);
    o.buf = buf;
    o.size = size;
    sluice__jout_event(&o, ev);
    if (size)
        buf[o.len < size ? o.len : size - 1] = '\0';
    return o.len;
}

/* Write one event as a JSON Lines record; SLUICE_OK or SLUICE_EIO. */
SLUICE_INLINE int sluice_event_write_json(FILE *f, const struct sluice_event *ev)
{
    struct sluice__jout o;
    memset(&o, 0, sizeof o);
    o.file = f;
    sluice__jout_event(&o, ev);
    return o.failed ? SLUICE_EIO : SLUICE_OK;
}

/*
 * Write the events after `*cursor` (a seq; start at 0) as JSON Lines and
 * advance the cursor. Only the events present when the call starts are
 * written, so it returns even while the writer keeps pushing (a slow FILE
 * would otherwise chase it forever). Returns the number written, or
 * SLUICE_EIO.
 */
SLUICE_INLINE int sluice_event_ring_write_json(FILE *f, const struct sluice_event_ring *r,
                                               uint64_t *cursor)
{
    struct sluice_event batch[16];
    uint64_t end = sluice_event_ring_count(r);
    int written = 0;
    size_t n;
    while (*cursor < end &&
           (n = sluice_event_ring_read(r, cursor, batch,
                                       end - *cursor < 16 ? (size_t)(end - *cursor) : 16, NULL)) >
               0) {
        for (size_t i = 0; i < n; i++) {
            if (sluice_event_write_json(f, &batch[i]) != SLUICE_OK)
                return SLUICE_EIO;
            written++;
        }
    }
    return written;
}

#endif /* SLUICE_EVENTS_H */
