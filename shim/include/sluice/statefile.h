/*
 * sluice/statefile.h — the state file: discovered ceilings persisted on
 * disk, the file implementation of the core's store ops (sluice/store.h).
 *
 * What it is: one JSON file (jansson) holding, per node, the locked
 * ceiling, when it was locked, when the lock expires (wall-clock epoch
 * seconds) and the policy that found it:
 *
 *   {
 *     "format": "sluice-ceilings",
 *     "version": 1,
 *     "nodes": {
 *       "cloud:default_ollama": {"ceiling": 52, "locked_at": 1764547200, "expires_at": 1764633600, "policy": "discover"}
 *     }
 *   }
 *
 * Give an engine the file's ops (sluice_engine_desc.store) and a restarted
 * process starts each node from its unexpired lock (🔒, a "restore" event).
 *
 * Location: the path given, else $XDG_STATE_HOME/sluice/ceilings.json, else
 * ~/.local/state/sluice/ceilings.json. Directories it creates get mode
 * 0700, the file 0600.
 *
 * Writes (save, clear): under an exclusive flock on "<path>.lock" (a
 * separate file, so readers never wait), read the current file, replace or
 * drop the one node, write a temp file next to it, fsync it, rename it over
 * the file, fsync the directory (Redis rdb.c's durable save). Every other
 * node's entry is copied byte for byte from the old file, whatever its
 * layout. Processes that save different nodes at once all keep their
 * saves: the lock orders them and each rewrites the newest file. A lock
 * held by someone else is waited for up to lock_wait_ms, then the write
 * fails. Reads (load) take no lock: rename makes a file whole or absent.
 * Each write, under the flock, also removes the "<path>.tmp.*" files left
 * by writers killed mid-save (SIGKILL, power cut): every writer creates
 * and renames or removes its temp file under the flock, so any temp file
 * seen while holding it is orphaned, and none piles up for good.
 *
 * Bad input: a file that is empty, torn, not JSON (a NUL byte anywhere
 * counts as not JSON: jansson would let one after a number pass, and the
 * byte-for-byte copy of other nodes' entries would stop at it and drop
 * them), of an unknown format or version, or has a wrong-typed,
 * out-of-range or future-dated record makes load fail (SLUICE_EINVAL;
 * SLUICE_EIO for an I/O error) with a message from
 * sluice_statefile_last_error. The engine turns that into a
 * "store" event and starts the node empty; it never crashes. The next save
 * rewrites the file cleanly (a file that cannot be parsed is replaced; a
 * bad record of another node is carried over untouched). A read-only
 * directory or a full disk fails save/clear with SLUICE_EIO and a message
 * naming the path and the cause; the engine keeps serving from memory.
 *
 * Threads: every function may be called from any thread; one file's calls
 * are serialised by a mutex (different nodes of one engine share it).
 * Calls block on disk I/O and on the flock (bounded by lock_wait_ms).
 *
 * Memory: the handle and its buffers come from the process's malloc; jansson parses.
 */
#ifndef SLUICE_STATEFILE_H
#define SLUICE_STATEFILE_H

#include <stddef.h>
#include <stdint.h>

#include <sluice/store.h>
#include <sluice/time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLUICE_STATEFILE_VERSION 1
#define SLUICE_STATEFILE_FORMAT "sluice-ceilings"
#define SLUICE_STATEFILE_MAX_BYTES (16u << 20) /* a larger file is refused as corrupt */

struct sluice_statefile_desc {
    const char *path;                      /* the file (default: NULL = the XDG location above) */
    const struct sluice_clock *wall_clock; /* ns since the Unix epoch, to spot future-dated
                                              records (default: CLOCK_REALTIME) */
    uint32_t lock_wait_ms;                 /* how long a write waits for another process's flock
                                              (default: 5000; at most 600000) */
    char *error;                           /* receives a message naming the field when open
                                              fails (default: NULL = no message) */
    size_t error_size;                     /* bytes at error, NUL included (default: 0) */
};

struct sluice_statefile;

/*
 * Resolve the path and make a handle; touches no file (the directory is
 * made by the first save). Returns SLUICE_OK, SLUICE_EINVAL (no path and
 * neither XDG_STATE_HOME nor a home directory; or a path too long) or
 * SLUICE_ENOMEM.
 */
int sluice_statefile_open(const struct sluice_statefile_desc *desc, struct sluice_statefile **out);

/* Free the handle (no engine may still use its ops). NULL is a no-op. */
void sluice_statefile_close(struct sluice_statefile *f);

/* The store ops to put in sluice_engine_desc.store; ctx is the handle. */
struct sluice_store_ops sluice_statefile_ops(struct sluice_statefile *f);

/* The resolved path of the file. */
const char *sluice_statefile_path(const struct sluice_statefile *f);

/*
 * The default path into buf ($XDG_STATE_HOME/sluice/ceilings.json, else
 * ~/.local/state/sluice/ceilings.json). snprintf semantics; SLUICE_EINVAL
 * when there is no home directory to put it in.
 */
int sluice_statefile_default_path(char *buf, size_t size);

/*
 * The message of the most recent failed call ("" if none failed yet),
 * e.g. "/home/a/.local/state/sluice/ceilings.json: not JSON (line 3,
 * column 1: end of file expected); it is treated as empty and the next
 * save rewrites it". Returns how many calls have failed so far.
 */
uint64_t sluice_statefile_last_error(struct sluice_statefile *f, char *buf, size_t size);

/* The store operations, callable directly (e.g. by sluicectl); see sluice/store.h. */
int sluice_statefile_load(struct sluice_statefile *f, const char *node, struct sluice_lock_record *out);
int sluice_statefile_save(struct sluice_statefile *f, const char *node,
                          const struct sluice_lock_record *rec);
int sluice_statefile_clear(struct sluice_statefile *f, const char *node);

/*
 * Call fn once per node in the file, in file order. A node whose record is
 * bad gets rec = NULL and `problem` saying what is wrong; good ones get
 * problem = NULL (expired locks included: the caller compares expires_s).
 * A missing file is zero nodes. Returns SLUICE_OK, the first non-zero
 * value fn returned, or the load error of a file that cannot be read.
 */
int sluice_statefile_foreach(struct sluice_statefile *f,
                             int (*fn)(void *ctx, const char *node,
                                       const struct sluice_lock_record *rec, const char *problem),
                             void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_STATEFILE_H */
