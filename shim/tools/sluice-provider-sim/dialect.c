/*
 * dialect.c — answering as one provider family would (--dialect): its
 * rate-limit headers, error bodies and codes, and the --platform-at and
 * --quota-at refusals.
 */
#define _GNU_SOURCE
#include "sim.h"

/* ---- answering in a dialect ----------------------------------------------------------- */

/* Which refusal span holds now: the platform's, the quota's, or none (NULL). */
static const char *signal_now(const struct server *sv)
{
    int64_t t = sim_clock_ns() - sv->t0_ns;
    const struct dialect_options *d = &sv->dialect;
    for (size_t i = 0; i < d->n_platform; i++)
        if (t >= d->platform[i].from_ns && t < d->platform[i].until_ns)
            return "platform";
    for (size_t i = 0; i < d->n_quota; i++)
        if (t >= d->quota[i].from_ns && t < d->quota[i].until_ns)
            return "quota";
    return NULL;
}

bool in_signal_span(const struct server *sv)
{
    return signal_now(sv) != NULL;
}

/* Count an answer given without the provider model (a refusal span). */
static void count_answer(struct server *sv, unsigned status)
{
    pthread_mutex_lock(&sv->lock);
    sv->total.requests++;
    sv->total.by_status[status]++;
    pthread_mutex_unlock(&sv->lock);
}

/* Anthropic's error envelope; the OpenAI-like one is error_body. */
static json_t *anthropic_error(const char *type, const char *message)
{
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                     message);
}

/* Google RPC's error envelope, with a RetryInfo delay when retry_s > 0. */
static json_t *gemini_error(int code, const char *status, const char *message, double retry_s)
{
    json_t *e = json_pack("{s:{s:i, s:s, s:s}}", "error", "code", code, "message", message,
                          "status", status);
    if (retry_s > 0) {
        char delay[32];
        snprintf(delay, sizeof delay, "%.3fs", retry_s);
        json_object_set_new(json_object_get(e, "error"), "details",
                            json_pack("[{s:s, s:s}]", "@type",
                                      "type.googleapis.com/google.rpc.RetryInfo", "retryDelay",
                                      delay));
    }
    return e;
}

/* Every call in a --platform-at or --quota-at span: the dialect's refusal. */
enum MHD_Result answer_signal(struct server *sv, struct MHD_Connection *conn)
{
    bool platform = !strcmp(signal_now(sv), "platform");
    enum dialect id = sv->dialect.id;
    unsigned status;
    json_t *body;
    if (platform) {
        status = id == DIALECT_ANTHROPIC ? 529 : 503;
        body = id == DIALECT_ANTHROPIC ? anthropic_error("overloaded_error", "Overloaded")
               : id == DIALECT_GEMINI
                   ? gemini_error(503, "UNAVAILABLE", "The model is overloaded.", 0)
                   : error_body("the platform is overloaded", "server_error", "overloaded");
        if (id == DIALECT_TOGETHER) /* a 503 at or below the dynamic rate */
            dialect_header("x-ratelimit-limit-dynamic", "%.0f", sv->model.rate_per_s);
    } else if (id == DIALECT_OPENROUTER || id == DIALECT_TOGETHER) {
        status = 402;
        body = error_body("Insufficient credits", "payment_required", "insufficient_credits");
    } else if (id == DIALECT_ANTHROPIC) {
        status = 400;
        body = anthropic_error("invalid_request_error", "Your credit balance is too low");
    } else if (id == DIALECT_GEMINI) {
        status = 429;
        body = gemini_error(429, "RESOURCE_EXHAUSTED",
                            "Quota exceeded for metric: generate_content_free_tier_requests, "
                            "limit: 0",
                            0);
    } else {
        status = 429;
        body = error_body("You exceeded your current quota, please check your plan and "
                          "billing details.",
                          "insufficient_quota", "insufficient_quota");
    }
    count_answer(sv, status);
    return respond_json(conn, status, body, NULL);
}

/* The rate-limit headers of `id` for a window with `left` calls left, whose oldest
 * acceptance leaves it in reset_s. Limits are stated per the family's documented window. */
static void dialect_rate_headers(const struct server *sv, uint32_t left, double reset_s)
{
    double rate = sv->model.rate_per_s;
    double reset_ms = ceil(reset_s * 1e3);
    switch (sv->dialect.id) {
    case DIALECT_OPENAI:
    case DIALECT_AZURE:
    case DIALECT_GROQ:
        if (sv->dialect.id != DIALECT_AZURE) /* Azure states what remains only */
            dialect_header("x-ratelimit-limit-requests", "%.0f",
                           rate * (sv->dialect.id == DIALECT_GROQ ? 86400 : 60));
        dialect_header("x-ratelimit-remaining-requests", "%" PRIu32, left);
        dialect_header("x-ratelimit-reset-requests", "%.0fms", reset_ms);
        break;
    case DIALECT_ANTHROPIC: {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        int64_t at_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + (int64_t)reset_ms;
        time_t at_s = (time_t)(at_ms / 1000);
        struct tm tm;
        gmtime_r(&at_s, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
        dialect_header("anthropic-ratelimit-requests-limit", "%.0f", rate * 60);
        dialect_header("anthropic-ratelimit-requests-remaining", "%" PRIu32, left);
        dialect_header("anthropic-ratelimit-requests-reset", "%s.%03dZ", stamp,
                       (int)(at_ms % 1000));
        break;
    }
    case DIALECT_OPENROUTER: {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        dialect_header("X-RateLimit-Limit", "%" PRIu32, sv->rate.slots);
        dialect_header("X-RateLimit-Remaining", "%" PRIu32, left);
        dialect_header("X-RateLimit-Reset", "%.0f",
                       (double)now.tv_sec * 1e3 + (double)(now.tv_nsec / 1000000) + reset_ms);
        break;
    }
    case DIALECT_TOGETHER:
        dialect_header("x-ratelimit-limit", "%.0f", rate);
        dialect_header("x-ratelimit-remaining", "%" PRIu32, left);
        dialect_header("x-ratelimit-reset", "%.3f", reset_ms / 1e3);
        dialect_header("x-ratelimit-limit-dynamic", "%.0f", rate);
        break;
    case DIALECT_GEMINI: /* no rate headers */
    case DIALECT_NONE:
        break;
    }
}

/* A served call (200) or a rate-mode refusal (429), as the dialect answers them. */
enum MHD_Result answer_in_dialect(struct server *sv, struct MHD_Connection *conn,
                                         struct req *r, int status)
{
    double reset_s = 0;
    if (sv->model.mode == SIM_RATE && r->rate_reset_ns) { /* the window when it refused */
        int64_t left_ns = r->rate_reset_ns - sim_clock_ns();
        reset_s = left_ns > 0 ? (double)left_ns / 1e9 : 0.0;
        dialect_rate_headers(sv, 0, reset_s);
    } else if (sv->model.mode == SIM_RATE) {
        pthread_mutex_lock(&sv->lock);
        uint32_t left = sim_rate_left(&sv->model, &sv->rate,
                                      (double)(sim_clock_ns() - sv->t0_ns) / 1e9, &reset_s);
        pthread_mutex_unlock(&sv->lock);
        dialect_rate_headers(sv, left, reset_s);
    }
    if (status == 200) /* a streamed answer streams in every dialect, with its headers */
        return r->stream ? respond_stream(sv, conn, r)
                         : respond_json(conn, 200, completion_body(r), NULL);
    enum dialect id = sv->dialect.id;
    char ra[32];
    const char *retry_after = NULL;
    if (id == DIALECT_ANTHROPIC || id == DIALECT_GROQ || id == DIALECT_AZURE) {
        snprintf(ra, sizeof ra, "%.0f", ceil(reset_s) > 0 ? ceil(reset_s) : 1);
        retry_after = ra;
    }
    if (id == DIALECT_AZURE)
        dialect_header("retry-after-ms", "%.0f", ceil(reset_s * 1e3));
    json_t *body =
        id == DIALECT_ANTHROPIC
            ? anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit")
        : id == DIALECT_GEMINI
            ? gemini_error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted.", reset_s)
            : error_body("Rate limit reached for requests", "requests", "rate_limit_exceeded");
    return respond_json(conn, 429, body, retry_after);
}

