/*
 * Crash safety of the state file: a writer killed with SIGKILL at random
 * moments of its saves, hundreds of times, while another process reads the
 * file without pause; and a real full disk (a tiny tmpfs) under an engine.
 *
 * The kill test: a child process saves node "hot" over and over, each save
 * one more than the last (ceiling N+1, N+2, ...), counting in shared memory
 * the saves it started and finished; the test kills it at a random moment
 * within about two save times of its first save (measured at the start), so
 * kills land in every phase: building the text, writing the temp file,
 * fsync, rename, the directory fsync (in /dev/shm when there is one:
 * SIGKILL leaves the page cache intact, so the outcome is the same on any
 * file system, and memory keeps 500 kills at about 2 s). After each kill the file must be
 * exactly the old version or the new one — byte for byte what a clean save
 * of that ceiling writes, with the other two nodes untouched — and a save
 * by the test must go through at once (the dead writer's flock is gone)
 * and sweep the temp files the killed writers left. A reader process loads and walks the file all the while; every read must
 * find a whole file, and the reader must never crash.
 *
 * The full-disk test mounts a 64 KiB tmpfs (we are root in CI; where mount
 * is not permitted it says so and skips: tests/e2e/statefile.c covers a
 * refused write with RLIMIT_FSIZE), fills it, and checks that a save fails
 * with SLUICE_EIO and a message naming the file and "No space left on
 * device", leaves the old file and no temp file, that an engine using the
 * file reports the failed clear as a "store" event (cause store_error) and
 * keeps serving, and that the old lock survives for the next process.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <sluice/statefile.h>

#include "admin_fixture.h"
#include "common.h"
#include "shim/file_fixture.h"

#define KILLS 500      /* "hundreds of times" */
#define KEEP_A 7u      /* ceilings of the two nodes no one writes */
#define KEEP_B 9u
#define SAVE_WAIT_MS 5000 /* bound on waiting for a child's first save */

static char dir[256], scratch_dir[256], mnt[256];
static pid_t kids[2];

/*
 * A temp dir in memory when /dev/shm is there, else under /tmp. SIGKILL leaves
 * the page cache intact, so what a killed save leaves behind is the same on
 * any file system; memory only makes each save (and so each kill) cheap.
 */
static void shm_tmpdir(char *out, size_t size)
{
    snprintf(out, size, "/dev/shm/sluice-e2e-XXXXXX");
    if (!mkdtemp(out))
        fixture_tmpdir(out, size);
}

static void rm_tmpdir(char *d)
{
    if (!strncmp(d, "/dev/shm/sluice-e2e-", 20) && strlen(d) < 40) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
        if (system(cmd) != 0) {
            /* best effort: a leftover temp dir is not a test failure */
        }
    } else {
        fixture_rmtree(d);
    }
    d[0] = '\0';
}

__attribute__((unused)) static void cleanup(void) /* .fini; the TSan stand-in ignores it */
{
    for (int i = 0; i < 2; i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            kids[i] = 0;
        }
    if (mnt[0]) {
        umount2(mnt, MNT_DETACH);
        rmdir(mnt);
        mnt[0] = '\0';
    }
    rm_tmpdir(dir);
    rm_tmpdir(scratch_dir);
}

#define CRASH_TEST(name, secs) Test(crash, name, .fini = cleanup, .timeout = secs)

/* What the writer and the reader tell the test, in memory shared across fork. */
struct shared {
    _Atomic(uint64_t) started, finished; /* the writer's saves of this round */
    _Atomic(int) stop_reader;
    _Atomic(uint64_t) reads, bad_reads;
    char first_bad[512];
};

static struct sluice_lock_record rec(uint32_t ceiling)
{
    return fixture_lock(ceiling, 3600);
}

static struct sluice_statefile *open_file(const char *path, uint32_t lock_wait_ms)
{
    struct sluice_statefile *f = NULL;
    char err[256] = "";
    int status = sluice_statefile_open(
        &(struct sluice_statefile_desc){.path = path, .lock_wait_ms = lock_wait_ms, .error = err,
                                        .error_size = sizeof err},
        &f);
    cr_assert_eq(status, SLUICE_OK, "open %s: %s", path, err);
    return f;
}

static int64_t now_us(void)
{
    return sluice_monotonic_ns() / 1000;
}

/* ---- the children ------------------------------------------------------------ */

/* Save "hot" as one more than the file holds, forever (until killed). */
static void writer_main(const char *path, struct shared *sh)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path, .lock_wait_ms = 2000},
                              &f) != SLUICE_OK)
        _exit(3);
    struct sluice_lock_record r;
    if (sluice_statefile_load(f, "hot", &r) != SLUICE_OK)
        _exit(4);
    for (;;) {
        r.ceiling++;
        atomic_fetch_add(&sh->started, 1);
        if (sluice_statefile_save(f, "hot", &r) != SLUICE_OK)
            _exit(5);
        atomic_fetch_add(&sh->finished, 1);
    }
}

static int count_node(void *ctx, const char *node, const struct sluice_lock_record *r,
                      const char *problem)
{
    (void)node;
    if (problem || !r)
        return 1;
    ++*(int *)ctx;
    return 0;
}

/* Load and walk the file until told to stop; every read must see a whole file. */
static void reader_main(const char *path, struct shared *sh)
{
    struct sluice_statefile *f;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, &f) != SLUICE_OK)
        _exit(6);
    while (!atomic_load(&sh->stop_reader)) {
        struct sluice_lock_record r;
        int nodes = 0;
        int status = sluice_statefile_load(f, "hot", &r);
        if (status == SLUICE_OK)
            status = sluice_statefile_foreach(f, count_node, &nodes);
        if (status != SLUICE_OK || nodes != 3 || r.ceiling == 0) {
            if (atomic_fetch_add(&sh->bad_reads, 1) == 0) {
                char err[400];
                sluice_statefile_last_error(f, err, sizeof err);
                snprintf(sh->first_bad, sizeof sh->first_bad, "status %s, %d nodes: %s",
                         sluice_status_name(status), nodes, err);
            }
        }
        atomic_fetch_add(&sh->reads, 1);
    }
    sluice_statefile_close(f);
    _exit(0);
}

static pid_t spawn(void (*fn)(const char *, struct shared *), const char *path, struct shared *sh)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0)
        fn(path, sh);
    return pid;
}

/* ---- checks ------------------------------------------------------------------ */

/* The bytes a clean save of hot = `ceiling` over `base` writes (done in a scratch file). */
static char *expected_file(const char *base, size_t base_len, uint32_t ceiling,
                           const struct sluice_lock_record *hot, size_t *len)
{
    char path[400];
    snprintf(path, sizeof path, "%s/expected.json", scratch_dir);
    spit(path, base, base_len);
    struct sluice_statefile *f = open_file(path, 1000);
    struct sluice_lock_record r = *hot;
    r.ceiling = ceiling;
    cr_assert_eq(sluice_statefile_save(f, "hot", &r), SLUICE_OK);
    sluice_statefile_close(f);
    return slurp(path, len);
}

static int64_t median_save_us(struct sluice_statefile *f, struct sluice_lock_record *hot)
{
    int64_t t[15];
    for (int i = 0; i < 15; i++) {
        int64_t t0 = now_us();
        cr_assert_eq(sluice_statefile_save(f, "hot", hot), SLUICE_OK);
        t[i] = now_us() - t0;
    }
    for (int i = 1; i < 15; i++) /* insertion sort, 15 values */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            int64_t x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[7] > 1 ? t[7] : 1;
}

CRASH_TEST(a_save_killed_at_any_moment_leaves_the_old_or_the_new_file_and_readers_never_crash, 120)
{
    shm_tmpdir(dir, sizeof dir);
    shm_tmpdir(scratch_dir, sizeof scratch_dir);
    char path[400];
    snprintf(path, sizeof path, "%s/ceilings.json", dir);
    struct sluice_statefile *f = open_file(path, 1000);
    struct sluice_lock_record a = rec(KEEP_A), b = rec(KEEP_B), hot = rec(1);
    cr_assert_eq(sluice_statefile_save(f, "keep:a", &a), SLUICE_OK);
    cr_assert_eq(sluice_statefile_save(f, "hot", &hot), SLUICE_OK);
    cr_assert_eq(sluice_statefile_save(f, "keep:b", &b), SLUICE_OK);
    int64_t save_us = median_save_us(f, &hot);

    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                             -1, 0);
    cr_assert_neq(sh, MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    kids[1] = spawn(reader_main, path, sh);

    uint64_t rng = (uint64_t)now_us();
    int mid_save = 0, new_seen = 0;
    for (int k = 0; k < KILLS; k++) {
        size_t old_len;
        char *old = slurp(path, &old_len);
        atomic_store(&sh->started, 0);
        atomic_store(&sh->finished, 0);
        kids[0] = spawn(writer_main, path, sh);
        int64_t give_up = now_us() + SAVE_WAIT_MS * 1000;
        while (atomic_load(&sh->started) == 0) {
            int ws;
            cr_assert_eq(waitpid(kids[0], &ws, WNOHANG), 0, "the writer exited (status 0x%x)",
                         (unsigned)ws);
            cr_assert_lt(now_us(), give_up, "the writer never started a save");
            sched_yield();
        }
        int64_t delay = (int64_t)(test_rand(&rng) % (uint64_t)(2 * save_us));
        for (int64_t until = now_us() + delay; now_us() < until;)
            sluice_cpu_relax();
        kill(kids[0], SIGKILL);
        int ws;
        cr_assert_eq(waitpid(kids[0], &ws, 0), kids[0]);
        kids[0] = 0;
        cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL,
                  "the writer failed on its own (status 0x%x)", (unsigned)ws);
        uint64_t started = atomic_load(&sh->started), finished = atomic_load(&sh->finished);

        /* Old or new, byte for byte. */
        struct sluice_lock_record got;
        int status = sluice_statefile_load(f, "hot", &got);
        char err[512] = "";
        sluice_statefile_last_error(f, err, sizeof err);
        cr_assert_eq(status, SLUICE_OK, "kill %d: the file does not load: %s", k, err);
        uint32_t before = hot.ceiling;
        cr_assert(got.ceiling == before + finished || got.ceiling == before + started,
                  "kill %d: hot is %u; the writer finished %" PRIu64 " saves from %u and started "
                  "%" PRIu64,
                  k, got.ceiling, finished, before, started);
        size_t len, want_len;
        char *now = slurp(path, &len);
        char *want = expected_file(old, old_len, got.ceiling, &hot, &want_len);
        cr_assert(len == want_len && memcmp(now, want, len) == 0,
                  "kill %d: the file is not what a clean save writes:\n%s\nexpected:\n%s", k, now,
                  want);
        free(old);
        free(now);
        free(want);
        /* Killed inside a save: before its rename (the old file) or after it (the new). */
        mid_save += started != finished && got.ceiling == before + finished;
        new_seen += started != finished && got.ceiling == before + started;
        hot.ceiling = got.ceiling;
        /* The dead writer's flock is gone: a save goes through at once. */
        if (k % 10 == 9) {
            hot.ceiling++;
            cr_assert_eq(sluice_statefile_save(f, "hot", &hot), SLUICE_OK,
                         "kill %d: a save after the kill failed", k);
        }
    }
    /* Killed writers leave their temp files; the next save (under the flock) sweeps them. */
    cr_assert_eq(count_tmp_files(dir), 0, "%d temp files of killed writers are left after a save",
                 count_tmp_files(dir));
    atomic_store(&sh->stop_reader, 1);
    int ws;
    cr_assert_eq(waitpid(kids[1], &ws, 0), kids[1]);
    kids[1] = 0;
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the reader crashed or failed (status 0x%x)",
              (unsigned)ws);
    cr_assert_eq(atomic_load(&sh->bad_reads), 0, "%" PRIu64 " of %" PRIu64 " reads saw a bad "
                 "file; the first: %s", atomic_load(&sh->bad_reads), atomic_load(&sh->reads),
                 sh->first_bad);
    cr_assert_gt(atomic_load(&sh->reads), 0);
    /* At least a quarter of the kills must have landed inside a save, and
     * some before its rename. (A save is handed to the state file's writer
     * thread and waited for, so the rename is only part of the caller's
     * wait: kills inside a save land before or after it.) */
    cr_assert_geq(mid_save + new_seen, KILLS / 4, "only %d of %d kills landed inside a save "
                  "(median save %" PRId64 " us): the test did not test", mid_save + new_seen,
                  KILLS, save_us);
    cr_assert_gt(mid_save, KILLS / 50, "only %d of %d kills cut a save short of its rename",
                 mid_save, KILLS);
    cr_log_info("%d kills (%d before the rename, %d after it; median save %" PRId64
                " us), %" PRIu64 " whole reads",
                KILLS, mid_save, new_seen, save_us, atomic_load(&sh->reads));
    munmap(sh, sizeof *sh);
    sluice_statefile_close(f);
}

/* ---- a full disk -------------------------------------------------------------- */

static struct sluice_event store_events[8];
static _Atomic(int) n_store_events;

static void on_event(void *ctx, const struct sluice_event *ev)
{
    (void)ctx;
    if (ev->kind == SLUICE_EVENT_STORE) {
        int i = atomic_fetch_add(&n_store_events, 1);
        if (i < 8)
            store_events[i] = *ev;
    }
}

/* Mount a tmpfs of `size` at a new temp dir (in a private mount namespace when we
 * may have one, so the mount dies with the test process); false if not permitted. */
static bool mount_tiny_tmpfs(const char *size)
{
    snprintf(mnt, sizeof mnt, "/tmp/sluice-e2e-XXXXXX");
    cr_assert_not_null(mkdtemp(mnt));
    if (unshare(CLONE_NEWNS) == 0)
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    char opts[64];
    snprintf(opts, sizeof opts, "size=%s,mode=0700", size);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
        fprintf(stderr, "SKIP: cannot mount a tmpfs at %s (%s): the full-disk test needs "
                        "CAP_SYS_ADMIN; tests/e2e/statefile.c still covers a refused write\n",
                mnt, strerror(errno));
        rmdir(mnt);
        mnt[0] = '\0';
        return false;
    }
    return true;
}

/* Write until the file system says ENOSPC; returns the bytes written. */
static size_t fill(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    static char block[4096];
    size_t total = 0;
    for (;;) {
        ssize_t n = write(fd, block, sizeof block);
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        cr_assert(n < 0 && errno == ENOSPC, "filling: %s", strerror(errno));
        break;
    }
    close(fd);
    return total;
}

CRASH_TEST(a_full_disk_fails_saves_with_a_clear_error_and_a_store_event_and_the_old_lock_survives,
           30)
{
    if (!mount_tiny_tmpfs("64k")) {
#ifdef cr_skip_test
        cr_skip_test("mount not permitted");
#endif
        return;
    }
    char path[400], filler[400];
    snprintf(path, sizeof path, "%s/ceilings.json", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    struct sluice_statefile *f = open_file(path, 1000);
    struct sluice_lock_record locked = rec(12);
    cr_assert_eq(sluice_statefile_save(f, "cloud:x", &locked), SLUICE_OK);
    size_t old_len;
    char *old = slurp(path, &old_len);
    cr_assert_gt(fill(filler), 0);

    /* The file's own save. */
    struct sluice_lock_record other = rec(30);
    cr_assert_eq(sluice_statefile_save(f, "cloud:y", &other), SLUICE_EIO);
    char err[1024];
    sluice_statefile_last_error(f, err, sizeof err);
    cr_assert(strstr(err, path) && strstr(err, "No space left on device") &&
                  strstr(err, "the old file is unchanged"),
              "the message names the file and the cause: %s", err);
    cr_assert_eq(count_tmp_files(mnt), 0, "the temp file was removed");

    /* An engine restores the lock; its clear cannot be persisted: a store event, and the
     * node keeps serving from memory. */
    struct sluice_store_ops ops = sluice_statefile_ops(f);
    struct sluice_discovery_desc disc = {0};
    struct sluice_backend_desc bd[] = {{.id = "cloud:x", .active = 16, .discovery = &disc}};
    struct sluice_engine *e = NULL;
    char eerr[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = bd, .n_backends = 1,
                                                                   .store = &ops,
                                                                   .on_event = on_event,
                                                                   .error = eerr,
                                                                   .error_size = sizeof eerr},
                                      &e),
                 SLUICE_OK, "%s", eerr);
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(e, "cloud:x", &st), SLUICE_OK);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_LOCKED);
    cr_assert_eq(st.ceiling, 12);
    cr_assert_eq(sluice_engine_clear(e, "cloud:x"), SLUICE_OK);
    cr_assert_eq(sluice_engine_sync(e, "cloud:x"), SLUICE_OK);
    cr_assert_geq(atomic_load(&n_store_events), 1, "the failed clear is a store event");
    cr_assert_eq(store_events[0].cause, SLUICE_CAUSE_STORE_ERROR);
    sluice_statefile_last_error(f, err, sizeof err);
    cr_assert(strstr(err, "No space left on device"), "the store says why: %s", err);
    cr_assert_eq(sluice_engine_status(e, "cloud:x", &st), SLUICE_OK);
    cr_assert_eq(st.state, SLUICE_DISCOVERY_PROBING, "cleared in memory");
    struct sluice_pool *p = sluice_engine_pool(e, "cloud:x");
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK, "still serving");
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    sluice_engine_close(e);
    sluice_engine_destroy(e);

    /* The old state survived, byte for byte; with space again, saves work. */
    size_t len;
    char *now = slurp(path, &len);
    cr_assert(len == old_len && memcmp(now, old, len) == 0, "the old file survives:\n%s", now);
    struct sluice_lock_record back;
    cr_assert_eq(sluice_statefile_load(f, "cloud:x", &back), SLUICE_OK);
    cr_assert_eq(back.ceiling, 12);
    cr_assert_eq(unlink(filler), 0);
    cr_assert_eq(sluice_statefile_save(f, "cloud:y", &other), SLUICE_OK);
    free(old);
    free(now);
    sluice_statefile_close(f);
}
