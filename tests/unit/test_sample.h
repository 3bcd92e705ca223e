/* test_sample.h - lowers a sample as its own file lays it out (its train and
 * parallel blocks, optional -D overrides) for the unit tests that need the
 * forward IR of a whole model; the IR must verify. test_model.h is the other
 * loader: it pins the layout to one rank of the cpu cluster. */
#ifndef HPDL_TEST_SAMPLE_H
#define HPDL_TEST_SAMPLE_H

#include <stdio.h>
#include <string.h>

#include "ir.h"
#include "loader.h"
#include "lower.h"
#include "sema.h"

/* NULL when the sample does not load, check, lower or verify (the reason is
 * in diag or on stderr). micro <= 0 takes the train block's micro batch;
 * model, when not NULL, receives the checked model; layout overrides the
 * parallel block (names as "parallel.tensor", values as on the command
 * line). */
static inline IrModule *lower_sample_with(Arena *arena, Diag *diag, const char *name, SemDefine *defs, int ndefs,
                                          SemDefine *layout, int nlayout, int64_t micro, SemModel **model,
                                          const LowerOptions *lo) {
  char path[4096];
  snprintf(path, sizeof path, "%s/samples/%s", HPDL_SOURCE_DIR, name);
  int before = diag_error_count(diag);
  LoadedProgram prog = load_program(arena, diag, path);
  if (diag_error_count(diag) != before || prog.nfiles == 0) return NULL;
  int bad_cli = 0;
  SemOptions opts;
  memset(&opts, 0, sizeof opts);
  opts.defines = defs;
  opts.ndefines = ndefs;
  opts.layout = layout;
  opts.nlayout = nlayout;
  opts.cli_error = &bad_cli;
  SemModel *m = sema_check(arena, diag, &prog, &opts);
  if (!m) return NULL;
  if (model) *model = m;
  IrModule *ir = lower_model_with(arena, diag, m, micro > 0 ? micro : m->train.micro_batch, lo);
  if (ir && ir_verify(ir, stderr)) return NULL;
  return ir;
}

static inline IrModule *lower_sample_layout(Arena *arena, Diag *diag, const char *name, SemDefine *defs, int ndefs,
                                            SemDefine *layout, int nlayout, int64_t micro, SemModel **model) {
  LowerOptions lo = {0, 0, 0};
  return lower_sample_with(arena, diag, name, defs, ndefs, layout, nlayout, micro, model, &lo);
}

/* The sample under its own layout (no layout overrides). */
static inline IrModule *lower_sample(Arena *arena, Diag *diag, const char *name, SemDefine *defs, int ndefs, int64_t micro,
                                     SemModel **model) {
  return lower_sample_layout(arena, diag, name, defs, ndefs, NULL, 0, micro, model);
}

#endif
