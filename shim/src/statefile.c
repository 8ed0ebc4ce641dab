/*
 * statefile.c — the state file (sluice/statefile.h): discovered ceilings in
 * a JSON file, written the durable way (temp → fsync → rename → fsync dir)
 * under an flock on a separate lock file. This file holds the handle:
 * open, close, its path and its errors; the other parts are listed in
 * statefile_internal.h.
 */
#define _GNU_SOURCE
#include "statefile_internal.h"

#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sluice__sf_fail(struct sluice_statefile *f, int status, const char *fmt, ...)
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
    if (!buf && size)
        return SLUICE_EINVAL;
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

/*
 * What the first save needs, checked at open so a wrong path fails there and not at
 * the first lock: the path is not a directory, and its folder exists or can be made
 * (its nearest existing ancestor is a directory this process may write in). Nothing
 * is created: a tool that only reads (sluicectl status) leaves the disk alone. An
 * existing folder is not tested for writing: a reader may open a file it cannot
 * write, and a read-only folder fails each save with its own message. A dangling
 * symbolic link is left to the save, which resolves it. SLUICE_OK, or
 * SLUICE_EINVAL / SLUICE_EIO with the message in err.
 */
static int sf_check_path(const char *path, char *err, size_t size)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return SLUICE_OK; /* other kinds than a file are refused by each call */
        snprintf(err, size,
                 "%s is a directory (set sluice_statefile_desc.path to a file, e.g. "
                 "%s/ceilings.json)",
                 path, path);
        return SLUICE_EINVAL;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
        snprintf(err, size, "%s: %s", path, strerror(errno));
        return SLUICE_EIO;
    }
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
        return SLUICE_OK;
    char folder[4096], dir[4096];
    snprintf(folder, sizeof folder, "%s", path);
    char *slash = strrchr(folder, '/');
    if (!slash)
        return SLUICE_OK; /* in the working directory, which exists */
    *(slash == folder ? slash + 1 : slash) = '\0';
    snprintf(dir, sizeof dir, "%s", folder);
    int found;
    while ((found = stat(dir, &st)) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
        char *up = strrchr(dir, '/');
        if (!up)
            snprintf(dir, sizeof dir, ".");
        else
            *(up == dir ? up + 1 : up) = '\0';
    }
    if (found != 0) {
        snprintf(err, size, "%s: cannot look at %s: %s", path, dir, strerror(errno));
        return SLUICE_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, size,
                 "%s: %s is not a directory, so the folder %s cannot exist (fix "
                 "sluice_statefile_desc.path)",
                 path, dir, folder);
        return SLUICE_EINVAL;
    }
    if (strcmp(dir, folder) != 0 && access(dir, W_OK | X_OK) != 0) {
        snprintf(err, size,
                 "%s: the folder %s does not exist and cannot be made in %s: %s (create it, or "
                 "fix sluice_statefile_desc.path)",
                 path, folder, dir, strerror(errno));
        return SLUICE_EIO;
    }
    return SLUICE_OK;
}

int sluice_statefile_open(const struct sluice_statefile_desc *desc, struct sluice_statefile **out)
{
    if (out)
        *out = NULL;
    struct sluice_statefile_desc d;
    memset(&d, 0, sizeof d);
    if (desc)
        d = *desc;
    if (d.error && d.error_size)
        d.error[0] = '\0';
    if (!out)
        return sluice__fail(d.error, d.error_size,
                            "out is NULL (pass the address of a struct sluice_statefile *)");
    if (d.lock_wait_ms > 600000)
        return sluice__fail(d.error, d.error_size,
                            "sluice_statefile_desc.lock_wait_ms = %u is above 600000",
                            d.lock_wait_ms);
    char path[4096];
    if (d.path) {
        if (!d.path[0])
            return sluice__fail(d.error, d.error_size,
                                "sluice_statefile_desc.path is empty (pass a file path, or NULL "
                                "for the default location)");
        if (strlen(d.path) >= sizeof path - 32)
            return sluice__fail(d.error, d.error_size,
                                "sluice_statefile_desc.path is longer than %zu bytes",
                                sizeof path - 32);
        snprintf(path, sizeof path, "%s", d.path);
    } else {
        int n = sluice_statefile_default_path(path, sizeof path - 32);
        if (n < 0)
            return sluice__fail(d.error, d.error_size,
                                "no state file location: set sluice_statefile_desc.path, "
                                "XDG_STATE_HOME or HOME");
        if ((size_t)n >= sizeof path - 32)
            return sluice__fail(d.error, d.error_size,
                                "the default state file path is too long (set "
                                "sluice_statefile_desc.path)");
    }
    char why[4 * sizeof path]; /* up to three paths and the words around them */
    int checked = sf_check_path(path, why, sizeof why);
    if (checked != SLUICE_OK) {
        sluice__fail(d.error, d.error_size, "%s", why);
        return checked;
    }
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
    f->lock_wait_ms = d.lock_wait_ms;
    SLUICE__DEFAULT(f->lock_wait_ms, SLUICE_STATEFILE_LOCK_WAIT_MS_DEFAULT);
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
    return f ? f->path : NULL;
}

uint64_t sluice_statefile_last_error(struct sluice_statefile *f, char *buf, size_t size)
{
    if (!f) {
        if (buf && size)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&f->mu);
    if (buf && size)
        snprintf(buf, size, "%s", f->error);
    uint64_t n = f->failures;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* What a path that must be a regular file is instead, for a message. */
static const char *sf_file_kind(const struct stat *st)
{
    return S_ISFIFO(st->st_mode)                          ? "a FIFO"
           : S_ISDIR(st->st_mode)                         ? "a directory"
           : S_ISSOCK(st->st_mode)                        ? "a socket"
           : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "a device"
           : S_ISLNK(st->st_mode)                         ? "a symbolic link"
                                                          : "of an unknown kind";
}

int sluice__sf_not_regular(struct sluice_statefile *f, const char *what, const struct stat *st)
{
    return sluice__sf_fail(f, SLUICE_EIO,
                           "%s: %s is %s, not a regular file; it is left alone (remove it, or set "
                           "sluice_statefile_desc.path to a regular file)",
                           f->path, what, sf_file_kind(st));
}

bool sluice__sf_node_ok(const char *node)
{
    size_t n = node ? strlen(node) : 0;
    return n > 0 && n < SLUICE_NODE_ID_MAX;
}

int sluice__sf_check_node(struct sluice_statefile *f, const char *node)
{
    size_t n = node ? strlen(node) : 0;
    if (!sluice__sf_node_ok(node))
        return sluice__sf_fail(f, SLUICE_EINVAL, "%s: node ID is %s (1..%d bytes)", f->path,
                               n ? "too long" : "empty", SLUICE_NODE_ID_MAX - 1);
    return SLUICE_OK;
}
