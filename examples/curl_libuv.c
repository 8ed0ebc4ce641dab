/*
 * sluice_curl_loop inside a libuv loop (the embedder's-loop mode), in the
 * shape of libcurl's multi-uv.c, with no table from descriptors to
 * watchers: each socket's uv_poll_t lives in the pointer the watch callback
 * gets back for that socket (`socketp`, as curl_multi_assign).
 *
 *   example_curl_libuv [URL] [N]
 *
 * runs the requests of curl_plan.h (deadlines and cancels) against URL,
 * e.g. sluice-provider-sim --port 8080 --median-ms 100 --sigma 0.
 *
 * Shutdown order (sluice/curl.h, sluice_curl_loop_destroy): destroy the
 * sluice loop on the loop's thread first (its watch calls with
 * CURL_POLL_REMOVE close the socket watchers), then close your own handles,
 * run the loop until the closes are done, and close the uv loop.
 */
#include <stdlib.h>
#include <uv.h>

#include "curl_plan.h"

struct app {
    uv_loop_t *uv;
    uv_timer_t timer, cancel_timer;
    struct plan plan;
};

/* One watched socket. */
struct sock {
    uv_poll_t poll;
    struct app *app;
    curl_socket_t fd;
};

static void on_closed(uv_handle_t *h)
{
    struct sock *s = h->data;
    s->app->plan.watchers_freed++;
    free(s);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct sock *s = h->data;
    int flags = status < 0 ? CURL_CSELECT_ERR
                           : (events & UV_READABLE ? CURL_CSELECT_IN : 0) |
                                 (events & UV_WRITABLE ? CURL_CSELECT_OUT : 0);
    sluice_curl_loop_action(s->app->plan.loop, s->fd, flags);
}

static void watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    struct app *app = ctx;
    struct sock *s = *socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            uv_poll_stop(&s->poll);
            uv_close((uv_handle_t *)&s->poll, on_closed);
            *socketp = NULL;
        }
        return;
    }
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || uv_poll_init_socket(app->uv, &s->poll, fd) != 0) {
            free(s);
            return; /* the transfer then fails at its deadline */
        }
        s->app = app;
        s->fd = fd;
        s->poll.data = s;
        app->plan.watchers_made++;
        *socketp = s;
    }
    uv_poll_start(&s->poll,
                  (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0),
                  on_poll);
}

static void on_timeout(uv_timer_t *t)
{
    struct app *app = t->data;
    sluice_curl_loop_action(app->plan.loop, CURL_SOCKET_TIMEOUT, 0);
}

static void timer(void *ctx, long ms)
{
    struct app *app = ctx;
    if (ms < 0)
        uv_timer_stop(&app->timer);
    else
        uv_timer_start(&app->timer, on_timeout, (uint64_t)ms, 0);
}

static void on_cancel_timer(uv_timer_t *t)
{
    struct app *app = t->data;
    plan_cancel(&app->plan);
}

/* Stop the uv loop once every request has completed. */
static void on_check(uv_check_t *c)
{
    struct app *app = c->data;
    if (app->plan.done == app->plan.accepted)
        uv_stop(app->uv);
}

int main(int argc, char **argv)
{
    static struct app app;
    const char *url;
    int bad = plan_args(argc, argv, &url, &app.plan);
    if (bad)
        return bad;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct sluice_engine *engine = plan_engine();
    app.uv = uv_default_loop();
    uv_timer_init(app.uv, &app.timer);
    uv_timer_init(app.uv, &app.cancel_timer);
    app.timer.data = app.cancel_timer.data = &app;
    uv_check_t check;
    uv_check_init(app.uv, &check);
    check.data = &app;
    uv_check_start(&check, on_check);
    struct sluice_curl_loop_desc desc = {
        .engine = engine, .watch = watch, .timer = timer, .ctx = &app};
    if (!engine || sluice_curl_loop_create(&desc, &app.plan.loop) != SLUICE_OK)
        return 1;

    plan_submit(&app.plan, url);
    uv_timer_start(&app.cancel_timer, on_cancel_timer, PLAN_CANCEL_AFTER_MS, 0);
    uv_run(app.uv, UV_RUN_DEFAULT);

    sluice_curl_loop_destroy(app.plan.loop); /* first: it closes the socket watchers */
    uv_close((uv_handle_t *)&app.timer, NULL);
    uv_close((uv_handle_t *)&app.cancel_timer, NULL);
    uv_close((uv_handle_t *)&check, NULL);
    uv_run(app.uv, UV_RUN_DEFAULT); /* the close callbacks */
    uv_loop_close(app.uv);
    sluice_engine_destroy(engine);
    curl_global_cleanup();
    return plan_report(&app.plan);
}
