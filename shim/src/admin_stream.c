/*
 * admin_stream.c — GET /compute/concurrency/events?follow=1: a node's event
 * feed as server-sent events (id = seq, event = kind, data = the JSON Lines
 * record), at most max_streams at once.
 *
 * Threads: a stream is libmicrohttpd's content reader, run on its
 * connection's thread; it may block there, waiting on the admin's `tick`
 * (broadcast by the sampler every second and by stop) for at most 250 ms
 * at a time. It ends when the admin stops. A keep-alive comment goes out
 * after timeout_s / 3 without events, so libmicrohttpd's idle timeout
 * never closes a quiet stream.
 */
#include "admin_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One follow=1 stream: libmicrohttpd's reader context, freed by stream_free. */
struct stream {
    struct sluice_admin *a;
    const struct sluice_event_ring *ring; /* NULL: fixed node, keep-alives only */
    uint64_t cursor;                      /* the seq of the last event framed */
    char pending[8192];                   /* frames not yet handed to libmicrohttpd */
    size_t off, len;                      /* of pending: sent so far, filled */
    int64_t last_send_ms;                 /* wall clock of the last bytes handed over */
};

/* Format the events after the cursor as SSE frames into `pending`. */
static void stream_fill(struct stream *s)
{
    s->off = s->len = 0;
    if (!s->ring)
        return;
    struct sluice_event batch[16];
    size_t got = sluice_event_ring_read(s->ring, &s->cursor, batch, 16, NULL);
    for (size_t k = 0; k < got; k++) {
        char line[SLUICE_EVENT_JSON_MAX];
        size_t n = sluice_event_format_json(&batch[k], line, sizeof line);
        if (n && line[n - 1] == '\n')
            line[--n] = '\0';
        int w = snprintf(s->pending + s->len, sizeof s->pending - s->len,
                         "id: %" PRIu64 "\nevent: %s\ndata: %s\n\n", batch[k].seq,
                         sluice_event_kind_name(batch[k].kind), line);
        if (w < 0 || (size_t)w >= sizeof s->pending - s->len) {
            s->cursor = batch[k].seq - 1; /* the rest go in the next fill, none is lost */
            break;
        }
        s->len += (size_t)w;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *s = cls;
    struct sluice_admin *a = s->a;
    int64_t keepalive_ms = (int64_t)a->cfg.timeout_s * 1000 / 3;
    for (;;) {
        if (atomic_load(&a->stopping))
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->off == s->len)
            stream_fill(s);
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(buf, s->pending + s->off, n);
            s->off += n;
            s->last_send_ms = sluice__admin_wall_ms();
            return (ssize_t)n;
        }
        if (sluice__admin_wall_ms() - s->last_send_ms >= keepalive_ms) {
            static const char ka[] = ": keep-alive\n\n";
            size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
            memcpy(buf, ka, n);
            s->last_send_ms = sluice__admin_wall_ms();
            return (ssize_t)n;
        }
        /* Wait for the sampler's tick (or stop); 250 ms caps the latency of a new event. */
        pthread_mutex_lock(&a->mutex);
        if (!atomic_load(&a->stopping)) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += 250 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&a->tick, &a->mutex, &until);
        }
        pthread_mutex_unlock(&a->mutex);
    }
}

static void stream_free(void *cls)
{
    struct stream *s = cls;
    atomic_fetch_sub(&s->a->streams, 1);
    free(s);
}

enum MHD_Result sluice__admin_send_stream(struct sluice_admin *a, struct MHD_Connection *c,
                                          size_t i, uint64_t after)
{
    unsigned open = atomic_fetch_add(&a->streams, 1);
    if (open >= a->cfg.max_streams) {
        atomic_fetch_sub(&a->streams, 1);
        return sluice__admin_send_error(c, 503, NULL,
                                        "close another follow=1 stream, or raise "
                                        "sluice_admin_desc.max_streams",
                                        "too many event streams open (max_streams = %u)",
                                        a->cfg.max_streams);
    }
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        atomic_fetch_sub(&a->streams, 1);
        return MHD_NO;
    }
    s->a = a;
    s->ring = a->nodes[i].ring;
    s->cursor = after;
    /* A reconnecting EventSource resumes after the last event it saw. */
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (last && *last) {
        char *end;
        unsigned long long v = strtoull(last, &end, 10);
        if (!*end)
            s->cursor = v;
    }
    s->last_send_ms = 0; /* an immediate keep-alive makes the headers go out at once */
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}
