/*
 * curl_cases.c — the libcurl transport (sluice/curl.h) next to plain libcurl,
 * over loopback against sluice-provider-sim answering at once (zero service
 * time, a cap no run reaches), in the same process and the same run.
 *
 * curl.multi_throughput  CM_CONCURRENCY requests kept outstanding (each
 *                        completion submits the next on the same handle,
 *                        so connections are reused) through
 *                        sluice_curl_loop (impl sluice: submit, admission,
 *                        async permit, curl_multi, classification,
 *                        discovery-free fixed pool of CM_CONCURRENCY) and
 *                        through one thread driving a plain curl_multi with
 *                        no gate (impl curl_multi). Both multis get the same
 *                        connection caps (CM_CONCURRENCY per host and in
 *                        total). Rows: requests per second; median and p99
 *                        of a request's submit-to-completion time. The
 *                        sluice row carries ratio_vs_curl_multi (target
 *                        >= 0.9).
 * curl.perform_overhead  one thread, sequential calls on one easy handle:
 *                        sluice_curl_perform (impl sluice) next to
 *                        curl_easy_perform (impl curl_easy_perform). Rows:
 *                        ns per call (median, p99), calls per second; the
 *                        sluice row carries overhead_ns (median difference).
 *
 * Every number is a median across opts->repeats repetitions, and the order
 * of the implementations alternates between repetitions. A request that
 * does not come back 200 prints a "!!! WARNING" line. Built only with the
 * shim (SLUICE_BENCH_CURL); the simulator is started and stopped here.
 */
#include "harness.h"

#ifdef SLUICE_BENCH_CURL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/curl.h>

#include "sluice-provider-sim/sim_process.h"

#define CM_CONCURRENCY 32
#define CM_MAX_REPEATS 64
#define CM_BODY "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static void cm_warn(const char *what)
{
    printf("  !!! WARNING: %s\n", what);
    fflush(stdout);
}

static size_t cm_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

static CURL *cm_easy(const char *url)
{
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, CM_BODY);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, cm_discard);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

/* Per-repeat medians, one per implementation. */
struct cm_summary {
    double median[CM_MAX_REPEATS], p99[CM_MAX_REPEATS], ops[CM_MAX_REPEATS];
    int n;
};

static void cm_summarise(struct cm_summary *s, double *samples, size_t n, double ops_per_s)
{
    s->median[s->n] = bench_median(samples, n);
    s->p99[s->n] = bench_percentile(samples, n, 99.0);
    s->ops[s->n] = ops_per_s;
    s->n++;
}

static struct bench_row cm_row(const char *case_name, const char *impl, struct cm_summary *s)
{
    struct bench_row row = bench_row_make(case_name, impl, 1);
    row.median_ns = bench_median(s->median, (size_t)s->n);
    row.p99_ns = bench_median(s->p99, (size_t)s->n);
    row.ops_per_s = bench_median(s->ops, (size_t)s->n);
    return row;
}

/* ---- curl.multi_throughput: sluice_curl_loop ------------------------------------------ */

struct cm_loop_run {
    struct sluice_curl_loop *loop;
    double *samples;
    size_t target, submitted, completed;
    long failures;
    int64_t submitted_at[CM_CONCURRENCY];
    CURL *easy[CM_CONCURRENCY];
    _Atomic(int) finished;
};

struct cm_slot {
    struct cm_loop_run *run;
    int index;
};

static void cm_loop_submit(struct cm_loop_run *run, struct cm_slot *slot);

/* On the loop thread: record, then keep the handle busy until the target is reached. */
static void cm_loop_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    (void)easy;
    struct cm_slot *slot = (struct cm_slot *)data;
    struct cm_loop_run *run = slot->run;
    run->failures += r->status != SLUICE_OK || r->http_status != 200;
    run->samples[run->completed++] = (double)(bench_now_ns() - run->submitted_at[slot->index]);
    if (run->submitted < run->target)
        cm_loop_submit(run, slot);
    else if (run->completed == run->target)
        atomic_store(&run->finished, 1);
}

static void cm_loop_submit(struct cm_loop_run *run, struct cm_slot *slot)
{
    struct sluice_curl_request req = {
        .backend = "sim", .easy = run->easy[slot->index], .done = cm_loop_done, .data = slot};
    run->submitted_at[slot->index] = bench_now_ns();
    run->submitted++;
    if (sluice_curl_loop_submit(run->loop, &req, NULL) != SLUICE_OK) {
        run->failures++;
        if (++run->completed == run->target)
            atomic_store(&run->finished, 1);
    }
}

static double cm_run_sluice(struct sluice_curl_loop *loop, CURL **easy, size_t n, double *samples,
                            long *failures)
{
    struct cm_loop_run run = {.loop = loop, .samples = samples, .target = n};
    struct cm_slot slots[CM_CONCURRENCY];
    memcpy(run.easy, easy, sizeof run.easy);
    atomic_init(&run.finished, 0);
    int64_t t0 = bench_now_ns();
    /* Submitted from here before the first completion can race them: only this thread
     * submits until every slot is busy, and completions resubmit on the loop thread. */
    struct sluice_curl_request req;
    memset(&req, 0, sizeof req);
    for (int i = 0; i < CM_CONCURRENCY; i++) {
        slots[i] = (struct cm_slot){&run, i};
        run.submitted_at[i] = bench_now_ns();
    }
    run.submitted = CM_CONCURRENCY;
    for (int i = 0; i < CM_CONCURRENCY; i++) {
        req = (struct sluice_curl_request){
            .backend = "sim", .easy = easy[i], .done = cm_loop_done, .data = &slots[i]};
        if (sluice_curl_loop_submit(loop, &req, NULL) != SLUICE_OK)
            cm_warn("curl.multi_throughput: a submission was refused");
    }
    while (!atomic_load(&run.finished)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    int64_t wall = bench_now_ns() - t0;
    *failures += run.failures;
    return (double)n / ((double)wall / 1e9);
}

/* ---- curl.multi_throughput: plain curl_multi ------------------------------------------ */

static void cm_caps(CURLM *multi)
{
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)CM_CONCURRENCY);
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)CM_CONCURRENCY);
    curl_multi_setopt(multi, CURLMOPT_MAX_CONCURRENT_STREAMS, 100L);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long)CM_CONCURRENCY);
}

static double cm_run_multi(CURLM *multi, CURL **easy, size_t n, double *samples, long *failures)
{
    int64_t submitted_at[CM_CONCURRENCY];
    size_t submitted = 0, completed = 0;
    int64_t t0 = bench_now_ns();
    for (int i = 0; i < CM_CONCURRENCY; i++) {
        curl_easy_setopt(easy[i], CURLOPT_PRIVATE, (void *)(intptr_t)i);
        submitted_at[i] = bench_now_ns();
        curl_multi_add_handle(multi, easy[i]);
        submitted++;
    }
    while (completed < n) {
        int running, queued;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(multi, &queued))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            CURL *e = msg->easy_handle;
            CURLcode code = msg->data.result;
            void *p = NULL;
            curl_easy_getinfo(e, CURLINFO_PRIVATE, &p);
            int i = (int)(intptr_t)p;
            long http = 0;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
            *failures += code != CURLE_OK || http != 200;
            curl_multi_remove_handle(multi, e);
            samples[completed++] = (double)(bench_now_ns() - submitted_at[i]);
            if (submitted < n) {
                submitted_at[i] = bench_now_ns();
                curl_multi_add_handle(multi, e);
                submitted++;
            }
        }
        if (completed < n)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int64_t wall = bench_now_ns() - t0;
    for (int i = 0; i < CM_CONCURRENCY; i++)
        curl_easy_setopt(easy[i], CURLOPT_PRIVATE, NULL);
    return (double)n / ((double)wall / 1e9);
}

static void cm_multi_throughput(const struct bench_opts *opts, struct sluice_engine *e,
                                const char *url)
{
    if (!bench_case_enabled(opts, "curl.multi_throughput"))
        return;
    size_t n = bench_iters(opts, 20000, 2000);
    double *samples = malloc(n * sizeof *samples);
    CURL *easy[2][CM_CONCURRENCY];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < CM_CONCURRENCY; i++)
            easy[k][i] = cm_easy(url);
    struct sluice_curl_loop *loop = NULL;
    struct sluice_curl_loop_desc ld = {.engine = e,
                                       .max_host_connections = CM_CONCURRENCY,
                                       .max_total_connections = CM_CONCURRENCY,
                                       .max_concurrent_streams = 100};
    CURLM *multi = curl_multi_init();
    if (!samples || !multi || sluice_curl_loop_create(&ld, &loop) != SLUICE_OK) {
        cm_warn("curl.multi_throughput: setup failed");
        free(samples);
        return;
    }
    cm_caps(multi);
    /* Warm both connection caches before timing. */
    long failures = 0;
    cm_run_sluice(loop, easy[0], CM_CONCURRENCY * 4, samples, &failures);
    cm_run_multi(multi, easy[1], CM_CONCURRENCY * 4, samples, &failures);
    struct cm_summary sl = {0}, cm = {0};
    int repeats = opts->repeats < CM_MAX_REPEATS ? opts->repeats : CM_MAX_REPEATS;
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < 2; k++) {
            if ((k + r) % 2 == 0) {
                double ops = cm_run_sluice(loop, easy[0], n, samples, &failures);
                cm_summarise(&sl, samples, n, ops);
            } else {
                double ops = cm_run_multi(multi, easy[1], n, samples, &failures);
                cm_summarise(&cm, samples, n, ops);
            }
        }
    }
    if (failures)
        cm_warn("curl.multi_throughput: some requests did not come back 200");
    struct bench_row srow = cm_row("curl.multi_throughput", "sluice", &sl);
    struct bench_row crow = cm_row("curl.multi_throughput", "curl_multi", &cm);
    bench_row_extra(&srow, "ratio_vs_curl_multi", srow.ops_per_s / crow.ops_per_s);
    bench_row_extra(&srow, "concurrency", CM_CONCURRENCY);
    bench_row_extra(&crow, "concurrency", CM_CONCURRENCY);
    bench_emit(&srow);
    bench_emit(&crow);
    sluice_curl_loop_destroy(loop);
    curl_multi_cleanup(multi);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < CM_CONCURRENCY; i++)
            curl_easy_cleanup(easy[k][i]);
    free(samples);
}

/* ---- curl.perform_overhead ------------------------------------------------------------ */

static double cm_run_perform(struct sluice_engine *e, CURL *easy, bool direct, size_t n,
                             double *samples, long *failures)
{
    int64_t t0 = bench_now_ns();
    for (size_t i = 0; i < n; i++) {
        int64_t s = bench_now_ns();
        long http = 0;
        if (direct) {
            *failures += curl_easy_perform(easy) != CURLE_OK;
            curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
        } else {
            struct sluice_curl_result r;
            *failures += sluice_curl_perform(e, "sim", easy, NULL, NULL, &r) != SLUICE_OK;
            http = r.http_status;
        }
        *failures += http != 200;
        samples[i] = (double)(bench_now_ns() - s);
    }
    return (double)n / ((double)(bench_now_ns() - t0) / 1e9);
}

static void cm_perform_overhead(const struct bench_opts *opts, struct sluice_engine *e,
                                const char *url)
{
    if (!bench_case_enabled(opts, "curl.perform_overhead"))
        return;
    size_t n = bench_iters(opts, 5000, 500);
    double *samples = malloc(n * sizeof *samples);
    CURL *mine = cm_easy(url), *direct = cm_easy(url);
    if (!samples) {
        cm_warn("curl.perform_overhead: setup failed");
        return;
    }
    long failures = 0;
    cm_run_perform(e, mine, false, 50, samples, &failures); /* connect and warm up */
    cm_run_perform(e, direct, true, 50, samples, &failures);
    struct cm_summary sl = {0}, cd = {0};
    int repeats = opts->repeats < CM_MAX_REPEATS ? opts->repeats : CM_MAX_REPEATS;
    for (int r = 0; r < repeats; r++) {
        for (int k = 0; k < 2; k++) {
            bool is_direct = (k + r) % 2 != 0;
            double ops =
                cm_run_perform(e, is_direct ? direct : mine, is_direct, n, samples, &failures);
            cm_summarise(is_direct ? &cd : &sl, samples, n, ops);
        }
    }
    if (failures)
        cm_warn("curl.perform_overhead: some calls did not come back 200");
    struct bench_row srow = cm_row("curl.perform_overhead", "sluice", &sl);
    struct bench_row drow = cm_row("curl.perform_overhead", "curl_easy_perform", &cd);
    bench_row_extra(&srow, "overhead_ns", srow.median_ns - drow.median_ns);
    bench_emit(&srow);
    bench_emit(&drow);
    curl_easy_cleanup(mine);
    curl_easy_cleanup(direct);
    free(samples);
}

static void curl_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "curl.multi_throughput") &&
        !bench_case_enabled(opts, "curl.perform_overhead"))
        return;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct sim_process sim;
    const char *args[] = {"--mode", "reject", "--cap", "100000", "--median-ms", "0", NULL};
    if (sim_process_start(&sim, args) != 0) {
        cm_warn("curl: the provider simulator did not start");
        return;
    }
    char url[96];
    sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
    struct sluice_backend_desc b = {.id = "sim", .active = CM_CONCURRENCY};
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e) ==
        SLUICE_OK) {
        cm_multi_throughput(opts, e, url);
        cm_perform_overhead(opts, e, url);
        sluice_engine_destroy(e);
    } else {
        cm_warn("curl: engine creation failed");
    }
    sim_process_stop(&sim);
}

BENCH_REGISTER(curl, curl_cases, false)

#endif /* SLUICE_BENCH_CURL */
