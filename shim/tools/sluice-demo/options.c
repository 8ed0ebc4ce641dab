/*
 * options.c — sluice-demo's command line: its help text, the flags and
 * $SLUICE_DEMO_CAP, each checked with a message naming the flag.
 */
#define _GNU_SOURCE
#include "demo.h"

static const char usage_text[] =
    "usage: " PROG " [options]\n"
    "\n"
    "Discover a simulated provider's hidden concurrency cap over real HTTP: starts\n"
    "sluice-provider-sim on a free loopback port and drives requests at it through\n"
    "sluice_curl_loop with the default discover policy, showing the live status, the\n"
    "event timeline (and what each of its causes means) and the admin endpoint's\n"
    "Concurrency Health page.\n"
    "\n"
    "  --cap N          the provider's hidden cap (default: $" CAP_ENV ", else 52)\n"
    "  --seconds S      send traffic for S seconds, and on until a ceiling locks (and\n"
    "                   holds for 2 s), at most --timeout (default 15)\n"
    "  --requests N     stop after N requests whatever happened (default: no limit)\n"
    "  --clients N      requests kept outstanding (default: 256, or 3 x cap if more)\n"
    "  --median-ms X    the provider's median service time (default 100)\n"
    "  --timeout S      stop after S seconds whatever happened (default 50)\n"
    "  --state FILE     the demo's state file (default ./sluice-demo-ceilings.json;\n"
    "                   never your real ~/.local/state/sluice/ceilings.json)\n"
    "  --svg FILE       where to write the timeline plot (default ./demo-timeline.svg);\n"
    "                   a run that restores its lock writes FILE-restored.svg instead\n"
    "  --admin-port N   admin endpoint port (default 8400, a free one if taken; 0 = any)\n"
    "  --hold           keep serving the Concurrency Health page after the run, until Ctrl-C\n"
    "  --plain          periodic status lines even on a terminal\n"
    "  --help           this text\n"
    "\n"
    "The last line is 'discovered ceiling: N (true cap: C)'. Exit status: 0 when a\n"
    "ceiling locked, 1 when none did (or the demo could not start), 2 on a bad flag.\n";


/* ---- the command line ---------------------------------------------------------- */

int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.cap = CAP_DEFAULT, .cap_from = "default", .seconds = 15,
                          .median_ms = 100, .timeout_s = 50,
                          .state = "sluice-demo-ceilings.json", .svg = "demo-timeline.svg",
                          .admin_port = SLUICE_ADMIN_PORT_DEFAULT};
    double v;
    const char *env = getenv(CAP_ENV);
    if (env && *env) {
        if (!tool_parse_double(env, 1, CAP_MAX, &v) || v != floor(v))
            return usage_error("$" CAP_ENV " must be a whole number from 1 to %d, got '%s'",
                             CAP_MAX, env);
        o->cap = (unsigned)v;
        o->cap_from = "$" CAP_ENV;
    }
    double clients = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
#define NUM_FLAG(flag, lo, hi, dst)                                                                \
    if ((val = tool_flag_value(argc, argv, &i, flag))) {                                           \
        if (!tool_parse_double(val, lo, hi, &v))                                                           \
            return usage_error(flag " needs a number from %g to %g, got '%s'", (double)(lo),        \
                             (double)(hi), val);                                                   \
        dst = v;                                                                                   \
        continue;                                                                                  \
    }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            exit(EXIT_OK);
        }
        if (!strcmp(a, "--hold")) {
            o->hold = true;
            continue;
        }
        if (!strcmp(a, "--plain")) {
            o->plain = true;
            continue;
        }
        if ((val = tool_flag_value(argc, argv, &i, "--cap"))) {
            if (!tool_parse_double(val, 1, CAP_MAX, &v) || v != floor(v))
                return usage_error("--cap needs a whole number from 1 to %d, got '%s'", CAP_MAX, val);
            o->cap = (unsigned)v;
            o->cap_from = "--cap";
            continue;
        }
        NUM_FLAG("--seconds", 1, 3600, o->seconds)
        NUM_FLAG("--requests", 1, 1e9, o->requests)
        NUM_FLAG("--clients", 1, 4096, clients)
        NUM_FLAG("--median-ms", 0, 60000, o->median_ms)
        NUM_FLAG("--timeout", 1, 3600, o->timeout_s)
        NUM_FLAG("--admin-port", 0, 65535, o->admin_port)
#undef NUM_FLAG
        if ((val = tool_flag_value(argc, argv, &i, "--state"))) {
            o->state = val;
            continue;
        }
        if ((val = tool_flag_value(argc, argv, &i, "--svg"))) {
            o->svg = val;
            continue;
        }
        return usage_error("unknown flag or missing value: '%s'", a);
    }
    if (o->seconds > o->timeout_s)
        o->timeout_s = o->seconds;
    /* Demand must outrun the cap, or discovery would have nothing to find. */
    o->clients = clients > 0 ? (unsigned)clients : o->cap * 3 > 256 ? o->cap * 3 : 256;
    return EXIT_OK;
}

