/* test_lmce.c - the head GEMM and cross-entropy in blocks (core/numeric/lmce.c)
 * against an fp64 reference written here from ir_ops.h's LINEAR_CE
 * semantics: each row's loss, dx and dw, for a weight [C, V] and a table
 * [V, C], rows more than one pass (512) and not a multiple of anything, a
 * vocabulary not a multiple of the 512-column blocks, one row, dw added into
 * an existing gradient, dx or dw not wanted; with the module's own loops
 * and OpenBLAS (skipped without it). Every split of the work (reversed odd
 * ranges, real threads) gives the bits of the sequential run. A target
 * outside the vocabulary is an error, not a crash. Tolerance: 2e-5
 * relative to the largest |value| of the tensor (fp32 sums over C and V). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "lmce.h"
#include "test_hooks.h"
#include "test_util.h"

#define TOL 2e-5

static double urand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*s >> 11) / 9007199254740992.0;
}

static double wat(const LceShape *s, const float *w, int64_t k, int64_t v) { return s->w_rows ? w[v * s->C + k] : w[k * s->V + v]; }

/* nll, dx, dw in fp64 (dy per row) */
static void reference(const LceShape *s, const float *x, const float *w, const int32_t *t, const float *dy, double *nll, double *dx,
                      double *dw) {
  double *z = calloc((size_t)s->V + 1, sizeof(double));
  memset(dx, 0, sizeof(double) * (size_t)(s->rows * s->C));
  memset(dw, 0, sizeof(double) * (size_t)(s->C * s->V));
  for (int64_t r = 0; r < s->rows; r++) {
    double m = -INFINITY, sum = 0;
    for (int64_t v = 0; v < s->V; v++) {
      double d = 0;
      for (int64_t k = 0; k < s->C; k++) d += (double)x[r * s->C + k] * wat(s, w, k, v);
      z[v] = d;
      m = d > m ? d : m;
    }
    for (int64_t v = 0; v < s->V; v++) sum += exp(z[v] - m);
    double lse = m + log(sum);
    nll[r] = lse - z[t[r]];
    for (int64_t v = 0; v < s->V; v++) {
      double g = dy[r] * (exp(z[v] - lse) - (v == t[r]));
      for (int64_t k = 0; k < s->C; k++) {
        dx[r * s->C + k] += g * wat(s, w, k, v);
        dw[s->w_rows ? v * s->C + k : k * s->V + v] += g * x[r * s->C + k];
      }
    }
  }
  free(z);
}

static void expect_close(const char *what, const float *got, const double *want, int64_t n, const char *how) {
  double scale = 0, worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (scale > 0 ? scale : 1);
    if (!(e <= worst)) worst = e, at = i;
  }
  if (!(worst <= TOL)) {
    fprintf(stderr, "test_lmce: %s (%s): element %lld: got %.9g, want %.9g (error %.3g of the largest %.3g)\n", what, how, (long long)at,
            got[at], want[at], worst, scale);
    test_failures++;
  }
}

typedef struct {
  int64_t rows, C, V;
  int w_rows;
} Case;

static void run_case(const Case *c) {
  LceShape s = {c->rows, c->C, c->V, c->w_rows, NULL, NULL, NULL, 0, 1, 0};
  uint64_t seed = (uint64_t)(c->rows * 131 + c->C * 7 + c->V + c->w_rows);
  float *x = malloc(sizeof(float) * (size_t)(c->rows * c->C + 1)), *w = malloc(sizeof(float) * (size_t)(c->C * c->V));
  float *dy = malloc(sizeof(float) * (size_t)(c->rows + 1));
  int32_t *t = malloc(sizeof(int32_t) * (size_t)(c->rows + 1));
  for (int64_t i = 0; i < c->rows * c->C; i++) x[i] = (float)(2 * urand(&seed) - 1);
  for (int64_t i = 0; i < c->C * c->V; i++) w[i] = (float)(0.6 * urand(&seed) - 0.3);
  for (int64_t r = 0; r < c->rows; r++) {
    t[r] = (int32_t)(urand(&seed) * (double)c->V);
    dy[r] = (float)(0.5 + urand(&seed)) / (float)c->rows;
  }
  double *nll = malloc(sizeof(double) * (size_t)(c->rows + 1)), *rdx = malloc(sizeof(double) * (size_t)(c->rows * c->C + 1));
  double *rdw = malloc(sizeof(double) * (size_t)(c->C * c->V));
  reference(&s, x, w, t, dy, nll, rdx, rdw);

  float *gn = malloc(sizeof(float) * (size_t)(c->rows + 1)), *gdx = malloc(sizeof(float) * (size_t)(c->rows * c->C + 1));
  float *gdw = malloc(sizeof(float) * (size_t)(c->C * c->V));
  float *sn = malloc(sizeof(float) * (size_t)(c->rows + 1)), *sdx = malloc(sizeof(float) * (size_t)(c->rows * c->C + 1));
  float *sdw = malloc(sizeof(float) * (size_t)(c->C * c->V));
  int threads = 3;
  struct {
    AttnSgemm gemm;
    AttnParFor par;
    const char *name;
  } ways[] = {{NULL, NULL, "loops"},      {NULL, reverse_par, "loops, reversed odd ranges"}, {NULL, thread_par, "loops, 3 threads"},
              {blas_sgemm, NULL, "blas"}, {blas_sgemm, thread_par, "blas, 3 threads"}};
  char how[160];
  for (size_t k = 0; k < sizeof ways / sizeof ways[0]; k++) {
    if (ways[k].gemm == blas_sgemm && !cblas) continue;
    s.sgemm = ways[k].gemm, s.par_for = ways[k].par, s.par = &threads;
    snprintf(how, sizeof how, "rows %lld C %lld V %lld %s, %s", (long long)c->rows, (long long)c->C, (long long)c->V,
             c->w_rows ? "table [V, C]" : "weight [C, V]", ways[k].name);
    EXPECT(lce_forward(&s, x, w, t, gn) == NULL);
    EXPECT(lce_backward(&s, x, w, t, gn, dy, gdx, gdw, 0) == NULL);
    for (int64_t r = 0; r < c->rows; r++) EXPECT_NEAR(gn[r], nll[r], 1e-5);
    expect_close("dx", gdx, rdx, c->rows * c->C, how);
    expect_close("dw", gdw, rdw, c->C * c->V, how);
    if (ways[k].par == NULL) {
      memcpy(sn, gn, sizeof(float) * (size_t)c->rows);
      memcpy(sdx, gdx, sizeof(float) * (size_t)(c->rows * c->C));
      memcpy(sdw, gdw, sizeof(float) * (size_t)(c->C * c->V));
    } else { /* the same GEMM hook run in one go: the same bits */
      if (memcmp(sn, gn, sizeof(float) * (size_t)c->rows) || memcmp(sdx, gdx, sizeof(float) * (size_t)(c->rows * c->C)) ||
          memcmp(sdw, gdw, sizeof(float) * (size_t)(c->C * c->V))) {
        fprintf(stderr, "test_lmce: %s: not the bits of the sequential run\n", how);
        test_failures++;
      }
    }
  }
  /* dw added into an existing gradient; dx alone; dw alone */
  s.sgemm = NULL, s.par_for = NULL;
  for (int64_t i = 0; i < c->C * c->V; i++) gdw[i] = 1.0f;
  EXPECT(lce_backward(&s, x, w, t, gn, dy, NULL, gdw, 1) == NULL);
  for (int64_t i = 0; i < c->C * c->V; i++) rdw[i] += 1.0;
  expect_close("dw added", gdw, rdw, c->C * c->V, "dw_add");
  memset(gdx, 0, sizeof(float) * (size_t)(c->rows * c->C));
  EXPECT(lce_backward(&s, x, w, t, gn, dy, gdx, NULL, 0) == NULL);
  expect_close("dx alone", gdx, rdx, c->rows * c->C, "no dw");
  free(x), free(w), free(dy), free(t), free(nll), free(rdx), free(rdw), free(gn), free(gdx), free(gdw), free(sn), free(sdx), free(sdw);
}

/* bf16 operands (train { precision = bf16 }): against the fp64 reference on
 * the bf16 values; the rows' losses within 1e-5 (fp32 sums of exact
 * products), dx and dw within 1e-2 of the largest (the logits' gradient is
 * rounded to bf16 before its GEMMs, as the unfused step stores it); a thread
 * split gives the same bits. */
static void run_case16(const Case *c) {
  LceShape s = {c->rows, c->C, c->V, c->w_rows, NULL, NULL, NULL, 1, 1, 0};
  uint64_t seed = (uint64_t)(c->rows * 17 + c->V);
  int64_t nx = c->rows * c->C, nw = c->C * c->V;
  float *x = malloc(sizeof(float) * (size_t)(nx + 1)), *w = malloc(sizeof(float) * (size_t)nw), *dy = malloc(sizeof(float) * (size_t)(c->rows + 1));
  uint16_t *x16 = malloc(sizeof(uint16_t) * (size_t)(nx + 1)), *w16 = malloc(sizeof(uint16_t) * (size_t)nw);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)(c->rows + 1));
  for (int64_t i = 0; i < nx; i++) x16[i] = half_bf16_from_f32((float)(2 * urand(&seed) - 1)), x[i] = half_bf16_to_f32(x16[i]);
  for (int64_t i = 0; i < nw; i++) w16[i] = half_bf16_from_f32((float)(0.6 * urand(&seed) - 0.3)), w[i] = half_bf16_to_f32(w16[i]);
  for (int64_t r = 0; r < c->rows; r++) t[r] = (int32_t)(urand(&seed) * (double)c->V), dy[r] = 1.0f / (float)c->rows;
  double *nll = malloc(sizeof(double) * (size_t)(c->rows + 1)), *rdx = malloc(sizeof(double) * (size_t)(nx + 1));
  double *rdw = malloc(sizeof(double) * (size_t)nw);
  reference(&s, x, w, t, dy, nll, rdx, rdw);
  float *gn = malloc(sizeof(float) * (size_t)(c->rows + 1)), *gdx = malloc(sizeof(float) * (size_t)(nx + 1));
  float *gdw = malloc(sizeof(float) * (size_t)nw), *sdx = malloc(sizeof(float) * (size_t)(nx + 1));
  int threads = 3;
  char how[120];
  snprintf(how, sizeof how, "bf16, rows %lld C %lld V %lld %s", (long long)c->rows, (long long)c->C, (long long)c->V,
           c->w_rows ? "table [V, C]" : "weight [C, V]");
  EXPECT(lce_forward(&s, x16, w16, t, gn) == NULL);
  EXPECT(lce_backward(&s, x16, w16, t, gn, dy, gdx, gdw, 0) == NULL);
  for (int64_t r = 0; r < c->rows; r++) EXPECT_NEAR(gn[r], nll[r], 1e-5);
  double tol[2] = {1e-2, 1e-2};
  for (int k = 0; k < 2; k++) {
    const float *got = k ? gdw : gdx;
    const double *want = k ? rdw : rdx;
    int64_t n = k ? nw : nx;
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]) / scale);
    if (!(worst <= tol[k])) {
      fprintf(stderr, "test_lmce: %s: %s off by %.3g of the largest\n", how, k ? "dw" : "dx", worst);
      test_failures++;
    }
  }
  memcpy(sdx, gdx, sizeof(float) * (size_t)nx);
  s.par_for = thread_par, s.par = &threads;
  EXPECT(lce_backward(&s, x16, w16, t, gn, dy, gdx, NULL, 0) == NULL);
  if (memcmp(sdx, gdx, sizeof(float) * (size_t)nx)) {
    fprintf(stderr, "test_lmce: %s: 3 threads do not give the bits of one\n", how);
    test_failures++;
  }
  free(x), free(w), free(dy), free(x16), free(w16), free(t), free(nll), free(rdx), free(rdw), free(gn), free(gdx), free(gdw), free(sdx);
}

/* No targets (LINEAR_LSE, the vocab-parallel form) over the first Vu of V
 * columns (a padded shard's valid prefix; vstride V for the [C, V] layout):
 * each row's log-sum-exp, dx = dy softmax W^T, dw over the prefix. */
static void run_lse(int w_rows) {
  const int64_t rows = 45, C = 12, V = 1100, Vu = 1000;
  LceShape s = {rows, C, Vu, w_rows, NULL, NULL, NULL, 0, 1, w_rows ? 0 : V};
  uint64_t seed = 99 + (uint64_t)w_rows;
  float *x = malloc(sizeof(float) * rows * C), *w = malloc(sizeof(float) * C * V), *dy = malloc(sizeof(float) * rows);
  for (int64_t i = 0; i < rows * C; i++) x[i] = (float)(2 * urand(&seed) - 1);
  for (int64_t i = 0; i < C * V; i++) w[i] = (float)(0.6 * urand(&seed) - 0.3);
  for (int64_t r = 0; r < rows; r++) dy[r] = (float)(0.5 + urand(&seed));
  double *lse = malloc(sizeof(double) * rows), *rdx = calloc((size_t)(rows * C), sizeof(double)), *rdw = calloc((size_t)(C * V), sizeof(double));
  double *z = malloc(sizeof(double) * Vu);
  for (int64_t r = 0; r < rows; r++) {
    double m = -INFINITY, sum = 0;
    for (int64_t v = 0; v < Vu; v++) {
      double d = 0;
      for (int64_t k = 0; k < C; k++) d += (double)x[r * C + k] * (w_rows ? w[v * C + k] : w[k * V + v]);
      z[v] = d, m = d > m ? d : m;
    }
    for (int64_t v = 0; v < Vu; v++) sum += exp(z[v] - m);
    lse[r] = m + log(sum);
    for (int64_t v = 0; v < Vu; v++) {
      double g = dy[r] * exp(z[v] - lse[r]);
      for (int64_t k = 0; k < C; k++) {
        rdx[r * C + k] += g * (w_rows ? w[v * C + k] : w[k * V + v]);
        rdw[w_rows ? v * C + k : k * V + v] += g * x[r * C + k];
      }
    }
  }
  float *gl = malloc(sizeof(float) * rows), *gdx = malloc(sizeof(float) * rows * C), *gdw = malloc(sizeof(float) * C * V);
  for (int64_t i = 0; i < C * V; i++) gdw[i] = 0.0f; /* the padding's part is the caller's (hostop.c zeroes it) */
  EXPECT(lce_forward(&s, x, w, NULL, gl) == NULL);
  for (int64_t r = 0; r < rows; r++) EXPECT_NEAR(gl[r], lse[r], 1e-5);
  EXPECT(lce_backward(&s, x, w, NULL, gl, dy, gdx, gdw, 0) == NULL);
  expect_close("lse dx", gdx, rdx, rows * C, w_rows ? "no targets, table" : "no targets, weight");
  expect_close("lse dw", gdw, rdw, C * V, w_rows ? "no targets, table" : "no targets, weight");
  free(x), free(w), free(dy), free(lse), free(rdx), free(rdw), free(z), free(gl), free(gdx), free(gdw);
}

int main(void) {
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void *blas = open_cblas();
  if (!cblas) fprintf(stderr, "test_lmce: no OpenBLAS (cblas_sgemm); the BLAS hook is not tested\n");
  const Case cases[] = {
      {1, 3, 5, 0},     {1, 3, 5, 1},      /* one row, a tiny vocabulary */
      {37, 16, 700, 1}, {37, 16, 700, 0},  /* a vocabulary of one block and a tail */
      {530, 8, 1100, 1},                   /* two passes of rows, three blocks */
      {70, 24, 9000, 0}, {70, 24, 9000, 1}, /* 9000 columns: chunks of a tail */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  for (size_t i = 2; i < sizeof cases / sizeof cases[0]; i++) run_case16(&cases[i]);
  run_lse(0);
  run_lse(1);

  /* a target outside the vocabulary is an error */
  LceShape s = {2, 2, 3, 1, NULL, NULL, NULL, 0, 1, 0};
  float x[4] = {1, 2, 3, 4}, w[6] = {0}, nll[2], dy[2] = {1, 1}, dx[4], dw[6];
  int32_t bad[2] = {0, 3}, neg[2] = {-1, 0};
  EXPECT_STR(lce_forward(&s, x, w, bad, nll), "linear_ce: a target outside the vocabulary");
  EXPECT_STR(lce_backward(&s, x, w, neg, nll, dy, dx, dw, 0), "linear_ce: a target outside the vocabulary");
  /* the scratch estimate covers a pass's blocks and partial dx */
  LceShape g = {256, 768, 50257, 1, NULL, NULL, NULL, 0, 1, 0};
  EXPECT(lce_scratch_bytes(&g, 2) >= (int64_t)sizeof(float) * 15 * 256 * 768);
  if (blas) dlclose(blas);
  TEST_DONE();
}
