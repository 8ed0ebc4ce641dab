/*
 * Ceiling discovery in an engine: one adaptive backend whose concurrency
 * limit starts at a jumpstart and moves with what the provider answers,
 * next to a fixed local backend. Locks persist in a memory store (the shim's
 * state file plays this part in a real program). Each run prints the node's
 * status line; at the end the nodes are listed, the adaptive one is
 * cleared, and its event feed is written as JSON Lines.
 *
 * The "provider" here is simulated: every fifth call is refused with a 429
 * carrying Retry-After: 20 ms, so the limit backs off and the next call
 * waits out the hold before it starts.
 */
#include <stdio.h>

#include <sluice/sluice.h>

struct provider {
    int calls;
};

static int generate(void *ctx, struct sluice_generation *gen)
{
    struct provider *p = ctx;
    if (++p->calls % 5 == 0) {
        gen->outcome = SLUICE_OUTCOME_OVERLOAD; /* HTTP 429 */
        gen->retry_after_ns = 20 * SLUICE_NS_PER_MS;
        return SLUICE_EAGAIN;
    }
    return SLUICE_OK; /* outcome stays SLUICE_OUTCOME_OK: served */
}

int main(void)
{
    struct sluice_memstore *store;
    if (sluice_memstore_create(8, NULL, &store) != SLUICE_OK)
        return 1;
    struct sluice_store_ops store_ops = sluice_memstore_ops(store);

    /* active is the hard maximum; discovery starts at the jumpstart below it. */
    struct sluice_discovery_desc discovery = {.jumpstart = 4, .lock_ttl_s = 24 * 3600};
    struct sluice_backend_desc backends[] = {
        {.id = "cloud:demo", .endpoint = "https://api.example.com/v1", .active = 32,
         .discovery = &discovery},
        {.id = "local:gpu", .endpoint = "http://127.0.0.1:11434", .active = 2},
    };
    char error[256] = "";
    struct sluice_engine *engine;
    int status = sluice_engine_create(
        &(struct sluice_engine_desc){.backends = backends, .n_backends = 2, .store = &store_ops,
                                     .error = error, .error_size = sizeof error},
        &engine);
    if (status != SLUICE_OK) {
        fprintf(stderr, "engine: %s: %s\n", sluice_strerror(status), error);
        sluice_memstore_destroy(store);
        return 1;
    }

    static const struct sluice_run_ops ops = {.generate = generate};
    struct provider provider = {0};
    char line[128];
    for (int i = 0; i < 8; i++) {
        struct sluice_run_result result;
        status = sluice_run(engine,
                            &(struct sluice_run_desc){.backend = "cloud:demo", .ops = &ops,
                                                      .ctx = &provider},
                            &result);
        sluice_engine_status_line(engine, "cloud:demo", line, sizeof line);
        printf("run %d: %-9s queued %5.1f ms   %s\n", i, sluice_status_name(status),
               result.queued_ns / 1e6, line);
    }

    printf("\nnodes:\n");
    for (size_t i = 0; i < sluice_engine_backend_count(engine); i++) {
        sluice_engine_status_line(engine, sluice_engine_backend_id(engine, i), line, sizeof line);
        printf("  %s\n", line);
    }

    sluice_engine_clear(engine, "cloud:demo"); /* e.g. after a plan upgrade */
    sluice_engine_status_line(engine, "cloud:demo", line, sizeof line);
    printf("\nafter clear: %s\n\nevents (JSON Lines):\n", line);
    uint64_t cursor = 0;
    sluice_event_ring_write_json(stdout, sluice_engine_events(engine, "cloud:demo"), &cursor);

    sluice_engine_destroy(engine);
    sluice_memstore_destroy(store);
    return 0;
}
