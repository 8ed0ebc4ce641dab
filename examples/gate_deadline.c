/*
 * At most 4 model calls in flight, served first come first served; each
 * caller gives up after 2 seconds in line, and a shutdown token ends every
 * wait at once.
 */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <sluice/sluice.h>

static struct sluice_gate *gate;
static struct sluice_cancel shutdown_token;

static void call_the_model(int id)
{
    usleep(1000); /* stands in for an HTTP request */
    printf("call %d done\n", id);
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct timespec deadline;
    int status = sluice_gate_acquire(gate, sluice_deadline_in(&deadline, 2 * SLUICE_NS_PER_SEC),
                                     &shutdown_token);
    if (status != SLUICE_OK) {
        fprintf(stderr, "call %d not started: %s\n", id, sluice_strerror(status));
        return NULL;
    }
    call_the_model(id);
    sluice_gate_release(gate);
    return NULL;
}

int main(void)
{
    sluice_cancel_init(&shutdown_token);
    int status = sluice_gate_create(&(struct sluice_gate_desc){.limit = 4}, &gate);
    if (status != SLUICE_OK) {
        fprintf(stderr, "gate: %s\n", sluice_strerror(status));
        return 1;
    }
    pthread_t threads[16];
    for (int i = 0; i < 16; i++)
        pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < 16; i++)
        pthread_join(threads[i], NULL);
    struct sluice_gate_counts counts = sluice_gate_stats(gate);
    printf("in flight %u, waiting %u, limit %u\n", counts.in_flight, counts.waiting, counts.limit);
    sluice_gate_destroy(gate);
    return 0;
}
