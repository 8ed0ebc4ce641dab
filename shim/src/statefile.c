/*
 * statefile.c — the state file (sluice/statefile.h): discovered ceilings in
 * a JSON file, written the durable way (temp → fsync → rename → fsync dir)
 * under an flock on a separate lock file.
 *
 * Ownership: the handle owns its path strings and the error message; a
 * write owns the lock file's descriptor (closing it drops the flock) and
 * the temp file until the rename hands it to the final name.
 *
 * Keeping other nodes byte-identical: jansson validates the whole file,
 * but a rewrite does not re-serialise what it parsed. A small scanner finds
 * the raw byte span of every member of "nodes" (and of unknown top-level
 * members) in the validated text, and the new file copies those spans
 * verbatim around the one entry being written.
 */
#define _GNU_SOURCE
#include <sluice/statefile.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sluice/sluice.h>

#include "strbuf_internal.h"

/* One node's writes waiting for (or done by) the writer thread. */
struct sf_pending {
    char node[SLUICE_NODE_ID_MAX];
    struct sluice_lock_record rec; /* the newest record handed in; ceiling 0 = clear */
    uint64_t queued;               /* its sequence number (0: nothing handed in yet) */
    uint64_t landed;               /* the sequence number of the newest one written (or failed) */
    int last_status;               /* how that write ended */
    int unreported;                /* a background write's failure nobody was told of (0: none) */
    uint64_t unreported_seq;       /* the write it came from */
};

/* Where a write goes: the path, or the file its symbolic link points to (see statefile.h). */
struct sf_target {
    char file[4096], lock[4096 + 8], dir[4096];
};

struct sluice_statefile {
    char *path; /* malloc: the path as given (or the default); messages name it */
    struct sf_target target; /* the current write's; under mu */
    struct sluice_clock wall;
    bool has_wall;
    uint32_t lock_wait_ms;
    pthread_mutex_t mu;           /* serialises this handle's file I/O and guards error */
    char error[1024];
    uint64_t failures;
    unsigned tmp_seq;
    /* The writer thread and its queue, guarded by wmu (never held across I/O). */
    pthread_mutex_t wmu;
    pthread_cond_t work, landed;
    struct sf_pending *pending; /* malloc; entries are never removed, so indices stay */
    size_t n_pending, cap_pending, cursor;
    uint64_t seq;
    pthread_t writer;
    bool writer_running, writer_failed, stopping;
};

static int sf_fail(struct sluice_statefile *f, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int sf_fail(struct sluice_statefile *f, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->error, sizeof f->error, fmt, ap);
    va_end(ap);
    f->failures++;
    return status;
}

static char *sf_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int sluice_statefile_default_path(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_STATE_HOME");
    if (xdg && xdg[0] == '/') /* the XDG spec: a relative value is invalid and ignored */
        return snprintf(buf, size, "%s/sluice/ceilings.json", xdg);
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || home[0] != '/') {
        if (buf && size)
            buf[0] = '\0';
        return SLUICE_EINVAL;
    }
    return snprintf(buf, size, "%s/.local/state/sluice/ceilings.json", home);
}

int sluice_statefile_open(const struct sluice_statefile_desc *desc, struct sluice_statefile **out)
{
    *out = NULL;
    struct sluice_statefile_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    if (d.error && d.error_size)
        d.error[0] = '\0';
#define SF_OPEN_FAIL(...)                                                                          \
    do {                                                                                           \
        if (d.error && d.error_size)                                                               \
            snprintf(d.error, d.error_size, __VA_ARGS__);                                          \
        return SLUICE_EINVAL;                                                                      \
    } while (0)
    if (d.lock_wait_ms > 600000)
        SF_OPEN_FAIL("sluice_statefile_desc.lock_wait_ms = %u is above 600000", d.lock_wait_ms);
    char path[4096];
    if (d.path) {
        if (!d.path[0])
            SF_OPEN_FAIL("sluice_statefile_desc.path is empty (pass a file path, or NULL for the "
                         "default location)");
        if (strlen(d.path) >= sizeof path - 32)
            SF_OPEN_FAIL("sluice_statefile_desc.path is longer than %zu bytes", sizeof path - 32);
        snprintf(path, sizeof path, "%s", d.path);
    } else {
        int n = sluice_statefile_default_path(path, sizeof path - 32);
        if (n < 0)
            SF_OPEN_FAIL("no state file location: set sluice_statefile_desc.path, XDG_STATE_HOME "
                         "or HOME");
        if ((size_t)n >= sizeof path - 32)
            SF_OPEN_FAIL("the default state file path is too long (set sluice_statefile_desc.path)");
    }
#undef SF_OPEN_FAIL
    struct sluice_statefile *f = calloc(1, sizeof *f);
    if (!f)
        return SLUICE_ENOMEM;
    f->path = sf_strdup(path);
    if (!f->path) {
        free(f);
        return SLUICE_ENOMEM;
    }
    if (d.wall_clock) {
        f->wall = *d.wall_clock;
        f->has_wall = true;
    }
    f->lock_wait_ms = d.lock_wait_ms ? d.lock_wait_ms : 5000;
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_init(&f->wmu, NULL);
    pthread_cond_init(&f->work, NULL);
    pthread_cond_init(&f->landed, NULL);
    *out = f;
    return SLUICE_OK;
}

void sluice_statefile_close(struct sluice_statefile *f)
{
    if (!f)
        return;
    {
        /* The writer lands what is queued before it stops. */
        pthread_mutex_lock(&f->wmu);
        f->stopping = true;
        bool running = f->writer_running;
        pthread_cond_signal(&f->work);
        pthread_mutex_unlock(&f->wmu);
        if (running)
            pthread_join(f->writer, NULL);
        pthread_cond_destroy(&f->landed);
        pthread_cond_destroy(&f->work);
        pthread_mutex_destroy(&f->wmu);
        pthread_mutex_destroy(&f->mu);
    }
    free(f->pending);
    free(f->path);
    free(f);
}

const char *sluice_statefile_path(const struct sluice_statefile *f)
{
    return f->path;
}

uint64_t sluice_statefile_last_error(struct sluice_statefile *f, char *buf, size_t size)
{
    pthread_mutex_lock(&f->mu);
    if (buf && size)
        snprintf(buf, size, "%s", f->error);
    uint64_t n = f->failures;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static int64_t sf_now_s(const struct sluice_statefile *f)
{
    if (f->has_wall)
        return sluice_clock_now(&f->wall) / SLUICE_NS_PER_SEC;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

/* What a path that must be a regular file is instead, for a message. */
static const char *sf_file_kind(const struct stat *st)
{
    return S_ISFIFO(st->st_mode)  ? "a FIFO"
           : S_ISDIR(st->st_mode) ? "a directory"
           : S_ISSOCK(st->st_mode) ? "a socket"
           : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "a device"
           : S_ISLNK(st->st_mode) ? "a symbolic link"
                                  : "of an unknown kind";
}

/* Refuse a state or lock file that is not a regular file: nothing is read or replaced. */
static int sf_not_regular(struct sluice_statefile *f, const char *what, const struct stat *st)
{
    return sf_fail(f, SLUICE_EIO,
                   "%s: %s is %s, not a regular file; it is left alone (remove it, or set "
                   "sluice_statefile_desc.path to a regular file)",
                   f->path, what, sf_file_kind(st));
}

/* ---- reading and validating ---------------------------------------------------- */

struct text {
    char *p; /* malloc, NUL-terminated; NULL when the file does not exist */
    size_t len;
};

/* Read the whole file (bounded); a missing file is text.p == NULL and SLUICE_OK. */
static int sf_read(struct sluice_statefile *f, struct text *t)
{
    t->p = NULL;
    t->len = 0;
    /* O_NONBLOCK: a FIFO at the path must not block the open (with the
     * handle's mutex held) before fstat can refuse it. */
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT)
            return SLUICE_OK;
        return sf_fail(f, SLUICE_EIO, "%s: cannot open: %s", f->path, strerror(errno));
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return sf_not_regular(f, f->path, &st);
    }
    size_t cap = (size_t)st.st_size + 1;
    if (cap > SLUICE_STATEFILE_MAX_BYTES + 1) {
        close(fd);
        return sf_fail(f, SLUICE_EINVAL,
                       "%s: %lld bytes is over the %u-byte limit for a state file; it is treated "
                       "as empty and the next save rewrites it",
                       f->path, (long long)st.st_size, SLUICE_STATEFILE_MAX_BYTES);
    }
    t->p = malloc(cap);
    if (!t->p) {
        close(fd);
        return sf_fail(f, SLUICE_ENOMEM, "%s: out of memory reading it", f->path);
    }
    while (t->len < cap - 1) {
        ssize_t n = read(fd, t->p + t->len, cap - 1 - t->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            close(fd);
            free(t->p);
            t->p = NULL;
            return sf_fail(f, SLUICE_EIO, "%s: cannot read: %s", f->path, strerror(err));
        }
        if (n == 0)
            break;
        t->len += (size_t)n;
    }
    t->p[t->len] = '\0';
    close(fd);
    return SLUICE_OK;
}

#define SF_EMPTY_NOTE "; it is treated as empty and the next save rewrites it"

/* Parse and check the top level; *root is the file's JSON, or NULL on failure. */
static int sf_parse(struct sluice_statefile *f, const struct text *t, json_t **root)
{
    *root = NULL;
    if (t->len == 0)
        return sf_fail(f, SLUICE_EINVAL, "%s: the file is empty (a torn write?)" SF_EMPTY_NOTE,
                       f->path);
    /* jansson lets a NUL byte after a number pass, but the rewrite's span scanner stops at
     * it and would drop every member after it: no JSON text holds a raw NUL, so refuse. */
    if (memchr(t->p, '\0', t->len))
        return sf_fail(f, SLUICE_EINVAL, "%s: not valid JSON (a NUL byte at offset %zu)" SF_EMPTY_NOTE,
                       f->path, (size_t)((const char *)memchr(t->p, '\0', t->len) - t->p));
    json_error_t e;
    json_t *j = json_loadb(t->p, t->len, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        return sf_fail(f, SLUICE_EINVAL, "%s: not valid JSON (line %d, column %d: %s)" SF_EMPTY_NOTE,
                       f->path, e.line, e.column, e.text);
    const char *why = NULL;
    char buf[160];
    json_t *format = json_object_get(j, "format"), *version = json_object_get(j, "version");
    if (!json_is_object(j))
        why = "the top level is not a JSON object";
    else if (!json_is_string(format) || strcmp(json_string_value(format), SLUICE_STATEFILE_FORMAT))
        why = "\"format\" is not \"" SLUICE_STATEFILE_FORMAT "\" (not a sluice state file?)";
    else if (!json_is_integer(version))
        why = "\"version\" is missing or not an integer";
    else if (json_integer_value(version) != SLUICE_STATEFILE_VERSION) {
        snprintf(buf, sizeof buf,
                 "unknown version %" JSON_INTEGER_FORMAT " (this sluice reads version %d)",
                 json_integer_value(version), SLUICE_STATEFILE_VERSION);
        why = buf;
    } else if (!json_is_object(json_object_get(j, "nodes")))
        why = "\"nodes\" is missing or not an object";
    if (why) {
        json_decref(j);
        return sf_fail(f, SLUICE_EINVAL, "%s: %s" SF_EMPTY_NOTE, f->path, why);
    }
    *root = j;
    return SLUICE_OK;
}

/* Check one node's entry; NULL and *rec filled, or what is wrong (in buf). */
static const char *sf_record(const struct sluice_statefile *f, json_t *o,
                             struct sluice_lock_record *rec, char *buf, size_t size)
{
    memset(rec, 0, sizeof *rec);
    if (!json_is_object(o))
        return "the entry is not an object";
    json_t *ceiling = json_object_get(o, "ceiling"), *locked = json_object_get(o, "locked_at");
    json_t *expires = json_object_get(o, "expires_at"), *policy = json_object_get(o, "policy");
    if (!json_is_integer(ceiling) || json_integer_value(ceiling) < 1 ||
        json_integer_value(ceiling) > UINT32_MAX)
        return "\"ceiling\" is missing or not an integer in 1..4294967295";
    if (!json_is_integer(locked) || json_integer_value(locked) < 0)
        return "\"locked_at\" is missing or not a non-negative integer (epoch seconds)";
    if (!json_is_integer(expires) || json_integer_value(expires) <= json_integer_value(locked))
        return "\"expires_at\" is missing, not an integer, or not after \"locked_at\"";
    if (!json_is_string(policy) || json_string_length(policy) >= SLUICE_POLICY_NAME_MAX)
        return "\"policy\" is missing, not a string, or longer than 31 bytes";
    int64_t ahead = (int64_t)json_integer_value(locked) - sf_now_s(f);
    if (ahead > SLUICE_DISCOVERY_SKEW_S) {
        snprintf(buf, size,
                 "\"locked_at\" is %" PRId64 " s in the future (a clock set back, or a file "
                 "from another machine)",
                 ahead);
        return buf;
    }
    rec->ceiling = (uint32_t)json_integer_value(ceiling);
    rec->locked_at_s = (int64_t)json_integer_value(locked);
    rec->expires_s = (int64_t)json_integer_value(expires);
    snprintf(rec->policy, sizeof rec->policy, "%s", json_string_value(policy));
    return NULL;
}

static int sf_check_node(struct sluice_statefile *f, const char *node)
{
    size_t n = node ? strlen(node) : 0;
    if (n == 0 || n >= SLUICE_NODE_ID_MAX)
        return sf_fail(f, SLUICE_EINVAL, "%s: node ID is %s (1..%d bytes)", f->path,
                       n ? "too long" : "empty", SLUICE_NODE_ID_MAX - 1);
    return SLUICE_OK;
}

static void sf_wait_all(struct sluice_statefile *f);

int sluice_statefile_load(struct sluice_statefile *f, const char *node, struct sluice_lock_record *out)
{
    memset(out, 0, sizeof *out);
    sf_wait_all(f); /* read this process's own writes */
    pthread_mutex_lock(&f->mu);
    struct text t;
    json_t *root = NULL;
    int status = sf_check_node(f, node);
    if (status == SLUICE_OK)
        status = sf_read(f, &t);
    if (status == SLUICE_OK && t.p) {
        status = sf_parse(f, &t, &root);
        free(t.p);
    }
    json_t *entry = root ? json_object_get(json_object_get(root, "nodes"), node) : NULL;
    if (entry) {
        char buf[200];
        const char *why = sf_record(f, entry, out, buf, sizeof buf);
        if (why)
            status = sf_fail(f, SLUICE_EINVAL, "%s: node \"%s\": %s; the node starts without a lock",
                             f->path, node, why);
    }
    json_decref(root);
    pthread_mutex_unlock(&f->mu);
    return status;
}

int sluice_statefile_foreach(struct sluice_statefile *f,
                             int (*fn)(void *ctx, const char *node,
                                       const struct sluice_lock_record *rec, const char *problem),
                             void *ctx)
{
    sf_wait_all(f);
    pthread_mutex_lock(&f->mu);
    struct text t;
    json_t *root = NULL;
    int status = sf_read(f, &t);
    if (status == SLUICE_OK && t.p) {
        status = sf_parse(f, &t, &root);
        free(t.p);
    }
    pthread_mutex_unlock(&f->mu);
    const char *key;
    json_t *entry;
    json_object_foreach(json_object_get(root, "nodes"), key, entry) {
        struct sluice_lock_record rec;
        char buf[200];
        const char *why = sf_record(f, entry, &rec, buf, sizeof buf);
        int r = fn(ctx, key, why ? NULL : &rec, why);
        if (r) {
            status = r;
            break;
        }
    }
    json_decref(root);
    return status;
}

/* ---- raw spans of a validated document --------------------------------------------- */

struct member {
    size_t k0, k1, v0, v1; /* key (with quotes) and value byte ranges */
};

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (s[i] == '"')
        return skip_string(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < n) {
            char c = s[i];
            if (c == '"') {
                i = skip_string(s, i, n);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i]))
        i++;
    return i;
}

/* The members of the object starting at s[i] == '{' (text jansson accepted). */
static int scan_members(const char *s, size_t i, size_t n, struct member **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    size_t cap = 0;
    i = skip_ws(s, i + 1, n);
    while (i < n && s[i] == '"') {
        struct member m;
        m.k0 = i;
        m.k1 = skip_string(s, i, n);
        i = skip_ws(s, m.k1, n) + 1; /* the ':' */
        m.v0 = skip_ws(s, i, n);
        m.v1 = skip_value(s, m.v0, n);
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            struct member *grown = realloc(*out, cap * sizeof *grown);
            if (!grown)
                return SLUICE_ENOMEM;
            *out = grown;
        }
        (*out)[(*count)++] = m;
        i = skip_ws(s, m.v1, n);
        if (i < n && s[i] == ',')
            i = skip_ws(s, i + 1, n);
    }
    return SLUICE_OK;
}

/* The decoded key of a member equals `key`. */
static bool member_is(const char *s, const struct member *m, const char *key)
{
    json_t *k = json_loadb(s + m->k0, m->k1 - m->k0, JSON_DECODE_ANY, NULL);
    bool eq = json_is_string(k) && !strcmp(json_string_value(k), key);
    json_decref(k);
    return eq;
}

/* ---- writing ------------------------------------------------------------------ */

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
                return sf_fail(f, SLUICE_EIO, "%s: cannot create directory %s: %s", f->path, path,
                               strerror(errno));
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
        *status = sf_fail(f, SLUICE_EIO,
                          "%s: lock file %s is a symbolic link; sluice never follows it (remove "
                          "the link: the lock file is made on the next write)",
                          f->path, lock);
        return -1;
    }
    if (fd < 0) {
        *status = sf_fail(f, SLUICE_EIO, "%s: cannot open lock file %s: %s", f->path, lock,
                          strerror(errno));
        return -1;
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        *status = sf_not_regular(f, lock, &st);
        return -1;
    }
    for (uint32_t waited = 0;; waited += 10) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            *status = sf_fail(f, SLUICE_EIO, "%s: cannot lock %s: %s", f->path, lock,
                              strerror(errno));
            break;
        }
        if (waited >= f->lock_wait_ms) {
            *status = sf_fail(f, SLUICE_EIO,
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
        return sf_fail(f, SLUICE_EIO, "%s: cannot create %s: %s (is the directory writable?)",
                       f->path, tmp, strerror(errno));
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
        return sf_fail(f, SLUICE_EIO, "%s: cannot write %s: %s (the old file is unchanged)",
                       f->path, tmp, strerror(err));
    }
    if (rename(tmp, f->target.file) != 0) {
        err = errno;
        unlink(tmp);
        return sf_fail(f, SLUICE_EIO, "%s: cannot rename %s over it: %s", f->path, tmp,
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
        return sf_fail(f, SLUICE_EIO, "%s: saved, but fsync of directory %s failed: %s", f->path,
                       f->target.dir, strerror(err));
    return SLUICE_OK;
}

/* `"node": {"ceiling": ...}` for a record; false when the node ID is not valid UTF-8. */
static bool sf_render_entry(struct sluice__strbuf *o, const char *node, const struct sluice_lock_record *rec)
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

/*
 * Write `node`'s record (rec NULL: drop it), keeping every other entry's
 * bytes. Call under f->mu with the flock held.
 */
static int sf_rewrite(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec)
{
    struct text t;
    char kept[sizeof f->error];
    memcpy(kept, f->error, sizeof kept);
    uint64_t failures = f->failures;
    int status = sf_read(f, &t);
    if (status != SLUICE_OK && status != SLUICE_EINVAL)
        return status; /* cannot read it: do not replace what we could not see */
    json_t *root = NULL;
    if (status == SLUICE_OK && t.p)
        status = sf_parse(f, &t, &root);
    if (status != SLUICE_OK) {
        /* A file too large or not a state file is replaced by a clean one, as its message
         * says; that is this write succeeding, not failing, so the problem (reported by
         * every load) is not counted again here. */
        memcpy(f->error, kept, sizeof kept);
        f->failures = failures;
        status = SLUICE_OK;
    }
    struct member *top = NULL, *nodes = NULL;
    size_t n_top = 0, n_nodes = 0;
    const char *s = t.p;
    if (root) {
        size_t start = skip_ws(s, 0, t.len);
        if (scan_members(s, start, t.len, &top, &n_top) != SLUICE_OK)
            status = SLUICE_ENOMEM;
        for (size_t i = 0; status == SLUICE_OK && i < n_top; i++)
            if (member_is(s, &top[i], "nodes") &&
                scan_members(s, top[i].v0, t.len, &nodes, &n_nodes) != SLUICE_OK)
                status = SLUICE_ENOMEM;
    }
    bool present = false;
    for (size_t i = 0; i < n_nodes; i++)
        present |= member_is(s, &nodes[i], node);
    struct sluice__strbuf o = {0};
    if (status == SLUICE_OK && (rec || present || !root)) {
        char head[128];
        snprintf(head, sizeof head, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n",
                 SLUICE_STATEFILE_FORMAT, SLUICE_STATEFILE_VERSION);
        sluice__strbuf_puts(&o, head);
        for (size_t i = 0; i < n_top; i++) /* members this version does not know: kept */
            if (!member_is(s, &top[i], "format") && !member_is(s, &top[i], "version") &&
                !member_is(s, &top[i], "nodes")) {
                sluice__strbuf_puts(&o, "  ");
                sluice__strbuf_put(&o, s + top[i].k0, top[i].k1 - top[i].k0);
                sluice__strbuf_puts(&o, ": ");
                sluice__strbuf_put(&o, s + top[i].v0, top[i].v1 - top[i].v0);
                sluice__strbuf_puts(&o, ",\n");
            }
        sluice__strbuf_puts(&o, "  \"nodes\": {");
        bool first = true, written = false;
        for (size_t i = 0; i < n_nodes && status == SLUICE_OK; i++) {
            bool mine = member_is(s, &nodes[i], node);
            if (mine && !rec)
                continue;
            sluice__strbuf_puts(&o, first ? "\n" : ",\n");
            first = false;
            if (mine) {
                if (!sf_render_entry(&o, node, rec))
                    status = SLUICE_EINVAL;
                written = true;
                continue;
            }
            sluice__strbuf_puts(&o, "    ");
            sluice__strbuf_put(&o, s + nodes[i].k0, nodes[i].k1 - nodes[i].k0);
            sluice__strbuf_puts(&o, ": ");
            sluice__strbuf_put(&o, s + nodes[i].v0, nodes[i].v1 - nodes[i].v0);
        }
        if (rec && !written && status == SLUICE_OK) {
            sluice__strbuf_puts(&o, first ? "\n" : ",\n");
            first = false;
            if (!sf_render_entry(&o, node, rec))
                status = SLUICE_EINVAL;
        }
        sluice__strbuf_puts(&o, first ? "}\n}\n" : "\n  }\n}\n");
        if (status == SLUICE_EINVAL)
            sf_fail(f, status, "%s: node ID \"%s\" is not valid UTF-8", f->path, node);
        else if (o.oom)
            status = sf_fail(f, SLUICE_ENOMEM, "%s: out of memory building the file", f->path);
        else
            status = sf_write_atomic(f, o.p, o.len);
    }
    free(o.p);
    free(top);
    free(nodes);
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
    struct sf_target *t = &f->target;
    snprintf(t->file, sizeof t->file, "%s", f->path);
    int hops = 0;
    for (;; hops++) {
        char link[4096];
        ssize_t n = readlink(t->file, link, sizeof link);
        if (n < 0 && (errno == EINVAL || errno == ENOENT || errno == ENOTDIR))
            break; /* not a link, or nothing there yet: write it here */
        if (n < 0)
            return sf_fail(f, SLUICE_EIO, "%s: cannot read the symbolic link %s: %s", f->path,
                           t->file, strerror(errno));
        if (hops == SF_LINKS_MAX || (size_t)n == sizeof link)
            return sf_fail(f, SLUICE_EIO,
                           "%s: more than %d symbolic links (or one too long) to follow; point "
                           "sluice_statefile_desc.path at the file itself",
                           f->path, SF_LINKS_MAX);
        link[n] = '\0';
        char dir[4096];
        sf_dirname(t->file, dir, sizeof dir);
        int len = link[0] == '/' ? snprintf(t->file, sizeof t->file, "%s", link)
                                 : snprintf(t->file, sizeof t->file, "%s/%s", dir, link);
        if (len < 0 || (size_t)len >= sizeof t->file - 32)
            return sf_fail(f, SLUICE_EIO, "%s: the file its link points to has too long a path",
                           f->path);
    }
    snprintf(t->lock, sizeof t->lock, "%s.lock", t->file);
    sf_dirname(t->file, t->dir, sizeof t->dir);
    return SLUICE_OK;
}

/* Write (rec NULL: drop) one node's record now, on this thread. */
static int sf_modify(struct sluice_statefile *f, const char *node,
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

/* ---- the writer thread ------------------------------------------------------------ */

/* The next node with a record not yet written, round robin so that no node's
 * stream of saves starves another's; NULL if none. Call under wmu. */
static struct sf_pending *sf_next_queued(struct sluice_statefile *f)
{
    for (size_t i = 0; i < f->n_pending; i++) {
        struct sf_pending *e = &f->pending[(f->cursor + i) % f->n_pending];
        if (e->queued > e->landed) {
            f->cursor = (size_t)(e - f->pending) + 1;
            return e;
        }
    }
    return NULL;
}

/* Write each node's newest record until the queue is empty and close asks to stop. */
static void *sf_writer(void *arg)
{
    struct sluice_statefile *f = arg;
    pthread_mutex_lock(&f->wmu);
    for (;;) {
        struct sf_pending *e = sf_next_queued(f);
        if (!e) {
            if (f->stopping)
                break;
            pthread_cond_wait(&f->work, &f->wmu);
            continue;
        }
        size_t at = (size_t)(e - f->pending); /* the array may move while we write */
        char node[SLUICE_NODE_ID_MAX];
        memcpy(node, e->node, sizeof node);
        struct sluice_lock_record rec = e->rec;
        uint64_t seq = e->queued;
        pthread_mutex_unlock(&f->wmu);
        int status = sf_modify(f, node, rec.ceiling ? &rec : NULL);
        pthread_mutex_lock(&f->wmu);
        e = &f->pending[at];
        e->landed = seq;
        e->last_status = status;
        if (status != SLUICE_OK) {
            e->unreported = status;
            e->unreported_seq = seq;
        }
        pthread_cond_broadcast(&f->landed);
    }
    pthread_mutex_unlock(&f->wmu);
    return NULL;
}

/* The pending entry of `node`, made if needed; NULL when out of memory. Call under wmu. */
static struct sf_pending *sf_entry(struct sluice_statefile *f, const char *node, bool make)
{
    for (size_t i = 0; i < f->n_pending; i++)
        if (!strcmp(f->pending[i].node, node))
            return &f->pending[i];
    if (!make)
        return NULL;
    if (f->n_pending == f->cap_pending) {
        size_t cap = f->cap_pending ? 2 * f->cap_pending : 8;
        struct sf_pending *grown = realloc(f->pending, cap * sizeof *grown);
        if (!grown)
            return NULL;
        f->pending = grown;
        f->cap_pending = cap;
    }
    struct sf_pending *e = &f->pending[f->n_pending++];
    memset(e, 0, sizeof *e);
    snprintf(e->node, sizeof e->node, "%s", node);
    return e;
}

/*
 * Hand `node`'s record (rec NULL: drop it) to the writer thread, replacing
 * any record of that node it has not written yet. Returns SLUICE_OK and the
 * write's ticket in *ticket; SLUICE_EAGAIN when there is no writer thread
 * (it could not be started: the caller writes itself); or SLUICE_ENOMEM.
 * *reported (NULL: leave it for someone else) takes a background failure of
 * that node nobody was told of yet.
 */
static int sf_enqueue(struct sluice_statefile *f, const char *node,
                      const struct sluice_lock_record *rec, uint64_t *ticket, int *reported)
{
    int status = SLUICE_OK;
    pthread_mutex_lock(&f->wmu);
    if (!f->writer_running && !f->writer_failed) {
        if (pthread_create(&f->writer, NULL, sf_writer, f) == 0)
            f->writer_running = true;
        else
            f->writer_failed = true;
    }
    struct sf_pending *e = f->writer_running ? sf_entry(f, node, true) : NULL;
    if (!f->writer_running) {
        status = SLUICE_EAGAIN;
    } else if (!e) {
        status = SLUICE_ENOMEM;
    } else {
        if (rec)
            e->rec = *rec;
        else
            memset(&e->rec, 0, sizeof e->rec);
        e->queued = *ticket = ++f->seq;
        if (reported) {
            *reported = e->unreported;
            e->unreported = SLUICE_OK;
        }
        pthread_cond_signal(&f->work);
    }
    pthread_mutex_unlock(&f->wmu);
    if (status == SLUICE_ENOMEM) {
        pthread_mutex_lock(&f->mu);
        status = sf_fail(f, SLUICE_ENOMEM, "%s: out of memory queueing the write of node \"%s\"",
                         f->path, node);
        pthread_mutex_unlock(&f->mu);
    }
    return status;
}

/*
 * Wait until `node`'s write `ticket` (or a newer one) has landed. Returns
 * that write's status, or (report_any) the background failure nobody was
 * told of yet, if any; either way that failure counts as told.
 */
static int sf_wait(struct sluice_statefile *f, const char *node, uint64_t ticket, bool report_any)
{
    pthread_mutex_lock(&f->wmu);
    struct sf_pending *e = sf_entry(f, node, false);
    size_t at = e ? (size_t)(e - f->pending) : 0;
    while (e && f->pending[at].landed < ticket)
        pthread_cond_wait(&f->landed, &f->wmu);
    int status = SLUICE_OK;
    if (e) {
        e = &f->pending[at];
        status = report_any ? e->unreported : e->last_status;
        if (report_any || e->unreported_seq >= ticket)
            e->unreported = SLUICE_OK; /* this caller is told */
    }
    pthread_mutex_unlock(&f->wmu);
    return status;
}

/* Wait until every write handed in so far has landed (or been replaced by one that has). */
static void sf_wait_all(struct sluice_statefile *f)
{
    pthread_mutex_lock(&f->wmu);
    uint64_t target = f->seq;
    for (size_t i = 0; i < f->n_pending; i++)
        while (f->pending[i].landed < (f->pending[i].queued < target ? f->pending[i].queued : target))
            pthread_cond_wait(&f->landed, &f->wmu);
    pthread_mutex_unlock(&f->wmu);
}

/*
 * Hand a write to the writer thread. `wait`: wait for it to land and return
 * its status (direct calls; ordered with every other write, as they share
 * the thread); else return at once, with an earlier background failure of
 * that node if one was never reported (the store ops).
 */
static int sf_write(struct sluice_statefile *f, const char *node,
                    const struct sluice_lock_record *rec, bool wait)
{
    pthread_mutex_lock(&f->mu);
    int status = sf_check_node(f, node);
    pthread_mutex_unlock(&f->mu);
    if (status != SLUICE_OK)
        return status;
    uint64_t ticket = 0;
    int reported = SLUICE_OK;
    status = sf_enqueue(f, node, rec, &ticket, wait ? NULL : &reported);
    if (status == SLUICE_EAGAIN)
        return sf_modify(f, node, rec);
    if (status != SLUICE_OK)
        return status;
    return wait ? sf_wait(f, node, ticket, false) : reported;
}

int sluice_statefile_save(struct sluice_statefile *f, const char *node,
                          const struct sluice_lock_record *rec)
{
    return sf_write(f, node, rec && rec->ceiling ? rec : NULL, true); /* ceiling 0: "no record" */
}

int sluice_statefile_clear(struct sluice_statefile *f, const char *node)
{
    return sf_write(f, node, NULL, true);
}

int sluice_statefile_sync(struct sluice_statefile *f, const char *node)
{
    if (!node) {
        sf_wait_all(f);
        return SLUICE_OK;
    }
    pthread_mutex_lock(&f->wmu);
    struct sf_pending *e = sf_entry(f, node, false);
    uint64_t ticket = e ? e->queued : 0;
    pthread_mutex_unlock(&f->wmu);
    return sf_wait(f, node, ticket, true);
}

static int sf_ops_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    return sluice_statefile_load((struct sluice_statefile *)ctx, node, out);
}

static int sf_ops_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    return sf_write((struct sluice_statefile *)ctx, node, rec && rec->ceiling ? rec : NULL, false);
}

static int sf_ops_clear(void *ctx, const char *node)
{
    return sf_write((struct sluice_statefile *)ctx, node, NULL, false);
}

static int sf_ops_sync(void *ctx, const char *node)
{
    return sluice_statefile_sync((struct sluice_statefile *)ctx, node);
}

struct sluice_store_ops sluice_statefile_ops(struct sluice_statefile *f)
{
    struct sluice_store_ops ops = {.load = sf_ops_load, .save = sf_ops_save,
                                   .clear = sf_ops_clear, .ctx = f, .sync = sf_ops_sync};
    return ops;
}
