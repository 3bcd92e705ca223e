/* builtin.c - the builtin programs (see builtin.h). */
#include "builtin.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ---- bigram ---- */

typedef struct {
  TrainTensor *w, *b;
  int64_t vocab, vlocal, voff; /* the columns this rank holds: [voff, voff + vlocal) */
  float *logits;               /* B*T x vlocal, in the arena */
  double *mx, *red;            /* B*T maxima; B*T x (sum, target logit) */
} Bigram;

static TrainTensor *find_tensor(TrainCtx *ctx, const char *name) {
  for (int i = 0; i < ctx->ntensors; i++)
    if (!strcmp(ctx->tensors[i].name, name)) return &ctx->tensors[i];
  return NULL;
}

static void *bigram_create(TrainCtx *ctx, RtErr *e) {
  const Artifact *a = ctx->art;
  if (a->layout.pp != 1 || a->layout.cp != 1) {
    rt_fail(e, "the builtin bigram program runs with pp = 1 and cp = 1 (this artifact has pp = %d, cp = %d)", a->layout.pp,
            a->layout.cp);
    return NULL;
  }
  TrainTensor *w = find_tensor(ctx, "bigram.weight"), *b = find_tensor(ctx, "bigram.bias");
  if (!w || !b) {
    rt_fail(e, "the builtin bigram program needs the parameters bigram.weight [V, V] and bigram.bias [V]");
    return NULL;
  }
  const ArtParam *pw = w->param, *pb = b->param;
  int64_t V = pw->shape[0];
  int tp = a->layout.tp;
  if (pw->rank != 2 || pw->shape[1] != V || pb->rank != 1 || pb->shape[0] != V) {
    rt_fail(e, "bigram: bigram.weight must be [V, V] and bigram.bias [V]");
    return NULL;
  }
  if (tp > 1 && (pw->split_axis != 1 || pw->split_group != COMM_TP || pb->split_axis != 0 || pb->split_group != COMM_TP)) {
    rt_fail(e, "bigram: with tp = %d, bigram.weight is split along axis 1 and bigram.bias along axis 0 over tp", tp);
    return NULL;
  }
  if (a->vocab && a->vocab != V) {
    rt_fail(e, "bigram: the vocabulary (inputs.vocab = %" PRId64 ") differs from the weight's %" PRId64, a->vocab, V);
    return NULL;
  }
  int64_t bt = a->micro_batch * a->seq_len, vl = tp > 1 ? V / tp : V;
  int64_t need = bt * vl * (int64_t)sizeof(float) + 3 * bt * (int64_t)sizeof(double);
  if (ctx->arena_bytes < need) {
    rt_fail(e, "bigram: the arena has %" PRId64 " bytes, the program needs %" PRId64 " (ranks[%d].arena_bytes)", ctx->arena_bytes,
            need, ctx->comm->world_rank);
    return NULL;
  }
  Bigram *g = rt_calloc(1, sizeof *g);
  if (!g) {
    rt_fail(e, "out of memory");
    return NULL;
  }
  g->w = w;
  g->b = b;
  g->vocab = V;
  g->vlocal = vl;
  g->voff = tp > 1 ? (int64_t)ctx->comm->rank[COMM_TP] * vl : 0;
  /* The arena holds doubles first (8-byte alignment), then the logits. */
  g->mx = ctx->arena;
  g->red = g->mx + bt;
  g->logits = (float *)(void *)(g->red + 2 * bt);
  return g;
}

static int bigram_step(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss,
                       RtErr *e) {
  Bigram *g = self;
  const int64_t vl = g->vlocal, off = g->voff;
  const float *W = g->w->data, *bias = g->b->data;
  float *dW = g->w->grad, *db = g->b->grad;
  double total = 0;
  for (int k = 0; k < nmicro; k++) {
    const DataBatch *mb = micro[k];
    int64_t bt = mb->batch * mb->seq_len;
    for (int64_t p = 0; p < bt; p++) {
      int64_t x = mb->inputs[p];
      if (x < 0 || x >= g->vocab) return rt_fail(e, "bigram: input token %" PRId64 " outside the vocabulary", x);
      const float *row = W + x * vl;
      float *lg = g->logits + p * vl;
      double m = -INFINITY;
      for (int64_t j = 0; j < vl; j++) {
        lg[j] = row[j] + bias[j];
        if (lg[j] > m) m = lg[j];
      }
      g->mx[p] = m;
    }
    /* Vocabulary-parallel softmax (Megatron-LM's cross entropy): the global
     * maximum, then the sum of exponentials and the target's logit. */
    if (comm_all_reduce(ctx->comm, COMM_TP, COMM_F64, COMM_MAX, g->mx, bt, e) < 0) return -1;
    for (int64_t p = 0; p < bt; p++) {
      const float *lg = g->logits + p * vl;
      double s = 0, m = g->mx[p];
      for (int64_t j = 0; j < vl; j++) s += exp((double)lg[j] - m);
      int64_t t = mb->targets[p] - off;
      g->red[2 * p] = s;
      g->red[2 * p + 1] = (t >= 0 && t < vl) ? lg[t] : 0.0;
    }
    if (comm_all_reduce(ctx->comm, COMM_TP, COMM_F64, COMM_SUM, g->red, 2 * bt, e) < 0) return -1;
    double lsum = 0, coef = ctx->grad_scale / (double)bt;
    for (int64_t p = 0; p < bt; p++) {
      double m = g->mx[p], s = g->red[2 * p];
      lsum += log(s) + m - g->red[2 * p + 1];
      const float *lg = g->logits + p * vl;
      float *drow = dW + (int64_t)mb->inputs[p] * vl;
      int64_t t = mb->targets[p] - off;
      for (int64_t j = 0; j < vl; j++) {
        double d = exp((double)lg[j] - m) / s - (j == t ? 1.0 : 0.0);
        float f = (float)(coef * d);
        drow[j] += f;
        db[j] += f;
      }
    }
    total += lsum / (double)bt;
  }
  *loss = total / (double)nmicro;
  *has_loss = 1;
  return 0;
}

static void bigram_destroy(void *self) { rt_free(self); }

static const TrainProgram bigram = {TRAIN_PROGRAM_ABI, "bigram", 0, bigram_create, bigram_step, bigram_destroy, NULL, NULL, NULL, NULL};

const TrainProgram *builtin_program(const char *name) {
  if (!strcmp(name, "bigram")) return &bigram;
  return NULL;
}
