/*
 * proxy.h — what the files of sluice-proxy share (main.c opens with the
 * program's manual): its options and backends, the connection record, and
 * the functions one file calls in another, each documented where it is
 * defined.
 *
 *   options.c   the command line, its help, and the quick-start backend
 *   config.c    --config FILE: many backends, with comments; errors name file, line, field
 *   route.c     which backend serves a request, and the URL it goes to
 *   http.c      the front end: accept, parse, bounds, answers, keep-alive, writes
 *   upstream.c  one request on the curl loop: headers out, answer streamed back, status mapping
 *   patience.c  the clients' patience, learned from their hang-ups: a start deadline where none is named
 *   log.c       the access log, one line per request
 *   main.c      engine, state file, fleet, admin, the event loop, signals, drain
 *
 * Threads: one. The event loop (epoll) runs the listener, every client
 * connection and the curl loop in embedder's-loop mode (sluice/curl.h), so
 * a completion, a write callback and a client's bytes never race: nothing
 * here takes a lock. The library's own threads (state file writer, admin
 * endpoint, fleet agent) only touch the engine through its public calls.
 */
#ifndef SLUICE_PROXY_H
#define SLUICE_PROXY_H

#include <curl/curl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <sluice/admin.h>
#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

#include "tool.h"

#define PROG "sluice-proxy"

/* ---- configuration ----------------------------------------------------------------- */

#define PROXY_NODE_DEFAULT "cloud:default"
#define PROXY_LISTEN_DEFAULT "127.0.0.1:8080"
#define PROXY_ADMIN_DEFAULT "127.0.0.1:8400"
#define PROXY_ACTIVE_DEFAULT 256 /* the most discovery may allow: far above most caps */
#define PROXY_BACKENDS_MAX 64
#define PROXY_MODELS_MAX 64
#define PROXY_UNPOOLED_MAX 64
#define PROXY_SPARE_EASY 1024 /* finished calls' easy handles kept for reuse */
#define PROXY_MODEL_READ_MAX 65536 /* bytes of a body read to find "model" */
#define PROXY_MODEL_MAX 256         /* a model name, its NUL included (a longer one is none) */
#define PROXY_REQUEST_ID_MAX 128    /* an upstream's request id logged, its NUL included */
/* An upstream silent this long is cut: longer than any first token (a reasoning model's
 * minutes), short of holding a permit for good. */
#define PROXY_UPSTREAM_IDLE_MS_DEFAULT 600000u
/* The client's deadlines, relative milliseconds: the whole call, and its start (a stream's
 * first byte). */
#define PROXY_DEADLINE_HEADER "X-Sluice-Deadline-Ms"
#define PROXY_START_DEADLINE_HEADER "X-Sluice-Start-Deadline-Ms"

enum proxy_route_kind {
    ROUTE_PREFIX, /* the path starts with `prefix` (default: "/") */
    ROUTE_HEADER, /* header `header` has value `header_value` */
    ROUTE_MODEL,  /* the JSON body's "model" is one of `models` */
};

enum proxy_key_header { KEY_BEARER, KEY_X_API_KEY };

/* One backend: a sluice pool in front of one upstream. Strings are owned (malloc). */
struct backend {
    char *id;                 /* node ID, e.g. cloud:default_ollama */
    char *upstream;           /* base URL, no trailing slash */
    char *prefix;             /* path prefix removed before forwarding (default: "/") */
    char *header, *header_value; /* ROUTE_HEADER's match */
    char *models[PROXY_MODELS_MAX];
    size_t n_models;
    bool is_default;          /* serves what no other route matches */
    char *key_env;            /* environment variable holding the API key (default: none) */
    char *key;                /* its value, read at start; never logged */
    enum proxy_key_header key_header;
    bool pass_client_key;     /* keep the client's Authorization / x-api-key (default: false,
                                 when key_env is set) */
    enum sluice_curl_dialect dialect;
    uint32_t active;          /* (default: PROXY_ACTIVE_DEFAULT) */
    struct sluice_opt_u32 waiting;
    bool discovery;           /* (default: true) */
    uint32_t jumpstart, min_limit; /* discovery's, 0 = its default */
    int64_t lock_ttl_s;       /* discovery's (default: 0 = 24 h) */
    uint32_t deadline_ms;     /* whole call when the client names none (default: 0 = none) */
    uint32_t start_deadline_ms; /* start (first byte) when the client names none (0 = none) */
    struct sluice_deadline_desc deadlines; /* start_quantile, queue_late, linger, linger_max_ms */
    char *redis_url;          /* the Redis fleet (default: none) */
    uint32_t fleet_floor;     /* its least limit while Redis is unreachable, at most active
                                 (default: 0 = the fleet's, 1 call) */
    char *ca_file;            /* PEM CA certificates an https:// upstream is verified against,
                                 as curl --cacert (default: none, libcurl's own store) */
    /* Upstream paths (prefixes of the path sent upstream, the backend's prefix removed) whose
     * requests go around the pool as reads do (upstream.c): a provider's endpoints that
     * generate nothing (default: proxy_unpooled_default; the config file's list is owned) */
    const char *const *unpooled;
    size_t n_unpooled;
    char **unpooled_owned;
    int line;                 /* where the config file defined it (0 = command line) */
    size_t prefix_len, upstream_len;
};

struct options {
    const char *listen_host;
    unsigned listen_port;
    bool allow_remote;        /* needed to listen on a non-loopback address */
    const char *admin_host;   /* NULL = no admin endpoint */
    unsigned admin_port;
    bool admin_explicit;      /* named on the command line or in the file: no fallback to a
                                 free port */
    bool listen_given, state_given, access_log_given; /* on the command line: the file's loses */
    /* Where the config file set listen / admin ("FILE:LINE: listen"), for the errors about the
     * address; NULL: the command line's or the default */
    const char *listen_where, *admin_where;
    const char *state;        /* state file; NULL = the XDG default; "" = none */
    const char *config;       /* --config FILE */
    const char *access_log;   /* file, "-" = stderr (default), "off" = none */
    bool log_json;
    uint32_t max_header_bytes;
    uint32_t max_body_bytes;
    uint32_t max_connections;
    uint32_t client_timeout_ms; /* a request must arrive in full this long after its first byte */
    uint32_t idle_timeout_ms;   /* a kept-alive connection with nothing to do is closed after */
    uint32_t upstream_idle_ms;  /* an upstream that sends nothing for this long is cut */
    uint32_t drain_ms;          /* SIGTERM: in-flight calls get this long to finish */
    uint32_t retry_after_s;     /* on the proxy's own 503s */
    /* The numbers above that a flag set (their offsets in this struct): the file's values for
     * them lose, as for listen and the others that have a _given of their own */
    size_t flags_set[8];
    unsigned n_flags_set;
    struct backend backends[PROXY_BACKENDS_MAX];
    size_t n_backends;
};

/* options.c */
int parse_options(int argc, char **argv, struct options *o);
bool options_flag_set(const struct options *o, size_t offset);
void backend_defaults(struct backend *b);
extern const char *const proxy_unpooled_default[];
extern const size_t proxy_unpooled_default_n;
bool parse_host_port(const char *s, const char **host, unsigned *port, char *buf, size_t size);
void options_free(struct options *o);
bool upstream_url_ok(const char *url, char *why, size_t size);
const char *url_shown(const char *url, char *buf, size_t size);
bool backend_deadlines_ok(const struct backend *b, const char *whole, char *why, size_t size);

/* config.c */
int config_load(const char *path, struct options *o);


/* ---- the front end ------------------------------------------------------------------- */

struct buf {
    char *p;
    size_t len, cap;
};
bool buf_put(struct buf *b, const void *data, size_t n);
bool buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What epoll's data.ptr points at: the first member of each watched thing. */
enum watch_kind { W_LISTEN, W_CLIENT, W_CURL, W_SIGNAL };
struct watch {
    enum watch_kind kind;
    int fd;                    /* -1 once forgotten (a curl socket removed mid-iteration) */
    struct watch *next_dead;
};

enum conn_state {
    C_HEAD,     /* reading a request's head */
    C_BODY,     /* reading its body */
    C_CALL,     /* the request is upstream; the answer streams back */
    C_FLUSH,    /* answered in full; writing what is left, then the next request or close */
    C_LINGER,   /* answered and shut for writing; what the client still sends is dropped */
};

#define HDR_MAX 100

/* One request header, pointing into the connection's input buffer. */
struct header {
    const char *name, *value;
    size_t name_len, value_len;
};

/* A parsed request, pointing into the connection's input buffer. */
struct request {
    const char *method, *target;
    size_t method_len, target_len;
    int minor;                 /* HTTP/1.minor */
    struct header h[HDR_MAX];
    size_t n_h;
    uint64_t content_length;   /* chunked: the decoded length, once the last chunk is in */
    bool chunked;              /* the body comes as Transfer-Encoding: chunked */
    bool keep_alive;
    bool expect_continue;
    int64_t deadline_ms, start_deadline_ms; /* from the client's headers, -1 = none */
};

struct proxy;
struct proxy_events;

struct conn {
    struct watch w;            /* first: epoll's pointer */
    struct proxy *p;
    enum conn_state state;
    struct buf in;             /* bytes read, the current request at its start */
    size_t head_len;           /* bytes of the current request's head (0 = incomplete) */
    size_t scanned;            /* where the search for its end resumes */
    /* A chunked body, decoded in place as it arrives: the decoded bytes follow the head, then
     * what is not decoded yet (a part of a size line, of a trailer). */
    enum { CK_SIZE, CK_DATA, CK_DATA_END, CK_TRAILER } ck_state;
    uint64_t ck_left;          /* bytes of the current chunk still to come */
    size_t ck_body;            /* bytes decoded */
    size_t ck_trailer;         /* bytes of trailer fields seen (bounded as a head is) */
    struct request req;        /* empty until its head parses (next_request empties it) */
    struct buf out;
    size_t out_off;            /* bytes of `out` already written */
    uint32_t events;           /* what epoll watches now */
    int64_t deadline_ns;       /* slow-client / idle cut-off (monotonic) */
    bool closing;              /* close once `out` is written */
    bool gone;                 /* the socket is closed; freed when its call completes */
    bool dirty;                /* on the flush list */
    bool pipelined;            /* bytes of a next request wait behind the current call */
    bool uncounted;            /* not one of --max-connections: lingering, or refused for it */
    struct conn *next_dirty, *prev, *next;
    /* The call in progress (C_CALL). */
    struct backend *backend;
    CURL *easy;
    struct curl_slist *up_headers;
    uint64_t call_id;
    bool in_call;
    bool head_ready;           /* the upstream's head is complete (in up_head until sent) */
    bool head_sent;            /* the answer's status line is out: a failure now cuts it */
    bool chunked;              /* the answer is re-chunked to the client */
    bool no_body;              /* HEAD, 204, 304 */
    bool paused;               /* the upstream transfer waits for the client to read */
    long up_status;            /* the upstream answer's status (0 = not yet) */
    bool up_has_length;        /* ... came with a Content-Length */
    bool up_sse;               /* ... is text/event-stream */
    bool hold_head;            /* a start deadline: the head waits until the answer has begun */
    bool reads;                /* the request only reads, or generates nothing (an unpooled
                                  path): no permit, no patience (upstream.c) */
    bool begun;                /* the answer has begun: a body byte (an SSE `data:` line) */
    bool read_on;              /* its client left after the answer began; the answer is read
                                  on and dropped until it ends or read_on_until_ns (upstream.c,
                                  upstream_client_gone) */
    int64_t read_on_until_ns;
    struct conn *read_on_prev, *read_on_next; /* the proxy's reading_on list, while read on */
    bool answered_at_cut;      /* its deadline passed mid-transfer and the client has its answer
                                  (upstream.c, on_cut); the loop reads the upstream's on */
    int64_t up_last_ns;        /* the upstream's last byte, the request body's last one taken,
                                  or the request's going out (0 = not yet: queued, or
                                  connecting); --upstream-idle-ms runs from it */
    curl_off_t up_sent;        /* the request body's bytes the upstream has taken so far */
    int64_t up_silent_ns;      /* the silence that cut the call (upstream_sweep), 0 = none */
    int up_errno;              /* the OS's word for why the upstream call failed (libcurl's
                                  CURLINFO_OS_ERRNO: refused, unreachable, timed out), 0 = none
                                  (libcurl keeps none for a socket it could not open) */
    char up_error[CURL_ERROR_SIZE]; /* libcurl's own words for it (CURLOPT_ERRORBUFFER: the
                                  host, the port, the TLS check that failed), "" = none */
    struct buf up_head;        /* the upstream answer's head as it will go to the client */
    struct proxy_events *up_events; /* a 2xx stream's events, read for an error event
                                       (upstream.c); NULL = none read */
    int64_t t_start_ns, t_first_ns;
    int64_t patience_ms;       /* the learned start deadline this call runs under (patience.c),
                                  -1 = one the request or its backend named, or none */
    uint64_t bytes_out;
    /* What the access log says of the request. */
    int status_out;
    const char *outcome;
    int64_t queued_ns;
    char model[PROXY_MODEL_MAX];           /* the body's top-level "model", "" = none */
    char request_id[PROXY_REQUEST_ID_MAX]; /* the answer's x-request-id or request-id (what
                                              the provider's SDK error shows), "" = none */
};

/* The clients' patience at one backend (patience.c). */
#define PATIENCE_SAMPLES 16u /* the last hang-ups remembered */
struct patience {
    int64_t ns[PATIENCE_SAMPLES]; /* how long each client waited before it hung up */
    uint64_t added;
    /* The time the last hang-ups agree on (0 = none), since when, and of the clients that
     * waited about that long since then, how many hung up and how many were answered. */
    int64_t candidate_ns, candidate_at;
    uint64_t candidate_hung, candidate_answered;
    /* Atomic for the admin's threads (patience_shown_ms); written by the proxy's thread. */
    _Atomic int64_t last_ns;    /* when the newest one hung up (monotonic) */
    _Atomic int64_t learned_ns; /* the start deadline they show, 0 = none */
    int64_t announced_ns; /* what stderr last said was learned, 0 = none */
};

/* Why a client was refused as it connected (proxy_counts.refused). */
enum { REFUSED_MAX_CONNECTIONS, REFUSED_DESCRIPTORS, REFUSED_REASONS };

/* What /metrics shows of the proxy itself (main.c, proxy_metrics): counted on the loop's
 * thread, read on the admin's. */
struct proxy_counts {
    _Atomic uint32_t connections;              /* n_conns, as the admin may read it */
    _Atomic uint64_t refused[REFUSED_REASONS]; /* clients refused as they connected */
    _Atomic uint64_t answers[600];             /* answers (access-log lines) by status */
};

struct proxy {
    struct options *o;
    struct sluice_engine *engine;
    struct sluice_curl_loop *loop;
    struct sluice_statefile *state;
    struct sluice_admin *admin;
    struct sluice_fleet *fleets[PROXY_BACKENDS_MAX];
    int ep;                    /* epoll */
    struct watch listener, signals;
    unsigned port;
    int64_t curl_timer_ns;     /* when the curl loop wants its timeout action (-1 = none) */
    bool kick;                 /* requests were submitted in this iteration: run the loop now,
                                  not one epoll round trip later when its wake-up fd says so */
    struct conn *dirty;        /* connections with bytes to write */
    struct conn *conns;        /* every open connection, for the sweep and the drain */
    struct conn *reading_on;   /* closed ones whose answer is read on, for the sweep */
    struct conn *dead;         /* released records, freed at the end of the loop iteration */
    struct watch *dead_watches; /* curl sockets forgotten in this iteration (as above) */
    uint32_t n_conns;          /* those that count toward --max-connections */
    uint32_t n_lingering;      /* the others (http.c, conn_linger) */
    int spare_fd;              /* held for a client that finds no descriptor left (http.c,
                                  refuse_without_descriptors); -1 while lent out or lost */
    bool out_of_fds;           /* said so on stderr since the last accept that found one */
    bool listener_asleep;      /* not watched until the next sweep: no descriptor, no spare */
    bool draining;
    int64_t drain_deadline_ns;
    FILE *log;
    CURL *spare_easy[PROXY_SPARE_EASY]; /* handles of finished calls, for the next ones */
    size_t n_spare;
    struct patience patience[PROXY_BACKENDS_MAX]; /* by backend, as o->backends */
    struct proxy_counts counts;
};

/* patience.c */
void patience_hung_up(struct patience *pt, const char *backend, int64_t waited_ns, int64_t now);
void patience_answered(struct patience *pt, int64_t waited_ns);
int64_t patience_start_ms(struct patience *pt, const char *backend, int64_t now);
int64_t patience_shown_ms(const struct patience *pt, int64_t now);

/* route.c */
void routes_prepare(struct options *o);
bool route_model(const char *body, size_t len, char *out, size_t size);
struct backend *route_pick(struct options *o, const char *path, const struct request *r,
                           const char *model);
int route_url(const struct backend *b, const char *path, char *out, size_t size);
/* Whether `path` goes upstream under one of b's unpooled paths (a whole segment matches). */
bool route_unpooled(const struct backend *b, const char *path);
void routes_list(const struct options *o, char *out, size_t size);

/* http.c */
/* Before the listener: the descriptors --max-connections needs, as far as the hard limit lets
 * (stderr says when it falls short), and the spare held for a client that finds none left. */
void http_prepare_descriptors(struct proxy *p);
void http_accept(struct proxy *p);
void http_on_event(struct conn *c, uint32_t events);
void http_sweep(struct proxy *p, int64_t now);
void http_flush_dirty(struct proxy *p);
void http_drain(struct proxy *p);
void http_mark_dirty(struct conn *c);
void http_watch(struct conn *c, uint32_t events);
void http_error(struct conn *c, int status, const char *type, const char *code,
                const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void refusal_headers(const struct proxy *p, const char *refused, char *out, size_t size);
void http_request_done(struct conn *c);
void http_call_over(struct conn *c);
void http_close_all(struct proxy *p);
void conn_free(struct conn *c);
bool http_header(const struct request *r, const char *name, const char **value, size_t *len);
bool http_header_is(const char *name, size_t len, const char *want);
const char *http_reason(int status);

/* upstream.c */
void upstream_start(struct conn *c, struct backend *b, const char *path, const char *body,
                    size_t body_len);
void upstream_client_gone(struct conn *c);
void upstream_sweep_read_on(struct proxy *p, int64_t now);
void upstream_sweep(struct conn *c, int64_t now);
void upstream_resume(struct conn *c);
void upstream_free(struct conn *c);
void upstream_free_spares(struct proxy *p);

/* log.c */
struct access {
    const struct backend *backend;
    const char *method, *path;
    size_t method_len, path_len;
    int status;
    const char *outcome;
    int64_t queued_ns, ttfb_ns, duration_ns;
    uint64_t bytes;
    const char *model, *request_id; /* NULL or "" = none */
};
void access_log(struct proxy *p, const struct access *a);

int64_t proxy_now_ns(void);

#endif /* SLUICE_PROXY_H */
