/*
 * fleet_outage.c — Redis goes away mid-run: every process falls back to its
 * local share (a "store" event with cause store_error), keeps serving, and
 * once Redis is back on the same port reconnects with backoff (a "restore"
 * event with cause store) and leases again.
 */
#include "e2e/redis_fixture.h"

#define WORKERS 4

__attribute__((unused)) static void setup(void)
{
    rfx_setup_workers(0); /* the test spawns its own */
}

/* Per-test options, not TestSuite: the TSan build's Criterion stand-in has none. */
#define FLEET_TEST(name) Test(fleet_outage, name, .init = setup, .fini = rfx_teardown, .timeout = 30)

static int workers_with(const char *event)
{
    int n = 0;
    for (int i = 0; i < WORKERS; i++)
        n += rfx_events(i, event) > 0;
    return n;
}

FLEET_TEST(processes_fall_back_keep_serving_and_recover_when_redis_returns)
{
    for (int i = 0; i < WORKERS; i++)
        rfx_spawn(i, &(struct rfx_worker_cfg){.threads = 4, .max_limit = 12});
    cr_assert(RFX_WAIT_UNTIL(rfx_int("ZCARD %s", rfx_key("holders")) == WORKERS, 5000));
    fx_sleep_ms(500);
    cr_assert_eq(workers_with("store store_error"), 0, "a fallback before the outage");

    rfx_stop_server();
    cr_expect(RFX_WAIT_UNTIL(workers_with("store store_error") == WORKERS, 2000),
              "%d of %d workers reported the fallback", workers_with("store store_error"),
              WORKERS);
    long served = fx_stats().ok;
    fx_sleep_ms(1000);
    long during = fx_stats().ok - served;
    cr_log_info("%ld calls served in the second without Redis", during);
    cr_expect_gt(during, 50, "the fleet stopped serving without Redis");
    struct fx_stats s = fx_stats();
    cr_expect_leq(s.peak_in_flight, 12, "the local shares overran S: %ld", s.peak_in_flight);

    rfx_launch(); /* same port, empty: the processes re-register from scratch */
    int64_t back = fx_now_ms();
    bool recovered = RFX_WAIT_UNTIL(workers_with("restore store") == WORKERS &&
                                        rfx_int("ZCARD %s", rfx_key("holders")) == WORKERS,
                                    8000);
    cr_log_info("all %d workers back %lld ms after Redis returned", WORKERS,
                (long long)(fx_now_ms() - back));
    cr_expect(recovered, "%d of %d workers reconnected", workers_with("restore store"), WORKERS);
    char leader[32];
    cr_expect(RFX_WAIT_UNTIL((rfx_leader(leader, sizeof leader), leader[0] != '\0'), 2000),
              "no leader after the outage");
    cr_expect(RFX_WAIT_UNTIL(rfx_leased_total() > 0, 3000), "nobody leases after the outage");
}

/* A leader that takes the lease where an earlier one left S (here a fleet that restarts while
 * its state lives: the same path as a leader that lost Redis for a beat and took the lease
 * back) grows S from there by steps: doubling it would overshoot what was already probed (in a
 * loaded ASan run of fleet_cap, a leader back after a missed beat doubled S from 36 to 72
 * against a cap of 24, and the refusals cut it back three times). */
FLEET_TEST(a_leader_that_takes_over_below_a_lock_grows_the_shared_limit_by_steps)
{
    redisReply *r = rfx_cmd("HSET %s limit 12", rfx_key("state"));
    freeReplyObject(r);
    rfx_spawn(0, &(struct rfx_worker_cfg){.threads = 24, .max_limit = 64});
    char probe[256] = "";
    cr_assert(RFX_WAIT_UNTIL(rfx_events_first(0, "probe ", probe, sizeof probe) > 0, 10000),
              "the leader never grew S (%s)", rfx_state_text());
    cr_assert(!strncmp(probe, "probe additive 12 ", 18), "the first step from S = 12: %s", probe);
}
