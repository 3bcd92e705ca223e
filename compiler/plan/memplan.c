/* memplan.c - the static memory plan of a per-rank program (see memplan.h).
 *
 * Each graph is planned after the graphs it calls (a workspace is as large
 * as its callee's arena): liveness by node order, buffers with views and
 * in-place reuse folded in, workspaces and stashes, then offsets (greedy by
 * size, best fit) and the peak (a sweep over the steps). The fused plan does
 * the same over the kernels of fuse.h. */
#include "memplan.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"

typedef struct {
  Arena *a;
  const IrModule *m;
  MemPlan *p;
  char *state, *fstate; /* per graph: 0 not planned, 1 being planned, 2 planned */
  const char *err;
} Planner;

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

static int is_external_leaf(IrOp op) { return op == IR_PARAM || op == IR_INPUT || op == IR_ARG; }

/* v shares the buffer of value `of` (a reshape): that buffer lives as long
 * as the view does. */
static void make_view(MemGraph *mg, MemValue *v, int of) {
  const MemValue *x = &mg->values[of];
  v->of = of;
  v->buf = x->buf;
  v->kind = x->buf < 0 ? MEM_EXTERNAL : MEM_VIEW;
  if (x->buf >= 0) {
    MemBuf *b = &mg->bufs[x->buf];
    if (v->last > b->last) b->last = v->last;
    mg->nviews++;
  }
}

int mem_inplace_ok(const IrGraph *g, int node, int k) {
  if (node < 0 || node >= g->nnodes) return 0;
  const IrNode *n = &g->nodes[node];
  if (!(ir_op_flags(n->op) & IRF_ELEMENTWISE) || k < 0 || k >= n->nin) return 0;
  const IrNode *x = &g->nodes[n->in[k]];
  /* With numpy broadcasting aligned at the trailing axis, an input with the
   * output's element count has the output's shape up to leading ones, so it
   * is read at exactly the index that is written. */
  return ir_numel(x) == ir_numel(n) && sem_dtype_bytes(x->dtype) == sem_dtype_bytes(n->dtype);
}

int64_t mem_stash_per_layer(const IrModule *m, int graph, int node) {
  const IrGraph *g = m->graphs[graph];
  const IrNode *n = &g->nodes[node];
  int callee = (int)n->attr[0];
  if (n->op != IR_CALL || callee < 0 || callee >= m->ngraphs) return 0;
  const IrGraph *cg = m->graphs[callee];
  int64_t b = 0;
  for (int k = 0; k < n->nin; k++) b += ir_bytes(&g->nodes[n->in[k]]);
  for (int k = 1; k < cg->noutputs; k++) b += ir_bytes(&cg->nodes[cg->outputs[k]]);
  return b;
}

/* The fused plan's in-place rule, the part that depends on the kernel only:
 * kernel k is a loop kernel, x one of its inputs and y one of its outputs,
 * both with as many elements as its iteration space and the same element
 * size, and every node of the kernel that reads x is elementwise over the
 * whole space (so x is read at the index y is written, not through a
 * folded index map such as a transpose); or k is a cross-entropy with its
 * backward (fuse_ce_pair), x the logits it reads and y their gradient, of
 * one element size (the kernel reads a row whole before it writes it). */
int mem_fused_inplace_ok(const FuseGraph *fg, const IrGraph *g, int k, int x, int y) {
  const FuseKernel *K = &fg->kernels[k];
  if (K->kind == FUSE_SPECIAL && fuse_ce_pair(fg, k)) { /* y, the logits' gradient, over x, the logits */
    const IrNode *X = &g->nodes[x], *Y = &g->nodes[y];
    int is_in = 0;
    for (int j = 0; j < K->ninputs; j++) is_in |= K->inputs[j] == x;
    return is_in && Y->op == IR_CROSS_ENTROPY_BWD && Y->in[0] == x && ir_numel(X) == ir_numel(Y) &&
           sem_dtype_bytes(X->dtype) == sem_dtype_bytes(Y->dtype);
  }
  if (K->kind != FUSE_LOOP) return 0;
  int64_t space = 1;
  for (int i = 0; i < K->rank; i++) space *= K->dims[i];
  const IrNode *X = &g->nodes[x], *Y = &g->nodes[y];
  if (ir_numel(X) != space || ir_numel(Y) != space || sem_dtype_bytes(X->dtype) != sem_dtype_bytes(Y->dtype))
    return 0;
  int is_in = 0, is_out = 0;
  for (int j = 0; j < K->ninputs; j++) is_in |= K->inputs[j] == x;
  for (int j = 0; j < K->noutputs; j++) is_out |= K->outputs[j] == y;
  if (!is_in || !is_out) return 0;
  for (int j = 0; j < K->nnodes; j++) {
    const IrNode *u = &g->nodes[K->nodes[j]];
    for (int q = 0; q < u->nin; q++)
      if (u->in[q] == x && (!(ir_op_flags(u->op) & IRF_ELEMENTWISE) || ir_numel(u) != space)) return 0;
  }
  return 1;
}

/* ---- offsets and peak, shared by both plans ---- */

/* Sort keys carry what they compare, so the comparators need no global
 * (plans may be made on several threads, e.g. by a layout search). */
typedef struct {
  int64_t key; /* size (descending) or offset (ascending) */
  int def, idx;
} SortKey;

static int by_size_desc(const void *pa, const void *pb) {
  const SortKey *a = pa, *b = pb;
  if (a->key != b->key) return a->key > b->key ? -1 : 1;
  if (a->def != b->def) return a->def < b->def ? -1 : 1;
  return a->idx - b->idx;
}

static int by_offset(const void *pa, const void *pb) {
  const SortKey *a = pa, *b = pb;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return a->idx - b->idx;
}

static int overlap(const MemBuf *a, const MemBuf *b) { return a->def <= b->last && b->def <= a->last; }

/* Greedy by size, best fit: see memplan.h. O(n^2 log n) in buffers, which
 * are per graph (a repeated block is one graph however many layers run). */
static void assign_offsets(MemGraph *mg) {
  int n = mg->nbufs;
  SortKey *order = calloc((size_t)n + 1, sizeof(SortKey)), *near = calloc((size_t)n + 1, sizeof(SortKey));
  int *placed = calloc((size_t)n + 1, sizeof(int));
  if (!order || !placed || !near) abort();
  for (int i = 0; i < n; i++) order[i] = (SortKey){mg->bufs[i].size, mg->bufs[i].def, i};
  qsort(order, (size_t)n, sizeof(SortKey), by_size_desc);
  int nplaced = 0;
  mg->arena = 0;
  for (int oi = 0; oi < n; oi++) {
    MemBuf *b = &mg->bufs[order[oi].idx];
    int nn = 0;
    for (int k = 0; k < nplaced; k++) {
      const MemBuf *o = &mg->bufs[placed[k]];
      if (overlap(o, b) && o->size > 0) near[nn++] = (SortKey){o->offset, 0, placed[k]};
    }
    qsort(near, (size_t)nn, sizeof(SortKey), by_offset);
    int64_t end = 0, best = -1, bestgap = INT64_MAX;
    for (int k = 0; k < nn; k++) {
      const MemBuf *o = &mg->bufs[near[k].idx];
      if (o->offset > end) {
        int64_t gap = o->offset - end;
        if (gap >= b->size && gap < bestgap) {
          best = end;
          bestgap = gap;
        }
      }
      if (o->offset + o->size > end) end = o->offset + o->size;
    }
    b->offset = best >= 0 ? best : end;
    if (b->offset + b->size > mg->arena) mg->arena = b->offset + b->size;
    placed[nplaced++] = order[oi].idx;
  }
  free(order);
  free(placed);
  free(near);
}

/* The peak of live bytes over steps 0..nsteps (the return included). */
static void sweep_peak(MemGraph *mg) {
  int64_t *delta = calloc((size_t)mg->nsteps + 2, sizeof(int64_t));
  if (!delta) abort();
  for (int i = 0; i < mg->nbufs; i++) {
    delta[mg->bufs[i].def] += mg->bufs[i].bytes;
    delta[mg->bufs[i].last + 1] -= mg->bufs[i].bytes;
  }
  int64_t live = 0;
  mg->peak = 0;
  mg->peak_step = 0;
  for (int s = 0; s <= mg->nsteps; s++) {
    live += delta[s];
    if (live > mg->peak) {
      mg->peak = live;
      mg->peak_step = s;
    }
  }
  free(delta);
}

static int add_buf(MemGraph *mg, MemBufKind kind, int node, int def, int last, int64_t bytes, int64_t size) {
  MemBuf *b = &mg->bufs[mg->nbufs];
  memset(b, 0, sizeof *b);
  b->kind = kind;
  b->node = node;
  b->until = -1;
  b->def = def;
  b->last = last;
  b->bytes = bytes;
  b->size = size;
  return mg->nbufs++;
}

static void plan_graph(Planner *P, int gi, int fused);

/* Plans callee `c` first; 0 on success. */
static int need_callee(Planner *P, int c, int fused) {
  if (c < 0 || c >= P->m->ngraphs) {
    P->err = "a call names a graph that does not exist";
    return -1;
  }
  char *st = fused ? P->fstate : P->state;
  if (st[c] == 1) {
    P->err = "graphs call each other in a cycle";
    return -1;
  }
  if (st[c] == 0) plan_graph(P, c, fused);
  return P->err ? -1 : 0;
}

/* The workspace and, for a SAVE call, the stash of CALL node i at step s;
 * undo_step: the step of the BACKWARD call that undoes it, or -1. */
static void add_call_bufs(Planner *P, MemGraph *mg, int gi, int i, int s, int undo_node, int undo_step, int fused) {
  const IrNode *n = &P->m->graphs[gi]->nodes[i];
  int callee = (int)n->attr[0];
  const MemGraph *cg = fused ? &P->p->fused[callee] : &P->p->graphs[callee];
  int64_t align = P->p->opts.align;
  int runs = n->attr[1] > 0;
  add_buf(mg, MEMB_WORKSPACE, i, s, s, runs ? cg->peak : 0, runs ? cg->arena : 0);
  if (n->attr[2] == IR_CALL_SAVE) {
    int64_t per = mem_stash_per_layer(P->m, gi, i), count = n->attr[1] > 0 ? n->attr[1] : 0;
    int b = add_buf(mg, MEMB_STASH, i, s, undo_step >= 0 ? undo_step : mg->nsteps, per * count,
                    align_up(per * count, align));
    mg->bufs[b].until = undo_node;
    mg->bufs[b].count = count;
    mg->bufs[b].per_layer = per;
    mg->stash += per * count;
  }
}

/* Per SAVE call: the first BACKWARD call that undoes it (the executor's
 * stash lookup), or -1. */
static int *undo_calls(Arena *a, const IrGraph *g) {
  int *undo = arena_alloc(a, sizeof(int) * (size_t)(g->nnodes + 1));
  for (int i = 0; i < g->nnodes; i++) undo[i] = -1;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op == IR_CALL && n->attr[2] == IR_CALL_BACKWARD && n->nin == 2 && undo[n->in[1]] < 0) undo[n->in[1]] = i;
  }
  return undo;
}

static void plan_unfused(Planner *P, int gi) {
  const IrGraph *g = P->m->graphs[gi];
  MemGraph *mg = &P->p->graphs[gi];
  int n = g->nnodes, ncalls = 0;
  for (int i = 0; i < n; i++) {
    if (g->nodes[i].op != IR_CALL) continue;
    ncalls++;
    if (need_callee(P, (int)g->nodes[i].attr[0], 0)) return;
  }
  mg->graph = gi;
  mg->nsteps = n;
  mg->values = arena_alloc(P->a, sizeof(MemValue) * (size_t)(n + 1));
  mg->bufs = arena_alloc(P->a, sizeof(MemBuf) * (size_t)(n + 2 * ncalls + 1));
  /* last use, exactly as the executor computes it (interp.c run_graph) */
  int *last = arena_alloc(P->a, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    last[i] = i;
    for (int k = 0; k < g->nodes[i].nin; k++) last[g->nodes[i].in[k]] = i;
  }
  for (int k = 0; k < g->noutputs; k++) last[g->outputs[k]] = n;
  int *undo = undo_calls(P->a, g);
  int64_t align = P->p->opts.align;
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &g->nodes[i];
    MemValue *v = &mg->values[i];
    v->of = -1;
    v->buf = -1;
    v->def = i;
    v->last = last[i];
    v->bytes = ir_bytes(nd);
    if (is_external_leaf(nd->op)) {
      v->kind = MEM_EXTERNAL;
      continue;
    }
    if (nd->op == IR_RESHAPE) {
      make_view(mg, v, nd->in[0]);
      continue;
    }
    int reuse = -1;
    for (int k = 0; k < nd->nin && reuse < 0 && (ir_op_flags(nd->op) & IRF_ELEMENTWISE); k++) {
      int x = nd->in[k], b = mg->values[x].buf;
      if (b >= 0 && mg->bufs[b].kind == MEMB_VALUE && last[x] == i && mg->bufs[b].last == i &&
          mem_inplace_ok(g, i, k))
        reuse = k;
    }
    if (reuse >= 0) {
      v->kind = MEM_INPLACE;
      v->of = nd->in[reuse];
      v->buf = mg->values[v->of].buf;
      MemBuf *b = &mg->bufs[v->buf];
      if (v->last > b->last) b->last = v->last;
      mg->ninplace++;
    } else {
      v->kind = MEM_OWN;
      v->buf = add_buf(mg, MEMB_VALUE, i, i, v->last, v->bytes, align_up(v->bytes, align));
    }
    if (nd->op == IR_CALL) add_call_bufs(P, mg, gi, i, i, undo[i], undo[i], 0);
  }
}

/* The fused plan: steps are the kernels of fusion->graphs[gi], in order. */
static void plan_fused(Planner *P, int gi) {
  const IrGraph *g = P->m->graphs[gi];
  const FuseGraph *fg = &P->p->opts.fusion->graphs[gi];
  MemGraph *mg = &P->p->fused[gi];
  int n = g->nnodes, nk = fg->nkernels, ncalls = 0;
  for (int i = 0; i < n; i++) {
    if (g->nodes[i].op != IR_CALL) continue;
    ncalls++;
    if (need_callee(P, (int)g->nodes[i].attr[0], 1)) return;
  }
  mg->graph = gi;
  mg->fused = 1;
  mg->nsteps = nk;
  mg->values = arena_alloc(P->a, sizeof(MemValue) * (size_t)(n + 1));
  mg->bufs = arena_alloc(P->a, sizeof(MemBuf) * (size_t)(n + 2 * ncalls + 1));
  const int *kof = fg->kernel_of;
  int *last = arena_alloc(P->a, sizeof(int) * (size_t)(n + 1));
  char *is_out = arena_alloc(P->a, (size_t)n + 1), *immediate = arena_alloc(P->a, (size_t)n + 1);
  for (int i = 0; i < n; i++) {
    last[i] = kof[i];
    immediate[i] = g->nodes[i].op == IR_CONST;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) {
      int x = g->nodes[i].in[k];
      if (kof[x] == kof[i]) continue;
      if (kof[i] > last[x]) last[x] = kof[i];
      FuseKind ck = fg->kernels[kof[i]].kind;
      if (ck != FUSE_LOOP && ck != FUSE_ROW && ck != FUSE_GEMM) immediate[x] = 0;
    }
  for (int k = 0; k < g->noutputs; k++) {
    last[g->outputs[k]] = nk;
    immediate[g->outputs[k]] = 0;
  }
  for (int k = 0; k < nk; k++)
    for (int j = 0; j < fg->kernels[k].noutputs; j++) is_out[fg->kernels[k].outputs[j]] = 1;
  int *undo = undo_calls(P->a, g);
  int64_t align = P->p->opts.align;
  int *into = arena_alloc(P->a, sizeof(int) * (size_t)(n + 1)); /* per output: the input it overwrites */
  for (int i = 0; i < n; i++) into[i] = -1;
  for (int k = 0; k < nk; k++) {
    const FuseKernel *K = &fg->kernels[k];
    /* in-place pairs of a loop kernel: each output (ascending) takes the
     * first input (ascending) not yet taken whose buffer dies here */
    for (int o = 0; K->kind == FUSE_LOOP && o < K->noutputs; o++) {
      int y = K->outputs[o];
      for (int j = 0; j < K->ninputs && into[y] < 0; j++) {
        int x = K->inputs[j], b = mg->values[x].buf, taken = 0;
        for (int q = 0; q < o; q++) taken |= into[K->outputs[q]] == x;
        if (!taken && b >= 0 && mg->bufs[b].kind == MEMB_VALUE && last[x] == k && mg->bufs[b].last == k &&
            mem_fused_inplace_ok(fg, g, k, x, y))
          into[y] = x;
      }
    }
    /* a cross-entropy with its backward (fuse.c's ce_pair): the logits'
     * gradient in the logits' place, where they die here */
    if (K->kind == FUSE_SPECIAL && fuse_ce_pair(fg, k))
      for (int j = 0; j < K->nnodes; j++) {
        const IrNode *bw = &g->nodes[K->nodes[j]];
        if (bw->op != IR_CROSS_ENTROPY_BWD) continue;
        int x = bw->in[0], y = K->nodes[j], b = mg->values[x].buf;
        if (b >= 0 && mg->bufs[b].kind == MEMB_VALUE && last[x] == k && mg->bufs[b].last == k &&
            mem_fused_inplace_ok(fg, g, k, x, y))
          into[y] = x;
      }
    for (int j = 0; j < K->nnodes; j++) {
      int i = K->nodes[j];
      const IrNode *nd = &g->nodes[i];
      MemValue *v = &mg->values[i];
      v->of = -1;
      v->buf = -1;
      v->def = k;
      v->last = last[i];
      v->bytes = ir_bytes(nd);
      /* a kernel that nobody reads still writes its result */
      int dead = K->noutputs == 0 && j == K->nnodes - 1 && K->kind != FUSE_LEAF && K->kind != FUSE_VIEW;
      if (is_external_leaf(nd->op) || (P->p->opts.grad_into_slots && fuse_grad_acc_output(fg, P->m, k) == i)) {
        v->kind = MEM_EXTERNAL; /* a leaf, or a gradient its kernel adds into the parameter's */
      } else if (immediate[i]) {
        v->kind = MEM_INTERNAL;
      } else if (K->kind == FUSE_VIEW && nd->op == IR_RESHAPE && mg->values[nd->in[0]].kind != MEM_INTERNAL) {
        make_view(mg, v, nd->in[0]);
      } else if (into[i] >= 0) {
        v->kind = MEM_INPLACE;
        v->of = into[i];
        v->buf = mg->values[v->of].buf;
        MemBuf *b = &mg->bufs[v->buf];
        if (v->last > b->last) b->last = v->last;
        mg->ninplace++;
      } else if (is_out[i] || dead) {
        v->kind = MEM_OWN;
        v->buf = add_buf(mg, MEMB_VALUE, i, k, v->last, v->bytes, align_up(v->bytes, align));
      } else {
        v->kind = MEM_INTERNAL;
      }
      if (nd->op == IR_CALL) add_call_bufs(P, mg, gi, i, k, undo[i], undo[i] >= 0 ? kof[undo[i]] : -1, 1);
    }
  }
}

static void plan_graph(Planner *P, int gi, int fused) {
  char *st = fused ? P->fstate : P->state;
  st[gi] = 1;
  if (fused) plan_fused(P, gi);
  else plan_unfused(P, gi);
  if (P->err) return;
  MemGraph *mg = fused ? &P->p->fused[gi] : &P->p->graphs[gi];
  assign_offsets(mg);
  sweep_peak(mg);
  st[gi] = 2;
}

/* ---- the rank's regions ---- */

/* Marks the graphs run from g and, per parameter, the layers whose copies
 * they read (lo..hi; a parameter of count 1 has the one copy). */
static void reach(const IrModule *m, int g, int64_t lo, int64_t hi, char *seen, int64_t *plo, int64_t *phi,
                  char *used_input, int depth) {
  if (g < 0 || g >= m->ngraphs || depth > m->ngraphs) return;
  seen[g] = 1;
  const IrGraph *G = m->graphs[g];
  for (int i = 0; i < G->nnodes; i++) {
    const IrNode *n = &G->nodes[i];
    if (n->op == IR_PARAM && n->attr[0] >= 0 && n->attr[0] < m->nparams) {
      int p = (int)n->attr[0];
      if (lo < plo[p]) plo[p] = lo;
      if (hi > phi[p]) phi[p] = hi;
    } else if (n->op == IR_INPUT && n->attr[0] >= 0 && n->attr[0] < m->ninputs) {
      used_input[n->attr[0]] = 1;
    } else if (n->op == IR_CALL && n->attr[1] > 0) {
      reach(m, (int)n->attr[0], n->attr[3], n->attr[3] + n->attr[1] - 1, seen, plo, phi, used_input, depth + 1);
    }
  }
}

static int64_t ceil_bytes(double b) {
  int64_t v = (int64_t)b;
  return (double)v < b ? v + 1 : v;
}

static void rank_totals(Arena *a, MemPlan *p) {
  const IrModule *m = p->m;
  p->reached = arena_alloc(a, (size_t)m->ngraphs + 1);
  int64_t *plo = arena_alloc(a, sizeof(int64_t) * (size_t)(m->nparams + 1));
  int64_t *phi = arena_alloc(a, sizeof(int64_t) * (size_t)(m->nparams + 1));
  char *used_input = arena_alloc(a, (size_t)m->ninputs + 1);
  for (int i = 0; i < m->nparams; i++) {
    plo[i] = INT64_MAX;
    phi[i] = -1;
  }
  reach(m, p->opts.entry, 0, 0, p->reached, plo, phi, used_input, 0);
  p->param_elems = 0;
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *q = &m->params[i];
    if (phi[i] < 0) continue;
    p->param_elems += ir_param_numel(q) * (q->count > 1 ? phi[i] - plo[i] + 1 : 1);
  }
  CostModelStates s = cost_model_states_m(p->param_elems, p->opts.zero, (int)p->opts.dp, p->opts.precision,
                                          p->opts.optimizer, p->opts.sgd_momentum, p->opts.moments_bf16 ? 2 : 4);
  p->params = ceil_bytes(s.params);
  p->grads = ceil_bytes(s.grads);
  p->optimizer = ceil_bytes(s.optimizer);
  p->inputs = 0;
  for (int i = 0; i < m->ninputs; i++) {
    if (!used_input[i]) continue;
    int64_t numel = 1;
    for (int k = 0; k < m->inputs[i].rank; k++) numel *= m->inputs[i].dims[k];
    p->inputs += numel * sem_dtype_bytes(m->inputs[i].dtype);
  }
  const MemGraph *e = &p->graphs[p->opts.entry];
  p->stash = e->stash;
  p->arena = e->arena;
  p->peak = e->peak;
  int64_t states = p->params + p->grads + p->optimizer + p->inputs;
  p->total = states + p->arena;
  p->total_peak = states + p->peak;
  if (p->fused) {
    p->fused_arena = p->fused[p->opts.entry].arena;
    p->fused_peak = p->fused[p->opts.entry].peak;
  }
}

MemPlan *mem_plan_module(Arena *arena, const IrModule *m, const MemOptions *opts) {
  MemPlan *p = arena_alloc(arena, sizeof *p);
  p->m = m;
  if (opts) p->opts = *opts;
  if (p->opts.align <= 0) p->opts.align = MEM_ALIGN;
  if (p->opts.dp < 1) p->opts.dp = 1;
  if (p->opts.entry < 0 || p->opts.entry >= m->ngraphs) return NULL;
  if (p->opts.fusion && (p->opts.fusion->module != m || p->opts.fusion->ngraphs != m->ngraphs)) return NULL;
  Planner P = {arena, m, p, arena_alloc(arena, (size_t)m->ngraphs + 1), arena_alloc(arena, (size_t)m->ngraphs + 1),
               NULL};
  p->graphs = arena_alloc(arena, sizeof(MemGraph) * (size_t)(m->ngraphs + 1));
  if (p->opts.fusion) p->fused = arena_alloc(arena, sizeof(MemGraph) * (size_t)(m->ngraphs + 1));
  for (int g = 0; g < m->ngraphs && !P.err; g++) {
    if (!P.state[g]) plan_graph(&P, g, 0);
    if (p->fused && !P.err && !P.fstate[g]) plan_graph(&P, g, 1);
  }
  if (P.err) return NULL;
  rank_totals(arena, p);
  return p;
}

/* ---- check ---- */

static int problem(FILE *out, const MemGraph *mg, const IrModule *m, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int problem(FILE *out, const MemGraph *mg, const IrModule *m, const char *fmt, ...) {
  if (!out) return 1;
  va_list ap;
  va_start(ap, fmt);
  fprintf(out, "memplan: %sgraph %s: ", mg->fused ? "fused " : "", m->graphs[mg->graph]->name);
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  va_end(ap);
  return 1;
}

static int check_graph(const MemPlan *p, const MemGraph *mg, FILE *out) {
  const IrModule *m = p->m;
  const IrGraph *g = m->graphs[mg->graph];
  int bad = 0;
  int64_t align = p->opts.align;
  for (int i = 0; i < mg->nbufs; i++) {
    const MemBuf *b = &mg->bufs[i];
    if (b->offset < 0 || b->offset % align || b->offset + b->size > mg->arena)
      bad += problem(out, mg, m, "buffer %d (of %%%d) at %" PRId64 " + %" PRId64 " is outside the arena of %" PRId64
                     " or unaligned", i, b->node, b->offset, b->size, mg->arena);
    if (b->def < 0 || b->last < b->def || b->last > mg->nsteps)
      bad += problem(out, mg, m, "buffer %d lives [%d, %d] outside the steps", i, b->def, b->last);
    if (b->kind != MEMB_WORKSPACE && b->size < b->bytes)
      bad += problem(out, mg, m, "buffer %d reserves %" PRId64 " for %" PRId64 " bytes", i, b->size, b->bytes);
    if (b->kind == MEMB_WORKSPACE) {
      const IrNode *n = &g->nodes[b->node];
      const MemGraph *cg = mg->fused ? &p->fused[n->attr[0]] : &p->graphs[n->attr[0]];
      if (n->attr[1] > 0 && (b->size != cg->arena || b->bytes != cg->peak))
        bad += problem(out, mg, m, "workspace of %%%d is not its callee's arena", b->node);
    }
    for (int j = i + 1; j < mg->nbufs; j++) {
      const MemBuf *c = &mg->bufs[j];
      if (b->size > 0 && c->size > 0 && overlap(b, c) && b->offset < c->offset + c->size &&
          c->offset < b->offset + b->size)
        bad += problem(out, mg, m, "buffers of %%%d and %%%d are live together and overlap in the arena", b->node,
                       c->node);
    }
  }
  for (int i = 0; i < g->nnodes; i++) {
    const MemValue *v = &mg->values[i];
    const IrNode *n = &g->nodes[i];
    if (v->buf >= 0) {
      const MemBuf *b = &mg->bufs[v->buf];
      if (v->def < b->def || v->last > b->last)
        bad += problem(out, mg, m, "%%%d lives [%d, %d] outside its buffer's [%d, %d]", i, v->def, v->last, b->def,
                       b->last);
    }
    if (v->kind == MEM_VIEW && (n->op != IR_RESHAPE || v->of != n->in[0] || v->buf != mg->values[v->of].buf))
      bad += problem(out, mg, m, "%%%d is a view but not a reshape of its buffer's value", i);
    if (v->kind == MEM_INPLACE && mg->fused) {
      if (!mem_fused_inplace_ok(&p->opts.fusion->graphs[mg->graph], g, v->def, v->of, i) ||
          mg->values[v->of].last != v->def || v->buf != mg->values[v->of].buf)
        bad += problem(out, mg, m, "%%%d is in place of %%%d, which the fused rule does not allow", i, v->of);
    } else if (v->kind == MEM_INPLACE) {
      int k = -1;
      for (int j = 0; j < n->nin; j++)
        if (n->in[j] == v->of) k = j;
      if (k < 0 || !mem_inplace_ok(g, i, k) || mg->values[v->of].last != v->def ||
          v->buf != mg->values[v->of].buf)
        bad += problem(out, mg, m, "%%%d is in place of %%%d, which the rule does not allow", i, v->of);
    }
    if ((v->kind == MEM_OWN || v->kind == MEM_VIEW || v->kind == MEM_INPLACE) && v->buf < 0)
      bad += problem(out, mg, m, "%%%d has no buffer", i);
  }
  if (mg->peak > mg->arena) bad += problem(out, mg, m, "the peak %" PRId64 " exceeds the arena", mg->peak);
  return bad;
}

int mem_check(const MemPlan *p, FILE *out) {
  int bad = 0;
  for (int g = 0; g < p->m->ngraphs; g++) {
    bad += check_graph(p, &p->graphs[g], out);
    if (p->fused) bad += check_graph(p, &p->fused[g], out);
  }
  return bad;
}

/* ---- print ---- */

static void print_type(FILE *out, const IrNode *n) {
  fprintf(out, "%s[", sem_dtype_name(n->dtype));
  for (int i = 0; i < n->rank; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", n->dims[i]);
  fputc(']', out);
}

static void print_step(FILE *out, const MemGraph *mg, int s) {
  if (s >= mg->nsteps) fputs("ret", out);
  else fprintf(out, "%d", s);
}

static void print_interval(FILE *out, const MemGraph *mg, int def, int last) {
  fputs(" [", out);
  print_step(out, mg, def);
  if (last != def) {
    fputs(", ", out);
    print_step(out, mg, last);
  }
  fputc(']', out);
}

static void print_graph(FILE *out, const MemPlan *p, int gi) {
  const IrGraph *g = p->m->graphs[gi];
  const MemGraph *mg = &p->graphs[gi];
  fprintf(out, "graph %s (%sargs %d, count %" PRId64 "): arena %" PRId64 ", peak %" PRId64 " at ", g->name,
          gi == p->opts.entry ? "entry; " : "", g->nargs, g->count, mg->arena, mg->peak);
  if (mg->peak_step < g->nnodes) fprintf(out, "%%%d", mg->peak_step);
  else fputs("return", out);
  fprintf(out, "; %d buffer%s, %d view%s, %d in place {\n", mg->nbufs, mg->nbufs == 1 ? "" : "s", mg->nviews,
          mg->nviews == 1 ? "" : "s", mg->ninplace);
  /* buffers of a step: the value's, then its call's workspace and stash */
  int *first = calloc((size_t)g->nnodes + 1, sizeof(int));
  if (!first) abort();
  for (int i = 0; i < g->nnodes; i++) first[i] = -1;
  for (int b = mg->nbufs - 1; b >= 0; b--)
    if (mg->bufs[b].kind != MEMB_VALUE) first[mg->bufs[b].node] = b;
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    const MemValue *v = &mg->values[i];
    if (v->kind == MEM_EXTERNAL) continue;
    fprintf(out, "  %%%d %s ", i, ir_op_name(n->op));
    print_type(out, n);
    if (v->kind == MEM_OWN) fprintf(out, ": %" PRId64 " @%" PRId64, v->bytes, mg->bufs[v->buf].offset);
    else fprintf(out, ": %s %%%d @%" PRId64, v->kind == MEM_VIEW ? "view of" : "in place of", v->of,
                 mg->bufs[v->buf].offset);
    print_interval(out, mg, v->def, v->last);
    fputc('\n', out);
    for (int b = first[i]; b >= 0 && b < mg->nbufs && mg->bufs[b].node == i; b++) {
      const MemBuf *B = &mg->bufs[b];
      if (B->kind == MEMB_WORKSPACE) {
        fprintf(out, "  ws %%%d %s x %" PRId64 ": %" PRId64 " (peak %" PRId64 ") @%" PRId64, i,
                p->m->graphs[n->attr[0]]->name, n->attr[1], B->size, B->bytes, B->offset);
        print_interval(out, mg, B->def, B->last);
      } else if (B->kind == MEMB_STASH) {
        fprintf(out, "  stash %%%d", i);
        if (B->until >= 0) fprintf(out, " until %%%d", B->until);
        fprintf(out, ": %" PRId64 " x %" PRId64 " = %" PRId64 " @%" PRId64, B->count, B->per_layer, B->bytes,
                B->offset);
        print_interval(out, mg, B->def, B->last);
      } else {
        continue;
      }
      fputc('\n', out);
    }
  }
  free(first);
  fputs("}\n", out);
  if (p->fused) {
    const MemGraph *fg = &p->fused[gi];
    int internal = 0;
    for (int i = 0; i < g->nnodes; i++) internal += fg->values[i].kind == MEM_INTERNAL;
    fprintf(out, "fused %s: %d kernels, %d buffers, %d in place, %d values inside kernels; arena %" PRId64
            ", peak %" PRId64 " (%+" PRId64 " vs unfused)\n",
            g->name, fg->nsteps, fg->nbufs, fg->ninplace, internal, fg->arena, fg->peak, fg->peak - mg->peak);
  }
}

void mem_print(FILE *out, const MemPlan *p) {
  const MemOptions *o = &p->opts;
  for (int g = 0; g < p->m->ngraphs; g++)
    if (p->reached[g]) print_graph(out, p, g);
  const char *opt = o->optimizer == OPT_ADAMW ? "adamw" : o->sgd_momentum ? "sgd with momentum" : "sgd";
  fprintf(out, "rank (%s, %s, zero %d over dp %" PRId64 ", align %" PRId64 ") {\n", sem_precision_name(o->precision),
          opt, o->zero, o->dp, o->align);
  fprintf(out, "  params %" PRId64 " (%" PRId64 " elements)\n", p->params, p->param_elems);
  fprintf(out, "  grads %" PRId64 "\n", p->grads);
  fprintf(out, "  optimizer %" PRId64 "\n", p->optimizer);
  fprintf(out, "  inputs %" PRId64 "\n", p->inputs);
  fprintf(out, "  activations: arena %" PRId64 ", peak %" PRId64 " (stashes %" PRId64 ")\n", p->arena, p->peak,
          p->stash);
  if (p->fused)
    fprintf(out, "  fused activations: arena %" PRId64 ", peak %" PRId64 " (%+" PRId64 " vs unfused)\n",
            p->fused_arena, p->fused_peak, p->fused_peak - p->peak);
  fprintf(out, "  total %" PRId64 " (peak %" PRId64 ")\n", p->total, p->total_peak);
  fputs("}\n", out);
}

void mem_options_from_model(const SemModel *model, MemOptions *o) {
  memset(o, 0, sizeof *o);
  o->precision = model->train.precision;
  o->optimizer = model->train.optimizer;
  o->sgd_momentum = model->train.optimizer == OPT_SGD && model->train.momentum > 0;
  o->moments_bf16 = model->train.moments_bf16;
  o->zero = model->layout.zero > 0 ? (int)model->layout.zero : 0;
  o->dp = model->layout.dp > 0 ? model->layout.dp : 1;
  o->align = MEM_ALIGN;
}
