/*
 * clear.c — `sluicectl clear NODE`: drop one node's lock in the state file, a running
 * process (--admin) or a whole fleet (--redis).
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stdio.h>
#include <string.h>

#ifdef SLUICE_HAVE_FLEET
#include <sluice/fleet.h>
#endif

const char usage_clear[] =
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
    if (open_state(o, NULL, &f) != EXIT_OK)
        return EXIT_FAIL;
    struct find_node find = {node, false};
    int walked = sluice_statefile_foreach(f, find_row, &find);
    int rc = EXIT_OK;
    if (walked != SLUICE_OK) {
        /* The library's next save would replace the file, and with it every other node's
         * lock (or, at a wrong path, someone else's file): a clear of one node must not. */
        char err[1024];
        sluice_statefile_last_error(f, err, sizeof err);
        rc = fail("%s; sluicectl clears nothing in a file it cannot read: move it aside (or "
                  "pass --state with the right file) to start afresh",
                  err);
    } else if (!find.found) {
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
    /* An endpoint that predates the flag always cleared. */
    json_t *did = json_object_get(r, "cleared");
    bool cleared = !json_is_false(did);
    if (o->json) {
        print_json(n);
    } else {
        fputs(cleared ? "cleared: " : "already clear: ", stdout);
        put_clean(line ? line : "?", false, stdout);
        putchar('\n');
    }
    if (!cleared)
        /* Clearing is idempotent, as with --state: say so, and succeed. */
        fprintf(stderr,
                "%s: %s has no lock and has not moved since its last clear: nothing to clear\n",
                tool_name, node);
    json_decref(r);
    return EXIT_OK;
}

static int clear_in_redis(const struct opts *o, const char *node)
{
#ifdef SLUICE_HAVE_FLEET
    char err[512], max[16];
    if (sluice_fleet_clear_node(o->redis, node, err, sizeof err) == SLUICE_OK) {
        fprintf(stderr, "cleared %s for the fleet at %s\n", node, o->redis);
        return EXIT_OK;
    }
    /* The fleet's message speaks to a C caller. */
    snprintf(max, sizeof max, "%d", SLUICE_NODE_ID_MAX - 1);
    const char *const words[][2] = {
        {"sluice_fleet_desc.redis_url", "--redis URL"},
        {"sluice_fleet_desc.node_id", "NODE"},
        {"SLUICE_NODE_ID_MAX-1", max},
    };
    return fail_in_cli_words(err, words, sizeof words / sizeof *words);
#else
    (void)node;
    return fail("--redis %s: this sluicectl was built without the Redis fleet (hiredis)",
                o->redis);
#endif
}

int clear_cmd(const struct opts *o)
{
    if (o->n_pos != 1)
        return usage_error("clear needs a NODE, e.g. sluicectl clear cloud:default_ollama");
    return o->redis ? clear_in_redis(o, o->pos[0])
           : o->admin ? clear_in_admin(o, o->pos[0])
                      : clear_in_file(o, o->pos[0]);
}
