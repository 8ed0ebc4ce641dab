/*
 * provider_model.h — the model of a remote model provider with a hidden
 * concurrency cap: seeded random numbers, lognormal service times, and what
 * the provider does with a call past its cap (reject, queue, knee).
 *
 * Modes, by what the provider does with load:
 *   reject  past C in service: 429 at once (optionally with Retry-After)
 *   queue   past C in service: wait FIFO (Ollama-like); 503 past queue_bound,
 *           and, with queue_timeout_s, 503 to a call that waited that long
 *           (HAProxy's `timeout queue`, vLLM's and Ollama's queue limits)
 *   knee    admit all, but a call admitted with n > C in service is slower
 *   rate    a sliding-window rate limit: at most rate_per_s·rate_window_s
 *           calls accepted per rate_window_s, 429 beyond (no concurrency cap)
 *   slow    no cap at all: service time grows with every call in service
 *           (a saturating link), so only latency and timeouts say "enough"
 *   drop    past C in service the call is silently dropped: never answered,
 *           so the client sees nothing until its own timeout
 *
 * One model, two drivers:
 *   testkit/provider_sim.h              runs it in virtual time (the
 *                                       discovery scenarios and the bench)
 *   shim/tools/sluice-provider-sim/     runs it behind a real HTTP server
 * Both include this header, so a behaviour changed here changes in both.
 *
 * The model holds no provider state: the driver keeps its own count of calls
 * in service and waiting (a virtual event queue, or real connections) and
 * asks the model what to do. Everything is header-only, static inline, and
 * needs only libc and libm.
 *
 * Concurrency: none inside. Every function works on the caller's values; a
 * driver shared by threads serialises calls with its own lock. Memory
 * ordering: not applicable.
 *
 * Random numbers: one splitmix64 stream per struct sim_rng. The virtual-time
 * runs are pure functions of their seed, so the number and order of draws
 * each function makes is part of the contract: sim_provider_service_s draws
 * exactly one lognormal, whatever the mode.
 */
#ifndef SLUICE_PROVIDER_MODEL_H
#define SLUICE_PROVIDER_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ---- numbers ------------------------------------------------------------- */

static inline double sim_exp(double x)
{
    return exp(x);
}

static inline double sim_log(double x)
{
    return log(x);
}

static inline double sim_sqrt(double x)
{
    return sqrt(x);
}

/* ---- random numbers ------------------------------------------------------ */

struct sim_rng {
    uint64_t state;
    double spare;
    bool has_spare;
};

/* A stream for `seed`; every seed, 0 included, gives a distinct stream. */
static inline void sim_rng_seed(struct sim_rng *r, uint64_t seed)
{
    r->state = seed * UINT64_C(0x2545F4914F6CDD1D) + 1;
    r->spare = 0;
    r->has_spare = false;
}

static inline uint64_t sim_rand64(struct sim_rng *r)
{
    uint64_t z = (r->state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static inline double sim_uniform(struct sim_rng *r)
{
    return ((double)(sim_rand64(r) >> 11) + 0.5) / 9007199254740992.0;
}

/* Standard normal (Marsaglia's polar method). */
static inline double sim_normal(struct sim_rng *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u, v, s;
    do {
        u = 2.0 * sim_uniform(r) - 1.0;
        v = 2.0 * sim_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = sim_sqrt(-2.0 * sim_log(s) / s);
    r->spare = v * f;
    r->has_spare = true;
    return u * f;
}

static inline double sim_lognormal(struct sim_rng *r, double median, double sigma)
{
    return median * sim_exp(sigma * sim_normal(r));
}

static inline double sim_exponential(struct sim_rng *r, double mean)
{
    return -mean * sim_log(sim_uniform(r));
}

/* ---- the provider ---------------------------------------------------------- */

/* New modes go at the end: the values are part of both drivers' contract. */
enum sim_mode { SIM_REJECT, SIM_QUEUE, SIM_KNEE, SIM_RATE, SIM_SLOW, SIM_DROP };
#define SIM_MODE_LAST SIM_DROP

static inline const char *sim_mode_name(enum sim_mode m)
{
    static const char *const names[] = {"reject", "queue", "knee", "rate", "slow", "drop"};
    return (unsigned)m <= SIM_MODE_LAST ? names[m] : "unknown";
}

/* The mode called `name` ("reject", "queue", "knee", "rate", "slow", "drop");
 * false if none is. */
static inline bool sim_mode_parse(const char *name, enum sim_mode *out)
{
    for (int m = SIM_REJECT; m <= SIM_MODE_LAST; m++)
        if (!strcmp(name, sim_mode_name((enum sim_mode)m))) {
            *out = (enum sim_mode)m;
            return true;
        }
    return false;
}

/* Defaults of the fields below, shared by both drivers. */
#define SIM_DEFAULT_MEDIAN_S 2.0
#define SIM_DEFAULT_SIGMA 0.4
#define SIM_DEFAULT_KNEE_SLOPE 2.0
#define SIM_DEFAULT_QUEUE_BOUND(cap) (2 * (cap))
#define SIM_DEFAULT_RATE_WINDOW_S 1.0

/*
 * What the provider is. The cap may change while it runs (a plan upgrade, a
 * provider cut); a lower cap does not stop calls already in service, it only
 * turns new ones away until fewer than the new cap are in service.
 */
struct sim_provider {
    enum sim_mode mode;
    uint32_t cap;          /* hidden concurrency cap C (knee mode needs C >= 1) */
    double median_s;       /* median service time (SIM_DEFAULT_MEDIAN_S) */
    double sigma;          /* lognormal shape (SIM_DEFAULT_SIGMA); 0 = every call takes the median */
    double retry_after_s;  /* reject mode: Retry-After sent with each 429 (0 = none) */
    uint32_t queue_bound;  /* queue mode: waiting calls past which it answers 503
                              (SIM_DEFAULT_QUEUE_BOUND(C)) */
    double queue_timeout_s; /* queue mode: a call still waiting this long leaves the FIFO
                              with a 503 (0 = it waits until served) */
    double knee_slope;     /* knee mode: slow-down per unit of overload fraction; slow mode:
                              per C calls in service (SIM_DEFAULT_KNEE_SLOPE) */
    double rate_per_s;     /* rate mode: calls accepted per second, on average over the window
                              (rate_per_s·rate_window_s of them per window) */
    double rate_window_s;  /* rate mode: the sliding window (SIM_DEFAULT_RATE_WINDOW_S) */
};

/* What the provider does with a call that has just arrived. */
enum sim_verdict {
    SIM_SERVE,        /* start serving it now */
    SIM_WAIT,         /* queue mode: put it at the tail of the FIFO; drop mode: hold it
                         and never answer (sim_provider_may_start_waiting stays false) */
    SIM_REFUSE_429,   /* reject and rate mode: too many requests, at once */
    SIM_REFUSE_503    /* queue mode: the FIFO is full, unavailable at once */
};

/* `in_service` and `waiting` count the calls already there, not this one.
 * Rate mode: this is the verdict once the rate window accepted the call
 * (sim_rate_admit); it has no concurrency cap. */
static inline enum sim_verdict sim_provider_admit(const struct sim_provider *p, uint32_t in_service,
                                                  uint32_t waiting)
{
    if (p->mode == SIM_KNEE || p->mode == SIM_RATE || p->mode == SIM_SLOW || in_service < p->cap)
        return SIM_SERVE;
    if (p->mode == SIM_REJECT)
        return SIM_REFUSE_429;
    if (p->mode == SIM_DROP)
        return SIM_WAIT; /* held unanswered, whatever is waiting already */
    return waiting < p->queue_bound ? SIM_WAIT : SIM_REFUSE_503;
}

/* Queue mode: a call that has waited `waited_s` in the FIFO is refused now
 * (503), as a gateway with a queue timeout answers. Drivers check the head
 * of the FIFO (the longest waiter) whenever time moves. */
static inline bool sim_provider_queue_expired(const struct sim_provider *p, double waited_s)
{
    return p->mode == SIM_QUEUE && p->queue_timeout_s > 0 && waited_s >= p->queue_timeout_s;
}

/* Drop mode: a SIM_WAIT verdict means the call is lost, not queued. */
static inline bool sim_provider_drops(const struct sim_provider *p)
{
    return p->mode == SIM_DROP;
}

/*
 * Rate mode's sliding window: when the last calls were accepted. The driver
 * owns it (one per provider, storage for sim_rate_slots(p) times) and asks
 * sim_rate_admit before sim_provider_admit. Times are the driver's seconds,
 * never decreasing.
 */
struct sim_rate_window {
    double *t;      /* acceptance times, oldest first, a ring of `slots` */
    uint32_t slots, head, len;
};

/* Calls one window accepts: rate_per_s·rate_window_s, at least 1. */
static inline uint32_t sim_rate_slots(const struct sim_provider *p)
{
    double n = floor(p->rate_per_s * p->rate_window_s);
    return n < 1.0 ? 1u : n > 1e8 ? 100000000u : (uint32_t)n;
}

/* Accept (and remember) a call arriving at now_s, or refuse it (false: 429). */
static inline uint32_t sim_rate_left(const struct sim_provider *p, struct sim_rate_window *w,
                                     double now_s, double *reset_s);

static inline bool sim_rate_admit(const struct sim_provider *p, struct sim_rate_window *w,
                                  double now_s)
{
    double reset_s;
    if (!sim_rate_left(p, w, now_s, &reset_s))
        return false;
    w->t[(w->head + w->len++) % w->slots] = now_s;
    return true;
}

/* What the window has left at now_s (calls it would still accept) and when its oldest
 * acceptance leaves it (seconds from now; 0 when it is empty): what a provider states in
 * its rate-limit headers. Drops the acceptances that have left, as admit does. */
static inline uint32_t sim_rate_left(const struct sim_provider *p, struct sim_rate_window *w,
                                     double now_s, double *reset_s)
{
    while (w->len && w->t[w->head] <= now_s - p->rate_window_s) {
        w->head = (w->head + 1) % w->slots;
        w->len--;
    }
    *reset_s = w->len ? w->t[w->head] + p->rate_window_s - now_s : 0.0;
    return w->slots - w->len;
}

/* Whether the head of the FIFO may start now (after a completion, a call
 * that left, or a cap raise). Drivers loop on it. */
static inline bool sim_provider_may_start_waiting(const struct sim_provider *p, uint32_t in_service,
                                                  uint32_t waiting)
{
    return p->mode == SIM_QUEUE && waiting && in_service < p->cap;
}

/*
 * Knee mode: a call admitted with n in service (itself included) takes
 * S·(1 + slope·(n−C)/C) when n > C, so throughput falls past C. Slow mode:
 * S·(1 + slope·(n−1)/C) for every n, so latency rises from the first extra
 * call and throughput creeps towards C·S/slope without a knee. Other modes
 * and n <= C: S.
 */
static inline double sim_provider_slowdown(const struct sim_provider *p, uint32_t n)
{
    if (p->mode == SIM_SLOW)
        return 1.0 + p->knee_slope * (double)(n - 1) / p->cap;
    if (p->mode != SIM_KNEE || n <= p->cap)
        return 1.0;
    return 1.0 + p->knee_slope * (double)(n - p->cap) / p->cap;
}

/* Service time in seconds of a call that starts with n in service, itself
 * included. Draws exactly one lognormal from `rng`. */
static inline double sim_provider_service_s(const struct sim_provider *p, struct sim_rng *rng,
                                            uint32_t n)
{
    /* x·1.0 == x exactly, so the other modes get the bare draw. */
    return sim_lognormal(rng, p->median_s, p->sigma) * sim_provider_slowdown(p, n);
}

#endif /* SLUICE_PROVIDER_MODEL_H */
