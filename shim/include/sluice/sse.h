/*
 * sluice/sse.h — a bounded parser for server-sent events (the
 * text/event-stream format of the WHATWG HTML standard, §9.2), the framing
 * of a streamed chat completion.
 *
 * What it is: bytes go in as they arrive (any fragmentation: one byte at a
 * time gives the same events as the whole stream at once), whole events
 * come out through a callback:
 *
 *   static char storage[64 << 10];
 *   struct sluice_sse sse;
 *   sluice_sse_init(&sse, &(struct sluice_sse_desc){
 *       .buf = storage, .size = sizeof storage, .on_event = got_event, .ctx = me});
 *   ... in curl's write callback:  if (sluice_sse_feed(&sse, data, n) != SLUICE_OK) stop;
 *
 * The format, as parsed here: lines end in LF, CRLF or a lone CR (a CR at
 * the end of one fragment and an LF at the start of the next are one line
 * end); a UTF-8 byte-order mark before the first line is dropped; a line
 * starting with ':' is a comment (providers send them as keep-alives while a
 * call waits, e.g. ": OPENROUTER PROCESSING") and is skipped; `field:value`
 * with one leading space of the value dropped, or a line that is all field
 * name with an empty value; `data` lines accumulate, joined by '\n';
 * `event` sets the event's type; an empty line dispatches the event, if
 * any `data` line came since the last one. `id` and `retry` (reconnection,
 * which a model call never does) and unknown fields are ignored. An event
 * left unfinished when the stream ends is never dispatched (as the
 * standard says): a stream that stops mid-event is cut, not complete.
 *
 * Bounds: the caller's buffer holds the event being assembled and the line
 * being read. A line longer than line_max, an event whose data with the
 * line being read passes the buffer, or an event type longer than
 * SLUICE_SSE_TYPE_MAX - 1 bytes makes the stream invalid: sluice_sse_feed
 * returns SLUICE_EIO from then on (sticky) and sluice_sse_error() says
 * which bound was passed. Nothing is dropped silently.
 *
 * Progress: no allocation, no system call; feed is O(bytes) (each byte is
 * copied at most twice: into the line, then into the event's data).
 * Threads: one parser is one stream; it is not safe to feed it from two
 * threads at once. Different parsers share nothing. The callback runs on
 * the thread that called sluice_sse_feed, inside that call.
 */
#ifndef SLUICE_SSE_H
#define SLUICE_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include <sluice/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of an event's type, NUL included ("message", "error", ...). */
#define SLUICE_SSE_TYPE_MAX 64

/* One dispatched event; valid only during the callback. */
struct sluice_sse_event {
    const char *type; /* the last `event:` value; "" when none came (the standard's "message") */
    const char *data; /* the `data:` values joined by '\n', NUL-terminated (it may hold NUL
                         bytes of its own: use data_len) */
    size_t data_len;
};

/* Called once per event, on the feeding thread. Return SLUICE_OK to go on; any other value
 * stops the feed at once (the bytes after the event are not parsed) and the feed returns it. */
typedef int (*sluice_sse_event_fn)(void *ctx, const struct sluice_sse_event *event);

struct sluice_sse_desc {
    char *buf;                   /* storage for the event being assembled and the line being
                                    read (required); the caller's, until the parser is done */
    size_t size;                 /* bytes at buf (required, at least 3) */
    size_t line_max;             /* longest line accepted, in bytes, its end excluded; at most
                                    size - 2 (default: 0 = size - 2: all the buffer holds
                                    beside the byte it keeps between data and line) */
    sluice_sse_event_fn on_event; /* (required) */
    void *ctx;                   /* passed to on_event */
};

/* The parser's state; fields are private (sluice__), read through the functions below. */
struct sluice_sse {
    struct sluice_sse_desc d;
    size_t data_len;   /* bytes of the event's data at d.buf */
    size_t line_len;   /* bytes of the current line, at d.buf + data_len + 1 */
    bool comment;      /* the current line is a comment: counted, not stored */
    bool has_data;     /* a `data` line came since the last dispatch */
    bool after_cr;     /* the last byte was a CR: an LF next is the same line end */
    bool first_line;   /* no line ended yet: a byte-order mark may open it */
    int status;        /* SLUICE_OK, or SLUICE_EIO once a bound was passed (sticky) */
    const char *error; /* which bound; "" while OK */
    char type[SLUICE_SSE_TYPE_MAX];
    size_t events;     /* events dispatched */
    size_t comments;   /* comment lines skipped */
};

/* SLUICE_OK, or SLUICE_EINVAL (no buf, size < 3, no on_event, line_max > size - 2). */
int sluice_sse_init(struct sluice_sse *sse, const struct sluice_sse_desc *desc);

/* Parse `n` more bytes (data may be NULL when n is 0). Returns SLUICE_OK, SLUICE_EIO (a
 * bound was passed, now or before: sluice_sse_error), or the callback's non-OK value. */
int sluice_sse_feed(struct sluice_sse *sse, const char *data, size_t n);

/* True when the stream stopped between events: no line or event is half read. */
bool sluice_sse_idle(const struct sluice_sse *sse);

/* Why the stream is invalid ("a line passed sluice_sse_desc.line_max", ...); "" while OK. */
const char *sluice_sse_error(const struct sluice_sse *sse);

/* Events dispatched and comment lines skipped so far. */
size_t sluice_sse_events(const struct sluice_sse *sse);
size_t sluice_sse_comments(const struct sluice_sse *sse);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_SSE_H */
