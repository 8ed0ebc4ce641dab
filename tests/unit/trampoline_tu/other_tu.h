/*
 * The second translation unit of tests/unit/trampoline.c: gate and pool
 * calls compiled apart from the test, as a program's other .c files are.
 */
#ifndef SLUICE_TESTS_UNIT_TRAMPOLINE_OTHER_TU_H
#define SLUICE_TESTS_UNIT_TRAMPOLINE_OTHER_TU_H

#include <sluice/pool.h>

/* sluice_pool_create, compiled apart from the description (GCC's
 * -Warray-bounds otherwise flags the adaptive branch of create for a
 * constant fixed-pool description); NULL on failure. */
struct sluice_pool *other_tu_make_pool(const struct sluice_pool_desc *desc);
void other_tu_gate_release(struct sluice_gate *g);
void other_tu_call_end(struct sluice_pool *p, const struct sluice_call *call);
/* This unit's view of the calling thread's trampoline. */
const void *other_tu_trampoline(void);

#endif
