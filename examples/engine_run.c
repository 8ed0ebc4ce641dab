/*
 * Two backends with their own pools: a local inference server limited to 2
 * calls in flight with no backlog beyond that, and the built-in openrouter
 * preset (16 active, 1024 waiting). A run is admitted at once or refused
 * with SLUICE_ECAPACITY; its model calls, repairs included, each take a
 * permit from their backend's pool.
 */
#include <stdio.h>
#include <string.h>

#include <sluice/sluice.h>

struct job {
    int calls;
};

static int generate(void *ctx, struct sluice_generation *gen)
{
    struct job *job = ctx;
    job->calls++;
    printf("  %s attempt %u via %s\n", gen->backend, gen->attempt,
           gen->endpoint ? gen->endpoint : "(no endpoint)");
    return SLUICE_OK;
}

static int validate(void *ctx, unsigned attempt, bool *repair)
{
    (void)ctx;
    /* Pretend the first output fails schema validation once. */
    *repair = attempt == 0;
    return attempt == 0 ? SLUICE_EINVAL : SLUICE_OK;
}

int main(void)
{
    char error[256] = "";
    struct sluice_backend_desc backends[] = {
        {.id = "local", .endpoint = "http://127.0.0.1:11434", .active = 2, .waiting = SLUICE_SOME(0)},
    };
    struct sluice_engine *engine;
    int status = sluice_engine_create(
        &(struct sluice_engine_desc){.backends = backends, .n_backends = 1, .error = error,
                                     .error_size = sizeof error},
        &engine);
    if (status != SLUICE_OK) {
        fprintf(stderr, "engine: %s: %s\n", sluice_strerror(status), error);
        return 1;
    }

    static const struct sluice_run_ops ops = {.generate = generate, .validate = validate};
    const char *targets[] = {"local", "openrouter"};
    for (int i = 0; i < 2; i++) {
        struct job job = {0};
        struct sluice_run_result result;
        status = sluice_run(engine, &(struct sluice_run_desc){.backend = targets[i], .ops = &ops, .ctx = &job},
                            &result);
        printf("%s: %s after %u generations, %.3f ms (queued %.3f ms)\n", targets[i],
               sluice_status_name(status), result.generations, result.elapsed_ns / 1e6,
               result.queued_ns / 1e6);
    }
    sluice_engine_destroy(engine);
    return 0;
}
