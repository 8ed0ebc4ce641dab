/*
 * tool.h — what the sluice command-line tools share (tool.c, linked into each
 * of them): the exit codes (0 ok, 1 failure, 2 usage, as git and redis-cli
 * use them), one-line messages to stderr that start with the tool's name, the
 * flag that Ctrl-C or SIGTERM sets so a long command stops with what it has,
 * and the one way the tools read a number from the command line.
 *
 * `tool_name` is the running tool's own name; a tool with subcommands points
 * it at "sluicectl clear" and so on. Everything here runs on the main thread
 * except `interrupted`, which the signal handler sets and any thread reads.
 */
#ifndef SLUICE_TOOL_H
#define SLUICE_TOOL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* The prefix of every message (default: NULL; each tool's main sets it first). */
extern const char *tool_name;
/* Set by on_interrupt; a long command polls it and stops with what it has. */
extern volatile sig_atomic_t interrupted;

/* A signal handler (SIGINT, SIGTERM) that only sets `interrupted`. */
void on_interrupt(int sig);

/* "NAME: message" on stderr; returns EXIT_FAIL. */
int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "NAME: message (see NAME --help)" on stderr; returns EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The whole of `s` as a whole number from 0 to `max`: decimal digits only
 * (no sign, no space, no trailing text). false leaves *out untouched.
 */
bool tool_parse_u64(const char *s, uint64_t max, uint64_t *out);

/*
 * The whole of `s` as a finite number in [lo, hi] (strtod's syntax: "1.5",
 * "2e3"; no trailing text). false leaves *out untouched.
 */
bool tool_parse_double(const char *s, double lo, double hi, double *out);

#endif /* SLUICE_TOOL_H */
