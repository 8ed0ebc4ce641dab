/*
 * deadline_cases.c — the deadline rules of sluice/pool.h over real loopback
 * HTTP, in the scenario they were built for: 64 blocking threads call
 * sluice-provider-sim (reject mode, hidden cap 24, 200 ms median service)
 * through sluice_curl_perform, each call with a 250 ms deadline covering its
 * queue wait and its transfer, against an adaptive backend (active 64,
 * default discovery). Three clients side by side, each on a fresh simulator
 * for DL_SECONDS:
 *
 *   rules          default waiting (1024), deadline rules at their defaults
 *                  (don't start what cannot finish, lingering permits)
 *   waiting0       .waiting = SLUICE_SOME(0), rules off
 *   rules_off      default waiting, rules off: the behaviour before them
 *
 * Rows (case curl.deadlines, one per client): successes per second
 * (ops_per_s), and extras: successes, timeouts (the call's status
 * ETIMEDOUT, refused_late ones included), refused_late, started (transfers
 * begun), aborted (transfers the caller's deadline ended mid-way),
 * aborted_share (aborted / started; target <= 0.05 for `rules`), the
 * simulator's requests and cancelled count, the limit and locked ceiling
 * at the end (target: locked inside [0.85 C, C] = [20.4, 24]), and on the
 * rules row ratio_vs_waiting0 (successes; target >= 0.8). One repetition
 * per run (it is a scenario, not a micro-benchmark): run it several times
 * on a noisy machine before trusting a number.
 */
#include "harness.h"

#ifdef SLUICE_BENCH_CURL

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/curl.h>

#include "sluice-provider-sim/sim_process.h"

#define DL_THREADS 64
#define DL_CAP "24"
#define DL_SECONDS 12
#define DL_DEADLINE_NS (250 * SLUICE_NS_PER_MS)
#define DL_BODY "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

struct dl_totals {
    long successes, timeouts, refused_late, started, aborted;
};

struct dl_worker {
    struct sluice_engine *engine;
    const char *url;
    _Atomic(bool) *stop;
    struct dl_totals t;
};

static size_t dl_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

static void *dl_worker_main(void *arg)
{
    struct dl_worker *w = (struct dl_worker *)arg;
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, w->url);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, DL_BODY);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, dl_discard);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    while (!atomic_load(w->stop)) {
        struct timespec dl;
        struct sluice_curl_result r;
        int status = sluice_curl_perform(w->engine, "sim", easy,
                                         sluice_deadline_in(&dl, DL_DEADLINE_NS), NULL, &r);
        w->t.successes += status == SLUICE_OK && r.kind == SLUICE_CURL_SUCCESS;
        w->t.timeouts += status == SLUICE_ETIMEDOUT;
        w->t.refused_late += r.refused_late;
        w->t.started += r.transferred;
        w->t.aborted += r.transferred && r.kind == SLUICE_CURL_ABORTED;
    }
    curl_easy_cleanup(easy);
    return NULL;
}

struct dl_body {
    char text[8192];
    size_t len;
};

static size_t dl_keep(char *data, size_t size, size_t n, void *ctx)
{
    struct dl_body *b = (struct dl_body *)ctx;
    size_t take = size * n < sizeof b->text - 1 - b->len ? size * n : sizeof b->text - 1 - b->len;
    memcpy(b->text + b->len, data, take);
    b->len += take;
    b->text[b->len] = '\0';
    return size * n;
}

/* The simulator's counter `key` from GET /stats; -1 when unreadable. */
static long dl_sim_stat(struct sim_process *sim, const char *key)
{
    char url[96];
    sim_process_url(sim, "/stats", url, sizeof url);
    struct dl_body body = {.len = 0};
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, dl_keep);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    CURLcode code = curl_easy_perform(easy);
    curl_easy_cleanup(easy);
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    const char *at = code == CURLE_OK ? strstr(body.text, needle) : NULL;
    return at ? strtol(at + strlen(needle), NULL, 10) : -1;
}

struct dl_client {
    const char *name;
    bool rules;
    bool waiting0;
};

/* One client for DL_SECONDS on a fresh simulator; returns its successes (-1: setup failed). */
static long dl_run(const struct dl_client *c, struct bench_row *row)
{
    struct sim_process sim;
    const char *args[] = {"--mode", "reject", "--cap", DL_CAP, "--median-ms", "200", NULL};
    if (sim_process_start(&sim, args) != 0)
        return -1;
    char url[96];
    sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
    static const struct sluice_discovery_desc discovery = {0};
    struct sluice_backend_desc b = {.id = "sim", .active = 64, .discovery = &discovery};
    if (c->waiting0)
        b.waiting = SLUICE_SOME(0);
    if (!c->rules)
        b.deadlines = (struct sluice_deadline_desc){.start_quantile = SLUICE_SOME(0),
                                                    .linger_max_ms = SLUICE_SOME(0)};
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e) !=
        SLUICE_OK) {
        sim_process_stop(&sim);
        return -1;
    }
    _Atomic(bool) stop = false;
    static struct dl_worker w[DL_THREADS];
    pthread_t t[DL_THREADS];
    for (int i = 0; i < DL_THREADS; i++) {
        w[i] = (struct dl_worker){.engine = e, .url = url, .stop = &stop};
        pthread_create(&t[i], NULL, dl_worker_main, &w[i]);
    }
    struct timespec span = {DL_SECONDS, 0};
    nanosleep(&span, NULL);
    atomic_store(&stop, true);
    struct dl_totals sum = {0};
    for (int i = 0; i < DL_THREADS; i++) {
        pthread_join(t[i], NULL);
        sum.successes += w[i].t.successes;
        sum.timeouts += w[i].t.timeouts;
        sum.refused_late += w[i].t.refused_late;
        sum.started += w[i].t.started;
        sum.aborted += w[i].t.aborted;
    }
    struct sluice_discovery_status st;
    sluice_engine_status(e, "sim", &st);
    *row = bench_row_make("curl.deadlines", c->name, DL_THREADS);
    row->ops_per_s = (double)sum.successes / DL_SECONDS;
    bench_row_extra(row, "successes", (double)sum.successes);
    bench_row_extra(row, "timeouts", (double)sum.timeouts);
    bench_row_extra(row, "refused_late", (double)sum.refused_late);
    bench_row_extra(row, "started", (double)sum.started);
    bench_row_extra(row, "aborted", (double)sum.aborted);
    bench_row_extra(row, "aborted_share",
                    sum.started ? (double)sum.aborted / (double)sum.started : 0.0);
    bench_row_extra(row, "sim_requests", (double)dl_sim_stat(&sim, "requests"));
    bench_row_extra(row, "sim_cancelled", (double)dl_sim_stat(&sim, "cancelled"));
    bench_row_extra(row, "limit", (double)st.limit);
    bench_row_extra(row, "ceiling", (double)st.ceiling);
    sluice_engine_close(e);
    sluice_engine_destroy(e);
    sim_process_stop(&sim);
    return sum.successes;
}

static void deadline_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "curl.deadlines"))
        return;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    static const struct dl_client clients[] = {
        {"rules", true, false}, {"waiting0", false, true}, {"rules_off", false, false}};
    struct bench_row rows[3];
    long successes[3];
    for (int i = 0; i < 3; i++)
        if ((successes[i] = dl_run(&clients[i], &rows[i])) < 0) {
            printf("  !!! WARNING: curl.deadlines: %s could not start\n", clients[i].name);
            return;
        }
    if (successes[1] > 0)
        bench_row_extra(&rows[0], "ratio_vs_waiting0", (double)successes[0] / (double)successes[1]);
    for (int i = 0; i < 3; i++)
        bench_emit(&rows[i]);
}

BENCH_REGISTER(deadlines, deadline_cases, false)

#endif /* SLUICE_BENCH_CURL */
