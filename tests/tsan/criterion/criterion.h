/*
 * A minimal, in-process stand-in for Criterion, used only by the tsan
 * preset: Criterion's runner cannot start under ThreadSanitizer (its
 * inheritable arena collides with TSan's memory layout: Criterion issue
 * #274). The test sources stay unchanged: the tsan build puts this folder
 * ahead of the system include path. Tests run sequentially in one process;
 * a failed assertion prints where and why, then aborts.
 *
 * Covers the subset of Criterion the suite uses: Test(suite, name, ...)
 * (extra options are ignored, so tests must not rely on .init/.fini), the
 * cr_assert / cr_expect families below, and cr_skip_test.
 */
#ifndef SLUICE_TESTS_CRITERION_LITE_H
#define SLUICE_TESTS_CRITERION_LITE_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*crl_test_fn)(void);
static struct {
    const char *suite, *name;
    crl_test_fn fn;
} crl_tests[512];
static int crl_n_tests;

static inline void crl_register(const char *suite, const char *name, crl_test_fn fn)
{
    if (crl_n_tests < (int)(sizeof crl_tests / sizeof crl_tests[0]))
        crl_tests[crl_n_tests++] = (typeof(crl_tests[0])){suite, name, fn};
}

#define Test(suite, name, ...)                                                                     \
    static void suite##_##name##_impl(void);                                                       \
    __attribute__((constructor)) static void suite##_##name##_register(void)                      \
    {                                                                                              \
        crl_register(#suite, #name, suite##_##name##_impl);                                        \
    }                                                                                              \
    static void suite##_##name##_impl(void)

__attribute__((noreturn)) static inline void
crl_fail(const char *file, int line, const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs("  ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    fflush(stderr);
    abort();
}

#define CRL_CHECK(cond, expr, ...)                                                                 \
    do {                                                                                           \
        if (!(cond))                                                                               \
            crl_fail(__FILE__, __LINE__, expr, "" __VA_ARGS__);                                    \
    } while (0)

#define cr_assert(cond, ...) CRL_CHECK(cond, #cond, ##__VA_ARGS__)
#define cr_assert_not(cond, ...) CRL_CHECK(!(cond), "!(" #cond ")", ##__VA_ARGS__)
#define cr_assert_eq(a, b, ...) CRL_CHECK((a) == (b), #a " == " #b, ##__VA_ARGS__)
#define cr_assert_neq(a, b, ...) CRL_CHECK((a) != (b), #a " != " #b, ##__VA_ARGS__)
#define cr_assert_lt(a, b, ...) CRL_CHECK((a) < (b), #a " < " #b, ##__VA_ARGS__)
#define cr_assert_leq(a, b, ...) CRL_CHECK((a) <= (b), #a " <= " #b, ##__VA_ARGS__)
#define cr_assert_gt(a, b, ...) CRL_CHECK((a) > (b), #a " > " #b, ##__VA_ARGS__)
#define cr_assert_geq(a, b, ...) CRL_CHECK((a) >= (b), #a " >= " #b, ##__VA_ARGS__)
#define cr_assert_null(p, ...) CRL_CHECK((p) == NULL, #p " == NULL", ##__VA_ARGS__)
#define cr_assert_not_null(p, ...) CRL_CHECK((p) != NULL, #p " != NULL", ##__VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) CRL_CHECK(strcmp((a), (b)) == 0, #a " == " #b, ##__VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) CRL_CHECK(strcmp((a), (b)) != 0, #a " != " #b, ##__VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...)                                                         \
    CRL_CHECK(fabs((double)(a) - (double)(b)) <= (eps), #a " ~= " #b, ##__VA_ARGS__)
#define cr_assert_fail(...) crl_fail(__FILE__, __LINE__, "cr_assert_fail", "" __VA_ARGS__)
/* Expectations abort too: under TSan the first failure is the interesting one. */
#define cr_expect(cond, ...) cr_assert(cond, ##__VA_ARGS__)
#define cr_expect_not(cond, ...) cr_assert_not(cond, ##__VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_assert_eq(a, b, ##__VA_ARGS__)
#define cr_expect_neq(a, b, ...) cr_assert_neq(a, b, ##__VA_ARGS__)
#define cr_expect_lt(a, b, ...) cr_assert_lt(a, b, ##__VA_ARGS__)
#define cr_expect_leq(a, b, ...) cr_assert_leq(a, b, ##__VA_ARGS__)
#define cr_expect_gt(a, b, ...) cr_assert_gt(a, b, ##__VA_ARGS__)
#define cr_expect_geq(a, b, ...) cr_assert_geq(a, b, ##__VA_ARGS__)
#define cr_expect_null(p, ...) cr_assert_null(p, ##__VA_ARGS__)
#define cr_expect_not_null(p, ...) cr_assert_not_null(p, ##__VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) cr_assert_str_eq(a, b, ##__VA_ARGS__)
#define cr_assert_str_empty(s, ...) CRL_CHECK((s)[0] == '\0', #s " is empty", ##__VA_ARGS__)
#define cr_assert_str_not_empty(s, ...) CRL_CHECK((s)[0] != '\0', #s " is not empty", ##__VA_ARGS__)
#define cr_log_info(...) (fprintf(stdout, __VA_ARGS__), fputc('\n', stdout))
#define cr_log_warn(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
/* In a test's own body only: say why, and end the test. */
#define cr_skip_test(...)                                                                          \
    do {                                                                                           \
        cr_log_warn("skipped: " __VA_ARGS__);                                                      \
        return;                                                                                    \
    } while (0)

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    for (int i = 0; i < crl_n_tests; i++) {
        printf("[RUN ] %s::%s\n", crl_tests[i].suite, crl_tests[i].name);
        fflush(stdout);
        crl_tests[i].fn();
        printf("[PASS] %s::%s\n", crl_tests[i].suite, crl_tests[i].name);
    }
    printf("%d passed, 0 failed\n", crl_n_tests);
    return crl_n_tests > 0 ? 0 : 1;
}

#endif
