/*
 * fuzz_statefile — the state file's reader and its byte-preserving
 * rewrite on any file content. The input becomes the file (in a private
 * directory under /dev/shm, else $TMPDIR or /tmp); then:
 *   1. foreach and load read it: SLUICE_OK, EINVAL or EIO, never a crash;
 *   2. a save of node "fuzz:n" must succeed whatever the file held (an
 *      unreadable file is replaced, a readable one rewritten around the
 *      entry), load must give the record back, and every node the first
 *      foreach saw keeps its record (good) or its problem (bad) — except
 *      in someone else's file (JSON that is not an object or not of this
 *      format, or a newer version's), where the save and the clear fail
 *      with SLUICE_EIO and the file stays byte for byte;
 *   3. a clear of "fuzz:n" must succeed, leave it absent, and keep the
 *      others again.
 * The wall clock is fixed, so a record's "future-dated" verdict does not
 * move between the reads.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <jansson.h>
#include <string.h>

#include <sluice/statefile.h>

#include "fuzz_input.h"

#define MAX_SEEN 64
#define NOW_NS (INT64_C(1764547200) * SLUICE_NS_PER_SEC)
#define NODE "fuzz:n"

struct seen {
    char node[SLUICE_NODE_ID_MAX + 8];
    bool good;
    struct sluice_lock_record rec;
};

struct census {
    struct seen n[MAX_SEEN];
    int count;     /* nodes recorded (at most MAX_SEEN) */
    int total;     /* nodes seen */
    bool has_mine; /* NODE was among them */
};

static void check(bool ok, const char *what, const char *detail)
{
    if (!ok) {
        fprintf(stderr, "fuzz_statefile: %s (%s)\n", what, detail ? detail : "");
        abort();
    }
}

static int64_t fixed_now(void *ctx)
{
    (void)ctx;
    return NOW_NS;
}

static int take(void *ctx, const char *node, const struct sluice_lock_record *rec,
                const char *problem)
{
    struct census *c = ctx;
    check((rec == NULL) != (problem == NULL), "foreach gives a record or a problem", node);
    c->total++;
    if (!strcmp(node, NODE)) {
        c->has_mine = true;
        return 0;
    }
    if (c->count < MAX_SEEN && strlen(node) < sizeof c->n[0].node) {
        struct seen *s = &c->n[c->count++];
        snprintf(s->node, sizeof s->node, "%s", node);
        s->good = rec != NULL;
        if (rec)
            s->rec = *rec;
    }
    return 0;
}

static int census(struct sluice_statefile *f, struct census *c)
{
    memset(c, 0, sizeof *c);
    return sluice_statefile_foreach(f, take, c);
}

static bool same_record(const struct sluice_lock_record *a, const struct sluice_lock_record *b)
{
    return a->ceiling == b->ceiling && a->locked_at_s == b->locked_at_s &&
           a->expires_s == b->expires_s && !strcmp(a->policy, b->policy);
}

/* Every node of `before` is in `after` as it was. */
static void check_kept(const struct census *before, const struct census *after)
{
    for (int i = 0; i < before->count; i++) {
        const struct seen *b = &before->n[i];
        const struct seen *a = NULL;
        for (int k = 0; k < after->count && !a; k++)
            if (!strcmp(after->n[k].node, b->node))
                a = &after->n[k];
        check(a != NULL, "a rewrite keeps every other node", b->node);
        check(a->good == b->good, "a rewrite keeps a node good or bad as it was", b->node);
        if (b->good)
            check(same_record(&a->rec, &b->rec), "a rewrite keeps a node's record", b->node);
    }
}

static char dir[256], path[512];
static struct sluice_statefile *sf;

/* The private directory goes when the fuzzer exits (a crash leaves it for the post-mortem). */
static void remove_dir(void)
{
    char p[600];
    static const char *const names[] = {"ceilings.json", "ceilings.json.lock"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    sluice_statefile_close(sf);
}

static void setup(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sluice-fuzz-XXXXXX", base ? base : "/tmp");
    check(mkdtemp(dir) != NULL, "mkdtemp", dir);
    atexit(remove_dir);
    snprintf(path, sizeof path, "%s/ceilings.json", dir);
    static struct sluice_clock wall = {fixed_now, NULL};
    char err[256];
    check(sluice_statefile_open(&(struct sluice_statefile_desc){.path = path, .wall_clock = &wall,
                                                                .lock_wait_ms = 1000,
                                                                .error = err,
                                                                .error_size = sizeof err},
                                &sf) == SLUICE_OK,
          "open", err);
}

/* Whether the input is someone else's file (sluice/statefile.h, "Bad input"): never
 * replaced. Written from the header's words, not from the library's code. */
static bool foreign(const uint8_t *data, size_t size)
{
    if (!size || memchr(data, 0, size))
        return false;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!j)
        return false;
    json_t *format = json_object_get(j, "format"), *version = json_object_get(j, "version");
    bool theirs = !json_is_object(j) || !json_is_string(format) ||
                  strcmp(json_string_value(format), SLUICE_STATEFILE_FORMAT) ||
                  (json_is_integer(version) &&
                   json_integer_value(version) > SLUICE_STATEFILE_VERSION);
    json_decref(j);
    return theirs;
}

/* The file holds exactly the input. */
static bool unchanged(const uint8_t *data, size_t size)
{
    uint8_t *back = malloc(size + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    check(back && fd >= 0, "reading the file back", path);
    size_t n = 0;
    for (ssize_t got; n <= size && (got = read(fd, back + n, size + 1 - n)) > 0;)
        n += (size_t)got;
    close(fd);
    bool same = n == size && !memcmp(back, data, size);
    free(back);
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!sf)
        setup();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    check(fd >= 0, "writing the input", path);
    check(write(fd, data, size) == (ssize_t)size, "writing the input", path);
    close(fd);

    static struct census before, after;
    int status = census(sf, &before);
    check(status == SLUICE_OK || status == SLUICE_EINVAL || status == SLUICE_EIO,
          "foreach returns OK, EINVAL or EIO", sluice_status_name(status));
    bool readable = status == SLUICE_OK;
    struct sluice_lock_record got;
    status = sluice_statefile_load(sf, NODE, &got);
    check(status == SLUICE_OK || status == SLUICE_EINVAL || status == SLUICE_EIO,
          "load returns OK, EINVAL or EIO", sluice_status_name(status));

    struct sluice_lock_record mine = {.ceiling = 1 + (uint32_t)(size % 1000),
                                      .locked_at_s = NOW_NS / SLUICE_NS_PER_SEC - 60,
                                      .expires_s = NOW_NS / SLUICE_NS_PER_SEC + 3600};
    snprintf(mine.policy, sizeof mine.policy, "discover");
    char err[1024];
    status = sluice_statefile_save(sf, NODE, &mine);
    sluice_statefile_last_error(sf, err, sizeof err);
    if (foreign(data, size)) {
        check(status == SLUICE_EIO, "a save into someone else's file fails", err);
        check(sluice_statefile_clear(sf, NODE) == SLUICE_EIO, "and so does a clear", NULL);
        check(unchanged(data, size), "someone else's file stays byte for byte", path);
        return 0;
    }
    check(status == SLUICE_OK, "a save succeeds whatever the file held", err);
    status = sluice_statefile_load(sf, NODE, &got);
    sluice_statefile_last_error(sf, err, sizeof err);
    check(status == SLUICE_OK && same_record(&got, &mine), "load gives the saved record back",
          err);
    check(census(sf, &after) == SLUICE_OK, "the rewritten file reads cleanly", NULL);
    check(after.has_mine, "the saved node is in the file", NULL);
    if (readable)
        check_kept(&before, &after);
    else
        check(after.total == 1, "an unreadable file is replaced by one holding the save", NULL);

    status = sluice_statefile_clear(sf, NODE);
    sluice_statefile_last_error(sf, err, sizeof err);
    check(status == SLUICE_OK, "a clear succeeds", err);
    check(sluice_statefile_load(sf, NODE, &got) == SLUICE_OK && got.ceiling == 0,
          "a cleared node is absent", NULL);
    check(census(sf, &after) == SLUICE_OK && !after.has_mine, "the cleared file reads cleanly",
          NULL);
    if (readable)
        check_kept(&before, &after);
    return 0;
}
