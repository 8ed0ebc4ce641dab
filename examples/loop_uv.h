/*
 * loop_uv.h — a sluice_curl_loop inside a libuv loop (the embedder's-loop
 * mode), in the shape of libcurl's multi-uv.c, with no table from
 * descriptors to watchers: each socket's uv_poll_t lives in the pointer the
 * watch callback gets back for that socket (`socketp`, as
 * curl_multi_assign). curl_libuv.c and stream_server.c share it; an
 * embedder copies it.
 *
 *   struct loop_uv lu;
 *   loop_uv_create(&lu, uv_default_loop(), engine);   // lu.loop is the sluice loop
 *   ... uv_run ...
 *   loop_uv_destroy(&lu);                             // then close your handles
 *   uv_run(uv, UV_RUN_DEFAULT);                       // the close callbacks
 *   uv_loop_close(uv);
 *
 * Shutdown order (sluice/curl.h, sluice_curl_loop_destroy): destroy the
 * sluice loop on the loop's thread first (its watch calls with
 * CURL_POLL_REMOVE close the socket watchers), then close your own handles,
 * run the loop until the closes are done, and close the uv loop.
 * loop_uv_destroy does the first step and closes its timer.
 *
 * Threads: everything here runs on the thread that runs the uv loop.
 */
#ifndef SLUICE_EXAMPLES_LOOP_UV_H
#define SLUICE_EXAMPLES_LOOP_UV_H

#include <stdlib.h>
#include <uv.h>

#include <sluice/curl.h>

struct loop_uv {
    uv_loop_t *uv;
    uv_timer_t timer; /* sluice's CURL_SOCKET_TIMEOUT */
    struct sluice_curl_loop *loop;
    int watchers_made, watchers_freed; /* per-socket watchers, for a leak check */
};

/* One watched socket. */
struct loop_uv_sock {
    uv_poll_t poll;
    struct loop_uv *lu;
    curl_socket_t fd;
};

static void loop_uv__closed(uv_handle_t *h)
{
    struct loop_uv_sock *s = (struct loop_uv_sock *)h->data;
    s->lu->watchers_freed++;
    free(s);
}

static void loop_uv__poll(uv_poll_t *h, int status, int events)
{
    struct loop_uv_sock *s = (struct loop_uv_sock *)h->data;
    int flags = status < 0 ? CURL_CSELECT_ERR
                           : (events & UV_READABLE ? CURL_CSELECT_IN : 0) |
                                 (events & UV_WRITABLE ? CURL_CSELECT_OUT : 0);
    sluice_curl_loop_action(s->lu->loop, s->fd, flags);
}

static void loop_uv__watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    struct loop_uv *lu = (struct loop_uv *)ctx;
    struct loop_uv_sock *s = (struct loop_uv_sock *)*socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            uv_poll_stop(&s->poll);
            uv_close((uv_handle_t *)&s->poll, loop_uv__closed);
            *socketp = NULL;
        }
        return;
    }
    if (!s) {
        s = (struct loop_uv_sock *)calloc(1, sizeof *s);
        if (!s || uv_poll_init_socket(lu->uv, &s->poll, fd) != 0) {
            free(s);
            return; /* the transfer then fails at its deadline */
        }
        s->lu = lu;
        s->fd = fd;
        s->poll.data = s;
        lu->watchers_made++;
        *socketp = s;
    }
    uv_poll_start(&s->poll,
                  (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0),
                  loop_uv__poll);
}

static void loop_uv__timeout(uv_timer_t *t)
{
    struct loop_uv *lu = (struct loop_uv *)t->data;
    sluice_curl_loop_action(lu->loop, CURL_SOCKET_TIMEOUT, 0);
}

static void loop_uv__timer(void *ctx, long ms)
{
    struct loop_uv *lu = (struct loop_uv *)ctx;
    if (ms < 0)
        uv_timer_stop(&lu->timer);
    else
        uv_timer_start(&lu->timer, loop_uv__timeout, (uint64_t)ms, 0);
}

/* Create the sluice loop over `engine` on `uv`'s thread: sluice_curl_loop_create's status
 * (lu->loop is NULL unless SLUICE_OK; the timer is initialised either way, so
 * loop_uv_destroy is always the way out). */
static inline int loop_uv_create(struct loop_uv *lu, uv_loop_t *uv,
                                 const struct sluice_engine *engine)
{
    lu->uv = uv;
    lu->loop = NULL;
    lu->watchers_made = lu->watchers_freed = 0;
    uv_timer_init(uv, &lu->timer);
    lu->timer.data = lu;
    struct sluice_curl_loop_desc desc = {
        .engine = engine, .watch = loop_uv__watch, .timer = loop_uv__timer, .ctx = lu};
    return sluice_curl_loop_create(&desc, &lu->loop);
}

/* Destroy the sluice loop (every `done` runs, every socket watcher is closed) and close the
 * timer; run the uv loop afterwards to finish the closes. */
static inline void loop_uv_destroy(struct loop_uv *lu)
{
    sluice_curl_loop_destroy(lu->loop);
    lu->loop = NULL;
    uv_close((uv_handle_t *)&lu->timer, NULL);
}

#endif
