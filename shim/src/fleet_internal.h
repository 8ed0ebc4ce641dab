/*
 * fleet_internal.h — what fleet.c (configuration, follower policy, leader,
 * agent) and fleet_redis.c (Lua scripts, the hiredis connection, the
 * leader's store) share: the fleet's struct and the Redis helpers.
 *
 * Who owns what: the agent thread owns the Redis connection, the leader's
 * discovery node and its gate, and every `a_` field; pools touch only the
 * report accumulator (under `report_lock`) and `published`.
 * Status fields (`s_`) are relaxed atomics the agent writes and anyone
 * reads. `mu` guards `stop` and `clear_requests`.
 */
#ifndef SLUICE_FLEET_INTERNAL_H
#define SLUICE_FLEET_INTERNAL_H

#include <sluice/fleet.h>

#include <hiredis/hiredis.h>
#include <pthread.h>

#define FLEET_EVENTS 256          /* fleet event ring capacity */
#define FLEET_BACKOFF_MAX_MS 5000 /* reconnect backoff ceiling */

enum fleet_key { KEY_STATE, KEY_LEADER, KEY_HOLDERS, KEY_HELD, KEY_WAITERS, KEY_REPORTS,
                 KEY_CLEARS, KEY_LOAD, KEY_COUNT };
extern const char *const sluice__fleet_key_suffix[KEY_COUNT];

/* One report's worth of closed local windows (under report_lock). */
struct fleet_report {
    uint64_t n_ok, n_overload, n_served;
    int64_t latency_sum, latency_min, retry_after;
    int64_t deviation_sum; /* Σ latency_mad_ns · n_ok: the calls' spread, which the leader
                              rebuilds (a report's mean alone reads as calls without noise) */
    int64_t refusal_ns;    /* the longest a fresh overload took: a refusal at the door comes
                              back far sooner than a call, a gateway's after its queue's wait */
    uint32_t max_in_flight;
    int64_t first_start_ns; /* pool clock: the oldest window's start; 0 = empty */
};

/* The follower policy a fleet's pool runs (see "the follower policy" below). */
struct sluice_policy_fleet {
    struct sluice_policy base;
    struct sluice_fleet *fleet; /* shared, outlives the pool's calls (see destroy) */
};

struct sluice_fleet {
    /* Configuration (immutable after create). */
    char host[256];
    int port;
    char user[128];     /* ACL user for AUTH; "" = the default user */
    char password[256]; /* "" = no AUTH; wiped at destroy */
    int db;             /* SELECT after connecting; -1 = none (the server's 0) */
    char node[SLUICE_NODE_ID_MAX];
    char id[SLUICE_FLEET_ID_MAX];
    char key[KEY_COUNT][SLUICE_NODE_ID_MAX + 24];
    uint32_t lease, holder_ttl_beats, leader_ttl_beats, floor;
    int64_t heartbeat_ms;
    struct sluice_discovery_desc leader_desc; /* policy, limits, TTL; jumpstart per takeover */
    union {
        max_align_t align;
        unsigned char bytes[SLUICE_POLICY_STATE_MAX];
    } policy; /* the leader's policy prototype (a copy of the description's) */
    sluice_event_fn on_event;
    void *on_event_ctx;
    struct sluice_policy_fleet follower;  /* the pool's policy prototype */
    struct sluice_store_ops store_ops;    /* the pool's store */

    /* Pools' side. */
    sluice_spinlock report_lock;
    struct fleet_report report;
    _Atomic(uint32_t) published; /* the local limit the follower policy answers */

    /* Status, written by the agent. */
    _Atomic(uint32_t) s_connected, s_leader, s_shared, s_ceiling, s_state, s_processes, s_leased;
    _Atomic(int64_t) s_expires;
    _Atomic(uint64_t) s_beats, s_fallbacks, s_reconnects;

    /* The agent's own. */
    struct sluice_pool *pool;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* guards stop, clear_requests and the error; cv wakes the agent early */
    pthread_cond_t cv;
    bool stop;
    uint32_t clear_requests;
    char error[256];   /* why the last Redis step failed, in the server's or hiredis's words */
    uint64_t n_errors; /* failed Redis steps so far */
    redisContext *a_redis;
    int64_t a_retry_at_ms, a_backoff_ms;
    bool a_ever_connected;
    uint64_t a_clears_seen; /* the clears counter the leader has acted on */
    uint32_t a_fleet_load;  /* calls the fleet runs, summed over processes at the last beat */
    uint32_t a_kicked_for;  /* the published limit the pool was last told to take now */
    uint32_t a_window_fed;  /* served calls fed to the leader's open window */
    uint32_t a_window_beats; /* beats since the leader's window opened */
    struct sluice_discovery *a_leader; /* non-NULL while this process leads */
    struct sluice_gate a_leader_gate;  /* the leader node's gate: S, never acquired */
    struct sluice_store_ops a_leader_store;

    struct sluice_event_ring events;
    struct sluice_event_slot slots[FLEET_EVENTS];
};

/* The Lua scripts (fleet_redis.c); each one's keys and arguments are described there. */
extern const char sluice__fleet_lua_beat[], sluice__fleet_lua_report[], sluice__fleet_lua_drain[],
    sluice__fleet_lua_leader[], sluice__fleet_lua_publish[], sluice__fleet_lua_clear[],
    sluice__fleet_lua_leave[];

/* Connect (and AUTH, SELECT) unless the backoff says wait; false when not connected. */
bool sluice__fleet_connect(struct sluice_fleet *f);
void sluice__fleet_disconnect(struct sluice_fleet *f);
/* A Redis step failed: keep `why`, drop the connection, back off before the next try. */
void sluice__fleet_failed(struct sluice_fleet *f, const char *why);
/* EVAL a script with `nkeys` of the fleet's keys; NULL (and disconnected) on any error. */
redisReply *sluice__fleet_eval(struct sluice_fleet *f, const char *script,
                               const enum fleet_key *keys, int nkeys, const char *const *args,
                               int nargs);
int64_t sluice__fleet_reply_int(const redisReply *r);
/* The leader node's store: the state hash, over the agent's connection. */
struct sluice_store_ops sluice__fleet_leader_store(struct sluice_fleet *f);

#endif /* SLUICE_FLEET_INTERNAL_H */
