/* sluice/engine.h: the backend registry, its defaults, validation and lookup. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <sluice/engine.h>

#include "run_fixtures.h"

static struct sluice_engine *make_engine(const struct sluice_backend_desc *b, size_t n)
{
    struct sluice_engine *e;
    char err[256];
    struct sluice_engine_desc d = {.backends = b, .n_backends = n, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK, "%s", err);
    cr_assert_str_eq(err, "", "a successful create clears the message");
    return e;
}

static struct sluice_pool_counts counts(const struct sluice_engine *e, const char *id)
{
    struct sluice_pool *p = sluice_engine_pool(e, id);
    cr_assert_not_null(p, "no pool for %s", id ? id : "(endpoint only)");
    return sluice_pool_stats(p);
}

/* Admissions a pool accepts before ECAPACITY, given back afterwards. */
static uint32_t admission_capacity(struct sluice_pool *p, uint32_t bound)
{
    uint32_t n = 0;
    while (n < bound && sluice_pool_admit(p) == SLUICE_OK)
        n++;
    for (uint32_t i = 0; i < n; i++)
        sluice_pool_leave(p);
    return n;
}

/* Create must fail with EINVAL and a message containing `expect`. */
static void expect_invalid(const struct sluice_backend_desc *b, size_t n, const char *expect)
{
    struct sluice_engine *e = (struct sluice_engine *)1;
    char err[256] = "untouched";
    struct sluice_engine_desc d = {.backends = b, .n_backends = n, .error = err,
                                   .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL, "expected: %s", expect);
    cr_assert_null(e);
    cr_assert(strstr(err, expect), "message \"%s\" does not contain \"%s\"", err, expect);
}

/* ---- presets and defaults ------------------------------------------------- */

Test(engine, builtin_openrouter_allows_16_active_and_1024_waiting_runs)
{
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){0}, &e), SLUICE_OK);
    const struct sluice_backend *b = sluice_engine_find(e, "openrouter");
    cr_assert_not_null(b);
    cr_assert(b->builtin);
    cr_assert_str_eq(b->endpoint, SLUICE_OPENROUTER_ENDPOINT);
    struct sluice_pool_counts c = sluice_pool_stats(b->pool);
    cr_assert_eq(c.active, 16);
    cr_assert_eq(c.waiting_capacity, 1024);
    cr_assert_eq(admission_capacity(b->pool, 5000), 16 + 1024);
    sluice_engine_destroy(e);
}

Test(engine, builtin_openrouter_is_present_next_to_consumer_backends)
{
    struct sluice_backend_desc b[] = {{.id = "local", .active = 2}};
    struct sluice_engine *e = make_engine(b, 1);
    cr_assert_eq(sluice_engine_backend_count(e), 2);
    cr_assert_eq(counts(e, "openrouter").active, 16);
    cr_assert_eq(counts(e, "local").active, 2);
    sluice_engine_destroy(e);
}

/* An engine that asks for no built-in backend shows none: every status view (admin page,
 * metrics, sluicectl) walks sluice_engine_backend_count/_at, and lookups do not find it. */
Test(engine, omit_openrouter_leaves_the_builtin_out_of_the_engine)
{
    struct sluice_backend_desc b[] = {{.id = "local", .active = 2}};
    for (size_t n = 0; n <= 1; n++) {
        struct sluice_engine *e = NULL;
        char err[256];
        struct sluice_engine_desc d = {.backends = n ? b : NULL, .n_backends = n,
                                       .omit_openrouter = true, .error = err,
                                       .error_size = sizeof err};
        cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_OK, "%s", err);
        cr_assert_eq(sluice_engine_backend_count(e), n, "%zu backends", n);
        cr_assert_null(sluice_engine_find(e, SLUICE_OPENROUTER_ID));
        for (size_t i = 0; i < sluice_engine_backend_count(e); i++)
            cr_assert_str_neq(sluice_engine_backend_id(e, i), SLUICE_OPENROUTER_ID);
        struct sluice_discovery_status st;
        cr_assert_eq(sluice_engine_status(e, SLUICE_OPENROUTER_ID, &st), SLUICE_EINVAL);
        cr_assert_eq(counts(e, NULL).active, 0, "the endpoint-only backend stays");
        if (n)
            cr_assert_eq(counts(e, "local").active, 2);
        sluice_engine_destroy(e);
    }
    /* A consumer "openrouter" is still a backend like any other. */
    struct sluice_backend_desc mine[] = {{.id = SLUICE_OPENROUTER_ID, .active = 3}};
    struct sluice_engine *e = NULL;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = mine,
                                                                   .n_backends = 1,
                                                                   .omit_openrouter = true},
                                      &e),
                 SLUICE_OK);
    cr_assert_eq(sluice_engine_backend_count(e), 1);
    cr_assert_eq(counts(e, SLUICE_OPENROUTER_ID).active, 3);
    sluice_engine_destroy(e);
    /* Without consumer backends it still leaks nothing on any allocation failure. */
    struct sluice_engine_desc none = {.omit_openrouter = true};
    assert_allocation_failures_leak_nothing(&(struct alloc_failure_case){
        .desc = &none, .create = engine_create_with, .destroy = engine_destroy_any});
}

Test(engine, a_consumer_openrouter_registration_replaces_the_builtin)
{
    struct sluice_backend_desc b[] = {{.id = "openrouter", .active = 4, .waiting = SLUICE_SOME(2),
                                       .endpoint = "https://proxy.example/v1"}};
    struct sluice_engine *e = make_engine(b, 1);
    cr_assert_eq(sluice_engine_backend_count(e), 1);
    const struct sluice_backend *or_ = sluice_engine_find(e, "openrouter");
    cr_assert_not(or_->builtin);
    cr_assert_str_eq(or_->endpoint, "https://proxy.example/v1");
    cr_assert_eq(admission_capacity(or_->pool, 100), 6);
    sluice_engine_destroy(e);

    struct sluice_backend_desc unlimited[] = {{.id = "openrouter"}};
    e = make_engine(unlimited, 1);
    cr_assert_eq(counts(e, "openrouter").active, 0,
                 "a replacement is unlimited unless it sets active");
    sluice_engine_destroy(e);
}

Test(engine, consumer_backends_are_unlimited_unless_they_set_active)
{
    struct sluice_backend_desc b[] = {{.id = "free"}};
    struct sluice_engine *e = make_engine(b, 1);
    struct sluice_pool *p = sluice_engine_pool(e, "free");
    cr_assert_null(sluice__pool_gate(p));
    cr_assert_eq(admission_capacity(p, 20000), 20000);
    sluice_engine_destroy(e);
}

Test(engine, consumer_backend_waiting_defaults_to_1024_or_takes_explicit_zero)
{
    struct sluice_backend_desc b[] = {{.id = "dflt", .active = 3},
                                      {.id = "zero", .active = 3, .waiting = SLUICE_SOME(0)},
                                      {.id = "some", .active = 3, .waiting = SLUICE_SOME(7)}};
    struct sluice_engine *e = make_engine(b, 3);
    cr_assert_eq(admission_capacity(sluice_engine_pool(e, "dflt"), 5000), 3 + 1024);
    cr_assert_eq(admission_capacity(sluice_engine_pool(e, "zero"), 5000), 3);
    cr_assert_eq(admission_capacity(sluice_engine_pool(e, "some"), 5000), 3 + 7);
    sluice_engine_destroy(e);
}

Test(engine, runs_without_a_backend_id_resolve_to_an_unlimited_endpoint_only_pool)
{
    struct sluice_engine *e = make_engine(NULL, 0);
    const struct sluice_backend *b = sluice_engine_find(e, NULL);
    cr_assert_not_null(b);
    cr_assert_null(b->id);
    cr_assert_null(sluice__pool_gate(b->pool));
    cr_assert_neq(b->pool, sluice_engine_pool(e, "openrouter"));
    sluice_engine_destroy(e);
}

/* ---- registrations are copied, looked up in O(1) ------------------------- */

Test(engine, registrations_are_copied_into_engine_owned_state)
{
    char id[16], endpoint[32];
    snprintf(id, sizeof id, "local");
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:8080");
    struct sluice_backend_desc b[] = {{.id = id, .endpoint = endpoint, .active = 1}};
    struct sluice_engine *e = make_engine(b, 1);
    snprintf(id, sizeof id, "changed");
    snprintf(endpoint, sizeof endpoint, "http://elsewhere");
    b[0].active = 99;
    const struct sluice_backend *got = sluice_engine_find(e, "local");
    cr_assert_not_null(got);
    cr_assert_neq((const void *)got->id, (const void *)id);
    cr_assert_str_eq(got->endpoint, "http://127.0.0.1:8080");
    cr_assert_eq(sluice_pool_stats(got->pool).active, 1);
    cr_assert_null(sluice_engine_find(e, "changed"));
    sluice_engine_destroy(e);
}

Test(engine, lookup_finds_every_backend_by_id_and_nothing_else)
{
    enum { N = 1000 };
    static char ids[N][24];
    static struct sluice_backend_desc b[N];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "backend-%d", i);
        b[i] = (struct sluice_backend_desc){.id = ids[i], .active = (uint32_t)(i % 7)};
    }
    struct sluice_engine *e = make_engine(b, N);
    for (int i = 0; i < N; i++) {
        const struct sluice_backend *got = sluice_engine_find(e, ids[i]);
        cr_assert_not_null(got, "%s", ids[i]);
        cr_assert_str_eq(got->id, ids[i]);
        cr_assert_eq(got, sluice_engine_backend_at(e, (size_t)i), "order is registration order");
        cr_assert_eq(sluice_pool_stats(got->pool).active, (uint32_t)(i % 7));
    }
    cr_assert_null(sluice_engine_find(e, "backend-1000"));
    cr_assert_null(sluice_engine_find(e, ""));
    cr_assert_null(sluice_engine_find(e, "backend-"));
    cr_assert_not_null(sluice_engine_find(e, "openrouter"));
    sluice_engine_destroy(e);
}

Test(engine, separate_engines_never_share_capacity)
{
    struct sluice_backend_desc b[] = {{.id = "local", .active = 1, .waiting = SLUICE_SOME(0)}};
    struct sluice_engine *one = make_engine(b, 1), *two = make_engine(b, 1);
    cr_assert_neq(sluice_engine_pool(one, "local"), sluice_engine_pool(two, "local"));
    cr_assert_eq(sluice_pool_admit(sluice_engine_pool(one, "local")), SLUICE_OK);
    cr_assert_eq(sluice_pool_admit(sluice_engine_pool(one, "local")), SLUICE_ECAPACITY);
    cr_assert_eq(sluice_pool_admit(sluice_engine_pool(two, "local")), SLUICE_OK);
    cr_assert_eq(admission_capacity(sluice_engine_pool(two, "openrouter"), 5000), 1040,
                 "engine one's openrouter use does not show in engine two");
    sluice_pool_leave(sluice_engine_pool(one, "local"));
    sluice_pool_leave(sluice_engine_pool(two, "local"));
    sluice_engine_destroy(one);
    sluice_engine_destroy(two);
}

/* ---- invalid configuration ------------------------------------------------ */

Test(engine, waiting_without_active_fails_naming_the_field)
{
    struct sluice_backend_desc b[] = {{.id = "a", .active = 1}, {.id = "b"},
                                      {.id = "c", .waiting = SLUICE_SOME(0)}};
    expect_invalid(b, 3, "backends[2].waiting set without an active limit "
                         "(set backends[2].active or drop waiting)");
}

Test(engine, duplicate_ids_fail_naming_both_fields)
{
    struct sluice_backend_desc b[] = {{.id = "x"}, {.id = "y"}, {.id = "x", .active = 2}};
    expect_invalid(b, 3, "backends[2].id \"x\" duplicates backends[0].id");
    struct sluice_backend_desc twice[] = {{.id = "openrouter"}, {.id = "openrouter"}};
    expect_invalid(twice, 2, "backends[1].id \"openrouter\" duplicates backends[0].id");
}

Test(engine, missing_or_oversized_ids_fail_naming_the_field)
{
    struct sluice_backend_desc null_id[] = {{.id = "ok"}, {.active = 1}};
    expect_invalid(null_id, 2, "backends[1].id is NULL");
    struct sluice_backend_desc empty_id[] = {{.id = ""}};
    expect_invalid(empty_id, 1, "backends[0].id is empty");
    char long_id[SLUICE_BACKEND_ID_MAX + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    struct sluice_backend_desc too_long[] = {{.id = long_id}};
    expect_invalid(too_long, 1, "backends[0].id is 256 bytes, above the maximum 255");
}

Test(engine, ids_that_are_not_utf8_text_fail_naming_the_field)
{
    static const struct {
        const char *id, *says;
    } bad[] = {
        {"cloud:\xff", "backends[0].id has a byte that is not UTF-8 at byte 6"},
        {"caf\xc3", "backends[0].id has a byte that is not UTF-8 at byte 3"},      /* cut */
        {"\xc0\xaf", "backends[0].id has a byte that is not UTF-8 at byte 0"},     /* overlong */
        {"\xed\xa0\x80", "backends[0].id has a byte that is not UTF-8 at byte 0"}, /* surrogate */
        {"a\x1b[2J", "backends[0].id has a control character at byte 1"},
        {"a\nb", "backends[0].id has a control character at byte 1"},
        {"a\x7f", "backends[0].id has a control character at byte 1"},
        {"a\xc2\x9b", "backends[0].id has a control character at byte 1"}, /* C1 CSI */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct sluice_backend_desc b[] = {{.id = bad[i].id}};
        expect_invalid(b, 1, bad[i].says);
    }
    struct sluice_backend_desc fine[] = {{.id = "cloud:café ☁ 🔒"}, {.id = "local:gpu"}};
    struct sluice_engine *e = NULL;
    cr_expect_eq(sluice_engine_create(&(struct sluice_engine_desc){.backends = fine, .n_backends = 2}, &e),
                 SLUICE_OK, "UTF-8 text is an ID");
    sluice_engine_destroy(e);
}

Test(engine, out_of_range_limits_fail_naming_the_field)
{
    struct sluice_backend_desc active[] = {{.id = "a", .active = SLUICE_POOL_ACTIVE_MAX + 1}};
    expect_invalid(active, 1, "backends[0].active = 65537 is above the maximum 65536");
    struct sluice_backend_desc waiting[] = {
        {.id = "a", .active = 1},
        {.id = "b", .active = 1, .waiting = SLUICE_SOME(SLUICE_POOL_WAITING_MAX + 1)}};
    expect_invalid(waiting, 2, "backends[1].waiting = 1048577 is above the maximum 1048576");
}

Test(engine, inconsistent_backend_array_fails_naming_the_field)
{
    expect_invalid(NULL, 2, "backends is NULL but n_backends is 2");
    struct sluice_backend_desc b[] = {{.id = "a"}};
    expect_invalid(b, SLUICE_ENGINE_BACKENDS_MAX + 1,
                   "n_backends = 4097 is above the maximum 4096");
}

/* A first integrator's slips: each is EINVAL (or NULL, or nothing) instead of a crash, and
 * create without a desc does not quietly build an engine without the caller's backends. */
Test(engine, null_pointers_are_refused_with_einval_at_every_entry_point)
{
    struct sluice_engine *e = (struct sluice_engine *)1;
    cr_assert_eq(sluice_engine_create(NULL, &e), SLUICE_EINVAL);
    cr_assert_null(e, "*out is NULL after a failure");
    char err[256] = "untouched";
    struct sluice_engine_desc d = {.error = err, .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, NULL), SLUICE_EINVAL);
    cr_assert(strstr(err, "out is NULL"), "the message names the argument: \"%s\"", err);

    char line[64] = "untouched";
    struct sluice_discovery_status st;
    cr_assert_eq(sluice_engine_status_line(NULL, "openrouter", line, sizeof line), SLUICE_EINVAL);
    cr_assert_str_eq(line, "");
    cr_assert_eq(sluice_engine_status(NULL, "openrouter", &st), SLUICE_EINVAL);
    cr_assert_eq(sluice_engine_clear(NULL, "openrouter"), SLUICE_EINVAL);
    cr_assert_eq(sluice_engine_sync(NULL, "openrouter"), SLUICE_EINVAL);
    cr_assert_null(sluice_engine_find(NULL, "openrouter"));
    cr_assert_null(sluice_engine_find(NULL, NULL));
    cr_assert_null(sluice_engine_pool(NULL, "openrouter"));
    cr_assert_null(sluice_engine_events(NULL, "openrouter"));
    cr_assert_null(sluice_engine_backend_at(NULL, 0));
    cr_assert_null(sluice_engine_backend_id(NULL, 0));
    cr_assert_eq(sluice_engine_backend_count(NULL), 0);
    sluice_engine_poll(NULL);
    sluice_engine_close(NULL);
    sluice_engine_destroy(NULL);

    e = make_engine(NULL, 0);
    cr_assert_eq(sluice_engine_status(e, "openrouter", NULL), SLUICE_EINVAL);
    cr_assert_eq(sluice_engine_sync(e, NULL), SLUICE_EINVAL, "no ID is not a node");
    cr_assert_eq(sluice_engine_sync(e, "nope"), SLUICE_EINVAL);
    cr_assert_eq(sluice_engine_sync(e, "openrouter"), SLUICE_OK, "a fixed node: nothing to wait");
    cr_assert_eq(sluice_engine_status_line(e, "openrouter", NULL, 16), SLUICE_EINVAL);
    cr_assert_gt(sluice_engine_status_line(e, "openrouter", NULL, 0), 0,
                 "NULL with size 0 measures the line, as snprintf does");
    sluice_engine_destroy(e);
}

Test(engine, a_short_error_buffer_gets_a_terminated_prefix)
{
    struct sluice_backend_desc b[] = {{.id = "c", .waiting = SLUICE_SOME(0)}};
    char err[12];
    memset(err, 'z', sizeof err);
    struct sluice_engine_desc d = {.backends = b, .n_backends = 1, .error = err,
                                   .error_size = sizeof err};
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL);
    cr_assert_str_eq(err, "backends[0]");
    d.error = NULL;
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL, "no buffer: status only");
}

/* ---- allocation ---------------------------------------------------------- */

Test(engine, allocation_failure_returns_enomem_and_leaks_nothing)
{
    struct sluice_backend_desc b[] = {{.id = "local", .endpoint = "http://h", .active = 2},
                                      {.id = "free"}};
    struct sluice_engine_desc d = {.backends = b, .n_backends = 2};
    long allocs = assert_allocation_failures_leak_nothing(&(struct alloc_failure_case){
        .desc = &d, .create = engine_create_with, .destroy = engine_destroy_any});
    cr_assert_geq(allocs, 4, "every allocation point was exercised");
}

Test(engine, a_duplicate_found_after_allocation_leaks_nothing)
{
    struct sluice_backend_desc b[] = {{.id = "x", .active = 1}, {.id = "x"}};
    struct counting_alloc c = {.fail_at = -1};
    struct sluice_allocator a = counting_allocator(&c);
    struct sluice_engine_desc d = {.backends = b, .n_backends = 2, .allocator = &a};
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL);
    cr_assert_eq(c.live, 0);
}

Test(engine, an_allocator_with_only_one_of_alloc_and_free_is_refused)
{
    struct counting_alloc c = {.fail_at = -1};
    struct sluice_allocator half = counting_allocator(&c);
    half.free = NULL;
    char err[256];
    struct sluice_engine *e = (struct sluice_engine *)1;
    struct sluice_engine_desc d = {.allocator = &half, .error = err, .error_size = sizeof err};
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL);
    cr_assert_null(e);
    cr_assert(strstr(err, "allocator sets only one of alloc and free"), "%s", err);
    half = counting_allocator(&c);
    half.alloc = NULL;
    cr_assert_eq(sluice_engine_create(&d, &e), SLUICE_EINVAL, "free without alloc too");
    cr_assert_eq(c.calls, 0, "nothing was allocated through it");
}
