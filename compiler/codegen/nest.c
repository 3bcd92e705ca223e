/* nest.c - building a kernel's loop nest (nest.h). */
#include "nest.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xalloc.h"

typedef NestAff Aff;
typedef NestX X;
typedef NestStore Store;
typedef NestXKind XKind;

static const IrNode *nd(const NestKernel *k, int id) { return &k->g->nodes[id]; }
static int in_kernel(const NestKernel *k, int id) { return k->fg->kernel_of[id] == k->kp; }

int nest_fail(const NestKernel *k, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  k->fail(k->be, msg);
  return -1;
}

int nest_in_kernel(const NestKernel *k, int id) { return in_kernel(k, id); }

int nest_is_index_map(IrOp op) {
  return op == IR_RESHAPE || op == IR_TRANSPOSE || op == IR_SLICE || op == IR_EXPAND || op == IR_REPEAT_KV;
}

void nest_row_strides(int rank, const int64_t *dims, int64_t *s) {
  int64_t acc = 1;
  for (int i = rank - 1; i >= 0; i--) {
    s[i] = acc;
    acc *= dims[i];
  }
}

Aff nest_aff_const(int64_t c) {
  Aff a;
  memset(&a, 0, sizeof a);
  a.c = c;
  a.dax = -1;
  return a;
}

Aff nest_aff_axis(int j) {
  Aff a = nest_aff_const(0);
  a.coef[j] = 1;
  return a;
}

/* a + s * b; 0 when both have a division term on different axes. */
int nest_aff_addmul(Aff *a, const Aff *b, int64_t s) {
  a->c += s * b->c;
  for (int j = 0; j < IR_MAX_RANK; j++) a->coef[j] += s * b->coef[j];
  if (b->dax >= 0 && b->dcoef) {
    if (a->dax >= 0 && a->dcoef && (a->dax != b->dax || a->dq != b->dq)) return 0;
    a->dax = b->dax;
    a->dq = b->dq;
    a->dcoef += s * b->dcoef;
  }
  return 1;
}



void nest_init(Nest *N, const NestKernel *k, int rank, const int64_t *dims, int rlo, int rhi, int glo, int ghi) {
  memset(N, 0, sizeof *N);
  N->src = k;
  N->R = rank;
  memcpy(N->D, dims, sizeof(int64_t) * (size_t)rank);
  N->rlo = rlo;
  N->rhi = rhi;
  N->glo = glo;
  N->ghi = ghi;
  N->node_x = xalloc_calloc((size_t)k->g->nnodes, sizeof(int));
  for (int i = 0; i < k->g->nnodes; i++) N->node_x[i] = -1;
}

void nest_free(Nest *N) {
  free(N->x);
  free(N->st);
  free(N->node_x);
}

int nest_in_group(const Nest *N, int j) { return j >= N->glo && j < N->ghi && N->D[j] > 1; }

int nest_aff_full(const Nest *N, const Aff *a) {
  for (int j = 0; j < N->R; j++)
    if (a->coef[j] && nest_in_group(N, j)) return 1;
  return a->dax >= 0 && a->dcoef && nest_in_group(N, a->dax);
}

int nest_new_x(Nest *N, XKind kind) {
  if (N->nx == N->capx) {
    N->capx = N->capx ? N->capx * 2 : 32;
    N->x = xalloc_realloc(N->x, sizeof(X) * (size_t)N->capx);
  }
  X *x = &N->x[N->nx];
  memset(x, 0, sizeof *x);
  x->kind = kind;
  x->a = x->b = -1;
  x->off = nest_aff_const(0);
  x->vsweep = -1;
  return N->nx++;
}

int nest_x_const(Nest *N, double v) {
  int i = nest_new_x(N, X_CONST);
  N->x[i].p = v;
  return i;
}

int nest_x_op(Nest *N, XKind kind, IrOp op, double p, int a, int b) {
  int i = nest_new_x(N, kind);
  X *x = &N->x[i];
  x->op = op;
  x->p = p;
  x->a = a;
  x->b = b;
  x->full = (a >= 0 && N->x[a].full) || (b >= 0 && N->x[b].full);
  int la = a >= 0 ? N->x[a].level : 0, lb = b >= 0 ? N->x[b].level : 0;
  x->level = la > lb ? la : lb;
  return i;
}

int nest_x_red(Nest *N, int child, int redmax, int64_t div) {
  int i = nest_new_x(N, X_RED);
  X *x = &N->x[i];
  x->a = child;
  x->redmax = redmax;
  x->div = div;
  x->full = 0;
  x->level = N->x[child].level + 1;
  return i;
}

static int aff_same(const Aff *a, const Aff *b) {
  if (a->c != b->c || a->dax != b->dax || (a->dax >= 0 && (a->dq != b->dq || a->dcoef != b->dcoef))) return 0;
  for (int j = 0; j < IR_MAX_RANK; j++)
    if (a->coef[j] != b->coef[j]) return 0;
  return 1;
}

/* A read of value mem at offset off; a second read of the same element is
 * the first's value (two views of one input, as fusion rule 9 joins kernels
 * that read it: loaded once, one register). */
int nest_x_load(Nest *N, int mem, DType dt, const Aff *off) {
  for (int j = 0; j < N->nx; j++)
    if (N->x[j].kind == X_LOAD && N->x[j].mem == mem && N->x[j].dt == dt && aff_same(&N->x[j].off, off)) return j;
  int i = nest_new_x(N, X_LOAD);
  X *x = &N->x[i];
  x->mem = mem;
  x->dt = dt;
  x->off = *off;
  x->full = nest_aff_full(N, off);
  return i;
}

void nest_add_store(Nest *N, int xi, int val, DType dt, const Aff *off, int add) {
  if (N->nst == N->capst) {
    N->capst = N->capst ? N->capst * 2 : 8;
    N->st = xalloc_realloc(N->st, sizeof(Store) * (size_t)N->capst);
  }
  Store *s = &N->st[N->nst++];
  memset(s, 0, sizeof *s);
  s->x = xi;
  s->val = val;
  s->dt = dt;
  s->off = *off;
  s->add = add;
  s->full = nest_aff_full(N, off);
}

/* The offset of reading value v at index e (affine over D, one per axis of
 * v), composed through the index maps folded into this kernel, down to the
 * memory value it reads (*mem). 0 when the composition is not affine. */
int nest_compose(Nest *N, int v, const Aff *e, Aff *off, int *mem) {
  const NestKernel *k = N->src;
  const IrNode *vn = nd(k, v);
  if (!in_kernel(k, v) || !nest_is_index_map(vn->op)) {
    int64_t rs[IR_MAX_RANK];
    nest_row_strides(vn->rank, vn->dims, rs);
    *off = nest_aff_const(0);
    for (int j = 0; j < vn->rank; j++)
      if (!nest_aff_addmul(off, &e[j], rs[j])) return 0;
    *mem = v;
    return 1;
  }
  int x = vn->in[0];
  const IrNode *xn = nd(k, x);
  Aff ex[IR_MAX_RANK];
  switch (vn->op) {
  case IR_RESHAPE: {
    /* a reshape keeps the linear order: the linear index is x's too */
    int64_t rs[IR_MAX_RANK];
    nest_row_strides(vn->rank, vn->dims, rs);
    Aff lin = nest_aff_const(0);
    for (int j = 0; j < vn->rank; j++)
      if (!nest_aff_addmul(&lin, &e[j], rs[j])) return 0;
    /* reshapes of reshapes: the linear index all the way down */
    while (in_kernel(k, x) && xn->op == IR_RESHAPE) {
      x = xn->in[0];
      xn = nd(k, x);
    }
    if (in_kernel(k, x) && nest_is_index_map(xn->op)) {
      /* a range of a vector (a piece of a flat value: an extern's or an
       * attention's gradients) is still contiguous: offset plus the index */
      if (xn->op != IR_SLICE || xn->rank != 1 || nd(k, xn->in[0])->rank != 1 || xn->attr[8]) return 0;
      Aff ex1 = nest_aff_const(xn->attr[0]);
      if (!nest_aff_addmul(&ex1, &lin, 1)) return 0;
      return nest_compose(N, xn->in[0], &ex1, off, mem);
    }
    *off = lin;
    *mem = x;
    return 1;
  }
  case IR_TRANSPOSE:
    for (int i = 0; i < vn->rank; i++) ex[vn->attr[i]] = e[i];
    break;
  case IR_SLICE:
    for (int a = 0, j = 0; a < xn->rank; a++) {
      ex[a] = nest_aff_const(vn->attr[a]);
      if (!vn->attr[8 + a] && !nest_aff_addmul(&ex[a], &e[j++], 1)) return 0;
    }
    break;
  case IR_EXPAND: {
    int pad = vn->rank - xn->rank;
    for (int j = 0; j < xn->rank; j++) ex[j] = xn->dims[j] == 1 ? nest_aff_const(0) : e[j + pad];
    break;
  }
  case IR_REPEAT_KV: {
    int64_t rep = vn->attr[0];
    for (int j = 0; j < xn->rank; j++) ex[j] = e[j];
    /* head h reads head h / rep: a division of one axis index */
    const Aff *h = &e[1];
    int axis = -1, pure = h->c == 0 && h->dax < 0;
    for (int j = 0; j < IR_MAX_RANK && pure; j++)
      if (h->coef[j]) {
        if (h->coef[j] != 1 || axis >= 0) pure = 0;
        else axis = j;
      }
    if (axis < 0 && pure) {
      ex[1] = nest_aff_const(h->c / rep);
    } else if (pure) {
      ex[1] = nest_aff_const(0);
      ex[1].dax = axis;
      ex[1].dq = rep;
      ex[1].dcoef = 1;
    } else {
      return 0;
    }
    break;
  }
  default: return 0;
  }
  return nest_compose(N, x, ex, off, mem);
}

/* Index of node n (one form per axis of n) over D: a D-shaped node walks D;
 * a row-shaped one (the group set to 1, or removed) walks the other axes. */
int nest_node_index(const Nest *N, const IrNode *n, Aff *e) {
  if (n->rank == N->R) {
    for (int j = 0; j < n->rank; j++) {
      if (n->dims[j] != N->D[j] && n->dims[j] != 1) return 0;
      e[j] = n->dims[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
    }
    return 1;
  }
  if (N->rhi > N->rlo && n->rank == N->R - (N->rhi - N->rlo)) {
    for (int j = 0, i = 0; j < N->R; j++) {
      if (j >= N->rlo && j < N->rhi) continue;
      if (n->dims[i] != N->D[j]) return 0;
      e[i++] = N->D[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
    }
    return 1;
  }
  return 0;
}

/* The expression of input v as read by a reader whose index over D is
 * er[0..rr) (numpy broadcasting aligns v's shape on the right). */
int nest_x_read(Nest *N, const Aff *er, int rr, int v) {
  const NestKernel *k = N->src;
  const IrNode *vn = nd(k, v);
  if (vn->op == IR_CONST || vn->op == IR_FILL) return nest_x_const(N, vn->fattr);
  if (in_kernel(k, v) && !nest_is_index_map(vn->op)) {
    if (N->node_x[v] < 0)
      nest_fail(k, "graph %s kernel k%d: %%%d is read before it is computed", k->g->name, k->kp, v);
    return N->node_x[v] < 0 ? nest_x_const(N, 0) : N->node_x[v];
  }
  int pad = rr - vn->rank;
  if (pad < 0) {
    nest_fail(k, "graph %s kernel k%d: %%%d has more axes than its reader", k->g->name, k->kp, v);
    return nest_x_const(N, 0);
  }
  Aff ev[IR_MAX_RANK], off;
  for (int j = 0; j < vn->rank; j++) ev[j] = vn->dims[j] == 1 ? nest_aff_const(0) : er[j + pad];
  int mem;
  if (!nest_compose(N, v, ev, &off, &mem)) {
    nest_fail(k, "graph %s kernel k%d: the index maps read by %%%d are not affine", k->g->name, k->kp, v);
    return nest_x_const(N, 0);
  }
  if (!k->dtype_ok(nd(k, mem)->dtype)) {
    nest_fail(k, "graph %s kernel k%d: dtype %s is not supported by the %s back end", k->g->name, k->kp,
              sem_dtype_name(nd(k, mem)->dtype), k->backend);
    return nest_x_const(N, 0);
  }
  return nest_x_load(N, mem, nd(k, mem)->dtype, &off);
}

/* A 16-bit node's value as stored (mixed precision, compiler/ir/precision.h):
 * rounded where it is made, in the kernel as in memory, so a value is the
 * same whether or not fusion keeps it in registers (and the reference
 * executor, which rounds every such node, agrees). */
int nest_x_stored(Nest *N, int id, int x) {
  DType dt = nd(N->src, id)->dtype;
  if ((dt != DT_BF16 && dt != DT_F16) || (N->x[x].kind == X_LOAD && N->x[x].dt == dt)) return x; /* read as stored */
  int r = nest_x_op(N, X_ROUND, IR_CAST, 0, x, -1);
  N->x[r].dt = dt;
  return r;
}

/* Builds the expression of a loop / row kernel's node n. */
int nest_x_node(Nest *N, int id) {
  const NestKernel *k = N->src;
  const IrNode *n = nd(k, id);
  Aff en[IR_MAX_RANK], eD[IR_MAX_RANK];
  for (int j = 0; j < N->R; j++) eD[j] = N->D[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
  int fl = ir_op_flags(n->op);
  if (fl & IRF_ELEMENTWISE) {
    if (!nest_node_index(N, n, en)) {
      nest_fail(k, "graph %s kernel k%d: %%%d is outside the kernel's iteration space", k->g->name, k->kp, id);
      return nest_x_const(N, 0);
    }
    int a = nest_x_read(N, en, n->rank, n->in[0]);
    int b = n->nin > 1 ? nest_x_read(N, en, n->rank, n->in[1]) : -1;
    switch (n->op) {
    case IR_ACT_GRAD: return nest_x_op(N, X_ACTGRAD, (IrOp)n->attr[0], n->fattr, a, b);
    case IR_ADD:
    case IR_SUB:
    case IR_MUL:
    case IR_DIV:
    case IR_MAXIMUM:
    case IR_MINIMUM: return nest_x_op(N, X_BIN, n->op, 0, a, b);
    case IR_CAUSAL_MASK: {
      if (n->rank < 2 || n->rank != N->R) {
        nest_fail(k, "graph %s kernel k%d: causal_mask needs the kernel's matrix space", k->g->name, k->kp);
        return a;
      }
      int i = nest_x_op(N, X_MASK, n->op, n->fattr, a, -1);
      N->x[i].attr = n->attr[0];
      N->x[i].attr_cols = n->attr[1];
      N->x[i].full |= nest_in_group(N, N->R - 1) || nest_in_group(N, N->R - 2);
      N->pinned[N->R - 1] = N->pinned[N->R - 2] = 1;
      return i;
    }
    case IR_VOCAB_MASK: {
      int i = nest_x_op(N, X_VMASK, n->op, n->fattr, a, -1);
      N->x[i].off = en[n->rank - 1];
      N->x[i].attr = n->attr[0];
      N->x[i].below = n->attr[1];
      N->x[i].cols = n->dims[n->rank - 1];
      N->x[i].full |= nest_aff_full(N, &N->x[i].off);
      return i;
    }
    case IR_DROPOUT: {
      if (n->fattr <= 0) return a;
      int i = nest_x_op(N, X_DROP, n->op, n->fattr, a, -1);
      int64_t rs[IR_MAX_RANK];
      nest_row_strides(n->rank, n->dims, rs);
      N->x[i].off = nest_aff_const(0);
      for (int j = 0; j < n->rank; j++) nest_aff_addmul(&N->x[i].off, &en[j], rs[j]);
      N->x[i].attr = n->attr[0];
      N->x[i].full |= nest_aff_full(N, &N->x[i].off);
      return i;
    }
    case IR_CAST:
      if (!sem_dtype_is_float(n->dtype) && sem_dtype_is_float(nd(k, n->in[0])->dtype))
        return nest_x_op(N, X_CASTI, n->op, 0, a, -1);
      return a;
    default: return nest_x_op(N, X_UN, n->op, n->fattr, a, -1);
    }
  }
  /* reductions over the kernel's group */
  int x = nest_x_read(N, eD, N->R, n->in[0]);
  int64_t len = 1;
  for (int j = N->rlo; j < N->rhi; j++) len *= N->D[j];
  switch (n->op) {
  case IR_REDUCE_SUM:
  case IR_SUM_TO: return nest_x_red(N, x, 0, 0);
  case IR_REDUCE_MEAN: return nest_x_red(N, x, 0, len);
  case IR_REDUCE_MAX: return nest_x_red(N, x, 1, 0);
  case IR_SOFTMAX:
  case IR_LOG_SOFTMAX: {
    int m = nest_x_red(N, x, 1, 0);
    int d = nest_x_op(N, X_BIN, IR_SUB, 0, x, m);
    int e = nest_x_op(N, X_UN, IR_EXP, 0, d, -1);
    int s = nest_x_red(N, e, 0, 0);
    if (n->op == IR_SOFTMAX) return nest_x_op(N, X_BIN, IR_DIV, 0, e, s);
    return nest_x_op(N, X_BIN, IR_SUB, 0, d, nest_x_op(N, X_UN, IR_LOG, 0, s, -1));
  }
  case IR_SOFTMAX_BWD:
  case IR_LOG_SOFTMAX_BWD: {
    int dy = nest_x_read(N, eD, N->R, n->in[1]);
    if (n->op == IR_SOFTMAX_BWD) {
      int s = nest_x_red(N, nest_x_op(N, X_BIN, IR_MUL, 0, x, dy), 0, 0);
      return nest_x_op(N, X_BIN, IR_MUL, 0, x, nest_x_op(N, X_BIN, IR_SUB, 0, dy, s));
    }
    int s = nest_x_red(N, dy, 0, 0);
    return nest_x_op(N, X_BIN, IR_SUB, 0, dy, nest_x_op(N, X_BIN, IR_MUL, 0, nest_x_op(N, X_UN, IR_EXP, 0, x, -1), s));
  }
  default:
    nest_fail(k, "graph %s kernel k%d: %s does not fuse into a row kernel", k->g->name, k->kp, ir_op_name(n->op));
    return x;
  }
}

/* The store of node v's value (its own shape, contiguous) as seen from D. */
void nest_store_node(Nest *N, int v, int xi) {
  const NestKernel *k = N->src;
  const IrNode *n = nd(k, v);
  Aff en[IR_MAX_RANK];
  if (!nest_node_index(N, n, en)) {
    nest_fail(k, "graph %s kernel k%d: output %%%d is outside the kernel's space", k->g->name, k->kp, v);
    return;
  }
  int64_t rs[IR_MAX_RANK];
  nest_row_strides(n->rank, n->dims, rs);
  Aff off = nest_aff_const(0);
  for (int j = 0; j < n->rank; j++) nest_aff_addmul(&off, &en[j], rs[j]);
  nest_add_store(N, xi, v, n->dtype, &off, 0);
}

/* ---- collapsing ---- */

int nest_aff_allows(const Aff *a, int j, int j2, const int64_t *D) {
  if (a->dax == j || a->dax == j2) return 0;
  return a->coef[j] == a->coef[j2] * D[j2];
}

void nest_collapse(Nest *N) {
  int set[IR_MAX_RANK];
  for (int j = 0; j < N->R; j++) set[j] = j < N->glo ? 0 : j < N->ghi ? 1 : 2;
  N->na = 0;
  int prev = -1; /* the last kept original axis */
  for (int j = 0; j < N->R; j++) {
    N->axis_of[j] = -1;
    if (N->D[j] == 1) continue;
    int merge = prev >= 0 && set[prev] == set[j] && !N->pinned[prev] && !N->pinned[j] && N->alast[N->na - 1] == prev;
    for (int i = 0; i < N->nx && merge; i++)
      if (N->x[i].kind == X_LOAD || N->x[i].kind == X_DROP || N->x[i].kind == X_INDEX || N->x[i].kind == X_VMASK)
        merge = nest_aff_allows(&N->x[i].off, prev, j, N->D);
    for (int i = 0; i < N->nst && merge; i++) merge = nest_aff_allows(&N->st[i].off, prev, j, N->D);
    if (merge) {
      N->adim[N->na - 1] *= N->D[j];
      N->alast[N->na - 1] = j;
    } else {
      N->afirst[N->na] = N->alast[N->na] = j;
      N->adim[N->na] = N->D[j];
      N->aset[N->na] = set[j];
      N->na++;
    }
    N->axis_of[j] = N->na - 1;
    prev = j;
  }
}

static void build_loop_row(Nest *N, const NestKernel *k) {
  const FuseKernel *K = k->K;
  int row = K->kind == FUSE_ROW;
  nest_init(N, k, K->rank, K->dims, row ? K->red_lo : 0, row ? K->red_hi : 0, row ? K->red_lo : 0,
            row ? K->red_hi : K->rank);
  for (int j = 0; j < K->nnodes; j++) {
    int id = K->nodes[j];
    if (nest_is_index_map(nd(k, id)->op)) continue;
    N->node_x[id] = nest_x_stored(N, id, nest_x_node(N, id));
  }
  for (int j = 0; j < K->noutputs; j++) nest_store_node(N, K->outputs[j], N->node_x[K->outputs[j]]);
}

/* ---- copy and fill kernels ---- */

static NestStep *new_step(NestSteps *S) {
  if (S->n == S->cap) {
    S->cap = S->cap ? S->cap * 2 : 4;
    S->step = xalloc_realloc(S->step, sizeof(NestStep) * (size_t)S->cap);
  }
  NestStep *st = &S->step[S->n++];
  memset(st, 0, sizeof *st);
  st->zero_value = -1;
  return st;
}

/* A copy of value src's index space (rank, dims) into dst at store_off:
 * the output of a copy kernel, one piece of a concat, or a pad's interior. */
static void copy_piece(NestSteps *S, const NestKernel *k, int src, int rank, const int64_t *dims, int dst,
                       const Aff *store_off) {
  Nest *N = &new_step(S)->nest;
  nest_init(N, k, rank, dims, 0, 0, 0, rank);
  Aff e[IR_MAX_RANK];
  for (int j = 0; j < rank; j++) e[j] = dims[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
  int x = nest_x_read(N, e, rank, src);
  nest_add_store(N, x, dst, nd(k, dst)->dtype, store_off, 0);
  N->st[0].full = nest_aff_full(N, store_off);
}

NestAff nest_contiguous_off(int rank, const int64_t *dims, const int64_t *strides_or_null, int64_t base) {
  int64_t rs[IR_MAX_RANK];
  if (strides_or_null) memcpy(rs, strides_or_null, sizeof(int64_t) * (size_t)rank);
  else nest_row_strides(rank, dims, rs);
  Aff a = nest_aff_const(base);
  for (int j = 0; j < rank; j++)
    if (dims[j] != 1) a.coef[j] = rs[j];
  return a;
}

static void build_copy(NestSteps *S, const NestKernel *k) {
  const FuseKernel *K = k->K;
  for (int o = 0; o < K->noutputs; o++) {
    int m = K->outputs[o];
    const IrNode *n = nd(k, m);
    if (n->op == IR_PAD) {
      new_step(S)->zero_value = m;
      const IrNode *x = nd(k, n->in[0]);
      int64_t os[IR_MAX_RANK], base = 0;
      nest_row_strides(n->rank, n->dims, os);
      for (int a = 0; a < n->rank; a++) base += n->attr[a] * os[a];
      Aff off = nest_contiguous_off(x->rank, x->dims, os, base);
      copy_piece(S, k, n->in[0], x->rank, x->dims, m, &off);
    } else if (n->op == IR_CONCAT) {
      int axis = (int)n->attr[0];
      int64_t os[IR_MAX_RANK], at = 0;
      nest_row_strides(n->rank, n->dims, os);
      for (int i = 0; i < n->nin; i++) {
        const IrNode *x = nd(k, n->in[i]);
        Aff off = nest_contiguous_off(x->rank, x->dims, os, at * os[axis]);
        copy_piece(S, k, n->in[i], x->rank, x->dims, m, &off);
        at += x->dims[axis];
      }
    } else if (nest_is_index_map(n->op)) {
      /* transpose / slice / expand / repeat_kv (and what folded into it) */
      Aff off = nest_contiguous_off(n->rank, n->dims, NULL, 0);
      NestStep *st = new_step(S);
      Nest *N = &st->nest;
      nest_init(N, k, n->rank, n->dims, 0, 0, 0, n->rank);
      Aff e[IR_MAX_RANK], moff;
      for (int j = 0; j < n->rank; j++) e[j] = n->dims[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
      int mem;
      if (!nest_compose(N, m, e, &moff, &mem)) {
        nest_fail(k, "graph %s kernel k%d: the copy's index maps are not affine", k->g->name, k->kp);
        nest_free(N);
        S->n--;
        return;
      }
      int x = nest_x_load(N, mem, nd(k, mem)->dtype, &moff);
      nest_add_store(N, x, m, n->dtype, &off, 0);
    } else {
      nest_fail(k, "graph %s kernel k%d: %s is not a copy", k->g->name, k->kp, ir_op_name(n->op));
    }
  }
}

/* FILL, IOTA and CONST leaves that a kernel reads from memory. */
static void build_fill(NestSteps *S, const NestKernel *k) {
  int v = k->K->nodes[0];
  const IrNode *n = nd(k, v);
  Nest *N = &new_step(S)->nest;
  nest_init(N, k, n->rank, n->dims, 0, 0, 0, n->rank);
  int x;
  if (n->op == IR_IOTA) {
    x = nest_new_x(N, X_INDEX);
    N->x[x].off = n->rank ? nest_aff_axis(0) : nest_aff_const(0);
    N->x[x].full = n->rank && n->dims[0] > 1;
  } else {
    x = nest_x_const(N, n->fattr);
  }
  Aff off = nest_contiguous_off(n->rank, n->dims, NULL, 0);
  nest_add_store(N, x, v, n->dtype, &off, 0);
}

void nest_build_steps(NestSteps *S, const NestKernel *k) {
  memset(S, 0, sizeof *S);
  switch (k->K->kind) {
  case FUSE_LOOP:
  case FUSE_ROW: {
    NestStep *st = new_step(S);
    st->loop_row = 1;
    build_loop_row(&st->nest, k);
    break;
  }
  case FUSE_COPY: build_copy(S, k); break;
  case FUSE_LEAF: build_fill(S, k); break;
  default: nest_fail(k, "graph %s kernel k%d: a %s kernel is not a loop nest", k->g->name, k->kp, fuse_kind_name(k->K->kind));
  }
}

void nest_free_steps(NestSteps *S) {
  for (int i = 0; i < S->n; i++)
    if (S->step[i].zero_value < 0) nest_free(&S->step[i].nest);
  free(S->step);
  memset(S, 0, sizeof *S);
}
