/*
 * statefile_write.c — the durable rewrite of one node's entry, under mu:
 * find the file behind any symbolic links (sf_resolve), make its
 * directory, take the flock on the lock file beside it, sweep temp files
 * a dead writer left, then read, keep every other entry's bytes, and write
 * temp → fsync → rename → fsync dir (as Redis's rdb.c saves).
 */
#define _GNU_SOURCE
#include "statefile_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "strbuf_internal.h"

/* mkdir -p, new directories 0700. */
static int sf_mkdirs(struct sluice_statefile *f)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", f->target.dir);
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot create directory %s: %s", f->path,
                                       path, strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    return SLUICE_OK;
}

/* Take the exclusive flock on the lock file, waiting up to lock_wait_ms; the fd or -1. */
static int sf_lock(struct sluice_statefile *f, int *status)
{
    /* O_NOFOLLOW: the lock file is sluice's own; a link there (dangling or not) would have
     * a write create and lock whatever it points to. */
    const char *lock = f->target.lock;
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == ELOOP) {
        *status =
            sluice__sf_fail(f, SLUICE_EIO,
                            "%s: lock file %s is a symbolic link; sluice never follows it (remove "
                            "the link: the lock file is made on the next write)",
                            f->path, lock);
        return -1;
    }
    if (fd < 0) {
        *status = sluice__sf_fail(f, SLUICE_EIO, "%s: cannot open lock file %s: %s", f->path, lock,
                                  strerror(errno));
        return -1;
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        *status = sluice__sf_not_regular(f, lock, &st);
        return -1;
    }
    for (uint32_t waited = 0;; waited += 10) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            *status = sluice__sf_fail(f, SLUICE_EIO, "%s: cannot lock %s: %s", f->path, lock,
                                      strerror(errno));
            break;
        }
        if (waited >= f->lock_wait_ms) {
            *status =
                sluice__sf_fail(f, SLUICE_EIO,
                                "%s: another process held %s for more than %u ms (raise "
                                "sluice_statefile_desc.lock_wait_ms, or find the stuck process)",
                                f->path, lock, f->lock_wait_ms);
            break;
        }
        struct timespec ten_ms = {0, 10 * 1000 * 1000};
        nanosleep(&ten_ms, NULL);
    }
    close(fd);
    return -1;
}

/* temp file → fsync → rename → fsync dir. */
static int sf_write_atomic(struct sluice_statefile *f, const char *data, size_t len)
{
    char tmp[4096 + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", f->target.file, (long)getpid(), f->tmp_seq++);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return sluice__sf_fail(f, SLUICE_EIO,
                               "%s: cannot create %s: %s (is the directory writable?)", f->path,
                               tmp, strerror(errno));
    int err = 0;
    if (fchmod(fd, 0600) != 0)
        err = errno;
    for (size_t done = 0; !err && done < len;) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            err = n < 0 ? errno : EIO;
        else
            done += (size_t)n;
    }
    if (!err && fsync(fd) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (err) {
        unlink(tmp);
        return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot write %s: %s (the old file is unchanged)",
                               f->path, tmp, strerror(err));
    }
    if (rename(tmp, f->target.file) != 0) {
        err = errno;
        unlink(tmp);
        return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot rename %s over it: %s", f->path, tmp,
                               strerror(err));
    }
    int dfd = open(f->target.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        /* Some file systems cannot fsync a directory (EINVAL); the rename stands. */
        if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS)
            err = errno;
        close(dfd);
    }
    if (err)
        return sluice__sf_fail(f, SLUICE_EIO, "%s: saved, but fsync of directory %s failed: %s",
                               f->path, f->target.dir, strerror(err));
    return SLUICE_OK;
}

/* `"node": {"ceiling": ...}` for a record; false when the node ID is not valid UTF-8. */
static bool sf_render_entry(struct sluice__strbuf *o, const char *node,
                            const struct sluice_lock_record *rec)
{
    char policy[SLUICE_POLICY_NAME_MAX];
    snprintf(policy, sizeof policy, "%s", rec->policy);
    json_t *key = json_string(node);
    json_t *val = json_pack("{s:I,s:I,s:I,s:s}", "ceiling", (json_int_t)rec->ceiling, "locked_at",
                            (json_int_t)rec->locked_at_s, "expires_at", (json_int_t)rec->expires_s,
                            "policy", policy);
    if (!val) /* a policy name that is not UTF-8 is informational only: dropped */
        val = json_pack("{s:I,s:I,s:I,s:s}", "ceiling", (json_int_t)rec->ceiling, "locked_at",
                        (json_int_t)rec->locked_at_s, "expires_at", (json_int_t)rec->expires_s,
                        "policy", "");
    char *k = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
    char *v = val ? json_dumps(val, JSON_PRESERVE_ORDER) : NULL; /* ", " and ": " separators */
    bool ok = k && v;
    if (ok) {
        sluice__strbuf_puts(o, "    ");
        sluice__strbuf_puts(o, k);
        sluice__strbuf_puts(o, ": ");
        sluice__strbuf_puts(o, v);
    }
    free(k);
    free(v);
    json_decref(key);
    json_decref(val);
    return ok;
}

/* The raw spans of a validated file: its top-level members and those of "nodes". */
struct spans {
    const char *s; /* the file's text */
    struct sluice__sf_member *top, *nodes;
    size_t n_top, n_nodes;
};

/* Fill sp from t (a file jansson accepted); SLUICE_OK or SLUICE_ENOMEM. */
static int sf_scan(const struct sluice__sf_text *t, struct spans *sp)
{
    sp->s = t->p;
    size_t start = sluice__sf_skip_ws(t->p, 0, t->len);
    if (sluice__sf_scan_members(t->p, start, t->len, &sp->top, &sp->n_top) != SLUICE_OK)
        return SLUICE_ENOMEM;
    for (size_t i = 0; i < sp->n_top; i++)
        if (sluice__sf_member_is(t->p, &sp->top[i], "nodes") &&
            sluice__sf_scan_members(t->p, sp->top[i].v0, t->len, &sp->nodes, &sp->n_nodes) !=
                SLUICE_OK)
            return SLUICE_ENOMEM;
    return SLUICE_OK;
}

/* `indent"key": value` with the member's bytes as they were. */
static void sf_put_member(struct sluice__strbuf *o, const char *indent, const char *s,
                          const struct sluice__sf_member *m)
{
    sluice__strbuf_puts(o, indent);
    sluice__strbuf_put(o, s + m->k0, m->k1 - m->k0);
    sluice__strbuf_puts(o, ": ");
    sluice__strbuf_put(o, s + m->v0, m->v1 - m->v0);
}

/* The new file: the header, unknown top-level members and every other node as they were,
 * and `node`'s entry (rec) in its old place or last (rec NULL: left out). False when the
 * entry could not be rendered (a node ID that is not UTF-8). */
static bool sf_render_file(struct sluice__strbuf *o, const struct spans *sp, const char *node,
                           const struct sluice_lock_record *rec)
{
    const char *s = sp->s;
    sluice__strbuf_printf(o, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n",
                          SLUICE_STATEFILE_FORMAT, SLUICE_STATEFILE_VERSION);
    for (size_t i = 0; i < sp->n_top; i++) /* members this version does not know: kept */
        if (!sluice__sf_member_is(s, &sp->top[i], "format") &&
            !sluice__sf_member_is(s, &sp->top[i], "version") &&
            !sluice__sf_member_is(s, &sp->top[i], "nodes")) {
            sf_put_member(o, "  ", s, &sp->top[i]);
            sluice__strbuf_puts(o, ",\n");
        }
    sluice__strbuf_puts(o, "  \"nodes\": {");
    bool first = true, written = false;
    for (size_t i = 0; i < sp->n_nodes; i++) {
        bool mine = sluice__sf_member_is(s, &sp->nodes[i], node);
        if (mine && !rec)
            continue;
        sluice__strbuf_puts(o, first ? "\n" : ",\n");
        first = false;
        if (mine) {
            if (!sf_render_entry(o, node, rec))
                return false;
            written = true;
            continue;
        }
        sf_put_member(o, "    ", s, &sp->nodes[i]);
    }
    if (rec && !written) {
        sluice__strbuf_puts(o, first ? "\n" : ",\n");
        first = false;
        if (!sf_render_entry(o, node, rec))
            return false;
    }
    sluice__strbuf_puts(o, first ? "}\n}\n" : "\n  }\n}\n");
    return true;
}

/*
 * Write `node`'s record (rec NULL: drop it), keeping every other entry's
 * bytes. Call under f->mu with the flock held.
 */
static int sf_rewrite(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec)
{
    struct sluice__sf_text t;
    char kept[sizeof f->error];
    memcpy(kept, f->error, sizeof kept);
    uint64_t failures = f->failures;
    int status = sluice__sf_read(f, &t);
    if (status != SLUICE_OK && status != SLUICE_EINVAL)
        return status; /* cannot read it: do not replace what we could not see */
    json_t *root = NULL;
    bool whole = status == SLUICE_OK; /* read in full: not too large */
    if (whole && t.p)
        status = sluice__sf_parse(f, &t, &root);
    if (status != SLUICE_OK && whole && sluice__sf_foreign(&t)) {
        /* Someone else's file, or a newer sluice's: its contents are not ours to drop. */
        free(t.p);
        return sluice__sf_fail(f, SLUICE_EIO,
                               "%s: not written: the file there is not a state file this sluice "
                               "may replace (another program's JSON, or a newer sluice's); move it "
                               "aside, or change the state file's path",
                               f->path);
    }
    if (status != SLUICE_OK) {
        /* A file too large or not a state file is replaced by a clean one, as its message
         * says; that is this write succeeding, not failing, so the problem (reported by
         * every load) is not counted again here. */
        memcpy(f->error, kept, sizeof kept);
        f->failures = failures;
        status = SLUICE_OK;
    }
    struct spans sp = {0};
    if (root)
        status = sf_scan(&t, &sp);
    bool present = false;
    for (size_t i = 0; i < sp.n_nodes; i++)
        present |= sluice__sf_member_is(sp.s, &sp.nodes[i], node);
    struct sluice__strbuf o = {0};
    if (status == SLUICE_OK && (rec || present || !root)) {
        if (!sf_render_file(&o, &sp, node, rec))
            status = sluice__sf_fail(f, SLUICE_EINVAL, "%s: node ID \"%s\" is not valid UTF-8",
                                     f->path, node);
        else if (o.oom)
            status =
                sluice__sf_fail(f, SLUICE_ENOMEM, "%s: out of memory building the file", f->path);
        else
            status = sf_write_atomic(f, o.p, o.len);
    }
    free(o.p);
    free(sp.top);
    free(sp.nodes);
    free(t.p);
    json_decref(root);
    return status;
}

/*
 * Remove "<file>.tmp.*" left next to the file. Call with the flock held:
 * every writer creates, renames or unlinks its temp file under the flock,
 * so any temp file seen now belongs to a writer that died mid-save (each
 * SIGKILL or power cut would otherwise leave one behind for good).
 */
static void sf_sweep_temps(const struct sluice_statefile *f)
{
    const char *slash = strrchr(f->target.file, '/');
    const char *base = slash ? slash + 1 : f->target.file;
    size_t n = strlen(base);
    DIR *d = opendir(f->target.dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, base, n) && !strncmp(e->d_name + n, ".tmp.", 5))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

/* Put `path`'s directory into dir (".", "/", or everything before the last slash). */
static void sf_dirname(const char *path, char *dir, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, size, ".");
    else if (slash == path)
        snprintf(dir, size, "/");
    else
        snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/*
 * Fill f->target for a write: the path, or, when it is a symbolic link, the
 * file the link (or chain of links, up to SF_LINKS_MAX) points to, relative
 * targets taken from the link's directory; the lock file and the temp
 * files go beside that file, so the link survives the rename and every
 * process that writes the file, by whichever name, takes the same flock
 * (git's lockfile does the same). Call under mu.
 */
#define SF_LINKS_MAX 8
static int sf_resolve(struct sluice_statefile *f)
{
    struct sluice__sf_target *t = &f->target;
    snprintf(t->file, sizeof t->file, "%s", f->path);
    int hops = 0;
    for (;; hops++) {
        char link[4096];
        ssize_t n = readlink(t->file, link, sizeof link);
        if (n < 0 && (errno == EINVAL || errno == ENOENT || errno == ENOTDIR))
            break; /* not a link, or nothing there yet: write it here */
        if (n < 0)
            return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot read the symbolic link %s: %s",
                                   f->path, t->file, strerror(errno));
        if (hops == SF_LINKS_MAX || (size_t)n == sizeof link)
            return sluice__sf_fail(
                f, SLUICE_EIO,
                "%s: more than %d symbolic links (or one too long) to follow; point "
                "sluice_statefile_desc.path at the file itself",
                f->path, SF_LINKS_MAX);
        link[n] = '\0';
        char dir[4096];
        sf_dirname(t->file, dir, sizeof dir);
        int len = link[0] == '/' ? snprintf(t->file, sizeof t->file, "%s", link)
                                 : snprintf(t->file, sizeof t->file, "%s/%s", dir, link);
        if (len < 0 || (size_t)len >= sizeof t->file - 32)
            return sluice__sf_fail(f, SLUICE_EIO,
                                   "%s: the file its link points to has too long a path", f->path);
    }
    snprintf(t->lock, sizeof t->lock, "%s.lock", t->file);
    sf_dirname(t->file, t->dir, sizeof t->dir);
    return SLUICE_OK;
}

int sluice__sf_modify(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec)
{
    pthread_mutex_lock(&f->mu);
    int status = sf_resolve(f);
    if (status == SLUICE_OK)
        status = sf_mkdirs(f);
    int lock = status == SLUICE_OK ? sf_lock(f, &status) : -1;
    if (lock >= 0) {
        sf_sweep_temps(f);
        status = sf_rewrite(f, node, rec);
        close(lock); /* drops the flock */
    }
    pthread_mutex_unlock(&f->mu);
    return status;
}
