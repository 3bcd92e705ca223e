/* cpubench.c - sgemm and triad microbenchmarks (see cpubench.h). */
#include "cpubench.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gemm16.h"
#include "half.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* cblas_sgemm's signature; OpenBLAS is opened at run time so that hpdlc
 * does not link it (the back end's artifacts do). */
typedef void (*SgemmFn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *b, int ldb, float beta, float *c, int ldc);
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111 };

/* The opened sgemm as gemm16.h's fallback (bf16 GEMMs without oneDNN). */
static SgemmFn opened_sgemm;
static void fallback_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                           const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  opened_sgemm(CBLAS_ROW_MAJOR, ta ? 112 : CBLAS_NO_TRANS, tb ? 112 : CBLAS_NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
               (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

static void plain_sgemm(int n, const float *a, const float *b, float *c) {
  /* i-k-j order: the inner loop streams rows, which the compiler vectorises */
  memset(c, 0, sizeof(float) * (size_t)n * (size_t)n);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n; k++) {
      float av = a[(size_t)i * (size_t)n + (size_t)k];
      const float *br = b + (size_t)k * (size_t)n;
      float *cr = c + (size_t)i * (size_t)n;
      for (int j = 0; j < n; j++) cr[j] += av * br[j];
    }
}

int cpubench_measure(CpuFigures *out, char *why, size_t whylen) {
  memset(out, 0, sizeof *out);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  out->mem_bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  out->threads = cores > 0 ? (int)cores : 1;
  const int n = 1024;
  size_t nn = (size_t)n * (size_t)n;
  float *a = malloc(sizeof(float) * nn), *b = malloc(sizeof(float) * nn), *c = malloc(sizeof(float) * nn);
  if (!a || !b || !c) {
    free(a), free(b), free(c);
    snprintf(why, whylen, "out of memory for the sgemm benchmark");
    return -1;
  }
  for (size_t i = 0; i < nn; i++) {
    a[i] = (float)(i % 7) * 0.25f;
    b[i] = (float)(i % 5) * 0.5f;
  }
  /* OpenBLAS's idle threads spin (sched_yield) for 2^28 cycles, about 0.1 s,
   * from its load and after each call: through the bf16 products timed
   * below, which shared a core with one and ran at half their rate (207
   * GFLOP/s of 420 on 2 cores). hpdlrun sets 2^20 cycles (runtime/cores.h,
   * CORES_BLAS_TIMEOUT): timed as they run there, a user's setting included. */
  setenv("OPENBLAS_THREAD_TIMEOUT", "20", 0);
  void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!blas) blas = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  SgemmFn sgemm = NULL;
  if (blas) *(void **)&sgemm = dlsym(blas, "cblas_sgemm");
  out->used_blas = sgemm != NULL;
  double best = 1e30;
  for (int rep = 0; rep < (sgemm ? 5 : 2); rep++) {
    double t0 = now_s();
    if (sgemm) sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    else plain_sgemm(n, a, b, c);
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  out->sgemm_flops = 2.0 * (double)n * (double)n * (double)n / best;
  /* the same product on bf16 operands, as mixed precision's GEMMs run (the
   * first call makes oneDNN's kernel: not timed) */
  uint16_t *a16 = malloc(sizeof(uint16_t) * nn), *b16 = malloc(sizeof(uint16_t) * nn);
  snprintf(out->bf16_how, sizeof out->bf16_how, "%s", gemm16_backend());
  /* widened to fp32 for plain loops (no oneDNN, no OpenBLAS): the fp32 figure */
  int plain = !sgemm && strncmp(out->bf16_how, "oneDNN", 6) != 0;
  out->bf16_flops = out->sgemm_flops;
  if (a16 && b16 && !plain) {
    for (size_t i = 0; i < nn; i++) a16[i] = half_bf16_from_f32(a[i]), b16[i] = half_bf16_from_f32(b[i]);
    char err[128];
    best = 1e30;
    opened_sgemm = sgemm;
    for (int rep = 0; rep < 4; rep++) {
      double t0 = now_s();
      if (gemm16_bf16(0, 0, n, n, n, 1.0f, a16, n, b16, n, 0.0f, c, n, sgemm ? fallback_sgemm : NULL, 0, err,
                      (int)sizeof err))
        break;
      double t = now_s() - t0;
      if (rep > 0 && t < best) best = t;
    }
    out->bf16_flops = best < 1e30 ? 2.0 * (double)n * (double)n * (double)n / best : 0;
  }
  free(a16), free(b16);
  if (blas) dlclose(blas);
  free(a), free(b), free(c);
  /* STREAM triad, a[i] = b[i] + s * c[i], over arrays far larger than cache */
  size_t len = (size_t)16 << 20;
  double *x = malloc(sizeof(double) * len), *y = malloc(sizeof(double) * len), *z = malloc(sizeof(double) * len);
  if (!x || !y || !z) {
    free(x), free(y), free(z);
    snprintf(why, whylen, "out of memory for the bandwidth benchmark");
    return -1;
  }
  for (size_t i = 0; i < len; i++) y[i] = 1.0, z[i] = 2.0, x[i] = 0;
  best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now_s();
    for (size_t i = 0; i < len; i++) x[i] = y[i] + 3.0 * z[i];
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  volatile double sink = x[len / 2];
  (void)sink;
  out->triad_bytes_per_s = 3.0 * sizeof(double) * (double)len / best;
  free(x), free(y), free(z);
  return 0;
}
