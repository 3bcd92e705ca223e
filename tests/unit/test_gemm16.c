/* test_gemm16.c - bf16 GEMMs (core/numeric/gemm16.h): every transpose
 * combination, alpha, beta 0 and 1, leading dimensions wider than the
 * matrices, shapes not multiples of any tile, k = 1 and a long k, against an
 * fp64 product of the same bf16 values; within 2^-20 of the sum of |terms|
 * (fp32 accumulation of up to 4096 terms, any order). Run three times by
 * CTest: as found (oneDNN where libdnnl.so.2 is installed: its name is
 * printed), with HPDL_GEMM16=fp32 (the operands widened for the fallback's
 * loops), and with oneDNN held to AVX2 (DNNL_MAX_CPU_ISA), a CPU without
 * bf16 instructions, where the widened path must be chosen. A
 * product that skips a term, or reads a neighbouring row, fails by far more. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm16.h"
#include "half.h"
#include "test_util.h"

static uint64_t rng = 88172645463325252ull;
static float uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void one_case(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, float beta, int64_t pad) {
  /* stored shapes: op(A) = A^T stores [k, m] */
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
  uint16_t *a = malloc(sizeof(uint16_t) * (size_t)(ar * lda)), *b = malloc(sizeof(uint16_t) * (size_t)(br * ldb));
  float *c = malloc(sizeof(float) * (size_t)(m * ldc)), *c0 = malloc(sizeof(float) * (size_t)(m * ldc));
  for (int64_t i = 0; i < ar * lda; i++) a[i] = half_bf16_from_f32(uniform());
  for (int64_t i = 0; i < br * ldb; i++) b[i] = half_bf16_from_f32(uniform());
  for (int64_t i = 0; i < m * ldc; i++) c[i] = c0[i] = uniform();
  char why[256] = "";
  int rc = gemm16_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, 1, why, (int)sizeof why);
  EXPECT(rc == 0);
  double worst = 0;
  int pads_kept = 1;
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) {
        double x = half_bf16_to_f32(ta ? a[p * lda + i] : a[i * lda + p]);
        double y = half_bf16_to_f32(tb ? b[j * ldb + p] : b[p * ldb + j]);
        s += x * y;
        mag += fabs(x * y);
      }
      double want = alpha * s + beta * c0[i * ldc + j];
      double scale = fabs(alpha) * mag + fabs(beta * c0[i * ldc + j]) + 1e-30;
      double e = fabs(c[i * ldc + j] - want) / scale;
      if (e > worst) worst = e;
    }
    for (int64_t j = n; j < ldc; j++) pads_kept &= c[i * ldc + j] == c0[i * ldc + j];
  }
  if (worst > 1.0 / 1048576 || !pads_kept || rc)
    fprintf(stderr, "  %s%s %lld x %lld x %lld alpha %g beta %g pad %lld: error %.2e of the terms' sum%s %s\n",
            ta ? "A^T" : "A", tb ? " B^T" : " B", (long long)m, (long long)n, (long long)k, alpha, beta,
            (long long)pad, worst, pads_kept ? "" : ", wrote past the rows", why);
  EXPECT(worst <= 1.0 / 1048576);
  EXPECT(pads_kept);
  free(a);
  free(b);
  free(c);
  free(c0);
}

int main(void) {
  int cases = 0;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      one_case(ta, tb, 37, 29, 53, 1.0f, 0.0f, 0), cases++;
      one_case(ta, tb, 64, 96, 256, 0.125f, 0.0f, 3), cases++;
      one_case(ta, tb, 5, 131, 1, 1.0f, 1.0f, 1), cases++;
      one_case(ta, tb, 130, 17, 4096, 1.0f, 1.0f, 0), cases++;
      one_case(ta, tb, 1, 1, 7, -2.0f, 0.0f, 0), cases++;
    }
  /* k = 0: C = beta C */
  float c[2] = {3, 4};
  uint16_t none = 0;
  char why[64];
  EXPECT(gemm16_bf16(0, 0, 1, 2, 0, 1.0f, &none, 1, &none, 2, 0.0f, c, 2, NULL, 1, why, (int)sizeof why) == 0);
  EXPECT(c[0] == 0 && c[1] == 0);
  printf("%d products by %s\n", cases, gemm16_backend());
  gemm16_release();
  /* HPDL_GEMM16_EXPECT: what the backend's name must say in this run */
  const char *expect = getenv("HPDL_GEMM16_EXPECT");
  EXPECT(strstr(gemm16_backend(), expect ? expect : "") != NULL);
  TEST_DONE();
}
