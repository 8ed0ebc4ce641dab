/*
 * deadline_cases.c — overload with deadlines over real loopback HTTP, beside
 * an oracle in the same process. 64 blocking threads call sluice-provider-sim
 * (reject mode, hidden cap 24, lognormal service with a 200 ms median and
 * σ 0.4), half through sluice_curl_perform and half through the chat client
 * under sluice_run, each call with a 250 ms deadline covering its queue wait
 * and its transfer, for 12 s (ov_shape.seconds) on a fresh simulator per client:
 *
 *   defaults    an adaptive backend (active 64, default discovery and
 *               deadline rules): what a new user gets
 *   oracle      the same program with the gate fixed at the true cap and no
 *               backlog (active 24, waiting 0): what a client that knew the
 *               cap would serve
 *   queue_late  defaults, but with sluice_deadline_desc.queue_late: every
 *               call with a deadline is admitted and queued until its
 *               deadline (no refusal at admission, no leaving the line)
 *
 * Rows (case overload.deadlines, one per client and run): successes per
 * second (ops_per_s), and extras: successes, ratio (to the oracle of the
 * same run), refused (ELATE at admission or ECAPACITY), refused_late (left
 * the line or not started: too late), started (transfers begun), cut (their
 * share the caller's deadline ended mid-transfer), sim_cancelled, and the
 * limit and ceiling at the end. Targets (the defaults row): ratio >= 0.8 and
 * limit >= 0.85·C = 20.4 after 12 s, in at least 9 of 10 runs with one
 * busy loop (SLUICE_BENCH_OVERLOAD_RUNS=10 SLUICE_BENCH_BUSY=1). With
 * SLUICE_BENCH_TRACE set, each adaptive run's discovery events go to stderr
 * as JSON Lines. SLUICE_BENCH_OVERLOAD_CAP, _THREADS, _DEADLINE_MS and _SECONDS
 * change the scenario's cap, callers, deadline and length (the targets then
 * scale with the cap). It
 * is a scenario, not a micro-benchmark: repeat it before believing a number.
 *
 * With SLUICE_BENCH_OVERLOAD_LOOP=1 every thread calls through one curl loop
 * instead (sluice_curl_loop_submit, then waits for its answer), and the
 * clients are defaults, oracle, read_on (defaults whose requests carry
 * `cut`, so a call its deadline cut is answered there and read on to the
 * provider's end; the simulator keeps working on a call whose client left,
 * as hosted APIs do) and oracle_read_on (the oracle reading on too, which
 * read_on's ratio is to: a lingering oracle keeps permits for an estimate). The virtual-time rows censored* and read_on* are this
 * shape at cap 52 (SLUICE_BENCH_OVERLOAD_CAP=52 _THREADS=120
 * _DEADLINE_MS=247: about 30% of calls cut).
 */
#include "harness.h"

#ifdef SLUICE_BENCH_CURL

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/client.h>
#include <sluice/curl.h>

#include "sluice-provider-sim/sim_process.h"

#define OV_RUNS_MAX 20
#define OV_THREADS_MAX 256

/* The scenario's shape: the case by default; SLUICE_BENCH_OVERLOAD_CAP, _THREADS and
 * _DEADLINE_MS try others (a policy tuned on one shape only is a policy tuned to a test). */
struct ov_shape {
    int cap, threads, seconds;
    int64_t deadline_ns;
};

static struct ov_shape ov_shape;

#define OV_BODY "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

struct ov_totals {
    long successes, refused, refused_late, started, cut;
};

#define OV_LOOP_HANDLES 8 /* a loop caller's requests at once: one answered, others read on */

struct ov_worker;

/* One request on the loop: its handle is the loop's from submit until done. */
struct ov_call {
    CURL *easy;
    struct ov_worker *w;
    bool busy, cut; /* submitted and done not yet run; answered through cut */
};

/* What a loop caller was answered (through cut or done). */
struct ov_answer {
    int status;
    bool ok, refused_late, started, cut;
};

struct ov_worker {
    struct sluice_engine *engine;
    const char *url, *base;
    _Atomic(bool) *stop;
    bool chat; /* the chat client under sluice_run, else sluice_curl_perform */
    struct sluice_curl_loop *loop; /* SLUICE_BENCH_OVERLOAD_LOOP: through the loop instead */
    bool read_on;                  /* ... with requests that carry `cut` */
    pthread_mutex_t mu;            /* the loop's callbacks and the caller meet here */
    pthread_cond_t cv;
    bool answered;
    struct ov_answer answer;
    struct ov_call calls[OV_LOOP_HANDLES];
    struct ov_totals t;
};

static size_t ov_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* A refused caller comes back after OV_REFUSED_PAUSE_NS, as a user shown a fast 503 does:
 * without it, 64 threads that retry at once spin two cores on admission, and the run
 * measures the scheduler, not the provider. The same for every client. */
#define OV_REFUSED_PAUSE_NS (2 * SLUICE_NS_PER_MS)

static void ov_count(struct ov_totals *t, int status, bool ok, bool refused_late, bool started,
                     bool cut)
{
    bool refused = status == SLUICE_ELATE || status == SLUICE_ECAPACITY;
    if (refused) {
        struct timespec pause = {0, OV_REFUSED_PAUSE_NS};
        nanosleep(&pause, NULL);
    }
    t->successes += status == SLUICE_OK && ok;
    t->refused += refused;
    t->refused_late += refused_late;
    t->started += started;
    t->cut += cut;
}

/* A handle for one chat request to the simulator, its answer dropped. */
static CURL *ov_easy(const struct ov_worker *w)
{
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, w->url);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, OV_BODY);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ov_discard);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

static void ov_perform_loop(struct ov_worker *w)
{
    CURL *easy = ov_easy(w);
    while (!atomic_load(w->stop)) {
        struct timespec dl;
        struct sluice_curl_result r;
        int status = sluice_curl_perform(w->engine, "sim", easy,
                                         sluice_deadline_in(&dl, ov_shape.deadline_ns), NULL, &r);
        ov_count(&w->t, status, r.kind == SLUICE_CURL_SUCCESS, r.refused_late, r.transferred,
                 r.transferred && r.kind == SLUICE_CURL_ABORTED);
    }
    curl_easy_cleanup(easy);
}

static void ov_chat_loop(struct ov_worker *w)
{
    struct sluice_chat *chat = NULL;
    if (sluice_chat_create(&(struct sluice_chat_desc){.base_url = w->base, .model = "m",
                                                      .prompt = "hi"},
                           &chat) != SLUICE_OK)
        return;
    while (!atomic_load(w->stop)) {
        struct timespec dl;
        struct sluice_run_result r;
        int status = sluice_run(w->engine,
                                &(struct sluice_run_desc){
                                    .backend = "sim", .ops = &sluice_chat_ops, .ctx = chat,
                                    .deadline = sluice_deadline_in(&dl, ov_shape.deadline_ns)},
                                &r);
        const struct sluice_curl_result *cr = sluice_chat_result(chat);
        ov_count(&w->t, status, true, r.refused_late, r.generations > 0,
                 r.generations > 0 && cr->kind == SLUICE_CURL_ABORTED);
    }
    sluice_chat_destroy(chat);
}

/* On the loop thread, under w->mu: the caller has its answer. */
static void ov_answer(struct ov_worker *w, struct ov_answer a)
{
    w->answer = a;
    w->answered = true;
    pthread_cond_broadcast(&w->cv);
}

static void ov_on_cut(const struct sluice_curl_result *r, void *data)
{
    struct ov_call *k = (struct ov_call *)data;
    pthread_mutex_lock(&k->w->mu);
    k->cut = true;
    ov_answer(k->w, (struct ov_answer){.status = r->status, .started = true, .cut = true});
    pthread_mutex_unlock(&k->w->mu);
}

static void ov_on_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    (void)easy;
    struct ov_call *k = (struct ov_call *)data;
    pthread_mutex_lock(&k->w->mu);
    if (!k->cut)
        ov_answer(k->w, (struct ov_answer){
                            .status = r->status,
                            .ok = r->kind == SLUICE_CURL_SUCCESS,
                            .refused_late = r->refused_late,
                            .started = r->transferred,
                            .cut = r->transferred && r->kind == SLUICE_CURL_ABORTED});
    k->busy = k->cut = false;
    pthread_cond_broadcast(&k->w->cv);
    pthread_mutex_unlock(&k->w->mu);
}

/* A free request of w's (one whose done has run), waiting for one while all are read on. */
static struct ov_call *ov_free_call(struct ov_worker *w)
{
    pthread_mutex_lock(&w->mu);
    for (;;) {
        for (int i = 0; i < OV_LOOP_HANDLES; i++)
            if (!w->calls[i].busy) {
                w->calls[i].busy = true;
                w->answered = false;
                pthread_mutex_unlock(&w->mu);
                return &w->calls[i];
            }
        pthread_cond_wait(&w->cv, &w->mu);
    }
}

static void ov_loop_calls(struct ov_worker *w)
{
    for (int i = 0; i < OV_LOOP_HANDLES; i++)
        w->calls[i] = (struct ov_call){.easy = ov_easy(w), .w = w};
    while (!atomic_load(w->stop)) {
        struct ov_call *k = ov_free_call(w);
        struct timespec dl;
        int status = sluice_curl_loop_submit(
            w->loop,
            &(struct sluice_curl_request){
                .backend = "sim", .easy = k->easy,
                .deadline = sluice_deadline_in(&dl, ov_shape.deadline_ns), .done = ov_on_done,
                .data = k, .write = ov_discard, .cut = w->read_on ? ov_on_cut : NULL},
            NULL);
        struct ov_answer a = {.status = status};
        pthread_mutex_lock(&w->mu);
        if (status == SLUICE_OK) {
            while (!w->answered)
                pthread_cond_wait(&w->cv, &w->mu);
            a = w->answer;
        } else {
            k->busy = false;
        }
        pthread_mutex_unlock(&w->mu);
        ov_count(&w->t, a.status, a.ok, a.refused_late, a.started, a.cut);
    }
}

static void *ov_worker_main(void *arg)
{
    struct ov_worker *w = (struct ov_worker *)arg;
    if (w->loop)
        ov_loop_calls(w);
    else if (w->chat)
        ov_chat_loop(w);
    else
        ov_perform_loop(w);
    return NULL;
}

struct ov_body {
    char text[4096];
    size_t len;
};

static size_t ov_keep(char *data, size_t size, size_t n, void *ctx)
{
    struct ov_body *b = (struct ov_body *)ctx;
    size_t take = size * n < sizeof b->text - 1 - b->len ? size * n : sizeof b->text - 1 - b->len;
    memcpy(b->text + b->len, data, take);
    b->len += take;
    b->text[b->len] = '\0';
    return size * n;
}

/* The simulator's GET /stats into *body; false when unreadable. */
static bool ov_sim_stats(struct sim_process *sim, struct ov_body *body)
{
    char url[96];
    sim_process_url(sim, "/stats", url, sizeof url);
    body->len = 0;
    body->text[0] = '\0';
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ov_keep);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    CURLcode code = curl_easy_perform(easy);
    curl_easy_cleanup(easy);
    return code == CURLE_OK;
}

/* The counter `key` of a /stats body; -1 when absent. */
static long ov_sim_stat(const struct ov_body *body, const char *key)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    const char *at = strstr(body->text, needle);
    return at ? strtol(at + strlen(needle), NULL, 10) : -1;
}

struct ov_client {
    const char *name;
    struct sluice_backend_desc backend;
    bool read_on; /* loop mode: requests carry `cut` */
    int versus;   /* the oracle its ratio is to (an index into the clients) */
};

static bool ov_loop_mode;

/* One client for ov_shape.seconds on a fresh simulator; returns its successes (-1: setup failed). */
static long ov_run(const struct ov_client *c, struct bench_row *row)
{
    struct sim_process sim;
    char cap[16];
    snprintf(cap, sizeof cap, "%d", ov_shape.cap);
    const char *args[] = {"--mode", "reject", "--cap", cap, "--median-ms", "200",
                          "--sigma", "0.4", NULL};
    if (sim_process_start(&sim, args) != 0)
        return -1;
    char url[96], base[96];
    sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
    sim_process_url(&sim, "/v1", base, sizeof base);
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &c->backend, .n_backends = 1},
                             &e) != SLUICE_OK) {
        sim_process_stop(&sim);
        return -1;
    }
    struct sluice_curl_loop *loop = NULL;
    if (ov_loop_mode &&
        sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop) != SLUICE_OK) {
        sluice_engine_destroy(e);
        sim_process_stop(&sim);
        return -1;
    }
    _Atomic(bool) stop = false;
    static struct ov_worker w[OV_THREADS_MAX];
    pthread_t t[OV_THREADS_MAX];
    for (int i = 0; i < ov_shape.threads; i++) {
        w[i] = (struct ov_worker){.engine = e, .url = url, .base = base, .stop = &stop,
                                  .chat = i % 2 == 1, .loop = loop, .read_on = c->read_on};
        pthread_mutex_init(&w[i].mu, NULL);
        pthread_cond_init(&w[i].cv, NULL);
        pthread_create(&t[i], NULL, ov_worker_main, &w[i]);
    }
    struct timespec span = {ov_shape.seconds, 0};
    nanosleep(&span, NULL);
    struct sluice_discovery_status st;
    sluice_engine_status(e, "sim", &st); /* the limit at the end */
    struct ov_body stats;
    bool have_stats = ov_sim_stats(&sim, &stats);
    const struct sluice_event_ring *events = sluice_engine_events(e, "sim");
    if (getenv("SLUICE_BENCH_TRACE")) { /* why the limit moved, for whoever tunes it */
        uint64_t cursor = 0;
        struct sluice_pool_counts n = sluice_pool_stats(sluice_engine_pool(e, "sim"));
        fprintf(stderr, "# overload.deadlines %s: calls ok %llu overload %llu censored %llu; "
                        "lingering %s, lingered %llu; simulator %s\n",
                c->name, (unsigned long long)n.calls_ok, (unsigned long long)n.calls_overload,
                (unsigned long long)n.calls_censored, sluice_linger_name(n.linger_now),
                (unsigned long long)n.lingered, stats.text);
        if (events)
            sluice_event_ring_write_json(stderr, events, &cursor);
    }
    atomic_store(&stop, true);
    struct ov_totals sum = {0};
    for (int i = 0; i < ov_shape.threads; i++) {
        pthread_join(t[i], NULL);
        sum.successes += w[i].t.successes;
        sum.refused += w[i].t.refused;
        sum.refused_late += w[i].t.refused_late;
        sum.started += w[i].t.started;
        sum.cut += w[i].t.cut;
    }
    if (loop) { /* completes what is still read on (SLUICE_ECLOSED), then the handles go */
        sluice_curl_loop_destroy(loop);
        for (int i = 0; i < ov_shape.threads; i++)
            for (int k = 0; k < OV_LOOP_HANDLES; k++)
                curl_easy_cleanup(w[i].calls[k].easy);
    }
    for (int i = 0; i < ov_shape.threads; i++) {
        pthread_mutex_destroy(&w[i].mu);
        pthread_cond_destroy(&w[i].cv);
    }
    *row = bench_row_make("overload.deadlines", c->name, ov_shape.threads);
    row->ops_per_s = (double)sum.successes / ov_shape.seconds;
    bench_row_extra(row, "successes", (double)sum.successes);
    bench_row_extra(row, "refused", (double)sum.refused);
    bench_row_extra(row, "refused_late", (double)sum.refused_late);
    bench_row_extra(row, "started", (double)sum.started);
    bench_row_extra(row, "cut_share", sum.started ? (double)sum.cut / (double)sum.started : 0.0);
    bench_row_extra(row, "sim_cancelled", have_stats ? (double)ov_sim_stat(&stats, "cancelled") : -1);
    bench_row_extra(row, "limit", (double)st.limit);
    bench_row_extra(row, "ceiling", (double)st.ceiling);
    sluice_engine_close(e);
    sluice_engine_destroy(e);
    sim_process_stop(&sim);
    return sum.successes;
}

static void deadline_cases(const struct bench_opts *opts)
{
    if (!bench_case_enabled(opts, "overload.deadlines"))
        return;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    static const struct sluice_discovery_desc discovery = {0};
    ov_shape = (struct ov_shape){
        .cap = bench_env_int("SLUICE_BENCH_OVERLOAD_CAP", 24, 1, 1000),
        .threads = bench_env_int("SLUICE_BENCH_OVERLOAD_THREADS", 64, 1, OV_THREADS_MAX),
        .seconds = bench_env_int("SLUICE_BENCH_OVERLOAD_SECONDS", 12, 1, 600),
        .deadline_ns = bench_env_int("SLUICE_BENCH_OVERLOAD_DEADLINE_MS", 250, 1, 60000) *
                       SLUICE_NS_PER_MS};
    /* Room above the cap for discovery to find it: 64, or twice a larger cap. */
    uint32_t room = ov_shape.cap > 32 ? 2 * (uint32_t)ov_shape.cap : 64;
    ov_loop_mode = bench_env_int("SLUICE_BENCH_OVERLOAD_LOOP", 0, 0, 1) == 1;
    const struct sluice_backend_desc adaptive = {.id = "sim", .active = room,
                                                 .discovery = &discovery};
    const struct sluice_backend_desc fixed = {.id = "sim", .active = (uint32_t)ov_shape.cap,
                                              .waiting = SLUICE_SOME(0)};
    struct sluice_backend_desc queue_late = adaptive;
    queue_late.deadlines.queue_late = true;
    const struct ov_client blocking_clients[] = {
        {"defaults", adaptive, false, 1},
        {"oracle", fixed, false, 1},
        {"queue_late", queue_late, false, 1},
    };
    const struct ov_client loop_clients[] = {
        {"defaults", adaptive, false, 1},
        {"oracle", fixed, false, 1},
        {"read_on", adaptive, true, 3},
        {"oracle_read_on", fixed, true, 3},
    };
    const struct ov_client *clients = ov_loop_mode ? loop_clients : blocking_clients;
    enum { N_CLIENTS_MAX = sizeof loop_clients / sizeof loop_clients[0] };
    int n_clients = ov_loop_mode ? (int)N_CLIENTS_MAX
                                 : (int)(sizeof blocking_clients / sizeof blocking_clients[0]);
    int runs = bench_env_int("SLUICE_BENCH_OVERLOAD_RUNS", 1, 1, OV_RUNS_MAX);
    int busy = bench_busy_count(2), met = 0;
    int busy_pids[2] = {0};
    bench_busy_start(busy_pids, busy);
    printf("  overload.deadlines: cap %d, %d %s, %lld ms deadlines, %d s, %d busy loop%s, "
           "%d run%s\n",
           ov_shape.cap, ov_shape.threads, ov_loop_mode ? "threads on one curl loop" : "threads",
           (long long)(ov_shape.deadline_ns / SLUICE_NS_PER_MS),
           ov_shape.seconds, busy, busy == 1 ? "" : "s", runs, runs == 1 ? "" : "s");
    int met_read_on = 0;
    for (int run = 0; run < runs; run++) {
        struct bench_row rows[N_CLIENTS_MAX];
        long successes[N_CLIENTS_MAX];
        bool ok = true;
        for (int i = 0; i < n_clients && ok; i++)
            if ((successes[i] = ov_run(&clients[i], &rows[i])) < 0) {
                printf("  !!! WARNING: overload.deadlines: %s could not start\n", clients[i].name);
                ok = false;
            }
        if (!ok)
            break;
        for (int i = 0; i < n_clients; i++) {
            long versus = successes[clients[i].versus];
            if (versus > 0)
                bench_row_extra(&rows[i], "ratio", (double)successes[i] / (double)versus);
            bench_emit(&rows[i]);
        }
        double limit = bench_row_extra_value(&rows[0], "limit", 0);
        met += successes[1] > 0 && successes[0] >= 0.8 * (double)successes[1] &&
               limit >= 0.85 * ov_shape.cap;
        if (ov_loop_mode) { /* and at most the cap: lingering's estimate overcounts above it */
            double read_on_limit = bench_row_extra_value(&rows[2], "limit", 0);
            met_read_on += successes[3] > 0 && successes[2] >= 0.8 * (double)successes[3] &&
                           read_on_limit >= 0.85 * ov_shape.cap && read_on_limit <= ov_shape.cap;
        }
    }
    bench_busy_stop(busy_pids, busy);
    printf("  overload.deadlines: defaults met both targets (>= 0.8x the oracle's successes, "
           "limit >= %.1f) in %d of %d runs\n",
           0.85 * ov_shape.cap, met, runs);
    if (ov_loop_mode)
        printf("  overload.deadlines: read_on met both (>= 0.8x oracle_read_on's successes, limit "
               "in [%.1f, %d]) in %d of %d runs\n",
               0.85 * ov_shape.cap, ov_shape.cap, met_read_on, runs);
}

BENCH_REGISTER(deadlines, deadline_cases, false)

#endif /* SLUICE_BENCH_CURL */
