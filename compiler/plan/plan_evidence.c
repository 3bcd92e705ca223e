/* plan_evidence.c - how far to trust a plan: the planner's errors on the
 * published runs most like it (plan_evidence.h, docs/planner.md sec. 16.1). */
#include "plan_evidence.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "plan_internal.h"

static const PlanEvidenceRow rows[] = {
#include "plan_evidence_rows.inc"
};

const PlanEvidenceRow *plan_evidence_rows(int *n) {
  *n = (int)(sizeof rows / sizeof rows[0]);
  return rows;
}

PlanTraits plan_traits(const PlanCtx *c, const PlanResult *r) {
  PlanTraits t;
  memset(&t, 0, sizeof t);
  const PlanLayout *L = &r->layout;
  Precision f = plan_gemm_format(c);
  t.v[PLAN_TRAIT_GEN] = (int)cost_gpu_generation(plan_device(c));
  t.v[PLAN_TRAIT_MOE] = c->experts > 0;
  t.v[PLAN_TRAIT_FORMAT] = f == PREC_NVFP4 ? 2 : f == PREC_FP8 || f == PREC_MXFP8 ? 1 : 0;
  t.v[PLAN_TRAIT_CONTEXT] = L->cp > 1;
  t.v[PLAN_TRAIT_LONG] = r->seq_len >= 32768;
  t.v[PLAN_TRAIT_EAGER] = !plan_fusion(c);
  t.v[PLAN_TRAIT_SHARDED] = L->zero == 3 && L->dp > 1;
  t.v[PLAN_TRAIT_PIPELINE] = L->pp > 1;
  t.v[PLAN_TRAIT_TENSOR] = L->tp > 1;
  return t;
}

const char *plan_trait_key(int trait) {
  static const char *const keys[PLAN_TRAIT_COUNT] = {"generation", "moe",   "context", "gemm_format", "long_sequence",
                                                     "eager",      "sharded", "pipeline", "tensor"};
  return trait >= 0 && trait < PLAN_TRAIT_COUNT ? keys[trait] : "?";
}

const char *plan_trait_code(int trait, int value) {
  static const char *const gen[] = {"other", "ampere", "hopper", "blackwell"};
  static const char *const fmt[] = {"16-bit", "fp8", "fp4"};
  if (trait == PLAN_TRAIT_GEN) return value >= 0 && value < 4 ? gen[value] : NULL;
  if (trait == PLAN_TRAIT_FORMAT) return value >= 0 && value < 3 ? fmt[value] : NULL;
  return NULL;
}

const char *plan_trait_words(int trait, int value) {
  switch (trait) {
  case PLAN_TRAIT_GEN:
    return value == COST_GEN_AMPERE ? "Ampere" : value == COST_GEN_HOPPER ? "Hopper"
         : value == COST_GEN_BLACKWELL ? "Blackwell" : "another GPU generation";
  case PLAN_TRAIT_MOE: return value ? "experts" : "dense";
  case PLAN_TRAIT_FORMAT: return value == 2 ? "FP4 GEMMs" : value == 1 ? "FP8 GEMMs" : "16-bit GEMMs";
  case PLAN_TRAIT_CONTEXT: return value ? "context-parallel" : "no context parallelism";
  case PLAN_TRAIT_LONG: return value ? "sequences of 32K and more" : "sequences under 32K";
  case PLAN_TRAIT_EAGER: return value ? "eager (fusion off)" : "fused";
  case PLAN_TRAIT_SHARDED: return value ? "ZeRO-3 / FSDP" : "no ZeRO-3";
  case PLAN_TRAIT_PIPELINE: return value ? "pipeline" : "no pipeline";
  case PLAN_TRAIT_TENSOR: return value ? "tensor-parallel" : "no tensor parallelism";
  }
  return "?";
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile of sorted v (linear between neighbours). */
static double quantile(const double *v, int n, double q) {
  double pos = q * (n - 1);
  int i = (int)floor(pos);
  if (i >= n - 1) return v[n - 1];
  return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

/* The runs like plan r: keep[i] for each row, matched[k] for each trait the
 * kept runs share. 0, -1 (none of its generation) or -2 (a model of images). */
static int choose(const PlanCtx *c, const PlanTraits *t, const PlanEvidenceRow *all, int n, unsigned char *keep,
                  int *matched) {
  if (plan_model(c)->images) return -2; /* the published runs are all language models */
  memset(keep, 1, (size_t)n);
  /* the traits in order, each kept where enough runs share it */
  for (int k = 0; k < PLAN_TRAIT_COUNT; k++) {
    int share = 0;
    for (int i = 0; i < n; i++) share += keep[i] && all[i].traits.v[k] == t->v[k];
    if (share < PLAN_EVIDENCE_MIN) {
      if (k == PLAN_TRAIT_GEN) return -1; /* none to judge it by */
      continue;
    }
    for (int i = 0; i < n; i++)
      if (all[i].traits.v[k] != t->v[k]) keep[i] = 0;
    matched[k] = 1;
  }
  return 0;
}

/* How far run row is from plan r in scale: GPUs, parameters and sequence, each by its ratio. */
static double distance(const PlanEvidenceRow *row, const PlanResult *r) {
  return fabs(log((double)row->gpus / (double)(r->gpus > 0 ? r->gpus : 1))) +
         fabs(log(row->params / (r->params > 0 ? r->params : 1))) +
         fabs(log((double)row->seq / (double)(r->seq_len > 0 ? r->seq_len : 1)));
}

typedef struct Ranked {
  double d;
  int i;
} Ranked;

static int cmp_ranked(const void *a, const void *b) {
  const Ranked *x = a, *y = b;
  return x->d < y->d ? -1 : x->d > y->d ? 1 : (x->i > y->i) - (x->i < y->i);
}

/* The runs like plan r, closest first (ties in the table's order), into
 * rank; returns how many, or choose's -1 / -2 (matched filled as it says). */
static int ranked(const PlanCtx *c, const PlanResult *r, const PlanTraits *t, const PlanEvidenceRow *all, int n,
                  Ranked *rank, int *matched) {
  unsigned char *keep = malloc((size_t)n + 1);
  int got = keep ? choose(c, t, all, n, keep, matched) : -1, m = 0;
  if (got == 0) {
    for (int i = 0; i < n; i++)
      if (keep[i]) rank[m++] = (Ranked){distance(&all[i], r), i};
    qsort(rank, (size_t)m, sizeof *rank, cmp_ranked);
  }
  free(keep);
  return got < 0 ? got : m;
}

int plan_evidence(const PlanCtx *c, const PlanResult *r, PlanEvidence *e) {
  memset(e, 0, sizeof *e);
  e->traits = plan_traits(c, r);
  int n;
  const PlanEvidenceRow *all = plan_evidence_rows(&n);
  Ranked *rank = malloc(sizeof *rank * ((size_t)n + 1));
  double *err = malloc(sizeof(double) * ((size_t)n + 1));
  int m = rank && err ? ranked(c, r, &e->traits, all, n, rank, e->matched) : -1;
  if (m < 0) {
    memset(e->matched, 0, sizeof e->matched);
    free(rank);
    free(err);
    return m;
  }
  for (int i = 0; i < m; i++) {
    const PlanEvidenceRow *row = &all[rank[i].i];
    err[i] = row->error;
    e->fitted += row->fitted;
    if (i < PLAN_EVIDENCE_CLOSEST) e->closest[e->nclosest++] = row;
  }
  e->runs = m;
  qsort(err, (size_t)m, sizeof *err, cmp_double);
  e->lo = quantile(err, m, 0.1);
  e->hi = quantile(err, m, 0.9);
  for (int i = 0; i < m; i++) err[i] = fabs(err[i]);
  qsort(err, (size_t)m, sizeof *err, cmp_double);
  e->median_abs = quantile(err, m, 0.5);
  e->step_lo = r->step_s / (1 + e->hi);
  e->step_hi = r->step_s / (1 + e->lo);
  free(rank);
  free(err);
  return 0;
}

int plan_evidence_list(const PlanCtx *c, const PlanResult *r, const PlanEvidence *e, const PlanEvidenceRow **out,
                       int max) {
  int n, matched[PLAN_TRAIT_COUNT] = {0};
  const PlanEvidenceRow *all = plan_evidence_rows(&n);
  Ranked *rank = malloc(sizeof *rank * ((size_t)n + 1));
  int m = rank ? ranked(c, r, &e->traits, all, n, rank, matched) : -1;
  for (int i = 0; i < m && i < max; i++) out[i] = &all[rank[i].i];
  free(rank);
  return m > 0 ? m : 0;
}

const char *plan_evidence_like(const PlanEvidence *e, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (int k = 0; k < PLAN_TRAIT_COUNT && len < n; k++) {
    if (!e->matched[k]) continue;
    len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", plan_trait_words(k, e->traits.v[k]));
  }
  return buf;
}

const char *plan_evidence_none(const PlanCtx *c, int got, char *buf, size_t n) {
  if (got == -2) snprintf(buf, n, "the published runs the planner was checked on are all language models, none like this one");
  else snprintf(buf, n, "no published run on %s or its generation to compare with", plan_device(c)->name);
  return buf;
}
