/* emit.h - the `hpdlc emit` views that build the whole per-rank program
 * (and so need the planner's split of the pipeline stages). */
#ifndef HPDL_EMIT_H
#define HPDL_EMIT_H

#include <stdio.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"
#include "sema.h"
#include "sim.h"
#include "spmd.h"

/* The layout the model declares, as the emit views build a rank's program:
 * an auto or absent degree as 1, no recomputation when auto, the declared
 * micro-batch, one micro-batch a step, no ZeRO, 1F1B. */
SimLayout emit_declared_layout(const SemModel *model);

/* Its partitioning of the global module (spmd.h). */
SpmdSpec emit_declared_spec(const SemModel *model);

/* `hpdlc emit stash`: the model partitioned by its layout, every pipeline
 * chunk differentiated, and each chunk's cut and stash printed. Returns an
 * exit status (0, 1 when the layout does not partition the model). */
int emit_stash(Arena *arena, Diag *diag, const SemModel *model, const IrModule *global, FILE *out);

/* `hpdlc emit cuda`: pipeline stage `stage`'s training step under the
 * layout (built as the simulator builds a rank's program), fused, and the
 * CUDA back end's source for it printed. Returns an exit status (1 when the
 * layout does not build, 3 when the back end fails: its message names the
 * kernel). */
int emit_cuda(Arena *arena, Diag *diag, const char *path, const SemModel *model, int stage, int fusion, FILE *out);

#endif
