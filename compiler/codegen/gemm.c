/* gemm.c - a fused GEMM kernel as a BLAS call (gemm.h). */
#include "gemm.h"

#include <stdio.h>
#include <string.h>

static const IrNode *nd(const NestKernel *k, int id) { return &k->g->nodes[id]; }

static int out_index(const NestKernel *k, int v) {
  for (int i = 0; i < k->K->noutputs; i++)
    if (k->K->outputs[i] == v) return i;
  return -1;
}

/* Resolves a matmul operand through the transposes (of the last two axes)
 * and reshapes fusion folded into the GEMM. */
static int operand(const NestKernel *k, int v, int trans, GemmOperand *o) {
  int shape = v, seen_reshape = 0;
  while (nest_in_kernel(k, v)) {
    const IrNode *n = nd(k, v);
    if (n->op == IR_TRANSPOSE) {
      if (seen_reshape) return 0; /* a reshape of a transposed view is not a strided matrix */
      trans ^= 1;
      v = n->in[0];
      shape = v;
    } else if (n->op == IR_RESHAPE) {
      seen_reshape = 1;
      v = n->in[0];
    } else {
      return 0;
    }
  }
  const IrNode *s = nd(k, shape);
  o->mem = v;
  o->trans = trans;
  o->rank = s->rank;
  memcpy(o->dims, s->dims, sizeof o->dims);
  if (s->rank < 2) return 0;
  o->rows = s->dims[s->rank - 2];
  o->cols = s->dims[s->rank - 1];
  return 1;
}

int gemm_is_bgrad_node(const NestKernel *k, int id) {
  const FuseKernel *K = k->K;
  if (!(K->epilogue & FUSE_EPI_BGRAD) || K->bgrad < 0) return 0;
  if (id == K->bgrad) return 1;
  for (int v = nd(k, K->bgrad)->in[0]; nest_in_kernel(k, v) && nd(k, v)->op == IR_RESHAPE; v = nd(k, v)->in[0])
    if (v == id) return 1;
  return 0;
}

int gemm_plan(const NestKernel *k, GemmPlan *p) {
  const FuseKernel *K = k->K;
  memset(p, 0, sizeof *p);
  int mm = -1;
  for (int j = 0; j < K->nnodes; j++)
    if (nd(k, K->nodes[j])->op == IR_MATMUL) mm = K->nodes[j];
  if (mm < 0) return nest_fail(k, "graph %s kernel k%d: a gemm without a matmul", k->g->name, k->kp);
  const IrNode *n = nd(k, mm);
  if (!operand(k, n->in[0], (int)n->attr[0], &p->a) || !operand(k, n->in[1], (int)n->attr[1], &p->b))
    return nest_fail(k, "graph %s kernel k%d: a matmul operand is not a strided matrix batch", k->g->name, k->kp);
  /* both operands fp32 or both bf16 (the CPU's hpd_ctx.gemm_bf16, cuBLASLt's
   * CUDA_R_16BF), the product fp32 */
  DType ta = nd(k, p->a.mem)->dtype, tb = nd(k, p->b.mem)->dtype;
  if (!((ta == DT_BF16 && tb == DT_BF16) || (ta == DT_F32 && tb == DT_F32)) || n->dtype != DT_F32)
    return nest_fail(k, "graph %s kernel k%d: the %s back end multiplies f32 or bf16 matrices (into f32) only",
                     k->g->name, k->kp, k->backend);
  p->matmul = mm;
  /* The chain after the matmul: scale (alpha), bias, activation. */
  p->alpha = 1.0;
  p->product = mm;
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *x = nd(k, K->nodes[j]);
    if (x->op == IR_MUL && (x->in[0] == mm || x->in[1] == mm)) {
      const IrNode *c = nd(k, x->in[0] == mm ? x->in[1] : x->in[0]);
      if (c->op == IR_CONST) {
        p->alpha = c->fattr;
        p->product = K->nodes[j];
      }
    }
  }
  p->bgrad = p->bgrad_side = -1;
  if (K->epilogue & FUSE_EPI_BGRAD) {
    p->bgrad = K->bgrad;
    p->bgrad_side = fuse_bgrad_side(k->fg, k->kp);
    if (p->bgrad_side < 0) return nest_fail(k, "graph %s kernel k%d: a bias gradient of no operand", k->g->name, k->kp);
  }
  p->out = -1; /* the buffer the call writes: the first output at or after the product */
  for (int j = 0; j < K->nnodes && p->out < 0; j++) {
    int id = K->nodes[j];
    if (id < p->product || gemm_is_bgrad_node(k, id)) continue;
    if (out_index(k, id) >= 0) p->out = id;
  }
  if (p->out < 0) return nest_fail(k, "graph %s kernel k%d: the gemm has no output", k->g->name, k->kp);
  int orank = n->rank;
  p->batch_axes = orank - 2;
  p->M = n->dims[orank - 2];
  p->N = n->dims[orank - 1];
  p->K = p->a.trans ? p->a.rows : p->a.cols;
  p->nbatch = 1;
  for (int i = 0; i < p->batch_axes; i++) p->nbatch *= n->dims[i];
  if (p->M > INT32_MAX || p->N > INT32_MAX || p->K > INT32_MAX || p->a.cols > INT32_MAX || p->b.cols > INT32_MAX)
    return nest_fail(k, "graph %s kernel k%d: a matrix dimension exceeds BLAS's int", k->g->name, k->kp);
  /* B shared by every batch and A's batches contiguous: one call with nbatch x M rows */
  int b_shared = 1, a_full = !p->a.trans && p->a.rank - 2 == p->batch_axes;
  for (int i = 0; i < p->b.rank - 2; i++) b_shared &= p->b.dims[i] == 1;
  for (int i = 0; i < p->batch_axes && a_full; i++) a_full = p->a.dims[i] == n->dims[i];
  p->flat = b_shared && a_full && p->nbatch * p->M <= INT32_MAX;
  for (int j = 0; j < K->nnodes; j++) p->epilogue += K->nodes[j] > p->product && !gemm_is_bgrad_node(k, K->nodes[j]);
  return 0;
}

void gemm_epilogue(const NestKernel *k, const GemmPlan *p, Nest *N) {
  const FuseKernel *K = k->K;
  const IrNode *n = nd(k, p->matmul);
  nest_init(N, k, n->rank, n->dims, 0, 0, 0, n->rank);
  NestAff off = nest_contiguous_off(n->rank, n->dims, NULL, 0);
  N->node_x[p->product] = nest_x_load(N, p->out, DT_F32, &off);
  for (int j = 0; j < K->nnodes; j++) {
    int id = K->nodes[j];
    if (id <= p->product || nest_is_index_map(nd(k, id)->op)) continue;
    N->node_x[id] = nest_x_node(N, id);
    if (out_index(k, id) >= 0) nest_store_node(N, id, N->node_x[id]);
  }
}

void gemm_batch_strides(const GemmPlan *p, const GemmOperand *o, int64_t *stride) {
  int64_t acc = 1;
  int obr = o->rank - 2; /* the operand's batch rank */
  int nb = p->batch_axes;
  for (int i = nb - 1; i >= 0; i--) {
    int j = obr - nb + i;
    stride[i] = (j < 0 || o->dims[j] == 1) ? 0 : acc;
    if (j >= 0) acc *= o->dims[j];
  }
}
