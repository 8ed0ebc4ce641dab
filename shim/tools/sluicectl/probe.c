/*
 * probe.c — `sluicectl probe URL`: discover a real endpoint's ceiling with sluice's
 * default policy. A preflight request first (alone, so a URL that cannot be
 * probed fails with one clear line), then --concurrency-max worker threads
 * send requests through an engine while the main thread watches for the
 * lock, the budget, the time limit or Ctrl-C, and reports.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char usage_probe[] =
    "usage: sluicectl probe URL [options]\n"
    "\n"
    "Discover URL's concurrency ceiling with sluice's default policy: start at 5\n"
    "parallel requests, grow while it answers cleanly, back off on 429/503 or a\n"
    "latency knee, stop once the ceiling locks. Progress goes to stderr (redrawn in\n"
    "place on a terminal); the event timeline, what each of its causes means and,\n"
    "as the last line, 'discovered ceiling: N' go to stdout. Every request is a\n"
    "real one: mind the provider's bill.\n"
    "\n"
    "  --requests N          at most N requests in all (default 2000)\n"
    "  --concurrency-max M   never more than M in flight (default 128, at most 1024)\n"
    "  --header 'Name: v'    add a request header (repeatable), e.g. an Authorization\n"
    "  --body FILE           send FILE as the request body ('-' = stdin)\n"
    "  --method M            request method (default POST with --body, else GET)\n"
    "  --timeout S           stop after S seconds of wall time (default 300)\n"
    "  --request-timeout S   one request's limit; a timeout counts as overload (default 30)\n"
    "  --cacert FILE         verify an https:// URL against the CA certificates in FILE\n"
    "                        (PEM), as curl --cacert (default: the system's store)\n"
    "  --save NODE           persist the locked ceiling as NODE in the state file\n"
    "  --state FILE          the state file for --save (default location as for status)\n"
    "  --json                print one JSON object instead of the timeline\n"
    "\n"
    "Ctrl-C stops it with what it found so far. Exit status 0 when a ceiling locked,\n"
    "1 when it stopped first (the last line then shows the limit it had reached).\n";

#define PROBE_EVENTS_MAX 4096

struct probe {
    const struct opts *o;
    struct sluice_engine *engine;
    const char *node, *url, *method;
    struct curl_slist *headers;
    char *body;
    size_t body_len;
    struct sluice_cancel cancel;
    atomic_bool stop;
    atomic_long started, ok, overloaded, failed, live_workers;
    int64_t t0_ns;
    pthread_mutex_t mu; /* guards events and last_failure */
    struct sluice_event *events;
    size_t n_events;
    char last_failure[256];
    struct sluice_statefile *state; /* --save */
    bool saved_once;                /* a save was handed to the state file */
    int save_status;                /* the last save's, and its message */
    char save_error[512];
};

static void probe_on_event(void *ctx, const struct sluice_event *ev)
{
    struct probe *p = ctx;
    pthread_mutex_lock(&p->mu);
    if (p->n_events < PROBE_EVENTS_MAX)
        p->events[p->n_events++] = *ev;
    pthread_mutex_unlock(&p->mu);
}

/* A handle for the probe's requests; libcurl's own words for a failure go to `error`
 * (CURL_ERROR_SIZE bytes: which host, which TLS check). */
static CURL *probe_easy(struct probe *p, char *error)
{
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    if (p->o->cacert)
        curl_easy_setopt(c, CURLOPT_CAINFO, p->o->cacert);
    curl_easy_setopt(c, CURLOPT_URL, p->url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, p->method);
    if (p->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, p->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)p->body_len);
    } else if (!strcmp(p->method, "HEAD")) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, p->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, tool_discard);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(p->o->request_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "sluicectl-probe");
    return c;
}

/* One request through the engine on `easy` (whose error buffer is `error`); tallies it. */
static int probe_one(struct probe *p, CURL *easy, char *error, struct sluice_curl_result *r)
{
    error[0] = '\0';
    int status = sluice_curl_perform(p->engine, p->node, easy, NULL, &p->cancel, r);
    if (status == SLUICE_OK && r->kind == SLUICE_CURL_SUCCESS) {
        atomic_fetch_add(&p->ok, 1);
    } else if (status == SLUICE_OK || status == SLUICE_EIO) {
        if (r->outcome == SLUICE_OUTCOME_OVERLOAD)
            atomic_fetch_add(&p->overloaded, 1);
        else {
            atomic_fetch_add(&p->failed, 1);
            pthread_mutex_lock(&p->mu);
            if (r->http_status)
                snprintf(p->last_failure, sizeof p->last_failure, "HTTP %ld (%s)", r->http_status,
                         sluice_curl_kind_name(r->kind));
            else
                snprintf(p->last_failure, sizeof p->last_failure, "%s",
                         error[0] ? error : curl_easy_strerror(r->curl_code));
            pthread_mutex_unlock(&p->mu);
        }
    }
    return status;
}

static void *probe_worker(void *arg)
{
    struct probe *p = arg;
    char error[CURL_ERROR_SIZE];
    CURL *easy = probe_easy(p, error);
    while (easy && !atomic_load(&p->stop)) {
        if (atomic_fetch_add(&p->started, 1) >= p->o->requests)
            break;
        struct sluice_curl_result r;
        int status = probe_one(p, easy, error, &r);
        if (status != SLUICE_OK && status != SLUICE_EIO && status != SLUICE_ECANCELED) {
            pthread_mutex_lock(&p->mu);
            snprintf(p->last_failure, sizeof p->last_failure, "%s", sluice_strerror(status));
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->stop, true);
        }
    }
    if (easy)
        curl_easy_cleanup(easy);
    atomic_fetch_sub(&p->live_workers, 1);
    return NULL;
}

/* A transfer that failed on the server's certificate: a private CA may be what is missing. */
static bool tls_refused(CURLcode code)
{
    return code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE;
}

struct preflight {
    struct probe *p;
    struct sluice_curl_result r;
    char error[CURL_ERROR_SIZE]; /* libcurl's words for a failure, "" = none */
    int status;
    atomic_bool done;
};

static void *preflight_main(void *arg)
{
    struct preflight *pf = arg;
    memset(&pf->r, 0, sizeof pf->r);
    pf->status = SLUICE_ENOMEM;
    CURL *easy = probe_easy(pf->p, pf->error);
    if (easy) {
        atomic_fetch_add(&pf->p->started, 1);
        pf->status = probe_one(pf->p, easy, pf->error, &pf->r);
        curl_easy_cleanup(easy);
    }
    atomic_store(&pf->done, true);
    return NULL;
}

/*
 * The first request, alone (on a thread, so Ctrl-C can cancel it): a URL
 * that cannot be probed fails here with one clear line. EXIT_OK to go on;
 * *stopped set when Ctrl-C ended it.
 */
static int probe_preflight(struct probe *p, bool *stopped)
{
    struct preflight pf = {.p = p};
    pthread_t tid;
    if (pthread_create(&tid, NULL, preflight_main, &pf) != 0)
        return fail("cannot start a thread");
    while (!atomic_load(&pf.done)) {
        if (interrupted)
            sluice_cancel_fire(&p->cancel);
        struct timespec ms20 = {0, 20 * 1000 * 1000};
        nanosleep(&ms20, NULL);
    }
    pthread_join(tid, NULL);
    const struct sluice_curl_result *r = &pf.r;
    *stopped = pf.status == SLUICE_ECANCELED;
    if (*stopped)
        return EXIT_OK;
    if (pf.status == SLUICE_EIO && r->kind == SLUICE_CURL_TRANSPORT)
        return fail("no HTTP answer from %s: %s%s", p->url,
                    pf.error[0] ? pf.error : curl_easy_strerror(r->curl_code),
                    tls_refused(r->curl_code) && !p->o->cacert
                        ? " (--cacert FILE trusts a private CA's certificates)"
                        : "");
    if (r->kind == SLUICE_CURL_PROVIDER_TIMEOUT && r->http_status == 0)
        return fail("%s did not answer within %g s (--request-timeout)", p->url,
                    p->o->request_timeout_s);
    if (pf.status != SLUICE_OK)
        return fail("the first request failed: %s", sluice_strerror(pf.status));
    switch (r->kind) {
    case SLUICE_CURL_CLIENT_ERROR:
        return fail("%s answered HTTP %ld to the first request: fix the URL, --method, "
                    "--header or --body",
                    p->url, r->http_status);
    case SLUICE_CURL_SERVER_ERROR:
        return fail("%s answered HTTP %ld to the first request: the endpoint is failing, "
                    "not full",
                    p->url, r->http_status);
    case SLUICE_CURL_UNEXPECTED:
        return fail("%s answered HTTP %ld (a redirect? give the final URL)", p->url,
                    r->http_status);
    default:
        return EXIT_OK; /* success, or an overload: both are what probing is about */
    }
}

static double probe_elapsed(const struct probe *p)
{
    return (double)(sluice_monotonic_ns() - p->t0_ns) / 1e9;
}

static long probe_requests(const struct probe *p);

static void probe_progress(struct probe *p, bool tty, bool final)
{
    char line[SLUICE_NODE_ID_MAX + 64];
    sluice_engine_status_line(p->engine, p->node, line, sizeof line);
    char msg[512];
    snprintf(msg, sizeof msg, "%s  · %ld requests, %ld ok, %ld overloaded, %ld failed · %.1f s",
             line, probe_requests(p), atomic_load(&p->ok), atomic_load(&p->overloaded),
             atomic_load(&p->failed), probe_elapsed(p));
    if (tty)
        fprintf(stderr, "\r\033[K%s%s", msg, final ? "\n" : "");
    else
        fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

/* Why the probe should stop now, or NULL to go on. */
static const char *probe_should_stop(struct probe *p)
{
    struct sluice_discovery_status st;
    sluice_engine_status(p->engine, p->node, &st);
    if (st.state == SLUICE_DISCOVERY_LOCKED)
        return "locked";
    if (interrupted)
        return "interrupted";
    if (probe_elapsed(p) >= p->o->timeout_s)
        return "time limit (--timeout)";
    if (atomic_load(&p->live_workers) == 0)
        return atomic_load(&p->started) >= p->o->requests ? "request budget (--requests)"
                                                          : "workers stopped";
    long done = probe_requests(p);
    if (done >= 20 && atomic_load(&p->failed) * 2 > done)
        return "most requests fail";
    return NULL;
}

static long probe_requests(const struct probe *p)
{
    return atomic_load(&p->ok) + atomic_load(&p->overloaded) + atomic_load(&p->failed);
}

static void probe_timeline(struct probe *p)
{
    printf("event timeline (%s, %zu events):\n", p->node, p->n_events);
    int64_t t0 = p->n_events ? p->events[0].t_ns : 0;
    for (size_t i = 0; i < p->n_events; i++) {
        const struct sluice_event *e = &p->events[i];
        char when[32], limits[48];
        snprintf(when, sizeof when, "+%.2fs", (double)(e->t_ns - t0) / 1e9);
        if (e->old_limit != e->new_limit)
            snprintf(limits, sizeof limits, "%" PRIu32 " → %" PRIu32, e->old_limit, e->new_limit);
        else
            snprintf(limits, sizeof limits, "%" PRIu32, e->new_limit);
        printf("  %9s  ", when);
        print_cell(sluice_event_kind_name(e->kind), 10);
        print_cell(limits, 11);
        print_cell(sluice_cause_name(e->cause), TOOL_CAUSE_COLUMN);
        printf("in flight %" PRIu32, e->in_flight);
        if (e->ceiling)
            printf(", ceiling %" PRIu32, e->ceiling);
        putchar('\n');
    }
    tool_print_causes(p->events, p->n_events, "", 80);
}

/* The probe's store, used only with --save: it never restores an old lock (a probe
 * always measures afresh) and forwards the lock it finds to the state file. */
static int probe_store_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    (void)ctx;
    (void)node;
    memset(out, 0, sizeof *out);
    return SLUICE_OK;
}

static int probe_store_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    struct probe *p = ctx;
    int status = sluice_statefile_save(p->state, node, rec);
    pthread_mutex_lock(&p->mu);
    p->saved_once = true;
    p->save_status = status;
    if (status != SLUICE_OK)
        sluice_statefile_last_error(p->state, p->save_error, sizeof p->save_error);
    pthread_mutex_unlock(&p->mu);
    return status;
}

static int probe_store_clear(void *ctx, const char *node)
{
    (void)ctx;
    (void)node;
    return SLUICE_OK;
}

static int probe_read_body(struct probe *p, const char *file)
{
    FILE *fp = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!fp)
        return fail("cannot read --body %s: %s", file, strerror(errno));
    size_t cap = 4096;
    p->body = malloc(cap);
    for (size_t n; p->body && (n = fread(p->body + p->body_len, 1, cap - p->body_len, fp)) > 0;) {
        p->body_len += n;
        if (p->body_len == cap) {
            if (cap >= (16u << 20))
                break;
            cap *= 2;
            char *b = realloc(p->body, cap);
            if (!b) {
                free(p->body);
                p->body = NULL;
            }
            p->body = b;
        }
    }
    bool bad = !p->body || ferror(fp) || p->body_len >= (16u << 20);
    if (fp != stdin)
        fclose(fp);
    if (bad)
        return fail("--body %s is unreadable or over 16 MiB", file);
    return EXIT_OK;
}

static int probe_report(struct probe *p, const char *why)
{
    struct sluice_discovery_status st;
    sluice_engine_status(p->engine, p->node, &st);
    bool locked = st.state == SLUICE_DISCOVERY_LOCKED;
    uint32_t found = locked ? st.ceiling : st.limit;
    int rc = locked ? EXIT_OK : EXIT_FAIL;
    if (!locked)
        fprintf(stderr, "%s: stopped before a ceiling locked (%s%s%s); %u is the limit it "
                        "had reached\n",
                tool_name, why, p->last_failure[0] ? "; last failure: " : "", p->last_failure,
                found);
    if (p->state) {
        /* The lock's save runs after the window that locked it: wait for it to land. */
        sluice_discovery_sync(sluice_pool_discovery(sluice_engine_pool(p->engine, p->node)));
        pthread_mutex_lock(&p->mu);
        bool tried = p->saved_once;
        int saved = p->save_status;
        pthread_mutex_unlock(&p->mu);
        if (!locked)
            fprintf(stderr, "not saved: %s has no lock to persist\n", p->node);
        else if (tried && saved == SLUICE_OK)
            fprintf(stderr, "saved %s: ceiling %u in %s\n", p->node, found,
                    sluice_statefile_path(p->state));
        else
            rc = fail("not saved: %s", tried ? p->save_error
                                             : "the lock was never handed to the state file");
    }
    if (p->o->json) {
        json_t *events = json_array();
        for (size_t i = 0; i < p->n_events; i++) {
            char line[SLUICE_EVENT_JSON_MAX];
            if (sluice_event_format_json(&p->events[i], line, sizeof line) < sizeof line)
                json_array_append_new(events, json_loads(line, 0, NULL));
        }
        json_t *root = json_pack(
            "{s:s,s:s,s:b,s:i,s:s,s:I,s:I,s:I,s:I,s:f,s:o}", "url", p->url, "node", p->node,
            "locked", locked, "discovered_ceiling", (int)found, "stopped", why, "requests",
            (json_int_t)probe_requests(p), "ok", (json_int_t)atomic_load(&p->ok),
            "overloaded", (json_int_t)atomic_load(&p->overloaded), "failed",
            (json_int_t)atomic_load(&p->failed), "seconds", probe_elapsed(p), "events", events);
        print_json(root);
        json_decref(root);
        return rc;
    }
    printf("probe of %s: %ld requests in %.1f s (%ld ok, %ld overloaded, %ld failed); stopped: %s\n",
           p->url, probe_requests(p), probe_elapsed(p), atomic_load(&p->ok),
           atomic_load(&p->overloaded), atomic_load(&p->failed), why);
    probe_timeline(p);
    printf("discovered ceiling: %u\n", found);
    return rc;
}

/* What the probe needs before its first request: the body, the headers, the
 * state file for --save and an engine of one adaptive backend. */
static int probe_setup(struct probe *p)
{
    const struct opts *o = p->o;
    int rc = EXIT_OK;
    const char *ca_problem = o->cacert ? tool_ca_file_problem(o->cacert) : NULL;
    if (ca_problem)
        return usage_error("--cacert %s: %s", o->cacert, ca_problem);
    if (o->body_file)
        rc = probe_read_body(p, o->body_file);
    p->method = o->method ? o->method : p->body ? "POST" : "GET";
    for (int i = 0; i < o->n_headers; i++)
        p->headers = curl_slist_append(p->headers, o->headers[i]);
    if (rc == EXIT_OK && o->save)
        rc = open_state(o, "--save", &p->state);

    struct sluice_store_ops store = {.load = probe_store_load, .save = probe_store_save,
                                     .clear = probe_store_clear, .ctx = p};
    struct sluice_discovery_desc disc;
    memset(&disc, 0, sizeof disc);
    struct sluice_backend_desc backend = {.id = p->node, .active = (uint32_t)o->concurrency_max,
                                          .waiting = SLUICE_SOME(o->concurrency_max),
                                          .discovery = &disc};
    char err[256];
    if (rc == EXIT_OK &&
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &backend, .n_backends = 1,
                                                          .store = p->state ? &store : NULL,
                                                          .on_event = probe_on_event,
                                                          .on_event_ctx = p, .error = err,
                                                          .error_size = sizeof err},
                             &p->engine) != SLUICE_OK)
        rc = fail("%s", err);
    return rc;
}

/* --concurrency-max workers, watched from this thread until probe_should_stop
 * says why; then they stop and the report goes out. */
static int probe_drive(struct probe *p, bool tty)
{
    const struct opts *o = p->o;
    pthread_t *tids = calloc((size_t)o->concurrency_max, sizeof *tids);
    long workers = 0;
    /* Workers ignore SIGINT: the main thread sees it and stops them. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    atomic_store(&p->live_workers, o->concurrency_max);
    for (; workers < o->concurrency_max; workers++)
        if (pthread_create(&tids[workers], NULL, probe_worker, p) != 0)
            break;
    atomic_fetch_sub(&p->live_workers, o->concurrency_max - workers);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    const char *why;
    int tick = 0;
    while (!(why = probe_should_stop(p))) {
        struct timespec ms100 = {0, 100 * 1000 * 1000};
        nanosleep(&ms100, NULL);
        if (tty || ++tick % 10 == 0)
            probe_progress(p, tty, false);
    }
    atomic_store(&p->stop, true);
    sluice_cancel_fire(&p->cancel); /* queued calls leave, transfers abort */
    for (long i = 0; i < workers; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    sluice_engine_sync(p->engine, p->node);
    probe_progress(p, tty, true);
    return probe_report(p, why);
}

static void probe_free(struct probe *p)
{
    if (p->engine) {
        sluice_engine_close(p->engine);
        sluice_engine_destroy(p->engine);
    }
    sluice_statefile_close(p->state);
    curl_slist_free_all(p->headers);
    free(p->body);
    free(p->events);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static int probe_run(const struct opts *o, const char *url)
{
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return usage_error("probe URL must start with http:// or https:// (got '%s')", url);
    struct probe *p = calloc(1, sizeof *p);
    p->o = o;
    p->url = url;
    p->node = o->save ? o->save : "probe";
    pthread_mutex_init(&p->mu, NULL);
    sluice_cancel_init(&p->cancel);
    p->events = calloc(PROBE_EVENTS_MAX, sizeof *p->events);
    int rc = probe_setup(p);
    bool tty = isatty(STDERR_FILENO);
    p->t0_ns = sluice_monotonic_ns();
    bool stopped = false;
    if (rc == EXIT_OK)
        rc = probe_preflight(p, &stopped);
    if (rc == EXIT_OK && stopped) {
        probe_progress(p, tty, true);
        rc = probe_report(p, "interrupted");
    } else if (rc == EXIT_OK) {
        rc = probe_drive(p, tty);
    }
    probe_free(p);
    return rc;
}

int probe_cmd(const struct opts *o)
{
    if (o->n_pos != 1)
        return usage_error("probe needs a URL, e.g. sluicectl probe https://api.example/v1/chat/completions");
    return probe_run(o, o->pos[0]);
}
