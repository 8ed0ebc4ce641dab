/*
 * sluice-provider-sim — an HTTP/1.1 server on 127.0.0.1 that behaves like a
 * remote model provider (an LLM API) with a hidden concurrency cap, so the
 * shim can be tested and benchmarked over real sockets.
 *
 *   POST /v1/chat/completions   an OpenAI-shaped chat.completion after a
 *                               lognormal service time; past the cap:
 *                                 reject  429 at once (optional Retry-After)
 *                                 queue   wait in a FIFO (Ollama-like); 503
 *                                         past --queue-bound waiting, and
 *                                         503 to a call that waited
 *                                         --queue-timeout (HAProxy's
 *                                         `timeout queue`)
 *                                 knee    served, but slower: S·(1+slope·(n−C)/C)
 *                               and three providers without a plain cap:
 *                                 rate    --rate R calls per sliding second
 *                                         (--rate-window), 429 past it
 *                                 slow    every call in service slows the
 *                                         rest: S·(1+slope·(n−1)/C), no cap
 *                                 drop    past C in service the call is never
 *                                         answered (the client times out)
 *                               With --stream, a call whose body asks
 *                               "stream": true is answered with server-
 *                               sent events instead (see "Streaming")
 *   GET  /stats                 counters as JSON (see stats_json)
 *   POST /stats/reset           zero the counters; peaks restart from now
 *
 * The model (service times, verdicts past the cap, knee slow-down) is the
 * one the virtual-time simulator runs: provider_model.h (beside this file;
 * testkit/provider_sim.h runs the same model in virtual time). This
 * file only adds the sockets, the clock and the counters.
 *
 * Start-up contract (tests rely on it): the first line on stdout is the
 * bound port as a bare decimal number, followed by a flush; nothing else is
 * written to stdout. Messages and the per-second lines go to stderr. Exit
 * codes: 0 after SIGTERM/SIGINT, 1 when the server cannot start, 2 on a bad
 * command line (one line on stderr saying which flag).
 *
 * Streaming (--stream): the mode's service time is the time to first token
 * (so queueing and the knee slow the first token, as at a real provider);
 * the call holds its slot from its start until its last token. The answer
 * is a comment at once (": sluice-provider-sim processing", as OpenRouter's
 * keep-alive), then one chat.completion.chunk per token every --token-ms,
 * --answer-tokens long (lognormal, --answer-sigma), a last chunk with
 * finish_reason "stop", a chunk with `usage`, and `data: [DONE]`.
 * --stream-fail-after N sends an error event with code 429 (and
 * finish_reason "error") after N tokens instead and ends the stream;
 * --stream-endless never ends it; --stream-end-ms holds the body's end back
 * after [DONE] (the slot is free at [DONE]). A client that hangs up mid-stream is seen
 * at once (the thread waits for the next token in ppoll on its socket) and
 * counted in stream.cut; with --abandoned hold the slot stays taken until
 * the stream's planned end (at once for an endless stream).
 *
 * Abandoned calls (--abandoned): a client that hangs up while its call is
 * in service is counted as cancelled at once. With `hold` (the default) the
 * call keeps its slot until its service time ends, as an LLM provider keeps
 * generating (and billing) a completion nobody reads any more: /stats shows
 * it as lingering, counted in in_service but not in in_flight. With `free`
 * the slot is given back at once. Hold is the default because it is what
 * providers do, and what a client's discovery must cope with (a caller's
 * deadline or cancel does not free the provider's slot); `free` keeps the
 * tests whose point is that a hang-up reaches the provider at all. A call
 * still queued (queue mode) or dropped (drop mode) never started, so a
 * hang-up takes it out of the line in both settings. Refusals (429, and 503
 * past --queue-bound) are answered from the arriving call's thread at once:
 * nothing here delays them.
 *
 * Threads: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION). A call that must wait — in service, or
 * queued behind the cap — blocks its own connection thread in ppoll() on the
 * client's socket (POLLRDHUP), a per-call wake eventfd (queue mode), a
 * timeout (its service end, or its queue timeout) and a shared stop eventfd.
 * That is why this is not MHD's suspend/resume: MHD does not watch a
 * suspended connection, so it would not notice a client that hangs up
 * mid-call. Here a hang-up wakes the waiting thread at once; with
 * --abandoned free (or a call not yet in service) the handler returns
 * MHD_NO, and the request-completed callback (MHD_REQUEST_TERMINATED_*)
 * frees the slot and counts the call as cancelled; with hold the thread
 * stops watching the socket and sleeps out the service time first. A queued
 * call's timer, an arrival and every start of a queued call expire the
 * FIFO's head once it waited --queue-timeout. The cost is one thread
 * (512 KiB of stack, reserved not committed) per open connection: hundreds
 * of concurrent slow calls are fine; tens of thousands are not the use.
 * The main thread waits for SIGTERM/SIGINT with sigtimedwait, applies
 * --cap-at changes when they fall due and prints the per-second lines.
 *
 * Allocation: plain malloc. The build links mimalloc, whose malloc override
 * then serves it; under ASan and TSan the sanitizer's allocator does, so
 * they check these records too (explicit mi_* calls would bypass them, and
 * TSan reports mimalloc's uninstrumented cross-thread frees as races).
 *
 * All provider state (the model, the FIFO, counters, the random stream) sits
 * behind one mutex; no libmicrohttpd call and no blocking syscall is made
 * while holding it (creating a queued call's eventfd and writing to a
 * non-blocking one are the only syscalls under it).
 *
 * Files, one per concept: see sim.h.
 */
#define _GNU_SOURCE
#include "sim.h"

/* ---- main ------------------------------------------------------------------------ */

static void set_cap(struct server *sv, uint32_t cap, bool quiet)
{
    pthread_mutex_lock(&sv->lock);
    sv->model.cap = cap;
    pump(sv);
    pthread_mutex_unlock(&sv->lock);
    if (!quiet)
        fprintf(stderr, PROG ": t=%.1fs cap -> %" PRIu32 "\n", (double)(sim_clock_ns() - sv->t0_ns) / 1e9, cap);
}

static void print_second(struct server *sv, struct counters *last)
{
    pthread_mutex_lock(&sv->lock);
    struct counters c = sv->total;
    uint32_t cap = sv->model.cap, flying = in_flight(sv), waiting = sv->waiting;
    uint32_t lingering = sv->lingering, peak = sv->peak_in_flight;
    pthread_mutex_unlock(&sv->lock);
    if (c.requests < last->requests) /* a reset in between */
        memset(last, 0, sizeof *last);
    fprintf(stderr,
            PROG ": t=%.0fs %s cap=%" PRIu32 " in_flight=%" PRIu32 " queued=%" PRIu32
                 " lingering=%" PRIu32 " peak=%" PRIu32 " | last 1s: 200=%" PRIu64 " 429=%" PRIu64
                 " 503=%" PRIu64 " cancelled=%" PRIu64 " | requests=%" PRIu64 "\n",
            (double)(sim_clock_ns() - sv->t0_ns) / 1e9, sim_mode_name(sv->model.mode), cap, flying,
            waiting, lingering, peak, c.by_status[200] - last->by_status[200],
            c.by_status[429] - last->by_status[429], c.by_status[503] - last->by_status[503],
            c.cancelled - last->cancelled, c.requests);
    *last = c;
}

/* Until SIGTERM or SIGINT: apply cap changes when due, print a line a second. */
static void run_until_signal(struct server *sv, const struct options *o, const sigset_t *stop_signals)
{
    struct counters last = {0};
    int64_t next_tick = sv->t0_ns + NS_PER_S;
    size_t next_change = 0;
    for (;;) {
        int64_t now = sim_clock_ns();
        while (next_change < o->n_changes && sv->t0_ns + o->changes[next_change].at_ns <= now)
            set_cap(sv, o->changes[next_change++].cap, o->quiet);
        if (next_tick <= now) {
            if (!o->quiet)
                print_second(sv, &last);
            while (next_tick <= now)
                next_tick += NS_PER_S;
        }
        int64_t wake = next_tick;
        if (next_change < o->n_changes && sv->t0_ns + o->changes[next_change].at_ns < wake)
            wake = sv->t0_ns + o->changes[next_change].at_ns;
        int64_t left = wake > now ? wake - now : 0;
        struct timespec ts = {(time_t)(left / NS_PER_S), (long)(left % NS_PER_S)};
        int sig = sigtimedwait(stop_signals, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT)
            return;
    }
}

int main(int argc, char **argv)
{
    struct options o;
    parse_options(argc, argv, &o);
    struct server *sv = &server;
    sv->model = o.model;
    sv->retry_after_date = o.retry_after_date;
    sv->abandoned = o.abandoned;
    sv->dialect = o.dialect;
    sv->stream = o.stream;
    if (sv->model.mode == SIM_RATE) {
        sv->rate.slots = sim_rate_slots(&sv->model);
        sv->rate.t = calloc(sv->rate.slots, sizeof *sv->rate.t);
        if (!sv->rate.t) {
            fprintf(stderr, PROG ": cannot allocate the rate window (%u calls)\n", sv->rate.slots);
            return 1;
        }
    }
    sim_rng_seed(&sv->rng, o.seed);
    sv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sv->stop_fd < 0) {
        fprintf(stderr, PROG ": eventfd: %s\n", strerror(errno));
        return 1;
    }
    tool_raise_fd_limit(4 * CONNECTION_LIMIT); /* its sockets, and queued calls' eventfds */

    /* Every thread inherits this mask, so only sigtimedwait in main sees the
     * stop signals. SIG_DFL first: an inherited SIG_IGN would discard them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(o.port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (!o.quiet)
        flags |= MHD_USE_ERROR_LOG;
    sv->t0_ns = sim_clock_ns();
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, o.port, NULL, NULL, on_request, sv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv,
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)CONNECTION_LIMIT, MHD_OPTION_THREAD_STACK_SIZE, (size_t)THREAD_STACK,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, PROG ": cannot listen on 127.0.0.1:%u (is --port free?)\n", o.port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("%u\n", info ? info->port : o.port);
    fflush(stdout);
    if (!o.quiet)
        fprintf(stderr, PROG ": listening on 127.0.0.1:%u, mode %s, cap %" PRIu32 "\n",
                info ? info->port : o.port, sim_mode_name(o.model.mode), o.model.cap);

    run_until_signal(sv, &o, &stop_signals);

    /* Stop: new calls are refused, waiting ones wake through stop_fd and
     * return MHD_NO, and MHD closes the rest. SIGALRM (not blocked) bounds it. */
    alarm(STOP_BOUND_S);
    pthread_mutex_lock(&sv->lock);
    sv->stopping = true;
    pthread_mutex_unlock(&sv->lock);
    (void)eventfd_write(sv->stop_fd, 1);
    MHD_stop_daemon(d);
    close(sv->stop_fd);
    return 0;
}

