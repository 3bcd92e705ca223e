/* fuse.c - grouping of each graph's nodes into kernels (see fuse.h).
 *
 * The rules, applied greedily in the graph's (topological) node order:
 *
 * 1. Iteration spaces. A loop kernel runs over one shape D: every node in it
 *    computes a tensor of shape D (inputs may be smaller and broadcast). A
 *    row kernel runs over D with one reduced group of axes [lo, hi): it
 *    holds reductions of D over exactly those axes (reduce_sum/mean/max,
 *    softmax, log_softmax and their backward, a sum_to whose reduced axes are
 *    one contiguous group), and elementwise nodes of either shape D or the
 *    "row" shape (D with the group set to 1, or removed). The code generator
 *    gives each outer index (a row) to one thread block, which sweeps the row
 *    once per reduction: a layernorm (mean, sub, square, mean, add, rsqrt,
 *    mul, mul, add) is one kernel, as in Apex's / llm.c's fused layernorm.
 *    A row value may be used by a D-shaped node only when numpy broadcasting
 *    maps it to its own row (its shape right-aligned to D's rank is D with
 *    the group set to 1), so no kernel reads another row's result.
 * 2. Elementwise nodes and reductions join the kernel(s) of their fusible
 *    producers when the spaces agree; producers in several compatible
 *    kernels are merged (a diamond a->b, a->c, (b,c)->d is one kernel).
 *    Elementwise producers feeding a reduction and a reduction's broadcast
 *    consumers in the same row join its row kernel.
 * 3. No cycles: a node does not join (and kernels are not merged) when a
 *    path leaves the group through another kernel and comes back, e.g. a
 *    residual add of a layernorm's input and an MLP output that depends on
 *    the layernorm's result. Reachability is a search backwards over the
 *    kernels' producers, unpruned: a kernel of old nodes can lie on such a
 *    path when a producer kernel of it gained newer nodes after it read
 *    that producer (MoE's gate gradient joined the router's renormalised
 *    gates, which the dispatch reads: a cycle a prune by node ids missed).
 * 4. GEMMs: each MATMUL is a kernel of its own for BLAS / cuBLAS. Its
 *    epilogue takes, in this order (cuBLASLt computes D = act(alpha A B +
 *    bias), cublasLtEpilogue_t BIAS / RELU_BIAS / GELU_BIAS): a MUL by a
 *    scalar CONST (alpha), then an ADD of a vector broadcast along rows
 *    (shape [N] or [1, ..., N], N the GEMM's columns: the bias), then a RELU
 *    or GELU; each step only when the value it extends has exactly one
 *    consumer (that step) and is not a graph output. A GELU may also follow
 *    a value with other consumers (the backward's act_grad): the
 *    pre-activation is then a second output, as CUBLASLT_EPILOGUE_GELU_AUX
 *    (_BIAS) writes it for training. cuBLASLt has no SiLU epilogue, so SiLU
 *    starts a loop kernel. Each step keeps the product's element type, but
 *    for FuseOptions.store16: a bias ADD stored in bf16 over a product of
 *    bf16 operands ends the epilogue (cuBLASLt adds in fp32 and rounds as it
 *    writes a bf16 D, which is the IR's rounding of the sum; a GELU after it
 *    reads the rounded sum, which the library's GELU_BIAS would not), and
 *    so does a CAST of the bare product to bf16 (precision.c's 16-bit
 *    products: cuBLASLt's bf16 D, nothing else after the product).
 * 5. Shape ops, visited last to first once kernels are formed:
 *    - a RESHAPE of a contiguous buffer is a view: with one consumer it is
 *      folded into the consumer's kernel, whatever its kind (every kernel
 *      reads memory, and a view of it is only a different shape); otherwise
 *      it stays a `view` unit (an alias, no code);
 *    - a TRANSPOSE that only swaps the last two axes, read by a MATMUL as an
 *      operand, is folded into the GEMM (BLAS's transa / transb);
 *    - TRANSPOSE, SLICE, EXPAND and REPEAT_KV with one consumer in a loop,
 *      row or copy kernel are folded into it as an index map of its read
 *      (strides, offsets, zero strides, a divided head index);
 *    - folding needs the shape op's input to come from memory (another
 *      kernel), never from a value computed in the consumer's own kernel;
 *    - everything else (other transposes feeding a GEMM, PAD, CONCAT,
 *      shape ops with several consumers) is a `copy` kernel.
 *    Folding a single-consumer node into its consumer's kernel cannot make a
 *    cycle: its only successor is that kernel.
 * 6. Leaves, collectives and CALLs are units of their own; EMBEDDING (a
 *    gather), EMBEDDING_BWD (a scatter-add), ROPE, CROSS_ENTROPY(_BWD),
 *    REPEAT_KV_BWD and multi-group SUM_TO are `special` kernels. With
 *    FuseOptions.store16 an ATTENTION_BWD's one reader, a CAST of its
 *    gradient to q's 16-bit type, joins its kernel (the 16-bit attention
 *    kernels store the gradient so), and so do the layout chains of
 *    fuse_attn_out16, fuse_attn_grad16, fuse_attn_dout and fuse_attn_qkv
 *    (the slices, transposes, pads and casts around an attention whose
 *    16-bit kernels read and write the projections' layouts). With
 *    FuseOptions.ce_pair a CROSS_ENTROPY_BWD joins its CROSS_ENTROPY's
 *    kernel (ce_partner).
 * 7. Order: kernels are listed by a topological sort of the kernel graph,
 *    taking among the ready kernels the one with the smallest node id, so
 *    the order follows the source where it can. The context group's sends
 *    and receives keep their node order (each as if it read the one before:
 *    they pair in that order), for fusion's cycle checks too, and such a
 *    send is taken first once it is ready (its exchange runs until its
 *    receive, under the kernels between).
 * 8. Bias gradients (FuseOptions.bias_grad, the CUDA back end): a row
 *    kernel holding only a SUM_TO or REDUCE_SUM (and folded reshapes) that
 *    sums a GEMM operand over the product's reduction - the operand stored
 *    as a matrix [K, X] (B as it is, A transposed), summed over its rows
 *    into X values - joins that GEMM when the GEMM has no other epilogue,
 *    one matrix, fp32 or bf16 operands (both alike; the sum is fp32), both
 *    lie in the same part of a cut step, and
 *    no other kernel lies on a path between the two. cuBLASLt computes the
 *    sum as it reads the operand (CUBLASLT_EPILOGUE_BGRADA / BGRADB): the
 *    bias gradient of a linear layer's weight-gradient product. A bias
 *    gradient fused with an activation's backward (a row kernel that also
 *    computes the GEMM's operand) stays as it is: it reads that value once.
 * 9. Siblings (both back ends; merge_siblings): once the rules above are
 *    done, a loop kernel that reads a value a row or loop kernel reads too,
 *    and computes over that kernel's full space, joins it where neither depends
 *    on the other (no path through other kernels, no value of one read by
 *    the other) and both lie in the same part of a cut step; its values are
 *    the other kernel's full outputs. The shared value is read once, at the
 *    price of the kernels' outputs living together.
 * 10. Fusion off (FuseOptions.eager, `--fusion off`): rules 2, 4 (but for
 *    store16's rounding cast), 6's ce_pair, 8 and 9 are not applied, so every
 *    elementwise node and reduction starts a kernel of its own; rule 5 still
 *    folds shape ops, and the attention's layout chains still join it.
 */
#include "fuse.h"
#include "xalloc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

enum { TAG_FULL = 0, TAG_ROW = 1 };

/* An iteration space: D, and the reduced group [lo, hi) when red. */
typedef struct {
  int valid;
  int rank;
  int64_t dims[IR_MAX_RANK];
  int red, lo, hi;
} Space;

/* A kernel being built. Kernels are merged with union-find. */
typedef struct {
  FuseKind kind;
  int parent;
  Space sp;
  int epilogue, mm, tail, bgrad;
  IrOp act;
  int minnode, maxnode;
  int *preds; /* kernels it reads from; resolve with find(), may repeat */
  int npreds, cappreds;
} BK;

typedef struct {
  const IrModule *m;
  const IrGraph *g;
  FuseOptions opts;
  int n;
  int *kof;   /* node -> kernel (resolve with find) */
  int *ucount, *ustart, *users; /* distinct consumer nodes of each node */
  char *is_out;
  BK *k;
  int nk, capk;
  int *mark, *seen; /* per kernel: set membership stamp, search stamp */
  int markstamp, seenstamp;
  int seen_mark; /* the markstamp the kernels seen at seenstamp were searched under (-1: none) */
  int *stack;
  Arena *scratch; /* the kernels' producer lists: freed whole with the graph's fusion */
} Fuser;

const char *fuse_kind_name(FuseKind k) {
  static const char *const names[] = {"leaf", "view", "loop", "row", "gemm", "copy", "special", "comm", "call"};
  return k >= 0 && k < FUSE_NKINDS ? names[k] : "?";
}

/* ---- shapes and spaces ---- */

static const IrNode *nd(const IrGraph *g, int id) { return &g->nodes[id]; }

static int same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
  if (ra != rb) return 0;
  for (int i = 0; i < ra; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

static int node_is(const IrNode *n, const Space *s) { return same_shape(n->rank, n->dims, s->rank, s->dims); }

/* Is (rank, dims) the row shape of s: its group set to 1, or removed? */
static int is_row_shape(const Space *s, int rank, const int64_t *dims) {
  if (!s->red) return 0;
  if (rank == s->rank) {
    for (int i = 0; i < rank; i++)
      if (dims[i] != (i >= s->lo && i < s->hi ? 1 : s->dims[i])) return 0;
    return 1;
  }
  if (rank != s->rank - (s->hi - s->lo)) return 0;
  for (int i = 0, k = 0; i < s->rank; i++) {
    if (i >= s->lo && i < s->hi) continue;
    if (dims[k++] != s->dims[i]) return 0;
  }
  return 1;
}

/* A row-shaped value read by a D-shaped node: numpy aligns shapes on the
 * right, so it stays in its own row only if, padded with leading 1s to D's
 * rank, it is D with the group set to 1. */
static int row_broadcasts_in_row(const Space *s, int rank, const int64_t *dims) {
  if (rank > s->rank) return 0;
  int pad = s->rank - rank;
  for (int i = 0; i < s->rank; i++) {
    int64_t d = i < pad ? 1 : dims[i - pad];
    if (d != (i >= s->lo && i < s->hi ? 1 : s->dims[i])) return 0;
  }
  return 1;
}

static Space space_loop(const IrNode *n) {
  Space s;
  memset(&s, 0, sizeof s);
  s.valid = 1;
  s.rank = n->rank;
  memcpy(s.dims, n->dims, sizeof s.dims);
  return s;
}

/* Merged space of two kernels, or !valid. */
static Space space_merge(const Space *a, const Space *b) {
  Space bad;
  memset(&bad, 0, sizeof bad);
  if (!a->valid) return *b;
  if (!b->valid) return *a;
  if (a->red && b->red)
    return same_shape(a->rank, a->dims, b->rank, b->dims) && a->lo == b->lo && a->hi == b->hi ? *a : bad;
  if (!a->red && !b->red) return same_shape(a->rank, a->dims, b->rank, b->dims) ? *a : bad;
  const Space *r = a->red ? a : b, *l = a->red ? b : a;
  if (same_shape(r->rank, r->dims, l->rank, l->dims) || is_row_shape(r, l->rank, l->dims)) return *r;
  return bad;
}

/* ---- what a node is ---- */

typedef enum { R_LEAF, R_VIEW, R_COPY, R_GEMM, R_EW, R_RED, R_SPECIAL, R_COMM, R_CALL } Role;

/* The reduced group of a reduction node, from its input's shape. Returns 0
 * when the node reduces several separate groups (or none). */
static int reduced_group(const IrGraph *g, const IrNode *n, int *lo, int *hi) {
  const IrNode *x = nd(g, n->in[0]);
  switch (n->op) {
  case IR_REDUCE_SUM:
  case IR_REDUCE_MEAN:
  case IR_REDUCE_MAX:
  case IR_SOFTMAX:
  case IR_SOFTMAX_BWD:
  case IR_LOG_SOFTMAX:
  case IR_LOG_SOFTMAX_BWD:
    if (n->attr[0] < 0 || n->attr[0] >= x->rank) return 0;
    *lo = (int)n->attr[0];
    *hi = *lo + 1;
    return 1;
  case IR_SUM_TO: {
    /* x's axis i is reduced when n (right-aligned) lacks it or has 1 there
     * while x does not; axes of size 1 in x may sit anywhere in the group. */
    int pad = x->rank - n->rank, first = -1, last = -1;
    if (pad < 0) return 0;
    for (int i = 0; i < x->rank; i++) {
      int reduced = i < pad || (n->dims[i - pad] == 1 && x->dims[i] != 1);
      if (reduced) {
        if (first < 0) first = i;
        last = i;
      }
    }
    if (first < 0) return 0;
    for (int i = first; i <= last; i++) {
      int reduced = i < pad || (n->dims[i - pad] == 1 && x->dims[i] != 1);
      if (!reduced && x->dims[i] != 1) return 0;
    }
    /* The output must then be x's row shape (group removed or set to 1). */
    Space s = space_loop(x);
    s.red = 1;
    s.lo = first;
    s.hi = last + 1;
    if (!is_row_shape(&s, n->rank, n->dims)) return 0;
    *lo = first;
    *hi = last + 1;
    return 1;
  }
  default: return 0;
  }
}

static Role role_of(const IrGraph *g, int id) {
  const IrNode *n = nd(g, id);
  int f = ir_op_flags(n->op), lo, hi;
  if (n->op == IR_CALL) return R_CALL;
  if (f & IRF_COMM) return R_COMM;
  if (f & IRF_LEAF) return R_LEAF;
  if (n->op == IR_MATMUL) return R_GEMM;
  if (n->op == IR_RESHAPE) return R_VIEW;
  if (f & IRF_ELEMENTWISE) return R_EW;
  if (f & IRF_SHAPE) return R_COPY;
  if (reduced_group(g, n, &lo, &hi)) return R_RED;
  return R_SPECIAL;
}

/* Softmax-like reductions give a D-shaped result; the others a row. */
static int red_output_is_full(IrOp op) {
  return op == IR_SOFTMAX || op == IR_SOFTMAX_BWD || op == IR_LOG_SOFTMAX || op == IR_LOG_SOFTMAX_BWD;
}

/* ---- kernels being built ---- */

static int find(Fuser *F, int k) {
  while (F->k[k].parent != k) {
    F->k[k].parent = F->k[F->k[k].parent].parent;
    k = F->k[k].parent;
  }
  return k;
}

static int kof(Fuser *F, int node) { return find(F, F->kof[node]); }

static int new_kernel(Fuser *F, FuseKind kind) {
  if (F->nk == F->capk) {
    F->capk = F->capk ? F->capk * 2 : 64;
    F->k = xalloc_realloc(F->k, sizeof(BK) * (size_t)F->capk);
    F->mark = xalloc_realloc(F->mark, sizeof(int) * (size_t)F->capk);
    F->seen = xalloc_realloc(F->seen, sizeof(int) * (size_t)F->capk);
    F->stack = xalloc_realloc(F->stack, sizeof(int) * (size_t)F->capk);
  }
  BK *k = &F->k[F->nk];
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->parent = F->nk;
  k->act = IR_OP_COUNT;
  k->mm = k->tail = k->bgrad = -1;
  k->minnode = F->n;
  k->maxnode = -1;
  F->mark[F->nk] = F->seen[F->nk] = 0;
  return F->nk++;
}

static void add_pred(Fuser *F, int k, int p) {
  BK *b = &F->k[k];
  for (int i = 0; i < b->npreds; i++)
    if (b->preds[i] == p) return;
  if (b->npreds == b->cappreds) {
    b->cappreds = b->cappreds ? b->cappreds * 2 : 4;
    int *grown = arena_alloc_raw(F->scratch, sizeof(int) * (size_t)b->cappreds);
    if (b->npreds) memcpy(grown, b->preds, sizeof(int) * (size_t)b->npreds);
    b->preds = grown;
  }
  b->preds[b->npreds++] = p;
}

/* Puts node `id` into kernel k (a root) and records k's producers. */
static void place(Fuser *F, int id, int k) {
  const IrNode *n = nd(F->g, id);
  F->kof[id] = k;
  BK *b = &F->k[k];
  if (id < b->minnode) b->minnode = id;
  if (id > b->maxnode) b->maxnode = id;
  for (int i = 0; i < n->nin; i++) {
    int p = kof(F, n->in[i]);
    if (p != k) add_pred(F, k, p);
  }
}

/* The two gradients of the fused head and loss (dx and dw of LINEAR_CE or
 * LINEAR_LSE, ir_linear_role) read the same inputs and recompute the same
 * logits: the second joins the first's special kernel, which computes both
 * in one pass (rule 6). Returns that kernel, or -1. No cycle: neither reads
 * the other. */
static int linear_ce_partner(Fuser *F, int id) {
  const IrNode *n = nd(F->g, id);
  IrLinearRole role = ir_linear_role(n->op);
  if (role != IR_LINEAR_DX && role != IR_LINEAR_DW) return -1;
  IrLinearRole other = role == IR_LINEAR_DX ? IR_LINEAR_DW : IR_LINEAR_DX;
  for (int j = id - 1; j >= 0; j--) {
    const IrNode *m = nd(F->g, j);
    if (ir_linear_role(m->op) != other || ir_linear_targets(m->op) != ir_linear_targets(n->op) ||
        memcmp(m->attr, n->attr, sizeof(int64_t) * 3) || m->nin != n->nin || memcmp(m->in, n->in, sizeof(int) * (size_t)n->nin))
      continue;
    int k = kof(F, j);
    for (int i = 0; i < id; i++) /* a kernel of one partner only */
      if (i != j && kof(F, i) == k) return -1;
    return k;
  }
  return -1;
}

/* FuseOptions.ce_pair: a CROSS_ENTROPY_BWD joins the special kernel of the
 * CROSS_ENTROPY of the same logits and targets, whose rows it reads again
 * (rule 6): the one kernel reads each row once, for the loss and its
 * gradient. Only where the loss's gradient seed is a leaf (the step's
 * dloss argument, known before the forward's loss), the loss kernel holds
 * the loss alone, no forward node reads the loss, and the step is not a
 * pipeline's (whose halves run a micro-batch's loss and its gradient
 * apart). Returns that kernel, or -1. */
static int ce_partner(Fuser *F, int id) {
  const IrGraph *g = F->g;
  const IrNode *n = nd(g, id);
  if (!F->opts.ce_pair || n->op != IR_CROSS_ENTROPY_BWD || n->nin != 3 || role_of(g, n->in[2]) != R_LEAF) return -1;
  for (int j = 0; j < g->nnodes; j++)
    if ((g->nodes[j].op == IR_SEND || g->nodes[j].op == IR_RECV) && g->nodes[j].attr[0] == IRG_PP) return -1;
  for (int j = id - 1; j >= 0; j--) {
    const IrNode *m = nd(g, j);
    if (m->op != IR_CROSS_ENTROPY || m->nin != 2 || m->in[0] != n->in[0] || m->in[1] != n->in[1]) continue;
    int k = kof(F, j);
    for (int i = 0; i < id; i++) /* the loss alone in its kernel */
      if (i != j && kof(F, i) == k) return -1;
    for (int u = F->ustart[j]; u < F->ustart[j + 1]; u++) /* the loss read by the backward only */
      if (g->fb_split > 0 && F->users[u] < g->fb_split) return -1;
    return k;
  }
  return -1;
}

/* Merges kernel b into kernel a (both roots); returns a. */
static int merge(Fuser *F, int a, int b) {
  if (a == b) return a;
  BK *ka = &F->k[a], *kb = &F->k[b];
  kb->parent = a;
  if (kb->minnode < ka->minnode) ka->minnode = kb->minnode;
  if (kb->maxnode > ka->maxnode) ka->maxnode = kb->maxnode;
  for (int i = 0; i < kb->npreds; i++) add_pred(F, a, kb->preds[i]);
  kb->preds = NULL; /* in F->scratch */
  kb->npreds = kb->cappreds = 0;
  return a;
}

/* Does kernel `from` (a root, not in the marked set) depend, through any
 * chain of producers, on a kernel of the marked set? Every producer is
 * searched: a kernel of old nodes may still depend on the set through a
 * producer kernel that later nodes joined (its values read by the old
 * kernel, the set's by the new nodes), so node ids prune nothing. */
static int reaches_marked(Fuser *F, int from) {
  /* Under one marked set the kernels an earlier search saw do not reach it
   * (it would have answered 1, and the callers stop there): searches for the
   * same set share what they have seen. */
  if (F->seen_mark != F->markstamp) {
    F->seenstamp++;
    F->seen_mark = F->markstamp;
  }
  if (F->seen[from] == F->seenstamp) return 0;
  int top = 0;
  F->stack[top++] = from;
  F->seen[from] = F->seenstamp;
  while (top) {
    int k = F->stack[--top];
    BK *b = &F->k[k];
    for (int i = 0; i < b->npreds; i++) {
      int p = find(F, b->preds[i]);
      if (F->mark[p] == F->markstamp) {
        F->seen_mark = -1; /* what this search saw is not all unreaching */
        return 1;
      }
      if (F->seen[p] == F->seenstamp) continue;
      F->seen[p] = F->seenstamp;
      F->stack[top++] = p;
    }
  }
  return 0;
}

/* Could the kernels `set` (roots) become one kernel holding node `id` too,
 * without a cycle? */
static int set_feasible(Fuser *F, const int *set, int nset, int id) {
  F->markstamp++;
  for (int i = 0; i < nset; i++) F->mark[set[i]] = F->markstamp;
  /* A member's producers reaching another member: with one member there is
   * no other (its producers cannot reach it - the kernels form no cycle), and
   * searching them all was most of this check's time, which was a sixth of
   * the fusion's */
  for (int i = 0; i < nset && nset > 1; i++) {
    BK *b = &F->k[set[i]];
    for (int j = 0; j < b->npreds; j++) {
      int p = find(F, b->preds[j]);
      if (F->mark[p] == F->markstamp) continue;
      if (reaches_marked(F, p)) return 0;
    }
  }
  const IrNode *n = nd(F->g, id);
  for (int i = 0; i < n->nin; i++) {
    int p = kof(F, n->in[i]);
    if (F->mark[p] == F->markstamp) continue;
    if (reaches_marked(F, p)) return 0;
  }
  return 1;
}

/* The tag a node of shape (rank, dims) gets in space s, or -1 if it does
 * not belong to it. */
static int tag_in(const Space *s, const IrNode *n) {
  if (node_is(n, s)) return TAG_FULL;
  if (is_row_shape(s, n->rank, n->dims)) return TAG_ROW;
  return -1;
}

/* The space node `id` needs given the candidate space q (merged producer
 * kernels), or !valid. Also checks that the inputs it would read inside the
 * kernel stay in their rows. */
static Space require(Fuser *F, int id, const Space *q, const int *set, int nset) {
  Space bad;
  memset(&bad, 0, sizeof bad);
  const IrNode *n = nd(F->g, id);
  Space s = *q;
  int tn;
  if (role_of(F->g, id) == R_RED) {
    int lo, hi;
    reduced_group(F->g, n, &lo, &hi);
    const IrNode *x = nd(F->g, n->in[0]);
    if (!node_is(x, &s)) return bad;
    if (s.red && (s.lo != lo || s.hi != hi)) return bad;
    s.red = 1;
    s.lo = lo;
    s.hi = hi;
    tn = red_output_is_full(n->op) ? TAG_FULL : TAG_ROW;
    if (tag_in(&s, n) < 0) return bad;
  } else {
    tn = tag_in(&s, n);
    if (tn < 0) return bad;
  }
  /* Inputs computed inside the would-be kernel. */
  for (int i = 0; i < n->nin; i++) {
    int p = kof(F, n->in[i]), inside = 0;
    for (int j = 0; j < nset; j++) inside |= set[j] == p;
    if (!inside) continue;
    const IrNode *x = nd(F->g, n->in[i]);
    int tx = tag_in(&s, x);
    if (tx < 0) return bad;
    if (role_of(F->g, id) == R_RED) {
      if (tx != TAG_FULL) return bad;
    } else if (tx == TAG_ROW) {
      if (tn == TAG_FULL ? !row_broadcasts_in_row(&s, x->rank, x->dims)
                         : !same_shape(x->rank, x->dims, n->rank, n->dims))
        return bad;
    } else if (tn != TAG_FULL) {
      return bad;
    }
  }
  return s;
}

static Space kernel_space(Fuser *F, int k) { return F->k[k].sp; }

/* Would backward node `id` joining kernel k put forward work after the
 * backward's start? k holds forward nodes (before the step's cut,
 * IrGraph.fb_split) and one of them is read by a forward node of another
 * kernel, which must then wait for the backward (a pipeline chunk's
 * forward part could not run alone: fuse_can_cut). */
static int strands_forward(Fuser *F, int id, int k) {
  int split = F->g->fb_split;
  if (split <= 0 || id < split || F->k[k].minnode >= split) return 0;
  for (int v = F->k[k].minnode; v < split && v <= F->k[k].maxnode; v++) {
    if (kof(F, v) != k) continue;
    for (int u = F->ustart[v]; u < F->ustart[v + 1]; u++)
      if (F->users[u] < split && kof(F, F->users[u]) != k) return 1;
  }
  return 0;
}

/* Elementwise node or reduction: join / merge producer kernels, or start one. */
static void fuse_compute(Fuser *F, int id) {
  const IrNode *n = nd(F->g, id);
  int cand[16], ncand = 0;
  for (int i = 0; i < n->nin && ncand < 16 && !F->opts.eager; i++) {
    int p = kof(F, n->in[i]), dup = 0;
    if (F->k[p].kind != FUSE_LOOP && F->k[p].kind != FUSE_ROW) continue;
    if (strands_forward(F, id, p)) continue;
    for (int j = 0; j < ncand; j++) dup |= cand[j] == p;
    if (!dup) cand[ncand++] = p;
  }
  int set[16], nset = 0;
  Space acc;
  memset(&acc, 0, sizeof acc);
  for (int c = 0; c < ncand; c++) {
    Space ks = kernel_space(F, cand[c]);
    Space q = space_merge(&acc, &ks);
    if (!q.valid) continue;
    set[nset] = cand[c];
    Space r = require(F, id, &q, set, nset + 1);
    if (!r.valid) continue;
    /* Every kernel already in the set must still fit the final space. */
    int fits = 1;
    for (int j = 0; j < nset && fits; j++) {
      Space kj = kernel_space(F, set[j]);
      Space mj = space_merge(&r, &kj);
      fits = mj.valid;
    }
    if (!fits || !set_feasible(F, set, nset + 1, id)) continue;
    nset++;
    acc = r;
  }
  int k;
  if (nset == 0) {
    Space s;
    if (role_of(F->g, id) == R_RED) {
      s = space_loop(nd(F->g, n->in[0]));
      s.red = 1;
      reduced_group(F->g, n, &s.lo, &s.hi);
    } else {
      s = space_loop(n);
    }
    k = new_kernel(F, s.red ? FUSE_ROW : FUSE_LOOP);
    F->k[k].sp = s;
  } else {
    k = set[0];
    for (int j = 1; j < nset; j++) k = merge(F, k, set[j]);
    F->k[k].sp = acc;
    F->k[k].kind = acc.red ? FUSE_ROW : FUSE_LOOP;
  }
  place(F, id, k);
}

/* Is node b a vector broadcast along the rows of a [..., N] GEMM output? */
static int is_row_vector(const IrNode *b, const IrNode *mm) {
  if (b->rank < 1 || b->dtype != mm->dtype) return 0;
  if (b->dims[b->rank - 1] != mm->dims[mm->rank - 1]) return 0;
  for (int i = 0; i < b->rank - 1; i++)
    if (b->dims[i] != 1) return 0;
  return b->rank <= mm->rank;
}

const FuseOptions FUSE_CUDA_OPTIONS = {.bias_grad = 1, .store16 = 1, .ce_pair = 1};
static const FuseOptions FUSE_CUDA_EAGER = {.store16 = 1, .eager = 1};
static const FuseOptions FUSE_CPU_EAGER = {.eager = 1};

const FuseOptions *fuse_options(int cuda, int fusion) {
  if (cuda) return fusion ? &FUSE_CUDA_OPTIONS : &FUSE_CUDA_EAGER;
  return fusion ? NULL : &FUSE_CPU_EAGER;
}

static int single_use(Fuser *F, int id) { return F->ucount[id] == 1 && !F->is_out[id]; }

/* FuseOptions.store16: may bias ADD n, stored in bf16, end GEMM kernel b
 * whose product of bf16 operands is fp32? */
static int narrow_bias_ok(Fuser *F, const BK *b, const IrNode *n) {
  const IrNode *mm = nd(F->g, b->mm);
  return F->opts.store16 && n->dtype == DT_BF16 && mm->dtype == DT_F32 && nd(F->g, mm->in[0])->dtype == DT_BF16 &&
         nd(F->g, mm->in[1])->dtype == DT_BF16;
}

/* GEMM epilogue: scale, then bias, then activation (rule 4). */
static int try_epilogue(Fuser *F, int id) {
  const IrNode *n = nd(F->g, id);
  if (F->opts.eager && n->op != IR_CAST) return 0; /* eager: only the library's 16-bit store */
  for (int side = 0; side < n->nin && side < 2; side++) {
    int x = n->in[side];
    int k = kof(F, x);
    BK *b = &F->k[k];
    if (b->kind != FUSE_GEMM || b->tail != x) continue;
    const IrNode *xn = nd(F->g, x);
    if (!same_shape(xn->rank, xn->dims, n->rank, n->dims)) continue;
    /* nothing after a 16-bit store; a bias sum may be that store (store16) */
    if (xn->dtype != nd(F->g, b->mm)->dtype) continue;
    if (xn->dtype != n->dtype && !((n->op == IR_ADD || n->op == IR_CAST) && narrow_bias_ok(F, b, n))) continue;
    int step = 0;
    if (n->op == IR_MUL && n->nin == 2) {
      const IrNode *o = nd(F->g, n->in[1 - side]);
      if (o->op == IR_CONST && o->rank == 0 && !b->epilogue && single_use(F, x)) step = FUSE_EPI_SCALE;
    } else if (n->op == IR_ADD && n->nin == 2) {
      int o = n->in[1 - side];
      if (!(b->epilogue & (FUSE_EPI_BIAS | FUSE_EPI_ACT)) && single_use(F, x) && is_row_vector(nd(F->g, o), xn) &&
          o != x) {
        int ko = kof(F, o);
        F->markstamp++;
        F->mark[k] = F->markstamp;
        if (ko != k && !reaches_marked(F, ko)) step = FUSE_EPI_BIAS;
      }
    } else if (n->op == IR_CAST && n->nin == 1) {
      /* store16: the bare product rounded to bf16 (cuBLASLt's bf16 D) */
      if (!b->epilogue && single_use(F, x)) step = FUSE_EPI_CAST;
    } else if ((n->op == IR_RELU || n->op == IR_GELU) && !(b->epilogue & FUSE_EPI_ACT)) {
      /* GELU_AUX writes the pre-activation when others read it too. */
      if (single_use(F, x) || n->op == IR_GELU) step = FUSE_EPI_ACT;
    }
    if (!step) continue;
    b->epilogue |= step;
    if (step == FUSE_EPI_ACT) b->act = n->op;
    b->tail = id;
    place(F, id, k);
    return 1;
  }
  return 0;
}

/* FuseOptions.store16: a CAST to 16 bits of an ATTENTION_BWD's gradient, its one
 * reader, joins the special kernel when q is stored in that type (the CUDA target's
 * 16-bit kernels, which store the gradient in it themselves; precision.c). */
static int try_special_cast(Fuser *F, int id) {
  const IrNode *n = nd(F->g, id);
  if (!F->opts.store16 || n->op != IR_CAST || n->nin != 1 || (n->dtype != DT_BF16 && n->dtype != DT_F16)) return 0;
  int x = n->in[0];
  const IrNode *a = nd(F->g, x);
  if (a->op != IR_ATTENTION_BWD || a->dtype != DT_F32 || nd(F->g, a->in[0])->dtype != n->dtype || !single_use(F, x)) return 0;
  int k = kof(F, x);
  if (F->k[k].kind != FUSE_SPECIAL) return 0;
  place(F, id, k);
  return 1;
}

static int is_index_map(IrOp op);

/* The one reader of value v in g (its graph outputs count as readers), or -1. */
static int only_reader(const IrGraph *g, int v) {
  for (int k = 0; k < g->noutputs; k++)
    if (g->outputs[k] == v) return -1;
  int r = -1;
  for (int i = v + 1; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nin; k++)
      if (g->nodes[i].in[k] == v) {
        if (r >= 0 && r != i) return -1;
        r = i;
      }
  return r;
}

int fuse_attn_out16(const IrGraph *g, int id) {
  if (id < 0 || id >= g->nnodes) return -1;
  int s = id;
  if (g->nodes[s].op == IR_CAST && g->nodes[s].nin == 1) s = g->nodes[s].in[0];
  if (g->nodes[s].op == IR_TRANSPOSE && g->nodes[s].nin == 1) s = g->nodes[s].in[0];
  const IrNode *sl = &g->nodes[s];
  if (sl->op != IR_SLICE || sl->nin != 1 || sl->rank != 4) return -1;
  int a = sl->in[0];
  const IrNode *at = &g->nodes[a];
  if (at->op != IR_ATTENTION || at->nin < 3 || at->rank != 4 || at->dtype != DT_F32) return -1;
  DType q = g->nodes[at->in[0]].dtype;
  if (q != DT_BF16 && q != DT_F16) return -1;
  /* the slice: o, the first Dv of the Dv + 1 columns */
  for (int d = 0; d < 4; d++)
    if (sl->attr[d] != 0 || sl->dims[d] != at->dims[d] - (d == 3)) return -1;
  int t = only_reader(g, s);
  if (t < 0) return -1;
  if (!ir_heads_transpose(&g->nodes[t])) return -1;
  int c = only_reader(g, t);
  if (c < 0 || g->nodes[c].op != IR_CAST || g->nodes[c].dtype != q) return -1;
  return id == s || id == t || id == c ? a : -1;
}

int fuse_attn_grad16(const IrGraph *g, int id) {
  if (id < 0 || id >= g->nnodes) return -1;
  int x = id;
  if (g->nodes[x].op == IR_TRANSPOSE && g->nodes[x].nin == 1) x = g->nodes[x].in[0];
  if (g->nodes[x].op == IR_RESHAPE && g->nodes[x].nin == 1) x = g->nodes[x].in[0];
  if (g->nodes[x].op == IR_SLICE && g->nodes[x].nin == 1) x = g->nodes[x].in[0];
  if (g->nodes[x].op != IR_CAST || g->nodes[x].nin != 1) return -1;
  int c = x, a = g->nodes[c].in[0];
  const IrNode *ab = &g->nodes[a];
  if (ab->op != IR_ATTENTION_BWD || ab->nin < 5 || ab->dtype != DT_F32 || only_reader(g, a) != c) return -1;
  const IrNode *q = &g->nodes[ab->in[0]], *k = &g->nodes[ab->in[1]], *v = &g->nodes[ab->in[2]];
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || g->nodes[c].dtype != q->dtype ||
      (q->dtype != DT_BF16 && q->dtype != DT_F16))
    return -1;
  for (int o = 0; o < g->noutputs; o++)
    if (g->outputs[o] == c) return -1;
  /* the cast's readers: one slice of each part, reshaped and transposed */
  const IrNode *part[3] = {q, k, v};
  int64_t start[3] = {0, ir_numel(q), ir_numel(q) + ir_numel(k)};
  int member = id == c, found[3] = {0, 0, 0}, nreaders = 0;
  for (int i = c + 1; i < g->nnodes; i++) {
    const IrNode *sl = &g->nodes[i];
    int reads = 0;
    for (int j = 0; j < sl->nin; j++) reads |= sl->in[j] == c;
    if (!reads) continue;
    nreaders++;
    if (sl->op != IR_SLICE || sl->nin != 1 || sl->rank != 1) return -1;
    int p = -1;
    for (int j = 0; j < 3; j++)
      if (sl->attr[0] == start[j] && sl->dims[0] == ir_numel(part[j])) p = j;
    if (p < 0 || found[p]) return -1;
    int r = only_reader(g, i);
    if (r < 0) return -1;
    const IrNode *rs = &g->nodes[r];
    if (rs->op != IR_RESHAPE || rs->rank != 4) return -1;
    for (int d = 0; d < 4; d++)
      if (rs->dims[d] != part[p]->dims[d]) return -1;
    int t = only_reader(g, r);
    if (t < 0 || !ir_heads_transpose(&g->nodes[t])) return -1;
    found[p] = 1;
    member |= id == i || id == r || id == t;
  }
  return nreaders == 3 && found[0] && found[1] && found[2] && member ? a : -1;
}

int fuse_attn_dout(const IrGraph *g, int id) {
  if (id < 0 || id >= g->nnodes) return -1;
  int pad = id;
  if (g->nodes[id].op == IR_TRANSPOSE) pad = only_reader(g, id);
  if (pad < 0) return -1;
  const IrNode *pd = &g->nodes[pad];
  if (pd->op != IR_PAD || pd->nin != 1 || pd->rank != 4 || pd->dtype != DT_F32) return -1;
  int t = pd->in[0], a = only_reader(g, pad);
  const IrNode *tr = &g->nodes[t];
  if (a < 0 || !ir_heads_transpose(tr) || only_reader(g, t) != pad || (id != t && id != pad)) return -1;
  const IrNode *ab = &g->nodes[a];
  if (ab->op != IR_ATTENTION_BWD || ab->nin < 5 || ab->in[4] != pad) return -1;
  for (int k = 0; k < 4; k++)
    if (ab->in[k] == pad) return -1;
  DType q = g->nodes[ab->in[0]].dtype;
  if (q != DT_BF16 && q != DT_F16) return -1;
  for (int d = 0; d < 4; d++)
    if (pd->attr[d] != 0 || pd->dims[d] != tr->dims[d] + (d == 3)) return -1;
  return a;
}

int fuse_attn_qkv(const IrGraph *g, int id) {
  if (id < 0 || id >= g->nnodes || !ir_heads_transpose(&g->nodes[id])) return -1;
  int a = only_reader(g, id);
  if (a < 0) return -1;
  const IrNode *at = &g->nodes[a];
  if ((at->op != IR_ATTENTION && at->op != IR_ATTENTION_BWD) || at->nin < 3) return -1;
  DType q = g->nodes[at->in[0]].dtype;
  if (q != DT_BF16 && q != DT_F16) return -1;
  /* all three the heads' transposes of values [B, T, H, D], each read once, and as
   * nothing else (not twice, not as another input of the attention) */
  int member = 0;
  for (int k = 0; k < 3; k++) {
    int t = at->in[k];
    if (!ir_heads_transpose(&g->nodes[t]) || only_reader(g, t) != a || g->nodes[g->nodes[t].in[0]].rank != 4) return -1;
    for (int j = 0; j < at->nin; j++)
      if (j != k && at->in[j] == t) return -1;
    member |= t == id;
  }
  return member ? a : -1;
}

/* FuseOptions.store16: fuse_attn_dout's transpose and pad and fuse_attn_qkv's three
 * transposes, in kernels of their own so far (they come before the attention), join
 * its new special kernel k. */
static void attn_operands_join(Fuser *F, int id, int k) {
  IrOp op = nd(F->g, id)->op;
  if (!F->opts.store16 || (op != IR_ATTENTION && op != IR_ATTENTION_BWD)) return;
  for (int j = 0; j < 3; j++)
    if (fuse_attn_qkv(F->g, nd(F->g, id)->in[j]) == id) place(F, nd(F->g, id)->in[j], k);
  if (op != IR_ATTENTION_BWD) return;
  int pad = nd(F->g, id)->in[4];
  if (fuse_attn_dout(F->g, pad) != id) return;
  place(F, nd(F->g, pad)->in[0], k);
  place(F, pad, k);
}

/* FuseOptions.store16: the chains of fuse_attn_out16 and fuse_attn_grad16, which come
 * after the attention, join its special kernel (placed as each node is met, in node
 * order; fuse_attn_dout's come before it: attn_operands_join). */
static int try_attn_layout(Fuser *F, int id) {
  if (!F->opts.store16) return 0;
  int a = fuse_attn_out16(F->g, id);
  if (a < 0 && nd(F->g, id)->op != IR_CAST) a = fuse_attn_grad16(F->g, id); /* (the cast: try_special_cast) */
  if (a < 0) return 0;
  int k = kof(F, a);
  if (F->k[k].kind != FUSE_SPECIAL) return 0;
  place(F, id, k);
  return 1;
}

/* Rule 5: may shape op `id` be folded into the kernel of its one consumer? */
static int foldable(Fuser *F, int id, int consumer, int ck) {
  const IrNode *n = nd(F->g, id);
  FuseKind kind = F->k[ck].kind;
  if (kof(F, n->in[0]) == ck) return 0; /* the index map must read memory */
  /* nor may a consumer that is itself an index map of that kernel read it
   * (reshape -> expand: the expand would read a value of its own kernel) */
  if (is_index_map(nd(F->g, consumer)->op) && kind != FUSE_VIEW && kind != FUSE_COPY) return 0;
  switch (n->op) {
  case IR_RESHAPE: return kind != FUSE_LEAF;
  case IR_TRANSPOSE:
    if (kind == FUSE_GEMM) return F->k[ck].mm == consumer && ir_swaps_last_two(n);
    return kind == FUSE_LOOP || kind == FUSE_ROW || kind == FUSE_COPY;
  case IR_SLICE:
  case IR_EXPAND:
  case IR_REPEAT_KV: return kind == FUSE_LOOP || kind == FUSE_ROW || kind == FUSE_COPY;
  default: return 0;
  }
}

static void fold_shape_ops(Fuser *F) {
  for (int id = F->n - 1; id >= 0; id--) {
    Role r = role_of(F->g, id);
    if (r != R_VIEW && r != R_COPY) continue;
    if (!single_use(F, id)) continue;
    if (F->k[kof(F, id)].kind == FUSE_SPECIAL) continue; /* an attention's layout chain stays there */
    int c = F->users[F->ustart[id]];
    int ck = kof(F, c), sk = kof(F, id);
    if (sk == ck || !foldable(F, id, c, ck)) continue;
    int k = merge(F, ck, sk);
    F->kof[id] = k;
  }
}

/* ---- rule 8: bias gradients into their GEMM ---- */

/* A matmul operand through the transposes and reshapes folded into its
 * GEMM kernel k (as gemm.c resolves it): the buffer, whether op() transposes
 * it, and the node whose shape is the stored matrix. */
static int gemm_operand(Fuser *F, int k, int v, int trans, int *trans_out, int *shape_out) {
  int shape = v;
  while (kof(F, v) == k) {
    const IrNode *n = nd(F->g, v);
    if (n->op == IR_TRANSPOSE) {
      trans ^= 1;
      v = n->in[0];
      shape = v;
    } else if (n->op == IR_RESHAPE) {
      v = n->in[0];
    } else {
      return -1;
    }
  }
  *trans_out = trans;
  *shape_out = shape;
  return v;
}

/* May kernels a and b (roots) become one without a cycle: no path from one
 * to the other through a third kernel? */
static int pair_feasible(Fuser *F, int a, int b) {
  F->markstamp++;
  F->mark[a] = F->mark[b] = F->markstamp;
  const int set[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    BK *k = &F->k[set[i]];
    for (int j = 0; j < k->npreds; j++) {
      int p = find(F, k->preds[j]);
      if (F->mark[p] != F->markstamp && reaches_marked(F, p)) return 0;
    }
  }
  return 1;
}

/* The GEMM kernel that sum node `id` (a lone SUM_TO / REDUCE_SUM of kernel
 * s) can join as its bias gradient, or -1. */
static int bgrad_gemm(Fuser *F, int id, int s) {
  const IrNode *n = nd(F->g, id);
  for (int v = F->k[s].minnode; v <= F->k[s].maxnode; v++)
    if (kof(F, v) == s && v != id && nd(F->g, v)->op != IR_RESHAPE) return -1;
  int lo, hi;
  const IrNode *x = nd(F->g, n->in[0]);
  if (!reduced_group(F->g, n, &lo, &hi) || lo != 0 || hi != x->rank - 1 || x->rank < 2) return -1;
  int64_t cols = x->dims[x->rank - 1];
  if (ir_numel(n) != cols || (x->dtype != DT_F32 && x->dtype != DT_BF16) || n->dtype != DT_F32) return -1;
  int mem = n->in[0];
  while (kof(F, mem) == s && nd(F->g, mem)->op == IR_RESHAPE) mem = nd(F->g, mem)->in[0];
  int split = F->g->fb_split;
  for (int u = F->ustart[mem]; u < F->ustart[mem + 1]; u++) {
    /* the matmul that reads mem, directly or through its folded views */
    int c = F->users[u];
    while (kof(F, c) != s && (nd(F->g, c)->op == IR_RESHAPE || nd(F->g, c)->op == IR_TRANSPOSE) && F->ucount[c] == 1 &&
           !F->is_out[c])
      c = F->users[F->ustart[c]];
    const IrNode *mm = nd(F->g, c);
    int g = kof(F, c);
    if (mm->op != IR_MATMUL || F->k[g].kind != FUSE_GEMM || F->k[g].epilogue || F->k[g].mm != c) continue;
    int one = 1;
    for (int i = 0; i + 2 < mm->rank; i++) one &= mm->dims[i] == 1;
    if (!one || (split > 0 && (id >= split) != (c >= split))) continue;
    for (int side = 0; side < 2; side++) {
      int trans = 0, shape = -1;
      if (gemm_operand(F, g, mm->in[side], (int)mm->attr[side], &trans, &shape) != mem) continue;
      const IrNode *sh = nd(F->g, shape);
      int plain = sh->rank >= 2;
      for (int i = 0; i + 2 < sh->rank; i++) plain &= sh->dims[i] == 1;
      /* stored [K, X]: B as it is, A transposed */
      if (!plain || trans != (side == 0) || sh->dims[sh->rank - 1] != cols || ir_numel(sh) != ir_numel(x)) continue;
      int t2 = 0, s2 = -1, other = gemm_operand(F, g, mm->in[1 - side], 0, &t2, &s2);
      /* cuBLASLt's bias gradient of fp32 or bf16 operands, both alike, into fp32 */
      if (other < 0 || nd(F->g, other)->dtype != x->dtype) continue;
      if (!pair_feasible(F, g, s)) continue;
      return g;
    }
  }
  return -1;
}

static void absorb_bias_grads(Fuser *F) {
  for (int id = 0; id < F->n; id++) {
    IrOp op = nd(F->g, id)->op;
    if (op != IR_SUM_TO && op != IR_REDUCE_SUM) continue;
    int s = kof(F, id);
    if (F->k[s].kind != FUSE_ROW) continue;
    int g = bgrad_gemm(F, id, s);
    if (g < 0) continue;
    merge(F, g, s);
    F->k[g].epilogue |= FUSE_EPI_BGRAD;
    F->k[g].bgrad = id;
  }
}

/* Rule 9: siblings. A loop kernel that reads a value a row or loop kernel
 * reads too, over that kernel's full space, joins it when neither depends on
 * the other and both lie in the same part of a cut step: the value is read
 * once for both, the loop's values stored in the other kernel's sweep (GPT's
 * GELU made again in the backward for the MLP's weight gradient, beside
 * GELU's gradient and its bias sum, which read the same pre-activation;
 * SwiGLU's product made again beside its gradient). The joined kernel loads
 * each element once (nest_x_load), so its registers are not the two
 * kernels' sum. */
static int same_space(const Space *a, const Space *b) { return same_shape(a->rank, a->dims, b->rank, b->dims); }

static int in_part(Fuser *F, int k, int part) {
  int split = F->g->fb_split;
  if (split <= 0) return 1;
  return part ? F->k[k].minnode >= split : F->k[k].maxnode < split;
}

/* Does kernel k read a value of kernel p (both roots)? */
static int reads_kernel(Fuser *F, int k, int p) {
  for (int i = 0; i < F->k[k].npreds; i++)
    if (find(F, F->k[k].preds[i]) == p) return 1;
  return 0;
}

static void merge_siblings(Fuser *F) {
  int cand[16];
  for (int v = 0; v < F->n; v++) {
    int nc = 0;
    for (int u = F->ustart[v]; u < F->ustart[v + 1] && nc < 16; u++) {
      int k = kof(F, F->users[u]), dup = k == kof(F, v);
      if (F->k[k].kind != FUSE_LOOP && F->k[k].kind != FUSE_ROW) continue;
      for (int j = 0; j < nc; j++) dup |= cand[j] == k;
      if (!dup) cand[nc++] = k;
    }
    for (int i = 0; i < nc; i++) {
      int a = find(F, cand[i]);
      if (F->k[a].kind != FUSE_LOOP || F->k[a].sp.red) continue;
      for (int j = 0; j < nc; j++) {
        int b = find(F, cand[j]);
        if (b == a || (F->k[b].kind != FUSE_ROW && F->k[b].kind != FUSE_LOOP) || !same_space(&F->k[a].sp, &F->k[b].sp))
          continue;
        int part = F->g->fb_split > 0 && F->k[b].minnode >= F->g->fb_split;
        if (!in_part(F, a, part) || !in_part(F, b, part) || reads_kernel(F, a, b) || reads_kernel(F, b, a) ||
            !pair_feasible(F, a, b))
          continue;
        merge(F, b, a);
        break;
      }
    }
  }
}

/* ---- from the built kernels to the result ---- */

static int *arena_ints(Arena *a, int n) { return arena_alloc(a, sizeof(int) * (size_t)(n > 0 ? n : 1)); }

/* A min-heap of kernel indices keyed by their smallest node. */
static void heap_push(int *h, int *nh, int v, const int *key) {
  int i = (*nh)++;
  h[i] = v;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (key[h[p]] <= key[h[i]]) break;
    int t = h[p];
    h[p] = h[i];
    h[i] = t;
    i = p;
  }
}

static int heap_pop(int *h, int *nh, const int *key) {
  int top = h[0];
  h[0] = h[--(*nh)];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < *nh && key[h[l]] < key[h[m]]) m = l;
    if (r < *nh && key[h[r]] < key[h[m]]) m = r;
    if (m == i) break;
    int t = h[m];
    h[m] = h[i];
    h[i] = t;
    i = m;
  }
  return top;
}

static int is_ce_pair(const IrGraph *g, const FuseKernel *K);

/* Bytes a kernel reads from boundary value v through its node c's input k:
 * a folded view reads the buffer it views. */
static double read_through(const IrModule *m, const IrGraph *g, int c, int k) {
  const IrNode *cn = nd(g, c);
  if (cn->op == IR_RESHAPE) {
    const IrNode *x = nd(g, cn->in[k]);
    return x->op == IR_CONST ? 0 : (double)ir_bytes(x);
  }
  return ircost_read_bytes(m, g, c, k);
}

/* A kernel's work: its nodes' FLOPs; for loop, row, gemm and copy kernels
 * and a cross-entropy with its backward the bytes of the values crossing its
 * boundary, for the others (one op, perhaps with folded views) that op's own
 * bytes; a CALL costs its graph's fused totals x its repeat count. */
static void kernel_cost(const FuseResult *r, const IrGraph *g, FuseKernel *K) {
  const IrModule *m = r->module;
  K->flops = K->bytes_read = K->bytes_written = 0;
  int generic = K->kind == FUSE_LOOP || K->kind == FUSE_ROW || K->kind == FUSE_GEMM || K->kind == FUSE_COPY ||
                is_ce_pair(g, K);
  for (int i = 0; i < K->nnodes; i++) {
    const IrNode *n = nd(g, K->nodes[i]);
    if (n->op == IR_CALL) {
      int64_t gi = n->attr[0];
      double times = (double)(n->attr[1] > 0 ? n->attr[1] : 1);
      if (gi >= 0 && gi < r->ngraphs && r->graphs[gi].graph) {
        K->flops += r->graphs[gi].flops * times;
        K->bytes_read += r->graphs[gi].bytes_read * times;
        K->bytes_written += r->graphs[gi].bytes_written * times;
      }
      continue;
    }
    IrCost c = ircost_node(m, g, K->nodes[i]);
    K->flops += c.flops;
    if (!generic) {
      K->bytes_read += c.bytes_read;
      K->bytes_written += c.bytes_written;
    }
  }
  if (!generic) return;
  for (int i = 0; i < K->ninputs; i++) {
    int v = K->inputs[i];
    double most = 0;
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *cn = nd(g, K->nodes[j]);
      for (int k = 0; k < cn->nin; k++)
        if (cn->in[k] == v) {
          double b = read_through(m, g, K->nodes[j], k);
          if (b > most) most = b;
        }
    }
    K->bytes_read += most;
  }
  for (int i = 0; i < K->noutputs; i++) K->bytes_written += (double)ir_bytes(nd(g, K->outputs[i]));
}

static void fuse_one(Arena *arena, const FuseResult *res, const IrGraph *g, const FuseOptions *opts, FuseGraph *out) {
  const IrModule *m = res->module;
  Fuser F;
  memset(&F, 0, sizeof F);
  if (opts) F.opts = *opts;
  F.m = m;
  F.g = g;
  F.n = g->nnodes;
  int n = F.n;
  F.scratch = arena_new();
  /* at most a kernel a node, but for what the later passes split off */
  F.capk = n + 16;
  F.k = xalloc_malloc(sizeof(BK) * (size_t)F.capk); /* new_kernel sets each entry */
  F.mark = xalloc_malloc(sizeof(int) * (size_t)F.capk);
  F.seen = xalloc_malloc(sizeof(int) * (size_t)F.capk);
  F.stack = xalloc_malloc(sizeof(int) * (size_t)F.capk);
  F.kof = xalloc_calloc((size_t)n, sizeof(int));
  F.ucount = xalloc_calloc((size_t)n, sizeof(int));
  F.ustart = xalloc_calloc((size_t)n + 1, sizeof(int));
  F.is_out = xalloc_calloc((size_t)n, 1);
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] >= 0 && g->outputs[i] < n) F.is_out[g->outputs[i]] = 1;
  /* Distinct consumers of each node (CSR). */
  for (int i = 0; i < n; i++) {
    const IrNode *x = nd(g, i);
    for (int k = 0; k < x->nin; k++) {
      int dup = 0;
      for (int j = 0; j < k; j++) dup |= x->in[j] == x->in[k];
      if (!dup) F.ucount[x->in[k]]++;
    }
  }
  for (int i = 0; i < n; i++) F.ustart[i + 1] = F.ustart[i] + F.ucount[i];
  F.users = xalloc_calloc((size_t)F.ustart[n] + 1, sizeof(int));
  int *fill = xalloc_calloc((size_t)n + 1, sizeof(int));
  for (int i = 0; i < n; i++) {
    const IrNode *x = nd(g, i);
    for (int k = 0; k < x->nin; k++) {
      int dup = 0;
      for (int j = 0; j < k; j++) dup |= x->in[j] == x->in[k];
      if (!dup) F.users[F.ustart[x->in[k]] + fill[x->in[k]]++] = i;
    }
  }
  free(fill);

  /* Context parallelism's transfers pair in program order (a receive takes
   * the message of the oldest send not yet received, comm_ring.c; keys and
   * values are alike in size): each follows the one before it in node order
   * as if it read it, so that no fused kernel needs a receive before the
   * send it pairs with and the kernels keep their order (rule 7) */
  int *paired = xalloc_calloc((size_t)n + 1, sizeof(int));
  for (int id = 0, last = -1; id < n; id++) {
    const IrNode *x = nd(g, id);
    paired[id] = -1;
    if ((x->op != IR_SEND && x->op != IR_RECV) || x->attr[0] != IRG_CP) continue;
    paired[id] = last;
    last = id;
  }
  /* Greedy grouping in node order (rules 1-4, 6). */
  for (int id = 0; id < n; id++) {
    int k;
    switch (role_of(g, id)) {
    case R_LEAF: k = new_kernel(&F, FUSE_LEAF); break;
    case R_VIEW:
    case R_COPY:
      if (try_attn_layout(&F, id)) continue;
      k = new_kernel(&F, role_of(g, id) == R_VIEW ? FUSE_VIEW : FUSE_COPY);
      break;
    case R_COMM: k = new_kernel(&F, FUSE_COMM); break;
    case R_CALL: k = new_kernel(&F, FUSE_CALL); break;
    case R_SPECIAL:
      k = linear_ce_partner(&F, id);
      if (k < 0) k = ce_partner(&F, id);
      if (k < 0) k = new_kernel(&F, FUSE_SPECIAL);
      attn_operands_join(&F, id, k);
      break;
    case R_GEMM:
      k = new_kernel(&F, FUSE_GEMM);
      F.k[k].mm = F.k[k].tail = id;
      break;
    case R_EW:
      if (try_epilogue(&F, id) || try_special_cast(&F, id) || try_attn_layout(&F, id)) continue;
      fuse_compute(&F, id);
      continue;
    case R_RED: fuse_compute(&F, id); continue;
    default: k = new_kernel(&F, FUSE_SPECIAL); break;
    }
    place(&F, id, k);
    if (paired[id] >= 0) add_pred(&F, k, kof(&F, paired[id]));
  }
  fold_shape_ops(&F);
  if (F.opts.bias_grad && !F.opts.eager) absorb_bias_grads(&F);
  if (!F.opts.eager) merge_siblings(&F);

  /* Final kernels: the roots, ordered topologically (rule 7). */
  int *index = xalloc_calloc((size_t)F.nk + 1, sizeof(int)); /* root -> dense index */
  int nk = 0;
  for (int k = 0; k < F.nk; k++) index[k] = -1;
  int *minnode = xalloc_calloc((size_t)F.nk + 1, sizeof(int));
  int *rootof = xalloc_calloc((size_t)F.nk + 1, sizeof(int));
  for (int id = 0; id < n; id++) {
    int r = kof(&F, id);
    if (index[r] < 0) {
      index[r] = nk;
      rootof[nk] = r;
      minnode[nk] = id; /* nodes are visited in ascending order */
      nk++;
    }
  }
  int *dense = xalloc_calloc((size_t)n + 1, sizeof(int));
  int *size = xalloc_calloc((size_t)nk + 1, sizeof(int));
  for (int id = 0; id < n; id++) {
    dense[id] = index[kof(&F, id)];
    size[dense[id]]++;
  }
  /* Kernel edges (deduplicated per consumer kernel with a stamp). */
  int *indeg = xalloc_calloc((size_t)nk + 1, sizeof(int));
  int *stamp = xalloc_calloc((size_t)nk + 1, sizeof(int));
  int **succ = xalloc_calloc((size_t)nk + 1, sizeof(int *));
  int *nsucc = xalloc_calloc((size_t)nk + 1, sizeof(int)), *capsucc = xalloc_calloc((size_t)nk + 1, sizeof(int));
  for (int k = 0; k < nk; k++) stamp[k] = -1;
  /* For each consumer kernel, its distinct producer kernels. */
  int **members = xalloc_calloc((size_t)nk + 1, sizeof(int *));
  int *nmem = xalloc_calloc((size_t)nk + 1, sizeof(int));
  int *memb = xalloc_calloc((size_t)n + 1, sizeof(int)); /* every kernel's members, one after another */
  for (int k = 0, at = 0; k < nk; at += size[k], k++) members[k] = memb + at;
  for (int id = 0; id < n; id++) members[dense[id]][nmem[dense[id]]++] = id;
  for (int k = 0; k < nk; k++) {
    for (int j = 0; j < nmem[k]; j++) {
      const IrNode *x = nd(g, members[k][j]);
      for (int i = 0; i < x->nin + (paired[members[k][j]] >= 0); i++) {
        int p = dense[i < x->nin ? x->in[i] : paired[members[k][j]]];
        if (p == k || stamp[p] == k) continue;
        stamp[p] = k;
        if (nsucc[p] == capsucc[p]) {
          capsucc[p] = capsucc[p] ? capsucc[p] * 2 : 4;
          int *grown = arena_alloc_raw(F.scratch, sizeof(int) * (size_t)capsucc[p]);
          if (nsucc[p]) memcpy(grown, succ[p], sizeof(int) * (size_t)nsucc[p]);
          succ[p] = grown;
        }
        succ[p][nsucc[p]++] = k;
        indeg[k]++;
      }
    }
  }
  /* A context-parallel send goes first once it is ready: its exchange runs
   * in the background until its receive, so the kernels between them (the
   * ring's attention on the block before) hide it. By node order alone the
   * attention, which reads q from far earlier, came first at cp > 2 and
   * every exchange but a ring's first waited whole. */
  for (int id = 0; id < n; id++)
    if (nd(g, id)->op == IR_SEND && nd(g, id)->attr[0] == IRG_CP) minnode[dense[id]] = -1;
  int *heap = xalloc_calloc((size_t)nk + 1, sizeof(int)), nh = 0;
  int *order = xalloc_calloc((size_t)nk + 1, sizeof(int)), norder = 0;
  for (int k = 0; k < nk; k++)
    if (!indeg[k]) heap_push(heap, &nh, k, minnode);
  while (nh) {
    int k = heap_pop(heap, &nh, minnode);
    order[norder++] = k;
    for (int i = 0; i < nsucc[k]; i++)
      if (--indeg[succ[k][i]] == 0) heap_push(heap, &nh, succ[k][i], minnode);
  }
  /* A cycle would leave kernels unordered; the rules exclude it, and
   * fuse_check reports it if it happened: list the rest in node order. */
  if (norder < nk) {
    char *done = xalloc_calloc((size_t)nk + 1, 1);
    for (int i = 0; i < norder; i++) done[order[i]] = 1;
    for (int k = 0; k < nk; k++)
      if (!done[k]) order[norder++] = k;
    free(done);
  }
  int *pos = xalloc_calloc((size_t)nk + 1, sizeof(int));
  for (int i = 0; i < nk; i++) pos[order[i]] = i;

  out->graph = g;
  out->nkernels = nk;
  out->kernels = arena_alloc(arena, sizeof(FuseKernel) * (size_t)(nk > 0 ? nk : 1));
  out->kernel_of = arena_ints(arena, n);
  for (int id = 0; id < n; id++) out->kernel_of[id] = pos[dense[id]];
  int *vstamp = xalloc_calloc((size_t)n + 1, sizeof(int)), *inbuf = xalloc_calloc((size_t)n + 1, sizeof(int));
  for (int i = 0; i < n; i++) vstamp[i] = -1;
  for (int p = 0; p < nk; p++) {
    int k = order[p];
    BK *b = &F.k[rootof[k]];
    FuseKernel *K = &out->kernels[p];
    memset(K, 0, sizeof *K);
    K->kind = b->kind;
    K->act = b->act;
    K->epilogue = b->epilogue;
    K->bgrad = b->bgrad;
    K->nnodes = nmem[k];
    K->nodes = arena_ints(arena, nmem[k]);
    memcpy(K->nodes, members[k], sizeof(int) * (size_t)nmem[k]);
    if (b->kind == FUSE_LOOP || b->kind == FUSE_ROW) {
      K->rank = b->sp.rank;
      memcpy(K->dims, b->sp.dims, sizeof K->dims);
      K->red_lo = b->sp.red ? b->sp.lo : 0;
      K->red_hi = b->sp.red ? b->sp.hi : 0;
    } else {
      const IrNode *main = nd(g, b->kind == FUSE_GEMM ? b->mm : K->nodes[K->nnodes - 1]);
      K->rank = main->rank;
      memcpy(K->dims, main->dims, sizeof K->dims);
    }
    /* Inputs: values from other kernels, ascending (gathered, then sorted:
     * a pass over every value per kernel was the planner's hottest loop) */
    int nin = 0;
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *x = nd(g, K->nodes[j]);
      for (int i = 0; i < x->nin; i++)
        if (out->kernel_of[x->in[i]] != p && vstamp[x->in[i]] != p) {
          vstamp[x->in[i]] = p;
          inbuf[nin++] = x->in[i];
        }
    }
    K->inputs = arena_ints(arena, nin);
    for (int i = 0; i < nin; i++) { /* insertion sort: a kernel reads few values */
      int v = inbuf[i], at = i;
      for (; at > 0 && K->inputs[at - 1] > v; at--) K->inputs[at] = K->inputs[at - 1];
      K->inputs[at] = v;
    }
    K->ninputs = nin;
    /* Outputs: its values read elsewhere or returned. */
    int nout = 0;
    for (int j = 0; j < K->nnodes; j++) {
      int v = K->nodes[j], used = F.is_out[v];
      for (int u = F.ustart[v]; u < F.ustart[v + 1] && !used; u++) used = out->kernel_of[F.users[u]] != p;
      nout += used;
    }
    K->outputs = arena_ints(arena, nout);
    for (int j = 0; j < K->nnodes; j++) {
      int v = K->nodes[j], used = F.is_out[v];
      for (int u = F.ustart[v]; u < F.ustart[v + 1] && !used; u++) used = out->kernel_of[F.users[u]] != p;
      if (used) K->outputs[K->noutputs++] = v;
    }
    kernel_cost(res, g, K);
    out->flops += K->flops;
    out->bytes_read += K->bytes_read;
    out->bytes_written += K->bytes_written;
  }

  free(vstamp);
  free(inbuf);
  free(pos);
  free(order);
  free(heap);
  free(memb);
  free(members);
  free(nmem);
  free(succ);
  free(nsucc);
  free(capsucc);
  free(stamp);
  free(indeg);
  free(size);
  free(dense);
  free(paired);
  free(rootof);
  free(minnode);
  free(index);
  arena_free(F.scratch);
  free(F.k);
  free(F.mark);
  free(F.seen);
  free(F.stack);
  free(F.users);
  free(F.is_out);
  free(F.ustart);
  free(F.ucount);
  free(F.kof);
}

FuseResult *fuse_module(Arena *arena, const IrModule *m) { return fuse_module_opts(arena, m, NULL); }

FuseResult *fuse_module_opts(Arena *arena, const IrModule *m, const FuseOptions *opts) {
  return fuse_module_cached(arena, m, opts, NULL);
}

/* ---- the cache of fused graphs ---- */

typedef struct {
  uint64_t h[2]; /* content hash; h[0] == h[1] == 0: an empty slot */
  FuseGraph fg;  /* graph NULL: its arrays live in the cache's arena */
} FuseEntry;

struct FuseCache {
  Arena *arena;
  FuseEntry *slots;
  size_t cap, count;
  int64_t fused, found;
};

/* Past this much memory the cache stops taking graphs (it still answers):
 * a search's distinct graphs take a few tens of MB. */
enum { FUSE_CACHE_MAX_BYTES = 256 << 20 };

FuseCache *fuse_cache_new(void) {
  FuseCache *c = xalloc_calloc(1, sizeof *c);
  c->arena = arena_new();
  return c;
}

void fuse_cache_free(FuseCache *c) {
  if (!c) return;
  arena_free(c->arena);
  free(c->slots);
  free(c);
}

void fuse_cache_counts(const FuseCache *c, int64_t *fused, int64_t *found) {
  if (fused) *fused = c ? c->fused : 0;
  if (found) *found = c ? c->found : 0;
}

/* Two 64-bit lanes with different mixes: a 128-bit content hash. */
typedef struct {
  uint64_t a, b;
} Hash2;

static void hmix(Hash2 *h, uint64_t v) {
  h->a = (h->a ^ v) * 0x100000001b3ull;
  h->a ^= h->a >> 29;
  h->b = (h->b + v + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  h->b ^= h->b >> 31;
}

/* Everything fuse_one's grouping reads of graph gi. Not its callees' content:
 * a CALL is a kernel of its own whatever it calls, and only its work figures
 * (the callee's fused totals) depend on it, which a graph found in the cache
 * takes again from this module's callees (refresh_calls). A training step
 * differs from another policy's in its callees alone, so it is fused once. */
static Hash2 graph_hash(const IrModule *m, int gi, const FuseOptions *opts) {
  const IrGraph *g = m->graphs[gi];
  Hash2 h = {0xcbf29ce484222325ull, 0x6a09e667f3bcc908ull};
  hmix(&h, (uint64_t)g->nnodes);
  hmix(&h, (uint64_t)(int64_t)g->fb_split);
  hmix(&h, (uint64_t)(opts && opts->bias_grad));
  hmix(&h, (uint64_t)(opts && opts->store16));
  hmix(&h, (uint64_t)(opts && opts->ce_pair));
  hmix(&h, (uint64_t)(opts && opts->eager));
  hmix(&h, (uint64_t)g->noutputs);
  for (int i = 0; i < g->noutputs; i++) hmix(&h, (uint64_t)(int64_t)g->outputs[i]);
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    hmix(&h, (uint64_t)n->op | (uint64_t)n->dtype << 16 | (uint64_t)n->rank << 32 | (uint64_t)n->nin << 40);
    for (int d = 0; d < n->rank; d++) hmix(&h, (uint64_t)n->dims[d]);
    for (int k = 0; k < n->nin; k++) hmix(&h, (uint64_t)(int64_t)n->in[k]);
    int na = IR_NATTR; /* past the last set attribute: four at a time first (most nodes set few) */
    while (na >= 4 && !(n->attr[na - 1] | n->attr[na - 2] | n->attr[na - 3] | n->attr[na - 4])) na -= 4;
    while (na > 0 && n->attr[na - 1] == 0) na--;
    hmix(&h, (uint64_t)na);
    for (int k = 0; k < na; k++) hmix(&h, (uint64_t)n->attr[k]);
  }
  if (!h.a && !h.b) h.a = 1; /* never the empty slot's */
  return h;
}

static FuseEntry *cache_slot(FuseCache *c, Hash2 h) {
  for (size_t i = (size_t)h.a & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    FuseEntry *e = &c->slots[i];
    if ((!e->h[0] && !e->h[1]) || (e->h[0] == h.a && e->h[1] == h.b)) return e;
  }
}

static void cache_grow(FuseCache *c) {
  size_t ncap = c->cap ? c->cap * 2 : 1024;
  FuseEntry *old = c->slots;
  size_t ocap = c->cap;
  c->slots = xalloc_calloc(ncap, sizeof(FuseEntry));
  c->cap = ncap;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].h[0] || old[i].h[1]) *cache_slot(c, (Hash2){old[i].h[0], old[i].h[1]}) = old[i];
  free(old);
}

/* A cached fused graph for graph g of r's module: its kernels copied into
 * arena where a kernel holds a CALL, whose work figures are its callee's
 * totals in this module (kernel_cost, as fuse_one computes them), and the
 * graph's totals summed again in kernel order; shared as they are where no
 * kernel calls. */
static void refresh_calls(Arena *arena, const FuseResult *r, const IrGraph *g, FuseGraph *fg) {
  int calls = 0;
  for (int i = 0; i < g->nnodes && !calls; i++) calls = g->nodes[i].op == IR_CALL;
  if (!calls) return;
  FuseKernel *ks = arena_alloc_raw(arena, sizeof(FuseKernel) * (size_t)(fg->nkernels > 0 ? fg->nkernels : 1));
  memcpy(ks, fg->kernels, sizeof(FuseKernel) * (size_t)fg->nkernels);
  fg->kernels = ks;
  fg->flops = fg->bytes_read = fg->bytes_written = 0;
  for (int p = 0; p < fg->nkernels; p++) {
    FuseKernel *K = &ks[p];
    int call = 0;
    for (int j = 0; j < K->nnodes && !call; j++) call = g->nodes[K->nodes[j]].op == IR_CALL;
    if (call) kernel_cost(r, g, K);
    fg->flops += K->flops;
    fg->bytes_read += K->bytes_read;
    fg->bytes_written += K->bytes_written;
  }
}

/* Fuses the graphs `want` marks (NULL: all). */
static FuseResult *fuse_graphs(Arena *arena, const IrModule *m, const FuseOptions *opts, FuseCache *cache, const char *want) {
  FuseResult *r = arena_alloc(arena, sizeof *r);
  r->module = m;
  r->ngraphs = m->ngraphs;
  r->graphs = arena_alloc(arena, sizeof(FuseGraph) * (size_t)(m->ngraphs > 0 ? m->ngraphs : 1));
  /* Callees first (a graph calls only later graphs), so a CALL's kernel
   * can take its graph's fused totals. */
  for (int i = m->ngraphs - 1; i >= 0; i--) {
    if (want && !want[i]) continue; /* left empty (arena_alloc zeroes) */
    if (!cache) {
      fuse_one(arena, r, m->graphs[i], opts, &r->graphs[i]);
      continue;
    }
    Hash2 hash = graph_hash(m, i, opts);
    if ((cache->count + 1) * 2 > cache->cap) cache_grow(cache);
    FuseEntry *e = cache_slot(cache, hash);
    if (e->h[0] || e->h[1]) {
      r->graphs[i] = e->fg;
      r->graphs[i].graph = m->graphs[i];
      refresh_calls(arena, r, m->graphs[i], &r->graphs[i]);
      cache->found++;
      continue;
    }
    cache->fused++;
    int keep = arena_used(cache->arena) < (size_t)FUSE_CACHE_MAX_BYTES;
    fuse_one(keep ? cache->arena : arena, r, m->graphs[i], opts, &r->graphs[i]);
    if (!keep) continue;
    e->h[0] = hash.a;
    e->h[1] = hash.b;
    e->fg = r->graphs[i];
    e->fg.graph = NULL;
    cache->count++;
  }
  return r;
}

FuseResult *fuse_module_cached(Arena *arena, const IrModule *m, const FuseOptions *opts, FuseCache *cache) {
  return fuse_graphs(arena, m, opts, cache, NULL);
}

FuseResult *fuse_module_reachable(Arena *arena, const IrModule *m, const FuseOptions *opts, FuseCache *cache, int root) {
  char *want = xalloc_calloc((size_t)m->ngraphs + 1, 1);
  if (root >= 0 && root < m->ngraphs) want[root] = 1;
  for (int i = 0; i < m->ngraphs; i++) /* callers before their callees */
    if (want[i])
      for (int j = 0; j < m->graphs[i]->nnodes; j++) {
        const IrNode *n = &m->graphs[i]->nodes[j];
        if (n->op == IR_CALL && n->attr[0] >= 0 && n->attr[0] < m->ngraphs) want[n->attr[0]] = 1;
      }
  FuseResult *r = fuse_graphs(arena, m, opts, cache, want);
  free(want);
  return r;
}

int fuse_bgrad_side(const FuseGraph *fg, int kp) {
  const FuseKernel *K = &fg->kernels[kp];
  const IrGraph *g = fg->graph;
  if (K->kind != FUSE_GEMM || !(K->epilogue & FUSE_EPI_BGRAD) || K->bgrad < 0 || fg->kernel_of[K->bgrad] != kp) return -1;
  int mem = g->nodes[K->bgrad].in[0];
  while (fg->kernel_of[mem] == kp && g->nodes[mem].op == IR_RESHAPE) mem = g->nodes[mem].in[0];
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *mm = &g->nodes[K->nodes[j]];
    if (mm->op != IR_MATMUL) continue;
    for (int side = 0; side < 2; side++) {
      int v = mm->in[side];
      while (fg->kernel_of[v] == kp && (g->nodes[v].op == IR_RESHAPE || g->nodes[v].op == IR_TRANSPOSE)) v = g->nodes[v].in[0];
      if (v == mem) return side;
    }
  }
  return -1;
}

int fuse_count(const FuseResult *r, int graph, FuseKind kind) {
  if (graph < 0 || graph >= r->ngraphs) return 0;
  int c = 0;
  for (int i = 0; i < r->graphs[graph].nkernels; i++) c += r->graphs[graph].kernels[i].kind == kind;
  return c;
}

/* ---- the check ---- */

static int problem(FILE *out, const IrGraph *g, int k, const char *what, int node) {
  if (out) {
    if (k >= 0) fprintf(out, "fuse check: graph %s, kernel k%d: %s", g->name, k, what);
    else fprintf(out, "fuse check: graph %s: %s", g->name, what);
    if (node >= 0) fprintf(out, " (%%%d)", node);
    fputc('\n', out);
  }
  return 1;
}

static int is_index_map(IrOp op) {
  return op == IR_RESHAPE || op == IR_TRANSPOSE || op == IR_SLICE || op == IR_EXPAND || op == IR_REPEAT_KV;
}

static int is_special(const IrGraph *g, int id) { return role_of(g, id) == R_SPECIAL; }

int fuse_ce_pair(const FuseGraph *fg, int p) { return is_ce_pair(fg->graph, &fg->kernels[p]); }

static int is_ce_pair(const IrGraph *g, const FuseKernel *K) {
  if (K->kind != FUSE_SPECIAL) return 0;
  int ce = 0, bwd = 0, other = 0;
  for (int j = 0; j < K->nnodes; j++) {
    IrOp op = g->nodes[K->nodes[j]].op;
    ce += op == IR_CROSS_ENTROPY;
    bwd += op == IR_CROSS_ENTROPY_BWD;
    other += op != IR_CROSS_ENTROPY && op != IR_CROSS_ENTROPY_BWD && op != IR_RESHAPE;
  }
  return ce == 1 && bwd == 1 && !other;
}

int fuse_linear_ce_pair(const FuseGraph *fg, int p) {
  const FuseKernel *K = &fg->kernels[p];
  if (K->kind != FUSE_SPECIAL) return 0;
  int dx = 0, dw = 0, other = 0;
  for (int j = 0; j < K->nnodes; j++) {
    IrOp op = fg->graph->nodes[K->nodes[j]].op;
    IrLinearRole role = ir_linear_role(op);
    dx += role == IR_LINEAR_DX;
    dw += role == IR_LINEAR_DW;
    other += role != IR_LINEAR_DX && role != IR_LINEAR_DW && op != IR_RESHAPE;
  }
  return dx == 1 && dw == 1 && !other;
}

static int check_kernel(const FuseGraph *fg, int p, FILE *out) {
  const IrGraph *g = fg->graph;
  const FuseKernel *K = &fg->kernels[p];
  int bad = 0, nmm = 0, nmain = 0;
  Space s;
  memset(&s, 0, sizeof s);
  s.valid = 1;
  s.rank = K->rank;
  memcpy(s.dims, K->dims, sizeof s.dims);
  s.red = K->kind == FUSE_ROW;
  s.lo = K->red_lo;
  s.hi = K->red_hi;
  if (s.red && (s.lo < 0 || s.hi <= s.lo || s.hi > s.rank)) bad += problem(out, g, p, "bad reduced group", -1);
  for (int j = 0; j < K->nnodes; j++) {
    int id = K->nodes[j];
    const IrNode *n = nd(g, id);
    Role r = role_of(g, id);
    int index_map = is_index_map(n->op) && K->kind != FUSE_VIEW && K->kind != FUSE_COPY;
    if (index_map) {
      /* Folded shape op: reads memory, feeds one node of this kernel (or the
       * attention's 16-bit output chain, which its kernel writes itself) */
      if (fg->kernel_of[n->in[0]] == p &&
          !(K->kind == FUSE_SPECIAL && (fuse_attn_out16(g, id) >= 0 || fuse_attn_grad16(g, id) >= 0)))
        bad += problem(out, g, p, "an index map reads a value of its own kernel", id);
      continue;
    }
    switch (K->kind) {
    case FUSE_LEAF: bad += r != R_LEAF ? problem(out, g, p, "a non-leaf in a leaf unit", id) : 0; break;
    case FUSE_VIEW: bad += r != R_VIEW ? problem(out, g, p, "a non-reshape in a view", id) : 0; break;
    case FUSE_COPY:
      bad += !is_index_map(n->op) && r != R_COPY ? problem(out, g, p, "a non-shape op in a copy", id) : 0;
      nmain += r == R_COPY;
      break;
    case FUSE_COMM: nmain += r == R_COMM; break;
    case FUSE_CALL: nmain += r == R_CALL; break;
    case FUSE_SPECIAL: nmain += is_special(g, id); break;
    case FUSE_GEMM:
      if (n->op == IR_MATMUL) nmm++;
      else if (id == K->bgrad && (K->epilogue & FUSE_EPI_BGRAD)) {
        if (fuse_bgrad_side(fg, p) < 0) bad += problem(out, g, p, "a bias gradient that sums no operand of the gemm", id);
      } else if (n->op != IR_MUL && n->op != IR_ADD && n->op != IR_RELU && n->op != IR_GELU &&
                 !(n->op == IR_CAST && (K->epilogue & FUSE_EPI_CAST)))
        bad += problem(out, g, p, "a gemm epilogue holds an unexpected op", id);
      break;
    case FUSE_LOOP:
    case FUSE_ROW: {
      if (r != R_EW && !(r == R_RED && K->kind == FUSE_ROW)) {
        bad += problem(out, g, p, "an op that does not fuse", id);
        break;
      }
      int tn;
      if (r == R_RED) {
        int lo, hi;
        reduced_group(g, n, &lo, &hi);
        if (!node_is(nd(g, n->in[0]), &s) || lo != s.lo || hi != s.hi)
          bad += problem(out, g, p, "a reduction outside the kernel's space", id);
        tn = red_output_is_full(n->op) ? TAG_FULL : TAG_ROW;
      } else {
        tn = tag_in(&s, n);
      }
      if (tag_in(&s, n) < 0) {
        bad += problem(out, g, p, "a node outside the kernel's iteration space", id);
        break;
      }
      for (int i = 0; i < n->nin; i++) {
        int x = n->in[i];
        if (fg->kernel_of[x] != p || is_index_map(nd(g, x)->op)) continue;
        const IrNode *xn = nd(g, x);
        int tx = tag_in(&s, xn);
        int ok = tx >= 0;
        if (ok && r == R_RED) ok = tx == TAG_FULL;
        else if (ok && tx == TAG_ROW)
          ok = tn == TAG_FULL ? row_broadcasts_in_row(&s, xn->rank, xn->dims)
                              : same_shape(xn->rank, xn->dims, n->rank, n->dims);
        else if (ok) ok = tn == TAG_FULL;
        if (!ok) bad += problem(out, g, p, "a value read outside its row", id);
      }
      break;
    }
    default: break;
    }
  }
  if (K->kind == FUSE_GEMM && nmm != 1) bad += problem(out, g, p, "a gemm kernel needs exactly one matmul", -1);
  if ((K->kind == FUSE_COMM || K->kind == FUSE_CALL || K->kind == FUSE_SPECIAL) && nmain != 1 && !fuse_linear_ce_pair(fg, p) &&
      !fuse_ce_pair(fg, p))
    bad += problem(out, g, p, "needs exactly one main op", -1);
  if (K->kind == FUSE_COPY && nmain < 1) bad += problem(out, g, p, "a copy without a shape op", -1);
  return bad;
}

int fuse_check(const FuseResult *r, FILE *out) {
  int bad = 0;
  for (int gi = 0; gi < r->ngraphs; gi++) {
    const FuseGraph *fg = &r->graphs[gi];
    const IrGraph *g = fg->graph;
    int n = g->nnodes;
    int *count = xalloc_calloc((size_t)n + 1, sizeof(int));
    int *stampv = xalloc_calloc((size_t)n + 1, sizeof(int));
    char *is_out = xalloc_calloc((size_t)n + 1, 1);
    for (int i = 0; i < g->noutputs; i++)
      if (g->outputs[i] >= 0 && g->outputs[i] < n) is_out[g->outputs[i]] = 1;
    if (n > 0 && !fg->kernel_of) {
      bad += problem(out, g, -1, "not fused", -1);
      free(count);
      free(stampv);
      free(is_out);
      continue;
    }
    for (int p = 0; p < fg->nkernels; p++) {
      const FuseKernel *K = &fg->kernels[p];
      if (K->nnodes < 1) bad += problem(out, g, p, "an empty kernel", -1);
      for (int j = 0; j < K->nnodes; j++) {
        int id = K->nodes[j];
        if (id < 0 || id >= n) {
          bad += problem(out, g, p, "a node id out of range", id);
          continue;
        }
        count[id]++;
        if (fg->kernel_of[id] != p) bad += problem(out, g, p, "kernel_of disagrees with the kernel's nodes", id);
        if (j && K->nodes[j - 1] >= id) bad += problem(out, g, p, "nodes not in ascending order", id);
      }
    }
    for (int id = 0; id < n; id++)
      if (count[id] != 1) {
        if (out) fprintf(out, "fuse check: graph %s: %%%d is in %d kernels\n", g->name, id, count[id]);
        bad++;
      }
    if (bad) {
      free(count);
      free(stampv);
      free(is_out);
      continue;
    }
    /* A value leaves its kernel when a node of another kernel reads it. */
    for (int u = 0; u < n; u++) {
      const IrNode *y = nd(g, u);
      for (int i = 0; i < y->nin; i++)
        if (y->in[i] >= 0 && y->in[i] < u && fg->kernel_of[y->in[i]] != fg->kernel_of[u]) is_out[y->in[i]] = 1;
    }
    for (int p = 0; p < fg->nkernels; p++) {
      const FuseKernel *K = &fg->kernels[p];
      /* Dependencies: every input from an earlier kernel, or this one. */
      int nin = 0, nout = 0;
      for (int j = 0; j < K->nnodes; j++) {
        const IrNode *x = nd(g, K->nodes[j]);
        for (int i = 0; i < x->nin; i++) {
          int q = x->in[i], kq = fg->kernel_of[q];
          if (kq > p) bad += problem(out, g, p, "reads a value of a later kernel (a cycle or a bad order)", q);
          if (kq != p && stampv[q] != p + 1) {
            stampv[q] = p + 1;
            nin++;
            int listed = 0;
            for (int t = 0; t < K->ninputs; t++) listed |= K->inputs[t] == q;
            if (!listed) bad += problem(out, g, p, "an input missing from the kernel's inputs", q);
          }
        }
      }
      if (nin != K->ninputs) bad += problem(out, g, p, "the input list differs from the values crossing in", -1);
      for (int t = 1; t < K->ninputs; t++)
        if (K->inputs[t - 1] >= K->inputs[t]) bad += problem(out, g, p, "inputs not ascending", K->inputs[t]);
      for (int j = 0; j < K->nnodes; j++) {
        int v = K->nodes[j];
        if (is_out[v]) {
          nout++;
          int listed = 0;
          for (int t = 0; t < K->noutputs; t++) listed |= K->outputs[t] == v;
          if (!listed) bad += problem(out, g, p, "an output missing from the kernel's outputs", v);
        }
      }
      if (nout != K->noutputs) bad += problem(out, g, p, "the output list differs from the values crossing out", -1);
      bad += check_kernel(fg, p, out);
    }
    free(count);
    free(stampv);
    free(is_out);
  }
  return bad;
}

/* ---- printing ---- */

static void print_shape(FILE *out, DType dt, int rank, const int64_t *dims) {
  fprintf(out, "%s[", sem_dtype_name(dt));
  for (int i = 0; i < rank; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", dims[i]);
  fputc(']', out);
}

static void print_ids(FILE *out, const int *ids, int n) {
  fputc('(', out);
  for (int i = 0; i < n; i++) fprintf(out, "%s%%%d", i ? ", " : "", ids[i]);
  fputc(')', out);
}

static void print_node(const IrModule *m, const IrGraph *g, int id, FILE *out) {
  const IrNode *n = nd(g, id);
  fprintf(out, "%%%d %s", id, ir_op_name(n->op));
  switch (n->op) {
  case IR_INPUT: fprintf(out, " %s", m->inputs[n->attr[0]].name); break;
  case IR_PARAM: fprintf(out, " %s", m->params[n->attr[0]].name); break;
  case IR_ARG: fprintf(out, " #%" PRId64, n->attr[0]); break;
  case IR_CONST: fprintf(out, " %.9g", n->fattr); break;
  case IR_CALL: fprintf(out, " @%s x%" PRId64, m->graphs[n->attr[0]]->name, n->attr[1]); break;
  default: break;
  }
}

void fuse_print_graph(const FuseResult *r, int gi, FILE *out) {
  const IrModule *m = r->module;
  const FuseGraph *fg = &r->graphs[gi];
  const IrGraph *g = fg->graph;
  int kinds[FUSE_NKINDS] = {0};
  for (int p = 0; p < fg->nkernels; p++) kinds[fg->kernels[p].kind]++;
  int launches = fg->nkernels - kinds[FUSE_LEAF] - kinds[FUSE_VIEW];
  fprintf(out, "graph %s (args %d, count %" PRId64 "): %d kernels, %d leaves and views {\n", g->name, g->nargs, g->count,
          launches, kinds[FUSE_LEAF] + kinds[FUSE_VIEW]);
  for (int p = 0; p < fg->nkernels; p++) {
    const FuseKernel *K = &fg->kernels[p];
    fprintf(out, "  k%d %s", p, fuse_kind_name(K->kind));
    if (K->kind == FUSE_GEMM) {
      if (K->epilogue & FUSE_EPI_SCALE) fputs("+scale", out);
      if (K->epilogue & FUSE_EPI_BIAS) fputs("+bias", out);
      if (K->epilogue & FUSE_EPI_ACT) fprintf(out, "+%s", ir_op_name(K->act));
      if (K->epilogue & FUSE_EPI_BGRAD) fputs("+bgrad", out);
      if (K->epilogue & FUSE_EPI_CAST) fputs("+bf16", out);
    }
    if (K->kind == FUSE_ROW) {
      fprintf(out, "[%d", K->red_lo);
      for (int a = K->red_lo + 1; a < K->red_hi; a++) fprintf(out, ",%d", a);
      fputc(']', out);
    }
    if (K->kind == FUSE_LOOP || K->kind == FUSE_ROW || K->kind == FUSE_GEMM) {
      fputc(' ', out);
      const IrNode *last = nd(g, K->nodes[K->nnodes - 1]);
      print_shape(out, last->dtype, K->rank, K->dims);
    }
    fputs(" [", out);
    for (int j = 0; j < K->nnodes; j++) {
      if (j) fputs(", ", out);
      print_node(m, g, K->nodes[j], out);
    }
    fputc(']', out);
    if (K->ninputs) {
      fputc(' ', out);
      print_ids(out, K->inputs, K->ninputs);
    }
    fputs(" -> ", out);
    print_ids(out, K->outputs, K->noutputs);
    if (K->flops || K->bytes_read || K->bytes_written)
      fprintf(out, "  flops=%.0f read=%.0f write=%.0f", K->flops, K->bytes_read, K->bytes_written);
    fputc('\n', out);
  }
  IrCost unfused = ircost_graph(m, g);
  fputs("}", out);
  for (int k = 0; k < FUSE_NKINDS; k++) fprintf(out, "%s%s %d", k ? ", " : " ", fuse_kind_name((FuseKind)k), kinds[k]);
  fprintf(out, "; flops=%.0f read=%.0f write=%.0f (unfused read=%.0f write=%.0f)\n", fg->flops, fg->bytes_read,
          fg->bytes_written, unfused.bytes_read, unfused.bytes_written);
}

void fuse_print(const FuseResult *r, FILE *out) {
  fprintf(out, "fused module (micro_batch %" PRId64 ")\n", r->module->micro_batch);
  for (int i = 0; i < r->ngraphs; i++) fuse_print_graph(r, i, out);
}

/* The part of the step a kernel belongs to: 1 (backward) when any of its
 * nodes is at or after the cut, else 0 (forward). */
int fuse_kernel_part(const FuseGraph *fg, int p) {
  const FuseKernel *K = &fg->kernels[p];
  for (int j = 0; j < K->nnodes; j++)
    if (K->nodes[j] >= fg->graph->fb_split) return 1;
  return 0;
}

/* Whether the step's kernels run as two parts: every forward kernel before
 * every backward one in fusion order (so each part runs its kernels in the
 * order the memory plan assumed), and the activation's transfers (toward
 * the next chunk) in the forward part. */
int fuse_can_cut(const FuseGraph *fg) {
  const IrGraph *g = fg->graph;
  if (g->fb_split <= 0) return 0;
  int seen_b = 0;
  for (int p = 0; p < fg->nkernels; p++) {
    int part = fuse_kernel_part(fg, p);
    if (!part && seen_b) return 0;
    seen_b |= part;
    const FuseKernel *K = &fg->kernels[p];
    for (int j = 0; j < K->nnodes; j++) {
      const IrNode *n = &g->nodes[K->nodes[j]];
      if ((n->op == IR_SEND || n->op == IR_RECV) && n->attr[0] == IRG_PP && ((n->op == IR_SEND) == (n->attr[1] > 0)) && part)
        return 0;
    }
  }
  return 1;
}

int fuse_grad_acc_output(const FuseGraph *fg, const IrModule *m, int kp) {
  const FuseKernel *K = &fg->kernels[kp];
  const IrGraph *g = fg->graph;
  int pair = fuse_linear_ce_pair(fg, kp);
  if (K->noutputs != 1 && !pair) return -1;
  if (fuse_can_cut(fg) && fuse_kernel_part(fg, kp) == 0) return -1;
  int v = K->outputs[0], mm = -1;
  if (K->kind == FUSE_SPECIAL && (pair || K->nnodes == 1)) {
    /* the fused head's weight gradient, alone or beside dx */
    for (int j = 0; j < K->nnodes; j++)
      if (ir_linear_role(g->nodes[K->nodes[j]].op) == IR_LINEAR_DW) v = mm = K->nodes[j];
    if (pair && mm < 0) return -1;
  }
  if (K->kind == FUSE_GEMM) {
    for (int j = 0; j < K->nnodes; j++)
      if (g->nodes[K->nodes[j]].op == IR_MATMUL) mm = K->nodes[j];
  } else if (K->nnodes == 1 && g->nodes[v].op == IR_EMBEDDING_BWD) {
    mm = v; /* a lookup's backward: its rows scattered into the slot */
  }
  if (mm != v || g->nodes[v].dtype != DT_F32) return -1; /* an epilogue or a scale after the product */
  int nplain = g->noutputs - g->ngrad_params, hits = 0, grad = -1;
  for (int k = 0; k < g->noutputs; k++)
    if (g->outputs[k] == v) {
      hits++;
      if (k >= nplain) grad = k - nplain;
    }
  if (hits != 1 || grad < 0 || m->params[g->grad_params[grad]].dtype != DT_F32) return -1;
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nin; k++)
      if (g->nodes[i].in[k] == v) return -1;
  return v;
}
