/*
 * The ceiling-discovery scoreboard (sluice-bench --discovery).
 *
 * Every row runs the virtual-time provider simulator (testkit/
 * provider_sim.h) for 30 simulated minutes with closed-loop callers that
 * always want more than the provider takes (2·C + 8 of them), and one
 * controller driving the real sluice gate:
 *
 *   discover, aimd, gradient, vegas   sluice's policies, inside sluice's
 *                                     discovery state machine (windows,
 *                                     bracket, lock, Retry-After holds)
 *   netflix_aimd                      Netflix concurrency-limits AIMDLimit,
 *                                     updated on every sample
 *   netflix_gradient2                 Netflix Gradient2Limit behind its
 *                                     WindowedLimit (>= 10 samples, windows of
 *                                     2 x min RTT, at least 1 s; the longest
 *                                     window is raised from 1 s to 30 s,
 *                                     else 2 s calls never fill one)
 *   vector_arc                        Vector's adaptive request concurrency
 *   static16, unlimited               fixed gate limits
 *   oracle                            a fixed limit equal to the true cap,
 *                                     following it when it changes
 *
 * The three peer baselines are written here from their published update
 * rules (READMEs, docs and source comments), not ported; they start from
 * sluice's jumpstart (5) and share its bounds [1, 1024] so only the update
 * rule differs. Retry-After is honoured only by sluice (the peers have no
 * such hold).
 *
 * Columns: true_cap (at the end), locked_ceiling (the lock for sluice
 * rows; the final limit for the rest), goodput_ratio (served calls over the
 * oracle's on the same seed), reject_share (429/503/timeouts over answered
 * calls), t90_s (seconds after the start, or after the cap change, until the
 * limit first reached 0.9·C — or, after a cut, first fell to C; -1 = never),
 * p50/p99_latency_s (end to end from the caller's view: gate wait,
 * provider queueing and retries included). Each number is the median over
 * opts->repeats seeds.
 *
 * Three scenarios model providers without a plain concurrency cap, each
 * with its own target (target_met: the share of seeds that met it):
 *   rate_r100        a sliding-window rate limit of 100 calls/s, 0.1 s calls
 *                    (R·L = 10 concurrent): the limit settles in [0.8, 2]·R·L
 *                    with at most 5% 429s after the first minute, and no
 *                    lock below 0.8·R·L
 *   slow_link        latency grows with every call in service, no cap, 1 s
 *                    client timeout: after the first 10 s at most 1% of
 *                    calls time out, and the second half's mean latency is at
 *                    most twice the unloaded one
 *   drop_timeout_c5  calls past cap 5 are silently dropped (1 s timeout):
 *                    locked in [0.85·C, C] within 60 simulated seconds
 * Their oracle is the best fixed limit (R·L; the load at twice the unloaded
 * latency; C).
 *
 * The robustness table (rows discovery.robust.<mode>_c<C>, after the
 * scoreboard) runs each policy and peer over many seeds — 300, or 30 with
 * --quick, or SLUICE_BENCH_SEEDS — per mode and cap: queue and knee at
 * C in {8, 12, 16, 24, 52, 200}, reject at {3, 8, 16, 52, 200}, queue with
 * streamed answers of lognormal length (sigma 1) at C in {8, 16, 52} with
 * the time to first token as the sample (queue_stream_ttft) and with the
 * whole call (queue_stream_whole), and the three scenarios above. Per
 * row: seeds, outside_band (seeds whose ceiling
 * — the lock, or the final limit where there is none — left [0.8·C,
 * 1.25·C], [0.85·C, C] in reject mode; for the scenarios, seeds that missed
 * their target), gp_median and gp_worst (served over the oracle's on the
 * same seed), p99_ratio (the median over seeds of p99 end-to-end latency
 * over the oracle's). Seeds run in parallel on every online CPU
 * (SLUICE_BENCH_THREADS to change); progress goes to stderr;
 * SLUICE_BENCH_IMPLS=discover,vegas keeps only the rows it names.
 *
 * Why one file of this size: the rows, the three peer baselines and the
 * scoring share one controller interface and one row printer; the peers are
 * a few dozen lines each, too small for files of their own.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sluice/policy/aimd.h>
#include <sluice/policy/gradient.h>
#include <sluice/policy/vegas.h>

#include "harness.h"
#include "provider_sim.h"
#include "vector_sim.h"

#define JUMPSTART 5
#define MAX_LIMIT 1024

/* ---- scenarios ------------------------------------------------------------- */

#define RUN_S (30 * 60.0)
#define REAL_TRAFFIC_RUN_S (5 * 60.0) /* 0.1-0.2 s calls lock within seconds */

/* What a scenario must achieve, beyond the common columns. */
enum target { TARGET_BAND, TARGET_RATE, TARGET_SLOW, TARGET_DROP };

struct scenario {
    const char *name;
    enum sim_mode mode;
    uint32_t cap;       /* C; rate mode: R·L rounded; slow mode: the load scale */
    double retry_after_s;
    double change_at_s; /* 0 = the cap never changes */
    uint32_t new_cap;
    bool clear;         /* the operator clears discovery at the change */
    /* Provider and callers, 0 = the simulator's default. */
    double median_s, sigma, net_s, timeout_s, rate_per_s, slope;
    uint32_t oracle;    /* the oracle's limit when it is not the cap (0 = the cap) */
    enum target target;
    /* Real traffic (0 = the table's usual callers: 2·C + 8 of them, retrying
     * after 0.5 s, answers seen at once). */
    uint32_t workers;       /* closed-loop callers */
    double retry_s;         /* retry delay after a refusal */
    double client_lag_s;    /* a loaded client machine: mean delay before an answer is seen */
    double queue_timeout_s; /* queue mode: 503 to a call that waited this long */
    uint32_t queue_bound;   /* queue mode: 503 past this many waiting (0 = 2·C) */
    bool retry_ladder;      /* retry after 1, 2, 3, then every 5 s (SDK retry loops) */
    double settle_s;        /* TARGET_RATE: refusals count after this (0 = 60 s) */
    double rate_band_hi;    /* TARGET_RATE: the limit settles under this times R·L (0 = 2) */
    double refused_max;     /* TARGET_RATE: the share of refusals allowed (0 = 5%) */
    double run_s;           /* simulated seconds (0 = RUN_S) */
    double deadline_s;      /* callers abandon a call unanswered this long (0 = never); the
                               band then also holds every lock ever taken (none lowered) */
    bool linger;            /* an abandoned call's permit lingers, as a pool's does */
    /* Streamed answers (provider_sim.h "streams"; 0 = not streamed): median_s is then the
     * time to first token. */
    double answer_tokens, answer_sigma, token_s;
    bool sample_ttft;       /* discovery's sample is the time to first token */
};

static const struct scenario scenarios[] = {
    {.name = "reject_c3", .mode = SIM_REJECT, .cap = 3},
    {.name = "reject_c16", .mode = SIM_REJECT, .cap = 16},
    {.name = "reject_c52", .mode = SIM_REJECT, .cap = 52},
    {.name = "reject_c52_retry_after", .mode = SIM_REJECT, .cap = 52, .retry_after_s = 2.0},
    {.name = "reject_c200", .mode = SIM_REJECT, .cap = 200},
    {.name = "queue_c52", .mode = SIM_QUEUE, .cap = 52},
    {.name = "knee_c52", .mode = SIM_KNEE, .cap = 52},
    {.name = "cap_cut_52_to_20", .mode = SIM_REJECT, .cap = 52, .change_at_s = 600, .new_cap = 20},
    {.name = "cap_raise_52_to_120", .mode = SIM_REJECT, .cap = 52, .change_at_s = 600,
     .new_cap = 120, .clear = true},
    /* 100 calls/s over a sliding second; 0.1 s round trips: R·L = 10. */
    {.name = "rate_r100", .mode = SIM_RATE, .cap = 10, .median_s = 0.075, .sigma = 0.3,
     .net_s = 0.02, .rate_per_s = 100, .target = TARGET_RATE},
    /* The same window, constant 0.1 s latency and callers that retry a
     * refusal after 1, 2, 3, 5 s: R·L = 10, settled in [0.8, 1.25]·R·L with
     * at most 2% refusals after the first 30 s. */
    {.name = "rate_r100_retrying", .mode = SIM_RATE, .cap = 10, .median_s = 0.098,
     .sigma = 1e-9, .net_s = 0.002, .rate_per_s = 100, .target = TARGET_RATE,
     .retry_ladder = true, .settle_s = 30, .rate_band_hi = 1.25, .refused_max = 0.02},
    /* 0.1-0.5 s calls, twice the unloaded latency at 10 in service. */
    {.name = "slow_link", .mode = SIM_SLOW, .cap = 9, .median_s = 0.1, .sigma = 0.5,
     .net_s = 0.01, .timeout_s = 1.0, .slope = 1.0, .oracle = 10, .target = TARGET_SLOW},
    /* Latency proportional to load (S·(1 + (n−1)/3)): twice the unloaded at 4. */
    {.name = "slow_proportional", .mode = SIM_SLOW, .cap = 3, .median_s = 0.1, .sigma = 0.4,
     .net_s = 0.005, .timeout_s = 1.0, .slope = 1.0, .oracle = 4, .target = TARGET_SLOW},
    {.name = "drop_timeout_c5", .mode = SIM_DROP, .cap = 5, .median_s = 0.05, .sigma = 0.4,
     .net_s = 0.02, .timeout_s = 1.0, .target = TARGET_DROP},
};

/* Blocking threads against a provider that refuses in a millisecond: a
 * refused thread calls again at once, and a loaded client sees each answer
 * ~2 ms late, so its count of calls in flight runs ahead of the provider's. */
#define CLOSED_LOOP(n, c)                                                                           \
    {.name = "closed" #n "_reject", .mode = SIM_REJECT, .cap = c, .median_s = 0.2,                \
     .net_s = 0.001, .workers = n, .retry_s = 0.001, .client_lag_s = 0.002, .run_s = REAL_TRAFFIC_RUN_S}
/* A gateway that queues behind C slots, then answers 503 to a call that
 * waited longer than its queue timeout (HAProxy maxconn + timeout queue,
 * Ollama, vLLM): 100 ms calls, a timeout of one and of three of them. */
#define QUEUE_TIMEOUT(c, timeout, tag)                                                               \
    {.name = "queue503_" tag, .mode = SIM_QUEUE, .cap = c, .median_s = 0.1, .net_s = 0.002,       \
     .queue_timeout_s = timeout, .queue_bound = 1u << 15, .run_s = REAL_TRAFFIC_RUN_S}
/* A shallow knee (half the default slope: +25% at 1.25·C), 1 s timeout. */
#define SHALLOW_KNEE(c)                                                                               \
    {.name = "knee_shallow", .mode = SIM_KNEE, .cap = c, .median_s = 0.2, .net_s = 0.005,         \
     .timeout_s = 1.0, .slope = 1.0, .run_s = REAL_TRAFFIC_RUN_S}

/* Callers with a 250 ms deadline against a 200 ms provider: ~30% of calls
 * are abandoned mid-transfer, and the provider keeps serving them. With
 * lingering permits (the pool's default) a lock at C is never lowered by
 * them; without (the control row) it is. */
#define ABANDONED(tag, lingers)                                                                      \
    {.name = "abandoned_" tag, .mode = SIM_REJECT, .cap = 24, .median_s = 0.2, .net_s = 0.001,    \
     .workers = 64, .retry_s = 0.001, .deadline_s = 0.25, .linger = lingers,                       \
     .run_s = REAL_TRAFFIC_RUN_S}

/* Deadline-censored traffic: callers whose deadline cuts a share of the calls
 * (200 ms median, σ 0.4: a deadline of 247 ms cuts 30%, 181 ms 60%) against a
 * provider that refuses nothing below its cap and whose latency does not grow
 * with the limit: discovery must grow to the cap from the censored samples. */
#define CENSORED(c, deadline, tag)                                                                   \
    {.name = "censored" tag, .mode = SIM_REJECT, .cap = c, .median_s = 0.2,                \
     .sigma = 0.4, .net_s = 0.001, .workers = 2 * (c) + 16, .retry_s = 0.001,                     \
     .deadline_s = deadline, .linger = true, .run_s = REAL_TRAFFIC_RUN_S}

static const struct scenario real_traffic[] = {
    CLOSED_LOOP(64, 16),  CLOSED_LOOP(64, 24),  CLOSED_LOOP(64, 52),
    CLOSED_LOOP(256, 16), CLOSED_LOOP(256, 24), CLOSED_LOOP(256, 52),
    QUEUE_TIMEOUT(10, 0.1, "t1x"), QUEUE_TIMEOUT(24, 0.1, "t1x"), QUEUE_TIMEOUT(48, 0.1, "t1x"),
    QUEUE_TIMEOUT(10, 0.3, "t3x"), QUEUE_TIMEOUT(24, 0.3, "t3x"), QUEUE_TIMEOUT(48, 0.3, "t3x"),
    SHALLOW_KNEE(10), SHALLOW_KNEE(20),
    ABANDONED("linger", true), ABANDONED("free", false),
    CENSORED(24, 0.247, "30"), CENSORED(24, 0.181, "60"),
    CENSORED(52, 0.247, "30"), CENSORED(52, 0.181, "60"),
};

static const double retry_ladder[] = {1.0, 2.0, 3.0, 5.0};

#define RATE_SETTLE_S 60.0 /* rate_r100: 429s count after this (settle_s overrides) */
#define SLOW_SETTLE_S 10.0 /* slow_link: timeouts count after this */
#define DROP_LOCK_S 60.0   /* drop_timeout_c5: locked by this */

/* ---- the peer baselines: their update rules, our code ----------------------- */

/* A baseline drives the sim's gate directly from each sample. */
struct peer {
    struct sluice_gate *gate;
    double limit; /* fractional where the rule keeps one */
    uint32_t applied;
    void (*on_sample)(struct peer *p, const struct sluice_sample *s, int64_t now);
    /* Netflix WindowedLimit state */
    int64_t next_update_ns;
    double win_rtt_sum, win_min_rtt;
    uint32_t win_n, win_max_inflight;
    bool win_drop;
    /* Gradient2 long-term average (ExpAvgMeasurement: warm-up mean, then EMA) */
    double long_rtt;
    uint32_t long_n;
    /* Vector ARC state */
    double past_mean, past_var;
    bool past_set;
    int64_t arc_next_ns;
    double cur_sum;
    uint32_t cur_n;
    bool had_back_pressure, reached_limit;
    bool round_us; /* Vector's tests round the current mean RTT to 1 µs (else a constant
                      link's mean reads an ulp above the past one, a decrease) */
};

static void peer_apply(struct peer *p)
{
    if (p->limit < 1)
        p->limit = 1;
    if (p->limit > MAX_LIMIT)
        p->limit = MAX_LIMIT;
    uint32_t next = (uint32_t)p->limit;
    if (next != p->applied) {
        sluice_gate_set_limit(p->gate, next);
        p->applied = next;
    }
}

/*
 * Netflix AIMDLimit: on a drop (or an RTT past the 5 s timeout) the limit
 * becomes max(1, min(limit - 1, floor(limit * 0.9))); otherwise, when the
 * call started with in-flight * 2 >= limit, it grows by one. Per sample.
 */
static void netflix_aimd_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    (void)now;
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    double limit = floor(p->limit);
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD || s->latency_ns > 5 * SLUICE_NS_PER_SEC)
        p->limit = fmax(1, fmin(limit - 1, floor(limit * 0.9)));
    else if (s->in_flight_at_start * 2 >= limit)
        p->limit = limit + 1;
    peer_apply(p);
}

/*
 * Netflix Gradient2Limit behind WindowedLimit. A window collects samples
 * (drops included) and closes at its deadline, set when the previous one
 * closed to clamp(2 x that window's min RTT, 1 s, 30 s); a window with
 * fewer than 10 samples is dropped. Gradient2 sees a ready window's
 * average RTT and peak in-flight:
 *   long  = average of the first 10 windows, then an EMA over 600 windows;
 *           pulled down 10% when long > 2 x short
 *   skip when in-flight < limit / 2 (app-limited)
 *   g     = clamp(long / short, 0.5, 1)
 *   new   = limit * (1 - 0.2) + (g * limit + 4) * 0.2
 * Gradient2 does not react to drops themselves.
 */
static void netflix_gradient2_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->outcome == SLUICE_OUTCOME_IGNORE)
        return;
    p->win_rtt_sum += (double)s->latency_ns;
    if (!p->win_n || (double)s->latency_ns < p->win_min_rtt)
        p->win_min_rtt = (double)s->latency_ns;
    p->win_n++;
    if (s->in_flight_at_start > p->win_max_inflight)
        p->win_max_inflight = s->in_flight_at_start;
    p->win_drop |= s->outcome == SLUICE_OUTCOME_OVERLOAD;
    if (now < p->next_update_ns)
        return;
    double short_rtt = p->win_n ? p->win_rtt_sum / p->win_n : 0;
    bool ready = p->win_n >= 10;
    uint32_t inflight = p->win_max_inflight;
    double span = fmin(fmax(2 * p->win_min_rtt, 1e9), 30e9);
    p->next_update_ns = now + (int64_t)span;
    p->win_rtt_sum = 0;
    p->win_n = p->win_max_inflight = 0;
    p->win_drop = false;
    if (!ready)
        return;
    if (p->long_n < 10)
        p->long_rtt = (p->long_rtt * p->long_n + short_rtt) / (p->long_n + 1);
    else
        p->long_rtt += (short_rtt - p->long_rtt) * (2.0 / 601.0);
    p->long_n++;
    if (p->long_rtt / short_rtt > 2)
        p->long_rtt *= 0.9;
    if (inflight < p->limit / 2)
        return;
    double g = fmax(0.5, fmin(1.0, p->long_rtt / short_rtt));
    double next = g * p->limit + 4;
    p->limit = p->limit * 0.8 + next * 0.2;
    peer_apply(p);
}

/*
 * Vector ARC. Every response: back pressure (429/503/timeout) is noted;
 * a served call's RTT joins the current mean. Once per interval (one past
 * mean RTT): if the limit was reached, there was no back pressure and the
 * current mean is at most the past mean, the limit grows by one; else, on
 * back pressure or a current mean at or past past_mean + 2.5 x past
 * deviation, it becomes floor(limit * 0.9). The past RTT is an EWMA
 * (alpha 0.4) with variance.
 */
static void vector_arc_sample(struct peer *p, const struct sluice_sample *s, int64_t now)
{
    if (s->in_flight_at_start >= p->applied)
        p->reached_limit = true;
    if (s->outcome == SLUICE_OUTCOME_OVERLOAD)
        p->had_back_pressure = true;
    if (s->outcome == SLUICE_OUTCOME_OK) {
        p->cur_sum += (double)s->latency_ns / 1e9;
        p->cur_n++;
    }
    double cur = p->cur_n ? p->cur_sum / p->cur_n : -1;
    if (p->round_us && cur >= 0)
        cur = round(cur * 1e6) / 1e6;
    if (!p->past_set) {
        if (cur >= 0) {
            p->past_mean = cur;
            p->past_var = 0;
            p->past_set = true;
            p->arc_next_ns = now + (int64_t)(cur * 1e9);
        }
        return;
    }
    if (now < p->arc_next_ns)
        return;
    double threshold = sqrt(p->past_var) * 2.5;
    if (p->limit < MAX_LIMIT && p->reached_limit && !p->had_back_pressure && cur >= 0 &&
        cur <= p->past_mean)
        p->limit = floor(p->limit) + 1;
    else if (p->limit > 1 && (p->had_back_pressure || cur >= p->past_mean + threshold))
        p->limit = fmax(1, floor(floor(p->limit) * 0.9));
    if (cur >= 0) {
        double diff = cur - p->past_mean, inc = 0.4 * diff;
        p->past_mean += inc;
        p->past_var = 0.6 * (p->past_var + diff * inc);
    }
    p->arc_next_ns = now + (int64_t)(p->past_mean * 1e9);
    p->cur_sum = 0;
    p->cur_n = 0;
    p->had_back_pressure = p->reached_limit = false;
    peer_apply(p);
}

static void peer_on_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct peer *p = (struct peer *)ctx;
    p->on_sample(p, s, now);
}

/* ---- one run ------------------------------------------------------------------ */

enum impl_kind { IMPL_SLUICE, IMPL_PEER, IMPL_FIXED, IMPL_ORACLE };

struct impl {
    const char *name;
    enum impl_kind kind;
    void (*peer_rule)(struct peer *, const struct sluice_sample *, int64_t);
    uint32_t fixed_limit;
};

static const struct impl impls[] = {
    {"discover", IMPL_SLUICE, NULL, 0},
    {"aimd", IMPL_SLUICE, NULL, 0},
    {"gradient", IMPL_SLUICE, NULL, 0},
    {"vegas", IMPL_SLUICE, NULL, 0},
    {"netflix_aimd", IMPL_PEER, netflix_aimd_sample, 0},
    {"netflix_gradient2", IMPL_PEER, netflix_gradient2_sample, 0},
    {"vector_arc", IMPL_PEER, vector_arc_sample, 0},
    {"static16", IMPL_FIXED, NULL, 16},
    {"unlimited", IMPL_FIXED, NULL, SLUICE_GATE_LIMIT_MAX},
    {"oracle", IMPL_ORACLE, NULL, 0},
};
#define N_IMPLS (sizeof impls / sizeof impls[0])

struct result {
    double ceiling, served, reject_share, t90_s, p50_s, p99_s;
    bool target_met; /* the scenario's target (TARGET_BAND: ceiling in the band) */
};

/* What the scenario targets need from a run: every sample after a settle
 * time, and the lowest ceiling ever locked. Wraps the run's controller. */
struct observer {
    struct sim_controller inner;
    int64_t settle_ns, half_ns;
    double timeout_s;
    uint64_t n, overload, timeouts, late_ok;
    double late_latency_s; /* sum over late_ok: served calls in the second half */
    uint32_t lowest_lock;  /* 0 = never locked */
};

static void observer_sample(void *ctx, const struct sluice_sample *s, int64_t now)
{
    struct observer *o = (struct observer *)ctx;
    if (now >= o->settle_ns) {
        o->n++;
        if (s->outcome == SLUICE_OUTCOME_OVERLOAD) {
            o->overload++;
            if ((double)s->latency_ns >= o->timeout_s * 1e9 - 1)
                o->timeouts++;
        }
    }
    if (now >= o->half_ns && s->outcome == SLUICE_OUTCOME_OK) {
        o->late_ok++;
        o->late_latency_s += (double)s->latency_ns / 1e9;
    }
    if (o->inner.on_sample)
        o->inner.on_sample(o->inner.ctx, s, now);
}

static int64_t observer_hold(void *ctx)
{
    struct observer *o = (struct observer *)ctx;
    return o->inner.hold_until ? o->inner.hold_until(o->inner.ctx) : 0;
}

static void observer_event(void *ctx, const struct sluice_event *ev)
{
    struct observer *o = (struct observer *)ctx;
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling &&
        (!o->lowest_lock || ev->ceiling < o->lowest_lock))
        o->lowest_lock = ev->ceiling;
}

static double run_s(const struct scenario *sc)
{
    return sc->run_s > 0 ? sc->run_s : RUN_S;
}

static void observer_attach(struct observer *o, struct sim *s, double settle_s, double end_s)
{
    o->inner = s->ctl;
    o->settle_ns = (int64_t)(settle_s * 1e9);
    o->half_ns = (int64_t)(end_s / 2 * 1e9);
    o->timeout_s = s->cfg.timeout_s;
    struct sim_controller c = {o, observer_sample, observer_hold, NULL};
    sim_set_controller(s, &c);
}

static double round_trip_s(const struct scenario *sc)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.median_s = sc->median_s;
    cfg.sigma = sc->sigma;
    cfg.net_s = sc->net_s;
    sim_config_defaults(&cfg);
    return sim_round_trip_s(&cfg);
}

/* The band a locked ceiling must fall in: [0.85·C, C] against 429s (they
 * say exactly where C is), [0.8·C, 1.25·C] where only latency can. */
static bool in_band(const struct scenario *sc, double ceiling)
{
    double c = sc->new_cap ? sc->new_cap : sc->cap;
    bool refused = sc->mode == SIM_REJECT || sc->mode == SIM_DROP;
    return refused ? ceiling >= 0.85 * c && ceiling <= c : ceiling >= 0.8 * c && ceiling <= 1.25 * c;
}

/* The policy prototype of a sluice row: discovery copies it into the node at
 * create, so it only has to live until sim_discovery returns. */
union any_policy {
    struct sluice_policy_aimd aimd;
    struct sluice_policy_gradient gradient;
    struct sluice_policy_vegas vegas;
};

static struct sluice_policy *make_policy(const char *name, union any_policy *storage)
{
    if (!strcmp(name, "aimd")) {
        sluice_policy_aimd_init(&storage->aimd, NULL, NULL);
        return &storage->aimd.base;
    }
    if (!strcmp(name, "gradient")) {
        sluice_policy_gradient_init(&storage->gradient, NULL, NULL);
        return &storage->gradient.base;
    }
    if (!strcmp(name, "vegas")) {
        sluice_policy_vegas_init(&storage->vegas, NULL, NULL);
        return &storage->vegas.base;
    }
    return NULL; /* discover: discovery's default */
}

/* The description of a sluice row's discovery: `im`'s policy (in `storage`),
 * sluice's jumpstart and bounds, its events to `on_event`. */
static struct sluice_discovery_desc bench_desc(const char *node_id, const struct impl *im,
                                               union any_policy *storage, sluice_event_fn on_event,
                                               void *ctx)
{
    struct sluice_discovery_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.node_id = node_id;
    desc.policy = make_policy(im->name, storage);
    desc.jumpstart = JUMPSTART;
    desc.max_limit = MAX_LIMIT;
    desc.on_event = on_event;
    desc.on_event_ctx = ctx;
    return desc;
}

static struct result run_one(const struct scenario *sc, const struct impl *im, uint64_t seed)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = seed;
    cfg.mode = sc->mode;
    cfg.cap = sc->cap;
    cfg.retry_after_s = sc->retry_after_s;
    cfg.median_s = sc->median_s;
    cfg.sigma = sc->sigma;
    cfg.net_s = sc->net_s;
    cfg.timeout_s = sc->timeout_s;
    cfg.rate_per_s = sc->rate_per_s;
    cfg.knee_slope = sc->slope;
    uint32_t most = sc->new_cap > sc->cap ? sc->new_cap : sc->cap;
    uint32_t oracle = sc->oracle ? sc->oracle : sc->cap;
    if (oracle > most)
        most = oracle;
    cfg.workers = sc->workers ? sc->workers : 2 * most + 8;
    cfg.queue_bound = sc->queue_bound ? sc->queue_bound : 2 * sc->cap;
    cfg.queue_timeout_s = sc->queue_timeout_s;
    cfg.retry_s = sc->retry_s;
    cfg.client_lag_s = sc->client_lag_s;
    cfg.deadline_s = sc->deadline_s;
    cfg.linger = sc->linger;
    cfg.answer_tokens = sc->answer_tokens;
    cfg.answer_sigma = sc->answer_sigma;
    cfg.token_s = sc->token_s;
    cfg.sample_ttft = sc->sample_ttft;
    if (sc->retry_ladder) {
        cfg.retry_ladder = retry_ladder;
        cfg.n_retry_ladder = sizeof retry_ladder / sizeof retry_ladder[0];
    }
    cfg.gate_limit = im->kind == IMPL_FIXED    ? im->fixed_limit
                     : im->kind == IMPL_ORACLE ? oracle
                                               : JUMPSTART;
    struct sim *s = sim_create(&cfg);
    struct sluice_discovery *disc = NULL;
    union any_policy storage;
    struct peer peer;
    memset(&peer, 0, sizeof peer);
    struct observer obs;
    memset(&obs, 0, sizeof obs);
    if (im->kind == IMPL_SLUICE) {
        struct sluice_discovery_desc desc = bench_desc("cloud:bench", im, &storage, observer_event,
                                                       &obs);
        disc = sim_discovery(s, &desc, NULL);
    } else if (im->kind == IMPL_PEER) {
        peer.gate = &s->gate;
        peer.limit = JUMPSTART;
        peer.applied = JUMPSTART;
        peer.on_sample = im->peer_rule;
        struct sim_controller c = {&peer, peer_on_sample, NULL, NULL};
        sim_set_controller(s, &c);
    }
    observer_attach(&obs, s,
                    sc->target == TARGET_RATE ? (sc->settle_s > 0 ? sc->settle_s : RATE_SETTLE_S)
                                              : SLOW_SETTLE_S,
                    run_s(sc));
    sim_start(s);
    bool drop_locked = false;
    if (sc->target == TARGET_DROP) {
        sim_run_until(s, DROP_LOCK_S);
        if (disc) {
            struct sluice_discovery_status st;
            sluice_discovery_snapshot(disc, &st);
            drop_locked = st.state == SLUICE_DISCOVERY_LOCKED && in_band(sc, st.ceiling);
        }
    }
    if (sc->change_at_s > 0) {
        sim_run_until(s, sc->change_at_s);
        sim_set_cap(s, sc->new_cap);
        if (im->kind == IMPL_ORACLE)
            sluice_gate_set_limit(&s->gate, sc->new_cap);
        if (disc && sc->clear)
            sluice_discovery_clear(disc);
    }
    sim_run_until(s, run_s(sc));
    struct result r;
    uint32_t limit = sluice_gate_limit(&s->gate);
    if (disc) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(disc, &st);
        r.ceiling = st.ceiling;
    } else {
        r.ceiling = limit;
    }
    double ceiling_or_limit = r.ceiling > 0 ? r.ceiling : limit;
    double rl = sc->rate_per_s * round_trip_s(sc);
    switch (sc->target) {
    case TARGET_BAND:
        r.target_met = in_band(sc, ceiling_or_limit) &&
                       (!sc->deadline_s || !obs.lowest_lock || in_band(sc, obs.lowest_lock));
        break;
    case TARGET_RATE:
        r.target_met = limit >= 0.8 * rl &&
                       limit <= (sc->rate_band_hi > 0 ? sc->rate_band_hi : 2.0) * rl &&
                       (!obs.lowest_lock || obs.lowest_lock >= 0.8 * rl) &&
                       obs.overload <= (sc->refused_max > 0 ? sc->refused_max : 0.05) * (double)obs.n;
        break;
    case TARGET_SLOW:
        r.target_met = obs.timeouts <= 0.01 * (double)obs.n && obs.late_ok &&
                       obs.late_latency_s / (double)obs.late_ok <= 2.0 * round_trip_s(sc);
        break;
    case TARGET_DROP:
        r.target_met = drop_locked;
        break;
    }
    r.served = (double)s->stats.served;
    r.reject_share = sim_reject_share(s);
    r.t90_s = s->stats.t90_ns < 0 ? -1 : (double)s->stats.t90_ns / 1e9;
    r.p50_s = sim_e2e_percentile(s, 50);
    r.p99_s = sim_e2e_percentile(s, 99);
    sluice_discovery_destroy(disc);
    sim_destroy(s);
    return r;
}

/* ---- the scoreboard ------------------------------------------------------------ */

#define MAX_REPEATS 16

struct summary {
    double ceiling, goodput, reject_share, t90_s, p50_s, p99_s, target_met;
};

static double median_of(double *v, int n)
{
    return bench_median(v, (size_t)n);
}

static struct summary summarise(struct result *runs, const double *oracle_served, int n)
{
    double c[MAX_REPEATS], g[MAX_REPEATS], rs[MAX_REPEATS], t[MAX_REPEATS], p50[MAX_REPEATS],
        p99[MAX_REPEATS];
    for (int i = 0; i < n; i++) {
        c[i] = runs[i].ceiling;
        g[i] = oracle_served[i] > 0 ? runs[i].served / oracle_served[i] : 0;
        rs[i] = runs[i].reject_share;
        /* "never" sorts last, so the median is -1 only if most runs never got there */
        t[i] = runs[i].t90_s < 0 ? 1e12 : runs[i].t90_s;
        p50[i] = runs[i].p50_s;
        p99[i] = runs[i].p99_s;
    }
    int met = 0;
    for (int i = 0; i < n; i++)
        met += runs[i].target_met;
    struct summary m = {median_of(c, n),   median_of(g, n),   median_of(rs, n),
                        median_of(t, n),   median_of(p50, n), median_of(p99, n),
                        (double)met / n};
    if (m.t90_s >= 1e12)
        m.t90_s = -1;
    return m;
}

static void emit(const struct scenario *sc, const struct impl *im, const struct summary *m)
{
    char name[64];
    snprintf(name, sizeof name, "discovery.%s", sc->name);
    struct bench_row row = bench_row_make(name, im->name, 1);
    double cap = sc->new_cap ? sc->new_cap : sc->cap;
    if (sc->target == TARGET_RATE)
        cap = sc->rate_per_s * round_trip_s(sc);
    else if (sc->oracle)
        cap = sc->oracle;
    bench_row_extra(&row, "true_cap", cap);
    bench_row_extra(&row, "locked_ceiling", m->ceiling);
    bench_row_extra(&row, "goodput_ratio", m->goodput);
    bench_row_extra(&row, "reject_share", m->reject_share);
    bench_row_extra(&row, "t90_s", m->t90_s);
    bench_row_extra(&row, "p50_latency_s", m->p50_s);
    bench_row_extra(&row, "p99_latency_s", m->p99_s);
    if (sc->target != TARGET_BAND)
        bench_row_extra(&row, "target_met", m->target_met);
    bench_emit(&row);
}

/* discover against every adaptive baseline: goodput x (1 - reject share), p99. */
static void verdict(const struct summary *all)
{
    const struct summary *d = &all[0];
    double score = d->goodput * (1 - d->reject_share);
    int behind = 0;
    for (size_t i = 1; i < N_IMPLS; i++) {
        if (impls[i].kind == IMPL_ORACLE)
            continue;
        double other = all[i].goodput * (1 - all[i].reject_share);
        bool worse_p99 = d->p99_s > all[i].p99_s * 1.05;
        /* Ahead means a better score, or an equal one (within 0.5%) with a p99 no worse. */
        if (other > score * 1.005 || (other >= score * 0.995 && worse_p99)) {
            printf("    discover not ahead of %-17s score %.3f vs %.3f, p99 %.2f s vs %.2f s\n",
                   impls[i].name, score, other, d->p99_s, all[i].p99_s);
            behind++;
        }
    }
    printf("    discover: score %.3f, p99 %.2f s (oracle %.2f s): %s\n", score, d->p99_s,
           all[N_IMPLS - 1].p99_s,
           behind ? "not ahead of every baseline" : "ahead of every baseline");
}

static void discovery_scoreboard(const struct bench_opts *opts)
{
    int repeats = opts->repeats < MAX_REPEATS ? opts->repeats : MAX_REPEATS;
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
        const struct scenario *sc = &scenarios[k];
        char name[64];
        snprintf(name, sizeof name, "discovery.%s", sc->name);
        if (!bench_case_enabled(opts, name))
            continue;
        double oracle_served[MAX_REPEATS];
        struct result runs[N_IMPLS][MAX_REPEATS];
        for (int r = 0; r < repeats; r++)
            for (size_t i = 0; i < N_IMPLS; i++)
                runs[i][r] = run_one(sc, &impls[i], 1000 + 17 * (uint64_t)r);
        for (int r = 0; r < repeats; r++)
            oracle_served[r] = runs[N_IMPLS - 1][r].served;
        struct summary all[N_IMPLS];
        for (size_t i = 0; i < N_IMPLS; i++) {
            all[i] = summarise(runs[i], oracle_served, repeats);
            emit(sc, &impls[i], &all[i]);
        }
        verdict(all);
    }
}

BENCH_REGISTER(discovery, discovery_scoreboard, true)

/* ---- the robustness table -------------------------------------------------- */

static const uint32_t robust_queue_caps[] = {8, 12, 16, 24, 52, 200};
static const uint32_t robust_reject_caps[] = {3, 8, 16, 52, 200};
static const uint32_t robust_stream_caps[] = {8, 16, 52};
/* A streamed chat answer: 0.3 s to the first token (lognormal, the usual 0.4), then a median
 * of 100 tokens (lognormal sigma 1: a few words to thousands) at 20 ms each. */
#define STREAM_TTFT_S 0.3
#define STREAM_TOKENS 100.0
#define STREAM_TOKENS_SIGMA 1.0
#define STREAM_TOKEN_S 0.02
#define ROBUST_MAX_ROWS 64

/* Every policy and peer that learns a limit (not the fixed rows); only those
 * named in SLUICE_BENCH_IMPLS (comma-separated) when it is set. */
static bool robust_impl(const struct impl *im)
{
    if (im->kind != IMPL_SLUICE && im->kind != IMPL_PEER)
        return false;
    const char *only = getenv("SLUICE_BENCH_IMPLS");
    if (!only)
        return true;
    size_t n = strlen(im->name);
    for (const char *at = strstr(only, im->name); at; at = strstr(at + 1, im->name))
        if ((at == only || at[-1] == ',') && (at[n] == ',' || at[n] == 0))
            return true;
    return false;
}

/* One row of the table: a scenario, run for every seed by every impl. */
struct robust_job {
    struct scenario sc;
    char name[64];
    int seeds;
    struct result *runs; /* [seed][impl] (N_IMPLS per seed; fixed rows unused) */
    _Atomic int next;    /* the next seed to run */
    _Atomic int done;
};

static void robust_run_seed(struct robust_job *job, int k)
{
    uint64_t seed = 1 + (uint64_t)k;
    for (size_t i = 0; i < N_IMPLS; i++)
        if (robust_impl(&impls[i]) || impls[i].kind == IMPL_ORACLE)
            job->runs[(size_t)k * N_IMPLS + i] = run_one(&job->sc, &impls[i], seed);
}

static void *robust_worker(void *arg)
{
    struct robust_job *job = (struct robust_job *)arg;
    int k;
    while ((k = atomic_fetch_add(&job->next, 1)) < job->seeds) {
        robust_run_seed(job, k);
        atomic_fetch_add(&job->done, 1);
    }
    return NULL;
}

static int robust_threads(void)
{
    const char *env = getenv("SLUICE_BENCH_THREADS");
    long n = env ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

static int robust_seeds(const struct bench_opts *opts)
{
    const char *env = getenv("SLUICE_BENCH_SEEDS");
    long n = env ? atol(env) : (long)(300 * opts->scale + 0.5);
    return n < 1 ? 1 : n > 100000 ? 100000 : (int)n;
}

/* Run every seed of one row on `threads` threads, printing progress to stderr. */
static void robust_run(struct robust_job *job, int threads)
{
    pthread_t tid[64];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tid[started], NULL, robust_worker, job) == 0)
            started++;
    robust_worker(job); /* this thread works too; it returns when no seed is left */
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
}

static void robust_emit(struct robust_job *job)
{
    int n = job->seeds;
    double *gp = (double *)malloc(sizeof(double) * (size_t)n);
    double *p99 = (double *)malloc(sizeof(double) * (size_t)n);
    double *p50 = (double *)malloc(sizeof(double) * (size_t)n);
    for (size_t i = 0; i < N_IMPLS; i++) {
        if (!robust_impl(&impls[i]))
            continue;
        int outside = 0;
        for (int k = 0; k < n; k++) {
            const struct result *r = &job->runs[(size_t)k * N_IMPLS + i];
            const struct result *o = &job->runs[(size_t)k * N_IMPLS + N_IMPLS - 1];
            outside += !r->target_met;
            gp[k] = o->served > 0 ? r->served / o->served : 0;
            p99[k] = o->p99_s > 0 ? r->p99_s / o->p99_s : 0;
            p50[k] = o->p50_s > 0 ? r->p50_s / o->p50_s : 0;
        }
        double worst = gp[0];
        for (int k = 1; k < n; k++)
            worst = gp[k] < worst ? gp[k] : worst;
        struct bench_row row = bench_row_make(job->name, impls[i].name, 1);
        if (outside && !strcmp(impls[i].name, "discover")) {
            /* Which seeds missed, and where they locked: what to look at first. */
            fprintf(stderr, "  [robust] %s discover missed on seed(s):", job->name);
            for (int k = 0, shown = 0; k < n && shown < 12; k++) {
                const struct result *r = &job->runs[(size_t)k * N_IMPLS + i];
                if (!r->target_met && ++shown)
                    fprintf(stderr, " %d (%.0f)", k + 1, r->ceiling);
            }
            fputc('\n', stderr);
        }
        bench_row_extra(&row, "seeds", n);
        bench_row_extra(&row, "outside_band", outside);
        bench_row_extra(&row, "gp_median", bench_median(gp, (size_t)n));
        bench_row_extra(&row, "gp_worst", worst);
        bench_row_extra(&row, "p50_ratio", bench_median(p50, (size_t)n));
        bench_row_extra(&row, "p99_ratio", bench_median(p99, (size_t)n));
        bench_emit(&row);
    }
    free(gp);
    free(p99);
    free(p50);
}

/* The rows of the table, in order: queue, knee, reject, then the scenarios. */
static int robust_rows(struct scenario *rows)
{
    int n = 0;
    static const enum sim_mode modes[] = {SIM_QUEUE, SIM_KNEE, SIM_REJECT};
    for (size_t m = 0; m < 3; m++) {
        const uint32_t *caps = modes[m] == SIM_REJECT ? robust_reject_caps : robust_queue_caps;
        size_t n_caps = modes[m] == SIM_REJECT
                            ? sizeof robust_reject_caps / sizeof robust_reject_caps[0]
                            : sizeof robust_queue_caps / sizeof robust_queue_caps[0];
        for (size_t c = 0; c < n_caps; c++) {
            struct scenario sc = {.name = sim_mode_name(modes[m]), .mode = modes[m], .cap = caps[c]};
            rows[n++] = sc;
        }
    }
    /* Queue mode with streamed answers of lognormal length (sigma 1): the sample is the time
     * to first token (what a streamed chat reports), or the whole call, side by side. */
    for (size_t c = 0; c < sizeof robust_stream_caps / sizeof robust_stream_caps[0]; c++)
        for (int ttft = 1; ttft >= 0; ttft--)
            rows[n++] = (struct scenario){.name = ttft ? "queue_stream_ttft" : "queue_stream_whole",
                                          .mode = SIM_QUEUE,
                                          .cap = robust_stream_caps[c],
                                          .median_s = STREAM_TTFT_S,
                                          .answer_tokens = STREAM_TOKENS,
                                          .answer_sigma = STREAM_TOKENS_SIGMA,
                                          .token_s = STREAM_TOKEN_S,
                                          .sample_ttft = ttft};
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
        if (scenarios[k].target != TARGET_BAND)
            rows[n++] = scenarios[k];
    for (size_t k = 0; k < sizeof real_traffic / sizeof real_traffic[0]; k++)
        rows[n++] = real_traffic[k];
    return n;
}

static void discovery_robustness(const struct bench_opts *opts)
{
    struct scenario rows[ROBUST_MAX_ROWS];
    int n_rows = robust_rows(rows), seeds = robust_seeds(opts), threads = robust_threads();
    printf("  (%d seeds per row, %d threads; outside_band = seeds that missed the band or target)\n",
           seeds, threads);
    int64_t t0 = bench_now_ns();
    for (int r = 0; r < n_rows; r++) {
        struct robust_job *job = (struct robust_job *)calloc(1, sizeof *job);
        job->sc = rows[r];
        if (rows[r].target == TARGET_BAND)
            snprintf(job->name, sizeof job->name, "discovery.robust.%s_c%u", rows[r].name,
                     rows[r].cap);
        else
            snprintf(job->name, sizeof job->name, "discovery.robust.%s", rows[r].name);
        if (!bench_case_enabled(opts, job->name)) {
            free(job);
            continue;
        }
        job->seeds = seeds;
        job->runs = (struct result *)calloc((size_t)seeds * N_IMPLS, sizeof *job->runs);
        int64_t t_row = bench_now_ns();
        robust_run(job, threads);
        fprintf(stderr, "  [robust] row %d/%d %-34s %6.1f s (%.0f s so far)\n", r + 1, n_rows,
                job->name, (double)(bench_now_ns() - t_row) / 1e9,
                (double)(bench_now_ns() - t0) / 1e9);
        robust_emit(job);
        free(job->runs);
        free(job);
    }
}

BENCH_REGISTER(discovery_robust, discovery_robustness, true)

/* ---- Vector's adaptive-concurrency scenarios ---------------------------------- */

/* Vector's controller starts at its initial_concurrency (1) in its own
 * scenarios; the other peers at sluice's jumpstart, as in the table above. */
#define VECTOR_SEEDS 10
#define VECTOR_RUN_S 3600.0

/* The lowest ceiling discovery locked during a run (0 = none). */
static void vector_lock_event(void *ctx, const struct sluice_event *ev)
{
    uint32_t *lowest = (uint32_t *)ctx;
    if (ev->kind == SLUICE_EVENT_LOCK && ev->ceiling && (!*lowest || ev->ceiling < *lowest))
        *lowest = ev->ceiling;
}

struct vector_result {
    int met;
    uint32_t ceiling, lowest_lock; /* sluice rows: the lock at the end and the lowest taken */
    uint32_t limit;                /* the gate's limit at the end */
    double refused_share;          /* attempts deferred or timed out */
};

/* One run of `params` driven by `im` (a fixed limit when params->fixed). */
static struct vector_result vector_run(const struct vsim_scenario *sc,
                                       const struct vsim_params *params, const struct impl *im,
                                       uint64_t seed, FILE *log)
{
    struct vector_result r;
    memset(&r, 0, sizeof r);
    bool arc = im && im->peer_rule == vector_arc_sample;
    struct vsim *s = vsim_create(params, seed, arc ? 1 : JUMPSTART);
    struct sluice_discovery *disc = NULL;
    union any_policy storage;
    struct peer peer;
    memset(&peer, 0, sizeof peer);
    if (!params->fixed && im->kind == IMPL_SLUICE) {
        struct sluice_discovery_desc desc = bench_desc("cloud:vector", im, &storage,
                                                       vector_lock_event, &r.lowest_lock);
        disc = vsim_discovery(s, &desc);
    } else if (!params->fixed && im->kind == IMPL_PEER) {
        peer.gate = &s->gate;
        peer.limit = peer.applied = arc ? 1 : JUMPSTART;
        peer.on_sample = im->peer_rule;
        peer.round_us = true;
        struct sim_controller c = {&peer, peer_on_sample, NULL, NULL};
        s->ctl = c;
    }
    vsim_run(s, VECTOR_RUN_S);
    r.met = sc ? vsim_score(sc, s, log) : 0;
    r.limit = sluice_gate_limit(&s->gate);
    if (disc) {
        struct sluice_discovery_status st;
        sluice_discovery_snapshot(disc, &st);
        r.ceiling = st.ceiling;
    }
    r.refused_share = s->attempts ? (double)s->refused / (double)s->attempts : 0;
    sluice_discovery_destroy(disc);
    vsim_destroy(s);
    return r;
}

/* Per scenario file, placement and impl: expectations met on seed 1, and on
 * the worst of VECTOR_SEEDS seeds (SLUICE_BENCH_VERBOSE=1: the misses). */
static void vector_scenarios(const struct bench_opts *opts)
{
    static const char *const placements[] = {"hold", "attempt"};
    FILE *log = getenv("SLUICE_BENCH_VERBOSE") ? stderr : NULL;
    for (size_t k = 0; k < VSIM_N_SCENARIOS; k++) {
        const struct vsim_scenario *sc = &vsim_scenarios[k];
        for (int pl = 0; pl < 2; pl++) {
            char name[96];
            snprintf(name, sizeof name, "discovery.vector.%s.%s", sc->name, placements[pl]);
            if (!bench_case_enabled(opts, name))
                continue;
            struct vsim_params params = sc->params;
            params.placement = pl ? VSIM_ATTEMPT : VSIM_HOLD;
            for (size_t i = 0; i < N_IMPLS; i++) {
                if (params.fixed ? i != 0 : !robust_impl(&impls[i]))
                    continue;
                int first = 0, worst = VSIM_MAX_EXPECT;
                for (uint64_t seed = 1; seed <= VECTOR_SEEDS; seed++) {
                    if (log)
                        fprintf(log, "[%s %s seed %" PRIu64 "]\n", name, impls[i].name, seed);
                    struct vector_result r = vector_run(sc, &params, &impls[i], seed, log);
                    first = seed == 1 ? r.met : first;
                    worst = r.met < worst ? r.met : worst;
                }
                struct bench_row row =
                    bench_row_make(name, params.fixed ? "fixed10" : impls[i].name, 1);
                bench_row_extra(&row, "expected", vsim_n_expect(sc));
                bench_row_extra(&row, "met_seed1", first);
                bench_row_extra(&row, "met_worst", worst);
                bench_row_extra(&row, "fair", sc->fair);
                bench_emit(&row);
            }
        }
    }
}

/* A rate limit of 100 attempts a second (refused ones count), 0.1 s calls
 * (R·L = 10), retrying clients, an hour's worth of calls: every seed's lock
 * inside [0.8, 1.25]·R·L and none ever below. Retries in lockstep (constant
 * latency, no jitter) and jittered (JitterMode::Full). */
static void vector_rate_retrying(const struct bench_opts *opts)
{
    static const char *const modes[] = {"lockstep", "jittered"};
    int seeds = robust_seeds(opts) < 30 ? robust_seeds(opts) : 30;
    for (int j = 0; j < 2; j++)
        for (int pl = 0; pl < 2; pl++) {
            char name[96];
            snprintf(name, sizeof name, "discovery.vector.rate_retrying_%s.%s", modes[j],
                     pl ? "attempt" : "hold");
            if (!bench_case_enabled(opts, name))
                continue;
            struct vsim_params params = {.requests = 60000, .delay_s = 0.1,
                                         .rate = {.limit = 100}, .retry_jitter = j == 1,
                                         .placement = pl ? VSIM_ATTEMPT : VSIM_HOLD};
            for (size_t i = 0; i < N_IMPLS; i++) {
                if (!robust_impl(&impls[i]))
                    continue;
                int outside = 0;
                uint32_t low = UINT32_MAX, high = 0;
                double refused = 0;
                for (int k = 0; k < seeds; k++) {
                    struct vector_result r = vector_run(NULL, &params, &impls[i], 1 + (uint64_t)k,
                                                        NULL);
                    uint32_t at = r.ceiling ? r.ceiling : r.limit;
                    bool ok = at >= 8 && at <= 12.5 && (!r.lowest_lock || r.lowest_lock >= 8);
                    if (!ok && !strcmp(impls[i].name, "discover"))
                        fprintf(stderr, "  [vector] %s discover seed %d: at %u, lowest lock %u\n",
                                name, k + 1, at, r.lowest_lock);
                    outside += !ok;
                    low = at < low ? at : low;
                    high = at > high ? at : high;
                    refused += r.refused_share / seeds;
                }
                struct bench_row row = bench_row_make(name, impls[i].name, 1);
                bench_row_extra(&row, "seeds", seeds);
                bench_row_extra(&row, "outside_band", outside);
                bench_row_extra(&row, "lowest", low);
                bench_row_extra(&row, "highest", high);
                bench_row_extra(&row, "refused_share", refused);
                bench_emit(&row);
            }
        }
}

static void discovery_vector(const struct bench_opts *opts)
{
    vector_scenarios(opts);
    vector_rate_retrying(opts);
}

BENCH_REGISTER(discovery_vector, discovery_vector, true)
