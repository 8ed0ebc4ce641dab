/*
 * admin.c — the admin endpoint (sluice/admin.h): its lifecycle. Start
 * resolves the description's defaults and ranges, binds the socket itself
 * (so a failure names its cause), allocates a node entry per engine
 * backend, and starts libmicrohttpd and the sampler thread; stop ends them
 * and frees it all. What runs in between lives in the admin_*.c files
 * listed in admin_internal.h.
 *
 * Threading: libmicrohttpd runs a listener thread and one thread per
 * connection (bounded by max_connections, plus SLUICE__ADMIN_SPARE that
 * hear 503; its accept policy in admin_conns.c waits for room rather than
 * let libmicrohttpd reset a connection), so an event stream may block in its
 * content reader while it waits for events; a stream waits on the admin's
 * condition variable, which the sampler broadcasts every tick and stop
 * broadcasts once. The sampler owns the per-node counters and chart
 * history; request threads read them under the same mutex.
 */
#define _GNU_SOURCE
#include "admin_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* libmicrohttpd's own limit, past the slots admin_conns.c hands out (max_connections
 * and SLUICE__ADMIN_SPARE): room for as many again that were cut and are closing. At
 * its limit libmicrohttpd closes a connection unanswered; the accept policy keeps it
 * from getting there. */
enum { ADMIN_CLOSING_FACTOR = 2 };

static bool addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a6))
            return true;
        return IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127;
    }
    return false;
}

/* Resolve defaults and check ranges; SLUICE_OK or SLUICE_EINVAL naming the field. */
static int admin_resolve(const struct sluice_admin_desc *in, struct sluice_admin_desc *d)
{
    *d = *in;
    if (!d->engine)
        return sluice__fail(in->error, in->error_size,
                            "sluice_admin_desc.engine is NULL (pass the engine to serve)");
    SLUICE__DEFAULT(d->address, SLUICE_ADMIN_ADDRESS_DEFAULT);
    if (d->port.set && d->port.value > 65535)
        return sluice__fail(in->error, in->error_size,
                            "sluice_admin_desc.port = %u is above 65535 (use 1..65535, or "
                            "SLUICE_SOME(0) for a free port)",
                            d->port.value);
    SLUICE__DEFAULT_OPT(d->port, SLUICE_ADMIN_PORT_DEFAULT);
    /* A row per field, in order: its default, then its range, whose bounds may be fields
     * resolved above it. */
#define ADMIN_RESOLVE(field, def, lo, hi)                                                          \
    do {                                                                                           \
        SLUICE__DEFAULT(d->field, def);                                                            \
        if (d->field < (lo) || d->field > (hi))                                                    \
            return sluice__fail(in->error, in->error_size,                                         \
                                "sluice_admin_desc." #field " = %u is outside %u..%u", d->field,   \
                                (unsigned)(lo), (unsigned)(hi));                                   \
    } while (0)
    ADMIN_RESOLVE(max_connections, SLUICE_ADMIN_MAX_CONNECTIONS_DEFAULT, 1, 1024);
    ADMIN_RESOLVE(max_streams,
                  d->max_connections < SLUICE_ADMIN_MAX_STREAMS_DEFAULT
                      ? d->max_connections
                      : SLUICE_ADMIN_MAX_STREAMS_DEFAULT,
                  1, d->max_connections);
    ADMIN_RESOLVE(timeout_s, SLUICE_ADMIN_TIMEOUT_S_DEFAULT, 1, 3600);
    ADMIN_RESOLVE(max_request_bytes, SLUICE_ADMIN_MAX_REQUEST_BYTES_DEFAULT, 4096, 1048576);
    ADMIN_RESOLVE(max_body_bytes, SLUICE_ADMIN_MAX_BODY_BYTES_DEFAULT, 1, d->max_request_bytes);
    ADMIN_RESOLVE(history_s, SLUICE_ADMIN_HISTORY_S_DEFAULT, 10, 3600);
#undef ADMIN_RESOLVE
    return SLUICE_OK;
}

/* Bind and listen ourselves, so a failure names its cause; returns the socket or -1. */
static int admin_listen(const struct sluice_admin_desc *d, bool *loopback, uint16_t *port,
                        int *status)
{
    const char *host = strcmp(d->address, "localhost") ? d->address : "127.0.0.1";
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM};
    char service[8];
    snprintf(service, sizeof service, "%u", d->port.value);
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, service, &hints, &ai) != 0 || !ai) {
        *status = sluice__fail(d->error, d->error_size,
                               "sluice_admin_desc.address \"%s\" is not a numeric IPv4/IPv6 "
                               "address (e.g. 127.0.0.1 or ::1)",
                               d->address);
        return -1;
    }
    *loopback = addr_is_loopback(ai->ai_addr);
    if (!*loopback && !d->allow_remote) {
        freeaddrinfo(ai);
        *status = sluice__fail(d->error, d->error_size,
                               "sluice_admin_desc.address \"%s\" is not loopback; the endpoint "
                               "has no authentication, so set sluice_admin_desc.allow_remote = "
                               "true only behind a firewall or an authenticating proxy",
                               d->address);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        *status = sluice__fail(d->error, d->error_size,
                               "cannot listen on %s port %s: %s (change sluice_admin_desc.port, "
                               "or SLUICE_SOME(0) for a free one)",
                               d->address, service, strerror(err));
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static void admin_free(struct sluice_admin *a)
{
    if (!a)
        return;
    for (size_t i = 0; a->nodes && i < a->n_nodes; i++)
        free(a->nodes[i].history);
    free(a->nodes);
    pthread_cond_destroy(&a->slot_freed);
    pthread_mutex_destroy(&a->conns_mutex); /* conns is empty: every close was reported */
    pthread_cond_destroy(&a->tick);
    pthread_mutex_destroy(&a->mutex);
    free(a);
}

/* The admin of engine d->engine, its locks and a node entry (with history_s of chart)
 * per backend; NULL when out of memory. */
static struct sluice_admin *admin_alloc(const struct sluice_admin_desc *d)
{
    struct sluice_admin *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    pthread_mutex_init(&a->mutex, NULL);
    pthread_mutex_init(&a->conns_mutex, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->tick, &ca);
    pthread_cond_init(&a->slot_freed, &ca);
    pthread_condattr_destroy(&ca);
    a->engine = d->engine;
    a->cfg = *d;
    a->cfg.address = NULL;
    a->cfg.error = NULL;
    a->n_nodes = sluice_engine_backend_count(d->engine);
    a->nodes = calloc(a->n_nodes ? a->n_nodes : 1, sizeof *a->nodes);
    if (!a->nodes) {
        admin_free(a);
        return NULL;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct sluice__admin_node *n = &a->nodes[i];
        n->id = sluice_engine_backend_id(d->engine, i);
        n->ring = sluice_engine_events(d->engine, n->id);
        n->preset = sluice_engine_backend_at(d->engine, i)->builtin;
        n->history = calloc(d->history_s, sizeof *n->history);
        if (!n->history) {
            admin_free(a);
            return NULL;
        }
    }
    return a;
}

/* libmicrohttpd on the listening socket fd, with the limits of a->cfg; NULL if it failed. */
static struct MHD_Daemon *admin_daemon(struct sluice_admin *a, int fd)
{
    const struct sluice_admin_desc *d = &a->cfg;
    return MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0,
        sluice__admin_on_accept, a, sluice__admin_on_request, a, MHD_OPTION_LISTEN_SOCKET,
        (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
        ((unsigned)d->max_connections + SLUICE__ADMIN_SPARE) * ADMIN_CLOSING_FACTOR,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)d->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)d->max_request_bytes, MHD_OPTION_NOTIFY_COMPLETED, sluice__admin_on_completed, a,
        MHD_OPTION_NOTIFY_CONNECTION, sluice__admin_on_connection, a, MHD_OPTION_END);
}

int sluice_admin_start(const struct sluice_admin_desc *desc, struct sluice_admin **out)
{
    if (out)
        *out = NULL;
    if (!desc)
        return SLUICE_EINVAL;
    if (desc->error && desc->error_size)
        desc->error[0] = '\0';
    if (!out)
        return sluice__fail(desc->error, desc->error_size,
                            "out is NULL (pass the address of a struct sluice_admin *)");
    struct sluice_admin_desc d;
    int status = admin_resolve(desc, &d);
    if (status != SLUICE_OK)
        return status;
    struct sluice_admin *a = admin_alloc(&d);
    if (!a)
        return SLUICE_ENOMEM;
    int fd = admin_listen(&d, &a->loopback, &a->port, &status);
    if (fd < 0) {
        admin_free(a);
        return status;
    }
    a->daemon = admin_daemon(a, fd);
    if (!a->daemon) {
        unsigned port = a->port; /* for the message: a is gone after admin_free */
        close(fd);
        admin_free(a);
        sluice__fail(desc->error, desc->error_size, "libmicrohttpd did not start on port %u",
                     port);
        return SLUICE_EIO;
    }
    if (pthread_create(&a->sampler, NULL, sluice__admin_sampler_main, a) != 0) {
        atomic_store(&a->stopping, true);
        MHD_stop_daemon(a->daemon);
        admin_free(a);
        sluice__fail(desc->error, desc->error_size, "cannot start the admin's sampler thread");
        return SLUICE_EIO;
    }
    a->sampler_started = true;
    *out = a;
    return SLUICE_OK;
}

uint16_t sluice_admin_port(const struct sluice_admin *a)
{
    return a ? a->port : 0;
}

void sluice_admin_stop(struct sluice_admin *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mutex);
    atomic_store(&a->stopping, true);
    pthread_cond_broadcast(&a->tick);
    pthread_mutex_lock(&a->conns_mutex); /* the listener may wait for room */
    pthread_cond_broadcast(&a->slot_freed);
    pthread_mutex_unlock(&a->conns_mutex);
    pthread_mutex_unlock(&a->mutex);
    /* Joins the listener and every connection thread; streams see `stopping` and end. */
    MHD_stop_daemon(a->daemon);
    if (a->sampler_started)
        pthread_join(a->sampler, NULL);
    admin_free(a);
}
