/* conv_emu.cpp - kernels/hpdl_conv.cuh's convolutions and poolings, run on the CPU through
 * the emulation harness (kernels/cuda_emu.h), against core/numeric/conv.c's fp64 loops (the
 * reference executor's definition, compiled as C and linked in by the driver) (CTest
 * cuda.conv.emu and cuda.conv.mutation; driver tests/cuda/conv_emu.py).
 *
 *     conv_emu all|plan
 *
 * all       every case below: the forward, the data gradient and the filter gradient (with
 *           the rule's split of the reduction, and again cut into many small splits
 *           through the split sum) of each convolution, and the forward and backward of each
 *           pooling, each within TOL of conv.c's fp64 result; every output value written,
 *           nothing written outside the arrays (canaries on both sides); every launch run
 *           twice more, once on a grid of 3 blocks (the blocks walk the tiles), bit for bit
 *           the same. One "digest" line a case lets the driver check the scheduling orders
 *           agree bit for bit too; the driver's mutants of the header must each fail a case.
 * plan      the launch rule as C++ sees it (the driver compares it with C11's).
 *
 * The error of a tensor: max |got - ref| / max |ref| (normwise: an element that cancels to
 * almost nothing carries the absolute rounding of its terms). TOL = 1e-5, about 80 fp32
 * ulps of the tensor's largest value; seen here: a few 1e-7. Pooling inputs take few
 * distinct values, so that windows have ties and the first-max rule shows. */
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "conv_emu.cu"
#include "../cuda_emu/rng.h" /* Rng */
#include "conv_emu_plan.h"   /* the rule for a few shapes, from C++ here and from C11 */

extern "C" {
#include "conv.h" /* core/numeric/conv.c, the reference */
}

static const double TOL = 1e-5;
static int g_failures = 0;
static double g_worst[5]; /* y, dx, dw, pool y, pool dx over all cases */

static bool check(bool cond, const std::string &what) {
  if (!cond) {
    std::printf("%s: FAIL\n", what.c_str());
    g_failures++;
  }
  return cond;
}

/* ------------------------------------------------------------------ the cases */

struct ConvCase {
  int N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, G;
  const char *what;
};

static const ConvCase CONVS[] = {
    {2, 3, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, "3x3 padding 1"},
    {2, 5, 9, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, "3x3 stride 2, odd sizes"},
    {1, 4, 11, 10, 5, 3, 2, 2, 3, 0, 2, 2, 1, 1, "stride 2x3, padding 0x2, dilation 2x1"},
    {2, 4, 7, 6, 8, 3, 3, 1, 1, 1, 1, 2, 2, 2, "groups 2 (2 in, 4 out a group), dilation 2"},
    {2, 6, 9, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, 6, "depthwise 3x3 stride 2"},
    {2, 6, 5, 5, 12, 3, 3, 1, 1, 1, 1, 1, 1, 6, "depthwise, 2 filters a channel"},
    {2, 40, 5, 5, 70, 1, 1, 1, 1, 0, 0, 1, 1, 1, "1x1, 70 filters (two row tiles of 64)"},
    {1, 16, 7, 7, 24, 1, 1, 2, 2, 0, 0, 1, 1, 1, "1x1 stride 2"},
    {1, 33, 6, 6, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, "33 channels: 19 reduction steps"},
    {1, 3, 16, 16, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, "ResNet's stem: 7x7 stride 2 padding 3"},
    {3, 2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, "a 2x2 image under a 3x3 window"},
    {2, 2, 24, 24, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, "the rule splits the filter gradient"},
    {1, 6, 9, 9, 9, 3, 3, 1, 2, 3, 2, 3, 2, 3, "groups 3, dilation 3x2, padding 3x2"},
    {3, 1, 5, 13, 1, 1, 3, 1, 2, 0, 1, 1, 1, 1, "one channel, a 1x3 window, stride 1x2"},
    {1, 20, 4, 5, 2, 2, 2, 1, 1, 0, 0, 1, 1, 2, "groups 2, 10 channels in, 1 out a group"},
};

struct PoolCase {
  int N, C, H, W, mode, kh, kw, sh, sw, ph, pw; /* adaptive: kh, kw the output size */
  const char *what;
};

static const PoolCase POOLS[] = {
    {2, 3, 8, 8, POOL_MAX, 2, 2, 2, 2, 0, 0, "max 2x2 stride 2"},
    {1, 4, 9, 7, POOL_MAX, 3, 3, 2, 2, 1, 1, "max 3x3 stride 2 padding 1, odd sizes"},
    {1, 2, 6, 6, POOL_MAX, 3, 3, 1, 1, 1, 1, "max 3x3 stride 1: overlapping windows"},
    {1, 2, 10, 10, POOL_MAX, 3, 3, 3, 3, 0, 0, "max 3x3 stride 3: the last row left out"},
    {1, 2, 5, 6, POOL_MAX, 1, 1, 1, 1, 0, 0, "max 1x1"},
    {2, 2, 9, 9, POOL_AVG, 3, 3, 2, 2, 1, 1, "avg 3x3 stride 2 padding 1 (padding counted)"},
    {1, 3, 5, 8, POOL_AVG, 2, 3, 1, 2, 1, 1, "avg 2x3 stride 1x2 padding 1"},
    {1, 2, 6, 7, POOL_AVG, 4, 4, 2, 3, 2, 2, "avg 4x4 stride 2x3 padding 2: windows past the padding"},
    {2, 8, 4, 4, POOL_ADAPTIVE_AVG, 1, 1, 0, 0, 0, 0, "adaptive avg to 1x1"},
    {1, 2, 7, 5, POOL_ADAPTIVE_AVG, 3, 2, 0, 0, 0, 0, "adaptive avg 7x5 to 3x2"},
    {1, 2, 7, 8, POOL_ADAPTIVE_MAX, 3, 3, 0, 0, 0, 0, "adaptive max 7x8 to 3x3: overlapping"},
    {1, 2, 3, 2, POOL_ADAPTIVE_MAX, 5, 4, 0, 0, 0, 0, "adaptive max 3x2 to 5x4: more cells than inputs"},
    {1, 2, 3, 2, POOL_ADAPTIVE_AVG, 5, 4, 0, 0, 0, 0, "adaptive avg 3x2 to 5x4"},
};

/* -------------------------------------------------------------- device arrays */

static const int GUARD = 64;
static const uint32_t CANARY = 0x7fc0dead; /* a NaN no kernel computes */

static uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

static float canary() {
  float f;
  std::memcpy(&f, &CANARY, 4);
  return f;
}

/* n floats with GUARD canaries on each side; the body starts as canaries too, so that a
 * value the kernel never writes shows. */
struct Buf {
  std::vector<float> store;
  size_t n;
  explicit Buf(size_t n_) : store(n_ + 2 * GUARD, canary()), n(n_) {}
  float *p() { return store.data() + GUARD; }
  std::vector<float> body() const { return std::vector<float>(store.begin() + GUARD, store.begin() + GUARD + n); }
  bool guards_intact() const {
    for (int i = 0; i < GUARD; i++)
      if (bits(store[i]) != CANARY || bits(store[GUARD + n + i]) != CANARY) return false;
    return true;
  }
  size_t unwritten() const {
    size_t u = 0;
    for (size_t i = 0; i < n; i++) u += bits(store[GUARD + i]) == CANARY;
    return u;
  }
};

static double error_of(const std::vector<float> &got, const std::vector<double> &ref) {
  double mx = 0, worst = 0;
  for (double r : ref) mx = std::fmax(mx, std::fabs(r));
  for (size_t i = 0; i < ref.size(); i++) {
    double e = got[i] == ref[i] ? 0 : std::fabs(got[i] - ref[i]) / std::fmax(mx, 1e-30);
    if (!(e <= worst)) worst = e; /* NaN sticks */
  }
  return worst;
}

static uint64_t fnv(uint64_t h, const std::vector<float> &v) {
  for (float x : v) {
    uint32_t u = bits(x);
    for (int i = 0; i < 4; i++) h = (h ^ ((u >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

static std::vector<double> widen(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

/* ------------------------------------------------------------------ launches */

typedef void (*FwdK)(const hpdl_kctx, const float *, const float *, float *, hpdl_conv_shape, long long);
typedef void (*FilterK)(const hpdl_kctx, const float *, const float *, float *, hpdl_conv_shape, long long, long long);
static const FwdK FWD[5] = {conv_fwd_t0, conv_fwd_t1, conv_fwd_t2, conv_fwd_t3, conv_fwd_t4};
static const FwdK DATA[5] = {conv_bwd_data_t0, conv_bwd_data_t1, conv_bwd_data_t2, conv_bwd_data_t3, conv_bwd_data_t4};
static const FilterK FILTER[5] = {conv_bwd_filter_t0, conv_bwd_filter_t1, conv_bwd_filter_t2, conv_bwd_filter_t3,
                                  conv_bwd_filter_t4};

static int tier_of(const hpdl_conv_launch &L) {
  for (int t = 0; t < 5; t++)
    if (HPDL_CONV_BM(t) == L.bm && HPDL_CONV_BN(t) == L.bn && HPDL_CONV_TM(t) == L.tm && HPDL_CONV_TN(t) == L.tn) return t;
  return -1;
}

static unsigned grid_of(long long blocks, long long cap) {
  long long g = blocks < cap ? blocks : cap;
  return (unsigned)(g < 1 ? 1 : g);
}

/* One launch of the filter gradient at `chunk` (splits = ceil(red / chunk)) and, with more
 * than one split, the split sum; 0 on success. */
static int filter_grad(const hpdl_conv_shape &s, const hpdl_conv_launch &L, long long chunk, long long cap,
                       const float *x, const float *dy, float *dw, std::string &why) {
  hpdl_kctx hpd;
  std::memset(&hpd, 0, sizeof hpd);
  const long long splits = (L.red + chunk - 1) / chunk, tiles = L.grid / L.splits;
  std::vector<float> part(splits > 1 ? (size_t)(splits * L.outputs) : 0, canary());
  float *out = splits > 1 ? part.data() : dw;
  int rc = hpdl_emu_launch_named("bwd_filter", FILTER[tier_of(L)], dim3(grid_of(tiles * splits, cap)),
                                 dim3(HPDL_CONV_THREADS), 0, hpd, x, dy, out, s, chunk, tiles * splits);
  if (!rc && splits > 1)
    rc = hpdl_emu_launch_named("sum_splits", conv_sum_splits, dim3(grid_of((L.outputs + 255) / 256, cap)), dim3(256), 0,
                               hpd, (const float *)part.data(), dw, L.outputs, (int)splits);
  if (rc) why = hpdl_emu_last_error();
  return rc;
}

/* ------------------------------------------------------------------ one convolution */

static void run_conv(int idx, const ConvCase &c) {
  const int Ho = (int)conv_out_len(c.H, c.KH, c.sh, c.ph, c.dh), Wo = (int)conv_out_len(c.W, c.KW, c.sw, c.pw, c.dw);
  const hpdl_conv_shape s = {c.N, c.C, c.H, c.W, c.O, c.KH, c.KW, Ho, Wo, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.G};
  const ConvShape rs = {c.N, c.C, c.H, c.W, c.O, c.KH, c.KW, Ho, Wo, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.G};
  char buf[300];
  std::snprintf(buf, sizeof buf, "conv %2d [%d,%d,%d,%d] * [%d,%d,%d,%d] -> %dx%d (%s)", idx, c.N, c.C, c.H, c.W, c.O,
                c.C / c.G, c.KH, c.KW, Ho, Wo, c.what);
  const std::string ctx = buf;
  hpdl_conv_launch L[3];
  for (int op = 0; op < 3; op++)
    if (!check(hpdl_conv_plan(op, &s, &L[op]) == 0 && tier_of(L[op]) >= 0, ctx + ": hpdl_conv_plan")) return;
  const size_t nx = (size_t)c.N * c.C * c.H * c.W, nw = (size_t)c.O * (c.C / c.G) * c.KH * c.KW,
               ny = (size_t)c.N * c.O * Ho * Wo;
  Rng rng(2000 + idx);
  std::vector<float> x(nx), w(nw), dy(ny);
  for (float &v : x) v = float(rng.uniform(-1, 1));
  for (float &v : w) v = float(rng.uniform(-1, 1));
  for (float &v : dy) v = float(rng.uniform(-1, 1));
  std::vector<double> ry(ny), rdx(nx), rdw(nw);
  conv_forward_f64(&rs, widen(x).data(), widen(w).data(), ry.data());
  conv_bwd_data_f64(&rs, widen(dy).data(), widen(w).data(), rdx.data());
  conv_bwd_filter_f64(&rs, widen(x).data(), widen(dy).data(), rdw.data());

  /* the rule's filter split, then many small ones (chunks of 16 and 48 reductions) */
  const long long chunks[3] = {L[2].chunk, HPDL_CONV_BK, 3 * HPDL_CONV_BK};
  std::vector<float> first[5];
  uint64_t digest = 1469598103934665603ull;
  hpdl_kctx hpd;
  std::memset(&hpd, 0, sizeof hpd);
  for (int rep = 0; rep < 3; rep++) {
    const long long cap = rep == 1 ? 3 : 1LL << 30; /* run 2: 3 blocks walk every tile */
    Buf y(ny), dx(nx), dw0(nw), dw1(nw), dw2(nw);
    Buf *dws[3] = {&dw0, &dw1, &dw2};
    std::string why;
    int rc = hpdl_emu_launch_named("fwd", FWD[tier_of(L[0])], dim3(grid_of(L[0].grid, cap)), dim3(HPDL_CONV_THREADS), 0,
                                   hpd, x.data(), w.data(), y.p(), s, L[0].grid);
    if (!rc)
      rc = hpdl_emu_launch_named("bwd_data", DATA[tier_of(L[1])], dim3(grid_of(L[1].grid, cap)),
                                 dim3(HPDL_CONV_THREADS), 0, hpd, dy.data(), w.data(), dx.p(), s, L[1].grid);
    if (rc) why = hpdl_emu_last_error();
    for (int k = 0; k < 3 && !rc; k++) rc = filter_grad(s, L[2], chunks[k], cap, x.data(), dy.data(), dws[k]->p(), why);
    if (!check(rc == 0, ctx + ": launches (" + why + ")")) return;
    Buf *all[5] = {&y, &dx, &dw0, &dw1, &dw2};
    for (Buf *b : all) {
      check(b->guards_intact(), ctx + ": nothing written outside the arrays");
      check(b->unwritten() == 0, ctx + ": every output value written");
    }
    if (rep == 0) {
      for (int i = 0; i < 5; i++) first[i] = all[i]->body(), digest = fnv(digest, first[i]);
      const double e[5] = {error_of(first[0], ry), error_of(first[1], rdx), error_of(first[2], rdw),
                           error_of(first[3], rdw), error_of(first[4], rdw)};
      const double edw = std::fmax(e[2], std::fmax(e[3], e[4]));
      const bool ok = e[0] <= TOL && e[1] <= TOL && edw <= TOL;
      g_worst[0] = std::fmax(g_worst[0], e[0]);
      g_worst[1] = std::fmax(g_worst[1], e[1]);
      g_worst[2] = std::fmax(g_worst[2], edw);
      std::printf("%s  tiles %dx%d / %dx%d / %dx%d, filter splits %d  y %.1e dx %.1e dw %.1e (%lld, 16, 48: %.1e %.1e "
                  "%.1e)  %s\n",
                  ctx.c_str(), L[0].bm, L[0].bn, L[1].bm, L[1].bn, L[2].bm, L[2].bn, L[2].splits, e[0], e[1], edw,
                  L[2].chunk, e[2], e[3], e[4], ok ? "ok" : "FAIL");
      if (!ok) g_failures++;
    } else {
      bool same = true;
      for (int i = 0; i < 5; i++) same = same && all[i]->body() == first[i];
      check(same, ctx + ": run " + std::to_string(rep + 1) + (rep == 1 ? " (3 blocks)" : "") + " bit for bit the first");
    }
  }
  std::printf("digest conv %d %016" PRIx64 "\n", idx, digest);
}

/* ------------------------------------------------------------------ one pooling */

static void run_pool(int idx, const PoolCase &c) {
  const int64_t attr[POOL_NATTR] = {c.mode, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw};
  const PoolShape rs = pool_shape_of(c.N, c.C, c.H, c.W, attr);
  const hpdl_pool_shape s = {c.N, c.C, c.H, c.W, (int)rs.Ho, (int)rs.Wo, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw, c.mode};
  char buf[300];
  std::snprintf(buf, sizeof buf, "pool %2d [%d,%d,%d,%d] -> %dx%d (%s)", idx, c.N, c.C, c.H, c.W, (int)rs.Ho, (int)rs.Wo,
                c.what);
  const std::string ctx = buf;
  if (!check(rs.Ho > 0 && rs.Wo > 0, ctx + ": a valid pooling")) return;
  const size_t nx = (size_t)c.N * c.C * c.H * c.W, ny = (size_t)c.N * c.C * rs.Ho * rs.Wo;
  Rng rng(3000 + idx);
  std::vector<float> x(nx), dy(ny);
  for (float &v : x) v = float(std::floor(rng.uniform(-2, 3))) * 0.5f; /* -1 .. 1 by halves: ties */
  for (float &v : dy) v = float(rng.uniform(-1, 1));
  std::vector<double> ry(ny), rdx(nx);
  pool_forward_f64(&rs, widen(x).data(), ry.data());
  pool_backward_f64(&rs, widen(x).data(), widen(dy).data(), rdx.data());
  std::vector<float> first[2];
  uint64_t digest = 1469598103934665603ull;
  hpdl_kctx hpd;
  std::memset(&hpd, 0, sizeof hpd);
  for (int rep = 0; rep < 3; rep++) {
    const long long cap = rep == 1 ? 3 : 1LL << 30;
    Buf y(ny), dx(nx);
    int rc = hpdl_emu_launch_named("pool_fwd", pool_fwd, dim3(grid_of((long long)(ny + 255) / 256, cap)), dim3(256), 0,
                                   hpd, x.data(), y.p(), s);
    if (!rc)
      rc = hpdl_emu_launch_named("pool_bwd", pool_bwd, dim3(grid_of((long long)(nx + 255) / 256, cap)), dim3(256), 0, hpd,
                                 x.data(), dy.data(), dx.p(), s);
    if (!check(rc == 0, ctx + ": launches (" + std::string(rc ? hpdl_emu_last_error() : "") + ")")) return;
    check(y.guards_intact() && dx.guards_intact(), ctx + ": nothing written outside the arrays");
    check(y.unwritten() == 0 && dx.unwritten() == 0, ctx + ": every output value written");
    if (rep == 0) {
      first[0] = y.body();
      first[1] = dx.body();
      digest = fnv(fnv(digest, first[0]), first[1]);
      const double ey = error_of(first[0], ry), edx = error_of(first[1], rdx);
      g_worst[3] = std::fmax(g_worst[3], ey);
      g_worst[4] = std::fmax(g_worst[4], edx);
      const bool ok = ey <= TOL && edx <= TOL;
      std::printf("%s  y %.1e dx %.1e  %s\n", ctx.c_str(), ey, edx, ok ? "ok" : "FAIL");
      if (!ok) g_failures++;
    } else {
      check(y.body() == first[0] && dx.body() == first[1], ctx + ": run " + std::to_string(rep + 1) + " bit for bit the first");
    }
  }
  std::printf("digest pool %d %016" PRIx64 "\n", idx, digest);
}

int main(int argc, char **argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "plan") {
    conv_emu_print_plan();
    return 0;
  }
  if (what != "all") {
    std::fprintf(stderr, "usage: conv_emu all|plan\n");
    return 2;
  }
  int n = 0;
  for (int i = 0; i < int(sizeof CONVS / sizeof CONVS[0]); i++, n++) run_conv(i, CONVS[i]);
  for (int i = 0; i < int(sizeof POOLS / sizeof POOLS[0]); i++, n++) run_pool(i, POOLS[i]);
  std::printf("max errors (max |got - ref| / max |ref| a tensor; tolerance %.0e): y %.2e dx %.2e dw %.2e pool y %.2e "
              "pool dx %.2e\n",
              TOL, g_worst[0], g_worst[1], g_worst[2], g_worst[3], g_worst[4]);
  std::printf("conv_emu: %d cases, %s\n", n, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
