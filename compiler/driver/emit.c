/* emit.c - `hpdlc emit` views of the per-rank program (emit.h). */
#include "emit.h"

#include <inttypes.h>

#include "autodiff.h"
#include "fbsplit.h"
#include "pipeline.h"
#include "plan.h"
#include "spmd.h"

int emit_stash(Arena *arena, Diag *diag, const SemModel *model, const IrModule *global, FILE *out) {
  const SemLayout *L = &model->layout;
  SpmdSpec spec = {L->tp > 0 ? L->tp : 1, L->cp > 0 ? L->cp : 1, L->sp == 1, model->seq_len};
  IrModule *part = spmd_partition(arena, diag, global, &spec);
  int64_t pp = L->pp > 0 ? L->pp : 1, v = L->virtual_stages > 0 ? L->virtual_stages : 1;
  Recompute policy = L->recompute < 0 ? RECOMPUTE_NONE : (Recompute)L->recompute;
  const char *split_why = NULL;
  int64_t *split = part ? plan_chunk_layers(arena, model, model->train.micro_batch, spec.tp, spec.cp, spec.sp, policy, pp * v, &split_why) : NULL;
  if (part && !split) {
    fprintf(stderr, "hpdlc: the pipeline stages cannot be split: %s\n", split_why);
    return 1;
  }
  PipeResult *pr = split ? pipe_split(arena, diag, part, pp * v, split) : NULL;
  if (!pr) return 1;
  fprintf(out, "# forward / backward cut of each chunk's step: tp=%" PRId64 " cp=%" PRId64 " pp=%" PRId64 " v=%" PRId64
               ", recompute %s\n",
          spec.tp, spec.cp, pp, v, sem_recompute_name(policy));
  int status = 0;
  for (int c = 0; c < pr->nchunks; c++) {
    IrModule *cm = pipe_chunk_module(arena, pr, c);
    const char *why = NULL;
    AdResult *ad = ad_build(cm, policy, &why);
    if (!ad) {
      fprintf(stderr, "hpdlc: chunk %d cannot be differentiated: %s\n", c, why ? why : "?");
      return 1;
    }
    const IrGraph *g = cm->graphs[ad->step];
    if (ir_verify(cm, stderr) || ir_verify_pipeline_cut(g, stderr)) {
      fprintf(stderr, "hpdlc: internal error: chunk %d's step does not verify\n", c);
      status = 3;
    }
    FbStash s;
    if (fb_stash(arena, cm, g, &s) == 0) {
      fprintf(out, "chunk %d (pipeline rank %" PRId64 "): ", c, c % pp);
      fb_print(cm, g, &s, out);
    }
  }
  return status;
}
