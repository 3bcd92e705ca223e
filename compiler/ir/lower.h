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

/* How a program is lowered (both 0: lower_model's). */
typedef struct {
  int priced;               /* lower_model_priced's expert buffers */
  /* attention(q, k, v) as its materialised chain (q k^T, scale, causal mask,
   * softmax, times v, with repeat_kv for grouped queries: the scores are a
   * value of the graph) instead of one ATTENTION op (flash attention): how
   * Megatron-LM 2021 ran, which published runs of the time measured */
  int materialize_attention;
  /* with materialize_attention: every attention as its full scores, windows
   * and sinks left out (the conventional count of model FLOPs, every
   * query-key pair: plan.c's model_flops_mb), not refused */
  int conventional_count;
} LowerOptions;
IrModule *lower_model_with(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch, const LowerOptions *o);

#endif
