/* headloss.c - the head's GEMM and the cross-entropy as one op (headloss.h). */
#include "headloss.h"

#include <string.h>

/* A fusable cross-entropy at node c: its logits a GEMM x @ B read by the
 * loss alone, B a [C, V] weight or a [V, C] table read transposed (the GEMM's
 * flag, or a transpose of the table). Sets x, w, whether w is the table
 * (rows), and the transpose to drop (-1 none). */
static int match(const IrGraph *g, const int *readers, const char *is_out, int c, int *x, int *w, int *rows, int *tr) {
  const IrNode *ce = &g->nodes[c];
  if (ce->op != IR_CROSS_ENTROPY || ce->nin != 2) return 0;
  int z = ce->in[0];
  const IrNode *mm = &g->nodes[z];
  if (mm->op != IR_MATMUL || mm->attr[0] || readers[z] != 1 || is_out[z]) return 0;
  const IrNode *a = &g->nodes[mm->in[0]], *b = &g->nodes[mm->in[1]], *t = &g->nodes[ce->in[1]];
  if (b->rank != 2 || a->rank < 2 || a->rank != t->rank + 1 || a->dtype != DT_F32 || b->dtype != DT_F32) return 0;
  *x = mm->in[0];
  *tr = -1;
  if (mm->attr[1]) {
    *w = mm->in[1], *rows = 1;
  } else if (b->op == IR_TRANSPOSE && b->attr[0] == 1 && b->attr[1] == 0 && g->nodes[b->in[0]].rank == 2) {
    *w = b->in[0], *rows = 1;
    if (readers[mm->in[1]] == 1 && !is_out[mm->in[1]]) *tr = mm->in[1];
  } else {
    *w = mm->in[1], *rows = 0;
  }
  return g->nodes[*w].dtype == DT_F32;
}

static int fuse_graph(IrGraph *g, const char **why) {
  int n = g->nnodes;
  Arena *a = g->arena;
  int *readers = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  char *is_out = arena_alloc(a, (size_t)n + 1), *drop = arena_alloc(a, (size_t)n + 1);
  int *fx = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *fw = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *frows = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  char *fused = arena_alloc(a, (size_t)n + 1);
  memset(readers, 0, sizeof(int) * (size_t)(n + 1));
  memset(is_out, 0, (size_t)n + 1);
  memset(drop, 0, (size_t)n + 1);
  memset(fused, 0, (size_t)n + 1);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) {
      int dup = 0;
      for (int j = 0; j < k; j++) dup |= g->nodes[i].in[j] == g->nodes[i].in[k];
      if (!dup) readers[g->nodes[i].in[k]]++;
    }
  for (int k = 0; k < g->noutputs; k++) is_out[g->outputs[k]] = 1;
  int count = 0;
  for (int c = 0; c < n; c++) {
    int tr;
    if (!match(g, readers, is_out, c, &fx[c], &fw[c], &frows[c], &tr)) continue;
    fused[c] = 1;
    drop[g->nodes[c].in[0]] = 1;
    if (tr >= 0) drop[tr] = 1;
    count++;
  }
  if (!count) return 0;
  /* rebuild in order: the loss's three nodes where the loss was */
  IrNode *old = arena_alloc(a, sizeof(IrNode) * (size_t)(n + 1));
  int *map = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  memcpy(old, g->nodes, sizeof(IrNode) * (size_t)n);
  g->nnodes = 0;
  for (int i = 0; i < n; i++) {
    map[i] = -1;
    if (drop[i]) continue;
    if (!fused[i]) {
      map[i] = ir_add_copy(g, &old[i], map);
      continue;
    }
    const IrNode *ce = &old[i];
    int in[3] = {map[fx[i]], map[fw[i]], map[ce->in[1]]};
    int64_t attr[1] = {frows[i]};
    int nll = ir_add(g, IR_LINEAR_CE, in, 3, attr, 1, 0, DT_F32, -1, NULL, why);
    if (nll < 0) return -1;
    int64_t rows = ir_numel(&g->nodes[nll]), mattr[2] = {0, 0};
    int flat = ir_add(g, IR_RESHAPE, &nll, 1, NULL, 0, 0, DT_F32, 1, &rows, why);
    int mean = flat < 0 ? -1 : ir_add(g, IR_REDUCE_MEAN, &flat, 1, mattr, 2, 0, ce->dtype, -1, NULL, why);
    if (mean < 0) return -1;
    g->nodes[nll].span = g->nodes[flat].span = g->nodes[mean].span = ce->span;
    g->nodes[mean].name = ce->name;
    map[i] = mean;
  }
  for (int k = 0; k < g->noutputs; k++) g->outputs[k] = map[g->outputs[k]];
  return count;
}

/* The vocab-parallel form (spmd.c's fused_vocab_ce) leaves the shard's logits
 * GEMM, and the transpose of the table it read, with no reader. */
static int dead_gemm_op(IrOp op) { return op == IR_MATMUL || op == IR_TRANSPOSE || op == IR_RESHAPE; }

int headloss_fuse(IrModule *m, const char **why) {
  int total = 0;
  for (int gi = 0; gi < m->ngraphs; gi++) {
    int k = fuse_graph(m->graphs[gi], why);
    if (k < 0) return -1;
    total += k;
    ir_drop_unread(m->graphs[gi], dead_gemm_op);
  }
  return total;
}
