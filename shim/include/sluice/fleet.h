/*
 * sluice/fleet.h — a fleet of processes shares one provider cap and one
 * discovered ceiling through Redis (hiredis).
 *
 * What it is: N processes on M hosts, each with its own pool for the same
 * provider, would each discover and use the whole cap and together exceed
 * it N-fold. A `struct sluice_fleet` per process ties its pool to a Redis
 * server that every process of the fleet names:
 *
 *   struct sluice_fleet *fleet;
 *   sluice_fleet_create(&(struct sluice_fleet_desc){
 *       .redis_url = "redis://10.0.0.5:6379", .node_id = "cloud:openrouter"}, &fleet);
 *   struct sluice_discovery_desc dd = {0};
 *   sluice_fleet_discovery(fleet, &dd);          // the pool follows the fleet
 *   sluice_pool_create(&(struct sluice_pool_desc){.active = 64, .discovery = &dd}, &pool);
 *   sluice_fleet_attach(fleet, pool);            // the agent thread starts
 *   ... sluice_pool_call_begin / call_end as usual ...
 *   sluice_fleet_destroy(fleet);                 // after the pool's last call
 *   sluice_pool_destroy(pool);
 *
 * (An engine's backend takes the same discovery description; attach
 * sluice_engine_pool(engine, id).)
 *
 * Redis keys, all under "sluice:{NODE}:" (one hash slot per node):
 *   state    hash: limit, state, ceiling, locked_at, expires, policy, leader;
 *            EXPIRE = lock_ttl_s, renewed by the leader. The shared ceiling.
 *   leader   the leader's process id, SET NX PX leader lease, renewed by
 *            compare-and-renew (Lua) every heartbeat.
 *   holders  sorted set: every live process, scored by the server's TIME
 *            (ms) of its last heartbeat; gone after holder_ttl.
 *   held     hash: process id -> fleet permits it leases.
 *   waiters  sorted set: processes waiting for permits, scored by the
 *            server TIME of their first ask: served strictly in that order.
 *   load     hash: process id -> calls it runs (its whole limit while calls
 *            queue for it); their sum, each at least 1 (a member's base permit
 *            is never free for another), is the fleet's in-flight for the leader.
 *   reports  list: each process's closed windows (completions, overloads,
 *            latency sums and mean deviations, peak in flight), drained by
 *            the leader.
 *   clears   counter: bumped by every fleet-wide clear.
 * Every operation on them is one atomic Lua script (heartbeat = refresh +
 * acquire or release + read the state; report; drain; leader renew; clear).
 *
 * Discovery runs once for the fleet: the process holding the leader lease
 * runs a sluice_discovery node (the description's policy, default
 * discover) on the fleet's summed windows, stores its lock in the state
 * hash (its store is that hash) and writes the shared limit S there every
 * heartbeat. When the leader dies another process takes the lease within
 * leader_ttl and starts from the state hash (its lock restored, else its
 * limit S as the starting point, grown by steps, not doubled: a leader before
 * it already probed up to S), not from the jumpstart.
 *
 * Permits: every live process always has one permit of its own (a pool's
 * limit never falls below discovery's min_limit, 1); the other S − N (N =
 * live processes) are leased in batches of `lease` (k) permits from a fair
 * distributed semaphore. A process asks for ceil((demand − 1) / k)·k leased
 * permits (demand = its calls in flight + queued); while others wait, at
 * most its fair share ceil((S − N) / N) rounded up to k; waiters are served
 * in the order they first asked. Its pool's limit is 1 + its leased permits.
 * A permit is given back only once the pool's limit is down and its calls
 * in flight fit, so a steady fleet never runs more than max(S, N) calls.
 * When S falls or a process joins, leases granted before exceed the new
 * S − N until each holder's next beats shed them (to floor((S − N) / N)
 * each, as soon as its calls fit): a few heartbeats.
 *
 * The hot path never talks to Redis: call_begin/call_end are the pool's
 * own (the local gate still orders waiters FIFO). The pool's discovery
 * runs a follower policy (sluice_fleet_discovery fills it in) whose update
 * adds the closed window to the next report and answers the limit the
 * agent published (an atomic); it does no I/O. One agent thread per fleet
 * does all network I/O once per heartbeat.
 *
 * An efficiency lock, not a correctness one: a process that pauses (GC,
 * SIGSTOP, a VM migration) or loses Redis for longer than holder_ttl loses
 * its lease in Redis while its pool still allows what it held, until its
 * next heartbeat. So the fleet may exceed max(S, N) by at most the permits
 * the paused processes held (each at most 1 + its fair share rounded up to
 * k, or 1 + S − N with no contention), for at most one heartbeat after
 * each resumes plus the length of the calls it started meanwhile. With the
 * defaults (k = 4, heartbeat 200 ms, holder_ttl 5 heartbeats = 1 s): the
 * leases of a process paused over 1 s return to the others, and on resume
 * it may run its old limit (1 + a multiple of 4) for up to 200 ms.
 * The same holds for a process cut off from Redis: see Failure.
 *
 * Clear: sluice_fleet_clear, a clear of the pool (C API, admin POST,
 * sluice_engine_clear: the pool's store is the fleet's) or, from outside,
 * sluice_fleet_clear_node (`sluicectl clear NODE --redis URL`) clears the
 * node fleet-wide: the state hash is dropped and the clears counter bumped; the
 * leader restarts discovery from the jumpstart; every process sees the new
 * state (and any new lock) at its next heartbeat.
 *
 * Failure: when a Redis call fails (or the server does not answer within
 * a heartbeat), the agent drops the connection, publishes the local share
 * max(floor, S / N) from the last state it saw (fallback; a "store" event
 * with cause store_error), keeps the pool serving and reconnects with
 * exponential backoff (one heartbeat doubling up to 5 s, reset only by a
 * beat that went through, so a server that accepts the connection but
 * refuses every command, e.g. for a missing or wrong password, is retried
 * at that pace too). On reconnect it re-registers, leases again, and emits
 * a "restore" event (cause store). Why the last step failed, in the
 * server's own words ("AUTH: WRONGPASS invalid username-password pair
 * ...", "PING: NOAUTH Authentication required.") or hiredis's ("connect:
 * Connection refused"), is sluice_fleet_last_error: read it from on_event
 * when the store event comes. Both events go to on_event and the fleet's
 * ring, and join the attached pool's node feed too (its on_event, an
 * engine's, the admin page, /metrics and sluicectl events). A Redis that
 * does not answer at create is the same case: the fleet starts in fallback,
 * so a process can boot during a Redis outage. It has seen no state then,
 * so it runs at the floor (1 by default: one call at a time) until Redis
 * answers: with no S and no N, any more could overrun the cap N-fold when
 * the whole fleet boots into the same outage.
 *
 * Redis URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (port 6379) or
 * HOST:PORT. A bare HOST is refused at create (more often a slip, such as a
 * flag read as the value, than a server's name), and so is a unix socket
 * path (the agent speaks TCP only). With a password the agent sends AUTH
 * [USER] PASSWORD (requirepass, or an ACL user) on every connection, and
 * SELECT DB with a database. USER and PASSWORD are percent-decoded ("%40" for "@"); the
 * password is never logged or put in a message, and is wiped at destroy.
 * rediss:// (TLS) is refused at create: Debian's hiredis is built without
 * TLS, so use redis:// on a trusted network or through a TLS tunnel.
 *
 * Threads: create, attach and destroy from one thread; sluice_fleet_clear,
 * sluice_fleet_snapshot and the event ring from any. The agent thread runs
 * on_event (not under any lock; it must not call destroy).
 *
 * Progress: the pool's hot path is as without a fleet (lock-free admit,
 * FIFO gate); the follower policy's update takes a short spinlock to add a
 * window to the report. The agent blocks on Redis, with a timeout of one
 * heartbeat per call.
 *
 * Memory ordering: the published limit, the counters and the status
 * fields are relaxed atomics (a status is a set of recent values); the
 * report accumulator is under its spinlock (acquire/release); the agent's
 * stop flag and clear requests use a mutex and condition variable.
 *
 * Allocation: at create (the fleet, with its event ring) and at each
 * (re)connect and leadership change (hiredis, the leader's discovery node).
 */
#ifndef SLUICE_FLEET_H
#define SLUICE_FLEET_H

#include <sluice/pool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLUICE_FLEET_LEASE_MAX UINT32_C(1024)
#define SLUICE_FLEET_HEARTBEAT_MIN_MS 10
#define SLUICE_FLEET_HEARTBEAT_MAX_MS 10000
#define SLUICE_FLEET_TTL_BEATS_MAX UINT32_C(100)
#define SLUICE_FLEET_ID_MAX 96 /* bytes of a process id, terminator included */

/* What each field of struct sluice_fleet_desc left out becomes; the shared
 * node's jumpstart, limits and lock TTL default as discovery's do
 * (SLUICE_DISCOVERY_*_DEFAULT). */
#define SLUICE_FLEET_LEASE_DEFAULT UINT32_C(4)
#define SLUICE_FLEET_HEARTBEAT_MS_DEFAULT 200
#define SLUICE_FLEET_HOLDER_TTL_BEATS_DEFAULT UINT32_C(5)
#define SLUICE_FLEET_LEADER_TTL_BEATS_DEFAULT UINT32_C(5)
#define SLUICE_FLEET_FLOOR_DEFAULT UINT32_C(1)

struct sluice_fleet;

struct sluice_fleet_desc {
    const char *redis_url;          /* required: "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"
                                       or "HOST:PORT" (port default 6379; see "Redis URL";
                                       rediss:// is refused) */
    const char *node_id;            /* required: the shared node, at most SLUICE_NODE_ID_MAX-1
                                       bytes; every process of the fleet names the same */
    const char *process_id;         /* this process in Redis (default: "HOST:PID:RANDOM"), at
                                       most SLUICE_FLEET_ID_MAX-1 bytes, unique in the fleet */
    struct sluice_opt_u32 lease;    /* k, permits leased per ask, in [1, SLUICE_FLEET_LEASE_MAX]
                                       (default: 4; SLUICE_SOME(0) is an error) */
    int64_t heartbeat_ms;           /* agent period, in [SLUICE_FLEET_HEARTBEAT_MIN_MS,
                                       SLUICE_FLEET_HEARTBEAT_MAX_MS] (default: 200) */
    uint32_t holder_ttl_beats;      /* a silent process's leases expire after this many
                                       heartbeats, in [2, SLUICE_FLEET_TTL_BEATS_MAX]
                                       (default: 5) */
    uint32_t leader_ttl_beats;      /* the leader lease, in heartbeats, in [2,
                                       SLUICE_FLEET_TTL_BEATS_MAX] (default: 5) */
    uint32_t floor;                 /* least local limit while Redis is unreachable, at most
                                       max_limit (default: 1) */
    /* The fleet's discovery, run by the leader on the summed windows. */
    const struct sluice_policy *policy; /* prototype, copied (default: discover with
                                       backoff 0.75: the leader hears of overloads late) */
    uint32_t jumpstart;             /* S at the start and after a clear (default: 5) */
    uint32_t min_limit;             /* S never falls below (default: 1) */
    uint32_t max_limit;             /* S never rises above, at most SLUICE_POOL_ACTIVE_MAX
                                       (default: 1024) */
    int64_t lock_ttl_s;             /* the shared lock's TTL, also the state hash's EXPIRE
                                       (default: 86400) */
    sluice_event_fn on_event;       /* fleet events (fallback, reconnect) and the leader's
                                       discovery events, on the agent thread (default: none) */
    void *on_event_ctx;
    char *error;                    /* receives a message naming the field when create fails
                                       (default: NULL); "" on success */
    size_t error_size;
};

/*
 * Check the description and make the fleet; no network I/O yet (the agent
 * connects once attached). SLUICE_EINVAL with a message naming the field
 * (e.g. "sluice_fleet_desc.lease must be in [1, 1024]"), SLUICE_ENOMEM.
 */
int sluice_fleet_create(const struct sluice_fleet_desc *desc, struct sluice_fleet **out);

/*
 * Fill a pool's discovery description so the pool follows the fleet: its
 * node_id, policy (the follower: the published limit) and store (the
 * fleet's: load restores nothing, since a process's limit is its lease;
 * save is ignored, since the leader alone writes the shared lock; clear
 * clears the node fleet-wide). Other fields are left as they are.
 */
void sluice_fleet_discovery(struct sluice_fleet *fleet, struct sluice_discovery_desc *dd);

/*
 * Start the agent for `pool`, an adaptive pool created with
 * sluice_fleet_discovery's description. SLUICE_EINVAL if the pool has no
 * discovery or the fleet is already attached; SLUICE_ENOMEM if the thread
 * cannot start.
 */
int sluice_fleet_attach(struct sluice_fleet *fleet, struct sluice_pool *pool);

/* Clear the node fleet-wide (see "Clear"); runs on the agent's next beat. */
int sluice_fleet_clear(struct sluice_fleet *fleet);

/*
 * The same clear from outside the fleet (a tool: sluicectl clear --redis):
 * connects (AUTH and SELECT as the URL says), clears node_id's shared
 * state, disconnects; blocks for at most a second. SLUICE_EINVAL for a bad
 * URL (message in error), SLUICE_EIO when the server does not answer or
 * refuses (the message ends with the server's own words).
 */
int sluice_fleet_clear_node(const char *redis_url, const char *node_id, char *error,
                            size_t error_size);

struct sluice_fleet_status {
    bool connected;          /* the last Redis call succeeded */
    bool leader;             /* this process holds the leader lease */
    uint32_t shared_limit;   /* S, from the state hash (or the leader's own) */
    uint32_t ceiling;        /* the shared locked ceiling; 0 = none */
    int64_t lock_expires_s;  /* its expiry, wall clock epoch seconds; 0 = none */
    enum sluice_discovery_state state; /* the shared state */
    uint32_t processes;      /* live processes at the last heartbeat */
    uint32_t leased;         /* permits this process leases from Redis */
    uint32_t local_limit;    /* the limit published to the pool */
    uint64_t beats;          /* heartbeats run */
    uint64_t fallbacks;      /* times Redis was lost */
    uint64_t reconnects;     /* times it came back */
};

/* A snapshot of the fleet as this process last saw it (relaxed reads; callable from any thread). */
void sluice_fleet_snapshot(const struct sluice_fleet *fleet, struct sluice_fleet_status *out);

/*
 * Why the latest Redis step failed, in the server's words (prefixed with the
 * command: "AUTH: WRONGPASS ...") or hiredis's ("connect: Connection
 * refused"), copied into buf (snprintf semantics; "" before any failure).
 * Returns how many steps have failed so far, so a caller can tell a new
 * failure from the one it saw. Any thread (takes the fleet's mutex briefly).
 */
uint64_t sluice_fleet_last_error(struct sluice_fleet *fleet, char *buf, size_t size);

/* Fleet events (fallback, reconnect, and the leader's discovery), for
 * sluice_event_ring_read / _write_json. */
const struct sluice_event_ring *sluice_fleet_events(const struct sluice_fleet *fleet);

/*
 * Stop the agent (waiting for its current beat), give the leases and any
 * leader lease back (one last Redis call, bounded by a heartbeat) and free.
 * No call may be in flight on the pool or start after this: the pool's
 * policy reads the fleet. NULL is a no-op.
 */
void sluice_fleet_destroy(struct sluice_fleet *fleet);

/* For tests: the text of one Lua script ("beat", "report", "drain",
 * "leader", "clear", "leave"); NULL for another name. */
const char *sluice__fleet_script(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_FLEET_H */
