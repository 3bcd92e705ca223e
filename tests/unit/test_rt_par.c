/* test_rt_par.c - par_for covers every index exactly once, whatever n and
 * the thread count; the threaded optimizer passes (optim_*_mt) give bit for
 * bit the same results for 1, 2 and 3 threads, and equal the one-thread
 * loops of optim.c. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "optim.h"
#include "par.h"
#include "test_util.h"

typedef struct {
  atomic_int *hits;
  atomic_int calls;
  atomic_int bad; /* a range outside [0, n) or empty */
  int64_t n;
} Cover;

static void cover_range(void *ctx, int64_t lo, int64_t hi) {
  Cover *c = ctx;
  atomic_fetch_add(&c->calls, 1);
  if (lo < 0 || hi > c->n || lo >= hi) {
    atomic_fetch_add(&c->bad, 1);
    return;
  }
  for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_par_for_covers_once(void) {
  const int64_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 65537};
  const int threads[] = {1, 2, 3, 4, 7, 16};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof threads / sizeof *threads; b++) {
      int64_t n = ns[a];
      Cover c = {.hits = calloc((size_t)n + 1, sizeof(atomic_int)), .n = n};
      par_for(threads[b], n, cover_range, &c);
      int once = 1;
      for (int64_t i = 0; i < n; i++) once &= atomic_load(&c.hits[i]) == 1;
      EXPECT(once);
      EXPECT(atomic_load(&c.bad) == 0);
      /* min(threads, n) ranges; none for n = 0. */
      int64_t want = n == 0 ? 0 : n < threads[b] ? n : threads[b];
      EXPECT(atomic_load(&c.calls) == want);
      free(c.hits);
    }
}

/* Deterministic values of mixed sign and magnitude. */
static void fill(float *x, int64_t n, uint32_t seed) {
  uint32_t s = seed;
  for (int64_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 97 == 0 ? 100.0f : 1.0f);
  }
}

static void test_sumsq_same_for_any_threads(void) {
  /* Sizes around the block (65536) and one of several blocks with a tail. */
  const int64_t ns[] = {10, OPTIM_SUMSQ_BLOCK, OPTIM_SUMSQ_BLOCK + 1, 5 * OPTIM_SUMSQ_BLOCK + 123};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
    int64_t n = ns[a];
    float *g = malloc((size_t)n * sizeof *g);
    fill(g, n, 7u + (uint32_t)a);
    double r1 = optim_sumsq_mt(1, g, n), r2 = optim_sumsq_mt(2, g, n), r3 = optim_sumsq_mt(3, g, n);
    EXPECT(memcmp(&r1, &r2, sizeof r1) == 0);
    EXPECT(memcmp(&r1, &r3, sizeof r1) == 0);
    /* The blocked sum is the block sums added in order. */
    double want = 0;
    for (int64_t lo = 0; lo < n; lo += OPTIM_SUMSQ_BLOCK)
      want += optim_sumsq(g + lo, n - lo < OPTIM_SUMSQ_BLOCK ? n - lo : OPTIM_SUMSQ_BLOCK);
    EXPECT(memcmp(&r1, &want, sizeof r1) == 0);
    EXPECT_NEAR(r1, optim_sumsq(g, n), 1e-12);
    free(g);
  }
}

static void test_updates_same_for_any_threads(void) {
  const int64_t n = 3 * OPTIM_SUMSQ_BLOCK + 17;
  OptimConfig c;
  optim_defaults(&c);
  c.momentum = 0.9;
  float *g = malloc((size_t)n * sizeof *g);
  fill(g, n, 3u);
  /* [0]: the one-thread loop of optim.c; [1..3]: optim_*_mt on 1..3 threads. */
  float *p[4], *m[4], *v[4];
  for (int k = 0; k < 4; k++) {
    p[k] = malloc((size_t)n * sizeof(float));
    m[k] = calloc((size_t)n, sizeof(float));
    v[k] = calloc((size_t)n, sizeof(float));
    fill(p[k], n, 11u);
  }
  size_t bytes = (size_t)n * sizeof(float);
  for (int t = 1; t <= 2; t++) {
    optim_adamw(p[0], g, m[0], v[0], n, t, 1e-3, 0.1, &c);
    for (int k = 1; k < 4; k++) optim_adamw_mt(k, p[k], g, m[k], v[k], n, t, 1e-3, 0.1, &c, 1.0, NULL);
  }
  /* a third step with the clipping scale inside the update's pass: the same
   * as scaling the gradients first (gs) */
  float *gs = malloc(bytes);
  memcpy(gs, g, bytes);
  optim_scale(gs, n, 0.37);
  optim_adamw(p[0], gs, m[0], v[0], n, 3, 1e-3, 0.1, &c);
  /* the bf16 copy written with the update (on 2 and 3 threads) is the updated values rounded */
  uint16_t *half = malloc((size_t)n * sizeof *half);
  for (int k = 1; k < 4; k++) optim_adamw_mt(k, p[k], g, m[k], v[k], n, 3, 1e-3, 0.1, &c, 0.37, k > 1 ? half : NULL);
  int64_t off16 = 0;
  for (int64_t i = 0; i < n; i++) off16 += half[i] != half_bf16_from_f32(p[3][i]);
  EXPECT(off16 == 0);
  EXPECT(half_bf16_bits(0x7f800001u) == 0x7fc0 && half_bf16_bits(0x7f800000u) == 0x7f80); /* a NaN stays one, quiet; inf */
  EXPECT(half_bf16_bits(0x3f808000u) == 0x3f80 && half_bf16_bits(0x3f818000u) == 0x3f82); /* ties to even */
  for (int k = 1; k < 4; k++) {
    EXPECT(memcmp(p[0], p[k], bytes) == 0);
    EXPECT(memcmp(m[0], m[k], bytes) == 0);
    EXPECT(memcmp(v[0], v[k], bytes) == 0);
  }
  for (int t = 1; t <= 2; t++) {
    optim_sgd(p[0], g, m[0], n, t, 1e-2, 0.01, &c);
    for (int k = 1; k < 4; k++) optim_sgd_mt(k, p[k], g, m[k], n, t, 1e-2, 0.01, &c, 1.0, NULL);
  }
  optim_sgd(p[0], gs, m[0], n, 3, 1e-2, 0.01, &c);
  for (int k = 1; k < 4; k++) optim_sgd_mt(k, p[k], g, m[k], n, 3, 1e-2, 0.01, &c, 0.37, k == 2 ? half : NULL);
  off16 = 0;
  for (int64_t i = 0; i < n; i++) off16 += half[i] != half_bf16_from_f32(p[2][i]);
  EXPECT(off16 == 0);
  free(half);
  for (int k = 1; k < 4; k++) {
    EXPECT(memcmp(p[0], p[k], bytes) == 0);
    EXPECT(memcmp(m[0], m[k], bytes) == 0);
  }
  /* The update changed the parameters (the comparisons above are not of untouched copies). */
  float *p0 = malloc(bytes);
  fill(p0, n, 11u);
  EXPECT(memcmp(p0, p[0], bytes) != 0);
  free(p0);
  for (int k = 0; k < 4; k++) {
    free(p[k]);
    free(m[k]);
    free(v[k]);
  }
  free(gs);
  free(g);
}

int main(void) {
  test_par_for_covers_once();
  test_sumsq_same_for_any_threads();
  test_updates_same_for_any_threads();
  TEST_DONE();
}
