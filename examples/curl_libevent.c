/*
 * sluice_curl_loop inside a libevent loop (the embedder's-loop mode), in
 * the shape of libcurl's hiperfifo.c, with no table from descriptors to
 * events: each socket's struct event lives in the pointer the watch
 * callback gets back for that socket (`socketp`, as curl_multi_assign).
 *
 *   example_curl_libevent [URL] [N]
 *
 * runs the requests of curl_plan.h (deadlines and cancels) against URL,
 * e.g. sluice-provider-sim --port 8080 --median-ms 100 --sigma 0.
 *
 * Shutdown order (sluice/curl.h, sluice_curl_loop_destroy): destroy the
 * sluice loop on the loop's thread first (its watch calls with
 * CURL_POLL_REMOVE free the socket events), then free your own events and
 * the event base.
 */
#include <event2/event.h>
#include <stdlib.h>

#include "curl_plan.h"

struct app {
    struct event_base *base;
    struct event *timer, *cancel_timer;
    struct plan plan;
};

static void on_socket(evutil_socket_t fd, short events, void *arg)
{
    struct app *app = arg;
    int flags = (events & EV_READ ? CURL_CSELECT_IN : 0) | (events & EV_WRITE ? CURL_CSELECT_OUT : 0);
    sluice_curl_loop_action(app->plan.loop, fd, flags);
    if (app->plan.done == app->plan.accepted)
        event_base_loopbreak(app->base);
}

static void watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    struct app *app = ctx;
    struct event *ev = *socketp;
    if (ev) /* every change re-arms the socket's one event */
        event_del(ev);
    if (what == CURL_POLL_REMOVE) {
        if (ev) {
            event_free(ev);
            app->plan.watchers_freed++;
            *socketp = NULL;
        }
        return;
    }
    short kind = (short)((what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0) |
                         EV_PERSIST);
    if (!ev) {
        ev = event_new(app->base, fd, kind, on_socket, app);
        if (!ev)
            return; /* the transfer then fails at its deadline */
        app->plan.watchers_made++;
        *socketp = ev;
    } else {
        event_assign(ev, app->base, fd, kind, on_socket, app);
    }
    event_add(ev, NULL);
}

static void on_timeout(evutil_socket_t fd, short events, void *arg)
{
    (void)fd, (void)events;
    struct app *app = arg;
    sluice_curl_loop_action(app->plan.loop, CURL_SOCKET_TIMEOUT, 0);
    if (app->plan.done == app->plan.accepted)
        event_base_loopbreak(app->base);
}

static void timer(void *ctx, long ms)
{
    struct app *app = ctx;
    if (ms < 0) {
        evtimer_del(app->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(app->timer, &tv);
}

static void on_cancel_timer(evutil_socket_t fd, short events, void *arg)
{
    (void)fd, (void)events;
    struct app *app = arg;
    plan_cancel(&app->plan);
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
    app.base = event_base_new();
    app.timer = evtimer_new(app.base, on_timeout, &app);
    app.cancel_timer = evtimer_new(app.base, on_cancel_timer, &app);
    struct sluice_curl_loop_desc desc = {
        .engine = engine, .watch = watch, .timer = timer, .ctx = &app};
    if (!engine || !app.base || !app.timer || !app.cancel_timer ||
        sluice_curl_loop_create(&desc, &app.plan.loop) != SLUICE_OK)
        return 1;

    plan_submit(&app.plan, url);
    struct timeval cancel_in = {0, PLAN_CANCEL_AFTER_MS * 1000};
    evtimer_add(app.cancel_timer, &cancel_in);
    if (app.plan.done < app.plan.accepted)
        event_base_dispatch(app.base);

    sluice_curl_loop_destroy(app.plan.loop); /* first: it frees the socket events */
    event_free(app.timer);
    event_free(app.cancel_timer);
    event_base_free(app.base);
    sluice_engine_destroy(engine);
    curl_global_cleanup();
    return plan_report(&app.plan);
}
