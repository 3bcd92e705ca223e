/* optim.c - the update rules and the schedule. */
#include "optim.h"

#include <math.h>
#include <string.h>

void optim_defaults(OptimConfig *c) {
  memset(c, 0, sizeof *c);
  c->kind = OPTIM_ADAMW;
  c->lr = 3e-4;
  c->beta1 = 0.9;
  c->beta2 = 0.999;
  c->eps = 1e-8;
  c->decay = OPTIM_DECAY_NONE;
  c->total_steps = 1000;
}

int optim_kind_parse(const char *s) { return !strcmp(s, "sgd") ? OPTIM_SGD : !strcmp(s, "adamw") ? OPTIM_ADAMW : -1; }

int optim_decay_parse(const char *s) {
  return !strcmp(s, "none") ? OPTIM_DECAY_NONE : !strcmp(s, "cosine") ? OPTIM_DECAY_COSINE : !strcmp(s, "linear") ? OPTIM_DECAY_LINEAR : -1;
}

const char *optim_kind_name(OptimKind k) { return k == OPTIM_SGD ? "sgd" : "adamw"; }
const char *optim_decay_name(OptimDecay d) { return d == OPTIM_DECAY_COSINE ? "cosine" : d == OPTIM_DECAY_LINEAR ? "linear" : "none"; }

double optim_lr_at(const OptimConfig *c, int64_t step) {
  if (step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
  int64_t span = c->total_steps - c->warmup;
  double q = (double)(step - c->warmup) / (double)(span > 1 ? span : 1);
  if (q > 1) q = 1;
  if (q < 0) q = 0;
  switch (c->decay) {
  case OPTIM_DECAY_NONE: return c->lr;
  case OPTIM_DECAY_LINEAR: return c->lr - (c->lr - c->min_lr) * q;
  case OPTIM_DECAY_COSINE: return c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(M_PI * q));
  }
  return c->lr;
}

void optim_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr, double wd,
                 const OptimConfig *c) {
  /* Per-step scalars in double, per-element arithmetic in float (as the
   * fused kernels of llm.c and PyTorch do). */
  const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
  const float bc1 = (float)(1.0 - pow(c->beta1, (double)t)), bc2 = (float)(1.0 - pow(c->beta2, (double)t));
  const float decay = (float)(1.0 - lr * wd), step = (float)lr;
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    p[i] = p[i] * decay - step * mhat / (sqrtf(vhat) + eps);
  }
}

void optim_sgd(float *p, const float *g, float *buf, int64_t n, int64_t t, double lr, double wd, const OptimConfig *c) {
  const float mu = (float)c->momentum, w = (float)wd, step = (float)lr;
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] + w * p[i];
    if (mu != 0.0f) {
      gi = t <= 1 ? gi : mu * buf[i] + gi;
      buf[i] = gi;
    }
    p[i] -= step * gi;
  }
}

double optim_sumsq(const float *g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
  return s;
}

double optim_clip_scale(double norm, double clip) {
  if (clip <= 0 || !(norm > clip)) return 1.0;
  return clip / (norm + 1e-6);
}

void optim_scale(float *g, int64_t n, double s) {
  if (s == 1.0) return;
  const float f = (float)s;
  for (int64_t i = 0; i < n; i++) g[i] *= f;
}
