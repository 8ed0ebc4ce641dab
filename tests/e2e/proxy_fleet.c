/*
 * Two sluice-proxy processes naming one Redis (--redis) share one cap: the
 * provider's own in-flight counter never passes the fleet's limit, where
 * two proxies alone would each run their own jumpstart (5 + 5 > 8). A proxy
 * whose Redis does not answer says so (stderr, its node's events) and says
 * so again when it comes back; a --redis that is not a Redis address stops
 * it at start.
 */
#include "e2e/redis_fixture.h"
#include "proxy_fixture.h"

#define MAX 8       /* --active: the most the fleet's shared limit may reach */
#define CLIENTS 32  /* per proxy */
#define RUN_MS 3000

static struct px px_b;

static void setup(void)
{
    fx_setup();
    rfx_start();
}

static void teardown(void)
{
    px_stop(&px_main);
    px_stop(&px_b);
    rfx_teardown();
}

Test(proxy_fleet, two_proxies_sharing_one_redis_respect_one_cap, .init = setup, .fini = teardown,
     .timeout = 30)
{
    /* A provider that never refuses: only the fleet keeps the calls down. */
    fx_start(&(struct fx_provider){.mode = "queue", .cap = 100, .median_ms = 40,
                                   .fixed_latency = true});
    char upstream[64], redis[64], active[8];
    snprintf(upstream, sizeof upstream, "http://127.0.0.1:%d", fx_sim.port);
    rfx_url(redis, sizeof redis);
    snprintf(active, sizeof active, "%d", MAX);
    const char *args[] = {"--upstream", upstream, "--node", RFX_NODE, "--redis", redis,
                          "--active", active, "--state", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
    cr_assert_eq(px_start(&px_b, args), 0);
    static struct px_reply replies[2 * CLIENTS];
    CURL *e[2 * CLIENTS];
    CURLM *m = curl_multi_init();
    for (int i = 0; i < 2 * CLIENTS; i++) {
        e[i] = px_easy(i < CLIENTS ? &px_main : &px_b, "/v1/chat/completions", FX_REQUEST, NULL,
                       &replies[i]);
        curl_multi_add_handle(m, e[i]);
    }
    long served[2] = {0, 0}, other = 0;
    for (int64_t end = fx_now_ms() + RUN_MS; fx_now_ms() < end;) {
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            CURL *done = msg->easy_handle;
            long status = 0;
            curl_easy_getinfo(done, CURLINFO_RESPONSE_CODE, &status);
            for (int i = 0; i < 2 * CLIENTS; i++)
                if (e[i] == done) {
                    if (status == 200)
                        served[i >= CLIENTS]++;
                    else
                        other++;
                }
            curl_multi_remove_handle(m, done);
            curl_multi_add_handle(m, done); /* again, at once */
        }
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    for (int i = 0; i < 2 * CLIENTS; i++) {
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
    }
    curl_multi_cleanup(m);
    struct fx_stats s = fx_stats();
    cr_assert_gt(served[0], 0, "the first proxy served nothing");
    cr_assert_gt(served[1], 0, "the second proxy served nothing");
    cr_assert_eq(other, 0, "every call waits for the fleet's permit; none is refused");
    cr_assert_leq(s.peak_in_flight, MAX, "the provider saw %ld calls at once: the cap was not shared",
                  s.peak_in_flight);
}

/* ---- Redis unreachable ------------------------------------------------------------------- */

static void setup_without_redis(void)
{
    px_dir_setup("fleet");
    rfx.port = rfx_free_port(); /* nobody listens there until the test starts Redis */
}

static void teardown_without_redis(void)
{
    px_dir_remove();
    rfx_teardown();
}

/* px_start with the proxy's stderr in the file `log` (the child inherits the test's fd 2). */
static int px_start_logged(struct px *p, const char *const *args, const char *log)
{
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(saved >= 0 && fd >= 0);
    dup2(fd, STDERR_FILENO);
    close(fd);
    int rc = px_start(p, args);
    dup2(saved, STDERR_FILENO);
    close(saved);
    return rc;
}

/* The line of file `path` that holds `want` (in `line`), or false. */
static bool log_line(const char *path, const char *want, char *line, size_t size)
{
    FILE *f = fopen(path, "r");
    bool found = false;
    while (f && !found && fgets(line, (int)size, f))
        found = strstr(line, want) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* How many of the node's events on the admin endpoint (JSON Lines) are `kind` with `reason`. */
static int node_events(const char *kind, const char *reason)
{
    char body[32768], path[128], want[96];
    snprintf(path, sizeof path, "/compute/concurrency/events?node_id=%s", RFX_NODE);
    px_admin_get(&px_main, path, body, sizeof body);
    snprintf(want, sizeof want, "\"event\":\"%s\",\"reason\":\"%s\"", kind, reason);
    int n = 0;
    for (const char *at = body; (at = strstr(at, want)); at++)
        n++;
    return n;
}

Test(proxy_fleet, a_proxy_that_cannot_reach_redis_says_so_and_again_when_it_is_back,
     .init = setup_without_redis, .fini = teardown_without_redis, .timeout = 300)
{
    char redis[64], log[128], line[1024];
    rfx_url(redis, sizeof redis);
    snprintf(log, sizeof log, "%s/proxy.err", px_dir);
    const char *args[] = {"--upstream", "http://127.0.0.1:9", "--node", RFX_NODE, "--redis",
                          redis, "--state", "off", NULL};
    cr_assert_eq(px_start_logged(&px_main, args, log), 0);

    /* The documented fallback event, where the admin page, /metrics and sluicectl read. */
    cr_assert(RFX_WAIT_UNTIL(node_events("store", "store_error") == 1, RFX_PATIENCE_MS),
              "no store_error event on the node's feed");
    cr_assert(RFX_WAIT_UNTIL(log_line(log, "Connection refused", line, sizeof line),
                             RFX_PATIENCE_MS),
              "stderr does not say Redis is unreachable");
    cr_expect(strstr(line, redis) && strstr(line, "backend " RFX_NODE),
              "the line names neither the URL nor the backend: %s", line);
    /* Before any word from Redis the fleet's floor (1) holds, and the line says why. */
    cr_expect(strstr(line, "at most 1 call at once (the fleet's floor"), "%s", line);
    cr_expect_eq(px_node_count(&px_main, RFX_NODE, "limit"), 1);

    rfx_launch(); /* on the port the proxy names */
    cr_assert(RFX_WAIT_UNTIL(node_events("restore", "store") == 1, RFX_PATIENCE_MS),
              "no restore event once Redis answers");
    cr_assert(RFX_WAIT_UNTIL(log_line(log, "connected again", line, sizeof line),
                             RFX_PATIENCE_MS),
              "stderr does not say Redis is back");
    cr_expect(strstr(line, redis) != NULL, "%s", line);
    cr_expect_eq(node_events("store", "store_error"), 1, "one event per outage, not per retry");
}

/* --fleet-floor: what a proxy serves before Redis ever answered (the default is 1 call, the
 * test above), said on stderr and shown as the node's limit. */
Test(proxy_fleet, a_fleet_floor_is_what_a_proxy_serves_before_redis_ever_answered,
     .init = setup_without_redis, .fini = teardown_without_redis, .timeout = 300)
{
    char redis[64], log[128], line[1024];
    rfx_url(redis, sizeof redis);
    snprintf(log, sizeof log, "%s/proxy.err", px_dir);
    const char *args[] = {"--upstream", "http://127.0.0.1:9", "--node", RFX_NODE, "--redis", redis,
                          "--active", "8", "--fleet-floor", "3", "--state", "off", NULL};
    cr_assert_eq(px_start_logged(&px_main, args, log), 0);
    cr_assert(RFX_WAIT_UNTIL(log_line(log, "the fleet's floor", line, sizeof line),
                             RFX_PATIENCE_MS),
              "stderr does not say Redis is unreachable");
    cr_expect(strstr(line, "at most 3 calls at once (the fleet's floor"), "%s", line);
    cr_expect_eq(px_node_count(&px_main, RFX_NODE, "limit"), 3);
}

/* The proxy's exit status for `args` (and no listener or state file to trip on); its stderr
 * in err. */
static int run_proxy(const char *args, char *err, size_t size)
{
    char cmd[1024];
    /* timeout: a value wrongly accepted would otherwise serve until the suite's end */
    snprintf(cmd, sizeof cmd,
             "timeout 10 '%s' %s --listen 127.0.0.1:0 --admin off --state off 2>&1 >/dev/null",
             SLUICE_PROXY_PATH, args);
    FILE *f = popen(cmd, "r");
    size_t n = fread(err, 1, size - 1, f);
    err[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(proxy_fleet, a_redis_flag_that_names_no_redis_server_stops_the_proxy_at_start,
     .init = setup_without_redis, .fini = teardown_without_redis, .timeout = 300)
{
#define UP "--upstream http://127.0.0.1:9 "
    static const struct {
        const char *args, *want;
    } bad[] = {
        {UP "--redis foo", "--redis 'foo': is neither redis://... nor HOST:PORT"},
        /* A forgotten value: not the next flag read as a host of that name. */
        {UP "--redis --no-discovery", "--redis needs a value"},
        {UP "--redis /run/redis/redis.sock", "--redis '/run/redis/redis.sock': a unix socket"},
        {UP "--redis redis://:s3cret@host:0", "--redis 'redis://:***@host:0': must be"},
    };
#undef UP
    char err[2048];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(run_proxy(bad[i].args, err, sizeof err), 2, "%s: %s", bad[i].args, err);
        cr_expect(strstr(err, bad[i].want) != NULL, "%s: want \"%s\" in: %s", bad[i].args,
                  bad[i].want, err);
        cr_expect(!strstr(err, "sluice_fleet_desc") && !strstr(err, "s3cret"), "%s", err);
    }
    /* The same in a configuration file, named by its file, line and key. */
    char conf[160], args[256];
    snprintf(conf, sizeof conf, "%s/redis.conf", px_dir);
    FILE *f = fopen(conf, "w");
    cr_assert_not_null(f);
    fputs("backends = (\n { id = \"a\"; upstream = \"http://127.0.0.1:9\"; redis = \"foo\"; }\n);\n",
          f);
    fclose(f);
    snprintf(args, sizeof args, "--config '%s'", conf);
    cr_expect_eq(run_proxy(args, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "redis.conf:2: backends[0].redis is neither") != NULL, "%s", err);
}
