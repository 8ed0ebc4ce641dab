/*
 * fixed_upstream.c — sluice-proxy's front end with a fixed answer in place
 * of its upstream, for the HTTP server A/B (bench/http_front_ab.py).
 *
 * The program `sluice-proxy-fixed` is sluice-proxy built from its own
 * sources (bench/CMakeLists.txt takes them from the sluice-proxy target)
 * with this file in place of upstream.c: the same listener, epoll loop,
 * parser, bounds, routing, access log and writes, but a request that would
 * go upstream is answered at once with the chat.completion body that
 * mhd_front.c answers too. What the A/B measures is then the serving part
 * only, the part an MHD front end would replace; the engine and the curl
 * loop are created as in the real program and sit idle.
 */
#include "proxy.h"

#include <string.h>

#include "answer.h"

void upstream_start(struct conn *c, struct backend *b, const char *path, const char *body,
                    size_t body_len)
{
    (void)b, (void)path, (void)body, (void)body_len;
    c->closing = c->closing || !c->req.keep_alive;
    buf_printf(&c->out,
               "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s"
               "\r\n",
               sizeof AB_ANSWER - 1, c->closing ? "Connection: close\r\n" : "");
    buf_put(&c->out, AB_ANSWER, sizeof AB_ANSWER - 1);
    c->status_out = 200;
    c->outcome = "fixed";
    c->t_first_ns = now_ns();
    http_request_done(c);
}

/* No call is ever in flight: nothing to cancel, resume or free. */
void upstream_client_gone(struct conn *c)
{
    (void)c;
}

void upstream_resume(struct conn *c)
{
    (void)c;
}

void upstream_free(struct conn *c)
{
    (void)c;
}

void upstream_free_spares(struct proxy *p)
{
    (void)p;
}
