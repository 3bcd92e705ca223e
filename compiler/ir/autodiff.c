/* autodiff.c - reverse-mode differentiation: one gradient rule per IR op.
 *
 * A rule adgrad_ID(c, f, dy) sees forward node f and the gradient dy of its
 * output (a node of the graph being built) and adds the gradients of f's
 * inputs with acc(). Rules read forward values through fv(), which in a
 * block's backward graph decides, per the recompute policy, whether the
 * value is an argument, a saved activation or recomputed on the spot. The
 * rule table is built from IR_OPS, so an op without a rule does not compile.
 */
#include "autodiff.h"
#include "conv.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  IrModule *m;
  AdResult *res;
  const IrGraph *f; /* the forward graph differentiated */
  IrGraph *b;       /* the graph being built */
  int lazy;         /* block backward: forward values appear on demand */
  int *map;         /* forward node -> node of b, -1 when not (yet) there */
  int *grad;        /* forward node -> its gradient in b, -1 when none */
  char *rg;         /* forward node depends on a parameter (needs a gradient) */
  char *recomp;     /* lazy: recompute this node in b rather than save it */
  int *saved;       /* lazy: forward nodes saved, in argument order */
  int nsaved;
  int first_saved_arg;
  /* the gradients flowing into PARAM nodes, each kept apart (param_outputs) */
  int *part_node, *part_grad;
  int nparts, capparts;
  /* the step (ad_build_layers): per forward CALL split into the policy's
   * layers and the kept ones, the step's SAVE call of the first part (its
   * output is the second part's input; map holds the second), else -1 */
  int *split_first;
  /* lazy: per context-parallel RECV of the forward, the SEND it pairs with
   * (the oldest one not yet received, as the runtime pairs them), else -1 */
  int *cp_pair;
  /* lazy, the rings those pairs make (cp_rings): per RECV its ring's root (the
   * value the ring's first SEND sends) and its block's place in the ring
   * (1..len-1), else -1; per root the ring's length (-1: not a ring; the pairs
   * are then made again as they were, resend) and the next block the
   * backward's ring delivers (ring_deliver) */
  int *cp_root, *cp_pos, *ring_len, *ring_next;
  signed char *ring_dir; /* per root: 0 not started, -1 the other way round (the forward's last block first), +1 the forward's way */
  const char *err;
} AdCtx;

typedef void (*GradRule)(AdCtx *c, int f, int dy);

static void set_err(AdCtx *c, const char *msg) {
  if (!c->err) c->err = msg;
}

static const IrNode *fnode(AdCtx *c, int f) { return &c->f->nodes[f]; }
static int fin(AdCtx *c, int f, int k) { return c->f->nodes[f].in[k]; }

/* Appends a node to b; -1 (with c->err) when an input is missing or the
 * shape rule objects, which would be a bug in a rule. */
static int emit(AdCtx *c, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr, DType dt,
                int rank, const int64_t *dims) {
  if (c->err) return -1;
  for (int i = 0; i < nin; i++)
    if (in[i] < 0) {
      set_err(c, "internal error: a gradient rule lost an input");
      return -1;
    }
  const char *why = NULL;
  int id = ir_add(c->b, op, in, nin, attr, nattr, fattr, dt, rank, dims, &why);
  if (id < 0) set_err(c, arena_printf(c->m->arena, "internal error: gradient %s: %s", ir_op_name(op), why ? why : "?"));
  return id;
}

static DType bdtype(AdCtx *c, int id) { return c->b->nodes[id].dtype; }

static int un(AdCtx *c, IrOp op, int a) {
  if (a < 0) return emit(c, op, &a, 1, NULL, 0, 0, DT_F32, -1, NULL);
  return emit(c, op, &a, 1, NULL, 0, 0, bdtype(c, a), -1, NULL);
}

static int bin(AdCtx *c, IrOp op, int a, int b) {
  int in[2] = {a, b};
  return emit(c, op, in, 2, NULL, 0, 0, a >= 0 ? bdtype(c, a) : DT_F32, -1, NULL);
}

static int cst(AdCtx *c, double v, DType dt) { return emit(c, IR_CONST, NULL, 0, NULL, 0, v, dt, -1, NULL); }

static int fill(AdCtx *c, double v, DType dt, int rank, const int64_t *dims) {
  return emit(c, IR_FILL, NULL, 0, NULL, 0, v, dt, rank, dims);
}

/* ACT_GRAD(x, dy): f'(x) * dy for the unary op `op` */
static int act_grad(AdCtx *c, IrOp op, double p, int x, int dy) {
  int in[2] = {x, dy};
  int64_t attr = op;
  return emit(c, IR_ACT_GRAD, in, 2, &attr, 1, p, dy >= 0 ? bdtype(c, dy) : DT_F32, -1, NULL);
}

static int same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
  if (ra != rb) return 0;
  for (int i = 0; i < ra; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* g summed down to the shape of forward node `like` (undoing broadcasting) */
static int sum_to(AdCtx *c, int g, int like) {
  if (g < 0) return -1;
  const IrNode *t = fnode(c, like), *gn = &c->b->nodes[g];
  if (same_shape(gn->rank, gn->dims, t->rank, t->dims)) return g;
  return emit(c, IR_SUM_TO, &g, 1, NULL, 0, 0, gn->dtype, t->rank, t->dims);
}

static int reshape_to(AdCtx *c, int g, int rank, const int64_t *dims) {
  if (g < 0) return -1;
  const IrNode *gn = &c->b->nodes[g];
  if (same_shape(gn->rank, gn->dims, rank, dims)) return g;
  return emit(c, IR_RESHAPE, &g, 1, NULL, 0, 0, gn->dtype, rank, dims);
}

/* ---- forward values inside the backward graph ---- */

static int copy_node(AdCtx *c, const IrNode *n, const int *in) {
  int id = emit(c, n->op, in, n->nin, n->attr, IR_NATTR, n->fattr, n->dtype, n->rank, n->dims);
  if (id >= 0) {
    c->b->nodes[id].name = n->name;
    c->b->nodes[id].span = n->span;
  }
  return id;
}

static int arg_node(AdCtx *c, int64_t index, const IrNode *like, const char *name) {
  int id = emit(c, IR_ARG, NULL, 0, &index, 1, 0, like->dtype, like->rank, like->dims);
  if (id >= 0) c->b->nodes[id].name = name;
  return id;
}

/* A forward node re-created from its inputs rather than kept: leaves are
 * free; SEND / RECV do not repeat (they would move another message), but a
 * context-parallel RECV whose SEND is known does: the pair is made again,
 * the exchange repeated (cp_rereceive). A node that reads a state parameter
 * (other than through a view) is kept: the forward's STATE_UPDATE has moved
 * the state by the time a backward recomputes (a routing bias chose the
 * experts with the old value). */
static int recomputable(const IrModule *m, const IrGraph *g, const IrNode *n, const int *cp_pair) {
  if (n->op == IR_RECV && cp_pair && cp_pair[n - g->nodes] >= 0) return 1;
  if (n->op == IR_SEND || n->op == IR_RECV || n->op == IR_CALL || n->op == IR_ARG) return 0;
  if (n->op != IR_RESHAPE)
    for (int k = 0; k < n->nin; k++) {
      const IrNode *x = &g->nodes[n->in[k]];
      if (x->op == IR_PARAM && x->attr[0] >= 0 && x->attr[0] < m->nparams && m->params[x->attr[0]].state) return 0;
    }
  return 1;
}

static int fv(AdCtx *c, int f);

/* A received block made again: the forward's SEND it paired with is sent
 * again first (once), its value made again or read where it was kept - which
 * for a ring repeats the exchange from the rank's own block, step by step in
 * the forward's order, so the runtime pairs each receive as the forward did. */
static int resend(AdCtx *c, int s) {
  if (c->map[s] >= 0) return 0;
  int x = fv(c, fin(c, s, 0));
  if (x < 0) return -1;
  return c->map[s] = copy_node(c, fnode(c, s), &x);
}

/* The ring's blocks made again in the backward, in the order it reads them:
 * a backward's attention gradients read the forward's last block first, so
 * there the ring goes the other way round - each rank sends its own block to
 * the previous rank and passes on what it receives (block s is rank r - s's,
 * r + (len - s) along the other way) - each block sent on as soon as it
 * arrives so that it travels while the backward works on the one before, as
 * Transformer Engine's ring re-sends a rank's keys and values. Those sends go
 * to offset -1 as the gradients' do, and each receive takes the oldest send
 * (runtime/comm_ring.c): the backward's order (block j received, its
 * gradient sent, block j - 1 received) keeps the two apart. Delivers up to
 * block j. */
static int ring_deliver(AdCtx *c, int root, int j) {
  int len = c->ring_len[root];
  /* A backward made again whole (full recomputation: the forward's blocks
   * read in the forward's order, block 1 first) gets them the forward's way,
   * each sent on before the attention on it; a backward that reads them last
   * first, the other way round. dir: the way along the group the sends go. */
  if (!c->ring_dir[root]) {
    c->ring_dir[root] = (signed char)(j == 1 && len > 2 ? 1 : -1);
    c->ring_next[root] = c->ring_dir[root] > 0 ? 1 : len - 1;
  }
  int dir = c->ring_dir[root];
  while (!c->err && (dir > 0 ? c->ring_next[root] <= j : c->ring_next[root] >= j)) {
    int t = c->ring_next[root], blk = -1;
    for (int i = 0; i < c->f->nnodes && blk < 0; i++)
      if (c->cp_root[i] == root && c->cp_pos[i] == t) blk = i;
    if (blk < 0) {
      set_err(c, "internal error: a context-parallel ring lost a block");
      return -1;
    }
    const IrNode *any = fnode(c, blk);
    int64_t on[2] = {any->attr[0], dir}, from[2] = {any->attr[0], -dir};
    if (t == (dir > 0 ? 1 : len - 1)) { /* the first: this rank's own block, sent now */
      int x = fv(c, root);
      if (emit(c, IR_SEND, &x, 1, on, 2, 0, any->dtype, any->rank, any->dims) < 0) return -1;
    }
    int r = emit(c, IR_RECV, NULL, 0, from, 2, 0, any->dtype, any->rank, any->dims);
    if (r < 0) return -1;
    c->map[blk] = r;
    c->ring_next[root] = t + dir;
    int more = dir > 0 ? t + 1 < len : t > 1;
    if (more && emit(c, IR_SEND, &r, 1, on, 2, 0, any->dtype, any->rank, any->dims) < 0) return -1; /* on at once */
  }
  return c->err ? -1 : 0;
}

static int fv(AdCtx *c, int f) {
  if (c->map[f] >= 0 || c->err) return c->map[f];
  if (c->cp_root && c->cp_root[f] >= 0 && c->ring_len[c->cp_root[f]] > 0 && c->recomp[f])
    return ring_deliver(c, c->cp_root[f], c->cp_pos[f]) < 0 ? -1 : c->map[f];
  if (!c->lazy) {
    set_err(c, "internal error: a forward value is missing from the step graph");
    return -1;
  }
  const IrNode *n = fnode(c, f);
  int id;
  if (n->op == IR_ARG) {
    id = arg_node(c, n->attr[0] + 1, n, n->name);
  } else if (recomputable(c->m, c->f, n, c->cp_pair) && ((ir_op_flags(n->op) & IRF_LEAF) || c->recomp[f])) {
    if (n->op == IR_RECV && resend(c, c->cp_pair[f]) < 0) return -1;
    int stack_in[8], *in = n->nin <= 8 ? stack_in : malloc(sizeof(int) * (size_t)n->nin);
    for (int k = 0; k < n->nin; k++) in[k] = fv(c, n->in[k]);
    id = copy_node(c, n, in);
    if (in != stack_in) free(in);
  } else {
    id = arg_node(c, c->first_saved_arg + c->nsaved, n, arena_printf(c->m->arena, "saved %%%d", f));
    c->saved[c->nsaved++] = f;
  }
  c->map[f] = id;
  return id;
}

/* Adds g to the gradient of forward node f (when f needs one). */
static void acc(AdCtx *c, int f, int g) {
  if (!c->rg[f] || g < 0 || c->err) return;
  if (fnode(c, f)->op == IR_PARAM) {
    /* not summed here: each becomes a gradient output of its own, which the
     * back ends add into the parameter's gradient (a weight gradient's GEMM
     * with beta = 1), so the tied table's two gradients are not added in a
     * 154 MB pass first */
    if (c->nparts == c->capparts) {
      int cap = c->capparts ? 2 * c->capparts : 16;
      int *nn = arena_alloc(c->m->arena, sizeof(int) * (size_t)cap), *ng = arena_alloc(c->m->arena, sizeof(int) * (size_t)cap);
      if (c->nparts) {
        memcpy(nn, c->part_node, sizeof(int) * (size_t)c->nparts);
        memcpy(ng, c->part_grad, sizeof(int) * (size_t)c->nparts);
      }
      c->part_node = nn;
      c->part_grad = ng;
      c->capparts = cap;
    }
    c->part_node[c->nparts] = f;
    c->part_grad[c->nparts++] = g;
    if (c->grad[f] < 0) c->grad[f] = g;
    return;
  }
  if (c->grad[f] < 0) c->grad[f] = g;
  else c->grad[f] = bin(c, IR_ADD, c->grad[f], g);
}

/* ---- gradient rules ---- */

static void no_grad(AdCtx *c, int f, int dy) {
  (void)c;
  (void)f;
  (void)dy;
}

static void adgrad_INPUT(AdCtx *c, int f, int dy) { no_grad(c, f, dy); }
static void adgrad_PARAM(AdCtx *c, int f, int dy) { no_grad(c, f, dy); } /* collected per parameter at the end */
static void adgrad_ARG(AdCtx *c, int f, int dy) { no_grad(c, f, dy); }   /* collected per argument at the end */
static void adgrad_CONST(AdCtx *c, int f, int dy) { no_grad(c, f, dy); }
static void adgrad_FILL(AdCtx *c, int f, int dy) { no_grad(c, f, dy); }
static void adgrad_IOTA(AdCtx *c, int f, int dy) { no_grad(c, f, dy); }

static void adgrad_NEG(AdCtx *c, int f, int dy) { acc(c, fin(c, f, 0), un(c, IR_NEG, dy)); }

/* f'(x) * dy in one elementwise op (ACT_GRAD), for every smooth unary op */
static void act(AdCtx *c, int f, int dy) {
  if (!c->rg[fin(c, f, 0)]) return;
  acc(c, fin(c, f, 0), act_grad(c, fnode(c, f)->op, fnode(c, f)->fattr, fv(c, fin(c, f, 0)), dy));
}

static void adgrad_RELU(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_GELU(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_SILU(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_SIGMOID(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_TANH(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_EXP(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_LOG(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_SQRT(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_RSQRT(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_ABS(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_SQUARE(AdCtx *c, int f, int dy) { act(c, f, dy); }
static void adgrad_POWS(AdCtx *c, int f, int dy) { act(c, f, dy); }

/* f''(x) * t for ACT_GRAD's own gradient with respect to x, built from
 * elementwise ops; -1 with no error where f'' is zero. */
static int second_deriv(AdCtx *c, IrOp op, double p, int x, int t) {
  DType dt = bdtype(c, t);
  switch (op) {
  case IR_NEG:
  case IR_CAST:
  case IR_RELU:
  case IR_ABS: return -1;
  case IR_SQUARE: return bin(c, IR_MUL, t, cst(c, 2.0, dt));
  case IR_EXP: return bin(c, IR_MUL, t, un(c, IR_EXP, x));
  case IR_LOG: return un(c, IR_NEG, bin(c, IR_DIV, t, un(c, IR_SQUARE, x)));
  case IR_SQRT:
  case IR_RSQRT:
  case IR_POWS: {
    /* x^q: q (q - 1) x^(q - 2) */
    double q = op == IR_SQRT ? 0.5 : op == IR_RSQRT ? -0.5 : p;
    if (q * (q - 1.0) == 0.0) return -1;
    int pw = emit(c, IR_POWS, &x, 1, NULL, 0, q - 2.0, bdtype(c, x), -1, NULL);
    return bin(c, IR_MUL, bin(c, IR_MUL, t, pw), cst(c, q * (q - 1.0), dt));
  }
  case IR_SIGMOID: {
    /* s (1 - s) (1 - 2 s) */
    int s = un(c, IR_SIGMOID, x), one = cst(c, 1.0, dt);
    int q = bin(c, IR_MUL, s, bin(c, IR_SUB, one, s));
    int r = bin(c, IR_SUB, one, bin(c, IR_MUL, s, cst(c, 2.0, dt)));
    return bin(c, IR_MUL, t, bin(c, IR_MUL, q, r));
  }
  case IR_TANH: {
    /* -2 th (1 - th^2) */
    int th = un(c, IR_TANH, x);
    int q = bin(c, IR_SUB, cst(c, 1.0, dt), un(c, IR_SQUARE, th));
    return bin(c, IR_MUL, t, bin(c, IR_MUL, bin(c, IR_MUL, th, cst(c, -2.0, dt)), q));
  }
  case IR_SILU: {
    /* s (1 - s) (2 + x (1 - 2 s)) */
    int s = un(c, IR_SIGMOID, x), one = cst(c, 1.0, dt);
    int q = bin(c, IR_MUL, s, bin(c, IR_SUB, one, s));
    int w = bin(c, IR_ADD, cst(c, 2.0, dt), bin(c, IR_MUL, x, bin(c, IR_SUB, one, bin(c, IR_MUL, s, cst(c, 2.0, dt)))));
    return bin(c, IR_MUL, t, bin(c, IR_MUL, q, w));
  }
  case IR_GELU: {
    /* f = x (1 + th) / 2, th = tanh(u), u = k (x + a x^3):
     * f'' = (1 - th^2) (u' + x (u'' - 2 th u'^2) / 2) */
    const double k = 0.79788456080286535588, a = 0.044715;
    int x2 = un(c, IR_SQUARE, x);
    int u = bin(c, IR_MUL, bin(c, IR_ADD, x, bin(c, IR_MUL, bin(c, IR_MUL, x2, x), cst(c, a, dt))), cst(c, k, dt));
    int th = un(c, IR_TANH, u);
    int sech2 = bin(c, IR_SUB, cst(c, 1.0, dt), un(c, IR_SQUARE, th));
    int up = bin(c, IR_MUL, bin(c, IR_ADD, cst(c, 1.0, dt), bin(c, IR_MUL, x2, cst(c, 3.0 * a, dt))), cst(c, k, dt));
    int upp = bin(c, IR_MUL, x, cst(c, 6.0 * k * a, dt));
    int inner = bin(c, IR_SUB, upp, bin(c, IR_MUL, bin(c, IR_MUL, th, cst(c, 2.0, dt)), un(c, IR_SQUARE, up)));
    int w = bin(c, IR_ADD, up, bin(c, IR_MUL, bin(c, IR_MUL, x, cst(c, 0.5, dt)), inner));
    return bin(c, IR_MUL, t, bin(c, IR_MUL, sech2, w));
  }
  default:
    set_err(c, arena_printf(c->m->arena, "the second derivative of %s is not supported", ir_op_name(op)));
    return -1;
  }
}

/* ACT_GRAD(x, d) = f'(x) d: linear in d; f''(x) d g for x. */
static void adgrad_ACT_GRAD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  IrOp op = (IrOp)n->attr[0];
  int x = fin(c, f, 0), d = fin(c, f, 1);
  if (c->rg[d]) acc(c, d, act_grad(c, op, n->fattr, fv(c, x), dy));
  if (c->rg[x]) acc(c, x, second_deriv(c, op, n->fattr, fv(c, x), bin(c, IR_MUL, fv(c, d), dy)));
}

static void adgrad_ADD(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), sum_to(c, dy, fin(c, f, 0)));
  acc(c, fin(c, f, 1), sum_to(c, dy, fin(c, f, 1)));
}

static void adgrad_SUB(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), sum_to(c, dy, fin(c, f, 0)));
  if (c->rg[fin(c, f, 1)]) acc(c, fin(c, f, 1), un(c, IR_NEG, sum_to(c, dy, fin(c, f, 1))));
}

static void adgrad_MUL(AdCtx *c, int f, int dy) {
  int a = fin(c, f, 0), b = fin(c, f, 1);
  if (c->rg[a]) acc(c, a, sum_to(c, bin(c, IR_MUL, dy, fv(c, b)), a));
  if (c->rg[b]) acc(c, b, sum_to(c, bin(c, IR_MUL, dy, fv(c, a)), b));
}

/* y = a / b: da = dy / b, db = -dy y / b */
static void adgrad_DIV(AdCtx *c, int f, int dy) {
  int a = fin(c, f, 0), b = fin(c, f, 1);
  if (c->rg[a]) acc(c, a, sum_to(c, bin(c, IR_DIV, dy, fv(c, b)), a));
  if (c->rg[b]) acc(c, b, un(c, IR_NEG, sum_to(c, bin(c, IR_DIV, bin(c, IR_MUL, dy, fv(c, f)), fv(c, b)), b)));
}

/* The selected operand takes dy: for maximum the mask a > b is relu'(a - b),
 * for minimum a < b is relu'(b - a); ties go to b. */
static void minmax(AdCtx *c, int f, int dy, int is_max) {
  int a = fin(c, f, 0), b = fin(c, f, 1);
  if (!c->rg[a] && !c->rg[b]) return;
  int diff = is_max ? bin(c, IR_SUB, fv(c, a), fv(c, b)) : bin(c, IR_SUB, fv(c, b), fv(c, a));
  int d = act_grad(c, IR_RELU, 0, diff, dy);
  if (c->rg[a]) acc(c, a, sum_to(c, d, a));
  if (c->rg[b]) acc(c, b, sum_to(c, bin(c, IR_SUB, dy, d), b));
}

static void adgrad_MAXIMUM(AdCtx *c, int f, int dy) { minmax(c, f, dy, 1); }
static void adgrad_MINIMUM(AdCtx *c, int f, int dy) { minmax(c, f, dy, 0); }

static int matmul(AdCtx *c, int a, int b, int ta, int tb) {
  int in[2] = {a, b};
  int64_t attr[2] = {ta, tb};
  return emit(c, IR_MATMUL, in, 2, attr, 2, 0, a >= 0 ? bdtype(c, a) : DT_F32, -1, NULL);
}

/* X^T Y summed over every batch axis down to `like`, a matrix (a weight):
 * for X [batch..., T, P] and Y [batch..., T, Q] of the same batch shape, the
 * sum over the batch of the per-matrix products is one product with the
 * batch folded into the contracted rows, X as [batch*T, P] and Y as
 * [batch*T, Q] (row-major, so the reshapes move nothing). One GEMM with a
 * long k instead of a batch of products and a column sum of their results
 * (issue 10; the CPU back end gains the same). -1 where the shapes differ,
 * the batch is empty or `like` keeps a batch axis. */
static int matmul_tn_batch_folded(AdCtx *c, int x, int y, int like) {
  if (x < 0 || y < 0 || c->err) return -1;
  const IrNode *xn = &c->b->nodes[x], *yn = &c->b->nodes[y], *t = fnode(c, like);
  int r = xn->rank;
  if (r < 3 || yn->rank != r || xn->dims[r - 2] != yn->dims[r - 2] || t->rank < 2) return -1;
  for (int i = 0; i < r - 2; i++)
    if (xn->dims[i] != yn->dims[i]) return -1;
  for (int i = 0; i < t->rank - 2; i++)
    if (t->dims[i] != 1) return -1;
  if (t->dims[t->rank - 2] != xn->dims[r - 1] || t->dims[t->rank - 1] != yn->dims[r - 1]) return -1;
  int64_t rows = 1;
  for (int i = 0; i < r - 1; i++) rows *= xn->dims[i];
  int64_t xd[2] = {rows, xn->dims[r - 1]}, yd[2] = {rows, yn->dims[r - 1]};
  int xf = reshape_to(c, x, 2, xd), yf = reshape_to(c, y, 2, yd);
  int g = matmul(c, xf, yf, 1, 0);
  return reshape_to(c, g, t->rank, t->dims);
}

/* The product's operand x, seen through such a transpose of a parameter:
 * the parameter, read with the flag flipped. The backward then neither reads
 * the transposed value (which the forward's GEMM folds when it is its only
 * reader) nor transposes the gradient back: the tied LM head of GPT-2 lost a
 * copy of the 154 MB embedding table and a transposing add of its gradient
 * a step. Only parameters: an activation read untransposed would be one more
 * value to keep (or recompute) for the backward beside the transposed one
 * the forward's product reads. */
static void see_through(AdCtx *c, int *x, int *t) {
  const IrNode *n = fnode(c, *x);
  if (ir_swaps_last_two(n) && fnode(c, n->in[0])->op == IR_PARAM && c->rg[n->in[0]] == c->rg[*x]) {
    *x = n->in[0];
    *t = !*t;
  }
}

/* C = op(A) op(B). With op = transpose where the flag says so:
 *   nn: dA = dC B^T      dB = A^T dC
 *   nt: dA = dC B        dB = dC^T A
 *   tn: dA = B dC^T      dB = A dC
 *   tt: dA = B^T dC^T    dB = dC^T A^T
 * then summed over batch dimensions the operand was broadcast along. */
static void adgrad_MATMUL(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int a = n->in[0], b = n->in[1], ta = (int)n->attr[0], tb = (int)n->attr[1];
  see_through(c, &a, &ta);
  see_through(c, &b, &tb);
  if (c->rg[a]) {
    int B = fv(c, b), g;
    if (!ta) g = matmul(c, dy, B, 0, !tb);
    else g = matmul(c, B, dy, tb, 1);
    acc(c, a, sum_to(c, g, a));
  }
  if (c->rg[b]) {
    int A = fv(c, a), g = -1;
    if (!ta) g = !tb ? matmul_tn_batch_folded(c, A, dy, b) : matmul_tn_batch_folded(c, dy, A, b);
    if (g >= 0) {
      acc(c, b, g);
      return;
    }
    if (!tb) g = matmul(c, A, dy, !ta, 0);
    else g = matmul(c, dy, A, 1, ta);
    acc(c, b, sum_to(c, g, b));
  }
}

/* dy reshaped to the input's rank with the reduced axis kept as 1 */
static int keep_axis(AdCtx *c, int g, int x, int64_t axis) {
  const IrNode *xn = fnode(c, x);
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, xn->dims, sizeof dims);
  dims[axis] = 1;
  return reshape_to(c, g, xn->rank, dims);
}

static int expand_to(AdCtx *c, int g, int like) {
  if (g < 0) return -1;
  const IrNode *t = fnode(c, like), *gn = &c->b->nodes[g];
  if (same_shape(gn->rank, gn->dims, t->rank, t->dims)) return g;
  return emit(c, IR_EXPAND, &g, 1, NULL, 0, 0, gn->dtype, t->rank, t->dims);
}

static void reduce_grad(AdCtx *c, int f, int dy, double scale) {
  int x = fin(c, f, 0);
  int g = keep_axis(c, dy, x, fnode(c, f)->attr[0]);
  if (scale != 1.0) g = bin(c, IR_MUL, g, cst(c, scale, fnode(c, f)->dtype));
  acc(c, x, expand_to(c, g, x));
}

static void adgrad_REDUCE_SUM(AdCtx *c, int f, int dy) { reduce_grad(c, f, dy, 1.0); }
static void adgrad_REDUCE_MEAN(AdCtx *c, int f, int dy) {
  reduce_grad(c, f, dy, 1.0 / (double)fnode(c, fin(c, f, 0))->dims[fnode(c, f)->attr[0]]);
}

/* dy goes to every element equal to the maximum: relu'(max - x) is 1 where
 * x is below it, so the mask is 1 - that. */
static void adgrad_REDUCE_MAX(AdCtx *c, int f, int dy) {
  int x = fin(c, f, 0);
  if (!c->rg[x]) return;
  int64_t axis = fnode(c, f)->attr[0];
  int e = expand_to(c, keep_axis(c, dy, x, axis), x);
  int below = act_grad(c, IR_RELU, 0, bin(c, IR_SUB, keep_axis(c, fv(c, f), x, axis), fv(c, x)), e);
  acc(c, x, bin(c, IR_SUB, e, below));
}

static void adgrad_EXPAND(AdCtx *c, int f, int dy) { acc(c, fin(c, f, 0), sum_to(c, dy, fin(c, f, 0))); }
static void adgrad_SUM_TO(AdCtx *c, int f, int dy) { acc(c, fin(c, f, 0), expand_to(c, dy, fin(c, f, 0))); }

/* SOFTMAX (b < 0) or one of the backward ops (y, dy), along `axis` */
static int axis_op(AdCtx *c, IrOp op, int a, int b, int64_t axis) {
  int in[2] = {a, b};
  return emit(c, op, in, op == IR_SOFTMAX ? 1 : 2, &axis, 1, 0, a >= 0 ? bdtype(c, a) : DT_F32, -1, NULL);
}

static int rsum_keep(AdCtx *c, int a, int64_t axis) {
  int64_t attr[2] = {axis, 1};
  return emit(c, IR_REDUCE_SUM, &a, 1, attr, 2, 0, a >= 0 ? bdtype(c, a) : DT_F32, -1, NULL);
}

static void adgrad_SOFTMAX(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), axis_op(c, IR_SOFTMAX_BWD, fv(c, f), dy, fnode(c, f)->attr[0]));
}

static void adgrad_LOG_SOFTMAX(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), axis_op(c, IR_LOG_SOFTMAX_BWD, fv(c, f), dy, fnode(c, f)->attr[0]));
}

/* out = y (d - s), s = sum(y d): linear in d (the Jacobian is symmetric);
 * for y: g (d - s) - d sum(g y). */
static void adgrad_SOFTMAX_BWD(AdCtx *c, int f, int dy) {
  int y = fin(c, f, 0), d = fin(c, f, 1);
  int64_t axis = fnode(c, f)->attr[0];
  if (c->rg[d]) acc(c, d, axis_op(c, IR_SOFTMAX_BWD, fv(c, y), dy, axis));
  if (c->rg[y]) {
    int Y = fv(c, y), D = fv(c, d);
    int s = rsum_keep(c, bin(c, IR_MUL, Y, D), axis), gy = rsum_keep(c, bin(c, IR_MUL, dy, Y), axis);
    acc(c, y, bin(c, IR_SUB, bin(c, IR_MUL, dy, bin(c, IR_SUB, D, s)), bin(c, IR_MUL, D, gy)));
  }
}

/* out = d - exp(y) sum(d): for d, g - sum(exp(y) g); for y, -g exp(y) sum(d). */
static void adgrad_LOG_SOFTMAX_BWD(AdCtx *c, int f, int dy) {
  int y = fin(c, f, 0), d = fin(c, f, 1);
  int64_t axis = fnode(c, f)->attr[0];
  int p = un(c, IR_EXP, fv(c, y));
  if (c->rg[d]) acc(c, d, bin(c, IR_SUB, dy, rsum_keep(c, bin(c, IR_MUL, p, dy), axis)));
  if (c->rg[y]) acc(c, y, un(c, IR_NEG, bin(c, IR_MUL, bin(c, IR_MUL, dy, p), rsum_keep(c, fv(c, d), axis))));
}

static void adgrad_RESHAPE(AdCtx *c, int f, int dy) {
  const IrNode *x = fnode(c, fin(c, f, 0));
  acc(c, fin(c, f, 0), reshape_to(c, dy, x->rank, x->dims));
}

static void adgrad_TRANSPOSE(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t inv[IR_NATTR];
  memset(inv, 0, sizeof inv);
  for (int i = 0; i < n->rank; i++) inv[n->attr[i]] = i;
  acc(c, n->in[0], emit(c, IR_TRANSPOSE, &dy, 1, inv, n->rank, 0, n->dtype, -1, NULL));
}

/* the slice's gradient is dy put back in place: dropped axes return as 1s */
static void adgrad_SLICE(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *x = fnode(c, n->in[0]);
  int64_t kept[IR_MAX_RANK], attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  for (int a = 0, j = 0; a < x->rank; a++) {
    kept[a] = n->attr[8 + a] ? 1 : n->dims[j++];
    attr[a] = n->attr[a];
  }
  int g = reshape_to(c, dy, x->rank, kept);
  acc(c, n->in[0], emit(c, IR_PAD, &g, 1, attr, 8, 0, n->dtype, x->rank, x->dims));
}

static void adgrad_PAD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *x = fnode(c, n->in[0]);
  int64_t attr[IR_NATTR];
  memset(attr, 0, sizeof attr);
  for (int a = 0; a < x->rank; a++) attr[a] = n->attr[a];
  acc(c, n->in[0], emit(c, IR_SLICE, &dy, 1, attr, 16, 0, n->dtype, x->rank, x->dims));
}

static void adgrad_CONCAT(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t at = 0, axis = n->attr[0];
  for (int k = 0; k < n->nin; k++) {
    const IrNode *x = fnode(c, n->in[k]);
    if (c->rg[n->in[k]]) {
      int64_t attr[IR_NATTR];
      memset(attr, 0, sizeof attr);
      attr[axis] = at;
      acc(c, n->in[k], emit(c, IR_SLICE, &dy, 1, attr, 16, 0, n->dtype, x->rank, x->dims));
    }
    at += x->dims[axis];
  }
}

static void adgrad_EMBEDDING(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *t = fnode(c, n->in[0]);
  if (!c->rg[n->in[0]]) return;
  int in[2] = {dy, fv(c, n->in[1])};
  acc(c, n->in[0], emit(c, IR_EMBEDDING_BWD, in, 2, n->attr, 1, 0, t->dtype, t->rank, t->dims));
}

/* linear in dy: the adjoint of a scatter-add is the gather */
static void adgrad_EMBEDDING_BWD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!c->rg[n->in[0]]) return;
  int in[2] = {dy, fv(c, n->in[1])};
  acc(c, n->in[0], emit(c, IR_EMBEDDING, in, 2, n->attr, 1, 0, n->dtype, -1, NULL));
}

/* masked entries are constants: their gradient is 0 */
static void adgrad_CAUSAL_MASK(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), emit(c, IR_CAUSAL_MASK, &dy, 1, fnode(c, f)->attr, 2, 0.0, fnode(c, f)->dtype, -1, NULL));
}

/* a rotation's adjoint is its inverse */
static void adgrad_ROPE(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t attr[9];
  memcpy(attr, n->attr, sizeof attr); /* the positions, YaRN's settings and the layout kept */
  attr[0] = !n->attr[0];
  acc(c, n->in[0], emit(c, IR_ROPE, &dy, 1, attr, 9, n->fattr, n->dtype, -1, NULL));
}

static void adgrad_REPEAT_KV(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), emit(c, IR_REPEAT_KV_BWD, &dy, 1, fnode(c, f)->attr, 1, 0, fnode(c, f)->dtype, -1, NULL));
}

/* The padded columns carry no gradient. Where cross-entropies alone read
 * the masked logits, dy is zero there already (their probability,
 * exp(-inf - lse), is 0 and no target is a padded column), so it passes
 * as it is: no second pass over [tokens, vocab], and the logits' gradient
 * goes straight to the head's GEMMs (stored in 16 bits where it is made,
 * precision.h). */
static void adgrad_VOCAB_MASK(AdCtx *c, int f, int dy) {
  int other = 0;
  for (int i = 0; i < c->f->nnodes && !other; i++)
    for (int k = 0; k < c->f->nodes[i].nin; k++)
      other |= c->f->nodes[i].in[k] == f && c->f->nodes[i].op != IR_CROSS_ENTROPY;
  for (int k = 0; k < c->f->noutputs; k++) other |= c->f->outputs[k] == f;
  if (!other) {
    acc(c, fin(c, f, 0), dy);
    return;
  }
  acc(c, fin(c, f, 0), emit(c, IR_VOCAB_MASK, &dy, 1, fnode(c, f)->attr, 2, 0.0, fnode(c, f)->dtype, -1, NULL));
}

static void adgrad_REPEAT_KV_BWD(AdCtx *c, int f, int dy) {
  acc(c, fin(c, f, 0), emit(c, IR_REPEAT_KV, &dy, 1, fnode(c, f)->attr, 1, 0, fnode(c, f)->dtype, -1, NULL));
}

static void adgrad_CROSS_ENTROPY(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!c->rg[n->in[0]]) return;
  int in[3] = {fv(c, n->in[0]), fv(c, n->in[1]), dy};
  acc(c, n->in[0], emit(c, IR_CROSS_ENTROPY_BWD, in, 3, NULL, 0, 0, n->dtype, -1, NULL));
}

/* out = dl / P (softmax(l) - onehot(t)): for dl, sum(g out|dl=1); for l,
 * dl / P times softmax's backward of g. */
static void adgrad_CROSS_ENTROPY_BWD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *l = fnode(c, n->in[0]), *t = fnode(c, n->in[1]);
  double inv_p = 1.0 / (double)ir_numel(t);
  int64_t axis = l->rank - 1;
  if (c->rg[n->in[2]]) {
    int in[3] = {fv(c, n->in[0]), fv(c, n->in[1]), cst(c, 1.0, bdtype(c, dy))};
    int unit = emit(c, IR_CROSS_ENTROPY_BWD, in, 3, NULL, 0, 0, n->dtype, -1, NULL);
    int64_t flat = ir_numel(n), zero[2] = {0, 0};
    int prod = reshape_to(c, bin(c, IR_MUL, dy, unit), 1, &flat);
    acc(c, n->in[2], emit(c, IR_REDUCE_SUM, &prod, 1, zero, 2, 0, n->dtype, -1, NULL));
  }
  if (c->rg[n->in[0]]) {
    int p = axis_op(c, IR_SOFTMAX, fv(c, n->in[0]), -1, axis);
    int sb = axis_op(c, IR_SOFTMAX_BWD, p, dy, axis);
    int scale = bin(c, IR_MUL, fv(c, n->in[2]), cst(c, inv_p, n->dtype));
    acc(c, n->in[0], bin(c, IR_MUL, sb, scale));
  }
}

/* the same mask (same stream, layer and elements) scales dy */
static void adgrad_DROPOUT(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  acc(c, n->in[0], emit(c, IR_DROPOUT, &dy, 1, n->attr, 1, n->fattr, n->dtype, -1, NULL));
}

static void adgrad_CAST(AdCtx *c, int f, int dy) {
  const IrNode *x = fnode(c, fin(c, f, 0));
  acc(c, fin(c, f, 0), emit(c, IR_CAST, &dy, 1, NULL, 0, 0, x->dtype, -1, NULL));
}

/* An extern: its gradient function, called once, yields every argument's
 * gradient in one buffer (EXTERN_GRAD); each argument takes its piece.
 * Without a gradient function nothing flows back: the arguments' gradients
 * stay zero (docs/language.md, "Extern"). */
static void adgrad_EXTERN(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  const IrExtern *e = &c->m->externs[n->attr[0]];
  int any = 0;
  for (int k = 0; k < n->nin; k++) any |= c->rg[n->in[k]];
  if (!e->grad || !any) return;
  int *in = malloc(sizeof(int) * (size_t)(n->nin + 1));
  if (!in) abort();
  for (int k = 0; k < n->nin; k++) in[k] = fv(c, n->in[k]);
  in[n->nin] = dy;
  int flat = emit(c, IR_EXTERN_GRAD, in, n->nin + 1, n->attr, 1, 0, DT_F32, -1, NULL);
  free(in);
  int64_t at = 0;
  for (int k = 0; k < n->nin; k++) {
    const IrNode *x = fnode(c, n->in[k]);
    int64_t len = ir_numel(x);
    if (c->rg[n->in[k]]) {
      int piece = flat;
      if (n->nin > 1) {
        int64_t attr[IR_NATTR];
        memset(attr, 0, sizeof attr);
        attr[0] = at;
        piece = emit(c, IR_SLICE, &flat, 1, attr, 16, 0, DT_F32, 1, &len);
      }
      acc(c, n->in[k], reshape_to(c, piece, x->rank, x->dims));
    }
    at += len;
  }
}

/* The ATTN_MERGE that reads ring block attention f, or -1. */
static int merge_of(AdCtx *c, int f) {
  for (int i = f + 1; i < c->f->nnodes; i++) {
    const IrNode *m = fnode(c, i);
    if (m->op != IR_ATTN_MERGE) continue;
    for (int k = 0; k < m->nin; k++)
      if (m->in[k] == f) return i;
  }
  return -1;
}

/* Ring attention's merge (ir_ops.h): each block is given the merged
 * output's gradient, which its ATTENTION_BWD takes against the merged
 * output (adgrad_ATTENTION) - exactly the block's share of the whole
 * attention's gradient, with no block's output kept for it. */
static void adgrad_ATTN_MERGE(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  for (int k = 0; k < n->nin; k++) {
    const IrNode *a = fnode(c, n->in[k]);
    if (a->op != IR_ATTENTION || a->attr[4] <= 0) {
      set_err(c, "attn_merge reads something other than an attention over one ring block");
      return;
    }
    acc(c, n->in[k], dy);
  }
}

/* Flash attention's backward reads the packed output (its log-sum-exp
 * column) instead of stored scores, and gives dq, dk and dv in one flat
 * value (ir_ops.h), sliced apart here as an extern's gradients are. */
static void adgrad_ATTENTION(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!c->rg[n->in[0]] && !c->rg[n->in[1]] && !c->rg[n->in[2]]) return;
  /* one ring block merged with the others: its backward reads the merged
   * output, whose gradient dy is (ATTN_MERGE's contract, ir_ops.h) */
  int out = n->attr[4] > 0 ? merge_of(c, f) : -1;
  int in[5] = {fv(c, n->in[0]), fv(c, n->in[1]), fv(c, n->in[2]), fv(c, out >= 0 ? out : f), dy};
  int flat = emit(c, IR_ATTENTION_BWD, in, 5, n->attr, 6, n->fattr, DT_F32, -1, NULL);
  int64_t at = 0;
  for (int k = 0; k < 3; k++) {
    const IrNode *x = fnode(c, n->in[k]);
    int64_t len = ir_numel(x);
    if (c->rg[n->in[k]]) {
      int64_t attr[IR_NATTR];
      memset(attr, 0, sizeof attr);
      attr[0] = at;
      acc(c, n->in[k], reshape_to(c, emit(c, IR_SLICE, &flat, 1, attr, 16, 0, DT_F32, 1, &len), x->rank, x->dims));
    }
    at += len;
  }
}

static void adgrad_ATTENTION_BWD(AdCtx *c, int f, int dy) {
  (void)f, (void)dy;
  set_err(c, "the gradient of attention's backward (a second derivative) is not defined");
}

/* ---- convolutional networks: each of the three convolution ops is linear
 * in each operand, and each is another's adjoint (ir_ops.h), so every
 * gradient is one of the three with the same attributes:
 *   y = conv(x, w):          dx = bwd_data(dy, w),   dw = bwd_filter(x, dy)
 *   dx = bwd_data(dy, w):    d dy = conv(g, w),       dw = bwd_filter(g, dy)
 *   dw = bwd_filter(x, dy):  dx = bwd_data(dy, g),    d dy = conv(x, g) */
static int conv_op(AdCtx *c, IrOp op, int a, int b, const IrNode *like) {
  int in[2] = {a, b};
  return emit(c, op, in, 2, like->attr, CONV_NATTR, 0, like->dtype, -1, NULL);
}

static void adgrad_CONV2D(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int x = fin(c, f, 0), w = fin(c, f, 1);
  if (c->rg[x]) acc(c, x, conv_op(c, IR_CONV2D_BWD_DATA, dy, fv(c, w), n));
  if (c->rg[w]) acc(c, w, conv_op(c, IR_CONV2D_BWD_FILTER, fv(c, x), dy, n));
}

static void adgrad_CONV2D_BWD_DATA(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int d = fin(c, f, 0), w = fin(c, f, 1);
  if (c->rg[d]) acc(c, d, conv_op(c, IR_CONV2D, dy, fv(c, w), n));
  if (c->rg[w]) acc(c, w, conv_op(c, IR_CONV2D_BWD_FILTER, dy, fv(c, d), n));
}

static void adgrad_CONV2D_BWD_FILTER(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int x = fin(c, f, 0), d = fin(c, f, 1);
  if (c->rg[x]) acc(c, x, conv_op(c, IR_CONV2D_BWD_DATA, fv(c, d), dy, n));
  if (c->rg[d]) acc(c, d, conv_op(c, IR_CONV2D, fv(c, x), dy, n));
}

/* Pooling's gradient is pool2d_bwd(x, dy); an average's backward is linear
 * in dy with the pooling itself as its adjoint, a max's depends on where
 * the maxima are (its own derivative is not defined here). */
static void adgrad_POOL2D(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int x = fin(c, f, 0), in[2] = {fv(c, x), dy};
  if (c->rg[x]) acc(c, x, emit(c, IR_POOL2D_BWD, in, 2, n->attr, POOL_NATTR, 0, n->dtype, -1, NULL));
}

static void adgrad_POOL2D_BWD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int d = fin(c, f, 1);
  if (!c->rg[d]) return;
  if (n->attr[POOL_A_MODE] != POOL_AVG && n->attr[POOL_A_MODE] != POOL_ADAPTIVE_AVG) {
    set_err(c, "the gradient of max pooling's backward (a second derivative) is not defined");
    return;
  }
  acc(c, d, emit(c, IR_POOL2D, &dy, 1, n->attr, POOL_NATTR, 0, n->dtype, -1, NULL));
}

/* A state update passes x through: dy goes to x, nothing to the value (a
 * statistic, not a function the loss depends on) or the state. */
static void adgrad_STATE_UPDATE(AdCtx *c, int f, int dy) {
  if (c->rg[fin(c, f, 0)]) acc(c, fin(c, f, 0), dy);
}

/* The gradient function has no derivative of its own. */
static void adgrad_EXTERN_GRAD(AdCtx *c, int f, int dy) {
  (void)f, (void)dy;
  set_err(c, "the gradient of an extern's gradient function is not defined");
}

/* A repeat: the BACKWARD call of B.grad undoes the SAVE call of B.fwd that
 * replaced this node in the step graph (see autodiff.h). It also yields the
 * block's parameter gradients, so it runs even when argument 0 needs none. */
static void adgrad_CALL(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (c->lazy) {
    set_err(c, "a repeat inside a repeated block cannot be differentiated");
    return;
  }
  for (int k = 1; k < n->nin; k++)
    if (c->rg[n->in[k]]) {
      set_err(c, arena_printf(c->m->arena,
                              "argument %d of repeated block %s depends on parameters; only argument 0 gets a gradient",
                              k + 1, c->m->graphs[n->attr[0]]->name));
      return;
    }
  const IrNode *x = fnode(c, n->in[0]);
  int64_t blk = n->attr[0], count = n->attr[1], first = n->attr[3], pol = ad_policy_layers(c->res, count);
  int g = dy;
  if (pol < count) { /* the kept layers first (the last ones), undoing the step's second SAVE call */
    int in[2] = {g, c->map[f]};
    int64_t attr[4] = {c->res->grad_keep[blk], count - pol, IR_CALL_BACKWARD, first + pol};
    g = emit(c, IR_CALL, in, 2, attr, 4, 0, x->dtype, x->rank, x->dims);
  }
  /* the policy's layers (pol >= 1: ad_policy_layers), undoing the first SAVE call or the only one */
  int in[2] = {g, pol < count ? c->split_first[f] : c->map[f]};
  int64_t attr[4] = {c->res->grad[blk], pol, IR_CALL_BACKWARD, first};
  g = emit(c, IR_CALL, in, 2, attr, 4, 0, x->dtype, x->rank, x->dims);
  acc(c, n->in[0], g);
}

/* Collectives of the partitioned program (spmd.h). The gradient of a
 * replicated value is the full gradient on every rank; of a split value,
 * this rank's chunk. So:
 *   ALL_REDUCE (g of Megatron)  -> identity (none for a max used as a shift)
 *   COPY_TO_GROUP (f)           -> ALL_REDUCE of the partial gradients
 *   ALL_GATHER                  -> SHARD_SLICE, or REDUCE_SCATTER when its
 *                                  consumers leave the gradient partial
 *   REDUCE_SCATTER, SHARD_SLICE -> ALL_GATHER */
static void adgrad_ALL_REDUCE(AdCtx *c, int f, int dy) {
  if (!fnode(c, f)->attr[3]) acc(c, fin(c, f, 0), dy);
}

static int comm(AdCtx *c, IrOp op, int x, const IrNode *like, const int64_t *attr) {
  return emit(c, op, &x, x < 0 ? 0 : 1, attr, 2, 0, like->dtype, like->rank, like->dims);
}

static int comm4(AdCtx *c, IrOp op, int x, const IrNode *like, const int64_t *attr) {
  return emit(c, op, &x, 1, attr, 4, 0, like->dtype, like->rank, like->dims);
}

static void adgrad_ALL_GATHER(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t attr[4] = {n->attr[0], n->attr[1], n->attr[2], 0};
  acc(c, fin(c, f, 0), comm4(c, n->attr[3] ? IR_REDUCE_SCATTER : IR_SHARD_SLICE, dy, fnode(c, fin(c, f, 0)), attr));
}

static void adgrad_REDUCE_SCATTER(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t attr[4] = {n->attr[0], n->attr[1], n->attr[2], 0};
  acc(c, fin(c, f, 0), comm4(c, IR_ALL_GATHER, dy, fnode(c, fin(c, f, 0)), attr));
}

static void adgrad_SHARD_SLICE(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t attr[4] = {n->attr[0], n->attr[1], n->attr[2], 0};
  acc(c, fin(c, f, 0), comm4(c, IR_ALL_GATHER, dy, fnode(c, fin(c, f, 0)), attr));
}

/* the exchange undone: chunks back along the concat axis, to their senders */
static void adgrad_ALL_TO_ALL(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *x = fnode(c, fin(c, f, 0));
  int64_t attr[3] = {n->attr[0], n->attr[2], n->attr[1]};
  acc(c, fin(c, f, 0), emit(c, IR_ALL_TO_ALL, &dy, 1, attr, 3, 0, x->dtype, x->rank, x->dims));
}

static void adgrad_COPY_TO_GROUP(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int64_t attr[4] = {n->attr[0], 0, 0, 0};
  acc(c, fin(c, f, 0), comm4(c, IR_ALL_REDUCE, dy, n, attr));
}

static void adgrad_PICK(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f), *z = fnode(c, fin(c, f, 0));
  if (!c->rg[fin(c, f, 0)]) return;
  int in[2] = {dy, fv(c, fin(c, f, 1))};
  acc(c, fin(c, f, 0), emit(c, IR_PICK_BWD, in, 2, n->attr, 1, 0, z->dtype, z->rank, z->dims));
}

static void adgrad_PICK_BWD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!c->rg[fin(c, f, 0)]) return;
  int in[2] = {dy, fv(c, fin(c, f, 1))};
  acc(c, fin(c, f, 0), emit(c, IR_PICK, in, 2, n->attr, 1, 0, n->dtype, -1, NULL));
}

/* Integer results carry no gradient: topk's positions, and one_hot of integer indices. */
static void adgrad_TOPK(AdCtx *c, int f, int dy) { (void)c, (void)f, (void)dy; }
static void adgrad_ONE_HOT(AdCtx *c, int f, int dy) { (void)c, (void)f, (void)dy; }

/* take gathers: its gradient scatters dy back into the taken positions (adding
 * where a position was taken twice); topk values are take(x, topk(x)) */
static void adgrad_TAKE(AdCtx *c, int f, int dy) {
  const IrNode *x = fnode(c, fin(c, f, 0));
  if (!c->rg[fin(c, f, 0)]) return;
  int in[2] = {dy, fv(c, fin(c, f, 1))};
  acc(c, fin(c, f, 0), emit(c, IR_TAKE_BWD, in, 2, NULL, 0, 0, x->dtype, x->rank, x->dims));
}

/* linear in dy: the adjoint of the scatter-add is the gather */
static void adgrad_TAKE_BWD(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!c->rg[fin(c, f, 0)]) return;
  int in[2] = {dy, fv(c, fin(c, f, 1))};
  acc(c, fin(c, f, 0), emit(c, IR_TAKE, in, 2, NULL, 0, 0, n->dtype, -1, NULL));
}

/* Mixture of experts (ir_ops.h): dispatch, combine and the gate gradient are
 * each other's adjoints, so the backward uses the same three ops. `packed`
 * (E >= 1): their dropless form over [B T K, C] rows (cap 0 on the dispatch). */
static int moe_op(AdCtx *c, IrOp op, int a, int b, int idx, int64_t experts, int64_t cap, int64_t packed, DType dt) {
  int in[3] = {a, b, idx};
  int64_t attr[2] = {packed ? packed : experts, packed ? 0 : cap};
  if (op == IR_MOE_DISPATCH || op == IR_MOE_COMBINE) in[1] = idx, in[2] = b;
  return emit(c, op, in, 3, attr, op == IR_MOE_DISPATCH || packed ? 2 : 0, 0, dt, -1, NULL);
}

/* the E of a packed op (0 for the slots' form): y is input yi */
static int64_t moe_packed(AdCtx *c, int f, int yi) {
  const IrNode *n = fnode(c, f);
  int packed = n->op == IR_MOE_DISPATCH ? n->attr[1] == 0 : fnode(c, fin(c, f, yi))->rank == 2;
  return packed ? n->attr[0] : 0;
}

/* y = dispatch(x, idx, w): dx = combine(dy, idx, w), dw = gate_grad(x, dy, idx) */
static void adgrad_MOE_DISPATCH(AdCtx *c, int f, int dy) {
  int x = fin(c, f, 0), idx = fv(c, fin(c, f, 1)), w = fin(c, f, 2);
  const IrNode *n = fnode(c, f);
  int64_t p = moe_packed(c, f, 0);
  if (c->rg[x]) acc(c, x, moe_op(c, IR_MOE_COMBINE, dy, fv(c, w), idx, 0, 0, p, n->dtype));
  if (c->rg[w]) acc(c, w, moe_op(c, IR_MOE_GATE_GRAD, fv(c, x), dy, idx, 0, 0, p, fnode(c, w)->dtype));
}

/* out = combine(y, idx, w): dy = dispatch(dout, idx, w), dw = gate_grad(dout, y, idx) */
static void adgrad_MOE_COMBINE(AdCtx *c, int f, int dy) {
  int y = fin(c, f, 0), idx = fv(c, fin(c, f, 1)), w = fin(c, f, 2);
  const IrNode *yn = fnode(c, y);
  int64_t p = moe_packed(c, f, 0);
  if (c->rg[y]) acc(c, y, moe_op(c, IR_MOE_DISPATCH, dy, fv(c, w), idx, yn->dims[1], yn->dims[2], p, yn->dtype));
  if (c->rg[w]) acc(c, w, moe_op(c, IR_MOE_GATE_GRAD, dy, fv(c, y), idx, 0, 0, p, fnode(c, w)->dtype));
}

/* g = gate_grad(a, y, idx), bilinear: da = combine(y, idx, dg), dy = dispatch(a, idx, dg) */
static void adgrad_MOE_GATE_GRAD(AdCtx *c, int f, int dy) {
  int a = fin(c, f, 0), y = fin(c, f, 1), idx = fv(c, fin(c, f, 2));
  const IrNode *yn = fnode(c, y);
  int64_t p = moe_packed(c, f, 1);
  if (c->rg[a]) acc(c, a, moe_op(c, IR_MOE_COMBINE, fv(c, y), dy, idx, 0, 0, p, fnode(c, a)->dtype));
  if (c->rg[y]) acc(c, y, moe_op(c, IR_MOE_DISPATCH, fv(c, a), dy, idx, yn->dims[1], yn->dims[2], p, yn->dtype));
}

static void adgrad_MOE_EXPERT_IDS(AdCtx *c, int f, int dy) { (void)c, (void)f, (void)dy; }

/* out = grouped_mm(a, w, ids): da = grouped_mm(dy, w, ids) with w the other way
 * round; dw = grouped_mm_wgrad(a, dy) ([E, X, Y]), or (dy, a) for a transposed w */
static void adgrad_GROUPED_MM(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int a = fin(c, f, 0), w = fin(c, f, 1), ids = fv(c, fin(c, f, 2)), t = n->attr[0] != 0;
  const IrNode *wn = fnode(c, w);
  if (c->rg[a]) {
    int in[3] = {dy, fv(c, w), ids};
    int64_t attr[1] = {!t};
    acc(c, a, emit(c, IR_GROUPED_MM, in, 3, attr, 1, 0, fnode(c, a)->dtype, -1, NULL));
  }
  if (c->rg[w]) {
    int in[3] = {t ? dy : fv(c, a), t ? fv(c, a) : dy, ids};
    int64_t attr[1] = {wn->dims[0]};
    acc(c, w, emit(c, IR_GROUPED_MM_WGRAD, in, 3, attr, 1, 0, wn->dtype, -1, NULL));
  }
}

static void adgrad_GROUPED_MM_WGRAD(AdCtx *c, int f, int dy) {
  (void)f, (void)dy;
  set_err(c, "the gradient of grouped_mm_wgrad (a second derivative) is not defined");
}

/* x passes through; the auxiliary loss v gets weight x the backward's seed,
 * the gradient it would have as a term weight v of the loss */
static void adgrad_AUX_LOSS(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  int x = fin(c, f, 0), v = fin(c, f, 1);
  if (c->rg[x]) acc(c, x, dy);
  if (c->rg[v]) {
    int seed = emit(c, IR_LOSS_SEED, NULL, 0, NULL, 0, 0, DT_F32, 0, NULL);
    acc(c, v, bin(c, IR_MUL, seed, cst(c, n->fattr, DT_F32)));
  }
}

static void adgrad_LOSS_SEED(AdCtx *c, int f, int dy) { (void)c, (void)f, (void)dy; }
/* The fused head and loss (ir_ops.h): each gradient recomputes the logits in
 * blocks from x, w and the row's log-sum-exp (nll + the target's logit);
 * the CPU back end computes the pair in one pass (fuse.c). */
/* x and w's gradients of LINEAR_CE (inputs x, w, t) or LINEAR_LSE (x, w):
 * the op's inputs, its own output and dy */
static void linear_grads(AdCtx *c, int f, int dy, IrOp bwd, IrOp bwd_w) {
  const IrNode *n = fnode(c, f);
  int in[5], k = 0;
  for (; k < n->nin; k++) in[k] = fv(c, n->in[k]);
  in[k++] = fv(c, f);
  in[k++] = dy;
  if (c->rg[n->in[0]]) acc(c, n->in[0], emit(c, bwd, in, k, n->attr, 3, 0, DT_F32, -1, NULL));
  if (c->rg[n->in[1]]) acc(c, n->in[1], emit(c, bwd_w, in, k, n->attr, 3, 0, DT_F32, -1, NULL));
}

static void adgrad_LINEAR_CE(AdCtx *c, int f, int dy) { linear_grads(c, f, dy, IR_LINEAR_CE_BWD, IR_LINEAR_CE_BWD_W); }

static void adgrad_LINEAR_CE_BWD(AdCtx *c, int f, int dy) {
  (void)f, (void)dy;
  set_err(c, "the gradient of linear_ce's backward (a second derivative) is not defined");
}

static void adgrad_LINEAR_CE_BWD_W(AdCtx *c, int f, int dy) { adgrad_LINEAR_CE_BWD(c, f, dy); }

static void adgrad_LINEAR_LSE(AdCtx *c, int f, int dy) { linear_grads(c, f, dy, IR_LINEAR_LSE_BWD, IR_LINEAR_LSE_BWD_W); }

static void adgrad_LINEAR_LSE_BWD(AdCtx *c, int f, int dy) {
  (void)f, (void)dy;
  set_err(c, "the gradient of linear_lse's backward (a second derivative) is not defined");
}

static void adgrad_LINEAR_LSE_BWD_W(AdCtx *c, int f, int dy) { adgrad_LINEAR_LSE_BWD(c, f, dy); }

static void adgrad_TRAINING(AdCtx *c, int f, int dy) { (void)c, (void)f, (void)dy; }

/* SEND's result carries no gradient (dy is ignored): dx comes back from the
 * peer it was sent to. Runs for every float SEND, so that the peer's
 * gradient message is always taken. */
static void adgrad_SEND(AdCtx *c, int f, int dy) {
  (void)dy;
  const IrNode *x = fnode(c, fin(c, f, 0));
  if (!sem_dtype_is_float(x->dtype)) return;
  int r = emit(c, IR_RECV, NULL, 0, fnode(c, f)->attr, 2, 0, x->dtype, x->rank, x->dims);
  acc(c, fin(c, f, 0), r);
}

/* dy goes back to the sender; zeros when the value was not used */
static void adgrad_RECV(AdCtx *c, int f, int dy) {
  const IrNode *n = fnode(c, f);
  if (!sem_dtype_is_float(n->dtype)) return;
  if (dy < 0) dy = fill(c, 0.0, n->dtype, n->rank, n->dims);
  comm(c, IR_SEND, dy, n, n->attr);
}

static const GradRule grad_rules[] = {
#define X(id, name, nin, flags) adgrad_##id,
    IR_OPS(X)
#undef X
};

/* ---- driving the rules ---- */

static int graph_has_params(const IrGraph *g) {
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == IR_PARAM && sem_dtype_is_float(g->nodes[i].dtype)) return 1;
  return 0;
}

/* rg: the node's value depends on a parameter (or on argument 0 of a
 * block), so the loss has a gradient with respect to it. */
static void requires_grad(AdCtx *c, int block) {
  for (int i = 0; i < c->f->nnodes; i++) {
    const IrNode *n = fnode(c, i);
    int r = 0;
    if (n->op == IR_PARAM || n->op == IR_RECV) r = 1;
    else if (n->op == IR_ARG) r = block && n->attr[0] == 0;
    else if (n->op == IR_CALL) r = graph_has_params(c->m->graphs[n->attr[0]]);
    for (int k = 0; k < n->nin; k++) r |= c->rg[n->in[k]];
    c->rg[i] = (char)(r && sem_dtype_is_float(n->dtype));
  }
}

static void backward_pass(AdCtx *c) {
  for (int i = c->f->nnodes - 1; i >= 0 && !c->err; i--) {
    const IrNode *n = fnode(c, i);
    int always = (n->op == IR_SEND || n->op == IR_RECV) && sem_dtype_is_float(n->dtype);
    if (c->grad[i] >= 0 || always) grad_rules[n->op](c, i, c->grad[i]);
  }
}

/* The gradient outputs: per float parameter the forward graph uses, one per
 * gradient flowing into its PARAM nodes (a tied table has two: the head's
 * and the lookup's), which the graph's caller adds into the parameter's
 * gradient (ir.h); zeros when the loss does not depend on it. */
static void param_outputs(AdCtx *c, int **outs, int *nouts) {
  int cap = c->m->nparams + c->nparts + 1;
  int *list = arena_alloc(c->m->arena, sizeof(int) * (size_t)cap), n = 0;
  int *all = arena_alloc(c->m->arena, sizeof(int) * (size_t)(*nouts + cap));
  memcpy(all, *outs, sizeof(int) * (size_t)*nouts);
  *outs = all;
  for (int p = 0; p < c->m->nparams; p++) {
    int seen = 0, made = 0;
    for (int i = 0; i < c->f->nnodes; i++) {
      const IrNode *x = fnode(c, i);
      if (x->op != IR_PARAM || x->attr[0] != p || !sem_dtype_is_float(x->dtype)) continue;
      seen = 1;
      for (int k = 0; k < c->nparts; k++)
        if (c->part_node[k] == i) {
          list[n++] = p;
          (*outs)[(*nouts)++] = c->part_grad[k];
          made = 1;
        }
    }
    if (!seen || made) continue;
    const IrParam *ip = &c->m->params[p];
    list[n++] = p;
    (*outs)[(*nouts)++] = fill(c, 0.0, ip->dtype, ip->rank, ip->dims);
  }
  c->b->grad_params = list;
  c->b->ngrad_params = n;
}

/* Drops nodes nothing needs. Roots: the outputs and the nodes with effects
 * (calls, which move activations and gradients; sends and receives). */
static void prune(IrGraph *b) {
  char *live = calloc((size_t)b->nnodes + 1, 1);
  int *renum = calloc((size_t)b->nnodes + 1, sizeof(int));
  if (!live || !renum) abort();
  for (int k = 0; k < b->noutputs; k++) live[b->outputs[k]] = 1;
  for (int i = b->nnodes - 1; i >= 0; i--) {
    IrNode *n = &b->nodes[i];
    if (n->op == IR_CALL || n->op == IR_SEND || n->op == IR_RECV) live[i] = 1;
    if (live[i])
      for (int k = 0; k < n->nin; k++) live[n->in[k]] = 1;
  }
  int j = 0, split = b->fb_split;
  for (int i = 0; i < b->nnodes; i++) {
    if (i == split) b->fb_split = j; /* the forward/backward cut moves with the nodes */
    if (!live[i]) continue;
    renum[i] = j;
    b->nodes[j] = b->nodes[i];
    for (int k = 0; k < b->nodes[j].nin; k++) b->nodes[j].in[k] = renum[b->nodes[j].in[k]];
    j++;
  }
  if (split >= b->nnodes) b->fb_split = j;
  b->nnodes = j;
  for (int k = 0; k < b->noutputs; k++) b->outputs[k] = renum[b->outputs[k]];
  free(live);
  free(renum);
}

/* The ops of the attention core, from the QK^T matmul through the softmax
 * to the matmul with V: a softmax whose input comes from a matmul through
 * elementwise ops of the same shape (scale, mask, bias) and whose output
 * reaches a matmul's left operand (directly or through dropout). */
static void attention_core(const IrGraph *g, char *core) {
  if (g->nnodes <= 0) return;
  int *users = calloc((size_t)g->nnodes, sizeof(int)), *user = calloc((size_t)g->nnodes, sizeof(int));
  if (!users || !user) abort();
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) {
      users[g->nodes[i].in[k]]++;
      user[g->nodes[i].in[k]] = i;
    }
  int *path = calloc((size_t)g->nnodes + 1, sizeof(int));
  if (!path) abort();
  for (int s = 0; s < g->nnodes; s++) {
    const IrNode *sm = &g->nodes[s];
    if (sm->op != IR_SOFTMAX) continue;
    int np = 0, x = sm->in[0], m1 = -1, m2 = -1;
    path[np++] = s;
    while (x >= 0) {
      const IrNode *n = &g->nodes[x];
      if (n->op == IR_MATMUL) {
        m1 = x;
        break;
      }
      int next = -1;
      if (n->op == IR_CAUSAL_MASK || n->op == IR_DROPOUT || n->op == IR_CAST) {
        next = n->in[0];
      } else if (n->op == IR_MUL || n->op == IR_DIV || n->op == IR_ADD || n->op == IR_SUB) {
        /* follow the operand of the softmax's shape; the other is small */
        for (int k = 0; k < 2; k++) {
          const IrNode *o = &g->nodes[n->in[k]];
          if (same_shape(o->rank, o->dims, sm->rank, sm->dims)) next = next < 0 ? n->in[k] : -2;
        }
        if (next == -2) next = -1;
      }
      if (next >= 0) path[np++] = x;
      x = next;
    }
    int y = s;
    while (m1 >= 0 && users[y] == 1) {
      const IrNode *u = &g->nodes[user[y]];
      if (u->op == IR_MATMUL && u->in[0] == y) {
        m2 = user[y];
        break;
      }
      if (u->op != IR_DROPOUT && u->op != IR_CAST) break;
      y = user[y];
      path[np++] = y;
    }
    if (m1 < 0 || m2 < 0) continue;
    core[m1] = core[m2] = 1;
    for (int k = 0; k < np; k++) core[path[k]] = 1;
  }
  free(users);
  free(user);
  free(path);
}

int ad_selective_recomputes(const IrModule *m) {
  int any = 0;
  for (int gi = 0; gi < m->ngraphs && !any; gi++) {
    const IrGraph *g = m->graphs[gi];
    char *core = calloc((size_t)g->nnodes + 1, 1);
    if (!core) abort();
    attention_core(g, core);
    for (int i = 0; i < g->nnodes && !any; i++) any = core[i];
    free(core);
  }
  return any;
}

static void ctx_init(AdCtx *c, IrModule *m, AdResult *res, const IrGraph *f, IrGraph *b) {
  memset(c, 0, sizeof *c);
  c->m = m;
  c->res = res;
  c->f = f;
  c->b = b;
  size_t n = (size_t)f->nnodes + 1;
  c->map = arena_alloc(m->arena, sizeof(int) * n);
  c->grad = arena_alloc(m->arena, sizeof(int) * n);
  c->rg = arena_alloc(m->arena, n);
  c->recomp = arena_alloc(m->arena, n);
  c->saved = arena_alloc(m->arena, sizeof(int) * n);
  for (size_t i = 0; i < n; i++) c->map[i] = c->grad[i] = -1;
}

/* Per node, 1 when it is a weight: a parameter, or one seen through the
 * identities, views, casts and gathers the partitioner and the precision
 * pass put on it. The caller frees it. */
static char *weight_mask(const IrGraph *g) {
  char *w = calloc((size_t)g->nnodes + 1, 1);
  if (!w) abort();
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    w[i] = n->op == IR_PARAM ||
           (n->nin == 1 && w[n->in[0]] &&
            (n->op == IR_COPY_TO_GROUP || n->op == IR_RESHAPE || n->op == IR_TRANSPOSE || n->op == IR_CAST ||
             n->op == IR_SLICE || n->op == IR_ALL_GATHER));
  }
  return w;
}

/* recompute = ops, torchtitan's op-level selective activation checkpointing
 * (its `_save_list` policy): a block keeps the outputs of its attention
 * kernels, of its collectives (a recomputation would repeat the
 * communication) and of every other GEMM with a weight operand (the 1st,
 * 3rd, ... in program order), and recomputes everything else - norms,
 * activations, rotary embeddings, the other GEMMs - from them. What is kept
 * is saved only if the backward reads it (fv is lazy). */
static void ops_policy(const IrGraph *g, const char *weight, char *recomp) {
  int weight_gemms = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    /* ring blocks' attention (cp_comm = ring): their merge is kept, which their backward reads */
    int keep = (n->op == IR_ATTENTION && n->attr[4] <= 0) || n->op == IR_ATTN_MERGE || (ir_op_flags(n->op) & IRF_COMM);
    if (n->op == IR_MATMUL && (weight[n->in[0]] || weight[n->in[1]])) keep = weight_gemms++ % 2 == 0;
    recomp[i] = !keep;
  }
}

/* ZeRO-3 (dpsync.h): a parameter read through an all-gather over dp is
 * gathered again in the backward instead of kept per layer (the point of
 * holding pieces); marks the gather and the slice / reshape after it. */
static void zero3_regather(const IrGraph *g, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    const IrNode *x = n->nin == 1 ? &g->nodes[n->in[0]] : NULL;
    if (n->op == IR_ALL_GATHER && n->attr[0] == IRG_DP && x && x->op == IR_PARAM) recomp[i] = 1;
    else if ((n->op == IR_SLICE || n->op == IR_RESHAPE) && x && x->op == IR_ALL_GATHER && recomp[n->in[0]]) recomp[i] = 1;
    else if (n->op == IR_RESHAPE && x && x->op == IR_SLICE && recomp[n->in[0]]) recomp[i] = 1;
  }
}

/* Context parallelism: the keys and values a rank received around the ring
 * (or gathered, under cp_comm = allgather) are received again in the backward
 * - the forward's exchange repeated from the rank's own block - instead of
 * kept per layer, so a rank keeps its own block's keys and values and not the
 * whole sequence's (cp - 1 blocks more a layer; Megatron-LM / Transformer
 * Engine's ring keeps only its own too). Marks the receives, what views and
 * joins them on the way to the attention, and the messages' packing (the
 * views and concatenation a SEND reads), which is made again rather than kept. */
static void cp_rereceive(const IrGraph *g, const int *cp_pair, char *recomp) {
  char *from_recv = calloc((size_t)g->nnodes + 1, 1), *packing = calloc((size_t)g->nnodes + 1, 1);
  if (!from_recv || !packing) abort();
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    int view = n->op == IR_SLICE || n->op == IR_RESHAPE || n->op == IR_CONCAT || n->op == IR_TRANSPOSE || n->op == IR_REPEAT_KV;
    from_recv[i] = n->op == IR_RECV && cp_pair[i] >= 0;
    for (int k = 0; view && k < n->nin; k++) from_recv[i] |= from_recv[n->in[k]];
    if (n->op == IR_RECV && cp_pair[i] >= 0) packing[cp_pair[i]] = 1; /* the SEND it pairs with */
  }
  for (int i = g->nnodes - 1; i >= 0; i--) {
    const IrNode *n = &g->nodes[i];
    if (!packing[i]) continue;
    for (int k = 0; k < n->nin; k++) {
      IrOp op = g->nodes[n->in[k]].op;
      if (op == IR_CONCAT || op == IR_RESHAPE) packing[n->in[k]] = 1;
    }
  }
  for (int i = 0; i < g->nnodes; i++)
    if (from_recv[i] || (packing[i] && g->nodes[i].op != IR_SEND)) recomp[i] = 1;
  free(from_recv);
  free(packing);
}

/* The rings the context-parallel pairs make: a RECV whose SEND sends the
 * root x (anything but a ring's block) is block 1 of x's ring, one whose SEND
 * sends block s is block s + 1. A root whose blocks are not 1..len-1 once
 * each is no ring (ring_len -1). */
static void cp_rings(AdCtx *c) {
  const IrGraph *g = c->f;
  size_t n = (size_t)g->nnodes + 1;
  c->cp_root = arena_alloc(c->m->arena, sizeof(int) * n);
  c->cp_pos = arena_alloc(c->m->arena, sizeof(int) * n);
  c->ring_len = arena_alloc(c->m->arena, sizeof(int) * n);
  c->ring_next = arena_alloc(c->m->arena, sizeof(int) * n);
  c->ring_dir = arena_alloc(c->m->arena, n);
  memset(c->ring_dir, 0, n);
  for (int i = 0; i < g->nnodes; i++) c->cp_root[i] = c->cp_pos[i] = -1, c->ring_len[i] = 0;
  for (int i = 0; i < g->nnodes; i++) {
    if (c->cp_pair[i] < 0) continue;
    int x = g->nodes[c->cp_pair[i]].in[0];
    int root = c->cp_root[x] >= 0 ? c->cp_root[x] : x, pos = c->cp_root[x] >= 0 ? c->cp_pos[x] + 1 : 1;
    c->cp_root[i] = root;
    c->cp_pos[i] = pos;
    if (c->ring_len[root] >= 0) c->ring_len[root] = pos + 1 > c->ring_len[root] ? pos + 1 : c->ring_len[root];
  }
  for (int r = 0; r < g->nnodes; r++) {
    if (c->ring_len[r] <= 0) continue;
    int seen = 0;
    for (int i = 0; i < g->nnodes; i++)
      if (c->cp_root[i] == r) seen++;
    for (int t = 1; t < c->ring_len[r] && seen == c->ring_len[r] - 1; t++) {
      int once = 0;
      for (int i = 0; i < g->nnodes; i++) once += c->cp_root[i] == r && c->cp_pos[i] == t;
      if (once != 1) seen = -1;
    }
    if (seen != c->ring_len[r] - 1) c->ring_len[r] = -1;
    c->ring_next[r] = c->ring_len[r] - 1;
  }
}

/* Per context-parallel RECV of g, the SEND it pairs with: the oldest one of
 * its group not yet received (runtime/comm_ring.c pairs them so), or -1. */
static int *cp_pairs(IrModule *m, const IrGraph *g) {
  int *pair = arena_alloc(m->arena, sizeof(int) * ((size_t)g->nnodes + 1));
  int *queue = arena_alloc(m->arena, sizeof(int) * ((size_t)g->nnodes + 1)), head = 0, tail = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    pair[i] = -1;
    if (n->op == IR_SEND && n->attr[0] == IRG_CP) queue[tail++] = i;
    else if (n->op == IR_RECV && n->attr[0] == IRG_CP && head < tail) {
      const IrNode *s = &g->nodes[queue[head]];
      if (s->attr[1] == -n->attr[1] && ir_numel(s) == ir_numel(n) && s->dtype == n->dtype) pair[i] = queue[head];
      head++;
    }
  }
  return pair;
}

/* A weight seen through an identity, a view or a cast - Megatron's f over
 * the context group (copy_to_group: its gradient is all-reduced there), a
 * reshape, a transpose - is the weight again in the backward, not a copy
 * kept per layer and micro-batch (under context parallelism every weight of
 * a block went through f and so was kept whole: a 405B layer's 0.8 GB per
 * micro-batch at tp 8). Gathers communicate: zero3_regather decides them. */
static void weight_views(const IrGraph *g, const char *weight, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    IrOp op = g->nodes[i].op;
    if (weight[i] && (op == IR_COPY_TO_GROUP || op == IR_RESHAPE || op == IR_TRANSPOSE || op == IR_CAST)) recomp[i] = 1;
  }
}

/* Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2; Megatron-LM's
 * LinearWithGradAccumulationAndAsyncCommunication): a column-parallel GEMM
 * reads its input gathered over the tensor group along the sequence, and
 * its weight gradient reads it again; the backward gathers it once more
 * instead of keeping the gathered copy (tp times the sequence-split value
 * the layer keeps instead). */
static void sp_regather(const IrGraph *g, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op == IR_ALL_GATHER && n->attr[0] == IRG_TP && n->attr[1] == 1 && n->rank >= 3) recomp[i] = 1;
  }
}

/* An activation function whose input is differentiated: its backward reads
 * that input, which is kept anyway, so its output is computed again from it
 * (one elementwise pass) rather than kept too - GELU's output, the input of
 * a GPT block's second MLP GEMM, is a quarter of the block's stash; SwiGLU's
 * silu(gate) likewise (the min-cut partitioners' choice for pointwise ops). */
static void activation_recompute(const IrGraph *g, const char *requires_grad, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    int act = n->op == IR_GELU || n->op == IR_SILU || n->op == IR_RELU || n->op == IR_SIGMOID || n->op == IR_TANH;
    if (act && n->nin == 1 && requires_grad[n->in[0]]) recomp[i] = 1;
  }
}

/* An elementwise op of one value and constants (a clamp, a shift, a scale:
 * GPT-OSS's clamped SwiGLU is a chain of them) is made again from that value
 * in the backward rather than kept: where the value is kept anyway (a clamp's
 * backward reads its input) the op's output is saved memory, elsewhere the
 * value takes the output's place, never more bytes than it (the min-cut
 * partitioners' rule for pointwise ops, restricted to where it cannot lose).
 * Dropout (its mask) and casts (mixed precision's storage) are left as they are. */
static int gated_product(const IrGraph *g, const char *requires_grad, const char *recomp, int i, const char *act_weight);

static void constant_chain_recompute(const IrGraph *g, const char *requires_grad, char *recomp, const char *act_weight) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (!(ir_op_flags(n->op) & IRF_ELEMENTWISE) || n->op == IR_DROPOUT || n->op == IR_CAST || recomp[i]) continue;
    int x = -1, values = 0;
    for (int k = 0; k < n->nin; k++) {
      IrOp op = g->nodes[n->in[k]].op;
      if (op == IR_CONST || op == IR_FILL) continue;
      x = n->in[k];
      values++;
    }
    if (values != 1 || !requires_grad[x]) continue;
    /* a reduction's row statistics (a norm's variance, eps, rsqrt) are the
     * norms' rules' (norm_recompute): their kernels keep them */
    int root = x;
    while (ir_op_flags(g->nodes[root].op) & IRF_ELEMENTWISE) {
      int next = -1, nvalues = 0;
      for (int k = 0; k < g->nodes[root].nin; k++) {
        IrOp op = g->nodes[g->nodes[root].in[k]].op;
        if (op != IR_CONST && op != IR_FILL) next = g->nodes[root].in[k], nvalues++;
      }
      if (nvalues != 1) break;
      root = next;
    }
    if (ir_op_flags(g->nodes[root].op) & IRF_REDUCE) continue;
    const IrNode *v = &g->nodes[x];
    if (ir_numel(v) * sem_dtype_bytes(v->dtype) <= ir_numel(n) * sem_dtype_bytes(n->dtype)) recomp[i] = 1;
  }
  /* A product, quotient, minimum or maximum of two differentiated values reads
   * both in its own backward, so they (or what they are made from) are kept
   * whatever becomes of it; where only elementwise ops read it, it is made again
   * inside the backward's elementwise kernels too, not kept (GPT-OSS's
   * gate x sigmoid(1.702 gate)). One a GEMM reads (SwiGLU's product, the down
   * projection's input) stays kept: making it again for the weight gradient
   * would cost the backward a pass over it - unless the policy asks for that
   * trade (recompute = act: act_weight, the block's weight mask). */
  for (int i = 0; i < g->nnodes; i++)
    if (gated_product(g, requires_grad, recomp, i, act_weight)) recomp[i] = 1;
}

/* Node i is a product, quotient, minimum or maximum of two differentiated
 * values, not a graph output, read by some op and by elementwise ops alone
 * (casts and dropout excepted) - or, given act_weight (recompute = act), by
 * any op where neither value is a weight (a gated activation's product, not
 * a norm's scaling): what constant_chain_recompute makes again. */
static int gated_product(const IrGraph *g, const char *requires_grad, const char *recomp, int i, const char *act_weight) {
  const IrNode *n = &g->nodes[i];
  if (recomp[i] || n->nin != 2 || !requires_grad[n->in[0]] || !requires_grad[n->in[1]]) return 0;
  if (n->op != IR_MUL && n->op != IR_DIV && n->op != IR_MINIMUM && n->op != IR_MAXIMUM) return 0;
  int any_reader = act_weight && !act_weight[n->in[0]] && !act_weight[n->in[1]];
  int readers = 0, elementwise = 1;
  for (int j = i + 1; j < g->nnodes && (elementwise || any_reader); j++)
    for (int k = 0; k < g->nodes[j].nin; k++)
      if (g->nodes[j].in[k] == i) {
        readers++;
        if (!(ir_op_flags(g->nodes[j].op) & IRF_ELEMENTWISE) || g->nodes[j].op == IR_CAST || g->nodes[j].op == IR_DROPOUT)
          elementwise = 0;
      }
  for (int o = 0; o < g->noutputs; o++)
    if (g->outputs[o] == i) return 0;
  return readers > 0 && (elementwise || any_reader);
}

int ad_act_recomputes(const IrModule *m) {
  int any = 0;
  for (int gi = 0; gi < m->ngraphs && !any; gi++) {
    const IrGraph *g = m->graphs[gi];
    size_t n = (size_t)g->nnodes + 1;
    char *rg = calloc(n, 1), *none = calloc(n, 1), *weight = weight_mask(g);
    if (!rg || !none) abort();
    /* every argument and call counted as differentiated: more products than
     * a block's backward finds, never fewer */
    for (int i = 0; i < g->nnodes; i++) {
      const IrNode *x = &g->nodes[i];
      int r = x->op == IR_PARAM || x->op == IR_RECV || x->op == IR_ARG || x->op == IR_CALL;
      for (int k = 0; k < x->nin; k++) r |= rg[x->in[k]];
      rg[i] = (char)(r && sem_dtype_is_float(x->dtype));
    }
    for (int i = 0; i < g->nnodes && !any; i++) any = gated_product(g, rg, none, i, weight) && !gated_product(g, rg, none, i, NULL);
    free(rg);
    free(none);
    free(weight);
  }
  return any || ad_selective_recomputes(m);
}

/* A normalisation's normalised value x_hat = a * rstd (LayerNorm's a = x - mean,
 * RMSNorm's a = x; rstd an RSQRT): its backward reads a (through the variance's SQUARE)
 * and rstd anyway, so x_hat is made again from them (one multiply in a kernel that reads
 * both) instead of kept beside them - PyTorch's layer_norm keeps its input, mean and
 * rstd, not x_hat. */
static void norm_recompute(const IrGraph *g, const char *requires_grad, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op != IR_MUL || n->nin != 2) continue;
    for (int k = 0; k < 2; k++) {
      int a = n->in[k], r = n->in[1 - k];
      if (g->nodes[r].op != IR_RSQRT || !requires_grad[a] || !requires_grad[r]) continue;
      int squared = 0;
      for (int j = 0; j < g->nnodes && !squared; j++)
        squared = g->nodes[j].op == IR_SQUARE && g->nodes[j].nin == 1 && g->nodes[j].in[0] == a;
      if (squared) recomp[i] = 1;
    }
  }
}

/* The heads' layout of the attention's operands: q, k and v that an ATTENTION reads
 * as transpose(reshape(x), 0 2 1 3) - [B, T, H, D] to [B, H, T, D], a GPT block's
 * projections - or as the transpose of a rotation on [B, T, H, D] (Llama's q and k,
 * lower.c) are made again from x or the rotation in the backward, not kept: x is as
 * large, and a back end that reads the heads in place (the CUDA target's 16-bit
 * attention, fuse.c's fuse_attn_qkv) then neither copies them in the forward nor keeps
 * the copy. */
static void attention_operand_views(const IrGraph *g, char *recomp) {
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op != IR_ATTENTION) continue;
    for (int k = 0; k < 3 && k < n->nin; k++) {
      const IrNode *t = &g->nodes[n->in[k]];
      if (!ir_heads_transpose(t)) continue;
      const IrNode *x = &g->nodes[t->in[0]];
      if (x->op == IR_RESHAPE) recomp[t->in[0]] = 1;
      else if (x->op != IR_ROPE || !ir_rope_bthd(x)) continue;
      recomp[n->in[k]] = 1;
    }
  }
}

/* B.grad (and B.fwd, which saves what B.grad reads) for block graph fi
 * under `policy`, into graphs fwd_gi and grad_gi; *nsaved: what a layer keeps */
static const char *build_block(IrModule *m, AdResult *res, int fi, Recompute policy, int fwd_gi, int grad_gi, int *nsaved) {
  const IrGraph *f = m->graphs[fi];
  IrGraph *b = m->graphs[grad_gi], *fw = m->graphs[fwd_gi];
  if (f->noutputs != 1) return arena_printf(m->arena, "repeated block %s must have one output", f->name);
  AdCtx c;
  ctx_init(&c, m, res, f, b);
  c.lazy = 1;
  c.first_saved_arg = 1 + f->nargs;
  b->count = f->count;
  requires_grad(&c, 1);
  for (int i = 0; i < f->nnodes; i++) {
    if (policy == RECOMPUTE_FULL) c.recomp[i] = 1;
    if (f->nodes[i].op == IR_CALL) return "a repeat inside a repeated block cannot be differentiated";
  }
  char *weight = weight_mask(f);
  if (policy == RECOMPUTE_SELECTIVE || policy == RECOMPUTE_ACT) attention_core(f, c.recomp);
  if (policy == RECOMPUTE_OPS) ops_policy(f, weight, c.recomp);
  activation_recompute(f, c.rg, c.recomp);
  constant_chain_recompute(f, c.rg, c.recomp, policy == RECOMPUTE_ACT ? weight : NULL);
  attention_operand_views(f, c.recomp);
  norm_recompute(f, c.rg, c.recomp);
  weight_views(f, weight, c.recomp);
  free(weight);
  zero3_regather(f, c.recomp);
  sp_regather(f, c.recomp);
  if (policy != RECOMPUTE_NONE) {
    c.cp_pair = cp_pairs(m, f);
    cp_rereceive(f, c.cp_pair, c.recomp);
    cp_rings(&c);
  }
  const IrNode *out = fnode(&c, f->outputs[0]);
  int dy = arg_node(&c, 0, out, "dy");
  if (c.rg[f->outputs[0]]) c.grad[f->outputs[0]] = dy;
  backward_pass(&c);
  if (c.err) return c.err;
  /* output 0: d argument 0, summed over its ARG nodes */
  int dx = -1;
  const IrNode *arg0 = NULL;
  for (int i = 0; i < f->nnodes; i++)
    if (f->nodes[i].op == IR_ARG && f->nodes[i].attr[0] == 0) {
      arg0 = &f->nodes[i];
      if (c.grad[i] >= 0) dx = dx < 0 ? c.grad[i] : bin(&c, IR_ADD, dx, c.grad[i]);
    }
  if (!arg0) return arena_printf(m->arena, "repeated block %s has no argument 0", f->name);
  if (dx < 0) dx = fill(&c, 0.0, arg0->dtype, arg0->rank, arg0->dims);
  int *outs = arena_alloc(m->arena, sizeof(int) * (size_t)(m->nparams + 2)), nouts = 0;
  outs[nouts++] = dx;
  param_outputs(&c, &outs, &nouts);
  if (c.err) return c.err;
  b->outputs = outs;
  b->noutputs = nouts;
  b->nargs = c.first_saved_arg + c.nsaved;
  prune(b);

  /* B.fwd: B itself, node for node, plus the saved values as outputs */
  fw->count = f->count;
  fw->nargs = f->nargs;
  for (int i = 0; i < f->nnodes; i++) {
    const IrNode *n = &f->nodes[i];
    const char *why = NULL;
    int id = ir_add(fw, n->op, n->in, n->nin, n->attr, IR_NATTR, n->fattr, n->dtype, n->rank, n->dims, &why);
    if (id < 0) return arena_printf(m->arena, "internal error: copying %s: %s", f->name, why ? why : "?");
    fw->nodes[id].name = n->name;
    fw->nodes[id].span = n->span;
  }
  fw->outputs = arena_alloc(m->arena, sizeof(int) * (size_t)(c.nsaved + 1));
  fw->outputs[0] = f->outputs[0];
  for (int k = 0; k < c.nsaved; k++) fw->outputs[1 + k] = c.saved[k];
  fw->noutputs = 1 + c.nsaved;
  *nsaved = c.nsaved;
  return NULL;
}

/* forward.grad: graph 0 copied (repeats as SAVE calls of B.fwd), then its
 * backward seeded by argument 0. */
static const char *build_step(IrModule *m, AdResult *res) {
  const IrGraph *f = m->graphs[0];
  IrGraph *b = m->graphs[res->step];
  if (f->noutputs < 1) return "the forward graph has no loss output";
  AdCtx c;
  ctx_init(&c, m, res, f, b);
  requires_grad(&c, 0);
  const IrNode *loss = fnode(&c, f->outputs[0]);
  if (loss->rank != 0 || !sem_dtype_is_float(loss->dtype)) return "the loss (output 0 of the forward) is not a float scalar";
  int seed = arg_node(&c, 0, loss, "dloss");
  c.split_first = arena_alloc(m->arena, sizeof(int) * (size_t)(f->nnodes + 1));
  for (int i = 0; i < f->nnodes; i++) {
    const IrNode *n = &f->nodes[i];
    IrNode copy = *n;
    c.split_first[i] = -1;
    if (n->op == IR_ARG) copy.attr[0] += 1; /* after the seed */
    int64_t pol = 0;
    if (n->op == IR_CALL) {
      if (n->attr[0] < 1 || n->attr[0] >= res->nforward || res->fwd[n->attr[0]] < 0)
        return "a call of a graph that is not a repeated block";
      copy.attr[0] = res->fwd[n->attr[0]];
      copy.attr[2] = IR_CALL_SAVE;
      pol = ad_policy_layers(res, n->attr[1]);
    }
    int stack_in[8], *in = n->nin <= 8 ? stack_in : malloc(sizeof(int) * (size_t)n->nin);
    for (int k = 0; k < n->nin; k++) in[k] = c.map[n->in[k]];
    if (n->op == IR_CALL && pol < n->attr[1]) {
      /* recompute_layers: the first pol (>= 1) layers under the policy, the rest keep their activations */
      IrNode part = copy;
      part.attr[1] = pol;
      c.split_first[i] = copy_node(&c, &part, in);
      in[0] = c.split_first[i];
      copy.attr[0] = res->fwd_keep[n->attr[0]];
      copy.attr[1] = n->attr[1] - pol;
      copy.attr[3] = n->attr[3] + pol;
    }
    c.map[i] = copy_node(&c, &copy, in);
    if (in != stack_in) free(in);
  }
  b->nargs = 1 + f->nargs;
  b->fb_split = b->nnodes; /* everything after is the backward (ir.h) */
  if (c.rg[f->outputs[0]]) c.grad[f->outputs[0]] = seed;
  backward_pass(&c);
  if (c.err) return c.err;
  /* a repeat the loss does not reach has no backward: keep nothing for it */
  for (int i = 0; i < f->nnodes; i++)
    if (f->nodes[i].op == IR_CALL && c.grad[i] < 0) {
      b->nodes[c.map[i]].attr[2] = IR_CALL_PLAIN;
      if (c.split_first[i] >= 0) b->nodes[c.split_first[i]].attr[2] = IR_CALL_PLAIN;
    }
  int *outs = arena_alloc(m->arena, sizeof(int) * (size_t)(m->nparams + 2)), nouts = 0;
  outs[nouts++] = c.map[f->outputs[0]];
  param_outputs(&c, &outs, &nouts);
  if (c.err) return c.err;
  b->outputs = outs;
  b->noutputs = nouts;
  prune(b);
  return NULL;
}

int64_t ad_policy_layers(const AdResult *r, int64_t count) {
  if (r->recompute == RECOMPUTE_NONE || r->layers <= 0 || r->layers >= count) return count;
  return r->layers;
}

AdResult *ad_build(IrModule *m, Recompute policy, const char **err) { return ad_build_layers(m, policy, 0, err); }

AdResult *ad_build_layers(IrModule *m, Recompute policy, int64_t layers, const char **err) {
  const char *e = NULL;
  for (int i = 0; i < m->ngraphs; i++)
    if (m->graphs[i]->ngrad_params) e = "the module has been differentiated already";
  if (m->ngraphs < 1) e = "the module has no forward graph";
  if (e) {
    if (err) *err = e;
    return NULL;
  }
  AdResult *r = arena_alloc(m->arena, sizeof *r);
  int nf = m->ngraphs;
  r->m = m;
  r->recompute = policy;
  r->layers = layers > 0 ? layers : 0;
  r->nforward = nf;
  r->fwd = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  r->grad = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  r->nsaved = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  r->fwd_keep = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  r->grad_keep = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  r->nsaved_keep = arena_alloc(m->arena, sizeof(int) * (size_t)nf);
  /* a block some call runs more layers of than the policy takes keeps the rest's activations */
  char *keep = arena_alloc(m->arena, (size_t)nf + 1);
  memset(keep, 0, (size_t)nf + 1);
  for (int i = 0; i < m->graphs[0]->nnodes; i++) {
    const IrNode *n = &m->graphs[0]->nodes[i];
    if (n->op == IR_CALL && n->attr[0] >= 1 && n->attr[0] < nf && ad_policy_layers(r, n->attr[1]) < n->attr[1])
      keep[n->attr[0]] = 1;
  }
  /* the step first: a call must name a later graph */
  r->step = m->ngraphs;
  /* about the sizes they come to: a backward two to three times its forward */
  ir_graph_reserve(ir_graph_new(m, arena_printf(m->arena, "%s.grad", m->graphs[0]->name)), 3 * m->graphs[0]->nnodes + 16);
  r->fwd[0] = -1;
  r->grad[0] = r->step;
  r->fwd_keep[0] = r->grad_keep[0] = -1;
  r->nsaved_keep[0] = 0;
  for (int i = 1; i < nf; i++) {
    r->fwd[i] = m->ngraphs;
    ir_graph_reserve(ir_graph_new(m, arena_printf(m->arena, "%s.fwd", m->graphs[i]->name)), m->graphs[i]->nnodes + 16);
    r->grad[i] = m->ngraphs;
    ir_graph_reserve(ir_graph_new(m, arena_printf(m->arena, "%s.grad", m->graphs[i]->name)), 3 * m->graphs[i]->nnodes + 16);
    r->fwd_keep[i] = r->grad_keep[i] = -1;
    r->nsaved_keep[i] = 0;
    if (!keep[i]) continue;
    r->fwd_keep[i] = m->ngraphs;
    ir_graph_new(m, arena_printf(m->arena, "%s.keep.fwd", m->graphs[i]->name));
    r->grad_keep[i] = m->ngraphs;
    ir_graph_new(m, arena_printf(m->arena, "%s.keep.grad", m->graphs[i]->name));
  }
  for (int i = 1; i < nf && !e; i++) {
    e = build_block(m, r, i, policy, r->fwd[i], r->grad[i], &r->nsaved[i]);
    if (!e && keep[i]) e = build_block(m, r, i, RECOMPUTE_NONE, r->fwd_keep[i], r->grad_keep[i], &r->nsaved_keep[i]);
  }
  if (!e) e = build_step(m, r);
  if (e) {
    if (err) *err = e;
    return NULL;
  }
  return r;
}

double ad_step(Interp *in, const AdResult *r, double seed, const char **err) {
  const IrGraph *g = r->m->graphs[r->step];
  InterpTensor s;
  memset(&s, 0, sizeof s);
  s.data = &seed;
  InterpTensor *outs = calloc((size_t)g->noutputs, sizeof(InterpTensor));
  if (!outs) abort();
  double loss = NAN;
  if (interp_run(in, r->step, 0, &s, 1, outs, err) == 0) loss = outs[0].data[0];
  for (int k = 0; k < g->noutputs; k++) free(outs[k].data);
  free(outs);
  return loss;
}

double ad_accumulate(Interp *in, const AdResult *r, int nmicro, AdFeed feed, void *user, const char **err) {
  interp_zero_grads(in);
  double total = 0;
  for (int i = 0; i < nmicro; i++) {
    if (feed) feed(in, i, user);
    double l = ad_step(in, r, 1.0 / (double)nmicro, err);
    if (isnan(l)) return l;
    total += l;
  }
  return total / (double)nmicro;
}

void ad_print(const AdResult *r, FILE *out) {
  const IrModule *m = r->m;
  if (r->layers > 0) fprintf(out, "grad (recompute %s, the first %" PRId64 " layers of a call)\n", sem_recompute_name(r->recompute), r->layers);
  else fprintf(out, "grad (recompute %s)\n", sem_recompute_name(r->recompute));
  for (int gi = r->nforward; gi < m->ngraphs; gi++) {
    const IrGraph *g = m->graphs[gi];
    ir_print_graph(m, g, out);
    if (!g->ngrad_params) continue;
    fputs("grads", out);
    for (int k = 0; k < g->ngrad_params; k++)
      fprintf(out, "%s %s = %%%d", k ? "," : "", m->params[g->grad_params[k]].name,
              g->outputs[g->noutputs - g->ngrad_params + k]);
    fputc('\n', out);
  }
}
