/*
 * statefile_fixture.h — what the state-file tests share: one state file per
 * test under a fresh temporary directory (dir, sf, removed by cleanup),
 * reading and writing its bytes, and a lock record. tests/shim/statefile.c
 * holds the tests that run in one process; tests/e2e/statefile.c those that
 * start processes or a server. One translation unit per test executable.
 */
#ifndef SLUICE_TESTS_SHIM_STATEFILE_FIXTURE_H
#define SLUICE_TESTS_SHIM_STATEFILE_FIXTURE_H

#include <sluice/statefile.h>

#include "e2e/admin_fixture.h"
#include "shim/file_fixture.h"

static char dir[256];
static struct sluice_statefile *sf;

static inline void cleanup(void)
{
    sluice_statefile_close(sf);
    sf = NULL;
    fixture_rmtree(dir);
}

/* Per-test options rather than TestSuite: the TSan build's Criterion stand-in
 * (tests/tsan/) has no TestSuite. */
#define STATEFILE_TEST(name) Test(statefile, name, .fini = cleanup, .timeout = 30)

/* A state file at dir/sub/ceilings.json (the directory does not exist yet). */
static inline const char *open_in_tmp(void)
{
    static char path[512];
    fixture_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/state/sluice/ceilings.json", dir);
    char err[256];
    /* The tests that hold the flock use it as a latch, not as a clock: a write must outwait
     * them however slow the machine (ASan beside two busy loops took past the 5 s default
     * to queue 100 saves). */
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = path,
                                                                       .lock_wait_ms = 60000,
                                                                       .error = err,
                                                                       .error_size = sizeof err},
                                       &sf),
                 SLUICE_OK, "%s", err);
    return path;
}

static inline struct sluice_lock_record record(uint32_t ceiling, const char *policy)
{
    struct sluice_lock_record r = fixture_lock(ceiling, 3600);
    snprintf(r.policy, sizeof r.policy, "%s", policy);
    return r;
}

/* The state file's directories, made as its first save would. */
static inline void make_state_dir(void)
{
    char sub[400];
    snprintf(sub, sizeof sub, "%s/state", dir);
    mkdir(sub, 0700);
    snprintf(sub, sizeof sub, "%s/state/sluice", dir);
    mkdir(sub, 0700);
}

static inline void expect_last_error(const char *a, const char *b)
{
    char err[1024];
    sluice_statefile_last_error(sf, err, sizeof err);
    cr_expect(strstr(err, a) && strstr(err, b), "message \"%s\" lacks \"%s\" or \"%s\"", err, a, b);
}

#endif
