/*
 * curl_perform.c — the blocking call: sluice_curl_perform and the transfer
 * it shares with the built-in client (sluice_curl_transfer).
 *
 * Why not curl_easy_perform: a token must abort a transfer within
 * milliseconds, and curl_easy_perform's internal wait only wakes for
 * socket activity or after up to a second, which is when it would call the
 * xferinfo callback that checks the token. So the transfer runs on a
 * curl_multi private to the calling thread, waited on with curl_multi_poll,
 * and the token's hook calls curl_multi_wakeup: the loop wakes, runs
 * curl_multi_perform, libcurl calls the xferinfo callback, which sees the
 * token and aborts. The multi is kept per thread between calls, so its
 * connection cache gives keep-alive reuse across calls and easy handles
 * (curl_easy_perform only reuses within one handle).
 */
#include "curl_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the per-thread multi ---------------------------------------------------- */

static pthread_key_t sluice__tl_key;
static pthread_once_t sluice__tl_once = PTHREAD_ONCE_INIT;
static _Thread_local CURLM *sluice__tl_multi;
static _Thread_local bool sluice__tl_busy;

static void sluice__tl_free(void *multi)
{
    curl_multi_cleanup((CURLM *)multi);
}

static void sluice__tl_make_key(void)
{
    pthread_key_create(&sluice__tl_key, sluice__tl_free);
}

/* The calling thread's multi; NULL when libcurl cannot allocate one. */
static CURLM *sluice__thread_multi(void)
{
    if (!sluice__tl_multi) {
        pthread_once(&sluice__tl_once, sluice__tl_make_key);
        sluice__tl_multi = curl_multi_init();
        if (sluice__tl_multi)
            pthread_setspecific(sluice__tl_key, sluice__tl_multi);
    }
    return sluice__tl_multi;
}

/* ---- shared with the loop ------------------------------------------------------ */

void sluice__curl_result_init(struct sluice_curl_result *res)
{
    memset(res, 0, sizeof *res);
    res->kind = SLUICE_CURL_ABORTED;
    res->outcome = SLUICE_OUTCOME_IGNORE;
    res->curl_code = CURLE_OK;
    struct sluice_curl_budget none = {-1, -1, -1, -1, SLUICE_CURL_WINDOW_UNKNOWN};
    res->ratelimit.source = SLUICE_CURL_DIALECT_AUTO;
    res->ratelimit.requests = res->ratelimit.tokens = none;
}

int sluice__curl_check_deadlines(const struct timespec *start_deadline,
                                 const struct timespec *deadline, struct sluice_curl_result *res)
{
    int status = sluice_deadline_check(deadline, "deadline", res->error, sizeof res->error);
    return status == SLUICE_OK
               ? sluice_deadline_check(start_deadline, "start_deadline", res->error,
                                       sizeof res->error)
               : status;
}

void sluice__curl_explain_timeout(struct sluice_curl_result *res, const struct timespec *deadline,
                                  int64_t made_ns)
{
    if (res->status != SLUICE_ETIMEDOUT || res->transferred || res->error[0] || !deadline)
        return;
    int64_t late_ms = (made_ns - sluice_timespec_ns(deadline)) / SLUICE_NS_PER_MS;
    const char *which = res->expired == SLUICE_EXPIRED_START ? "start deadline" : "deadline";
    if (late_ms >= 0)
        snprintf(res->error, sizeof res->error,
                 "the %s had already passed when the call was made (%lld ms before; it is an "
                 "absolute CLOCK_MONOTONIC time, e.g. sluice_deadline_in)",
                 which, (long long)late_ms);
    else if (res->refused_late)
        snprintf(res->error, sizeof res->error,
                 "not started: too little of the %s was left for the backend's expected "
                 "service time",
                 which);
    else
        snprintf(res->error, sizeof res->error,
                 "the %s passed while the call waited for a permit (%lld ms queued)", which,
                 (long long)(res->queued_ns / SLUICE_NS_PER_MS));
}

void sluice__curl_explain_late(struct sluice_curl_result *res)
{
    snprintf(res->error, sizeof res->error,
             "refused at admission: the predicted wait leaves too little of the %s (allow "
             "more, or set the backend's deadlines.queue_late)",
             res->expired == SLUICE_EXPIRED_START ? "start deadline" : "deadline");
}

bool sluice__curl_arm_deadline(CURL *easy, const struct timespec *deadline)
{
    if (!deadline)
        return true;
    int64_t left = sluice_timespec_ns(deadline) - sluice_monotonic_ns();
    if (left <= 0)
        return false;
    int64_t ms = (left + SLUICE_NS_PER_MS - 1) / SLUICE_NS_PER_MS;
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, ms > LONG_MAX ? LONG_MAX : (long)ms);
    return true;
}

void sluice__curl_disarm_deadline(CURL *easy, const struct timespec *deadline)
{
    if (deadline)
        curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 0L);
}

/* Retry-After and every dialect's rate-limit headers (the rows in curl.c). */
static bool sluice__kept_header(const char *name)
{
    static const char *const prefixes[] = {"x-ratelimit", "anthropic-ratelimit-", "x-tokenlimit-",
                                           "ratelimit"};
    if (strcasecmp(name, "retry-after") == 0 || strcasecmp(name, "retry-after-ms") == 0)
        return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncasecmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

/* A timeout within this much of the deadline is the deadline's (curl counts in ms). */
#define SLUICE__DEADLINE_SLACK_NS (10 * SLUICE_NS_PER_MS)

void sluice__curl_finish(CURL *easy, CURLcode code, enum sluice__curl_stop stop,
                         const struct timespec *deadline, int64_t retry_after_max_ns,
                         enum sluice_curl_dialect dialect, const char *body, size_t body_len,
                         struct sluice_curl_result *res)
{
    curl_off_t ttfb = 0, total = 0, request_size = 0;
    long http = 0;
    curl_easy_getinfo(easy, CURLINFO_STARTTRANSFER_TIME_T, &ttfb);
    curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME_T, &total);
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &request_size);
    res->transferred = true;
    res->transfer_ns = (int64_t)total * 1000;
    res->latency_ns = (int64_t)(ttfb > 0 ? ttfb : total) * 1000;

    if (code == CURLE_ABORTED_BY_CALLBACK && stop == SLUICE__CURL_RAN)
        stop = SLUICE__CURL_CANCELED; /* the chained xferinfo asked */
    bool deadline_hit =
        code == CURLE_OPERATION_TIMEDOUT && deadline &&
        sluice_timespec_ns(deadline) - sluice_monotonic_ns() <= SLUICE__DEADLINE_SLACK_NS;
    if (stop != SLUICE__CURL_RAN || deadline_hit) {
        res->kind = SLUICE_CURL_ABORTED;
        res->outcome = SLUICE_OUTCOME_IGNORE;
        res->http_status = http;
        res->curl_code = code;
        res->status = stop == SLUICE__CURL_CANCELED ? SLUICE_ECANCELED
                      : stop == SLUICE__CURL_CLOSED ? SLUICE_ECLOSED
                                                    : SLUICE_ETIMEDOUT;
        res->expired = stop == SLUICE__CURL_START ? SLUICE_EXPIRED_START
                       : res->status == SLUICE_ETIMEDOUT ? SLUICE_EXPIRED_CALL
                                                         : SLUICE_EXPIRED_NONE;
        /* Cut before its first byte, the latency signal was never seen (censored). */
        res->latency_ns = stop != SLUICE__CURL_START && ttfb > 0 ? (int64_t)ttfb * 1000 : 0;
        res->abandoned = request_size > 0 && stop != SLUICE__CURL_CLOSED;
        return;
    }

    struct sluice_curl_header kept[SLUICE__CURL_HEADERS_MAX];
    size_t n = 0;
    struct curl_header *h = NULL;
    while (n < SLUICE__CURL_HEADERS_MAX && (h = curl_easy_nextheader(easy, CURLH_HEADER, -1, h)))
        if (sluice__kept_header(h->name))
            kept[n++] = (struct sluice_curl_header){h->name, h->value};
    struct sluice_curl_response resp = {
        .http_status = http,
        .code = code,
        .request_sent = request_size > 0,
        .retry_after_s = -1,
        .headers = kept,
        .n_headers = n,
        .retry_after_max_ns = retry_after_max_ns,
        .dialect = dialect,
        .body = body,
        .body_len = body_len,
    };
    /* Retry-After is parsed from `kept`, not read as CURLINFO_RETRY_AFTER: curl takes the
     * leading digits of "12abc" and turns an overflowing value into 0, where the rule in
     * sluice/curl.h says garbage is none and an overflow is the maximum. */
    sluice_curl_classify(&resp, res);
    res->status = code == CURLE_OK ? SLUICE_OK : SLUICE_EIO;
}

void sluice__curl_end_call(struct sluice_pool *pool, const struct sluice_call *call,
                           const struct sluice_curl_result *res, bool read_on)
{
    if (res->abandoned) { /* perhaps still running at the provider (the pool's linger mode) */
        /* Its deadline, else its token or the caller's own stop (a chat's stream cut at the
         * reply cap), which sluice_run counts as a cancel too; read on past its deadline,
         * sluice_pool_call_read_on counted it already. */
        sluice_pool_call_abandon_latency(pool, call,
                                         read_on                         ? 0
                                         : res->status == SLUICE_ETIMEDOUT ? SLUICE_ETIMEDOUT
                                                                           : SLUICE_ECANCELED,
                                         res->latency_ns > 0 ? res->latency_ns : -1);
        return;
    }
    /* Time to first byte when there was a response; the pool times the rest. */
    sluice_pool_call_end_latency(pool, call, res->outcome, res->hold_ns,
                                 res->transferred ? res->latency_ns : -1);
    /* After the permit moved on: the first offer takes discovery's lock once. */
    double rate = sluice_curl_stated_rate(res);
    struct sluice_discovery *d = sluice_pool_discovery(pool);
    if (rate > 0 && d)
        sluice_discovery_hint_rate(d, rate, res->transfer_ns, SLUICE_CAUSE_PROVIDER_RATE);
}

/* ---- error bodies, on either transport ----------------------------------------------- */

/* Hand every byte on, and keep the first SLUICE_CURL_BODY_MAX bytes of an error body that the
 * caller took: a chunk it paused (CURL_WRITEFUNC_PAUSE) comes again when the transfer resumes,
 * and one it refused (a short count) ends the transfer, so either kept now would be kept twice
 * or for nothing. */
static size_t sluice__tee_write(char *p, size_t size, size_t n, void *data)
{
    struct sluice__tee *t = (struct sluice__tee *)data;
    size_t bytes = size * n, room = SLUICE_CURL_BODY_MAX - t->body_len;
    size_t took = t->write(p, size, n, t->write_data);
    if (!t->began_ns && took == bytes && bytes && (!t->begun || t->begun(t->begun_data)))
        t->began_ns = sluice_monotonic_ns();
    long http = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &http);
    if (took != bytes || !room || http < 400)
        return took;
    if (!t->body)
        t->body = malloc(SLUICE_CURL_BODY_MAX); /* without it, classified by status and headers */
    if (t->body) {
        size_t k = bytes < room ? bytes : room;
        memcpy(t->body + t->body_len, p, k);
        t->body_len += k;
    }
    return took;
}

void sluice__tee_install(struct sluice__tee *t)
{
    t->body_len = 0;
    t->start_ns = sluice_monotonic_ns();
    t->began_ns = 0;
    if (!t->write)
        return;
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, sluice__tee_write);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
}

void sluice__tee_remove(const struct sluice__tee *t)
{
    if (!t->write)
        return;
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, t->write);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t->write_data);
}

void sluice__tee_latency(const struct sluice__tee *t, struct sluice_curl_result *res)
{
    if (!t->write || !res->transferred)
        return;
    if (t->began_ns)
        res->latency_ns = t->began_ns > t->start_ns ? t->began_ns - t->start_ns : 1;
    else if (res->kind == SLUICE_CURL_ABORTED)
        res->latency_ns = 0; /* cut before the answer began: the signal was never seen */
}

/* ---- the transfer ------------------------------------------------------------------ */

struct sluice__xfer {
    struct sluice_cancel *cancel;
    int64_t start_ns;           /* the start deadline, CLOCK_MONOTONIC (INT64_MAX = none) */
    bool (*begun)(void *data);  /* the caller's test that the answer began (NULL: a body byte) */
    void *begun_data;
    bool started;               /* the answer began */
    bool start_expired;         /* the start deadline passed first: the transfer is aborted */
    curl_xferinfo_callback chained;
    void *chained_data;
    CURLM *multi;
    struct sluice_cancel_hook hook;
    struct sluice__tee tee; /* the error body on its way to call->write, kept in `body` */
    char body[SLUICE_CURL_BODY_MAX];
};

/* Whether the start deadline has passed before the answer began (then the transfer ends). */
static bool sluice__xfer_start_expired(struct sluice__xfer *x, curl_off_t dlnow)
{
    if (x->started || x->start_ns == INT64_MAX)
        return x->start_expired;
    x->started = x->begun ? x->begun(x->begun_data) : dlnow > 0;
    if (!x->started && sluice_monotonic_ns() >= x->start_ns)
        x->start_expired = true;
    return x->start_expired;
}

static int sluice__xferinfo(void *p, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                            curl_off_t ulnow)
{
    struct sluice__xfer *x = (struct sluice__xfer *)p;
    if (sluice__xfer_start_expired(x, dlnow))
        return 1;
    if (x->chained) {
        int rc = x->chained(x->chained_data, dltotal, dlnow, ultotal, ulnow);
        if (rc != 0 && rc != CURL_PROGRESSFUNC_CONTINUE)
            return rc;
    }
    return sluice_cancel_fired(x->cancel) ? 1 : 0;
}

/* The token fired: wake the thread's curl_multi_poll, so the xferinfo check runs now. */
static void sluice__xfer_on_cancel(struct sluice_cancel_hook *hook)
{
    struct sluice__xfer *x =
        (struct sluice__xfer *)(void *)((char *)hook - offsetof(struct sluice__xfer, hook));
    curl_multi_wakeup(x->multi);
}

/* How long the drive loop may sleep: a second, or until the start deadline while the answer
 * has not begun (xferinfo runs when curl works, not when nothing arrives). */
static int sluice__xfer_poll_ms(const struct sluice__xfer *x)
{
    if (x->started || x->start_ns == INT64_MAX)
        return 1000;
    int64_t left = (x->start_ns - sluice_monotonic_ns()) / SLUICE_NS_PER_MS + 1;
    return left < 1 ? 1 : left > 1000 ? 1000 : (int)left;
}

/* Drive `easy` on `multi` to its end, until the token fires or the start deadline passes
 * before the answer began. */
static enum sluice__curl_stop sluice__xfer_drive(struct sluice__xfer *x, CURLM *multi, CURL *easy,
                                                 struct sluice_cancel *cancel, CURLcode *code)
{
    int running = 1;
    bool done = false;
    CURLMcode mc = curl_multi_perform(multi, &running);
    for (;;) {
        int queued;
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(multi, &queued)))
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy) {
                *code = msg->data.result;
                done = true;
            }
        if (done)
            return x->start_expired && *code == CURLE_ABORTED_BY_CALLBACK ? SLUICE__CURL_START
                   : sluice_cancel_fired(cancel) && *code == CURLE_ABORTED_BY_CALLBACK
                       ? SLUICE__CURL_CANCELED
                       : SLUICE__CURL_RAN;
        if (mc != CURLM_OK) {
            *code = CURLE_OUT_OF_MEMORY; /* a multi failure mid-transfer is libcurl's resources */
            return SLUICE__CURL_RAN;
        }
        if (sluice_cancel_fired(cancel))
            return SLUICE__CURL_CANCELED; /* not yet aborted by xferinfo: removal aborts it */
        if (sluice__xfer_start_expired(x, 0))
            return SLUICE__CURL_START;
        mc = curl_multi_poll(multi, NULL, 0, sluice__xfer_poll_ms(x), NULL);
        if (mc == CURLM_OK)
            mc = curl_multi_perform(multi, &running);
    }
}

int sluice_curl_transfer(const struct sluice_curl_call *call, struct sluice_curl_result *res)
{
    if (!res)
        return SLUICE_EINVAL;
    int64_t made_ns = sluice_monotonic_ns();
    sluice__curl_result_init(res);
    if (!call || !call->easy)
        return res->status = sluice__fail(res->error, sizeof res->error,
                                          "%s is NULL (required)", call ? "easy" : "call");
    if (sluice__curl_check_deadlines(call->start_deadline, call->deadline, res) != SLUICE_OK)
        return res->status = SLUICE_EINVAL;
    const struct timespec *first = sluice_deadline_first(call->start_deadline, call->deadline);
    int status = sluice_wait_stop_reason(first, call->cancel);
    if (status != SLUICE_OK) {
        res->status = status;
        if (status == SLUICE_ETIMEDOUT)
            res->expired = sluice_deadline_which(call->start_deadline, call->deadline);
        sluice__curl_explain_timeout(res, first, made_ns);
        return status;
    }
    CURL *easy = call->easy;
    /* A nested call (from a chained callback) gets a multi of its own. */
    bool nested = sluice__tl_busy;
    CURLM *multi = nested ? curl_multi_init() : sluice__thread_multi();
    if (!multi)
        return res->status = SLUICE_ENOMEM;
    struct sluice__xfer x = {.cancel = call->cancel,
                             .start_ns = call->start_deadline
                                             ? sluice_timespec_ns(call->start_deadline)
                                             : INT64_MAX,
                             .begun = call->begun,
                             .begun_data = call->begun_data,
                             .chained = call->xferinfo,
                             .chained_data = call->xferinfo_data,
                             .multi = multi,
                             .tee = {.easy = easy,
                                     .write = call->write,
                                     .write_data = call->write_data,
                                     .begun = call->begun,
                                     .begun_data = call->begun_data}};
    x.tee.body = x.body;
    x.hook.fn = sluice__xfer_on_cancel;
    if (call->cancel && !sluice_cancel_register(call->cancel, &x.hook)) {
        status = SLUICE_ECANCELED;
    } else if (!sluice__curl_arm_deadline(easy, call->deadline)) {
        status = res->status = SLUICE_ETIMEDOUT;
        sluice__curl_explain_timeout(res, call->deadline, made_ns);
    } else {
        curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, sluice__xferinfo);
        curl_easy_setopt(easy, CURLOPT_XFERINFODATA, &x);
        curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
        sluice__tee_install(&x.tee);
        CURLMcode mc = curl_multi_add_handle(multi, easy);
        if (mc != CURLM_OK) {
            status = mc == CURLM_OUT_OF_MEMORY ? SLUICE_ENOMEM : SLUICE_EINVAL;
        } else {
            if (!nested)
                sluice__tl_busy = true;
            CURLcode code = CURLE_OK;
            enum sluice__curl_stop stop = sluice__xfer_drive(&x, multi, easy, call->cancel, &code);
            curl_multi_remove_handle(multi, easy); /* aborts it if still running */
            if (!nested)
                sluice__tl_busy = false;
            sluice__curl_finish(easy, code, stop, call->deadline, call->retry_after_max_ns,
                                call->dialect, x.tee.body, x.tee.body_len, res);
            sluice__tee_latency(&x.tee, res);
            status = res->status;
        }
        /* The caller's progress callback, or none, as before the call. */
        curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, call->xferinfo);
        curl_easy_setopt(easy, CURLOPT_XFERINFODATA, call->xferinfo_data);
        curl_easy_setopt(easy, CURLOPT_NOPROGRESS, call->xferinfo ? 0L : 1L);
        sluice__tee_remove(&x.tee);
        sluice__curl_disarm_deadline(easy, call->deadline);
    }
    if (call->cancel)
        sluice_cancel_unregister(call->cancel, &x.hook);
    if (nested)
        curl_multi_cleanup(multi);
    return res->status = status;
}

/* Everything wrong with a blocking call's arguments, checked before admission. */
int sluice__curl_check_backend(const struct sluice_engine *engine, const char *backend,
                               struct sluice_curl_result *res)
{
    if (sluice_engine_find(engine, backend))
        return SLUICE_OK;
    return sluice__fail(res->error, sizeof res->error,
                        "backend \"%s\" is not registered in the engine (register it in "
                        "sluice_engine_desc.backends, or pass NULL for the endpoint-only backend)",
                        backend);
}

static int sluice__curl_check_call(const struct sluice_engine *engine,
                                   const struct sluice_curl_call *call,
                                   struct sluice_curl_result *res)
{
    if (!engine || !call || !call->easy)
        return sluice__fail(res->error, sizeof res->error, "%s is NULL (required)",
                            !engine ? "engine" : !call ? "call" : "easy");
    int status = sluice__curl_check_backend(engine, call->backend, res);
    if (status != SLUICE_OK)
        return status;
    return sluice__curl_check_deadlines(call->start_deadline, call->deadline, res);
}

int sluice_curl_perform_call(const struct sluice_engine *engine,
                             const struct sluice_curl_call *call, struct sluice_curl_result *result)
{
    int64_t made_ns = sluice_monotonic_ns();
    struct sluice_curl_result res;
    sluice__curl_result_init(&res);
    struct sluice_pool *pool = NULL;
    if ((res.status = sluice__curl_check_call(engine, call, &res)) == SLUICE_OK)
        pool = sluice_engine_pool(engine, call->backend);
    if (pool && (res.status = sluice_pool_admit_late(pool, call->start_deadline, call->deadline,
                                                     &res.expired)) == SLUICE_ELATE)
        sluice__curl_explain_late(&res);
    if (pool && res.status == SLUICE_OK) {
        int64_t admitted = sluice_monotonic_ns();
        struct sluice_call pc;
        int status =
            sluice_pool_call_begin_by(pool, call->start_deadline, call->deadline, call->cancel, &pc);
        int64_t queued = sluice_monotonic_ns() - admitted;
        if (status == SLUICE_OK) {
            sluice_curl_transfer(call, &res);
            res.in_flight_at_start = pc.in_flight_at_start;
            sluice__curl_end_call(pool, &pc, &res, false);
        } else {
            res.status = status;
            res.refused_late = pc.refused_late;
            res.expired = pc.expired;
        }
        res.queued_ns = queued;
        sluice_pool_leave(pool);
        sluice__curl_explain_timeout(
            &res, sluice_deadline_first(call->start_deadline, call->deadline), made_ns);
    }
    if (result)
        *result = res;
    return res.status;
}

int sluice_curl_perform(const struct sluice_engine *engine, const char *backend_id, CURL *easy,
                        const struct timespec *deadline, struct sluice_cancel *cancel,
                        struct sluice_curl_result *result)
{
    struct sluice_curl_call call = {
        .backend = backend_id, .easy = easy, .deadline = deadline, .cancel = cancel};
    return sluice_curl_perform_call(engine, &call, result);
}
