/* null_args.c's check for sluice/fleet.h (built only with hiredis): NULL pointers are
 * SLUICE_EINVAL, a NULL / zero answer or nothing, never a crash. */
#include <criterion/criterion.h>
#include <string.h>

#include <sluice/fleet.h>

Test(null_args, fleet)
{
    char err[128] = "untouched", buf[64] = "untouched";
    struct sluice_fleet *f = (struct sluice_fleet *)1;
    cr_expect_eq(sluice_fleet_create(NULL, &f), SLUICE_EINVAL);
    cr_expect_null(f);
    cr_expect_eq(sluice_fleet_create(&(struct sluice_fleet_desc){.error = err,
                                                                 .error_size = sizeof err},
                                     NULL),
                 SLUICE_EINVAL);
    cr_expect(strstr(err, "out is NULL"), "message: \"%s\"", err);
    struct sluice_discovery_desc dd = {0};
    sluice_fleet_discovery(NULL, &dd);
    cr_expect_null(dd.policy, "nothing to describe without a fleet");
    sluice_fleet_discovery(NULL, NULL);
    struct sluice_fleet_status st;
    memset(&st, 0xff, sizeof st);
    sluice_fleet_snapshot(NULL, &st);
    cr_expect(!st.connected && !st.leader, "a NULL fleet's snapshot is zeroed");
    sluice_fleet_snapshot(NULL, NULL);
    cr_expect_eq(sluice_fleet_attach(NULL, NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_fleet_clear(NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_fleet_last_error(NULL, buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "");
    cr_expect_null(sluice_fleet_events(NULL));
    sluice_fleet_destroy(NULL);
}
