/* pipeline.c - model chunks for pipeline parallelism (see pipeline.h). */
#include "pipeline.h"

#include <inttypes.h>
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

int pipe_balance(int64_t repeat, int64_t chunks, double t_first, double t_layer, double t_last, int64_t *out) {
  if (chunks < 1 || repeat < chunks) return -1;
  if (!(t_layer > 0) || !(t_first >= 0) || !(t_last >= 0)) { /* no usable price: split by count */
    t_layer = 1;
    t_first = t_last = 0;
  }
  for (int64_t c = 0; c < chunks; c++) out[c] = 1;
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

static int single_call(const IrGraph *g0, int *ncalls) {
  int call = -1;
  *ncalls = 0;
  for (int i = 0; i < g0->nnodes; i++)
    if (g0->nodes[i].op == IR_CALL) call = i, ++*ncalls;
  return call;
}

int64_t pipe_repeat_count(const IrModule *m) {
  int ncalls = 0;
  int call = m && m->ngraphs > 0 ? single_call(m->graphs[0], &ncalls) : -1;
  return call >= 0 && ncalls == 1 ? m->graphs[0]->nodes[call].attr[1] : 0;
}

PipeResult *pipe_split(Arena *arena, Diag *diag, const IrModule *m, int64_t chunks, const int64_t *split) {
  PipeResult *r = arena_alloc(arena, sizeof *r);
  if (chunks <= 1) {
    r->m = (IrModule *)m;
    r->nchunks = 1;
    r->layers = arena_alloc(arena, sizeof(int64_t));
    r->first = arena_alloc(arena, sizeof(int64_t));
    r->layers[0] = pipe_repeat_count(m);
    r->first[0] = 0;
    return r;
  }
  const IrGraph *g0 = m->graphs[0];
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
  if (!split && layers % chunks) {
    diag_error(diag, cn->span, "%" PRId64 " layers do not divide into %" PRId64 " equal pipeline chunks", layers, chunks);
    return NULL;
  }
  int64_t sum = 0;
  for (int64_t c = 0; c < chunks; c++) {
    nl[c] = split ? split[c] : layers / chunks;
    first[c] = sum;
    sum += nl[c];
    if (nl[c] < 1) {
      diag_error(diag, cn->span, "pipeline chunk %" PRId64 " would run %" PRId64 " layers; every chunk needs at least one", c, nl[c]);
      return NULL;
    }
  }
  if (sum != layers) {
    diag_error(diag, cn->span, "the pipeline chunks run %" PRId64 " layers, but the model has %" PRId64, sum, layers);
    return NULL;
  }
  Pipe P = {arena, diag, m, ir_module_new(arena), 0};
  P.dst->micro_batch = m->micro_batch;
  P.dst->inputs = m->inputs;
  P.dst->ninputs = m->ninputs;
  P.dst->externs = m->externs;
  P.dst->nexterns = m->nexterns;
  for (int i = 0; i < m->nparams; i++) ir_add_param(P.dst, &m->params[i]);
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
    /* the chunk's layers: the block graph from layer first[c] on */
    int in[16];
    in[0] = x;
    int nin = cn->nin < 16 ? cn->nin : 16;
    for (int k = 1; k < nin; k++) {
      const IrNode *other = &g0->nodes[cn->in[k]];
      in[k] = map[cn->in[k]] >= 0 ? map[cn->in[k]] : copy_node(&P, out, other, map, offset);
    }
    int64_t attr[4] = {cn->attr[0] + offset, nl[c], cn->attr[2], first[c]};
    int y = ir_add(out, IR_CALL, in, nin, attr, 4, 0, cn->dtype, cn->rank, cn->dims, NULL);
    if (y < 0) {
      P.failed = 1;
      break;
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
  for (int i = 1; i < m->ngraphs; i++) {
    IrGraph *copy = ir_graph_new(P.dst, m->graphs[i]->name);
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
  r->m = P.dst;
  r->nchunks = (int)chunks;
  r->layers = nl;
  r->first = first;
  return r;
}

/* A module whose graph 0 is pipeline chunk c; the others report a zero loss
 * (their output feeds only a SEND, whose gradient arrives by RECV). */
IrModule *pipe_chunk_module(Arena *arena, const PipeResult *pr, int c) {
  const IrModule *src = pr->m;
  IrModule *cm = ir_module_new(arena);
  cm->micro_batch = src->micro_batch;
  cm->inputs = src->inputs;
  cm->ninputs = src->ninputs;
  cm->externs = src->externs;
  cm->nexterns = src->nexterns;
  for (int i = 0; i < src->nparams; i++) ir_add_param(cm, &src->params[i]);
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
