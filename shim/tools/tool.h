/*
 * tool.h — what the sluice command-line tools share: the exit codes (0 ok,
 * 1 failure, 2 usage, as git and redis-cli use them), one-line messages to
 * stderr that start with the tool's name, and the flag that Ctrl-C or
 * SIGTERM sets so a long command stops with what it has.
 *
 * Each tool is one program: these are static, and `tool_name` is the tool's
 * own (a tool with subcommands points it at "sluicectl clear" and so on).
 */
#ifndef SLUICE_TOOL_H
#define SLUICE_TOOL_H

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static const char *tool_name;
static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* "NAME: message" on stderr; returns EXIT_FAIL. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", tool_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_FAIL;
}

/* "NAME: message (see NAME --help)" on stderr; returns EXIT_USAGE. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", tool_name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s --help)\n", tool_name);
    va_end(ap);
    return EXIT_USAGE;
}

#endif /* SLUICE_TOOL_H */
