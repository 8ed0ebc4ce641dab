#include <stdio.h>

#include <sluice/sluice.h>

int main(void)
{
    struct sluice_gate *gate;
    if (sluice_gate_create(&(struct sluice_gate_desc){.limit = 2}, &gate) != SLUICE_OK)
        return 1;
    int ok = sluice_gate_acquire(gate, NULL, NULL) == SLUICE_OK;
    sluice_gate_release(gate);
    sluice_gate_destroy(gate);
    printf("consumer: %s\n", ok ? "ok" : "failed");
    return ok ? 0 : 1;
}
