/*
 * gate_cancel_fire.c — gate.cancel_fire (described in gate_cases.c): N
 * waiters asleep on a held permit, cancelled through one shared token
 * ("sluice") or a token each ("own_tokens").
 */
#include "gate_bench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- gate.cancel_fire ------------------------------------------------------ */

#define GB_FIRE_WAITERS 3000
#define GB_FIRE_STACK (64 * 1024) /* waiter thread stacks: they only sleep */

struct gb_fire_run {
    struct sluice_gate *gate;
    _Atomic(int) returned;
};

struct gb_fire_waiter {
    struct gb_fire_run *run;
    struct sluice_cancel *token;
    int64_t returned_ns;
    int status;
};

static void *gb_fire_waiter_thread(void *arg)
{
    struct gb_fire_waiter *w = arg;
    w->status = sluice_gate_acquire(w->run->gate, NULL, w->token);
    w->returned_ns = bench_now_ns();
    atomic_fetch_add(&w->run->returned, 1);
    return NULL;
}

struct gb_fire_result {
    double median, p99, last, fire, per_s;
};

/* Start up to n waiters (fewer if threads run out), queue them all, cancel
 * them all; false if they did not all return ECANCELED in time. *started
 * says how many ran. */
static bool gb_fire_once(int n, bool shared, struct gb_fire_waiter *w, struct sluice_cancel *tokens,
                         pthread_t *tids, double *lat, int *started, struct gb_fire_result *out)
{
    struct gb_fire_run run = {.gate = gb_impl_sluice.create(1)};
    atomic_init(&run.returned, 0);
    if (sluice_gate_acquire(run.gate, NULL, NULL) != SLUICE_OK)
        abort();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, GB_FIRE_STACK);
    int k = 0;
    for (; k < n; k++) {
        sluice_cancel_init(&tokens[k]);
        w[k] = (struct gb_fire_waiter){&run, shared ? &tokens[0] : &tokens[k], 0, 1};
        if (pthread_create(&tids[k], &attr, gb_fire_waiter_thread, &w[k]) != 0)
            break;
    }
    pthread_attr_destroy(&attr);
    *started = k;
    bool ok = true;
    int64_t until = bench_now_ns() + 60 * INT64_C(1000000000);
    while (sluice_gate_stats(run.gate).waiting < (uint32_t)k && (ok = bench_now_ns() < until))
        gb_sleep_ns(1000000);
    gb_sleep_ns(20000000); /* the last arrivals get into the kernel */
    int64_t t0 = bench_now_ns();
    for (int i = 0; i < (shared ? 1 : k); i++)
        sluice_cancel_fire(&tokens[i]);
    int64_t fired = bench_now_ns();
    until = fired + 60 * INT64_C(1000000000);
    while (atomic_load(&run.returned) < k && (ok = bench_now_ns() < until))
        gb_sleep_ns(100000);
    if (!ok) { /* leave the stragglers: their gate, run and tokens leak */
        gb_warn("gate.cancel_fire %s: %d of %d waiters not back 60 s after the fire; abandoning",
                shared ? "sluice" : "own_tokens", k - atomic_load(&run.returned), k);
        for (int i = 0; i < k; i++)
            pthread_detach(tids[i]);
        return false;
    }
    int64_t last = t0;
    int wrong = 0;
    for (int i = 0; i < k; i++) {
        pthread_join(tids[i], NULL);
        lat[i] = (double)(w[i].returned_ns - t0);
        last = w[i].returned_ns > last ? w[i].returned_ns : last;
        wrong += w[i].status != SLUICE_ECANCELED;
    }
    if (wrong)
        gb_warn("gate.cancel_fire: %d of %d waiters returned something other than ECANCELED",
                wrong, k);
    sluice_gate_release(run.gate);
    char why[160];
    if (!gb_impl_sluice.quiet(run.gate, 1, why, sizeof why))
        gb_warn("gate.cancel_fire: gate not quiet after the run: %s", why);
    sluice_gate_destroy(run.gate);
    out->median = bench_median(lat, (size_t)k);
    out->p99 = bench_percentile(lat, (size_t)k, 99);
    out->last = (double)(last - t0);
    out->fire = (double)(fired - t0);
    out->per_s = out->last > 0 ? k * 1e9 / out->last : 0;
    return true;
}

void gb_case_cancel_fire(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "gate.cancel_fire"))
        return;
    int n = (int)bench_iters(opts, GB_FIRE_WAITERS, 50);
    int repeats = gb_repeats(opts);
    /* The tokens of abandoned runs may still be in use: never freed then. */
    struct gb_fire_waiter *w = calloc((size_t)n, sizeof *w);
    struct sluice_cancel *tokens = calloc((size_t)n, sizeof *tokens);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    double *lat = calloc((size_t)n, sizeof *lat);
    if (!w || !tokens || !tids || !lat)
        exit(1);
    static double med[2][GB_MAX_REPEATS], p99[2][GB_MAX_REPEATS], last[2][GB_MAX_REPEATS],
        fire[2][GB_MAX_REPEATS], per_s[2][GB_MAX_REPEATS];
    int ok[2] = {0, 0}, started = n;
    bool healthy = true;
    printf("  (cancel_fire: %d waiters asleep on one held permit; median/p99 = first fire to the "
           "last waiter back, over repetitions)\n",
           n);
    for (int r = 0; r < repeats && healthy; r++) {
        for (int k = 0; k < 2 && healthy; k++) {
            int impl = (k + r) % 2; /* 0: one shared token, 1: a token each */
            struct gb_fire_result res;
            int got;
            healthy = gb_fire_once(started, impl == 0, w, tokens, tids, lat, &got, &res);
            if (got < started) {
                printf("  (cancel_fire: only %d threads could start; using %d)\n", got, got);
                started = got;
            }
            if (healthy && got == started) {
                int j = ok[impl]++;
                med[impl][j] = res.median;
                p99[impl][j] = res.p99;
                last[impl][j] = res.last;
                fire[impl][j] = res.fire;
                per_s[impl][j] = res.per_s;
            }
        }
    }
    static const char *const names[2] = {"sluice", "own_tokens"};
    for (int i = 0; i < 2; i++) {
        struct bench_row row = bench_row_make("gate.cancel_fire", names[i], started);
        if (ok[i]) {
            row.median_ns = gb_median_of(last[i], ok[i]);
            row.p99_ns = bench_percentile(last[i], (size_t)ok[i], 99);
            row.ops_per_s = gb_median_of(per_s[i], ok[i]);
            bench_row_extra(&row, "wake_median_ns", gb_median_of(med[i], ok[i]));
            bench_row_extra(&row, "wake_p99_ns", gb_median_of(p99[i], ok[i]));
            bench_row_extra(&row, "fire_ns", gb_median_of(fire[i], ok[i]));
        }
        bench_emit(&row);
    }
    free(lat);
    if (healthy) {
        free(w);
        free(tokens);
        free(tids);
    }
}
