/* test_rt_optim.c - the runtime's optimizers against plain double-precision
 * loops of PyTorch's formulas, hand-computed first steps, the schedules at
 * known steps, clipping over shards, and parameter initialisation bit for
 * bit equal to the reference executor's (core/interp.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "init.h"
#include "interp.h"
#include "ir.h"
#include "optim.h"
#include "test_util.h"

/* ---- AdamW ---- */

/* torch.optim.AdamW, step by step, in double. */
static void adamw_ref(double *p, const double *g, double *m, double *v, int n, int t, double lr, double wd, double b1, double b2,
                      double eps) {
  for (int i = 0; i < n; i++) {
    p[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

static void test_adamw_first_step_by_hand(void) {
  /* t = 1: mhat = g, vhat = g^2, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps). */
  OptimConfig c;
  optim_defaults(&c);
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m[2] = {0, 0}, v[2] = {0, 0};
  optim_adamw(p, g, m, v, 2, 1, 0.1, 0.01, &c);
  EXPECT_NEAR(p[0], 0.999 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-7);   /* 0.899000002 */
  EXPECT_NEAR(p[1], -2 * 0.999 + 0.1 * 0.25 / (0.25 + 1e-8), 1e-7); /* -1.898 */
  EXPECT_NEAR(m[0], 0.05, 1e-6); /* (1 - b1) rounded to float */
  EXPECT_NEAR(v[1], 0.05 * 0.0625, 1e-6);
}

static void test_adamw_against_reference(void) {
  enum { N = 7, STEPS = 5 };
  OptimConfig c;
  optim_defaults(&c);
  c.beta1 = 0.8;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  float p[N], m[N] = {0}, v[N] = {0}, g[N];
  double P[N], M[N] = {0}, V[N] = {0}, G[N];
  for (int i = 0; i < N; i++) P[i] = p[i] = (float)(0.3 * i - 1.0);
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) G[i] = g[i] = (float)(sin(1.7 * i + 0.9 * t) * (i + 1) * 0.1); /* exact in float */
    double lr = 0.01 * t, wd = 0.1;
    optim_adamw(p, g, m, v, N, t, lr, wd, &c);
    adamw_ref(P, G, M, V, N, t, lr, wd, c.beta1, c.beta2, c.eps);
  }
  for (int i = 0; i < N; i++) {
    EXPECT_NEAR(p[i], P[i], 1e-6);
    EXPECT_NEAR(m[i], M[i], 1e-5);
    EXPECT_NEAR(v[i], V[i], 1e-5);
  }
}

/* ---- SGD ---- */

static void test_sgd_against_reference(void) {
  enum { N = 5, STEPS = 4 };
  OptimConfig c;
  optim_defaults(&c);
  c.kind = OPTIM_SGD;
  c.momentum = 0.9;
  float p[N], b[N] = {0}, g[N];
  double P[N], Bf[N] = {0};
  for (int i = 0; i < N; i++) P[i] = p[i] = (float)(i - 2);
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = (float)(0.5 * i - 0.25 * t);
    optim_sgd(p, g, b, N, t, 0.1, 0.01, &c);
    /* torch.optim.SGD: d = g + wd p; buf = d at t = 1, else mu buf + d; p -= lr buf */
    for (int i = 0; i < N; i++) {
      double d = (double)g[i] + 0.01 * P[i];
      Bf[i] = t == 1 ? d : 0.9 * Bf[i] + d;
      P[i] -= 0.1 * Bf[i];
    }
  }
  /* float arithmetic: a few ulps per step, and p[2] ends near 0.1 after
   * cancellations of values near 1 */
  for (int i = 0; i < N; i++) EXPECT_NEAR(p[i], P[i], 1e-5);
  /* Without momentum: p -= lr (g + wd p), one step by hand. */
  c.momentum = 0;
  float q[1] = {2.0f}, h[1] = {1.0f};
  optim_sgd(q, h, NULL, 1, 1, 0.5, 0.1, &c);
  EXPECT_NEAR(q[0], 2.0 - 0.5 * (1.0 + 0.2), 1e-7); /* 1.4 */
}

/* ---- moments in bf16 (train.moments = bf16) ---- */

/* The 16-bit updates are the fp32 ones with each moment rounded to bf16
 * (nearest even) once stored: the parameter moves by the update's unrounded
 * moments, as a fused kernel's registers hold them. Checked bit for bit
 * against optim_adamw / optim_sgd on float moments rounded after each step,
 * on 1 and 2 threads, over a tensor long enough for both (par.h). */
static void round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = half_bf16_to_f32(half_bf16_from_f32(x[i]));
}

static void test_moments_bf16(void) {
  enum { N = 300001, STEPS = 6 };
  OptimConfig c;
  optim_defaults(&c);
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  float *p = malloc(N * sizeof *p), *q = malloc(N * sizeof *q), *g = malloc(N * sizeof *g), *m = calloc(N, sizeof *m),
        *v = calloc(N, sizeof *v);
  uint16_t *m16 = calloc(N, sizeof *m16), *v16 = calloc(N, sizeof *v16), *half = malloc(N * sizeof *half);
  for (int threads = 1; threads <= 2; threads++) {
    for (int i = 0; i < N; i++) p[i] = q[i] = (float)(0.01 * (double)(((int64_t)i * 7919) % 2001) - 10.0), m[i] = v[i] = 0, m16[i] = v16[i] = 0;
    int64_t differ = 0; /* values whose rounded moment is not the float one: rounding happened */
    for (int t = 1; t <= STEPS; t++) {
      for (int i = 0; i < N; i++) g[i] = (float)(sin(0.37 * i + 1.3 * t) * 1e-3 * (1 + i % 17));
      optim_adamw(p, g, m, v, N, t, 1e-3, 0.1, &c);
      for (int i = 0; i < N; i++) differ += m[i] != half_bf16_to_f32(half_bf16_from_f32(m[i]));
      round_bf16(m, N);
      round_bf16(v, N);
      optim_adamw16_mt(threads, q, g, m16, v16, N, t, 1e-3, 0.1, &c, 1.0, half);
    }
    int64_t bad = 0;
    for (int i = 0; i < N; i++)
      bad += memcmp(&p[i], &q[i], sizeof(float)) || half_bf16_from_f32(m[i]) != m16[i] || half_bf16_from_f32(v[i]) != v16[i] ||
             half[i] != half_bf16_from_f32(q[i]);
    EXPECT(bad == 0);
    EXPECT(differ > N); /* the rounding was not a no-op */
  }
  /* SGD's momentum buffer, with the gradients scaled (clipping) */
  c.kind = OPTIM_SGD;
  c.momentum = 0.9;
  for (int threads = 1; threads <= 2; threads++) {
    for (int i = 0; i < N; i++) p[i] = q[i] = (float)(0.001 * (i % 1000)), m[i] = 0, m16[i] = 0;
    for (int t = 1; t <= STEPS; t++) {
      for (int i = 0; i < N; i++) g[i] = (float)cos(0.11 * i - t);
      for (int i = 0; i < N; i++) g[i] *= 0.5f; /* optim_scale's rounding, as the 16-bit pass applies it */
      optim_sgd(p, g, m, N, t, 0.05, 0.01, &c);
      round_bf16(m, N);
      for (int i = 0; i < N; i++) g[i] *= 2.0f; /* exact: back to the unscaled gradient */
      optim_sgd16_mt(threads, q, g, m16, N, t, 0.05, 0.01, &c, 0.5, NULL);
    }
    int64_t bad = 0;
    for (int i = 0; i < N; i++) bad += memcmp(&p[i], &q[i], sizeof(float)) || half_bf16_from_f32(m[i]) != m16[i];
    EXPECT(bad == 0);
  }
  free(p), free(q), free(g), free(m), free(v), free(m16), free(v16), free(half);
}

/* ---- schedules ---- */

static void test_schedules(void) {
  OptimConfig c;
  optim_defaults(&c);
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup = 10;
  c.total_steps = 110;
  c.decay = OPTIM_DECAY_COSINE;
  EXPECT_NEAR(optim_lr_at(&c, 0), 1e-4, 1e-12);  /* (0 + 1) / 10 */
  EXPECT_NEAR(optim_lr_at(&c, 4), 5e-4, 1e-12);
  EXPECT_NEAR(optim_lr_at(&c, 9), 1e-3, 1e-12);
  EXPECT_NEAR(optim_lr_at(&c, 10), 1e-3, 1e-12); /* q = 0 */
  EXPECT_NEAR(optim_lr_at(&c, 60), 5.5e-4, 1e-12); /* q = 1/2: the midpoint */
  EXPECT_NEAR(optim_lr_at(&c, 35), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-12); /* 8.6820e-4 */
  EXPECT_NEAR(optim_lr_at(&c, 110), 1e-4, 1e-12);
  EXPECT_NEAR(optim_lr_at(&c, 500), 1e-4, 1e-12); /* past the end: min_lr */
  c.decay = OPTIM_DECAY_LINEAR;
  EXPECT_NEAR(optim_lr_at(&c, 35), 7.75e-4, 1e-12); /* q = 1/4 */
  EXPECT_NEAR(optim_lr_at(&c, 60), 5.5e-4, 1e-12);
  EXPECT_NEAR(optim_lr_at(&c, 110), 1e-4, 1e-12);
  c.decay = OPTIM_DECAY_NONE;
  EXPECT_NEAR(optim_lr_at(&c, 5), 6e-4, 1e-12);
  EXPECT_NEAR(optim_lr_at(&c, 80), 1e-3, 1e-12);
  c.warmup = 0;
  EXPECT_NEAR(optim_lr_at(&c, 0), 1e-3, 1e-12);
  EXPECT(optim_decay_parse("cosine") == OPTIM_DECAY_COSINE && optim_decay_parse("bogus") < 0);
  EXPECT(optim_kind_parse("sgd") == OPTIM_SGD && optim_kind_parse("adam") < 0);
}

/* ---- clipping ---- */

static void test_clipping_over_shards(void) {
  float g[4] = {3, 0, 0, 4}; /* norm 5 */
  /* two "ranks" each own half: their sums of squares add up */
  double total = optim_sumsq(g, 2) + optim_sumsq(g + 2, 2);
  EXPECT_NEAR(total, 25, 1e-15);
  double s = optim_clip_scale(sqrt(total), 1.0);
  EXPECT_NEAR(s, 1.0 / (5.0 + 1e-6), 1e-12);
  optim_scale(g, 4, s);
  EXPECT_NEAR(sqrt(optim_sumsq(g, 4)), 1.0, 1e-6);
  EXPECT(optim_clip_scale(0.5, 1.0) == 1.0);
  EXPECT(optim_clip_scale(7.0, 0.0) == 1.0); /* off */
}

/* ---- initialisation: identical to the reference executor ---- */

static void test_generator_matches_interp(void) {
  const char *names[] = {"wte.weight", "blocks.{i}.attn.q_proj.weight", "", "ln_f.bias"};
  for (int n = 0; n < 4; n++)
    for (int64_t l = 0; l < 5; l++) {
      uint64_t a = init_hash_name(1234 + (uint64_t)l, names[n], l), b = interp_hash_name(1234 + (uint64_t)l, names[n], l);
      EXPECT(a == b);
      for (int k = 0; k < 100; k++) {
        double x = init_normal(&a), y = interp_normal(&b);
        EXPECT(memcmp(&x, &y, sizeof x) == 0);
        x = init_uniform01(&a);
        y = interp_uniform01(&b);
        EXPECT(memcmp(&x, &y, sizeof x) == 0);
      }
    }
}

static void test_init_matches_interp_params(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  struct {
    const char *name;
    int rank;
    int64_t dims[3];
    SemInit init;
    int64_t count;
  } specs[] = {
      {"wte.weight", 2, {8, 6}, {INIT_NORMAL, 0.0, 0.02}, 1},
      {"blocks.{i}.mlp.weight", 2, {4, 12}, {INIT_NORMAL, 0.1, 0.5}, 3},
      {"blocks.{i}.ln.bias", 1, {6}, {INIT_UNIFORM, -0.5, 0.25}, 3},
      {"ln_f.weight", 1, {6}, {INIT_ONES, 0, 0}, 1},
      {"scale", 3, {2, 3, 4}, {INIT_CONSTANT, 0.75, 0}, 1},
  };
  enum { NSPECS = sizeof specs / sizeof specs[0] };
  for (int i = 0; i < NSPECS; i++) {
    IrParam p;
    memset(&p, 0, sizeof p);
    p.name = specs[i].name;
    p.dtype = DT_F32;
    p.rank = specs[i].rank;
    memcpy(p.dims, specs[i].dims, sizeof specs[i].dims);
    memcpy(p.full_dims, specs[i].dims, sizeof specs[i].dims);
    p.init = specs[i].init;
    p.count = specs[i].count;
    p.split_axis = p.split2_axis = -1;
    ir_add_param(m, &p);
  }
  Interp *in = interp_new(m);
  const uint64_t seed = 1337;
  interp_init_params(in, seed);
  for (int i = 0; i < NSPECS; i++) {
    InitSpec s = {(InitKindRt)specs[i].init.kind, specs[i].init.a, specs[i].init.b};
    EXPECT((int)s.kind == (int)specs[i].init.kind);
    for (int64_t l = 0; l < specs[i].count; l++) {
      int64_t n = 0;
      const double *ref = interp_param(in, i, l, &n);
      double *mine = malloc(sizeof(double) * (size_t)n);
      float *full = malloc(sizeof(float) * (size_t)n), *piece = malloc(sizeof(float) * (size_t)n);
      init_fill_f64(mine, n, &s, seed, specs[i].name, l);
      EXPECT(memcmp(mine, ref, sizeof(double) * (size_t)n) == 0); /* bit for bit */
      ShardSplit whole = shard_whole();
      init_fill_f32_shard(full, specs[i].rank, specs[i].dims, &whole, &s, seed, specs[i].name, l);
      for (int64_t k = 0; k < n; k++) EXPECT(full[k] == (float)ref[k]);
      /* Every split of every axis gives the pieces of the same tensor. */
      for (int axis = 0; axis < specs[i].rank; axis++)
        for (int parts = 2; parts <= 4; parts++) {
          int64_t len = specs[i].dims[axis];
          if (len % parts) continue;
          int64_t outer = 1, inner = 1;
          for (int d = 0; d < axis; d++) outer *= specs[i].dims[d];
          for (int d = axis + 1; d < specs[i].rank; d++) inner *= specs[i].dims[d];
          for (int r = 0; r < parts; r++) {
            ShardSplit one = {axis, parts, r, -1, 1, 0};
            init_fill_f32_shard(piece, specs[i].rank, specs[i].dims, &one, &s, seed, specs[i].name, l);
            int64_t pl = len / parts, k = 0;
            for (int64_t o = 0; o < outer; o++)
              for (int64_t a = r * pl; a < (r + 1) * pl; a++)
                for (int64_t q = 0; q < inner; q++) EXPECT(piece[k++] == (float)ref[(o * len + a) * inner + q]);
          }
        }
      free(mine);
      free(full);
      free(piece);
    }
  }
  interp_free(in);
  arena_free(arena);
}

int main(void) {
  test_adamw_first_step_by_hand();
  test_adamw_against_reference();
  test_sgd_against_reference();
  test_moments_bf16();
  test_schedules();
  test_clipping_over_shards();
  test_generator_matches_interp();
  test_init_matches_interp_params();
  TEST_DONE();
}
