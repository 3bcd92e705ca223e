/* plan_calibrate.c - `hpdlc plan --calibrate TRACE -o FILE.hpd`: the
 * device figures of the plan's cluster fitted to what an `hpdlrun
 * --profile` trace measured, written as a cluster file the planner then
 * reads (`--cluster FILE.hpd`); docs/planner.md sec. 17.
 *
 * Three factors, each fitted on the classes of the trace that measure it:
 *   compute_scale  the device's peak FLOP/s of every precision: on the
 *                  forward and backward work (GEMMs and memory-bound kernels,
 *                  or the spans of code without per-kernel events) with the
 *                  step's unpriced time (data, the executor's work between
 *                  kernels), so that the fitted step is the measured one;
 *   memory_scale   its memory bandwidth: on the optimizer update (memory
 *                  bound, and priced apart from the kernels);
 *   the network    the cluster's link bandwidths: on the collectives.
 * The GEMM / memory-bound split of a trace with per-kernel events is not
 * fitted apart: on a CPU the memory-bound kernels run far below the
 * bandwidth the optimizer streams at (single-threaded rows, transposes),
 * and one memory figure for both mispriced the optimizer 7-fold.
 * The prediction is not linear in them (the roofline takes the larger of
 * two times per op, and the compute spans hold both kinds of op), so the
 * fit repeats: each factor times predicted / measured of its class, until
 * every fitted class is within 0.2% or 30 rounds; a factor that would leave
 * 1e-3 .. 1e3 of the catalog's figure stays at the bound, and the file and
 * the report say so. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"
#include "plan_compare.h"

typedef struct {
  double meas, pred; /* seconds per rank per step; <= 0: not measured / not priced */
} Fit;

/* The trace's classes beside the plan's, for the three factors. */
static void classes(const PlanCompare *cmp, const PlanResult *p, Fit *compute, Fit *memory, Fit *net) {
  const TraceData *t = &cmp->trace;
  const TraceMeasure *m = &cmp->measure;
  /* The step's unpriced time (the loader, the executor's own work between
   * ops) joins the class that holds the ops, so the fitted step is the
   * measured one. */
  double unpriced = (m->other_s > 0 ? m->other_s : 0) + (m->data_s > 0 ? m->data_s : 0);
  double fwd_bwd = t->op_events ? m->gemm_s + m->membound_s : m->compute_s;
  *compute = (Fit){fwd_bwd + unpriced, p->compute_s};
  *memory = (Fit){m->optimizer_s, p->optimizer_s};
  double cm = 0, cp = 0;
  for (int k = 0; k < t->ncomm; k++)
    if (!trace_comm_is_bubble(t, k) && strcmp(t->comm[k].group, "world") && strcmp(t->comm[k].group, "pp")) cm += m->comm_s[k];
  static const IrGroup priced[] = {IRG_DP, IRG_TP, IRG_CP, IRG_EP, IRG_EDP};
  for (size_t g = 0; g < sizeof priced / sizeof priced[0]; g++) cp += p->comm_s[priced[g]] > 0 ? p->comm_s[priced[g]] : 0;
  *net = (Fit){cm, cp};
}

static int fitted(const Fit *f) { return f->meas > 0 && f->pred > 0 && isfinite(f->pred); }
static double ratio(const Fit *f) { return fitted(f) ? f->pred / f->meas : 1; }

/* A bandwidth as the lexer reads it (grammar/lexer.l's units). */
static void put_rate(FILE *f, const char *key, double bps) {
  if (bps >= 1e9) fprintf(f, "  %s = %.4fGB/s\n", key, bps / 1e9);
  else if (bps >= 1e6) fprintf(f, "  %s = %.4fMB/s\n", key, bps / 1e6);
  else fprintf(f, "  %s = %.0fB/s\n", key, bps < 1 ? 1 : bps);
}

/* The cluster's name: the file's base name, letters, digits and '_'. */
static void name_of(const char *path, char *out, size_t len) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  size_t n = 0;
  if (!((*b >= 'a' && *b <= 'z') || (*b >= 'A' && *b <= 'Z'))) n += (size_t)snprintf(out, len, "c_");
  for (; *b && *b != '.' && n + 1 < len; b++)
    out[n++] = (char)(((*b >= 'a' && *b <= 'z') || (*b >= 'A' && *b <= 'Z') || (*b >= '0' && *b <= '9')) ? *b : '_');
  out[n] = 0;
  if (!n) snprintf(out, len, "calibrated");
}

int plan_calibrate(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o) {
  if (!o->output || !strcmp(o->output, "-")) {
    fprintf(stderr, "hpdlc: plan --calibrate: name the cluster file to write with -o FILE.hpd\n");
    return 2;
  }
  if (o->search || o->scaling || o->compare) {
    fprintf(stderr, "hpdlc: plan --calibrate fits one layout: drop --search, --scaling and --compare\n");
    return 2;
  }
  PlanCompare cmp;
  char why[1024];
  if (plan_compare_load(&cmp, o->calibrate, why, sizeof why) != 0) {
    fprintf(stderr, "hpdlc: plan --calibrate: %s\n", why);
    return 1;
  }
  /* the cluster as the plan sees it, made explicit so its figures can move */
  SemModel mm = *m;
  PlanCtx *c = plan_new(&mm, diag);
  if (!c) {
    plan_compare_free(&cmp);
    return 1;
  }
  SemCluster base = m->has_cluster ? m->cluster : *plan_cluster(c);
  if (!(base.compute_scale > 0)) base.compute_scale = 1;
  if (!(base.memory_scale > 0)) base.memory_scale = 1;
  const char *device = plan_device(c)->name;
  plan_free(c);
  mm.cluster = base;
  mm.has_cluster = 1;
  const TraceData *t = &cmp.trace;
  if (t->dp > 0 && (t->dp != (m->layout.dp > 0 ? m->layout.dp : t->dp) || t->tp != (m->layout.tp > 0 ? m->layout.tp : t->tp) ||
                    t->pp != (m->layout.pp > 0 ? m->layout.pp : t->pp) || t->cp != (m->layout.cp > 0 ? m->layout.cp : t->cp)))
    fprintf(stderr,
            "hpdlc: plan --calibrate: warning: the trace ran dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64
            ", not the layout planned; fit the trace's layout (--dp %" PRId64 " --tp %" PRId64 " --pp %" PRId64 " --cp %" PRId64 ")\n",
            t->dp, t->tp, t->pp, t->cp, t->dp, t->tp, t->pp, t->cp);
  double cs = 1, ms = 1, ns = 1;
  PlanResult first, p;
  memset(&first, 0, sizeof first);
  memset(&p, 0, sizeof p);
  Fit fc, fm, fn, fc0 = {0, 0}, fm0 = {0, 0}, fn0 = {0, 0};
  int rounds = 0, ok = 0, bound[3] = {0, 0, 0};
  double prev_f[3] = {1, 1, 1}, prev_p[3] = {0, 0, 0};
  for (; rounds < 30; rounds++) {
    mm.cluster.compute_scale = base.compute_scale * cs;
    mm.cluster.memory_scale = base.memory_scale * ms;
    mm.cluster.intra_bytes_per_s = base.intra_bytes_per_s * ns;
    mm.cluster.inter_bytes_per_s = base.inter_bytes_per_s * ns;
    c = plan_new(&mm, diag);
    if (!c) break;
    PlanLayout L = plan_layout_of(&mm);
    plan_resolve(c, &L, &p);
    plan_free(c);
    if (!p.valid) {
      fprintf(stderr, "hpdlc: plan --calibrate: the layout cannot be planned: %s\n", p.why);
      break;
    }
    classes(&cmp, &p, &fc, &fm, &fn);
    if (rounds == 0) first = p, fc0 = fc, fm0 = fm, fn0 = fn;
    if (!fitted(&fc)) {
      fprintf(stderr, "hpdlc: plan --calibrate: %s measures no forward or backward time to fit the device's FLOP/s to\n",
              o->calibrate);
      break;
    }
    const Fit *fit[3] = {&fc, &fm, &fn};
    double *f[3] = {&cs, &ms, &ns};
    int settled = 1;
    for (int k = 0; k < 3; k++) {
      double r = ratio(fit[k]);
      if (bound[k] || fabs(r - 1) < 2e-3) continue;
      settled = 0;
      /* The class's time as the plan prices it is about A / f + B (B: what
       * the factor does not move, e.g. each kernel's overhead): from this
       * round and the last, the f that gives the measured time (a secant
       * step in 1/f); the first round, and when the two rounds say nothing,
       * f times predicted / measured. */
      double next = *f[k] * r;
      if (rounds > 0 && fabs(1 / prev_f[k] - 1 / *f[k]) > 1e-12) {
        double A = (prev_p[k] - fit[k]->pred) / (1 / prev_f[k] - 1 / *f[k]), B = fit[k]->pred - A / *f[k];
        if (A > 0) next = fit[k]->meas > B ? A / (fit[k]->meas - B) : 1e3 * 10;
      }
      prev_f[k] = *f[k], prev_p[k] = fit[k]->pred;
      /* A class the plan cannot bring to the measured time within 1e-3 ..
       * 1e3 of the catalog's figure (its fixed per-kernel overhead above a
       * trace of tiny kernels, or a stalled run) stays at that bound. */
      if (next < 1e-3 || next > 1e3) next = next < 1e-3 ? 1e-3 : 1e3, bound[k] = 1;
      *f[k] = next;
    }
    if (settled) {
      ok = 1;
      break;
    }
  }
  if (!ok) {
    if (rounds == 30) fprintf(stderr, "hpdlc: plan --calibrate: the fit did not settle in 30 rounds\n");
    plan_compare_free(&cmp);
    return 1;
  }
  FILE *f = fopen(o->output, "w");
  if (!f) {
    fprintf(stderr, "hpdlc: plan --calibrate: cannot write %s: %s\n", o->output, strerror(errno));
    plan_compare_free(&cmp);
    return 1;
  }
  char name[96], day[32] = "";
  name_of(o->output, name, sizeof name);
  time_t now = time(NULL);
  struct tm tmv;
  if (localtime_r(&now, &tmv)) strftime(day, sizeof day, "%Y-%m-%d", &tmv);
  const TraceMeasure *mz = &cmp.measure;
  fprintf(f, "# %s - cluster %s: %s's figures fitted to a measured run (hpdlc plan --calibrate, %s)\n", o->output, name, device,
          day);
  fprintf(f, "#   model %s, trace %s (%d rank%s, %d step%s), %s\n", path, o->calibrate, t->nranks, t->nranks == 1 ? "" : "s",
          mz->steps, mz->steps == 1 ? "" : "s", t->op_events ? "per-op events" : "forward / backward spans");
  fprintf(f, "#   class          measured ms   predicted before -> after\n");
  const char *cl = "compute", *ml = "optimizer";
  fprintf(f, "#   %-14s %11.3f   %9.3f -> %.3f\n", cl, fc0.meas * 1e3, fc0.pred * 1e3, fc.pred * 1e3);
  if (fitted(&fm0)) fprintf(f, "#   %-14s %11.3f   %9.3f -> %.3f\n", ml, fm0.meas * 1e3, fm0.pred * 1e3, fm.pred * 1e3);
  if (fitted(&fn0)) fprintf(f, "#   %-14s %11.3f   %9.3f -> %.3f\n", "collectives", fn0.meas * 1e3, fn0.pred * 1e3, fn.pred * 1e3);
  fprintf(f, "#   %-14s %11.3f   %9.3f -> %.3f\n", "step", mz->step_s * 1e3, first.step_s * 1e3, p.step_s * 1e3);
  static const char *const what[3] = {"compute_scale", "memory_scale", "the network's factor"};
  for (int k = 0; k < 3; k++)
    if (bound[k])
      fprintf(f, "#   %s stopped at its bound (1e-3 .. 1e3): the plan cannot reach the measured time with it\n", what[k]);
  fprintf(f, "# Use: hpdlc plan MODEL --cluster %s\n", o->output);
  fprintf(f, "cluster %s {\n", name);
  fprintf(f, "  device = %s\n", device);
  fprintf(f, "  gpus_per_node = %" PRId64 "\n", base.gpus_per_node > 0 ? base.gpus_per_node : 1);
  if (base.nodes > 1) fprintf(f, "  nodes = %" PRId64 "\n", base.nodes);
  fprintf(f, "  nics_per_node = %" PRId64 "\n", base.nics_per_node);
  if (base.shared_device) fprintf(f, "  shared = true\n");
  /* the device's own figures, as the input cluster gave them: the scales apply on top */
  for (int k = 0; k < SEM_FIG_COUNT; k++) {
    if (!(base.described >> k & 1u)) continue;
    double v = base.figures[k];
    if (k == SEM_FIG_MEMORY) fprintf(f, "  memory = %.0fB\n", v);
    else if (k == SEM_FIG_MEMORY_BANDWIDTH) put_rate(f, "memory_bandwidth", v);
    else if (k == SEM_FIG_SMS) fprintf(f, "  sms = %.0f\n", v);
    else fprintf(f, "  %s = %.6gTFLOP/s\n", sem_figure_keys[k], v / 1e12);
  }
  fprintf(f, "  compute_scale = %.6g\n", mm.cluster.compute_scale);
  fprintf(f, "  memory_scale = %.6g\n", mm.cluster.memory_scale);
  if (mm.cluster.intra_bytes_per_s > 0) put_rate(f, "intra_bandwidth", mm.cluster.intra_bytes_per_s);
  fprintf(f, "  intra_latency = %.3fus\n", base.intra_latency_s * 1e6);
  if (base.nics_per_node > 0 && mm.cluster.inter_bytes_per_s > 0) {
    put_rate(f, "inter_bandwidth", mm.cluster.inter_bytes_per_s);
    fprintf(f, "  inter_latency = %.3fus\n", base.inter_latency_s * 1e6);
  }
  fprintf(f, "}\n");
  int werr = ferror(f);
  if (fclose(f) != 0 || werr) {
    fprintf(stderr, "hpdlc: plan --calibrate: writing %s failed\n", o->output);
    plan_compare_free(&cmp);
    return 1;
  }
  double e0 = (first.step_s - mz->step_s) / mz->step_s * 100, e1 = (p.step_s - mz->step_s) / mz->step_s * 100;
  printf("calibrated %s from %s in %d round%s: compute x%.4g, memory x%.4g, network x%.4g\n", device, o->calibrate, rounds,
         rounds == 1 ? "" : "s", cs, ms, ns);
  printf("  step: measured %.3f ms, predicted %.3f ms before (%+.1f%%), %.3f ms after (%+.1f%%)\n", mz->step_s * 1e3,
         first.step_s * 1e3, e0, p.step_s * 1e3, e1);
  for (int k = 0; k < 3; k++)
    if (bound[k])
      printf("  %s stopped at its bound (1e-3 .. 1e3 of the catalog's figure): the plan cannot reach the measured %s time "
             "with it (e.g. its per-kernel overhead exceeds a trace of tiny kernels)\n",
             what[k], k == 0 ? cl : k == 1 ? ml : "collective");
  printf("wrote %s (cluster %s): hpdlc plan MODEL --cluster %s\n", o->output, name, o->output);
  plan_compare_free(&cmp);
  return 0;
}
