/* pipeline.h - splits a module into pipeline model chunks.
 *
 * A pipeline divides a model's forward (graph 0) into units and gives each
 * of K = p * v chunks a contiguous run of them; chunk c runs on pipeline
 * rank c % p (Megatron-LM's interleaved assignment). The units are:
 *
 *  - by layers, when graph 0 has the form `prologue; y = call Block x L;
 *    epilogue` (one repeat, a transformer's blocks): the L layers. Chunk 0
 *    also runs the prologue (embeddings), chunk K-1 the epilogue (head and
 *    loss).
 *  - by cuts, when graph 0 has no repeat or several (a ResNet's stages,
 *    dense layers then MoE ones): the stretches of graph 0 between its cut
 *    points, the places where one value alone crosses (a block's output:
 *    inside a residual block both the branch and the shortcut cross). A
 *    repeat whose input alone crosses before it and whose output alone
 *    after it gives a unit per layer, so chunks can end inside it; any
 *    other repeat is one unit, whole.
 *
 * A chunk receives its input activation from chunk c-1 (RECV) and sends its
 * output to chunk c+1 (SEND); autodiff turns those into the gradient
 * transfers. What a chunk reads that depends only on parameters and inputs
 * (a transposed tied embedding, the labels) it computes itself, so only
 * that one activation crosses. The split is the caller's: plan_chunk_layers
 * (plan.h) balances the chunks' forward + backward time with the planner's
 * prices, or splits the layers equally. */
#ifndef HPDL_PIPELINE_H
#define HPDL_PIPELINE_H

#include "diag.h"
#include "ir.h"

typedef struct {
  IrModule *m;       /* graphs 0..nchunks-1 are the chunks, then the blocks */
  int nchunks;
  int by_cuts;       /* the units are graph 0's stretches between cut points, not layers */
  int64_t *layers;   /* per chunk: how many units (layers) it runs */
  int64_t *first;    /* per chunk: the index of its first unit (layer) */
} PipeResult;

/* The pipeline units of a module's graph 0 (see the top of this file). */
typedef struct {
  int by_cuts;      /* 0: the layers of the single repeat; 1: stretches between cut points */
  int64_t nunits;   /* layers, or stretches */
  int *start;       /* by cuts: unit u is graph 0's nodes [start[u], start[u + 1]); start[nunits] = nnodes */
  int *cross;       /* by cuts: cross[u] (u >= 1) the one value crossing into unit u; -1: the
                     * activation between two layers of call[u] */
  int *call;        /* by cuts: unit u is layer layer[u] of the repeat CALL node call[u], or -1 */
  int64_t *layer;
  char *free_node;  /* by cuts: a node that depends only on leaves (recomputed where it is read) */
} PipeUnits;

/* The units of m: by layers when graph 0 calls exactly one repeat, else by
 * cuts (nunits 1 when no value crosses alone anywhere). */
const PipeUnits *pipe_units(Arena *arena, const IrModule *m);

/* Splits m into `chunks` chunks; chunk c runs layers[c] units (each >= 1,
 * summing to pipe_units' count; by layers, the first and the last chunk may
 * run none: the embeddings alone, the head alone). layers NULL: the equal split, which needs
 * the units to be layers that divide into `chunks`. NULL with an error in
 * diag when the split does not fit the model. chunks == 1 returns the
 * module unchanged (wrapped). */
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

/* balance = ends: the prologue and the epilogue count as one layer each, so
 * every chunk runs (repeat + 2) / chunks units and the first and the last one
 * layer fewer (none at repeat + 2 = chunks: Llama 3's pipeline, Megatron-LM's
 * account_for_embedding_in_pipeline_split and ..._loss_...). 0, or -1 when
 * chunks does not divide repeat + 2. */
int pipe_split_ends(int64_t repeat, int64_t chunks, int64_t *out);

/* The units of weights w[0..n) over `chunks` contiguous chunks (each >= 1)
 * that minimise the heaviest chunk: the least bound a greedy packing meets,
 * found by bisection, and that packing. Returns 0, or -1 when n < chunks. */
int pipe_balance_units(const double *w, int64_t n, int64_t chunks, int64_t *out);

/* A module whose graph 0 is chunk c (the block graphs follow), ready for
 * autodiff: chunks before the last report a zero loss, since their output
 * feeds only a SEND, whose gradient arrives by RECV. */
IrModule *pipe_chunk_module(Arena *arena, const PipeResult *pr, int c);

#endif
