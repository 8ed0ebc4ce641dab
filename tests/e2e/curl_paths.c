/*
 * curl_paths.c — one rule whichever way a call goes. Every provider fixture
 * (tests/fixtures/providers/NAME.http) is served over loopback by a replay
 * server in this process and sent four ways: the chat client through
 * sluice_run and through sluice_chat_submit on the curl loop, and a plain
 * request through sluice_curl_perform_call and sluice_curl_loop_submit;
 * each must come back with the kind, outcome and hold that
 * sluice_curl_classify gives the fixture itself, and the chat's two paths
 * must give discovery the same sample.
 */
#include "e2e/curl_fixture.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sluice/client.h>
#include <sluice/run.h>

#define PATHS_TEST(name, ...)                                                                      \
    Test(curl_paths, name, .init = fx_setup, .fini = fx_teardown, .timeout = 60, ##__VA_ARGS__)

/* ---- a fixture, parsed, and a server that replays it --------------------------------- */

struct fixture {
    char name[64];
    char text[8192];
    long status;
    struct sluice_curl_header headers[32];
    size_t n_headers;
    const char *head; /* the status line (NUL-terminated in text) */
    const char *body;
    size_t body_len;
};

static void fixture_load(struct fixture *f, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/providers/%s", SLUICE_TEST_FIXTURES, file);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "fixture %s", path);
    size_t len = fread(f->text, 1, sizeof f->text - 1, fp);
    fclose(fp);
    f->text[len] = '\0';
    snprintf(f->name, sizeof f->name, "%.*s", (int)(strlen(file) - 5), file);
    char *line = f->text, *next = strchr(line, '\n');
    cr_assert_not_null(next, "%s: a status line", file);
    *next = '\0';
    f->head = line;
    cr_assert_eq(sscanf(line, "HTTP/1.1 %ld", &f->status), 1, "%s: status line", file);
    f->n_headers = 0;
    for (line = next + 1; (next = strchr(line, '\n')) && next != line; line = next + 1) {
        *next = '\0';
        char *colon = strchr(line, ':');
        cr_assert_not_null(colon, "%s: header line \"%s\"", file, line);
        cr_assert_lt(f->n_headers, sizeof f->headers / sizeof f->headers[0]);
        *colon = '\0';
        f->headers[f->n_headers++] = (struct sluice_curl_header){line, colon + 2};
    }
    f->body = next ? next + 1 : "";
    f->body_len = strlen(f->body);
}

/* What sluice_curl_classify says of the fixture as the transports see it (now, AUTO). */
static struct sluice_curl_result fixture_classify(const struct fixture *f)
{
    struct sluice_curl_response resp = {.http_status = f->status,
                                        .code = CURLE_OK,
                                        .request_sent = true,
                                        .retry_after_s = -1,
                                        .headers = f->headers,
                                        .n_headers = f->n_headers,
                                        .body = f->body,
                                        .body_len = f->body_len};
    struct sluice_curl_result out;
    sluice_curl_classify(&resp, &out);
    return out;
}

/* Answers every request on its port with `serving`, one connection per answer. */
struct replay {
    int listen_fd, port;
    pthread_t thread;
    _Atomic(const struct fixture *) serving;
};

/* Read a request through its body (Content-Length), so the answer never races it. */
static void replay_read_request(int fd)
{
    char buf[4096];
    size_t len = 0;
    long want = -1;
    while (len < sizeof buf - 1) {
        ssize_t got = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (got <= 0)
            return;
        len += (size_t)got;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && want < 0) {
            char *cl = strcasestr(buf, "Content-Length:");
            want = (long)(end + 4 - buf) + (cl ? strtol(cl + 15, NULL, 10) : 0);
        }
        if (want >= 0 && (long)len >= want)
            return;
    }
}

static void *replay_main(void *arg)
{
    struct replay *rp = arg;
    for (;;) {
        int fd = accept(rp->listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        replay_read_request(fd);
        const struct fixture *f = atomic_load(&rp->serving);
        char head[2048];
        int n = snprintf(head, sizeof head, "%s\r\n", f->head);
        for (size_t i = 0; i < f->n_headers; i++)
            n += snprintf(head + n, sizeof head - (size_t)n, "%s: %s\r\n", f->headers[i].name,
                          f->headers[i].value);
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: "
                      "close\r\n\r\n",
                      f->body_len);
        send(fd, head, (size_t)n, MSG_NOSIGNAL);
        send(fd, f->body, f->body_len, MSG_NOSIGNAL);
        close(fd);
    }
}

static void replay_start(struct replay *rp)
{
    memset(rp, 0, sizeof *rp);
    rp->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(rp->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(rp->listen_fd, 16), 0);
    getsockname(rp->listen_fd, (struct sockaddr *)&a, &len);
    rp->port = ntohs(a.sin_port);
    pthread_create(&rp->thread, NULL, replay_main, rp);
}

static void replay_stop(struct replay *rp)
{
    shutdown(rp->listen_fd, SHUT_RDWR);
    close(rp->listen_fd);
    pthread_join(rp->thread, NULL);
}

/* Every fixture file's name, sorted; returns how many. */
static size_t fixture_names(char names[][64], size_t max)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/providers", SLUICE_TEST_FIXTURES);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len > 5 && strcmp(de->d_name + len - 5, ".http") == 0) {
            cr_assert_lt(n, max, "more fixtures than the test has room for");
            snprintf(names[n++], 64, "%s", de->d_name);
        }
    }
    closedir(d);
    qsort(names, n, 64, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* ---- waiting for a loop's completion ------------------------------------------------- */

struct latch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    struct sluice_curl_result res;
};

static void latch_init(struct latch *l)
{
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->done = false;
}

static void latch_open(struct latch *l, int status, const struct sluice_curl_result *res)
{
    pthread_mutex_lock(&l->mu);
    l->status = status;
    if (res)
        l->res = *res;
    l->done = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Wait (bounded: 20 s) for the completion; its status. */
static int latch_wait(struct latch *l)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&l->mu);
    while (!l->done && pthread_cond_timedwait(&l->cv, &l->mu, &until) == 0) {
    }
    bool done = l->done;
    pthread_mutex_unlock(&l->mu);
    cr_assert(done, "the completion never ran");
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    return l->status;
}

static void on_chat_done(struct sluice_chat *chat, int status, void *data)
{
    (void)chat;
    latch_open(data, status, NULL);
}

static void on_curl_done(const struct sluice_curl_result *res, CURL *easy, void *data)
{
    (void)easy;
    latch_open(data, res->status, res);
}

/* ---- one classification path ------------------------------------------------------- */

/* The fields every path must agree on, named in the message when they do not. */
static void assert_same(const char *fixture, const char *path, const struct sluice_curl_result *got,
                        const struct sluice_curl_result *want)
{
    cr_expect_eq(got->kind, want->kind, "%s via %s: kind %s, sluice_curl_classify says %s",
                 fixture, path, sluice_curl_kind_name(got->kind), sluice_curl_kind_name(want->kind));
    cr_expect_eq(got->outcome, want->outcome, "%s via %s: outcome %d, want %d", fixture, path,
                 got->outcome, want->outcome);
    cr_expect_eq(got->hold_ns, want->hold_ns, "%s via %s: hold %lld ns, want %lld", fixture, path,
                 (long long)got->hold_ns, (long long)want->hold_ns);
    cr_expect_eq(got->retry_after_ns, want->retry_after_ns, "%s via %s: Retry-After %lld ns",
                 fixture, path, (long long)got->retry_after_ns);
    cr_expect_eq(got->http_status, want->http_status, "%s via %s: HTTP %ld", fixture, path,
                 got->http_status);
}

static struct sluice_chat *paths_chat(const char *base)
{
    struct sluice_chat *chat = NULL;
    cr_assert_eq(sluice_chat_create(&(struct sluice_chat_desc){.base_url = base,
                                                               .model = "m",
                                                               .prompt = "hi"},
                                    &chat),
                 SLUICE_OK);
    return chat;
}

PATHS_TEST(every_provider_fixture_is_classified_the_same_on_every_path)
{
    struct replay rp;
    replay_start(&rp);
    char url[96], base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/v1", rp.port);
    snprintf(url, sizeof url, "%s/chat/completions", base);
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    static char names[64][64];
    size_t n = fixture_names(names, 64);
    cr_assert_geq(n, 19, "the provider fixtures are there (%zu)", n);
    static struct fixture f;
    for (size_t i = 0; i < n; i++) {
        fixture_load(&f, names[i]);
        atomic_store(&rp.serving, &f);
        struct sluice_curl_result want = fixture_classify(&f);

        /* The chat through sluice_run: the result, and the sample discovery got. */
        struct sluice_chat *chat = paths_chat(base);
        struct sluice_run_result rr;
        sluice_run(e,
                   &(struct sluice_run_desc){.backend = FX_BACKEND,
                                             .ops = &sluice_chat_ops,
                                             .ctx = chat,
                                             .max_repairs = SLUICE_SOME(0)},
                   &rr);
        /* A chat that failed (every error answer; a 2xx without a reply) cannot tell
         * discovery the provider served it: sluice_run's rule, which the loop keeps too. */
        struct sluice_curl_result want_chat = want;
        if (rr.status != SLUICE_OK && want.outcome == SLUICE_OUTCOME_OK)
            want_chat.outcome = SLUICE_OUTCOME_IGNORE;
        assert_same(f.name, "sluice_run", sluice_chat_result(chat), &want_chat);
        cr_expect_eq(rr.last.outcome, want_chat.outcome, "%s: sluice_run's sample", f.name);
        cr_expect_eq(rr.last.retry_after_ns, want.hold_ns, "%s: sluice_run's hold", f.name);

        /* The same chat on the loop: its result is the sample the loop gave discovery. */
        struct latch l;
        latch_init(&l);
        cr_assert_eq(sluice_chat_submit(loop, chat,
                                        &(struct sluice_chat_request){.backend = FX_BACKEND,
                                                                      .done = on_chat_done,
                                                                      .data = &l},
                                        NULL),
                     SLUICE_OK);
        cr_expect_eq(latch_wait(&l), rr.client_status, "%s: the loop's status", f.name);
        assert_same(f.name, "sluice_chat_submit", sluice_chat_result(chat), &want_chat);
        sluice_chat_destroy(chat);

        /* A plain request, blocking and on the loop, with its write callback declared. */
        CURL *easy = fx_easy_url(url);
        struct sluice_curl_result res;
        cr_assert_eq(sluice_curl_perform_call(e,
                                              &(struct sluice_curl_call){.backend = FX_BACKEND,
                                                                         .easy = easy,
                                                                         .write = fx_discard},
                                              &res),
                     SLUICE_OK, "%s: %s", f.name, res.error);
        assert_same(f.name, "sluice_curl_perform_call", &res, &want);
        latch_init(&l);
        cr_assert_eq(sluice_curl_loop_submit(loop,
                                             &(struct sluice_curl_request){.backend = FX_BACKEND,
                                                                           .easy = easy,
                                                                           .done = on_curl_done,
                                                                           .data = &l,
                                                                           .write = fx_discard},
                                             NULL),
                     SLUICE_OK);
        cr_assert_eq(latch_wait(&l), SLUICE_OK, "%s", f.name);
        assert_same(f.name, "sluice_curl_loop_submit", &l.res, &want);
        curl_easy_cleanup(easy);
    }
    sluice_curl_loop_destroy(loop);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
    replay_stop(&rp);
}

/* ---- deadlines that cannot be right, named -------------------------------------------- */

/* What each way to call made of one deadline: its status and its result's error. */
struct verdict {
    const char *path;
    int status;
    char error[SLUICE_CURL_ERROR_MAX];
};

#define NOWHERE "http://127.0.0.1:1/v1" /* never reached: the deadline ends each call first */

static size_t every_path(struct sluice_engine *e, struct sluice_curl_loop *loop,
                         const struct timespec *deadline, struct verdict *v)
{
    size_t n = 0;
    CURL *easy = fx_easy_url(NOWHERE "/chat/completions");
    struct sluice_curl_result res;
    v[n] = (struct verdict){.path = "sluice_curl_perform_call"};
    v[n].status = sluice_curl_perform_call(
        e, &(struct sluice_curl_call){.backend = FX_BACKEND, .easy = easy, .deadline = deadline},
        &res);
    snprintf(v[n++].error, sizeof v->error, "%s", res.error);

    struct latch l;
    latch_init(&l);
    v[n] = (struct verdict){.path = "sluice_curl_loop_submit"};
    cr_assert_eq(sluice_curl_loop_submit(loop,
                                         &(struct sluice_curl_request){.backend = FX_BACKEND,
                                                                       .easy = easy,
                                                                       .deadline = deadline,
                                                                       .done = on_curl_done,
                                                                       .data = &l},
                                         NULL),
                 SLUICE_OK, "accepted: the loop's completion says why it ends");
    v[n].status = latch_wait(&l);
    snprintf(v[n++].error, sizeof v->error, "%s", l.res.error);
    curl_easy_cleanup(easy);

    struct sluice_chat *chat = paths_chat(NOWHERE);
    latch_init(&l);
    v[n] = (struct verdict){.path = "sluice_chat_submit"};
    cr_assert_eq(sluice_chat_submit(loop, chat,
                                    &(struct sluice_chat_request){.backend = FX_BACKEND,
                                                                  .deadline = deadline,
                                                                  .done = on_chat_done,
                                                                  .data = &l},
                                    NULL),
                 SLUICE_OK);
    v[n].status = latch_wait(&l);
    snprintf(v[n++].error, sizeof v->error, "%s", sluice_chat_result(chat)->error);
    sluice_chat_destroy(chat);
    return n;
}

PATHS_TEST(a_deadline_on_the_wrong_clock_is_einval_and_one_already_past_says_so)
{
    struct sluice_engine *e = fx_engine(4, -1, NULL);
    struct sluice_curl_loop *loop = NULL;
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e}, &loop),
                 SLUICE_OK);
    struct verdict v[4];

    /* CLOCK_REALTIME ten seconds from now: some 56 years ahead on CLOCK_MONOTONIC. */
    struct timespec realtime;
    clock_gettime(CLOCK_REALTIME, &realtime);
    realtime.tv_sec += 10;
    size_t n = every_path(e, loop, &realtime, v);
    struct sluice_chat *chat = paths_chat(NOWHERE);
    struct sluice_run_result rr;
    v[n] = (struct verdict){.path = "sluice_run (chat)"};
    v[n].status = sluice_run(e,
                             &(struct sluice_run_desc){.backend = FX_BACKEND,
                                                       .ops = &sluice_chat_ops,
                                                       .ctx = chat,
                                                       .deadline = &realtime},
                             &rr) == SLUICE_ECLIENT
                      ? rr.client_status
                      : rr.status;
    snprintf(v[n++].error, sizeof v->error, "%s", sluice_chat_result(chat)->error);
    sluice_chat_destroy(chat);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(v[i].status, SLUICE_EINVAL, "%s: %s, not EINVAL", v[i].path,
                     sluice_status_name(v[i].status));
        cr_expect(strstr(v[i].error, "CLOCK_MONOTONIC") && strstr(v[i].error, "sluice_deadline_in"),
                  "%s: the error names the clock and the fix: \"%s\"", v[i].path, v[i].error);
    }

    /* A second ago: ETIMEDOUT, saying the deadline had passed before the call. */
    struct timespec past = sluice_ns_timespec(sluice_monotonic_ns() - SLUICE_NS_PER_SEC);
    n = every_path(e, loop, &past, v);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(v[i].status, SLUICE_ETIMEDOUT, "%s: %s", v[i].path,
                     sluice_status_name(v[i].status));
        cr_expect(strstr(v[i].error, "already passed when the call was made"),
                  "%s: the error says so: \"%s\"", v[i].path, v[i].error);
    }

    /* A year less a day ahead is a long deadline, not a wrong clock. */
    struct timespec long_ahead =
        sluice_ns_timespec(sluice_monotonic_ns() + INT64_C(365) * 86400 * SLUICE_NS_PER_SEC);
    CURL *easy = fx_easy_url(NOWHERE "/chat/completions");
    struct sluice_curl_result res;
    cr_assert_eq(sluice_curl_perform_call(e,
                                          &(struct sluice_curl_call){.backend = FX_BACKEND,
                                                                     .easy = easy,
                                                                     .deadline = &long_ahead},
                                          &res),
                 SLUICE_EIO, "sent (and refused by the closed port): %s", res.error);
    curl_easy_cleanup(easy);
    sluice_curl_loop_destroy(loop);
    fx_assert_idle(e);
    sluice_engine_destroy(e);
}
