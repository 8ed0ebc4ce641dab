/*
 * fleet_config.c — the fleet's unit-level promises: a bad description is
 * refused with a message naming the field, a Redis that does not answer
 * means the fallback (with an event), and the permit script against a real
 * redis-server serves waiters in the order they asked and takes back a
 * silent holder's permits after the holder TTL.
 */
#include "e2e/redis_fixture.h"

__attribute__((unused)) static void setup(void)
{
    fx_setup();
}

/* Per-test options, not TestSuite: the TSan build's Criterion stand-in has none. */
#define FLEET_TEST(name) Test(fleet_config, name, .init = setup, .fini = rfx_teardown, .timeout = 20)

/* create's status and message for one description. */
static int try_create(struct sluice_fleet_desc d, char *err, size_t n)
{
    d.error = err;
    d.error_size = n;
    struct sluice_fleet *f = NULL;
    int status = sluice_fleet_create(&d, &f);
    sluice_fleet_destroy(f);
    return status;
}

/* A valid description with one change (`set`, a statement on `d`) is refused, naming `field`. */
#define EXPECT_REFUSED(field, set)                                                                 \
    do {                                                                                           \
        char err[256] = "";                                                                        \
        struct sluice_fleet_desc d = {.redis_url = "127.0.0.1:6379", .node_id = "n"};              \
        set;                                                                                       \
        cr_expect_eq(try_create(d, err, sizeof err), SLUICE_EINVAL);                               \
        cr_expect(strstr(err, field) != NULL, "\"%s\" does not name %s", err, field);             \
    } while (0)

FLEET_TEST(bad_descriptions_are_refused_with_the_field_named)
{
    EXPECT_REFUSED("sluice_fleet_desc.redis_url", d.redis_url = NULL);
    EXPECT_REFUSED("sluice_fleet_desc.redis_url", d.redis_url = "redis://:6379");
    EXPECT_REFUSED("sluice_fleet_desc.redis_url", d.redis_url = "redis://host:0");
    EXPECT_REFUSED("sluice_fleet_desc.redis_url", d.redis_url = "host:65536");
    EXPECT_REFUSED("sluice_fleet_desc.redis_url", d.redis_url = "host:63x");
    EXPECT_REFUSED("sluice_fleet_desc.node_id", d.node_id = NULL);
    EXPECT_REFUSED("sluice_fleet_desc.lease", d.lease = SLUICE_SOME(0));
    EXPECT_REFUSED("sluice_fleet_desc.lease", d.lease = SLUICE_SOME(SLUICE_FLEET_LEASE_MAX + 1));
    EXPECT_REFUSED("sluice_fleet_desc.heartbeat_ms", d.heartbeat_ms = 5);
    EXPECT_REFUSED("sluice_fleet_desc.heartbeat_ms", d.heartbeat_ms = 20000);
    EXPECT_REFUSED("sluice_fleet_desc.holder_ttl_beats", d.holder_ttl_beats = 1);
    EXPECT_REFUSED("sluice_fleet_desc.min_limit", d.min_limit = 9; d.max_limit = 4);
    EXPECT_REFUSED("sluice_fleet_desc.floor", d.floor = 20; d.max_limit = 10);
    EXPECT_REFUSED("rediss:// (TLS) is not supported: this hiredis is built without TLS",
                   d.redis_url = "rediss://127.0.0.1:6379");
    EXPECT_REFUSED("scheme other than redis://", d.redis_url = "http://127.0.0.1:6379");
    EXPECT_REFUSED("must be USER:PASSWORD or :PASSWORD", d.redis_url = "redis://pw@host:6379");
    EXPECT_REFUSED("must be USER:PASSWORD or :PASSWORD", d.redis_url = "redis://u:@host:6379");
    EXPECT_REFUSED("must be USER:PASSWORD or :PASSWORD", d.redis_url = "redis://:a%zz@host");
    EXPECT_REFUSED("the database after '/' must be a number", d.redis_url = "redis://host:1/x");
    EXPECT_REFUSED("with a port in [1, 65535]", d.redis_url = "redis://:pw@host:0/1");
    static const char *const good[] = {"redis://:s3cret@host:6379", "redis://user:p%40ss@host/2",
                                       "host:6379", "redis://host/"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char msg[256] = "x";
        cr_expect_eq(try_create((struct sluice_fleet_desc){.redis_url = good[i], .node_id = "n"},
                                msg, sizeof msg),
                     SLUICE_OK, "%s: %s", good[i], msg);
    }
    char err[256] = "x";
    cr_expect_eq(try_create((struct sluice_fleet_desc){.redis_url = "redis://localhost",
                                                       .node_id = "n"},
                            err, sizeof err),
                 SLUICE_OK, "a URL without a port means 6379");
    cr_expect_eq(err[0], '\0', "a message on success: %s", err);
}

static void count_event(void *ctx, const struct sluice_event *ev)
{
    if (ev->kind == SLUICE_EVENT_STORE && ev->cause == SLUICE_CAUSE_STORE_ERROR)
        atomic_fetch_add((_Atomic int *)ctx, 1);
}

/* No server on the port: the fleet starts in fallback (the floor), says so once, and
 * the pool serves. */
FLEET_TEST(a_redis_that_does_not_answer_means_the_fallback_and_an_event)
{
    static _Atomic int events;
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", rfx_free_port());
    struct sluice_pool *pool;
    struct sluice_fleet *f = rfx_join(&(struct sluice_fleet_desc){.redis_url = url,
                                                                  .node_id = "n",
                                                                  .heartbeat_ms = 20,
                                                                  .floor = 3,
                                                                  .on_event = count_event,
                                                                  .on_event_ctx = &events},
                                      &pool);
    cr_expect_eq(sluice_fleet_attach(f, pool), SLUICE_EINVAL, "attached twice");
    cr_expect(RFX_WAIT_UNTIL(atomic_load(&events) >= 1, 2000), "no fallback event");
    struct sluice_fleet_status st;
    cr_expect(RFX_WAIT_UNTIL((sluice_fleet_snapshot(f, &st), st.beats >= 5), 2000));
    cr_expect_not(st.connected);
    cr_expect_eq(st.local_limit, 3, "the fallback is the floor when no state was ever seen");
    cr_expect_eq(atomic_load(&events), 1, "one event for the outage, not one per beat");
    /* The pool follows the published limit once a window closes (poll, without traffic). */
    cr_expect(RFX_WAIT_UNTIL(sluice_pool_stats(pool).active == 3, 2000),
              "the pool's limit is %u", sluice_pool_stats(pool).active);
    struct sluice_call call;
    cr_expect_eq(sluice_pool_admit(pool), SLUICE_OK);
    cr_expect_eq(sluice_pool_call_begin(pool, NULL, NULL, &call), SLUICE_OK, "it keeps serving");
    sluice_pool_call_end(pool, &call, SLUICE_OUTCOME_OK, 0);
    sluice_pool_leave(pool);
    sluice_fleet_destroy(f);
    sluice_pool_destroy(pool);
}

/* A fleet nobody has started yet starts its shared limit at discovery's jumpstart as discovery
 * resolves it, clamped into [min_limit, max_limit]: the default of 5 under a floor of 7 would
 * put every process below its floor until the leader's first window. */
FLEET_TEST(a_new_fleet_starts_its_shared_limit_inside_its_bounds)
{
    rfx_start();
    char url[64];
    rfx_url(url, sizeof url);
    struct sluice_pool *pool;
    struct sluice_fleet *f = rfx_join(&(struct sluice_fleet_desc){.redis_url = url,
                                                                  .node_id = RFX_NODE,
                                                                  .heartbeat_ms = 20,
                                                                  .min_limit = 7,
                                                                  .max_limit = 8},
                                      &pool);
    struct sluice_fleet_status st;
    cr_assert(RFX_WAIT_UNTIL((sluice_fleet_snapshot(f, &st), st.connected && st.shared_limit), 2000),
              "no shared limit published");
    cr_expect_eq(st.shared_limit, 7, "the first shared limit is %u", st.shared_limit);
    sluice_fleet_destroy(f);
    sluice_pool_destroy(pool);
}

/* ---- authentication ------------------------------------------------------------ */

/* The test's server asks for a password, and knows an ACL user whose password needs
 * percent-encoding in a URL. */
static void require_auth(void)
{
    freeReplyObject(rfx_cmd("CONFIG SET requirepass %s", "s3cret"));
    freeReplyObject(rfx_cmd("ACL SETUSER fleetuser on >p@ss:w/rd ~* &* +@all"));
}

static long long connections_received(void)
{
    redisReply *r = rfx_cmd("INFO stats");
    const char *at = r->type == REDIS_REPLY_STRING
                         ? strstr(r->str, "total_connections_received:")
                         : NULL;
    cr_assert_not_null(at, "INFO stats has no total_connections_received");
    long long n = strtoll(at + strlen("total_connections_received:"), NULL, 10);
    freeReplyObject(r);
    return n;
}

static bool fleet_connected(struct sluice_fleet *f)
{
    struct sluice_fleet_status st;
    sluice_fleet_snapshot(f, &st);
    return st.connected;
}

FLEET_TEST(a_password_or_an_acl_user_in_the_url_authenticates_and_selects_the_database)
{
    rfx_start();
    require_auth();
    char url[128];
    snprintf(url, sizeof url, "redis://:s3cret@127.0.0.1:%d/3", rfx.port);
    struct sluice_pool *pool;
    struct sluice_fleet *f = rfx_join(
        &(struct sluice_fleet_desc){.redis_url = url, .node_id = RFX_NODE, .heartbeat_ms = 20},
        &pool);
    char err[256];
    cr_assert(RFX_WAIT_UNTIL(fleet_connected(f), 3000), "never connected: %s",
              (sluice_fleet_last_error(f, err, sizeof err), err));
    /* Its keys are in database 3, not 0. */
    freeReplyObject(rfx_cmd("SELECT 3"));
    cr_assert_eq(rfx_int("ZCARD %s", rfx_key("holders")), 1, "not registered in db 3");
    freeReplyObject(rfx_cmd("SELECT 0"));
    cr_assert_eq(rfx_int("ZCARD %s", rfx_key("holders")), 0, "registered in db 0");
    cr_assert_eq(sluice_fleet_last_error(f, err, sizeof err), 0, "an error: %s", err);
    sluice_fleet_destroy(f);
    sluice_pool_destroy(pool);
    /* An ACL user, its password percent-encoded; the clear from outside logs in too. */
    snprintf(url, sizeof url, "redis://fleetuser:p%%40ss%%3Aw%%2Frd@127.0.0.1:%d", rfx.port);
    f = rfx_join(
        &(struct sluice_fleet_desc){.redis_url = url, .node_id = RFX_NODE, .heartbeat_ms = 20},
        &pool);
    cr_assert(RFX_WAIT_UNTIL(fleet_connected(f), 3000), "never connected as fleetuser: %s",
              (sluice_fleet_last_error(f, err, sizeof err), err));
    cr_assert_eq(sluice_fleet_clear_node(url, RFX_NODE, err, sizeof err), SLUICE_OK, "%s", err);
    sluice_fleet_destroy(f);
    sluice_pool_destroy(pool);
}

/* No password, or a wrong one: the fleet falls back (one event), says why in the server's
 * words, and does not open a connection at every beat. */
FLEET_TEST(a_refused_login_is_reported_in_the_servers_words_and_retried_with_backoff)
{
    rfx_start();
    require_auth();
    static const struct {
        const char *userinfo, *words;
    } cases[] = {{"", "PING: NOAUTH Authentication required"},
                 {":wrong@", "AUTH: WRONGPASS invalid username-password pair"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static _Atomic int events;
        atomic_store(&events, 0);
        char url[128], err[256];
        snprintf(url, sizeof url, "redis://%s127.0.0.1:%d", cases[i].userinfo, rfx.port);
        long long before = connections_received();
        struct sluice_pool *pool;
        struct sluice_fleet *f = rfx_join(&(struct sluice_fleet_desc){.redis_url = url,
                                                                      .node_id = RFX_NODE,
                                                                      .heartbeat_ms = 20,
                                                                      .on_event = count_event,
                                                                      .on_event_ctx = &events},
                                          &pool);
        struct sluice_fleet_status st;
        cr_assert(RFX_WAIT_UNTIL((sluice_fleet_snapshot(f, &st), st.beats >= 40), 5000));
        long long made = connections_received() - before;
        cr_assert_not(st.connected);
        cr_assert_gt(sluice_fleet_last_error(f, err, sizeof err), 0);
        cr_assert(strstr(err, cases[i].words), "case %zu: \"%s\"", i, err);
        cr_assert_null(strstr(err, "wrong"), "the password is in the message: %s", err);
        /* Backoff from one beat doubling: ~6 tries in 40 beats, not 40. */
        cr_assert_leq(made, 10, "case %zu: %lld connections in %llu beats", i, made,
                      (unsigned long long)st.beats);
        cr_assert_eq(atomic_load(&events), 1, "one store event for the refusal, not one per try");
        sluice_fleet_destroy(f);
        sluice_pool_destroy(pool);
        cr_assert_eq(sluice_fleet_clear_node(url, RFX_NODE, err, sizeof err), SLUICE_EIO);
        cr_assert(strstr(err, cases[i].words), "clear_node: \"%s\"", err);
    }
}

/* ---- the permit script against a real server ------------------------------------ */

/* One beat of process `id`: returns its leased permits. */
static long long beat(const char *id, int want, int keep, int ttl_ms)
{
    char a_want[16], a_keep[16], a_ttl[16];
    snprintf(a_want, sizeof a_want, "%d", want);
    snprintf(a_keep, sizeof a_keep, "%d", keep);
    snprintf(a_ttl, sizeof a_ttl, "%d", ttl_ms);
    const char *argv[] = {"EVAL", sluice__fleet_script("beat"), "6", rfx_key("state"),
                          rfx_key("holders"), rfx_key("held"), rfx_key("waiters"),
                          rfx_key("clears"), rfx_key("load"), id, a_want, a_keep, "1", a_ttl,
                          "5", "0"};
    redisReply *r = redisCommandArgv(rfx.c, 16, argv, NULL);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY, "beat failed: %s",
              r && r->type == REDIS_REPLY_ERROR ? r->str : "no reply");
    long long leased = r->element[0]->integer;
    freeReplyObject(r);
    return leased;
}

/* S = 7 and four processes: three leasable permits (S − N), one per lease (k = 1). */
FLEET_TEST(waiters_are_served_in_the_order_they_first_asked)
{
    rfx_start();
    freeReplyObject(rfx_cmd("HSET %s limit 7", rfx_key("state")));
    const int ttl = 60000;
    for (const char *const *id = (const char *const[]){"x", "a", "b", "c", NULL}; *id; id++)
        beat(*id, 0, 0, ttl);
    cr_assert_eq(beat("x", 3, 0, ttl), 3, "x takes the whole pool while nobody waits");
    cr_expect_eq(beat("a", 1, 0, ttl), 0);
    cr_expect_eq(beat("b", 1, 0, ttl), 0);
    cr_expect_eq(beat("c", 1, 0, ttl), 0);
    cr_expect_eq(rfx_int("ZRANK %s c", rfx_key("waiters")), 2);
    /* x, over its fair share while others wait, gives back what its pool no longer uses. */
    cr_expect_eq(beat("x", 1, 0, ttl), 1);
    /* Two permits free. c and b ask first, but a asked first of all. */
    cr_expect_eq(beat("c", 1, 0, ttl), 0, "c jumped the queue");
    cr_expect_eq(beat("b", 1, 0, ttl), 0, "b jumped the queue");
    cr_expect_eq(beat("a", 1, 0, ttl), 1, "a, first in line, is served");
    cr_expect_eq(beat("c", 1, 0, ttl), 0, "c jumped the queue");
    cr_expect_eq(beat("b", 1, 0, ttl), 1, "b, next in line, is served");
    cr_expect_eq(beat("c", 1, 0, ttl), 0, "nothing is free for c");
    cr_expect_eq(rfx_leased_total(), 3, "never more than S − N leased");
}

FLEET_TEST(a_holder_that_keeps_what_its_pool_uses_is_not_drained_below_it)
{
    rfx_start();
    freeReplyObject(rfx_cmd("HSET %s limit 10", rfx_key("state")));
    beat("x", 0, 0, 60000);
    beat("a", 0, 0, 60000);
    cr_assert_eq(beat("x", 8, 0, 60000), 8);
    /* a waits; x's share is now 4, but its pool still runs 6 of its permits. */
    cr_expect_eq(beat("a", 4, 0, 60000), 0);
    cr_expect_eq(beat("x", 8, 6, 60000), 6);
    cr_expect_eq(beat("x", 8, 3, 60000), 4, "down to the fair share once the pool is");
}

FLEET_TEST(a_silent_holders_permits_return_after_the_holder_ttl)
{
    rfx_start();
    freeReplyObject(rfx_cmd("HSET %s limit 6", rfx_key("state")));
    beat("x", 0, 0, 200);
    beat("a", 0, 0, 200);
    cr_assert_eq(beat("x", 4, 0, 200), 4);
    cr_expect_eq(beat("a", 2, 0, 200), 0, "nothing free while x is alive");
    fx_sleep_ms(100);
    cr_expect_eq(beat("a", 2, 0, 200), 0, "x is still within its TTL");
    fx_sleep_ms(150); /* x silent for 250 ms > 200: gone at a's next beat */
    cr_expect_eq(beat("a", 2, 0, 200), 2, "x's permits came back");
    cr_expect_not(rfx_holder("x"));
    cr_expect_eq(rfx_int("HEXISTS %s x", rfx_key("held")), 0);
}

/* A report keeps the eight fields a leader of an older release reads, in their order, and
 * adds the calls' spread, then how long its refusals took, after them: a fleet upgraded one
 * process at a time still hears every member. */
FLEET_TEST(a_report_adds_the_calls_spread_after_the_fields_an_older_leader_reads)
{
    rfx_start();
    const char *argv[] = {"EVAL", sluice__fleet_script("report"), "1", rfx_key("reports"),
                          "12 1 13 1200000000 50000000 6 0", "0", "240000000", "350000000"};
    redisReply *r = redisCommandArgv(rfx.c, 8, argv, NULL);
    cr_assert(r && r->type != REDIS_REPLY_ERROR, "report failed: %s",
              r && r->type == REDIS_REPLY_ERROR ? r->str : "no reply");
    freeReplyObject(r);
    r = rfx_cmd("LINDEX %s 0", rfx_key("reports"));
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    unsigned long long ok, overload, served;
    long long lat_sum, lat_min, retry, start_ms, deviation, refusal;
    unsigned maxif;
    int old = sscanf(r->str, "%llu %llu %llu %lld %lld %u %lld %lld", &ok, &overload, &served,
                     &lat_sum, &lat_min, &maxif, &retry, &start_ms);
    int now = sscanf(r->str, "%*u %*u %*u %*d %*d %*u %*d %*d %lld %lld", &deviation, &refusal);
    cr_expect_eq(old, 8, "an older leader reads \"%s\"", r->str);
    cr_expect(ok == 12 && overload == 1 && served == 13 && lat_sum == 1200000000 &&
                  lat_min == 50000000 && maxif == 6 && retry == 0 && start_ms > 0,
              "the fields moved: \"%s\"", r->str);
    cr_expect(now == 2 && deviation == 240000000 && refusal == 350000000,
              "no spread, then refusal time, last in \"%s\"", r->str);
    freeReplyObject(r);
}
