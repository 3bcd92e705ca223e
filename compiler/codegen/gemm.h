/* gemm.h - a fused GEMM kernel as a BLAS call, independent of the library
 * that runs it (cblas_sgemm on the CPU, cuBLASLt on a GPU).
 *
 * The kernel's MATMUL reads its operands through the transposes of their
 * last two axes and the reshapes fusion folded in; a scale by a constant
 * becomes alpha; what follows (bias, activation) is the epilogue, a loop
 * nest over the output that reads the product back (nest.h). Row-major
 * throughout, as BLAS's CblasRowMajor: C[M, N] = alpha op(A)[M, K] op(B)[K, N]. */
#ifndef HPDL_GEMM_H
#define HPDL_GEMM_H

#include <stdint.h>

#include "nest.h"

typedef struct {
  int mem;   /* the buffer */
  int trans; /* op(X) = X^T */
  int rank;  /* the stored matrix batch's shape */
  int64_t dims[IR_MAX_RANK];
  int64_t rows, cols; /* its stored matrix: the leading dimension is cols */
} GemmOperand;

typedef struct {
  int matmul;         /* the MATMUL node */
  int product;        /* the node whose value the call produces (the matmul, or its scale) */
  int out;            /* the buffer the call writes: the first kernel output at or after product */
  GemmOperand a, b;
  int64_t M, N, K;
  double alpha;
  int batch_axes;     /* the output's batch axes (rank - 2) */
  int64_t nbatch;     /* matrices in the batch */
  /* one call of nbatch x M rows: B shared by every batch, A's batches contiguous */
  int flat;
  int epilogue;       /* nodes after product: a nest over the output (gemm_epilogue) */
  /* fuse.h's FUSE_EPI_BGRAD: the sum node over operand bgrad_side's K rows
   * (0: A, M sums; 1: B, N sums), which the library's epilogue writes; -1 */
  int bgrad, bgrad_side;
} GemmPlan;

/* Whether node id of k's GEMM kernel is its bias gradient's sum or a view on
 * the way to it (not part of the product's epilogue). */
int gemm_is_bgrad_node(const NestKernel *k, int id);

/* The plan of k's GEMM kernel. 0, or -1 after k->fail. */
int gemm_plan(const NestKernel *k, GemmPlan *p);

/* The epilogue nest (bias, activation, ...) reading the product back from
 * p->out; call only when p->epilogue. */
void gemm_epilogue(const NestKernel *k, const GemmPlan *p, Nest *N);

/* The offset, in matrices, of an operand's batch at flat output batch index
 * bi: its batch axes right-aligned to the output's, broadcast where 1. The
 * strides per output batch axis are written to stride[0..batch_axes). */
void gemm_batch_strides(const GemmPlan *p, const GemmOperand *o, int64_t *stride);

#endif
