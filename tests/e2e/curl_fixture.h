/*
 * curl_fixture.h — what the libcurl transport's end-to-end tests share: a
 * simulator on a free port, described by the provider a test wants
 * (struct fx_provider, not argv), chat-completion easy handles aimed at
 * it, its /stats, and engines with one backend ("sim") in front of it.
 *
 * Every helper is static; each test file gets its own copy. Per-test
 * .init/.fini rather than TestSuite, and start() stops any simulator the
 * previous test left: the TSan build's Criterion stand-in ignores both.
 */
#ifndef SLUICE_TESTS_E2E_CURL_FIXTURE_H
#define SLUICE_TESTS_E2E_CURL_FIXTURE_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>

#include <sluice/curl.h>

#include "common.h"
#include "sluice-provider-sim/sim_process.h"

#define FX_BACKEND "sim"
#define FX_REQUEST "{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static struct sim_process fx_sim;

__attribute__((unused)) static void fx_setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

__attribute__((unused)) static void fx_teardown(void)
{
    sim_process_stop(&fx_sim);
    curl_global_cleanup();
}

/* ---- the simulated provider -------------------------------------------------- */

/* Passes a real 0 for an int field of struct fx_provider, whose 0 leaves the flag out. */
#define FX_ZERO (-1)

/*
 * The provider a test wants, as sluice-provider-sim's flags by name (its
 * --help says what each does). Zero, false or NULL leaves the flag out, so
 * the simulator's own default holds; FX_ZERO passes 0.
 *   fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 600,
 *                                  .fixed_latency = true});
 */
struct fx_provider {
    const char *mode;        /* --mode: "reject", "queue", "drop" or "rate" */
    int cap;                 /* --cap: the hidden concurrency cap */
    int median_ms;           /* --median-ms: median service time (time to first token) */
    bool fixed_latency;      /* --sigma 0: every call takes exactly median_ms */
    int retry_after;         /* --retry-after S on its refusals */
    bool retry_after_date;   /* --retry-after-date: Retry-After as an HTTP-date */
    bool abandoned_free;     /* --abandoned free: a call whose client hung up frees its slot */
    int queue_timeout;       /* --queue-timeout MS (queue mode) */
    int queue_bound;         /* --queue-bound N (queue mode) */
    int rate;                /* --rate N (rate mode) */
    int rate_window;         /* --rate-window S (rate mode) */
    const char *dialect;     /* --dialect D: whose rate-limit headers and refusals */
    const char *quota_at;    /* --quota-at T:MS: quota refusals in that span */
    const char *platform_at; /* --platform-at T:MS: platform overload in that span */
    /* Streaming: the rest need .stream. */
    bool stream;             /* --stream: SSE answers */
    bool stream_endless;     /* --stream-endless: never end the stream */
    int stream_fail_after;   /* --stream-fail-after N: an error event (code 429) after N tokens */
    int answer_tokens;       /* --answer-tokens N: median answer length */
    bool fixed_answer;       /* --answer-sigma 0: every answer exactly answer_tokens long */
    int token_ms;            /* --token-ms MS between tokens */
    int token_bytes;         /* --token-bytes N of text per token */
};

/* The argv fx_provider_argv builds, and the numbers it points at. */
struct fx_argv {
    const char *v[48];
    char num[16][24];
    int n, nums;
};

static inline void fx__arg(struct fx_argv *a, const char *flag, const char *value)
{
    cr_assert_lt(a->n + 2, (int)(sizeof a->v / sizeof a->v[0]), "struct fx_argv: too many flags");
    a->v[a->n++] = flag;
    if (value)
        a->v[a->n++] = value;
    a->v[a->n] = NULL;
}

static inline void fx__int(struct fx_argv *a, const char *flag, int v)
{
    if (!v)
        return;
    cr_assert_lt(a->nums, (int)(sizeof a->num / sizeof a->num[0]), "struct fx_argv: too many numbers");
    char *num = a->num[a->nums++];
    snprintf(num, sizeof a->num[0], "%d", v == FX_ZERO ? 0 : v);
    fx__arg(a, flag, num);
}

static inline void fx__str(struct fx_argv *a, const char *flag, const char *v)
{
    if (v)
        fx__arg(a, flag, v);
}

static inline void fx__bool(struct fx_argv *a, const char *flag, const char *value, bool on)
{
    if (on)
        fx__arg(a, flag, value);
}

/* The simulator's flags for provider `p`, NULL-terminated, in *a (valid while *a is). */
static inline const char *const *fx_provider_argv(const struct fx_provider *p, struct fx_argv *a)
{
    memset(a, 0, sizeof *a);
    fx__str(a, "--mode", p->mode);
    fx__int(a, "--cap", p->cap);
    fx__int(a, "--median-ms", p->median_ms);
    fx__bool(a, "--sigma", "0", p->fixed_latency);
    fx__int(a, "--retry-after", p->retry_after);
    fx__bool(a, "--retry-after-date", NULL, p->retry_after_date);
    fx__bool(a, "--abandoned", "free", p->abandoned_free);
    fx__int(a, "--queue-timeout", p->queue_timeout);
    fx__int(a, "--queue-bound", p->queue_bound);
    fx__int(a, "--rate", p->rate);
    fx__int(a, "--rate-window", p->rate_window);
    fx__str(a, "--dialect", p->dialect);
    fx__str(a, "--quota-at", p->quota_at);
    fx__str(a, "--platform-at", p->platform_at);
    fx__bool(a, "--stream", NULL, p->stream);
    fx__bool(a, "--stream-endless", NULL, p->stream_endless);
    fx__int(a, "--stream-fail-after", p->stream_fail_after);
    fx__int(a, "--answer-tokens", p->answer_tokens);
    fx__bool(a, "--answer-sigma", "0", p->fixed_answer);
    fx__int(a, "--token-ms", p->token_ms);
    fx__int(a, "--token-bytes", p->token_bytes);
    return a->v;
}

/* Start `sim` as provider `p`: sim_process_start's result. */
static inline int fx_sim_start(struct sim_process *sim, const struct fx_provider *p)
{
    struct fx_argv a;
    return sim_process_start(sim, fx_provider_argv(p, &a));
}

/* Start the fixture's simulator (fx_sim) as provider `p`, stopping any earlier one. */
static inline void fx_start(const struct fx_provider *p)
{
    sim_process_stop(&fx_sim);
    cr_assert_eq(fx_sim_start(&fx_sim, p), 0, "the simulator did not start");
}

static inline int64_t fx_now_ms(void)
{
    return sluice_monotonic_ns() / SLUICE_NS_PER_MS;
}

static inline void fx_sleep_ms(int ms)
{
    sim__sleep_ms(ms);
}

/* ---- requests ---------------------------------------------------------------- */

/* Response bodies are dropped; tests look at statuses and the simulator's counters. */
static size_t fx_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* A POST /v1/chat/completions to the simulator (or to `url` when not NULL). */
static inline CURL *fx_easy_url(const char *url)
{
    char buf[96];
    CURL *easy = curl_easy_init();
    cr_assert_not_null(easy);
    curl_easy_setopt(easy, CURLOPT_URL,
                     url ? url : sim_process_url(&fx_sim, "/v1/chat/completions", buf, sizeof buf));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, FX_REQUEST);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, fx_discard);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

static inline CURL *fx_easy(void)
{
    return fx_easy_url(NULL);
}

/* ---- the simulator's counters ------------------------------------------------- */

struct fx_stats {
    long requests, cancelled, in_flight, peak_in_flight, ok, rejected, unavailable;
};

static size_t fx_collect(char *data, size_t size, size_t n, void *ctx)
{
    char *buf = (char *)ctx;
    size_t len = strlen(buf), bytes = size * n;
    size_t keep = bytes < 4095 - len ? bytes : 4095 - len;
    memcpy(buf + len, data, keep);
    buf[len + keep] = '\0';
    return bytes;
}

static inline long fx_json_long(json_t *obj, const char *key)
{
    return (long)json_integer_value(json_object_get(obj, key));
}

/* The simulator's GET /stats, parsed; the caller json_decref()s it. */
static inline json_t *fx_stats_json(void)
{
    char url[96], body[4096] = "";
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, sim_process_url(&fx_sim, "/stats", url, sizeof url));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, fx_collect);
    /* (void *): curl's type check takes a char array for a string and warns at -O1. */
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, (void *)body);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 5000L);
    cr_assert_eq(curl_easy_perform(easy), CURLE_OK, "GET /stats failed");
    curl_easy_cleanup(easy);
    json_t *root = json_loads(body, 0, NULL);
    cr_assert_not_null(root, "/stats is not JSON: %s", body);
    return root;
}

static inline struct fx_stats fx_stats(void)
{
    json_t *root = fx_stats_json();
    json_t *by = json_object_get(root, "by_status");
    struct fx_stats s = {
        .requests = fx_json_long(root, "requests"),
        .cancelled = fx_json_long(root, "cancelled"),
        .in_flight = fx_json_long(root, "in_flight"),
        .peak_in_flight = fx_json_long(root, "peak_in_flight"),
        .ok = fx_json_long(by, "200"),
        .rejected = fx_json_long(by, "429"),
        .unavailable = fx_json_long(by, "503"),
    };
    json_decref(root);
    return s;
}

/* Wait (bounded) until the simulator has no call in flight; its last stats. */
static inline struct fx_stats fx_stats_settled(void)
{
    struct fx_stats s = fx_stats();
    for (int i = 0; i < 200 && s.in_flight; i++) {
        fx_sleep_ms(5);
        s = fx_stats();
    }
    return s;
}

/* ---- engines ---------------------------------------------------------------- */

/* Discovery tuned for a simulator answering in tens of milliseconds. */
static inline struct sluice_discovery_desc fx_discovery(void)
{
    struct sluice_discovery_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.window_min_ns = 20 * SLUICE_NS_PER_MS;
    return dd;
}

/*
 * The median call of the checks that discovery finds a refusing cap of 24 over
 * HTTP. Latency is discovery's backstop, so a stall of this machine reads as a
 * knee, and the shorter the calls the shorter the stall that does. With a
 * neighbour starting Chromium over and over on two cores beside two busy loops,
 * 32 runs of the two checks at 20 ms drew 4 locks at 9-20 on latency backoffs
 * with few or no 429s (and about one suite in three carried such a miss); at
 * 40 ms, 32 of 32 locked at 24, after 1.3-5.9 s, with 0.2-1.5 % 429s.
 */
#define FX_DISCOVERY_MEDIAN_MS 40

/* An engine of one backend FX_BACKEND: `active` (0 = unlimited), `waiting` (< 0 = the
 * default), adaptive when dd is not NULL, `dl` its deadline rules (NULL = the defaults). */
static inline struct sluice_engine *fx_engine_with(uint32_t active, int waiting,
                                                   const struct sluice_discovery_desc *dd,
                                                   const struct sluice_deadline_desc *dl)
{
    struct sluice_backend_desc b;
    memset(&b, 0, sizeof b);
    b.id = FX_BACKEND;
    b.active = active;
    if (waiting >= 0) {
        b.waiting.set = true;
        b.waiting.value = (uint32_t)waiting;
    }
    b.discovery = dd;
    if (dl)
        b.deadlines = *dl;
    char err[256];
    struct sluice_engine_desc ed;
    memset(&ed, 0, sizeof ed);
    ed.backends = &b;
    ed.n_backends = 1;
    ed.error = err;
    ed.error_size = sizeof err;
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&ed, &e), SLUICE_OK, "engine: %s", err);
    return e;
}

static inline struct sluice_engine *fx_engine(uint32_t active, int waiting,
                                              const struct sluice_discovery_desc *dd)
{
    return fx_engine_with(active, waiting, dd, NULL);
}

/* An engine of one fixed backend FX_BACKEND (active 4) whose endpoint is the simulator's
 * /v1, for the chat client. */
static inline struct sluice_engine *fx_engine_at_sim(void)
{
    static char base[64];
    sim_process_url(&fx_sim, "/v1", base, sizeof base);
    struct sluice_backend_desc b = {.id = FX_BACKEND, .endpoint = base, .active = 4};
    struct sluice_engine *e = NULL;
    cr_assert_eq(
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e),
        SLUICE_OK);
    return e;
}

static inline struct sluice_pool_counts fx_counts(struct sluice_engine *e)
{
    return sluice_pool_stats(sluice_engine_pool(e, FX_BACKEND));
}

static inline struct sluice_discovery_status fx_status(struct sluice_engine *e)
{
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(e, FX_BACKEND, &st), SLUICE_OK);
    return st;
}

/*
 * Discovery's path, one " +seconds cause old→new @in_flight;" per event: printed beside a
 * test's outcome, so a miss on a loaded CI runner (a lock outside its band is rare) can be
 * explained from its log. fx__event_step appends one event at `seconds` since the first to
 * out (`used` bytes so far); false once out is full.
 */
static inline bool fx__event_step(char *out, size_t size, size_t *used, double seconds,
                                  const char *cause, long long old_limit, long long new_limit,
                                  long long in_flight)
{
    int w = snprintf(out + *used, size - *used, " +%.2fs %s %lld→%lld @%lld;", seconds, cause,
                     old_limit, new_limit, in_flight);
    if (w < 0 || (size_t)w >= size - *used)
        return false;
    *used += (size_t)w;
    return true;
}

/* The backend's events so far, from the engine's ring. */
__attribute__((unused)) static void fx_event_path(struct sluice_engine *e, char *out, size_t size)
{
    const struct sluice_event_ring *ring = sluice_engine_events(e, FX_BACKEND);
    struct sluice_event ev[64];
    uint64_t cursor = 0;
    size_t n, used = 0;
    int64_t t0 = -1;
    out[0] = '\0';
    while (ring && (n = sluice_event_ring_read(ring, &cursor, ev, 64, NULL)) > 0)
        for (size_t i = 0; i < n; i++) {
            t0 = t0 < 0 ? ev[i].t_ns : t0;
            if (!fx__event_step(out, size, &used, (double)(ev[i].t_ns - t0) / 1e9,
                                sluice_cause_name(ev[i].cause), ev[i].old_limit,
                                ev[i].new_limit, ev[i].in_flight))
                return;
        }
}

/* The same from `events`, a JSON array of event records (sluicectl probe --json's "events",
 * the lines of the admin's feed). */
__attribute__((unused)) static void fx_event_path_json(json_t *events, char *out, size_t size)
{
    size_t used = 0, i;
    out[0] = '\0';
    json_t *e;
    json_int_t t0 = json_integer_value(json_object_get(json_array_get(events, 0), "t_ns"));
    json_array_foreach(events, i, e) {
        if (!fx__event_step(out, size, &used,
                            (double)(json_integer_value(json_object_get(e, "t_ns")) - t0) / 1e9,
                            json_string_value(json_object_get(e, "reason")),
                            (long long)json_integer_value(json_object_get(e, "old_limit")),
                            (long long)json_integer_value(json_object_get(e, "new_limit")),
                            (long long)json_integer_value(json_object_get(e, "in_flight"))))
            return;
    }
}

/*
 * Teach the backend's service-time estimate (sluice/service_time.h) that `n`
 * calls took `ns`: successful calls, each back-dated by `ns`, ended at once.
 * No request reaches the simulator.
 */
static inline void fx_teach_service(struct sluice_engine *e, int64_t ns, unsigned n)
{
    struct sluice_pool *p = sluice_engine_pool(e, FX_BACKEND);
    for (unsigned i = 0; i < n; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        call.start_ns -= ns;
        sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    }
}

/* The pool holds nothing: no admission, no call in flight or queued, once the permits of
 * abandoned calls have lingered their time (sluice/pool_linger.h: a call cut before any
 * estimate keeps its permit as long again as it ran). */
static inline void fx_assert_idle(struct sluice_engine *e)
{
    struct sluice_pool *p = sluice_engine_pool(e, FX_BACKEND);
    int64_t give_up = sluice_monotonic_ns() + 30 * SLUICE_NS_PER_SEC; /* linger_max_ms */
    while (sluice_pool_stats(p).lingering && sluice_monotonic_ns() < give_up) {
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
        sluice_engine_poll(e);
    }
    struct sluice_pool_counts c = fx_counts(e);
    cr_assert_eq(c.lingering, 0, "permits still lingering: %u", c.lingering);
    cr_assert_eq(c.admitted, 0, "admissions leaked: %u", c.admitted);
    cr_assert_eq(c.in_flight, 0, "calls still in flight: %u", c.in_flight);
    cr_assert_eq(c.queued, 0, "calls still queued: %u", c.queued);
}

#endif
