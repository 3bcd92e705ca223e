/* lower.h - the checked model (sema) to the tensor IR.
 *
 * Layers are inlined; each `repeat N Block(...)` becomes a graph called N
 * times; the symbolic batch B is bound to the micro batch. Parameters get
 * their dotted source path as name ("blocks.{i}.attn.q_proj.weight"); a
 * weight used twice (tied embeddings) is one parameter. */
#ifndef HPDL_LOWER_H
#define HPDL_LOWER_H

#include "diag.h"
#include "ir.h"
#include "sema.h"

/* NULL with errors in diag when something cannot be lowered (a dimension
 * left symbolic, an extern call the compiler cannot yet emit). */
IrModule *lower_model(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch);

/* The program the planner prices: as lower_model, but a dropless expert
 * buffer (moe_dispatch with drop = false, room for all T tokens) is sized to
 * the load the layer expects its busiest expert to take (capacity_factor x
 * T top_k / E): what a dropless implementation's grouped GEMMs process, not
 * the worst case the compiled program must hold. */
IrModule *lower_model_priced(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch);

#endif
