/*
 * The ceiling-discovery scoreboard (sluice-bench --discovery).
 *
 * Every row runs the virtual-time provider simulator (tests/sim/
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
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/policy/aimd.h>
#include <sluice/policy/gradient.h>
#include <sluice/policy/vegas.h>

#include "harness.h"
#include "sim/provider_sim.h"

#define JUMPSTART 5
#define MAX_LIMIT 1024

/* ---- scenarios ------------------------------------------------------------- */

struct scenario {
    const char *name;
    enum sim_mode mode;
    uint32_t cap;
    double retry_after_s;
    double change_at_s; /* 0 = the cap never changes */
    uint32_t new_cap;
    bool clear;         /* the operator clears discovery at the change */
};

static const struct scenario scenarios[] = {
    {"reject_c3", SIM_REJECT, 3, 0, 0, 0, false},
    {"reject_c16", SIM_REJECT, 16, 0, 0, 0, false},
    {"reject_c52", SIM_REJECT, 52, 0, 0, 0, false},
    {"reject_c52_retry_after", SIM_REJECT, 52, 2.0, 0, 0, false},
    {"reject_c200", SIM_REJECT, 200, 0, 0, 0, false},
    {"queue_c52", SIM_QUEUE, 52, 0, 0, 0, false},
    {"knee_c52", SIM_KNEE, 52, 0, 0, 0, false},
    {"cap_cut_52_to_20", SIM_REJECT, 52, 0, 600, 20, false},
    {"cap_raise_52_to_120", SIM_REJECT, 52, 0, 600, 120, true},
};

#define RUN_S (30 * 60.0)

/* ---- the peer baselines: their update rules, our code ----------------------- */

/* A baseline drives the sim's gate directly from each sample. */
struct peer {
    struct sluice_gate *gate;
    double limit; /* fractional where the rule keeps one */
    uint32_t applied;
    void (*on_sample)(struct peer *p, const struct sluice_sample *s, int64_t now);
    /* Netflix WindowedLimit state */
    int64_t next_update_ns;
    double win_rtt_sum, win_min_rtt;
    uint32_t win_n, win_max_inflight;
    bool win_drop;
    /* Gradient2 long-term average (ExpAvgMeasurement: warm-up mean, then EMA) */
    double long_rtt;
    uint32_t long_n;
    /* Vector ARC state */
    double past_mean, past_var;
    bool past_set;
    int64_t arc_next_ns;
    double cur_sum;
    uint32_t cur_n;
    bool had_back_pressure, reached_limit;
};

static void peer_apply(struct peer *p)
{
    if (p->limit < 1)
        p->limit = 1;
    if (p->limit > MAX_LIMIT)
        p->limit = MAX_LIMIT;
    uint32_t next = (uint32_t)p->limit;
    if (next != p->applied) {
        sluice_gate_set_limit(p->gate, next);
        p->applied = next;
    }
}

/*
 * Netflix AIMDLimit: on a drop (or an RTT past the 5 s timeout) the limit
 * becomes max(1, min(limit - 1, floor(limit * 0.9))); otherwise, when the
 * call started with in-flight * 2 >= limit, it grows by one. Per sample.
 */
static void netflix_aimd_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    (void)now;
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    double limit = floor(p->limit);
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD || s->latency_ns > 5 * SLUICE_NS_PER_SEC)
        p->limit = fmax(1, fmin(limit - 1, floor(limit * 0.9)));
    else if (s->in_flight_at_start * 2 >= limit)
        p->limit = limit + 1;
    peer_apply(p);
}

/*
 * Netflix Gradient2Limit behind WindowedLimit. A window collects samples
 * (drops included) and closes at its deadline, set when the previous one
 * closed to clamp(2 x that window's min RTT, 1 s, 30 s); a window with
 * fewer than 10 samples is dropped. Gradient2 sees a ready window's
 * average RTT and peak in-flight:
 *   long  = average of the first 10 windows, then an EMA over 600 windows;
 *           pulled down 10% when long > 2 x short
 *   skip when in-flight < limit / 2 (app-limited)
 *   g     = clamp(long / short, 0.5, 1)
 *   new   = limit * (1 - 0.2) + (g * limit + 4) * 0.2
 * Gradient2 does not react to drops themselves.
 */
static void netflix_gradient2_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    p->win_rtt_sum += (double)s->latency_ns;
    if (!p->win_n || (double)s->latency_ns < p->win_min_rtt)
        p->win_min_rtt = (double)s->latency_ns;
    p->win_n++;
    if (s->in_flight_at_start > p->win_max_inflight)
        p->win_max_inflight = s->in_flight_at_start;
    p->win_drop |= s->outcome == SLUICE_OUTCOME_OVERLOAD;
    if (now < p->next_update_ns)
        return;
    double short_rtt = p->win_n ? p->win_rtt_sum / p->win_n : 0;
    bool ready = p->win_n >= 10;
    uint32_t inflight = p->win_max_inflight;
    double span = fmin(fmax(2 * p->win_min_rtt, 1e9), 30e9);
    p->next_update_ns = now + (int64_t)span;
    p->win_rtt_sum = 0;
    p->win_n = p->win_max_inflight = 0;
    p->win_drop = false;
    if (!ready)
        return;
    if (p->long_n < 10)
        p->long_rtt = (p->long_rtt * p->long_n + short_rtt) / (p->long_n + 1);
    else
        p->long_rtt += (short_rtt - p->long_rtt) * (2.0 / 601.0);
    p->long_n++;
    if (p->long_rtt / short_rtt > 2)
        p->long_rtt *= 0.9;
    if (inflight < p->limit / 2)
        return;
    double g = fmax(0.5, fmin(1.0, p->long_rtt / short_rtt));
    double next = g * p->limit + 4;
    p->limit = p->limit * 0.8 + next * 0.2;
    peer_apply(p);
}

/*
 * Vector ARC. Every response: back pressure (429/503/timeout) is noted;
 * a served call's RTT joins the current mean. Once per interval (one past
 * mean RTT): if the limit was reached, there was no back pressure and the
 * current mean is at most the past mean, the limit grows by one; else, on
 * back pressure or a current mean at or past past_mean + 2.5 x past
 * deviation, it becomes floor(limit * 0.9). The past RTT is an EWMA
 * (alpha 0.4) with variance.
 */
static void vector_arc_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->in_flight_at_start >= p->applied)
        p->reached_limit = true;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD)
        p->had_back_pressure = true;
    if (s->outcome == SLUICE_OUTCOME_OK) {
        p->cur_sum += (double)s->latency_ns / 1e9;
        p->cur_n++;
    }
    double cur = p->cur_n ? p->cur_sum / p->cur_n : -1;
    if (!p->past_set) {
        if (cur >= 0) {
            p->past_mean = cur;
            p->past_var = 0;
            p->past_set = true;
            p->arc_next_ns = now + (int64_t)(cur * 1e9);
        }
        return;
    }
    if (now < p->arc_next_ns)
        return;
    double threshold = sqrt(p->past_var) * 2.5;
    if (p->limit < MAX_LIMIT && p->reached_limit && !p->had_back_pressure && cur >= 0 &&
        cur <= p->past_mean)
        p->limit = floor(p->limit) + 1;
    else if (p->limit > 1 && (p->had_back_pressure || cur >= p->past_mean + threshold))
        p->limit = fmax(1, floor(floor(p->limit) * 0.9));
    if (cur >= 0) {
        double diff = cur - p->past_mean, inc = 0.4 * diff;
        p->past_mean += inc;
        p->past_var = 0.6 * (p->past_var + diff * inc);
    }
    p->arc_next_ns = now + (int64_t)(p->past_mean * 1e9);
    p->cur_sum = 0;
    p->cur_n = 0;
    p->had_back_pressure = p->reached_limit = false;
    peer_apply(p);
}

static void peer_on_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct peer *p = (struct peer *)ctx;
    p->on_sample(p, s, now);
}

/* ---- one run ------------------------------------------------------------------ */

enum impl_kind { IMPL_SLUICE, IMPL_PEER, IMPL_FIXED, IMPL_ORACLE };

struct impl {
    const char *name;
    enum impl_kind kind;
    void (*peer_rule)(struct peer *, const struct sluice_sample *, int64_t);
    uint32_t fixed_limit;
};

static const struct impl impls[] = {
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
#define N_IMPLS (sizeof impls / sizeof impls[0])

struct result {
    double ceiling, served, reject_share, t90_s, p50_s, p99_s;
};

/* The policy prototype of a sluice row: discovery copies it into the node at
 * create, so it only has to live until sim_discovery returns. */
union any_policy {
    struct sluice_policy_aimd aimd;
    struct sluice_policy_gradient gradient;
    struct sluice_policy_vegas vegas;
};

static struct sluice_policy *make_policy(const char *name, union any_policy *storage)
{
    if (!strcmp(name, "aimd")) {
        sluice_policy_aimd_init(&storage->aimd, NULL, NULL);
        return &storage->aimd.base;
    }
    if (!strcmp(name, "gradient")) {
        sluice_policy_gradient_init(&storage->gradient, NULL, NULL);
        return &storage->gradient.base;
    }
    if (!strcmp(name, "vegas")) {
        sluice_policy_vegas_init(&storage->vegas, NULL, NULL);
        return &storage->vegas.base;
    }
    return NULL; /* discover: discovery's default */
}

static struct result run_one(const struct scenario *sc, const struct impl *im, uint64_t seed)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = seed;
    cfg.mode = sc->mode;
    cfg.cap = sc->cap;
    cfg.retry_after_s = sc->retry_after_s;
    uint32_t most = sc->new_cap > sc->cap ? sc->new_cap : sc->cap;
    cfg.workers = 2 * most + 8;
    cfg.queue_bound = 2 * sc->cap;
    cfg.gate_limit = im->kind == IMPL_FIXED    ? im->fixed_limit
                     : im->kind == IMPL_ORACLE ? sc->cap
                                               : JUMPSTART;
    struct sim *s = sim_create(&cfg);
    struct sluice_discovery *disc = NULL;
    union any_policy storage;
    struct peer peer;
    memset(&peer, 0, sizeof peer);
    if (im->kind == IMPL_SLUICE) {
        struct sluice_discovery_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.node_id = "cloud:bench";
        desc.policy = make_policy(im->name, &storage);
        desc.jumpstart = JUMPSTART;
        desc.max_limit = MAX_LIMIT;
        disc = sim_discovery(s, &desc, NULL);
    } else if (im->kind == IMPL_PEER) {
        peer.gate = &s->gate;
        peer.limit = JUMPSTART;
        peer.applied = JUMPSTART;
        peer.on_sample = im->peer_rule;
        struct sim_controller c = {&peer, peer_on_sample, NULL};
        sim_set_controller(s, &c);
    }
    sim_start(s);
    if (sc->change_at_s > 0) {
        sim_run_until(s, sc->change_at_s);
        sim_set_cap(s, sc->new_cap);
        if (im->kind == IMPL_ORACLE)
            sluice_gate_set_limit(&s->gate, sc->new_cap);
        if (disc && sc->clear)
            sluice_discovery_clear(disc);
    }
    sim_run_until(s, RUN_S);
    struct result r;
    if (disc) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(disc, &st);
        r.ceiling = st.ceiling;
    } else {
        r.ceiling = sluice_gate_limit(&s->gate);
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

/* ---- the scoreboard ------------------------------------------------------------ */

#define MAX_REPEATS 16

struct summary {
    double ceiling, goodput, reject_share, t90_s, p50_s, p99_s;
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
    struct summary m = {median_of(c, n), median_of(g, n), median_of(rs, n), median_of(t, n),
                        median_of(p50, n), median_of(p99, n)};
    if (m.t90_s >= 1e12)
        m.t90_s = -1;
    return m;
}

static void emit(const struct scenario *sc, const struct impl *im, const struct summary *m)
{
    char name[64];
    snprintf(name, sizeof name, "discovery.%s", sc->name);
    struct bench_row row = bench_row_make(name, im->name, 1);
    bench_row_extra(&row, "true_cap", sc->new_cap ? sc->new_cap : sc->cap);
    bench_row_extra(&row, "locked_ceiling", m->ceiling);
    bench_row_extra(&row, "goodput_ratio", m->goodput);
    bench_row_extra(&row, "reject_share", m->reject_share);
    bench_row_extra(&row, "t90_s", m->t90_s);
    bench_row_extra(&row, "p50_latency_s", m->p50_s);
    bench_row_extra(&row, "p99_latency_s", m->p99_s);
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
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
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

BENCH_REGISTER(discovery, discovery_scoreboard, true)
