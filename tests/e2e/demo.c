/*
 * sluice-demo end to end, as CI runs it (no terminal, short runs, small
 * caps): its last line is `discovered ceiling: N (true cap: C)` with N in
 * [0.85·C, C]; it leaves the SVG timeline and the persisted lock; a second
 * run restores that lock (🔒 from the first status line) and says so, and
 * writes its plot beside the first one (NAME-restored.svg); a run
 * against another cap clears the stale lock and discovers again.
 */
#include <math.h>

#include "admin_fixture.h"

#ifndef SLUICE_DEMO_PATH
#error "SLUICE_DEMO_PATH must name the sluice-demo binary (tests/CMakeLists.txt sets it)"
#endif

#define LOCKED_GLYPH "\xF0\x9F\x94\x92" /* 🔒 */
#define RUN_MS 40000                    /* one run: --timeout 25 s plus start and stop */

static char dir[256];

static void cleanup(void)
{
    fixture_rmtree(dir);
}

/* Run the demo against cap `cap` with the test's state file and plot. */
static struct proc_result *run_demo(unsigned cap, char *svg, size_t svg_size)
{
    char cap_s[16], state[300];
    snprintf(cap_s, sizeof cap_s, "%u", cap);
    snprintf(state, sizeof state, "%s/ceilings.json", dir);
    snprintf(svg, svg_size, "%s/timeline-%u.svg", dir, cap);
    const char *argv[] = {SLUICE_DEMO_PATH, "--cap", cap_s,    "--seconds",    "3",
                          "--timeout",      "25",  "--state", state,          "--svg",
                          svg,              "--admin-port", "0", NULL};
    struct proc_result *r = proc_run(argv, NULL, RUN_MS);
    cr_assert_not(r->timed_out, "sluice-demo ran past %d ms:\n%s", RUN_MS, r->out);
    return r;
}

/* The discovered N from the last line, which must be exactly the result line. */
static unsigned final_ceiling(const struct proc_result *r, unsigned cap)
{
    char last[128], want[128];
    last_line(r->out, last, sizeof last);
    unsigned n = 0;
    cr_assert_eq(sscanf(last, "discovered ceiling: %u", &n), 1, "last line \"%s\"\n%s\n%s", last,
                 r->out, r->err);
    snprintf(want, sizeof want, "discovered ceiling: %u (true cap: %u)", n, cap);
    cr_assert_str_eq(last, want);
    return n;
}

/* The first live status line ("  0.05s  cloud:demo 5/5 📈  ..."). */
static void first_status_line(const char *out, char *buf, size_t size)
{
    const char *p = strstr(out, " cloud:demo ");
    cr_assert_not_null(p, "no status line:\n%s", out);
    const char *end = strchr(p, '\n');
    snprintf(buf, size, "%.*s", (int)(end ? end - p : (ptrdiff_t)strlen(p)), p);
}

/* The whole plot at `path`, which must be an SVG (malloc'd). */
static char *read_plot(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no timeline at %s", path);
    char *text = calloc(1, 1 << 20);
    size_t got = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[got] = '\0';
    cr_expect(strncmp(text, "<svg", 4) == 0, "%s does not start with <svg: %.200s", path, text);
    return text;
}

static void assert_in_band(unsigned n, unsigned cap)
{
    cr_assert(n >= ceil(0.85 * cap) && n <= cap, "discovered %u, outside [0.85·%u, %u]", n, cap,
              cap);
}

Test(demo, discovers_the_cap_then_a_second_run_restores_the_lock_at_once, .fini = cleanup,
     .timeout = 120)
{
    fixture_tmpdir(dir, sizeof dir);
    char svg[300], line[256];

    struct proc_result *r = run_demo(16, svg, sizeof svg);
    unsigned first = final_ceiling(r, 16);
    fprintf(stderr, "sluice-demo, cap 16: discovered ceiling %u\n", first);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    assert_in_band(first, 16);
    cr_expect(strstr(r->out, "429 share") && strstr(r->out, "goodput") &&
                  strstr(r->out, "elapsed"),
              "summary incomplete:\n%s", r->out);
    cr_expect(strstr(r->out, " clear cloud:demo --state ") &&
                  strstr(r->out, "/compute/concurrency/clear?node_id=cloud:demo") &&
                  strstr(r->out, "sluice_engine_clear(engine, \"cloud:demo\")"),
              "the three ways to clear are not all shown:\n%s", r->out);
    /* Under the timeline, its causes in words: slow start's, wrapped to 80 columns. */
    cr_expect(strstr(r->out, "\n  what the causes mean:\n    slow_start      every permit in use "
                             "and no congestion yet: the limit doubles\n"),
              "the timeline's causes are not explained:\n%s", r->out);
    const char *legend = strstr(r->out, "  what the causes mean:\n");
    for (const char *l = legend; l && *l && *l != '\n';) {
        size_t len = strcspn(l, "\n");
        cr_expect_leq(len, 80, "past 80 columns: %.*s", (int)len, l);
        l += len + (l[len] != '\0');
    }
    free(r);
    char *discovery_plot = read_plot(svg);

    r = run_demo(16, svg, sizeof svg);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "restored"), "the second run does not say it restored:\n%s", r->out);
    first_status_line(r->out, line, sizeof line);
    cr_expect(strstr(line, LOCKED_GLYPH), "not locked from the first status line: %s", line);
    cr_expect_eq(final_ceiling(r, 16), first, "the restored ceiling differs from the saved one");
    /* Its plot (a flat line at the ceiling) goes beside the discovery plot, which stays. */
    char restored[320];
    snprintf(restored, sizeof restored, "%.*s-restored.svg", (int)(strlen(svg) - 4), svg);
    cr_expect(strstr(r->out, restored) != NULL, "the summary names %s:\n%s", restored, r->out);
    char *again_plot = read_plot(svg);
    cr_expect_str_eq(again_plot, discovery_plot, "the restored run overwrote the discovery plot");
    free(again_plot);
    free(read_plot(restored));
    free(discovery_plot);
    free(r);

    /* Another cap is another provider plan: the stale lock goes, discovery reruns. */
    r = run_demo(8, svg, sizeof svg);
    unsigned again = final_ceiling(r, 8);
    fprintf(stderr, "sluice-demo, cap 8 after 16: discovered ceiling %u\n", again);
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    cr_expect(strstr(r->out, "cleared"), "the stale lock was not reported cleared:\n%s", r->out);
    assert_in_band(again, 8);
    free(r);
}
