/* fuse.h - kernel fusion: each graph's nodes grouped into kernels, the unit
 * the code generators emit.
 *
 * Every node lands in exactly one kernel; kernels are listed in an order
 * that respects their dependencies (and so have no cycles). A kernel's nodes
 * run in ascending id order (the graph's SSA order). Its inputs are the
 * values it reads that other kernels produce; its outputs are the values it
 * produces that other kernels read, or that the graph returns.
 *
 * Kinds:
 *   leaf     INPUT, PARAM, ARG, CONST (nothing to run), FILL, IOTA (a fill)
 *   view     an unfused RESHAPE: an alias of its input's buffer, no code
 *   loop     elementwise ops over one iteration space
 *   row      elementwise ops and reductions over one reduced axis group of
 *            one iteration space (a layernorm, a softmax): one pass per row,
 *            as many sweeps of the row as its reductions need
 *   gemm     one MATMUL for BLAS / cuBLAS, with transposes of its operands'
 *            last two axes and reshapes folded in as layouts, and an
 *            epilogue (scale, bias, activation) where cuBLASLt has one
 *   copy     a materialised shape op (transpose, slice, pad, concat, ...)
 *   special  an op with a kernel of its own: embedding (gather) and its
 *            backward (scatter-add), rope, cross-entropy and its backward,
 *            repeat_kv_bwd, a multi-group sum_to
 *   comm     a collective or transfer
 *   call     a CALL of another graph (fused on its own)
 * The rules are written out at the top of fuse.c. */
#ifndef HPDL_FUSE_H
#define HPDL_FUSE_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "ir.h"
#include "ir_cost.h"

typedef enum {
  FUSE_LEAF,
  FUSE_VIEW,
  FUSE_LOOP,
  FUSE_ROW,
  FUSE_GEMM,
  FUSE_COPY,
  FUSE_SPECIAL,
  FUSE_COMM,
  FUSE_CALL,
  FUSE_NKINDS
} FuseKind;

/* GEMM epilogue steps, applied in this order (cuBLASLt: D = act(alpha A B + bias)).
 * FUSE_EPI_BGRAD, alone: the kernel also sums one operand over the product's
 * reduction (a bias gradient, cuBLASLt's BGRADA / BGRADB; FuseOptions). */
enum { FUSE_EPI_SCALE = 1, FUSE_EPI_BIAS = 2, FUSE_EPI_ACT = 4, FUSE_EPI_BGRAD = 8, FUSE_EPI_CAST = 16 };

typedef struct {
  FuseKind kind;
  int *nodes;   /* ascending node ids */
  int nnodes;
  int *inputs;  /* ascending ids of values produced by other kernels */
  int ninputs;
  int *outputs; /* ascending ids of values read by other kernels or returned */
  int noutputs;
  /* loop / row: the iteration space (the largest shape in the kernel); row:
   * the reduced axes [red_lo, red_hi) of it. */
  int rank;
  int64_t dims[IR_MAX_RANK];
  int red_lo, red_hi;
  /* gemm: FUSE_EPI_* flags and the activation (IR_RELU / IR_GELU); with
   * FUSE_EPI_BGRAD the reduction node of the bias gradient, else -1 */
  int epilogue;
  IrOp act;
  int bgrad;
  /* Work of one execution: FLOPs of its nodes (a call: its graph's x repeat);
   * bytes of the values crossing its boundary (an input read through a
   * slice counts the slice; scalar constants 0). */
  double flops, bytes_read, bytes_written;
} FuseKernel;

typedef struct {
  const IrGraph *graph;
  FuseKernel *kernels; /* in execution order */
  int nkernels;
  int *kernel_of;      /* node id -> index into kernels */
  /* Totals of one execution of the graph (its CALLs included). */
  double flops, bytes_read, bytes_written;
} FuseGraph;

typedef struct {
  const IrModule *module;
  FuseGraph *graphs;   /* one per module graph, same order */
  int ngraphs;
} FuseResult;

const char *fuse_kind_name(FuseKind k);

/* What a back end's GEMM library can take on beyond rule 4's epilogues. */
typedef struct {
  /* rule 8: a lone bias-gradient reduction (a sum over the rows of a GEMM
   * operand stored [K, X], the product's reduction) joins that GEMM, as
   * cuBLASLt's BGRADA / BGRADB epilogues compute it (the CUDA back end),
   * over fp32 or bf16 operands */
  int bias_grad;
  /* rule 4: a bias ADD stored in bf16 over a product of bf16 operands
   * (train { precision = bf16 }) joins its GEMM as the last step: the
   * library adds in fp32 and rounds as it writes D (cuBLASLt's
   * CUDA_R_16BF D with an fp32 bias, the CUDA back end) */
  int store16;
  /* rule 6: a cross-entropy's backward joins its forward's special kernel,
   * which computes the loss and the logits' gradient in one pass over the
   * logits (the CUDA back end); not in a pipeline's step */
  int ce_pair;
  /* fusion off (`--fusion off`): no computation is grouped - every
   * elementwise op and every reduction is a loop or row kernel of its own,
   * no GEMM epilogue but store16's rounding cast, no bias gradient in its
   * GEMM (rule 8), no siblings (rule 9), no cross-entropy pair - as
   * PyTorch's eager mode runs a program op by op (each an ATen kernel,
   * cuBLAS writing its 16-bit product itself). Shape ops still fold as
   * rule 5 says: eager kernels read strided views too. */
  int eager;
} FuseOptions;

/* What the CUDA back end takes on: bias_grad, store16 and ce_pair. */
extern const FuseOptions FUSE_CUDA_OPTIONS;
/* The options of a back end (cuda: FUSE_CUDA_OPTIONS's library, else the
 * CPU's: none) with fusion on or off; NULL for the CPU's fused default. */
const FuseOptions *fuse_options(int cuda, int fusion);

/* Fuses every graph of a verified module; everything lives in `arena`.
 * fuse_module_opts with NULL options is fuse_module (the CPU back end's). */
FuseResult *fuse_module(Arena *arena, const IrModule *m);
FuseResult *fuse_module_opts(Arena *arena, const IrModule *m, const FuseOptions *opts);

/* A cache of fused graphs by content, for a caller that fuses many modules
 * sharing graphs (the planner's search builds a program per layout key, and
 * keys differing only in the recomputation policy or the micro batch keep
 * many graphs alike). A graph's content is everything fusion reads: its
 * nodes' ops, types, shapes, inputs and attributes, its outputs and its
 * forward/backward cut, its callees' content and the options; it is known
 * by a 128-bit hash of these. */
typedef struct FuseCache FuseCache;
FuseCache *fuse_cache_new(void);
void fuse_cache_free(FuseCache *cache);
/* Graphs fused and graphs found in the cache so far. */
void fuse_cache_counts(const FuseCache *cache, int64_t *fused, int64_t *found);
/* fuse_module_opts through a cache (NULL: none): a graph whose content was
 * fused before takes that result (the work figures of its CALL kernels taken
 * from this module's callees, whose content is not the graph's); its
 * kernels live in the cache and stay valid until fuse_cache_free (the
 * FuseResult and FuseGraph structs, and a calling graph's kernels, live in
 * `arena`). Results are read-only. */
FuseResult *fuse_module_cached(Arena *arena, const IrModule *m, const FuseOptions *opts, FuseCache *cache);
/* The same for graph `root` and the graphs it calls (directly or not) only;
 * the others' FuseGraph is left empty (graph NULL, no kernels). For a
 * reader of one graph: the planner prices a training step, and fusing the
 * forward graphs it no longer calls was a sixth of its fusion. */
FuseResult *fuse_module_reachable(Arena *arena, const IrModule *m, const FuseOptions *opts, FuseCache *cache, int root);

/* FuseOptions.store16: the forward attention's output as a projection reads it,
 * o = the packed [o, lse]'s first Dv columns, transposed [B, H, T, Dv] ->
 * [B, T, H, Dv] and cast to q's 16-bit type, each the one reader of the last:
 * node `id` (the slice, the transpose or the cast) belongs to such a chain of the
 * ATTENTION whose node the result is, -1 where not. The three join the
 * attention's special kernel, whose 16-bit kernels write the cast's value as
 * they write o (no copy of o, no transposing pass). */
int fuse_attn_out16(const IrGraph *g, int id);

/* FuseOptions.store16: an ATTENTION_BWD's 16-bit gradient (its cast, try_special_cast)
 * read only as the projections read it: the flat [dq, dk, dv] sliced into its three
 * parts, each reshaped to [B, H, T, D] (dk, dv: [B, Hk, S, D]) and transposed to
 * [B, T, H, D], each the one reader of the last. Node `id` (the cast, a slice, a
 * reshape or a transpose) belongs to such a chain of the ATTENTION_BWD whose node the
 * result is, -1 where not. They join the attention's kernel, whose 16-bit kernels
 * write the three transposed gradients themselves (no flat gradient, no copies). */
int fuse_attn_grad16(const IrGraph *g, int id);

/* FuseOptions.store16: the output's gradient an ATTENTION_BWD with 16-bit q reads,
 * [B, T, H, Dv] transposed to [B, H, T, Dv] and padded with a zero last column (the
 * packed output's dlse), each the one reader of the last: node `id` (the transpose or
 * the pad) belongs to such a chain of the ATTENTION_BWD whose node the result is, -1
 * where not. The two join the attention's kernel, whose 16-bit kernels read the
 * gradient as the projection made it (no transposing, padding copy). */
int fuse_attn_dout(const IrGraph *g, int id);

/* FuseOptions.store16: the operands of an ATTENTION or ATTENTION_BWD with 16-bit q read
 * as the projections made them: q, k and v each the heads' transpose of a value
 * [B, T, H, D] ([B, S, Hk, D]) to [B, H, T, D], read by the attention alone (autodiff's
 * attention_operand_views makes the backward's again from the saved projection). Node
 * `id` (one of the three transposes) belongs to such an attention, whose node the result
 * is, -1 where not. They join its kernel, whose 16-bit kernels read the heads in place
 * (no transposing copies). */
int fuse_attn_qkv(const IrGraph *g, int id);

/* A GEMM kernel's bias-gradient operand: 0 (A, the sum has M elements) or
 * 1 (B, N elements) when kernel kp holds FUSE_EPI_BGRAD, else -1. */
int fuse_bgrad_side(const FuseGraph *fg, int kp);

/* Checks a result: every node in exactly one kernel, nodes ascending within
 * a kernel, every input of a node produced in an earlier kernel or earlier
 * in its own (so no cycles between kernels), inputs and outputs equal to the
 * values crossing the boundaries, one MATMUL per gemm, row-consistent
 * iteration spaces in loop and row kernels, index maps that read memory.
 * Returns the number of problems, each printed to `out` when not NULL. */
int fuse_check(const FuseResult *r, FILE *out);

/* Stable text form (the goldens in tests/fuse compare it): per graph, its kernels
 * in execution order, each with its kind (gemm with its epilogue, row with
 * its reduced axes, the iteration space), its nodes, its inputs and outputs
 * and its work; the last line counts kernels by kind and sums the work,
 * beside the unfused traffic (ircost_graph) for comparison:
 *   graph blocks (args 1, count 2): 16 kernels, 20 leaves and views {
 *     k0 leaf [%0 arg #0] -> (%0)
 *     k4 row[2] f32[8, 64, 64] [%1 reduce_mean, %2 sub, ...] (%0, %5, %9, %11) -> (%12)  flops=231424 read=131584 write=131072
 *     k7 gemm+bias f32[8, 64, 64] [%14 matmul, %16 add] (%12, %13, %15) -> (%16)  flops=...
 *   } leaf 20, view 0, loop 1, ...; flops=... read=... write=... (unfused read=... write=...) */
void fuse_print(const FuseResult *r, FILE *out);
void fuse_print_graph(const FuseResult *r, int graph, FILE *out);

/* Kernels of a kind in graph `graph` (a test and summary helper). */
int fuse_count(const FuseResult *r, int graph, FuseKind kind);

/* A pipeline step's halves (IrGraph.fb_split): the part of kernel p, 1
 * (backward) when any of its nodes is at or after the cut, else 0; and
 * whether the step's kernels run as two parts - every forward kernel
 * before every backward one in fusion order, and the activation's
 * transfers (toward the next chunk) in the forward part. Both back ends
 * cut there (the CPU's _F / _B entries, the CUDA host program's halves). */
int fuse_kernel_part(const FuseGraph *fg, int p);
int fuse_can_cut(const FuseGraph *fg);

/* The gradient output a kernel can add into the parameter's gradient slot
 * itself (the CPU back end's `.acc` kernels): a GEMM's product with no
 * epilogue, or a lookup's backward (embedding_bwd, which scatters its rows
 * there), or the fused head's weight gradient (linear_ce_bwd_w, alone or in
 * its pair) is the kernel's one output (dx beside it in the pair), an fp32 gradient output of an fp32
 * parameter that no other node reads nor another output repeats, and the
 * kernel does not run in a cut step's forward part (which ends before the
 * gradients are added). -1 otherwise. Such a value needs no buffer of its
 * own (memplan.h's grad_into_slots). */
int fuse_grad_acc_output(const FuseGraph *fg, const IrModule *m, int kp);

/* Whether kernel kp is the fused head's gradient pair (LINEAR_CE_BWD and
 * LINEAR_CE_BWD_W of the same inputs, rule 6): one pass over the logits
 * makes both outputs. */
int fuse_linear_ce_pair(const FuseGraph *fg, int kp);

/* Whether kernel kp is a cross-entropy with its backward (CROSS_ENTROPY and
 * CROSS_ENTROPY_BWD of the same logits, FuseOptions.ce_pair): one pass over
 * the logits makes the loss and their gradient. */
int fuse_ce_pair(const FuseGraph *fg, int kp);

#endif
