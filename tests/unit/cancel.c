/* Cancel tokens: each test is named after the promise it checks. */
#include <criterion/criterion.h>
#include <sluice/cancel.h>

#include <pthread.h>
#include <unistd.h>

#include "common.h"

struct probe_hook {
    struct sluice_cancel_hook hook; /* first: the hook pointer is the probe's */
    _Atomic(int) runs;
};

static void probe_fn(struct sluice_cancel_hook *hook)
{
    atomic_fetch_add(&((struct probe_hook *)hook)->runs, 1);
}

static void probe_init(struct probe_hook *p)
{
    atomic_init(&p->runs, 0);
    p->hook.fn = probe_fn;
}

Test(cancel, fire_runs_each_registered_hook_exactly_once_and_is_idempotent)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct probe_hook hooks[3];
    for (int i = 0; i < 3; i++) {
        probe_init(&hooks[i]);
        cr_assert(sluice_cancel_register(&c, &hooks[i].hook));
    }
    cr_assert_not(sluice_cancel_fired(&c));
    sluice_cancel_fire(&c);
    sluice_cancel_fire(&c);
    cr_assert(sluice_cancel_fired(&c));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(atomic_load(&hooks[i].runs), 1, "hook %d ran %d times", i,
                     atomic_load(&hooks[i].runs));
        sluice_cancel_unregister(&c, &hooks[i].hook); /* after its run: returns at once */
    }
    struct probe_hook late;
    probe_init(&late);
    cr_assert_not(sluice_cancel_register(&c, &late.hook), "a fired token refuses new hooks");
    cr_assert_eq(atomic_load(&late.runs), 0);
}

Test(cancel, an_unregistered_hook_never_runs)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct probe_hook kept, gone;
    probe_init(&kept);
    probe_init(&gone);
    cr_assert(sluice_cancel_register(&c, &kept.hook));
    cr_assert(sluice_cancel_register(&c, &gone.hook));
    sluice_cancel_unregister(&c, &gone.hook);
    sluice_cancel_fire(&c);
    cr_assert_eq(atomic_load(&kept.runs), 1);
    cr_assert_eq(atomic_load(&gone.runs), 0);
    sluice_cancel_unregister(&c, &kept.hook);
}

Test(cancel, a_reset_token_can_be_fired_again)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    sluice_cancel_fire(&c);
    sluice_cancel_reset(&c);
    cr_assert_not(sluice_cancel_fired(&c));
    struct probe_hook p;
    probe_init(&p);
    cr_assert(sluice_cancel_register(&c, &p.hook));
    sluice_cancel_fire(&c);
    cr_assert_eq(atomic_load(&p.runs), 1);
    sluice_cancel_unregister(&c, &p.hook);
}

/* ---- fire runs hooks after dropping the token's lock ---------------------- */

struct reentrant_hook {
    struct sluice_cancel_hook hook;
    struct sluice_cancel *token;
    _Atomic(int) register_result; /* -1 until the hook ran */
};

static void reentrant_fn(struct sluice_cancel_hook *hook)
{
    struct reentrant_hook *r = (struct reentrant_hook *)hook;
    struct sluice_cancel_hook other;
    other.fn = probe_fn;
    /* Takes the token's lock: deadlocks if fire still held it. */
    atomic_store(&r->register_result, sluice_cancel_register(r->token, &other) ? 1 : 0);
}

Test(cancel, a_hook_may_take_the_token_lock_because_fire_runs_hooks_after_unlocking, .timeout = 10)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct reentrant_hook r = {.token = &c};
    r.hook.fn = reentrant_fn;
    atomic_init(&r.register_result, -1);
    cr_assert(sluice_cancel_register(&c, &r.hook));
    sluice_cancel_fire(&c);
    cr_assert_eq(atomic_load(&r.register_result), 0, "the token has fired: register refuses");
    sluice_cancel_unregister(&c, &r.hook);
}

/* ---- unregister waits for a detached hook ---------------------------------
 * Hooks run in some order, one at a time, on the firing thread. The blocker
 * holds fire inside itself until released, so every other hook is detached
 * from the token but not yet run: unregister of one of those must not return
 * (its memory might be reused) until fire has run it. */

struct blocker_hook {
    struct sluice_cancel_hook hook;
    _Atomic(int) started;
    _Atomic(int) release;
};

static void blocker_fn(struct sluice_cancel_hook *hook)
{
    struct blocker_hook *b = (struct blocker_hook *)hook;
    atomic_store(&b->started, 1);
    while (!atomic_load(&b->release))
        usleep(100);
}

struct detached_ctx {
    struct sluice_cancel *token;
    struct probe_hook *waiter;
    _Atomic(int) returned;
    int runs_at_return;
};

static void *fire_thread(void *p)
{
    sluice_cancel_fire(p);
    return NULL;
}

static void *unregister_thread(void *p)
{
    struct detached_ctx *d = p;
    sluice_cancel_unregister(d->token, &d->waiter->hook);
    d->runs_at_return = atomic_load(&d->waiter->runs);
    atomic_store(&d->returned, 1);
    return NULL;
}

Test(cancel, unregister_of_a_hook_fire_has_detached_waits_until_fire_has_run_it, .timeout = 20)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct blocker_hook blocker = {.hook = {.fn = blocker_fn}};
    struct probe_hook waiters[2];
    /* Registered on both sides of the blocker, so whichever order fire runs
     * hooks in, one probe is still pending while the blocker runs. */
    probe_init(&waiters[0]);
    cr_assert(sluice_cancel_register(&c, &waiters[0].hook));
    cr_assert(sluice_cancel_register(&c, &blocker.hook));
    probe_init(&waiters[1]);
    cr_assert(sluice_cancel_register(&c, &waiters[1].hook));
    pthread_t firer;
    pthread_create(&firer, NULL, fire_thread, &c);
    WAIT_UNTIL(atomic_load(&blocker.started));
    int pending = atomic_load(&waiters[0].runs) == 0 ? 0 : 1;
    cr_assert_eq(atomic_load(&waiters[pending].runs), 0, "both probes ran before the blocker");
    struct detached_ctx d = {.token = &c, .waiter = &waiters[pending]};
    pthread_t unregisterer;
    pthread_create(&unregisterer, NULL, unregister_thread, &d);
    usleep(50000); /* unregister has every chance to return early, wrongly */
    cr_assert_eq(atomic_load(&d.returned), 0,
                 "unregister returned while fire still had the hook to run");
    atomic_store(&blocker.release, 1);
    pthread_join(unregisterer, NULL);
    pthread_join(firer, NULL);
    cr_assert_eq(d.runs_at_return, 1, "the hook ran before unregister returned");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(atomic_load(&waiters[i].runs), 1);
    sluice_cancel_unregister(&c, &blocker.hook);
    sluice_cancel_unregister(&c, &waiters[1 - pending].hook);
}

/* ---- the stop reason ------------------------------------------------------ */

Test(cancel, wait_stop_reason_prefers_cancel_over_an_expired_deadline)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct timespec past, future;
    sluice_deadline_in(&past, -SLUICE_NS_PER_SEC);
    sluice_deadline_in(&future, 60 * SLUICE_NS_PER_SEC);
    cr_assert_eq(sluice_wait_stop_reason(NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_wait_stop_reason(&future, &c), SLUICE_OK);
    cr_assert_eq(sluice_wait_stop_reason(&past, &c), SLUICE_ETIMEDOUT);
    sluice_cancel_fire(&c);
    cr_assert_eq(sluice_wait_stop_reason(&past, &c), SLUICE_ECANCELED);
    cr_assert_eq(sluice_wait_stop_reason(NULL, &c), SLUICE_ECANCELED);
}

Test(cancel, wait_stop_reason_rejects_an_unnormalised_deadline_with_einval)
{
    struct sluice_cancel c;
    sluice_cancel_init(&c);
    struct timespec future;
    sluice_deadline_in(&future, 60 * SLUICE_NS_PER_SEC);
    struct timespec too_big = {.tv_sec = future.tv_sec, .tv_nsec = SLUICE_NS_PER_SEC};
    struct timespec negative = {.tv_sec = future.tv_sec, .tv_nsec = -1};
    cr_assert_eq(sluice_wait_stop_reason(&too_big, NULL), SLUICE_EINVAL);
    cr_assert_eq(sluice_wait_stop_reason(&negative, &c), SLUICE_EINVAL);
    sluice_cancel_fire(&c);
    cr_assert_eq(sluice_wait_stop_reason(&too_big, &c), SLUICE_EINVAL,
                 "a bad argument is reported even when the token has fired");
}
