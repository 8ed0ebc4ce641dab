/*
 * sluice/run.h — the run lifecycle: one synchronous request to a backend,
 * from admission to its validated result.
 *
 * What it is: sluice_run() drives
 *   admit -> prepare -> generate -> validate [-> generate -> validate]... -> leave
 * on the caller's thread and returns the ordinary result. The model client
 * comes in through an ops struct, so a built-in client (the libcurl shim) and
 * an injected one get exactly the same scheduling:
 *   - admission is immediate and happens before prepare: a full pool returns
 *     SLUICE_ECAPACITY with no partial result, and neither prepare nor the
 *     client is called;
 *   - every generation — the initial one and each repair — holds a permit of
 *     the backend's pool only while the client runs (sluice_pool_call_begin /
 *     _call_end); prepare and validate hold none;
 *   - a repair re-takes a permit but never re-admits, so it is never rejected
 *     because new runs filled the waiting queue;
 *   - the run's deadline and cancel token apply to every wait — for an
 *     adaptive backend also the wait for a provider's Retry-After hold to
 *     end; ECANCELED and ETIMEDOUT keep their identity (cancel wins), and a
 *     run whose cancel won before a generation started never calls the
 *     client for it;
 *   - what each generation reports (gen->outcome, gen->retry_after_ns) is
 *     the sample an adaptive backend's ceiling discovery learns from;
 *   - every exit — success, prepare / client / validate failure, repairs
 *     exhausted, cancel, timeout — leaves the pool and holds no permit, so
 *     capacity after any mix of failures equals capacity before.
 * An unknown backend ID is SLUICE_EINVAL; a run with no backend ID uses the
 * engine's unlimited endpoint-only pool (sluice/engine.h).
 *
 * Callbacks run on the thread that called sluice_run, one at a time, in
 * lifecycle order; each returns SLUICE_OK or an error of its own (any
 * nonzero int, e.g. -errno). A callback's error fails the run with
 * SLUICE_ECLIENT and its code in result->client_status, so it can never be
 * mistaken for the run's own statuses: a client that returns -ETIMEDOUT is
 * not the run's SLUICE_ETIMEDOUT, nor is a client's SLUICE_ECAPACITY a full
 * pool.
 *
 * Progress: blocking (the permit waits of sluice/pool.h); no allocation.
 *
 * Concurrency: any number of threads may call sluice_run on one engine at
 * once; the engine and every token, deadline and ctx a run uses must outlive
 * the call. Callbacks of different runs run concurrently with each other.
 *
 * Memory ordering: nothing beyond the pool's: what one generation writes
 * before its permit is released is visible to the next holder of that permit.
 */
#ifndef SLUICE_RUN_H
#define SLUICE_RUN_H

#include "engine.h"

#define SLUICE_RUN_REPAIRS_DEFAULT 1u

/* One model call, as the client sees it. */
struct sluice_generation {
    /* in */
    const char *backend;             /* the run's backend ID; NULL for endpoint-only runs */
    const char *endpoint;            /* the run's override, else the backend's (may be NULL) */
    unsigned attempt;                /* 0: the initial generation; n: the n-th repair */
    const struct timespec *deadline; /* the run's deadline, for the client to honour */
    const struct timespec *start_deadline; /* the run's start deadline: the call must have begun
                                              (a stream, delivered its first byte) by then; for
                                              the client to honour (NULL = none) */
    struct sluice_cancel *cancel;    /* the run's cancel token, for the client to honour */
    /* out: what the call showed about the provider's capacity, for discovery */
    enum sluice_outcome outcome; /* (default: SLUICE_OUTCOME_OK; a failed call that leaves it
                                    OK is recorded as SLUICE_OUTCOME_IGNORE) */
    int64_t retry_after_ns;      /* with SLUICE_OUTCOME_OVERLOAD: the provider's Retry-After
                                    (default: 0 = none) */
    int64_t latency_ns;          /* the latency signal the client measured, e.g. time to the
                                    first byte of a streamed answer (default: -1 = the pool
                                    times the whole call) */
    bool abandoned;              /* the client gave up on the call (the run's deadlines or
                                    token) after its request was sent: the provider may still
                                    be running it (sluice_pool_call_abandon_latency; with
                                    latency_ns >= 0 if the signal was seen before the cut)
                                    (default: false) */
    enum sluice_expiry expired;  /* with a deadline's SLUICE_ETIMEDOUT: which one (default:
                                    NONE = the whole-call deadline, if the call timed out) */
    double stated_rate;          /* the request rate the provider stated, calls per second
                                    (e.g. sluice_curl_stated_rate), offered to discovery after
                                    the call (sluice_discovery_hint_rate) (default: 0 = none) */
};

struct sluice_run_ops {
    /* Expensive preparation (artifact loading, rendering); holds no permit.
     * (default: NULL = nothing to prepare) */
    int (*prepare)(void *ctx);
    /* Make one model call; holds a permit for its whole duration. (required) */
    int (*generate)(void *ctx, struct sluice_generation *gen);
    /* Check the output of generation `attempt`; holds no permit. Return
     * SLUICE_OK to accept it. Return an error to fail the run, or set
     * *repair and return an error to ask for a repair generation: granted
     * while repairs remain, else the run fails with that error.
     * (default: NULL = accept every output) */
    int (*validate)(void *ctx, unsigned attempt, bool *repair);
};

struct sluice_run_desc {
    const char *backend;                /* backend ID (default: NULL = endpoint-only, unlimited) */
    const char *endpoint;               /* endpoint override; keeps the backend's pool
                                           (default: NULL = the backend's endpoint) */
    const struct sluice_run_ops *ops;   /* (required, with ops->generate) */
    void *ctx;                          /* passed to every callback (default: NULL) */
    const struct timespec *deadline;    /* absolute CLOCK_MONOTONIC, for every wait
                                           (default: NULL = none) */
    const struct timespec *start_deadline; /* each generation must have begun (a stream,
                                           delivered its first byte) by then: a start
                                           deadline, for the permit wait and the client
                                           (default: NULL = none; see sluice/time.h) */
    struct sluice_cancel *cancel;       /* ends every wait (default: NULL = none) */
    struct sluice_opt_u32 max_repairs;  /* repair generations allowed (default: 1;
                                           SLUICE_SOME(0) = none) */
};

/* Which callback failed a run (with SLUICE_ECLIENT). */
enum sluice_run_stage {
    SLUICE_STAGE_NONE = 0,
    SLUICE_STAGE_PREPARE,
    SLUICE_STAGE_GENERATE,
    SLUICE_STAGE_VALIDATE,
};

#define SLUICE_RUN_ERROR_MAX 256 /* bytes of sluice_run_result.error, NUL included */

struct sluice_run_result {
    int status;                   /* what sluice_run returned */
    int64_t elapsed_ns;           /* admission to completion, queue waits included */
    int64_t prepare_ns;           /* inside prepare only, queue waits excluded */
    int64_t queued_ns;            /* waiting for generation permits (and any Retry-After
                                     hold), all generations */
    unsigned generations;         /* client calls made: the initial one plus repairs */
    bool refused_late;            /* SLUICE_ETIMEDOUT without calling the client: it could no
                                     longer start in time (sluice/pool_deadlines.h) */
    enum sluice_expiry expired;   /* which deadline: with SLUICE_ETIMEDOUT (a wait), with
                                     SLUICE_ECLIENT whose client_status is SLUICE_ETIMEDOUT (the
                                     client's call ended at a deadline: gen->expired, else the
                                     whole call's), and with SLUICE_ELATE (the one the predicted
                                     wait leaves too little of: sluice_pool_admit_late) */
    struct sluice_sample last;    /* the last generation's sample, as discovery gets it */
    int client_status;            /* with SLUICE_ECLIENT: the failing callback's own code */
    enum sluice_run_stage client_stage; /* ... and which callback it was */
    char error[SLUICE_RUN_ERROR_MAX]; /* with SLUICE_EINVAL: what to fix (a NULL engine or
                                         generate, an unknown backend ID, a deadline not
                                         normalised or not on CLOCK_MONOTONIC); else empty */
};

/* A callback's own error becomes SLUICE_ECLIENT, its code kept in the result. */
SLUICE_INLINE int sluice__run_client_failed(struct sluice_run_result *r, enum sluice_run_stage stage,
                                            int code)
{
    r->client_status = code;
    r->client_stage = stage;
    return SLUICE_ECLIENT;
}

/* One generation: permit, client call, permit back. */
SLUICE_INLINE int sluice__run_generate(struct sluice_pool *pool, const struct sluice_run_desc *d,
                                       struct sluice_generation *gen, struct sluice_run_result *r)
{
    struct sluice_call call;
    int status = sluice_pool_call_begin_by(pool, d->start_deadline, d->deadline, d->cancel, &call);
    r->queued_ns += call.queued_ns;
    r->refused_late = call.refused_late;
    r->expired = call.expired;
    if (status != SLUICE_OK)
        return status;
    gen->outcome = SLUICE_OUTCOME_OK;
    gen->retry_after_ns = 0;
    gen->latency_ns = -1;
    gen->abandoned = false;
    gen->expired = SLUICE_EXPIRED_NONE;
    gen->stated_rate = 0;
    status = d->ops->generate(d->ctx, gen);
    r->generations++;
    if (status == SLUICE_ETIMEDOUT)
        r->expired = gen->expired != SLUICE_EXPIRED_NONE ? gen->expired : SLUICE_EXPIRED_CALL;
    /* A failed call cannot tell discovery the provider served it. */
    if (status != SLUICE_OK && gen->outcome == SLUICE_OUTCOME_OK)
        gen->outcome = SLUICE_OUTCOME_IGNORE;
    if (gen->abandoned) {
        int why = sluice_wait_stop_reason(sluice_deadline_first(d->start_deadline, d->deadline),
                                          d->cancel);
        if (status == SLUICE_ETIMEDOUT && why == SLUICE_OK)
            why = SLUICE_ETIMEDOUT; /* the client's own clock ran out a moment before ours */
        r->last = sluice_pool_call_abandon_latency(pool, &call,
                                                   why == SLUICE_OK ? SLUICE_ECANCELED : why,
                                                   gen->latency_ns);
    } else {
        r->last = sluice_pool_call_end_latency(pool, &call, gen->outcome, gen->retry_after_ns,
                                               gen->latency_ns);
        struct sluice_discovery *disc = sluice_pool_discovery(pool);
        if (gen->stated_rate > 0 && disc) /* after the permit moved on, as the transports do */
            sluice_discovery_hint_rate(disc, gen->stated_rate,
                                       sluice_clock_now(&pool->clock) - call.start_ns,
                                       SLUICE_CAUSE_PROVIDER_RATE);
    }
    return status == SLUICE_OK ? SLUICE_OK
                               : sluice__run_client_failed(r, SLUICE_STAGE_GENERATE, status);
}

/* Everything between admission and leave. */
SLUICE_INLINE int sluice__run_admitted(struct sluice_engine *e,
                                       const struct sluice_backend *b,
                                       const struct sluice_run_desc *d, struct sluice_run_result *r)
{
    /* Preparation is expensive: skip it for a run that is already over. */
    int status = sluice_wait_stop_reason(sluice_deadline_first(d->start_deadline, d->deadline),
                                         d->cancel);
    if (status == SLUICE_ETIMEDOUT)
        r->expired = sluice_deadline_which(d->start_deadline, d->deadline);
    if (status != SLUICE_OK)
        return status;
    if (d->ops->prepare) {
        int64_t t0 = sluice_clock_now(&e->clock);
        status = d->ops->prepare(d->ctx);
        r->prepare_ns = sluice_clock_now(&e->clock) - t0;
        if (status != SLUICE_OK)
            return sluice__run_client_failed(r, SLUICE_STAGE_PREPARE, status);
    }
    struct sluice_generation gen;
    gen.backend = b->id;
    gen.endpoint = d->endpoint;
    SLUICE__DEFAULT(gen.endpoint, b->endpoint);
    gen.deadline = d->deadline;
    gen.start_deadline = d->start_deadline;
    gen.cancel = d->cancel;
    struct sluice_opt_u32 max_repairs = d->max_repairs;
    SLUICE__DEFAULT_OPT(max_repairs, SLUICE_RUN_REPAIRS_DEFAULT);
    for (unsigned attempt = 0;; attempt++) {
        gen.attempt = attempt;
        status = sluice__run_generate(b->pool, d, &gen, r);
        if (status != SLUICE_OK || !d->ops->validate)
            return status;
        bool repair = false;
        status = d->ops->validate(d->ctx, attempt, &repair);
        if (status == SLUICE_OK)
            return SLUICE_OK;
        if (!repair || attempt >= max_repairs.value)
            return sluice__run_client_failed(r, SLUICE_STAGE_VALIDATE, status);
    }
}

/* Why sluice_run refuses `desc` (SLUICE_EINVAL, naming what to fix in r->error), or SLUICE_OK
 * with *b its backend. Both deadlines: the earlier one alone is what the waits check first. */
SLUICE_INLINE int sluice__run_check(struct sluice_engine *engine,
                                    const struct sluice_run_desc *desc,
                                    const struct sluice_backend **b, struct sluice_run_result *r)
{
    if (!engine || !desc)
        return sluice__fail(r->error, sizeof r->error, "sluice_run: the %s is NULL",
                            !engine ? "engine" : "description");
    if (!desc->ops || !desc->ops->generate)
        return sluice__fail(r->error, sizeof r->error,
                            "sluice_run: desc->ops->generate is required (the client call)");
    if (!(*b = sluice_engine_find(engine, desc->backend)))
        return sluice__fail(r->error, sizeof r->error,
                            "sluice_run: backend \"%s\" is not one of the engine's (set "
                            "desc->backend to a registered ID, or NULL for the endpoint-only "
                            "backend)",
                            desc->backend);
    int status = sluice_deadline_check(desc->start_deadline, "start_deadline", r->error,
                                       sizeof r->error);
    return status == SLUICE_OK
               ? sluice_deadline_check(desc->deadline, "deadline", r->error, sizeof r->error)
               : status;
}

/*
 * Run one request on `engine` as `desc` describes and wait for its result.
 * Returns the run's status, also stored in result->status (result may be
 * NULL): SLUICE_OK, SLUICE_ECAPACITY (rejected: nothing was called and the
 * rest of *result is zero), SLUICE_ELATE (the predicted wait leaves the
 * run too little of its deadline or start deadline, result->expired says
 * which: nothing was called; see sluice/pool_deadlines.h), SLUICE_EINVAL (bad desc, unknown backend
 * ID, or either deadline with its tv_nsec outside [0, 1e9) or more than a
 * year ahead, SLUICE_DEADLINE_AHEAD_MAX_NS: a CLOCK_REALTIME reading, which
 * would bound nothing; refused before admission, nothing called;
 * result->error names what to fix), SLUICE_ECANCELED,
 * SLUICE_ETIMEDOUT (result->expired says which deadline; result->refused_late
 * that a generation could no longer start in time and the client was not
 * called), SLUICE_ECLOSED (the engine or pool was closed: at
 * admission, or while the run waited for a permit), or SLUICE_ECLIENT (a
 * callback failed; result->client_status and ->client_stage say which and
 * how).
 */
SLUICE_INLINE int sluice_run(struct sluice_engine *engine, const struct sluice_run_desc *desc,
                             struct sluice_run_result *result)
{
    struct sluice_run_result r;
    memset(&r, 0, sizeof r);
    const struct sluice_backend *b = NULL;
    r.status = sluice__run_check(engine, desc, &b, &r);
    if (r.status == SLUICE_OK && (r.status = sluice_pool_admit_late(b->pool, desc->start_deadline,
                                                                    desc->deadline, &r.expired)) ==
                                     SLUICE_OK) {
        int64_t start = sluice_clock_now(&engine->clock);
        r.status = sluice__run_admitted(engine, b, desc, &r);
        sluice_pool_leave(b->pool);
        r.elapsed_ns = sluice_clock_now(&engine->clock) - start;
    }
    if (result)
        *result = r;
    return r.status;
}

#endif /* SLUICE_RUN_H */
