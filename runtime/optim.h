/* optim.h - optimizers over fp32 buffers, learning-rate schedules, and
 * global gradient-norm clipping that works on shards.
 *
 * The formulas are PyTorch's (torch.optim.SGD and AdamW), so that a run can
 * be checked against it:
 *   SGD:   g' = g + wd p;  b = mu b + g' (b = g' at the first step);  p -= lr b
 *   AdamW (Loshchilov and Hutter 2019, decoupled decay):
 *          p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *          p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),  t = 1, 2, ...
 * Schedule at step s (0-based), W warmup steps, S total steps:
 *   s < W:  lr (s + 1) / W                          (linear warmup, as llm.c)
 *   else:   q = (s - W) / max(1, S - W), clamped to [0, 1]
 *           none: lr;  linear: lr - (lr - min_lr) q;
 *           cosine: min_lr + (lr - min_lr) (1 + cos(pi q)) / 2
 * Clipping (Pascanu et al. 2013): each rank sums the squares of the gradient
 * values it alone owns (optim_sumsq), the sums are all-reduced, and every
 * rank scales by optim_clip_scale(sqrt(total), clip). */
#ifndef HPDL_OPTIM_H
#define HPDL_OPTIM_H

#include <stdint.h>

typedef enum { OPTIM_SGD, OPTIM_ADAMW } OptimKind;
typedef enum { OPTIM_DECAY_NONE, OPTIM_DECAY_COSINE, OPTIM_DECAY_LINEAR } OptimDecay;

typedef struct {
  OptimKind kind;
  double lr, min_lr;
  double momentum;            /* SGD */
  double beta1, beta2, eps;   /* AdamW */
  double weight_decay;
  int64_t warmup, total_steps;
  OptimDecay decay;
  double clip;                /* 0: off */
  int moments16;              /* the moments stored as bf16 (train.moments = bf16) */
} OptimConfig;

/* The language's defaults (docs/language.md, train): adamw(lr = 3e-4,
 * betas = (0.9, 0.999), eps = 1e-8), no decay, no clipping. */
void optim_defaults(OptimConfig *c);
/* "sgd" / "adamw", "none" / "cosine" / "linear"; -1 when unknown. */
int optim_kind_parse(const char *s);
int optim_decay_parse(const char *s);
const char *optim_kind_name(OptimKind k);
const char *optim_decay_name(OptimDecay d);

double optim_lr_at(const OptimConfig *c, int64_t step);

/* One update of n values. `wd` is this tensor's weight decay (0 for those
 * excluded from decay); t is the 1-based step count (bias correction). */
void optim_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr, double wd,
                 const OptimConfig *c);
/* buf: the momentum buffer (unused when momentum is 0); t as above. */
void optim_sgd(float *p, const float *g, float *buf, int64_t n, int64_t t, double lr, double wd, const OptimConfig *c);

/* Sum of squares in double precision: sixteen interleaved sums (value i
 * in sum i % 16), then those in order. */
double optim_sumsq(const float *g, int64_t n);
/* 1 when clip <= 0 or norm <= clip, else clip / (norm + 1e-6) (PyTorch's
 * clip_grad_norm_). */
double optim_clip_scale(double norm, double clip);
void optim_scale(float *g, int64_t n, double s);

/* The same passes on up to nthreads threads (par.h; one below its
 * PAR_MIN_ELEMS), with results bit for bit independent of nthreads: the
 * updates are elementwise, and the sum of squares is taken in blocks of
 * OPTIM_SUMSQ_BLOCK values, each summed as optim_sumsq does, the block sums
 * then added in block order. Up to one block it equals optim_sumsq. */
#define OPTIM_SUMSQ_BLOCK ((int64_t)1 << 16)
/* The updates take the gradients times gscale (float(g x float(gscale)), as
 * optim_scale stores them; 1: as they are): clipping and unscaling ride on
 * the update's pass over the gradients instead of a pass of their own.
 * half (NULL: none) receives the updated values rounded to bf16
 * (half_bf16_from_f32's bits): the copy a bf16 GEMM reads. */
void optim_adamw_mt(int nthreads, float *p, const float *g, float *m, float *v, int64_t n, int64_t t, double lr,
                    double wd, const OptimConfig *c, double gscale, uint16_t *half);
void optim_sgd_mt(int nthreads, float *p, const float *g, float *buf, int64_t n, int64_t t, double lr, double wd,
                  const OptimConfig *c, double gscale, uint16_t *half);
/* The same with the moments (AdamW's m and v, SGD's momentum buffer)
 * stored as bf16 (train.moments = bf16): each is read exactly, updated in
 * float, and stored rounded to nearest even, as a cast does (Transformer
 * Engine's FusedAdam keeps its bf16 moments so). */
void optim_adamw16_mt(int nthreads, float *p, const float *g, uint16_t *m, uint16_t *v, int64_t n, int64_t t, double lr,
                      double wd, const OptimConfig *c, double gscale, uint16_t *half);
void optim_sgd16_mt(int nthreads, float *p, const float *g, uint16_t *buf, int64_t n, int64_t t, double lr, double wd,
                    const OptimConfig *c, double gscale, uint16_t *half);
double optim_sumsq_mt(int nthreads, const float *g, int64_t n);

#endif
