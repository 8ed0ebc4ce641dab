/*
 * discovery_vector.c — Vector's adaptive-concurrency scenarios
 * (testkit/vector_sim.h) for every policy and peer, both placements, and a
 * rate limit with retrying clients (rows discovery.vector.*).
 */
#include "discovery_bench.h"
#include "vector_sim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Vector's adaptive-concurrency scenarios ---------------------------------- */

/* Vector's controller starts at its initial_concurrency (1) in its own
 * scenarios; the other peers at sluice's jumpstart, as in the table above. */
#define VECTOR_SEEDS 10
#define VECTOR_RUN_S 3600.0

/* The lowest ceiling discovery locked during a run (0 = none). */
static void vector_lock_event(void *ctx, const struct sluice_event *ev)
{
    uint32_t *lowest = (uint32_t *)ctx;
    trace_event(ev);
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling && (!*lowest || ev->ceiling < *lowest))
        *lowest = ev->ceiling;
}

struct vector_result {
    int met;
    uint32_t ceiling, lowest_lock; /* sluice rows: the lock at the end and the lowest taken */
    uint32_t limit;                /* the gate's limit at the end */
    double refused_share;          /* attempts deferred or timed out */
};

/* One run of `params` driven by `im` (a fixed limit when params->fixed). */
static struct vector_result vector_run(const struct vsim_scenario *sc,
                                       const struct vsim_params *params, const struct impl *im,
                                       uint64_t seed, FILE *log)
{
    struct vector_result r;
    memset(&r, 0, sizeof r);
    bool arc = im && im->peer_rule == vector_arc_sample;
    struct vsim *s = vsim_create(params, seed, arc ? 1 : JUMPSTART);
    struct sluice_discovery *disc = NULL;
    union any_policy storage;
    struct peer peer;
    memset(&peer, 0, sizeof peer);
    if (!params->fixed && im->kind == IMPL_SLUICE) {
        struct sluice_discovery_desc desc = bench_desc("cloud:vector", im, &storage,
                                                       vector_lock_event, &r.lowest_lock);
        disc = vsim_discovery(s, &desc);
    } else if (!params->fixed && im->kind == IMPL_PEER) {
        peer.gate = &s->gate;
        peer.limit = peer.applied = arc ? 1 : JUMPSTART;
        peer.on_sample = im->peer_rule;
        peer.round_us = true;
        struct sim_controller c = {&peer, peer_on_sample, NULL, NULL};
        s->ctl = c;
    }
    vsim_run(s, VECTOR_RUN_S);
    r.met = sc ? vsim_score(sc, s, log) : 0;
    r.limit = sluice_gate_limit(&s->gate);
    if (disc) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(disc, &st);
        r.ceiling = st.ceiling;
    }
    r.refused_share = s->attempts ? (double)s->refused / (double)s->attempts : 0;
    sluice_discovery_destroy(disc);
    vsim_destroy(s);
    return r;
}

/* Per scenario file, placement and impl: expectations met on seed 1, and on
 * the worst of VECTOR_SEEDS seeds (SLUICE_BENCH_VERBOSE=1: the misses). */
static void vector_scenarios(const struct bench_opts *opts)
{
    static const char *const placements[] = {"hold", "attempt"};
    FILE *log = getenv("SLUICE_BENCH_VERBOSE") ? stderr : NULL;
    for (size_t k = 0; k < VSIM_N_SCENARIOS; k++) {
        const struct vsim_scenario *sc = &vsim_scenarios[k];
        for (int pl = 0; pl < 2; pl++) {
            char name[96];
            snprintf(name, sizeof name, "discovery.vector.%s.%s", sc->name, placements[pl]);
            if (!bench_case_enabled(opts, name))
                continue;
            struct vsim_params params = sc->params;
            params.placement = pl ? VSIM_ATTEMPT : VSIM_HOLD;
            for (size_t i = 0; i < N_IMPLS; i++) {
                if (params.fixed ? i != 0 : !robust_impl(&impls[i]))
                    continue;
                int first = 0, worst = VSIM_MAX_EXPECT;
                for (uint64_t seed = 1; seed <= VECTOR_SEEDS; seed++) {
                    if (log)
                        fprintf(log, "[%s %s seed %" PRIu64 "]\n", name, impls[i].name, seed);
                    struct vector_result r = vector_run(sc, &params, &impls[i], seed, log);
                    first = seed == 1 ? r.met : first;
                    worst = r.met < worst ? r.met : worst;
                }
                struct bench_row row =
                    bench_row_make(name, params.fixed ? "fixed10" : impls[i].name, 1);
                bench_row_extra(&row, "expected", vsim_n_expect(sc));
                bench_row_extra(&row, "met_seed1", first);
                bench_row_extra(&row, "met_worst", worst);
                bench_row_extra(&row, "fair", sc->fair);
                bench_emit(&row);
            }
        }
    }
}

/* A rate limit of 100 attempts a second (refused ones count), 0.1 s calls
 * (R·L = 10), retrying clients, an hour's worth of calls: every seed's lock
 * inside [0.8, 1.25]·R·L and none ever below. Retries in lockstep (constant
 * latency, no jitter) and jittered (JitterMode::Full). */
static void vector_rate_retrying(const struct bench_opts *opts)
{
    static const char *const modes[] = {"lockstep", "jittered"};
    int seeds = robust_seeds(opts) < 30 ? robust_seeds(opts) : 30;
    for (int j = 0; j < 2; j++)
        for (int pl = 0; pl < 2; pl++) {
            char name[96];
            snprintf(name, sizeof name, "discovery.vector.rate_retrying_%s.%s", modes[j],
                     pl ? "attempt" : "hold");
            if (!bench_case_enabled(opts, name))
                continue;
            struct vsim_params params = {.requests = 60000, .delay_s = 0.1,
                                         .rate = {.limit = 100}, .retry_jitter = j == 1,
                                         .placement = pl ? VSIM_ATTEMPT : VSIM_HOLD};
            for (size_t i = 0; i < N_IMPLS; i++) {
                if (!robust_impl(&impls[i]))
                    continue;
                int outside = 0;
                uint32_t low = UINT32_MAX, high = 0;
                double refused = 0;
                for (int k = 0; k < seeds; k++) {
                    struct vector_result r = vector_run(NULL, &params, &impls[i], 1 + (uint64_t)k,
                                                        NULL);
                    uint32_t at = r.ceiling ? r.ceiling : r.limit;
                    bool ok = at >= 8 && at <= 12.5 && (!r.lowest_lock || r.lowest_lock >= 8);
                    if (!ok && !strcmp(impls[i].name, "discover"))
                        fprintf(stderr, "  [vector] %s discover seed %d: at %u, lowest lock %u\n",
                                name, k + 1, at, r.lowest_lock);
                    outside += !ok;
                    low = at < low ? at : low;
                    high = at > high ? at : high;
                    refused += r.refused_share / seeds;
                }
                struct bench_row row = bench_row_make(name, impls[i].name, 1);
                bench_row_extra(&row, "seeds", seeds);
                bench_row_extra(&row, "outside_band", outside);
                bench_row_extra(&row, "lowest", low);
                bench_row_extra(&row, "highest", high);
                bench_row_extra(&row, "refused_share", refused);
                bench_emit(&row);
            }
        }
}

void discovery_vector(const struct bench_opts *opts)
{
    vector_scenarios(opts);
    vector_rate_retrying(opts);
}
