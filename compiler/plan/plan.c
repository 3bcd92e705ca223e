/* plan.c - the planner's engine: prices one layout (see plan.h).
 *
 * Pipeline of one evaluation:
 *   1. The program of (micro batch, tp, cp, sp, recompute) - a "key" - is
 *      lowered, partitioned and differentiated once, fused into kernels and
 *      priced kernel by kernel (price_kernel). The prices of a key are kept
 *      as parts: the prologue (embeddings), the epilogue (head and loss) and
 *      one layer of the repeated block, forward and backward, with the
 *      activations each saves and its peak of live memory.
 *   2. A layout's pipeline chunk is prologue? + n layers + epilogue?; with
 *      PLAN_FAST the chunk prices come from the parts, otherwise the program
 *      is really split into pp x virtual chunks (pipe_split), each distinct
 *      chunk differentiated and priced on its own (exact_chunks): the same
 *      program `hpdlc compile` emits. tests/unit/test_plan.c checks that the
 *      two agree.
 *   3. The schedule simulator (schedule.h) runs the chunks' forward and
 *      backward times to give the pipeline time, the bubble and the
 *      micro-batches in flight per rank; data-parallel synchronisation,
 *      ZeRO, the optimizer step and memory are added per rank, and the worst
 *      rank is reported.
 * docs/planner.md sections 9-14 give every formula with its source. */
#include "plan.h"
#include "xalloc.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "autodiff.h"
#include "cost.h"
#include "fuse.h"
#include "ir_cost.h"
#include "lower.h"
#include "moepack.h"
#include "memplan.h"
#include "pipeline.h"
#include "plan_internal.h"
#include "schedule.h"
#include "spmd.h"
#include "symdim.h"

/* ------------------------------------------------------------------ */
/* small helpers                                                       */

/* PlanCost is doubles only (plan_internal.h), added as one array, which the
 * compiler vectorises: field by field it was 3% of a search's instructions.
 * The count is every field's, so that a field of another type is caught here. */
enum { PLAN_COST_FIELDS = 7 + 3 * IRG_COUNT + 1 + 4 + 1 + 4 };
_Static_assert(sizeof(PlanCost) == PLAN_COST_FIELDS * sizeof(double), "PlanCost: doubles only (plan_cost_add)");

void plan_cost_add(PlanCost *a, const PlanCost *b, double times) {
  double *va = (double *)a;
  const double *vb = (const double *)b;
  for (int i = 0; i < PLAN_COST_FIELDS; i++) va[i] += vb[i] * times;
}

int plan_experts_routed_whole(const PlanCtx *c, const PlanLayout *L) {
  /* a layer that drops tokens (its capacity the whole sequence's) is routed
   * whole on every context rank (docs/compiler.md, its limit); a dropless one
   * routes each rank's own tokens, packed or over slots (spmd.c, cp_local_slots) */
  return c->experts > 0 && L->cp > 1 && c->moe_drops;
}

double plan_gemm_sustained(const CatDevice *dev) {
  return cost_gpu_generation(dev) == COST_GEN_AMPERE ? PLAN_GEMM_SUSTAINED_AMPERE : PLAN_GEMM_SUSTAINED;
}

static int prec_bytes(Precision p) { return p == PREC_FP32 ? 4 : 2; }

/* The precision of everything but the FP8 GEMMs: an FP8 run keeps
 * activations, attention and the other GEMMs in bf16 (Transformer Engine). */
static const char *prec_name(Precision p) {
  return p == PREC_FP32 ? "fp32" : p == PREC_FP16 ? "fp16" : "bf16";
}

/* Bytes of a value as the training precision stores it: floating-point
 * activations in the precision of the run (the IR is typed f32; mixed
 * precision keeps activations in 16 bits), integers as typed. */
static double value_bytes(const PlanCtx *c, const IrNode *n) {
  double e = sem_dtype_is_float(n->dtype) ? (double)c->act_bytes : (double)sem_dtype_bytes(n->dtype);
  return (double)ir_numel(n) * e;
}

/* ------------------------------------------------------------------ */
/* pricing of one module's graphs                                      */

typedef struct {
  int done;
  PlanCost cost;
  double peak;        /* peak of live bytes in one execution (arguments are the caller's) */
  double layer_saved; /* B.fwd: bytes one layer keeps for its backward (arguments + outputs 1..) */
} GMemo;

typedef struct {
  PlanCtx *pc;
  const IrModule *m;
  FuseResult *fr;
  GMemo *memo;
  char *bwd_block; /* per graph: 1 for a B.grad, whose nodes that do not depend on dy recompute */
  const CostLink *link; /* per IrGroup */
  const int64_t *gsize; /* per IrGroup */
  int in_block;  /* pricing a graph a CALL runs (a repeated block), not the step itself */
  int ring;      /* the program attends a ring block at a time (PlanKey.ring): its exchange under the attention */
  int causal;    /* a materialised attention (CAUSAL_MASK) is causal; an ATTENTION op carries its own flag */
} Pricer;

/* Per-graph analysis shared by pricing and the liveness walk. */
typedef struct {
  const IrGraph *g;
  const FuseGraph *fg;
  char *dep;       /* node depends on argument 0 (dy / the loss seed) */
  int *wgrad;      /* MATMUL node: batch folded into K (its SUM_TO consumer reduces the batch) */
  char *absorbed;  /* SUM_TO node folded into the GEMM before it */
  int *nuse;       /* consumers per node */
  int *last;       /* per node: last kernel reading it (alias roots) */
  int *alias;      /* view outputs: the node whose buffer they alias */
  char *is_out, *is_grad_out;
  char *kbwd;      /* per kernel: some node depends on argument 0 */
  char *kparam_bwd;/* per kernel (a PARAM leaf): read by a kernel in kbwd */
  char *kparam_fwd;/* per kernel (a PARAM leaf): read by a kernel not in kbwd */
  char *gradsink;  /* per node: a weight gradient or a partial sum of one (flows only into gradient outputs) */
  char *score;     /* per node: an attention score or probability ([.., s_q, s_k]) */
  char *kattn;     /* per kernel: part of the attention (writes a score, or a GEMM reading one) */
  char *kcp_wait;  /* per kernel: a context-parallel send whose receive no attention kernel precedes (its exchange waits whole) */
  char *gemm_gather; /* per node: a tensor-parallel ALL_GATHER that only GEMMs other than attention's read (FP8's gather) */
  int has_sbwd;    /* the graph differentiates a softmax of scores (an attention backward) */
  int attn_op;     /* the graph has ATTENTION ops (flash attention kernels of the back ends) */
} GInfo;

static void ginfo_free(GInfo *gi) {
  free(gi->dep);
  free(gi->wgrad);
  free(gi->absorbed);
  free(gi->nuse);
  free(gi->last);
  free(gi->alias);
  free(gi->is_out);
  free(gi->is_grad_out);
  free(gi->kbwd);
  free(gi->kparam_bwd);
  free(gi->kparam_fwd);
  free(gi->score);
  free(gi->kattn);
  free(gi->kcp_wait);
  free(gi->gemm_gather);
  free(gi->gradsink);
}

/* Attention scores of a graph: values of the shape of a batched
 * activation x activation MATMUL (both operands of rank >= 3) that a SOFTMAX
 * or SOFTMAX_BWD of the same shape also has: q k^T, the probabilities, their
 * gradients (docs/planner.md sec. 9.1). Returns a calloc'd mask (n nodes) or
 * NULL when the graph has none; *sbwd is set when a SOFTMAX_BWD is among them. */
static char *score_mask(const IrGraph *g, int *sbwd) {
  char *mask = NULL;
  if (sbwd) *sbwd = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *sm = &g->nodes[i];
    if ((sm->op != IR_SOFTMAX && sm->op != IR_SOFTMAX_BWD) || sm->rank < 3) continue;
    int batched = 0;
    for (int j = 0; j < g->nnodes && !batched; j++) {
      const IrNode *x = &g->nodes[j];
      if (x->op != IR_MATMUL || x->rank != sm->rank || g->nodes[x->in[0]].rank < 3 || g->nodes[x->in[1]].rank < 3) continue;
      batched = !memcmp(x->dims, sm->dims, sizeof(int64_t) * (size_t)sm->rank);
    }
    if (!batched) continue;
    if (!mask) mask = xalloc_calloc((size_t)g->nnodes, 1);
    if (sm->op == IR_SOFTMAX_BWD && sbwd) *sbwd = 1;
    for (int j = 0; j < g->nnodes; j++) {
      const IrNode *x = &g->nodes[j];
      if (x->rank == sm->rank && !memcmp(x->dims, sm->dims, sizeof(int64_t) * (size_t)sm->rank)) mask[j] = 1;
    }
  }
  return mask;
}

/* Whether gradient output q is its parameter's first (autodiff makes one per
 * gradient reaching a PARAM node: a tied table has two, one tensor to sync). */
static int first_grad_of_param(const IrGraph *g, int q) {
  for (int k = 0; k < q; k++)
    if (g->grad_params[k] == g->grad_params[q]) return 0;
  return 1;
}

static int read_by_fp8_gemms_only(const IrGraph *g, const IrReaders *rd, const char *score, int v, int depth);

/* fp8_gathers: mark gemm_gather (a block's graph priced under FP8, MXFP8 or
 * NVFP4); the mask is all zero otherwise */
static void ginfo_init(GInfo *gi, const IrGraph *g, const FuseGraph *fg, int fp8_gathers) {
  int n = g->nnodes, nk = fg->nkernels;
  /* every field starts cleared: the flags set below only where they hold
   * (attn_op, has_sbwd) were read uninitialised before (valgrind) */
  memset(gi, 0, sizeof *gi);
  gi->g = g;
  gi->fg = fg;
  gi->dep = xalloc_calloc((size_t)n, 1);
  gi->wgrad = xalloc_calloc((size_t)n, sizeof(int));
  gi->absorbed = xalloc_calloc((size_t)n, 1);
  gi->nuse = xalloc_calloc((size_t)n, sizeof(int));
  gi->last = xalloc_calloc((size_t)n, sizeof(int));
  gi->alias = xalloc_calloc((size_t)n, sizeof(int));
  gi->is_out = xalloc_calloc((size_t)n, 1);
  gi->is_grad_out = xalloc_calloc((size_t)n, 1);
  gi->kbwd = xalloc_calloc((size_t)nk, 1);
  gi->kparam_bwd = xalloc_calloc((size_t)nk, 1);
  gi->kparam_fwd = xalloc_calloc((size_t)nk, 1);
  for (int i = 0; i < n; i++) {
    const IrNode *x = &g->nodes[i];
    /* the backward starts at argument 0 (the loss seed of a step, dy of a
     * B.grad) and at a gradient received from the next pipeline chunk */
    if (x->op == IR_ARG && x->attr[0] == 0) gi->dep[i] = 1;
    if (x->op == IR_RECV && x->attr[0] == IRG_PP && x->attr[1] > 0) gi->dep[i] = 1;
    for (int k = 0; k < x->nin; k++) {
      gi->dep[i] |= gi->dep[x->in[k]];
      gi->nuse[x->in[k]]++;
    }
    gi->alias[i] = i;
    gi->last[i] = -1;
  }
  for (int k = 0; k < g->noutputs; k++) gi->is_out[g->outputs[k]] = 1;
  for (int k = 0; k < g->ngrad_params; k++) gi->is_grad_out[g->outputs[g->noutputs - g->ngrad_params + k]] = 1;
  /* A weight gradient: x^T dy per batch element, then summed over the batch.
   * cuBLAS computes it as one GEMM of depth batch x k writing [m, n], so the
   * batched [b, m, n] partial products never exist. Autodiff writes most of
   * them so already (x and dy reshaped to [batch x T, .], autodiff.c's
   * matmul_tn_batch_folded): those are marked 1, a weight's GEMM with
   * nothing left to fold; the SUM_TO form is what remains where it cannot. */
  for (int i = 0; i < n; i++) {
    const IrNode *x = &g->nodes[i];
    if (x->op == IR_MATMUL && x->rank == 2 && x->attr[0] && !x->attr[1]) {
      const IrNode *a = &g->nodes[x->in[0]], *b = &g->nodes[x->in[1]];
      if (a->op == IR_RESHAPE && b->op == IR_RESHAPE && g->nodes[a->in[0]].rank >= 3 && g->nodes[b->in[0]].rank >= 3)
        gi->wgrad[i] = 1;
      continue;
    }
    if (x->op != IR_SUM_TO || x->nin != 1) continue;
    const IrNode *mm = &g->nodes[x->in[0]];
    if (mm->op != IR_MATMUL || gi->nuse[x->in[0]] != 1 || mm->rank <= 2 || x->rank != 2) continue;
    if (x->dims[0] != mm->dims[mm->rank - 2] || x->dims[1] != mm->dims[mm->rank - 1]) continue;
    int64_t b = 1;
    for (int k = 0; k < mm->rank - 2; k++) b *= mm->dims[k];
    gi->wgrad[x->in[0]] = (int)(b > 0x7fffffff ? 0x7fffffff : b);
    gi->absorbed[i] = 1;
  }
  for (int k = 0; k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    for (int j = 0; j < K->nnodes; j++) gi->kbwd[k] |= gi->dep[K->nodes[j]];
    if (K->kind == FUSE_VIEW)
      for (int j = 0; j < K->noutputs; j++)
        if (K->ninputs > 0) gi->alias[K->outputs[j]] = gi->alias[K->inputs[0]];
  }
  for (int k = 0; k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    for (int j = 0; j < K->ninputs; j++) {
      int v = gi->alias[K->inputs[j]];
      if (gi->last[v] < k) gi->last[v] = k;
      int pk = fg->kernel_of[K->inputs[j]];
      if (fg->kernels[pk].kind == FUSE_LEAF) {
        if (gi->kbwd[k]) gi->kparam_bwd[pk] = 1;
        else gi->kparam_fwd[pk] = 1;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (gi->is_out[i]) gi->last[gi->alias[i]] = nk;
  /* weight gradients and their partial sums (a tied weight's two
   * contributions added, each maybe all-reduced first): a node is one when
   * it is a gradient output, or every consumer is an ADD or ALL_REDUCE that
   * is one. Consumers come after a node, so one pass from the end decides. */
  gi->gradsink = xalloc_calloc((size_t)(n > 0 ? n : 1), 1);
  {
    char *bad = xalloc_calloc((size_t)(n > 0 ? n : 1), 1);
    for (int j = n - 1; j >= 0; j--) {
      const IrNode *y = &g->nodes[j];
      gi->gradsink[j] = gi->is_grad_out[j] || (gi->nuse[j] > 0 && !bad[j] && !gi->is_out[j]);
      int passes = (y->op == IR_ADD || y->op == IR_ALL_REDUCE) && gi->gradsink[j];
      for (int q = 0; q < y->nin; q++)
        if (!passes) bad[y->in[q]] = 1;
    }
    free(bad);
  }
  gi->score = score_mask(g, &gi->has_sbwd);
  gi->kattn = xalloc_calloc((size_t)(nk > 0 ? nk : 1), 1);
  for (int k = 0; k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    for (int j = 0; j < K->nnodes; j++) {
      IrOp op = g->nodes[K->nodes[j]].op;
      if (op == IR_ATTENTION || op == IR_ATTENTION_BWD) gi->kattn[k] = gi->attn_op = 1;
    }
  }
  for (int k = 0; gi->score && k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *x = &g->nodes[K->nodes[j]];
      if (gi->score[K->nodes[j]]) gi->kattn[k] = 1;
      if (x->op == IR_MATMUL && (gi->score[x->in[0]] || gi->score[x->in[1]])) gi->kattn[k] = 1;
    }
  }
  /* A context-parallel exchange starts at its send and is waited for at its
   * receive, the oldest send's (runtime/comm_ring.c): it hides under the
   * attention kernels the program runs between the two, and waits whole
   * where there are none (a backward receiving the blocks again, the
   * gathered program's sends back to back) */
  gi->kcp_wait = xalloc_calloc((size_t)(nk > 0 ? nk : 1), 1);
  int *sends = xalloc_calloc((size_t)n + 1, sizeof(int)), *attn_at = xalloc_calloc((size_t)n + 1, sizeof(int));
  int head = 0, tail = 0, nattn = 0;
  for (int k = 0; k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    for (int j = 0; j < K->nnodes && K->kind == FUSE_COMM; j++) {
      const IrNode *x = &g->nodes[K->nodes[j]];
      if (x->attr[0] != IRG_CP) continue;
      if (x->op == IR_SEND) attn_at[tail] = nattn, sends[tail++] = k;
      else if (x->op == IR_RECV && head < tail) {
        if (attn_at[head] == nattn) gi->kcp_wait[sends[head]] = 1;
        head++;
      }
    }
    nattn += gi->kattn[k];
  }
  free(sends);
  free(attn_at);
  /* Sequence parallelism's gathers of a GEMM operand (the norm's output
   * before QKV and the MLP's first GEMM; the gradient before the row-parallel
   * GEMMs' input and weight gradients): under FP8 Transformer Engine casts
   * the local chunk and gathers the FP8 copy (price_comm) */
  gi->gemm_gather = xalloc_calloc((size_t)(n > 0 ? n : 1), 1);
  if (!fp8_gathers) return;
  Arena *ra = arena_new();
  IrReaders rd = ir_readers(g->nodes, n, ra);
  for (int i = 0; i < n; i++)
    if (g->nodes[i].op == IR_ALL_GATHER && g->nodes[i].attr[0] == IRG_TP)
      gi->gemm_gather[i] = (char)read_by_fp8_gemms_only(g, &rd, gi->score, i, 0);
  arena_free(ra);
}

static double callee_saved_layer(Pricer *P, int graph);
static const GMemo *price_graph(Pricer *P, int graph);

/* Bytes a kernel's output value occupies while live. */
static double kernel_out_bytes(Pricer *P, const GInfo *gi, const FuseKernel *K, int v) {
  const IrNode *x = &gi->g->nodes[v];
  if (K->kind == FUSE_VIEW || gi->is_grad_out[v]) return 0;
  if (K->kind == FUSE_LEAF && x->op != IR_FILL && x->op != IR_IOTA) return 0;
  if (P->pc->flash && gi->score && gi->score[v]) return 0; /* flash attention keeps scores on chip */
  double b = value_bytes(P->pc, x);
  if (x->op == IR_CALL && x->attr[2] == IR_CALL_SAVE) b += (double)x->attr[1] * callee_saved_layer(P, (int)x->attr[0]);
  return b;
}

/* The share of a causal attention's score blocks a tiled kernel computes:
 * the blocks below the diagonal and the diagonal ones, whole
 * ((n + 1) / 2n of n x n blocks of COST_GEMM_TILE rows). */
static double causal_fraction(double sk) {
  double nb = ceil(sk / COST_GEMM_TILE);
  return nb > 1 ? (nb + 1) / (2 * nb) : 1;
}

/* The share of the score blocks over sk keys a tiled kernel computes: all,
 * the causal share, or under a sliding window of `window` keys (> 0) at most
 * the band's blocks and the diagonal one a row tile. */
static double score_share(int causal, double sk, double window) {
  double frac = causal ? causal_fraction(sk) : 1;
  if (window > 0 && window < sk) {
    double band = (ceil(window / COST_GEMM_TILE) + 1) / ceil(sk / COST_GEMM_TILE);
    if (band < frac) frac = band;
  }
  return frac;
}

/* A memory-bound kernel: the roofline with the vector rate for its
 * arithmetic (elementwise math runs on the CUDA cores, not the tensor cores). */
static double mem_kernel_time(const PlanCtx *c, double flops, double bytes) {
  const char *pn = cat_peak_flops(&c->dev, "fp32") > 0 ? "fp32" : prec_name(c->prec);
  return cost_op_time_s(flops, bytes, &c->dev, pn, 1.0) + PLAN_KERNEL_OVERHEAD_S;
}

/* One GEMM of a flash attention (docs/planner.md sec. 9.1): a kernel that
 * writes scores (q k^T, dO v^T) or reads them (P v, its gradients). The
 * scores stay on chip, so only its arithmetic counts: the computed share of
 * its FLOPs (score_share) at the efficiency of an output tile of
 * [s_q-block x d] whose mainloop runs over the keys (cost_flash_efficiency). */
static double flash_gemm_time(Pricer *P, double batch, double M, double N, double Kd, int writes_score, int causal,
                              double window, double *flops_sum) {
  /* score shape [.., s_q, s_k]: written (M = s_q, N = s_k, K = d) or read
   * (P v: K = s_k, N = d; P^T dO and dS^T q: M = s_k, K = s_q) */
  double d = writes_score ? Kd : N;
  double sk = writes_score ? N : Kd;
  double frac = score_share(causal, sk, window);
  double flops = 2 * batch * M * N * Kd * frac;
  const CatDevice *dev = &P->pc->dev;
  double eff = cost_flash_efficiency((int64_t)batch, (int64_t)M, (int64_t)d, (int64_t)(sk * frac), dev);
  *flops_sum += flops;
  return cost_op_time_s(flops, 0, dev, prec_name(P->pc->prec), eff * P->pc->gemm_sustained);
}

/* The least time of attention work of `flops` (the computed share) under
 * the chosen kernel generation: its FLOPs at the kernel's best published
 * share of the peak (cost_attention_utilization, docs/planner.md sec. 9.1);
 * 0 for the tile model alone or a device without a figure. */
static double attention_floor(const Pricer *P, double flops, int backward) {
  double u = cost_attention_utilization(P->pc->attn_kernel, backward, &P->pc->dev);
  return u > 0 ? cost_op_time_s(flops, 0, &P->pc->dev, prec_name(P->pc->prec), u) : 0;
}

static void price_flash_gemm(Pricer *P, const GInfo *gi, const IrNode *n, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  int r = n->rank;
  const IrNode *a = &g->nodes[n->in[0]];
  double M = (double)n->dims[r - 2], N = (double)n->dims[r - 1];
  double Kd = (double)(n->attr[0] ? a->dims[a->rank - 2] : a->dims[a->rank - 1]);
  double batch = 1;
  for (int i = 0; i < r - 2; i++) batch *= (double)n->dims[i];
  int writes_score = gi->score[(int)(n - g->nodes)];
  /* a backward that differentiates the softmax recomputes q k^T once more
   * (FlashAttention-2's backward): dO v^T (it depends on the output
   * gradient) stands also for it */
  int backward = gi->has_sbwd && gi->dep[(int)(n - g->nodes)];
  double reps = writes_score && backward ? 2 : 1;
  double flops = 0;
  double t = reps * flash_gemm_time(P, batch, M, N, Kd, writes_score, P->causal, 0, &flops);
  /* a kernel generation: each GEMM of the chain at least its FLOPs at the
   * kernel's rate (the softmax's exponentials stay in their own kernel) */
  double floor_t = attention_floor(P, reps * flops, backward);
  if (floor_t > t) t = floor_t;
  acc->t += t;
  acc->t_gemm += t;
  if (rc) acc->t_rc += t;
}

/* An ATTENTION op (the flash kernel the back ends run) or its backward,
 * priced as the materialised chain's GEMMs and softmax are under flash
 * (docs/planner.md sec. 9.1), as one kernel: forward q k^T and P v; backward
 * the recomputed q k^T, dO v^T, P^T dO, dS k and dS^T q; one exponential
 * per computed score on the special-function units. */
static void price_attention_op(Pricer *P, const GInfo *gi, const IrNode *n, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  const IrNode *q = &g->nodes[n->in[0]], *k = &g->nodes[n->in[1]], *v = &g->nodes[n->in[2]];
  double batch = (double)q->dims[0] * (double)q->dims[1], T = (double)q->dims[2], D = (double)q->dims[3];
  double S = (double)k->dims[2], Dv = (double)v->dims[3], W = (double)n->attr[3];
  int c = n->attr[0] != 0; /* the op's own mask */
  double t, flops = 0;
  int backward = n->op == IR_ATTENTION_BWD;
  if (!backward) {
    t = flash_gemm_time(P, batch, T, S, D, 1, c, W, &flops) + flash_gemm_time(P, batch, T, Dv, S, 0, c, W, &flops);
  } else {
    t = flash_gemm_time(P, batch, T, S, D, 1, c, W, &flops) + flash_gemm_time(P, batch, T, S, Dv, 1, c, W, &flops) +
        flash_gemm_time(P, batch, S, Dv, T, 0, c, W, &flops) + flash_gemm_time(P, batch, T, D, S, 0, c, W, &flops) +
        flash_gemm_time(P, batch, S, D, T, 0, c, W, &flops);
  }
  /* one exponential per computed score, of the tiles computed */
  double rate = cost_sfu_rate(&P->pc->dev);
  double te = rate > 0 ? batch * T * S * score_share(c, S, W) / rate : 0;
  /* a kernel generation: the whole kernel (the published rates include its
   * softmax) at least its FLOPs at the kernel's rate; the GEMMs take the rest */
  double floor_t = attention_floor(P, flops, backward);
  if (floor_t > t + te) t = floor_t - te;
  acc->t += t + te + PLAN_KERNEL_OVERHEAD_S;
  acc->t_gemm += t + PLAN_KERNEL_OVERHEAD_S;
  acc->t_other += te;
  acc->kernels += 1;
  if (rc) acc->t_rc += t + te + PLAN_KERNEL_OVERHEAD_S;
}

/* The efficiency of batch GEMMs [M, N] over Kd at the fixed tile cost k0,
 * with split-K (docs/planner.md 3.2): when their output tiles do not fill
 * one wave over a deep Kd, Kd is cut into slices run side by side; *sum_s is
 * the time of summing the slices' fp32 partial results after (0 unsplit). */
static double split_gemm_efficiency(const Pricer *P, double batch, double M, double N, double Kd, double k0,
                                    double *sum_s) {
  const CatDevice *dev = &P->pc->dev;
  double split = (double)cost_gemm_split_k((int64_t)batch, (int64_t)M, (int64_t)N, (int64_t)Kd, dev);
  *sum_s = split > 1 ? mem_kernel_time(P->pc, split * batch * M * N, 2 * split * batch * M * N * 4) : 0;
  return cost_gemm_efficiency_k0((int64_t)(batch * split), (int64_t)M, (int64_t)N, (int64_t)(Kd / split), dev, k0);
}

/* A convolution or one of its gradients: the implicit GEMM the back ends run
 * (im2col's product, the column matrix never stored: cuDNN's implicit
 * GEMM, Chetlur et al. 2014, sec. 3), priced as price_gemm prices a GEMM of
 * that shape (ircost_conv_gemm, docs/planner.md): the mainloop over the two
 * operands at the shape's efficiency, then the store of the result. */
static void price_conv_op(Pricer *P, const GInfo *gi, const IrNode *n, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  double batch = 1, M = 0, N = 0, Kd = 0;
  ircost_conv_gemm(g, n, &batch, &M, &N, &Kd);
  const CatDevice *dev = &P->pc->dev;
  const char *pn = prec_name(P->pc->prec); /* bf16 under the low-precision formats: theirs are the linear layers' */
  double eb = P->pc->act_bytes;
  double in_bytes = ((double)ir_numel(&g->nodes[n->in[0]]) + (double)ir_numel(&g->nodes[n->in[1]])) * eb;
  double flops = 2 * batch * M * N * Kd;
  /* The experts' grouped GEMM runs as the device path runs it (devexec.c,
   * grouped_run): the rows' experts read back to the host, then one GEMM a
   * run of one expert's rows - E launches one after another, each with its
   * own waves (an expert's few rows fill few tiles) and its launch gap, the
   * read-back a gap more (at the expected load every expert has rows, so no
   * weight gradient is zeroed). A convolution's groups are one batched launch. */
  int grouped = n->op == IR_GROUPED_MM || n->op == IR_GROUPED_MM_WGRAD;
  double launches = grouped ? batch : 1, per = grouped ? 1 : batch;
  /* a filter gradient's few output tiles over a deep k: split-K */
  double sum_s;
  double eff = split_gemm_efficiency(P, per, M, N, Kd, COST_GEMM_K_OVERHEAD, &sum_s);
  double t = launches * cost_op_time_s(flops / launches, in_bytes / launches, dev, pn, eff * P->pc->gemm_sustained);
  t += launches * sum_s;
  t += cost_op_time_s(0, (double)ir_numel(n) * eb, dev, pn, 1.0) + launches * PLAN_KERNEL_OVERHEAD_S;
  if (grouped) t += PLAN_KERNEL_OVERHEAD_S; /* the read-back, which waits for the queue */
  acc->t += t;
  acc->t_gemm += t;
  if (grouped) acc->t_grouped += t;
  acc->kernels += launches;
  if (rc) acc->t_rc += t;
}

/* The softmax of a flash attention: one exponential per computed score on
 * the special-function units (forward; the backward recomputes P), which
 * FlashAttention-2 does not overlap with the tensor cores; the rest of the
 * softmax and the mask and scale run in registers. */
static void price_flash_softmax(Pricer *P, const GInfo *gi, const FuseKernel *K, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *x = &g->nodes[K->nodes[j]];
    if (x->op != IR_SOFTMAX && x->op != IR_SOFTMAX_BWD) continue;
    double frac = P->causal ? causal_fraction((double)x->dims[x->rank - 1]) : 1;
    double rate = cost_sfu_rate(&P->pc->dev);
    double t = rate > 0 ? (double)ir_numel(x) * frac / rate : 0;
    acc->t += t;
    acc->t_other += t;
    if (rc) acc->t_rc += t;
  }
}

/* Node v is a parameter, as the program reads it: directly, or gathered or
 * marked for a group (ZeRO-3's gathers, the tensor group's f marker). */
static int weight_operand(const IrGraph *g, int v) {
  while (g->nodes[v].op == IR_ALL_GATHER || g->nodes[v].op == IR_COPY_TO_GROUP || g->nodes[v].op == IR_CAST) v = g->nodes[v].in[0];
  return g->nodes[v].op == IR_PARAM;
}

/* The time of one GEMM kernel: shape from its MATMUL (batch folded into M
 * when the right operand is a shared weight, into K for a weight gradient),
 * bytes of its operands and result at the training precision. Under FP8
 * (and MXFP8, NVFP4: plan_set_lowp) the GEMMs of a repeated block with a
 * weight operand (and their weight gradients) run on the format's inputs at
 * its peak, after a cast of the activation operand (Transformer Engine's
 * cast-transpose under FP8: read 2 bytes, write 2); the rest stays in bf16. */
static void price_gemm(Pricer *P, const GInfo *gi, const FuseKernel *K, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  int mmid = -1;
  for (int j = 0; j < K->nnodes; j++)
    if (g->nodes[K->nodes[j]].op == IR_MATMUL) mmid = K->nodes[j];
  if (mmid < 0) return;
  const IrNode *n = &g->nodes[mmid], *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
  if (P->pc->flash && gi->score && (gi->score[mmid] || gi->score[n->in[0]] || gi->score[n->in[1]])) {
    price_flash_gemm(P, gi, n, rc, acc);
    acc->t += PLAN_KERNEL_OVERHEAD_S;
    acc->t_gemm += PLAN_KERNEL_OVERHEAD_S;
    acc->kernels += 1;
    return;
  }
  int r = n->rank;
  double M = (double)n->dims[r - 2], N = (double)n->dims[r - 1];
  double Kd = (double)(n->attr[0] ? a->dims[a->rank - 2] : a->dims[a->rank - 1]);
  double batch = 1;
  for (int i = 0; i < r - 2; i++) batch *= (double)n->dims[i];
  double flops = 2 * batch * M * N * Kd;
  double out = batch * M * N;
  int wgrad = gi->wgrad[mmid] > 1;
  /* the experts' GEMMs over expert-major slots (moepack.h): [E, rows, X] by
   * the [E, X, Y] weights, and their weight gradients written as such */
  int by_weight = weight_operand(g, n->in[1]);
  int expert = n->rank == 3 && a->rank == 3 && b->rank == 3 && (by_weight || gi->is_grad_out[mmid]);
  int expert_wgrad = expert && !by_weight;
  /* a weight operand, or a weight's gradient (wgrad[] is its batch, 1 for a micro batch of 1) */
  int linear = gi->wgrad[mmid] >= 1 || b->rank == 2 || a->rank == 2 || expert;
  if (wgrad) {
    Kd *= batch;
    out = M * N;
    batch = 1;
  } else if (batch > 1 && b->rank == 2 && !n->attr[0]) {
    M *= batch; /* x [.., m, k] @ W [k, n]: one GEMM over every row */
    batch = 1;
  }
  const CatDevice *dev = &P->pc->dev;
  int lowp = P->pc->lowp && P->in_block && linear;
  double eb = P->pc->act_bytes, ib = lowp ? P->pc->lowp_operand : eb;
  double in_bytes = ((double)ir_numel(a) + (double)ir_numel(b)) * ib;
  double out_bytes = out * (double)K->noutputs * eb;
  const char *pn = lowp ? P->pc->lowp : prec_name(P->pc->prec);
  /* a weight gradient of a small layer over many tokens has fewer output
   * tiles than the device has SMs, over a deep k: split-K, as a
   * convolution's filter gradient (sec. 9.5); the format's fixed tile cost
   * (sec. 3.2), looked up once a plan: K0 is the 16-bit one for every
   * training precision */
  double sum_s;
  double eff = split_gemm_efficiency(P, batch, M, N, Kd, lowp ? P->pc->lowp_k0 : COST_GEMM_K_OVERHEAD, &sum_s);
  /* the mainloop (operands streamed under the arithmetic), then the
   * epilogue stores the result: on A100-class GPUs a thread block writes its
   * tile after its mainloop, so the store does not hide under the math */
  double t = cost_op_time_s(flops, in_bytes, dev, pn, eff * P->pc->gemm_sustained);
  t += sum_s;
  t += cost_op_time_s(0, out_bytes, dev, pn, 1.0);
  t += PLAN_KERNEL_OVERHEAD_S;
  acc->t += t;
  acc->t_gemm += t;
  acc->kernels += 1;
  if (rc) acc->t_rc += t;
  if (lowp && gi->wgrad[mmid] < 1 && !expert_wgrad) {
    /* the activation operand (x forward, dy backward) cast to the format, with
     * the copy the weight gradient reads (FP8: its transpose; sec. 9.3) */
    double act = b->rank == 2 || expert ? (double)ir_numel(a) : (double)ir_numel(b);
    double tc = mem_kernel_time(P->pc, act, act * P->pc->lowp_cast);
    acc->t += tc;
    acc->t_other += tc;
    acc->kernels += 1;
    if (rc) acc->t_rc += tc;
  }
}


static void price_comm(Pricer *P, const GInfo *gi, int kk, int rc, PlanCost *acc) {
  const IrGraph *g = gi->g;
  const FuseKernel *K = &gi->fg->kernels[kk];
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *n = &g->nodes[K->nodes[j]];
    int grp = (int)n->attr[0];
    if (grp < 0 || grp >= IRG_COUNT) grp = IRG_TP;
    int64_t size = P->gsize[grp];
    CostCollective kind;
    double bytes;
    switch (n->op) {
    case IR_ALL_REDUCE:
      kind = COST_ALLREDUCE;
      bytes = value_bytes(P->pc, &g->nodes[n->in[0]]);
      /* a weight's gradient summed over the context group: Megatron-LM
       * reduces it once per step with the data-parallel group (dp x cp
       * ranks, sec. 11.3), not per micro-batch */
      if (grp == IRG_CP && gi->gradsink[K->nodes[j]]) continue;
      break;
    case IR_ALL_GATHER:
      kind = COST_ALLGATHER;
      bytes = value_bytes(P->pc, n);
      if (P->pc->lowp && P->in_block && gi->gemm_gather[K->nodes[j]] && sem_dtype_is_float(n->dtype))
        bytes = (double)ir_numel(n) * P->pc->lowp_operand;
      break;
    case IR_REDUCE_SCATTER:
      kind = COST_REDUCE_SCATTER;
      bytes = value_bytes(P->pc, &g->nodes[n->in[0]]);
      break;
    case IR_ALL_TO_ALL:
      /* the experts' dispatch and combine: each rank keeps 1 / ep of its
       * buffer and exchanges the rest (docs/planner.md, expert parallelism) */
      kind = COST_ALLTOALL;
      bytes = value_bytes(P->pc, &g->nodes[n->in[0]]);
      break;
    case IR_SEND:
      if (n->attr[0] == IRG_PP) {
        /* the schedule prices the transfer (SchedCosts.t_p2p); count its bytes */
        acc->sent[IRG_PP] += value_bytes(P->pc, &g->nodes[n->in[0]]);
        continue;
      }
      /* ring attention: a key / value block to the next context rank, on the
       * critical path of the attention that waits for it (hidden under the
       * attention between the send and its receive, price_graph; none there:
       * it waits whole, GInfo.kcp_wait); a backward's sends of the blocks
       * received again (autodiff's cp_rereceive) are recomputation */
      if (size > 1) {
        double b = value_bytes(P->pc, &g->nodes[n->in[0]]);
        double t = cost_sendrecv_s(b, &P->link[grp]);
        acc->t += t;
        acc->t_comm[grp] += t;
        acc->sent[grp] += b;
        if (grp == IRG_CP && gi->kcp_wait[kk]) acc->t_cp_waits += t;
        if (rc) acc->t_rc += t;
      }
      continue;
    case IR_SHARD_SLICE: {
      double t = mem_kernel_time(P->pc, 0, 2 * value_bytes(P->pc, n));
      acc->t += t;
      acc->t_other += t;
      acc->kernels += 1;
      continue;
    }
    default: /* RECV (priced by the schedule), COPY_TO_GROUP (identity forward) */
      continue;
    }
    if (size <= 1 || bytes <= 0) continue;
    const CostLink *link = &P->link[grp];
    double t = cost_collective_s(kind, bytes, (int)size, link, COST_ALGO_AUTO);
    CostAlgo algo = cost_pick_algo(kind, bytes, (int)size, link);
    acc->t += t;
    acc->t_comm[grp] += t;
    acc->sent[grp] += cost_collective_bytes_sent(kind, bytes, (int)size, algo);
  }
}

static void price_kernel_body(Pricer *P, const GInfo *gi, int k, int rc, PlanCost *acc);

/* Adds the cost of kernel k of graph gi to acc. rc: the kernel recomputes. */
static void price_kernel(Pricer *P, const GInfo *gi, int k, int rc, PlanCost *acc) {
  double t0 = acc->t, g0 = acc->t_gemm;
  price_kernel_body(P, gi, k, rc, acc);
  if (gi->kattn[k] && gi->fg->kernels[k].kind != FUSE_CALL) {
    acc->t_attn += acc->t - t0;
    acc->t_attn_gemm += acc->t_gemm - g0;
  }
}

static void price_kernel_body(Pricer *P, const GInfo *gi, int k, int rc, PlanCost *acc) {
  const FuseKernel *K = &gi->fg->kernels[k];
  const IrGraph *g = gi->g;
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *x = &g->nodes[K->nodes[j]];
    if (x->op == IR_CALL) continue;
    IrCost nc = ircost_node(P->m, g, K->nodes[j]);
    acc->flops += nc.flops;
    acc->gemm_flops += nc.flops_of[IRC_GEMM];
    if (rc) {
      acc->rc_flops += nc.flops;
      acc->rc_gemm_flops += nc.flops_of[IRC_GEMM];
    }
  }
  switch (K->kind) {
  case FUSE_LEAF: {
    const IrNode *x = &g->nodes[K->nodes[0]];
    if (x->op == IR_PARAM) {
      acc->zparams += 1;
      acc->zparam_bytes += (double)ir_numel(x) * P->pc->weight_bytes;
    } else if (x->op == IR_FILL || x->op == IR_IOTA) {
      double t = mem_kernel_time(P->pc, 0, value_bytes(P->pc, x));
      acc->t += t;
      acc->t_other += t;
      acc->kernels += 1;
    }
    return;
  }
  case FUSE_VIEW:
    return;
  case FUSE_GEMM:
    price_gemm(P, gi, K, rc, acc);
    return;
  case FUSE_COMM:
    price_comm(P, gi, k, rc, acc);
    return;
  case FUSE_CALL: {
    const IrNode *x = &g->nodes[K->nodes[0]];
    const GMemo *cm = price_graph(P, (int)x->attr[0]);
    plan_cost_add(acc, &cm->cost, (double)x->attr[1]);
    return;
  }
  default:
    break;
  }
  if (K->kind == FUSE_SPECIAL) {
    /* a convolution, or the fused head's op (both gradients of its pair) */
    int priced = 0;
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *x = &g->nodes[K->nodes[j]];
      if (ircost_op_class(x->op) == IRC_GEMM && x->op != IR_MATMUL && x->op != IR_ATTENTION && x->op != IR_ATTENTION_BWD) {
        price_conv_op(P, gi, x, rc, acc);
        priced = 1;
      }
    }
    if (priced) return;
  }
  if (K->kind == FUSE_SPECIAL && gi->attn_op) {
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *x = &g->nodes[K->nodes[j]];
      if (x->op == IR_ATTENTION || x->op == IR_ATTENTION_BWD) {
        price_attention_op(P, gi, x, rc, acc);
        return;
      }
    }
  }
  /* attention under flash: the softmax's exponentials; the rest stays on chip */
  if (P->pc->flash && gi->kattn[k]) {
    price_flash_softmax(P, gi, K, rc, acc);
    return;
  }
  /* a flash-attention kernel reads q, k, v and writes its output in the
   * projections' [b, s, heads, d] layout (strided), so the copies that
   * split the heads out and merge them back are not made */
  if (P->pc->flash && (gi->score || gi->attn_op) && K->kind == FUSE_COPY && K->noutputs == 1) {
    int layout = 1, srank = gi->attn_op ? 4 : 0;
    for (int i = 0; gi->score && i < g->nnodes && !srank; i++)
      if (gi->score[i]) srank = g->nodes[i].rank;
    for (int j = 0; j < K->nnodes; j++) {
      IrOp op = g->nodes[K->nodes[j]].op;
      /* with the op, also the slice of o out of its packed output, the pad of
       * its gradient and the slices of dq, dk, dv out of the backward's */
      layout &= op == IR_RESHAPE || op == IR_TRANSPOSE || (gi->attn_op && (op == IR_SLICE || op == IR_PAD));
    }
    if (layout && g->nodes[K->outputs[0]].rank == srank) return;
  }
  /* loop, row, copy, special: memory bound */
  int all_absorbed = 1;
  double bytes = (K->bytes_read + K->bytes_written);
  for (int j = 0; j < K->nnodes; j++) all_absorbed &= gi->absorbed[K->nodes[j]];
  if (all_absorbed) return;
  for (int j = 0; j < K->ninputs; j++) {
    int v = K->inputs[j];
    if (g->nodes[v].op == IR_MATMUL && gi->wgrad[v] > 1) {
      double full = (double)ir_bytes(&g->nodes[v]);
      bytes -= full * (1.0 - 1.0 / gi->wgrad[v]);
    }
  }
  /* the fused bytes are at the IR's f32; the run keeps floats at act_bytes */
  bytes *= P->pc->act_bytes / 4.0;
  double t = mem_kernel_time(P->pc, K->flops, bytes);
  acc->t += t;
  acc->t_other += t;
  acc->kernels += 1;
  if (rc) acc->t_rc += t;
}

/* Liveness over the kernels of one execution of a graph: values live from
 * the kernel that writes them to the last kernel that reads them (graph
 * outputs to the end); a call adds its graph's own peak while it runs; a
 * SAVE call holds its layers' saved activations until the BACKWARD call that
 * reads it. peak_out is the peak while no SAVE holds, peak_in the peak
 * without the held bytes while one does (so a chunk of n layers peaks at
 * max(peak_out, n x layer_saved + peak_in)). mask: per kernel, 0 to skip
 * its outputs (parts of other pipeline chunks), NULL for all. */
static void walk_live(Pricer *P, const GInfo *gi, const char *mask, double *peak_out, double *peak_in) {
  const FuseGraph *fg = gi->fg;
  const IrGraph *g = gi->g;
  double live = 0, po = 0, pi = 0;
  int holding = 0;
  double *vb = xalloc_calloc((size_t)g->nnodes, sizeof(double));
  for (int k = 0; k < fg->nkernels; k++) {
    const FuseKernel *K = &fg->kernels[k];
    double inner = 0;
    int save_here = 0, bwd_here = 0;
    if (K->kind == FUSE_CALL) {
      const IrNode *x = &g->nodes[K->nodes[0]];
      inner = price_graph(P, (int)x->attr[0])->peak;
      save_here = x->attr[2] == IR_CALL_SAVE;
      bwd_here = x->attr[2] == IR_CALL_BACKWARD;
    }
    if (save_here || bwd_here || holding) {
      if (live + inner > pi) pi = live + inner;
    } else if (live + inner > po) {
      po = live + inner;
    }
    int allowed = !mask || mask[k];
    for (int j = 0; j < K->noutputs; j++) {
      int v = K->outputs[j];
      if (gi->alias[v] != v) continue;
      /* the memory plan's in-place rule (memplan.h): an output of a loop
       * kernel takes the buffer of the first input not yet taken that dies
       * here */
      int into = -1;
      for (int q = 0; K->kind == FUSE_LOOP && q < K->ninputs && into < 0; q++) {
        int x = K->inputs[q];
        if (gi->alias[x] == x && vb[x] > 0 && gi->last[x] == k && mem_fused_inplace_ok(fg, g, k, x, v)) into = x;
      }
      if (into >= 0) {
        vb[v] = vb[into];
        vb[into] = 0;
        continue;
      }
      double b = allowed ? kernel_out_bytes(P, gi, K, v) : 0;
      if (save_here) {
        /* the held layers are counted by the caller (n x layer_saved) */
        const IrNode *x = &g->nodes[v];
        b = allowed ? value_bytes(P->pc, x) : 0;
        holding = 1;
      }
      vb[v] = b;
      live += b;
    }
    if (holding || save_here) {
      if (live > pi) pi = live;
    } else if (live > po) {
      po = live;
    }
    for (int j = 0; j < K->ninputs; j++) {
      int v = gi->alias[K->inputs[j]];
      if (gi->last[v] == k && vb[v] > 0) {
        live -= vb[v];
        vb[v] = 0;
      }
    }
    if (bwd_here) holding = 0;
  }
  free(vb);
  *peak_out = po;
  *peak_in = pi;
}

/* The B.grad graph of B.fwd `fwd`: a BACKWARD call's graph, whose second
 * input is the SAVE call of `fwd` (ir.h); -1 when none. */
static int grad_graph_of(const IrModule *m, int fwd) {
  for (int gi = 0; gi < m->ngraphs; gi++) {
    const IrGraph *g = m->graphs[gi];
    for (int i = 0; i < g->nnodes; i++) {
      const IrNode *x = &g->nodes[i];
      if (x->op != IR_CALL || x->attr[2] != IR_CALL_BACKWARD || x->nin < 2) continue;
      const IrNode *save = &g->nodes[x->in[1]];
      if (save->op == IR_CALL && save->attr[2] == IR_CALL_SAVE && save->attr[0] == fwd) return (int)x->attr[0];
    }
  }
  return -1;
}

/* Whether every reader of node v of a backward graph (through views and
 * casts, and sequence parallelism's gather of a saved chunk) is a GEMM of the
 * blocks other than attention's: under FP8 those read their activation
 * operand as the FP8 copy the forward made, which Transformer Engine saves in
 * its place (its Linear and GroupedLinear keep the quantized input, in the
 * transposed usage the weight gradient reads, and gather that copy under
 * sequence parallelism), 1 byte a value. */
static int read_by_fp8_gemms_only(const IrGraph *g, const IrReaders *rd, const char *score, int v, int depth) {
  int any = 0;
  if (depth > 8) return 0;
  for (int u = rd->start[v]; u < rd->start[v + 1]; u++) {
    int r = rd->node[u];
    const IrNode *x = &g->nodes[r];
    if ((ir_op_flags(x->op) & IRF_SHAPE) || x->op == IR_CAST || x->op == IR_ALL_GATHER) {
      if (!read_by_fp8_gemms_only(g, rd, score, r, depth + 1)) return 0;
      any = 1;
    } else if (x->op == IR_MATMUL || x->op == IR_GROUPED_MM || x->op == IR_GROUPED_MM_WGRAD) {
      if (score && (score[r] || score[x->in[0]] || score[x->in[1]])) return 0;
      any = 1;
    } else
      return 0;
  }
  for (int k = 0; k < g->noutputs; k++)
    if (g->outputs[k] == v) return 0;
  return any;
}

/* Per output k >= 1 of B.fwd graph `fwd` (nargs arguments): 1 when B.grad
 * reads it (its argument #nargs + k, #0 being dy) only through the blocks' FP8
 * GEMMs (read_by_fp8_gemms_only); NULL without a B.grad. */
static char *fp8_saved(const IrModule *m, int fwd, int nargs) {
  int gg = grad_graph_of(m, fwd);
  if (gg < 0) return NULL;
  const IrGraph *g = m->graphs[fwd], *bg = m->graphs[gg];
  Arena *ra = arena_new();
  IrReaders rd = ir_readers(bg->nodes, bg->nnodes, ra);
  char *bscore = score_mask(bg, NULL), *mask = xalloc_calloc((size_t)g->noutputs + 1, 1);
  for (int i = 0; i < bg->nnodes; i++) {
    int64_t k = bg->nodes[i].op == IR_ARG ? bg->nodes[i].attr[0] - nargs : -1;
    if (k >= 1 && k < g->noutputs) mask[k] = (char)read_by_fp8_gemms_only(bg, &rd, bscore, i, 0);
  }
  free(bscore);
  arena_free(ra);
  return mask;
}

/* Bytes a B.fwd graph keeps per layer: its arguments and outputs 1.. */
static double callee_saved_layer(Pricer *P, int graph) {
  GMemo *mm = &P->memo[graph];
  if (mm->layer_saved > 0) return mm->layer_saved;
  const IrGraph *g = P->m->graphs[graph];
  double b = 0;
  /* flash attention saves no probabilities: it recomputes them from q, k, v
   * and the log-sum-exp of each row (4 bytes per query and head) */
  char *score = P->pc->flash ? score_mask(g, NULL) : NULL;
  int nargs = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == IR_ARG) {
      nargs++;
      if (!(score && score[i])) b += value_bytes(P->pc, &g->nodes[i]);
    }
  /* under FP8 (MXFP8, NVFP4), the saved activations that only the blocks' GEMMs read back */
  char *fp8 = P->pc->lowp ? fp8_saved(P->m, graph, nargs) : NULL;
  for (int k = 1; k < g->noutputs; k++) {
    const IrNode *x = &g->nodes[g->outputs[k]];
    if (score && score[g->outputs[k]]) b += (double)ir_numel(x) / (double)x->dims[x->rank - 1] * 4;
    else if (fp8 && fp8[k] && sem_dtype_is_float(x->dtype)) b += (double)ir_numel(x) * P->pc->lowp_saved;
    else b += value_bytes(P->pc, x);
  }
  free(fp8);
  free(score);
  mm->layer_saved = b > 0 ? b : 1e-300;
  return mm->layer_saved;
}

/* The share of a backward kernel's memory traffic that recomputes: the
 * bytes its forward-only nodes (no backward input) write, over all it moves
 * (fusion rule 9 puts a recomputed GELU in the kernel of GELU's gradient,
 * which reads the same pre-activation: the recomputation costs its write). */
static double recompute_share(const GInfo *gi, int k) {
  const FuseKernel *K = &gi->fg->kernels[k];
  if (K->kind != FUSE_LOOP && K->kind != FUSE_ROW) return 0;
  double moved = K->bytes_read + K->bytes_written, w = 0;
  for (int j = 0; j < K->noutputs; j++)
    if (!gi->dep[K->outputs[j]]) w += (double)ir_bytes(&gi->g->nodes[K->outputs[j]]);
  return moved > 0 && w < moved ? w / moved : 0;
}

static const GMemo *price_graph(Pricer *P, int graph) {
  GMemo *mm = &P->memo[graph];
  if (mm->done) return mm;
  mm->done = 1; /* no recursion through a cycle */
  const IrGraph *g = P->m->graphs[graph];
  GInfo gi;
  ginfo_init(&gi, g, &P->fr->graphs[graph], P->pc->lowp != NULL);
  int bwd = P->bwd_block[graph];
  PlanCost c;
  memset(&c, 0, sizeof c);
  int outer = P->in_block;
  P->in_block = 1;
  double t_attn = 0;
  for (int k = 0; k < gi.fg->nkernels; k++) {
    int rc = bwd && !gi.kbwd[k];
    double before = c.t;
    price_kernel(P, &gi, k, rc, &c);
    if (gi.kattn[k]) t_attn += c.t - before;
    if (bwd && !rc) c.t_rc += (c.t - before) * recompute_share(&gi, k);
  }
  P->in_block = outer;
  /* Overlap inside a block (docs/planner.md sec. 9.2). Ring attention: each
   * of the cp - 1 key / value blocks travels while the attention computes on
   * the one before it (cp_comm = ring; under allgather, hpdl's program, the
   * blocks are all in before the attention starts). tp_overlap: each GEMM next to a tensor-parallel
   * collective is cut into tp chunks and chunk i + 1 is exchanged while
   * chunk i computes (Megatron-LM / Transformer Engine userbuffers); only
   * the first chunk's exchange waits. */
  int64_t cpn = P->gsize[IRG_CP], tpn = P->gsize[IRG_TP];
  if (P->ring && cpn > 1 && c.t_comm[IRG_CP] > c.t_cp_waits) { /* cp_comm = allgather: all of it waits */
    double h = t_attn * (double)(cpn - 1) / (double)cpn;
    if (h > c.t_comm[IRG_CP] - c.t_cp_waits) h = c.t_comm[IRG_CP] - c.t_cp_waits;
    c.t -= h;
    c.t_hidden[IRG_CP] += h;
  }
  if (P->pc->tp_overlap && tpn > 1 && c.t_comm[IRG_TP] > 0) {
    double h = c.t_comm[IRG_TP] * (double)(tpn - 1) / (double)tpn;
    double under = c.t_gemm - t_attn;
    if (h > under) h = under > 0 ? under : 0;
    c.t -= h;
    c.t_hidden[IRG_TP] += h;
  }
  /* ZeRO-3 frees a layer's weights after each use: a recomputing backward
   * gathers a weight the recomputed forward and the backward both read twice */
  for (int k = 0; bwd && k < gi.fg->nkernels; k++) {
    const FuseKernel *K = &gi.fg->kernels[k];
    const IrNode *x = &g->nodes[K->nodes[0]];
    if (K->kind == FUSE_LEAF && x->op == IR_PARAM && gi.kparam_fwd[k] && gi.kparam_bwd[k]) {
      c.zparams += 1;
      c.zparam_bytes += (double)ir_numel(x) * P->pc->weight_bytes;
    }
  }
  for (int k = 0; k < g->ngrad_params; k++) {
    if (!first_grad_of_param(g, k)) continue;
    c.zgrads += 1;
    c.zgrad_bytes += (double)ir_numel(&g->nodes[g->outputs[g->noutputs - g->ngrad_params + k]]) * P->pc->weight_bytes;
  }
  mm->cost = c;
  double po, pi;
  walk_live(P, &gi, NULL, &po, &pi);
  mm->peak = po > pi ? po : pi;
  ginfo_free(&gi);
  return mm;
}

static void pricer_init(Pricer *P, PlanCtx *pc, const IrModule *m, FuseResult *fr, const AdResult *ad,
                        const CostLink *link, const int64_t *gsize, int ring) {
  memset(P, 0, sizeof *P);
  P->pc = pc;
  P->ring = ring;
  P->m = m;
  P->fr = fr;
  P->memo = xalloc_calloc((size_t)m->ngraphs, sizeof(GMemo));
  P->bwd_block = xalloc_calloc((size_t)m->ngraphs, 1);
  for (int i = 1; ad && i < ad->nforward; i++) {
    if (ad->grad[i] >= 0 && ad->grad[i] < m->ngraphs) P->bwd_block[ad->grad[i]] = 1;
    if (ad->grad_keep[i] >= 0 && ad->grad_keep[i] < m->ngraphs) P->bwd_block[ad->grad_keep[i]] = 1;
  }
  P->link = link;
  P->gsize = gsize;
  for (int i = 0; i < m->ngraphs && !P->causal; i++)
    for (int j = 0; j < m->graphs[i]->nnodes && !P->causal; j++) P->causal = m->graphs[i]->nodes[j].op == IR_CAUSAL_MASK;
}

static void pricer_free(Pricer *P) {
  free(P->memo);
  free(P->bwd_block);
}

/* The activations a pipeline rank holds with `inf` (chunk, micro-batch)
 * sets in flight: the sets its first `inf` forwards made, in the
 * schedule's order - under the interleaved schedule (Megatron-LM's
 * get_model_chunk_id) groups of pp micro-batches per chunk in turn, so
 * the warm-up holds pp sets of each earlier chunk and few of the last
 * (the last rank's last chunk, which runs the head and keeps its logits,
 * goes backward right after its forward); with one chunk a rank, inf sets
 * of it. Each set holds its chunk's saved bytes. */
static double held_activations(const PlanChunk *const *kinds, int64_t r, int64_t pp, int64_t v, int inf) {
  if (v <= 1) return (double)inf * kinds[r]->saved;
  /* set k is chunk (k / pp) mod v's: whole rounds of pp x v sets, then the rest in order */
  int64_t round = pp * v, whole = inf / round, rest = inf % round;
  double held = 0;
  for (int64_t j = 0; j < v; j++) {
    int64_t extra = rest - j * pp;
    int64_t sets = whole * pp + (extra < 0 ? 0 : extra > pp ? pp : extra);
    held += (double)sets * kinds[r + j * pp]->saved;
  }
  return held;
}

/* ------------------------------------------------------------------ */
/* keys: the cached programs                                            */

static uint64_t key_hash(const PlanKey *k) {
  uint64_t h = 1469598103934665603ull;
  int64_t v[9] = {k->mb, k->tp, k->cp, k->sp, k->rc, k->ep, k->fce, k->ef, k->ring};
  for (int i = 0; i < 9; i++) {
    h ^= (uint64_t)v[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  }
  return h;
}

static int key_eq(const PlanKey *a, const PlanKey *b) {
  return a->mb == b->mb && a->tp == b->tp && a->cp == b->cp && a->sp == b->sp && a->rc == b->rc && a->ep == b->ep &&
         a->fce == b->fce && a->rl == b->rl && a->ef == b->ef && a->ring == b->ring;
}

/* Links of the groups a key's program uses (tensor, context and expert),
 * under the rank order tp, cp, dp, pp (plan.h); an expert group is ep
 * consecutive data-parallel ranks, tp x cp apart, or folded (fold) the
 * tensor group times ep / tp data-parallel ranks of one context rank: tp
 * consecutive ranks, those blocks tp x cp apart (ep consecutive ranks at
 * cp 1). */
static void key_links(const PlanCtx *c, int64_t tp, int64_t cp, int64_t ep, int fold, CostLink *link, int64_t *gsize) {
  int64_t gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
  for (int g = 0; g < IRG_COUNT; g++) {
    link[g] = (CostLink){0, 0};
    gsize[g] = 1;
  }
  gsize[IRG_TP] = tp;
  gsize[IRG_CP] = cp;
  int64_t rtp = tp < gpn ? tp : gpn;
  int64_t rcp = gpn / tp > 1 ? (cp < gpn / tp ? cp : gpn / tp) : 1;
  link[IRG_TP] = cost_group_link(&c->cluster, (int)tp, (int)rtp);
  link[IRG_CP] = cost_group_link(&c->cluster, (int)cp, (int)rcp);
  gsize[IRG_EP] = ep > 1 ? ep : 1;
  if (ep > 1) {
    /* the members a node holds: the data-parallel blocks (tp x cp ranks each) in a node, times the
     * tensor ranks of each block that are members (folded) */
    int64_t block = tp * cp, dps = fold ? ep / tp : ep, per = fold ? (tp < gpn ? tp : gpn) : 1;
    int64_t rep = block >= gpn ? per : per * (dps < gpn / block ? dps : gpn / block);
    if (rep < 1) rep = 1;
    /* parallel.dispatcher = deepep: a token's copies for one node cross once */
    double dedup = c->model->layout.dispatcher == 1 && c->experts > 0
                       ? cost_node_dedup(c->experts, c->top_k, (ep + rep - 1) / rep, c->route_groups, c->route_group_top_k)
                       : 1;
    link[IRG_EP] = cost_alltoall_link(&c->cluster, (int)ep, (int)rep, dedup);
  }
}

static Diag *quiet_diag(PlanCtx *c) { return c->quiet; }

/* The program of key k, priced at its micro batch: attention as the flash op,
 * or materialised (plan_set_attention). Dropless experts: at ep = 1 over the
 * rows routed, as compile runs them (moepack.h); under expert parallelism over
 * the busiest expert's expected load (lower_model_priced), which sets the
 * step of the expert group, expert-major where that pays as in compile, and
 * with the sequences chunked over tp under parallel folding (k->ef). */
static IrModule *lower_priced(PlanCtx *c, Arena *a, const PlanKey *k) {
  LowerOptions o = {k->ep > 1, !c->flash, 0};
  IrModule *m = lower_model_with(a, quiet_diag(c), c->model, k->mb, &o);
  const char *why = NULL;
  if (m && moe_as_compiled(m, k->ep, k->ef ? k->tp : 1, k->cp, 1, &why) < 0) {
    diag_error(quiet_diag(c), span_none, "parallel folding cannot split a mixture-of-experts layer: %s", why);
    return NULL;
  }
  return m;
}

/* Past this many the lowered programs are not kept (each is a few hundred
 * kB): a search lowers one a micro batch, a few dozen. */
enum { PLAN_LOWERED_MAX = 256 };

/* Key k's lowered program, lowered once for every key of its micro batch and
 * experts' layout (a search asked for 1047 programs of twelve micro batches
 * and lowered each: 4.5% of its instructions). Callers only read it: they
 * partition it (spmd_partition copies), and what they make lives in their
 * own arena `a`, where it is lowered when the cache is full. */
static IrModule *lowered_program(PlanCtx *c, Arena *a, const PlanKey *k) {
  int64_t ep = k->ep > 1 ? k->ep : 1, etp = k->ef ? k->tp : 1;
  for (int i = 0; i < c->nlowered; i++)
    if (c->lowered[i].mb == k->mb && c->lowered[i].ep == ep && c->lowered[i].etp == etp) return c->lowered[i].m;
  if (c->nlowered >= PLAN_LOWERED_MAX) return lower_priced(c, a, k);
  if (c->nlowered == c->caplowered) {
    c->caplowered = c->caplowered ? 2 * c->caplowered : 16;
    c->lowered = xalloc_realloc(c->lowered, sizeof *c->lowered * (size_t)c->caplowered);
  }
  if (!c->lowered_arena) c->lowered_arena = arena_new();
  IrModule *m = lower_priced(c, c->lowered_arena, k);
  c->lowered[c->nlowered].mb = k->mb;
  c->lowered[c->nlowered].ep = ep;
  c->lowered[c->nlowered].etp = etp;
  c->lowered[c->nlowered++].m = m;
  return m;
}

/* The partitioning of a key's program. */
static SpmdSpec key_spec(const PlanCtx *c, const PlanKey *k) {
  SpmdSpec spec = {k->tp, k->cp, k->sp, c->model->seq_len, k->ep > 1 ? k->ep : 1, c->vocab_pad, k->fce, k->ef, k->ring};
  return spec;
}

/* One node's time as its own kernel, to balance pieces of a forward: a
 * GEMM or convolution at the efficiency of its shape (cost.c), anything
 * else at the roofline of its FLOPs and bytes. */
static double node_roofline_s(const PlanCtx *c, const IrModule *m, const IrGraph *g, int i) {
  const IrNode *n = &g->nodes[i];
  IrCost nc = ircost_node(m, g, i);
  double bytes = nc.bytes_read + nc.bytes_written, batch = 1, M = 0, N = 0, K = 0;
  int gemm = ircost_conv_gemm(g, n, &batch, &M, &N, &K);
  if (!gemm && n->op == IR_MATMUL && n->nin == 2) {
    const IrNode *x = &g->nodes[n->in[0]];
    if (x->rank >= 2 && n->rank >= 2) {
      M = (double)x->dims[x->rank - 2], K = (double)x->dims[x->rank - 1], N = (double)n->dims[n->rank - 1];
      for (int d = 0; d < n->rank - 2; d++) batch *= (double)n->dims[d];
      gemm = 1;
    }
  }
  double eff = gemm ? cost_gemm_efficiency_batched((int64_t)batch, (int64_t)M, (int64_t)N, (int64_t)K, &c->dev) * c->gemm_sustained : 1.0;
  return cost_op_time_s(nc.flops, bytes, &c->dev, prec_name(c->prec), eff);
}

/* A graph's nodes' times (one execution: a layer of a repeat). */
static double graph_roofline_s(const PlanCtx *c, const IrModule *m, const IrGraph *g) {
  double t = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (!(ir_op_flags(g->nodes[i].op) & IRF_LEAF)) t += g->nodes[i].op == IR_CALL ? 0 : node_roofline_s(c, m, g, i);
  return t;
}

/* A program's fusion, through the context's cache: the programs of a
 * search share most of their graphs (a key's recomputation policies keep
 * the layer's forward and the step; keys alike but for a setting the graph
 * does not show), and fusion was the most of a program's building. step >=
 * 0: only the graphs the pricing of the parts reads, the step's and those it
 * calls (the forward graphs the differentiation started from are not run);
 * -1: all (the exact chunks' memory plan walks every graph). */
static FuseResult *plan_fuse(PlanCtx *c, Arena *a, const IrModule *m, int step) {
  if (!c->fuse_cache) c->fuse_cache = fuse_cache_new();
  if (step < 0) return fuse_module_cached(a, m, c->fuse_opts, c->fuse_cache);
  return fuse_module_reachable(a, m, c->fuse_opts, c->fuse_cache, step);
}

/* The start of the reason a key's program does not partition (plan_parts
 * remembers such failures by it). */
#define PLAN_WHY_PARTITION "the model does not partition"

/* Regions of the step graph of the whole (one-chunk) program. */
enum { REG_PRO = 0, REG_EPI = 1, REG_LAYER = 2 };

/* Key k's partitioned program, kept for the next keys that differ from it
 * in their recomputation only (PlanCtx.parted: the differentiation appends
 * its graphs to a copy, module_copy, and leaves the partitioned ones as
 * they are). NULL where it does not partition: the caller reads the reason
 * from the diagnostics, and plan_parts remembers the failure for every
 * policy, so a failure is not kept here. */
static IrModule *partitioned_program(PlanCtx *c, const IrModule *global, const PlanKey *k) {
  int n = (int)(sizeof c->parted / sizeof c->parted[0]);
  for (int i = 0; i < c->nparted; i++) {
    PlanKey q = c->parted[i].key;
    q.rc = k->rc;
    q.rl = k->rl;
    if (key_eq(&q, k)) return c->parted[i].m;
  }
  Arena *pa = arena_new();
  SpmdSpec spec = key_spec(c, k);
  IrModule *part = spmd_partition(pa, quiet_diag(c), global, &spec);
  if (!part) {
    arena_free(pa);
    return NULL;
  }
  int slot = c->nparted < n ? c->nparted++ : c->parted_next;
  if (c->parted[slot].arena) arena_free(c->parted[slot].arena); /* the oldest */
  c->parted_next = (slot + 1) % n;
  c->parted[slot].key = *k;
  c->parted[slot].m = part;
  c->parted[slot].arena = pa;
  return part;
}

static void parted_drop(PlanCtx *c) {
  for (int i = 0; i < c->nparted; i++) arena_free(c->parted[i].arena);
  memset(c->parted, 0, sizeof c->parted);
  c->nparted = c->parted_next = 0;
}

/* A copy of module m in arena a that graphs can be appended to without
 * changing m: its graph and parameter arrays copied, the graphs themselves
 * and the rest shared (read only). */
static IrModule *module_copy(Arena *a, const IrModule *m) {
  IrModule *t = ir_module_new(a);
  *t = *m;
  t->arena = a;
  t->capgraphs = m->ngraphs + 8;
  t->graphs = arena_alloc(a, sizeof(IrGraph *) * (size_t)t->capgraphs);
  if (m->ngraphs) memcpy(t->graphs, m->graphs, sizeof(IrGraph *) * (size_t)m->ngraphs);
  t->capparams = m->nparams > 0 ? m->nparams : 1;
  t->params = arena_alloc(a, sizeof(IrParam) * (size_t)t->capparams);
  if (m->nparams) memcpy(t->params, m->params, sizeof(IrParam) * (size_t)m->nparams);
  return t;
}

/* Builds the parts of a key from the whole program: lower, partition,
 * differentiate, fuse, then price the step graph's kernels by region. */
static void build_parts(PlanCtx *c, PlanParts *pp) {
  Arena *a = arena_new();
  const PlanKey *k = &pp->key;
  IrModule *global = lowered_program(c, a, k);
  IrModule *part = NULL;
  if (!global) {
    snprintf(pp->why, sizeof pp->why, "the model does not lower at micro batch %" PRId64, k->mb);
    pp->before_ad = 1;
    goto done;
  }
  int errors = diag_error_count(quiet_diag(c));
  part = partitioned_program(c, global, k);
  if (!part) {
    /* the partitioner's reason, when it gave one (its diagnostics are quiet here) */
    const char *reason = diag_error_count(quiet_diag(c)) > errors ? diag_last_error(quiet_diag(c)) : NULL;
    snprintf(pp->why, sizeof pp->why, PLAN_WHY_PARTITION " over tp=%" PRId64 " cp=%" PRId64 "%s%s%s", k->tp, k->cp,
             k->sp ? " with sequence parallelism" : "", reason ? ": " : "", reason ? reason : "");
    pp->before_ad = 1;
    goto done;
  }
  /* the vocabulary as the partition padded it (spmd.c's vocab_flow), for the reports */
  for (int i = 0; i < part->nparams; i++)
    if (part->params[i].logical_rows > 0) pp->vocab_padded = part->params[i].full_dims[0];
  /* a forward cut into pieces (no single repeat): each piece's time,
   * forward and (about twice that) backward, to balance the stages */
  const PipeUnits *pu = pipe_units(a, part);
  if (pu && pu->by_cuts) {
    const IrGraph *g0 = part->graphs[0];
    pp->units = pu->nunits;
    pp->unit_w = xalloc_calloc((size_t)pu->nunits, sizeof(double));
    for (int64_t u = 0; u < pu->nunits; u++) {
      if (pu->call[u] >= 0) { /* a layer of a repeat: its share of the CALL */
        const IrNode *cn = &g0->nodes[pu->call[u]];
        pp->unit_w[u] = 3 * graph_roofline_s(c, part, part->graphs[cn->attr[0]]);
        continue;
      }
      for (int i = pu->start[u]; i < pu->start[u + 1]; i++)
        if (!pu->free_node[i]) pp->unit_w[u] += 3 * node_roofline_s(c, part, g0, i);
    }
  }
  const char *err = NULL;
  part = module_copy(a, part);
  AdResult *ad = ad_build(part, (Recompute)k->rc, &err);
  if (!ad) {
    snprintf(pp->why, sizeof pp->why, "the model does not differentiate: %s", err ? err : "?");
    goto done;
  }
  FuseResult *fr = plan_fuse(c, a, part, ad->step);
  CostLink link[IRG_COUNT];
  int64_t gsize[IRG_COUNT];
  key_links(c, k->tp, k->cp, k->ep, k->ef, link, gsize);
  Pricer P;
  pricer_init(&P, c, part, fr, ad, link, gsize, k->ring);
  const IrGraph *g = part->graphs[ad->step];
  GInfo gi;
  ginfo_init(&gi, g, &fr->graphs[ad->step], 0);
  /* the main repeat: the SAVE and BACKWARD calls of the largest count */
  int save = -1, back = -1;
  int64_t best = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *x = &g->nodes[i];
    if (x->op == IR_CALL && x->attr[2] == IR_CALL_SAVE && x->attr[1] > best) best = x->attr[1], save = i;
  }
  for (int i = 0; save >= 0 && i < g->nnodes; i++) {
    const IrNode *x = &g->nodes[i];
    if (x->op == IR_CALL && x->attr[2] == IR_CALL_BACKWARD)
      for (int j = 0; j < x->nin; j++)
        if (x->in[j] == save) back = i;
  }
  int n = g->nnodes;
  char *anc = xalloc_calloc((size_t)n, 1), *desc = xalloc_calloc((size_t)n, 1);
  if (save >= 0) {
    anc[save] = 1;
    for (int i = save; i >= 0; i--)
      if (anc[i])
        for (int j = 0; j < g->nodes[i].nin; j++) anc[g->nodes[i].in[j]] = 1;
    anc[save] = 0;
  }
  if (back >= 0) {
    desc[back] = 1;
    for (int i = back + 1; i < n; i++)
      for (int j = 0; j < g->nodes[i].nin && !desc[i]; j++) desc[i] |= desc[g->nodes[i].in[j]];
    desc[back] = 0;
  }
  const FuseGraph *fg = gi.fg;
  int nk = fg->nkernels;
  char *reg = xalloc_calloc((size_t)nk, 1);
  for (int kk = 0; kk < nk; kk++) {
    const FuseKernel *K = &fg->kernels[kk];
    int lastn = K->nodes[K->nnodes - 1];
    if (lastn == save || lastn == back) reg[kk] = REG_LAYER;
    else if (gi.kbwd[kk]) reg[kk] = desc[lastn] ? REG_PRO : REG_EPI;
    else reg[kk] = anc[lastn] ? REG_PRO : REG_EPI;
    if (K->kind == FUSE_LEAF && g->nodes[lastn].op == IR_PARAM) {
      /* a weight belongs to the region(s) of the kernels that read it */
      int used_pro = 0, used_epi = 0;
      for (int k2 = kk + 1; k2 < nk; k2++) {
        const FuseKernel *K2 = &fg->kernels[k2];
        int l2 = K2->nodes[K2->nnodes - 1];
        int r2 = (l2 == save || l2 == back) ? REG_LAYER
                 : gi.kbwd[k2]              ? (desc[l2] ? REG_PRO : REG_EPI)
                                            : (anc[l2] ? REG_PRO : REG_EPI);
        for (int j = 0; j < K2->ninputs; j++)
          if (gi.alias[K2->inputs[j]] == lastn || K2->inputs[j] == lastn) {
            if (r2 == REG_PRO) used_pro = 1;
            if (r2 == REG_EPI) used_epi = 1;
          }
      }
      /* views of the weight (a transpose for tied logits) count as reads */
      for (int k2 = kk + 1; k2 < nk; k2++) {
        const FuseKernel *K2 = &fg->kernels[k2];
        for (int j = 0; j < K2->nnodes; j++) {
          const IrNode *x = &g->nodes[K2->nodes[j]];
          for (int q = 0; q < x->nin; q++)
            if (x->in[q] == lastn) {
              int l2 = K2->nodes[K2->nnodes - 1];
              int r2 = gi.kbwd[k2] ? (desc[l2] ? REG_PRO : REG_EPI) : (anc[l2] ? REG_PRO : REG_EPI);
              if (l2 == save || l2 == back) r2 = REG_LAYER;
              if (r2 == REG_PRO) used_pro = 1;
              if (r2 == REG_EPI) used_epi = 1;
            }
        }
      }
      double numel = (double)ir_numel(&g->nodes[lastn]);
      if (used_pro) pp->params_reg[REG_PRO] += numel;
      if (used_epi) pp->params_reg[REG_EPI] += numel;
      if (used_pro && used_epi) pp->shared_params += numel;
      reg[kk] = used_pro && !used_epi ? REG_PRO : REG_EPI;
    }
  }
  /* prices by region and direction */
  for (int kk = 0; kk < nk; kk++) {
    const FuseKernel *K = &fg->kernels[kk];
    int r = reg[kk];
    if (r == REG_LAYER) continue; /* the layer is priced per layer below */
    PlanCost *dst = gi.kbwd[kk] ? &pp->b[r] : &pp->f[r];
    price_kernel(&P, &gi, kk, 0, dst);
    if (K->kind == FUSE_LEAF && gi.kparam_bwd[kk] && g->nodes[K->nodes[0]].op == IR_PARAM) {
      pp->b[r].zparams += 1;
      pp->b[r].zparam_bytes += (double)ir_numel(&g->nodes[K->nodes[0]]) * c->weight_bytes;
    }
  }
  for (int q = 0; q < g->ngrad_params; q++) {
    if (!first_grad_of_param(g, q)) continue;
    int v = g->outputs[g->noutputs - g->ngrad_params + q];
    int kk = fg->kernel_of[v];
    int r = reg[kk] == REG_LAYER ? REG_EPI : reg[kk];
    pp->b[r].zgrads += 1;
    pp->b[r].zgrad_bytes += (double)ir_numel(&g->nodes[v]) * c->weight_bytes;
  }
  /* saved activations of the prologue and epilogue: values forward kernels
   * write and backward kernels read */
  char *counted = xalloc_calloc((size_t)n, 1);
  for (int kk = 0; kk < nk; kk++) {
    if (!gi.kbwd[kk]) continue;
    const FuseKernel *K = &fg->kernels[kk];
    for (int j = 0; j < K->ninputs; j++) {
      int v = gi.alias[K->inputs[j]];
      int pk = fg->kernel_of[v];
      if (counted[v] || gi.kbwd[pk] || v == save) continue;
      counted[v] = 1;
      int r = reg[pk] == REG_LAYER ? REG_EPI : reg[pk];
      pp->saved_reg[r] += kernel_out_bytes(&P, &gi, &fg->kernels[pk], v);
    }
  }
  free(counted);
  /* one layer */
  pp->layers = 0;
  if (save >= 0) {
    const IrNode *sx = &g->nodes[save];
    pp->layers = sx->attr[1];
    int fgraph = (int)sx->attr[0];
    const GMemo *lf = price_graph(&P, fgraph);
    pp->lf = lf->cost;
    pp->layer_saved = callee_saved_layer(&P, fgraph);
    pp->lf_peak = lf->peak;
    pp->boundary_bytes = value_bytes(c, sx);
    for (int i = 0; i < part->graphs[fgraph]->nnodes; i++) {
      const IrNode *x = &part->graphs[fgraph]->nodes[i];
      if (x->op == IR_RECV && x->attr[0] == IRG_CP) pp->cp_recv_layer += value_bytes(c, x);
    }
    /* parameters of one layer: the block's (local) weights */
    int block = -1;
    for (int i = 1; i < ad->nforward; i++)
      if (ad->fwd[i] == fgraph || ad->fwd_keep[i] == fgraph) block = i;
    for (int q = 0; q < part->nparams; q++)
      if (part->params[q].graph == block) {
        double e = (double)ir_param_numel(&part->params[q]);
        pp->layer_params += e;
        if (ir_param_is_expert(&part->params[q])) pp->layer_expert_params += e;
      }
  }
  if (back >= 0) {
    const GMemo *lb = price_graph(&P, (int)g->nodes[back].attr[0]);
    pp->lb = lb->cost;
    pp->lb_peak = lb->peak;
  }
  /* peaks per chunk kind, without the held layers */
  char *mask = xalloc_calloc((size_t)nk, 1);
  for (int kind = 0; kind < PLAN_NKINDS; kind++) {
    for (int kk = 0; kk < nk; kk++) {
      int r = reg[kk];
      mask[kk] = r == REG_LAYER || (r == REG_PRO && (kind == PLAN_SINGLE || kind == PLAN_FIRST)) ||
                 (r == REG_EPI && (kind == PLAN_SINGLE || kind == PLAN_LAST));
    }
    walk_live(&P, &gi, mask, &pp->peak_out[kind], &pp->peak_in[kind]);
  }
  free(mask);
  free(reg);
  free(anc);
  free(desc);
  ginfo_free(&gi);
  pricer_free(&P);
  pp->valid = 1;
done:
  arena_free(a);
}

static PlanParts *parts_find(const PlanCtx *c, const PlanKey *k) {
  if (!c->cap) return NULL;
  for (size_t i = key_hash(k) & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    PlanParts *p = c->table[i];
    if (!p) return NULL;
    if (key_eq(&p->key, k)) return p;
  }
}

static void parts_insert(PlanCtx *c, PlanParts *p) {
  if ((c->count + 1) * 2 > c->cap) {
    size_t ncap = c->cap ? c->cap * 2 : 256;
    PlanParts **nt = xalloc_calloc(ncap, sizeof(PlanParts *));
    for (size_t i = 0; i < c->cap; i++) {
      PlanParts *q = c->table[i];
      if (!q) continue;
      size_t j = key_hash(&q->key) & (ncap - 1);
      while (nt[j]) j = (j + 1) & (ncap - 1);
      nt[j] = q;
    }
    free(c->table);
    c->table = nt;
    c->cap = ncap;
  }
  size_t j = key_hash(&p->key) & (c->cap - 1);
  while (c->table[j]) j = (j + 1) & (c->cap - 1);
  c->table[j] = p;
  c->count++;
}

/* A property of the model's lowered program, found once (*memo: 0 unknown,
 * 1 no, 2 yes): whether `test` holds of it (k: any key of the model). */
static int model_memo(PlanCtx *c, const PlanKey *k, int *memo, int (*test)(const IrModule *)) {
  if (!*memo) {
    Arena *a = arena_new();
    IrModule *m = lower_priced(c, a, k);
    if (m) *memo = test(m) ? 2 : 1;
    arena_free(a);
  }
  return *memo != 1;
}

int plan_act_differs(PlanCtx *c, const PlanKey *k) { return model_memo(c, k, &c->act_same, ad_act_recomputes); }

int plan_selective_differs(PlanCtx *c, const PlanKey *k) {
  return model_memo(c, k, &c->selective_same, ad_selective_recomputes);
}

PlanParts *plan_parts(PlanCtx *c, const PlanKey *k) {
  PlanParts *p = parts_find(c, k);
  if (p) return p;
  /* recompute = act of a model without a gated activation (GPT-2's GELU)
   * is the program of recompute selective */
  if (k->rc == RECOMPUTE_ACT && !plan_act_differs(c, k)) {
    PlanKey sel = *k;
    sel.rc = RECOMPUTE_SELECTIVE;
    return plan_parts(c, &sel);
  }
  if (k->rc == RECOMPUTE_SELECTIVE && k->cp <= 1) {
    /* selective recomputation of a model with no attention core to
     * recompute (flash attention keeps no scores) is the program of
     * recompute none: its parts, not built again (not under context
     * parallelism, where it receives the other ranks' blocks again) */
    if (!plan_selective_differs(c, k)) {
      PlanKey none = *k;
      none.rc = RECOMPUTE_NONE;
      return plan_parts(c, &none);
    }
  }
  /* a program that does not lower or partition fails under every
   * recomputation policy: remembered under rc -1, not built again (the
   * search asks for each policy of each such key) */
  PlanKey any = *k;
  any.rc = -1;
  any.rl = 0;
  const PlanParts *failed = k->rc >= 0 ? parts_find(c, &any) : NULL;
  /* nor, once it failed to partition at two micro batches for one reason,
   * at any other: the reason names a dimension and its size, and a size the
   * micro batch does not scale fails whatever the micro batch (a weight's
   * columns that tp does not divide); remembered under micro batch 0 (no key's), for a model
   * without experts, whose token rows (micro batch x sequence) may split */
  PlanKey fam = any;
  fam.mb = 0;
  PlanParts *family = k->rc >= 0 && c->experts <= 0 ? parts_find(c, &fam) : NULL;
  if (!failed && family && family->every_mb) failed = family;
  p = xalloc_calloc(1, sizeof *p);
  p->key = *k;
  if (failed) {
    memcpy(p->why, failed->why, sizeof p->why);
    p->before_ad = 1;
  } else {
    build_parts(c, p);
    c->programs++;
    if (!p->valid && p->before_ad && k->rc >= 0) {
      PlanParts *f = xalloc_calloc(1, sizeof *f);
      *f = *p;
      f->key = any;
      f->splits = NULL;
      f->unit_w = NULL;
      parts_insert(c, f);
      if (c->experts <= 0 && !strncmp(p->why, PLAN_WHY_PARTITION, strlen(PLAN_WHY_PARTITION))) {
        if (!family) {
          PlanParts *ff = xalloc_calloc(1, sizeof *ff);
          *ff = *f;
          ff->key = fam;
          ff->fail_mb = k->mb;
          parts_insert(c, ff);
        } else if (family->fail_mb != k->mb && !strcmp(family->why, p->why))
          family->every_mb = 1;
      }
    }
  }
  parts_insert(c, p);
  return p;
}

/* A chunk's price from the parts: prologue?, n layers, epilogue?. */
void plan_chunk_from_parts(const PlanParts *pp, int kind, int64_t n, PlanChunk *ch) {
  memset(ch, 0, sizeof *ch);
  int pro = kind == PLAN_SINGLE || kind == PLAN_FIRST, epi = kind == PLAN_SINGLE || kind == PLAN_LAST;
  ch->layers = n;
  plan_cost_add(&ch->f, &pp->lf, (double)n);
  plan_cost_add(&ch->b, &pp->lb, (double)n);
  ch->saved = (double)n * pp->layer_saved;
  ch->params = (double)n * pp->layer_params;
  if (pro) {
    plan_cost_add(&ch->f, &pp->f[REG_PRO], 1);
    plan_cost_add(&ch->b, &pp->b[REG_PRO], 1);
    ch->saved += pp->saved_reg[REG_PRO];
    ch->params += pp->params_reg[REG_PRO];
  }
  if (epi) {
    plan_cost_add(&ch->f, &pp->f[REG_EPI], 1);
    plan_cost_add(&ch->b, &pp->b[REG_EPI], 1);
    ch->saved += pp->saved_reg[REG_EPI];
    ch->params += pp->params_reg[REG_EPI];
  }
  if (kind == PLAN_SINGLE) ch->params -= pp->shared_params;
  double pin = (double)n * pp->layer_saved + pp->peak_in[kind];
  ch->peak = pp->peak_out[kind] > pin ? pp->peak_out[kind] : pin;
  ch->p2p_bytes = kind == PLAN_SINGLE ? 0 : pp->boundary_bytes;
  if (kind == PLAN_FIRST || kind == PLAN_MIDDLE) ch->f.sent[IRG_PP] += pp->boundary_bytes;
  if (kind == PLAN_LAST || kind == PLAN_MIDDLE) ch->b.sent[IRG_PP] += pp->boundary_bytes;
  ch->shared_params = kind == PLAN_SINGLE ? 0 : pp->shared_params;
}

/* The same with parallel.recompute_layers: the first `rl` of the chunk's n
 * layers priced from pp (the policy's parts), the rest from keep's (recompute
 * none), as ad_build_layers splits a chunk's repeat. */
static void chunk_from_parts_mixed(const PlanParts *pp, const PlanParts *keep, int kind, int64_t n, int64_t rl, PlanChunk *ch) {
  plan_chunk_from_parts(pp, kind, n, ch);
  int64_t k = n > rl ? n - rl : 0; /* the kept layers */
  if (!keep || k == 0) return;
  plan_cost_add(&ch->f, &pp->lf, -(double)k);
  plan_cost_add(&ch->b, &pp->lb, -(double)k);
  plan_cost_add(&ch->f, &keep->lf, (double)k);
  plan_cost_add(&ch->b, &keep->lb, (double)k);
  double more = (double)k * (keep->layer_saved - pp->layer_saved);
  ch->saved += more;
  double pin = (double)n * pp->layer_saved + more + pp->peak_in[kind];
  ch->peak = pp->peak_out[kind] > pin ? pp->peak_out[kind] : pin;
}

/* ------------------------------------------------------------------ */
/* the real chunks: pipe_split and a differentiated module per chunk    */


/* Prices the step graph of one differentiated chunk module. */
static int price_chunk_module(PlanCtx *c, IrModule *cm, Recompute rc, int64_t rl, int ring, const CostLink *link,
                              const int64_t *gsize, Arena *a, PlanChunk *ch, char *why, size_t whylen) {
  const char *err = NULL;
  AdResult *ad = ad_build_layers(cm, rc, rl, &err);
  if (!ad) {
    snprintf(why, whylen, "a pipeline chunk does not differentiate: %s", err ? err : "?");
    return -1;
  }
  FuseResult *fr = plan_fuse(c, a, cm, -1);
  Pricer P;
  pricer_init(&P, c, cm, fr, ad, link, gsize, ring);
  const IrGraph *g = cm->graphs[ad->step];
  GInfo gi;
  ginfo_init(&gi, g, &fr->graphs[ad->step], 0);
  memset(ch, 0, sizeof *ch);
  const FuseGraph *fg = gi.fg;
  double held_saved = 0; /* the saved activations of the layers the chunk's repeats hold */
  char *counted = xalloc_calloc((size_t)g->nnodes, 1);
  for (int k = 0; k < fg->nkernels; k++) {
    const FuseKernel *K = &fg->kernels[k];
    price_kernel(&P, &gi, k, 0, gi.kbwd[k] ? &ch->b : &ch->f);
    const IrNode *x = &g->nodes[K->nodes[0]];
    if (K->kind == FUSE_LEAF && x->op == IR_PARAM) {
      ch->params += (double)ir_numel(x);
      if (gi.kparam_bwd[k]) {
        ch->b.zparams += 1;
        ch->b.zparam_bytes += (double)ir_numel(x) * c->weight_bytes;
      }
    }
    if (K->kind == FUSE_CALL && x->attr[2] == IR_CALL_SAVE) { /* (a forward cut by cuts may call several) */
      held_saved += (double)x->attr[1] * callee_saved_layer(&P, (int)x->attr[0]);
      ch->layers += x->attr[1];
      /* the block's weights, one copy per layer the chunk runs */
      int fgraph = (int)x->attr[0], block = -1;
      for (int i = 1; i < ad->nforward; i++)
        if (ad->fwd[i] == fgraph || ad->fwd_keep[i] == fgraph) block = i;
      for (int q = 0; q < cm->nparams; q++)
        if (cm->params[q].graph == block) ch->params += (double)ir_param_numel(&cm->params[q]) * (double)x->attr[1];
    }
    if (K->kind == FUSE_COMM)
      for (int j = 0; j < K->nnodes; j++)
        if (g->nodes[K->nodes[j]].op == IR_SEND && g->nodes[K->nodes[j]].attr[0] == IRG_PP && !gi.kbwd[k])
          ch->p2p_bytes = value_bytes(c, &g->nodes[g->nodes[K->nodes[j]].in[0]]);
    if (!gi.kbwd[k]) continue;
    for (int j = 0; j < K->ninputs; j++) {
      int v = gi.alias[K->inputs[j]];
      int pk = fg->kernel_of[v];
      if (counted[v] || gi.kbwd[pk]) continue;
      counted[v] = 1;
      const IrNode *pv = &g->nodes[v];
      if (pv->op == IR_CALL && pv->attr[2] == IR_CALL_SAVE) continue; /* the held layers, below */
      ch->saved += kernel_out_bytes(&P, &gi, &fg->kernels[pk], v);
    }
  }
  free(counted);
  for (int q = 0; q < g->ngrad_params; q++) {
    if (!first_grad_of_param(g, q)) continue;
    ch->b.zgrads += 1;
    ch->b.zgrad_bytes += (double)ir_numel(&g->nodes[g->outputs[g->noutputs - g->ngrad_params + q]]) * c->weight_bytes;
  }
  ch->saved += held_saved;
  double po, pi;
  walk_live(&P, &gi, NULL, &po, &pi);
  pi += held_saved;
  ch->peak = po > pi ? po : pi;
  /* The compiled program's own memory plan (memplan.h: liveness of the
   * fused kernels, stashes of the saved layers, workspaces of calls) is the
   * authority on the peak of one micro-batch's step. It sizes values by
   * their IR dtype (f32); the run keeps floats at the training precision. */
  MemOptions mo;
  memset(&mo, 0, sizeof mo);
  mo.precision = c->prec;
  mo.optimizer = c->model->train.optimizer;
  mo.sgd_momentum = c->model->train.momentum > 0;
  mo.dp = 1;
  mo.entry = ad->step;
  mo.fusion = fr;
  MemPlan *mp = mem_plan_module(a, cm, &mo);
  if (mp && mp->fused_peak > 0 && !c->flash) {
    ch->memplan_peak = (double)mp->fused_peak;
    ch->peak = (double)mp->fused_peak * c->act_bytes / 4.0;
  }
  ginfo_free(&gi);
  pricer_free(&P);
  return 0;
}

int plan_split_layers(const PlanCtx *c, const PlanParts *pp, int64_t K, int64_t *out, char *why, size_t whylen) {
  int64_t L = pp->unit_w ? pp->units : pp->layers;
  if (K <= 1) {
    out[0] = L;
    return 0;
  }
  if (pp->unit_w) {
    if (L < K) {
      snprintf(why, whylen,
               "the forward of %s cuts into %" PRId64 " piece%s (at the places where one activation alone crosses), "
               "fewer than pp x virtual = %" PRId64 " chunks",
               c->model->model->decl->name.name, L, L == 1 ? "" : "s", K);
      return -1;
    }
    return pipe_balance_units(pp->unit_w, L, K, out);
  }
  if (c->model->layout.balance == BALANCE_ENDS) {
    if (pipe_split_ends(L, K, out) != 0) {
      snprintf(why, whylen, "%" PRId64 " layers and the two ends (embeddings, head) do not split equally into pp x virtual = %" PRId64 " chunks", L, K);
      return -1;
    }
    return 0;
  }
  if (L < K) {
    snprintf(why, whylen, "%" PRId64 " layers do not split into pp x virtual = %" PRId64 " chunks of at least one layer", L, K);
    return -1;
  }
  if (c->model->layout.balance == BALANCE_LAYERS) {
    if (L % K) {
      snprintf(why, whylen, "%" PRId64 " layers do not split equally into pp x virtual = %" PRId64 " chunks", L, K);
      return -1;
    }
    for (int64_t i = 0; i < K; i++) out[i] = L / K;
    return 0;
  }
  /* one micro-batch's forward + backward (recomputation included) of the
   * prologue, one layer and the epilogue: what a chunk's stage time adds */
  double t_pro = pp->f[REG_PRO].t + pp->b[REG_PRO].t, t_epi = pp->f[REG_EPI].t + pp->b[REG_EPI].t;
  double t_layer = pp->lf.t + pp->lb.t;
  /* the search asks for the same split of the same parts thousands of times */
  PlanParts *cache = (PlanParts *)pp;
  if (K <= L && (cache->splits || (cache->splits = calloc((size_t)L + 1, sizeof(int64_t *))))) {
    if (cache->splits[K]) {
      memcpy(out, cache->splits[K], sizeof(int64_t) * (size_t)K);
      return 0;
    }
    int rc = pipe_balance(L, K, t_pro, t_layer, t_epi, out);
    if (rc == 0 && (cache->splits[K] = malloc(sizeof(int64_t) * (size_t)K)))
      memcpy(cache->splits[K], out, sizeof(int64_t) * (size_t)K);
    return rc;
  }
  return pipe_balance(L, K, t_pro, t_layer, t_epi, out);
}

int64_t *plan_chunk_layers(Arena *arena, const SemModel *model, int64_t micro_batch, int64_t tp, int64_t cp, int sp,
                           int recompute, int64_t K, const char **why) {
  if (K < 1) K = 1;
  int64_t *out = arena_alloc(arena, sizeof(int64_t) * (size_t)K);
  int64_t L = model->layers;
  if (K > 1 && model->layout.balance == BALANCE_ENDS) {
    if (pipe_split_ends(L, K, out) != 0) {
      *why = arena_printf(arena, "%" PRId64 " layers and the two ends (embeddings, head) do not split equally into %" PRId64 " pipeline chunks", L, K);
      return NULL;
    }
    return out;
  }
  if (K == 1 || model->layout.balance == BALANCE_LAYERS) {
    if (K > 1 && (L < K || L % K)) {
      *why = arena_printf(arena, "%" PRId64 " layers do not split equally into %" PRId64 " pipeline chunks", L, K);
      return NULL;
    }
    for (int64_t i = 0; i < K; i++) out[i] = L / K;
    return out;
  }
  FILE *sink = fopen("/dev/null", "w");
  Diag *quiet = diag_new(sink ? sink : stderr);
  PlanCtx *c = plan_new(model, quiet);
  char err[512] = "";
  int rc = -1;
  if (c) {
    PlanKey key = {micro_batch > 0 ? micro_batch : 1, tp > 0 ? tp : 1, cp > 0 ? cp : 1, tp > 1 ? sp : 0,
                   recompute < 0 ? RECOMPUTE_NONE : recompute, 1, c->fused_ce, 0, 0, cp > 1 && c->cp_comm == 1};
    PlanParts *pp = plan_parts(c, &key);
    key.rl = recompute > 0 ? model->layout.recompute_layers : 0;
    if (!pp->valid) snprintf(err, sizeof err, "the planner cannot price the program to balance its stages: %s", pp->why);
    else if (pp->unit_w) { /* a forward cut into pieces: the split plan_exact calibrates on the priced chunks */
      PlanExact *e = plan_exact(c, &key, K);
      if (e->valid) memcpy(out, e->layers, sizeof(int64_t) * (size_t)K), rc = 0;
      else snprintf(err, sizeof err, "%s", e->why);
    } else rc = plan_split_layers(c, pp, K, out, err, sizeof err);
  } else {
    snprintf(err, sizeof err, "the planner cannot price the program to balance its stages");
  }
  plan_free(c);
  diag_free(quiet);
  if (sink) fclose(sink);
  if (rc != 0) {
    *why = arena_strdup(arena, err);
    return NULL;
  }
  return out;
}

/* Prices the K chunks of split `layers` of the partitioned program `part`
 * as compiled (ch[K], in arena a); 0 or -1 with why. */
static int price_split(PlanCtx *c, const PlanKey *k, int64_t K, const PlanParts *parts, const IrModule *part, Arena *a,
                       const int64_t *layers, PlanChunk *ch, char *why, size_t whylen) {
  PipeResult *pr = part ? pipe_split(a, quiet_diag(c), part, K, layers) : NULL;
  if (!pr) {
    snprintf(why, whylen, "the program does not split into %" PRId64 " pipeline chunks", K);
    return -1;
  }
  CostLink link[IRG_COUNT];
  int64_t gsize[IRG_COUNT];
  key_links(c, k->tp, k->cp, k->ep, k->ef, link, gsize);
  int ok = 1;
  if (K == 1) {
    ok = price_chunk_module(c, pr->m, (Recompute)k->rc, k->rl, k->ring, link, gsize, a, &ch[0], why, whylen) == 0;
  } else {
    for (int64_t i = 0; i < K && ok; i++) {
      int64_t same = -1;
      int kind = i == 0 ? PLAN_FIRST : i == K - 1 ? PLAN_LAST : PLAN_MIDDLE;
      for (int64_t j = 1; j < i && same < 0 && kind == PLAN_MIDDLE && !parts->unit_w; j++)
        if (layers[j] == layers[i]) same = j;
      if (same >= 0) {
        ch[i] = ch[same];
        continue;
      }
      IrModule *cm = pipe_chunk_module(a, pr, (int)i);
      ok = price_chunk_module(c, cm, (Recompute)k->rc, k->rl, k->ring, link, gsize, a, &ch[i], why, whylen) == 0;
    }
    /* a weight read by the first and the last chunk (tied embeddings) */
    if (ok) {
      IrModule *m0 = pipe_chunk_module(a, pr, 0), *m1 = pipe_chunk_module(a, pr, (int)K - 1);
      char *used = xalloc_calloc((size_t)pr->m->nparams + 1, 1);
      for (int i = 0; i < m0->graphs[0]->nnodes; i++)
        if (m0->graphs[0]->nodes[i].op == IR_PARAM) used[m0->graphs[0]->nodes[i].attr[0]] |= 1;
      for (int i = 0; i < m1->graphs[0]->nnodes; i++)
        if (m1->graphs[0]->nodes[i].op == IR_PARAM) used[m1->graphs[0]->nodes[i].attr[0]] |= 2;
      double shared = 0;
      for (int q = 0; q < pr->m->nparams; q++)
        if (used[q] == 3) shared += (double)ir_param_numel(&pr->m->params[q]);
      free(used);
      ch[0].shared_params = ch[K - 1].shared_params = shared;
    }
  }
  return ok ? 0 : -1;
}

static double slowest_chunk(const PlanChunk *ch, int64_t K) {
  double m = 0;
  for (int64_t i = 0; i < K; i++)
    if (ch[i].f.t + ch[i].b.t > m) m = ch[i].f.t + ch[i].b.t;
  return m;
}

/* Every chunk of a K-chunk split, as hpdlc compile builds them; a chunk
 * whose (kind, layers) an earlier one has is not priced again. A forward
 * cut into pieces is split on estimated piece times (plan_split_layers);
 * priced, each chunk's pieces are scaled by its priced / estimated time
 * (the estimate's error is the chunk's, not the piece's: GEMM efficiency,
 * the backward's own shapes) and split again, and the better of the two
 * splits kept, with the calibrated times in the parts for the next split. */
PlanExact *plan_exact(PlanCtx *c, const PlanKey *k, int64_t K) {
  for (PlanExact *e = c->exact; e; e = e->next)
    if (key_eq(&e->key, k) && e->K == K) return e;
  PlanExact *e = xalloc_calloc(1, sizeof *e);
  e->key = *k;
  e->K = K;
  e->next = c->exact;
  c->exact = e;
  e->layers = xalloc_calloc((size_t)K, sizeof(int64_t));
  e->ch = xalloc_calloc((size_t)K, sizeof(PlanChunk));
  PlanKey pk = *k; /* the parts price every layer under the policy, whatever the chunks' split */
  pk.rl = 0;
  PlanParts *parts = plan_parts(c, &pk);
  if (!parts->valid) {
    snprintf(e->why, sizeof e->why, "%s", parts->why);
    return e;
  }
  if (plan_split_layers(c, parts, K, e->layers, e->why, sizeof e->why) != 0) return e;
  /* the program, lowered and partitioned once for every split priced below */
  Arena *a = arena_new();
  IrModule *global = lowered_program(c, a, k);
  SpmdSpec spec = key_spec(c, k);
  IrModule *part = global ? spmd_partition(a, quiet_diag(c), global, &spec) : NULL;
  int ok = price_split(c, k, K, parts, part, a, e->layers, e->ch, e->why, sizeof e->why) == 0;
  if (ok && parts->unit_w && K > 1) {
    double *w = xalloc_calloc((size_t)parts->units, sizeof(double));
    memcpy(w, parts->unit_w, sizeof(double) * (size_t)parts->units);
    for (int64_t i = 0, u = 0; i < K; i++) {
      double est = 0, act = e->ch[i].f.t + e->ch[i].b.t;
      for (int64_t j = 0; j < e->layers[i]; j++) est += w[u + j];
      for (int64_t j = 0; j < e->layers[i]; j++)
        if (est > 0 && act > 0) w[u + j] *= act / est;
      u += e->layers[i];
    }
    int64_t *l2 = xalloc_calloc((size_t)K, sizeof(int64_t));
    PlanChunk *ch2 = xalloc_calloc((size_t)K, sizeof(PlanChunk));
    char why2[200];
    int differs = 0;
    if (pipe_balance_units(w, parts->units, K, l2) == 0)
      for (int64_t i = 0; i < K; i++) differs |= l2[i] != e->layers[i];
    if (differs && price_split(c, k, K, parts, part, a, l2, ch2, why2, sizeof why2) == 0 &&
        slowest_chunk(ch2, K) < slowest_chunk(e->ch, K)) {
      memcpy(e->layers, l2, sizeof(int64_t) * (size_t)K);
      memcpy(e->ch, ch2, sizeof(PlanChunk) * (size_t)K);
      memcpy(parts->unit_w, w, sizeof(double) * (size_t)parts->units);
    }
    free(w);
    free(l2);
    free(ch2);
  }
  arena_free(a);
  e->valid = ok;
  return e;
}

/* ------------------------------------------------------------------ */
/* context                                                              */

static double model_flops_mb(PlanCtx *c, int64_t mb, double *all) {
  for (int i = 0; i < c->nmf; i++)
    if (c->mf[i].mb == mb) {
      *all = c->mf[i].all;
      return c->mf[i].gemm;
    }
  /* the conventional count (Megatron-LM's and PaLM's formulas): every
   * query-key pair of the scores, causal or not, flash or not */
  Arena *a = arena_new();
  LowerOptions lo = {1, 1, 1};
  IrModule *g = lower_model_with(a, quiet_diag(c), c->model, mb, &lo);
  double gemm = 0, tot = 0;
  const char *err = NULL;
  AdResult *ad = g ? ad_build(g, RECOMPUTE_NONE, &err) : NULL;
  if (ad) {
    IrCost ic = ircost_graph(g, g->graphs[ad->step]);
    gemm = ic.flops_of[IRC_GEMM];
    tot = ic.flops;
  }
  arena_free(a);
  if (c->nmf == c->capmf) {
    c->capmf = c->capmf ? c->capmf * 2 : 8;
    c->mf = realloc(c->mf, sizeof(*c->mf) * (size_t)c->capmf);
    if (!c->mf) abort();
  }
  c->mf[c->nmf].mb = mb;
  c->mf[c->nmf].gemm = gemm;
  c->mf[c->nmf].all = tot;
  c->nmf++;
  *all = tot;
  return gemm;
}

/* The blocks' GEMMs under a low-precision format (docs/planner.md 9.3), on
 * the device's rate for it or the next format it has: NVFP4 without an FP4
 * rate and MXFP8 without Blackwell's block-scaled tensor cores fall back to
 * FP8 with per-tensor scales, FP8 without an FP8 rate to the 16-bit rate.
 * Per value: the operand a GEMM reads (its block scales included: MXFP8 an
 * 8-bit power of two a block of 32, NVFP4 an FP8 scale a block of 16), the
 * casts that make it from a 16-bit activation (bytes read and written), the
 * copy a GEMM-only activation keeps for the backward, the weights' gather. */
static void plan_set_lowp(PlanCtx *c) {
  double eb = c->act_bytes;
  Precision p = c->prec;
  if (p == PREC_NVFP4 && !(cat_peak_flops(&c->dev, "fp4") > 0)) p = PREC_FP8;
  if (p == PREC_MXFP8 && cost_gpu_generation(&c->dev) != COST_GEN_BLACKWELL) p = PREC_FP8;
  if (p == PREC_FP8 && !(cat_peak_flops(&c->dev, "fp8") > 0)) p = PREC_BF16;
  c->lowp_prec = sem_precision_priced_only(c->prec) ? p : c->prec;
  c->lowp = NULL;
  c->lowp_k0 = COST_GEMM_K_OVERHEAD;
  c->lowp_operand = c->lowp_cast = c->lowp_saved = eb;
  c->layer_gather_bytes = c->weight_bytes;
  if (p == PREC_FP8) {
    /* Transformer Engine's cast-transpose: read, write the value and its
     * transpose; under current scaling the tensor's amax is a pass of its own
     * before it (the scale must be known before the first value is cast),
     * where delayed scaling takes the amax inside the cast for the next step */
    c->lowp = "fp8";
    c->lowp_operand = c->lowp_saved = c->layer_gather_bytes = 1;
    c->lowp_cast = eb + 2 + (c->model->train.fp8_current ? eb : 0);
  } else if (p == PREC_MXFP8) {
    /* scales run along the contraction, so a row-wise and a column-wise copy
     * (each with its scales) take the transpose's place; weights gathered as
     * MXFP8 (Megatron-Bridge's bf16_with_mxfp8_mixed: fp8_param_gather) */
    double v = 1 + 1.0 / 32;
    c->lowp = "fp8";
    c->lowp_operand = c->lowp_saved = c->layer_gather_bytes = v;
    c->lowp_cast = eb + 2 * v;
  } else if (p == PREC_NVFP4) {
    /* the tensor's amax first (its per-tensor scale), then a row-wise copy
     * and the column-wise one of the Hadamard-rotated values the weight
     * gradient reads, in one pass; weights gathered in 16 bits (no FP4
     * parameters in Megatron-Core: fp4_param unsupported) */
    double v = 0.5 + 1.0 / 16;
    c->lowp = "fp4";
    c->lowp_operand = c->lowp_saved = v;
    c->lowp_cast = 2 * eb + 2 * v;
  }
  if (c->lowp) c->lowp_k0 = cost_gemm_k_overhead(&c->dev, c->lowp);
}

const char *plan_gemm_peak_name(const PlanCtx *c) { return c->lowp ? c->lowp : prec_name(c->prec); }

Precision plan_gemm_format(const PlanCtx *c) { return c->lowp_prec; }

const char *plan_device_name(const SemModel *model) { return model->has_cluster ? model->cluster.device : "cpu"; }

PlanCtx *plan_new(const SemModel *model, Diag *diag) {
  const char *dname = plan_device_name(model);
  const CatDevice *d = cat_device(dname);
  if (!d) {
    diag_error(diag, span_none, "the planner does not know the device '%s' of cluster %s", dname,
               model->layout.cluster_name ? model->layout.cluster_name : "?");
    return NULL;
  }
  PlanCtx *c = xalloc_calloc(1, sizeof *c);
  c->model = model;
  c->dev = *d;
  c->gemm_sustained = plan_gemm_sustained(d);
  c->overlap_slowdown = cost_overlap_slowdown(d);
  c->screen_bound = HUGE_VAL;
  if (model->has_cluster) c->cluster = model->cluster;
  else {
    const CatCluster *cc = cat_cluster("cpu");
    c->cluster.name = "cpu";
    c->cluster.device = "cpu";
    c->cluster.gpus_per_node = 1;
    c->cluster.nodes = 1;
    c->cluster.shared_device = 1;
    if (cc) {
      c->cluster.intra_bytes_per_s = cc->intra_bytes_per_s;
      c->cluster.intra_latency_s = cc->intra_latency_s;
    }
  }
  /* a device described by its cluster (a GPU the catalog lacks, as the
   * catalog device it is most like): its own figures where given */
  const SemCluster *fc = &c->cluster;
  for (int k = 0; k < SEM_FIG_COUNT; k++) {
    if (!(fc->described >> k & 1u)) continue;
    if (k == SEM_FIG_MEMORY) c->dev.mem_bytes = fc->figures[k];
    else if (k == SEM_FIG_MEMORY_BANDWIDTH) c->dev.hbm_bytes_per_s = fc->figures[k];
    else if (k == SEM_FIG_SMS) c->dev.sms = (int)fc->figures[k];
    else cat_set_peak_flops(&c->dev, sem_figure_keys[k], fc->figures[k]); /* the keys are the precisions' names */
  }
  /* a calibrated device: its figures as measured (docs/planner.md sec. 17) */
  double cs = c->cluster.compute_scale > 0 ? c->cluster.compute_scale : 1, ms = c->cluster.memory_scale > 0 ? c->cluster.memory_scale : 1;
  c->dev.peak_flops_fp64 *= cs;
  c->dev.peak_flops_fp32 *= cs;
  c->dev.peak_flops_tf32 *= cs;
  c->dev.peak_flops_bf16 *= cs;
  c->dev.peak_flops_fp16 *= cs;
  c->dev.peak_flops_fp8 *= cs;
  c->dev.peak_flops_fp4 *= cs;
  c->dev.hbm_bytes_per_s *= ms;
  const SemLayout *L = &model->layout;
  if (L->gpus_per_node > 0) c->cluster.gpus_per_node = L->gpus_per_node;
  c->gpus = L->gpus > 0 ? L->gpus : 1;
  /* Ranks that time-share one device (CPU cores) each get its share. */
  if (c->cluster.shared_device && c->cluster.gpus_per_node > 1) {
    double r = (double)c->cluster.gpus_per_node;
    c->dev.peak_flops_fp64 /= r;
    c->dev.peak_flops_fp32 /= r;
    c->dev.peak_flops_tf32 /= r;
    c->dev.peak_flops_bf16 /= r;
    c->dev.peak_flops_fp16 /= r;
    c->dev.peak_flops_fp8 /= r;
    c->dev.peak_flops_fp4 /= r;
    c->dev.hbm_bytes_per_s /= r;
    c->dev.mem_bytes /= r;
  }
  c->prec = model->train.precision;
  c->act_bytes = prec_bytes(c->prec);
  c->weight_bytes = prec_bytes(c->prec);
  plan_set_lowp(c);
  c->fusion = 1;
  c->fuse_opts = fuse_options(cost_gpu_generation(&c->dev) != COST_GEN_OTHER, 1);
  c->flash = 1;
  c->tp_overlap = L->tp_overlap != 0;
  c->cp_comm = L->cp_comm;
  c->vocab_pad = L->vocab_pad > 0 ? L->vocab_pad : 0;
  c->fused_ce = L->fused_ce == 1;
  FILE *sink = fopen("/dev/null", "w");
  c->sink = sink;
  c->quiet = diag_new(sink ? sink : stderr);
  c->arena = arena_new();
  /* the model's parameters, from its graph */
  Arena *a = arena_new();
  IrModule *g = lower_model(a, diag, model, model->train.micro_batch > 0 ? model->train.micro_batch : 1);
  if (!g) {
    arena_free(a);
    plan_free(c);
    return NULL;
  }
  c->params = (double)ircost_param_count(g);
  for (int i = 0; i < g->nparams; i++) {
    const IrParam *p = &g->params[i];
    if (p->shard != SHARD_EXPERT_COLUMN && p->shard != SHARD_EXPERT_ROW) continue;
    if (!p->state) c->expert_params += (double)ir_param_numel_all(p);
    int64_t x = c->experts, y = p->dims[0];
    while (y) { /* gcd */
      int64_t t = x % y;
      x = y;
      y = t;
    }
    c->experts = x;
  }
  sem_moe_route_groups(model, &c->route_groups, &c->route_group_top_k);
  for (int gi = 0; gi < g->ngraphs; gi++)
    for (int i = 0; i < g->graphs[gi]->nnodes; i++) {
      const IrNode *n = &g->graphs[gi]->nodes[i];
      if (n->op != IR_MOE_DISPATCH || n->nin < 2) continue;
      const IrNode *idx = &g->graphs[gi]->nodes[n->in[1]];
      if (idx->rank > 0 && idx->dims[idx->rank - 1] > c->top_k) c->top_k = idx->dims[idx->rank - 1];
    }
  c->moe_drops = moe_dropping(g) > 0;
  arena_free(a);
  return c;
}

/* Drops every cached price: the parts by key and the exact chunk prices. */
static void drop_prices(PlanCtx *c) {
  for (size_t i = 0; i < c->cap; i++) {
    for (int64_t k = 0; c->table[i] && c->table[i]->splits && k <= c->table[i]->layers; k++) free(c->table[i]->splits[k]);
    if (c->table[i]) free(c->table[i]->splits);
    if (c->table[i]) free(c->table[i]->unit_w);
    free(c->table[i]);
    c->table[i] = NULL;
  }
  c->count = 0;
  for (PlanExact *e = c->exact; e;) {
    PlanExact *n = e->next;
    free(e->layers);
    free(e->ch);
    free(e);
    e = n;
  }
  c->exact = NULL;
  c->selective_same = 0;
  c->act_same = 0;
  free(c->lowered);
  c->lowered = NULL;
  c->nlowered = c->caplowered = 0;
  if (c->lowered_arena) arena_free(c->lowered_arena);
  c->lowered_arena = NULL;
  parted_drop(c);
}

void plan_free(PlanCtx *c) {
  if (!c) return;
  drop_prices(c);
  free(c->table);
  free(c->mf);
  for (int i = 0; i < EV_COUNT; i++) free(c->evbuf[i].p); /* c->stages among them */
  fuse_cache_free(c->fuse_cache);
  for (int i = 0; i < c->nsim_memo; i++) {
    free(c->sim_memo[i].times);
    free(c->sim_memo[i].inflight);
  }
  if (c->quiet) diag_free(c->quiet);
  if (c->sink) fclose(c->sink);
  if (c->arena) arena_free(c->arena);
  free(c);
}

const SemModel *plan_model(const PlanCtx *c) { return c->model; }

void plan_set_attention(PlanCtx *c, int flash) {
  if (c->flash == (flash != 0)) return;
  drop_prices(c); /* they were made with the other kernel */
  c->flash = flash != 0;
}

int plan_attention_flash(const PlanCtx *c) { return c->flash; }

void plan_set_attention_kernel(PlanCtx *c, CostAttnKernel k) {
  if (c->attn_kernel == k) return;
  drop_prices(c); /* they were made with the other kernel */
  c->attn_kernel = k;
}

CostAttnKernel plan_attention_kernel(const PlanCtx *c) { return c->attn_kernel; }

void plan_set_fusion(PlanCtx *c, int on) {
  if (c->fusion == (on != 0)) return;
  drop_prices(c); /* they were made with the other program's kernels */
  c->fusion = on != 0;
  c->fuse_opts = fuse_options(cost_gpu_generation(&c->dev) != COST_GEN_OTHER, c->fusion);
}

int plan_fusion(const PlanCtx *c) { return c->fusion; }

int plan_reduces_after_backward(const PlanCtx *c, const PlanLayout *L) {
  return c->model->layout.engine == 1 && (L->pp * (L->vpp > 0 ? L->vpp : 1) > 1 || L->zero <= 1);
}

const char *plan_attention_name(const PlanCtx *c) {
  return c->flash ? cost_attn_kernel_name(c->attn_kernel) : "materialized";
}

void plan_set_explain(PlanCtx *c, int on) { c->explain = on != 0; }

void plan_set_evidence_all(PlanCtx *c, int on) { c->evidence_all = on != 0; }

int plan_evidence_all(const PlanCtx *c) { return c->evidence_all; }
void plan_set_progress(PlanCtx *c, struct Progress *p) { c->progress = p; }
int plan_explain_enabled(const PlanCtx *c) { return c->explain; }

int64_t plan_vocab(const PlanCtx *c, const PlanResult *r, int64_t *priced) {
  *priced = 0;
  /* the first vocab-split table, depth first */
  const SemLayer *stack[64];
  int n = 0;
  stack[n++] = c->model->model;
  while (n > 0) {
    const SemLayer *l = stack[--n];
    for (int i = 0; i < l->nparams; i++) {
      int64_t d = 0;
      if (l->params[i].shard == SHARD_VOCAB && l->params[i].type.rank > 0 && sym_is_const(l->params[i].type.dims[0], &d)) {
        *priced = r && r->valid && r->vocab_priced > 0 ? r->vocab_priced : d;
        return d;
      }
    }
    for (int i = l->nchildren - 1; i >= 0 && n < 64; i--) stack[n++] = l->children[i].layer;
  }
  return 0;
}
const CatDevice *plan_device(const PlanCtx *c) { return &c->dev; }
const SemCluster *plan_cluster(const PlanCtx *c) { return &c->cluster; }

const char *plan_device_figures(const PlanCtx *c, char *buf, size_t n) {
  const SemCluster *cl = &c->cluster;
  size_t used = 0;
  buf[0] = 0;
  for (int k = 0; k < SEM_FIG_COUNT && used < n; k++) {
    if (!(cl->described >> k & 1u)) continue;
    double v = cl->figures[k];
    char num[32];
    if (k == SEM_FIG_MEMORY) plan_fmt_bytes(num, sizeof num, v);
    else if (k == SEM_FIG_MEMORY_BANDWIDTH) snprintf(num, sizeof num, "%.4g GB/s", v / 1e9);
    else if (k == SEM_FIG_SMS) snprintf(num, sizeof num, "%.0f", v);
    else if (v > 0) snprintf(num, sizeof num, "%.6g TFLOP/s", v / 1e12);
    else snprintf(num, sizeof num, "none");
    int w = snprintf(buf + used, n - used, "%s%s %s", used ? ", " : "", sem_figure_keys[k], num);
    if (w < 0) break;
    used += (size_t)w;
  }
  return buf;
}
int64_t plan_gpus(const PlanCtx *c) { return c->gpus; }

/* hpdl's all-reduce of n gradient values compressed to 16 bits over `ranks`
 * (runtime/comm.c comm_allreduce_compressed): from PLAN_COMPRESS_RS_FROM
 * members (runtime/comm.h's COMM_COMPRESS_RS_FROM) an all-to-all of the
 * 16-bit slices, which moves what a reduce-scatter does, then an all-gather of
 * the fp32 sums; below it an all-gather of every member's 16-bit payload.
 * Seconds; adds the bytes a rank sends to *sent. */
enum { PLAN_COMPRESS_RS_FROM = 4 };
static double compressed_allreduce(double n, int ranks, const CostLink *link, double *sent) {
  if (ranks <= 1 || n <= 0) return 0;
  if (ranks >= PLAN_COMPRESS_RS_FROM) {
    if (sent)
      *sent += cost_collective_bytes_sent(COST_REDUCE_SCATTER, 2 * n, ranks, COST_ALGO_RING) +
               cost_collective_bytes_sent(COST_ALLGATHER, 4 * n, ranks, COST_ALGO_RING);
    return cost_reduce_scatter_s(2 * n, ranks, link, COST_ALGO_RING) + cost_allgather_s(4 * n, ranks, link, COST_ALGO_RING);
  }
  if (sent) *sent += cost_collective_bytes_sent(COST_ALLGATHER, 2 * n * ranks, ranks, COST_ALGO_RING);
  return cost_allgather_s(2 * n * ranks, ranks, link, COST_ALGO_RING);
}

/* Gradients are reduced in fp32, as hpdl's runtime reduces them (a
 * parameter's gradient stays fp32 under bf16 / fp16 / fp8) and FSDP with
 * reduce_dtype = float32 or Megatron-LM with grad_reduce_in_fp32 do; a layout
 * that rounds them to 16 bits moves 2 bytes a value, as FSDP's reduce_dtype =
 * bfloat16 does. int8 and top-k are not priced (planned as fp32). */
int plan_grad_reduce_bytes(Compression c) { return c == COMPRESS_BF16 || c == COMPRESS_FP16 ? 2 : 4; }

int plan_layout_folded(const PlanLayout *L) { return L->expert_fold > 0 && L->tp > 1 && L->ep > 1; }

int plan_layout_ring(const PlanLayout *L) { return L->cp > 1 && L->cp_comm == 1; }

PlanKey plan_layout_key(const PlanLayout *L, int64_t rl) {
  PlanKey k = {L->micro_batch, L->tp, L->cp, L->tp > 1 ? L->sp : 0, L->recompute, L->ep > 1 ? L->ep : 1, L->fused_ce == 1,
               rl, plan_layout_folded(L), plan_layout_ring(L)};
  return k;
}

PlanLayout plan_layout_of(const SemModel *m) {
  const SemLayout *L = &m->layout;
  PlanLayout p;
  p.dp = L->dp;
  p.tp = L->tp;
  p.pp = L->pp;
  p.cp = L->cp;
  p.vpp = L->virtual_stages;
  p.zero = L->zero;
  p.micro_batch = m->train.micro_batch;
  p.num_micro = L->num_micro_batches;
  p.sp = L->sp;
  p.schedule = L->schedule;
  p.recompute = L->recompute;
  p.overlap = L->overlap != 0;
  p.ep = L->ep; /* 0 or -1: --search chooses; plan_evaluate takes 1 */
  p.expert_fold = L->expert_tensor == 1 ? 1 : L->expert_tensor < 0 ? -1 : 0; /* -1: --search tries both */
  p.fused_ce = L->fused_ce; /* -1: auto */
  p.cp_comm = L->cp_comm;   /* -1: auto */
  /* with the policy left to the search, so is the number of layers */
  p.recompute_layers = L->recompute < 0 && L->recompute_layers <= 0 ? -1 : L->recompute_layers;
  return p;
}

/* ------------------------------------------------------------------ */
/* evaluation of one layout                                             */

static int fail(PlanResult *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(PlanResult *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->why, sizeof out->why, fmt, ap);
  va_end(ap);
  out->valid = 0;
  return -1;
}

static int kind_of(int64_t c, int64_t K) {
  if (K == 1) return PLAN_SINGLE;
  if (c == 0) return PLAN_FIRST;
  if (c == K - 1) return PLAN_LAST;
  return PLAN_MIDDLE;
}

/* Optimizer step bytes per local parameter: read the gradient, read and
 * write the fp32 master weights and each state (fp32, or bf16 under
 * moments = bf16), write the working copy (mixed precision); gradient
 * clipping reads the gradients once more. */
static double optimizer_bytes_per_param(const SemTrain *t) {
  int mixed = t->precision != PREC_FP32;
  double g = mixed ? 2 : 4;
  double states = t->optimizer == OPT_ADAMW ? 2 : (t->momentum > 0 ? 1 : 0);
  double b = g + 8 + 2 * (t->moments_bf16 ? 2 : 4) * states + (mixed ? 2 : 0);
  if (t->clip > 0) b += g;
  return b;
}

/* parallel.engine = deepspeed (DeepSpeed's pipeline engine, docs/planner.md sec. 11.1): a
 * transfer (t_sync: its piece's send and the gather after it) holds the sending and the
 * receiving rank while it runs. A chunk's forward then also takes the receive of its input
 * and the send of its output, its backward the same for the gradients (DeepSpeed's
 * TrainSchedule: a forward step sends the last gradient back and receives the next
 * activation, a backward step receives the gradient and sends the last activation on), one
 * transfer for each neighbour chunk: the rank time they add to each of a micro-batch's
 * passes over chunk ci of K. */
static double p2p_sync_s(int64_t ci, int64_t K, double t_sync) {
  return t_sync * (double)((ci > 0) + (ci < K - 1));
}

/* Whether DeepSpeed's BF16_Optimizer runs the step (engine = deepspeed, bf16, ZeRO 0-1):
 * fp32 copies of the gradients, kept whole, added into after every micro-batch. */
static int ds_bf16_optimizer(const PlanCtx *c, const PlanLayout *L) {
  return c->model->layout.engine == 1 && c->prec == PREC_BF16 && L->zero <= 1;
}

/* The rank time engine = deepspeed adds to each chunk's forward (tf) and backward (tb) of a
 * micro-batch: its blocking transfers (t_sync each, none with one chunk), and under the
 * BF16_Optimizer the pass that adds the chunk's bf16 gradients into their fp32 copies
 * (update_hp_grads: 2 bytes read, 4 read and 4 written a parameter) and zeroes them for the
 * next micro-batch (2 written): 12 bytes a parameter, memory-bound. */
static void ds_engine_times(const PlanCtx *c, const PlanLayout *L, const PlanChunk *const *ch, int64_t K,
                            double t_sync, double *tf, double *tb) {
  if (c->model->layout.engine != 1) return;
  int hp = ds_bf16_optimizer(c, L);
  double hbm = c->dev.hbm_bytes_per_s * COST_HBM_EFFICIENCY;
  for (int64_t ci = 0; ci < K; ci++) {
    if (K > 1) {
      tf[ci] += p2p_sync_s(ci, K, t_sync);
      tb[ci] += p2p_sync_s(ci, K, t_sync);
    }
    if (hp && hbm > 0) tb[ci] += ch[ci]->params * 12.0 / hbm;
  }
}

/* One DeepSpeed pipeline transfer of a boundary of `bytes` (this rank's value) over
 * the pipeline's link: with tensor parallelism and the boundary whole on every
 * tensor rank (no sequence parallelism), each rank sends its 1/tp piece and the
 * receiver gathers the pieces over the tensor group (DeepSpeed's pipe_partitioned /
 * grad_partitioned, on when the model-parallel group is > 1), the gather's time part
 * of the transfer. */
static double p2p_deepspeed_s(const PlanCtx *c, const PlanLayout *L, const CostLink *pplink, double bytes) {
  int64_t gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
  int64_t part = L->tp > 1 && !L->sp ? L->tp : 1;
  double t = cost_sendrecv_s(bytes / (double)part, pplink);
  if (part > 1) {
    CostLink tplink = cost_group_link(&c->cluster, (int)L->tp, (int)(L->tp < gpn ? L->tp : gpn));
    t += cost_allgather_s(bytes, (int)L->tp, &tplink, COST_ALGO_AUTO);
  }
  return t;
}

/* The simulated step of msim micro-batches: 0 with *sim filled (sched_sim_free it), or -1
 * with err. */
static int simulate_pipeline(Schedule kind, int pp, int64_t msim, int v, const double *tf, const double *tb,
                             double t_p2p, SchedSim *sim, char *err, size_t errlen) {
  SchedProgram prog;
  char why[256];
  if (sched_build(&prog, kind, pp, (int)msim, v, why, sizeof why) != 0) {
    snprintf(err, errlen, "schedule: %s", why);
    return -1;
  }
  SchedCosts sc = {0, 0, tf, tb, t_p2p, 0, 0};
  int rc = sched_simulate_costs(&prog, &sc, sim);
  sched_free(&prog);
  if (rc != 0) {
    if (rc > 0) sched_sim_free(sim);
    snprintf(err, errlen, "the schedule does not run (%s)", rc > 0 ? "deadlock" : "bad arguments");
    return -1;
  }
  return 0;
}

int plan_pipeline(Schedule kind, int pp, int64_t m, int v, const double *tf, const double *tb, double t_p2p, int full,
                  double *T, double *bubble_fraction, int *inflight, char *err, size_t errlen) {
  /* With many micro-batches simulate 3 pp and 4 pp of them and extend the
   * steady state by the time each further micro-batch adds between the two
   * (interleaving runs micro-batches in groups of pp; by 3 pp every
   * schedule is in its steady state); 1F1B without virtual stages needs one
   * simulation of 3 pp, its first rank finishing one micro-batch's backward
   * a period after the one before from the pp-th on. That time is the
   * slowest rank's forward and backward when transfers take no time, and
   * more when they are on the steady state's critical path (a 1F1B stage
   * waits for the next one's gradient): what the simulation says, not an
   * assumed bottleneck, and never less than it. Exact for uniform and
   * uneven stages, with and without transfers (tests/unit/test_plan.c). */
  int one_sim = kind == SCHED_1F1B && v == 1;
  int64_t lo = 3 * (int64_t)pp, hi = one_sim ? lo : 4 * (int64_t)pp;
  int extend = !full && m > hi;
  int64_t msim = extend ? hi : m;
  if (msim > 0x3fffffff) {
    snprintf(err, errlen, "too many micro-batches to simulate");
    return -1;
  }
  double Rmax = 0, busy = 0;
  for (int r = 0; r < pp; r++) {
    double R = 0;
    for (int64_t c = r; c < (int64_t)pp * v; c += pp) R += tf[c] + tb[c];
    if (R > Rmax) Rmax = R;
    busy += R * (double)m;
  }
  SchedSim sim;
  if (simulate_pipeline(kind, pp, msim, v, tf, tb, t_p2p, &sim, err, errlen) != 0) return -1;
  *T = sim.makespan;
  if (extend) {
    double period = Rmax;
    if (one_sim) {
      /* rank 0's backward of micro-batch pp - 1 and of 2 pp - 1: pp periods apart */
      double b1 = -1, b2 = -1;
      for (int i = 0; i < sim.n_events; i++) {
        const SchedEvent *e = &sim.events[i];
        if (e->rank != 0 || e->op != SCHED_OP_BWD) continue;
        if (e->mb == pp - 1) b1 = e->end;
        if (e->mb == 2 * pp - 1) b2 = e->end;
      }
      if (b1 >= 0 && b2 >= b1) period = (b2 - b1) / (double)pp;
    } else {
      SchedSim s3;
      if (simulate_pipeline(kind, pp, lo, v, tf, tb, t_p2p, &s3, err, errlen) != 0) {
        sched_sim_free(&sim);
        return -1;
      }
      period = (sim.makespan - s3.makespan) / (double)(hi - lo);
      sched_sim_free(&s3);
    }
    /* never less than the slowest rank's work a micro-batch (a schedule whose warm-up
     * outlasts 3 pp micro-batches, interleaving many chunks, is not yet periodic there) */
    if (period < Rmax) period = Rmax;
    *T += (double)(m - msim) * period;
  }
  for (int r = 0; r < pp; r++) inflight[r] = sim.peak_inflight[r];
  *bubble_fraction = msim == m ? sim.bubble_fraction : 1 - busy / ((double)pp * *T);
  sched_sim_free(&sim);
  return 0;
}

/* A pipeline rank's parameters: all of them, its expert shards (sec. 11.3a:
 * summed over the nedp ranks that hold the same experts) and the dense rest
 * (over ndp). */
static void stage_params(const PlanStage *s, const PlanLayout *L, const PlanParts *pp, double *all, double *expert,
                         double *dense) {
  *all = s->params;
  *expert = L->ep > 1 ? (double)s->layers * pp->layer_expert_params : 0;
  if (*expert > *all) *expert = *all;
  *dense = *all - *expert;
}

/* plan_pipeline through PlanCtx.sim_memo: the same input (schedule, shape,
 * chunk times to the bit, transfer time) gives the result kept, else it is
 * simulated and kept in place of the oldest. */
static int simulate_memo(PlanCtx *c, Schedule kind, int pp, int64_t m, int v, const double *tf, const double *tb,
                         double t_p2p, int full, double *T, double *bubble_fraction, int *inflight, char *err,
                         size_t errlen) {
  int64_t K = (int64_t)pp * v;
  int n = (int)(sizeof c->sim_memo / sizeof c->sim_memo[0]);
  for (int i = 0; i < c->nsim_memo; i++) {
    struct PlanSimMemo *e = &c->sim_memo[i];
    if (e->kind != (int)kind || e->pp != pp || e->v != v || e->full != full || e->m != m || e->K != K ||
        memcmp(&e->t_p2p, &t_p2p, sizeof t_p2p) || memcmp(e->times, tf, sizeof(double) * (size_t)K) ||
        memcmp(e->times + K, tb, sizeof(double) * (size_t)K))
      continue;
    *T = e->T;
    *bubble_fraction = e->bubble_fraction;
    memcpy(inflight, e->inflight, sizeof(int) * (size_t)pp);
    return 0;
  }
  if (plan_pipeline(kind, pp, m, v, tf, tb, t_p2p, full, T, bubble_fraction, inflight, err, errlen) != 0) return -1;
  int slot = c->nsim_memo < n ? c->nsim_memo++ : c->sim_memo_next;
  c->sim_memo_next = (slot + 1) % n;
  struct PlanSimMemo *e = &c->sim_memo[slot];
  free(e->times);
  free(e->inflight);
  *e = (struct PlanSimMemo){(int)kind, pp, v, full, m, K, t_p2p, xalloc_malloc(sizeof(double) * (size_t)(2 * K)),
                            *T, *bubble_fraction, xalloc_malloc(sizeof(int) * (size_t)pp)};
  memcpy(e->times, tf, sizeof(double) * (size_t)K);
  memcpy(e->times + K, tb, sizeof(double) * (size_t)K);
  memcpy(e->inflight, inflight, sizeof(int) * (size_t)pp);
  return 0;
}

/* plan_evaluate's working array `which` (EV_*) of at least `bytes`, zeroed
 * when asked (PlanCtx.evbuf: valid until the next evaluation). */
static void *ev_buf(PlanCtx *c, int which, size_t bytes, int zero) {
  if (bytes < 1) bytes = 1;
  if (bytes > c->evbuf[which].cap) {
    size_t cap = 2 * c->evbuf[which].cap;
    if (cap < bytes) cap = bytes;
    free(c->evbuf[which].p);
    c->evbuf[which].p = xalloc_malloc(cap);
    c->evbuf[which].cap = cap;
  }
  if (zero) memset(c->evbuf[which].p, 0, bytes);
  return c->evbuf[which].p;
}

int plan_evaluate(PlanCtx *c, const PlanLayout *Lin, unsigned flags, PlanResult *out) {
  PlanLayout L = *Lin; /* before clearing out: Lin may point into it */
  memset(out, 0, sizeof *out);
  const SemModel *m = c->model;
  out->layout = L;
  out->gpus = c->gpus;
  out->seq_len = m->seq_len > 0 ? m->seq_len : 1;
  out->params = c->params;
  if (L.dp < 1 || L.tp < 1 || L.pp < 1 || L.cp < 1 || L.micro_batch < 1 || L.zero < 0 || L.zero > 3 || L.sp < 0 ||
      L.schedule < 0 || L.recompute < 0 || L.fused_ce < 0 || L.recompute_layers < 0)
    return fail(out, "the layout has auto fields");
  if (L.recompute == RECOMPUTE_NONE) L.recompute_layers = 0;
  if (L.vpp < 1) L.vpp = 1;
  if (L.dp * L.tp * L.pp * L.cp != c->gpus)
    return fail(out, "dp x tp x pp x cp = %" PRId64 " is not the %" PRId64 " GPUs", L.dp * L.tp * L.pp * L.cp, c->gpus);
  if (L.ep < 1) L.ep = 1;
  int fold = plan_layout_folded(&L);
  if (L.ep > 1) {
    if (fold && (L.ep % L.tp || L.dp % (L.ep / L.tp)))
      return fail(out, "a folded expert group (expert_tensor = 1) needs ep = %" PRId64 " a multiple of tp = %" PRId64
                       " whose quotient divides dp = %" PRId64,
                  L.ep, L.tp, L.dp);
    if (!fold && L.dp % L.ep) return fail(out, "expert parallelism %" PRId64 " does not divide dp = %" PRId64, L.ep, L.dp);
    if (c->experts <= 0) return fail(out, "expert parallelism needs experts (std/moe), and the model has none");
    if (c->experts % L.ep) return fail(out, "%" PRId64 " experts do not divide over expert parallelism %" PRId64, c->experts, L.ep);
  }
  int64_t B = c->batch_override > 0 ? c->batch_override
              : m->train.global_batch > 0 ? m->train.global_batch : L.dp * L.micro_batch;
  if (B % (L.dp * L.micro_batch) != 0)
    return fail(out, "the global batch %" PRId64 " is not divisible by dp x micro_batch", B);
  L.num_micro = B / (L.dp * L.micro_batch);
  out->layout = L;
  out->global_batch = B;
  if (L.schedule == SCHED_INTERLEAVED && L.vpp < 2) return fail(out, "interleaving needs virtual stages >= 2");
  if (L.schedule != SCHED_INTERLEAVED && L.vpp > 1) return fail(out, "virtual stages need the interleaved schedule");
  if (L.pp > 1 && L.schedule == SCHED_INTERLEAVED && L.num_micro % L.pp != 0)
    return fail(out, "interleaving needs the micro-batches (%" PRId64 ") divisible by pp", L.num_micro);
  /* what DeepSpeed's pipeline engine runs (docs/planner.md sec. 11.1; sema_blocks.c says why) */
  if (c->model->layout.engine == 1 && L.pp > 1 && (L.zero >= 2 || L.schedule != SCHED_1F1B))
    return fail(out, "engine = deepspeed runs ZeRO 0-1 and the 1F1B schedule under pipeline parallelism");
  int64_t K = L.pp * L.vpp;
  if (L.cp_comm < 0) L.cp_comm = 0; /* auto outside a search: the gathered program */
  out->layout.cp_comm = L.cp_comm;
  PlanKey key = plan_layout_key(&L, 0);
  /* the screening's parts price every layer under the policy and mix in the
   * kept ones (chunk_from_parts_mixed); the exact chunks are built split */
  PlanKey exact_key = key;
  exact_key.rl = L.recompute_layers;
  PlanParts *pp = plan_parts(c, &key);
  if (!pp->valid) return fail(out, "%s", pp->why);
  out->vocab_priced = pp->vocab_padded;
  int64_t *split = ev_buf(c, EV_SPLIT, (size_t)K * sizeof(int64_t), 1);
  char swhy[200];
  if (plan_split_layers(c, pp, K, split, swhy, sizeof swhy) != 0) return fail(out, "%s", swhy);
  /* the chunks: chunk ci is *kp[ci], kinds[ci] or a run's first (its own layer count) */
  /* not zeroed: every chunk a kp[] names is written below (a search's
   * screening prices a few of K = pp x v, and zeroing them all was a tenth
   * of its time) */
  PlanChunk *kinds = ev_buf(c, EV_KINDS, (size_t)K * sizeof(PlanChunk), 0);
  const PlanChunk **kp = ev_buf(c, EV_KP, (size_t)K * sizeof(PlanChunk *), 0);
  for (int64_t ci = 0; ci < K; ci++) kp[ci] = &kinds[ci];
  if ((flags & PLAN_FAST) && !(pp->unit_w && K > 1)) {
    /* recompute_layers: the kept layers priced from the key without recomputation */
    int64_t rl = L.recompute_layers;
    PlanParts *keep = NULL;
    if (rl > 0 && L.recompute != RECOMPUTE_NONE) {
      PlanKey kk = key;
      kk.rc = RECOMPUTE_NONE;
      keep = plan_parts(c, &kk);
      if (!keep->valid) keep = NULL;
    }
    for (int64_t ci = 0; ci < K; ci++) {
      /* the middle chunks hold one of two layer counts, in runs: priced once a run */
      if (ci > 1 && ci < K - 1 && split[ci] == split[ci - 1]) kp[ci] = kp[ci - 1];
      else chunk_from_parts_mixed(pp, keep, kind_of(ci, K), split[ci], rl, &kinds[ci]);
    }
  } else if (flags & PLAN_FAST) {
    /* the search's screening of a forward cut into pieces: each chunk the
     * whole program's price times its pieces' share of the estimated time
     * (the layouts it keeps are priced as compiled) */
    PlanChunk whole;
    plan_chunk_from_parts(pp, PLAN_SINGLE, pp->layers, &whole);
    double total = 0;
    for (int64_t u = 0; u < pp->units; u++) total += pp->unit_w[u];
    for (int64_t ci = 0, u = 0; ci < K; ci++) {
      double w = 0;
      for (int64_t j = 0; j < split[ci]; j++) w += pp->unit_w[u + j];
      u += split[ci];
      double share = total > 0 ? w / total : 1.0 / (double)K;
      PlanChunk *ch = &kinds[ci];
      memset(ch, 0, sizeof *ch);
      plan_cost_add(&ch->f, &whole.f, share);
      plan_cost_add(&ch->b, &whole.b, share);
      ch->saved = whole.saved * share;
      ch->peak = whole.peak * share;
      ch->params = whole.params * share;
      ch->p2p_bytes = pp->boundary_bytes;
    }
  } else {
    PlanExact *e = plan_exact(c, &exact_key, K);
    if (!e->valid) return fail(out, "%s", e->why);
    memcpy(kinds, e->ch, sizeof(PlanChunk) * (size_t)K);
    memcpy(split, e->layers, sizeof(int64_t) * (size_t)K); /* a cut forward's split, calibrated there */
  }
  if (pp->unit_w && K > 1) { /* the stages count the forward's pieces they run */
    out->by_pieces = 1;
    for (int64_t ci = 0; ci < K; ci++) kinds[ci].layers = split[ci];
  }
  /* the middle ranks alike (the screening prices one of them): their chunks
   * all middle ones of one layer count, interleaved or not (a rank's first
   * chunk is the model's first on rank 0 only, its last the model's last on
   * rank pp - 1 only) */
  int uniform = 1;
  for (int64_t ci = 0; ci < K; ci++)
    if (split[ci] != split[K > 2 ? 1 : 0] && ci > 0 && ci < K - 1) uniform = 0;
  if (pp->unit_w) uniform = 0;
  /* groups and links (rank order tp, cp, dp, pp) */
  int64_t gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
  int64_t inner = L.tp * L.cp;
  /* the gradients and the ZeRO shards span data x context ranks (Megatron-LM
   * folds the context group into the data-parallel one for them) */
  int64_t ndp = L.dp * L.cp;
  int64_t rdp = L.tp >= gpn ? 1 : (ndp < gpn / L.tp ? ndp : gpn / L.tp);
  if (rdp < 1) rdp = 1;
  CostLink dplink = cost_group_link(&c->cluster, (int)ndp, (int)rdp);
  /* expert shards are reduced (and ZeRO-sharded) over the ranks holding the
   * same experts: every ep-th data-parallel rank, tp x cp x ep apart; folded,
   * every (ep / tp)-th, ep x cp ranks apart */
  int64_t ep_dp = fold ? L.ep / L.tp : L.ep, ep_span = fold ? L.ep * L.cp : L.tp * L.cp * L.ep;
  int64_t nedp = L.ep > 1 ? ndp / ep_dp : ndp, redp = ep_span >= gpn ? 1 : gpn / ep_span;
  if (redp > nedp) redp = nedp;
  CostLink edplink = L.ep > 1 ? cost_group_link(&c->cluster, (int)nedp, (int)redp) : dplink;
  CostLink pplink = cost_group_link(&c->cluster, 2, inner * L.dp < gpn ? 2 : 1);
  int pp_n = (int)L.pp, v = (int)L.vpp;
  int64_t mmb = L.num_micro;
  /* per-chunk times */
  double *tf = ev_buf(c, EV_TF, (size_t)K * sizeof(double), 0), *tb = ev_buf(c, EV_TB, (size_t)K * sizeof(double), 0);
  for (int64_t ci = 0; ci < K; ci++) {
    const PlanChunk *ch = kp[ci];
    tf[ci] = ch->f.t;
    tb[ci] = ch->b.t;
  }
  double p2p_bytes = K > 1 ? kinds[0].p2p_bytes : 0;
  double t_p2p = K > 1 ? cost_sendrecv_s(p2p_bytes, &pplink) : 0;
  out->p2p_s = t_p2p;
  /* engine = deepspeed (docs/planner.md sec. 11.1): its transfers are rank time, none left
   * in flight while a rank computes, and its BF16_Optimizer's pass over the gradients */
  int ds = m->layout.engine == 1, ds_hp = ds_bf16_optimizer(c, &L);
  int p2p_sync = ds && K > 1;
  double t_sync = p2p_sync ? p2p_deepspeed_s(c, &L, &pplink, p2p_bytes) : 0;
  out->p2p_sync_s = t_sync;
  ds_engine_times(c, &L, kp, K, t_sync, tf, tb);
  double t_lag = p2p_sync ? 0 : t_p2p;
  /* per pipeline rank */
  /* Ranks priced: all of them, or in the search's screening the first, one
   * middle rank (standing for pp - 2 identical ones) and the last - whose
   * entries alone are then cleared and filled (the screening's result keeps
   * no stages): clearing all pp of them was most of a 1T search's memset. */
  int reps = (flags & PLAN_FAST) && !(flags & PLAN_ALL_RANKS) && pp_n > 3 && uniform;
  c->nstages = reps ? 0 : pp_n;
  /* a result's stages stay valid until the next evaluation */
  c->stages = ev_buf(c, EV_STAGES, (size_t)pp_n * sizeof(PlanStage), !reps);
  PlanStage *st = c->stages;
  int nrep = 0, *rep = ev_buf(c, EV_REP, (size_t)pp_n * sizeof(int), 0);
  double *wrep = ev_buf(c, EV_WREP, (size_t)pp_n * sizeof(double), 0);
  if (reps) {
    rep[0] = 0, wrep[0] = 1;
    rep[1] = 1, wrep[1] = pp_n - 2;
    rep[2] = pp_n - 1, wrep[2] = 1;
    nrep = 3;
    for (int ri = 0; ri < nrep; ri++) memset(&st[rep[ri]], 0, sizeof *st);
  } else {
    for (int r = 0; r < pp_n; r++) rep[r] = r, wrep[r] = 1;
    nrep = pp_n;
  }
  double Rmax = 0, Rsum = 0;
  int rmax = 0;
  for (int ri = 0; ri < nrep; ri++) {
    int r = rep[ri];
    for (int64_t ci = r; ci < K; ci += pp_n) {
      st[r].fwd_s += tf[ci];
      st[r].bwd_s += tb[ci];
      st[r].params += kp[ci]->params;
      st[r].layers += kp[ci]->layers;
    }
    double R = st[r].fwd_s + st[r].bwd_s;
    st[r].busy_s = R * (double)mmb;
    Rsum += R * wrep[ri];
    if (R > Rmax) Rmax = R, rmax = r;
  }
  /* the pipeline */
  double T_pipe = 0, bubble_fraction = 0;
  int *inflight = ev_buf(c, EV_INFLIGHT, (size_t)pp_n * sizeof(int), !reps); /* reps: set below, each rep's */
  if (pp_n == 1) {
    T_pipe = (double)mmb * Rmax;
    inflight[0] = L.schedule == SCHED_GPIPE ? (int)mmb : 1;
    out->simulated = 1;
  } else if (flags & PLAN_FAST) {
    /* closed form: the slowest rank sets the steady state; the pipeline
     * fills and drains over (p-1)/v of a mean rank's micro-batch, plus the
     * transfers along it (Narayanan et al. 2021 Sec. 2.2, uneven stages) */
    T_pipe = (double)mmb * Rmax + (double)(pp_n - 1) / v * (Rsum / pp_n) + 2.0 * (pp_n - 1) * t_lag;
    double busy_mean = Rsum / pp_n * (double)mmb;
    bubble_fraction = 1 - busy_mean / T_pipe;
    for (int ri = 0; ri < nrep; ri++) {
      int r = rep[ri];
      int w = sched_warmup((Schedule)L.schedule, pp_n, (int)(mmb < 1 << 30 ? mmb : 1 << 30), v, r);
      inflight[r] = L.schedule == SCHED_GPIPE ? (int)(mmb * v) : (w < 0 ? 1 : w + 1);
      if (L.schedule != SCHED_GPIPE && inflight[r] > mmb * v) inflight[r] = (int)(mmb * v);
    }
  } else {
    char err[256];
    if (simulate_memo(c, (Schedule)L.schedule, pp_n, mmb, v, tf, tb, t_lag, (flags & PLAN_FULL_SIM) != 0, &T_pipe,
                      &bubble_fraction, inflight, err, sizeof err) != 0) {
      return fail(out, "%s", err);
    }
    out->simulated = 1;
  }
  if (bubble_fraction < 0) bubble_fraction = 0;
  /* data parallelism, ZeRO, the optimizer, memory per rank */
  const SemTrain *tr = &m->train;
  OptimizerKind ok = tr->optimizer;
  double grad_b = plan_grad_reduce_bytes(m->layout.compression);
  double opt_bpp = optimizer_bytes_per_param(tr);
  double worst_dp_exposed = 0, worst_dp_s = 0, worst_dp_sent = 0, worst_opt = 0, worst_z3 = 0, worst_z3_exposed = 0;
  double worst_ag_exposed = 0, emb_s = 0, emb_sent = 0;
  double worst_total = -1;
  double hbm = c->dev.hbm_bytes_per_s * COST_HBM_EFFICIENCY;
  /* memory per rank first, then time: a search's layout that does not fit,
   * or whose pipeline alone is slower than every layout it keeps, needs no
   * more time (PLAN_FIT_FIRST) */
  /* ZeRO-3's gather buffers: the layer being used and the one prefetched */
  double z3_bucket = ndp > 1 && L.zero == 3 ? 2 * pp->layer_params * c->layer_gather_bytes : 0;
  for (int ri = 0; ri < nrep; ri++) {
    int r = rep[ri];
    PlanStage *s = &st[r];
    double params_r, expert_r, dense_r;
    stage_params(s, &L, pp, &params_r, &expert_r, &dense_r);
    double grad_bytes = params_r * grad_b;
    int sgd_m = tr->momentum > 0;
    int mbytes = tr->moments_bf16 ? 2 : 4;
    CostModelStates ms = cost_model_states_m((int64_t)dense_r, (int)L.zero, (int)ndp, c->prec, ok, sgd_m, mbytes);
    if (expert_r > 0) { /* expert shards' states, sharded over their nedp ranks */
      CostModelStates me = cost_model_states_m((int64_t)expert_r, (int)L.zero, (int)nedp, c->prec, ok, sgd_m, mbytes);
      ms.params += me.params, ms.grads += me.grads, ms.optimizer += me.optimizer, ms.total += me.total;
    }
    /* DeepSpeed's BF16_Optimizer keeps the fp32 gradients whole beside the bf16 ones ("it
     * doesn't shard the static fp32 buffer it reuses": BLOOM's README) */
    if (ds_hp) ms.grads += params_r * 4, ms.total += params_r * 4;
    double saved_max = 0, peak_max = 0;
    for (int64_t ci = r; ci < K; ci += pp_n) {
      const PlanChunk *ch = kp[ci];
      if (ch->saved > saved_max) saved_max = ch->saved;
      if (ch->peak > peak_max) peak_max = ch->peak;
    }
    int inf = inflight[r] > 0 ? inflight[r] : 1;
    PlanMemory *mem = &s->mem;
    mem->params = ms.params;
    mem->grads = ms.grads;
    mem->optimizer = ms.optimizer;
    mem->activations = held_activations(kp, r, pp_n, v, inf);
    mem->transient = peak_max - saved_max > 0 ? peak_max - saved_max : 0;
    double buckets = 0;
    if (ndp > 1 && L.zero < 3) buckets = grad_bytes < 2 * PLAN_DP_BUCKET_BYTES ? grad_bytes : 2 * PLAN_DP_BUCKET_BYTES;
    if (ndp > 1 && L.zero == 3) buckets = z3_bucket;
    if (pp_n > 1) buckets += 2 * p2p_bytes;
    mem->comm_buffers = buckets;
    mem->workspace = (c->cluster.shared_device ? 0 : PLAN_WORKSPACE_BYTES) +
                     PLAN_FRAGMENTATION * (mem->activations + mem->transient);
    mem->total = mem->params + mem->grads + mem->optimizer + mem->activations + mem->transient + mem->comm_buffers +
                 mem->workspace;
    mem->capacity = c->dev.mem_bytes;
    mem->fits = mem->total <= mem->capacity;
    mem->rank = r;
    mem->rank_params = s->params;
    mem->inflight = inf;
    if (mem->total > worst_total) {
      worst_total = mem->total;
      out->mem = *mem;
    }
  }
  if ((flags & PLAN_FIT_FIRST) && (!out->mem.fits || T_pipe > c->screen_bound)) { /* the step is T_pipe and more */
    out->step_s = HUGE_VAL;
    out->valid = 1;
    return 0;
  }
  for (int ri = 0; ri < nrep; ri++) {
    int r = rep[ri];
    PlanStage *s = &st[r];
    double params_r, expert_r, dense_r;
    stage_params(s, &L, pp, &params_r, &expert_r, &dense_r);
    double grad_bytes = params_r * grad_b, dense_gb = dense_r * grad_b, expert_gb = expert_r * grad_b;
    double fwd1 = s->fwd_s, bwd1 = s->bwd_s;
    double dp_s = 0, dp_exposed = 0, dp_sent = 0, ag_exposed = 0, z3_s = 0, z3_exposed = 0;
    /* a collective hidden behind compute still slows the GEMMs it runs beside
     * (cost_overlap_slowdown: Hopper's persistent GEMMs in two waves) */
    /* DeepSpeed reduces after the last micro-batch's backward (ZeRO 2-3 without a pipeline
     * reduce in the backward's hooks): nothing to hide it under */
    int ovl = L.overlap && !plan_reduces_after_backward(c, &L);
    double kap = ovl ? c->overlap_slowdown : 0;
    if (ndp > 1) {
      if (L.zero <= 2) {
        double coll, t_last_bucket, bk = grad_bytes < PLAN_DP_BUCKET_BYTES ? grad_bytes : PLAN_DP_BUCKET_BYTES;
        if (L.zero == 0 && grad_b == 2) {
          /* hpdl's 16-bit compressed all-reduce (runtime/comm.c), whose sums are fp32 */
          coll = compressed_allreduce(dense_r, (int)ndp, &dplink, &dp_sent) +
                 compressed_allreduce(expert_r, (int)nedp, &edplink, &dp_sent);
          t_last_bucket = compressed_allreduce(bk / 2, (int)ndp, &dplink, NULL);
        } else if (L.zero == 0) {
          coll = cost_allreduce_s(dense_gb, (int)ndp, &dplink, COST_ALGO_AUTO) +
                 cost_allreduce_s(expert_gb, (int)nedp, &edplink, COST_ALGO_AUTO);
          dp_sent = cost_collective_bytes_sent(COST_ALLREDUCE, dense_gb, (int)ndp,
                                               cost_pick_algo(COST_ALLREDUCE, dense_gb, (int)ndp, &dplink)) +
                    cost_collective_bytes_sent(COST_ALLREDUCE, expert_gb, (int)nedp,
                                               cost_pick_algo(COST_ALLREDUCE, expert_gb, (int)nedp, &edplink));
          t_last_bucket = cost_allreduce_s(bk, (int)ndp, &dplink, COST_ALGO_AUTO);
        } else {
          /* ZeRO 1/2: reduce-scatter the gradients, all-gather the updated
           * weights (the same volume as an all-reduce, ZeRO paper Sec. 7) */
          coll = cost_reduce_scatter_s(dense_gb, (int)ndp, &dplink, COST_ALGO_RING) +
                 cost_reduce_scatter_s(expert_gb, (int)nedp, &edplink, COST_ALGO_RING);
          /* DeepSpeed's BF16_Optimizer (ZeRO 1): the fp32 gradients all-reduced whole
           * (buffered_allreduce_fallback), its shard then updated and gathered */
          if (ds_hp)
            coll = cost_allreduce_s(dense_gb, (int)ndp, &dplink, COST_ALGO_AUTO) +
                   cost_allreduce_s(expert_gb, (int)nedp, &edplink, COST_ALGO_AUTO);
          /* the blocks' weights move as FP8 under fp8 (layer_gather_bytes), the rest as stored */
          double blocks_d = (double)s->layers * pp->layer_params - expert_r;
          if (blocks_d < 0) blocks_d = 0;
          if (blocks_d > dense_r) blocks_d = dense_r;
          double wb = blocks_d * c->layer_gather_bytes + (dense_r - blocks_d) * c->weight_bytes;
          double wbe = expert_r * c->layer_gather_bytes;
          double ag = cost_allgather_s(wb, (int)ndp, &dplink, COST_ALGO_RING) + cost_allgather_s(wbe, (int)nedp, &edplink, COST_ALGO_RING);
          dp_sent = cost_collective_bytes_sent(ds_hp ? COST_ALLREDUCE : COST_REDUCE_SCATTER,
                                               dense_gb, (int)ndp, COST_ALGO_RING) +
                    cost_collective_bytes_sent(COST_ALLGATHER, wb, (int)ndp, COST_ALGO_RING) +
                    cost_collective_bytes_sent(COST_REDUCE_SCATTER, expert_gb, (int)nedp, COST_ALGO_RING) +
                    cost_collective_bytes_sent(COST_ALLGATHER, wbe, (int)nedp, COST_ALGO_RING);
          t_last_bucket = cost_reduce_scatter_s(bk, (int)ndp, &dplink, COST_ALGO_RING);
          /* the gather of the weights can run under the next step's first forward */
          ag_exposed = ovl ? (ag > fwd1 ? ag - fwd1 : 0) : ag;
          ag_exposed += kap * (ag - ag_exposed);
          dp_s += ag;
        }
        /* overlap: gradients are final only in the last micro-batch's
         * backward; buckets reduce while it runs, the last bucket after it */
        double ex = coll;
        if (ovl) {
          ex = coll - bwd1;
          if (ex < t_last_bucket) ex = t_last_bucket;
          if (ex > coll) ex = coll;
          ex += kap * (coll - ex);
        }
        dp_s += coll;
        dp_exposed = ex;
      } else {
        /* ZeRO-3 as PyTorch FSDP (FULL_SHARD, one unit per block) and
         * DeepSpeed run it (docs/planner.md sec. 11.4): per micro-batch each
         * layer's weights are all-gathered for its forward and again for its
         * backward (a recomputing backward keeps them through its recomputed
         * forward), and its gradients reduce-scattered; the embeddings and
         * head are one more unit. The gather of the next layer runs while
         * this one computes (prefetch), the reduce-scatter of a layer's
         * gradients while the layer before it runs backward, so each layer
         * exposes only what its compute does not cover; the first gather
         * and the last reduce-scatter wait. Overlap off: all exposed. */
        int n = (int)ndp;
        double nl = (double)s->layers;
        /* a layer's expert shards are pieces over the nedp ranks holding them */
        double le = L.ep > 1 ? pp->layer_expert_params : 0;
        if (le > pp->layer_params) le = pp->layer_params;
        double ld = pp->layer_params - le; /* its dense weights */
        double oparams = params_r - nl * pp->layer_params;
        if (oparams < 0) oparams = 0;
        /* a block's weights gathered at layer_gather_bytes (FP8 under fp8), the rest as
         * stored; the gradients' reduce-scatter moves grad_b bytes a value */
        double lbytes_e = le * c->layer_gather_bytes, lbytes_d = ld * c->layer_gather_bytes;
        double obytes = oparams * c->weight_bytes;
        double ag_l = cost_allgather_s(lbytes_d, n, &dplink, COST_ALGO_RING) +
                      cost_allgather_s(lbytes_e, (int)nedp, &edplink, COST_ALGO_RING);
        double rs_l = cost_reduce_scatter_s(grad_b * ld, n, &dplink, COST_ALGO_RING) +
                      cost_reduce_scatter_s(grad_b * le, (int)nedp, &edplink, COST_ALGO_RING);
        double ag_o = cost_allgather_s(obytes, n, &dplink, COST_ALGO_RING);
        double rs_o = cost_reduce_scatter_s(grad_b * oparams, n, &dplink, COST_ALGO_RING);
        double per_mb = nl * (2 * ag_l + rs_l) + 2 * ag_o + rs_o;
        double ex_mb = per_mb;
        if (L.overlap) {
          double xf = ag_l - pp->lf.t, xb = ag_l + rs_l - pp->lb.t;
          ex_mb = ag_o + rs_o + nl * ((xf > 0 ? xf : 0) + (xb > 0 ? xb : 0));
          ex_mb += kap * (per_mb - ex_mb);
        }
        double bytes_mb = nl * lbytes_d + obytes, bytes_mb_e = nl * lbytes_e;
        dp_sent = (2 * cost_collective_bytes_sent(COST_ALLGATHER, bytes_mb, n, COST_ALGO_RING) +
                   cost_collective_bytes_sent(COST_REDUCE_SCATTER, grad_b * (nl * ld + oparams), n, COST_ALGO_RING) +
                   2 * cost_collective_bytes_sent(COST_ALLGATHER, bytes_mb_e, (int)nedp, COST_ALGO_RING) +
                   cost_collective_bytes_sent(COST_REDUCE_SCATTER, grad_b * nl * le, (int)nedp, COST_ALGO_RING)) *
                  (double)mmb;
        z3_s = per_mb * (double)mmb;
        z3_exposed = ex_mb * (double)mmb;
        dp_s = z3_s;
        dp_exposed = z3_exposed;
      }
    }
    /* optimizer step over the local (ZeRO-partitioned) parameters */
    double opt_params = L.zero >= 1 ? dense_r / (double)ndp + expert_r / (double)nedp : params_r;
    double opt_s = hbm > 0 ? opt_params * opt_bpp / hbm : 0;
    double exposed_r = dp_exposed + ag_exposed;
    if (exposed_r > worst_dp_exposed) worst_dp_exposed = exposed_r;
    if (dp_s > worst_dp_s) worst_dp_s = dp_s;
    if (dp_sent > worst_dp_sent) worst_dp_sent = dp_sent;
    if (opt_s > worst_opt) worst_opt = opt_s;
    if (z3_s > worst_z3) worst_z3 = z3_s;
    if (z3_exposed > worst_z3_exposed) worst_z3_exposed = z3_exposed;
    if (ag_exposed > worst_ag_exposed) worst_ag_exposed = ag_exposed;
  }
  /* tied weights on two pipeline ranks: their gradients are summed between
   * the first and last stage every step (Megatron-LM's embedding group) */
  double shared = K > 1 ? kinds[0].shared_params : 0;
  if (shared > 0 && pp_n > 1) {
    emb_s = cost_allreduce_s(shared * grad_b, 2, &pplink, COST_ALGO_AUTO);
    emb_sent = cost_collective_bytes_sent(COST_ALLREDUCE, shared * grad_b, 2, COST_ALGO_RING);
  }
  /* the busiest rank's compute and communication */
  const PlanStage *sb = &st[rmax];
  PlanCost rank_cost;
  memset(&rank_cost, 0, sizeof rank_cost);
  for (int64_t ci = rmax; ci < K; ci += pp_n) {
    const PlanChunk *ch = kp[ci];
    plan_cost_add(&rank_cost, &ch->f, (double)mmb);
    plan_cost_add(&rank_cost, &ch->b, (double)mmb);
  }
  double tp_s = rank_cost.t_comm[IRG_TP], cp_s = rank_cost.t_comm[IRG_CP];
  double tp_x = tp_s - rank_cost.t_hidden[IRG_TP], cp_x = cp_s - rank_cost.t_hidden[IRG_CP];
  /* the experts' all-to-alls wait for their data and are waited for: all exposed */
  double ep_s = rank_cost.t_comm[IRG_EP];
  double sync_x = 0; /* the busiest rank's synchronous transfers */
  if (p2p_sync)
    for (int64_t ci = rmax; ci < K; ci += pp_n) sync_x += 2 * p2p_sync_s(ci, K, t_sync) * (double)mmb;
  out->compute_s = sb->busy_s - tp_x - cp_x - ep_s - sync_x;
  out->gemm_s = rank_cost.t_gemm;
  out->other_s = out->compute_s - out->gemm_s;
  out->recompute_s = rank_cost.t_rc;
  out->bubble_s = T_pipe - sb->busy_s;
  if (out->bubble_s < 0) out->bubble_s = 0;
  out->bubble_fraction = bubble_fraction;
  out->optimizer_s = worst_opt;
  out->attn_s = rank_cost.t_attn;
  out->attn_gemm_s = rank_cost.t_attn_gemm;
  out->grouped_s = rank_cost.t_grouped;
  out->comm_s[IRG_TP] = tp_s;
  out->comm_s[IRG_CP] = cp_s;
  out->comm_exposed[IRG_TP] = tp_x;
  out->comm_exposed[IRG_CP] = cp_x;
  out->comm_s[IRG_DP] = worst_dp_s;
  out->comm_exposed[IRG_DP] = worst_dp_exposed;
  /* asynchronous transfers inside the pipeline time are in the bubble; synchronous ones are
   * the rank's own time, all of it exposed */
  out->comm_s[IRG_PP] = (p2p_sync ? sync_x : (double)mmb * 2 * t_p2p * (K > 1 ? 1 : 0) * v) + emb_s;
  out->comm_exposed[IRG_PP] = emb_s + sync_x;
  out->p2p_sync_exposed_s = sync_x;
  out->comm_bytes[IRG_TP] = rank_cost.sent[IRG_TP];
  out->comm_bytes[IRG_CP] = rank_cost.sent[IRG_CP];
  /* DeepSpeed's transfers carry a tensor rank's piece (p2p_deepspeed_s) */
  double pp_part = p2p_sync && L.tp > 1 && !L.sp ? (double)L.tp : 1;
  out->comm_bytes[IRG_PP] = rank_cost.sent[IRG_PP] / pp_part + emb_sent;
  out->comm_bytes[IRG_DP] = worst_dp_sent;
  out->comm_s[IRG_EP] = out->comm_exposed[IRG_EP] = ep_s;
  out->comm_bytes[IRG_EP] = rank_cost.sent[IRG_EP];
  out->comm_exposed_s = tp_x + cp_x + ep_s + worst_dp_exposed + emb_s;
  out->step_s = T_pipe + worst_dp_exposed + emb_s + worst_opt;
  /* FLOPs and throughput */
  double mf_all = 0;
  double mf = model_flops_mb(c, L.micro_batch, &mf_all);
  double replicas = (double)(L.dp * mmb);
  out->model_flops = mf * replicas;
  out->model_flops_all = mf_all * replicas;
  double hw = 0, hw_all = 0, rcf = 0;
  for (int64_t ci = 0; ci < K; ci++) {
    const PlanChunk *ch = kp[ci];
    hw += ch->f.gemm_flops + ch->b.gemm_flops;
    hw_all += ch->f.flops + ch->b.flops;
    rcf += ch->b.rc_flops + ch->f.rc_flops;
  }
  double ranks = (double)(L.dp * L.tp * L.cp) * (double)mmb;
  out->hw_flops = hw * ranks;
  out->hw_flops_all = hw_all * ranks;
  out->recompute_flops = rcf * ranks;
  /* the dense peak of the training precision (FP8, FP4: that rate) */
  double peak = cat_peak_flops(&c->dev, plan_gemm_peak_name(c));
  double G = (double)c->gpus;
  out->tokens_per_s = (double)B * (double)out->seq_len / out->step_s;
  out->tflops_per_gpu = out->hw_flops / out->step_s / G / 1e12;
  out->mfu = peak > 0 ? out->model_flops / (out->step_s * G * peak) : 0;
  out->hfu = peak > 0 ? out->hw_flops / (out->step_s * G * peak) : 0;
  out->nstages = reps ? 0 : pp_n;
  out->stages = reps ? NULL : c->stages;
  out->valid = 1;
  if (!(flags & PLAN_FAST)) plan_explain(c, out);
  return 0;
}

/* ------------------------------------------------------------------ */
/* a whole predicted step, for traces                                   */

int plan_timeline(PlanCtx *c, const PlanLayout *L, PlanTimeline *out, char *why, size_t whylen) {
  memset(out, 0, sizeof *out);
  snprintf(why, whylen, "the layout has no plan");
  PlanResult r;
  if (plan_evaluate(c, L, PLAN_FULL_SIM, &r) != 0 || !r.valid) return -1;
  const PlanLayout *l = &r.layout;
  int64_t K = l->pp * (l->vpp > 0 ? l->vpp : 1);
  if (l->num_micro > PLAN_TIMELINE_MAX_UNITS / K) {
    snprintf(why, whylen,
             "%" PRId64 " micro-batches x %" PRId64 " pipeline chunk%s a step are more than the %d a timeline holds "
             "(a forward and a backward event each); a smaller global batch shows the same schedule",
             l->num_micro, K, K == 1 ? "" : "s", PLAN_TIMELINE_MAX_UNITS);
    return -1;
  }
  PlanKey key = plan_layout_key(l, l->recompute_layers);
  PlanExact *e = plan_exact(c, &key, K);
  if (!e->valid) return -1;
  double *tf = xalloc_calloc((size_t)K, sizeof(double)), *tb = xalloc_calloc((size_t)K, sizeof(double));
  const PlanChunk **ch = xalloc_calloc((size_t)K, sizeof *ch);
  for (int64_t ci = 0; ci < K; ci++) {
    tf[ci] = e->ch[ci].f.t;
    tb[ci] = e->ch[ci].b.t;
    ch[ci] = &e->ch[ci];
  }
  ds_engine_times(c, l, ch, K, r.p2p_sync_s, tf, tb); /* as plan_evaluate priced them */
  free(ch);
  double t_lag = plan_model(c)->layout.engine == 1 ? 0 : r.p2p_s;
  char err[256];
  int rc = -1;
  if (sched_build(&out->prog, (Schedule)l->schedule, (int)l->pp, (int)l->num_micro, (int)(l->vpp > 0 ? l->vpp : 1), err,
                  sizeof err) == 0) {
    SchedCosts sc = {0, 0, tf, tb, t_lag, 0, 0};
    int s = sched_simulate_costs(&out->prog, &sc, &out->sim);
    if (s == 0) rc = 0;
    else {
      snprintf(why, whylen, "the schedule's simulation does not finish (a deadlock)");
      if (s > 0) sched_sim_free(&out->sim);
      sched_free(&out->prog);
    }
  } else {
    snprintf(why, whylen, "the schedule cannot be built: %s", err);
  }
  free(tf);
  free(tb);
  out->pp = (int)l->pp;
  /* after the pipeline: the data-parallel reduction and the tied weights' all-reduce
   * (engine = deepspeed's transfers are inside it) */
  out->dp_exposed = r.comm_exposed[IRG_DP] + r.comm_exposed[IRG_PP] - r.p2p_sync_exposed_s;
  out->optimizer = r.optimizer_s;
  return rc;
}

void plan_timeline_free(PlanTimeline *t) {
  sched_sim_free(&t->sim);
  sched_free(&t->prog);
  memset(t, 0, sizeof *t);
}
