/*
 * sluice/admin.h — the admin endpoint: a small loopback HTTP server that
 * shows an engine's nodes, streams their event feeds, clears them, exports
 * Prometheus metrics and serves the Concurrency Health page.
 *
 * What it is: opt-in. A program that wants it calls sluice_admin_start()
 * with its engine; nothing listens otherwise. It binds 127.0.0.1:8400 by
 * default (port SLUICE_SOME(0) picks a free one; sluice_admin_port() says
 * which). Routes:
 *
 *   GET  /                                   the Concurrency Health page (HTML, self-contained)
 *   GET  /compute/concurrency                JSON: every node's state, glyph, in flight, limit,
 *                                            ceiling, lock expiry, status line, deadline
 *                                            figures and (desc.start_deadline) the start
 *                                            deadline of calls that name none
 *   GET  /compute/concurrency/events?node_id=N[&after=SEQ][&follow=1]
 *                                            the node's event feed as JSON Lines, oldest first,
 *                                            events after seq SEQ; follow=1 streams new ones as
 *                                            server-sent events (id = seq, event = kind)
 *   GET  /compute/concurrency/history[?node_id=N]
 *                                            JSON: [wall_ms, limit, in_flight, ceiling (0 = not
 *                                            locked then), waiting] sampled once a second over
 *                                            the last history_s seconds (the page's chart)
 *   POST /compute/concurrency/clear?node_id=N
 *                                            sluice_engine_clear(N), then {"cleared": true,
 *                                            "node": its new state}; "cleared" is false, and
 *                                            nothing is done, when N is already clear (probing,
 *                                            no lock, no event since its last clear or ever);
 *                                            500 when the store failed to drop the lock (a
 *                                            "store" event: it is gone from memory, but a
 *                                            restart would bring it back), in the state file's
 *                                            words when desc.statefile names it
 *   GET  /metrics                            Prometheus text format (see sluice_admin_metrics)
 *
 * Which nodes are listed (GET /compute/concurrency, so the page and sluicectl status;
 * the history without node_id; /metrics): every backend the program registered, and a
 * built-in preset backend (openrouter, sluice/engine.h) only once it has had traffic (a
 * call, a refusal or a run admitted), and from then on; a program that registers its
 * own "openrouter" names it, and it is listed from the start. A preset never used stays
 * out of the way, but a route given its node_id answers for it all along.
 *
 * Every error answer the endpoint makes is JSON (Content-Type
 * application/json), {"error": what is wrong, "fix": what to do, "status":
 * the HTTP status}: 400 missing or malformed node_id (or another
 * parameter), 404 unknown node or route, 405 wrong method (with Allow), 409
 * clearing a fixed node (it has no discovered ceiling), 413 a request body
 * over max_body_bytes, 403 a browser request from a foreign page (see
 * below), 500 a clear that failed, 503 too many event streams or
 * connections (then the connection closes).
 *
 * Not JSON: a request libmicrohttpd cannot parse never reaches the
 * endpoint. libmicrohttpd answers it itself, with a short HTML page and no
 * Content-Type, and closes the connection; it has no hook to replace that
 * answer (none in 0.9.75, the version this builds against, nor in 1.0).
 * These are: 400 for a request line whose version is not HTTP/d.d, a header
 * line without a colon, a malformed Content-Length or chunked encoding; 505
 * for HTTP/0.x and HTTP/2.0 and above (HTTP/2 and HTTP/3 clients must fall
 * back to HTTP/1.1 here); 413 for a Content-Length or chunk size beyond 64
 * bits; 414 / 431 for a request line or headers beyond the connection's
 * memory (max_request_bytes). A request line without a space is closed
 * unanswered, and so is a chunked body still arriving past
 * 16 x max_body_bytes + 64 KiB (it is not drained forever). A client tells
 * the endpoint's answers from these by the Content-Type.
 *
 * Security: the endpoint has no authentication; anyone who reaches it can
 * read node state and clear locks. Hence loopback only by default. Binding
 * another address needs `allow_remote = true`, and that is a risk: put it
 * behind a firewall or an authenticating proxy. On a loopback bind, a
 * request whose Host is not a loopback address literal (127.0.0.0/8 or
 * [::1]) or `localhost`, each with an optional port, is refused: any other
 * name, even 127.attacker.example, can be rebound to 127.0.0.1 by its owner
 * (DNS rebinding). On every bind a POST carrying an Origin other than
 * http://<its Host> is refused, and on a loopback bind that host must pass
 * the same rule (a web page cannot clear a node behind the user's back;
 * curl sends no Origin).
 *
 * Slow or hostile clients: at most max_connections at once (one thread
 * each). A connection past them takes the slot of the kept-alive
 * connection that has been idle longest between requests (closed, as
 * HTTP lets a server do; clients retry), or else of the one whose request
 * has been arriving longest, once that is over half a second (a request
 * over loopback or a LAN arrives in milliseconds). While a request is
 * still within that grace the newcomer waits for it (the endpoint accepts
 * nobody meanwhile: the kernel's listen queue keeps newcomers in order, so
 * a client renewing never-ending heads as fast as they are cut joins the
 * back of the queue and cannot crowd the operator out). Only when every
 * slot has a request that arrived in full (an answer or a stream in
 * progress) does a newcomer get 503, eight at a time; the rest wait in the
 * queue, never reset. Each has max_request_bytes for its request line and headers and
 * max_body_bytes for a body (the routes take none), and closed after
 * timeout_s idle seconds. Idle time alone does not bound a client that
 * dribbles a byte at a time, so each request must also arrive in full
 * (head and any body) within timeout_s of the connection opening, or of
 * the previous answer on a kept-alive connection; one that has not is cut
 * at the sampler's next tick (so within timeout_s + 1 s). At most
 * max_streams follow=1 streams, which send a keep-alive comment well
 * inside timeout_s (a stream's request arrived long ago: no deadline).
 *
 * Threads: libmicrohttpd's listener plus one thread per connection, and one
 * sampler thread that once a second records each node's limit and in-flight
 * count for the chart, counts events for /metrics and cuts connections
 * whose request is overdue. All of them only read
 * the engine through its public status calls, except the clear route, which
 * calls sluice_engine_clear and sluice_engine_sync (and, after a failed
 * store write, reads desc.statefile's last error, which is thread-safe).
 * sluice_admin_stop() returns after every one of them has ended (streams
 * are told to finish first).
 *
 * Concurrency: start and stop are not thread-safe against each other for
 * one admin; every other function may be called from any thread. The
 * engine must outlive the admin (stop it before destroying the engine).
 *
 * Memory ordering: the node counters and chart history live behind one
 * mutex; the stop flag is a seq_cst atomic read by stream readers.
 */
#ifndef SLUICE_ADMIN_H
#define SLUICE_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include <sluice/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What each field of struct sluice_admin_desc left at zero becomes. */
#define SLUICE_ADMIN_ADDRESS_DEFAULT "127.0.0.1"
#define SLUICE_ADMIN_PORT_DEFAULT 8400
#define SLUICE_ADMIN_MAX_CONNECTIONS_DEFAULT 32u
#define SLUICE_ADMIN_MAX_STREAMS_DEFAULT 8u /* or max_connections, when that is fewer */
#define SLUICE_ADMIN_TIMEOUT_S_DEFAULT 10u
#define SLUICE_ADMIN_MAX_REQUEST_BYTES_DEFAULT 16384u
#define SLUICE_ADMIN_MAX_BODY_BYTES_DEFAULT 4096u
#define SLUICE_ADMIN_HISTORY_S_DEFAULT 300u

/*
 * The start deadline a program gives a node's calls that name none, when it
 * decides that outside the pool: sluice-proxy's `start_deadline_ms`, or the
 * time after which its clients have been hanging up (learned). Returns it in
 * ms, or -1 for none, and points *source at a static word saying where it
 * comes from ("configured", "learned"). Called from the admin's threads,
 * several at once: it must be thread-safe and must not block.
 */
typedef int64_t (*sluice_admin_start_deadline_fn)(void *ctx, const char *node,
                                                  const char **source);

/*
 * A program's own families for /metrics, after the admin's (sluice-proxy's client
 * connections and answers): Prometheus text format 0.0.4, each family with its # HELP and
 * # TYPE lines, every line ending in a newline, in memory from malloc (the admin frees it);
 * NULL adds nothing. Called from the admin's threads, several at once: it must be
 * thread-safe and must not block.
 */
typedef char *(*sluice_admin_metrics_fn)(void *ctx);

struct sluice_statefile; /* sluice/statefile.h */

struct sluice_admin_desc {
    struct sluice_engine *engine;  /* required; must outlive the admin */
    const char *address;           /* numeric IPv4 or IPv6 address, or "localhost"
                                      (default: "127.0.0.1") */
    struct sluice_opt_u32 port;    /* TCP port (default: 8400; SLUICE_SOME(0) = any free port,
                                      read it back with sluice_admin_port; at most 65535) */
    bool allow_remote;             /* RISK: must be true to bind a non-loopback address; the
                                      endpoint has no authentication (default: false) */
    uint32_t max_connections;      /* connections at once, one thread each; past it an idle
                                      kept-alive one or a request head slower than half a
                                      second is closed, else 503 (default: 32; 1..1024) */
    uint32_t max_streams;          /* follow=1 event streams at once, counted in
                                      max_connections (default: 8; at most max_connections) */
    uint32_t timeout_s;            /* an idle connection is closed after this, and so is one
                                      whose request (head and body) has not arrived in full
                                      this long after it opened or after its previous answer
                                      (default: 10; 1..3600) */
    uint32_t max_request_bytes;    /* memory for a request line and headers
                                      (default: 16384; 4096..1048576) */
    uint32_t max_body_bytes;       /* a larger request body gets 413 (default: 4096; at most
                                      max_request_bytes) */
    uint32_t history_s;            /* seconds of chart history kept per node
                                      (default: 300; 10..3600) */
    sluice_admin_start_deadline_fn start_deadline; /* shown on the page, as start_deadline_ms
                                      and start_deadline_source in /compute/concurrency and as
                                      sluice_default_start_deadline_seconds in /metrics
                                      (default: NULL = none to show) */
    void *start_deadline_ctx;
    sluice_admin_metrics_fn metrics; /* appends the program's own families to /metrics
                                      (default: NULL = none) */
    void *metrics_ctx;
    struct sluice_statefile *statefile; /* the state file whose ops are the engine's store,
                                      if they are (sluice/statefile.h): a clear that file
                                      fails to write is answered with its message, which
                                      names the path and the cause (default: NULL = the
                                      answer says the store failed, not why) */
    char *error;                   /* receives a message naming the field when start fails
                                      (default: NULL = no message) */
    size_t error_size;             /* bytes at error, NUL included (default: 0) */
};

struct sluice_admin;

/*
 * Bind, start the server and its sampler thread. Returns SLUICE_OK,
 * SLUICE_EINVAL (a field is wrong: desc->error names it; also a port in
 * use or an address that cannot be bound), SLUICE_EIO (the server did not
 * start) or SLUICE_ENOMEM. *out is NULL on failure.
 */
int sluice_admin_start(const struct sluice_admin_desc *desc, struct sluice_admin **out);

/* The port it listens on (the one picked, for SLUICE_SOME(0)). */
uint16_t sluice_admin_port(const struct sluice_admin *a);

/*
 * Stop: refuse new connections, end open streams, join every thread the
 * admin started, free it. NULL is a no-op.
 */
void sluice_admin_stop(struct sluice_admin *a);

/*
 * The bodies the routes answer, for embedders with their own HTTP server
 * and for tests. Each returns a NUL-terminated string allocated with
 * malloc (free() it), or NULL when out of memory.
 *
 * sluice_admin_status_json: the body of GET /compute/concurrency.
 * sluice_admin_metrics: the body of GET /metrics, Prometheus text format
 *   0.0.4. Families, in this order, each with a `node` label:
 *     sluice_inflight, sluice_limit (+Inf = unlimited), sluice_ceiling
 *     (0 = not locked), sluice_lock_expiry_timestamp_seconds (0 = none),
 *     sluice_waiting (calls queued for a permit or a Retry-After hold),
 *     sluice_requests_total{outcome} (ok, overload, ignore),
 *     sluice_admissions_refused_total{reason} (capacity, predicted_late),
 *     sluice_refused_late_total, sluice_timeouts_total, sluice_cancels_total,
 *     sluice_overloads_total, sluice_lingered_total, sluice_lingering,
 *     sluice_linger_mode{mode} (1 for what abandoned calls do now: on, off,
 *     or learned while the trial has not decided),
 *     sluice_expected_service_seconds (0 = unknown),
 *     sluice_expected_first_byte_seconds (0 = unknown; a stream's first token),
 *     sluice_default_start_deadline_seconds (0 = none; desc.start_deadline), the histograms
 *     sluice_queue_wait_seconds and sluice_call_seconds, sluice_state{state}
 *     (1 for the current state: probing, backoff, locked, fixed), and for
 *     adaptive nodes sluice_backoffs_total{cause}, sluice_events_total{event}
 *     and sluice_events_dropped_total (events the ring overwrote before
 *     the admin counted them). The event counters count events seen since
 *     the admin started, including those still in each node's ring then.
 *     Each family is one row of the table in shim/src/admin_metrics.c. Then
 *     desc.metrics' text, if any.
 */
char *sluice_admin_status_json(struct sluice_admin *a);
char *sluice_admin_metrics(struct sluice_admin *a);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_ADMIN_H */
