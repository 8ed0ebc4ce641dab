/*
 * discovery_bench.h — what the discovery bench's files share: a scenario
 * (one row of the scoreboard or the robustness table), the controllers a
 * row runs (impls: sluice's policies, the peers of discovery_peers.c, fixed
 * limits, the oracle) and one simulated run of a scenario by one of them
 * (discovery_runner.c). discovery_cases.c says what the bench measures.
 */
#ifndef SLUICE_BENCH_DISCOVERY_BENCH_H
#define SLUICE_BENCH_DISCOVERY_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sluice/policy/aimd.h>
#include <sluice/policy/gradient.h>
#include <sluice/policy/vegas.h>

#include "harness.h"
#include "provider_sim.h"

#define JUMPSTART 5
#define MAX_LIMIT 1024

/* ---- scenarios (discovery_scenarios.c) ----------------------------------------- */

#define RUN_S (30 * 60.0)

/* What a scenario must achieve, beyond the common columns. */
enum target { TARGET_BAND, TARGET_RATE, TARGET_SLOW, TARGET_DROP };

struct scenario {
    const char *name;
    enum sim_mode mode;
    uint32_t cap;       /* C; rate mode: R·L rounded; slow mode: the load scale */
    double retry_after_s;
    double change_at_s; /* 0 = the cap never changes */
    uint32_t new_cap;
    bool clear;         /* the operator clears discovery at the change */
    /* Provider and callers, 0 = the simulator's default. */
    double median_s, sigma, net_s, timeout_s, rate_per_s, slope;
    uint32_t oracle;    /* the oracle's limit when it is not the cap (0 = the cap) */
    enum target target;
    /* Real traffic (0 = the table's usual callers: 2·C + 8 of them, retrying
     * after 0.5 s, answers seen at once). */
    uint32_t workers;       /* closed-loop callers */
    double retry_s;         /* retry delay after a refusal */
    double client_lag_s;    /* a loaded client machine: mean delay before an answer is seen */
    double queue_timeout_s; /* queue mode: 503 to a call that waited this long */
    uint32_t queue_bound;   /* queue mode: 503 past this many waiting (0 = 2·C) */
    bool retry_ladder;      /* retry after 1, 2, 3, then every 5 s (SDK retry loops) */
    double settle_s;        /* TARGET_RATE: refusals count after this (0 = 60 s) */
    double rate_band_hi;    /* TARGET_RATE: the limit settles under this times R·L (0 = 2) */
    double refused_max;     /* TARGET_RATE: the share of refusals allowed (0 = 5%) */
    double run_s;           /* simulated seconds (0 = RUN_S) */
    double deadline_s;      /* callers abandon a call unanswered this long (0 = never); the
                               band then also holds every lock ever taken (none lowered) */
    bool linger;            /* an abandoned call's permit lingers, as a pool's does */
    bool read_on;           /* ... and its answer is read on (provider_sim.h, "abandons") */
    /* Streamed answers (provider_sim.h "streams"; 0 = not streamed): median_s is then the
     * time to first token. */
    double answer_tokens, answer_sigma, token_s;
    bool sample_ttft;       /* discovery's sample is the time to first token */
};

/* The scoreboard's rows, then the real-traffic rows (robustness table only). */
extern const struct scenario scenarios[];
extern const size_t n_scenarios;
extern const struct scenario real_traffic[];
extern const size_t n_real_traffic;

/* ---- the peer baselines (discovery_peers.c) --------------------------------------- */

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
    bool round_us; /* Vector's tests round the current mean RTT to 1 µs (else a constant
                      link's mean reads an ulp above the past one, a decrease) */
};

void netflix_aimd_sample(struct peer *p, const struct sluice_sample *s, int64_t now);
void netflix_gradient2_sample(struct peer *p, const struct sluice_sample *s, int64_t now);
void vector_arc_sample(struct peer *p, const struct sluice_sample *s, int64_t now);
/* A sim_controller's on_sample: `ctx` is the struct peer. */
void peer_on_sample(void *ctx, const struct sluice_sample *s, int64_t now);

/* ---- one run (discovery_runner.c) ------------------------------------------------- */

enum impl_kind { IMPL_SLUICE, IMPL_PEER, IMPL_FIXED, IMPL_ORACLE };

struct impl {
    const char *name;
    enum impl_kind kind;
    void (*peer_rule)(struct peer *, const struct sluice_sample *, int64_t);
    uint32_t fixed_limit;
};
/* discover, aimd, gradient, vegas, the three peers, static16, unlimited and,
 * last, the oracle. */
#define N_IMPLS ((size_t)10)
extern const struct impl impls[N_IMPLS];

struct result {
    double ceiling, served, reject_share, t90_s, p50_s, p99_s;
    bool target_met; /* the scenario's target (TARGET_BAND: ceiling in the band) */
};

/* The policy prototype of a sluice row: discovery copies it into the node at
 * create, so it only has to live until sim_discovery returns. */
union any_policy {
    struct sluice_policy_aimd aimd;
    struct sluice_policy_gradient gradient;
    struct sluice_policy_vegas vegas;
};

/* The description of a sluice row's discovery: `im`'s policy (in `storage`),
 * sluice's jumpstart and bounds, its events to `on_event`. */
struct sluice_discovery_desc bench_desc(const char *node_id, const struct impl *im,
                                        union any_policy *storage, sluice_event_fn on_event,
                                        void *ctx);
/* The unloaded round trip of a scenario's provider. */
double round_trip_s(const struct scenario *sc);
/* With SLUICE_BENCH_TRACE set, a discovery event on stderr: why the limit moved, for whoever
 * tunes it (run one row with SLUICE_BENCH_SEEDS=1 and SLUICE_BENCH_IMPLS=discover). */
void trace_event(const struct sluice_event *ev);
/* One simulated run of `sc` driven by `im`. */
struct result run_one(const struct scenario *sc, const struct impl *im, uint64_t seed);

/* ---- the robustness table (discovery_robust.c) ------------------------------------ */

/* Every policy and peer that learns a limit (not the fixed rows); only those
 * named in SLUICE_BENCH_IMPLS (comma-separated) when it is set. */
bool robust_impl(const struct impl *im);
/* Seeds per row: SLUICE_BENCH_SEEDS, else 300 scaled by --quick. */
int robust_seeds(const struct bench_opts *opts);
void discovery_robustness(const struct bench_opts *opts);

/* ---- Vector's scenarios (discovery_vector.c) -------------------------------------- */

void discovery_vector(const struct bench_opts *opts);

#endif
