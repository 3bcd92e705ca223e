/* moepack.c - dropless experts over the rows routed to them (see moepack.h). */
#include "moepack.h"

#include <stdlib.h>
#include <string.h>

#include "xalloc.h"

/* How an operand from outside the chain broadcasts against a slot tensor
 * [B, E, cap, Y]. */
typedef enum { BC_NONE, BC_SCALAR, BC_VECTOR, BC_EXPERT } Broadcast;

static Broadcast broadcast_of(const IrNode *o, const IrNode *slots) {
  int r = o->rank;
  if (ir_numel(o) == 1) return BC_SCALAR;
  if (r > 4) return BC_NONE;
  int lead1 = 1; /* every axis before the last is 1: a vector along Y */
  for (int d = 0; d + 1 < r; d++) lead1 &= o->dims[d] == 1;
  int64_t last = o->dims[r - 1];
  if (last != 1 && last != slots->dims[3]) return BC_NONE;
  if (lead1) return BC_VECTOR;
  /* [..., E, 1, Y'] with 1s before: one value (row) an expert */
  if (r < 3 || o->dims[r - 3] != slots->dims[1] || o->dims[r - 2] != 1) return BC_NONE;
  for (int d = 0; d + 3 < r; d++)
    if (o->dims[d] != 1) return BC_NONE;
  return BC_EXPERT;
}

/* Ops whose value at a position depends on that position, not only on the
 * operands there: they would see the rows' order. */
static int position_dependent(IrOp op) { return op == IR_CAUSAL_MASK || op == IR_VOCAB_MASK || op == IR_DROPOUT; }

/* Marks the chain of dispatch d (owner[v] = d + 1) when it fits (moepack.h);
 * `dropless`: the dispatch must also have room for every token. */
static int mark_chain(const IrGraph *g, int d, const IrReaders *rd, const char *out, int *owner, int *queue, int dropless) {
  const IrNode *dn = &g->nodes[d];
  if (dn->op != IR_MOE_DISPATCH || dn->attr[1] == 0 || out[d]) return 0;
  const IrNode *x = &g->nodes[dn->in[0]], *idx = &g->nodes[dn->in[1]];
  int64_t E = dn->attr[0];
  /* room for every token, and a token's choices distinct (a top-k): nothing is dropped */
  if (dropless && (dn->attr[1] != x->dims[1] || idx->op != IR_TOPK || idx->attr[0] > E)) return 0;
  int head = 0, tail = 0, ok = 1, combines = 0;
  owner[d] = d + 1;
  queue[tail++] = d;
  while (ok && head < tail) {
    int v = queue[head++];
    for (int u = rd->start[v]; u < rd->start[v + 1] && ok; u++) {
      int r = rd->node[u], k = rd->slot[u];
      const IrNode *rn = &g->nodes[r];
      if (owner[r] == d + 1) {
        /* a node of the chain reading two of its values: seen once */
        if (rn->op == IR_MATMUL) ok = 0;
        continue;
      }
      if (owner[r]) {
        ok = 0;
        break;
      }
      const IrNode *vn = &g->nodes[v];
      if (rn->op == IR_MOE_COMBINE) {
        ok = k == 0 && rn->in[1] == dn->in[1];
        combines++;
        continue;
      }
      if (out[r] || rn->rank != 4 || vn->rank != 4) {
        ok = 0;
      } else if (rn->op == IR_MATMUL) {
        const IrNode *w = &g->nodes[rn->in[1]];
        ok = k == 0 && !rn->attr[0] && w->rank == 3 && w->dims[0] == E && owner[rn->in[1]] != d + 1;
      } else if ((ir_op_flags(rn->op) & IRF_ELEMENTWISE) && !position_dependent(rn->op)) {
        ok = !memcmp(rn->dims, vn->dims, sizeof(int64_t) * 4);
      } else {
        ok = 0;
      }
      if (ok) {
        owner[r] = d + 1;
        queue[tail++] = r;
      }
    }
  }
  /* the operands from outside: scalars, vectors, an expert's values */
  for (int q = 1; q < tail && ok; q++) {
    const IrNode *rn = &g->nodes[queue[q]];
    if (rn->op == IR_MATMUL) continue;
    for (int j = 0; j < rn->nin && ok; j++)
      if (owner[rn->in[j]] != d + 1) ok = broadcast_of(&g->nodes[rn->in[j]], rn) != BC_NONE;
  }
  if (!ok || !combines) {
    for (int q = 0; q < tail; q++) owner[queue[q]] = 0;
    return 0;
  }
  return 1;
}

typedef struct {
  IrGraph *g;
  int ids, ones; /* the chain's expert ids and [N, 1] ones (made when first needed) */
  int64_t N;
} Packed;

static int add(IrGraph *g, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr, DType dt, int rank,
               const int64_t *dims, const IrNode *like) {
  int id = ir_add(g, op, in, nin, attr, nattr, fattr, dt, rank, dims, NULL);
  if (id >= 0) g->nodes[id].span = like->span;
  return id;
}

/* Operand o (new id v) of a chain's element-wise op, viewed to broadcast
 * against the rewritten chain's values (of rank `rank`) as it did against
 * the slots: a scalar of rank 0 when o's rank exceeds it, a vector as [Y], a
 * per-expert value as [E, 1, Y]; -1 for any other. */
static int operand_view(IrGraph *g, const IrNode *o, int v, const IrNode *like, int rank) {
  switch (broadcast_of(o, like)) {
  case BC_SCALAR: return o->rank <= rank ? v : add(g, IR_RESHAPE, &v, 1, NULL, 0, 0, o->dtype, 0, NULL, like);
  case BC_VECTOR: {
    int64_t last = o->dims[o->rank - 1];
    return o->rank <= 1 ? v : add(g, IR_RESHAPE, &v, 1, NULL, 0, 0, o->dtype, 1, &last, like);
  }
  case BC_EXPERT: {
    int64_t dims[3] = {o->dims[o->rank - 3], 1, o->dims[o->rank - 1]};
    return o->rank == 3 ? v : add(g, IR_RESHAPE, &v, 1, NULL, 0, 0, o->dtype, 3, dims, like);
  }
  default: return -1;
  }
}

/* Operand o of a packed element-wise op, made to broadcast against [N, Y]
 * rows: a per-expert value as each row's expert's (ones [N, 1] times [E, 1,
 * Y'] grouped). */
static int packed_operand(Packed *P, const IrNode *o, int v, const IrNode *like) {
  IrGraph *g = P->g;
  int w = operand_view(g, o, v, like, 2);
  if (w < 0 || broadcast_of(o, like) != BC_EXPERT) return w;
  if (P->ones < 0) {
    int64_t od[2] = {P->N, 1};
    P->ones = add(g, IR_FILL, NULL, 0, NULL, 0, 1.0, o->dtype, 2, od, like);
  }
  int in[3] = {P->ones, w, P->ids};
  int64_t attr[1] = {0};
  return add(g, IR_GROUPED_MM, in, 3, attr, 1, 0, o->dtype, -1, NULL, like);
}

static int major_pays(const IrGraph *g, int d, const int *owner, int64_t ep);
static int major_node(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o, void *ctx);

/* How a rewrite makes node i of a marked chain (o: its dispatch) from the
 * rebuilt graph's nodes so far (map): the new id, or -1. */
typedef int (*ChainNode)(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o, void *ctx);

/* Rebuilds g: every node of a marked chain (and its combine) through `node`,
 * the rest copied; on a refusal the graph as it was. */
static int rebuild(IrGraph *g, const int *owner, ChainNode node, void *ctx) {
  int n = g->nnodes;
  IrNode *old = xalloc_malloc(sizeof *old * (size_t)(n + 1));
  int *map = xalloc_malloc(sizeof *map * (size_t)(n + 1));
  memcpy(old, g->nodes, sizeof *old * (size_t)n);
  g->nnodes = 0;
  int ok = 1;
  for (int i = 0; i < n && ok; i++) {
    const IrNode *x = &old[i];
    int o = owner[i] - 1;
    if (o < 0 && x->op == IR_MOE_COMBINE && owner[x->in[0]]) o = owner[x->in[0]] - 1;
    map[i] = o < 0 ? ir_add_copy(g, x, map) : node(g, old, map, owner, i, o, ctx);
    ok = map[i] >= 0;
    if (ok && o >= 0) g->nodes[map[i]].name = x->name;
  }
  for (int k = 0; k < g->noutputs && ok; k++) g->outputs[k] = map[g->outputs[k]];
  if (!ok) { /* a shape rule refused: put the graph back as it was */
    memcpy(g->nodes, old, sizeof *old * (size_t)n);
    g->nnodes = n;
  }
  free(old), free(map);
  return ok;
}

/* An element-wise node of a chain, its outside operands through `operand`. */
static int chain_elementwise(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o,
                             int (*operand)(void *ctx, const IrNode *o, int v, const IrNode *like), void *ctx) {
  const IrNode *x = &old[i];
  int *ein = xalloc_malloc(sizeof *ein * (size_t)(x->nin + 1)), ok = 1;
  for (int k = 0; k < x->nin && ok; k++) {
    int v = x->in[k];
    ein[k] = owner[v] == o + 1 ? map[v] : operand(ctx, &old[v], map[v], x);
    ok = ein[k] >= 0;
  }
  int r = ok ? add(g, x->op, ein, x->nin, x->attr, IR_NATTR, x->fattr, x->dtype, -1, NULL, x) : -1;
  free(ein);
  return r;
}

static int packed_operand_of(void *ctx, const IrNode *o, int v, const IrNode *like) { return packed_operand(ctx, o, v, like); }

/* The packed form (moe_pack_dropless); ctx: a Packed per dispatch. */
static int packed_node(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o, void *ctx) {
  const IrNode *x = &old[i];
  Packed *P = &((Packed *)ctx)[o];
  int in[4];
  if (i == o) { /* the dispatch: its rows, and their experts */
    int64_t E = x->attr[0], ia[1] = {E}, da[3] = {E, 0, x->attr[2]};
    P->g = g;
    P->ones = -1;
    P->N = ir_numel(&old[x->in[1]]);
    int idx = map[x->in[1]];
    P->ids = add(g, IR_MOE_EXPERT_IDS, &idx, 1, ia, 1, 0, old[x->in[1]].dtype, -1, NULL, x);
    for (int k = 0; k < 3; k++) in[k] = map[x->in[k]];
    return add(g, IR_MOE_DISPATCH, in, 3, da, 3, 0, x->dtype, -1, NULL, x);
  }
  if (x->op == IR_MOE_COMBINE) {
    int64_t ca[1] = {old[o].attr[0]};
    for (int k = 0; k < 3; k++) in[k] = map[x->in[k]];
    return add(g, IR_MOE_COMBINE, in, 3, ca, 1, 0, x->dtype, -1, NULL, x);
  }
  if (x->op == IR_MATMUL) { /* an expert GEMM */
    int64_t ga[1] = {x->attr[1]};
    in[0] = map[x->in[0]], in[1] = map[x->in[1]], in[2] = P->ids;
    return add(g, IR_GROUPED_MM, in, 3, ga, 1, 0, x->dtype, -1, NULL, x);
  }
  return chain_elementwise(g, old, map, owner, i, o, packed_operand_of, P); /* over the rows */
}

/* What mark_chain works with over a graph: its readers, the chains' owners
 * (0: none), a queue, the graph's outputs. */
typedef struct {
  IrReaders rd;
  int *owner, *queue;
  char *out;
} ChainScan;

static ChainScan chain_scan(const IrGraph *g) {
  int n = g->nnodes;
  ChainScan c = {ir_readers(g->nodes, n, g->arena), xalloc_calloc((size_t)(n + 1), sizeof(int)),
                 xalloc_malloc(sizeof(int) * (size_t)(n + 1)), xalloc_calloc((size_t)(n + 1), 1)};
  for (int k = 0; k < g->noutputs; k++) c.out[g->outputs[k]] = 1;
  return c;
}

static void chain_scan_free(ChainScan *c) { free(c->owner), free(c->queue), free(c->out); }

/* Marks every chain of g that fits (and pays, for the expert-major form)
 * and rewrites them; returns how many. */
static int rewrite_graph(IrGraph *g, int dropless, int64_t ep) {
  int n = g->nnodes, found = 0;
  ChainScan cs = chain_scan(g);
  for (int d = 0; d < n; d++) {
    if (!mark_chain(g, d, &cs.rd, cs.out, cs.owner, cs.queue, dropless)) continue;
    if (dropless || major_pays(g, d, cs.owner, ep)) found++;
    else
      for (int i = 0; i < n; i++) cs.owner[i] = cs.owner[i] == d + 1 ? 0 : cs.owner[i];
  }
  if (found) {
    Packed *chain = dropless ? xalloc_calloc((size_t)(n + 1), sizeof *chain) : NULL; /* by dispatch */
    if (!rebuild(g, cs.owner, dropless ? packed_node : major_node, chain)) found = 0;
    free(chain);
  }
  chain_scan_free(&cs);
  return found;
}

int moe_pack_dropless(IrModule *m) {
  int total = 0;
  for (int gi = 0; gi < m->ngraphs; gi++)
    if (!m->graphs[gi]->fb_split) total += rewrite_graph(m->graphs[gi], 1, 1); /* forward graphs only: autodiff comes after */
  return total;
}

/* The slot dispatches of m with room for every token (dropping = 0) or with
 * fewer slots than the sequence's tokens (dropping = 1). */
static int count_slot_dispatches(const IrModule *m, int dropping) {
  int n = 0;
  for (int gi = 0; gi < m->ngraphs; gi++) {
    const IrGraph *g = m->graphs[gi];
    for (int i = 0; i < g->nnodes; i++) {
      const IrNode *d = &g->nodes[i];
      if (d->op != IR_MOE_DISPATCH || d->attr[1] == 0) continue;
      int64_t T = g->nodes[d->in[0]].dims[1];
      n += dropping ? d->attr[1] < T : d->attr[1] == T;
    }
  }
  return n;
}

int moe_dropless_slots(const IrModule *m) { return count_slot_dispatches(m, 0); }

int moe_dropping(const IrModule *m) { return count_slot_dispatches(m, 1); }

/* ---- expert-major slots (moepack.h, moe_expert_major) ---- */

/* v viewed as in4 (unless it has that shape), its two leading axes swapped,
 * then viewed as out (unless the swap gave that shape): the regroupings of
 * the expert-major slots and of parallel folding's sequence chunks. */
static int swap_leading(IrGraph *g, int v, DType dt, const int64_t in4[4], int out_rank, const int64_t *out, const IrNode *like) {
  static const int64_t swap[4] = {1, 0, 2, 3};
  const IrNode *x = &g->nodes[v];
  if (x->rank != 4 || memcmp(x->dims, in4, sizeof(int64_t) * 4))
    v = add(g, IR_RESHAPE, &v, 1, NULL, 0, 0, dt, 4, in4, like);
  int64_t sw[4] = {in4[1], in4[0], in4[2], in4[3]};
  int t = v < 0 ? -1 : add(g, IR_TRANSPOSE, &v, 1, swap, 4, 0, dt, 4, sw, like);
  if (t < 0 || (out_rank == 4 && !memcmp(out, sw, sizeof sw))) return t;
  return add(g, IR_RESHAPE, &t, 1, NULL, 0, 0, dt, out_rank, out, like);
}

/* [B, E, cap, Y] <-> [E, B cap, Y]: a transpose of the two leading axes and a
 * view (to_major), or the view back and the transpose (from). */
static int to_major(IrGraph *g, int v, const IrNode *slots, const IrNode *like) {
  int64_t rd[3] = {slots->dims[1], slots->dims[0] * slots->dims[2], slots->dims[3]};
  return swap_leading(g, v, slots->dtype, slots->dims, 3, rd, like);
}

static int from_major(IrGraph *g, int v, const IrNode *slots, const IrNode *like) {
  int64_t md[4] = {slots->dims[1], slots->dims[0], slots->dims[2], slots->dims[3]};
  return swap_leading(g, v, slots->dtype, md, 4, slots->dims, like);
}

/* expert-major: [E, B cap, Y] values, rank 3 */
static int major_operand_of(void *ctx, const IrNode *o, int v, const IrNode *like) { return operand_view(ctx, o, v, like, 3); }

/* The expert-major form (moe_expert_major). */
static int major_node(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o, void *ctx) {
  (void)ctx;
  const IrNode *x = &old[i];
  if (x->op == IR_MOE_COMBINE) { /* the combine reads the slots back in their [B, E, cap, Y] order */
    int in[3] = {from_major(g, map[x->in[0]], &old[x->in[0]], x), map[x->in[1]], map[x->in[2]]};
    return in[0] < 0 ? -1 : add(g, IR_MOE_COMBINE, in, 3, x->attr, IR_NATTR, x->fattr, x->dtype, -1, NULL, x);
  }
  if (i == o) { /* the dispatch, then its slots expert-major */
    int d = ir_add_copy(g, x, map);
    return d < 0 ? -1 : to_major(g, d, x, x);
  }
  if (x->op == IR_MATMUL) { /* [E, B cap, X] x [E, X, Y]: one GEMM an expert over all its slots */
    int in[2] = {map[x->in[0]], map[x->in[1]]};
    return add(g, IR_MATMUL, in, 2, x->attr, IR_NATTR, x->fattr, x->dtype, -1, NULL, x);
  }
  return chain_elementwise(g, old, map, owner, i, o, major_operand_of, g);
}

/* Whether dispatch d's marked chain gains by going expert-major: the bytes
 * its weight gradients no longer write a sequence and sum (each [E, X, Y]
 * weight's (ep B - 1) E/ep X Y floats, written and read) against the four
 * transposes' (the slots in and out, forward and backward, each read and
 * written). Long dropless slots over narrow experts (GPT-OSS's 4096 a
 * sequence, its experts 2880 wide) lose; DeepSeek-V3's 128 over 7168 x 2048
 * gain 12x. */
static int major_pays(const IrGraph *g, int d, const int *owner, int64_t ep) {
  const IrNode *dn = &g->nodes[d];
  double B = (double)dn->dims[0], cap = (double)dn->dims[2], C = (double)dn->dims[3], Cout = 0, wxy = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *x = &g->nodes[i];
    if (owner[i] == d + 1 && x->op == IR_MATMUL) {
      const IrNode *w = &g->nodes[x->in[1]];
      wxy += (double)w->dims[1] * (double)w->dims[2];
    }
    if (x->op == IR_MOE_COMBINE && owner[x->in[0]] == d + 1) Cout = (double)g->nodes[x->in[0]].dims[3];
  }
  return wxy * (1.0 - 1.0 / ((double)ep * B)) > 2.0 * cap * (C + Cout);
}

int moe_expert_major(IrModule *m, int64_t ep) {
  int total = 0;
  for (int gi = 0; gi < m->ngraphs; gi++)
    if (!m->graphs[gi]->fb_split) total += rewrite_graph(m->graphs[gi], 0, ep);
  return total;
}

/* ---- MoE parallel folding: each sequence routed in tp chunks (moepack.h) ---- */

typedef struct {
  int64_t tp;
  int *chunked; /* per old node: its [tp B, T / tp, Z] view in the new graph, or -1 */
} Fold;

/* v [B, T, Z] as [tp B, T / tp, Z]: chunk j of sequence b is sequence j B + b,
 * so that the tensor group's split of the sequence axis is a split of the
 * leading axis (sequence parallelism's chunk j on tensor rank j). */
static int chunk_seqs(IrGraph *g, int v, const IrNode *val, int64_t tp, const IrNode *like) {
  int64_t B = val->dims[0], T = val->dims[1], Z = val->dims[2];
  int64_t d4[4] = {B, tp, T / tp, Z}, d3[3] = {tp * B, T / tp, Z};
  return swap_leading(g, v, val->dtype, d4, 3, d3, like);
}

/* The inverse: v [tp B, T / tp, Z] back to [B, T, Z] (like's dims). */
static int unchunk_seqs(IrGraph *g, int v, const IrNode *like, int64_t tp) {
  int64_t t4[4] = {tp, like->dims[0], like->dims[1] / tp, like->dims[2]};
  return swap_leading(g, v, like->dtype, t4, 3, like->dims, like);
}

static int fold_operand(Fold *F, IrGraph *g, const IrNode *old, const int *map, int v, const IrNode *like) {
  if (F->chunked[v] < 0) F->chunked[v] = chunk_seqs(g, map[v], &old[v], F->tp, like);
  return F->chunked[v];
}

/* seq-major: [tp B, E, cap / tp, Y] values, rank 4 */
static int fold_operand_of(void *ctx, const IrNode *o, int v, const IrNode *like) { return operand_view(ctx, o, v, like, 4); }

static int fold_node(IrGraph *g, const IrNode *old, const int *map, const int *owner, int i, int o, void *ctx) {
  Fold *F = ctx;
  const IrNode *x = &old[i];
  int in[3];
  if (i == o || x->op == IR_MOE_COMBINE) {
    for (int k = 0; k < 3; k++) {
      int v = x->in[k];
      in[k] = k == 0 && x->op == IR_MOE_COMBINE ? map[v] : fold_operand(F, g, old, map, v, x);
      if (in[k] < 0) return -1;
    }
    if (i == o) { /* the dispatch over the chunks: room for cap / tp of each */
      int64_t attr[3] = {x->attr[0], (x->attr[1] + F->tp - 1) / F->tp, (x->attr[2] + F->tp - 1) / F->tp};
      return add(g, IR_MOE_DISPATCH, in, 3, attr, 3, x->fattr, x->dtype, -1, NULL, x);
    }
    int c = add(g, IR_MOE_COMBINE, in, 3, x->attr, IR_NATTR, x->fattr, x->dtype, -1, NULL, x);
    return c < 0 ? -1 : unchunk_seqs(g, c, x, F->tp);
  }
  if (x->op == IR_MATMUL) {
    int mm[2] = {map[x->in[0]], map[x->in[1]]};
    return add(g, IR_MATMUL, mm, 2, x->attr, IR_NATTR, x->fattr, x->dtype, -1, NULL, x);
  }
  return chain_elementwise(g, old, map, owner, i, o, fold_operand_of, g);
}

int moe_fold_sequences(IrModule *m, int64_t tp, int priced, const char **why) {
  int total = 0;
  if (tp <= 1) return 0;
  for (int gi = 0; gi < m->ngraphs; gi++) {
    IrGraph *g = m->graphs[gi];
    if (g->fb_split) continue; /* forward graphs only: autodiff comes after */
    int n = g->nnodes, found = 0;
    ChainScan cs = chain_scan(g);
    const char *bad = NULL;
    for (int d = 0; d < n && !bad; d++) {
      const IrNode *dn = &g->nodes[d];
      if (dn->op != IR_MOE_DISPATCH) continue;
      const IrNode *x = &g->nodes[dn->in[0]];
      if (dn->attr[1] == 0) bad = "its experts are packed over their rows (the expert group exchanges slots)";
      else if (!priced && dn->attr[1] != x->dims[1])
        bad = "it drops tokens (drop = true): a capacity is a sequence's, and the tensor group splits the sequences";
      else if (x->rank != 3 || x->dims[1] % tp)
        bad = "its sequence does not split into tensor chunks";
      else if (!mark_chain(g, d, &cs.rd, cs.out, cs.owner, cs.queue, 0))
        bad = "its experts are not a chain of expert GEMMs and element-wise ops up to the combine";
      else
        found++;
    }
    if (!bad && found) {
      Fold F = {tp, xalloc_malloc(sizeof(int) * (size_t)(n + 1))};
      for (int i = 0; i <= n; i++) F.chunked[i] = -1;
      if (!rebuild(g, cs.owner, fold_node, &F)) bad = "a shape of the chunked layer does not check";
      free(F.chunked);
    }
    chain_scan_free(&cs);
    if (bad) {
      if (why) *why = bad;
      return -1;
    }
    total += found;
  }
  return total;
}

int moe_holds_every_token(const IrGraph *g, const IrNode *d) {
  if (d->op != IR_MOE_DISPATCH || d->attr[1] <= 0 || !d->attr[3]) return 0;
  const IrNode *idx = &g->nodes[d->in[1]];
  return idx->op == IR_TOPK && idx->attr[0] <= d->attr[0];
}

int moe_fold_check_cp(const IrModule *m, const char **why) {
  int n = 0;
  for (int gi = 0; gi < m->ngraphs; gi++) {
    const IrGraph *g = m->graphs[gi];
    for (int i = 0; i < g->nnodes; i++) {
      const IrNode *d = &g->nodes[i];
      if (d->op != IR_MOE_DISPATCH) continue;
      const char *bad = d->attr[1] == 0 ? "its experts are packed over their rows (the expert group exchanges slots)"
                        : !d->attr[3]   ? "it drops tokens (drop = true): a capacity is a sequence's, and the context and "
                                          "tensor groups split the sequences"
                        : !moe_holds_every_token(g, d) ? "its choices are not a top-k (a token could take an expert twice)"
                                                       : NULL;
      if (bad) {
        if (why) *why = bad;
        return -1;
      }
      n++;
    }
  }
  return n;
}

int moe_as_compiled(IrModule *m, int64_t ep, int64_t fold_tp, int64_t cp, int priced, const char **why) {
  if (ep <= 1) return moe_pack_dropless(m), 0;
  if (fold_tp > 1 && (cp > 1 ? moe_fold_check_cp(m, why) : moe_fold_sequences(m, fold_tp, priced, why)) < 0) return -1;
  moe_expert_major(m, ep);
  return 0;
}
