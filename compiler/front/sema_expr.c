/* sema_expr.c - forward checking: each forward is checked with the argument
 * shapes that reach it; expressions, builtins, calls of sub-layers and externs
 * become SemExprs whose tensor types are inferred with symbolic dimensions, so
 * a shape mismatch is reported with the operands it came from. */
#include "sema_internal.h"
#include "conv.h"
#include "ir.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* forward checking                                                    */

typedef struct {
  LayerBox *box;
  Binding *env;
} Fwd;

static SemExpr *new_expr(Sema *S, SemExprKind kind, Span at) {
  SemExpr *e = arena_alloc(S->arena, sizeof *e);
  e->kind = kind;
  e->span = at;
  return e;
}

static SemExpr *new_op(Sema *S, SemOp op, Span at, SemExpr **args, int nargs) {
  SemExpr *e = new_expr(S, SE_OP, at);
  e->op = op;
  e->nargs = nargs;
  e->args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(nargs + 1));
  for (int i = 0; i < nargs; i++) e->args[i] = args[i];
  return e;
}

static const char *tstr(Sema *S, const TensorType *t) { return sem_type_str(S->arena, t); }

static const char *ast_type_text(Sema *S, const AstType *t) {
  char *s = arena_printf(S->arena, "%s[", t->dtype ? t->dtype : "f32");
  for (int i = 0; i < t->ndims; i++) s = arena_printf(S->arena, "%s%s%s", s, i ? ", " : "", sema_expr_text(S, t->dims[i]));
  return arena_printf(S->arena, "%s]", s);
}

static int type_equal(const TensorType *a, const TensorType *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (!sym_equal(a->dims[i], b->dims[i])) return 0;
  return 1;
}

static int dim_is(const SymDim *d, int64_t v) {
  int64_t c;
  return sym_is_const(d, &c) && c == v;
}

/* Where a tensor came from, for the second half of a mismatch message. */
static void origin_note(Sema *S, Fwd *F, const SemExpr *x, const char *role) {
  if (x->kind == SE_PARAM) {
    const SemParam *p = F->box->params.items[x->index];
    diag_note(S->diag, p->span, "%s is %s, declared here", role, tstr(S, &x->type));
  } else if (x->kind == SE_INPUT) {
    const SemInput *in = F->box->inputs.items[x->index];
    diag_note(S->diag, in->span, "%s is %s, declared here", role, tstr(S, &x->type));
  } else {
    diag_note(S->diag, x->span, "%s is %s", role, tstr(S, &x->type));
  }
}

static SemExpr *check_expr(Sema *S, Fwd *F, const AstExpr *e);

static int require_float(Sema *S, Fwd *F, const SemExpr *x, const char *what, Span at) {
  if (sem_dtype_is_float(x->type.dtype)) return 1;
  sema_error(S, at, "%s needs a floating-point tensor; this is %s", what, tstr(S, &x->type));
  origin_note(S, F, x, "the operand");
  return 0;
}

/* The indices of take and one_hot: an integer tensor. */
static int require_indices(Sema *S, Fwd *F, const SemExpr *idx, const char *fn, Span at) {
  if (!sem_dtype_is_float(idx->type.dtype) && idx->kind != SE_SCALAR) return 1;
  sema_error(S, at, "%s's indices must be an integer tensor; this is %s", fn, idx->kind == SE_SCALAR ? "a number" : tstr(S, &idx->type));
  origin_note(S, F, idx, "the indices");
  return 0;
}

static SemExpr *scalar_expr(Sema *S, double v, Span at) {
  SemExpr *e = new_expr(S, SE_SCALAR, at);
  e->scalar = v;
  e->type.dtype = DT_F32;
  e->type.rank = 0;
  return e;
}

/* numpy broadcasting: align from the right; equal dims or a 1 stretch. */
static SemExpr *broadcast_op(Sema *S, Fwd *F, SemOp op, SemExpr *a, SemExpr *b, Span at, const char *sym) {
  if (a->kind != SE_SCALAR && b->kind != SE_SCALAR && a->type.dtype != b->type.dtype) {
    int fa = sem_dtype_is_float(a->type.dtype), fb = sem_dtype_is_float(b->type.dtype);
    if (fa != fb) {
      sema_error(S, at, "'%s' mixes %s and %s tensors", sym, sem_dtype_name(a->type.dtype), sem_dtype_name(b->type.dtype));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  SemExpr *args[2] = {a, b};
  SemExpr *r = new_op(S, op, at, args, 2);
  const TensorType *ta = &a->type, *tb = &b->type;
  int rank = ta->rank > tb->rank ? ta->rank : tb->rank;
  r->type.rank = rank;
  r->type.dtype = a->kind == SE_SCALAR ? tb->dtype : ta->dtype;
  for (int i = 0; i < rank; i++) {
    int ia = ta->rank - rank + i, ib = tb->rank - rank + i;
    SymDim *da = ia >= 0 ? ta->dims[ia] : NULL, *db = ib >= 0 ? tb->dims[ib] : NULL;
    if (!da) r->type.dims[i] = db;
    else if (!db) r->type.dims[i] = da;
    else if (sym_equal(da, db)) r->type.dims[i] = da;
    else if (dim_is(da, 1)) r->type.dims[i] = db;
    else if (dim_is(db, 1)) r->type.dims[i] = da;
    else {
      sema_error(S, at, "shapes do not match for '%s': %s and %s (dimension %d: %s vs %s)", sym, tstr(S, ta), tstr(S, tb),
                 i - rank, sym_str(S->arena, da), sym_str(S->arena, db));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  return r;
}

static SemExpr *matmul_op(Sema *S, Fwd *F, SemExpr *a, SemExpr *b, Span at) {
  const TensorType *ta = &a->type, *tb = &b->type;
  if (ta->rank < 2 || tb->rank < 2) {
    const SemExpr *bad = ta->rank < 2 ? a : b;
    sema_error(S, at, "'@' needs matrices (2 or more dimensions); the %s operand is %s", bad == a ? "left" : "right",
               tstr(S, &bad->type));
    origin_note(S, F, bad, bad == a ? "the left operand" : "the right operand");
    return NULL;
  }
  if (!require_float(S, F, a, "'@'", at) || !require_float(S, F, b, "'@'", at)) return NULL;
  SymDim *k1 = ta->dims[ta->rank - 1], *k2 = tb->dims[tb->rank - 2];
  if (!sym_equal(k1, k2)) {
    sema_error(S, at, "'@' inner dimensions differ: %s is %s, %s is %s (%s vs %s)", "the left operand", tstr(S, ta),
               "the right operand", tstr(S, tb), sym_str(S->arena, k1), sym_str(S->arena, k2));
    origin_note(S, F, a, "the left operand");
    origin_note(S, F, b, "the right operand");
    return NULL;
  }
  SemExpr *args[2] = {a, b};
  SemExpr *r = new_op(S, SOP_MATMUL, at, args, 2);
  r->type.dtype = ta->dtype;
  /* batch dims: [..., M, K] @ [K, N], or equal / broadcast batch dims */
  int ba = ta->rank - 2, bb = tb->rank - 2;
  int batch = ba > bb ? ba : bb;
  r->type.rank = batch + 2;
  for (int i = 0; i < batch; i++) {
    int ia = ba - batch + i, ib = bb - batch + i;
    SymDim *da = ia >= 0 ? ta->dims[ia] : NULL, *db = ib >= 0 ? tb->dims[ib] : NULL;
    if (!da) r->type.dims[i] = db;
    else if (!db) r->type.dims[i] = da;
    else if (sym_equal(da, db) || dim_is(db, 1)) r->type.dims[i] = da;
    else if (dim_is(da, 1)) r->type.dims[i] = db;
    else {
      sema_error(S, at, "'@' batch dimensions differ: %s and %s", tstr(S, ta), tstr(S, tb));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  r->type.dims[batch] = ta->dims[ta->rank - 2];
  r->type.dims[batch + 1] = tb->dims[tb->rank - 1];
  return r;
}

/* Arguments of a builtin: tensors by position, attributes by position or keyword. */
typedef struct {
  const AstExpr *call;
  const char *fn;
} CallArgs;

static const AstExpr *arg_at(const CallArgs *c, int pos, const char *key) {
  int p = 0;
  for (int i = 0; i < c->call->u.call.nargs; i++) {
    const AstArg *a = &c->call->u.call.args[i];
    if (a->name) {
      if (key && !strcmp(a->name, key)) return a->value;
    } else if (p++ == pos) {
      return a->value;
    }
  }
  return NULL;
}

static int check_keywords(Sema *S, const CallArgs *c, const char *const *keys, int nkeys) {
  for (int i = 0; i < c->call->u.call.nargs; i++) {
    const AstArg *a = &c->call->u.call.args[i];
    if (!a->name) continue;
    int ok = 0;
    for (int k = 0; k < nkeys; k++) ok |= !strcmp(keys[k], a->name);
    if (!ok) {
      sema_error(S, a->name_span, "%s() has no argument '%s'", c->fn, a->name);
      const char *close = diag_closest(a->name, keys, nkeys);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return 0;
    }
  }
  return 1;
}

static int attr_int(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, int64_t dflt, int64_t *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  char what[64];
  snprintf(what, sizeof what, "%s's '%s'", c->fn, key);
  return sema_eval_int(S, F->env, e, what, out);
}

static int attr_float(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, double dflt, double *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  Value v = sema_eval_const(S, F->env, e);
  if (v.kind == VAL_NONE) return 0;
  if (!val_as_float(&v, out)) {
    sema_error(S, e->span, "%s's '%s' must be a number, not %s", c->fn, key, val_str(S->arena, &v));
    return 0;
  }
  return 1;
}

static int attr_bool(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, int dflt, int *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  Value v = sema_eval_const(S, F->env, e);
  if (v.kind == VAL_NONE) return 0;
  if (v.kind != VAL_BOOL) {
    sema_error(S, e->span, "%s's '%s' must be true or false, not %s", c->fn, key, val_str(S->arena, &v));
    return 0;
  }
  *out = v.b;
  return 1;
}

static int norm_axis(Sema *S, const CallArgs *c, int64_t axis, int rank, const TensorType *t) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    const AstExpr *e = arg_at(c, 1, "axis");
    sema_error(S, e ? e->span : c->call->span, "axis %" PRId64 " is out of range for %s (rank %d)", axis,
               sem_type_str(S->arena, t), rank);
    return -1;
  }
  return (int)a;
}

static SymDim *dim_div(Sema *S, SymDim *a, SymDim *b, Span at, const char *what) {
  SymStatus st = SYM_OK;
  SymDim *r = sym_div(S->arena, a, b, &st);
  if (!r || st != SYM_OK) {
    sema_error(S, at, "%s: %s is not divisible by %s", what, sym_str(S->arena, a), sym_str(S->arena, b));
    return NULL;
  }
  return r;
}

static SymDim *dim_mul(Sema *S, SymDim *a, SymDim *b, Span at) {
  SymDim *r = sym_mul(S->arena, a, b);
  if (!r) sema_error(S, at, "dimension overflow in %s * %s", sym_str(S->arena, a), sym_str(S->arena, b));
  return r;
}

/* A dimension in reshape(x, [..]): an int, -1, or a symbolic name like B. */
static SymDim *eval_dim(Sema *S, Fwd *F, const AstExpr *e, int *infer) {
  *infer = 0;
  if (e->kind == EX_NAME && !sema_lookup(F->env, e->u.sval)) return sym_var(S->arena, e->u.sval);
  int64_t d;
  if (!sema_eval_int(S, F->env, e, "a dimension", &d)) return NULL;
  if (d == -1) {
    *infer = 1;
    return NULL;
  }
  if (d < 1) {
    sema_error(S, e->span, "dimension %" PRId64 " is not positive", d);
    return NULL;
  }
  return sym_const(S->arena, d);
}

static SymDim *numel_of(Sema *S, const TensorType *t, Span at) {
  SymDim *n = sym_const(S->arena, 1);
  for (int i = 0; i < t->rank && n; i++) n = dim_mul(S, n, t->dims[i], at);
  return n;
}

static int count_positional(const AstExpr *call) {
  int n = 0;
  for (int i = 0; i < call->u.call.nargs; i++) n += call->u.call.args[i].name == NULL;
  return n;
}

static SemExpr *tensor_arg(Sema *S, Fwd *F, const CallArgs *c, int pos) {
  const AstExpr *e = arg_at(c, pos, NULL);
  if (!e) {
    sema_error(S, c->call->span, "%s() needs a tensor as argument %d", c->fn, pos + 1);
    return NULL;
  }
  return check_expr(S, F, e);
}

/* An attribute given as one int for both spatial axes or a pair [h, w]. */
static int attr_pair(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, const int64_t *dflt, int64_t *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    out[0] = dflt[0], out[1] = dflt[1];
    return 1;
  }
  Value v = sema_eval_const(S, F->env, e);
  if (v.kind == VAL_NONE) return 0;
  if ((v.kind == VAL_LIST || v.kind == VAL_TUPLE) && v.n == 2 && val_as_int(&v.items[0], &out[0]) && val_as_int(&v.items[1], &out[1]))
    return 1;
  if (val_as_int(&v, &out[0])) {
    out[1] = out[0];
    return 1;
  }
  sema_error(S, e->span, "%s's '%s' is an integer or a pair [h, w], not %s", c->fn, key, val_str(S->arena, &v));
  return 0;
}

/* x [N, C, H, W] with C, H, W known at compile time (an image batch). */
static int image_arg(Sema *S, Fwd *F, const CallArgs *c, SemExpr *x, int64_t *chw) {
  if (!x || !require_float(S, F, x, c->fn, c->call->span)) return 0;
  if (x->kind == SE_SCALAR || x->type.rank != 4) {
    sema_error(S, c->call->span, "%s() takes images [N, C, H, W]; this is %s", c->fn, x->kind == SE_SCALAR ? "a number" : tstr(S, &x->type));
    if (x->kind != SE_SCALAR) origin_note(S, F, x, "the input");
    return 0;
  }
  for (int i = 0; i < 3; i++)
    if (!sym_is_const(x->type.dims[i + 1], &chw[i])) {
      sema_error(S, c->call->span, "%s() needs the channels, height and width known at compile time; %s has %s", c->fn,
                 tstr(S, &x->type), sym_str(S->arena, x->type.dims[i + 1]));
      origin_note(S, F, x, "the input");
      return 0;
    }
  return 1;
}

/* conv2d(x [N, C, H, W], w [O, C/groups, KH, KW], stride, padding, dilation, groups) */
static SemExpr *check_conv2d(Sema *S, Fwd *F, const CallArgs *c) {
  static const char *const keys[] = {"stride", "padding", "dilation", "groups"};
  static const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
  Span at = c->call->span;
  if (!check_keywords(S, c, keys, 4)) return NULL;
  SemExpr *x = tensor_arg(S, F, c, 0), *w = x ? tensor_arg(S, F, c, 1) : NULL;
  int64_t chw[3], k[4], st[2], pad[2], dil[2], groups;
  if (!w || !image_arg(S, F, c, x, chw) || !require_float(S, F, w, c->fn, at)) return NULL;
  int wconst = w->kind != SE_SCALAR && w->type.rank == 4;
  for (int i = 0; wconst && i < 4; i++) wconst = sym_is_const(w->type.dims[i], &k[i]);
  if (!wconst) {
    sema_error(S, at, "conv2d's filters are [out_channels, in_channels / groups, KH, KW] of known sizes; this is %s",
               w->kind == SE_SCALAR ? "a number" : tstr(S, &w->type));
    if (w->kind != SE_SCALAR) origin_note(S, F, w, "the weight");
    return NULL;
  }
  if (!attr_pair(S, F, c, 2, "stride", one, st) || !attr_pair(S, F, c, 3, "padding", zero, pad) ||
      !attr_pair(S, F, c, 4, "dilation", one, dil) || !attr_int(S, F, c, 5, "groups", 1, &groups))
    return NULL;
  const AstExpr *ge = arg_at(c, 5, "groups");
  if (st[0] < 1 || st[1] < 1 || dil[0] < 1 || dil[1] < 1 || pad[0] < 0 || pad[1] < 0 || groups < 1) {
    sema_error(S, at, "conv2d needs stride >= 1, dilation >= 1, padding >= 0 and groups >= 1; this is stride [%" PRId64 ", %" PRId64
               "], padding [%" PRId64 ", %" PRId64 "], dilation [%" PRId64 ", %" PRId64 "], groups %" PRId64,
               st[0], st[1], pad[0], pad[1], dil[0], dil[1], groups);
    return NULL;
  }
  if (chw[0] % groups || k[0] % groups) {
    sema_error(S, ge ? ge->span : at, "conv2d's groups (%" PRId64 ") must divide the input channels (%" PRId64 ") and the output channels (%" PRId64 ")",
               groups, chw[0], k[0]);
    return NULL;
  }
  if (chw[0] != k[1] * groups) {
    sema_error(S, at, "conv2d: the input has %" PRId64 " channels but the filters %s expect %" PRId64 " (in_channels / groups = %" PRId64
               ", groups = %" PRId64 ")",
               chw[0], tstr(S, &w->type), k[1] * groups, k[1], groups);
    origin_note(S, F, x, "the input");
    origin_note(S, F, w, "the weight");
    return NULL;
  }
  int64_t Ho = conv_out_len(chw[1], k[2], st[0], pad[0], dil[0]), Wo = conv_out_len(chw[2], k[3], st[1], pad[1], dil[1]);
  if (Ho < 1 || Wo < 1) {
    sema_error(S, at, "conv2d: the %" PRId64 "x%" PRId64 " kernel (dilation %" PRId64 ", %" PRId64 ") is larger than the input %s padded by [%" PRId64
               ", %" PRId64 "]",
               k[2], k[3], dil[0], dil[1], tstr(S, &x->type), pad[0], pad[1]);
    origin_note(S, F, x, "the input");
    return NULL;
  }
  SemExpr *args[2] = {x, w};
  SemExpr *r = new_op(S, SOP_CONV2D, at, args, 2);
  r->type = x->type;
  r->type.dims[1] = sym_const(S->arena, k[0]);
  r->type.dims[2] = sym_const(S->arena, Ho);
  r->type.dims[3] = sym_const(S->arena, Wo);
  int64_t a[CONV_NATTR] = {st[0], st[1], pad[0], pad[1], dil[0], dil[1], groups, chw[1], chw[2], k[2], k[3]};
  memcpy(r->attr, a, sizeof a);
  r->nattr = CONV_NATTR;
  return r;
}

/* max_pool2d(x, kernel, stride = kernel, padding = 0), avg_pool2d likewise,
 * adaptive_avg_pool2d(x, size) */
static SemExpr *check_pool2d(Sema *S, Fwd *F, SemOp op, const CallArgs *c) {
  static const char *const keys[] = {"kernel", "stride", "padding", "size"};
  static const int64_t zero[2] = {0, 0};
  Span at = c->call->span;
  int adaptive = op == SOP_ADAPTIVE_AVG_POOL2D;
  if (!check_keywords(S, c, adaptive ? keys + 3 : keys, adaptive ? 1 : 3)) return NULL;
  SemExpr *x = tensor_arg(S, F, c, 0);
  int64_t chw[3], kk[2], st[2], pad[2] = {0, 0}, Ho, Wo;
  if (!image_arg(S, F, c, x, chw)) return NULL;
  const char *kname = adaptive ? "size" : "kernel";
  if (!arg_at(c, 1, kname)) {
    sema_error(S, at, "%s() needs its %s", c->fn, adaptive ? "output size" : "window (kernel = 2 or [kh, kw])");
    return NULL;
  }
  if (!attr_pair(S, F, c, 1, kname, zero, kk)) return NULL;
  if (!adaptive && (!attr_pair(S, F, c, 2, "stride", kk, st) || !attr_pair(S, F, c, 3, "padding", zero, pad))) return NULL;
  if (adaptive) st[0] = st[1] = 1;
  int64_t attr[POOL_NATTR] = {op == SOP_MAX_POOL2D ? POOL_MAX : op == SOP_AVG_POOL2D ? POOL_AVG : POOL_ADAPTIVE_AVG,
                              kk[0], kk[1], st[0], st[1], pad[0], pad[1]};
  if (kk[0] < 1 || kk[1] < 1 || st[0] < 1 || st[1] < 1 || pad[0] < 0 || pad[1] < 0) {
    sema_error(S, at, "%s() needs a %s of at least 1 x 1, stride >= 1 and padding >= 0", c->fn, adaptive ? "size" : "window");
    return NULL;
  }
  if (pool_out_size(attr, chw[1], chw[2], &Ho, &Wo)) {
    if (2 * pad[0] > kk[0] || 2 * pad[1] > kk[1])
      sema_error(S, at, "%s: padding [%" PRId64 ", %" PRId64 "] is more than half the %" PRId64 "x%" PRId64 " window", c->fn, pad[0], pad[1], kk[0], kk[1]);
    else
      sema_error(S, at, "%s: the %" PRId64 "x%" PRId64 " window is larger than the input %s padded by [%" PRId64 ", %" PRId64 "]", c->fn,
                 kk[0], kk[1], tstr(S, &x->type), pad[0], pad[1]);
    origin_note(S, F, x, "the input");
    return NULL;
  }
  SemExpr *r = new_op(S, op, at, &x, 1);
  r->type = x->type;
  r->type.dims[2] = sym_const(S->arena, Ho);
  r->type.dims[3] = sym_const(S->arena, Wo);
  memcpy(r->attr, attr, sizeof attr);
  r->nattr = POOL_NATTR;
  return r;
}

/* flatten(x, start = 1): the axes from start on merged into one, a reshape. */
static SemExpr *check_flatten(Sema *S, Fwd *F, const CallArgs *c) {
  static const char *const keys[] = {"start"};
  Span at = c->call->span;
  if (!check_keywords(S, c, keys, 1)) return NULL;
  SemExpr *x = tensor_arg(S, F, c, 0);
  int64_t start;
  if (!x || !attr_int(S, F, c, 1, "start", 1, &start)) return NULL;
  if (x->kind == SE_SCALAR) {
    sema_error(S, at, "flatten() takes a tensor; this is a number");
    return NULL;
  }
  int rank = x->type.rank;
  int64_t s0 = start < 0 ? start + rank : start;
  if (s0 < 0 || s0 >= rank) {
    sema_error(S, at, "flatten's start %" PRId64 " is out of range for %s (rank %d)", start, tstr(S, &x->type), rank);
    return NULL;
  }
  SymDim *merged = sym_const(S->arena, 1);
  for (int i = (int)s0; i < rank && merged; i++) merged = dim_mul(S, merged, x->type.dims[i], at);
  if (!merged) return NULL;
  SemExpr *r = new_op(S, SOP_RESHAPE, at, &x, 1);
  r->type = x->type;
  r->type.rank = (int)s0 + 1;
  r->type.dims[s0] = merged;
  return r;
}

/* Param `index` of the layer being checked becomes a state: updated by the
 * forward (running statistics, a routing bias), not trained, not counted. */
static void make_state(Fwd *F, int index) {
  ((SemParam *)F->box->params.items[index])->state = 1;
  ((SemLayer *)F->box)->params[index].state = 1;
}

/* batch_norm(x [N, C, ...], weight [C], bias [C], eps = 1e-5, sync = false,
 * running_mean = p, running_var = q, momentum = 0.1): each channel normalised
 * by its mean and biased variance over every axis but 1 (the batch and the
 * image), then scaled and shifted; sync: the statistics over the whole
 * data-parallel batch (lower.c). With running_mean and running_var (params
 * [C] of the layer, which become state parameters), the forward also updates
 * them: p = (1 - momentum) p + momentum mean, q likewise with the unbiased
 * variance (PyTorch's). */
static SemExpr *check_batch_norm(Sema *S, Fwd *F, const CallArgs *c) {
  static const char *const keys[] = {"eps", "sync", "running_mean", "running_var", "momentum"};
  Span at = c->call->span;
  if (!check_keywords(S, c, keys, 5)) return NULL;
  SemExpr *x = tensor_arg(S, F, c, 0), *w = x ? tensor_arg(S, F, c, 1) : NULL, *b = w ? tensor_arg(S, F, c, 2) : NULL;
  if (!b || !require_float(S, F, x, c->fn, at) || !require_float(S, F, w, c->fn, at) || !require_float(S, F, b, c->fn, at))
    return NULL;
  if (x->kind == SE_SCALAR || x->type.rank < 2) {
    sema_error(S, at, "batch_norm() takes x [N, C, ...] (channels on axis 1); this is %s",
               x->kind == SE_SCALAR ? "a number" : tstr(S, &x->type));
    return NULL;
  }
  SemExpr *wb[2] = {w, b};
  for (int i = 0; i < 2; i++)
    if (wb[i]->kind == SE_SCALAR || wb[i]->type.rank != 1 || !sym_equal(wb[i]->type.dims[0], x->type.dims[1])) {
      sema_error(S, at, "batch_norm's %s must be [C] with C = %s, the channels of x %s; this is %s", i ? "bias" : "weight",
                 sym_str(S->arena, x->type.dims[1]), tstr(S, &x->type), wb[i]->kind == SE_SCALAR ? "a number" : tstr(S, &wb[i]->type));
      origin_note(S, F, wb[i], i ? "the bias" : "the weight");
      return NULL;
    }
  double eps, momentum;
  int sync;
  if (!attr_float(S, F, c, 3, "eps", 1e-5, &eps) || !attr_bool(S, F, c, 4, "sync", 0, &sync) ||
      !attr_float(S, F, c, 7, "momentum", 0.1, &momentum))
    return NULL;
  if (!(eps > 0) || !isfinite(eps)) {
    sema_error(S, at, "batch_norm's eps must be a positive number, not %g", eps);
    return NULL;
  }
  if (!(momentum > 0 && momentum <= 1)) {
    sema_error(S, at, "batch_norm's momentum must be in (0, 1], not %g", momentum);
    return NULL;
  }
  /* the running statistics: both or neither, each a [C] param of this layer */
  const AstExpr *re[2] = {arg_at(c, 5, "running_mean"), arg_at(c, 6, "running_var")};
  static const char *const rname[2] = {"running_mean", "running_var"};
  SemExpr *args[5] = {x, w, b, NULL, NULL};
  if (!re[0] != !re[1]) {
    sema_error(S, at, "batch_norm takes running_mean and running_var together (or neither)");
    return NULL;
  }
  for (int i = 0; i < 2 && re[0]; i++) {
    SemExpr *s = check_expr(S, F, re[i]);
    if (!s) return NULL;
    if (s->kind != SE_PARAM) {
      sema_error(S, re[i]->span, "batch_norm's %s must be a param of this layer (the forward updates it), not a computed tensor",
                 rname[i]);
      diag_hint(S->diag, "declare it: param %s : [C] init %s", rname[i], i ? "ones" : "zeros");
      return NULL;
    }
    if (s->type.rank != 1 || !sym_equal(s->type.dims[0], x->type.dims[1]) || !sem_dtype_is_float(s->type.dtype)) {
      sema_error(S, re[i]->span, "batch_norm's %s must be [C] with C = %s, the channels of x %s; this is %s", rname[i],
                 sym_str(S->arena, x->type.dims[1]), tstr(S, &x->type), tstr(S, &s->type));
      origin_note(S, F, s, rname[i]);
      return NULL;
    }
    /* a state parameter from now on: updated by the forward, not trained */
    make_state(F, s->index);
    args[3 + i] = s;
  }
  SemExpr *r = new_op(S, SOP_BATCH_NORM, at, args, re[0] ? 5 : 3);
  r->type = x->type;
  r->attr[0] = sync;
  r->nattr = 1;
  r->scalar = eps;
  r->attr[1] = (int64_t)llround(momentum * 1e9); /* momentum in 1e-9 units (attributes are integers); lower.c divides */
  r->nattr = 2;
  return r;
}

/* balance_experts(y, bias, chosen, rate = 0.001): y; and bias (a [E] param
 * of the layer, which becomes state) moves after each training micro-batch
 * by rate towards balance, + rate for an expert the micro-batch's tokens
 * (over the data-parallel ranks) chose less often than the mean, - rate for
 * one chosen more (DeepSeek-V3's auxiliary-loss-free balancing; lower.c). */
static SemExpr *check_balance_experts(Sema *S, Fwd *F, const CallArgs *c) {
  static const char *const keys[] = {"rate"};
  Span at = c->call->span;
  if (!check_keywords(S, c, keys, 1)) return NULL;
  SemExpr *y = tensor_arg(S, F, c, 0), *b = y ? tensor_arg(S, F, c, 1) : NULL, *idx = b ? tensor_arg(S, F, c, 2) : NULL;
  if (!idx || !require_float(S, F, y, c->fn, at)) return NULL;
  if (b->kind != SE_PARAM) {
    sema_error(S, at, "balance_experts' bias must be a param of this layer (the forward updates it), not a computed tensor");
    diag_hint(S->diag, "declare it: param bias : [experts] init zeros");
    return NULL;
  }
  if (b->type.rank != 1 || !sem_dtype_is_float(b->type.dtype)) {
    sema_error(S, at, "balance_experts' bias must be [E], a float per expert; this is %s", tstr(S, &b->type));
    origin_note(S, F, b, "the bias");
    return NULL;
  }
  if (!require_indices(S, F, idx, "balance_experts", at)) return NULL;
  double rate;
  if (!attr_float(S, F, c, 3, "rate", 0.001, &rate)) return NULL;
  if (!(rate > 0) || !isfinite(rate)) {
    sema_error(S, at, "balance_experts' rate must be a positive number, not %g", rate);
    return NULL;
  }
  make_state(F, b->index);
  SemExpr *args[3] = {y, b, idx};
  SemExpr *r = new_op(S, SOP_BALANCE_EXPERTS, at, args, 3);
  r->type = y->type;
  r->scalar = rate;
  return r;
}

static SemExpr *check_builtin(Sema *S, Fwd *F, SemOp op, const AstExpr *call, const char *fn) {
  CallArgs c = {call, fn};
  Span at = call->span;
  int npos = count_positional(call);
  const BuiltinInfo *info = &sema_builtins[op];
  if (npos + (call->u.call.nargs - npos) < info->min_args || call->u.call.nargs > info->max_args) {
    if (info->min_args == info->max_args)
      sema_error(S, at, "%s() takes %d argument%s, not %d", fn, info->min_args, info->min_args == 1 ? "" : "s",
                 call->u.call.nargs);
    else
      sema_error(S, at, "%s() takes %d to %d arguments, not %d", fn, info->min_args, info->max_args, call->u.call.nargs);
    return NULL;
  }
  if (sema_is_unary_elementwise(op)) {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    if (x->kind == SE_SCALAR) {
      sema_error(S, at, "%s() of a number: use it on tensors; for constants, sqrt/exp/log work at compile time", fn);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    return r;
  }
  switch (op) {
  case SOP_MAXIMUM:
  case SOP_MINIMUM: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *a = tensor_arg(S, F, &c, 0), *b = a ? tensor_arg(S, F, &c, 1) : NULL;
    if (!a || !b) return NULL;
    return broadcast_op(S, F, op, a, b, at, fn);
  }
  case SOP_SUM:
  case SOP_MEAN:
  case SOP_MAX:
  case SOP_SOFTMAX:
  case SOP_LOG_SOFTMAX: {
    static const char *const keys[] = {"axis", "keepdim"};
    int is_reduce = op == SOP_SUM || op == SOP_MEAN || op == SOP_MAX;
    if (!check_keywords(S, &c, keys, is_reduce ? 2 : 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    int64_t axis;
    int keepdim = 0;
    if (!attr_int(S, F, &c, 1, "axis", -1, &axis)) return NULL;
    if (is_reduce && !attr_bool(S, F, &c, 2, "keepdim", 0, &keepdim)) return NULL;
    if (x->type.rank == 0) {
      sema_error(S, at, "%s() of a scalar", fn);
      return NULL;
    }
    int a = norm_axis(S, &c, axis, x->type.rank, &x->type);
    if (a < 0) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->attr[0] = a;
    r->attr[1] = keepdim;
    r->nattr = 2;
    r->type = x->type;
    if (is_reduce) {
      if (keepdim) r->type.dims[a] = sym_const(S->arena, 1);
      else {
        for (int i = a; i + 1 < x->type.rank; i++) r->type.dims[i] = x->type.dims[i + 1];
        r->type.rank--;
      }
    }
    return r;
  }
  case SOP_RESHAPE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    const AstExpr *shape = arg_at(&c, 1, NULL);
    if (!shape || shape->kind != EX_LIST) {
      sema_error(S, shape ? shape->span : at, "reshape's shape is a list: reshape(x, [B, T, 12, 64])");
      return NULL;
    }
    if (shape->u.list.nitems > SEM_MAX_RANK || shape->u.list.nitems == 0) {
      sema_error(S, shape->span, "a shape has 1 to %d dimensions", SEM_MAX_RANK);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = shape->u.list.nitems;
    int infer_at = -1;
    SymDim *known = sym_const(S->arena, 1);
    for (int i = 0; i < r->type.rank; i++) {
      int infer;
      SymDim *d = eval_dim(S, F, shape->u.list.items[i], &infer);
      if (infer) {
        if (infer_at >= 0) {
          sema_error(S, shape->u.list.items[i]->span, "only one dimension of a reshape can be -1");
          return NULL;
        }
        infer_at = i;
        continue;
      }
      if (!d) return NULL;
      r->type.dims[i] = d;
      known = dim_mul(S, known, d, at);
      if (!known) return NULL;
    }
    SymDim *total = numel_of(S, &x->type, at);
    if (!total) return NULL;
    if (infer_at >= 0) {
      SymStatus st = SYM_OK;
      SymDim *d = sym_div(S->arena, total, known, &st);
      if (!d || st != SYM_OK) {
        sema_error(S, shape->span, "cannot reshape %s (%s elements) with %s: the -1 dimension is not whole",
                   tstr(S, &x->type), sym_str(S->arena, total), sym_str(S->arena, known));
        return NULL;
      }
      r->type.dims[infer_at] = d;
    } else if (!sym_equal(total, known)) {
      sema_error(S, shape->span, "cannot reshape %s (%s elements) into %s elements", tstr(S, &x->type),
                 sym_str(S->arena, total), sym_str(S->arena, known));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    return r;
  }
  case SOP_TRANSPOSE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    int rank = x->type.rank;
    if (rank < 2) {
      sema_error(S, at, "transpose needs 2 or more dimensions; this is %s", tstr(S, &x->type));
      return NULL;
    }
    int64_t a = rank - 2, b = rank - 1;
    if (npos == 2 || npos > 3) {
      sema_error(S, at, "transpose(x) swaps the last two dimensions; transpose(x, a, b) swaps a and b");
      return NULL;
    }
    if (npos == 3 && (!attr_int(S, F, &c, 1, "a", 0, &a) || !attr_int(S, F, &c, 2, "b", 0, &b))) return NULL;
    int na = norm_axis(S, &c, a, rank, &x->type), nb = na < 0 ? -1 : norm_axis(S, &c, b, rank, &x->type);
    if (na < 0 || nb < 0) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[na] = x->type.dims[nb];
    r->type.dims[nb] = x->type.dims[na];
    r->attr[0] = na;
    r->attr[1] = nb;
    r->nattr = 2;
    return r;
  }
  case SOP_SPLIT_HEADS: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t h;
    if (!x || !attr_int(S, F, &c, 1, "heads", 0, &h)) return NULL;
    if (x->type.rank != 3) {
      sema_error(S, at, "split_heads needs [B, T, H*D]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    if (h < 1) {
      sema_error(S, arg_at(&c, 1, NULL)->span, "the number of heads must be positive, not %" PRId64, h);
      return NULL;
    }
    SymDim *d = dim_div(S, x->type.dims[2], sym_const(S->arena, h), at, "split_heads");
    if (!d) return NULL;
    HeadSplit *hs = arena_alloc(S->arena, sizeof *hs);
    hs->heads = h;
    hs->span = arg_at(&c, 1, NULL)->span;
    hs->what = sema_expr_text(S, arg_at(&c, 1, NULL));
    for (Frame *f = S->frame; f && hs->nframes < 6; f = f->up)
      if (f->call_site.file >= 0) hs->frames[hs->nframes++] = *f;
    ptrvec_push(S->arena, &S->head_splits, hs);
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = 4;
    r->type.dims[0] = x->type.dims[0];
    r->type.dims[1] = sym_const(S->arena, h);
    r->type.dims[2] = x->type.dims[1];
    r->type.dims[3] = d;
    r->attr[0] = h;
    r->nattr = 1;
    return r;
  }
  case SOP_MERGE_HEADS: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    if (x->type.rank != 4) {
      sema_error(S, at, "merge_heads needs [B, H, T, D]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = 3;
    r->type.dims[0] = x->type.dims[0];
    r->type.dims[1] = x->type.dims[2];
    r->type.dims[2] = dim_mul(S, x->type.dims[1], x->type.dims[3], at);
    return r->type.dims[2] ? r : NULL;
  }
  case SOP_SPLIT: {
    static const char *const keys[] = {"axis"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t n, axis;
    if (!x || !attr_int(S, F, &c, 1, "parts", 0, &n) || !attr_int(S, F, &c, 2, "axis", -1, &axis)) return NULL;
    if (n < 1 || n > 64) {
      sema_error(S, arg_at(&c, 1, NULL)->span, "split into %" PRId64 " parts: the count must be 1 to 64", n);
      return NULL;
    }
    if (x->type.rank == 0) {
      sema_error(S, at, "split of a scalar");
      return NULL;
    }
    int a = norm_axis(S, &c, axis, x->type.rank, &x->type);
    if (a < 0) return NULL;
    SymDim *d = dim_div(S, x->type.dims[a], sym_const(S->arena, n), at, "split");
    if (!d) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[a] = d;
    r->is_tuple = 1;
    r->ntuple = (int)n;
    r->attr[0] = a;
    r->attr[1] = n;
    r->nattr = 2;
    return r;
  }
  case SOP_CONCAT: {
    static const char *const keys[] = {"axis"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    const AstExpr *list = arg_at(&c, 0, NULL);
    if (!list || list->kind != EX_LIST || list->u.list.nitems < 1) {
      sema_error(S, list ? list->span : at, "concat takes a list of tensors: concat([a, b], axis = -1)");
      return NULL;
    }
    int64_t axis;
    if (!attr_int(S, F, &c, 1, "axis", -1, &axis)) return NULL;
    int n = list->u.list.nitems;
    SemExpr **parts = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)n);
    for (int i = 0; i < n; i++)
      if (!(parts[i] = check_expr(S, F, list->u.list.items[i]))) return NULL;
    int rank = parts[0]->type.rank;
    if (rank == 0) {
      sema_error(S, at, "concat of scalars");
      return NULL;
    }
    int a = norm_axis(S, &c, axis, rank, &parts[0]->type);
    if (a < 0) return NULL;
    SemExpr *r = new_op(S, op, at, parts, n);
    r->type = parts[0]->type;
    for (int i = 1; i < n; i++) {
      const TensorType *t = &parts[i]->type;
      int ok = t->rank == rank && t->dtype == r->type.dtype;
      for (int k = 0; ok && k < rank; k++)
        if (k != a && !sym_equal(t->dims[k], parts[0]->type.dims[k])) ok = 0;
      if (!ok) {
        sema_error(S, list->u.list.items[i]->span, "concat along axis %d: %s does not fit %s", a, tstr(S, t),
                   tstr(S, &parts[0]->type));
        return NULL;
      }
      r->type.dims[a] = sym_add(S->arena, r->type.dims[a], t->dims[a]);
      if (!r->type.dims[a]) return NULL;
    }
    r->attr[0] = a;
    r->nattr = 1;
    return r;
  }
  case SOP_EMBEDDING: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *table = tensor_arg(S, F, &c, 0), *ids = table ? tensor_arg(S, F, &c, 1) : NULL;
    if (!table || !ids) return NULL;
    if (table->type.rank != 2 || !sem_dtype_is_float(table->type.dtype)) {
      sema_error(S, at, "embedding's table is a float [V, C] tensor; this is %s", tstr(S, &table->type));
      origin_note(S, F, table, "the table");
      return NULL;
    }
    if (sem_dtype_is_float(ids->type.dtype) || ids->kind == SE_SCALAR) {
      sema_error(S, at, "embedding's indices must be an integer tensor; this is %s", tstr(S, &ids->type));
      origin_note(S, F, ids, "the indices");
      return NULL;
    }
    if (ids->type.rank + 1 > SEM_MAX_RANK) {
      sema_error(S, at, "too many dimensions");
      return NULL;
    }
    SemExpr *args[2] = {table, ids};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type = ids->type;
    r->type.dtype = table->type.dtype;
    r->type.dims[r->type.rank++] = table->type.dims[1];
    return r;
  }
  case SOP_ARANGE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    const AstExpr *ne = arg_at(&c, 0, NULL);
    int infer;
    SymDim *n = ne ? eval_dim(S, F, ne, &infer) : NULL;
    if (!n) {
      if (ne && infer) sema_error(S, ne->span, "arange needs a positive length");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, NULL, 0);
    r->type.dtype = DT_I32;
    r->type.rank = 1;
    r->type.dims[0] = n;
    return r;
  }
  case SOP_CAUSAL_MASK: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    int r0 = x->type.rank;
    if (r0 < 2 || !sym_equal(x->type.dims[r0 - 1], x->type.dims[r0 - 2])) {
      sema_error(S, at, "causal_mask needs square scores [..., T, T]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the scores");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    return r;
  }
  case SOP_ROPE: {
    static const char *const keys[] = {"base", "factor", "original", "beta_fast", "beta_slow", "truncate"};
    if (!check_keywords(S, &c, keys, 6)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    double base, factor, beta_fast, beta_slow;
    int64_t original;
    int truncate;
    if (!x || !require_float(S, F, x, fn, at) || !attr_float(S, F, &c, 1, "base", 10000.0, &base) ||
        !attr_float(S, F, &c, 2, "factor", 1.0, &factor) || !attr_int(S, F, &c, 3, "original", 0, &original) ||
        !attr_float(S, F, &c, 4, "beta_fast", 32.0, &beta_fast) || !attr_float(S, F, &c, 5, "beta_slow", 1.0, &beta_slow) ||
        !attr_bool(S, F, &c, 6, "truncate", 1, &truncate))
      return NULL;
    int64_t d;
    if (x->type.rank != 4 || (sym_is_const(x->type.dims[3], &d) && d % 2 != 0)) {
      sema_error(S, at, "rope needs [B, H, T, D] with an even D; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    if (!(base > 1)) {
      sema_error(S, arg_at(&c, 1, "base")->span, "rope's base must be greater than 1");
      return NULL;
    }
    /* YaRN (factor > 1): the frequencies of the pairs that turn fewer than
     * beta_slow times over the original context are divided by factor, those
     * that turn more than beta_fast times kept, a ramp between */
    if (!(factor >= 1)) {
      sema_error(S, arg_at(&c, 2, "factor")->span,
                 "rope's factor must be at least 1 (1: plain RoPE; above: YaRN's context extension), not %g", factor);
      return NULL;
    }
    if (factor > 1 && original < 1) {
      sema_error(S, arg_at(&c, 2, "factor")->span,
                 "rope's factor %g (YaRN) needs original = the context length the model was trained at", factor);
      return NULL;
    }
    if (factor > 1 && !(beta_fast > beta_slow && beta_slow > 0)) {
      const AstExpr *b = arg_at(&c, 4, "beta_fast");
      sema_error(S, b ? b->span : at,
                 "rope's YaRN needs beta_fast > beta_slow > 0 (rotations over the original context; GPT-OSS and "
                 "DeepSeek-V3: 32 and 1), not %g and %g",
                 beta_fast, beta_slow);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->scalar = base;
    if (factor > 1) {
      ir_rope_set_yarn(r->attr, factor, beta_fast, beta_slow, original, truncate);
      r->nattr = 8;
    }
    return r;
  }
  case SOP_REPEAT_KV: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t n;
    if (!x || !attr_int(S, F, &c, 1, "n", 0, &n)) return NULL;
    if (x->type.rank != 4 || n < 1) {
      sema_error(S, at, "repeat_kv needs [B, Hkv, T, D] and a positive count; this is %s and %" PRId64, tstr(S, &x->type), n);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[1] = dim_mul(S, x->type.dims[1], sym_const(S->arena, n), at);
    r->attr[0] = n;
    r->nattr = 1;
    return r->type.dims[1] ? r : NULL;
  }
  case SOP_CONV2D: return check_conv2d(S, F, &c);
  case SOP_MAX_POOL2D:
  case SOP_AVG_POOL2D:
  case SOP_ADAPTIVE_AVG_POOL2D: return check_pool2d(S, F, op, &c);
  case SOP_FLATTEN: return check_flatten(S, F, &c);
  case SOP_BATCH_NORM: return check_batch_norm(S, F, &c);
  case SOP_BALANCE_EXPERTS: return check_balance_experts(S, F, &c);
  case SOP_ATTENTION: {
    /* attention(q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv], causal = true, scale = 1 / sqrt(D)):
     * softmax(scale q k^T) v over the allowed keys, H a multiple of Hk (grouped-query attention) */
    static const char *const keys[] = {"causal", "scale", "window", "sinks"};
    if (!check_keywords(S, &c, keys, 4)) return NULL;
    SemExpr *q = tensor_arg(S, F, &c, 0), *k = q ? tensor_arg(S, F, &c, 1) : NULL, *v = k ? tensor_arg(S, F, &c, 2) : NULL;
    if (!q || !k || !v) return NULL;
    SemExpr *qkv[3] = {q, k, v};
    static const char *const what[3] = {"queries", "keys", "values"};
    for (int i = 0; i < 3; i++) {
      if (!require_float(S, F, qkv[i], fn, at)) return NULL;
      if (qkv[i]->type.rank != 4) {
        sema_error(S, at, "attention's %s are [B, heads, T, head_dim]; this is %s", what[i], tstr(S, &qkv[i]->type));
        origin_note(S, F, qkv[i], what[i]);
        return NULL;
      }
    }
    int ok = sym_equal(k->type.dims[0], q->type.dims[0]) && sym_equal(v->type.dims[0], q->type.dims[0]) &&
             sym_equal(k->type.dims[3], q->type.dims[3]) && sym_equal(v->type.dims[1], k->type.dims[1]) &&
             sym_equal(v->type.dims[2], k->type.dims[2]);
    int64_t h, hk, d;
    if (ok && sym_is_const(q->type.dims[1], &h) && sym_is_const(k->type.dims[1], &hk) && (hk < 1 || h % hk)) ok = 0;
    if (!ok) {
      sema_error(S, at,
                 "attention: queries %s, keys %s and values %s do not fit (q [B, H, T, D], k [B, Hk, S, D], "
                 "v [B, Hk, S, Dv], H a multiple of Hk)",
                 tstr(S, &q->type), tstr(S, &k->type), tstr(S, &v->type));
      return NULL;
    }
    int causal;
    int64_t window, t;
    double dflt = sym_is_const(q->type.dims[3], &d) && d > 0 ? 1.0 / sqrt((double)d) : 0, scale;
    if (!attr_bool(S, F, &c, 3, "causal", 1, &causal) || !attr_float(S, F, &c, 4, "scale", dflt, &scale) ||
        !attr_int(S, F, &c, 5, "window", 0, &window))
      return NULL;
    if (window < 0 || (window > 0 && !causal)) {
      sema_error(S, arg_at(&c, 5, "window")->span,
                 window < 0 ? "attention's window must be a number of keys >= 1 (0: none), not %" PRId64
                            : "attention's window (%" PRId64 ") slides over earlier keys: it needs causal = true",
                 window);
      return NULL;
    }
    if (window > 0 && sym_is_const(q->type.dims[2], &t) && window > t) {
      sema_error(S, arg_at(&c, 5, "window")->span,
                 "attention's window of %" PRId64 " keys is larger than the sequence of %" PRId64
                 " (a window >= the sequence is plain causal attention: leave it out)",
                 window, t);
      return NULL;
    }
    if (!(scale > 0) || !isfinite(scale)) {
      sema_error(S, at, "attention's scale must be a positive number, not %g", scale);
      return NULL;
    }
    if (causal && !sym_equal(q->type.dims[2], k->type.dims[2])) {
      sema_error(S, at, "causal attention needs as many keys as queries; this is %s against %s (say causal = false)",
                 tstr(S, &q->type), tstr(S, &k->type));
      return NULL;
    }
    /* sinks = s [H]: a learned logit per query head in every row's softmax
     * denominator (GPT-OSS; Xiao et al. 2024's attention sinks) */
    SemExpr *args4[4] = {q, k, v, NULL};
    const AstExpr *se = arg_at(&c, 6, "sinks");
    if (se) {
      SemExpr *sk = check_expr(S, F, se);
      if (!sk) return NULL;
      if (sk->kind == SE_SCALAR || sk->type.rank != 1 || !sem_dtype_is_float(sk->type.dtype) ||
          !sym_equal(sk->type.dims[0], q->type.dims[1])) {
        sema_error(S, se->span, "attention's sinks are a logit per query head, [H] with H = %s; this is %s",
                   sym_str(S->arena, q->type.dims[1]), sk->kind == SE_SCALAR ? "a number" : tstr(S, &sk->type));
        origin_note(S, F, sk, "the sinks");
        return NULL;
      }
      args4[3] = sk;
    }
    SemExpr *r = new_op(S, op, at, args4, se ? 4 : 3);
    r->type = q->type;
    r->type.dims[3] = v->type.dims[3];
    r->attr[0] = causal;
    r->attr[1] = window;
    r->nattr = 2;
    r->scalar = scale;
    return r;
  }
  case SOP_CROSS_ENTROPY: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *logits = tensor_arg(S, F, &c, 0), *targets = logits ? tensor_arg(S, F, &c, 1) : NULL;
    if (!logits || !targets || !require_float(S, F, logits, "cross_entropy's logits", at)) return NULL;
    if (sem_dtype_is_float(targets->type.dtype) || targets->kind == SE_SCALAR) {
      sema_error(S, at, "cross_entropy's targets are integer class ids; this is %s", tstr(S, &targets->type));
      origin_note(S, F, targets, "the targets");
      return NULL;
    }
    int ok = logits->type.rank == targets->type.rank + 1;
    for (int i = 0; ok && i < targets->type.rank; i++) ok = sym_equal(logits->type.dims[i], targets->type.dims[i]);
    if (!ok) {
      sema_error(S, at, "cross_entropy: logits %s do not fit targets %s (logits are [..., V] over targets [...])",
                 tstr(S, &logits->type), tstr(S, &targets->type));
      origin_note(S, F, logits, "the logits");
      origin_note(S, F, targets, "the targets");
      return NULL;
    }
    SemExpr *args[2] = {logits, targets};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type.dtype = DT_F32;
    r->type.rank = 0;
    return r;
  }
  case SOP_DROPOUT: {
    static const char *const keys[] = {"p"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    double p;
    if (!x || !require_float(S, F, x, fn, at) || !attr_float(S, F, &c, 1, "p", 0.0, &p)) return NULL;
    if (p < 0 || p >= 1) {
      sema_error(S, at, "dropout probability %g is outside [0, 1)", p);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->scalar = p;
    return r;
  }
  case SOP_TOPK_VALUES:
  case SOP_TOPK_INDICES: {
    static const char *const keys[] = {"k"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    const AstExpr *ke = arg_at(&c, 1, "k");
    int64_t k, v;
    if (!ke) {
      sema_error(S, at, "%s() needs k, the number of entries to keep", fn);
      return NULL;
    }
    if (!attr_int(S, F, &c, 1, "k", 0, &k)) return NULL;
    int r0 = x->type.rank;
    if (x->kind == SE_SCALAR || r0 < 1) {
      sema_error(S, at, "%s() needs a tensor [..., V]; this is %s", fn, x->kind == SE_SCALAR ? "a number" : tstr(S, &x->type));
      return NULL;
    }
    if (k < 1) {
      sema_error(S, ke->span, "%s's k must be at least 1, not %" PRId64, fn, k);
      return NULL;
    }
    if (!sym_is_const(x->type.dims[r0 - 1], &v)) {
      sema_error(S, at, "%s() selects along the last dimension, whose size must be known at compile time; %s has %s", fn,
                 tstr(S, &x->type), sym_str(S->arena, x->type.dims[r0 - 1]));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    if (k > v) {
      sema_error(S, ke->span, "%s's k = %" PRId64 " is larger than the last dimension of %s (%" PRId64 ")", fn, k,
                 tstr(S, &x->type), v);
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[r0 - 1] = sym_const(S->arena, k);
    if (op == SOP_TOPK_INDICES) r->type.dtype = DT_I32;
    r->attr[0] = k;
    r->nattr = 1;
    return r;
  }
  case SOP_TAKE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0), *idx = x ? tensor_arg(S, F, &c, 1) : NULL;
    if (!x || !idx || !require_float(S, F, x, fn, at)) return NULL;
    if (x->kind == SE_SCALAR || x->type.rank < 1) {
      sema_error(S, at, "take() needs a tensor [..., V]; this is a number");
      return NULL;
    }
    if (!require_indices(S, F, idx, "take", at)) return NULL;
    int ok = x->type.rank == idx->type.rank;
    for (int i = 0; ok && i + 1 < x->type.rank; i++) ok = sym_equal(x->type.dims[i], idx->type.dims[i]);
    if (!ok) {
      sema_error(S, at, "take: x %s does not fit indices %s (x is [..., V] and the indices [..., K], the same but for the last dimension)",
                 tstr(S, &x->type), tstr(S, &idx->type));
      origin_note(S, F, x, "x");
      origin_note(S, F, idx, "the indices");
      return NULL;
    }
    SemExpr *args[2] = {x, idx};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type = idx->type;
    r->type.dtype = x->type.dtype;
    return r;
  }
  case SOP_ONE_HOT: {
    static const char *const keys[] = {"n"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *idx = tensor_arg(S, F, &c, 0);
    if (!idx) return NULL;
    if (!require_indices(S, F, idx, "one_hot", at)) return NULL;
    const AstExpr *ne = arg_at(&c, 1, "n");
    int64_t n;
    if (!ne) {
      sema_error(S, at, "one_hot() needs n, the number of classes");
      return NULL;
    }
    if (!attr_int(S, F, &c, 1, "n", 0, &n)) return NULL;
    if (n < 1) {
      sema_error(S, ne->span, "one_hot's n must be at least 1, not %" PRId64, n);
      return NULL;
    }
    if (idx->type.rank + 1 > SEM_MAX_RANK) {
      sema_error(S, at, "too many dimensions");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &idx, 1);
    r->type = idx->type;
    r->type.dtype = DT_F32;
    r->type.dims[r->type.rank++] = sym_const(S->arena, n);
    r->attr[0] = n;
    r->nattr = 1;
    return r;
  }
  case SOP_MOE_DISPATCH: {
    static const char *const keys[] = {"experts", "capacity_factor", "drop", "groups", "group_top_k"};
    if (!check_keywords(S, &c, keys, 5)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0), *idx = x ? tensor_arg(S, F, &c, 1) : NULL;
    if (!x || !idx || !require_float(S, F, x, fn, at) || !require_indices(S, F, idx, fn, at)) return NULL;
    const AstExpr *ee = arg_at(&c, 2, "experts"), *fe = arg_at(&c, 3, "capacity_factor");
    int64_t E, T, K;
    double cf;
    int drop;
    if (!ee) {
      sema_error(S, at, "moe_dispatch() needs experts, the number of experts");
      return NULL;
    }
    int64_t groups, group_top_k;
    if (!attr_int(S, F, &c, 2, "experts", 0, &E) || !attr_float(S, F, &c, 3, "capacity_factor", 1.0, &cf) ||
        !attr_bool(S, F, &c, 4, "drop", 1, &drop) || !attr_int(S, F, &c, 5, "groups", 1, &groups) ||
        !attr_int(S, F, &c, 6, "group_top_k", 0, &group_top_k))
      return NULL;
    if (x->kind == SE_SCALAR || x->type.rank != 3 || idx->type.rank != 3 || !sym_equal(x->type.dims[0], idx->type.dims[0]) ||
        !sym_equal(x->type.dims[1], idx->type.dims[1])) {
      sema_error(S, at, "moe_dispatch: x %s does not fit the chosen experts %s (x is [B, T, C] and the choices [B, T, K])",
                 x->kind == SE_SCALAR ? "(a number)" : tstr(S, &x->type), tstr(S, &idx->type));
      origin_note(S, F, x, "x");
      origin_note(S, F, idx, "the choices");
      return NULL;
    }
    if (!sym_is_const(x->type.dims[1], &T) || !sym_is_const(idx->type.dims[2], &K)) {
      sema_error(S, at, "moe_dispatch: the tokens per sequence and the choices per token must be known at compile time; x is %s, the choices %s",
                 tstr(S, &x->type), tstr(S, &idx->type));
      return NULL;
    }
    if (E < 1) {
      sema_error(S, ee->span, "moe_dispatch's experts must be at least 1, not %" PRId64, E);
      return NULL;
    }
    if (K > E) {
      sema_error(S, at, "moe_dispatch: each token chooses %" PRId64 " experts of only %" PRId64, K, E);
      origin_note(S, F, idx, "the choices");
      return NULL;
    }
    if (!(cf > 0) || !isfinite(cf)) {
      sema_error(S, fe ? fe->span : at, "moe_dispatch's capacity_factor must be a positive number, not %g", cf);
      return NULL;
    }
    /* groups, group_top_k: what the routing promises (node-limited routing: a token's
     * choices within group_top_k of `groups` consecutive blocks of the experts), for
     * the planner's exchange; the dispatch itself does not depend on it */
    if (groups < 1 || E % groups) {
      const AstExpr *ge = arg_at(&c, 5, "groups");
      sema_error(S, ge ? ge->span : at, "moe_dispatch's groups (%" PRId64 ") must divide its %" PRId64 " experts", groups, E);
      return NULL;
    }
    if (group_top_k == 0) group_top_k = groups;
    if (group_top_k < 1 || group_top_k > groups || K > group_top_k * (E / groups)) {
      const AstExpr *ke = arg_at(&c, 6, "group_top_k");
      if (group_top_k < 1 || group_top_k > groups)
        sema_error(S, ke ? ke->span : at, "moe_dispatch's group_top_k = %" PRId64 " is not between 1 and groups (%" PRId64 ")",
                   group_top_k, groups);
      else
        sema_error(S, ke ? ke->span : at,
                   "moe_dispatch's group_top_k = %" PRId64 " blocks of %" PRId64 " experts cannot hold a token's %" PRId64 " choices",
                   group_top_k, E / groups, K);
      return NULL;
    }
    if (!drop && cf < 1) {
      sema_error(S, fe ? fe->span : at,
                 "capacity_factor = %g is below 1, which only dropping tokens can honour, but drop = false", cf);
      diag_hint(S->diag, "without dropping, every expert has room for all T tokens and capacity_factor is the expected load of "
                         "the busiest expert over an even share (>= 1, what the planner prices); allow dropping with drop = true");
      return NULL;
    }
    /* slots per expert and sequence: an even share T K / E times the factor, rounded up;
     * without dropping, room for every token (an expert is chosen at most once per token) */
    double even = (double)T * (double)K / (double)E;
    int64_t cap = drop ? (int64_t)ceil(cf * even - 1e-9) : T;
    if (cap < 1) cap = 1;
    if (cap > T) cap = T;
    SemExpr *args[2] = {x, idx};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type = x->type;
    r->type.rank = 4;
    r->type.dims[1] = sym_const(S->arena, E);
    r->type.dims[2] = sym_const(S->arena, cap);
    r->type.dims[3] = x->type.dims[2];
    r->attr[0] = E;
    r->attr[1] = cap;
    r->attr[2] = drop ? cap : (int64_t)ceil(cf * even - 1e-9); /* the load the planner prices */
    if (r->attr[2] > T) r->attr[2] = T;
    r->attr[3] = groups;
    r->attr[4] = group_top_k;
    r->nattr = 5;
    return r;
  }
  case SOP_MOE_COMBINE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *y = tensor_arg(S, F, &c, 0), *idx = y ? tensor_arg(S, F, &c, 1) : NULL, *w = idx ? tensor_arg(S, F, &c, 2) : NULL;
    if (!y || !idx || !w || !require_float(S, F, y, fn, at) || !require_indices(S, F, idx, fn, at) ||
        !require_float(S, F, w, "moe_combine's gates", at))
      return NULL;
    int ok = y->kind != SE_SCALAR && w->kind != SE_SCALAR && y->type.rank == 4 && idx->type.rank == 3 && w->type.rank == 3 &&
             sym_equal(y->type.dims[0], idx->type.dims[0]);
    for (int i = 0; ok && i < 3; i++) ok = sym_equal(idx->type.dims[i], w->type.dims[i]);
    if (!ok) {
      sema_error(S, at, "moe_combine: the expert outputs %s, choices %s and gates %s do not fit (they are [B, E, cap, C], [B, T, K] and [B, T, K])",
                 y->kind == SE_SCALAR ? "(a number)" : tstr(S, &y->type), tstr(S, &idx->type),
                 w->kind == SE_SCALAR ? "(a number)" : tstr(S, &w->type));
      origin_note(S, F, y, "the expert outputs");
      origin_note(S, F, idx, "the choices");
      origin_note(S, F, w, "the gates");
      return NULL;
    }
    SemExpr *args[3] = {y, idx, w};
    SemExpr *r = new_op(S, op, at, args, 3);
    r->type = idx->type;
    r->type.dtype = y->type.dtype;
    r->type.dims[2] = y->type.dims[3];
    return r;
  }
  case SOP_AUX_LOSS: {
    static const char *const keys[] = {"weight"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0), *v = x ? tensor_arg(S, F, &c, 1) : NULL;
    double weight;
    if (!x || !v || !require_float(S, F, x, fn, at) || !require_float(S, F, v, "with_aux_loss's loss", at)) return NULL;
    if (!arg_at(&c, 2, "weight")) {
      sema_error(S, at, "with_aux_loss() needs weight, the loss's coefficient");
      return NULL;
    }
    if (!attr_float(S, F, &c, 2, "weight", 0.0, &weight)) return NULL;
    if (v->kind == SE_SCALAR || v->type.rank != 0) {
      sema_error(S, at, "with_aux_loss's loss must be a scalar tensor (a mean over the tokens); this is %s",
                 v->kind == SE_SCALAR ? "a number" : tstr(S, &v->type));
      origin_note(S, F, v, "the loss");
      return NULL;
    }
    if (!(weight >= 0) || !isfinite(weight)) {
      sema_error(S, at, "with_aux_loss's weight must be a finite number >= 0, not %g", weight);
      return NULL;
    }
    SemExpr *args[2] = {x, v};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type = x->type;
    r->scalar = weight;
    return r;
  }
  default:
    sema_error(S, at, "%s() cannot be called", fn);
    return NULL;
  }
}


static SemExpr *check_child_call(Sema *S, Fwd *F, const SemChild *child, int index, const AstExpr *call) {
  int n = call->u.call.nargs;
  SemExpr **args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    if (call->u.call.args[i].name) {
      sema_error(S, call->u.call.args[i].name_span, "sub-layer calls take tensors by position; '%s =' belongs where the layer is instantiated",
                 call->u.call.args[i].name);
      return NULL;
    }
    if (!(args[i] = check_expr(S, F, call->u.call.args[i].value))) return NULL;
    if (args[i]->is_tuple) {
      sema_error(S, call->u.call.args[i].value->span, "this is a tuple of %d tensors; unpack it first: a, b = ...", args[i]->ntuple);
      return NULL;
    }
  }
  if (child->repeat > 1 && n != 1) {
    sema_error(S, call->span, "'%s' repeats %s %" PRId64 " times, so it takes exactly one tensor", child->name,
               child->layer->decl->name.name, child->repeat);
    return NULL;
  }
  int64_t ncopies = child->copies ? child->repeat : 1;
  SemFunc **fns = arena_alloc(S->arena, sizeof(SemFunc *) * (size_t)ncopies), *fn = NULL;
  for (int64_t k = 0; k < ncopies; k++) {
    SemLayer *layer = child->copies ? child->copies[k] : child->layer;
    fn = fns[k] = sema_check_forward(S, layer, args, n, call->span);
    if (!fn) return NULL;
    if (fn->result->is_tuple) {
      sema_error(S, call->span, "a layer returns one tensor");
      return NULL;
    }
    if (child->repeat > 1 && !type_equal(&fn->result->type, &args[0]->type)) {
      sema_error(S, call->span, "'%s' repeats %s, but one block maps %s to %s; repeated blocks must keep the shape",
                 child->name, layer->display, tstr(S, &args[0]->type), tstr(S, &fn->result->type));
      diag_note(S->diag, child->span, "repeated here");
      return NULL;
    }
  }
  SemExpr *r = new_expr(S, SE_CALL, call->span);
  r->index = index;
  r->callee = fns[0];
  r->callees = child->copies ? fns : NULL;
  r->args = args;
  r->nargs = n;
  r->type = fn->result->type;
  return r;
}

/* Extern calls: the declared tensor types bind the dimension names. */
static SemExpr *check_extern_call(Sema *S, Fwd *F, const AstDecl *ext, const AstExpr *call) {
  if (!sema_check_param_types(S, ext)) return NULL;
  int n = call->u.call.nargs;
  if (n != ext->nparams) {
    sema_error(S, call->span, "%s takes %d tensor%s, not %d", ext->name.name, ext->nparams, ext->nparams == 1 ? "" : "s", n);
    diag_note(S->diag, ext->span, "declared here");
    return NULL;
  }
  SemExpr **args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(n + 1));
  Binding *dims = NULL;
  PtrVec dimvals = {0, 0, 0};
  for (int i = 0; i < n; i++) {
    if (!(args[i] = check_expr(S, F, call->u.call.args[i].value))) return NULL;
    const AstType *t = ext->params[i].tensor_type;
    DType dt;
    if (!sema_parse_dtype(S, t, &dt)) return NULL;
    int ok = dt == args[i]->type.dtype && t->ndims == args[i]->type.rank;
    for (int k = 0; ok && k < t->ndims; k++) {
      const AstExpr *de = t->dims[k];
      SymDim *actual = args[i]->type.dims[k];
      if (de->kind == EX_NAME) {
        Binding *b = sema_lookup(dims, de->u.sval);
        if (!b) {
          b = sema_bind(S, &dims, de->u.sval, B_TENSOR, de->span);
          b->index = dimvals.len;
          ptrvec_push(S->arena, &dimvals, actual);
        } else if (!sym_equal(dimvals.items[b->index], actual)) {
          ok = 0;
        }
      } else {
        int64_t d;
        if (!sema_eval_int(S, NULL, de, "an extern dimension", &d)) return NULL;
        ok = dim_is(actual, d);
      }
    }
    if (!ok) {
      sema_error(S, call->u.call.args[i].value->span, "argument %d of %s is %s, which does not fit '%s: %s'", i + 1,
                 ext->name.name, tstr(S, &args[i]->type), ext->params[i].name.name, ast_type_text(S, t));
      if (i > 0) diag_hint(S->diag, "a dimension name stands for the same size in every argument and the result");
      diag_note(S->diag, t->span, "declared here");
      return NULL;
    }
  }
  SemExpr *r = new_expr(S, SE_EXTERN, call->span);
  r->ext = ext;
  r->args = args;
  r->nargs = n;
  if (!sema_parse_dtype(S, ext->result, &r->type.dtype)) return NULL;
  r->type.rank = ext->result->ndims;
  for (int k = 0; k < ext->result->ndims; k++) {
    const AstExpr *de = ext->result->dims[k];
    if (de->kind == EX_NAME) {
      Binding *b = sema_lookup(dims, de->u.sval);
      if (!b) {
        sema_error(S, de->span, "result dimension '%s' is not a dimension of any argument", de->u.sval);
        return NULL;
      }
      r->type.dims[k] = dimvals.items[b->index];
    } else {
      int64_t d;
      if (!sema_eval_int(S, NULL, de, "an extern dimension", &d)) return NULL;
      r->type.dims[k] = sym_const(S->arena, d);
    }
  }
  return r;
}

static SemExpr *check_call(Sema *S, Fwd *F, const AstExpr *e) {
  const AstExpr *callee = e->u.call.callee;
  if (callee->kind == EX_CALL && callee->u.call.callee->kind == EX_NAME &&
      sema_find_decl(S, callee->u.call.callee->u.sval, (1 << DECL_LAYER) | (1 << DECL_MODEL))) {
    const char *lname = callee->u.call.callee->u.sval;
    sema_error(S, callee->span, "layers are instantiated in the body, next to the params, not in forward");
    diag_hint(S->diag, "write `name = %s(...)` in the body, then call name(x) here", lname);
    return NULL;
  }
  if (callee->kind != EX_NAME) {
    sema_error(S, callee->span, "only sub-layers, builtins and externs can be called");
    return NULL;
  }
  const char *name = callee->u.sval;
  Binding *b = sema_lookup(F->env, name);
  if (b && b->kind == B_CHILD)
    return check_child_call(S, F, &F->box->l.children[b->index], b->index, e);
  if (b && b->kind == B_VALUE) {
    if (b->value.kind == VAL_NONE) return NULL; /* reported where it failed */
    const char *w = val_as_word(&b->value);
    int op = w ? sema_find_builtin(w) : -1;
    if (op >= 0) return check_builtin(S, F, (SemOp)op, e, w);
    sema_error(S, callee->span, "'%s' is %s, which cannot be called", name, val_str(S->arena, &b->value));
    if (w) diag_hint(S->diag, "an activation parameter holds a builtin name such as gelu, relu or silu");
    return NULL;
  }
  if (b) {
    sema_error(S, callee->span, "'%s' is a tensor, not a function", name);
    return NULL;
  }
  int op = sema_find_builtin(name);
  if (op >= 0) return check_builtin(S, F, (SemOp)op, e, name);
  const AstDecl *d = sema_find_decl(S, name, DECL_CALLABLE);
  if (d && d->kind == DECL_EXTERN) return check_extern_call(S, F, d, e);
  if (d) {
    sema_error(S, callee->span, "%s '%s' must be instantiated in the body before forward calls it", ast_decl_kind_name(d->kind), name);
    diag_hint(S->diag, "write `name = %s(...)` next to the params, then call name(x)", name);
    return NULL;
  }
  sema_error(S, callee->span, "unknown function '%s'", name);
  const char *close = sema_suggest(S, F->env, name, 1);
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
  return NULL;
}

static SemExpr *check_index(Sema *S, Fwd *F, const AstExpr *e) {
  SemExpr *x = check_expr(S, F, e->u.index.obj);
  if (!x) return NULL;
  int n = e->u.index.nitems;
  if (n > x->type.rank) {
    sema_error(S, e->span, "%d indices for %s", n, tstr(S, &x->type));
    return NULL;
  }
  SemExpr *r = new_op(S, SOP_SLICE, e->span, &x, 1);
  r->type.dtype = x->type.dtype;
  int out = 0;
  for (int i = 0; i < x->type.rank; i++) {
    SymDim *dim = x->type.dims[i];
    const AstExpr *it = i < n ? e->u.index.items[i] : NULL;
    int64_t size = -1;
    sym_is_const(dim, &size);
    int64_t lo = 0, hi = size;
    int drop = 0;
    if (it && it->kind == EX_SLICE) {
      if (it->u.slice.lo && !sema_eval_int(S, F->env, it->u.slice.lo, "a slice bound", &lo)) return NULL;
      if (it->u.slice.hi && !sema_eval_int(S, F->env, it->u.slice.hi, "a slice bound", &hi)) return NULL;
      if ((it->u.slice.lo || it->u.slice.hi) && size < 0) {
        sema_error(S, it->span, "slicing dimension %d needs its size known at compile time; it is %s", i,
                   sym_str(S->arena, dim));
        return NULL;
      }
    } else if (it) {
      if (!sema_eval_int(S, F->env, it, "an index", &lo)) return NULL;
      if (size < 0) {
        sema_error(S, it->span, "indexing dimension %d needs its size known at compile time; it is %s", i, sym_str(S->arena, dim));
        return NULL;
      }
      if (lo < 0) lo += size;
      hi = lo + 1;
      drop = 1;
    }
    if (size >= 0) {
      if (lo < 0) lo += size;
      if (hi < 0) hi += size;
      if (lo < 0 || hi > size || lo >= hi) {
        sema_error(S, it ? it->span : e->span, "slice %" PRId64 ":%" PRId64 " is out of range for dimension %d of size %" PRId64, lo, hi, i, size);
        return NULL;
      }
    }
    r->attr[i] = lo;
    r->attr[SEM_MAX_RANK + i] = size >= 0 ? hi : -1;
    r->attr[2 * SEM_MAX_RANK + i] = drop;
    if (!drop) r->type.dims[out++] = size >= 0 ? sym_const(S->arena, hi - lo) : dim;
  }
  r->type.rank = out;
  r->nattr = 3 * SEM_MAX_RANK;
  return r;
}

static SemExpr *check_expr(Sema *S, Fwd *F, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: return scalar_expr(S, (double)e->u.ival, e->span);
  case EX_FLOAT: return scalar_expr(S, e->u.fval.value, e->span);
  case EX_NAME: {
    Binding *b = sema_lookup(F->env, e->u.sval);
    if (!b) {
      if (sema_find_builtin(e->u.sval) >= 0) {
        sema_error(S, e->span, "'%s' is a function; call it: %s(x)", e->u.sval, e->u.sval);
        return NULL;
      }
      sema_error(S, e->span, "unknown name '%s'", e->u.sval);
      const char *close = sema_suggest(S, F->env, e->u.sval, 0);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return NULL;
    }
    switch (b->kind) {
    case B_TENSOR: return b->expr;
    case B_PARAM: {
      SemExpr *x = new_expr(S, SE_PARAM, e->span);
      x->index = b->index;
      x->type = ((SemParam *)F->box->params.items[b->index])->type;
      return x;
    }
    case B_CHILD:
      sema_error(S, e->span, "'%s' is a sub-layer; call it: %s(x)", e->u.sval, e->u.sval);
      return NULL;
    case B_VALUE: {
      double v;
      if (b->value.kind == VAL_NONE) return NULL; /* its error was reported */
      if (b->value.kind == VAL_BOOL || !val_as_float(&b->value, &v)) {
        sema_error(S, e->span, "'%s' is %s, not a tensor or a number", e->u.sval, val_str(S->arena, &b->value));
        return NULL;
      }
      return scalar_expr(S, v, e->span);
    }
    }
    return NULL;
  }
  case EX_UNARY: {
    if (e->u.op.op == OP_NOT) {
      sema_error(S, e->span, "'not' works on compile-time bools, not tensors");
      return NULL;
    }
    SemExpr *x = check_expr(S, F, e->u.op.a);
    if (!x) return NULL;
    if (x->kind == SE_SCALAR) return scalar_expr(S, -x->scalar, e->span);
    SemExpr *r = new_op(S, SOP_NEG, e->span, &x, 1);
    r->type = x->type;
    return r;
  }
  case EX_BINARY: {
    AstOp op = e->u.op.op;
    if (op == OP_POW) {
      SemExpr *x = check_expr(S, F, e->u.op.a);
      if (!x) return NULL;
      Value p = sema_eval_const(S, F->env, e->u.op.b);
      double pv;
      if (p.kind == VAL_NONE) return NULL;
      if (!val_as_float(&p, &pv)) {
        sema_error(S, e->u.op.b->span, "the exponent must be a number known at compile time");
        return NULL;
      }
      if (x->kind == SE_SCALAR) return scalar_expr(S, pow(x->scalar, pv), e->span);
      if (!require_float(S, F, x, "'**'", e->u.op.op_span)) return NULL;
      SemExpr *r = new_op(S, SOP_POW, e->span, &x, 1);
      r->type = x->type;
      r->scalar = pv;
      return r;
    }
    if (op != OP_ADD && op != OP_SUB && op != OP_MUL && op != OP_DIV && op != OP_MATMUL) {
      sema_error(S, e->u.op.op_span, "'%s' is not a tensor operation; comparisons and logic are compile-time only",
                 ast_op_text(op));
      return NULL;
    }
    SemExpr *a = check_expr(S, F, e->u.op.a);
    SemExpr *b = a ? check_expr(S, F, e->u.op.b) : NULL;
    if (!a || !b) return NULL;
    if (a->is_tuple || b->is_tuple) {
      sema_error(S, (a->is_tuple ? a : b)->span, "this is a tuple of tensors; unpack it first: a, b = ...");
      return NULL;
    }
    if (op == OP_MATMUL) return matmul_op(S, F, a, b, e->u.op.op_span);
    if (a->kind == SE_SCALAR && b->kind == SE_SCALAR) {
      double x = a->scalar, y = b->scalar;
      if (op == OP_DIV && y == 0) {
        sema_error(S, e->u.op.b->span, "division by zero");
        return NULL;
      }
      return scalar_expr(S, op == OP_ADD ? x + y : op == OP_SUB ? x - y : op == OP_MUL ? x * y : x / y, e->span);
    }
    SemOp sop = op == OP_ADD ? SOP_ADD : op == OP_SUB ? SOP_SUB : op == OP_MUL ? SOP_MUL : SOP_DIV;
    SemExpr *r = broadcast_op(S, F, sop, a, b, e->u.op.op_span, ast_op_text(op));
    if (r) r->span = e->span;
    return r;
  }
  case EX_CALL: return check_call(S, F, e);
  case EX_MEMBER: {
    const AstExpr *obj = e->u.member.obj;
    Binding *b = obj->kind == EX_NAME ? sema_lookup(F->env, obj->u.sval) : NULL;
    if (!b || b->kind != B_CHILD) {
      sema_error(S, obj->span, "'.%s' reads a parameter of a sub-layer, and this is not a sub-layer", e->u.member.name);
      return NULL;
    }
    const SemChild *child = &F->box->l.children[b->index];
    if (child->repeat > 1) {
      sema_error(S, e->span, "'%s' is repeated %" PRId64 " times, so '%s.%s' has no single value", child->name,
                 child->repeat, child->name, e->u.member.name);
      return NULL;
    }
    const SemLayer *cl = child->layer;
    for (int i = 0; i < cl->nparams; i++)
      if (!strcmp(cl->params[i].name, e->u.member.name)) {
        SemExpr *x = new_expr(S, SE_CHILD_PARAM, e->span);
        x->index = b->index;
        x->index2 = i;
        x->type = cl->params[i].type;
        return x;
      }
    sema_error(S, e->u.member.name_span, "%s has no parameter '%s'", cl->display, e->u.member.name);
    const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(cl->nparams + 1));
    for (int i = 0; i < cl->nparams; i++) names[i] = cl->params[i].name;
    const char *close = diag_closest(e->u.member.name, names, cl->nparams);
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    return NULL;
  }
  case EX_INDEX: return check_index(S, F, e);
  case EX_BOOL:
  case EX_STRING:
    sema_error(S, e->span, "a %s is not a tensor", e->kind == EX_BOOL ? "bool" : "string");
    return NULL;
  case EX_TUPLE:
  case EX_LIST:
    sema_error(S, e->span, "lists and tuples are not tensors (concat([a, b]) joins tensors)");
    return NULL;
  case EX_SLICE:
  case EX_REPEAT:
    sema_error(S, e->span, "this belongs in the body of a layer, not in forward");
    return NULL;
  }
  return NULL;
}

/* True when `e` needs no tensor: a constant such as 1.0 / sqrt(D). */
static int is_const_expr(Binding *env, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: case EX_FLOAT: case EX_BOOL: case EX_STRING: return 1;
  case EX_NAME: {
    Binding *b = sema_lookup(env, e->u.sval);
    return b ? b->kind == B_VALUE : sema_find_builtin(e->u.sval) < 0;
  }
  case EX_UNARY: return is_const_expr(env, e->u.op.a);
  case EX_BINARY: return e->u.op.op != OP_MATMUL && is_const_expr(env, e->u.op.a) && is_const_expr(env, e->u.op.b);
  case EX_TUPLE: case EX_LIST:
    for (int i = 0; i < e->u.list.nitems; i++)
      if (!is_const_expr(env, e->u.list.items[i])) return 0;
    return 1;
  case EX_CALL: {
    static const char *const scalar_fns[] = {"sqrt", "exp", "log", "abs", "int", "float", "min", "max"};
    if (e->u.call.callee->kind != EX_NAME || sema_lookup(env, e->u.call.callee->u.sval)) return 0;
    int known = 0;
    for (int k = 0; k < 8; k++) known |= !strcmp(scalar_fns[k], e->u.call.callee->u.sval);
    if (!known) return 0;
    for (int i = 0; i < e->u.call.nargs; i++)
      if (!is_const_expr(env, e->u.call.args[i].value)) return 0;
    return 1;
  }
  default: return 0;
  }
}

static int check_stmts(Sema *S, Fwd *F, const AstBlock *body, SemExpr **result, int is_model, int top);

static int check_assign(Sema *S, Fwd *F, const AstStmt *st) {
  const AstExpr *v = st->u.assign.value;
  int n = st->u.assign.nnames;
  for (int i = 0; i < n; i++) {
    Binding *prev = sema_lookup(F->env, st->u.assign.names[i].name);
    if (prev && (prev->kind == B_PARAM || prev->kind == B_CHILD)) {
      sema_error(S, st->u.assign.names[i].span, "'%s' is a %s of %s; choose another name",
                 prev->name, prev->kind == B_PARAM ? "parameter" : "sub-layer", F->box->l.decl->name.name);
      diag_note(S->diag, prev->span, "declared here");
      return 0;
    }
  }
  if (v->kind == EX_REPEAT || sema_is_layer_instantiation(S, v)) {
    if (v->kind == EX_REPEAT || sema_find_decl(S, v->u.call.callee->u.sval, (1 << DECL_LAYER) | (1 << DECL_MODEL))) {
      sema_error(S, v->span, "layers are instantiated in the body, next to the params, not in forward");
      return 0;
    }
  }
  if (n == 1 && is_const_expr(F->env, v)) {
    Value c = sema_eval_const(S, F->env, v);
    if (c.kind == VAL_NONE) return 0;
    Binding *b = sema_bind(S, &F->env, st->u.assign.names[0].name, B_VALUE, st->u.assign.names[0].span);
    b->value = c;
    return 1;
  }
  SemExpr *x = check_expr(S, F, v);
  if (!x) {
    /* Bind the names to "nothing" so their uses stay quiet: one error, not a cascade. */
    for (int i = 0; i < n; i++) {
      Binding *b = sema_bind(S, &F->env, st->u.assign.names[i].name, B_VALUE, st->u.assign.names[i].span);
      b->value = sema_none_value(st->u.assign.names[i].span);
    }
    return 0;
  }
  if (n == 1) {
    if (x->is_tuple) {
      sema_error(S, st->u.assign.names[0].span, "this gives %d tensors; name each: a, b = ...", x->ntuple);
      return 0;
    }
    Binding *b = sema_bind(S, &F->env, st->u.assign.names[0].name, B_TENSOR, st->u.assign.names[0].span);
    b->expr = x;
    return 1;
  }
  if (!x->is_tuple || x->ntuple != n) {
    sema_error(S, st->span, "%d names, but the value is %s", n,
               x->is_tuple ? arena_printf(S->arena, "%d tensors", x->ntuple) : "one tensor");
    return 0;
  }
  for (int i = 0; i < n; i++) {
    SemExpr *g = new_expr(S, SE_TUPLE_GET, st->u.assign.names[i].span);
    g->index = i;
    g->type = x->type;
    g->args = arena_alloc(S->arena, sizeof(SemExpr *));
    g->args[0] = x;
    g->nargs = 1;
    Binding *b = sema_bind(S, &F->env, st->u.assign.names[i].name, B_TENSOR, st->u.assign.names[i].span);
    b->expr = g;
  }
  return 1;
}

static int check_stmts(Sema *S, Fwd *F, const AstBlock *body, SemExpr **result, int is_model, int top) {
  int ok = 1;
  for (int i = 0; i < body->n && !diag_saturated(S->diag); i++) {
    const AstStmt *st = body->items[i];
    switch (st->kind) {
    case ST_ASSIGN:
      ok &= check_assign(S, F, st);
      break;
    case ST_RETURN: {
      if (is_model) {
        sema_error(S, st->span, "a model's forward does not return; it assigns 'loss'");
        ok = 0;
        break;
      }
      if (*result) {
        sema_error(S, st->span, "forward returns twice");
        ok = 0;
        break;
      }
      if (!top || i != body->n - 1) {
        sema_error(S, st->span, "'return' must be the last statement of forward");
        ok = 0;
        break;
      }
      SemExpr *x = check_expr(S, F, st->u.ret.value);
      if (!x) {
        ok = 0;
        break;
      }
      if (x->is_tuple || x->kind == SE_SCALAR) {
        sema_error(S, st->u.ret.value->span, "forward returns one tensor");
        ok = 0;
        break;
      }
      *result = x;
      break;
    }
    case ST_IF: {
      Value c = sema_eval_const(S, F->env, st->u.if_.cond);
      if (c.kind == VAL_NONE) {
        ok = 0;
        break;
      }
      if (c.kind != VAL_BOOL) {
        sema_error(S, st->u.if_.cond->span, "the condition must be a bool known at compile time, not %s", val_str(S->arena, &c));
        ok = 0;
        break;
      }
      ok &= check_stmts(S, F, c.b ? &st->u.if_.then : &st->u.if_.otherwise, result, is_model, 0);
      break;
    }
    default:
      sema_error(S, st->span, "this declaration belongs in the body, not in forward");
      ok = 0;
      break;
    }
  }
  return ok;
}

SemFunc *sema_check_forward(Sema *S, SemLayer *layer, SemExpr **args, int nargs, Span site) {
  LayerBox *box = (LayerBox *)layer;
  for (SemFunc *f = layer->funcs; f; f = f->next) {
    if (f->nargs != nargs) continue;
    int same = 1;
    for (int i = 0; i < nargs && same; i++) same = type_equal(&f->arg_types[i], &args[i]->type);
    if (same) return f->result ? f : NULL; /* a failed check is reported once */
  }
  const AstStmt *fw = layer->forward;
  int is_model = layer->decl->kind == DECL_MODEL;
  if (!is_model && fw->u.forward.nargs != nargs) {
    sema_error(S, site, "%s's forward takes %d tensor%s, not %d", layer->decl->name.name, fw->u.forward.nargs,
               fw->u.forward.nargs == 1 ? "" : "s", nargs);
    diag_note(S->diag, fw->span, "forward declared here");
    return NULL;
  }
  if (S->depth >= SEMA_MAX_DEPTH) {
    sema_error(S, site, "layers nested deeper than %d levels", SEMA_MAX_DEPTH);
    return NULL;
  }
  SemFunc *fn = arena_alloc(S->arena, sizeof *fn);
  fn->layer = layer;
  fn->nargs = nargs;
  fn->arg_types = arena_alloc(S->arena, sizeof(TensorType) * (size_t)(nargs + 1));
  Fwd F = {box, box->env};
  for (int i = 0; i < nargs; i++) {
    fn->arg_types[i] = args[i]->type;
    SemExpr *a = new_expr(S, SE_ARG, fw->u.forward.args[i].span);
    a->index = i;
    a->type = args[i]->type;
    Binding *b = sema_bind(S, &F.env, fw->u.forward.args[i].name, B_TENSOR, fw->u.forward.args[i].span);
    b->expr = a;
  }
  Frame fr = {layer->display, site, layer->decl, S->frame, 1};
  S->frame = &fr;
  S->depth++;
  SemExpr *result = NULL;
  int ok = check_stmts(S, &F, &fw->u.forward.body, &result, is_model, 1);
  S->frame = fr.up;
  S->depth--;
  /* Remember the argument types even when the check failed (result NULL). */
  fn->next = layer->funcs;
  layer->funcs = fn;
  if (!ok) return NULL;
  if (is_model) {
    Binding *loss = sema_lookup(F.env, "loss");
    if (!loss || loss->kind != B_TENSOR) {
      sema_error(S, fw->span, "model %s's forward never assigns 'loss'", layer->decl->name.name);
      diag_hint(S->diag, "end forward with loss = cross_entropy(logits, targets)");
      return NULL;
    }
    if (loss->expr->type.rank != 0) {
      sema_error(S, loss->span, "'loss' must be a scalar; it is %s", tstr(S, &loss->expr->type));
      diag_hint(S->diag, "reduce it, e.g. mean(x) or cross_entropy(logits, targets)");
      return NULL;
    }
    result = loss->expr;
  } else if (!result) {
    sema_error(S, fw->span, "%s's forward does not return a tensor", layer->decl->name.name);
    return NULL;
  }
  fn->result = result;
  return fn;
}
