/*
 * fleet.c — the Redis-backed fleet (sluice/fleet.h): configuration, the
 * follower policy and store a pool runs, the leader's discovery node and the
 * agent thread. The Lua scripts, the hiredis connection and the leader's
 * store are in fleet_redis.c; the fleet's struct is in fleet_internal.h.
 */
#include "alloc_internal.h"
#include "fleet_internal.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FLEET_SAMPLES_PER_REPORT 64  /* samples the leader feeds per report and outcome */
#define FLEET_CUT_BEATS 3            /* heartbeats the fleet takes to apply a cut of S */
#define FLEET_BACKOFF 0.75           /* the default leader policy's cut on an overload */
#define FLEET_WINDOW_CALLS 16        /* measured calls a leader's window waits for (see leader_beat) */
#define FLEET_WINDOW_BEATS 3         /* ... and beats: the length timed windows had at 100 ms beats */
#define FLEET_WINDOW_MAX_BEATS 150   /* ... or this many beats, whatever it holds */
/* A follower pool's window_samples when it sets none (see sluice_fleet_discovery). */
#define FLEET_FOLLOWER_WINDOW_SAMPLES 1

/* ---- configuration ------------------------------------------------------------ */

#define FLEET_URL_FORM "\"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\" or \"HOST:PORT\""

/* Percent-decode the n bytes at s into out (NUL-terminated); false when malformed or long. */
static bool url_decode(const char *s, size_t n, char *out, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++, o++) {
        if (o + 1 >= size)
            return false;
        if (s[i] != '%') {
            out[o] = s[i];
            continue;
        }
        char hex[3] = {i + 2 < n ? s[i + 1] : '\0', i + 2 < n ? s[i + 2] : '\0', '\0'};
        if (!isxdigit((unsigned char)hex[0]) || !isxdigit((unsigned char)hex[1]) ||
            !(out[o] = (char)strtol(hex, NULL, 16))) /* %00 would cut the string */
            return false;
        i += 2;
    }
    out[o] = '\0';
    return true;
}

/* A decimal in [lo, hi] spelling all n bytes at s; -1 when it is not one. */
static long url_number(const char *s, size_t n, long lo, long hi)
{
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]) || v > hi)
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return n && v >= lo && v <= hi ? v : -1;
}

/*
 * FLEET_URL_FORM into the fleet's host, port, user, password and db (user and
 * password percent-decoded: "%40" for an "@" in a password). NULL when valid, else
 * the message naming what is wrong.
 */
static const char *parse_url(const char *url, struct sluice_fleet *f)
{
    static const char scheme[] = "redis://", tls[] = "rediss://";
    if (!strncmp(url, tls, sizeof tls - 1))
        return "sluice_fleet_desc.redis_url: rediss:// (TLS) is not supported: this hiredis is "
               "built without TLS (Debian's is); use redis:// on a trusted network or through a "
               "TLS tunnel (stunnel, spiped)";
    if (!strncmp(url, "unix://", 7) || url[0] == '/' || url[0] == '.')
        return "sluice_fleet_desc.redis_url: a unix socket is not supported; give the server's "
               "TCP address (" FLEET_URL_FORM ")";
    bool has_scheme = !strncmp(url, scheme, sizeof scheme - 1);
    if (has_scheme)
        url += sizeof scheme - 1;
    else if (strstr(url, "://"))
        return "sluice_fleet_desc.redis_url has a scheme other than redis:// (use " FLEET_URL_FORM
               ")";
    else if (!strchr(url, ':'))
        /* A bare word is more often a slip (a flag taken for the value, an unset variable's
         * neighbour) than a host: say which server by writing the scheme or the port. */
        return "sluice_fleet_desc.redis_url is neither redis://... nor HOST:PORT (write "
               "redis://HOST, port 6379, or HOST:PORT)";
    const char *at = strrchr(url, '@'), *host = at ? at + 1 : url;
    if (at) {
        const char *colon = memchr(url, ':', (size_t)(at - url));
        if (!colon || !url_decode(url, (size_t)(colon - url), f->user, sizeof f->user) ||
            !url_decode(colon + 1, (size_t)(at - colon - 1), f->password, sizeof f->password) ||
            !f->password[0])
            return "sluice_fleet_desc.redis_url: the part before '@' must be USER:PASSWORD or "
                   ":PASSWORD (percent-encoded, a password of at most 255 bytes)";
    }
    const char *slash = strchr(host, '/');
    size_t len = slash ? (size_t)(slash - host) : strlen(host);
    f->db = -1;
    if (slash && slash[1] && (f->db = (int)url_number(slash + 1, strlen(slash + 1), 0, INT_MAX)) < 0)
        return "sluice_fleet_desc.redis_url: the database after '/' must be a number (e.g. "
               "redis://HOST:6379/2)";
    const char *colon = NULL; /* the last ':' before the database */
    for (const char *p = host; p < host + len; p++)
        if (*p == ':')
            colon = p;
    size_t n = colon ? (size_t)(colon - host) : len;
    f->port = colon ? (int)url_number(colon + 1, len - n - 1, 1, 65535) : 6379;
    if (n == 0 || n >= sizeof f->host || f->port < 0)
        return "sluice_fleet_desc.redis_url must be " FLEET_URL_FORM " with a port in [1, 65535]";
    memcpy(f->host, host, n);
    f->host[n] = '\0';
    return NULL;
}

/* Check the description and fill the fleet's configuration. */
static int fleet_configure(struct sluice_fleet *f, const struct sluice_fleet_desc *d)
{
    if (!d)
        return SLUICE_EINVAL;
    if (!d->redis_url || !d->redis_url[0])
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.redis_url is required (" FLEET_URL_FORM ")");
    const char *bad_url = parse_url(d->redis_url, f);
    if (bad_url)
        return sluice__fail(d->error, d->error_size, "%s", bad_url);
    if (!d->node_id || !d->node_id[0] || strlen(d->node_id) >= SLUICE_NODE_ID_MAX)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.node_id is required, at most "
                            "SLUICE_NODE_ID_MAX-1 bytes");
    if (d->process_id && (!d->process_id[0] || strlen(d->process_id) >= SLUICE_FLEET_ID_MAX))
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.process_id must be non-empty, at most "
                            "SLUICE_FLEET_ID_MAX-1 bytes");
    struct sluice_opt_u32 lease = d->lease;
    SLUICE__DEFAULT_OPT(lease, SLUICE_FLEET_LEASE_DEFAULT);
    f->lease = lease.value;
    if (f->lease < 1 || f->lease > SLUICE_FLEET_LEASE_MAX)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.lease must be in [1, 1024] (permits per lease)");
    f->heartbeat_ms = d->heartbeat_ms;
    SLUICE__DEFAULT(f->heartbeat_ms, SLUICE_FLEET_HEARTBEAT_MS_DEFAULT);
    if (f->heartbeat_ms < SLUICE_FLEET_HEARTBEAT_MIN_MS ||
        f->heartbeat_ms > SLUICE_FLEET_HEARTBEAT_MAX_MS)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.heartbeat_ms must be in [10, 10000]");
    f->holder_ttl_beats = d->holder_ttl_beats;
    SLUICE__DEFAULT(f->holder_ttl_beats, SLUICE_FLEET_HOLDER_TTL_BEATS_DEFAULT);
    f->leader_ttl_beats = d->leader_ttl_beats;
    SLUICE__DEFAULT(f->leader_ttl_beats, SLUICE_FLEET_LEADER_TTL_BEATS_DEFAULT);
    if (f->holder_ttl_beats < 2 || f->holder_ttl_beats > SLUICE_FLEET_TTL_BEATS_MAX)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.holder_ttl_beats must be in [2, 100]");
    if (f->leader_ttl_beats < 2 || f->leader_ttl_beats > SLUICE_FLEET_TTL_BEATS_MAX)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.leader_ttl_beats must be in [2, 100]");
    if (d->max_limit > SLUICE_POOL_ACTIVE_MAX)
        return sluice__fail(d->error, d->error_size,
                            "sluice_fleet_desc.max_limit is above SLUICE_POOL_ACTIVE_MAX");
    /* The leader's node: discovery checks the rest, naming the fleet's fields, and its
     * resolved limits and TTL are what the fleet shares. */
    struct sluice_discovery_desc *ld = &f->leader_desc;
    memset(ld, 0, sizeof *ld);
    strcpy(f->node, d->node_id);
    ld->node_id = f->node;
    ld->gate = &f->a_leader_gate;
    ld->jumpstart = d->jumpstart;
    ld->min_limit = d->min_limit;
    ld->max_limit = d->max_limit;
    ld->lock_ttl_s = d->lock_ttl_s;
    ld->policy = d->policy;
    struct sluice__discovery_cfg leader;
    if (sluice__discovery_resolve(ld, &leader, "sluice_fleet_desc", d->error, d->error_size) !=
        SLUICE_OK)
        return SLUICE_EINVAL;
    ld->jumpstart = leader.jumpstart;
    ld->min_limit = leader.min_limit;
    ld->max_limit = leader.max_limit;
    ld->lock_ttl_s = leader.lock_ttl_s;
    f->floor = d->floor;
    SLUICE__DEFAULT(f->floor, SLUICE_FLEET_FLOOR_DEFAULT);
    if (f->floor > ld->max_limit)
        return sluice__fail(d->error, d->error_size, "sluice_fleet_desc.floor is above max_limit");
    if (d->policy) { /* a value: keep our own copy of the prototype */
        memcpy(f->policy.bytes, (const void *)d->policy, d->policy->ops->size);
    } else {
        /* discover, backing off harder than alone: the leader hears of an overload a
         * beat or two late, when every process has run at the overshoot meanwhile. */
        struct sluice_policy_discover def;
        sluice_policy_discover_init(
            &def, &(struct sluice_policy_discover_params){.backoff = FLEET_BACKOFF}, NULL, 0);
        memcpy(f->policy.bytes, (const void *)&def, sizeof def);
    }
    ld->policy = (const struct sluice_policy *)(void *)f->policy.bytes;
    if (d->process_id) {
        snprintf(f->id, sizeof f->id, "%s", d->process_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(f->id, sizeof f->id, "%s:%ld:%08lx", host, (long)getpid(),
                 (unsigned long)(ts.tv_nsec ^ (long)getpid() << 16));
    }
    for (int i = 0; i < KEY_COUNT; i++)
        snprintf(f->key[i], sizeof f->key[i], "sluice:{%s}:%s", f->node, sluice__fleet_key_suffix[i]);
    f->on_event = d->on_event;
    f->on_event_ctx = d->on_event_ctx;
    return SLUICE_OK;
}

/* ---- events -------------------------------------------------------------------- */

/*
 * Record and deliver one fleet event (agent thread: the ring's one writer). It joins the
 * pool's node feed too: that feed is what a program shows (the admin page, /metrics,
 * sluicectl events, an engine's on_event), and without it a process cut off from Redis
 * served at its floor with nothing there to say why.
 */
static void fleet_emit(struct sluice_fleet *f, enum sluice_event_kind kind, enum sluice_cause cause,
                       uint32_t old_limit, uint32_t new_limit)
{
    struct sluice_event ev;
    memset(&ev, 0, sizeof ev);
    ev.t_ns = sluice_monotonic_ns();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev.wall_ms = sluice_timespec_ns(&ts) / SLUICE_NS_PER_MS;
    ev.kind = kind;
    ev.cause = cause;
    ev.old_limit = old_limit;
    ev.new_limit = new_limit;
    ev.in_flight = f->pool ? sluice_pool_stats(f->pool).in_flight : 0;
    ev.ceiling = atomic_load_explicit(&f->s_ceiling, SLUICE_RELAXED);
    sluice_event_ring_push(&f->events, &ev);
    if (f->on_event)
        f->on_event(f->on_event_ctx, &ev);
    struct sluice_discovery *d = f->pool ? sluice_pool_discovery(f->pool) : NULL;
    if (d) {
        sluice_spinlock_lock(&d->lock);
        sluice__discovery_emit_locked(d, sluice_clock_now(&d->clock), kind, cause, old_limit,
                                      new_limit);
        sluice__discovery_unlock(d);
        sluice_discovery_flush(d); /* delivers it to the pool's on_event */
    }
}

/* The leader node's events join the fleet's feed. */
static void fleet_leader_event(void *ctx, const struct sluice_event *ev)
{
    struct sluice_fleet *f = ctx;
    struct sluice_event copy = *ev;
    sluice_event_ring_push(&f->events, &copy);
    if (f->on_event)
        f->on_event(f->on_event_ctx, &copy);
}

/* ---- the follower policy (runs in the pool, under its discovery's try-lock) ------ */

static uint32_t fleet_policy_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)jumpstart;
    (void)warm;
    struct sluice_policy_fleet *p = (struct sluice_policy_fleet *)self;
    return atomic_load_explicit(&p->fleet->published, SLUICE_RELAXED);
}

/* Add the closed window to the next report, answer the published limit. No I/O. */
static struct sluice_verdict fleet_policy_update(struct sluice_policy *self,
                                                 const struct sluice_window *w)
{
    struct sluice_policy_fleet *p = (struct sluice_policy_fleet *)self;
    struct sluice_fleet *f = p->fleet;
    sluice_spinlock_lock(&f->report_lock);
    struct fleet_report *r = &f->report;
    r->n_ok += w->n_ok;
    r->n_overload += w->n_overload;
    r->n_served += w->n_served;
    r->latency_sum += w->latency_mean_ns * (int64_t)w->n_ok;
    r->deviation_sum += w->latency_mad_ns * (int64_t)w->n_ok;
    if (w->n_ok && (!r->latency_min || w->latency_min_ns < r->latency_min))
        r->latency_min = w->latency_min_ns;
    if (w->retry_after_ns > r->retry_after)
        r->retry_after = w->retry_after_ns;
    if (w->overload_latency_ns > r->refusal_ns)
        r->refusal_ns = w->overload_latency_ns;
    if (w->max_in_flight > r->max_in_flight)
        r->max_in_flight = w->max_in_flight;
    if (!r->first_start_ns)
        r->first_start_ns = w->start_ns ? w->start_ns : 1;
    sluice_spinlock_unlock(&f->report_lock);
    uint32_t limit = atomic_load_explicit(&f->published, SLUICE_RELAXED);
    return sluice_verdict_make(limit, limit > w->limit ? SLUICE_CAUSE_ADDITIVE : SLUICE_CAUSE_NONE, 0);
}

static const struct sluice_policy_ops fleet_policy_ops = {
    "fleet", true, fleet_policy_reset, fleet_policy_update, sizeof(struct sluice_policy_fleet)};

/* ---- the pool's store: clear is fleet-wide, the lock is the leader's ------------- */

static int fleet_store_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    (void)ctx;
    (void)node;
    memset(out, 0, sizeof *out); /* a process's limit is its lease, never the ceiling */
    return SLUICE_OK;
}

static int fleet_store_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    (void)ctx;
    (void)node;
    (void)rec; /* the leader alone writes the shared lock */
    return SLUICE_OK;
}

static int fleet_store_clear(void *ctx, const char *node)
{
    (void)node;
    return sluice_fleet_clear(ctx);
}

/* ---- leadership ------------------------------------------------------------------ */

static void leader_stop(struct sluice_fleet *f)
{
    if (!f->a_leader)
        return;
    sluice_discovery_sync(f->a_leader);
    sluice_discovery_destroy(f->a_leader);
    f->a_leader = NULL;
    atomic_store_explicit(&f->s_leader, 0u, SLUICE_RELAXED);
}

/* Took the lease: start the fleet's discovery from the shared state. */
static void leader_start(struct sluice_fleet *f, uint32_t shared_limit, uint64_t clears)
{
    struct sluice_discovery_desc d = f->leader_desc; /* its limits resolved at create */
    uint32_t min = d.min_limit, max = d.max_limit;
    if (shared_limit)
        d.jumpstart = shared_limit < min ? min : shared_limit > max ? max : shared_limit;
    f->a_leader_store = sluice__fleet_leader_store(f);
    d.store = &f->a_leader_store;
    /* The leader closes its windows itself (leader_beat); the node's own
     * schedule is only the cap, and every report fed before it is measured. */
    d.window_min_ns = d.window_max_ns = FLEET_WINDOW_MAX_BEATS * f->heartbeat_ms * SLUICE_NS_PER_MS;
    f->a_window_fed = f->a_window_beats = 0;
    d.on_event = fleet_leader_event;
    d.on_event_ctx = f;
    sluice_gate_init(&f->a_leader_gate, max);
    if (sluice_discovery_create(&d, &f->a_leader) != SLUICE_OK) {
        f->a_leader = NULL;
        return;
    }
    /* A leader before this one grew S past the jumpstart, so it was probed up to here:
     * doubling from it overshoots by S (a leader that missed a beat on a loaded machine took
     * the lease back at 36 and slow-started to 72 against a cap of 24). Grow from it by steps,
     * as after a restored lock. */
    if (d.jumpstart > f->leader_desc.jumpstart &&
        sluice_discovery_state(f->a_leader) == SLUICE_DISCOVERY_PROBING)
        sluice_policy_reset(sluice__discovery_policy(f->a_leader), d.jumpstart, true);
    f->a_clears_seen = clears;
    atomic_store_explicit(&f->s_leader, 1u, SLUICE_RELAXED);
}

/*
 * Feed one drained report ("ok overload served lat_sum lat_min maxif retry start_ms
 * deviation_sum refusal_ns"; an older member's lacks the last one or two) to
 * the leader's node; answer the samples fed. Served calls count as started now: reports
 * arrive a beat or two late, and the node measures only calls that started in its open
 * window (which leader_beat closes). Overloads keep the report's start (its oldest
 * window's, in server time): one that started before the node's last cut is stale, so
 * the burst of 429s a cut was made for does not cut again when it arrives late.
 */
static unsigned leader_feed(struct sluice_fleet *f, const char *report, int64_t now_srv_ms,
                            enum sluice_outcome outcome)
{
    unsigned long long ok, overload, served;
    long long lat_sum, lat_min, retry, start_ms, dev_sum = 0, refusal_ns = 0;
    unsigned maxif, n = 0;
    if (sscanf(report, "%llu %llu %llu %lld %lld %u %lld %lld %lld %lld", &ok, &overload,
               &served, &lat_sum, &lat_min, &maxif, &retry, &start_ms, &dev_sum,
               &refusal_ns) < 8)
        return 0;
    int64_t now = sluice_monotonic_ns();
    int64_t age_ns = (now_srv_ms - start_ms) * SLUICE_NS_PER_MS;
    struct sluice_sample s = {0};
    s.start_ns = now;
    s.in_flight_at_start = f->a_fleet_load;
    s.outcome = SLUICE_OUTCOME_OK;
    s.latency_ns = ok ? (int64_t)(lat_sum / (long long)ok) : 0;
    /* The calls' spread, rebuilt: the rest alternate one mean deviation either side of
     * the mean. Copies of the mean alone read as calls without noise, and the knee test,
     * which weighs a rise against that noise, read a fleet's sampling error as a queue
     * (a cap of 24 locked at 7). */
    int64_t dev = ok && dev_sum > 0 ? (int64_t)(dev_sum / (long long)ok) : 0;
    if (dev > s.latency_ns)
        dev = s.latency_ns;
    for (; outcome == SLUICE_OUTCOME_OK && n < ok && n < FLEET_SAMPLES_PER_REPORT; n++) {
        /* One at the window's fastest, so the policy's minimum filter sees it. */
        struct sluice_sample one = s;
        if (n == 0 && lat_min > 0)
            one.latency_ns = lat_min;
        else if (n + 1 < ok || n % 2 == 0) /* an odd last one stays at the mean */
            one.latency_ns += n % 2 ? dev : -dev;
        sluice_discovery_on_sample(f->a_leader, &one);
    }
    s.outcome = SLUICE_OUTCOME_OVERLOAD;
    /* ... less the time the fleet takes to apply a cut (publish, each process's beat,
     * its pool's next window), so overloads until then count as the cut's own. */
    s.start_ns = now - (age_ns > 0 ? age_ns : 0) -
                 FLEET_CUT_BEATS * f->heartbeat_ms * SLUICE_NS_PER_MS;
    s.retry_after_ns = retry;
    /* How long the refusals took says where they were made (policy/discover.h: at the door,
     * or after a gateway's queue); 0 from an older member: not known. */
    s.latency_ns = refusal_ns > 0 ? refusal_ns : 0;
    for (; outcome == SLUICE_OUTCOME_OVERLOAD && n < overload && n < FLEET_SAMPLES_PER_REPORT; n++)
        sluice_discovery_on_sample(f->a_leader, &s);
    return n;
}

/*
 * The leader's beat: drain the fleet's reports into its node, publish S. Every sample
 * says the fleet ran a_fleet_load calls when it started (the processes' loads summed
 * at this beat), so the node sees the fleet saturated when every process is.
 *
 * The leader's windows are counted in calls, not timed: it closes one once it has
 * fed FLEET_WINDOW_CALLS measured calls over at least FLEET_WINDOW_BEATS beats. A
 * node times its windows to see window_samples calls at its limit, but the fleet
 * runs fewer than S calls when members sit idle on their base permits, and a
 * member's windows (sized by its own small limit) reach the leader in lumps: timed
 * windows there held fewer calls than the policy judges, and the fleet never grew.
 * An overload still closes the window at once.
 */
static bool leader_beat(struct sluice_fleet *f)
{
    static const enum fleet_key drain_keys[] = {KEY_REPORTS};
    redisReply *r = sluice__fleet_eval(f, sluice__fleet_lua_drain, drain_keys, 1, NULL, 0);
    if (!r)
        return false;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_ARRAY) {
        int64_t now_srv = sluice__fleet_reply_int(r->element[0]);
        const redisReply *list = r->element[1];
        /* Every report's served calls first: an overload closes the node's window at
         * once, and that window should hold all the fleet served meanwhile. */
        for (size_t i = 0; i < list->elements; i++)
            f->a_window_fed += leader_feed(f, list->element[i]->str, now_srv, SLUICE_OUTCOME_OK);
        unsigned refused = 0;
        for (size_t i = 0; i < list->elements; i++)
            refused += leader_feed(f, list->element[i]->str, now_srv, SLUICE_OUTCOME_OVERLOAD);
        if (refused) /* it may have closed the window: count afresh */
            f->a_window_fed = f->a_window_beats = 0;
    }
    freeReplyObject(r);
    if (++f->a_window_beats >= FLEET_WINDOW_BEATS && f->a_window_fed >= FLEET_WINDOW_CALLS) {
        sluice_discovery_update_now(f->a_leader);
        f->a_window_fed = f->a_window_beats = 0;
    }
    sluice_discovery_poll(f->a_leader);
    if (!f->a_redis)
        return false; /* the store lost the connection */
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(f->a_leader, &st);
    char limit[16], ttl[24];
    snprintf(limit, sizeof limit, "%" PRIu32, st.limit);
    snprintf(ttl, sizeof ttl, "%" PRId64, f->leader_desc.lock_ttl_s);
    static const enum fleet_key publish_keys[] = {KEY_STATE, KEY_LEADER};
    const char *args[] = {f->id, limit, sluice_discovery_state_name(st.state), ttl};
    r = sluice__fleet_eval(f, sluice__fleet_lua_publish, publish_keys, 2, args, 4);
    if (!r)
        return false;
    freeReplyObject(r);
    return true;
}

/* Take or renew the leader lease; start or stop the leader's node accordingly. */
static bool leader_elect(struct sluice_fleet *f, uint32_t shared_limit, uint64_t clears)
{
    char lease[24];
    snprintf(lease, sizeof lease, "%" PRId64, f->heartbeat_ms * f->leader_ttl_beats);
    static const enum fleet_key keys[] = {KEY_LEADER};
    const char *args[] = {f->id, lease};
    redisReply *r = sluice__fleet_eval(f, sluice__fleet_lua_leader, keys, 1, args, 2);
    if (!r)
        return false;
    int64_t got = sluice__fleet_reply_int(r);
    freeReplyObject(r);
    if (got == 0)
        leader_stop(f);
    else if (!f->a_leader)
        leader_start(f, shared_limit, clears);
    if (f->a_leader && clears > f->a_clears_seen) { /* a fleet-wide clear: start over */
        f->a_clears_seen = clears;
        sluice_discovery_clear(f->a_leader);
    }
    return f->a_leader ? leader_beat(f) : true;
}

/* ---- the agent ------------------------------------------------------------------- */

static uint32_t clamp_u32(uint64_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

static void publish_limit(struct sluice_fleet *f, uint32_t limit)
{
    struct sluice_pool_counts c = sluice_pool_stats(f->pool);
    atomic_store_explicit(&f->published, clamp_u32(limit, 1, c.active_max), SLUICE_RELAXED);
}

/*
 * Make the pool take the published limit now. Its discovery moves the limit only
 * when a window closes, and a window spans a few call latencies (seconds, with a
 * real provider): sluice_discovery_update_now closes it at once, and the follower
 * policy answers the published limit.
 */
static void fleet_kick(struct sluice_fleet *f)
{
    struct sluice_discovery *d = sluice_pool_discovery(f->pool);
    uint32_t want = atomic_load_explicit(&f->published, SLUICE_RELAXED);
    /* Once per published value, so a pool whose own max_limit clamps `want` is
     * not closed every beat. */
    if (sluice_discovery_limit(d) == want || want == f->a_kicked_for)
        return;
    f->a_kicked_for = want;
    sluice_discovery_update_now(d);
}

/* Fallback: the local share of the last state seen. */
static void fleet_fallback(struct sluice_fleet *f)
{
    bool was = atomic_exchange_explicit(&f->s_connected, 0u, SLUICE_RELAXED) != 0u;
    atomic_store_explicit(&f->s_leased, 0u, SLUICE_RELAXED);
    leader_stop(f);
    uint32_t shared = atomic_load_explicit(&f->s_shared, SLUICE_RELAXED);
    uint32_t n = atomic_load_explicit(&f->s_processes, SLUICE_RELAXED);
    uint32_t share = n ? shared / n : shared;
    uint32_t old = atomic_load_explicit(&f->published, SLUICE_RELAXED);
    publish_limit(f, share > f->floor ? share : f->floor);
    if (was || !f->a_ever_connected) {
        if (was)
            atomic_fetch_add_explicit(&f->s_fallbacks, 1u, SLUICE_RELAXED);
        f->a_ever_connected = true; /* one event for a Redis that was never there, too */
        fleet_emit(f, SLUICE_EVENT_STORE, SLUICE_CAUSE_STORE_ERROR, old,
                   atomic_load_explicit(&f->published, SLUICE_RELAXED));
    }
}

/* Send the windows closed since the last beat. */
static bool fleet_report(struct sluice_fleet *f)
{
    struct fleet_report r;
    sluice_spinlock_lock(&f->report_lock);
    r = f->report;
    memset(&f->report, 0, sizeof f->report);
    sluice_spinlock_unlock(&f->report_lock);
    if (!r.first_start_ns)
        return true;
    char fields[256], age[24], deviation[24], refusal[24];
    snprintf(fields, sizeof fields,
             "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRId64 " %" PRId64 " %" PRIu32 " %" PRId64,
             r.n_ok, r.n_overload, r.n_served, r.latency_sum, r.latency_min, r.max_in_flight,
             r.retry_after);
    int64_t age_ms = (sluice_monotonic_ns() - r.first_start_ns) / SLUICE_NS_PER_MS;
    snprintf(age, sizeof age, "%" PRId64, age_ms > 0 ? age_ms : 0);
    snprintf(deviation, sizeof deviation, "%" PRId64, r.deviation_sum);
    snprintf(refusal, sizeof refusal, "%" PRId64, r.refusal_ns);
    static const enum fleet_key keys[] = {KEY_REPORTS};
    const char *args[] = {fields, age, deviation, refusal};
    redisReply *reply = sluice__fleet_eval(f, sluice__fleet_lua_report, keys, 1, args, 4);
    if (reply)
        freeReplyObject(reply);
    return reply != NULL;
}

static enum sluice_discovery_state state_from_name(const char *s)
{
    return !strcmp(s, "locked")    ? SLUICE_DISCOVERY_LOCKED
           : !strcmp(s, "backoff") ? SLUICE_DISCOVERY_BACKOFF
                                   : SLUICE_DISCOVERY_PROBING;
}

/* Lease towards the pool's demand, read the shared state, publish the local limit. */
static bool fleet_lease(struct sluice_fleet *f, uint32_t *shared, uint64_t *clears)
{
    struct sluice_pool_counts c = sluice_pool_stats(f->pool);
    uint64_t demand = (uint64_t)c.in_flight + c.queued;
    /* Its load: all its limit when calls queue for it, else what runs. */
    uint32_t load = demand >= c.active ? c.active : c.in_flight;
    uint64_t want = demand > 1 ? (demand - 1 + f->lease - 1) / f->lease * f->lease : 0;
    uint32_t uses = c.active > c.in_flight ? c.active : c.in_flight;
    char a_want[24], a_keep[24], a_k[16], a_ttl[24], a_def[16], a_load[16];
    snprintf(a_load, sizeof a_load, "%" PRIu32, load);
    snprintf(a_want, sizeof a_want, "%" PRIu64, want);
    snprintf(a_keep, sizeof a_keep, "%" PRIu32, uses > 0 ? uses - 1 : 0);
    snprintf(a_k, sizeof a_k, "%" PRIu32, f->lease);
    snprintf(a_ttl, sizeof a_ttl, "%" PRId64, f->heartbeat_ms * f->holder_ttl_beats);
    /* Where a new fleet's shared limit starts: discovery's jumpstart as it resolved it
     * (clamped into [min_limit, max_limit]), so a floor above the default holds from the
     * first beat. */
    snprintf(a_def, sizeof a_def, "%" PRIu32, f->leader_desc.jumpstart);
    static const enum fleet_key keys[] = {KEY_STATE, KEY_HOLDERS, KEY_HELD,
                                          KEY_WAITERS, KEY_CLEARS, KEY_LOAD};
    const char *args[] = {f->id, a_want, a_keep, a_k, a_ttl, a_def, a_load};
    redisReply *r = sluice__fleet_eval(f, sluice__fleet_lua_beat, keys, 6, args, 7);
    if (!r)
        return false;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 10) {
        freeReplyObject(r);
        sluice__fleet_disconnect(f);
        return false;
    }
    uint32_t leased = (uint32_t)sluice__fleet_reply_int(r->element[0]);
    uint32_t target = (uint32_t)sluice__fleet_reply_int(r->element[1]);
    *shared = (uint32_t)sluice__fleet_reply_int(r->element[2]);
    atomic_store_explicit(&f->s_leased, leased, SLUICE_RELAXED);
    atomic_store_explicit(&f->s_shared, *shared, SLUICE_RELAXED);
    atomic_store_explicit(&f->s_processes, (uint32_t)sluice__fleet_reply_int(r->element[3]), SLUICE_RELAXED);
    const char *state = r->element[5]->type == REDIS_REPLY_STRING ? r->element[5]->str : "";
    atomic_store_explicit(&f->s_state, (uint32_t)state_from_name(state), SLUICE_RELAXED);
    atomic_store_explicit(&f->s_ceiling, (uint32_t)sluice__fleet_reply_int(r->element[6]), SLUICE_RELAXED);
    atomic_store_explicit(&f->s_expires, sluice__fleet_reply_int(r->element[7]), SLUICE_RELAXED);
    *clears = (uint64_t)sluice__fleet_reply_int(r->element[8]);
    f->a_fleet_load = (uint32_t)sluice__fleet_reply_int(r->element[9]);
    freeReplyObject(r);
    /* Never more than leased: a lower target shows in the pool first, and the permits
     * go back at a later beat, once its limit and its calls in flight are down. */
    publish_limit(f, 1 + (leased < target ? leased : target));
    return true;
}

/* Run the fleet-wide clears asked for since the last beat. */
static bool fleet_run_clears(struct sluice_fleet *f)
{
    pthread_mutex_lock(&f->mu);
    uint32_t n = f->clear_requests;
    f->clear_requests = 0;
    pthread_mutex_unlock(&f->mu);
    if (!n)
        return true;
    static const enum fleet_key keys[] = {KEY_STATE, KEY_CLEARS};
    redisReply *r = sluice__fleet_eval(f, sluice__fleet_lua_clear, keys, 2, NULL, 0);
    if (r) {
        freeReplyObject(r);
        return true;
    }
    pthread_mutex_lock(&f->mu); /* try again once Redis is back */
    f->clear_requests += n;
    pthread_mutex_unlock(&f->mu);
    return false;
}

static void fleet_beat(struct sluice_fleet *f)
{
    atomic_fetch_add_explicit(&f->s_beats, 1u, SLUICE_RELAXED);
    bool was_connected = atomic_load_explicit(&f->s_connected, SLUICE_RELAXED) != 0u;
    if (!f->a_redis && !sluice__fleet_connect(f)) {
        fleet_fallback(f);
        fleet_kick(f);
        return;
    }
    uint32_t shared = 0;
    uint64_t clears = 0;
    bool ok = fleet_run_clears(f) && fleet_report(f) && fleet_lease(f, &shared, &clears) &&
              leader_elect(f, shared, clears);
    if (!ok) {
        fleet_fallback(f);
        fleet_kick(f);
        return;
    }
    atomic_store_explicit(&f->s_connected, 1u, SLUICE_RELAXED);
    f->a_backoff_ms = 0; /* a whole beat went through: the next failure retries at once */
    if (!was_connected && f->a_ever_connected) {
        atomic_fetch_add_explicit(&f->s_reconnects, 1u, SLUICE_RELAXED);
        uint32_t limit = atomic_load_explicit(&f->published, SLUICE_RELAXED);
        fleet_emit(f, SLUICE_EVENT_RESTORE, SLUICE_CAUSE_STORE, limit, limit);
    }
    f->a_ever_connected = true;
    fleet_kick(f);
}

static void *fleet_agent(void *arg)
{
    struct sluice_fleet *f = arg;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        pthread_mutex_unlock(&f->mu);
        fleet_beat(f);
        pthread_mutex_lock(&f->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = sluice_timespec_ns(&until) + f->heartbeat_ms * SLUICE_NS_PER_MS;
        until.tv_sec = (time_t)(ns / SLUICE_NS_PER_SEC);
        until.tv_nsec = (long)(ns % SLUICE_NS_PER_SEC);
        while (!f->stop && !f->clear_requests &&
               pthread_cond_timedwait(&f->cv, &f->mu, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* ---- public ---------------------------------------------------------------------- */

int sluice_fleet_create(const struct sluice_fleet_desc *desc, struct sluice_fleet **out)
{
    if (out)
        *out = NULL;
    if (!desc)
        return SLUICE_EINVAL;
    if (desc->error && desc->error_size)
        desc->error[0] = '\0';
    if (!out)
        return sluice__fail(desc->error, desc->error_size,
                            "out is NULL (pass the address of a struct sluice_fleet *)");
    struct sluice_fleet *f = sluice__zalloc_aligned(sizeof *f, SLUICE_CACHELINE);
    if (!f)
        return SLUICE_ENOMEM;
    int status = fleet_configure(f, desc);
    if (status != SLUICE_OK) {
        free(f);
        return status;
    }
    sluice_spinlock_init(&f->report_lock);
    atomic_init(&f->published, 1u);
    sluice_event_ring_init(&f->events, f->slots, FLEET_EVENTS, f->node);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&f->mu, NULL);
    *out = f;
    return SLUICE_OK;
}

void sluice_fleet_discovery(struct sluice_fleet *f, struct sluice_discovery_desc *dd)
{
    if (!f || !dd)
        return;
    /* The description keeps pointers: the prototype and the ops live in the fleet. */
    f->follower.base.ops = &fleet_policy_ops;
    f->follower.fleet = f;
    f->store_ops = (struct sluice_store_ops){.load = fleet_store_load, .save = fleet_store_save,
                                             .clear = fleet_store_clear, .ctx = f};
    dd->node_id = f->node;
    dd->policy = &f->follower.base;
    /* Short local windows (about four mean latencies): a window is what the next
     * report carries, so its length is how late the leader hears of an overload. */
    SLUICE__DEFAULT(dd->window_samples, FLEET_FOLLOWER_WINDOW_SAMPLES);
    dd->store = &f->store_ops;
}

int sluice_fleet_attach(struct sluice_fleet *f, struct sluice_pool *pool)
{
    if (!f || !pool || !sluice_pool_discovery(pool) || f->started)
        return SLUICE_EINVAL;
    f->pool = pool;
    f->a_retry_at_ms = 0;
    if (pthread_create(&f->thread, NULL, fleet_agent, f) != 0)
        return SLUICE_ENOMEM;
    f->started = true;
    return SLUICE_OK;
}

int sluice_fleet_clear_node(const char *redis_url, const char *node_id, char *error,
                            size_t error_size)
{
    struct sluice_fleet *f;
    int status = sluice_fleet_create(&(struct sluice_fleet_desc){.redis_url = redis_url,
                                                                 .node_id = node_id,
                                                                 .heartbeat_ms = 1000,
                                                                 .error = error,
                                                                 .error_size = error_size},
                                     &f);
    if (status != SLUICE_OK)
        return status;
    static const enum fleet_key keys[] = {KEY_STATE, KEY_CLEARS};
    redisReply *r = sluice__fleet_connect(f)
                        ? sluice__fleet_eval(f, sluice__fleet_lua_clear, keys, 2, NULL, 0)
                        : NULL;
    if (r)
        freeReplyObject(r);
    else if (error && error_size)
        snprintf(error, error_size, "%s:%d refused the clear or did not answer: %s", f->host,
                 f->port, f->error);
    sluice_fleet_destroy(f);
    return r ? SLUICE_OK : SLUICE_EIO;
}

int sluice_fleet_clear(struct sluice_fleet *f)
{
    if (!f)
        return SLUICE_EINVAL;
    pthread_mutex_lock(&f->mu);
    f->clear_requests++;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return SLUICE_OK;
}

void sluice_fleet_snapshot(const struct sluice_fleet *fleet, struct sluice_fleet_status *out)
{
    struct sluice_fleet *f = (struct sluice_fleet *)fleet;
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!f)
        return;
    out->connected = atomic_load_explicit(&f->s_connected, SLUICE_RELAXED) != 0u;
    out->leader = atomic_load_explicit(&f->s_leader, SLUICE_RELAXED) != 0u;
    out->shared_limit = atomic_load_explicit(&f->s_shared, SLUICE_RELAXED);
    out->ceiling = atomic_load_explicit(&f->s_ceiling, SLUICE_RELAXED);
    out->lock_expires_s = atomic_load_explicit(&f->s_expires, SLUICE_RELAXED);
    out->state = (enum sluice_discovery_state)atomic_load_explicit(&f->s_state, SLUICE_RELAXED);
    out->processes = atomic_load_explicit(&f->s_processes, SLUICE_RELAXED);
    out->leased = atomic_load_explicit(&f->s_leased, SLUICE_RELAXED);
    out->local_limit = atomic_load_explicit(&f->published, SLUICE_RELAXED);
    out->beats = atomic_load_explicit(&f->s_beats, SLUICE_RELAXED);
    out->fallbacks = atomic_load_explicit(&f->s_fallbacks, SLUICE_RELAXED);
    out->reconnects = atomic_load_explicit(&f->s_reconnects, SLUICE_RELAXED);
}

const struct sluice_event_ring *sluice_fleet_events(const struct sluice_fleet *f)
{
    return f ? &f->events : NULL;
}

void sluice_fleet_destroy(struct sluice_fleet *f)
{
    if (!f)
        return;
    if (f->started) {
        pthread_mutex_lock(&f->mu);
        f->stop = true;
        pthread_cond_signal(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
    }
    leader_stop(f);
    if (f->a_redis) {
        static const enum fleet_key keys[] = {KEY_HOLDERS, KEY_HELD, KEY_WAITERS, KEY_LEADER,
                                              KEY_LOAD};
        const char *args[] = {f->id};
        redisReply *r = sluice__fleet_eval(f, sluice__fleet_lua_leave, keys, 5, args, 1);
        if (r)
            freeReplyObject(r);
    }
    sluice__fleet_disconnect(f);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    explicit_bzero(f->password, sizeof f->password);
    free(f);
}

uint64_t sluice_fleet_last_error(struct sluice_fleet *f, char *buf, size_t size)
{
    if (!f) {
        if (buf && size)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->n_errors;
    if (buf && size)
        snprintf(buf, size, "%s", f->error);
    pthread_mutex_unlock(&f->mu);
    return n;
}
