/* softmax_test.cpp - runs softmax.cu's softmax_rows on rows of length 1, 31, 33, 1000
 * and 4097 with blocks of 32, 256 and 1024 threads, inputs in [-8, 8]. Compared with
 *  - a plain C++ reference with the kernel's float element math (expf(x - max), one
 *    division) and the sum in double: within 1e-6 relative per element; what differs
 *    is the kernel's float tree sum and its multiply by a rounded reciprocal;
 *  - the exact softmax in double: within 2e-6, since float x - max alone is rounded by
 *    up to |x - max| 2^-24 (16 * 6e-8 here) before the exp. */
#include <cstring>
#include <string>
#include "common.h"

extern "C" void softmax_rows(const float* x, float* y, int n);

int main() {
  const int lengths[] = {1, 31, 33, 1000, 4097};
  const unsigned blocks[] = {32, 256, 1024};
  const int rows = 3;
  Rng rng(7);
  for (int n : lengths) {
    std::vector<float> x(size_t(rows) * n);
    for (float& v : x) v = float(rng.uniform(-8.0, 8.0));
    std::vector<double> ref(x.size()), exact(x.size());
    for (int r = 0; r < rows; r++) {
      const float* xr = &x[size_t(r) * n];
      float m = -INFINITY;
      double s = 0, se = 0;
      for (int i = 0; i < n; i++) m = std::fmax(m, xr[i]);
      for (int i = 0; i < n; i++) s += std::exp(xr[i] - m);
      for (int i = 0; i < n; i++) ref[size_t(r) * n + i] = std::exp(xr[i] - m) / float(s);
      for (int i = 0; i < n; i++) se += std::exp(double(xr[i]) - double(m));
      for (int i = 0; i < n; i++) exact[size_t(r) * n + i] = std::exp(double(xr[i]) - double(m)) / se;
    }
    for (unsigned b : blocks) {
      std::vector<float> y(x.size() + 1, -1.0f);  // one canary past the end
      if (HPDL_EMU_LAUNCH(softmax_rows, dim3(rows), dim3(b), 0, x.data(), y.data(), n) != 0) {
        g_failures++;
        std::printf("softmax n=%d block=%u: launch failed: %s\n", n, b, hpdl_emu_last_error());
        continue;
      }
      Err e, ee;
      for (size_t i = 0; i < x.size(); i++) e.add(y[i], ref[i]);
      for (size_t i = 0; i < x.size(); i++) ee.add(y[i], exact[i]);
      std::string what = "softmax n=" + std::to_string(n) + " block=" + std::to_string(b) + " rows=3";
      verdict((what + " vs C++ reference").c_str(), e, 1e-6);
      verdict((what + " vs exact fp64").c_str(), ee, 2e-6);
      if (y[x.size()] != -1.0f) check(false, "softmax wrote past the end");
    }
  }
  return finish("softmax");
}
