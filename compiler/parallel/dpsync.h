/* dpsync.h - data parallelism as IR: the gradient synchronisation of a
 * step, and ZeRO's sharding of gradients and parameters over the
 * data-parallel group (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
 * Toward Training Trillion Parameter Models").
 *
 * Applied to each rank's chunk module (pipeline.h), the data-parallel
 * replicas then differ only in their data: every exchange between them is an
 * explicit collective over IRG_DP in the module.
 *
 *   zero 0, 1  dpsync_build appends `dp.sync`: each parameter gradient
 *              all-reduced (sum) over dp, then scaled by 1/dp (the mean over
 *              replicas is this explicit multiply). ZeRO-1 shards only the
 *              optimizer state, which is the optimizer's business: its
 *              gradients are those of zero 0.
 *   zero 2     the same graph with reduce-scatter: each copy of a gradient
 *              is flattened, zero-padded to a multiple of dp and
 *              reduce-scattered along that flat axis, so data-parallel rank d
 *              keeps values [d*s, (d+1)*s) of it (s = ceil(numel / dp)), then
 *              scaled by 1/dp.
 *   zero 3     dpsync_shard_params (before autodiff) makes every parameter
 *              such a flat piece: a PARAM node becomes
 *              param [s] -> all_gather(dp, partial-grad) [s*dp] -> slice
 *              (when padded) -> reshape to the tensor, at its use (inside the
 *              repeated block graphs for per-layer parameters). Autodiff turns
 *              the gather into a reduce-scatter of the gradient (autodiff.h),
 *              per micro-batch, so the accumulated gradients are pieces
 *              already; `dp.sync` only scales them by 1/dp.
 *
 * `dp.sync` runs once per step, after the micro-batches' gradients have
 * accumulated, not per micro-batch (except zero 3's reduce-scatters, which
 * are part of each backward). Its argument k is the accumulated gradient of
 * parameter param[k], copies first..first+copies-1 (the layers this chunk
 * runs) laid out as [copies, dims...] (just dims when the parameter is not
 * repeated); output k is the synchronised gradient: the same shape for zero
 * 0/1, [copies, s] (or [s]) pieces for zero 2/3. */
#ifndef HPDL_DPSYNC_H
#define HPDL_DPSYNC_H

#include <stdio.h>

#include "autodiff.h"
#include "diag.h"
#include "ir.h"

typedef struct {
  IrModule *m;     /* the module it was appended to */
  int graph;       /* dp.sync's index in the module */
  int zero;        /* 0..3 */
  int64_t dp;
  int nargs;       /* = its outputs */
  int *param;      /* per argument: the module parameter */
  int64_t *first;  /* the first copy (layer) passed */
  int64_t *copies; /* copies passed (1 when the parameter is not repeated) */
  int64_t *numel;  /* values per copy of the tensor before ZeRO pieces (the rank's tensor-parallel piece) */
  int64_t *piece;  /* values per copy of output k: numel (zero 0/1) or s (zero 2/3) */
} DpSync;

/* s: values per data-parallel rank of a flattened tensor of n values. */
int64_t dpsync_piece(int64_t n, int64_t dp);

/* ZeRO-3: a new module in `arena` whose parameters are flat pieces, read
 * through all_gather over dp where they are used (an expert shard: pieces
 * over the dp / ep ranks holding it, gathered over edp; ep 0 or 1: none).
 * NULL with an error in diag on an internal inconsistency. */
IrModule *dpsync_shard_params(Arena *arena, Diag *diag, const IrModule *m, int64_t dp, int64_t ep);

/* Appends dp.sync to the differentiated module ad->m for `zero` (0..3;
 * zero 3 expects dpsync_shard_params's module). Expert shards (split over
 * the expert group) are summed over the dp / ep ranks holding them (edp),
 * whose pieces they are at zero 2; ep 0 or 1: none. NULL with the reason in
 * *err. */
DpSync *dpsync_build(const AdResult *ad, int64_t dp, int zero, int64_t ep, const char **err);

/* dp.sync in the stable text form, then which gradient each argument is. */
void dpsync_print(const DpSync *s, FILE *out);

#endif
