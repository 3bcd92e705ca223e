/* sim.h - runs one training step of a partitioned program on simulated
 * ranks, one thread per rank, in fp64: the oracle for layout equivalence.
 *
 * The model is lowered, partitioned over tensor / sequence / context
 * parallelism (spmd.h), split into pipeline chunks (pipeline.h), and each
 * chunk differentiated (autodiff.h). Every rank runs its chunk's step over
 * its micro-batches with the reference executor (interp.h); collectives
 * rendezvous between threads, pipeline transfers go through mailboxes.
 * Data parallelism is in the IR too (dpsync.h): after its micro-batches
 * each rank runs the chunk's dp.sync graph, whose all-reduce or
 * reduce-scatter over the data-parallel group rendezvous like the others
 * (with ZeRO-3 the parameters are pieces gathered at their use, and the
 * backward reduce-scatters). The synchronised gradients - whole, or the
 * pieces each data-parallel rank keeps under ZeRO-2/3, put side by side
 * here - are assembled into the logical (unsharded) parameters, so any two
 * layouts can be compared number by number. Each pipeline rank (holding one
 * chunk, or several with virtual stages) executes its instruction list of
 * the schedule (schedule.h): the forward part of a chunk's step for a
 * micro-batch, the backward part later, with a stash per micro-batch in
 * flight (interp.h: InterpFrame); transfers are named by (kind, chunk,
 * micro-batch). */
#ifndef HPDL_SIM_H
#define HPDL_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "autodiff.h"
#include "diag.h"
#include "ir.h"
#include "precision.h"
#include "sema.h"

typedef struct {
  int64_t dp, tp, pp, cp, vpp;
  int sp;
  Recompute recompute;
  int64_t micro_batch; /* per data-parallel rank */
  int64_t num_micro;   /* micro-batches per replica per step */
  int zero;            /* ZeRO stage 0..3 (dpsync.h) */
  /* The pipeline schedule each pipeline rank executes (schedule.h): GPipe
   * or 1F1B; with vpp > 1 always interleaved 1F1B. Where schedule.c rejects
   * the shape (interleaving needs num_micro % pp == 0), every micro-batch
   * runs through all chunks before the next starts. */
  Schedule schedule;
  int64_t ep; /* expert parallelism inside dp (0 or 1: none) */
  int materialize_attention; /* LowerOptions (lower.h): attention as its materialised chain */
  int64_t vocab_pad;         /* SpmdSpec.vocab_pad: 0 pads nothing */
  int fused_ce;              /* SpmdSpec.fused_ce */
  int ep_fold;               /* SpmdSpec.ep_fold: the expert group folded over the tensor group */
  int cp_ring;               /* SpmdSpec.cp_ring: attention a ring block at a time (cp_comm = ring) */
} SimLayout;

typedef struct {
  double loss;    /* mean over the global batch */
  int nparams;    /* of the lowered (global) module */
  const char **names;
  int64_t *numel; /* per parameter: values per copy x copies */
  double **grads; /* d loss / d parameter, logical layout, all copies */
  int nranks;
} SimResult;

/* inputs[i]: input i's values for the whole global batch, dp x num_micro x
 * micro_batch rows; replica d's micro-batch k is global micro-batch
 * k * dp + d. Returns 0, or -1 with a message in err. */
int sim_step(const SemModel *model, const SimLayout *layout, uint64_t seed, double *const *inputs, SimResult *out,
             char *err, size_t errlen);

void sim_result_free(SimResult *r);

/* ---- the per-rank program of a layout ---- */

typedef struct {
  IrModule *global;  /* the lowered model */
  IrModule *module;  /* pipeline chunk `chunk`'s module, differentiated */
  AdResult *ad;
  int chunk, nchunks;
} SimRankProgram;

/* The program one rank of chunk `chunk` runs, built as sim_step builds it:
 * lower at the layout's micro batch -> spmd_partition (tp, cp, sp) ->
 * pipe_split (pp x vpp chunks) -> the chunk's module (graph 0 the chunk, its
 * output a zero loss unless it is the last chunk) -> ad_build with the
 * layout's recompute policy -> under mixed precision (train.precision bf16
 * or fp16) the 16-bit storage of `target` (precision.h; NULL: the CPU
 * target's), so its memory plan and kernels are the artifact's. NULL with the reason in *err (errors of the
 * passes also go to diag). */
SimRankProgram *sim_rank_program(Arena *arena, Diag *diag, const SemModel *model, const SimLayout *layout, int chunk,
                                 const PrecTarget *target, const char **err);

#endif
