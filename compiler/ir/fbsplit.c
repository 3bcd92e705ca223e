/* fbsplit.c - the forward / backward cut of a training step (fbsplit.h). */
#include "fbsplit.h"

#include <inttypes.h>
#include <string.h>


/* Bytes a SAVE call keeps: per layer its arguments and the callee's outputs
 * 1.., times the layers (interp.c's Stash and codegen's StashLayout). */
static int64_t save_bytes(const IrModule *m, const IrGraph *g, const IrNode *call) {
  const IrGraph *callee = m->graphs[call->attr[0]];
  int64_t per = 0;
  for (int k = 0; k < call->nin; k++) per += ir_bytes(&g->nodes[call->in[k]]);
  for (int k = 1; k < callee->noutputs - callee->ngrad_params; k++) per += ir_bytes(&callee->nodes[callee->outputs[k]]);
  return per * call->attr[1];
}

int fb_stash(Arena *arena, const IrModule *m, const IrGraph *g, FbStash *out) {
  memset(out, 0, sizeof *out);
  if (g->fb_split <= 0) return -1;
  int n = g->nnodes, split = g->fb_split;
  char *read = arena_alloc(arena, (size_t)n + 1);
  for (int i = split; i < n; i++)
    for (int k = 0; k < g->nodes[i].nin; k++)
      if (g->nodes[i].in[k] < split) read[g->nodes[i].in[k]] = 1;
  out->split = split;
  out->values = arena_alloc(arena, sizeof(int) * (size_t)(n + 1));
  out->saves = arena_alloc(arena, sizeof(int) * (size_t)(n + 1));
  out->leaves = arena_alloc(arena, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < split; i++) {
    const IrNode *x = &g->nodes[i];
    if (!read[i] || x->op == IR_PARAM || x->op == IR_CONST) continue;
    if (x->op == IR_INPUT || x->op == IR_ARG) {
      out->leaves[out->nleaves++] = i;
    } else if (x->op == IR_CALL && x->attr[2] == IR_CALL_SAVE) {
      /* a BACKWARD call in B reads it: its activations, and output 0 if B reads that too */
      out->saves[out->nsaves++] = i;
      out->save_bytes += save_bytes(m, g, x);
      for (int j = split; j < n; j++)
        if (g->nodes[j].op != IR_CALL || g->nodes[j].attr[2] != IR_CALL_BACKWARD || g->nodes[j].nin < 2 || g->nodes[j].in[1] != i)
          for (int k = 0; k < g->nodes[j].nin; k++)
            if (g->nodes[j].in[k] == i) {
              out->value_bytes += ir_bytes(x);
              j = n;
              break;
            }
    } else {
      out->values[out->nvalues++] = i;
      out->value_bytes += ir_bytes(x);
    }
  }
  return 0;
}

static void print_type(const IrNode *n, FILE *out) {
  fprintf(out, "%s[", sem_dtype_name(n->dtype));
  for (int i = 0; i < n->rank; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", n->dims[i]);
  fputc(']', out);
}

void fb_print(const IrModule *m, const IrGraph *g, const FbStash *s, FILE *out) {
  fprintf(out, "graph %s: forward %%0..%%%d (%d nodes), backward %%%d..%%%d (%d nodes)\n", g->name, s->split - 1, s->split, s->split,
          g->nnodes - 1, g->nnodes - s->split);
  fprintf(out, "  stash values (%d):", s->nvalues);
  for (int k = 0; k < s->nvalues; k++) {
    const IrNode *x = &g->nodes[s->values[k]];
    fprintf(out, "%s %%%d %s ", k ? "," : "", s->values[k], ir_op_name(x->op));
    print_type(x, out);
    if (x->name) fprintf(out, " (%s)", x->name);
  }
  fputc('\n', out);
  for (int k = 0; k < s->nsaves; k++) {
    const IrNode *c = &g->nodes[s->saves[k]];
    fprintf(out, "  stash of %%%d call %s x %" PRId64 ": %" PRId64 " bytes\n", s->saves[k], m->graphs[c->attr[0]]->name, c->attr[1],
            save_bytes(m, g, c));
  }
  fprintf(out, "  read again:");
  for (int k = 0; k < s->nleaves; k++) {
    const IrNode *x = &g->nodes[s->leaves[k]];
    if (x->op == IR_INPUT) fprintf(out, "%s input %s", k ? "," : "", m->inputs[x->attr[0]].name);
    else fprintf(out, "%s argument #%" PRId64 "%s%s%s", k ? "," : "", x->attr[0], x->name ? " (" : "", x->name ? x->name : "", x->name ? ")" : "");
  }
  fprintf(out, "\n  per micro-batch in flight: %" PRId64 " bytes (values %" PRId64 ", saved activations %" PRId64 ")\n",
          s->value_bytes + s->save_bytes, s->value_bytes, s->save_bytes);
}
