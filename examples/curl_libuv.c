/*
 * sluice_curl_loop inside a libuv loop (the embedder's-loop mode): the
 * watch/timer adapter is loop_uv.h, in the shape of libcurl's multi-uv.c.
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
#include "curl_plan.h"
#include "loop_uv.h"

struct app {
    struct loop_uv lu;
    uv_timer_t cancel_timer;
    struct plan plan;
};

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
        uv_stop(app->lu.uv);
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
    uv_loop_t *uv = uv_default_loop();
    uv_timer_init(uv, &app.cancel_timer);
    app.cancel_timer.data = &app;
    uv_check_t check;
    uv_check_init(uv, &check);
    check.data = &app;
    uv_check_start(&check, on_check);
    if (!engine || loop_uv_create(&app.lu, uv, engine) != SLUICE_OK)
        return 1;
    app.plan.loop = app.lu.loop;

    plan_submit(&app.plan, url);
    uv_timer_start(&app.cancel_timer, on_cancel_timer, PLAN_CANCEL_AFTER_MS, 0);
    uv_run(uv, UV_RUN_DEFAULT);

    loop_uv_destroy(&app.lu); /* first: it closes the socket watchers */
    uv_close((uv_handle_t *)&app.cancel_timer, NULL);
    uv_close((uv_handle_t *)&check, NULL);
    uv_run(uv, UV_RUN_DEFAULT); /* the close callbacks */
    uv_loop_close(uv);
    sluice_engine_destroy(engine);
    curl_global_cleanup();
    app.plan.watchers_made = app.lu.watchers_made;
    app.plan.watchers_freed = app.lu.watchers_freed;
    return plan_report(&app.plan);
}
