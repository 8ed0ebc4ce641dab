/*
 * fleet_kill.c — processes die without a goodbye (SIGKILL): a dead holder's
 * permits return within the holder TTL, and when the leader dies another
 * process takes the lease within the leader lease and carries on from the
 * shared state, not from the jumpstart.
 */
#include "e2e/redis_fixture.h"

#define WORKERS 4
#define BEAT_MS 100
#define TTL_MS (5 * BEAT_MS) /* holder_ttl_beats and leader_ttl_beats default to 5 */

__attribute__((unused)) static void setup(void)
{
    rfx_setup_workers(WORKERS);
}

/* Per-test options, not TestSuite: the TSan build's Criterion stand-in has none. */
#define FLEET_TEST(name) Test(fleet_kill, name, .init = setup, .fini = rfx_teardown, .timeout = 30)

static long long leased(int i)
{
    return rfx_int("HGET %s %s", rfx_key("held"), rfx_workers[i].id);
}

FLEET_TEST(a_killed_holders_permits_return_within_the_holder_ttl)
{
    cr_assert(RFX_WAIT_UNTIL(leased(1) > 0, 5000), "w1 never leased a permit");
    rfx_kill(1);
    int64_t killed = fx_now_ms();
    bool gone = RFX_WAIT_UNTIL(!rfx_holder("w1") && leased(1) == 0, 10 * TTL_MS);
    int64_t took = fx_now_ms() - killed;
    cr_log_info("w1's permits came back %lld ms after the kill (holder TTL %d ms)", (long long)took,
                TTL_MS);
    cr_assert(gone, "w1 still holds permits %lld ms after it died", (long long)took);
    /* Due at the first beat of a survivor after the TTL; slack for a loaded machine. */
    cr_expect_leq(took, 3 * TTL_MS, "gone after %lld ms, the TTL is %d", (long long)took, TTL_MS);
    /* And the survivors lease them: the pool of S − N fills again. S is read with each look:
     * one read taken while the field was being rewritten gave 0 (an ASan run: "13 of -3"). */
    long long shared = 0;
    cr_expect(RFX_WAIT_UNTIL((shared = rfx_shared("limit")) > 0 &&
                                 rfx_leased_total() == shared - (WORKERS - 1),
                             3000),
              "the survivors lease %lld of %lld", rfx_leased_total(), shared - (WORKERS - 1));
}

FLEET_TEST(a_new_leader_takes_over_within_the_lease_from_the_shared_state)
{
    /* No cap in sight below max_limit: the fleet locks S at 16. */
    cr_assert(RFX_WAIT_UNTIL(rfx_shared("ceiling") == 16, 8000),
              "the fleet did not lock at max_limit");
    char old[32], now[32] = "";
    rfx_leader(old, sizeof old);
    int victim = old[0] == 'w' ? atoi(old + 1) : -1;
    cr_assert(victim >= 0 && victim < WORKERS, "leader \"%s\"", old);
    rfx_kill(victim);
    int64_t killed = fx_now_ms();
    long long lowest = LLONG_MAX;
    int64_t took = -1;
    for (int64_t end = killed + 6 * TTL_MS; fx_now_ms() < end; fx_sleep_ms(10)) {
        long long s = rfx_shared("limit");
        if (s < lowest)
            lowest = s;
        rfx_leader(now, sizeof now);
        if (took < 0 && now[0] && strcmp(now, old) != 0)
            took = fx_now_ms() - killed;
    }
    cr_log_info("%s took over from %s after %lld ms; S never below %lld", now, old,
                (long long)took, lowest);
    cr_assert_geq(took, 0, "nobody took over from %s", old);
    cr_expect_leq(took, 3 * TTL_MS, "took over after %lld ms; the lease is %d ms", (long long)took,
                  TTL_MS);
    cr_expect_eq(lowest, 16, "S fell to %lld: the new leader started from the jumpstart", lowest);
    char state[16] = "";
    redisReply *r = rfx_cmd("HGET %s state", rfx_key("state"));
    if (r->type == REDIS_REPLY_STRING)
        snprintf(state, sizeof state, "%s", r->str);
    freeReplyObject(r);
    cr_expect_str_eq(state, "locked", "the new leader restored the shared lock");
}
