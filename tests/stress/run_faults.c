/*
 * Fault injection over the run lifecycle: worker threads run random plans
 * that fail at every stage — prepare, any generation, validation, a repair,
 * a cancel before / inside / between waits, an external cancel landing at a
 * random moment, deadlines already passed or expiring mid-wait — across
 * limited, admission-only, unlimited and endpoint-only pools at once.
 *
 * Every run is checked against an oracle of what its plan must return, with
 * the timing-dependent faults allowed to end it early only with their own
 * status identity. Afterwards every pool must be idle with its whole
 * capacity usable: capacity after any mix of failures equals capacity before.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sluice/run.h>

#include "common.h"
#include "run_fixtures.h"

#define WORKERS 6
#define RUNS_PER_WORKER SCALED(17000) /* 102k runs in total at full scale */

enum { B_LIMITED, B_TIGHT, B_FREE, B_ENDPOINT, B_OPENROUTER, N_BACKENDS };
static const char *const backend_ids[N_BACKENDS] = {"limited", "tight", "free", NULL,
                                                    "openrouter"};
static const uint32_t backend_active[N_BACKENDS] = {3, 1, 0, 0, 16};

enum cancel_at { C_NONE, C_BEFORE, C_IN_PREPARE, C_IN_GENERATE, C_IN_VALIDATE, C_EXTERNAL };
enum deadline_kind { D_NONE, D_PASSED, D_SHORT, D_LONG };

struct plan {
    int backend;
    bool prepare_fails;
    int fail_attempt;   /* generation that fails, -1: none */
    int repairs_wanted; /* validate asks for this many repairs; -1: rejects outright */
    unsigned max_repairs;
    enum cancel_at cancel_at;
    enum deadline_kind deadline;
    unsigned work; /* spins inside the client */
};

struct worker {
    int id;
    uint64_t rng;
    struct sluice_engine *engine;
    struct sluice_cancel token;
    _Atomic(int) armed; /* 0 idle, 1 the canceller may fire, 2 it is firing */
    struct plan plan;
    struct timespec deadline;
    int prepares, generations;
    long violations, runs, by_status[4];
};

static _Atomic(int) in_client[N_BACKENDS], max_in_client[N_BACKENDS];
static _Atomic(int) stop_canceller;
static uint32_t max_queued; /* deepest permit queue the canceller saw on "limited" */
static struct worker workers[WORKERS];

static struct plan random_plan(uint64_t *rng)
{
    static const int backend_pct[N_BACKENDS] = {35, 20, 15, 10, 20};
    struct plan p;
    int r = (int)(test_rand(rng) % 100);
    for (p.backend = 0; r >= backend_pct[p.backend]; p.backend++)
        r -= backend_pct[p.backend];
    p.prepare_fails = test_rand(rng) % 10 == 0;
    p.fail_attempt = test_rand(rng) % 4 == 0 ? (int)(test_rand(rng) % 3) : -1;
    p.repairs_wanted = (int)(test_rand(rng) % 5) - 1;
    p.max_repairs = (unsigned)(test_rand(rng) % 3);
    r = (int)(test_rand(rng) % 100);
    p.cancel_at = r < 50 ? C_NONE : r < 55 ? C_BEFORE : r < 62 ? C_IN_PREPARE
                : r < 69 ? C_IN_GENERATE : r < 76 ? C_IN_VALIDATE : C_EXTERNAL;
    r = (int)(test_rand(rng) % 100);
    p.deadline = r < 60 ? D_NONE : r < 65 ? D_PASSED : r < 85 ? D_SHORT : D_LONG;
    p.work = (unsigned)(test_rand(rng) % 300);
    return p;
}

/* ---- the consumer: its callbacks carry out the plan ----------------------- */

static int fault_prepare(void *ctx)
{
    struct worker *w = ctx;
    w->prepares++;
    if (w->plan.cancel_at == C_IN_PREPARE)
        sluice_cancel_fire(&w->token);
    return w->plan.prepare_fails ? -ENOENT : SLUICE_OK;
}

static void count_in_client(int backend, int delta)
{
    int now = atomic_fetch_add(&in_client[backend], delta) + delta;
    int max = atomic_load(&max_in_client[backend]);
    while (now > max && !atomic_compare_exchange_weak(&max_in_client[backend], &max, now))
        ;
}

static int fault_generate(void *ctx, struct sluice_generation *gen)
{
    struct worker *w = ctx;
    /* A token this run fired itself has fired before this generation began. */
    if (w->plan.cancel_at != C_EXTERNAL && sluice_cancel_fired(&w->token))
        w->violations++;
    count_in_client(w->plan.backend, +1);
    w->generations++;
    for (unsigned i = 0; i < w->plan.work; i++)
        sluice_cpu_relax();
    if (w->plan.work % 16 == 0)
        sched_yield(); /* descheduled holding a permit: the queue behind it grows */
    count_in_client(w->plan.backend, -1);
    if (w->plan.cancel_at == C_IN_GENERATE)
        sluice_cancel_fire(&w->token);
    if ((int)gen->attempt != w->plan.fail_attempt)
        return SLUICE_OK;
    gen->outcome = (enum sluice_outcome)(w->plan.work % 3);
    return -EIO;
}

static int fault_validate(void *ctx, unsigned attempt, bool *repair)
{
    struct worker *w = ctx;
    if (w->plan.cancel_at == C_IN_VALIDATE)
        sluice_cancel_fire(&w->token);
    if (w->plan.repairs_wanted < 0)
        return -EBADMSG;
    *repair = (int)attempt < w->plan.repairs_wanted;
    return *repair ? -EBADMSG : SLUICE_OK;
}

static const struct sluice_run_ops fault_ops = {fault_prepare, fault_generate, fault_validate};

/* ---- the oracle ------------------------------------------------------------ */

struct expectation {
    int status;
    int client_status; /* with SLUICE_ECLIENT: the failing callback's code */
    int prepares, generations;
};

/* A callback's own failure: the run reports SLUICE_ECLIENT and keeps the code. */
static struct expectation client_failed(struct expectation e, int code)
{
    e.status = SLUICE_ECLIENT;
    e.client_status = code;
    return e;
}

/* What the plan returns when nothing timing-dependent intervenes. */
static struct expectation expected(const struct plan *p)
{
    struct expectation e = {SLUICE_OK, 0, 0, 0};
    bool fired = p->cancel_at == C_BEFORE;
    if (fired || p->deadline == D_PASSED) {
        e.status = fired ? SLUICE_ECANCELED : SLUICE_ETIMEDOUT;
        return e;
    }
    e.prepares = 1;
    fired = p->cancel_at == C_IN_PREPARE;
    if (p->prepare_fails)
        return client_failed(e, -ENOENT);
    for (int attempt = 0;; attempt++) {
        if (fired) {
            e.status = SLUICE_ECANCELED;
            return e;
        }
        e.generations++;
        fired = fired || p->cancel_at == C_IN_GENERATE || p->cancel_at == C_IN_VALIDATE;
        if (attempt == p->fail_attempt)
            return client_failed(e, -EIO);
        bool out_of_repairs = attempt < p->repairs_wanted && attempt >= (int)p->max_repairs;
        if (p->repairs_wanted < 0 || out_of_repairs)
            return client_failed(e, -EBADMSG);
        if (attempt >= p->repairs_wanted)
            return e;
    }
}

static bool may_be_rejected(int backend)
{
    return backend_active[backend] != 0;
}

/* Check one finished run against its plan; returns the number of broken promises. */
static long check_run(struct worker *w, const struct sluice_run_result *r)
{
    const struct plan *p = &w->plan;
    struct expectation e = expected(p);
    long bad = 0;
    if (r->status == SLUICE_ELATE) { /* predicted too late, or a standing queue: nothing ran */
        bad += (p->deadline != D_SHORT && p->deadline != D_LONG) || !may_be_rejected(p->backend);
        bad += w->prepares + w->generations != 0;
        bad += r->generations != 0;
        return bad;
    }
    if (r->status == SLUICE_ECAPACITY) {
        bad += !may_be_rejected(p->backend);
        bad += w->prepares + w->generations != 0;
        bad += r->generations != 0 || r->elapsed_ns != 0;
        return bad;
    }
    bad += (int)r->generations != w->generations;
    bad += r->generations > 1 + p->max_repairs;
    if (r->status == e.status && (e.status != SLUICE_ECLIENT || r->client_status == e.client_status))
        return bad + (w->generations != e.generations) + (w->prepares != e.prepares);
    /* Only a timing-dependent fault may end the run differently, with its identity. */
    bool external_fired = p->cancel_at == C_EXTERNAL && sluice_cancel_fired(&w->token);
    bool deadline_passed = p->deadline == D_SHORT && sluice_deadline_passed(&w->deadline);
    if (r->status == SLUICE_ECANCELED)
        bad += !external_fired;
    else if (r->status == SLUICE_ETIMEDOUT) /* or refused: less left than the expected service */
        bad += !deadline_passed && !(p->deadline == D_SHORT && r->refused_late);
    else
        bad++;
    bad += w->generations > e.generations;
    return bad;
}

/* ---- threads ---------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (long i = 0; i < RUNS_PER_WORKER; i++) {
        w->plan = random_plan(&w->rng);
        w->prepares = w->generations = 0;
        sluice_cancel_reset(&w->token); /* nobody waits on it between runs */
        struct sluice_run_desc d = {.backend = backend_ids[w->plan.backend], .ops = &fault_ops,
                                    .ctx = w, .cancel = &w->token,
                                    .max_repairs = SLUICE_SOME(w->plan.max_repairs)};
        if (w->plan.cancel_at == C_BEFORE)
            sluice_cancel_fire(&w->token);
        if (w->plan.deadline != D_NONE) {
            int64_t in = w->plan.deadline == D_PASSED ? -SLUICE_NS_PER_MS
                       : w->plan.deadline == D_SHORT ? (int64_t)(test_rand(&w->rng) % 200000)
                                                     : 3600 * SLUICE_NS_PER_SEC;
            w->deadline = deadline_in(in);
            d.deadline = &w->deadline;
        }
        if (w->plan.cancel_at == C_EXTERNAL)
            cancel_arm(&w->armed);
        struct sluice_run_result r;
        sluice_run(w->engine, &d, &r);
        if (w->plan.cancel_at == C_EXTERNAL)
            cancel_disarm(&w->armed);
        w->violations += check_run(w, &r);
        w->runs++;
        w->by_status[r.status == SLUICE_OK ? 0 : r.status == SLUICE_ECAPACITY ? 1
                     : r.status == SLUICE_ECANCELED || r.status == SLUICE_ETIMEDOUT ? 2 : 3]++;
    }
    return NULL;
}

/* Fires armed tokens at random moments: before admission, mid-prepare, mid-wait... */
static void *canceller_main(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    struct sluice_pool *limited = sluice_engine_pool(workers[0].engine, "limited");
    if (!limited)
        return NULL;
    while (!atomic_load(&stop_canceller)) {
        uint32_t queued = sluice_pool_stats(limited).queued;
        max_queued = queued > max_queued ? queued : max_queued;
        struct worker *w = &workers[test_rand(&rng) % WORKERS];
        if (test_rand(&rng) % 4 == 0)
            cancel_fire_if_armed(&w->armed, &w->token, NULL, NULL);
        random_pause(&rng, 200);
    }
    return NULL;
}

Test(run_faults, random_failures_at_every_stage_keep_identity_and_release_all_capacity,
     .timeout = 300)
{
    struct sluice_backend_desc b[] = {
        {.id = "limited", .active = 3, .waiting = SLUICE_SOME(5)},
        {.id = "tight", .active = 1, .waiting = SLUICE_SOME(0)},
        {.id = "free"},
    };
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 3},
                                      &e),
                 SLUICE_OK);
    for (int i = 0; i < WORKERS; i++) {
        workers[i] = (struct worker){.id = i, .rng = (uint64_t)i * 0x9E37 + 11, .engine = e};
        sluice_cancel_init(&workers[i].token);
    }
    pthread_t canceller;
    pthread_create(&canceller, NULL, canceller_main, (void *)(uintptr_t)12345);
    test_run_threads(WORKERS, worker_main, workers, sizeof workers[0]);
    atomic_store(&stop_canceller, 1);
    pthread_join(canceller, NULL);

    long runs = 0, by_status[4] = {0};
    for (int i = 0; i < WORKERS; i++) {
        cr_expect_eq(workers[i].violations, 0, "worker %d broke %ld promises", i,
                     workers[i].violations);
        runs += workers[i].runs;
        for (int k = 0; k < 4; k++)
            by_status[k] += workers[i].by_status[k];
    }
    cr_log_info("%ld runs: %ld ok, %ld rejected, %ld cancelled/timed out, %ld failed; "
                "deepest queue %u",
                runs, by_status[0], by_status[1], by_status[2], by_status[3], max_queued);
    cr_assert_eq(runs, (long)WORKERS * RUNS_PER_WORKER);
    for (int k = 0; k < 4; k++)
        cr_assert_gt(by_status[k], 0, "outcome class %d never happened: the mix is too tame", k);
    cr_assert_gt(max_queued, 0, "no generation ever queued for a permit: the mix is too tame");
    for (int i = 0; i < N_BACKENDS; i++) {
        if (backend_active[i])
            cr_assert_leq(atomic_load(&max_in_client[i]), (int)backend_active[i],
                          "%s: %d generations at once", backend_ids[i],
                          atomic_load(&max_in_client[i]));
        assert_capacity_intact(sluice_engine_pool(e, backend_ids[i]));
    }
    sluice_engine_destroy(e);
}
