/*
 * statefile_read.c — reading the state file and validating it: the whole
 * file (bounded by SLUICE_STATEFILE_MAX_BYTES), its top level (format,
 * version, nodes) and one node's entry, each refusal a message naming the
 * file and what is wrong.
 *
 * And the raw spans of a validated document, for keeping other nodes
 * byte-identical: jansson validates the whole file, but a rewrite does not
 * re-serialise what it parsed. A small scanner finds the raw byte span of
 * every member of "nodes" (and of unknown top-level members) in the
 * validated text, and the new file copies those spans verbatim around the
 * one entry being written (statefile_write.c).
 */
#define _GNU_SOURCE
#include "statefile_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int sluice__sf_read(struct sluice_statefile *f, struct sluice__sf_text *t)
{
    t->p = NULL;
    t->len = 0;
    /* O_NONBLOCK: a FIFO at the path must not block the open (with the
     * handle's mutex held) before fstat can refuse it. */
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT)
            return SLUICE_OK;
        return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot open: %s", f->path, strerror(errno));
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return sluice__sf_not_regular(f, f->path, &st);
    }
    size_t cap = (size_t)st.st_size + 1;
    if (cap > SLUICE_STATEFILE_MAX_BYTES + 1) {
        close(fd);
        return sluice__sf_fail(
            f, SLUICE_EINVAL,
            "%s: %lld bytes is over the %u-byte limit for a state file; it is treated "
            "as empty and the next save rewrites it",
            f->path, (long long)st.st_size, SLUICE_STATEFILE_MAX_BYTES);
    }
    t->p = malloc(cap);
    if (!t->p) {
        close(fd);
        return sluice__sf_fail(f, SLUICE_ENOMEM, "%s: out of memory reading it", f->path);
    }
    while (t->len < cap - 1) {
        ssize_t n = read(fd, t->p + t->len, cap - 1 - t->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            close(fd);
            free(t->p);
            t->p = NULL;
            return sluice__sf_fail(f, SLUICE_EIO, "%s: cannot read: %s", f->path, strerror(err));
        }
        if (n == 0)
            break;
        t->len += (size_t)n;
    }
    t->p[t->len] = '\0';
    close(fd);
    return SLUICE_OK;
}

#define SF_EMPTY_NOTE "; it is treated as empty and the next save rewrites it"
#define SF_KEPT_NOTE                                                                               \
    "; it is treated as empty and left as it is (saves fail until it is moved aside or the "    \
    "state file's path is changed)"

/* Why a JSON text is not a state file this sluice reads (in buf where it needs one), NULL if
 * it is one; *foreign: it is someone else's file or a newer sluice's, not a broken one. */
static const char *sf_top_problem(json_t *j, char *buf, size_t size, bool *foreign)
{
    json_t *format = json_object_get(j, "format"), *version = json_object_get(j, "version");
    *foreign = true;
    if (!json_is_object(j))
        return "the top level is not a JSON object";
    if (!json_is_string(format) || strcmp(json_string_value(format), SLUICE_STATEFILE_FORMAT))
        return "\"format\" is not \"" SLUICE_STATEFILE_FORMAT "\" (not a sluice state file?)";
    *foreign = json_is_integer(version) && json_integer_value(version) > SLUICE_STATEFILE_VERSION;
    if (!json_is_integer(version))
        return "\"version\" is missing or not an integer";
    if (json_integer_value(version) != SLUICE_STATEFILE_VERSION) {
        snprintf(buf, size,
                 "unknown version %" JSON_INTEGER_FORMAT " (this sluice reads version %d)",
                 json_integer_value(version), SLUICE_STATEFILE_VERSION);
        return buf;
    }
    if (!json_is_object(json_object_get(j, "nodes")))
        return "\"nodes\" is missing or not an object";
    *foreign = false;
    return NULL;
}

bool sluice__sf_foreign(const struct sluice__sf_text *t)
{
    if (!t->p || !t->len || memchr(t->p, '\0', t->len))
        return false;
    json_t *j = json_loadb(t->p, t->len, JSON_REJECT_DUPLICATES, NULL);
    char buf[160];
    bool foreign = false;
    if (j)
        sf_top_problem(j, buf, sizeof buf, &foreign);
    json_decref(j);
    return foreign;
}

int sluice__sf_parse(struct sluice_statefile *f, const struct sluice__sf_text *t, json_t **root)
{
    *root = NULL;
    if (t->len == 0)
        return sluice__sf_fail(f, SLUICE_EINVAL,
                               "%s: the file is empty (a torn write?)" SF_EMPTY_NOTE, f->path);
    /* jansson lets a NUL byte after a number pass, but the rewrite's span scanner stops at
     * it and would drop every member after it: no JSON text holds a raw NUL, so refuse. */
    if (memchr(t->p, '\0', t->len))
        return sluice__sf_fail(f, SLUICE_EINVAL,
                               "%s: not valid JSON (a NUL byte at offset %zu)" SF_EMPTY_NOTE,
                               f->path, (size_t)((const char *)memchr(t->p, '\0', t->len) - t->p));
    json_error_t e;
    json_t *j = json_loadb(t->p, t->len, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        return sluice__sf_fail(f, SLUICE_EINVAL,
                               "%s: not valid JSON (line %d, column %d: %s)" SF_EMPTY_NOTE, f->path,
                               e.line, e.column, e.text);
    char buf[160];
    bool foreign;
    const char *why = sf_top_problem(j, buf, sizeof buf, &foreign);
    if (why) {
        int status = sluice__sf_fail(f, SLUICE_EINVAL, "%s: %s%s", f->path, why,
                                     foreign ? SF_KEPT_NOTE : SF_EMPTY_NOTE);
        json_decref(j);
        return status;
    }
    *root = j;
    return SLUICE_OK;
}

static int64_t sf_now_s(const struct sluice_statefile *f)
{
    if (f->has_wall)
        return sluice_clock_now(&f->wall) / SLUICE_NS_PER_SEC;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

const char *sluice__sf_record(const struct sluice_statefile *f, json_t *o,
                              struct sluice_lock_record *rec, char *buf, size_t size)
{
    memset(rec, 0, sizeof *rec);
    if (!json_is_object(o))
        return "the entry is not an object";
    json_t *ceiling = json_object_get(o, "ceiling"), *locked = json_object_get(o, "locked_at");
    json_t *expires = json_object_get(o, "expires_at"), *policy = json_object_get(o, "policy");
    if (!json_is_integer(ceiling) || json_integer_value(ceiling) < 1 ||
        json_integer_value(ceiling) > UINT32_MAX)
        return "\"ceiling\" is missing or not an integer in 1..4294967295";
    if (!json_is_integer(locked) || json_integer_value(locked) < 0)
        return "\"locked_at\" is missing or not a non-negative integer (epoch seconds)";
    if (!json_is_integer(expires) || json_integer_value(expires) <= json_integer_value(locked))
        return "\"expires_at\" is missing, not an integer, or not after \"locked_at\"";
    if (!json_is_string(policy) || json_string_length(policy) >= SLUICE_POLICY_NAME_MAX)
        return "\"policy\" is missing, not a string, or longer than 31 bytes";
    int64_t ahead = (int64_t)json_integer_value(locked) - sf_now_s(f);
    if (ahead > SLUICE_DISCOVERY_SKEW_S) {
        snprintf(buf, size,
                 "\"locked_at\" is %" PRId64 " s in the future (a clock set back, or a file "
                 "from another machine)",
                 ahead);
        return buf;
    }
    rec->ceiling = (uint32_t)json_integer_value(ceiling);
    rec->locked_at_s = (int64_t)json_integer_value(locked);
    rec->expires_s = (int64_t)json_integer_value(expires);
    snprintf(rec->policy, sizeof rec->policy, "%s", json_string_value(policy));
    return NULL;
}

/* ---- raw spans of a validated document --------------------------------------------- */

size_t sluice__sf_skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (s[i] == '"')
        return skip_string(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < n) {
            char c = s[i];
            if (c == '"') {
                i = skip_string(s, i, n);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i]))
        i++;
    return i;
}

int sluice__sf_scan_members(const char *s, size_t i, size_t n, struct sluice__sf_member **out,
                            size_t *count)
{
    *out = NULL;
    *count = 0;
    size_t cap = 0;
    i = sluice__sf_skip_ws(s, i + 1, n);
    while (i < n && s[i] == '"') {
        struct sluice__sf_member m;
        m.k0 = i;
        m.k1 = skip_string(s, i, n);
        i = sluice__sf_skip_ws(s, m.k1, n) + 1; /* the ':' */
        m.v0 = sluice__sf_skip_ws(s, i, n);
        m.v1 = skip_value(s, m.v0, n);
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            struct sluice__sf_member *grown = realloc(*out, cap * sizeof *grown);
            if (!grown)
                return SLUICE_ENOMEM;
            *out = grown;
        }
        (*out)[(*count)++] = m;
        i = sluice__sf_skip_ws(s, m.v1, n);
        if (i < n && s[i] == ',')
            i = sluice__sf_skip_ws(s, i + 1, n);
    }
    return SLUICE_OK;
}

bool sluice__sf_member_is(const char *s, const struct sluice__sf_member *m, const char *key)
{
    json_t *k = json_loadb(s + m->k0, m->k1 - m->k0, JSON_DECODE_ANY, NULL);
    bool eq = json_is_string(k) && !strcmp(json_string_value(k), key);
    json_decref(k);
    return eq;
}
