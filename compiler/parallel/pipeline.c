/* pipeline.c - model chunks for pipeline parallelism (see pipeline.h). */
#include "pipeline.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  Arena *arena;
  Diag *diag;
  const IrModule *src;
  IrModule *dst;
  int failed;
} Pipe;

static int copy_node(Pipe *P, IrGraph *out, const IrNode *n, const int *map, int graph_offset) {
  int in[64];
  int nin = n->nin < 64 ? n->nin : 64;
  for (int k = 0; k < nin; k++) {
    in[k] = map[n->in[k]];
    if (in[k] < 0) {
      diag_error(P->diag, n->span, "internal error splitting the pipeline: an input of %s is missing", ir_op_name(n->op));
      P->failed = 1;
      return -1;
    }
  }
  int64_t attr[IR_NATTR];
  memcpy(attr, n->attr, sizeof attr);
  if (n->op == IR_CALL) attr[0] += graph_offset;
  const char *why = NULL;
  int keep = (ir_op_flags(n->op) & IRF_LEAF) || n->op == IR_RESHAPE || n->op == IR_SLICE || n->op == IR_CALL ||
             n->op == IR_PAD || n->op == IR_EXPAND || n->op == IR_SUM_TO || n->op == IR_ALL_GATHER || n->op == IR_ALL_TO_ALL ||
             n->op == IR_REDUCE_SCATTER || n->op == IR_SHARD_SLICE || n->op == IR_EMBEDDING_BWD || n->op == IR_PICK_BWD ||
             n->op == IR_TAKE_BWD;
  int id = ir_add(out, n->op, in, nin, attr, IR_NATTR, n->fattr, n->dtype, keep ? n->rank : -1, n->dims, &why);
  if (id < 0) {
    diag_error(P->diag, n->span, "internal error splitting the pipeline: %s", why ? why : "?");
    P->failed = 1;
    return -1;
  }
  out->nodes[id].span = n->span;
  out->nodes[id].name = n->name;
  return id;
}

/* Marks the nodes of graph 0 that depend on node `call`. */
static void mark_after(const IrGraph *g, int call, char *after) {
  after[call] = 1;
  for (int i = call + 1; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nin && !after[i]; k++)
      if (after[g->nodes[i].in[k]]) after[i] = 1;
}

int pipe_split_ends(int64_t repeat, int64_t chunks, int64_t *out) {
  if (chunks < 1 || repeat < 0) return -1;
  if (chunks == 1) {
    out[0] = repeat;
    return 0;
  }
  if ((repeat + 2) % chunks) return -1;
  int64_t q = (repeat + 2) / chunks;
  for (int64_t c = 0; c < chunks; c++) out[c] = c == 0 || c == chunks - 1 ? q - 1 : q;
  return 0;
}

int pipe_balance(int64_t repeat, int64_t chunks, double t_first, double t_layer, double t_last, int64_t *out) {
  if (chunks < 1 || repeat < chunks) return -1;
  if (!(t_layer > 0) || !(t_first >= 0) || !(t_last >= 0)) { /* no usable price: split by count */
    t_layer = 1;
    t_first = t_last = 0;
  }
  for (int64_t c = 0; c < chunks; c++) out[c] = 1;
  if (chunks <= 2) {
    for (int64_t left = repeat - chunks; left > 0; left--) {
      int64_t best = -1;
      double best_t = 0;
      for (int64_t c = chunks - 1; c >= 0; c--) {
        double t = (double)(out[c] + 1) * t_layer + (c == 0 ? t_first : 0) + (c == chunks - 1 ? t_last : 0);
        if (best < 0 || t < best_t) best = c, best_t = t;
      }
      out[best]++;
    }
    return 0;
  }
  /* The same greedy in O(repeat): each layer goes to the chunk it leaves
   * fastest, ties to the higher index. The middle chunks cost alike, so
   * they fill in turns from the highest down: at any time the highest k of
   * them hold m + 1 layers and the rest m, and the candidate among them is
   * the highest holding m. (The plain scan over every chunk for every layer
   * was a tenth of plan --search's time.) */
  int64_t nmid = chunks - 2, m = 1, k = 0;
  for (int64_t left = repeat - chunks; left > 0; left--) {
    double t_end = (double)(out[chunks - 1] + 1) * t_layer + t_last, t_mid = (double)(m + 1) * t_layer,
           t_start = (double)(out[0] + 1) * t_layer + t_first;
    int to = 2; /* the last chunk, scanned first */
    double best_t = t_end;
    if (t_mid < best_t) to = 1, best_t = t_mid;
    if (t_start < best_t) to = 0;
    if (to == 2) out[chunks - 1]++;
    else if (to == 0) out[0]++;
    else if (++k == nmid) m++, k = 0;
  }
  for (int64_t c = 1; c <= nmid; c++) out[c] = c >= chunks - 1 - k ? m + 1 : m;
  return 0;
}

/* Packs w into `chunks` runs of sum <= T, each at least one unit and
 * leaving one for each later run; 0 when all fit. */
static int pack_units(const double *w, int64_t n, int64_t chunks, double T, int64_t *out) {
  int64_t i = 0;
  for (int64_t c = 0; c < chunks; c++) {
    if (i >= n) return -1;
    double sum = w[i];
    int64_t take = 1;
    if (c == chunks - 1) {
      while (i + take < n) sum += w[i + take++];
    } else {
      while (i + take < n && n - (i + take) > chunks - c - 1 && sum + w[i + take] <= T) sum += w[i + take++];
    }
    if (sum > T) return -1;
    if (out) out[c] = take;
    i += take;
  }
  return i == n ? 0 : -1;
}

int pipe_balance_units(const double *w, int64_t n, int64_t chunks, int64_t *out) {
  if (chunks < 1 || n < chunks) return -1;
  double lo = 0, hi = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = w[i] > 0 ? w[i] : 0;
    hi += x;
    if (x > lo) lo = x;
  }
  if (!(hi > 0)) { /* no usable price: split by count */
    for (int64_t c = 0; c < chunks; c++) out[c] = n / chunks + (c >= chunks - n % chunks ? 1 : 0);
    return 0;
  }
  double *pos = malloc(sizeof(double) * (size_t)n);
  if (!pos) return -1;
  for (int64_t i = 0; i < n; i++) pos[i] = w[i] > 0 ? w[i] : 0;
  if (pack_units(pos, n, chunks, lo, NULL) == 0) hi = lo;
  for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
    double mid = 0.5 * (lo + hi);
    if (pack_units(pos, n, chunks, mid, NULL) == 0) hi = mid;
    else lo = mid;
  }
  int rc = pack_units(pos, n, chunks, hi * (1 + 1e-12), out);
  free(pos);
  return rc;
}

static int single_call(const IrGraph *g0, int *ncalls) {
  int call = -1;
  *ncalls = 0;
  for (int i = 0; i < g0->nnodes; i++)
    if (g0->nodes[i].op == IR_CALL) call = i, ++*ncalls;
  return call;
}


/* Whether a node may be free: a value that depends only on leaves other
 * than the model's first input (parameters, constants, the targets and
 * other inputs), which a chunk that reads it computes itself. The first
 * input (images, tokens) is what the forward flows from: chunk 0's. */
static int is_free_op(const IrNode *n) {
  if (n->op == IR_RECV || n->op == IR_SEND || n->op == IR_CALL || n->op == IR_STATE_UPDATE) return 0;
  if (n->op == IR_INPUT && n->attr[0] == 0) return 0;
  return 1;
}

const PipeUnits *pipe_units(Arena *arena, const IrModule *m) {
  if (!m || m->ngraphs < 1 || m->graphs[0]->nnodes < 1) return NULL;
  const IrGraph *g = m->graphs[0];
  PipeUnits *u = arena_alloc(arena, sizeof *u);
  int ncalls = 0;
  int call = single_call(g, &ncalls);
  if (ncalls == 1) {
    u->nunits = g->nodes[call].attr[1];
    return u;
  }
  u->by_cuts = 1;
  int n = g->nnodes;
  u->free_node = arena_alloc(arena, (size_t)n + 1);
  int *last_use = arena_alloc(arena, sizeof(int) * ((size_t)n + 1));
  for (int i = 0; i < n; i++) {
    const IrNode *x = &g->nodes[i];
    int f = is_free_op(x);
    for (int k = 0; k < x->nin && f; k++) f = u->free_node[x->in[k]];
    u->free_node[i] = (char)f;
    last_use[i] = i;
    for (int k = 0; k < x->nin; k++) last_use[x->in[k]] = i;
  }
  for (int k = 0; k < g->noutputs; k++) last_use[g->outputs[k]] = n;
  /* Sweep: the values made before node p and read at or after it. A cut
   * before p is where exactly one crosses, p itself not free, and some
   * work (a node that is not free) lies on each side. */
  int *starts = arena_alloc(arena, sizeof(int) * ((size_t)n + 2));
  int *cross = arena_alloc(arena, sizeof(int) * ((size_t)n + 2));
  int nu = 1, live = 0, work_before = 0, lastv = -1;
  starts[0] = 0;
  cross[0] = -1;
  int *next_end = arena_alloc(arena, sizeof(int) * ((size_t)n + 1)), *head = arena_alloc(arena, sizeof(int) * ((size_t)n + 2));
  for (int p = 0; p <= n; p++) head[p] = -1;
  for (int p = 0; p < n; p++) {
    for (int i = head[p]; i >= 0; i = next_end[i]) live--; /* last read at p - 1 */
    if (p > 0 && work_before && live == 1 && !u->free_node[p]) {
      /* the one live value: the latest made whose last use is >= p */
      int v = -1;
      for (int i = lastv; i >= 0 && v < 0; i--)
        if (!u->free_node[i] && last_use[i] >= p) v = i;
      starts[nu] = p;
      cross[nu] = v;
      nu++;
    }
    if (!u->free_node[p]) {
      if (!(ir_op_flags(g->nodes[p].op) & IRF_LEAF)) work_before = 1; /* the first input alone is no work */
      lastv = p;
      if (last_use[p] > p) {
        live++;
        /* it dies after its last use: before node last_use + 1 */
        int at = last_use[p] + 1;
        next_end[p] = head[at];
        head[at] = p;
      }
    }
  }
  /* the last unit must hold work after its cut; drop cuts with none */
  while (nu > 1) {
    int any = 0;
    for (int i = starts[nu - 1]; i < n && !any; i++) any = !u->free_node[i];
    if (any) break;
    nu--;
  }
  starts[nu] = n;
  /* a unit whose one piece of work is a CALL that its input alone enters and
   * its output alone leaves: a unit per layer (split_call: that CALL, or -1) */
  int64_t total = 0;
  int *split_call = arena_alloc(arena, sizeof(int) * ((size_t)nu + 1));
  for (int v = 0; v < nu; v++) {
    int c = -1, work = 0;
    for (int i = starts[v]; i < starts[v + 1]; i++)
      if (!u->free_node[i]) work++, c = i;
    const IrNode *x = c >= 0 ? &g->nodes[c] : NULL;
    int ok = work == 1 && x->op == IR_CALL && x->attr[1] > 1 && (v == 0 ? 0 : cross[v] == x->in[0]) &&
             (v + 1 < nu ? cross[v + 1] == c : 0);
    for (int k = 1; ok && k < x->nin; k++) ok = u->free_node[x->in[k]];
    split_call[v] = ok ? c : -1;
    total += ok ? x->attr[1] : 1;
  }
  u->nunits = total;
  u->start = arena_alloc(arena, sizeof(int) * ((size_t)total + 1));
  u->cross = arena_alloc(arena, sizeof(int) * ((size_t)total + 1));
  u->call = arena_alloc(arena, sizeof(int) * ((size_t)total + 1));
  u->layer = arena_alloc(arena, sizeof(int64_t) * ((size_t)total + 1));
  int64_t w = 0;
  for (int v = 0; v < nu; v++) {
    int64_t layers = split_call[v] >= 0 ? g->nodes[split_call[v]].attr[1] : 1;
    for (int64_t l = 0; l < layers; l++, w++) {
      u->start[w] = starts[v];
      u->cross[w] = l == 0 ? cross[v] : -1;
      u->call[w] = split_call[v];
      u->layer[w] = l;
    }
  }
  u->start[total] = n;
  return u;
}

/* Copies node i into a chunk with what it reads that is free (recomputed
 * here) and not yet there. */
static int copy_free_deps(Pipe *P, IrGraph *out, const IrGraph *g0, const char *free_node, int *map, int i, int offset) {
  const IrNode *x = &g0->nodes[i];
  for (int k = 0; k < x->nin; k++) {
    int j = x->in[k];
    if (map[j] >= 0) continue;
    if (!free_node[j]) {
      diag_error(P->diag, x->span, "internal error splitting the pipeline: %s reads a value of another chunk", ir_op_name(x->op));
      P->failed = 1;
      return -1;
    }
    if (copy_free_deps(P, out, g0, free_node, map, j, offset) < 0) return -1;
  }
  return map[i] = copy_node(P, out, x, map, offset);
}

/* A module of m's inputs, externs and parameters (the chunks go into one). */
static IrModule *split_module(Arena *arena, const IrModule *m) {
  IrModule *d = ir_module_new(arena);
  d->micro_batch = m->micro_batch;
  d->inputs = m->inputs;
  d->ninputs = m->ninputs;
  d->externs = m->externs;
  d->nexterns = m->nexterns;
  for (int i = 0; i < m->nparams; i++) ir_add_param(d, &m->params[i]);
  return d;
}

/* The chunks of a graph 0 cut between units (PipeUnits.by_cuts). */
static PipeResult *split_by_cuts(Arena *arena, Diag *diag, const IrModule *m, const PipeUnits *u, int64_t chunks,
                                 const int64_t *nl, const int64_t *first) {
  const IrGraph *g0 = m->graphs[0];
  Pipe P = {arena, diag, m, split_module(arena, m), 0};
  int offset = (int)chunks - 1;
  for (int64_t c = 0; c < chunks && !P.failed; c++) {
    IrGraph *out = ir_graph_new(P.dst, arena_printf(arena, "chunk%" PRId64, c));
    int *map = arena_alloc(arena, sizeof(int) * (size_t)(g0->nnodes + 1));
    for (int i = 0; i < g0->nnodes; i++) map[i] = -1;
    int64_t u0 = first[c], u1 = first[c] + nl[c];
    int inside = -1; /* the activation between two layers of a repeat, in this chunk */
    if (c > 0) {
      int from = u->cross[u0] >= 0 ? u->cross[u0] : u->call[u0];
      const IrNode *x = &g0->nodes[from];
      int64_t attr[2] = {IRG_PP, -1}; /* from the previous chunk */
      int r = ir_add(out, IR_RECV, NULL, 0, attr, 2, 0, x->dtype, x->rank, x->dims, NULL);
      if (r < 0) P.failed = 1;
      if (u->cross[u0] >= 0) map[u->cross[u0]] = r;
      else inside = r;
    }
    for (int64_t v = u0; v < u1 && !P.failed;) {
      if (u->call[v] < 0) {
        for (int i = u->start[v]; i < u->start[v + 1] && !P.failed; i++)
          if (!u->free_node[i] && map[i] < 0) copy_free_deps(&P, out, g0, u->free_node, map, i, offset);
        v++;
        continue;
      }
      /* a run of the repeat's layers: one CALL from its first layer here */
      int cn = u->call[v];
      const IrNode *x = &g0->nodes[cn];
      int64_t run = 0;
      while (v + run < u1 && u->call[v + run] == cn) run++;
      int in[16], nin = x->nin < 16 ? x->nin : 16;
      in[0] = u->layer[v] == 0 ? map[x->in[0]] : inside;
      for (int k = 1; k < nin && !P.failed; k++) {
        if (map[x->in[k]] < 0) copy_free_deps(&P, out, g0, u->free_node, map, x->in[k], offset);
        in[k] = map[x->in[k]];
      }
      if (P.failed || in[0] < 0) {
        if (!P.failed) diag_error(diag, x->span, "internal error splitting the pipeline: a repeat's input is missing");
        P.failed = 1;
        break;
      }
      int64_t attr[4] = {x->attr[0] + offset, run, x->attr[2], x->attr[3] + u->layer[v]};
      int y = ir_add(out, IR_CALL, in, nin, attr, 4, 0, x->dtype, x->rank, x->dims, NULL);
      if (y < 0) {
        P.failed = 1;
        break;
      }
      out->nodes[y].span = x->span;
      if (u->layer[v] + run == x->attr[1]) map[cn] = y;
      else inside = y;
      v += run;
    }
    if (P.failed) break;
    if (c == chunks - 1) {
      out->noutputs = g0->noutputs;
      out->outputs = arena_alloc(arena, sizeof(int) * (size_t)(g0->noutputs + 1));
      for (int k = 0; k < g0->noutputs && !P.failed; k++) {
        int o = g0->outputs[k];
        if (map[o] < 0) copy_free_deps(&P, out, g0, u->free_node, map, o, offset);
        out->outputs[k] = map[o];
      }
    } else {
      int v = u->cross[u1] >= 0 ? u->cross[u1] : u->call[u1], y = u->cross[u1] >= 0 ? map[v] : inside;
      if (y < 0) {
        diag_error(diag, g0->nodes[v].span, "internal error splitting the pipeline: chunk %" PRId64 " does not make what it sends", c);
        P.failed = 1;
        break;
      }
      int64_t sattr[2] = {IRG_PP, 1}; /* to the next chunk */
      int s = ir_add(out, IR_SEND, &y, 1, sattr, 2, 0, g0->nodes[v].dtype, g0->nodes[v].rank, g0->nodes[v].dims, NULL);
      out->noutputs = 1;
      out->outputs = arena_alloc(arena, sizeof(int));
      out->outputs[0] = s;
    }
  }
  if (P.failed) return NULL;
  PipeResult *r = arena_alloc(arena, sizeof *r);
  r->m = P.dst;
  r->nchunks = (int)chunks;
  r->by_cuts = 1;
  r->layers = (int64_t *)nl;
  r->first = (int64_t *)first;
  return r;
}

static void copy_block_graphs(Arena *arena, const IrModule *m, IrModule *dst, int offset);

/* Each chunk's first unit and unit count (nl, first) from `split`, each at
 * least one (ends_empty: the first and the last chunk may run none, their
 * prologue or epilogue alone) and summing to `total`; NULL split: the equal
 * split. 0, or -1 with an error at `at` (units named `what`: layers or
 * pieces). */
static int chunk_ranges(Diag *diag, Span at, int64_t chunks, const int64_t *split, int64_t total, const char *what,
                        int ends_empty, int64_t *nl, int64_t *first) {
  if (!split && total % chunks) {
    diag_error(diag, at, "%" PRId64 " %s do not divide into %" PRId64 " equal pipeline chunks", total, what, chunks);
    return -1;
  }
  int64_t sum = 0;
  for (int64_t c = 0; c < chunks; c++) {
    nl[c] = split ? split[c] : total / chunks;
    first[c] = sum;
    sum += nl[c];
    int may_be_empty = ends_empty && (c == 0 || c == chunks - 1);
    if (nl[c] < (may_be_empty ? 0 : 1)) {
      diag_error(diag, at, "pipeline chunk %" PRId64 " would run %" PRId64 " %s; every chunk needs at least one%s", c, nl[c], what,
                 ends_empty ? " but the first and the last, which hold the embeddings and the head" : "");
      return -1;
    }
  }
  if (sum != total) {
    diag_error(diag, at, "the pipeline chunks run %" PRId64 " %s, but the model has %" PRId64, sum, what, total);
    return -1;
  }
  return 0;
}

PipeResult *pipe_split(Arena *arena, Diag *diag, const IrModule *m, int64_t chunks, const int64_t *split) {
  PipeResult *r = arena_alloc(arena, sizeof *r);
  const PipeUnits *u = pipe_units(arena, m);
  if (chunks <= 1) {
    r->m = (IrModule *)m;
    r->nchunks = 1;
    r->by_cuts = u && u->by_cuts;
    r->layers = arena_alloc(arena, sizeof(int64_t));
    r->first = arena_alloc(arena, sizeof(int64_t));
    r->layers[0] = u ? u->nunits : 0;
    r->first[0] = 0;
    return r;
  }
  const IrGraph *g0 = m->graphs[0];
  if (u && u->by_cuts) {
    if (!split) {
      diag_error(diag, span_none, "an equal pipeline split needs one repeated block in the model's forward, to divide its layers");
      return NULL;
    }
    int64_t *nl = arena_alloc(arena, sizeof(int64_t) * (size_t)chunks), *first = arena_alloc(arena, sizeof(int64_t) * (size_t)chunks);
    if (chunk_ranges(diag, span_none, chunks, split, u->nunits, "pieces", 0, nl, first) < 0) return NULL;
    PipeResult *cr = split_by_cuts(arena, diag, m, u, chunks, nl, first);
    if (cr) copy_block_graphs(arena, m, cr->m, (int)chunks - 1);
    return cr;
  }
  int ncalls = 0;
  int call = single_call(g0, &ncalls);
  if (ncalls != 1) {
    diag_error(diag, span_none, "pipeline parallelism needs exactly one repeated block in the model's forward; it has %d", ncalls);
    return NULL;
  }
  const IrNode *cn = &g0->nodes[call];
  int64_t layers = cn->attr[1];
  int64_t *nl = arena_alloc(arena, sizeof(int64_t) * (size_t)chunks);
  int64_t *first = arena_alloc(arena, sizeof(int64_t) * (size_t)chunks);
  if (chunk_ranges(diag, cn->span, chunks, split, layers, "layers", 1, nl, first) < 0) return NULL;
  Pipe P = {arena, diag, m, split_module(arena, m), 0};
  char *after = arena_alloc(arena, (size_t)g0->nnodes + 1);
  mark_after(g0, call, after);
  int offset = (int)chunks - 1; /* graph index shift of the block graphs */
  const IrNode *arg = &g0->nodes[cn->in[0]];
  for (int64_t c = 0; c < chunks && !P.failed; c++) {
    IrGraph *out = ir_graph_new(P.dst, c == 0 ? "chunk0" : arena_printf(arena, "chunk%" PRId64, c));
    int *map = arena_alloc(arena, sizeof(int) * (size_t)(g0->nnodes + 1));
    for (int i = 0; i < g0->nnodes; i++) map[i] = -1;
    int x;
    if (c == 0) {
      for (int i = 0; i < call && !P.failed; i++)
        if (!after[i]) map[i] = copy_node(&P, out, &g0->nodes[i], map, offset);
      x = map[cn->in[0]];
    } else {
      int64_t attr[2] = {IRG_PP, -1}; /* from the previous chunk */
      x = ir_add(out, IR_RECV, NULL, 0, attr, 2, 0, arg->dtype, arg->rank, arg->dims, NULL);
    }
    if (P.failed || x < 0) break;
    /* the chunk's layers: the block graph from layer first[c] on; none in a
     * first or last chunk that holds only the embeddings or the head */
    int y = x;
    if (nl[c] > 0) {
      int in[16];
      in[0] = x;
      int nin = cn->nin < 16 ? cn->nin : 16;
      for (int k = 1; k < nin; k++) {
        const IrNode *other = &g0->nodes[cn->in[k]];
        in[k] = map[cn->in[k]] >= 0 ? map[cn->in[k]] : copy_node(&P, out, other, map, offset);
      }
      int64_t attr[4] = {cn->attr[0] + offset, nl[c], cn->attr[2], first[c]};
      y = ir_add(out, IR_CALL, in, nin, attr, 4, 0, cn->dtype, cn->rank, cn->dims, NULL);
      if (y < 0) {
        P.failed = 1;
        break;
      }
    }
    if (c == chunks - 1) {
      map[call] = y;
      /* The epilogue, with what it reads from before the blocks recomputed
       * here: those values depend only on parameters and inputs (a transposed
       * tied embedding, the targets' chunk), so no activation crosses. */
      char *need = arena_alloc(arena, (size_t)g0->nnodes + 1);
      for (int j = g0->nnodes - 1; j >= 0; j--)
        if (j != call && (after[j] || need[j]))
          for (int k = 0; k < g0->nodes[j].nin; k++)
            if (!after[g0->nodes[j].in[k]]) need[g0->nodes[j].in[k]] = 1;
      for (int i = 0; i < g0->nnodes && !P.failed; i++) {
        const IrNode *n = &g0->nodes[i];
        if (i == call || !(after[i] || need[i])) continue;
        map[i] = copy_node(&P, out, n, map, offset);
      }
      out->noutputs = g0->noutputs;
      out->outputs = arena_alloc(arena, sizeof(int) * (size_t)(g0->noutputs + 1));
      for (int k = 0; k < g0->noutputs; k++) out->outputs[k] = map[g0->outputs[k]];
    } else {
      int64_t sattr[2] = {IRG_PP, 1}; /* to the next chunk */
      int s = ir_add(out, IR_SEND, &y, 1, sattr, 2, 0, cn->dtype, cn->rank, cn->dims, NULL);
      out->noutputs = 1;
      out->outputs = arena_alloc(arena, sizeof(int));
      out->outputs[0] = s;
    }
  }
  if (P.failed) return NULL;
  copy_block_graphs(arena, m, P.dst, offset);
  r->m = P.dst;
  r->nchunks = (int)chunks;
  r->layers = nl;
  r->first = first;
  return r;
}

/* The block graphs (1.. of m) after the chunks; calls inside them shift by offset. */
static void copy_block_graphs(Arena *arena, const IrModule *m, IrModule *dst, int offset) {
  for (int i = 1; i < m->ngraphs; i++) {
    IrGraph *copy = ir_graph_new(dst, m->graphs[i]->name);
    IrGraph keep = *copy;
    *copy = *m->graphs[i];
    copy->arena = keep.arena;
    /* nested calls inside blocks shift too */
    for (int k = 0; k < copy->nnodes; k++)
      if (copy->nodes[k].op == IR_CALL) {
        IrNode *nodes = arena_alloc(arena, sizeof(IrNode) * (size_t)copy->nnodes);
        memcpy(nodes, copy->nodes, sizeof(IrNode) * (size_t)copy->nnodes);
        copy->nodes = nodes;
        copy->cap = copy->nnodes;
        for (int j = 0; j < copy->nnodes; j++)
          if (nodes[j].op == IR_CALL) nodes[j].attr[0] += offset;
        break;
      }
  }
}

/* A module whose graph 0 is pipeline chunk c; the others report a zero loss
 * (their output feeds only a SEND, whose gradient arrives by RECV). */
IrModule *pipe_chunk_module(Arena *arena, const PipeResult *pr, int c) {
  const IrModule *src = pr->m;
  IrModule *cm = split_module(arena, src);
  int shift = pr->nchunks - 1; /* block graphs move from K.. to 1.. */
  const IrGraph *cg = src->graphs[c];
  IrGraph *g0 = ir_graph_new(cm, cg->name);
  g0->nodes = arena_alloc(arena, sizeof(IrNode) * (size_t)(cg->nnodes + 8));
  memcpy(g0->nodes, cg->nodes, sizeof(IrNode) * (size_t)cg->nnodes);
  g0->nnodes = cg->nnodes;
  g0->cap = cg->nnodes + 8;
  for (int i = 0; i < g0->nnodes; i++)
    if (g0->nodes[i].op == IR_CALL) g0->nodes[i].attr[0] -= shift;
  g0->noutputs = 1;
  g0->outputs = arena_alloc(arena, sizeof(int));
  g0->outputs[0] = cg->outputs[0];
  if (c != pr->nchunks - 1) {
    const IrNode *s = &g0->nodes[cg->outputs[0]];
    int64_t n = ir_numel(s), attr[2] = {0, 0};
    int flat = ir_add(g0, IR_RESHAPE, &cg->outputs[0], 1, NULL, 0, 0, s->dtype, 1, &n, NULL);
    int sum = ir_add(g0, IR_REDUCE_SUM, &flat, 1, attr, 2, 0, s->dtype, -1, NULL, NULL);
    int zero = ir_add(g0, IR_CONST, NULL, 0, NULL, 0, 0.0, DT_F32, -1, NULL, NULL);
    int in[2] = {sum, zero};
    g0->outputs[0] = ir_add(g0, IR_MUL, in, 2, NULL, 0, 0, s->dtype, -1, NULL, NULL);
  }
  for (int i = pr->nchunks; i < src->ngraphs; i++) {
    IrGraph *b = ir_graph_new(cm, src->graphs[i]->name);
    Arena *keep = b->arena;
    *b = *src->graphs[i];
    b->arena = keep;
  }
  return cm;
}
