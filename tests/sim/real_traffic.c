/*
 * Discovery under the traffic real programs make (the real-traffic rows of
 * the robustness table, sluice-bench --only-discovery): blocking threads
 * whose 429s come back in a millisecond, a gateway that queues and then
 * answers 503 past its queue timeout, and callers that abandon calls the
 * provider keeps serving. Each holds its band on the first seeds of the
 * table's 300; the table has the rest.
 */
#include "sim_common.h"

#define RUN_S (5 * 60.0)

/* Where `cfg` locked, after RUN_S, and the lowest lock it ever took (0 = none). */
static uint32_t lock_of(struct sim_config cfg, uint32_t *lowest)
{
    struct scenario sc;
    scenario_start(&sc, cfg, default_desc());
    sim_run_until(sc.sim, RUN_S);
    uint32_t ceiling = scenario_status(&sc).ceiling;
    *lowest = 0;
    for (size_t i = 0; i < sc.trace.n; i++) {
        const struct sluice_event *ev = &sc.trace.ev[i];
        if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling && (!*lowest || ev->ceiling < *lowest))
            *lowest = ev->ceiling;
    }
    scenario_stop(&sc);
    return ceiling;
}

/* 64 blocking callers, 1 ms refusals, answers seen 2 ms late (a loaded client). */
static struct sim_config closed_loop(uint32_t cap, uint64_t seed)
{
    struct sim_config cfg = reject_config(cap, seed);
    cfg.median_s = 0.2;
    cfg.net_s = 0.001;
    cfg.workers = 64;
    cfg.retry_s = 0.001;
    cfg.client_lag_s = 0.002;
    return cfg;
}

Test(real_traffic, blocking_threads_with_fast_429s_lock_inside_the_cap, .timeout = 300)
{
    static const uint32_t caps[] = {16, 24, 52};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
        for (uint64_t seed = 1; seed <= 8; seed++) {
            uint32_t lowest, at = lock_of(closed_loop(caps[c], seed), &lowest);
            cr_expect(at >= 0.85 * caps[c] && at <= caps[c], "C=%u seed %" PRIu64 ": locked at %u",
                      caps[c], seed, at);
        }
}

/* C = 10, 100 ms calls, 503 after 100 ms or 300 ms in the queue. The target
 * is at most 1 of 100 seeds outside [0.8·C, 1.25·C]. A lock at 13 (1.3·C)
 * comes from one window at 13 that read within the knee by chance. With the
 * 100 ms timeout the 503s make the bracket, and latency knees at every later
 * visit lower the lock (SLUICE_DISCOVERY_KNEE_STRIKES). With 300 ms the knee
 * makes the bracket after 13 passed once on the way up, and a latency
 * bracket's last step in doubt steps down to measure instead of locking. */
Test(real_traffic, a_gateway_that_queues_then_refuses_locks_on_latency_not_on_its_503s,
     .timeout = 300)
{
    static const double timeouts[] = {0.1, 0.3}; /* one and three service times */
    static const int most_above[] = {1, 1};
    for (size_t t = 0; t < 2; t++) {
        int outside = 0;
        for (uint64_t seed = 1; seed <= SIM_SWEEP(100); seed++) {
            struct sim_config cfg = reject_config(10, seed);
            cfg.mode = SIM_QUEUE;
            cfg.median_s = 0.1;
            cfg.net_s = 0.002;
            cfg.queue_timeout_s = timeouts[t];
            cfg.queue_bound = 1u << 15;
            uint32_t lowest, at = lock_of(cfg, &lowest);
            cr_expect(at >= 8 && at <= 13, "queue timeout %.1f s, seed %" PRIu64 ": locked at %u",
                      timeouts[t], seed, at);
            if (at > 12.5) {
                outside++;
                cr_log_info("queue timeout %.1f s, seed %" PRIu64 ": locked at %u", timeouts[t],
                            seed, at);
            }
        }
        cr_expect_leq(outside, most_above[t], "queue timeout %.1f s: %d of %d seeds above 1.25·C",
                      timeouts[t], outside, SIM_SWEEP(100));
    }
}

/* Deadline-censored traffic: a 200 ms provider (σ 0.4) capped at 24 that
 * refuses nothing below its cap and does not slow down with load, and callers
 * whose deadline cuts 30% (247 ms) or 60% (181 ms) of the calls, measured at
 * their cut (censored samples, with lingering permits): discovery grows to
 * the cap and locks in [0.85·C, C] on every seed. (The robustness table has
 * these rows at C = 52 too; bench/RESULTS.md says where they miss.) */
Test(real_traffic, deadline_censored_calls_still_grow_discovery_to_the_cap, .timeout = 300)
{
    static const double deadlines[] = {0.247, 0.181};
    for (size_t d = 0; d < 2; d++)
        for (uint64_t seed = 1; seed <= 6; seed++) {
            struct sim_config cfg = closed_loop(24, seed);
            cfg.client_lag_s = 0;
            cfg.deadline_s = deadlines[d];
            cfg.linger = true;
            uint32_t lowest, at = lock_of(cfg, &lowest);
            cr_expect(at >= 0.85 * 24 && at <= 24,
                      "deadline %.0f ms, seed %" PRIu64 ": locked at %u (lowest %u)",
                      deadlines[d] * 1e3, seed, at, lowest);
        }
}

/* 250 ms deadlines against a 200 ms provider capped at 24: about 30% of the
 * calls are abandoned mid-transfer and keep their provider slot. */
Test(real_traffic, abandoned_calls_lingering_in_the_pool_never_lower_a_lock, .timeout = 300)
{
    for (uint64_t seed = 1; seed <= 6; seed++) {
        struct sim_config cfg = closed_loop(24, seed);
        cfg.client_lag_s = 0;
        cfg.deadline_s = 0.25;
        cfg.linger = true;
        uint32_t lowest, at = lock_of(cfg, &lowest);
        cr_expect(at >= 0.85 * 24 && at <= 24 && lowest >= 0.85 * 24,
                  "seed %" PRIu64 ": locked at %u, lowest lock %u", seed, at, lowest);
    }
    /* The control: without lingering the same callers drag the lock down. */
    struct sim_config cfg = closed_loop(24, 1);
    cfg.client_lag_s = 0;
    cfg.deadline_s = 0.25;
    uint32_t lowest;
    lock_of(cfg, &lowest);
    cr_expect(lowest < 0.85 * 24, "without lingering the lock should fall (lowest %u)", lowest);
}
