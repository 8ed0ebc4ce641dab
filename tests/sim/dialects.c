/*
 * What a provider says, in virtual time: the provider states its rate
 * (OpenAI's headers, as the shim classifies them), overloads its whole
 * platform (Anthropic's 529 bursts), or refuses for quota. The rows of the
 * issue's targets, over many seeds.
 */
#include "sim_common.h"

#define SEEDS 30

/* R·L = 10 and 40: 100 and 400 calls a second, ~0.1 s round trips (as rate_r100). */
static struct sim_config stated_rate_config(double rate, uint64_t seed)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = seed;
    cfg.mode = SIM_RATE;
    cfg.rate_per_s = rate;
    cfg.median_s = 0.075;
    cfg.sigma = 0.3;
    cfg.net_s = 0.02;
    cfg.states_rate = true;
    return cfg;
}

Test(dialects, a_stated_rate_starts_near_rate_times_latency_and_is_seldom_refused)
{
    static const double rates[] = {100, 400};
    for (size_t k = 0; k < 2; k++) {
        int near = 0, quiet = 0;
        double worst_share = 0, lo = 1e9, hi = 0;
        for (int seed = 0; seed < SEEDS; seed++) {
            struct sim_config cfg = stated_rate_config(rates[k], 100 + (uint64_t)seed);
            double rl = rates[k] * sim_round_trip_s(&cfg);
            cfg.workers = (uint32_t)(2 * rl) + 8;
            cfg.cap = (uint32_t)rl;
            struct scenario sc;
            scenario_start(&sc, cfg, default_desc());
            sim_run_until(sc.sim, 1.0);
            double first = sluice_gate_limit(&sc.sim->gate);
            near += first >= 0.75 * rl && first <= 1.25 * rl;
            lo = first < lo ? first : lo;
            hi = first > hi ? first : hi;
            sim_run_until(sc.sim, 60.0);
            double share = (double)sc.sim->stats.rejected / (double)sc.sim->stats.attempts;
            worst_share = share > worst_share ? share : worst_share;
            quiet += share <= 0.005;
            scenario_stop(&sc);
        }
        fprintf(stderr, "dialects: R.L=%.0f: limit at 1 s in [%.0f, %.0f] (%d/%d within 25%%), "
                        "refused in the first minute at most %.4f (%d/%d at most 0.5%%)\n",
                rates[k] * 0.0984, lo, hi, near, SEEDS, worst_share, quiet, SEEDS);
        cr_expect_eq(near, SEEDS, "R=%.0f: first limit within 25%% of R.L", rates[k]);
        cr_expect_eq(quiet, SEEDS, "R=%.0f: at most 0.5%% refused in the first minute", rates[k]);
    }
}

/* A node locked at C (restored from a store), callers saturating it. */
static void start_locked(struct scenario *sc, struct sim_config cfg, struct sluice_memstore **mem)
{
    cr_assert_eq(sluice_memstore_create(2, NULL, mem), SLUICE_OK);
    static struct sluice_store_ops ops;
    ops = sluice_memstore_ops(*mem);
    int64_t now_s = (int64_t)1.7e9; /* the sim's wall clock at virtual time 0 */
    struct sluice_lock_record rec = {
        .ceiling = cfg.cap, .expires_s = now_s + 86400, .locked_at_s = now_s - 60};
    cr_assert_eq(ops.save(ops.ctx, "cloud:default_ollama", &rec), SLUICE_OK);
    struct sluice_discovery_desc desc = default_desc();
    desc.store = &ops;
    scenario_start(sc, cfg, desc);
    cr_assert_eq(scenario_status(sc).ceiling, cfg.cap, "restored");
}

/* Every half second: the lowest the lock and the limit went. */
struct floor_watch {
    struct sluice_discovery *disc;
    uint32_t lowest_ceiling, lowest_limit;
};

static void watch_floor(struct sim *s, void *ctx)
{
    struct floor_watch *w = (struct floor_watch *)ctx;
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(w->disc, &st);
    uint32_t limit = sluice_gate_limit(&s->gate);
    w->lowest_ceiling = st.ceiling < w->lowest_ceiling ? st.ceiling : w->lowest_ceiling;
    w->lowest_limit = limit < w->lowest_limit ? limit : w->lowest_limit;
}

/* Run a locked node through `cfg`'s refusal spans for five minutes; how low it went. */
static struct floor_watch run_locked(struct sim_config cfg)
{
    struct sluice_memstore *mem;
    struct scenario sc;
    start_locked(&sc, cfg, &mem);
    struct floor_watch w = {sc.disc, UINT32_MAX, UINT32_MAX};
    sim_set_tick(sc.sim, 0.5, watch_floor, &w);
    sim_run_until(sc.sim, 300);
    cr_expect_gt(sc.sim->stats.rejected, 0, "the refusals came");
    scenario_stop(&sc);
    sluice_memstore_destroy(mem);
    return w;
}

Test(dialects, anthropic_529_bursts_under_a_lock_keep_the_lock_at_c_in_every_seed)
{
    static const uint32_t caps[] = {8, 24, 52};
    for (size_t k = 0; k < 3; k++) {
        int kept = 0;
        uint32_t lowest = UINT32_MAX;
        for (int seed = 0; seed < SEEDS; seed++) {
            struct sim_config cfg = reject_config(caps[k], 300 + (uint64_t)seed);
            /* 2 s of 529s every 30 s, from the first minute on. */
            cfg.platform_from_s = 60;
            cfg.platform_until_s = 62;
            cfg.platform_every_s = 30;
            struct floor_watch w = run_locked(cfg);
            kept += w.lowest_ceiling == caps[k];
            lowest = w.lowest_ceiling < lowest ? w.lowest_ceiling : lowest;
        }
        fprintf(stderr, "dialects: 529 bursts at C=%u: lock kept at C in %d/%d seeds (lowest %u)\n",
                caps[k], kept, SEEDS, lowest);
        cr_expect_eq(kept, SEEDS, "C=%u: a platform overload never lowers the lock", caps[k]);
    }
}

Test(dialects, a_quota_refusal_moves_neither_the_limit_nor_the_lock_in_any_seed)
{
    int still = 0;
    for (int seed = 0; seed < SEEDS; seed++) {
        struct sim_config cfg = reject_config(24, 400 + (uint64_t)seed);
        cfg.quota_from_s = 60; /* a minute of quota refusals */
        cfg.quota_until_s = 120;
        struct floor_watch w = run_locked(cfg);
        still += w.lowest_ceiling == 24 && w.lowest_limit == 24;
    }
    fprintf(stderr, "dialects: a minute of quota refusals at C=24: limit and lock unmoved in "
                    "%d/%d seeds\n", still, SEEDS);
    cr_expect_eq(still, SEEDS);
}
