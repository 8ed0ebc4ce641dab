/*
 * discovery_scenarios.c — the discovery bench's scenarios: the scoreboard's
 * rows (also in the robustness table when they have a target of their own)
 * and the real-traffic rows of the robustness table. discovery_cases.c
 * describes each.
 */
#include "discovery_bench.h"

#define REAL_TRAFFIC_RUN_S (5 * 60.0) /* 0.1-0.2 s calls lock within seconds */

const struct scenario scenarios[] = {
    {.name = "reject_c3", .mode = SIM_REJECT, .cap = 3},
    {.name = "reject_c16", .mode = SIM_REJECT, .cap = 16},
    {.name = "reject_c52", .mode = SIM_REJECT, .cap = 52},
    {.name = "reject_c52_retry_after", .mode = SIM_REJECT, .cap = 52, .retry_after_s = 2.0},
    {.name = "reject_c200", .mode = SIM_REJECT, .cap = 200},
    {.name = "queue_c52", .mode = SIM_QUEUE, .cap = 52},
    {.name = "knee_c52", .mode = SIM_KNEE, .cap = 52},
    {.name = "cap_cut_52_to_20", .mode = SIM_REJECT, .cap = 52, .change_at_s = 600, .new_cap = 20},
    {.name = "cap_raise_52_to_120", .mode = SIM_REJECT, .cap = 52, .change_at_s = 600,
     .new_cap = 120, .clear = true},
    /* 100 calls/s over a sliding second; 0.1 s round trips: R·L = 10. */
    {.name = "rate_r100", .mode = SIM_RATE, .cap = 10, .median_s = 0.075, .sigma = 0.3,
     .net_s = 0.02, .rate_per_s = 100, .target = TARGET_RATE},
    /* The same window, constant 0.1 s latency and callers that retry a
     * refusal after 1, 2, 3, 5 s: R·L = 10, settled in [0.8, 1.25]·R·L with
     * at most 2% refusals after the first 30 s. */
    {.name = "rate_r100_retrying", .mode = SIM_RATE, .cap = 10, .median_s = 0.098,
     .sigma = 1e-9, .net_s = 0.002, .rate_per_s = 100, .target = TARGET_RATE,
     .retry_ladder = true, .settle_s = 30, .rate_band_hi = 1.25, .refused_max = 0.02},
    /* 0.1-0.5 s calls, twice the unloaded latency at 10 in service. */
    {.name = "slow_link", .mode = SIM_SLOW, .cap = 9, .median_s = 0.1, .sigma = 0.5,
     .net_s = 0.01, .timeout_s = 1.0, .slope = 1.0, .oracle = 10, .target = TARGET_SLOW},
    /* Latency proportional to load (S·(1 + (n−1)/3)): twice the unloaded at 4. */
    {.name = "slow_proportional", .mode = SIM_SLOW, .cap = 3, .median_s = 0.1, .sigma = 0.4,
     .net_s = 0.005, .timeout_s = 1.0, .slope = 1.0, .oracle = 4, .target = TARGET_SLOW},
    {.name = "drop_timeout_c5", .mode = SIM_DROP, .cap = 5, .median_s = 0.05, .sigma = 0.4,
     .net_s = 0.02, .timeout_s = 1.0, .target = TARGET_DROP},
};

/* Blocking threads against a provider that refuses in a millisecond: a
 * refused thread calls again at once, and a loaded client sees each answer
 * ~2 ms late, so its count of calls in flight runs ahead of the provider's. */
#define CLOSED_LOOP(n, c)                                                                           \
    {.name = "closed" #n "_reject", .mode = SIM_REJECT, .cap = c, .median_s = 0.2,                \
     .net_s = 0.001, .workers = n, .retry_s = 0.001, .client_lag_s = 0.002, .run_s = REAL_TRAFFIC_RUN_S}
/* A gateway that queues behind C slots, then answers 503 to a call that
 * waited longer than its queue timeout (HAProxy maxconn + timeout queue,
 * Ollama, vLLM): 100 ms calls, a timeout of one and of three of them. */
#define QUEUE_TIMEOUT(c, timeout, tag)                                                               \
    {.name = "queue503_" tag, .mode = SIM_QUEUE, .cap = c, .median_s = 0.1, .net_s = 0.002,       \
     .queue_timeout_s = timeout, .queue_bound = 1u << 15, .run_s = REAL_TRAFFIC_RUN_S}
/* A shallow knee (half the default slope: +25% at 1.25·C), 1 s timeout. */
#define SHALLOW_KNEE(c)                                                                               \
    {.name = "knee_shallow", .mode = SIM_KNEE, .cap = c, .median_s = 0.2, .net_s = 0.005,         \
     .timeout_s = 1.0, .slope = 1.0, .run_s = REAL_TRAFFIC_RUN_S}

/* Callers with a 250 ms deadline against a 200 ms provider: ~30% of calls
 * are abandoned mid-transfer, and the provider keeps serving them. With
 * lingering permits (the pool's default) a lock at C is never lowered by
 * them; without (the control row) it is. */
#define ABANDONED(tag, lingers)                                                                      \
    {.name = "abandoned_" tag, .mode = SIM_REJECT, .cap = 24, .median_s = 0.2, .net_s = 0.001,    \
     .workers = 64, .retry_s = 0.001, .deadline_s = 0.25, .linger = lingers,                       \
     .run_s = REAL_TRAFFIC_RUN_S}

/* Deadline-censored traffic: callers whose deadline cuts a share of the calls
 * (200 ms median, σ 0.4: a deadline of 247 ms cuts 30%, 181 ms 60%) against a
 * provider that refuses nothing below its cap and whose latency does not grow
 * with the limit: discovery must grow to the cap from the censored samples. */
#define CENSORED(c, deadline, tag)                                                                   \
    {.name = "censored" tag, .mode = SIM_REJECT, .cap = c, .median_s = 0.2,                \
     .sigma = 0.4, .net_s = 0.001, .workers = 2 * (c) + 16, .retry_s = 0.001,                     \
     .deadline_s = deadline, .linger = true, .run_s = REAL_TRAFFIC_RUN_S}
/* The same, with a transport that answers its caller at the deadline and reads
 * the answer on (the curl loop's read_on: sluice_chat_submit): the permit of a
 * cut call comes back with the provider's answer. */
#define CENSORED_READ_ON(c, deadline, tag)                                                           \
    {.name = "read_on" tag, .mode = SIM_REJECT, .cap = c, .median_s = 0.2, .sigma = 0.4,         \
     .net_s = 0.001, .workers = 2 * (c) + 16, .retry_s = 0.001, .deadline_s = deadline,           \
     .linger = true, .read_on = true, .run_s = REAL_TRAFFIC_RUN_S}

const struct scenario real_traffic[] = {
    CLOSED_LOOP(64, 16),  CLOSED_LOOP(64, 24),  CLOSED_LOOP(64, 52),
    CLOSED_LOOP(256, 16), CLOSED_LOOP(256, 24), CLOSED_LOOP(256, 52),
    QUEUE_TIMEOUT(10, 0.1, "t1x"), QUEUE_TIMEOUT(24, 0.1, "t1x"), QUEUE_TIMEOUT(48, 0.1, "t1x"),
    QUEUE_TIMEOUT(10, 0.3, "t3x"), QUEUE_TIMEOUT(24, 0.3, "t3x"), QUEUE_TIMEOUT(48, 0.3, "t3x"),
    SHALLOW_KNEE(10), SHALLOW_KNEE(20),
    ABANDONED("linger", true), ABANDONED("free", false),
    CENSORED(24, 0.247, "30"), CENSORED(24, 0.181, "60"),
    CENSORED(52, 0.247, "30"), CENSORED(52, 0.181, "60"),
    CENSORED_READ_ON(24, 0.247, "30"), CENSORED_READ_ON(24, 0.181, "60"),
    CENSORED_READ_ON(52, 0.247, "30"), CENSORED_READ_ON(52, 0.181, "60"),
};

const size_t n_scenarios = sizeof scenarios / sizeof scenarios[0];
const size_t n_real_traffic = sizeof real_traffic / sizeof real_traffic[0];
