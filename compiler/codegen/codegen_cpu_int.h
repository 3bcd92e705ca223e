/* codegen_cpu_int.h - internals shared by the CPU back end's files:
 *   codegen_cpu.c         the target: LLVM setup, memory plan, graph entry
 *                         points (host code), optimisation, emission, link
 *   codegen_cpu_ir.c      IR helpers: loops, checks, math (exp, log, tanh)
 *   codegen_cpu_kernel.c  one LLVM function per fused kernel
 * Not a public header: only these files include it. */
#ifndef HPDL_CODEGEN_CPU_INT_H
#define HPDL_CODEGEN_CPU_INT_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <stdarg.h>

#include "codegen.h"
#include "nest.h"
#include "fuse.h"
#include "ir.h"

/* ---- checks around LLVM calls that can fail (llm.c's cudaCheck) ----
 * Each records LLVM's own message with the call and the source line, and
 * makes the enclosing function return `ret`. */
#define CG_CHECK_MSG(cg, ret, call_text, expr)                                                                         \
  do {                                                                                                                 \
    char *cg_msg_ = NULL;                                                                                              \
    if (expr) {                                                                                                        \
      cg_llvm_fail(cg, __FILE__, __LINE__, call_text, cg_msg_);                                                        \
      return ret;                                                                                                      \
    }                                                                                                                  \
    if (cg_msg_) LLVMDisposeMessage(cg_msg_);                                                                          \
  } while (0)

#define CG_CHECK_ERR(cg, ret, call_text, expr)                                                                         \
  do {                                                                                                                 \
    LLVMErrorRef cg_err_ = (expr);                                                                                     \
    if (cg_err_) {                                                                                                     \
      char *cg_m_ = LLVMGetErrorMessage(cg_err_);                                                                      \
      cg_fail(cg, "%s:%d: %s: %s", __FILE__, __LINE__, call_text, cg_m_);                                              \
      LLVMDisposeErrorMessage(cg_m_);                                                                                  \
      return ret;                                                                                                      \
    }                                                                                                                  \
  } while (0)

/* Calls that report failure by their result alone (no message to relay). */
#define CG_CHECK(cg, ret, call_text, ok)                                                                               \
  do {                                                                                                                 \
    if (!(ok)) {                                                                                                       \
      cg_fail(cg, "%s:%d: %s failed", __FILE__, __LINE__, call_text);                                                  \
      return ret;                                                                                                      \
    }                                                                                                                  \
  } while (0)

enum { CG_MAX_CARRY = 32 };

/* Per graph: the plan and the generated functions. */
typedef struct {
  int64_t *offset;  /* per node: workspace byte offset, -1 none */
  int64_t *stash;   /* per SAVE call node: its stash's offset, -1 none */
  int64_t *callws;  /* per CALL node: its callee's workspace offset, -1: after own_bytes */
  int *inplace_of;  /* per node: the input whose buffer a loop kernel writes it into, -1 */
  int64_t *scratch; /* per CALL kernel: its temporaries' offset (own plan), -1 none */
  int64_t *scratch_bytes;
  int64_t own_bytes;   /* this graph's values, stashes and call temporaries */
  int64_t total_bytes; /* own + the deepest call's total (the memory plan: its arena) */
  int *out_slot;       /* per node: the output slot it is computed into, -1 */
  int nplain;          /* outputs that are slots (gradients excluded) */
  LLVMValueRef fn;     /* internal: (ctx, table, ws, layer, args, outs, scratch) */
  LLVMValueRef entry;  /* hpd_graph_<name>(void **) */
  LLVMValueRef *kfn;   /* per kernel, NULL for units without code */
  /* per kernel: a GEMM or lookup backward whose result is a gradient output
   * and nothing else (fuse_grad_acc_output) also built adding into its output
   * (beta = 1; no zeroing): the host hands it the parameter's gradient slot;
   * else NULL */
  LLVMValueRef *kacc;
  char *acc_out; /* per node: its gradient is added in by its kernel (no add after the graph) */
  char sym[160];
  /* A step cut into forward and backward (IrGraph.fb_split): the host code
   * of each part (same signature as fn) and its entry <sym>_F / <sym>_B;
   * NULL when the graph is not cut or fusion mixed the parts. */
  LLVMValueRef part_fn[2], part_entry[2];
} CgGraph;

typedef struct CgCpu {
  const IrModule *m;
  const FuseResult *fr;
  CgOptions opt;
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTargetMachineRef tm;
  char *triple, *cpu, *features;
  /* types */
  LLVMTypeRef tvoid, ti1, ti8, ti16, ti32, ti64, tf32, tf64;
  LLVMTypeRef tp8, tpp8, tpf32, tpf64, tpi32, tpi64;
  LLVMTypeRef tctx, tpctx, tcoll[4], tpcoll[4];
  LLVMTypeRef tkern_entry; /* i32 (i8**) */
  LLVMTypeRef tspan;       /* void (hpd_ctx *, i32 graph, i32 kernel, i32 end): hpd_ctx.kernel_span */
  LLVMTypeRef trange;      /* i32 (i8 *env, i64 lo, i64 hi): a range of a parallel loop */
  LLVMTypeRef tgemm16;     /* hpd_ctx.gemm_bf16's function type */
  LLVMTypeRef tparallel;   /* i32 (hpd_ctx *, i64 n, i64 work, trange *, i8 *env): hpd_ctx.parallel */
  LLVMValueRef fn_acc_range; /* the gradient sum's range (codegen_cpu.c), made on first use */
  unsigned md_loop;
  /* helpers made on first use */
  LLVMValueRef fn_exp, fn_log, fn_tanh, fn_sgemm, fn_pow64, fn_cos64, fn_sin64;
  LLVMValueRef fn_memcpy, fn_memmove, fn_memset, fn_sqrt, fn_fabs, fn_floor, fn_trunc;
  CgGraph *graphs;
  int64_t kscratch; /* the kernels' scratch: one region after the entry graph's workspace */
  int generated;
  CgStats stats;
  char err[2048];
  int failed;
} CgCpu;

/* One kernel function being built. */
typedef struct {
  CgCpu *cg;
  int gi, kp;
  const IrGraph *g;
  const FuseGraph *fg;
  const FuseKernel *K;
  LLVMValueRef fn;
  LLVMValueRef ctxp, scratch, layer;
  LLVMValueRef *io;         /* i8* per input, then per output */
  const int *inplace_of;    /* per node (codegen_cpu.c's CgGraph) */
  LLVMValueRef status_fail; /* block-less: set via cg_kernel_fail */
  LLVMBasicBlockRef fail_bb;
  NestKernel nk;            /* the kernel as the nest builder (nest.h) sees it */
  /* A kernel whose rows run on the rank's threads (hpd_ctx.parallel) is
   * built as a body over a range of its partitioned loop: while the body is
   * built, part_lo / part_hi are its range parameters (units of part_unit
   * iterations of the loop part_where / part_axis names), else NULL. */
  int part_where, part_axis;
  int64_t part_unit;
  LLVMValueRef part_lo, part_hi;
  int accumulate; /* a GEMM adding its product into its output (beta = 1) */
} CgKern;

/* Which loop of a kernel body runs over the body's range (CgKern.part_where). */
enum { CG_PART_NONE, CG_PART_OUTER, CG_PART_SWEEP, CG_PART_TILE, CG_PART_COLUMN, CG_PART_ROWS };

/* ---- errors ---- */
void cg_fail(CgCpu *cg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_llvm_fail(CgCpu *cg, const char *file, int line, const char *call, char *msg);

/* ---- IR helpers (codegen_cpu_ir.c) ---- */
LLVMValueRef cg_i64(CgCpu *cg, int64_t v);
LLVMValueRef cg_i32(CgCpu *cg, int64_t v);
LLVMValueRef cg_f32(CgCpu *cg, double v);
LLVMValueRef cg_f64(CgCpu *cg, double v);
LLVMValueRef cg_add_function(CgCpu *cg, const char *name, LLVMTypeRef ret, LLVMTypeRef *params, int n, int internal);
void cg_fn_attr(CgCpu *cg, LLVMValueRef fn, const char *attr);
void cg_fn_str_attr(CgCpu *cg, LLVMValueRef fn, const char *key, const char *value);
void cg_param_attr(CgCpu *cg, LLVMValueRef fn, unsigned index, const char *attr);
LLVMValueRef cg_call(CgCpu *cg, LLVMValueRef fn, LLVMValueRef *args, int n, const char *name);
LLVMValueRef cg_gep(CgCpu *cg, LLVMTypeRef elem, LLVMValueRef ptr, LLVMValueRef idx, const char *name);
LLVMValueRef cg_byte_ptr(CgCpu *cg, LLVMValueRef base, LLVMValueRef offset_bytes, const char *name);
LLVMValueRef cg_ctx_field(CgCpu *cg, LLVMValueRef ctxp, int field, const char *name);
/* In function fn: if (rc != 0) return ret; (rc, ret: i32) */
void cg_return_if_failed(CgCpu *cg, LLVMValueRef fn, LLVMValueRef rc, LLVMValueRef ret);
LLVMValueRef cg_ctx_group(CgCpu *cg, LLVMValueRef ctxp, int field, int group); /* rank / size, i64 */
void cg_memcpy(CgCpu *cg, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef bytes);
void cg_memmove(CgCpu *cg, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef bytes);
void cg_memset0(CgCpu *cg, LLVMValueRef dst, LLVMValueRef bytes);
LLVMValueRef cg_global_string(CgCpu *cg, const char *s, const char *name);

/* hpd_ctx field numbers (codegen.h's struct) */
enum {
  CG_CTX_WORKSPACE,
  CG_CTX_SEED,
  CG_CTX_LAYER,
  CG_CTX_RANK,
  CG_CTX_SIZE,
  CG_CTX_COMM,
  CG_CTX_ALL_REDUCE,
  CG_CTX_ALL_GATHER,
  CG_CTX_SEND,
  CG_CTX_RECV,
  CG_CTX_ERROR,
  CG_CTX_EXTERNS,
  CG_CTX_CALL_EXTERN,
  CG_CTX_HOST_OP,
  CG_CTX_KERNEL_SPAN,
  CG_CTX_PARALLEL,
  CG_CTX_GEMM_BF16,
  CG_CTX_PARAM16,
  CG_CTX_GEMM_F32,
  CG_CTX_NFIELDS
};
/* Calls hpd_ctx.parallel(ctx, nunits, work, range, env8), or range(env8, 0,
 * nunits) when the runtime set no hook; returns the i32 status. */
LLVMValueRef cg_parallel(CgCpu *cg, LLVMValueRef ctxp, LLVMValueRef range, LLVMValueRef env8, LLVMValueRef nunits,
                         LLVMValueRef work);
/* i32 (hpd_ctx *, i32 index, i32 grad, i8 **bufs): hpd_ctx.call_extern */
LLVMTypeRef cg_extern_hook_type(CgCpu *cg);

/* Counted loops. cg_loop_open branches from the current block into the
 * loop's header and leaves the builder in the body; cg_loop_close ends the
 * body (the latch), and leaves the builder after the loop. Values carried
 * around the loop are phis (loop->phi), their final values come back in
 * out. A trip count that is not a positive constant is guarded. vec: mark
 * the loop for the vectoriser (llvm.loop.vectorize.enable, which also lets
 * it reorder floating-point reductions). */
typedef struct {
  LLVMBasicBlockRef pre, head, guard_exit;
  LLVMValueRef iv, n;
  int ncarry, guarded;
  LLVMValueRef phi[CG_MAX_CARRY], init[CG_MAX_CARRY];
} CgLoop;
void cg_loop_open(CgCpu *cg, CgLoop *l, LLVMValueRef n, int ncarry, const LLVMValueRef *init, const char *name);
void cg_loop_close(CgCpu *cg, CgLoop *l, const LLVMValueRef *next, int vec, LLVMValueRef *out);

/* fp32 math built from arithmetic (vectorisable; Cephes' polynomials). */
LLVMValueRef cg_exp(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_log(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_tanh(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_sqrt(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_fabs(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_trunc(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_sigmoid(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_select_gt(CgCpu *cg, LLVMValueRef a, LLVMValueRef b, LLVMValueRef t, LLVMValueRef f);
/* libm in double (rope's angles) */
LLVMValueRef cg_pow64(CgCpu *cg, LLVMValueRef x, LLVMValueRef y);
LLVMValueRef cg_cos64(CgCpu *cg, LLVMValueRef x);
LLVMValueRef cg_sin64(CgCpu *cg, LLVMValueRef x);
/* unary ops and their derivatives in fp32 (interp.c's unary_value / unary_deriv) */
LLVMValueRef cg_unary(CgCpu *cg, IrOp op, double p, LLVMValueRef x);
LLVMValueRef cg_unary_deriv(CgCpu *cg, IrOp op, double p, LLVMValueRef x);
LLVMValueRef cg_binary(CgCpu *cg, IrOp op, LLVMValueRef a, LLVMValueRef b);

/* ---- element types ---- */
int cg_dtype_ok(DType t);
LLVMTypeRef cg_elem_type(CgCpu *cg, DType t);
int64_t cg_elem_bytes(DType t);
LLVMValueRef cg_to_f32(CgCpu *cg, LLVMValueRef v, DType t);   /* a loaded element as f32 */
LLVMValueRef cg_from_f32(CgCpu *cg, LLVMValueRef v, DType t); /* f32 to a storable element */

/* ---- kernels (codegen_cpu_kernel.c) ---- */
/* Bytes of workspace scratch kernel p of graph gi needs while it runs. */
int64_t cg_kernel_scratch(CgCpu *cg, int gi, int kp);
/* Does kernel p of graph gi become a function? (leaves other than fills,
 * views and calls do not) */
int cg_kernel_has_code(const FuseGraph *fg, int kp);
/* Builds the kernel's function: i32 (ctx*, i8* scratch, i64 layer, i8* io...);
 * accumulate: a kernel that adds its result into its output ("<name>.acc"):
 * a GEMM with beta = 1, a lookup's backward without zeroing first. */
LLVMValueRef cg_kernel_build(CgCpu *cg, int gi, int kp, int accumulate);


/* A fused kernel's family in its symbol and the profile's kernel table:
 * fusion's kind, or "attention" for the attention ops and "conv" for the
 * convolutions and their gradients (compute-bound work, which the planner
 * prices with the GEMMs), "pool" for pooling. */
static inline const char *cg_kernel_family(const IrGraph *g, const FuseKernel *K) {
  for (int j = 0; j < K->nnodes; j++) {
    IrOp op = g->nodes[K->nodes[j]].op;
    if (op == IR_ATTENTION || op == IR_ATTENTION_BWD) return "attention";
    if (op == IR_CONV2D || op == IR_CONV2D_BWD_DATA || op == IR_CONV2D_BWD_FILTER) return "conv";
    if (op == IR_POOL2D || op == IR_POOL2D_BWD) return "pool";
  }
  return fuse_kind_name(K->kind);
}

#endif
