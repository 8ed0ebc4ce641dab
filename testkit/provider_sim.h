/*
 * provider_sim.h — a deterministic, virtual-time simulation of callers, a
 * real sluice gate and a remote model provider with a hidden concurrency cap.
 *
 * Used by the tests in tests/sim/ and by the bench's discovery cases (through
 * `#include "provider_sim.h"`, testkit/ being on both include paths).
 * Everything is header-only and static so each user compiles its own copy.
 *
 * Model:
 *   callers    closed loop (N workers issuing back to back, optional think
 *              time), or open-loop bursty arrivals (Poisson bursts of
 *              geometric size). A caller whose call is refused retries after
 *              the provider's Retry-After, or after `retry_s`.
 *   sluice     a real struct sluice_gate (FIFO, async waiters). No call
 *              starts before the controller's hold_until (Retry-After).
 *              When a call ends the controller sees the same
 *              struct sluice_sample the pool builds in call_end, then the
 *              permit is released.
 *   network    each call reaches the provider net_s/2 after it starts and
 *              its answer returns net_s/2 after the provider is done.
 *   provider   the model of provider_model.h (shared with the HTTP
 *              simulator, shim/tools/sluice-provider-sim): a hidden cap C
 *              on calls in service, with lognormal service times, and one
 *              of these behaviours past the cap:
 *                reject  answer 429 at once (optionally with Retry-After)
 *                queue   (Ollama-like) queue FIFO behind C slots, so latency
 *                        grows with the queue; 503 past queue_bound waiting,
 *                        and (queue_timeout_s) 503 to a call that waited so long
 *                knee    admit everyone but slow down: a call admitted with
 *                        n in service takes S·(1 + slope·(n−C)/C) when n > C,
 *                        so throughput falls past C
 *                drop    never answer: the caller's timeout is the only sign
 *              or no cap at all:
 *                rate    at most rate_per_s·rate_window_s calls accepted per
 *                        sliding rate_window_s; 429 beyond
 *                slow    every call in service slows the others:
 *                        S·(1 + slope·(n−1)/C), no knee
 *              The cap may be changed between sim_run_until() calls.
 *   timeouts   a call still unanswered after timeout_s is an overload for
 *              the caller (the provider keeps working on it).
 *   lag        a loaded client machine: a granted caller starts, and an
 *              answer is seen, client_lag_s (exponential mean) late, as
 *              threads woken late by a busy scheduler do: the caller's count
 *              of calls in flight runs ahead of the provider's, and a jump
 *              of the limit fills slowly.
 *   abandons   with deadline_s, a caller gives up on a call still unanswered
 *              that long after it started (its own deadline: a censored
 *              sample, not an overload); the provider keeps serving it. With
 *              linger the permit stays held, as a pool's lingering permit
 *              does (sluice/pool_linger.h), until sluice_service_linger_until.
 *              With read_on as well the transport answers its caller at the
 *              deadline and reads the answer on (the curl loop's read_on, as
 *              sluice_chat_submit does): the permit comes back with the
 *              provider's answer and discovery sees the whole call (or,
 *              SIM_LINGER_MAX_S after its start, it is abandoned after all,
 *              as linger_max_ms does: sluice_pool_read_on_left).
 *   streams    with answer_tokens > 0 an answer is streamed: the
 *              provider's draw (lognormal, the mode's slow-down) is the time
 *              to its first token, then answer_tokens (lognormal,
 *              answer_sigma) tokens of token_s each hold the slot. The
 *              sample discovery sees is the time to first token with
 *              sample_ttft (what the chat client reports for a stream),
 *              else the whole call; the service-time estimate always
 *              learns the whole call, as a pool's does.
 *   retries    a refused call is retried after the Retry-After, or after
 *              retry_s, or after retry_ladder[k] seconds for its k-th retry
 *              (the last step repeats), as SDK retry loops do.
 *
 * Time is an int64 of virtual nanoseconds; the sluice clock hook reads it,
 * and a wall clock hook reads epoch_s + virtual time, so lock expiry runs in
 * virtual time too. Everything random comes from one seeded splitmix64, and
 * simultaneous events run in scheduling order: a run is a pure function of
 * its configuration.
 *
 * Why one header of this size: the event loop, the callers, the gate
 * adapter and the scoring are one simulation over one event queue and one
 * clock; its users include it whole.
 */
#ifndef SLUICE_PROVIDER_SIM_H
#define SLUICE_PROVIDER_SIM_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/discovery.h>
#include <sluice/service_time.h>

#include "sluice-provider-sim/provider_model.h"

#define SIM_NS 1e9
/* A pool's default linger_max_ms, in s: the longest a permit is kept or a cut call read on. */
#define SIM_LINGER_MAX_S 30.0

/* ---- configuration ------------------------------------------------------- */

struct sim_config {
    uint64_t seed;
    /* provider: the fields of struct sim_provider (provider_model.h) */
    enum sim_mode mode;
    uint32_t cap;          /* hidden concurrency cap C */
    double median_s;       /* median service time (default 2 s) */
    double sigma;          /* lognormal shape (default 0.4) */
    double net_s;          /* network round trip, also a rejection's latency (default 0.05 s) */
    double retry_after_s;  /* reject mode: Retry-After sent with each 429 (0 = none) */
    uint32_t queue_bound;  /* queue mode: waiting calls past which it answers 503 (default 2·C) */
    double queue_timeout_s; /* queue mode: a call that waited this long gets a 503 (0 = none) */
    double knee_slope;     /* knee and slow mode: slow-down per unit of load (default 2) */
    double rate_per_s;     /* rate mode: accepted calls per second over the window */
    double rate_window_s;  /* rate mode: the sliding window (default 1 s) */
    /* what the provider says (sluice/curl.h's dialects, as the shim would classify them) */
    bool states_rate;      /* rate mode: answers carry the window's budget as OpenAI's
                              headers do: a refusal names the window's reset (RATE), a call
                              served with nothing left carries the reset (a pacing hold), and
                              a served call offers the controller rate x latency (its hint) */
    double platform_from_s, platform_until_s; /* calls reaching the provider in [from, until)
                                                 get a platform overload (Anthropic's 529) */
    double platform_every_s;                  /* ... and again every this many seconds (0 =
                                                 once): bursts */
    double quota_from_s, quota_until_s;       /* ... a quota refusal, once */
    /* callers */
    uint32_t workers;      /* closed loop: callers issuing back to back (0 = none) */
    double think_s;        /* closed loop: mean pause between a caller's calls (0 = none) */
    double open_rate;      /* open loop: mean arrivals per second (0 = none) */
    double burst_mean;     /* open loop: mean burst size (default 1) */
    double retry_s;        /* caller retry delay after an overload without Retry-After
                              (default 0.5 s) */
    double timeout_s;      /* caller timeout per call (default 120 s) */
    double client_lag_s;   /* mean delay before the caller sees an answer (0 = none) */
    double deadline_s;     /* the caller abandons a call unanswered this long (0 = never) */
    bool linger;           /* an abandoned call's permit lingers (see "abandons") */
    bool read_on;          /* ... and the answer is read on (see "abandons"); with linger */
    const double *retry_ladder; /* retry delays by attempt, seconds (NULL = retry_s) */
    uint32_t n_retry_ladder;
    /* streamed answers (see "streams"; answer_tokens 0 = not streamed) */
    double answer_tokens;  /* median answer length in tokens */
    double answer_sigma;   /* lognormal shape of answer lengths (0 = always the median) */
    double token_s;        /* time per token */
    bool sample_ttft;      /* discovery's sample is the time to first token, not the whole call */
    /* sluice */
    uint32_t gate_limit;   /* the gate's starting limit (default 1; discovery resets it) */
    double epoch_s;        /* wall clock at virtual time 0 (default 1.7e9) */
};

static inline void sim_config_defaults(struct sim_config *c)
{
    SLUICE__DEFAULT(c->median_s, SIM_DEFAULT_MEDIAN_S);
    SLUICE__DEFAULT(c->sigma, SIM_DEFAULT_SIGMA);
    SLUICE__DEFAULT(c->net_s, 0.05);
    SLUICE__DEFAULT(c->queue_bound, SIM_DEFAULT_QUEUE_BOUND(c->cap));
    SLUICE__DEFAULT(c->knee_slope, SIM_DEFAULT_KNEE_SLOPE);
    SLUICE__DEFAULT(c->rate_window_s, SIM_DEFAULT_RATE_WINDOW_S);
    SLUICE__DEFAULT(c->burst_mean, 1.0);
    SLUICE__DEFAULT(c->retry_s, 0.5);
    SLUICE__DEFAULT(c->timeout_s, 120.0);
    SLUICE__DEFAULT(c->gate_limit, 1);
    SLUICE__DEFAULT(c->epoch_s, 1.7e9);
}

/* The provider a configuration describes (defaults already resolved). */
static inline struct sim_provider sim_config_provider(const struct sim_config *c)
{
    struct sim_provider p;
    p.mode = c->mode;
    p.cap = c->cap;
    p.median_s = c->median_s;
    p.sigma = c->sigma;
    p.retry_after_s = c->retry_after_s;
    p.queue_bound = c->queue_bound;
    p.queue_timeout_s = c->queue_timeout_s;
    p.knee_slope = c->knee_slope;
    p.rate_per_s = c->rate_per_s;
    p.rate_window_s = c->rate_window_s;
    return p;
}

/* Mean time one call takes without queueing: the natural "round trip". */
static inline double sim_round_trip_s(const struct sim_config *c)
{
    return c->median_s * sim_exp(0.5 * c->sigma * c->sigma) + c->net_s;
}

/* What drives the gate's limit: discovery, a bench baseline, or nothing. */
struct sim_controller {
    void *ctx;
    void (*on_sample)(void *ctx, const struct sluice_sample *sample, int64_t now_ns);
    int64_t (*hold_until)(void *ctx); /* may be NULL */
    void (*hint)(void *ctx, double rate_per_s, int64_t latency_ns); /* the provider's stated
                                                   rate and the call's latency (may be NULL) */
};

/* ---- state ---------------------------------------------------------------- */

enum { SIM_EV_TICK, SIM_EV_ARRIVAL, SIM_EV_ISSUE, SIM_EV_START, SIM_EV_PROVIDER,
       SIM_EV_DONE, SIM_EV_RESPONSE, SIM_EV_TIMEOUT, SIM_EV_QUEUE_TIMEOUT, SIM_EV_ABANDON,
       SIM_EV_LINGER_END, SIM_EV_READ_ON_DONE, SIM_EV_READ_ON_END };

struct sim_event {
    int64_t t;
    uint64_t seq;
    uint32_t type, req;
    uint64_t gen;
};

/* A time-ordered queue of events (a binary heap; ties run in push order).
 * Shared with testkit/vector_sim.h. */
struct sim_events {
    struct sim_event *heap;
    size_t n, cap;
    uint64_t seq;
};

struct sim;

struct sim_req {
    struct sluice_gate_waiter waiter; /* waiter.data = this */
    struct sim *sim;
    uint64_t gen;        /* attempt number: stale events carry an older one */
    int64_t t_issue;     /* when the caller first asked (end-to-end latency) */
    int64_t t_start;     /* when this attempt started (permit held, hold passed) */
    uint32_t in_flight_at_start;
    uint32_t limit_at_start;
    bool holding, answered;
    bool answer_coming;  /* this attempt's answer is on its way back (sim__answer) */
    enum sluice_outcome outcome;
    int64_t retry_after_ns;
    bool open_loop;
    uint32_t retries;    /* refusals in a row: the retry ladder's step */
    uint32_t next_free;
    int64_t t_first;     /* streamed: when the provider sent the first token (0 = not yet) */
};

/* A call its caller gave up on, its answer read on (read_on): keyed by its id and attempt. */
struct sim_reading {
    uint32_t id;
    uint64_t gen;
    int64_t t_start;
    uint32_t in_flight_at_start, limit_at_start;
    enum sluice_outcome outcome;
};

struct sim_stats {
    uint64_t attempts, ok, rejected, unavailable, timeouts, served, dropped;
    uint64_t lost;       /* drop mode: calls the provider never answered */
    uint64_t abandoned;  /* calls the caller gave up on (deadline_s) */
    double *e2e_s;       /* per served caller request */
    size_t n_e2e, cap_e2e;
    int64_t t90_ns;      /* first time the limit reached t90_target (-1 = never) */
    uint32_t max_limit;
};

struct sim {
    struct sim_config cfg;
    struct sim_rng rng;
    int64_t now;
    struct sim_events ev;
    struct sluice_gate gate;
    struct sluice_clock clock, wall;
    struct sim_controller ctl;
    struct sim_req *reqs;
    uint32_t n_reqs, free_head;
    uint32_t held;       /* permits held by callers and lingering abandoned calls */
    uint32_t unstarted;  /* of them, granted to callers not started yet (woken late, or held) */
    /* As a pool counts them for discovery (sluice_discovery_count_in_flight and
     * _count_lingering): calls started and not ended, lingering ones included; of them,
     * those lingering. */
    _Atomic(uint32_t) started_calls, lingering_calls;
    struct sluice_service_time service; /* recent successes: how long an abandoned call lingers */
    struct sim_reading *reading;         /* read_on: calls read on, unordered */
    uint32_t n_reading, cap_reading;
    /* provider: the model, and the calls it holds */
    struct sim_provider provider; /* from cfg; sim_set_cap changes provider.cap */
    uint32_t in_service;
    uint32_t *queue;     /* FIFO of request ids waiting at the provider (queue mode) */
    uint64_t *queue_gen;
    int64_t *queue_t;    /* when each queued call arrived */
    uint32_t q_head, q_len, q_cap;
    struct sim_rate_window rate; /* rate mode: recent acceptances */
    /* observation */
    struct sim_stats stats;
    uint32_t t90_target;
    int64_t t90_from;    /* t90 counts from here (a cap change) */
    bool t90_down;       /* after a cut: t90 is when the limit first fell to the cap */
    void (*on_tick)(struct sim *s, void *ctx);
    void *tick_ctx;
    int64_t tick_ns;
};

static inline int64_t sim__now(void *ctx)
{
    return ((struct sim *)ctx)->now;
}

static inline int64_t sim__wall(void *ctx)
{
    struct sim *s = (struct sim *)ctx;
    return (int64_t)(s->cfg.epoch_s * SIM_NS) + s->now;
}

static inline double sim_now_s(const struct sim *s)
{
    return (double)s->now / SIM_NS;
}

static inline int64_t sim__ns(double seconds)
{
    return (int64_t)(seconds * SIM_NS);
}

static inline void sim_events_push(struct sim_events *q, int64_t t, uint32_t type, uint32_t req,
                                   uint64_t gen)
{
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 1024;
        q->heap = (struct sim_event *)realloc(q->heap, q->cap * sizeof *q->heap);
    }
    struct sim_event e = {t, q->seq++, type, req, gen};
    size_t i = q->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        struct sim_event *up = &q->heap[p];
        if (up->t < e.t || (up->t == e.t && up->seq < e.seq))
            break;
        q->heap[i] = *up;
        i = p;
    }
    q->heap[i] = e;
}

static inline bool sim__before(const struct sim_event *a, const struct sim_event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

/* The earliest event, removed (the queue must not be empty). */
static inline struct sim_event sim_events_pop(struct sim_events *q)
{
    struct sim_event top = q->heap[0], last = q->heap[--q->n];
    size_t i = 0, n = q->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && sim__before(&q->heap[c + 1], &q->heap[c]))
            c++;
        if (!sim__before(&q->heap[c], &last))
            break;
        q->heap[i] = q->heap[c];
        i = c;
    }
    if (n)
        q->heap[i] = last;
    return top;
}

static inline void sim__push(struct sim *s, int64_t t, uint32_t type, uint32_t req, uint64_t gen)
{
    sim_events_push(&s->ev, t, type, req, gen);
}

/* ---- callers ---------------------------------------------------------------- */

static inline uint32_t sim__req_id(struct sim *s, struct sim_req *r)
{
    return (uint32_t)(r - s->reqs);
}

static inline int64_t sim__hold(struct sim *s)
{
    return s->ctl.hold_until ? s->ctl.hold_until(s->ctl.ctx) : 0;
}

static inline void sim__on_grant(struct sluice_gate_waiter *w, int status)
{
    struct sim_req *r = (struct sim_req *)w->data;
    struct sim *s = r->sim;
    if (status != SLUICE_OK)
        return;
    s->held++;
    s->unstarted++;
    r->holding = true;
    /* Possibly inside a release or a limit change: start from the event loop
     * (a loaded client's thread wakes late). */
    int64_t wake = s->cfg.client_lag_s > 0 ? sim__ns(sim_exponential(&s->rng, s->cfg.client_lag_s)) : 0;
    sim__push(s, s->now + wake, SIM_EV_START, sim__req_id(s, r), r->gen);
}

/* The caller asks for a permit (a first attempt or a retry). */
static inline void sim__issue(struct sim *s, struct sim_req *r)
{
    int64_t hold = sim__hold(s);
    if (hold > s->now) { /* honour Retry-After: do not even queue before it */
        sim__push(s, hold, SIM_EV_ISSUE, sim__req_id(s, r), r->gen);
        return;
    }
    r->gen++;
    r->answered = false;
    r->answer_coming = false;
    r->waiter.cb = sim__on_grant;
    r->waiter.data = r;
    sluice_gate_acquire_async(&s->gate, &r->waiter);
}

static inline struct sim_req *sim__alloc_req(struct sim *s)
{
    if (s->free_head == UINT32_MAX)
        return NULL;
    struct sim_req *r = &s->reqs[s->free_head];
    s->free_head = r->next_free;
    return r;
}

static inline void sim__caller_new(struct sim *s, struct sim_req *r, bool open_loop)
{
    r->t_issue = s->now;
    r->open_loop = open_loop;
    sim__issue(s, r);
}

/* ---- provider --------------------------------------------------------------- */

static inline struct sim_reading *sim__reading_find(struct sim *s, uint32_t id, uint64_t gen)
{
    for (uint32_t i = 0; i < s->n_reading; i++)
        if (s->reading[i].id == id && s->reading[i].gen == gen)
            return &s->reading[i];
    return NULL;
}

static inline void sim__answer(struct sim *s, uint32_t id, uint64_t gen, enum sluice_outcome o,
                               int64_t retry_after, int64_t at)
{
    struct sim_req *r = &s->reqs[id];
    struct sim_reading *reading = r->gen != gen ? sim__reading_find(s, id, gen) : NULL;
    if (reading) {
        reading->outcome = o;
        sim__push(s, at, SIM_EV_READ_ON_DONE, id, gen);
        return;
    }
    if (r->gen != gen || r->answered)
        return;
    r->answer_coming = true;
    r->outcome = o;
    r->retry_after_ns = retry_after;
    if (s->cfg.client_lag_s > 0)
        at += sim__ns(sim_exponential(&s->rng, s->cfg.client_lag_s));
    sim__push(s, at, SIM_EV_RESPONSE, id, gen);
}

static inline void sim__serve(struct sim *s, uint32_t id, uint64_t gen)
{
    s->in_service++;
    double service = sim_provider_service_s(&s->provider, &s->rng, s->in_service);
    if (s->cfg.answer_tokens > 0) { /* the draw was the first token; the tokens follow */
        if (s->reqs[id].gen == gen) /* not a stale attempt the caller gave up on */
            s->reqs[id].t_first = s->now + sim__ns(service);
        service += sim_lognormal(&s->rng, s->cfg.answer_tokens, s->cfg.answer_sigma) *
                   s->cfg.token_s;
    }
    sim__push(s, s->now + sim__ns(service), SIM_EV_DONE, id, gen);
}

/* The window's reset (ns) when nothing is left of it, else 0: what states_rate says. */
static inline int64_t sim__rate_spent(struct sim *s)
{
    double reset_s;
    if (!s->cfg.states_rate || s->provider.mode != SIM_RATE ||
        sim_rate_left(&s->provider, &s->rate, (double)s->now / SIM_NS, &reset_s))
        return 0;
    return sim__ns(reset_s);
}

/* A refusal span (platform overload, quota) holds now: answer with its outcome. */
static inline bool sim__provider_signal(struct sim *s, uint32_t id, uint64_t gen, int64_t back)
{
    double t = (double)s->now / SIM_NS, into = t - s->cfg.platform_from_s;
    if (s->cfg.platform_every_s > 0 && into > 0)
        into = fmod(into, s->cfg.platform_every_s);
    enum sluice_outcome o;
    if (into >= 0 && into < s->cfg.platform_until_s - s->cfg.platform_from_s)
        o = SLUICE_OUTCOME_PLATFORM;
    else if (t >= s->cfg.quota_from_s && t < s->cfg.quota_until_s)
        o = SLUICE_OUTCOME_QUOTA;
    else
        return false;
    s->stats.rejected++;
    sim__answer(s, id, gen, o, 0, s->now + back);
    return true;
}

/* A call reaches the provider. */
static inline void sim__provider_arrive(struct sim *s, uint32_t id, uint64_t gen)
{
    int64_t back = sim__ns(s->cfg.net_s / 2);
    if (sim__provider_signal(s, id, gen, back))
        return;
    enum sim_verdict v = s->provider.mode == SIM_RATE &&
                                 !sim_rate_admit(&s->provider, &s->rate, (double)s->now / SIM_NS)
                             ? SIM_REFUSE_429
                             : sim_provider_admit(&s->provider, s->in_service, s->q_len);
    if (v == SIM_WAIT && sim_provider_drops(&s->provider)) {
        s->stats.lost++; /* never answered: the caller's timeout fires */
        return;
    }
    if (v == SIM_WAIT && s->q_len >= s->q_cap) /* out of storage: as if the bound were hit */
        v = SIM_REFUSE_503;
    switch (v) {
    case SIM_SERVE:
        sim__serve(s, id, gen);
        break;
    case SIM_REFUSE_429: {
        s->stats.rejected++;
        int64_t reset = sim__rate_spent(s);
        sim__answer(s, id, gen, reset ? SLUICE_OUTCOME_RATE : SLUICE_OUTCOME_OVERLOAD,
                    reset ? reset : sim__ns(s->provider.retry_after_s), s->now + back);
        break;
    }
    case SIM_WAIT: {
        uint32_t tail = (s->q_head + s->q_len++) % s->q_cap;
        s->queue[tail] = id;
        s->queue_gen[tail] = gen;
        s->queue_t[tail] = s->now;
        if (s->provider.queue_timeout_s > 0)
            sim__push(s, s->now + sim__ns(s->provider.queue_timeout_s), SIM_EV_QUEUE_TIMEOUT, id,
                      gen);
        break;
    }
    case SIM_REFUSE_503:
        s->stats.unavailable++;
        sim__answer(s, id, gen, SLUICE_OUTCOME_OVERLOAD, 0, s->now + back);
        break;
    }
}

/* Start queued calls while there is room (after a completion or a cap raise). */
static inline void sim__provider_pump(struct sim *s)
{
    while (sim_provider_may_start_waiting(&s->provider, s->in_service, s->q_len)) {
        uint32_t id = s->queue[s->q_head];
        uint64_t gen = s->queue_gen[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        sim__serve(s, id, gen);
    }
}

/* Refuse (503) the calls at the head of the FIFO that waited past the queue
 * timeout: every call waits the same timeout, so they expire in FIFO order. */
static inline void sim__provider_expire(struct sim *s)
{
    int64_t back = sim__ns(s->cfg.net_s / 2);
    while (s->q_len &&
           sim_provider_queue_expired(&s->provider, (double)(s->now - s->queue_t[s->q_head]) / SIM_NS)) {
        uint32_t id = s->queue[s->q_head];
        uint64_t gen = s->queue_gen[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        s->stats.unavailable++;
        sim__answer(s, id, gen, SLUICE_OUTCOME_OVERLOAD, 0, s->now + back);
    }
}

/* Change the hidden cap now (plan upgrade, provider cut). */
static inline void sim_set_cap(struct sim *s, uint32_t cap)
{
    s->provider.cap = cap;
    s->cfg.cap = cap; /* cfg stays a record of what the provider is now */
    sim__provider_pump(s);
    s->t90_down = cap < sluice_gate_limit(&s->gate);
    s->t90_target = s->t90_down ? cap : (uint32_t)(0.9 * cap);
    s->t90_from = s->now;
    s->stats.t90_ns = -1;
}

/* ---- the end of a call: what the pool's call_end does ------------------------ */

static inline void sim__record_e2e(struct sim *s, double seconds)
{
    struct sim_stats *st = &s->stats;
    if (st->n_e2e == st->cap_e2e) {
        st->cap_e2e = st->cap_e2e ? 2 * st->cap_e2e : 4096;
        st->e2e_s = (double *)realloc(st->e2e_s, st->cap_e2e * sizeof *st->e2e_s);
    }
    st->e2e_s[st->n_e2e++] = seconds;
}

/* The sample a pool's call_end builds for a call started at t_start that ends now; fields
 * this sim does not know stay "unknown". */
static inline struct sluice_sample sim__sample(const struct sim *s, int64_t t_start,
                                               uint32_t in_flight_at_start,
                                               uint32_t limit_at_start,
                                               enum sluice_outcome outcome)
{
    struct sluice_sample sample;
    memset(&sample, 0, sizeof sample);
    sample.latency_ns = s->now - t_start;
    sample.in_flight_at_start = in_flight_at_start;
    sample.outcome = outcome;
    sample.start_ns = t_start;
    sample.limit_at_start = limit_at_start;
    return sample;
}

static inline void sim__response(struct sim *s, struct sim_req *r)
{
    r->answered = true;
    struct sluice_sample sample =
        sim__sample(s, r->t_start, r->in_flight_at_start, r->limit_at_start, r->outcome);
    if (s->cfg.sample_ttft && r->t_first && r->outcome == SLUICE_OUTCOME_OK) /* + the way back */
        sample.latency_ns = r->t_first + sim__ns(s->cfg.net_s / 2) - r->t_start;
    int64_t whole_ns = s->now - r->t_start;
    r->t_first = 0;
    sample.retry_after_ns = r->retry_after_ns;
    if (s->ctl.on_sample)
        s->ctl.on_sample(s->ctl.ctx, &sample, s->now);
    r->holding = false;
    s->held--;
    atomic_fetch_sub_explicit(&s->started_calls, 1u, memory_order_relaxed);
    sluice_gate_release(&s->gate);
    if (r->outcome != SLUICE_OUTCOME_OK) {
        double retry = s->cfg.retry_s;
        if (s->cfg.n_retry_ladder) {
            uint32_t k = r->retries < s->cfg.n_retry_ladder ? r->retries : s->cfg.n_retry_ladder - 1;
            retry = s->cfg.retry_ladder[k];
        }
        r->retries++;
        int64_t delay = r->retry_after_ns ? r->retry_after_ns : sim__ns(retry);
        sim__push(s, s->now + delay, SIM_EV_ISSUE, sim__req_id(s, r), r->gen);
        return;
    }
    if (s->cfg.states_rate && s->ctl.hint) /* as the shim offers sluice_curl_stated_rate */
        s->ctl.hint(s->ctl.ctx, s->cfg.rate_per_s, sample.latency_ns);
    r->retries = 0;
    s->stats.ok++;
    s->stats.served++;
    sluice_service_add(&s->service, whole_ns);
    sim__record_e2e(s, (double)(s->now - r->t_issue) / SIM_NS);
    if (r->open_loop) {
        r->next_free = s->free_head;
        s->free_head = sim__req_id(s, r);
    } else {
        double think = s->cfg.think_s > 0 ? sim_exponential(&s->rng, s->cfg.think_s) : 0;
        r->t_issue = s->now + sim__ns(think);
        sim__push(s, r->t_issue, SIM_EV_ISSUE, sim__req_id(s, r), r->gen);
    }
}

static inline void sim__start(struct sim *s, struct sim_req *r)
{
    int64_t hold = sim__hold(s);
    if (hold > s->now) { /* granted during a hold: keep the permit, start after it */
        sim__push(s, hold, SIM_EV_START, sim__req_id(s, r), r->gen);
        return;
    }
    r->t_start = s->now;
    r->t_first = 0;
    /* As a pool counts (sluice__pool_start): at the start, so the calls of one burst of
     * grants count 1, 2, ... as each caller wakes, not all at the burst's size. */
    r->in_flight_at_start = s->held - --s->unstarted;
    atomic_fetch_add_explicit(&s->started_calls, 1u, memory_order_relaxed);
    r->limit_at_start = sluice_gate_limit(&s->gate);
    s->stats.attempts++;
    sim__push(s, s->now + sim__ns(s->cfg.net_s / 2), SIM_EV_PROVIDER, sim__req_id(s, r), r->gen);
    sim__push(s, s->now + sim__ns(s->cfg.timeout_s), SIM_EV_TIMEOUT, sim__req_id(s, r), r->gen);
    if (s->cfg.deadline_s > 0)
        sim__push(s, s->now + sim__ns(s->cfg.deadline_s), SIM_EV_ABANDON, sim__req_id(s, r),
                  r->gen);
}

/* The caller gives up on a call (its deadline): a censored sample, as the
 * pool's sluice_pool_call_abandon gives discovery ("longer than this"); the
 * permit is released, or lingers until the provider is likely done; the
 * caller goes on to its next call at once. */
static inline void sim__abandon(struct sim *s, struct sim_req *r)
{
    r->answered = true;
    s->stats.abandoned++;
    int64_t most = sim__ns(SIM_LINGER_MAX_S);
    int64_t until =
        s->cfg.linger ? sluice_service_linger_until(&s->service, r->t_start, s->now, most) : 0;
    if (s->cfg.read_on && until > s->now) { /* the call goes on; only its caller leaves */
        if (s->n_reading == s->cap_reading) {
            s->cap_reading = s->cap_reading ? 2 * s->cap_reading : 64;
            s->reading = (struct sim_reading *)realloc(s->reading,
                                                       s->cap_reading * sizeof *s->reading);
        }
        /* An answer already on its way ends it when it lands (SIM_EV_RESPONSE). */
        s->reading[s->n_reading++] = (struct sim_reading){
            .id = sim__req_id(s, r), .gen = r->gen, .t_start = r->t_start,
            .in_flight_at_start = r->in_flight_at_start, .limit_at_start = r->limit_at_start,
            .outcome = r->answer_coming ? r->outcome : SLUICE_OUTCOME_OK};
        sim__push(s, r->t_start + most, SIM_EV_READ_ON_END, sim__req_id(s, r), r->gen);
        r->holding = false;
    } else {
        struct sluice_sample sample = sim__sample(s, r->t_start, r->in_flight_at_start,
                                                  r->limit_at_start, SLUICE_OUTCOME_CENSORED);
        if (s->ctl.on_sample)
            s->ctl.on_sample(s->ctl.ctx, &sample, s->now);
        r->holding = false;
        /* As a pool records a cut call (after it chose the linger): without it the estimate saw
         * only the calls short enough to beat the deadline. */
        sluice_service_add_censored(&s->service, s->now - r->t_start);
        if (until > s->now) {
            atomic_fetch_add_explicit(&s->lingering_calls, 1u, memory_order_relaxed);
            sim__push(s, until, SIM_EV_LINGER_END, 0, 0);
        } else {
            s->held--;
            atomic_fetch_sub_explicit(&s->started_calls, 1u, memory_order_relaxed);
            sluice_gate_release(&s->gate);
        }
    }
    r->t_issue = s->now;
    sim__push(s, s->now, SIM_EV_ISSUE, sim__req_id(s, r), r->gen);
}

/* A call read on ends: with the provider's answer (the whole call), or at
 * SIM_LINGER_MAX_S (abandoned after all: a censored sample). Its permit comes back. */
static inline void sim__read_on_end(struct sim *s, uint32_t id, uint64_t gen, bool answered)
{
    struct sim_reading *g = sim__reading_find(s, id, gen);
    if (!g)
        return;
    struct sluice_sample sample =
        sim__sample(s, g->t_start, g->in_flight_at_start, g->limit_at_start,
                    answered ? g->outcome : SLUICE_OUTCOME_CENSORED);
    if (s->ctl.on_sample)
        s->ctl.on_sample(s->ctl.ctx, &sample, s->now);
    if (!answered)
        sluice_service_add_censored(&s->service, sample.latency_ns);
    else if (g->outcome == SLUICE_OUTCOME_OK)
        sluice_service_add(&s->service, sample.latency_ns);
    *g = s->reading[--s->n_reading];
    s->held--;
    atomic_fetch_sub_explicit(&s->started_calls, 1u, memory_order_relaxed);
    sluice_gate_release(&s->gate);
}

static inline void sim__arrival(struct sim *s)
{
    /* A burst: geometric size with the configured mean. */
    double p = 1.0 / s->cfg.burst_mean;
    do {
        struct sim_req *r = sim__alloc_req(s);
        if (!r) {
            s->stats.dropped++;
            continue;
        }
        sim__caller_new(s, r, true);
    } while (sim_uniform(&s->rng) > p);
    double gap = sim_exponential(&s->rng, s->cfg.burst_mean / s->cfg.open_rate);
    sim__push(s, s->now + sim__ns(gap), SIM_EV_ARRIVAL, 0, 0);
}

static inline void sim__dispatch(struct sim *s, const struct sim_event *e)
{
    struct sim_req *r = &s->reqs[e->req];
    switch (e->type) {
    case SIM_EV_TICK:
        if (s->on_tick)
            s->on_tick(s, s->tick_ctx);
        sim__push(s, s->now + s->tick_ns, SIM_EV_TICK, 0, 0);
        break;
    case SIM_EV_ARRIVAL:
        sim__arrival(s);
        break;
    case SIM_EV_ISSUE:
        if (r->gen == e->gen)
            sim__issue(s, r);
        break;
    case SIM_EV_START:
        if (r->gen == e->gen && r->holding)
            sim__start(s, r);
        break;
    case SIM_EV_PROVIDER:
        sim__provider_arrive(s, e->req, e->gen);
        break;
    case SIM_EV_DONE:
        s->in_service--;
        sim__answer(s, e->req, e->gen, SLUICE_OUTCOME_OK, sim__rate_spent(s),
                    s->now + sim__ns(s->cfg.net_s / 2));
        sim__provider_pump(s);
        break;
    case SIM_EV_RESPONSE:
        if (r->gen == e->gen && !r->answered && r->holding)
            sim__response(s, r);
        else if (r->gen != e->gen) /* a call read on whose answer was on its way at the cut */
            sim__read_on_end(s, e->req, e->gen, true);
        break;
    case SIM_EV_QUEUE_TIMEOUT:
        sim__provider_expire(s);
        break;
    case SIM_EV_ABANDON:
        if (r->gen == e->gen && !r->answered && r->holding)
            sim__abandon(s, r);
        break;
    case SIM_EV_READ_ON_DONE:
    case SIM_EV_READ_ON_END:
        sim__read_on_end(s, e->req, e->gen, e->type == SIM_EV_READ_ON_DONE);
        break;
    case SIM_EV_LINGER_END:
        s->held--;
        atomic_fetch_sub_explicit(&s->lingering_calls, 1u, memory_order_relaxed);
        atomic_fetch_sub_explicit(&s->started_calls, 1u, memory_order_relaxed);
        sluice_gate_release(&s->gate);
        break;
    case SIM_EV_TIMEOUT:
        if (r->gen == e->gen && !r->answered && r->holding) {
            s->stats.timeouts++;
            r->outcome = SLUICE_OUTCOME_OVERLOAD;
            r->retry_after_ns = 0;
            sim__response(s, r);
        }
        break;
    }
}

/* Run every event up to virtual time t_s (seconds), then stop the clock there. */
static inline void sim_run_until(struct sim *s, double t_s)
{
    int64_t end = sim__ns(t_s);
    while (s->ev.n && s->ev.heap[0].t <= end) {
        struct sim_event e = sim_events_pop(&s->ev);
        s->now = e.t;
        sim__dispatch(s, &e);
        uint32_t limit = sluice_gate_limit(&s->gate);
        if (limit > s->stats.max_limit)
            s->stats.max_limit = limit;
        if (s->stats.t90_ns < 0 && s->t90_target &&
            (s->t90_down ? limit <= s->t90_target : limit >= s->t90_target))
            s->stats.t90_ns = s->now - s->t90_from;
    }
    s->now = end;
}

/* ---- lifecycle -------------------------------------------------------------- */

/* Create a simulation (callers are not started until sim_start). */
static inline struct sim *sim_create(const struct sim_config *config)
{
    struct sim *s = (struct sim *)calloc(1, sizeof *s);
    s->cfg = *config;
    sim_config_defaults(&s->cfg);
    s->provider = sim_config_provider(&s->cfg);
    sim_rng_seed(&s->rng, s->cfg.seed);
    sluice_gate_init(&s->gate, s->cfg.gate_limit);
    sluice_service_init(&s->service, 10);
    s->clock.now_ns = sim__now;
    s->clock.ctx = s;
    s->wall.now_ns = sim__wall;
    s->wall.ctx = s;
    s->n_reqs = s->cfg.workers + (s->cfg.open_rate > 0 ? 1u << 16 : 0);
    s->reqs = (struct sim_req *)calloc(s->n_reqs ? s->n_reqs : 1, sizeof *s->reqs);
    s->free_head = UINT32_MAX;
    for (uint32_t i = 0; i < s->n_reqs; i++) {
        s->reqs[i].sim = s;
        if (i >= s->cfg.workers) {
            s->reqs[i].next_free = s->free_head;
            s->free_head = i;
        }
    }
    s->q_cap = s->n_reqs ? s->n_reqs : 1;
    s->queue = (uint32_t *)calloc(s->q_cap, sizeof *s->queue);
    s->queue_gen = (uint64_t *)calloc(s->q_cap, sizeof *s->queue_gen);
    s->queue_t = (int64_t *)calloc(s->q_cap, sizeof *s->queue_t);
    if (s->cfg.mode == SIM_RATE) {
        s->rate.slots = sim_rate_slots(&s->provider);
        s->rate.t = (double *)calloc(s->rate.slots, sizeof *s->rate.t);
    }
    s->stats.t90_ns = -1;
    s->t90_target = (uint32_t)(0.9 * s->cfg.cap);
    return s;
}

static inline void sim_set_controller(struct sim *s, const struct sim_controller *c)
{
    s->ctl = *c;
}

/* Call on_tick every tick_s virtual seconds (the demo, invariant checks). */
static inline void sim_set_tick(struct sim *s, double tick_s, void (*fn)(struct sim *, void *),
                                void *ctx)
{
    s->on_tick = fn;
    s->tick_ctx = ctx;
    s->tick_ns = sim__ns(tick_s);
    sim__push(s, s->now + s->tick_ns, SIM_EV_TICK, 0, 0);
}

/* Start the callers at the current virtual time. */
static inline void sim_start(struct sim *s)
{
    for (uint32_t i = 0; i < s->cfg.workers; i++)
        sim__caller_new(s, &s->reqs[i], false);
    if (s->cfg.open_rate > 0)
        sim__push(s, s->now, SIM_EV_ARRIVAL, 0, 0);
}

static inline void sim_destroy(struct sim *s)
{
    if (!s)
        return;
    free(s->ev.heap);
    free(s->reqs);
    free(s->queue);
    free(s->queue_gen);
    free(s->queue_t);
    free(s->rate.t);
    free(s->stats.e2e_s);
    free(s->reading);
    free(s);
}

/* Share of calls that reached the provider and were refused (429/503/timeout). */
static inline double sim_reject_share(const struct sim *s)
{
    uint64_t bad = s->stats.rejected + s->stats.unavailable + s->stats.timeouts;
    uint64_t all = s->stats.ok + bad;
    return all ? (double)bad / (double)all : 0.0;
}

static inline int sim__cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile (0..100) of end-to-end latency in seconds (sorts the samples). */
static inline double sim_e2e_percentile(struct sim *s, double pct)
{
    struct sim_stats *st = &s->stats;
    if (!st->n_e2e)
        return 0;
    qsort(st->e2e_s, st->n_e2e, sizeof *st->e2e_s, sim__cmp_double);
    size_t idx = (size_t)(pct / 100.0 * (double)(st->n_e2e - 1) + 0.5);
    return st->e2e_s[idx < st->n_e2e ? idx : st->n_e2e - 1];
}

/* ---- discovery under simulation --------------------------------------------- */

static inline void sim__discovery_sample(void *ctx, const struct sluice_sample *sample, int64_t now)
{
    (void)now;
    sluice_discovery_on_sample((struct sluice_discovery *)ctx, sample);
}

static inline int64_t sim__discovery_hold(void *ctx)
{
    return sluice_discovery_hold_until((struct sluice_discovery *)ctx);
}

static inline void sim__discovery_hint(void *ctx, double rate_per_s, int64_t latency_ns)
{
    sluice_discovery_hint_rate((struct sluice_discovery *)ctx, rate_per_s, latency_ns,
                               SLUICE_CAUSE_PROVIDER_RATE);
}

/* Fill the parts of a discovery description that belong to the simulation. */
static inline void sim_discovery_desc(struct sim *s, struct sluice_discovery_desc *desc)
{
    desc->gate = &s->gate;
    desc->clock = &s->clock;
    desc->wall_clock = &s->wall;
}

/* Let `d` (created over this sim's gate and clocks) drive the limit. */
static inline void sim_attach_discovery(struct sim *s, struct sluice_discovery *d)
{
    struct sim_controller c;
    c.ctx = d;
    c.on_sample = sim__discovery_sample;
    c.hold_until = sim__discovery_hold;
    c.hint = sim__discovery_hint;
    sim_set_controller(s, &c);
    sluice_discovery_count_in_flight(d, &s->started_calls);
    sluice_discovery_count_lingering(d, &s->lingering_calls);
}

/* ---- recording events ------------------------------------------------------- */

struct sim_trace {
    struct sluice_event *ev;
    size_t n, cap;
    FILE *echo; /* when set, each event is also written here as JSON Lines */
};

static inline void sim_trace_event(void *ctx, const struct sluice_event *ev)
{
    struct sim_trace *t = (struct sim_trace *)ctx;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->ev = (struct sluice_event *)realloc(t->ev, t->cap * sizeof *t->ev);
    }
    t->ev[t->n++] = *ev;
    if (t->echo)
        sluice_event_write_json(t->echo, ev);
}

/* The first recorded event of `kind` at or after t_ns, or NULL. */
static inline const struct sluice_event *sim_trace_find(const struct sim_trace *t,
                                                        enum sluice_event_kind kind, int64_t t_ns)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->ev[i].kind == kind && t->ev[i].t_ns >= t_ns)
            return &t->ev[i];
    return NULL;
}

static inline void sim_trace_free(struct sim_trace *t)
{
    free(t->ev);
    memset(t, 0, sizeof *t);
}

/* Create a discovery from `desc`; NULL, with what to fix on stderr after `who`, when it
 * cannot be. */
static inline struct sluice_discovery *sim__discovery_create(const char *who,
                                                             const struct sluice_discovery_desc *desc)
{
    struct sluice_discovery *d = NULL;
    char why[256] = "";
    struct sluice_discovery_desc told = *desc; /* the buffer lives only as long as this call */
    told.error = why;
    told.error_size = sizeof why;
    int status = sluice_discovery_create(&told, &d);
    if (status != SLUICE_OK)
        fprintf(stderr, "%s: %s\n", who, why[0] ? why : sluice_strerror(status));
    return d;
}

/*
 * Create a discovery over this sim's gate and clocks from `desc` (node_id,
 * policy, limits...), record its events in `trace` (may be NULL), and let it
 * drive the limit. Returns NULL (and prints why) on a bad description.
 */
static inline struct sluice_discovery *sim_discovery(struct sim *s, struct sluice_discovery_desc *desc,
                                                     struct sim_trace *trace)
{
    sim_discovery_desc(s, desc);
    if (trace) {
        desc->on_event = sim_trace_event;
        desc->on_event_ctx = trace;
    }
    struct sluice_discovery *d = sim__discovery_create("sim_discovery", desc);
    if (d)
        sim_attach_discovery(s, d);
    return d;
}

#endif /* SLUICE_PROVIDER_SIM_H */
