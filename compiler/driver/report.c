/* report.c - `hpdlc report`: charts of training runs (report.h). The axis
 * arithmetic is in long double: a fuzzed or diverged file may hold values
 * near the double's range, whose span would overflow a double. */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* geometry and style                                                  */

enum {
  CH_W = 720, /* one chart */
  CH_H = 320,
  M_L = 80, /* margins around the plot area: tick labels and axis titles */
  M_R = 20,
  M_T = 40,
  M_B = 50,
  PW = CH_W - M_L - M_R,
  PH = CH_H - M_T - M_B,
  LEG_ROW = 20 /* a legend line */
};

typedef struct {
  MetricField field;
  const char *id, *title, *ylabel;
} ChartSpec;

static const ChartSpec charts[] = {
    {METRIC_LOSS, "loss", "Loss", "loss"},
    {METRIC_LR, "lr", "Learning rate", "learning rate"},
    {METRIC_GRAD_NORM, "grad_norm", "Gradient norm (before clipping)", "gradient norm"},
    {METRIC_TOKENS_PER_S, "tokens_per_s", "Throughput", "tokens/s"},
};
enum { NCHARTS = sizeof charts / sizeof charts[0] };

/* Tableau's ten colours: distinct for the colour-blind in the first few */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
enum { NCOLORS = sizeof palette / sizeof palette[0] };

static const char *color_of(int i) { return palette[i % NCOLORS]; }
/* beyond ten runs the colours repeat, with a dash pattern to tell them apart */
static const char *dash_of(int i) {
  static const char *const d[] = {"", " stroke-dasharray=\"6 3\"", " stroke-dasharray=\"2 2\"", " stroke-dasharray=\"8 3 2 3\""};
  return d[(i / NCOLORS) % 4];
}

/* ------------------------------------------------------------------ */
/* text                                                                */

/* Writes s escaped for XML and HTML text and attributes. Bytes that are not
 * UTF-8, and control characters, become '?': a file name may hold any byte,
 * and one bad byte would make the whole SVG unreadable to an XML parser. */
static void put_text(FILE *f, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    int ok = len > 0;
    for (int k = 1; ok && k < len; k++) ok = (p[k] & 0xc0) == 0x80;
    if (ok && len == 2 && c < 0xc2) ok = 0; /* overlong */
    if (!ok) {
      fputc('?', f);
      p++;
      continue;
    }
    if (len > 1) {
      fwrite(p, 1, (size_t)len, f);
      p += len;
      continue;
    }
    switch (c) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(c < 0x20 || c == 0x7f ? '?' : (int)c, f);
    }
    p++;
  }
}

/* ------------------------------------------------------------------ */
/* axes                                                                */

typedef struct {
  long double lo, hi;   /* the data range the axis spans */
  long double step;     /* between ticks */
  int nticks;
  long double tick[24];
} Axis;

/* 1, 2 or 5 times a power of ten, about span / want */
static long double nice_step(long double span, int want) {
  long double raw = span / want;
  long double e = floorl(log10l(raw)), p = powl(10.0L, e), f = raw / p;
  return (f < 1.5L ? 1.0L : f < 3.5L ? 2.0L : f < 7.5L ? 5.0L : 10.0L) * p;
}

static void axis_ticks(Axis *a, int want, int integer) {
  long double span = a->hi - a->lo;
  a->step = nice_step(span, want);
  if (integer && a->step < 1.0L) a->step = 1.0L;
  a->nticks = 0;
  long double first = ceill(a->lo / a->step);
  for (int k = 0; a->nticks < 24; k++) {
    long double t = (first + k) * a->step;
    if (t > a->hi + a->step * 1e-9L) break;
    if (fabsl(t) < a->step * 1e-6L) t = 0; /* no "-0.000" */
    a->tick[a->nticks++] = t;
  }
}

/* The axis of one metric over every run: the finite values' range with 5%
 * of room, or around the single value. Returns the number of finite values. */
static size_t value_axis(Axis *a, const MetricsRun *runs, int nruns, MetricField fld) {
  long double lo = INFINITY, hi = -INFINITY;
  size_t n = 0;
  for (int r = 0; r < nruns; r++)
    for (size_t i = 0; i < runs[r].n; i++) {
      double v = runs[r].rec[i].v[fld];
      if (isnan(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
      n++;
    }
  if (n == 0) {
    lo = 0;
    hi = 1;
  } else if (hi - lo <= fabsl(hi) * 1e-12L) { /* flat: an axis around the value */
    long double pad = fabsl(hi) > 0 ? fabsl(hi) * 0.1L : 1.0L;
    lo -= pad;
    hi += pad;
  } else {
    long double pad = (hi - lo) * 0.05L;
    /* a non-negative series (rates, norms, tokens/s) does not dip below 0 */
    lo = (lo >= 0 && lo - pad < 0) ? 0 : lo - pad;
    hi += pad;
  }
  a->lo = lo;
  a->hi = hi;
  axis_ticks(a, 5, 0);
  return n;
}

static void step_axis(Axis *a, const MetricsRun *runs, int nruns) {
  long double lo = INFINITY, hi = -INFINITY;
  for (int r = 0; r < nruns; r++) {
    if (runs[r].n == 0) continue;
    if (runs[r].rec[0].step < lo) lo = (long double)runs[r].rec[0].step;
    if (runs[r].rec[runs[r].n - 1].step > hi) hi = (long double)runs[r].rec[runs[r].n - 1].step;
  }
  if (!(lo <= hi)) lo = hi = 1;
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  a->lo = lo;
  a->hi = hi;
  axis_ticks(a, 8, 1);
}

/* A tick label: 300k, 1.5M for large values, plain decimals for ordinary
 * ones, with as many decimals as the tick step needs; scientific beyond. */
static void tick_label(char *buf, size_t n, long double v, const Axis *a) {
  long double big = fmaxl(fabsl(a->lo), fabsl(a->hi));
  if (big >= 1e4L && big < 1e15L) {
    static const char *const suffix[] = {"", "k", "M", "G", "T"};
    int u = (int)(log10l(big) / 3);
    if (u > 4) u = 4;
    long double div = powl(1000.0L, u), st = a->step / div;
    int dec = st >= 1 ? 0 : (int)ceill(-log10l(st) - 1e-9L);
    if (dec > 6) dec = 6;
    snprintf(buf, n, "%.*Lf%s", dec, v / div, suffix[u]);
  } else if (big >= 1e-3L && big < 1e4L) {
    int dec = a->step >= 1 ? 0 : (int)ceill(-log10l(a->step) - 1e-9L);
    if (dec > 12) dec = 12;
    snprintf(buf, n, "%.*Lf", dec, v);
  } else {
    int digits = (int)(floorl(log10l(big)) - floorl(log10l(a->step))) + 1;
    if (digits < 1) digits = 1;
    if (digits > 15) digits = 15;
    snprintf(buf, n, "%.*Lg", digits, v);
  }
}

static double px_x(const Axis *a, long double x) { return (double)(M_L + (x - a->lo) / (a->hi - a->lo) * PW); }
static double px_y(const Axis *a, long double y) { return (double)(M_T + PH - (y - a->lo) / (a->hi - a->lo) * PH); }

/* ------------------------------------------------------------------ */
/* a series, thinned per pixel column                                 */

typedef struct {
  FILE *f;
  const char *color;
  int open;       /* a polyline is being written */
  int npoints;    /* in it */
  double fx, fy;  /* its first point: a lone point is drawn as a dot */
} Pen;

static void pen_point(Pen *p, double x, double y) {
  if (!p->open) {
    fputs("<polyline points=\"", p->f);
    p->open = 1;
    p->npoints = 0;
    p->fx = x;
    p->fy = y;
  }
  fprintf(p->f, "%s%.2f,%.2f", p->npoints ? " " : "", x, y);
  p->npoints++;
}

static void pen_break(Pen *p) {
  if (!p->open) return;
  fputs("\"/>\n", p->f);
  if (p->npoints == 1) fprintf(p->f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2\" fill=\"%s\" stroke=\"none\"/>\n", p->fx, p->fy, p->color);
  p->open = 0;
}

/* The records of one pixel column: the indices of its first, lowest,
 * highest and last finite values, and whether a null came after its last. */
typedef struct {
  long col;
  size_t idx[4];
  int have, gap_after;
} Column;

static void column_flush(Pen *p, const MetricsRun *run, MetricField fld, const Axis *xa, const Axis *ya, Column *c) {
  if (c->have) {
    size_t k[4] = {c->idx[0], c->idx[1], c->idx[2], c->idx[3]};
    /* in the order of the steps, each record once */
    for (int i = 1; i < 4; i++)
      for (int j = i; j > 0 && k[j] < k[j - 1]; j--) {
        size_t t = k[j];
        k[j] = k[j - 1];
        k[j - 1] = t;
      }
    for (int i = 0; i < 4; i++) {
      if (i && k[i] == k[i - 1]) continue;
      const MetricsRecord *r = &run->rec[k[i]];
      pen_point(p, px_x(xa, (long double)r->step), px_y(ya, r->v[fld]));
    }
  }
  if (c->gap_after) pen_break(p);
  c->have = c->gap_after = 0;
}

static void draw_series(FILE *f, const MetricsRun *run, int index, MetricField fld, const Axis *xa, const Axis *ya) {
  fprintf(f, "<g class=\"series\" data-file=\"");
  put_text(f, run->name);
  fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\"%s>\n", color_of(index),
          dash_of(index));
  Pen pen = {f, color_of(index), 0, 0, 0, 0};
  Column c = {-1, {0, 0, 0, 0}, 0, 0};
  for (size_t i = 0; i < run->n; i++) {
    long col = (long)floor(px_x(xa, (long double)run->rec[i].step) - M_L);
    if (col != c.col) {
      column_flush(&pen, run, fld, xa, ya, &c);
      c.col = col;
    }
    double v = run->rec[i].v[fld];
    if (isnan(v)) {
      c.gap_after = 1;
      continue;
    }
    if (!c.have) {
      c.idx[0] = c.idx[1] = c.idx[2] = c.idx[3] = i;
      c.have = 1;
    } else {
      if (v < run->rec[c.idx[1]].v[fld]) c.idx[1] = i;
      if (v > run->rec[c.idx[2]].v[fld]) c.idx[2] = i;
      c.idx[3] = i;
    }
    c.gap_after = 0;
  }
  column_flush(&pen, run, fld, xa, ya, &c);
  pen_break(&pen);
  fputs("</g>\n", f);
}

/* ------------------------------------------------------------------ */
/* a chart                                                             */

static void draw_chart(FILE *f, const ChartSpec *cs, const MetricsRun *runs, int nruns, const Axis *xa, int x, int y) {
  Axis ya;
  size_t nvalues = value_axis(&ya, runs, nruns, cs->field);
  char lab[64];
  fprintf(f, "<svg class=\"chart\" id=\"chart-%s\" data-metric=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"12\">\n",
          cs->id, metrics_field_name(cs->field), x, y, CH_W, CH_H, CH_W, CH_H);
  fprintf(f, "<title>%s</title>\n", cs->title);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", CH_W, CH_H);
  fprintf(f, "<text class=\"chart-title\" x=\"%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", M_L, cs->title);
  /* the y axis: grid lines and tick values */
  fputs("<g class=\"axis y\">\n", f);
  for (int i = 0; i < ya.nticks; i++) {
    double py = px_y(&ya, ya.tick[i]);
    tick_label(lab, sizeof lab, ya.tick[i], &ya);
    fprintf(f, "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.2f\" y2=\"%.2f\" stroke=\"#e4e4e4\"/>\n", M_L, M_L + PW, py, py);
    fprintf(f, "<text class=\"tick\" data-y=\"%.2f\" x=\"%d\" y=\"%.2f\" text-anchor=\"end\" fill=\"#333\">%s</text>\n", py, M_L - 6,
            py + 4, lab);
  }
  fputs("</g>\n<g class=\"axis x\">\n", f);
  for (int i = 0; i < xa->nticks; i++) {
    double px = px_x(xa, xa->tick[i]);
    tick_label(lab, sizeof lab, xa->tick[i], xa);
    fprintf(f, "<line class=\"grid\" x1=\"%.2f\" x2=\"%.2f\" y1=\"%d\" y2=\"%d\" stroke=\"#f0f0f0\"/>\n", px, px, M_T, M_T + PH);
    fprintf(f, "<text class=\"tick\" data-x=\"%.2f\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" fill=\"#333\">%s</text>\n", px, px,
            M_T + PH + 16, lab);
  }
  fputs("</g>\n", f);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", M_L, M_T, PW, PH);
  fprintf(f, "<text class=\"axis-label x\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", M_L + PW / 2, CH_H - 10);
  fprintf(f, "<text class=\"axis-label y\" x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">%s</text>\n",
          M_T + PH / 2, M_T + PH / 2, cs->ylabel);
  /* the lines, clipped to the plot area */
  fprintf(f, "<clipPath id=\"clip-%s\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath>\n", cs->id, M_L - 2, M_T - 2,
          PW + 4, PH + 4);
  fprintf(f, "<g clip-path=\"url(#clip-%s)\">\n", cs->id);
  for (int r = 0; r < nruns; r++) draw_series(f, &runs[r], r, cs->field, xa, &ya);
  fputs("</g>\n", f);
  if (nvalues == 0)
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\">no values (every record's %s is null)</text>\n",
            M_L + PW / 2, M_T + PH / 2, metrics_field_name(cs->field));
  fputs("</svg>\n", f);
}

/* The legend: a line of each run's colour and its file name. */
static void draw_legend(FILE *f, const MetricsRun *runs, int nruns, int x, int y) {
  fprintf(f, "<g class=\"legend\" font-family=\"sans-serif\" font-size=\"13\" transform=\"translate(%d %d)\">\n", x, y);
  for (int r = 0; r < nruns; r++) {
    int ly = r * LEG_ROW + 14;
    fprintf(f, "<line x1=\"0\" x2=\"28\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"%s/>\n", ly - 4, ly - 4, color_of(r),
            dash_of(r));
    fputs("<text class=\"legend-name\" x=\"36\" y=\"", f);
    fprintf(f, "%d\">", ly);
    put_text(f, runs[r].name);
    fputs("</text>\n", f);
  }
  fputs("</g>\n", f);
}

/* ------------------------------------------------------------------ */
/* the summary (HTML): every record counts                            */

static void put_num(FILE *f, double v) {
  if (isnan(v)) fputs("-", f);
  else fprintf(f, "%.6g", v);
}

static void summary_row(FILE *f, const MetricsRun *run, int index) {
  double first = NAN, last = NAN, min = NAN, lr = NAN, gmax = NAN;
  long double tsum = 0, secs = 0; /* sums of values up to the double's largest: no overflow */
  int64_t min_step = 0;
  size_t tn = 0;
  for (size_t i = 0; i < run->n; i++) {
    const MetricsRecord *r = &run->rec[i];
    double l = r->v[METRIC_LOSS];
    if (!isnan(l)) {
      if (isnan(first)) first = l;
      last = l;
      if (isnan(min) || l < min) {
        min = l;
        min_step = r->step;
      }
    }
    if (!isnan(r->v[METRIC_LR])) lr = r->v[METRIC_LR];
    if (!isnan(r->v[METRIC_GRAD_NORM]) && (isnan(gmax) || r->v[METRIC_GRAD_NORM] > gmax)) gmax = r->v[METRIC_GRAD_NORM];
    if (!isnan(r->v[METRIC_TOKENS_PER_S])) {
      tsum += r->v[METRIC_TOKENS_PER_S];
      tn++;
    }
    if (!isnan(r->v[METRIC_STEP_S])) secs += r->v[METRIC_STEP_S];
  }
  fprintf(f, "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>", color_of(index));
  put_text(f, run->name);
  fprintf(f, "</td><td>%zu</td><td>%" PRId64 "&ndash;%" PRId64 "</td><td>", run->n, run->rec[0].step, run->rec[run->n - 1].step);
  put_num(f, first);
  fputs(" &rarr; ", f);
  put_num(f, last);
  fputs("</td><td>", f);
  put_num(f, min);
  if (!isnan(min)) fprintf(f, " (step %" PRId64 ")", min_step);
  fputs("</td><td>", f);
  put_num(f, lr);
  fputs("</td><td>", f);
  put_num(f, gmax);
  fputs("</td><td>", f);
  if (tn) fprintf(f, "%.6Lg", tsum / (long double)tn);
  else fputs("-", f);
  fprintf(f, "</td><td>%.3Lg</td><td>", secs);
  if (run->restarts)
    fprintf(f, "%d resume%s, %zu record%s replaced", run->restarts, run->restarts == 1 ? "" : "s", run->replaced,
            run->replaced == 1 ? "" : "s");
  if (run->truncated) fprintf(f, "%sonly the first %zu records read", run->restarts ? "; " : "", run->n);
  fputs("</td></tr>\n", f);
}

/* ------------------------------------------------------------------ */

int report_write(FILE *out, const MetricsRun *runs, int nruns, ReportFormat fmt, const char *title) {
  Axis xa;
  step_axis(&xa, runs, nruns);
  const char *t = title ? title : "Training report";
  int legend_h = nruns * LEG_ROW + 8;
  if (fmt == REPORT_SVG) {
    int W = 2 * CH_W, top = 36 + legend_h;
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
            W, top + 2 * CH_H, W, top + 2 * CH_H);
    fprintf(out, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, top + 2 * CH_H);
    fputs("<text class=\"report-title\" x=\"20\" y=\"26\" font-family=\"sans-serif\" font-size=\"18\" font-weight=\"bold\">", out);
    put_text(out, t);
    fputs("</text>\n", out);
    draw_legend(out, runs, nruns, 20, 36);
    for (int c = 0; c < NCHARTS; c++) draw_chart(out, &charts[c], runs, nruns, &xa, (c % 2) * CH_W, top + (c / 2) * CH_H);
    fputs("</svg>\n", out);
  } else {
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", out);
    put_text(out, t);
    fputs("</title>\n<style>\n"
          "body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }\n"
          "table { border-collapse: collapse; margin-bottom: 16px; font-size: 14px; }\n"
          "th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }\n"
          ".swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px; }\n"
          ".charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(720px, 1fr)); gap: 8px; }\n"
          "svg.chart { max-width: 100%; height: auto; }\n"
          "</style>\n</head>\n<body>\n<h1>",
          out);
    put_text(out, t);
    fputs("</h1>\n<table class=\"summary\">\n<tr><th>file</th><th>records</th><th>steps</th><th>loss first &rarr; last</th>"
          "<th>lowest loss</th><th>last lr</th><th>largest gradient norm</th><th>mean tokens/s</th><th>seconds (sum of step_s)</th>"
          "<th>notes</th></tr>\n",
          out);
    for (int r = 0; r < nruns; r++) summary_row(out, &runs[r], r);
    fputs("</table>\n", out);
    fprintf(out, "<svg class=\"legend\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n", CH_W, legend_h);
    draw_legend(out, runs, nruns, 0, 0);
    fputs("</svg>\n<div class=\"charts\">\n", out);
    for (int c = 0; c < NCHARTS; c++) draw_chart(out, &charts[c], runs, nruns, &xa, 0, 0);
    fputs("</div>\n<p>Null values are gaps in a line. Lines with more records than pixels keep each pixel column's first, "
          "lowest, highest and last value; the table counts every record. Made by <code>hpdlc report</code>.</p>\n"
          "</body>\n</html>\n",
          out);
  }
  return ferror(out) ? -1 : 0;
}

/* ------------------------------------------------------------------ */
/* the command                                                         */

static void help(void) {
  puts("usage: hpdlc report METRICS.jsonl [MORE.jsonl ...] -o FILE.html|FILE.svg [options]\n"
       "\n"
       "Charts of training runs from their `hpdlrun --metrics` files: loss, learning\n"
       "rate, gradient norm and tokens/s over the step, one chart each, every file a\n"
       "line of its own (the legend names them). The HTML page is self-contained\n"
       "(inline SVG, no script, no network) with a summary table; the SVG holds the\n"
       "four charts. A null value is a gap in its line; a step that goes back is a\n"
       "resumed run (hpdlrun --resume appends), whose later records replace the\n"
       "earlier ones of the same steps. Lines with more records than pixels are\n"
       "thinned for drawing (each pixel column's first, lowest, highest and last\n"
       "value), not for the table.\n"
       "\n"
       "report options:\n"
       "  -o FILE                 the report to write (.html or .svg)\n"
       "  --format html|svg       the kind of report, whatever FILE's extension\n"
       "  --title TEXT            the report's title (\"Training report\")\n"
       "  --max-records N         read at most N records of all files together\n"
       "                          (10000000; 56 bytes each); the rest is left out\n"
       "  -q, --quiet             print nothing on success\n"
       "  --help                  show this help\n"
       "\n"
       "exit status: 0 success, 1 a file that cannot be read or is not a metrics file\n"
       "(FILE:LINE: error: ... names the record and the field), or an output that\n"
       "cannot be written, 2 a bad command line.");
}

static int usage_error(const char *fmt, const char *a) __attribute__((format(printf, 1, 0)));
static int usage_error(const char *fmt, const char *a) {
  fputs("hpdlc: report: ", stderr);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  fprintf(stderr, fmt, a);
#pragma GCC diagnostic pop
  fputs("\nTry 'hpdlc report --help'.\n", stderr);
  return 2;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  if (n < k) return 0;
  for (size_t i = 0; i < k; i++)
    if ((s[n - k + i] | 0x20) != suffix[i]) return 0;
  return 1;
}

/* --flag VALUE or --flag=VALUE: the value, or NULL when a is not flag. The
 * next argument is not a value when it is another option (`--title --format
 * svg`: "--title needs a value", as hpdlc's other verbs say). */
static const char *flag_value(const char *a, const char *flag, int argc, char **argv, int *i, int *missing) {
  size_t n = strlen(flag);
  if (strncmp(a, flag, n) || (a[n] && a[n] != '=')) return NULL;
  const char *v = a[n] == '=' ? a + n + 1 : (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) ? argv[++*i] : NULL);
  if (!v || !*v) {
    *missing = 1;
    return NULL;
  }
  return v;
}

int report_main(int argc, char **argv) {
  const char *files[REPORT_MAX_RUNS];
  int nfiles = 0, quiet = 0, missing = 0, more_files = 0;
  const char *out_path = NULL, *format = NULL, *title = NULL, *v;
  unsigned long long max_records = REPORT_MAX_RECORDS;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int file = a[0] != '-' || !a[1];
    if (!strcmp(a, "--")) {
      for (i++; i < argc; i++) {
        if (nfiles == REPORT_MAX_RUNS) more_files = 1;
        else files[nfiles++] = argv[i];
      }
      break;
    }
    if (file) {
      if (nfiles == REPORT_MAX_RUNS) more_files = 1;
      else files[nfiles++] = a;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      help();
      return 0;
    } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
      quiet = 1;
    } else if (!strcmp(a, "-o")) {
      if (i + 1 >= argc || !*argv[i + 1]) return usage_error("-o needs a file name%s", "");
      out_path = argv[++i];
    } else if ((v = flag_value(a, "--output", argc, argv, &i, &missing))) {
      out_path = v;
    } else if ((v = flag_value(a, "--format", argc, argv, &i, &missing))) {
      if (strcmp(v, "html") && strcmp(v, "svg")) return usage_error("--format takes html or svg, not '%s'", v);
      format = v;
    } else if ((v = flag_value(a, "--title", argc, argv, &i, &missing))) {
      title = v;
    } else if ((v = flag_value(a, "--max-records", argc, argv, &i, &missing))) {
      char *end;
      errno = 0;
      max_records = strtoull(v, &end, 10);
      if (errno || *end || v[0] == '-' || max_records < 1 || max_records > (unsigned long long)SIZE_MAX / sizeof(MetricsRecord))
        return usage_error("--max-records takes a count from 1, not '%s'", v);
    } else if (missing) {
      return usage_error("%s needs a value", a);
    } else {
      return usage_error("unknown option '%s' (see --help)", a);
    }
    if (missing) return usage_error("%s needs a value", a);
  }
  if (more_files) {
    char n[16];
    snprintf(n, sizeof n, "%d", REPORT_MAX_RUNS);
    return usage_error("at most %s metrics files in one report", n);
  }
  if (nfiles == 0) return usage_error("no metrics file (hpdlc report METRICS.jsonl... -o FILE.html)%s", "");
  if (!out_path) return usage_error("no output: -o FILE.html or -o FILE.svg%s", "");
  ReportFormat fmt;
  if (format) fmt = !strcmp(format, "svg") ? REPORT_SVG : REPORT_HTML;
  else if (ends_with(out_path, ".svg")) fmt = REPORT_SVG;
  else if (ends_with(out_path, ".html") || ends_with(out_path, ".htm")) fmt = REPORT_HTML;
  else return usage_error("%s: the kind of report is unknown: name it .html or .svg, or give --format", out_path);

  /* every file read and checked before anything is written */
  MetricsRun runs[REPORT_MAX_RUNS];
  int bad = 0;
  size_t left = (size_t)max_records;
  char err[1024];
  for (int r = 0; r < nfiles; r++) {
    metrics_init(&runs[r], files[r], left ? left : 1);
    if (!left) {
      fprintf(stderr, "hpdlc: report: %s: not read: --max-records %llu reached in the files before it\n", files[r], max_records);
      bad = 1;
      continue;
    }
    if (metrics_read_file(&runs[r], err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      bad = 1;
      continue;
    }
    left -= runs[r].n;
    if (runs[r].truncated)
      fprintf(stderr, "%s:%" PRId64 ": warning: --max-records %llu reached: the records from this line on are left out\n",
              files[r], runs[r].truncated_line, max_records);
    if (runs[r].restarts)
      fprintf(stderr, "%s:%" PRId64 ": note: the step goes back (%d time%s in the file): read as a resumed run; %zu earlier "
                      "record%s replaced by the later ones of the same steps\n",
              files[r], runs[r].first_restart_line, runs[r].restarts, runs[r].restarts == 1 ? "" : "s", runs[r].replaced,
              runs[r].replaced == 1 ? "" : "s");
  }
  int status = bad ? 1 : 0;
  if (!bad) {
    FILE *f = fopen(out_path, "w");
    if (!f) {
      fprintf(stderr, "hpdlc: report: %s: cannot write: %s\n", out_path, strerror(errno));
      status = 1;
    } else {
      int w = report_write(f, runs, nfiles, fmt, title);
      if (fclose(f) != 0 || w != 0) {
        fprintf(stderr, "hpdlc: report: %s: cannot write: %s\n", out_path, strerror(errno));
        status = 1;
      } else if (!quiet) {
        size_t total = 0;
        for (int r = 0; r < nfiles; r++) total += runs[r].n;
        printf("%s: %d charts of %d run%s, %zu records\n", out_path, NCHARTS, nfiles, nfiles == 1 ? "" : "s", total);
      }
    }
  }
  for (int r = 0; r < nfiles; r++) metrics_free(&runs[r]);
  return status;
}
