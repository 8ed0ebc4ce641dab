/*
 * curl_loop.c — the event-loop driver (sluice_curl_loop over curl_multi)
 * against the HTTP provider simulator: discovery with 200 concurrent
 * submissions from 4 threads, admission at submit, cancel at every stage,
 * deadlines, Retry-After, shutdown, max_requests, keep-alive, and the
 * embedder's-loop mode driven by a plain epoll loop.
 *
 * Why one file of this size: every test drives one loop fixture (a loop,
 * the simulator, named requests and their outcomes); split, each file would
 * carry its own copy of that fixture.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "e2e/curl_fixture.h"

#define LOOP_TEST(name) Test(curl_loop, name, .init = fx_setup, .fini = fx_teardown, .timeout = 30)

/* ---- completions ---------------------------------------------------------------- */

struct tracker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long done;
    long by_status[8]; /* OK, ECANCELED, ETIMEDOUT, ECLOSED, EIO, other */
    long overloads;
};

struct req {
    CURL *easy;
    struct sluice_cancel token;
    struct sluice_curl_result r;
    _Atomic(int) done_count;
    int64_t done_ns;
    struct sluice_curl_result cut_r; /* what `cut` said (sluice_curl_request.cut) */
    _Atomic(int) cut_count;
    int done_at_cut; /* completions of this request when `cut` ran */
    size_t body_bytes; /* what its `write` was given */
    uint64_t id;
    struct tracker *t;
    void *owner; /* the submitter thread's queue (discovery test) */
};

static void tracker_init(struct tracker *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}

static int status_slot(int status)
{
    switch (status) {
    case SLUICE_OK:
        return 0;
    case SLUICE_ECANCELED:
        return 1;
    case SLUICE_ETIMEDOUT:
        return 2;
    case SLUICE_ECLOSED:
        return 3;
    case SLUICE_EIO:
        return 4;
    default:
        return 5;
    }
}

static void on_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    struct req *q = (struct req *)data;
    cr_assert_eq(easy, q->easy, "done got another request's handle");
    q->r = *r;
    q->done_ns = sluice_monotonic_ns();
    atomic_fetch_add(&q->done_count, 1);
    struct tracker *t = q->t;
    pthread_mutex_lock(&t->mu);
    t->done++;
    t->by_status[status_slot(r->status)]++;
    t->overloads += r->kind == SLUICE_CURL_OVERLOADED;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Wait (bounded) until `n` completions arrived. */
static void wait_done(struct tracker *t, long n, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&t->mu);
    while (t->done < n && pthread_cond_timedwait(&t->cv, &t->mu, &until) == 0) {
    }
    long got = t->done;
    pthread_mutex_unlock(&t->mu);
    cr_assert_geq(got, n, "%ld of %ld completions after %d ms", got, n, ms);
}

static void req_init(struct req *q, struct tracker *t)
{
    memset(q, 0, sizeof *q);
    q->easy = fx_easy();
    q->t = t;
    sluice_cancel_init(&q->token);
}

static struct sluice_curl_request req_of(struct req *q, bool token)
{
    return (struct sluice_curl_request){.backend = FX_BACKEND,
                                        .easy = q->easy,
                                        .cancel = token ? &q->token : NULL,
                                        .done = on_done,
                                        .data = q};
}

static int submit(struct sluice_curl_loop *loop, struct req *q, bool token)
{
    struct sluice_curl_request rq = req_of(q, token);
    return sluice_curl_loop_submit(loop, &rq, &q->id);
}

static struct sluice_curl_loop *loop_create(struct sluice_engine *e, uint32_t max_requests)
{
    struct sluice_curl_loop *loop = NULL;
    struct sluice_curl_loop_desc d = {.engine = e, .max_requests = max_requests};
    cr_assert_eq(sluice_curl_loop_create(&d, &loop), SLUICE_OK);
    return loop;
}

/* The requests a test names, NULL-terminated: REQS(&busy, &queued). */
#define REQS(...) ((struct req *const[]){__VA_ARGS__, NULL})

/* A loop over `e` (default max_requests) for the requests `qs`, each fresh and tracked by *t. */
static struct sluice_curl_loop *loop_with(struct sluice_engine *e, struct tracker *t,
                                          struct req *const qs[])
{
    struct sluice_curl_loop *loop = loop_create(e, 0);
    tracker_init(t);
    for (; *qs; qs++)
        req_init(*qs, t);
    return loop;
}

/* The pool holds nothing; then the loop, the requests' handles and the engine go. */
static void loop_done_idle(struct sluice_engine *e, struct sluice_curl_loop *loop,
                           struct req *const qs[])
{
    fx_assert_idle(e);
    sluice_curl_loop_destroy(loop);
    for (; *qs; qs++)
        curl_easy_cleanup((*qs)->easy);
    sluice_engine_destroy(e);
}

static void wait_in_flight(long n)
{
    int64_t until = fx_now_ms() + 5000;
    while (fx_stats().in_flight < n)
        cr_assert_lt(fx_now_ms(), until, "the simulator never saw %ld calls in flight", n);
}

/* ---- discovery: 200 concurrent submissions from 4 threads ------------------------------- */

#define SUBMITTERS 4
#define PER_SUBMITTER 50

/* A submitter's handles come back to it through this queue (from the loop thread). */
struct submitter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct req *back[PER_SUBMITTER];
    int n_back;
    struct req reqs[PER_SUBMITTER];
    struct sluice_curl_loop *loop;
    struct tracker *t;
    _Atomic(bool) *stop;
    long rejected;
};

static void on_done_requeue(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    on_done(r, easy, data);
    struct req *q = (struct req *)data;
    struct submitter *s = (struct submitter *)q->owner;
    atomic_store(&q->done_count, 0);
    pthread_mutex_lock(&s->mu);
    s->back[s->n_back++] = q;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *submitter_main(void *arg)
{
    struct submitter *s = (struct submitter *)arg;
    for (int i = 0; i < PER_SUBMITTER; i++)
        s->back[s->n_back++] = &s->reqs[i];
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(s->stop) || s->n_back < PER_SUBMITTER) {
        if (atomic_load(s->stop) || s->n_back == 0) {
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 20000000L;
            if (t.tv_nsec >= 1000000000L) {
                t.tv_sec++;
                t.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &t);
            continue;
        }
        struct req *q = s->back[--s->n_back];
        pthread_mutex_unlock(&s->mu);
        struct sluice_curl_request rq = req_of(q, false);
        rq.done = on_done_requeue;
        int status = sluice_curl_loop_submit(s->loop, &rq, &q->id);
        pthread_mutex_lock(&s->mu);
        if (status != SLUICE_OK) {
            s->rejected++;
            s->back[s->n_back++] = q;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

LOOP_TEST(reject_mode_cap_24_is_discovered_by_200_concurrent_submissions_from_4_threads)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 24,
                                   .median_ms = FX_DISCOVERY_MEDIAN_MS});
    struct sluice_discovery_desc dd = fx_discovery();
    struct sluice_engine *e = fx_engine(64, -1, &dd);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    struct tracker t;
    tracker_init(&t);
    _Atomic(bool) stop = false;
    static struct submitter s[SUBMITTERS];
    pthread_t th[SUBMITTERS];
    for (int i = 0; i < SUBMITTERS; i++) {
        memset(&s[i], 0, sizeof s[i]);
        pthread_mutex_init(&s[i].mu, NULL);
        pthread_cond_init(&s[i].cv, NULL);
        s[i].loop = loop;
        s[i].t = &t;
        s[i].stop = &stop;
        for (int k = 0; k < PER_SUBMITTER; k++) {
            req_init(&s[i].reqs[k], &t);
            s[i].reqs[k].owner = &s[i];
        }
        pthread_create(&th[i], NULL, submitter_main, &s[i]);
    }
    int64_t start = fx_now_ms(), until = start + 20000, locked_at = 0;
    long peak_live = 0;
    while (fx_now_ms() < until && (!locked_at || fx_now_ms() < locked_at + 3000)) {
        if (!locked_at && fx_status(e).state == SLUICE_DISCOVERY_LOCKED)
            locked_at = fx_now_ms();
        long live = sluice_curl_loop_stats(loop).live;
        peak_live = live > peak_live ? live : peak_live;
        fx_sleep_ms(10);
    }
    atomic_store(&stop, true);
    long rejected = 0;
    for (int i = 0; i < SUBMITTERS; i++) {
        pthread_join(th[i], NULL);
        rejected += s[i].rejected;
    }
    struct sluice_discovery_status st = fx_status(e);
    pthread_mutex_lock(&t.mu);
    long done = t.done, ok = t.by_status[0], overloads = t.overloads;
    pthread_mutex_unlock(&t.mu);
    double share = (double)overloads / (double)(done ? done : 1);
    char path[2048];
    fx_event_path(e, path, sizeof path);
    fprintf(stderr,
            "curl_loop discovery: %s ceiling %u limit %u after %.2f s; %ld calls, 429 share "
            "%.4f, peak %ld live requests; events:%s\n",
            sluice_discovery_state_name(st.state), st.ceiling, st.limit,
            locked_at ? (double)(locked_at - start) / 1000.0 : -1.0, done, share, peak_live, path);
    cr_assert_eq(rejected, 0, "%ld submissions were refused", rejected);
    cr_assert_eq(ok, done, "%ld of %ld calls failed", done - ok, done);
    cr_assert_geq(peak_live, 150, "the 4 threads never had ~200 requests in the loop");
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED, "not locked after 20 s: %s",
                 sluice_discovery_state_name(st.state));
    cr_assert(st.ceiling >= 0.85 * 24 && st.ceiling <= 24, "locked ceiling %u outside [0.85C, C]",
              st.ceiling);
    cr_assert_leq(share, 0.02, "429 share %.4f above 2%%", share);
    sluice_curl_loop_destroy(loop);
    for (int i = 0; i < SUBMITTERS; i++)
        for (int k = 0; k < PER_SUBMITTER; k++)
            curl_easy_cleanup(s[i].reqs[k].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- admission at submit ----------------------------------------------------------------- */

struct burst {
    struct sluice_curl_loop *loop;
    struct req *reqs;
    int n;
    pthread_barrier_t *go;
    long rejected, other;
};

static void *burst_main(void *arg)
{
    struct burst *b = (struct burst *)arg;
    pthread_barrier_wait(b->go);
    for (int i = 0; i < b->n; i++) {
        int status = submit(b->loop, &b->reqs[i], false);
        if (status == SLUICE_ECAPACITY)
            b->rejected++;
        else if (status != SLUICE_OK)
            b->other++;
    }
    return NULL;
}

LOOP_TEST(of_500_simultaneous_submissions_exactly_active_plus_waiting_are_accepted)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 500, .median_ms = 150,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(20, 80, NULL);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    struct tracker t;
    tracker_init(&t);
    enum { N = 500, THREADS = 4 };
    static struct req reqs[N];
    for (int i = 0; i < N; i++)
        req_init(&reqs[i], &t);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, THREADS);
    struct burst b[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        b[i] = (struct burst){loop, reqs + i * (N / THREADS), N / THREADS, &go, 0, 0};
        pthread_create(&th[i], NULL, burst_main, &b[i]);
    }
    long rejected = 0, other = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        rejected += b[i].rejected;
        other += b[i].other;
    }
    cr_assert_eq(other, 0);
    cr_assert_eq(rejected, 400, "%ld rejected", rejected);
    wait_done(&t, 100, 15000);
    fx_sleep_ms(50);
    pthread_mutex_lock(&t.mu);
    cr_assert_eq(t.done, 100, "%ld completions", t.done);
    cr_assert_eq(t.by_status[0], 100, "not every accepted request succeeded");
    pthread_mutex_unlock(&t.mu);
    for (int i = 0; i < N; i++)
        cr_assert_leq(atomic_load(&reqs[i].done_count), 1, "request %d completed twice", i);
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.requests, 100);
    cr_assert_leq(s.peak_in_flight, 20, "the simulator saw %ld at once", s.peak_in_flight);
    cr_assert_geq(s.peak_in_flight, 15, "the permits were not used: peak %ld", s.peak_in_flight);
    sluice_curl_loop_destroy(loop);
    for (int i = 0; i < N; i++)
        curl_easy_cleanup(reqs[i].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

LOOP_TEST(submissions_past_max_requests_get_eagain_and_unknown_backends_einval)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 300,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(8, -1, NULL);
    struct sluice_curl_loop *loop = loop_create(e, 2);
    struct tracker t;
    tracker_init(&t);
    struct req q[3];
    for (int i = 0; i < 3; i++)
        req_init(&q[i], &t);
    cr_assert_eq(submit(loop, &q[0], false), SLUICE_OK);
    cr_assert_eq(submit(loop, &q[1], false), SLUICE_OK);
    cr_assert_eq(submit(loop, &q[2], false), SLUICE_EAGAIN);
    cr_assert_eq(fx_counts(e).admitted, 2, "the refused submission kept its admission");
    struct sluice_curl_request bad = req_of(&q[2], false);
    bad.backend = "nobody";
    cr_assert_eq(sluice_curl_loop_submit(loop, &bad, NULL), SLUICE_EINVAL);
    bad.backend = FX_BACKEND;
    bad.done = NULL;
    cr_assert_eq(sluice_curl_loop_submit(loop, &bad, NULL), SLUICE_EINVAL);
    wait_done(&t, 2, 5000);
    cr_assert_eq(submit(loop, &q[2], false), SLUICE_OK, "completed records are reused");
    wait_done(&t, 3, 5000);
    sluice_curl_loop_destroy(loop);
    for (int i = 0; i < 3; i++)
        curl_easy_cleanup(q[i].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

static void watch_nothing(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    (void)ctx, (void)fd, (void)what, (void)socketp;
}

static void timer_nothing(void *ctx, long timeout_ms)
{
    (void)ctx, (void)timeout_ms;
}

LOOP_TEST(a_bad_description_or_deadline_fails_with_einval_and_a_message_naming_the_field)
{
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    const struct {
        struct sluice_curl_loop_desc d;
        const char *expect;
    } cases[] = {
        {{.engine = NULL}, "engine is NULL"},
        {{.engine = e, .watch = watch_nothing},
         "watch is set but timer is NULL (the embedder's-loop mode needs both; leave both NULL "
         "for the loop's own thread)"},
        {{.engine = e, .timer = timer_nothing}, "timer is set but watch is NULL"},
        {{.engine = e, .max_requests = SLUICE_CURL_LOOP_REQUESTS_MAX + 1},
         "max_requests = 1048577 is above SLUICE_CURL_LOOP_REQUESTS_MAX (1048576)"},
        {{.engine = e, .max_host_connections = -1},
         "max_host_connections = -1 is negative (leave it 0 for"},
        {{.engine = e, .max_total_connections = -2}, "max_total_connections = -2 is negative"},
        {{.engine = e, .max_concurrent_streams = -3}, "max_concurrent_streams = -3 is negative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "untouched";
        struct sluice_curl_loop_desc d = cases[i].d;
        d.error = err;
        d.error_size = sizeof err;
        struct sluice_curl_loop *loop = (struct sluice_curl_loop *)1;
        cr_assert_eq(sluice_curl_loop_create(&d, &loop), SLUICE_EINVAL, "case %zu", i);
        cr_assert_null(loop);
        cr_assert(strstr(err, cases[i].expect), "case %zu: \"%s\" lacks \"%s\"", i, err,
                  cases[i].expect);
    }
    /* A request's deadline that is not normalised completes EINVAL, saying why. */
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&q));
    struct timespec denormal = {.tv_sec = 1, .tv_nsec = -5};
    struct sluice_curl_request rq = req_of(&q, false);
    rq.deadline = &denormal;
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, NULL), SLUICE_OK);
    wait_done(&t, 1, 5000);
    cr_assert_eq(q.r.status, SLUICE_EINVAL, "%s", sluice_status_name(q.r.status));
    cr_assert(strstr(q.r.error, "deadline is not normalised: tv_nsec = -5") == q.r.error,
              "\"%s\"", q.r.error);
    cr_assert_not(q.r.transferred);
    /* A bad start deadline is named as the field the caller set. */
    rq.deadline = NULL;
    rq.start_deadline = &denormal;
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, NULL), SLUICE_OK);
    wait_done(&t, 2, 5000);
    cr_assert_eq(q.r.status, SLUICE_EINVAL, "%s", sluice_status_name(q.r.status));
    cr_assert(strstr(q.r.error, "start_deadline is not normalised: tv_nsec = -5") == q.r.error,
              "\"%s\"", q.r.error);
    sluice_curl_loop_destroy(loop);
    curl_easy_cleanup(q.easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* ---- cancel, deadline, Retry-After ------------------------------------------------------- */

/* The call would take 5 s: a cancel that completes in a fraction of that aborted it (how
 * fast is a matter for bench/, not for a test on a machine others keep busy). */
#define LONG_CALL_MS 5000
LOOP_TEST(cancel_by_id_aborts_a_transfer_and_frees_the_provider_slot)
{
    /* --abandoned free: a provider that frees the slot when the client leaves. */
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = LONG_CALL_MS,
                                   .fixed_latency = true, .abandoned_free = true});
    struct sluice_engine *e = fx_engine(2, -1, NULL);
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&q));
    cr_assert_eq(submit(loop, &q, false), SLUICE_OK);
    wait_in_flight(1);
    cr_assert_eq(sluice_curl_loop_stats(loop).transferring, 1);
    int64_t fired = sluice_monotonic_ns();
    cr_assert_eq(sluice_curl_loop_cancel(loop, q.id), SLUICE_OK);
    wait_done(&t, 1, 2000);
    int64_t took_ms = (q.done_ns - fired) / SLUICE_NS_PER_MS;
    cr_assert_eq(q.r.status, SLUICE_ECANCELED, "status %s", sluice_status_name(q.r.status));
    cr_assert_eq(q.r.kind, SLUICE_CURL_ABORTED);
    cr_assert(q.r.transferred);
    cr_assert_lt(took_ms, LONG_CALL_MS / 2, "the cancel waited %lld ms: the transfer ran on",
                 (long long)took_ms);
    cr_assert_eq(fx_stats_settled().cancelled, 1, "the simulator did not see the close");
    fx_assert_idle(e);
    /* A stale id (already completed) is ignored; a malformed one is refused. */
    cr_assert_eq(sluice_curl_loop_cancel(loop, q.id), SLUICE_OK);
    cr_assert_eq(sluice_curl_loop_cancel(loop, 0), SLUICE_EINVAL);
    sluice_curl_loop_destroy(loop);
    cr_assert_eq(atomic_load(&q.done_count), 1);
    curl_easy_cleanup(q.easy);
    sluice_engine_destroy(e);
}

LOOP_TEST(a_token_cancels_a_request_waiting_for_a_permit_without_touching_the_provider)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 600,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    struct tracker t;
    struct req busy, queued;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&busy, &queued));
    cr_assert_eq(submit(loop, &busy, false), SLUICE_OK);
    wait_in_flight(1);
    cr_assert_eq(submit(loop, &queued, true), SLUICE_OK);
    int64_t until = fx_now_ms() + 2000;
    while (sluice_curl_loop_stats(loop).waiting != 1)
        cr_assert_lt(fx_now_ms(), until, "the second request never waited for a permit");
    sluice_cancel_fire(&queued.token);
    wait_done(&t, 1, 2000);
    cr_assert_eq(atomic_load(&queued.done_count), 1, "the busy one finished first");
    cr_assert_eq(queued.r.status, SLUICE_ECANCELED);
    cr_assert_not(queued.r.transferred);
    wait_done(&t, 2, 5000);
    cr_assert_eq(busy.r.status, SLUICE_OK);
    cr_assert_lt(queued.done_ns, busy.done_ns, "the cancel waited for the permit");
    cr_assert_eq(fx_stats_settled().requests, 1, "the cancelled request reached the simulator");
    cr_assert_eq(fx_counts(e).cancels, 1, "counted as a blocking call's cancel is");
    loop_done_idle(e, loop, REQS(&busy, &queued));
}

LOOP_TEST(deadlines_end_requests_waiting_or_transferring_with_etimedout)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 800,
                                   .fixed_latency = true});
    struct sluice_discovery_desc dd = fx_discovery();
    dd.jumpstart = 1;
    struct sluice_engine *e = fx_engine(4, -1, &dd);
    struct tracker t;
    struct req transferring, waiting;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&transferring, &waiting));
    struct timespec d1, d2;
    struct sluice_curl_request r1 = req_of(&transferring, false);
    r1.deadline = sluice_deadline_in(&d1, 200 * SLUICE_NS_PER_MS);
    struct sluice_curl_request r2 = req_of(&waiting, false);
    r2.deadline = sluice_deadline_in(&d2, 100 * SLUICE_NS_PER_MS);
    int64_t t0 = sluice_monotonic_ns();
    cr_assert_eq(sluice_curl_loop_submit(loop, &r1, NULL), SLUICE_OK);
    cr_assert_eq(sluice_curl_loop_submit(loop, &r2, NULL), SLUICE_OK);
    wait_done(&t, 2, 3000);
    cr_assert_eq(waiting.r.status, SLUICE_ETIMEDOUT);
    cr_assert_not(waiting.r.transferred, "the limit of 1 let it start");
    cr_assert_eq(transferring.r.status, SLUICE_ETIMEDOUT);
    cr_assert(transferring.r.transferred);
    cr_assert_eq(transferring.r.outcome, SLUICE_OUTCOME_IGNORE);
    int64_t ms1 = (transferring.done_ns - t0) / SLUICE_NS_PER_MS;
    int64_t ms2 = (waiting.done_ns - t0) / SLUICE_NS_PER_MS;
    cr_assert(ms2 >= 95 && ms2 < 400, "the waiting one ended after %lld ms", (long long)ms2);
    cr_assert(ms1 >= 195 && ms1 < 600, "the transfer ended after %lld ms", (long long)ms1);
    cr_assert_eq(fx_stats_settled().cancelled, 1);
    cr_assert_eq(fx_status(e).limit, 1, "a deadline moved the limit");
    cr_assert_eq(fx_counts(e).timeouts, 2, "the wait and the transfer, as on the blocking path");
    loop_done_idle(e, loop, REQS(&transferring, &waiting));
}

/* A request admitted on a prediction that proves wrong leaves the line at its wait bound
 * (its deadline less the median service time), and the pool counts it refused late, with its
 * wait in the queue-wait histogram, as a blocking call's (the operator's /metrics read these). */
LOOP_TEST(a_request_that_leaves_the_line_at_its_wait_bound_is_counted_refused_late)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = LONG_CALL_MS,
                                   .fixed_latency = true, .abandoned_free = true});
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    fx_teach_service(e, 200 * SLUICE_NS_PER_MS, SLUICE_SERVICE_MIN_SAMPLES); /* a wrong guess */
    struct tracker t;
    struct req busy, queued;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&busy, &queued));
    cr_assert_eq(submit(loop, &busy, false), SLUICE_OK);
    wait_in_flight(1);
    struct sluice_histogram_counts before;
    sluice_pool_histograms(sluice_engine_pool(e, FX_BACKEND), &before, NULL);
    /* Predicted: 200 ms of wait, then 200 ms of call, inside 1 s; it may wait until 800 ms. */
    struct timespec d;
    struct sluice_curl_request rq = req_of(&queued, false);
    rq.deadline = sluice_deadline_in(&d, 1000 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, NULL), SLUICE_OK);
    wait_done(&t, 1, 5000);
    cr_assert_eq(queued.r.status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(queued.r.status));
    cr_assert(queued.r.refused_late, "it left before its deadline");
    cr_assert_not(queued.r.transferred);
    struct sluice_pool_counts c = fx_counts(e);
    cr_assert_eq(c.refused_late, 1);
    cr_assert_eq(c.timeouts, 0, "a refusal before the start is not a timeout");
    struct sluice_histogram_counts after;
    sluice_pool_histograms(sluice_engine_pool(e, FX_BACKEND), &after, NULL);
    cr_assert_eq(after.count, before.count + 1, "its wait is in the queue-wait histogram");
    cr_assert_eq(sluice_curl_loop_cancel(loop, busy.id), SLUICE_OK);
    wait_done(&t, 2, 5000);
    loop_done_idle(e, loop, REQS(&busy, &queued));
}

/* The loop reads a request's deadline long after submit returned (at the permit, when the
 * transfer ends): it must be the value at submit, whatever becomes of the caller's timespec. */
LOOP_TEST(a_deadline_is_the_value_at_submit_whatever_becomes_of_the_callers_timespec)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 800,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct tracker t;
    struct req reused, freed;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&reused, &freed));
    /* One timespec the submitter reuses at once (a later deadline), one it frees (ASan). */
    struct timespec on_stack;
    struct sluice_curl_request r1 = req_of(&reused, false);
    r1.deadline = sluice_deadline_in(&on_stack, 150 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_curl_loop_submit(loop, &r1, NULL), SLUICE_OK);
    sluice_deadline_in(&on_stack, 60 * SLUICE_NS_PER_SEC);
    struct timespec *on_heap = malloc(sizeof *on_heap);
    cr_assert_not_null(on_heap);
    struct sluice_curl_request r2 = req_of(&freed, false);
    r2.deadline = sluice_deadline_in(on_heap, 150 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_curl_loop_submit(loop, &r2, NULL), SLUICE_OK);
    free(on_heap);
    wait_done(&t, 2, 5000);
    struct req *both[] = {&reused, &freed};
    for (int i = 0; i < 2; i++) {
        /* The simulator answers after 800 ms: only the 150 ms deadline ends it early. */
        cr_assert_eq(both[i]->r.status, SLUICE_ETIMEDOUT, "request %d: %s", i,
                     sluice_status_name(both[i]->r.status));
        cr_assert_eq(both[i]->r.kind, SLUICE_CURL_ABORTED, "request %d: %s", i,
                     sluice_curl_kind_name(both[i]->r.kind));
        cr_assert(both[i]->r.transferred, "request %d never started", i);
    }
    loop_done_idle(e, loop, REQS(&reused, &freed));
}

/* A request with 2 s left on a backend taught that calls take 10 s, submitted under `rules`:
 * the submit's status. */
static int submit_hopeless(const struct sluice_deadline_desc *rules, struct sluice_engine **e,
                           struct tracker *t, struct req *q, struct sluice_curl_loop **loop)
{
    *e = fx_engine_with(2, -1, NULL, rules);
    fx_teach_service(*e, 10 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_MIN_SAMPLES);
    *loop = loop_with(*e, t, REQS(q));
    struct timespec d;
    struct sluice_curl_request rq = req_of(q, false);
    rq.deadline = sluice_deadline_in(&d, 2 * SLUICE_NS_PER_SEC);
    return sluice_curl_loop_submit(*loop, &rq, NULL);
}

/* By default submit refuses it at once (SLUICE_ELATE); with queue_late it is admitted, and
 * the start rule is what stops it. Either way it never reaches the provider. */
LOOP_TEST(a_request_with_less_time_left_than_the_expected_service_never_starts_its_transfer)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 50});
    struct sluice_engine *e;
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop;
    cr_assert_eq(submit_hopeless(&(struct sluice_deadline_desc){0}, &e, &t, &q, &loop),
                 SLUICE_ELATE);
    cr_assert_eq(fx_counts(e).refused_early, 1);
    loop_done_idle(e, loop, REQS(&q));
    cr_assert_eq(submit_hopeless(&(struct sluice_deadline_desc){.queue_late = true}, &e, &t, &q,
                                 &loop),
                 SLUICE_OK);
    wait_done(&t, 1, 3000);
    cr_assert_eq(q.r.status, SLUICE_ETIMEDOUT);
    cr_assert(q.r.refused_late);
    cr_assert_not(q.r.transferred);
    cr_assert_eq(fx_stats_settled().requests, 0, "the provider got the request");
    loop_done_idle(e, loop, REQS(&q));
}

LOOP_TEST(an_abandoned_transfer_lingers_and_the_loop_releases_it_with_no_other_traffic)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 600,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    fx_teach_service(e, 1 * SLUICE_NS_PER_SEC, SLUICE_SERVICE_MIN_SAMPLES);
    struct tracker t;
    struct req first, second;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&first, &second));
    cr_assert_eq(submit(loop, &first, false), SLUICE_OK);
    WAIT_UNTIL(fx_stats().in_flight == 1); /* the request reached the provider */
    cr_assert_eq(submit(loop, &second, false), SLUICE_OK);
    WAIT_UNTIL(fx_counts(e).queued == 1);
    /* Abandoned mid-transfer by a cancel: its permit lingers until about 1 s after its start,
     * and the queued request gets it from the loop's timer, with nothing else running. */
    cr_assert_eq(sluice_curl_loop_cancel(loop, first.id), SLUICE_OK);
    wait_done(&t, 1, 3000);
    cr_assert_eq(first.r.status, SLUICE_ECANCELED);
    cr_assert(first.r.abandoned);
    cr_assert_eq(fx_counts(e).lingering, 1);
    wait_done(&t, 2, 5000);
    cr_assert_eq(second.r.status, SLUICE_OK);
    cr_assert_eq(fx_counts(e).lingered, 1);
    cr_assert_eq(fx_counts(e).lingering, 0);
    loop_done_idle(e, loop, REQS(&first, &second));
}

/* ---- reading a cut answer on (sluice_curl_request.cut) ------------------------------------ */

static size_t count_body(char *bytes, size_t size, size_t n, void *data)
{
    (void)bytes;
    ((struct req *)data)->body_bytes += size * n;
    return size * n;
}

static void on_cut(const struct sluice_curl_result *r, void *data)
{
    struct req *q = (struct req *)data;
    q->cut_r = *r;
    q->done_at_cut = atomic_load(&q->done_count);
    atomic_fetch_add(&q->cut_count, 1);
}

/* One request with a 300 ms deadline and `cut` to a provider that answers after `answer_ms`,
 * on a pool of 2 whose abandoned calls do `linger` (for at most `linger_max_ms` from their
 * start; 0: the default) and that has seen calls of `seen_ms` (it starts every call: the
 * deadline rules would refuse one expected to outlast its deadline). */
static struct sluice_curl_loop *submit_read_on(int answer_ms, enum sluice_linger linger,
                                               uint32_t linger_max_ms, int seen_ms,
                                               struct sluice_engine **e, struct tracker *t,
                                               struct req *q)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = answer_ms,
                                   .fixed_latency = true});
    struct sluice_deadline_desc dl = {.start_quantile = SLUICE_SOME(0), .linger = linger};
    if (linger_max_ms)
        dl.linger_max_ms = SLUICE_SOME(linger_max_ms);
    *e = fx_engine_with(2, -1, NULL, &dl);
    fx_teach_service(*e, seen_ms * SLUICE_NS_PER_MS, SLUICE_SERVICE_MIN_SAMPLES);
    struct sluice_curl_loop *loop = loop_with(*e, t, REQS(q));
    curl_easy_setopt(q->easy, CURLOPT_WRITEFUNCTION, count_body);
    curl_easy_setopt(q->easy, CURLOPT_WRITEDATA, q);
    struct timespec d;
    struct sluice_curl_request rq = req_of(q, false);
    rq.deadline = sluice_deadline_in(&d, 300 * SLUICE_NS_PER_MS);
    rq.write = count_body;
    rq.write_data = q;
    rq.cut = on_cut;
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, &q->id), SLUICE_OK);
    return loop;
}

/* A request that answers after 900 ms, cut at 300 ms on a pool that has seen calls of `seen_ms`
 * and keeps permits: answered at the cut, read on to the provider's end. */
static void read_on_to_the_providers_end(int seen_ms)
{
    struct sluice_engine *e;
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop = submit_read_on(900, SLUICE_LINGER_ON, 0, seen_ms, &e, &t, &q);
    WAIT_UNTIL(atomic_load(&q.cut_count) == 1);
    cr_assert_eq(q.done_at_cut, 0, "cut came after done");
    cr_assert_eq(q.cut_r.status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(q.cut_r.status));
    cr_assert_eq(q.cut_r.expired, SLUICE_EXPIRED_CALL);
    /* Read before the provider is known to be unfinished (a loaded machine may wake this
     * thread after the answer came), so the permit cannot have come back with it. */
    struct sluice_pool_counts c = fx_counts(e);
    if (fx_stats().ok == 0) {
        cr_assert_eq(c.in_flight, 1, "read on, the call keeps its permit");
        cr_assert_eq(c.lingering, 0, "... as a call in flight, not a lingering one");
    }
    cr_assert_eq(c.timeouts, 1, "its caller's deadline is counted");
    wait_done(&t, 1, 3000);
    cr_assert_eq(atomic_load(&q.cut_count), 1);
    cr_assert_eq(q.r.status, SLUICE_OK, "done says how the answer ended (cut at the estimate?): %s",
                 sluice_status_name(q.r.status));
    cr_assert_eq(q.r.http_status, 200);
    cr_assert_eq(q.body_bytes, 0, "the caller's write saw the answer it had given up on");
    cr_assert_eq(fx_stats_settled().ok, 1, "the provider finished the call");
    c = fx_counts(e);
    cr_assert_eq(c.in_flight, 0);
    cr_assert_eq(c.lingered, 0, "the permit came back with the answer, no estimate kept it");
    cr_assert_eq(c.timeouts, 1);
    loop_done_idle(e, loop, REQS(&q));
}

/* Calls seen to take 2 s: the pool would keep the permit. */
LOOP_TEST(a_transfer_past_its_deadline_is_answered_there_and_read_on_to_the_providers_end)
{
    read_on_to_the_providers_end(2000);
}

/* Calls seen to take 100 ms, this one 900: the answer still coming is the provider's own word
 * that it still runs the call, so it is read on past the estimate. */
LOOP_TEST(a_transfer_read_on_past_the_pools_estimate_goes_on_to_the_providers_end)
{
    read_on_to_the_providers_end(100);
}

LOOP_TEST(a_transfer_read_on_past_linger_max_is_cut_after_all)
{
    struct sluice_engine *e;
    struct tracker t;
    struct req q;
    /* This one takes 20 s; permits are kept and answers read on 1.5 s at most. */
    struct sluice_curl_loop *loop = submit_read_on(20000, SLUICE_LINGER_ON, 1500, 400, &e, &t, &q);
    WAIT_UNTIL(atomic_load(&q.cut_count) == 1);
    wait_done(&t, 1, 5000);
    cr_assert_eq(q.r.status, SLUICE_ETIMEDOUT, "%s", sluice_status_name(q.r.status));
    cr_assert(q.r.abandoned);
    cr_assert_eq(fx_counts(e).timeouts, 1, "one deadline, counted once");
    loop_done_idle(e, loop, REQS(&q));
}

LOOP_TEST(where_the_pool_keeps_no_permit_a_transfer_with_cut_is_cut_at_its_deadline)
{
    struct sluice_engine *e;
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop = submit_read_on(900, SLUICE_LINGER_OFF, 0, 2000, &e, &t, &q);
    wait_done(&t, 1, 3000);
    cr_assert_eq(atomic_load(&q.cut_count), 0, "read on where the provider frees the slot");
    cr_assert_eq(q.r.status, SLUICE_ETIMEDOUT);
    cr_assert_eq(q.r.expired, SLUICE_EXPIRED_CALL);
    cr_assert(q.r.abandoned);
    cr_assert_eq(fx_counts(e).in_flight, 0, "the permit came back at the deadline");
    cr_assert_eq(fx_counts(e).timeouts, 1);
    loop_done_idle(e, loop, REQS(&q));
}

LOOP_TEST(cut_without_write_is_refused_at_submit)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 10});
    struct sluice_engine *e = fx_engine(2, -1, NULL);
    struct tracker t;
    struct req q;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&q));
    struct sluice_curl_request rq = req_of(&q, false);
    rq.cut = on_cut;
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, NULL), SLUICE_EINVAL);
    loop_done_idle(e, loop, REQS(&q));
}

LOOP_TEST(no_request_goes_out_while_a_retry_after_hold_lasts)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 1, .median_ms = 400,
                                   .fixed_latency = true, .retry_after = 1,
                                   .retry_after_date = true});
    struct sluice_discovery_desc dd = fx_discovery();
    dd.jumpstart = 4;
    struct sluice_engine *e = fx_engine(4, -1, &dd);
    struct tracker t;
    struct req busy, refused, held;
    struct sluice_curl_loop *loop = loop_with(e, &t, REQS(&busy, &refused, &held));
    cr_assert_eq(submit(loop, &busy, false), SLUICE_OK);
    wait_in_flight(1);
    cr_assert_eq(submit(loop, &refused, false), SLUICE_OK);
    wait_done(&t, 1, 2000);
    cr_assert_eq(refused.r.http_status, 429);
    cr_assert_gt(refused.r.retry_after_ns, 0, "the HTTP-date Retry-After was not read");
    long before = fx_stats().requests;
    cr_assert_eq(submit(loop, &held, false), SLUICE_OK);
    fx_sleep_ms(600); /* the busy call ends meanwhile */
    cr_assert_eq(fx_stats().requests, before, "a request went out during the hold");
    wait_done(&t, 3, 5000);
    cr_assert_eq(held.r.status, SLUICE_OK);
    cr_assert_eq(held.r.http_status, 200);
    cr_assert_geq(held.done_ns - refused.done_ns, refused.r.retry_after_ns - 100 * SLUICE_NS_PER_MS,
                  "the held call did not wait out the hold");
    loop_done_idle(e, loop, REQS(&busy, &refused, &held));
}

/* ---- shutdown and keep-alive --------------------------------------------------------------- */

LOOP_TEST(shutdown_completes_every_request_with_eclosed_and_leaks_nothing)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = LONG_CALL_MS,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(2, -1, NULL);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    struct tracker t;
    tracker_init(&t);
    enum { N = 6 };
    struct req q[N];
    for (int i = 0; i < N; i++) {
        req_init(&q[i], &t);
        cr_assert_eq(submit(loop, &q[i], i % 2 == 0), SLUICE_OK);
    }
    wait_in_flight(2);
    int64_t t0 = sluice_monotonic_ns();
    sluice_curl_loop_close(loop);
    cr_assert_lt(sluice_monotonic_ns() - t0, LONG_CALL_MS / 2 * SLUICE_NS_PER_MS,
                 "close waited for the transfers");
    cr_assert_eq(t.done, N, "close returned before every completion");
    cr_assert_eq(t.by_status[3], N, "not every request completed with ECLOSED");
    int transferred = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(atomic_load(&q[i].done_count), 1);
        transferred += q[i].r.transferred;
    }
    cr_assert_eq(transferred, 2, "the running ones are the aborted transfers");
    struct req late;
    req_init(&late, &t);
    cr_assert_eq(submit(loop, &late, false), SLUICE_ECLOSED);
    cr_assert_eq(fx_stats_settled().cancelled, 2, "the simulator did not see both closes");
    fx_assert_idle(e);
    sluice_curl_loop_destroy(loop);
    for (int i = 0; i < N; i++)
        curl_easy_cleanup(q[i].easy);
    curl_easy_cleanup(late.easy);
    sluice_engine_destroy(e);
}

LOOP_TEST(sequential_requests_reuse_one_connection)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = FX_ZERO});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    struct tracker t;
    tracker_init(&t);
    long connects = 0;
    for (int i = 0; i < 10; i++) {
        struct req q;
        req_init(&q, &t);
        cr_assert_eq(submit(loop, &q, false), SLUICE_OK);
        wait_done(&t, i + 1, 2000);
        cr_assert_eq(q.r.status, SLUICE_OK);
        long n = 0;
        curl_easy_getinfo(q.easy, CURLINFO_NUM_CONNECTS, &n);
        connects += n;
        curl_easy_cleanup(q.easy);
    }
    cr_assert_eq(connects, 1, "%ld connections for 10 requests", connects);
    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(e);
}

/* A request that holds a permit never waits inside libcurl for a connection that a request
 * without one (the endpoint-only backend: a health check, a model list) is using: the caps
 * derived from the permits, here 1 (no built-in backend), grow by one while each of those
 * runs. */
LOOP_TEST(an_endpoint_only_transfer_never_takes_the_connection_a_permit_needs)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = FX_ZERO});
    struct sluice_backend_desc b = {.id = FX_BACKEND, .active = 1};
    struct sluice_engine_desc ed = {.backends = &b, .n_backends = 1, .omit_openrouter = true};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&ed, &e), SLUICE_OK);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    /* An endpoint that takes the connection and never answers: nobody accepts on it. */
    int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(silent >= 0 && bind(silent, (struct sockaddr *)&a, sizeof a) == 0 &&
              listen(silent, 4) == 0 && getsockname(silent, (struct sockaddr *)&a, &len) == 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/models", ntohs(a.sin_port));
    struct tracker t;
    tracker_init(&t);
    struct req unanswered, held;
    req_init(&unanswered, &t);
    curl_easy_cleanup(unanswered.easy);
    unanswered.easy = fx_easy_url(url);
    curl_easy_setopt(unanswered.easy, CURLOPT_TIMEOUT_MS, 3000L);
    struct sluice_curl_request rq = req_of(&unanswered, false);
    rq.backend = NULL;
    cr_assert_eq(sluice_curl_loop_submit(loop, &rq, &unanswered.id), SLUICE_OK);
    fx_sleep_ms(200); /* connected, its request sent */
    req_init(&held, &t);
    cr_assert_eq(submit(loop, &held, false), SLUICE_OK);
    wait_done(&t, 1, 5000);
    cr_assert_eq(atomic_load(&held.done_count), 1,
                 "the request holding the permit waited for the endpoint-only one's connection "
                 "(which ended first: %s)",
                 curl_easy_strerror(unanswered.r.curl_code));
    cr_assert_eq(held.r.status, SLUICE_OK);
    wait_done(&t, 2, 5000);
    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(e);
    curl_easy_cleanup(unanswered.easy);
    curl_easy_cleanup(held.easy);
    close(silent);
}

/* ---- the embedder's loop: a plain epoll loop -------------------------------------------- */

struct ep {
    int fd;
    long timeout_ms; /* -1 = none */
    int64_t timer_at_ns;
};

static void ep_watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    (void)socketp;
    struct ep *ep = (struct ep *)ctx;
    struct epoll_event ev = {0};
    ev.data.fd = fd;
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(ep->fd, EPOLL_CTL_DEL, fd, NULL);
        return;
    }
    if (epoll_ctl(ep->fd, EPOLL_CTL_MOD, fd, &ev) != 0)
        epoll_ctl(ep->fd, EPOLL_CTL_ADD, fd, &ev);
}

static void ep_timer(void *ctx, long timeout_ms)
{
    struct ep *ep = (struct ep *)ctx;
    ep->timeout_ms = timeout_ms;
    ep->timer_at_ns = timeout_ms < 0 ? -1 : sluice_monotonic_ns() + timeout_ms * SLUICE_NS_PER_MS;
}

/* One round of the embedder's loop: wait for sockets or the timer, then act. */
static void ep_run_once(struct ep *ep, struct sluice_curl_loop *loop, int max_ms)
{
    int wait = max_ms;
    if (ep->timer_at_ns >= 0) {
        int64_t left = (ep->timer_at_ns - sluice_monotonic_ns()) / SLUICE_NS_PER_MS;
        wait = left < 0 ? 0 : (left < wait ? (int)left : wait);
    }
    struct epoll_event evs[16];
    int n = epoll_wait(ep->fd, evs, 16, wait);
    for (int i = 0; i < n; i++) {
        int events = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                     (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                     (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
        sluice_curl_loop_action(loop, evs[i].data.fd, events);
    }
    if (ep->timer_at_ns >= 0 && sluice_monotonic_ns() >= ep->timer_at_ns) {
        ep->timer_at_ns = -1;
        sluice_curl_loop_action(loop, CURL_SOCKET_TIMEOUT, 0);
    }
}

static struct sluice_curl_loop *ep_loop_create(struct ep *ep, struct sluice_engine *e)
{
    ep->fd = epoll_create1(EPOLL_CLOEXEC);
    ep->timer_at_ns = -1;
    struct sluice_curl_loop *loop = NULL;
    struct sluice_curl_loop_desc d = {.engine = e, .watch = ep_watch, .timer = ep_timer, .ctx = ep};
    cr_assert_eq(sluice_curl_loop_create(&d, &loop), SLUICE_OK);
    return loop;
}

LOOP_TEST(an_epoll_loop_drives_the_embedded_mode_to_completion)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 64, .median_ms = 30});
    struct sluice_engine *e = fx_engine(8, -1, NULL);
    struct ep ep;
    struct sluice_curl_loop *loop = ep_loop_create(&ep, e);
    struct tracker t;
    tracker_init(&t);
    enum { N = 40 };
    struct req q[N];
    for (int i = 0; i < N; i++) {
        req_init(&q[i], &t);
        cr_assert_eq(submit(loop, &q[i], false), SLUICE_OK);
    }
    int64_t until = fx_now_ms() + 10000;
    while (t.done < N && fx_now_ms() < until)
        ep_run_once(&ep, loop, 100);
    cr_assert_eq(t.done, N, "%ld of %d completed", t.done, N);
    cr_assert_eq(t.by_status[0], N);
    struct fx_stats s = fx_stats_settled();
    cr_assert_eq(s.requests, N);
    cr_assert_leq(s.peak_in_flight, 8);
    sluice_curl_loop_destroy(loop);
    close(ep.fd);
    for (int i = 0; i < N; i++)
        curl_easy_cleanup(q[i].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

/* A per-socket record an embedder keeps in watch's socketp (instead of a table by fd). */
struct sock_rec {
    curl_socket_t fd;
    int calls;
};

struct ep_tracked {
    struct ep ep; /* first: ep_watch's ctx */
    int made, freed, wrong, reused;
};

static void ep_watch_tracked(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    struct ep_tracked *t = (struct ep_tracked *)ctx;
    struct sock_rec *rec = (struct sock_rec *)*socketp;
    if (!rec) {
        rec = (struct sock_rec *)calloc(1, sizeof *rec);
        cr_assert_not_null(rec);
        rec->fd = fd;
        *socketp = rec;
        t->made++;
    } else {
        t->reused++;
    }
    t->wrong += rec->fd != fd;
    rec->calls++;
    ep_watch(&t->ep, fd, what, socketp);
    if (what == CURL_POLL_REMOVE) {
        free(rec);
        *socketp = NULL;
        t->freed++;
    }
}

LOOP_TEST(the_watch_callback_gets_back_the_pointer_it_set_for_each_socket)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 64, .median_ms = 20});
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct ep_tracked t = {0};
    t.ep.fd = epoll_create1(EPOLL_CLOEXEC);
    t.ep.timer_at_ns = -1;
    struct sluice_curl_loop *loop = NULL;
    struct sluice_curl_loop_desc d = {
        .engine = e, .watch = ep_watch_tracked, .timer = ep_timer, .ctx = &t};
    cr_assert_eq(sluice_curl_loop_create(&d, &loop), SLUICE_OK);
    cr_assert_eq(t.made, 1, "the wake-up descriptor got its own record at create");
    struct tracker tr;
    tracker_init(&tr);
    enum { N = 8 };
    struct req q[N];
    for (int i = 0; i < N; i++) {
        req_init(&q[i], &tr);
        /* A fresh connection each: each socket's watch/remove cycle is seen. */
        curl_easy_setopt(q[i].easy, CURLOPT_FORBID_REUSE, 1L);
        cr_assert_eq(submit(loop, &q[i], false), SLUICE_OK);
    }
    int64_t until = fx_now_ms() + 10000;
    while (tr.done < N && fx_now_ms() < until)
        ep_run_once(&t.ep, loop, 100);
    cr_assert_eq(tr.done, N, "%ld of %d completed", tr.done, N);
    sluice_curl_loop_destroy(loop);
    cr_assert_eq(t.wrong, 0, "a socket got another socket's pointer");
    cr_assert_geq(t.made, 1 + N, "one record per connection and the wake-up descriptor");
    cr_assert_gt(t.reused, 0, "later calls for a socket got its pointer back");
    cr_assert_eq(t.freed, t.made, "every record came back with CURL_POLL_REMOVE");
    close(t.ep.fd);
    for (int i = 0; i < N; i++)
        curl_easy_cleanup(q[i].easy);
    sluice_engine_destroy(e);
}

/* A zero-delay provider, an engine of 4 over it, an epoll embedder's loop, and the requests
 * `qs`, each fresh and tracked by *t. */
static struct sluice_curl_loop *ep_zero_delay(struct ep *ep, struct sluice_engine **e,
                                              struct tracker *t, struct req *const qs[])
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = FX_ZERO});
    *e = fx_engine(4, -1, NULL);
    tracker_init(t);
    for (; *qs; qs++)
        req_init(*qs, t);
    return ep_loop_create(ep, *e);
}

/* Run the embedder's loop until `n` requests are done (5 s at most). */
static void ep_run_until_done(struct ep *ep, struct sluice_curl_loop *loop, struct tracker *t,
                              long n)
{
    int64_t until = fx_now_ms() + 5000;
    while (t->done < n && fx_now_ms() < until)
        ep_run_once(ep, loop, 50);
}

/* The loop, its epoll descriptor and the requests' handles go; then the pool holds nothing,
 * and the engine goes. */
static void ep_done_idle(struct sluice_engine *e, struct ep *ep, struct sluice_curl_loop *loop,
                         struct req *const qs[])
{
    sluice_curl_loop_destroy(loop);
    close(ep->fd);
    for (; *qs; qs++)
        curl_easy_cleanup((*qs)->easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

struct submit_from {
    struct sluice_curl_loop *loop;
    struct req *q;
    int status;
};

static void *submit_thread(void *arg)
{
    struct submit_from *s = arg;
    s->status = submit(s->loop, s->q, false);
    return NULL;
}

LOOP_TEST(a_submit_on_the_embedders_thread_asks_for_the_timer_and_one_from_another_wakes_it)
{
    struct sluice_engine *e;
    struct ep ep;
    struct tracker t;
    struct req here, there;
    struct sluice_curl_loop *loop = ep_zero_delay(&ep, &e, &t, REQS(&here, &there));
    struct epoll_event ev;
    ep.timeout_ms = -1;
    cr_assert_eq(submit(loop, &here, false), SLUICE_OK);
    cr_assert_eq(ep.timeout_ms, 0, "the loop's own thread, between actions: the timer at 0 ms");
    cr_assert_eq(epoll_wait(ep.fd, &ev, 1, 0), 0, "... and no write to the wake-up descriptor");
    ep_run_until_done(&ep, loop, &t, 1);
    cr_assert_eq(here.r.status, SLUICE_OK);
    cr_assert_eq(epoll_wait(ep.fd, &ev, 1, 0), 0, "the loop is quiet");
    struct submit_from from = {loop, &there, -1};
    pthread_t th;
    pthread_create(&th, NULL, submit_thread, &from);
    pthread_join(th, NULL);
    cr_assert_eq(from.status, SLUICE_OK);
    cr_assert_eq(epoll_wait(ep.fd, &ev, 1, 0), 1, "another thread's submit wakes the loop");
    ep_run_until_done(&ep, loop, &t, 2);
    cr_assert_eq(there.r.status, SLUICE_OK);
    cr_assert_eq(epoll_wait(ep.fd, &ev, 1, 0), 0, "the wake-up was read: nothing stays readable");
    ep_done_idle(e, &ep, loop, REQS(&here, &there));
}

LOOP_TEST(a_cancel_that_beats_the_loop_to_a_submission_completes_it_canceled)
{
    struct sluice_engine *e;
    struct ep ep;
    struct tracker t;
    struct req by_id, by_token, kept;
    struct sluice_curl_loop *loop = ep_zero_delay(&ep, &e, &t, REQS(&by_id, &by_token, &kept));
    /* The embedded loop runs only when acted on: these sit in the inbox. */
    cr_assert_eq(submit(loop, &by_id, false), SLUICE_OK);
    cr_assert_eq(submit(loop, &by_token, true), SLUICE_OK);
    cr_assert_eq(submit(loop, &kept, false), SLUICE_OK);
    cr_assert_eq(sluice_curl_loop_cancel(loop, by_id.id), SLUICE_OK);
    sluice_cancel_fire(&by_token.token);
    cr_assert_eq(t.done, 0, "nothing completes outside the loop's thread");
    ep_run_until_done(&ep, loop, &t, 3);
    cr_assert_eq(by_id.r.status, SLUICE_ECANCELED);
    cr_assert_eq(by_token.r.status, SLUICE_ECANCELED);
    cr_assert_eq(kept.r.status, SLUICE_OK);
    cr_assert_eq(fx_stats_settled().requests, 1);
    cr_assert_eq(fx_counts(e).cancels, 2, "counted as a blocking call's cancels are");
    ep_done_idle(e, &ep, loop, REQS(&by_id, &by_token, &kept));
}

LOOP_TEST(a_deadline_that_passes_before_the_loop_takes_a_submission_in_is_counted_a_timeout)
{
    struct sluice_engine *e;
    struct ep ep;
    struct tracker t;
    struct req late;
    struct sluice_curl_loop *loop = ep_zero_delay(&ep, &e, &t, REQS(&late));
    struct timespec d;
    struct sluice_curl_request r = req_of(&late, false);
    r.deadline = sluice_deadline_in(&d, 20 * SLUICE_NS_PER_MS);
    cr_assert_eq(sluice_curl_loop_submit(loop, &r, NULL), SLUICE_OK);
    fx_sleep_ms(40); /* the embedded loop has not run: the request is still in the inbox */
    ep_run_until_done(&ep, loop, &t, 1);
    cr_assert_eq(late.r.status, SLUICE_ETIMEDOUT);
    cr_assert_eq(late.r.expired, SLUICE_EXPIRED_CALL);
    cr_assert_eq(fx_stats_settled().requests, 0);
    cr_assert_eq(fx_counts(e).timeouts, 1, "counted as a blocking call's timeout is");
    ep_done_idle(e, &ep, loop, REQS(&late));
}

/* The burst test's engine clock: the service time its pool learns is virtual. */
static int64_t burst_clock_ns;

static int64_t burst_clock(void *ctx)
{
    (void)ctx;
    return burst_clock_ns;
}

LOOP_TEST(a_burst_in_the_inbox_counts_as_queued_so_admission_refuses_what_its_deadline_cannot_fit)
{
    /* Two permits, both taken, and calls known to take 1 s: a newcomer behind q queued calls
     * waits (q + 1) x 0.5 s, then needs 1 s, so of a burst with 10 s to live 17 fit. */
    burst_clock_ns = 1000 * SLUICE_NS_PER_SEC;
    struct sluice_backend_desc b = {.id = FX_BACKEND, .active = 2};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){
                                          .backends = &b,
                                          .n_backends = 1,
                                          .clock = &(struct sluice_clock){.now_ns = burst_clock}},
                                      &e),
                 SLUICE_OK);
    struct sluice_pool *p = sluice_engine_pool(e, FX_BACKEND);
    struct sluice_call held[2];
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &held[0]), SLUICE_OK);
        burst_clock_ns += SLUICE_NS_PER_SEC;
        sluice_pool_call_end(p, &held[0], SLUICE_OUTCOME_OK, 0);
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &held[i]), SLUICE_OK);
    cr_assert_eq(sluice_pool_predicted_wait(p), SLUICE_NS_PER_SEC / 2);
    struct ep ep;
    struct sluice_curl_loop *loop = ep_loop_create(&ep, e);
    struct tracker t;
    tracker_init(&t);
    enum { BURST = 40 };
    struct req q[BURST];
    struct timespec dl;
    sluice_deadline_in(&dl, 10 * SLUICE_NS_PER_SEC);
    int accepted = 0;
    /* The embedded loop runs only when acted on: the whole burst sits in the inbox. */
    for (int i = 0; i < BURST; i++) {
        req_init(&q[i], &t);
        struct sluice_curl_request rq = req_of(&q[i], false);
        rq.deadline = &dl;
        int status = sluice_curl_loop_submit(loop, &rq, &q[i].id);
        cr_assert(status == SLUICE_OK || status == SLUICE_ELATE, "%s", sluice_status_name(status));
        accepted += status == SLUICE_OK;
    }
    cr_assert_eq(t.done, 0, "nothing reached the loop yet");
    cr_assert(accepted >= 1 && accepted <= 17,
              "%d of %d admitted: the submissions ahead in the inbox were not counted", accepted,
              BURST);
    cr_assert_eq(fx_counts(e).refused_early, (uint64_t)(BURST - accepted));
    cr_assert_eq(sluice_pool_predicted_wait(p), (accepted + 1) * SLUICE_NS_PER_SEC / 2);
    /* Taken in, they queue in the gate: the same prediction, counted there once. */
    while (sluice_curl_loop_stats(loop).waiting < (uint32_t)accepted)
        ep_run_once(&ep, loop, 50);
    cr_assert_eq(sluice_pool_predicted_wait(p), (accepted + 1) * SLUICE_NS_PER_SEC / 2);
    sluice_curl_loop_destroy(loop);
    close(ep.fd);
    cr_assert_eq(t.by_status[status_slot(SLUICE_ECLOSED)], accepted);
    cr_assert_eq(sluice_pool_predicted_wait(p), SLUICE_NS_PER_SEC / 2, "nothing left arriving");
    for (int i = 0; i < 2; i++)
        sluice_pool_call_end(p, &held[i], SLUICE_OUTCOME_OK, 0);
    for (int i = 0; i < BURST; i++)
        curl_easy_cleanup(q[i].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}

LOOP_TEST(closing_the_engine_completes_queued_requests_with_eclosed_from_another_thread)
{
    fx_start(&(struct fx_provider){.mode = "reject", .cap = 4, .median_ms = 300,
                                   .fixed_latency = true});
    struct sluice_engine *e = fx_engine(1, -1, NULL);
    struct sluice_curl_loop *loop = loop_create(e, 0);
    struct tracker t;
    tracker_init(&t);
    struct req busy, queued[3];
    req_init(&busy, &t);
    cr_assert_eq(submit(loop, &busy, false), SLUICE_OK);
    wait_in_flight(1);
    for (int i = 0; i < 3; i++) {
        req_init(&queued[i], &t);
        cr_assert_eq(submit(loop, &queued[i], false), SLUICE_OK);
    }
    int64_t until = fx_now_ms() + 2000;
    while (sluice_curl_loop_stats(loop).waiting != 3)
        cr_assert_lt(fx_now_ms(), until, "the requests never queued for permits");
    sluice_engine_close(e); /* this thread settles the queued waiters */
    wait_done(&t, 3, 2000);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(queued[i].r.status, SLUICE_ECLOSED);
    struct req late;
    req_init(&late, &t);
    cr_assert_eq(submit(loop, &late, false), SLUICE_ECLOSED, "admission of a closed pool");
    wait_done(&t, 4, 5000);
    cr_assert_eq(busy.r.status, SLUICE_OK, "the transfer in flight finished");
    sluice_curl_loop_destroy(loop);
    curl_easy_cleanup(busy.easy);
    curl_easy_cleanup(late.easy);
    for (int i = 0; i < 3; i++)
        curl_easy_cleanup(queued[i].easy);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}
