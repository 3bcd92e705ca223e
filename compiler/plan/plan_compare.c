/* plan_compare.c - `hpdlc plan --compare trace.json`: what an `hpdlrun
 * --profile` trace measured (trace_read.h), class by class, beside what the
 * planner predicts for the same classes (docs/planner.md, "Predicted beside
 * measured"). */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_compare.h"

enum { CMP_MAX_ROWS = 16 + TRACE_MAX_COMM + 8, CMP_MAX_WARN = 8 };

typedef struct CmpRow {
  char key[112];  /* for JSON: gemm, memory_bound, comm_dp, comm_dp_all_reduce, ... */
  char label[64]; /* for text */
  int indent;
  double measured, predicted; /* seconds; NAN: not measured / not priced */
  double calls;               /* collectives: calls per rank per step; else -1 */
} CmpRow;

typedef struct Cmp {
  CmpRow row[CMP_MAX_ROWS];
  int nrows;
  char warn[CMP_MAX_WARN][512];
  int nwarn;
  char device[320];
} Cmp;

static CmpRow *add(Cmp *c, const char *key, const char *label, int indent, double meas, double pred) {
  if (c->nrows == CMP_MAX_ROWS) return NULL;
  CmpRow *r = &c->row[c->nrows++];
  snprintf(r->key, sizeof r->key, "%s", key);
  snprintf(r->label, sizeof r->label, "%s", label);
  r->indent = indent;
  r->measured = meas;
  r->predicted = pred;
  r->calls = -1;
  return r;
}

static void warn(Cmp *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(Cmp *c, const char *fmt, ...) {
  if (c->nwarn == CMP_MAX_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->warn[c->nwarn++], sizeof c->warn[0], fmt, ap);
  va_end(ap);
}

static double err_pct(const CmpRow *r) {
  if (!isfinite(r->measured) || !isfinite(r->predicted) || r->measured <= 0) return NAN;
  return (r->predicted - r->measured) / r->measured * 100.0;
}

/* the planner's groups as the trace names them */
static const char *const group_key[IRG_COUNT] = {"dp", "tp", "pp", "cp", "ep", "edp"};

static void build(Cmp *c, PlanCtx *pc, const PlanResult *p, const TraceData *t, const TraceMeasure *m) {
  memset(c, 0, sizeof *c);
  const CatDevice *dev = plan_device(pc);
  const SemCluster *cl = plan_cluster(pc);
  int cpu = dev && !strcmp(dev->name, "cpu");
  const PlanLayout *L = &p->layout;
  if (cpu)
    snprintf(c->device, sizeof c->device,
             "the plan prices %" PRId64 " x cpu (cluster %s: %.1f GFLOP/s fp32, %.1f GB/s memory; --measure-cpu times this machine)",
             p->gpus, cl && cl->name ? cl->name : "?", dev->peak_flops_fp32 / 1e9, dev->hbm_bytes_per_s / 1e9);
  else
    snprintf(c->device, sizeof c->device, "the plan prices %" PRId64 " x %s GPUs (cluster %s), not the machine that made the trace",
             p->gpus, dev ? dev->name : "?", cl && cl->name ? cl->name : "?");
  if (!cpu)
    warn(c,
         "the plan prices %s GPUs: a trace measured on a CPU (hpdlrun's CPU path or the reference executor) compared with it "
         "is meaningless; plan the machine that ran the trace (--cluster laptop for the cpu device, with --measure-cpu)",
         dev ? dev->name : "?");
  if (t->dp > 0 && (t->dp != L->dp || t->tp != L->tp || t->pp != L->pp || t->cp != L->cp))
    warn(c,
         "the trace ran dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 " (its process names), the plan prices dp=%" PRId64
         " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 ": the columns are different programs; plan the trace's layout with --dp %" PRId64
         " --tp %" PRId64 " --pp %" PRId64 " --cp %" PRId64 " (and its --cluster)",
         t->dp, t->tp, t->pp, t->cp, L->dp, L->tp, L->pp, L->cp, t->dp, t->tp, t->pp, t->cp);
  if (t->dp == 0) warn(c, "the trace's processes are not named \"rank R (dp d, tp t, pp p, cp c)\": its layout is unknown");
  if (t->dropped_events > 0 || t->truncated > 0)
    warn(c, "the trace is incomplete: %" PRId64 " events dropped by hpdlrun (--profile-events), %zu past the reader's cap: the "
            "classes miss time",
         t->dropped_events > 0 ? t->dropped_events : 0, t->truncated);
  if (!t->op_events)
    warn(c, "no per-op events: GEMM and memory-bound time are not told apart (a trace of an older artifact's native code: "
            "recompile it, or profile with HPDL_EXECUTOR=interp)");
  if (!isfinite(p->step_s))
    warn(c, "the plan's step time is not finite (a group crosses nodes the cluster gives no network; with the cpu device, "
            "--gpus-per-node N puts the N ranks on one machine)");
  if (m->steps == 1) warn(c, "one step only: no warm-up step left out; profile 3 or more steps for a steadier mean");

  if (t->op_events) {
    add(c, "gemm", "GEMM (matmul)", 0, m->gemm_s, p->gemm_s);
    add(c, "memory_bound", "memory-bound ops", 0, m->membound_s, p->other_s);
  } else {
    add(c, "compute", "compute (forward, backward)", 0, m->compute_s, p->compute_s);
  }
  /* collectives: a row per group, a row per kind under it */
  static const char *const groups[] = {"tp", "cp", "dp", "pp", "world", "-", "?"};
  for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
    const char *g = groups[gi];
    int irg = -1;
    for (int k = 0; k < IRG_COUNT; k++)
      if (!strcmp(group_key[k], g)) irg = k;
    double meas = 0, calls = 0;
    int any = 0;
    for (int k = 0; k < t->ncomm; k++)
      if (!strcmp(t->comm[k].group, g)) {
        any = 1;
        if (trace_comm_is_bubble(t, k)) continue; /* in the bubble's row */
        meas += m->comm_s[k];
        calls += m->comm_calls[k];
      }
    double pred = irg >= 0 && p->comm_s[irg] > 0 ? p->comm_s[irg] : (irg >= 0 && any ? 0.0 : NAN);
    if (!any && !(irg >= 0 && p->comm_s[irg] > 0)) continue;
    char key[48], label[48];
    snprintf(key, sizeof key, "comm_%s", !strcmp(g, "-") ? "nogroup" : !strcmp(g, "?") ? "unknown" : g);
    snprintf(label, sizeof label, "%s communication", !strcmp(g, "-") ? "ungrouped" : g);
    CmpRow *r = add(c, key, label, 0, any ? meas : 0.0, pred);
    if (r) r->calls = calls;
    for (int k = 0; k < t->ncomm; k++)
      if (!strcmp(t->comm[k].group, g)) {
        char kk[96];
        snprintf(kk, sizeof kk, "%s_%s", key, t->comm[k].kind);
        char lab[64];
        snprintf(lab, sizeof lab, "%s%s", t->comm[k].kind, trace_comm_is_bubble(t, k) ? " (in the bubble)" : "");
        CmpRow *q = add(c, kk, lab, 1, m->comm_s[k], NAN);
        if (q) q->calls = m->comm_calls[k];
      }
  }
  if (t->pp > 1 || L->pp > 1)
    add(c, "bubble", "pipeline bubble", 0, m->bubble_s >= 0 ? m->bubble_s : NAN, L->pp > 1 ? p->bubble_s : NAN);
  add(c, "optimizer", "optimizer update", 0, m->optimizer_s, p->optimizer_s);
  add(c, "data", "data", 0, m->data_s, NAN);
  add(c, "other", "other", 0, m->other_s, NAN);
  add(c, "step", "step", 0, m->step_s, p->step_s);
}

static void print_ms(FILE *f, double s) {
  if (isfinite(s)) fprintf(f, " %12.4f", s * 1e3);
  else fprintf(f, " %12s", "-");
}

static void text(FILE *f, const Cmp *c, const char *path, const TraceData *t, const TraceMeasure *m) {
  char ck[64] = "";
  if (m->ckpt_skipped) snprintf(ck, sizeof ck, "; %d writing a checkpoint left out", m->ckpt_skipped);
  fprintf(f, "\ncompare: %s: %d rank%s, %d step%s (%s%s), %" PRId64 " rank-steps averaged\n", path, t->nranks,
          t->nranks == 1 ? "" : "s", m->steps, m->steps == 1 ? "" : "s",
          m->first_skipped ? "the first left out as warm-up" : "all used", ck, m->samples);
  if (t->dp > 0)
    fprintf(f, "  trace layout: dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 " (from its process names)\n", t->dp,
            t->tp, t->pp, t->cp);
  fprintf(f, "  device: %s\n", c->device);
  fprintf(f, "  events: %zu read, %zu kept, %zu of unknown shape ignored\n", t->seen, t->n, t->ignored);
  for (int i = 0; i < c->nwarn; i++) fprintf(f, "  warning: %s\n", c->warn[i]);
  fprintf(f, "  %-30s %12s %12s %9s %10s\n", "class (per rank per step)", "measured ms", "predicted ms", "error %", "calls");
  for (int i = 0; i < c->nrows; i++) {
    const CmpRow *r = &c->row[i];
    fprintf(f, "  %s%-*s", r->indent ? "  " : "", r->indent ? 28 : 30, r->label);
    print_ms(f, r->measured);
    print_ms(f, r->predicted);
    double e = err_pct(r);
    if (isfinite(e)) fprintf(f, " %8.1f%%", e);
    else fprintf(f, " %9s", "-");
    if (r->calls >= 0) fprintf(f, " %10.2f", r->calls);
    fputc('\n', f);
  }
  fprintf(f, "  error %% = (predicted - measured) / measured; '-': not measured or not priced\n");
}

static json_t *jnum_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *json_of(const Cmp *c, const char *path, const TraceData *t, const TraceMeasure *m, const PlanResult *p, PlanCtx *pc) {
  json_t *o = json_object();
  json_object_set_new(o, "trace", json_string(path));
  json_object_set_new(o, "ranks", json_integer(t->nranks));
  json_object_set_new(o, "steps", json_integer(m->steps));
  json_object_set_new(o, "steps_used", json_integer(m->steps_used));
  json_object_set_new(o, "first_step_skipped", json_boolean(m->first_skipped));
  json_object_set_new(o, "checkpoint_steps_skipped", json_integer(m->ckpt_skipped));
  json_object_set_new(o, "rank_steps", json_integer(m->samples));
  json_t *lay = json_object();
  if (t->dp > 0) {
    json_object_set_new(lay, "dp", json_integer(t->dp));
    json_object_set_new(lay, "tp", json_integer(t->tp));
    json_object_set_new(lay, "pp", json_integer(t->pp));
    json_object_set_new(lay, "cp", json_integer(t->cp));
  }
  json_object_set_new(o, "trace_layout", lay);
  json_t *pl = json_object();
  json_object_set_new(pl, "dp", json_integer(p->layout.dp));
  json_object_set_new(pl, "tp", json_integer(p->layout.tp));
  json_object_set_new(pl, "pp", json_integer(p->layout.pp));
  json_object_set_new(pl, "cp", json_integer(p->layout.cp));
  json_object_set_new(o, "plan_layout", pl);
  const CatDevice *dev = plan_device(pc);
  json_t *d = json_object();
  json_object_set_new(d, "name", json_string(dev ? dev->name : "?"));
  json_object_set_new(d, "cpu", json_boolean(dev && !strcmp(dev->name, "cpu")));
  json_object_set_new(d, "gpus", json_integer(p->gpus));
  json_object_set_new(d, "note", json_string(c->device));
  json_object_set_new(o, "device", d);
  json_t *ev = json_object();
  json_object_set_new(ev, "read", json_integer((json_int_t)t->seen));
  json_object_set_new(ev, "kept", json_integer((json_int_t)t->n));
  json_object_set_new(ev, "ignored", json_integer((json_int_t)t->ignored));
  json_object_set_new(ev, "truncated", json_integer((json_int_t)t->truncated));
  json_object_set_new(ev, "dropped_by_hpdlrun", json_integer(t->dropped_events > 0 ? t->dropped_events : 0));
  json_object_set_new(o, "events", ev);
  json_t *rows = json_array();
  for (int i = 0; i < c->nrows; i++) {
    const CmpRow *r = &c->row[i];
    json_t *e = json_object();
    json_object_set_new(e, "class", json_string(r->key));
    json_object_set_new(e, "label", json_string(r->label));
    json_object_set_new(e, "measured_s", jnum_or_null(r->measured));
    json_object_set_new(e, "predicted_s", jnum_or_null(r->predicted));
    json_object_set_new(e, "error_pct", jnum_or_null(err_pct(r)));
    if (r->calls >= 0) json_object_set_new(e, "calls", json_real(r->calls));
    json_array_append_new(rows, e);
  }
  json_object_set_new(o, "classes", rows);
  json_t *w = json_array();
  for (int i = 0; i < c->nwarn; i++) json_array_append_new(w, json_string(c->warn[i]));
  json_object_set_new(o, "warnings", w);
  return o;
}

int plan_compare_load(PlanCompare *pc, const char *path, char *err, size_t errlen) {
  memset(pc, 0, sizeof *pc);
  pc->path = path;
  trace_init(&pc->trace, path, TRACE_DEFAULT_MAX_EVENTS);
  if (trace_read_file(&pc->trace, err, errlen) || trace_measure(&pc->trace, &pc->measure, err, errlen)) {
    trace_free(&pc->trace);
    return -1;
  }
  return 0;
}

void plan_compare_free(PlanCompare *pc) { trace_free(&pc->trace); }

void plan_compare_text(FILE *f, const PlanCompare *pc, PlanCtx *c, const PlanResult *p) {
  Cmp *cmp = malloc(sizeof *cmp);
  if (!cmp) abort();
  build(cmp, c, p, &pc->trace, &pc->measure);
  text(f, cmp, pc->path, &pc->trace, &pc->measure);
  free(cmp);
}

void *plan_compare_json(const PlanCompare *pc, PlanCtx *c, const PlanResult *p) {
  Cmp *cmp = malloc(sizeof *cmp);
  if (!cmp) abort();
  build(cmp, c, p, &pc->trace, &pc->measure);
  json_t *o = json_of(cmp, pc->path, &pc->trace, &pc->measure, p, c);
  free(cmp);
  return o;
}
