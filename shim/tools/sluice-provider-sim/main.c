/*
 * sluice-provider-sim — an HTTP/1.1 server on 127.0.0.1 that behaves like a
 * remote model provider (an LLM API) with a hidden concurrency cap, so the
 * shim can be tested and benchmarked over real sockets.
 *
 *   POST /v1/chat/completions   an OpenAI-shaped chat.completion after a
 *                               lognormal service time; past the cap:
 *                                 reject  429 at once (optional Retry-After)
 *                                 queue   wait in a FIFO (Ollama-like); 503
 *                                         past --queue-bound waiting, and
 *                                         503 to a call that waited
 *                                         --queue-timeout (HAProxy's
 *                                         `timeout queue`)
 *                                 knee    served, but slower: S·(1+slope·(n−C)/C)
 *                               and three providers without a plain cap:
 *                                 rate    --rate R calls per sliding second
 *                                         (--rate-window), 429 past it
 *                                 slow    every call in service slows the
 *                                         rest: S·(1+slope·(n−1)/C), no cap
 *                                 drop    past C in service the call is never
 *                                         answered (the client times out)
 *                               With --stream, a call whose body asks
 *                               "stream": true is answered with server-
 *                               sent events instead (see "Streaming")
 *   GET  /stats                 counters as JSON (see stats_json)
 *   POST /stats/reset           zero the counters; peaks restart from now
 *
 * The model (service times, verdicts past the cap, knee slow-down) is the
 * one the virtual-time simulator runs: provider_model.h (beside this file;
 * tests/sim/provider_sim.h runs the same model in virtual time). This
 * file only adds the sockets, the clock and the counters.
 *
 * Start-up contract (tests rely on it): the first line on stdout is the
 * bound port as a bare decimal number, followed by a flush; nothing else is
 * written to stdout. Messages and the per-second lines go to stderr. Exit
 * codes: 0 after SIGTERM/SIGINT, 1 when the server cannot start, 2 on a bad
 * command line (one line on stderr saying which flag).
 *
 * Streaming (--stream): the mode's service time is the time to first token
 * (so queueing and the knee slow the first token, as at a real provider);
 * the call holds its slot from its start until its last token. The answer
 * is a comment at once (": sluice-provider-sim processing", as OpenRouter's
 * keep-alive), then one chat.completion.chunk per token every --token-ms,
 * --answer-tokens long (lognormal, --answer-sigma), a last chunk with
 * finish_reason "stop", a chunk with `usage`, and `data: [DONE]`.
 * --stream-fail-after N sends an error event with code 429 (and
 * finish_reason "error") after N tokens instead and ends the stream;
 * --stream-endless never ends it. A client that hangs up mid-stream is seen
 * at once (the thread waits for the next token in ppoll on its socket) and
 * counted in stream.cut; with --abandoned hold the slot stays taken until
 * the stream's planned end (at once for an endless stream).
 *
 * Abandoned calls (--abandoned): a client that hangs up while its call is
 * in service is counted as cancelled at once. With `hold` (the default) the
 * call keeps its slot until its service time ends, as an LLM provider keeps
 * generating (and billing) a completion nobody reads any more: /stats shows
 * it as lingering, counted in in_service but not in in_flight. With `free`
 * the slot is given back at once. Hold is the default because it is what
 * providers do, and what a client's discovery must cope with (a caller's
 * deadline or cancel does not free the provider's slot); `free` keeps the
 * tests whose point is that a hang-up reaches the provider at all. A call
 * still queued (queue mode) or dropped (drop mode) never started, so a
 * hang-up takes it out of the line in both settings. Refusals (429, and 503
 * past --queue-bound) are answered from the arriving call's thread at once:
 * nothing here delays them.
 *
 * Threads: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION). A call that must wait — in service, or
 * queued behind the cap — blocks its own connection thread in ppoll() on the
 * client's socket (POLLRDHUP), a per-call wake eventfd (queue mode), a
 * timeout (its service end, or its queue timeout) and a shared stop eventfd.
 * That is why this is not MHD's suspend/resume: MHD does not watch a
 * suspended connection, so it would not notice a client that hangs up
 * mid-call. Here a hang-up wakes the waiting thread at once; with
 * --abandoned free (or a call not yet in service) the handler returns
 * MHD_NO, and the request-completed callback (MHD_REQUEST_TERMINATED_*)
 * frees the slot and counts the call as cancelled; with hold the thread
 * stops watching the socket and sleeps out the service time first. A queued
 * call's timer, an arrival and every start of a queued call expire the
 * FIFO's head once it waited --queue-timeout. The cost is one thread
 * (512 KiB of stack, reserved not committed) per open connection: hundreds
 * of concurrent slow calls are fine; tens of thousands are not the use.
 * The main thread waits for SIGTERM/SIGINT with sigtimedwait, applies
 * --cap-at changes when they fall due and prints the per-second lines.
 *
 * Allocation: plain malloc. The build links mimalloc, whose malloc override
 * then serves it; under ASan and TSan the sanitizer's allocator does, so
 * they check these records too (explicit mi_* calls would bypass them, and
 * TSan reports mimalloc's uninstrumented cross-thread frees as races).
 *
 * All provider state (the model, the FIFO, counters, the random stream) sits
 * behind one mutex; no libmicrohttpd call and no blocking syscall is made
 * while holding it (creating a queued call's eventfd and writing to a
 * non-blocking one are the only syscalls under it).
 */
#define _GNU_SOURCE
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

static const char *const dialect_names[] = {"none",     "openai",     "azure", "anthropic",
                                            "openrouter", "together", "groq",  "gemini"};

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

static void stream_usage(FILE *f)
{
    fputs("\n"
          "Streaming (server-sent events to calls whose body has \"stream\": true):\n"
          "  --stream            answer such calls with SSE; the mode's service time\n"
          "                      (--median-ms, --sigma) is then the time to first token\n"
          "  --token-ms X        time between tokens in ms (default 10)\n"
          "  --answer-tokens N   median answer length in tokens (default 16)\n"
          "  --answer-sigma X    lognormal shape of answer lengths (default 1; 0 = always N)\n"
          "  --token-bytes N     bytes of text per token, 1 to 16384 (default 4)\n"
          "  --stream-fail-after N  after N tokens send an error event with code 429\n"
          "                      (finish_reason \"error\") and end the stream\n"
          "  --stream-endless    never end the stream\n"
          "  --stream-stamp      each token's text is the CLOCK_MONOTONIC ns at which it was\n"
          "                      sent, zero-padded to --token-bytes (at least 20), so a client\n"
          "                      on this machine can time the delivery (sluice-bench)\n",
          f);
}

static void usage(FILE *f)
{
    fputs("usage: " PROG " [options]\n"
          "A loopback HTTP/1.1 server that behaves like an LLM provider with a hidden\n"
          "concurrency cap. Prints the bound port on stdout as the first line.\n"
          "\n"
          "  --port N            port on 127.0.0.1 (default 0: pick a free one)\n"
          "  --mode M            reject | queue | knee | rate | slow | drop (default reject)\n"
          "  --cap N             hidden concurrency cap (default 8; >= 1 in knee and slow\n"
          "                      mode, where it scales the slow-down; unused in rate mode)\n"
          "  --cap-at T:N        at time T after start, set the cap to N; T takes ms, s or m\n"
          "                      (default s), e.g. --cap-at 60s:52; repeatable\n"
          "  --median-ms X       median service time in ms (default 2000; 0 = answer at once)\n"
          "  --sigma X           lognormal shape of service times (default 0.4; 0 = always\n"
          "                      the median)\n"
          "  --retry-after S     reject and rate mode: send Retry-After: S (whole seconds)\n"
          "                      with each 429\n"
          "  --retry-after-date  send that Retry-After as an HTTP date (now + S) instead\n"
          "  --queue-bound N     queue mode: waiting calls past which it answers 503\n"
          "                      (default 2 x cap)\n"
          "  --queue-timeout MS  queue mode: a call that waited MS in the queue is answered\n"
          "                      503 (as HAProxy's timeout queue; default 0: it waits)\n"
          "  --abandoned A       hold | free: a call whose client hangs up mid-call keeps\n"
          "                      its slot until its service time ends (hold, as an LLM\n"
          "                      provider keeps generating) or frees it at once (default\n"
          "                      hold)\n"
          "  --knee-slope X      knee mode: slow-down per unit of overload; slow mode: per C\n"
          "                      calls in service (default 2)\n"
          "  --rate R            rate mode: calls accepted per window second (required, > 0)\n"
          "  --rate-window S     rate mode: the sliding window in seconds (default 1)\n"
          "  --seed N            seed of the service-time stream (default 1)\n"
          "  --dialect D         openai | azure | anthropic | openrouter | together | groq |\n"
          "                      gemini: answer with that family's rate-limit headers (rate\n"
          "                      mode), error bodies and codes (default: none)\n"
          "  --platform-at T:MS  from T after start, for MS milliseconds, refuse every call\n"
          "                      with the dialect's platform overload (Anthropic 529\n"
          "                      overloaded_error, a Together or Gemini 503); repeatable\n"
          "  --quota-at T:MS     the same with the dialect's quota refusal (OpenAI 429\n"
          "                      insufficient_quota, OpenRouter 402, Gemini limit: 0, ...)\n"
          "  --quiet             no per-second lines and no libmicrohttpd log on stderr\n"
          "  --help              this text\n"
          "\n"
          "Endpoints: POST " CHAT_PATH ", GET /stats, POST /stats/reset.\n"
          "Exit status: 0 after SIGTERM or SIGINT, 1 if it cannot start, 2 on a bad flag.\n",
          f);
    stream_usage(f);
}

/* One line on stderr naming the flag to fix, then exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see --help)\n", stderr);
    exit(2);
}

static uint32_t need_count(const char *flag, const char *v)
{
    uint64_t n;
    if (!tool_parse_u64(v, MAX_COUNT, &n))
        bad_usage("%s needs a whole number from 0 to 1000000, got '%s'", flag, v);
    return (uint32_t)n;
}

static double need_number(const char *flag, const char *v)
{
    double x;
    if (!tool_parse_double(v, 0, HUGE_VAL, &x))
        bad_usage("%s needs a number >= 0, got '%s'", flag, v);
    return x;
}

/* "T:N" with T = number + ms|s|m (default s). */
static struct cap_change need_cap_change(const char *v)
{
    struct cap_change c;
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    double unit = 1.0;
    if (!strncmp(end, "ms", 2)) {
        unit = 1e-3;
        end += 2;
    } else if (*end == 's' || *end == 'm') {
        unit = *end == 'm' ? 60.0 : 1.0;
        end++;
    }
    uint64_t cap;
    if (end == v || errno || !(t >= 0) || t * unit > 1e9 || *end != ':' ||
        !tool_parse_u64(end + 1, MAX_COUNT, &cap))
        bad_usage("--cap-at needs TIME:CAP such as 60s:52 or 1500ms:8, got '%s'", v);
    c.at_ns = (int64_t)(t * unit * 1e9);
    c.cap = (uint32_t)cap;
    return c;
}

static int cmp_change(const void *a, const void *b)
{
    const struct cap_change *x = a, *y = b;
    return (x->at_ns > y->at_ns) - (x->at_ns < y->at_ns);
}

/* 1 if `flag` is one of with_value[n_with], 0 if one of without[n_without], else -1. */
static int flag_in(const char *flag, const char *const *with_value, size_t n_with,
                   const char *const *without, size_t n_without)
{
    for (size_t i = 0; i < n_with; i++)
        if (!strcmp(flag, with_value[i]))
            return 1;
    for (size_t i = 0; i < n_without; i++)
        if (!strcmp(flag, without[i]))
            return 0;
    return -1;
}

/* The streaming flags: 1 if the flag takes a value, 0 if not, -1 if it is not one. */
static int stream_flag_takes_value(const char *flag)
{
    static const char *const with_value[] = {"--token-ms", "--answer-tokens", "--answer-sigma",
                                             "--token-bytes", "--stream-fail-after"};
    static const char *const without[] = {"--stream", "--stream-endless", "--stream-stamp"};
    return flag_in(flag, with_value, sizeof with_value / sizeof *with_value, without,
                   sizeof without / sizeof *without);
}

/* Apply a streaming flag (one stream_flag_takes_value knows). */
static void parse_stream_flag(const char *flag, const char *value, struct stream_options *st)
{
    if (!strcmp(flag, "--stream")) {
        st->on = true;
        return;
    }
    st->any = true;
    if (!strcmp(flag, "--stream-endless")) {
        st->endless = true;
    } else if (!strcmp(flag, "--stream-stamp")) {
        st->stamp = true;
    } else if (!strcmp(flag, "--token-ms")) {
        st->token_ms = need_number(flag, value);
        if (st->token_ms > 86400e3)
            bad_usage("%s needs milliseconds from 0 to 86400000, got '%s'", flag, value);
    } else if (!strcmp(flag, "--answer-tokens")) {
        st->answer_tokens = need_count(flag, value);
        if (st->answer_tokens < 1)
            bad_usage("%s needs a whole number from 1 to 1000000, got '%s'", flag, value);
    } else if (!strcmp(flag, "--answer-sigma")) {
        st->answer_sigma = need_number(flag, value);
        if (st->answer_sigma > 10)
            bad_usage("%s needs a number from 0 to 10, got '%s'", flag, value);
    } else if (!strcmp(flag, "--token-bytes")) {
        st->token_bytes = need_count(flag, value);
        if (st->token_bytes < 1 || st->token_bytes > MAX_TOKEN_BYTES)
            bad_usage("%s needs a whole number from 1 to %u, got '%s'", flag, MAX_TOKEN_BYTES,
                      value);
    } else if (!strcmp(flag, "--stream-fail-after")) {
        st->fail_after = need_count(flag, value);
        st->fail_set = true;
    }
}

static void stream_defaults(struct stream_options *st)
{
    st->token_ms = 10;
    st->answer_tokens = 16;
    st->answer_sigma = 1;
    st->token_bytes = 4;
}

/* Flags that need --stream, or each other's absence. */
static void check_stream_options(const struct stream_options *st)
{
    if (st->any && !st->on)
        bad_usage("--token-ms, --answer-tokens, --answer-sigma, --token-bytes, "
                  "--stream-fail-after, --stream-endless and --stream-stamp need --stream");
    if (st->fail_set && st->endless)
        bad_usage("--stream-fail-after and --stream-endless exclude each other");
    if (st->stamp && st->token_bytes < 20)
        bad_usage("--stream-stamp needs --token-bytes of at least 20 (a nanosecond time)");
}

/* 1 if the flag takes a value, 0 if not, -1 if there is no such flag. */
static int flag_takes_value(const char *flag)
{
    int stream = stream_flag_takes_value(flag);
    if (stream >= 0)
        return stream;
    static const char *const with_value[] = {"--port", "--mode", "--cap", "--cap-at",
                                             "--median-ms", "--sigma", "--retry-after",
                                             "--queue-bound", "--queue-timeout",
                                             "--abandoned", "--knee-slope", "--seed",
                                             "--rate", "--rate-window", "--dialect",
                                             "--platform-at", "--quota-at"};
    static const char *const without[] = {"--help", "-h", "--quiet", "--retry-after-date"};
    return flag_in(flag, with_value, sizeof with_value / sizeof *with_value, without,
                   sizeof without / sizeof *without);
}

/* --dialect, --platform-at, --quota-at (the flags flag_takes_value lists; nothing else). */
static void parse_dialect_option(const char *flag, const char *value, struct dialect_options *d)
{
    if (!strcmp(flag, "--dialect")) {
        for (size_t i = 1; i < sizeof dialect_names / sizeof dialect_names[0]; i++)
            if (!strcmp(value, dialect_names[i])) {
                d->id = (enum dialect)i;
                return;
            }
        bad_usage("%s needs openai, azure, anthropic, openrouter, together, groq or gemini, "
                  "got '%s'", flag, value);
    }
    bool platform = !strcmp(flag, "--platform-at");
    size_t *n = platform ? &d->n_platform : &d->n_quota;
    struct signal_span *spans = platform ? d->platform : d->quota;
    if (*n == MAX_SIGNAL_SPANS)
        bad_usage("%s is given more than %d times", flag, MAX_SIGNAL_SPANS);
    struct cap_change c = need_cap_change(value); /* T:N, N read as milliseconds */
    spans[*n].from_ns = c.at_ns;
    spans[(*n)++].until_ns = c.at_ns + (int64_t)c.cap * (NS_PER_S / 1000);
}

static void parse_options(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->model.mode = SIM_REJECT;
    o->model.cap = 8;
    o->model.median_s = SIM_DEFAULT_MEDIAN_S;
    o->model.sigma = SIM_DEFAULT_SIGMA;
    o->model.knee_slope = SIM_DEFAULT_KNEE_SLOPE;
    o->seed = 1;
    stream_defaults(&o->stream);
    for (int i = 1; i < argc; i++) {
        char flag[32];
        const char *a = argv[i], *eq = strchr(a, '=');
        const char *value = NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof flag)
            bad_usage("unknown flag '%s'", a);
        memcpy(flag, a, len);
        flag[len] = '\0';
        if (eq) /* --flag=value */
            value = eq + 1;
        int takes = flag_takes_value(flag);
        if (takes < 0)
            bad_usage("unknown flag '%s'", a);
        if (takes && !value) {
            if (i + 1 >= argc)
                bad_usage("%s needs a value", flag);
            value = argv[++i];
        } else if (!takes && value) {
            bad_usage("%s takes no value, got '%s'", flag, value);
        }
        if (stream_flag_takes_value(flag) >= 0) {
            parse_stream_flag(flag, value, &o->stream);
        } else if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(flag, "--quiet")) {
            o->quiet = true;
        } else if (!strcmp(flag, "--retry-after-date")) {
            o->retry_after_date = true;
        } else if (!strcmp(flag, "--port")) {
            uint64_t p;
            if (!tool_parse_u64(value, 65535, &p))
                bad_usage("%s needs a port from 0 to 65535, got '%s'", flag, value);
            o->port = (uint16_t)p;
        } else if (!strcmp(flag, "--mode")) {
            if (!sim_mode_parse(value, &o->model.mode))
                bad_usage("%s needs reject, queue, knee, rate, slow or drop, got '%s'", flag,
                          value);
        } else if (!strcmp(flag, "--cap")) {
            o->model.cap = need_count(flag, value);
        } else if (!strcmp(flag, "--cap-at")) {
            if (o->n_changes == MAX_CAP_CHANGES)
                bad_usage("%s is given more than %d times", flag, MAX_CAP_CHANGES);
            o->changes[o->n_changes++] = need_cap_change(value);
        } else if (!strcmp(flag, "--median-ms")) {
            o->model.median_s = need_number(flag, value) / 1e3;
        } else if (!strcmp(flag, "--sigma")) {
            o->model.sigma = need_number(flag, value);
        } else if (!strcmp(flag, "--retry-after")) {
            uint64_t s;
            if (!tool_parse_u64(value, 86400, &s))
                bad_usage("%s needs whole seconds from 0 to 86400, got '%s'", flag, value);
            o->model.retry_after_s = (double)s;
            o->retry_after_set = true;
        } else if (!strcmp(flag, "--queue-bound")) {
            o->model.queue_bound = need_count(flag, value);
            o->queue_bound_set = true;
        } else if (!strcmp(flag, "--queue-timeout")) {
            o->model.queue_timeout_s = need_number(flag, value) / 1e3;
            o->queue_timeout_set = true;
        } else if (!strcmp(flag, "--abandoned")) {
            if (!strcmp(value, "hold"))
                o->abandoned = ABANDONED_HOLD;
            else if (!strcmp(value, "free"))
                o->abandoned = ABANDONED_FREE;
            else
                bad_usage("%s needs hold or free, got '%s'", flag, value);
        } else if (!strcmp(flag, "--knee-slope")) {
            o->model.knee_slope = need_number(flag, value);
        } else if (!strcmp(flag, "--rate")) {
            o->model.rate_per_s = need_number(flag, value);
        } else if (!strcmp(flag, "--rate-window")) {
            o->model.rate_window_s = need_number(flag, value);
        } else if (!strcmp(flag, "--seed")) {
            if (!tool_parse_u64(value, UINT64_MAX, &o->seed))
                bad_usage("%s needs a whole number, got '%s'", flag, value);
        } else {
            parse_dialect_option(flag, value, &o->dialect);
        }
    }
    if ((o->dialect.n_platform || o->dialect.n_quota) && o->dialect.id == DIALECT_NONE)
        bad_usage("--platform-at and --quota-at need --dialect D: the refusal is the dialect's");
    if (!o->queue_bound_set)
        o->model.queue_bound = SIM_DEFAULT_QUEUE_BOUND(o->model.cap);
    check_stream_options(&o->stream);
    if (o->retry_after_date && !o->retry_after_set)
        bad_usage("--retry-after-date needs --retry-after S as well");
    if (o->retry_after_set && o->model.mode != SIM_REJECT && o->model.mode != SIM_RATE)
        bad_usage("--retry-after applies to --mode reject and rate only, not %s",
                  sim_mode_name(o->model.mode));
    if (o->queue_timeout_set && o->model.mode != SIM_QUEUE)
        bad_usage("--queue-timeout applies to --mode queue only, not %s",
                  sim_mode_name(o->model.mode));
    if (!(o->model.queue_timeout_s <= 86400))
        bad_usage("--queue-timeout needs milliseconds from 0 to 86400000");
    if ((o->model.rate_per_s > 0 || o->model.rate_window_s > 0) && o->model.mode != SIM_RATE)
        bad_usage("--rate and --rate-window apply to --mode rate only, not %s",
                  sim_mode_name(o->model.mode));
    if (o->model.mode == SIM_RATE) {
        if (!(o->model.rate_per_s > 0))
            bad_usage("--mode rate needs --rate R, the calls accepted per second (> 0)");
        if (o->model.rate_window_s == 0)
            o->model.rate_window_s = SIM_DEFAULT_RATE_WINDOW_S;
        if (!(o->model.rate_window_s >= 0.001 && o->model.rate_window_s <= 86400))
            bad_usage("--rate-window needs seconds from 0.001 to 86400");
        if (o->model.rate_per_s * o->model.rate_window_s > MAX_COUNT)
            bad_usage("--rate x --rate-window must be at most %u calls per window", MAX_COUNT);
    }
    /* The knee and slow formulas divide by the cap. */
    if (o->model.mode == SIM_KNEE || o->model.mode == SIM_SLOW) {
        bool zero = o->model.cap == 0;
        for (size_t i = 0; i < o->n_changes; i++)
            zero = zero || o->changes[i].cap == 0;
        if (zero)
            bad_usage("--cap must be at least 1 in %s mode (also in --cap-at)",
                      sim_mode_name(o->model.mode));
    }
    qsort(o->changes, o->n_changes, sizeof o->changes[0], cmp_change);
}

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

static struct server {
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
} server = {.lock = PTHREAD_MUTEX_INITIALIZER, .stop_fd = -1};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* Under lock: calls whose client still waits for an answer. */
static uint32_t in_flight(const struct server *sv)
{
    return sv->in_service - sv->lingering + sv->waiting;
}

static void note_peaks(struct server *sv)
{
    uint32_t in_flight_now = in_flight(sv);
    if (in_flight_now > sv->peak_in_flight)
        sv->peak_in_flight = in_flight_now;
    if (sv->in_service > sv->peak_in_service)
        sv->peak_in_service = sv->in_service;
}

/* Under lock: `r` takes a slot now; its service time is drawn from the model. */
static void start_service(struct server *sv, struct req *r)
{
    sv->in_service++;
    double ns = sim_provider_service_s(&sv->model, &sv->rng, sv->in_service) * 1e9;
    if (!(ns < MAX_SERVICE_NS)) /* a huge --sigma can draw +inf */
        ns = MAX_SERVICE_NS;
    r->due_ns = now_ns() + (int64_t)ns;
    r->state = REQ_SERVING;
    note_peaks(sv);
}

/* Under lock: take `r` out of the FIFO (`prev` is the call before it, or NULL). */
static void fifo_unlink(struct server *sv, struct req *r, struct req *prev)
{
    if (prev)
        prev->next = r->next;
    else
        sv->head = r->next;
    if (sv->tail == r)
        sv->tail = prev;
    sv->waiting--;
}

static void wake(struct req *r)
{
    if (eventfd_write(r->wake_fd, 1) != 0)
        fprintf(stderr, PROG ": cannot wake a queued call: %s\n", strerror(errno));
}

static double waited_s(const struct req *r, int64_t now)
{
    return (double)(now - r->queued_ns) / 1e9;
}

/* Under lock: the calls at the head of the FIFO that waited --queue-timeout
 * leave it with a 503 (the head is the longest waiter, so the first that has
 * not expired ends the scan). Run whenever time moves: on an arrival, before
 * a waiting call starts, and when a waiting call's own timer fires. */
static void expire_waiting(struct server *sv, int64_t now)
{
    while (sv->head && sim_provider_queue_expired(&sv->model, waited_s(sv->head, now))) {
        struct req *r = sv->head;
        fifo_unlink(sv, r, NULL);
        r->state = REQ_EXPIRED;
        sv->total.by_status[503]++;
        sv->total.queue_timeouts++;
        wake(r);
    }
}

/* Under lock: start waiting calls while the model lets them (after a call
 * left its slot, or the cap rose). */
static void pump(struct server *sv)
{
    expire_waiting(sv, now_ns());
    while (sim_provider_may_start_waiting(&sv->model, sv->in_service, sv->waiting)) {
        struct req *r = sv->head;
        fifo_unlink(sv, r, NULL);
        start_service(sv, r);
        wake(r);
    }
}

/* Under lock: `r` gives its slot back; a lingering call was counted when
 * its client left. */
static void leave_service(struct server *sv, struct req *r)
{
    sv->in_service--;
    if (r->lingering) {
        sv->lingering--;
        r->lingering = false;
    }
    r->state = REQ_DONE;
    pump(sv);
}

/* Under lock: the call's service time is over; it is answered 200, unless
 * its client left already. */
static void finish_service(struct server *sv, struct req *r)
{
    if (!r->lingering)
        sv->total.by_status[200]++;
    leave_service(sv, r);
}

/* Under lock: the client of a call in service hung up, and the provider
 * keeps generating (--abandoned hold): counted as cancelled now, the slot
 * stays taken until due_ns. */
static void abandon_call(struct server *sv, struct req *r)
{
    r->lingering = true;
    sv->lingering++;
    sv->total.cancelled++;
}

/* Under lock: the client left (or the server stops) before the answer, and
 * the call gives back what it holds at once. */
static void cancel_call(struct server *sv, struct req *r)
{
    if (r->state == REQ_WAITING) {
        struct req *prev = NULL;
        for (struct req *q = sv->head; q != r; q = q->next)
            prev = q;
        fifo_unlink(sv, r, prev);
        sv->total.cancelled++;
        r->state = REQ_DONE;
        pump(sv);
        return;
    }
    if (!r->lingering)
        sv->total.cancelled++;
    leave_service(sv, r);
}

/*
 * A chat call reaches the provider. Returns the status to answer now, 0 when
 * the call must wait (REQ_SERVING or REQ_WAITING), or -1 when the server is
 * stopping.
 */
static int arrive(struct server *sv, struct req *r)
{
    int status = 0;
    pthread_mutex_lock(&sv->lock);
    if (sv->stopping) {
        pthread_mutex_unlock(&sv->lock);
        return -1;
    }
    sv->total.requests++;
    r->id = ++sv->next_id;
    expire_waiting(sv, now_ns());
    enum sim_verdict verdict =
        sv->model.mode == SIM_RATE &&
                !sim_rate_admit(&sv->model, &sv->rate, (double)(now_ns() - sv->t0_ns) / 1e9)
            ? SIM_REFUSE_429
            : sim_provider_admit(&sv->model, sv->in_service, sv->waiting);
    switch (verdict) {
    case SIM_SERVE:
        start_service(sv, r);
        if (r->stream) {
            status = 200; /* the stream starts now */
        } else if (r->due_ns <= now_ns()) { /* --median-ms 0: answer at once */
            finish_service(sv, r);
            status = 200;
        }
        break;
    case SIM_WAIT:
        r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (r->wake_fd < 0) {
            fprintf(stderr, PROG ": eventfd: %s; answering 503\n", strerror(errno));
            status = 503;
            break;
        }
        r->state = REQ_WAITING;
        r->queued_ns = now_ns();
        r->next = NULL;
        if (sv->tail)
            sv->tail->next = r;
        else
            sv->head = r;
        sv->tail = r;
        sv->waiting++;
        note_peaks(sv);
        break;
    case SIM_REFUSE_429:
        status = 429;
        break;
    case SIM_REFUSE_503:
        status = 503;
        break;
    }
    if (status && status != 200) /* a 200 was counted by finish_service */
        sv->total.by_status[status]++;
    pthread_mutex_unlock(&sv->lock);
    return status;
}

/* Under lock: how long the waiting thread of `r` may sleep (NULL: until
 * woken), or 0 in *status when the call is over: 200 (served), 503 (its
 * queue timeout passed) or -1 (served after its client left). */
static struct timespec *wait_timeout(struct server *sv, struct req *r, struct timespec *ts,
                                     int *status)
{
    int64_t now = now_ns(), left;
    *status = 0;
    if (r->state == REQ_WAITING)
        expire_waiting(sv, now);
    if (r->state == REQ_EXPIRED) {
        r->state = REQ_DONE; /* counted by expire_waiting */
        *status = 503;
        return NULL;
    }
    if (r->state == REQ_SERVING && r->stream && !r->lingering) {
        *status = 200; /* the stream starts now; its first token is due at due_ns */
        return NULL;
    }
    if (r->state == REQ_SERVING) {
        left = r->due_ns - now;
        if (left <= 0) {
            *status = r->lingering ? -1 : 200;
            finish_service(sv, r);
            return NULL;
        }
    } else if (r->state == REQ_WAITING && sv->model.queue_timeout_s > 0) {
        left = r->queued_ns + (int64_t)(sv->model.queue_timeout_s * 1e9) - now;
        if (left <= 0) /* rounding: expire_waiting did not see it due yet */
            left = 1000;
    } else {
        return NULL;
    }
    ts->tv_sec = (time_t)(left / NS_PER_S);
    ts->tv_nsec = (long)(left % NS_PER_S);
    return ts;
}

/*
 * Block this connection's thread until the call is over: its service time
 * ends (200), or its queue timeout passes (503). Returns -1 if the client
 * hung up or the server is stopping first; the call still holds its slot or
 * FIFO place then, and on_completed releases it. With --abandoned hold, a
 * client that hangs up during service does not end the wait: the call
 * lingers in its slot until due_ns, and then -1 is returned.
 */
static int wait_for_answer(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd fds[3] = {
        {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP},
        {.fd = sv->stop_fd, .events = POLLIN},
        {.fd = r->wake_fd, .events = POLLIN},
    };
    nfds_t n = r->wake_fd >= 0 ? 3 : 2;
    int status;
    pthread_mutex_lock(&sv->lock);
    for (;;) {
        struct timespec ts, *timeout = wait_timeout(sv, r, &ts, &status);
        pthread_mutex_unlock(&sv->lock);
        if (status)
            return status;
        /* A wake written before this ppoll stays readable, so none is lost. */
        if (ppoll(fds, n, timeout, NULL) < 0 && errno != EINTR)
            return -1;
        if (fds[1].revents)
            return -1; /* stopping */
        if (n == 3 && fds[2].revents) {
            eventfd_t drained;
            (void)eventfd_read(r->wake_fd, &drained);
        }
        pthread_mutex_lock(&sv->lock);
        if (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) { /* the client hung up */
            if (r->state != REQ_SERVING || sv->abandoned == ABANDONED_FREE) {
                pthread_mutex_unlock(&sv->lock);
                return -1;
            }
            abandon_call(sv, r);
            fds[0].fd = -1; /* ppoll skips it from now on */
        }
    }
}

/* ---- answers ------------------------------------------------------------------- */

/* Set by a handler that returns MHD_NO on purpose (its client left, or the
 * server stops): MHD then logs "internal error", which here is no error. */
static _Thread_local bool mhd_no_on_purpose;

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (mhd_no_on_purpose) {
        mhd_no_on_purpose = false;
        return;
    }
    fputs(PROG ": libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* Headers the dialect wants on the answer this thread is building (answer_in_dialect). */
#define MAX_DIALECT_HEADERS 6
static _Thread_local struct {
    size_t n;
    char name[MAX_DIALECT_HEADERS][40];
    char value[MAX_DIALECT_HEADERS][48];
} dialect_headers;

static enum MHD_Result add_dialect_headers(struct MHD_Response *res)
{
    enum MHD_Result ok = MHD_YES;
    for (size_t i = 0; ok == MHD_YES && i < dialect_headers.n; i++)
        ok = MHD_add_response_header(res, dialect_headers.name[i], dialect_headers.value[i]);
    dialect_headers.n = 0; /* one answer's */
    return ok;
}

static enum MHD_Result respond_json(struct MHD_Connection *conn, unsigned status, json_t *body,
                                    const char *retry_after)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text)
        return MHD_NO;
    struct MHD_Response *res =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
    free(text);
    if (!res)
        return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (ok == MHD_YES && retry_after)
        ok = MHD_add_response_header(res, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (ok == MHD_YES)
        ok = add_dialect_headers(res);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, status, res);
    MHD_destroy_response(res);
    return ok;
}

static json_t *error_body(const char *message, const char *type, const char *code)
{
    return json_pack("{s:{s:s, s:s, s:s}}", "error", "message", message, "type", type, "code", code);
}

/* The "model" of the request body, if it is JSON with one. */
static void request_model(const struct req *r, char *out, size_t n)
{
    snprintf(out, n, "sluice-sim");
    json_t *root = r->body_len ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
    const char *m = json_string_value(json_object_get(root, "model"));
    if (m)
        snprintf(out, n, "%s", m);
    json_decref(root);
}

static json_t *completion_body(const struct req *r)
{
    char id[48], model[256], content[64];
    snprintf(id, sizeof id, "chatcmpl-sim-%" PRIu64, r->id);
    snprintf(content, sizeof content, "sluice-provider-sim reply %" PRIu64, r->id);
    request_model(r, model, sizeof model);
    json_int_t prompt = (json_int_t)(r->body_len + 3) / 4, completion = 5;
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], s:{s:I, s:I, s:I}}",
                     "id", id, "object", "chat.completion", "created", (json_int_t)time(NULL),
                     "model", model, "choices", "index", 0, "message", "role", "assistant",
                     "content", content, "finish_reason", "stop", "usage", "prompt_tokens", prompt,
                     "completion_tokens", completion, "total_tokens", prompt + completion);
}

/* The Retry-After value for a 429, or NULL when none is configured. */
static const char *retry_after_value(const struct server *sv, char *buf, size_t n)
{
    if (!(sv->model.retry_after_s > 0))
        return NULL;
    if (!sv->retry_after_date) {
        snprintf(buf, n, "%.0f", sv->model.retry_after_s);
        return buf;
    }
    time_t at = time(NULL) + (time_t)sv->model.retry_after_s;
    struct tm tm;
    gmtime_r(&at, &tm);
    strftime(buf, n, "%a, %d %b %Y %H:%M:%S GMT", &tm); /* IMF-fixdate; the C locale */
    return buf;
}

/* ---- answering in a dialect ----------------------------------------------------------- */

/* Add one header to the answer this thread builds next. */
__attribute__((format(printf, 2, 3))) static void dialect_header(const char *name,
                                                                 const char *fmt, ...)
{
    if (dialect_headers.n == MAX_DIALECT_HEADERS)
        return;
    size_t i = dialect_headers.n++;
    snprintf(dialect_headers.name[i], sizeof dialect_headers.name[i], "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dialect_headers.value[i], sizeof dialect_headers.value[i], fmt, ap);
    va_end(ap);
}

/* Which refusal span holds now: the platform's, the quota's, or none (NULL). */
static const char *signal_now(const struct server *sv)
{
    int64_t t = now_ns() - sv->t0_ns;
    const struct dialect_options *d = &sv->dialect;
    for (size_t i = 0; i < d->n_platform; i++)
        if (t >= d->platform[i].from_ns && t < d->platform[i].until_ns)
            return "platform";
    for (size_t i = 0; i < d->n_quota; i++)
        if (t >= d->quota[i].from_ns && t < d->quota[i].until_ns)
            return "quota";
    return NULL;
}

static bool in_signal_span(const struct server *sv)
{
    return signal_now(sv) != NULL;
}

/* Count an answer given without the provider model (a refusal span). */
static void count_answer(struct server *sv, unsigned status)
{
    pthread_mutex_lock(&sv->lock);
    sv->total.requests++;
    sv->total.by_status[status]++;
    pthread_mutex_unlock(&sv->lock);
}

/* Anthropic's error envelope; the OpenAI-like one is error_body. */
static json_t *anthropic_error(const char *type, const char *message)
{
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                     message);
}

/* Google RPC's error envelope, with a RetryInfo delay when retry_s > 0. */
static json_t *gemini_error(int code, const char *status, const char *message, double retry_s)
{
    json_t *e = json_pack("{s:{s:i, s:s, s:s}}", "error", "code", code, "message", message,
                          "status", status);
    if (retry_s > 0) {
        char delay[32];
        snprintf(delay, sizeof delay, "%.3fs", retry_s);
        json_object_set_new(json_object_get(e, "error"), "details",
                            json_pack("[{s:s, s:s}]", "@type",
                                      "type.googleapis.com/google.rpc.RetryInfo", "retryDelay",
                                      delay));
    }
    return e;
}

/* Every call in a --platform-at or --quota-at span: the dialect's refusal. */
static enum MHD_Result answer_signal(struct server *sv, struct MHD_Connection *conn)
{
    bool platform = !strcmp(signal_now(sv), "platform");
    enum dialect id = sv->dialect.id;
    unsigned status;
    json_t *body;
    if (platform) {
        status = id == DIALECT_ANTHROPIC ? 529 : 503;
        body = id == DIALECT_ANTHROPIC ? anthropic_error("overloaded_error", "Overloaded")
               : id == DIALECT_GEMINI
                   ? gemini_error(503, "UNAVAILABLE", "The model is overloaded.", 0)
                   : error_body("the platform is overloaded", "server_error", "overloaded");
        if (id == DIALECT_TOGETHER) /* a 503 at or below the dynamic rate */
            dialect_header("x-ratelimit-limit-dynamic", "%.0f", sv->model.rate_per_s);
    } else if (id == DIALECT_OPENROUTER || id == DIALECT_TOGETHER) {
        status = 402;
        body = error_body("Insufficient credits", "payment_required", "insufficient_credits");
    } else if (id == DIALECT_ANTHROPIC) {
        status = 400;
        body = anthropic_error("invalid_request_error", "Your credit balance is too low");
    } else if (id == DIALECT_GEMINI) {
        status = 429;
        body = gemini_error(429, "RESOURCE_EXHAUSTED",
                            "Quota exceeded for metric: generate_content_free_tier_requests, "
                            "limit: 0",
                            0);
    } else {
        status = 429;
        body = error_body("You exceeded your current quota, please check your plan and "
                          "billing details.",
                          "insufficient_quota", "insufficient_quota");
    }
    count_answer(sv, status);
    return respond_json(conn, status, body, NULL);
}

/* The rate-limit headers of `id` for a window with `left` calls left, whose oldest
 * acceptance leaves it in reset_s. Limits are stated per the family's documented window. */
static void dialect_rate_headers(const struct server *sv, uint32_t left, double reset_s)
{
    double rate = sv->model.rate_per_s;
    double reset_ms = ceil(reset_s * 1e3);
    switch (sv->dialect.id) {
    case DIALECT_OPENAI:
    case DIALECT_AZURE:
    case DIALECT_GROQ:
        if (sv->dialect.id != DIALECT_AZURE) /* Azure states what remains only */
            dialect_header("x-ratelimit-limit-requests", "%.0f",
                           rate * (sv->dialect.id == DIALECT_GROQ ? 86400 : 60));
        dialect_header("x-ratelimit-remaining-requests", "%" PRIu32, left);
        dialect_header("x-ratelimit-reset-requests", "%.0fms", reset_ms);
        break;
    case DIALECT_ANTHROPIC: {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        int64_t at_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + (int64_t)reset_ms;
        time_t at_s = (time_t)(at_ms / 1000);
        struct tm tm;
        gmtime_r(&at_s, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
        dialect_header("anthropic-ratelimit-requests-limit", "%.0f", rate * 60);
        dialect_header("anthropic-ratelimit-requests-remaining", "%" PRIu32, left);
        dialect_header("anthropic-ratelimit-requests-reset", "%s.%03dZ", stamp,
                       (int)(at_ms % 1000));
        break;
    }
    case DIALECT_OPENROUTER: {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        dialect_header("X-RateLimit-Limit", "%" PRIu32, sv->rate.slots);
        dialect_header("X-RateLimit-Remaining", "%" PRIu32, left);
        dialect_header("X-RateLimit-Reset", "%.0f",
                       (double)now.tv_sec * 1e3 + (double)(now.tv_nsec / 1000000) + reset_ms);
        break;
    }
    case DIALECT_TOGETHER:
        dialect_header("x-ratelimit-limit", "%.0f", rate);
        dialect_header("x-ratelimit-remaining", "%" PRIu32, left);
        dialect_header("x-ratelimit-reset", "%.3f", reset_ms / 1e3);
        dialect_header("x-ratelimit-limit-dynamic", "%.0f", rate);
        break;
    case DIALECT_GEMINI: /* no rate headers */
    case DIALECT_NONE:
        break;
    }
}

/* A served call (200) or a rate-mode refusal (429), as the dialect answers them. */
static enum MHD_Result answer_in_dialect(struct server *sv, struct MHD_Connection *conn,
                                         struct req *r, int status)
{
    double reset_s = 0;
    if (sv->model.mode == SIM_RATE) {
        pthread_mutex_lock(&sv->lock);
        uint32_t left = sim_rate_left(&sv->model, &sv->rate,
                                      (double)(now_ns() - sv->t0_ns) / 1e9, &reset_s);
        pthread_mutex_unlock(&sv->lock);
        dialect_rate_headers(sv, left, reset_s);
    }
    if (status == 200)
        return respond_json(conn, 200, completion_body(r), NULL);
    enum dialect id = sv->dialect.id;
    char ra[32];
    const char *retry_after = NULL;
    if (id == DIALECT_ANTHROPIC || id == DIALECT_GROQ || id == DIALECT_AZURE) {
        snprintf(ra, sizeof ra, "%.0f", ceil(reset_s) > 0 ? ceil(reset_s) : 1);
        retry_after = ra;
    }
    if (id == DIALECT_AZURE)
        dialect_header("retry-after-ms", "%.0f", ceil(reset_s * 1e3));
    json_t *body =
        id == DIALECT_ANTHROPIC
            ? anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit")
        : id == DIALECT_GEMINI
            ? gemini_error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted.", reset_s)
            : error_body("Rate limit reached for requests", "requests", "rate_limit_exceeded");
    return respond_json(conn, 429, body, retry_after);
}

/* ---- streaming (--stream) ---------------------------------------------------------- */

/* The request body asks for a streamed answer ("stream": true). */
static bool request_streams(const struct req *r)
{
    json_t *root = r->body_len ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
    bool yes = json_is_true(json_object_get(root, "stream"));
    json_decref(root);
    return yes;
}

/* Under lock: the answer's length, from the --answer-tokens distribution. */
static uint32_t draw_answer_tokens(struct server *sv)
{
    double n = sim_lognormal(&sv->rng, sv->stream.answer_tokens, sv->stream.answer_sigma) + 0.5;
    return n < 1 ? 1 : n > MAX_ANSWER_TOKENS ? MAX_ANSWER_TOKENS : (uint32_t)n;
}

enum stream_wake { STREAM_DUE, STREAM_HUNG_UP, STREAM_STOPPING };

/* Sleep until `at`, watching the client's socket and the stop eventfd. */
static enum stream_wake stream_wait(struct server *sv, const struct stream *st, int64_t at)
{
    struct pollfd fds[2] = {{.fd = st->fd, .events = POLLRDHUP}, {.fd = sv->stop_fd, .events = POLLIN}};
    for (;;) {
        int64_t left = at - now_ns();
        struct timespec ts = {(time_t)(left > 0 ? left / NS_PER_S : 0),
                              (long)(left > 0 ? left % NS_PER_S : 0)};
        int n = ppoll(fds, 2, &ts, NULL); /* a zero timeout still reports a hang-up */
        if (n < 0 && errno != EINTR)
            return STREAM_HUNG_UP;
        if (n > 0)
            return fds[1].revents ? STREAM_STOPPING : STREAM_HUNG_UP;
        if (n == 0 && left <= 0)
            return STREAM_DUE;
    }
}

/* One chat.completion.chunk event (`delta` and `finish` are JSON) into buf; its length. */
static ssize_t stream_chunk(const struct req *r, char *buf, size_t max, const char *delta,
                            const char *finish, const char *more)
{
    int n = snprintf(buf, max,
                     "data: {\"id\":\"chatcmpl-sim-%" PRIu64 "\",\"object\":\"chat.completion."
                     "chunk\",\"created\":%lld,\"model\":%s,\"choices\":[{\"index\":0,\"delta\":%s,"
                     "\"finish_reason\":%s}]%s}\n\n",
                     r->id, (long long)time(NULL), r->stream->model_json, delta, finish, more);
    return n < 0 || (size_t)n >= max ? MHD_CONTENT_READER_END_WITH_ERROR : (ssize_t)n;
}

/* The next token's chunk: token_bytes letters (the first one carries the role). */
static ssize_t stream_token(struct server *sv, const struct req *r, char *buf, size_t max)
{
    static const char head[] = "{\"role\":\"assistant\",\"content\":\"";
    char delta[MAX_TOKEN_BYTES + sizeof head + 4];
    const struct stream *st = r->stream;
    size_t at = r->stream->sent ? (size_t)snprintf(delta, sizeof delta, "{\"content\":\"")
                                : (size_t)snprintf(delta, sizeof delta, "%s", head);
    if (sv->stream.stamp) /* the check above keeps token_bytes >= 20 digits */
        snprintf(delta + at, sv->stream.token_bytes + 1, "%0*" PRId64,
                 (int)sv->stream.token_bytes, now_ns());
    else
        memset(delta + at, 'a' + (int)(st->sent % 26), sv->stream.token_bytes);
    snprintf(delta + at + sv->stream.token_bytes, 3, "\"}");
    return stream_chunk(r, buf, max, delta, "null", "");
}

/* The last events: finish_reason "stop", `usage`, [DONE]. */
static ssize_t stream_last(const struct req *r, char *buf, size_t max)
{
    ssize_t n = stream_chunk(r, buf, max, "{}", "\"stop\"", "");
    char usage[160];
    json_int_t prompt = (json_int_t)(r->body_len + 3) / 4, completion = r->stream->sent;
    snprintf(usage, sizeof usage,
             ",\"usage\":{\"prompt_tokens\":%" JSON_INTEGER_FORMAT ",\"completion_tokens\":%"
             JSON_INTEGER_FORMAT ",\"total_tokens\":%" JSON_INTEGER_FORMAT "}",
             prompt, completion, prompt + completion);
    ssize_t u = n < 0 ? n : stream_chunk(r, buf + n, max - (size_t)n, "{}", "null", usage);
    static const char done[] = "data: [DONE]\n\n";
    if (u < 0 || (size_t)(n + u) + sizeof done > max)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    memcpy(buf + n + u, done, sizeof done - 1);
    return n + u + (ssize_t)sizeof done - 1;
}

/* The error event OpenRouter sends when a call fails mid-stream. */
static ssize_t stream_error(const struct req *r, char *buf, size_t max)
{
    return stream_chunk(r, buf, max, "{\"content\":\"\"}", "\"error\"",
                        ",\"error\":{\"code\":429,\"message\":\"the provider's concurrency cap "
                        "is reached mid-stream\"}");
}

/* The stream ended as planned (completed, or failed with its error event). */
static void stream_end(struct server *sv, struct req *r, bool failed)
{
    pthread_mutex_lock(&sv->lock);
    if (failed)
        sv->total.stream.failed++;
    else
        sv->total.stream.completed++;
    if (r->state == REQ_SERVING)
        finish_service(sv, r); /* HTTP 200 went out: counted there */
    pthread_mutex_unlock(&sv->lock);
    r->stream->over = true;
}

/* The client hung up mid-stream: with --abandoned hold the slot is kept until the stream's
 * planned end. on_completed then counts the cut and gives the slot back. */
static ssize_t stream_cut(struct server *sv, struct req *r)
{
    bool hold = false;
    pthread_mutex_lock(&sv->lock);
    if (r->state == REQ_SERVING && sv->abandoned == ABANDONED_HOLD && !sv->stream.endless) {
        abandon_call(sv, r);
        hold = true;
    }
    pthread_mutex_unlock(&sv->lock);
    if (hold) {
        struct stream quiet = *r->stream;
        quiet.fd = -1; /* only the stop eventfd ends the wait */
        (void)stream_wait(sv, &quiet, r->stream->end_ns);
    }
    mhd_no_on_purpose = true;
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* MHD's content reader for a streamed answer: blocks its connection thread until the next
 * event is due (MHD_USE_THREAD_PER_CONNECTION allows it), then returns that event. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct server *sv = &server;
    struct req *r = cls;
    struct stream *st = r->stream;
    if (st->over)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (!st->began) {
        static const char comment[] = ": sluice-provider-sim processing\n\n";
        st->began = true;
        memcpy(buf, comment, sizeof comment - 1); /* max is STREAM_BLOCK, never less */
        return (ssize_t)sizeof comment - 1;
    }
    enum stream_wake wake = stream_wait(sv, st, st->next_ns);
    if (wake == STREAM_HUNG_UP)
        return stream_cut(sv, r);
    if (wake == STREAM_STOPPING) {
        mhd_no_on_purpose = true;
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    st->next_ns += (int64_t)(sv->stream.token_ms * 1e6);
    if (sv->stream.fail_set && st->sent == sv->stream.fail_after) {
        ssize_t n = stream_error(r, buf, max);
        stream_end(sv, r, true);
        return n;
    }
    if (sv->stream.endless || st->sent < st->tokens) {
        ssize_t n = stream_token(sv, r, buf, max);
        st->sent++;
        pthread_mutex_lock(&sv->lock);
        sv->total.stream.tokens++;
        pthread_mutex_unlock(&sv->lock);
        return n;
    }
    ssize_t n = stream_last(r, buf, max);
    stream_end(sv, r, false);
    return n;
}

/* Answer a streamed call that has its slot: headers and the opening comment at once, then
 * the tokens from stream_read. */
static enum MHD_Result respond_stream(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    struct stream *st = r->stream;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    char model[256];
    request_model(r, model, sizeof model);
    json_t *name = json_string(model);
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    snprintf(st->model_json, sizeof st->model_json, "%s", quoted ? quoted : "\"sluice-sim\"");
    free(quoted);
    json_decref(name);
    pthread_mutex_lock(&sv->lock);
    st->tokens = draw_answer_tokens(sv);
    st->next_ns = r->due_ns;
    st->end_ns = r->due_ns + (int64_t)(sv->stream.token_ms * 1e6) * st->tokens;
    sv->total.stream.started++;
    pthread_mutex_unlock(&sv->lock);
    struct MHD_Response *res =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r, NULL);
    if (!res)
        return MHD_NO;
    enum MHD_Result ok =
        MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    if (ok == MHD_YES)
        ok = MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, 200, res);
    MHD_destroy_response(res);
    return ok;
}

static enum MHD_Result answer_chat(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    int status;
    if (r->too_large) {
        pthread_mutex_lock(&sv->lock);
        sv->total.requests++;
        sv->total.by_status[413]++;
        pthread_mutex_unlock(&sv->lock);
        return respond_json(conn, 413, error_body("request body over 1 MiB", "invalid_request_error",
                                                  "request_too_large"), NULL);
    }
    if (sv->dialect.id != DIALECT_NONE && in_signal_span(sv))
        return answer_signal(sv, conn);
    if (sv->stream.on && !r->stream && request_streams(r)) {
        r->stream = calloc(1, sizeof *r->stream);
        if (!r->stream)
            return MHD_NO;
    }
    status = arrive(sv, r);
    if (status == 0)
        status = wait_for_answer(sv, conn, r);
    if (status < 0) { /* on_completed counts it and frees the slot */
        mhd_no_on_purpose = true;
        return MHD_NO;
    }
    if (sv->dialect.id != DIALECT_NONE && (status == 200 || status == 429))
        return answer_in_dialect(sv, conn, r, status);
    if (status == 429) {
        char ra[64];
        return respond_json(conn, 429,
                            error_body(sv->model.mode == SIM_RATE
                                           ? "the provider's rate limit is reached"
                                           : "the provider's concurrency cap is reached",
                                       "rate_limit_error", "rate_limit_exceeded"),
                            retry_after_value(sv, ra, sizeof ra));
    }
    if (status == 503 && r->queued_ns) /* it was queued: it waited past --queue-timeout */
        return respond_json(conn, 503, error_body("the call waited in the provider's queue past "
                                                  "its timeout", "server_error", "queue_timeout"),
                            NULL);
    if (status == 503)
        return respond_json(conn, 503, error_body("the provider's queue is full", "server_error",
                                                  "overloaded"), NULL);
    if (r->stream)
        return respond_stream(sv, conn, r);
    return respond_json(conn, 200, completion_body(r), NULL);
}

/* ---- stats ----------------------------------------------------------------------- */

/*
 * {"uptime_ms":N, "mode":"reject", "abandoned":"hold", "cap":N, "in_flight":N,
 *  "in_service":N, "lingering":N, "queued":N, "peak_in_flight":N,
 *  "peak_in_service":N, "requests":N, "cancelled":N, "queue_timeouts":N,
 *  "by_status":{"200":N, "429":N, "503":N, ...}}
 * in_service counts the slots taken, lingering calls included: what the cap
 * sees. lingering = calls whose client hung up mid-call but which keep their
 * slot until their service time ends (--abandoned hold); they were counted
 * in cancelled when the client left. in_flight = calls a client still waits
 * on = in_service − lingering + queued. requests counts chat calls that
 * reached the provider: requests = sum(by_status) + cancelled + in_flight
 * (until a reset). queue_timeouts counts the 503s of calls that waited
 * --queue-timeout (they are in by_status["503"] too). by_status always has
 * "200", "429" and "503"; other codes (413) appear once seen.
 * "stream": {"started", "completed", "failed", "cut", "tokens"} counts
 * streamed answers (struct stream_counters); a streamed call is in
 * by_status["200"] once it completed or failed with its error event (its
 * HTTP status was 200), in cancelled when its client hung up.
 */
static json_t *stream_stats_json(const struct stream_counters *c)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I}", "started", (json_int_t)c->started, "completed",
                     (json_int_t)c->completed, "failed", (json_int_t)c->failed, "cut",
                     (json_int_t)c->cut, "tokens", (json_int_t)c->tokens);
}

static json_t *stats_json(struct server *sv)
{
    pthread_mutex_lock(&sv->lock);
    struct counters c = sv->total;
    struct sim_provider m = sv->model;
    uint32_t in_service = sv->in_service, waiting = sv->waiting, lingering = sv->lingering;
    uint32_t flying = in_flight(sv);
    uint32_t peak = sv->peak_in_flight, peak_service = sv->peak_in_service;
    pthread_mutex_unlock(&sv->lock);
    json_t *by = json_object();
    for (unsigned s = 100; s < 600; s++)
        if (c.by_status[s] || s == 200 || s == 429 || s == 503) {
            char key[8];
            snprintf(key, sizeof key, "%u", s);
            json_object_set_new(by, key, json_integer((json_int_t)c.by_status[s]));
        }
    json_t *stats = json_pack("{s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
                     "uptime_ms", (json_int_t)((now_ns() - sv->t0_ns) / 1000000), "mode",
                     sim_mode_name(m.mode), "abandoned",
                     sv->abandoned == ABANDONED_HOLD ? "hold" : "free", "cap", (json_int_t)m.cap,
                     "in_flight", (json_int_t)flying, "in_service", (json_int_t)in_service,
                     "lingering", (json_int_t)lingering, "queued", (json_int_t)waiting,
                     "peak_in_flight", (json_int_t)peak, "peak_in_service", (json_int_t)peak_service,
                     "requests", (json_int_t)c.requests, "cancelled", (json_int_t)c.cancelled,
                     "queue_timeouts", (json_int_t)c.queue_timeouts, "by_status", by);
    json_object_set_new(stats, "stream", stream_stats_json(&c.stream));
    return stats;
}

static void stats_reset(struct server *sv)
{
    pthread_mutex_lock(&sv->lock);
    memset(&sv->total, 0, sizeof sv->total);
    sv->peak_in_flight = sv->peak_in_service = 0;
    note_peaks(sv);
    pthread_mutex_unlock(&sv->lock);
}

/* ---- libmicrohttpd callbacks ------------------------------------------------------ */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    struct server *sv = cls;
    struct req *r = *con_cls;
    if (!r) { /* headers are in; the body (if any) comes in the next calls */
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->wake_fd = -1;
        r->is_chat = !strcmp(url, CHAT_PATH) && !strcmp(method, MHD_HTTP_METHOD_POST);
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (!r->is_chat || r->too_large)
            return MHD_YES;
        if (r->body_len + n > MAX_BODY) {
            r->too_large = true;
            return MHD_YES;
        }
        char *grown = realloc(r->body, r->body_len + n);
        if (!grown)
            return MHD_NO;
        memcpy(grown + r->body_len, upload, n);
        r->body = grown;
        r->body_len += n;
        return MHD_YES;
    }
    if (r->is_chat)
        return answer_chat(sv, conn, r);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!strcmp(url, "/stats") && get)
        return respond_json(conn, 200, stats_json(sv), NULL);
    if (!strcmp(url, "/stats/reset") && post) {
        stats_reset(sv);
        return respond_json(conn, 200, stats_json(sv), NULL);
    }
    if (!strcmp(url, "/stats") || !strcmp(url, "/stats/reset") || !strcmp(url, CHAT_PATH))
        return respond_json(conn, 405, error_body("method not allowed here", "invalid_request_error",
                                                  "method_not_allowed"), NULL);
    return respond_json(conn, 404, error_body("no such endpoint", "invalid_request_error",
                                              "not_found"), NULL);
}

/* Every request ends here, answered or not (MHD_REQUEST_TERMINATED_*): a call
 * that still holds a slot or a FIFO place lost its client (or the server is
 * stopping), so it is counted as cancelled and its place given back. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    struct server *sv = cls;
    struct req *r = *con_cls;
    if (!r)
        return;
    pthread_mutex_lock(&sv->lock);
    if (r->stream && r->state == REQ_SERVING) /* seen between tokens, or by a failed write */
        sv->total.stream.cut++;
    if (r->state == REQ_WAITING || r->state == REQ_SERVING)
        cancel_call(sv, r);
    pthread_mutex_unlock(&sv->lock);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    free(r->body);
    free(r->stream);
    free(r);
    *con_cls = NULL;
}

/* ---- main ------------------------------------------------------------------------ */

static void set_cap(struct server *sv, uint32_t cap, bool quiet)
{
    pthread_mutex_lock(&sv->lock);
    sv->model.cap = cap;
    pump(sv);
    pthread_mutex_unlock(&sv->lock);
    if (!quiet)
        fprintf(stderr, PROG ": t=%.1fs cap -> %" PRIu32 "\n", (double)(now_ns() - sv->t0_ns) / 1e9, cap);
}

static void print_second(struct server *sv, struct counters *last)
{
    pthread_mutex_lock(&sv->lock);
    struct counters c = sv->total;
    uint32_t cap = sv->model.cap, flying = in_flight(sv), waiting = sv->waiting;
    uint32_t lingering = sv->lingering, peak = sv->peak_in_flight;
    pthread_mutex_unlock(&sv->lock);
    if (c.requests < last->requests) /* a reset in between */
        memset(last, 0, sizeof *last);
    fprintf(stderr,
            PROG ": t=%.0fs %s cap=%" PRIu32 " in_flight=%" PRIu32 " queued=%" PRIu32
                 " lingering=%" PRIu32 " peak=%" PRIu32 " | last 1s: 200=%" PRIu64 " 429=%" PRIu64
                 " 503=%" PRIu64 " cancelled=%" PRIu64 " | requests=%" PRIu64 "\n",
            (double)(now_ns() - sv->t0_ns) / 1e9, sim_mode_name(sv->model.mode), cap, flying,
            waiting, lingering, peak, c.by_status[200] - last->by_status[200],
            c.by_status[429] - last->by_status[429], c.by_status[503] - last->by_status[503],
            c.cancelled - last->cancelled, c.requests);
    *last = c;
}

/* Until SIGTERM or SIGINT: apply cap changes when due, print a line a second. */
static void run_until_signal(struct server *sv, const struct options *o, const sigset_t *stop_signals)
{
    struct counters last = {0};
    int64_t next_tick = sv->t0_ns + NS_PER_S;
    size_t next_change = 0;
    for (;;) {
        int64_t now = now_ns();
        while (next_change < o->n_changes && sv->t0_ns + o->changes[next_change].at_ns <= now)
            set_cap(sv, o->changes[next_change++].cap, o->quiet);
        if (next_tick <= now) {
            if (!o->quiet)
                print_second(sv, &last);
            while (next_tick <= now)
                next_tick += NS_PER_S;
        }
        int64_t wake = next_tick;
        if (next_change < o->n_changes && sv->t0_ns + o->changes[next_change].at_ns < wake)
            wake = sv->t0_ns + o->changes[next_change].at_ns;
        int64_t left = wake > now ? wake - now : 0;
        struct timespec ts = {(time_t)(left / NS_PER_S), (long)(left % NS_PER_S)};
        int sig = sigtimedwait(stop_signals, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT)
            return;
    }
}

/* Room for CONNECTION_LIMIT sockets plus the wake eventfds of queued calls. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max < 4 * CONNECTION_LIMIT ? rl.rlim_max : 4 * CONNECTION_LIMIT;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    struct options o;
    parse_options(argc, argv, &o);
    struct server *sv = &server;
    sv->model = o.model;
    sv->retry_after_date = o.retry_after_date;
    sv->abandoned = o.abandoned;
    sv->dialect = o.dialect;
    sv->stream = o.stream;
    if (sv->model.mode == SIM_RATE) {
        sv->rate.slots = sim_rate_slots(&sv->model);
        sv->rate.t = calloc(sv->rate.slots, sizeof *sv->rate.t);
        if (!sv->rate.t) {
            fprintf(stderr, PROG ": cannot allocate the rate window (%u calls)\n", sv->rate.slots);
            return 1;
        }
    }
    sim_rng_seed(&sv->rng, o.seed);
    sv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sv->stop_fd < 0) {
        fprintf(stderr, PROG ": eventfd: %s\n", strerror(errno));
        return 1;
    }
    raise_fd_limit();

    /* Every thread inherits this mask, so only sigtimedwait in main sees the
     * stop signals. SIG_DFL first: an inherited SIG_IGN would discard them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(o.port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (!o.quiet)
        flags |= MHD_USE_ERROR_LOG;
    sv->t0_ns = now_ns();
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, o.port, NULL, NULL, on_request, sv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv,
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)CONNECTION_LIMIT, MHD_OPTION_THREAD_STACK_SIZE, (size_t)THREAD_STACK,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, PROG ": cannot listen on 127.0.0.1:%u (is --port free?)\n", o.port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("%u\n", info ? info->port : o.port);
    fflush(stdout);
    if (!o.quiet)
        fprintf(stderr, PROG ": listening on 127.0.0.1:%u, mode %s, cap %" PRIu32 "\n",
                info ? info->port : o.port, sim_mode_name(o.model.mode), o.model.cap);

    run_until_signal(sv, &o, &stop_signals);

    /* Stop: new calls are refused, waiting ones wake through stop_fd and
     * return MHD_NO, and MHD closes the rest. SIGALRM (not blocked) bounds it. */
    alarm(STOP_BOUND_S);
    pthread_mutex_lock(&sv->lock);
    sv->stopping = true;
    pthread_mutex_unlock(&sv->lock);
    (void)eventfd_write(sv->stop_fd, 1);
    MHD_stop_daemon(d);
    close(sv->stop_fd);
    return 0;
}
