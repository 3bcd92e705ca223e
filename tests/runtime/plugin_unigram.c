/* plugin_unigram.c - a program loaded the way compiled ones are: a shared
 * object exporting hpdl_program_v1 (train.h). It uses nothing of libhpdlrt
 * but the structures, as generated code will.
 *
 * unigram: logits = b (one [V] parameter "unigram.logits", every position
 * alike), softmax cross-entropy against the targets; data-parallel only. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train.h"

typedef struct {
  TrainTensor *b;
  int64_t vocab;
} Unigram;

static Unigram the; /* one program per process */

static void *uni_create(TrainCtx *ctx, RtErr *e) {
  for (int i = 0; i < ctx->ntensors; i++)
    if (!strcmp(ctx->tensors[i].name, "unigram.logits")) the.b = &ctx->tensors[i];
  if (!the.b || the.b->rank != 1 || ctx->art->layout.tp != 1) {
    snprintf(e->msg, sizeof e->msg, "unigram: needs the parameter unigram.logits [V] and tp = 1");
    return NULL;
  }
  the.vocab = the.b->shape[0];
  return &the;
}

static int uni_step(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss, RtErr *e) {
  Unigram *u = self;
  const float *b = u->b->data;
  float *g = u->b->grad;
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < u->vocab; j++) m = b[j] > m ? b[j] : m;
  for (int64_t j = 0; j < u->vocab; j++) s += exp(b[j] - m);
  double total = 0;
  for (int k = 0; k < nmicro; k++) {
    int64_t bt = micro[k]->batch * micro[k]->seq_len;
    double coef = ctx->grad_scale / (double)bt, l = 0;
    for (int64_t p = 0; p < bt; p++) {
      int32_t t = micro[k]->targets[p];
      if (t < 0 || t >= u->vocab) {
        snprintf(e->msg, sizeof e->msg, "unigram: target %d outside the vocabulary", t);
        return -1;
      }
      l += log(s) + m - b[t];
      g[t] -= (float)coef;
    }
    for (int64_t j = 0; j < u->vocab; j++) g[j] += (float)(coef * (double)bt * exp(b[j] - m) / s);
    total += l / (double)bt;
  }
  *loss = total / nmicro;
  *has_loss = 1;
  return 0;
}

static void uni_destroy(void *self) { (void)self; }

static const TrainProgram program = {TRAIN_PROGRAM_ABI, "unigram", 0, uni_create, uni_step, uni_destroy, NULL, NULL, NULL, NULL};

const TrainProgram *hpdl_program_v1(void);
const TrainProgram *hpdl_program_v1(void) { return &program; }
