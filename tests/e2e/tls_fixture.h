/*
 * tls_fixture.h — an https:// server behind a private CA for the end-to-end
 * tests: a self-signed certificate for 127.0.0.1 (tls_make_cert, with the
 * openssl command) and `openssl s_server -WWW` serving the files under a
 * directory (tls_server_start: GET /v1/models is the file www/v1/models), or
 * nginx speaking HTTP/2 over that certificate in front of a backend
 * (tls_h2_start), as a hosted provider's front does. What a TLS-inspecting
 * gateway or a lab's own inference server looks like to a client: a
 * certificate no system store trusts.
 *
 * The server is a child process that dies with the test (PR_SET_PDEATHSIG);
 * tls_server_stop ends it sooner. Everything is static: each test file gets
 * its own copy. A test skips (tls_available, tls_h2_available) where openssl, or
 * nginx (a bench package the test preset installs), is not installed.
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

/* Start argv (argv[0] a path) in `cwd` (NULL: here), its output dropped; its pid, once it
 * accepts on 127.0.0.1:port. */
static inline pid_t tls__spawn(const char *const *argv, const char *cwd, int port)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* async-signal-safe calls only */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || (cwd && chdir(cwd) != 0) || dup2(null, STDOUT_FILENO) < 0 ||
            dup2(null, STDERR_FILENO) < 0)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 500 && !sim__accepts(port); i++)
        sim__sleep_ms(10);
    cr_assert(sim__accepts(port), "%s did not listen on %d", argv[0], port);
    return pid;
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
    const char *argv[] = {TLS_OPENSSL_PATH, "s_server", "-accept", accept, "-cert", cert,
                          "-key", key, "-WWW", "-quiet", NULL};
    return tls__spawn(argv, www, port);
}

#define TLS_NGINX_PATH "/usr/sbin/nginx"

static inline bool tls_h2_available(void)
{
    return tls_available() && access(TLS_NGINX_PATH, X_OK) == 0;
}

/* nginx on 127.0.0.1:port, TLS with dir's certificate and HTTP/2 offered (ALPN), passing
 * everything to http://127.0.0.1:backend unbuffered; one process (no master), its pid, once it
 * accepts. Its files stay in dir. */
static inline pid_t tls_h2_start(const char *dir, int port, int backend)
{
    char conf[256], text[2048];
    snprintf(conf, sizeof conf, "%s/nginx.conf", dir);
    snprintf(text, sizeof text,
             "daemon off; master_process off; worker_processes 1; pid %s/nginx.pid;\n"
             "error_log %s/nginx.err;\nevents { worker_connections 512; }\n"
             "http { access_log off; client_body_temp_path %s/t1; proxy_temp_path %s/t2;\n"
             "  fastcgi_temp_path %s/t3; uwsgi_temp_path %s/t4; scgi_temp_path %s/t5;\n"
             "  server { listen 127.0.0.1:%d ssl http2;\n"
             "    ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;\n"
             "    location / { proxy_pass http://127.0.0.1:%d; proxy_buffering off;\n"
             "                 proxy_http_version 1.1; } } }\n",
             dir, dir, dir, dir, dir, dir, dir, port, dir, dir, backend);
    FILE *f = fopen(conf, "w");
    cr_assert_not_null(f, "%s", conf);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    char err[256];
    snprintf(err, sizeof err, "%s/nginx.err", dir);
    const char *argv[] = {TLS_NGINX_PATH, "-p", dir, "-e", err, "-c", conf, NULL};
    return tls__spawn(argv, NULL, port);
}

static inline void tls_server_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

#endif /* SLUICE_TESTS_E2E_TLS_FIXTURE_H */
