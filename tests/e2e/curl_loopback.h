/*
 * curl_loopback.h — the raw side of an HTTP server a test runs in its own
 * process, for answers the simulator does not give: a listening socket on
 * 127.0.0.1 with a free port, reading one request through its body, and a
 * port nothing listens on. Used by tests/e2e/curl_client.c (a capture
 * server), tests/e2e/curl_paths.c (a fixture replay server) and
 * tests/e2e/curl_perform.c (a dead port).
 */
#ifndef SLUICE_TESTS_E2E_CURL_LOOPBACK_H
#define SLUICE_TESTS_E2E_CURL_LOOPBACK_H

#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A socket bound to 127.0.0.1 on a free port (in *port), not listening yet. */
static inline int loopback_bind(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A socket listening on 127.0.0.1 (its port in *port). */
static inline int loopback_listen(int backlog, int *port)
{
    int fd = loopback_bind(port);
    cr_assert_eq(listen(fd, backlog), 0);
    return fd;
}

/* A loopback port nothing listens on: an ephemeral one bound, then closed. */
static inline int loopback_dead_port(void)
{
    int port;
    close(loopback_bind(&port));
    return port;
}

/* One request into buf (NUL-terminated, cut at cap), read through its body (Content-Length),
 * so the answer never races it. */
static inline void loopback_read_request(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    long want = -1;
    while (len + 1 < cap) {
        ssize_t got = recv(fd, buf + len, cap - 1 - len, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && want < 0) {
            char *cl = strcasestr(buf, "Content-Length:");
            want = (long)(end + 4 - buf) + (cl ? strtol(cl + 15, NULL, 10) : 0);
        }
        if (want >= 0 && (long)len >= want)
            break;
    }
    buf[len] = '\0';
}

/* Stop a server thread blocked in accept() on listen_fd: wake it, then wait for it. */
static inline void loopback_stop(int listen_fd, pthread_t thread)
{
    shutdown(listen_fd, SHUT_RDWR);
    close(listen_fd);
    pthread_join(thread, NULL);
}

#endif
