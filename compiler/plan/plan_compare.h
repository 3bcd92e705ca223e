/* plan_compare.h - `hpdlc plan --compare TRACE`: an `hpdlrun --profile`
 * trace's measured time per op class beside the planner's prediction
 * (plan_compare.c; the trace is read by trace_read.h). */
#ifndef HPDL_PLAN_COMPARE_H
#define HPDL_PLAN_COMPARE_H

#include <stdio.h>

#include "plan.h"
#include "trace_read.h"

typedef struct PlanCompare {
  const char *path;
  TraceData trace;
  TraceMeasure measure;
} PlanCompare;

/* Reads and averages the trace at path: 0, or -1 with a message naming it. */
int plan_compare_load(PlanCompare *pc, const char *path, char *err, size_t errlen);
void plan_compare_free(PlanCompare *pc);
/* The table (text) after the plan's report. */
void plan_compare_text(FILE *f, const PlanCompare *pc, PlanCtx *c, const PlanResult *p);
/* The `compare` object of the JSON report (a json_t *, owned by the caller). */
void *plan_compare_json(const PlanCompare *pc, PlanCtx *c, const PlanResult *p);

#endif
