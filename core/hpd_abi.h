/* hpd_abi.h - the ABI of a compiled artifact: what the code a back end
 * emits (codegen.h) and the runtime that calls it agree on. Plain C, no
 * compiler types. docs/backend.md explains it with an example. */
#ifndef HPDL_HPD_ABI_H
#define HPDL_HPD_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ==== the artifact ABI ==== */

#define HPD_ABI_VERSION 8 /* 2: the extern hook; 3: the host-op hook; 4: the kernel-span hook and kernel table;
                             5: the parallel hook; 6: the bf16 GEMM hook; 7: the parameters' 16-bit copies;
                             8: the fp32 GEMM hook */

/* Per call of an entry point: what the generated code needs besides
 * tensors. The layout is fixed (the generated code reads it by offset). */
typedef struct hpd_ctx {
  void *workspace; /* the graph's hpd_graph_desc.workspace_bytes, 64-byte aligned */
  uint64_t seed;   /* the run's init seed: dropout masks (interp.c's streams) */
  int64_t layer;   /* the layer a repeated block's graph runs as, when called directly */
  int32_t rank[4]; /* this rank's index in each group (IrGroup order: dp, tp, pp, cp) */
  int32_t size[4]; /* the size of each group; 0 or 1: this rank alone */
  void *comm;      /* the runtime's communicator, passed back to the callbacks below */
  /* Collectives on fp32 data; 0 on success. op: 0 sum, 1 max. all_gather
   * writes size x n values, rank by rank. send / recv: to / from the rank
   * `offset` places along the group (+1 next pipeline stage, -1 previous). */
  int (*all_reduce)(void *comm, int group, int op, float *data, int64_t n);
  int (*all_gather)(void *comm, int group, const float *in, int64_t n, float *out);
  int (*send)(void *comm, int group, int offset, const float *data, int64_t n);
  int (*recv)(void *comm, int group, int offset, float *data, int64_t n);
  const char *error; /* set by the generated code when an entry point returns non-zero */
  /* Calls of `extern` native functions (IrModule.externs; docs/backend.md):
   * `externs` is the runtime's table of loaded functions, passed back to the
   * hook. grad 0: the forward, bufs = the arguments, then the result; grad 1:
   * the gradient function, bufs = the arguments, the result's gradient, then
   * the arguments' gradients concatenated (EXTERN_GRAD's layout; the hook
   * zeroes it). 0 on success, else non-zero with ctx->error set. */
  void *externs;
  int (*call_extern)(struct hpd_ctx *ctx, int32_t index, int32_t grad, void **bufs);
  /* Ops the runtime computes on the host for the generated code (the mixture
   * of experts' routing, dispatch and combine, the auxiliary loss and its
   * seed, the expert all-to-all: docs/backend.md): node `node` of graph
   * `graph` of the stage's IR (the .hir beside the library), bufs = its
   * inputs, then its output, each a whole tensor of the node's shape (f32, or
   * i32 indices). 0 on success, else non-zero with ctx->error set. */
  int (*host_op)(struct hpd_ctx *ctx, int32_t graph, int32_t node, void **bufs);
  /* hpdlrun --profile: when set, called before (end 0) and after (end 1)
   * each kernel of a graph: kernel `kernel` of hpd_graph_desc.kernels of
   * graph `graph`. NULL: no call (one load and branch a kernel). */
  void (*kernel_span)(struct hpd_ctx *ctx, int32_t graph, int32_t kernel, int32_t end);
  /* Runs range(env, lo, hi) over [0, n) cut into contiguous ranges, on the
   * rank's threads, and returns 0 or the first range's non-zero result (in
   * range order; ctx->error set by it). The generated code hands it the
   * loops whose iterations are independent (rows of a softmax, a norm or a
   * cross-entropy, blocks of an elementwise chain, of a gradient's sum); a
   * range computes the same values whichever thread runs it, so results do
   * not depend on the thread count. `work`: about how many values the whole
   * call reads and writes, for the hook's decision to stay on one thread.
   * NULL: the generated code calls range(env, 0, n) itself. */
  int32_t (*parallel)(struct hpd_ctx *ctx, int64_t n, int64_t work,
                      int32_t (*range)(void *env, int64_t lo, int64_t hi), void *env);
  /* A GEMM on bf16 operands (train { precision = bf16 } on the CPU target):
   * c[m, n] = alpha op(a) op(b) + beta c, row-major as cblas_sgemm, a and b
   * bf16, c fp32, trans 0 / 1 (core/numeric/gemm16.h does it). 0 on
   * success, else non-zero with ctx->error set. NULL: the generated code
   * fails the kernel, naming the hook. */
  int32_t (*gemm_bf16)(struct hpd_ctx *ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, float *c,
                       int64_t ldc);
  /* Per parameter p: its 16-bit copy (all `count` copies, layer-major, 2
   * bytes a value, the type of the module's 16-bit PARAM nodes of p), which
   * the runtime rounds from the fp32 parameter once per step before the
   * graphs run; NULL entries for parameters no node reads in 16 bits
   * (train { precision = bf16 }: the weights a GEMM multiplies). */
  void *const *param16;
  /* A GEMM on fp32 operands, c[m, n] = alpha op(a) op(b) + beta c as
   * gemm_bf16 with a and b fp32: the runtime cuts it into blocks fixed by
   * the shape and runs each as one single-threaded sgemm on the rank's
   * threads, so that its bits do not depend on the thread count (a threaded
   * BLAS's do: docs/runtime.md). 0 on success, else non-zero with
   * ctx->error set. NULL: the generated code calls cblas_sgemm itself. */
  int32_t (*gemm_f32)(struct hpd_ctx *ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                      int64_t ldc);
} hpd_ctx;

/* A fused kernel of a graph, for profiles: its symbol, its family (loop,
 * row, gemm, special, copy, leaf, comm, host), and its arithmetic and the
 * bytes it reads and writes (the IR's cost, compiler/ir/ir_cost.h). */
typedef struct {
  const char *name;
  const char *kind;
  double flops;
  double bytes;
} hpd_kernel_desc;

/* Every entry point takes one table of buffers:
 *   buffers[0]                                  hpd_ctx *
 *   buffers[HPD_BUF_INPUTS + i]                 model input i (IrModule.inputs), row-major,
 *                                               of its dtype (f32 float, i32 / i64 ints)
 *   buffers[HPD_BUF_INPUTS + ninputs + p]       parameter p, all `count` copies (layer-major)
 *   buffers[HPD_BUF_INPUTS + ninputs + np + p]  gradient of parameter p, same shape: a graph
 *                                               that autodiff made ADDS its gradient outputs
 *                                               here (copy `layer`), as interp's store does;
 *                                               NULL for parameters it does not touch
 *   then the graph's nargs arguments, then its noutputs outputs (the gradient
 *   outputs excluded), caller-allocated, each row-major of its node's shape.
 * An entry point returns 0, or non-zero with ctx->error set. */
enum { HPD_BUF_CTX = 0, HPD_BUF_INPUTS = 1 };

typedef int (*hpd_entry_fn)(void **buffers);

typedef struct {
  const char *name;        /* the IR graph's name: "forward", "blocks.grad" */
  hpd_entry_fn fn;         /* hpd_graph_<name, '.' as '_'> */
  int32_t nargs;           /* argument slots */
  int32_t noutputs;        /* output slots (gradients excluded) */
  int32_t ngrads;          /* gradient outputs accumulated into the grad slots */
  int32_t nbuffers;        /* the table's length */
  int64_t workspace_bytes; /* what ctx->workspace must hold for this graph (its calls included) */
  int32_t nkernels;        /* its fused kernels, indexed as kernel_span's */
  const hpd_kernel_desc *kernels;
} hpd_graph_desc;

typedef struct {
  int32_t abi_version; /* HPD_ABI_VERSION */
  int32_t ngraphs, ninputs, nparams;
  const hpd_graph_desc *graphs; /* in IrModule order */
  const char *target;           /* "x86_64-pc-linux-gnu icelake-client" */
} hpd_module_desc;

/* The one data symbol every artifact library exports. */
#define HPD_MODULE_SYMBOL "hpd_module"

#endif
