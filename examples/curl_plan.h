/*
 * curl_plan.h — the requests the event-loop examples (curl_libuv.c,
 * curl_libevent.c) send, and how they check the outcome; only the loop
 * glue differs between them.
 *
 * N chat-completion POSTs (default 12) go to URL through a backend limited
 * to 4 calls in flight: every 4th (i % 4 == 1) has a 30 ms deadline, every
 * 4th (i % 4 == 2) is cancelled 20 ms after submit with
 * sluice_curl_loop_cancel, the rest have a 10 s deadline. Against a
 * provider that answers in 100 ms or more (sluice-provider-sim --median-ms
 * 100 --sigma 0) they end SLUICE_ETIMEDOUT, SLUICE_ECANCELED and SLUICE_OK.
 * The example exits 0 only if each did, and every per-socket watcher it
 * made was released by CURL_POLL_REMOVE.
 */
#ifndef SLUICE_EXAMPLES_CURL_PLAN_H
#define SLUICE_EXAMPLES_CURL_PLAN_H

#include <stdio.h>
#include <stdlib.h>

#include <sluice/curl.h>

#define PLAN_MAX 64
#define PLAN_CANCEL_AFTER_MS 20

struct plan;
struct plan_req {
    struct plan *plan;
    int index;
};

struct plan {
    struct sluice_curl_loop *loop;
    struct plan_req req[PLAN_MAX];
    int n, accepted, done, wrong;
    int watchers_made, watchers_freed;
    uint64_t ids[PLAN_MAX];
    int expect[PLAN_MAX];
};

static int plan_expected(int i)
{
    return i % 4 == 1 ? SLUICE_ETIMEDOUT : i % 4 == 2 ? SLUICE_ECANCELED : SLUICE_OK;
}

static size_t plan_discard(char *data, size_t size, size_t n, void *ctx)
{
    (void)data;
    (void)ctx;
    return size * n;
}

/* Completion, on the loop thread. */
static void plan_done(const struct sluice_curl_result *r, CURL *easy, void *data)
{
    struct plan_req *q = (struct plan_req *)data;
    struct plan *p = q->plan;
    int i = q->index;
    p->done++;
    bool ok = r->status == p->expect[i];
    p->wrong += !ok;
    printf("  request %2d: %-16s (expected %-16s) HTTP %3ld, queued %6.1f ms\n", i,
           sluice_status_name(r->status), sluice_status_name(p->expect[i]), r->http_status,
           r->queued_ns / 1e6);
    curl_easy_cleanup(easy);
}

/* An engine with the backend "local" (4 in flight, 16 waiting). The plan shows deadlines and
 * cancels ending requests in the queue, so the backend queues every request it has room for
 * (queue_late): by default a cold burst of requests with deadlines queues one round (as many as
 * the permits) and the rest are refused at submit with SLUICE_ELATE, as stream_server.c shows. */
static struct sluice_engine *plan_engine(void)
{
    struct sluice_backend_desc local = {.id = "local", .active = 4, .waiting = SLUICE_SOME(16),
                                        .deadlines = {.queue_late = true}};
    struct sluice_engine *engine = NULL;
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &local, .n_backends = 1},
                             &engine) != SLUICE_OK)
        return NULL;
    return engine;
}

/* Submit the plan's requests (from the loop's thread here; any thread may). */
static void plan_submit(struct plan *p, const char *url)
{
    for (int i = 0; i < p->n; i++) {
        p->req[i] = (struct plan_req){p, i};
        CURL *easy = curl_easy_init();
        curl_easy_setopt(easy, CURLOPT_URL, url);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS,
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, plan_discard);
        p->expect[i] = plan_expected(i);
        struct timespec deadline;
        sluice_deadline_in(&deadline, (p->expect[i] == SLUICE_ETIMEDOUT ? 30 : 10000) *
                                          SLUICE_NS_PER_MS);
        struct sluice_curl_request req = {.backend = "local",
                                          .easy = easy,
                                          .deadline = &deadline,
                                          .done = plan_done,
                                          .data = &p->req[i]};
        if (sluice_curl_loop_submit(p->loop, &req, &p->ids[i]) == SLUICE_OK) {
            p->accepted++;
        } else {
            printf("  request %2d: not accepted\n", i);
            curl_easy_cleanup(easy);
        }
    }
}

/* The cancel timer fired: cancel the requests the plan cancels. */
static void plan_cancel(struct plan *p)
{
    for (int i = 0; i < p->n; i++)
        if (p->expect[i] == SLUICE_ECANCELED)
            sluice_curl_loop_cancel(p->loop, p->ids[i]);
}

/* Exit status: 0 when every request was accepted and ended as planned, and no watcher leaked. */
static int plan_report(const struct plan *p)
{
    printf("%d submitted, %d accepted, %d completed, %d not as planned; watchers %d made, %d "
           "released\n",
           p->n, p->accepted, p->done, p->wrong, p->watchers_made, p->watchers_freed);
    return p->accepted == p->n && p->done == p->n && !p->wrong &&
                   p->watchers_made == p->watchers_freed
               ? 0
               : 1;
}

static int plan_args(int argc, char **argv, const char **url, struct plan *p)
{
    *url = argc > 1 ? argv[1] : "http://127.0.0.1:8080/v1/chat/completions";
    p->n = argc > 2 ? atoi(argv[2]) : 12;
    if (p->n < 1 || p->n > PLAN_MAX) {
        fprintf(stderr, "usage: %s [URL] [N, 1..%d]\n", argv[0], PLAN_MAX);
        return 2;
    }
    return 0;
}

#endif
