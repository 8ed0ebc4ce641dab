/*
 * sluice/policy/discover.h — the default ceiling-discovery policy.
 *
 * What it is: a congestion controller tuned for remote model providers,
 * whose concurrency cap is hidden and whose calls take seconds. Where the
 * provider refuses (429/503/timeouts), refusals say where the cap is and
 * latency is only a backstop. Where it queues or slows down instead, only
 * latency can say it, and this policy reads latency the way BBR reads a
 * path: against a queue-immune estimate of the no-queue latency, with
 * Little's law (concurrency = throughput x latency) to turn rates into caps.
 *
 * What each signal is evidence of, and the rule that uses it (predict a new
 * provider from this table):
 *   a refusal (429/503, a provider timeout) started with n calls in flight
 *            The provider was over its cap when that call arrived: C < n.
 *            It cuts to backoff·n (sluice_window_struck), one cut per burst:
 *            refusals whose n the limit no longer allows are echoes of the
 *            same overshoot (discovery.h freshness). Where n is one above
 *            the level clean windows proved (`proved`, below), the cut goes
 *            to that level, not under it: C = n - 1. The bracket stays on
 *            limits: under load the client's count runs a call or two below
 *            the provider's (a slot is freed a moment after the client has
 *            its answer). Not where calls were just served with n or more
 *            in flight: then it is no concurrency cap (a rate window refuses
 *            at any n) and the cut goes from the limit the call started
 *            under, never below backoff times what the provider serves
 *            (Little: its completion plateau times s0). How long it took
 *            says more: back within a quarter of s0 (..._DOOR_SHARE), it was
 *            refused at the door, a cap's edge even where the served calls'
 *            counts blur with it (over HTTP, by the answers in transit), and
 *            a level in doubt just under it is measured where it stands (a
 *            re-measure cut 22 to 8 under a cap of 24, callers waiting); one
 *            that took about a call came from a queue, whose knee may lie
 *            below (a gateway's `timeout queue`), and s0 is probed.
 *   refusals at or below a level clean windows just served
 *            Not a cap: a cap refuses only above itself, and that level
 *            (`proved`: saturated, no refusal, no queue to be seen) was
 *            served without one. A rate window does it: after a burst of
 *            ours it refuses every call at any level, retries included,
 *            until it slides. So a window that served nothing, refused a
 *            whole round (as many as the limit) at or below `proved`,
 *            holds; and within a rate window of our last burst (the limit
 *            coming down, or such a round) no cut goes below
 *            backoff·proved, so the bracket, and the lock under it, stay
 *            there. What ends it: a limit steady for longer than a rate
 *            window had no burst to echo; a run of refusals older than
 *            SLUICE__DISCOVER_RATE_RUNS windows is a cap's; a refused call
 *            that started inside the window that proved the level (a
 *            timeout surfaces late) unproves it; and refusals in windows
 *            that served calls lower `proved` to where they struck. A cap
 *            that really fell still serves what it takes and refuses
 *            steadily: those windows cut as before. (Without it, retries
 *            against 100 calls/s at 0.1 s locked at 5, now 9.)
 *   latency of a level against s0 (the no-queue latency)
 *            x = ln(mean/s0) > ln(1 + knee) means calls queue there: that
 *            level is not a ceiling, whether or not refusals came later
 *            (a gateway queues first, then refuses past its queue timeout).
 *            So under a refusal bracket a level in doubt is measured again,
 *            and the bracket's last step is never locked in doubt.
 *   latency against calls in flight inside one window (its line)
 *            A window that has just opened starts its calls at 1, 2, ...
 *            up to the limit. At the lowest level seen, in slow start, a
 *            slope SLUICE__DISCOVER_BELOW_Z standard errors clear that
 *            puts the level past twice one call's fitted latency says the
 *            jumpstart was past the knee already (a slow link): a brief
 *            probe below it (sluice__discover_steep). The line predicts the
 *            probe is faster; where the level it left goes on against what
 *            the probe measured (noise drew it: a few lucky calls at 1-4),
 *            it goes back there at once, still in slow start; otherwise
 *            slow start grows from the probe. Nothing else uses the line:
 *            once the limit holds, every call starts at it.
 *   calls in flight against the calls the completions explain
 *            A saturated window's completions per second times their mean
 *            duration is how many of its calls in flight were calls that
 *            finish (Little's law). Lingering permits aside, the others
 *            held their permits past the window: dropped and waiting out a
 *            timeout, retried inside the permit (a client with its own
 *            retry loop, Vector's placement), queued past the window. None
 *            of them is measured (each reports after its window closed),
 *            so the window's latency is the fast calls' alone. Under
 *            SLUICE__DISCOVER_STUCK_SHARE of them explained (and only of
 *            calls still out when it closed: a node that runs none of its
 *            own, a fleet's leader, has no such evidence), the window is
 *            not measured and the limit holds; a second such window in a
 *            row makes the level a knee, cut to what the completions
 *            explain, no lock above it. One window alone is no evidence:
 *            a quiet spell inside it, or streamed answers with a long tail,
 *            dip under the share a window at a time. Without it, slow start
 *            ran to 170 against a server that drops calls past 5, behind a
 *            client that retries them inside its permit (Vector's
 *            `drops-at-high-concurrency`).
 *   throughput (completions per second) and Little's law
 *            rate·s0 is the concurrency the provider recently served: a
 *            refusal at or below it, while the pace holds, is a rate
 *            window's echo (hold); past a knee throughput falls, so a
 *            latency lock goes to the level that served most.
 *   a call its caller's deadline cut at t (SLUICE_OUTCOME_CENSORED)
 *            The provider took it, and it takes longer than t: not an
 *            overload. It is measured with the served calls, at t, so a
 *            level's mean is a restricted mean (sluice_window.n_censored
 *            says why that compares levels fairly) and the window holds
 *            enough calls to be judged: a provider that refuses nothing and
 *            whose latency does not grow with the limit grows to its cap
 *            even when most calls are cut. Where the provider may keep
 *            running it, the pool keeps its permit lingering
 *            (sluice/pool_linger.h), so the calls in flight that the next refusal
 *            is judged by stay true.
 *   a call its caller cancelled
 *            Says nothing (an ignored sample); lingering as above.
 *
 * State: what it remembers, and why.
 *   levels   Per recent limit (12 of them; the least-measured one makes
 *            room): the served calls measured there and their mean, pooled
 *            over every window at that limit, forgotten with time constant
 *            memory_s. Pooling is what makes small caps tractable: one
 *            window at limit 8 holds ~16 calls, whose mean is good to ~10%,
 *            too coarse to tell 8 from 10 (+25% in a queue); a few are not.
 *   s0       The no-queue latency. At first the lowest limit's mean: a
 *            windowed min over limits (BBR's RTprop, by limit rather than by
 *            time), since queueing only grows with the limit. Once Little's
 *            estimate of the cap exists (below), the pooled mean of every
 *            level that passed at or below 3/4 of it, which no cap within
 *            25% of the estimate can make queue. It is "sampled" once
 *            reference_samples calls stand behind it (SE ~3.7% at 128).
 *   probe    While s0 is not sampled and a level is in doubt, or after the
 *            first cut for latency, the limit drops to the top of that pool
 *            (at least half the level, never below the lowest limit seen
 *            unless that level's line said so, above) until it is: a
 *            brief low-concurrency probe, as Envoy's minRTT
 *            window and BBR's PROBE_RTT do. In slow start a level gets a
 *            second window before it is doubted that far, and the probe
 *            ends as soon as the level would go on against the reference
 *            measured so far (x <= t + se, below): the doubt was only the
 *            reference's, and slow start resumes. Against a provider that
 *            refuses rather than queues, the first levels are all the probe
 *            can cost, and at C = 200 it cost a minute at the jumpstart.
 *            A probe no proven queue asked for (a re-measure of a level
 *            in doubt) is brief and spaced (SLUICE__DISCOVER_REMEASURE_*),
 *            and none runs under a refusal bracket while deadlines cut
 *            calls, or under one made at the door (the refusals already
 *            bound the cap): with callers waiting, each window of a
 *            halved limit costs half the provider's capacity, and at the
 *            pace of long calls the reference takes tens of seconds to
 *            fill (1.3 s streams under a cap of 8: 8 -> 5 for 45 s).
 *   rate     Completions per second: an average over ~4 latencies, its
 *            windowed max over ~20 (BBR's BtlBw) and the pace over half
 *            of one (at least a second, the usual rate-limit window).
 *            max x s0 is, by Little's law, the concurrency the provider
 *            recently served: its cap when it refuses the rest, R·s0 for a
 *            rate limit.
 *   est      The estimate the last latency cut carried; discovery locks no
 *            higher (discovery.h, "Lock criterion").
 *   proved   The highest limit a saturated window served without a refusal
 *            and without a queue (a pass, or slow start going on), lowered
 *            to where refusals struck in windows that served calls: the
 *            level refusals at or below are a rate's, not a cap's (above).
 *
 * Per window (discovery closes one per operating point, see discovery.h):
 *   refusal  A fresh 429/503/timeout cuts as the table above says (a
 *            timeout surfaces a second later, after the limit moved on, so
 *            it counts by the limit it started under; see discovery.h). A
 *            refusal at a limit the provider demonstrably serves (at most
 *            0.95·rate_max·s0, or a cut that would not go below it) is the
 *            echo of an older burst of ours inside its rate window: hold,
 *            for at most a second (or half a latency) of refusals in a row,
 *            dated from the start of the window they began in; a limit
 *            steady for longer than a rate window had no burst, so its
 *            refusals are news at once (a cap cut from 52 to 20 costs no
 *            more 429s than without the hold). A cap that really came down
 *            keeps refusing past the hold and serves less, so the pace
 *            falls and the cuts go on. (A Retry-After becomes discovery's
 *            hold.)
 *   stuck    Calls in flight the completions do not explain, as the table
 *            above says: the window is not pooled (its mean is the fast
 *            calls'); it holds, or on the second in a row a LATENCY verdict.
 *   latency  The window is pooled into its level (the limit, or the peak in
 *            flight when demand fell short), then the level is tested:
 *            x = ln(mean/s0) against t = ln(1 + knee), with se the standard
 *            error of x (both means). x > t + noise_z·se: queueing, a
 *            LATENCY verdict (the bracket moves here), cut to the highest
 *            level that passed below (at least limit·knee_floor) or to a
 *            probe. x <= t and x + 2·se <= ln(1 + 1.5·knee): the level
 *            passes. Anything else is doubt: hold and pool; after `confirm`
 *            windows of doubt at one level, x > t + se/2 is queueing and
 *            the rest passes; just under refusals that came back at the
 *            door, all of it passes. Those refusals bound the cap, a queue
 *            under them that latency can show is past the noise in some
 *            window (the test above), and what the tie-break adds there is
 *            a small reference's noise, whose probe halves the limit (over
 *            HTTP, 11 under a streaming cap of 12, where latency never
 *            moves, read 32% over the 21 calls of the jumpstart's window:
 *            1.4 standard errors past the knee, and a probe at 5). Refusals
 *            that took a call's time (a gateway's `timeout queue`) keep the
 *            tie-break: a queue stands under them. A level past the noise
 *            is doubt as well while a level above it passed with a lower
 *            mean: no queue is slower at fewer calls, so that rise is a
 *            stall (of this machine or the provider's) until `confirm`
 *            windows keep it. So is the rise of a level that asked for a
 *            probe of s0 and comes back with a window that shows no queue,
 *            at under half its pooled mean: that window replaces its calls
 *            (sluice__discover_stale).
 *            Under a refusal bracket a level under the knee passes without
 *            the upper bound, and one in doubt just under where they
 *            struck is measured where it stands until `confirm` decides;
 *            while deadlines cut calls there, a knee against a reference
 *            not yet sampled is doubt too (no probe: the refusals bound
 *            the cap), and just under where they struck so is a knee on
 *            the level's first window alone: a second must show it again
 *            before the probe halves the limit with callers waiting (a
 *            window of ~20 calls against a reference of ~20 reads past
 *            the noise by chance), and that probe is brief, then the level
 *            is measured again; at the locked ceiling doubt passes at
 *            once (only refusals lower a lock).
 *   lock     Just below a latency bracket the first stable window locks
 *            (discovery.h). The policy lets that happen only on a level
 *            that passed with the last cut's estimate at or above it;
 *            otherwise it calls the level queueing, which brings the
 *            bracket down to a level that did pass. So a latency lock is
 *            always on a measured limit. The estimate is the highest limit
 *            that passed, or the one below it whose throughput (limit/mean,
 *            one SE low) was highest: past a knee, throughput falls, and
 *            the cap is its peak. So before that lock the level just below
 *            is measured if nothing has been (discovery does not lock on a
 *            window whose verdict steps down), and the lock goes to the
 *            one of the two that served more calls per second (at small
 *            limits only, where one level is a coarse step:
 *            SLUICE__DISCOVER_COARSE_STEP).
 *   growth   A passing, saturated window doubles the limit in slow start
 *            (bounded by the calls it served). After that, half way to
 *            discovery's probe cap (a bisection between the highest level
 *            that passed and the lowest that queued, +1 at the edge), or
 *            +limit/4 with no bracket.
 *   drain    The first window after the limit came down measures calls that
 *            waited behind the old queue: it counts for nothing.
 *
 * Measured by the robustness table of sluice-bench --only-discovery (300
 * seeds per row; bench/RESULTS.md has the table). Known limits: against a fast
 * provider (calls well under a second) a cap that falls looks like a rate
 * limit's echo for up to a second, and costs that second of 429s; and at
 * small caps in queue and knee mode, about 1 seed in 100 locks just outside
 * [0.8·C, 1.25·C], where one level is within the latency test's noise.
 *
 * Progress, concurrency and memory ordering: see sluice/policy.h — called
 * only under the owning discovery's update lock, which orders each call
 * after the previous one; plain state, no atomics, never blocks.
 */
#ifndef SLUICE_POLICY_DISCOVER_H
#define SLUICE_POLICY_DISCOVER_H

#include "../policy.h"

/* ---- the control law's constants, each with its reason ------------------- */

/* memory_s is in seconds, the clocks in ns. */
#define SLUICE__DISCOVER_NS_PER_S 1e9
/* A level whose decayed weight is under one call is forgotten (its slot is free). */
#define SLUICE__DISCOVER_LEVEL_MIN_N 1.0f
/* s0 pools the levels that passed at or below 3/4 of Little's estimate of
 * the cap: a cap within 25% of the estimate cannot make them queue. A probe
 * of s0 aims at the same share of its target. */
#define SLUICE__DISCOVER_REF_SHARE 0.75
/* A probe of s0 goes no lower than half its target (or half the level in
 * doubt): low enough to be queue-free, high enough to keep serving. */
#define SLUICE__DISCOVER_PROBE_FLOOR 0.5
#define SLUICE__DISCOVER_PROBE_DIVISOR 2u /* the same half, of an integer level */
/* While deadlines cut calls, a re-measure (a probe of s0 no proven queue asked for) holds
 * at most this many judged windows, the next one waits that times ..._SPACING: callers
 * behind a halved limit pay for each (one held 9 under a cap of 24 for 9 of 12 s). Without
 * cut calls it runs until s0 is sampled (bounded, 9 seeds in 100 locked above the band). */
#define SLUICE__DISCOVER_REMEASURE_WINDOWS 3u
#define SLUICE__DISCOVER_REMEASURE_SPACING 2u
/* A refusal back within this share of s0 was made at the door, not after a queue. */
#define SLUICE__DISCOVER_DOOR_SHARE 0.25
/* The rate: an average over about 4 latencies. */
#define SLUICE__DISCOVER_RATE_LATENCIES 4.0
/* Its windowed max over about 20 latencies (BBR's BtlBw filter), so a
 * plateau outlives the cuts that follow it ... */
#define SLUICE__DISCOVER_PLATEAU_LATENCIES 20.0
/* ... taken only once the average spans 2 latencies (one window is noise). */
#define SLUICE__DISCOVER_RATE_MIN_LATENCIES 2.0
/* The pace: an average over half a latency, so a cap that fell shows soon ... */
#define SLUICE__DISCOVER_PACE_LATENCIES 0.5
/* ... but over at least a second: a rate limit refuses in bursts until its
 * window (typically a second) slides, and a pace over less reads each burst
 * as a cap that fell. Also the shortest life of a rate limit's echo. */
#define SLUICE__DISCOVER_RATE_WINDOW_NS 1e9
/* The pace keeps up with the plateau at 80% of it: the provider still
 * serves what it did (rates are noisy; a cap that fell serves far less). */
#define SLUICE__DISCOVER_PACE_HOLDS 0.8
/* A refusal at up to 95% of what the provider serves is an echo: a 5%
 * margin, since rate_max is a max of noisy rates. */
#define SLUICE__DISCOVER_ECHO_MARGIN 0.95
/* An echo dies out once the rate window slides: half a latency for slow
 * calls, at least SLUICE__DISCOVER_RATE_WINDOW_NS. */
#define SLUICE__DISCOVER_ECHO_LATENCIES 0.5
/* A run of refusals at or below the proved level older than this many echo
 * spans is a cap's, not a rate window's (which a slide or two ends). */
#define SLUICE__DISCOVER_RATE_RUNS 3.0
/* sqrt(pi/2): mean absolute deviation -> standard deviation (normal). */
#define SLUICE__DISCOVER_MAD_TO_SIGMA 1.2533141373155
/* Gain of the cv² EWMA: 1/8, about eight windows of memory. */
#define SLUICE__DISCOVER_CV2_GAIN 0.125
/* One level is a coarse step when limit·knee <= 4, i.e. the step 1/limit
 * is at least a quarter of the knee (at C = 12, one above the cap costs 7%):
 * only there does the last step compare throughput with the level below. */
#define SLUICE__DISCOVER_COARSE_STEP 4.0
/* A pass: SLUICE__DISCOVER_PASS_Z standard errors below ln(1 + 1.5·knee),
 * so a level passes only when even its noisy mean is clear of the knee. */
#define SLUICE__DISCOVER_PASS_Z 2.0
#define SLUICE__DISCOVER_PASS_KNEES 1.5
/* After `confirm` windows of doubt, a rise past half a standard error
 * above the knee is queueing: the estimate is all the evidence there is
 * (not just under refusals at the door: sluice__discover_test). */
#define SLUICE__DISCOVER_CONFIRM_Z 0.5
/* Windows of doubt slow start measures a level for before it probes s0:
 * two windows of noise rarely agree. */
#define SLUICE__DISCOVER_SLOW_START_DOUBTS 2u
/* A first level past twice one call's fitted latency (a queue as long as the service) ... */
#define SLUICE__DISCOVER_BELOW_RISE 1.0
/* ... on a slope this many standard errors clear of 0 (one ramp's few calls, a lognormal
 * tail: at 2, 2 seeds in 30 of every queue, knee and reject row stepped below on noise). */
#define SLUICE__DISCOVER_BELOW_Z 2.5
/* A level's pooled calls are a stall's only this many standard errors above a fresh window
 * (sluice__discover_stale). */
#define SLUICE__DISCOVER_STALE_Z 3.0
/* Growth after slow start: half way to the probe cap (a bisection) ... */
#define SLUICE__DISCOVER_BISECT 2u
/* The share of the calls in flight a saturated window's completions must explain (Little:
 * their rate times their mean duration) for its level to be judged by its latency; below
 * it, most permits were held by calls that outlasted the window (sluice__discover_stuck). */
#define SLUICE__DISCOVER_STUCK_SHARE 0.35
#define SLUICE__DISCOVER_STUCK_RUN 2u /* windows in a row; the first holds */
/* ... or, with no bracket, a quarter of the limit. */
#define SLUICE__DISCOVER_GROWTH_DIVISOR 4u

struct sluice_policy_discover_params {
    double backoff;       /* factor applied on a fresh overload, in (0, 1) (default: 0.9) */
    double knee;          /* latency rise over the no-queue latency that means queueing,
                             in (0, 100] (default: 0.14, i.e. +14%) */
    double knee_floor;    /* deepest single cut on a knee, as a share of the limit, in (0, 1)
                             (default: 0.25) */
    double noise_z;       /* standard errors a rise must clear to count as queueing at once,
                             in (0, 100] (default: 2) */
    double memory_s;      /* time constant, in seconds, of the per-limit statistics, in
                             (0, 1e7] (default: 1800) */
    uint32_t confirm;     /* windows of doubt at one limit before the estimate decides,
                             in [1, 1000] (default: 4) */
    uint32_t min_samples; /* served calls a window needs before its latency counts,
                             in [1, 65536] (default: 8) */
    uint32_t reference_samples; /* calls behind s0 before it is trusted to test the limits
                             near the cap, in [1, 1e6] (default: 128) */
};

/* One remembered operating point. */
struct sluice__discover_level {
    uint32_t limit;   /* 0 = free slot */
    uint8_t passed;   /* its latency passed the test (1), or not yet or queued (0) */
    uint8_t stale;    /* its rise asked for a probe of s0: the next window here may replace
                         its calls (sluice__discover_stale) */
    uint16_t doubts;  /* windows in a row its test neither passed nor queued */
    float n;          /* served calls behind the mean, decayed */
    float mean_ns;    /* their mean latency */
};

#define SLUICE__DISCOVER_LEVELS 12

struct sluice_policy_discover {
    struct sluice_policy base; /* pass &p.base to discovery */
    struct sluice_policy_discover_params params;
    bool slow_start;
    uint32_t at;         /* the limit of the last window seen */
    uint32_t probing;    /* the limit of a running probe of s0 (0 = not probing) */
    uint32_t resume;     /* the limit that probe returns to (0 = grow from the probe) */
    uint32_t steep;      /* the level a probe below the jumpstart left (0 = none): back to
                            it once it goes on against what the probe measured */
    uint32_t remeasure_left;  /* judged windows a brief re-measure may still hold (0 = the
                                 probe runs until s0 is sampled) */
    uint32_t windows;         /* windows seen */
    uint32_t remeasure_after; /* no re-measure starts before this many windows: one ended */
    uint32_t compared;   /* the limit whose lock lost to the level below it on throughput
                            (0 = none): that level locks without another comparison */
    uint32_t settled;    /* the limit that passed just below the bracket (latency's or
                            refusals'): discovery locked there, so the last-step rule no longer
                            applies and doubt there passes (0 = none) */
    uint32_t est;        /* the estimate the last latency cut carried (discovery locks no
                            higher); 0 = the bracket came from a refusal, or none yet */
    uint32_t stuck;      /* judged windows in a row whose completions explained too few of
                            their calls (sluice__discover_stuck) */
    int64_t last_ns;     /* end of the last window seen (0 = none) */
    double cv2;          /* squared coefficient of variation of latency */
    bool cv2_known;      /* cv2 was measured (a provider without noise measures 0) */
    double rate_n, rate_ns; /* completions and time, decayed: rate = rate_n / rate_ns */
    double rate_max;     /* windowed max of that rate, per ns: the throughput plateau */
    int64_t echo_ns;     /* when the run of refusals began: the start of the window it began
                            in (0 = none since the last window without a fresh refusal) */
    double now_n, now_ns; /* the same over about one latency: the current pace */
    uint32_t struck;     /* where the last refusals that cut struck, when they struck above
                            every served call or at the door (0 = none): a level in doubt
                            just below is bounded by refusals, not by latency */
    bool struck_door;    /* ... and they came back at the door, in a time that was measured
                            (sluice__discover_test) */
    uint32_t proved;     /* the highest limit a clean, saturated, queue-free window served
                            at, lowered to where refusals struck while calls were served
                            (0 = none) */
    int64_t quiet_ns;    /* the end of the last window refused whole that held (0 = none) */
    int64_t down_ns;     /* the start of the last window whose limit was below the one before */
    int64_t proved_ns;   /* the end of the window that proved it: a refusal of a call that
                            started before then was that window's own (a timeout surfaces
                            late), so the level was never clean */
    struct sluice__discover_level levels[SLUICE__DISCOVER_LEVELS];
};

SLUICE_INLINE uint32_t sluice__discover_reset(struct sluice_policy *self, uint32_t jumpstart,
                                              bool warm)
{
    struct sluice_policy_discover *p = (struct sluice_policy_discover *)self;
    p->slow_start = !warm;
    p->at = p->probing = p->resume = p->steep = p->compared = p->settled = p->est = 0;
    p->remeasure_left = p->windows = p->remeasure_after = p->proved = p->struck = 0;
    p->stuck = 0;
    p->struck_door = false;
    p->last_ns = p->echo_ns = p->proved_ns = p->quiet_ns = p->down_ns = 0;
    p->cv2 = 0;
    p->cv2_known = false;
    p->rate_n = p->rate_ns = p->rate_max = 0;
    p->now_n = p->now_ns = 0;
    memset(p->levels, 0, sizeof p->levels);
    return jumpstart;
}

/* Forget with time: every level's weight decays by exp(-dt / memory_s). */
SLUICE_INLINE void sluice__discover_decay(struct sluice_policy_discover *p, int64_t now)
{
    if (p->last_ns && now > p->last_ns) {
        double memory_ns = p->params.memory_s * SLUICE__DISCOVER_NS_PER_S;
        double f = exp(-(double)(now - p->last_ns) / memory_ns);
        for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
            struct sluice__discover_level *l = &p->levels[i];
            l->n = (float)(l->n * f);
            if (l->limit && l->n < SLUICE__DISCOVER_LEVEL_MIN_N)
                l->limit = 0;
        }
    }
    p->last_ns = now;
}

SLUICE_INLINE struct sluice__discover_level *sluice__discover_find(struct sluice_policy_discover *p,
                                                                   uint32_t limit)
{
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++)
        if (p->levels[i].limit == limit)
            return &p->levels[i];
    return NULL;
}

/* Pool a window into its limit's level (a free slot, or the least-weighted one). */
SLUICE_INLINE struct sluice__discover_level *
sluice__discover_pool(struct sluice_policy_discover *p, uint32_t limit, double n, double mean)
{
    struct sluice__discover_level *l = sluice__discover_find(p, limit);
    if (!l) {
        l = &p->levels[0];
        for (int i = 1; i < SLUICE__DISCOVER_LEVELS && l->limit; i++)
            if (!p->levels[i].limit || p->levels[i].n < l->n)
                l = &p->levels[i];
        l->limit = limit;
        l->passed = 0;
        l->stale = 0;
        l->doubts = 0;
        l->n = 0;
        l->mean_ns = 0;
    }
    double total = (double)l->n + n;
    l->mean_ns = (float)(((double)l->n * l->mean_ns + n * mean) / total);
    l->n = (float)total;
    return l;
}

/* The highest limit that passed, below `below` (0 = no bound); 0 = none. */
SLUICE_INLINE uint32_t sluice__discover_lo(const struct sluice_policy_discover *p, uint32_t below)
{
    uint32_t lo = 0;
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *l = &p->levels[i];
        if (l->limit && l->passed && (!below || l->limit < below) && l->limit > lo)
            lo = l->limit;
    }
    return lo;
}

/* Little's law: the cap is the most concurrency any level was served at,
 * X·s0 = limit·s0/mean (the throughput plateau times the no-queue latency).
 * Each level's figure is taken one standard error low, so the maximum over
 * levels does not reward the luckiest few calls. */
SLUICE_INLINE double sluice__discover_little(const struct sluice_policy_discover *p, double s0)
{
    double best = 0, cv = sqrt(p->cv2);
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *l = &p->levels[i];
        if (l->limit && l->n >= (float)p->params.min_samples && l->mean_ns > 0) {
            double k = (double)l->limit * s0 / l->mean_ns * (1.0 - cv / sqrt((double)l->n));
            best = k > best ? k : best;
        }
    }
    return best;
}

/* The limit below `below` that served the most calls per second (Little: limit/mean, one
 * standard error low); 0 = none. Past a knee, the cap; on a queue's plateau, any level on it. */
SLUICE_INLINE uint32_t sluice__discover_best(const struct sluice_policy_discover *p, uint32_t below)
{
    double best = 0, cv = sqrt(p->cv2);
    uint32_t at = 0;
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *l = &p->levels[i];
        if (l->limit && l->limit < below && l->n >= (float)p->params.min_samples &&
            l->mean_ns > 0) {
            double x = (double)l->limit / l->mean_ns * (1.0 - cv / sqrt((double)l->n));
            if (x > best) {
                best = x;
                at = l->limit;
            }
        }
    }
    return at;
}

/* The no-queue latency and the calls behind it. */
struct sluice__discover_ref {
    double mean_ns, n;
    uint32_t top;  /* the highest limit pooled into it */
    bool sampled;  /* n >= reference_samples */
};

/* s0 ("State" at the top): the lowest limit's mean, then the pool of the levels that passed
 * at or below 3/4 of Little's estimate of the cap. */
SLUICE_INLINE const struct sluice__discover_level *
sluice__discover_lowest(const struct sluice_policy_discover *p)
{
    const struct sluice__discover_level *lowest = NULL;
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *l = &p->levels[i];
        if (l->limit && (!lowest || l->limit < lowest->limit))
            lowest = l;
    }
    return lowest;
}

/* The highest limit pooled into s0: 3/4 of Little's estimate of the cap. */
SLUICE_INLINE double sluice__discover_ref_bound(const struct sluice_policy_discover *p)
{
    const struct sluice__discover_level *lowest = sluice__discover_lowest(p);
    return lowest ? SLUICE__DISCOVER_REF_SHARE * sluice__discover_little(p, lowest->mean_ns) : 0;
}

SLUICE_INLINE struct sluice__discover_ref sluice__discover_s0(const struct sluice_policy_discover *p)
{
    struct sluice__discover_ref r = {0, 0, 0, false};
    const struct sluice__discover_level *lowest = sluice__discover_lowest(p);
    if (!lowest)
        return r;
    double bound = sluice__discover_ref_bound(p), sum = 0, n = 0;
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *l = &p->levels[i];
        if (l->limit && l->passed && (double)l->limit <= bound) {
            sum += (double)l->n * l->mean_ns;
            n += l->n;
            r.top = l->limit > r.top ? l->limit : r.top;
        }
    }
    if (n >= (double)lowest->n && n > 0) {
        r.mean_ns = sum / n;
        r.n = n;
    } else {
        r.mean_ns = lowest->mean_ns;
        r.n = lowest->n;
        r.top = lowest->limit;
    }
    r.sampled = r.n >= (double)p->params.reference_samples;
    return r;
}

/* Where to measure s0 afresh: at the top of the reference pool (so the probe
 * feeds it), below any sign of the cap, not below half of `target` nor
 * below the lowest limit measured. */
SLUICE_INLINE uint32_t sluice__discover_probe_level(const struct sluice_policy_discover *p,
                                                    double target)
{
    double bound = sluice__discover_ref_bound(p);
    double at = bound > 0 && bound < target ? bound : SLUICE__DISCOVER_REF_SHARE * target;
    if (at < SLUICE__DISCOVER_PROBE_FLOOR * target)
        at = SLUICE__DISCOVER_PROBE_FLOOR * target;
    /* Never below the lowest limit measured: that one is known to be clean
     * enough to have started from, and it has calls already. */
    const struct sluice__discover_level *lowest = sluice__discover_lowest(p);
    if (lowest && at < (double)lowest->limit && lowest->limit <= target)
        at = lowest->limit;
    return at < 1.0 ? 1u : sluice__sat_u32(at);
}

/* Fold the window's completions into the rate, its windowed max (BBR's BtlBw: a plateau
 * outlives the cuts that follow it) and the pace ("rate" at the top). */
SLUICE_INLINE void sluice__discover_rate(struct sluice_policy_discover *p,
                                         const struct sluice_window *w, double s0)
{
    double span = (double)(w->end_ns - w->start_ns);
    double lat = s0 > 0 ? s0 : (double)w->latency_mean_ns;
    if (span <= 0 || lat <= 0)
        return;
    double f = exp(-span / (SLUICE__DISCOVER_RATE_LATENCIES * lat));
    double pace = SLUICE__DISCOVER_PACE_LATENCIES * lat;
    if (pace < SLUICE__DISCOVER_RATE_WINDOW_NS)
        pace = SLUICE__DISCOVER_RATE_WINDOW_NS;
    double g = exp(-span / pace);
    p->now_n = p->now_n * g + w->n_served;
    p->now_ns = p->now_ns * g + span;
    p->rate_n = p->rate_n * f + w->n_served;
    p->rate_ns = p->rate_ns * f + span;
    double rate = p->rate_n / p->rate_ns;
    p->rate_max *= exp(-span / (SLUICE__DISCOVER_PLATEAU_LATENCIES * lat));
    if (p->rate_ns >= SLUICE__DISCOVER_RATE_MIN_LATENCIES * lat && rate > p->rate_max)
        p->rate_max = rate;
}

/* The concurrency the provider still serves at its plateau (Little: plateau rate times s0)
 * while the pace keeps up with it (a rate limit refusing a burst's echo); 0 once the pace
 * fell behind (a cap that came down serves less at once: each refusal is news) or unknown. */
SLUICE_INLINE double sluice__discover_served(const struct sluice_policy_discover *p, double s0)
{
    double now = p->now_ns > 0 ? p->now_n / p->now_ns : 0;
    return s0 > 0 && now >= SLUICE__DISCOVER_PACE_HOLDS * p->rate_max ? p->rate_max * s0 : 0;
}

/* The standard error of ln(a/b) for two means of `na` and `nb` calls. */
SLUICE_INLINE double sluice__discover_se(const struct sluice_policy_discover *p, double na,
                                         double nb)
{
    return sqrt(p->cv2 * (1.0 / na + 1.0 / nb));
}

/* Whether a rise x = ln(mean/s0) with standard error se is a queue past any noise. */
SLUICE_INLINE bool sluice__discover_queued(const struct sluice_policy_discover *p, double x,
                                           double se)
{
    return x > log1p(p->params.knee) + p->params.noise_z * se;
}

/* How far level `l` sits above the reference: x = ln(mean/s0), and the
 * standard error of x from both means (*se). 0 for a level inside the
 * reference pool, which is not under test. */
SLUICE_INLINE double sluice__discover_rise(const struct sluice_policy_discover *p,
                                           const struct sluice__discover_level *l,
                                           const struct sluice__discover_ref *ref, double *se)
{
    *se = 0;
    if (l->limit <= ref->top || ref->n <= 0 || l->n <= 0)
        return 0;
    *se = sluice__discover_se(p, (double)l->n, ref->n);
    return log((double)l->mean_ns / ref->mean_ns);
}

SLUICE_INLINE struct sluice_verdict sluice__discover_overload(struct sluice_policy_discover *p,
                                                              const struct sluice_window *w,
                                                              double s0)
{
    double backoff = p->params.backoff, served = sluice__discover_served(p, s0);
    /* Where the refusals struck (sluice_window_struck: the calls in flight
     * they started with, where that is evidence of a cap). */
    uint32_t struck = sluice_window_struck(w);
    double cut = (double)struck * backoff;
    /* The run of refusals dates from the start of the window it began in (the limit was
     * steady since): longer ago than a rate window, there is no burst of ours to echo. */
    if (!p->echo_ns)
        p->echo_ns = w->start_ns;
    if (w->overload_start_ns < p->proved_ns)
        p->proved = 0;
    /* Rate, not cap: a whole round refused with nothing served, at or below a level clean
     * windows just served, is a rate window after a burst: hold. A cap that fell still
     * serves what it takes, and those windows cut, lowering `proved` with them. */
    if (!w->n_served && w->n_overload >= w->limit && p->proved && struck <= p->proved) {
        p->quiet_ns = w->end_ns;
        return sluice__verdict_hold(w);
    }
    if (cut < backoff * served)
        cut = backoff * served;
    /* An echo dies out once the rate window slides; refusals that outlast
     * it are news, and they cut from the limit, as a cap that fell needs. */
    double span = SLUICE__DISCOVER_ECHO_LATENCIES * s0;
    if (span < SLUICE__DISCOVER_RATE_WINDOW_NS)
        span = SLUICE__DISCOVER_RATE_WINDOW_NS;
    /* Within a span of our last burst (the limit coming down, or a window refused whole) no
     * cut goes below backoff·proved: a rate window's refusals outlive the cut that answered
     * them. A run older than a few spans is a cap's (it refuses while the limit is above). */
    int64_t since = p->quiet_ns > p->down_ns ? p->quiet_ns : p->down_ns;
    bool explained = (double)(w->end_ns - since) < span &&
                     (double)(w->end_ns - p->echo_ns) < SLUICE__DISCOVER_RATE_RUNS * span;
    if (explained && cut < backoff * (double)p->proved)
        cut = backoff * (double)p->proved;
    /* Refused one above the level a clean window proved: the bracket closes there, so the
     * cut goes to it, not below (13 -> 11 under a streaming cap of 12 left 11 in doubt for
     * the rest of a 20 s run). */
    if (p->proved && struck == p->proved + 1u && cut < (double)p->proved)
        cut = (double)p->proved;
    /* Refused at a concurrency it serves: the echo of an older burst. */
    if (cut >= (double)w->limit || (double)struck <= SLUICE__DISCOVER_ECHO_MARGIN * served) {
        if (explained)
            return sluice__verdict_hold(w);
        cut = (double)struck * backoff;
    }
    p->slow_start = false;
    p->est = 0;
    uint32_t next = cut < 1.0 ? 1u : (uint32_t)cut;
    /* Refused where calls were served: that level is no longer proved. */
    if (w->n_served && p->proved > struck)
        p->proved = struck;
    /* A cap's edge: each refused call started above every served one (a gateway that queues
     * serves at the counts it refuses at), or came back at the door (the top, "a refusal"). */
    bool door = w->overload_latency_ns < SLUICE__DISCOVER_DOOR_SHARE * s0;
    p->struck = w->overload_in_flight > w->served_in_flight || door ? struck : 0;
    /* Only a refusal whose time is known says where it was made: a fleet member from before
     * its reports carried that time reports 0, and read as "at the door" its refusals let a
     * queue-then-503 gateway's doubt pass (a fleet locked its cap of 24 at 36 under ASan). */
    p->struck_door = door && w->overload_latency_ns > 0;
    return sluice_verdict_make(next,
                           w->retry_after_ns > 0 ? SLUICE_CAUSE_RETRY_AFTER : SLUICE_CAUSE_OVERLOAD,
                           0);
}

/* Refusals struck just above this level (at or above where their cut went): a level in
 * doubt is measured where it stands and `confirm` decides (a re-measure halved 11 under a
 * streaming cap of 12; passing outright locked 4 seeds in 30 at 14-16 over a cap of 10). */
SLUICE_INLINE bool sluice__discover_bounded(const struct sluice_policy_discover *p, uint32_t level)
{
    return p->struck > level && (double)(level + 1u) > (double)p->struck * p->params.backoff;
}

/* Queueing at level `l` (the window's limit, or its peak in flight): cut to
 * lo — or first to a probe of s0, when too few calls stand behind it. Just under
 * where refusals struck the probe is brief and the level is measured again after it:
 * the refusals bound the cap, and the probe's windows cost callers waiting half the
 * provider (against a streaming cap of 12, a knee at 11 read on a reference of 15
 * calls 2.5 standard errors fast held 5 until 128 calls at 5 stood behind it). */
SLUICE_INLINE struct sluice_verdict sluice__discover_knee(struct sluice_policy_discover *p,
                                                          const struct sluice_window *w,
                                                          struct sluice__discover_level *l,
                                                          const struct sluice__discover_ref *ref)
{
    l->passed = 0;
    l->doubts = 0;
    p->slow_start = false;
    p->probing = p->resume = p->steep = p->remeasure_left = 0;
    uint32_t lo = sluice__discover_lo(p, l->limit);
    double little = sluice__discover_little(p, ref->mean_ns);
    double floor = (double)w->limit * p->params.knee_floor;
    double target = lo ? (double)lo : little;
    if (w->limit == p->settled) /* at the lock: a transient, back off a little */
        target = (double)w->limit * p->params.backoff;
    else if (!ref->sampled) {
        uint32_t half = l->limit / SLUICE__DISCOVER_PROBE_DIVISOR;
        uint32_t at = sluice__discover_probe_level(p, target > half ? target : half);
        if (at < w->limit) {
            bool bounded = w->probe_cap && sluice__discover_bounded(p, l->limit);
            p->probing = at;
            p->resume = bounded ? l->limit : lo > at ? lo : 0;
            p->remeasure_left = bounded ? SLUICE__DISCOVER_REMEASURE_WINDOWS : 0;
            target = at;
        }
    }
    if (target < floor)
        target = floor;
    uint32_t next = sluice__sat_u32(target);
    if (next >= w->limit)
        next = w->limit - 1;
    if (next < 1)
        next = 1;
    if (p->probing) {
        p->probing = next;
        /* Queueing seen against a reference not yet sampled may be the
         * reference's own noise (a lucky-fast first level): while no
         * latency bracket stands, none is made from it, only the probe.
         * The level is tested again once the reference is sampled. A
         * bracket from noise held a cap of 200 at 8, on 1 seed in 1000. */
        if (!p->est) {
            l->stale = 1; /* sluice__discover_stale says why */
            return sluice_verdict_make(next, SLUICE_CAUSE_REMEASURE, 0);
        }
    }
    /* Discovery will lock no higher than this: the highest limit that passed,
     * or the one below it that served the most calls per second, if any did
     * (past a knee, throughput falls: the cap is its peak). */
    uint32_t best = lo ? sluice__discover_best(p, lo + 1) : 0;
    p->est = best && best < lo ? best : lo ? lo : w->limit > 1 ? w->limit - 1 : 1;
    return sluice_verdict_make(next, SLUICE_CAUSE_LATENCY, p->est);
}

/* A slow-start probe is done once the level it left would go on in slow start against the
 * reference so far (x <= t + se): the doubt was the reference's. Against a queue it is not,
 * and the probe runs until the reference is sampled. */
SLUICE_INLINE bool sluice__discover_goes_on(struct sluice_policy_discover *p, uint32_t limit,
                                            const struct sluice__discover_ref *ref)
{
    const struct sluice__discover_level *l = limit ? sluice__discover_find(p, limit) : NULL;
    if (!l || l->n < (float)p->params.min_samples || l->limit <= ref->top)
        return false;
    double se, x = sluice__discover_rise(p, l, ref, &se);
    return x <= log1p(p->params.knee) + se;
}

/* The window cannot be judged by latency: too few served calls, no latency,
 * no level (nothing ran), or the first window after the limit came down
 * (`drained` false: it measured calls that waited behind the old queue). */
SLUICE_INLINE bool sluice__discover_unjudged(const struct sluice_policy_discover *p,
                                             const struct sluice_window *w, uint32_t level,
                                             bool drained)
{
    return w->n_ok < p->params.min_samples || w->latency_mean_ns <= 0 || !level || !drained;
}

/* The window ran at the top of a bracket that refusals made (no latency estimate). */
SLUICE_INLINE bool sluice__discover_refusal_top(const struct sluice_policy_discover *p,
                                                const struct sluice_window *w)
{
    return w->probe_cap && w->limit == w->probe_cap && !p->est;
}

/* The verdict on a window nobody judged. A hold would let discovery lock the
 * refusal bracket's last step on it: step down one until the level has passed. */
SLUICE_INLINE struct sluice_verdict
sluice__discover_unjudged_verdict(struct sluice_policy_discover *p, const struct sluice_window *w)
{
    const struct sluice__discover_level *top = sluice__discover_find(p, w->limit);
    if (w->saturated && sluice__discover_refusal_top(p, w) && w->limit != p->settled &&
        w->limit > 1 && !(top && top->passed))
        return sluice_verdict_make(w->limit - 1, SLUICE_CAUSE_MEASURE_BELOW, 0);
    return sluice__verdict_hold(w);
}

/*
 * Level `l`, whose rise asked for a probe of s0, is back with a fresh window (n calls,
 * `mean`): are its pooled calls a stall's? Yes when the fresh window shows no queue by
 * itself against the s0 the probe sampled, and its mean is under half the pooled one, by
 * more than SLUICE__DISCOVER_STALE_Z standard errors. A stall of this machine or the
 * provider's makes every call in flight longer at once, and pooled over memory_s one stalled
 * window kept its level reading as a queue: three 60 ms stalls at 10 locked a reject cap of
 * 24 at 8, in 5 end-to-end runs of 12 (tests/e2e/curl_loop.c's reject test, an early staller
 * on the simulator, bench/early_stalls.py), now 0 of 26. A queue does not go away, and a
 * heavy tail (a few long calls) is noise the pool must keep: dropping the calls whenever the
 * fresh window merely passed biased s0 low (queue_stream_whole_c52 locked at 7, 5 seeds in 30
 * of the robustness table outside the band); with both bounds the table is unchanged.
 */
SLUICE_INLINE bool sluice__discover_stale(const struct sluice_policy_discover *p,
                                          const struct sluice__discover_level *l, double n,
                                          double mean)
{
    struct sluice__discover_ref ref = sluice__discover_s0(p);
    if (ref.n <= 0 || l->n <= 0 || !ref.sampled)
        return false;
    double apart = log((double)l->mean_ns / mean);
    return !sluice__discover_queued(p, log(mean / ref.mean_ns), sluice__discover_se(p, n, ref.n)) &&
           apart > log(2.0) && apart > SLUICE__DISCOVER_STALE_Z * sluice__discover_se(p, n, l->n);
}

/* Fold the window into the latency noise estimate (cv², an EWMA) and into its
 * level's pooled mean; return the level. */
SLUICE_INLINE struct sluice__discover_level *
sluice__discover_pool_window(struct sluice_policy_discover *p, const struct sluice_window *w,
                             uint32_t level)
{
    double mean = (double)w->latency_mean_ns, n = w->n_ok;
    double cv = SLUICE__DISCOVER_MAD_TO_SIGMA * (double)w->latency_mad_ns / mean;
    p->cv2 = p->cv2_known ? p->cv2 + (cv * cv - p->cv2) * SLUICE__DISCOVER_CV2_GAIN : cv * cv;
    p->cv2_known = true;
    struct sluice__discover_level *l = sluice__discover_find(p, level);
    if (l && l->stale) {
        l->stale = 0;
        if (sluice__discover_stale(p, l, n, mean)) {
            l->n = 0;
            l->passed = 0;
            l->doubts = 0;
        }
    }
    l = sluice__discover_pool(p, level, n, mean);
    /* A probe's level was chosen below any sign of the cap: it is the
     * reference being measured, not a level under test. */
    if (p->probing && level == p->probing)
        l->passed = 1;
    return l;
}

/* Just below a latency bracket, the first stable window locks (at no more
 * than the last cut's estimate): is this window that last step? */
SLUICE_INLINE bool sluice__discover_last_step(const struct sluice_policy_discover *p,
                                              const struct sluice_window *w)
{
    return w->saturated && p->est && w->probe_cap && w->limit == w->probe_cap &&
           w->limit != p->settled;
}

/* Before the last step locks ("lock" at the top): measure the level just below if nothing
 * has (true, the step in *v), and lower the estimate to the one that served more calls per
 * second. Once: the winner locks without a comparison of its own, or noise would walk the
 * lock down one level per round. */
SLUICE_INLINE bool sluice__discover_compare_below(struct sluice_policy_discover *p,
                                                  const struct sluice_window *w,
                                                  const struct sluice__discover_level *l,
                                                  struct sluice_verdict *v)
{
    if (!l->passed || w->limit <= 1 || w->limit + 1 == p->compared ||
        (double)w->limit * p->params.knee > SLUICE__DISCOVER_COARSE_STEP)
        return false;
    const struct sluice__discover_level *below = sluice__discover_find(p, w->limit - 1);
    if (!below || below->n < (float)p->params.min_samples) {
        *v = sluice_verdict_make(w->limit - 1, SLUICE_CAUSE_MEASURE_BELOW, 0);
        return true;
    }
    uint32_t best = sluice__discover_best(p, w->limit + 1);
    if (best && best < w->limit && best < p->est) {
        p->est = best;
        p->compared = w->limit;
    }
    return false;
}

/* What the latency test says of a level. */
enum sluice__discover_test {
    SLUICE__DISCOVER_PASS,  /* no queueing: the level passes */
    SLUICE__DISCOVER_DOUBT, /* above the knee, not beyond the noise: measure more */
    SLUICE__DISCOVER_QUEUE  /* queueing: a knee */
};

/* A level above `l` passed with a lower mean than l's: latency fell as concurrency rose,
 * which no queue does. l's rise is then noise until `confirm` windows say otherwise (a
 * provider that really slowed keeps its rise). The noise: stalls of this machine or the
 * provider's, every call in flight longer at once. With 50 ms ones now and then
 * (bench/gateway_stalls.py), a cap of 10 behind HAProxy read 9 as a queue after 10
 * passed, and locked at 7 in 2 probes of 36; with this rule 0 of 38 locked low. */
SLUICE_INLINE bool sluice__discover_faster_above(const struct sluice_policy_discover *p,
                                                 const struct sluice__discover_level *l)
{
    for (int i = 0; i < SLUICE__DISCOVER_LEVELS; i++) {
        const struct sluice__discover_level *h = &p->levels[i];
        if (h->limit > l->limit && h->passed && h->n >= (float)p->params.min_samples &&
            h->mean_ns < l->mean_ns)
            return true;
    }
    return false;
}

/* The latency test of level `l` (x = ln(mean/s0), standard error se): "Per window",
 * latency, at the top says what passes, queues and stays in doubt, and why. */
SLUICE_INLINE enum sluice__discover_test
sluice__discover_test(const struct sluice_policy_discover *p, const struct sluice_window *w,
                      struct sluice__discover_level *l, double x, double se, bool last_step,
                      bool refused, bool trusted)
{
    const struct sluice_policy_discover_params *k = &p->params;
    double threshold = log1p(k->knee);
    if (last_step && !(l->passed && p->est >= w->limit))
        return SLUICE__DISCOVER_QUEUE;
    if (sluice__discover_queued(p, x, se) &&
        !(l->doubts + 1u < k->confirm && sluice__discover_faster_above(p, l)))
        return SLUICE__DISCOVER_QUEUE;
    double upper = log1p(SLUICE__DISCOVER_PASS_KNEES * k->knee);
    if (trusted || (x <= threshold && (refused || x + SLUICE__DISCOVER_PASS_Z * se <= upper)))
        return SLUICE__DISCOVER_PASS;
    if (l->doubts + 1u >= k->confirm) {
        l->doubts = 0;
        if (p->struck_door && sluice__discover_bounded(p, l->limit))
            return SLUICE__DISCOVER_PASS; /* only a rise past the noise is a queue there */
        return x > threshold + SLUICE__DISCOVER_CONFIRM_Z * se ? SLUICE__DISCOVER_QUEUE
                                                               : SLUICE__DISCOVER_PASS;
    }
    return SLUICE__DISCOVER_DOUBT;
}

/* A probe of s0 at `at`, then back to `resume` (0: grow from it); `brief`: for ..._WINDOWS. */
SLUICE_INLINE struct sluice_verdict sluice__discover_remeasure(struct sluice_policy_discover *p,
                                                               uint32_t at, uint32_t resume,
                                                               bool brief)
{
    p->probing = at;
    p->resume = resume;
    p->steep = 0;
    p->remeasure_left = brief ? SLUICE__DISCOVER_REMEASURE_WINDOWS : 0;
    return sluice_verdict_make(at, SLUICE_CAUSE_REMEASURE, 0);
}

/*
 * A level in doubt: measure more. The last step of either bracket is never
 * locked in doubt: it steps down one to measure (discovery locks on a hold).
 * When the reference is short of calls, probe it (BBR's PROBE_RTT); in slow
 * start, measure the level once more first (two windows of noise rarely
 * agree). Not under a refusal bracket while deadlines cut calls (a rise in
 * the noise halved 25 under a cap of 24 with callers waiting), or made at
 * the door (a provider that refuses past its cap rather than queues; through
 * sluice-proxy, 1.3 s streams, a doubt at 8 under a cap of 8 probed 5 for the
 * last 45 s of a run), nor just under where refusals struck
 * (sluice__discover_bounded): `confirm` decides.
 * Otherwise the probe stays: a gateway that queues, then refuses, shows its
 * knee first (without the probe, 4 seeds in 30 locked above C = 10).
 */
SLUICE_INLINE struct sluice_verdict sluice__discover_doubt(struct sluice_policy_discover *p,
                                                           const struct sluice_window *w,
                                                           struct sluice__discover_level *l,
                                                           const struct sluice__discover_ref *ref,
                                                           uint32_t level, bool last_step,
                                                           bool refused, bool trusted)
{
    l->doubts++;
    if ((refused || last_step) && w->saturated && w->limit == w->probe_cap && w->limit > 1)
        return sluice_verdict_make(w->limit - 1, SLUICE_CAUSE_MEASURE_BELOW, 0);
    if (!ref->sampled && !p->probing && !trusted &&
        !(refused && (w->n_censored || p->struck_door)) &&
        !(refused && sluice__discover_bounded(p, level)) && p->windows >= p->remeasure_after) {
        if (p->slow_start && l->doubts < SLUICE__DISCOVER_SLOW_START_DOUBTS)
            return sluice__verdict_hold(w);
        uint32_t lo = sluice__discover_lo(p, level);
        uint32_t half = level / SLUICE__DISCOVER_PROBE_DIVISOR;
        uint32_t at = sluice__discover_probe_level(p, lo > half ? lo : half);
        if (at < w->limit) {
            l->stale = 1; /* sluice__discover_stale says why */
            return sluice__discover_remeasure(p, at, w->limit, w->n_censored != 0);
        }
    }
    p->slow_start = false;
    return sluice__verdict_hold(w);
}

/* A level that passed (or that slow start goes on through): grow as "growth" at the top
 * says, if demand reached the limit; a running probe of s0 first holds until the reference
 * is sampled (or the level it left would go on in slow start), then returns. */
SLUICE_INLINE struct sluice_verdict sluice__discover_grow(struct sluice_policy_discover *p,
                                                          const struct sluice_window *w,
                                                          const struct sluice__discover_level *l,
                                                          const struct sluice__discover_ref *ref,
                                                          uint32_t level, bool last_step)
{
    if (!w->saturated)
        return sluice__verdict_hold(w);
    /* The top of a latency bracket, or of one refusals made at the door (no estimate), passed:
     * discovery locks here, and a later doubt at it passes. Without the second, a doubt at a
     * lock under a reject cap stepped below it to measure (closed-loop callers: 11 times a
     * seed). Not under refusals that took a call's time (timeouts, a gateway's queue): a
     * queue may stand just under them (latency proportional to load, refused by 1 s
     * timeouts: 10 seeds more in 100 locked above its knee). */
    if (last_step || (p->struck_door && sluice__discover_refusal_top(p, w)))
        p->settled = w->limit;
    if (p->probing) {
        bool brief = p->remeasure_left != 0;
        uint32_t left = p->resume ? p->resume : p->steep;
        bool goes_on = p->slow_start && sluice__discover_goes_on(p, left, ref);
        if (level == p->probing && !ref->sampled && l->n < (float)p->params.reference_samples &&
            !goes_on && (!brief || --p->remeasure_left))
            return sluice__verdict_hold(w);
        if (brief)
            p->remeasure_after = p->windows + SLUICE__DISCOVER_REMEASURE_WINDOWS *
                                                  SLUICE__DISCOVER_REMEASURE_SPACING;
        uint32_t back = p->resume ? p->resume : goes_on ? left : 0;
        p->probing = p->resume = p->steep = p->remeasure_left = 0;
        if (back > w->limit)
            return sluice_verdict_make(back, SLUICE_CAUSE_RESUME, 0);
    }
    if (p->slow_start) {
        uint32_t step = w->n_ok < w->limit ? w->n_ok : w->limit;
        return sluice_verdict_make(sluice__sat_add(w->limit, step), SLUICE_CAUSE_SLOW_START, 0);
    }
    uint32_t step = w->probe_cap > w->limit
                        ? (w->probe_cap - w->limit) / SLUICE__DISCOVER_BISECT
                        : w->limit / SLUICE__DISCOVER_GROWTH_DIVISOR;
    return sluice_verdict_make(sluice__sat_add(w->limit, step ? step : 1), SLUICE_CAUSE_ADDITIVE,
                               0);
}

/* Whether a window's own line says its level, the lowest seen, was past the knee already (the
 * table at the top); *at: where to probe. One call's latency is taken no lower than the
 * fastest call's, so a noisy line fits low less often. */
SLUICE_INLINE bool sluice__discover_steep(const struct sluice_policy_discover *p,
                                          const struct sluice_window *w, uint32_t level,
                                          uint32_t *at)
{
    const struct sluice__discover_level *lowest = sluice__discover_lowest(p);
    double slope = w->latency_per_call_ns;
    if (!p->slow_start || p->probing || level <= 1 || !lowest || lowest->limit != level ||
        slope <= SLUICE__DISCOVER_BELOW_Z * w->latency_per_call_se_ns) /* se >= 0: slope > 0 */
        return false;
    double one = (double)w->latency_mean_ns + slope * (1.0 - w->in_flight_mean);
    if (one < (double)w->latency_min_ns)
        one = (double)w->latency_min_ns;
    if (one <= 0 || slope * (double)(level - 1u) < SLUICE__DISCOVER_BELOW_RISE * one)
        return false;
    double target = 1.0 + SLUICE__DISCOVER_BELOW_RISE * one / slope;
    if (target > (double)level * SLUICE__DISCOVER_PROBE_FLOOR)
        target = (double)level * SLUICE__DISCOVER_PROBE_FLOOR;
    *at = (uint32_t)(target + 1e-9); /* >= 1 (level >= 2); 1.9999... is the fit's 2 */
    return *at < level;
}

/* Whether most of a saturated window's calls outlasted it, for the second window in a row
 * (the table at the top; p->stuck counts them); *at: the concurrency its completions
 * explain, lingering permits added back, under the limit. */
SLUICE_INLINE bool sluice__discover_stuck(struct sluice_policy_discover *p,
                                          const struct sluice_window *w, uint32_t *at)
{
    double span = (double)(w->end_ns - w->start_ns);
    double active = w->in_flight_mean - (double)w->lingering;
    if (active > (double)w->reporting) /* only a call still out at the close is stuck */
        active = (double)w->reporting;
    double explained = span > 0 ? (double)w->n_served / span * (double)w->duration_mean_ns : 0;
    if (!w->saturated || explained <= 0 || explained >= SLUICE__DISCOVER_STUCK_SHARE * active) {
        p->stuck = 0;
        return false;
    }
    if (++p->stuck < SLUICE__DISCOVER_STUCK_RUN)
        return false;
    p->stuck = 0;
    double target = ceil(explained) + (double)w->lingering;
    *at = target < 1.0 ? 1u : target >= (double)w->limit ? w->limit - 1u : (uint32_t)target;
    return *at < w->limit;
}

/* One window's verdict: the steps above, in order (see "Per window"). */
SLUICE_INLINE struct sluice_verdict sluice__discover_update(struct sluice_policy *self,
                                                            const struct sluice_window *w)
{
    struct sluice_policy_discover *p = (struct sluice_policy_discover *)self;
    p->windows++;
    sluice__discover_decay(p, w->end_ns);
    struct sluice__discover_ref ref = sluice__discover_s0(p);
    sluice__discover_rate(p, w, ref.mean_ns);
    bool drained = w->limit >= p->at;
    if (!drained)
        p->down_ns = w->start_ns;
    p->at = w->limit;
    if (w->n_fresh_overload)
        return sluice__discover_overload(p, w, ref.mean_ns);
    p->echo_ns = p->quiet_ns = 0;
    /* Where demand fell short of the limit, the calls ran at most max_in_flight at once. */
    uint32_t level = w->saturated ? w->limit : w->max_in_flight;
    if (sluice__discover_unjudged(p, w, level, drained))
        return sluice__discover_unjudged_verdict(p, w);
    uint32_t below;
    if (sluice__discover_stuck(p, w, &below)) { /* its latency is the fast calls': not pooled */
        p->slow_start = false;
        p->probing = p->resume = p->steep = p->remeasure_left = 0;
        p->est = below;
        return sluice_verdict_make(below, SLUICE_CAUSE_LATENCY, below);
    }
    if (p->stuck)
        return sluice__verdict_hold(w);
    struct sluice__discover_level *l = sluice__discover_pool_window(p, w, level);
    struct sluice_verdict v;
    if (sluice__discover_steep(p, w, level, &below)) { /* slow start grows from the probe */
        v = sluice__discover_remeasure(p, below, 0, true);
        p->steep = level;
        return v;
    }
    ref = sluice__discover_s0(p);
    double se, x = sluice__discover_rise(p, l, &ref, &se);
    bool last_step = sluice__discover_last_step(p, w);
    if (last_step && sluice__discover_compare_below(p, w, l, &v))
        return v;
    bool trusted = w->probe_cap && w->limit == p->settled;
    bool refused = w->probe_cap && !p->est && !trusted;
    enum sluice__discover_test test = sluice__discover_test(p, w, l, x, se, last_step, refused,
                                                            trusted);
    /* Under a refusal bracket while deadlines cut calls, the refusals bound the cap and a
     * knee against a reference not yet sampled is doubt, measured where it stands: its
     * probe would halve the limit with callers waiting (one held 25 -> 9 at 10 s under a
     * cap of 24 whose latency never moved: the loaded client's own delays). Just under where
     * the refusals struck, without cut calls, a knee that rests on one window alone is doubt:
     * a real queue shows again in the next (a gateway queueing under its 503s does), one
     * window's chance rise does not. */
    bool first = sluice__discover_bounded(p, level) && l->n <= (float)w->n_ok;
    if (test == SLUICE__DISCOVER_QUEUE && refused && (w->n_censored || first) && !ref.sampled &&
        !last_step)
        test = SLUICE__DISCOVER_DOUBT;
    switch (test) {
    case SLUICE__DISCOVER_QUEUE:
        return sluice__discover_knee(p, w, l, &ref);
    case SLUICE__DISCOVER_DOUBT:
        /* Slow start may go on through a rise within one standard error;
         * only a pass passes the level. */
        if (!(p->slow_start && x <= log1p(p->params.knee) + se))
            return sluice__discover_doubt(p, w, l, &ref, level, last_step, refused, trusted);
        break;
    case SLUICE__DISCOVER_PASS:
        l->passed = 1;
        break;
    }
    /* Served clean at the limit, and no queue to be seen (a pass, or slow
     * start going on): refusals at or below it are a rate's (`proved`). A
     * queue that has not timed out yet is not clean. */
    if (w->saturated && w->limit > p->proved) {
        p->proved = w->limit;
        p->proved_ns = w->end_ns;
    }
    l->doubts = 0;
    return sluice__discover_grow(p, w, l, &ref, level, last_step);
}

SLUICE__POLICY_OPS(discover, true)

/* The parameters: X(field, default, lo, hi, hi_inclusive, message); see SLUICE__POLICY_RESOLVE. */
#define SLUICE__DISCOVER_PARAMS(X)                                                                 \
    X(backoff, 0.9, 0.0, 1.0, false, "sluice_policy_discover_params.backoff must be in (0, 1)")   \
    X(knee, 0.14, 0.0, 100.0, true, "sluice_policy_discover_params.knee must be in (0, 100]")     \
    X(knee_floor, 0.25, 0.0, 1.0, false,                                                           \
      "sluice_policy_discover_params.knee_floor must be in (0, 1)")                                \
    X(noise_z, 2.0, 0.0, 100.0, true, "sluice_policy_discover_params.noise_z must be in (0, 100]") \
    X(memory_s, 1800.0, 0.0, 1e7, true,                                                            \
      "sluice_policy_discover_params.memory_s must be in (0, 1e7]")                                \
    X(confirm, 4, 0.0, 1000.0, true, "sluice_policy_discover_params.confirm must be in [1, 1000]") \
    X(min_samples, 8, 0.0, 65536.0, true,                                                          \
      "sluice_policy_discover_params.min_samples must be in [1, 65536]")                           \
    X(reference_samples, 128, 0.0, 1e6, true,                                                      \
      "sluice_policy_discover_params.reference_samples must be in [1, 1e6]")

/* Initialise in caller storage; SLUICE_EINVAL on a bad value, with a message naming the
 * field in `error` (error_size bytes; NULL = no message). */
SLUICE_INLINE int sluice_policy_discover_init(struct sluice_policy_discover *p,
                                              const struct sluice_policy_discover_params *params,
                                              char *error, size_t error_size)
{
    struct sluice_policy_discover_params r;
    SLUICE__POLICY_RESOLVE(SLUICE__DISCOVER_PARAMS);
    p->base.ops = sluice__discover_ops();
    p->params = r;
    sluice__discover_reset(&p->base, 1, false);
    return SLUICE_OK;
}

#endif /* SLUICE_POLICY_DISCOVER_H */
