/* test_attn.c - the tiled fp32 attention (core/numeric/attn.c) against a naive fp64
 * reference written here from ir_ops.h's semantics: forward (packed o and
 * lse) and backward (dq, dk, dv), for tiles with a tail, T = 1, S != T,
 * grouped-query heads, causal or not, context-parallel row and key
 * positions on every rank; with the module's own loops, a naive GEMM hook
 * and OpenBLAS's cblas_sgemm (opened at run time, as the planner's
 * benchmark does; skipped without it). Every split of the work items (odd
 * ranges run in reverse, real threads) gives the bits of the sequential
 * run. Values agree within 1e-5 relative to max(|ref|, M), M the largest
 * |ref| of the tensor (o and lse apart; see expect_close). The reference
 * backward is checked against finite differences of the reference
 * forward, the lse column's gradient included. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "test_hooks.h"
#include "test_util.h"

#define TOL 1e-5

/* ---- the fp64 reference ---- */

static int64_t zz(int64_t r, int64_t size, int64_t local, int64_t i) {
  int64_t h = local / 2;
  return i < h ? r * h + i : (2 * size - 1 - r) * h + (i - h);
}

static int64_t rowpos(const AttnShape *s, int64_t t) { return s->row_size <= 1 ? t : zz(s->row_rank, s->row_size, s->T, t); }

static int64_t colpos(const AttnShape *s, int64_t j) {
  if (s->col_size > 1 && s->col_span > s->S) return zz(s->col_rank, s->col_size, s->S, j); /* one ring block: col_rank's */
  if (s->col_size <= 1) return j;
  int64_t len = s->S / s->col_size, blk = j / len, owner = (s->col_rank - blk + s->col_size) % s->col_size;
  return zz(owner, s->col_size, len, j % len);
}

static int allowed(const AttnShape *s, int64_t t, int64_t j) {
  if (!s->causal) return 1;
  int64_t d = rowpos(s, t) - colpos(s, j);
  return d >= 0 && (s->window <= 0 || d < s->window);
}

/* scores of row t of head (b, h) against every key, into sc[S] */
static void ref_scores(const AttnShape *s, const double *q, const double *k, int64_t b, int64_t h, int64_t t, double *sc) {
  int64_t hk = h / (s->H / s->Hk);
  const double *qt = q + ((b * s->H + h) * s->T + t) * s->D;
  for (int64_t j = 0; j < s->S; j++) {
    const double *kj = k + ((b * s->Hk + hk) * s->S + j) * s->D;
    double d = 0;
    for (int64_t c = 0; c < s->D; c++) d += qt[c] * kj[c];
    sc[j] = s->scale * d;
  }
}

static void ref_forward(const AttnShape *s, const double *q, const double *k, const double *v, double *out) {
  double *sc = malloc(sizeof(double) * (size_t)s->S);
  int64_t Dv = s->Dv;
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t h = 0; h < s->H; h++)
      for (int64_t t = 0; t < s->T; t++) {
        int64_t hk = h / (s->H / s->Hk);
        double *o = out + ((b * s->H + h) * s->T + t) * (Dv + 1);
        ref_scores(s, q, k, b, h, t, sc);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s->S; j++)
          if (allowed(s, t, j) && sc[j] > mx) mx = sc[j];
        for (int64_t j = 0; j < s->S; j++)
          if (allowed(s, t, j)) sum += exp(sc[j] - mx);
        double lse = sum > 0 ? mx + log(sum) : -INFINITY;
        for (int64_t c = 0; c < Dv; c++) o[c] = 0;
        for (int64_t j = 0; j < s->S && sum > 0; j++) {
          if (!allowed(s, t, j)) continue;
          double p = exp(sc[j] - lse);
          const double *vj = v + ((b * s->Hk + hk) * s->S + j) * Dv;
          for (int64_t c = 0; c < Dv; c++) o[c] += p * vj[c];
        }
        o[Dv] = lse;
      }
  free(sc);
}

static void ref_backward(const AttnShape *s, const double *q, const double *k, const double *v, const double *out,
                         const double *dout, double *grads) {
  int64_t D = s->D, Dv = s->Dv, S = s->S;
  double *dq = grads, *dk = dq + s->B * s->H * s->T * D, *dv = dk + s->B * s->Hk * S * D;
  memset(grads, 0, sizeof(double) * (size_t)(s->B * s->H * s->T * D + s->B * s->Hk * S * (D + Dv)));
  double *sc = malloc(sizeof(double) * (size_t)S);
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t h = 0; h < s->H; h++)
      for (int64_t t = 0; t < s->T; t++) {
        int64_t hk = h / (s->H / s->Hk), row = (b * s->H + h) * s->T + t;
        const double *o = out + row * (Dv + 1), *dO = dout + row * (Dv + 1), *qt = q + row * D;
        double lse = o[Dv], Dt = -dO[Dv];
        for (int64_t c = 0; c < Dv; c++) Dt += dO[c] * o[c];
        ref_scores(s, q, k, b, h, t, sc);
        for (int64_t j = 0; j < S; j++) {
          if (!allowed(s, t, j) || lse == -INFINITY) continue;
          const double *kj = k + ((b * s->Hk + hk) * S + j) * D, *vj = v + ((b * s->Hk + hk) * S + j) * Dv;
          double p = exp(sc[j] - lse), dp = 0;
          for (int64_t c = 0; c < Dv; c++) dp += dO[c] * vj[c];
          double ds = p * (dp - Dt);
          for (int64_t c = 0; c < D; c++) dq[row * D + c] += s->scale * ds * kj[c];
          for (int64_t c = 0; c < D; c++) dk[((b * s->Hk + hk) * S + j) * D + c] += s->scale * ds * qt[c];
          for (int64_t c = 0; c < Dv; c++) dv[((b * s->Hk + hk) * S + j) * Dv + c] += p * dO[c];
        }
      }
  free(sc);
}

/* ---- hooks ---- */

/* A naive GEMM in another loop order than the module's (dot products in
 * double), so the hook path is exercised without a BLAS. */
static void naive_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double d = 0;
      for (int64_t p = 0; p < k; p++) d += (double)(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = (float)(alpha * d + (beta == 0.0f ? 0.0 : (double)beta * c[i * ldc + j]));
    }
}

/* ---- helpers ---- */

static void fill(float *x, int64_t n, uint32_t seed, float amp) {
  uint32_t st = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; i++) {
    st = st * 1664525u + 1013904223u;
    x[i] = amp * ((float)(st >> 8) / 8388608.0f - 1.0f);
  }
}

static double *widen(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static const char *case_name;

typedef struct {
  int64_t B, H, Hk, T, S, D, Dv;
  int causal, row_rank, row_size, col_rank, col_size;
  int64_t window; /* 0: none */
} Case;

/* Columns [c0, c1) of rows x cols values: |got - ref| <= TOL max(|ref|, M)
 * with M the largest |ref| of those columns (a fixed floor fails fp32:
 * a small gradient entry or output is a sum of terms of size M that
 * cancel, and rounding the terms leaves ~1e-7 M); -inf must be exact. */
static void expect_close(const float *got, const double *ref, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                         const char *what) {
  double M = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = c0; c < c1; c++)
      if (isfinite(ref[r * cols + c]) && fabs(ref[r * cols + c]) > M) M = fabs(ref[r * cols + c]);
  int bad = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = c0; c < c1; c++) {
      double w = ref[r * cols + c], g = got[r * cols + c], e = isinf(w) ? (g == w ? 0 : INFINITY) : fabs(g - w);
      double rel = e / (fabs(w) > M ? fabs(w) : M > 0 ? M : 1);
      if (!(rel <= TOL) && bad++ < 3)
        fprintf(stderr, "%s %s [%lld, %lld]: got %.9g, want %.9g\n", case_name, what, (long long)r, (long long)c, g, w);
    }
  if (bad) fprintf(stderr, "%s %s: %d of %lld off\n", case_name, what, bad, (long long)(rows * (c1 - c0)));
  EXPECT(bad == 0);
}

/* o and lse apart: different quantities, different sizes */
static void expect_out(const float *got, const double *ref, const Case *c, const char *what) {
  char w[96];
  int64_t rows = c->B * c->H * c->T;
  snprintf(w, sizeof w, "%s o", what);
  expect_close(got, ref, rows, c->Dv + 1, 0, c->Dv, w);
  snprintf(w, sizeof w, "%s lse", what);
  expect_close(got, ref, rows, c->Dv + 1, c->Dv, c->Dv + 1, w);
}

static void expect_grads(const float *got, const double *ref, const Case *c, const char *what) {
  char w[96];
  int64_t nq = c->B * c->H * c->T * c->D, nk = c->B * c->Hk * c->S * c->D, nv = c->B * c->Hk * c->S * c->Dv;
  snprintf(w, sizeof w, "%s dq", what);
  expect_close(got, ref, 1, nq, 0, nq, w);
  snprintf(w, sizeof w, "%s dk", what);
  expect_close(got + nq, ref + nq, 1, nk, 0, nk, w);
  snprintf(w, sizeof w, "%s dv", what);
  expect_close(got + nq + nk, ref + nq + nk, 1, nv, 0, nv, w);
}

static void expect_same(const float *a, const float *b, int64_t n, const char *what) {
  int same = memcmp(a, b, sizeof(float) * (size_t)n) == 0;
  if (!same) fprintf(stderr, "%s %s: not bit-identical to the sequential run\n", case_name, what);
  EXPECT(same);
}


static AttnShape shape_of(const Case *c) {
  AttnShape s = {.B = c->B, .H = c->H, .Hk = c->Hk, .T = c->T, .S = c->S, .D = c->D, .Dv = c->Dv,
                 .scale = 1.3 / sqrt((double)c->D), .causal = c->causal, .row_rank = c->row_rank,
                 .row_size = c->row_size, .col_rank = c->col_rank, .col_size = c->col_size, .window = c->window};
  if (c->col_size < -1) { /* the cases' notation for one ring block of -col_size: a span of S x c */
    s.col_size = -c->col_size;
    s.col_span = c->S * s.col_size;
  }
  return s;
}

/* One shape: the forward and backward of every hook and split. */
static void run_case(const Case *c) {
  char name[160];
  snprintf(name, sizeof name, "[B%lld H%lld/%lld T%lld S%lld D%lld Dv%lld causal%d row%d/%d col%d/%d window%lld]", (long long)c->B,
           (long long)c->H, (long long)c->Hk, (long long)c->T, (long long)c->S, (long long)c->D, (long long)c->Dv,
           c->causal, c->row_rank, c->row_size, c->col_rank, c->col_size, (long long)c->window);
  case_name = name;
  AttnShape s = shape_of(c);
  int64_t nq = c->B * c->H * c->T * c->D, nk = c->B * c->Hk * c->S * c->D, nv = c->B * c->Hk * c->S * c->Dv;
  int64_t no = c->B * c->H * c->T * (c->Dv + 1), ng = nq + nk + nv;
  float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
  float *v = malloc(sizeof(float) * (size_t)nv), *dout = malloc(sizeof(float) * (size_t)no);
  float *out0 = malloc(sizeof(float) * (size_t)no), *out = malloc(sizeof(float) * (size_t)no);
  float *outb = malloc(sizeof(float) * (size_t)no);
  float *g0 = malloc(sizeof(float) * (size_t)ng), *g = malloc(sizeof(float) * (size_t)ng), *gb = malloc(sizeof(float) * (size_t)ng);
  fill(q, nq, 1, 2.0f);
  fill(k, nk, 2, 2.0f);
  fill(v, nv, 3, 1.0f);
  fill(dout, no, 4, 1.0f);
  double *qd = widen(q, nq), *kd = widen(k, nk), *vd = widen(v, nv), *doutd = widen(dout, no);
  double *ref = malloc(sizeof(double) * (size_t)no), *gref = malloc(sizeof(double) * (size_t)ng);
  ref_forward(&s, qd, kd, vd, ref);

  /* forward: the module's loops, sequential; then every other way */
  memset(out0, 0xff, sizeof(float) * (size_t)no); /* NaNs: every value must be written */
  EXPECT(attn_forward(&s, q, k, v, out0) == NULL);
  expect_out(out0, ref, c, "loops");
  if (c->causal && c->col_size >= -1) { /* a row always sees position 0 (the ring has every block, zigzag chunk 0
                                           starts it); of one block, a row may see none (lse -inf) */
    int finite = 1;
    for (int64_t r = 0; r < no / (c->Dv + 1); r++) finite &= isfinite(out0[r * (c->Dv + 1) + c->Dv]);
    EXPECT(finite);
  }
  int threads = 3;
  struct {
    AttnSgemm gemm;
    AttnParFor par;
    const char *what;
  } ways[] = {{NULL, reverse_par, "loops, reversed odd ranges"}, {NULL, thread_par, "loops, 3 threads"},
              {naive_sgemm, NULL, "naive hook"}, {naive_sgemm, reverse_par, "naive hook, reversed odd ranges"},
              {blas_sgemm, NULL, "blas"}, {blas_sgemm, reverse_par, "blas, reversed odd ranges"},
              {blas_sgemm, thread_par, "blas, 3 threads"}};
  const float *base = out0;
  for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
    if (ways[w].gemm == blas_sgemm && !cblas) continue;
    s.sgemm = ways[w].gemm, s.par_for = ways[w].par, s.par = &threads;
    float *dst = ways[w].par ? out : outb;
    memset(dst, 0xff, sizeof(float) * (size_t)no);
    EXPECT(attn_forward(&s, q, k, v, dst) == NULL);
    if (ways[w].par) expect_same(dst, base, no, ways[w].what);
    else expect_out(dst, ref, c, ways[w].what), base = outb;
  }

  /* backward, all from the module's fp32 forward (the reference reads the same out) */
  double *outd = widen(out0, no);
  ref_backward(&s, qd, kd, vd, outd, doutd, gref);
  s.sgemm = NULL, s.par_for = NULL;
  memset(g0, 0xff, sizeof(float) * (size_t)ng);
  EXPECT(attn_backward(&s, q, k, v, out0, dout, g0) == NULL);
  expect_grads(g0, gref, c, "loops");
  base = g0;
  for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
    if (ways[w].gemm == blas_sgemm && !cblas) continue;
    s.sgemm = ways[w].gemm, s.par_for = ways[w].par, s.par = &threads;
    float *dst = ways[w].par ? g : gb;
    memset(dst, 0xff, sizeof(float) * (size_t)ng);
    EXPECT(attn_backward(&s, q, k, v, out0, dout, dst) == NULL);
    if (ways[w].par) expect_same(dst, base, ng, ways[w].what);
    else expect_grads(dst, gref, c, ways[w].what), base = gb;
  }

  /* a row with lse = -inf (no allowed key) contributes nothing to the gradients */
  out0[(c->T / 2) * (c->Dv + 1) + c->Dv] = -INFINITY;
  outd[(c->T / 2) * (c->Dv + 1) + c->Dv] = -INFINITY;
  ref_backward(&s, qd, kd, vd, outd, doutd, gref);
  s.sgemm = NULL, s.par_for = NULL;
  EXPECT(attn_backward(&s, q, k, v, out0, dout, g) == NULL);
  expect_grads(g, gref, c, "empty row");

  free(q), free(k), free(v), free(dout), free(out0), free(out), free(outb), free(g0), free(g), free(gb);
  free(qd), free(kd), free(vd), free(doutd), free(ref), free(gref), free(outd);
}

/* The reference backward is the gradient of L = sum dout * forward (o and
 * lse): central differences of the reference forward, in double. */
static void test_reference_gradient(const Case *c) {
  AttnShape s = shape_of(c);
  int64_t nq = c->B * c->H * c->T * c->D, nk = c->B * c->Hk * c->S * c->D, nv = c->B * c->Hk * c->S * c->Dv;
  int64_t no = c->B * c->H * c->T * (c->Dv + 1), ng = nq + nk + nv;
  float *f = malloc(sizeof(float) * (size_t)(ng + no));
  fill(f, ng + no, 7, 1.0f);
  double *x = widen(f, ng), *dout = widen(f + ng, no); /* q, k, v one after another, as the gradients */
  double *out = malloc(sizeof(double) * (size_t)no), *grads = malloc(sizeof(double) * (size_t)ng);
  ref_forward(&s, x, x + nq, x + nq + nk, out);
  ref_backward(&s, x, x + nq, x + nq + nk, out, dout, grads);
  int bad = 0;
  for (int64_t i = 0; i < ng; i++) {
    double keep = x[i], L[2], h = 1e-5;
    for (int side = 0; side < 2; side++) {
      x[i] = keep + (side ? h : -h);
      ref_forward(&s, x, x + nq, x + nq + nk, out);
      L[side] = 0;
      for (int64_t o = 0; o < no; o++) L[side] += dout[o] * out[o];
    }
    x[i] = keep;
    double fd = (L[1] - L[0]) / (2 * h);
    if (fabs(fd - grads[i]) > 1e-6 * (fabs(fd) > 1 ? fabs(fd) : 1)) {
      if (bad++ < 3) fprintf(stderr, "gradient %lld: backward %.12g, differences %.12g\n", (long long)i, grads[i], fd);
    }
  }
  EXPECT(bad == 0);
  free(f), free(x), free(dout), free(out), free(grads);
}

static void test_bad_shapes(void) {
  Case ok = {1, 4, 2, 8, 16, 4, 4, 1, 1, 2, 1, 2, 0};
  AttnShape s = shape_of(&ok);
  float buf[1024] = {0};
  EXPECT(attn_scratch_bytes(&s, 1) > 0);
  struct {
    int64_t *field;
    int64_t value;
  } dims[] = {{&s.T, 0}, {&s.S, 0}, {&s.B, 0}, {&s.D, 0}, {&s.Dv, 0}, {&s.Hk, 3}, {&s.S, 15}};
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
    AttnShape keep = s;
    *dims[i].field = dims[i].value;
    EXPECT(attn_forward(&s, buf, buf, buf, buf) != NULL);
    EXPECT(attn_backward(&s, buf, buf, buf, buf, buf, buf) != NULL);
    EXPECT(attn_scratch_bytes(&s, 1) == -1);
    s = keep;
  }
  s.row_rank = 2;
  EXPECT_STR(attn_forward(&s, buf, buf, buf, buf), "attention: row_rank outside [0, row_size)");
  s.row_rank = 1, s.col_rank = -1;
  EXPECT_STR(attn_forward(&s, buf, buf, buf, buf), "attention: col_rank outside [0, col_size)");
  s.col_rank = 1, s.T = 0;
  EXPECT_STR(attn_forward(&s, buf, buf, buf, buf), "attention: T and S must be at least 1");
  EXPECT(attn_forward(NULL, buf, buf, buf, buf) != NULL);
  s.T = (int64_t)1 << 40, s.D = (int64_t)1 << 30; /* B H T D past any array */
  EXPECT_STR(attn_forward(&s, buf, buf, buf, buf), "attention: shape too large");

  /* scratch that can't be had (256 TB, past any address space): a reason,
   * and no input read (ASan aborts on such a request instead of returning
   * NULL) */
#if defined(__SANITIZE_ADDRESS__)
#define ATTN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_TEST_ASAN 1
#endif
#endif
#ifndef ATTN_TEST_ASAN
  AttnShape huge = {.B = 1, .H = 1, .Hk = 1, .T = 1, .S = (int64_t)1 << 45, .D = 1, .Dv = 1, .scale = 1};
  EXPECT_STR(attn_forward(&huge, buf, buf, buf, buf), "attention: out of memory for scratch");
  EXPECT_STR(attn_backward(&huge, buf, buf, buf, buf, buf, buf), "attention: out of memory for scratch");
#endif

  /* scratch: a worker per thread, at most one per (batch, key head): two
   * tiles of 8 x 16 and 8 row values, then 16 ring positions */
  s = shape_of(&ok);
  int64_t one = attn_scratch_bytes(&s, 1);
  EXPECT(one == (int64_t)sizeof(float) * (2 * 8 * 16 + 8) + (int64_t)sizeof(int64_t) * 16);
  EXPECT(attn_scratch_bytes(&s, 2) == 2 * one);
  EXPECT(attn_scratch_bytes(&s, 8) == 2 * one);
}

int main(void) {
  /* one BLAS thread: the bit-identity checks are about the module's split */
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void *blas = open_cblas();
  if (!cblas) fprintf(stderr, "test_attn: no OpenBLAS (cblas_sgemm); the BLAS hook is not tested\n");

  const Case cases[] = {
      /* tiles with a tail, D = 3 */
      {2, 2, 2, 70, 70, 3, 5, 1, 0, 1, 0, 1, 0},
      {2, 2, 2, 70, 70, 3, 5, 0, 0, 1, 0, 1, 0},
      /* T = 1 */
      {1, 1, 1, 1, 1, 3, 3, 1, 0, 1, 0, 1, 0},
      {1, 2, 1, 1, 37, 16, 8, 0, 0, 1, 0, 1, 0},
      {1, 2, 1, 1, 37, 16, 8, 1, 0, 1, 0, 1, 0},
      /* S != T non-causal, D = 64 */
      {1, 2, 2, 65, 130, 64, 32, 0, 0, 1, 0, 1, 0},
      /* grouped-query heads, D = 100, Dv != D */
      {1, 6, 2, 100, 100, 100, 64, 1, 0, 1, 0, 1, 0},
      {1, 4, 1, 130, 90, 100, 48, 0, 0, 1, 0, 1, 0},
      /* causal with T > S and T < S */
      {1, 4, 1, 130, 90, 64, 100, 1, 0, 1, 0, 1, 0},
      {2, 2, 1, 30, 80, 64, 16, 1, 0, 1, 0, 1, 0},
      /* context parallelism: odd mixes */
      {1, 2, 1, 2, 4, 3, 2, 1, 1, 2, 1, 2, 0},
      {1, 2, 2, 8, 16, 3, 5, 1, 1, 2, 0, 2, 0},
      {1, 2, 2, 10, 20, 4, 4, 0, 1, 2, 1, 2, 0},
      {1, 2, 2, 70, 140, 8, 8, 1, 1, 2, 0, 1, 0}, /* zigzag rows, keys in order: a prefix per tile */
      /* sliding windows: 1 key, narrower than a tile, wider, with grouped heads, under a ring */
      {1, 2, 2, 70, 70, 8, 8, 1, 0, 1, 0, 1, 1},
      {2, 4, 2, 130, 130, 16, 8, 1, 0, 1, 0, 1, 17},
      {1, 2, 1, 150, 150, 8, 4, 1, 0, 1, 0, 1, 100},
      {1, 2, 2, 8, 16, 3, 5, 1, 1, 2, 0, 2, 5},
      {1, 2, 2, 70, 140, 8, 8, 1, 1, 2, 0, 1, 30},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
  /* one ring block at a time (cases' col_size = -c: col_span S x c, cp_comm = ring): every pair of a row rank and
   * a block's rank of 2 and 4, rows none of whose keys are allowed among them; a window */
  for (int size = 2; size <= 4; size += 2)
    for (int r = 0; r < size; r++)
      for (int o = 0; o < size; o++) {
        int64_t T = size == 2 ? 70 : 18;
        Case c = {2, 4, 2, T, T, 16, 8, 1, r, size, o, -size, o == r && size == 4 ? 7 : 0};
        run_case(&c);
      }
  /* context parallelism on every rank of 2 and 4: local T even, S = T size */
  for (int size = 2; size <= 4; size += 2)
    for (int r = 0; r < size; r++) {
      int64_t T = size == 2 ? 70 : 66;
      Case c = {2, 4, 2, T, T * size, 16, 8, 1, r, size, r, size, 0};
      run_case(&c);
    }

  const Case fd[] = {
      {1, 4, 2, 4, 8, 3, 2, 1, 1, 2, 1, 2, 0}, /* causal, ring keys, grouped heads */
      {1, 2, 1, 3, 5, 2, 3, 0, 0, 1, 0, 1, 0},
      {1, 1, 1, 5, 5, 3, 2, 1, 0, 1, 0, 1, 0},
      {1, 2, 1, 6, 12, 3, 2, 1, 1, 2, 0, 2, 3}, /* a window under a ring */
  };
  for (size_t i = 0; i < sizeof fd / sizeof *fd; i++) test_reference_gradient(&fd[i]);
  test_bad_shapes();
  if (blas) dlclose(blas);
  TEST_DONE();
}
