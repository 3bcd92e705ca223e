/* spmd.c - sharding propagation and collective insertion (see spmd.h). */
#include "spmd.h"
#include "headloss.h"
#include "moepack.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* The sharding of a value: per group, the split axis (-1: not split) or a
 * pending sum. Only the tensor and context groups shard inside a stage. */
typedef struct {
  int8_t axis[IRG_COUNT];
  uint8_t partial[IRG_COUNT];
} Shd;

enum { LAYOUT_CONTIGUOUS = 0, LAYOUT_ZIGZAG = 1 };
/* IRG_EP is unlike the others: a value "split" over it along axis a is the
 * experts' layout after the dispatch's all-to-all, where this rank holds
 * E / ep experts (axis a) for the tokens of every member (axis 0, ep times
 * as long); an unsplit value is this rank's own tokens (data parallelism's
 * batch), so converting between the two is always an all-to-all. */
static const IrGroup part_groups[] = {IRG_TP, IRG_CP, IRG_EP};
enum { NPART_GROUPS = 3 };

typedef struct {
  int id;  /* node in the new graph */
  Shd shd;
  int weight; /* derived from a parameter by shape ops only */
} Val;

typedef struct {
  int from;    /* new node */
  int group;
  int result;
} Marker;

typedef struct {
  Arena *arena;
  Diag *diag;
  const IrModule *src;
  IrModule *dst;
  const SpmdSpec *spec;
  int64_t size[IRG_COUNT];
  int failed;
  /* Vocabulary padding (SpmdSpec.vocab_pad): the rows of the padded table
   * (vocab_rows, 0: none) and their padded count; per source graph and
   * node, the axis of a value that spans the padded vocabulary (-1: none;
   * vocab_flow) */
  int64_t vocab_rows, vocab_padded;
  int **vocab_axis;
  int vocab_probe, vocab_leak; /* one rank's padding (alignment only): a leak drops it, no error */
  /* per source graph: partitioned already, with the entry sharding of arg 0 */
  int *done;
  Shd *entry;
} Part;

/* A conversion already made: the same value converted the same way is
 * shared, so q, k and v read one all-gather (as Megatron-LM does). */
typedef struct {
  IrOp op;
  int from;
  int64_t a[4];
  int result;
} Conv;

typedef struct {
  Part *P;
  int gi;            /* the source graph's index */
  const IrGraph *g;  /* source */
  IrGraph *out;      /* destination */
  Val *vals;         /* per source node */
  Marker *markers;
  int nmarkers, capmarkers;
  Conv *convs;
  int nconvs, capconvs;
  int ring; /* the matmul being converted gathers keys / values: pass them around the ring */
  int *to_combine;  /* a view or transpose whose one reader is a combine (or such a view): that combine + 1;
                       keeps a pending sum */
  char *own_idx;    /* per source node: expert choices whose slot dispatch routed the rank's own tokens
                       (cp_local_slots) */
} GPart;

static Shd shd_r(void) {
  Shd s;
  memset(&s, 0, sizeof s);
  for (int g = 0; g < IRG_COUNT; g++) s.axis[g] = -1;
  return s;
}

static int layout_of(IrGroup g) { return g == IRG_CP ? LAYOUT_ZIGZAG : LAYOUT_CONTIGUOUS; }

static const IrNode *dn(GPart *G, int id) { return &G->out->nodes[id]; }

static int conv_find(GPart *G, IrOp op, int from, const int64_t *a) {
  for (int i = 0; i < G->nconvs; i++) {
    const Conv *c = &G->convs[i];
    if (c->op == op && c->from == from && !memcmp(c->a, a, sizeof c->a)) return c->result;
  }
  return -1;
}

static int conv_keep(GPart *G, IrOp op, int from, const int64_t *a, int result) {
  if (result < 0) return result;
  if (G->nconvs == G->capconvs) {
    int cap = G->capconvs ? G->capconvs * 2 : 16;
    Conv *c = arena_alloc(G->P->arena, sizeof(Conv) * (size_t)cap);
    if (G->nconvs) memcpy(c, G->convs, sizeof(Conv) * (size_t)G->nconvs);
    G->convs = c;
    G->capconvs = cap;
  }
  Conv *c = &G->convs[G->nconvs++];
  c->op = op;
  c->from = from;
  memcpy(c->a, a, sizeof c->a);
  c->result = result;
  return result;
}

static int emit(GPart *G, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr, DType dt, int rank,
                const int64_t *dims, Span at) {
  const char *why = NULL;
  int id = ir_add(G->out, op, in, nin, attr, nattr, fattr, dt, rank, dims, &why);
  if (id < 0) {
    diag_error(G->P->diag, at, "internal error partitioning %s: %s", ir_op_name(op), why ? why : "?");
    G->P->failed = 1;
    return -1;
  }
  G->out->nodes[id].span = at;
  return id;
}

/* ---- conversions between shardings, one group at a time ---- */

/* A collective of x, made once per value and attributes (conv_find). */
static int conv_emit(GPart *G, IrOp op, int x, const int64_t *attr, int nattr, int rank, const int64_t *dims, Span at) {
  int done = conv_find(G, op, x, attr);
  if (done >= 0) return done;
  return conv_keep(G, op, x, attr, emit(G, op, &x, 1, attr, nattr, 0, dn(G, x)->dtype, rank, dims, at));
}

static int all_reduce(GPart *G, int x, IrGroup g, int max, Span at) {
  int64_t attr[4] = {g, 0, max, max}; /* a max all-reduce carries no gradient (its use is a constant shift) */
  return conv_emit(G, IR_ALL_REDUCE, x, attr, 4, -1, NULL, at);
}

static int gather(GPart *G, int x, IrGroup g, int axis, int grad_partial, Span at) {
  const IrNode *n = dn(G, x);
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  dims[axis] *= G->P->size[g];
  int64_t attr[4] = {g, axis, layout_of(g), grad_partial};
  return conv_emit(G, IR_ALL_GATHER, x, attr, 4, n->rank, dims, at);
}

static int scatter(GPart *G, int x, IrGroup g, int axis, Span at) {
  const IrNode *n = dn(G, x);
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  if (dims[axis] % G->P->size[g]) {
    diag_error(G->P->diag, at, "dimension %d of size %" PRId64 " does not divide over %s = %" PRId64, axis, dims[axis],
               ir_group_name(g), G->P->size[g]);
    G->P->failed = 1;
    return -1;
  }
  dims[axis] /= G->P->size[g];
  int64_t attr[4] = {g, axis, layout_of(g), 0};
  return conv_emit(G, IR_REDUCE_SCATTER, x, attr, 3, n->rank, dims, at);
}

/* Expert parallelism's exchange (see part_groups): chunks along `split` to
 * the members, received ones concatenated along `concat`. */
static int all_to_all(GPart *G, int x, int split, int concat, Span at) {
  const IrNode *n = dn(G, x);
  int64_t ep = G->P->size[IRG_EP], dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  if (dims[split] % ep) {
    diag_error(G->P->diag, at, "dimension %d of size %" PRId64 " does not divide over ep = %" PRId64, split, dims[split], ep);
    G->P->failed = 1;
    return -1;
  }
  dims[split] /= ep;
  dims[concat] *= ep;
  int64_t attr[4] = {IRG_EP, split, concat, 0};
  return conv_emit(G, IR_ALL_TO_ALL, x, attr, 3, n->rank, dims, at);
}

static int shard_slice(GPart *G, int x, IrGroup g, int axis, Span at) {
  const IrNode *n = dn(G, x);
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  int64_t parts = G->P->size[g] * (layout_of(g) == LAYOUT_ZIGZAG ? 2 : 1);
  if (dims[axis] % parts) {
    diag_error(G->P->diag, at, "dimension %d of size %" PRId64 " does not split into %" PRId64 " chunks over %s", axis, dims[axis],
               parts, ir_group_name(g));
    G->P->failed = 1;
    return -1;
  }
  dims[axis] /= G->P->size[g];
  int64_t attr[4] = {g, axis, layout_of(g), 0};
  return conv_emit(G, IR_SHARD_SLICE, x, attr, 3, n->rank, dims, at);
}

/* One step of the ring: the block sent on to the next rank, the previous
 * rank's received (ring_gather's pair). */
static int ring_recv(GPart *G, int like, IrGroup g, Span at) {
  const IrNode *n = dn(G, like);
  DType dt = n->dtype;
  int rank = n->rank;
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  int64_t from_prev[2] = {g, -1};
  return emit(G, IR_RECV, NULL, 0, from_prev, 2, 0, dt, rank, dims, at);
}

static int ring_send(GPart *G, int cur, IrGroup g, Span at) {
  int64_t to_next[2] = {g, 1};
  const IrNode *n = dn(G, cur);
  DType dt = n->dtype;
  int rank = n->rank;
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, n->dims, sizeof dims);
  return emit(G, IR_SEND, &cur, 1, to_next, 2, 0, dt, rank, dims, at);
}

/* Ring attention's exchange: the blocks of x travel around the group, each
 * rank sending what it last received to the next and receiving from the
 * previous, c - 1 times; the result is the blocks in ring order (this rank's
 * first, then those of ranks r-1, r-2, ...). Keys and values are gathered the
 * same way, so they stay aligned, and the causal mask reads the column
 * positions of that order. The gradients travel the ring backwards (the
 * rules of send and receive). */
static int ring_gather(GPart *G, int x, IrGroup g, int axis, Span at) {
  int64_t key[4] = {g, axis, 2, 0};
  int done = conv_find(G, IR_CONCAT, x, key);
  if (done >= 0) return done;
  /* Grouped-query attention: keys and values travel before their heads are
   * repeated (repeat_kv copies heads, the ring splits the sequence: they
   * commute), so the ring carries kv_heads, not heads (as Megatron-LM does). */
  const IrNode *xn = dn(G, x);
  if (xn->op == IR_REPEAT_KV && xn->nin == 1 && xn->rank >= 3 && axis != 1) {
    int64_t rattr[1] = {xn->attr[0]};
    DType dt = xn->dtype;
    int whole = ring_gather(G, xn->in[0], g, axis, at);
    if (whole < 0) return -1;
    return conv_keep(G, IR_CONCAT, x, key, emit(G, IR_REPEAT_KV, &whole, 1, rattr, 1, 0, dt, -1, NULL, at));
  }
  /* ... and so do keys transposed for q k^T */
  if (xn->op == IR_TRANSPOSE && xn->nin == 1 && dn(G, xn->in[0])->op == IR_REPEAT_KV && xn->attr[axis] != 1) {
    int64_t perm[IR_NATTR];
    memcpy(perm, xn->attr, sizeof perm);
    int rank = xn->rank;
    DType dt = xn->dtype;
    int whole = ring_gather(G, xn->in[0], g, (int)perm[axis], at);
    if (whole < 0) return -1;
    return conv_keep(G, IR_CONCAT, x, key, emit(G, IR_TRANSPOSE, &whole, 1, perm, rank, 0, dt, -1, NULL, at));
  }
  int c = (int)G->P->size[g];
  int *blocks = arena_alloc(G->P->arena, sizeof(int) * (size_t)c);
  blocks[0] = x;
  int cur = x;
  for (int s = 1; s < c && cur >= 0; s++) {
    if (ring_send(G, cur, g, at) < 0) return -1;
    blocks[s] = cur = ring_recv(G, cur, g, at);
  }
  if (cur < 0) return -1;
  int64_t cattr[1] = {axis};
  return conv_keep(G, IR_CONCAT, x, key, emit(G, IR_CONCAT, blocks, c, cattr, 1, 0, dn(G, x)->dtype, -1, NULL, at));
}

/* Ring attention a block at a time (parallel.cp_comm = ring): what travels
 * the ring for a key or value operand x, as ring_gather decides it - x
 * itself, or the tensor under x's repeat_kv (and the transpose above it),
 * those applied again to each block received. */
typedef struct {
  int base;  /* the value sent */
  int nwrap; /* ops applied to each block, innermost first */
  IrOp wop[2];
  int64_t wattr[2][IR_NATTR];
  int wrank[2];
  DType wdt[2];
} RingSrc;

static int ring_source(GPart *G, int x, int axis, RingSrc *rs) {
  const IrNode *xn = dn(G, x);
  IrOp op = xn->op;
  int inner = -1, inner_axis = axis;
  if (op == IR_REPEAT_KV && xn->nin == 1 && xn->rank >= 3 && axis != 1) inner = xn->in[0];
  else if (op == IR_TRANSPOSE && xn->nin == 1 && dn(G, xn->in[0])->op == IR_REPEAT_KV && xn->attr[axis] != 1) {
    inner = xn->in[0];
    inner_axis = (int)xn->attr[axis];
  }
  if (inner < 0) {
    rs->base = x;
    rs->nwrap = 0;
    return 0;
  }
  int64_t attr[IR_NATTR];
  memcpy(attr, xn->attr, sizeof attr);
  int rank = xn->rank;
  DType dt = xn->dtype;
  if (ring_source(G, inner, inner_axis, rs) || rs->nwrap == 2) return -1;
  rs->wop[rs->nwrap] = op;
  memcpy(rs->wattr[rs->nwrap], attr, sizeof attr);
  rs->wrank[rs->nwrap] = rank;
  rs->wdt[rs->nwrap++] = dt;
  return 0;
}

static int ring_wrap(GPart *G, const RingSrc *rs, int block, Span at) {
  for (int w = 0; w < rs->nwrap && block >= 0; w++)
    block = rs->wop[w] == IR_REPEAT_KV ? emit(G, IR_REPEAT_KV, &block, 1, rs->wattr[w], 1, 0, rs->wdt[w], -1, NULL, at)
                                       : emit(G, IR_TRANSPOSE, &block, 1, rs->wattr[w], rs->wrank[w], 0, rs->wdt[w], -1, NULL, at);
  return block;
}

/* x flat, [numel] (a view), and back */
static int flat_of(GPart *G, int x, Span at) {
  int64_t n = ir_numel(dn(G, x));
  return emit(G, IR_RESHAPE, &x, 1, NULL, 0, 0, dn(G, x)->dtype, 1, &n, at);
}

static int unflat(GPart *G, int msg, int64_t from, int like_rank, const int64_t *like_dims, Span at) {
  int64_t n = 1;
  for (int i = 0; i < like_rank; i++) n *= like_dims[i];
  int64_t sattr[16] = {from};
  DType dt = dn(G, msg)->dtype;
  int piece = emit(G, IR_SLICE, &msg, 1, sattr, 16, 0, dt, 1, &n, at);
  return piece < 0 ? -1 : emit(G, IR_RESHAPE, &piece, 1, NULL, 0, 0, dt, like_rank, like_dims, at);
}

/* Ring attention a block at a time: q's rows against each block of keys and
 * values as it arrives (block s from rank r - s, ATTENTION's attr[4] = 1 +
 * s, attr[5] = c), merged by ATTN_MERGE. A block's keys and values travel as one message
 * (as Megatron-LM's ring does), so that each step is one transfer and the
 * backward's transfers pair with their sends by order alone. Program order
 * puts block s's send before its attention and block s + 1's receive after
 * it, so that a runtime whose transfers run in the background hides each one
 * under an attention. */
static int ring_attention(GPart *G, int q, int k, int v, const int64_t *attr, double scale, DType dt, Span at) {
  IrGroup g = IRG_CP;
  int c = (int)G->P->size[g];
  RingSrc ks, vs;
  if (ring_source(G, k, 2, &ks) || ring_source(G, v, 2, &vs)) return -2;
  const IrNode *kn = dn(G, ks.base), *vn = dn(G, vs.base);
  int krank = kn->rank, vrank = vn->rank;
  int64_t kdims[IR_MAX_RANK], vdims[IR_MAX_RANK], nk = ir_numel(kn);
  memcpy(kdims, kn->dims, sizeof kdims);
  memcpy(vdims, vn->dims, sizeof vdims);
  int *parts = arena_alloc(G->P->arena, sizeof(int) * (size_t)c);
  int kb = ks.base, vb = vs.base, msg = -1;
  for (int s = 0; s < c; s++) {
    if (s > 0) {
      msg = ring_recv(G, msg, g, at);
      kb = msg < 0 ? -1 : unflat(G, msg, 0, krank, kdims, at);
      vb = msg < 0 ? -1 : unflat(G, msg, nk, vrank, vdims, at);
    } else if (c > 1) {
      int kv[2] = {flat_of(G, kb, at), flat_of(G, vb, at)};
      int64_t axis0[1] = {0};
      msg = kv[0] < 0 || kv[1] < 0 ? -1 : emit(G, IR_CONCAT, kv, 2, axis0, 1, 0, dn(G, kb)->dtype, -1, NULL, at);
      if (msg < 0) return -1;
    }
    if (kb < 0 || vb < 0) return -1;
    if (s + 1 < c && ring_send(G, msg, g, at) < 0) return -1;
    int in[3] = {q, ring_wrap(G, &ks, kb, at), ring_wrap(G, &vs, vb, at)};
    if (in[1] < 0 || in[2] < 0) return -1;
    int64_t a[6] = {attr[0], attr[1], attr[2], attr[3], 1 + s, c};
    if ((parts[s] = emit(G, IR_ATTENTION, in, 3, a, 6, scale, dt, -1, NULL, at)) < 0) return -1;
  }
  /* the blocks' outputs merged by their log-sum-exp (ir_ops.h, ATTN_MERGE) */
  return emit(G, IR_ATTN_MERGE, parts, c, NULL, 0, 0, dt, -1, NULL, at);
}

/* Megatron's f: one marker per value and group, shared by every consumer so
 * the backward all-reduces the summed gradient once. */
static int keep_marker(GPart *G, int x, IrGroup g, int r);

/* Partitioned node x is the slots of a dispatch with constant weights (the
 * tokens rearranged, linear in them), directly or through reshapes and
 * transposes of them (moe_expert_major's). */
static int slots_of_tokens(GPart *G, int x) {
  const IrNode *xn = dn(G, x);
  while (xn->op == IR_RESHAPE || xn->op == IR_TRANSPOSE) xn = dn(G, xn->in[0]);
  return xn->op == IR_MOE_DISPATCH && xn->in[2] >= 0 && (dn(G, xn->in[2])->op == IR_FILL || dn(G, xn->in[2])->op == IR_CONST);
}

static int copy_marker(GPart *G, int x, IrGroup g, Span at) {
  for (int i = 0; i < G->nmarkers; i++)
    if (G->markers[i].from == x && G->markers[i].group == (int)g) return G->markers[i].result;
  const IrNode *xn = dn(G, x);
  if (xn->op == IR_MOE_DISPATCH && slots_of_tokens(G, x)) {
    /* The experts' slots are the tokens rearranged (the dispatch is linear
     * in them, with constant weights): the marker goes on the tokens, so the
     * backward sums [B, T, C] over the group instead of every expert's slots. */
    int in[3] = {copy_marker(G, xn->in[0], g, at), xn->in[1], xn->in[2]};
    const IrNode *d = dn(G, x);
    return keep_marker(G, x, g, emit(G, IR_MOE_DISPATCH, in, 3, d->attr, IR_NATTR, 0, d->dtype, -1, NULL, at));
  }
  if ((xn->op == IR_RESHAPE || xn->op == IR_TRANSPOSE) && slots_of_tokens(G, x)) {
    /* the same through moe_expert_major's transpose and view of the slots */
    const IrNode *d = dn(G, x);
    int in = copy_marker(G, d->in[0], g, at);
    d = dn(G, x);
    return keep_marker(G, x, g, emit(G, d->op, &in, 1, d->attr, d->op == IR_TRANSPOSE ? d->rank : 0, 0, d->dtype, d->rank, d->dims, at));
  }
  int64_t attr[1] = {g};
  return keep_marker(G, x, g, emit(G, IR_COPY_TO_GROUP, &x, 1, attr, 1, 0, dn(G, x)->dtype, -1, NULL, at));
}

static int keep_marker(GPart *G, int x, IrGroup g, int r) {
  if (G->nmarkers == G->capmarkers) {
    int cap = G->capmarkers ? G->capmarkers * 2 : 16;
    Marker *m = arena_alloc(G->P->arena, sizeof(Marker) * (size_t)cap);
    if (G->nmarkers) memcpy(m, G->markers, sizeof(Marker) * (size_t)G->nmarkers);
    G->markers = m;
    G->capmarkers = cap;
  }
  G->markers[G->nmarkers].from = x;
  G->markers[G->nmarkers].group = g;
  G->markers[G->nmarkers].result = r;
  G->nmarkers++;
  return r;
}

/* Converts v to `want` on every group. `out_split` marks the groups on which
 * the consumer's output is split or partial: a replicated float input there
 * gets the f marker (its local gradient is only this rank's share). */
/* Sequence parallelism under context parallelism splits one axis twice: the
 * context group's chunk of the sequence (outer, zigzag) and the tensor
 * group's pieces of that chunk (inner). Such a conversion undoes the inner
 * split first and applies the outer one first: the tensor group's gathers
 * and all-reduces, then the context group's gathers; then the context
 * group's slices, then the tensor group's slices and reduce-scatters. */
static Val convert_nested(GPart *G, Val v, const Shd *want, unsigned out_split, Span at) {
  static const IrGroup undo[2] = {IRG_TP, IRG_CP}, apply[2] = {IRG_CP, IRG_TP};
  const Shd from = v.shd;
  for (int k = 0; k < 2 && v.id >= 0; k++) {
    IrGroup g = undo[k];
    int from_axis = v.shd.axis[g], to_axis = want->axis[g];
    if (v.shd.partial[g]) {
      if (to_axis < 0) {
        v.id = all_reduce(G, v.id, g, 0, at);
        v.shd.partial[g] = 0;
        v.shd.axis[g] = -1;
      }
      continue; /* a reduce-scatter: below, inside the outer split */
    }
    if (from_axis >= 0 && from_axis != to_axis) {
      if (g == IRG_CP && G->ring && to_axis < 0) v.id = ring_gather(G, v.id, g, from_axis, at);
      else v.id = gather(G, v.id, g, from_axis, to_axis < 0 && ((out_split >> g) & 1), at);
      v.shd.axis[g] = -1;
    }
  }
  for (int k = 0; k < 2 && v.id >= 0; k++) {
    IrGroup g = apply[k];
    int to_axis = want->axis[g];
    if (v.shd.partial[g]) {
      v.id = scatter(G, v.id, g, to_axis, at);
      v.shd.partial[g] = 0;
      v.shd.axis[g] = (int8_t)to_axis;
      continue;
    }
    if (v.shd.axis[g] == to_axis) {
      /* unchanged on g: the f marker, as convert gives a replicated input of a split output */
      const IrNode *x = dn(G, v.id);
      int constant = x->op == IR_CONST || x->op == IR_FILL || x->op == IR_IOTA;
      if (from.axis[g] == to_axis && !from.partial[g] && to_axis < 0 && ((out_split >> g) & 1) &&
          sem_dtype_is_float(x->dtype) && !constant)
        v.id = copy_marker(G, v.id, g, at);
      continue;
    }
    if (to_axis >= 0) v.id = shard_slice(G, v.id, g, to_axis, at);
    v.shd.axis[g] = (int8_t)to_axis;
  }
  return v;
}

/* Expert parallelism's exchange of v to expert axis `to` (-1: back to the
 * members' own tokens). The tokens' axis is 0, or 1 when the experts lead
 * (moe_expert_major's [E, B cap, C]). Under parallel folding the expert
 * group's members are tensor x data ranks and each tensor rank's tokens are
 * its chunk of the sequences along that axis (moe_fold_sequences): the
 * exchange brings a rank the tokens of its whole tensor group too, so the
 * tensor split of the tokens' axis goes into it and comes back out of it. */
/* Parallel folding under context parallelism: a rank routes its piece of its
 * context chunk into slots of its own (cp_local_slots). */
static int fold_cp(const Part *P) {
  return P->spec->ep_fold && P->size[IRG_TP] > 1 && P->size[IRG_EP] > 1 && P->size[IRG_CP] > 1;
}

static Val ep_exchange(GPart *G, Val v, int to, Span at) {
  int from = v.shd.axis[IRG_EP];
  if (from == to) return v;
  if (from >= 0 && to >= 0) {
    diag_error(G->P->diag, at, "internal error: expert parallelism moves an expert axis from %d to %d", from, to);
    G->P->failed = 1;
    v.id = -1;
    return v;
  }
  int tok = from < 0 ? to == 0 : from == 0;
  int fold = G->P->spec->ep_fold && G->P->size[IRG_TP] > 1;
  /* a context rank's own slots (fold_cp) carry the tensor split inside the context one, on
   * whichever axis that is (the capacity's before moe_expert_major's view, the tokens' after):
   * the members' slots are their own tokens either way */
  int tsplit = fold && fold_cp(G->P) && v.shd.axis[IRG_CP] >= 0 ? v.shd.axis[IRG_CP] : tok;
  if (fold && from < 0 && v.shd.axis[IRG_TP] != tsplit) {
    diag_error(G->P->diag, at,
               "internal error: parallel folding exchanges a value whose tensor split (axis %d) is not its tokens' (axis %d)",
               v.shd.axis[IRG_TP], tsplit);
    G->P->failed = 1;
    v.id = -1;
    return v;
  }
  v.id = from < 0 ? all_to_all(G, v.id, to, tok, at) : all_to_all(G, v.id, tok, from, at);
  v.shd.axis[IRG_EP] = (int8_t)to;
  if (fold) v.shd.axis[IRG_TP] = (int8_t)(to >= 0 ? -1 : tsplit);
  return v;
}

static Val convert(GPart *G, Val v, const Shd *want, unsigned out_split, Span at) {
  Shd fold_want;
  if (G->P->spec->ep_fold && G->P->size[IRG_EP] > 1 && G->P->size[IRG_TP] > 1 && v.shd.axis[IRG_EP] != want->axis[IRG_EP]) {
    /* the folded exchange first: it moves the tensor split with the experts'
     * (linear: a pending sum stays one) */
    v = ep_exchange(G, v, want->axis[IRG_EP], at);
    if (v.id < 0) return v;
    fold_want = *want;
    fold_want.axis[IRG_TP] = v.shd.axis[IRG_TP];
    want = &fold_want;
  }
  int tf = v.shd.axis[IRG_TP], tt = want->axis[IRG_TP], cf = v.shd.axis[IRG_CP], ct = want->axis[IRG_CP];
  if (G->P->size[IRG_TP] > 1 && G->P->size[IRG_CP] > 1 && !want->partial[IRG_TP] && !want->partial[IRG_CP] &&
      !v.shd.partial[IRG_CP] && ((tf >= 0 && (tf == cf || tf == ct)) || (tt >= 0 && (tt == cf || tt == ct)))) {
    /* the nested split of the tensor and context groups, then expert
     * parallelism's exchange, last as in the loop below (under folding it
     * was made first, above) */
    v = convert_nested(G, v, want, out_split, at);
    if (v.id >= 0 && G->P->size[IRG_EP] > 1) v = ep_exchange(G, v, want->axis[IRG_EP], at);
    return v;
  }
  for (int k = 0; k < NPART_GROUPS && v.id >= 0; k++) {
    IrGroup g = part_groups[k];
    if (G->P->size[g] <= 1) continue;
    int from_axis = v.shd.axis[g], to_axis = want->axis[g];
    int split_out = (out_split >> g) & 1;
    if (g == IRG_EP) { /* own tokens <-> the experts' layout (axis 0 the members' tokens) */
      v = ep_exchange(G, v, to_axis, at);
      if (v.id < 0) return v;
      continue;
    }
    if (v.shd.partial[g]) {
      if (to_axis >= 0) v.id = scatter(G, v.id, g, to_axis, at);
      else v.id = all_reduce(G, v.id, g, 0, at);
      v.shd.partial[g] = 0;
      v.shd.axis[g] = (int8_t)to_axis;
      continue;
    }
    if (want->partial[g]) continue; /* only ops themselves make partial values */
    if (from_axis == to_axis) {
      const IrNode *x = dn(G, v.id);
      int constant = x->op == IR_CONST || x->op == IR_FILL || x->op == IR_IOTA;
      if (to_axis < 0 && split_out && sem_dtype_is_float(x->dtype) && !constant) v.id = copy_marker(G, v.id, g, at);
      continue;
    }
    if (from_axis >= 0) {
      if (g == IRG_CP && G->ring && to_axis < 0) v.id = ring_gather(G, v.id, g, from_axis, at);
      else v.id = gather(G, v.id, g, from_axis, to_axis < 0 && split_out, at);
      if (v.id < 0) break;
    }
    /* R -> S needs no marker: the slice's gradient is gathered whole */
    if (to_axis >= 0) v.id = shard_slice(G, v.id, g, to_axis, at);
    v.shd.axis[g] = (int8_t)to_axis;
  }
  return v;
}

/* A partial value becomes whole: reduce-scattered along the sequence when
 * sequence parallelism keeps this tensor split there, else all-reduced. */
static Val settle(GPart *G, Val v, Span at) {
  Shd want = v.shd;
  int any = 0;
  for (int k = 0; k < NPART_GROUPS; k++) {
    IrGroup g = part_groups[k];
    if (!v.shd.partial[g]) continue;
    any = 1;
    want.partial[g] = 0;
    want.axis[g] = -1;
    const IrNode *n = dn(G, v.id);
    /* under context parallelism too: the tensor group splits each rank's
     * sequence chunk again (Megatron-LM's sequence parallelism beside its
     * context parallelism); n's shape is this rank's */
    int64_t chunk = G->P->spec->seq_len / (v.shd.axis[IRG_CP] == 1 ? G->P->size[IRG_CP] : 1);
    /* a whole sequence under context parallelism is summed whole: its tensor-group
     * split lies inside each context chunk, which a scatter of the whole would not give */
    int cp_whole = G->P->size[IRG_CP] > 1 && v.shd.axis[IRG_CP] != 1;
    if (g == IRG_TP && G->P->spec->sp && !cp_whole && n->rank >= 2 && n->dims[1] == chunk && chunk % G->P->size[IRG_TP] == 0)
      want.axis[g] = 1;
  }
  return any ? convert(G, v, &want, 0, at) : v;
}

static unsigned split_mask(const Shd *s) {
  unsigned m = 0;
  for (int g = 0; g < IRG_COUNT; g++)
    if (s->axis[g] >= 0 || s->partial[g]) m |= 1u << g;
  return m;
}

static int64_t local_dim(Part *P, const Shd *s, int axis, int64_t global) {
  int64_t d = global;
  for (int g = 0; g < IRG_COUNT; g++)
    if (s->axis[g] == axis) d /= P->size[g];
  return d;
}

/* ---- op rules ---- */

static Val val_of(GPart *G, const IrNode *n, int k) { return G->vals[n->in[k]]; }

/* The output axis an input axis lines up with under broadcasting. */
static int aligned(int in_rank, int out_rank, int axis) { return axis < 0 ? -1 : axis + (out_rank - in_rank); }

/* Elementwise ops (and concat off its axis): every input takes the split of
 * the first split input, lined up by broadcasting; inputs that broadcast
 * along that axis stay whole. */
static Val rule_elementwise(GPart *G, const IrNode *n, Val *ins, int nin, int forbid_axis) {
  Shd out = shd_r();
  int out_rank = n->rank;
  for (int i = 0; i < nin; i++) ins[i] = settle(G, ins[i], n->span);
  for (int k = 0; k < NPART_GROUPS; k++) {
    IrGroup g = part_groups[k];
    if (G->P->size[g] <= 1) continue;
    for (int i = 0; i < nin && out.axis[g] < 0; i++) {
      const IrNode *x = dn(G, ins[i].id);
      int a = aligned(x->rank, out_rank, ins[i].shd.axis[g]);
      if (a >= 0 && a != forbid_axis) out.axis[g] = (int8_t)a;
    }
  }
  unsigned mask = split_mask(&out);
  for (int i = 0; i < nin; i++) {
    const IrNode *x = dn(G, ins[i].id);
    Shd want = shd_r();
    for (int g = 0; g < IRG_COUNT; g++) {
      int a = out.axis[g];
      if (a < 0) continue;
      int ia = a - (out_rank - x->rank);
      /* a broadcast input (axis missing or of size 1) stays whole */
      if (ia >= 0 && x->dims[ia] > 1) want.axis[g] = (int8_t)ia;
      if (ia >= 0 && ins[i].shd.axis[g] == ia) want.axis[g] = (int8_t)ia;
    }
    ins[i] = convert(G, ins[i], &want, mask, n->span);
  }
  Val r = {-1, out, 0};
  return r;
}

/* Matmul roles of an axis: batch dims, M/K of a, K/N of b. */
enum { ROLE_NONE, ROLE_M, ROLE_K, ROLE_N, ROLE_BATCH };

static int role_a(const IrNode *n, const IrNode *a, int axis) {
  if (axis < 0) return ROLE_NONE;
  int ma = n->attr[0] ? a->rank - 1 : a->rank - 2, ka = n->attr[0] ? a->rank - 2 : a->rank - 1;
  return axis == ma ? ROLE_M : axis == ka ? ROLE_K : ROLE_BATCH;
}

static int role_b(const IrNode *n, const IrNode *b, int axis) {
  if (axis < 0) return ROLE_NONE;
  int kb = n->attr[1] ? b->rank - 1 : b->rank - 2, nb = n->attr[1] ? b->rank - 2 : b->rank - 1;
  return axis == kb ? ROLE_K : axis == nb ? ROLE_N : ROLE_BATCH;
}

static Val rule_matmul(GPart *G, const IrNode *n, Val a, Val b) {
  a = settle(G, a, n->span);
  b = settle(G, b, n->span);
  if (G->P->spec->ep_fold && G->P->size[IRG_EP] > 1 && b.shd.axis[IRG_EP] >= 0 && a.shd.axis[IRG_EP] < 0) {
    /* the experts' GEMM under parallel folding: the slots go to their experts
     * before the tensor group's roles are read (the experts are whole, and the
     * exchange takes the tensor split of the tokens with it) */
    Shd want = a.shd;
    want.axis[IRG_EP] = (int8_t)(b.shd.axis[IRG_EP] + (dn(G, a.id)->rank - dn(G, b.id)->rank));
    a = convert(G, a, &want, 0, n->span);
    if (a.id < 0) return (Val){-1, shd_r(), 0};
  }
  const IrNode *an = dn(G, a.id), *bn = dn(G, b.id);
  int out_rank = n->rank;
  Shd out = shd_r(), wa = a.shd, wb = b.shd;
  int ka = n->attr[0] ? an->rank - 2 : an->rank - 1, kb = n->attr[1] ? bn->rank - 1 : bn->rank - 2;
  for (int k = 0; k < NPART_GROUPS; k++) {
    IrGroup g = part_groups[k];
    if (G->P->size[g] <= 1) continue;
    int ra = role_a(n, an, a.shd.axis[g]), rb = role_b(n, bn, b.shd.axis[g]);
    /* Two operands split on different non-contracting axes: gather one, the
     * activation when the other is a weight, else the right operand (keys,
     * values in attention). */
    if (ra != ROLE_NONE && rb != ROLE_NONE && !(ra == ROLE_K && rb == ROLE_K) && !(ra == ROLE_BATCH && rb == ROLE_BATCH)) {
      if (b.weight && !a.weight) ra = ROLE_NONE, wa.axis[g] = -1;
      else rb = ROLE_NONE, wb.axis[g] = -1;
    }
    if (ra == ROLE_BATCH && rb == ROLE_BATCH) {
      int oa = aligned(an->rank - 2, out_rank - 2, a.shd.axis[g]), ob = aligned(bn->rank - 2, out_rank - 2, b.shd.axis[g]);
      if (oa != ob) rb = ROLE_NONE, wb.axis[g] = -1;
      else out.axis[g] = (int8_t)oa;
    }
    if (ra == ROLE_K || rb == ROLE_K) {
      wa.axis[g] = (int8_t)ka;
      wb.axis[g] = (int8_t)kb;
      out.partial[g] = 1;
    } else if (ra == ROLE_M) {
      out.axis[g] = (int8_t)(out_rank - 2);
      wb.axis[g] = -1;
    } else if (rb == ROLE_N) {
      out.axis[g] = (int8_t)(out_rank - 1);
      wa.axis[g] = -1;
    } else if (ra == ROLE_BATCH) {
      int oa = aligned(an->rank - 2, out_rank - 2, a.shd.axis[g]);
      out.axis[g] = (int8_t)oa;
      int ib = oa - ((out_rank - 2) - (bn->rank - 2));
      /* keep b's own split there; else slice b unless it broadcasts (size 1, whole) */
      wb.axis[g] = b.shd.axis[g] == ib || (ib >= 0 && b.shd.axis[g] < 0 && bn->dims[ib] > 1) ? (int8_t)ib : -1;
    } else if (rb == ROLE_BATCH) {
      int ob = aligned(bn->rank - 2, out_rank - 2, b.shd.axis[g]);
      out.axis[g] = (int8_t)ob;
      int ia = ob - ((out_rank - 2) - (an->rank - 2));
      wa.axis[g] = a.shd.axis[g] == ia || (ia >= 0 && a.shd.axis[g] < 0 && an->dims[ia] > 1) ? (int8_t)ia : -1;
    }
  }
  unsigned mask = split_mask(&out);
  a = convert(G, a, &wa, mask, n->span);
  /* the right operand gathered over the context group is a key or value block */
  G->ring = 1;
  b = convert(G, b, &wb, mask, n->span);
  G->ring = 0;
  int in[2] = {a.id, b.id};
  Val r = {-1, out, 0};
  if (a.id < 0 || b.id < 0) return r;
  r.id = emit(G, IR_MATMUL, in, 2, n->attr, 2, 0, n->dtype, -1, NULL, n->span);
  return r;
}

static void local_dims(Part *P, const IrNode *n, const Shd *s, int64_t *dims);

/* The router's row-wise ops along the last axis (topk, take and its backward,
 * one_hot): each row alone, so the context group's split of a leading axis (the
 * sequence) stays and the rows are not gathered; any other split is. */
static Val rule_router_rows(GPart *G, const IrNode *n, Val *ins) {
  const IrNode *x = &G->g->nodes[n->in[0]];
  int lead = n->op == IR_ONE_HOT ? x->rank : x->rank - 1; /* the leading axes, aligned on input 0 and the output */
  Shd want = shd_r();
  for (int k = 0; k < n->nin; k++) ins[k] = settle(G, ins[k], n->span);
  /* the context group's split only: the tensor group's (sequence parallelism) is gathered,
   * as the experts split over that group need every token */
  if (ins[0].shd.axis[IRG_CP] >= 0 && ins[0].shd.axis[IRG_CP] < lead) want.axis[IRG_CP] = ins[0].shd.axis[IRG_CP];
  /* under parallel folding each tensor rank routes its own chunk of the sequences */
  if (G->P->spec->ep_fold && ins[0].shd.axis[IRG_TP] >= 0 && ins[0].shd.axis[IRG_TP] < lead)
    want.axis[IRG_TP] = ins[0].shd.axis[IRG_TP];
  unsigned mask = split_mask(&want);
  int in[2];
  for (int k = 0; k < n->nin; k++) in[k] = convert(G, ins[k], &want, mask, n->span).id;
  Val r = {-1, want, 0};
  for (int k = 0; k < n->nin; k++)
    if (in[k] < 0) return r;
  int64_t dims[IR_MAX_RANK];
  if (n->op == IR_TAKE_BWD) local_dims(G->P, n, &want, dims);
  r.id = emit(G, n->op, in, n->nin, n->attr, IR_NATTR, 0, n->dtype, n->op == IR_TAKE_BWD ? n->rank : -1,
              n->op == IR_TAKE_BWD ? dims : NULL, n->span);
  return r;
}

/* Whether n is a packed (dropless) routing op whose tokens this rank routes
 * alone: the context group splits the sequence (idx [B, T, K] along axis 1) and
 * the op reads only row-local values, so each rank routes its own tokens into
 * rows of its own (moe_expert_ids, the dispatch, the combine), which the
 * experts' grouped GEMMs take as they are: no gather of the sequence, and a
 * context rank computes its tokens' experts, not all of them. The rows of
 * different ranks are different rows (each rank's sorted by expert), marked as
 * split along axis 0; nothing gathers them (the combine maps them back to the
 * rank's [B, T / cp, C]). */
static int cp_local_rows(GPart *G, const IrNode *n, const Val *ins) {
  if (G->P->size[IRG_CP] <= 1) return 0;
  int packed = n->op == IR_MOE_EXPERT_IDS || (n->op == IR_MOE_DISPATCH && n->attr[1] == 0) ||
               (n->op == IR_MOE_COMBINE && G->g->nodes[n->in[0]].rank == 2);
  if (!packed) return 0;
  const Val *idx = &ins[n->op == IR_MOE_EXPERT_IDS ? 0 : 1];
  if (idx->shd.axis[IRG_CP] != 1) return 0;
  return n->op != IR_MOE_COMBINE || ins[0].shd.axis[IRG_CP] == 0;
}

/* The same over slots ([B, E, cap, C]) for a layer with room for every token
 * (the dispatch's attr[3]; a top-k's choices, each expert at most once a
 * token): the rank routes its own [B, T / cp, C] into slots of its own,
 * [B, E, cap / cp, C], where no token is dropped either, so the layer computes
 * what it does over the whole sequence. The slots are marked split along
 * axis 2 over the context group and go through moe_expert_major's views
 * (own_slot_view), expert parallelism's exchange and the experts' GEMMs as
 * rows of the rank's own; the combine maps them back. A dropping layer keeps
 * its sequence whole: its capacity is the whole sequence's. Under parallel
 * folding (fold_cp) the tensor group splits the context chunk again, so each
 * rank routes its piece of its chunk: slots [B, E, cap / (cp tp), C], split
 * over both groups as the sequence is (nested), which the folded expert
 * group's exchange takes as the tensor ranks' own tokens. */
static int cp_local_slots(GPart *G, const IrNode *n, const Val *ins) {
  /* (the op first: ins holds only n's inputs) */
  if (G->P->size[IRG_CP] <= 1 || (n->op != IR_MOE_DISPATCH && n->op != IR_MOE_COMBINE) || ins[1].shd.axis[IRG_CP] != 1) return 0;
  if (n->op == IR_MOE_COMBINE) return G->g->nodes[n->in[0]].rank == 4 && G->own_idx[n->in[1]];
  return moe_holds_every_token(G->g, n);
}

/* Whether source view n (a reshape or transpose) carries slots a rank routed
 * alone (cp_local_slots): on the way from such a dispatch, or to such a combine. */
static int own_slot_view(GPart *G, const IrNode *n) {
  const IrGraph *g = G->g;
  if (G->to_combine && G->to_combine[n - g->nodes]) return G->own_idx[g->nodes[G->to_combine[n - g->nodes] - 1].in[1]];
  const IrNode *x = n;
  while (x->op == IR_RESHAPE || x->op == IR_TRANSPOSE) x = &g->nodes[x->in[0]];
  return x->op == IR_MOE_DISPATCH && x->attr[1] > 0 && G->own_idx[x->in[1]];
}

/* A dispatch's weights (input 2) converted to `want`, or, when they are a
 * constant, made again at the shape of its partitioned choices `idx` (not
 * sliced first: the whole constant, read by nothing then, goes with
 * unread_dispatch). */
static int dispatch_weights(GPart *G, const IrNode *n, const Val *w, int idx, const Shd *want) {
  const IrNode *src = &G->g->nodes[n->in[2]];
  if (src->op != IR_FILL || idx < 0) return convert(G, settle(G, *w, n->span), want, 0, n->span).id;
  const IrNode *li = dn(G, idx);
  return emit(G, IR_FILL, NULL, 0, NULL, 0, src->fattr, src->dtype, li->rank, li->dims, n->span);
}

/* The routing ops of a rank's own tokens, packed (cp_local_rows) or over slots
 * (cp_local_slots): the [B, T, ...] operands split along the sequence over the
 * context group as idx is (whole over the other groups; the dispatch's tokens
 * under a marker where the experts split over the tensor group, copy_marker),
 * the rows along axis 0, the slots along their capacity axis (the dispatch's
 * buffer the rank's share); a combine of a pending sum (the experts' down
 * projection split over the tensor group) stays one. */
static Val rule_cp_rows(GPart *G, const IrNode *n, Val *ins) {
  Shd tok = shd_r(), rows = shd_r();
  int slots = n->op == IR_MOE_DISPATCH ? n->attr[1] > 0 : G->g->nodes[n->in[0]].rank == 4; /* cp_local_slots */
  int fold = slots && fold_cp(G->P);
  tok.axis[IRG_CP] = 1;
  rows.axis[IRG_CP] = (int8_t)(slots ? 2 : 0);
  if (fold) tok.axis[IRG_TP] = 1, rows.axis[IRG_TP] = 2; /* inside the context group's, as sequence parallelism's */
  Val r = {-1, shd_r(), 0};
  int in[3];
  int64_t attr[IR_NATTR];
  memcpy(attr, n->attr, sizeof attr);
  if (n->op == IR_MOE_EXPERT_IDS) {
    in[0] = convert(G, settle(G, ins[0], n->span), &tok, 0, n->span).id;
    r.shd = rows;
  } else if (n->op == IR_MOE_DISPATCH) {
    for (int k = 0; k < 2; k++) in[k] = convert(G, settle(G, ins[k], n->span), &tok, 0, n->span).id;
    in[2] = dispatch_weights(G, n, &ins[2], in[1], &tok); /* (copy_marker's case) */
    r.shd = rows;
    if (slots) { /* the rank's share of the buffer (rounded up where the planner's expected load does not divide) */
      int64_t parts = G->P->size[IRG_CP] * (fold ? G->P->size[IRG_TP] : 1);
      for (int k = 1; k < 3; k++) attr[k] = (attr[k] + parts - 1) / parts;
      G->own_idx[n->in[1]] = 1;
    }
  } else { /* the combine: y's rows as they are, a pending sum kept (convert would make it) */
    Val y = ins[0];
    Shd partial = y.shd;
    for (int g = 0; g < IRG_COUNT; g++) y.shd.partial[g] = 0;
    in[0] = convert(G, y, &rows, 0, n->span).id; /* any other split gathered: linear, the sum still pending */
    y.shd = partial;
    r.shd = tok;
    for (int g = 0; g < IRG_COUNT; g++) r.shd.partial[g] = y.shd.partial[g];
    /* the gates' gradient is a dot product with the partial y: summed over its groups */
    unsigned mask = split_mask(&r.shd);
    for (int k = 1; k < 3; k++) in[k] = convert(G, settle(G, ins[k], n->span), &tok, mask, n->span).id;
  }
  for (int k = 0; k < n->nin; k++)
    if (in[k] < 0) return r;
  r.id = emit(G, n->op, in, n->nin, attr, IR_NATTR, 0, n->dtype, -1, NULL, n->span);
  return r;
}

/* Whether n is a slot dispatch or combine under parallel folding: its
 * sequences are the tensor ranks' chunks (moe_fold_sequences), [tp B, ...]
 * with chunk j on tensor rank j, so a split of the leading axis over the
 * tensor group is each rank routing its own tokens. */
static int fold_routing(GPart *G, const IrNode *n) {
  /* (under context parallelism the sequences are not chunked: cp_local_slots) */
  if (!G->P->spec->ep_fold || G->P->size[IRG_TP] <= 1 || G->P->size[IRG_EP] <= 1 || G->P->size[IRG_CP] > 1) return 0;
  return (n->op == IR_MOE_DISPATCH && n->attr[1] > 0) || (n->op == IR_MOE_COMBINE && G->g->nodes[n->in[0]].rank == 4);
}

/* The folded dispatch and combine: every operand split along its leading axis
 * over the tensor group (the slots of the combine brought back from the
 * experts first, ep_exchange), whole over the others; the result alike. */
static Val rule_fold_routing(GPart *G, const IrNode *n, Val *ins) {
  Shd lead = shd_r();
  lead.axis[IRG_TP] = 0;
  Val r = {-1, lead, 0};
  int in[3];
  for (int k = 0; k < 3; k++) {
    if (k == 2 && n->op == IR_MOE_DISPATCH) in[k] = dispatch_weights(G, n, &ins[k], in[1], &lead);
    else in[k] = convert(G, settle(G, ins[k], n->span), &lead, 0, n->span).id;
    if (in[k] < 0) return r;
  }
  int64_t dims[IR_MAX_RANK];
  local_dims(G->P, n, &lead, dims);
  r.id = emit(G, n->op, in, 3, n->attr, IR_NATTR, n->fattr, n->dtype, n->rank, dims, n->span);
  return r;
}

/* GROUPED_MM(a [N, X], w [E, X, Y], ids): as a Linear over each expert's rows.
 * w split along Y (an expert_column weight) splits the output's columns and
 * takes a whole; w or a split along X (an expert_row weight) splits both
 * along X and leaves the output a pending sum; any other split is gathered.
 * The rows and their ids stay whole (they are the packed routing). */
static Val rule_grouped_mm(GPart *G, const IrNode *n, Val a, Val w, Val ids) {
  a = settle(G, a, n->span);
  w = settle(G, w, n->span);
  ids = settle(G, ids, n->span);
  int t = n->attr[0] != 0, wx = t ? 2 : 1, wy = t ? 1 : 2;
  Shd out = shd_r(), wa = shd_r(), ww = shd_r(), wids = shd_r();
  for (int k = 0; k < NPART_GROUPS; k++) {
    IrGroup g = part_groups[k];
    if (G->P->size[g] <= 1) continue;
    if (ids.shd.axis[g] == 0) { /* a rank's own rows (cp_local_rows): w whole, its gradient summed */
      out.axis[g] = 0;
      wa.axis[g] = 0;
      wids.axis[g] = 0;
    } else if (w.shd.axis[g] == wy) {
      out.axis[g] = 1;
      ww.axis[g] = (int8_t)wy;
    } else if (w.shd.axis[g] == wx || a.shd.axis[g] == 1) {
      wa.axis[g] = 1;
      ww.axis[g] = (int8_t)wx;
      out.partial[g] = 1;
    }
  }
  unsigned mask = split_mask(&out);
  a = convert(G, a, &wa, mask, n->span);
  w = convert(G, w, &ww, mask, n->span);
  ids = convert(G, ids, &wids, 0, n->span);
  Val r = {-1, out, 0};
  if (a.id < 0 || w.id < 0 || ids.id < 0) return r;
  int in[3] = {a.id, w.id, ids.id};
  r.id = emit(G, IR_GROUPED_MM, in, 3, n->attr, 1, 0, n->dtype, -1, NULL, n->span);
  return r;
}

/* Gathers every group on which v is split along `axis`. */
static Val whole_along(GPart *G, Val v, int axis, Span at) {
  Shd want = v.shd;
  int need = 0;
  for (int g = 0; g < IRG_COUNT; g++)
    if (want.axis[g] == axis) want.axis[g] = -1, need = 1;
  return need ? convert(G, v, &want, 0, at) : v;
}

/* Output dims from the global node and the output sharding. */
static void local_dims(Part *P, const IrNode *n, const Shd *s, int64_t *dims) {
  for (int i = 0; i < n->rank; i++) dims[i] = local_dim(P, s, i, n->dims[i]);
}

/* Before a view or transpose of the experts' slots: the expert split of
 * expert parallelism undone (its local shape concatenates the members' slots,
 * which no view of the global shape describes), a pending sum kept pending
 * through it when the value goes on to a combine (both are linear: the sum is
 * made once over [B, T, C] after the combine, as without them), else made. */
static Val slots_in(GPart *G, const IrNode *n, Val x) {
  Shd pend = x.shd;
  int keep = G->to_combine && G->to_combine[n - G->g->nodes];
  if (!keep) x = settle(G, x, n->span);
  if (x.shd.axis[IRG_EP] >= 0) {
    Shd want = x.shd;
    for (int g = 0; g < IRG_COUNT; g++) x.shd.partial[g] = want.partial[g] = 0;
    want.axis[IRG_EP] = -1;
    x = convert(G, x, &want, 0, n->span);
    for (int g = 0; g < IRG_COUNT && keep; g++) x.shd.partial[g] = pend.partial[g];
  }
  return x;
}

/* The output axis of a view from `in` to `out` (global shapes) that holds the
 * innermost input axis of the run of axes around axis a whose size the view
 * keeps (merged or split: [E, B, cap, C] -> [E, B cap, C] and back); -1 when
 * a is not that innermost axis. */
static int view_inner_axis(const IrNode *in, const IrNode *out, int a) {
  int i = 0, o = 0;
  while (i < in->rank && o < out->rank) {
    int64_t pi = in->dims[i], po = out->dims[o];
    int i0 = i;
    while (pi != po) {
      if (pi < po && i + 1 < in->rank) pi *= in->dims[++i];
      else if (po < pi && o + 1 < out->rank) po *= out->dims[++o];
      else return -1;
    }
    if (a >= i0 && a <= i) return a == i ? o : -1;
    i++, o++;
  }
  return -1;
}

static Val rule_reshape(GPart *G, const IrNode *n, Val x) {
  x = slots_in(G, n, x);
  const IrNode *src_in = &G->g->nodes[n->in[0]];
  Shd out = shd_r();
  for (int g = 0; g < IRG_COUNT; g++) out.partial[g] = x.shd.partial[g], x.shd.partial[g] = 0; /* kept: slots_in */
  int own = -1; /* the slots a context rank routed alone (cp_local_slots): their split rides the innermost axis of its run */
  if (x.shd.axis[IRG_CP] >= 0 && own_slot_view(G, n) && (own = view_inner_axis(src_in, n, x.shd.axis[IRG_CP])) < 0) {
    /* no view of the global shape describes them then: gathering them would not give the whole sequence's slots */
    diag_error(G->P->diag, n->span, "internal error: a view moves the split of a context rank's own slots off the innermost axis of its run");
    G->P->failed = 1;
    return (Val){-1, shd_r(), 0};
  }
  for (int g = 0; g < IRG_COUNT; g++) {
    int a = x.shd.axis[g];
    if (a < 0) continue;
    if (own >= 0 && a == x.shd.axis[IRG_CP]) { /* the context group's split, and the tensor group's inside it (fold_cp) */
      out.axis[g] = (int8_t)own;
      continue;
    }
    int64_t prefix = 1, outp = 1;
    for (int i = 0; i < a; i++) prefix *= src_in->dims[i];
    int found = -1;
    for (int b = 0; b < n->rank && found < 0; b++) {
      if (outp == prefix && n->dims[b] % G->P->size[g] == 0) found = b;
      outp *= n->dims[b];
    }
    if (found >= 0) out.axis[g] = (int8_t)found;
    else {
      Shd want = x.shd;
      want.axis[g] = -1;
      x = convert(G, x, &want, 0, n->span);
    }
  }
  int64_t dims[IR_MAX_RANK];
  local_dims(G->P, n, &out, dims);
  if (own >= 0 && x.id >= 0) { /* the rank's share of the buffer as the dispatch made it (rounded up) */
    int64_t numel = ir_numel(dn(G, x.id)), rest = 1;
    for (int i = 0; i < n->rank; i++) rest *= i == own ? 1 : dims[i];
    dims[own] = rest > 0 ? numel / rest : 0;
  }
  Val r = {emit(G, IR_RESHAPE, &x.id, 1, NULL, 0, 0, n->dtype, n->rank, dims, n->span), out, x.weight};
  return r;
}

static Val rule_transpose(GPart *G, const IrNode *n, Val x) {
  x = slots_in(G, n, x);
  Shd out = shd_r();
  for (int g = 0; g < IRG_COUNT; g++) out.partial[g] = x.shd.partial[g];
  for (int g = 0; g < IRG_COUNT; g++)
    for (int i = 0; i < n->rank; i++)
      if (x.shd.axis[g] >= 0 && n->attr[i] == x.shd.axis[g]) out.axis[g] = (int8_t)i;
  Val r = {emit(G, IR_TRANSPOSE, &x.id, 1, n->attr, n->rank, 0, n->dtype, -1, NULL, n->span), out, x.weight};
  return r;
}

static Val rule_slice(GPart *G, const IrNode *n, Val x) {
  x = settle(G, x, n->span);
  const IrNode *src_in = &G->g->nodes[n->in[0]];
  /* axes the slice changes must be whole here */
  int kept = 0;
  int out_axis_of[IR_MAX_RANK];
  for (int i = 0; i < src_in->rank; i++) {
    int dropped = (int)n->attr[8 + i];
    int64_t size = dropped ? 1 : n->dims[kept];
    out_axis_of[i] = dropped ? -1 : kept;
    if (!dropped) kept++;
    if (size != src_in->dims[i] || dropped) x = whole_along(G, x, i, n->span);
  }
  Shd out = shd_r();
  for (int g = 0; g < IRG_COUNT; g++)
    if (x.shd.axis[g] >= 0) out.axis[g] = (int8_t)out_axis_of[x.shd.axis[g]];
  int64_t dims[IR_MAX_RANK];
  local_dims(G->P, n, &out, dims);
  Val r = {emit(G, IR_SLICE, &x.id, 1, n->attr, 16, 0, n->dtype, n->rank, dims, n->span), out, x.weight};
  return r;
}

static Val rule_reduce(GPart *G, const IrNode *n, Val x) {
  x = settle(G, x, n->span);
  int axis = (int)n->attr[0], keep = (int)n->attr[1];
  Shd out = shd_r();
  double share = 1; /* the ranks the axis is split over: the tensor group's inside the context group's under both */
  for (int g = 0; g < IRG_COUNT; g++) {
    int a = x.shd.axis[g];
    if (a < 0) continue;
    if (a == axis) {
      if (n->op == IR_REDUCE_MAX) {
        Shd want = x.shd;
        want.axis[g] = -1;
        x = convert(G, x, &want, 0, n->span);
        continue;
      }
      share *= (double)G->P->size[g];
      out.partial[g] = 1;
    } else {
      out.axis[g] = (int8_t)(keep || a < axis ? a : a - 1);
    }
  }
  Val r = {emit(G, n->op, &x.id, 1, n->attr, 2, 0, n->dtype, -1, NULL, n->span), out, 0};
  /* A mean over a split axis averaged a chunk: scale it to its share (of every group splitting it). */
  if (share > 1 && n->op == IR_REDUCE_MEAN && r.id >= 0) {
    int c = emit(G, IR_CONST, NULL, 0, NULL, 0, 1.0 / share, DT_F32, -1, NULL, n->span);
    int in[2] = {r.id, c};
    r.id = emit(G, IR_MUL, in, 2, NULL, 0, 0, n->dtype, -1, NULL, n->span);
  }
  return r;
}

/* parallel.fused_ce over a vocabulary split (headloss.h): when the logits
 * are the tied table's GEMM x @ w^T read by the loss alone, the shard's
 * log-sum-exp is one op that never stores them (LINEAR_LSE, the padded
 * columns left out), the target's logit a lookup of its row dotted with x;
 * both reduced over the tensor group as the unfused form reduces them.
 * Returns the rows' losses, or -1 when the pattern does not hold (the
 * logits are then kept). */
static int fused_vocab_ce(GPart *G, const IrNode *n, Val z, Val t, IrGroup g) {
  if (!G->P->spec->fused_ce) return -1;
  int src = n->in[0], readers = 0;
  for (int i = 0; i < G->g->nnodes; i++)
    for (int k = 0; k < G->g->nodes[i].nin; k++) readers += G->g->nodes[i].in[k] == src;
  for (int k = 0; k < G->g->noutputs; k++) readers += G->g->outputs[k] == src;
  const IrNode *mm = dn(G, z.id);
  if (readers != 1 || G->g->nodes[src].op != IR_MATMUL || mm->op != IR_MATMUL || mm->attr[0]) return -1;
  const IrNode *b = dn(G, mm->in[1]);
  int w;
  if (mm->attr[1]) w = mm->in[1];
  else if (b->op == IR_TRANSPOSE && b->rank == 2 && b->attr[0] == 1 && b->attr[1] == 0) w = b->in[0];
  else return -1; /* an untied [C, V] head: its column lookup is not an op */
  if (dn(G, w)->dtype != DT_F32 || dn(G, mm->in[0])->dtype != DT_F32) return -1;
  Span at = n->span;
  int x = mm->in[0];
  int padded = G->P->vocab_axis && G->P->vocab_axis[G->gi][n->in[0]] == dn(G, z.id)->rank - 1;
  int64_t la[3] = {1, 1 + g, padded ? G->P->vocab_rows : 0};
  int xw[2] = {x, w};
  int lloc = emit(G, IR_LINEAR_LSE, xw, 2, la, 3, 0, DT_F32, -1, NULL, at);
  int m = all_reduce(G, lloc, g, 1, at);
  int in2[2] = {lloc, m};
  int e = emit(G, IR_EXP, (int[]){emit(G, IR_SUB, in2, 2, NULL, 0, 0, DT_F32, -1, NULL, at)}, 1, NULL, 0, 0, DT_F32, -1, NULL, at);
  int s = all_reduce(G, e, g, 0, at);
  int in3[2] = {emit(G, IR_LOG, &s, 1, NULL, 0, 0, DT_F32, -1, NULL, at), m};
  int lse = emit(G, IR_ADD, in3, 2, NULL, 0, 0, DT_F32, -1, NULL, at);
  /* the target's logit: its row of this rank's shard (zeros elsewhere) dotted with x */
  int64_t eattr[1] = {1 + g};
  int wt_in[2] = {w, t.id};
  int wt = emit(G, IR_EMBEDDING, wt_in, 2, eattr, 1, 0, DT_F32, -1, NULL, at);
  int xm[2] = {x, wt};
  int prod = emit(G, IR_MUL, xm, 2, NULL, 0, 0, DT_F32, -1, NULL, at);
  int64_t sattr[2] = {dn(G, prod)->rank - 1, 0};
  int ztl = emit(G, IR_REDUCE_SUM, &prod, 1, sattr, 2, 0, DT_F32, -1, NULL, at);
  int zt = all_reduce(G, ztl, g, 0, at);
  int in4[2] = {lse, zt};
  return emit(G, IR_SUB, in4, 2, NULL, 0, 0, DT_F32, -1, NULL, at);
}

/* Vocab-parallel cross-entropy (Megatron-LM): with the logits split along
 * the vocabulary, the log-sum-exp and the target logit are summed over the
 * tensor group. The max shift is a constant, so its all-reduce carries no
 * gradient. */
static Val rule_cross_entropy(GPart *G, const IrNode *n, Val z, Val t) {
  z = settle(G, z, n->span);
  t = settle(G, t, n->span);
  const IrNode *zn = dn(G, z.id);
  int last = zn->rank - 1;
  /* targets follow the logits' split on the leading axes */
  Shd tw = shd_r();
  for (int g = 0; g < IRG_COUNT; g++)
    if (z.shd.axis[g] >= 0 && z.shd.axis[g] < last) tw.axis[g] = z.shd.axis[g];
  t = convert(G, t, &tw, 0, n->span);
  Span at = n->span;
  int vocab_group = -1;
  for (int g = 0; g < IRG_COUNT; g++)
    if (z.shd.axis[g] == last) vocab_group = g;
  int fused = vocab_group >= 0 ? fused_vocab_ce(G, n, z, t, (IrGroup)vocab_group) : -1;
  if (fused < 0 && G->P->vocab_axis && G->P->vocab_axis[G->gi][n->in[0]] == last) {
    /* padded vocabulary: its columns past the model's read as -inf, so the
     * softmax gives them nothing and they get no gradient */
    int64_t mattr[2] = {vocab_group >= 0 ? 1 + vocab_group : 0, G->P->vocab_rows};
    z.id = emit(G, IR_VOCAB_MASK, &z.id, 1, mattr, 2, -INFINITY, zn->dtype, -1, NULL, at);
    zn = dn(G, z.id);
  }
  int loss, nll = fused;
  if (vocab_group < 0) {
    int in[2] = {z.id, t.id};
    loss = emit(G, IR_CROSS_ENTROPY, in, 2, NULL, 0, 0, n->dtype, -1, NULL, at);
  } else if (nll < 0) {
    IrGroup g = (IrGroup)vocab_group;
    int64_t rattr[2] = {last, 1};
    int mloc = emit(G, IR_REDUCE_MAX, &z.id, 1, rattr, 2, 0, zn->dtype, -1, NULL, at);
    int m = all_reduce(G, mloc, g, 1, at);
    int in2[2] = {z.id, m};
    int zs = emit(G, IR_SUB, in2, 2, NULL, 0, 0, zn->dtype, -1, NULL, at);
    int e = emit(G, IR_EXP, &zs, 1, NULL, 0, 0, zn->dtype, -1, NULL, at);
    int64_t sattr[2] = {last, 0};
    int sloc = emit(G, IR_REDUCE_SUM, &e, 1, sattr, 2, 0, zn->dtype, -1, NULL, at);
    int s = all_reduce(G, sloc, g, 0, at);
    int lse = emit(G, IR_LOG, &s, 1, NULL, 0, 0, zn->dtype, -1, NULL, at);
    int64_t pattr[1] = {1 + g};
    int in3[2] = {zs, t.id};
    int ztloc = emit(G, IR_PICK, in3, 2, pattr, 1, 0, zn->dtype, -1, NULL, at);
    int zt = all_reduce(G, ztloc, g, 0, at);
    int in4[2] = {lse, zt};
    nll = emit(G, IR_SUB, in4, 2, NULL, 0, 0, zn->dtype, -1, NULL, at);
  }
  if (vocab_group >= 0) {
    /* the rows' losses (fused or not): their mean over every position, flattened then one reduction */
    const IrNode *nn = dn(G, nll);
    int64_t count = ir_numel(nn);
    int flat = emit(G, IR_RESHAPE, &nll, 1, NULL, 0, 0, nn->dtype, 1, &count, at);
    int64_t mattr[2] = {0, 0};
    loss = emit(G, IR_REDUCE_MEAN, &flat, 1, mattr, 2, 0, nn->dtype, -1, NULL, at);
  }
  Val r = {loss, shd_r(), 0};
  /* positions split over a group: this mean covers a share of them */
  for (int g = 0; g < IRG_COUNT; g++) {
    if (g == vocab_group || z.shd.axis[g] < 0 || r.id < 0) continue;
    int c = emit(G, IR_CONST, NULL, 0, NULL, 0, 1.0 / (double)G->P->size[g], DT_F32, -1, NULL, at);
    int in[2] = {r.id, c};
    r.id = emit(G, IR_MUL, in, 2, NULL, 0, 0, n->dtype, -1, NULL, at);
    r.shd.partial[g] = 1;
  }
  return r;
}

/* ---- graphs ---- */

/* What a partition can leave read by nothing, removed (a back end would
 * otherwise compute it for nobody, or refuse a value with no buffer;
 * ir_drop_unread): copy_marker moves a dispatch's marker onto its tokens by
 * dispatching them again, leaving the first dispatch and its views; a
 * dispatch's constant weights are made again at the rank's shape
 * (dispatch_weights), leaving the whole sequence's fill. */
static int unread_dispatch(IrOp op) {
  return op == IR_MOE_DISPATCH || op == IR_RESHAPE || op == IR_TRANSPOSE || op == IR_FILL;
}

static int partition_graph(Part *P, int gi, Shd entry);

static Shd param_shd(const Part *P, const IrParam *p) {
  Shd s = shd_r();
  if (p->rank == 0) return s;
  if (p->shard == SHARD_EXPERT_COLUMN || p->shard == SHARD_EXPERT_ROW) {
    /* the experts over expert parallelism, and each expert as a Linear over
     * tensor parallelism (Megatron-Core's expert tensor parallelism = tp) */
    if (P->size[IRG_EP] > 1) s.axis[IRG_EP] = 0;
    /* under parallel folding the experts stay whole: the tensor ranks are
     * members of the expert group, each holding its own experts */
    if (!P->spec->ep_fold) s.axis[IRG_TP] = (int8_t)(p->shard == SHARD_EXPERT_COLUMN ? p->rank - 1 : p->rank - 2);
    return s;
  }
  switch (p->shard) {
  case SHARD_COLUMN: s.axis[IRG_TP] = (int8_t)(p->rank - 1); break;
  case SHARD_ROW: s.axis[IRG_TP] = (int8_t)(p->rank >= 2 ? p->rank - 2 : 0); break; /* [.., n_in, n_out]: n_in */
  case SHARD_VOCAB: s.axis[IRG_TP] = 0; break;
  default: break;
  }
  return s;
}

/* The local parameter of source parameter `pi` in the new module. */
static int local_param(Part *P, int pi) {
  const IrParam *sp = &P->src->params[pi];
  for (int i = 0; i < P->dst->nparams; i++)
    if (!strcmp(P->dst->params[i].name, sp->name)) return i;
  IrParam lp = *sp;
  Shd s = param_shd(P, sp);
  memcpy(lp.full_dims, sp->dims, sizeof lp.full_dims);
  lp.split_axis = lp.split2_axis = -1;
  if (sp->shard == SHARD_VOCAB && P->vocab_rows > 0 && sp->dims[0] == P->vocab_rows) {
    /* Megatron-LM's make-vocab-size-divisible-by (vocab_flow) */
    lp.dims[0] = lp.full_dims[0] = P->vocab_padded;
    lp.logical_rows = P->vocab_rows;
  }
  if (P->size[IRG_TP] > 1 && s.axis[IRG_TP] >= 0) {
    int a = s.axis[IRG_TP];
    int64_t tp = P->size[IRG_TP];
    if (lp.dims[a] % tp) {
      diag_error(P->diag, sp->span, "parameter %s: dimension %d (%" PRId64 ") does not divide over tensor = %" PRId64,
                 sp->name, a, sp->dims[a], tp);
      P->failed = 1;
    } else {
      lp.dims[a] /= tp; /* left whole when refused: the message above is the one to show */
    }
    lp.split_axis = (int8_t)a;
    lp.split_group = IRG_TP;
  }
  if (P->size[IRG_EP] > 1 && s.axis[IRG_EP] >= 0) {
    int64_t ep = P->size[IRG_EP];
    if (lp.dims[0] % ep) {
      diag_error(P->diag, sp->span, "parameter %s: its %" PRId64 " experts do not divide over expert = %" PRId64, sp->name, lp.dims[0], ep);
      P->failed = 1;
    } else {
      lp.dims[0] /= ep;
    }
    if (lp.split_axis >= 0) { /* the experts first, then each expert's block */
      lp.split2_axis = lp.split_axis;
      lp.split2_group = lp.split_group;
    }
    lp.split_axis = 0;
    lp.split_group = IRG_EP;
  }
  return ir_add_param(P->dst, &lp);
}

static Val part_node(GPart *G, int i) {
  Part *P = G->P;
  const IrNode *n = &G->g->nodes[i];
  Val r = {-1, shd_r(), 0};
  Val ins[8];
  int nin = n->nin < 8 ? n->nin : 8;
  for (int k = 0; k < nin; k++) ins[k] = val_of(G, n, k);
  int flags = ir_op_flags(n->op);
  if (cp_local_rows(G, n, ins) || cp_local_slots(G, n, ins)) return rule_cp_rows(G, n, ins);
  if (fold_routing(G, n)) return rule_fold_routing(G, n, ins);
  if (n->op == IR_TOPK || n->op == IR_TAKE || n->op == IR_TAKE_BWD || n->op == IR_ONE_HOT) return rule_router_rows(G, n, ins);
  switch (n->op) {
  case IR_INPUT: {
    r.id = emit(G, IR_INPUT, NULL, 0, n->attr, 1, 0, n->dtype, n->rank, n->dims, n->span);
    G->out->nodes[r.id].name = n->name;
    /* Inputs hold whole sequences; context ranks take their chunks. */
    if (P->size[IRG_CP] > 1 && n->rank >= 2 && n->dims[1] == P->spec->seq_len) {
      Shd want = shd_r();
      want.axis[IRG_CP] = 1;
      r = convert(G, r, &want, 0, n->span);
    }
    return r;
  }
  case IR_PARAM: {
    int lp = local_param(P, (int)n->attr[0]);
    const IrParam *p = &P->dst->params[lp];
    int64_t attr = lp;
    r.id = emit(G, IR_PARAM, NULL, 0, &attr, 1, 0, p->dtype, p->rank, p->dims, n->span);
    r.shd = param_shd(P, &P->src->params[n->attr[0]]);
    for (int g = 0; g < IRG_COUNT; g++)
      if (P->size[g] <= 1) r.shd.axis[g] = -1;
    r.weight = 1;
    return r;
  }
  case IR_CONST:
  case IR_FILL:
  case IR_IOTA:
    r.id = emit(G, n->op, NULL, 0, n->attr, IR_NATTR, n->fattr, n->dtype, n->rank, n->dims, n->span);
    return r;
  case IR_MATMUL: return rule_matmul(G, n, ins[0], ins[1]);
  case IR_GROUPED_MM: return rule_grouped_mm(G, n, ins[0], ins[1], ins[2]);
  case IR_RESHAPE: return rule_reshape(G, n, ins[0]);
  case IR_TRANSPOSE: return rule_transpose(G, n, ins[0]);
  case IR_SLICE: return rule_slice(G, n, ins[0]);
  case IR_REDUCE_SUM:
  case IR_REDUCE_MEAN:
  case IR_REDUCE_MAX: return rule_reduce(G, n, ins[0]);
  case IR_CROSS_ENTROPY: return rule_cross_entropy(G, n, ins[0], ins[1]);
  case IR_SOFTMAX:
  case IR_LOG_SOFTMAX: {
    Val x = whole_along(G, settle(G, ins[0], n->span), (int)n->attr[0], n->span);
    r.shd = x.shd;
    r.id = emit(G, n->op, &x.id, 1, n->attr, 1, 0, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_CONCAT: {
    Val *vs = arena_alloc(P->arena, sizeof(Val) * (size_t)n->nin);
    for (int k = 0; k < n->nin; k++) vs[k] = whole_along(G, G->vals[n->in[k]], (int)n->attr[0], n->span);
    r = rule_elementwise(G, n, vs, n->nin, (int)n->attr[0]);
    int *in = arena_alloc(P->arena, sizeof(int) * (size_t)n->nin);
    for (int k = 0; k < n->nin; k++) in[k] = vs[k].id;
    r.id = emit(G, IR_CONCAT, in, n->nin, n->attr, 1, 0, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_EMBEDDING: {
    Val table = settle(G, ins[0], n->span), ids = settle(G, ins[1], n->span);
    int64_t attr[1] = {0};
    if (table.shd.axis[IRG_TP] == 0 && P->size[IRG_TP] > 1) {
      attr[0] = 1 + IRG_TP; /* vocab-parallel: rows outside this rank's range give zeros */
      r.shd.partial[IRG_TP] = 1;
    } else if (table.shd.axis[IRG_TP] == 1) {
      r.shd.axis[IRG_TP] = (int8_t)n->rank - 1;
    }
    for (int g = 0; g < IRG_COUNT; g++)
      if (ids.shd.axis[g] >= 0) r.shd.axis[g] = ids.shd.axis[g];
    /* a whole table used by a split lookup collects only this rank's share of its gradient */
    for (int k = 0; k < NPART_GROUPS; k++) {
      IrGroup g = part_groups[k];
      if (P->size[g] > 1 && table.shd.axis[g] < 0 && (r.shd.axis[g] >= 0 || r.shd.partial[g]))
        table.id = copy_marker(G, table.id, g, n->span);
    }
    int in[2] = {table.id, ids.id};
    r.id = emit(G, IR_EMBEDDING, in, 2, attr, 1, 0, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_CAUSAL_MASK: {
    Val x = settle(G, ins[0], n->span);
    x = whole_along(G, x, n->rank - 1, n->span);
    int64_t attr[2] = {0, 0};
    for (int g = 0; g < IRG_COUNT; g++)
      if (x.shd.axis[g] == n->rank - 2) {
        if (g != IRG_CP) x = whole_along(G, x, n->rank - 2, n->span);
        /* local query rows in the zigzag layout; keys came around the ring */
        else attr[0] = attr[1] = 1 + IRG_CP;
      }
    r.shd = x.shd;
    r.id = emit(G, IR_CAUSAL_MASK, &x.id, 1, attr, 2, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_ATTENTION: {
    /* Heads split over a group stay split (each rank attends with its own
     * query heads and their key heads: both counts divide by the group);
     * queries split along the sequence over the context group keep their
     * zigzag rows and take the keys and values around the ring (ring
     * attention); any other split of the sequence or the head width is
     * gathered. */
    const IrNode *kn = &G->g->nodes[n->in[1]];
    Val q = whole_along(G, settle(G, ins[0], n->span), 3, n->span);
    int64_t attr[4] = {n->attr[0], 0, 0, n->attr[3]};
    Shd kv = shd_r();
    int ring = 0;
    for (int k = 0; k < NPART_GROUPS; k++) {
      IrGroup g = part_groups[k];
      if (P->size[g] <= 1 || q.shd.axis[g] < 0) continue;
      int a = q.shd.axis[g];
      if (a == 2 && g == IRG_CP) {
        attr[1] = attr[2] = 1 + IRG_CP;
        ring = 1;
      } else if (a == 1 && kn->dims[1] % P->size[g] == 0) {
        kv.axis[g] = 1;
      } else if (a == 0) {
        kv.axis[g] = 0;
      } else {
        q = whole_along(G, q, a, n->span);
      }
    }
    unsigned mask = split_mask(&q.shd);
    Val ks = ins[1], vs = ins[2];
    if (ring && P->spec->cp_ring) {
      ks = settle(G, ks, n->span);
      vs = settle(G, vs, n->span);
    }
    if (ring && P->spec->cp_ring && ks.shd.axis[IRG_CP] == 2 && vs.shd.axis[IRG_CP] == 2) {
      /* cp_comm = ring: the keys and values stay split, their blocks come around one at a time */
      Shd kvb = kv;
      kvb.axis[IRG_CP] = 2;
      Val k = convert(G, ks, &kvb, mask, n->span);
      Val v = convert(G, vs, &kvb, mask, n->span);
      if (q.id < 0 || k.id < 0 || v.id < 0) return r;
      r.shd = q.shd;
      r.id = ring_attention(G, q.id, k.id, v.id, attr, n->fattr, n->dtype, n->span);
      if (r.id == -2) {
        diag_error(P->diag, n->span, "internal error partitioning attention: the keys reach it through more than one repeat");
        P->failed = 1;
        r.id = -1;
      }
      return r;
    }
    G->ring = ring;
    Val k = convert(G, settle(G, ks, n->span), &kv, mask, n->span);
    Val v = convert(G, settle(G, vs, n->span), &kv, mask, n->span);
    G->ring = 0;
    if (q.id < 0 || k.id < 0 || v.id < 0) return r;
    int in[3] = {q.id, k.id, v.id};
    r.shd = q.shd;
    r.id = emit(G, IR_ATTENTION, in, 3, attr, 4, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_ROPE: {
    Val x = settle(G, ins[0], n->span);
    x = whole_along(G, x, 3, n->span);
    int64_t attr[9];
    memcpy(attr, n->attr, sizeof attr); /* YaRN's settings and the layout kept */
    attr[1] = 0;
    const int pos = ir_rope_pos_axis(n);
    for (int g = 0; g < IRG_COUNT; g++)
      if (x.shd.axis[g] == pos) {
        if (g != IRG_CP) x = whole_along(G, x, pos, n->span);
        else attr[1] = 1 + IRG_CP; /* positions of the zigzag chunks */
      }
    r.shd = x.shd;
    r.id = emit(G, IR_ROPE, &x.id, 1, attr, 9, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_REPEAT_KV: {
    Val x = settle(G, ins[0], n->span);
    r.shd = x.shd;
    r.id = emit(G, IR_REPEAT_KV, &x.id, 1, n->attr, 1, 0, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_CALL: {
    int callee = (int)n->attr[0];
    Val x = settle(G, ins[0], n->span);
    int bgi = partition_graph(P, callee, x.shd);
    if (bgi < 0) return r;
    Shd want = P->entry[callee];
    x = convert(G, x, &want, 0, n->span);
    int *in = arena_alloc(P->arena, sizeof(int) * (size_t)(n->nin + 1));
    in[0] = x.id;
    Shd whole = shd_r();
    for (int k = 1; k < n->nin; k++) in[k] = convert(G, settle(G, G->vals[n->in[k]], n->span), &whole, 0, n->span).id;
    const IrGraph *bg = P->dst->graphs[bgi];
    const IrNode *out = &bg->nodes[bg->outputs[0]];
    int64_t attr[3] = {bgi, n->attr[1], n->attr[2]};
    r.id = emit(G, IR_CALL, in, n->nin, attr, 3, 0, out->dtype, out->rank, out->dims, n->span);
    r.shd = P->entry[callee];
    return r;
  }
  case IR_TOPK:
  case IR_TAKE:
  case IR_TAKE_BWD:
  case IR_MOE_COMBINE: {
    /* The combine is linear in the experts' output y: when y is a pending sum
     * (the experts' down projection row-split over the tensor group), so is
     * the combine, and the sum is made once over [B, T, C] after it instead of
     * over every expert's slots. The gates, replicated, then get a marker: their
     * gradient (a dot product with the partial y) is summed over the group. */
    Val y = ins[0];
    int partial = 0, split = 0;
    for (int g = 0; g < IRG_COUNT; g++) partial |= y.shd.partial[g];
    if (n->op == IR_MOE_COMBINE && partial && P->size[IRG_EP] > 1 && y.shd.axis[IRG_EP] >= 0) {
      /* Under expert parallelism the experts' slots go home first (the
       * all-to-all is linear, so the pending sum survives it), and the sum
       * is made after the combine, as without it. */
      y = ep_exchange(G, y, -1, n->span);
      if (y.id < 0) return r;
    }
    for (int g = 0; g < IRG_COUNT; g++) split |= y.shd.axis[g] >= 0;
    if (partial && !split) {
      Shd whole = shd_r();
      unsigned mask = split_mask(&y.shd);
      int in[3] = {y.id, convert(G, settle(G, ins[1], n->span), &whole, mask, n->span).id,
                   convert(G, settle(G, ins[2], n->span), &whole, mask, n->span).id};
      r.shd = y.shd;
      r.id = emit(G, n->op, in, 3, n->attr, IR_NATTR, 0, n->dtype, -1, NULL, n->span);
      return r;
    }
  }
  /* fall through */
  case IR_ONE_HOT:
  case IR_MOE_DISPATCH:
  case IR_MOE_GATE_GRAD:
  case IR_MOE_EXPERT_IDS:
  case IR_GROUPED_MM_WGRAD:
  /* Convolutions and pooling, replicated too (data parallelism splits the
   * images before the graph; channel-split convolutions are not written yet). */
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER:
  case IR_POOL2D:
  case IR_POOL2D_BWD: {
    /* The router's and the experts' exchange ops are supported replicated only (so far): a split or
     * partial input is made whole first and every rank computes the whole
     * result, as for an extern (correct under any layout; expert
     * parallelism, issue 13, will place them). */
    Shd whole = shd_r();
    int in[3];
    for (int k = 0; k < n->nin; k++) in[k] = convert(G, settle(G, G->vals[n->in[k]], n->span), &whole, 0, n->span).id;
    r.id = emit(G, n->op, in, n->nin, n->attr, IR_NATTR, 0, n->dtype, n->op == IR_TAKE_BWD ? n->rank : -1,
                n->op == IR_TAKE_BWD ? n->dims : NULL, n->span);
    return r;
  }
  case IR_STATE_UPDATE: {
    /* x passes through as it is sharded; the state (replicated: a state
     * parameter is never split) takes the whole value */
    Shd whole = shd_r();
    Val x = settle(G, ins[0], n->span);
    int in[3] = {x.id, convert(G, settle(G, ins[1], n->span), &whole, 0, n->span).id,
                 convert(G, settle(G, ins[2], n->span), &whole, 0, n->span).id};
    r.shd = x.shd;
    r.id = emit(G, n->op, in, 3, n->attr, IR_NATTR, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_ALL_REDUCE:
  case IR_COPY_TO_GROUP: {
    /* A model's own collective over the data-parallel group (synchronised
     * batch norm's statistics): the group is outside this partitioning, so
     * the value is made whole over the groups split here and the collective
     * kept as it is. */
    if (n->attr[0] != IRG_DP) break;
    Shd whole = shd_r();
    int in0 = convert(G, settle(G, ins[0], n->span), &whole, 0, n->span).id;
    r.id = emit(G, n->op, &in0, 1, n->attr, IR_NATTR, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_AUX_LOSS: {
    /* x passes through as it is sharded; the loss is made whole (every rank adds the same term) */
    Shd whole = shd_r();
    Val x = settle(G, ins[0], n->span);
    int in[2] = {x.id, convert(G, settle(G, ins[1], n->span), &whole, 0, n->span).id};
    r.shd = x.shd;
    r.id = emit(G, n->op, in, 2, n->attr, IR_NATTR, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  case IR_LOSS_SEED:
  case IR_TRAINING:
    r.id = emit(G, n->op, NULL, 0, NULL, 0, 0, n->dtype, 0, NULL, n->span);
    return r;
  case IR_EXTERN: {
    /* A native function sees whole tensors: split or partial arguments are
     * made replicated, and every rank computes the whole result (correct
     * for any function; docs/compiler.md). */
    Shd whole = shd_r();
    int *in = arena_alloc(P->arena, sizeof(int) * (size_t)(n->nin + 1));
    for (int k = 0; k < n->nin; k++) in[k] = convert(G, settle(G, G->vals[n->in[k]], n->span), &whole, 0, n->span).id;
    r.id = emit(G, IR_EXTERN, in, n->nin, n->attr, IR_NATTR, 0, n->dtype, -1, NULL, n->span);
    return r;
  }
  default:
    break;
  }
  if (flags & IRF_ELEMENTWISE) {
    r = rule_elementwise(G, n, ins, nin, -1);
    int in[8];
    for (int k = 0; k < nin; k++) in[k] = ins[k].id;
    r.id = emit(G, n->op, in, nin, n->attr, IR_NATTR, n->fattr, n->dtype, -1, NULL, n->span);
    return r;
  }
  diag_error(P->diag, n->span, "the partitioner does not handle %s yet", ir_op_name(n->op));
  P->failed = 1;
  return r;
}

/* GPart.to_combine: reshapes and transposes whose only reader is a combine's
 * slots (y), directly or through more of them (moe_expert_major's way back
 * to [B, E, cap, Y]), each marked with that combine + 1; NULL when the graph
 * has none. */
static int *views_to_combine(Arena *arena, const IrGraph *g) {
  int n = g->nnodes, any = 0;
  for (int i = 0; i < n && !any; i++) any = g->nodes[i].op == IR_MOE_COMBINE;
  if (!any) return NULL;
  int *nread = arena_alloc(arena, sizeof(int) * (size_t)(n + 1)), *reader = arena_alloc(arena, sizeof(int) * (size_t)(n + 1));
  int *mark = arena_alloc(arena, sizeof(int) * (size_t)(n + 1));
  memset(nread, 0, sizeof(int) * (size_t)(n + 1));
  memset(mark, 0, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) {
      int v = g->nodes[i].in[k];
      nread[v]++;
      reader[v] = g->nodes[i].op == IR_MOE_COMBINE && k != 0 ? -1 : i;
    }
  for (int i = 0; i < g->noutputs; i++) nread[g->outputs[i]] += 2;
  for (int i = n - 1; i >= 0; i--) {
    const IrNode *x = &g->nodes[i];
    if ((x->op != IR_RESHAPE && x->op != IR_TRANSPOSE) || nread[i] != 1 || reader[i] < 0) continue;
    const IrNode *r = &g->nodes[reader[i]];
    mark[i] = r->op == IR_MOE_COMBINE ? reader[i] + 1 : mark[reader[i]];
  }
  return mark;
}

/* Partitions source graph gi (a block when gi > 0) with arg 0 sharded as
 * `entry`; a repeated block must hand back the sharding it received. */
static int partition_graph(Part *P, int gi, Shd entry) {
  if (P->done[gi] >= 0) return P->done[gi];
  const IrGraph *g = P->src->graphs[gi];
  IrGraph *out = ir_graph_new(P->dst, g->name);
  ir_graph_reserve(out, g->nnodes + g->nnodes / 2 + 32); /* its collectives and reshapes added */
  int oi = P->dst->ngraphs - 1;
  out->count = g->count;
  out->nargs = g->nargs;
  P->done[gi] = oi;
  P->entry[gi] = entry;
  GPart G;
  memset(&G, 0, sizeof G);
  G.P = P;
  G.gi = gi;
  G.g = g;
  G.out = out;
  G.vals = arena_alloc(P->arena, sizeof(Val) * (size_t)(g->nnodes + 1));
  G.to_combine = views_to_combine(P->arena, g);
  G.own_idx = arena_alloc(P->arena, (size_t)g->nnodes + 1);
  memset(G.own_idx, 0, (size_t)g->nnodes + 1);
  for (int i = 0; i < g->nnodes && !P->failed; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op == IR_ARG) {
      Shd s = n->attr[0] == 0 ? entry : shd_r();
      int64_t dims[IR_MAX_RANK];
      local_dims(P, n, &s, dims);
      G.vals[i].id = emit(&G, IR_ARG, NULL, 0, n->attr, 1, 0, n->dtype, n->rank, dims, n->span);
      G.vals[i].shd = s;
      continue;
    }
    G.vals[i] = part_node(&G, i);
    if (G.vals[i].id < 0 && !P->failed) {
      diag_error(P->diag, n->span, "internal error: %s was not partitioned", ir_op_name(n->op));
      P->failed = 1;
    }
    if (G.vals[i].id >= 0 && n->name) out->nodes[G.vals[i].id].name = n->name;
  }
  if (P->failed) return -1;
  out->noutputs = g->noutputs;
  out->outputs = arena_alloc(P->arena, sizeof(int) * (size_t)(g->noutputs + 1));
  for (int k = 0; k < g->noutputs; k++) {
    Val v = settle(&G, G.vals[g->outputs[k]], g->nodes[g->outputs[k]].span);
    /* graph 0's outputs (the loss) are whole; a block returns its entry sharding */
    Shd want = gi == 0 ? shd_r() : entry;
    v = convert(&G, v, &want, 0, g->nodes[g->outputs[k]].span);
    out->outputs[k] = v.id;
  }
  if (!P->failed) ir_drop_unread(out, unread_dispatch);
  return P->failed ? -1 : oi;
}

/* ---- vocabulary padding ---- */

/* The axis of node i's value that spans the padded vocabulary, from its
 * inputs' (ax); -1 when it spans none; -2 (after an error naming the op)
 * when it reads a padded value in a way the padding would change: only
 * layouts, products, elementwise arithmetic, the embedding lookup and the
 * cross-entropy (whose rule masks the padded columns) may. */
static int vocab_flow_node(Part *P, const IrGraph *g, int i, const int *ax) {
  const IrNode *n = &g->nodes[i];
  if (n->op == IR_PARAM) {
    const IrParam *p = &P->src->params[n->attr[0]];
    return p->shard == SHARD_VOCAB && p->rank >= 1 && p->dims[0] == P->vocab_rows ? 0 : -1;
  }
  int any = 0;
  for (int k = 0; k < n->nin; k++) any |= ax[n->in[k]] >= 0;
  if (!any) return -1;
  const IrNode *x = &g->nodes[n->in[0]];
  int a0 = ax[n->in[0]], out = -2;
  switch (n->op) {
  case IR_TRANSPOSE:
    for (int d = 0; d < n->rank; d++)
      if (n->attr[d] == a0) out = d;
    break;
  case IR_MATMUL: {
    const IrNode *y = &g->nodes[n->in[1]];
    int a1 = ax[n->in[1]];
    int rows = n->attr[0] ? x->rank - 1 : x->rank - 2, cols = n->attr[1] ? y->rank - 2 : y->rank - 1;
    if (a0 >= 0 && a1 < 0 && a0 == rows) out = n->rank - 2;
    if (a1 >= 0 && a0 < 0 && a1 == cols) out = n->rank - 1;
    break;
  }
  case IR_EMBEDDING: out = a0 == 0 && ax[n->in[1]] < 0 ? -1 : -2; break;
  case IR_CROSS_ENTROPY: out = a0 == x->rank - 1 && ax[n->in[1]] < 0 ? -1 : -2; break;
  default: {
    if (!(ir_op_flags(n->op) & IRF_ELEMENTWISE)) break;
    /* every operand spans the vocabulary on the same (right-aligned) axis or broadcasts over it */
    int axis = -1, ok = 1;
    for (int k = 0; k < n->nin; k++) {
      int a = ax[n->in[k]], w = a + (n->rank - g->nodes[n->in[k]].rank);
      if (a < 0) continue;
      ok &= axis < 0 || axis == w;
      axis = w;
    }
    for (int k = 0; k < n->nin && ok; k++) {
      const IrNode *o = &g->nodes[n->in[k]];
      int at = axis - (n->rank - o->rank);
      ok = ax[n->in[k]] >= 0 || at < 0 || o->dims[at] == 1;
    }
    if (ok) out = axis;
    break;
  }
  }
  if (out == -2 && P->vocab_probe) {
    P->vocab_leak = 1;
    return -1;
  }
  if (out == -2) {
    diag_error(P->diag, n->span,
               "the vocabulary is padded from %" PRId64 " to %" PRId64 " rows for tensor = %" PRId64
               " (vocab_pad); this %s reads the padded logits, which only cross_entropy masks",
               P->vocab_rows, P->vocab_padded, P->size[IRG_TP], ir_op_name(n->op));
    diag_hint(P->diag, "a vocabulary that tensor divides needs no padding (%" PRId64 " rows, for one)", P->vocab_padded);
    P->failed = 1;
  }
  return out;
}

/* Chooses the padding (Megatron-LM's make-vocab-size-divisible-by: the
 * rows of vocab-split tables that tensor does not divide, to a multiple of
 * vocab_pad x tensor) and checks where the padded values go. At one tensor
 * rank the rows are padded to a multiple of vocab_pad as Megatron-LM pads
 * them, for the head's GEMMs: 50257 rows (GPT-2's) give bf16 rows of
 * 100514 bytes, off the 16-byte alignment tensor-core GEMMs want, 50304
 * aligned ones (llm.c's padded vocabulary; on an H200 the head's GEMMs went
 * from 95-145 to 623-843 TFLOP/s). There it is an optimisation only: a
 * table that would grow by over 1/16 (a small vocabulary, whose GEMMs are
 * small too) keeps its rows, as does a model whose padded logits would
 * leave a graph (or reach an op the padding would change) and a fused
 * head (parallel.fused_ce computes the logits in blocks). */
static void vocab_flow(Part *P) {
  int64_t tp = P->size[IRG_TP], q = P->spec->vocab_pad * tp;
  if (P->spec->vocab_pad <= 0 || (tp <= 1 && P->spec->fused_ce)) return;
  P->vocab_probe = tp <= 1;
  for (int i = 0; i < P->src->nparams; i++) {
    const IrParam *p = &P->src->params[i];
    if (p->shard != SHARD_VOCAB || p->rank < 1 || p->dims[0] % (tp > 1 ? tp : q) == 0) continue;
    if (P->vocab_rows && p->dims[0] != P->vocab_rows) {
      if (P->vocab_probe) { /* two vocabularies: no alignment padding */
        P->vocab_rows = 0;
        return;
      }
      diag_error(P->diag, p->span, "parameter %s: a second vocabulary (%" PRId64 " rows, the first %" PRId64
                 ") to pad for tensor = %" PRId64 "; one padded vocabulary a model is supported",
                 p->name, p->dims[0], P->vocab_rows, tp);
      P->failed = 1;
      return;
    }
    int64_t padded = (p->dims[0] + q - 1) / q * q;
    if (P->vocab_probe && (padded - p->dims[0]) * 16 > p->dims[0]) continue; /* over 1/16 more: a small table, as it is */
    P->vocab_rows = p->dims[0];
    P->vocab_padded = padded;
  }
  if (!P->vocab_rows) return;
  P->vocab_axis = arena_alloc(P->arena, sizeof(int *) * (size_t)P->src->ngraphs);
  for (int gi = 0; gi < P->src->ngraphs && !P->failed && !P->vocab_leak; gi++) {
    const IrGraph *g = P->src->graphs[gi];
    int *ax = P->vocab_axis[gi] = arena_alloc(P->arena, sizeof(int) * (size_t)(g->nnodes + 1));
    for (int i = 0; i < g->nnodes && !P->failed && !P->vocab_leak; i++) ax[i] = vocab_flow_node(P, g, i, ax);
    for (int k = 0; k < g->noutputs && !P->failed && !P->vocab_leak; k++)
      if (ax[g->outputs[k]] >= 0) {
        if (P->vocab_probe) {
          P->vocab_leak = 1;
          break;
        }
        diag_error(P->diag, g->nodes[g->outputs[k]].span,
                   "the vocabulary is padded from %" PRId64 " to %" PRId64 " rows for tensor = %" PRId64
                   " (vocab_pad); this value leaves %s with the padded logits, which only cross_entropy masks",
                   P->vocab_rows, P->vocab_padded, tp, g->name);
        P->failed = 1;
      }
  }
  if (P->vocab_leak) { /* one rank: the model as it is */
    P->vocab_rows = P->vocab_padded = 0;
    P->vocab_axis = NULL;
  }
}

IrModule *spmd_partition(Arena *arena, Diag *diag, const IrModule *global, const SpmdSpec *spec) {
  Part P;
  memset(&P, 0, sizeof P);
  P.arena = arena;
  P.diag = diag;
  P.src = global;
  P.spec = spec;
  for (int g = 0; g < IRG_COUNT; g++) P.size[g] = 1;
  P.size[IRG_TP] = spec->tp > 0 ? spec->tp : 1;
  P.size[IRG_CP] = spec->cp > 0 ? spec->cp : 1;
  P.size[IRG_EP] = spec->ep > 0 ? spec->ep : 1;
  P.dst = ir_module_new(arena);
  P.dst->micro_batch = global->micro_batch;
  P.dst->inputs = global->inputs;
  P.dst->ninputs = global->ninputs;
  P.dst->externs = global->externs;
  P.dst->nexterns = global->nexterns;
  P.done = arena_alloc(arena, sizeof(int) * (size_t)global->ngraphs);
  P.entry = arena_alloc(arena, sizeof(Shd) * (size_t)global->ngraphs);
  for (int i = 0; i < global->ngraphs; i++) P.done[i] = -1;
  vocab_flow(&P);
  if (!P.failed) partition_graph(&P, 0, shd_r());
  if (!P.failed && spec->fused_ce) {
    const char *why = NULL;
    if (headloss_fuse(P.dst, &why) < 0) {
      diag_error(diag, span_none, "internal error fusing the head with its loss (fused_ce): %s", why ? why : "?");
      return NULL;
    }
  }
  return P.failed ? NULL : P.dst;
}
