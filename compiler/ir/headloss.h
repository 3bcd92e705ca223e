/* headloss.h - the language model's head fused with its loss
 * (parallel.fused_ce).
 *
 * A cross-entropy whose logits come from a GEMM read by nothing else,
 *   z = x @ W (W a [C, V] weight, or the transpose of a [V, C] table)
 *   loss = cross_entropy(z, t)
 * becomes
 *   nll = linear_ce(x, w, t)        (ir_ops.h: each row's loss, f32 [...])
 *   loss = reduce_mean(reshape(nll, [rows]))
 * so that no graph value holds the [rows, V] logits: a back end computes
 * them in blocks, in the forward and again in the backward (autodiff's
 * linear_ce_bwd / _bwd_w), which costs one more pass of the head's GEMM and
 * saves the logits' memory and their trips through it (Liger-Kernel's fused
 * linear cross-entropy). A vocabulary split over the tensor group is fused
 * by the partitioner itself (spmd.c's fused_vocab_ce: linear_lse per shard);
 * the shard's GEMM it leaves unread is dropped here. */
#ifndef HPDL_HEADLOSS_H
#define HPDL_HEADLOSS_H

#include "ir.h"

/* Rewrites every such pair in the module's graphs in place (dropping the
 * GEMM, and a transpose read only by it), and drops GEMMs, transposes and
 * reshapes nothing reads. Returns how many it fused, or -1 with *why when a
 * rewritten graph fails to type-check (a bug of ours). */
int headloss_fuse(IrModule *m, const char **why);

#endif
