/* spmd.h - SPMD partitioning of a forward module over tensor, sequence and
 * context parallelism.
 *
 * The global forward (one data-parallel replica, one pipeline) becomes the
 * program every rank of a tensor x context group runs on its shards: local
 * shapes, sharded parameters, and explicit collectives naming their group.
 * Every value carries a sharding per group: replicated, split along one
 * axis, or partial (a sum still to be taken). Ops propagate shardings and
 * conversions are inserted where an op needs another one:
 *
 *   partial -> replicated   ALL_REDUCE          (Megatron's g)
 *   partial -> split        REDUCE_SCATTER      (sequence parallelism)
 *   split   -> replicated   ALL_GATHER
 *   replicated -> split     SHARD_SLICE         (take this rank's chunk)
 *   replicated, consumed by an op whose output is split or partial:
 *                           COPY_TO_GROUP       (Megatron's f: identity
 *                                                forward, all-reduce backward)
 *
 * Differentiating the partitioned program then gives the right backward
 * collectives by the ops' gradient rules (autodiff.c). Conventions: the
 * gradient of a replicated value is the full gradient on every rank; of a
 * split value, this rank's chunk. Megatron-LM's column/row rule
 * (Shoeybi et al. 2019) falls out of the matmul rule below; sequence
 * parallelism follows Korthikanti et al. 2022; context parallelism gathers
 * K and V over the context group with a load-balanced ("zigzag") sequence
 * layout, each rank holding chunks r and 2c-1-r of 2c (as Llama 3 does). */
#ifndef HPDL_SPMD_H
#define HPDL_SPMD_H

#include "diag.h"
#include "ir.h"

typedef struct {
  int64_t tp, cp;   /* tensor and context group sizes */
  int sp;           /* sequence parallelism over the tensor group */
  int64_t seq_len;  /* the global sequence length (axis 1 of activations) */
  int64_t ep;       /* expert parallelism (0 or 1: none): experts split over ep data-parallel ranks */
  int64_t vocab_pad; /* > 0: a vocab-split table whose rows tensor does not divide is padded to a
                        multiple of vocab_pad x tensor (Megatron-LM's make-vocab-size-divisible-by),
                        the padded rows zero and their logits masked before the cross-entropy */
  int fused_ce;     /* the head's GEMM and its cross-entropy as one op, the logits never stored
                       (headloss.h; a vocabulary split over the tensor group is left unfused) */
  int ep_fold;      /* MoE parallel folding: the experts whole, the expert group's ep members
                       tensor x (ep / tp) data-parallel ranks; the layers' sequences chunked
                       over the tensor group first (moepack.h, moe_fold_sequences) */
  int cp_ring;      /* parallel.cp_comm = ring: attention over each block of keys and values as
                       it comes around the context group, the blocks' outputs merged by their
                       log-sum-exp; else (allgather) all blocks first, one attention */
} SpmdSpec;

/* A new module in `arena` with the rank-local program; NULL with an error
 * in diag when a shape does not divide. */
IrModule *spmd_partition(Arena *arena, Diag *diag, const IrModule *global, const SpmdSpec *spec);

#endif
