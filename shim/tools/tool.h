/*
 * tool.h — what the sluice command-line tools share (tool.c, linked into each
 * of them): the exit codes (0 ok, 1 failure, 2 usage, as git and redis-cli
 * use them), one-line messages to stderr that start with the tool's name, the
 * flag that Ctrl-C or SIGTERM sets so a long command stops with what it has,
 * the one way the tools read a number or a flag's value from the command
 * line, the limit on open descriptors raised for a server's connections, a
 * libcurl write callback that discards, the check of a CA file given for
 * an https:// URL, and the legend under a list of discovery events.
 *
 * `tool_name` is the running tool's own name; a tool with subcommands points
 * it at "sluicectl clear" and so on. Threads: main sets tool_name before it
 * starts any other thread; after that every function here may run on any
 * thread (tool_discard runs on whichever thread performs the transfer), and
 * `interrupted` is set by the signal handler and read by any thread.
 */
#ifndef SLUICE_TOOL_H
#define SLUICE_TOOL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sluice/events.h>

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

/* A library's message as one line with its C names swapped for what the tool's user typed:
 * each words[k][0] in msg becomes words[k][1]. Returns EXIT_FAIL. */
int fail_in_cli_words(const char *msg, const char *const (*words)[2], size_t n_words);

/* sluice_statefile_open's message `err` as "PREFIX: err" in the words of a user of --state
 * (the library's name the C field). Returns EXIT_FAIL. */
int fail_state_open(const char *prefix, const char *err);

/* Raise the soft limit on open descriptors toward `want`, never past the hard limit and never
 * lower; returns the soft limit in force after (0 when it cannot be read). */
unsigned long tool_raise_fd_limit(unsigned long want);

/* What is wrong with `path` as a CA file for libcurl (CURLOPT_CAINFO, curl --cacert): NULL
 * when it opens and holds a PEM certificate, else why not (the OS's words, or that it holds
 * none), a static string. Read at start, so that a wrong path is named there, not as a TLS
 * failure at the first call. */
const char *tool_ca_file_problem(const char *path);

/* A libcurl write callback that keeps nothing (an answer only its status matters for). */
size_t tool_discard(char *ptr, size_t size, size_t n, void *ctx);

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

/*
 * A flag with a value at argv[*i]: "--flag V" (then *i moves past V) or
 * "--flag=V". The value, or NULL when argv[*i] is not that flag or V is missing.
 */
const char *tool_flag_value(int argc, char **argv, int *i, const char *flag);

/* The column a cause's name takes: the widest (invalid_record) and a gap. */
#define TOOL_CAUSE_COLUMN 16

/*
 * Under a list of events: each cause they name (but "none"), once, in the order they first
 * name it, with what it means (sluice_cause_text), wrapped to `columns`. Nothing when they
 * name none. Lines start with `indent`.
 */
void tool_print_causes(const struct sluice_event *events, size_t n, const char *indent,
                       int columns);

#endif /* SLUICE_TOOL_H */
