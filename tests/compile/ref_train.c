/* ref_train.c - the reference for the compiled artifacts' end-to-end tests:
 * the unpartitioned model, lowered from the .hpd source and run by the
 * reference executor (interp.h, fp64) on one process, trained for N steps
 * the way docs/runtime.md describes the runtime's step (written out here
 * again, so that the runtime's loop is checked too):
 *
 *   hpdl_compile_ref FILE.hpd ARTIFACT DATA STEPS [-D NAME=VALUE]...
 *
 * The artifact gives what the compiled job trains with (seed, optimizer,
 * micro batch, micro-batches x dp per step, each parameter's weight decay);
 * the model comes from the source with the same -D. Parameters start from
 * the runtime's fp32 initialisation (init.h) and are kept in fp32 (the
 * master weights); per step: the global batch's micro-batches in stream
 * order (data.h: the same windows at any layout), gradients accumulated in
 * fp64 with seed 1/M and narrowed to fp32 once, the global norm, clipping,
 * AdamW / SGD of optim.h. Prints one JSON line per step: step (from 1),
 * loss (before the update), grad_norm. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "autodiff.h"
#include "data.h"
#include "init.h"
#include "interp.h"
#include "loader.h"
#include "lower.h"
#include "optim.h"
#include "sema.h"

static int die(const char *what) {
  fprintf(stderr, "hpdl_compile_ref: %s\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 5) return die("usage: hpdl_compile_ref FILE.hpd ARTIFACT DATA STEPS [-D NAME=VALUE | -L SETTING=VALUE]...");
  const char *file = argv[1], *dir = argv[2], *data = argv[3];
  int64_t steps = strtoll(argv[4], NULL, 10);
  RtErr e;
  Artifact *a = artifact_load(dir, &e);
  if (!a) return die(e.msg);
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  /* -D: model parameters; -L: settings of the parallel block (the layout the
   * file declares must check, though the reference runs on one rank) */
  SemDefine defs[32], lays[32];
  int nd = 0, nl = 0;
  for (int i = 5; i + 1 < argc && nd < 32 && nl < 32; i += 2) {
    int layout = !strcmp(argv[i], "-L");
    if (!layout && strcmp(argv[i], "-D")) return die("expected -D NAME=VALUE or -L SETTING=VALUE");
    const char *eq = strchr(argv[i + 1], '=');
    if (!eq) return die("expected -D NAME=VALUE or -L SETTING=VALUE");
    SemDefine *d = layout ? &lays[nl++] : &defs[nd++];
    d->name = arena_strndup(arena, argv[i + 1], (size_t)(eq - argv[i + 1]));
    d->value = eq + 1;
    d->flag = NULL;
  }
  LoadedProgram prog = load_program(arena, diag, file);
  int bad = 0;
  SemOptions opts = {defs, nd, lays, nl, NULL, &bad};
  SemModel *m = diag_error_count(diag) ? NULL : sema_check(arena, diag, &prog, &opts);
  if (!m) return die("the model does not check");
  const int64_t mb = a->micro_batch, M = a->layout.dp * a->num_micro_batches;
  IrModule *g = lower_model(arena, diag, m, mb);
  if (!g) return die("the model does not lower");
  const char *why = NULL;
  AdResult *ad = ad_build(g, RECOMPUTE_NONE, &why);
  if (!ad) return die(why);
  Interp *in = interp_new(g);
  interp_init_params(in, (uint64_t)a->seed); /* the seed of dropout's masks, as the program */

  /* fp32 master weights and optimizer state, per parameter copy */
  int np = g->nparams;
  float **W = calloc((size_t)np, sizeof *W), **G = calloc((size_t)np, sizeof *G);
  float **Mo = calloc((size_t)np, sizeof *Mo), **Vo = calloc((size_t)np, sizeof *Vo);
  int64_t *numel = calloc((size_t)np, sizeof *numel), *copies = calloc((size_t)np, sizeof *copies);
  int *decay = calloc((size_t)np, sizeof *decay);
  for (int p = 0; p < np; p++) {
    const IrParam *P = &g->params[p];
    numel[p] = 1;
    for (int k = 0; k < P->rank; k++) numel[p] *= P->dims[k];
    copies[p] = P->count > 1 ? P->count : 1;
    size_t n = (size_t)(numel[p] * copies[p]);
    W[p] = calloc(n, sizeof(float));
    G[p] = calloc(n, sizeof(float));
    Mo[p] = calloc(n, sizeof(float));
    Vo[p] = calloc(n, sizeof(float));
    InitSpec spec = {(InitKindRt)P->init.kind, P->init.a, P->init.b};
    ShardSplit whole = shard_whole();
    for (int64_t l = 0; l < copies[p]; l++)
      init_fill_f32_shard(W[p] + l * numel[p], P->rank, P->dims, &whole, &spec, (uint64_t)a->seed, P->name, l);
    decay[p] = P->rank >= 2;
    for (int k = 0; k < a->nparams; k++)
      if (!strcmp(a->params[k].name, P->name)) decay[p] = a->params[k].weight_decay;
  }
  DataConfig dc = {data, mb, a->seq_len, 0, 1, (uint64_t)a->seed, a->shuffle, 0, a->vocab, 0};
  DataLoader *L = data_loader_open(&dc, &e);
  if (!L) return die(e.msg);
  /* the input named targets (else the second) gets the targets, as hpdlc compile feeds them */
  int tgt = 1;
  for (int i = 0; i < 2 && i < g->ninputs; i++)
    if (g->inputs[i].name && !strcmp(g->inputs[i].name, "targets")) tgt = i;
  int64_t bt = mb * a->seq_len;
  double *x = calloc((size_t)bt, sizeof(double)), *y = calloc((size_t)bt, sizeof(double));
  OptimConfig cfg = a->optim;
  cfg.total_steps = steps;
  for (int64_t s = 0; s < steps; s++) {
    for (int p = 0; p < np; p++)
      for (int64_t l = 0; l < copies[p]; l++) {
        double *v = interp_param(in, p, l, NULL);
        for (int64_t k = 0; k < numel[p]; k++) v[k] = (double)W[p][l * numel[p] + k];
      }
    interp_zero_grads(in);
    double loss = 0;
    for (int64_t k = 0; k < M; k++) {
      const DataBatch *b = data_loader_next(L, &e);
      if (!b) return die(e.msg);
      for (int64_t i = 0; i < bt; i++) x[i] = b->inputs[i], y[i] = b->targets[i];
      interp_set_input(in, 1 - tgt, x);
      interp_set_input(in, tgt, y);
      double l = ad_step(in, ad, 1.0 / (double)M, &why);
      if (isnan(l)) return die(why ? why : "the step failed");
      loss += l;
    }
    loss /= (double)M;
    double sumsq = 0;
    for (int p = 0; p < np; p++)
      for (int64_t l = 0; l < copies[p]; l++) {
        const double *gr = interp_grad(in, p, l, NULL);
        float *dst = G[p] + l * numel[p];
        for (int64_t k = 0; k < numel[p]; k++) dst[k] = gr ? (float)gr[k] : 0.0f;
        sumsq += optim_sumsq(dst, numel[p]);
      }
    double norm = sqrt(sumsq), lr = optim_lr_at(&cfg, s), scale = optim_clip_scale(norm, cfg.clip);
    for (int p = 0; p < np; p++) {
      int64_t n = numel[p] * copies[p];
      if (scale != 1.0) optim_scale(G[p], n, scale);
      double wd = decay[p] ? cfg.weight_decay : 0.0;
      /* per copy, as the runtime's tensors (the update is elementwise) */
      if (cfg.kind == OPTIM_ADAMW) optim_adamw(W[p], G[p], Mo[p], Vo[p], n, s + 1, lr, wd, &cfg);
      else optim_sgd(W[p], G[p], Mo[p], n, s + 1, lr, wd, &cfg);
    }
    printf("{\"step\": %" PRId64 ", \"loss\": %.17g, \"grad_norm\": %.17g}\n", s + 1, loss, norm);
    fflush(stdout);
  }
  data_loader_close(L);
  for (int p = 0; p < np; p++) {
    free(W[p]);
    free(G[p]);
    free(Mo[p]);
    free(Vo[p]);
  }
  free(W);
  free(G);
  free(Mo);
  free(Vo);
  free(numel);
  free(copies);
  free(decay);
  free(x);
  free(y);
  interp_free(in);
  diag_free(diag);
  arena_free(arena);
  artifact_free(a);
  return 0;
}
