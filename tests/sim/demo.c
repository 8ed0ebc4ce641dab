/*
 * The discovery demo, in virtual time: a cloud provider with a hidden cap of
 * 52 parallel requests, discovered from live traffic and locked; then a plan
 * upgrade to 120, a clear, and the new ceiling discovered. It prints the
 * live status line and every event as they happen (run: ctest -R sim.demo -V).
 * The real-HTTP demo a person runs is shim/tools/sluice-demo/
 * (`cmake --workflow --preset demo`); this one covers the plan upgrade.
 *
 * SLUICE_DEMO_PACE_MS paces the virtual clock: that many real milliseconds
 * per 5 simulated seconds (try 100), so a person can watch the limit climb,
 * back off and lock. The test suite runs unpaced.
 */
#include <stdlib.h>
#include <time.h>

#include "sim_common.h"

struct demo {
    struct sluice_discovery *disc;
    double next_line_s;
};

static void print_status(struct sim *s, struct demo *demo)
{
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(demo->disc, &st);
    char line[256];
    sluice_status_line(line, sizeof line, &st);
    printf("  t=%7.1fs  %s\n", sim_now_s(s), line);
    fflush(stdout);
}

static void on_tick(struct sim *s, void *ctx)
{
    print_status(s, (struct demo *)ctx);
    const char *pace = getenv("SLUICE_DEMO_PACE_MS");
    long ms = pace ? atol(pace) : 0;
    if (ms > 0 && ms <= 10000)
        nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L}, NULL);
}

static void on_event(void *ctx, const struct sluice_event *ev)
{
    (void)ctx;
    printf("  t=%7.1fs    event %-8s %-11s limit %3u -> %3u  in flight %3u%s",
           (double)ev->t_ns / SIM_NS, sluice_event_kind_name(ev->kind),
           sluice_cause_name(ev->cause), ev->old_limit, ev->new_limit, ev->in_flight,
           ev->ceiling ? "" : "\n");
    if (ev->ceiling)
        printf("  ceiling %u\n", ev->ceiling);
    fflush(stdout);
}

/* Run until the node locks (or `limit_s` passes); returns the lock time or -1. */
static double run_until_locked(struct sim *s, struct sluice_discovery *d, double limit_s)
{
    double end = sim_now_s(s) + limit_s;
    while (sim_now_s(s) < end) {
        sim_run_until(s, sim_now_s(s) + 1.0);
        if (sluice_discovery_state(d) == SLUICE_DISCOVERY_LOCKED)
            return sim_now_s(s);
    }
    return -1;
}

Test(demo, discovers_a_providers_cap_then_a_plan_upgrade)
{
    struct sim_config cfg = reject_config(52, 1);
    cfg.workers = 2 * 120 + 8;
    struct sim *s = sim_create(&cfg);
    struct sluice_discovery_desc desc = default_desc();
    desc.node_id = "cloud:default_ollama";
    desc.on_event = on_event;
    struct demo demo = {NULL, 0};
    sim_discovery_desc(s, &desc);
    char why[256] = "";
    desc.error = why;
    desc.error_size = sizeof why;
    cr_assert_eq(sluice_discovery_create(&desc, &demo.disc), SLUICE_OK, "%s", why);
    sim_attach_discovery(s, demo.disc);

    printf("\nsluice discovery demo (virtual time)\n"
           "  provider: hidden cap 52 parallel requests, 429 past it; calls take ~%.1f s\n"
           "  callers:  %u clients sending back to back\n\n",
           sim_round_trip_s(&s->cfg), cfg.workers);
    print_status(s, &demo);
    sim_set_tick(s, 5.0, on_tick, &demo);
    sim_start(s);
    double locked_at = run_until_locked(s, demo.disc, 600);
    cr_assert_geq(locked_at, 0, "no lock within 10 minutes");
    sim_run_until(s, locked_at + 30);
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(demo.disc, &st);
    printf("\n  locked at %u after %.0f s; 429s so far: %" PRIu64 " of %" PRIu64 " calls\n",
           st.ceiling, locked_at, s->stats.rejected, s->stats.attempts);
    cr_expect(st.ceiling >= 45 && st.ceiling <= 52, "ceiling %u", st.ceiling);

    printf("\n  plan upgrade: the provider now takes 120; the operator clears the node\n"
           "    (sluice_discovery_clear: what `sluicectl clear` and the admin endpoint call)\n\n");
    sim_set_cap(s, 120);
    sluice_discovery_clear(demo.disc);
    double cleared_at = sim_now_s(s);
    locked_at = run_until_locked(s, demo.disc, 600);
    cr_assert_geq(locked_at, 0, "no new lock within 10 minutes of the clear");
    sim_run_until(s, locked_at + 30);
    sluice_discovery_snapshot(demo.disc, &st);
    printf("\n  new ceiling %u, %.0f s after the clear; 429s in total: %" PRIu64 " of %" PRIu64
           " calls (%.2f%%)\n",
           st.ceiling, locked_at - cleared_at, s->stats.rejected, s->stats.attempts,
           100.0 * sim_reject_share(s));
    cr_expect(st.ceiling >= 102 && st.ceiling <= 120, "new ceiling %u", st.ceiling);

    printf("\n  the node's event feed as JSON Lines (last 5):\n");
    const struct sluice_event_ring *ring = sluice_discovery_events(demo.disc);
    uint64_t count = sluice_event_ring_count(ring);
    uint64_t cursor = count > 5 ? count - 5 : 0;
    sluice_event_ring_write_json(stdout, ring, &cursor);
    fflush(stdout);
    sluice_discovery_destroy(demo.disc);
    sim_destroy(s);
}
