/*
 * provider.c — the provider behind the sockets: calls take slots, wait in
 * the FIFO (queue mode) or are refused, and a call's connection thread waits
 * for its answer in ppoll (see main.c, "Threads").
 */
#define _GNU_SOURCE
#include "sim.h"

struct server server = {.lock = PTHREAD_MUTEX_INITIALIZER, .stop_fd = -1};


/* CLOCK_MONOTONIC in ns: every deadline and span of the simulator. */
int64_t sim_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* Under lock: calls whose client still waits for an answer. */
uint32_t in_flight(const struct server *sv)
{
    return sv->in_service - sv->lingering + sv->waiting;
}

void note_peaks(struct server *sv)
{
    uint32_t in_flight_now = in_flight(sv);
    if (in_flight_now > sv->peak_in_flight)
        sv->peak_in_flight = in_flight_now;
    if (sv->in_service > sv->peak_in_service)
        sv->peak_in_service = sv->in_service;
}

/* Under lock: `r` takes a slot now; its service time is drawn from the model. */
static void start_service(struct server *sv, struct req *r)
{
    sv->in_service++;
    double ns = sim_provider_service_s(&sv->model, &sv->rng, sv->in_service) * 1e9;
    if (!(ns < MAX_SERVICE_NS)) /* a huge --sigma can draw +inf */
        ns = MAX_SERVICE_NS;
    r->due_ns = sim_clock_ns() + (int64_t)ns;
    r->state = REQ_SERVING;
    note_peaks(sv);
}

/* Under lock: take `r` out of the FIFO (`prev` is the call before it, or NULL). */
static void fifo_unlink(struct server *sv, struct req *r, struct req *prev)
{
    if (prev)
        prev->next = r->next;
    else
        sv->head = r->next;
    if (sv->tail == r)
        sv->tail = prev;
    sv->waiting--;
}

static void wake(struct req *r)
{
    if (eventfd_write(r->wake_fd, 1) != 0)
        fprintf(stderr, PROG ": cannot wake a queued call: %s\n", strerror(errno));
}

static double waited_s(const struct req *r, int64_t now)
{
    return (double)(now - r->queued_ns) / 1e9;
}

/* Under lock: the calls at the head of the FIFO that waited --queue-timeout
 * leave it with a 503 (the head is the longest waiter, so the first that has
 * not expired ends the scan). Run whenever time moves: on an arrival, before
 * a waiting call starts, and when a waiting call's own timer fires. */
static void expire_waiting(struct server *sv, int64_t now)
{
    while (sv->head && sim_provider_queue_expired(&sv->model, waited_s(sv->head, now))) {
        struct req *r = sv->head;
        fifo_unlink(sv, r, NULL);
        r->state = REQ_EXPIRED;
        sv->total.by_status[503]++;
        sv->total.queue_timeouts++;
        wake(r);
    }
}

/* Under lock: start waiting calls while the model lets them (after a call
 * left its slot, or the cap rose). */
void pump(struct server *sv)
{
    expire_waiting(sv, sim_clock_ns());
    while (sim_provider_may_start_waiting(&sv->model, sv->in_service, sv->waiting)) {
        struct req *r = sv->head;
        fifo_unlink(sv, r, NULL);
        start_service(sv, r);
        wake(r);
    }
}

/* Under lock: `r` gives its slot back; a lingering call was counted when
 * its client left. */
static void leave_service(struct server *sv, struct req *r)
{
    sv->in_service--;
    if (r->lingering) {
        sv->lingering--;
        r->lingering = false;
    }
    r->state = REQ_DONE;
    pump(sv);
}

/* Under lock: the call's service time is over; it is answered 200, unless
 * its client left already. */
void finish_service(struct server *sv, struct req *r)
{
    if (!r->lingering)
        sv->total.by_status[200]++;
    leave_service(sv, r);
}

/* Under lock: the client of a call in service hung up, and the provider
 * keeps generating (--abandoned hold): counted as cancelled now, the slot
 * stays taken until due_ns. */
void abandon_call(struct server *sv, struct req *r)
{
    r->lingering = true;
    sv->lingering++;
    sv->total.cancelled++;
}

/* Under lock: the client left (or the server stops) before the answer, and
 * the call gives back what it holds at once. */
void cancel_call(struct server *sv, struct req *r)
{
    if (r->state == REQ_WAITING) {
        struct req *prev = NULL;
        for (struct req *q = sv->head; q != r; q = q->next)
            prev = q;
        fifo_unlink(sv, r, prev);
        sv->total.cancelled++;
        r->state = REQ_DONE;
        pump(sv);
        return;
    }
    if (!r->lingering)
        sv->total.cancelled++;
    leave_service(sv, r);
}

/*
 * A chat call reaches the provider. Returns the status to answer now, 0 when
 * the call must wait (REQ_SERVING or REQ_WAITING), or -1 when the server is
 * stopping.
 */
int arrive(struct server *sv, struct req *r)
{
    int status = 0;
    pthread_mutex_lock(&sv->lock);
    if (sv->stopping) {
        pthread_mutex_unlock(&sv->lock);
        return -1;
    }
    sv->total.requests++;
    r->id = ++sv->next_id;
    int64_t now_ns = sim_clock_ns();
    expire_waiting(sv, now_ns);
    double now_s = (double)(now_ns - sv->t0_ns) / 1e9, reset_s = 0;
    bool rate_refused =
        sv->model.mode == SIM_RATE && !sim_rate_admit(&sv->model, &sv->rate, now_s);
    /* The refusal's headers state the window as it was when it refused: read when the
     * answer is written, a loaded machine would show a slot already freed (remaining 1). */
    if (rate_refused && !sim_rate_left(&sv->model, &sv->rate, now_s, &reset_s))
        r->rate_reset_ns = now_ns + (int64_t)(reset_s * 1e9);
    enum sim_verdict verdict = rate_refused
                                   ? SIM_REFUSE_429
                                   : sim_provider_admit(&sv->model, sv->in_service, sv->waiting);
    switch (verdict) {
    case SIM_SERVE:
        start_service(sv, r);
        if (r->stream) {
            status = 200; /* the stream starts now */
        } else if (r->due_ns <= sim_clock_ns()) { /* --median-ms 0: answer at once */
            finish_service(sv, r);
            status = 200;
        }
        break;
    case SIM_WAIT:
        r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (r->wake_fd < 0) {
            fprintf(stderr, PROG ": eventfd: %s; answering 503\n", strerror(errno));
            status = 503;
            break;
        }
        r->state = REQ_WAITING;
        r->queued_ns = sim_clock_ns();
        r->next = NULL;
        if (sv->tail)
            sv->tail->next = r;
        else
            sv->head = r;
        sv->tail = r;
        sv->waiting++;
        note_peaks(sv);
        break;
    case SIM_REFUSE_429:
        status = 429;
        break;
    case SIM_REFUSE_503:
        status = 503;
        break;
    }
    if (status && status != 200) /* a 200 was counted by finish_service */
        sv->total.by_status[status]++;
    pthread_mutex_unlock(&sv->lock);
    return status;
}

/* Under lock: how long the waiting thread of `r` may sleep (NULL: until
 * woken), or 0 in *status when the call is over: 200 (served), 503 (its
 * queue timeout passed) or -1 (served after its client left). */
static struct timespec *wait_timeout(struct server *sv, struct req *r, struct timespec *ts,
                                     int *status)
{
    int64_t now = sim_clock_ns(), left;
    *status = 0;
    if (r->state == REQ_WAITING)
        expire_waiting(sv, now);
    if (r->state == REQ_EXPIRED) {
        r->state = REQ_DONE; /* counted by expire_waiting */
        *status = 503;
        return NULL;
    }
    if (r->state == REQ_SERVING && r->stream && !r->lingering) {
        *status = 200; /* the stream starts now; its first token is due at due_ns */
        return NULL;
    }
    if (r->state == REQ_SERVING) {
        left = r->due_ns - now;
        if (left <= 0) {
            *status = r->lingering ? -1 : 200;
            finish_service(sv, r);
            return NULL;
        }
    } else if (r->state == REQ_WAITING && sv->model.queue_timeout_s > 0) {
        left = r->queued_ns + (int64_t)(sv->model.queue_timeout_s * 1e9) - now;
        if (left <= 0) /* rounding: expire_waiting did not see it due yet */
            left = 1000;
    } else {
        return NULL;
    }
    ts->tv_sec = (time_t)(left / NS_PER_S);
    ts->tv_nsec = (long)(left % NS_PER_S);
    return ts;
}

/*
 * Block this connection's thread until the call is over: its service time
 * ends (200), or its queue timeout passes (503). Returns -1 if the client
 * hung up or the server is stopping first; the call still holds its slot or
 * FIFO place then, and on_completed releases it. With --abandoned hold, a
 * client that hangs up during service does not end the wait: the call
 * lingers in its slot until due_ns, and then -1 is returned.
 */
int wait_for_answer(struct server *sv, struct MHD_Connection *conn, struct req *r)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd fds[3] = {
        {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP},
        {.fd = sv->stop_fd, .events = POLLIN},
        {.fd = r->wake_fd, .events = POLLIN},
    };
    nfds_t n = r->wake_fd >= 0 ? 3 : 2;
    int status;
    pthread_mutex_lock(&sv->lock);
    for (;;) {
        struct timespec ts, *timeout = wait_timeout(sv, r, &ts, &status);
        pthread_mutex_unlock(&sv->lock);
        if (status)
            return status;
        /* A wake written before this ppoll stays readable, so none is lost. */
        if (ppoll(fds, n, timeout, NULL) < 0 && errno != EINTR)
            return -1;
        if (fds[1].revents)
            return -1; /* stopping */
        if (n == 3 && fds[2].revents) {
            eventfd_t drained;
            (void)eventfd_read(r->wake_fd, &drained);
        }
        pthread_mutex_lock(&sv->lock);
        if (fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) { /* the client hung up */
            if (r->state != REQ_SERVING || sv->abandoned == ABANDONED_FREE) {
                pthread_mutex_unlock(&sv->lock);
                return -1;
            }
            abandon_call(sv, r);
            fds[0].fd = -1; /* ppoll skips it from now on */
        }
    }
}

