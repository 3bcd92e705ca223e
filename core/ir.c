/* ir.c - IR construction, shape rules, verification and printing. */
#include "ir.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

typedef const char *(*ShapeRule)(IrGraph *g, IrNode *n);

static const char *const op_names[] = {
#define X(id, name, nin, flags) name,
    IR_OPS(X)
#undef X
};
static const int op_arity[] = {
#define X(id, name, nin, flags) nin,
    IR_OPS(X)
#undef X
};
static const int op_flags[] = {
#define X(id, name, nin, flags) flags,
    IR_OPS(X)
#undef X
};

const char *ir_op_name(IrOp op) { return op_names[op]; }
int ir_op_flags(IrOp op) { return op_flags[op]; }
int ir_op_arity(IrOp op) { return op_arity[op]; }

const char *ir_group_name(IrGroup g) {
  static const char *const n[] = {"dp", "tp", "pp", "cp", "ep", "edp"};
  return n[g];
}

int64_t ir_numel(const IrNode *n) {
  int64_t k = 1;
  for (int i = 0; i < n->rank; i++) k *= n->dims[i];
  return k;
}

int ir_swaps_last_two(const IrNode *n) {
  if (n->op != IR_TRANSPOSE || n->rank < 2) return 0;
  for (int i = 0; i < n->rank - 2; i++)
    if (n->attr[i] != i) return 0;
  return n->attr[n->rank - 2] == n->rank - 1 && n->attr[n->rank - 1] == n->rank - 2;
}

int ir_heads_transpose(const IrNode *n) {
  return n->op == IR_TRANSPOSE && n->rank == 4 && n->attr[0] == 0 && n->attr[1] == 2 && n->attr[2] == 1 && n->attr[3] == 3;
}

int64_t ir_bytes(const IrNode *n) { return ir_numel(n) * sem_dtype_bytes(n->dtype); }

static IrNode *in_node(IrGraph *g, IrNode *n, int i) { return &g->nodes[n->in[i]]; }

static void copy_type(IrNode *dst, const IrNode *src) {
  dst->rank = src->rank;
  memcpy(dst->dims, src->dims, sizeof dst->dims);
}

static int same_dims(const IrNode *a, const IrNode *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

static int64_t numel_of(int rank, const int64_t *dims) {
  int64_t k = 1;
  for (int i = 0; i < rank; i++) k *= dims[i];
  return k;
}

/* 1 when the elements of a shape (its dimensions positive) number at most
 * 2^53: counts, byte sizes and the planner's doubles stay exact, and no
 * product of dimensions overflows (a sequence of 2^31 tokens once made
 * ir_numel's product undefined). */
static int numel_fits(int rank, const int64_t *dims) {
  const int64_t limit = (int64_t)1 << 53;
  int64_t k = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0) return 1; /* the shape rules refuse these with their own words */
    if (dims[i] > 0 && k > limit / dims[i]) return 0;
    k *= dims[i];
  }
  return 1;
}

/* ---- shape rules: fill in n's type from its inputs and attributes ---- */

static const char *leaf_given(IrGraph *g, IrNode *n) {
  (void)g;
  if (n->rank < 0) return "a leaf needs its shape";
  for (int i = 0; i < n->rank; i++)
    if (n->dims[i] < 1) return "dimensions must be positive";
  return NULL;
}

static const char *irshape_INPUT(IrGraph *g, IrNode *n) { return leaf_given(g, n); }
static const char *irshape_PARAM(IrGraph *g, IrNode *n) { return leaf_given(g, n); }
static const char *irshape_ARG(IrGraph *g, IrNode *n) { return leaf_given(g, n); }
static const char *irshape_RECV(IrGraph *g, IrNode *n) { return leaf_given(g, n); }
static const char *irshape_FILL(IrGraph *g, IrNode *n) { return leaf_given(g, n); }
static const char *irshape_IOTA(IrGraph *g, IrNode *n) { return n->rank == 1 ? leaf_given(g, n) : "iota is a vector"; }

static const char *irshape_CONST(IrGraph *g, IrNode *n) {
  (void)g;
  n->rank = 0;
  return NULL;
}

static const char *unary_same(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  copy_type(n, x);
  n->dtype = x->dtype;
  return NULL;
}

static const char *unary_float(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (!sem_dtype_is_float(x->dtype)) return "needs a floating-point input";
  return unary_same(g, n);
}

#define UNARY_FLOAT(ID) \
  static const char *irshape_##ID(IrGraph *g, IrNode *n) { return unary_float(g, n); }
UNARY_FLOAT(NEG)
UNARY_FLOAT(RELU)
UNARY_FLOAT(GELU)
UNARY_FLOAT(SILU)
UNARY_FLOAT(SIGMOID)
UNARY_FLOAT(TANH)
UNARY_FLOAT(EXP)
UNARY_FLOAT(LOG)
UNARY_FLOAT(SQRT)
UNARY_FLOAT(RSQRT)
UNARY_FLOAT(ABS)
UNARY_FLOAT(SQUARE)
UNARY_FLOAT(POWS)
UNARY_FLOAT(CAUSAL_MASK)
UNARY_FLOAT(VOCAB_MASK)
UNARY_FLOAT(DROPOUT)

static const char *irshape_CAST(IrGraph *g, IrNode *n) {
  copy_type(n, in_node(g, n, 0));
  return NULL; /* dtype is the target, given by the caller */
}

static const char *irshape_ACT_GRAD(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *dy = in_node(g, n, 1);
  if (!same_dims(x, dy)) return "act_grad needs x and dy of one shape";
  if (n->attr[0] < 0 || n->attr[0] >= IR_OP_COUNT || !(op_flags[n->attr[0]] & IRF_UNARY)) return "act_grad of a non-unary op";
  return unary_same(g, n);
}

/* numpy broadcasting of two inputs */
static const char *broadcast(IrGraph *g, IrNode *n) {
  IrNode *a = in_node(g, n, 0), *b = in_node(g, n, 1);
  int rank = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < rank; i++) {
    int ia = a->rank - rank + i, ib = b->rank - rank + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return "shapes do not broadcast";
    n->dims[i] = da == 1 ? db : da;
  }
  n->rank = rank;
  n->dtype = a->rank == 0 && b->rank > 0 ? b->dtype : a->dtype;
  if (sem_dtype_is_float(a->dtype) != sem_dtype_is_float(b->dtype)) return "mixes integer and float inputs";
  return NULL;
}

#define BINARY(ID) \
  static const char *irshape_##ID(IrGraph *g, IrNode *n) { return broadcast(g, n); }
BINARY(ADD)
BINARY(SUB)
BINARY(MUL)
BINARY(DIV)
BINARY(MAXIMUM)
BINARY(MINIMUM)

static const char *irshape_MATMUL(IrGraph *g, IrNode *n) {
  IrNode *a = in_node(g, n, 0), *b = in_node(g, n, 1);
  if (a->rank < 2 || b->rank < 2) return "matmul needs matrices";
  int64_t m = n->attr[0] ? a->dims[a->rank - 1] : a->dims[a->rank - 2];
  int64_t ka = n->attr[0] ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
  int64_t kb = n->attr[1] ? b->dims[b->rank - 1] : b->dims[b->rank - 2];
  int64_t nn = n->attr[1] ? b->dims[b->rank - 2] : b->dims[b->rank - 1];
  if (ka != kb) return "matmul inner dimensions differ";
  int ba = a->rank - 2, bb = b->rank - 2, batch = ba > bb ? ba : bb;
  for (int i = 0; i < batch; i++) {
    int ia = ba - batch + i, ib = bb - batch + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return "matmul batch dimensions do not broadcast";
    n->dims[i] = da == 1 ? db : da;
  }
  n->rank = batch + 2;
  n->dims[batch] = m;
  n->dims[batch + 1] = nn;
  n->dtype = a->dtype;
  return NULL;
}

static const char *reduce_axis(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  int64_t axis = n->attr[0];
  if (axis < 0 || axis >= x->rank) return "reduction axis out of range";
  n->dtype = x->dtype;
  if (n->attr[1]) {
    copy_type(n, x);
    n->dims[axis] = 1;
  } else {
    n->rank = x->rank - 1;
    for (int i = 0, k = 0; i < x->rank; i++)
      if (i != axis) n->dims[k++] = x->dims[i];
  }
  return NULL;
}

static const char *irshape_REDUCE_SUM(IrGraph *g, IrNode *n) { return reduce_axis(g, n); }
static const char *irshape_REDUCE_MEAN(IrGraph *g, IrNode *n) { return reduce_axis(g, n); }
static const char *irshape_REDUCE_MAX(IrGraph *g, IrNode *n) { return reduce_axis(g, n); }

/* EXPAND broadcasts x to the given shape; SUM_TO sums x down to it. */
static const char *broadcast_compatible(const IrNode *small, const IrNode *big) {
  if (small->rank > big->rank) return "cannot broadcast to fewer dimensions";
  for (int i = 0; i < small->rank; i++) {
    int64_t s = small->dims[i], b = big->dims[big->rank - small->rank + i];
    if (s != b && s != 1) return "shapes are not broadcast-compatible";
  }
  return NULL;
}

static const char *irshape_EXPAND(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  n->dtype = x->dtype;
  return n->rank < 0 ? "expand needs its shape" : broadcast_compatible(x, n);
}

static const char *irshape_SUM_TO(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  n->dtype = x->dtype;
  return n->rank < 0 ? "sum_to needs its shape" : broadcast_compatible(n, x);
}

static const char *softmax_like(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (n->attr[0] < 0 || n->attr[0] >= x->rank) return "softmax axis out of range";
  for (int i = 1; i < n->nin; i++)
    if (!same_dims(x, in_node(g, n, i))) return "softmax backward needs y and dy of one shape";
  return unary_float(g, n);
}

static const char *irshape_SOFTMAX(IrGraph *g, IrNode *n) { return softmax_like(g, n); }
static const char *irshape_SOFTMAX_BWD(IrGraph *g, IrNode *n) { return softmax_like(g, n); }
static const char *irshape_LOG_SOFTMAX(IrGraph *g, IrNode *n) { return softmax_like(g, n); }
static const char *irshape_LOG_SOFTMAX_BWD(IrGraph *g, IrNode *n) { return softmax_like(g, n); }

static const char *irshape_RESHAPE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  n->dtype = x->dtype;
  if (n->rank < 0) return "reshape needs its shape";
  return numel_of(n->rank, n->dims) == ir_numel(x) ? NULL : "reshape changes the element count";
}

static const char *irshape_TRANSPOSE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  int seen[IR_MAX_RANK] = {0};
  for (int i = 0; i < x->rank; i++) {
    int64_t p = n->attr[i];
    if (p < 0 || p >= x->rank || seen[p]) return "transpose needs a permutation";
    seen[p] = 1;
    n->dims[i] = x->dims[p];
  }
  n->rank = x->rank;
  n->dtype = x->dtype;
  return NULL;
}

static const char *irshape_SLICE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  n->dtype = x->dtype;
  if (n->rank < 0) return "slice needs its shape";
  int kept = 0;
  for (int i = 0; i < x->rank; i++) {
    int64_t size = n->attr[8 + i] ? 1 : (kept < n->rank ? n->dims[kept] : -1);
    if (size < 1 || n->attr[i] < 0 || n->attr[i] + size > x->dims[i]) return "slice out of range";
    if (!n->attr[8 + i]) kept++;
  }
  return kept == n->rank ? NULL : "slice output rank does not match the kept axes";
}

static const char *irshape_PAD(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  n->dtype = x->dtype;
  if (n->rank != x->rank) return "pad keeps the rank";
  for (int i = 0; i < x->rank; i++)
    if (n->attr[i] < 0 || n->attr[i] + x->dims[i] > n->dims[i]) return "pad out of range";
  return NULL;
}

static const char *irshape_CONCAT(IrGraph *g, IrNode *n) {
  if (n->nin < 1) return "concat needs inputs";
  IrNode *x = in_node(g, n, 0);
  int64_t axis = n->attr[0];
  if (axis < 0 || axis >= x->rank) return "concat axis out of range";
  copy_type(n, x);
  n->dtype = x->dtype;
  for (int i = 1; i < n->nin; i++) {
    IrNode *y = in_node(g, n, i);
    if (y->rank != x->rank) return "concat inputs differ in rank";
    for (int k = 0; k < x->rank; k++)
      if (k != axis && y->dims[k] != x->dims[k]) return "concat inputs differ off the axis";
    n->dims[axis] += y->dims[axis];
  }
  return NULL;
}

static const char *irshape_EMBEDDING(IrGraph *g, IrNode *n) {
  IrNode *t = in_node(g, n, 0), *ids = in_node(g, n, 1);
  if (t->rank != 2 || sem_dtype_is_float(ids->dtype)) return "embedding needs a [V, C] table and integer ids";
  copy_type(n, ids);
  n->dims[n->rank++] = t->dims[1];
  n->dtype = t->dtype;
  return NULL;
}

static const char *irshape_EMBEDDING_BWD(IrGraph *g, IrNode *n) {
  IrNode *dy = in_node(g, n, 0), *ids = in_node(g, n, 1);
  n->dtype = dy->dtype;
  if (n->rank != 2 || dy->rank != ids->rank + 1 || dy->dims[dy->rank - 1] != n->dims[1])
    return "embedding_bwd needs dy [..., C], ids [...] and a [V, C] result";
  return NULL;
}

static const char *irshape_ROPE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (x->rank != 4 || x->dims[3] % 2)
    return n->attr[8] ? "rope needs [B, T, H, D] with an even D" : "rope needs [B, H, T, D] with an even D";
  return unary_float(g, n);
}

static const char *irshape_REPEAT_KV(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (x->rank != 4 || n->attr[0] < 1) return "repeat_kv needs [B, H, T, D]";
  copy_type(n, x);
  n->dims[1] *= n->attr[0];
  n->dtype = x->dtype;
  return NULL;
}

static const char *irshape_REPEAT_KV_BWD(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (x->rank != 4 || n->attr[0] < 1 || x->dims[1] % n->attr[0]) return "repeat_kv_bwd needs [B, H*n, T, D]";
  copy_type(n, x);
  n->dims[1] /= n->attr[0];
  n->dtype = x->dtype;
  return NULL;
}

static const char *irshape_CROSS_ENTROPY(IrGraph *g, IrNode *n) {
  IrNode *l = in_node(g, n, 0), *t = in_node(g, n, 1);
  if (l->rank != t->rank + 1 || sem_dtype_is_float(t->dtype)) return "cross_entropy needs logits [..., V] and int targets [...]";
  for (int i = 0; i < t->rank; i++)
    if (l->dims[i] != t->dims[i]) return "cross_entropy logits and targets differ";
  n->rank = 0;
  n->dtype = l->dtype;
  return NULL;
}

static const char *irshape_CROSS_ENTROPY_BWD(IrGraph *g, IrNode *n) {
  IrNode *l = in_node(g, n, 0), *dl = in_node(g, n, 2);
  if (dl->rank != 0) return "cross_entropy_bwd needs a scalar dloss";
  copy_type(n, l);
  n->dtype = l->dtype;
  return NULL;
}

/* The fused head's ops (ir_ops.h): x [..., C], w [C, V] or [V, C]
 * (attr[0]); LINEAR_CE's family then int targets of x's leading shape
 * (input 2), LINEAR_LSE's its shard attributes; the gradients' row inputs
 * (nll or lse, dy) f32 of that shape. */
static const char *linear_fits(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *w = in_node(g, n, 1);
  int targets = ir_linear_targets(n->op), first_row = targets ? 3 : 2;
  if (x->rank < 2 || w->rank != 2 || !sem_dtype_is_float(x->dtype) || !sem_dtype_is_float(w->dtype))
    return "linear_ce needs x [..., C] and a weight [C, V] or [V, C]";
  if (w->dims[n->attr[0] ? 1 : 0] != x->dims[x->rank - 1]) return "linear_ce: the weight's width is not x's";
  if (targets) {
    IrNode *t = in_node(g, n, 2);
    if (t->rank != x->rank - 1 || sem_dtype_is_float(t->dtype)) return "linear_ce needs int targets [...] of x's leading shape";
    for (int i = 0; i < t->rank; i++)
      if (x->dims[i] != t->dims[i]) return "linear_ce: x and the targets differ";
  } else if (n->attr[1] < 0 || n->attr[1] > IRG_COUNT || n->attr[2] < 0) {
    return "linear_lse: bad vocabulary shard attributes";
  }
  for (int k = first_row; k < n->nin; k++) {
    IrNode *r = in_node(g, n, k);
    if (r->rank != x->rank - 1 || r->dtype != DT_F32) return "linear_ce's gradients need the rows' values and their gradient, f32 [...]";
    for (int i = 0; i < r->rank; i++)
      if (r->dims[i] != x->dims[i]) return "linear_ce's gradients: a row value of another shape";
  }
  return NULL;
}

/* Their results, f32: the rows' values (x's shape without its last axis),
 * dx (x's shape) or dw (w's shape). */
static const char *linear_result(IrGraph *g, IrNode *n) {
  const char *why = linear_fits(g, n);
  if (why) return why;
  IrLinearRole role = ir_linear_role(n->op);
  copy_type(n, in_node(g, n, role == IR_LINEAR_DW ? 1 : 0));
  if (role == IR_LINEAR_ROWS) n->rank--;
  n->dtype = DT_F32;
  return NULL;
}

static const char *irshape_LINEAR_CE(IrGraph *g, IrNode *n) { return linear_result(g, n); }
static const char *irshape_LINEAR_CE_BWD(IrGraph *g, IrNode *n) { return linear_result(g, n); }
static const char *irshape_LINEAR_CE_BWD_W(IrGraph *g, IrNode *n) { return linear_result(g, n); }
static const char *irshape_LINEAR_LSE(IrGraph *g, IrNode *n) { return linear_result(g, n); }
static const char *irshape_LINEAR_LSE_BWD(IrGraph *g, IrNode *n) { return linear_result(g, n); }
static const char *irshape_LINEAR_LSE_BWD_W(IrGraph *g, IrNode *n) { return linear_result(g, n); }

static const char *irshape_CALL(IrGraph *g, IrNode *n) {
  (void)g;
  return n->rank < 0 ? "call needs its result shape" : NULL;
}

static const char *comm_same(IrGraph *g, IrNode *n) {
  if (n->attr[0] < 0 || n->attr[0] >= IRG_COUNT) return "unknown process group";
  if (n->rank < 0) return unary_same(g, n);
  n->dtype = in_node(g, n, 0)->dtype;
  return NULL;
}

static const char *irshape_ALL_REDUCE(IrGraph *g, IrNode *n) {
  n->rank = -1;
  return comm_same(g, n);
}
static const char *irshape_SHARD_SLICE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (n->rank != x->rank) return "shard_slice keeps the rank";
  int64_t axis = n->attr[1];
  for (int i = 0; i < x->rank; i++)
    if (i != axis && n->dims[i] != x->dims[i]) return "shard_slice changes only its axis";
  if (axis < 0 || axis >= x->rank || n->dims[axis] < 1 || x->dims[axis] % n->dims[axis]) return "shard_slice axis does not divide";
  return comm_same(g, n);
}

static const char *irshape_COPY_TO_GROUP(IrGraph *g, IrNode *n) {
  n->rank = -1;
  return comm_same(g, n);
}

static const char *irshape_PICK(IrGraph *g, IrNode *n) {
  IrNode *z = in_node(g, n, 0), *t = in_node(g, n, 1);
  if (z->rank != t->rank + 1 || sem_dtype_is_float(t->dtype)) return "pick needs z [..., V] and integer t [...]";
  for (int i = 0; i < t->rank; i++)
    if (z->dims[i] != t->dims[i]) return "pick: z and t differ";
  copy_type(n, t);
  n->dtype = z->dtype;
  return NULL;
}

static const char *irshape_PICK_BWD(IrGraph *g, IrNode *n) {
  IrNode *dy = in_node(g, n, 0), *t = in_node(g, n, 1);
  n->dtype = dy->dtype;
  if (n->rank != dy->rank + 1 || !same_dims(dy, t)) return "pick_bwd needs dy [...], t [...] and a [..., V] result";
  for (int i = 0; i < dy->rank; i++)
    if (n->dims[i] != dy->dims[i]) return "pick_bwd: result and dy differ";
  return NULL;
}

static const char *irshape_TOPK(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (x->rank < 1 || !sem_dtype_is_float(x->dtype)) return "topk needs a float x [..., V]";
  if (n->attr[0] < 1 || n->attr[0] > x->dims[x->rank - 1]) return "topk needs 1 <= k <= V";
  copy_type(n, x);
  n->dims[n->rank - 1] = n->attr[0];
  n->dtype = DT_I32;
  return NULL;
}

/* x [..., V] and idx [..., K] agree on every axis but the last */
static int take_fits(const IrNode *x, const IrNode *idx) {
  if (x->rank < 1 || x->rank != idx->rank || sem_dtype_is_float(idx->dtype)) return 0;
  for (int i = 0; i + 1 < x->rank; i++)
    if (x->dims[i] != idx->dims[i]) return 0;
  return 1;
}

static const char *irshape_TAKE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *idx = in_node(g, n, 1);
  if (!take_fits(x, idx)) return "take needs x [..., V] and integer idx [..., K]";
  copy_type(n, idx);
  n->dtype = x->dtype;
  return NULL;
}

static const char *irshape_TAKE_BWD(IrGraph *g, IrNode *n) {
  IrNode *dy = in_node(g, n, 0), *idx = in_node(g, n, 1);
  n->dtype = dy->dtype;
  if (!same_dims(dy, idx) || !take_fits(n, idx)) return "take_bwd needs dy [..., K], idx [..., K] and a [..., V] result";
  return NULL;
}

static const char *irshape_ONE_HOT(IrGraph *g, IrNode *n) {
  IrNode *idx = in_node(g, n, 0);
  if (sem_dtype_is_float(idx->dtype) || idx->rank >= IR_MAX_RANK || n->attr[0] < 1 || !sem_dtype_is_float(n->dtype))
    return "one_hot needs integer idx [...], n >= 1 and a float result";
  copy_type(n, idx);
  n->dims[n->rank++] = n->attr[0];
  return NULL;
}

/* The routing of mixture-of-experts ops: idx i32[B, T, K] and w [B, T, K], float w. */
static int moe_routing_fits(const IrNode *idx, const IrNode *w) {
  return idx->rank == 3 && !sem_dtype_is_float(idx->dtype) && sem_dtype_is_float(w->dtype) && same_dims(idx, w);
}

static const char *irshape_MOE_DISPATCH(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *idx = in_node(g, n, 1), *w = in_node(g, n, 2);
  if (x->rank != 3 || !moe_routing_fits(idx, w) || x->dims[0] != idx->dims[0] || x->dims[1] != idx->dims[1] ||
      n->attr[0] < 1 || n->attr[1] < 0)
    return "moe_dispatch needs x [B, T, C], idx i32[B, T, K], w [B, T, K], experts >= 1 and capacity >= 0";
  n->dtype = x->dtype;
  if (n->attr[1] == 0) { /* packed: every choice's row, sorted by expert */
    n->rank = 2;
    n->dims[0] = ir_numel(idx);
    n->dims[1] = x->dims[2];
    return NULL;
  }
  n->rank = 4;
  n->dims[0] = x->dims[0];
  n->dims[1] = n->attr[0];
  n->dims[2] = n->attr[1];
  n->dims[3] = x->dims[2];
  return NULL;
}

/* y of a combine or gate gradient: [B, E, cap, C] slots, or packed [B T K, C] rows
 * (then attr[0] = E >= 1) */
static int moe_rows_fit(const IrNode *n, const IrNode *y, const IrNode *idx) {
  if (y->rank == 2) return n->attr[0] >= 1 && y->dims[0] == ir_numel(idx);
  return y->rank == 4 && y->dims[0] == idx->dims[0];
}

static const char *irshape_MOE_COMBINE(IrGraph *g, IrNode *n) {
  IrNode *y = in_node(g, n, 0), *idx = in_node(g, n, 1), *w = in_node(g, n, 2);
  if (!moe_routing_fits(idx, w) || !moe_rows_fit(n, y, idx))
    return "moe_combine needs y [B, E, cap, C] (or packed [B T K, C] with experts >= 1), idx i32[B, T, K] and w [B, T, K]";
  n->dtype = y->dtype;
  n->rank = 3;
  n->dims[0] = idx->dims[0];
  n->dims[1] = idx->dims[1];
  n->dims[2] = y->dims[y->rank - 1];
  return NULL;
}

static const char *irshape_MOE_GATE_GRAD(IrGraph *g, IrNode *n) {
  IrNode *a = in_node(g, n, 0), *y = in_node(g, n, 1), *idx = in_node(g, n, 2);
  if (a->rank != 3 || idx->rank != 3 || sem_dtype_is_float(idx->dtype) || a->dims[0] != idx->dims[0] ||
      a->dims[1] != idx->dims[1] || !moe_rows_fit(n, y, idx) || y->dims[y->rank - 1] != a->dims[2])
    return "moe_gate_grad needs a [B, T, C], y [B, E, cap, C] (or packed [B T K, C]) and idx i32[B, T, K]";
  copy_type(n, idx);
  n->dtype = a->dtype;
  return NULL;
}

static const char *irshape_MOE_EXPERT_IDS(IrGraph *g, IrNode *n) {
  IrNode *idx = in_node(g, n, 0);
  if (idx->rank != 3 || sem_dtype_is_float(idx->dtype) || n->attr[0] < 1)
    return "moe_expert_ids needs idx i32[B, T, K] and experts >= 1";
  n->dtype = idx->dtype;
  n->rank = 1;
  n->dims[0] = ir_numel(idx);
  return NULL;
}

static const char *irshape_GROUPED_MM(IrGraph *g, IrNode *n) {
  IrNode *a = in_node(g, n, 0), *w = in_node(g, n, 1), *ids = in_node(g, n, 2);
  int t = n->attr[0] != 0;
  if (a->rank != 2 || w->rank != 3 || ids->rank != 1 || sem_dtype_is_float(ids->dtype) || !sem_dtype_is_float(a->dtype) ||
      ids->dims[0] != a->dims[0] || w->dims[t ? 2 : 1] != a->dims[1])
    return "grouped_mm needs a [N, X], w [E, X, Y] (or [E, Y, X] transposed) and ids i32[N]";
  n->dtype = a->dtype;
  n->rank = 2;
  n->dims[0] = a->dims[0];
  n->dims[1] = w->dims[t ? 1 : 2];
  return NULL;
}

static const char *irshape_GROUPED_MM_WGRAD(IrGraph *g, IrNode *n) {
  IrNode *a = in_node(g, n, 0), *dy = in_node(g, n, 1), *ids = in_node(g, n, 2);
  if (a->rank != 2 || dy->rank != 2 || ids->rank != 1 || sem_dtype_is_float(ids->dtype) || a->dims[0] != dy->dims[0] ||
      ids->dims[0] != a->dims[0] || n->attr[0] < 1)
    return "grouped_mm_wgrad needs a [N, X], dy [N, Y], ids i32[N] and experts >= 1";
  n->dtype = a->dtype;
  n->rank = 3;
  n->dims[0] = n->attr[0];
  n->dims[1] = a->dims[1];
  n->dims[2] = dy->dims[1];
  return NULL;
}

static const char *irshape_AUX_LOSS(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *v = in_node(g, n, 1);
  if (v->rank != 0 || !sem_dtype_is_float(v->dtype)) return "aux_loss needs a float scalar loss";
  copy_type(n, x);
  return NULL;
}

static const char *irshape_TRAINING(IrGraph *g, IrNode *n) {
  (void)g;
  n->rank = 0;
  n->dtype = DT_F32;
  return NULL;
}

static const char *irshape_LOSS_SEED(IrGraph *g, IrNode *n) {
  (void)g;
  n->rank = 0;
  n->dtype = DT_F32;
  return NULL;
}

/* Gather / scatter / send carry their output shape (it depends on the group size). */
static const char *irshape_ALL_GATHER(IrGraph *g, IrNode *n) { return comm_same(g, n); }
static const char *irshape_REDUCE_SCATTER(IrGraph *g, IrNode *n) { return comm_same(g, n); }
static const char *irshape_SEND(IrGraph *g, IrNode *n) { return comm_same(g, n); }
static const char *irshape_ALL_TO_ALL(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  if (n->rank < 0) return "all_to_all needs its output shape";
  if (n->attr[1] < 0 || n->attr[1] >= x->rank || n->attr[2] < 0 || n->attr[2] >= x->rank || ir_numel(n) != ir_numel(x) ||
      n->rank != x->rank)
    return "all_to_all needs split and concat axes of x and an output of as many elements";
  return comm_same(g, n);
}

/* q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv], f32 (or, the CUDA target's
 * tensor-core kernels under 16-bit storage, all three bf16 or all three f16:
 * precision.h), H a multiple of Hk. */
static const char *attention_fits(IrGraph *g, IrNode *n) {
  IrNode *q = in_node(g, n, 0), *k = in_node(g, n, 1), *v = in_node(g, n, 2);
  int qkv_type = (q->dtype == DT_F32 || q->dtype == DT_BF16 || q->dtype == DT_F16) && k->dtype == q->dtype && v->dtype == q->dtype;
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || !qkv_type)
    return "attention needs f32 q [B, H, T, D], k [B, Hk, S, D] and v [B, Hk, S, Dv] (or all three bf16 or f16)";
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0] || k->dims[3] != q->dims[3] || v->dims[1] != k->dims[1] ||
      v->dims[2] != k->dims[2])
    return "attention's q, k and v disagree (q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv])";
  if (k->dims[1] < 1 || q->dims[1] % k->dims[1]) return "attention's query heads must be a multiple of its key heads";
  for (int a = 1; a <= 2; a++)
    if (n->attr[a] < 0 || n->attr[a] > IRG_COUNT) return "attention's position layout names no process group";
  if (n->attr[3] < 0 || (n->attr[3] > 0 && !n->attr[0])) return "attention's window needs a causal mask and W >= 1";
  if (n->attr[4] < 0 || (n->attr[4] > 0 && (!n->attr[2] || n->attr[5] < 2 || n->attr[4] > n->attr[5])))
    return "attention over one ring block needs its group's key layout, the group's size and a step below it";
  return NULL;
}

/* ---- convolutional networks (conv.h) ---- */

/* The attributes of a convolution op, checked: positive strides, dilations
 * and groups, padding >= 0, an output of at least one cell. */
static const char *conv_attrs_fit(const IrNode *n, int64_t *Ho, int64_t *Wo) {
  const int64_t *a = n->attr;
  if (a[CONV_A_GROUPS] < 1 || a[CONV_A_KH] < 1 || a[CONV_A_KW] < 1) return "conv2d needs groups >= 1 and a kernel of at least 1 x 1";
  *Ho = conv_out_len(a[CONV_A_H], a[CONV_A_KH], a[CONV_A_SH], a[CONV_A_PH], a[CONV_A_DH]);
  *Wo = conv_out_len(a[CONV_A_W], a[CONV_A_KW], a[CONV_A_SW], a[CONV_A_PW], a[CONV_A_DW]);
  if (*Ho < 1 || *Wo < 1) return "conv2d's kernel (dilated) is larger than its padded input, or a stride, dilation or padding is out of range";
  return NULL;
}

/* x [N, C, H, W] and w [O, C/g, KH, KW] against the attributes */
static const char *conv_operands_fit(const IrNode *n, const IrNode *x, const IrNode *w) {
  const int64_t *a = n->attr;
  int64_t g = a[CONV_A_GROUPS];
  if (x->rank != 4 || w->rank != 4 || !sem_dtype_is_float(x->dtype) || !sem_dtype_is_float(w->dtype))
    return "conv2d needs float x [N, C, H, W] and w [O, C/groups, KH, KW]";
  if (x->dims[2] != a[CONV_A_H] || x->dims[3] != a[CONV_A_W] || w->dims[2] != a[CONV_A_KH] || w->dims[3] != a[CONV_A_KW])
    return "conv2d's operands disagree with its attributes (H, W, KH, KW)";
  if (x->dims[1] != w->dims[1] * g || w->dims[0] % g) return "conv2d's channels: x has C = groups x w's second dimension, and w's O divides by groups";
  return NULL;
}

ConvShape ir_conv_shape(const IrGraph *g, const IrNode *n) {
  const IrNode *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
  if (n->op == IR_CONV2D) return conv_shape_of(a->dims[0], a->dims[1], b->dims[0], n->attr);
  if (n->op == IR_CONV2D_BWD_DATA) return conv_shape_of(a->dims[0], n->dims[1], a->dims[1], n->attr);
  return conv_shape_of(a->dims[0], a->dims[1], b->dims[1], n->attr);
}

PoolShape ir_pool_shape(const IrGraph *g, const IrNode *n) {
  const IrNode *x = &g->nodes[n->in[0]];
  return pool_shape_of(x->dims[0], x->dims[1], x->dims[2], x->dims[3], n->attr);
}

static const char *irshape_CONV2D(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *w = in_node(g, n, 1);
  int64_t Ho, Wo;
  const char *why = conv_attrs_fit(n, &Ho, &Wo);
  if (!why) why = conv_operands_fit(n, x, w);
  if (why) return why;
  copy_type(n, x);
  n->dims[1] = w->dims[0];
  n->dims[2] = Ho;
  n->dims[3] = Wo;
  return NULL;
}

static const char *irshape_CONV2D_BWD_DATA(IrGraph *g, IrNode *n) {
  IrNode *dy = in_node(g, n, 0), *w = in_node(g, n, 1);
  int64_t Ho, Wo;
  const char *why = conv_attrs_fit(n, &Ho, &Wo);
  if (why) return why;
  if (dy->rank != 4 || w->rank != 4 || dy->dims[1] != w->dims[0] || dy->dims[2] != Ho || dy->dims[3] != Wo ||
      w->dims[2] != n->attr[CONV_A_KH] || w->dims[3] != n->attr[CONV_A_KW] || w->dims[0] % n->attr[CONV_A_GROUPS])
    return "conv2d_bwd_data needs dy [N, O, Ho, Wo] and w [O, C/groups, KH, KW] as its attributes give them";
  copy_type(n, dy);
  n->dims[1] = w->dims[1] * n->attr[CONV_A_GROUPS];
  n->dims[2] = n->attr[CONV_A_H];
  n->dims[3] = n->attr[CONV_A_W];
  return NULL;
}

static const char *irshape_CONV2D_BWD_FILTER(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *dy = in_node(g, n, 1);
  int64_t Ho, Wo, G = n->attr[CONV_A_GROUPS];
  const char *why = conv_attrs_fit(n, &Ho, &Wo);
  if (why) return why;
  if (x->rank != 4 || dy->rank != 4 || x->dims[0] != dy->dims[0] || x->dims[2] != n->attr[CONV_A_H] ||
      x->dims[3] != n->attr[CONV_A_W] || dy->dims[2] != Ho || dy->dims[3] != Wo || x->dims[1] % G || dy->dims[1] % G)
    return "conv2d_bwd_filter needs x [N, C, H, W] and dy [N, O, Ho, Wo] as its attributes give them";
  copy_type(n, dy);
  n->dims[0] = dy->dims[1];
  n->dims[1] = x->dims[1] / G;
  n->dims[2] = n->attr[CONV_A_KH];
  n->dims[3] = n->attr[CONV_A_KW];
  return NULL;
}

static const char *irshape_POOL2D(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0);
  int64_t Ho, Wo;
  if (x->rank != 4 || !sem_dtype_is_float(x->dtype)) return "pool2d needs a float x [N, C, H, W]";
  if (pool_out_size(n->attr, x->dims[2], x->dims[3], &Ho, &Wo))
    return "pool2d's window is larger than its padded input, its padding more than half the window, or its mode unknown";
  copy_type(n, x);
  n->dims[2] = Ho;
  n->dims[3] = Wo;
  return NULL;
}

static const char *irshape_POOL2D_BWD(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *dy = in_node(g, n, 1);
  int64_t Ho, Wo;
  if (x->rank != 4 || dy->rank != 4 || pool_out_size(n->attr, x->dims[2], x->dims[3], &Ho, &Wo) ||
      dy->dims[0] != x->dims[0] || dy->dims[1] != x->dims[1] || dy->dims[2] != Ho || dy->dims[3] != Wo)
    return "pool2d_bwd needs x [N, C, H, W] and dy [N, C, Ho, Wo] as the pooling gives them";
  copy_type(n, x);
  n->dtype = dy->dtype;
  return NULL;
}

static const char *irshape_STATE_UPDATE(IrGraph *g, IrNode *n) {
  IrNode *x = in_node(g, n, 0), *v = in_node(g, n, 1), *p = in_node(g, n, 2);
  if (p->op != IR_PARAM || !same_dims(v, p) || !sem_dtype_is_float(v->dtype))
    return "state_update needs x, a float value and the PARAM node it replaces, of the value's shape";
  copy_type(n, x);
  return NULL;
}

static const char *irshape_ATTENTION(IrGraph *g, IrNode *n) {
  const char *why = attention_fits(g, n);
  if (why) return why;
  IrNode *q = in_node(g, n, 0), *v = in_node(g, n, 2);
  copy_type(n, q);
  n->dims[3] = v->dims[3] + 1;
  return NULL;
}

static const char *irshape_ATTENTION_BWD(IrGraph *g, IrNode *n) {
  const char *why = attention_fits(g, n);
  if (why) return why;
  IrNode *q = in_node(g, n, 0), *k = in_node(g, n, 1), *v = in_node(g, n, 2), *o = in_node(g, n, 3),
         *dout = in_node(g, n, 4);
  if (o->rank != 4 || !same_dims(o, dout) || o->dims[0] != q->dims[0] || o->dims[1] != q->dims[1] ||
      o->dims[2] != q->dims[2] || o->dims[3] != v->dims[3] + 1 || o->dtype != DT_F32 || dout->dtype != DT_F32)
    return "attention_bwd needs the packed output [B, H, T, Dv + 1] and its gradient";
  n->rank = 1;
  n->dims[0] = ir_numel(q) + ir_numel(k) + ir_numel(v);
  n->dtype = DT_F32;
  return NULL;
}

static const char *irshape_ATTN_MERGE(IrGraph *g, IrNode *n) {
  if (n->nin < 1) return "attn_merge needs the blocks' outputs";
  IrNode *a = in_node(g, n, 0);
  if (a->rank != 4 || a->dims[3] < 2 || a->dtype != DT_F32) return "attn_merge needs packed f32 attention outputs [B, H, T, Dv + 1]";
  for (int i = 1; i < n->nin; i++) {
    IrNode *b = in_node(g, n, i);
    if (!same_dims(a, b) || b->dtype != a->dtype) return "attn_merge's inputs differ in shape or type";
  }
  copy_type(n, a);
  return NULL;
}

/* The result type travels in the attributes (ir_ops.h); arguments are f32. */
static const char *irshape_EXTERN(IrGraph *g, IrNode *n) {
  for (int k = 0; k < n->nin; k++)
    if (in_node(g, n, k)->dtype != DT_F32) return "extern arguments are f32";
  if (n->attr[0] < 0 || n->attr[1] < 0 || n->attr[1] > IR_MAX_RANK) return "extern needs its table index and result rank";
  n->rank = (int)n->attr[1];
  for (int i = 0; i < n->rank; i++) {
    n->dims[i] = n->attr[2 + i];
    if (n->dims[i] < 1) return "extern result dimension below 1";
  }
  n->dtype = DT_F32;
  return NULL;
}

static const char *irshape_EXTERN_GRAD(IrGraph *g, IrNode *n) {
  if (n->nin < 2) return "extern_grad needs the arguments and the result's gradient";
  int64_t total = 0;
  for (int k = 0; k < n->nin; k++) {
    const IrNode *x = in_node(g, n, k);
    if (x->dtype != DT_F32) return "extern arguments are f32";
    if (k < n->nin - 1) total += ir_numel(x);
  }
  n->rank = 1;
  n->dims[0] = total;
  n->dtype = DT_F32;
  return NULL;
}

static const ShapeRule shape_rules[] = {
#define X(id, name, nin, flags) irshape_##id,
    IR_OPS(X)
#undef X
};

/* ---- construction ---- */

IrModule *ir_module_new(Arena *arena) {
  IrModule *m = arena_alloc(arena, sizeof *m);
  m->arena = arena;
  return m;
}

IrGraph *ir_graph_new(IrModule *m, const char *name) {
  if (m->ngraphs == m->capgraphs) {
    int cap = m->capgraphs ? m->capgraphs * 2 : 4;
    IrGraph **g = arena_alloc(m->arena, sizeof(IrGraph *) * (size_t)cap);
    if (m->ngraphs) memcpy(g, m->graphs, sizeof(IrGraph *) * (size_t)m->ngraphs);
    m->graphs = g;
    m->capgraphs = cap;
  }
  IrGraph *g = arena_alloc(m->arena, sizeof *g);
  g->arena = m->arena;
  g->name = arena_strdup(m->arena, name);
  g->count = 1;
  m->graphs[m->ngraphs++] = g;
  return g;
}

int ir_add_param(IrModule *m, const IrParam *p) {
  if (m->nparams == m->capparams) {
    int cap = m->capparams ? m->capparams * 2 : 16;
    IrParam *ps = arena_alloc(m->arena, sizeof(IrParam) * (size_t)cap);
    if (m->nparams) memcpy(ps, m->params, sizeof(IrParam) * (size_t)m->nparams);
    m->params = ps;
    m->capparams = cap;
  }
  m->params[m->nparams] = *p;
  return m->nparams++;
}

int64_t ir_extern_numel(const IrExternShape *s) { return numel_of(s->rank, s->dims); }

static int same_shape(const IrExternShape *a, const IrExternShape *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

int ir_add_extern(IrModule *m, const IrExtern *e) {
  for (int i = 0; i < m->nexterns; i++) {
    const IrExtern *x = &m->externs[i];
    int same = !strcmp(x->name, e->name) && !strcmp(x->where, e->where) && x->nargs == e->nargs && x->ndims == e->ndims && same_shape(&x->out, &e->out);
    for (int k = 0; same && k < e->nargs; k++) same = same_shape(&x->args[k], &e->args[k]);
    for (int k = 0; same && k < e->ndims; k++) same = x->dims[k] == e->dims[k];
    if (same) return i;
  }
  IrExtern *t = arena_alloc(m->arena, sizeof(IrExtern) * (size_t)(m->nexterns + 1));
  if (m->nexterns) memcpy(t, m->externs, sizeof(IrExtern) * (size_t)m->nexterns);
  t[m->nexterns] = *e;
  m->externs = t;
  return m->nexterns++;
}

/* An EXTERN / EXTERN_GRAD node against its table entry. */
static const char *verify_extern(const IrModule *m, const IrGraph *g, const IrNode *n) {
  if (n->attr[0] < 0 || n->attr[0] >= m->nexterns) return "unknown extern";
  const IrExtern *e = &m->externs[n->attr[0]];
  int grad = n->op == IR_EXTERN_GRAD;
  if (n->nin != e->nargs + grad) return "extern called with the wrong number of arguments";
  for (int k = 0; k < n->nin; k++) {
    const IrNode *x = &g->nodes[n->in[k]];
    const IrExternShape *want = k < e->nargs ? &e->args[k] : &e->out;
    int ok = x->rank == want->rank;
    for (int i = 0; ok && i < x->rank; i++) ok = x->dims[i] == want->dims[i];
    if (!ok) return "extern argument shape differs from its table entry";
  }
  if (grad && !e->grad) return "extern_grad of an extern without a gradient function";
  if (!grad) {
    int ok = n->rank == e->out.rank;
    for (int i = 0; ok && i < n->rank; i++) ok = n->dims[i] == e->out.dims[i];
    if (!ok) return "extern result shape differs from its table entry";
  }
  return NULL;
}

void ir_graph_reserve(IrGraph *g, int n) {
  if (n <= g->cap) return;
  IrNode *nodes = arena_alloc_raw(g->arena, sizeof(IrNode) * (size_t)n);
  if (g->nnodes) memcpy(nodes, g->nodes, sizeof(IrNode) * (size_t)g->nnodes);
  g->nodes = nodes;
  g->cap = n;
}

/* The slot past the last node, the array grown (doubled) when full; the
 * caller fills it and counts it in g->nnodes. */
static IrNode *next_slot(IrGraph *g) {
  if (g->nnodes == g->cap) {
    int cap = g->cap ? g->cap * 2 : 64;
    /* not zeroed: the old nodes are copied in, and ir_add / ir_add_copy
     * write each new slot whole before it counts */
    IrNode *nodes = arena_alloc_raw(g->arena, sizeof(IrNode) * (size_t)cap);
    if (g->nnodes) memcpy(nodes, g->nodes, sizeof(IrNode) * (size_t)g->nnodes);
    g->nodes = nodes;
    g->cap = cap;
  }
  return &g->nodes[g->nnodes];
}

int ir_add_copy(IrGraph *g, const IrNode *n, const int *map) {
  IrNode *c = next_slot(g);
  *c = *n;
  c->in = arena_alloc(g->arena, sizeof(int) * (size_t)(n->nin + 1));
  for (int k = 0; k < n->nin; k++) c->in[k] = map[n->in[k]];
  return g->nnodes++;
}

int ir_add(IrGraph *g, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr,
           DType dtype, int rank, const int64_t *dims, const char **why) {
  const char *err = NULL;
  if (op_arity[op] >= 0 && nin != op_arity[op]) err = "wrong number of inputs";
  if (nattr > IR_NATTR || rank > IR_MAX_RANK) err = "too many attributes or dimensions";
  for (int i = 0; !err && i < nin; i++)
    if (in[i] < 0 || in[i] >= g->nnodes) err = "input is not an earlier node";
  if (err) {
    if (why) *why = err;
    return -1;
  }
  IrNode *n = next_slot(g);
  memset(n, 0, sizeof *n);
  n->op = op;
  n->nin = nin;
  n->in = arena_alloc(g->arena, sizeof(int) * (size_t)(nin + 1));
  if (nin) memcpy(n->in, in, sizeof(int) * (size_t)nin);
  if (nattr) memcpy(n->attr, attr, sizeof(int64_t) * (size_t)nattr);
  n->fattr = fattr;
  n->dtype = dtype;
  n->rank = rank;
  if (rank > 0) memcpy(n->dims, dims, sizeof(int64_t) * (size_t)rank);
  n->span = span_none;
  err = shape_rules[op](g, n);
  if (!err && n->rank < 0) err = "no shape";
  if (!err && !numel_fits(n->rank, n->dims)) err = "more than 2^53 elements";
  if (err) {
    if (why) *why = err;
    return -1;
  }
  return g->nnodes++;
}

/* ---- verification ---- */

/* A step cut into forward and backward (IrGraph.fb_split): the cut lies
 * inside the graph, and the backward part has the gradient outputs. */
static int verify_fb_split(const IrGraph *g, FILE *out) {
  if (!g->fb_split) return 0;
  if (g->fb_split < 0 || g->fb_split > g->nnodes) {
    if (out) fprintf(out, "ir verify: graph %s: forward/backward cut at %%%d is outside the graph\n", g->name, g->fb_split);
    return 1;
  }
  int problems = 0;
  for (int k = g->noutputs - g->ngrad_params; k < g->noutputs; k++) {
    const IrNode *o = &g->nodes[g->outputs[k]];
    if (g->outputs[k] < g->fb_split && !(op_flags[o->op] & IRF_LEAF)) {
      if (out) fprintf(out, "ir verify: graph %s: gradient output %d (%%%d) is computed before the backward part\n", g->name, k, g->outputs[k]);
      problems++;
    }
  }
  return problems;
}

int ir_verify_pipeline_cut(const IrGraph *g, FILE *out) {
  if (g->fb_split <= 0) {
    if (out) fprintf(out, "ir verify: graph %s is not cut into forward and backward\n", g->name);
    return 1;
  }
  int problems = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if ((n->op != IR_SEND && n->op != IR_RECV) || n->attr[0] != IRG_PP) continue;
    int forward = (n->op == IR_SEND) == (n->attr[1] > 0);
    if (forward != (i < g->fb_split)) {
      if (out)
        fprintf(out, "ir verify: graph %s, %%%d (%s): a transfer toward the %s chunk in the %s part of the step\n", g->name, i,
                op_names[n->op], forward ? "next" : "previous", i < g->fb_split ? "forward" : "backward");
      problems++;
    }
  }
  return problems;
}

IrReaders ir_readers(const IrNode *nodes, int n, Arena *a) {
  IrReaders r;
  int nuse = 0;
  for (int i = 0; i < n; i++) nuse += nodes[i].nin;
  r.start = arena_alloc(a, sizeof(int) * (size_t)(n + 2));
  r.node = arena_alloc(a, sizeof(int) * (size_t)(nuse + 1));
  r.slot = arena_alloc(a, sizeof(int) * (size_t)(nuse + 1));
  int *fill = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nodes[i].nin; k++) r.start[nodes[i].in[k] + 1]++;
  for (int i = 0; i < n; i++) r.start[i + 1] += r.start[i];
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nodes[i].nin; k++) {
      int v = nodes[i].in[k], at = r.start[v] + fill[v]++;
      r.node[at] = i;
      r.slot[at] = k;
    }
  return r;
}

int ir_drop_unread(IrGraph *g, int (*droppable)(IrOp op)) {
  int n = g->nnodes;
  int *readers = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1)), *to = arena_alloc(g->arena, sizeof(int) * (size_t)(n + 1));
  char *dead = arena_alloc(g->arena, (size_t)n + 1);
  memset(readers, 0, sizeof(int) * (size_t)(n + 1));
  memset(dead, 0, (size_t)n + 1);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) readers[g->nodes[i].in[k]]++;
  for (int k = 0; k < g->noutputs; k++) readers[g->outputs[k]]++;
  int ndead = 0;
  for (int i = n - 1; i >= 0; i--) {
    if (readers[i] || !droppable(g->nodes[i].op)) continue;
    dead[i] = 1, ndead++;
    for (int k = 0; k < g->nodes[i].nin; k++) readers[g->nodes[i].in[k]]--;
  }
  if (!ndead) return 0;
  int m = 0, split = g->fb_split;
  for (int i = 0; i < n; i++) {
    to[i] = -1;
    if (i == split) g->fb_split = m;
    if (dead[i]) continue;
    IrNode x = g->nodes[i];
    for (int k = 0; k < x.nin; k++) x.in[k] = to[x.in[k]];
    to[i] = m;
    g->nodes[m++] = x;
  }
  if (split >= n) g->fb_split = m;
  g->nnodes = m;
  for (int k = 0; k < g->noutputs; k++) g->outputs[k] = to[g->outputs[k]];
  return ndead;
}

IrLinearRole ir_linear_role(IrOp op) {
  switch (op) {
  case IR_LINEAR_CE:
  case IR_LINEAR_LSE: return IR_LINEAR_ROWS;
  case IR_LINEAR_CE_BWD:
  case IR_LINEAR_LSE_BWD: return IR_LINEAR_DX;
  case IR_LINEAR_CE_BWD_W:
  case IR_LINEAR_LSE_BWD_W: return IR_LINEAR_DW;
  default: return IR_LINEAR_NONE;
  }
}

int ir_vocab_mask_in_place(const IrGraph *g, int in, int out) {
  const IrNode *n = &g->nodes[out];
  return n->op == IR_VOCAB_MASK && n->nin == 1 && n->in[0] == in && n->attr[0] == 0 && n->rank >= 1 &&
         (n->dtype == DT_F32 || n->dtype == DT_BF16 || n->dtype == DT_F16) && g->nodes[in].dtype == n->dtype;
}

int ir_linear_targets(IrOp op) { return op == IR_LINEAR_CE || op == IR_LINEAR_CE_BWD || op == IR_LINEAR_CE_BWD_W; }

DType ir_param_read_type(const IrModule *m, int p) {
  for (int gi = 0; gi < m->ngraphs; gi++)
    for (int i = 0; i < m->graphs[gi]->nnodes; i++) {
      const IrNode *n = &m->graphs[gi]->nodes[i];
      if (n->op == IR_PARAM && n->attr[0] == p && n->dtype != m->params[p].dtype) return n->dtype;
    }
  return m->params[p].dtype;
}

int ir_verify(const IrModule *m, FILE *out) {
  int problems = 0;
  for (int gi = 0; gi < m->ngraphs; gi++) {
    IrGraph *g = m->graphs[gi];
    for (int i = 0; i < g->nnodes; i++) {
      IrNode *n = &g->nodes[i];
      const char *err = NULL;
      if (op_arity[n->op] >= 0 && n->nin != op_arity[n->op]) err = "wrong number of inputs";
      for (int k = 0; !err && k < n->nin; k++)
        if (n->in[k] < 0 || n->in[k] >= i) err = "input does not precede its user";
      if (!err && n->op == IR_PARAM && (n->attr[0] < 0 || n->attr[0] >= m->nparams)) err = "unknown parameter";
      if (!err && n->op == IR_ARG && (n->attr[0] < 0 || n->attr[0] >= g->nargs)) err = "unknown argument";
      if (!err && n->op == IR_CALL && (n->attr[0] <= gi || n->attr[0] >= m->ngraphs)) err = "call of an unknown graph";
      if (!err && (n->op == IR_EXTERN || n->op == IR_EXTERN_GRAD)) err = verify_extern(m, g, n);
      if (!err && n->op == IR_STATE_UPDATE) {
        const IrNode *p = &g->nodes[n->in[2]];
        if (p->op != IR_PARAM || p->attr[0] < 0 || p->attr[0] >= m->nparams || !m->params[p->attr[0]].state)
          err = "state_update writes a parameter that is not a state parameter";
      }
      if (!err) {
        IrNode copy = *n;
        int keep_shape = copy.op == IR_FILL || copy.op == IR_RESHAPE || copy.op == IR_EXPAND || copy.op == IR_SUM_TO ||
                         copy.op == IR_PAD || copy.op == IR_EMBEDDING_BWD || copy.op == IR_SLICE ||
                         (op_flags[copy.op] & IRF_LEAF) || copy.op == IR_CALL || copy.op == IR_ALL_GATHER || copy.op == IR_ALL_TO_ALL ||
                         copy.op == IR_REDUCE_SCATTER || copy.op == IR_SEND || copy.op == IR_SHARD_SLICE ||
                         copy.op == IR_PICK_BWD || copy.op == IR_TAKE_BWD;
        if (!keep_shape) copy.rank = -1;
        err = shape_rules[n->op](g, &copy);
        if (!err && !same_dims(&copy, n)) err = "stored shape differs from the shape rule";
        /* mixed precision stores float values in 16 bits and computes from them in
         * fp32 (compiler/ir/precision.h): a float node may differ from the rule's type
         * when either is 16-bit */
        int stored16 = (n->dtype == DT_BF16 || n->dtype == DT_F16 || copy.dtype == DT_BF16 || copy.dtype == DT_F16) &&
                       sem_dtype_is_float(copy.dtype) && sem_dtype_is_float(n->dtype);
        if (!err && copy.dtype != n->dtype && n->op != IR_CAST && !stored16) err = "stored dtype differs from the shape rule";
      }
      if (err) {
        if (out) fprintf(out, "ir verify: graph %s, %%%d (%s): %s\n", g->name, i, op_names[n->op], err);
        problems++;
      }
    }
    for (int k = 0; k < g->noutputs; k++)
      if (g->outputs[k] < 0 || g->outputs[k] >= g->nnodes) {
        if (out) fprintf(out, "ir verify: graph %s: output %d is not a node\n", g->name, k);
        problems++;
      }
    problems += verify_fb_split(g, out);
  }
  return problems;
}

/* ---- printing ---- */

static void print_type(FILE *out, const IrNode *n) {
  fprintf(out, "%s[", sem_dtype_name(n->dtype));
  for (int i = 0; i < n->rank; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", n->dims[i]);
  fputc(']', out);
}

static void print_attrs(const IrModule *m, const IrGraph *g, const IrNode *n, FILE *out) {
  switch (n->op) {
  case IR_INPUT: fprintf(out, " %s", m->inputs[n->attr[0]].name); break;
  case IR_PARAM: fprintf(out, " %s", m->params[n->attr[0]].name); break;
  case IR_ARG: fprintf(out, " #%" PRId64, n->attr[0]); break;
  case IR_CONST:
  case IR_FILL:
  case IR_POWS:
  case IR_DROPOUT: fprintf(out, " %.9g", n->fattr); break;
  case IR_CAUSAL_MASK:
    fprintf(out, " %.9g", n->fattr);
    if (n->attr[0]) fprintf(out, " rows=%s-zigzag", ir_group_name((IrGroup)(n->attr[0] - 1)));
    if (n->attr[1]) fprintf(out, " cols=%s-ring", ir_group_name((IrGroup)(n->attr[1] - 1)));
    break;
  case IR_VOCAB_MASK:
    fprintf(out, " %.9g below=%" PRId64, n->fattr, n->attr[1]);
    if (n->attr[0]) fprintf(out, " cols=%s-shard", ir_group_name((IrGroup)(n->attr[0] - 1)));
    break;
  case IR_ACT_GRAD: fprintf(out, " %s", op_names[n->attr[0]]); break;
  case IR_MATMUL:
    if (n->attr[0] || n->attr[1]) fprintf(out, " t%s%s", n->attr[0] ? "a" : "", n->attr[1] ? "b" : "");
    break;
  case IR_REDUCE_SUM:
  case IR_REDUCE_MEAN:
  case IR_REDUCE_MAX: fprintf(out, " axis=%" PRId64 "%s", n->attr[0], n->attr[1] ? " keepdim" : ""); break;
  case IR_SOFTMAX:
  case IR_SOFTMAX_BWD:
  case IR_LOG_SOFTMAX:
  case IR_LOG_SOFTMAX_BWD:
  case IR_CONCAT: fprintf(out, " axis=%" PRId64, n->attr[0]); break;
  case IR_TRANSPOSE:
    fputs(" perm=", out);
    for (int i = 0; i < n->rank; i++) fprintf(out, "%s%" PRId64, i ? "," : "", n->attr[i]);
    break;
  case IR_SLICE:
  case IR_PAD: {
    const IrNode *x = &g->nodes[n->in[0]];
    fputs(" at=", out);
    for (int i = 0; i < x->rank; i++) fprintf(out, "%s%" PRId64 "%s", i ? "," : "", n->attr[i], n->op == IR_SLICE && n->attr[8 + i] ? "!" : "");
    break;
  }
  case IR_ROPE:
    fprintf(out, " base=%.9g%s%s", n->fattr, n->attr[0] ? " inverse" : "", n->attr[8] ? " bthd" : "");
    if (n->attr[1]) fprintf(out, " positions=%s-zigzag", ir_group_name((IrGroup)(n->attr[1] - 1)));
    if (n->attr[2])
      fprintf(out, " yarn=%.9g,%.9g,%.9g,%" PRId64 "%s", ir_attr_f64(n->attr[3]), ir_attr_f64(n->attr[4]),
              ir_attr_f64(n->attr[5]), n->attr[6], n->attr[7] ? ",truncate" : "");
    break;
  case IR_REPEAT_KV:
  case IR_REPEAT_KV_BWD: fprintf(out, " n=%" PRId64, n->attr[0]); break;
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER:
    fprintf(out, " stride=%" PRId64 ",%" PRId64 " pad=%" PRId64 ",%" PRId64, n->attr[CONV_A_SH], n->attr[CONV_A_SW],
            n->attr[CONV_A_PH], n->attr[CONV_A_PW]);
    if (n->attr[CONV_A_DH] != 1 || n->attr[CONV_A_DW] != 1)
      fprintf(out, " dilation=%" PRId64 ",%" PRId64, n->attr[CONV_A_DH], n->attr[CONV_A_DW]);
    if (n->attr[CONV_A_GROUPS] != 1) fprintf(out, " groups=%" PRId64, n->attr[CONV_A_GROUPS]);
    break;
  case IR_POOL2D:
  case IR_POOL2D_BWD: {
    static const char *const modes[] = {"max", "avg", "adaptive_avg", "adaptive_max"};
    int64_t mode = n->attr[POOL_A_MODE];
    fprintf(out, " %s %s=%" PRId64 "x%" PRId64, mode >= 0 && mode < POOL_NMODES ? modes[mode] : "?",
            mode >= POOL_ADAPTIVE_AVG ? "out" : "k", n->attr[POOL_A_KH], n->attr[POOL_A_KW]);
    if (mode < POOL_ADAPTIVE_AVG)
      fprintf(out, " stride=%" PRId64 ",%" PRId64 " pad=%" PRId64 ",%" PRId64, n->attr[POOL_A_SH], n->attr[POOL_A_SW],
              n->attr[POOL_A_PH], n->attr[POOL_A_PW]);
    break;
  }
  case IR_ATTENTION:
  case IR_ATTENTION_BWD:
    fprintf(out, " scale=%.9g%s", n->fattr, n->attr[0] ? " causal" : "");
    if (n->attr[3]) fprintf(out, " window=%" PRId64, n->attr[3]);
    if (n->attr[1]) fprintf(out, " rows=%s-zigzag", ir_group_name((IrGroup)(n->attr[1] - 1)));
    if (n->attr[2]) fprintf(out, " cols=%s-ring", ir_group_name((IrGroup)(n->attr[2] - 1)));
    if (n->attr[2] && n->attr[4]) fprintf(out, " block=%" PRId64 "/%" PRId64, n->attr[4] - 1, n->attr[5]);
    break;
  case IR_CALL:
    fprintf(out, " @%s x%" PRId64, m->graphs[n->attr[0]]->name, n->attr[1]);
    if (n->attr[3]) fprintf(out, " from=%" PRId64, n->attr[3]);
    break;
  case IR_ALL_REDUCE:
  case IR_ALL_GATHER:
  case IR_REDUCE_SCATTER:
  case IR_SEND:
  case IR_RECV:
  case IR_SHARD_SLICE:
  case IR_COPY_TO_GROUP:
  case IR_ALL_TO_ALL:
    fprintf(out, " group=%s", ir_group_name((IrGroup)n->attr[0]));
    if (n->op == IR_ALL_TO_ALL) fprintf(out, " split=%" PRId64 " concat=%" PRId64, n->attr[1], n->attr[2]);
    if (n->op == IR_ALL_GATHER || n->op == IR_REDUCE_SCATTER || n->op == IR_SHARD_SLICE)
      fprintf(out, " axis=%" PRId64 "%s", n->attr[1], n->attr[2] ? " zigzag" : "");
    if (n->op == IR_ALL_REDUCE && n->attr[2]) fputs(" max", out);
    if (n->op == IR_ALL_GATHER && n->attr[3]) fputs(" partial-grad", out);
    if (n->op == IR_SEND || n->op == IR_RECV) fprintf(out, " peer=%+" PRId64, n->attr[1]);
    break;
  case IR_PICK:
  case IR_PICK_BWD:
  case IR_EMBEDDING:
  case IR_EMBEDDING_BWD:
    if (n->attr[0]) fprintf(out, " vocab-parallel=%s", ir_group_name((IrGroup)(n->attr[0] - 1)));
    break;
  case IR_TOPK: fprintf(out, " k=%" PRId64, n->attr[0]); break;
  case IR_ONE_HOT: fprintf(out, " n=%" PRId64, n->attr[0]); break;
  case IR_MOE_DISPATCH:
    if (n->attr[1] == 0) fprintf(out, " experts=%" PRId64 " packed", n->attr[0]);
    else fprintf(out, " experts=%" PRId64 " capacity=%" PRId64, n->attr[0], n->attr[1]);
    break;
  case IR_MOE_COMBINE:
  case IR_MOE_GATE_GRAD:
  case IR_MOE_EXPERT_IDS:
  case IR_GROUPED_MM_WGRAD:
    if (n->attr[0]) fprintf(out, " experts=%" PRId64, n->attr[0]);
    break;
  case IR_GROUPED_MM:
    if (n->attr[0]) fprintf(out, " transpose_w");
    break;
  case IR_AUX_LOSS: fprintf(out, " weight=%g", n->fattr); break;
  case IR_EXTERN:
  case IR_EXTERN_GRAD:
    if (n->attr[0] >= 0 && n->attr[0] < m->nexterns) fprintf(out, " @%s#%" PRId64, m->externs[n->attr[0]].name, n->attr[0]);
    break;
  default: break;
  }
}

void ir_print_graph(const IrModule *m, const IrGraph *g, FILE *out) {
  fprintf(out, "graph %s (args %d, count %" PRId64 ") {\n", g->name, g->nargs, g->count);
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    fprintf(out, "  %%%d = %s", i, op_names[n->op]);
    for (int k = 0; k < n->nin; k++) fprintf(out, "%s%%%d", k ? ", " : " ", n->in[k]);
    print_attrs(m, g, n, out);
    fputs(" : ", out);
    print_type(out, n);
    if (n->name) fprintf(out, "  # %s", n->name);
    fputc('\n', out);
  }
  fputs("} ->", out);
  for (int k = 0; k < g->noutputs; k++) fprintf(out, "%s%%%d", k ? ", " : " ", g->outputs[k]);
  fputc('\n', out);
}

void ir_print(const IrModule *m, FILE *out) {
  fprintf(out, "module (micro_batch %" PRId64 ")\n", m->micro_batch);
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *in = &m->inputs[i];
    fprintf(out, "input %s : %s[", in->name, sem_dtype_name(in->dtype));
    for (int k = 0; k < in->rank; k++) fprintf(out, "%s%" PRId64, k ? ", " : "", in->dims[k]);
    fputs("]\n", out);
  }
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    fprintf(out, "param %s : %s[", p->name, sem_dtype_name(p->dtype));
    for (int k = 0; k < p->rank; k++) fprintf(out, "%s%" PRId64, k ? ", " : "", p->dims[k]);
    fprintf(out, "] shard=%s", sem_shard_name(p->shard));
    int rank = p->dp_shards ? p->dp_rank : p->rank; /* of the tensor before ZeRO-3 cut it */
    if (p->split_axis >= 0) {
      fprintf(out, " (of [");
      for (int k = 0; k < rank; k++) fprintf(out, "%s%" PRId64, k ? ", " : "", p->full_dims[k]);
      fprintf(out, "], axis %d over %s", p->split_axis, ir_group_name(p->split_group));
      if (p->split2_axis >= 0) fprintf(out, ", axis %d over %s", p->split2_axis, ir_group_name(p->split2_group));
      if (p->logical_rows > 0) fprintf(out, ", padded from %" PRId64 " rows", p->logical_rows);
      fputc(')', out);
    }
    if (p->dp_shards) {
      fprintf(out, " zero3 (1/%d of [", p->dp_shards);
      for (int k = 0; k < rank; k++) fprintf(out, "%s%" PRId64, k ? ", " : "", p->dp_dims[k]);
      fprintf(out, "] flat over %s)", ir_group_name(IRG_DP));
    }
    if (p->count > 1) fprintf(out, " x%" PRId64, p->count);
    fputc('\n', out);
  }
  for (int i = 0; i < m->nexterns; i++) {
    const IrExtern *e = &m->externs[i];
    fprintf(out, "extern #%d %s : %s %s", i, e->name, e->library, e->symbol);
    if (e->grad) fprintf(out, " grad=%s", e->grad);
    else fputs(" (no gradient)", out);
    fputs(" dims=(", out);
    for (int k = 0; k < e->ndims; k++) fprintf(out, "%s%" PRId64, k ? ", " : "", e->dims[k]);
    fputs(")\n", out);
  }
  for (int i = 0; i < m->ngraphs; i++) ir_print_graph(m, m->graphs[i], out);
}

double ir_attr_f64(int64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static int64_t f64_attr(double d) {
  int64_t bits;
  memcpy(&bits, &d, sizeof bits);
  return bits;
}

void ir_rope_set_yarn(int64_t *attr, double factor, double beta_fast, double beta_slow, int64_t original, int truncate) {
  attr[2] = 1;
  attr[3] = f64_attr(factor);
  attr[4] = f64_attr(beta_fast);
  attr[5] = f64_attr(beta_slow);
  attr[6] = original;
  attr[7] = truncate ? 1 : 0;
}

/* The pair whose wavelength fits `rotations` times into the original
 * context: D ln(L / (2 pi rotations)) / (2 ln base). */
static double yarn_dim(double rotations, int64_t D, double base, double original) {
  return (double)D * log(original / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

int ir_rope_yarn_range(const IrNode *n, int64_t D, double *factor, double *lo, double *hi) {
  if (n->op != IR_ROPE || !n->attr[2]) return 0;
  double base = n->fattr, L = (double)n->attr[6];
  *factor = ir_attr_f64(n->attr[3]);
  *lo = yarn_dim(ir_attr_f64(n->attr[4]), D, base, L);
  *hi = yarn_dim(ir_attr_f64(n->attr[5]), D, base, L);
  if (n->attr[7]) *lo = floor(*lo), *hi = ceil(*hi);
  if (*lo < 0) *lo = 0;
  if (*hi > (double)(D - 1)) *hi = (double)(D - 1);
  if (*hi == *lo) *hi += 0.001;
  return 1;
}

double ir_rope_gain(const IrNode *n, int64_t i, int64_t D) {
  double factor, lo, hi;
  if (!ir_rope_yarn_range(n, D, &factor, &lo, &hi)) return 1.0;
  double ramp = ((double)i - lo) / (hi - lo);
  ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
  double keep = 1.0 - ramp; /* the share of the original frequency */
  return (1.0 - keep) / factor + keep;
}
