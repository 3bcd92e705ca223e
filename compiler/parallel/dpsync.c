/* dpsync.c - data-parallel gradient synchronisation and ZeRO sharding as
 * IR (see dpsync.h). */
#include "dpsync.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int64_t dpsync_piece(int64_t n, int64_t dp) { return dp > 1 ? (n + dp - 1) / dp : n; }

/* The data-parallel ranks a parameter's gradient is summed and ZeRO-sharded
 * over: all dp, or for an expert shard the dp / ep holding the same experts. */
static int64_t dp_members(const IrParam *p, int64_t dp, int64_t ep) { return ir_param_is_expert(p) && ep > 1 ? dp / ep : dp; }
static IrGroup dp_group(const IrParam *p) { return ir_param_is_expert(p) ? IRG_EDP : IRG_DP; }

static int64_t numel_of(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

/* ZeRO-3's read of parameter node n: this rank's piece, gathered over dp,
 * unpadded and reshaped to the tensor the graph used before. */
static int gathered_param(IrGraph *g, const IrModule *d, const IrNode *n, const char **why) {
  int64_t index = n->attr[0];
  const IrParam *p = &d->params[index];
  int64_t s = p->dims[0], all = s * p->dp_shards, numel = numel_of(p->dp_rank, p->dp_dims);
  int x = ir_add(g, IR_PARAM, NULL, 0, &index, 1, 0, p->dtype, 1, &s, why);
  if (x < 0) return -1;
  g->nodes[x].span = n->span;
  /* partial-grad: each replica's gradient of the gathered tensor is its own
   * share of the sum, so the backward reduce-scatters (autodiff.c) */
  int64_t ga[4] = {dp_group(p), 0, 0, 1}; /* an expert shard: its pieces are over edp */
  x = ir_add(g, IR_ALL_GATHER, &x, 1, ga, 4, 0, p->dtype, 1, &all, why);
  if (x >= 0 && all != numel) {
    int64_t sa[16] = {0};
    x = ir_add(g, IR_SLICE, &x, 1, sa, 16, 0, p->dtype, 1, &numel, why);
  }
  if (x >= 0 && p->dp_rank != 1) x = ir_add(g, IR_RESHAPE, &x, 1, NULL, 0, 0, p->dtype, p->dp_rank, p->dp_dims, why);
  if (x >= 0) {
    g->nodes[x].span = n->span;
    g->nodes[x].name = n->name;
  }
  return x;
}

IrModule *dpsync_shard_params(Arena *arena, Diag *diag, const IrModule *m, int64_t dp, int64_t ep) {
  IrModule *d = ir_module_new(arena);
  d->micro_batch = m->micro_batch;
  d->inputs = m->inputs;
  d->ninputs = m->ninputs;
  for (int i = 0; i < m->nparams; i++) {
    IrParam p = m->params[i];
    /* a state parameter (running statistics) stays whole: the forward writes it */
    if (!p.dp_shards && !p.state) {
      int64_t members = dp_members(&p, dp, ep);
      p.dp_shards = (int)members;
      p.dp_rank = p.rank;
      memcpy(p.dp_dims, p.dims, sizeof p.dp_dims);
      int64_t s = dpsync_piece(numel_of(p.rank, p.dims), members);
      memset(p.dims, 0, sizeof p.dims);
      p.rank = 1;
      p.dims[0] = s;
    }
    ir_add_param(d, &p);
  }
  for (int gi = 0; gi < m->ngraphs; gi++) {
    const IrGraph *s = m->graphs[gi];
    if (s->ngrad_params) {
      diag_error(diag, span_none, "internal error: ZeRO-3 shards the parameters of a module before autodiff");
      return NULL;
    }
    IrGraph *g = ir_graph_new(d, s->name);
    g->nargs = s->nargs;
    g->count = s->count;
    int *map = arena_alloc(arena, sizeof(int) * (size_t)(s->nnodes + 1));
    for (int i = 0; i < s->nnodes; i++) {
      const IrNode *n = &s->nodes[i];
      const char *why = NULL;
      map[i] = n->op == IR_PARAM && !d->params[n->attr[0]].state ? gathered_param(g, d, n, &why) : ir_add_copy(g, n, map);
      if (map[i] < 0) {
        diag_error(diag, n->span, "internal error sharding parameters over dp (ZeRO-3): %s", why ? why : "?");
        return NULL;
      }
    }
    g->noutputs = s->noutputs;
    g->outputs = arena_alloc(arena, sizeof(int) * (size_t)(s->noutputs + 1));
    for (int k = 0; k < s->noutputs; k++) g->outputs[k] = map[s->outputs[k]];
  }
  if (ir_verify(d, NULL)) {
    diag_error(diag, span_none, "internal error: the module sharded over dp (ZeRO-3) does not verify");
    return NULL;
  }
  return d;
}

/* Which copies of each parameter the forward graphs of this module run: a
 * repeated graph runs the layers its CALLs name (a pipeline chunk a range). */
static void layer_ranges(const AdResult *ad, int64_t *lo, int64_t *hi) {
  const IrModule *m = ad->m;
  for (int gi = 0; gi < ad->nforward; gi++) lo[gi] = gi == 0 ? 0 : INT64_MAX, hi[gi] = gi == 0 ? 1 : 0;
  for (int gi = 0; gi < ad->nforward; gi++)
    for (int i = 0; i < m->graphs[gi]->nnodes; i++) {
      const IrNode *n = &m->graphs[gi]->nodes[i];
      if (n->op != IR_CALL || n->attr[0] < 0 || n->attr[0] >= ad->nforward) continue;
      int64_t c = n->attr[0], a = n->attr[3], b = n->attr[3] + n->attr[1];
      lo[c] = a < lo[c] ? a : lo[c];
      hi[c] = b > hi[c] ? b : hi[c];
    }
}

DpSync *dpsync_build(const AdResult *ad, int64_t dp, int zero, int64_t ep, const char **err) {
  IrModule *m = ad->m;
  Arena *arena = m->arena;
  if (zero < 0 || zero > 3 || dp < 1) {
    *err = "ZeRO stage must be 0 to 3 and dp at least 1";
    return NULL;
  }
  int64_t *lo = calloc((size_t)ad->nforward + 1, sizeof(int64_t)), *hi = calloc((size_t)ad->nforward + 1, sizeof(int64_t));
  layer_ranges(ad, lo, hi);
  DpSync *s = arena_alloc(arena, sizeof *s);
  s->m = m;
  s->zero = zero;
  s->dp = dp;
  size_t np = (size_t)m->nparams + 1;
  s->param = arena_alloc(arena, sizeof(int) * np);
  s->first = arena_alloc(arena, sizeof(int64_t) * np);
  s->copies = arena_alloc(arena, sizeof(int64_t) * np);
  s->numel = arena_alloc(arena, sizeof(int64_t) * np);
  s->piece = arena_alloc(arena, sizeof(int64_t) * np);
  /* the parameters the forward reads, each over the layers it runs */
  for (int p = 0; p < m->nparams; p++) {
    int64_t a = INT64_MAX, b = 0;
    for (int gi = 0; gi < ad->nforward; gi++)
      for (int i = 0; i < m->graphs[gi]->nnodes; i++) {
        const IrNode *n = &m->graphs[gi]->nodes[i];
        if (n->op != IR_PARAM || n->attr[0] != p || lo[gi] >= hi[gi]) continue;
        a = lo[gi] < a ? lo[gi] : a;
        b = hi[gi] > b ? hi[gi] : b;
      }
    if (a >= b) continue;
    const IrParam *P = &m->params[p];
    int k = s->nargs++;
    s->param[k] = p;
    s->first[k] = P->count > 1 ? a : 0;
    s->copies[k] = P->count > 1 ? b - a : 1;
    s->numel[k] = P->dp_shards ? numel_of(P->dp_rank, P->dp_dims) : numel_of(P->rank, P->dims);
    s->piece[k] = zero >= 2 ? dpsync_piece(s->numel[k], dp_members(P, dp, ep)) : s->numel[k];
  }
  free(lo);
  free(hi);

  IrGraph *g = ir_graph_new(m, "dp.sync");
  g->count = 1;
  g->nargs = s->nargs;
  g->noutputs = s->nargs;
  g->outputs = arena_alloc(arena, sizeof(int) * ((size_t)s->nargs + 1));
  s->graph = m->ngraphs - 1;
  const char *why = NULL;
  /* arguments first: ARG node k is argument k */
  for (int k = 0; k < s->nargs && !why; k++) {
    const IrParam *P = &m->params[s->param[k]];
    int rep = P->count > 1, rank = P->rank + rep;
    int64_t dims[IR_MAX_RANK + 1], index = k;
    dims[0] = s->copies[k];
    memcpy(dims + rep, P->dims, sizeof(int64_t) * (size_t)P->rank);
    if (rank > IR_MAX_RANK) {
      why = "a repeated parameter has too many dimensions for its gradient's copies axis";
      break;
    }
    int a = ir_add(g, IR_ARG, NULL, 0, &index, 1, 0, P->dtype, rank, dims, &why);
    if (a >= 0) g->nodes[a].name = P->name;
  }
  int mean = why ? -1 : ir_add(g, IR_CONST, NULL, 0, NULL, 0, 1.0 / (double)dp, DT_F32, -1, NULL, &why);
  for (int k = 0; k < s->nargs && !why; k++) {
    const IrParam *P = &m->params[s->param[k]];
    int rep = P->count > 1, x = k;
    int64_t members = dp_members(P, dp, ep);
    if (zero <= 1) {
      /* an expert's gradient is summed over the ranks holding that expert */
      int64_t attr[4] = {dp_group(P), 0, 0, 0};
      x = ir_add(g, IR_ALL_REDUCE, &x, 1, attr, 4, 0, P->dtype, -1, NULL, &why);
    } else if (zero == 2) {
      /* [copies, numel] flat, padded to [copies, s*dp], scattered along the flat axis */
      int64_t flat[2] = {s->copies[k], s->numel[k]}, padded[2] = {s->copies[k], s->piece[k] * members};
      int64_t mine[2] = {s->copies[k], s->piece[k]};
      if (P->rank != 1) x = ir_add(g, IR_RESHAPE, &x, 1, NULL, 0, 0, P->dtype, 1 + rep, flat + !rep, &why);
      if (x >= 0 && padded[1] != flat[1]) {
        int64_t at[8] = {0};
        x = ir_add(g, IR_PAD, &x, 1, at, 8, 0, P->dtype, 1 + rep, padded + !rep, &why);
      }
      int64_t attr[4] = {dp_group(P), rep, 0, 0};
      if (x >= 0) x = ir_add(g, IR_REDUCE_SCATTER, &x, 1, attr, 4, 0, P->dtype, 1 + rep, mine + !rep, &why);
    }
    /* zero 3: the backward's reduce-scatters summed the pieces already */
    if (x >= 0) {
      int in[2] = {x, mean};
      x = ir_add(g, IR_MUL, in, 2, NULL, 0, 0, P->dtype, -1, NULL, &why);
    }
    if (x >= 0) g->outputs[k] = x;
  }
  if (why) {
    *err = why;
    return NULL;
  }
  return s;
}

void dpsync_print(const DpSync *s, FILE *out) {
  static const char *const what[] = {"all-reduce", "all-reduce (ZeRO-1 shards only the optimizer state)",
                                     "reduce-scatter of flat pieces", "pieces reduce-scattered by the backward"};
  fprintf(out, "# dp.sync: once per step, after the micro-batches: zero %d over dp=%" PRId64 ": %s, then the mean\n", s->zero,
          s->dp, what[s->zero]);
  ir_print_graph(s->m, s->m->graphs[s->graph], out);
  for (int k = 0; k < s->nargs; k++) {
    const IrParam *P = &s->m->params[s->param[k]];
    fprintf(out, "sync %%%d = d %s", k, P->name);
    if (P->count > 1) fprintf(out, " layers %" PRId64 "..%" PRId64, s->first[k], s->first[k] + s->copies[k] - 1);
    if (s->piece[k] != s->numel[k]) fprintf(out, " -> piece of %" PRId64 " of %" PRId64 " values per copy", s->piece[k], s->numel[k]);
    fputc('\n', out);
  }
}
