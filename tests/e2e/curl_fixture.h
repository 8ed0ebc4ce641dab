/*
 * curl_fixture.h — what the libcurl transport's end-to-end tests share: a
 * simulator on a free port, chat-completion easy handles aimed at it, its
 * /stats, and engines with one backend ("sim") in front of it.
 *
 * Every helper is static; each test file gets its own copy. Per-test
 * .init/.fini rather than TestSuite, and start() stops any simulator the
 * previous test left: the TSan build's Criterion stand-in ignores both.
 */
#ifndef SLUICE_TESTS_E2E_CURL_FIXTURE_H
#define SLUICE_TESTS_E2E_CURL_FIXTURE_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>

#include <sluice/curl.h>

#include "common.h"
#include "sluice-provider-sim/sim_process.h"

#define FX_BACKEND "sim"
#define FX_REQUEST "{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static struct sim_process fx_sim;

__attribute__((unused)) static void fx_setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

__attribute__((unused)) static void fx_teardown(void)
{
    sim_process_stop(&fx_sim);
    curl_global_cleanup();
}

static inline void fx_start(const char *const args[])
{
    sim_process_stop(&fx_sim);
    cr_assert_eq(sim_process_start(&fx_sim, args), 0, "the simulator did not start");
}

static inline int64_t fx_now_ms(void)
{
    return sluice_monotonic_ns() / SLUICE_NS_PER_MS;
}

static inline void fx_sleep_ms(int ms)
{
    sim__sleep_ms(ms);
}

/* ---- requests ---------------------------------------------------------------- */

/* Response bodies are dropped; tests look at statuses and the simulator's counters. */
static size_t fx_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* A POST /v1/chat/completions to the simulator (or to `url` when not NULL). */
static inline CURL *fx_easy_url(const char *url)
{
    char buf[96];
    CURL *easy = curl_easy_init();
    cr_assert_not_null(easy);
    curl_easy_setopt(easy, CURLOPT_URL,
                     url ? url : sim_process_url(&fx_sim, "/v1/chat/completions", buf, sizeof buf));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, FX_REQUEST);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, fx_discard);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    return easy;
}

static inline CURL *fx_easy(void)
{
    return fx_easy_url(NULL);
}

/* ---- the simulator's counters ------------------------------------------------- */

struct fx_stats {
    long requests, cancelled, in_flight, peak_in_flight, ok, rejected, unavailable;
};

static size_t fx_collect(char *data, size_t size, size_t n, void *ctx)
{
    char *buf = (char *)ctx;
    size_t len = strlen(buf), bytes = size * n;
    size_t keep = bytes < 4095 - len ? bytes : 4095 - len;
    memcpy(buf + len, data, keep);
    buf[len + keep] = '\0';
    return bytes;
}

static inline long fx_json_long(json_t *obj, const char *key)
{
    return (long)json_integer_value(json_object_get(obj, key));
}

/* The simulator's GET /stats, parsed; the caller json_decref()s it. */
static inline json_t *fx_stats_json(void)
{
    char url[96], body[4096] = "";
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, sim_process_url(&fx_sim, "/stats", url, sizeof url));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, fx_collect);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 5000L);
    cr_assert_eq(curl_easy_perform(easy), CURLE_OK, "GET /stats failed");
    curl_easy_cleanup(easy);
    json_t *root = json_loads(body, 0, NULL);
    cr_assert_not_null(root, "/stats is not JSON: %s", body);
    return root;
}

static inline struct fx_stats fx_stats(void)
{
    json_t *root = fx_stats_json();
    json_t *by = json_object_get(root, "by_status");
    struct fx_stats s = {
        .requests = fx_json_long(root, "requests"),
        .cancelled = fx_json_long(root, "cancelled"),
        .in_flight = fx_json_long(root, "in_flight"),
        .peak_in_flight = fx_json_long(root, "peak_in_flight"),
        .ok = fx_json_long(by, "200"),
        .rejected = fx_json_long(by, "429"),
        .unavailable = fx_json_long(by, "503"),
    };
    json_decref(root);
    return s;
}

/* Wait (bounded) until the simulator has no call in flight; its last stats. */
static inline struct fx_stats fx_stats_settled(void)
{
    struct fx_stats s = fx_stats();
    for (int i = 0; i < 200 && s.in_flight; i++) {
        fx_sleep_ms(5);
        s = fx_stats();
    }
    return s;
}

/* ---- engines ---------------------------------------------------------------- */

/* Discovery tuned for a simulator answering in tens of milliseconds. */
static inline struct sluice_discovery_desc fx_discovery(void)
{
    struct sluice_discovery_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.window_min_ns = 20 * SLUICE_NS_PER_MS;
    return dd;
}

/* An engine with one backend "sim": `active` (0 = unlimited), `waiting` (< 0 = default),
 * adaptive when dd is not NULL. */
static inline struct sluice_engine *fx_engine(uint32_t active, int waiting,
                                              const struct sluice_discovery_desc *dd)
{
    struct sluice_backend_desc b;
    memset(&b, 0, sizeof b);
    b.id = FX_BACKEND;
    b.active = active;
    if (waiting >= 0) {
        b.waiting.set = true;
        b.waiting.value = (uint32_t)waiting;
    }
    b.discovery = dd;
    char err[256];
    struct sluice_engine_desc ed;
    memset(&ed, 0, sizeof ed);
    ed.backends = &b;
    ed.n_backends = 1;
    ed.error = err;
    ed.error_size = sizeof err;
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&ed, &e), SLUICE_OK, "engine: %s", err);
    return e;
}

static inline struct sluice_pool_counts fx_counts(struct sluice_engine *e)
{
    return sluice_pool_stats(sluice_engine_pool(e, FX_BACKEND));
}

static inline struct sluice_discovery_status fx_status(struct sluice_engine *e)
{
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status(e, FX_BACKEND, &st), SLUICE_OK);
    return st;
}

/*
 * Teach the backend's service-time estimate (sluice/service.h) that `n`
 * calls took `ns`: successful calls, each back-dated by `ns`, ended at once.
 * No request reaches the simulator.
 */
static inline void fx_teach_service(struct sluice_engine *e, int64_t ns, unsigned n)
{
    struct sluice_pool *p = sluice_engine_pool(e, FX_BACKEND);
    for (unsigned i = 0; i < n; i++) {
        struct sluice_call call;
        cr_assert_eq(sluice_pool_call_begin(p, NULL, NULL, &call), SLUICE_OK);
        call.start_ns -= ns;
        sluice_pool_call_end(p, &call, SLUICE_OUTCOME_OK, 0);
    }
}

/* The pool holds nothing: no admission, no call in flight or queued. */
static inline void fx_assert_idle(struct sluice_engine *e)
{
    struct sluice_pool_counts c = fx_counts(e);
    cr_assert_eq(c.admitted, 0, "admissions leaked: %u", c.admitted);
    cr_assert_eq(c.in_flight, 0, "calls still in flight: %u", c.in_flight);
    cr_assert_eq(c.queued, 0, "calls still queued: %u", c.queued);
}

#endif
