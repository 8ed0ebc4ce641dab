/*
 * admin_metrics.c — GET /metrics: every node's figures in the Prometheus
 * text format 0.0.4 (sluice/admin.h lists the families).
 *
 * Two steps: a snapshot of every node (discovery status, pool counters,
 * latency histograms, and the event counters, counted up to now under the
 * admin's mutex), then the text, written from the snapshot alone by the
 * `families` table: one row per family, in the order they are exposed,
 * each holding its name, type, help and how one node's samples are
 * written. A family is a row, not code beside the others.
 */
#include "admin_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf_internal.h"

/* One node's figures, as the families read them. */
struct node_view {
    const char *id;
    bool listed;   /* not a preset still without traffic (sluice__admin_node_listed) */
    bool adaptive; /* it has an event ring: the event families show it */
    struct sluice_discovery_status st;
    struct sluice_pool_counts pc;
    struct sluice_histogram_counts queue_wait, call;
    int64_t start_deadline_ms; /* desc.start_deadline's, -1 = none */
    uint64_t backoffs[SLUICE_CAUSE_COUNT];
    uint64_t events[SLUICE__ADMIN_N_KINDS];
    uint64_t dropped;
};

/* ---- the text format ------------------------------------------------------------ */

/* Prometheus label value: backslash, double quote and newline escaped. */
static void put_label(struct sluice__strbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            sluice__strbuf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            sluice__strbuf_put(b, "\\n", 2);
        else
            sluice__strbuf_put(b, s, 1);
    }
}

/* `series{node="id"`: the caller adds any other label, the `}` and the value. */
static void put_series(struct sluice__strbuf *b, const char *series, const char *node)
{
    sluice__strbuf_printf(b, "%s{node=\"", series);
    put_label(b, node);
    sluice__strbuf_put(b, "\"", 1);
}

/* One sample with a second label: `name{node="id",label="value"} n`. */
static void put_labelled(struct sluice__strbuf *b, const char *name, const char *node,
                         const char *label, const char *value, uint64_t n)
{
    put_series(b, name, node);
    sluice__strbuf_printf(b, ",%s=\"%s\"} %" PRIu64 "\n", label, value, n);
}

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

/* A histogram (seconds): cumulative name_bucket{le}, name_sum and name_count. */
static void put_histogram(struct sluice__strbuf *b, const char *name, const char *node,
                          const struct sluice_histogram_counts *h)
{
    char series[96], v[24];
    uint64_t cum = 0;
    snprintf(series, sizeof series, "%s_bucket", name);
    for (uint32_t k = 0; k < SLUICE_HISTOGRAM_BUCKETS; k++) {
        cum += h->bucket[k];
        put_labelled(b, series, node, "le",
                     k + 1 < SLUICE_HISTOGRAM_BUCKETS ? fmt_seconds(v, sluice_histogram_bound(k))
                                                      : "+Inf",
                     cum);
    }
    snprintf(series, sizeof series, "%s_sum", name);
    put_series(b, series, node);
    sluice__strbuf_printf(b, "} %s\n", fmt_seconds(v, h->sum_ns));
    snprintf(series, sizeof series, "%s_count", name);
    put_series(b, series, node);
    sluice__strbuf_printf(b, "} %" PRIu64 "\n", h->count);
}

/* ---- the families' samples ------------------------------------------------------- */

/* A family of one sample per node: its value's text, in buf (24 bytes) or a constant. */
typedef const char *node_value_fn(const struct node_view *v, char *buf);
/* Any other family: all of one node's samples. */
typedef void node_samples_fn(struct sluice__strbuf *b, const char *name, const struct node_view *v);

#define NODE_VALUE(fn, expr)                                                                       \
    static const char *fn(const struct node_view *v, char *buf)                                    \
    {                                                                                              \
        return (expr);                                                                             \
    }
NODE_VALUE(in_flight, fmt_u64(buf, v->st.in_flight))
NODE_VALUE(limit, v->st.limit ? fmt_u64(buf, v->st.limit) : "+Inf")
NODE_VALUE(ceiling, fmt_u64(buf, v->st.ceiling))
NODE_VALUE(lock_expiry,
           fmt_u64(buf, (uint64_t)(v->st.lock_expires_s > 0 ? v->st.lock_expires_s : 0)))
NODE_VALUE(waiting, fmt_u64(buf, v->pc.queued))
NODE_VALUE(refused_late, fmt_u64(buf, v->pc.refused_late))
NODE_VALUE(timeouts, fmt_u64(buf, v->pc.timeouts))
NODE_VALUE(cancels, fmt_u64(buf, v->pc.cancels))
NODE_VALUE(overloads, fmt_u64(buf, v->pc.calls_overload))
NODE_VALUE(lingered, fmt_u64(buf, v->pc.lingered))
NODE_VALUE(lingering, fmt_u64(buf, v->pc.lingering))
NODE_VALUE(expected_service, fmt_seconds(buf, v->pc.expected_ns))
NODE_VALUE(expected_first_byte, fmt_seconds(buf, v->pc.expected_first_ns))
NODE_VALUE(default_start_deadline,
           fmt_seconds(buf, v->start_deadline_ms > 0 ? v->start_deadline_ms * 1000000 : 0))
#undef NODE_VALUE

static void requests_by_outcome(struct sluice__strbuf *b, const char *name,
                                const struct node_view *v)
{
    put_labelled(b, name, v->id, "outcome", "ok", v->pc.calls_ok);
    put_labelled(b, name, v->id, "outcome", "overload", v->pc.calls_overload);
    put_labelled(b, name, v->id, "outcome", "ignore", v->pc.calls_ignored);
    put_labelled(b, name, v->id, "outcome", "censored", v->pc.calls_censored);
}

static void refusals_by_reason(struct sluice__strbuf *b, const char *name,
                               const struct node_view *v)
{
    put_labelled(b, name, v->id, "reason", "capacity", v->pc.refused_capacity);
    put_labelled(b, name, v->id, "reason", "predicted_late", v->pc.refused_early);
}

static void queue_wait(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    put_histogram(b, name, v->id, &v->queue_wait);
}

static void call_duration(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    put_histogram(b, name, v->id, &v->call);
}

static void linger_one_hot(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    static const enum sluice_linger modes[] = {SLUICE_LINGER_LEARNED, SLUICE_LINGER_ON,
                                               SLUICE_LINGER_OFF};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++)
        put_labelled(b, name, v->id, "mode", sluice_linger_name(modes[m]),
                     v->pc.linger_now == modes[m]);
}

static void state_one_hot(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    static const enum sluice_discovery_state states[] = {
        SLUICE_DISCOVERY_PROBING, SLUICE_DISCOVERY_BACKOFF, SLUICE_DISCOVERY_LOCKED,
        SLUICE_DISCOVERY_FIXED};
    for (size_t s = 0; s < sizeof states / sizeof *states; s++)
        put_labelled(b, name, v->id, "state", sluice_discovery_state_name(states[s]),
                     v->st.state == states[s]);
}

/* Every congestion cause (0 or not), and any other cause once it happened. */
static void backoffs_by_cause(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    if (!v->adaptive)
        return;
    for (int c = 0; c < SLUICE_CAUSE_COUNT; c++)
        if (v->backoffs[c] || sluice_cause_is_congestion((enum sluice_cause)c))
            put_labelled(b, name, v->id, "cause", sluice_cause_name((enum sluice_cause)c),
                         v->backoffs[c]);
}

static void events_by_kind(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    if (!v->adaptive)
        return;
    for (int k = 0; k < SLUICE__ADMIN_N_KINDS; k++)
        put_labelled(b, name, v->id, "event", sluice_event_kind_name((enum sluice_event_kind)k),
                     v->events[k]);
}

static void events_dropped(struct sluice__strbuf *b, const char *name, const struct node_view *v)
{
    if (!v->adaptive)
        return;
    put_series(b, name, v->id);
    sluice__strbuf_printf(b, "} %" PRIu64 "\n", v->dropped);
}

/* ---- the table -------------------------------------------------------------------- */

struct family {
    const char *name, *type, *help;
    node_value_fn *value;     /* one sample per node, `name{node} value`; or */
    node_samples_fn *samples; /* a node's samples written by this */
};

static const struct family families[] = {
    {"sluice_inflight", "gauge", "Generation calls in flight.", in_flight, NULL},
    {"sluice_limit", "gauge", "Current concurrency limit (+Inf: unlimited).", limit, NULL},
    {"sluice_ceiling", "gauge", "Locked (discovered) ceiling; 0 when not locked.", ceiling, NULL},
    {"sluice_lock_expiry_timestamp_seconds", "gauge",
     "When the lock expires, Unix epoch seconds; 0 when not locked.", lock_expiry, NULL},
    {"sluice_waiting", "gauge", "Generation calls queued for a permit or a Retry-After hold.",
     waiting, NULL},
    {"sluice_requests_total", "counter",
     "Generation calls ended, by what they said about capacity.", NULL, requests_by_outcome},
    {"sluice_admissions_refused_total", "counter",
     "Runs refused at admission: capacity (active + waiting full) or predicted_late "
     "(the predicted wait passes the deadline or the start deadline).",
     NULL, refusals_by_reason},
    {"sluice_refused_late_total", "counter",
     "Calls not started: they could no longer start in time (left the line, or granted with "
     "too little left).",
     refused_late,
     NULL},
    {"sluice_timeouts_total", "counter",
     "Calls whose deadline passed while queued or, abandoned, mid-transfer.", timeouts, NULL},
    {"sluice_cancels_total", "counter",
     "Calls whose token fired while queued or, abandoned, mid-transfer.", cancels, NULL},
    {"sluice_overloads_total", "counter",
     "Calls the provider refused as over capacity (HTTP 429/503/529) or timed out.", overloads,
     NULL},
    {"sluice_lingered_total", "counter",
     "Abandoned calls that kept their permit while the provider still ran them.", lingered, NULL},
    {"sluice_lingering", "gauge",
     "Abandoned calls holding their permit now (counted in sluice_inflight).", lingering, NULL},
    {"sluice_linger_mode", "gauge",
     "What abandoned calls do with their permit now: 1 for the current mode (on: keep it, off: "
     "release it, learned: the trial has not decided yet).",
     NULL, linger_one_hot},
    {"sluice_expected_service_seconds", "gauge",
     "Expected service time: the low quantile of recent successful calls (0: unknown).",
     expected_service, NULL},
    {"sluice_expected_first_byte_seconds", "gauge",
     "Expected time to the answer's beginning (a stream's first token), the latency discovery "
     "hears: the low quantile of recent calls (0: unknown).",
     expected_first_byte, NULL},
    {"sluice_default_start_deadline_seconds", "gauge",
     "Start deadline of calls that name none, as the program sets it outside the pool "
     "(sluice-proxy: configured, or learned from its clients' hang-ups); 0: none.",
     default_start_deadline, NULL},
    {"sluice_queue_wait_seconds", "histogram",
     "Time calls waited for a permit (and any Retry-After hold).", NULL, queue_wait},
    {"sluice_call_seconds", "histogram",
     "Duration of calls that ended, start to end (abandoned ones excluded).", NULL, call_duration},
    {"sluice_state", "gauge", "Discovery state of the node: 1 for the current one.", NULL,
     state_one_hot},
    {"sluice_backoffs_total", "counter", "Backoff events by cause.", NULL, backoffs_by_cause},
    {"sluice_events_total", "counter", "Discovery events by kind.", NULL, events_by_kind},
    {"sluice_events_dropped_total", "counter",
     "Events the node's ring overwrote before the admin counted them.", NULL, events_dropped},
};

/* ---- snapshot, then text -------------------------------------------------------------- */

/* Every node's figures now (n_nodes entries, for free()), NULL when out of memory. */
static struct node_view *snapshot(struct sluice_admin *a)
{
    struct node_view *views = calloc(a->n_nodes ? a->n_nodes : 1, sizeof *views);
    if (!views)
        return NULL;
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct node_view *v = &views[i];
        struct sluice_pool *pool = sluice_engine_pool(a->engine, a->nodes[i].id);
        v->id = a->nodes[i].id;
        v->listed = sluice__admin_node_listed(a, i);
        v->adaptive = a->nodes[i].ring != NULL;
        sluice_engine_status(a->engine, v->id, &v->st);
        v->pc = sluice_pool_stats(pool);
        sluice_pool_histograms(pool, &v->queue_wait, &v->call);
        const char *source;
        v->start_deadline_ms = sluice__admin_start_deadline_ms(a, v->id, &source);
    }
    pthread_mutex_lock(&a->mutex);
    sluice__admin_count_events(a);
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct sluice__admin_node *n = &a->nodes[i];
        memcpy(views[i].backoffs, n->backoffs, sizeof n->backoffs);
        memcpy(views[i].events, n->events, sizeof n->events);
        views[i].dropped = n->dropped;
    }
    pthread_mutex_unlock(&a->mutex);
    return views;
}

char *sluice_admin_metrics(struct sluice_admin *a)
{
    if (!a)
        return NULL;
    struct node_view *views = snapshot(a);
    if (!views)
        return NULL;
    struct sluice__strbuf b = {0};
    char v[24];
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
        const struct family *fam = &families[f];
        sluice__strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", fam->name, fam->help, fam->name,
                              fam->type);
        for (size_t i = 0; i < a->n_nodes; i++) {
            if (!views[i].listed)
                continue;
            if (fam->samples) {
                fam->samples(&b, fam->name, &views[i]);
                continue;
            }
            put_series(&b, fam->name, views[i].id);
            sluice__strbuf_printf(&b, "} %s\n", fam->value(&views[i], v));
        }
    }
    free(views);
    char *own = a->cfg.metrics ? a->cfg.metrics(a->cfg.metrics_ctx) : NULL;
    if (own)
        sluice__strbuf_puts(&b, own);
    free(own);
    return sluice__strbuf_take(&b);
}
