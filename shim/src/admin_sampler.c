/*
 * admin_sampler.c — the admin's sampler thread. Once a second, under the
 * admin's mutex, it does four jobs, each its own function below, then
 * broadcasts `tick` (which wakes the event streams):
 *   cut_overdue     the request deadline: connections whose request has
 *                   not arrived within timeout_s are cut (admin_conns.c)
 *   count_events    the events of each node's ring since the last tick,
 *                   by kind and by backoff cause (GET /metrics)
 *   record_chart    each node's limit, in-flight count, ceiling and waiting
 *                   calls (the page's chart, GET /compute/concurrency/history)
 *   record_tallies  each node's counters, the base of the recent rates and
 *                   queue-wait percentiles (GET /compute/concurrency)
 * It only reads the engine through its public status calls.
 */
#include "admin_internal.h"

#include <errno.h>

struct sluice__admin_tally sluice__admin_take_tally(struct sluice_pool *pool,
                                                    const struct sluice_pool_counts *c,
                                                    int64_t wall_ms)
{
    struct sluice__admin_tally t = {.wall_ms = wall_ms,
                                    .requests = c->calls_ok + c->calls_overload + c->calls_ignored +
                                                c->calls_censored,
                                    .overloads = c->calls_overload,
                                    .timeouts = c->timeouts + c->refused_late};
    sluice_pool_histograms(pool, &t.queue_wait, NULL);
    return t;
}

void sluice__admin_count_events(struct sluice_admin *a)
{
    struct sluice_event batch[64];
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct sluice__admin_node *n = &a->nodes[i];
        if (!n->ring)
            continue;
        size_t got;
        while ((got = sluice_event_ring_read(n->ring, &n->cursor, batch, 64, &n->dropped)) > 0) {
            for (size_t k = 0; k < got; k++) {
                if ((unsigned)batch[k].kind < SLUICE__ADMIN_N_KINDS)
                    n->events[batch[k].kind]++;
                if (batch[k].kind == SLUICE_EVENT_BACKOFF &&
                    (unsigned)batch[k].cause < SLUICE_CAUSE_COUNT)
                    n->backoffs[batch[k].cause]++;
            }
        }
    }
}

/* One chart sample per node into its ring of history_s (call under a->mutex). */
static void record_chart(struct sluice_admin *a, int64_t now_ms)
{
    uint32_t cap = a->cfg.history_s;
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct sluice__admin_node *n = &a->nodes[i];
        struct sluice_discovery_status st;
        if (sluice_engine_status(a->engine, n->id, &st) != SLUICE_OK)
            continue;
        struct sluice_pool_counts c = sluice_pool_stats(sluice_engine_pool(a->engine, n->id));
        n->history[n->hist_head] =
            (struct sluice__admin_sample){now_ms, st.limit, st.in_flight, st.ceiling, c.queued};
        n->hist_head = (n->hist_head + 1) % cap;
        if (n->hist_len < cap)
            n->hist_len++;
    }
}

/* One tally per node into its ring of the last RECENT_S seconds (call under a->mutex). */
static void record_tallies(struct sluice_admin *a, int64_t now_ms)
{
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct sluice__admin_node *n = &a->nodes[i];
        struct sluice_pool *pool = sluice_engine_pool(a->engine, n->id);
        struct sluice_pool_counts c = sluice_pool_stats(pool);
        n->recent[n->recent_head] = sluice__admin_take_tally(pool, &c, now_ms);
        n->recent_head = (n->recent_head + 1) % (SLUICE__ADMIN_RECENT_S + 1);
        if (n->recent_len < SLUICE__ADMIN_RECENT_S + 1)
            n->recent_len++;
    }
}

void *sluice__admin_sampler_main(void *arg)
{
    struct sluice_admin *a = arg;
    pthread_mutex_lock(&a->mutex);
    while (!atomic_load(&a->stopping)) {
        sluice__admin_cut_overdue(a);
        sluice__admin_count_events(a);
        int64_t now_ms = sluice__admin_wall_ms();
        record_chart(a, now_ms);
        record_tallies(a, now_ms);
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
