/* emit.c - `hpdlc emit` views of the per-rank program (emit.h). */
#include "emit.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "codegen.h"
#include "codegen_cuda.h"
#include "fbsplit.h"
#include "fuse.h"
#include "pipeline.h"
#include "plan.h"
#include "precision.h"
#include "sim.h"
#include "spmd.h"

SimLayout emit_declared_layout(const SemModel *m) {
  const SemLayout *L = &m->layout;
  SimLayout sl = {L->dp > 0 ? L->dp : 1, L->tp > 0 ? L->tp : 1, L->pp > 0 ? L->pp : 1, L->cp > 0 ? L->cp : 1,
                  L->virtual_stages > 0 ? L->virtual_stages : 1, L->sp == 1,
                  L->recompute < 0 ? RECOMPUTE_NONE : (Recompute)L->recompute, m->train.micro_batch, 1, 0, SCHED_1F1B, L->ep > 1 ? L->ep : 1, 0,
                  L->vocab_pad, L->fused_ce == 1, L->ep_fold, L->cp_comm == 1};
  return sl;
}

SpmdSpec emit_declared_spec(const SemModel *m) {
  SimLayout sl = emit_declared_layout(m);
  SpmdSpec spec = {sl.tp, sl.cp, sl.sp, m->seq_len, sl.ep, sl.vocab_pad, m->layout.fused_ce == 1, sl.ep_fold, sl.cp_ring};
  return spec;
}

int emit_stash(Arena *arena, Diag *diag, const SemModel *model, const IrModule *global, FILE *out) {
  SimLayout sl = emit_declared_layout(model);
  SpmdSpec spec = emit_declared_spec(model);
  IrModule *part = spmd_partition(arena, diag, global, &spec);
  int64_t pp = sl.pp, v = sl.vpp;
  Recompute policy = sl.recompute;
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
    AdResult *ad = ad_build_layers(cm, policy, model->layout.recompute_layers, &why);
    if (!ad) {
      fprintf(stderr, "hpdlc: chunk %d cannot be differentiated: %s\n", c, why ? why : "?");
      return 1;
    }
    /* the stash the CPU target keeps: 16-bit under mixed precision (precision.h) */
    if (prec_apply(cm, ad, prec_storage(model->train.precision), NULL, &why) < 0) {
      fprintf(stderr, "hpdlc: chunk %d: 16-bit storage: %s\n", c, why ? why : "?");
      return 3;
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

static const char *source_path(void *diag, int file) { return diag_file_path(diag, file); }

int emit_cuda(Arena *arena, Diag *diag, const char *path, const SemModel *m, int stage, int fusion, FILE *out) {
  SimLayout sl = emit_declared_layout(m);
  int64_t chunks = sl.pp * sl.vpp;
  if (stage >= chunks) {
    fprintf(stderr, "hpdlc: %s: --stage %d: the layout has %" PRId64 " pipeline stage%s (0..%" PRId64 ")\n", path, stage, chunks,
            chunks == 1 ? "" : "s", chunks - 1);
    return 1;
  }
  const char *why = NULL;
  PrecTarget pt = cg_cuda_prec_target(NULL); /* as compile --target cuda stores it */
  SimRankProgram *rp = sim_rank_program(arena, diag, m, &sl, stage, &pt, &why);
  if (!rp) {
    fprintf(stderr, "hpdlc: %s: stage %d does not build: %s\n", path, stage, why ? why : "?");
    return 1;
  }
  FuseResult *fr = fuse_module_opts(arena, rp->module, fuse_options(1, fusion)); /* as compile --target cuda */
  if (fuse_check(fr, stderr)) {
    fprintf(stderr, "hpdlc: internal error: the fusion does not check\n");
    return 3;
  }
  const CgBackend *be = cg_backend("cuda");
  char err[256] = "";
  CgOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.moments16 = m->train.moments_bf16; /* as compile --target cuda */
  opt.source_path = source_path;
  opt.source_ctx = diag;
  CgTarget *t = be->create(rp->module, fr, &opt, err, sizeof err);
  if (!t) {
    fprintf(stderr, "hpdlc: %s: the CUDA back end cannot start: %s\n", path, err);
    return 3;
  }
  int rc = be->generate(t);
  char *src = be->dump(t);
  fputs(src, out);
  free(src);
  int gemms = 0, specials = 0;
  int pending = cg_cuda_pending(t, &gemms, &specials);
  int status = 0;
  if (rc && pending < 0) {
    fprintf(stderr, "hpdlc: %s: the CUDA back end failed: %s\n", path, be->error(t));
    status = 3;
  } else {
    fprintf(out, "/* stage %d: %d CUDA kernels generated; %d GEMMs for cuBLASLt; %d kernels not generated (extern calls) */\n",
            stage, be->stats(t)->kernels, gemms, specials);
  }
  be->destroy(t);
  return status;
}
