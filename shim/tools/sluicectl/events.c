/*
 * events.c — `sluicectl events NODE --admin URL [--follow] [--json | --human]`: a node's
 * event feed, once or followed over server-sent events until Ctrl-C: one line per event
 * for a person (on a terminal, or --human), JSON Lines for a program (--json, or when
 * stdout is not a terminal, as before the person's format existed).
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char usage_events[] =
    "usage: sluicectl events NODE --admin URL [--follow] [--json | --human]\n"
    "\n"
    "NODE's event feed from a running process, oldest first: every probe, backoff\n"
    "(with its cause), recovery, lock, expiry, restore, clear and store failure.\n"
    "One line per event on a terminal, ending with what its cause says:\n"
    "  14:02:07  #12  backoff  16 → 12   overload · 16 in flight · why: HTTP 429 or 503, ...\n"
    "\n"
    "  --admin URL    the process's admin endpoint, e.g. http://127.0.0.1:8400 (required)\n"
    "  --follow       keep the connection open and print new events as they happen\n"
    "                 (Ctrl-C to stop)\n"
    "  --json         JSON Lines, one object per event (the default when stdout is not a\n"
    "                 terminal)\n"
    "  --human        one line per event, as on a terminal, also into a pipe\n";

/* What the admin's event routes answer with (admin_routes.c, admin_stream.c): anything
 * else is not a sluice admin endpoint. */
#define EVENTS_TYPE "application/x-ndjson"
#define STREAM_TYPE "text/event-stream"

struct sse {
    CURL *curl;
    char line[8192];
    size_t len;
    bool overflow;
    long events;
    bool human;
    bool checked; /* its Content-Type is the stream's */
    bool foreign; /* it is not: the transfer was stopped */
};

/* Is the answer coming in on s->curl an event stream? Checked once, at its first bytes or
 * at its end, so that another server's endless page is not read for good. */
static bool sse_is_stream(struct sse *s)
{
    long http = 0;
    const char *type = NULL;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(s->curl, CURLINFO_CONTENT_TYPE, &type);
    s->checked = http != 200 || content_type_is(type, STREAM_TYPE);
    s->foreign = !s->checked;
    return s->checked;
}

/*
 * One event of the endpoint's JSON Lines, printed for a person: local time, seq, kind,
 * the limit's move, then the reason, in-flight count, the ceiling when locked and any
 * other text field the endpoint adds ("why: ..."), each after a dot. A line that is not
 * such an event is printed as it came, made terminal-safe.
 */
static void print_event_human(const char *line)
{
    json_t *e = json_loads(line, 0, NULL);
    const char *kind = json_string_value(json_object_get(e, "event"));
    if (!kind) {
        put_clean(line, false, stdout);
        putchar('\n');
        json_decref(e);
        return;
    }
    time_t t = (time_t)(json_integer_value(json_object_get(e, "wall_ms")) / 1000);
    struct tm tm;
    char when[32] = "--:--:--";
    if (localtime_r(&t, &tm)) /* with its zone, as every time sluicectl shows */
        strftime(when, sizeof when, "%H:%M:%S %Z", &tm);
    json_int_t from = json_integer_value(json_object_get(e, "old_limit")),
               to = json_integer_value(json_object_get(e, "new_limit"));
    char moved[48], seq[24];
    if (from != to)
        snprintf(moved, sizeof moved, "%" JSON_INTEGER_FORMAT " → %" JSON_INTEGER_FORMAT, from,
                 to);
    else
        snprintf(moved, sizeof moved, "at %" JSON_INTEGER_FORMAT, to);
    snprintf(seq, sizeof seq, "#%" JSON_INTEGER_FORMAT, json_integer_value(json_object_get(e, "seq")));
    printf("%s  ", when);
    print_cell(seq, 5);
    char *clean_kind = text_clean(kind, false); /* from the endpoint: never raw to a terminal */
    print_cell(clean_kind ? clean_kind : "?", 9);
    free(clean_kind);
    print_cell(moved, 10);
    const char *why = json_string_value(json_object_get(e, "reason")); /* NULL: none given */
    char *reason = why ? text_clean(why, false) : NULL;
    for (char *p = reason; p && *p; p++)
        if (*p == '_')
            *p = ' ';
    printf("%s · %" JSON_INTEGER_FORMAT " in flight", reason ? reason : "?",
           json_integer_value(json_object_get(e, "in_flight")));
    free(reason);
    json_int_t ceiling = json_integer_value(json_object_get(e, "ceiling"));
    if (ceiling > 0)
        printf(" · ceiling %" JSON_INTEGER_FORMAT, ceiling);
    static const char *const shown[] = {"event", "reason", "node"};
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        bool seen = false;
        for (size_t k = 0; k < sizeof shown / sizeof *shown; k++)
            seen |= !strcmp(key, shown[k]);
        if (!seen && json_is_string(v) && json_string_length(v)) {
            fputs(" · ", stdout);
            put_clean(key, false, stdout);
            fputs(": ", stdout);
            put_clean(json_string_value(v), false, stdout);
        }
    }
    putchar('\n');
    json_decref(e);
}

/* One event line from the endpoint, in the chosen format. */
static void print_event(const char *line, bool human)
{
    if (human) {
        print_event_human(line);
        return;
    }
    put_clean(line, false, stdout);
    putchar('\n');
}

static size_t sse_write(char *p, size_t size, size_t n, void *ctx)
{
    struct sse *s = ctx;
    if (!s->checked && !sse_is_stream(s))
        return 0; /* not sluice: stop reading */
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
            print_event(s->line + 6, s->human);
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

/* The feed as it is now: the endpoint's JSON Lines, made terminal-safe. */
static int events_once(const struct opts *o, const char *node, bool human)
{
    char *url = admin_url(o->admin, "/compute/concurrency/events", node, NULL);
    struct fetched f;
    admin_fetch("GET", url, &f);
    int rc = admin_answer_ok(o->admin, url, &f);
    if (rc == EXIT_OK)
        rc = admin_type_ok(url, f.content_type, EVENTS_TYPE);
    for (char *line = rc == EXIT_OK ? f.body : NULL, *end; line && *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end)
            end = line + strlen(line) - 1; /* the last line, unterminated */
        else
            *end = '\0';
        if (*line)
            print_event(line, human);
    }
    free(f.body);
    free(url);
    return rc;
}

/* The feed followed over server-sent events until the stream ends or Ctrl-C. */
static int events_follow(const struct opts *o, const char *node, bool human)
{
    char *url = admin_url(o->admin, "/compute/concurrency/events", node, "&follow=1");
    struct sse s = {.human = human};
    char error[CURL_ERROR_SIZE] = "";
    CURL *c = s.curl = curl_easy_init();
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
    const char *type = NULL;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type);
    /* An empty answer never reached sse_write: look now. */
    if (!s.checked && (rc == CURLE_OK || rc == CURLE_PARTIAL_FILE) && !interrupted)
        sse_is_stream(&s);
    int foreign = s.foreign ? admin_type_ok(url, type, STREAM_TYPE) : EXIT_OK;
    curl_easy_cleanup(c);
    free(url);
    if (foreign != EXIT_OK)
        return foreign;
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

int events_cmd(const struct opts *o)
{
    if (o->n_pos != 1)
        return usage_error("events needs a NODE");
    if (!o->admin)
        return usage_error("events needs --admin URL (a running process's admin endpoint)");
    if (o->json && o->human)
        return usage_error("events takes --json or --human, not both");
    bool human = o->human || (!o->json && isatty(STDOUT_FILENO));
    return o->follow ? events_follow(o, o->pos[0], human) : events_once(o, o->pos[0], human);
}
