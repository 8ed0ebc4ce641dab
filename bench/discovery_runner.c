/*
 * discovery_runner.c — one simulated run of a scenario by one controller:
 * the simulator configured from the scenario, the controller attached
 * (sluice's discovery with its policy, a peer, a fixed limit or the
 * oracle), an observer for the scenario's target, and the run's result.
 */
#include "discovery_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one run ------------------------------------------------------------------ */

const struct impl impls[N_IMPLS] = {
    {"discover", IMPL_SLUICE, NULL, 0},
    {"aimd", IMPL_SLUICE, NULL, 0},
    {"gradient", IMPL_SLUICE, NULL, 0},
    {"vegas", IMPL_SLUICE, NULL, 0},
    {"netflix_aimd", IMPL_PEER, netflix_aimd_sample, 0},
    {"netflix_gradient2", IMPL_PEER, netflix_gradient2_sample, 0},
    {"vector_arc", IMPL_PEER, vector_arc_sample, 0},
    {"static16", IMPL_FIXED, NULL, 16},
    {"unlimited", IMPL_FIXED, NULL, SLUICE_GATE_LIMIT_MAX},
    {"oracle", IMPL_ORACLE, NULL, 0},
};

static const double retry_ladder[] = {1.0, 2.0, 3.0, 5.0};

#define RATE_SETTLE_S 60.0 /* rate_r100: 429s count after this (settle_s overrides) */
#define SLOW_SETTLE_S 10.0 /* slow_link: timeouts count after this */
#define DROP_LOCK_S 60.0   /* drop_timeout_c5: locked by this */

/* What the scenario targets need from a run: every sample after a settle
 * time, and the lowest ceiling ever locked. Wraps the run's controller. */
struct observer {
    struct sim_controller inner;
    int64_t settle_ns, half_ns;
    double timeout_s;
    uint64_t n, overload, timeouts, late_ok;
    double late_latency_s; /* sum over late_ok: served calls in the second half */
    uint32_t lowest_lock;  /* 0 = never locked */
};

static void observer_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct observer *o = (struct observer *)ctx;
    if (now >= o->settle_ns) {
        o->n++;
        if (s->outcome == SLUICE_OUTCOME_OVERLOAD) {
            o->overload++;
            if ((double)s->latency_ns >= o->timeout_s * 1e9 - 1)
                o->timeouts++;
        }
    }
    if (now >= o->half_ns && s->outcome == SLUICE_OUTCOME_OK) {
        o->late_ok++;
        o->late_latency_s += (double)s->latency_ns / 1e9;
    }
    if (o->inner.on_sample)
        o->inner.on_sample(o->inner.ctx, s, now);
}

static int64_t observer_hold(void *ctx)
{
    struct observer *o = (struct observer *)ctx;
    return o->inner.hold_until ? o->inner.hold_until(o->inner.ctx) : 0;
}

void trace_event(const struct sluice_event *ev)
{
    if (getenv("SLUICE_BENCH_TRACE"))
        fprintf(stderr, "  %8.3f s %-8s %-16s %u -> %u (in flight %u, ceiling %u)\n",
                (double)ev->t_ns / 1e9, sluice_event_kind_name(ev->kind),
                sluice_cause_name(ev->cause), ev->old_limit, ev->new_limit, ev->in_flight,
                ev->ceiling);
}

static void observer_event(void *ctx, const struct sluice_event *ev)
{
    struct observer *o = (struct observer *)ctx;
    trace_event(ev);
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling &&
        (!o->lowest_lock || ev->ceiling < o->lowest_lock))
        o->lowest_lock = ev->ceiling;
}

static double run_s(const struct scenario *sc)
{
    return sc->run_s > 0 ? sc->run_s : RUN_S;
}

static void observer_attach(struct observer *o, struct sim *s, double settle_s, double end_s)
{
    o->inner = s->ctl;
    o->settle_ns = (int64_t)(settle_s * 1e9);
    o->half_ns = (int64_t)(end_s / 2 * 1e9);
    o->timeout_s = s->cfg.timeout_s;
    struct sim_controller c = {o, observer_sample, observer_hold, NULL};
    sim_set_controller(s, &c);
}

double round_trip_s(const struct scenario *sc)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.median_s = sc->median_s;
    cfg.sigma = sc->sigma;
    cfg.net_s = sc->net_s;
    sim_config_defaults(&cfg);
    return sim_round_trip_s(&cfg);
}

/* The band a locked ceiling must fall in: [0.85·C, C] against 429s (they
 * say exactly where C is), [0.8·C, 1.25·C] where only latency can. */
static bool in_band(const struct scenario *sc, double ceiling)
{
    double c = sc->new_cap ? sc->new_cap : sc->cap;
    bool refused = sc->mode == SIM_REJECT || sc->mode == SIM_DROP;
    return refused ? ceiling >= 0.85 * c && ceiling <= c : ceiling >= 0.8 * c && ceiling <= 1.25 * c;
}

static struct sluice_policy *make_policy(const char *name, union any_policy *storage)
{
    if (!strcmp(name, "aimd")) {
        sluice_policy_aimd_init(&storage->aimd, NULL, NULL, 0);
        return &storage->aimd.base;
    }
    if (!strcmp(name, "gradient")) {
        sluice_policy_gradient_init(&storage->gradient, NULL, NULL, 0);
        return &storage->gradient.base;
    }
    if (!strcmp(name, "vegas")) {
        sluice_policy_vegas_init(&storage->vegas, NULL, NULL, 0);
        return &storage->vegas.base;
    }
    return NULL; /* discover: discovery's default */
}

struct sluice_discovery_desc bench_desc(const char *node_id, const struct impl *im,
                                        union any_policy *storage, sluice_event_fn on_event,
                                        void *ctx)
{
    struct sluice_discovery_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.node_id = node_id;
    desc.policy = make_policy(im->name, storage);
    desc.jumpstart = JUMPSTART;
    desc.max_limit = MAX_LIMIT;
    desc.on_event = on_event;
    desc.on_event_ctx = ctx;
    return desc;
}

struct result run_one(const struct scenario *sc, const struct impl *im, uint64_t seed)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = seed;
    cfg.mode = sc->mode;
    cfg.cap = sc->cap;
    cfg.retry_after_s = sc->retry_after_s;
    cfg.median_s = sc->median_s;
    cfg.sigma = sc->sigma;
    cfg.net_s = sc->net_s;
    cfg.timeout_s = sc->timeout_s;
    cfg.rate_per_s = sc->rate_per_s;
    cfg.knee_slope = sc->slope;
    uint32_t most = sc->new_cap > sc->cap ? sc->new_cap : sc->cap;
    uint32_t oracle = sc->oracle ? sc->oracle : sc->cap;
    if (oracle > most)
        most = oracle;
    cfg.workers = sc->workers ? sc->workers : 2 * most + 8;
    cfg.queue_bound = sc->queue_bound ? sc->queue_bound : 2 * sc->cap;
    cfg.queue_timeout_s = sc->queue_timeout_s;
    cfg.retry_s = sc->retry_s;
    cfg.client_lag_s = sc->client_lag_s;
    cfg.deadline_s = sc->deadline_s;
    cfg.linger = sc->linger;
    cfg.read_on = sc->read_on;
    cfg.answer_tokens = sc->answer_tokens;
    cfg.answer_sigma = sc->answer_sigma;
    cfg.token_s = sc->token_s;
    cfg.sample_ttft = sc->sample_ttft;
    if (sc->retry_ladder) {
        cfg.retry_ladder = retry_ladder;
        cfg.n_retry_ladder = sizeof retry_ladder / sizeof retry_ladder[0];
    }
    cfg.gate_limit = im->kind == IMPL_FIXED    ? im->fixed_limit
                     : im->kind == IMPL_ORACLE ? oracle
                                               : JUMPSTART;
    struct sim *s = sim_create(&cfg);
    struct sluice_discovery *disc = NULL;
    union any_policy storage;
    struct peer peer;
    memset(&peer, 0, sizeof peer);
    struct observer obs;
    memset(&obs, 0, sizeof obs);
    if (im->kind == IMPL_SLUICE) {
        struct sluice_discovery_desc desc = bench_desc("cloud:bench", im, &storage, observer_event,
                                                       &obs);
        disc = sim_discovery(s, &desc, NULL);
    } else if (im->kind == IMPL_PEER) {
        peer.gate = &s->gate;
        peer.limit = JUMPSTART;
        peer.applied = JUMPSTART;
        peer.on_sample = im->peer_rule;
        struct sim_controller c = {&peer, peer_on_sample, NULL, NULL};
        sim_set_controller(s, &c);
    }
    observer_attach(&obs, s,
                    sc->target == TARGET_RATE ? (sc->settle_s > 0 ? sc->settle_s : RATE_SETTLE_S)
                                              : SLOW_SETTLE_S,
                    run_s(sc));
    sim_start(s);
    bool drop_locked = false;
    if (sc->target == TARGET_DROP) {
        sim_run_until(s, DROP_LOCK_S);
        if (disc) {
            struct sluice_discovery_status st;
            sluice_discovery_snapshot(disc, &st);
            drop_locked = st.state == SLUICE_DISCOVERY_LOCKED && in_band(sc, st.ceiling);
        }
    }
    if (sc->change_at_s > 0) {
        sim_run_until(s, sc->change_at_s);
        sim_set_cap(s, sc->new_cap);
        if (im->kind == IMPL_ORACLE)
            sluice_gate_set_limit(&s->gate, sc->new_cap);
        if (disc && sc->clear)
            sluice_discovery_clear(disc);
    }
    sim_run_until(s, run_s(sc));
    struct result r;
    uint32_t limit = sluice_gate_limit(&s->gate);
    if (disc) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(disc, &st);
        r.ceiling = st.ceiling;
    } else {
        r.ceiling = limit;
    }
    double ceiling_or_limit = r.ceiling > 0 ? r.ceiling : limit;
    double rl = sc->rate_per_s * round_trip_s(sc);
    switch (sc->target) {
    case TARGET_BAND:
        r.target_met = in_band(sc, ceiling_or_limit) &&
                       (!sc->deadline_s || !obs.lowest_lock || in_band(sc, obs.lowest_lock));
        break;
    case TARGET_RATE:
        r.target_met = limit >= 0.8 * rl &&
                       limit <= (sc->rate_band_hi > 0 ? sc->rate_band_hi : 2.0) * rl &&
                       (!obs.lowest_lock || obs.lowest_lock >= 0.8 * rl) &&
                       obs.overload <= (sc->refused_max > 0 ? sc->refused_max : 0.05) * (double)obs.n;
        break;
    case TARGET_SLOW:
        r.target_met = obs.timeouts <= 0.01 * (double)obs.n && obs.late_ok &&
                       obs.late_latency_s / (double)obs.late_ok <= 2.0 * round_trip_s(sc);
        break;
    case TARGET_DROP:
        r.target_met = drop_locked;
        break;
    }
    r.served = (double)s->stats.served;
    r.reject_share = sim_reject_share(s);
    r.t90_s = s->stats.t90_ns < 0 ? -1 : (double)s->stats.t90_ns / 1e9;
    r.p50_s = sim_e2e_percentile(s, 50);
    r.p99_s = sim_e2e_percentile(s, 99);
    sluice_discovery_destroy(disc);
    sim_destroy(s);
    return r;
}
