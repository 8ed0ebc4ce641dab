/*
 * log.c — the access log: one line per request, when its answer is queued
 * (or its client left): time, backend, method, path (without the query
 * string, where some providers put keys), status, outcome, queue wait, time
 * to first byte, duration, body bytes sent (of the proxy's own answers
 * too). Plain text, or JSON Lines with --log-json. Headers are never
 * logged, so neither are keys. The status is
 * what the client got, the outcome what the call was: a stream the provider
 * ended with a rate-limit error event is "200 overloaded" (upstream.c).
 *
 * The stream is fully buffered and flushed by main.c's loop when it goes
 * idle (and at least every LOG_FLUSH_MS), so a busy proxy does not pay a
 * write per request.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <string.h>
#include <time.h>

/* The path as far as its query string, with what JSON or a terminal cannot take escaped. */
static void put_path(FILE *f, const char *p, size_t len)
{
    for (size_t i = 0; i < len && p[i] != '?'; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

static double ms(int64_t ns)
{
    return ns < 0 ? -1 : (double)ns / 1e6;
}

void access_log(struct proxy *p, const struct access *a)
{
    FILE *f = p->log;
    if (!f)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
    const char *backend = a->backend ? a->backend->id : "-";
    const char *method = a->method ? a->method : "-";
    int ml = a->method ? (int)a->method_len : 1;
    const char *outcome = a->outcome ? a->outcome : "-";
    if (p->o->log_json) {
        fprintf(f, "{\"time\":\"%s\",\"backend\":\"%s\",\"method\":\"%.*s\",\"path\":\"", when,
                backend, ml, method);
        put_path(f, a->path ? a->path : "", a->path ? a->path_len : 0);
        fprintf(f,
                "\",\"status\":%d,\"outcome\":\"%s\",\"queued_ms\":%.3f,\"ttfb_ms\":%.3f,"
                "\"duration_ms\":%.3f,\"bytes\":%llu}\n",
                a->status, outcome, ms(a->queued_ns), ms(a->ttfb_ns), ms(a->duration_ns),
                (unsigned long long)a->bytes);
    } else {
        fprintf(f, "%s %s \"%.*s ", when, backend, ml, method);
        put_path(f, a->path ? a->path : "-", a->path ? a->path_len : 1);
        fprintf(f, "\" %d %s queued=%.3fms ttfb=%.3fms duration=%.3fms bytes=%llu\n", a->status,
                outcome, ms(a->queued_ns), ms(a->ttfb_ns), ms(a->duration_ns),
                (unsigned long long)a->bytes);
    }
}
