/*
 * Ceiling discovery against an Ollama-like provider that queues past its cap
 * (latency grows with the queue, 503 past a queue bound): only latency can
 * tell where the cap is.
 */
#include "sim_common.h"

Test(queue, locked_ceiling_is_within_80_to_125_percent_of_the_cap)
{
    static const uint32_t caps[] = {24, 52, 200};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        for (uint64_t seed = 1; seed <= 3; seed++) {
            struct sim_config cfg = reject_config(caps[i], 100 * i + seed);
            cfg.mode = SIM_QUEUE;
            struct scenario sc;
            scenario_start(&sc, cfg, default_desc());
            sim_run_until(sc.sim, 30 * 60);
            struct sluice_discovery_status st = scenario_status(&sc);
            cr_assert_neq(st.ceiling, 0, "C=%u seed %" PRIu64 ": never locked", caps[i], seed);
            cr_expect(st.ceiling >= 0.8 * caps[i] && st.ceiling <= 1.25 * caps[i],
                      "C=%u seed %" PRIu64 ": locked ceiling %u outside [0.8C, 1.25C]", caps[i],
                      seed, st.ceiling);
            scenario_stop(&sc);
        }
    }
}
