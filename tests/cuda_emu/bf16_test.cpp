/* bf16_test.cpp - runs bf16.cu's kernels.
 *  convert16: special values (zeros, infinities, NaN, largest finite, values that
 *    round to infinity, subnormals, exact ties) and 20000 random ones over the whole
 *    exponent range: the bits must equal an independent round-to-nearest-even (the
 *    nearer of the two neighbouring 16-bit values, the even one on a tie, found with
 *    doubles), and the relative error of normal values stays under the unit roundoff
 *    u = 2^-p (p = 8 bits of precision for bf16: 2^-8; 11 for fp16: 2^-11; the observed
 *    maximum is printed and must come near u: the rounding really happened).
 *  patterns16: every 16-bit pattern converts to float and back unchanged (NaN: stays
 *    NaN).
 *  scale_rowsum: rows of 1000, 4097 and 4096 (pairs) values: y within 2^-8 relative
 *    of x * g (one rounding to bf16 of an exact fp32 product); the fp32 row sum within
 *    1e-5 relative of the sum in double; the bf16 sum within 2^-8 (+1e-5); and, for
 *    scale, the error of the same sum accumulated in bf16, which fp32 accumulation
 *    avoids. */
#include <cstring>
#include <string>
#include "common.h"

extern "C" void convert16(const float* in, __nv_bfloat16* b, float* b_back, __half* h, float* h_back, int n);
extern "C" void patterns16(unsigned short* b_out, unsigned short* h_out);
extern "C" void scale_rowsum(const __nv_bfloat16* x, const __nv_bfloat16* g, __nv_bfloat16* y, float* sum32,
                             __nv_bfloat16* sum16, int n);

/* 16-bit value of a format (bits of mantissa m, exponent bias, bits of exponent) as double */
static double decode(unsigned bits, int mant, int ebits) {
  int bias = (1 << (ebits - 1)) - 1, e = (bits >> mant) & ((1 << ebits) - 1);
  unsigned m = bits & ((1u << mant) - 1);
  double v = e == 0 ? std::ldexp(double(m), 1 - bias - mant) : std::ldexp(double(m | (1u << mant)), e - bias - mant);
  if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
  return (bits >> 15) ? -v : v;
}

/* Reference round to nearest even: the nearest finite candidates by search. */
static unsigned ref_round(float f, int mant, int ebits) {
  if (f != f) return 0x7fff;
  unsigned sign = std::signbit(f) ? 0x8000u : 0u;
  double a = std::fabs(double(f));
  unsigned inf = ((1u << ebits) - 1) << mant;
  unsigned lo = 0, hi = inf;  // largest pattern with value <= a
  while (lo < hi) {
    unsigned mid = (lo + hi + 1) / 2;
    if (decode(mid, mant, ebits) <= a) lo = mid; else hi = mid - 1;
  }
  if (lo == inf) return sign | inf;
  double below = decode(lo, mant, ebits);
  if (below == a) return sign | lo;
  /* the next pattern up; above the largest finite, the rounding boundary is where the
     next (virtual) value would be: max + ulp */
  double above = lo + 1 == inf ? below + (below - decode(lo - 1, mant, ebits)) : decode(lo + 1, mant, ebits);
  unsigned pick = (a - below < above - a || (a - below == above - a && (lo & 1) == 0)) ? lo : lo + 1;
  return sign | pick;
}

int main() {
  /* ---- convert16 */
  std::vector<float> in = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3.4028235e38f, -3.4028235e38f, 65504.0f,
                           65519.0f, 65520.0f, -65520.0f, 1e-45f, 5.96e-8f, 2.98e-8f, 2.9802322e-8f, 6.1e-5f,
                           1.0f, 1.00390625f, 1.005859375f, 1.0009765625f, 1.0029296875f, -2.5f, 1e-40f};
  Rng rng(5);
  for (int i = 0; i < 20000; i++) {
    uint32_t u = uint32_t(rng.next() >> 32);
    float f;
    std::memcpy(&f, &u, 4);
    if (f != f || std::isinf(f)) continue;
    in.push_back(f);
    in.push_back(float(rng.uniform(-70000.0, 70000.0)));
  }
  const int n = int(in.size());
  std::vector<__nv_bfloat16> b(n);
  std::vector<__half> h(n);
  std::vector<float> bb(n), hb(n);
  if (HPDL_EMU_LAUNCH(convert16, dim3((n + 255) / 256), dim3(256), 0, in.data(), b.data(), bb.data(), h.data(),
                      hb.data(), n) != 0)
    return std::printf("convert16 launch failed: %s\n", hpdl_emu_last_error()), 1;
  size_t bad_b = 0, bad_h = 0;
  double rel_b = 0, rel_h = 0;
  for (int i = 0; i < n; i++) {
    unsigned rb = ref_round(in[i], 7, 8), rh = ref_round(in[i], 10, 5);
    if (__bfloat16_as_ushort(b[i]) != rb) {
      if (bad_b++ < 5) std::printf("  bf16(%.9g) = 0x%04x, expected 0x%04x\n", in[i], __bfloat16_as_ushort(b[i]), rb);
    }
    if (__half_as_ushort(h[i]) != rh) {
      if (bad_h++ < 5) std::printf("  fp16(%.9g) = 0x%04x, expected 0x%04x\n", in[i], __half_as_ushort(h[i]), rh);
    }
    double a = std::fabs(double(in[i]));
    if (a >= 1.1754944e-38 && a <= 3.38e38) rel_b = std::fmax(rel_b, std::fabs(bb[i] - double(in[i])) / a);
    if (a >= 6.103515625e-05 && a <= 65504.0) rel_h = std::fmax(rel_h, std::fabs(hb[i] - double(in[i])) / a);
  }
  std::printf("convert16: %d values\n", n);
  check(bad_b == 0, "  float -> bf16 bits equal the reference round to nearest even");
  check(bad_h == 0, "  float -> fp16 bits equal the reference round to nearest even");
  std::printf("  bf16 round trip of normal values: max rel err %.4g (unit roundoff 2^-8 = %.4g)\n", rel_b,
              std::ldexp(1.0, -8));
  std::printf("  fp16 round trip of normal values: max rel err %.4g (unit roundoff 2^-11 = %.4g)\n", rel_h,
              std::ldexp(1.0, -11));
  check(rel_b <= std::ldexp(1.0, -8) && rel_b > std::ldexp(1.0, -9), "  bf16 error at most, and near, 2^-8");
  check(rel_h <= std::ldexp(1.0, -11) && rel_h > std::ldexp(1.0, -12), "  fp16 error at most, and near, 2^-11");

  /* ---- patterns16 */
  std::vector<unsigned short> pb(65536), ph(65536);
  if (HPDL_EMU_LAUNCH(patterns16, dim3(256), dim3(256), 0, pb.data(), ph.data()) != 0)
    return std::printf("patterns16 launch failed: %s\n", hpdl_emu_last_error()), 1;
  size_t same_b = 0, same_h = 0;
  for (unsigned i = 0; i < 65536; i++) {
    bool nan_b = (i & 0x7fffu) > 0x7f80u, nan_h = (i & 0x7fffu) > 0x7c00u;
    same_b += nan_b ? (pb[i] & 0x7fffu) > 0x7f80u : pb[i] == i;
    same_h += nan_h ? (ph[i] & 0x7fffu) > 0x7c00u : ph[i] == i;
  }
  std::printf("patterns16: bf16 %zu / 65536, fp16 %zu / 65536 patterns survive float and back\n", same_b, same_h);
  check(same_b == 65536 && same_h == 65536, "  every 16-bit pattern round-trips (NaN stays NaN)");

  /* ---- scale_rowsum */
  for (int len : {1000, 4097, 4096}) {
    const int rows = 3;
    std::vector<__nv_bfloat16> x(size_t(rows) * len), g(len), y(x.size());
    for (auto& v : x) v = __float2bfloat16(float(rng.uniform(0.0, 2.0)));
    for (auto& v : g) v = __float2bfloat16(float(rng.uniform(0.5, 1.5)));
    std::vector<float> s32(rows);
    std::vector<__nv_bfloat16> s16(rows);
    if (HPDL_EMU_LAUNCH(scale_rowsum, dim3(rows), dim3(256), 0, x.data(), g.data(), y.data(), s32.data(),
                        s16.data(), len) != 0)
      return std::printf("scale_rowsum launch failed: %s\n", hpdl_emu_last_error()), 1;
    Err ey, es, e16, ebf;
    for (int r = 0; r < rows; r++) {
      double s = 0;
      __nv_bfloat16 acc16 = __float2bfloat16(0.0f);
      for (int i = 0; i < len; i++) {
        double p = double(__bfloat162float(x[size_t(r) * len + i])) * double(__bfloat162float(g[i]));
        ey.add(__bfloat162float(y[size_t(r) * len + i]), p);
        s += p;
        acc16 = __float2bfloat16(__bfloat162float(acc16) + float(p));
      }
      es.add(s32[r], s);
      e16.add(__bfloat162float(s16[r]), s);
      ebf.add(__bfloat162float(acc16), s);
    }
    std::string what = "scale_rowsum n=" + std::to_string(len) + (len % 2 ? " (scalar)" : " (bfloat162 pairs)");
    verdict((what + " y = bf16(x*g) vs fp64").c_str(), ey, std::ldexp(1.0, -8));
    verdict((what + " row sum, fp32 accumulation").c_str(), es, 1e-5);
    verdict((what + " row sum stored as bf16").c_str(), e16, std::ldexp(1.0, -8) + 1e-5);
    std::printf("%-58s %7d values  max rel err %.3g (for comparison, not checked)\n",
                (what + " row sum if accumulated in bf16").c_str(), rows, ebf.rel);
  }
  return finish("bf16");
}
