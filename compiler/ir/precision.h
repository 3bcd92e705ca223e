/* precision.h - mixed precision's storage (train { precision = bf16 | fp16 }):
 * after autodiff, the activations of a chunk's graphs and their gradients are
 * stored in 16 bits and computed in fp32 (every kernel loads, converts,
 * computes in fp32 and rounds what it stores), as Megatron-LM and PyTorch's
 * autocast keep activations; parameters, their gradients, the loss and every
 * reduction's statistics (a norm's mean and variance, a softmax's max and sum)
 * stay fp32, as do the values that cross into what reads fp32 only.
 *
 * Which values: a node whose value derives from the data (an input, a graph
 * argument) rather than from parameters and constants alone, of an op whose
 * kernels load and store any element type on both targets: elementwise ops
 * and the softmax family (so the CPU and CUDA targets round the same values);
 * shape ops keep their input's type. Under bf16 a GEMM's operands are bf16
 * (a cast of what is not stored so; a weight is read as a 16-bit PARAM node,
 * the copy the runtime rounds once per step; the logits' gradient is
 * stored in bf16 where it is made when only GEMMs read it), its
 * product fp32 (the CPU's hpd_ctx.gemm_bf16, cuBLASLt's CUDA_R_16BF), then
 * rounded to bf16 by a CAST where only kernels that load any type on both
 * targets (or bf16 GEMMs) read it and none adds a bias or scales it (the
 * backward's data gradients, as autocast's matmul returns bf16; on the CUDA
 * target the GEMM writes that bf16 D itself: fuse.c's store16); the same for
 * the attention's gradient [dq, dk, dv], which the CUDA target's 16-bit
 * attention kernels store in bf16 themselves. A
 * parameter's gradient is fp32 where it is made. fp16's GEMMs,
 * host ops (attention, convolution, MoE), collectives, extern calls, calls
 * of other graphs and the CUDA target's special kernels read fp32 (but its
 * tensor-core attention's q, k and v: their stored 16-bit type; its column
 * sums and cross-entropy read any type): a CAST is put
 * before them (one per value and side of the step's forward / backward cut,
 * so the stash keeps the 16-bit value); a cast changes no value. The block forward's
 * saved activations (its outputs after the first) stay 16-bit, and so do the
 * matching arguments of its backward graph: the per-layer stash is 16-bit.
 * Graph outputs otherwise are fp32 (the residual stream between blocks, the
 * loss, the parameters' gradients).
 *
 * The reference executor rounds each 16-bit node's fp64 result to fp32 and
 * then to the 16-bit type (interp.c), as the kernels store it. */
#ifndef HPDL_PRECISION_H
#define HPDL_PRECISION_H

#include "autodiff.h"
#include "ir.h"

/* The storage type of train.precision: DT_BF16, DT_F16, or DT_F32 (no
 * 16-bit storage: fp32, and fp8, which no back end runs). */
DType prec_storage(Precision p);

/* The target prec_apply stores for: its kernels read different types. NULL
 * or cuda 0: the CPU target. cuda 1: the CUDA target, whose special kernels
 * read and write fp32, but where attn16(D, Dv) says so (its tensor-core
 * attention for those head sizes, codegen_cuda.h), the attention's q, k and
 * v in the storage type: stored so where they are made (a GEMM's product,
 * a rotary embedding read by such attentions alone), else rounded to it. */
typedef struct {
  int cuda;
  int (*attn16)(int64_t D, int64_t Dv, void *arg);
  void *arg;
} PrecTarget;

/* Stores the activations of every graph of m (differentiated by ad) in
 * `storage` (DT_BF16 or DT_F16; any other type changes nothing), for target
 * t. Returns the number of values now stored in 16 bits; -1 with the reason
 * in *why when a graph does not verify after. */
int prec_apply(IrModule *m, const AdResult *ad, DType storage, const PrecTarget *t, const char **why);

/* The parameters of m some node reads in 16 bits (a GEMM's weight under
 * bf16 on the CPU target): the runtime keeps a 16-bit copy of each, rounded
 * from the fp32 parameter once per step (hpd_ctx.param16). */
int prec_params16(const IrModule *m);

#endif
