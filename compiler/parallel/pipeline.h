/* pipeline.h - splits a module into pipeline model chunks.
 *
 * Graph 0 must have the form `prologue; y = call Block x L; epilogue`:
 * the repeated blocks are what a pipeline divides. With p stages and v
 * virtual stages there are K = p * v chunks of L / K layers each; chunk c
 * runs on pipeline rank c % p (Megatron-LM's interleaved assignment).
 * Chunk 0 also runs the prologue (embeddings), chunk K-1 the epilogue (head
 * and loss). A chunk receives its input activation from chunk c-1 (RECV)
 * and sends its output to chunk c+1 (SEND); autodiff turns those into the
 * gradient transfers. The split is the caller's: plan_chunk_layers (plan.h)
 * balances the chunks' forward + backward time with the planner's prices of
 * the prologue, one layer and the epilogue, or splits the layers equally. */
#ifndef HPDL_PIPELINE_H
#define HPDL_PIPELINE_H

#include "diag.h"
#include "ir.h"

typedef struct {
  IrModule *m;       /* graphs 0..nchunks-1 are the chunks, then the blocks */
  int nchunks;
  int64_t *layers;   /* per chunk: how many layers it runs */
  int64_t *first;    /* per chunk: the index of its first layer */
} PipeResult;

/* Splits m into `chunks` chunks; chunk c runs layers[c] layers (each >= 1,
 * summing to the repeat count). layers NULL: the equal split, which needs
 * the layers to divide into `chunks`. NULL with an error in diag when the
 * model has no single top-level repeat or the split does not fit it.
 * chunks == 1 returns the module unchanged (wrapped). */
PipeResult *pipe_split(Arena *arena, Diag *diag, const IrModule *m, int64_t chunks, const int64_t *layers);

/* The layers of `repeat` blocks over `chunks` contiguous chunks (each >= 1)
 * that minimise the slowest chunk's time, when chunk c costs
 * n_c x t_layer, plus t_first for chunk 0 (the prologue) and t_last for
 * chunk K-1 (the epilogue). Exact: every layer costs the same, so adding
 * the layers one at a time to the chunk that stays cheapest (water filling)
 * reaches the optimum. Among equal costs the later chunk gets the layer: an
 * earlier pipeline rank keeps more micro-batches' activations in flight
 * under 1F1B. Equal prologue and epilogue costs of zero give the equal
 * split when the layers divide. Returns 0, or -1 when repeat < chunks. */
int pipe_balance(int64_t repeat, int64_t chunks, double t_first, double t_layer, double t_last, int64_t *out);

/* The repeat count of m's single top-level CALL (the layers a pipeline
 * splits), or 0 when it has none or several. */
int64_t pipe_repeat_count(const IrModule *m);

/* A module whose graph 0 is chunk c (the block graphs follow), ready for
 * autodiff: chunks before the last report a zero loss, since their output
 * feeds only a SEND, whose gradient arrives by RECV. */
IrModule *pipe_chunk_module(Arena *arena, const PipeResult *pr, int c);

#endif
