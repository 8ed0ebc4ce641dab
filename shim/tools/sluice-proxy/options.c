/*
 * options.c — sluice-proxy's command line and its help; the quick-start
 * backend (--upstream), and the defaults every backend starts from.
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <stdlib.h>
#include <string.h>

#ifdef SLUICE_HAVE_FLEET
#include <sluice/fleet.h>
#endif

static const char usage_text[] =
    "usage: " PROG " --upstream URL [--node ID] [--listen HOST:PORT] [--admin HOST:PORT]\n"
    "                    [--state FILE] [options]\n"
    "       " PROG " --config FILE [options]\n"
    "\n"
    "A loopback HTTP/1.1 proxy that keeps a program's calls to a model provider inside\n"
    "the provider's concurrency cap, which sluice discovers, locks and persists. Point\n"
    "any client at it (an OpenAI SDK's baseURL = the printed URL + /v1). The first line\n"
    "on stdout is the URL it serves, the second the admin endpoint's.\n"
    "\n"
    "--node, --active, --waiting, --no-discovery, --deadline-ms, --start-deadline-ms,\n"
    "--api-key-env, --api-key-header, --upstream-ca, --redis and --fleet-floor set\n"
    "--upstream's one backend; with --config, each backend sets its own in FILE (id,\n"
    "active, ..., ca_file, redis, fleet_floor), and these flags are an error.\n"
    "\n"
    "  --upstream URL        the provider's base URL, http(s)://HOST[:PORT][/PATH]; a\n"
    "                        request's path is forwarded under it as it came\n"
    "                        (http://host:port/v1/chat/completions); a user:password@\n"
    "                        in it goes to the provider, shown as user:***@\n"
    "  --node ID             the backend's node ID (default " PROXY_NODE_DEFAULT ")\n"
    "  --active N            most calls in flight, discovery's upper bound (default 256)\n"
    "  --waiting N           calls queued beyond active (default 1024; 0 = none)\n"
    "  --no-discovery        a fixed limit at --active instead of discovering the cap\n"
    "  --deadline-ms MS      whole-call deadline when the client sends no\n"
    "                        " PROXY_DEADLINE_HEADER " (default: none)\n"
    "  --start-deadline-ms MS  start deadline when the client sends no\n"
    "                        " PROXY_START_DEADLINE_HEADER " (default: none, or the\n"
    "                        time at which clients give up, once they show one); at\n"
    "                        most --deadline-ms\n"
    "  --api-key-env VAR     send $VAR as the provider's key, replacing the client's\n"
    "  --api-key-header H    bearer (Authorization: Bearer, default) or x-api-key\n"
    "  --upstream-ca FILE    verify an https:// upstream against the CA certificates in\n"
    "                        FILE (PEM), as curl --cacert: a private CA, a TLS-inspecting\n"
    "                        gateway (default: the system's store)\n"
    "  --redis URL           share the cap with other proxies through Redis (the fleet):\n"
    "                        redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or HOST:PORT; while\n"
    "                        Redis is unreachable, a line on stderr and a store event, and\n"
    "                        the backend serves its share of the fleet's last limit (1 call\n"
    "                        at a time before Redis ever answered)\n"
    "  --fleet-floor N       with --redis: the least it serves while Redis is unreachable\n"
    "                        (default 1 call at a time; at most --active)\n"
    "  --config FILE         many backends and their routes (see the README); exit 2 on an\n"
    "                        error, naming file, line and field\n"
    "  --listen HOST:PORT    where to serve (default " PROXY_LISTEN_DEFAULT "; port 0 = any free)\n"
    "  --allow-remote        needed for a non-loopback --listen or --admin address (neither\n"
    "                        has authentication!)\n"
    "  --admin HOST:PORT|off the admin endpoint (default " PROXY_ADMIN_DEFAULT ", a free port\n"
    "                        if taken; port 0 = any free)\n"
    "  --state FILE|off      where discovered ceilings persist (default: the XDG state file,\n"
    "                        ~/.local/state/sluice/ceilings.json)\n"
    "  --access-log FILE|-|off  one line per request (default - = stderr): time, backend,\n"
    "                        method, path, status, outcome, times, bytes, the body's\n"
    "                        model= and the provider's request_id= (its x-request-id or\n"
    "                        request-id header, what an SDK's error shows), - for none\n"
    "  --log-json            access log as JSON Lines (\"model\", \"request_id\" likewise)\n"
    "  --max-header-bytes N  request line and headers (default 32768; 431 past it)\n"
    "  --max-body-bytes N    request body (default 8388608; 413 past it)\n"
    "  --max-connections N   client connections at once (default 4096); past it a new\n"
    "                        one is answered 503 with Retry-After, then closed\n"
    "  --client-timeout-ms MS  a request must arrive, and an answer be read, within this\n"
    "                        (default 30000)\n"
    "  --idle-timeout-ms MS  an idle kept-alive connection is closed after (default 60000)\n"
    "  --upstream-idle-ms MS  an upstream that sends nothing for this long (before its\n"
    "                        answer or within it), nor takes any of the request body, is\n"
    "                        cut: 502, and its permit is freed (default 600000, at least\n"
    "                        100; cut within 100 ms of it)\n"
    "  --drain-ms MS         SIGTERM: in-flight calls get this long (default 10000); a\n"
    "                        second signal stops at once, cutting what is left\n"
    "  --retry-after S       Retry-After on the proxy's own 503s (default 1), with\n"
    "                        retry-after-ms spread over 0.5-1.5 times it; a drain's\n"
    "                        503 says 0 (retry-after-ms 50-150: retry elsewhere now)\n"
    "  --help                this text\n"
    "\n"
    "Exit status: 0 after SIGTERM/SIGINT and a drain, 1 when it cannot start, 2 on a bad\n"
    "command line or configuration.\n";

/* The OpenAI and Anthropic endpoints that take a request and generate nothing while it runs:
 * uploads (slow: a large body), batch and fine-tuning jobs (queued for later), a token count. */
const char *const proxy_unpooled_default[] = {
    "/v1/files",       "/v1/uploads",          "/v1/batches",
    "/v1/fine_tuning", "/v1/messages/batches", "/v1/messages/count_tokens",
};
const size_t proxy_unpooled_default_n =
    sizeof proxy_unpooled_default / sizeof proxy_unpooled_default[0];

void backend_defaults(struct backend *b)
{
    *b = (struct backend){.active = PROXY_ACTIVE_DEFAULT, .discovery = true,
                          .dialect = SLUICE_CURL_DIALECT_AUTO, .unpooled = proxy_unpooled_default,
                          .n_unpooled = proxy_unpooled_default_n};
}

/* "HOST:PORT" (IPv6 as "[::1]:PORT") into host (copied to buf) and port. */
bool parse_host_port(const char *s, const char **host, unsigned *port, char *buf, size_t size)
{
    const char *colon = strrchr(s, ':');
    uint64_t p;
    if (!colon || colon == s || !tool_parse_u64(colon + 1, 65535, &p))
        return false;
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') {
        s++;
        hl -= 2;
    }
    if (hl >= size)
        return false;
    memcpy(buf, s, hl);
    buf[hl] = '\0';
    *host = buf;
    *port = (unsigned)p;
    return true;
}

static bool has_space_or_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f)
            return true;
    return false;
}

/*
 * `url` as a person or a client may see it: the password of a user:password@ in it replaced
 * by ***, e.g. http://user:***@host:8080/v1 (libcurl still sends the URL's credentials).
 * Returns buf, which holds what fits of it.
 */
const char *url_shown(const char *url, char *buf, size_t size)
{
    const char *sep = strstr(url, "://");
    const char *authority = sep ? sep + 3 : url, *end = authority + strcspn(authority, "/?#");
    const char *at = memrchr(authority, '@', (size_t)(end - authority));
    const char *colon = at ? memchr(authority, ':', (size_t)(at - authority)) : NULL;
    if (colon)
        snprintf(buf, size, "%.*s:***%s", (int)(colon - url), url, at);
    else
        snprintf(buf, size, "%s", url);
    return buf;
}

/*
 * An upstream base URL: http:// or https://, a host, a port from 1 to 65535 if any, a base
 * path if any, and no query or fragment (a request's path is appended to it). Else false, and
 * `why` quotes it, says what is wrong and what to write; the caller puts the flag or key the
 * user wrote before it.
 */
bool upstream_url_ok(const char *url, char *why, size_t size)
{
    static const char no_scheme[] = "has no scheme";
    const char *problem = NULL, *sep = strstr(url, "://");
    size_t scheme = sep ? (size_t)(sep - url) : 0;
    if (has_space_or_control(url))
        problem = "has a space or a control character";
    else if (!sep)
        problem = no_scheme;
    else if (!(scheme == 4 && !strncmp(url, "http", 4)) &&
             !(scheme == 5 && !strncmp(url, "https", 5)))
        problem = "is not http:// or https://";
    else if (strpbrk(url, "?#"))
        problem = "has a query or fragment (a request's path is appended to the URL)";
    if (!problem) {
        const char *host = sep + 3, *end = host + strcspn(host, "/");
        const char *at = memrchr(host, '@', (size_t)(end - host));
        if (at)
            host = at + 1; /* user:password@ */
        const char *host_end = end;
        if (*host == '[') {
            const char *bracket = memchr(host, ']', (size_t)(end - host));
            host_end = bracket ? bracket + 1 : end;
            if (!bracket || bracket == host + 1)
                problem = bracket ? "has no host" : "has an unclosed [ in its host";
            else if (host_end < end && *host_end != ':')
                problem = "has something after its [IPv6] host that is not :PORT";
        } else {
            host_end = memchr(host, ':', (size_t)(end - host));
            if (!host_end)
                host_end = end;
            if (host_end == host)
                problem = "has no host";
        }
        if (!problem && host_end < end) {
            char digits[8];
            uint64_t port = 0;
            size_t n = (size_t)(end - host_end - 1);
            if (n > 0 && n < sizeof digits) {
                memcpy(digits, host_end + 1, n);
                digits[n] = '\0';
                if (!tool_parse_u64(digits, 65535, &port))
                    port = 0;
            }
            if (!port)
                problem = "has a bad port (a whole number from 1 to 65535)";
        }
    }
    if (!problem)
        return true;
    char shown[1024];
    url_shown(url, shown, sizeof shown);
    if (problem == no_scheme)
        snprintf(why, size, "'%s' %s: write http://%s (or https://)", shown, problem, shown);
    else
        snprintf(why, size,
                 "'%s' %s: write http://HOST[:PORT][/PATH] or https://..., e.g. "
                 "http://127.0.0.1:11434 or https://api.openai.com",
                 shown, problem);
    return false;
}

#ifdef SLUICE_HAVE_FLEET
/* A Redis URL as the fleet reads it (no connection yet); else false, and `why` quotes it (a
 * password as ***) and says what is wrong; the caller puts the flag before it. */
static bool redis_url_ok(const char *url, char *why, size_t size)
{
    static const char field[] = "sluice_fleet_desc.redis_url";
    char err[512] = "", shown[512];
    struct sluice_fleet *f;
    if (sluice_fleet_create(&(struct sluice_fleet_desc){.redis_url = url,
                                                        .node_id = PROXY_NODE_DEFAULT,
                                                        .error = err, .error_size = sizeof err},
                            &f) == SLUICE_OK) {
        sluice_fleet_destroy(f);
        return true;
    }
    const char *what = strncmp(err, field, sizeof field - 1) ? err : err + sizeof field - 1;
    snprintf(why, size, "'%s': %s", url_shown(url, shown, sizeof shown), what + strspn(what, ": "));
    return false;
}
#endif

/* A backend's start deadline within its whole-call one; else false, and `why` says so, naming
 * the whole-call deadline as `whole` (the flag or key the user wrote). */
bool backend_deadlines_ok(const struct backend *b, const char *whole, char *why, size_t size)
{
    if (!b->deadline_ms || b->start_deadline_ms <= b->deadline_ms)
        return true;
    snprintf(why, size,
             "%u is longer than %s (%u): a call cannot start after it must have ended; make it "
             "at most %u, or raise %s",
             b->start_deadline_ms, whole, b->deadline_ms, b->deadline_ms, whole);
    return false;
}

/* The flags that set --upstream's one backend, and the key each backend of a --config file
 * takes in their place: given with --config, they would set nothing. */
static const struct {
    const char *flag, *key;
} upstream_only[] = {
    {"--node", "id = \"ID\";"},
    {"--active", "active = N;"},
    {"--waiting", "waiting = N;"},
    {"--no-discovery", "discovery = false;"},
    {"--deadline-ms", "deadline_ms = MS;"},
    {"--start-deadline-ms", "start_deadline_ms = MS;"},
    {"--api-key-env", "api_key_env = \"VAR\";"},
    {"--api-key-header", "api_key_header = \"x-api-key\";"},
    {"--upstream-ca", "ca_file = \"FILE\";"},
    {"--redis", "redis = \"redis://HOST:PORT\";"},
    {"--fleet-floor", "fleet_floor = N;"},
};

/* The row of upstream_only that `arg` (a flag, as `--flag` or `--flag=value`) is, else -1. */
static int upstream_only_flag(const char *arg)
{
    for (size_t i = 0; i < sizeof upstream_only / sizeof upstream_only[0]; i++) {
        size_t n = strlen(upstream_only[i].flag);
        if (!strncmp(arg, upstream_only[i].flag, n) && (!arg[n] || arg[n] == '='))
            return (int)i;
    }
    return -1;
}

/* A function, so that a bound of 0 draws no "always false" warning. */
static bool below(uint64_t v, uint64_t lo)
{
    return v < lo;
}

static char listen_buf[256], admin_buf[256];

/* The flag whose value is missing, for parse_options' last error. */
static const char *missing_value;

/* tool_flag_value, but a flag at the end, or followed by another flag (`--node --listen
 * 127.0.0.1:0`), has no value: it is not given the next flag as one. No value of any flag
 * starts with "--" ("--flag=--x" still says it is meant). */
static const char *flag_value(int argc, char **argv, int *i, const char *flag)
{
    if (!strcmp(argv[*i], flag) && (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2))) {
        missing_value = flag;
        return NULL;
    }
    return tool_flag_value(argc, argv, i, flag);
}

bool options_flag_set(const struct options *o, size_t offset)
{
    for (unsigned k = 0; k < o->n_flags_set; k++)
        if (o->flags_set[k] == offset)
            return true;
    return false;
}

/* The command line set the member of *o at `offset` (config.c asks: options_flag_set). */
static void flag_set(struct options *o, size_t offset)
{
    if (!options_flag_set(o, offset) &&
        o->n_flags_set < sizeof o->flags_set / sizeof o->flags_set[0])
        o->flags_set[o->n_flags_set++] = offset;
}

int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.access_log = "-", .max_header_bytes = 32768,
                          .max_body_bytes = 8u << 20, .max_connections = 4096,
                          .client_timeout_ms = 30000, .idle_timeout_ms = 60000,
                          .upstream_idle_ms = PROXY_UPSTREAM_IDLE_MS_DEFAULT,
                          .drain_ms = 10000, .retry_after_s = 1};
    parse_host_port(PROXY_LISTEN_DEFAULT, &o->listen_host, &o->listen_port, listen_buf,
                    sizeof listen_buf);
    parse_host_port(PROXY_ADMIN_DEFAULT, &o->admin_host, &o->admin_port, admin_buf,
                    sizeof admin_buf);
    struct backend quick;
    backend_defaults(&quick);
    const char *upstream = NULL, *node = PROXY_NODE_DEFAULT, *key_env = NULL, *key_header = NULL,
               *redis = NULL, *ca_file = NULL;
    uint64_t v;
    int backend_flag = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (backend_flag < 0)
            backend_flag = upstream_only_flag(a);
#define U64_FLAG_THEN(flag, lo, hi, dst, then)                                                     \
    if ((val = flag_value(argc, argv, &i, flag))) {                                                \
        if (!tool_parse_u64(val, hi, &v) || below(v, lo))                                          \
            return usage_error(flag " needs a whole number from %llu to %llu, got '%s'",           \
                               (unsigned long long)(lo), (unsigned long long)(hi), val);           \
        dst = v;                                                                                   \
        then;                                                                                      \
        continue;                                                                                  \
    }
#define U64_FLAG(flag, lo, hi, dst) U64_FLAG_THEN(flag, lo, hi, dst, (void)0)
/* A number of the whole proxy's, which its top-level setting in a config file does not undo. */
#define OPTION_FLAG(flag, lo, hi, field)                                                           \
    U64_FLAG_THEN(flag, lo, hi, o->field, flag_set(o, offsetof(struct options, field)))
#define STR_FLAG(flag, dst)                                                                        \
    if ((val = flag_value(argc, argv, &i, flag))) {                                                \
        dst = val;                                                                                 \
        continue;                                                                                  \
    }
#define BOOL_FLAG(flag, dst, value)                                                                \
    if (!strcmp(a, flag)) {                                                                        \
        dst = value;                                                                               \
        continue;                                                                                  \
    }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            exit(EXIT_OK);
        }
        BOOL_FLAG("--no-discovery", quick.discovery, false)
        BOOL_FLAG("--allow-remote", o->allow_remote, true)
        BOOL_FLAG("--log-json", o->log_json, true)
        STR_FLAG("--upstream", upstream)
        STR_FLAG("--node", node)
        STR_FLAG("--api-key-env", key_env)
        STR_FLAG("--api-key-header", key_header)
        STR_FLAG("--redis", redis)
        STR_FLAG("--upstream-ca", ca_file)
        STR_FLAG("--config", o->config)
        if ((val = flag_value(argc, argv, &i, "--state"))) {
            if (!*val) /* "$UNSET" expanded to nothing: not a wish to persist nothing */
                return usage_error("--state needs a file, or off for none (got '')");
            o->state = val;
            o->state_given = true;
            continue;
        }
        if ((val = flag_value(argc, argv, &i, "--access-log"))) {
            o->access_log = val;
            o->access_log_given = true;
            continue;
        }
        U64_FLAG("--active", 1, SLUICE_POOL_ACTIVE_MAX, quick.active)
        U64_FLAG("--fleet-floor", 1, SLUICE_POOL_ACTIVE_MAX, quick.fleet_floor)
        U64_FLAG("--deadline-ms", 1, 86400000, quick.deadline_ms)
        U64_FLAG("--start-deadline-ms", 1, 86400000, quick.start_deadline_ms)
        OPTION_FLAG("--max-header-bytes", 1024, 1u << 20, max_header_bytes)
        OPTION_FLAG("--max-body-bytes", 1, 1u << 30, max_body_bytes)
        OPTION_FLAG("--max-connections", 1, 1u << 20, max_connections)
        OPTION_FLAG("--client-timeout-ms", 100, 3600000, client_timeout_ms)
        OPTION_FLAG("--idle-timeout-ms", 100, 3600000, idle_timeout_ms)
        OPTION_FLAG("--upstream-idle-ms", 100, 86400000, upstream_idle_ms)
        OPTION_FLAG("--drain-ms", 0, 3600000, drain_ms)
        OPTION_FLAG("--retry-after", 0, 3600, retry_after_s)
        if ((val = flag_value(argc, argv, &i, "--waiting"))) {
            if (!tool_parse_u64(val, SLUICE_POOL_WAITING_MAX, &v))
                return usage_error("--waiting needs a whole number from 0 to %u, got '%s'",
                                   (unsigned)SLUICE_POOL_WAITING_MAX, val);
            quick.waiting = SLUICE_SOME((uint32_t)v);
            continue;
        }
        if ((val = flag_value(argc, argv, &i, "--listen"))) {
            if (!parse_host_port(val, &o->listen_host, &o->listen_port, listen_buf,
                                 sizeof listen_buf))
                return usage_error("--listen needs HOST:PORT (127.0.0.1:0 = any free port), "
                                   "got '%s'",
                                   val);
            o->listen_given = true;
            continue;
        }
        if ((val = flag_value(argc, argv, &i, "--admin"))) {
            o->admin_explicit = true;
            if (!strcmp(val, "off"))
                o->admin_host = NULL;
            else if (!parse_host_port(val, &o->admin_host, &o->admin_port, admin_buf,
                                      sizeof admin_buf))
                return usage_error("--admin needs HOST:PORT or off, got '%s'", val);
            continue;
        }
#undef OPTION_FLAG
#undef U64_FLAG
#undef U64_FLAG_THEN
#undef STR_FLAG
#undef BOOL_FLAG
        if (missing_value)
            return usage_error("%s needs a value", missing_value);
        return usage_error("unknown flag: '%s'", a);
    }
    if (!!upstream == !!o->config)
        return usage_error("give either --upstream URL (one backend) or --config FILE");
    if (o->config && backend_flag >= 0)
        return usage_error("%s sets --upstream's backend only; with --config, write %s in each "
                           "backend of %s it is meant for",
                           upstream_only[backend_flag].flag, upstream_only[backend_flag].key,
                           o->config);
    if (o->config) {
        int rc = config_load(o->config, o);
        if (o->state && !strcmp(o->state, "off"))
            o->state = "";
        return rc;
    }
    char why[512];
    if (!upstream_url_ok(upstream, why, sizeof why))
        return usage_error("--upstream %s", why);
    if (!backend_deadlines_ok(&quick, "--deadline-ms", why, sizeof why))
        return usage_error("--start-deadline-ms %s", why);
#ifdef SLUICE_HAVE_FLEET
    if (redis && !redis_url_ok(redis, why, sizeof why))
        return usage_error("--redis %s", why);
#endif
    if (o->state && !strcmp(o->state, "off"))
        o->state = "";
    if (!*node) /* the engine's "backends[0].id is empty" would name no flag, and exit 1 */
        return usage_error("--node needs a node ID such as cloud:openai (got '')");
    quick.id = strdup(node);
    quick.upstream = strdup(upstream);
    quick.prefix = strdup("/");
    quick.is_default = true;
    quick.key_env = key_env ? strdup(key_env) : NULL;
    quick.redis_url = redis ? strdup(redis) : NULL;
    quick.ca_file = ca_file ? strdup(ca_file) : NULL;
    if (key_header && !strcmp(key_header, "x-api-key"))
        quick.key_header = KEY_X_API_KEY;
    else if (key_header && strcmp(key_header, "bearer"))
        return usage_error("--api-key-header needs bearer or x-api-key, got '%s'", key_header);
    o->backends[0] = quick;
    o->n_backends = 1;
    return EXIT_OK;
}

void options_free(struct options *o)
{
    for (size_t i = 0; i < o->n_backends; i++) {
        struct backend *b = &o->backends[i];
        free(b->id);
        free(b->upstream);
        free(b->prefix);
        free(b->header);
        free(b->header_value);
        for (size_t m = 0; m < b->n_models; m++)
            free(b->models[m]);
        for (size_t m = 0; b->unpooled_owned && m < b->n_unpooled; m++)
            free(b->unpooled_owned[m]);
        free(b->unpooled_owned);
        free(b->key_env);
        free(b->key);
        free(b->redis_url);
        free(b->ca_file);
    }
}
