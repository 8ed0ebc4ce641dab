/*
 * The Concurrency Health page in a real browser: an engine with live
 * traffic to the provider simulator and the admin endpoint, loaded by
 * headless Chromium. The rendered DOM must show every node's status line
 * with its glyph (inline SVG: no emoji font needed), the event feed rendered from the live feed, a Clear
 * button per adaptive node only, and the page polling ("live"). Skipped,
 * saying so, where Debian's chromium package is missing.
 *
 * SLUICE_ADMIN_SCREENSHOT=/path/page.png also saves a screenshot after a
 * longer run (about 25 s of traffic, so the chart has a climb to show):
 * that is how docs/admin-page.png is made.
 */
#include <pthread.h>
#include <regex.h>

#include <sluice/curl.h>

#include "e2e/curl_fixture.h"
#include "admin_fixture.h"
#include "sluice-provider-sim/sim_process.h"

#ifndef cr_skip_test /* the TSan build's Criterion stand-in has none */
#define cr_skip_test(...) return (void)fprintf(stderr, __VA_ARGS__)
#endif

static struct sim_process sim;
static struct sluice_memstore *mem;
static struct sluice_engine *engine;
static struct sluice_admin *admin;
static _Atomic(bool) stop_traffic;
static char url_chat[128];

enum { WORKERS = 40 };
static pthread_t workers[WORKERS];
static int n_workers;

static void *traffic(void *arg)
{
    (void)arg;
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url_chat);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, reply_body);
    struct reply sink = {0};
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    while (!atomic_load(&stop_traffic)) {
        struct timespec dl;
        int status = sluice_curl_perform(engine, "cloud:default_ollama", easy,
                                         sluice_deadline_in(&dl, 2 * SLUICE_NS_PER_SEC), NULL,
                                         NULL);
        /* A call refused at once (the queue's deadline rule: 40 callers, a cap of 24) is
         * retried after a pause, as a client would: a retry at once spins, and took the
         * cores Chromium needed (a 3 s page load took 18). */
        if (status != SLUICE_OK)
            usleep(50 * 1000);
        free(sink.body);
        sink.body = NULL;
        sink.len = 0;
    }
    curl_easy_cleanup(easy);
    return NULL;
}

__attribute__((unused)) static void stop_everything(void)
{
    atomic_store(&stop_traffic, true);
    for (int i = 0; i < n_workers; i++)
        pthread_join(workers[i], NULL);
    n_workers = 0;
    sluice_admin_stop(admin);
    admin = NULL;
    if (engine) {
        sluice_engine_close(engine);
        sluice_engine_destroy(engine);
        engine = NULL;
    }
    sluice_memstore_destroy(mem);
    mem = NULL;
    sim_process_stop(&sim);
}

/* Per-test options rather than TestSuite: the TSan build's Criterion stand-in
 * (tests/tsan/) has no TestSuite. */
#define PAGE_TEST(name) Test(admin_page, name, .fini = stop_everything, .timeout = 90)

static const char *chromium(void)
{
    static const char *const candidates[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser",
                                             "/usr/bin/google-chrome"};
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++)
        if (access(candidates[i], X_OK) == 0)
            return candidates[i];
    return NULL;
}

/* Load `url` in headless Chromium with the profile `user_dir` ("--user-data-dir=..."),
 * letting the page run 5 s of virtual time, and `output` it: "--dump-dom" (the DOM on
 * stdout) or "--screenshot=PATH", in a window of `window` ("--window-size=W,H"). */
static struct proc_result *browse(const char *browser, const char *user_dir, const char *url,
                                  const char *output, const char *window)
{
    const char *argv[] = {browser,           "--headless",     "--no-sandbox",
                          "--disable-gpu",   "--no-first-run", user_dir,
                          "--hide-scrollbars", "--virtual-time-budget=5000", window,
                          output,            url,              NULL};
    const char *env[] = {"HOME=/tmp", NULL};
    return proc_run(argv, env, 60000);
}

/* The admin of `engine` on a free port; its base URL (no trailing slash) into `base`. */
static void serve(char *base, size_t size)
{
    char err[256];
    cr_assert_eq(sluice_admin_start(&(struct sluice_admin_desc){.engine = engine,
                                                                .port = SLUICE_SOME(0),
                                                                .error = err,
                                                                .error_size = sizeof err},
                                    &admin),
                 SLUICE_OK, "%s", err);
    snprintf(base, size, "http://127.0.0.1:%u", sluice_admin_port(admin));
}

/* Every kind of node: live traffic, a restored lock, a backoff, a cleared one, a fixed limit. */
static void start_world(char *url_base, size_t size)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    cr_assert_eq(sluice_memstore_create(8, NULL, &mem), SLUICE_OK);
    struct sluice_store_ops ops = sluice_memstore_ops(mem);
    struct sluice_lock_record rec = fixture_lock(32, 20 * 3600);
    cr_assert_eq(ops.save(ops.ctx, "cloud:together", &rec), SLUICE_OK);
    cr_assert_eq(ops.save(ops.ctx, "cloud:groq", &rec), SLUICE_OK);
    static const struct sluice_discovery_desc adaptive = {0};
    const struct sluice_backend_desc backends[] = {
        {.id = "cloud:default_ollama", .active = 64, .discovery = &adaptive},
        {.id = "cloud:together", .active = 64, .discovery = &adaptive},
        {.id = "cloud:openrouter-byok", .active = 64, .discovery = &adaptive},
        {.id = "cloud:groq", .active = 64, .discovery = &adaptive},
        {.id = "local:gpu", .active = 4},
    };
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = backends,
                                                                   .n_backends = 5, .store = &ops,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &engine),
                 SLUICE_OK, "%s", err);
    fixture_backoff(engine, "cloud:openrouter-byok");
    sluice_engine_clear(engine, "cloud:groq"); /* restored, then cleared: probing again */
    serve(url_base, size);
    strncat(url_base, "/", size - strlen(url_base) - 1); /* the page */
    for (; n_workers < WORKERS; n_workers++)
        pthread_create(&workers[n_workers], NULL, traffic, NULL);
}

/* Seconds until node has at least `events` events (bounded by `limit_s`). */
static void wait_events(const char *node, uint64_t events, int limit_s)
{
    for (int i = 0; i < limit_s * 20; i++) {
        if (sluice_event_ring_count(sluice_engine_events(engine, node)) >= events)
            return;
        usleep(50 * 1000);
    }
    cr_assert_fail("%s had fewer than %llu events after %d s", node, (unsigned long long)events,
                   limit_s);
}

static bool matches(const char *text, const char *pattern)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0, "bad pattern %s", pattern);
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* The DOM of one node's card (from its <section> to the next). */
static char *card(const char *dom, const char *node)
{
    char open[160];
    snprintf(open, sizeof open, "<section class=\"node\" data-node=\"%s\">", node);
    const char *start = strstr(dom, open);
    cr_assert_not_null(start, "no card for %s", node);
    const char *end = strstr(start + 1, "<section ");
    size_t n = end ? (size_t)(end - start) : strlen(start);
    char *c = malloc(n + 1);
    memcpy(c, start, n);
    c[n] = '\0';
    return c;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

PAGE_TEST(chromium_renders_status_lines_glyphs_events_and_clear_buttons)
{
    const char *browser = chromium();
    if (!browser)
        cr_skip_test("chromium not found (install Debian's chromium package): the Concurrency "
                     "Health page was not tested in a browser");
    const struct fx_provider provider = {.mode = "reject", .cap = 24, .median_ms = 150};
    cr_assert_eq(fx_sim_start(&sim, &provider), 0);
    sim_process_url(&sim, "/v1/chat/completions", url_chat, sizeof url_chat);
    char base[64];
    start_world(base, sizeof base);
    wait_events("cloud:default_ollama", 2, 20); /* the climb has begun */

    const char *screenshot = getenv("SLUICE_ADMIN_SCREENSHOT");
    if (screenshot && *screenshot)
        sleep(25); /* a longer history for the chart */

    char profile[256];
    fixture_tmpdir(profile, sizeof profile);
    char user_dir[300];
    snprintf(user_dir, sizeof user_dir, "--user-data-dir=%s", profile);
    struct proc_result *r = browse(browser, user_dir, base, "--dump-dom", "--window-size=1440,1120");
    cr_assert_eq(r->exit_code, 0, "chromium failed (exit %d): %.2000s", r->exit_code, r->err);
    const char *dom = r->out;
    cr_assert(strstr(dom, "Concurrency Health") != NULL, "no page: %.500s", dom);

    /* Status lines as the reference writes them, the glyph drawn as inline SVG: a stock
     * Debian Chromium has no emoji font, and no glyph may depend on one. */
#define GLYPH_SVG(state) "<svg class=\"glyph g-" state "\" viewBox=\"0 0 16 16\""
    cr_expect(matches(dom, "<span class=\"line\">cloud:default_ollama [0-9]+/[0-9]+ "
                           "<svg class=\"glyph g-(probing|locked|backoff)\""),
              "live node's status line missing");
    cr_expect(strstr(dom, "<span class=\"line\">cloud:together 0/32 " GLYPH_SVG("locked")) != NULL);
    cr_expect(strstr(dom, "<span class=\"line\">cloud:openrouter-byok 0/1 " GLYPH_SVG("backoff")) != NULL);
    cr_expect(strstr(dom, "<span class=\"line\">cloud:groq 0/5 " GLYPH_SVG("probing")) != NULL);
    cr_expect(strstr(dom, "<span class=\"line\">local:gpu 0/4</span>") != NULL);
    const char *body = strstr(dom, "<body");
    cr_assert_not_null(body);
    cr_expect(!strstr(body, "📈") && !strstr(body, "🔒") && !strstr(body, "🌧"),
              "an emoji is left for a font to draw: %.3000s", strstr(dom, "<footer"));
    cr_expect_eq(count(strstr(dom, "<footer"), "<svg class=\"glyph g-"), 3, "the footer's key");

    /* The event feed, rendered from the live feed, newest first. */
    char *live = card(dom, "cloud:default_ollama");
    cr_expect(strstr(live, "<li class=\"ev ev-probe\"") != NULL, "no probe event: %.2000s", live);
    cr_expect(strstr(live, "slow start") != NULL, "the cause is shown");
    cr_expect(strstr(live, "<span title=\"every permit in use and no congestion yet: the limit "
                           "doubles\">· slow start") != NULL,
              "what the cause says, on hover: %.2000s", live);
    const char *first = strstr(live, "data-seq=\"");
    cr_assert_not_null(first);
    unsigned long newest = strtoul(first + 10, NULL, 10);
    cr_expect_geq(newest, 2, "newest first");
    char *locked = card(dom, "cloud:together");
    cr_expect(strstr(locked, "<li class=\"ev ev-restore\"") != NULL, "restore event: %s", locked);
    cr_expect(strstr(locked, "lock expires in") != NULL);
    cr_expect(matches(locked, "<path class=\"limit\""), "the chart drew the limit");

    /* The deadline figures: rates, queue wait percentiles, lingering; clears marked. */
    cr_expect(matches(live, "data-k=\"request_rate\">[0-9]+\\.[0-9]/s<"), "request rate: %.3000s", live);
    cr_expect(!matches(live, "data-k=\"request_rate\">0\\.0/s<"), "live traffic shows a rate");
    cr_expect(matches(live, "data-k=\"overload_rate\">[0-9]+\\.[0-9]/s<"), "429 rate");
    cr_expect(matches(live, "data-k=\"timeout_rate\">[0-9]+\\.[0-9]/s<"), "timeout rate");
    cr_expect(matches(live, "data-k=\"queue_wait_p50\">([0-9.]+ ms|–)<"), "queue wait p50");
    cr_expect(matches(live, "data-k=\"queue_wait_p99\">([0-9.]+ ms|–)<"), "queue wait p99");
    cr_expect(matches(live, "data-k=\"lingering\">[0-9]+<"), "lingering calls");
    cr_expect(matches(live, "data-k=\"refused_capacity\">[0-9]+<"), "calls refused for no slot");
    cr_expect(matches(live, "data-k=\"refused_early\">[0-9]+<"), "calls refused at admission");
    cr_expect(matches(live, "data-k=\"linger\">(learned|on|off)( \\(learned\\))?<"),
              "the linger mode in force");
    char *groq = card(dom, "cloud:groq");
    cr_expect(strstr(groq, "class=\"clear-mark\"") != NULL, "the clear is marked on the chart: %.3000s",
              groq);
    cr_expect(strstr(live, "class=\"clear-mark\"") == NULL, "no clear on the live node");
    free(groq);

    /* Clear buttons on adaptive nodes only; the page is polling. */
    char *cleared = card(dom, "cloud:groq");
    cr_expect(strstr(cleared, "<li class=\"ev ev-clear\"") != NULL, "clear event: %s", cleared);
    free(cleared);
    cr_expect_eq(count(dom, "<button class=\"clear\">"), 4, "four adaptive nodes");
    char *fixed = card(dom, "local:gpu");
    cr_expect(strstr(fixed, "<button") == NULL, "a fixed node has no Clear button");
    cr_expect(matches(dom, "<span id=\"conn\" class=\"live\">live · updated [0-9:]+</span>"),
              "the page did not poll");
    free(live);
    free(locked);
    free(fixed);
    free(r);

    if (screenshot && *screenshot) {
        char shot[512];
        snprintf(shot, sizeof shot, "--screenshot=%s", screenshot);
        r = browse(browser, user_dir, base, shot, "--window-size=1440,1120");
        cr_expect_eq(r->exit_code, 0, "screenshot: %.1000s", r->err);
        struct stat st;
        cr_expect(stat(screenshot, &st) == 0 && st.st_size > 10000, "no screenshot at %s",
                  screenshot);
        fprintf(stderr, "admin page screenshot: %s\n", screenshot);
        free(r);
    }
    fixture_rmtree(profile);
}

/* ---- the chart: the ceiling from the lock on, and waiting over time ---------------- */

static _Atomic(int64_t) fake_mono_ns = 1000 * SLUICE_NS_PER_SEC;

static int64_t fake_mono(void *ctx)
{
    (void)ctx;
    return atomic_load(&fake_mono_ns);
}

/* A blocking call on local:q's full pool: it waits (the node's "waiting") until the
 * test ends the call that holds the permit. */
static void *queued_call(void *arg)
{
    struct sluice_pool *p = arg;
    struct sluice_call call;
    if (sluice_pool_call_begin(p, NULL, NULL, &call) == SLUICE_OK)
        sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    return NULL;
}

/* Windows of healthy, saturated calls in the engine's (fake) discovery time until the
 * node locks at its max_limit. */
static void lock_by_traffic(struct sluice_discovery *d)
{
    for (int w = 0; w < 12 && sluice_discovery_state(d) != SLUICE_DISCOVERY_LOCKED; w++) {
        uint32_t limit = sluice_discovery_limit(d);
        atomic_fetch_add(&fake_mono_ns, SLUICE_NS_PER_SEC);
        for (int i = 0; i < 16; i++)
            sluice_discovery_on_sample(
                d, &(struct sluice_sample){.latency_ns = SLUICE_NS_PER_SEC,
                                           .in_flight_at_start = limit,
                                           .outcome = SLUICE_OUTCOME_OK});
        atomic_fetch_add(&fake_mono_ns, 60 * SLUICE_NS_PER_SEC);
        sluice_discovery_poll(d);
    }
    sluice_discovery_sync(d);
    cr_assert_eq(sluice_discovery_state(d), SLUICE_DISCOVERY_LOCKED, "the node did not lock");
}

/* The first x of the chart path of `cls` in `card_dom` ("<path class=CLS d="Mx,y ..."), or
 * -1 when there is none. */
static double path_start_x(const char *card_dom, const char *cls)
{
    char open[64];
    snprintf(open, sizeof open, "<path class=\"%s\" d=\"M", cls);
    const char *at = strstr(card_dom, open);
    return at ? strtod(at + strlen(open), NULL) : -1;
}

/*
 * A node that probed for a few seconds and then locked: the history says when (each
 * sample carries the ceiling then, 0 before the lock) and the page draws the ceiling
 * only from the lock on (before the fix: one line across the whole chart, the minutes
 * before the lock included). A fixed node with three calls queued for its one permit: the
 * history carries the waiting count and the page plots it (before the fix: only the
 * live figure, no line). Checked by eye too: SLUICE_ADMIN_SCREENSHOT saves the page.
 */
PAGE_TEST(the_chart_draws_the_ceiling_from_the_lock_on_and_plots_waiting)
{
    static const struct sluice_discovery_desc adaptive = {.jumpstart = 2, .max_limit = 8,
                                                          .lock_ttl_s = 86400};
    const struct sluice_backend_desc backends[] = {
        {.id = "cloud:x", .active = 8, .discovery = &adaptive},
        {.id = "local:q", .active = 1},
    };
    const struct sluice_clock clock = {fake_mono, NULL};
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = backends,
                                                                   .n_backends = 2,
                                                                   .clock = &clock, .error = err,
                                                                   .error_size = sizeof err},
                                      &engine),
                 SLUICE_OK, "%s", err);
    char base[64];
    serve(base, sizeof base);
    usleep(2500 * 1000); /* samples while probing, nothing waiting */

    lock_by_traffic(sluice_pool_discovery(sluice_engine_pool(engine, "cloud:x")));
    struct sluice_pool *q = sluice_engine_pool(engine, "local:q");
    struct sluice_call holder;
    cr_assert_eq(sluice_pool_call_begin(q, NULL, NULL, &holder), SLUICE_OK);
    enum { WAITERS = 3 };
    pthread_t waiter[WAITERS];
    for (int i = 0; i < WAITERS; i++)
        pthread_create(&waiter[i], NULL, queued_call, q);
    usleep(2500 * 1000); /* samples while locked, three calls waiting */

    struct reply r = http("GET", base, "/compute/concurrency/history", NULL, NULL);
    cr_assert_eq(r.status, 200);
    json_t *h = json_loads(r.body, 0, NULL);
    cr_assert_not_null(h, "%s", r.body);
    json_t *xs = json_object_get(json_object_get(h, "nodes"), "cloud:x");
    json_t *qs = json_object_get(json_object_get(h, "nodes"), "local:q");
    cr_assert_geq(json_array_size(xs), 4, "%s", r.body);
    cr_expect_eq(json_integer_value(json_array_get(json_array_get(xs, 0), 3)), 0,
                 "no ceiling before the lock: %s", r.body);
    cr_expect_eq(json_integer_value(json_array_get(json_array_get(xs, json_array_size(xs) - 1), 3)),
                 8, "the ceiling once locked: %s", r.body);
    cr_expect_eq(json_integer_value(json_array_get(json_array_get(qs, 0), 4)), 0, "%s", r.body);
    cr_expect_eq(json_integer_value(json_array_get(json_array_get(qs, json_array_size(qs) - 1), 4)),
                 WAITERS, "the waiting calls: %s", r.body);
    json_decref(h);
    reply_free(&r);

    const char *browser = chromium();
    if (browser) {
        char profile[256], user_dir[300];
        fixture_tmpdir(profile, sizeof profile);
        snprintf(user_dir, sizeof user_dir, "--user-data-dir=%s", profile);
        char page[80];
        snprintf(page, sizeof page, "%s/", base);
        struct proc_result *p = browse(browser, user_dir, page, "--dump-dom", "--window-size=1200,900");
        cr_assert_eq(p->exit_code, 0, "chromium failed (exit %d): %.2000s", p->exit_code, p->err);
        char *x = card(p->out, "cloud:x"), *qc = card(p->out, "local:q");
        double limit_x = path_start_x(x, "limit"), ceiling_x = path_start_x(x, "ceiling");
        cr_expect_gt(limit_x, 0, "the limit is drawn: %.3000s", x);
        cr_expect_gt(ceiling_x, limit_x + 1,
                     "the ceiling starts at the lock, after the chart's first sample (limit "
                     "from x=%.1f, ceiling from x=%.1f): %.3000s",
                     limit_x, ceiling_x, x);
        cr_expect(strstr(qc, "<path class=\"waiting\" d=\"M") != NULL, "waiting is plotted: %.3000s",
                  qc);
        cr_expect(strstr(p->out, "</i>waiting</span>") != NULL, "the legend names it");
        free(x);
        free(qc);
        free(p);
        const char *screenshot = getenv("SLUICE_ADMIN_SCREENSHOT");
        if (screenshot && *screenshot) {
            char shot[512];
            snprintf(shot, sizeof shot, "--screenshot=%s", screenshot);
            free(browse(browser, user_dir, page, shot, "--window-size=1200,900"));
        }
        fixture_rmtree(profile);
    } else {
        fprintf(stderr, "chromium not found: the chart was checked through the history only\n");
    }
    sluice_pool_call_end(q, &holder, SLUICE_OUTCOME_OK, 0);
    for (int i = 0; i < WAITERS; i++)
        pthread_join(waiter[i], NULL);
}
