/* codegen_cuda.h - the CUDA back end: CUDA C for every fused kernel
 * (docs/backend.md, "The CUDA back end"). Always built (it needs no CUDA to
 * generate source); use it through cg_backend("cuda"). */
#ifndef HPDL_CODEGEN_CUDA_H
#define HPDL_CODEGEN_CUDA_H

#include <stdint.h>
#include <stdio.h>

#include "codegen.h"
#include "ir.h"
#include "precision.h"

const CgBackend *cg_cuda_backend(void);

/* One launch of a generated kernel: what the host program needs to run it. */
typedef struct {
  char name[200];
  int graph, kernel, step; /* the fused kernel (fuse.h) and its step */
  const char *kind;        /* "loop", "row", "zero", "special", "attention", "conv", "gemm", "grouped", "host" */
  int64_t grid, block;     /* blocks (grid-stride beyond) and threads a block */
  double flops;            /* "attention", "conv": the arithmetic of this launch (profiles), else 0 */
  double bytes;            /* a kernel of one launch: its inputs read and outputs written once,
                            * the least DRAM traffic it can have (profiles: GB/s); else 0 */
  double kernel_bytes;     /* the first step of a kernel of several launches: the same
                            * least traffic for all of them (bench/cuda_traffic.py); else 0 */
  /* kind "gemm": a cuBLASLt matmul, row-major C[M, N] = alpha op(A) op(B)
   * over the kernel's io pointers (a, b, c: their io indices) */
  int gemm_a, gemm_b, gemm_c, trans_a, trans_b;
  int ab_bf16; /* A and B bf16 (CUDA_R_16BF), C fp32; else all fp32 */
  int c_bf16;  /* D bf16: the bias epilogue's sum rounded as it is written (FuseOptions.store16) */
  int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  double alpha;
  /* cuBLASLt's epilogue: NULL (none), "bias", "bias_relu", "bias_gelu":
   * D = act(alpha op(A) op(B) + bias[n]); the bias's io index, and aux's
   * (the pre-activation, GELU_AUX / RELU_AUX) or -1; or "bgrad_a" /
   * "bgrad_b": bias (an output) receives the sum over k of op(A) (m
   * values) or op(B) (n values), cuBLASLt's BGRADB / BGRADA */
  const char *epilogue;
  int bias, aux;
  /* the batch per axis (hpdl_emu_gemm's and devexec's form): the output's
   * batch axes bdims[0..batch_axes), matrix strides sa / sb per axis, and
   * the elements of one matrix of A and of B */
  int batch_axes;
  int64_t bdims[IR_MAX_RANK], sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  int64_t amat, bmat;
  /* kind "host": an extern's native function (core/extcall.h) that the host
   * program calls on host copies of the kernel's buffers: entry host_extern of
   * the module's externs, its gradient when host_grad; host_io: the io index of
   * each buffer in extcall's order (the arguments, then the result or, for the
   * gradient, the result's gradient and the arguments' gradients) */
  int host_extern, host_grad, nhost_io;
  int host_io[16];
  /* kind "grouped": GROUPED_MM (grouped 1) or GROUPED_MM_WGRAD (2), a GEMM an
   * expert over the rows of its run of ids (the io index grouped_ids, i32 [N]);
   * the gemm fields hold the product over all N rows at once (grouped 1: M =
   * N, B the experts' [E, K, N] or [E, N, K] with trans_b; grouped 2: K = N,
   * C the experts' [E, M, N]), which the host program cuts per run */
  int grouped, grouped_ids;
  int64_t experts;
} CgCudaLaunch;

/* The AUX_LOSS node of fused kernel kp (a special kernel whose loss the host
 * program adds up: kernels.json's "aux_node"), or -1. */
int cg_cuda_aux_node(const FuseGraph *fg, int kp);

/* Whether the attention of head sizes D, Dv runs on the tensor cores of GPU
 * arch ("sm_80"; NULL: sm_80, --arch's default): with h16, its kernels with
 * 16-bit operands, which read q, k and v in 16 bits as stored under 16-bit
 * activations (heads 16 .. 128); else the TF32 ones (16 .. 64), for fp32
 * (kernels/hpdl_attention_cfg.h). */
int cg_cuda_attention_tc(const char *arch, int64_t D, int64_t Dv, int h16);

/* precision.h's target for this back end on GPU arch (as above): its
 * attention's heads from cg_cuda_attention_tc's 16-bit kernels. */
PrecTarget cg_cuda_prec_target(const char *arch);

/* The launches of a generated module in execution order (per graph, per
 * fused kernel, its steps); what the host program runs. */
const CgCudaLaunch *cg_cuda_launches(const CgTarget *t, int *n);

/* Kernels of a generated module that are not CUDA C of ours: GEMMs (left
 * to cuBLASLt) and special kernels not generated yet. Returns their sum,
 * or -1 when generation failed for another reason (CgBackend.error). */
int cg_cuda_pending(const CgTarget *t, int *gemms, int *specials);

/* After emit: per launch its kernel, resources (registers, shared memory,
 * spills, from ptxas) and launch shape; `hpdlc compile --target cuda -v`. */
void cg_cuda_report(const CgTarget *t, FILE *out);

#endif
