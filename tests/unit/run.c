/* sluice/run.h: the run lifecycle over an engine's pools. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sluice/run.h>

#include "common.h"
#include "run_fixtures.h"

/* A scripted consumer: what each callback does is data. */
struct script {
    _Atomic(int) prepares, generations, validations;
    int prepare_status;                       /* returned by prepare */
    int fail_attempt;                         /* generation that fails (-1: none) */
    int generate_status;                      /* its error */
    enum sluice_outcome outcome;              /* reported by every generation */
    int64_t retry_after_ns;
    int repairs_wanted;                       /* validate asks for this many repairs */
    int validate_status;                      /* error with a repair request or final failure */
    struct latch *in_prepare, *in_generate, *in_validate; /* hold there until opened */
    struct sluice_cancel *fire_in_prepare, *fire_in_validate;
    struct timespec *expire_in_prepare;       /* moved into the past by prepare */
    struct fake_clock *clock;
    int64_t prepare_cost, generate_cost;      /* virtual ns each takes */
    _Atomic(int) *concurrent, *max_concurrent; /* generation calls in the client now / ever */
    struct sluice_pool *watch;                /* pool seen from inside the callbacks */
    struct sluice_pool_counts in_prepare_counts, in_generate_counts, in_validate_counts;
    _Atomic(const char *) endpoint_seen; /* runs sharing a script all write it */
};

static void script_init(struct script *s)
{
    memset(s, 0, sizeof *s);
    s->fail_attempt = -1;
    s->generate_status = -EIO;
    s->validate_status = -EBADMSG;
}

static int script_prepare(void *ctx)
{
    struct script *s = ctx;
    atomic_fetch_add(&s->prepares, 1);
    if (s->watch)
        s->in_prepare_counts = sluice_pool_stats(s->watch);
    if (s->in_prepare)
        latch_wait(s->in_prepare);
    if (s->clock)
        fake_clock_advance(s->clock, s->prepare_cost);
    if (s->fire_in_prepare)
        sluice_cancel_fire(s->fire_in_prepare);
    if (s->expire_in_prepare)
        *s->expire_in_prepare = deadline_in(-SLUICE_NS_PER_MS);
    return s->prepare_status;
}

static void track_concurrency(struct script *s, int delta)
{
    if (!s->concurrent)
        return;
    int now = atomic_fetch_add(s->concurrent, delta) + delta;
    int max = atomic_load(s->max_concurrent);
    while (now > max && !atomic_compare_exchange_weak(s->max_concurrent, &max, now))
        ;
}

static int script_generate(void *ctx, struct sluice_generation *gen)
{
    struct script *s = ctx;
    track_concurrency(s, +1);
    atomic_fetch_add(&s->generations, 1);
    atomic_store(&s->endpoint_seen, gen->endpoint);
    if (s->watch)
        s->in_generate_counts = sluice_pool_stats(s->watch);
    if (s->in_generate)
        latch_wait(s->in_generate);
    if (s->clock)
        fake_clock_advance(s->clock, s->generate_cost);
    gen->outcome = s->outcome;
    gen->retry_after_ns = s->retry_after_ns;
    track_concurrency(s, -1);
    return (int)gen->attempt == s->fail_attempt ? s->generate_status : SLUICE_OK;
}

static int script_validate(void *ctx, unsigned attempt, bool *repair)
{
    struct script *s = ctx;
    atomic_fetch_add(&s->validations, 1);
    if (s->watch)
        s->in_validate_counts = sluice_pool_stats(s->watch);
    if (s->in_validate)
        latch_wait(s->in_validate);
    if (s->fire_in_validate)
        sluice_cancel_fire(s->fire_in_validate);
    if ((int)attempt < s->repairs_wanted) {
        *repair = true;
        return s->validate_status;
    }
    return s->repairs_wanted < 0 ? s->validate_status : SLUICE_OK;
}

static const struct sluice_run_ops script_ops = {script_prepare, script_generate, script_validate};

static struct sluice_engine *make_engine(const struct sluice_backend_desc *b, size_t n,
                                         const struct sluice_clock *clock)
{
    struct sluice_engine *e;
    char err[256];
    struct sluice_engine_desc d = {.backends = b, .n_backends = n, .clock = clock, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK, "%s", err);
    return e;
}

static struct sluice_run_desc desc_for(const char *backend, struct script *s)
{
    struct sluice_run_desc d = {.backend = backend, .ops = &script_ops, .ctx = s};
    return d;
}

/* A run on its own thread. */
struct run_thread {
    pthread_t tid;
    struct sluice_engine *engine;
    struct sluice_run_desc desc;
    struct sluice_run_result result;
};

static void *run_thread_main(void *arg)
{
    struct run_thread *t = arg;
    sluice_run(t->engine, &t->desc, &t->result);
    return NULL;
}

static void run_start(struct run_thread *t, struct sluice_engine *e, struct sluice_run_desc d)
{
    t->engine = e;
    t->desc = d;
    pthread_create(&t->tid, NULL, run_thread_main, t);
}

static void wait_for_queue(struct sluice_pool *p, uint32_t waiting)
{
    while (sluice_pool_stats(p).queued < waiting)
        sched_yield();
}

static const struct sluice_backend_desc local_1_1[] = {
    {.id = "local", .endpoint = "http://local", .active = 1, .waiting = {true, 1}}};

/* ---- the ordinary path ----------------------------------------------------- */

Test(run, a_run_returns_the_ordinary_result_after_prepare_generate_and_validate)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    struct sluice_run_desc d = desc_for("local", &s);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_OK);
    cr_assert_eq(r.status, SLUICE_OK);
    cr_assert_eq(r.generations, 1);
    cr_assert_eq(s.prepares + s.generations + s.validations, 3);
    cr_assert_str_eq(atomic_load(&s.endpoint_seen), "http://local");
    assert_capacity_intact(sluice_engine_pool(e, "local"));
    sluice_engine_destroy(e);
}

Test(run, a_desc_without_a_client_or_an_unknown_backend_is_einval_and_calls_nothing)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    struct sluice_run_desc d = desc_for("nobody", &s);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "\"nobody\""), "names the backend: \"%s\"", r.error);
    struct sluice_run_ops no_generate = {script_prepare, NULL, NULL};
    d = desc_for("local", &s);
    d.ops = &no_generate;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "generate"), "names the callback: \"%s\"", r.error);
    cr_assert_eq(sluice_run(NULL, &d, NULL), SLUICE_EINVAL);
    cr_assert_eq(sluice_run(e, NULL, &r), SLUICE_EINVAL);
    cr_assert_eq(r.status, SLUICE_EINVAL, "the result says so too");
    cr_assert(strstr(r.error, "description is NULL"), "\"%s\"", r.error);
    cr_assert_eq(s.prepares + s.generations, 0);
    sluice_engine_destroy(e);
}

Test(run, a_wall_clock_deadline_is_einval_before_admission_and_calls_nothing)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    wall.tv_sec += 1; /* a common slip: CLOCK_REALTIME, where sluice takes CLOCK_MONOTONIC */
    struct sluice_run_desc d = desc_for("local", &s);
    d.deadline = &wall;
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "deadline is ") && strstr(r.error, "CLOCK_MONOTONIC") &&
                  strstr(r.error, "sluice_deadline_in"),
              "names the field, the clock and the fix: \"%s\"", r.error);
    d.deadline = NULL;
    d.start_deadline = &wall;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_EINVAL);
    cr_assert(strstr(r.error, "start_deadline is "), "names the start deadline: \"%s\"", r.error);
    /* Behind a sound start deadline, which alone would bound every wait: still refused. */
    struct timespec soon;
    d.start_deadline = sluice_deadline_in(&soon, 60 * SLUICE_NS_PER_SEC);
    d.deadline = &wall;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_EINVAL);
    cr_assert_eq(s.prepares + s.generations, 0, "refused before prepare");
    assert_capacity_intact(sluice_engine_pool(e, "local"));
    sluice_engine_destroy(e);
}

/* ---- admission ------------------------------------------------------------- */

Test(run, a_full_pool_rejects_with_ecapacity_before_prepare_or_the_client)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct sluice_pool *p = sluice_engine_pool(e, "local");
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    struct script s;
    script_init(&s);
    struct sluice_run_desc d = desc_for("local", &s);
    struct sluice_run_result r;
    memset(&r, 0xff, sizeof r);
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ECAPACITY);
    cr_assert_eq(r.status, SLUICE_ECAPACITY);
    cr_assert(r.elapsed_ns == 0 && r.prepare_ns == 0 && r.queued_ns == 0 && r.generations == 0,
              "a rejected run has no partial result");
    cr_assert_eq(s.prepares + s.generations + s.validations, 0);
    sluice_pool_leave(p);
    sluice_pool_leave(p);
    sluice_engine_destroy(e);
}

Test(run, explicit_zero_waiting_admits_exactly_active_runs_and_the_next_never_reaches_the_client)
{
    struct sluice_backend_desc b[] = {{.id = "local", .active = 2, .waiting = SLUICE_SOME(0)}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    struct latch hold = {0};
    struct script held, extra;
    script_init(&held);
    script_init(&extra);
    held.in_generate = &hold;
    struct run_thread t[2];
    for (int i = 0; i < 2; i++)
        run_start(&t[i], e, desc_for("local", &held));
    wait_for_count(&hold.arrived, 2);
    struct sluice_run_desc d = desc_for("local", &extra);
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECAPACITY);
    cr_assert_eq(extra.prepares + extra.generations, 0);
    latch_open(&hold);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i].tid, NULL);
        cr_assert_eq(t[i].result.status, SLUICE_OK);
    }
    assert_capacity_intact(sluice_engine_pool(e, "local"));
    sluice_engine_destroy(e);
}

/* Every one of N runs is inside the client at once: would hang if anything limited them. */
static void expect_unlimited(struct sluice_engine *e, const char *backend)
{
    enum { N = 40 }; /* more than openrouter's 16 and any default */
    struct latch all_in = {0};
    struct script s;
    script_init(&s);
    s.in_generate = &all_in;
    struct run_thread t[N];
    for (int i = 0; i < N; i++)
        run_start(&t[i], e, desc_for(backend, &s));
    wait_for_count(&all_in.arrived, N);
    latch_open(&all_in);
    for (int i = 0; i < N; i++) {
        pthread_join(t[i].tid, NULL);
        cr_assert_eq(t[i].result.status, SLUICE_OK);
    }
}

Test(run, endpoint_only_runs_and_backends_without_active_are_unlimited, .timeout = 60)
{
    struct sluice_backend_desc b[] = {{.id = "free"}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    expect_unlimited(e, NULL);
    expect_unlimited(e, "free");
    struct sluice_pool *openrouter = sluice_engine_pool(e, "openrouter");
    cr_assert_not_null(openrouter);
    cr_assert_eq(sluice_pool_stats(openrouter).admitted, 0,
                 "endpoint-only runs do not borrow openrouter's pool");
    sluice_engine_destroy(e);
}

Test(run, an_endpoint_override_keeps_the_backend_pool)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    s.watch = sluice_engine_pool(e, "local");
    struct sluice_run_desc d = desc_for("local", &s);
    d.endpoint = "http://override";
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_OK);
    cr_assert_str_eq(atomic_load(&s.endpoint_seen), "http://override");
    cr_assert_eq(s.in_generate_counts.admitted, 1);
    cr_assert_eq(s.in_generate_counts.in_flight, 1);
    sluice_engine_destroy(e);
}

/* ---- permits: generations only, repairs included ---------------------------- */

Test(run, prepare_and_validate_hold_no_generation_permit)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct sluice_pool *p = sluice_engine_pool(e, "local");
    struct latch in_prepare = {0}, in_validate = {0};
    struct script slow, quick;
    script_init(&slow);
    script_init(&quick);
    slow.in_prepare = &in_prepare;
    slow.in_validate = &in_validate;
    slow.watch = p;
    struct run_thread t;
    run_start(&t, e, desc_for("local", &slow));
    wait_for_count(&in_prepare.arrived, 1);
    struct sluice_run_desc d = desc_for("local", &quick);
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_OK, "a run generated while another prepared");
    latch_open(&in_prepare);
    wait_for_count(&in_validate.arrived, 1);
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_OK, "a run generated while another validated");
    latch_open(&in_validate);
    pthread_join(t.tid, NULL);
    cr_assert_eq(t.result.status, SLUICE_OK);
    cr_assert_eq(slow.in_prepare_counts.in_flight, 0);
    cr_assert_eq(slow.in_validate_counts.in_flight, 0);
    assert_capacity_intact(p);
    sluice_engine_destroy(e);
}

Test(run, each_repair_retakes_a_permit_without_readmission)
{
    struct sluice_backend_desc b[] = {{.id = "local", .active = 1, .waiting = SLUICE_SOME(0)}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    struct script s;
    script_init(&s);
    s.repairs_wanted = 2;
    s.watch = sluice_engine_pool(e, "local");
    struct sluice_run_desc d = desc_for("local", &s);
    d.max_repairs = SLUICE_SOME(2);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_OK);
    cr_assert_eq(r.generations, 3);
    /* The last repair ran holding a permit, under the run's single admission. */
    cr_assert_eq(s.in_generate_counts.in_flight, 1);
    cr_assert_eq(s.in_generate_counts.admitted, 1);
    cr_assert_eq(s.in_validate_counts.in_flight, 0);
    assert_capacity_intact(s.watch);
    sluice_engine_destroy(e);
}

Test(run, a_repair_is_never_rejected_when_new_runs_fill_the_waiting_queue)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct sluice_pool *p = sluice_engine_pool(e, "local");
    struct latch repairer_validates = {0}, holder_generates = {0};
    struct script repairer, holder, late;
    script_init(&repairer);
    script_init(&holder);
    script_init(&late);
    repairer.repairs_wanted = 1;
    repairer.in_validate = &repairer_validates;
    holder.in_generate = &holder_generates;
    struct run_thread a, b;
    run_start(&a, e, desc_for("local", &repairer));
    wait_for_count(&repairer_validates.arrived, 1);
    run_start(&b, e, desc_for("local", &holder)); /* takes the waiting slot and the permit */
    wait_for_count(&holder_generates.arrived, 1);
    struct sluice_run_desc d = desc_for("local", &late);
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECAPACITY, "the queue is full");
    latch_open(&repairer_validates);
    wait_for_queue(p, 1); /* the repair waits for the permit, it was not rejected */
    latch_open(&holder_generates);
    pthread_join(a.tid, NULL);
    pthread_join(b.tid, NULL);
    cr_assert_eq(a.result.status, SLUICE_OK);
    cr_assert_eq(a.result.generations, 2);
    cr_assert_eq(b.result.status, SLUICE_OK);
    assert_capacity_intact(p);
    sluice_engine_destroy(e);
}

Test(run, max_repairs_bounds_repair_generations_and_defaults_to_one)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    struct sluice_opt_u32 limits[] = {{0}, SLUICE_SOME(0), SLUICE_SOME(3)};
    unsigned expect[] = {1 + SLUICE_RUN_REPAIRS_DEFAULT, 1, 4};
    for (int i = 0; i < 3; i++) {
        script_init(&s);
        s.repairs_wanted = 100;
        struct sluice_run_desc d = desc_for("local", &s);
        d.max_repairs = limits[i];
        struct sluice_run_result r;
        cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ECLIENT, "repairs ran out: validate failed");
        cr_assert_eq(r.client_status, -EBADMSG, "validate's own error is kept");
        cr_assert_eq(r.generations, expect[i]);
    }
    assert_capacity_intact(sluice_engine_pool(e, "local"));
    sluice_engine_destroy(e);
}

/* Clients under test: two different ops tables, one shared limit. */
static const struct sluice_run_ops injected_ops = {NULL, script_generate, NULL};

struct limit_worker {
    struct sluice_engine *e;
    struct script *builtin, *injected;
    uint64_t seed;
    long runs;
    long failures;
};

static void *limit_worker_main(void *arg)
{
    struct limit_worker *w = arg;
    for (long i = 0; i < w->runs; i++) {
        bool use_injected = test_rand(&w->seed) & 1;
        struct sluice_run_desc d = desc_for("local", use_injected ? w->injected : w->builtin);
        if (use_injected)
            d.ops = &injected_ops;
        d.max_repairs = SLUICE_SOME(3);
        if (sluice_run(w->e, &d, NULL) != SLUICE_OK)
            w->failures++;
    }
    return NULL;
}

Test(run, every_generation_of_builtin_and_injected_clients_observes_the_active_limit)
{
    enum { ACTIVE = 3, THREADS = 8 };
    struct sluice_backend_desc b[] = {{.id = "local", .active = ACTIVE}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    _Atomic(int) concurrent = 0, max_concurrent = 0;
    struct script builtin, injected;
    script_init(&builtin);
    script_init(&injected);
    builtin.repairs_wanted = 2; /* three generations per run, two of them repairs */
    builtin.concurrent = injected.concurrent = &concurrent;
    builtin.max_concurrent = injected.max_concurrent = &max_concurrent;
    struct limit_worker w[THREADS];
    for (int i = 0; i < THREADS; i++)
        w[i] = (struct limit_worker){e, &builtin, &injected, (uint64_t)i + 1, SCALED(3000), 0};
    test_run_threads(THREADS, limit_worker_main, w, sizeof w[0]);
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(w[i].failures, 0, "the waiting capacity covers every thread");
    cr_assert_leq(atomic_load(&max_concurrent), ACTIVE, "%d generations at once with limit %d",
                  atomic_load(&max_concurrent), ACTIVE);
    cr_assert_gt(builtin.generations, 0);
    cr_assert_gt(injected.generations, 0);
    assert_capacity_intact(sluice_engine_pool(e, "local"));
    sluice_engine_destroy(e);
}

/* ---- cancellation and deadlines ------------------------------------------- */

Test(run, a_cancel_that_wins_before_generation_never_calls_the_client)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct sluice_cancel token;
    struct script s;
    for (int fired_before_run = 0; fired_before_run < 2; fired_before_run++) {
        sluice_cancel_init(&token);
        script_init(&s);
        if (fired_before_run)
            sluice_cancel_fire(&token);
        else
            s.fire_in_prepare = &token;
        struct sluice_run_desc d = desc_for("local", &s);
        d.cancel = &token;
        cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECANCELED);
        cr_assert_eq(s.generations, 0);
        cr_assert_eq(s.prepares, fired_before_run ? 0 : 1, "a run already over skips prepare");
        assert_capacity_intact(sluice_engine_pool(e, "local"));
    }
    sluice_engine_destroy(e);
}

Test(run, cancel_or_deadline_while_queued_keeps_its_identity_and_releases_the_run)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct sluice_pool *p = sluice_engine_pool(e, "local");
    struct latch hold = {0};
    struct script holder, queued;
    script_init(&holder);
    holder.in_generate = &hold;
    struct run_thread h;
    run_start(&h, e, desc_for("local", &holder));
    wait_for_count(&hold.arrived, 1);

    script_init(&queued);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    struct run_thread w;
    struct sluice_run_desc d = desc_for("local", &queued);
    d.cancel = &token;
    run_start(&w, e, d);
    wait_for_queue(p, 1);
    sluice_cancel_fire(&token);
    pthread_join(w.tid, NULL);
    cr_assert_eq(w.result.status, SLUICE_ECANCELED);
    cr_assert_eq(sluice_pool_stats(p).admitted, 1, "the cancelled run left");

    struct timespec dl = deadline_in(2 * SLUICE_NS_PER_MS);
    d = desc_for("local", &queued);
    d.deadline = &dl;
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ETIMEDOUT);
    cr_assert_gt(r.queued_ns, 0);
    cr_assert_eq(queued.generations, 0);
    cr_assert_eq(sluice_pool_stats(p).admitted, 1, "the timed-out run left");

    latch_open(&hold);
    pthread_join(h.tid, NULL);
    cr_assert_eq(h.result.status, SLUICE_OK);
    assert_capacity_intact(p);
    sluice_engine_destroy(e);
}

Test(run, cancel_wins_over_a_passed_deadline)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    struct sluice_cancel token;
    sluice_cancel_init(&token);
    sluice_cancel_fire(&token);
    struct timespec past = deadline_in(-SLUICE_NS_PER_MS);
    struct sluice_run_desc d = desc_for("local", &s);
    d.cancel = &token;
    d.deadline = &past;
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECANCELED);
    sluice_engine_destroy(e);
}

/* ---- every failure path releases capacity ------------------------------------ */

struct failure_case {
    const char *name;
    void (*arrange)(struct script *s, struct sluice_run_desc *d, struct sluice_cancel *token,
                    struct timespec *deadline);
    int status;
    int client_status; /* with SLUICE_ECLIENT: the callback's own code */
    enum sluice_run_stage client_stage;
    int generations;
};

static void fail_prepare(struct script *s, struct sluice_run_desc *d, struct sluice_cancel *t,
                         struct timespec *dl)
{
    (void)d, (void)t, (void)dl;
    s->prepare_status = -ENOENT;
}
static void fail_first_generation(struct script *s, struct sluice_run_desc *d,
                                  struct sluice_cancel *t, struct timespec *dl)
{
    (void)d, (void)t, (void)dl;
    s->fail_attempt = 0;
}
static void fail_repair_generation(struct script *s, struct sluice_run_desc *d,
                                   struct sluice_cancel *t, struct timespec *dl)
{
    (void)d, (void)t, (void)dl;
    s->repairs_wanted = 1;
    s->fail_attempt = 1;
}
static void fail_validation(struct script *s, struct sluice_run_desc *d, struct sluice_cancel *t,
                            struct timespec *dl)
{
    (void)d, (void)t, (void)dl;
    s->repairs_wanted = -1;
}
static void exhaust_repairs(struct script *s, struct sluice_run_desc *d, struct sluice_cancel *t,
                            struct timespec *dl)
{
    (void)t, (void)dl;
    s->repairs_wanted = 9;
    d->max_repairs = SLUICE_SOME(2);
}
static void cancel_before_repair(struct script *s, struct sluice_run_desc *d,
                                 struct sluice_cancel *t, struct timespec *dl)
{
    (void)dl;
    s->repairs_wanted = 1;
    s->fire_in_validate = t;
    d->cancel = t;
}
static void expire_in_prepare(struct script *s, struct sluice_run_desc *d, struct sluice_cancel *t,
                              struct timespec *dl)
{
    (void)t;
    *dl = deadline_in(SLUICE_NS_PER_SEC * 3600);
    s->expire_in_prepare = dl;
    d->deadline = dl;
}

Test(run, every_failure_path_returns_its_status_and_releases_admission_and_permits)
{
    static const struct failure_case cases[] = {
        {"prepare fails", fail_prepare, SLUICE_ECLIENT, -ENOENT, SLUICE_STAGE_PREPARE, 0},
        {"first generation fails", fail_first_generation, SLUICE_ECLIENT, -EIO,
         SLUICE_STAGE_GENERATE, 1},
        {"repair generation fails", fail_repair_generation, SLUICE_ECLIENT, -EIO,
         SLUICE_STAGE_GENERATE, 2},
        {"validation fails", fail_validation, SLUICE_ECLIENT, -EBADMSG, SLUICE_STAGE_VALIDATE, 1},
        {"repairs run out", exhaust_repairs, SLUICE_ECLIENT, -EBADMSG, SLUICE_STAGE_VALIDATE, 3},
        {"cancel before a repair", cancel_before_repair, SLUICE_ECANCELED, 0, SLUICE_STAGE_NONE,
         1},
        {"deadline passes in prepare", expire_in_prepare, SLUICE_ETIMEDOUT, 0, SLUICE_STAGE_NONE,
         0},
    };
    struct sluice_backend_desc b[] = {{.id = "local", .active = 2, .waiting = SLUICE_SOME(1)}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct script s;
        script_init(&s);
        struct sluice_cancel token;
        sluice_cancel_init(&token);
        struct timespec dl;
        struct sluice_run_desc d = desc_for("local", &s);
        cases[i].arrange(&s, &d, &token, &dl);
        struct sluice_run_result r;
        cr_assert_eq(sluice_run(e, &d, &r), cases[i].status, "%s: got %s", cases[i].name,
                     sluice_status_name(r.status));
        cr_assert_eq(r.client_status, cases[i].client_status, "%s", cases[i].name);
        cr_assert_eq(r.client_stage, cases[i].client_stage, "%s", cases[i].name);
        cr_assert_eq((int)r.generations, cases[i].generations, "%s", cases[i].name);
        cr_assert_eq(s.generations, cases[i].generations, "%s", cases[i].name);
        assert_capacity_intact(sluice_engine_pool(e, "local"));
    }
    sluice_engine_destroy(e);
}

/* ---- timing and the discovery seam ------------------------------------------ */

Test(run, elapsed_time_includes_queue_waits_and_prepare_time_excludes_them)
{
    struct fake_clock fc = {0};
    struct sluice_clock clock = fake_clock_hook(&fc);
    struct sluice_engine *e = make_engine(local_1_1, 1, &clock);
    struct sluice_pool *p = sluice_engine_pool(e, "local");
    struct latch hold = {0};
    struct script holder, timed;
    script_init(&holder);
    holder.in_generate = &hold;
    struct run_thread h, t;
    run_start(&h, e, desc_for("local", &holder));
    wait_for_count(&hold.arrived, 1);
    script_init(&timed);
    timed.clock = &fc;
    timed.prepare_cost = 3;
    timed.generate_cost = 7;
    run_start(&t, e, desc_for("local", &timed));
    wait_for_queue(p, 1);
    fake_clock_advance(&fc, 100); /* the queue wait */
    latch_open(&hold);
    pthread_join(h.tid, NULL);
    pthread_join(t.tid, NULL);
    cr_assert_eq(t.result.status, SLUICE_OK);
    cr_assert_eq(t.result.prepare_ns, 3);
    cr_assert_eq(t.result.queued_ns, 100);
    cr_assert_eq(t.result.elapsed_ns, 3 + 100 + 7);
    cr_assert_eq(t.result.last.latency_ns, 7, "a call's latency excludes its queue wait");
    sluice_engine_destroy(e);
}

Test(run, the_client_outcome_reaches_call_end_and_a_failed_call_never_reports_ok)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    struct script s;
    script_init(&s);
    s.outcome = SLUICE_OUTCOME_OVERLOAD;
    s.retry_after_ns = 5 * SLUICE_NS_PER_SEC;
    struct sluice_run_desc d = desc_for("local", &s);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_OK);
    cr_assert_eq(r.last.outcome, SLUICE_OUTCOME_OVERLOAD);
    cr_assert_eq(r.last.retry_after_ns, 5 * SLUICE_NS_PER_SEC);
    cr_assert_eq(r.last.in_flight_at_start, 1);

    script_init(&s);
    s.fail_attempt = 0;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ECLIENT);
    cr_assert_eq(r.client_status, -EIO);
    cr_assert_eq(r.last.outcome, SLUICE_OUTCOME_IGNORE);
    sluice_engine_destroy(e);
}

/* ---- independence of pools ------------------------------------------------- */

Test(run, a_saturated_backend_leaves_other_backends_capacity_untouched)
{
    enum { ACTIVE = 2, WAITING = 2 };
    struct sluice_backend_desc b[] = {
        {.id = "local", .active = ACTIVE, .waiting = SLUICE_SOME(WAITING)}};
    struct sluice_engine *e = make_engine(b, 1, NULL);
    struct sluice_pool *local = sluice_engine_pool(e, "local");
    struct latch hold = {0};
    struct script held, other;
    script_init(&held);
    held.in_generate = &hold;
    struct run_thread t[ACTIVE + WAITING];
    for (int i = 0; i < ACTIVE + WAITING; i++)
        run_start(&t[i], e, desc_for("local", &held));
    wait_for_count(&hold.arrived, ACTIVE);
    wait_for_queue(local, WAITING);
    script_init(&other);
    struct sluice_run_desc d = desc_for("local", &other);
    cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECAPACITY, "local is saturated");

    d = desc_for("openrouter", &other);
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_OK, "openrouter makes progress");
    cr_assert_eq(r.queued_ns >= 0, true);
    assert_capacity_intact(sluice_engine_pool(e, "openrouter"));
    cr_assert_eq(sluice_pool_stats(local).admitted, ACTIVE + WAITING);

    latch_open(&hold);
    for (int i = 0; i < ACTIVE + WAITING; i++) {
        pthread_join(t[i].tid, NULL);
        cr_assert_eq(t[i].result.status, SLUICE_OK);
    }
    assert_capacity_intact(local);
    sluice_engine_destroy(e);
}

/* ---- a client's errors keep their own identity ----------------------------------- */

Test(run, a_client_error_never_passes_for_a_status_of_the_run_itself)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    /* Codes a client might return that the run itself also uses. */
    const int lookalikes[] = {SLUICE_ECAPACITY, SLUICE_EINVAL, SLUICE_ETIMEDOUT, SLUICE_ECANCELED,
                              SLUICE_ECLOSED, -EIO};
    for (size_t i = 0; i < sizeof lookalikes / sizeof lookalikes[0]; i++) {
        struct script s;
        script_init(&s);
        s.fail_attempt = 0;
        s.generate_status = lookalikes[i];
        struct sluice_run_desc d = desc_for("local", &s);
        struct sluice_run_result r;
        cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ECLIENT, "client returned %s, run said %s",
                     sluice_status_name(lookalikes[i]), sluice_status_name(r.status));
        cr_assert_eq(r.client_status, lookalikes[i]);
        cr_assert_eq(r.client_stage, SLUICE_STAGE_GENERATE);
        assert_capacity_intact(sluice_engine_pool(e, "local"));
    }
    /* The run's own timeout is not a client's. */
    struct script s;
    script_init(&s);
    struct timespec past = deadline_in(-SLUICE_NS_PER_MS);
    struct sluice_run_desc d = desc_for("local", &s);
    d.deadline = &past;
    struct sluice_run_result r;
    cr_assert_eq(sluice_run(e, &d, &r), SLUICE_ETIMEDOUT);
    cr_assert_eq(r.client_status, 0);
    cr_assert_eq(r.client_stage, SLUICE_STAGE_NONE);
    sluice_engine_destroy(e);
}

Test(run, a_closed_engine_refuses_runs_with_eclosed_and_calls_nothing)
{
    struct sluice_engine *e = make_engine(local_1_1, 1, NULL);
    sluice_engine_close(e);
    struct script s;
    script_init(&s);
    const char *backends[] = {"local", NULL, SLUICE_OPENROUTER_ID};
    for (int i = 0; i < 3; i++) {
        struct sluice_run_desc d = desc_for(backends[i], &s);
        cr_assert_eq(sluice_run(e, &d, NULL), SLUICE_ECLOSED, "backend %s",
                     backends[i] ? backends[i] : "(endpoint only)");
    }
    cr_assert_eq(s.prepares, 0);
    cr_assert_eq(s.generations, 0);
    sluice_engine_destroy(e);
}
