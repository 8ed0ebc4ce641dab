/*
 * sluice_curl_loop inside a plain epoll loop (the embedder's-loop mode),
 * in the shape of libcurl's ephiperfifo.c: the loop tells us which sockets
 * to watch and when to wake (a timerfd); we tell it what became ready.
 *
 *   example_curl_epoll [URL] [N]
 *
 * sends N (default 20) chat-completion POSTs to URL (default
 * http://127.0.0.1:8080/v1/chat/completions, e.g. sluice-provider-sim
 * --port 8080) through a backend limited to 4 calls in flight with room for
 * 8 more, so 8 of 20 are refused at submit with SLUICE_ECAPACITY and the
 * rest complete 4 at a time. Everything runs on this one thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <sluice/curl.h>

struct app {
    int epfd, timerfd;
    int done, accepted;
};

/* The loop wants `fd` watched for `what` (CURL_POLL_*), or no longer. */
static void watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    (void)socketp; /* epoll keys on the descriptor itself */
    struct app *app = ctx;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(app->epfd, EPOLL_CTL_DEL, fd, NULL);
        return;
    }
    struct epoll_event ev = {.data.fd = fd};
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    if (epoll_ctl(app->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
        epoll_ctl(app->epfd, EPOLL_CTL_ADD, fd, &ev);
}

/* The loop wants a call in `ms` milliseconds (-1: no timer). */
static void timer(void *ctx, long ms)
{
    struct app *app = ctx;
    struct itimerspec its = {0};
    if (ms == 0)
        its.it_value.tv_nsec = 1; /* "now": a zero it_value would disarm */
    else if (ms > 0) {
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (ms % 1000) * 1000000L;
    }
    timerfd_settime(app->timerfd, 0, &its, NULL);
}

static size_t discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

static void done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    struct app *app = data;
    app->done++;
    printf("  %-9s HTTP %3ld  %-12s first byte %6.1f ms, queued %6.1f ms\n",
           sluice_status_name(r->status), r->http_status, sluice_curl_kind_name(r->kind),
           r->latency_ns / 1e6, r->queued_ns / 1e6);
    curl_easy_cleanup(easy);
}

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : "http://127.0.0.1:8080/v1/chat/completions";
    int n = argc > 2 ? atoi(argv[2]) : 20;
    curl_global_init(CURL_GLOBAL_DEFAULT);

    struct sluice_backend_desc local = {.id = "local", .active = 4, .waiting = SLUICE_SOME(8)};
    struct sluice_engine *engine;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &local, .n_backends = 1},
                             &engine) != SLUICE_OK)
        return 1;
    struct app app = {.epfd = epoll_create1(EPOLL_CLOEXEC),
                      .timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)};
    struct epoll_event tev = {.events = EPOLLIN, .data.fd = app.timerfd};
    epoll_ctl(app.epfd, EPOLL_CTL_ADD, app.timerfd, &tev);

    struct sluice_curl_loop *loop;
    struct sluice_curl_loop_desc desc = {
        .engine = engine, .watch = watch, .timer = timer, .ctx = &app};
    if (sluice_curl_loop_create(&desc, &loop) != SLUICE_OK)
        return 1;

    for (int i = 0; i < n; i++) {
        CURL *easy = curl_easy_init();
        curl_easy_setopt(easy, CURLOPT_URL, url);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS,
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, discard);
        struct sluice_curl_request req = {
            .backend = "local", .easy = easy, .done = done, .data = &app};
        int status = sluice_curl_loop_submit(loop, &req, NULL);
        if (status == SLUICE_OK)
            app.accepted++;
        else {
            printf("  submit %2d: %s\n", i, sluice_strerror(status));
            curl_easy_cleanup(easy);
        }
    }

    while (app.done < app.accepted) {
        struct epoll_event evs[32];
        int k = epoll_wait(app.epfd, evs, 32, 1000);
        for (int i = 0; i < k; i++) {
            int fd = evs[i].data.fd;
            if (fd == app.timerfd) {
                uint64_t expirations;
                if (read(app.timerfd, &expirations, sizeof expirations) < 0) { /* spurious */
                }
                sluice_curl_loop_action(loop, CURL_SOCKET_TIMEOUT, 0);
                continue;
            }
            int events = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                         (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                         (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            sluice_curl_loop_action(loop, fd, events);
        }
    }
    printf("%d accepted, %d refused, %d completed\n", app.accepted, n - app.accepted, app.done);

    sluice_curl_loop_destroy(loop);
    sluice_engine_destroy(engine);
    close(app.timerfd);
    close(app.epfd);
    curl_global_cleanup();
    return 0;
}
