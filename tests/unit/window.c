/* sluice/window.h: the two-buffer accumulator keeps each sample whole in one
 * window, and a close hands over totals and starts the next window empty. */
#include <criterion/criterion.h>
#include <sluice/window.h>

#include <pthread.h>
#include <unistd.h>

static void add_measured(struct sluice_window_accum *w, int64_t latency, uint32_t in_flight)
{
    struct sluice_window_acc *a = sluice_window_accum_enter(w);
    sluice_window_acc_add_served(a, in_flight);
    sluice_window_acc_add_measured(a, latency, latency, 0, in_flight, false);
    sluice_window_accum_leave(a);
}

Test(window, a_close_takes_the_totals_and_reports_none_as_zero)
{
    struct sluice_window_accum w;
    sluice_window_accum_init(&w);
    struct sluice_window_totals t = sluice_window_accum_close(&w);
    cr_assert_eq(t.n_ok + t.n_overload + t.n_fresh + t.n_ignore, 0);
    cr_assert_eq(t.overload_limit, 0, "no fresh overload: 0, not the UINT32_MAX sentinel");
    cr_assert_eq(t.overload_in_flight, 0);
    cr_assert_eq(t.refused_in_flight, 0);
    cr_assert_eq(t.latency_min_ns, INT64_MAX, "no measured call");
    cr_assert_eq(t.overload_start_ns, INT64_MAX, "no fresh overload");

    add_measured(&w, 300, 4);
    add_measured(&w, 100, 6);
    struct sluice_window_acc *a = sluice_window_accum_enter(&w);
    sluice_window_acc_add_overload(a, true, 5, 7, 40, 2000);
    sluice_window_acc_add_overload(a, false, 3, 9, 10, 9000); /* an echo: counted, not fresh */
    sluice_window_acc_add_ignored(a, true);
    sluice_window_accum_leave(a);
    cr_assert(sluice_window_accum_has_fresh(&w));

    t = sluice_window_accum_close(&w);
    cr_assert_eq(t.n_ok, 2);
    cr_assert_eq(t.latency_sum_ns, 400);
    cr_assert_eq(t.latency_min_ns, 100);
    cr_assert_eq(t.max_in_flight, 6);
    cr_assert_eq(t.served_in_flight, 6);
    cr_assert_eq(t.n_overload, 2);
    cr_assert_eq(t.n_fresh, 1);
    cr_assert_eq(t.overload_limit, 7, "only the fresh overload's limit");
    cr_assert_eq(t.overload_start_ns, 40);
    cr_assert_eq(t.overload_in_flight, 5);
    cr_assert_eq(t.refused_in_flight, 3, "every overload, echoes included");
    cr_assert_eq(t.retry_after_ns, 2000, "only the fresh overload's Retry-After");
    cr_assert_eq(t.n_ignore, 1);
    cr_assert_eq(t.n_ok_other, 1);
    cr_assert_not(sluice_window_accum_has_fresh(&w), "the next window starts empty");
}

Test(window, a_censored_call_is_measured_at_its_cut_and_counted_as_censored)
{
    struct sluice_window_accum w;
    sluice_window_accum_init(&w);
    add_measured(&w, 100, 3);
    struct sluice_window_acc *a = sluice_window_accum_enter(&w);
    sluice_window_acc_add_measured(a, 300, 300, 0, 5, true); /* cut at 300: longer than that */
    sluice_window_accum_leave(a);
    struct sluice_window_totals t = sluice_window_accum_close(&w);
    cr_assert_eq(t.n_ok, 2, "a cut call is measured with the served ones");
    cr_assert_eq(t.n_censored, 1);
    cr_assert_eq(t.latency_sum_ns, 400, "at the time it had run: the restricted mean's term");
    cr_assert_eq(t.max_in_flight, 5);
    cr_assert_eq(sluice_window_accum_close(&w).n_censored, 0, "the other buffer starts at 0");
    cr_assert_eq(sluice_window_accum_close(&w).n_censored, 0, "and this one was reset");
}

Test(window, both_buffers_start_empty_after_their_close)
{
    struct sluice_window_accum w;
    sluice_window_accum_init(&w);
    for (int round = 0; round < 4; round++) { /* each buffer twice */
        add_measured(&w, 10 + round, 1);
        struct sluice_window_totals t = sluice_window_accum_close(&w);
        cr_assert_eq(t.n_ok, 1, "round %d holds its own sample only", round);
        cr_assert_eq(t.latency_sum_ns, 10 + round);
    }
}

struct closer {
    struct sluice_window_accum *w;
    struct sluice_window_totals t;
    _Atomic(int) done;
};

static void *close_thread(void *arg)
{
    struct closer *c = arg;
    c->t = sluice_window_accum_close(c->w);
    atomic_store_explicit(&c->done, 1, SLUICE_SEQ_CST);
    return NULL;
}

Test(window, a_close_waits_for_the_sample_inside_and_later_samples_go_to_the_next_window,
     .timeout = 30)
{
    static struct sluice_window_accum w;
    sluice_window_accum_init(&w);
    /* A sample half-way through its adds: latency in, count not yet. */
    struct sluice_window_acc *a = sluice_window_accum_enter(&w);
    sluice_window_acc_add_served(a, 3);
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
    sluice_window_acc_add_measured(a, 40, 40, 0, 3, false);
    sluice_window_accum_leave(a);
    pthread_join(tid, NULL);
    cr_assert_eq(c.t.n_ok, 1, "the closed window holds the whole first sample");
    cr_assert_eq(c.t.latency_sum_ns, 40);
    struct sluice_window_totals next = sluice_window_accum_close(&w);
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
    struct sluice_window_accum w;
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
    sluice_window_accum_init(&r.w);
    atomic_init(&r.writers_left, RACE_WRITERS);
    pthread_t tid[RACE_WRITERS];
    for (int i = 0; i < RACE_WRITERS; i++)
        pthread_create(&tid[i], NULL, race_writer, &r);
    uint64_t n = 0;
    bool more = true;
    while (more) {
        more = atomic_load_explicit(&r.writers_left, SLUICE_SEQ_CST) > 0;
        struct sluice_window_totals t = sluice_window_accum_close(&r.w);
        cr_assert_eq(t.latency_sum_ns, (int64_t)t.n_ok * RACE_LATENCY,
                     "a window holds %u samples but the latency of %lld", t.n_ok,
                     (long long)(t.latency_sum_ns / RACE_LATENCY));
        n += t.n_ok;
    }
    for (int i = 0; i < RACE_WRITERS; i++)
        pthread_join(tid[i], NULL);
    struct sluice_window_totals t = sluice_window_accum_close(&r.w);
    n += t.n_ok;
    cr_assert_eq(n, (uint64_t)RACE_WRITERS * RACE_SAMPLES, "no sample lost or counted twice");
}
