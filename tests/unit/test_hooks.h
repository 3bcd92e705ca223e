/* test_hooks.h - the GEMM and worker hooks of core/numeric/attn.h (AttnSgemm,
 * AttnParFor) as the fp32 host kernels' tests drive them: OpenBLAS's
 * cblas_sgemm opened at run time (as the planner's benchmark does), ranges
 * run out of order, and real threads (the runtime's par.h is not linked into
 * core tests). */
#ifndef HPDL_TEST_HOOKS_H
#define HPDL_TEST_HOOKS_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*CblasSgemm)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc);
static CblasSgemm cblas;

static inline void blas_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas(101, ta ? 112 : 111, tb ? 112 : 111, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* Ranges of 1, 2, 3, 1, 2, 3, ... items, run last first. */
static inline void reverse_par(void *par, int64_t n, void (*fn)(void *, int64_t, int64_t), void *ctx) {
  int64_t *lo = malloc(sizeof(int64_t) * (size_t)(n + 1)), r = 0;
  for (int64_t at = 0; at < n; r++) lo[r] = at, at += 1 + r % 3;
  lo[r] = n;
  for (int64_t i = r - 1; i >= 0; i--) fn(ctx, lo[i], lo[i + 1]);
  free(lo);
}

/* Real threads: one per range of about n / nthreads items (a par_for of
 * the test's own; the runtime's par.h is not linked into core tests). */
typedef struct {
  void (*fn)(void *, int64_t, int64_t);
  void *ctx;
  int64_t lo, hi;
} Range;

static inline void *range_run(void *arg) {
  Range *r = arg;
  r->fn(r->ctx, r->lo, r->hi);
  return NULL;
}

static inline void thread_par(void *par, int64_t n, void (*fn)(void *, int64_t, int64_t), void *ctx) {
  int nt = *(const int *)par;
  Range r[8];
  pthread_t tid[8];
  int started[8] = {0};
  if (nt > 8) nt = 8;
  for (int i = 0; i < nt; i++) {
    r[i] = (Range){fn, ctx, n * i / nt, n * (i + 1) / nt};
    if (r[i].lo < r[i].hi) started[i] = pthread_create(&tid[i], NULL, range_run, &r[i]) == 0;
    if (r[i].lo < r[i].hi && !started[i]) range_run(&r[i]);
  }
  for (int i = 0; i < nt; i++)
    if (started[i]) pthread_join(tid[i], NULL);
}

/* Opens OpenBLAS and sets cblas; NULL (cblas unset) when it is missing. */
static inline void *open_cblas(void) {
  void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!blas) blas = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  if (blas) *(void **)&cblas = dlsym(blas, "cblas_sgemm");
  return blas;
}

#endif
