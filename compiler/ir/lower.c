/* lower.c - lowering of checked forwards to IR graphs. */
#include "lower.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  Arena *arena;
  Diag *diag;
  int too_large; /* a value beyond SEM_MAX_VALUE_ELEMENTS was reported */
  IrModule *m;
  const SemModel *model;
  int64_t micro_batch;
  int failed;
  int dropout_streams;
  int priced; /* lower_model_priced: dropless expert buffers at their expected load */
  int conventional_count; /* LowerOptions.conventional_count */
  int materialize_attention; /* LowerOptions */
} Lower;

/* One lowering of a SemFunc into a graph: its arguments and a memo from
 * checked expressions to node ids (expressions form a DAG). */
typedef struct {
  IrGraph *g;
  int graph_index;
  const SemLayer *layer;
  const int *args;
  const char *prefix;   /* parameter name prefix, "" at the root of a graph */
  int64_t count;        /* copies of this graph's parameters */
  const SemExpr **keys;
  int *vals;
  int cap, used;
} Inv;

static int memo_get(Inv *v, const SemExpr *e) {
  if (!v->cap) return -1;
  size_t h = ((uintptr_t)e >> 4) & (size_t)(v->cap - 1);
  while (v->keys[h]) {
    if (v->keys[h] == e) return v->vals[h];
    h = (h + 1) & (size_t)(v->cap - 1);
  }
  return -1;
}

static void memo_put(Lower *L, Inv *v, const SemExpr *e, int id) {
  if ((v->used + 1) * 2 > v->cap) {
    int cap = v->cap ? v->cap * 2 : 64;
    const SemExpr **keys = arena_alloc(L->arena, sizeof(SemExpr *) * (size_t)cap);
    int *vals = arena_alloc(L->arena, sizeof(int) * (size_t)cap);
    for (int i = 0; i < v->cap; i++) {
      if (!v->keys[i]) continue;
      size_t h = ((uintptr_t)v->keys[i] >> 4) & (size_t)(cap - 1);
      while (keys[h]) h = (h + 1) & (size_t)(cap - 1);
      keys[h] = v->keys[i];
      vals[h] = v->vals[i];
    }
    v->keys = keys;
    v->vals = vals;
    v->cap = cap;
  }
  size_t h = ((uintptr_t)e >> 4) & (size_t)(v->cap - 1);
  while (v->keys[h]) h = (h + 1) & (size_t)(v->cap - 1);
  v->keys[h] = e;
  v->vals[h] = id;
  v->used++;
}

static int concrete_dims(Lower *L, const TensorType *t, int64_t *dims, Span at) {
  static const char *const names[] = {"B"};
  for (int i = 0; i < t->rank; i++) {
    SymStatus st = sym_eval(t->dims[i], names, &L->micro_batch, 1, &dims[i]);
    if (st != SYM_OK) {
      diag_error(L->diag, at, "dimension %s has no value when compiling (%s)", sym_str(L->arena, t->dims[i]),
                 sym_status_str(st));
      diag_hint(L->diag, "only the batch B may stay symbolic; give other sizes as model parameters");
      L->failed = 1;
      return 0;
    }
  }
  return 1;
}

/* The shape as text, for messages: [64, 99999999999, 50257]. */
static const char *shape_str(Lower *L, int rank, const int64_t *dims) {
  char buf[SEM_MAX_RANK * 24 + 4];
  size_t n = 0;
  buf[n++] = '[';
  for (int i = 0; i < rank; i++)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%" PRId64, i ? ", " : "", dims[i]);
  snprintf(buf + n, sizeof buf - n, "]");
  return arena_strdup(L->arena, buf);
}

/* A value larger than SEM_MAX_VALUE_ELEMENTS is refused where the source
 * makes it (once: the values after it are as large), before any later
 * phase multiplies its size into a byte count. */
static int value_too_large(Lower *L, int rank, const int64_t *dims, Span at) {
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] > 0 && numel > SEM_MAX_VALUE_ELEMENTS / dims[i]) {
      numel = SEM_MAX_VALUE_ELEMENTS + 1;
      break;
    }
    numel *= dims[i];
  }
  if (numel <= SEM_MAX_VALUE_ELEMENTS) return 0;
  if (!L->too_large) {
    double exact = 1;
    for (int i = 0; i < rank; i++) exact *= (double)dims[i];
    diag_error(L->diag, at, "this value would be %s: %.3g elements a micro-batch, more than any machine holds (2^50 = %.3g)",
               shape_str(L, rank, dims), exact, (double)SEM_MAX_VALUE_ELEMENTS);
    diag_hint(L->diag, "2^50 fp32 values are 4.5 PB; is a size, the micro-batch or a -D value too large?");
  }
  L->too_large = 1;
  L->failed = 1;
  return 1;
}

static int add_node(Lower *L, Inv *v, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr,
                    DType dtype, int rank, const int64_t *dims, Span at, const char *name) {
  const char *why = NULL;
  if (value_too_large(L, rank, dims, at)) return -1;
  int id = ir_add(v->g, op, in, nin, attr, nattr, fattr, dtype, rank, dims, &why);
  if (id < 0) {
    diag_error(L->diag, at, "internal error lowering %s: %s", ir_op_name(op), why ? why : "?");
    L->failed = 1;
    return -1;
  }
  v->g->nodes[id].span = at;
  v->g->nodes[id].name = name;
  return id;
}

static const char *join(Lower *L, const char *a, const char *b) {
  return *a ? arena_printf(L->arena, "%s.%s", a, b) : arena_strdup(L->arena, b);
}

/* The PARAM node of `p` (named prefix.name) in this graph; one per graph. */
static int param_node(Lower *L, Inv *v, const SemParam *p, const char *full) {
  int index = -1;
  for (int i = 0; i < L->m->nparams; i++)
    if (!strcmp(L->m->params[i].name, full)) index = i;
  if (index < 0) {
    IrParam ip;
    memset(&ip, 0, sizeof ip);
    ip.name = full;
    ip.dtype = p->type.dtype;
    ip.rank = p->type.rank;
    for (int k = 0; k < p->type.rank; k++) sym_is_const(p->type.dims[k], &ip.dims[k]);
    ip.init = p->init;
    ip.shard = p->shard;
    ip.state = p->state;
    ip.graph = v->graph_index;
    ip.count = v->count;
    ip.span = p->span;
    ip.split_axis = ip.split2_axis = -1; /* whole until partitioned */
    int64_t numel = 1;
    for (int k = 0; k < ip.rank; k++) numel *= ip.dims[k]; /* <= 2^48: sema bounds it */
    if (v->count > 1 && numel > SEM_MAX_PARAM_ELEMENTS / v->count) {
      diag_error(L->diag, p->span, "parameter %s: %" PRId64 " copies of %" PRId64
                 " elements are more than the parameters of one repeat may hold (2^48 = %.3g)",
                 full, v->count, numel, (double)SEM_MAX_PARAM_ELEMENTS);
      L->failed = 1;
      return -1;
    }
    index = ir_add_param(L->m, &ip);
  }
  for (int i = 0; i < v->g->nnodes; i++)
    if (v->g->nodes[i].op == IR_PARAM && v->g->nodes[i].attr[0] == index) return i;
  const IrParam *ip = &L->m->params[index];
  int64_t attr = index;
  return add_node(L, v, IR_PARAM, NULL, 0, &attr, 1, 0, ip->dtype, ip->rank, ip->dims, p->span, NULL);
}

static int lower_expr(Lower *L, Inv *v, const SemExpr *e);
static int lower_func(Lower *L, IrGraph *g, int graph_index, const SemFunc *fn, const int *args, const char *prefix,
                      int64_t count);

static const char *block_prefix(Lower *L, Inv *v, const char *child) {
  return join(L, v->prefix, arena_printf(L->arena, "%s.{i}", child));
}

static int lower_call(Lower *L, Inv *v, const SemExpr *e) {
  const SemChild *child = &v->layer->children[e->index];
  int *args = arena_alloc(L->arena, sizeof(int) * (size_t)(e->nargs + 1));
  for (int i = 0; i < e->nargs; i++)
    if ((args[i] = lower_expr(L, v, e->args[i])) < 0) return -1;
  if (child->repeat == 1) return lower_func(L, v->g, v->graph_index, e->callee, args, join(L, v->prefix, child->name), v->count);
  if (e->callees) { /* an indexed repeat: its copies inline, one after another, named name.k */
    int x = args[0];
    for (int64_t k = 0; k < child->repeat && x >= 0; k++)
      x = lower_func(L, v->g, v->graph_index, e->callees[k], &x,
                     join(L, v->prefix, arena_printf(L->arena, "%s.%" PRId64, child->name, k)), v->count);
    return x;
  }
  /* A repeated block: its own graph, called `repeat` times. */
  if (v->count > 1) {
    diag_error(L->diag, child->span, "a repeat inside a repeated block is not supported yet");
    L->failed = 1;
    return -1;
  }
  IrGraph *bg = ir_graph_new(L->m, join(L, v->prefix, child->name));
  int bgi = L->m->ngraphs - 1;
  bg->count = child->repeat;
  bg->nargs = e->nargs;
  Inv bv;
  memset(&bv, 0, sizeof bv);
  bv.g = bg;
  bv.graph_index = bgi;
  int *bargs = arena_alloc(L->arena, sizeof(int) * (size_t)(e->nargs + 1));
  for (int i = 0; i < e->nargs; i++) {
    const IrNode *a = &v->g->nodes[args[i]];
    int64_t attr = i;
    bargs[i] = add_node(L, &bv, IR_ARG, NULL, 0, &attr, 1, 0, a->dtype, a->rank, a->dims, e->span, NULL);
  }
  int out = lower_func(L, bg, bgi, e->callee, bargs, block_prefix(L, v, child->name), child->repeat);
  if (out < 0) return -1;
  bg->outputs = arena_alloc(L->arena, sizeof(int));
  bg->outputs[0] = out;
  bg->noutputs = 1;
  const IrNode *r = &bg->nodes[out];
  int64_t attr[2] = {bgi, child->repeat};
  return add_node(L, v, IR_CALL, args, e->nargs, attr, 2, 0, r->dtype, r->rank, r->dims, e->span, NULL);
}

static IrOp unary_op(SemOp op) {
  switch (op) {
  case SOP_RELU: return IR_RELU;
  case SOP_GELU: return IR_GELU;
  case SOP_SILU: return IR_SILU;
  case SOP_SIGMOID: return IR_SIGMOID;
  case SOP_TANH: return IR_TANH;
  case SOP_EXP: return IR_EXP;
  case SOP_LOG: return IR_LOG;
  case SOP_SQRT: return IR_SQRT;
  case SOP_RSQRT: return IR_RSQRT;
  case SOP_ABS: return IR_ABS;
  case SOP_SQUARE: return IR_SQUARE;
  case SOP_NEG: return IR_NEG;
  case SOP_ADD: return IR_ADD;
  case SOP_SUB: return IR_SUB;
  case SOP_MUL: return IR_MUL;
  case SOP_DIV: return IR_DIV;
  case SOP_MAXIMUM: return IR_MAXIMUM;
  case SOP_MINIMUM: return IR_MINIMUM;
  default: return IR_OP_COUNT;
  }
}

/* attention(q, k, v): one ATTENTION op and the slice of its packed output
 * that holds o (the last column is the softmax's log-sum-exp, which only
 * the backward reads); or, under LowerOptions.materialize_attention, the
 * chain that stores the scores. */
static int lower_attention(Lower *L, Inv *v, const SemExpr *e, const int *in, const int64_t *dims) {
  const IrNode *q = &v->g->nodes[in[0]], *k = &v->g->nodes[in[1]];
  DType dt = e->type.dtype;
  int64_t attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  if (!L->materialize_attention) {
    attr[0] = e->attr[0];
    attr[3] = e->attr[1];
    int packed = add_node(L, v, IR_ATTENTION, in, 3, attr, 4, e->scalar, dt, -1, NULL, e->span, NULL);
    if (packed < 0) return -1;
    memset(attr, 0, sizeof attr);
    int o = add_node(L, v, IR_SLICE, &packed, 1, attr, 16, 0, dt, 4, dims, e->span, NULL);
    if (e->nargs < 4 || o < 0) return o;
    /* sinks: exp(sink_h) joins each row's denominator, so o scales by
     * Z / (Z + exp(sink)) = sigmoid(lse - sink); lse is the packed last
     * column, whose gradient attention's backward takes (Dt = do . o - dlse) */
    int64_t ldims[4] = {dims[0], dims[1], dims[2], 1}, sdims[4] = {1, dims[1], 1, 1};
    attr[3] = dims[3];
    int lse = add_node(L, v, IR_SLICE, &packed, 1, attr, 16, 0, dt, 4, ldims, e->span, NULL);
    int sk = add_node(L, v, IR_RESHAPE, &in[3], 1, NULL, 0, 0, dt, 4, sdims, e->span, NULL);
    int ls[2] = {lse, sk};
    int d = lse < 0 || sk < 0 ? -1 : add_node(L, v, IR_SUB, ls, 2, NULL, 0, 0, dt, -1, NULL, e->span, NULL);
    int f = d < 0 ? -1 : add_node(L, v, IR_SIGMOID, &d, 1, NULL, 0, 0, dt, -1, NULL, e->span, NULL);
    int of[2] = {o, f};
    return f < 0 ? -1 : add_node(L, v, IR_MUL, of, 2, NULL, 0, 0, dt, -1, NULL, e->span, NULL);
  }
  if (e->nargs >= 4 && !L->conventional_count) {
    diag_error(L->diag, e->span, "attention with sinks has no materialised form: compile or plan it without --attention materialized");
    L->failed = 1;
    return -1;
  }
  if (e->attr[1] > 0 && !L->conventional_count) {
    diag_error(L->diag, e->span, "attention with a sliding window (window = %" PRId64 ") has no materialised form: "
               "compile or plan it without --attention materialized", e->attr[1]);
    L->failed = 1;
    return -1;
  }
  int kk = in[1], vv = in[2];
  if (q->dims[1] != k->dims[1]) {
    attr[0] = q->dims[1] / k->dims[1];
    if ((kk = add_node(L, v, IR_REPEAT_KV, &kk, 1, attr, 1, 0, dt, -1, NULL, e->span, NULL)) < 0 ||
        (vv = add_node(L, v, IR_REPEAT_KV, &vv, 1, attr, 1, 0, dt, -1, NULL, e->span, NULL)) < 0)
      return -1;
  }
  int64_t perm[4] = {0, 1, 3, 2};
  int kt = add_node(L, v, IR_TRANSPOSE, &kk, 1, perm, 4, 0, dt, -1, NULL, e->span, NULL);
  int s[2] = {in[0], kt};
  memset(attr, 0, sizeof attr);
  int sc = kt < 0 ? -1 : add_node(L, v, IR_MATMUL, s, 2, attr, 2, 0, dt, -1, NULL, e->span, NULL);
  int c = sc < 0 ? -1 : add_node(L, v, IR_CONST, NULL, 0, NULL, 0, e->scalar, DT_F32, -1, NULL, e->span, NULL);
  int m[2] = {sc, c};
  int x = c < 0 ? -1 : add_node(L, v, IR_MUL, m, 2, NULL, 0, 0, dt, -1, NULL, e->span, NULL);
  if (x >= 0 && e->attr[0]) x = add_node(L, v, IR_CAUSAL_MASK, &x, 1, NULL, 0, -INFINITY, dt, -1, NULL, e->span, NULL);
  attr[0] = 3;
  int p = x < 0 ? -1 : add_node(L, v, IR_SOFTMAX, &x, 1, attr, 1, 0, dt, -1, NULL, e->span, NULL);
  int pv[2] = {p, vv};
  memset(attr, 0, sizeof attr);
  return p < 0 ? -1 : add_node(L, v, IR_MATMUL, pv, 2, attr, 2, 0, dt, -1, NULL, e->span, NULL);
}

/* The graph's TRAINING leaf (one a graph: every batch norm and dropout of
 * it reads the same mode). */
static int training_node(Lower *L, Inv *v, Span at) {
  for (int i = 0; i < v->g->nnodes; i++)
    if (v->g->nodes[i].op == IR_TRAINING) return i;
  return add_node(L, v, IR_TRAINING, NULL, 0, NULL, 0, 0, DT_F32, 0, NULL, at, NULL);
}

/* (x - mean) rsqrt(var + eps) weight + bias, xc = x - mean, weight and bias
 * reshaped to [C, 1, ...]. */
static int batch_norm_apply(Lower *L, Inv *v, const SemExpr *e, const int *in, int xc, int var, const int64_t *cdims) {
  int rank = e->type.rank;
  DType dt = e->type.dtype;
  Span at = e->span;
  int eps = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, e->scalar, DT_F32, -1, NULL, at, NULL);
  int ve[2] = {var, eps};
  int r = eps < 0 ? -1 : add_node(L, v, IR_ADD, ve, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  r = r < 0 ? -1 : add_node(L, v, IR_RSQRT, &r, 1, NULL, 0, 0, dt, -1, NULL, at, NULL);
  int xr[2] = {xc, r};
  int y = r < 0 ? -1 : add_node(L, v, IR_MUL, xr, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  for (int k = 1; k <= 2 && y >= 0; k++) {
    int p = add_node(L, v, IR_RESHAPE, &in[k], 1, NULL, 0, 0, dt, rank - 1, cdims + 1, at, NULL);
    int yp[2] = {y, p};
    y = p < 0 ? -1 : add_node(L, v, k == 1 ? IR_MUL : IR_ADD, yp, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  }
  return y;
}

/* y passed through a STATE_UPDATE of state parameter node sp: sp = (1 - m t)
 * sp + m t stat, stat [1, C, 1, ...] flattened to [C], t the TRAINING leaf
 * (an evaluation writes sp back unchanged). */
static int running_update(Lower *L, Inv *v, const SemExpr *e, int y, int sp, int stat, int64_t channels, int t) {
  DType dt = e->type.dtype;
  Span at = e->span;
  double m = (double)e->attr[1] / 1e9;
  int flat = add_node(L, v, IR_RESHAPE, &stat, 1, NULL, 0, 0, dt, 1, &channels, at, NULL);
  int mc = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, m, DT_F32, -1, NULL, at, NULL), one = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1.0, DT_F32, -1, NULL, at, NULL);
  int mt[2] = {mc, t};
  int c2 = mc < 0 ? -1 : add_node(L, v, IR_MUL, mt, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int oc[2] = {one, c2};
  int c1 = c2 < 0 || one < 0 ? -1 : add_node(L, v, IR_SUB, oc, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  if (flat < 0 || c1 < 0 || c2 < 0) return -1;
  int a1[2] = {sp, c1}, a2[2] = {flat, c2};
  int t1 = add_node(L, v, IR_MUL, a1, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  int t2 = add_node(L, v, IR_MUL, a2, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  int a3[2] = {t1, t2};
  int nv = t1 < 0 || t2 < 0 ? -1 : add_node(L, v, IR_ADD, a3, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  int su[3] = {y, nv, sp};
  return nv < 0 ? -1 : add_node(L, v, IR_STATE_UPDATE, su, 3, NULL, 0, 0, dt, -1, NULL, at, NULL);
}

/* batch_norm(x, weight, bias[, running_mean, running_var], eps, sync,
 * momentum): per channel (axis 1), over every other axis, mean = sum(x) / n
 * and var = sum((x - mean)^2) / n (biased, as PyTorch normalises with in
 * training), then (x - mean) rsqrt(var + eps) weight + bias. With sync the
 * sums and n are all-reduced over the data-parallel group (SyncBatchNorm):
 * an all-reduce whose gradient is the all-reduce of the gradient (the ranks'
 * losses add up), COPY_TO_GROUP's then ALL_REDUCE's; n too (its rank's count
 * times the group's size, which the lowering does not know). With running
 * statistics (in[3], in[4]: state parameters) the output passes through
 * their updates, the variance's unbiased (n / (n - 1), PyTorch's). */
static int lower_batch_norm(Lower *L, Inv *v, const SemExpr *e, const int *in, const int64_t *dims) {
  int rank = e->type.rank, sync = (int)e->attr[0];
  DType dt = e->type.dtype;
  Span at = e->span;
  int64_t count = 1, cdims[IR_MAX_RANK], attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  for (int i = 0; i < rank; i++) {
    cdims[i] = i == 1 ? dims[1] : 1;
    if (i != 1) count *= dims[i];
  }
  /* a buffer when it is all-reduced (a CONST is a kernel argument, not a value in memory) */
  int n = add_node(L, v, sync ? IR_FILL : IR_CONST, NULL, 0, NULL, 0, (double)count, DT_F32, sync ? 0 : -1, NULL, at, NULL);
  if (n >= 0 && sync) {
    attr[0] = IRG_DP;
    attr[3] = 1; /* a count: no gradient */
    n = add_node(L, v, IR_ALL_REDUCE, &n, 1, attr, 4, 0, DT_F32, -1, NULL, at, NULL);
  }
  /* with running statistics, t (the TRAINING leaf: 1 training, 0 evaluation)
   * chooses what normalises: used = t batch + (1 - t) running, exact in both
   * modes, so that one program trains and evaluates */
  int track = e->nargs == 5, t = -1, u = -1;
  if (track) {
    t = training_node(L, v, at);
    int one0 = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1.0, DT_F32, -1, NULL, at, NULL);
    int ot[2] = {one0, t};
    u = t < 0 || one0 < 0 ? -1 : add_node(L, v, IR_SUB, ot, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
    if (u < 0) return -1;
  }
  /* stat[0] = sum(x) / n, the batch mean; used[0] the mean that normalises;
   * xc = x - used[0]; stat[1] = sum(xc^2) / n, the batch's variance in a
   * training step (used[0] is the batch mean there), not needed in an
   * evaluation (t = 0 drops it); used[1] the variance that normalises */
  int stat[2] = {-1, -1}, used[2] = {-1, -1}, xc = -1, of = in[0];
  for (int pass = 0; pass < 2 && n >= 0; pass++) {
    int s = of;
    for (int a = 0; a < rank && s >= 0; a++) {
      if (a == 1) continue;
      int64_t ra[2] = {a, 1};
      s = add_node(L, v, IR_REDUCE_SUM, &s, 1, ra, 2, 0, dt, -1, NULL, at, NULL);
    }
    if (s >= 0 && sync) {
      int64_t ga[4] = {IRG_DP, 0, 0, 0};
      s = add_node(L, v, IR_COPY_TO_GROUP, &s, 1, ga, 1, 0, dt, -1, NULL, at, NULL);
      if (s >= 0) s = add_node(L, v, IR_ALL_REDUCE, &s, 1, ga, 4, 0, dt, -1, NULL, at, NULL);
    }
    int q[2] = {s, n};
    stat[pass] = used[pass] = s < 0 ? -1 : add_node(L, v, IR_DIV, q, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
    if (stat[pass] >= 0 && track) {
      int rs = add_node(L, v, IR_RESHAPE, &in[3 + pass], 1, NULL, 0, 0, dt, rank - 1, cdims + 1, at, NULL);
      int a1[2] = {stat[pass], t}, a2[2] = {rs, u};
      int p1 = rs < 0 ? -1 : add_node(L, v, IR_MUL, a1, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
      int p2 = p1 < 0 ? -1 : add_node(L, v, IR_MUL, a2, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
      int a3[2] = {p1, p2};
      used[pass] = p2 < 0 ? -1 : add_node(L, v, IR_ADD, a3, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
    }
    if (used[pass] < 0) return -1;
    if (pass == 0) {
      int d[2] = {in[0], used[0]};
      xc = add_node(L, v, IR_SUB, d, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
      of = xc < 0 ? -1 : add_node(L, v, IR_SQUARE, &xc, 1, NULL, 0, 0, dt, -1, NULL, at, NULL);
    }
  }
  if (n < 0 || used[1] < 0) return -1;
  int y = batch_norm_apply(L, v, e, in, xc, used[1], cdims);
  if (!track || y < 0) return y;
  if (count == 1 && !sync) {
    diag_error(L->diag, at, "batch_norm with running statistics sees one value per channel (N x H x W = 1): its unbiased "
               "variance is undefined (PyTorch refuses it too); use a larger micro-batch");
    L->failed = 1;
    return -1;
  }
  /* the unbiased variance for running_var: var n / (n - 1) */
  int one = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1.0, DT_F32, -1, NULL, at, NULL);
  int nn[2] = {n, one};
  int nm1 = one < 0 ? -1 : add_node(L, v, IR_SUB, nn, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int q[2] = {n, nm1};
  int ratio = nm1 < 0 ? -1 : add_node(L, v, IR_DIV, q, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int vr[2] = {stat[1], ratio};
  int unbiased = ratio < 0 ? -1 : add_node(L, v, IR_MUL, vr, 2, NULL, 0, 0, dt, -1, NULL, at, NULL);
  if (unbiased < 0) return -1;
  y = running_update(L, v, e, y, in[3], stat[0], dims[1], t);
  return y < 0 ? -1 : running_update(L, v, e, y, in[4], unbiased, dims[1], t);
}

/* balance_experts(y, bias, chosen, rate): y passed through a STATE_UPDATE of
 * bias + rate t sign(mean - load), load[e] the choices of expert e in the
 * micro-batch, all-reduced over the data-parallel ranks (the partitioner
 * makes the counts whole over the groups it splits: context and sequence
 * parallelism's pieces of the tokens), mean the average load, t the
 * TRAINING leaf (an evaluation leaves bias as it is). */
static int lower_balance_experts(Lower *L, Inv *v, const SemExpr *e, const int *in) {
  Span at = e->span;
  const IrNode *idx = &v->g->nodes[in[2]], *b = &v->g->nodes[in[1]];
  int64_t E = b->dims[0], attr[IR_NATTR];
  int rank = idx->rank;
  memset(attr, 0, sizeof attr);
  attr[0] = E;
  int s = add_node(L, v, IR_ONE_HOT, &in[2], 1, attr, 1, 0, DT_F32, -1, NULL, at, NULL); /* [..., k, E] */
  for (int a = 0; a <= rank - 1 && s >= 0; a++) {
    int64_t ra[2] = {a, 1};
    s = add_node(L, v, IR_REDUCE_SUM, &s, 1, ra, 2, 0, DT_F32, -1, NULL, at, NULL);
  }
  s = s < 0 ? -1 : add_node(L, v, IR_RESHAPE, &s, 1, NULL, 0, 0, DT_F32, 1, &E, at, NULL);
  int64_t ga[4] = {IRG_DP, 0, 0, 1}; /* counts: no gradient */
  s = s < 0 ? -1 : add_node(L, v, IR_ALL_REDUCE, &s, 1, ga, 4, 0, DT_F32, -1, NULL, at, NULL);
  int64_t r0[2] = {0, 1};
  int tot = s < 0 ? -1 : add_node(L, v, IR_REDUCE_SUM, &s, 1, r0, 2, 0, DT_F32, -1, NULL, at, NULL); /* [1] */
  int ec = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, (double)E, DT_F32, -1, NULL, at, NULL);
  int te[2] = {tot, ec};
  int mean = tot < 0 || ec < 0 ? -1 : add_node(L, v, IR_DIV, te, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int ms[2] = {mean, s};
  int err = mean < 0 ? -1 : add_node(L, v, IR_SUB, ms, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  /* sign(err): clamp(err 1e30, -1, 1), exact for the counts' differences (0 or at least 1 / E) */
  int big = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1e30, DT_F32, -1, NULL, at, NULL);
  int lo = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, -1.0, DT_F32, -1, NULL, at, NULL);
  int hi = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1.0, DT_F32, -1, NULL, at, NULL);
  int eb[2] = {err, big};
  int sg = err < 0 ? -1 : add_node(L, v, IR_MUL, eb, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int sl[2] = {sg, lo};
  sg = sg < 0 ? -1 : add_node(L, v, IR_MAXIMUM, sl, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int sh[2] = {sg, hi};
  sg = sg < 0 ? -1 : add_node(L, v, IR_MINIMUM, sh, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int t = training_node(L, v, at);
  int rc = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, e->scalar, DT_F32, -1, NULL, at, NULL);
  int rt[2] = {rc, t};
  int step = rc < 0 || t < 0 ? -1 : add_node(L, v, IR_MUL, rt, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int ss[2] = {sg, step};
  int delta = sg < 0 || step < 0 ? -1 : add_node(L, v, IR_MUL, ss, 2, NULL, 0, 0, DT_F32, -1, NULL, at, NULL);
  int bd[2] = {in[1], delta};
  int nb = delta < 0 ? -1 : add_node(L, v, IR_ADD, bd, 2, NULL, 0, 0, b->dtype, -1, NULL, at, NULL);
  int su[3] = {in[0], nb, in[1]};
  return nb < 0 ? -1 : add_node(L, v, IR_STATE_UPDATE, su, 3, NULL, 0, 0, e->type.dtype, -1, NULL, at, NULL);
}

static int lower_op(Lower *L, Inv *v, const SemExpr *e, const int64_t *dims) {
  int in[8];
  int nin = e->nargs < 8 ? e->nargs : 8;
  if (e->op != SOP_CONCAT)
    for (int i = 0; i < nin; i++)
      if ((in[i] = lower_expr(L, v, e->args[i])) < 0) return -1;
  const TensorType *t = &e->type;
  IrOp direct = unary_op(e->op);
  if (direct != IR_OP_COUNT) return add_node(L, v, direct, in, nin, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  int64_t attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  switch (e->op) {
  case SOP_POW: return add_node(L, v, IR_POWS, in, 1, NULL, 0, e->scalar, t->dtype, -1, NULL, e->span, NULL);
  case SOP_MATMUL: return add_node(L, v, IR_MATMUL, in, 2, attr, 2, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_SUM:
  case SOP_MEAN:
  case SOP_MAX:
    attr[0] = e->attr[0];
    attr[1] = e->attr[1];
    return add_node(L, v, e->op == SOP_SUM ? IR_REDUCE_SUM : e->op == SOP_MEAN ? IR_REDUCE_MEAN : IR_REDUCE_MAX, in, 1, attr,
                    2, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_SOFTMAX:
  case SOP_LOG_SOFTMAX:
    attr[0] = e->attr[0];
    return add_node(L, v, e->op == SOP_SOFTMAX ? IR_SOFTMAX : IR_LOG_SOFTMAX, in, 1, attr, 1, 0, t->dtype, -1, NULL, e->span,
                    NULL);
  case SOP_RESHAPE: return add_node(L, v, IR_RESHAPE, in, 1, NULL, 0, 0, t->dtype, t->rank, dims, e->span, NULL);
  case SOP_TRANSPOSE:
    for (int i = 0; i < t->rank; i++) attr[i] = i;
    attr[e->attr[0]] = e->attr[1];
    attr[e->attr[1]] = e->attr[0];
    return add_node(L, v, IR_TRANSPOSE, in, 1, attr, t->rank, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_SPLIT_HEADS: {
    /* [B, T, H*D] -> [B, T, H, D] -> [B, H, T, D] */
    int64_t mid[4] = {dims[0], dims[2], dims[1], dims[3]};
    int r = add_node(L, v, IR_RESHAPE, in, 1, NULL, 0, 0, t->dtype, 4, mid, e->span, NULL);
    if (r < 0) return -1;
    int64_t perm[4] = {0, 2, 1, 3};
    return add_node(L, v, IR_TRANSPOSE, &r, 1, perm, 4, 0, t->dtype, -1, NULL, e->span, NULL);
  }
  case SOP_MERGE_HEADS: {
    /* [B, H, T, D] -> [B, T, H, D] -> [B, T, H*D] */
    int64_t perm[4] = {0, 2, 1, 3};
    int r = add_node(L, v, IR_TRANSPOSE, in, 1, perm, 4, 0, t->dtype, -1, NULL, e->span, NULL);
    if (r < 0) return -1;
    return add_node(L, v, IR_RESHAPE, &r, 1, NULL, 0, 0, t->dtype, 3, dims, e->span, NULL);
  }
  case SOP_SPLIT: return in[0]; /* the parts are slices, made by SE_TUPLE_GET */
  case SOP_CONCAT: {
    int *parts = arena_alloc(L->arena, sizeof(int) * (size_t)e->nargs);
    for (int i = 0; i < e->nargs; i++)
      if ((parts[i] = lower_expr(L, v, e->args[i])) < 0) return -1;
    attr[0] = e->attr[0];
    return add_node(L, v, IR_CONCAT, parts, e->nargs, attr, 1, 0, t->dtype, -1, NULL, e->span, NULL);
  }
  case SOP_SLICE:
    for (int i = 0; i < SEM_MAX_RANK; i++) {
      attr[i] = e->attr[i];
      attr[8 + i] = e->attr[2 * SEM_MAX_RANK + i];
    }
    return add_node(L, v, IR_SLICE, in, 1, attr, 16, 0, t->dtype, t->rank, dims, e->span, NULL);
  case SOP_EMBEDDING: return add_node(L, v, IR_EMBEDDING, in, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_ARANGE: return add_node(L, v, IR_IOTA, NULL, 0, NULL, 0, 0, t->dtype, 1, dims, e->span, NULL);
  case SOP_CAUSAL_MASK: return add_node(L, v, IR_CAUSAL_MASK, in, 1, NULL, 0, -INFINITY, t->dtype, -1, NULL, e->span, NULL);
  case SOP_ROPE:
    memcpy(attr, e->attr, 8 * sizeof attr[0]); /* YaRN's settings in [2, 8) */
    attr[0] = attr[1] = 0;
    return add_node(L, v, IR_ROPE, in, 1, attr, 8, e->scalar, t->dtype, -1, NULL, e->span, NULL);
  case SOP_REPEAT_KV:
    attr[0] = e->attr[0];
    return add_node(L, v, IR_REPEAT_KV, in, 1, attr, 1, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_ATTENTION: return lower_attention(L, v, e, in, dims);
  case SOP_BATCH_NORM: return lower_batch_norm(L, v, e, in, dims);
  case SOP_BALANCE_EXPERTS: return lower_balance_experts(L, v, e, in);
  case SOP_CROSS_ENTROPY: return add_node(L, v, IR_CROSS_ENTROPY, in, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_DROPOUT: {
    attr[0] = L->dropout_streams++;
    int d = add_node(L, v, IR_DROPOUT, in, 1, attr, 1, e->scalar, t->dtype, -1, NULL, e->span, NULL);
    if (d < 0 || !(e->scalar > 0)) return d;
    /* an evaluation keeps every value: t d + (1 - t) x, t the TRAINING leaf (exact in both) */
    int tr = training_node(L, v, e->span);
    int one = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, 1.0, DT_F32, -1, NULL, e->span, NULL);
    int ot[2] = {one, tr};
    int u = tr < 0 || one < 0 ? -1 : add_node(L, v, IR_SUB, ot, 2, NULL, 0, 0, DT_F32, -1, NULL, e->span, NULL);
    int a1[2] = {d, tr}, a2[2] = {in[0], u};
    int p1 = u < 0 ? -1 : add_node(L, v, IR_MUL, a1, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
    int p2 = p1 < 0 ? -1 : add_node(L, v, IR_MUL, a2, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
    int a3[2] = {p1, p2};
    return p2 < 0 ? -1 : add_node(L, v, IR_ADD, a3, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  }
  case SOP_TOPK_INDICES:
  case SOP_TOPK_VALUES: {
    /* one selection; the values are take(x, topk(x)), whose gradient scatters into the chosen positions */
    attr[0] = e->attr[0];
    /* topk_values and topk_indices of the same x and k share one selection */
    int sel = -1;
    for (int i = v->g->nnodes - 1; i >= 0 && sel < 0; i--) {
      const IrNode *o = &v->g->nodes[i];
      if (o->op == IR_TOPK && o->in[0] == in[0] && o->attr[0] == attr[0]) sel = i;
    }
    if (sel < 0) sel = add_node(L, v, IR_TOPK, in, 1, attr, 1, 0, DT_I32, -1, NULL, e->span, NULL);
    if (sel < 0 || e->op == SOP_TOPK_INDICES) return sel;
    int tin[2] = {in[0], sel};
    return add_node(L, v, IR_TAKE, tin, 2, NULL, 0, 0, e->type.dtype, -1, NULL, e->span, NULL);
  }
  case SOP_CONV2D: return add_node(L, v, IR_CONV2D, in, 2, e->attr, e->nattr, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_MAX_POOL2D:
  case SOP_AVG_POOL2D:
  case SOP_ADAPTIVE_AVG_POOL2D: return add_node(L, v, IR_POOL2D, in, 1, e->attr, e->nattr, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_TAKE: return add_node(L, v, IR_TAKE, in, 2, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_ONE_HOT:
    attr[0] = e->attr[0];
    return add_node(L, v, IR_ONE_HOT, in, 1, attr, 1, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_MOE_DISPATCH: {
    /* unweighted: the gates are applied by moe_combine */
    const IrNode *idx = &v->g->nodes[in[1]];
    int ones = add_node(L, v, IR_FILL, NULL, 0, NULL, 0, 1.0, DT_F32, idx->rank, idx->dims, e->span, NULL);
    int din[3] = {in[0], in[1], ones};
    attr[0] = e->attr[0];
    attr[1] = L->priced && e->attr[2] > 0 ? e->attr[2] : e->attr[1]; /* lower_model_priced */
    attr[2] = e->attr[2];
    /* room for every token (the priced buffer holds only the expected load): the
     * partitioner's cue that a context rank may route its own tokens (spmd.c) */
    attr[3] = e->attr[1] >= v->g->nodes[in[0]].dims[1];
    return ones < 0 ? -1 : add_node(L, v, IR_MOE_DISPATCH, din, 3, attr, 4, 0, t->dtype, -1, NULL, e->span, NULL);
  }
  case SOP_MOE_COMBINE: return add_node(L, v, IR_MOE_COMBINE, in, 3, NULL, 0, 0, t->dtype, -1, NULL, e->span, NULL);
  case SOP_AUX_LOSS: return add_node(L, v, IR_AUX_LOSS, in, 2, NULL, 0, e->scalar, t->dtype, -1, NULL, e->span, NULL);
  default:
    diag_error(L->diag, e->span, "internal error: %s has no lowering", sem_op_name(e->op));
    L->failed = 1;
    return -1;
  }
}

/* The string value of an extern's setting `key`, or NULL. */
static const char *extern_setting(const AstDecl *d, const char *key) {
  for (int i = 0; i < d->settings.n; i++) {
    const AstSetting *s = d->settings.items[i];
    if (!s->is_block && s->value && s->value->kind == EX_STRING && !strcmp(s->key.name, key)) return s->value->u.sval;
  }
  return NULL;
}

/* A library named with a slash is found beside the declaring file. */
static const char *extern_path(Lower *L, const AstDecl *d, const char *library) {
  if (!strchr(library, '/') || library[0] == '/') return library;
  const char *file = diag_file_path(L->diag, d->span.file);
  const char *slash = file ? strrchr(file, '/') : NULL;
  if (!slash) return library;
  while (library[0] == '.' && library[1] == '/') library += 2;
  return arena_printf(L->arena, "%.*s/%s", (int)(slash - file), file, library);
}

/* An extern call: the table entry of its declaration at these dimensions,
 * and an EXTERN node whose attributes carry the result type. */
static int lower_extern(Lower *L, Inv *v, const SemExpr *e, const int64_t *dims) {
  const AstDecl *d = e->ext;
  int *in = arena_alloc(L->arena, sizeof(int) * (size_t)(e->nargs + 1));
  for (int i = 0; i < e->nargs; i++)
    if ((in[i] = lower_expr(L, v, e->args[i])) < 0) return -1;
  for (int i = 0; i <= e->nargs; i++) {
    DType dt = i < e->nargs ? v->g->nodes[in[i]].dtype : e->type.dtype;
    if (dt != DT_F32) {
      if (i < e->nargs)
        diag_error(L->diag, e->span, "extern %s: argument %d is %s; native calls take f32 tensors only", d->name.name, i + 1,
                   sem_dtype_name(dt));
      else
        diag_error(L->diag, e->span, "extern %s: the result is %s; native calls return f32 tensors only", d->name.name,
                   sem_dtype_name(dt));
      diag_note(L->diag, d->span, "declared here");
      L->failed = 1;
      return -1;
    }
  }
  IrExtern x;
  memset(&x, 0, sizeof x);
  x.name = d->name.name;
  const char *file = diag_file_path(L->diag, d->span.file);
  x.where = arena_printf(L->arena, "%s:%d", file ? file : "?", d->span.line);
  x.span = d->span;
  x.library = extern_setting(d, "library");
  x.symbol = extern_setting(d, "symbol");
  x.grad = extern_setting(d, "grad");
  if (!x.library || !x.symbol) {
    diag_error(L->diag, d->span, "internal error: extern %s has no library or symbol", d->name.name);
    L->failed = 1;
    return -1;
  }
  x.path = extern_path(L, d, x.library);
  x.nargs = e->nargs;
  x.args = arena_alloc(L->arena, sizeof(IrExternShape) * (size_t)(e->nargs + 1));
  x.dims = arena_alloc(L->arena, sizeof(int64_t) * (size_t)(e->nargs * IR_MAX_RANK + 1));
  const char **names = arena_alloc(L->arena, sizeof(char *) * (size_t)(e->nargs * IR_MAX_RANK + 1));
  for (int i = 0; i < e->nargs; i++) {
    const IrNode *a = &v->g->nodes[in[i]];
    x.args[i].rank = a->rank;
    memcpy(x.args[i].dims, a->dims, sizeof a->dims);
    const AstType *t = d->params[i].tensor_type;
    for (int k = 0; k < t->ndims && k < a->rank; k++) {
      if (t->dims[k]->kind != EX_NAME) continue;
      int seen = 0;
      for (int j = 0; j < x.ndims && !seen; j++) seen = !strcmp(names[j], t->dims[k]->u.sval);
      if (seen) continue;
      names[x.ndims] = t->dims[k]->u.sval;
      x.dims[x.ndims++] = a->dims[k];
    }
  }
  x.out.rank = e->type.rank;
  memcpy(x.out.dims, dims, sizeof(int64_t) * (size_t)e->type.rank);
  int64_t attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  attr[0] = ir_add_extern(L->m, &x);
  attr[1] = e->type.rank;
  for (int k = 0; k < e->type.rank; k++) attr[2 + k] = dims[k];
  return add_node(L, v, IR_EXTERN, in, e->nargs, attr, 2 + e->type.rank, 0, DT_F32, -1, NULL, e->span, NULL);
}

static int lower_expr(Lower *L, Inv *v, const SemExpr *e) {
  int memo = memo_get(v, e);
  if (memo >= 0) return memo;
  int64_t dims[IR_MAX_RANK];
  if (!concrete_dims(L, &e->type, dims, e->span)) return -1;
  int id = -1;
  switch (e->kind) {
  case SE_INPUT: {
    const IrInput *in = &L->m->inputs[e->index];
    int64_t attr = e->index;
    for (int i = 0; i < v->g->nnodes && id < 0; i++)
      if (v->g->nodes[i].op == IR_INPUT && v->g->nodes[i].attr[0] == e->index) id = i;
    if (id < 0) id = add_node(L, v, IR_INPUT, NULL, 0, &attr, 1, 0, in->dtype, in->rank, in->dims, e->span, in->name);
    break;
  }
  case SE_ARG: id = v->args[e->index]; break;
  case SE_PARAM: {
    const SemParam *p = &v->layer->params[e->index];
    id = param_node(L, v, p, join(L, v->prefix, p->name));
    break;
  }
  case SE_CHILD_PARAM: {
    const SemChild *c = &v->layer->children[e->index];
    const SemParam *p = &c->layer->params[e->index2];
    id = param_node(L, v, p, join(L, join(L, v->prefix, c->name), p->name));
    break;
  }
  case SE_SCALAR: id = add_node(L, v, IR_CONST, NULL, 0, NULL, 0, e->scalar, DT_F32, -1, NULL, e->span, NULL); break;
  case SE_OP: id = lower_op(L, v, e, dims); break;
  case SE_CALL: id = lower_call(L, v, e); break;
  case SE_TUPLE_GET: {
    const SemExpr *split = e->args[0];
    int x = lower_expr(L, v, split);
    if (x < 0) return -1;
    int64_t attr[IR_NATTR];
    memset(attr, 0, sizeof attr);
    int axis = (int)split->attr[0];
    attr[axis] = e->index * dims[axis];
    id = add_node(L, v, IR_SLICE, &x, 1, attr, 16, 0, e->type.dtype, e->type.rank, dims, e->span, NULL);
    break;
  }
  case SE_EXTERN: id = lower_extern(L, v, e, dims); break;
  }
  if (id >= 0) memo_put(L, v, e, id);
  return id;
}

static int lower_func(Lower *L, IrGraph *g, int graph_index, const SemFunc *fn, const int *args, const char *prefix,
                      int64_t count) {
  Inv v;
  memset(&v, 0, sizeof v);
  v.g = g;
  v.graph_index = graph_index;
  v.layer = fn->layer;
  v.args = args;
  v.prefix = prefix;
  v.count = count;
  return lower_expr(L, &v, fn->result);
}

IrModule *lower_model(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch) {
  LowerOptions o = {0, 0, 0};
  return lower_model_with(arena, diag, model, micro_batch, &o);
}

IrModule *lower_model_priced(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch) {
  LowerOptions o = {1, 0, 0};
  return lower_model_with(arena, diag, model, micro_batch, &o);
}

/* May region node n, which reads the heads' transpose t or other nodes of the region, read
 * [B, T, H, D] instead of [B, H, T, D]? Element-wise ops whose other inputs broadcast along
 * the last axis alone (a scalar, a [D] weight), and sums, means and maxima over the last
 * axis kept as an axis of one: RMSNorm over each head (Qwen3's QK-norm). */
static int sinkable_op(const IrNode *n) {
  if (n->rank != 4) return 0;
  int flags = ir_op_flags(n->op);
  if (flags & IRF_REDUCE)
    return (n->op == IR_REDUCE_SUM || n->op == IR_REDUCE_MEAN || n->op == IR_REDUCE_MAX) && n->attr[0] == 3 && n->attr[1];
  return (flags & IRF_ELEMENTWISE) != 0;
}

/* ... and whose inputs from outside the region (known once it is whole) broadcast along
 * the last axis alone */
static int sinkable_inputs(const IrGraph *g, const IrNode *n, const char *region, int t) {
  for (int j = 0; j < n->nin; j++) {
    int v = n->in[j];
    if (v == t || region[v]) continue;
    const IrNode *y = &g->nodes[v];
    for (int d = 0; d + 1 < y->rank; d++)
      if (y->dims[d] != 1) return 0;
  }
  return 1;
}

/* ROPE(f(TRANSPOSE(x))), the transpose split_heads's [B, T, H, D] -> [B, H, T, D] and f
 * nothing or ops that read either layout alike (sinkable_op, sinkable_inputs: Qwen3's
 * QK-norm), all read by that chain alone, becomes TRANSPOSE(ROPE(f(x))) with f and the
 * rotation on [B, T, H, D] (ROPE's attr[8]): the same values, one transpose either way,
 * but the attention's q and k are then the heads' transposes of values laid out as the
 * projections made them, as v is, which the CUDA back end's 16-bit attention reads in
 * place (fuse.c's fuse_attn_qkv) and whose gradients it writes as the projections read
 * them (fuse_attn_grad16): Llama's, Qwen3's and GPT-OSS's q, k and v need no transpose or
 * slice kernel of their own. The transpose moves from before the chain to just after the
 * rotation; the nodes between shift down by one. Returns whether it moved one. */
static int sink_one_rope_transpose(IrGraph *g) {
  int n = g->nnodes, moved = 0;
  IrReaders rd = ir_readers(g->nodes, n, g->arena);
  const int *start = rd.start, *users = rd.node;
  int *queue = malloc(sizeof *queue * (size_t)(start[n] + 1)); /* a use is queued once */
  char *region = calloc((size_t)n + 1, 1), *out = calloc((size_t)n + 1, 1);
  int *newid = malloc(sizeof *newid * (size_t)(n + 1));
  IrNode *nodes = malloc(sizeof *nodes * (size_t)(n + 1));
  if (!queue || !region || !out || !newid || !nodes) goto done;
  for (int k = 0; k < g->noutputs; k++) out[g->outputs[k]] = 1;
  for (int t = 0; t < n && !moved; t++) {
    const IrNode *tr = &g->nodes[t];
    if (!ir_heads_transpose(tr) || tr->nin != 1 || out[t] || g->nodes[tr->in[0]].rank != 4) continue;
    /* the region: what reads t, and what reads that, up to one rotation */
    memset(region, 0, (size_t)n);
    int head = 0, tail = 0, rope = -1, ok = 1;
    for (int u = start[t]; u < start[t + 1]; u++) queue[tail++] = users[u];
    while (ok && head < tail) {
      int u = queue[head++];
      const IrNode *un = &g->nodes[u];
      if (region[u] || u == rope) continue;
      if (un->op == IR_ROPE && un->nin == 1 && !un->attr[8] && un->dtype == tr->dtype) {
        ok = rope < 0;
        rope = u;
      } else if (!out[u] && sinkable_op(un)) {
        region[u] = 1;
        for (int w = start[u]; w < start[u + 1]; w++) queue[tail++] = users[w];
      } else {
        ok = 0;
      }
    }
    for (int u = 0; u < n && ok && rope >= 0; u++)
      if (region[u]) ok = sinkable_inputs(g, &g->nodes[u], region, t);
    if (!ok || rope < 0) continue;
    int x = tr->in[0];
    int m = 0, moved_t = -1;
    for (int i = 0; i < n; i++) {
      if (i == t) continue;
      newid[i] = m++;
      if (i == rope) moved_t = m++;
    }
    newid[t] = newid[x];
    for (int i = 0, j = 0; i < n; i++) {
      if (i == t) continue;
      IrNode y = g->nodes[i];
      for (int k = 0; k < y.nin; k++) y.in[k] = y.in[k] == rope ? moved_t : newid[y.in[k]];
      if (region[i] || i == rope) {
        int64_t d1 = y.dims[1];
        y.dims[1] = y.dims[2];
        y.dims[2] = d1;
      }
      if (i == rope) {
        y.attr[8] = 1;
        y.name = NULL; /* the name is the value's, after the transpose */
      }
      nodes[j++] = y;
      if (i == rope) {
        IrNode z = *tr; /* the transpose, its span split_heads's */
        z.in[0] = newid[rope];
        z.name = g->nodes[rope].name;
        memcpy(z.dims, g->nodes[rope].dims, sizeof z.dims);
        nodes[j++] = z;
      }
    }
    memcpy(g->nodes, nodes, sizeof *nodes * (size_t)n);
    for (int k = 0; k < g->noutputs; k++) g->outputs[k] = g->outputs[k] == rope ? moved_t : newid[g->outputs[k]];
    moved = 1;
  }
done:
  free(queue), free(region), free(out), free(newid), free(nodes);
  return moved;
}

static void sink_rope_transposes(IrGraph *g) {
  while (sink_one_rope_transpose(g)) {
  }
}

IrModule *lower_model_with(Arena *arena, Diag *diag, const SemModel *model, int64_t micro_batch, const LowerOptions *o) {
  Lower L;
  memset(&L, 0, sizeof L);
  L.priced = o->priced;
  L.materialize_attention = o->materialize_attention;
  L.conventional_count = o->conventional_count;
  L.arena = arena;
  L.diag = diag;
  L.model = model;
  L.micro_batch = micro_batch;
  L.m = ir_module_new(arena);
  L.m->micro_batch = micro_batch;
  const SemLayer *root = model->model;
  L.m->ninputs = root->ninputs;
  L.m->inputs = arena_alloc(arena, sizeof(IrInput) * (size_t)(root->ninputs + 1));
  for (int i = 0; i < root->ninputs; i++) {
    IrInput *in = &L.m->inputs[i];
    in->name = root->inputs[i].name;
    in->dtype = root->inputs[i].type.dtype;
    in->rank = root->inputs[i].type.rank;
    if (!concrete_dims(&L, &root->inputs[i].type, in->dims, root->inputs[i].span)) return NULL;
  }
  IrGraph *g = ir_graph_new(L.m, "forward");
  int loss = lower_func(&L, g, 0, model->forward, NULL, "", 1);
  if (loss < 0 || L.failed) return NULL;
  g->outputs = arena_alloc(arena, sizeof(int));
  g->outputs[0] = loss;
  g->noutputs = 1;
  for (int gi = 0; gi < L.m->ngraphs; gi++) sink_rope_transposes(L.m->graphs[gi]);
  return L.m;
}
