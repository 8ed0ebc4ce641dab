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
 * The same list decides who gets a slot past max_connections
 * (sluice__admin_on_accept).
 */
#include "admin_internal.h"

#include <stdlib.h>
#include <sys/socket.h>

/* How long a connection's request may take to arrive before a newcomer may take its
 * slot: a request over loopback or a LAN arrives in milliseconds, so a head still
 * arriving after half a second is a slow or hostile client. Under a flood of such
 * heads each slot takes in one newcomer per grace, so the operator's wait in the
 * listen queue is about (heads queued ahead) / max_connections × this. */
#define ADMIN_HEAD_GRACE_MS 500

/* With every slot's request arrived and the spare 503 slots taken, ask again this
 * often (a close wakes the wait sooner). */
#define ADMIN_FULL_RECHECK_MS 1000

/*
 * Room for the connection being accepted (under conns_mutex): 0 when it may come in
 * (a->admit_over says whether it is over the limit, its request to get 503), else
 * how many ms to wait before asking again (a close wakes the wait sooner).
 *
 * Past max_connections the newcomer takes the slot of, in turn: the kept-alive
 * connection idle the longest (a client must expect that between requests, and
 * retries); the connection whose request has been arriving the longest, once that
 * is over ADMIN_HEAD_GRACE_MS. A request still within its grace may yet arrive in
 * full, so the newcomer waits for it to, or for its grace to run out. Only when
 * every slot holds a request that has arrived (an answer or a stream in progress)
 * is the newcomer over the limit; SLUICE__ADMIN_SPARE of those are let in to hear
 * 503, and the rest wait. Waiting means the listener accepts nobody meanwhile: the
 * kernel's listen queue holds them in order, so a client that reconnects the
 * moment it is cut joins the back of the queue instead of racing the operator
 * for each freed slot, and libmicrohttpd never meets its own limit (where it
 * closes a connection unanswered).
 */
static int64_t conn_make_room(struct sluice_admin *a, int64_t now_ms)
{
    uint32_t live = 0, over = 0;
    struct sluice__admin_conn *idle = NULL, *head = NULL, *over_head = NULL;
    for (struct sluice__admin_conn *o = a->conns; o; o = o->next) {
        if (o->cut)
            continue;
        *(o->over ? &over : &live) += 1;
        if (!o->waiting)
            continue;
        struct sluice__admin_conn **oldest = o->over ? &over_head : o->served ? &idle : &head;
        if (!*oldest || o->since_ms < (*oldest)->since_ms)
            *oldest = o;
    }
    if (live < a->cfg.max_connections) {
        a->admit_over = false;
        return 0;
    }
    int64_t head_wait = head ? ADMIN_HEAD_GRACE_MS - (now_ms - head->since_ms) : 0;
    struct sluice__admin_conn *victim = idle ? idle : head && head_wait <= 0 ? head : NULL;
    if (!victim && head)
        return head_wait;
    if (!victim && over >= SLUICE__ADMIN_SPARE) {
        int64_t over_wait = over_head ? ADMIN_HEAD_GRACE_MS - (now_ms - over_head->since_ms)
                                      : ADMIN_FULL_RECHECK_MS;
        if (over_wait > 0)
            return over_wait;
        victim = over_head;
    }
    if (victim) {
        shutdown(victim->fd, SHUT_RD);
        victim->cut = true;
    }
    a->admit_over = !victim || victim->over;
    return 0;
}

enum MHD_Result sluice__admin_on_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)addr;
    (void)len;
    struct sluice_admin *a = cls;
    pthread_mutex_lock(&a->conns_mutex);
    int64_t wait_ms;
    while (!atomic_load(&a->stopping) &&
           (wait_ms = conn_make_room(a, sluice__admin_mono_ms())) > 0) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (wait_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&a->slot_freed, &a->conns_mutex, &until);
    }
    bool admit = !atomic_load(&a->stopping);
    pthread_mutex_unlock(&a->conns_mutex);
    return admit ? MHD_YES : MHD_NO;
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
    pthread_cond_broadcast(&a->slot_freed);
    pthread_mutex_unlock(&a->conns_mutex);
    *socket_context = NULL;
    free(k);
}

/* A connection opened (on the listener thread, right after sluice__admin_on_accept made
 * room for it): list it, its deadline running, in the slot found for it. */
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
    k->over = a->admit_over;
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
