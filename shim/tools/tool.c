/* tool.c — see tool.h. */
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

const char *tool_name;
volatile sig_atomic_t interrupted;

void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", tool_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_FAIL;
}

int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", tool_name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s --help)\n", tool_name);
    va_end(ap);
    return EXIT_USAGE;
}

/* See tool.h. */
int fail_in_cli_words(const char *msg, const char *const (*words)[2], size_t n_words)
{
    char out[1024];
    size_t o = 0;
    while (*msg) {
        const char *put = msg;
        size_t take = 1, skip = 1;
        for (size_t k = 0; k < n_words; k++)
            if (!strncmp(msg, words[k][0], strlen(words[k][0]))) {
                put = words[k][1];
                take = strlen(put);
                skip = strlen(words[k][0]);
                break;
            }
        if (o + take >= sizeof out)
            break;
        memcpy(out + o, put, take);
        o += take;
        msg += skip;
    }
    out[o] = '\0';
    return fail("%s", out);
}

/* See tool.h. */
int fail_state_open(const char *prefix, const char *err)
{
    static const char *const words[][2] = {
        {"sluice_statefile_desc.path", "--state"},
        {"or NULL for the default location", "or leave --state out for the default location"},
    };
    char msg[1024];
    snprintf(msg, sizeof msg, "%s%s%s", prefix ? prefix : "", prefix ? ": " : "", err);
    return fail_in_cli_words(msg, words, sizeof words / sizeof *words);
}

const char *tool_ca_file_problem(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strerror(errno);
    char line[256];
    bool pem = false;
    while (!pem && fgets(line, sizeof line, f))
        pem = !strncmp(line, "-----BEGIN CERTIFICATE-----", 27);
    fclose(f);
    return pem ? NULL : "holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)";
}

unsigned long tool_raise_fd_limit(unsigned long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < want && rl.rlim_cur < rl.rlim_max) {
        rlim_t to = rl.rlim_max < want ? rl.rlim_max : (rlim_t)want;
        struct rlimit raised = {to, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl.rlim_cur = to;
    }
    return (unsigned long)rl.rlim_cur;
}

size_t tool_discard(char *ptr, size_t size, size_t n, void *ctx)
{
    (void)ptr;
    (void)ctx;
    return size * n;
}

bool tool_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    /* strtoull alone would take " 5", "+5" and "-1" (as 2^64-1). */
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

bool tool_parse_double(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

const char *tool_flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n))
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] || *i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

void tool_print_causes(const struct sluice_event *events, size_t n, const char *indent,
                       int columns)
{
    bool seen[SLUICE_CAUSE_COUNT] = {false};
    bool any = false;
    int room = columns - (int)strlen(indent) - 2 - TOOL_CAUSE_COLUMN;
    for (size_t i = 0; i < n; i++) {
        enum sluice_cause cause = events[i].cause;
        if (cause == SLUICE_CAUSE_NONE || (unsigned)cause >= SLUICE_CAUSE_COUNT || seen[cause])
            continue;
        if (!any)
            printf("%swhat the causes mean:\n", indent);
        any = seen[cause] = true;
        printf("%s  %-*s", indent, TOOL_CAUSE_COLUMN, sluice_cause_name(cause));
        /* Word-wrapped: a word longer than the room gets a line of its own. */
        int used = 0;
        for (const char *w = sluice_cause_text(cause); *w;) {
            int len = (int)strcspn(w, " ");
            if (used && used + 1 + len > room) {
                printf("\n%s  %-*s", indent, TOOL_CAUSE_COLUMN, "");
                used = 0;
            }
            int gap = used ? 1 : 0;
            printf("%*s%.*s", gap, "", len, w);
            used += gap + len;
            w += len;
            w += strspn(w, " ");
        }
        putchar('\n');
    }
}
