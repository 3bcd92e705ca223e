/* init.c - the per-logical-tensor generator (a copy of interp.c's). */
#include "init.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[] = {"zeros", "ones", "constant", "normal", "uniform"};

int init_kind_parse(const char *name) {
  for (int i = 0; i < 5; i++)
    if (!strcmp(name, kind_names[i])) return i;
  return -1;
}

const char *init_kind_name(InitKindRt k) { return (unsigned)k < 5 ? kind_names[k] : "?"; }

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t init_hash_name(uint64_t seed, const char *name, int64_t layer) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  uint64_t s = seed ^ h;
  uint64_t a = splitmix64(&s);
  s = a ^ ((uint64_t)layer * 0xD1B54A32D192ED03ull);
  return splitmix64(&s);
}

double init_uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

/* sum c[i] z^(n-1-i) by Horner's rule, c[0] the highest power's */
static inline double horner(const double *c, int n, double z) {
  double p = c[0];
  for (int i = 1; i < n; i++) p = p * z + c[i];
  return p;
}

/* 1/21, 1/19, ..., 1/3, 1: the series of atanh(s) / s in s^2 */
static const double atanh_c[] = {1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11,
                                 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3,  1.0};
/* 1/18!, 1/16!, ..., 1/2!, 1 and 1/19!, ..., 1/3!, 1: cos t and sin t / t in -t^2 */
static const double cos_c[] = {1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, 1.0 / 87178291200.0,
                               1.0 / 479001600.0,        1.0 / 3628800.0,        1.0 / 40320.0,
                               1.0 / 720.0,              1.0 / 24.0,             0.5,
                               1.0};
static const double sin_c[] = {1.0 / 121645100408832000.0, 1.0 / 355687428096000.0, 1.0 / 1307674368000.0,
                               1.0 / 6227020800.0,         1.0 / 39916800.0,        1.0 / 362880.0,
                               1.0 / 5040.0,               1.0 / 120.0,             1.0 / 6.0,
                               1.0};
#define NCOEF(c) ((int)(sizeof(c) / sizeof(c)[0]))

/* ln u for u in [2^-53, 1]: u = 2^e m with m in [1/sqrt 2, sqrt 2), and
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, by its series to
 * s^21 (the next term is below 1e-17 of the sum). Branch-free, so a loop of
 * it vectorises: e comes out of the exponent bits as (2^52 + E) - (2^52 + 1023). */
static inline double ln_unit(double u) {
  uint64_t bits, eb;
  memcpy(&bits, &u, sizeof bits);
  eb = (bits >> 52) | 0x4330000000000000ull;
  double e, m;
  memcpy(&e, &eb, sizeof e);
  e -= 4503599627371519.0;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  memcpy(&m, &bits, sizeof m);
  int big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;
  e = big ? e + 1.0 : e;
  double s = (m - 1.0) / (m + 1.0);
  return 2.0 * s * horner(atanh_c, NCOEF(atanh_c), s * s) + e * 0.69314718055994530942;
}

/* cos(2 pi u) for u in [0, 1): by symmetry an angle t = 2 pi b with b in
 * [0, 1/8], then cos t or sin t by their Taylor series to t^18 / t^19
 * (terms below 1e-17 after). Every reduction step is exact in double. */
static inline double cos_turns(double u) {
  double a = u < 1.0 - u ? u : 1.0 - u; /* [0, 1/2]: cos(2 pi u) = cos(2 pi (1 - u)) */
  double sign = a > 0.25 ? -1.0 : 1.0;  /* cos(2 pi a) = -cos(2 pi (1/2 - a)) */
  double q = a < 0.5 - a ? a : 0.5 - a; /* [0, 1/4] */
  int on_sin = q > 0.125;               /* cos(2 pi q) = sin(2 pi (1/4 - q)) */
  double b = on_sin ? 0.25 - q : q;     /* [0, 1/8] */
  double t = 6.283185307179586477 * b, z = -(t * t);
  double c = horner(cos_c, NCOEF(cos_c), z), n = horner(sin_c, NCOEF(sin_c), z);
  return sign * (on_sin ? t * n : c);
}

/* Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 = 1 - the first draw (in
 * (0, 1]), u2 the second. The logarithm and cosine are this file's own
 * (additions, multiplications and one division, compiled without
 * contraction into fused multiply-adds): the same bits on every machine and
 * compiler, accurate to about 1e-12 relative, and, drawn in batches
 * (box_muller over arrays, which vectorises), several times faster than the
 * C library's: the 124M initial values of GPT-2 small were most of hpdlrun's
 * start-up. */
static inline double box_muller(double u1, double u2) { return sqrt(-2.0 * ln_unit(u1)) * cos_turns(u2); }

double init_normal(uint64_t *state) {
  double u1 = 1.0 - init_uniform01(state);
  double u2 = init_uniform01(state);
  return box_muller(u1, u2);
}

#define NORMAL_BATCH 64

/* n normal values of the stream at st into out (n <= NORMAL_BATCH), equal
 * to n calls of init_normal: the draws first, then the transform as a loop
 * the compiler vectorises. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* AVX2's four lanes where the CPU has them (the same bits: every operation
 * is an IEEE one, none fused) */
__attribute__((target_clones("avx2", "default")))
#endif
static void normal_batch(double *out, int n, uint64_t *st) {
  double u1[NORMAL_BATCH], u2[NORMAL_BATCH];
  for (int i = 0; i < n; i++) {
    u1[i] = 1.0 - init_uniform01(st);
    u2[i] = init_uniform01(st);
  }
  for (int i = 0; i < n; i++) out[i] = box_muller(u1[i], u2[i]);
}

static double next_value(const InitSpec *s, uint64_t *st) {
  switch (s->kind) {
  case INIT_K_ZEROS: return 0;
  case INIT_K_ONES: return 1;
  case INIT_K_CONSTANT: return s->a;
  case INIT_K_NORMAL: return s->a + s->b * init_normal(st);
  case INIT_K_UNIFORM: return s->a + (s->b - s->a) * init_uniform01(st);
  }
  return 0;
}

void init_fill_f64(double *out, int64_t numel, const InitSpec *s, uint64_t seed, const char *name, int64_t layer) {
  uint64_t st = init_hash_name(seed, name, layer);
  for (int64_t k = 0; k < numel; k++) out[k] = next_value(s, &st);
}

/* splitmix64's state moves by the same constant at every draw, so the
 * state before value k of a stream is st0 + draws x k x that constant: any
 * range of a tensor is drawn without the values before it (counter-based),
 * and a shard or a thread's part costs its own values only. */
#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

static uint64_t draws_per_value(InitKindRt k) { return k == INIT_K_NORMAL ? 2 : k == INIT_K_UNIFORM ? 1 : 0; }

void init_fill_f32_range(float *out, int64_t first, int64_t n, const InitSpec *s, uint64_t st0) {
  uint64_t st = st0 + draws_per_value(s->kind) * (uint64_t)first * SPLITMIX_GAMMA;
  if (s->kind != INIT_K_NORMAL) {
    for (int64_t k = 0; k < n; k++) out[k] = (float)next_value(s, &st);
    return;
  }
  double z[NORMAL_BATCH];
  for (int64_t k = 0; k < n; k += NORMAL_BATCH) {
    int m = n - k < NORMAL_BATCH ? (int)(n - k) : NORMAL_BATCH;
    normal_batch(z, m, &st);
    for (int i = 0; i < m; i++) out[k + i] = (float)(s->a + s->b * z[i]);
  }
}

typedef struct {
  float *out;
  const InitSpec *s;
  uint64_t st0;
} FillCtx;

static void fill_run(void *ctx, int64_t local_at, int64_t logical_at, int64_t n) {
  const FillCtx *f = ctx;
  init_fill_f32_range(f->out + local_at, logical_at, n, f->s, f->st0);
}

void init_fill_f32_shard_part(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                              uint64_t seed, const char *name, int64_t layer, int64_t from, int64_t to) {
  FillCtx f = {out, s, init_hash_name(seed, name, layer)};
  shard_runs(rank, dims, split, from, to, fill_run, &f);
}

void init_fill_f32_shard(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                         uint64_t seed, const char *name, int64_t layer) {
  init_fill_f32_shard_part(out, rank, dims, split, s, seed, name, layer, 0, shard_numel(rank, dims, split));
}
