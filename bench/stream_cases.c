/*
 * stream_cases.c — a streamed chat's first delta (sluice/client.h `stream`)
 * over loopback against sluice-provider-sim --stream --stream-stamp, whose
 * tokens carry the CLOCK_MONOTONIC time at which the simulator sent them.
 *
 * stream.first_delta  time from the simulator sending a call's first token
 *                     to the chat's on_delta seeing it, one call at a time,
 *                     through sluice_run (impl blocking: the calling
 *                     thread's curl_multi) and through sluice_chat_submit
 *                     (impl curl_loop: the loop's own thread). Rows: median
 *                     and p99 ns, calls per second; target_ns is the
 *                     issue's bound (1 ms). Medians across opts->repeats
 *                     repetitions, the two paths alternating.
 * Built only with the shim (SLUICE_BENCH_CURL); the simulator is started
 * and stopped here.
 */
#include "harness.h"

#ifdef SLUICE_BENCH_CURL

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/client.h>
#include <sluice/run.h>

#include "sluice-provider-sim/sim_process.h"

#define SD_MAX_REPEATS 64
#define SD_TARGET_NS 1e6

struct sd_call {
    int64_t first_ns; /* the first delta's delay; -1 = none yet */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
};

static void sd_delta(void *ctx, struct sluice_chat *chat, const char *text, size_t len)
{
    (void)chat;
    (void)len;
    struct sd_call *c = ctx;
    if (c->first_ns < 0)
        c->first_ns = bench_now_ns() - strtoll(text, NULL, 10);
}

static void sd_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    struct sd_call *c = data;
    pthread_mutex_lock(&c->mu);
    c->status = status;
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* One call on either path; its first delta's delay, or -1 when it failed. */
static double sd_one(struct sluice_engine *e, struct sluice_curl_loop *loop,
                     struct sluice_chat *chat, struct sd_call *c)
{
    c->first_ns = -1;
    int status;
    if (!loop) {
        status = sluice_run(e,
                            &(struct sluice_run_desc){.backend = "sim", .ops = &sluice_chat_ops,
                                                      .ctx = chat},
                            NULL);
    } else {
        c->done = false;
        status = sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){.backend = "sim",
                                                                  .done = sd_done,
                                                                  .data = c},
                                    NULL);
        pthread_mutex_lock(&c->mu);
        while (status == SLUICE_OK && !c->done)
            pthread_cond_wait(&c->cv, &c->mu);
        if (status == SLUICE_OK)
            status = c->status;
        pthread_mutex_unlock(&c->mu);
    }
    return status == SLUICE_OK && c->first_ns >= 0 ? (double)c->first_ns : -1;
}

struct sd_summary {
    double median[SD_MAX_REPEATS], p99[SD_MAX_REPEATS], ops[SD_MAX_REPEATS];
    int n;
};

static void sd_emit(const char *impl, struct sd_summary *s)
{
    struct bench_row row = bench_row_make("stream.first_delta", impl, 1);
    row.median_ns = bench_median(s->median, (size_t)s->n);
    row.p99_ns = bench_median(s->p99, (size_t)s->n);
    row.ops_per_s = bench_median(s->ops, (size_t)s->n);
    bench_row_extra(&row, "target_ns", SD_TARGET_NS);
    bench_emit(&row);
}

static void sd_run(const struct bench_opts *opts, struct sluice_engine *e, const char *base)
{
    struct sd_call c = {.first_ns = -1};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    struct sluice_chat *chat = NULL;
    struct sluice_curl_loop *loop = NULL;
    size_t n = bench_iters(opts, 1000, 100);
    double *samples = malloc(n * sizeof *samples);
    if (!samples ||
        sluice_chat_create(&(struct sluice_chat_desc){.base_url = base, .model = "m",
                                                      .prompt = "hi", .stream = true,
                                                      .on_delta = sd_delta, .delta_ctx = &c},
                           &chat) != SLUICE_OK ||
        sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop) !=
            SLUICE_OK) {
        printf("!!! WARNING stream.first_delta: setup failed\n");
        goto out;
    }
    for (int k = 0; k < 20; k++) /* connect and warm up both paths */
        sd_one(e, k % 2 ? loop : NULL, chat, &c);
    struct sd_summary blocking = {0}, on_loop = {0};
    long failures = 0;
    int repeats = opts->repeats < SD_MAX_REPEATS ? opts->repeats : SD_MAX_REPEATS;
    for (int r = 0; r < repeats; r++)
        for (int k = 0; k < 2; k++) {
            bool use_loop = (k + r) % 2 != 0;
            int64_t t0 = bench_now_ns();
            size_t got = 0;
            for (size_t i = 0; i < n; i++) {
                double d = sd_one(e, use_loop ? loop : NULL, chat, &c);
                if (d < 0)
                    failures++;
                else
                    samples[got++] = d;
            }
            double ops = (double)n / ((double)(bench_now_ns() - t0) / 1e9);
            struct sd_summary *s = use_loop ? &on_loop : &blocking;
            s->median[s->n] = got ? bench_median(samples, got) : -1;
            s->p99[s->n] = got ? bench_percentile(samples, got, 99.0) : -1;
            s->ops[s->n++] = ops;
        }
    if (failures)
        printf("!!! WARNING stream.first_delta: %ld calls failed\n", failures);
    sd_emit("blocking", &blocking);
    sd_emit("curl_loop", &on_loop);
out:
    sluice_curl_loop_destroy(loop);
    sluice_chat_destroy(chat);
    free(samples);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
}

static void stream_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "stream.first_delta"))
        return;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct sim_process sim;
    const char *args[] = {"--stream", "--stream-stamp", "--median-ms", "0", "--sigma", "0",
                          "--answer-tokens", "2", "--answer-sigma", "0", "--token-ms", "0",
                          "--token-bytes", "20", "--cap", "100000", NULL};
    if (sim_process_start(&sim, args) != 0) {
        printf("!!! WARNING stream.first_delta: the provider simulator did not start\n");
        return;
    }
    char base[96];
    sim_process_url(&sim, "/v1", base, sizeof base);
    struct sluice_backend_desc b = {.id = "sim", .active = 4};
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &b, .n_backends = 1}, &e) ==
        SLUICE_OK) {
        sd_run(opts, e, base);
        sluice_engine_destroy(e);
    }
    sim_process_stop(&sim);
}

BENCH_REGISTER(stream, stream_cases, false)

#endif /* SLUICE_BENCH_CURL */
