/* sluice/window_recorder.h: the two-buffer accumulator keeps each sample whole in one
 * window, and a close hands over totals and starts the next window empty. */
#include <criterion/criterion.h>
#include <sluice/window_recorder.h>

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "discovery_node.h"

static void add_measured(struct sluice_window_recorder *w, int64_t latency, uint32_t in_flight)
{
    struct sluice_window_buffer *a = sluice_window_recorder_enter(w);
    sluice_window_buffer_add_served(a, in_flight);
    sluice_window_buffer_add_measured(a, latency, latency, 0, in_flight, false);
    sluice_window_recorder_leave(a);
}

Test(window, a_close_takes_the_totals_and_reports_none_as_zero)
{
    struct sluice_window_recorder w;
    sluice_window_recorder_init(&w);
    struct sluice_window_totals t = sluice_window_recorder_close(&w);
    cr_assert_eq(t.n_ok + t.n_overload + t.n_fresh + t.n_ignore, 0);
    cr_assert_eq(t.overload_limit, 0, "no fresh overload: 0, not the UINT32_MAX sentinel");
    cr_assert_eq(t.overload_in_flight, 0);
    cr_assert_eq(t.refused_in_flight, 0);
    cr_assert_eq(t.latency_min_ns, INT64_MAX, "no measured call");
    cr_assert_eq(t.overload_start_ns, INT64_MAX, "no fresh overload");
    cr_assert_eq(t.overload_latency_ns, 0);

    add_measured(&w, 300, 4);
    add_measured(&w, 100, 6);
    struct sluice_window_buffer *a = sluice_window_recorder_enter(&w);
    sluice_window_buffer_add_overload(a, true, 5, 7, 40, 3, 2000);
    sluice_window_buffer_add_overload(a, true, 6, 8, 50, 2, 1000);
    sluice_window_buffer_add_overload(a, false, 3, 9, 10, 80, 9000); /* an echo: not fresh */
    sluice_window_buffer_add_ignored(a, true);
    sluice_window_recorder_leave(a);
    cr_assert(sluice_window_recorder_has_fresh(&w));

    t = sluice_window_recorder_close(&w);
    cr_assert_eq(t.n_ok, 2);
    cr_assert_eq(t.latency_sum_ns, 400);
    cr_assert_eq(t.latency_min_ns, 100);
    cr_assert_eq(t.max_in_flight, 6);
    cr_assert_eq(t.served_in_flight, 6);
    cr_assert_eq(t.n_overload, 3);
    cr_assert_eq(t.n_fresh, 2);
    cr_assert_eq(t.overload_limit, 7, "only the fresh overload's limit");
    cr_assert_eq(t.overload_start_ns, 40);
    cr_assert_eq(t.overload_latency_ns, 3, "the longest fresh overload, not the echo's");
    cr_assert_eq(t.overload_in_flight, 5);
    cr_assert_eq(t.refused_in_flight, 3, "every overload, echoes included");
    cr_assert_eq(t.retry_after_ns, 2000, "only the fresh overload's Retry-After");
    cr_assert_eq(t.n_ignore, 1);
    cr_assert_eq(t.n_ok_other, 1);
    cr_assert_not(sluice_window_recorder_has_fresh(&w), "the next window starts empty");
}

/* The line of latency on calls in flight: exact where latency grows with the count (a slow
 * link: 100 ms per call in service), flat with a standard error where it does not, and
 * nothing where the count never varied (a saturated window: every call starts at the limit). */
Test(window, a_close_fits_latency_to_the_calls_in_flight_at_their_start)
{
    struct sluice_window_recorder w;
    sluice_window_recorder_init(&w);
    const int64_t ms = 1000000;
    for (uint32_t x = 1; x <= 5; x++)
        add_measured(&w, 100 * ms * x, x);
    for (int i = 0; i < 5; i++)
        add_measured(&w, 500 * ms, 5);
    struct sluice_window_totals t = sluice_window_recorder_close(&w);
    struct sluice_window_line line = sluice_window_totals_line(&t);
    cr_assert_float_eq(line.in_flight_mean, 4.0, 1e-9);
    cr_assert_float_eq(line.slope_ns, 100.0 * ms, 1e-3 * ms, "slope %g", line.slope_ns);
    cr_assert_lt(line.slope_se_ns, 1e-3 * ms, "a perfect fit: se %g", line.slope_se_ns);

    static const int64_t noise[] = {90, 110, 105, 95, 100, 98, 102, 100};
    for (uint32_t i = 0; i < 8; i++)
        add_measured(&w, noise[i] * ms, 1 + i % 4);
    t = sluice_window_recorder_close(&w);
    line = sluice_window_totals_line(&t);
    cr_assert_lt(fabs(line.slope_ns), 2 * line.slope_se_ns, "flat: the slope is within its noise");
    cr_assert_gt(line.slope_se_ns, 0.5 * ms);

    for (int i = 0; i < 8; i++)
        add_measured(&w, noise[i] * ms, 6);
    t = sluice_window_recorder_close(&w);
    line = sluice_window_totals_line(&t);
    cr_assert_eq(line.slope_ns, 0, "one count: no line");
    cr_assert_eq(line.slope_se_ns, 0);
    cr_assert_float_eq(line.in_flight_mean, 6.0, 1e-9);
}

Test(window, a_censored_call_is_measured_at_its_cut_and_counted_as_censored)
{
    struct sluice_window_recorder w;
    sluice_window_recorder_init(&w);
    add_measured(&w, 100, 3);
    struct sluice_window_buffer *a = sluice_window_recorder_enter(&w);
    sluice_window_buffer_add_measured(a, 300, 300, 0, 5, true); /* cut at 300: longer than that */
    sluice_window_recorder_leave(a);
    struct sluice_window_totals t = sluice_window_recorder_close(&w);
    cr_assert_eq(t.n_ok, 2, "a cut call is measured with the served ones");
    cr_assert_eq(t.n_censored, 1);
    cr_assert_eq(t.latency_sum_ns, 400, "at the time it had run: the restricted mean's term");
    cr_assert_eq(t.max_in_flight, 5);
    cr_assert_eq(sluice_window_recorder_close(&w).n_censored, 0, "the other buffer starts at 0");
    cr_assert_eq(sluice_window_recorder_close(&w).n_censored, 0, "and this one was reset");
}

Test(window, both_buffers_start_empty_after_their_close)
{
    struct sluice_window_recorder w;
    sluice_window_recorder_init(&w);
    for (int round = 0; round < 4; round++) { /* each buffer twice */
        add_measured(&w, 10 + round, 1);
        struct sluice_window_totals t = sluice_window_recorder_close(&w);
        cr_assert_eq(t.n_ok, 1, "round %d holds its own sample only", round);
        cr_assert_eq(t.latency_sum_ns, 10 + round);
    }
}

struct closer {
    struct sluice_window_recorder *w;
    struct sluice_window_totals t;
    _Atomic(int) done;
};

static void *close_thread(void *arg)
{
    struct closer *c = arg;
    c->t = sluice_window_recorder_close(c->w);
    atomic_store_explicit(&c->done, 1, SLUICE_SEQ_CST);
    return NULL;
}

Test(window, a_close_waits_for_the_sample_inside_and_later_samples_go_to_the_next_window,
     .timeout = 30)
{
    static struct sluice_window_recorder w;
    sluice_window_recorder_init(&w);
    /* A sample half-way through its adds: latency in, count not yet. */
    struct sluice_window_buffer *a = sluice_window_recorder_enter(&w);
    sluice_window_buffer_add_served(a, 3);
    static struct closer c;
    c.w = &w;
    atomic_init(&c.done, 0);
    pthread_t tid;
    pthread_create(&tid, NULL, close_thread, &c);
    while (atomic_load_explicit(&w.open, SLUICE_SEQ_CST) == 0)
        usleep(1000); /* the closer flipped the buffers ... */
    usleep(20000);
    cr_assert_not(atomic_load_explicit(&c.done, SLUICE_SEQ_CST),
                  "... and waits for the sample still adding to the old one");
    add_measured(&w, 50, 2); /* after the flip: the next window's */
    sluice_window_buffer_add_measured(a, 40, 40, 0, 3, false);
    sluice_window_recorder_leave(a);
    pthread_join(tid, NULL);
    cr_assert_eq(c.t.n_ok, 1, "the closed window holds the whole first sample");
    cr_assert_eq(c.t.latency_sum_ns, 40);
    struct sluice_window_totals next = sluice_window_recorder_close(&w);
    cr_assert_eq(next.n_ok, 1);
    cr_assert_eq(next.latency_sum_ns, 50, "the sample after the flip is the next window's");
}

/* Writers race a closer: every sample lands in exactly one window, whole
 * (its count and its latency together), so the totals over all closes add
 * up to what was written and every window's sum is count x latency. */
#define RACE_WRITERS 2
#define RACE_SAMPLES 50000
#define RACE_LATENCY 7

struct race {
    struct sluice_window_recorder w;
    _Atomic(int) writers_left;
};

static void *race_writer(void *arg)
{
    struct race *r = arg;
    for (int i = 0; i < RACE_SAMPLES; i++)
        add_measured(&r->w, RACE_LATENCY, 1);
    atomic_fetch_sub_explicit(&r->writers_left, 1, SLUICE_SEQ_CST);
    return NULL;
}

Test(window, a_racing_close_never_splits_a_sample_between_windows, .timeout = 60)
{
    static struct race r;
    sluice_window_recorder_init(&r.w);
    atomic_init(&r.writers_left, RACE_WRITERS);
    pthread_t tid[RACE_WRITERS];
    for (int i = 0; i < RACE_WRITERS; i++)
        pthread_create(&tid[i], NULL, race_writer, &r);
    uint64_t n = 0;
    bool more = true;
    while (more) {
        more = atomic_load_explicit(&r.writers_left, SLUICE_SEQ_CST) > 0;
        struct sluice_window_totals t = sluice_window_recorder_close(&r.w);
        cr_assert_eq(t.latency_sum_ns, (int64_t)t.n_ok * RACE_LATENCY,
                     "a window holds %u samples but the latency of %lld", t.n_ok,
                     (long long)(t.latency_sum_ns / RACE_LATENCY));
        /* The sums behind the latency line: the CAS-added doubles lose no add either. */
        cr_assert_eq(t.in_flight_sum, t.n_ok);
        cr_assert_eq(t.cross_sum, (double)t.n_ok * RACE_LATENCY);
        cr_assert_eq(t.latency_sq, (double)t.n_ok * RACE_LATENCY * RACE_LATENCY);
        n += t.n_ok;
    }
    for (int i = 0; i < RACE_WRITERS; i++)
        pthread_join(tid[i], NULL);
    struct sluice_window_totals t = sluice_window_recorder_close(&r.w);
    n += t.n_ok;
    cr_assert_eq(n, (uint64_t)RACE_WRITERS * RACE_SAMPLES, "no sample lost or counted twice");
}

/* ---- through discovery: extreme parameters, cut calls, torn samples ------------- */

/* A policy that counts the windows it is shown (a plain value: the counters it
 * points to are shared and outlive every node), and cuts on a fresh overload. */
struct tally {
    _Atomic(uint64_t) windows, empty, torn;
    int64_t latency_ns; /* every ok call takes exactly this; 0 = do not check */
};

struct tally_policy {
    struct sluice_policy base;
    struct tally *tally;
};

static uint32_t tally_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)self, (void)warm;
    return jumpstart;
}

static struct sluice_verdict tally_update(struct sluice_policy *self, const struct sluice_window *w)
{
    struct tally *t = ((struct tally_policy *)self)->tally;
    atomic_fetch_add(&t->windows, 1);
    if (!w->n_ok && !w->n_overload && !w->n_ignore)
        atomic_fetch_add(&t->empty, 1);
    if (t->latency_ns && w->n_ok && w->latency_mean_ns != t->latency_ns)
        atomic_fetch_add(&t->torn, 1);
    if (w->n_fresh_overload)
        return sluice__verdict_overload(w, 0.9);
    return sluice__verdict_hold(w);
}

static const struct sluice_policy_ops tally_ops = {"tally", true, tally_reset, tally_update,
                                                   sizeof(struct tally_policy)};

/* A policy that adds up the windows it is shown, and holds. */
struct spy_totals {
    uint32_t n_ok, n_censored, n_overload, n_served, max_in_flight;
    int64_t latency_ns; /* the sum of latency_mean_ns x n_ok */
    bool saturated;     /* some window was */
    int64_t mad_ns[2];  /* the first two windows' latency_mad_ns */
    uint32_t windows;
};

struct spy_policy {
    struct sluice_policy base;
    struct spy_totals *sum; /* shared, outlives the node */
};

static uint32_t spy_reset(struct sluice_policy *self, uint32_t jumpstart, bool warm)
{
    (void)self, (void)warm;
    return jumpstart;
}

static struct sluice_verdict spy_update(struct sluice_policy *self, const struct sluice_window *w)
{
    struct spy_totals *t = ((struct spy_policy *)self)->sum;
    t->n_ok += w->n_ok;
    t->n_censored += w->n_censored;
    t->n_overload += w->n_overload;
    t->n_served += w->n_served;
    t->latency_ns += w->latency_mean_ns * w->n_ok;
    t->max_in_flight = w->max_in_flight > t->max_in_flight ? w->max_in_flight : t->max_in_flight;
    t->saturated |= w->saturated;
    if (t->windows < 2)
        t->mad_ns[t->windows] = w->latency_mad_ns;
    t->windows++;
    return sluice__verdict_hold(w);
}

static const struct sluice_policy_ops spy_ops = {"spy", true, spy_reset, spy_update,
                                                 sizeof(struct spy_policy)};

Test(window, a_call_cut_by_its_deadline_is_measured_at_its_cut_never_as_an_overload)
{
    struct node n;
    node_init(&n);
    struct spy_totals last = {0};
    struct spy_policy policy = {{&spy_ops}, &last};
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.policy = &policy.base;
    d.jumpstart = 8;
    node_create(&n, &d);
    advance(&n, 250 * MS); /* every call below started in the first window's cohort */
    for (int i = 0; i < 6; i++) {
        feed(&n, 100 * MS, 4, SLUICE_OUTCOME_OK, 0);
        feed(&n, 250 * MS, 8, SLUICE_OUTCOME_CENSORED, 0); /* cut at 250 ms: longer than that */
    }
    advance(&n, SLUICE_DISCOVERY_WINDOW_MAX_NS);
    sluice_discovery_poll(n.disc);
    cr_assert_eq(last.n_ok, 12, "cut calls are measured with the served ones (%u ok, %u cut, %u served)", last.n_ok, last.n_censored, last.n_served);
    cr_assert_eq(last.n_censored, 6);
    cr_assert_eq(last.latency_ns, 6 * 100 * MS + 6 * 250 * MS,
                 "the restricted mean: each cut call at its cut");
    cr_assert_eq(last.max_in_flight, 8, "the provider took them at that concurrency");
    cr_assert(last.saturated, "so the window reached the limit");
    cr_assert_eq(last.n_overload, 0, "a cut call is never an overload");
    cr_assert_eq(last.n_served, 12);
    cr_assert_eq(sluice_discovery_limit(n.disc), 8);
    sluice_discovery_destroy(n.disc);
}

/* The first window has no previous mean: its calls deviate from the first latency's guess
 * (twice that latency), and that distance is no noise. Calls of 90 and 110 ms, first a 90:
 * the guess is 180 ms, 80 ms from every call on average, where the calls spread 10 ms about
 * their mean (σ 10.3 ms, a normal's mean absolute deviation 8.2 ms). Read as noise, the
 * guess made the policy's latency test doubt levels that had not moved for ten windows. The
 * next window deviates from the running mean, as every later one does. */
Test(window, the_first_windows_noise_is_its_spread_not_its_distance_from_the_guess)
{
    struct node n;
    node_init(&n);
    struct spy_totals seen = {0};
    struct spy_policy policy = {{&spy_ops}, &seen};
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.policy = &policy.base;
    d.jumpstart = 8;
    node_create(&n, &d);
    for (int window = 0; window < 2; window++) {
        advance(&n, 110 * MS);
        for (int i = 0; i < 16; i++)
            feed(&n, i % 2 ? 110 * MS : 90 * MS, 8, SLUICE_OUTCOME_OK, 0);
        advance(&n, SLUICE_DISCOVERY_WINDOW_MAX_NS);
        sluice_discovery_poll(n.disc);
    }
    sluice_discovery_destroy(n.disc);
    cr_assert_eq(seen.windows, 2);
    cr_expect(seen.mad_ns[0] >= 7 * MS && seen.mad_ns[0] <= 9 * MS,
              "the first window's deviation is %.1f ms: its calls spread 10 ms",
              (double)seen.mad_ns[0] / MS);
    /* The running mean after the first window is (180 + 100) / 2 = 140 ms: 40 ms away. */
    cr_expect(seen.mad_ns[1] >= 39 * MS && seen.mad_ns[1] <= 41 * MS,
              "the second window's deviation from the running mean is %.1f ms",
              (double)seen.mad_ns[1] / MS);
}

Test(window, the_largest_window_parameters_and_absurd_latencies_stay_defined)
{
    /* Under UBSan (the asan build): no overflowing cast or sum, and no window
     * that closes on every sample because its due time wrapped negative. */
    struct node n;
    node_init(&n);
    struct tally tally = {0};
    struct tally_policy policy = {{&tally_ops}, &tally};
    struct sluice_discovery_desc d = node_desc(&n, "cloud:x");
    d.policy = &policy.base;
    d.window_span = SLUICE_DISCOVERY_SPAN_MAX;
    d.window_tail = SLUICE_DISCOVERY_SPAN_MAX;
    d.window_samples = SLUICE_DISCOVERY_WINDOW_SAMPLES_MAX;
    d.window_min_ns = SLUICE_DISCOVERY_WINDOW_MAX_NS;
    d.window_max_ns = SLUICE_DISCOVERY_WINDOW_MAX_NS;
    d.retry_after_max_ns = INT64_MAX;
    d.lock_ttl_s = SLUICE_DISCOVERY_TTL_MAX_S;
    node_create(&n, &d);
    int64_t latencies[] = {INT64_MAX, INT64_MIN, -1, 0, SLUICE_DISCOVERY_LATENCY_MAX_NS + 1, SEC};
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof latencies / sizeof latencies[0]; i++) {
            advance(&n, SEC);
            feed(&n, latencies[i], UINT32_MAX, SLUICE_OUTCOME_OK, 0);
            feed(&n, latencies[i], UINT32_MAX, SLUICE_OUTCOME_IGNORE, INT64_MAX);
        }
    cr_assert_eq(atomic_load(&tally.windows), 0, "%" PRIu64 " windows closed within a minute",
                 (uint64_t)atomic_load(&tally.windows));
    /* The window still closes at window_max_ns, and the hold saturates. */
    advance(&n, SLUICE_DISCOVERY_WINDOW_MAX_NS);
    sluice_discovery_poll(n.disc);
    cr_assert_eq(atomic_load(&tally.windows), 1);
    feed(&n, INT64_MAX, 1, SLUICE_OUTCOME_OVERLOAD, INT64_MAX);
    cr_assert_eq(sluice_discovery_hold_until(n.disc), INT64_MAX);
    sluice_discovery_destroy(n.disc);
}

static void *steady_calls(void *arg)
{
    struct sluice_discovery *d = (struct sluice_discovery *)arg;
    struct sluice_sample s = {1000, 4, SLUICE_OUTCOME_OK, 0, 0, 0}; /* every call takes 1 µs */
    for (int i = 0; i < SCALED(100000); i++)
        sluice_discovery_on_sample(d, &s);
    return NULL;
}

Test(window, a_sample_lands_whole_in_one_window)
{
    /* Every call takes exactly 1 µs, so every window's mean must be exactly
     * 1 µs: a sample whose latency landed in one window and its count in the
     * next would show as a different mean in both. Windows close every few
     * microseconds of real time, racing the samples. */
    struct tally tally = {0};
    tally.latency_ns = 1000;
    struct tally_policy policy = {{&tally_ops}, &tally};
    struct sluice_gate gate;
    sluice_gate_init(&gate, 1);
    struct sluice_discovery_desc d;
    memset(&d, 0, sizeof d);
    d.node_id = "cloud:whole";
    d.gate = &gate;
    d.policy = &policy.base;
    d.jumpstart = 4;
    d.window_min_ns = 1;
    d.window_max_ns = 20 * 1000;
    struct sluice_discovery *disc;
    cr_assert_eq(sluice_discovery_create(&d, &disc), SLUICE_OK);
    enum { THREADS = 3 };
    pthread_t tids[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&tids[i], NULL, steady_calls, disc);
    for (int i = 0; i < THREADS; i++)
        pthread_join(tids[i], NULL);
    cr_assert_gt(atomic_load(&tally.windows), 100);
    cr_assert_eq(atomic_load(&tally.torn), 0, "%" PRIu64 " of %" PRIu64 " windows had a split sample",
                 (uint64_t)atomic_load(&tally.torn), (uint64_t)atomic_load(&tally.windows));
    sluice_discovery_destroy(disc);
}

/* Rounds of calls that start together, `limit` of them, and end together `call` later,
 * their samples measuring `latency` (a streamed call's time to first token, or the whole
 * call); each sample is fed while its call still counts in flight, as a pool does. Besides
 * them, `stuck` calls in flight that never report and `lingering` of those whose sample is
 * in (a lingering permit). Returns how long after the node opened slow start first grew. */
static int64_t first_growth(int64_t call, int64_t latency, uint32_t stuck, uint32_t lingering)
{
    struct node n;
    node_init(&n);
    struct sluice_discovery_desc d = node_desc(&n, "cloud:stream");
    node_create(&n, &d);
    _Atomic(uint32_t) in_flight = 0, lingered = lingering;
    sluice_discovery_count_in_flight(n.disc, &in_flight);
    sluice_discovery_count_lingering(n.disc, &lingered);
    const int64_t opened = n.time.mono_ns;
    uint32_t limit = sluice_discovery_limit(n.disc);
    cr_assert_eq(limit, 5, "the jumpstart");
    int64_t grew_at = 0;
    for (int round = 0; round < 16 && !grew_at; round++) {
        atomic_store(&in_flight, limit + stuck);
        advance(&n, call);
        for (uint32_t i = 0; i < limit && !grew_at; i++) {
            struct sluice_sample s = {latency, limit, SLUICE_OUTCOME_OK, 0,
                                      n.time.mono_ns - call, limit};
            sluice_discovery_on_sample(n.disc, &s);
            atomic_fetch_sub(&in_flight, 1u);
            if (sluice_discovery_limit(n.disc) > limit)
                grew_at = n.time.mono_ns - opened;
        }
    }
    sluice_discovery_destroy(n.disc);
    cr_assert_gt(grew_at, 0, "slow start never grew");
    return grew_at;
}

/* The first window is timed by its first sample, the fastest call then in flight, with a
 * margin for the slower ones. A streamed call's margin is its time to first token, what
 * varies, not its whole duration again: five streams of 0.3 s to the first token and
 * 0.9 s in all give the first window a start period of 3.2 × 1.2 s = 3.84 s and a due time
 * 2 × 1.2 s after (doubled, the duration put it at 9.4 s: seconds more at the jumpstart
 * for a service whose callers wait). Its last calls start at 3.6 s and end at 4.5 s: with
 * every call of the window ended, it closes then, not at its due time. */
Test(window, a_streamed_window_closes_once_its_calls_have_ended)
{
    const int64_t call = 900 * MS, grew_at = first_growth(call, 300 * MS, 0, 0);
    cr_expect_eq(grew_at, 5 * call, "the first window closed %.1f s after it opened",
                 (double)grew_at / SEC);
}

/* One of its calls still out (it never reports): the window waits out its tail, as before
 * it counted (6.24 s: the round at 6.3 s). */
Test(window, a_streamed_window_with_a_call_still_out_waits_out_its_tail)
{
    const int64_t call = 900 * MS, grew_at = first_growth(call, 300 * MS, 1, 0);
    cr_expect_eq(grew_at, 7 * call, "the first window closed %.1f s after it opened",
                 (double)grew_at / SEC);
}

/* A lingering permit is in flight for the provider but has reported already: it does not
 * hold the window open. */
Test(window, a_lingering_permit_does_not_hold_a_streamed_window_open)
{
    const int64_t call = 900 * MS, grew_at = first_growth(call, 300 * MS, 1, 1);
    cr_expect_eq(grew_at, 5 * call, "the first window closed %.1f s after it opened",
                 (double)grew_at / SEC);
}

/* Unstreamed calls (the sample measures the whole call) wait out their tail, whose slowest
 * calls do take that long: 0.9 s calls guess 1.8 s, a start period of 3.2 × 1.8 s = 5.76 s
 * and a due time 3.6 s after (9.36 s: the round at 9.9 s), where counting would have
 * closed it at 6.3 s. */
Test(window, an_unstreamed_window_waits_out_its_tail)
{
    const int64_t call = 900 * MS, grew_at = first_growth(call, call, 0, 0);
    cr_expect_eq(grew_at, 11 * call, "the first window closed %.1f s after it opened",
                 (double)grew_at / SEC);
}
