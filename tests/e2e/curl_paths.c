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
#include "e2e/curl_loopback.h"
#include "shim/provider_fixture.h"

#include <dirent.h>
#include <unistd.h>

#include <sluice/client.h>
#include <sluice/run.h>

#define PATHS_TEST(name, ...)                                                                      \
    Test(curl_paths, name, .init = fx_setup, .fini = fx_teardown, .timeout = 60, ##__VA_ARGS__)

/* ---- a server that replays a fixture ---------------------------------------------------- */

/* Answers every request on its port with `serving`, one connection per answer. */
struct replay {
    int listen_fd, port;
    pthread_t thread;
    _Atomic(const struct provider_fixture *) serving;
};

static void *replay_main(void *arg)
{
    struct replay *rp = arg;
    for (;;) {
        int fd = accept(rp->listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        char request[4096];
        loopback_read_request(fd, request, sizeof request);
        const struct provider_fixture *f = atomic_load(&rp->serving);
        const struct sluice_curl_response *r = &f->resp;
        char head[2048];
        int n = snprintf(head, sizeof head, "%s\r\n", f->status_line);
        for (size_t i = 0; i < r->n_headers; i++)
            n += snprintf(head + n, sizeof head - (size_t)n, "%s: %s\r\n", r->headers[i].name,
                          r->headers[i].value);
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: "
                      "close\r\n\r\n",
                      r->body_len);
        send(fd, head, (size_t)n, MSG_NOSIGNAL);
        send(fd, r->body, r->body_len, MSG_NOSIGNAL);
        close(fd);
    }
}

static void replay_start(struct replay *rp)
{
    memset(rp, 0, sizeof *rp);
    rp->listen_fd = loopback_listen(16, &rp->port);
    pthread_create(&rp->thread, NULL, replay_main, rp);
}

static void replay_stop(struct replay *rp)
{
    loopback_stop(rp->listen_fd, rp->thread);
}

/* Every fixture's NAME, sorted; returns how many. */
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
            snprintf(names[n++], 64, "%.*s", (int)(len - 5), de->d_name);
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
    static struct provider_fixture f;
    for (size_t i = 0; i < n; i++) {
        provider_fixture_load(&f, names[i]);
        atomic_store(&rp.serving, &f);
        struct sluice_curl_result want; /* as the transports read it: now, AUTO */
        sluice_curl_classify(&f.resp, &want);

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
    char error[SLUICE_RUN_ERROR_MAX]; /* the longer of a curl result's and a run's */
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
    /* sluice_run refuses it itself, before the chat is called: its own result says why. */
    cr_expect_eq(sluice_chat_result(chat)->error[0], '\0', "the chat was not called");
    snprintf(v[n++].error, sizeof v->error, "%s", rr.error);
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

/* ---- every status a public call returns is in its header's list ------------------------- */

#define SHIM_HEADERS SLUICE_TEST_FIXTURES "/../../shim/include/sluice/"

static const struct {
    const char *name;
    int value;
} statuses[] = {
#define STATUS_ROW(name, value, msg) {"SLUICE_" #name, value},
    SLUICE_STATUS_MAP(STATUS_ROW)
#undef STATUS_ROW
};

/*
 * The statuses the comment above `decl` in `header` lists: every SLUICE_<STATUS> from its
 * "Returns" (or, for a callback, "Statuses") on. Fails the test when there is no such
 * comment or list, so a renamed declaration cannot pass unread.
 */
static void documented(const char *header, const char *decl, bool listed[],
                       size_t n_statuses)
{
    static char text[65536];
    char path[512];
    snprintf(path, sizeof path, SHIM_HEADERS "%s", header);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    const char *at = strstr(text, decl);
    cr_assert_not_null(at, "%s declares no %s", header, decl);
    const char *end = at;
    while (end > text && !(end[-2] == '*' && end[-1] == '/'))
        end--;
    for (const char *p = end; p < at; p++)
        cr_assert(*p != ';' && *p != '}', "%s: no comment right above %s", header, decl);
    const char *start = end - 2;
    while (start > text && !(start[0] == '/' && start[1] == '*'))
        start--;
    const char *list = NULL;
    for (const char *p = start; p < end && !list; p++)
        if (!strncmp(p, "Returns", 7) || !strncmp(p, "Statuses", 8))
            list = p;
    cr_assert_not_null(list, "%s: the comment above %s has no Returns/Statuses list", header,
                       decl);
    memset(listed, 0, n_statuses * sizeof *listed);
    for (const char *p = list; (p = strstr(p, "SLUICE_")) && p < end; p++) {
        size_t k = strspn(p + 7, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") + 7;
        for (size_t i = 0; i < n_statuses; i++)
            listed[i] |= strlen(statuses[i].name) == k && !strncmp(p, statuses[i].name, k);
    }
}

/* Every status in got[] is in the list above `decl`. */
static void assert_documented(const char *header, const char *decl, const int *got, size_t n)
{
    enum { N_STATUSES = sizeof statuses / sizeof statuses[0] };
    bool listed[N_STATUSES];
    documented(header, decl, listed, N_STATUSES);
    for (size_t g = 0; g < n; g++) {
        bool found = false;
        for (size_t i = 0; i < N_STATUSES; i++)
            found |= statuses[i].value == got[g] && listed[i];
        cr_expect(found, "%s returned SLUICE_%s, which the comment above it in %s does not list",
                  decl, sluice_status_name(got[g]), header);
    }
}

#define ASSERT_DOCUMENTED(header, decl, ...)                                                       \
    do {                                                                                           \
        const int got_[] = {__VA_ARGS__};                                                          \
        assert_documented(header, decl, got_, sizeof got_ / sizeof got_[0]);                       \
    } while (0)

/* Backends for each refusal: "open" serves, "full" is full, "late" refuses what cannot start
 * in time (10 s calls, its one permit held), "closed" is closed. */
struct refusals {
    struct sluice_engine *engine;
    struct sluice_call held; /* late's permit */
};

static void refusals_start(struct refusals *r)
{
    struct sluice_backend_desc b[] = {
        {.id = "open", .active = 4},
        {.id = "full", .active = 1, .waiting = SLUICE_SOME(0)},
        {.id = "late", .active = 1}, /* ELATE is the default rule */
        {.id = "closed", .active = 1},
    };
    char err[256];
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = b,
                                                                   .n_backends = 4,
                                                                   .error = err,
                                                                   .error_size = sizeof err},
                                      &r->engine),
                 SLUICE_OK, "%s", err);
    cr_assert_eq(sluice_pool_admit(sluice_engine_pool(r->engine, "full")), SLUICE_OK);
    struct sluice_pool *late = sluice_engine_pool(r->engine, "late");
    for (int i = 0; i < 16; i++) { /* the service estimate: 10 s a call */
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(late, NULL, NULL, &call), SLUICE_OK);
        call.start_ns -= 10 * SLUICE_NS_PER_SEC;
        sluice_pool_call_end(late, &call, SLUICE_OUTCOME_OK, 0);
    }
    cr_assert_eq(sluice_pool_call_begin(late, NULL, NULL, &r->held), SLUICE_OK);
    struct sluice_pool *closed = sluice_engine_pool(r->engine, "closed");
    cr_assert_not_null(closed);
    sluice_pool_close(closed);
}

static void refusals_stop(struct refusals *r)
{
    sluice_pool_call_end(sluice_engine_pool(r->engine, "late"), &r->held, SLUICE_OUTCOME_OK, 0);
    sluice_pool_leave(sluice_engine_pool(r->engine, "full"));
    sluice_engine_destroy(r->engine);
}

/* A chat completion with a reply, for the chat's SLUICE_OK. */
static struct provider_fixture *chat_reply_fixture(void)
{
    static struct provider_fixture f = {
        .name = "chat_reply",
        .status_line = "HTTP/1.1 200 OK",
        .resp = {.http_status = 200,
                 .body = "{\"choices\":[{\"message\":{\"content\":\"hi\"}}]}"}};
    f.resp.body_len = strlen(f.resp.body);
    return &f;
}

static int perform(struct refusals *r, const char *backend, const char *url,
                   const struct timespec *deadline, struct sluice_cancel *cancel)
{
    CURL *easy = fx_easy_url(url);
    int status = sluice_curl_perform(r->engine, backend, easy, deadline, cancel, NULL);
    curl_easy_cleanup(easy);
    return status;
}

static int transfer(const char *url, const struct timespec *deadline,
                    struct sluice_cancel *cancel)
{
    CURL *easy = url ? fx_easy_url(url) : NULL;
    struct sluice_curl_result res;
    int status = sluice_curl_transfer(
        &(struct sluice_curl_call){.easy = easy, .deadline = deadline, .cancel = cancel}, &res);
    if (easy)
        curl_easy_cleanup(easy);
    return status;
}

/* A request on a loop, and the latch its completion opens. */
struct loop_call {
    CURL *easy;
    struct latch l;
};

static int submit(struct sluice_curl_loop *loop, struct loop_call *c, const char *backend,
                  const char *url, const struct timespec *deadline, struct sluice_cancel *cancel)
{
    c->easy = fx_easy_url(url);
    latch_init(&c->l);
    return sluice_curl_loop_submit(loop,
                                   &(struct sluice_curl_request){.backend = backend,
                                                                 .easy = c->easy,
                                                                 .deadline = deadline,
                                                                 .cancel = cancel,
                                                                 .done = on_curl_done,
                                                                 .data = &c->l},
                                   NULL);
}

/* The completion of an accepted submission. */
static int completion(struct loop_call *c)
{
    int status = latch_wait(&c->l);
    curl_easy_cleanup(c->easy);
    return status;
}

struct chat_call {
    struct sluice_chat *chat;
    struct latch l;
};

static int chat_submit(struct sluice_curl_loop *loop, struct chat_call *c, const char *base,
                       const char *backend, const struct timespec *deadline,
                       struct sluice_cancel *cancel)
{
    c->chat = paths_chat(base);
    latch_init(&c->l);
    return sluice_chat_submit(loop, c->chat,
                              &(struct sluice_chat_request){.backend = backend,
                                                            .deadline = deadline,
                                                            .cancel = cancel,
                                                            .done = on_chat_done,
                                                            .data = &c->l},
                              NULL);
}

static int chat_completion(struct chat_call *c)
{
    int status = latch_wait(&c->l);
    sluice_chat_destroy(c->chat);
    return status;
}

static int chat_refusal(struct chat_call *c, int status)
{
    const struct sluice_curl_result *res = sluice_chat_result(c->chat);
    if (status == SLUICE_ELATE) { /* the whole call's is the only deadline these carry */
        cr_expect_eq(res->expired, SLUICE_EXPIRED_CALL, "an ELATE says which deadline");
        cr_expect(strstr(res->error, "too little of the deadline"), "\"%s\"", res->error);
    }
    sluice_chat_destroy(c->chat);
    return status;
}

/* The call drove the refusal it was meant to (else the list check below proves nothing). */
static int expect_status(int got, int want, const char *what)
{
    cr_expect_eq(got, want, "%s: SLUICE_%s, want SLUICE_%s", what, sluice_status_name(got),
                 sluice_status_name(want));
    return got;
}

#define EXPECT(call, want) expect_status((call), SLUICE_##want, #call)

/* submit's own status; an accepted request's completion is waited for and dropped. */
static int submitted(struct sluice_curl_loop *loop, const char *backend, const char *url,
                     const struct timespec *deadline)
{
    struct loop_call c;
    int status = submit(loop, &c, backend, url, deadline, NULL);
    if (status == SLUICE_OK)
        completion(&c);
    else
        curl_easy_cleanup(c.easy);
    return status;
}

/* sluice_chat_submit's own status, likewise. */
static int chat_submitted(struct sluice_curl_loop *loop, const char *base, const char *backend,
                          const struct timespec *deadline)
{
    struct chat_call c;
    int status = chat_submit(loop, &c, base, backend, deadline, NULL);
    return status == SLUICE_OK ? (chat_completion(&c), status) : chat_refusal(&c, status);
}

/* An accepted chat's completion status. */
static int chat_done(struct sluice_curl_loop *loop, const char *base,
                     const struct timespec *deadline, struct sluice_cancel *cancel)
{
    struct chat_call c;
    cr_assert_eq(chat_submit(loop, &c, base, "open", deadline, cancel), SLUICE_OK);
    return chat_completion(&c);
}

PATHS_TEST(every_status_a_public_call_returns_is_in_its_headers_list)
{
    struct replay rp;
    replay_start(&rp);
    atomic_store(&rp.serving, chat_reply_fixture());
    char url[96], base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/v1", rp.port);
    snprintf(url, sizeof url, "%s/chat/completions", base);
    const char *nowhere = NOWHERE "/chat/completions";
    struct refusals r;
    refusals_start(&r);
    struct timespec past = sluice_ns_timespec(sluice_monotonic_ns() - SLUICE_NS_PER_SEC);
    struct timespec in_15s, realtime;
    sluice_deadline_in(&in_15s, 15 * SLUICE_NS_PER_SEC);
    clock_gettime(CLOCK_REALTIME, &realtime);
    struct sluice_cancel fired;
    sluice_cancel_init(&fired);
    sluice_cancel_fire(&fired);

    ASSERT_DOCUMENTED("curl.h", "int sluice_curl_perform(",
                      EXPECT(perform(&r, "open", url, NULL, NULL), OK),
                      EXPECT(perform(&r, "open", nowhere, NULL, NULL), EIO),
                      EXPECT(perform(&r, "open", url, &past, NULL), ETIMEDOUT),
                      EXPECT(perform(&r, "open", url, NULL, &fired), ECANCELED),
                      EXPECT(perform(&r, "full", url, NULL, NULL), ECAPACITY),
                      EXPECT(perform(&r, "late", url, &in_15s, NULL), ELATE),
                      EXPECT(perform(&r, "closed", url, NULL, NULL), ECLOSED),
                      EXPECT(perform(&r, "unknown", url, NULL, NULL), EINVAL),
                      EXPECT(perform(&r, "open", url, &realtime, NULL), EINVAL));
    CURL *easy = fx_easy_url(url);
    ASSERT_DOCUMENTED(
        "curl.h", "int sluice_curl_perform_call(",
        EXPECT(sluice_curl_perform_call(r.engine, &(struct sluice_curl_call){0}, NULL), EINVAL),
        EXPECT(sluice_curl_perform_call(r.engine,
                                        &(struct sluice_curl_call){.backend = "late",
                                                                   .easy = easy,
                                                                   .deadline = &in_15s},
                                        NULL),
               ELATE));
    curl_easy_cleanup(easy);
    ASSERT_DOCUMENTED("curl.h", "int sluice_curl_transfer(", EXPECT(transfer(url, NULL, NULL), OK),
                      EXPECT(transfer(nowhere, NULL, NULL), EIO),
                      EXPECT(transfer(url, &past, NULL), ETIMEDOUT),
                      EXPECT(transfer(url, NULL, &fired), ECANCELED),
                      EXPECT(transfer(NULL, NULL, NULL), EINVAL),
                      EXPECT(transfer(url, &realtime, NULL), EINVAL));

    struct sluice_curl_loop *loop = NULL, *one = NULL, *one_chat = NULL, *closed = NULL;
    ASSERT_DOCUMENTED(
        "curl.h", "int sluice_curl_loop_create(",
        EXPECT(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){0}, &loop), EINVAL),
        EXPECT(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = r.engine}, &loop),
               OK));
    struct sluice_curl_loop_desc one_request = {.engine = r.engine, .max_requests = 1};
    cr_assert_eq(sluice_curl_loop_create(&one_request, &one), SLUICE_OK);
    cr_assert_eq(sluice_curl_loop_create(&one_request, &one_chat), SLUICE_OK);
    cr_assert_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = r.engine},
                                         &closed),
                 SLUICE_OK);
    sluice_curl_loop_close(closed);

    /* `one` and `one_chat` hold one request each, waiting for late's held permit. */
    struct loop_call waiting;
    struct chat_call waiting_chat;
    cr_assert_eq(submit(one, &waiting, "late", url, NULL, NULL), SLUICE_OK);
    cr_assert_eq(chat_submit(one_chat, &waiting_chat, base, "late", NULL, NULL), SLUICE_OK);
    ASSERT_DOCUMENTED("curl.h", "int sluice_curl_loop_submit(",
                      EXPECT(submitted(loop, "open", url, NULL), OK),
                      EXPECT(submitted(loop, "full", url, NULL), ECAPACITY),
                      EXPECT(submitted(loop, "late", url, &in_15s), ELATE),
                      EXPECT(submitted(loop, "closed", url, NULL), ECLOSED),
                      EXPECT(submitted(loop, "unknown", url, NULL), EINVAL),
                      EXPECT(submitted(one, "open", url, NULL), EAGAIN),
                      EXPECT(submitted(closed, "open", url, NULL), ECLOSED));
    ASSERT_DOCUMENTED("client.h", "int sluice_chat_submit(",
                      EXPECT(chat_submitted(loop, base, "open", NULL), OK),
                      EXPECT(chat_submitted(loop, base, "full", NULL), ECAPACITY),
                      EXPECT(chat_submitted(loop, base, "late", &in_15s), ELATE),
                      EXPECT(chat_submitted(loop, base, "closed", NULL), ECLOSED),
                      EXPECT(chat_submitted(loop, base, "unknown", NULL), EINVAL),
                      EXPECT(chat_submitted(loop, NULL, NULL, NULL), EINVAL),
                      EXPECT(chat_submitted(one_chat, base, "open", NULL), EAGAIN),
                      EXPECT(chat_submitted(closed, base, "open", NULL), ECLOSED));
    uint64_t id = 0;
    struct loop_call held;
    CURL *held_easy = fx_easy_url(url);
    latch_init(&held.l);
    cr_assert_eq(sluice_curl_loop_submit(loop,
                                         &(struct sluice_curl_request){.backend = "late",
                                                                       .easy = held_easy,
                                                                       .done = on_curl_done,
                                                                       .data = &held.l},
                                         &id),
                 SLUICE_OK);
    held.easy = held_easy;
    ASSERT_DOCUMENTED("curl.h", "int sluice_curl_loop_cancel(",
                      EXPECT(sluice_curl_loop_cancel(loop, id), OK),
                      EXPECT(sluice_curl_loop_cancel(loop, 0), EINVAL),
                      EXPECT(sluice_curl_loop_cancel(NULL, id), EINVAL));

    /* The completions: served, refused by the port, past, cancelled (by token and by id),
     * the wrong clock, and the waiting ones when their loops close. */
    sluice_curl_loop_close(one);
    sluice_curl_loop_close(one_chat);
    struct loop_call done;
    ASSERT_DOCUMENTED(
        "curl.h", "(*sluice_curl_done_fn)",
        EXPECT((submit(loop, &done, "open", url, NULL, NULL), completion(&done)), OK),
        EXPECT((submit(loop, &done, "open", nowhere, NULL, NULL), completion(&done)), EIO),
        EXPECT((submit(loop, &done, "open", url, &past, NULL), completion(&done)), ETIMEDOUT),
        EXPECT((submit(loop, &done, "open", url, NULL, &fired), completion(&done)), ECANCELED),
        EXPECT((submit(loop, &done, "open", url, &realtime, NULL), completion(&done)), EINVAL),
        EXPECT(completion(&held), ECANCELED), EXPECT(completion(&waiting), ECLOSED));
    ASSERT_DOCUMENTED("client.h", "(*sluice_chat_done_fn)",
                      EXPECT(chat_done(loop, base, NULL, NULL), OK),
                      EXPECT(chat_done(loop, NOWHERE, NULL, NULL), EIO),
                      EXPECT(chat_done(loop, base, &past, NULL), ETIMEDOUT),
                      EXPECT(chat_done(loop, base, NULL, &fired), ECANCELED),
                      EXPECT(chat_done(loop, base, &realtime, NULL), EINVAL),
                      EXPECT(chat_completion(&waiting_chat), ECLOSED));

    struct sluice_chat *chat = NULL;
    char bad_utf8[] = {'h', (char)0xC3, 0};
    ASSERT_DOCUMENTED(
        "client.h", "int sluice_chat_create(",
        EXPECT(sluice_chat_create(&(struct sluice_chat_desc){.model = "m"}, &chat), EINVAL),
        EXPECT(sluice_chat_create(&(struct sluice_chat_desc){.model = "m", .prompt = "hi"}, &chat),
               OK));
    ASSERT_DOCUMENTED("client.h", "int sluice_chat_set_repair(",
                      EXPECT(sluice_chat_set_repair(chat, "again"), OK),
                      EXPECT(sluice_chat_set_repair(chat, bad_utf8), EINVAL));
    sluice_chat_destroy(chat);
    enum sluice_curl_dialect dialect;
    ASSERT_DOCUMENTED("curl.h", "int sluice_curl_dialect_parse(",
                      EXPECT(sluice_curl_dialect_parse("openai", &dialect), OK),
                      EXPECT(sluice_curl_dialect_parse("nobody", &dialect), EINVAL));

    sluice_curl_loop_destroy(loop);
    sluice_curl_loop_destroy(one);
    sluice_curl_loop_destroy(one_chat);
    sluice_curl_loop_destroy(closed);
    refusals_stop(&r);
    replay_stop(&rp);
}
