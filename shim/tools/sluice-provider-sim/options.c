/*
 * options.c — sluice-provider-sim's command line: the help text, one
 * table of flags, and the checks that name the flag to fix.
 */
#define _GNU_SOURCE
#include "sim.h"

/* --dialect's names, in enum dialect's order. */
static const char *const dialect_names[] = {"none",     "openai",     "azure", "anthropic",
                                            "openrouter", "together", "groq",  "gemini"};

static void stream_usage(FILE *f)
{
    fputs("\n"
          "Streaming (server-sent events to calls whose body has \"stream\": true):\n"
          "  --stream            answer such calls with SSE; the mode's service time\n"
          "                      (--median-ms, --sigma) is then the time to first token\n"
          "  --token-ms X        time between tokens in ms (default 10)\n"
          "  --answer-tokens N   median answer length in tokens (default 16)\n"
          "  --answer-sigma X    lognormal shape of answer lengths (default 1; 0 = always N)\n"
          "  --token-bytes N     bytes of text per token, 1 to 16384 (default 4)\n"
          "  --stream-fail-after N  after N tokens send an error event with code 429\n"
          "                      (finish_reason \"error\") and end the stream\n"
          "  --stream-endless    never end the stream\n"
          "  --stream-end-ms X   end the answer's body X ms after its [DONE] (as a\n"
          "                      provider's last packet can come late; default 0)\n"
          "  --stream-stamp      each token's text is the CLOCK_MONOTONIC ns at which it was\n"
          "                      sent, zero-padded to --token-bytes (at least 20), so a client\n"
          "                      on this machine can time the delivery (sluice-bench)\n",
          f);
}

static void usage(FILE *f)
{
    fputs("usage: " PROG " [options]\n"
          "A loopback HTTP/1.1 server that behaves like an LLM provider with a hidden\n"
          "concurrency cap. Prints the bound port on stdout as the first line.\n"
          "\n"
          "  --port N            port on 127.0.0.1 (default 0: pick a free one)\n"
          "  --mode M            reject | queue | knee | rate | slow | drop (default reject)\n"
          "  --cap N             hidden concurrency cap (default 8; >= 1 in knee and slow\n"
          "                      mode, where it scales the slow-down; unused in rate mode)\n"
          "  --cap-at T:N        at time T after start, set the cap to N; T takes ms, s or m\n"
          "                      (default s), e.g. --cap-at 60s:52; repeatable\n"
          "  --median-ms X       median service time in ms (default 2000; 0 = answer at once)\n"
          "  --sigma X           lognormal shape of service times (default 0.4; 0 = always\n"
          "                      the median)\n"
          "  --retry-after S     reject and rate mode: send Retry-After: S (whole seconds)\n"
          "                      with each 429\n"
          "  --retry-after-date  send that Retry-After as an HTTP date (now + S) instead\n"
          "  --queue-bound N     queue mode: waiting calls past which it answers 503\n"
          "                      (default 2 x cap)\n"
          "  --queue-timeout MS  queue mode: a call that waited MS in the queue is answered\n"
          "                      503 (as HAProxy's timeout queue; default 0: it waits)\n"
          "  --abandoned A       hold | free: a call whose client hangs up mid-call keeps\n"
          "                      its slot until its service time ends (hold, as an LLM\n"
          "                      provider keeps generating) or frees it at once (default\n"
          "                      hold)\n"
          "  --knee-slope X      knee mode: slow-down per unit of overload; slow mode: per C\n"
          "                      calls in service (default 2)\n"
          "  --rate R            rate mode: calls accepted per window second (required, > 0)\n"
          "  --rate-window S     rate mode: the sliding window in seconds (default 1)\n"
          "  --seed N            seed of the service-time stream (default 1)\n"
          "  --dialect D         openai | azure | anthropic | openrouter | together | groq |\n"
          "                      gemini: answer with that family's rate-limit headers (rate\n"
          "                      mode), error bodies and codes (default: none)\n"
          "  --platform-at T:MS  from T after start, for MS milliseconds, refuse every call\n"
          "                      with the dialect's platform overload (Anthropic 529\n"
          "                      overloaded_error, a Together or Gemini 503); repeatable\n"
          "  --quota-at T:MS     the same with the dialect's quota refusal (OpenAI 429\n"
          "                      insufficient_quota, OpenRouter 402, Gemini limit: 0, ...)\n"
          "  --quiet             no per-second lines and no libmicrohttpd log on stderr\n"
          "  --help              this text\n"
          "\n"
          "Endpoints: POST " CHAT_PATH ", GET /stats, POST /stats/reset.\n"
          "Exit status: 0 after SIGTERM or SIGINT, 1 if it cannot start, 2 on a bad flag.\n",
          f);
    stream_usage(f);
}

/* One line on stderr naming the flag to fix, then exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see --help)\n", stderr);
    exit(2);
}

static uint32_t need_count(const char *flag, const char *v)
{
    uint64_t n;
    if (!tool_parse_u64(v, MAX_COUNT, &n))
        bad_usage("%s needs a whole number from 0 to 1000000, got '%s'", flag, v);
    return (uint32_t)n;
}

static double need_number(const char *flag, const char *v)
{
    double x;
    if (!tool_parse_double(v, 0, HUGE_VAL, &x))
        bad_usage("%s needs a number >= 0, got '%s'", flag, v);
    return x;
}

/* "T:N" with T = number + ms|s|m (default s). */
static struct cap_change need_cap_change(const char *v)
{
    struct cap_change c;
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    double unit = 1.0;
    if (!strncmp(end, "ms", 2)) {
        unit = 1e-3;
        end += 2;
    } else if (*end == 's' || *end == 'm') {
        unit = *end == 'm' ? 60.0 : 1.0;
        end++;
    }
    uint64_t cap;
    if (end == v || errno || !(t >= 0) || t * unit > 1e9 || *end != ':' ||
        !tool_parse_u64(end + 1, MAX_COUNT, &cap))
        bad_usage("--cap-at needs TIME:CAP such as 60s:52 or 1500ms:8, got '%s'", v);
    c.at_ns = (int64_t)(t * unit * 1e9);
    c.cap = (uint32_t)cap;
    return c;
}

static int cmp_change(const void *a, const void *b)
{
    const struct cap_change *x = a, *y = b;
    return (x->at_ns > y->at_ns) - (x->at_ns < y->at_ns);
}

/* 1 if `flag` is one of with_value[n_with], 0 if one of without[n_without], else -1. */
static int flag_in(const char *flag, const char *const *with_value, size_t n_with,
                   const char *const *without, size_t n_without)
{
    for (size_t i = 0; i < n_with; i++)
        if (!strcmp(flag, with_value[i]))
            return 1;
    for (size_t i = 0; i < n_without; i++)
        if (!strcmp(flag, without[i]))
            return 0;
    return -1;
}

/* The streaming flags: 1 if the flag takes a value, 0 if not, -1 if it is not one. */
static int stream_flag_takes_value(const char *flag)
{
    static const char *const with_value[] = {"--token-ms", "--answer-tokens", "--answer-sigma",
                                             "--token-bytes", "--stream-fail-after",
                                             "--stream-end-ms"};
    static const char *const without[] = {"--stream", "--stream-endless", "--stream-stamp"};
    return flag_in(flag, with_value, sizeof with_value / sizeof *with_value, without,
                   sizeof without / sizeof *without);
}

/* Apply a streaming flag (one stream_flag_takes_value knows). */
static void parse_stream_flag(const char *flag, const char *value, struct stream_options *st)
{
    if (!strcmp(flag, "--stream")) {
        st->on = true;
        return;
    }
    st->any = true;
    if (!strcmp(flag, "--stream-endless")) {
        st->endless = true;
    } else if (!strcmp(flag, "--stream-stamp")) {
        st->stamp = true;
    } else if (!strcmp(flag, "--token-ms")) {
        st->token_ms = need_number(flag, value);
        if (st->token_ms > 86400e3)
            bad_usage("%s needs milliseconds from 0 to 86400000, got '%s'", flag, value);
    } else if (!strcmp(flag, "--answer-tokens")) {
        st->answer_tokens = need_count(flag, value);
        if (st->answer_tokens < 1)
            bad_usage("%s needs a whole number from 1 to 1000000, got '%s'", flag, value);
    } else if (!strcmp(flag, "--answer-sigma")) {
        st->answer_sigma = need_number(flag, value);
        if (st->answer_sigma > 10)
            bad_usage("%s needs a number from 0 to 10, got '%s'", flag, value);
    } else if (!strcmp(flag, "--token-bytes")) {
        st->token_bytes = need_count(flag, value);
        if (st->token_bytes < 1 || st->token_bytes > MAX_TOKEN_BYTES)
            bad_usage("%s needs a whole number from 1 to %u, got '%s'", flag, MAX_TOKEN_BYTES,
                      value);
    } else if (!strcmp(flag, "--stream-fail-after")) {
        st->fail_after = need_count(flag, value);
        st->fail_set = true;
    } else if (!strcmp(flag, "--stream-end-ms")) {
        st->end_ms = need_number(flag, value);
        if (st->end_ms > 86400e3)
            bad_usage("%s needs milliseconds from 0 to 86400000, got '%s'", flag, value);
    }
}

static void stream_defaults(struct stream_options *st)
{
    st->token_ms = 10;
    st->answer_tokens = 16;
    st->answer_sigma = 1;
    st->token_bytes = 4;
}

/* Flags that need --stream, or each other's absence. */
static void check_stream_options(const struct stream_options *st)
{
    if (st->any && !st->on)
        bad_usage("--token-ms, --answer-tokens, --answer-sigma, --token-bytes, "
                  "--stream-fail-after, --stream-endless, --stream-end-ms and --stream-stamp "
                  "need --stream");
    if (st->fail_set && st->endless)
        bad_usage("--stream-fail-after and --stream-endless exclude each other");
    if (st->stamp && st->token_bytes < 20)
        bad_usage("--stream-stamp needs --token-bytes of at least 20 (a nanosecond time)");
}

/* 1 if the flag takes a value, 0 if not, -1 if there is no such flag. */
static int flag_takes_value(const char *flag)
{
    int stream = stream_flag_takes_value(flag);
    if (stream >= 0)
        return stream;
    static const char *const with_value[] = {"--port", "--mode", "--cap", "--cap-at",
                                             "--median-ms", "--sigma", "--retry-after",
                                             "--queue-bound", "--queue-timeout",
                                             "--abandoned", "--knee-slope", "--seed",
                                             "--rate", "--rate-window", "--dialect",
                                             "--platform-at", "--quota-at"};
    static const char *const without[] = {"--help", "-h", "--quiet", "--retry-after-date"};
    return flag_in(flag, with_value, sizeof with_value / sizeof *with_value, without,
                   sizeof without / sizeof *without);
}

/* --dialect, --platform-at, --quota-at (the flags flag_takes_value lists; nothing else). */
static void parse_dialect_option(const char *flag, const char *value, struct dialect_options *d)
{
    if (!strcmp(flag, "--dialect")) {
        for (size_t i = 1; i < sizeof dialect_names / sizeof dialect_names[0]; i++)
            if (!strcmp(value, dialect_names[i])) {
                d->id = (enum dialect)i;
                return;
            }
        bad_usage("%s needs openai, azure, anthropic, openrouter, together, groq or gemini, "
                  "got '%s'", flag, value);
    }
    bool platform = !strcmp(flag, "--platform-at");
    size_t *n = platform ? &d->n_platform : &d->n_quota;
    struct signal_span *spans = platform ? d->platform : d->quota;
    if (*n == MAX_SIGNAL_SPANS)
        bad_usage("%s is given more than %d times", flag, MAX_SIGNAL_SPANS);
    struct cap_change c = need_cap_change(value); /* T:N, N read as milliseconds */
    spans[*n].from_ns = c.at_ns;
    spans[(*n)++].until_ns = c.at_ns + (int64_t)c.cap * (NS_PER_S / 1000);
}

/* One flag of the main table (or of the stream and dialect tables it hands on to). */
static void parse_flag(const char *flag, const char *value, struct options *o)
{
    if (stream_flag_takes_value(flag) >= 0) {
        parse_stream_flag(flag, value, &o->stream);
    } else if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
        usage(stdout);
        exit(0);
    } else if (!strcmp(flag, "--quiet")) {
        o->quiet = true;
    } else if (!strcmp(flag, "--retry-after-date")) {
        o->retry_after_date = true;
    } else if (!strcmp(flag, "--port")) {
        uint64_t p;
        if (!tool_parse_u64(value, 65535, &p))
            bad_usage("%s needs a port from 0 to 65535, got '%s'", flag, value);
        o->port = (uint16_t)p;
    } else if (!strcmp(flag, "--mode")) {
        if (!sim_mode_parse(value, &o->model.mode))
            bad_usage("%s needs reject, queue, knee, rate, slow or drop, got '%s'", flag,
                      value);
    } else if (!strcmp(flag, "--cap")) {
        o->model.cap = need_count(flag, value);
    } else if (!strcmp(flag, "--cap-at")) {
        if (o->n_changes == MAX_CAP_CHANGES)
            bad_usage("%s is given more than %d times", flag, MAX_CAP_CHANGES);
        o->changes[o->n_changes++] = need_cap_change(value);
    } else if (!strcmp(flag, "--median-ms")) {
        o->model.median_s = need_number(flag, value) / 1e3;
    } else if (!strcmp(flag, "--sigma")) {
        o->model.sigma = need_number(flag, value);
    } else if (!strcmp(flag, "--retry-after")) {
        uint64_t s;
        if (!tool_parse_u64(value, 86400, &s))
            bad_usage("%s needs whole seconds from 0 to 86400, got '%s'", flag, value);
        o->model.retry_after_s = (double)s;
        o->retry_after_set = true;
    } else if (!strcmp(flag, "--queue-bound")) {
        o->model.queue_bound = need_count(flag, value);
        o->queue_bound_set = true;
    } else if (!strcmp(flag, "--queue-timeout")) {
        o->model.queue_timeout_s = need_number(flag, value) / 1e3;
        o->queue_timeout_set = true;
    } else if (!strcmp(flag, "--abandoned")) {
        if (!strcmp(value, "hold"))
            o->abandoned = ABANDONED_HOLD;
        else if (!strcmp(value, "free"))
            o->abandoned = ABANDONED_FREE;
        else
            bad_usage("%s needs hold or free, got '%s'", flag, value);
    } else if (!strcmp(flag, "--knee-slope")) {
        o->model.knee_slope = need_number(flag, value);
    } else if (!strcmp(flag, "--rate")) {
        o->model.rate_per_s = need_number(flag, value);
    } else if (!strcmp(flag, "--rate-window")) {
        o->model.rate_window_s = need_number(flag, value);
    } else if (!strcmp(flag, "--seed")) {
        if (!tool_parse_u64(value, UINT64_MAX, &o->seed))
            bad_usage("%s needs a whole number, got '%s'", flag, value);
    } else {
        parse_dialect_option(flag, value, &o->dialect);
    }
}

/* What no single flag can check: flags that need or exclude each other, and the
 * defaults that depend on others (--queue-bound on --cap, --rate-window). */
static void check_options(struct options *o)
{
    if ((o->dialect.n_platform || o->dialect.n_quota) && o->dialect.id == DIALECT_NONE)
        bad_usage("--platform-at and --quota-at need --dialect D: the refusal is the dialect's");
    if (!o->queue_bound_set)
        o->model.queue_bound = SIM_DEFAULT_QUEUE_BOUND(o->model.cap);
    check_stream_options(&o->stream);
    if (o->retry_after_date && !o->retry_after_set)
        bad_usage("--retry-after-date needs --retry-after S as well");
    if (o->retry_after_set && o->model.mode != SIM_REJECT && o->model.mode != SIM_RATE)
        bad_usage("--retry-after applies to --mode reject and rate only, not %s",
                  sim_mode_name(o->model.mode));
    if (o->queue_timeout_set && o->model.mode != SIM_QUEUE)
        bad_usage("--queue-timeout applies to --mode queue only, not %s",
                  sim_mode_name(o->model.mode));
    if (!(o->model.queue_timeout_s <= 86400))
        bad_usage("--queue-timeout needs milliseconds from 0 to 86400000");
    if ((o->model.rate_per_s > 0 || o->model.rate_window_s > 0) && o->model.mode != SIM_RATE)
        bad_usage("--rate and --rate-window apply to --mode rate only, not %s",
                  sim_mode_name(o->model.mode));
    if (o->model.mode == SIM_RATE) {
        if (!(o->model.rate_per_s > 0))
            bad_usage("--mode rate needs --rate R, the calls accepted per second (> 0)");
        if (o->model.rate_window_s == 0)
            o->model.rate_window_s = SIM_DEFAULT_RATE_WINDOW_S;
        if (!(o->model.rate_window_s >= 0.001 && o->model.rate_window_s <= 86400))
            bad_usage("--rate-window needs seconds from 0.001 to 86400");
        if (o->model.rate_per_s * o->model.rate_window_s > MAX_COUNT)
            bad_usage("--rate x --rate-window must be at most %u calls per window", MAX_COUNT);
    }
    /* The knee and slow formulas divide by the cap. */
    if (o->model.mode == SIM_KNEE || o->model.mode == SIM_SLOW) {
        bool zero = o->model.cap == 0;
        for (size_t i = 0; i < o->n_changes; i++)
            zero = zero || o->changes[i].cap == 0;
        if (zero)
            bad_usage("--cap must be at least 1 in %s mode (also in --cap-at)",
                      sim_mode_name(o->model.mode));
    }
}

void parse_options(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->model.mode = SIM_REJECT;
    o->model.cap = 8;
    o->model.median_s = SIM_DEFAULT_MEDIAN_S;
    o->model.sigma = SIM_DEFAULT_SIGMA;
    o->model.knee_slope = SIM_DEFAULT_KNEE_SLOPE;
    o->seed = 1;
    stream_defaults(&o->stream);
    for (int i = 1; i < argc; i++) {
        char flag[32];
        const char *a = argv[i], *eq = strchr(a, '=');
        const char *value = NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof flag)
            bad_usage("unknown flag '%s'", a);
        memcpy(flag, a, len);
        flag[len] = '\0';
        if (eq) /* --flag=value */
            value = eq + 1;
        int takes = flag_takes_value(flag);
        if (takes < 0)
            bad_usage("unknown flag '%s'", a);
        if (takes && !value) {
            if (i + 1 >= argc)
                bad_usage("%s needs a value", flag);
            value = argv[++i];
        } else if (!takes && value) {
            bad_usage("%s takes no value, got '%s'", flag, value);
        }
        parse_flag(flag, value, o);
    }
    check_options(o);
    qsort(o->changes, o->n_changes, sizeof o->changes[0], cmp_change);
}

