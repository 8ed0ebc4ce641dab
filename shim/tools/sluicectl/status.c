/*
 * status.c — `sluicectl status`: every node with its state glyph, ceiling and the
 * time left on its lock, from the state file or live from --admin.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

const char usage_status[] =
    "usage: sluicectl status [--json] [--state FILE | --admin URL]\n"
    "\n"
    "Every node with its state glyph, ceiling and the time left on its lock. A lock\n"
    "the file holds but sluice cannot have written (dated before 2000, or longer than\n"
    "any lock sluice makes) is shown as ⚠️ suspect with the reason, as an unreadable\n"
    "entry is shown as ⚠️ invalid; neither fails the command.\n"
    "\n"
    "  --state FILE   the state file (default: $XDG_STATE_HOME/sluice/ceilings.json,\n"
    "                 else ~/.local/state/sluice/ceilings.json)\n"
    "  --admin URL    ask a running process instead, e.g. http://127.0.0.1:8400:\n"
    "                 live in-flight counts, limits and states of every node, and the\n"
    "                 calls it refused (REFUSED: queue full, predicted late, out of time)\n"
    "  --json         print JSON instead of a table\n";

/* No lock sluice writes is dated before this (2000-01-01 UTC): an earlier time is a clock
 * that was never set, or a file edited by hand. */
#define SANE_EPOCH_S INT64_C(946684800)

/*
 * Why a record the file accepts cannot be right, or NULL: a date before 2000, or a lock
 * longer than discovery ever makes one (SLUICE_DISCOVERY_TTL_MAX_S), which a process
 * restoring it cuts to its lock_ttl_s. A record from an older sluice (locked_at 0) is
 * measured from now.
 */
static const char *lock_suspect(const struct sluice_lock_record *rec, int64_t now, char *buf,
                                size_t size)
{
    char when[32];
    int64_t from = rec->locked_at_s ? rec->locked_at_s : now;
    if (rec->expires_s < SANE_EPOCH_S || (rec->locked_at_s && rec->locked_at_s < SANE_EPOCH_S)) {
        bool expiry = rec->expires_s < SANE_EPOCH_S;
        format_time(expiry ? rec->expires_s : rec->locked_at_s, when, sizeof when);
        snprintf(buf, size,
                 "%s %s is before 2000: not a time sluice writes (a clock that was not set, or "
                 "a file edited by hand)",
                 expiry ? "expires_at" : "locked_at", when);
        return buf;
    }
    if (rec->expires_s - from > SLUICE_DISCOVERY_TTL_MAX_S) {
        format_time(rec->expires_s, when, sizeof when);
        snprintf(buf, size,
                 "a lock of %" PRId64 " days (to %s), longer than any sluice makes (%" PRId64
                 " days): a process restoring it cuts it to its lock_ttl_s",
                 (rec->expires_s - from) / 86400, when, SLUICE_DISCOVERY_TTL_MAX_S / 86400);
        return buf;
    }
    return NULL;
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
    char ceiling[16], left[32], locked[32], until[32], why[256];
    snprintf(ceiling, sizeof ceiling, "%" PRIu32, rec->ceiling);
    format_left(rec->expires_s - w->now, left, sizeof left);
    format_time(rec->locked_at_s, locked, sizeof locked);
    format_time(rec->expires_s, until, sizeof until);
    /* A suspect lock is a bad entry too: shown as one, with the figures it claims. */
    const char *suspect = lock_suspect(rec, w->now, why, sizeof why);
    json_object_set_new(o, "state", json_string(suspect ? "suspect" : live ? "locked" : "expired"));
    json_object_set_new(o, "glyph", json_string(suspect ? "⚠️" : live ? "🔒" : ""));
    if (suspect)
        json_object_set_new(o, "problem", json_string(suspect));
    json_object_set_new(o, "ceiling", json_integer(rec->ceiling));
    json_object_set_new(o, "locked_at", json_integer(rec->locked_at_s));
    json_object_set_new(o, "expires_at", json_integer(rec->expires_s));
    json_object_set_new(o, "lock_left_s", json_integer(live ? rec->expires_s - w->now : 0));
    json_object_set_new(o, "policy", json_string(rec->policy));
    json_array_append_new(w->nodes, o);
    const char *row[] = {node,
                         suspect ? "⚠️ suspect" : live ? "🔒 locked" : "expired",
                         ceiling,
                         suspect ? "-" : left,
                         suspect ? suspect : until,
                         rec->policy[0] ? rec->policy : "-"};
    table_add(&w->table, row);
    return 0;
}

static int status_from_file(const struct opts *o)
{
    struct sluice_statefile *f;
    if (open_state(o, NULL, &f) != EXIT_OK)
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

/* The deadline figures of one admin node (see the admin's node JSON): rates, queue wait,
 * lingering, and the start deadline of calls that name none. */
static void status_figures(json_t *n, char fig[7][24])
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
    /* The program's start deadline for calls that name none (sluice-proxy: configured or
     * learned from its clients' hang-ups). */
    json_t *start = json_object_get(n, "start_deadline_ms");
    const char *source = json_string_value(json_object_get(n, "start_deadline_source"));
    if (json_is_integer(start))
        snprintf(fig[6], 24, "%" JSON_INTEGER_FORMAT " ms %s", json_integer_value(start),
                 source ? source : "");
    else
        snprintf(fig[6], 24, "-");
}

/* A node's refused calls (the admin's counters): the total, then each reason that has any,
 * e.g. "5 (3 queue full, 2 out of time)". */
static void status_refused(json_t *n, char *buf, size_t size)
{
    static const char *const reasons[][2] = {
        {"refused_capacity_total", "queue full"},  /* no room to wait (SLUICE_ECAPACITY) */
        {"refused_early_total", "predicted late"}, /* would miss its deadline (SLUICE_ELATE) */
        {"refused_late_total", "out of time"},     /* too little time left to start */
    };
    enum { N = sizeof reasons / sizeof *reasons };
    json_int_t count[N], total = 0;
    for (int k = 0; k < N; k++)
        total += count[k] = json_integer_value(json_object_get(n, reasons[k][0]));
    int o = snprintf(buf, size, "%" JSON_INTEGER_FORMAT, total);
    for (int k = 0, shown = 0; k < N && total; k++)
        if (count[k] && o >= 0 && (size_t)o < size)
            o += snprintf(buf + o, size - (size_t)o, "%s%" JSON_INTEGER_FORMAT " %s",
                          shown++ ? ", " : " (", count[k], reasons[k][1]);
    if (total && o >= 0 && (size_t)o < size)
        snprintf(buf + o, size - (size_t)o, ")");
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
    t->cols = 13;
    const char *head[] = {"STATUS",     "STATE",     "CEILING",   "LOCK LEFT", "WAITING",
                          "REQ/S",      "429/S",     "TIMEOUTS/S", "REFUSED",  "QUEUE P50",
                          "QUEUE P99",  "LINGERING", "START DEADLINE"};
    table_add(t, head);
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        /* The status line already ends in the state's glyph: STATE is the word alone. */
        const char *state = json_string_value(json_object_get(n, "state"));
        char ceiling[24] = "-", left[32] = "-", waiting[24];
        json_int_t c = json_integer_value(json_object_get(n, "ceiling"));
        if (c > 0) {
            snprintf(ceiling, sizeof ceiling, "%" JSON_INTEGER_FORMAT, c);
            format_left(json_integer_value(json_object_get(n, "lock_left_s")), left, sizeof left);
        }
        snprintf(waiting, sizeof waiting, "%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_object_get(n, "waiting")));
        const char *line = json_string_value(json_object_get(n, "status_line"));
        char fig[7][24], refused[96];
        status_figures(n, fig);
        status_refused(n, refused, sizeof refused);
        const char *row[] = {line ? line : "?", state ? state : "?", ceiling, left,    waiting,
                             fig[0],            fig[1],              fig[2],  refused, fig[3],
                             fig[4],            fig[5],              fig[6]};
        table_add(t, row);
    }
    int rc = table_print(t);
    free(t);
    json_decref(s);
    return rc;
}

int status_cmd(const struct opts *o)
{
    return o->admin ? status_from_admin(o) : status_from_file(o);
}
