/*
 * fleet_redis.c — the fleet's side of Redis: the Lua scripts every
 * operation is (one atomic script each), the hiredis connection of the
 * agent thread, and the leader node's store over it. Only the agent thread
 * calls in here (and sluice_fleet_destroy, after joining it).
 */
#include "fleet_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sluice__fleet_key_suffix[KEY_COUNT] = {"state",   "leader",  "holders", "held",
                                                         "waiters", "reports", "clears",  "load"};

/* ---- Lua scripts ------------------------------------------------------------- */

/* Server time in ms, the one clock every process agrees on. */
#define FLEET_LUA_NOW                                                                              \
    "local t = redis.call('TIME')\n"                                                               \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

/*
 * beat: KEYS state holders held waiters clears load; ARGV id want keep k
 * ttl_ms default_limit load. Expire silent holders, refresh this one and
 * its load (calls it runs), then move its leased permits towards `want`
 * (never below `keep`, what its pool still uses): release at once; acquire
 * only as the first waiter (strict order of first ask), at most the free
 * permits. The target is capped by the pool of leasable permits (S − N);
 * while others wait, by the fair share ceil(pool / N) rounded up to k;
 * while the fleet leases more than the pool (S fell, or N grew), by
 * floor(pool / N), so the excess drains at every holder's next beat. Returns {leased, target, S, N, waiters, state, ceiling, expires,
 * clears, fleet load}. The fleet load counts every holder as using at least
 * its base permit: nobody else may take it, so an idle member's permit is not
 * room the fleet could grow into, and a fleet whose busy members use all the
 * rest is saturated (else a fleet with idle members never grows).
 */
const char sluice__fleet_lua_beat[] =
    FLEET_LUA_NOW
    "local id, want, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    "local k, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)) do\n"
    "  redis.call('ZREM', KEYS[2], d); redis.call('HDEL', KEYS[3], d)\n"
    "  redis.call('ZREM', KEYS[4], d); redis.call('HDEL', KEYS[6], d)\n"
    "end\n"
    "redis.call('ZADD', KEYS[2], now, id)\n"
    "redis.call('HSET', KEYS[6], id, ARGV[7])\n"
    "local S = tonumber(redis.call('HGET', KEYS[1], 'limit') or ARGV[6])\n"
    "local n = redis.call('ZCARD', KEYS[2])\n"
    "local pool = math.max(S - n, 0)\n"
    "local total = 0\n"
    "for _, v in ipairs(redis.call('HVALS', KEYS[3])) do total = total + tonumber(v) end\n"
    "local mine = tonumber(redis.call('HGET', KEYS[3], id) or 0)\n"
    "local rank = redis.call('ZRANK', KEYS[4], id)\n"
    "local others = redis.call('ZCARD', KEYS[4]) - (rank and 1 or 0)\n"
    "local share = math.ceil(math.ceil(pool / n) / k) * k\n"
    "local target = math.min(want, pool)\n"
    "if total > pool then target = math.min(target, math.floor(pool / n))\n"
    "elseif others > 0 then target = math.min(target, share) end\n"
    "if target < mine then\n"
    "  mine = math.min(mine, math.max(target, keep))\n"
    "  redis.call('ZREM', KEYS[4], id)\n"
    "elseif target > mine then\n"
    "  if not rank then redis.call('ZADD', KEYS[4], now, id); rank = redis.call('ZRANK', KEYS[4], id) end\n"
    "  local free = pool - total\n"
    "  if rank == 0 and free > 0 then mine = mine + math.min(target - mine, free) end\n"
    "  if mine >= target then redis.call('ZREM', KEYS[4], id) end\n"
    "else\n"
    "  redis.call('ZREM', KEYS[4], id)\n"
    "end\n"
    "if mine > 0 then redis.call('HSET', KEYS[3], id, mine) else redis.call('HDEL', KEYS[3], id) end\n"
    "local st = redis.call('HMGET', KEYS[1], 'state', 'ceiling', 'expires')\n"
    "local load = 0\n"
    "for _, v in ipairs(redis.call('HVALS', KEYS[6])) do load = load + math.max(tonumber(v), 1) end\n"
    "return {mine, target, S, n, redis.call('ZCARD', KEYS[4]), st[1] or '',\n"
    "        tonumber(st[2] or 0), tonumber(st[3] or 0), tonumber(redis.call('GET', KEYS[5]) or 0),\n"
    "        load}\n";

/* report: KEYS reports; ARGV fields age_ms deviation_sum refusal_ns. Stamps the window's
 * start in server time. The deviation and the refusals' time go last, so a leader that reads
 * eight fields still reads this member's reports (one of a rolling upgrade). */
const char sluice__fleet_lua_report[] =
    FLEET_LUA_NOW
    "redis.call('RPUSH', KEYS[1],\n"
    "           ARGV[1] .. ' ' .. (now - tonumber(ARGV[2])) .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])\n"
    "redis.call('LTRIM', KEYS[1], -1024, -1)\n" /* a leaderless fleet keeps the last 1024 */
    "return 1\n";

/* drain: KEYS reports. Returns {now_ms, {report...}} and empties the list. */
const char sluice__fleet_lua_drain[] =
    FLEET_LUA_NOW
    "local r = redis.call('LRANGE', KEYS[1], 0, -1)\n"
    "redis.call('DEL', KEYS[1])\n"
    "return {now, r}\n";

/* leader: KEYS leader; ARGV id lease_ms. 1 = renewed, 2 = newly taken, 0 = someone else's. */
const char sluice__fleet_lua_leader[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2]); return 1\n"
    "end\n"
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 2 end\n"
    "return 0\n";

/* publish: KEYS state leader; ARGV id limit state ttl_s. Only the leader writes S. */
const char sluice__fleet_lua_publish[] =
    "if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'limit', ARGV[2], 'state', ARGV[3], 'leader', ARGV[1])\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[4])\n"
    "return 1\n";

/* clear: KEYS state clears. Drops the shared state; returns the new clear count. */
const char sluice__fleet_lua_clear[] = "redis.call('DEL', KEYS[1])\n"
                                "return redis.call('INCR', KEYS[2])\n";

/* leave: KEYS holders held waiters leader load; ARGV id. Gives everything back. */
const char sluice__fleet_lua_leave[] =
    "redis.call('ZREM', KEYS[1], ARGV[1]); redis.call('HDEL', KEYS[2], ARGV[1])\n"
    "redis.call('ZREM', KEYS[3], ARGV[1]); redis.call('HDEL', KEYS[5], ARGV[1])\n"
    "if redis.call('GET', KEYS[4]) == ARGV[1] then redis.call('DEL', KEYS[4]) end\n"
    "return 1\n";

const char *sluice__fleet_script(const char *name)
{
    static const struct {
        const char *name, *text;
    } scripts[] = {{"beat", sluice__fleet_lua_beat},   {"report", sluice__fleet_lua_report}, {"drain", sluice__fleet_lua_drain},
                   {"leader", sluice__fleet_lua_leader}, {"publish", sluice__fleet_lua_publish}, {"clear", sluice__fleet_lua_clear},
                   {"leave", sluice__fleet_lua_leave}};
    for (size_t i = 0; name && i < sizeof scripts / sizeof scripts[0]; i++)
        if (!strcmp(name, scripts[i].name))
            return scripts[i].text;
    return NULL;
}

/* ---- Redis -------------------------------------------------------------------- */

static struct timeval ms_timeval(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

void sluice__fleet_disconnect(struct sluice_fleet *f)
{
    if (f->a_redis)
        redisFree(f->a_redis);
    f->a_redis = NULL;
}

void sluice__fleet_failed(struct sluice_fleet *f, const char *why)
{
    pthread_mutex_lock(&f->mu);
    snprintf(f->error, sizeof f->error, "%s", why && why[0] ? why : "unknown error");
    f->n_errors++;
    pthread_mutex_unlock(&f->mu);
    sluice__fleet_disconnect(f);
    /* One heartbeat, doubling to the ceiling; a beat that succeeds resets it (fleet.c).
     * So a server that takes connections but refuses every command (no or a wrong
     * password) is not reconnected at every beat. */
    int64_t now = sluice_monotonic_ns() / SLUICE_NS_PER_MS;
    f->a_backoff_ms = f->a_backoff_ms ? f->a_backoff_ms * 2 : f->heartbeat_ms;
    if (f->a_backoff_ms > FLEET_BACKOFF_MAX_MS)
        f->a_backoff_ms = FLEET_BACKOFF_MAX_MS;
    f->a_retry_at_ms = now + f->a_backoff_ms;
}

/* A plain command (AUTH, SELECT, the leader's store, and every EVAL); NULL and
 * sluice__fleet_failed with the server's own words on a transport or server error.
 * The caller frees. */
static redisReply *fleet_command(struct sluice_fleet *f, int argc, const char **argv)
{
    if (!f->a_redis)
        return NULL;
    redisReply *r = redisCommandArgv(f->a_redis, argc, argv, NULL);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        char why[256];
        snprintf(why, sizeof why, "%s: %s", argv[0], r ? r->str : f->a_redis->errstr);
        if (r)
            freeReplyObject(r);
        sluice__fleet_failed(f, why);
        return NULL;
    }
    return r;
}

/*
 * EVAL `script` with `nkeys` of the fleet's keys and argv; NULL (and the
 * connection dropped) on any transport or script error. The caller frees.
 */
redisReply *sluice__fleet_eval(struct sluice_fleet *f, const char *script,
                               const enum fleet_key *keys, int nkeys, const char *const *args,
                               int nargs)
{
    if (!f->a_redis)
        return NULL;
    const char *argv[16];
    char nk[8];
    snprintf(nk, sizeof nk, "%d", nkeys);
    int argc = 0;
    argv[argc++] = "EVAL";
    argv[argc++] = script;
    argv[argc++] = nk;
    for (int i = 0; i < nkeys; i++)
        argv[argc++] = f->key[keys[i]];
    for (int i = 0; i < nargs; i++)
        argv[argc++] = args[i];
    return fleet_command(f, argc, argv);
}

int64_t sluice__fleet_reply_int(const redisReply *r)
{
    if (!r)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r->type == REDIS_REPLY_STRING)
        return strtoll(r->str, NULL, 10);
    return 0;
}

/* ---- the leader's store: the state hash, called on the agent thread -------------- */

static int leader_store_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    struct sluice_fleet *f = ctx;
    (void)node;
    memset(out, 0, sizeof *out);
    const char *argv[] = {"HMGET", f->key[KEY_STATE], "ceiling", "expires", "locked_at", "policy"};
    redisReply *r = fleet_command(f, 6, argv);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
        if (r)
            freeReplyObject(r);
        return SLUICE_EIO;
    }
    out->ceiling = (uint32_t)sluice__fleet_reply_int(r->element[0]);
    out->expires_s = sluice__fleet_reply_int(r->element[1]);
    out->locked_at_s = sluice__fleet_reply_int(r->element[2]);
    if (r->element[3]->type == REDIS_REPLY_STRING)
        snprintf(out->policy, sizeof out->policy, "%s", r->element[3]->str);
    freeReplyObject(r);
    return SLUICE_OK;
}

static int leader_store_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    struct sluice_fleet *f = ctx;
    (void)node;
    char ceiling[16], expires[24], locked[24], ttl[24];
    snprintf(ceiling, sizeof ceiling, "%" PRIu32, rec->ceiling);
    snprintf(expires, sizeof expires, "%" PRId64, rec->expires_s);
    snprintf(locked, sizeof locked, "%" PRId64, rec->locked_at_s);
    snprintf(ttl, sizeof ttl, "%" PRId64, f->leader_desc.lock_ttl_s);
    const char *hset[] = {"HSET",      f->key[KEY_STATE], "ceiling", ceiling, "expires", expires,
                          "locked_at", locked,            "policy",  rec->policy};
    const char *expire[] = {"EXPIRE", f->key[KEY_STATE], ttl};
    redisReply *r = fleet_command(f, 10, hset);
    if (r) {
        freeReplyObject(r);
        r = fleet_command(f, 3, expire);
    }
    if (r)
        freeReplyObject(r);
    return r ? SLUICE_OK : SLUICE_EIO;
}

static int leader_store_clear(void *ctx, const char *node)
{
    struct sluice_fleet *f = ctx;
    (void)node;
    const char *argv[] = {"HDEL", f->key[KEY_STATE], "ceiling", "expires", "locked_at", "policy"};
    redisReply *r = fleet_command(f, 6, argv);
    if (r)
        freeReplyObject(r);
    return r ? SLUICE_OK : SLUICE_EIO;
}

/*
 * AUTH [user] password, then SELECT db, as the URL asked; false (failed) on a refusal.
 * With neither, a PING: a server that wants a password says so ("NOAUTH
 * Authentication required."), where the first EVAL would get only "Protocol error:
 * unauthenticated multibulk length" (a script is too long for an unauthenticated client).
 */
static bool fleet_login(struct sluice_fleet *f)
{
    redisReply *r = NULL;
    if (!f->password[0] && f->db < 0) {
        const char *ping[] = {"PING"};
        if (!(r = fleet_command(f, 1, ping)))
            return false;
        freeReplyObject(r);
    }
    if (f->password[0]) {
        const char *with_user[] = {"AUTH", f->user, f->password};
        const char *without[] = {"AUTH", f->password};
        r = f->user[0] ? fleet_command(f, 3, with_user) : fleet_command(f, 2, without);
        if (!r)
            return false;
        freeReplyObject(r);
    }
    if (f->db >= 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", f->db);
        const char *select[] = {"SELECT", db};
        if (!(r = fleet_command(f, 2, select)))
            return false;
        freeReplyObject(r);
    }
    return true;
}

bool sluice__fleet_connect(struct sluice_fleet *f)
{
    int64_t now = sluice_monotonic_ns() / SLUICE_NS_PER_MS;
    if (now < f->a_retry_at_ms)
        return false;
    redisContext *c = redisConnectWithTimeout(f->host, f->port, ms_timeval(f->heartbeat_ms));
    if (!c || c->err || redisSetTimeout(c, ms_timeval(f->heartbeat_ms)) != REDIS_OK) {
        char why[256];
        snprintf(why, sizeof why, "connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        sluice__fleet_failed(f, why);
        return false;
    }
    f->a_redis = c;
    return fleet_login(f);
}


struct sluice_store_ops sluice__fleet_leader_store(struct sluice_fleet *f)
{
    struct sluice_store_ops ops = {.load = leader_store_load, .save = leader_store_save,
                                   .clear = leader_store_clear, .ctx = f};
    return ops;
}
