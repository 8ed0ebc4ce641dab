/*
 * Vector's adaptive-concurrency scenarios (testkit/vector_sim.h) against
 * `discover`, each expectation of each scenario file an assertion, with a
 * permit per attempt (VSIM_ATTEMPT: how sluice's pool and proxy see a
 * retrying client). The expectations `discover` is known to miss are listed
 * below with the reason; the bench (sluice-bench --only-discovery --filter
 * discovery.vector) has the table for every policy and peer, both
 * placements. Also: the fixed-concurrency files check the harness itself,
 * and a rate limit with retrying clients must lock inside [0.8, 1.25]·R·L.
 */
#include <criterion/criterion.h>
#include <inttypes.h>

#include "vector_sim.h"

#define SEEDS 3

/* An expectation `discover` misses today, and why. */
struct known_miss {
    const char *scenario;
    enum vsim_stat stat;
    enum vsim_figure figure;
    const char *why;
};

static const struct known_miss known_misses[] = {
    /* The refused calls start with as many in flight as the served ones (every answer comes
     * at once), so the overshoot from 10 falls back one 10 % cut per window, 0.5 s of
     * deferrals; a fixed limit of 5 meets both. */
    {"defers-at-high-concurrency", VSIM_IN_FLIGHT, VSIM_MEAN, "five windows of cuts from 10"},
    {"defers-at-high-concurrency", VSIM_RATE, VSIM_MEAN, "five windows of cuts from 10"},
    /* The lock (9 to 10) serves 100 a second for most of the run: above ARC's mean. The two
     * means want 8 or fewer in flight (a fixed 8: 8.0 and 69.7 a second; 9: 8.9 and 78.0), the
     * floor of the rate target's [0.8, 1.25]·R·L below; no fixed limit meets more than 10 of 14
     * (the maxima want a burst to 16-24). */
    {"defers-at-high-rate", VSIM_IN_FLIGHT, VSIM_MEAN, "locked at R·L, ARC oscillates below"},
    {"defers-at-high-rate", VSIM_RATE, VSIM_MAX, "slow start's burst at 20"},
    {"defers-at-high-rate", VSIM_RATE, VSIM_MEAN, "locked at R·L, ARC oscillates below"},
    /* [3, 4] in flight against a cap of 5 wants the run mostly under the cap: a lock at 4
     * would be under the band a refusing cap asks for ([0.85·C, C] = [4.25, 5]: the band in
     * bench/discovery_runner.c). */
    {"drops-at-high-concurrency", VSIM_IN_FLIGHT, VSIM_MEAN, "locked at the cap (5)"},
    /* Slow link: the first window's own line (100 ms more per call in flight) sends
     * discovery from its jumpstart of 5 to 2 (sluice__discover_steep), and it holds 2-4
     * from there; but it never runs one call alone, as Vector's controller, starting at 1,
     * does: the minimum round trip is 2 calls' 0.2 s. */
    {"slow-link", VSIM_OBSERVED_RTT, VSIM_MIN, "never one call alone"},
    {"slow-link", VSIM_AVERAGED_RTT, VSIM_MIN, "never one call alone"},
    /* Shallow knee: no latency rise below 10, so slow start doubles 10 -> 20 (2.6x the
     * unloaded latency), then the reference probe holds 7 for 3.6 s of the 11 s run (the
     * calls in flight are at 10 more often; the limit is not). */
    {"shallow-knee", VSIM_IN_FLIGHT, VSIM_MAX, "slow start to 20"},
    {"shallow-knee", VSIM_RATE, VSIM_MAX, "slow start to 20"},
    {"shallow-knee", VSIM_RATE, VSIM_MEAN, "the reference probe at 7"},
    {"shallow-knee", VSIM_CTL_LIMIT, VSIM_MAX, "slow start to 20"},
    {"shallow-knee", VSIM_CTL_LIMIT, VSIM_MEAN, "the reference probe at 7"},
    {"shallow-knee", VSIM_CTL_LIMIT, VSIM_MODE, "the reference probe at 7"},
    {"shallow-knee", VSIM_CTL_IN_FLIGHT, VSIM_MAX, "slow start to 20"},
    {"shallow-knee", VSIM_OBSERVED_RTT, VSIM_MAX, "slow start to 20"},
    {"shallow-knee", VSIM_AVERAGED_RTT, VSIM_MAX, "slow start to 20"},
};

static const char *known(const char *scenario, const struct vsim_expect *x)
{
    for (size_t i = 0; i < sizeof known_misses / sizeof known_misses[0]; i++) {
        const struct known_miss *k = &known_misses[i];
        if (!strcmp(k->scenario, scenario) && k->stat == x->stat && k->figure == x->figure)
            return k->why;
    }
    return NULL;
}

static const struct vsim_scenario *scenario(const char *name)
{
    for (size_t k = 0; k < VSIM_N_SCENARIOS; k++)
        if (!strcmp(vsim_scenarios[k].name, name))
            return &vsim_scenarios[k];
    cr_assert_fail("no scenario %s", name);
    return NULL;
}

/* The lowest ceiling locked during a run (0 = none). */
static void on_lock(void *ctx, const struct sluice_event *ev)
{
    uint32_t *lowest = (uint32_t *)ctx;
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling && (!*lowest || ev->ceiling < *lowest))
        *lowest = ev->ceiling;
}

/* Run `p` under discover (jumpstart 5); the run is left for the caller to read and destroy. */
static struct vsim *run_discover(struct vsim_params p, uint64_t seed, uint32_t *ceiling,
                                 uint32_t *lowest)
{
    struct vsim *s = vsim_create(&p, seed, 5);
    struct sluice_discovery_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.node_id = "cloud:vector";
    desc.jumpstart = 5;
    desc.on_event = on_lock;
    desc.on_event_ctx = lowest;
    *lowest = 0;
    struct sluice_discovery *d = vsim_discovery(s, &desc);
    cr_assert_not_null(d);
    vsim_run(s, 3600);
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(d, &st);
    *ceiling = st.ceiling;
    sluice_discovery_destroy(d);
    return s;
}

/* Every expectation of `name` holds on SEEDS seeds, with a permit per attempt but for those
 * on the known list, or every one with `placement` VSIM_HOLD. */
static void expect_scenario_in(const char *name, enum vsim_placement placement)
{
    const struct vsim_scenario *sc = scenario(name);
    struct vsim_params p = sc->params;
    p.placement = placement;
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        uint32_t ceiling, lowest;
        struct vsim *s = run_discover(p, seed, &ceiling, &lowest);
        for (int i = 0; i < vsim_n_expect(sc); i++) {
            const struct vsim_expect *x = &sc->expect[i];
            double v = vsim_figure(s, x->stat, x->figure);
            const char *why = placement == VSIM_ATTEMPT ? known(name, x) : NULL;
            if (why)
                cr_log_info("%s seed %" PRIu64 ": %s %s = %.4g, range [%g, %g] (known: %s)", name,
                            seed, vsim_stat_name(x->stat), vsim_figure_name(x->figure), v, x->lo,
                            x->hi, why);
            else
                cr_expect(vsim_met(x, v), "%s seed %" PRIu64 ": %s %s = %.4g, not in [%g, %g]",
                          name, seed, vsim_stat_name(x->stat), vsim_figure_name(x->figure), v,
                          x->lo, x->hi);
        }
        vsim_destroy(s);
    }
}

static void expect_scenario(const char *name)
{
    expect_scenario_in(name, VSIM_ATTEMPT);
}

/* Behind a client that retries inside its permit (Vector's placement), a deferred or dropped
 * call holds its permit through the retries and reports long after its window: the windows
 * see only the fast calls. Discovery stops where the completions explain too few of the
 * calls in flight (sluice__discover_stuck); without it, slow start ran to 50 on the deferrals
 * (Vector's range: at most 41) and to 170 on the drops. */
Test(vector_scenarios, a_client_that_retries_inside_its_permit_is_not_grown_past_its_completions)
{
    expect_scenario_in("defers-at-high-concurrency", VSIM_HOLD);
    const struct vsim_scenario *sc = scenario("drops-at-high-concurrency");
    struct vsim_params p = sc->params;
    p.placement = VSIM_HOLD;
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        uint32_t ceiling, lowest;
        struct vsim *s = run_discover(p, seed, &ceiling, &lowest);
        double most = vsim_figure(s, VSIM_CTL_LIMIT, VSIM_MAX);
        cr_expect(most <= 86, "drops, seed %" PRIu64 ": the limit reached %.0f (Vector's range "
                              "for it: [10, 86])", seed, most);
        vsim_destroy(s);
    }
}

Test(vector_scenarios, defers_at_high_concurrency)
{
    expect_scenario("defers-at-high-concurrency");
}

Test(vector_scenarios, defers_at_high_rate)
{
    expect_scenario("defers-at-high-rate");
}

Test(vector_scenarios, drops_at_high_concurrency)
{
    expect_scenario("drops-at-high-concurrency");
}

Test(vector_scenarios, slow_link)
{
    expect_scenario("slow-link");
}

Test(vector_scenarios, shallow_knee)
{
    expect_scenario("shallow-knee");
}

/* A fixed limit of 10 meets every expectation of the fixed-concurrency files: the harness
 * measures what Vector's does. */
Test(vector_scenarios, the_harness_meets_the_fixed_concurrency_files)
{
    static const char *const names[] = {"fixed-concurrency-simple", "fixed-concurrency-jitter"};
    for (size_t k = 0; k < 2; k++)
        for (uint64_t seed = 1; seed <= SEEDS; seed++) {
            const struct vsim_scenario *sc = scenario(names[k]);
            struct vsim *s = vsim_create(&sc->params, seed, 0);
            vsim_run(s, 3600);
            cr_expect_eq(vsim_score(sc, s, stderr), vsim_n_expect(sc), "%s seed %" PRIu64,
                         names[k], seed);
            vsim_destroy(s);
        }
}

/* 100 attempts a second (refused ones count), 0.1 s calls: R·L = 10. Clients retry a
 * refusal with Fibonacci backoff, in lockstep or jittered. The lock lands inside
 * [0.8, 1.25]·R·L on every seed and no lock is ever taken below it (it was 5, and 1 in an
 * earlier port: a refusal from a retry that started alone cut to 1). */
Test(vector_scenarios, a_rate_limit_with_retrying_clients_locks_at_rate_times_latency)
{
    for (int jitter = 0; jitter <= 1; jitter++)
        for (uint64_t seed = 1; seed <= 10; seed++) {
            struct vsim_params p = {.requests = 20000, .delay_s = 0.1, .rate = {.limit = 100},
                                    .placement = VSIM_ATTEMPT, .retry_jitter = jitter};
            uint32_t ceiling, lowest;
            vsim_destroy(run_discover(p, seed, &ceiling, &lowest));
            cr_expect(ceiling >= 8 && ceiling <= 12, "jitter %d seed %" PRIu64 ": locked at %u",
                      jitter, seed, ceiling);
            cr_expect(lowest >= 8, "jitter %d seed %" PRIu64 ": a lock at %u", jitter, seed,
                      lowest);
        }
}
