/* optim.c - the update rules and the schedule. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "par.h"

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

/* The parameters' bf16 copy (half NULL: none), written right after the
 * update while the values are in cache: a pass over the fp32 values less
 * than rounding them before the next step. */
enum { COPY_BLOCK = 2048 }; /* values: 8 KB of each stream, well inside L1 */

static void bf16_copy(const float *p, uint16_t *half, int64_t n) {
  const uint32_t *bits = (const uint32_t *)(const void *)p;
  for (int64_t i = 0; i < n; i++) half[i] = half_bf16_bits(bits[i]);
}

/* AdamW's per-step scalars: in double, rounded once to float (per-element
 * arithmetic in float, as the fused kernels of llm.c and PyTorch do). */
typedef struct {
  float b1, b2, eps, bc1, bc2, decay, step;
} AdamwStep;

static AdamwStep adamw_step(int64_t t, double lr, double wd, const OptimConfig *c) {
  return (AdamwStep){(float)c->beta1, (float)c->beta2, (float)c->eps, (float)(1.0 - pow(c->beta1, (double)t)),
                     (float)(1.0 - pow(c->beta2, (double)t)), (float)(1.0 - lr * wd), (float)lr};
}

/* One value: the moments *m, *v updated in float and the parameter with
 * them (a 16-bit store rounds them after the update, as a fused kernel
 * keeps them in registers). */
static inline void adamw_value(float *p, float gi, float *m, float *v, const AdamwStep *k) {
  float mi = k->b1 * *m + (1.0f - k->b1) * gi;
  float vi = k->b2 * *v + (1.0f - k->b2) * gi * gi;
  *m = mi;
  *v = vi;
  float mhat = mi / k->bc1, vhat = vi / k->bc2;
  *p = *p * k->decay - k->step * mhat / (sqrtf(vhat) + k->eps);
}

/* AVX2's eight lanes where the CPU has them: the same bits (IEEE operations
 * each rounded on its own; AVX2 brings no FMA, and ISO C does not contract),
 * and for the 16-bit moments the packing of 32-bit lanes into 16 that
 * x86-64's baseline lacks. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define OPTIM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define OPTIM_CLONES
#endif

/* The AdamW loop on the gradients times f (the clipping scale; 1: as they
 * are): g f rounded to float, as optim_scale would have stored it. */
OPTIM_CLONES static void adamw_loop(float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr, double wd,
                       const OptimConfig *c, float f, uint16_t *half) {
  const AdamwStep k = adamw_step(t, lr, wd, c);
  /* in blocks, so that the copy reads the values while they are in cache */
  for (int64_t lo = 0; lo < n; lo += COPY_BLOCK) {
    int64_t hi = n - lo < COPY_BLOCK ? n : lo + COPY_BLOCK;
    for (int64_t i = lo; i < hi; i++) { /* through locals: the loop then vectorises (GCC 12 -O3) */
      float pi = p[i], mi = m[i], vi = v[i];
      adamw_value(&pi, g[i] * f, &mi, &vi, &k);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
    if (half) bf16_copy(p + lo, half + lo, hi - lo);
  }
}

/* The same with the moments stored as bf16 (train.moments = bf16): read
 * exactly, updated in float, rounded to nearest even when stored. */
OPTIM_CLONES static void adamw16_loop(float *p, const float *g, uint16_t *m, uint16_t *v, int64_t n, int64_t t, double lr, double wd,
                         const OptimConfig *c, float f, uint16_t *half) {
  const AdamwStep k = adamw_step(t, lr, wd, c);
  for (int64_t lo = 0; lo < n; lo += COPY_BLOCK) {
    int64_t hi = n - lo < COPY_BLOCK ? n : lo + COPY_BLOCK;
    for (int64_t i = lo; i < hi; i++) {
      float pi = p[i], mi = half_bf16_to_f32(m[i]), vi = half_bf16_to_f32(v[i]);
      adamw_value(&pi, g[i] * f, &mi, &vi, &k);
      p[i] = pi;
      m[i] = half_bf16_from_f32(mi);
      v[i] = half_bf16_from_f32(vi);
    }
    if (half) bf16_copy(p + lo, half + lo, hi - lo);
  }
}

void optim_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr, double wd,
                 const OptimConfig *c) {
  adamw_loop(p, g, m, v, n, t, lr, wd, c, 1.0f, NULL);
}

/* SGD on the gradients times f; the momentum buffer in float (buf) or bf16
 * (buf16), at most one of them. */
static void sgd_loop(float *p, const float *g, float *buf, uint16_t *buf16, int64_t n, int64_t t, double lr, double wd,
                     const OptimConfig *c, float f, uint16_t *half) {
  const float mu = (float)c->momentum, w = (float)wd, step = (float)lr;
  for (int64_t lo = 0; lo < n; lo += COPY_BLOCK) {
    int64_t hi = n - lo < COPY_BLOCK ? n : lo + COPY_BLOCK;
    for (int64_t i = lo; i < hi; i++) {
      float gi = g[i] * f + w * p[i];
      if (mu != 0.0f && buf) {
        gi = t <= 1 ? gi : mu * buf[i] + gi;
        buf[i] = gi;
      } else if (mu != 0.0f && buf16) {
        gi = t <= 1 ? gi : mu * half_bf16_to_f32(buf16[i]) + gi;
        buf16[i] = half_bf16_from_f32(gi);
      }
      p[i] -= step * gi;
    }
    if (half) bf16_copy(p + lo, half + lo, hi - lo);
  }
}

void optim_sgd(float *p, const float *g, float *buf, int64_t n, int64_t t, double lr, double wd, const OptimConfig *c) {
  sgd_loop(p, g, buf, NULL, n, t, lr, wd, c, 1.0f, NULL);
}

/* Sixteen running sums, value i in sum i % 16, then added in order: one
 * sequential sum waits on each addition's latency (4 cycles: 66 ms for
 * GPT-2's 124M gradients on two cores), independent lanes vectorise and
 * run at the memory's pace. The same order for any n and thread count. */
#define SUMSQ_LANES 16
OPTIM_CLONES double optim_sumsq(const float *g, int64_t n) {
  double lane[SUMSQ_LANES] = {0};
  int64_t i = 0;
  for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
    for (int j = 0; j < SUMSQ_LANES; j++) lane[j] += (double)g[i + j] * (double)g[i + j];
  for (int j = 0; i < n; i++, j++) lane[j] += (double)g[i] * (double)g[i];
  double s = 0;
  for (int j = 0; j < SUMSQ_LANES; j++) s += lane[j];
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

/* ---- the same passes on the rank's threads ---- */

typedef struct {
  float *p, *m, *v, *buf, *g;
  uint16_t *m16, *v16, *buf16; /* the moments in bf16 (train.moments = bf16) */
  uint16_t *half;
  const float *cg;
  int64_t t, n;
  double lr, wd, s;
  const OptimConfig *c;
  double *slots; /* sumsq: one per block */
} OptimPass;

/* Values [lo, hi) of an AdamW pass, its moments in fp32 or (m16, v16) bf16. */
static void adamw_range(void *ctx, int64_t lo, int64_t hi) {
  OptimPass *a = ctx;
  uint16_t *half = a->half ? a->half + lo : NULL;
  if (a->m16)
    adamw16_loop(a->p + lo, a->cg + lo, a->m16 + lo, a->v16 + lo, hi - lo, a->t, a->lr, a->wd, a->c, (float)a->s, half);
  else adamw_loop(a->p + lo, a->cg + lo, a->m + lo, a->v + lo, hi - lo, a->t, a->lr, a->wd, a->c, (float)a->s, half);
}

void optim_adamw_mt(int nthreads, float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr,
                    double wd, const OptimConfig *c, double gscale, uint16_t *half) {
  OptimPass a = {.p = p, .cg = g, .m = m, .v = v, .t = t, .lr = lr, .wd = wd, .c = c, .s = gscale, .half = half};
  par_for(par_threads_for(nthreads, n), n, adamw_range, &a);
}

void optim_adamw16_mt(int nthreads, float *p, const float *g, uint16_t *m, uint16_t *v, int64_t n, int64_t t, double lr,
                      double wd, const OptimConfig *c, double gscale, uint16_t *half) {
  OptimPass a = {.p = p, .cg = g, .m16 = m, .v16 = v, .t = t, .lr = lr, .wd = wd, .c = c, .s = gscale, .half = half};
  par_for(par_threads_for(nthreads, n), n, adamw_range, &a);
}

static void sgd_range(void *ctx, int64_t lo, int64_t hi) {
  OptimPass *a = ctx;
  sgd_loop(a->p + lo, a->cg + lo, a->buf ? a->buf + lo : NULL, a->buf16 ? a->buf16 + lo : NULL, hi - lo, a->t, a->lr, a->wd, a->c, (float)a->s,
           a->half ? a->half + lo : NULL);
}

void optim_sgd_mt(int nthreads, float *p, const float *g, float *buf, int64_t n, int64_t t, double lr, double wd,
                  const OptimConfig *c, double gscale, uint16_t *half) {
  OptimPass a = {.p = p, .cg = g, .buf = buf, .t = t, .lr = lr, .wd = wd, .c = c, .s = gscale, .half = half};
  par_for(par_threads_for(nthreads, n), n, sgd_range, &a);
}

void optim_sgd16_mt(int nthreads, float *p, const float *g, uint16_t *buf, int64_t n, int64_t t, double lr, double wd,
                    const OptimConfig *c, double gscale, uint16_t *half) {
  OptimPass a = {.p = p, .cg = g, .buf16 = buf, .t = t, .lr = lr, .wd = wd, .c = c, .s = gscale, .half = half};
  par_for(par_threads_for(nthreads, n), n, sgd_range, &a);
}

/* Block b of the n values g[0 .. n). */
static double block_sumsq(const float *g, int64_t n, int64_t b) {
  int64_t first = b * OPTIM_SUMSQ_BLOCK, len = n - first < OPTIM_SUMSQ_BLOCK ? n - first : OPTIM_SUMSQ_BLOCK;
  return optim_sumsq(g + first, len);
}

/* Blocks [lo, hi): each thread writes only its own blocks' slots. */
static void sumsq_blocks(void *ctx, int64_t lo, int64_t hi) {
  OptimPass *a = ctx;
  for (int64_t b = lo; b < hi; b++) a->slots[b] = block_sumsq(a->cg, a->n, b);
}

double optim_sumsq_mt(int nthreads, const float *g, int64_t n) {
  if (n <= OPTIM_SUMSQ_BLOCK) return optim_sumsq(g, n);
  int64_t nblocks = (n + OPTIM_SUMSQ_BLOCK - 1) / OPTIM_SUMSQ_BLOCK;
  double s = 0, *slots = malloc((size_t)nblocks * sizeof *slots);
  if (!slots) {
    /* No memory for the slots: the same block sums in the same order, here. */
    for (int64_t b = 0; b < nblocks; b++) s += block_sumsq(g, n, b);
    return s;
  }
  OptimPass a = {.cg = g, .n = n, .slots = slots};
  par_for(par_threads_for(nthreads, n), nblocks, sumsq_blocks, &a);
  for (int64_t b = 0; b < nblocks; b++) s += slots[b];
  free(slots);
  return s;
}
