/*
 * sluice/curl.h — the libcurl transport: model calls that stay under each
 * provider's concurrency cap and teach ceiling discovery from live traffic.
 *
 * What it is: three ways to send an HTTP request (a libcurl easy handle the
 * caller set up) through a backend's pool (sluice/pool.h):
 *
 *   sluice_curl_perform    blocking, on the calling thread: admit, wait for
 *                          a permit (FIFO, deadline and token honoured),
 *                          transfer, classify, feed discovery, release;
 *   sluice_curl_loop       an event-loop driver over curl_multi: any thread
 *                          submits, one loop thread (its own, or the
 *                          embedder's epoll/libuv/libevent loop) runs every
 *                          transfer; permits come through the pool's async
 *                          path, so the loop never blocks on one;
 *   sluice_curl_classify   the one function that turns a response into what
 *                          it says about the provider's capacity; both paths
 *                          above use it, and tests and fuzzers call it
 *                          directly, without a socket.
 * The built-in chat-completions client for sluice_run is in sluice/client.h.
 *
 * Classification (sluice_curl_classify), the rule every path shares, is
 * one map: SLUICE_CURL_KIND_MAP below gives each kind of response the
 * HTTP statuses that make it, what its body or budgets must say, and the
 * sample it gives discovery. Look there for how a 429 is classified.
 * Non-2xx responses are the caller's to handle: the call returns SLUICE_OK
 * (the HTTP exchange completed) and result.http_status / result.kind say
 * what came back, as curl_easy_perform returns CURLE_OK for a 404.
 *
 * Retry-After: the header's delay-seconds or HTTP-date (parsed like
 * CURLINFO_RETRY_AFTER, which the transfers read), or the more precise
 * `retry-after-ms` when present and valid; clamped to [0, retry_after_max_ns]
 * (garbage, negative values and past dates are 0 = none; overflowing
 * values are the maximum). Discovery clamps once more to the backend's
 * configured discovery retry_after_max_ns when it applies the hold. A
 * body's retry hint (OpenRouter's error.metadata.retry_after_seconds,
 * Gemini's RetryInfo retryDelay) stands in for a missing header.
 *
 * Dialects: each provider family states its budgets in its own headers;
 * sluice_curl_response.dialect (per backend: sluice_curl_call.dialect,
 * sluice_curl_request.dialect) picks the row that reads them into the
 * normalised result.ratelimit (requests and tokens: limit, remaining,
 * reset, the window they apply to, and the dialect that filled them).
 * AUTO detects a family from headers only it sends (anthropic-ratelimit-*,
 * Together's x-ratelimit-limit-dynamic or x-tokenlimit-*, Mistral's
 * x-ratelimitbysize-*, the IETF RateLimit / RateLimit-Policy fields, a
 * Gemini error body), else reads the shared x-ratelimit-* names as GENERIC,
 * whose window is unknown: OpenAI, Azure, Groq and OpenRouter send the
 * same names with different windows (Groq's request limit is per day), so
 * only the explicit dialect says which. Bodies are read only for error
 * responses (status >= 400) and only their first SLUICE_CURL_BODY_MAX
 * bytes; token budgets are reported, never enforced.
 *
 * Latency: discovery gets the time to first byte, because a streamed
 * answer's total time measures its length, not queueing; a call without a
 * first byte reports its total time. Which byte: for a call that declares
 * its `write` callback (so the transport sees the body go by), the moment
 * the answer began, as `begun` says (default: the first body byte), timed
 * from the transfer's start; a call cut before then reports none (its
 * signal was never seen). Without `write`, the response's first byte
 * (CURLINFO_STARTTRANSFER_TIME_T): its headers. Why: a server that streams
 * sends its headers at once and its first token after its own queue and
 * prefill (vLLM and any server built on Starlette's StreamingResponse,
 * sluice-provider-sim --stream); timed at the headers, every call read
 * about 2 ms and discovery never saw that queue (sluice-proxy, whose
 * `begun` is an SSE `data:` line, measured 1.6 ms where the first token
 * came after 300 ms, and its start-deadline rules then refused every
 * call that had to wait at all). Queue wait (admission to permit, any
 * Retry-After hold included) is result.queued_ns.
 *
 * What the transport does to the caller's easy handle:
 *   - with a deadline, CURLOPT_TIMEOUT_MS is set to the time left when the
 *     transfer starts, and back to 0 afterwards (without one, the caller's
 *     own CURLOPT_TIMEOUT_MS is left alone and acts as the provider
 *     timeout: its expiry after the request was sent is PROVIDER_TIMEOUT);
 *   - the blocking path installs its own CURLOPT_XFERINFOFUNCTION (the
 *     cancel check) for the call and chains the caller's one, declared in
 *     sluice_curl_call.xferinfo (libcurl cannot read an option back), and
 *     afterwards leaves the caller's function installed (or none, with
 *     CURLOPT_NOPROGRESS back on);
 *   - the loop sets CURLOPT_PRIVATE while it owns the handle and puts the
 *     caller's value back before the completion callback.
 * libcurl must be initialised (curl_global_init) before any of this.
 *
 * Progress: sluice_curl_classify is pure and allocation-free.
 * sluice_curl_perform blocks (the pool's permit wait, then the transfer).
 * sluice_curl_loop_submit and _cancel never block: an admission CAS, two
 * ring operations and at most one wake-up syscall per burst; all waiting
 * happens on the loop thread, which itself never waits for a permit.
 *
 * Concurrency: sluice_curl_perform may run on any number of threads at
 * once (an easy handle on one at a time, as libcurl requires). A loop takes
 * submit, cancel and stats from any thread; each function says which thread
 * the rest need.
 *
 * Memory ordering: everything a thread wrote before sluice_curl_loop_submit
 * returned SLUICE_OK happens-before the request's `done` (the core ring's
 * release/acquire hand-off), and everything `done` writes happens-before a
 * later submit that reuses the handle only by the caller's own means (the
 * loop publishes nothing back to submitters). Permits carry the pool's
 * ordering (sluice/pool.h).
 */
#ifndef SLUICE_CURL_H
#define SLUICE_CURL_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <sluice/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- classification -------------------------------------------------------- */

/*
 * The classification rule: X(NAME, "name", OUTCOME, statuses), one row per
 * kind, statuses written HTTP(lo, hi) (inclusive ranges of the final
 * status; none for a kind no status alone makes). It generates the enum,
 * sluice_curl_kind_name, sluice_curl_kind_outcome (OUTCOME names the
 * sample discovery gets, SLUICE_OUTCOME_<OUTCOME>) and the status step of
 * sluice_curl_classify. How classify applies it, in order:
 *   1. the transfer: CURLE_OPERATION_TIMEDOUT once the request was sent is
 *      PROVIDER_TIMEOUT; any other CURLcode but CURLE_OK is TRANSPORT;
 *   2. the status: the first row, in map order, whose ranges hold it (so
 *      the single statuses come before the 4xx and 5xx catch-alls); none
 *      is UNEXPECTED;
 *   3. a refusal (OVERLOADED or PLATFORM_OVERLOAD from step 2) is heard out:
 *      its body says QUOTA, else PLATFORM_OVERLOAD, else (a 429 only) its
 *      budgets say RATE_LIMITED, each as its row's comment says; else it
 *      stays as step 2 made it.
 * ABORTED is the transports' own: the caller's deadline or cancel ended it.
 */
#define SLUICE_CURL_KIND_MAP(X, HTTP)                                                              \
    /* Latency = time to first byte. A spent request budget with its reset named                   \
     * (remaining 0) paces: hold_ns until the reset, instead of a refusal. */                      \
    X(SUCCESS, "success", OK, HTTP(200, 299))                                                      \
    /* Any other 429 or 503: the caller's concurrency cap; Retry-After is the hold. */             \
    X(OVERLOADED, "overloaded", OVERLOAD, HTTP(429, 429) HTTP(503, 503))                           \
    /* A 429 that names a spent budget (requests or tokens remaining 0) with its reset, or         \
     * Gemini's RESOURCE_EXHAUSTED with a RetryInfo delay: hold until the reset (the later of      \
     * it and Retry-After), no cut. A reset already past when the answer is read is still this     \
     * kind (the budget refused the call, not the cap), holding only for Retry-After. */           \
    X(RATE_LIMITED, "rate_limited", RATE, )                                                        \
    /* 529; or a 429/503 with Anthropic's overloaded_error in its body; or a 503 from a            \
     * dialect whose 503 is the platform's (Together at or below its dynamic rate, Gemini's        \
     * UNAVAILABLE): a short hold, never a cut. */                                                 \
    X(PLATFORM_OVERLOAD, "platform_overload", PLATFORM, HTTP(529, 529))                            \
    /* 402; or a 429/503/529 whose body says quota or billing (insufficient_quota, Gemini's        \
     * "limit: 0" on RESOURCE_EXHAUSTED): waiting will not help, nothing moves, no hold. */        \
    X(QUOTA, "quota", QUOTA, HTTP(402, 402))                                                       \
    /* 504, or step 1's timeout: the provider (or its gateway) took the call and did not           \
     * answer in time. */                                                                          \
    X(PROVIDER_TIMEOUT, "provider_timeout", OVERLOAD, HTTP(504, 504))                              \
    /* The provider refused the request itself (bad input, auth, quota, not found) and             \
     * ran no inference, so its latency would read as a fast provider and hide a knee. */          \
    X(CLIENT_ERROR, "client_error", IGNORE, HTTP(400, 499))                                        \
    /* The provider is broken, not full: backing off would not help. */                            \
    X(SERVER_ERROR, "server_error", IGNORE, HTTP(500, 599))                                        \
    /* A 1xx/3xx final status, or none with CURLE_OK. */                                           \
    X(UNEXPECTED, "unexpected", IGNORE, )                                                          \
    /* No response (refused, DNS, TLS, reset, a timeout before the request left): says             \
     * nothing about the provider's cap. */                                                        \
    X(TRANSPORT, "transport", IGNORE, )                                                            \
    /* The caller gave up; a deadline counts the time spent queueing, so it says nothing           \
     * about how long the provider takes. */                                                       \
    X(ABORTED, "aborted", IGNORE, )

enum sluice_curl_kind {
#define SLUICE__CURL_KIND_ENUM(name, str, outcome, statuses) SLUICE_CURL_##name,
    SLUICE_CURL_KIND_MAP(SLUICE__CURL_KIND_ENUM, ) /* the statuses column unused */
#undef SLUICE__CURL_KIND_ENUM
};

/* The sample a kind gives discovery (the map's OUTCOME column). */
enum sluice_outcome sluice_curl_kind_outcome(enum sluice_curl_kind kind);

/* X(NAME, "name"): the provider families whose rate-limit dialect classify reads. */
#define SLUICE_CURL_DIALECT_MAP(X)                                                                 \
    X(AUTO, "auto")             /* detect from the response (default) */                           \
    X(GENERIC, "generic")       /* x-ratelimit-* without a known window */                         \
    X(OPENAI, "openai")         /* x-ratelimit-{limit,remaining,reset}-{requests,tokens}, per minute \
                                 */                                                                \
    X(AZURE, "azure")           /* OpenAI's names (remaining only, -1 = none), retry-after-ms */   \
    X(ANTHROPIC, "anthropic")   /* anthropic-ratelimit-*, RFC 3339 resets, 529 overloaded */       \
    X(OPENROUTER, "openrouter") /* X-RateLimit-* (reset in epoch ms), 402, body retry hint */      \
    X(TOGETHER, "together")     /* x-ratelimit-* per second, x-tokenlimit-*, 503 = platform */     \
    X(GROQ, "groq")             /* OpenAI's names; requests per day, tokens per minute */          \
    X(MISTRAL, "mistral")       /* x-ratelimitbysize-{limit,remaining}-minute (tokens) */          \
    X(GEMINI, "gemini")         /* no headers: RESOURCE_EXHAUSTED / UNAVAILABLE bodies */          \
    X(IETF, "ietf")             /* RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit) */

enum sluice_curl_dialect {
#define SLUICE__CURL_DIALECT_ENUM(name, str) SLUICE_CURL_DIALECT_##name,
    SLUICE_CURL_DIALECT_MAP(SLUICE__CURL_DIALECT_ENUM)
#undef SLUICE__CURL_DIALECT_ENUM
};

/* "anthropic"; never NULL ("unknown" for a value outside the map). */
const char *sluice_curl_dialect_name(enum sluice_curl_dialect dialect);

/* The dialect named `name` (as sluice_curl_dialect_name spells it). Returns SLUICE_OK, or
 * SLUICE_EINVAL for a name outside the map (*out untouched). */
int sluice_curl_dialect_parse(const char *name, enum sluice_curl_dialect *out);

/* X(NAME, "name", seconds): the window a stated budget applies to. */
#define SLUICE_CURL_WINDOW_MAP(X)                                                                  \
    X(UNKNOWN, "unknown", 0)                                                                       \
    X(SECOND, "second", 1)                                                                         \
    X(MINUTE, "minute", 60)                                                                        \
    X(DAY, "day", 86400)

enum sluice_curl_window {
#define SLUICE__CURL_WINDOW_ENUM(name, str, seconds) SLUICE_CURL_WINDOW_##name,
    SLUICE_CURL_WINDOW_MAP(SLUICE__CURL_WINDOW_ENUM)
#undef SLUICE__CURL_WINDOW_ENUM
};

/* "minute"; never NULL. */
const char *sluice_curl_window_name(enum sluice_curl_window window);

/* The window's length in seconds; 0 for UNKNOWN (and a value outside the map). */
int64_t sluice_curl_window_seconds(enum sluice_curl_window window);

/* Bytes of an error body classify reads, at most. */
#define SLUICE_CURL_BODY_MAX 4096

/* "provider_timeout"; never NULL. */
const char *sluice_curl_kind_name(enum sluice_curl_kind kind);

/* The Retry-After clamp when the caller gives none: discovery's default maximum. */
#define SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS (INT64_C(60) * 1000000000)

/* One budget as the provider stated it; -1 = not stated (or unparseable, or negative as
 * Azure's "-1"). Which header fills which field is the dialect's row in curl.c. */
struct sluice_curl_budget {
    int64_t limit;       /* the budget per window */
    int64_t remaining;   /* what is left of it now */
    int64_t reset_ns;    /* time from the response until it refills (durations "6m0s", "20ms";
                            epoch ms or s, RFC 3339 times and HTTP-dates minus now) */
    int64_t reset_at_ms; /* the same instant on the wall clock, ms since the Unix epoch */
    enum sluice_curl_window window; /* what `limit` is per, as the dialect documents it */
};

/* Every budget the response stated, normalised across dialects. */
struct sluice_curl_ratelimit {
    enum sluice_curl_dialect source; /* the dialect that read them (AUTO = none stated) */
    struct sluice_curl_budget requests, tokens;
};

/* One response header (NUL-terminated name and value, as curl_easy_nextheader gives them). */
struct sluice_curl_header {
    const char *name;
    const char *value;
};

/* What a finished transfer looked like: the input of sluice_curl_classify. */
struct sluice_curl_response {
    long http_status;      /* CURLINFO_RESPONSE_CODE of the last response (0 = none) */
    CURLcode code;         /* the transfer's result */
    bool request_sent;     /* the request left (CURLINFO_REQUEST_SIZE > 0): decides whether
                              a timeout is the provider's */
    int64_t retry_after_s; /* CURLINFO_RETRY_AFTER when a Retry-After header came (its
                              seconds, or its HTTP-date minus now); < 0 = not read: the
                              header in `headers` is parsed instead (default for tests) */
    const struct sluice_curl_header *headers; /* may be NULL when n_headers is 0 */
    size_t n_headers;
    int64_t now_s;              /* wall clock (Unix seconds) for HTTP-dates and epoch resets
                                   (default: 0 = time(NULL)) */
    int64_t retry_after_max_ns; /* clamp for Retry-After (default: 0 =
                                   SLUICE_CURL_RETRY_AFTER_MAX_DEFAULT_NS) */
    enum sluice_curl_dialect dialect; /* whose headers these are (default: AUTO = detect) */
    const char *body;  /* the response body, read only when http_status >= 400 and only its
                          first SLUICE_CURL_BODY_MAX bytes; need not be NUL-terminated
                          (default: NULL = none) */
    size_t body_len;
};

/* Bytes of sluice_curl_result.error, NUL included (a longer message is cut). */
#define SLUICE_CURL_ERROR_MAX 160

/* What a call returned; the same struct for the blocking call and the loop. */
struct sluice_curl_result {
    int status;                  /* what the call returned (see sluice_curl_perform) */
    enum sluice_curl_kind kind;  /* the response's class (SLUICE_CURL_KIND_MAP) */
    enum sluice_outcome outcome; /* the sample discovery got for it */
    long http_status;            /* 0 = no HTTP response */
    CURLcode curl_code;          /* the transfer's result (CURLE_OK when it never ran) */
    int64_t retry_after_ns;      /* the provider's Retry-After (or its body's retry hint),
                                    clamped; 0 = none */
    int64_t hold_ns;             /* the hold this response asks of discovery (the sample's
                                    retry_after_ns), clamped: Retry-After on OVERLOADED and
                                    PLATFORM_OVERLOAD, the later of it and the spent budget's
                                    reset on RATE_LIMITED, the spent request budget's reset on
                                    SUCCESS; 0 = none */
    struct sluice_curl_ratelimit ratelimit;
    int64_t latency_ns;          /* time to first byte (total time without one); 0 = no
                                    transfer */
    int64_t transfer_ns;         /* the whole transfer (CURLINFO_TOTAL_TIME_T) */
    int64_t queued_ns;           /* admission to permit, Retry-After hold included */
    uint32_t in_flight_at_start; /* calls in flight on the backend once this one started */
    bool transferred;            /* the transfer was started (a permit was used) */
    bool abandoned;              /* the caller's deadline or token ended the transfer after
                                    the request was sent (or the caller stopped it itself,
                                    as the chat client stops a stream at its reply cap): the
                                    provider may still be running it, so the call ends
                                    through sluice_pool_call_abandon (counted as a timeout,
                                    else a cancel; its permit may linger) */
    bool refused_late;           /* SLUICE_ETIMEDOUT before any transfer: it could no longer
                                    start in time (sluice/pool_deadlines.h) */
    enum sluice_expiry expired;  /* with SLUICE_ETIMEDOUT: which deadline ended the call
                                    (SLUICE_EXPIRED_START: it had not begun, or no first byte
                                    came, in time; SLUICE_EXPIRED_CALL: the whole call); with
                                    SLUICE_ELATE: which one the predicted wait leaves too
                                    little of */
    char error[SLUICE_CURL_ERROR_MAX]; /* when sluice itself refused or ended the call
                                          (an argument's SLUICE_EINVAL, SLUICE_ELATE, the chat
                                          client's reply cap): why, naming what to fix; ""
                                          otherwise (libcurl's own failures are in
                                          curl_code) */
};

/*
 * Classify one response (SLUICE_CURL_KIND_MAP) into out->kind, out->outcome,
 * out->http_status, out->curl_code, out->retry_after_ns, out->hold_ns and out->ratelimit;
 * the other fields of *out are left alone. Returns out->kind. Pure: no
 * I/O, no allocation, any input is safe (headers with NULL names or values
 * are skipped).
 */
enum sluice_curl_kind sluice_curl_classify(const struct sluice_curl_response *resp,
                                           struct sluice_curl_result *out);

/*
 * The request rate a successful response states, in calls per second: its
 * request limit over its window; 0 when there is none to give: not a
 * SUCCESS, no request limit, or a window that is not a second or a minute
 * (a per-day budget says nothing about how many calls may run at once).
 * The transports offer it to the backend's discovery
 * (sluice_discovery_hint_rate), which starts from rate × the measured
 * latency (Little's law) and lets a lock or a refusal's bracket win. Pure.
 */
double sluice_curl_stated_rate(const struct sluice_curl_result *res);

/*
 * What one event of a 2xx server-sent-event answer says about the call,
 * for whoever reads the stream (the chat client, sluice-proxy): `data` is
 * the event's data (sluice_sse_event.data), `len` its bytes. A provider
 * that fails a call mid-stream cannot change the status line it sent, so
 * it sends an error event: data that is a JSON object holding an "error"
 * object (OpenAI's and OpenRouter's chunks, Anthropic's `event: error`,
 * Gemini's), or a chunk whose choices[0].finish_reason is "error". Such an
 * event is classified as the error response it stands for, by
 * SLUICE_CURL_KIND_MAP with the data as its body: the status is the one
 * its error.code names (a number or a numeric string, 400 to 599), else
 * the one its error.type or error.code names (rate_limit_exceeded,
 * rate_limit_error: 429; overloaded_error: 529; insufficient_quota: 429);
 * an error that names neither is SERVER_ERROR (the provider failed the
 * call). So a rate-limit event backs discovery off as a 429 would, an
 * Anthropic overloaded_error is PLATFORM_OVERLOAD, insufficient_quota is
 * QUOTA.
 * Returns true for an error event, with *out as sluice_curl_classify
 * fills it (out->http_status: the status the event stands for, 0 when
 * none; a caller keeps its response's own) and out->error quoting the
 * event; false for any other event (a chunk, [DONE], data that is not
 * JSON), with *out untouched. `dialect` is the backend's (default: AUTO).
 * Data without the string "error" is not parsed, so a caller may hand it
 * every event of a stream. Any input is safe; it allocates (jansson) only
 * for data that holds "error".
 */
bool sluice_curl_classify_event(const char *data, size_t len, enum sluice_curl_dialect dialect,
                                struct sluice_curl_result *out);

/* ---- the blocking call ------------------------------------------------------- */

/* Everything a call takes besides the engine; zero = default throughout. Read during the
 * call only: nothing it points at is kept once the call returns. */
struct sluice_curl_call {
    const char *backend;             /* backend ID (default: NULL = endpoint-only, unlimited) */
    CURL *easy;                      /* the request, fully set up (required) */
    const struct timespec *deadline; /* absolute CLOCK_MONOTONIC for the whole call: the permit
                                        wait, then the transfer (default: NULL = none) */
    const struct timespec *start_deadline; /* the call must have begun by then: the permit wait,
                                        then the transfer until the response's first byte (a
                                        stream's first token; for an answer that is not
                                        streamed, the whole answer's first byte). A call that
                                        misses it ends with SLUICE_ETIMEDOUT and expired ==
                                        SLUICE_EXPIRED_START, and is refused at admission with
                                        SLUICE_ELATE when the queue predicts it cannot make it
                                        (default: NULL = none) */
    bool (*begun)(void *begun_data); /* whether the answer has begun, for a caller whose first
                                        byte is not its first token (a provider that sends
                                        headers and an SSE comment at once): what
                                        start_deadline waits for, and, with `write`, where the
                                        latency sample ends (see "Latency" above); read on the
                                        transfer's thread until it returns true (default:
                                        NULL = the response's first body byte) */
    void *begun_data;
    struct sluice_cancel *cancel;    /* ends the wait or aborts the transfer (default: none) */
    curl_xferinfo_callback xferinfo; /* the caller's progress callback, chained by the blocking
                                        path; a non-zero return aborts as ECANCELED (default:
                                        none) */
    void *xferinfo_data;             /* its clientp */
    int64_t retry_after_max_ns;      /* Retry-After clamp (default: 60 s) */
    enum sluice_curl_dialect dialect; /* the backend's rate-limit dialect (default: AUTO) */
    curl_write_callback write;       /* the caller's CURLOPT_WRITEFUNCTION, declared so the
                                        blocking path can read an error body (its first
                                        SLUICE_CURL_BODY_MAX bytes, for classify) on the way:
                                        it installs its own for the call, chains this one with
                                        every byte, and puts it back afterwards (default: NULL =
                                        the caller's write function is left alone and error
                                        bodies are not read) */
    void *write_data;                /* its CURLOPT_WRITEDATA */
};

/*
 * Send the request on `easy` through backend `backend_id`'s pool and wait
 * for it:
 *   1. admit (at once: refused when the pool is full, closed, or refuses
 *      early; the transfer never starts);
 *   2. take a permit (FIFO; deadline and token honoured; a provider's
 *      Retry-After hold is waited out);
 *   3. transfer, on a curl_multi private to the calling thread (kept
 *      between calls, so connections are reused), woken by the token at
 *      once: a token that fires mid-transfer aborts it through the
 *      xferinfo callback within milliseconds;
 *   4. classify and feed the sample to discovery (sluice_pool_call_end);
 *   5. give the permit and the admission back, on every path.
 * Returns (also in result->status; result may be NULL) one of these, and
 * no other (tests/e2e/curl_paths.c drives each call into each and checks
 * this list):
 *   SLUICE_OK         a response came back, whatever its HTTP status;
 *   SLUICE_EIO        the transfer failed (result->curl_code; result->kind is
 *                     TRANSPORT or PROVIDER_TIMEOUT);
 *   SLUICE_ETIMEDOUT  the deadline passed, waiting or transferring
 *                     (result->error says which, when no transfer started);
 *   SLUICE_ECANCELED  the token fired (or the chained xferinfo aborted);
 *   SLUICE_ECAPACITY  not admitted: the pool is full (nothing else happened);
 *   SLUICE_ELATE      not admitted: the predicted wait leaves too little
 *                     of the (start) deadline (unless the backend sets
 *                     sluice_deadline_desc.queue_late); result->expired
 *                     and result->error say which;
 *   SLUICE_ECLOSED    not admitted: the pool is closed;
 *   SLUICE_EINVAL     unknown backend, no easy handle, a deadline that is
 *                     not normalised or more than a year ahead (not
 *                     CLOCK_MONOTONIC) (all before admission, with
 *                     result->error naming what to fix), or an easy handle
 *                     already in use by another multi handle;
 *   SLUICE_ENOMEM     libcurl could not allocate.
 */
int sluice_curl_perform(const struct sluice_engine *engine, const char *backend_id, CURL *easy,
                        const struct timespec *deadline, struct sluice_cancel *cancel,
                        struct sluice_curl_result *result);

/* sluice_curl_perform with every option (chained xferinfo, Retry-After clamp, dialect, the
 * error body). Returns as sluice_curl_perform: SLUICE_OK, SLUICE_EIO, SLUICE_ETIMEDOUT,
 * SLUICE_ECANCELED, SLUICE_ECAPACITY, SLUICE_ELATE, SLUICE_ECLOSED, SLUICE_EINVAL or
 * SLUICE_ENOMEM. */
int sluice_curl_perform_call(const struct sluice_engine *engine,
                             const struct sluice_curl_call *call,
                             struct sluice_curl_result *result);

/*
 * Only the transfer and its classification, for a caller that already holds
 * a permit (the built-in client runs inside sluice_run's permit): step 3 and
 * the classification of step 4, with call->backend ignored. Fills
 * result->kind, outcome, retry_after_ns... for the caller to report.
 * Returns as sluice_curl_perform, less what admission refuses: SLUICE_OK,
 * SLUICE_EIO, SLUICE_ETIMEDOUT, SLUICE_ECANCELED, SLUICE_EINVAL or
 * SLUICE_ENOMEM.
 */
int sluice_curl_transfer(const struct sluice_curl_call *call, struct sluice_curl_result *result);

/* ---- the event-loop driver ---------------------------------------------------- */

struct sluice_curl_loop;

/*
 * A request's completion: runs exactly once per accepted submission, on the
 * loop thread, with the same result as sluice_curl_perform. The easy
 * handle is the caller's again (its CURLOPT_PRIVATE restored); `result` is
 * valid only during the call.
 * Statuses (result->status), and no other: SLUICE_OK, SLUICE_EIO,
 * SLUICE_ETIMEDOUT and SLUICE_ECANCELED as sluice_curl_perform;
 * SLUICE_ECLOSED (the loop shut down first); SLUICE_EINVAL (a deadline not
 * normalised or not CLOCK_MONOTONIC, result->error says which; or libcurl
 * refused the handle); SLUICE_ENOMEM (libcurl could not allocate).
 * Admission's refusals are submit's return, never a completion.
 */
typedef void (*sluice_curl_done_fn)(const struct sluice_curl_result *result, CURL *easy,
                                    void *data);
/* The caller's answer at its deadline while the loop reads the answer on (see
 * sluice_curl_request.cut): on the loop thread; `result` is valid only during the call. */
typedef void (*sluice_curl_cut_fn)(const struct sluice_curl_result *result, void *data);

/*
 * A submission. Lifetimes: submit copies the struct, the deadline's value
 * and nothing else it points at; what the loop keeps a pointer to past
 * submit is marked "kept" below.
 */
struct sluice_curl_request {
    const char *backend;             /* backend ID, read during submit only (default: NULL =
                                        endpoint-only, unlimited) */
    CURL *easy;                      /* required; kept: the loop's until `done` runs, and
                                        everything the handle points at (URL, headers, body,
                                        the write callback's data) must live that long */
    const struct timespec *deadline; /* whole call, as for sluice_curl_perform; its value is
                                        copied at submit, so the timespec may be reused or
                                        freed once submit returns (default: none) */
    const struct timespec *start_deadline; /* as sluice_curl_call.start_deadline; copied at
                                              submit (default: none) */
    bool (*begun)(void *data);       /* as sluice_curl_call.begun (the start deadline's, and
                                        with `write` the latency sample's end), called with
                                        `data` on the loop thread (default: NULL = the first
                                        body byte) */
    struct sluice_cancel *cancel;    /* cancels at any stage; kept: must outlive the request
                                        (until `done` has returned) (default: none) */
    sluice_curl_done_fn done;        /* required */
    void *data;                      /* passed to done and finish; kept as an opaque value,
                                        never read */
    int64_t retry_after_max_ns;      /* Retry-After clamp (default: 60 s) */
    enum sluice_curl_dialect dialect; /* the backend's rate-limit dialect (default: AUTO) */
    curl_write_callback write;       /* the caller's CURLOPT_WRITEFUNCTION, declared so the loop
                                        reads an error body for classify as the blocking path
                                        does (sluice_curl_call.write): installed for the
                                        transfer, this one chained with every byte, put back
                                        before `finish` (default: NULL = the caller's write
                                        function is left alone and error bodies are not read,
                                        so a 429 insufficient_quota reads as OVERLOADED) */
    void *write_data;                /* its CURLOPT_WRITEDATA */
    /* After a transfer, on the loop thread, before discovery gets its sample and before `done`:
     * the caller's reading of the body may correct *result (kind, outcome, retry_after_ns,
     * latency_ns, status, error), e.g. a streamed answer's time to first token, or an error
     * event that came mid-stream. Not called for a request that never transferred
     * (default: NULL = the classification stands). */
    void (*finish)(void *data, CURL *easy, struct sluice_curl_result *result);
    /* Answer at the deadline, read on (default: NULL = a transfer still running at `deadline`
     * is cut there, and its permit lingers as the pool decides). With `cut`, and `write`
     * declared (the loop must stand in front of it; submit refuses `cut` alone with
     * SLUICE_EINVAL), a transfer still running at `deadline` whose pool would keep its permit
     * anyway (sluice_pool_call_read_on: a provider that keeps working on a call its client
     * gave up on) is answered there through cut(result, data), with the result `done` would
     * have had (SLUICE_ETIMEDOUT, expired SLUICE_EXPIRED_CALL; `finish` sees it first). Then
     * the loop reads the answer on and drops it: `write`, `begun` and `finish` are not called
     * again (the handle's other callbacks, a header or progress function, still are). The
     * call ends when the answer does, with its permit coming back then and discovery seeing
     * the whole call, not a censored one (an answer still coming is one the provider still
     * runs, so it is read on past any estimate); one still running linger_max_ms after its
     * start is cut after all. `done` follows, exactly once as always, with how the transfer
     * ended; the handle, `data` and the token are the loop's until then (a cancel still stops
     * the reading). Where the pool would not keep the permit (lingering off, a LEARNED trial)
     * the transfer is cut at `deadline` and `cut` is not called. Why: a permit kept for an
     * estimate cannot tell the calls the provider still runs from those it has finished
     * (bench/RESULTS.md, the censored and read_on rows). */
    sluice_curl_cut_fn cut;
};

/* Embedder's-loop mode: watch `fd` for `what` (CURL_POLL_IN, _OUT, _INOUT; CURL_POLL_REMOVE
 * = stop watching it). The loop's own wake-up descriptor comes through here too.
 * `*socketp` is this socket's own pointer, as curl_multi_assign keeps one: NULL the first time
 * a descriptor is watched; what the callback stores there comes back in every later call for
 * that descriptor, CURL_POLL_REMOVE included, after which it is forgotten (free what it points
 * at there). So an embedder keeps its per-socket watcher (a uv_poll_t, a struct event) here,
 * with no table from descriptors to watchers. Runs on the loop's thread, inside
 * sluice_curl_loop_create, _action and _destroy. */
typedef void (*sluice_curl_watch_fn)(void *ctx, curl_socket_t fd, int what, void **socketp);
/* Embedder's-loop mode: call sluice_curl_loop_action(loop, CURL_SOCKET_TIMEOUT, 0) in
 * `timeout_ms` (0 = as soon as possible; -1 = no timer needed). Replaces any earlier timer.
 * Runs on the loop's thread: inside sluice_curl_loop_create's caller's later calls (_action,
 * _close, _destroy), and inside a submit or cancel made on that thread between actions, which
 * asks for 0 ms rather than writing the wake-up descriptor (so have the timer ready before the
 * first submit, as every example does). */
typedef void (*sluice_curl_timer_fn)(void *ctx, long timeout_ms);

#define SLUICE_CURL_LOOP_REQUESTS_DEFAULT UINT32_C(4096)
#define SLUICE_CURL_LOOP_REQUESTS_MAX (UINT32_C(1) << 20)

struct sluice_curl_loop_desc {
    const struct sluice_engine *engine; /* required; must outlive the loop */
    uint32_t max_requests;              /* requests accepted and not yet completed, all backends
                                           (default: 4096; at most SLUICE_CURL_LOOP_REQUESTS_MAX);
                                           submissions past it get SLUICE_EAGAIN */
    /* Embedder's-loop mode: set both (default: NULL = the loop runs its own thread). */
    sluice_curl_watch_fn watch;
    sluice_curl_timer_fn timer;
    void *ctx; /* passed to watch and timer */
    /* Connection caps (default: 0 = derived from the engine's backends: when every
     * registered backend is limited, both caps are the sum of their `active` limits (backends
     * may share a host), so libcurl never queues a request that holds a permit, and
     * CURLMOPT_MAXCONNECTS keeps that many alive for reuse; with an unlimited backend, none).
     * A derived cap grows by one while each request to the endpoint-only backend (no backend
     * ID, no permit) transfers, so none of those takes the connection a permit needs; caps
     * set here are the embedder's, and endpoint-only requests share them. */
    long max_host_connections;
    long max_total_connections;
    long max_concurrent_streams; /* HTTP/2 streams per connection (default: the largest
                                    `active`, at least 100, libcurl's own default); none of
                                    the three may be negative */
    char *error;       /* receives a message naming the field when create fails
                          (default: NULL = no message); "" on success */
    size_t error_size; /* bytes at error, NUL included (default: 0) */
};

/*
 * Create a loop over `desc->engine`. Own-thread mode starts the loop thread
 * and returns once it runs. Embedder's-loop mode: call this on the thread
 * that runs your event loop; every sluice_curl_loop_action and destroy must
 * run there too (the loop's curl_multi is driven from that thread); `watch` is
 * called before this returns, for the loop's wake-up descriptor.
 * Returns SLUICE_OK, SLUICE_EINVAL (no engine, a bad field, only one of
 * watch/timer: desc->error names it), SLUICE_ENOMEM, or SLUICE_EIO (the
 * embedder's-loop wake-up descriptor could not be made: eventfd failed).
 */
int sluice_curl_loop_create(const struct sluice_curl_loop_desc *desc,
                            struct sluice_curl_loop **out);

/*
 * Submit a request from any thread. Admission happens here. Returns
 * SLUICE_OK (accepted: `done` will run exactly once, and *id, if not NULL,
 * names the request for sluice_curl_loop_cancel), or, with `done` never
 * called: SLUICE_ECAPACITY (the backend's pool is full), SLUICE_ELATE (the
 * predicted wait leaves too little of the (start) deadline, unless the
 * backend sets sluice_deadline_desc.queue_late), SLUICE_EAGAIN (max_requests
 * requests are already in the loop), SLUICE_ECLOSED (the loop or pool is
 * shutting down), SLUICE_EINVAL (unknown backend, no easy or done, `cut`
 * without `write`). Never blocks; a token that already fired is accepted and completes ECANCELED.
 */
int sluice_curl_loop_submit(struct sluice_curl_loop *loop, const struct sluice_curl_request *req,
                            uint64_t *id);

/*
 * Cancel request `id` from any thread, at any stage: still on its way to
 * the loop, waiting for a permit (or a Retry-After hold), or transferring
 * (the transfer is removed from curl_multi and its connection closed). Its
 * `done` runs with SLUICE_ECANCELED unless it completed first. Returns
 * SLUICE_OK (the request will see the cancel if it has not completed;
 * an id that already completed is ignored), or SLUICE_EINVAL (no loop, or
 * an id this loop never gave out). Ids are never reused.
 */
int sluice_curl_loop_cancel(struct sluice_curl_loop *loop, uint64_t id);

/*
 * Embedder's-loop mode, on the loop's thread: `fd` is ready for `events`
 * (CURL_CSELECT_IN / _OUT / _ERR), or fd = CURL_SOCKET_TIMEOUT when the
 * timer fired. Runs transfers, completions and queued work, then updates
 * the timer. Returns SLUICE_OK, or SLUICE_EINVAL in own-thread mode.
 */
int sluice_curl_loop_action(struct sluice_curl_loop *loop, curl_socket_t fd, int events);

/* A snapshot for tests and status views. */
struct sluice_curl_loop_counts {
    uint32_t live;         /* accepted, not yet completed */
    uint32_t waiting;      /* waiting for a permit or a Retry-After hold */
    uint32_t transferring; /* in curl_multi */
    uint64_t completed;    /* completions delivered */
};
struct sluice_curl_loop_counts sluice_curl_loop_stats(const struct sluice_curl_loop *loop);

/* The engine the loop was created over (any thread). */
const struct sluice_engine *sluice_curl_loop_engine(const struct sluice_curl_loop *loop);

/*
 * Shut down: from any thread (own-thread mode: not from a `done`;
 * embedder's-loop mode: on the loop's thread, outside any action), and
 * safe to race with submit and cancel. New submissions get SLUICE_ECLOSED
 * from the moment this starts; requests not yet transferring complete with
 * SLUICE_ECLOSED (their permits, if any, go back unused); transfers in
 * progress are aborted (connection closed) and complete with SLUICE_ECLOSED,
 * sample IGNORE. Every `done` has run when this returns, and the easy
 * handles are the callers' again. Idempotent.
 */
void sluice_curl_loop_close(struct sluice_curl_loop *loop);

/*
 * Close (if not yet done) and free the loop, its curl_multi and every
 * per-request record. No other call on the loop may run
 * concurrently with or after it. NULL is a no-op.
 *
 * Shutdown order in embedder's-loop mode: (1) destroy the loop, on the
 * loop's thread, while your event loop still exists: watch gets
 * CURL_POLL_REMOVE for every socket still watched and for the wake-up
 * descriptor, each with its socketp, so you free your watchers there (a
 * libuv handle is closed with uv_close then); (2) then stop or close what
 * the timer callback armed and your other handles; (3) then run your loop
 * once more if it needs to finish closes (libuv), and close it. The
 * examples curl_libuv.c and curl_libevent.c follow this order.
 */
void sluice_curl_loop_destroy(struct sluice_curl_loop *loop);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_CURL_H */
