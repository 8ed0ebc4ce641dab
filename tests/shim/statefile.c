/*
 * The state file in one process: where it lives, what it holds, durable and
 * byte-preserving rewrites, every kind of bad file (an error and an empty
 * state, never a crash, and a clean rewrite at the next save), saves on the
 * writer thread, and what may sit at its path (a file too large, symbolic
 * links). What needs other processes or a server is tests/e2e/statefile.c.
 */
#include <jansson.h>
#include <sys/file.h>
#include <sys/inotify.h>

#include "run_fixtures.h"
#include "shim/statefile_fixture.h"

STATEFILE_TEST(default_path_is_xdg_state_home_then_home_local_state)
{
    char buf[512];
    setenv("XDG_STATE_HOME", "/xdg/state", 1);
    sluice_statefile_default_path(buf, sizeof buf);
    cr_expect_str_eq(buf, "/xdg/state/sluice/ceilings.json");
    setenv("XDG_STATE_HOME", "relative/ignored", 1);
    setenv("HOME", "/home/ada", 1);
    sluice_statefile_default_path(buf, sizeof buf);
    cr_expect_str_eq(buf, "/home/ada/.local/state/sluice/ceilings.json");
    unsetenv("XDG_STATE_HOME");
    sluice_statefile_default_path(buf, sizeof buf);
    cr_expect_str_eq(buf, "/home/ada/.local/state/sluice/ceilings.json");

    /* open(NULL path) uses it; the first save makes the directory 0700 and the file 0600. */
    fixture_tmpdir(dir, sizeof dir);
    char xdg[300];
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    setenv("XDG_STATE_HOME", xdg, 1);
    cr_assert_eq(sluice_statefile_open(NULL, &sf), SLUICE_OK);
    char want[400];
    snprintf(want, sizeof want, "%s/sluice/ceilings.json", xdg);
    cr_expect_str_eq(sluice_statefile_path(sf), want);
    struct sluice_lock_record r = record(52, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "cloud:default_ollama", &r), SLUICE_OK);
    struct stat st;
    char sub[400];
    snprintf(sub, sizeof sub, "%s/sluice", xdg);
    cr_assert_eq(stat(sub, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700, "dir mode %o", st.st_mode & 0777);
    cr_assert_eq(stat(want, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "file mode %o", st.st_mode & 0777);
}

/* Open (path) must fail with `status` and a message naming `names` and saying `says`. */
static void expect_open_fails(const char *path, int status, const char *names, const char *says)
{
    char err[1024] = "";
    struct sluice_statefile *f = NULL;
    int got = sluice_statefile_open(
        &(struct sluice_statefile_desc){.path = path, .error = err, .error_size = sizeof err}, &f);
    cr_expect_eq(got, status, "%s: open returned %d (%s), not %d", path, got, err, status);
    cr_expect_null(f);
    sluice_statefile_close(f);
    cr_expect(strstr(err, names) && strstr(err, says), "message \"%s\" lacks \"%s\" or \"%s\"",
              err, names, says);
}

/* A path the first save cannot write fails at open, naming the path and the reason
 * (before the fix open returned OK and the failure waited for the first save). A
 * folder that does not exist but can be made still opens: the first save makes it. */
STATEFILE_TEST(a_path_the_first_save_cannot_use_fails_at_open_naming_it)
{
    fixture_tmpdir(dir, sizeof dir);
    expect_open_fails(dir, SLUICE_EINVAL, dir, "is a directory");

    char file[400], under_file[512];
    snprintf(file, sizeof file, "%s/plain", dir);
    spit(file, "x", 1);
    snprintf(under_file, sizeof under_file, "%s/sub/ceilings.json", file);
    expect_open_fails(under_file, SLUICE_EINVAL, file, "is not a directory");

    if (geteuid() != 0) { /* root may write anywhere: no folder it cannot make */
        char locked[400], under_locked[512];
        snprintf(locked, sizeof locked, "%s/locked", dir);
        cr_assert_eq(mkdir(locked, 0500), 0);
        snprintf(under_locked, sizeof under_locked, "%s/a/b/ceilings.json", locked);
        expect_open_fails(under_locked, SLUICE_EIO, locked, "Permission denied");
    }

    char fresh[512];
    snprintf(fresh, sizeof fresh, "%s/not/yet/ceilings.json", dir);
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = fresh}, &sf),
                 SLUICE_OK);
    struct sluice_lock_record r = record(7, "discover");
    cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK, "the save makes the folder");
}

STATEFILE_TEST(save_then_load_round_trips_ceiling_times_and_policy)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(52, "discover"), back;
    cr_assert_eq(sluice_statefile_save(sf, "cloud:default_ollama", &r), SLUICE_OK);
    cr_assert_eq(sluice_statefile_load(sf, "cloud:default_ollama", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 52);
    cr_expect_eq(back.locked_at_s, r.locked_at_s);
    cr_expect_eq(back.expires_s, r.expires_s);
    cr_expect_str_eq(back.policy, "discover");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:other", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 0, "no record");
    char *text = slurp(path, NULL);
    cr_expect(strstr(text, "\"format\": \"sluice-ceilings\"") && strstr(text, "\"version\": 1"),
              "%s", text);
    cr_expect(strstr(text, "\"cloud:default_ollama\": {\"ceiling\": 52, \"locked_at\": ") != NULL, "%s", text);
    free(text);
    char err[64];
    cr_expect_eq(sluice_statefile_last_error(sf, err, sizeof err), 0);
    cr_expect_str_eq(err, "");
    cr_expect_eq(count_tmp_files(dir), 0);
}

STATEFILE_TEST(a_save_rewrites_only_its_node_and_keeps_every_other_entry_byte_identical)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(7, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "first", &r), SLUICE_OK); /* makes the directories */
    /* Another writer's layout: multi-line, an unknown field, an escaped key, extra members. */
    const char *other = "{\n \"ceiling\" : 40,\"locked_at\":1,\n\t\"expires_at\": 99999999999, \"policy\":\"aimd\", \"note\": [1, {\"x\": \"}\"}]}";
    char text[2048];
    int len = snprintf(text, sizeof text,
                       "{\"version\": 1, \"format\": \"sluice-ceilings\", \"written_by\": {\"tool\": \"x\"},\n"
                       "\"nodes\": {\"caf\\u00e9\": %s,\n\"mine\": {\"ceiling\": 3, \"locked_at\": 1, \"expires_at\": 2, \"policy\": \"discover\"}}}\n",
                       other);
    spit(path, text, (size_t)len);
    r = record(52, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "mine", &r), SLUICE_OK);
    r = record(9, "vegas");
    cr_assert_eq(sluice_statefile_save(sf, "new", &r), SLUICE_OK);
    char *after = slurp(path, NULL);
    char entry[1024];
    snprintf(entry, sizeof entry, "\"caf\\u00e9\": %s", other);
    cr_expect(strstr(after, entry) != NULL, "the other entry changed:\n%s", after);
    cr_expect(strstr(after, "\"written_by\": {\"tool\": \"x\"}") != NULL, "unknown member dropped:\n%s", after);
    struct sluice_lock_record back;
    cr_assert_eq(sluice_statefile_load(sf, "café", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 40);
    cr_assert_eq(sluice_statefile_load(sf, "mine", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 52);
    cr_assert_eq(sluice_statefile_load(sf, "new", &back), SLUICE_OK);
    cr_expect_str_eq(back.policy, "vegas");

    /* Saving "mine" again changes only its own line. */
    r = record(53, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "mine", &r), SLUICE_OK);
    char *again = slurp(path, NULL);
    char *a = strstr(after, "\"new\": "), *b = strstr(again, "\"new\": ");
    cr_assert(a && b);
    cr_expect_eq(strcspn(a, "\n"), strcspn(b, "\n"));
    cr_expect_eq(strncmp(a, b, strcspn(a, "\n")), 0, "\"new\" changed");
    cr_expect(strstr(again, entry) != NULL);
    free(after);
    free(again);
}

STATEFILE_TEST(clear_drops_only_that_node)
{
    open_in_tmp();
    struct sluice_lock_record r = record(10, "discover"), back;
    cr_assert_eq(sluice_statefile_save(sf, "a", &r), SLUICE_OK);
    cr_assert_eq(sluice_statefile_save(sf, "b", &r), SLUICE_OK);
    cr_assert_eq(sluice_statefile_clear(sf, "a"), SLUICE_OK);
    cr_assert_eq(sluice_statefile_load(sf, "a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 0);
    cr_assert_eq(sluice_statefile_load(sf, "b", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 10);
    cr_expect_eq(sluice_statefile_clear(sf, "never-there"), SLUICE_OK);
}

/* ---- bad files -------------------------------------------------------------- */

struct bad_case {
    const char *name;
    const char *text;
    const char *says; /* in the error message */
};

static int64_t future_s(void)
{
    return fixture_now_s() + 86400 * 365;
}

/* What a program's on_event hears of a store event, as the README's server example
 * does: the cause, and the state file's own words. */
struct heard {
    int store_events;
    enum sluice_cause cause;
    char why[1024];
};

static void hear_store_event(void *ctx, const struct sluice_event *ev)
{
    struct heard *h = ctx;
    if (ev->kind != SLUICE_EVENT_STORE)
        return;
    h->store_events++;
    h->cause = ev->cause;
    sluice_statefile_last_error(sf, h->why, sizeof h->why);
}

/* `kept`: someone else's file or a newer sluice's, never replaced. */
static void check_bad_file(const struct bad_case *c, bool kept)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(5, "discover"), back;
    cr_assert_eq(sluice_statefile_save(sf, "x", &r), SLUICE_OK); /* directories */
    spit(path, c->text, strlen(c->text));

    memset(&back, 0xff, sizeof back);
    int status = sluice_statefile_load(sf, "cloud:a", &back);
    cr_expect_eq(status, SLUICE_EINVAL, "%s: load returned %d", c->name, status);
    cr_expect_eq(back.ceiling, 0, "%s: treated as empty", c->name);
    char err[1024];
    cr_expect_gt(sluice_statefile_last_error(sf, err, sizeof err), 0);
    cr_expect(strstr(err, path) != NULL, "%s: message names the file: %s", c->name, err);
    cr_expect(strstr(err, c->says) != NULL, "%s: message \"%s\" lacks \"%s\"", c->name, err, c->says);

    /* An engine over it starts the node empty, with a store event, and keeps working. */
    struct sluice_store_ops ops = sluice_statefile_ops(sf);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    struct heard heard = {0};
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 1,
                                                                   .store = &ops,
                                                                   .on_event = hear_store_event,
                                                                   .on_event_ctx = &heard},
                                      &e),
                 SLUICE_OK);
    cr_expect_eq(heard.store_events, 1, "%s: on_event heard the store event", c->name);
    cr_expect(heard.cause == SLUICE_CAUSE_STORE_CORRUPT, "%s: heard cause %s", c->name,
              sluice_cause_name(heard.cause));
    cr_expect(strstr(heard.why, path) && strstr(heard.why, c->says),
              "%s: the program reads the reason: \"%s\"", c->name, heard.why);
    struct sluice_discovery_status st;
    sluice_engine_status(e, "cloud:a", &st);
    cr_expect_eq(st.state, SLUICE_DISCOVERY_PROBING, "%s", c->name);
    cr_expect_eq(st.last_event.kind, SLUICE_EVENT_STORE, "%s: a store event", c->name);
    cr_expect(st.last_event.cause == SLUICE_CAUSE_STORE_CORRUPT,
              "%s: cause %s (store_corrupt: the file, not the disk)", c->name,
              sluice_cause_name(st.last_event.cause));
    sluice_engine_destroy(e);

    r = record(21, "discover");
    if (kept) {
        /* Its contents are not ours to drop: the save fails, saying what to do, and the
         * file stays byte for byte. */
        cr_expect(strstr(err, "left as it is") != NULL, "%s: %s", c->name, err);
        cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_EIO, "%s", c->name);
        sluice_statefile_last_error(sf, err, sizeof err);
        cr_expect(strstr(err, path) && strstr(err, "move it aside"), "%s: %s", c->name, err);
        char *now = slurp(path, NULL);
        cr_expect_str_eq(now, c->text, "%s: the file was changed", c->name);
        free(now);
        cleanup();
        return;
    }
    /* The next save rewrites it cleanly. */
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK, "%s", c->name);
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK, "%s: after rewrite", c->name);
    cr_expect_eq(back.ceiling, 21);
    char *text = slurp(path, NULL);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    cr_expect_not_null(j, "%s: rewritten file is JSON: %s", c->name, text);
    json_decref(j);
    free(text);
    cleanup();
}

STATEFILE_TEST(empty_torn_corrupt_and_foreign_files_are_errors_and_read_as_empty_and_only_ours_are_replaced)
{
    const struct bad_case cases[] = {
        {"empty", "", "empty"},
        {"torn", "{\n  \"format\": \"sluice-ceilings\",\n  \"version\": 1,\n  \"nodes\": {\n    \"cloud:a\": {\"ceil", "not valid JSON"},
        {"corrupt", "\x7f" "ELF\x01\x02 garbage", "not valid JSON"},
        {"version zero", "{\"format\": \"sluice-ceilings\", \"version\": 0, \"nodes\": {}}", "unknown version 0"},
        {"version wrong type", "{\"format\": \"sluice-ceilings\", \"version\": \"1\", \"nodes\": {}}", "\"version\""},
        {"nodes wrong type", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": []}", "\"nodes\""},
        {"duplicate node", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {}, \"cloud:a\": {}}}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_bad_file(&cases[i], false);
    const struct bad_case kept[] = {
        {"not an object", "[1, 2, 3]", "not a JSON object"},
        {"unknown version", "{\"format\": \"sluice-ceilings\", \"version\": 2, \"nodes\": {}}", "unknown version 2"},
        {"another program's", "{\"my_app_config\": {\"threads\": 8}}", "\"format\""},
        {"foreign format", "{\"format\": \"something-else\", \"version\": 1, \"nodes\": {}}", "\"format\""},
    };
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        check_bad_file(&kept[i], true);
}

STATEFILE_TEST(wrong_typed_out_of_range_and_future_dated_records_are_errors_for_that_node_only)
{
    char future[512];
    snprintf(future, sizeof future,
             "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": "
             "{\"ceiling\": 52, \"locked_at\": %lld, \"expires_at\": %lld, \"policy\": \"discover\"}}}",
             (long long)future_s(), (long long)future_s() + 86400);
    const struct bad_case cases[] = {
        {"future-dated", future, "in the future"},
        {"ceiling is a string", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": \"52\", \"locked_at\": 1, \"expires_at\": 99999999999, \"policy\": \"discover\"}}}", "\"ceiling\""},
        {"ceiling zero", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": 0, \"locked_at\": 1, \"expires_at\": 99999999999, \"policy\": \"discover\"}}}", "\"ceiling\""},
        {"ceiling too big", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": 99999999999, \"locked_at\": 1, \"expires_at\": 99999999999, \"policy\": \"discover\"}}}", "\"ceiling\""},
        {"expires before locked", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": 5, \"locked_at\": 100, \"expires_at\": 50, \"policy\": \"discover\"}}}", "\"expires_at\""},
        {"expires_at a float", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": 5, \"locked_at\": 1, \"expires_at\": 1e11, \"policy\": \"discover\"}}}", "\"expires_at\""},
        {"policy missing", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": {\"ceiling\": 5, \"locked_at\": 1, \"expires_at\": 99999999999}}}", "\"policy\""},
        {"entry not an object", "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {\"cloud:a\": 52}}", "not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_bad_file(&cases[i], false);

    /* A bad record of one node does not hide the others, and is carried over untouched. */
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(5, "discover"), back;
    cr_assert_eq(sluice_statefile_save(sf, "x", &r), SLUICE_OK);
    const char *mixed = "{\"format\": \"sluice-ceilings\", \"version\": 1, \"nodes\": {"
                        "\"bad\": {\"ceiling\": \"lots\"}, "
                        "\"good\": {\"ceiling\": 8, \"locked_at\": 1, \"expires_at\": 99999999999, \"policy\": \"discover\"}}}";
    spit(path, mixed, strlen(mixed));
    cr_expect_eq(sluice_statefile_load(sf, "good", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 8);
    cr_expect_eq(sluice_statefile_load(sf, "bad", &back), SLUICE_EINVAL);
    cr_assert_eq(sluice_statefile_save(sf, "third", &r), SLUICE_OK);
    char *text = slurp(path, NULL);
    cr_expect(strstr(text, "\"bad\": {\"ceiling\": \"lots\"}") != NULL, "%s", text);
    free(text);
}

/* ---- saves run on the state file's writer thread, never in call_end ----------------------- */

/* Take the state file's flock, as another process saving would: until the
 * test lets go, a save waits for it (up to lock_wait_ms). Returns the fd. */
static int hold_flock(const char *path)
{
    char lock[600];
    make_state_dir();
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "%s: %s", lock, strerror(errno));
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    return fd;
}

/* An adaptive node that locks at its first full window (limit 1), on a virtual clock. */
static struct sluice_engine *quick_lock_engine(struct sluice_store_ops *ops, struct fake_clock *mono,
                                               struct sluice_clock *hook,
                                               struct sluice_policy_discover *quick)
{
    atomic_store(&mono->now, 1000 * SLUICE_NS_PER_SEC);
    *hook = fake_clock_hook(mono);
    struct sluice_policy_discover_params params = {.min_samples = 1};
    cr_assert_eq(sluice_policy_discover_init(quick, &params, NULL, 0), SLUICE_OK);
    struct sluice_discovery_desc disc = {.jumpstart = 1, .max_limit = 1, .policy = &quick->base};
    struct sluice_backend_desc b[] = {{.id = "cloud:s", .active = 1, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 1,
                                                                   .store = ops, .clock = hook,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &e),
                 SLUICE_OK, "%s", err);
    return e;
}

/* One call of a virtual second; `close_window` ends it past its window's close. */
static void one_call(struct sluice_pool *p, struct fake_clock *mono, bool close_window)
{
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    fake_clock_advance(mono, SLUICE_NS_PER_SEC);
    if (close_window)
        fake_clock_advance(mono, 60 * SLUICE_NS_PER_SEC);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
}

STATEFILE_TEST(call_end_hands_the_save_to_the_writer_thread_and_never_waits_for_it)
{
    const char *path = open_in_tmp();
    int held = hold_flock(path); /* the latch: the save cannot land until we let go */
    struct sluice_store_ops ops = sluice_statefile_ops(sf);
    struct fake_clock mono;
    struct sluice_clock hook;
    struct sluice_policy_discover quick;
    struct sluice_engine *e = quick_lock_engine(&ops, &mono, &hook, &quick);
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:s");
    one_call(p, &mono, false); /* teaches the latency, opens the first window */
    one_call(p, &mono, true);  /* closes it: lock, and the save is handed off */
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(e, "cloud:s", &st), SLUICE_OK);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED, "the second call_end locked the node");
    /* call_end has returned, and the save is still waiting for the flock. */
    char *text = slurp(path, NULL);
    cr_assert(!text || !strstr(text, "cloud:s"), "the save landed before call_end returned");
    free(text);
    close(held);
    sluice_discovery_sync(sluice_pool_discovery(p)); /* "landed" */
    text = slurp(path, NULL);
    cr_assert(text && strstr(text, "\"cloud:s\""), "sync returned before the save landed");
    free(text);
    struct sluice_lock_record rec;
    cr_assert_eq(sluice_statefile_load(sf, "cloud:s", &rec), SLUICE_OK);
    cr_expect_eq(rec.ceiling, 1);
    cr_assert_eq(sluice_engine_status(e, "cloud:s", &st), SLUICE_OK);
    cr_expect_neq(st.last_event.kind, SLUICE_EVENT_STORE, "the save did not fail");
    sluice_engine_destroy(e);
}

STATEFILE_TEST(saves_queued_behind_a_slow_write_coalesce_and_the_newest_record_per_node_wins)
{
    const char *path = open_in_tmp();
    int held = hold_flock(path);
    char sub[400];
    snprintf(sub, sizeof sub, "%s/state/sluice", dir);
    int watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC); /* counts the file's rewrites */
    cr_assert_geq(watch, 0);
    cr_assert_geq(inotify_add_watch(watch, sub, IN_MOVED_FROM), 0);
    struct sluice_store_ops ops = sluice_statefile_ops(sf);
    /* The first write takes the writer; the rest queue behind it and coalesce. */
    for (uint32_t c = 1; c <= 50; c++) {
        struct sluice_lock_record r = record(c, "discover");
        cr_assert_eq(ops.save(ops.ctx, "cloud:a", &r), SLUICE_OK);
        r.ceiling = 1000 + c;
        cr_assert_eq(ops.save(ops.ctx, "cloud:b", &r), SLUICE_OK);
    }
    cr_assert_eq(ops.clear(ops.ctx, "cloud:b"), SLUICE_OK);
    struct sluice_lock_record r = record(7, "discover");
    cr_assert_eq(ops.save(ops.ctx, "cloud:c", &r), SLUICE_OK);
    close(held);
    cr_assert_eq(ops.sync(ops.ctx, "cloud:a"), SLUICE_OK);
    cr_assert_eq(sluice_statefile_sync(sf, NULL), SLUICE_OK);
    struct sluice_lock_record back;
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 50, "the newest record of cloud:a won");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:b", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 0, "the clear after cloud:b's saves won");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:c", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 7);
    /* Each rewrite renames its own temp file (a unique name, so the kernel
     * never merges two of these events). */
    int renames = 0;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (ssize_t n; (n = read(watch, buf, sizeof buf)) > 0;)
        for (char *at = buf; at < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)(void *)at;
            renames += strstr(ev->name, ".tmp.") != NULL;
            at += sizeof *ev + ev->len;
        }
    close(watch);
    cr_expect_geq(renames, 2, "cloud:a and cloud:c were written");
    cr_expect_leq(renames, 4, "100 saves and a clear of 3 nodes took %d rewrites: they did not "
                              "coalesce", renames);
    (void)path;
}

/* ---- what is at the path: a file too large, symbolic links ------------------------------------ */

STATEFILE_TEST(a_file_over_the_size_limit_is_rewritten_by_the_next_save_as_its_message_says)
{
    const char *path = open_in_tmp();
    make_state_dir();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)SLUICE_STATEFILE_MAX_BYTES + 1), 0); /* sparse: quick */
    close(fd);
    struct sluice_lock_record r = record(21, "discover"), back;
    cr_expect_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_EINVAL);
    expect_last_error("over the", "the next save rewrites it");
    uint64_t failures = sluice_statefile_last_error(sf, NULL, 0);
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK, "the save did not rewrite it");
    cr_expect_eq(sluice_statefile_last_error(sf, NULL, 0), failures, "the save succeeded");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 21);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_lt(st.st_size, 4096, "a clean small file replaced it");
}

STATEFILE_TEST(a_symlinked_state_file_is_written_through_its_link_and_the_link_survives)
{
    const char *path = open_in_tmp();
    make_state_dir();
    char real_dir[400], real[500], real_lock[600], link_lock[600];
    snprintf(real_dir, sizeof real_dir, "%s/elsewhere", dir);
    cr_assert_eq(mkdir(real_dir, 0700), 0);
    snprintf(real, sizeof real, "%s/ceilings.json", real_dir);
    snprintf(real_lock, sizeof real_lock, "%s.lock", real);
    snprintf(link_lock, sizeof link_lock, "%s.lock", path);
    /* A relative link, dangling until the first save makes its target. */
    cr_assert_eq(symlink("../../elsewhere/ceilings.json", path), 0, "%s", strerror(errno));
    struct sluice_lock_record r = record(33, "discover"), back;
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK);
    r.ceiling = 34;
    cr_assert_eq(sluice_statefile_save(sf, "cloud:b", &r), SLUICE_OK);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "the save replaced the link with a regular file");
    cr_assert_eq(lstat(real, &st), 0, "the link's target was written");
    cr_expect(S_ISREG(st.st_mode));
    char *text = slurp(real, NULL);
    cr_expect(text && strstr(text, "\"cloud:a\"") && strstr(text, "\"cloud:b\""), "%s", text);
    free(text);
    cr_expect_eq(lstat(real_lock, &st), 0, "the lock file sits beside the file it locks");
    cr_expect_neq(lstat(link_lock, &st), 0, "no second lock file beside the link");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 33, "read back through the link");
    cr_expect_eq(count_tmp_files(real_dir), 0);
}

STATEFILE_TEST(a_symlink_at_the_lock_path_is_never_followed)
{
    const char *path = open_in_tmp();
    make_state_dir();
    char lock[600], victim[400];
    snprintf(lock, sizeof lock, "%s.lock", path);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    cr_assert_eq(symlink(victim, lock), 0); /* dangling */
    struct sluice_lock_record r = record(5, "discover"), back;
    cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_EIO);
    expect_last_error(lock, "is a symbolic link");
    struct stat st;
    cr_expect_neq(lstat(victim, &st), 0, "the link's target was created");
    cr_expect_neq(lstat(path, &st), 0, "nothing was written without the lock");
    /* Pointing at an existing file changes nothing. */
    int fd = open(victim, O_WRONLY | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_EIO);
    unlink(lock);
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK, "a real lock file works");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 5);
    cr_assert_eq(lstat(lock, &st), 0);
    cr_expect(S_ISREG(st.st_mode));
}
