#include <criterion/criterion.h>
#include <sluice/gate.h>

Test(gate, uncontended_acquire_release_tracks_in_flight)
{
    struct sluice_gate *g;
    cr_assert_eq(sluice_gate_create(&(struct sluice_gate_desc){.limit = 2}, &g), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_acquire(g, NULL, NULL), SLUICE_OK);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 2);
    cr_assert_eq(sluice_gate_tryacquire(g), SLUICE_EAGAIN);
    sluice_gate_release(g);
    sluice_gate_release(g);
    cr_assert_eq(sluice_gate_stats(g).in_flight, 0);
    sluice_gate_destroy(g);
}
