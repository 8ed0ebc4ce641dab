/*
 * The state file across processes and over HTTP: a read-only directory and
 * a full disk (in a child, as an unprivileged user when run as root),
 * several processes saving at once, a discovered lock that outlives its
 * process, a clear over the admin endpoint, and a FIFO at the path that
 * sluicectl reports. The tests that run in one process are
 * tests/shim/statefile.c.
 */
#include <sys/resource.h>

#include "admin_fixture.h"
#include "run_fixtures.h"
#include "shim/statefile_fixture.h"

/* ---- a read-only directory and a full disk ------------------------------------------- */

/* Run fn in a child process (as an unprivileged user when we are root, so permissions
 * bite); its exit code is the result, its stderr explains a failure. */
static int in_child(int (*fn)(const char *path), const char *path, bool drop_root)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (drop_root && geteuid() == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0)
                _exit(90);
        }
        _exit(fn(path));
    }
    int ws;
    waitpid(pid, &ws, 0);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 100 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

static int readonly_child(const char *path)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        return 10;
    /* The saved lock is still readable. */
    struct sluice_lock_record back;
    if (sluice_statefile_load(f, "cloud:a", &back) != SLUICE_OK || back.ceiling != 12)
        return 11;
    struct sluice_lock_record r = fixture_lock(30, 3600);
    if (sluice_statefile_save(f, "cloud:b", &r) != SLUICE_EIO)
        return 12;
    char err[1024];
    sluice_statefile_last_error(f, err, sizeof err);
    if (!strstr(err, path) || !strstr(err, "Permission denied")) {
        fprintf(stderr, "message: %s\n", err);
        return 13;
    }
    /* An engine restores from it, and a clear that cannot be persisted still clears in
     * memory (a store event says why) while the node keeps serving. */
    struct sluice_store_ops ops = sluice_statefile_ops(f);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 1, .store = &ops}, &e) != SLUICE_OK)
        return 14;
    struct sluice_discovery_status st;
    sluice_engine_status(e, "cloud:a", &st);
    if (st.state != SLUICE_DISCOVERY_LOCKED || st.ceiling != 12)
        return 15;
    sluice_engine_clear(e, "cloud:a");
    sluice_engine_sync(e, "cloud:a");
    sluice_engine_status(e, "cloud:a", &st);
    if (st.state != SLUICE_DISCOVERY_PROBING || st.last_event.kind != SLUICE_EVENT_STORE ||
        st.last_event.cause != SLUICE_CAUSE_STORE_ERROR) {
        fprintf(stderr, "state %d last event %s/%s\n", st.state,
                sluice_event_kind_name(st.last_event.kind), sluice_cause_name(st.last_event.cause));
        return 16;
    }
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:a");
    struct sluice_call call;
    if (sluice_pool_call_begin(p, NULL, NULL, &call) != SLUICE_OK)
        return 17;
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    sluice_engine_destroy(e);
    sluice_statefile_close(f);
    return 0;
}

STATEFILE_TEST(a_read_only_directory_fails_writes_clearly_and_the_engine_serves_from_memory)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(FIXTURE_LOCKED_CEILING, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK);
    char *before = slurp(path, NULL);
    char sub[400];
    snprintf(sub, sizeof sub, "%s/state/sluice", dir);
    /* Let the unprivileged child read everything, then take write permission away. */
    chmod(dir, 0755);
    snprintf(sub, sizeof sub, "%s/state", dir);
    chmod(sub, 0755);
    snprintf(sub, sizeof sub, "%s/state/sluice", dir);
    chmod(path, 0644);
    cr_assert_eq(chmod(sub, 0555), 0);
    int rc = in_child(readonly_child, path, true);
    cr_expect_eq(rc, 0, "read-only child failed at step %d", rc);
    chmod(sub, 0700);
    char *after = slurp(path, NULL);
    cr_expect_str_eq(after, before, "the file is untouched");
    free(before);
    free(after);
}

static int full_disk_child(const char *path)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64, 64}; /* any write past 64 bytes fails with EFBIG */
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
        return 20;
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        return 21;
    struct sluice_lock_record r = fixture_lock(30, 3600);
    if (sluice_statefile_save(f, "cloud:b", &r) != SLUICE_EIO)
        return 22;
    char err[1024];
    sluice_statefile_last_error(f, err, sizeof err);
    if (!strstr(err, "cannot write") || !strstr(err, "File too large") ||
        !strstr(err, "old file is unchanged")) {
        fprintf(stderr, "message: %s\n", err);
        return 23;
    }
    sluice_statefile_close(f);
    return 0;
}

STATEFILE_TEST(a_full_disk_fails_the_save_leaving_the_old_file_and_no_temp_file)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(12, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK);
    char *before = slurp(path, NULL);
    cr_expect_eq(in_child(full_disk_child, path, false), 0);
    char *after = slurp(path, NULL);
    cr_expect_str_eq(after, before);
    char sub[400];
    snprintf(sub, sizeof sub, "%s/state/sluice", dir);
    cr_expect_eq(count_tmp_files(sub), 0, "the temp file was removed");
    free(before);
    free(after);
}

/* ---- several processes ----------------------------------------------------------- */

enum { WRITERS = 4, ROUNDS = 40 };

static int writer_child(const char *path, int id)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        return 30;
    char node[32];
    snprintf(node, sizeof node, "cloud:w%d", id);
    for (int i = 1; i <= ROUNDS; i++) {
        struct sluice_lock_record r = fixture_lock((uint32_t)(id * 1000 + i), 3600);
        if (sluice_statefile_save(f, node, &r) != SLUICE_OK)
            return 31;
    }
    sluice_statefile_close(f);
    return 0;
}

static int reader_child(const char *path)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        return 40;
    for (int i = 0; i < 400; i++) {
        struct sluice_lock_record r;
        if (sluice_statefile_load(f, "cloud:w1", &r) != SLUICE_OK) {
            char err[512];
            sluice_statefile_last_error(f, err, sizeof err);
            fprintf(stderr, "reader saw a bad file: %s\n", err);
            return 41;
        }
    }
    sluice_statefile_close(f);
    return 0;
}

STATEFILE_TEST(processes_saving_different_nodes_at_once_all_keep_their_saves)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(1, "discover");
    cr_assert_eq(sluice_statefile_save(sf, "seed", &r), SLUICE_OK);
    pid_t pids[WRITERS + 1];
    for (int w = 0; w <= WRITERS; w++) {
        fflush(NULL);
        pids[w] = fork();
        cr_assert_geq(pids[w], 0);
        if (pids[w] == 0)
            _exit(w < WRITERS ? writer_child(path, w + 1) : reader_child(path));
    }
    for (int w = 0; w <= WRITERS; w++) {
        int ws;
        waitpid(pids[w], &ws, 0);
        cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "process %d: status %d", w, ws);
    }
    for (int w = 1; w <= WRITERS; w++) {
        char node[32];
        snprintf(node, sizeof node, "cloud:w%d", w);
        struct sluice_lock_record back;
        cr_assert_eq(sluice_statefile_load(sf, node, &back), SLUICE_OK);
        cr_expect_eq(back.ceiling, (uint32_t)(w * 1000 + ROUNDS), "%s kept its last save", node);
    }
    cr_assert_eq(sluice_statefile_load(sf, "seed", &r), SLUICE_OK);
    cr_expect_eq(r.ceiling, 1);
}

/* ---- a discovered lock outlives its process ------------------------------------------ */

/*
 * Drive an adaptive node to a lock in virtual time: waves of `limit` calls,
 * all in flight at once (saturated), each a virtual second long, until it
 * locks at max_limit. Returns the ceiling, or 0.
 */
static uint32_t drive_to_lock(struct sluice_engine *e, struct fake_clock *mono, const char *node)
{
    struct sluice_pool *p = sluice_engine_pool(e, node);
    struct sluice_call calls[64];
    for (int wave = 0; wave < 30; wave++) {
        struct sluice_discovery_status st;
        sluice_engine_status(e, node, &st);
        if (st.state == SLUICE_DISCOVERY_LOCKED)
            return st.ceiling;
        uint32_t n = st.limit < 64 ? st.limit : 64;
        for (uint32_t i = 0; i < n; i++)
            if (sluice_pool_call_begin(p, NULL, NULL, &calls[i]) != SLUICE_OK)
                return 0;
        fake_clock_advance(mono, SLUICE_NS_PER_SEC);
        for (uint32_t i = 0; i < n; i++)
            sluice_pool_call_end(p, &calls[i], SLUICE_OUTCOME_OK, 0);
        fake_clock_advance(mono, 60 * SLUICE_NS_PER_SEC);
        sluice_engine_poll(e);
        sluice_discovery_sync(sluice_pool_discovery(p));
    }
    return 0;
}

static int discover_child(const char *path)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        return 50;
    struct fake_clock mono = {.now = 1000 * SLUICE_NS_PER_SEC};
    struct sluice_clock hook = fake_clock_hook(&mono);
    struct sluice_store_ops ops = sluice_statefile_ops(f);
    struct sluice_discovery_desc disc = {.jumpstart = 8}; /* the policy needs 8 calls a window */
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc},
                                      {.id = "cloud:b", .active = 16, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 2,
                                                          .store = &ops, .clock = &hook},
                             &e) != SLUICE_OK)
        return 51;
    uint32_t ceiling = drive_to_lock(e, &mono, "cloud:a");
    if (ceiling != 16) {
        fprintf(stderr, "locked at %u\n", ceiling);
        return 52;
    }
    sluice_engine_destroy(e);
    sluice_statefile_close(f);
    return 0;
}

STATEFILE_TEST(a_lock_discovered_by_one_process_restores_locked_in_the_next)
{
    const char *path = open_in_tmp();
    cr_assert_eq(in_child(discover_child, path, false), 0, "the first process did not lock");
    struct sluice_lock_record rec;
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &rec), SLUICE_OK);
    cr_expect_eq(rec.ceiling, 16);
    cr_expect_str_eq(rec.policy, "discover");
    cr_expect(rec.locked_at_s <= fixture_now_s() && rec.locked_at_s > fixture_now_s() - 60);
    cr_expect_eq(rec.expires_s - rec.locked_at_s, 86400, "locked for 24 h");

    /* The next process: 🔒 from the first request, with a restore event. */
    struct sluice_store_ops ops = sluice_statefile_ops(sf);
    struct sluice_discovery_desc disc = {.jumpstart = 8}; /* the policy needs 8 calls a window */
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 16, .discovery = &disc},
                                      {.id = "cloud:b", .active = 16, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 2,
                                                                   .store = &ops},
                                      &e),
                 SLUICE_OK);
    char line[128];
    sluice_engine_status_line(e, "cloud:a", line, sizeof line);
    cr_expect_str_eq(line, "cloud:a 0/16 🔒");
    struct sluice_event ev;
    uint64_t cursor = 0;
    cr_assert_eq(sluice_event_ring_read(sluice_engine_events(e, "cloud:a"), &cursor, &ev, 1, NULL), 1);
    cr_expect_eq(ev.kind, SLUICE_EVENT_RESTORE);
    cr_expect_eq(ev.new_limit, 16);
    sluice_engine_status_line(e, "cloud:b", line, sizeof line);
    cr_expect_str_eq(line, "cloud:b 0/8 📈", "the other node was never locked");
    sluice_engine_destroy(e);

    /* An expired lock is dropped: the node starts probing. */
    rec.locked_at_s = fixture_now_s() - 90000;
    rec.expires_s = fixture_now_s() - 10;
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &rec), SLUICE_OK);
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 2,
                                                                   .store = &ops},
                                      &e),
                 SLUICE_OK);
    sluice_engine_status_line(e, "cloud:a", line, sizeof line);
    cr_expect_str_eq(line, "cloud:a 0/8 📈");
    sluice_engine_destroy(e);
}

/* ---- clear through the API and over HTTP, with the state file as the store ------------------ */

static char *line_of(const char *text, const char *node)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\": ", node);
    const char *p = strstr(text, key);
    return p ? strndup(p, strcspn(p, "\n")) : NULL;
}

static void expect_node(struct sluice_engine *e, const char *node, const char *line)
{
    char got[128];
    sluice_engine_status_line(e, node, got, sizeof got);
    cr_expect_str_eq(got, line, "%s", node);
}

STATEFILE_TEST(clear_through_the_api_and_over_http_drops_only_that_nodes_lock)
{
    const char *path = open_in_tmp();
    struct sluice_lock_record r = record(20, "discover");
    const char *nodes[] = {"cloud:a", "cloud:b", "cloud:c"};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sluice_statefile_save(sf, nodes[i], &r), SLUICE_OK);
    char *before = slurp(path, NULL);
    struct sluice_store_ops ops = sluice_statefile_ops(sf);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc b[] = {{.id = "cloud:a", .active = 64, .discovery = &disc},
                                      {.id = "cloud:b", .active = 64, .discovery = &disc},
                                      {.id = "cloud:c", .active = 64, .discovery = &disc},
                                      {.id = "local:gpu", .active = 4}};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b, .n_backends = 4, .store = &ops}, &e),
                 SLUICE_OK);
    struct sluice_admin *a = NULL;
    cr_assert_eq(sluice_admin_start(&(struct sluice_admin_desc){.engine = e, .port = SLUICE_SOME(0)}, &a),
                 SLUICE_OK);

    /* The C API. */
    cr_assert_eq(sluice_engine_clear(e, "cloud:a"), SLUICE_OK);
    cr_assert_eq(sluice_engine_sync(e, "cloud:a"), SLUICE_OK);
    expect_node(e, "cloud:a", "cloud:a 0/5 📈");
    expect_node(e, "cloud:b", "cloud:b 0/20 🔒");
    expect_node(e, "cloud:c", "cloud:c 0/20 🔒");
    expect_node(e, "local:gpu", "local:gpu 0/4");
    char *mid = slurp(path, NULL);
    cr_expect_null(line_of(mid, "cloud:a"), "cloud:a's lock left the file");
    for (int i = 1; i < 3; i++) {
        char *x = line_of(before, nodes[i]), *y = line_of(mid, nodes[i]);
        cr_expect_str_eq(y, x, "%s untouched", nodes[i]);
        free(x);
        free(y);
    }

    /* HTTP POST, as the reference's curl line does. */
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%u", sluice_admin_port(a));
    struct reply rep = http("POST", base, "/compute/concurrency/clear?node_id=cloud:b", NULL, NULL);
    cr_expect_eq(rep.status, 200, "%s", rep.body);
    reply_free(&rep);
    expect_node(e, "cloud:b", "cloud:b 0/5 📈");
    expect_node(e, "cloud:c", "cloud:c 0/20 🔒");
    char *after = slurp(path, NULL);
    cr_expect_null(line_of(after, "cloud:b"), "the answer came after the file dropped cloud:b");
    char *x = line_of(before, "cloud:c"), *y = line_of(after, "cloud:c");
    cr_expect_str_eq(y, x);
    free(x);
    free(y);

    sluice_admin_stop(a);
    sluice_engine_destroy(e);
    free(before);
    free(mid);
    free(after);
}

/* ---- a FIFO at the state or lock path ----------------------------------------------------- */

STATEFILE_TEST(a_fifo_at_the_state_or_lock_path_is_refused_at_once_never_waited_on)
{
    const char *path = open_in_tmp();
    make_state_dir();
    cr_assert_eq(mkfifo(path, 0600), 0, "%s", strerror(errno));
    /* No writer ever opens the FIFO: an open that waits for one would hang
     * here (the test's timeout turns that into a failure). */
    struct sluice_lock_record r = record(9, "discover"), back;
    cr_expect_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_EIO);
    expect_last_error(path, "is a FIFO, not a regular file");
    cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_EIO);
    cr_expect_eq(sluice_statefile_clear(sf, "cloud:a"), SLUICE_EIO);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was left alone, not replaced");
    const char *argv[] = {SLUICECTL_PATH, "status", "--state", path, NULL};
    struct proc_result *res = proc_run(argv, NULL, 10000);
    cr_expect_not(res->timed_out, "sluicectl status hung on the FIFO");
    cr_expect_neq(res->exit_code, 0);
    cr_expect(strstr(res->err, "FIFO"), "sluicectl says why: %s", res->err);
    free(res);

    /* A FIFO where the lock file goes: the write is refused, the state file untouched. */
    unlink(path);
    cr_assert_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_OK);
    char lock[600];
    snprintf(lock, sizeof lock, "%s.lock", path);
    unlink(lock);
    cr_assert_eq(mkfifo(lock, 0600), 0);
    r.ceiling = 10;
    cr_expect_eq(sluice_statefile_save(sf, "cloud:a", &r), SLUICE_EIO);
    expect_last_error(lock, "is a FIFO, not a regular file");
    cr_assert_eq(sluice_statefile_load(sf, "cloud:a", &back), SLUICE_OK);
    cr_expect_eq(back.ceiling, 9);
}
