/*
 * admin_internal.h — what the admin endpoint's files (sluice/admin.h)
 * share: the admin's state, the per-node figures the sampler keeps, and
 * the calls one file makes into another. Private to shim/src; not
 * installed.
 *
 * The files, each owning one part:
 *   admin.c          the lifecycle: resolving the description, binding the
 *                    socket, starting libmicrohttpd and the sampler, stop
 *   admin_http.c     HTTP plumbing: libmicrohttpd's request callbacks and
 *                    the checks every request passes (body size, Host,
 *                    Origin) before its route
 *   admin_reply.c    answers (a body, JSON, a JSON error) and the query
 *                    parameters the routes take
 *   admin_stream.c   follow=1 event streams (server-sent events)
 *   admin_conns.c    the request deadline: the list of open connections,
 *                    the slot a connection past max_connections takes, and
 *                    cutting requests that are overdue
 *   admin_routes.c   the route table, one {method, path, handler} row per
 *                    route, and the handlers
 *   admin_json.c     the JSON model of a node (state, deadline figures,
 *                    chart history) and GET /compute/concurrency's body
 *   admin_metrics.c  the Prometheus text of GET /metrics
 *   admin_sampler.c  the sampler thread and its once-a-second jobs
 *
 * Locks: `mutex` guards every struct node's counters and history and is
 * the mutex of the `tick` condition; `conns_mutex` guards the connection
 * list (and the `slot_freed` condition the listener waits on for room) and
 * is taken inside `mutex` (by the sampler), never around it.
 * Engine and pool calls take their own locks and may be made under either.
 */
#ifndef SLUICE_SHIM_ADMIN_INTERNAL_H
#define SLUICE_SHIM_ADMIN_INTERNAL_H

#include <sluice/admin.h>

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <sluice/sluice.h>

enum {
    SLUICE__ADMIN_N_KINDS = SLUICE_EVENT_KINDS, /* event kinds counted: every one */
};

/* Connections let in past max_connections to hear 503 (admin_conns.c). */
#define SLUICE__ADMIN_SPARE 8

/* The page's and sluicectl's rates and queue-wait percentiles span this many seconds. */
#define SLUICE__ADMIN_RECENT_S 10

/* One chart sample: a node's figures at one sampler tick (the order of the history's
 * fields, sluice/admin.h). */
struct sluice__admin_sample {
    int64_t wall_ms;
    uint32_t limit, in_flight;
    uint32_t ceiling; /* 0 = not locked then */
    uint32_t waiting; /* calls queued for a permit or a hold */
};

/* What a node's recent figures are computed from: one per sampler tick. */
struct sluice__admin_tally {
    int64_t wall_ms;
    uint64_t requests, overloads, timeouts;
    struct sluice_histogram_counts queue_wait;
};

/* One open connection as the request deadline tracks it (under conns_mutex). */
struct sluice__admin_conn {
    struct sluice__admin_conn *prev, *next;
    int fd;           /* its socket */
    bool waiting;     /* its (next) request has not arrived in full yet */
    bool served;      /* it has had an answer: idle and waiting, it is a kept-alive one */
    bool cut;         /* shut down already */
    bool over;        /* opened past max_connections: its request gets 503 */
    int64_t since_ms; /* monotonic: when it opened, or when its last answer ended */
};

/* One engine node as the admin tracks it (under mutex). */
struct sluice__admin_node {
    const char *id;                            /* engine-owned */
    const struct sluice_event_ring *ring;      /* NULL: fixed node, no events */
    bool preset;                               /* a built-in backend the program did not name */
    atomic_bool used;                          /* a preset that has had traffic: listed */
    uint64_t cursor;                           /* events counted so far (a seq) */
    uint64_t backoffs[SLUICE_CAUSE_COUNT];     /* backoff events by cause */
    uint64_t events[SLUICE__ADMIN_N_KINDS];    /* events by kind */
    uint64_t dropped;                          /* overwritten before counted */
    struct sluice__admin_sample *history;      /* ring of history_s samples */
    uint32_t hist_head, hist_len;
    struct sluice__admin_tally recent[SLUICE__ADMIN_RECENT_S + 1]; /* ring: the last
                                                                      RECENT_S seconds' ends */
    uint32_t recent_head, recent_len;
};

struct sluice_admin {
    struct sluice_engine *engine;
    struct MHD_Daemon *daemon;
    uint16_t port;
    bool loopback;
    struct sluice_admin_desc cfg; /* resolved; address and error not kept */
    pthread_mutex_t mutex;
    pthread_cond_t tick; /* broadcast by the sampler each second and by stop */
    pthread_t sampler;
    bool sampler_started;
    atomic_bool stopping;
    atomic_uint streams;
    pthread_mutex_t conns_mutex;      /* taken inside mutex, never around it */
    pthread_cond_t slot_freed;        /* on conns_mutex: broadcast by a close and by stop */
    struct sluice__admin_conn *conns; /* open connections, a doubly linked list */
    bool admit_over; /* the connection being accepted is over max_connections (listener) */
    struct sluice__admin_node *nodes;
    size_t n_nodes;
};

static inline int64_t sluice__admin_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t sluice__admin_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- admin_http.c ------------------------------------------------------------------- */

/* libmicrohttpd's access handler: the checks, then the route (admin_routes.c). */
enum MHD_Result sluice__admin_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                         const char *method, const char *version,
                                         const char *upload, size_t *upload_size, void **con_cls);

/* libmicrohttpd's MHD_OPTION_NOTIFY_COMPLETED: a request's answer has ended. */
void sluice__admin_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                                enum MHD_RequestTerminationCode toe);

/* ---- admin_reply.c: answers and parameters ----------------------------------------- */

/* Queue `body` (len bytes) with `type`; `release` frees it when sent (NULL: static). */
enum MHD_Result sluice__admin_send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                        char *body, size_t len, void (*release)(void *));

/* Queue `body` as compact JSON and a newline; takes the reference. */
enum MHD_Result sluice__admin_send_json(struct MHD_Connection *c, unsigned status, json_t *body);

/* Queue {"error": the formatted message, "fix": fix, "status": status}; `allow`, if not
 * NULL, is the Allow header (405). A 503 also closes the connection. */
enum MHD_Result sluice__admin_send_error(struct MHD_Connection *c, unsigned status,
                                         const char *allow, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The node named by ?node_id=, or -1 after answering 400/404. `required` false: a
 * missing node_id yields -2 (all nodes). */
ptrdiff_t sluice__admin_want_node(struct sluice_admin *a, struct MHD_Connection *c, bool required,
                                  enum MHD_Result *answered);

/* Parameter `name` as an unsigned decimal (0 when absent); false after answering 400. */
bool sluice__admin_want_u64(struct MHD_Connection *c, const char *name, uint64_t *out,
                            enum MHD_Result *answered);

/* Parameter `name` as 1/true or 0/false (false when absent); false after answering 400. */
bool sluice__admin_want_flag(struct MHD_Connection *c, const char *name, bool *out,
                             enum MHD_Result *answered);

/* ---- admin_stream.c -------------------------------------------------------------- */

/* Answer with a server-sent-event stream of node i's events after seq `after` (or after
 * the request's Last-Event-ID), or 503 past max_streams. */
enum MHD_Result sluice__admin_send_stream(struct sluice_admin *a, struct MHD_Connection *c,
                                          size_t i, uint64_t after);

/* ---- admin_conns.c: the request deadline ------------------------------------------- */

/* libmicrohttpd's accept policy, on its listener thread: make room for the connection
 * just accepted (a slot, or one of the spare slots that answer 503), waiting while none
 * can be made yet; MHD_NO only when the admin stops. */
enum MHD_Result sluice__admin_on_accept(void *cls, const struct sockaddr *addr, socklen_t len);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION: a connection opened or closed. */
void sluice__admin_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                                 enum MHD_ConnectionNotificationCode code);

/* The connection's request has arrived in full (waiting = false), or its answer has ended
 * and the deadline starts over for the next one (waiting = true). Returns whether the
 * connection was opened past max_connections. */
bool sluice__admin_conn_mark(struct sluice_admin *a, struct MHD_Connection *c, bool waiting);

/* Shut down the reading side of every connection whose request is overdue. */
void sluice__admin_cut_overdue(struct sluice_admin *a);

/* ---- admin_routes.c ------------------------------------------------------------------ */

/* Answer the request for `url` by its route's handler, or 404 / 405. */
enum MHD_Result sluice__admin_route(struct sluice_admin *a, struct MHD_Connection *c,
                                    const char *url, const char *method);

/* ---- admin_json.c ------------------------------------------------------------------ */

/* The program's start deadline for node `id`'s calls that name none (desc.start_deadline),
 * in ms, *source saying where it comes from; -1 = none (or no callback). */
static inline int64_t sluice__admin_start_deadline_ms(const struct sluice_admin *a,
                                                      const char *id, const char **source)
{
    *source = NULL;
    int64_t ms = a->cfg.start_deadline ? a->cfg.start_deadline(a->cfg.start_deadline_ctx, id,
                                                               source)
                                       : -1;
    if (ms >= 0 && !*source)
        *source = "configured";
    return ms < 0 ? -1 : ms;
}

/* Node `id`'s index, or -1. */
ptrdiff_t sluice__admin_node_index(const struct sluice_admin *a, const char *id);

/* Does node i belong in the listings (GET /compute/concurrency, the history, /metrics)?
 * Every node the program registered does; a built-in preset (openrouter) only once it
 * has had traffic (a call, a refusal, a run admitted), and from then on. */
bool sluice__admin_node_listed(struct sluice_admin *a, size_t i);

/* Node i's state: everything the page, sluicectl and the clear route show; NULL when the
 * engine no longer reports it. Takes mutex for the recent tallies. */
json_t *sluice__admin_node_json(struct sluice_admin *a, size_t i);

/* Node n's chart: [[wall_ms, limit, in_flight, ceiling, waiting], ...], oldest first.
 * Call under mutex. */
json_t *sluice__admin_history_json(const struct sluice_admin *a,
                                   const struct sluice__admin_node *n);

/* ---- admin_sampler.c -------------------------------------------------------------- */

/* The sampler thread: once a second until stop, every job below, then the tick. */
void *sluice__admin_sampler_main(void *arg);

/* Count the events that arrived since the last call (call under mutex). */
void sluice__admin_count_events(struct sluice_admin *a);

/* A node's tally now: what its counters (c) and queue-wait histogram say. */
struct sluice__admin_tally sluice__admin_take_tally(struct sluice_pool *pool,
                                                    const struct sluice_pool_counts *c,
                                                    int64_t wall_ms);

#endif
