/* precision.c - 16-bit storage of activations (precision.h). */
#include "precision.h"

#include <stdio.h>
#include <string.h>

static int is16(DType t) { return t == DT_BF16 || t == DT_F16; }

/* Ops whose values are stored in 16 bits: those whose kernels load and
 * store any element type on both back ends (the loop and row kernels:
 * element-wise ops, the softmax family), so that the CPU and CUDA targets
 * round the same values and give the same numbers. */
static int stores_any(IrOp op) {
  if (ir_op_flags(op) & IRF_ELEMENTWISE) return 1;
  switch (op) {
  case IR_SOFTMAX:
  case IR_SOFTMAX_BWD:
  case IR_LOG_SOFTMAX:
  case IR_LOG_SOFTMAX_BWD: return 1;
  default: return 0;
  }
}

/* Ops that read their float inputs in any element type: the above, the
 * shape ops, the row and column reductions, the cross-entropy, the rotary
 * embedding, and on the CPU its pick and scatter kernels. The rest (GEMMs, host
 * ops, collectives, calls, extern calls; the CUDA target's special kernels)
 * read fp32: a cast before them, which changes no value. */
static int reads_any(IrOp op, int cuda) {
  if (stores_any(op) || (ir_op_flags(op) & IRF_SHAPE)) return op != IR_CONCAT;
  switch (op) {
  case IR_REDUCE_MEAN:
  case IR_REDUCE_MAX:
  case IR_REDUCE_SUM:
  case IR_SUM_TO: /* row and column kernels, or the CUDA target's special sum over several groups */
  case IR_CROSS_ENTROPY:
  case IR_CROSS_ENTROPY_BWD: return 1; /* the logits as stored (bf16: the head GEMM's D) */
  case IR_ROPE: return 1;               /* the CUDA target's widens as it loads, as the CPU's */
  case IR_EMBEDDING:
  case IR_REPEAT_KV_BWD:
  case IR_PICK:
  case IR_PICK_BWD:
  case IR_EMBEDDING_BWD: return !cuda;
  default: return 0;
  }
}

/* Whether the target's attention reads q, k and v in the storage type: the
 * CUDA target's tensor-core kernels with 16-bit operands take bf16 or fp16
 * inputs for the heads t->attn16 accepts (stored so where they are made,
 * else rounded before). The rest of its inputs read fp32. */
static int attn_reads_stored(const IrNode *x, const IrNode *old, const PrecTarget *t) {
  if (!t || !t->cuda || !t->attn16 || (x->op != IR_ATTENTION && x->op != IR_ATTENTION_BWD) || x->nin < 3) return 0;
  const IrNode *q = &old[x->in[0]], *v = &old[x->in[2]];
  return q->rank == 4 && v->rank == 4 && t->attn16(q->dims[3], v->dims[3], t->arg);
}

typedef struct {
  IrGraph *g;
  const IrNode *old;   /* the graph's nodes before */
  int *map;            /* old id -> new id */
  int *ident;          /* new id -> itself (ir_add_copy's map for inputs given as new ids) */
  int *cast[2];        /* per old id and side of the cut: its fp32 copy (new id), -1 none */
  int *cast16[2];      /* the same for its 16-bit copy (a bf16 GEMM's operand) */
  DType storage;
  int split;           /* the old fb_split (0: not cut) */
  const IrModule *m;
} Rebuild;

/* Appends node x with the inputs `in` (new ids) and the element type dt. */
static int append(Rebuild *R, const IrNode *x, int *in, DType dt) {
  IrNode y = *x;
  y.in = in;
  y.dtype = dt;
  return ir_add_copy(R->g, &y, R->ident);
}

/* A CAST of new node nv to dt. */
static int cast_to(Rebuild *R, int nv, DType dt, Span at) {
  IrNode c;
  memset(&c, 0, sizeof c);
  c.op = IR_CAST;
  c.rank = R->g->nodes[nv].rank;
  memcpy(c.dims, R->g->nodes[nv].dims, sizeof c.dims);
  c.nin = 1;
  c.span = at;
  return append(R, &c, &nv, dt);
}

/* The fp32 value of old node v for a reader on side `side` of the cut. */
static int as_f32(Rebuild *R, int v, int side, Span at) {
  int nv = R->map[v];
  if (!is16(R->g->nodes[nv].dtype)) return nv;
  if (R->cast[side][v] >= 0) return R->cast[side][v];
  return R->cast[side][v] = cast_to(R, nv, DT_F32, at);
}

/* The 16-bit value of old node v (a bf16 GEMM's operand) for a reader on
 * side `side` of the cut: itself when stored so, else a cast, which rounds
 * it (the weights' fp32 masters, an fp32 activation), as autocast casts a
 * GEMM's operands. */
static int as_16(Rebuild *R, int v, int side, Span at) {
  int nv = R->map[v];
  if (R->g->nodes[nv].dtype == R->storage) return nv;
  if (R->cast16[side][v] >= 0) return R->cast16[side][v];
  const IrNode *x = &R->old[v];
  if (x->op == IR_PARAM && x->dtype == DT_F32 && !R->m->params[x->attr[0]].state) {
    /* the weight's 16-bit copy, which the runtime rounds from the fp32
     * master once per step (after the optimizer), not a cast per graph and
     * side of the cut: the same values, rounded once */
    return R->cast16[side][v] = append(R, x, NULL, R->storage);
  }
  if (x->op == IR_RESHAPE || ir_swaps_last_two(x)) {
    /* the view of the cast rather than the cast of the view: the GEMM still
     * reads a transposed weight through its flag, and the cast runs in
     * order (the tied head's transposed 154 MB table: 30 ms -> 6.5). Any
     * other transpose is a copy either way: cast after it, so that the cast
     * reads it through the transposed index (one pass; before, an fp32 copy
     * for its other readers and a 16-bit one for the GEMM: attention's
     * gradients, 26 -> 18 bytes an element) */
    int in16 = as_16(R, x->in[0], side, at);
    return R->cast16[side][v] = append(R, x, &in16, R->storage);
  }
  return R->cast16[side][v] = cast_to(R, nv, R->storage, at);
}

/* Drops the reshapes nothing reads (and no output): the fp32 view of a value whose
 * 16-bit copy a graph output took instead (below). A dead view would still count as a
 * reader of its input for the fusion, which then copies that input for nothing. Views
 * compute nothing, so nothing else goes; *split (a node index, 0: none) follows. */
static void drop_dead_views(IrGraph *g, int *split) {
  int n = g->nnodes;
  int *uses = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1)), ndead = 0;
  char *dead = arena_alloc(g->arena, (size_t)n + 1);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) uses[g->nodes[i].in[k]]++;
  for (int k = 0; k < g->noutputs; k++) uses[g->outputs[k]]++;
  for (int i = n - 1; i >= g->nargs; i--)
    if (g->nodes[i].op == IR_RESHAPE && !uses[i]) {
      dead[i] = 1;
      ndead++;
      uses[g->nodes[i].in[0]]--;
    }
  if (!ndead) return;
  IrNode *old = arena_alloc(g->arena, sizeof(IrNode) * (size_t)(n + 1));
  int *map = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1)), new_split = 0;
  memcpy(old, g->nodes, sizeof(IrNode) * (size_t)n);
  g->nnodes = 0;
  for (int i = 0; i < n; i++) {
    if (*split > 0 && i == *split) new_split = g->nnodes;
    map[i] = dead[i] ? -1 : ir_add_copy(g, &old[i], map);
  }
  for (int k = 0; k < g->noutputs; k++) g->outputs[k] = map[g->outputs[k]];
  if (*split > 0) *split = new_split;
}

/* Graph g rebuilt with 16-bit storage; keep16[k] = 1 lets output k stay
 * 16-bit (a block forward's saved activation), arg16[a] = 1 makes argument
 * a 16-bit (its backward's stash). Returns the values stored in 16 bits;
 * out16[k] says which outputs are. */
static int rebuild(const IrModule *m, IrGraph *g, DType storage, const PrecTarget *t, const char *keep16, const char *arg16, char *out16) {
  Arena *a = g->arena;
  int n = g->nnodes, stored = 0, cap = 2 * n + g->noutputs + 1;
  IrNode *old = arena_alloc(a, sizeof(IrNode) * (size_t)(n + 1)); /* the nodes before: g's are rewritten */
  int *map = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *ident = arena_alloc(a, sizeof(int) * (size_t)cap);
  int *c0 = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *c1 = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *h0 = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *h1 = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *in = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  char *act = arena_alloc(a, (size_t)n + 1), *stat = arena_alloc(a, (size_t)n + 1);
  memcpy(old, g->nodes, sizeof(IrNode) * (size_t)n);
  for (int i = 0; i < cap; i++) ident[i] = i;
  for (int i = 0; i < n; i++) c0[i] = c1[i] = h0[i] = h1[i] = -1;
  /* values that derive from the data, not from parameters and constants alone */
  /* and statistics: what a reduction makes (a norm's variance, a log-sum-exp,
   * a row's loss), and arithmetic on statistics alone: fp32 */
  for (int i = 0; i < n; i++) {
    const IrNode *x = &old[i];
    act[i] = x->op == IR_ARG || x->op == IR_INPUT || x->op == IR_RECV || x->op == IR_LOSS_SEED;
    for (int k = 0; k < x->nin; k++) act[i] |= act[x->in[k]];
    if (!act[i] || !x->nin) continue;
    stat[i] = (ir_op_flags(x->op) & IRF_REDUCE) && ir_numel(x) < ir_numel(&old[x->in[0]]);
    int only = !(ir_op_flags(x->op) & (IRF_REDUCE | IRF_LEAF)) && x->op != IR_MATMUL && x->op != IR_CALL;
    for (int k = 0; k < x->nin && only; k++) only = stat[x->in[k]] || !act[x->in[k]];
    stat[i] |= only;
  }
  /* a parameter's gradient stays fp32 where it is made, not rounded to 16
   * bits and widened at the output: the tied table's sum of the head's and
   * the lookup's gradients (an element-wise add) was rounded to bf16 */
  char *grad32 = arena_alloc(a, (size_t)n + 1);
  for (int k = g->noutputs - g->ngrad_params; k < g->noutputs; k++)
    if (g->outputs[k] >= 0 && g->outputs[k] < n) grad32[g->outputs[k]] = 1;
  for (int i = n - 1; i >= 0; i--)
    if (grad32[i] && (ir_op_flags(old[i].op) & IRF_SHAPE) && old[i].nin > 0) grad32[old[i].in[0]] = 1;
  /* a value read only as a bf16 GEMM's operand (through views), of an op
   * whose kernel stores any type on both targets: stored in 16 bits where it
   * is made, the same bits the cast after it would round (the logits'
   * gradient: no fp32 copy and no cast pass of [tokens, vocab]; the rotary
   * embedding's inverse in the backward, which the weight and data gradients'
   * GEMMs read through the heads' transpose: a 16-bit transpose after it) */
  char *as16 = arena_alloc(a, (size_t)n + 1), *prod16 = arena_alloc(a, (size_t)n + 1);
  if (storage == DT_BF16) {
    int *readers = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *gemm_reads = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
    char *out = arena_alloc(a, (size_t)n + 1), *out32 = arena_alloc(a, (size_t)n + 1);
    for (int k = 0; k < g->noutputs; k++) out[g->outputs[k]] = 1;
    /* outputs that leave in fp32: all but a block forward's saved activations (keep16) */
    for (int k = 0; k < g->noutputs; k++) out32[g->outputs[k]] |= !(keep16 && keep16[k]);
    for (int i = n - 1; i >= 0; i--) {
      const IrNode *x = &old[i];
      int view = (x->op == IR_TRANSPOSE || x->op == IR_RESHAPE) && readers[i] > 0 && gemm_reads[i] == readers[i] && !out[i];
      for (int k = 0; k < x->nin; k++) {
        readers[x->in[k]]++;
        gemm_reads[x->in[k]] += x->op == IR_MATMUL || view;
      }
    }
    for (int i = 0; i < n; i++)
      as16[i] = (old[i].op == IR_CROSS_ENTROPY_BWD || old[i].op == IR_ROPE) && old[i].dtype == DT_F32 && act[i] && readers[i] > 0 &&
                gemm_reads[i] == readers[i] && !out[i];
    /* a GEMM's product that only kernels loading any type (or bf16 GEMMs,
     * through views) read: rounded to bf16 as it is made, as autocast's
     * matmul returns bf16 (the backward's data gradients: dX = dY W^T was an
     * fp32 [tokens, 4 x hidden] written and read again at twice the bytes).
     * Not where a reader adds a parameter (a bias) or multiplies by a
     * constant (a scale): the GEMM's own epilogue, in fp32 before it rounds */
    char *ok16 = arena_alloc(a, (size_t)n + 1);
    /* each node's readers (reader, input slot) */
    IrReaders rd = ir_readers(old, n, a);
    int *start = rd.start, *use_node = rd.node, *use_slot = rd.slot;
    for (int i = n - 1; i >= 0; i--) { /* readers come after: decided first */
      const IrNode *x = &old[i];
      if (readers[i] == 0 || out32[i] ||
          (x->op != IR_MATMUL && x->op != IR_ATTENTION_BWD && x->op != IR_VOCAB_MASK && !(ir_op_flags(x->op) & IRF_SHAPE)))
        continue;
      ok16[i] = 1;
      for (int u = start[i]; u < start[i + 1] && ok16[i]; u++) {
        int r = use_node[u], k = use_slot[u];
        const IrNode *y = &old[r];
        /* views, and the padded logits' mask, keep their input's type */
        if ((ir_op_flags(y->op) & IRF_SHAPE) || y->op == IR_VOCAB_MASK) ok16[i] = y->op != IR_CONCAT && ok16[r];
        else if (y->op == IR_MATMUL || (k < 2 && ir_linear_role(y->op) != IR_LINEAR_NONE)) continue;
        /* the CUDA target's 16-bit attention reads q, k, v as stored (below) */
        else if (k < 3 && attn_reads_stored(y, old, t)) continue;
        /* the CUDA target's readers on both targets: the same values rounded */
        else if (!stores_any(y->op) && !reads_any(y->op, 1)) ok16[i] = 0;
        else if (y->op == IR_ADD || (y->op == IR_MUL && y->nin == 2 && old[y->in[1 - k]].op == IR_CONST))
          for (int o = 0; o < y->nin; o++) ok16[i] &= y->in[o] == i || act[y->in[o]];
      }
    }
    /* and so is the attention's gradient [dq, dk, dv] (FlashAttention-2 writes them in
     * its operands' type): the CUDA target's 16-bit kernels store it so themselves */
    for (int i = 0; i < n; i++)
      prod16[i] = (old[i].op == IR_MATMUL || old[i].op == IR_ATTENTION_BWD) && old[i].dtype == DT_F32 && act[i] && !stat[i] &&
                  !grad32[i] && ok16[i];
  }
  /* a rotary embedding (fp32 in, any type out on both targets) whose every reader is
   * an attention that reads q, k, v as stored, directly or through views (the heads'
   * transpose after a rotation on [B, T, H, D], lower.c): stored in 16 bits where it is
   * made (the CUDA target: Llama's q and k, no cast pass before the 16-bit attention) */
  char *rope16 = arena_alloc(a, (size_t)n + 1);
  if (t && t->cuda && is16(storage)) {
    /* attn_view[i]: view i is read by such attentions alone (readers come after: a
     * reader's own mark is final when it is met, from the last node back) */
    char *attn_view = arena_alloc(a, (size_t)n + 1);
    for (int i = 0; i < n; i++) {
      rope16[i] = old[i].op == IR_ROPE && old[i].dtype == DT_F32 && act[i] && !stat[i] && !grad32[i];
      attn_view[i] = (old[i].op == IR_TRANSPOSE || old[i].op == IR_RESHAPE) && !grad32[i];
    }
    for (int r = n - 1; r >= 0; r--)
      for (int k = 0; k < old[r].nin; k++)
        if (!(k < 3 && attn_reads_stored(&old[r], old, t)) && !attn_view[r])
          rope16[old[r].in[k]] = attn_view[old[r].in[k]] = 0;
  }
  Rebuild R = {g, old, map, ident, {c0, c1}, {h0, h1}, storage, g->fb_split, m};
  /* GEMMs multiply bf16 matrices (the CPU's hpd_ctx.gemm_bf16, cuBLASLt);
   * under fp16 they read fp32 (oneDNN has no fp16 GEMM on most CPUs) */
  int gemm16 = storage == DT_BF16;
  g->nnodes = 0;
  int new_split = 0;
  for (int i = 0; i < n; i++) {
    const IrNode *x = &old[i];
    int side = R.split > 0 && i >= R.split;
    if (R.split > 0 && i == R.split) new_split = g->nnodes;
    int any = reads_any(x->op, t && t->cuda), all16 = x->nin > 0;
    /* q, k, v in the storage type, as stored (or rounded to it where they are fp32: a
     * rotary embedding read elsewhere too, fp16's GEMM products), for the 16-bit kernels */
    int attn_stored = is16(storage) && attn_reads_stored(x, old, t);
    for (int k = 0; k < x->nin; k++) {
      /* a BACKWARD call's stash reference (input 1) is no value */
      int as_is = any || (x->op == IR_CALL && k > 0 && x->attr[2] == IR_CALL_BACKWARD);
      /* a GEMM's operands, and the fused head's x and w (its GEMMs') */
      int gemm_operand = x->op == IR_MATMUL || (k < 2 && ir_linear_role(x->op) != IR_LINEAR_NONE) ||
                         (k < 2 && (x->op == IR_GROUPED_MM || x->op == IR_GROUPED_MM_WGRAD));
      if ((gemm_operand && gemm16) || (attn_stored && k < 3)) in[k] = as_16(&R, x->in[k], side, x->span);
      else in[k] = as_is ? map[x->in[k]] : as_f32(&R, x->in[k], side, x->span);
      all16 &= is16(g->nodes[in[k]].dtype);
    }
    if (x->op == IR_CONCAT && !all16) /* one element type: 16-bit only when every input is */
      for (int k = 0; k < x->nin; k++) in[k] = as_f32(&R, x->in[k], side, x->span);
    DType dt = x->dtype;
    if (dt == DT_F32 && x->rank >= 1 && act[i] && !stat[i] && !grad32[i]) {
      /* the padded logits' mask keeps the GEMM's fp32 product, as the
       * cross-entropy reads an unpadded head's */
      if (x->op == IR_VOCAB_MASK && x->nin > 0) dt = g->nodes[in[0]].dtype;
      else if (stores_any(x->op)) dt = storage;
      else if ((ir_op_flags(x->op) & IRF_SHAPE) && x->nin > 0) dt = g->nodes[in[0]].dtype; /* moves, keeps the type */
    }
    if (x->op == IR_ARG && arg16 && arg16[x->attr[0]]) dt = storage;
    if (as16[i] || rope16[i]) dt = storage;
    map[i] = append(&R, x, in, dt);
    /* fuse.c's store16 makes it the GEMM's bf16 D, or the 16-bit attention kernels' store */
    if (prod16[i]) map[i] = cast_to(&R, map[i], storage, x->span);
    stored += is16(dt);
  }
  for (int k = 0; k < g->noutputs; k++) {
    int v = g->outputs[k];
    /* a saved activation the forward rounds for its GEMM anyway is saved as that
     * 16-bit copy, as autocast saves a linear layer's bf16 input (the attention's
     * output, transposed: then one pass makes it, not an fp32 copy and a cast) */
    int side = R.split > 0;
    g->outputs[k] = keep16 && keep16[k] ? (R.cast16[side][v] >= 0 ? R.cast16[side][v] : map[v]) : as_f32(&R, v, side, old[v].span);
    if (out16) out16[k] = (char)is16(g->nodes[g->outputs[k]].dtype);
  }
  drop_dead_views(g, &new_split);
  if (R.split > 0) g->fb_split = new_split;
  return stored;
}

DType prec_storage(Precision p) { return p == PREC_BF16 ? DT_BF16 : p == PREC_FP16 ? DT_F16 : DT_F32; }

int prec_apply(IrModule *m, const AdResult *ad, DType storage, const PrecTarget *t, const char **why) {
  if (!is16(storage)) return 0;
  int total = 0;
  /* a block forward's saved outputs, by graph: which stay 16-bit */
  char **saved16 = arena_alloc(m->arena, sizeof(char *) * (size_t)(m->ngraphs + 1));
  /* the block forwards first: their backward graphs read what they save */
  for (int pass = 0; pass < 2; pass++)
  for (int gi = 0; gi < m->ngraphs; gi++) {
    IrGraph *g = m->graphs[gi];
    /* is gi a block forward (B.fwd) that saves activations, or a backward reading them? */
    int as_fwd = -1, as_bwd = -1, bwd_fwd = -1; /* bwd_fwd: the forward graph whose stash it reads */
    for (int f = 0; ad && f < ad->nforward; f++) {
      if (ad->fwd[f] == gi || (ad->fwd_keep[f] >= 0 && ad->fwd_keep[f] == gi)) as_fwd = f;
      if (ad->grad[f] == gi && ad->fwd[f] >= 0) as_bwd = f, bwd_fwd = ad->fwd[f];
      if (ad->grad_keep[f] >= 0 && ad->grad_keep[f] == gi) as_bwd = f, bwd_fwd = ad->fwd_keep[f];
    }
    if ((pass == 0) != (as_fwd >= 0)) continue;
    /* the forward module's own graphs (evaluation, and shared by the pipeline's chunks) stay fp32 */
    if (ad && gi < ad->nforward) continue;
    char *keep = NULL, *arg16 = NULL;
    if (as_fwd >= 0 && g->noutputs > 1) {
      keep = arena_alloc(m->arena, (size_t)g->noutputs);
      for (int k = 1; k < g->noutputs; k++) keep[k] = 1;
    }
    if (as_bwd >= 0) {
      /* arguments: dy, then per layer the forward's arguments and its outputs 1.. (interp.c's stash) */
      int fg = bwd_fwd;
      const IrGraph *F = m->graphs[fg];
      arg16 = arena_alloc(m->arena, (size_t)g->nargs + 1);
      for (int k = 1; saved16[fg] && k < F->noutputs; k++) {
        int a = 1 + F->nargs + (k - 1);
        if (a < g->nargs) arg16[a] = saved16[fg][k];
      }
    }
    saved16[gi] = arena_alloc(m->arena, (size_t)g->noutputs + 1);
    total += rebuild(m, g, storage, t, keep, arg16, saved16[gi]);
  }
  if (ir_verify(m, stderr)) { /* an internal error: the problems go to stderr for its report */
    if (why) *why = "the module does not verify after the storage types were set";
    return -1;
  }
  return total;
}

int prec_params16(const IrModule *m) {
  int count = 0;
  for (int p = 0; p < m->nparams; p++) count += is16(ir_param_read_type(m, p));
  return count;
}
