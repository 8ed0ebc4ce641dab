/*
 * sluicectl.h — what sluicectl's subcommands share, as redis-cli's
 * cli_common.h: the parsed options (options.c), the output helpers
 * (output.c: terminal-safe text, tables, JSON) and the two places figures
 * come from (source.c: the admin endpoint over HTTP, the state file).
 *
 * One file per subcommand, as git's builtin/<cmd>.c: status.c, clear.c,
 * events.c, probe.c; main.c holds the command table. A subcommand exports its
 * help text (usage_<cmd>) and its entry point (<cmd>_cmd), which gets the
 * parsed options and returns the exit status (tool.h). Everything runs on the
 * main thread, except probe's workers (probe.c).
 */
#ifndef SLUICE_SLUICECTL_H
#define SLUICE_SLUICECTL_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

#include "tool.h"

/* ---- options (options.c) ---- */

/* Option groups: a subcommand names the groups it accepts. */
enum {
    OPT_JSON = 1 << 0,
    OPT_STATE = 1 << 1,
    OPT_ADMIN = 1 << 2,
    OPT_FOLLOW = 1 << 3,
    OPT_PROBE = 1 << 4, /* requests, concurrency-max, header, body, method, timeouts, save */
    OPT_REDIS = 1 << 5,
    OPT_HUMAN = 1 << 6, /* --human: a person's format even when stdout is not a terminal */
};

#define MAX_HEADERS 64

/* The parsed command line; pointers point into argv. */
struct opts {
    bool json, human, follow, help;
    const char *state, *admin, *redis;
    const char *pos[4];
    int n_pos;
    long requests, concurrency_max;     /* (default: 2000, 128) */
    double timeout_s, request_timeout_s; /* (default: 300, 30) */
    const char *headers[MAX_HEADERS];
    int n_headers;
    const char *body_file, *method, *save, *cacert;
};

/*
 * Parse argv[first..] into *o, accepting the flags of the `allowed` groups
 * and at most max_pos positional arguments. 0, or EXIT_USAGE after printing
 * why (naming the flag).
 */
int parse_opts(int argc, char **argv, int first, unsigned allowed, int max_pos, struct opts *o);

/* ---- output (output.c) ---- */

/*
 * Text from a state file or an endpoint, made safe to print (malloc'd, NULL
 * when out of memory): control characters become \u00XX, bytes that are not
 * UTF-8 \xXX. Newlines stay where keep_newlines.
 */
char *text_clean(const char *s, bool keep_newlines);
/* fputs(text_clean(s)). */
void put_clean(const char *s, bool keep_newlines, FILE *to);
/* An endpoint's {"error", "fix"} as one clean line; returns EXIT_FAIL. */
int fail_answer(const char *err, const char *fix);
/* s on stdout, padded with spaces to `width` terminal columns (one space past a wider s). */
void print_cell(const char *s, int width);
/* A lock's time left ("3h 07m", "expired"), and a local date ("-" for none). */
void format_left(int64_t s, char *buf, size_t size);
void format_time(int64_t epoch_s, char *buf, size_t size);
/* j as indented JSON on stdout, made terminal-safe. */
void print_json(json_t *j);

/* A table: rows of `cols` cells, printed with columns padded to their widest cell. */
#define TABLE_COLS_MAX 13

struct table {
    int cols, rows, cap;
    char *(*cells)[TABLE_COLS_MAX]; /* `cap` rows of (at most TABLE_COLS_MAX) cells, grown as
                                       rows arrive */
    bool lost;                      /* a row was dropped for want of memory */
};

/* Add a row of t->cols cells (copied, cleaned; NULL prints as ""). */
void table_add(struct table *t, const char *const *row);
void table_free(struct table *t);
/* Print and free the rows; EXIT_FAIL (after saying so) when a row could not be kept. */
int table_print(struct table *t);

/* ---- sources (source.c) ---- */

/* An HTTP answer, whole (at most 64 MiB). */
struct fetched {
    long status;
    char *body;
    size_t len;
    CURLcode rc;
    char error[CURL_ERROR_SIZE];
    char content_type[128]; /* "" when the answer named none */
};

/* base URL (no trailing slash) + path + optional node_id query + extra; malloc'd. */
char *admin_url(const char *base, const char *path, const char *node, const char *extra);
/* One bounded request (5 s to connect, 15 s in all); the caller frees f->body. */
void admin_fetch(const char *method, const char *url, struct fetched *f);
/*
 * EXIT_OK when f (fetched from url on the endpoint at base) is an HTTP 200
 * answer; else EXIT_FAIL after one line: unreachable, the endpoint's
 * {"error", "fix"}, or the status of something that is not an admin endpoint.
 */
int admin_answer_ok(const char *base, const char *url, const struct fetched *f);
/* Is `type` (a Content-Type, NULL for none) `want` ("application/x-ndjson"), parameters
 * aside? */
bool content_type_is(const char *type, const char *want);
/*
 * EXIT_OK when content_type_is(type, want); else EXIT_FAIL after one line: url answered
 * 200 but not as a sluice admin endpoint, and what to check.
 */
int admin_type_ok(const char *url, const char *type, const char *want);
/*
 * GET/POST an admin route and parse its JSON; NULL after printing one line
 * (unreachable, not HTTP, an error answer, not JSON).
 */
json_t *admin_json(const char *method, const char *base, const char *path, const char *node);
/* Open --state (or the default location); EXIT_FAIL after printing why, after "`flag`: "
 * when the file serves a flag (NULL: the command's own). */
int open_state(const struct opts *o, const char *flag, struct sluice_statefile **f);

/* ---- the subcommands ---- */

extern const char usage_status[], usage_clear[], usage_events[], usage_probe[];
int status_cmd(const struct opts *o);
int clear_cmd(const struct opts *o);
int events_cmd(const struct opts *o);
int probe_cmd(const struct opts *o);

#endif /* SLUICE_SLUICECTL_H */
