/* elementwise_test.cpp - runs elementwise.cu's silu_scale_add_f32 on lengths 1, 3, 4, 5,
 * 1023, 4099 and 100003 (no multiple of 4 or of the block, but 4), grids smaller and
 * larger than the data (the grid-stride loop), with 16-byte aligned buffers (float4
 * path plus a scalar tail) and with buffers one float off (scalar path). Compared with
 * the same formula in plain C++ (float), within 1e-6 relative; canaries around y must
 * survive (no write outside [0, n)). Built with UBSan's alignment check where the
 * compiler has it, so that a float4 load from a misaligned address fails here as it
 * faults on the GPU. */
#include <cstring>
#include <string>
#include "common.h"

extern "C" void silu_scale_add_f32(const float* x, const float* r, float* y, long long n, float scale);

int main() {
  const long long lengths[] = {1, 3, 4, 5, 1023, 4099, 100003};
  const float scale = 0.75f, canary = -12345.0f;
  Rng rng(3);
  for (long long n : lengths) {
    for (int offset = 0; offset < 2; offset++) {
      for (unsigned grid : {1u, 7u, 64u}) {
        /* 16-byte aligned storage; offset 1 shifts every buffer by one float */
        const size_t cap = size_t(n) + 8;
        std::vector<float4> xs(cap / 4 + 1), rs(cap / 4 + 1), ys(cap / 4 + 1);
        float* x = reinterpret_cast<float*>(xs.data()) + offset;
        float* r = reinterpret_cast<float*>(rs.data()) + offset;
        float* y = reinterpret_cast<float*>(ys.data()) + 4;  // canaries at y[-4..-1]
        for (int i = -4; i < 0; i++) y[i] = canary;
        y += offset;
        for (long long i = 0; i < n; i++) {
          x[i] = float(rng.uniform(-6, 6));
          r[i] = float(rng.uniform(-1, 1));
          y[i] = NAN;
        }
        y[n] = canary;
        if (HPDL_EMU_LAUNCH(silu_scale_add_f32, dim3(grid), dim3(256), 0, x, r, y, n, scale) != 0) {
          g_failures++;
          std::printf("elementwise n=%lld: launch failed: %s\n", n, hpdl_emu_last_error());
          continue;
        }
        Err e;
        for (long long i = 0; i < n; i++) e.add(y[i], x[i] / (1.0f + std::exp(-x[i])) * scale + r[i]);
        std::string what = "elementwise n=" + std::to_string(n) + " grid=" + std::to_string(grid) +
                           " block=256 " + (offset ? "misaligned (scalar)" : "aligned (float4 + tail)");
        verdict(what.c_str(), e, 1e-6);
        bool intact = y[n] == canary;
        for (int i = -4 - offset; i < -offset; i++) intact = intact && y[i] == canary;
        if (!intact) check(false, (what + ": canary outside [0, n) overwritten").c_str());
      }
    }
  }
  return finish("elementwise");
}
