/*
 * stream_service_cases.c — a streaming service under overload, over real
 * loopback HTTP: examples/stream_server.c (libuv; each request one
 * sluice_chat_submit with a 2 s first-token deadline, streamed to its
 * client as server-sent events) in front of sluice-provider-sim in reject
 * mode with a hidden cap of 12, 300 ms to the first token and
 * SS_TOKENS tokens SS_TOKEN_MS apart (about 0.6 s of stream). 64
 * closed-loop client threads (libcurl) call GET /chat for SS_SECONDS; a
 * client that is refused (503) waits SS_RETRY_MS before its next request,
 * as a client that honours back-pressure does (the server's Retry-After
 * says 1 s; retrying at once would measure the clients' storm instead).
 * Two servers side by side, each on a fresh simulator:
 *
 *   adaptive   the example's defaults: active 64 with default discovery,
 *              default waiting, the 2 s start deadline
 *   oracle     the same service with the gate fixed at the true cap
 *              (--fixed 12: active 12, waiting 0, no discovery)
 *
 * Rows (case stream.service, one per server): median_ns and p99_ns are the
 * time to first byte of the served requests (a 200's first delta), ops_per_s
 * complete streams per second; extras: complete (200s ending in [DONE]
 * within the window), cut_share (200s whose stream failed after it began,
 * over all 200s; target < 0.05), refused (503s), refusal_p99_ms (target
 * <= 5), timeouts (504s), provider_ttft_ms (the simulator's median time to
 * first token) and ttfb_ratio (p50 time to first byte over it; target <=
 * 2), the lowest and highest limit over the second half of the window,
 * read once a second (target: inside [0.85 C, C] = [10.2, 12]) and the
 * ceiling at its end, the simulator's cancelled count, and on the adaptive row
 * ratio_vs_oracle (complete streams; target >= 0.75). One repetition per
 * run: a scenario, not a micro-benchmark; run it several times on a noisy
 * machine before trusting a number (SLUICE_BENCH_STREAM_RUNS repeats the
 * pair, run k on the simulator's seed k (plus SLUICE_BENCH_STREAM_SEED) for
 * both servers, and counts the runs that met every target; SLUICE_BENCH_BUSY=1 or 2
 * keeps that many cores busy meanwhile, as the first target asks of
 * its machine). --quick shortens the window.
 *
 * Built only with the shim and the example (SLUICE_BENCH_CURL,
 * SLUICE_STREAM_SERVER_PATH); both processes are started and stopped here.
 * SLUICE_BENCH_STREAM_CAP, _CLIENTS and _TTFT_MS change the cap, the clients
 * and the time to first token (the limit's band then follows the cap).
 */
#include "harness.h"

#if defined(SLUICE_BENCH_CURL) && defined(SLUICE_STREAM_SERVER_PATH)

#include "stream_server_process.h"

#include <pthread.h>
#include <stdatomic.h>

#include <curl/curl.h>

#define SS_CLIENTS_MAX 256
#define SS_TOKENS "30"
#define SS_TOKEN_MS "20"
#define SS_SECONDS 20.0
#define SS_MIN_SECONDS 3.0
#define SS_RETRY_MS 100
#define SS_WATCH_NS INT64_C(1000000000) /* how often the limit is read */
#define SS_TAIL 2048 /* bytes of a body kept: the last ones (a stream's [DONE], a whole /status) */
#define SS_DONE "data: [DONE]\n\n"
#define SS_RUNS_MAX 50

/* The scenario's shape: the case by default; SLUICE_BENCH_STREAM_CAP, _CLIENTS and
 * _TTFT_MS try others. Numbers as the simulator's and the server's flags want them. */
static struct ss_shape {
    int clients;
    char cap[16], ttft_ms[16];
    double ttft_ms_n;
} ss_shape;

/* The last SS_TAIL - 1 bytes of a response body, NUL-terminated. */
struct ss_body {
    char text[SS_TAIL];
    size_t len;
};

static size_t ss_keep_tail(char *data, size_t size, size_t n, void *ctx)
{
    struct ss_body *b = ctx;
    size_t bytes = size * n, cap = sizeof b->text - 1;
    if (bytes >= cap) {
        memcpy(b->text, data + bytes - cap, cap);
        b->len = cap;
    } else {
        size_t drop = b->len + bytes > cap ? b->len + bytes - cap : 0;
        memmove(b->text, b->text + drop, b->len - drop);
        memcpy(b->text + b->len - drop, data, bytes);
        b->len += bytes - drop;
    }
    b->text[b->len] = '\0';
    return bytes;
}

static CURL *ss_easy(const char *url, struct ss_body *body)
{
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ss_keep_tail);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

/* The number after "key": in the JSON that `path` of process `p` answers; -1 when unreadable. */
static double ss_json_number(const struct sim_process *p, const char *path, const char *key)
{
    char url[128], needle[64];
    struct ss_body body = {.len = 0};
    CURL *easy = ss_easy(sim_process_url(p, path, url, sizeof url), &body);
    CURLcode code = curl_easy_perform(easy);
    curl_easy_cleanup(easy);
    snprintf(needle, sizeof needle, "\"%s\":", key);
    const char *at = code == CURLE_OK ? strstr(body.text, needle) : NULL;
    return at ? strtod(at + strlen(needle), NULL) : -1;
}

/* A growing array of samples in ms. */
struct ss_samples {
    double *v;
    size_t n, cap;
};

static void ss_add(struct ss_samples *s, double ms)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ms;
}

static void ss_merge(struct ss_samples *into, struct ss_samples *from)
{
    for (size_t i = 0; i < from->n; i++)
        ss_add(into, from->v[i]);
    free(from->v);
    *from = (struct ss_samples){0};
}

struct ss_client {
    const char *url;
    int64_t end_ns; /* requests that finish later are not counted, and the client stops */
    struct ss_samples ttfb, refusal;
    long complete, cut, refused, timeouts, other;
};

/* Count one answer; its HTTP status. */
static long ss_count(struct ss_client *c, CURL *easy, CURLcode rc, const struct ss_body *body,
                     int64_t took_ns)
{
    long code = 0;
    curl_off_t ttfb_us = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_getinfo(easy, CURLINFO_STARTTRANSFER_TIME_T, &ttfb_us);
    if (rc == CURLE_OK && code == 200) {
        size_t done_len = strlen(SS_DONE);
        bool done = body->len >= done_len && !strcmp(body->text + body->len - done_len, SS_DONE);
        c->complete += done;
        c->cut += !done;
        ss_add(&c->ttfb, (double)ttfb_us / 1e3);
    } else if (rc == CURLE_OK && code == 503) {
        c->refused++;
        ss_add(&c->refusal, (double)took_ns / 1e6);
    } else if (rc == CURLE_OK && code == 504) {
        c->timeouts++;
    } else {
        c->other++;
    }
    return rc == CURLE_OK ? code : 0;
}

static void *ss_client_main(void *arg)
{
    struct ss_client *c = arg;
    struct ss_body body;
    CURL *easy = ss_easy(c->url, &body);
    for (;;) {
        body.len = 0;
        int64_t t0 = bench_now_ns();
        if (t0 >= c->end_ns)
            break;
        CURLcode rc = curl_easy_perform(easy);
        int64_t t1 = bench_now_ns();
        if (t1 > c->end_ns)
            break;
        if (ss_count(c, easy, rc, &body, t1 - t0) == 503) {
            struct timespec pause = {0, SS_RETRY_MS * 1000000L};
            nanosleep(&pause, NULL);
        }
    }
    curl_easy_cleanup(easy);
    return NULL;
}

/* Until end_ns, once a second: the server's limit, its lowest and highest over the second half
 * of the window (the target is about the limit once it has had time to find the cap), and the
 * ceiling at the end. */
static void ss_watch_limit(const struct sim_process *server, int64_t end_ns, double seconds,
                           double *lo, double *hi, double *ceiling)
{
    int64_t half_ns = end_ns - (int64_t)(seconds * 1e9 / 2);
    *lo = *hi = -1;
    for (int64_t now = bench_now_ns(); now < end_ns; now = bench_now_ns()) {
        int64_t nap = end_ns - now < SS_WATCH_NS ? end_ns - now : SS_WATCH_NS;
        struct timespec ts = {(time_t)(nap / 1000000000), (long)(nap % 1000000000)};
        nanosleep(&ts, NULL);
        if (bench_now_ns() < half_ns)
            continue;
        double limit = ss_json_number(server, "/status", "limit");
        *lo = *lo < 0 || limit < *lo ? limit : *lo;
        *hi = limit > *hi ? limit : *hi;
    }
    *ceiling = ss_json_number(server, "/status", "ceiling");
}

struct ss_server {
    const char *name;
    const char *const *flags;
};

/* One server for `seconds` on a fresh simulator drawing its times from `seed`; its complete
 * streams (-1: setup failed). */
static long ss_run(const struct ss_server *s, double seconds, int seed, struct bench_row *row)
{
    struct sim_process sim, server;
    char seed_s[16];
    snprintf(seed_s, sizeof seed_s, "%d", seed);
    const char *args[] = {"--mode", "reject", "--cap", ss_shape.cap, "--stream", "--median-ms",
                          ss_shape.ttft_ms, "--token-ms", SS_TOKEN_MS, "--answer-tokens", SS_TOKENS,
                          "--answer-sigma", "0", "--seed", seed_s, NULL};
    if (sim_process_start(&sim, args) != 0)
        return -1;
    if (stream_server_start(&server, &sim, s->flags) != 0) {
        sim_process_stop(&sim);
        return -1;
    }
    char url[96];
    sim_process_url(&server, "/chat?q=hi", url, sizeof url);
    static struct ss_client c[SS_CLIENTS_MAX];
    pthread_t t[SS_CLIENTS_MAX];
    int64_t end_ns = bench_now_ns() + (int64_t)(seconds * 1e9);
    for (int i = 0; i < ss_shape.clients; i++) {
        c[i] = (struct ss_client){.url = url, .end_ns = end_ns};
        pthread_create(&t[i], NULL, ss_client_main, &c[i]);
    }
    double limit_lo, limit_hi, ceiling;
    ss_watch_limit(&server, end_ns, seconds, &limit_lo, &limit_hi, &ceiling);
    struct ss_client sum = {0};
    for (int i = 0; i < ss_shape.clients; i++) {
        pthread_join(t[i], NULL);
        sum.complete += c[i].complete;
        sum.cut += c[i].cut;
        sum.refused += c[i].refused;
        sum.timeouts += c[i].timeouts;
        sum.other += c[i].other;
        ss_merge(&sum.ttfb, &c[i].ttfb);
        ss_merge(&sum.refusal, &c[i].refusal);
    }
    *row = bench_row_make("stream.service", s->name, ss_shape.clients);
    double ttfb_p50 = sum.ttfb.n ? bench_median(sum.ttfb.v, sum.ttfb.n) : -1;
    row->median_ns = ttfb_p50 * 1e6;
    row->p99_ns = sum.ttfb.n ? bench_percentile(sum.ttfb.v, sum.ttfb.n, 99.0) * 1e6 : -1;
    row->ops_per_s = (double)sum.complete / seconds;
    bench_row_extra(row, "complete", (double)sum.complete);
    bench_row_extra(row, "cut_share",
                    sum.complete + sum.cut ? (double)sum.cut / (double)(sum.complete + sum.cut) : 0);
    bench_row_extra(row, "refused", (double)sum.refused);
    bench_row_extra(row, "refusal_p99_ms",
                    sum.refusal.n ? bench_percentile(sum.refusal.v, sum.refusal.n, 99.0) : -1);
    bench_row_extra(row, "timeouts", (double)sum.timeouts);
    bench_row_extra(row, "provider_ttft_ms", ss_shape.ttft_ms_n);
    bench_row_extra(row, "ttfb_ratio", ttfb_p50 / ss_shape.ttft_ms_n);
    bench_row_extra(row, "limit_lo", limit_lo);
    bench_row_extra(row, "limit_hi", limit_hi);
    bench_row_extra(row, "ceiling", ceiling);
    bench_row_extra(row, "sim_cancelled", ss_json_number(&sim, "/stats", "cancelled"));
    if (sum.other)
        printf("  !!! WARNING stream.service %s: %ld requests failed otherwise\n", s->name,
               sum.other);
    free(sum.ttfb.v);
    free(sum.refusal.v);
    sim_process_stop(&server);
    sim_process_stop(&sim);
    return sum.complete;
}

/* Whether the adaptive server's run met each of the targets. */
static bool ss_met_targets(const struct bench_row *row, double ratio)
{
    double cap = atof(ss_shape.cap);
    double refusal_p99 = bench_row_extra_value(row, "refusal_p99_ms", -1);
    double ttfb_ratio = bench_row_extra_value(row, "ttfb_ratio", -1);
    return ratio >= 0.75 && bench_row_extra_value(row, "cut_share", 1) < 0.05 && ttfb_ratio >= 0 &&
           ttfb_ratio <= 2.0 && refusal_p99 <= 5.0 &&
           bench_row_extra_value(row, "limit_lo", -1) >= 0.85 * cap &&
           bench_row_extra_value(row, "limit_hi", cap + 1) <= cap;
}

static void stream_service_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "stream.service"))
        return;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    ss_shape.clients = bench_env_int("SLUICE_BENCH_STREAM_CLIENTS", 64, 1, SS_CLIENTS_MAX);
    snprintf(ss_shape.cap, sizeof ss_shape.cap, "%d",
             bench_env_int("SLUICE_BENCH_STREAM_CAP", 12, 1, 1000));
    int ttft = bench_env_int("SLUICE_BENCH_STREAM_TTFT_MS", 300, 1, 10000);
    snprintf(ss_shape.ttft_ms, sizeof ss_shape.ttft_ms, "%d", ttft);
    ss_shape.ttft_ms_n = ttft;
    static const char *const adaptive_flags[] = {"--start-ms", "2000", NULL};
    const char *const oracle_flags[] = {"--start-ms", "2000", "--fixed", ss_shape.cap, NULL};
    const struct ss_server servers[] = {{"adaptive", adaptive_flags}, {"oracle", oracle_flags}};
    double seconds = SS_SECONDS * opts->scale < SS_MIN_SECONDS ? SS_MIN_SECONDS
                                                                : SS_SECONDS * opts->scale;
    int runs = bench_env_int("SLUICE_BENCH_STREAM_RUNS", 1, 1, SS_RUNS_MAX);
    int seed = bench_env_int("SLUICE_BENCH_STREAM_SEED", 0, 0, 1000000);
    int busy = bench_busy_count(2), met = 0, done = 0;
    int busy_pids[2] = {0};
    bench_busy_start(busy_pids, busy);
    printf("  stream.service: cap %s, %d clients, %s ms to first token, %.0f s, %d busy loop%s, "
           "%d run%s\n",
           ss_shape.cap, ss_shape.clients, ss_shape.ttft_ms, seconds, busy, busy == 1 ? "" : "s",
           runs, runs == 1 ? "" : "s");
    for (int run = 0; run < runs; run++, done++) {
        struct bench_row rows[2];
        long complete[2];
        bool started = true;
        for (int i = 0; i < 2 && started; i++)
            if ((complete[i] = ss_run(&servers[i], seconds, seed + run + 1, &rows[i])) < 0) {
                printf("  !!! WARNING: stream.service: %s could not start\n", servers[i].name);
                started = false;
            }
        if (!started)
            break;
        if (complete[1] > 0)
            bench_row_extra(&rows[0], "ratio_vs_oracle", (double)complete[0] / (double)complete[1]);
        for (int i = 0; i < 2; i++)
            bench_emit(&rows[i]);
        met += complete[1] > 0 && ss_met_targets(&rows[0], (double)complete[0] / (double)complete[1]);
    }
    bench_busy_stop(busy_pids, busy);
    if (done)
        printf("  stream.service: adaptive met every target (>= 0.75x the oracle's complete streams, "
               "< 5%% cut, time to first byte <= 2x, 503s <= 5 ms p99, limit in [%.1f, %s]) in %d "
               "of %d run%s\n",
               0.85 * atof(ss_shape.cap), ss_shape.cap, met, done, done == 1 ? "" : "s");
}

BENCH_REGISTER(stream_service, stream_service_cases, false)

#endif /* SLUICE_BENCH_CURL && SLUICE_STREAM_SERVER_PATH */
