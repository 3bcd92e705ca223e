/* layernorm_test.cpp - runs layernorm.cu's layernorm_fwd on rows of 1, 31, 33, 1000 and
 * 4097 values (blocks of 32, 256, 1024 threads; dynamic shared memory n floats).
 * Inputs x = 3 + N(0,1)-like (a mean far from 0, as activations have), gamma, beta
 * uniform. Compared with
 *  - a plain C++ reference in double: mean and 1/std within 1e-6 relative; y within
 *    1e-6 relative to max(|y|, 1) (a y near 0 comes from x near the mean, where a
 *    relative error means nothing: the error of y is that of mean, rstd, one rounding);
 *  - the same normalised values (x - mean) * rstd within 1e-6 of max(|.|, 1). */
#include <string>
#include "common.h"

extern "C" void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean_out,
                              float* rstd_out, int n, float eps);

int main() {
  const int lengths[] = {1, 31, 33, 1000, 4097};
  const unsigned blocks[] = {32, 256, 1024};
  const int rows = 3;
  const float eps = 1e-5f;
  Rng rng(11);
  for (int n : lengths) {
    std::vector<float> x(size_t(rows) * n), gamma(n), beta(n);
    for (float& v : x) v = float(3.0 + rng.uniform(-1.7, 1.7) + rng.uniform(-1.7, 1.7));
    for (float& v : gamma) v = float(rng.uniform(0.5, 1.5));
    for (float& v : beta) v = float(rng.uniform(-0.5, 0.5));
    std::vector<double> ref(x.size()), norm(x.size()), mean(rows), rstd(rows);
    for (int r = 0; r < rows; r++) {
      const float* xr = &x[size_t(r) * n];
      double m = 0, q = 0;
      for (int i = 0; i < n; i++) m += xr[i];
      m /= n;
      for (int i = 0; i < n; i++) q += (xr[i] - m) * (xr[i] - m);
      double rs = 1.0 / std::sqrt(q / n + double(eps));
      mean[r] = m;
      rstd[r] = rs;
      for (int i = 0; i < n; i++) {
        norm[size_t(r) * n + i] = (xr[i] - m) * rs;
        ref[size_t(r) * n + i] = (xr[i] - m) * rs * gamma[i] + beta[i];
      }
    }
    for (unsigned b : blocks) {
      std::vector<float> y(x.size()), mo(rows), ro(rows);
      if (HPDL_EMU_LAUNCH(layernorm_fwd, dim3(rows), dim3(b), size_t(n) * sizeof(float), x.data(), gamma.data(),
                          beta.data(), y.data(), mo.data(), ro.data(), n, eps) != 0) {
        g_failures++;
        std::printf("layernorm n=%d block=%u: launch failed: %s\n", n, b, hpdl_emu_last_error());
        continue;
      }
      Err ey, en, em, er;
      for (size_t i = 0; i < x.size(); i++) {
        ey.add(y[i], ref[i], 1.0);
        size_t r = i / n;
        en.add((x[i] - mo[r]) * double(ro[r]), norm[i], 1.0);
      }
      for (int r = 0; r < rows; r++) {
        em.add(mo[r], mean[r]);
        er.add(ro[r], rstd[r]);
      }
      std::string what = "layernorm n=" + std::to_string(n) + " block=" + std::to_string(b);
      verdict((what + " y vs fp64").c_str(), ey, 1e-6);
      verdict((what + " mean vs fp64").c_str(), em, 1e-6);
      verdict((what + " rstd vs fp64").c_str(), er, 1e-6);
      verdict((what + " (x-mean)*rstd vs fp64").c_str(), en, 1e-6);
    }
  }
  return finish("layernorm");
}
