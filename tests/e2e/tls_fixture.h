/*
 * tls_fixture.h — an https:// server behind a private CA for the end-to-end
 * tests: a self-signed certificate for 127.0.0.1 (tls_make_cert, with the
 * openssl command) and `openssl s_server -WWW` serving the files under a
 * directory (tls_server_start: GET /v1/models is the file www/v1/models).
 * What a TLS-inspecting gateway or a lab's own inference server looks like
 * to a client: a certificate no system store trusts.
 *
 * The server is a child process that dies with the test (PR_SET_PDEATHSIG);
 * tls_server_stop ends it sooner. Everything is static: each test file gets
 * its own copy. A test skips (tls_available) where openssl is not installed.
 */
#ifndef SLUICE_TESTS_E2E_TLS_FIXTURE_H
#define SLUICE_TESTS_E2E_TLS_FIXTURE_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice-provider-sim/sim_process.h"

#define TLS_OPENSSL_PATH "/usr/bin/openssl"

static inline bool tls_available(void)
{
    return access(TLS_OPENSSL_PATH, X_OK) == 0;
}

/* In `dir`: cert.pem and key.pem (self-signed, for 127.0.0.1) and www/v1/models, a model
 * list. */
static inline void tls_make_cert(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/www/v1' && printf '{\"object\":\"list\",\"data\":[]}' > "
             "'%s/www/v1/models' && " TLS_OPENSSL_PATH " req -x509 -newkey ec -pkeyopt "
             "ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=127.0.0.1 -addext "
             "subjectAltName=IP:127.0.0.1 -keyout '%s/key.pem' -out '%s/cert.pem' 2>/dev/null",
             dir, dir, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* openssl s_server on 127.0.0.1:port with dir's certificate, serving dir/www; its pid, once it
 * accepts. */
static inline pid_t tls_server_start(const char *dir, int port)
{
    char accept[32], cert[256], key[256], www[256];
    snprintf(accept, sizeof accept, "127.0.0.1:%d", port);
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    snprintf(www, sizeof www, "%s/www", dir);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* async-signal-safe calls only */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || chdir(www) != 0 || dup2(null, STDOUT_FILENO) < 0 ||
            dup2(null, STDERR_FILENO) < 0)
            _exit(127);
        execl(TLS_OPENSSL_PATH, "openssl", "s_server", "-accept", accept, "-cert", cert, "-key",
              key, "-WWW", "-quiet", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && !sim__accepts(port); i++)
        sim__sleep_ms(10);
    cr_assert(sim__accepts(port), "openssl s_server did not listen on %d", port);
    return pid;
}

static inline void tls_server_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

#endif /* SLUICE_TESTS_E2E_TLS_FIXTURE_H */
