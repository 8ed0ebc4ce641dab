/*
 * events.c — `sluicectl events NODE --admin URL [--follow]`: a node's event feed as
 * JSON Lines, once or followed over server-sent events until Ctrl-C.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char usage_events[] =
    "usage: sluicectl events NODE --admin URL [--follow]\n"
    "\n"
    "NODE's event feed from a running process, as JSON Lines, oldest first:\n"
    "every probe, backoff (with its cause), recovery, lock, expiry, restore and clear.\n"
    "\n"
    "  --admin URL    the process's admin endpoint, e.g. http://127.0.0.1:8400 (required)\n"
    "  --follow       keep the connection open and print new events as they happen\n"
    "                 (Ctrl-C to stop)\n";

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

/* The feed as it is now: the endpoint's JSON Lines, made terminal-safe. */
static int events_once(const struct opts *o, const char *node)
{
    char *url = admin_url(o->admin, "/compute/concurrency/events", node, NULL);
    struct fetched f;
    admin_fetch("GET", url, &f);
    int rc = admin_answer_ok(o->admin, url, &f);
    if (rc == EXIT_OK && f.body)
        put_clean(f.body, true, stdout);
    free(f.body);
    free(url);
    return rc;
}

/* The feed followed over server-sent events until the stream ends or Ctrl-C. */
static int events_follow(const struct opts *o, const char *node)
{
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

int events_cmd(const struct opts *o)
{
    if (o->n_pos != 1)
        return usage_error("events needs a NODE");
    if (!o->admin)
        return usage_error("events needs --admin URL (a running process's admin endpoint)");
    return o->follow ? events_follow(o, o->pos[0]) : events_once(o, o->pos[0]);
}
