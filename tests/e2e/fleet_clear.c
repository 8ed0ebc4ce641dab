/*
 * fleet_clear.c — a clear from any process clears the node fleet-wide:
 * through the pool's store (the path sluice_pool_clear, sluice_engine_clear
 * and the admin endpoint's POST take) the shared lock goes, the leader
 * restarts discovery from the jumpstart, and every process sees the next
 * lock at its next heartbeat.
 */
#include "e2e/redis_fixture.h"

#define WORKERS 4
#define BEAT_MS 100

__attribute__((unused)) static void setup(void)
{
    rfx_setup_workers(WORKERS);
}

/* Whether the fleet locks at max_limit (the provider's cap is far above it); on a miss, every
 * worker's log, so the failure says where the fleet stood (once, in an ASan run beside other
 * tests, the first wait ran out at 60 s without a word). */
static bool fleet_locks_at_max_limit(void)
{
    bool locked = RFX_WAIT_UNTIL(rfx_shared("ceiling") == 16, RFX_PATIENCE_MS);
    if (!locked)
        rfx_dump_logs();
    return locked;
}

/* Per-test options, not TestSuite: the TSan build's Criterion stand-in has none. */
#define FLEET_TEST(name) Test(fleet_clear, name, .init = setup, .fini = rfx_teardown, .timeout = 200)

FLEET_TEST(a_pool_clear_in_one_process_restarts_discovery_for_the_whole_fleet)
{
    cr_assert(fleet_locks_at_max_limit(), "the fleet did not lock at max_limit (%s)",
              rfx_state_text());
    /* This process joins the fleet with an idle pool of its own. */
    char url[64];
    rfx_url(url, sizeof url);
    struct sluice_pool *pool;
    struct sluice_fleet *f = rfx_join(&(struct sluice_fleet_desc){.redis_url = url,
                                                                  .node_id = RFX_NODE,
                                                                  .process_id = "tester",
                                                                  .heartbeat_ms = BEAT_MS,
                                                                  .max_limit = 16},
                                      &pool);
    struct sluice_fleet_status st;
    cr_assert(RFX_WAIT_UNTIL((sluice_fleet_snapshot(f, &st), st.ceiling == 16), RFX_PATIENCE_MS),
              "this process does not see the lock the others found (%s)", rfx_state_text());

    cr_assert_eq(sluice_pool_clear(pool), SLUICE_OK);
    long long lowest = LLONG_MAX;
    bool unlocked = false;
    for (int64_t end = fx_now_ms() + RFX_PATIENCE_MS;
         fx_now_ms() < end && !(unlocked && lowest <= 5); fx_sleep_ms(5)) {
        long long s = rfx_shared("limit");
        if (s && s < lowest)
            lowest = s;
        unlocked |= rfx_shared("ceiling") == 0;
    }
    cr_expect(unlocked, "the shared lock survived the clear");
    cr_expect_leq(lowest, 5, "S never went back to the jumpstart (lowest %lld)", lowest);

    /* The fleet probes again and locks again; this process sees it at its next beat. */
    /* Longer than the first lock's wait: this process's idle pool now holds one of the
     * fleet's permits, so the fleet reads as saturated with one slot less of slack. */
    cr_assert(fleet_locks_at_max_limit(), "the fleet did not lock again (%s)", rfx_state_text());
    sluice_fleet_snapshot(f, &st);
    uint64_t beats_at_lock = st.beats;
    bool seen = RFX_WAIT_UNTIL((sluice_fleet_snapshot(f, &st), st.ceiling == 16), RFX_PATIENCE_MS);
    cr_expect(seen, "this process never saw the new lock (%s)", rfx_state_text());
    /* Counted in this process's own heartbeats, which a busy machine delays as much as
     * anything: the beat under way when the lock landed may have read the state just
     * before it, the next one reads it. */
    cr_expect_leq(st.beats - beats_at_lock, 2, "seen %llu beats after the lock",
                  (unsigned long long)(st.beats - beats_at_lock));
    sluice_fleet_destroy(f);
    sluice_pool_destroy(pool);
}

/* The same from outside the fleet: sluicectl clear NODE --redis URL. */
FLEET_TEST(sluicectl_clear_with_redis_clears_the_fleet)
{
    cr_assert(fleet_locks_at_max_limit(), "the fleet did not lock at max_limit (%s)",
              rfx_state_text());
    char url[64], cmd[512];
    rfx_url(url, sizeof url);
    snprintf(cmd, sizeof cmd, "%s clear %s --redis %s 2>/dev/null", SLUICECTL_PATH, RFX_NODE, url);
    int status = system(cmd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "sluicectl exited %d", status);
    cr_expect_eq(rfx_int("GET %s", rfx_key("clears")), 1);
    long long lowest = LLONG_MAX;
    for (int64_t end = fx_now_ms() + RFX_PATIENCE_MS; fx_now_ms() < end && lowest > 5;
         fx_sleep_ms(5)) {
        long long s = rfx_shared("limit");
        if (s && s < lowest)
            lowest = s;
    }
    cr_expect_leq(lowest, 5, "the leader did not restart from the jumpstart (lowest %lld)", lowest);
    snprintf(cmd, sizeof cmd, "%s clear %s --redis 127.0.0.1:%d 2>/dev/null", SLUICECTL_PATH,
             RFX_NODE, rfx_free_port());
    status = system(cmd);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "no server: exit 1, got %d", status);
}
