/*
 * svg.c — the demo's timeline plot: in flight, the limit, the events and
 * the ceiling, written as SVG by hand (no plotting dependency).
 */
#define _GNU_SOURCE
#include "demo.h"

/* ---- the timeline plot (SVG by hand: no plotting dependency) ------------------------ */

#define SVG_W 960
#define SVG_H 440
#define SVG_LEFT 64
#define SVG_RIGHT 24
#define SVG_TOP 56
#define SVG_BOTTOM 56

struct plot {
    FILE *f;
    double t_max, y_max;
};

static double px(const struct plot *p, double t)
{
    return SVG_LEFT + t / p->t_max * (SVG_W - SVG_LEFT - SVG_RIGHT);
}

static double py(const struct plot *p, double y)
{
    return SVG_H - SVG_BOTTOM - y / p->y_max * (SVG_H - SVG_TOP - SVG_BOTTOM);
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) for about `n` ticks. */
static double tick_step(double range, int n)
{
    double raw = range / n, mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void svg_axes(struct plot *p)
{
    FILE *f = p->f;
    double ys = tick_step(p->y_max, 6), ts = tick_step(p->t_max, 10);
    fprintf(f, "<g font-size='12' fill='#555'>\n");
    for (double y = 0; y <= p->y_max + 1e-9; y += ys)
        fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#e5e5e5'/>"
                   "<text x='%d' y='%.1f' text-anchor='end'>%g</text>\n",
                SVG_LEFT, SVG_W - SVG_RIGHT, py(p, y), py(p, y), SVG_LEFT - 6, py(p, y) + 4, y);
    for (double t = 0; t <= p->t_max + 1e-9; t += ts)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle'>%g</text>\n", px(p, t),
                SVG_H - SVG_BOTTOM + 18, t);
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#888'/>\n", SVG_LEFT,
            SVG_W - SVG_RIGHT, py(p, 0), py(p, 0));
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>seconds since the first request</text>\n",
            (SVG_LEFT + SVG_W - SVG_RIGHT) / 2, SVG_H - 14);
    fprintf(f, "<text transform='translate(18 %d) rotate(-90)' text-anchor='middle'>"
               "requests in parallel</text>\n</g>\n",
            (SVG_TOP + SVG_H - SVG_BOTTOM) / 2);
}

/* In flight, sampled every tick, as a filled area under the limit. */
static void svg_in_flight(struct plot *p, const struct demo *d)
{
    fprintf(p->f, "<polygon fill='#2ca02c' fill-opacity='0.25' stroke='#2ca02c' "
                  "stroke-width='1' points='%.1f,%.1f ",
            px(p, 0), py(p, 0));
    for (size_t i = 0; i < d->n_samples; i++)
        fprintf(p->f, "%.1f,%.1f ", px(p, d->samples[i].t_s), py(p, d->samples[i].in_flight));
    if (d->n_samples)
        fprintf(p->f, "%.1f,%.1f", px(p, d->samples[d->n_samples - 1].t_s), py(p, 0));
    fprintf(p->f, "'/>\n");
}

/* The limit as a step line from the events: every change of the limit is
 * one, so even a cut made within a tick of the rise before it shows. */
static void svg_limit(struct plot *p, const struct demo *d)
{
    uint32_t limit = d->n_samples ? d->samples[0].limit : 0;
    if (d->n_events && since_start_s(d, d->events[0].t_ns) <= 0)
        limit = d->events[0].old_limit;
    fprintf(p->f, "<polyline fill='none' stroke='#1f77b4' stroke-width='2.5' "
                  "stroke-linejoin='round' points='%.1f,%.1f ",
            px(p, 0), py(p, limit));
    for (size_t i = 0; i < d->n_events; i++) {
        double x = px(p, since_start_s(d, d->events[i].t_ns));
        fprintf(p->f, "%.1f,%.1f %.1f,%.1f ", x, py(p, limit), x, py(p, d->events[i].new_limit));
        limit = d->events[i].new_limit;
    }
    fprintf(p->f, "%.1f,%.1f'/>\n", px(p, p->t_max), py(p, limit));
}

/* Red ticks on the time axis where 429s came back (height: how many), and a
 * red dot wherever discovery backed off; a dashed line when the lock came. */
static void svg_marks(struct plot *p, const struct demo *d)
{
    FILE *f = p->f;
    fprintf(f, "<g stroke='#d62728' stroke-width='2'>\n");
    for (size_t i = 1; i < d->n_samples; i++) {
        long n = d->samples[i].overloads - d->samples[i - 1].overloads;
        if (n > 0)
            fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f'/>\n", px(p, d->samples[i].t_s),
                    px(p, d->samples[i].t_s), py(p, 0), py(p, 0) - 6 - 4 * log2((double)n + 1));
    }
    fprintf(f, "</g>\n");
    for (size_t i = 0; i < d->n_events; i++) {
        const struct sluice_event *e = &d->events[i];
        double x = px(p, since_start_s(d, e->t_ns));
        if (e->kind == SLUICE_EVENT_BACKOFF)
            fprintf(f, "<circle cx='%.1f' cy='%.1f' r='4' fill='#d62728'/>\n", x,
                    py(p, e->old_limit));
        if (e->kind == SLUICE_EVENT_LOCK || e->kind == SLUICE_EVENT_RESTORE)
            fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%d' y2='%.1f' stroke='#9467bd' "
                       "stroke-dasharray='6 4'/><text x='%.1f' y='%d' font-size='12' "
                       "fill='#9467bd'>%s %" PRIu32 " at %.1f s</text>\n",
                    x, x, SVG_TOP - 6, py(p, 0), x + 4, SVG_TOP + 8,
                    e->kind == SLUICE_EVENT_LOCK ? "locked" : "restored", e->ceiling,
                    since_start_s(d, e->t_ns));
    }
}

static void svg_legend(struct plot *p, const struct demo *d, uint32_t ceiling)
{
    FILE *f = p->f;
    fprintf(f, "<text x='%d' y='22' font-size='16' font-weight='bold'>sluice demo: %s, true cap "
               "%u, discovered ceiling %" PRIu32 "</text>\n",
            SVG_LEFT, NODE, d->o->cap, ceiling);
    static const struct {
        const char *label, *style;
    } keys[] = {
        {"limit", "stroke='#1f77b4' stroke-width='2.5'"},
        {"in flight", "stroke='#2ca02c' stroke-width='6' stroke-opacity='0.35'"},
        {"true cap", "stroke='#999' stroke-dasharray='4 3'"},
        {"429s / backoff", "stroke='#d62728' stroke-width='2'"},
        {"lock", "stroke='#9467bd' stroke-dasharray='6 4'"},
    };
    int x = SVG_LEFT;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        fprintf(f, "<line x1='%d' x2='%d' y1='40' y2='40' %s/><text x='%d' y='44' "
                   "font-size='12'>%s</text>\n",
                x, x + 22, keys[i].style, x + 28, keys[i].label);
        x += 40 + 7 * (int)strlen(keys[i].label);
    }
}

/*
 * Where this run's plot goes: --svg, except for a run that restored its lock (its plot
 * is a flat line at the ceiling), whose name gets "-restored" before the extension, so
 * the discovery plot the run before drew is kept.
 */
const char *plot_path(const struct demo *d, char *buf, size_t size)
{
    const char *svg = d->o->svg, *slash = strrchr(svg, '/'), *dot = strrchr(svg, '.');
    if (!d->restored)
        return svg;
    size_t stem = dot && dot > (slash ? slash + 1 : svg) ? (size_t)(dot - svg) : strlen(svg);
    snprintf(buf, size, "%.*s-restored%s", (int)stem, svg, svg + stem);
    return buf;
}

int write_svg(const struct demo *d, uint32_t ceiling)
{
    char buf[PATH_MAX];
    const char *path = plot_path(d, buf, sizeof buf);
    FILE *f = fopen(path, "w");
    if (!f)
        return fail("cannot write %s: %s (choose another --svg)", path, strerror(errno));
    struct plot p = {.f = f, .t_max = 1, .y_max = d->o->cap};
    for (size_t i = 0; i < d->n_samples; i++) {
        p.t_max = fmax(p.t_max, d->samples[i].t_s);
        p.y_max = fmax(p.y_max, fmax(d->samples[i].limit, d->samples[i].in_flight));
    }
    for (size_t i = 0; i < d->n_events; i++)
        p.y_max = fmax(p.y_max, fmax(d->events[i].old_limit, d->events[i].new_limit));
    p.y_max *= 1.15;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
               "font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    svg_axes(&p);
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#999' stroke-dasharray='4 3'/>"
               "<text x='%d' y='%.1f' font-size='12' fill='#777' text-anchor='end'>true cap %u"
               "</text>\n",
            SVG_LEFT, SVG_W - SVG_RIGHT, py(&p, d->o->cap), py(&p, d->o->cap), SVG_W - SVG_RIGHT - 4,
            py(&p, d->o->cap) - 5, d->o->cap);
    svg_in_flight(&p, d);
    svg_limit(&p, d);
    svg_marks(&p, d);
    svg_legend(&p, d, ceiling);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return fail("cannot write %s: %s", path, strerror(errno));
    return EXIT_OK;
}

