/*
 * admin_http.c — the admin endpoint's HTTP plumbing on libmicrohttpd: the
 * access handler and the checks every request passes before its route
 * (admin_routes.c): the request deadline's mark, a body over
 * max_body_bytes, a Host that is not loopback on a loopback bind, a
 * foreign Origin on a request that changes something.
 *
 * Threads: libmicrohttpd runs a listener thread and one thread per
 * connection (bounded by max_connections); everything here runs on a
 * connection's thread.
 */
#define _GNU_SOURCE
#include "admin_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* What libmicrohttpd keeps for us per request (*con_cls). */
struct request {
    size_t body_bytes; /* of a body the routes never read */
};

/* A body past this many times max_body_bytes (plus 64 KiB) is not drained: the
 * connection is cut. */
#define ADMIN_BODY_DRAIN_FACTOR 16
#define ADMIN_BODY_DRAIN_SLACK 65536

#define ADMIN_BODY_FIX "these routes take no request body; send the parameters in the query string"

/* ---- who may ask ------------------------------------------------------------------ */

/*
 * Is `host` (a Host header or an Origin's host: name or address, maybe with a port)
 * a loopback address literal (127.0.0.0/8, [::1]) or localhost? Only these: a DNS
 * name that merely starts like one (127.attacker.example, 127.0.0.1.nip.io) can be
 * rebound to 127.0.0.1 by whoever owns it.
 */
static bool host_is_loopback(const char *host)
{
    char name[INET6_ADDRSTRLEN];
    bool bracketed = host[0] == '[';
    const char *end = bracketed ? strchr(host, ']') : host + strcspn(host, ":");
    if (!end)
        return false;
    const char *start = host + bracketed;
    size_t n = (size_t)(end - start);
    if (n == 0 || n >= sizeof name)
        return false;
    memcpy(name, start, n);
    name[n] = '\0';
    const char *port = end + bracketed;
    if (*port && (*port != ':' || !port[1] || strlen(port + 1) > 5 ||
                  strspn(port + 1, "0123456789") != strlen(port + 1)))
        return false;
    struct in_addr a4;
    struct in6_addr a6;
    if (bracketed)
        return inet_pton(AF_INET6, name, &a6) == 1 &&
               (IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127));
    return !strcasecmp(name, "localhost") ||
           (inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127);
}

/* A Host (or Origin host) this bind may be addressed by: on a loopback bind only
 * loopback ones (DNS rebinding); a remote bind (allow_remote) takes any. */
static bool host_allowed(const struct sluice_admin *a, const char *host)
{
    return !a->loopback || host_is_loopback(host);
}

/* A browser's Origin that is this server itself: http://<our Host>, by the same rule. */
static bool origin_allowed(const struct sluice_admin *a, struct MHD_Connection *c,
                           const char *origin)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host || strncmp(origin, "http://", 7) != 0)
        return false;
    return strcmp(origin + 7, host) == 0 && host_allowed(a, origin + 7);
}

/* ---- libmicrohttpd's callbacks ------------------------------------------------------ */

/* A request's head has arrived: its per-request state, and an announced oversized body
 * refused before it is read. */
static enum MHD_Result request_begins(struct sluice_admin *a, struct MHD_Connection *c,
                                      void **con_cls)
{
    struct request *rq = calloc(1, sizeof *rq);
    if (!rq)
        return MHD_NO;
    *con_cls = rq;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > a->cfg.max_body_bytes) {
        sluice__admin_conn_mark(a, c, false);
        return sluice__admin_send_error(c, 413, NULL, ADMIN_BODY_FIX,
                                        "request body of %.20s bytes is over the limit of %u bytes",
                                        cl, a->cfg.max_body_bytes);
    }
    return MHD_YES;
}

/* A piece of a body the routes never read: count it, drop it, answer 413 once it has
 * ended. libmicrohttpd cannot answer mid-upload, so a stream that goes on far past the
 * limit (chunked, no Content-Length) is cut off instead of drained forever. */
static enum MHD_Result body_arrives(const struct sluice_admin *a, struct request *rq,
                                    size_t *upload_size)
{
    rq->body_bytes += *upload_size;
    *upload_size = 0;
    size_t drain_max =
        (size_t)a->cfg.max_body_bytes * ADMIN_BODY_DRAIN_FACTOR + ADMIN_BODY_DRAIN_SLACK;
    return rq->body_bytes > drain_max ? MHD_NO : MHD_YES;
}

/* The head and any body are in: the deadline is met, however long the answer (an event
 * stream) then takes. The checks every route shares, then the route. */
static enum MHD_Result request_complete(struct sluice_admin *a, struct MHD_Connection *c,
                                        const struct request *rq, const char *url,
                                        const char *method)
{
    if (sluice__admin_conn_mark(a, c, false))
        return sluice__admin_send_error(c, 503, NULL,
                                        "retry in a moment; close idle connections or event "
                                        "streams, or raise sluice_admin_desc.max_connections",
                                        "the admin endpoint is full: max_connections = %u "
                                        "requests and streams are in progress",
                                        a->cfg.max_connections);
    if (rq->body_bytes > a->cfg.max_body_bytes)
        return sluice__admin_send_error(c, 413, NULL, ADMIN_BODY_FIX,
                                        "request body of %zu bytes is over the limit of %u bytes",
                                        rq->body_bytes, a->cfg.max_body_bytes);
    if (a->loopback) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        if (host && !host_allowed(a, host))
            return sluice__admin_send_error(c, 403, NULL,
                                            "address the endpoint as 127.0.0.1, localhost or "
                                            "[::1] (a loopback address, not a name that "
                                            "resolves to one)",
                                            "Host \"%.100s\" is not a loopback address or "
                                            "localhost",
                                            host);
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && strcmp(method, "GET") && strcmp(method, "HEAD") && !origin_allowed(a, c, origin))
        return sluice__admin_send_error(c, 403, NULL,
                                        "clear from the Concurrency Health page itself, "
                                        "sluicectl or curl",
                                        "a request from the web page at %.100s may not change "
                                        "this endpoint",
                                        origin);
    return sluice__admin_route(a, c, url, method);
}

enum MHD_Result sluice__admin_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                         const char *method, const char *version,
                                         const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    (void)upload;
    struct sluice_admin *a = cls;
    struct request *rq = *con_cls;
    if (!rq)
        return request_begins(a, c, con_cls);
    if (*upload_size)
        return body_arrives(a, rq, upload_size);
    return request_complete(a, c, rq, url, method);
}

void sluice__admin_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                                enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    /* A kept-alive connection gets timeout_s for its next request too. */
    sluice__admin_conn_mark(cls, c, true);
    free(*con_cls);
    *con_cls = NULL;
}
