/*
 * Discovery accuracy over many seeds, where only latency tells where the cap
 * is: a provider that queues past its cap (Ollama-like) and one that slows
 * down past it (knee). One seed says little: a policy can be right on three
 * seeds and wrong on one in eight (the old mean-based baseline was, at C =
 * 8 and 16). So each C runs a fixed set of seeds — the first of the 300 the
 * robustness table of sluice-bench --only-discovery runs — and at most 1%
 * of them may lock outside [0.8·C, 1.25·C] (none, for 50).
 */
#include "sim_common.h"

#define RUN_S (30 * 60.0)

/* Seeds 1..n against `mode` at cap C; returns how many locked outside the band. */
static int outside_band(enum sim_mode mode, uint32_t cap, int n)
{
    int outside = 0;
    for (int k = 0; k < n; k++) {
        struct sim_config cfg = reject_config(cap, 1 + (uint64_t)k);
        cfg.mode = mode;
        struct scenario sc;
        scenario_start(&sc, cfg, default_desc());
        sim_run_until(sc.sim, RUN_S);
        uint32_t ceiling = scenario_status(&sc).ceiling;
        if (ceiling < 0.8 * cap || ceiling > 1.25 * cap) {
            outside++;
            cr_log_info("%s C=%u seed %d: locked at %u", sim_mode_name(mode), cap, 1 + k, ceiling);
        }
        scenario_stop(&sc);
    }
    return outside;
}

static const struct {
    uint32_t cap;
    int seeds;
} sets[] = {{8, 100}, {12, 100}, {16, 100}, {24, 100}, {52, 50}};
#define N_SETS (sizeof sets / sizeof sets[0])

static void check(enum sim_mode mode)
{
    for (size_t i = 0; i < N_SETS; i++) {
        int outside = outside_band(mode, sets[i].cap, sets[i].seeds);
        cr_expect_leq(outside, sets[i].seeds / 100, "%s C=%u: %d of %d seeds outside [0.8C, 1.25C]",
                      sim_mode_name(mode), sets[i].cap, outside, sets[i].seeds);
    }
}

Test(robust, queueing_provider_locks_inside_the_band_for_99_percent_of_seeds, .timeout = 300)
{
    check(SIM_QUEUE);
}

Test(robust, knee_provider_locks_inside_the_band_for_99_percent_of_seeds, .timeout = 300)
{
    check(SIM_KNEE);
}

/* Every call the controller sees after `from_ns`: timeouts, and the latency
 * of the served ones after `half_ns`. Wraps the discovery controller. */
struct watch {
    struct sim_controller inner;
    int64_t from_ns, half_ns, timeout_ns;
    uint64_t calls, timeouts, late_ok;
    double late_latency_s;
};

static void watch_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct watch *w = (struct watch *)ctx;
    if (now >= w->from_ns) {
        w->calls++;
        w->timeouts += s->outcome == SLUICE_OUTCOME_OVERLOAD && s->latency_ns >= w->timeout_ns;
    }
    if (now >= w->half_ns && s->outcome == SLUICE_OUTCOME_OK) {
        w->late_ok++;
        w->late_latency_s += (double)s->latency_ns / SIM_NS;
    }
    w->inner.on_sample(w->inner.ctx, s, now);
}

static int64_t watch_hold(void *ctx)
{
    struct watch *w = (struct watch *)ctx;
    return w->inner.hold_until(w->inner.ctx);
}

/* Latency that grows with every call in service, no cap, 1 s client timeout
 * (the slow_link scenario of the scoreboard): after the first 10 s at most
 * 1% of calls time out, and the second half's latency is at most twice the
 * unloaded one. */
Test(robust, slow_link_keeps_timeouts_under_1_percent_and_latency_under_twice_unloaded,
     .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 20; seed++) {
        struct sim_config cfg = reject_config(9, seed);
        cfg.mode = SIM_SLOW;
        cfg.knee_slope = 1.0; /* twice the unloaded latency at 10 in service */
        cfg.median_s = 0.1;
        cfg.sigma = 0.5;
        cfg.net_s = 0.01;
        cfg.timeout_s = 1.0;
        cfg.workers = 2 * 10 + 8;
        struct scenario sc;
        scenario_start(&sc, cfg, default_desc());
        struct watch w = {sc.sim->ctl, 10 * (int64_t)SIM_NS, (int64_t)(RUN_S / 2 * SIM_NS),
                          (int64_t)(cfg.timeout_s * SIM_NS) - 1, 0, 0, 0, 0};
        struct sim_controller c = {&w, watch_sample, watch_hold};
        sim_set_controller(sc.sim, &c);
        sim_run_until(sc.sim, RUN_S);
        cr_expect_leq((double)w.timeouts, 0.01 * (double)w.calls,
                      "seed %" PRIu64 ": %" PRIu64 " of %" PRIu64 " calls timed out", seed,
                      w.timeouts, w.calls);
        cr_assert_gt(w.late_ok, 0, "seed %" PRIu64 ": nothing served", seed);
        double mean = w.late_latency_s / (double)w.late_ok;
        cr_expect_leq(mean, 2.0 * sc.rtt_s, "seed %" PRIu64 ": settled latency %.3f s, unloaded %.3f s",
                      seed, mean, sc.rtt_s);
        scenario_stop(&sc);
    }
}
