/*
 * sluice-demo — watch sluice discover a provider's hidden concurrency cap,
 * over real HTTP, in under a minute (`cmake --workflow --preset demo`).
 *
 *   sluice-demo [--cap N] [--seconds S] [--hold] [--state FILE] [--svg FILE] ...
 *
 * It starts sluice-provider-sim on a free loopback port with a hidden cap
 * (--cap, else $SLUICE_DEMO_CAP, else 52) in reject mode (429 past the cap),
 * and drives a few thousand requests (15 s of traffic, longer until a
 * ceiling locks) at it through sluice_curl_loop with the default `discover`
 * policy: the limit starts at the jumpstart, climbs, backs off on the first
 * 429s and locks at or just below the cap. On the way it
 * shows the node's status line with a progress bar (redrawn in place on a
 * terminal, periodic plain lines otherwise), every discovery event as it
 * happens, and the address of the admin endpoint's Concurrency Health page.
 * At the end: a summary (429 share, goodput, elapsed), an SVG timeline (a run
 * that restored its lock writes it beside --svg as NAME-restored.svg), the
 * lock persisted to the demo's own state file (never the user's), three ways
 * to clear it, and as the last line `discovered ceiling: N (true cap: C)`.
 * A second run restores the lock from that file (🔒 from the first request).
 *
 * Threads: the main thread samples, prints and decides when to stop; the
 * loop thread runs every transfer and each completion, which resubmits its
 * client's request while the budget lasts; event callbacks (loop thread, or
 * the main thread during engine create for "restore") only append to a
 * mutex-guarded list that the main thread prints from, so no two threads
 * ever write to the terminal.
 *
 * Exit status: 0 when a ceiling is locked, 1 when the run ended without
 * one or could not start, 2 on a bad command line.
 *
 * Files: see demo.h.
 */
#define _GNU_SOURCE
#include "demo.h"

const char *demo_sim_path = "sluice-provider-sim";

/* Next to this program (an install, or the build tree), else the build's path. */
static const char *find_tool(const char *name, const char *built, char *buf, size_t size)
{
    char self[PATH_MAX - 64]; /* room for "/name" in buf */
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, size, "%s/%s", self, name);
            if (access(buf, X_OK) == 0)
                return buf;
        }
    }
    if (built && access(built, X_OK) == 0)
        return built;
    return NULL;
}

/* ---- the run ---------------------------------------------------------------------- */


static long answered(struct demo *d)
{
    return atomic_load(&d->ok) + atomic_load(&d->overloaded) + atomic_load(&d->failed);
}

static void on_event(void *ctx, const struct sluice_event *ev)
{
    struct demo *d = ctx;
    pthread_mutex_lock(&d->mu);
    if (d->n_events < EVENTS_MAX)
        d->events[d->n_events++] = *ev;
    if (ev->kind == SLUICE_EVENT_RESTORE)
        d->restored = true;
    pthread_mutex_unlock(&d->mu);
}

static void on_done(const struct sluice_curl_result *r, CURL *easy, void *data);

/* Submit a client's request if the budget allows; false when it is spent. */
static bool submit(struct demo *d, CURL *easy)
{
    if (atomic_load(&d->stopping) ||
        (d->o->requests && atomic_fetch_add(&d->submitted, 1) >= d->o->requests))
        return false;
    struct sluice_curl_request req = {.backend = NODE, .easy = easy, .done = on_done, .data = d};
    int status = sluice_curl_loop_submit(d->loop, &req, NULL);
    if (status != SLUICE_OK && status != SLUICE_ECLOSED) {
        fprintf(stderr, "\n" PROG ": submit: %s\n", sluice_strerror(status));
        atomic_store(&d->stopping, true);
    }
    return status == SLUICE_OK;
}

/* On the loop thread: tally the answer, then send the client's next request. */
static void on_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    struct demo *d = data;
    if (r->status == SLUICE_ECLOSED || r->status == SLUICE_ECANCELED)
        return; /* the run is over */
    if (r->status == SLUICE_OK && r->kind == SLUICE_CURL_SUCCESS)
        atomic_fetch_add(&d->ok, 1);
    else if (r->outcome == SLUICE_OUTCOME_OVERLOAD)
        atomic_fetch_add(&d->overloaded, 1);
    else
        atomic_fetch_add(&d->failed, 1);
    submit(d, easy);
}

static CURL *make_request(struct demo *d)
{
    static const char body[] = "{\"model\":\"sim\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"Say hi\"}]}";
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_easy_setopt(c, CURLOPT_URL, d->url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, d->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, tool_discard);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
    return c;
}

/* ---- what the person sees --------------------------------------------------------- */

static int terminal_columns(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* The glyph of the state an event leaves the node in. */
static const char *event_glyph(enum sluice_event_kind kind)
{
    switch (kind) {
    case SLUICE_EVENT_BACKOFF:
        return sluice_discovery_state_glyph(SLUICE_DISCOVERY_BACKOFF);
    case SLUICE_EVENT_LOCK:
    case SLUICE_EVENT_RESTORE:
        return sluice_discovery_state_glyph(SLUICE_DISCOVERY_LOCKED);
    case SLUICE_EVENT_STORE:
        return "!";
    default:
        return sluice_discovery_state_glyph(SLUICE_DISCOVERY_PROBING);
    }
}

static void print_event(struct demo *d, const struct sluice_event *e)
{
    char limits[48];
    if (e->old_limit != e->new_limit)
        snprintf(limits, sizeof limits, "%" PRIu32 " → %" PRIu32, e->old_limit, e->new_limit);
    else
        snprintf(limits, sizeof limits, "%" PRIu32, e->new_limit);
    /* "→" is one column but three bytes: pad by hand. Columns as in the
     * header print_banner writes; the line stays within 80 columns. */
    int pad = 11 - (int)strlen(limits) + (e->old_limit != e->new_limit ? 2 : 0);
    printf("  %7.2fs  %-9s%s%*s %-12s %4" PRIu32, since_start_s(d, e->t_ns),
           sluice_event_kind_name(e->kind), limits, pad > 0 ? pad : 0, "",
           sluice_cause_name(e->cause), e->in_flight);
    if (e->ceiling)
        printf("  ceiling %-5" PRIu32, e->ceiling);
    printf("  %s\n", event_glyph(e->kind));
}

/* "[██████░░░░] 6.2/15 s": the run's time, in `cells` cells. */
static void progress_bar(char *buf, size_t size, double t, double total, int cells)
{
    cells = cells < 0 ? 0 : cells > BAR_MAX ? BAR_MAX : cells;
    int full = (int)((double)cells * fmin(t / total, 1.0));
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < cells && n + 4 < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s", i < full ? "█" : "░");
    snprintf(buf + n, size - n, "] %.1f/%g s", t, total);
}

/* The live line: "cloud:demo 31/33 📈  [████░░░░] 6.2/15 s · 2314 requests · 429s 1.4%". */
static void print_status(struct demo *d, bool final)
{
    char line[SLUICE_NODE_ID_MAX + 64], bar[BAR_MAX * 3 + 64];
    sluice_engine_status_line(d->engine, NODE, line, sizeof line);
    long done = answered(d), over = atomic_load(&d->overloaded);
    double share = done ? 100.0 * (double)over / (double)done : 0;
    double t = since_start_s(d, sluice_monotonic_ns());
    if (d->tty) {
        /* What is not the bar takes about 64 columns; emoji are two wide
         * (some terminals draw 🌧️ as one): keep slack so that the line never
         * wraps, which would break the in-place redraw. */
        progress_bar(bar, sizeof bar, t, d->o->seconds, d->cols - 66);
        printf("\r\033[K%s  %s · %ld requests · 429s %.1f%%%s", line, bar, done, share,
               final ? "\n" : "");
    } else {
        printf("  %7.2fs  %s  %ld requests, 429s %.1f%%\n", t, line, done, share);
    }
    fflush(stdout);
}

/* Print events that arrived since the last call, above the live line. */
static void print_new_events(struct demo *d)
{
    pthread_mutex_lock(&d->mu);
    size_t n = d->n_events, from = d->printed;
    d->printed = n;
    pthread_mutex_unlock(&d->mu);
    if (from == n)
        return;
    if (d->tty)
        fputs("\r\033[K", stdout);
    for (size_t i = from; i < n; i++)
        print_event(d, &d->events[i]); /* entries below n_events are never rewritten */
    fflush(stdout);
}

static void take_sample(struct demo *d)
{
    if (d->n_samples == SAMPLES_MAX)
        return;
    struct sluice_discovery_status st;
    sluice_engine_status(d->engine, NODE, &st);
    d->samples[d->n_samples++] = (struct sample){
        .t_s = since_start_s(d, sluice_monotonic_ns()), .limit = st.limit,
        .in_flight = st.in_flight, .overloads = atomic_load(&d->overloaded)};
}

/* ---- setting up ------------------------------------------------------------------------ */

#ifndef SLUICE_DEMO_SIM_BUILT
#define SLUICE_DEMO_SIM_BUILT NULL
#endif
#ifndef SLUICE_DEMO_SLUICECTL_BUILT
#define SLUICE_DEMO_SLUICECTL_BUILT NULL
#endif
#define SIM_SIGMA 0.4 /* lognormal shape of the simulator's service times */

static int start_simulator(struct demo *d)
{
    static char path[PATH_MAX];
    demo_sim_path = find_tool("sluice-provider-sim", SLUICE_DEMO_SIM_BUILT, path, sizeof path);
    if (!demo_sim_path)
        return fail("cannot find sluice-provider-sim next to this program; build it "
                    "(cmake --build BUILD --target sluice-provider-sim)");
    char cap[16], median[32], sigma[16];
    snprintf(cap, sizeof cap, "%u", d->o->cap);
    snprintf(median, sizeof median, "%g", d->o->median_ms);
    snprintf(sigma, sizeof sigma, "%g", SIM_SIGMA);
    const char *args[] = {"--mode", "reject", "--cap", cap, "--median-ms", median,
                          "--sigma", sigma, NULL};
    if (sim_process_start(&d->sim, args) != 0)
        return fail("the provider simulator %s did not start", demo_sim_path);
    sim_process_url(&d->sim, "/v1/chat/completions", d->url, sizeof d->url);
    return EXIT_OK;
}

/* The cap the saved lock was discovered against, kept beside the state file. */
static void cap_file(const struct demo *d, char *buf, size_t size)
{
    snprintf(buf, size, "%s.sim-cap", d->o->state);
}

/*
 * A lock saved by a run against another cap is wrong for this provider, as
 * after a plan change: drop it (what `sluicectl clear` does), and say so.
 */
static void forget_lock_of_another_cap(struct demo *d)
{
    char path[PATH_MAX + 16];
    cap_file(d, path, sizeof path);
    FILE *f = fopen(path, "r");
    unsigned saved = 0;
    if (!f)
        return;
    if (fscanf(f, "%u", &saved) != 1)
        saved = 0;
    fclose(f);
    struct sluice_lock_record rec;
    if (!saved || saved == d->o->cap || sluice_statefile_load(d->state, NODE, &rec) != SLUICE_OK ||
        !rec.ceiling)
        return;
    if (sluice_statefile_clear(d->state, NODE) == SLUICE_OK) {
        d->cleared_ceiling = rec.ceiling;
        d->cleared_cap = saved;
    }
}

static void remember_cap(const struct demo *d)
{
    char path[PATH_MAX + 16];
    cap_file(d, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%u\n", d->o->cap);
        fclose(f);
    }
}

static int open_state_and_engine(struct demo *d)
{
    char err[256] = "";
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = d->o->state, .error = err,
                                                               .error_size = sizeof err},
                              &d->state) != SLUICE_OK)
        return fail("state file %s: %s", d->o->state, err);
    forget_lock_of_another_cap(d);
    struct sluice_store_ops store = sluice_statefile_ops(d->state);
    /* Discovery with every default (jumpstart 5, lock 24 h): what a user gets. */
    struct sluice_discovery_desc discovery;
    memset(&discovery, 0, sizeof discovery);
    /* `active` is the most discovery may ever allow: far above any cap the demo takes. */
    uint32_t most = d->o->cap * 4 > 512 ? d->o->cap * 4 : 512;
    struct sluice_backend_desc backend = {.id = NODE, .endpoint = d->url, .active = most,
                                          .waiting = SLUICE_SOME(d->o->clients),
                                          .discovery = &discovery};
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &backend, .n_backends = 1,
                                                          .store = &store, .on_event = on_event,
                                                          .on_event_ctx = d, .error = err,
                                                          .error_size = sizeof err},
                             &d->engine) != SLUICE_OK)
        return fail("engine: %s", err);
    return EXIT_OK;
}

/* Port 8400 if it is free, else any free one: the URL printed is the real one. */
static void start_admin(struct demo *d)
{
    char err[256] = "";
    struct sluice_admin_desc desc = {.engine = d->engine, .port = SLUICE_SOME(d->o->admin_port),
                                     .error = err, .error_size = sizeof err};
    if (sluice_admin_start(&desc, &d->admin) != SLUICE_OK && d->o->admin_port != 0) {
        desc.port = SLUICE_SOME(0);
        sluice_admin_start(&desc, &d->admin);
    }
    if (d->admin)
        snprintf(d->admin_url, sizeof d->admin_url, "http://127.0.0.1:%u",
                 (unsigned)sluice_admin_port(d->admin));
    else
        fprintf(stderr, PROG ": no admin endpoint (%s); the demo runs without it\n", err);
}

static void print_banner(struct demo *d)
{
    const struct options *o = d->o;
    printf("sluice demo: discovering a provider's hidden concurrency cap over real HTTP\n\n");
    printf("  provider   sluice-provider-sim at %s\n"
           "             hidden cap %u (%s), HTTP 429 past it, median call %g ms\n",
           d->url, o->cap, o->cap_from, o->median_ms);
    printf("  traffic    %u clients sending back to back for %g s, through sluice_curl_loop\n"
           "             (libcurl multi)\n",
           o->clients, o->seconds);
    printf("  node       " NODE ": policy discover, its defaults (jumpstart 5, 24 h lock)\n");
    printf("  state      %s\n             (the demo's own file, never your real state)\n", o->state);
    if (d->admin)
        printf("  health     %s/  (Concurrency Health page)\n"
               "             live while the demo runs%s\n",
               d->admin_url, o->hold ? ", and after it until Ctrl-C" : "; --hold keeps it up after");
    if (d->cleared_ceiling)
        printf("\n  cleared    the saved lock (ceiling %" PRIu32 ") was found against cap %u; the\n"
               "             provider now has cap %u, as after a plan change, so the demo\n"
               "             cleared it first (sluice_statefile_clear) and discovers again\n",
               d->cleared_ceiling, d->cleared_cap, o->cap);
    if (d->restored) {
        struct sluice_discovery_status st;
        sluice_engine_status(d->engine, NODE, &st);
        int64_t left = st.lock_expires_s - (int64_t)time(NULL);
        printf("\n  restored   the lock an earlier run saved: ceiling %" PRIu32 ", %" PRId64 "h%02" PRId64
               "m left\n             no discovery this time: %s from the first request\n"
               "             (clear the lock to discover again: see the end)\n",
               st.ceiling, left / 3600, left % 3600 / 60,
               sluice_discovery_state_glyph(SLUICE_DISCOVERY_LOCKED));
    }
    printf("\n  event timeline (seconds since the first request)\n"
           "      time  event    limit       cause        in flight\n");
    fflush(stdout);
}

static int start_traffic(struct demo *d)
{
    struct sluice_curl_loop_desc desc = {.engine = d->engine, .max_requests = d->o->clients};
    int status = sluice_curl_loop_create(&desc, &d->loop);
    if (status != SLUICE_OK)
        return fail("sluice_curl_loop_create: %s", sluice_strerror(status));
    d->headers = curl_slist_append(NULL, "Content-Type: application/json");
    d->easy = calloc(d->o->clients, sizeof *d->easy);
    for (unsigned i = 0; d->easy && i < d->o->clients; i++)
        if (!(d->easy[i] = make_request(d)))
            return fail("curl_easy_init failed");
    if (!d->easy || !d->headers)
        return fail("out of memory");
    d->t0_ns = sluice_monotonic_ns();
    for (unsigned i = 0; i < d->o->clients; i++)
        submit(d, d->easy[i]);
    return EXIT_OK;
}

/* ---- running, and the end ---------------------------------------------------------- */

/* When the node locked (seconds since the start), or -1. */
static double lock_time(struct demo *d)
{
    double t = -1;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->n_events && t < 0; i++)
        if (d->events[i].kind == SLUICE_EVENT_LOCK || d->events[i].kind == SLUICE_EVENT_RESTORE)
            t = since_start_s(d, d->events[i].t_ns);
    pthread_mutex_unlock(&d->mu);
    return t;
}

#define AFTER_LOCK_S 2.0 /* traffic at the ceiling shown before the run may end */

/* Why the run should end now, or NULL to go on. */
static const char *should_stop(struct demo *d)
{
    double t = since_start_s(d, sluice_monotonic_ns()), locked = lock_time(d);
    if (interrupted)
        return "interrupted";
    if (d->o->requests && answered(d) >= d->o->requests)
        return "the request budget (--requests) is spent";
    if (t >= d->o->seconds && locked >= 0 && t >= locked + AFTER_LOCK_S)
        return "locked";
    if (t >= d->o->timeout_s)
        return "time limit (--timeout)";
    if (atomic_load(&d->stopping))
        return "a request could not be submitted";
    return NULL;
}

static const char *run(struct demo *d)
{
    const char *why;
    int64_t next_line = 0;
    while (!(why = should_stop(d))) {
        sim__sleep_ms(TICK_MS);
        take_sample(d);
        print_new_events(d);
        int64_t now = sluice_monotonic_ns();
        if (d->tty || now >= next_line) {
            print_status(d, false);
            next_line = now + SLUICE_NS_PER_SEC;
        }
    }
    atomic_store(&d->stopping, true);
    take_sample(d);
    print_new_events(d);
    print_status(d, true); /* the last live line shows the run, not its teardown */
    sluice_curl_loop_close(d->loop); /* whatever is still in flight ends ECLOSED */
    /* Every event and the store write of the lock are done before the report. */
    sluice_engine_sync(d->engine, NODE);
    print_new_events(d);
    if (d->printed) { /* the timeline's causes in words, for a reader who never saw them */
        putchar('\n');
        tool_print_causes(d->events, d->printed, "  ", 80);
    }
    return why;
}

static const char *absolute(const char *path, char *buf)
{
    return realpath(path, buf) ? buf : path;
}

static void print_summary(struct demo *d, const char *why, const struct sluice_discovery_status *st)
{
    long done = answered(d), ok = atomic_load(&d->ok), over = atomic_load(&d->overloaded);
    double elapsed = since_start_s(d, sluice_monotonic_ns());
    if (d->n_samples)
        elapsed = d->samples[d->n_samples - 1].t_s;
    /* At the cap the provider serves cap / (mean call) requests per second. */
    double mean_s = d->o->median_ms / 1e3 * exp(SIM_SIGMA * SIM_SIGMA / 2);
    printf("\nsummary (%s)\n", why);
    printf("  requests    %ld answered: %ld ok, %ld with 429, %ld failed\n", done, ok, over,
           atomic_load(&d->failed));
    printf("  429 share   %.2f%%\n", done ? 100.0 * (double)over / (double)done : 0.0);
    printf("  goodput     %.1f ok/s", elapsed > 0 ? (double)ok / elapsed : 0.0);
    if (mean_s > 0)
        printf(" (at the true cap the provider serves about %.0f/s)", d->o->cap / mean_s);
    printf("\n  elapsed     %.1f s\n", elapsed);
    char buf[PATH_MAX], plot[PATH_MAX];
    printf("  timeline    %s\n              (limit and in flight over time, 429s, the lock%s)\n",
           absolute(plot_path(d, plot, sizeof plot), buf),
           d->restored ? "; the discovery plot stays where the run that locked it left it" : "");
    if (st->state == SLUICE_DISCOVERY_LOCKED)
        printf("  lock        ceiling %" PRIu32 ", %s for 24 h in\n"
               "              %s\n              (the next run restores it)\n",
               st->ceiling, d->restored ? "restored, and kept" : "persisted",
               absolute(sluice_statefile_path(d->state), buf));
}

static void print_how_to_clear(struct demo *d)
{
    char state[PATH_MAX];
    const char *ctl = find_tool("sluicectl", SLUICE_DEMO_SLUICECTL_BUILT, d->sluicectl,
                                sizeof d->sluicectl);
    printf("\nto clear the lock (the next run then discovers the cap again), either\n");
    printf("  with sluicectl, in the state file:\n    %s clear " NODE " --state %s\n",
           ctl ? ctl : "sluicectl", absolute(sluice_statefile_path(d->state), state));
    if (d->admin)
        printf("  on the admin endpoint of the live process (%s):\n"
               "    curl -X POST '%s/compute/concurrency/clear?node_id=" NODE "'\n",
               d->o->hold ? "it stays up until Ctrl-C" : "rerun with --hold to keep it up",
               d->admin_url);
    printf("  or with the C API, in the process that owns the engine:\n"
           "    sluice_engine_clear(engine, \"" NODE "\");\n");
}

static void hold(struct demo *d)
{
    if (!d->o->hold || !d->admin || interrupted)
        return;
    fprintf(stderr, "\nholding: the Concurrency Health page stays at %s/ until Ctrl-C;\n"
                    "events (a clear through the endpoint, say) show below\n",
            d->admin_url);
    d->tty = false; /* no live line to redraw any more */
    while (!interrupted) {
        sim__sleep_ms(200);
        sluice_engine_poll(d->engine);
        print_new_events(d);
    }
}

static void cleanup(struct demo *d)
{
    sluice_admin_stop(d->admin);
    sluice_curl_loop_destroy(d->loop);
    for (unsigned i = 0; d->easy && i < d->o->clients; i++)
        curl_easy_cleanup(d->easy[i]);
    free(d->easy);
    curl_slist_free_all(d->headers);
    if (d->engine) {
        sluice_engine_close(d->engine);
        sluice_engine_destroy(d->engine);
    }
    sluice_statefile_close(d->state);
    sim_process_stop(&d->sim);
    free(d->samples);
    pthread_mutex_destroy(&d->mu);
}

int main(int argc, char **argv)
{
    tool_name = PROG;
    struct options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != EXIT_OK)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    static struct demo demo; /* big (the event list); one per process */
    struct demo *d = &demo;
    d->o = &o;
    d->sim.out_fd = -1;
    pthread_mutex_init(&d->mu, NULL);
    d->tty = !o.plain && isatty(STDOUT_FILENO);
    d->cols = terminal_columns();
    d->samples = calloc(SAMPLES_MAX, sizeof *d->samples);
    if (!d->samples)
        rc = fail("out of memory");
    if (rc == EXIT_OK)
        rc = start_simulator(d);
    if (rc == EXIT_OK)
        rc = open_state_and_engine(d);
    if (rc == EXIT_OK) {
        start_admin(d);
        print_banner(d);
        rc = start_traffic(d);
    }
    if (rc == EXIT_OK) {
        const char *why = run(d);
        struct sluice_discovery_status st;
        sluice_engine_status(d->engine, NODE, &st);
        bool locked = st.state == SLUICE_DISCOVERY_LOCKED;
        if (write_svg(d, locked ? st.ceiling : 0) != EXIT_OK)
            rc = EXIT_FAIL;
        print_summary(d, why, &st);
        if (locked) {
            remember_cap(d);
            print_how_to_clear(d);
        } else {
            printf("\nno ceiling locked (%s): %" PRIu32 " is the limit it had reached\n", why,
                   st.limit);
            rc = EXIT_FAIL;
        }
        if (locked)
            printf("\ndiscovered ceiling: %" PRIu32 " (true cap: %u)\n", st.ceiling, o.cap);
        else
            printf("\ndiscovered ceiling: none (true cap: %u)\n", o.cap);
        fflush(stdout);
        hold(d); /* its messages go to stderr: the line above stays stdout's last */
    }
    cleanup(d);
    curl_global_cleanup();
    return rc;
}

