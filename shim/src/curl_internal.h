/*
 * curl_internal.h — what the shim's transport files share: the sample each
 * kind of response gives, and reading a finished easy handle into a result.
 * Private to shim/src; not installed.
 */
#ifndef SLUICE_SHIM_CURL_INTERNAL_H
#define SLUICE_SHIM_CURL_INTERNAL_H

#include <sluice/curl.h>

#include <stdio.h>

/* Headers a result keeps (Retry-After, retry-after-ms, every dialect's rate-limit family):
 * at most. Anthropic alone sends twelve. */
#define SLUICE__CURL_HEADERS_MAX 32

/* Why a transfer stopped early, as the driver saw it. */
enum sluice__curl_stop {
    SLUICE__CURL_RAN = 0,  /* it ran to its end (any CURLcode) */
    SLUICE__CURL_CANCELED, /* the caller's token (or chained xferinfo) aborted it */
    SLUICE__CURL_CLOSED,   /* the loop shut down under it */
    SLUICE__CURL_START,    /* its start deadline passed before the answer began */
};

/*
 * Fill *res from a finished easy handle: classify it (with the headers
 * sluice keeps, read through curl_easy_nextheader, and the error body
 * read on the way, if any), times, and the status
 * the call returns. `deadline` decides whether a CURLE_OPERATION_TIMEDOUT
 * was the caller's deadline (ABORTED, SLUICE_ETIMEDOUT) or the provider's.
 */
void sluice__curl_finish(CURL *easy, CURLcode code, enum sluice__curl_stop stop,
                         const struct timespec *deadline, int64_t retry_after_max_ns,
                         enum sluice_curl_dialect dialect, const char *body, size_t body_len,
                         struct sluice_curl_result *res);

/*
 * Set CURLOPT_TIMEOUT_MS to what is left of `deadline` (rounded up, so the
 * timeout never fires before the deadline); false if nothing is left.
 * Without a deadline the caller's own timeout stays.
 */
bool sluice__curl_arm_deadline(CURL *easy, const struct timespec *deadline);

/* Undo sluice__curl_arm_deadline. */
void sluice__curl_disarm_deadline(CURL *easy, const struct timespec *deadline);

/*
 * End a pool call for a finished transfer: the sample's latency is the
 * time to first byte (res->latency_ns), given to sluice_pool_call_end_latency
 * with the call's own start, and its hold is res->hold_ns; a transfer the
 * caller abandoned after its request was sent (res->abandoned) goes to
 * sluice_pool_call_abandon, so its permit lingers while the provider still
 * runs it. A success that states a request rate per second or minute
 * offers it to discovery (sluice_discovery_hint_rate).
 */
void sluice__curl_end_call(struct sluice_pool *pool, const struct sluice_call *call,
                           const struct sluice_curl_result *res, bool read_on);

/*
 * An answer's body on its way to the caller's declared write callback
 * (sluice_curl_call.write, sluice_curl_request.write): every byte is handed
 * on, and the first SLUICE_CURL_BODY_MAX bytes of an answer of status >= 400
 * that the caller took are kept for classify (a chunk it paused is kept when
 * libcurl hands it over again). Both transports read error bodies
 * through this, so a response is classified the same on either.
 */
struct sluice__tee {
    CURL *easy;
    curl_write_callback write; /* the caller's; NULL = no tee, bodies are not read */
    void *write_data;
    bool (*begun)(void *data); /* the caller's test that the answer began (NULL: a body byte) */
    void *begun_data;
    int64_t start_ns; /* CLOCK_MONOTONIC: the transfer's start (sluice__tee_install) */
    int64_t began_ns; /* ... the answer's beginning, as begun says; 0 = not yet */
    char *body;      /* SLUICE_CURL_BODY_MAX bytes; NULL = malloc'd at the first error byte and
                        left to the owner to reuse and free (the loop's records) */
    size_t body_len; /* bytes kept of this answer */
};

/* Route `easy`'s body through `t` (nothing when t->write is NULL), from a fresh body_len. */
void sluice__tee_install(struct sluice__tee *t);

/* Put the caller's write callback back (nothing when t->write is NULL). */
void sluice__tee_remove(const struct sluice__tee *t);

/* Where the tee saw the body, the latency discovery hears is the time to the answer's
 * beginning, not to its headers (sluice/curl.h, "Latency"); nothing without a tee. */
void sluice__tee_latency(const struct sluice__tee *t, struct sluice_curl_result *res);

/* A result for a call that never transferred. */
void sluice__curl_result_init(struct sluice_curl_result *res);

/* SLUICE_OK, or SLUICE_EINVAL with res->error saying which deadline (by its field's name,
 * deadline or start_deadline) is not normalised or not on CLOCK_MONOTONIC (more than a year
 * ahead), and why. */
int sluice__curl_check_deadlines(const struct timespec *start_deadline,
                                 const struct timespec *deadline, struct sluice_curl_result *res);

/* SLUICE_OK, or SLUICE_EINVAL with res->error naming `backend` as one the engine does not
 * have and where to register it (a misspelt ID is the mistake to name, whatever else the
 * call lacks). */
int sluice__curl_check_backend(const struct sluice_engine *engine, const char *backend,
                               struct sluice_curl_result *res);

/* A SLUICE_ELATE refusal's message in res->error, naming res->expired's deadline and what
 * to change. */
void sluice__curl_explain_late(struct sluice_curl_result *res);

/* sluice_curl_loop_submit, saying in *late (may be NULL) which deadline an SLUICE_ELATE
 * refused it for (sluice_pool_admit_late). */
int sluice__curl_loop_submit(struct sluice_curl_loop *loop, const struct sluice_curl_request *req,
                             uint64_t *id, enum sluice_expiry *late);

/* A call that ended SLUICE_ETIMEDOUT before any transfer (res->status) with no word yet: say
 * in res->error whether its deadline had passed when it was made (at `made_ns`), left too
 * little to start (res->refused_late), or ran out while it queued; `deadline` is the earlier
 * of the call's start and whole-call deadlines. */
void sluice__curl_explain_timeout(struct sluice_curl_result *res, const struct timespec *deadline,
                                  int64_t made_ns);

#endif
