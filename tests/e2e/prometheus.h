/*
 * prometheus.h — what the end-to-end tests check of a /metrics body: that it
 * parses as Prometheus text format 0.0.4 (prom_check), and one series' value
 * (prom_value). The admin's own families and a program's after them (the
 * desc.metrics of sluice/admin.h, sluice-proxy's) are held to the same rules.
 *
 * Everything is static: each test file gets its own copy.
 */
#ifndef SLUICE_TESTS_E2E_PROMETHEUS_H
#define SLUICE_TESTS_E2E_PROMETHEUS_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct family {
    char name[96];
    char type[16];
};

static inline bool metric_name_ok(const char *s, size_t n)
{
    if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    return true;
}

/*
 * Check `text` against the exposition format 0.0.4: # HELP / # TYPE lines,
 * samples `name{label="value",...} number`, TYPE before samples, known
 * types, valid names and escapes, no duplicate series, counters named
 * *_total. Returns the number of samples; fails the test on the first error.
 */
static inline int prom_check(const char *text)
{
    struct family fam[64];
    int n_fam = 0, samples = 0;
    static char seen[512][256];
    int n_seen = 0;
    const char *p = text;
    int lineno = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        cr_assert_not_null(eol, "line %d does not end in \\n", lineno + 1);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(eol - p), p);
        lineno++;
        p = eol + 1;
        if (!line[0])
            continue;
        if (line[0] == '#') {
            char kw[8], name[96], rest[16] = "";
            int got = sscanf(line, "# %7s %95s %15[^\n]", kw, name, rest);
            if (got >= 2 && !strcmp(kw, "TYPE")) {
                cr_assert(metric_name_ok(name, strlen(name)), "line %d: bad name %s", lineno, name);
                cr_assert(!strcmp(rest, "gauge") || !strcmp(rest, "counter") ||
                              !strcmp(rest, "untyped") || !strcmp(rest, "histogram") ||
                              !strcmp(rest, "summary"),
                          "line %d: bad type %s", lineno, rest);
                for (int i = 0; i < n_fam; i++)
                    cr_assert(strcmp(fam[i].name, name), "line %d: TYPE %s twice", lineno, name);
                cr_assert_lt(n_fam, 64);
                snprintf(fam[n_fam].name, sizeof fam[n_fam].name, "%s", name);
                snprintf(fam[n_fam].type, sizeof fam[n_fam].type, "%s", rest);
                if (!strcmp(rest, "counter"))
                    cr_assert(strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total"),
                              "line %d: counter %s must end in _total", lineno, name);
                n_fam++;
            }
            continue;
        }
        size_t nl = strcspn(line, "{ ");
        cr_assert(metric_name_ok(line, nl), "line %d: bad metric name: %s", lineno, line);
        bool typed = false;
        for (int i = 0; i < n_fam; i++) {
            size_t fl = strlen(fam[i].name);
            typed |= fl == nl && !strncmp(fam[i].name, line, nl);
            /* A histogram's samples are its _bucket (with le), _sum and _count series. */
            if (!strcmp(fam[i].type, "histogram") && nl > fl && !strncmp(fam[i].name, line, fl))
                typed |= (nl - fl == 7 && !strncmp(line + fl, "_bucket", 7)) ||
                         (nl - fl == 4 && !strncmp(line + fl, "_sum", 4)) ||
                         (nl - fl == 6 && !strncmp(line + fl, "_count", 6));
        }
        cr_assert(typed, "line %d: sample before its TYPE: %s", lineno, line);
        const char *q = line + nl;
        if (*q == '{') {
            q++;
            while (*q != '}') {
                size_t ln = strcspn(q, "=");
                cr_assert(metric_name_ok(q, ln) && q[ln] == '=' && q[ln + 1] == '"',
                          "line %d: bad label: %s", lineno, line);
                q += ln + 2;
                while (*q && *q != '"') {
                    if (*q == '\\') {
                        cr_assert(q[1] == '\\' || q[1] == '"' || q[1] == 'n',
                                  "line %d: bad escape", lineno);
                        q++;
                    }
                    q++;
                }
                cr_assert_eq(*q, '"', "line %d: unterminated label value", lineno);
                q++;
                if (*q == ',')
                    q++;
                else
                    cr_assert_eq(*q, '}', "line %d: labels: %s", lineno, line);
            }
            q++;
        }
        cr_assert_eq(*q, ' ', "line %d: no space before the value: %s", lineno, line);
        char series[256];
        snprintf(series, sizeof series, "%.*s", (int)(q - line), line);
        for (int i = 0; i < n_seen; i++)
            cr_assert(strcmp(seen[i], series), "line %d: duplicate series %s", lineno, series);
        cr_assert_lt(n_seen, 512);
        snprintf(seen[n_seen++], sizeof seen[0], "%s", series);
        q++;
        char *end;
        double v = strtod(q, &end);
        cr_assert(end != q && (*end == '\0' || *end == ' '), "line %d: bad value: %s", lineno, line);
        cr_assert(!isnan(v) || !strcmp(q, "NaN"), "line %d", lineno);
        samples++;
    }
    return samples;
}

/* The value of one series, e.g. `sluice_ceiling{node="cloud:locked"}`; NAN if absent. */
static inline double prom_value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

#endif /* SLUICE_TESTS_E2E_PROMETHEUS_H */
