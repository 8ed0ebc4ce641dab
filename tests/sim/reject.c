/*
 * Ceiling discovery against a provider that answers 429 at once past its
 * hidden cap C (the common cloud behaviour), in virtual time.
 */
#include "sim_common.h"

static const uint32_t caps[] = {3, 16, 52, 200};
#define N_CAPS (sizeof caps / sizeof caps[0])

Test(reject, locked_ceiling_is_within_85_to_100_percent_of_the_cap)
{
    for (size_t i = 0; i < N_CAPS; i++) {
        struct scenario sc;
        scenario_start(&sc, reject_config(caps[i], 11 + i), default_desc());
        sim_run_until(sc.sim, 30 * 60);
        struct sluice_discovery_status st = scenario_status(&sc);
        cr_expect_eq(st.state, SLUICE_DISCOVERY_LOCKED, "C=%u: state %s, not locked", caps[i],
                     sluice_discovery_state_name(st.state));
        cr_expect(st.ceiling >= 0.85 * caps[i] && st.ceiling <= caps[i],
                  "C=%u: locked ceiling %u outside [0.85C, C]", caps[i], st.ceiling);
        scenario_stop(&sc);
    }
}

Test(reject, rejections_are_at_most_2_percent_over_30_minutes)
{
    for (size_t i = 0; i < N_CAPS; i++) {
        for (int retry_after = 0; retry_after < 2; retry_after++) {
            struct sim_config cfg = reject_config(caps[i], 21 + i);
            cfg.retry_after_s = retry_after ? 1.0 : 0.0;
            struct scenario sc;
            scenario_start(&sc, cfg, default_desc());
            sim_run_until(sc.sim, 30 * 60);
            double share = sim_reject_share(sc.sim);
            cr_expect(share <= 0.02, "C=%u retry-after %d: 429 share %.4f > 2%%", caps[i],
                      retry_after, share);
            scenario_stop(&sc);
        }
    }
}

Test(reject, limit_reaches_90_percent_of_the_cap_within_the_round_trip_budget)
{
    for (size_t i = 0; i < N_CAPS; i++) {
        struct scenario sc;
        scenario_start(&sc, reject_config(caps[i], 31 + i), default_desc());
        sim_run_until(sc.sim, 30 * 60);
        /* 20 round trips per doubling from the jumpstart of 5, plus one. */
        double doublings = log2(caps[i] / 5.0) + 1.0;
        double budget_s = 20.0 * sc.rtt_s * doublings;
        double t90_s = (double)sc.sim->stats.t90_ns / SIM_NS;
        cr_expect(sc.sim->stats.t90_ns >= 0 && t90_s <= budget_s,
                  "C=%u: limit reached 0.9C after %.1f s, budget %.1f s (%.1f round trips)",
                  caps[i], t90_s, budget_s, budget_s / sc.rtt_s);
        scenario_stop(&sc);
    }
}

/* Every half second of virtual time: the limit must not exceed a held lock,
 * and the lock must not rise while held. */
struct lock_watch {
    struct sluice_discovery *disc;
    uint32_t ceiling;
    uint64_t checks, violations;
};

static void watch_lock(struct sim *s, void *ctx)
{
    struct lock_watch *w = (struct lock_watch *)ctx;
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(w->disc, &st);
    if (!st.ceiling)
        return;
    w->checks++;
    if (sluice_gate_limit(&s->gate) > st.ceiling || (w->ceiling && st.ceiling > w->ceiling))
        w->violations++;
    w->ceiling = st.ceiling;
}

Test(reject, limit_never_grows_above_the_ceiling_while_locked)
{
    for (size_t i = 0; i < N_CAPS; i++) {
        struct scenario sc;
        scenario_start(&sc, reject_config(caps[i], 41 + i), default_desc());
        struct lock_watch watch = {sc.disc, 0, 0, 0};
        sim_set_tick(sc.sim, 0.5, watch_lock, &watch);
        sim_run_until(sc.sim, 60 * 60);
        cr_assert_gt(watch.checks, 1000, "C=%u: locked for only %" PRIu64 " checks", caps[i],
                     watch.checks);
        cr_expect_eq(watch.violations, 0, "C=%u: %" PRIu64 " checks saw growth while locked",
                     caps[i], watch.violations);
        /* The event feed agrees: once locked, no event raises the limit past the ceiling. */
        const struct sluice_event *lock = sim_trace_find(&sc.trace, SLUICE_EVENT_LOCK, 0);
        cr_assert_not_null(lock, "C=%u: never locked", caps[i]);
        for (size_t k = 0; k < sc.trace.n; k++) {
            const struct sluice_event *ev = &sc.trace.ev[k];
            if (ev->seq > lock->seq)
                cr_assert_leq(ev->new_limit, lock->ceiling, "C=%u: event %" PRIu64 " %s to %u",
                              caps[i], ev->seq, sluice_event_kind_name(ev->kind), ev->new_limit);
        }
        scenario_stop(&sc);
    }
}
