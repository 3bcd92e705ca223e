/* fbsplit.h - the training step's forward / backward cut, as a pipeline
 * schedule runs it.
 *
 * autodiff.c cuts the step it builds (forward.grad) structurally: the nodes
 * it copies from the forward come first, the backward after them
 * (IrGraph.fb_split; recomputed activations live in the block backward
 * graphs, so they belong to the backward part). A schedule runs the forward
 * part F of a micro-batch, then other work, then its backward part B; what
 * F made and B reads must outlive the gap: the micro-batch's stash. This
 * module names it: the values defined in F and read in B, the SAVE calls'
 * per-layer activations (kept for their BACKWARD calls), and the model
 * inputs and arguments B reads again. `hpdlc emit stash` prints it per
 * pipeline chunk (emit.c). */
#ifndef HPDL_FBSPLIT_H
#define HPDL_FBSPLIT_H

#include <stdio.h>

#include "arena.h"
#include "ir.h"

typedef struct {
  int split;         /* IrGraph.fb_split */
  int *values;       /* non-leaf nodes of F that B reads (SAVE calls excluded) */
  int nvalues;
  int *saves;        /* SAVE calls whose BACKWARD call is in B */
  int nsaves;
  int *leaves;       /* INPUT / ARG nodes of F that B reads again */
  int nleaves;
  int64_t value_bytes, save_bytes; /* in the IR's dtypes */
} FbStash;

/* The stash of step graph g (g->fb_split > 0) of module m. 0, or -1 when
 * the graph is not cut. */
int fb_stash(Arena *arena, const IrModule *m, const IrGraph *g, FbStash *out);

/* One chunk's step: its cut and stash, in a stable text form. */
void fb_print(const IrModule *m, const IrGraph *g, const FbStash *s, FILE *out);

#endif
