/*
 * vector_sim.h — Vector's adaptive-concurrency scenarios in virtual time.
 *
 * Vector (vectordotdev/vector) tests its adaptive request concurrency with
 * scenario files (the .yaml files of tests/data/adaptive-concurrency/) run by
 * src/sinks/util/adaptive_concurrency/tests.rs on a paused clock. This
 * header is our own harness for the same facts, so sluice's policies and
 * the peers of bench/discovery_cases.c can be held to those files' ranges:
 *
 *   requests  a fixed number of one-event requests, all ready at once, or one
 *             every interval_s; the run ends when the last one is served
 *   server    each attempt raises its level (attempts in service) and joins
 *             its rate (attempts started in the last second, refused ones
 *             too); it takes delay·(1 + jitter·Exp(1) + scale(level) +
 *             scale(rate)), where scale(n) = (n−1)·scale + knee_exp^(n −
 *             knee_start) − 1 past a knee. Past a concurrency or rate limit
 *             it defers (an error after an unloaded delay) or drops (never
 *             answers; the attempt stops counting at once)
 *   client    Vector's stack: the concurrency controller, inside it retries
 *             with Fibonacci backoff (1, 1, 2, 3, 5 ... s, at most 30 s; with
 *             retry_jitter a uniform draw below each, Vector's JitterMode::Full),
 *             inside that a 1 s timeout. Vector's rate limit (9999/s) never
 *             binds and is left out
 *   placement VSIM_HOLD is Vector's: a permit is held across the retries and
 *             the controller sees one sample per request, after its last
 *             attempt, whose latency includes the backoffs. VSIM_ATTEMPT is
 *             sluice's pool and proxy: a permit per attempt, a sample per
 *             attempt (a deferral or timeout is an overload), the backoff
 *             waits without a permit
 *
 * The statistics are the files' (test_util/stats.rs): time-weighted
 * histograms of the server's level and rate and of the controller's
 * permits in use and limit; the observed RTT (served samples, weighted by
 * the time since the one before) and the averaged RTT (the mean observed
 * RTT over intervals of one past mean RTT, an EWMA with alpha 0.4: the
 * cadence Vector's controller measures at, applied to every controller,
 * so the statistic means the same for all).
 *
 * What differs from Vector's harness: no tokio scheduler, so events at the
 * same instant run in scheduling order; the controller's limit histogram
 * is weighted by time at every change, not sampled at ARC's updates.
 *
 * Everything random comes from one sim_rng: a run is a pure function of its
 * parameters and seed. Header-only and static, as provider_sim.h.
 */
#ifndef SLUICE_VECTOR_SIM_H
#define SLUICE_VECTOR_SIM_H

#include "provider_sim.h"

/* ---- parameters ------------------------------------------------------------ */

/* What the server does with a level (tests.rs LimitParams). */
struct vsim_limit {
    double scale;        /* delay added per unit of level above 1, as a share of delay */
    uint32_t knee_start; /* 0 = no knee; past it, knee_exp^(level − knee_start) − 1 more */
    double knee_exp;     /* 0 = scale + 1 */
    uint32_t limit;      /* 0 = none; past it the attempt is deferred or dropped */
    bool drop;           /* past the limit: never answer (else an error after the delay) */
};

enum vsim_placement { VSIM_HOLD, VSIM_ATTEMPT };

/* The longest a server delay may be: far past any timeout, inside int64 ns. */
#define VSIM_DELAY_MAX_S 1e6

struct vsim_params {
    uint32_t requests;
    double interval_s;        /* between requests becoming ready (0 = all at once) */
    double delay_s;           /* the unloaded delay */
    double jitter;            /* mean extra delay, as a share of delay (exponential) */
    struct vsim_limit conc;   /* by the server's level */
    struct vsim_limit rate;   /* by the attempts started in the last second */
    uint32_t fixed;           /* a fixed concurrency (no controller); 0 = adaptive */
    enum vsim_placement placement;
    bool retry_jitter;        /* full jitter on the backoff (JitterMode::Full) */
    double timeout_s;         /* per attempt (0 = 1 s) */
};

/* ---- statistics ------------------------------------------------------------- */

/* The statistics a scenario file names, and which of their figures. */
enum vsim_stat { VSIM_IN_FLIGHT, VSIM_RATE, VSIM_CTL_IN_FLIGHT, VSIM_CTL_LIMIT, VSIM_OBSERVED_RTT,
                 VSIM_AVERAGED_RTT, VSIM_N_STATS };
enum vsim_figure { VSIM_MIN, VSIM_MAX, VSIM_MEAN, VSIM_MODE };

/* A histogram over levels 0.., each weighted by the time spent there. */
struct vsim_hist {
    double w[1100];
    int64_t last; /* the time of the last add (-1 = none: the time before it is ignored) */
};

/* A weighted mean with its extremes (test_util's TimeWeightedSum). */
struct vsim_wsum {
    double total, weights, min, max;
    bool any;
    int64_t last;
};

static inline void vsim_hist_add(struct vsim_hist *h, uint32_t level, int64_t now)
{
    if (level >= sizeof h->w / sizeof h->w[0])
        level = sizeof h->w / sizeof h->w[0] - 1;
    if (h->last >= 0)
        h->w[level] += (double)(now - h->last) / SIM_NS;
    h->last = now;
}

static inline void vsim_wsum_add(struct vsim_wsum *s, double value, int64_t now)
{
    if (s->last >= 0) {
        double w = (double)(now - s->last) / SIM_NS;
        s->total += value * w;
        s->weights += w;
        s->min = s->any && s->min < value ? s->min : value;
        s->max = s->any && s->max > value ? s->max : value;
        s->any = true;
    }
    s->last = now;
}

/* A figure of a histogram as stats.rs computes it (mode: the highest bucket,
 * the later one on a tie); NAN when it saw nothing. */
static inline double vsim_hist_figure(const struct vsim_hist *h, enum vsim_figure f)
{
    size_t n = sizeof h->w / sizeof h->w[0], min = n, max = 0, mode = 0;
    double sum = 0, weights = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        if (h->w[i] > 0) {
            min = min < n ? min : i;
            max = i;
            if (h->w[i] >= best) {
                best = h->w[i];
                mode = i;
            }
        }
        sum += (double)i * h->w[i];
        weights += h->w[i];
    }
    if (min == n)
        return NAN;
    switch (f) {
    case VSIM_MIN:
        return (double)min;
    case VSIM_MAX:
        return (double)max;
    case VSIM_MODE:
        return (double)mode;
    default:
        return sum / weights;
    }
}

static inline double vsim_wsum_figure(const struct vsim_wsum *s, enum vsim_figure f)
{
    if (!s->any || s->weights <= 0)
        return NAN;
    return f == VSIM_MIN ? s->min : f == VSIM_MAX ? s->max : s->total / s->weights;
}

/* One expectation of a scenario file: a figure of a statistic in [lo, hi]. */
struct vsim_expect {
    enum vsim_stat stat;
    enum vsim_figure figure;
    double lo, hi;
};

/* ---- the run ---------------------------------------------------------------- */

enum { VSIM_EV_READY, VSIM_EV_ATTEMPT, VSIM_EV_ANSWER, VSIM_EV_TIMEOUT, VSIM_EV_RETRY };

struct vsim;

struct vsim_req {
    struct sluice_gate_waiter waiter;
    struct vsim *sim;
    uint64_t gen;          /* attempt number: stale events carry an older one */
    int64_t t_permit;      /* when its permit was granted (VSIM_HOLD: the sample's start) */
    int64_t t_attempt;     /* when the running attempt started */
    uint32_t in_flight_at_start, limit_at_start;
    uint32_t retries;      /* attempts refused so far: the backoff's step */
    double backoff_prev, backoff_cur;
    bool holding, ok, done;
};

struct vsim {
    struct vsim_params p;
    struct sim_rng rng;
    struct sim_events ev;
    int64_t now;
    struct sluice_gate gate;
    struct sluice_clock clock, wall;
    struct sim_controller ctl;
    struct vsim_req *reqs;
    uint32_t held;           /* permits in use */
    uint32_t level;          /* attempts in service at the server */
    int64_t *starts;         /* the server's attempt starts in the last second (a ring) */
    uint32_t starts_head, starts_len, starts_cap;
    uint32_t completed;
    bool finished;
    int64_t end_ns;
    uint32_t last_limit;
    /* the statistics */
    struct vsim_hist in_flight, rate, ctl_in_flight, ctl_limit;
    struct vsim_wsum observed, averaged;
    double cur_sum, past_mean; /* the averaged RTT's interval (mean of served RTTs) */
    uint32_t cur_n;
    bool past_set;
    int64_t next_avg_ns;
    uint64_t attempts, refused;
};

static inline int64_t vsim__now(void *ctx)
{
    return ((struct vsim *)ctx)->now;
}

static inline int64_t vsim__wall(void *ctx)
{
    return (int64_t)(1.7e9 * SIM_NS) + ((struct vsim *)ctx)->now;
}

static inline uint32_t vsim__id(struct vsim *s, struct vsim_req *r)
{
    return (uint32_t)(r - s->reqs);
}

/* tests.rs LimitParams::scale. */
static inline double vsim_scale(const struct vsim_limit *l, uint32_t level)
{
    double knee = 0;
    if (l->knee_start) {
        double e = l->knee_exp > 0 ? l->knee_exp : l->scale + 1.0;
        knee = pow(e, level > l->knee_start ? (double)(level - l->knee_start) : 0.0) - 1.0;
    }
    return ((double)level - 1.0) * l->scale + knee;
}

static inline double vsim__delay(struct vsim *s, uint32_t level, uint32_t rate)
{
    double extra = sim_exponential(&s->rng, 1.0) * s->p.jitter;
    double d = s->p.delay_s * (extra + 1.0 + vsim_scale(&s->p.conc, level) +
                               vsim_scale(&s->p.rate, rate));
    return d < VSIM_DELAY_MAX_S ? d : VSIM_DELAY_MAX_S; /* a knee's power overflows past ~7000 */
}

/* The limit the gate has now, into the controller's histogram when it moved. */
static inline void vsim__track_limit(struct vsim *s)
{
    uint32_t limit = sluice_gate_limit(&s->gate);
    if (limit != s->last_limit) {
        vsim_hist_add(&s->ctl_limit, s->last_limit, s->now);
        s->last_limit = limit;
    }
}

/* The server's rate: attempts started in the last second (pruned first). */
static inline uint32_t vsim__rate(struct vsim *s)
{
    while (s->starts_len && s->starts[s->starts_head] <= s->now - (int64_t)SIM_NS) {
        s->starts_head = (s->starts_head + 1) % s->starts_cap;
        s->starts_len--;
    }
    return s->starts_len;
}

static inline void vsim__server_end(struct vsim *s, bool served)
{
    vsim_hist_add(&s->rate, vsim__rate(s), s->now);
    vsim_hist_add(&s->in_flight, s->level, s->now);
    s->level--;
    if (served && ++s->completed >= s->p.requests && !s->finished) {
        s->finished = true;
        s->end_ns = s->now;
    }
}

static inline void vsim__sample(struct vsim *s, struct vsim_req *r, int64_t start, bool ok)
{
    struct sluice_sample sample;
    memset(&sample, 0, sizeof sample);
    sample.latency_ns = s->now - start;
    sample.in_flight_at_start = r->in_flight_at_start;
    sample.limit_at_start = r->limit_at_start;
    sample.start_ns = start;
    sample.outcome = ok ? SLUICE_OUTCOME_OK : SLUICE_OUTCOME_OVERLOAD;
    if (ok) {
        double rtt = (double)sample.latency_ns / SIM_NS;
        vsim_wsum_add(&s->observed, rtt, s->now);
        s->cur_sum += rtt;
        s->cur_n++;
    }
    /* The averaged RTT, at the cadence of Vector's controller (one past mean RTT). */
    double cur = s->cur_n ? round(s->cur_sum / s->cur_n * 1e6) / 1e6 : -1;
    if (!s->past_set) {
        if (cur >= 0) {
            s->past_mean = cur;
            s->past_set = true;
            s->next_avg_ns = s->now + sim__ns(cur);
        }
    } else if (s->now >= s->next_avg_ns) {
        if (cur >= 0) {
            vsim_wsum_add(&s->averaged, cur, s->now);
            s->past_mean += 0.4 * (cur - s->past_mean);
        }
        s->next_avg_ns = s->now + sim__ns(s->past_mean);
        s->cur_sum = 0;
        s->cur_n = 0;
    }
    if (s->ctl.on_sample)
        s->ctl.on_sample(s->ctl.ctx, &sample, s->now);
}

static inline void vsim__release(struct vsim *s, struct vsim_req *r)
{
    vsim_hist_add(&s->ctl_in_flight, s->held, s->now);
    s->held--;
    r->holding = false;
    sluice_gate_release(&s->gate);
    vsim__track_limit(s);
}

static inline void vsim__on_grant(struct sluice_gate_waiter *w, int status)
{
    struct vsim_req *r = (struct vsim_req *)w->data;
    struct vsim *s = r->sim;
    if (status != SLUICE_OK)
        return;
    vsim_hist_add(&s->ctl_in_flight, s->held, s->now);
    s->held++;
    r->holding = true;
    r->t_permit = s->now;
    r->in_flight_at_start = s->held;
    r->limit_at_start = sluice_gate_limit(&s->gate);
    /* Possibly inside a release: attempt from the event loop. */
    sim_events_push(&s->ev, s->now, VSIM_EV_ATTEMPT, vsim__id(s, r), r->gen);
}

static inline void vsim__acquire(struct vsim *s, struct vsim_req *r)
{
    int64_t hold = s->ctl.hold_until ? s->ctl.hold_until(s->ctl.ctx) : 0;
    if (hold > s->now) {
        sim_events_push(&s->ev, hold, VSIM_EV_READY, vsim__id(s, r), r->gen);
        return;
    }
    r->waiter.cb = vsim__on_grant;
    r->waiter.data = r;
    sluice_gate_acquire_async(&s->gate, &r->waiter);
}

/* An attempt reaches the server (no network: the delay is the server's). */
static inline void vsim__attempt(struct vsim *s, struct vsim_req *r)
{
    uint32_t id = vsim__id(s, r);
    r->gen++;
    r->t_attempt = s->now;
    s->attempts++;
    s->starts[(s->starts_head + s->starts_len++) % s->starts_cap] = s->now;
    uint32_t rate = vsim__rate(s);
    vsim_hist_add(&s->rate, rate, s->now);
    vsim_hist_add(&s->in_flight, s->level, s->now);
    s->level++;
    const struct vsim_limit *past = s->p.conc.limit && s->level > s->p.conc.limit ? &s->p.conc
                                    : s->p.rate.limit && rate > s->p.rate.limit   ? &s->p.rate
                                                                                  : NULL;
    double timeout = s->p.timeout_s > 0 ? s->p.timeout_s : 1.0;
    sim_events_push(&s->ev, s->now + sim__ns(timeout), VSIM_EV_TIMEOUT, id, r->gen);
    if (past && past->drop) {
        vsim__server_end(s, false);
        return;
    }
    r->ok = !past;
    double delay = past ? vsim__delay(s, 1, 1) : vsim__delay(s, s->level, rate);
    sim_events_push(&s->ev, s->now + sim__ns(delay), VSIM_EV_ANSWER, id, r->gen);
}

/* Fibonacci backoff (Vector's FibonacciRetryPolicy): 1, 1, 2, 3, 5 ... s, at most 30 s. */
static inline double vsim__backoff(struct vsim *s, struct vsim_req *r)
{
    double now = r->retries ? r->backoff_cur : 1.0;
    if (!r->retries) {
        r->backoff_prev = 0;
        r->backoff_cur = 1.0;
    }
    double next = r->backoff_prev + r->backoff_cur;
    r->backoff_prev = r->backoff_cur;
    r->backoff_cur = next < 30.0 ? next : 30.0;
    r->retries++;
    return s->p.retry_jitter ? now * sim_uniform(&s->rng) : now;
}

/* The attempt ended: served (ok), or deferred or timed out. */
static inline void vsim__attempt_end(struct vsim *s, struct vsim_req *r, bool ok)
{
    r->gen++; /* the other of answer and timeout is stale now */
    if (!ok)
        s->refused++;
    if (s->p.placement == VSIM_ATTEMPT || ok) {
        vsim__sample(s, r, s->p.placement == VSIM_ATTEMPT ? r->t_attempt : r->t_permit, ok);
        vsim__release(s, r);
    }
    if (ok) {
        r->done = true;
        return;
    }
    double backoff = vsim__backoff(s, r);
    sim_events_push(&s->ev, s->now + sim__ns(backoff),
                    s->p.placement == VSIM_ATTEMPT ? VSIM_EV_READY : VSIM_EV_RETRY, vsim__id(s, r),
                    r->gen);
}

static inline void vsim__dispatch(struct vsim *s, const struct sim_event *e)
{
    struct vsim_req *r = &s->reqs[e->req];
    if (e->gen != r->gen)
        return;
    switch (e->type) {
    case VSIM_EV_READY:
        vsim__acquire(s, r);
        break;
    case VSIM_EV_ATTEMPT:
    case VSIM_EV_RETRY:
        if (r->holding)
            vsim__attempt(s, r);
        break;
    case VSIM_EV_ANSWER:
        vsim__server_end(s, r->ok);
        vsim__attempt_end(s, r, r->ok);
        break;
    case VSIM_EV_TIMEOUT: /* the server may still be working on it */
        vsim__attempt_end(s, r, false);
        break;
    }
    vsim__track_limit(s);
}

static inline struct vsim *vsim_create(const struct vsim_params *p, uint64_t seed,
                                       uint32_t start_limit)
{
    struct vsim *s = (struct vsim *)calloc(1, sizeof *s);
    s->p = *p;
    sim_rng_seed(&s->rng, seed);
    s->last_limit = p->fixed ? p->fixed : start_limit;
    sluice_gate_init(&s->gate, s->last_limit);
    s->clock.now_ns = vsim__now;
    s->clock.ctx = s;
    s->wall.now_ns = vsim__wall;
    s->wall.ctx = s;
    s->reqs = (struct vsim_req *)calloc(p->requests, sizeof *s->reqs);
    s->starts_cap = 4 * p->requests + 16;
    s->starts = (int64_t *)calloc(s->starts_cap, sizeof *s->starts);
    s->in_flight.last = s->rate.last = s->ctl_in_flight.last = s->observed.last = -1;
    s->averaged.last = -1;
    s->ctl_limit.last = 0;
    for (uint32_t i = 0; i < p->requests; i++) {
        s->reqs[i].sim = s;
        sim_events_push(&s->ev, sim__ns(p->interval_s * i), VSIM_EV_READY, i, 0);
    }
    return s;
}

/* Run until the last request is served (or max_s virtual seconds). */
static inline void vsim_run(struct vsim *s, double max_s)
{
    int64_t end = sim__ns(max_s);
    while (!s->finished && s->ev.n && s->ev.heap[0].t <= end) {
        struct sim_event e = sim_events_pop(&s->ev);
        s->now = e.t;
        vsim__dispatch(s, &e);
    }
    if (!s->finished)
        s->end_ns = s->now;
    vsim_hist_add(&s->ctl_limit, s->last_limit, s->end_ns);
}

static inline void vsim_destroy(struct vsim *s)
{
    if (!s)
        return;
    free(s->ev.heap);
    free(s->reqs);
    free(s->starts);
    free(s);
}

/* The figure an expectation names, from a finished run. */
static inline double vsim_figure(const struct vsim *s, enum vsim_stat stat, enum vsim_figure f)
{
    switch (stat) {
    case VSIM_IN_FLIGHT:
        return vsim_hist_figure(&s->in_flight, f);
    case VSIM_RATE:
        return vsim_hist_figure(&s->rate, f);
    case VSIM_CTL_IN_FLIGHT:
        return vsim_hist_figure(&s->ctl_in_flight, f);
    case VSIM_CTL_LIMIT:
        return vsim_hist_figure(&s->ctl_limit, f);
    case VSIM_OBSERVED_RTT:
        return vsim_wsum_figure(&s->observed, f);
    default:
        return vsim_wsum_figure(&s->averaged, f);
    }
}

/* Whether a figure meets its range as tests.rs compares: min, max and mode
 * are whole levels against the range's bounds truncated (usize), the
 * rest are compared as they are. NAN (never seen) misses. */
static inline bool vsim_met(const struct vsim_expect *x, double value)
{
    if (isnan(value))
        return false;
    bool whole = x->figure != VSIM_MEAN &&
                 (x->stat != VSIM_OBSERVED_RTT && x->stat != VSIM_AVERAGED_RTT);
    if (whole)
        return value >= floor(x->lo) && value <= floor(x->hi);
    return value >= x->lo && value <= x->hi;
}

static inline const char *vsim_stat_name(enum vsim_stat s)
{
    static const char *const n[] = {"stats in_flight",       "stats rate",
                                    "controller in_flight",  "controller concurrency_limit",
                                    "controller observed_rtt", "controller averaged_rtt"};
    return (unsigned)s < VSIM_N_STATS ? n[s] : "?";
}

static inline const char *vsim_figure_name(enum vsim_figure f)
{
    static const char *const n[] = {"min", "max", "mean", "mode"};
    return n[f];
}

/* ---- the scenarios (tests/data/adaptive-concurrency/ in Vector) ------------- */

#define VSIM_MAX_EXPECT 20

struct vsim_scenario {
    const char *name;
    struct vsim_params params;
    bool fair;          /* a fair target: its ranges say what any good controller does */
    const char *why;    /* why not, where it is not */
    struct vsim_expect expect[VSIM_MAX_EXPECT];
};

#define VX(stat, fig, lo, hi) {VSIM_##stat, VSIM_##fig, lo, hi}

static const struct vsim_scenario vsim_scenarios[] = {
    {"constant-link", {.requests = 500, .delay_s = 0.1}, false,
     "demand never stops and latency never moves: the ranges are ARC's own +1 per RTT ramp "
     "over 500 calls (a controller that finds no limit faster fails them)",
     {VX(IN_FLIGHT, MAX, 30, 31), VX(IN_FLIGHT, MEAN, 15.0, 16.0), VX(CTL_IN_FLIGHT, MAX, 30, 31),
      VX(CTL_IN_FLIGHT, MEAN, 15.0, 16.0), VX(CTL_LIMIT, MAX, 22, 32), VX(CTL_LIMIT, MEAN, 16.0, 18.0),
      VX(OBSERVED_RTT, MIN, 0.100, 0.102), VX(OBSERVED_RTT, MAX, 0.100, 0.102),
      VX(OBSERVED_RTT, MEAN, 0.100, 0.102), VX(AVERAGED_RTT, MIN, 0.100, 0.102),
      VX(AVERAGED_RTT, MAX, 0.100, 0.102), VX(AVERAGED_RTT, MEAN, 0.100, 0.102)}},
    {"defers-at-high-concurrency",
     {.requests = 500, .delay_s = 0.1, .conc = {.limit = 5}}, true, NULL,
     {VX(IN_FLIGHT, MAX, 5, 18), VX(IN_FLIGHT, MODE, 0, 6), VX(IN_FLIGHT, MEAN, 2.2, 5.0),
      VX(RATE, MAX, 52, 63), VX(RATE, MEAN, 20, 44), VX(CTL_IN_FLIGHT, MAX, 5, 41),
      VX(CTL_IN_FLIGHT, MODE, 4, 29), VX(CTL_IN_FLIGHT, MEAN, 3.5, 26), VX(CTL_LIMIT, MAX, 6, 41),
      VX(CTL_LIMIT, MODE, 2, 29), VX(CTL_LIMIT, MEAN, 4.0, 29), VX(OBSERVED_RTT, MIN, 0.100, 0.102),
      VX(OBSERVED_RTT, MAX, 0.100, 19.7), VX(OBSERVED_RTT, MEAN, 0.100, 5.7),
      VX(AVERAGED_RTT, MIN, 0.100, 0.102), VX(AVERAGED_RTT, MAX, 0.100, 9.0),
      VX(AVERAGED_RTT, MEAN, 0.100, 3.2)}},
    {"defers-at-high-rate", {.requests = 1000, .delay_s = 0.1, .rate = {.limit = 100}}, true, NULL,
     {VX(IN_FLIGHT, MAX, 16, 24), VX(IN_FLIGHT, MEAN, 6.0, 9.0), VX(RATE, MAX, 90, 123),
      VX(RATE, MEAN, 31, 75), VX(CTL_IN_FLIGHT, MAX, 16, 24), VX(CTL_IN_FLIGHT, MEAN, 8.0, 19.0),
      VX(CTL_LIMIT, MAX, 16, 24), VX(CTL_LIMIT, MEAN, 8.0, 18.5),
      VX(OBSERVED_RTT, MIN, 0.100, 0.102), VX(OBSERVED_RTT, MAX, 0.100, 1.203),
      VX(OBSERVED_RTT, MEAN, 0.100, 0.85), VX(AVERAGED_RTT, MIN, 0.100, 0.102),
      VX(AVERAGED_RTT, MAX, 0.100, 1.203), VX(AVERAGED_RTT, MEAN, 0.100, 0.30)}},
    {"drops-at-high-concurrency",
     {.requests = 500, .delay_s = 0.1, .conc = {.limit = 5, .drop = true}}, true, NULL,
     {VX(IN_FLIGHT, MAX, 4, 5), VX(IN_FLIGHT, MEAN, 3.0, 4.0), VX(IN_FLIGHT, MODE, 3, 5),
      VX(RATE, MAX, 55, 90), VX(RATE, MEAN, 31, 54), VX(CTL_IN_FLIGHT, MAX, 13, 85),
      VX(CTL_IN_FLIGHT, MEAN, 7.0, 41), VX(CTL_IN_FLIGHT, MODE, 1, 11), VX(CTL_LIMIT, MAX, 10, 86),
      VX(CTL_LIMIT, MEAN, 7.0, 52), VX(CTL_LIMIT, MODE, 4, 77), VX(OBSERVED_RTT, MIN, 0.100, 0.102),
      VX(OBSERVED_RTT, MAX, 0.100, 11.2), VX(OBSERVED_RTT, MEAN, 0.100, 2.4),
      VX(AVERAGED_RTT, MIN, 0.100, 0.102), VX(AVERAGED_RTT, MAX, 0.100, 7.0),
      VX(AVERAGED_RTT, MEAN, 0.100, 2.0)}},
    {"jittery-link-small", {.requests = 1000, .delay_s = 0.1, .jitter = 0.1}, false,
     "no limit at all: the ranges bound how far ARC's ramp gets in 1000 calls",
     {VX(IN_FLIGHT, MAX, 20, 40), VX(IN_FLIGHT, MEAN, 8.0, 20.0), VX(RATE, MAX, 165, 350),
      VX(RATE, MEAN, 70, 150), VX(CTL_IN_FLIGHT, MAX, 20, 40), VX(CTL_IN_FLIGHT, MEAN, 8.0, 20.0),
      VX(CTL_LIMIT, MAX, 20, 40), VX(CTL_LIMIT, MEAN, 9.0, 20.0),
      VX(OBSERVED_RTT, MEAN, 0.100, 0.130), VX(AVERAGED_RTT, MEAN, 0.100, 0.130)}},
    {"medium-send", {.requests = 500, .interval_s = 0.025, .delay_s = 0.1}, false,
     "demand (4 in flight) never fills the limit; the limit's max of 9 is ARC's start at 1 "
     "plus its ramp",
     {VX(IN_FLIGHT, MAX, 8, 8), VX(IN_FLIGHT, MODE, 4, 5), VX(IN_FLIGHT, MEAN, 4.0, 4.5),
      VX(CTL_IN_FLIGHT, MAX, 8, 8), VX(CTL_IN_FLIGHT, MODE, 4, 5), VX(CTL_IN_FLIGHT, MEAN, 4.0, 4.5),
      VX(CTL_LIMIT, MAX, 9, 9), VX(OBSERVED_RTT, MIN, 0.100, 0.102),
      VX(OBSERVED_RTT, MAX, 0.100, 0.102), VX(AVERAGED_RTT, MIN, 0.100, 0.102),
      VX(AVERAGED_RTT, MAX, 0.100, 0.102)}},
    {"shallow-knee",
     {.requests = 1000, .delay_s = 0.1, .conc = {.knee_start = 10, .knee_exp = 1.1}}, true, NULL,
     {VX(IN_FLIGHT, MAX, 12, 12), VX(IN_FLIGHT, MEAN, 9, 11), VX(IN_FLIGHT, MODE, 9, 12),
      VX(RATE, MAX, 103, 108), VX(RATE, MEAN, 87, 89), VX(CTL_LIMIT, MAX, 12, 12),
      VX(CTL_LIMIT, MEAN, 10, 12), VX(CTL_LIMIT, MODE, 9, 12), VX(CTL_IN_FLIGHT, MAX, 12, 12),
      VX(CTL_IN_FLIGHT, MEAN, 9, 11), VX(CTL_IN_FLIGHT, MODE, 9, 12),
      VX(OBSERVED_RTT, MIN, 0.100, 0.102), VX(OBSERVED_RTT, MAX, 0.100, 0.123),
      VX(OBSERVED_RTT, MEAN, 0.106, 0.120), VX(AVERAGED_RTT, MIN, 0.100, 0.102),
      VX(AVERAGED_RTT, MAX, 0.100, 0.123), VX(AVERAGED_RTT, MEAN, 0.106, 0.120)}},
    {"slow-link", {.requests = 200, .delay_s = 0.1, .conc = {.scale = 1.0}}, true, NULL,
     {VX(IN_FLIGHT, MAX, 2, 7), VX(IN_FLIGHT, MODE, 2, 5), VX(IN_FLIGHT, MEAN, 1.5, 5.0),
      VX(CTL_IN_FLIGHT, MAX, 2, 7), VX(CTL_IN_FLIGHT, MODE, 2, 5), VX(CTL_IN_FLIGHT, MEAN, 1.5, 5.0),
      VX(CTL_LIMIT, MODE, 2, 5), VX(CTL_LIMIT, MEAN, 1.7, 5.0), VX(OBSERVED_RTT, MIN, 0.100, 0.102),
      VX(OBSERVED_RTT, MEAN, 0.100, 0.450), VX(AVERAGED_RTT, MIN, 0.100, 0.102),
      VX(AVERAGED_RTT, MEAN, 0.100, 0.450)}},
    {"slow-send-1", {.requests = 100, .interval_s = 0.1, .delay_s = 0.05}, false,
     "one call in flight at a time: the limit's mode [1, 2] only says ARC starts at 1 and "
     "never grows without saturation",
     {VX(IN_FLIGHT, MAX, 1, 1), VX(IN_FLIGHT, MODE, 1, 1), VX(IN_FLIGHT, MEAN, 0.5, 0.55),
      VX(CTL_IN_FLIGHT, MAX, 1, 1), VX(CTL_IN_FLIGHT, MODE, 1, 1), VX(CTL_IN_FLIGHT, MEAN, 0.5, 0.55),
      VX(CTL_LIMIT, MODE, 1, 2), VX(CTL_LIMIT, MEAN, 1.0, 2.0), VX(OBSERVED_RTT, MIN, 0.050, 0.052),
      VX(OBSERVED_RTT, MEAN, 0.050, 0.052), VX(AVERAGED_RTT, MIN, 0.050, 0.052),
      VX(AVERAGED_RTT, MEAN, 0.050, 0.052)}},
    {"slow-send-2", {.requests = 100, .interval_s = 0.05, .delay_s = 0.05}, false,
     "about one call in flight: the limit's [2, 3] is ARC's start at 1 plus a step or two",
     {VX(IN_FLIGHT, MAX, 1, 2), VX(IN_FLIGHT, MODE, 1, 1), VX(IN_FLIGHT, MEAN, 1.0, 1.2),
      VX(CTL_IN_FLIGHT, MAX, 2, 3), VX(CTL_IN_FLIGHT, MODE, 1, 1), VX(CTL_IN_FLIGHT, MEAN, 1.0, 2.0),
      VX(CTL_LIMIT, MODE, 2, 3), VX(CTL_LIMIT, MEAN, 2.0, 2.5), VX(OBSERVED_RTT, MIN, 0.050, 0.052),
      VX(OBSERVED_RTT, MEAN, 0.050, 0.052), VX(AVERAGED_RTT, MIN, 0.050, 0.052),
      VX(AVERAGED_RTT, MEAN, 0.050, 0.052)}},
    /* A fixed concurrency of 10: no controller, so these check the harness itself. */
    {"fixed-concurrency-simple", {.requests = 500, .delay_s = 0.1, .fixed = 10}, false,
     "a fixed limit: checks the harness, not a controller",
     {VX(IN_FLIGHT, MAX, 10, 10), VX(IN_FLIGHT, MODE, 10, 10), VX(IN_FLIGHT, MEAN, 8.0, 10.0),
      VX(RATE, MAX, 90, 90), VX(RATE, MEAN, 80, 85), VX(CTL_IN_FLIGHT, MAX, 10, 10),
      VX(CTL_IN_FLIGHT, MODE, 10, 10), VX(CTL_IN_FLIGHT, MEAN, 8.0, 10.0), VX(CTL_LIMIT, MIN, 10, 10),
      VX(CTL_LIMIT, MAX, 10, 10), VX(CTL_LIMIT, MODE, 10, 10)}},
    {"fixed-concurrency-jitter", {.requests = 500, .delay_s = 0.1, .jitter = 0.5, .fixed = 10},
     false, "a fixed limit: checks the harness, not a controller",
     {VX(IN_FLIGHT, MAX, 10, 10), VX(IN_FLIGHT, MODE, 10, 10), VX(IN_FLIGHT, MEAN, 8.0, 10.0),
      VX(RATE, MAX, 65, 84), VX(RATE, MEAN, 55, 66), VX(CTL_IN_FLIGHT, MAX, 10, 10),
      VX(CTL_IN_FLIGHT, MODE, 10, 10), VX(CTL_IN_FLIGHT, MEAN, 8.0, 10.0), VX(CTL_LIMIT, MIN, 10, 10),
      VX(CTL_LIMIT, MAX, 10, 10), VX(CTL_LIMIT, MODE, 10, 10)}},
};
#define VSIM_N_SCENARIOS (sizeof vsim_scenarios / sizeof vsim_scenarios[0])

/* Expectations a scenario lists (the table ends at the first zeroed one). */
static inline int vsim_n_expect(const struct vsim_scenario *sc)
{
    int n = 0;
    while (n < VSIM_MAX_EXPECT && (sc->expect[n].lo != 0 || sc->expect[n].hi != 0))
        n++;
    return n;
}

/* How many of a scenario's expectations a finished run meets; `log` (may be
 * NULL) gets a line per miss. */
static inline int vsim_score(const struct vsim_scenario *sc, const struct vsim *s, FILE *log)
{
    int met = 0, n = vsim_n_expect(sc);
    for (int i = 0; i < n; i++) {
        const struct vsim_expect *x = &sc->expect[i];
        double v = vsim_figure(s, x->stat, x->figure);
        if (vsim_met(x, v))
            met++;
        else if (log)
            fprintf(log, "  %s: %s %s = %.4g, not in [%g, %g]\n", sc->name, vsim_stat_name(x->stat),
                    vsim_figure_name(x->figure), v, x->lo, x->hi);
    }
    return met;
}

/* ---- discovery over a vsim ----------------------------------------------------- */

static inline void vsim__discovery_sample(void *ctx, const struct sluice_sample *sample,
                                          int64_t now)
{
    (void)now;
    sluice_discovery_on_sample((struct sluice_discovery *)ctx, sample);
}

static inline int64_t vsim__discovery_hold(void *ctx)
{
    return sluice_discovery_hold_until((struct sluice_discovery *)ctx);
}

/* Create a discovery over this run's gate and clocks from `desc` and let it
 * drive the limit; NULL (and why, on stderr) on a bad description. */
static inline struct sluice_discovery *vsim_discovery(struct vsim *s,
                                                      struct sluice_discovery_desc *desc)
{
    desc->gate = &s->gate;
    desc->clock = &s->clock;
    desc->wall_clock = &s->wall;
    struct sluice_discovery *d = sim__discovery_create("vsim_discovery", desc);
    if (!d)
        return NULL;
    struct sim_controller c = {d, vsim__discovery_sample, vsim__discovery_hold, NULL};
    s->ctl = c;
    s->last_limit = sluice_gate_limit(&s->gate);
    return d;
}

#endif /* SLUICE_VECTOR_SIM_H */
