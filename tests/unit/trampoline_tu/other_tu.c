/* Linked into test_unit_trampoline (tests/CMakeLists.txt); see other_tu.h. */
#include "other_tu.h"

struct sluice_pool *other_tu_make_pool(const struct sluice_pool_desc *desc)
{
    struct sluice_pool *p = NULL;
    return sluice_pool_create(desc, &p) == SLUICE_OK ? p : NULL;
}

void other_tu_gate_release(struct sluice_gate *g)
{
    sluice_gate_release(g);
}

void other_tu_call_end(struct sluice_pool *p, const struct sluice_call *call)
{
    sluice_pool_call_end(p, call, SLUICE_OUTCOME_OK, 0);
}

const void *other_tu_trampoline(void)
{
    return &sluice__gate_pending;
}
