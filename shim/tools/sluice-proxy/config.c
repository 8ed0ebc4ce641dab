/*
 * config.c — --config FILE: many backends and their routes, in libconfig's
 * syntax (comments with # or //, typed values, groups and lists); see
 * sluice-proxy.conf.example beside this file for every field.
 *
 * Why libconfig: a well-kept Debian library (libconfig-dev) whose settings
 * remember their line, so every error names the file, the line and the
 * field ("proxy.conf:12: backends[1].active: ..."), and whose format has
 * comments. jansson (already a dependency) reads JSON, which has neither.
 *
 * Each field is one row of a table (its type, where it goes, its range),
 * walked by one loop; a field no row names is an error too, so a typo
 * never passes as a default. Flags given on the command line win over the
 * file's top-level settings.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef SLUICE_PROXY_HAVE_LIBCONFIG
#include <libconfig.h>

enum ftype { F_STR, F_U32, F_I64, F_BOOL, F_OPT_U32, F_DIALECT, F_KEY_HEADER, F_MODELS,
             F_HOST_PORT, F_LINGER, F_UNPOOLED };

struct field {
    const char *name;
    enum ftype type;
    size_t off;          /* in struct backend (backends' rows) or struct options */
    int64_t lo, hi;      /* numbers' range */
    size_t given_off;    /* options only: the flag that was given on the command line (bool) */
};

#define B(f) offsetof(struct backend, f)
static const struct field backend_fields[] = {
    {"id", F_STR, B(id), 0, 0, 0},
    {"upstream", F_STR, B(upstream), 0, 0, 0},
    {"prefix", F_STR, B(prefix), 0, 0, 0},
    {"header", F_STR, B(header), 0, 0, 0},
    {"header_value", F_STR, B(header_value), 0, 0, 0},
    {"models", F_MODELS, 0, 0, 0, 0},
    {"default", F_BOOL, B(is_default), 0, 0, 0},
    {"api_key_env", F_STR, B(key_env), 0, 0, 0},
    {"api_key_header", F_KEY_HEADER, B(key_header), 0, 0, 0},
    {"pass_client_key", F_BOOL, B(pass_client_key), 0, 0, 0},
    {"dialect", F_DIALECT, B(dialect), 0, 0, 0},
    {"active", F_U32, B(active), 1, SLUICE_POOL_ACTIVE_MAX, 0},
    {"waiting", F_OPT_U32, B(waiting), 0, SLUICE_POOL_WAITING_MAX, 0},
    {"discovery", F_BOOL, B(discovery), 0, 0, 0},
    {"jumpstart", F_U32, B(jumpstart), 1, SLUICE_POOL_ACTIVE_MAX, 0},
    {"min_limit", F_U32, B(min_limit), 1, SLUICE_POOL_ACTIVE_MAX, 0},
    {"lock_ttl_s", F_I64, B(lock_ttl_s), 1, INT64_C(10) * 366 * 86400, 0},
    {"deadline_ms", F_U32, B(deadline_ms), 1, 86400000, 0},
    {"start_deadline_ms", F_U32, B(start_deadline_ms), 1, 86400000, 0},
    {"start_quantile", F_OPT_U32, B(deadlines.start_quantile), 0, 50, 0},
    {"queue_late", F_BOOL, B(deadlines.queue_late), 0, 0, 0},
    {"linger", F_LINGER, B(deadlines.linger), 0, 0, 0},
    {"linger_max_ms", F_OPT_U32, B(deadlines.linger_max_ms), 0, SLUICE_POOL_LINGER_MAX_MS, 0},
    {"redis", F_STR, B(redis_url), 0, 0, 0},
    {"ca_file", F_STR, B(ca_file), 0, 0, 0},
    {"fleet_floor", F_U32, B(fleet_floor), 1, SLUICE_POOL_ACTIVE_MAX, 0},
    {"unpooled_paths", F_UNPOOLED, 0, 0, 0, 0},
};
#undef B

#define O(f) offsetof(struct options, f)
static const struct field option_fields[] = {
    {"listen", F_HOST_PORT, O(listen_host), 0, 0, O(listen_given)},
    {"admin", F_HOST_PORT, O(admin_host), 0, 0, O(admin_explicit)},
    {"state", F_STR, O(state), 0, 0, O(state_given)},
    {"access_log", F_STR, O(access_log), 0, 0, O(access_log_given)},
    {"log_json", F_BOOL, O(log_json), 0, 0, O(log_json)},
    {"max_header_bytes", F_U32, O(max_header_bytes), 1024, 1 << 20, 0},
    {"max_body_bytes", F_U32, O(max_body_bytes), 1, 1 << 30, 0},
    {"max_connections", F_U32, O(max_connections), 1, 1 << 20, 0},
    {"client_timeout_ms", F_U32, O(client_timeout_ms), 100, 3600000, 0},
    {"idle_timeout_ms", F_U32, O(idle_timeout_ms), 100, 3600000, 0},
    {"upstream_idle_ms", F_U32, O(upstream_idle_ms), 100, 86400000, 0},
    {"drain_ms", F_U32, O(drain_ms), 0, 3600000, 0},
    {"retry_after", F_U32, O(retry_after_s), 0, 3600, 0},
};
#undef O

struct ctx {
    const char *file;
    char where[96]; /* "backends[1]." or "" */
};

static int bad(const struct ctx *x, const config_setting_t *s, const char *name, const char *fmt,
               const char *detail)
{
    fprintf(stderr, PROG ": %s:%u: %s%s: ", x->file, config_setting_source_line(s), x->where,
            name);
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

static int set_number(const struct ctx *x, const config_setting_t *s, const struct field *f,
                      char *base)
{
    int t = config_setting_type(s);
    if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
        return bad(x, s, f->name, "must be a whole number%s", "");
    long long v = config_setting_get_int64(s);
    if (v < f->lo || v > f->hi) {
        char range[64];
        snprintf(range, sizeof range, " from %lld to %lld", (long long)f->lo, (long long)f->hi);
        return bad(x, s, f->name, "must be a whole number%s", range);
    }
    if (f->type == F_U32)
        *(uint32_t *)(base + f->off) = (uint32_t)v;
    else if (f->type == F_I64)
        *(int64_t *)(base + f->off) = (int64_t)v;
    else
        *(struct sluice_opt_u32 *)(base + f->off) = SLUICE_SOME((uint32_t)v);
    return EXIT_OK;
}

static char host_bufs[2][256], host_where[2][1024];

static int set_field(const struct ctx *x, const config_setting_t *s, const struct field *f,
                     char *base, struct backend *b)
{
    int t = config_setting_type(s);
    const char *str = t == CONFIG_TYPE_STRING ? config_setting_get_string(s) : NULL;
    switch (f->type) {
    case F_U32:
    case F_I64:
    case F_OPT_U32:
        return set_number(x, s, f, base);
    case F_BOOL:
        if (t != CONFIG_TYPE_BOOL)
            return bad(x, s, f->name, "must be true or false%s", "");
        *(bool *)(base + f->off) = config_setting_get_bool(s);
        return EXIT_OK;
    case F_STR:
        if (!str || !*str)
            return bad(x, s, f->name, "must be a non-empty string%s", "");
        if (b) {
            free(*(char **)(base + f->off));
            *(char **)(base + f->off) = strdup(str);
        } else {
            *(const char **)(base + f->off) = strdup(str); /* lives as long as the process */
        }
        return EXIT_OK;
    case F_HOST_PORT: {
        struct options *o = (struct options *)base;
        bool admin = f->off == offsetof(struct options, admin_host);
        if (str && admin && !strcmp(str, "off")) {
            o->admin_host = NULL;
            return EXIT_OK;
        }
        if (!str || !parse_host_port(str, admin ? &o->admin_host : &o->listen_host,
                                     admin ? &o->admin_port : &o->listen_port,
                                     host_bufs[admin], sizeof host_bufs[0]))
            return bad(x, s, f->name, "must be \"HOST:PORT\"%s", admin ? " or \"off\"" : "");
        /* The address is checked when it is bound (main.c): its errors name this line too. */
        snprintf(host_where[admin], sizeof host_where[0], "%s:%u: %s", x->file,
                 config_setting_source_line(s), f->name);
        *(admin ? &o->admin_where : &o->listen_where) = host_where[admin];
        /* A port the file names is as deliberate as the flag's: taken, it is an error, not a
         * fallback to a free port. */
        o->admin_explicit = o->admin_explicit || admin;
        return EXIT_OK;
    }
    case F_DIALECT: {
        /* Every name the library's table accepts, in its order: ", auto, generic, ..." */
#define DIALECT_NAME(name, text) ", " text
        static const char names[] = SLUICE_CURL_DIALECT_MAP(DIALECT_NAME);
#undef DIALECT_NAME
        char what[512];
        snprintf(what, sizeof what, "(%s): '%s'", names + 2, str ? str : "");
        if (!str || sluice_curl_dialect_parse(str, &b->dialect) != SLUICE_OK)
            return bad(x, s, f->name, "must name a dialect %s", what);
        return EXIT_OK;
    }
    case F_KEY_HEADER:
        if (str && !strcmp(str, "bearer"))
            b->key_header = KEY_BEARER;
        else if (str && !strcmp(str, "x-api-key"))
            b->key_header = KEY_X_API_KEY;
        else
            return bad(x, s, f->name, "must be \"bearer\" or \"x-api-key\"%s", "");
        return EXIT_OK;
    case F_LINGER: {
        static const enum sluice_linger modes[] = {SLUICE_LINGER_LEARNED, SLUICE_LINGER_ON,
                                                   SLUICE_LINGER_OFF};
        for (size_t i = 0; str && i < sizeof modes / sizeof modes[0]; i++)
            if (!strcmp(str, sluice_linger_name(modes[i]))) {
                b->deadlines.linger = modes[i];
                return EXIT_OK;
            }
        return bad(x, s, f->name, "must be \"learned\", \"on\" or \"off\"%s", "");
    }
    case F_MODELS: {
        int n = config_setting_length(s);
        if ((t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) || n < 1 || n > PROXY_MODELS_MAX)
            return bad(x, s, f->name, "must be a list of 1 to 64 model names: [\"a\", \"b\"]%s",
                       "");
        for (int i = 0; i < n; i++) {
            const char *m = config_setting_get_string_elem(s, i);
            if (!m || !*m)
                return bad(x, s, f->name, "must be a list of 1 to 64 model names%s", "");
            b->models[b->n_models++] = strdup(m);
        }
        return EXIT_OK;
    }
    case F_UNPOOLED: {
        int n = config_setting_length(s);
        if ((t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) || n > PROXY_UNPOOLED_MAX)
            return bad(x, s, f->name,
                       "must be a list of up to 64 paths: [\"/v1/files\"] ([] = none)%s", "");
        b->unpooled_owned = calloc((size_t)n + 1, sizeof *b->unpooled_owned);
        b->unpooled = (const char *const *)b->unpooled_owned;
        b->n_unpooled = 0;
        for (int i = 0; i < n; i++) {
            const char *path = config_setting_get_string_elem(s, i);
            if (!path || path[0] != '/')
                return bad(x, s, f->name,
                           "must be a list of paths starting with \"/\" (the path sent "
                           "upstream, the backend's prefix removed)%s",
                           "");
            b->unpooled_owned[b->n_unpooled++] = strdup(path);
        }
        return EXIT_OK;
    }
    }
    return EXIT_OK;
}

/* Every setting of group `g` through the table; an unknown name is an error. */
static int read_group(const struct ctx *x, const config_setting_t *g, const struct field *fields,
                      size_t n_fields, char *base, struct backend *b, const char *skip)
{
    for (int i = 0; i < config_setting_length(g); i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        const char *name = config_setting_name(s);
        if (skip && !strcmp(name, skip))
            continue;
        const struct field *f = NULL;
        for (size_t k = 0; k < n_fields && !f; k++)
            if (!strcmp(fields[k].name, name))
                f = &fields[k];
        if (!f)
            return bad(x, s, name, "is not a known setting%s", b ? " of a backend" : "");
        if ((f->given_off && *(bool *)(base + f->given_off)) ||
            (!b && options_flag_set((const struct options *)(const void *)base, f->off)))
            continue; /* the command line said otherwise */
        int rc = set_field(x, s, f, base, b);
        if (rc != EXIT_OK)
            return rc;
    }
    return EXIT_OK;
}

/* Where the backend group g sets `name`, or g itself when it leaves it to its default. */
static const config_setting_t *member_or(const config_setting_t *g, const char *name)
{
    const config_setting_t *s = config_setting_get_member(g, name);
    return s ? s : g;
}

/*
 * What one backend's fields cannot be together, or with an earlier backend's: a prefix that is
 * not a path, a header without its value (or the reverse), an id or a default two backends
 * claim, a route two backends claim (the same prefix, header value or model: the first would
 * take every request and the other none, with no word said), and a start deadline past the
 * whole call's. (The command line's one backend can break none of these: route.c does not
 * check them again.)
 */
static int check_backend(const struct ctx *x, const config_setting_t *g, const struct options *o,
                         size_t i)
{
    const struct backend *b = &o->backends[i];
    char why[512];
    if (!upstream_url_ok(b->upstream, why, sizeof why))
        return bad(x, member_or(g, "upstream"), "upstream", "%s", why);
    if (!backend_deadlines_ok(b, "deadline_ms", why, sizeof why))
        return bad(x, member_or(g, "start_deadline_ms"), "start_deadline_ms", "%s", why);
    if (b->prefix[0] != '/') {
        snprintf(why, sizeof why,
                 "\"%s\" must start with '/': it is the path's start, e.g. \"/%s\"", b->prefix,
                 b->prefix);
        return bad(x, member_or(g, "prefix"), "prefix", "%s", why);
    }
    if (!!b->header != !!b->header_value) {
        const char *given = b->header ? "header" : "header_value";
        return bad(x, member_or(g, given), given,
                   "needs %s too: a header route is header = \"X-Name\"; header_value = "
                   "\"value\";",
                   b->header ? "header_value" : "header");
    }
    bool by_prefix = !b->header && !b->n_models;
    for (size_t j = 0; j < i; j++) {
        const struct backend *e = &o->backends[j];
        if (!strcmp(e->id, b->id)) {
            snprintf(why, sizeof why,
                     "\"%s\" is backends[%zu]'s too: an id names one backend (its pool, its "
                     "node on the admin endpoint); give one of them another",
                     b->id, j);
            return bad(x, member_or(g, "id"), "id", "%s", why);
        }
        if (b->is_default && e->is_default) {
            snprintf(why, sizeof why,
                     "backends[%zu] (%s) is the default already: one backend serves what no "
                     "route matches; remove default = true from one of them",
                     j, e->id);
            return bad(x, member_or(g, "default"), "default", "%s", why);
        }
        if (by_prefix && !e->header && !e->n_models && !strcmp(e->prefix, b->prefix)) {
            snprintf(why, sizeof why,
                     "\"%s\"%s is backends[%zu]'s (%s) too: a path routes to one backend; give "
                     "one of them another prefix, or route it by header or models",
                     b->prefix, config_setting_get_member(g, "prefix") ? "" : " (the default)",
                     j, e->id);
            return bad(x, member_or(g, "prefix"), "prefix", "%s", why);
        }
        if (b->header && e->header && b->header_value && e->header_value &&
            !strcasecmp(b->header, e->header) && !strcmp(b->header_value, e->header_value)) {
            snprintf(why, sizeof why,
                     "%s: %s routes to backends[%zu] (%s) already; give one of them another "
                     "header_value",
                     b->header, b->header_value, j, e->id);
            return bad(x, member_or(g, "header_value"), "header_value", "%s", why);
        }
        for (size_t m = 0; m < b->n_models; m++)
            for (size_t k = 0; k < e->n_models; k++)
                if (!strcmp(b->models[m], e->models[k])) {
                    snprintf(why, sizeof why,
                             "\"%s\" is listed by backends[%zu] (%s) too: a model routes to "
                             "one backend; remove it from one of them",
                             b->models[m], j, e->id);
                    return bad(x, member_or(g, "models"), "models", "%s", why);
                }
    }
    return EXIT_OK;
}

static int read_backends(const struct ctx *top, const config_setting_t *list, struct options *o)
{
    int n = config_setting_length(list);
    if (!config_setting_is_list(list) || n < 1 || n > PROXY_BACKENDS_MAX)
        return bad(top, list, "backends", "must be a list of 1 to 64 groups: ( { ... }, { ... } )%s",
                   "");
    for (int i = 0; i < n; i++) {
        const config_setting_t *g = config_setting_get_elem(list, (unsigned)i);
        struct ctx x = {.file = top->file};
        snprintf(x.where, sizeof x.where, "backends[%d]", i);
        if (!config_setting_is_group(g))
            return bad(&x, g, "", "must be a group { id = ...; upstream = ...; }%s", "");
        snprintf(x.where, sizeof x.where, "backends[%d].", i);
        struct backend *b = &o->backends[o->n_backends++];
        backend_defaults(b);
        b->line = config_setting_source_line(g);
        int rc = read_group(&x, g, backend_fields, sizeof backend_fields / sizeof backend_fields[0],
                            (char *)b, b, NULL);
        if (rc != EXIT_OK)
            return rc;
        if (!b->id)
            return bad(&x, g, "id", "is required (the node ID, e.g. \"cloud:openai\")%s", "");
        if (!b->upstream)
            return bad(&x, g, "upstream", "is required (the provider's base URL)%s", "");
        if (!b->prefix)
            b->prefix = strdup("/");
        rc = check_backend(&x, g, o, (size_t)i);
        if (rc != EXIT_OK)
            return rc;
    }
    return EXIT_OK;
}

/* Why a file libconfig could not read cannot be read (libconfig keeps no errno): asked again. */
static const char *read_failure(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strerror(errno);
    errno = 0;
    int c = getc(f), err = errno; /* a directory opens, and its read fails (EISDIR) */
    fclose(f);
    return c == EOF && err ? strerror(err) : "an I/O error";
}

int config_load(const char *path, struct options *o)
{
    config_t cfg;
    config_init(&cfg);
    int rc = EXIT_OK;
    if (!config_read_file(&cfg, path)) {
        if (config_error_type(&cfg) == CONFIG_ERR_FILE_IO)
            rc = usage_error("--config %s: cannot read it: %s", path, read_failure(path));
        else
            rc = usage_error("%s:%d: %s", config_error_file(&cfg) ? config_error_file(&cfg) : path,
                             config_error_line(&cfg), config_error_text(&cfg));
        config_destroy(&cfg);
        return rc;
    }
    struct ctx x = {.file = path};
    const config_setting_t *root = config_root_setting(&cfg);
    const config_setting_t *backends = config_setting_get_member(root, "backends");
    if (!backends)
        rc = usage_error("%s: backends is required: backends = ( { id = \"cloud:x\"; upstream = "
                         "\"https://...\"; } );",
                         path);
    if (rc == EXIT_OK)
        rc = read_group(&x, root, option_fields, sizeof option_fields / sizeof option_fields[0],
                        (char *)o, NULL, "backends");
    if (rc == EXIT_OK)
        rc = read_backends(&x, backends, o);
    config_destroy(&cfg);
    return rc;
}

#else /* no libconfig */

int config_load(const char *path, struct options *o)
{
    (void)o;
    return usage_error("--config %s: this sluice-proxy was built without libconfig "
                       "(apt-get install libconfig-dev, then rebuild)",
                       path);
}

#endif
