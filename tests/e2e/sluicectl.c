/*
 * sluicectl end to end: every command against a real state file, a live
 * admin endpoint and the provider simulator; usage errors, dead and
 * non-HTTP endpoints give one line and exit 1 or 2, never a hang.
 */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <sluice/statefile.h>

#include "e2e/curl_fixture.h"
#include "admin_fixture.h"
#include "shim/file_fixture.h"
#include "sluice-provider-sim/sim_process.h"
#include "tls_fixture.h"

#ifndef SLUICECTL_PATH
#error "SLUICECTL_PATH must name the sluicectl binary (tests/CMakeLists.txt sets it)"
#endif

static struct fixture fx;
static struct sim_process sim;
static char dir[256];
static char state[512];

__attribute__((unused)) static void cleanup(void)
{
    fixture_stop(&fx);
    sim_process_stop(&sim);
    fixture_rmtree(dir);
}

/* Per-test options rather than TestSuite: the TSan build's Criterion stand-in
 * (tests/tsan/) has no TestSuite. */
#define SLUICECTL_TEST(name) Test(sluicectl, name, .fini = cleanup, .timeout = 60)

/* Run sluicectl with up to 16 arguments (NULL-terminated). */
static struct proc_result *ctl(int timeout_ms, const char *const *args)
{
    const char *argv[20] = {SLUICECTL_PATH};
    size_t n = 1;
    for (; args[n - 1] && n < 19; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return proc_run(argv, NULL, timeout_ms);
}

#define CTL(...) ctl(20000, (const char *const[]){__VA_ARGS__, NULL})

static uint16_t closed_port(void);

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* A state file in a temp dir with a live lock on a and b and an expired one on old. */
static struct sluice_statefile *make_state(void)
{
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    struct sluice_statefile *f;
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = state}, &f), SLUICE_OK);
    struct sluice_lock_record a = fixture_lock(52, 5400), b = fixture_lock(12, 7200);
    struct sluice_lock_record old = fixture_lock(9, 10);
    old.locked_at_s -= 100000;
    old.expires_s = fixture_now_s() - 5;
    cr_assert_eq(sluice_statefile_save(f, "cloud:a", &a), SLUICE_OK);
    cr_assert_eq(sluice_statefile_save(f, "cloud:b", &b), SLUICE_OK);
    cr_assert_eq(sluice_statefile_save(f, "cloud:old", &old), SLUICE_OK);
    return f;
}

SLUICECTL_TEST(help_for_every_command_and_usage_errors_exit_2_with_one_line)
{
    struct proc_result *r = CTL("--help");
    cr_expect_eq(r->exit_code, 0);
    cr_expect(strstr(r->out, "usage: sluicectl") != NULL);
    free(r);
    const char *cmds[] = {"status", "clear", "events", "probe"};
    for (size_t i = 0; i < 4; i++) {
        r = CTL(cmds[i], "--help");
        cr_expect_eq(r->exit_code, 0, "%s --help", cmds[i]);
        char want[64];
        snprintf(want, sizeof want, "usage: sluicectl %s", cmds[i]);
        cr_expect(strstr(r->out, want) != NULL, "%s --help: %s", cmds[i], r->out);
        free(r);
    }
    const char *const bad[][6] = {
        {"nonsense", NULL},
        {"status", "--bogus", NULL},
        {"status", "--json=1", NULL},
        {"status", "--state", NULL},
        {"status", "--state", "x", "--admin", "y", NULL},
        {"clear", NULL},
        {"events", "cloud:a", NULL},
        {"probe", NULL},
        {"probe", "ftp://example", NULL},
        {"probe", "http://127.0.0.1:1/", "--requests", "0", NULL},
        {"probe", "http://127.0.0.1:1/", "--concurrency-max", "5000", NULL},
        {"probe", "http://127.0.0.1:1/", "--header", "no-colon", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = ctl(5000, bad[i]);
        cr_expect_eq(r->exit_code, 2, "%s %s: exit %d", bad[i][0], bad[i][1] ? bad[i][1] : "",
                     r->exit_code);
        cr_expect_eq(count_lines(r->err), 1, "one line: %s", r->err);
        cr_expect_str_eq(r->out, "", "nothing on stdout");
        free(r);
    }
    r = ctl(5000, (const char *const[]){NULL});
    cr_expect_eq(r->exit_code, 2, "no command");
    free(r);
}

SLUICECTL_TEST(status_from_the_state_file_shows_glyphs_ceilings_and_time_left)
{
    struct sluice_statefile *f = make_state();
    sluice_statefile_close(f);
    struct proc_result *r = CTL("status", "--state", state);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "NODE") && strstr(r->out, "LOCK LEFT"), "%s", r->out);
    const char *a = strstr(r->out, "cloud:a ");
    cr_assert_not_null(a, "%s", r->out);
    cr_expect(strstr(a, "🔒 locked") && strstr(a, "52") && (strstr(a, "1h 29m") || strstr(a, "1h 30m")), "%s", r->out);
    const char *old = strstr(r->out, "cloud:old ");
    cr_assert_not_null(old);
    cr_expect(strncmp(strstr(old, "expired"), "expired", 7) == 0);
    free(r);

    r = CTL("status", "--json", "--state", state);
    cr_assert_eq(r->exit_code, 0);
    json_t *j = json_loads(r->out, 0, NULL);
    cr_assert_not_null(j, "%s", r->out);
    json_t *nodes = json_object_get(j, "nodes");
    cr_expect_eq(json_array_size(nodes), 3);
    json_t *n0 = json_array_get(nodes, 0);
    cr_expect_str_eq(json_string_value(json_object_get(n0, "node")), "cloud:a");
    cr_expect_str_eq(json_string_value(json_object_get(n0, "state")), "locked");
    cr_expect_eq(json_integer_value(json_object_get(n0, "ceiling")), 52);
    json_int_t left = json_integer_value(json_object_get(n0, "lock_left_s"));
    cr_expect(left > 5300 && left <= 5400);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(nodes, 2), "state")), "expired");
    json_decref(j);
    free(r);

    /* A corrupt file: one line naming it, exit 1. */
    FILE *fp = fopen(state, "w");
    fputs("{ torn", fp);
    fclose(fp);
    r = CTL("status", "--state", state);
    cr_expect_eq(r->exit_code, 1);
    cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    cr_expect(strstr(r->err, state) != NULL);
    free(r);
}

/* How many times `needle` occurs in the line of `out` that starts with `prefix` (-1: no
 * such line). */
static int count_in_row(const char *out, const char *prefix, const char *needle)
{
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, prefix, strlen(prefix)) != 0)
            continue;
        const char *end = strchr(l, '\n') ? strchr(l, '\n') : l + strlen(l);
        int n = 0;
        for (const char *p = strstr(l, needle); p && p < end; p = strstr(p + 1, needle))
            n++;
        return n;
    }
    return -1;
}

/* A program's start deadline for local:gpu's calls that name none (sluice_admin_desc). */
static int64_t gpu_start_deadline(void *ctx, const char *node, const char **source)
{
    (void)ctx;
    *source = "configured";
    return strcmp(node, "local:gpu") ? -1 : 700;
}

SLUICECTL_TEST(status_from_a_live_process_shows_every_nodes_status_line)
{
    fixture_start(&fx, NULL, &(struct sluice_admin_desc){.start_deadline = gpu_start_deadline});
    struct proc_result *r = CTL("status", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "cloud:locked 0/12 🔒") != NULL, "%s", r->out);
    cr_expect(strstr(r->out, "cloud:default_ollama 0/5 📈") != NULL, "%s", r->out);
    cr_expect(strstr(r->out, "cloud:rainy ") && strstr(r->out, "backoff"), "%s", r->out);
    cr_expect(strstr(r->out, "local:gpu 0/4") != NULL, "%s", r->out);
    /* One glyph per row, the status line's (before the fix STATE repeated it:
     * "12/12 🔒  🔒 locked"). */
    cr_expect_eq(count_in_row(r->out, "cloud:locked ", "🔒"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:rainy ", "🌧"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:default_ollama ", "📈"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:locked ", "locked"), 2, "the ID and STATE: %s",
                 r->out);
    /* The deadline figures: rates, queue wait percentiles, lingering calls. */
    cr_expect(strstr(r->out, "REQ/S") && strstr(r->out, "429/S") && strstr(r->out, "TIMEOUTS/S") &&
                  strstr(r->out, "QUEUE P50") && strstr(r->out, "QUEUE P99") &&
                  strstr(r->out, "LINGERING") && strstr(r->out, "START DEADLINE"),
              "%s", r->out);
    /* The start deadline of calls that name none, where the program says one. */
    cr_expect_eq(count_in_row(r->out, "local:gpu ", "700 ms configured"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:locked ", "ms configured"), 0, "%s", r->out);
    free(r);
    r = CTL("status", "--admin", fx.base, "--json");
    cr_assert_eq(r->exit_code, 0);
    json_t *j = json_loads(r->out, 0, NULL);
    cr_expect_eq(json_array_size(json_object_get(j, "nodes")), 4,
                 "the four registered nodes, not the unused openrouter preset");
    json_decref(j);
    free(r);
}

/* The built-in openrouter preset stays out of the way until it has traffic: a program
 * that never uses it sees only its own nodes (before the fix every view listed it). */
SLUICECTL_TEST(status_lists_the_openrouter_preset_only_once_it_has_traffic)
{
    fixture_start(&fx, NULL, NULL);
    struct proc_result *r = CTL("status", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "openrouter") == NULL, "unused preset listed: %s", r->out);
    free(r);
    struct sluice_pool *p = sluice_engine_pool(fx.engine, SLUICE_OPENROUTER_ID);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    r = CTL("status", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(count_in_row(r->out, "openrouter 0/16", "fixed"), 1, "used once: %s", r->out);
    free(r);
}

/* Lines of `out` that start with `prefix`. */
static int lines_starting(const char *out, const char *prefix)
{
    int n = 0;
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        n += strncmp(l, prefix, strlen(prefix)) == 0;
    return n;
}

SLUICECTL_TEST(status_shows_every_node_past_255)
{
    enum { NODES = 300 };
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    struct sluice_statefile *f;
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = state}, &f), SLUICE_OK);
    static char ids[NODES][32];
    static struct sluice_backend_desc b[NODES];
    static const struct sluice_discovery_desc disc = {.lock_ttl_s = 86400};
    for (int i = 0; i < NODES; i++) {
        snprintf(ids[i], sizeof ids[i], "cloud:n%03d", i);
        struct sluice_lock_record rec = fixture_lock(5 + (uint32_t)i % 40, 3600);
        cr_assert_eq(sluice_statefile_save(f, ids[i], &rec), SLUICE_OK);
        b[i] = (struct sluice_backend_desc){.id = ids[i], .active = 64, .discovery = &disc};
    }
    sluice_statefile_close(f);
    struct proc_result *r = CTL("status", "--state", state);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(lines_starting(r->out, "cloud:n"), NODES, "every node in the file");
    cr_expect(strstr(r->out, "cloud:n299 ") != NULL, "the last one too");
    free(r);

    /* A live process with as many. */
    fixture_start_backends(&fx, b, NODES);
    r = CTL("status", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(lines_starting(r->out, "cloud:n"), NODES, "every live node");
    free(r);
}

SLUICECTL_TEST(clear_in_the_state_file_makes_the_next_process_probe_only_that_node)
{
    struct sluice_statefile *f = make_state();
    struct proc_result *r = CTL("clear", "cloud:a", "--state", state);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    free(r);
    struct sluice_store_ops ops = sluice_statefile_ops(f);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &disc},
                                      {.id = "cloud:b", .active = 64, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 2, .store = &ops}, &e),
                 SLUICE_OK);
    char line[128];
    sluice_engine_status_line(e, "cloud:a", line, sizeof line);
    cr_expect_str_eq(line, "cloud:a 0/5 📈", "back to the jumpstart");
    sluice_engine_status_line(e, "cloud:b", line, sizeof line);
    cr_expect_str_eq(line, "cloud:b 0/12 🔒", "the other node keeps its lock");
    sluice_engine_destroy(e);
    sluice_statefile_close(f);

    /* Clearing is idempotent: a node without a lock is already as a clear leaves it. */
    r = CTL("clear", "cloud:nope", "--state", state);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(count_lines(r->err), 1);
    cr_expect(strstr(r->err, "cloud:nope") && strstr(r->err, "nothing to clear"), "%s", r->err);
    free(r);
    r = CTL("clear", "cloud:a", "--state", state);
    cr_expect_eq(r->exit_code, 0, "twice is fine: %s", r->err);
    free(r);
    r = CTL("status", "--json", "--state", state);
    cr_expect(strstr(r->out, "cloud:b") != NULL, "the other locks stay: %s", r->out);
    free(r);
}

/* A file sluice cannot read (a newer version's, another program's, a torn one) holds locks
 * or data the clear cannot see: clearing one node must not replace it (the library's next
 * save would, and with it every other node's lock). */
SLUICECTL_TEST(clear_leaves_a_file_it_cannot_read_as_it_is_and_says_why)
{
    const char *texts[] = {
        "{\"format\": \"sluice-ceilings\", \"version\": 2, \"nodes\": {\"cloud:a\": {}, "
        "\"cloud:b\": {}}}\n",
        "{\"my_app_config\": {\"threads\": 8}}\n",
        "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceil",
    };
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        spit(state, texts[i], strlen(texts[i]));
        struct proc_result *r = CTL("clear", "cloud:a", "--state", state);
        cr_expect_eq(r->exit_code, 1, "file %zu: %s", i, r->err);
        cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
        cr_expect(strstr(r->err, state) && strstr(r->err, "clears nothing") &&
                      strstr(r->err, "move it aside"),
                  "file %zu: %s", i, r->err);
        free(r);
        char *now = slurp(state, NULL);
        cr_expect_str_eq(now, texts[i], "file %zu was changed", i);
        free(now);
    }
}

SLUICECTL_TEST(messages_speak_cli_and_expiry_times_carry_their_zone)
{
    struct sluice_statefile *f = make_state();
    sluice_statefile_close(f);
    /* EXPIRES says which clock it is in. */
    const char *argv[] = {SLUICECTL_PATH, "status", "--state", state, NULL};
    const char *utc[] = {"TZ=UTC", NULL};
    struct proc_result *r = proc_run(argv, utc, 20000);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    const char *a = strstr(r->out, "cloud:a ");
    cr_assert_not_null(a, "%s", r->out);
    char row[256];
    snprintf(row, sizeof row, "%.*s", (int)strcspn(a, "\n"), a);
    cr_expect(strstr(row, ":00 UTC") || strstr(row, " UTC "), "EXPIRES without a zone: %s", row);
    free(r);
    /* A probe's failure names the command once. */
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", closed_port());
    r = CTL("probe", url);
    cr_expect_eq(r->exit_code, 1);
    cr_expect(strncmp(r->err, "sluicectl probe: no HTTP answer", 31) == 0, "%s", r->err);
    free(r);
    /* --redis is offered only where it is taken. */
    r = CTL("status", "--state", "x", "--admin", "y");
    cr_expect_eq(r->exit_code, 2);
    cr_expect(strstr(r->err, "--redis") == NULL, "status does not take --redis: %s", r->err);
    free(r);
    /* A bad --redis URL is reported in the flag's words, not the C field's. */
    r = CTL("clear", "cloud:a", "--redis", "redis://127.0.0.1:99999");
    cr_expect_eq(r->exit_code, 1);
    cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    cr_expect(strstr(r->err, "--redis") && !strstr(r->err, "sluice_fleet_desc"), "%s", r->err);
    free(r);
    /* So is a --state that cannot be a state file, the folder make_state made (before:
     * sluice_statefile_desc.path). */
    r = CTL("status", "--state", dir);
    cr_expect_eq(r->exit_code, 1);
    cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    cr_expect(strstr(r->err, "set --state to a file") && !strstr(r->err, "sluice_statefile_desc"),
              "%s", r->err);
    free(r);
    r = CTL("status", "--state", "");
    cr_expect_eq(r->exit_code, 1);
    cr_expect(strstr(r->err, "leave --state out") && !strstr(r->err, "NULL"), "%s", r->err);
    free(r);
}

SLUICECTL_TEST(clear_through_the_admin_endpoint_resets_the_live_node_only)
{
    fixture_start(&fx, NULL, NULL);
    char before[128];
    sluice_engine_status_line(fx.engine, "cloud:rainy", before, sizeof before);
    struct proc_result *r = CTL("clear", "cloud:locked", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_str_eq(r->out, "cleared: cloud:locked 0/5 📈\n");
    free(r);
    /* Again: nothing happened since, so nothing to clear (exit 0, as with --state; before
     * the fix it said "cleared" again and put a second clear in the feed). */
    r = CTL("clear", "cloud:locked", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_str_eq(r->out, "already clear: cloud:locked 0/5 📈\n");
    cr_expect(strstr(r->err, "nothing to clear") != NULL, "%s", r->err);
    free(r);
    struct sluice_discovery_status st;
    sluice_engine_status(fx.engine, "cloud:locked", &st);
    cr_expect_eq(st.last_event.kind, SLUICE_EVENT_CLEAR);
    cr_expect_eq(sluice_event_ring_count(sluice_engine_events(fx.engine, "cloud:locked")), 2,
                 "restore and one clear: the second clear added nothing");
    struct sluice_lock_record rec;
    fx.ops.load(fx.ops.ctx, "cloud:locked", &rec);
    cr_expect_eq(rec.ceiling, 0, "the persisted lock is gone");
    char after[128];
    sluice_engine_status_line(fx.engine, "cloud:rainy", after, sizeof after);
    cr_expect_str_eq(after, before);

    r = CTL("clear", "local:gpu", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 1);
    cr_expect(strstr(r->err, "fixed limit") != NULL, "%s", r->err);
    cr_expect_eq(count_lines(r->err), 1);
    free(r);
    r = CTL("clear", "cloud:nope", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 1);
    cr_expect(strstr(r->err, "unknown node_id") != NULL, "%s", r->err);
    free(r);
}

/* ---- events ------------------------------------------------------------------- */

struct spawned {
    pid_t pid;
    int out;
    char buf[8192];
    size_t len;
};

static void spawn(struct spawned *s, const char *const *argv)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    memset(s, 0, sizeof *s);
    fflush(NULL);
    s->pid = fork();
    cr_assert_geq(s->pid, 0);
    if (s->pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    s->out = p[0];
}

static bool spawned_saw(struct spawned *s, const char *what, int within_ms)
{
    for (int waited = 0; waited < within_ms; waited += 50) {
        if (strstr(s->buf, what))
            return true;
        struct pollfd pf = {.fd = s->out, .events = POLLIN};
        if (poll(&pf, 1, 50) > 0 && s->len < sizeof s->buf - 1) {
            ssize_t n = read(s->out, s->buf + s->len, sizeof s->buf - 1 - s->len);
            if (n > 0)
                s->len += (size_t)n;
            s->buf[s->len] = '\0';
        }
    }
    return strstr(s->buf, what) != NULL;
}

/* SIGINT, then the exit code (-1 if it did not exit within 5 s); keeps reading its output. */
static int interrupt(struct spawned *s)
{
    kill(s->pid, SIGINT);
    int rc = -1;
    for (int i = 0; i < 100; i++) {
        int ws;
        if (waitpid(s->pid, &ws, WNOHANG) == s->pid) {
            rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : -100 - (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
            s->pid = 0;
            break;
        }
        usleep(50 * 1000);
    }
    if (s->pid) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    /* Everything it printed is in the pipe now; read to EOF. */
    for (ssize_t n = 1; n > 0 && s->len < sizeof s->buf - 1; s->len += (size_t)(n > 0 ? n : 0)) {
        n = read(s->out, s->buf + s->len, sizeof s->buf - 1 - s->len);
        s->buf[s->len + (size_t)(n > 0 ? n : 0)] = '\0';
    }
    close(s->out);
    return rc;
}

SLUICECTL_TEST(events_prints_the_feed_and_follow_streams_until_ctrl_c)
{
    fixture_start(&fx, NULL, NULL);
    struct proc_result *r = CTL("events", "cloud:locked", "--admin", fx.base);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    json_t *ev = json_loads(r->out, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert_not_null(ev, "%s", r->out);
    cr_expect_str_eq(json_string_value(json_object_get(ev, "event")), "restore");
    json_decref(ev);
    free(r);

    struct spawned s;
    spawn(&s, (const char *const[]){SLUICECTL_PATH, "events", "cloud:locked", "--admin", fx.base,
                                    "--follow", NULL});
    cr_assert(spawned_saw(&s, "\"event\":\"restore\"", 5000), "%s", s.buf);
    sluice_engine_clear(fx.engine, "cloud:locked");
    cr_assert(spawned_saw(&s, "\"event\":\"clear\"", 5000), "%s", s.buf);
    int rc = interrupt(&s);
    cr_expect_eq(rc, 0, "Ctrl-C ends --follow cleanly: exit %d", rc);

    r = CTL("events", "cloud:nope", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 1);
    cr_expect_eq(count_lines(r->err), 1);
    free(r);
}

/* A person's format (the default on a terminal; --human into a pipe): one line per event
 * with its time, seq, kind, the limit's move, the reason in words and what it says (why).
 * Before the fix events printed only JSON Lines. */
SLUICECTL_TEST(events_has_a_human_format_and_keeps_json_lines)
{
    fixture_start(&fx, NULL, NULL);
    sluice_engine_clear(fx.engine, "cloud:locked");
    struct proc_result *r = CTL("events", "cloud:locked", "--admin", fx.base, "--human");
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(count_lines(r->out), 2, "%s", r->out);
    cr_expect(strchr(r->out, '{') == NULL, "no JSON: %s", r->out);
    cr_expect(strstr(r->out, "#1   restore  5 → 12    store · 0 in flight · ceiling 12 · why: a live "
                             "lock was read back from the store at start\n"),
              "the restore: %s", r->out);
    cr_expect(strstr(r->out, "#2   clear    12 → 5    api · 0 in flight · why: a caller cleared "
                             "the node (sluice_discovery_clear, the admin's clear, sluicectl "
                             "clear)\n"),
              "the clear: %s", r->out);
    free(r);
    r = CTL("events", "cloud:rainy", "--admin", fx.base, "--human");
    cr_expect(strstr(r->out, "backoff") && strstr(r->out, "overload"), "%s", r->out);
    free(r);
    r = CTL("events", "cloud:locked", "--admin", fx.base, "--json");
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect_eq(count_lines(r->out), 2);
    cr_expect(strncmp(r->out, "{\"seq\":1,", 9) == 0, "JSON Lines: %s", r->out);
    free(r);
    r = CTL("events", "cloud:locked", "--admin", fx.base, "--json", "--human");
    cr_expect_eq(r->exit_code, 2, "one format or the other");
    free(r);

}

/* ---- endpoints that are not what they should be ------------------------------------- */

struct fake_server {
    int fd;
    uint16_t port;
    const char *answer; /* NULL: accept and say nothing */
    pthread_t tid;
};

static void *fake_main(void *arg)
{
    struct fake_server *f = arg;
    for (;;) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        if (f->answer) {
            char buf[1024];
            (void)!recv(c, buf, sizeof buf, MSG_DONTWAIT);
            (void)!send(c, f->answer, strlen(f->answer), MSG_NOSIGNAL);
            close(c);
        }
        /* silent: the connection stays open until the process ends */
    }
}

static void fake_start(struct fake_server *f, const char *answer)
{
    f->answer = answer;
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(f->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(f->fd, 16), 0);
    socklen_t sl = sizeof sa;
    getsockname(f->fd, (struct sockaddr *)&sa, &sl);
    f->port = ntohs(sa.sin_port);
    pthread_create(&f->tid, NULL, fake_main, f);
}

/* A fake endpoint answering 200 with `body` as an event feed (the answer is built in
 * `answer`, which must outlive it). */
static void fake_start_body(struct fake_server *f, char *answer, size_t size, const char *body)
{
    snprintf(answer, size,
             "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: "
             "%zu\r\nConnection: close\r\n\r\n%s",
             strlen(body), body);
    fake_start(f, answer);
}

static uint16_t closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd); /* nobody listens there now */
    return ntohs(sa.sin_port);
}

static void expect_one_line_failure(struct proc_result *r, const char *mentions)
{
    cr_expect_eq(r->exit_code, 1, "exit %d (timed out: %d): %s", r->exit_code, r->timed_out, r->err);
    cr_expect_eq(count_lines(r->err), 1, "one line: %s", r->err);
    cr_expect(strstr(r->err, mentions) != NULL, "\"%s\" lacks \"%s\"", r->err, mentions);
    free(r);
}

/* An https:// endpoint behind a private CA (openssl s_server, a self-signed certificate): the
 * probe's one line says which TLS check failed, in libcurl's words, and names --cacert; with
 * --cacert it gets past its first request; a CA file it cannot use is exit 2 at once. */
SLUICECTL_TEST(probe_names_the_tls_check_that_failed_and_cacert_trusts_a_private_ca)
{
    if (!tls_available())
        cr_skip_test("openssl is not installed (the test preset's bootstrap installs it)");
    char tls_dir[64], url[128], cert[128];
    fixture_tmpdir(tls_dir, sizeof tls_dir);
    tls_make_cert(tls_dir);
    snprintf(cert, sizeof cert, "%s/cert.pem", tls_dir);
    int port = (int)closed_port();
    pid_t server = tls_server_start(tls_dir, port);
    snprintf(url, sizeof url, "https://127.0.0.1:%d/v1/models", port);
    struct proc_result *r = CTL("probe", url);
    cr_expect_eq(r->exit_code, 1, "%s", r->err);
    cr_expect(strstr(r->err, "SSL certificate problem") && strstr(r->err, "--cacert FILE"),
              "%s", r->err);
    free(r);
    /* Trusted, the first request is served; the rest is s_server's (one connection at a
     * time, then its end): only that the probe got past the first request is asked. */
    r = CTL("probe", url, "--cacert", cert, "--requests", "1", "--timeout", "5");
    cr_expect(strstr(r->err, "no HTTP answer") == NULL, "%s", r->err);
    cr_expect(strstr(r->out, "probe of ") != NULL, "%s %s", r->out, r->err);
    free(r);
    r = CTL("probe", url, "--cacert", "/dev/null");
    cr_expect_eq(r->exit_code, 2, "%s", r->err);
    cr_expect(strstr(r->err, "--cacert /dev/null: holds no PEM certificate") != NULL, "%s",
              r->err);
    free(r);
    tls_server_stop(server);
    fixture_rmtree(tls_dir);
}

SLUICECTL_TEST(refused_non_http_and_silent_endpoints_fail_with_one_line)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", closed_port());
    expect_one_line_failure(CTL("status", "--admin", url), "cannot reach");
    expect_one_line_failure(CTL("clear", "x", "--admin", url), "cannot reach");
    expect_one_line_failure(CTL("events", "x", "--admin", url), "cannot reach");
    expect_one_line_failure(CTL("events", "x", "--admin", url, "--follow"), "failed");
    expect_one_line_failure(CTL("probe", url), "no HTTP answer");

    static struct fake_server garbage, silent, http404;
    fake_start(&garbage, "SSH-2.0-OpenSSH_9.2\r\n");
    snprintf(url, sizeof url, "http://127.0.0.1:%u", garbage.port);
    expect_one_line_failure(CTL("status", "--admin", url), "cannot reach");
    expect_one_line_failure(CTL("probe", url), "no HTTP answer");

    fake_start(&http404, "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno");
    snprintf(url, sizeof url, "http://127.0.0.1:%u", http404.port);
    expect_one_line_failure(CTL("status", "--admin", url), "HTTP 404");
    expect_one_line_failure(CTL("probe", url), "HTTP 404");

    fake_start(&silent, NULL);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1", silent.port);
    expect_one_line_failure(CTL("probe", url, "--request-timeout", "1"), "did not answer within 1 s");

    /* A web server that answers 200 to anything is not an admin endpoint either: events
     * used to print its page, or nothing, and exit 0. */
    static struct fake_server page, empty;
    fake_start(&page, "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 28\r\n"
                      "Connection: close\r\n\r\n<html><body>hi</body></html>");
    snprintf(url, sizeof url, "http://127.0.0.1:%u", page.port);
    expect_one_line_failure(CTL("events", "x", "--admin", url),
                            "did not answer as a sluice admin endpoint");
    expect_one_line_failure(CTL("events", "x", "--admin", url, "--follow"),
                            "did not answer as a sluice admin endpoint");
    fake_start(&empty, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    snprintf(url, sizeof url, "http://127.0.0.1:%u", empty.port);
    expect_one_line_failure(CTL("events", "x", "--admin", url), "no Content-Type");
    expect_one_line_failure(CTL("events", "x", "--admin", url, "--follow"), "no Content-Type");
}

/* ---- what reaches the terminal ------------------------------------------------------ */

/* Raw bytes a terminal would act on: C0 but newline, DEL, and C1 (U+0080..U+009F). */
static bool has_terminal_controls(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p < 0x20 && *p != '\n') || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0))
            return true;
    return false;
}

static bool is_utf8(const char *s)
{
    for (const char *p = s; *p;) {
        size_t n = sluice_utf8_len(p);
        if (!n)
            return false;
        p += n;
    }
    return true;
}

/* One endpoint node whose strings carry escape sequences, and a state too long for a cell. */
#define EVIL_LINE "\\u001b]0;owned\\u0007cloud:x 0/5 \\u001b[2J\\u009b31m"
#define EVIL_NODES                                                                                 \
    "{\"nodes\":[{\"node\":\"cloud:x\",\"glyph\":\"🔒\",\"state\":\"€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€\","   \
    "\"status_line\":\"" EVIL_LINE "\",\"ceiling\":3,\"lock_left_s\":60,\"waiting\":0}]}"

/* A text field the endpoint adds to an event (a backoff's "why") is shown by name in a
 * person's format. */
SLUICECTL_TEST(events_in_a_persons_format_show_an_added_text_field_by_name)
{
    static struct fake_server why;
    static char why_answer[512];
    const char *feed = "{\"seq\":3,\"wall_ms\":0,\"node\":\"cloud:x\",\"event\":\"backoff\","
                       "\"reason\":\"overload\",\"old_limit\":16,\"new_limit\":12,"
                       "\"in_flight\":16,\"ceiling\":0,\"why\":\"3 refusals at 16 in flight\"}\n"
                       "{\"seq\":4,\"event\":\"lock\"}\n"; /* an endpoint that gives no reason */
    fake_start_body(&why, why_answer, sizeof why_answer, feed);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", why.port);
    struct proc_result *r = CTL("events", "cloud:x", "--admin", url, "--human");
    cr_expect(strstr(r->out, "#3   backoff  16 → 12   overload · 16 in flight · why: 3 refusals at "
                             "16 in flight\n"),
              "%s", r->out);
    cr_expect_eq(r->exit_code, 0, "an event without a reason crashed it: %s", r->err);
    cr_expect(strstr(r->out, "#4   lock     at 0      ? · 0 in flight\n"), "%s", r->out);
    free(r);
    /* Its time carries its zone, as the README says every time does. */
    const char *argv[] = {SLUICECTL_PATH, "events", "cloud:x", "--admin", url, "--human", NULL};
    const char *utc[] = {"TZ=UTC", NULL};
    r = proc_run(argv, utc, 20000);
    cr_expect(!strncmp(r->out, "00:00:00 UTC  #3 ", 17), "%s", r->out);
    free(r);
}

SLUICECTL_TEST(escape_sequences_from_an_endpoint_or_a_node_id_never_reach_the_terminal)
{
    static struct fake_server status, refusal, events;
    static char status_answer[1024], refusal_answer[512];
    snprintf(status_answer, sizeof status_answer,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s", strlen(EVIL_NODES), EVIL_NODES);
    const char *evil_error = "{\"error\":\"gone\\u001b[2J\\u001b]0;owned\\u0007\",\"fix\":\"\\u009b31mretry\"}";
    snprintf(refusal_answer, sizeof refusal_answer,
             "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s", strlen(evil_error), evil_error);
    fake_start(&status, status_answer);
    fake_start(&refusal, refusal_answer);
    static char events_answer[256];
    const char *raw_feed = "{\"event\":\"\x1b[2J\xc2\x9b\"}\n\x1b]0;x\x07\n";
    fake_start_body(&events, events_answer, sizeof events_answer, raw_feed);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", status.port);
    /* The table: every cell cleaned, and the state cut by its cell is still whole UTF-8. */
    struct proc_result *r = CTL("status", "--admin", url);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(!has_terminal_controls(r->out), "raw controls in the table: %s", r->out);
    cr_expect(is_utf8(r->out), "a cell cut mid-character: %s", r->out);
    cr_expect(strstr(r->out, "\\u001b]0;owned\\u0007cloud:x 0/5") != NULL, "shown, not acted on: %s", r->out);
    free(r);
    /* --json stays equivalent JSON (C1 as \u009b), so machines read the same strings. */
    r = CTL("status", "--admin", url, "--json");
    cr_expect(!has_terminal_controls(r->out), "raw controls in --json: %s", r->out);
    json_t *j = json_loads(r->out, 0, NULL);
    cr_assert_not_null(j, "%s", r->out);
    const char *line = json_string_value(json_object_get(json_array_get(json_object_get(j, "nodes"), 0), "status_line"));
    cr_expect_str_eq(line, "\x1b]0;owned\x07" "cloud:x 0/5 \x1b[2J\xc2\x9b" "31m");
    json_decref(j);
    free(r);
    /* An endpoint's error and fix. */
    snprintf(url, sizeof url, "http://127.0.0.1:%u", refusal.port);
    r = CTL("clear", "cloud:x", "--admin", url);
    cr_expect_eq(r->exit_code, 1);
    cr_expect(!has_terminal_controls(r->err), "raw controls in the error: %s", r->err);
    cr_expect(strstr(r->err, "gone\\u001b[2J") != NULL, "%s", r->err);
    cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    free(r);
    /* The event feed as it came. */
    snprintf(url, sizeof url, "http://127.0.0.1:%u", events.port);
    r = CTL("events", "cloud:x", "--admin", url);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(!has_terminal_controls(r->out), "raw controls in events: %s", r->out);
    free(r);
    r = CTL("events", "cloud:x", "--admin", url, "--human");
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(!has_terminal_controls(r->out), "raw controls in a person's events: %s", r->out);
    free(r);
    /* A node ID from the state file. */
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    struct sluice_statefile *f;
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = state}, &f), SLUICE_OK);
    struct sluice_lock_record rec = fixture_lock(7, 600);
    cr_assert_eq(sluice_statefile_save(f, "cloud:\x1b]0;owned\x07", &rec), SLUICE_OK);
    sluice_statefile_close(f);
    r = CTL("status", "--state", state);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(!has_terminal_controls(r->out), "raw controls from the file: %s", r->out);
    cr_expect(strstr(r->out, "cloud:\\u001b]0;owned\\u0007") != NULL, "%s", r->out);
    free(r);
}

/* ---- probe against the simulator -------------------------------------------------- */

/*
 * Probe a simulator in `mode` with hidden cap `cap`; returns the discovered
 * N (exit 0, last line exactly "discovered ceiling: N"). Up to three
 * probes, each logged, until one lands in [lo·C, hi·C]: on a loaded 2-core
 * machine a spurious latency knee (a stalled client thread reads as a slow
 * provider) can still settle one low, which is the core's accuracy, tested
 * by the sim and curl suites, not sluicectl's.
 */
static unsigned probe_mode_cap(const char *mode, int cap, const char *save_as, double lo, double hi)
{
    const struct fx_provider provider = {.mode = mode, .cap = cap, .median_ms = 50};
    unsigned best = 0;
    for (int attempt = 1; attempt <= 3; attempt++) {
        cr_assert_eq(fx_sim_start(&sim, &provider), 0);
        char url[128];
        sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
        struct proc_result *r =
            save_as ? CTL("probe", url, "--method", "POST", "--concurrency-max", "64", "--requests",
                          "20000", "--timeout", "30", "--save", save_as, "--state", state)
                    : CTL("probe", url, "--method", "POST", "--concurrency-max", "64", "--requests",
                          "20000", "--timeout", "30");
        sim_process_stop(&sim);
        char last[128];
        last_line(r->out, last, sizeof last);
        unsigned n = 0;
        cr_assert_eq(sscanf(last, "discovered ceiling: %u", &n), 1, "last line \"%s\"", last);
        char again[64];
        snprintf(again, sizeof again, "discovered ceiling: %u", n);
        cr_assert_str_eq(last, again, "the last line is exactly the result");
        cr_assert_eq(r->exit_code, 0, "locked: %s", r->err);
        cr_expect(strstr(r->out, "event timeline") && strstr(r->out, " lock "), "%s", r->out);
        cr_expect(strstr(r->out, "\nwhat the causes mean:\n  slow_start      every permit in use"),
                  "the timeline's causes are not explained: %s", r->out);
        free(r);
        fprintf(stderr, "sluicectl probe, %s mode, cap %d, attempt %d: discovered ceiling %u\n",
                mode, cap, attempt, n);
        best = n;
        if (n >= lo * cap && n <= hi * cap)
            break;
    }
    return best;
}

static unsigned probe_cap(int cap, const char *save_as)
{
    return probe_mode_cap("reject", cap, save_as, 0.85, 1.15);
}

/* Over real HTTP: a provider that queues instead of refusing
 * (Ollama-like) is found by latency alone, inside [0.8·C, 1.25·C]. */
Test(sluicectl, probe_locks_a_queueing_provider_at_cap_12_inside_the_band, .fini = cleanup,
     .timeout = 120)
{
    unsigned n = probe_mode_cap("queue", 12, NULL, 0.8, 1.25);
    cr_expect(n >= 0.8 * 12 && n <= 1.25 * 12, "queue mode, cap 12: discovered %u", n);
}

SLUICECTL_TEST(probe_discovers_cap_16_and_52_within_15_percent)
{
    unsigned n16 = probe_cap(16, NULL);
    cr_expect(n16 >= 0.85 * 16 && n16 <= 1.15 * 16, "cap 16: discovered %u", n16);
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    unsigned n52 = probe_cap(52, "cloud:sim");
    cr_expect(n52 >= 0.85 * 52 && n52 <= 1.15 * 52, "cap 52: discovered %u", n52);

    /* --save persisted it; status reads it back. */
    struct proc_result *r = CTL("status", "--json", "--state", state);
    cr_assert_eq(r->exit_code, 0);
    json_t *j = json_loads(r->out, 0, NULL);
    json_t *n = json_array_get(json_object_get(j, "nodes"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(n, "node")), "cloud:sim");
    cr_expect_eq(json_integer_value(json_object_get(n, "ceiling")), n52);
    cr_expect_str_eq(json_string_value(json_object_get(n, "policy")), "discover");
    json_decref(j);
    free(r);
}

/* --save says "saved" only for a save that landed: a state file that cannot be written (a
 * FIFO at the path: never opened, never replaced) makes it say why, and exit 1; a path whose
 * folder is a file is refused before the first request, with the state file's own reason. */
SLUICECTL_TEST(probe_save_says_saved_only_when_the_save_landed)
{
    const struct fx_provider provider = {.mode = "reject", .cap = 4, .median_ms = 50};
    cr_assert_eq(fx_sim_start(&sim, &provider), 0);
    char url[128];
    sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    cr_assert_eq(mkfifo(state, 0600), 0, "%s", strerror(errno));
    struct proc_result *r = CTL("probe", url, "--method", "POST", "--requests", "20000",
                                "--timeout", "30", "--save", "cloud:sim", "--state", state);
    cr_expect(strstr(r->out, "discovered ceiling:") != NULL, "%s", r->out);
    cr_expect_eq(r->exit_code, 1, "the save failed: %s", r->err);
    cr_expect(strstr(r->err, "not saved:") && strstr(r->err, state) && !strstr(r->err, "saved cloud"),
              "%s", r->err);
    free(r);
    char inside[600];
    snprintf(inside, sizeof inside, "%s/x.json", state);
    unlink(state);
    spit(state, "{}", 2);
    r = CTL("probe", url, "--save", "cloud:sim", "--state", inside);
    cr_expect_eq(r->exit_code, 1, "%s", r->err);
    cr_expect(strstr(r->err, "--save: ") && strstr(r->err, state), "the reason: %s", r->err);
    cr_expect(strstr(r->out, "discovered") == NULL, "no request made: %s", r->out);
    free(r);
}

SLUICECTL_TEST(probe_stops_on_ctrl_c_with_what_it_found)
{
    const struct fx_provider provider = {.mode = "reject", .cap = 16, .median_ms = 3000,
                                         .fixed_latency = true};
    cr_assert_eq(fx_sim_start(&sim, &provider), 0);
    char url[128];
    sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
    struct spawned s;
    spawn(&s, (const char *const[]){SLUICECTL_PATH, "probe", url, "--method", "POST", "--timeout", "60", NULL});
    usleep(1500 * 1000); /* mid-discovery: the first calls take 3 s */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = interrupt(&s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_expect_eq(rc, 1, "stopped before a lock: exit 1, got %d", rc);
    cr_expect_lt(t1.tv_sec - t0.tv_sec, 4, "it stopped promptly");
    char last[128];
    last_line(s.buf, last, sizeof last);
    cr_expect_str_eq(last, "discovered ceiling: 5", "the jumpstart it had reached: %s", s.buf);
}

/* A clear through the admin that the process's state file cannot take fails as a clear
 * of the file itself does: exit 1, one line naming the file (before the fix: "cleared",
 * exit 0, and the lock came back at the next restart). */
SLUICECTL_TEST(clear_through_the_admin_fails_naming_a_state_file_it_cannot_write)
{
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    struct sluice_statefile *sf = NULL;
    fixture_start_unwritable_state(&fx, state, &sf);
    struct proc_result *r = CTL("clear", "cloud:locked", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 1, "%s%s", r->out, r->err);
    cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    cr_expect(strstr(r->err, state) != NULL, "names the file: %s", r->err);
    free(r);
    fixture_stop(&fx);
    sluice_statefile_close(sf);
}

/* Refused calls have a column in the live table: the total and each reason that has any
 * (before the fix the admin's refusal counts showed only in --json). */
SLUICECTL_TEST(status_from_a_live_process_shows_refused_calls)
{
    const struct sluice_backend_desc b[] = {
        {.id = "cloud:tight", .active = 1, .waiting = SLUICE_SOME(0)},
        {.id = "cloud:calm", .active = 4},
    };
    fixture_start_backends(&fx, b, 2);
    struct sluice_pool *p = sluice_engine_pool(fx.engine, "cloud:tight");
    cr_assert_eq(sluice_pool_admit(p), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY, "no room to wait: refused");
    cr_assert_eq(sluice_pool_admit(p), SLUICE_ECAPACITY);
    struct proc_result *r = CTL("status", "--admin", fx.base);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "REFUSED") != NULL, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:tight ", " 2 (2 queue full) "), 1, "%s", r->out);
    /* Under the header (both rows are ASCII: bytes are columns), the calm node's 0. */
    const char *head = strstr(r->out, "REFUSED"), *calm = strstr(r->out, "\ncloud:calm ");
    cr_assert(head && calm, "%s", r->out);
    cr_expect(strncmp(calm + 1 + (head - r->out), "0 ", 2) == 0, "nothing refused: %s", r->out);
    free(r);
    sluice_pool_leave(p);
}

/* Locks no sluice writes (dated before 2000, or longer than any lock discovery makes) are
 * shown as suspect with the reason, as unreadable entries are shown as invalid: the other
 * rows stand and the command succeeds (before the fix they showed as live locks, one
 * "30 years" left). */
SLUICECTL_TEST(status_from_the_state_file_flags_absurd_lock_dates)
{
    fixture_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    int64_t now = fixture_now_s();
    FILE *fp = fopen(state, "w");
    cr_assert_not_null(fp);
    fprintf(fp,
            "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\n"
            "  \"cloud:ok\": {\"ceiling\": 52, \"locked_at\": %lld, \"expires_at\": %lld, "
            "\"policy\": \"discover\"},\n"
            "  \"cloud:far\": {\"ceiling\": 40, \"locked_at\": %lld, \"expires_at\": %lld, "
            "\"policy\": \"discover\"},\n"
            "  \"cloud:old\": {\"ceiling\": 30, \"locked_at\": 631152000, \"expires_at\": "
            "631238400, \"policy\": \"discover\"},\n"
            "  \"cloud:bad\": {\"ceiling\": 0}\n"
            "}}\n",
            (long long)(now - 60), (long long)(now + 3600), (long long)(now - 60),
            (long long)(now + INT64_C(30) * 365 * 86400));
    fclose(fp);
    struct proc_result *r = CTL("status", "--state", state);
    cr_expect_eq(r->exit_code, 0, "as for the invalid entry: %s", r->err);
    cr_expect_eq(count_in_row(r->out, "cloud:ok ", "🔒 locked"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:bad ", "⚠️ invalid"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:far ", "⚠️ suspect"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:far ", "longer than any sluice makes"), 1, "%s",
                 r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:old ", "⚠️ suspect"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:old ", "before 2000"), 1, "%s", r->out);
    /* ⚠️ takes two columns on a terminal, as 🔒 does: "⚠️ suspect" is one wider than
     * "🔒 locked", and CEILING starts in one column on every row (before: the ⚠️ rows one
     * to the right). */
    cr_expect_eq(count_in_row(r->out, "cloud:ok ", "🔒 locked   52"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:far ", "⚠️ suspect  40"), 1, "%s", r->out);
    cr_expect_eq(count_in_row(r->out, "cloud:bad ", "⚠️ invalid  -"), 1, "%s", r->out);
    free(r);
    r = CTL("status", "--json", "--state", state);
    cr_expect_eq(r->exit_code, 0, "%s", r->err);
    json_t *j = json_loads(r->out, 0, NULL);
    cr_assert_not_null(j, "%s", r->out);
    json_t *nodes = json_object_get(j, "nodes");
    static const char *const want[][2] = {
        {"cloud:ok", "locked"}, {"cloud:far", "suspect"}, {"cloud:old", "suspect"},
        {"cloud:bad", "invalid"}};
    for (size_t k = 0; k < 4; k++) {
        json_t *n = json_array_get(nodes, k);
        cr_expect_str_eq(json_string_value(json_object_get(n, "node")), want[k][0]);
        cr_expect_str_eq(json_string_value(json_object_get(n, "state")), want[k][1]);
        cr_expect_eq(json_is_string(json_object_get(n, "problem")), k > 0, "%s", want[k][0]);
    }
    json_decref(j);
    free(r);
}
