/*
 * admin_conns.c — the admin's request deadline and connection slots.
 *
 * libmicrohttpd's connection timeout only counts idle time, so a client
 * dribbling a byte at a time would keep its slot for hours. Each
 * connection therefore gets an entry in admin.conns (added when
 * libmicrohttpd reports it opened, removed when it reports it closed),
 * stamped when it opens and again after each answer; the access handler
 * marks it once the request has arrived in full, and the sampler's tick
 * shuts down the reading side of any connection still waiting after
 * timeout_s (libmicrohttpd then closes it as if the client had hung up).
 * libmicrohttpd reports a connection closed before it closes the socket,
 * and entries change only under conns_mutex, which the sampler holds while
 * it shuts sockets down: it never touches a closed (or reused) descriptor.
 *
 * The same list decides who gets a slot past max_connections (conn_admit).
 */
#include "admin_internal.h"

#include <stdlib.h>
#include <sys/socket.h>

/*
 * A new connection `k` (listed already; under conns_mutex): past max_connections it
 * takes the slot of the kept-alive connection idle the longest, which is shut down
 * (a client must expect that between requests, and retries); with none, k is over
 * the limit and its request gets 503. So ordinary keep-alive connections cannot hold
 * every slot, and only requests in progress (streams: at most max_streams; heads:
 * at most timeout_s) can fill the endpoint.
 */
static void conn_admit(struct sluice_admin *a, struct sluice__admin_conn *k)
{
    uint32_t live = 0;
    struct sluice__admin_conn *idle = NULL;
    for (struct sluice__admin_conn *o = a->conns; o; o = o->next) {
        if (o->cut || o->over)
            continue;
        live++;
        if (o != k && o->served && o->waiting && (!idle || o->since_ms < idle->since_ms))
            idle = o;
    }
    if (live <= a->cfg.max_connections)
        return;
    if (idle) {
        shutdown(idle->fd, SHUT_RD);
        idle->cut = true;
    } else {
        k->over = true;
    }
}

/* A slot was freed (under conns_mutex): the oldest connection over the limit whose
 * request has not arrived yet takes it, rather than a 503 while a slot is free. */
static void conn_promote(struct sluice_admin *a)
{
    struct sluice__admin_conn *first = NULL;
    for (struct sluice__admin_conn *o = a->conns; o; o = o->next)
        if (o->over && o->waiting && !o->cut && (!first || o->since_ms <= first->since_ms))
            first = o;
    if (first)
        first->over = false;
}

/* A connection closed: unlist it, and hand its slot on. */
static void conn_closed(struct sluice_admin *a, void **socket_context)
{
    struct sluice__admin_conn *k = *socket_context;
    if (!k)
        return;
    pthread_mutex_lock(&a->conns_mutex);
    if (k->prev)
        k->prev->next = k->next;
    else
        a->conns = k->next;
    if (k->next)
        k->next->prev = k->prev;
    if (!k->cut && !k->over)
        conn_promote(a);
    pthread_mutex_unlock(&a->conns_mutex);
    *socket_context = NULL;
    free(k);
}

/* A connection opened: list it, its deadline running, and give it a slot (or not). */
static void conn_opened(struct sluice_admin *a, struct MHD_Connection *c, void **socket_context)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct sluice__admin_conn *k = info ? calloc(1, sizeof *k) : NULL;
    if (!k) {
        /* Untracked, it would escape the deadline: refuse it (as the sampler cuts one). */
        if (info)
            shutdown((int)info->connect_fd, SHUT_RD);
        return;
    }
    k->fd = (int)info->connect_fd;
    k->waiting = true;
    k->since_ms = sluice__admin_mono_ms();
    pthread_mutex_lock(&a->conns_mutex);
    k->next = a->conns;
    if (a->conns)
        a->conns->prev = k;
    a->conns = k;
    conn_admit(a, k);
    pthread_mutex_unlock(&a->conns_mutex);
    *socket_context = k;
}

void sluice__admin_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                                 enum MHD_ConnectionNotificationCode code)
{
    if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        conn_closed(cls, socket_context);
    else
        conn_opened(cls, c, socket_context);
}

bool sluice__admin_conn_mark(struct sluice_admin *a, struct MHD_Connection *c, bool waiting)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct sluice__admin_conn *k = info ? info->socket_context : NULL;
    if (!k)
        return false;
    pthread_mutex_lock(&a->conns_mutex);
    k->waiting = waiting;
    k->served |= waiting;
    k->since_ms = sluice__admin_mono_ms();
    bool over = k->over;
    pthread_mutex_unlock(&a->conns_mutex);
    return over;
}

/* From the sampler's tick. Only the reading side is shut down: the connection's own
 * thread then reads end of file and libmicrohttpd closes it as it does a client that
 * hung up, so the client sees the close only after the server has let go of the
 * connection (with SHUT_RDWR it would see it at once, and a client that reconnects
 * then could find the slot still taken). */
void sluice__admin_cut_overdue(struct sluice_admin *a)
{
    int64_t deadline = sluice__admin_mono_ms() - (int64_t)a->cfg.timeout_s * 1000;
    pthread_mutex_lock(&a->conns_mutex);
    for (struct sluice__admin_conn *k = a->conns; k; k = k->next)
        if (k->waiting && !k->cut && k->since_ms <= deadline) {
            shutdown(k->fd, SHUT_RD);
            k->cut = true;
        }
    pthread_mutex_unlock(&a->conns_mutex);
}
