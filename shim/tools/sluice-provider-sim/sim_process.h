/*
 * sim_process.h — start and stop the HTTP provider simulator
 * (shim/tools/sluice-provider-sim) from a test, the bench or sluice-demo.
 *
 *   static struct sim_process sim;
 *   static void stop_sim(void) { sim_process_stop(&sim); }
 *   TestSuite(mine, .fini = stop_sim, .timeout = 20);
 *
 *   Test(mine, something) {
 *       const char *args[] = {"--mode", "reject", "--cap", "4", NULL};
 *       cr_assert_eq(sim_process_start(&sim, args), 0);
 *       char url[64];
 *       sim_process_url(&sim, "/v1/chat/completions", url, sizeof url);
 *       ...
 *   }
 *
 * sim_process_start runs the binary SLUICE_PROVIDER_SIM_PATH (a compile
 * definition tests/CMakeLists.txt gives every e2e test) with
 * `--port 0 --quiet` followed by `args`, reads the port it prints as the
 * first line of its stdout, and returns once 127.0.0.1:port accepts a TCP
 * connection. Set SLUICE_SIM_VERBOSE=1 in the environment to drop --quiet
 * and see its per-second lines on the test's stderr. Every step is bounded
 * (SIM_PROCESS_START_MS); on failure it prints why, stops the process and
 * returns -1.
 *
 * The simulator is never left running:
 *   - sim_process_stop sends SIGTERM, waits up to SIM_PROCESS_STOP_MS for a
 *     clean exit, then sends SIGKILL; it returns the wait status, so a test
 *     can assert WIFEXITED(status) && WEXITSTATUS(status) == 0 (a clean stop);
 *     stopping a stopped (or never started) process is a no-op returning its
 *     last status. Call it from the suite's .fini, which Criterion runs even
 *     when an assertion fails.
 *   - an atexit handler kills whatever is still running when the test
 *     process exits;
 *   - on Linux the child asks for SIGKILL when the test process dies
 *     (PR_SET_PDEATHSIG), which covers a crash or a Criterion timeout kill.
 *
 * sim_process_run runs the simulator to completion with exactly `args`
 * (no --port/--quiet added), capturing stdout and stderr, for tests of the
 * command line (--help, bad flags).
 *
 * Threads: call these from one thread, the one that lives as long as the
 * simulators it starts (the test's own): PR_SET_PDEATHSIG fires when the
 * thread that forked exits. Everything is static inline; each test file
 * gets its own copy and its own list of live pids (at most
 * SIM_PROCESS_MAX_LIVE at once are covered by the atexit handler).
 */
#ifndef SLUICE_TOOLS_SIM_PROCESS_H
#define SLUICE_TOOLS_SIM_PROCESS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#ifndef SLUICE_PROVIDER_SIM_PATH
#error "SLUICE_PROVIDER_SIM_PATH must name the sluice-provider-sim binary (tests/CMakeLists.txt sets it)"
#endif

#define SIM_PROCESS_START_MS 10000 /* port line + first accepted connection */
#define SIM_PROCESS_STOP_MS 5000   /* SIGTERM to exit, before SIGKILL */
#define SIM_PROCESS_RUN_MS 10000   /* sim_process_run, before SIGKILL */
#define SIM_PROCESS_MAX_ARGS 60
#define SIM_PROCESS_MAX_LIVE 16

struct sim_process {
    pid_t pid;  /* 0 when not running */
    int port;   /* the port it listens on (127.0.0.1) */
    int out_fd; /* read end of its stdout, kept open while it runs; -1 = none */
    int status; /* wait status once stopped */
};

static pid_t sim__live[SIM_PROCESS_MAX_LIVE];

static inline int64_t sim__ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void sim__sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline void sim__reap_all(void)
{
    for (int i = 0; i < SIM_PROCESS_MAX_LIVE; i++)
        if (sim__live[i] > 0) {
            kill(sim__live[i], SIGKILL);
            waitpid(sim__live[i], NULL, 0);
            sim__live[i] = 0;
        }
}

static inline void sim__track(pid_t pid, pid_t untrack)
{
    static bool registered;
    if (!registered) {
        atexit(sim__reap_all);
        registered = true;
    }
    for (int i = 0; i < SIM_PROCESS_MAX_LIVE; i++)
        if (sim__live[i] == untrack) {
            sim__live[i] = pid;
            return;
        }
}

/* fork + exec the simulator with argv; its stdout and stderr go to out_w
 * and err_w when >= 0. Returns the pid, or -1. */
static inline pid_t sim__spawn(char *const argv[], int out_w, int err_w)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* The child: async-signal-safe calls only (the test may have threads). */
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
#else
    (void)parent;
#endif
    if ((out_w >= 0 && dup2(out_w, STDOUT_FILENO) < 0) || (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0))
        _exit(127);
    execv(SLUICE_PROVIDER_SIM_PATH, argv);
    _exit(127);
}

/* argv = path, prefix..., args..., NULL. Returns false if too many. */
static inline bool sim__argv(char *argv[], const char *const prefix[], const char *const args[])
{
    int n = 0;
    argv[n++] = (char *)SLUICE_PROVIDER_SIM_PATH;
    for (int k = 0; k < 2; k++)
        for (const char *const *a = k ? args : prefix; a && *a; a++) {
            if (n == SIM_PROCESS_MAX_ARGS)
                return false;
            argv[n++] = (char *)*a;
        }
    argv[n] = NULL;
    return true;
}

/* Read one line from fd into buf before the deadline; false on EOF/timeout. */
static inline bool sim__read_line(int fd, char *buf, size_t n, int64_t deadline_ms)
{
    size_t len = 0;
    while (len + 1 < n) {
        int64_t left = deadline_ms - sim__ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)left) == 0)
            return false;
        ssize_t got = read(fd, buf + len, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        if (buf[len] == '\n')
            break;
        len++;
    }
    buf[len] = '\0';
    return true;
}

/* A pipe whose ends close on exec (the child dup2s the one it needs). */
static inline bool sim__pipe(int fds[2])
{
    if (pipe(fds) != 0)
        return false;
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    return true;
}

static inline bool sim__accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Reap pid if it exits before deadline_ms; false if it is still running. */
static inline bool sim__wait(pid_t pid, int64_t deadline_ms, int *status)
{
    for (;;) {
        pid_t got = waitpid(pid, status, WNOHANG);
        if (got == pid || (got < 0 && errno != EINTR))
            return true;
        if (sim__ms() >= deadline_ms)
            return false;
        sim__sleep_ms(2);
    }
}

/* SIGTERM, up to SIM_PROCESS_STOP_MS for a clean exit, then SIGKILL.
 * Returns the wait status. */
static inline int sim_process_stop(struct sim_process *p)
{
    if (p->pid > 0) {
        pid_t pid = p->pid;
        int status = -1;
        kill(pid, SIGTERM);
        if (!sim__wait(pid, sim__ms() + SIM_PROCESS_STOP_MS, &status)) {
            fprintf(stderr, "sim_process: no exit %d ms after SIGTERM; sending SIGKILL\n",
                    SIM_PROCESS_STOP_MS);
            kill(pid, SIGKILL);
            if (waitpid(pid, &status, 0) != pid)
                status = -1;
        }
        p->status = status;
        p->pid = 0;
        sim__track(0, pid);
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    p->out_fd = -1;
    return p->status;
}

/* Start the simulator with `args` (NULL-terminated; may be NULL); `p` must not
 * be running. 0 on success. */
static inline int sim_process_start(struct sim_process *p, const char *const args[])
{
    memset(p, 0, sizeof *p);
    p->out_fd = -1;
    const char *verbose = getenv("SLUICE_SIM_VERBOSE");
    const char *const prefix[] = {"--port", "0", verbose && *verbose == '1' ? NULL : "--quiet", NULL};
    char *argv[SIM_PROCESS_MAX_ARGS + 1];
    int out[2];
    if (!sim__argv(argv, prefix, args)) {
        fprintf(stderr, "sim_process: more than %d arguments\n", SIM_PROCESS_MAX_ARGS);
        return -1;
    }
    if (!sim__pipe(out)) {
        fprintf(stderr, "sim_process: pipe: %s\n", strerror(errno));
        return -1;
    }
    pid_t pid = sim__spawn(argv, out[1], -1);
    close(out[1]);
    p->out_fd = out[0];
    if (pid < 0) {
        fprintf(stderr, "sim_process: fork: %s\n", strerror(errno));
        sim_process_stop(p);
        return -1;
    }
    p->pid = pid;
    sim__track(pid, 0);
    int64_t deadline = sim__ms() + SIM_PROCESS_START_MS;
    char line[32];
    char *end = NULL;
    long port = sim__read_line(p->out_fd, line, sizeof line, deadline) ? strtol(line, &end, 10) : 0;
    if (!end || *end || port <= 0 || port > 65535) {
        int status = sim_process_stop(p);
        fprintf(stderr, "sim_process: %s printed no port (wait status 0x%x)\n",
                SLUICE_PROVIDER_SIM_PATH, (unsigned)status);
        return -1;
    }
    p->port = (int)port;
    while (!sim__accepts(p->port)) {
        if (sim__ms() >= deadline) {
            fprintf(stderr, "sim_process: nothing accepts on port %d\n", p->port);
            sim_process_stop(p);
            return -1;
        }
        sim__sleep_ms(5);
    }
    return 0;
}

/* "http://127.0.0.1:PORT" + path into buf. */
static inline const char *sim_process_url(const struct sim_process *p, const char *path, char *buf,
                                          size_t n)
{
    snprintf(buf, n, "http://127.0.0.1:%d%s", p->port, path);
    return buf;
}

/*
 * Run the simulator with exactly `args` until it exits (SIGKILL after
 * SIM_PROCESS_RUN_MS), keeping the first bytes of its stdout and stderr as
 * strings in out/err (either may be NULL). Returns the wait status, or -1.
 */
static inline int sim_process_run(const char *const args[], char *out, size_t out_n, char *err,
                                  size_t err_n)
{
    char *argv[SIM_PROCESS_MAX_ARGS + 1];
    int fds[2][2];
    if (!sim__argv(argv, NULL, args) || !sim__pipe(fds[0]))
        return -1;
    if (!sim__pipe(fds[1])) {
        close(fds[0][0]);
        close(fds[0][1]);
        return -1;
    }
    pid_t pid = sim__spawn(argv, fds[0][1], fds[1][1]);
    close(fds[0][1]);
    close(fds[1][1]);
    if (pid > 0)
        sim__track(pid, 0);
    char *buf[2] = {out, err};
    size_t cap[2] = {out_n, err_n}, len[2] = {0, 0};
    struct pollfd p[2] = {{fds[0][0], POLLIN, 0}, {fds[1][0], POLLIN, 0}};
    int64_t deadline = sim__ms() + SIM_PROCESS_RUN_MS;
    while (pid > 0 && (p[0].fd >= 0 || p[1].fd >= 0) && sim__ms() < deadline) {
        if (poll(p, 2, (int)(deadline - sim__ms())) <= 0)
            continue;
        for (int k = 0; k < 2; k++) {
            if (p[k].fd < 0 || !p[k].revents)
                continue;
            char chunk[512];
            ssize_t got = read(p[k].fd, chunk, sizeof chunk);
            if (got <= 0) {
                close(p[k].fd);
                p[k].fd = -1; /* poll ignores negative fds */
                continue;
            }
            for (ssize_t i = 0; i < got && buf[k] && len[k] + 1 < cap[k]; i++)
                buf[k][len[k]++] = chunk[i];
        }
    }
    for (int k = 0; k < 2; k++) {
        if (p[k].fd >= 0)
            close(p[k].fd);
        if (buf[k] && cap[k])
            buf[k][len[k]] = '\0';
    }
    if (pid <= 0)
        return -1;
    struct sim_process proc = {.pid = pid, .out_fd = -1, .status = -1};
    if (sim__wait(pid, deadline, &proc.status)) {
        sim__track(0, pid);
        return proc.status;
    }
    return sim_process_stop(&proc);
}

#endif /* SLUICE_TOOLS_SIM_PROCESS_H */
