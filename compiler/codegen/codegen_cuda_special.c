/* codegen_cuda_special.c - the CUDA back end's special kernels: the ops
 * that fusion gives a kernel of their own (fuse.h: embedding and its
 * backward, rope, cross-entropy and its backward, pick, repeat_kv_bwd, a
 * multi-group sum_to, extern calls). */
#include <inttypes.h>
#include <string.h>

#include "codegen_cuda_int.h"

int cu_special(CuKern *k) {
  CuText *o = &k->t->src;
  const IrGraph *g = k->fg->graph;
  cu_tx(o, "/* %s: special", k->base);
  for (int j = 0; j < k->K->nnodes; j++) cu_tx(o, " %s", ir_op_name(g->nodes[k->K->nodes[j]].op));
  cu_tx(o, ": not generated yet */\n\n");
  k->t->nspecial++;
  return 0;
}
