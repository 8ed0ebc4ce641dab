/*
 * admin_json.c — the admin's JSON model of a node: its discovery state,
 * its deadline figures (totals, and rates and queue-wait percentiles over
 * the last SLUICE__ADMIN_RECENT_S seconds of the sampler's tallies) and
 * its chart history; and the body of GET /compute/concurrency built from
 * them. The field names and their order are what the page and sluicectl
 * read (sluice/admin.h).
 */
#include "admin_internal.h"

#include <string.h>

ptrdiff_t sluice__admin_node_index(const struct sluice_admin *a, const char *id)
{
    for (size_t i = 0; i < a->n_nodes; i++)
        if (strcmp(a->nodes[i].id, id) == 0)
            return (ptrdiff_t)i;
    return -1;
}

/* An event as JSON, in the exact shape of the core's JSON Lines record. */
static json_t *event_json(const struct sluice_event *ev)
{
    char line[SLUICE_EVENT_JSON_MAX];
    size_t n = sluice_event_format_json(ev, line, sizeof line);
    return n < sizeof line ? json_loads(line, 0, NULL) : NULL;
}

static json_t *ms_or_null(int64_t ns)
{
    return ns < 0 ? json_null() : json_real((double)ns / 1e6);
}

/* Events per second between two tallies dt seconds apart (0 when dt is not positive). */
static json_t *rate_json(uint64_t now, uint64_t then, double dt)
{
    return json_real(dt > 0 ? (double)(now - then) / dt : 0.0);
}

/* The counters' totals since start, as deadline_json shows them. */
static void totals_json(const struct sluice_pool_counts *c, json_t *o)
{
    json_object_set_new(o, "lingering", json_integer(c->lingering));
    json_object_set_new(o, "linger", json_string(sluice_linger_name(c->linger)));
    json_object_set_new(o, "linger_now", json_string(sluice_linger_name(c->linger_now)));
    json_object_set_new(o, "expected_service_ms", ms_or_null(c->expected_ns ? c->expected_ns : -1));
    json_object_set_new(o, "expected_first_byte_ms",
                        ms_or_null(c->expected_first_ns ? c->expected_first_ns : -1));
    json_object_set_new(
        o, "requests_total",
        json_integer((json_int_t)(c->calls_ok + c->calls_overload + c->calls_ignored +
                                  c->calls_censored)));
    json_object_set_new(o, "overloads_total", json_integer((json_int_t)c->calls_overload));
    json_object_set_new(o, "timeouts_total", json_integer((json_int_t)c->timeouts));
    json_object_set_new(o, "cancels_total", json_integer((json_int_t)c->cancels));
    json_object_set_new(o, "refused_capacity_total", json_integer((json_int_t)c->refused_capacity));
    json_object_set_new(o, "refused_early_total", json_integer((json_int_t)c->refused_early));
    json_object_set_new(o, "refused_late_total", json_integer((json_int_t)c->refused_late));
    json_object_set_new(o, "lingered_total", json_integer((json_int_t)c->lingered));
}

/*
 * The deadline figures of node i: totals since start, and over the last
 * SLUICE__ADMIN_RECENT_S seconds of tallies the rates per second and the
 * queue wait's p50/p99 (null when no call waited). Takes a->mutex for the
 * tallies.
 */
static void deadline_json(struct sluice_admin *a, size_t i, const struct sluice_pool_counts *c,
                          json_t *o)
{
    totals_json(c, o);
    const struct sluice__admin_node *n = &a->nodes[i];
    const char *source = NULL;
    int64_t start_ms = sluice__admin_start_deadline_ms(a, n->id, &source);
    json_object_set_new(o, "start_deadline_ms", start_ms < 0 ? json_null() : json_integer(start_ms));
    json_object_set_new(o, "start_deadline_source", start_ms < 0 ? json_null() : json_string(source));
    struct sluice__admin_tally now = sluice__admin_take_tally(sluice_engine_pool(a->engine, n->id),
                                                              c, sluice__admin_wall_ms());
    struct sluice__admin_tally then = now; /* the oldest tally kept, when there is one */
    pthread_mutex_lock(&a->mutex);
    bool have = n->recent_len > 0;
    if (have) /* the oldest tally kept */
        then = n->recent[(n->recent_head + SLUICE__ADMIN_RECENT_S + 1 - n->recent_len) %
                         (SLUICE__ADMIN_RECENT_S + 1)];
    pthread_mutex_unlock(&a->mutex);
    double dt = have ? (double)(now.wall_ms - then.wall_ms) / 1000.0 : 0.0;
    struct sluice_histogram_counts qw = now.queue_wait;
    if (have)
        for (uint32_t b = 0; b < SLUICE_HISTOGRAM_BUCKETS; b++) {
            qw.bucket[b] -= then.queue_wait.bucket[b];
            qw.count -= then.queue_wait.bucket[b];
        }
    json_object_set_new(o, "request_rate", rate_json(now.requests, then.requests, dt));
    json_object_set_new(o, "overload_rate", rate_json(now.overloads, then.overloads, dt));
    json_object_set_new(o, "timeout_rate", rate_json(now.timeouts, then.timeouts, dt));
    json_object_set_new(o, "queue_wait_p50_ms", ms_or_null(sluice_histogram_quantile(&qw, 0.5)));
    json_object_set_new(o, "queue_wait_p99_ms", ms_or_null(sluice_histogram_quantile(&qw, 0.99)));
}

bool sluice__admin_node_listed(struct sluice_admin *a, size_t i)
{
    struct sluice__admin_node *n = &a->nodes[i];
    if (!n->preset || atomic_load(&n->used))
        return true;
    struct sluice_pool_counts c = sluice_pool_stats(sluice_engine_pool(a->engine, n->id));
    bool traffic = c.admitted || c.in_flight || c.queued || c.calls_ok || c.calls_overload ||
                   c.calls_ignored || c.calls_censored || c.refused_capacity || c.refused_early || c.refused_late ||
                   c.timeouts || c.cancels;
    if (traffic)
        atomic_store(&n->used, true);
    return traffic;
}

json_t *sluice__admin_node_json(struct sluice_admin *a, size_t i)
{
    const struct sluice__admin_node *n = &a->nodes[i];
    struct sluice_discovery_status st;
    if (sluice_engine_status(a->engine, n->id, &st) != SLUICE_OK)
        return NULL;
    struct sluice_pool_counts c = sluice_pool_stats(sluice_engine_pool(a->engine, n->id));
    char line[SLUICE_BACKEND_ID_MAX + 64];
    sluice_engine_status_line(a->engine, n->id, line, sizeof line);
    bool adaptive = st.state != SLUICE_DISCOVERY_FIXED;
    int64_t left = st.lock_expires_s ? st.lock_expires_s - sluice__admin_wall_ms() / 1000 : 0;
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
    json_object_set_new(o, "events",
                        json_integer(n->ring ? (json_int_t)sluice_event_ring_count(n->ring) : 0));
    json_t *last = st.last_event.seq ? event_json(&st.last_event) : NULL;
    json_object_set_new(o, "last_event", last ? last : json_null());
    deadline_json(a, i, &c, o);
    return o;
}

char *sluice_admin_status_json(struct sluice_admin *a)
{
    if (!a)
        return NULL;
    json_t *root = json_object();
    json_t *nodes = json_array();
    json_object_set_new(root, "now_ms", json_integer(sluice__admin_wall_ms()));
    for (size_t i = 0; i < a->n_nodes; i++) {
        json_t *o = sluice__admin_node_listed(a, i) ? sluice__admin_node_json(a, i) : NULL;
        if (o)
            json_array_append_new(nodes, o);
    }
    json_object_set_new(root, "nodes", nodes);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

json_t *sluice__admin_history_json(const struct sluice_admin *a, const struct sluice__admin_node *n)
{
    json_t *arr = json_array();
    uint32_t cap = a->cfg.history_s;
    for (uint32_t k = 0; k < n->hist_len; k++) {
        const struct sluice__admin_sample *s =
            &n->history[(n->hist_head + cap - n->hist_len + k) % cap];
        json_array_append_new(arr, json_pack("[I,i,i,i,i]", (json_int_t)s->wall_ms, (int)s->limit,
                                             (int)s->in_flight, (int)s->ceiling, (int)s->waiting));
    }
    return arr;
}
