/*
 * sim.h — what the files of sluice-provider-sim share: its constants, its
 * options, the provider's state (one `server`, behind its lock) and the
 * functions one file calls in another. main.c opens with the program's
 * manual (endpoints, modes, threads, allocation); by concept:
 *
 *   options.c   the command line and its help
 *   provider.c  the provider: slots, the FIFO, waiting for an answer
 *               (the model itself is provider_model.h)
 *   http.c      libmicrohttpd: routes, /stats
 *   answer.c    JSON bodies, a dialect's headers, the libmicrohttpd log
 *   dialect.c   answering as a provider family would (--dialect)
 *   stream.c    server-sent-event answers (--stream)
 *   main.c      start-up, --cap-at, the per-second lines, the stop
 */
#ifndef SLUICE_PROVIDER_SIM_SIM_H
#define SLUICE_PROVIDER_SIM_SIM_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/resource.h>

#include <jansson.h>
#include <microhttpd.h>

#include "provider_model.h"
#include "tool.h"

#define PROG "sluice-provider-sim"
#define CHAT_PATH "/v1/chat/completions"
#define MAX_BODY (1u << 20)      /* larger request bodies get 413 */
#define MAX_CAP_CHANGES 64       /* --cap-at entries */
#define MAX_COUNT 1000000u       /* bound on --cap, --cap-at and --queue-bound values */
#define CONNECTION_LIMIT 4096u   /* open connections (one thread each) */
#define THREAD_STACK (512u << 10)
#define STOP_BOUND_S 5           /* a stop that takes longer is killed by SIGALRM */
#define NS_PER_S INT64_C(1000000000)
#define MAX_SERVICE_NS 8.64e13   /* one day: longer draws are cut to it */
#define MAX_ANSWER_TOKENS 1000000u /* longer draws of --answer-tokens are cut to it */
#define MAX_TOKEN_BYTES 16384u     /* --token-bytes */
#define STREAM_BLOCK (64u << 10)   /* bytes MHD asks the stream reader for, at most */

/* ---- options --------------------------------------------------------------- */

struct cap_change {
    int64_t at_ns; /* after start */
    uint32_t cap;
};

/* ---- dialects (--dialect): what each provider family sends ------------------ */

enum dialect {
    DIALECT_NONE, /* the simulator's own OpenAI-like bodies, no rate-limit headers */
    DIALECT_OPENAI,
    DIALECT_AZURE,
    DIALECT_ANTHROPIC,
    DIALECT_OPENROUTER,
    DIALECT_TOGETHER,
    DIALECT_GROQ,
    DIALECT_GEMINI,
};


#define MAX_SIGNAL_SPANS 16 /* --platform-at and --quota-at entries, each */

/* A span of time after start during which every call gets one refusal. */
struct signal_span {
    int64_t from_ns, until_ns;
};

struct dialect_options {
    enum dialect id;
    struct signal_span platform[MAX_SIGNAL_SPANS], quota[MAX_SIGNAL_SPANS];
    size_t n_platform, n_quota;
};

/* --stream and its flags. */
struct stream_options {
    bool on;               /* --stream */
    bool any;              /* a stream flag other than --stream was given */
    double token_ms;       /* time between tokens (default: 10) */
    double answer_tokens;  /* median answer length in tokens (default: 16) */
    double answer_sigma;   /* its lognormal shape (default: 1) */
    uint32_t token_bytes;  /* bytes of text per token (default: 4) */
    uint32_t fail_after;   /* tokens before a 429 error event (default: 0 = never) */
    bool fail_set;
    bool endless;          /* --stream-endless */
    bool stamp;            /* --stream-stamp: each token's text is its send time */
    double end_ms;         /* --stream-end-ms: the body's end comes this long after [DONE] */
};

/* What a call whose client hangs up mid-call does with its slot. */
enum abandoned { ABANDONED_HOLD, ABANDONED_FREE };

struct options {
    uint16_t port;             /* 0 = pick a free one */
    struct sim_provider model; /* retry_after_s holds whole seconds */
    bool queue_bound_set;
    bool queue_timeout_set;
    enum abandoned abandoned;  /* (default: ABANDONED_HOLD) */
    bool retry_after_set;
    bool retry_after_date;     /* send Retry-After as an HTTP date, not seconds */
    struct cap_change changes[MAX_CAP_CHANGES];
    size_t n_changes;
    uint64_t seed;
    bool quiet;
    struct dialect_options dialect; /* --dialect, --platform-at, --quota-at */
    struct stream_options stream;
};

/* ---- the provider ------------------------------------------------------------ */

enum req_state {
    REQ_READING, /* request still arriving, or not a chat call */
    REQ_WAITING, /* in the provider's FIFO (queue mode), or dropped: never started (drop mode) */
    REQ_SERVING, /* holds a slot until due_ns (also once its client left, when lingering) */
    REQ_EXPIRED, /* left the FIFO by --queue-timeout: counted, its thread answers 503 */
    REQ_DONE     /* answered or counted as cancelled */
};

/* One HTTP request (MHD's con_cls). Owned by its connection thread. */
struct req {
    enum req_state state; /* guarded by server.lock once the call reaches the provider */
    bool is_chat;         /* POST /v1/chat/completions */
    bool too_large;       /* body over MAX_BODY: answered 413 */
    int wake_fd;          /* REQ_WAITING: written when it leaves the FIFO; -1 = none */
    int64_t due_ns;       /* REQ_SERVING: when its service time ends */
    int64_t queued_ns;    /* REQ_WAITING: when it joined the FIFO */
    bool lingering;       /* REQ_SERVING after its client left (--abandoned hold) */
    int64_t rate_reset_ns; /* a rate-mode refusal: when its window frees a slot (0 = not one) */
    uint64_t id;
    struct req *next;     /* FIFO link */
    char *body;           /* request body, body_len bytes */
    size_t body_len;
    struct stream *stream; /* a call answered with SSE (--stream); NULL otherwise */
};

/* A streamed answer's progress. Owned by its connection thread. */
struct stream {
    int fd;              /* the client's socket, watched between tokens */
    uint32_t tokens;     /* answer length, drawn when the stream starts */
    uint32_t sent;       /* tokens sent so far */
    int64_t next_ns;     /* when the next token is due (the first one: the call's due_ns) */
    int64_t end_ns;      /* when the last token is due (--abandoned hold keeps the slot till then) */
    bool began, over;    /* the opening comment went out; the last event went out */
    char model_json[300]; /* the request's model as a JSON string */
};

/* Streamed answers (stats_json's "stream"). */
struct stream_counters {
    uint64_t started;   /* streams that sent their headers */
    uint64_t completed; /* ended with [DONE] */
    uint64_t failed;    /* ended with a 429 error event (--stream-fail-after) */
    uint64_t cut;       /* the connection closed mid-stream (the client hung up) */
    uint64_t tokens;    /* tokens sent, all streams */
};

struct counters {
    uint64_t requests;  /* chat calls that reached the provider */
    uint64_t cancelled; /* of those, calls whose client left before the answer */
    uint64_t queue_timeouts; /* of the 503s, calls that waited --queue-timeout */
    uint64_t by_status[600];
    struct stream_counters stream;
};

/* The provider: every field guarded by `lock` (see main.c). */
struct server {
    pthread_mutex_t lock;
    struct sim_provider model; /* .cap changes with --cap-at */
    struct sim_rng rng;
    struct sim_rate_window rate; /* rate mode: when the last calls were accepted */
    uint32_t in_service, waiting;
    uint32_t lingering; /* of in_service, calls whose client left (--abandoned hold) */
    uint32_t peak_in_flight, peak_in_service; /* in flight = in service − lingering + waiting */
    struct req *head, *tail;                  /* FIFO of waiting calls */
    struct counters total;
    uint64_t next_id;
    bool stopping;
    bool retry_after_date;
    enum abandoned abandoned;
    struct dialect_options dialect;
    struct stream_options stream;
    int stop_fd;   /* eventfd, readable once stopping */
    int64_t t0_ns; /* start, CLOCK_MONOTONIC */
};

extern struct server server;

/* Set by a handler that returns MHD_NO on purpose (its client left, or the
 * server stops): MHD then logs "internal error", which here is no error. */
extern _Thread_local bool mhd_no_on_purpose; /* answer.c */

/* The functions one file calls in another, by the file that defines them
 * (each is documented there). */

/* options.c */
void parse_options(int argc, char **argv, struct options *o);

/* provider.c */
int64_t sim_clock_ns(void);
uint32_t in_flight(const struct server *sv);
void note_peaks(struct server *sv);
void pump(struct server *sv);
void finish_service(struct server *sv, struct req *r);
void abandon_call(struct server *sv, struct req *r);
void cancel_call(struct server *sv, struct req *r);
int arrive(struct server *sv, struct req *r);
int wait_for_answer(struct server *sv, struct MHD_Connection *conn, struct req *r);

/* http.c */
enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                           const char *method, const char *version, const char *upload,
                           size_t *upload_size, void **con_cls);
void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                  enum MHD_RequestTerminationCode toe);

/* answer.c */
void mhd_log(void *cls, const char *fmt, va_list ap);
enum MHD_Result respond_json(struct MHD_Connection *conn, unsigned status, json_t *body,
                             const char *retry_after);
/* Add the dialect's headers gathered for this answer (dialect_header) to `res`, and forget
 * them. */
enum MHD_Result add_dialect_headers(struct MHD_Response *res);
json_t *error_body(const char *message, const char *type, const char *code);
void request_model(const struct req *r, char *out, size_t n);
json_t *completion_body(const struct req *r);
/* Add a header to the answer this thread builds next (at most 6). */
__attribute__((format(printf, 2, 3))) void dialect_header(const char *name, const char *fmt, ...);

/* dialect.c */
bool in_signal_span(const struct server *sv);
enum MHD_Result answer_signal(struct server *sv, struct MHD_Connection *conn);
enum MHD_Result answer_in_dialect(struct server *sv, struct MHD_Connection *conn, struct req *r,
                                  int status);

/* stream.c */
bool request_streams(const struct req *r);
enum MHD_Result respond_stream(struct server *sv, struct MHD_Connection *conn, struct req *r);

#endif /* SLUICE_PROVIDER_SIM_SIM_H */
