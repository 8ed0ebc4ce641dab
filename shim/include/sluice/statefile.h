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
 * separate file, so readers never wait; <path> resolved through a symbolic
 * link, see "Symbolic links"), read the current file, replace or
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
 * Symbolic links: a link at the path is followed, as git does for its
 * config files: a write goes to the file the link points to (through up to
 * 8 links; a relative target is taken from the link's directory), with its
 * temp file and its lock file ("<that file>.lock") beside that file. So the
 * rename replaces the target, not the link, which keeps pointing at the
 * current file, and processes naming the file by the link or by its target
 * take the same flock. A dangling link gets its target created. The lock
 * file is never followed: a link there, dangling or not, fails the write
 * with SLUICE_EIO and a message, and nothing is created or locked where it
 * points. Reads follow links as any open does.
 *
 * Bad input: a file that is empty, torn, not JSON (a NUL byte anywhere
 * counts as not JSON: jansson would let one after a number pass, and the
 * byte-for-byte copy of other nodes' entries would stop at it and drop
 * them), of an unknown format or version, or has a wrong-typed,
 * out-of-range or future-dated record makes load fail (SLUICE_EINVAL;
 * SLUICE_EIO for an I/O error) with a message from
 * sluice_statefile_last_error. The engine turns that into a
 * "store" event (cause store_corrupt for SLUICE_EINVAL, store_error for
 * SLUICE_EIO; the event has no room for the text: an on_event callback
 * reads it from sluice_statefile_last_error, as the README's server
 * example does) and starts the node empty; it never crashes. The next save
 * rewrites the file cleanly (a file that cannot be parsed is replaced; a
 * bad record of another node is carried over untouched) — unless it is
 * someone else's: JSON whose top level is not an object or whose "format"
 * is not "sluice-ceilings" (another program's file at a mistaken path), or
 * a newer version's (a newer sluice's locks). That file is never replaced:
 * saves and clears fail with SLUICE_EIO and a message saying to move it
 * aside or change the path, and it stays byte for byte. A read-only
 * directory or a full disk fails save/clear with SLUICE_EIO and a message
 * naming the path and the cause; the engine keeps serving from memory.
 * A state file or lock file that is not a regular file (a FIFO, a
 * directory, a device, a socket) fails every call with SLUICE_EIO and a
 * message saying what it is; it is never waited on (opens do not block)
 * and never replaced.
 *
 * Who writes: each handle has a writer thread (started by its first write,
 * stopped by close), and every save and clear goes through it, so writes
 * are ordered and a node's records coalesce: while a write is under way,
 * further records of a node replace each other and only the newest is
 * written (the newest record per node wins). The store ops
 * (sluice_statefile_ops) hand their write to that thread and return at
 * once, so no save or clear runs on the thread of a call_end, a clear or
 * an event loop; a background write that fails is returned by that node's
 * next save or clear through the ops, or by sync (sluice_discovery_sync
 * calls it), which makes it one "store" event. sluice_statefile_save and
 * sluice_statefile_clear, called directly, wait for their write to land
 * and return its status. Load and foreach first wait for this handle's
 * queued writes, so a process reads its own saves. Should the thread fail
 * to start, writes run on the caller's thread, as a direct call would.
 *
 * Threads: every function may be called from any thread; one file's I/O
 * is serialised by a mutex (different nodes of one engine share it).
 * Direct calls, load, foreach and sync block on disk I/O and on the flock
 * (bounded by lock_wait_ms); the store ops' save and clear do not.
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
#define SLUICE_STATEFILE_LOCK_WAIT_MS_DEFAULT 5000u /* sluice_statefile_desc.lock_wait_ms */

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
 * Resolve the path, check that the first save can work there, and make a
 * handle; creates nothing (the folder is made by the first save). Returns
 * SLUICE_OK; SLUICE_EINVAL (no path and neither XDG_STATE_HOME nor a home
 * directory; a path too long; the path is a directory; a part of its
 * folder is a file); SLUICE_EIO (its folder does not exist and cannot be
 * made: its nearest existing ancestor is not writable, e.g. Permission
 * denied); or SLUICE_ENOMEM. desc->error names the path and the reason.
 * An existing folder is not checked for writing (a reader such as
 * sluicectl status may open a file it cannot write; saves then fail with
 * their own message).
 */
int sluice_statefile_open(const struct sluice_statefile_desc *desc, struct sluice_statefile **out);

/* Land every queued write, stop the writer thread and free the handle (no
 * engine may still use its ops). NULL is a no-op. */
void sluice_statefile_close(struct sluice_statefile *f);

/* The store ops to put in sluice_engine_desc.store; ctx is the handle. save
 * and clear hand their write to the writer thread and return at once (see
 * "Who writes"); sync waits for a node's writes. */
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
 * Wait until every write of `node` (NULL: of every node) handed to this
 * handle so far has landed. Returns SLUICE_OK, or the status of a
 * background write of that node that failed and was not yet returned by a
 * later save or clear through the ops (once: it is then told); NULL: always
 * SLUICE_OK (the failures stay for each node's own report).
 */
int sluice_statefile_sync(struct sluice_statefile *f, const char *node);

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
