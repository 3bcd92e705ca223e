/* plan_evidence.h - how far to trust a plan: the planner's errors on the
 * published training runs most like it (docs/planner.md sec. 16.1).
 *
 * Every run of tests/plan's published sets is compiled in (plan_evidence_rows.inc,
 * written by tests/plan/fidelity_table.sh from the planner's own predictions;
 * plan.evidence fails when it is stale) with its traits and the planner's
 * error on it. A plan picks the runs that share its traits, the first of
 * these the most: the GPU generation, experts or not, context parallelism,
 * the GEMMs' format, long sequences, an eager program, ZeRO-3 / FSDP,
 * pipeline and tensor parallelism; a trait is dropped where fewer than PLAN_EVIDENCE_MIN runs
 * would remain. */
#ifndef HPDL_PLAN_EVIDENCE_H
#define HPDL_PLAN_EVIDENCE_H

#include <stddef.h>

#include "plan.h"

/* A trait that fewer runs share is left out of the match. */
#define PLAN_EVIDENCE_MIN 5

enum { PLAN_TRAIT_GEN, PLAN_TRAIT_MOE, PLAN_TRAIT_CONTEXT, PLAN_TRAIT_FORMAT, PLAN_TRAIT_LONG, PLAN_TRAIT_EAGER,
       PLAN_TRAIT_SHARDED, PLAN_TRAIT_PIPELINE, PLAN_TRAIT_TENSOR, PLAN_TRAIT_COUNT };

/* What a plan is, as the published runs are told apart. */
typedef struct PlanTraits {
  int v[PLAN_TRAIT_COUNT];
  /* v[GEN]: CostGpuGen; v[FORMAT]: 0 16/32-bit GEMMs, 1 FP8 (fp8, mxfp8),
   * 2 FP4 (nvfp4); the rest 0 / 1: experts, cp > 1, sequences of 32768 and
   * more, fusion off, ZeRO-3, pp > 1, tp > 1 */
} PlanTraits;

/* One published run: what it is and how far the planner was off. */
typedef struct PlanEvidenceRow {
  const char *id, *set;
  PlanTraits traits;
  int gpus;
  double params; /* the model's parameters */
  int seq;       /* its sequence length */
  double error;  /* predicted / published step time - 1 (negative: predicted fast) */
  int fitted;    /* an asserted run: the planner's constants were fitted on those (sec. 14) */
} PlanEvidenceRow;

/* The compiled-in runs. */
const PlanEvidenceRow *plan_evidence_rows(int *n);

#define PLAN_EVIDENCE_CLOSEST 3

typedef struct PlanEvidence {
  PlanTraits traits;             /* the plan's (set whatever plan_evidence returns) */
  int runs, fitted;              /* the runs chosen; of them in asserted sets */
  int matched[PLAN_TRAIT_COUNT]; /* 1: the runs share the plan's trait */
  double median_abs;             /* the median of |error| */
  double lo, hi;                 /* the 10th and 90th percentile of error */
  double step_lo, step_hi;       /* the step time those two errors would put it at */
  int nclosest;
  const PlanEvidenceRow *closest[PLAN_EVIDENCE_CLOSEST]; /* by GPUs, parameters and sequence */
} PlanEvidence;

/* The traits of plan r. */
PlanTraits plan_traits(const PlanCtx *c, const PlanResult *r);
/* The traits' names, for JSON ("generation", "moe", ...) */
const char *plan_trait_key(int trait);
/* The JSON name of a value of the generation or the GEMM format ("hopper",
 * "fp8"; NULL for a value out of range); NULL for the other, boolean, traits. */
const char *plan_trait_code(int trait, int value);
/* One trait's value in words ("Hopper", "dense", "FP8 GEMMs", ...). */
const char *plan_trait_words(int trait, int value);
/* The evidence for plan r; 0, or -1 where fewer than PLAN_EVIDENCE_MIN
 * published runs are of its GPU generation, -2 for a model of images (the
 * runs are all language models): none to judge it by. */
int plan_evidence(const PlanCtx *c, const PlanResult *r, PlanEvidence *e);
/* Every run plan_evidence chose, closest first (by GPUs, parameters and sequence, as
 * `closest`), into out (at most max); e is plan_evidence's result for r (its
 * traits); returns how many there are (0 where plan_evidence has none). */
int plan_evidence_list(const PlanCtx *c, const PlanResult *r, const PlanEvidence *e, const PlanEvidenceRow **out,
                       int max);
/* The traits the chosen runs share, in words: "Hopper, dense, FP8 GEMMs, pipeline". */
const char *plan_evidence_like(const PlanEvidence *e, char *buf, size_t n);
/* Why plan_evidence's status `got` (-1, -2) gives nothing to judge the plan by, in a phrase for the reports. */
const char *plan_evidence_none(const PlanCtx *c, int got, char *buf, size_t n);

#endif
