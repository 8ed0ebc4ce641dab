/*
 * sluicectl — inspect, clear and probe discovered concurrency ceilings.
 *
 *   sluicectl status [--json] [--state FILE | --admin URL]
 *   sluicectl clear NODE [--state FILE | --admin URL | --redis URL]
 *   sluicectl events NODE --admin URL [--follow] [--json | --human]
 *   sluicectl probe URL [--requests N] [--concurrency-max M] [--header H]... [--body FILE]
 *                       [--method M] [--timeout S] [--request-timeout S] [--save NODE]
 *                       [--state FILE] [--json]
 *
 * Habits from git and redis-cli: subcommands, --help on each, --json for
 * machines; results go to stdout, messages to stderr; exit 0 ok, 1 failure,
 * 2 usage. Every network call is bounded by a timeout, and probe by a
 * request budget and a wall-clock limit; Ctrl-C stops probe and events
 * --follow cleanly.
 *
 * This file is the command table; each subcommand has its own file over
 * what they share (see sluicectl.h).
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "sluicectl.h"

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

/* One row per subcommand: its help, the option groups it takes (options.c),
 * how many positional arguments, and what runs it. */
static const struct command {
    const char *name;
    const char *usage;
    unsigned allowed;
    int max_pos;
    int (*run)(const struct opts *o);
} commands[] = {
    {"status", usage_status, OPT_JSON | OPT_STATE | OPT_ADMIN, 0, status_cmd},
    {"clear", usage_clear, OPT_JSON | OPT_STATE | OPT_ADMIN | OPT_REDIS, 1, clear_cmd},
    {"events", usage_events, OPT_ADMIN | OPT_FOLLOW | OPT_JSON | OPT_HUMAN, 1, events_cmd},
    {"probe", usage_probe, OPT_PROBE | OPT_STATE | OPT_JSON, 1, probe_cmd},
};

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; name && i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(name, commands[i].name))
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    tool_name = "sluicectl";
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        const struct command *topic = find_command(argc > 2 ? argv[2] : NULL);
        fputs(topic ? topic->usage : usage_main, stdout);
        return EXIT_OK;
    }
    static char name[64];
    snprintf(name, sizeof name, "sluicectl %s", cmd);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const struct command *c = find_command(cmd);
    if (!c)
        return usage_error("unknown command '%s'", cmd);
    tool_name = name;
    struct opts o;
    int rc = parse_opts(argc, argv, 2, c->allowed, c->max_pos, &o);
    if (rc)
        return rc;
    if (o.help)
        return fputs(c->usage, stdout), EXIT_OK;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = c->run(&o);
    curl_global_cleanup();
    return rc;
}
