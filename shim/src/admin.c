/*
 * admin.c — the admin endpoint (sluice/admin.h) on libmicrohttpd.
 *
 * Threading: libmicrohttpd runs a listener thread and one thread per
 * connection (bounded by max_connections), so an event stream may block
 * in its content reader while it waits for events; a stream waits on the
 * admin's condition variable, which the sampler broadcasts every tick and
 * stop broadcasts once. The sampler owns the per-node counters and chart
 * history; request threads read them under the same mutex.
 *
 * Request deadline: libmicrohttpd's connection timeout only counts idle
 * time, so a client dribbling a byte at a time would keep its slot for
 * hours. Each connection therefore gets an entry in admin.conns (added when
 * libmicrohttpd reports it started, removed when it reports it closed),
 * stamped when it opens and again after each answer; the access handler
 * marks it once the request has arrived in full, and the sampler's tick
 * shuts down the reading side of any connection still waiting after
 * timeout_s (libmicrohttpd then closes it as if the client had hung up).
 * libmicrohttpd reports a connection closed before it closes the socket,
 * and entries change only under conns_mutex, which the sampler holds while
 * it shuts sockets down: it never touches a closed (or reused) descriptor.
 */
#define _GNU_SOURCE
#include <sluice/admin.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sluice/sluice.h>

/* The page, turned into bytes by shim/CMakeLists.txt. */
extern const unsigned char sluice__admin_page[];
extern const size_t sluice__admin_page_size;

enum { N_CAUSES = SLUICE_CAUSE_EXPIRY_CAPPED + 1, N_KINDS = SLUICE_EVENT_STORE + 1 };

/* Connections libmicrohttpd accepts past max_connections, so that one more gets an
 * answer (a reclaimed kept-alive slot, or a 503) instead of a reset. */
enum { ADMIN_SPARE_CONNECTIONS = 8 };

struct sample {
    int64_t wall_ms;
    uint32_t limit, in_flight;
};

/* One open connection as the request deadline tracks it (under admin.conns_mutex). */
struct conn {
    struct conn *prev, *next;
    int fd;           /* its socket */
    bool waiting;     /* its (next) request has not arrived in full yet */
    bool served;      /* it has had an answer: idle and waiting, it is a kept-alive one */
    bool cut;         /* shut down already */
    bool over;        /* opened past max_connections: its request gets 503 */
    int64_t since_ms; /* monotonic: when it opened, or when its last answer ended */
};

/* What a node's recent figures are computed from: one per sampler tick. */
struct tally {
    int64_t wall_ms;
    uint64_t requests, overloads, timeouts;
    struct sluice_histogram_counts queue_wait;
};

/* The page's and sluicectl's rates and queue-wait percentiles span this many seconds. */
#define RECENT_S 10

/* One engine node as the admin tracks it (under admin.mutex). */
struct node {
    const char *id;                     /* engine-owned */
    const struct sluice_event_ring *ring; /* NULL: fixed node, no events */
    uint64_t cursor;                    /* events counted so far (a seq) */
    uint64_t backoffs[N_CAUSES];        /* backoff events by cause */
    uint64_t events[N_KINDS];           /* events by kind */
    uint64_t dropped;                   /* overwritten before counted */
    struct sample *history;             /* ring of history_s samples */
    uint32_t hist_head, hist_len;
    struct tally recent[RECENT_S + 1];  /* ring: the last RECENT_S seconds' ends */
    uint32_t recent_head, recent_len;
};

struct sluice_admin {
    struct sluice_engine *engine;
    struct MHD_Daemon *daemon;
    uint16_t port;
    bool loopback;
    struct sluice_admin_desc cfg; /* resolved; address and error not kept */
    pthread_mutex_t mutex;
    pthread_cond_t tick; /* broadcast by the sampler each second and by stop */
    pthread_t sampler;
    bool sampler_started;
    atomic_bool stopping;
    atomic_uint streams;
    pthread_mutex_t conns_mutex; /* taken inside mutex, never around it */
    struct conn *conns;          /* open connections, a doubly linked list */
    struct node *nodes;
    size_t n_nodes;
};

/* ---- small helpers ----------------------------------------------------------- */

static int admin_fail(const struct sluice_admin_desc *d, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int admin_fail(const struct sluice_admin_desc *d, int status, const char *fmt, ...)
{
    if (d->error && d->error_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->error, d->error_size, fmt, ap);
        va_end(ap);
    }
    return status;
}

static int64_t mono_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A growable string on malloc (bodies handed to callers are free()d). */
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

/* The body, or NULL (freeing what was built) when an allocation failed. */
static char *sb_take(struct sbuf *b)
{
    if (b->oom || !b->p) {
        free(b->p);
        return b->oom ? NULL : strdup("");
    }
    return b->p;
}

/* ---- what the routes say about nodes ------------------------------------------- */

static ptrdiff_t node_index(const struct sluice_admin *a, const char *id)
{
    for (size_t i = 0; i < a->n_nodes; i++)
        if (strcmp(a->nodes[i].id, id) == 0)
            return (ptrdiff_t)i;
    return -1;
}

/* An event as JSON, in the exact shape of the core's JSON Lines record. */
static json_t *event_json(const struct sluice_event *ev)
{
    char line[512];
    size_t n = sluice_event_format_json(ev, line, sizeof line);
    return n < sizeof line ? json_loads(line, 0, NULL) : NULL;
}

/* A node's tally now: what its counters and queue-wait histogram say. */
static struct tally take_tally(struct sluice_pool *pool, const struct sluice_pool_counts *c,
                               int64_t wall_ms)
{
    struct tally t = {.wall_ms = wall_ms,
                      .requests = c->calls_ok + c->calls_overload + c->calls_ignored,
                      .overloads = c->calls_overload,
                      .timeouts = c->timeouts + c->refused_late};
    sluice_pool_histograms(pool, &t.queue_wait, NULL);
    return t;
}

static json_t *ms_or_null(int64_t ns)
{
    return ns < 0 ? json_null() : json_real((double)ns / 1e6);
}

/*
 * The deadline figures of node i: totals since start, and over the last
 * RECENT_S seconds of samples the rates per second and the queue wait's
 * p50/p99 (null when no call waited). Takes a->mutex for the samples.
 */
static void deadline_json(struct sluice_admin *a, size_t i, const struct sluice_pool_counts *c,
                          json_t *o)
{
    json_object_set_new(o, "lingering", json_integer(c->lingering));
    json_object_set_new(o, "expected_service_ms", ms_or_null(c->expected_ns ? c->expected_ns : -1));
    json_object_set_new(o, "requests_total",
                        json_integer((json_int_t)(c->calls_ok + c->calls_overload + c->calls_ignored)));
    json_object_set_new(o, "overloads_total", json_integer((json_int_t)c->calls_overload));
    json_object_set_new(o, "timeouts_total", json_integer((json_int_t)c->timeouts));
    json_object_set_new(o, "cancels_total", json_integer((json_int_t)c->cancels));
    json_object_set_new(o, "refused_capacity_total", json_integer((json_int_t)c->refused_capacity));
    json_object_set_new(o, "refused_early_total", json_integer((json_int_t)c->refused_early));
    json_object_set_new(o, "refused_late_total", json_integer((json_int_t)c->refused_late));
    json_object_set_new(o, "lingered_total", json_integer((json_int_t)c->lingered));
    const struct node *n = &a->nodes[i];
    struct tally now = take_tally(sluice_engine_pool(a->engine, n->id), c, wall_ms_now()), then;
    pthread_mutex_lock(&a->mutex);
    bool have = n->recent_len > 0;
    if (have)
        then = n->recent[(n->recent_head + RECENT_S + 1 - n->recent_len) % (RECENT_S + 1)];
    pthread_mutex_unlock(&a->mutex);
    double dt = have ? (double)(now.wall_ms - then.wall_ms) / 1000.0 : 0.0;
    struct sluice_histogram_counts qw = now.queue_wait;
    if (have)
        for (uint32_t b = 0; b < SLUICE_HISTOGRAM_BUCKETS; b++) {
            qw.bucket[b] -= then.queue_wait.bucket[b];
            qw.count -= then.queue_wait.bucket[b];
        }
    json_object_set_new(o, "request_rate", json_real(dt > 0 ? (double)(now.requests - then.requests) / dt : 0.0));
    json_object_set_new(o, "overload_rate", json_real(dt > 0 ? (double)(now.overloads - then.overloads) / dt : 0.0));
    json_object_set_new(o, "timeout_rate", json_real(dt > 0 ? (double)(now.timeouts - then.timeouts) / dt : 0.0));
    json_object_set_new(o, "queue_wait_p50_ms", ms_or_null(sluice_histogram_quantile(&qw, 0.5)));
    json_object_set_new(o, "queue_wait_p99_ms", ms_or_null(sluice_histogram_quantile(&qw, 0.99)));
}

/* One node's state: everything the page, sluicectl and the clear route show. */
static json_t *node_json(struct sluice_admin *a, size_t i)
{
    const struct node *n = &a->nodes[i];
    struct sluice_discovery_status st;
    if (sluice_engine_status(a->engine, n->id, &st) != SLUICE_OK)
        return NULL;
    struct sluice_pool_counts c = sluice_pool_stats(sluice_engine_pool(a->engine, n->id));
    char line[SLUICE_BACKEND_ID_MAX + 64];
    sluice_engine_status_line(a->engine, n->id, line, sizeof line);
    bool adaptive = st.state != SLUICE_DISCOVERY_FIXED;
    int64_t left = st.lock_expires_s ? st.lock_expires_s - wall_ms_now() / 1000 : 0;
    json_t *o = json_object();
    json_object_set_new(o, "node", json_string(n->id));
    json_object_set_new(o, "adaptive", json_boolean(adaptive));
    json_object_set_new(o, "state", json_string(sluice_discovery_state_name(st.state)));
    json_object_set_new(o, "glyph", json_string(sluice_discovery_state_glyph(st.state)));
    json_object_set_new(o, "in_flight", json_integer(st.in_flight));
    json_object_set_new(o, "limit", st.limit ? json_integer(st.limit) : json_null());
    json_object_set_new(o, "max_limit", c.active_max ? json_integer(c.active_max) : json_null());
    json_object_set_new(o, "waiting", json_integer(c.queued));
    json_object_set_new(o, "ceiling", json_integer(st.ceiling));
    json_object_set_new(o, "lock_expires_s", json_integer(st.lock_expires_s));
    json_object_set_new(o, "lock_left_s", json_integer(left > 0 ? left : 0));
    json_object_set_new(o, "status_line", json_string(line));
    json_object_set_new(o, "events", json_integer(n->ring ? (json_int_t)sluice_event_ring_count(n->ring) : 0));
    json_t *last = st.last_event.seq ? event_json(&st.last_event) : NULL;
    json_object_set_new(o, "last_event", last ? last : json_null());
    deadline_json(a, i, &c, o);
    return o;
}

char *sluice_admin_status_json(struct sluice_admin *a)
{
    json_t *root = json_object();
    json_t *nodes = json_array();
    json_object_set_new(root, "now_ms", json_integer(wall_ms_now()));
    for (size_t i = 0; i < a->n_nodes; i++) {
        json_t *o = node_json(a, i);
        if (o)
            json_array_append_new(nodes, o);
    }
    json_object_set_new(root, "nodes", nodes);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* Count the events that arrived since the last call (call under a->mutex). */
static void count_events(struct sluice_admin *a)
{
    struct sluice_event batch[64];
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct node *n = &a->nodes[i];
        if (!n->ring)
            continue;
        size_t got;
        while ((got = sluice_event_ring_read(n->ring, &n->cursor, batch, 64, &n->dropped)) > 0) {
            for (size_t k = 0; k < got; k++) {
                if ((unsigned)batch[k].kind < N_KINDS)
                    n->events[batch[k].kind]++;
                if (batch[k].kind == SLUICE_EVENT_BACKOFF && (unsigned)batch[k].cause < N_CAUSES)
                    n->backoffs[batch[k].cause]++;
            }
        }
    }
}

/* Record one chart sample per node (call under a->mutex). */
static void record_history(struct sluice_admin *a)
{
    int64_t now = wall_ms_now();
    uint32_t cap = a->cfg.history_s;
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct node *n = &a->nodes[i];
        struct sluice_discovery_status st;
        if (sluice_engine_status(a->engine, n->id, &st) != SLUICE_OK)
            continue;
        n->history[n->hist_head] = (struct sample){now, st.limit, st.in_flight};
        n->hist_head = (n->hist_head + 1) % cap;
        if (n->hist_len < cap)
            n->hist_len++;
        struct sluice_pool *pool = sluice_engine_pool(a->engine, n->id);
        struct sluice_pool_counts c = sluice_pool_stats(pool);
        n->recent[n->recent_head] = take_tally(pool, &c, now);
        n->recent_head = (n->recent_head + 1) % (RECENT_S + 1);
        if (n->recent_len < RECENT_S + 1)
            n->recent_len++;
    }
}

static json_t *history_json(const struct sluice_admin *a, const struct node *n)
{
    json_t *arr = json_array();
    uint32_t cap = a->cfg.history_s;
    for (uint32_t k = 0; k < n->hist_len; k++) {
        const struct sample *s = &n->history[(n->hist_head + cap - n->hist_len + k) % cap];
        json_array_append_new(arr, json_pack("[I,i,i]", (json_int_t)s->wall_ms, (int)s->limit,
                                             (int)s->in_flight));
    }
    return arr;
}

/* Prometheus label value: backslash, double quote and newline escaped. */
static void sb_label(struct sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            sb_printf(b, "\\%c", *s);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else
            sb_put(b, s, 1);
    }
}

static void metric_head(struct sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_node(struct sbuf *b, const char *name, const char *node)
{
    sb_printf(b, "%s{node=\"", name);
    sb_label(b, node);
    sb_put(b, "\"", 1);
}

/* One gauge family: one sample per node, value from `get`. */
#define ADMIN_GAUGE(b, a, sts, name, help, expr) ADMIN_FAMILY(b, a, sts, name, "gauge", help, expr)
#define ADMIN_COUNTER(b, a, sts, name, help, expr)                                                 \
    ADMIN_FAMILY(b, a, sts, name, "counter", help, expr)
#define ADMIN_FAMILY(b, a, sts, name, type, help, expr)                                            \
    do {                                                                                           \
        metric_head(b, name, type, help);                                                          \
        for (size_t i_ = 0; i_ < (a)->n_nodes; i_++) {                                             \
            const struct sluice_discovery_status *st = &(sts)[i_];                                 \
            const struct sluice_pool_counts *pc = &pcs[i_];                                        \
            (void)st;                                                                              \
            (void)pc;                                                                              \
            metric_node(b, name, (a)->nodes[i_].id);                                               \
            sb_printf(b, "} %s\n", expr);                                                          \
        }                                                                                          \
    } while (0)

static const char *fmt_u64(char *buf, uint64_t v)
{
    snprintf(buf, 24, "%" PRIu64, v);
    return buf;
}

static const char *fmt_seconds(char *buf, int64_t ns)
{
    snprintf(buf, 24, "%.9g", (double)ns / 1e9);
    return buf;
}

/* A histogram family (seconds): cumulative _bucket{le}, _sum and _count per node. */
static void metric_histogram(struct sbuf *b, const struct sluice_admin *a, const char *name,
                             const char *help, const struct sluice_histogram_counts *hs)
{
    metric_head(b, name, "histogram", help);
    char series[96], v[24];
    for (size_t i = 0; i < a->n_nodes; i++) {
        uint64_t cum = 0;
        snprintf(series, sizeof series, "%s_bucket", name);
        for (uint32_t k = 0; k < SLUICE_HISTOGRAM_BUCKETS; k++) {
            cum += hs[i].bucket[k];
            metric_node(b, series, a->nodes[i].id);
            sb_printf(b, ",le=\"%s\"} %" PRIu64 "\n",
                      k + 1 < SLUICE_HISTOGRAM_BUCKETS ? fmt_seconds(v, sluice_histogram_bound(k))
                                                       : "+Inf",
                      cum);
        }
        snprintf(series, sizeof series, "%s_sum", name);
        metric_node(b, series, a->nodes[i].id);
        sb_printf(b, "} %s\n", fmt_seconds(v, hs[i].sum_ns));
        snprintf(series, sizeof series, "%s_count", name);
        metric_node(b, series, a->nodes[i].id);
        sb_printf(b, "} %" PRIu64 "\n", hs[i].count);
    }
}

/* The deadline rules' counters and the two latency histograms of every node. */
static void metrics_deadlines(struct sbuf *b, struct sluice_admin *a,
                              const struct sluice_discovery_status *sts,
                              const struct sluice_pool_counts *pcs)
{
    char v[24];
    metric_head(b, "sluice_admissions_refused_total", "counter",
                "Runs refused at admission: capacity (active + waiting full) or predicted_late "
                "(refuse_early: the predicted wait passes the deadline).");
    for (size_t i = 0; i < a->n_nodes; i++) {
        metric_node(b, "sluice_admissions_refused_total", a->nodes[i].id);
        sb_printf(b, ",reason=\"capacity\"} %" PRIu64 "\n", pcs[i].refused_capacity);
        metric_node(b, "sluice_admissions_refused_total", a->nodes[i].id);
        sb_printf(b, ",reason=\"predicted_late\"} %" PRIu64 "\n", pcs[i].refused_early);
    }
    ADMIN_COUNTER(b, a, sts, "sluice_refused_late_total",
                  "Calls not started: less of the deadline left than the expected service time.",
                  fmt_u64(v, pc->refused_late));
    ADMIN_COUNTER(b, a, sts, "sluice_timeouts_total",
                  "Calls whose deadline passed while queued or, abandoned, mid-transfer.",
                  fmt_u64(v, pc->timeouts));
    ADMIN_COUNTER(b, a, sts, "sluice_cancels_total",
                  "Calls whose token fired while queued or, abandoned, mid-transfer.",
                  fmt_u64(v, pc->cancels));
    ADMIN_COUNTER(b, a, sts, "sluice_overloads_total",
                  "Calls the provider refused as over capacity (HTTP 429/503/529) or timed out.",
                  fmt_u64(v, pc->calls_overload));
    ADMIN_COUNTER(b, a, sts, "sluice_lingered_total",
                  "Abandoned calls that kept their permit while the provider still ran them.",
                  fmt_u64(v, pc->lingered));
    ADMIN_GAUGE(b, a, sts, "sluice_lingering",
                "Abandoned calls holding their permit now (counted in sluice_inflight).",
                fmt_u64(v, pc->lingering));
    ADMIN_GAUGE(b, a, sts, "sluice_expected_service_seconds",
                "Expected service time: the low quantile of recent successful calls (0: unknown).",
                fmt_seconds(v, pc->expected_ns));
    struct sluice_histogram_counts *qw = calloc(a->n_nodes ? a->n_nodes : 1, sizeof *qw);
    struct sluice_histogram_counts *ct = calloc(a->n_nodes ? a->n_nodes : 1, sizeof *ct);
    if (!qw || !ct) {
        b->oom = true;
    } else {
        for (size_t i = 0; i < a->n_nodes; i++)
            sluice_pool_histograms(sluice_engine_pool(a->engine, a->nodes[i].id), &qw[i], &ct[i]);
        metric_histogram(b, a, "sluice_queue_wait_seconds",
                         "Time calls waited for a permit (and any Retry-After hold).", qw);
        metric_histogram(b, a, "sluice_call_seconds",
                         "Duration of calls that ended, start to end (abandoned ones excluded).", ct);
    }
    free(qw);
    free(ct);
}

char *sluice_admin_metrics(struct sluice_admin *a)
{
    struct sbuf b = {0};
    size_t n = a->n_nodes;
    struct sluice_discovery_status *sts = calloc(n ? n : 1, sizeof *sts);
    struct sluice_pool_counts *pcs = calloc(n ? n : 1, sizeof *pcs);
    if (!sts || !pcs) {
        free(sts);
        free(pcs);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        sluice_engine_status(a->engine, a->nodes[i].id, &sts[i]);
        pcs[i] = sluice_pool_stats(sluice_engine_pool(a->engine, a->nodes[i].id));
    }
    char v[24];
    ADMIN_GAUGE(&b, a, sts, "sluice_inflight", "Generation calls in flight.",
                fmt_u64(v, st->in_flight));
    ADMIN_GAUGE(&b, a, sts, "sluice_limit", "Current concurrency limit (+Inf: unlimited).",
                st->limit ? fmt_u64(v, st->limit) : "+Inf");
    ADMIN_GAUGE(&b, a, sts, "sluice_ceiling", "Locked (discovered) ceiling; 0 when not locked.",
                fmt_u64(v, st->ceiling));
    ADMIN_GAUGE(&b, a, sts, "sluice_lock_expiry_timestamp_seconds",
                "When the lock expires, Unix epoch seconds; 0 when not locked.",
                fmt_u64(v, (uint64_t)(st->lock_expires_s > 0 ? st->lock_expires_s : 0)));
    ADMIN_GAUGE(&b, a, sts, "sluice_waiting",
                "Generation calls queued for a permit or a Retry-After hold.",
                fmt_u64(v, pc->queued));
    metric_head(&b, "sluice_requests_total", "counter",
                "Generation calls ended, by what they said about capacity.");
    for (size_t i = 0; i < n; i++) {
        const uint64_t by_outcome[] = {pcs[i].calls_ok, pcs[i].calls_overload, pcs[i].calls_ignored};
        static const char *const outcome_names[] = {"ok", "overload", "ignore"};
        for (size_t o = 0; o < 3; o++) {
            metric_node(&b, "sluice_requests_total", a->nodes[i].id);
            sb_printf(&b, ",outcome=\"%s\"} %" PRIu64 "\n", outcome_names[o], by_outcome[o]);
        }
    }
    metrics_deadlines(&b, a, sts, pcs);
    metric_head(&b, "sluice_state", "gauge", "Discovery state of the node: 1 for the current one.");
    static const enum sluice_discovery_state states[] = {
        SLUICE_DISCOVERY_PROBING, SLUICE_DISCOVERY_BACKOFF, SLUICE_DISCOVERY_LOCKED,
        SLUICE_DISCOVERY_FIXED};
    for (size_t i = 0; i < n; i++)
        for (size_t s = 0; s < 4; s++) {
            metric_node(&b, "sluice_state", a->nodes[i].id);
            sb_printf(&b, ",state=\"%s\"} %d\n", sluice_discovery_state_name(states[s]),
                      sts[i].state == states[s]);
        }

    pthread_mutex_lock(&a->mutex);
    count_events(a);
    metric_head(&b, "sluice_backoffs_total", "counter", "Backoff events by cause.");
    for (size_t i = 0; i < n; i++) {
        const struct node *nd = &a->nodes[i];
        if (!nd->ring)
            continue;
        for (int c = 0; c < N_CAUSES; c++)
            if (nd->backoffs[c] || sluice_cause_is_congestion((enum sluice_cause)c)) {
                metric_node(&b, "sluice_backoffs_total", nd->id);
                sb_printf(&b, ",cause=\"%s\"} %" PRIu64 "\n", sluice_cause_name((enum sluice_cause)c),
                          nd->backoffs[c]);
            }
    }
    metric_head(&b, "sluice_events_total", "counter", "Discovery events by kind.");
    for (size_t i = 0; i < n; i++) {
        const struct node *nd = &a->nodes[i];
        if (!nd->ring)
            continue;
        for (int k = 0; k < N_KINDS; k++) {
            metric_node(&b, "sluice_events_total", nd->id);
            sb_printf(&b, ",event=\"%s\"} %" PRIu64 "\n",
                      sluice_event_kind_name((enum sluice_event_kind)k), nd->events[k]);
        }
    }
    metric_head(&b, "sluice_events_dropped_total", "counter",
                "Events the node's ring overwrote before the admin counted them.");
    for (size_t i = 0; i < n; i++) {
        if (!a->nodes[i].ring)
            continue;
        metric_node(&b, "sluice_events_dropped_total", a->nodes[i].id);
        sb_printf(&b, "} %" PRIu64 "\n", a->nodes[i].dropped);
    }
    pthread_mutex_unlock(&a->mutex);
    free(sts);
    free(pcs);
    return sb_take(&b);
}

/* ---- the request deadline --------------------------------------------------- */

/*
 * A new connection `k` (listed already; under conns_mutex): past max_connections it
 * takes the slot of the kept-alive connection idle the longest, which is shut down
 * (a client must expect that between requests, and retries); with none, k is over
 * the limit and its request gets 503. So ordinary keep-alive connections cannot hold
 * every slot, and only requests in progress (streams: at most max_streams; heads:
 * at most timeout_s) can fill the endpoint.
 */
static void conn_admit(struct sluice_admin *a, struct conn *k)
{
    uint32_t live = 0;
    struct conn *idle = NULL;
    for (struct conn *o = a->conns; o; o = o->next) {
        if (o->cut || o->over)
            continue;
        live++;
        if (o != k && o->served && o->waiting && (!idle || o->since_ms < idle->since_ms))
            idle = o;
    }
    if (live <= a->cfg.max_connections)
        return;
    if (idle) {
        shutdown(idle->fd, SHUT_RD);
        idle->cut = true;
    } else {
        k->over = true;
    }
}

/* A slot was freed (under conns_mutex): the oldest connection over the limit whose
 * request has not arrived yet takes it, rather than a 503 while a slot is free. */
static void conn_promote(struct sluice_admin *a)
{
    struct conn *first = NULL;
    for (struct conn *o = a->conns; o; o = o->next)
        if (o->over && o->waiting && !o->cut && (!first || o->since_ms <= first->since_ms))
            first = o;
    if (first)
        first->over = false;
}

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION: a connection opened or closed. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct sluice_admin *a = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *k = *socket_context;
        if (!k)
            return;
        pthread_mutex_lock(&a->conns_mutex);
        if (k->prev)
            k->prev->next = k->next;
        else
            a->conns = k->next;
        if (k->next)
            k->next->prev = k->prev;
        if (!k->cut && !k->over)
            conn_promote(a);
        pthread_mutex_unlock(&a->conns_mutex);
        *socket_context = NULL;
        free(k);
        return;
    }
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct conn *k = info ? calloc(1, sizeof *k) : NULL;
    if (!k) {
        /* Untracked, it would escape the deadline: refuse it (as the sampler cuts one). */
        if (info)
            shutdown((int)info->connect_fd, SHUT_RD);
        return;
    }
    k->fd = (int)info->connect_fd;
    k->waiting = true;
    k->since_ms = mono_ms_now();
    pthread_mutex_lock(&a->conns_mutex);
    k->next = a->conns;
    if (a->conns)
        a->conns->prev = k;
    a->conns = k;
    conn_admit(a, k);
    pthread_mutex_unlock(&a->conns_mutex);
    *socket_context = k;
}

/* The connection's request has arrived in full (waiting = false), or its answer
 * has ended and the deadline starts over for the next one (waiting = true).
 * Returns whether the connection was opened past max_connections. */
static bool conn_mark(struct sluice_admin *a, struct MHD_Connection *c, bool waiting)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *k = info ? info->socket_context : NULL;
    if (!k)
        return false;
    pthread_mutex_lock(&a->conns_mutex);
    k->waiting = waiting;
    k->served |= waiting;
    k->since_ms = mono_ms_now();
    bool over = k->over;
    pthread_mutex_unlock(&a->conns_mutex);
    return over;
}

/* From the sampler's tick: shut down the reading side of every connection whose
 * request is overdue. Its own thread then reads end of file and libmicrohttpd closes
 * it as it does a client that hung up, so the client sees the close only after the
 * server has let go of the connection (with SHUT_RDWR it would see it at once, and a
 * client that reconnects then could find the slot still taken). */
static void cut_overdue(struct sluice_admin *a)
{
    int64_t deadline = mono_ms_now() - (int64_t)a->cfg.timeout_s * 1000;
    pthread_mutex_lock(&a->conns_mutex);
    for (struct conn *k = a->conns; k; k = k->next)
        if (k->waiting && !k->cut && k->since_ms <= deadline) {
            shutdown(k->fd, SHUT_RD);
            k->cut = true;
        }
    pthread_mutex_unlock(&a->conns_mutex);
}

/* ---- the sampler thread ----------------------------------------------------- */

static void *sampler_main(void *arg)
{
    struct sluice_admin *a = arg;
    pthread_mutex_lock(&a->mutex);
    while (!atomic_load(&a->stopping)) {
        cut_overdue(a);
        count_events(a);
        record_history(a);
        pthread_cond_broadcast(&a->tick);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        while (!atomic_load(&a->stopping) &&
               pthread_cond_timedwait(&a->tick, &a->mutex, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&a->mutex);
    return NULL;
}

/* ---- HTTP plumbing ----------------------------------------------------------- */

struct request {
    size_t body_bytes;
};

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                 char *body, size_t len, void (*release)(void *))
{
    struct MHD_Response *r =
        release ? MHD_create_response_from_buffer_with_free_callback(len, body, release)
                : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (release)
            release(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *body)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s)
        return MHD_NO;
    size_t len = strlen(s);
    /* A trailing newline, so `curl` output ends cleanly. */
    char *t = realloc(s, len + 2);
    if (t) {
        s = t;
        s[len++] = '\n';
        s[len] = '\0';
    }
    return send_body(c, status, "application/json; charset=utf-8", s, len, free);
}

/* Copy src as valid UTF-8 (jansson refuses anything else, and the answer would be lost):
 * a byte that starts no sequence (a client's %FF, or one `%.200s` cut) becomes "\xFF".
 * dst takes 4 bytes per byte of src, plus the NUL. */
static void utf8_clean(char *dst, size_t size, const char *src)
{
    size_t o = 0;
    for (const char *p = src; *p;) {
        size_t n = sluice_utf8_len(p), w = n ? n : 4;
        if (o + w >= size)
            break;
        if (n)
            memcpy(dst + o, p, n);
        else
            snprintf(dst + o, 5, "\\x%02X", (unsigned char)*p);
        o += w;
        p += n ? n : 1;
    }
    dst[o] = '\0';
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *allow,
                                  const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *allow,
                                  const char *fix, const char *fmt, ...)
{
    char raw[600], msg[4 * sizeof raw];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    utf8_clean(msg, sizeof msg, raw);
    json_t *o = json_pack("{s:s,s:s,s:i}", "error", msg, "fix", fix, "status", (int)status);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return MHD_NO;
    size_t len = strlen(s);
    char *t = realloc(s, len + 2);
    if (t) {
        s = t;
        s[len++] = '\n';
        s[len] = '\0';
    }
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, s, free);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (allow)
        MHD_add_response_header(r, "Allow", allow);
    if (status == 503) /* full: give the slot back rather than keep the connection */
        MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

#define ROUTES_FIX                                                                                 \
    "routes: GET /, GET /compute/concurrency, GET /compute/concurrency/events?node_id=N, "       \
    "GET /compute/concurrency/history, POST /compute/concurrency/clear?node_id=N, GET /metrics"

/*
 * The node named by ?node_id=, or -1 after answering 400/404. `required`
 * false: a missing node_id yields -2 (all nodes).
 */
static ptrdiff_t want_node(struct sluice_admin *a, struct MHD_Connection *c, bool required,
                           enum MHD_Result *answered)
{
    const char *id = NULL;
    size_t len = 0;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "node_id", 7, &id, &len) != MHD_YES)
        id = NULL;
    if (!id && !required)
        return -2;
    if (!id) {
        *answered = send_error(c, 400, NULL,
                               "add ?node_id=NODE (GET /compute/concurrency lists the nodes)",
                               "missing node_id");
        return -1;
    }
    /* A %00 decodes to a NUL inside the value: "cloud:a%00junk" must not name cloud:a. */
    bool control = strlen(id) != len, utf8 = true;
    for (const char *p = id; *p && utf8;) {
        size_t n = sluice_utf8_len(p);
        control |= (unsigned char)*p < 0x20 || *p == 0x7f;
        utf8 = n != 0;
        p += n;
    }
    if (len == 0 || len > SLUICE_BACKEND_ID_MAX || control || !utf8) {
        *answered = send_error(c, 400, NULL,
                               "node_id must be a backend ID: 1..255 bytes of UTF-8, no control "
                               "characters (GET /compute/concurrency lists the nodes)",
                               "malformed node_id (%s)",
                               len == 0  ? "empty"
                               : control ? "control character"
                               : !utf8   ? "not UTF-8"
                                         : "too long");
        return -1;
    }
    ptrdiff_t i = node_index(a, id);
    if (i < 0) {
        json_t *known = json_array();
        for (size_t k = 0; k < a->n_nodes; k++)
            json_array_append_new(known, json_string(a->nodes[k].id));
        char *list = json_dumps(known, JSON_COMPACT);
        json_decref(known);
        *answered = send_error(c, 404, NULL, "use one of the registered nodes",
                               "unknown node_id \"%.255s\"; known nodes: %.300s", id,
                               list ? list : "[]");
        free(list);
    }
    return i;
}

/* Parse an unsigned decimal parameter; false after answering 400. */
static bool want_u64(struct MHD_Connection *c, const char *name, uint64_t *out,
                     enum MHD_Result *answered)
{
    const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    *out = 0;
    if (!s)
        return true;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-' || s[0] == '+' || s[0] == ' ') {
        *answered = send_error(c, 400, NULL, "pass a decimal event seq, e.g. after=0",
                               "malformed %s \"%.64s\"", name, s);
        return false;
    }
    *out = v;
    return true;
}

static bool want_flag(struct MHD_Connection *c, const char *name, bool *out,
                      enum MHD_Result *answered)
{
    const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    *out = false;
    if (!s)
        return true;
    if (!strcmp(s, "1") || !strcmp(s, "true")) {
        *out = true;
        return true;
    }
    if (!strcmp(s, "0") || !strcmp(s, "false"))
        return true;
    *answered = send_error(c, 400, NULL, "use 1/true or 0/false", "malformed %s \"%.64s\"", name, s);
    return false;
}

/* ---- event streams (server-sent events) ------------------------------------------ */

struct stream {
    struct sluice_admin *a;
    const struct sluice_event_ring *ring; /* NULL: fixed node, keep-alives only */
    uint64_t cursor;
    char pending[8192];
    size_t off, len;
    int64_t last_send_ms;
};

/* Format the events after the cursor as SSE frames into `pending`. */
static void stream_fill(struct stream *s)
{
    s->off = s->len = 0;
    if (!s->ring)
        return;
    struct sluice_event batch[16];
    size_t got = sluice_event_ring_read(s->ring, &s->cursor, batch, 16, NULL);
    for (size_t k = 0; k < got; k++) {
        char line[512];
        size_t n = sluice_event_format_json(&batch[k], line, sizeof line);
        if (n >= sizeof line)
            continue;
        if (n && line[n - 1] == '\n')
            line[--n] = '\0';
        int w = snprintf(s->pending + s->len, sizeof s->pending - s->len,
                         "id: %" PRIu64 "\nevent: %s\ndata: %s\n\n", batch[k].seq,
                         sluice_event_kind_name(batch[k].kind), line);
        if (w < 0 || (size_t)w >= sizeof s->pending - s->len)
            break;
        s->len += (size_t)w;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *s = cls;
    struct sluice_admin *a = s->a;
    int64_t keepalive_ms = (int64_t)a->cfg.timeout_s * 1000 / 3;
    for (;;) {
        if (atomic_load(&a->stopping))
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->off == s->len)
            stream_fill(s);
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(buf, s->pending + s->off, n);
            s->off += n;
            s->last_send_ms = wall_ms_now();
            return (ssize_t)n;
        }
        if (wall_ms_now() - s->last_send_ms >= keepalive_ms) {
            static const char ka[] = ": keep-alive\n\n";
            size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
            memcpy(buf, ka, n);
            s->last_send_ms = wall_ms_now();
            return (ssize_t)n;
        }
        /* Wait for the sampler's tick (or stop); 250 ms caps the latency of a new event. */
        pthread_mutex_lock(&a->mutex);
        if (!atomic_load(&a->stopping)) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += 250 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&a->tick, &a->mutex, &until);
        }
        pthread_mutex_unlock(&a->mutex);
    }
}

static void stream_free(void *cls)
{
    struct stream *s = cls;
    atomic_fetch_sub(&s->a->streams, 1);
    free(s);
}

/* ---- routes ------------------------------------------------------------------ */

static enum MHD_Result route_events(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = want_node(a, c, true, &answered);
    if (i < 0)
        return answered;
    uint64_t after;
    bool follow;
    if (!want_u64(c, "after", &after, &answered) || !want_flag(c, "follow", &follow, &answered))
        return answered;
    const struct sluice_event_ring *ring = a->nodes[i].ring;
    if (!follow) {
        struct sbuf b = {0};
        uint64_t cursor = after;
        struct sluice_event batch[32];
        size_t got;
        uint64_t end = ring ? sluice_event_ring_count(ring) : 0;
        while (ring && cursor < end &&
               (got = sluice_event_ring_read(ring, &cursor, batch, 32, NULL)) > 0)
            for (size_t k = 0; k < got; k++) {
                char line[512];
                size_t n = sluice_event_format_json(&batch[k], line, sizeof line);
                if (n < sizeof line)
                    sb_put(&b, line, n);
            }
        char *body = sb_take(&b);
        if (!body)
            return MHD_NO;
        return send_body(c, 200, "application/x-ndjson; charset=utf-8", body, strlen(body), free);
    }
    unsigned open = atomic_fetch_add(&a->streams, 1);
    if (open >= a->cfg.max_streams) {
        atomic_fetch_sub(&a->streams, 1);
        return send_error(c, 503, NULL,
                          "close another follow=1 stream, or raise sluice_admin_desc.max_streams",
                          "too many event streams open (max_streams = %u)", a->cfg.max_streams);
    }
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        atomic_fetch_sub(&a->streams, 1);
        return MHD_NO;
    }
    s->a = a;
    s->ring = ring;
    s->cursor = after;
    /* A reconnecting EventSource resumes after the last event it saw. */
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (last && *last) {
        char *end;
        unsigned long long v = strtoull(last, &end, 10);
        if (!*end)
            s->cursor = v;
    }
    s->last_send_ms = 0; /* an immediate keep-alive makes the headers go out at once */
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result route_history(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = want_node(a, c, false, &answered);
    if (i == -1)
        return answered;
    json_t *root = json_object();
    json_t *nodes = json_object();
    json_object_set_new(root, "interval_ms", json_integer(1000));
    json_object_set_new(root, "fields", json_pack("[s,s,s]", "wall_ms", "limit", "in_flight"));
    pthread_mutex_lock(&a->mutex);
    for (size_t k = 0; k < a->n_nodes; k++)
        if (i == -2 || (size_t)i == k)
            json_object_set_new(nodes, a->nodes[k].id, history_json(a, &a->nodes[k]));
    pthread_mutex_unlock(&a->mutex);
    json_object_set_new(root, "nodes", nodes);
    return send_json(c, 200, root);
}

static enum MHD_Result route_clear(struct sluice_admin *a, struct MHD_Connection *c)
{
    enum MHD_Result answered = MHD_NO;
    ptrdiff_t i = want_node(a, c, true, &answered);
    if (i < 0)
        return answered;
    const char *id = a->nodes[i].id;
    if (!a->nodes[i].ring)
        return send_error(c, 409, NULL,
                          "only adaptive nodes have a discovered ceiling to clear; change a "
                          "fixed node's limit in its backend configuration (active)",
                          "node \"%s\" has a fixed limit: it never probes or locks, so there is "
                          "nothing to clear",
                          id);
    int status = sluice_engine_clear(a->engine, id);
    if (status != SLUICE_OK)
        return send_error(c, 500, NULL, "retry; see the node's event feed",
                          "clearing \"%s\" failed: %s", id, sluice_strerror(status));
    /* Answer once the store has dropped the lock, so a reader of the state file sees it. */
    struct sluice_discovery *d = sluice_pool_discovery(sluice_engine_pool(a->engine, id));
    if (d)
        sluice_discovery_sync(d);
    json_t *node = node_json(a, (size_t)i);
    json_t *root = json_object();
    json_object_set_new(root, "cleared", json_true());
    json_object_set_new(root, "node", node ? node : json_null());
    return send_json(c, 200, root);
}

static enum MHD_Result route_metrics(struct sluice_admin *a, struct MHD_Connection *c)
{
    char *body = sluice_admin_metrics(a);
    if (!body)
        return MHD_NO;
    return send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", body, strlen(body), free);
}

static enum MHD_Result route_status(struct sluice_admin *a, struct MHD_Connection *c)
{
    char *body = sluice_admin_status_json(a);
    if (!body)
        return MHD_NO;
    return send_body(c, 200, "application/json; charset=utf-8", body, strlen(body), free);
}

static enum MHD_Result route_page(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        sluice__admin_page_size, (void *)sluice__admin_page, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; img-src data:; "
                            "frame-ancestors 'none'");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/*
 * Is `host` (a Host header or an Origin's host: name or address, maybe with a port)
 * a loopback address literal (127.0.0.0/8, [::1]) or localhost? Only these: a DNS
 * name that merely starts like one (127.attacker.example, 127.0.0.1.nip.io) can be
 * rebound to 127.0.0.1 by whoever owns it.
 */
static bool host_is_loopback(const char *host)
{
    char name[INET6_ADDRSTRLEN];
    bool bracketed = host[0] == '[';
    const char *end = bracketed ? strchr(host, ']') : host + strcspn(host, ":");
    if (!end)
        return false;
    const char *start = host + bracketed;
    size_t n = (size_t)(end - start);
    if (n == 0 || n >= sizeof name)
        return false;
    memcpy(name, start, n);
    name[n] = '\0';
    const char *port = end + bracketed;
    if (*port && (*port != ':' || !port[1] || strlen(port + 1) > 5 ||
                  strspn(port + 1, "0123456789") != strlen(port + 1)))
        return false;
    struct in_addr a4;
    struct in6_addr a6;
    if (bracketed)
        return inet_pton(AF_INET6, name, &a6) == 1 &&
               (IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127));
    return !strcasecmp(name, "localhost") ||
           (inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127);
}

/* A Host (or Origin host) this bind may be addressed by: on a loopback bind only
 * loopback ones (DNS rebinding); a remote bind (allow_remote) takes any. */
static bool host_allowed(const struct sluice_admin *a, const char *host)
{
    return !a->loopback || host_is_loopback(host);
}

/* A browser's Origin that is this server itself: http://<our Host>, by the same rule. */
static bool origin_allowed(const struct sluice_admin *a, struct MHD_Connection *c,
                           const char *origin)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host || strncmp(origin, "http://", 7) != 0)
        return false;
    return strcmp(origin + 7, host) == 0 && host_allowed(a, origin + 7);
}

static enum MHD_Result dispatch(struct sluice_admin *a, struct MHD_Connection *c, const char *url,
                                const char *method)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    struct route {
        const char *path;
        bool post; /* else GET/HEAD */
    };
    static const struct route routes[] = {
        {"/", false},
        {"/compute/concurrency", false},
        {"/compute/concurrency/events", false},
        {"/compute/concurrency/history", false},
        {"/compute/concurrency/clear", true},
        {"/metrics", false},
    };
    size_t k = 0;
    for (; k < sizeof routes / sizeof *routes; k++)
        if (!strcmp(url, routes[k].path))
            break;
    if (k == sizeof routes / sizeof *routes)
        return send_error(c, 404, NULL, ROUTES_FIX, "no route %.200s", url);
    if (routes[k].post ? !post : !get)
        return send_error(c, 405, routes[k].post ? "POST" : "GET, HEAD",
                          routes[k].post ? "send it as POST, e.g. curl -X POST" : "use GET",
                          "%s does not take %.16s", url, method);
    switch (k) {
    case 0:
        return route_page(c);
    case 1:
        return route_status(a, c);
    case 2:
        return route_events(a, c);
    case 3:
        return route_history(a, c);
    case 4:
        return route_clear(a, c);
    default:
        return route_metrics(a, c);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    (void)upload;
    struct sluice_admin *a = cls;
    struct request *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        /* Refuse an announced oversized body before reading it. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > a->cfg.max_body_bytes) {
            conn_mark(a, c, false);
            return send_error(c, 413, NULL,
                              "these routes take no request body; send the parameters in the "
                              "query string",
                              "request body of %.20s bytes is over the limit of %u bytes", cl,
                              a->cfg.max_body_bytes);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        /* A body the routes never read: count it, drop it, answer 413 once it has ended.
         * libmicrohttpd cannot answer mid-upload, so a stream that goes on far past the
         * limit (chunked, no Content-Length) is cut off instead of drained forever. */
        rq->body_bytes += *upload_size;
        *upload_size = 0;
        return rq->body_bytes > (size_t)a->cfg.max_body_bytes * 16 + 65536 ? MHD_NO : MHD_YES;
    }
    /* The head and any body are in: the deadline is met, however long the answer (an
     * event stream) then takes. */
    if (conn_mark(a, c, false))
        return send_error(c, 503, NULL,
                          "retry in a moment; close idle connections or event streams, or raise "
                          "sluice_admin_desc.max_connections",
                          "the admin endpoint is full: max_connections = %u requests and streams "
                          "are in progress",
                          a->cfg.max_connections);
    if (rq->body_bytes > a->cfg.max_body_bytes)
        return send_error(c, 413, NULL,
                          "these routes take no request body; send the parameters in the query "
                          "string",
                          "request body of %zu bytes is over the limit of %u bytes",
                          rq->body_bytes, a->cfg.max_body_bytes);
    if (a->loopback) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        if (host && !host_allowed(a, host))
            return send_error(c, 403, NULL,
                              "address the endpoint as 127.0.0.1, localhost or [::1] (a "
                              "loopback address, not a name that resolves to one)",
                              "Host \"%.100s\" is not a loopback address or localhost", host);
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && strcmp(method, "GET") && strcmp(method, "HEAD") && !origin_allowed(a, c, origin))
        return send_error(c, 403, NULL,
                          "clear from the Concurrency Health page itself, sluicectl or curl",
                          "a request from the web page at %.100s may not change this endpoint",
                          origin);
    return dispatch(a, c, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    /* A kept-alive connection gets timeout_s for its next request too. */
    conn_mark(cls, c, true);
    free(*con_cls);
    *con_cls = NULL;
}

/* ---- start / stop ------------------------------------------------------------ */

static bool addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a6))
            return true;
        return IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127;
    }
    return false;
}

/* Resolve defaults and check ranges; SLUICE_OK or SLUICE_EINVAL naming the field. */
static int admin_resolve(const struct sluice_admin_desc *in, struct sluice_admin_desc *d)
{
    *d = *in;
    if (!d->engine)
        return admin_fail(in, SLUICE_EINVAL, "sluice_admin_desc.engine is NULL (pass the engine "
                                             "to serve)");
    if (!d->address)
        d->address = "127.0.0.1";
    if (d->port.set && d->port.value > 65535)
        return admin_fail(in, SLUICE_EINVAL,
                          "sluice_admin_desc.port = %u is above 65535 (use 1..65535, or "
                          "SLUICE_SOME(0) for a free port)",
                          d->port.value);
#define ADMIN_DEFAULT(field, def, lo, hi)                                                          \
    do {                                                                                           \
        if (!d->field)                                                                             \
            d->field = (def);                                                                      \
        if (d->field < (lo) || d->field > (hi))                                                    \
            return admin_fail(in, SLUICE_EINVAL,                                                   \
                              "sluice_admin_desc." #field " = %u is outside %u..%u", d->field,     \
                              (unsigned)(lo), (unsigned)(hi));                                     \
    } while (0)
    ADMIN_DEFAULT(max_connections, 32, 1, 1024);
    if (!d->max_streams)
        d->max_streams = d->max_connections < 8 ? d->max_connections : 8;
    ADMIN_DEFAULT(max_streams, 8, 1, d->max_connections);
    ADMIN_DEFAULT(timeout_s, 10, 1, 3600);
    ADMIN_DEFAULT(max_request_bytes, 16384, 4096, 1048576);
    ADMIN_DEFAULT(max_body_bytes, 4096, 1, d->max_request_bytes);
    ADMIN_DEFAULT(history_s, 300, 10, 3600);
#undef ADMIN_DEFAULT
    return SLUICE_OK;
}

/* Bind and listen ourselves, so a failure names its cause; returns the socket or -1. */
static int admin_listen(const struct sluice_admin_desc *d, bool *loopback, uint16_t *port,
                        int *status)
{
    const char *host = strcmp(d->address, "localhost") ? d->address : "127.0.0.1";
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM};
    char service[8];
    snprintf(service, sizeof service, "%u", d->port.set ? d->port.value : SLUICE_ADMIN_PORT_DEFAULT);
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, service, &hints, &ai) != 0 || !ai) {
        *status = admin_fail(d, SLUICE_EINVAL,
                             "sluice_admin_desc.address \"%s\" is not a numeric IPv4/IPv6 address "
                             "(e.g. 127.0.0.1 or ::1)",
                             d->address);
        return -1;
    }
    *loopback = addr_is_loopback(ai->ai_addr);
    if (!*loopback && !d->allow_remote) {
        freeaddrinfo(ai);
        *status = admin_fail(d, SLUICE_EINVAL,
                             "sluice_admin_desc.address \"%s\" is not loopback; the endpoint has "
                             "no authentication, so set allow_remote = true only behind a "
                             "firewall or an authenticating proxy",
                             d->address);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        *status = admin_fail(d, SLUICE_EINVAL,
                             "cannot listen on %s port %s: %s (change sluice_admin_desc.port, or "
                             "SLUICE_SOME(0) for a free one)",
                             d->address, service, strerror(err));
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static void admin_free(struct sluice_admin *a)
{
    if (!a)
        return;
    for (size_t i = 0; a->nodes && i < a->n_nodes; i++)
        free(a->nodes[i].history);
    free(a->nodes);
    pthread_mutex_destroy(&a->conns_mutex); /* conns is empty: every close was reported */
    pthread_cond_destroy(&a->tick);
    pthread_mutex_destroy(&a->mutex);
    free(a);
}

int sluice_admin_start(const struct sluice_admin_desc *desc, struct sluice_admin **out)
{
    *out = NULL;
    if (desc->error && desc->error_size)
        desc->error[0] = '\0';
    struct sluice_admin_desc d;
    int status = admin_resolve(desc, &d);
    if (status != SLUICE_OK)
        return status;
    struct sluice_admin *a = calloc(1, sizeof *a);
    if (!a)
        return SLUICE_ENOMEM;
    pthread_mutex_init(&a->mutex, NULL);
    pthread_mutex_init(&a->conns_mutex, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->tick, &ca);
    pthread_condattr_destroy(&ca);
    a->engine = d.engine;
    a->cfg = d;
    a->cfg.address = NULL;
    a->cfg.error = NULL;
    a->n_nodes = sluice_engine_backend_count(d.engine);
    a->nodes = calloc(a->n_nodes ? a->n_nodes : 1, sizeof *a->nodes);
    if (!a->nodes) {
        admin_free(a);
        return SLUICE_ENOMEM;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct node *n = &a->nodes[i];
        n->id = sluice_engine_backend_id(d.engine, i);
        n->ring = sluice_engine_events(d.engine, n->id);
        n->history = calloc(d.history_s, sizeof *n->history);
        if (!n->history) {
            admin_free(a);
            return SLUICE_ENOMEM;
        }
    }
    int fd = admin_listen(&d, &a->loopback, &a->port, &status);
    if (fd < 0) {
        admin_free(a);
        return status;
    }
    a->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL,
        NULL, on_request, a, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)d.max_connections + ADMIN_SPARE_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)d.timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)d.max_request_bytes,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, a, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        a, MHD_OPTION_END);
    if (!a->daemon) {
        close(fd);
        admin_free(a);
        return admin_fail(desc, SLUICE_EIO, "libmicrohttpd did not start on port %u",
                          (unsigned)a->port);
    }
    if (pthread_create(&a->sampler, NULL, sampler_main, a) != 0) {
        atomic_store(&a->stopping, true);
        MHD_stop_daemon(a->daemon);
        admin_free(a);
        return admin_fail(desc, SLUICE_EIO, "cannot start the admin's sampler thread");
    }
    a->sampler_started = true;
    *out = a;
    return SLUICE_OK;
}

uint16_t sluice_admin_port(const struct sluice_admin *a)
{
    return a ? a->port : 0;
}

void sluice_admin_stop(struct sluice_admin *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mutex);
    atomic_store(&a->stopping, true);
    pthread_cond_broadcast(&a->tick);
    pthread_mutex_unlock(&a->mutex);
    /* Joins the listener and every connection thread; streams see `stopping` and end. */
    MHD_stop_daemon(a->daemon);
    if (a->sampler_started)
        pthread_join(a->sampler, NULL);
    admin_free(a);
}
