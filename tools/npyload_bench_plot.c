/* npyload-bench, the heatmap: the workers x prefetch grid, one panel per io
 * backend, coloured by GB/s (or by stall % with --compute-ms), the
 * recommended cell framed in red. Written as SVG, a text format any browser
 * shows, and the bench's one plot (bench/demo.sh draws it on a machine with
 * no Python). Pure: tests/test_bench_report.c checks it. */
#include "npyload_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* SVG primitives                                                             */
/* ------------------------------------------------------------------------ */

static void nb_rect(FILE *f, int x, int y, int w, int h, uint32_t rgb)
{
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#%06x\"/>\n", x,
            y, w, h, rgb & 0xffffff);
}

/* A frame of width t inside the cell (the recommended configuration). */
static void nb_frame(FILE *f, int x, int y, int w, int h, int t, uint32_t rgb)
{
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"#%06x\" stroke-width=\"%d\"/>\n",
            x + t / 2, y + t / 2, w - t, h - t, rgb & 0xffffff, t);
}

enum { NB_LEFT, NB_CENTRE, NB_RIGHT };

/* s with <, > and & escaped for XML text. */
static void nb_xml_escaped(FILE *f, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '&')
            fputs("&amp;", f);
        else
            fputc(*p, f);
    }
}

/* Text with its top at y; `size` is the font size in pixels; `rotate`
 * turns it by -90 degrees around its anchor (the y axis label). */
static void nb_text(FILE *f, int x, int y, const char *s, int size, uint32_t rgb, int align,
                    int rotate)
{
    static const char *anchor[] = {"start", "middle", "end"};
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" font-family=\"monospace\" font-size=\"%d\" "
            "text-anchor=\"%s\" fill=\"#%06x\"",
            x, y + size * 4 / 5, size, anchor[align], rgb & 0xffffff);
    if (rotate)
        fprintf(f, " transform=\"rotate(-90 %d %d)\"", x, y);
    fputc('>', f);
    nb_xml_escaped(f, s);
    fputs("</text>\n", f);
}

/* Width of s in a monospace font of `size` pixels (0.6 em a character). */
static int nb_text_width(const char *s, int size)
{
    return (int)strlen(s) * size * 3 / 5;
}

/* A perceptually ordered palette (viridis stops), t in [0,1]. */
static uint32_t nb_palette(double t)
{
    static const uint8_t stops[5][3] = {
        {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
    if (!(t >= 0))
        t = 0;
    if (t > 1)
        t = 1;
    double x = t * 4;
    int i = (int)x;
    if (i >= 4)
        i = 3;
    double f = x - i;
    uint32_t rgb = 0;
    for (int k = 0; k < 3; k++) {
        double v = stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f;
        rgb = (rgb << 8) | (uint32_t)(v + 0.5);
    }
    return rgb;
}

static uint32_t nb_text_on(uint32_t bg)
{
    double l = 0.299 * (bg >> 16 & 0xff) + 0.587 * (bg >> 8 & 0xff) +
               0.114 * (bg & 0xff);
    return l < 140 ? 0xffffff : 0x000000;
}

static int nb_int_index(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return i;
    return -1;
}

static void nb_sort_unique(int *v, int *n)
{
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (k == 0 || v[k - 1] != v[i])
            v[k++] = v[i];
    *n = k;
}

/* Layout (pixels). */
enum {
    NB_FONT = 14,
    NB_FONT_BIG = 20,
    NB_CELL_W = 170,
    NB_CELL_H = 64,
    NB_MARGIN_L = 110,
    NB_MARGIN_R = 150, /* colour bar */
    NB_TITLE_H = 136,
    NB_PANEL_TITLE_H = 30,
    NB_AXIS_H = 64,
    NB_FOOT_H = 52,
};

/* The grid's axes and colour scale, gathered from the runs. */
typedef struct nb_grid {
    int ws[NB_MAX_GRID * NB_MAX_GRID * NB_MAX_IO], nw;
    int ps[NB_MAX_GRID * NB_MAX_GRID * NB_MAX_IO], np;
    char ios[NB_MAX_IO][16];
    int nio;
    int stall; /* colour by stall (compute_ms > 0) instead of GB/s */
    double vmin, vmax;
} nb_grid;

/* The text lines around the grid: title, subtitle, ceiling, recommendation.
 * Computed once so the canvas can be made wide enough for them. */
typedef struct nb_plot_text {
    char title[256];
    char machine[320];
    char data[512];
    char sub[256];
    char ceil[160];
    char rec[256];
} nb_plot_text;

static void nb_plot_texts(const nb_report *rep, int stall, nb_plot_text *t)
{
    const nb_config *c = rep->config;
    memset(t, 0, sizeof *t);
    const nb_recommendation *r = rep->rec;
    if (r && r->valid)
        snprintf(t->title, sizeof t->title, "npyload-bench: num_workers=%d prefetch=%d "
                 "recommended (%s)", r->workers, r->prefetch,
                 stall ? "consumer stall %, lower is better"
                       : "throughput GB/s, higher is better");
    else
        snprintf(t->title, sizeof t->title, "npyload-bench: no recommendation (%s)",
                 stall ? "consumer stall %" : "throughput GB/s");
    const nb_machine *m = rep->machine;
    if (m)
        snprintf(t->machine, sizeof t->machine, "machine: %s, %d cores, %s, npyload %s",
                 m->hostname, m->cores_allowed, m->cpu_model, m->library_version);
    size_t l = (size_t)snprintf(t->data, sizeof t->data, "data:");
    for (int k = 0; k < c->nfields && l < sizeof t->data; k++) {
        const nb_field_info *fi = &c->fields[k];
        l += (size_t)snprintf(t->data + l, sizeof t->data - l, "%s %s %s (", k ? "," : "",
                              fi->name, fi->descr);
        for (int d = 0; d < fi->ndim && l < sizeof t->data; d++)
            l += (size_t)snprintf(t->data + l, sizeof t->data - l, "%s%lld", d ? "," : "",
                                  (long long)fi->shape[d]);
        if (l < sizeof t->data)
            l += (size_t)snprintf(t->data + l, sizeof t->data - l, ")%s%s",
                                  fi->has_transform ? " -> " : "", fi->transform);
    }
    char dev[24];
    if (c->device < 0)
        snprintf(dev, sizeof dev, "cpu");
    else
        snprintf(dev, sizeof dev, "cuda:%d", c->device);
    snprintf(t->sub, sizeof t->sub, "batch %d, %s%s%s, %s, %lld samples",
             c->batch_size,
             c->shuffle == 2 ? "local shuffle" : c->shuffle ? "shuffle" : "in order",
             c->cold ? ", cold cache" : "", c->direct ? ", o_direct" : "", dev,
             (long long)c->num_samples);
    if (stall) {
        size_t e = strlen(t->sub);
        snprintf(t->sub + e, sizeof t->sub - e, ", compute %.3g ms/step",
                 c->compute_ms);
    }
    for (size_t i = 0; i < rep->nceilings; i++)
        if (rep->ceilings[i].measured &&
            strcmp(rep->ceilings[i].name, c->ceiling_ref) == 0)
            snprintf(t->ceil, sizeof t->ceil, "ceiling (%s): %.2f GB/s",
                     rep->ceilings[i].name, rep->ceilings[i].gbps);
    if (rep->rec && rep->rec->valid)
        nb_format_recommendation(rep->rec, c->compute_ms, t->rec, sizeof t->rec);
}

static void nb_grid_add(nb_grid *g, const nb_run *r)
{
    if (nb_int_index(g->ws, g->nw, r->workers) < 0)
        g->ws[g->nw++] = r->workers;
    if (nb_int_index(g->ps, g->np, r->prefetch) < 0)
        g->ps[g->np++] = r->prefetch;
    int seen = 0;
    for (int k = 0; k < g->nio; k++)
        seen |= strcmp(g->ios[k], r->io_requested_name) == 0;
    if (!seen && g->nio < NB_MAX_IO)
        snprintf(g->ios[g->nio++], sizeof g->ios[0], "%s", r->io_requested_name);
    if (r->ok) {
        double v = g->stall ? r->stall_pct : r->gbps;
        g->vmin = v < g->vmin ? v : g->vmin;
        g->vmax = v > g->vmax ? v : g->vmax;
    }
}

/* @return : 0, or -1 when there is no run to draw. */
static int nb_grid_make(const nb_report *rep, nb_grid *g)
{
    memset(g, 0, sizeof *g);
    g->stall = rep->config->compute_ms > 0;
    g->vmin = INFINITY;
    g->vmax = -INFINITY;
    size_t cap = sizeof g->ws / sizeof g->ws[0];
    for (size_t i = 0; i < rep->nruns && i < cap; i++)
        nb_grid_add(g, &rep->runs[i]);
    if (g->nw == 0 || g->np == 0)
        return -1;
    nb_sort_unique(g->ws, &g->nw);
    nb_sort_unique(g->ps, &g->np);
    if (!isfinite(g->vmin)) {
        g->vmin = 0;
        g->vmax = 1;
    }
    if (!g->stall)
        g->vmin = 0; /* throughput from zero: colours compare ratios honestly */
    return 0;
}

/* One cell: its colour and two lines of figures. */
static void nb_cell(FILE *f, const nb_report *rep, const nb_grid *g, int x, int y,
                    const nb_run *r, int ri)
{
    uint32_t bg = 0xdddddd;
    char l1[32] = "-", l2[48] = "";
    if (r && r->ok) {
        double v = g->stall ? r->stall_pct : r->gbps;
        double t = g->vmax > g->vmin ? (v - g->vmin) / (g->vmax - g->vmin) : 1.0;
        bg = nb_palette(g->stall ? 1.0 - t : t); /* low stall is good: bright */
        if (g->stall) {
            snprintf(l1, sizeof l1, "%.1f%%", r->stall_pct);
            snprintf(l2, sizeof l2, "%.2f GB/s", r->gbps);
        } else {
            snprintf(l1, sizeof l1, "%.2f", r->gbps);
            if (r->frac_of_ceiling >= 0)
                snprintf(l2, sizeof l2, "%.0f%% of ceil", 100 * r->frac_of_ceiling);
            else
                snprintf(l2, sizeof l2, "p99 %.1f ms", r->p99_ms);
        }
    } else if (r) {
        snprintf(l1, sizeof l1, "failed");
    }
    nb_rect(f, x + 1, y + 1, NB_CELL_W - 2, NB_CELL_H - 2, bg);
    uint32_t fg = nb_text_on(bg);
    nb_text(f, x + NB_CELL_W / 2, y + 10, l1, NB_FONT_BIG, fg, NB_CENTRE, 0);
    nb_text(f, x + NB_CELL_W / 2, y + 38, l2, NB_FONT, fg, NB_CENTRE, 0);
    if (rep->rec && rep->rec->valid && rep->rec->run_index == ri)
        nb_frame(f, x, y, NB_CELL_W, NB_CELL_H, 4, 0xe0102f);
}

/* The run of (workers, prefetch, io), or NULL; its index in *ri. */
static const nb_run *nb_find(const nb_report *rep, int w, int p, const char *io, int *ri)
{
    const nb_run *r = NULL;
    *ri = -1;
    for (size_t i = 0; i < rep->nruns; i++)
        if (rep->runs[i].workers == w && rep->runs[i].prefetch == p &&
            strcmp(rep->runs[i].io_requested_name, io) == 0) {
            r = &rep->runs[i];
            *ri = (int)i;
        }
    return r;
}

/* Panel k: the grid of one io backend, with its axes. */
static void nb_panel(FILE *f, const nb_report *rep, const nb_grid *g, int k)
{
    const uint32_t ink = 0x202020;
    char buf[64];
    int grid_w = g->np * NB_CELL_W, grid_h = g->nw * NB_CELL_H;
    int top = NB_TITLE_H + k * (NB_PANEL_TITLE_H + grid_h + NB_AXIS_H);
    int gx = NB_MARGIN_L, gy = top + NB_PANEL_TITLE_H;
    const char *used = "";
    for (size_t i = 0; i < rep->nruns; i++)
        if (rep->runs[i].ok && strcmp(rep->runs[i].io_requested_name, g->ios[k]) == 0)
            used = rep->runs[i].io_used;
    if (*used && strcmp(used, g->ios[k]) != 0)
        snprintf(buf, sizeof buf, "io = %s (active: %s)", g->ios[k], used);
    else
        snprintf(buf, sizeof buf, "io = %s", g->ios[k]);
    nb_text(f, gx, top + 6, buf, NB_FONT, ink, NB_LEFT, 0);
    for (int wi = 0; wi < g->nw; wi++) {
        int y = gy + (g->nw - 1 - wi) * NB_CELL_H; /* more workers higher up */
        snprintf(buf, sizeof buf, "%d", g->ws[wi]);
        nb_text(f, gx - 12, y + NB_CELL_H / 2 - 7, buf, NB_FONT, ink, NB_RIGHT, 0);
        for (int pi = 0; pi < g->np; pi++) {
            int ri;
            const nb_run *r = nb_find(rep, g->ws[wi], g->ps[pi], g->ios[k], &ri);
            nb_cell(f, rep, g, gx + pi * NB_CELL_W, y, r, ri);
        }
    }
    for (int pi = 0; pi < g->np; pi++) {
        snprintf(buf, sizeof buf, "%d", g->ps[pi]);
        nb_text(f, gx + pi * NB_CELL_W + NB_CELL_W / 2, gy + grid_h + 8, buf, NB_FONT, ink,
                NB_CENTRE, 0);
    }
    nb_text(f, gx + grid_w / 2, gy + grid_h + 34, "prefetch (batch slots)", NB_FONT, ink,
            NB_CENTRE, 0);
    nb_text(f, 30, gy + grid_h / 2, "workers", NB_FONT, ink, NB_CENTRE, 1);
}

static void nb_colour_bar(FILE *f, const nb_grid *g)
{
    int bx = NB_MARGIN_L + g->np * NB_CELL_W + 40;
    int by = NB_TITLE_H + NB_PANEL_TITLE_H;
    int bh = g->nw * NB_CELL_H < 120 ? 120 : g->nw * NB_CELL_H;
    fprintf(f, "<defs><linearGradient id=\"bar\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">");
    for (int i = 0; i <= 4; i++)
        fprintf(f, "<stop offset=\"%d%%\" stop-color=\"#%06x\"/>", 25 * i,
                nb_palette(i / 4.0));
    fprintf(f, "</linearGradient></defs>\n");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"20\" height=\"%d\" fill=\"url(#bar)\"/>\n",
            bx, by, bh);
    char hi[32], lo[32];
    const char *fmt = g->stall ? "%.1f%%" : "%.2f";
    /* The bright end is the good end: high GB/s, low stall. */
    snprintf(hi, sizeof hi, fmt, g->stall ? g->vmin : g->vmax);
    snprintf(lo, sizeof lo, fmt, g->stall ? g->vmax : g->vmin);
    nb_text(f, bx + 26, by, hi, NB_FONT, 0x202020, NB_LEFT, 0);
    nb_text(f, bx + 26, by + bh - 14, lo, NB_FONT, 0x202020, NB_LEFT, 0);
}

int nb_write_plot(const char *path, const nb_report *rep)
{
    nb_grid g;
    if (nb_grid_make(rep, &g) != 0)
        return -1;
    nb_plot_text tx;
    nb_plot_texts(rep, g.stall, &tx);
    int w = NB_MARGIN_L + g.np * NB_CELL_W + NB_MARGIN_R;
    int tw[6] = {nb_text_width(tx.title, NB_FONT_BIG), nb_text_width(tx.sub, NB_FONT),
                 nb_text_width(tx.ceil, NB_FONT), nb_text_width(tx.rec, NB_FONT),
                 nb_text_width(tx.machine, NB_FONT), nb_text_width(tx.data, NB_FONT)};
    for (int i = 0; i < 6; i++)
        w = tw[i] + 32 > w ? tw[i] + 32 : w;
    int h = NB_TITLE_H + g.nio * (NB_PANEL_TITLE_H + g.nw * NB_CELL_H + NB_AXIS_H) + NB_FOOT_H;
    if (h < NB_TITLE_H + NB_PANEL_TITLE_H + 120 + NB_FOOT_H + 20)
        h = NB_TITLE_H + NB_PANEL_TITLE_H + 120 + NB_FOOT_H + 20;

    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\">\n",
            w, h, w, h);
    fputs("<title>", f);
    nb_xml_escaped(f, tx.title);
    fputs("</title>\n", f);
    nb_rect(f, 0, 0, w, h, 0xffffff);
    nb_text(f, 16, 12, tx.title, NB_FONT_BIG, 0x202020, NB_LEFT, 0);
    nb_text(f, 16, 44, tx.machine, NB_FONT, 0x505050, NB_LEFT, 0);
    nb_text(f, 16, 64, tx.data, NB_FONT, 0x505050, NB_LEFT, 0);
    nb_text(f, 16, 84, tx.sub, NB_FONT, 0x505050, NB_LEFT, 0);
    nb_text(f, 16, 104, tx.ceil, NB_FONT, 0x505050, NB_LEFT, 0);
    for (int k = 0; k < g.nio; k++)
        nb_panel(f, rep, &g, k);
    nb_colour_bar(f, &g);
    if (tx.rec[0]) {
        nb_text(f, 16, h - NB_FOOT_H + 4, tx.rec, NB_FONT, 0xe0102f, NB_LEFT, 0);
        nb_text(f, 16, h - NB_FOOT_H + 24, "red frame = recommended configuration", NB_FONT,
                0x505050, NB_LEFT, 0);
    }
    fputs("</svg>\n", f);
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}
