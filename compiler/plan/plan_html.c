/* plan_html.c - the planner's HTML report (`hpdlc plan --format html`): one
 * self-contained page, inline CSS and SVG, no script and no network.
 *
 * Sections, each chart with an id the tests find it by (tests/plan/
 * check_html.py; docs/planner.md sec. 15.1):
 *   header          model, parameters, cluster, layout, limit, fits or not
 *   #memory-chart   memory per GPU of every pipeline rank: horizontal
 *                   stacked bars (weights, gradients, optimizer,
 *                   activations, the rest), the device's capacity line,
 *                   the values in GiB under each bar (class mem-val)
 *   #time-chart     the step time as one stacked bar, and a table with each
 *                   part in ms and % of the step
 *   #timeline       the pipeline schedule from the simulator
 *                   (plan_timeline): one row per pipeline rank, a box per
 *                   forward (tl-fwd) and backward (tl-bwd) of each
 *                   micro-batch, labelled with its number (1-based), a time
 *                   axis in ms; with pp = 1 a note (#timeline-note)
 *   #search         the --search table, the winner highlighted
 *   #scaling-chart  --scaling: speed-up against GPUs, strong and weak, the
 *                   ideal line, Amdahl's and Gustafson's fits
 *   the text report in a <details> for every figure the pictures leave out. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "plan.h"
#include "plan_evidence.h"
#include "plan_internal.h"
#include "schedule.h"

#define GIB 1073741824.0

static void esc(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

/* milliseconds with 3-4 significant digits (seconds from 10 s) */
static const char *fmt_ms(char *buf, size_t n, double s) {
  double ms = s * 1e3;
  if (!isfinite(ms)) snprintf(buf, n, "inf");
  else if (ms >= 10000) snprintf(buf, n, "%.2f s", s);
  else if (ms >= 100) snprintf(buf, n, "%.1f ms", ms);
  else if (ms >= 1) snprintf(buf, n, "%.2f ms", ms);
  else if (ms >= 0.001) snprintf(buf, n, "%.3f ms", ms);
  else snprintf(buf, n, "0 ms");
  return buf;
}

static const char *fmt_gib(char *buf, size_t n, double b) {
  snprintf(buf, n, "%.2f GiB", b / GIB);
  return buf;
}

/* a tick step of 1, 2 or 5 x 10^k giving about `want` ticks over [0, range] */
static double nice_step(double range, int want) {
  if (!(range > 0)) return 1;
  double raw = range / want, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* the unit of a time axis up to tend seconds: ms, or s from 10 s */
static double time_unit(double tend, const char **name) {
  *name = tend >= 10 ? "s" : "ms";
  return tend >= 10 ? 1 : 1e3;
}

/* a tick value without trailing zeros */
static const char *fmt_tick(char *buf, size_t n, double v, double step) {
  int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  if (dec > 6) dec = 6;
  snprintf(buf, n, "%.*f", dec, v);
  return buf;
}

/* ------------------------------------------------------------------ */
/* header                                                               */

static void tile(FILE *f, const char *label, const char *value) {
  fputs("<div class=\"tile\"><div class=\"tl\">", f);
  esc(f, label);
  fputs("</div><div class=\"tv\">", f);
  esc(f, value);
  fputs("</div></div>\n", f);
}

static void html_header(FILE *f, PlanCtx *c, const PlanReport *rep, const PlanResult *r) {
  char a[64], b[96], ls[200];
  const SemModel *m = plan_model(c);
  const SemCluster *cl = plan_cluster(c);
  fputs("<header id=\"summary\">\n<h1>", f);
  esc(f, m->model->decl->name.name);
  fputs(" <span class=\"sub\">hpdlc plan ", f);
  esc(f, rep->file);
  fputs("</span></h1>\n<table class=\"facts\">\n", f);
  fprintf(f, "<tr><th>model</th><td>");
  esc(f, m->model->decl->name.name);
  fprintf(f, ": %s parameters", plan_fmt_count(a, sizeof a, r->params));
  int64_t skipped = sem_param_count(m) - sem_active_param_count(m); /* experts a token does not use */
  if (skipped > 0) fprintf(f, " (%s active per token)", plan_fmt_count(a, sizeof a, r->params - (double)skipped));
  int64_t chw[3] = {0, 0, 0};
  for (int i = 0; m->images && i < 3; i++) sym_is_const(m->model->inputs[0].type.dims[i + 1], &chw[i]);
  if (m->images)
    fprintf(f, ", images %" PRId64 "x%" PRId64 "x%" PRId64 ", global batch %" PRId64 ", %s</td></tr>\n", chw[0], chw[1],
            chw[2], r->global_batch, sem_precision_name(m->train.precision));
  else
    fprintf(f, ", sequence %" PRId64 ", global batch %" PRId64 " (%s tokens a step), %s</td></tr>\n", r->seq_len,
            r->global_batch, plan_fmt_count(b, sizeof b, (double)r->global_batch * (double)r->seq_len),
            sem_precision_name(m->train.precision));
  int64_t gpn = cl->gpus_per_node > 0 ? cl->gpus_per_node : 1, nodes = (r->gpus + gpn - 1) / gpn;
  fputs("<tr><th>cluster</th><td>", f);
  esc(f, cl->name ? cl->name : "?");
  fprintf(f, ": %" PRId64 " x ", r->gpus);
  esc(f, plan_device(c)->name);
  fprintf(f, " (%s memory each), %" PRId64 " node%s of %" PRId64, plan_fmt_bytes(a, sizeof a, plan_device(c)->mem_bytes), nodes,
          nodes == 1 ? "" : "s", gpn);
  char figs[512];
  if (*plan_device_figures(c, figs, sizeof figs)) {
    fputs("; the device's figures from the cluster: ", f);
    esc(f, figs);
  }
  fputs("</td></tr>\n", f);
  fputs("<tr><th>layout</th><td>", f);
  if (r->valid) {
    esc(f, plan_layout_str(ls, sizeof ls, &r->layout));
    if (strcmp(plan_attention_name(c), "flash")) fprintf(f, "; attention %s", plan_attention_name(c));
    if (!plan_fusion(c)) fputs("; fusion off", f);
    if (plan_layout_ring(&r->layout)) fputs("; cp_comm ring", f);
    fprintf(f, "; %" PRId64 " micro-batch%s of %" PRId64 " per replica per step", r->layout.num_micro,
            r->layout.num_micro == 1 ? "" : "es", r->layout.micro_batch);
    if (r->layout.pp > 1 && r->stages) {
      fputs(r->by_pieces ? "; pieces of the forward per pipeline rank " : "; layers per pipeline rank ", f);
      for (int s = 0; s < r->nstages; s++) fprintf(f, "%s%" PRId64, s ? "+" : "", r->stages[s].layers);
    }
  } else {
    fputs("not valid: ", f);
    esc(f, r->why);
  }
  fputs("</td></tr>\n", f);
  PlanNote notes[PLAN_NOTES_MAX];
  for (int i = 0, n = plan_notes(c, r, notes); i < n; i++) { /* the text report's notes below its layout line */
    fputs("<tr><th>", f);
    esc(f, notes[i].key);
    fputs("</th><td>", f);
    esc(f, notes[i].text);
    fputs("</td></tr>\n", f);
  }
  fputs("<tr><th>limit</th><td>", f);
  esc(f, r->limit);
  fputs("</td></tr>\n<tr><th>memory</th><td>", f);
  if (r->valid)
    fprintf(f, "<span class=\"badge %s\">%s</span> the fullest GPU (pipeline rank %d) needs %s of %s", r->mem.fits ? "ok" : "bad",
            r->mem.fits ? "fits" : "does not fit", r->mem.rank, plan_fmt_bytes(a, sizeof a, r->mem.total),
            plan_fmt_bytes(b, sizeof b, r->mem.capacity));
  else
    fputs("<span class=\"badge bad\">no plan</span>", f);
  fputs("</td></tr>\n", f);
  PlanEvidence ev;
  if (r->valid && r->step_s > 0 && isfinite(r->step_s)) { /* how far to trust it (docs/planner.md sec. 16.1) */
    fputs("<tr><th>how far to trust it</th><td>", f);
    int got = plan_evidence(c, r, &ev);
    char like[256];
    if (got < 0)
      esc(f, plan_evidence_none(c, got, like, sizeof like));
    else {
      fprintf(f, "on %d published runs like this one (", ev.runs);
      esc(f, plan_evidence_like(&ev, like, sizeof like));
      fprintf(f, "; %d of them fitted on) the planner was off by %.1f%% in the median, the middle 80%% by %+.1f%% to "
                 "%+.1f%% (- fast, + slow): off as much here, the step takes %s to %s; closest: ",
              ev.fitted, ev.median_abs * 100, ev.lo * 100, ev.hi * 100, fmt_ms(a, sizeof a, ev.step_lo),
              fmt_ms(b, sizeof b, ev.step_hi));
      for (int i = 0; i < ev.nclosest; i++) {
        fputs(i ? ", " : "", f);
        esc(f, ev.closest[i]->id);
        fprintf(f, " %+.1f%%", ev.closest[i]->error * 100);
      }
    }
    fputs("</td></tr>\n", f);
  }
  fputs("</table>\n", f);
  if (r->valid) {
    fputs("<div class=\"tiles\">\n", f);
    tile(f, "step time", fmt_ms(a, sizeof a, r->step_s));
    snprintf(b, sizeof b, "%s/s", plan_fmt_count(a, sizeof a, r->tokens_per_s));
    tile(f, m->images ? "images" : "tokens", b);
    snprintf(a, sizeof a, "%.1f%%", r->mfu * 100);
    tile(f, "MFU", a);
    snprintf(a, sizeof a, "%.1f TFLOP/s", r->tflops_per_gpu);
    tile(f, "per GPU", a);
    snprintf(b, sizeof b, "%s (%.0f%%)", fmt_gib(a, sizeof a, r->mem.total),
             r->mem.capacity > 0 ? r->mem.total / r->mem.capacity * 100 : 0);
    tile(f, "memory, fullest GPU", b);
    if (r->layout.pp > 1) {
      snprintf(a, sizeof a, "%.1f%%", r->bubble_fraction * 100);
      tile(f, "pipeline idle", a);
    }
    fputs("</div>\n", f);
  }
  fputs("</header>\n", f);
}

/* ------------------------------------------------------------------ */
/* memory per pipeline rank                                             */

enum { NMEM = 5 };
static const char *const mem_name[NMEM] = {"weights", "gradients", "optimizer", "activations", "rest"};
static const char *const mem_fill[NMEM] = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#9d9d9d"};
static const char *const mem_ink[NMEM] = {"#fff", "#111", "#fff", "#fff", "#111"};

static void mem_parts(const PlanMemory *m, double *v) {
  v[0] = m->params;
  v[1] = m->grads;
  v[2] = m->optimizer;
  v[3] = m->activations;
  v[4] = m->transient + m->comm_buffers + m->workspace;
}

static void svg_memory(FILE *f, const PlanResult *r) {
  int n = r->stages && r->nstages > 0 ? r->nstages : 1;
  double cap = r->mem.capacity, top = cap;
  for (int s = 0; s < n; s++) {
    const PlanMemory *m = r->stages ? &r->stages[s].mem : &r->mem;
    if (m->total > top) top = m->total;
  }
  if (!(top > 0)) top = GIB;
  double step = nice_step(top / GIB, 8) * GIB;
  double xmax = ceil(top / step - 1e-9) * step;
  const int L = 110, PW = 760, RM = 130, W = L + PW + RM, T = 34, RH = 60;
  int H = T + n * RH + 40;
  char a[64], b[64];
  fprintf(f,
          "<svg id=\"memory-chart\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
          "aria-label=\"memory per GPU by pipeline rank\">\n",
          W, H, W, H);
  /* grid and axis */
  for (double v = 0; v <= xmax * (1 + 1e-9); v += step) {
    double x = L + v / xmax * PW;
    fprintf(f, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"></line>\n", x, x, T - 6, T + n * RH);
    fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, T + n * RH + 14,
            fmt_tick(a, sizeof a, v / GIB, step / GIB));
  }
  fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">memory per GPU (GiB)</text>\n", L + PW / 2,
          T + n * RH + 32);
  /* the capacity line under the labels (they have a white halo) and, after
   * the bars, again across each bar */
  double xc = L + cap / xmax * PW;
  fprintf(f, "<line class=\"cap\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"></line>\n", xc, xc, T - 14, T + n * RH);
  fprintf(f, "<text class=\"cap-label\" x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">capacity %s</text>\n", xc, T - 18,
          xc > L + PW - 60 ? "end" : "middle", fmt_gib(b, sizeof b, cap));
  for (int s = 0; s < n; s++) {
    const PlanMemory *m = r->stages ? &r->stages[s].mem : &r->mem;
    double v[NMEM];
    mem_parts(m, v);
    int y = T + s * RH;
    fprintf(f, "<g class=\"mem-rank\" data-rank=\"%d\">\n", s);
    fprintf(f, "<text class=\"lab\" x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %d</text>\n", L - 8, y + 12, s);
    if (r->stages)
      fprintf(f, "<text class=\"small\" x=\"%d\" y=\"%d\" text-anchor=\"end\">%" PRId64 " %s%s</text>\n", L - 8, y + 25,
              r->stages[s].layers, r->by_pieces ? "piece" : "layer", r->stages[s].layers == 1 ? "" : "s");
    double x = L;
    for (int k = 0; k < NMEM; k++) {
      double w = v[k] / xmax * PW;
      fprintf(f,
              "<rect class=\"mem-seg\" data-part=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"26\" fill=\"%s\">"
              "<title>rank %d %s: %s</title></rect>\n",
              mem_name[k], x, y, w, mem_fill[k], s, mem_name[k], fmt_gib(a, sizeof a, v[k]));
      if (w >= 64)
        fprintf(f, "<text class=\"seg-label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" style=\"fill:%s\">%s</text>\n", x + w / 2,
                y + 17, mem_ink[k], fmt_gib(a, sizeof a, v[k]));
      x += w;
    }
    if (xc < x) fprintf(f, "<line class=\"cap\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"></line>\n", xc, xc, y, y + 26);
    fprintf(f, "<text class=\"mem-total\" x=\"%.1f\" y=\"%d\">%s%s</text>\n", x + 6, y + 17, fmt_gib(a, sizeof a, m->total),
            s == r->mem.rank && n > 1 ? " (fullest)" : "");
    /* the values under the bar, one per part, in the part's colour */
    for (int k = 0; k < NMEM; k++) {
      int vx = L + k * (PW / NMEM);
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"9\" height=\"9\" fill=\"%s\"></rect>", vx, y + 33, mem_fill[k]);
      fprintf(f, "<text class=\"mem-val\" data-part=\"%s\" data-bytes=\"%.0f\" x=\"%d\" y=\"%d\">%s %s</text>\n", mem_name[k],
              v[k], vx + 13, y + 41, mem_name[k], fmt_gib(a, sizeof a, v[k]));
    }
    fputs("</g>\n", f);
  }
  fputs("</svg>\n", f);
}

/* ------------------------------------------------------------------ */
/* step-time breakdown                                                  */

typedef struct {
  const char *name, *fill, *ink, *note;
  double s;
  char notebuf[96];
} TimePart;

static void svg_time(FILE *f, const PlanResult *r) {
  TimePart p[12];
  int n = 0;
  char a[64], b[64];
  memset(p, 0, sizeof p);
  p[n++] = (TimePart){"compute: GEMM", "#4e79a7", "#fff", "matrix multiplications", r->gemm_s, ""};
  p[n++] = (TimePart){"compute: memory-bound", "#a0cbe8", "#111", "element-wise, norms, softmax, launch gaps", r->other_s, ""};
  static const char *const gname[IRG_COUNT] = {"data-parallel", "tensor-parallel", "pipeline", "context-parallel",
                                               "expert-parallel", "expert-data-parallel"};
  static const char *const gfill[IRG_COUNT] = {"#b07aa1", "#e15759", "#f28e2b", "#ff9da7", "#76b7b2", "#9c755f"};
  static const char *const gink[IRG_COUNT] = {"#fff", "#fff", "#111", "#111", "#111", "#fff"};
  int order[IRG_COUNT] = {IRG_TP, IRG_CP, IRG_EP, IRG_DP, IRG_EDP, IRG_PP};
  char names[IRG_COUNT][48];
  for (int k = 0; k < IRG_COUNT; k++) {
    int g = order[k];
    if (r->comm_s[g] <= 0) continue;
    snprintf(names[k], sizeof names[k], "%s comm (exposed)", gname[g]);
    p[n] = (TimePart){names[k], gfill[g], gink[g], NULL, r->comm_exposed[g], ""};
    snprintf(p[n].notebuf, sizeof p[n].notebuf, "exposed part of %s", fmt_ms(a, sizeof a, r->comm_s[g]));
    p[n].note = p[n].notebuf;
    n++;
  }
  if (r->layout.pp > 1) {
    p[n] = (TimePart){"pipeline bubble", "#d4d4d4", "#111", NULL, r->bubble_s, ""};
    snprintf(p[n].notebuf, sizeof p[n].notebuf, "%.1f%% of the pipeline idle%s", r->bubble_fraction * 100,
             r->simulated ? " (simulated)" : " (closed form)");
    p[n].note = p[n].notebuf;
    n++;
  }
  p[n++] = (TimePart){"optimizer step", "#59a14f", "#fff", "", r->optimizer_s, ""};
  double sum = 0;
  for (int k = 0; k < n; k++) sum += p[k].s;
  double T = r->step_s > 0 ? r->step_s : sum;
  if (T - sum > 1e-3 * T) p[n++] = (TimePart){"other", "#edc948", "#111", "the rest of the step", T - sum, ""};
  if (!(T > 0)) T = 1;
  double tot = sum > T ? sum : T;
  const int L = 20, PW = 900, W = L + PW + 20, H = 92;
  fprintf(f,
          "<svg id=\"time-chart\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
          "aria-label=\"time of one step\">\n",
          W, H, W, H);
  const char *unit;
  double us = time_unit(tot, &unit), step = nice_step(tot * us, 10);
  for (double v = 0; v <= tot * us * (1 + 1e-9); v += step) {
    double x = L + v / (tot * us) * PW;
    fprintf(f, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"8\" y2=\"50\"></line>\n", x, x);
    fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"64\" text-anchor=\"middle\">%s</text>\n", x, fmt_tick(a, sizeof a, v, step));
  }
  fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"84\" text-anchor=\"middle\">time in one step (%s)</text>\n", L + PW / 2, unit);
  double x = L;
  for (int k = 0; k < n; k++) {
    double w = p[k].s / tot * PW;
    fprintf(f,
            "<rect class=\"time-seg\" data-part=\"%s\" data-seconds=\"%.9g\" x=\"%.2f\" y=\"10\" width=\"%.2f\" height=\"38\" "
            "fill=\"%s\"><title>%s: %s (%.1f%%)</title></rect>\n",
            p[k].name, p[k].s, x, w, p[k].fill, p[k].name, fmt_ms(a, sizeof a, p[k].s), p[k].s / T * 100);
    char lab[400];
    snprintf(lab, sizeof lab, "%s %.1f%%", fmt_ms(a, sizeof a, p[k].s), p[k].s / T * 100);
    if (w >= 6.8 * (double)strlen(lab) + 8)
      fprintf(f, "<text class=\"seg-label\" x=\"%.1f\" y=\"33\" text-anchor=\"middle\" style=\"fill:%s\">%s</text>\n", x + w / 2,
              p[k].ink, lab);
    x += w;
  }
  fputs("</svg>\n", f);
  fputs("<table id=\"time-table\" class=\"num\">\n<tr><th></th><th>part</th><th>time</th><th>share of the step</th>"
        "<th class=\"l\">what</th></tr>\n",
        f);
  for (int k = 0; k < n; k++) {
    fprintf(f, "<tr><td><span class=\"sw\" style=\"background:%s\"></span></td><td class=\"l\">%s</td><td>%s</td><td>%.1f%%</td>"
               "<td class=\"l\">",
            p[k].fill, p[k].name, fmt_ms(a, sizeof a, p[k].s), p[k].s / T * 100);
    esc(f, p[k].note);
    fputs("</td></tr>\n", f);
  }
  fprintf(f, "<tr class=\"total\"><td></td><td class=\"l\">step</td><td>%s</td><td>100%%</td><td class=\"l\">of which recompute %s, "
             "attention %s</td></tr>\n</table>\n",
          fmt_ms(a, sizeof a, r->step_s), fmt_ms(b, sizeof b, r->recompute_s), fmt_ms((char[64]){0}, 64, r->attn_s));
}

/* ------------------------------------------------------------------ */
/* pipeline timeline                                                    */

static void svg_timeline(FILE *f, PlanCtx *c, const PlanResult *r) {
  const PlanLayout *Lo = &r->layout;
  char a[64], b[64];
  if (Lo->pp <= 1) {
    fprintf(f,
            "<p id=\"timeline-note\" class=\"note\">pp = 1: no pipeline. Each GPU runs the forward and backward of its "
            "%" PRId64 " micro-batch%s back to back, with no bubble; the step is the compute, the exposed "
            "communication and the optimizer above.</p>\n",
            Lo->num_micro, Lo->num_micro == 1 ? "" : "es");
    return;
  }
  PlanTimeline tl;
  char why[256];
  if (plan_timeline(c, Lo, &tl, why, sizeof why) != 0) {
    fputs("<p id=\"timeline-note\" class=\"note\">no timeline: ", f);
    esc(f, why);
    fputs(".</p>\n", f);
    return;
  }
  const SchedSim *s = &tl.sim;
  int pp = tl.pp;
  double tend = s->makespan + tl.dp_exposed + tl.optimizer, minbox = 0;
  for (int i = 0; i < s->n_events; i++) {
    const SchedEvent *e = &s->events[i];
    if ((e->op == SCHED_OP_FWD || e->op == SCHED_OP_BWD) && e->end > e->start && (minbox == 0 || e->end - e->start < minbox))
      minbox = e->end - e->start;
  }
  if (!(tend > 0)) tend = 1;
  /* wide enough for the label of the shortest box, within limits (then the
   * chart scrolls sideways) */
  int PW = 940, digits_max = Lo->num_micro >= 100 ? 3 : Lo->num_micro >= 10 ? 2 : 1;
  if (minbox > 0) {
    double need = tend / minbox * (7 * digits_max + 3);
    if (need > PW) PW = need > 4800 ? 4800 : (int)need;
  }
  const int L = 70, RH = 30, GAP = 8, T = 10;
  int W = L + PW + 20, H = T + pp * (RH + GAP) + 66;
  int vpp = Lo->vpp > 1 ? (int)Lo->vpp : 1;
  fprintf(f,
          "<p class=\"caption\">%s, %d pipeline ranks x %" PRId64 " micro-batches (of %" PRId64 " sequences)%s, as the schedule "
          "simulator runs them; every data-parallel replica runs the same. Idle: %.1f%% of the pipeline. Boxes are "
          "numbered by micro-batch (1 = the first).</p>\n",
          sem_schedule_name((Schedule)Lo->schedule), pp, Lo->num_micro, Lo->micro_batch,
          vpp > 1 ? ", virtual stages shaded by chunk" : "", s->bubble_fraction * 100);
  fprintf(f, "<div class=\"scroll\"><svg id=\"timeline\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
             "aria-label=\"pipeline schedule\">\n",
          W, H, W, H);
  int axis_y = T + pp * (RH + GAP);
  const char *unit;
  double us = time_unit(tend, &unit), step = nice_step(tend * us, PW / 90);
  for (double v = 0; v <= tend * us * (1 + 1e-9); v += step) {
    double x = L + v / (tend * us) * PW;
    fprintf(f, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"></line>\n", x, x, T - 4, axis_y);
    fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, axis_y + 14,
            fmt_tick(a, sizeof a, v, step));
  }
  fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">time in one step (%s)</text>\n", L + PW / 2,
          axis_y + 32, unit);
  for (int rk = 0; rk < pp; rk++) {
    int y = T + rk * (RH + GAP);
    fprintf(f, "<rect class=\"tl-idle\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"></rect>\n", L, y, PW, RH);
    fprintf(f, "<text class=\"lab\" x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %d</text>\n", L - 8, y + RH / 2 + 4, rk);
  }
  static const char *const ffill[2] = {"#4e79a7", "#7fa6d0"}, *const bfill[2] = {"#59a14f", "#93c98a"};
  static const char *const fink[2] = {"#fff", "#111"}, *const bink[2] = {"#fff", "#111"};
  for (int i = 0; i < s->n_events; i++) {
    const SchedEvent *e = &s->events[i];
    if (e->op != SCHED_OP_FWD && e->op != SCHED_OP_BWD) continue;
    int fwd = e->op == SCHED_OP_FWD, vc = pp > 0 ? (e->chunk / pp) % 2 : 0;
    double x = L + e->start / tend * PW, w = (e->end - e->start) / tend * PW;
    int y = T + e->rank * (RH + GAP);
    fprintf(f,
            "<rect class=\"%s\" data-rank=\"%d\" data-mb=\"%d\" data-chunk=\"%d\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
            "height=\"%d\" fill=\"%s\"><title>rank %d %s micro-batch %d chunk %d: %s to %s</title></rect>\n",
            fwd ? "tl-fwd" : "tl-bwd", e->rank, e->mb + 1, e->chunk, x, y, w > 0.6 ? w - 0.6 : w, RH,
            fwd ? ffill[vc] : bfill[vc], e->rank, fwd ? "forward" : "backward", e->mb + 1, e->chunk,
            fmt_ms(a, sizeof a, e->start), fmt_ms(b, sizeof b, e->end));
    int digits = e->mb + 1 >= 100 ? 3 : e->mb + 1 >= 10 ? 2 : 1;
    if (w >= 7 * digits + 3)
      fprintf(f, "<text class=\"tl-label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" style=\"fill:%s\">%d</text>\n", x + w / 2,
              y + RH / 2 + 4, fwd ? fink[vc] : bink[vc], e->mb + 1);
  }
  /* after the pipeline: the exposed gradient synchronisation, the optimizer */
  for (int rk = 0; rk < pp; rk++) {
    int y = T + rk * (RH + GAP);
    double t = s->makespan;
    if (tl.dp_exposed > 0)
      fprintf(f,
              "<rect class=\"tl-dp\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\"><title>gradient sync (exposed): "
              "%s</title></rect>\n",
              L + t / tend * PW, y, tl.dp_exposed / tend * PW, RH, fmt_ms(a, sizeof a, tl.dp_exposed));
    t += tl.dp_exposed;
    fprintf(f, "<rect class=\"tl-opt\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\"><title>optimizer step: %s</title></rect>\n",
            L + t / tend * PW, y, tl.optimizer / tend * PW, RH, fmt_ms(a, sizeof a, tl.optimizer));
  }
  /* legend */
  int ly = axis_y + 46, lx = L;
  struct {
    const char *cls, *name;
  } leg[] = {{"tl-fwd-key", "forward"}, {"tl-bwd-key", "backward"}, {"tl-idle", "idle (bubble)"},
             {"tl-dp", "gradient sync (exposed)"}, {"tl-opt", "optimizer step"}};
  for (size_t k = 0; k < sizeof leg / sizeof leg[0]; k++) {
    fprintf(f, "<rect class=\"%s\" x=\"%d\" y=\"%d\" width=\"12\" height=\"12\"></rect><text class=\"lab\" x=\"%d\" y=\"%d\">%s</text>\n",
            leg[k].cls, lx, ly, lx + 16, ly + 10, leg[k].name);
    lx += 40 + 8 * (int)strlen(leg[k].name);
  }
  fputs("</svg></div>\n", f);
  plan_timeline_free(&tl);
}

/* ------------------------------------------------------------------ */
/* search                                                               */

static void html_search(FILE *f, const PlanReport *rep) {
  char a[64], b[64], d[64], ls[200];
  const PlanSearchStats *st = rep->stats;
  if (st)
    fprintf(f, "<p class=\"caption\">%" PRId64 " layouts enumerated, %" PRId64 " valid, %" PRId64 " fit; the best %d by step time.</p>\n",
            st->enumerated, st->valid, st->fit, rep->nsearch);
  if (rep->nsearch == 0) {
    fputs("<p id=\"search-note\" class=\"note\">", f);
    esc(f, plan_search_none_note(rep));
    fputs(".</p>\n", f);
    return;
  }
  fputs("<table id=\"search\" class=\"num\">\n<thead><tr><th>rank</th><th class=\"l\">layout</th><th>step time</th>"
        "<th>tokens/s</th><th>TFLOP/s per GPU</th><th>MFU</th><th>memory per GPU (of capacity)</th><th class=\"l why\">why</th></tr></thead>\n<tbody>\n",
        f);
  for (int i = 0; i < rep->nsearch; i++) {
    const PlanResult *s = &rep->search[i];
    fprintf(f, "<tr class=\"%s\"><td>%d%s</td><td class=\"l mono\">", i == 0 ? "winner" : "row", i + 1, i == 0 ? " &#9733;" : "");
    esc(f, plan_layout_str(ls, sizeof ls, &s->layout));
    fprintf(f, "</td><td>%s</td><td>%s</td><td>%.1f</td><td>%.1f%%</td><td>%s (%.0f%%)</td><td class=\"l small why\">",
            fmt_ms(a, sizeof a, s->step_s), plan_fmt_count(b, sizeof b, s->tokens_per_s), s->tflops_per_gpu, s->mfu * 100,
            fmt_gib(d, sizeof d, s->mem.total), s->mem.capacity > 0 ? s->mem.total / s->mem.capacity * 100 : 0);
    esc(f, s->saves);
    fputs("; ", f);
    esc(f, s->costs);
    fputs("</td></tr>\n", f);
  }
  fputs("</tbody>\n</table>\n", f);
}

/* ------------------------------------------------------------------ */
/* scaling                                                              */

typedef struct {
  int log;
  double lo, hi;
  double p0, p1; /* pixels */
} Axis;

static double ax_map(const Axis *a, double v) {
  double t = a->log ? (log2(v) - log2(a->lo)) / (log2(a->hi) - log2(a->lo)) : (v - a->lo) / (a->hi - a->lo);
  return a->p0 + t * (a->p1 - a->p0);
}

static void svg_scaling(FILE *f, const PlanScaling *s) {
  char a[64], b[64];
  if (s->n <= 0) return;
  double g0 = (double)s->pts[0].gpus, gmin = g0, gmax = g0, ymin = 1, ymax = 1;
  for (int i = 0; i < s->n; i++) {
    const PlanScalePoint *p = &s->pts[i];
    double N = (double)p->gpus / g0;
    if (p->gpus < gmin) gmin = (double)p->gpus;
    if (p->gpus > gmax) gmax = (double)p->gpus;
    if (N > ymax) ymax = N;
    if (N < ymin) ymin = N;
    if (p->strong_speedup > ymax) ymax = p->strong_speedup;
    if (p->weak_speedup > ymax) ymax = p->weak_speedup;
    if (p->strong_speedup > 0 && p->strong_speedup < ymin) ymin = p->strong_speedup;
  }
  if (gmax <= gmin) gmax = gmin * 2;
  int lg = gmax / gmin > 4;
  const int L = 70, PW = 620, T = 20, PH = 360, W = L + PW + 250, H = T + PH + 60;
  Axis X = {lg, gmin, gmax, L, L + PW}, Y;
  if (lg) {
    Y = (Axis){1, pow(2, floor(log2(ymin))), pow(2, ceil(log2(ymax))), T + PH, T};
    if (Y.hi <= Y.lo) Y.hi = Y.lo * 2;
  } else {
    double st = nice_step(ymax, 6);
    Y = (Axis){0, 0, ceil(ymax / st) * st, T + PH, T};
  }
  fprintf(f,
          "<svg id=\"scaling-chart\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
          "aria-label=\"speed-up against GPUs\">\n",
          W, H, W, H);
  /* axes: x ticks at each GPU count, y ticks at powers of two (log) or nice steps */
  for (int i = 0; i < s->n; i++) {
    double x = ax_map(&X, (double)s->pts[i].gpus);
    fprintf(f, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"></line>\n", x, x, T, T + PH);
    fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%" PRId64 "</text>\n", x, T + PH + 16,
            s->pts[i].gpus);
  }
  if (Y.log) {
    for (double v = Y.lo; v <= Y.hi * 1.0001; v *= 2) {
      double y = ax_map(&Y, v);
      fprintf(f, "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"></line>\n", L, L + PW, y, y);
      fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 6, y + 4,
              fmt_tick(a, sizeof a, v, v < 1 ? v : 1));
    }
  } else {
    double st = nice_step(Y.hi, 6);
    for (double v = 0; v <= Y.hi * 1.0001; v += st) {
      double y = ax_map(&Y, v);
      fprintf(f, "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"></line>\n", L, L + PW, y, y);
      fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 6, y + 4,
              fmt_tick(a, sizeof a, v, st));
    }
  }
  fprintf(f, "<line class=\"frame\" x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"></line>", L, L + PW, T + PH, T + PH);
  fprintf(f, "<line class=\"frame\" x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"></line>\n", L, L, T, T + PH);
  fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">GPUs%s</text>\n", L + PW / 2, T + PH + 36,
          lg ? " (log scale)" : "");
  fprintf(f,
          "<text class=\"axis\" x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">speed-up over %" PRId64
          " GPUs%s</text>\n",
          T + PH / 2, T + PH / 2, s->pts[0].gpus, lg ? " (log scale)" : "");
  /* curves: ideal, Amdahl and Gustafson fits, sampled along x */
  const char *cfill[4] = {"#888", "#4e79a7", "#e15759", ""};
  for (int which = 0; which < 3; which++) {
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" stroke-dasharray=\"%s\" points=\"",
            which == 0 ? "ideal" : which == 1 ? "fit-amdahl" : "fit-gustafson", cfill[which], which ? "1.5" : "1.2",
            which ? "2 3" : "6 4");
    for (int k = 0; k <= 64; k++) {
      double g = X.log ? gmin * pow(gmax / gmin, k / 64.0) : gmin + (gmax - gmin) * k / 64.0, N = g / g0;
      double S = which == 0 ? N : which == 1 ? cost_amdahl_speedup(s->amdahl_f, N) : cost_gustafson_speedup(s->gustafson_f, N);
      if (S <= 0 || (Y.log && S < Y.lo)) continue;
      fprintf(f, "%.1f,%.1f ", ax_map(&X, g), ax_map(&Y, S));
    }
    fputs("\"></polyline>\n", f);
  }
  /* measured points */
  for (int which = 0; which < 2; which++) {
    const char *col = which ? "#e15759" : "#4e79a7";
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2.2\" points=\"", which ? "weak-line" : "strong-line",
            col);
    for (int i = 0; i < s->n; i++) {
      const PlanScalePoint *p = &s->pts[i];
      int ok = p->ok && (which ? p->weak.valid && p->weak.mem.fits : p->strong.valid && p->strong.mem.fits);
      double S = which ? p->weak_speedup : p->strong_speedup;
      if (ok && S > 0) fprintf(f, "%.1f,%.1f ", ax_map(&X, (double)p->gpus), ax_map(&Y, S));
    }
    fputs("\"></polyline>\n", f);
    for (int i = 0; i < s->n; i++) {
      const PlanScalePoint *p = &s->pts[i];
      int ok = p->ok && (which ? p->weak.valid && p->weak.mem.fits : p->strong.valid && p->strong.mem.fits);
      double S = which ? p->weak_speedup : p->strong_speedup;
      if (!ok || !(S > 0)) continue;
      double x = ax_map(&X, (double)p->gpus), y = ax_map(&Y, S);
      if (which)
        fprintf(f,
                "<rect class=\"pt-weak\" data-gpus=\"%" PRId64 "\" data-speedup=\"%.4f\" x=\"%.1f\" y=\"%.1f\" width=\"8\" "
                "height=\"8\" fill=\"%s\"><title>weak, %" PRId64 " GPUs: scaled speed-up %.2f</title></rect>\n",
                p->gpus, S, x - 4, y - 4, col, p->gpus, S);
      else
        fprintf(f,
                "<circle class=\"pt-strong\" data-gpus=\"%" PRId64 "\" data-speedup=\"%.4f\" cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" "
                "fill=\"%s\"><title>strong, %" PRId64 " GPUs: speed-up %.2f</title></circle>\n",
                p->gpus, S, x, y, col, p->gpus, S);
      if (i == 0 && !which) continue; /* 1.00x twice at the first point: the weak label says it */
      fprintf(f, "<text class=\"pt-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" style=\"fill:%s\">%.2fx</text>\n",
              which ? x - 8 : x + 8, which ? y - 8 : y + 16, which ? "end" : "start", col, S);
    }
  }
  /* legend */
  int lx = L + PW + 20, ly = T + 10;
  snprintf(a, sizeof a, "Amdahl fit, f = %.4f", s->amdahl_f);
  snprintf(b, sizeof b, "Gustafson fit, f = %.4f", s->gustafson_f);
  struct {
    const char *name, *col, *dash;
    int marker;
  } leg[] = {{"strong (global batch fixed)", "#4e79a7", "", 1},
             {"weak (batch grows with GPUs)", "#e15759", "", 2},
             {"ideal (linear)", "#888", "6 4", 0},
             {a, "#4e79a7", "2 3", 0},
             {b, "#e15759", "2 3", 0}};
  fprintf(f, "<g class=\"legend\">\n");
  for (int k = 0; k < 5; k++) {
    int y = ly + 20 * k;
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s%s%s></line>", lx, lx + 26, y, y,
            leg[k].col, *leg[k].dash ? " stroke-dasharray=\"" : "", leg[k].dash, *leg[k].dash ? "\"" : "");
    if (leg[k].marker == 1) fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"4\" fill=\"%s\"></circle>", lx + 13, y, leg[k].col);
    if (leg[k].marker == 2) fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"8\" height=\"8\" fill=\"%s\"></rect>", lx + 9, y - 4, leg[k].col);
    fprintf(f, "<text class=\"lab\" x=\"%d\" y=\"%d\">", lx + 32, y + 4);
    esc(f, leg[k].name);
    fputs("</text>\n", f);
  }
  fputs("</g>\n</svg>\n", f);
  /* the numbers */
  fputs("<table id=\"scaling-table\" class=\"num\">\n<tr><th rowspan=\"2\">GPUs</th><th colspan=\"5\">strong (global batch fixed)</th>"
        "<th colspan=\"4\">weak (global batch grows)</th></tr>\n<tr><th>dp</th><th>step</th><th>speed-up</th><th>efficiency</th>"
        "<th>Karp-Flatt</th><th>batch</th><th>step</th><th>scaled speed-up</th><th>efficiency</th></tr>\n",
        f);
  for (int i = 0; i < s->n; i++) {
    const PlanScalePoint *p = &s->pts[i];
    int sok = p->ok && p->strong.valid && p->strong.mem.fits, wok = p->ok && p->weak.valid && p->weak.mem.fits;
    fprintf(f, "<tr><td>%" PRId64 "</td>", p->gpus);
    if (sok)
      fprintf(f, "<td>%" PRId64 "</td><td>%s</td><td>%.2fx</td><td>%.1f%%</td><td>%.4f</td>", p->strong.layout.dp,
              fmt_ms(a, sizeof a, p->strong.step_s), p->strong_speedup, p->strong_eff * 100, p->karp_flatt);
    else
      fprintf(f, "<td colspan=\"5\" class=\"l\">%s</td>", p->strong.valid ? "does not fit" : "no layout (degrees do not divide)");
    if (wok)
      fprintf(f, "<td>%" PRId64 "</td><td>%s</td><td>%.2fx</td><td>%.1f%%</td>", p->weak.global_batch,
              fmt_ms(a, sizeof a, p->weak.step_s), p->weak_speedup, p->weak_eff * 100);
    else
      fprintf(f, "<td colspan=\"4\" class=\"l\">%s</td>", p->weak.valid ? "does not fit" : "no layout (degrees do not divide)");
    fputs("</tr>\n", f);
  }
  fputs("</table>\n", f);
}

/* ------------------------------------------------------------------ */
/* the page                                                             */

static const char *const css =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f;background:#fff;"
    "margin:24px auto;max-width:1140px;padding:0 16px}"
    "h1{font-size:26px;margin:0 0 10px}h1 .sub{font-size:14px;font-weight:normal;color:#666;margin-left:8px}"
    "h2{font-size:19px;margin:30px 0 6px;border-bottom:2px solid #e4e4e4;padding-bottom:3px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{padding:4px 9px;border-bottom:1px solid #e4e4e4;vertical-align:top}"
    "th{background:#f3f4f6;font-weight:600}table.num td,table.num th{text-align:right}table.num td:not(.l){white-space:nowrap}table.num .l,.l{text-align:left}"
    "table.facts th{text-align:left;width:90px;background:none;color:#555}"
    "tr.total td{font-weight:600;border-top:2px solid #ccc}"
    "tr.winner td{background:#fff4d6;font-weight:600}"
    ".mono{white-space:nowrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}.small{font-size:12px;color:#444}.why{min-width:240px}"
    ".sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle}"
    ".badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;margin-right:6px}"
    ".badge.ok{background:#dff3e0;color:#1b6e20}.badge.bad{background:#fde0e0;color:#a11}"
    ".tiles{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}"
    ".tile{border:1px solid #e0e0e0;border-radius:6px;padding:8px 14px;min-width:120px;background:#fafafa}"
    ".tile .tl{font-size:12px;color:#666}.tile .tv{font-size:20px;font-weight:600}"
    ".note,.caption{color:#444}.note{background:#f3f6fa;border-left:4px solid #4e79a7;padding:8px 12px}"
    ".scroll{overflow-x:auto}svg.chart{display:block;margin:6px 0;font-size:12px}"
    "svg text{fill:#222}svg .tick{font-size:11px;fill:#555}svg .axis{font-size:12px;font-weight:600}"
    "svg .small{font-size:11px;fill:#666}svg .mem-val,svg .mem-total{paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}svg .mem-val{font-size:11.5px}svg .mem-total{font-weight:600}"
    "svg .seg-label,svg .tl-label{font-size:11px;font-weight:600}"
    "svg .pt-label{font-size:11px;font-weight:600}"
    "svg .grid{stroke:#e6e6e6;stroke-width:1}svg .frame{stroke:#888;stroke-width:1}"
    "svg .cap{stroke:#c62828;stroke-width:2;stroke-dasharray:6 4}svg .cap-label{fill:#c62828;font-weight:600}"
    "svg .tl-idle{fill:#f1f1f1}svg .tl-dp{fill:#b07aa1}svg .tl-opt{fill:#edc948}"
    "svg .tl-fwd-key{fill:#4e79a7}svg .tl-bwd-key{fill:#59a14f}"
    "details pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12px}"
    "footer{margin-top:30px;color:#888;font-size:12px}";

int plan_report_html(FILE *f, PlanCtx *c, const PlanReport *rep) {
  const PlanResult *r = rep->plan;
  /* the text report first: the timeline prices the layout again, which
   * replaces the PlanCtx's stages that r->stages points to (plan.h) */
  char *text = NULL;
  size_t len = 0;
  FILE *mf = open_memstream(&text, &len);
  if (mf) {
    plan_report_text(mf, c, rep);
    fclose(mf);
  }
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hpdlc plan: ", f);
  esc(f, rep->file);
  fprintf(f, "</title>\n<style>%s</style></head>\n<body>\n", css);
  if (r) {
    html_header(f, c, rep, r);
    if (r->valid) {
      fputs("<section id=\"memory\">\n<h2>Memory per GPU, by pipeline rank</h2>\n", f);
      svg_memory(f, r);
      fputs("<p class=\"caption\">the rest: temporaries of one forward / backward, communication buffers, and the allowance "
            "for the CUDA context, libraries and fragmentation.</p>\n</section>\n",
            f);
      fputs("<section id=\"time\">\n<h2>Time of one step</h2>\n", f);
      svg_time(f, r);
      fputs("</section>\n<section id=\"pipeline\">\n<h2>Pipeline schedule</h2>\n", f);
      svg_timeline(f, c, r); /* after it, r->stages is no longer valid */
      fputs("</section>\n", f);
    }
  }
  if (rep->search) {
    fputs("<section id=\"search-section\">\n<h2>Layout search</h2>\n", f);
    html_search(f, rep);
    fputs("</section>\n", f);
  }
  if (rep->scaling) {
    fputs("<section id=\"scaling\">\n<h2>Scaling</h2>\n", f);
    svg_scaling(f, rep->scaling);
    fputs("</section>\n", f);
  }
  /* the full text report, for the figures the pictures leave out */
  fputs("<details id=\"text-report\"><summary>the text report</summary>\n<pre>", f);
  esc(f, text);
  free(text);
  fputs("</pre></details>\n<footer>written by hpdlc plan --format html; a dry run, no GPU was used.</footer>\n</body></html>\n", f);
  return 0;
}
