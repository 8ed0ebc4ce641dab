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

/* Streamed answers as bench/discovery_cases.c's queue_stream rows have them: 0.3 s to the
 * first token, then a median of 100 tokens (lognormal sigma 1) at 20 ms each. */
static void stream_answers(struct sim_config *cfg, bool sample_ttft)
{
    cfg->median_s = 0.3;
    cfg->answer_tokens = 100;
    cfg->answer_sigma = 1.0;
    cfg->token_s = 0.02;
    cfg->sample_ttft = sample_ttft;
}

/* Seeds 1..n against `mode` at cap C (answers streamed when `streamed`, sampled at their
 * first token when `ttft`); returns how many locked outside the band. */
static int outside_band_of(enum sim_mode mode, uint32_t cap, int n, bool streamed, bool ttft)
{
    int outside = 0;
    for (int k = 0; k < n; k++) {
        struct sim_config cfg = reject_config(cap, 1 + (uint64_t)k);
        cfg.mode = mode;
        if (streamed)
            stream_answers(&cfg, ttft);
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

static int outside_band(enum sim_mode mode, uint32_t cap, int n)
{
    return outside_band_of(mode, cap, n, false, false);
}

static const struct {
    uint32_t cap;
    int seeds;
} sets[] = {{8, 100}, {12, 100}, {16, 100}, {24, 100}, {52, 50}};
#define N_SETS (sizeof sets / sizeof sets[0])

static void check(enum sim_mode mode)
{
    for (size_t i = 0; i < N_SETS; i++) {
        int outside = outside_band(mode, sets[i].cap, SIM_SWEEP(sets[i].seeds));
        cr_expect_leq(outside, sets[i].seeds / 100, "%s C=%u: %d of %d seeds outside [0.8C, 1.25C]",
                      sim_mode_name(mode), sets[i].cap, outside, SIM_SWEEP(sets[i].seeds));
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

/* Streamed answers whose length varies tenfold (lognormal sigma 1), at the caps and seeds
 * below. Whole-call samples carry that length as noise; the time to first token (the chat
 * client's sample for a stream) carries only the queue and the first token. Measured here
 * with the windows timed by the calls' durations (sluice/discovery.h, "Windows"; before
 * that, every TTFT run stayed at the jumpstart: 250 of 250 seeds outside the band):
 *   C     whole call   first token   (seeds outside [0.8C, 1.25C], of 100)
 *   8     2            0
 *   12    8            0
 *   16    8            2
 *   24    6            2
 *   52    5            2
 * (not streamed, the same seeds: 0, 0, 0, 1, 0). */
static const struct {
    uint32_t cap;
    int seeds;
} streamed[] = {{8, 100}, {16, 100}, {52, 50}};

Test(robust, streamed_answers_lock_in_the_band_on_ttft_samples_more_often_than_on_whole_calls,
     .timeout = 300)
{
    for (size_t i = 0; i < sizeof streamed / sizeof streamed[0]; i++) {
        int seeds = SIM_SWEEP(streamed[i].seeds);
        int ttft = outside_band_of(SIM_QUEUE, streamed[i].cap, seeds, true, true);
        int whole = outside_band_of(SIM_QUEUE, streamed[i].cap, seeds, true, false);
        cr_log_info("streamed C=%u: outside the band on %d (first token) and %d (whole call) of "
                    "%d seeds",
                    streamed[i].cap, ttft, whole, seeds);
        cr_expect_leq(ttft, whole, "C=%u: first-token samples did worse (%d) than whole calls (%d)",
                      streamed[i].cap, ttft, whole);
        cr_expect_leq(ttft, streamed[i].seeds / 50, "C=%u: %d of %d seeds outside the band",
                      streamed[i].cap, ttft, seeds);
    }
}

/* Two seeds of the 1000-seed sweep where slow start's first levels looked
 * queued by noise, against a reference of one window: the cut there became
 * a latency bracket, and a queueing provider with 200 slots locked at 8
 * (seed 629; seed 459 did at 17 in a draft of the fix). Against an
 * unsampled reference that cut is only a probe now. */
Test(robust, queueing_provider_at_200_is_not_bracketed_by_its_first_levels_noise, .timeout = 60)
{
    static const uint64_t seeds[] = {459, 629};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        struct sim_config cfg = reject_config(200, seeds[i]);
        cfg.mode = SIM_QUEUE;
        struct scenario sc;
        scenario_start(&sc, cfg, default_desc());
        sim_run_until(sc.sim, RUN_S);
        uint32_t ceiling = scenario_status(&sc).ceiling;
        cr_expect(ceiling >= 160 && ceiling <= 250, "seed %" PRIu64 ": locked at %u", seeds[i],
                  ceiling);
        scenario_stop(&sc);
    }
}

/* A provider that refuses past its cap says where the cap is by refusing;
 * latency there is noise. Slow start's first levels can still look queued
 * by chance, and a probe of the reference taken there would hold the limit
 * near the jumpstart for as long as the reference takes to sample: seed 38
 * spent a minute and a half at 5 (0.91 of the oracle's goodput at C = 200).
 * Every seed reaches 0.9·C within 100 s (about 45 round trips; 80 s at
 * worst, against 158 s with a probe on the first doubt). */
Test(robust, refusing_provider_reaches_90_percent_of_its_cap_within_100_s_on_every_seed,
     .timeout = 120)
{
    static const uint32_t caps[] = {16, 52, 200};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
        for (uint64_t seed = 1; seed <= 50; seed++) {
            struct scenario sc;
            scenario_start(&sc, reject_config(caps[c], seed), default_desc());
            sim_run_until(sc.sim, 100.0);
            int64_t t90 = sc.sim->stats.t90_ns;
            cr_expect(t90 >= 0, "C=%u seed %" PRIu64 ": limit still %u after 100 s (0.9·C = %u)",
                      caps[c], seed, sluice_discovery_limit(sc.disc), sc.sim->t90_target);
            scenario_stop(&sc);
        }
}

/* Every call the controller sees after `from_ns`: timeouts, and the latency
 * of the served ones after `half_ns`. Wraps the discovery controller. */
struct watch {
    struct sim_controller inner;
    int64_t from_ns, half_ns, timeout_ns;
    uint64_t calls, timeouts, late_ok, overloads;
    double late_latency_s;
};

static void watch_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct watch *w = (struct watch *)ctx;
    if (now >= w->from_ns) {
        w->calls++;
        w->timeouts += s->outcome == SLUICE_OUTCOME_OVERLOAD && s->latency_ns >= w->timeout_ns;
        w->overloads += s->outcome == SLUICE_OUTCOME_OVERLOAD;
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
                          (int64_t)(cfg.timeout_s * SIM_NS) - 1, 0, 0, 0, 0, 0};
        struct sim_controller c = {&w, watch_sample, watch_hold, NULL};
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

/* A provider that silently drops calls past cap 5; the client times out
 * after 1 s (drop_timeout_c5). A timeout counts against the limit its call
 * started under, however far the limit moved since: locked at C within 60
 * simulated seconds, on every seed. */
Test(robust, dropping_provider_locks_at_its_cap_within_60_s_on_every_seed, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 100; seed++) {
        struct sim_config cfg = reject_config(5, seed);
        cfg.mode = SIM_DROP;
        cfg.median_s = 0.05;
        cfg.sigma = 0.4;
        cfg.net_s = 0.02;
        cfg.timeout_s = 1.0;
        struct scenario sc;
        scenario_start(&sc, cfg, default_desc());
        sim_run_until(sc.sim, 60.0);
        struct sluice_discovery_status st = scenario_status(&sc);
        cr_expect(st.state == SLUICE_DISCOVERY_LOCKED && st.ceiling == 5,
                  "seed %" PRIu64 ": %s, ceiling %u after 60 s", seed,
                  sluice_discovery_state_name(st.state), st.ceiling);
        scenario_stop(&sc);
    }
}

/* A sliding-window rate limit of 100 calls a second, 0.1 s round trips:
 * R·L = 10 concurrent (rate_r100). Calls started after a cut keep getting
 * 429 until the window slides; that must not ratchet the limit down. After
 * the first minute, at most 5% of calls are refused, the limit sits in
 * [0.8, 2]·R·L, and no lock ever lands below 0.8·R·L. */
Test(robust, rate_limited_provider_settles_near_its_rate_times_latency, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct sim_config cfg = reject_config(10, seed);
        cfg.mode = SIM_RATE;
        cfg.rate_per_s = 100;
        cfg.median_s = 0.075;
        cfg.sigma = 0.3;
        cfg.net_s = 0.02;
        struct scenario sc;
        scenario_start(&sc, cfg, default_desc());
        struct watch w = {sc.sim->ctl, 60 * (int64_t)SIM_NS, INT64_MAX, INT64_MAX, 0, 0, 0, 0, 0};
        struct sim_controller c = {&w, watch_sample, watch_hold, NULL};
        sim_set_controller(sc.sim, &c);
        sim_run_until(sc.sim, 600.0);
        double rl = cfg.rate_per_s * sc.rtt_s;
        uint32_t limit = sluice_gate_limit(&sc.sim->gate);
        cr_expect(limit >= 0.8 * rl && limit <= 2.0 * rl,
                  "seed %" PRIu64 ": limit %u, R·L %.1f", seed, limit, rl);
        cr_expect_leq((double)w.overloads, 0.05 * (double)w.calls,
                      "seed %" PRIu64 ": %" PRIu64 " of %" PRIu64 " calls refused", seed,
                      w.overloads, w.calls);
        for (size_t i = 0; i < sc.trace.n; i++)
            if (sc.trace.ev[i].kind == SLUICE_EVENT_LOCK)
                cr_expect_geq(sc.trace.ev[i].new_limit, 0.8 * rl,
                              "seed %" PRIu64 ": locked at %u at t = %.1f s, R·L %.1f", seed,
                              sc.trace.ev[i].new_limit, (double)sc.trace.ev[i].t_ns / SIM_NS, rl);
        scenario_stop(&sc);
    }
}
