/*
 * log.c — the access log: one line per request, when its answer is queued
 * (or its client left): time, backend, method, path (without the query
 * string, where some providers put keys), status, outcome, queue wait, time
 * to first byte, duration, body bytes sent (of the proxy's own answers
 * too), the request body's top-level "model" and the upstream answer's
 * request id (x-request-id, or Anthropic's request-id: what an SDK's
 * error shows, so that one can be found here), "-" for either when there
 * is none, and for the time to first byte of an answer whose client left
 * before any of it went out (JSON: null). Plain text, or JSON Lines with
 * --log-json. No other header is logged, so no key is. The status is
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

/* p's len bytes, as far as a `stop` byte (the path's query string), with what JSON or a
 * terminal cannot take escaped, and in the text log a space too (it separates the fields). */
static void put_escaped(FILE *f, const char *p, size_t len, char stop, bool text)
{
    for (size_t i = 0; i < len && p[i] != stop; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f || (text && ch == ' '))
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* A value the client or the upstream sent (a model, a request id), "-" when none. */
static void put_value(FILE *f, const char *v, bool text)
{
    if (v && *v)
        put_escaped(f, v, strlen(v), '\0', text);
    else
        fputc('-', f);
}

/* The queue wait, the time to first byte and the duration, in ms, each after its label; "-"
 * (JSON: null) for one there is none of: an answer of which no byte went out (its client left
 * first) has no time to first byte. */
static void put_times(FILE *f, const struct access *a, bool text)
{
    static const char *const label[2][3] = {
        {",\"queued_ms\":", ",\"ttfb_ms\":", ",\"duration_ms\":"},
        {" queued=", " ttfb=", " duration="}};
    const int64_t ns[3] = {a->queued_ns, a->ttfb_ns, a->duration_ns};
    for (int i = 0; i < 3; i++) {
        fputs(label[text][i], f);
        if (ns[i] >= 0)
            fprintf(f, text ? "%.3fms" : "%.3f", (double)ns[i] / 1e6);
        else
            fputs(text ? "-" : "null", f);
    }
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
        put_escaped(f, a->path ? a->path : "", a->path ? a->path_len : 0, '?', false);
        fprintf(f, "\",\"status\":%d,\"outcome\":\"%s\"", a->status, outcome);
        put_times(f, a, false);
        fprintf(f, ",\"bytes\":%llu,\"model\":\"", (unsigned long long)a->bytes);
        put_value(f, a->model, false);
        fputs("\",\"request_id\":\"", f);
        put_value(f, a->request_id, false);
        fputs("\"}\n", f);
    } else {
        fprintf(f, "%s %s \"%.*s ", when, backend, ml, method);
        put_escaped(f, a->path ? a->path : "-", a->path ? a->path_len : 1, '?', true);
        fprintf(f, "\" %d %s", a->status, outcome);
        put_times(f, a, true);
        fprintf(f, " bytes=%llu model=", (unsigned long long)a->bytes);
        put_value(f, a->model, true);
        fputs(" request_id=", f);
        put_value(f, a->request_id, true);
        fputc('\n', f);
    }
}
