/*
 * admin_fixture.h — what the admin, state-file, sluicectl and page tests
 * share: an engine whose nodes sit in each state, an HTTP client for the
 * admin endpoint (libcurl, bounded by a timeout), temp directories and a
 * child-process runner with captured output.
 *
 * The engine (fixture_start):
 *   cloud:default_ollama  adaptive, active 64, probing at the jumpstart (5)
 *   cloud:locked          adaptive, restored locked at ceiling 12 from the store
 *   cloud:rainy           adaptive, one overload → backoff (fixture_backoff)
 *   local:gpu             fixed, active 4
 *   openrouter            the built-in preset (fixed; listed only once it has traffic)
 * A test passes its own store (or NULL for a fresh memory store with the
 * cloud:locked record already in it).
 *
 * Everything is static inline: each test file gets its own copy.
 */
#ifndef SLUICE_TESTS_E2E_ADMIN_FIXTURE_H
#define SLUICE_TESTS_E2E_ADMIN_FIXTURE_H

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sluice/admin.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

#define FIXTURE_LOCKED_CEILING 12u

struct fixture {
    struct sluice_memstore *mem; /* when the fixture made the store */
    struct sluice_store_ops ops;
    struct sluice_engine *engine;
    struct sluice_admin *admin;
    char base[64]; /* http://127.0.0.1:PORT */
};

/* The library's wall clock (CLOCK_REALTIME), not time(NULL): glibc's time() reads the
 * kernel's coarse clock, which lags it by up to a tick, so just after a second begins a
 * lock the library stamped with the new second read as one from the future. */
static inline int64_t fixture_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

/* A live lock record, as a store would hold one. */
static inline struct sluice_lock_record fixture_lock(uint32_t ceiling, int64_t ttl_s)
{
    struct sluice_lock_record rec;
    memset(&rec, 0, sizeof rec);
    rec.ceiling = ceiling;
    rec.locked_at_s = fixture_now_s() - 60;
    rec.expires_s = fixture_now_s() + ttl_s;
    snprintf(rec.policy, sizeof rec.policy, "discover");
    return rec;
}

static inline struct sluice_engine *fixture_engine(const struct sluice_store_ops *store)
{
    static const struct sluice_discovery_desc adaptive = {.lock_ttl_s = 86400};
    const struct sluice_backend_desc backends[] = {
        {.id = "cloud:default_ollama", .active = 64, .discovery = &adaptive},
        {.id = "cloud:locked", .active = 64, .discovery = &adaptive},
        {.id = "cloud:rainy", .active = 64, .discovery = &adaptive},
        {.id = "local:gpu", .active = 4},
    };
    char err[256];
    struct sluice_engine *e = NULL;
    int status = sluice_engine_create(
        &(struct sluice_engine_desc){.backends = backends, .n_backends = 4, .store = store,
                                     .error = err, .error_size = sizeof err},
        &e);
    cr_assert_eq(status, SLUICE_OK, "engine: %s", err);
    return e;
}

/* One overload on `node`, refused with one call in flight: its limit is cut to 1
 * (the evidence says one was too many) and it backs off. */
static inline void fixture_backoff(struct sluice_engine *e, const char *node)
{
    struct sluice_pool *p = sluice_engine_pool(e, node);
    struct sluice_call call;
    cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
    sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OVERLOAD, 0);
    sluice_discovery_sync(sluice_pool_discovery(p));
}

/* Engine (+ memory store unless `store`) and admin on a free port. `f` is zeroed (static)
 * or was started before: what it still runs is stopped first. */
static inline void fixture_stop(struct fixture *f);

static inline void fixture_serve(struct fixture *f, const struct sluice_admin_desc *extra);

static inline void fixture_start(struct fixture *f, const struct sluice_store_ops *store,
                                 const struct sluice_admin_desc *extra)
{
    fixture_stop(f); /* a runner without .fini (the TSan stand-in) leaves the last one */
    memset(f, 0, sizeof *f);
    if (!store) {
        cr_assert_eq(sluice_memstore_create(16, NULL, &f->mem), SLUICE_OK);
        f->ops = sluice_memstore_ops(f->mem);
        struct sluice_lock_record rec = fixture_lock(FIXTURE_LOCKED_CEILING, 3600);
        cr_assert_eq(f->ops.save(f->ops.ctx, "cloud:locked", &rec), SLUICE_OK);
        store = &f->ops;
    }
    f->engine = fixture_engine(store);
    fixture_backoff(f->engine, "cloud:rainy");
    fixture_serve(f, extra);
}

/* An engine of just `backends` (no store) and its admin on a free port, as fixture_start. */
static inline void fixture_start_backends(struct fixture *f, const struct sluice_backend_desc *backends,
                                          size_t n)
{
    fixture_stop(f);
    memset(f, 0, sizeof *f);
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = backends, .n_backends = n,
                                                                   .error = err, .error_size = sizeof err},
                                      &f->engine),
                 SLUICE_OK, "engine: %s", err);
    fixture_serve(f, NULL);
}

/*
 * fixture_start over the state file at `path`, holding cloud:locked's lock, with the
 * admin told of it (desc.statefile); *sf is the file: close it after fixture_stop. Then
 * another program's file takes its place, so every write of it fails with SLUICE_EIO
 * and a message naming the path (sluice/statefile.h) while the engine keeps the lock it
 * restored.
 */
static inline void fixture_start_unwritable_state(struct fixture *f, const char *path,
                                                  struct sluice_statefile **sf)
{
    cr_assert_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = path}, sf),
                 SLUICE_OK);
    struct sluice_lock_record rec = fixture_lock(FIXTURE_LOCKED_CEILING, 3600);
    cr_assert_eq(sluice_statefile_save(*sf, "cloud:locked", &rec), SLUICE_OK);
    static struct sluice_store_ops ops;
    ops = sluice_statefile_ops(*sf);
    fixture_start(f, &ops, &(struct sluice_admin_desc){.statefile = *sf});
    FILE *other = fopen(path, "w");
    cr_assert_not_null(other, "%s: %s", path, strerror(errno));
    fputs("{\"format\": \"another-program\", \"settings\": {}}\n", other);
    cr_assert_eq(fclose(other), 0);
}

/* Start the admin of f->engine on a free port (with `extra`'s limits, if any). */
static inline void fixture_serve(struct fixture *f, const struct sluice_admin_desc *extra)
{
    struct sluice_admin_desc d;
    memset(&d, 0, sizeof d);
    if (extra)
        d = *extra;
    d.engine = f->engine;
    d.port = SLUICE_SOME(0);
    char err[256];
    d.error = err;
    d.error_size = sizeof err;
    cr_assert_eq(sluice_admin_start(&d, &f->admin), SLUICE_OK, "admin: %s", err);
    snprintf(f->base, sizeof f->base, "http://127.0.0.1:%u", sluice_admin_port(f->admin));
}

static inline void fixture_stop(struct fixture *f)
{
    sluice_admin_stop(f->admin);
    f->admin = NULL;
    if (f->engine) {
        sluice_engine_close(f->engine);
        sluice_engine_destroy(f->engine);
        f->engine = NULL;
    }
    sluice_memstore_destroy(f->mem);
    f->mem = NULL;
}

/* ---- HTTP ------------------------------------------------------------------ */

struct reply {
    long status;
    char *body; /* NUL-terminated, malloc */
    size_t len;
    char content_type[256];
    char allow[256];
};

static inline size_t reply_body(char *p, size_t size, size_t n, void *ctx)
{
    struct reply *r = (struct reply *)ctx;
    char *b = (char *)realloc(r->body, r->len + size * n + 1);
    if (!b)
        return 0;
    memcpy(b + r->len, p, size * n);
    r->len += size * n;
    b[r->len] = '\0';
    r->body = b;
    return size * n;
}

static inline size_t reply_header(char *p, size_t size, size_t n, void *ctx)
{
    struct reply *r = (struct reply *)ctx;
    size_t len = size * n;
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)(len < 255 ? len : 255), p);
    line[strcspn(line, "\r\n")] = '\0';
    if (!strncasecmp(line, "Content-Type: ", 14))
        snprintf(r->content_type, sizeof r->content_type, "%s", line + 14);
    if (!strncasecmp(line, "Allow: ", 7))
        snprintf(r->allow, sizeof r->allow, "%s", line + 7);
    return len;
}

/* method + base + path; `headers` NULL-terminated (or NULL); `body` may be NULL. */
static inline struct reply http(const char *method, const char *base, const char *path,
                                const char *const *headers, const char *body)
{
    struct reply r;
    memset(&r, 0, sizeof r);
    char url[2048];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, reply_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, reply_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    struct curl_slist *h = NULL;
    for (size_t i = 0; headers && headers[i]; i++)
        h = curl_slist_append(h, headers[i]);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    cr_assert_eq(rc, CURLE_OK, "%s %s: %s", method, url, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (!r.body)
        r.body = (char *)calloc(1, 1);
    return r;
}

static inline void reply_free(struct reply *r)
{
    free(r->body);
    r->body = NULL;
}

/* ---- temp directories ------------------------------------------------------- */

static inline void fixture_tmpdir(char *out, size_t size)
{
    snprintf(out, size, "/tmp/sluice-e2e-XXXXXX");
    cr_assert_not_null(mkdtemp(out), "mkdtemp: %s", strerror(errno));
}

static inline void fixture_rmtree(const char *dir)
{
    if (!dir[0] || strncmp(dir, "/tmp/sluice-e2e-", 16) != 0)
        return;
    char cmd[128];
    /* Temp dirs are /tmp/sluice-e2e-XXXXXX: short, no quotes. */
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%.40s' 2>/dev/null; rm -rf '%.40s'", dir, dir);
    if (system(cmd) != 0) {
        /* best effort: a leftover temp dir is not a test failure */
    }
}

/* ---- child processes -------------------------------------------------------- */

struct proc_result {
    int exit_code; /* -1: killed by a signal or timed out */
    bool timed_out;
    char out[1 << 20], err[1 << 16]; /* a page's DOM fits */
};

/* Drain fd into buf (bounded); false on EOF. */
static inline bool proc_drain(int fd, char *buf, size_t size, size_t *len)
{
    char tmp[4096];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n <= 0)
        return false;
    size_t room = size - 1 - *len;
    size_t take = (size_t)n < room ? (size_t)n : room;
    memcpy(buf + *len, tmp, take);
    *len += take;
    buf[*len] = '\0';
    return true;
}

/* Run argv (argv[0] a path) with `env` entries added ("K=V", NULL-terminated), capture
 * stdout and stderr, kill it after timeout_ms. */
static inline struct proc_result *proc_run(const char *const *argv, const char *const *env,
                                           int timeout_ms)
{
    struct proc_result *r = (struct proc_result *)calloc(1, sizeof *r);
    int out[2], err[2];
    cr_assert_eq(pipe(out), 0);
    cr_assert_eq(pipe(err), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    size_t olen = 0, elen = 0;
    bool oopen = true, eopen = true;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (oopen || eopen) {
        struct pollfd p[2] = {{.fd = oopen ? out[0] : -1, .events = POLLIN},
                              {.fd = eopen ? err[0] : -1, .events = POLLIN}};
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long spent = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent >= timeout_ms) {
            r->timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        if (poll(p, 2, (int)(timeout_ms - spent)) <= 0)
            continue;
        if (oopen && (p[0].revents & (POLLIN | POLLHUP)))
            oopen = proc_drain(out[0], r->out, sizeof r->out, &olen);
        if (eopen && (p[1].revents & (POLLIN | POLLHUP)))
            eopen = proc_drain(err[0], r->err, sizeof r->err, &elen);
    }
    close(out[0]);
    close(err[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    r->exit_code = WIFEXITED(ws) && !r->timed_out ? WEXITSTATUS(ws) : -1;
    return r;
}

/* The last non-empty line of `s` (into buf). */
static inline const char *last_line(const char *s, char *buf, size_t size)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        n--;
    size_t start = n;
    while (start && s[start - 1] != '\n')
        start--;
    snprintf(buf, size, "%.*s", (int)(n - start), s + start);
    return buf;
}

#endif /* SLUICE_TESTS_E2E_ADMIN_FIXTURE_H */
