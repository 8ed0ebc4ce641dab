/* The store seam (sluice/store.h): lock records and the memory store. */
#include <criterion/criterion.h>
#include <sluice/store.h>

static struct sluice_lock_record record(uint32_t ceiling, int64_t expires_s)
{
    struct sluice_lock_record rec;
    memset(&rec, 0, sizeof rec);
    rec.ceiling = ceiling;
    rec.expires_s = expires_s;
    rec.locked_at_s = expires_s - 86400;
    strcpy(rec.policy, "discover");
    return rec;
}

Test(store, the_memory_store_keeps_every_field_of_a_record_per_node)
{
    struct sluice_memstore_entry table[2];
    struct sluice_memstore m;
    sluice_memstore_init(&m, table, 2);
    struct sluice_store_ops ops = sluice_memstore_ops(&m);
    struct sluice_lock_record a = record(52, 1700086400), b = record(16, 1700090000), out;
    cr_assert_eq(ops.save(ops.ctx, "cloud:a", &a), SLUICE_OK);
    cr_assert_eq(ops.save(ops.ctx, "cloud:b", &b), SLUICE_OK);
    cr_assert_eq(ops.load(ops.ctx, "cloud:a", &out), SLUICE_OK);
    cr_assert_eq(memcmp(&out, &a, sizeof a), 0, "locked_at_s and policy travel with the record");
    cr_assert_eq(ops.load(ops.ctx, "cloud:b", &out), SLUICE_OK);
    cr_assert_eq(out.ceiling, 16);
    cr_assert_str_eq(out.policy, "discover");
    cr_assert_eq(ops.clear(ops.ctx, "cloud:a"), SLUICE_OK);
    cr_assert_eq(ops.load(ops.ctx, "cloud:a", &out), SLUICE_OK, "nothing stored is not an error");
    cr_assert_eq(out.ceiling, 0);
    cr_assert_eq(out.locked_at_s, 0, "an absent record reads all zero");
    cr_assert_eq(m.saves, 2);
    cr_assert_eq(m.clears, 1);
}

Test(store, the_memory_store_refuses_rather_than_overflows)
{
    struct sluice_memstore *m;
    cr_assert_eq(sluice_memstore_create(0, NULL, &m), SLUICE_EINVAL);
    cr_assert_eq(sluice_memstore_create(1, NULL, &m), SLUICE_OK);
    struct sluice_store_ops ops = sluice_memstore_ops(m);
    struct sluice_lock_record rec = record(8, 1700086400);
    cr_assert_eq(ops.save(ops.ctx, "cloud:a", &rec), SLUICE_OK);
    cr_assert_eq(ops.save(ops.ctx, "cloud:a", &rec), SLUICE_OK, "the same node overwrites");
    cr_assert_eq(ops.save(ops.ctx, "cloud:b", &rec), SLUICE_ENOMEM, "the table is full");
    char long_id[SLUICE_NODE_ID_MAX + 1];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    cr_assert_eq(ops.save(ops.ctx, long_id, &rec), SLUICE_EINVAL);
    /* An unterminated policy name is cut, never read past. */
    memset(rec.policy, 'p', sizeof rec.policy);
    cr_assert_eq(ops.save(ops.ctx, "cloud:a", &rec), SLUICE_OK);
    struct sluice_lock_record out;
    ops.load(ops.ctx, "cloud:a", &out);
    cr_assert_eq(strlen(out.policy), SLUICE_POLICY_NAME_MAX - 1);
    sluice_memstore_destroy(m);
}
