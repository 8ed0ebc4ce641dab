/*
 * options.c — sluicectl's one option parser: every subcommand's flags are
 * rows of one table, each in a group a subcommand allows or not, so a flag is
 * spelt, validated and explained the same way wherever it is accepted.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* A count flag's value: a whole number in lo..hi (tool_parse_u64's syntax). */
static bool parse_count(const char *s, long lo, long hi, long *out)
{
    uint64_t v;
    if (!tool_parse_u64(s, (uint64_t)hi, &v) || v < (uint64_t)lo)
        return false;
    *out = (long)v;
    return true;
}

/* A time flag's value: seconds in (0, 86400]. */
static bool parse_seconds(const char *s, double *out)
{
    double v;
    if (!tool_parse_double(s, 0, 86400, &v) || !(v > 0))
        return false;
    *out = v;
    return true;
}

/* See sluicectl.h. */
int parse_opts(int argc, char **argv, int first, unsigned allowed, int max_pos,
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
            if (!parse_count(val, 1, 100000000, &o->requests))
                return usage_error("--requests '%s' is not a number in 1..100000000", val);
        } else if (!strcmp(name, "--concurrency-max")) {
            if (!parse_count(val, 1, 1024, &o->concurrency_max))
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
