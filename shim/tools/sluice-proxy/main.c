/*
 * sluice-proxy — the library as a loopback HTTP/1.1 proxy that any program,
 * in any language, puts in front of its model provider.
 *
 *   sluice-proxy --upstream https://api.openai.com --node cloud:openai
 *   sluice-proxy --config /etc/sluice/proxy.conf
 *
 * Every request that generates goes through its backend's sluice pool:
 * admitted or refused at once (503), queued FIFO for a permit under the
 * limit that ceiling discovery learns from the provider's answers, then sent
 * upstream with its body unchanged and its answer streamed back as it
 * arrives. One that only reads (GET, HEAD, OPTIONS without a body), or goes to
 * an endpoint that generates nothing (a backend's unpooled_paths), goes
 * straight upstream (upstream.c, only_reads). The lock
 * persists in the state file (--state), is shared by every proxy naming the
 * same Redis (--redis / `redis` in the config), and is shown and cleared on
 * the admin endpoint (127.0.0.1:8400 by default) and with sluicectl.
 *
 * What a client sees is in upstream.c (the status mapping) and http.c (the
 * front end's bounds); routing in route.c; the access log in log.c; the
 * command line in options.c; the configuration file in config.c.
 *
 * Start-up contract (tests and scripts rely on it): the first line on
 * stdout is the URL served ("http://127.0.0.1:PORT"), the second the admin
 * endpoint's URL when there is one; nothing else goes to stdout.
 *
 * Shutdown: SIGTERM or SIGINT stops accepting, closes idle connections,
 * lets calls in progress finish for up to --drain-ms, then aborts what is
 * left (a cut answer, or 503) and exits 0. A second signal during the
 * drain stops at once, cutting what is left the same way (logged
 * cut_drain; the state file and permits are closed as on any exit).
 *
 * Threads: see proxy.h. Signals are blocked in every thread and read from a
 * signalfd on the loop.
 *
 * Files: see proxy.h.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef SLUICE_HAVE_FLEET
#include <sluice/fleet.h>
#endif

#define EVENTS_MAX 256
/* How often connection deadlines are looked at (and the engine polled): a timeout fires at
 * most this late (at 1000 a --client-timeout-ms of 1000 answered its 408 after 2 s); a sweep
 * walks the connections, a few thousand at most. */
#define SWEEP_MS 100
#define LOG_FLUSH_MS 200

int64_t proxy_now_ns(void)
{
    return sluice_monotonic_ns();
}

/* ---- the curl loop in this thread's epoll ----------------------------------------------------- */

static void on_watch(void *ctx, curl_socket_t fd, int what, void **socketp)
{
    struct proxy *p = ctx;
    struct watch *w = *socketp;
    if (what == CURL_POLL_REMOVE) {
        if (w) {
            epoll_ctl(p->ep, EPOLL_CTL_DEL, fd, NULL);
            w->fd = -1; /* an event fetched in this iteration skips it */
            w->next_dead = p->dead_watches;
            p->dead_watches = w;
        }
        return;
    }
    struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) |
                                       (what & CURL_POLL_OUT ? EPOLLOUT : 0u)};
    if (!w) {
        if (!(w = calloc(1, sizeof *w)))
            return;
        *w = (struct watch){.kind = W_CURL, .fd = fd};
        *socketp = w;
        ev.data.ptr = w;
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
            epoll_ctl(p->ep, EPOLL_CTL_MOD, fd, &ev);
        return;
    }
    ev.data.ptr = w;
    epoll_ctl(p->ep, EPOLL_CTL_MOD, fd, &ev);
}

static void on_timer(void *ctx, long timeout_ms)
{
    struct proxy *p = ctx;
    p->curl_timer_ns = timeout_ms < 0 ? -1 : proxy_now_ns() + (int64_t)timeout_ms * 1000000;
}

/* ---- setting up ------------------------------------------------------------------------------ */

/* 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6: the admin library's rule, so that a
 * --admin address passes here exactly when it would pass there. */
static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return sa->sa_family == AF_INET6 &&
           (IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127));
}

/* `host` and `port` resolved into *ai: a numeric address, and a loopback one unless
 * --allow-remote, since neither server has authentication (`who` says which); else a usage
 * error naming where the address was given: `where`, the config file's "FILE:LINE: key", or
 * else `flag` (--listen, --admin). */
static int bind_address(const struct options *o, const char *flag, const char *where,
                        const char *who, const char *host, unsigned port, struct addrinfo **ai)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    char service[8];
    snprintf(service, sizeof service, "%u", port);
    if (getaddrinfo(host, service, &hints, ai) != 0)
        return usage_error("%s: '%s' is not a numeric IPv4 or IPv6 address", where ? where : flag,
                           host);
    if (!is_loopback((*ai)->ai_addr) && !o->allow_remote) {
        freeaddrinfo(*ai);
        return usage_error("%s%s%s is not a loopback address: add --allow-remote (the %s has "
                           "no authentication; put it behind a firewall)",
                           where ? where : flag, where ? ": " : " ", host, who);
    }
    return EXIT_OK;
}

/* The admin's address checked as --listen's is, before the state file opens, so that a mistake
 * names the flag or the config file's line and not the library's sluice_admin_desc fields; the
 * library binds it ("localhost" is its word for 127.0.0.1). */
static int check_admin_address(const struct options *o)
{
    if (!o->admin_host)
        return EXIT_OK;
    struct addrinfo *ai;
    const char *host = strcmp(o->admin_host, "localhost") ? o->admin_host : "127.0.0.1";
    int rc = bind_address(o, "--admin", o->admin_where, "admin endpoint", host, o->admin_port,
                          &ai);
    if (rc == EXIT_OK)
        freeaddrinfo(ai);
    return rc;
}

static int listen_on(struct proxy *p)
{
    const struct options *o = p->o;
    struct addrinfo *ai;
    int rc = bind_address(o, "--listen", o->listen_where, "proxy", o->listen_host,
                          o->listen_port, &ai);
    if (rc != EXIT_OK)
        return rc;
    char port[8];
    snprintf(port, sizeof port, "%u", o->listen_port);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
        int err = errno;
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return fail("cannot listen on %s:%s: %s (%s)", o->listen_host, port, strerror(err),
                    o->listen_where ? o->listen_where : "--listen");
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    p->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    p->listener = (struct watch){.kind = W_LISTEN, .fd = fd};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &p->listener};
    epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev);
    return EXIT_OK;
}

/* A backend's setting that cannot be used: a configuration error, said where it was written
 * (the config file's line and field, or the flag and its value) with why, exit 2. */
__attribute__((format(printf, 6, 7))) static int
backend_refused(const struct options *o, size_t i, const char *field, const char *flag,
                const char *value, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const struct backend *b = &o->backends[i];
    if (b->line)
        fprintf(stderr, PROG ": %s:%d: backends[%zu].%s: %s%s%s\n", o->config, b->line, i, field,
                value ? value : "", value ? ": " : "", why);
    else
        fprintf(stderr, PROG ": %s%s%s: %s\n", flag, value ? " " : "", value ? value : "", why);
    return EXIT_USAGE;
}

static int read_keys(struct options *o)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        if (!b->key_env)
            continue;
        const char *key = getenv(b->key_env);
        if (!key || !*key)
            return backend_refused(o, i, "api_key_env", "--api-key-env", NULL,
                                   "$%s is not set (export it before starting " PROG ")",
                                   b->key_env);
        b->key = strdup(key);
    }
    return EXIT_OK;
}

/* Each backend's ca_file, read once at start: a path that does not open, or holds no PEM
 * certificate, is a configuration error (not a 502 at the first call); so is one for an
 * http:// upstream, which it would never be used for. */
static int check_ca_files(const struct options *o)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        const struct backend *b = &o->backends[i];
        if (!b->ca_file)
            continue;
        const char *why = strncmp(b->upstream, "https://", 8)
                              ? "is for an https:// upstream, and this one is http://"
                              : tool_ca_file_problem(b->ca_file);
        if (why)
            return backend_refused(o, i, "ca_file", "--upstream-ca", b->ca_file, "%s", why);
    }
    return EXIT_OK;
}

/* Each backend's fleet_floor: only with redis (it is the limit while Redis is unreachable),
 * and at most active (the library's "sluice_fleet_desc.floor is above max_limit" names no
 * flag). */
static int check_fleet_floors(const struct options *o)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        const struct backend *b = &o->backends[i];
        if (!b->fleet_floor)
            continue;
        if (!b->redis_url)
            return backend_refused(o, i, "fleet_floor", "--fleet-floor", NULL,
                                   "needs %s: it is the least served while Redis is unreachable",
                                   b->line ? "redis" : "--redis");
        if (b->fleet_floor > b->active)
            return backend_refused(o, i, "fleet_floor", "--fleet-floor", NULL,
                                   "%u is above %s (%u): a floor cannot be above the most calls "
                                   "in flight",
                                   b->fleet_floor, b->line ? "active" : "--active", b->active);
    }
    return EXIT_OK;
}

#ifdef SLUICE_HAVE_FLEET
/* A backend's fleet lost Redis or got it back: one line each time, naming the server (its
 * password as ***), why, and what the backend serves meanwhile. */
static void say_fleet_event(struct proxy *p, size_t i, const struct sluice_event *ev)
{
    char shown[512], why[256] = "";
    url_shown(p->o->backends[i].redis_url, shown, sizeof shown);
    if (ev->kind == SLUICE_EVENT_RESTORE) {
        fprintf(stderr, PROG ": backend %s: redis %s: connected again; the fleet's limit "
                        "applies\n",
                ev->node, shown);
        return;
    }
    struct sluice_fleet_status st;
    sluice_fleet_snapshot(p->fleets[i], &st);
    sluice_fleet_last_error(p->fleets[i], why, sizeof why);
    if (st.shared_limit)
        fprintf(stderr, PROG ": backend %s: redis %s: %s; serving at most %u calls at once "
                        "(its share of the fleet's last limit %u over %u processes) until "
                        "Redis answers\n",
                ev->node, shown, why, ev->new_limit, st.shared_limit, st.processes);
    else
        fprintf(stderr, PROG ": backend %s: redis %s: %s; serving at most %u call%s at once "
                        "(the fleet's floor: with no word from Redis yet, this process cannot "
                        "know its share of the cap) until Redis answers\n",
                ev->node, shown, why, ev->new_limit, ev->new_limit == 1 ? "" : "s");
}
#endif

/* A state file or a Redis fleet that fails never stops the proxy (the node serves from memory,
 * or at its share of the fleet), but the operator must hear why: the event carries the cause,
 * the file or the fleet its words. */
static void on_store_event(void *ctx, const struct sluice_event *ev)
{
    struct proxy *p = ctx;
#ifdef SLUICE_HAVE_FLEET
    for (size_t i = 0; i < p->o->n_backends; i++)
        if (p->fleets[i] && !strcmp(p->o->backends[i].id, ev->node)) {
            /* Its pool's store is the fleet's: these two are the fleet's outage and return. */
            if ((ev->kind == SLUICE_EVENT_STORE && ev->cause == SLUICE_CAUSE_STORE_ERROR) ||
                (ev->kind == SLUICE_EVENT_RESTORE && ev->cause == SLUICE_CAUSE_STORE))
                say_fleet_event(p, i, ev);
            return;
        }
#endif
    if (ev->kind != SLUICE_EVENT_STORE)
        return; /* the rest: the admin page, /metrics and sluicectl events */
    char why[1024] = "";
    if (p->state && (ev->cause == SLUICE_CAUSE_STORE_CORRUPT || ev->cause == SLUICE_CAUSE_STORE_ERROR))
        sluice_statefile_last_error(p->state, why, sizeof why);
    fprintf(stderr, PROG ": backend %s: state file: %s%s%s\n", ev->node,
            sluice_cause_name(ev->cause), *why ? ": " : "", why);
}

/* The engine refused its description. A check of a backend's own field ("backends[i].id is
 * 300 bytes ...": the ID rules live in the engine, not in options.c) is the user's error, said
 * where they wrote it: the config file's line, or --node and the flags; the rest cannot start. */
static int engine_refused(const struct options *o, const char *err)
{
    size_t i;
    int at = 0;
    if (sscanf(err, "backends[%zu].%n", &i, &at) != 1 || !at || i >= o->n_backends)
        return fail("%s", err);
    if (o->backends[i].line) {
        fprintf(stderr, PROG ": %s:%d: %s\n", o->config, o->backends[i].line, err);
        return EXIT_USAGE;
    }
    static const char *const words[][2] = {{"backends[0].id", "--node"},
                                           {" (SLUICE_BACKEND_ID_MAX)", ""},
                                           {"backends[0].active", "--active"},
                                           {"backends[0].waiting", "--waiting"}};
    fail_in_cli_words(err, words, sizeof words / sizeof *words);
    return EXIT_USAGE;
}

static int open_engine(struct proxy *p)
{
    struct options *o = p->o;
    char err[256] = "";
    if (o->state && !*o->state) {
        p->state = NULL;
    } else if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = o->state,
                                                                     .error = err,
                                                                     .error_size = sizeof err},
                                     &p->state) != SLUICE_OK) {
        return fail_state_open("--state", err); /* err names the path */
    }
    struct sluice_store_ops store;
    if (p->state)
        store = sluice_statefile_ops(p->state);
    static struct sluice_backend_desc descs[PROXY_BACKENDS_MAX];
    static struct sluice_discovery_desc dds[PROXY_BACKENDS_MAX];
    for (size_t i = 0; i < o->n_backends; i++) {
        const struct backend *b = &o->backends[i];
        dds[i] = (struct sluice_discovery_desc){.jumpstart = b->jumpstart,
                                                .min_limit = b->min_limit,
                                                .lock_ttl_s = b->lock_ttl_s};
        if (b->redis_url) {
#ifdef SLUICE_HAVE_FLEET
            struct sluice_fleet_desc fd = {.redis_url = b->redis_url, .node_id = b->id,
                                           .jumpstart = b->jumpstart, .min_limit = b->min_limit,
                                           .max_limit = b->active, .lock_ttl_s = b->lock_ttl_s,
                                           .floor = b->fleet_floor,
                                           .error = err, .error_size = sizeof err};
            if (sluice_fleet_create(&fd, &p->fleets[i]) != SLUICE_OK) {
                if (!strstr(err, "sluice_fleet_desc.redis_url"))
                    return fail("backend %s: redis: %s", b->id, err);
                /* A configuration error, named where the user wrote it (options.c checks
                 * --redis the same way), not by the library's C field. */
                char where[640] = "--redis";
                if (b->line)
                    snprintf(where, sizeof where, "%s:%d: backends[%zu].redis", o->config,
                             b->line, i);
                const char *const words[][2] = {{"sluice_fleet_desc.redis_url", where}};
                fail_in_cli_words(err, words, 1);
                return EXIT_USAGE;
            }
            sluice_fleet_discovery(p->fleets[i], &dds[i]);
            dds[i].node_id = NULL; /* the engine names the node after the backend */
#else
            return fail("backend %s: redis needs a build with hiredis", b->id);
#endif
        }
        descs[i] = (struct sluice_backend_desc){.id = b->id, .endpoint = b->upstream,
                                                .active = b->active, .waiting = b->waiting,
                                                .discovery = b->discovery || b->redis_url
                                                                 ? &dds[i]
                                                                 : NULL,
                                                .deadlines = b->deadlines};
    }
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = descs,
                                                          .n_backends = o->n_backends,
                                                          .store = p->state ? &store : NULL,
                                                          .on_event = on_store_event,
                                                          .on_event_ctx = p,
                                                          .omit_openrouter = true,
                                                          .error = err, .error_size = sizeof err},
                             &p->engine) != SLUICE_OK)
        return engine_refused(o, err);
#ifdef SLUICE_HAVE_FLEET
    for (size_t i = 0; i < o->n_backends; i++)
        if (p->fleets[i] &&
            sluice_fleet_attach(p->fleets[i], sluice_engine_pool(p->engine, o->backends[i].id)) !=
                SLUICE_OK)
            return fail("backend %s: the fleet agent did not start", o->backends[i].id);
#endif
    return EXIT_OK;
}

/* The start deadline of `node`'s requests that name none, for the admin page (an admin
 * thread): the backend's start_deadline_ms, else the clients' learned patience where no
 * deadline_ms applies either (upstream.c decides the same per request). */
static int64_t shown_start_deadline(void *ctx, const char *node, const char **source)
{
    const struct proxy *p = ctx;
    for (size_t i = 0; i < p->o->n_backends; i++) {
        const struct backend *b = &p->o->backends[i];
        if (strcmp(b->id, node))
            continue;
        if (b->start_deadline_ms) {
            *source = "configured";
            return b->start_deadline_ms;
        }
        *source = "learned";
        return b->deadline_ms ? -1 : patience_shown_ms(&p->patience[i], proxy_now_ns());
    }
    return -1;
}

/* The proxy's own families for /metrics, after the engine's (an admin thread). */
static char *proxy_metrics(void *ctx)
{
    struct proxy_counts *k = &((struct proxy *)ctx)->counts;
    static const char *const reasons[REFUSED_REASONS] = {"max_connections", "descriptors"};
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f)
        return NULL;
    fprintf(f,
            "# HELP sluice_proxy_client_connections Client connections open (those "
            "--max-connections counts).\n# TYPE sluice_proxy_client_connections gauge\n"
            "sluice_proxy_client_connections %u\n"
            "# HELP sluice_proxy_connections_refused_total Clients refused as they connected "
            "(503; a reset in a flood past the closing ones): past --max-connections, or with "
            "no file descriptor left.\n"
            "# TYPE sluice_proxy_connections_refused_total counter\n",
            atomic_load_explicit(&k->connections, memory_order_relaxed));
    for (int r = 0; r < REFUSED_REASONS; r++)
        fprintf(f, "sluice_proxy_connections_refused_total{reason=\"%s\"} %" PRIu64 "\n",
                reasons[r], atomic_load_explicit(&k->refused[r], memory_order_relaxed));
    fputs("# HELP sluice_proxy_answers_total Answers to clients by HTTP status (the access "
          "log's lines), the proxy's own included.\n"
          "# TYPE sluice_proxy_answers_total counter\n",
          f);
    for (int status = 100; status < 600; status++) {
        uint64_t n = atomic_load_explicit(&k->answers[status], memory_order_relaxed);
        if (n)
            fprintf(f, "sluice_proxy_answers_total{code=\"%d\"} %" PRIu64 "\n", status, n);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

static int start_admin(struct proxy *p)
{
    const struct options *o = p->o;
    if (!o->admin_host)
        return EXIT_OK;
    char err[256] = "";
    struct sluice_admin_desc desc = {.engine = p->engine, .address = o->admin_host,
                                     .port = SLUICE_SOME(o->admin_port),
                                     .allow_remote = o->allow_remote,
                                     .start_deadline = shown_start_deadline,
                                     .start_deadline_ctx = p, .metrics = proxy_metrics,
                                     .metrics_ctx = p, .statefile = p->state,
                                     .error = err, .error_size = sizeof err};
    if (sluice_admin_start(&desc, &p->admin) == SLUICE_OK)
        return EXIT_OK;
    /* The library's advice is a C caller's ("change sluice_admin_desc.port"): this one's
     * fix is the flag. */
    char *advice = strstr(err, " (change sluice_admin_desc");
    if (advice)
        *advice = '\0';
    if (o->admin_explicit && o->admin_where)
        return fail("admin endpoint on %s:%u: %s (%s: write another \"HOST:PORT\", port 0 for "
                    "any free one, or \"off\")",
                    o->admin_host, o->admin_port, err, o->admin_where);
    if (o->admin_explicit)
        return fail("admin endpoint on %s:%u: %s (pass another --admin HOST:PORT, port 0 for "
                    "any free one, or --admin off)",
                    o->admin_host, o->admin_port, err);
    desc.port = SLUICE_SOME(0); /* the default port is taken: any free one, printed below */
    if (sluice_admin_start(&desc, &p->admin) != SLUICE_OK)
        return fail("admin endpoint: %s (--admin off runs without it)", err);
    return EXIT_OK;
}

/* One of the URLs stdout promises; an IPv6 address in brackets, as a URL needs it. */
static void print_url(const char *host, unsigned port)
{
    bool v6 = strchr(host, ':') != NULL;
    printf("http://%s%s%s:%u\n", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

static int start_proxy(struct proxy *p)
{
    const struct options *o = p->o;
    int rc;
    http_prepare_descriptors(p);
    if ((rc = listen_on(p)) != EXIT_OK || (rc = check_admin_address(o)) != EXIT_OK ||
        (rc = read_keys(p->o)) != EXIT_OK || (rc = check_ca_files(p->o)) != EXIT_OK ||
        (rc = check_fleet_floors(p->o)) != EXIT_OK ||
        (rc = open_engine(p)) != EXIT_OK || (rc = start_admin(p)) != EXIT_OK)
        return rc;
    char err[256] = "";
    p->curl_timer_ns = -1;
    /* libcurl's connection caps at one transfer per client connection, which it never
     * reaches, so it never queues a request: not a read (upstream.c, only_reads: no permit)
     * behind a generation's connection, nor a generation holding its permit behind a read's.
     * The loop's default, the backends' permits plus the reads running, would do the same;
     * this one is the bound the proxy already sets on itself. */
    if (sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = p->engine,
                                                                .max_requests = o->max_connections,
                                                                .max_host_connections =
                                                                    o->max_connections,
                                                                .max_total_connections =
                                                                    o->max_connections,
                                                                .watch = on_watch,
                                                                .timer = on_timer, .ctx = p,
                                                                .error = err,
                                                                .error_size = sizeof err},
                                &p->loop) != SLUICE_OK)
        return fail("curl loop: %s", err);
    if (!strcmp(o->access_log, "-"))
        p->log = stderr;
    else if (strcmp(o->access_log, "off") && !(p->log = fopen(o->access_log, "a")))
        return fail("--access-log %s: %s", o->access_log, strerror(errno));
    if (p->log)
        setvbuf(p->log, NULL, _IOFBF, 1 << 16);
    print_url(o->listen_host, p->port);
    if (p->admin)
        print_url(o->admin_host, sluice_admin_port(p->admin));
    fflush(stdout);
    for (size_t i = 0; i < o->n_backends; i++) {
        const struct backend *b = &o->backends[i];
        char shown[1024];
        fprintf(stderr, PROG ": backend %s -> %s (%s%s%s)\n", b->id,
                url_shown(b->upstream, shown, sizeof shown),
                b->header ? "header " : b->n_models ? "model " : "prefix ",
                b->header ? b->header : b->n_models ? b->models[0] : b->prefix,
                b->is_default ? ", default" : "");
    }
    return EXIT_OK;
}

/* ---- the loop -------------------------------------------------------------------------------- */

static int start_signals(struct proxy *p)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0)
        return fail("signalfd: %s", strerror(errno));
    p->signals = (struct watch){.kind = W_SIGNAL, .fd = fd};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &p->signals};
    epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev);
    return EXIT_OK;
}

static int wait_ms(const struct proxy *p, int64_t now, int64_t next_sweep)
{
    int64_t until = next_sweep;
    if (p->curl_timer_ns >= 0 && p->curl_timer_ns < until)
        until = p->curl_timer_ns;
    if (p->draining && p->drain_deadline_ns < until)
        until = p->drain_deadline_ns;
    int64_t ms = (until - now + 999999) / 1000000;
    return ms < 0 ? 0 : (int)ms;
}

static void free_dead(struct proxy *p)
{
    while (p->dead) {
        struct conn *c = p->dead;
        p->dead = c->next_dirty;
        conn_free(c);
    }
    while (p->dead_watches) {
        struct watch *w = p->dead_watches;
        p->dead_watches = w->next_dead;
        free(w);
    }
}

static void on_ready(struct proxy *p, struct watch *w, uint32_t events)
{
    switch (w->kind) {
    case W_LISTEN:
        http_accept(p);
        break;
    case W_CLIENT:
        http_on_event((struct conn *)w, events);
        break;
    case W_CURL:
        if (w->fd >= 0)
            sluice_curl_loop_action(p->loop, w->fd,
                                    (events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                                        (events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                                        (events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0));
        break;
    case W_SIGNAL: {
        struct signalfd_siginfo si;
        while (read(w->fd, &si, sizeof si) == sizeof si) {
            if (p->draining) { /* a second signal: the operator will not wait for the drain */
                fprintf(stderr, PROG ": second signal: stopping now (%u connections cut)\n",
                        p->n_conns);
                p->drain_deadline_ns = proxy_now_ns(); /* run() returns; stop() cuts the rest */
                continue;
            }
            fprintf(stderr, PROG ": draining (%u connections, up to %u ms; a second signal "
                            "stops at once)\n",
                    p->n_conns, p->o->drain_ms);
            p->drain_deadline_ns = proxy_now_ns() + (int64_t)p->o->drain_ms * 1000000;
            http_drain(p);
        }
        break;
    }
    }
}

static void run(struct proxy *p)
{
    struct epoll_event evs[EVENTS_MAX];
    int64_t next_sweep = proxy_now_ns() + SWEEP_MS * 1000000LL, next_log = 0;
    for (;;) {
        int64_t now = proxy_now_ns();
        if (p->draining && (p->n_conns == 0 || now >= p->drain_deadline_ns))
            return;
        int n = epoll_wait(p->ep, evs, EVENTS_MAX, wait_ms(p, now, next_sweep));
        for (int i = 0; i < n; i++)
            on_ready(p, evs[i].data.ptr, evs[i].events);
        now = proxy_now_ns();
        if (p->kick || (p->curl_timer_ns >= 0 && now >= p->curl_timer_ns)) {
            p->kick = false;
            p->curl_timer_ns = -1;
            sluice_curl_loop_action(p->loop, CURL_SOCKET_TIMEOUT, 0);
        }
        http_flush_dirty(p);
        if (now >= next_sweep) {
            /* Lingering permits and holds come due without traffic too: on an idle proxy
             * nothing else releases them (7 stayed in flight for minutes after a burst). */
            sluice_engine_poll(p->engine);
            http_sweep(p, now);
            upstream_sweep_read_on(p, now);
            http_flush_dirty(p);
            next_sweep = now + SWEEP_MS * 1000000LL;
        }
        if (p->log && (n == 0 || now >= next_log)) {
            fflush(p->log);
            next_log = now + LOG_FLUSH_MS * 1000000LL;
        }
        free_dead(p);
    }
}

static void stop(struct proxy *p)
{
    if (p->loop) {
        /* What did not finish within the drain: aborted, each completion answers or cuts. */
        sluice_curl_loop_close(p->loop);
        http_flush_dirty(p);
        http_close_all(p);
        free_dead(p);
        sluice_curl_loop_destroy(p->loop);
        free_dead(p);
        upstream_free_spares(p);
    }
    sluice_admin_stop(p->admin);
#ifdef SLUICE_HAVE_FLEET
    for (size_t i = 0; i < p->o->n_backends; i++)
        sluice_fleet_destroy(p->fleets[i]);
#endif
    if (p->engine) {
        sluice_engine_close(p->engine);
        sluice_engine_destroy(p->engine);
    }
    sluice_statefile_close(p->state);
    if (p->log)
        fflush(p->log);
    if (p->log && p->log != stderr)
        fclose(p->log);
    if (p->listener.fd >= 0)
        close(p->listener.fd);
}

int main(int argc, char **argv)
{
    tool_name = PROG;
    static struct options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != EXIT_OK)
        return rc;
    routes_prepare(&o);
    /* Before any thread starts, so that every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    static struct proxy proxy;
    struct proxy *p = &proxy;
    p->o = &o;
    p->listener.fd = p->signals.fd = -1;
    if ((p->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        rc = fail("epoll_create1: %s", strerror(errno));
    if (rc == EXIT_OK)
        rc = start_signals(p);
    if (rc == EXIT_OK)
        rc = start_proxy(p);
    if (rc == EXIT_OK)
        run(p);
    stop(p);
    options_free(&o);
    curl_global_cleanup();
    return rc;
}
