/* ir_cost.c - FLOPs and bytes of every IR op (see ir_cost.h).
 *
 * Counting conventions
 *   - A multiply-add is 2 FLOPs, so a GEMM [M, K] x [K, N] is 2 M N K (the
 *     convention of Narayanan et al. 2021, "Efficient Large-Scale Language
 *     Model Training on GPU Clusters Using Megatron-LM", Appendix, and of
 *     every MFU figure derived from it).
 *   - A transcendental (exp, log, tanh, sqrt, rsqrt, sin, cos) is 1: on NVIDIA
 *     GPUs it is one MUFU (special function unit) instruction; on CPUs a
 *     vectorised polynomial costs more, but the op is memory bound either way
 *     and the roofline prices it by its bytes.
 *   - Compare/select and min/max count 1, like an add. Conversions (CAST) and
 *     the integer work of a random number generator count 0: they are not
 *     floating-point arithmetic.
 *   - A reduction of n elements counts n (not n - 1).
 *
 * Per output element of the elementwise maps:
 *   neg, relu, abs, square, add, sub, mul, div, maximum, minimum   1
 *   exp, log, sqrt, rsqrt, tanh                                     1 (MUFU)
 *   causal_mask   1 (compare the indices, select the fill)
 *   sigmoid       4 (1 / (1 + exp(-x)): neg, exp, add, div)
 *   silu          5 (x * sigmoid(x))
 *   gelu          9 (tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
 *                    x^3 2, * 0.044715 1, + x 1, * sqrt(2/pi) 1, tanh 1,
 *                    + 1 1, * x 1, * 0.5 1)
 *   pow           3 (exp(p * log(x)): log, mul, exp)
 *   dropout       2 (compare the uniform draw with p, scale by 1 / (1 - p))
 *   cast          0
 *   act_grad(f)   2 c(f) + 1: recomputing f's intermediates from x (c(f)),
 *                 their derivatives (about c(f) again: the "cheap gradient
 *                 principle", Griewank & Walther, Evaluating Derivatives,
 *                 2008, ch. 4) and the product with dy (1); e.g. relu 3,
 *                 exp 3, gelu 19.
 *   rope          4.5 per element: per pair of elements 4 mul + 2 add for the
 *                 rotation, 1 mul for the angle, sin and cos (2 MUFU) = 9.
 * Reductions and row-wise ops, per input element:
 *   reduce_sum, reduce_max, sum_to, repeat_kv_bwd   1
 *   reduce_mean     1, plus 1 per output element (the scale by 1/n)
 *   softmax         5 (max, sub, exp, sum, scale by 1/sum)
 *   softmax_bwd     4 (y * dy, row sum, dy - s, y * (...))
 *   log_softmax     5 (max, sub, exp, sum, sub), plus 1 per row (the log)
 *   log_softmax_bwd 4 (exp(y), row sum of dy, mul, sub)
 *   cross_entropy   4 per logit (max, sub, exp, sum: logsumexp), plus 3 per
 *                   row (log, pick the target, accumulate) and 1 (the mean)
 *   cross_entropy_bwd 6 per logit (softmax 5, times dloss / N 1), plus 1
 *                   per row (subtract the one-hot at the target)
 *   embedding_bwd   1 per dy element (the scatter-add)
 * GEMM: matmul 2 M N K per batch element (see above).
 * extern, extern_grad: 0 (a native function's arithmetic is unknown; its bytes count).
 * The router's ops:
 *   topk          k per input element (k passes of compare/select over each row,
 *                 as the reference executor does; a GPU heap or sort is no cheaper
 *                 for the small rows of a router)
 *   take          0 (a gather, like pick); reads idx and one x element per output
 *   take_bwd      1 per dy element (the scatter-add); reads dy and idx, writes [..., V]
 *   one_hot       1 per output element (compare the index, select 1 or 0)
 * Convolutional networks (im2col's GEMMs, Chetlur et al. 2014, "cuDNN: Efficient
 * Primitives for Deep Learning", sec. 3): per image and group, the forward's
 * [O/g, C/g KH KW] x [C/g KH KW, Ho Wo], so 2 N O Ho Wo (C/g) KH KW; each
 * gradient (data, filter) is the same count in another order. Taps that fall
 * into the padding count too (an implicit GEMM computes them).
 *   pool2d        max / avg: KH KW per output element (compare or add; the
 *                 average's 1 / count folded in); adaptive: 1 per input
 *                 element (the windows tile the input, about once)
 *   pool2d_bwd    1 per dy element (max: the scatter to the argmax after
 *                 KH KW compares to find it again, counted with them: KH KW + 1;
 *                 avg: KH KW adds of dy / count)
 * Mixture of experts (B sequences of T tokens, K choices each, width C, E experts of cap slots):
 *   moe_dispatch  1 per output element (the weight's multiply; an empty slot is written 0);
 *                 reads x, idx, w; writes [B, E, cap, C]
 *   moe_combine   2 per chosen element (B T K C: multiply-add); reads the chosen slots, idx, w
 *   moe_gate_grad 2 per chosen element (a dot product per choice); reads a, the chosen slots, idx
 *   packed (dropless) forms the same, with N = B T K rows in place of the slots
 *   moe_expert_ids 0 (a counting sort of the choices: integer work)
 *   grouped_mm, grouped_mm_wgrad  2 N X Y (each row's GEMM against its expert's matrix)
 *   aux_loss, loss_seed, training 0, and no bytes (an identity forward, a scalar)
 * Data movement (transpose, slice, pad, concat, expand, repeat_kv, embedding)
 * and collectives: 0 FLOPs here; a collective's reduction arithmetic depends
 * on the group size, which cost.c knows.
 *
 * Bytes: see ir_cost.h. EMBEDDING_BWD writes the whole table (it is zeroed,
 * then the rows of dy are added in): read dy and ids plus the touched rows
 * (numel(dy) elements), write the table plus the touched rows. */
#include "ir_cost.h"

#include "conv.h"

#include <string.h>

typedef struct {
  const IrModule *m;
  const IrGraph *g;
  int id;
  const IrNode *n;
} CostCtx;

typedef void (*CostRule)(const CostCtx *c, IrCost *k);

static const IrNode *cin(const CostCtx *c, int i) { return &c->g->nodes[c->n->in[i]]; }
static double numel(const IrNode *n) { return (double)ir_numel(n); }
static double bytes_of(const IrNode *n) { return (double)ir_bytes(n); }
static double out_numel(const CostCtx *c) { return numel(c->n); }

const char *ircost_class_name(IrCostClass c) {
  static const char *const names[] = {"leaf", "gemm", "elementwise", "reduction", "data", "comm", "call"};
  return c >= 0 && c < IRC_NCLASSES ? names[c] : "?";
}

IrCostClass ircost_op_class(IrOp op) {
  int f = ir_op_flags(op);
  if (op == IR_CALL) return IRC_CALL;
  if (f & IRF_COMM) return IRC_COMM;
  if (f & IRF_LEAF) return IRC_LEAF;
  if (op == IR_MATMUL || op == IR_ATTENTION || op == IR_ATTENTION_BWD || op == IR_CONV2D || op == IR_CONV2D_BWD_DATA ||
      op == IR_CONV2D_BWD_FILTER || op == IR_GROUPED_MM || op == IR_GROUPED_MM_WGRAD || ir_linear_role(op) != IR_LINEAR_NONE)
    return IRC_GEMM;
  if (op == IR_POOL2D || op == IR_POOL2D_BWD) return IRC_REDUCTION;
  if ((f & IRF_ELEMENTWISE) || op == IR_ROPE || op == IR_ATTN_MERGE) return IRC_ELEMENTWISE;
  if (f & IRF_REDUCE) return IRC_REDUCTION;
  return IRC_DATA; /* IRF_SHAPE, EMBEDDING, EMBEDDING_BWD */
}

double ircost_elementwise_flops(IrOp op) {
  switch (op) {
  case IR_NEG:
  case IR_RELU:
  case IR_ABS:
  case IR_SQUARE:
  case IR_ADD:
  case IR_SUB:
  case IR_MUL:
  case IR_DIV:
  case IR_MAXIMUM:
  case IR_MINIMUM:
  case IR_EXP:
  case IR_LOG:
  case IR_SQRT:
  case IR_RSQRT:
  case IR_TANH:
  case IR_CAUSAL_MASK:
  case IR_VOCAB_MASK: return 1;
  case IR_SIGMOID: return 4;
  case IR_SILU: return 5;
  case IR_GELU: return 9;
  case IR_POWS: return 3;
  case IR_DROPOUT: return 2;
  case IR_CAST: return 0;
  case IR_ROPE: return 4.5;
  default: return -1;
  }
}

/* ---- the rules: each sets what differs from the defaults that
 * ircost_node fills in first (flops 0, every distinct input read once, the
 * output written once, the op's class). ---- */

static void no_bytes(IrCost *k) { k->bytes_read = k->bytes_written = 0; }

/* Leaves that already hold their data move nothing. */
static void ircost_INPUT(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
static void ircost_PARAM(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
static void ircost_ARG(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
static void ircost_CONST(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
/* FILL and IOTA materialise their output: the default (write it) holds. */
static void ircost_FILL(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_IOTA(const CostCtx *c, IrCost *k) { (void)c, (void)k; }

static void elementwise(const CostCtx *c, IrCost *k) { k->flops = out_numel(c) * ircost_elementwise_flops(c->n->op); }

#define EW(ID) \
  static void ircost_##ID(const CostCtx *c, IrCost *k) { elementwise(c, k); }
EW(NEG)
EW(RELU)
EW(GELU)
EW(SILU)
EW(SIGMOID)
EW(TANH)
EW(EXP)
EW(LOG)
EW(SQRT)
EW(RSQRT)
EW(ABS)
EW(SQUARE)
EW(POWS)
EW(ADD)
EW(SUB)
EW(MUL)
EW(DIV)
EW(MAXIMUM)
EW(MINIMUM)
EW(CAUSAL_MASK)
EW(VOCAB_MASK)
EW(DROPOUT)
EW(CAST)
EW(ROPE)
#undef EW

static void ircost_ACT_GRAD(const CostCtx *c, IrCost *k) {
  double f = ircost_elementwise_flops((IrOp)c->n->attr[0]);
  k->flops = out_numel(c) * (2 * (f >= 0 ? f : 1) + 1);
}

static void ircost_MATMUL(const CostCtx *c, IrCost *k) {
  const IrNode *n = c->n, *a = cin(c, 0);
  double batch = 1;
  for (int i = 0; i < n->rank - 2; i++) batch *= (double)n->dims[i];
  double m = (double)n->dims[n->rank - 2], nn = (double)n->dims[n->rank - 1];
  double kk = (double)(n->attr[0] ? a->dims[a->rank - 2] : a->dims[a->rank - 1]);
  k->flops = 2 * batch * m * nn * kk;
}

static void per_input_element(const CostCtx *c, IrCost *k, double per) { k->flops = numel(cin(c, 0)) * per; }

static void ircost_REDUCE_SUM(const CostCtx *c, IrCost *k) { per_input_element(c, k, 1); }
static void ircost_REDUCE_MAX(const CostCtx *c, IrCost *k) { per_input_element(c, k, 1); }
static void ircost_REDUCE_MEAN(const CostCtx *c, IrCost *k) {
  per_input_element(c, k, 1);
  k->flops += out_numel(c);
}
static void ircost_SUM_TO(const CostCtx *c, IrCost *k) { per_input_element(c, k, 1); }
static void ircost_REPEAT_KV_BWD(const CostCtx *c, IrCost *k) { per_input_element(c, k, 1); }

static double rows_of(const IrNode *x, int64_t axis) {
  double len = axis >= 0 && axis < x->rank ? (double)x->dims[axis] : 1;
  return numel(x) / (len > 0 ? len : 1);
}

static void ircost_SOFTMAX(const CostCtx *c, IrCost *k) { per_input_element(c, k, 5); }
static void ircost_SOFTMAX_BWD(const CostCtx *c, IrCost *k) { per_input_element(c, k, 4); }
static void ircost_LOG_SOFTMAX(const CostCtx *c, IrCost *k) {
  per_input_element(c, k, 5);
  k->flops += rows_of(cin(c, 0), c->n->attr[0]);
}
static void ircost_LOG_SOFTMAX_BWD(const CostCtx *c, IrCost *k) { per_input_element(c, k, 4); }

static void ircost_CROSS_ENTROPY(const CostCtx *c, IrCost *k) {
  const IrNode *logits = cin(c, 0);
  k->flops = 4 * numel(logits) + 3 * numel(cin(c, 1)) + 1;
}

static void ircost_CROSS_ENTROPY_BWD(const CostCtx *c, IrCost *k) {
  k->flops = 6 * numel(cin(c, 0)) + numel(cin(c, 1));
}

/* Data movement: no arithmetic; the default bytes (read the input, write
 * the output) hold, except for the view. */
static void ircost_RESHAPE(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
static void ircost_TRANSPOSE(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_SLICE(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_PAD(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_CONCAT(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_EXPAND(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_REPEAT_KV(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_EMBEDDING(const CostCtx *c, IrCost *k) { (void)c, (void)k; }

static void ircost_EMBEDDING_BWD(const CostCtx *c, IrCost *k) {
  double rows = bytes_of(cin(c, 0)); /* the touched rows, read and written back */
  k->flops = numel(cin(c, 0));
  k->bytes_read += rows;
  k->bytes_written += rows;
}

/* A CALL: filled in by ircost_node (it needs the recursion). */
static void ircost_CALL(const CostCtx *c, IrCost *k) { (void)c, (void)k; }

static void ircost_ALL_REDUCE(const CostCtx *c, IrCost *k) { k->comm_bytes = bytes_of(cin(c, 0)); }
static void ircost_REDUCE_SCATTER(const CostCtx *c, IrCost *k) { k->comm_bytes = bytes_of(cin(c, 0)); }
static void ircost_ALL_GATHER(const CostCtx *c, IrCost *k) { k->comm_bytes = bytes_of(c->n); }
static void ircost_ALL_TO_ALL(const CostCtx *c, IrCost *k) { k->comm_bytes = bytes_of(c->n); }
static void ircost_SEND(const CostCtx *c, IrCost *k) {
  k->comm_bytes = bytes_of(cin(c, 0));
  k->bytes_written = 0; /* the receiver's RECV writes */
}
static void ircost_RECV(const CostCtx *c, IrCost *k) { k->comm_bytes = bytes_of(c->n); }
/* Taking this rank's chunk is a local copy; the f marker costs nothing forward. */
static void ircost_SHARD_SLICE(const CostCtx *c, IrCost *k) {
  k->bytes_read = bytes_of(c->n);
  k->bytes_written = bytes_of(c->n);
}
static void ircost_COPY_TO_GROUP(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_PICK(const CostCtx *c, IrCost *k) {
  k->bytes_read = bytes_of(cin(c, 1)) + bytes_of(c->n);
  k->bytes_written = bytes_of(c->n);
}
static void ircost_PICK_BWD(const CostCtx *c, IrCost *k) {
  k->bytes_read = bytes_of(cin(c, 0)) + bytes_of(cin(c, 1));
  k->bytes_written = bytes_of(c->n);
}

static void ircost_TOPK(const CostCtx *c, IrCost *k) { k->flops = (double)ir_numel(cin(c, 0)) * (double)c->n->attr[0]; }
static void ircost_TAKE(const CostCtx *c, IrCost *k) {
  k->bytes_read = bytes_of(cin(c, 1)) + bytes_of(c->n);
  k->bytes_written = bytes_of(c->n);
}
static void ircost_TAKE_BWD(const CostCtx *c, IrCost *k) {
  k->flops = (double)ir_numel(cin(c, 0));
  k->bytes_read = bytes_of(cin(c, 0)) + bytes_of(cin(c, 1));
  k->bytes_written = bytes_of(c->n);
}
static void ircost_ONE_HOT(const CostCtx *c, IrCost *k) { k->flops = (double)ir_numel(c->n); }

static double moe_chosen(const IrNode *idx, const IrNode *wide) { return numel(idx) * (double)wide->dims[wide->rank - 1]; }
static void ircost_MOE_DISPATCH(const CostCtx *c, IrCost *k) { k->flops = out_numel(c); }
static void ircost_MOE_COMBINE(const CostCtx *c, IrCost *k) {
  double chosen = moe_chosen(cin(c, 1), c->n);
  k->flops = 2 * chosen;
  k->bytes_read = chosen * (double)sem_dtype_bytes(c->n->dtype) + bytes_of(cin(c, 1)) + bytes_of(cin(c, 2));
}
static void ircost_MOE_GATE_GRAD(const CostCtx *c, IrCost *k) {
  double chosen = moe_chosen(cin(c, 2), cin(c, 0));
  k->flops = 2 * chosen;
  k->bytes_read = bytes_of(cin(c, 0)) + chosen * (double)sem_dtype_bytes(cin(c, 1)->dtype) + bytes_of(cin(c, 2));
}
/* ---- convolutional networks ---- */

int ircost_conv_gemm(const IrGraph *g, const IrNode *n, double *batch, double *M, double *N, double *K) {
  if (ir_linear_role(n->op) != IR_LINEAR_NONE) {
    /* the logits' GEMM [rows, C] x [C, V]; the backward's two (recomputed
     * logits, dx) count as a batch of two */
    const IrNode *x = &g->nodes[n->in[0]], *w = &g->nodes[n->in[1]];
    *batch = ir_linear_role(n->op) == IR_LINEAR_DX ? 2 : 1;
    *M = (double)ir_numel(x) / (double)x->dims[x->rank - 1];
    *N = (double)w->dims[n->attr[0] ? 0 : 1];
    *K = (double)x->dims[x->rank - 1];
    return 1;
  }
  if (n->op == IR_GROUPED_MM || n->op == IR_GROUPED_MM_WGRAD) {
    /* one GEMM an expert over its rows: priced as E GEMMs of the mean rows */
    const IrNode *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
    double E = (double)(n->op == IR_GROUPED_MM ? b->dims[0] : n->dims[0]), rows = (double)a->dims[0] / (E > 0 ? E : 1);
    *batch = E;
    if (n->op == IR_GROUPED_MM) *M = rows, *N = (double)n->dims[1], *K = (double)a->dims[1];
    else *M = (double)a->dims[1], *N = (double)b->dims[1], *K = rows;
    return 1;
  }
  if (n->op != IR_CONV2D && n->op != IR_CONV2D_BWD_DATA && n->op != IR_CONV2D_BWD_FILTER) return 0;
  ConvShape s = ir_conv_shape(g, n);
  double G = (double)s.groups, cols = (double)s.N * (double)s.Ho * (double)s.Wo, outs = (double)s.O / G;
  double taps = (double)s.C / G * (double)s.KH * (double)s.KW;
  *batch = G;
  if (n->op == IR_CONV2D) *M = outs, *N = cols, *K = taps;
  else if (n->op == IR_CONV2D_BWD_DATA) *M = taps, *N = cols, *K = outs;
  else *M = outs, *N = taps, *K = cols;
  return 1;
}

static void conv_cost(const CostCtx *c, IrCost *k) {
  double batch = 0, M = 0, N = 0, K = 0;
  ircost_conv_gemm(c->g, c->n, &batch, &M, &N, &K);
  k->flops = 2 * batch * M * N * K;
}
static void ircost_CONV2D(const CostCtx *c, IrCost *k) { conv_cost(c, k); }
static void ircost_GROUPED_MM(const CostCtx *c, IrCost *k) { conv_cost(c, k); }
static void ircost_GROUPED_MM_WGRAD(const CostCtx *c, IrCost *k) { conv_cost(c, k); }
static void ircost_MOE_EXPERT_IDS(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_CONV2D_BWD_DATA(const CostCtx *c, IrCost *k) { conv_cost(c, k); }
static void ircost_CONV2D_BWD_FILTER(const CostCtx *c, IrCost *k) { conv_cost(c, k); }

static double pool_window_size(const CostCtx *c, const IrNode *x, const IrNode *y) {
  int64_t m = c->n->attr[POOL_A_MODE];
  if (m == POOL_ADAPTIVE_AVG || m == POOL_ADAPTIVE_MAX) return numel(x) / (numel(y) > 0 ? numel(y) : 1);
  return (double)c->n->attr[POOL_A_KH] * (double)c->n->attr[POOL_A_KW];
}
static void ircost_POOL2D(const CostCtx *c, IrCost *k) { k->flops = out_numel(c) * pool_window_size(c, cin(c, 0), c->n); }
static void ircost_POOL2D_BWD(const CostCtx *c, IrCost *k) {
  const IrNode *dy = cin(c, 1);
  int max = c->n->attr[POOL_A_MODE] == POOL_MAX || c->n->attr[POOL_A_MODE] == POOL_ADAPTIVE_MAX;
  k->flops = numel(dy) * (pool_window_size(c, c->n, dy) + max);
  if (!max) k->bytes_read = bytes_of(dy); /* an average needs only dy */
}

static void ircost_AUX_LOSS(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
/* x passes through (a view); the value is read and written into the state */
static void ircost_STATE_UPDATE(const CostCtx *c, IrCost *k) {
  k->bytes_read = bytes_of(cin(c, 1));
  k->bytes_written = bytes_of(cin(c, 1));
}
static void ircost_LOSS_SEED(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }
static void ircost_TRAINING(const CostCtx *c, IrCost *k) { (void)c, no_bytes(k); }

/* Query-key pairs an attention computes (ir_ops.h's allowed ones): all
 * T x S, or under a causal mask the keys at or before each query's position
 * (within a sliding window: at most W of them). A zigzag layout gives every
 * context rank the same count, h (2 c h + 1) for chunks of h rows over c
 * ranks; without it query t sees min(t + 1, S) keys. */
double ircost_attention_pairs(const IrNode *n, const IrNode *q, const IrNode *k) {
  double T = (double)q->dims[2], S = (double)k->dims[2], W = (double)n->attr[3];
  if (!n->attr[0]) return T * S;
  if (n->attr[2] && n->attr[4] > 0 && n->attr[5] > 1) {
    /* one ring block of c (attr[4], attr[5]): the rank's own holds the diagonal's
     * triangles, each other block 2 (T / 2)^2 pairs (zigzag chunks r and 2c - 1 - r:
     * one of the two chunks of rows sees the whole block's chunk alike, whichever
     * side of r it lies); a window: the whole sequence's pairs spread evenly */
    double c = (double)n->attr[5], h = T / 2, N = T * c;
    if (W > 0) {
      double m = W < N ? W : N;
      return (m * (m + 1) / 2 + (N - m) * m) / (c * c);
    }
    return n->attr[4] == 1 ? h * (2 * h + 1) : 2 * h * h;
  }
  if (W > 0) {
    /* the query at position p sees min(p + 1, W) keys; over the whole
     * sequence of N positions (every rank's share alike under context
     * parallelism, to within the window's edge) */
    double c = n->attr[1] && n->attr[2] && S > T ? S / T : 1, N = T * c, m = W < N ? W : N;
    return (m * (m + 1) / 2 + (N - m) * m) / c;
  }
  if (n->attr[1] && n->attr[2] && S > T) {
    double c = S / T, h = T / 2;
    return h * (2 * c * h + 1);
  }
  double m = T < S ? T : S;
  return m * (m + 1) / 2 + (T - m) * S;
}

/* Flash attention (ir_ops.h): per computed score of each head, the forward's
 * q . k (2 D) and P v (2 Dv) and one exponential (with the mask, scale and
 * running max folded in: 4); the backward's recomputed q . k, dO . v, P^T dO,
 * dS k and dS^T q (6 D + 4 Dv), the exponential and dS (4). Bytes: q, k, v
 * read and the packed output written, the scores never. */
static void ircost_ATTENTION(const CostCtx *c, IrCost *k) {
  const IrNode *q = cin(c, 0), *kk = cin(c, 1), *v = cin(c, 2);
  double pairs = ircost_attention_pairs(c->n, q, kk) * (double)q->dims[0] * (double)q->dims[1];
  k->flops = pairs * (2.0 * (double)q->dims[3] + 2.0 * (double)v->dims[3] + 4);
}
/* Ring attention's merge: per element of each block's output a weight
 * (exp and a divide, one per row, small) and a multiply-add. */
static void ircost_ATTN_MERGE(const CostCtx *c, IrCost *k) { k->flops = 2.0 * numel(c->n) * (double)c->n->nin; }
static void ircost_ATTENTION_BWD(const CostCtx *c, IrCost *k) {
  const IrNode *q = cin(c, 0), *kk = cin(c, 1), *v = cin(c, 2);
  double pairs = ircost_attention_pairs(c->n, q, kk) * (double)q->dims[0] * (double)q->dims[1];
  k->flops = pairs * (6.0 * (double)q->dims[3] + 4.0 * (double)v->dims[3] + 4);
}

/* The fused head and loss (ir_ops.h), rows x C x V per logit GEMM: the
 * forward's logits (2 rows V C) and its log-sum-exp (4 per logit, as
 * cross_entropy); LINEAR_CE_BWD recomputes the logits and multiplies the
 * gradient by the weight (4 rows V C) with the softmax's 6 per logit;
 * LINEAR_CE_BWD_W adds the weight's product (2 rows V C), reusing the
 * logits its pair recomputes (the CPU back end runs the two as one). The
 * bytes are the inputs and outputs: the logits stay in cache. */
static void linear_ce_dims(const CostCtx *c, double *rows, double *C, double *V) {
  const IrNode *x = cin(c, 0), *w = cin(c, 1);
  *C = (double)x->dims[x->rank - 1];
  *V = (double)w->dims[c->n->attr[0] ? 0 : 1];
  *rows = numel(x) / (*C > 0 ? *C : 1);
}
static void ircost_LINEAR_CE(const CostCtx *c, IrCost *k) {
  double r, C, V;
  linear_ce_dims(c, &r, &C, &V);
  k->flops = 2 * r * V * C + 4 * r * V + 3 * r;
}
static void ircost_LINEAR_CE_BWD(const CostCtx *c, IrCost *k) {
  double r, C, V;
  linear_ce_dims(c, &r, &C, &V);
  k->flops = 4 * r * V * C + 6 * r * V;
}
static void ircost_LINEAR_CE_BWD_W(const CostCtx *c, IrCost *k) {
  double r, C, V;
  linear_ce_dims(c, &r, &C, &V);
  k->flops = 2 * r * V * C;
}

/* The vocab-parallel form (LINEAR_LSE): as LINEAR_CE without the target */
static void ircost_LINEAR_LSE(const CostCtx *c, IrCost *k) { ircost_LINEAR_CE(c, k); }
static void ircost_LINEAR_LSE_BWD(const CostCtx *c, IrCost *k) { ircost_LINEAR_CE_BWD(c, k); }
static void ircost_LINEAR_LSE_BWD_W(const CostCtx *c, IrCost *k) { ircost_LINEAR_CE_BWD_W(c, k); }

/* A native function: its arithmetic is unknown, so 0 FLOPs; the default
 * bytes (every argument read once, the result written once) stand, and the
 * planner prices it by those bytes alone (docs/planner.md: extern time is
 * not modelled beyond its memory traffic). */
static void ircost_EXTERN(const CostCtx *c, IrCost *k) { (void)c, (void)k; }
static void ircost_EXTERN_GRAD(const CostCtx *c, IrCost *k) { (void)c, (void)k; }

static const CostRule cost_rules[] = {
#define X(id, name, nin, flags) ircost_##id,
    IR_OPS(X)
#undef X
};

/* ---- public ---- */

double ircost_read_bytes(const IrModule *m, const IrGraph *g, int node, int k) {
  (void)m;
  const IrNode *n = &g->nodes[node];
  const IrNode *x = &g->nodes[n->in[k]];
  if (x->op == IR_CONST) return 0;
  switch (n->op) {
  case IR_RESHAPE: return 0;
  case IR_SLICE: return bytes_of(n);
  case IR_EMBEDDING: return k == 0 ? bytes_of(n) : bytes_of(x);
  default: return bytes_of(x);
  }
}

void ircost_accumulate(IrCost *acc, const IrCost *c, double times) {
  acc->flops += c->flops * times;
  acc->bytes_read += c->bytes_read * times;
  acc->bytes_written += c->bytes_written * times;
  acc->comm_bytes += c->comm_bytes * times;
  for (int i = 0; i < IRC_NCLASSES; i++) {
    acc->flops_of[i] += c->flops_of[i] * times;
    acc->bytes_of[i] += c->bytes_of[i] * times;
    acc->nodes_of[i] += c->nodes_of[i] * times;
  }
}

IrCost ircost_node(const IrModule *m, const IrGraph *g, int node) {
  IrCost k;
  memset(&k, 0, sizeof k);
  const IrNode *n = &g->nodes[node];
  k.cls = ircost_op_class(n->op);
  if (n->op == IR_CALL) {
    /* As ir_verify requires, a graph calls only graphs after itself, which
     * also bounds the recursion on a module that has not been verified. */
    int self = 0;
    while (self < m->ngraphs && m->graphs[self] != g) self++;
    int64_t gi = n->attr[0];
    if (gi > self && gi < m->ngraphs) {
      IrCost body = ircost_graph(m, m->graphs[gi]);
      ircost_accumulate(&k, &body, (double)(n->attr[1] > 0 ? n->attr[1] : 1));
    }
    return k;
  }
  /* Defaults: each distinct input read once, the output written once. */
  for (int i = 0; i < n->nin; i++) {
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= n->in[j] == n->in[i];
    if (!seen) k.bytes_read += ircost_read_bytes(m, g, node, i);
  }
  k.bytes_written = bytes_of(n);
  CostCtx c = {m, g, node, n};
  cost_rules[n->op](&c, &k);
  k.flops_of[k.cls] = k.flops;
  k.bytes_of[k.cls] = k.bytes_read + k.bytes_written;
  k.nodes_of[k.cls] = 1;
  return k;
}

IrCost ircost_graph(const IrModule *m, const IrGraph *g) {
  IrCost sum;
  memset(&sum, 0, sizeof sum);
  sum.cls = IRC_CALL;
  for (int i = 0; i < g->nnodes; i++) {
    IrCost k = ircost_node(m, g, i);
    ircost_accumulate(&sum, &k, 1);
  }
  return sum;
}

int64_t ircost_param_count(const IrModule *m) {
  int64_t total = 0;
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    if (p->state) continue; /* running statistics are not parameters (their bytes still count) */
    total += ir_param_numel_all(p);
  }
  return total;
}

int64_t ircost_param_bytes(const IrModule *m) {
  int64_t total = 0;
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    total += ir_param_numel_all(p) * sem_dtype_bytes(p->dtype);
  }
  return total;
}
