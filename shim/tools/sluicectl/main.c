/*
 * sluicectl — inspect, clear and probe discovered concurrency ceilings.
 *
 *   sluicectl status [--json] [--state FILE | --admin URL]
 *   sluicectl clear NODE [--state FILE | --admin URL | --redis URL]
 *   sluicectl events NODE --admin URL [--follow]
 *   sluicectl probe URL [--requests N] [--concurrency-max M] [--header H]... [--body FILE]
 *                       [--method M] [--timeout S] [--request-timeout S] [--save NODE]
 *                       [--state FILE] [--json]
 *
 * Habits from git and redis-cli: subcommands, --help on each, --json for
 * machines; results go to stdout, messages to stderr; exit 0 ok, 1 failure,
 * 2 usage. Every network call is bounded by a timeout, and probe by a
 * request budget and a wall-clock limit; Ctrl-C stops probe and events
 * --follow cleanly.
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>
#ifdef SLUICE_HAVE_FLEET
#include <sluice/fleet.h>
#endif

#include "tool.h"

/* ---- help -------------------------------------------------------------------- */

static const char usage_main[] =
    "usage: sluicectl <command> [options]\n"
    "\n"
    "Inspect, clear and probe the concurrency ceilings sluice discovers.\n"
    "\n"
    "commands:\n"
    "  status   every node's lock: from the state file, or live from --admin URL\n"
    "  clear    drop one node's lock so discovery restarts from the jumpstart\n"
    "  events   a node's event feed, from a live process (--admin URL)\n"
    "  probe    discover a real endpoint's ceiling by sending it requests\n"
    "\n"
    "Run 'sluicectl <command> --help' for a command's options.\n"
    "Exit status: 0 ok, 1 failure, 2 usage error. Results go to stdout, messages to stderr.\n";

static const char usage_status[] =
    "usage: sluicectl status [--json] [--state FILE | --admin URL]\n"
    "\n"
    "Every node with its state glyph, ceiling and the time left on its lock.\n"
    "\n"
    "  --state FILE   the state file (default: $XDG_STATE_HOME/sluice/ceilings.json,\n"
    "                 else ~/.local/state/sluice/ceilings.json)\n"
    "  --admin URL    ask a running process instead, e.g. http://127.0.0.1:8400:\n"
    "                 live in-flight counts, limits and states of every node\n"
    "  --json         print JSON instead of a table\n";

static const char usage_clear[] =
    "usage: sluicectl clear NODE [--state FILE | --admin URL | --redis URL]\n"
    "\n"
    "Drop NODE's discovered ceiling: its 24-hour lock is removed and discovery\n"
    "restarts from the jumpstart at its next request. Other nodes are untouched.\n"
    "\n"
    "  --admin URL    clear it in a running process (and its state file), e.g.\n"
    "                 http://127.0.0.1:8400; the same as\n"
    "                 curl -X POST 'URL/compute/concurrency/clear?node_id=NODE'\n"
    "  --state FILE   clear it in the state file only (default location as for status);\n"
    "                 a running process keeps its lock in memory until it restarts\n"
    "  --redis URL    clear it for a whole fleet (sluice/fleet.h) sharing the Redis\n"
    "                 server at URL (redis://HOST:PORT); its processes follow within\n"
    "                 a heartbeat\n"
    "  --json         print the node's new state as JSON (with --admin)\n";

static const char usage_events[] =
    "usage: sluicectl events NODE --admin URL [--follow]\n"
    "\n"
    "NODE's event feed from a running process, as JSON Lines, oldest first:\n"
    "every probe, backoff (with its cause), recovery, lock, expiry, restore and clear.\n"
    "\n"
    "  --admin URL    the process's admin endpoint, e.g. http://127.0.0.1:8400 (required)\n"
    "  --follow       keep the connection open and print new events as they happen\n"
    "                 (Ctrl-C to stop)\n";

static const char usage_probe[] =
    "usage: sluicectl probe URL [options]\n"
    "\n"
    "Discover URL's concurrency ceiling with sluice's default policy: start at 5\n"
    "parallel requests, grow while it answers cleanly, back off on 429/503 or a\n"
    "latency knee, stop once the ceiling locks. Progress goes to stderr (redrawn in\n"
    "place on a terminal); the event timeline and, as the last line,\n"
    "'discovered ceiling: N' go to stdout. Every request is a real one: mind the\n"
    "provider's bill.\n"
    "\n"
    "  --requests N          at most N requests in all (default 2000)\n"
    "  --concurrency-max M   never more than M in flight (default 128, at most 1024)\n"
    "  --header 'Name: v'    add a request header (repeatable), e.g. an Authorization\n"
    "  --body FILE           send FILE as the request body ('-' = stdin)\n"
    "  --method M            request method (default POST with --body, else GET)\n"
    "  --timeout S           stop after S seconds of wall time (default 300)\n"
    "  --request-timeout S   one request's limit; a timeout counts as overload (default 30)\n"
    "  --save NODE           persist the locked ceiling as NODE in the state file\n"
    "  --state FILE          the state file for --save (default location as for status)\n"
    "  --json                print one JSON object instead of the timeline\n"
    "\n"
    "Ctrl-C stops it with what it found so far. Exit status 0 when a ceiling locked,\n"
    "1 when it stopped first (the last line then shows the limit it had reached).\n";

/* ---- options ----------------------------------------------------------------- */

enum {
    OPT_JSON = 1 << 0,
    OPT_STATE = 1 << 1,
    OPT_ADMIN = 1 << 2,
    OPT_FOLLOW = 1 << 3,
    OPT_PROBE = 1 << 4, /* requests, concurrency-max, header, body, method, timeouts, save */
    OPT_REDIS = 1 << 5,
};

#define MAX_HEADERS 64

struct opts {
    bool json, follow, help;
    const char *state, *admin, *redis;
    const char *pos[4];
    int n_pos;
    long requests, concurrency_max;
    double timeout_s, request_timeout_s;
    const char *headers[MAX_HEADERS];
    int n_headers;
    const char *body_file, *method, *save;
};

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v > 0) || v > 86400)
        return false;
    *out = v;
    return true;
}

/* Parse argv[first..]; SLUICE_OK-like 0, or EXIT_USAGE after printing why. */
static int parse_opts(int argc, char **argv, int first, unsigned allowed, int max_pos,
                      struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->requests = 2000;
    o->concurrency_max = 128;
    o->timeout_s = 300;
    o->request_timeout_s = 30;
    bool dashdash = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash || a[0] != '-' || !a[1]) {
            if (o->n_pos >= max_pos)
                return usage_error("unexpected argument '%s'", a);
            o->pos[o->n_pos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            dashdash = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            o->help = true;
            continue;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - a : (ptrdiff_t)strlen(a)), a);
        struct {
            const char *name;
            unsigned group;
            bool value;
        } const table[] = {
            {"--json", OPT_JSON, false},           {"--follow", OPT_FOLLOW, false},
            {"--state", OPT_STATE, true},          {"--admin", OPT_ADMIN, true},
            {"--requests", OPT_PROBE, true},       {"--concurrency-max", OPT_PROBE, true},
            {"--header", OPT_PROBE, true},         {"--body", OPT_PROBE, true},
            {"--method", OPT_PROBE, true},         {"--timeout", OPT_PROBE, true},
            {"--request-timeout", OPT_PROBE, true}, {"--save", OPT_PROBE, true},
            {"--redis", OPT_REDIS, true},
        };
        size_t k = 0;
        for (; k < sizeof table / sizeof *table; k++)
            if (!strcmp(name, table[k].name) && (allowed & table[k].group))
                break;
        if (k == sizeof table / sizeof *table)
            return usage_error("unknown option '%s'", name);
        const char *val = NULL;
        if (table[k].value) {
            if (eq)
                val = eq + 1;
            else if (i + 1 < argc)
                val = argv[++i];
            else
                return usage_error("%s needs a value", name);
        } else if (eq) {
            return usage_error("%s takes no value", name);
        }
        if (!strcmp(name, "--json"))
            o->json = true;
        else if (!strcmp(name, "--follow"))
            o->follow = true;
        else if (!strcmp(name, "--state"))
            o->state = val;
        else if (!strcmp(name, "--admin"))
            o->admin = val;
        else if (!strcmp(name, "--redis"))
            o->redis = val;
        else if (!strcmp(name, "--requests")) {
            if (!parse_long(val, 1, 100000000, &o->requests))
                return usage_error("--requests '%s' is not a number in 1..100000000", val);
        } else if (!strcmp(name, "--concurrency-max")) {
            if (!parse_long(val, 1, 1024, &o->concurrency_max))
                return usage_error("--concurrency-max '%s' is not a number in 1..1024", val);
        } else if (!strcmp(name, "--header")) {
            if (!strchr(val, ':'))
                return usage_error("--header '%s' is not 'Name: value'", val);
            if (o->n_headers >= MAX_HEADERS)
                return usage_error("more than %d --header options", MAX_HEADERS);
            o->headers[o->n_headers++] = val;
        } else if (!strcmp(name, "--body"))
            o->body_file = val;
        else if (!strcmp(name, "--method")) {
            if (!*val || strspn(val, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(val))
                return usage_error("--method '%s' is not an HTTP method (e.g. POST)", val);
            o->method = val;
        } else if (!strcmp(name, "--timeout")) {
            if (!parse_seconds(val, &o->timeout_s))
                return usage_error("--timeout '%s' is not a number of seconds in (0, 86400]", val);
        } else if (!strcmp(name, "--request-timeout")) {
            if (!parse_seconds(val, &o->request_timeout_s))
                return usage_error("--request-timeout '%s' is not a number of seconds in (0, 86400]",
                                   val);
        } else if (!strcmp(name, "--save")) {
            if (!*val || strlen(val) >= SLUICE_NODE_ID_MAX)
                return usage_error("--save NODE must be 1..%d bytes", SLUICE_NODE_ID_MAX - 1);
            o->save = val;
        }
    }
    if (!!o->state + !!o->admin + !!o->redis > 1)
        return usage_error("%s exclude each other", allowed & OPT_REDIS
                                                        ? "--state, --admin and --redis"
                                                        : "--state and --admin");
    return 0;
}

/* ---- output helpers ------------------------------------------------------------- */

/* Terminal columns of a UTF-8 string: emoji count 2, variation selectors 0; a byte
 * that starts no UTF-8 sequence (a cell cut mid-character) counts 1 and ends nothing. */
static int display_width(const char *s)
{
    int w = 0;
    for (const char *p = s; *p;) {
        size_t n = sluice_utf8_len(p);
        const unsigned char *u = (const unsigned char *)p;
        uint32_t cp = n <= 1 ? u[0] : (uint32_t)(u[0] & (0x7f >> n));
        for (size_t i = 1; i < n; i++)
            cp = cp << 6 | (u[i] & 0x3f);
        p += n ? n : 1;
        if (cp == 0xfe0f || cp == 0x200d)
            continue;
        w += cp >= 0x1f300 && cp <= 0x1faff ? 2 : 1;
    }
    return w;
}

/*
 * Text from a state file or an endpoint, made safe to print (malloc'd, NULL when out
 * of memory): a control character a terminal would act on (C0, DEL, C1) becomes
 * \u00XX and a byte that is not UTF-8 \xXX, so an escape sequence shows instead of
 * retitling or clearing the terminal. Newlines stay where keep_newlines. In JSON text
 * the \u00XX form is the same string, so --json output means what it meant.
 */
static char *text_clean(const char *s, bool keep_newlines)
{
    size_t cap = strlen(s) * 6 + 1, o = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = s; *p;) {
        size_t n = sluice_utf8_len(p);
        const unsigned char *u = (const unsigned char *)p;
        bool control = n == 1 ? (u[0] < 0x20 && !(keep_newlines && u[0] == '\n')) || u[0] == 0x7f
                              : n == 2 && u[0] == 0xc2 && u[1] < 0xa0;
        if (!n)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02X", u[0]);
        else if (control)
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", n == 1 ? u[0] : u[1]);
        else {
            memcpy(out + o, p, n);
            o += n;
        }
        p += n ? n : 1;
    }
    out[o] = '\0';
    return out;
}

/* fputs(text_clean(s)). */
static void put_clean(const char *s, bool keep_newlines, FILE *to)
{
    char *t = text_clean(s, keep_newlines);
    fputs(t ? t : "(out of memory)", to);
    free(t);
}

/* An endpoint's {"error", "fix"} as one clean line; returns EXIT_FAIL. */
static int fail_answer(const char *err, const char *fix)
{
    char *e = text_clean(err, false), *f = text_clean(fix ? fix : "", false);
    int rc = fail("%s%s%s", e ? e : "(out of memory)", f && *f ? " — " : "", f ? f : "");
    free(e);
    free(f);
    return rc;
}

static void print_cell(const char *s, int width)
{
    fputs(s, stdout);
    for (int pad = width - display_width(s); pad > 0; pad--)
        fputc(' ', stdout);
}

static void format_left(int64_t s, char *buf, size_t size)
{
    if (s <= 0)
        snprintf(buf, size, "expired");
    else if (s >= 3600)
        snprintf(buf, size, "%" PRId64 "h %02" PRId64 "m", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, size, "%" PRId64 "m %02" PRId64 "s", s / 60, s % 60);
    else
        snprintf(buf, size, "%" PRId64 "s", s);
}

static void format_time(int64_t epoch_s, char *buf, size_t size)
{
    time_t t = (time_t)epoch_s;
    struct tm tm;
    if (epoch_s <= 0 || !localtime_r(&t, &tm))
        snprintf(buf, size, "-");
    else
        strftime(buf, size, "%Y-%m-%d %H:%M:%S %Z", &tm);
}

/* A table: rows of `cols` cells, printed with columns padded to their widest cell. */
#define TABLE_COLS_MAX 12

struct table {
    int cols, rows, cap;
    char *(*cells)[TABLE_COLS_MAX]; /* `cap` rows of (at most TABLE_COLS_MAX) cells, grown as
                                       rows arrive */
    bool lost;                      /* a row was dropped for want of memory */
};

static void table_add(struct table *t, const char *const *row)
{
    if (t->rows == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        char *(*cells)[TABLE_COLS_MAX] = realloc(t->cells, (size_t)cap * sizeof *cells);
        if (!cells) {
            t->lost = true;
            return;
        }
        t->cells = cells;
        t->cap = cap;
    }
    for (int c = 0; c < t->cols; c++)
        t->cells[t->rows][c] = text_clean(row[c] ? row[c] : "", false);
    t->rows++;
}

static void table_free(struct table *t)
{
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++)
            free(t->cells[r][c]);
    free(t->cells);
    t->cells = NULL;
    t->rows = t->cap = 0;
}

/* Print and free the rows; EXIT_FAIL (after saying so) when a row could not be kept. */
static int table_print(struct table *t)
{
    int width[TABLE_COLS_MAX] = {0};
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++) {
            int w = display_width(t->cells[r][c] ? t->cells[r][c] : "?");
            if (w > width[c])
                width[c] = w;
        }
    for (int r = 0; r < t->rows; r++) {
        for (int c = 0; c < t->cols; c++) {
            const char *cell = t->cells[r][c] ? t->cells[r][c] : "?";
            if (c == t->cols - 1)
                fputs(cell, stdout);
            else
                print_cell(cell, width[c] + 2);
        }
        fputc('\n', stdout);
    }
    table_free(t);
    return t->lost ? fail("out of memory: some nodes are missing from the table") : EXIT_OK;
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        put_clean(s, true, stdout); /* jansson leaves DEL and C1 raw */
        putchar('\n');
        free(s);
    }
}

/* ---- the admin endpoint over HTTP (libcurl) ------------------------------------------ */

struct fetched {
    long status;
    char *body;
    size_t len;
    CURLcode rc;
    char error[CURL_ERROR_SIZE];
};

static size_t fetched_write(char *p, size_t size, size_t n, void *ctx)
{
    struct fetched *f = ctx;
    size_t add = size * n;
    if (f->len + add > (64u << 20))
        return 0; /* an admin answer is small; a flood is not one */
    char *b = realloc(f->body, f->len + add + 1);
    if (!b)
        return 0;
    memcpy(b + f->len, p, add);
    f->len += add;
    b[f->len] = '\0';
    f->body = b;
    return add;
}

/* base URL (no trailing slash) + path + optional node_id query. */
static char *admin_url(const char *base, const char *path, const char *node, const char *extra)
{
    size_t blen = strlen(base);
    while (blen && base[blen - 1] == '/')
        blen--;
    char *escaped = node ? curl_easy_escape(NULL, node, 0) : NULL;
    size_t size = blen + strlen(path) + (escaped ? strlen(escaped) : 0) + 64 + (extra ? strlen(extra) : 0);
    char *url = malloc(size);
    if (url)
        snprintf(url, size, "%.*s%s%s%s%s", (int)blen, base, path, escaped ? "?node_id=" : "",
                 escaped ? escaped : "", extra ? extra : "");
    curl_free(escaped);
    return url;
}

static void admin_fetch(const char *method, const char *url, struct fetched *f)
{
    memset(f, 0, sizeof *f);
    CURL *c = curl_easy_init();
    if (!c) {
        f->rc = CURLE_OUT_OF_MEMORY;
        snprintf(f->error, sizeof f->error, "out of memory");
        return;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "POST"))
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fetched_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, f->error);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 15000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    f->rc = curl_easy_perform(c);
    if (f->rc != CURLE_OK && !f->error[0])
        snprintf(f->error, sizeof f->error, "%s", curl_easy_strerror(f->rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
    curl_easy_cleanup(c);
}

/*
 * GET/POST an admin route and parse its JSON; NULL after printing one line
 * (unreachable, not HTTP, an error answer, not JSON).
 */
static json_t *admin_json(const char *method, const char *base, const char *path,
                          const char *node)
{
    char *url = admin_url(base, path, node, NULL);
    if (!url) {
        fail("out of memory");
        return NULL;
    }
    struct fetched f;
    admin_fetch(method, url, &f);
    json_t *j = NULL;
    if (f.rc != CURLE_OK) {
        fail("cannot reach the admin endpoint at %s: %s", base, f.error);
    } else {
        j = f.body ? json_loads(f.body, 0, NULL) : NULL;
        const char *err = json_string_value(json_object_get(j, "error"));
        const char *fix = json_string_value(json_object_get(j, "fix"));
        if (f.status != 200 && err) {
            fail_answer(err, fix);
            json_decref(j);
            j = NULL;
        } else if (f.status != 200) {
            fail("%s answered HTTP %ld: is it a sluice admin endpoint?", url, f.status);
            json_decref(j);
            j = NULL;
        } else if (!json_is_object(j)) {
            fail("%s did not answer JSON: is it a sluice admin endpoint?", url);
            json_decref(j);
            j = NULL;
        }
    }
    free(f.body);
    free(url);
    return j;
}

/* ---- status ----------------------------------------------------------------- */

static int open_state(const struct opts *o, struct sluice_statefile **f)
{
    char err[512];
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = o->state, .error = err,
                                                              .error_size = sizeof err},
                              f) != SLUICE_OK)
        return fail("%s", err);
    return EXIT_OK;
}

struct status_walk {
    struct table table;
    json_t *nodes;
    int64_t now;
};

static int status_row(void *ctx, const char *node, const struct sluice_lock_record *rec,
                      const char *problem)
{
    struct status_walk *w = ctx;
    json_t *o = json_object();
    json_object_set_new(o, "node", json_string(node));
    if (!rec) {
        json_object_set_new(o, "state", json_string("invalid"));
        json_object_set_new(o, "problem", json_string(problem));
        json_array_append_new(w->nodes, o);
        const char *row[] = {node, "⚠️ invalid", "-", "-", problem, ""};
        table_add(&w->table, row);
        return 0;
    }
    bool live = rec->expires_s > w->now;
    char ceiling[16], left[32], locked[32], until[32];
    snprintf(ceiling, sizeof ceiling, "%" PRIu32, rec->ceiling);
    format_left(rec->expires_s - w->now, left, sizeof left);
    format_time(rec->locked_at_s, locked, sizeof locked);
    format_time(rec->expires_s, until, sizeof until);
    json_object_set_new(o, "state", json_string(live ? "locked" : "expired"));
    json_object_set_new(o, "glyph", json_string(live ? "🔒" : ""));
    json_object_set_new(o, "ceiling", json_integer(rec->ceiling));
    json_object_set_new(o, "locked_at", json_integer(rec->locked_at_s));
    json_object_set_new(o, "expires_at", json_integer(rec->expires_s));
    json_object_set_new(o, "lock_left_s", json_integer(live ? rec->expires_s - w->now : 0));
    json_object_set_new(o, "policy", json_string(rec->policy));
    json_array_append_new(w->nodes, o);
    const char *row[] = {node, live ? "🔒 locked" : "expired", ceiling, left, until,
                         rec->policy[0] ? rec->policy : "-"};
    table_add(&w->table, row);
    return 0;
}

static int status_from_file(const struct opts *o)
{
    struct sluice_statefile *f;
    if (open_state(o, &f) != EXIT_OK)
        return EXIT_FAIL;
    struct status_walk *w = calloc(1, sizeof *w);
    w->table.cols = 6;
    w->nodes = json_array();
    w->now = (int64_t)time(NULL);
    const char *head[] = {"NODE", "STATE", "CEILING", "LOCK LEFT", "EXPIRES", "POLICY"};
    table_add(&w->table, head);
    int status = sluice_statefile_foreach(f, status_row, w);
    int rc = EXIT_OK;
    if (status != SLUICE_OK) {
        char err[1024];
        sluice_statefile_last_error(f, err, sizeof err);
        rc = fail("%s", err);
    } else if (o->json) {
        json_t *root = json_pack("{s:s,s:s,s:o}", "source", "statefile", "path",
                                 sluice_statefile_path(f), "nodes", json_incref(w->nodes));
        print_json(root);
        json_decref(root);
    } else if (json_array_size(w->nodes) == 0) {
        fprintf(stderr, "no discovered ceilings in %s\n", sluice_statefile_path(f));
    } else {
        rc = table_print(&w->table);
    }
    table_free(&w->table);
    json_decref(w->nodes);
    free(w);
    sluice_statefile_close(f);
    return rc;
}

/* The deadline figures of one admin node (see the admin's node JSON): rates, queue wait, lingering. */
static void status_figures(json_t *n, char fig[6][24])
{
    static const char *const rates[] = {"request_rate", "overload_rate", "timeout_rate"};
    for (int k = 0; k < 3; k++)
        snprintf(fig[k], 24, "%.1f", json_number_value(json_object_get(n, rates[k])));
    static const char *const waits[] = {"queue_wait_p50_ms", "queue_wait_p99_ms"};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(n, waits[k]);
        if (json_is_number(v))
            snprintf(fig[3 + k], 24, "%.0f ms", json_number_value(v));
        else
            snprintf(fig[3 + k], 24, "-");
    }
    snprintf(fig[5], 24, "%" JSON_INTEGER_FORMAT, json_integer_value(json_object_get(n, "lingering")));
}

static int status_from_admin(const struct opts *o)
{
    json_t *s = admin_json("GET", o->admin, "/compute/concurrency", NULL);
    if (!s)
        return EXIT_FAIL;
    json_t *nodes = json_object_get(s, "nodes");
    if (!json_is_array(nodes)) {
        json_decref(s);
        return fail("%s answered JSON without \"nodes\": is it a sluice admin endpoint?", o->admin);
    }
    if (o->json) {
        print_json(s);
        json_decref(s);
        return EXIT_OK;
    }
    struct table *t = calloc(1, sizeof *t);
    t->cols = 11;
    const char *head[] = {"STATUS",    "STATE",     "CEILING",   "LOCK LEFT",
                          "WAITING",   "REQ/S",     "429/S",     "TIMEOUTS/S",
                          "QUEUE P50", "QUEUE P99", "LINGERING"};
    table_add(t, head);
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        const char *state = json_string_value(json_object_get(n, "state"));
        const char *glyph = json_string_value(json_object_get(n, "glyph"));
        char st[64], ceiling[24] = "-", left[32] = "-", waiting[24];
        snprintf(st, sizeof st, "%s%s%s", glyph && *glyph ? glyph : "", glyph && *glyph ? " " : "",
                 state ? state : "?");
        json_int_t c = json_integer_value(json_object_get(n, "ceiling"));
        if (c > 0) {
            snprintf(ceiling, sizeof ceiling, "%" JSON_INTEGER_FORMAT, c);
            format_left(json_integer_value(json_object_get(n, "lock_left_s")), left, sizeof left);
        }
        snprintf(waiting, sizeof waiting, "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(n, "waiting")));
        const char *line = json_string_value(json_object_get(n, "status_line"));
        char fig[6][24];
        status_figures(n, fig);
        const char *row[] = {line ? line : "?", st,     ceiling, left,   waiting, fig[0],
                             fig[1],            fig[2], fig[3],  fig[4], fig[5]};
        table_add(t, row);
    }
    int rc = table_print(t);
    free(t);
    json_decref(s);
    return rc;
}

/* ---- clear ------------------------------------------------------------------ */

struct find_node {
    const char *node;
    bool found;
};

static int find_row(void *ctx, const char *node, const struct sluice_lock_record *rec,
                    const char *problem)
{
    (void)rec;
    (void)problem;
    struct find_node *f = ctx;
    f->found |= !strcmp(node, f->node);
    return 0;
}

static int clear_in_file(const struct opts *o, const char *node)
{
    struct sluice_statefile *f;
    if (open_state(o, &f) != EXIT_OK)
        return EXIT_FAIL;
    struct find_node find = {node, false};
    /* An unreadable file has no lock to find; the clear still rewrites it cleanly. */
    int walked = sluice_statefile_foreach(f, find_row, &find);
    int rc = EXIT_OK;
    if (walked == SLUICE_OK && !find.found) {
        /* Clearing is idempotent: the node is as a clear would leave it. */
        fprintf(stderr, "%s: %s has no lock for %s: nothing to clear (sluicectl status lists the "
                        "nodes)\n",
                tool_name, sluice_statefile_path(f), node);
    } else if (sluice_statefile_clear(f, node) != SLUICE_OK) {
        char err[1024];
        sluice_statefile_last_error(f, err, sizeof err);
        rc = fail("%s", err);
    } else {
        fprintf(stderr,
                "cleared %s in %s: the next process to start discovers it again from the "
                "jumpstart (a running one keeps its lock until restarted, or use --admin)\n",
                node, sluice_statefile_path(f));
    }
    sluice_statefile_close(f);
    return rc;
}

static int clear_in_admin(const struct opts *o, const char *node)
{
    json_t *r = admin_json("POST", o->admin, "/compute/concurrency/clear", node);
    if (!r)
        return EXIT_FAIL;
    json_t *n = json_object_get(r, "node");
    const char *line = json_string_value(json_object_get(n, "status_line"));
    if (o->json) {
        print_json(n);
    } else {
        fputs("cleared: ", stdout);
        put_clean(line ? line : "?", false, stdout);
        putchar('\n');
    }
    json_decref(r);
    return EXIT_OK;
}

#ifdef SLUICE_HAVE_FLEET
/* The fleet's message with its C names swapped for what a sluicectl user typed. */
static int fail_in_cli_words(const char *msg)
{
    static const char *const words[][2] = {
        {"sluice_fleet_desc.redis_url", "--redis URL"},
        {"sluice_fleet_desc.node_id", "NODE"},
        {"SLUICE_NODE_ID_MAX-1", "127"},
    };
    char out[1024];
    size_t o = 0;
    while (*msg) {
        const char *put = msg;
        size_t take = 1, skip = 1;
        for (size_t k = 0; k < sizeof words / sizeof *words; k++)
            if (!strncmp(msg, words[k][0], strlen(words[k][0]))) {
                put = words[k][1];
                take = strlen(put);
                skip = strlen(words[k][0]);
                break;
            }
        if (o + take >= sizeof out)
            break;
        memcpy(out + o, put, take);
        o += take;
        msg += skip;
    }
    out[o] = '\0';
    return fail("%s", out);
}
#endif

static int clear_in_redis(const struct opts *o, const char *node)
{
#ifdef SLUICE_HAVE_FLEET
    char err[512];
    if (sluice_fleet_clear_node(o->redis, node, err, sizeof err) != SLUICE_OK)
        return fail_in_cli_words(err);
    fprintf(stderr, "cleared %s for the fleet at %s\n", node, o->redis);
    return EXIT_OK;
#else
    (void)node;
    return fail("--redis %s: this sluicectl was built without the Redis fleet (hiredis)",
                o->redis);
#endif
}

/* ---- events ----------------------------------------------------------------- */

struct sse {
    char line[8192];
    size_t len;
    bool overflow;
    long events;
};

static size_t sse_write(char *p, size_t size, size_t n, void *ctx)
{
    struct sse *s = ctx;
    for (size_t i = 0; i < size * n; i++) {
        char c = p[i];
        if (c != '\n') {
            if (s->len < sizeof s->line - 1)
                s->line[s->len++] = c;
            else
                s->overflow = true;
            continue;
        }
        s->line[s->len] = '\0';
        if (!s->overflow && !strncmp(s->line, "data: ", 6)) {
            put_clean(s->line + 6, false, stdout);
            putchar('\n');
            fflush(stdout);
            s->events++;
        }
        s->len = 0;
        s->overflow = false;
    }
    return size * n;
}

static int sse_progress(void *clientp, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)clientp;
    (void)a;
    (void)b;
    (void)c;
    (void)d;
    return interrupted ? 1 : 0;
}

static int events_cmd(const struct opts *o, const char *node)
{
    if (!o->follow) {
        char *url = admin_url(o->admin, "/compute/concurrency/events", node, NULL);
        struct fetched f;
        admin_fetch("GET", url, &f);
        int rc = EXIT_OK;
        if (f.rc != CURLE_OK) {
            rc = fail("cannot reach the admin endpoint at %s: %s", o->admin, f.error);
        } else if (f.status != 200) {
            json_t *j = f.body ? json_loads(f.body, 0, NULL) : NULL;
            const char *err = json_string_value(json_object_get(j, "error"));
            const char *fix = json_string_value(json_object_get(j, "fix"));
            rc = err ? fail_answer(err, fix)
                     : fail("%s answered HTTP %ld: is it a sluice admin endpoint?", url, f.status);
            json_decref(j);
        } else if (f.body) {
            put_clean(f.body, true, stdout);
        }
        free(f.body);
        free(url);
        return rc;
    }
    char *url = admin_url(o->admin, "/compute/concurrency/events", node, "&follow=1");
    struct sse s = {0};
    char error[CURL_ERROR_SIZE] = "";
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, sse_progress);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    /* The server sends a keep-alive at least every few seconds: silence this long is a dead peer. */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode rc = curl_easy_perform(c);
    long http = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_cleanup(c);
    free(url);
    if (interrupted || rc == CURLE_OK)
        return EXIT_OK; /* Ctrl-C, or the stream ended */
    if (rc == CURLE_PARTIAL_FILE && http == 200) {
        fprintf(stderr, "%s: the event stream ended (the process stopped its admin endpoint)\n",
                tool_name);
        return EXIT_OK;
    }
    if (http >= 400)
        return fail("%s answered HTTP %ld (check NODE with sluicectl status --admin %s)", o->admin,
                    http, o->admin);
    return fail("event stream from %s failed: %s", o->admin, error[0] ? error : curl_easy_strerror(rc));
}

/* ---- probe ------------------------------------------------------------------ */

#define PROBE_EVENTS_MAX 4096

struct probe {
    const struct opts *o;
    struct sluice_engine *engine;
    const char *node, *url, *method;
    struct curl_slist *headers;
    char *body;
    size_t body_len;
    struct sluice_cancel cancel;
    atomic_bool stop;
    atomic_long started, ok, overloaded, failed, live_workers;
    int64_t t0_ns;
    pthread_mutex_t mu; /* guards events and last_failure */
    struct sluice_event *events;
    size_t n_events;
    char last_failure[256];
    struct sluice_statefile *state; /* --save */
};

static void probe_on_event(void *ctx, const struct sluice_event *ev)
{
    struct probe *p = ctx;
    pthread_mutex_lock(&p->mu);
    if (p->n_events < PROBE_EVENTS_MAX)
        p->events[p->n_events++] = *ev;
    pthread_mutex_unlock(&p->mu);
}

static size_t discard(char *ptr, size_t size, size_t n, void *ctx)
{
    (void)ptr;
    (void)ctx;
    return size * n;
}

static CURL *probe_easy(struct probe *p)
{
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_easy_setopt(c, CURLOPT_URL, p->url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, p->method);
    if (p->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, p->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)p->body_len);
    } else if (!strcmp(p->method, "HEAD")) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, p->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(p->o->request_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "sluicectl-probe");
    return c;
}

/* One request through the engine; tallies it. */
static int probe_one(struct probe *p, CURL *easy, struct sluice_curl_result *r)
{
    int status = sluice_curl_perform(p->engine, p->node, easy, NULL, &p->cancel, r);
    if (status == SLUICE_OK && r->kind == SLUICE_CURL_SUCCESS) {
        atomic_fetch_add(&p->ok, 1);
    } else if (status == SLUICE_OK || status == SLUICE_EIO) {
        if (r->outcome == SLUICE_OUTCOME_OVERLOAD)
            atomic_fetch_add(&p->overloaded, 1);
        else {
            atomic_fetch_add(&p->failed, 1);
            pthread_mutex_lock(&p->mu);
            if (r->http_status)
                snprintf(p->last_failure, sizeof p->last_failure, "HTTP %ld (%s)", r->http_status,
                         sluice_curl_kind_name(r->kind));
            else
                snprintf(p->last_failure, sizeof p->last_failure, "%s",
                         curl_easy_strerror(r->curl_code));
            pthread_mutex_unlock(&p->mu);
        }
    }
    return status;
}

static void *probe_worker(void *arg)
{
    struct probe *p = arg;
    CURL *easy = probe_easy(p);
    while (easy && !atomic_load(&p->stop)) {
        if (atomic_fetch_add(&p->started, 1) >= p->o->requests)
            break;
        struct sluice_curl_result r;
        int status = probe_one(p, easy, &r);
        if (status != SLUICE_OK && status != SLUICE_EIO && status != SLUICE_ECANCELED) {
            pthread_mutex_lock(&p->mu);
            snprintf(p->last_failure, sizeof p->last_failure, "%s", sluice_strerror(status));
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->stop, true);
        }
    }
    if (easy)
        curl_easy_cleanup(easy);
    atomic_fetch_sub(&p->live_workers, 1);
    return NULL;
}

struct preflight {
    struct probe *p;
    struct sluice_curl_result r;
    int status;
    atomic_bool done;
};

static void *preflight_main(void *arg)
{
    struct preflight *pf = arg;
    memset(&pf->r, 0, sizeof pf->r);
    pf->status = SLUICE_ENOMEM;
    CURL *easy = probe_easy(pf->p);
    if (easy) {
        atomic_fetch_add(&pf->p->started, 1);
        pf->status = probe_one(pf->p, easy, &pf->r);
        curl_easy_cleanup(easy);
    }
    atomic_store(&pf->done, true);
    return NULL;
}

/*
 * The first request, alone (on a thread, so Ctrl-C can cancel it): a URL
 * that cannot be probed fails here with one clear line. EXIT_OK to go on;
 * *stopped set when Ctrl-C ended it.
 */
static int probe_preflight(struct probe *p, bool *stopped)
{
    struct preflight pf = {.p = p};
    pthread_t tid;
    if (pthread_create(&tid, NULL, preflight_main, &pf) != 0)
        return fail("cannot start a thread");
    while (!atomic_load(&pf.done)) {
        if (interrupted)
            sluice_cancel_fire(&p->cancel);
        struct timespec ms20 = {0, 20 * 1000 * 1000};
        nanosleep(&ms20, NULL);
    }
    pthread_join(tid, NULL);
    const struct sluice_curl_result *r = &pf.r;
    *stopped = pf.status == SLUICE_ECANCELED;
    if (*stopped)
        return EXIT_OK;
    if (pf.status == SLUICE_EIO && r->kind == SLUICE_CURL_TRANSPORT)
        return fail("no HTTP answer from %s: %s", p->url, curl_easy_strerror(r->curl_code));
    if (r->kind == SLUICE_CURL_PROVIDER_TIMEOUT && r->http_status == 0)
        return fail("%s did not answer within %g s (--request-timeout)", p->url,
                    p->o->request_timeout_s);
    if (pf.status != SLUICE_OK)
        return fail("the first request failed: %s", sluice_strerror(pf.status));
    switch (r->kind) {
    case SLUICE_CURL_CLIENT_ERROR:
        return fail("%s answered HTTP %ld to the first request: fix the URL, --method, "
                    "--header or --body",
                    p->url, r->http_status);
    case SLUICE_CURL_SERVER_ERROR:
        return fail("%s answered HTTP %ld to the first request: the endpoint is failing, "
                    "not full",
                    p->url, r->http_status);
    case SLUICE_CURL_UNEXPECTED:
        return fail("%s answered HTTP %ld (a redirect? give the final URL)", p->url,
                    r->http_status);
    default:
        return EXIT_OK; /* success, or an overload: both are what probing is about */
    }
}

static double probe_elapsed(const struct probe *p)
{
    return (double)(sluice_monotonic_ns() - p->t0_ns) / 1e9;
}

static long probe_requests(const struct probe *p);

static void probe_progress(struct probe *p, bool tty, bool final)
{
    char line[SLUICE_NODE_ID_MAX + 64];
    sluice_engine_status_line(p->engine, p->node, line, sizeof line);
    char msg[512];
    snprintf(msg, sizeof msg, "%s  · %ld requests, %ld ok, %ld overloaded, %ld failed · %.1f s",
             line, probe_requests(p), atomic_load(&p->ok), atomic_load(&p->overloaded),
             atomic_load(&p->failed), probe_elapsed(p));
    if (tty)
        fprintf(stderr, "\r\033[K%s%s", msg, final ? "\n" : "");
    else
        fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

/* Why the probe should stop now, or NULL to go on. */
static const char *probe_should_stop(struct probe *p)
{
    struct sluice_discovery_status st;
    sluice_engine_status(p->engine, p->node, &st);
    if (st.state == SLUICE_DISCOVERY_LOCKED)
        return "locked";
    if (interrupted)
        return "interrupted";
    if (probe_elapsed(p) >= p->o->timeout_s)
        return "time limit (--timeout)";
    if (atomic_load(&p->live_workers) == 0)
        return atomic_load(&p->started) >= p->o->requests ? "request budget (--requests)"
                                                          : "workers stopped";
    long done = probe_requests(p);
    if (done >= 20 && atomic_load(&p->failed) * 2 > done)
        return "most requests fail";
    return NULL;
}

static long probe_requests(const struct probe *p)
{
    return atomic_load(&p->ok) + atomic_load(&p->overloaded) + atomic_load(&p->failed);
}

static void probe_timeline(struct probe *p)
{
    printf("event timeline (%s, %zu events):\n", p->node, p->n_events);
    int64_t t0 = p->n_events ? p->events[0].t_ns : 0;
    for (size_t i = 0; i < p->n_events; i++) {
        const struct sluice_event *e = &p->events[i];
        char when[32], limits[48];
        snprintf(when, sizeof when, "+%.2fs", (double)(e->t_ns - t0) / 1e9);
        if (e->old_limit != e->new_limit)
            snprintf(limits, sizeof limits, "%" PRIu32 " → %" PRIu32, e->old_limit, e->new_limit);
        else
            snprintf(limits, sizeof limits, "%" PRIu32, e->new_limit);
        printf("  %9s  ", when);
        print_cell(sluice_event_kind_name(e->kind), 10);
        print_cell(limits, 11);
        print_cell(sluice_cause_name(e->cause), 12);
        printf("in flight %" PRIu32, e->in_flight);
        if (e->ceiling)
            printf(", ceiling %" PRIu32, e->ceiling);
        putchar('\n');
    }
}

/* The probe's store, used only with --save: it never restores an old lock (a probe
 * always measures afresh) and forwards the lock it finds to the state file. */
static int probe_store_load(void *ctx, const char *node, struct sluice_lock_record *out)
{
    (void)ctx;
    (void)node;
    memset(out, 0, sizeof *out);
    return SLUICE_OK;
}

static int probe_store_save(void *ctx, const char *node, const struct sluice_lock_record *rec)
{
    return sluice_statefile_save(((struct probe *)ctx)->state, node, rec);
}

static int probe_store_clear(void *ctx, const char *node)
{
    (void)ctx;
    (void)node;
    return SLUICE_OK;
}

static int probe_read_body(struct probe *p, const char *file)
{
    FILE *fp = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!fp)
        return fail("cannot read --body %s: %s", file, strerror(errno));
    size_t cap = 4096;
    p->body = malloc(cap);
    for (size_t n; p->body && (n = fread(p->body + p->body_len, 1, cap - p->body_len, fp)) > 0;) {
        p->body_len += n;
        if (p->body_len == cap) {
            if (cap >= (16u << 20))
                break;
            cap *= 2;
            char *b = realloc(p->body, cap);
            if (!b) {
                free(p->body);
                p->body = NULL;
            }
            p->body = b;
        }
    }
    bool bad = !p->body || ferror(fp) || p->body_len >= (16u << 20);
    if (fp != stdin)
        fclose(fp);
    if (bad)
        return fail("--body %s is unreadable or over 16 MiB", file);
    return EXIT_OK;
}

static int probe_report(struct probe *p, const char *why)
{
    struct sluice_discovery_status st;
    sluice_engine_status(p->engine, p->node, &st);
    bool locked = st.state == SLUICE_DISCOVERY_LOCKED;
    uint32_t found = locked ? st.ceiling : st.limit;
    int rc = locked ? EXIT_OK : EXIT_FAIL;
    if (!locked)
        fprintf(stderr, "%s: stopped before a ceiling locked (%s%s%s); %u is the limit it "
                        "had reached\n",
                tool_name, why, p->last_failure[0] ? "; last failure: " : "", p->last_failure,
                found);
    if (p->state) {
        if (locked)
            fprintf(stderr, "saved %s: ceiling %u in %s\n", p->node, found,
                    sluice_statefile_path(p->state));
        else
            fprintf(stderr, "not saved: %s has no lock to persist\n", p->node);
    }
    if (p->o->json) {
        json_t *events = json_array();
        for (size_t i = 0; i < p->n_events; i++) {
            char line[512];
            if (sluice_event_format_json(&p->events[i], line, sizeof line) < sizeof line)
                json_array_append_new(events, json_loads(line, 0, NULL));
        }
        json_t *root = json_pack(
            "{s:s,s:s,s:b,s:i,s:s,s:I,s:I,s:I,s:I,s:f,s:o}", "url", p->url, "node", p->node,
            "locked", locked, "discovered_ceiling", (int)found, "stopped", why, "requests",
            (json_int_t)probe_requests(p), "ok", (json_int_t)atomic_load(&p->ok),
            "overloaded", (json_int_t)atomic_load(&p->overloaded), "failed",
            (json_int_t)atomic_load(&p->failed), "seconds", probe_elapsed(p), "events", events);
        print_json(root);
        json_decref(root);
        return rc;
    }
    printf("probe of %s: %ld requests in %.1f s (%ld ok, %ld overloaded, %ld failed); stopped: %s\n",
           p->url, probe_requests(p), probe_elapsed(p), atomic_load(&p->ok),
           atomic_load(&p->overloaded), atomic_load(&p->failed), why);
    probe_timeline(p);
    printf("discovered ceiling: %u\n", found);
    return rc;
}

static int probe_cmd(const struct opts *o, const char *url)
{
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return usage_error("probe URL must start with http:// or https:// (got '%s')", url);
    struct probe *p = calloc(1, sizeof *p);
    p->o = o;
    p->url = url;
    p->node = o->save ? o->save : "probe";
    pthread_mutex_init(&p->mu, NULL);
    sluice_cancel_init(&p->cancel);
    p->events = calloc(PROBE_EVENTS_MAX, sizeof *p->events);
    int rc = EXIT_OK;
    if (o->body_file)
        rc = probe_read_body(p, o->body_file);
    p->method = o->method ? o->method : p->body ? "POST" : "GET";
    for (int i = 0; i < o->n_headers; i++)
        p->headers = curl_slist_append(p->headers, o->headers[i]);
    if (rc == EXIT_OK && o->save &&
        sluice_statefile_open(&(struct sluice_statefile_desc){.path = o->state}, &p->state) !=
            SLUICE_OK)
        rc = fail("no state file location for --save: pass --state FILE");

    struct sluice_store_ops store = {.load = probe_store_load, .save = probe_store_save,
                                     .clear = probe_store_clear, .ctx = p};
    struct sluice_discovery_desc disc;
    memset(&disc, 0, sizeof disc);
    struct sluice_backend_desc backend = {.id = p->node, .active = (uint32_t)o->concurrency_max,
                                          .waiting = SLUICE_SOME(o->concurrency_max),
                                          .discovery = &disc};
    char err[256];
    if (rc == EXIT_OK &&
        sluice_engine_create(&(struct sluice_engine_desc){.backends = &backend, .n_backends = 1,
                                                          .store = p->state ? &store : NULL,
                                                          .on_event = probe_on_event,
                                                          .on_event_ctx = p, .error = err,
                                                          .error_size = sizeof err},
                             &p->engine) != SLUICE_OK)
        rc = fail("%s", err);

    bool tty = isatty(STDERR_FILENO);
    p->t0_ns = sluice_monotonic_ns();
    bool stopped = false;
    if (rc == EXIT_OK)
        rc = probe_preflight(p, &stopped);
    pthread_t *tids = calloc((size_t)o->concurrency_max, sizeof *tids);
    long workers = 0;
    if (rc == EXIT_OK && stopped) {
        probe_progress(p, tty, true);
        rc = probe_report(p, "interrupted");
    } else if (rc == EXIT_OK) {
        /* Workers ignore SIGINT: the main thread sees it and stops them. */
        sigset_t block, old;
        sigemptyset(&block);
        sigaddset(&block, SIGINT);
        pthread_sigmask(SIG_BLOCK, &block, &old);
        atomic_store(&p->live_workers, o->concurrency_max);
        for (; workers < o->concurrency_max; workers++)
            if (pthread_create(&tids[workers], NULL, probe_worker, p) != 0)
                break;
        atomic_fetch_sub(&p->live_workers, o->concurrency_max - workers);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        const char *why;
        int tick = 0;
        while (!(why = probe_should_stop(p))) {
            struct timespec ms100 = {0, 100 * 1000 * 1000};
            nanosleep(&ms100, NULL);
            if (tty || ++tick % 10 == 0)
                probe_progress(p, tty, false);
        }
        atomic_store(&p->stop, true);
        sluice_cancel_fire(&p->cancel); /* queued calls leave, transfers abort */
        for (long i = 0; i < workers; i++)
            pthread_join(tids[i], NULL);
        sluice_discovery_sync(sluice_pool_discovery(sluice_engine_pool(p->engine, p->node)));
        probe_progress(p, tty, true);
        rc = probe_report(p, why);
    }
    free(tids);
    if (p->engine) {
        sluice_engine_close(p->engine);
        sluice_engine_destroy(p->engine);
    }
    sluice_statefile_close(p->state);
    curl_slist_free_all(p->headers);
    free(p->body);
    free(p->events);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return rc;
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    tool_name = "sluicectl";
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        const char *topic = argc > 2 ? argv[2] : NULL;
        fputs(!topic                      ? usage_main
              : !strcmp(topic, "status") ? usage_status
              : !strcmp(topic, "clear")  ? usage_clear
              : !strcmp(topic, "events") ? usage_events
              : !strcmp(topic, "probe")  ? usage_probe
                                          : usage_main,
              stdout);
        return EXIT_OK;
    }
    static char name[64];
    snprintf(name, sizeof name, "sluicectl %s", cmd);
    struct opts o;
    int rc;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!strcmp(cmd, "status")) {
        tool_name = name;
        if ((rc = parse_opts(argc, argv, 2, OPT_JSON | OPT_STATE | OPT_ADMIN, 0, &o)))
            return rc;
        if (o.help)
            return fputs(usage_status, stdout), EXIT_OK;
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = o.admin ? status_from_admin(&o) : status_from_file(&o);
    } else if (!strcmp(cmd, "clear")) {
        tool_name = name;
        if ((rc = parse_opts(argc, argv, 2, OPT_JSON | OPT_STATE | OPT_ADMIN | OPT_REDIS, 1, &o)))
            return rc;
        if (o.help)
            return fputs(usage_clear, stdout), EXIT_OK;
        if (o.n_pos != 1)
            return usage_error("clear needs a NODE, e.g. sluicectl clear cloud:default_ollama");
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = o.redis ? clear_in_redis(&o, o.pos[0])
             : o.admin ? clear_in_admin(&o, o.pos[0])
                       : clear_in_file(&o, o.pos[0]);
    } else if (!strcmp(cmd, "events")) {
        tool_name = name;
        if ((rc = parse_opts(argc, argv, 2, OPT_ADMIN | OPT_FOLLOW, 1, &o)))
            return rc;
        if (o.help)
            return fputs(usage_events, stdout), EXIT_OK;
        if (o.n_pos != 1)
            return usage_error("events needs a NODE");
        if (!o.admin)
            return usage_error("events needs --admin URL (a running process's admin endpoint)");
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = events_cmd(&o, o.pos[0]);
    } else if (!strcmp(cmd, "probe")) {
        tool_name = name;
        if ((rc = parse_opts(argc, argv, 2, OPT_PROBE | OPT_STATE | OPT_JSON, 1, &o)))
            return rc;
        if (o.help)
            return fputs(usage_probe, stdout), EXIT_OK;
        if (o.n_pos != 1)
            return usage_error("probe needs a URL, e.g. sluicectl probe https://api.example/v1/chat/completions");
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = probe_cmd(&o, o.pos[0]);
    } else {
        return usage_error("unknown command '%s'", cmd);
    }
    curl_global_cleanup();
    return rc;
}
