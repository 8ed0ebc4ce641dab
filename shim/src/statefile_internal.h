/*
 * statefile_internal.h — what the state file's files (sluice/statefile.h)
 * share: the handle, and the calls one file makes into another. Private to
 * shim/src; not installed.
 *
 * The files, each owning one part:
 *   statefile.c        the handle: open, close, its path, its errors
 *   statefile_read.c   reading the file and validating it: the top level,
 *                      one node's entry, and the raw byte spans of a
 *                      validated document that a rewrite copies verbatim
 *   statefile_write.c  the durable rewrite of one node's entry: the target
 *                      behind symbolic links, the flock, temp → fsync →
 *                      rename → fsync dir, stale temp files
 *   statefile_store.c  the calls a store makes (load, foreach, save, clear,
 *                      sync, sluice_statefile_ops), and the writer thread
 *                      and its queue behind the writes
 *
 * Ownership: the handle owns its path strings and the error message; a
 * write owns the lock file's descriptor (closing it drops the flock) and
 * the temp file until the rename hands it to the final name.
 *
 * Locks: `mu` serialises the handle's file I/O and guards error, failures,
 * target and tmp_seq; `wmu` guards the writer's queue and is never held
 * across I/O, nor taken under mu.
 */
#ifndef SLUICE_SHIM_STATEFILE_INTERNAL_H
#define SLUICE_SHIM_STATEFILE_INTERNAL_H

#include <sluice/statefile.h>

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <sluice/sluice.h>

/* One node's writes waiting for (or done by) the writer thread. */
struct sluice__sf_pending {
    char node[SLUICE_NODE_ID_MAX];
    struct sluice_lock_record rec; /* the newest record handed in; ceiling 0 = clear */
    uint64_t queued;               /* its sequence number (0: nothing handed in yet) */
    uint64_t landed;               /* the sequence number of the newest one written (or failed) */
    int last_status;               /* how that write ended */
    int unreported;                /* a background write's failure nobody was told of (0: none) */
    uint64_t unreported_seq;       /* the write it came from */
};

/* Where a write goes: the path, or the file its symbolic link points to (see statefile.h). */
struct sluice__sf_target {
    char file[4096], lock[4096 + 8], dir[4096];
};

struct sluice_statefile {
    char *path; /* malloc: the path as given (or the default); messages name it */
    struct sluice__sf_target target; /* the current write's; under mu */
    struct sluice_clock wall;
    bool has_wall;
    uint32_t lock_wait_ms;
    pthread_mutex_t mu; /* serialises this handle's file I/O and guards error */
    char error[1024];
    uint64_t failures;
    unsigned tmp_seq;
    /* The writer thread and its queue, guarded by wmu (never held across I/O). */
    pthread_mutex_t wmu;
    pthread_cond_t work, landed;
    struct sluice__sf_pending *pending; /* malloc; entries are never removed, so indices stay */
    size_t n_pending, cap_pending, cursor;
    uint64_t seq;
    pthread_t writer;
    bool writer_running, writer_failed, stopping;
};

/* The whole file as read. */
struct sluice__sf_text {
    char *p; /* malloc, NUL-terminated; NULL when the file does not exist */
    size_t len;
};

/* One member of a JSON object in a validated text. */
struct sluice__sf_member {
    size_t k0, k1, v0, v1; /* key (with quotes) and value byte ranges */
};

/* ---- statefile.c ------------------------------------------------------------------ */

/* Record a failure: the message (for sluice_statefile_last_error) and the count; returns
 * status. Call under mu. */
int sluice__sf_fail(struct sluice_statefile *f, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Refuse a state or lock file (`what`) that is not a regular file: nothing is read or
 * replaced. Returns SLUICE_EIO. Call under mu. */
int sluice__sf_not_regular(struct sluice_statefile *f, const char *what, const struct stat *st);

/* Whether `node` is a valid node ID (1..SLUICE_NODE_ID_MAX-1 bytes); no lock needed. */
bool sluice__sf_node_ok(const char *node);

/* SLUICE_OK, or SLUICE_EINVAL (recorded) for an empty or too long node ID. Call under mu. */
int sluice__sf_check_node(struct sluice_statefile *f, const char *node);

/* ---- statefile_read.c -------------------------------------------------------------- */

/* Read the whole file (bounded); a missing file is t->p == NULL and SLUICE_OK. Under mu. */
int sluice__sf_read(struct sluice_statefile *f, struct sluice__sf_text *t);

/* Parse and check the top level; *root is the file's JSON, or NULL on failure (recorded:
 * SLUICE_EINVAL, the file is treated as empty). Under mu. */
int sluice__sf_parse(struct sluice_statefile *f, const struct sluice__sf_text *t, json_t **root);

/* Whether the text is someone else's JSON (not an object, or not of this format) or a
 * newer sluice's state file: never replaced, unlike a torn or corrupt one of ours. */
bool sluice__sf_foreign(const struct sluice__sf_text *t);

/* Check one node's entry: NULL and *rec filled, or what is wrong (maybe in buf). */
const char *sluice__sf_record(const struct sluice_statefile *f, json_t *o,
                              struct sluice_lock_record *rec, char *buf, size_t size);

/* The index of the first byte at or after i in s[0, n) that is not JSON white space. */
size_t sluice__sf_skip_ws(const char *s, size_t i, size_t n);

/* The members of the object starting at s[i] == '{' (text jansson accepted), in *out
 * (for free()); SLUICE_OK or SLUICE_ENOMEM. */
int sluice__sf_scan_members(const char *s, size_t i, size_t n, struct sluice__sf_member **out,
                            size_t *count);

/* The decoded key of member m equals `key`. */
bool sluice__sf_member_is(const char *s, const struct sluice__sf_member *m, const char *key);

/* ---- statefile_write.c ------------------------------------------------------------- */

/* Write (rec NULL: drop) one node's record now, on this thread; takes mu. */
int sluice__sf_modify(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec);

#endif
