/*
 * discovery_node.h — a discovery node on a hand-driven clock, for the unit
 * tests that drive sluice/discovery.h sample by sample in virtual time
 * (discovery.c, and the window and effects promises it keeps: window.c,
 * effects.c). Header-only and static inline, so each test file takes what
 * it uses.
 */
#ifndef SLUICE_TESTS_UNIT_DISCOVERY_NODE_H
#define SLUICE_TESTS_UNIT_DISCOVERY_NODE_H

#include <criterion/criterion.h>
#include <sluice/discovery.h>

#include <string.h>

struct fake_time {
    int64_t mono_ns, wall_ns;
};

static inline int64_t fake_mono(void *ctx)
{
    return ((struct fake_time *)ctx)->mono_ns;
}

static inline int64_t fake_wall(void *ctx)
{
    return ((struct fake_time *)ctx)->wall_ns;
}

struct node {
    struct fake_time time;
    struct sluice_clock mono, wall;
    struct sluice_gate gate;
    struct sluice_discovery *disc;
    struct sluice_event seen[64];
    int n_seen;
};

static inline void remember(void *ctx, const struct sluice_event *ev)
{
    struct node *n = (struct node *)ctx;
    if (n->n_seen < 64)
        n->seen[n->n_seen++] = *ev;
}

#define SEC SLUICE_NS_PER_SEC
#define MS SLUICE_NS_PER_MS

static inline struct sluice_discovery_desc node_desc(struct node *n, const char *id)
{
    struct sluice_discovery_desc d;
    memset(&d, 0, sizeof d);
    d.node_id = id;
    d.gate = &n->gate;
    d.clock = &n->mono;
    d.wall_clock = &n->wall;
    d.window_max_ns = 60 * SEC;
    d.on_event = remember;
    d.on_event_ctx = n;
    return d;
}

static inline void node_init(struct node *n)
{
    memset(n, 0, sizeof *n);
    n->time.mono_ns = 1000 * SEC;
    n->time.wall_ns = 1700000000 * SEC;
    n->mono.now_ns = fake_mono;
    n->mono.ctx = &n->time;
    n->wall.now_ns = fake_wall;
    n->wall.ctx = &n->time;
    sluice_gate_init(&n->gate, 1);
}

static inline void node_create(struct node *n, struct sluice_discovery_desc *d)
{
    char why[256] = "";
    struct sluice_discovery_desc told = *d;
    told.error = why;
    told.error_size = sizeof why;
    cr_assert_eq(sluice_discovery_create(&told, &n->disc), SLUICE_OK, "%s", why);
}

static inline void advance(struct node *n, int64_t ns)
{
    n->time.mono_ns += ns;
    n->time.wall_ns += ns;
}

static inline void feed(struct node *n, int64_t latency_ns, uint32_t in_flight,
                        enum sluice_outcome o, int64_t retry_after_ns)
{
    struct sluice_sample s = {latency_ns, in_flight, o, retry_after_ns, 0, 0};
    sluice_discovery_on_sample(n->disc, &s);
}

/* Node "cloud:x" with a fresh four-lock memstore; returns its description, store set. */
static inline struct sluice_discovery_desc node_with_memstore(struct node *n,
                                                              struct sluice_memstore **store,
                                                              struct sluice_store_ops *ops)
{
    node_init(n);
    cr_assert_eq(sluice_memstore_create(4, NULL, store), SLUICE_OK);
    *ops = sluice_memstore_ops(*store);
    struct sluice_discovery_desc d = node_desc(n, "cloud:x");
    d.store = ops;
    return d;
}

#endif
