/* sluice/effects.h: the combiner runs posted effects after the lock, once,
 * on one thread at a time; the latest record wins; grants wait for a flush. */
#include <criterion/criterion.h>
#include <sluice/effects.h>

#include <pthread.h>
#include <unistd.h>

struct owner {
    struct sluice_effects fx;
    sluice_spinlock lock;
    int rounds;
    int nested_flushes; /* a round that calls flush again */
    _Atomic(int) in_round;
    _Atomic(int) overlap;  /* rounds seen running at once */
    _Atomic(int) held;     /* rounds wait while this is 1 */
};

static void owner_round(void *ctx)
{
    struct owner *o = ctx;
    if (atomic_fetch_add_explicit(&o->in_round, 1, SLUICE_SEQ_CST))
        atomic_store_explicit(&o->overlap, 1, SLUICE_SEQ_CST);
    o->rounds++;
    if (o->nested_flushes) {
        o->nested_flushes--;
        sluice_effects_flush(&o->fx, owner_round, o); /* returns at once: we are the flusher */
    }
    while (atomic_load_explicit(&o->held, SLUICE_SEQ_CST))
        usleep(1000);
    atomic_fetch_sub_explicit(&o->in_round, 1, SLUICE_SEQ_CST);
}

static void owner_init(struct owner *o)
{
    memset((void *)o, 0, sizeof *o);
    sluice_effects_init(&o->fx);
    sluice_spinlock_init(&o->lock);
    atomic_init(&o->in_round, 0);
    atomic_init(&o->overlap, 0);
    atomic_init(&o->held, 0);
}

/* A locked section that leaves an effect, as discovery's do. */
static void owner_post(struct owner *o)
{
    sluice_spinlock_lock(&o->lock);
    sluice_effects_mark(&o->fx);
    sluice_effects_post(&o->fx);
    sluice_spinlock_unlock(&o->lock);
}

Test(effects, a_flush_runs_what_was_posted_and_nothing_more)
{
    static struct owner o;
    owner_init(&o);
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 0, "nothing posted: no round");
    sluice_spinlock_lock(&o.lock);
    sluice_effects_post(&o.fx); /* nothing marked: nothing posted */
    sluice_spinlock_unlock(&o.lock);
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 0);
    owner_post(&o);
    owner_post(&o);
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 1, "one round covers every section posted before it");
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 1, "and runs once");
}

Test(effects, a_flush_from_inside_a_round_returns_at_once)
{
    static struct owner o;
    owner_init(&o);
    o.nested_flushes = 1;
    owner_post(&o);
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 1, "the nested flush found a flusher at work and left it the work");
}

Test(effects, the_latest_record_wins_and_is_taken_once)
{
    static struct owner o;
    owner_init(&o);
    struct sluice_lock_record rec, out;
    memset(&rec, 0, sizeof rec);
    cr_assert_not(sluice_effects_take_record(&o.fx, &o.lock, &out), "none set yet");
    sluice_spinlock_lock(&o.lock);
    rec.ceiling = 12;
    sluice_effects_set_record(&o.fx, &rec);
    rec.ceiling = 0; /* a clear after the save */
    sluice_effects_set_record(&o.fx, &rec);
    sluice_effects_post(&o.fx);
    sluice_spinlock_unlock(&o.lock);
    cr_assert(sluice_effects_take_record(&o.fx, &o.lock, &out));
    cr_assert_eq(out.ceiling, 0, "the older save never lands after the newer clear");
    cr_assert_not(sluice_effects_take_record(&o.fx, &o.lock, &out), "taken once");
}

static int delivered;
static void count_event(void *ctx, const struct sluice_event *ev)
{
    (void)ctx;
    cr_assert_eq(ev->seq, (uint64_t)delivered + 1, "in seq order");
    delivered++;
}

Test(effects, events_are_delivered_once_in_seq_order)
{
    static struct owner o;
    owner_init(&o);
    struct sluice_event_slot slots[8];
    struct sluice_event_ring ring;
    sluice_event_ring_init(&ring, slots, 8, "n");
    struct sluice_event ev;
    memset(&ev, 0, sizeof ev);
    for (int i = 0; i < 3; i++)
        sluice_event_ring_push(&ring, &ev);
    sluice_effects_deliver(&o.fx, &ring, NULL, NULL);
    cr_assert_eq(delivered, 0, "no callback: skipped, not kept for later");
    for (int i = 0; i < 5; i++)
        sluice_event_ring_push(&ring, &ev);
    delivered = 3;
    sluice_effects_deliver(&o.fx, &ring, count_event, NULL);
    cr_assert_eq(delivered, 8);
    sluice_effects_deliver(&o.fx, &ring, count_event, NULL);
    cr_assert_eq(delivered, 8, "once");
}

struct granted {
    struct sluice_gate_waiter w;
    int calls, status;
};

static void on_grant(struct sluice_gate_waiter *w, int status)
{
    struct granted *g = w->data;
    g->calls++;
    g->status = status;
}

Test(effects, stashed_grants_wait_for_the_next_flush)
{
    static struct owner o;
    owner_init(&o);
    struct sluice_gate *gate;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 1}, &gate), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(gate, NULL, NULL), SLUICE_OK);
    struct granted a = {.calls = 0, .status = 99}, b = a;
    a.w.cb = b.w.cb = on_grant;
    a.w.data = &a;
    b.w.data = &b;
    sluice_gate_acquire_async(gate, &a.w);
    sluice_gate_acquire_async(gate, &b.w);
    sluice_spinlock_lock(&o.lock);
    struct sluice_gate_node *chain = sluice_gate_set_limit_collect(gate, 3);
    cr_assert_not_null(chain);
    sluice_effects_stash_grants(&o.fx, chain);
    sluice_spinlock_unlock(&o.lock);
    cr_assert_eq(a.calls + b.calls, 0, "no callback under the owner's lock");
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(a.calls, 1);
    cr_assert_eq(b.calls, 1);
    cr_assert_eq(a.status, SLUICE_OK);
    cr_assert_eq(b.status, SLUICE_OK);
    cr_assert_eq(o.rounds, 0, "a grant is not a posted effect");
    sluice_gate_release(gate);
    sluice_gate_release(gate);
    sluice_gate_release(gate);
    sluice_gate_destroy(gate);
}

static void *slow_flusher(void *arg)
{
    struct owner *o = arg;
    sluice_effects_flush(&o->fx, owner_round, o);
    return NULL;
}

Test(effects, sync_waits_for_the_running_flusher_and_rounds_never_overlap, .timeout = 30)
{
    static struct owner o;
    owner_init(&o);
    atomic_store_explicit(&o.held, 1, SLUICE_SEQ_CST);
    owner_post(&o);
    pthread_t tid;
    pthread_create(&tid, NULL, slow_flusher, &o);
    while (!atomic_load_explicit(&o.in_round, SLUICE_SEQ_CST))
        usleep(1000);
    owner_post(&o); /* posted while the other thread's round runs */
    sluice_effects_flush(&o.fx, owner_round, &o);
    cr_assert_eq(atomic_load_explicit(&o.in_round, SLUICE_SEQ_CST), 1,
                 "flush did not wait: the running flusher takes our effect over");
    atomic_store_explicit(&o.held, 0, SLUICE_SEQ_CST);
    sluice_effects_sync(&o.fx, owner_round, &o);
    cr_assert_eq(o.rounds, 2, "sync returned after the round that covers our post");
    cr_assert_eq(atomic_load_explicit(&o.in_round, SLUICE_SEQ_CST), 0);
    cr_assert_eq(atomic_load_explicit(&o.overlap, SLUICE_SEQ_CST), 0, "one round at a time");
    pthread_join(tid, NULL);
}
