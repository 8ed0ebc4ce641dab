/*
 * The ceiling-discovery scoreboard (sluice-bench --discovery).
 *
 * Every row runs the virtual-time provider simulator (testkit/
 * provider_sim.h) for 30 simulated minutes with closed-loop callers that
 * always want more than the provider takes (2·C + 8 of them), and one
 * controller driving the real sluice gate:
 *
 *   discover, aimd, gradient, vegas   sluice's policies, inside sluice's
 *                                     discovery state machine (windows,
 *                                     bracket, lock, Retry-After holds)
 *   netflix_aimd                      Netflix concurrency-limits AIMDLimit,
 *                                     updated on every sample
 *   netflix_gradient2                 Netflix Gradient2Limit behind its
 *                                     WindowedLimit (>= 10 samples, windows of
 *                                     2 x min RTT, at least 1 s; the longest
 *                                     window is raised from 1 s to 30 s,
 *                                     else 2 s calls never fill one)
 *   vector_arc                        Vector's adaptive request concurrency
 *   static16, unlimited               fixed gate limits
 *   oracle                            a fixed limit equal to the true cap,
 *                                     following it when it changes
 *
 * The three peer baselines are written here from their published update
 * rules (READMEs, docs and source comments), not ported; they start from
 * sluice's jumpstart (5) and share its bounds [1, 1024] so only the update
 * rule differs. Retry-After is honoured only by sluice (the peers have no
 * such hold).
 *
 * Columns: true_cap (at the end), locked_ceiling (the lock for sluice
 * rows; the final limit for the rest), goodput_ratio (served calls over the
 * oracle's on the same seed), reject_share (429/503/timeouts over answered
 * calls), t90_s (seconds after the start, or after the cap change, until the
 * limit first reached 0.9·C — or, after a cut, first fell to C; -1 = never),
 * p50/p99_latency_s (end to end from the caller's view: gate wait,
 * provider queueing and retries included). Each number is the median over
 * opts->repeats seeds.
 *
 * Three scenarios model providers without a plain concurrency cap, each
 * with its own target (target_met: the share of seeds that met it):
 *   rate_r100        a sliding-window rate limit of 100 calls/s, 0.1 s calls
 *                    (R·L = 10 concurrent): the limit settles in [0.8, 2]·R·L
 *                    with at most 5% 429s after the first minute, and no
 *                    lock below 0.8·R·L
 *   slow_link        latency grows with every call in service, no cap, 1 s
 *                    client timeout: after the first 10 s at most 1% of
 *                    calls time out, and the second half's mean latency is at
 *                    most twice the unloaded one
 *   drop_timeout_c5  calls past cap 5 are silently dropped (1 s timeout):
 *                    locked in [0.85·C, C] within 60 simulated seconds
 * Their oracle is the best fixed limit (R·L; the load at twice the unloaded
 * latency; C).
 *
 * The robustness table (rows discovery.robust.<mode>_c<C>, after the
 * scoreboard) runs each policy and peer over many seeds — 300, or 30 with
 * --quick, or SLUICE_BENCH_SEEDS — per mode and cap: queue and knee at
 * C in {8, 12, 16, 24, 52, 200}, reject at {3, 8, 16, 52, 200}, queue with
 * streamed answers of lognormal length (sigma 1) at C in {8, 16, 52} with
 * the time to first token as the sample (queue_stream_ttft) and with the
 * whole call (queue_stream_whole), and the three scenarios above. Per
 * row: seeds, outside_band (seeds whose ceiling
 * — the lock, or the final limit where there is none — left [0.8·C,
 * 1.25·C], [0.85·C, C] in reject mode; for the scenarios, seeds that missed
 * their target), gp_median and gp_worst (served over the oracle's on the
 * same seed), p99_ratio (the median over seeds of p99 end-to-end latency
 * over the oracle's). Seeds run in parallel on every online CPU
 * (SLUICE_BENCH_THREADS to change); progress goes to stderr;
 * SLUICE_BENCH_IMPLS=discover,vegas keeps only the rows it names.
 *
 * The scenarios are in discovery_scenarios.c, the peers in
 * discovery_peers.c, one run in discovery_runner.c (discovery_bench.h is
 * what they share); this file is the scoreboard, discovery_robust.c the
 * robustness table and discovery_vector.c Vector's scenarios.
 */

#include <stdio.h>

#include "discovery_bench.h"

/* ---- the scoreboard ------------------------------------------------------------ */

#define MAX_REPEATS 16

struct summary {
    double ceiling, goodput, reject_share, t90_s, p50_s, p99_s, target_met;
};

static double median_of(double *v, int n)
{
    return bench_median(v, (size_t)n);
}

static struct summary summarise(struct result *runs, const double *oracle_served, int n)
{
    double c[MAX_REPEATS], g[MAX_REPEATS], rs[MAX_REPEATS], t[MAX_REPEATS], p50[MAX_REPEATS],
        p99[MAX_REPEATS];
    for (int i = 0; i < n; i++) {
        c[i] = runs[i].ceiling;
        g[i] = oracle_served[i] > 0 ? runs[i].served / oracle_served[i] : 0;
        rs[i] = runs[i].reject_share;
        /* "never" sorts last, so the median is -1 only if most runs never got there */
        t[i] = runs[i].t90_s < 0 ? 1e12 : runs[i].t90_s;
        p50[i] = runs[i].p50_s;
        p99[i] = runs[i].p99_s;
    }
    int met = 0;
    for (int i = 0; i < n; i++)
        met += runs[i].target_met;
    struct summary m = {median_of(c, n),   median_of(g, n),   median_of(rs, n),
                        median_of(t, n),   median_of(p50, n), median_of(p99, n),
                        (double)met / n};
    if (m.t90_s >= 1e12)
        m.t90_s = -1;
    return m;
}

static void emit(const struct scenario *sc, const struct impl *im, const struct summary *m)
{
    char name[64];
    snprintf(name, sizeof name, "discovery.%s", sc->name);
    struct bench_row row = bench_row_make(name, im->name, 1);
    double cap = sc->new_cap ? sc->new_cap : sc->cap;
    if (sc->target == TARGET_RATE)
        cap = sc->rate_per_s * round_trip_s(sc);
    else if (sc->oracle)
        cap = sc->oracle;
    bench_row_extra(&row, "true_cap", cap);
    bench_row_extra(&row, "locked_ceiling", m->ceiling);
    bench_row_extra(&row, "goodput_ratio", m->goodput);
    bench_row_extra(&row, "reject_share", m->reject_share);
    bench_row_extra(&row, "t90_s", m->t90_s);
    bench_row_extra(&row, "p50_latency_s", m->p50_s);
    bench_row_extra(&row, "p99_latency_s", m->p99_s);
    if (sc->target != TARGET_BAND)
        bench_row_extra(&row, "target_met", m->target_met);
    bench_emit(&row);
}

/* discover against every adaptive baseline: goodput x (1 - reject share), p99. */
static void verdict(const struct summary *all)
{
    const struct summary *d = &all[0];
    double score = d->goodput * (1 - d->reject_share);
    int behind = 0;
    for (size_t i = 1; i < N_IMPLS; i++) {
        if (impls[i].kind == IMPL_ORACLE)
            continue;
        double other = all[i].goodput * (1 - all[i].reject_share);
        bool worse_p99 = d->p99_s > all[i].p99_s * 1.05;
        /* Ahead means a better score, or an equal one (within 0.5%) with a p99 no worse. */
        if (other > score * 1.005 || (other >= score * 0.995 && worse_p99)) {
            printf("    discover not ahead of %-17s score %.3f vs %.3f, p99 %.2f s vs %.2f s\n",
                   impls[i].name, score, other, d->p99_s, all[i].p99_s);
            behind++;
        }
    }
    printf("    discover: score %.3f, p99 %.2f s (oracle %.2f s): %s\n", score, d->p99_s,
           all[N_IMPLS - 1].p99_s,
           behind ? "not ahead of every baseline" : "ahead of every baseline");
}

static void discovery_scoreboard(const struct bench_opts *opts)
{
    int repeats = opts->repeats < MAX_REPEATS ? opts->repeats : MAX_REPEATS;
    for (size_t k = 0; k < n_scenarios; k++) {
        const struct scenario *sc = &scenarios[k];
        char name[64];
        snprintf(name, sizeof name, "discovery.%s", sc->name);
        if (!bench_case_enabled(opts, name))
            continue;
        double oracle_served[MAX_REPEATS];
        struct result runs[N_IMPLS][MAX_REPEATS];
        for (int r = 0; r < repeats; r++)
            for (size_t i = 0; i < N_IMPLS; i++)
                runs[i][r] = run_one(sc, &impls[i], 1000 + 17 * (uint64_t)r);
        for (int r = 0; r < repeats; r++)
            oracle_served[r] = runs[N_IMPLS - 1][r].served;
        struct summary all[N_IMPLS];
        for (size_t i = 0; i < N_IMPLS; i++) {
            all[i] = summarise(runs[i], oracle_served, repeats);
            emit(sc, &impls[i], &all[i]);
        }
        verdict(all);
    }
}

/* Registered here, in the order the groups run and print: the scoreboard, the robustness
 * table, Vector's scenarios. */
BENCH_REGISTER(discovery, discovery_scoreboard, true)
BENCH_REGISTER(discovery_robust, discovery_robustness, true)
BENCH_REGISTER(discovery_vector, discovery_vector, true)
