/*
 * options.c — sluicectl's one option parser: every subcommand's flags are
 * rows of one table, each in a group a subcommand allows or not, so a flag is
 * spelt, validated and explained the same way wherever it is accepted. A row
 * says what kind of value the flag takes and where it goes (as git's
 * parse-options OPT_BOOL / OPT_STRING rows); the few flags with a check of
 * their own (--header, --method, --save) have a small function.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

enum flag_kind {
    FLAG_BOOL,    /* no value: sets a bool */
    FLAG_STRING,  /* any value: kept as given */
    FLAG_COUNT,   /* a whole number in lo..hi (tool_parse_u64's syntax) */
    FLAG_SECONDS, /* seconds in (0, 86400] */
    FLAG_CHECKED, /* a value the row's own check takes or refuses */
};

struct flag {
    const char *name;
    unsigned group; /* OPT_*: the subcommands that accept it */
    enum flag_kind kind;
    size_t field;   /* offsetof(struct opts, ...) of the value */
    long lo, hi;    /* FLAG_COUNT's range */
    int (*check)(struct opts *o, const char *val); /* FLAG_CHECKED: 0 or EXIT_USAGE */
};

static int check_header(struct opts *o, const char *val)
{
    if (!strchr(val, ':'))
        return usage_error("--header '%s' is not 'Name: value'", val);
    if (o->n_headers >= MAX_HEADERS)
        return usage_error("more than %d --header options", MAX_HEADERS);
    o->headers[o->n_headers++] = val;
    return 0;
}

static int check_method(struct opts *o, const char *val)
{
    if (!*val || strspn(val, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(val))
        return usage_error("--method '%s' is not an HTTP method (e.g. POST)", val);
    o->method = val;
    return 0;
}

static int check_save(struct opts *o, const char *val)
{
    if (!*val || strlen(val) >= SLUICE_NODE_ID_MAX)
        return usage_error("--save NODE must be 1..%d bytes", SLUICE_NODE_ID_MAX - 1);
    o->save = val;
    return 0;
}

/* A row per kind, so each row names only what its kind uses. */
#define AT(member) offsetof(struct opts, member)
#define BOOL_FLAG(n, g, m) {.name = n, .group = g, .kind = FLAG_BOOL, .field = AT(m)}
#define STRING_FLAG(n, g, m) {.name = n, .group = g, .kind = FLAG_STRING, .field = AT(m)}
#define COUNT_FLAG(n, g, m, l, h) \
    {.name = n, .group = g, .kind = FLAG_COUNT, .field = AT(m), .lo = l, .hi = h}
#define SECONDS_FLAG(n, g, m) {.name = n, .group = g, .kind = FLAG_SECONDS, .field = AT(m)}
#define CHECKED_FLAG(n, g, c) {.name = n, .group = g, .kind = FLAG_CHECKED, .check = c}

static const struct flag flags[] = {
    BOOL_FLAG("--json", OPT_JSON, json),
    BOOL_FLAG("--human", OPT_HUMAN, human),
    BOOL_FLAG("--follow", OPT_FOLLOW, follow),
    STRING_FLAG("--state", OPT_STATE, state),
    STRING_FLAG("--admin", OPT_ADMIN, admin),
    COUNT_FLAG("--requests", OPT_PROBE, requests, 1, 100000000),
    COUNT_FLAG("--concurrency-max", OPT_PROBE, concurrency_max, 1, 1024),
    CHECKED_FLAG("--header", OPT_PROBE, check_header),
    STRING_FLAG("--body", OPT_PROBE, body_file),
    CHECKED_FLAG("--method", OPT_PROBE, check_method),
    SECONDS_FLAG("--timeout", OPT_PROBE, timeout_s),
    SECONDS_FLAG("--request-timeout", OPT_PROBE, request_timeout_s),
    CHECKED_FLAG("--save", OPT_PROBE, check_save),
    STRING_FLAG("--cacert", OPT_PROBE, cacert),
    STRING_FLAG("--redis", OPT_REDIS, redis),
};

/* Store one flag's value where its row says; 0, or EXIT_USAGE after saying why. */
static int flag_apply(const struct flag *f, const char *val, struct opts *o)
{
    char *at = (char *)o + f->field;
    uint64_t count;
    double seconds;
    switch (f->kind) {
    case FLAG_BOOL:
        *(bool *)at = true;
        return 0;
    case FLAG_STRING:
        *(const char **)at = val;
        return 0;
    case FLAG_COUNT:
        if (!tool_parse_u64(val, (uint64_t)f->hi, &count) || count < (uint64_t)f->lo)
            return usage_error("%s '%s' is not a number in %ld..%ld", f->name, val, f->lo, f->hi);
        *(long *)at = (long)count;
        return 0;
    case FLAG_SECONDS:
        if (!tool_parse_double(val, 0, 86400, &seconds) || !(seconds > 0))
            return usage_error("%s '%s' is not a number of seconds in (0, 86400]", f->name, val);
        *(double *)at = seconds;
        return 0;
    case FLAG_CHECKED:
        return f->check(o, val);
    }
    return 0;
}

/* The row for `name` among the allowed groups, or NULL. */
static const struct flag *flag_find(const char *name, unsigned allowed)
{
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
        if (!strcmp(name, flags[k].name) && (allowed & flags[k].group))
            return &flags[k];
    return NULL;
}

/* See sluicectl.h. */
int parse_opts(int argc, char **argv, int first, unsigned allowed, int max_pos, struct opts *o)
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
        const struct flag *f = flag_find(name, allowed);
        if (!f)
            return usage_error("unknown option '%s'", name);
        const char *val = NULL;
        if (f->kind != FLAG_BOOL) {
            if (eq)
                val = eq + 1;
            else if (i + 1 < argc)
                val = argv[++i];
            else
                return usage_error("%s needs a value", name);
        } else if (eq) {
            return usage_error("%s takes no value", name);
        }
        int rc = flag_apply(f, val, o);
        if (rc)
            return rc;
    }
    if (!!o->state + !!o->admin + !!o->redis > 1)
        return usage_error("%s exclude each other", allowed & OPT_REDIS
                                                        ? "--state, --admin and --redis"
                                                        : "--state and --admin");
    return 0;
}
