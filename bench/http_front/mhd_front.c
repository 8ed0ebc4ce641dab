/*
 * mhd_front.c — libmicrohttpd answering what sluice-proxy-fixed answers,
 * for the HTTP server A/B (bench/http_front_ab.py).
 *
 *   http-front-mhd epoll     one internal thread on epoll (MHD_USE_EPOLL_INTERNAL_THREAD):
 *                            the shape of sluice-proxy's own loop
 *   http-front-mhd thread    a thread per connection (what sluice-provider-sim uses)
 *
 * Listens on 127.0.0.1, a free port; the first line on stdout is its URL
 * (as sluice-proxy's). A request's body is read in full, as the proxy reads
 * it to route, then the fixed chat.completion answer (answer.h) goes out;
 * no Date header, since the proxy's fixed answer has none. Runs until
 * SIGTERM or SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "answer.h"

static struct MHD_Response *answer;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state)
{
    static int seen; /* any non-NULL marker: the head is in, the body comes next */
    (void)cls, (void)url, (void)method, (void)version, (void)upload_data;
    if (!*state) {
        *state = &seen;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    return MHD_queue_response(conn, MHD_HTTP_OK, answer);
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "epoll") && strcmp(argv[1], "thread"))) {
        fprintf(stderr, "usage: http-front-mhd epoll|thread\n");
        return 2;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before MHD's threads: they inherit it */
    answer = MHD_create_response_from_buffer(sizeof AB_ANSWER - 1, (void *)AB_ANSWER,
                                             MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(answer, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    unsigned flags = MHD_USE_SUPPRESS_DATE_NO_CLOCK |
                     (!strcmp(argv[1], "epoll") ? MHD_USE_EPOLL_INTERNAL_THREAD
                                                : MHD_USE_THREAD_PER_CONNECTION |
                                                      MHD_USE_INTERNAL_POLLING_THREAD);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_LIMIT, 8192u, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u, MHD_OPTION_THREAD_STACK_SIZE, (size_t)65536,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "http-front-mhd: MHD_start_daemon failed\n");
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("http://127.0.0.1:%u\n", (unsigned)info->port);
    fflush(stdout);
    int sig;
    sigdelset(&set, SIGPIPE);
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    MHD_destroy_response(answer);
    return 0;
}
