/* attention_emu.cpp - kernels/hpdl_attention.cuh's attention forward and backward, run on
 * the CPU through the emulation harness (kernels/cuda_emu.h), against a plain fp64
 * reference written here from the semantics (core/numeric/attn.h) (CTest cuda.attention.emu and
 * cuda.attention.mutation; driver tests/cuda/attention_emu.py).
 *
 *     attention_emu all|mutation|cfg
 *
 * all       every case below: the forward's o and lse, the backward's dq, dk, dv (from the
 *           kernel's own forward output, as training feeds it), each within TOL of the
 *           reference (below); every output value written, nothing written outside the
 *           arrays (canaries on both sides); the whole forward and backward run twice more
 *           into fresh arrays, bit for bit the same. One "digest" line a case (a hash of
 *           every output bit) lets the driver check the orders agree bit for bit too.
 * mutation  the cases that cross several tiles, for the driver's mutants; stops at the
 *           first failing case (a mutant is caught by one).
 * cfg       the launch rule as C++ sees it (the driver compares it with C11's).
 *
 * The error of a tensor (o, lse, dq, dk, dv each): max |got - ref| / max |ref|, normwise.
 * Elementwise relative errors mean little here: an element that cancels to almost nothing
 * (o averages values of both signs; a gradient sums terms far larger than itself) carries
 * the absolute rounding of its terms, ~1e-7 for terms of order 1, so 1e-4 and more
 * relative to itself. TOL = 1e-5 is about 80 fp32 ulps of the tensor's largest value;
 * the emulation gives under 1e-6 (the GPU's fused multiply-adds and expf differ within
 * that). */
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "attention_emu.cu"
#include "../cuda_emu/rng.h" /* Rng */

static const double TOL = 1e-5;
/* one TF32 product a term (HPDL_KCTX_TF32): 10-bit mantissas, so about 2^-11 of each
 * operand; and at least TF32_MIN somewhere, or the flag was not taken */
static const double TOL_TF32 = 1e-2, TF32_MIN = 1e-5;
/* the 16-bit kernels: P and dS rounded to bf16 (8-bit mantissas: 2^-9 of each) or fp16
 * (2^-11), the sums fp32 */
static const double TOL_BF16 = 1e-2, TOL_F16 = 2.5e-3, H16_MIN = 1e-5;
static int g_failures = 0;

static bool check(bool cond, const std::string &what) {
  if (!cond) {
    std::printf("%s: FAIL\n", what.c_str());
    g_failures++;
  }
  return cond;
}

/* ..., causal, window, row_rank, row_size, col_rank, col_size, Sc (the keys' position span) */
typedef void (*FwdK)(const hpdl_kctx, const float *, const float *, const float *, float *, int, int, int, int, int,
                     float, int, int, int, int, int, int, int);
typedef void (*DtK)(const hpdl_kctx, const float *, const float *, float *, int, int, int);
typedef void (*BwdK)(const hpdl_kctx, const float *, const float *, const float *, const float *, const float *,
                     const float *, float *, int, int, int, int, int, float, int, int, int, int, int, int, int);
/* the 16-bit kernels reading q, k, v as stored (unsigned short: bf16 or fp16 bits) */
typedef void (*FwdK16)(const hpdl_kctx, const unsigned short *, const unsigned short *, const unsigned short *, float *,
                       int, int, int, int, int, float, int, int, int, int, int, int, int);
typedef void (*BwdK16)(const hpdl_kctx, const unsigned short *, const unsigned short *, const unsigned short *,
                       const float *, const float *, const float *, float *, int, int, int, int, int, float, int, int,
                       int, int, int, int, int);

/* One instantiation of the kernels: head sizes, threads, tiles; rule: the defaults of
 * hpdl_attention_cfg.h (launched with hpdl_attn_plan's grids). */
struct Config {
  const char *name;
  int D, Dv, nt, fbq, fbk, kbq, kbk, qbq, qbk; /* threads; forward, dkdv, dq tiles */
  int rule;                                    /* 1: the rule's tiles (hpdl_attn_plan); 2: the tensor-core kernels' (hpdl_attn_plan_tc) */
  FwdK fwd;
  DtK dt;
  BwdK dkdv, dq;
  int h16; /* the 16-bit tensor-core kernels: 1 bf16, 2 fp16 operands (0: fp32) */
  FwdK16 fwd16;          /* and these set: q, k, v passed as 16-bit bits (fwd, dkdv, dq above unused) */
  BwdK16 dkdv16, dq16;
};

#define CONFIG(NAME, RULE, ...) {#NAME, __VA_ARGS__, RULE, attn_fwd_##NAME, attn_dt_##NAME, attn_dkdv_##NAME, attn_dq_##NAME, 0, nullptr, nullptr, nullptr}
#define CONFIG_(...) CONFIG(__VA_ARGS__)
#define H16_TILES(D, DV)                                                                                              \
  HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_ROWS, HPDL_ATTN_H16_FWD_BK(D, DV), HPDL_ATTN_H16_DKDV_BQ(D, DV), HPDL_ATTN_TC_KEYS, \
      HPDL_ATTN_TC_ROWS, HPDL_ATTN_H16_DQ_BK(D, DV)
#define CONFIG_H(NAME, D, DV, H16)                                                                                   \
  {#NAME, D, DV, H16_TILES(D, DV), 2, attn_fwd_##NAME, attn_dt_##NAME, attn_dkdv_##NAME, attn_dq_##NAME, H16, \
   nullptr, nullptr, nullptr}
#define CONFIG_HS(NAME, D, DV, H16)                                                                                  \
  {#NAME, D, DV, H16_TILES(D, DV), 2, nullptr, attn_dt_##NAME, nullptr, nullptr, H16, attn_fwd_##NAME,         \
   attn_dkdv_##NAME, attn_dq_##NAME}
static const Config CONFIGS[] = {
    CONFIG_(d64, true, ATTN_RULE(64, 64)),
#ifndef ATTN_EMU_FEW
    CONFIG_(d128, true, ATTN_RULE(128, 128)),   CONFIG_(d128v64, true, ATTN_RULE(128, 64)),
    CONFIG_(d3, true, ATTN_RULE(3, 3)),         CONFIG_(d200, true, ATTN_RULE(200, 200)),
    CONFIG_(d1v256, true, ATTN_RULE(1, 256)),
#endif
    CONFIG(t5v7, false, 5, 7, 64, 16, 8, 8, 8, 8, 8), CONFIG(t16, false, 16, 16, 32, 8, 4, 4, 4, 4, 4),
    CONFIG(t9, false, 9, 9, 64, 16, 8, 12, 8, 8, 12),
    CONFIG_(tc64, 2, ATTN_TC_RULE(64, 64)),
#ifndef ATTN_EMU_FEW
    CONFIG_(tc16v40, 2, ATTN_TC_RULE(16, 40)), CONFIG_(tc24v16, 2, ATTN_TC_RULE(24, 16)),
#endif
    CONFIG_H(h64bf, 64, 64, 1), CONFIG_H(h64f16, 64, 64, 2), CONFIG_HS(h64bfs, 64, 64, 1),
#ifndef ATTN_EMU_FEW
    CONFIG_H(h16v40bf, 16, 40, 1), CONFIG_H(h24v16f16, 24, 16, 2),
#endif
    CONFIG_HS(h128bfs, 128, 128, 1),
#ifndef ATTN_EMU_FEW
    CONFIG_HS(h128f16s, 128, 128, 2), CONFIG_H(h72v112bf, 72, 112, 1),
#endif
};

static const Config &config(const char *name) {
  for (const Config &c : CONFIGS)
    if (!std::strcmp(c.name, name)) return c;
  std::fprintf(stderr, "no configuration %s\n", name);
  std::abort();
}

struct Case {
  const char *cfg;
  int B, H, Hk, T, S, causal, rr, rs, cr, cs; /* rs, cs: context-parallel sizes (0: none); cs = -c: the keys
                                                 are one ring block, rank cr's chunks of c (cp_comm = ring:
                                                 the kernels take col_size c and Sc = S c) */
  bool many_tiles;                            /* in the mutation set */
  int window;                                 /* a sliding window of keys (causal; 0: none) */
  int tf32;                                   /* tensor cores: one TF32 product (HPDL_KCTX_TF32), not 3xTF32 */
};

static const Case CASES[] = {
    /* the rule's tiles for D = 64 (fwd 32 x 32, dkdv 40 x 32, dq 32 x 48): tails of T and S,
     * S != T, odd head counts, GQA, T = 1 */
    {"d64", 1, 3, 3, 70, 70, 1, 0, 0, 0, 0, true, 0, 0},
    {"d64", 2, 3, 1, 37, 53, 0, 0, 0, 0, 0, true, 0, 0},
    {"d64", 1, 6, 2, 1, 45, 0, 0, 0, 0, 0, false, 0, 0},
    {"d64", 1, 4, 1, 33, 33, 1, 0, 0, 0, 0, false, 0, 0},
    {"d64", 1, 1, 1, 40, 17, 1, 0, 0, 0, 0, false, 0, 0}, /* S < T: rows past S see every key */
    {"d64", 2, 4, 2, 150, 150, 1, 0, 0, 0, 0, false, 0, 0},
    /* context parallelism: zigzag rows, ring keys, S = T * size, each rank */
    {"d64", 1, 2, 1, 36, 72, 1, 0, 2, 0, 2, false, 0, 0},
    {"d64", 1, 2, 1, 36, 72, 1, 1, 2, 1, 2, false, 0, 0},
    {"d64", 1, 2, 2, 66, 132, 1, 1, 2, 1, 2, false, 0, 0},
    {"d64", 1, 1, 1, 10, 40, 1, 0, 4, 0, 4, false, 0, 0},
    {"d64", 1, 1, 1, 10, 40, 1, 1, 4, 1, 4, false, 0, 0},
    {"d64", 1, 1, 1, 10, 40, 1, 2, 4, 2, 4, false, 0, 0},
    {"d64", 1, 1, 1, 10, 40, 1, 3, 4, 3, 4, false, 0, 0},
    /* D = 128 (fwd 16 x 32, dkdv 26 x 16, dq 16 x 28), Dv = 64 and 128 */
    {"d128v64", 1, 2, 1, 40, 40, 1, 0, 0, 0, 0, false, 0, 0},
    {"d128v64", 1, 3, 3, 17, 29, 0, 0, 0, 0, 0, false, 0, 0},
    {"d128", 1, 2, 2, 20, 20, 1, 0, 0, 0, 0, false, 0, 0},
    {"d128", 1, 3, 1, 77, 77, 1, 0, 0, 0, 0, false, 0, 0},
    {"d128", 1, 4, 2, 6, 24, 1, 1, 4, 1, 4, false, 0, 0},
    /* D = 3; D = 200 and D = 1 with Dv = 256 (128 threads, fwd 4 x 16, dkdv 18 x 4, dq 4 x 16) */
    {"d3", 2, 3, 3, 65, 65, 1, 0, 0, 0, 0, false, 0, 0},
    {"d3", 1, 1, 1, 5, 100, 0, 0, 0, 0, 0, false, 0, 0},
    {"d200", 1, 2, 1, 20, 20, 1, 0, 0, 0, 0, false, 0, 0},
    {"d200", 1, 2, 2, 45, 60, 0, 0, 0, 0, 0, false, 0, 0},
    {"d200", 1, 1, 1, 9, 13, 0, 0, 0, 0, 0, false, 0, 0},
    {"d200", 1, 1, 1, 8, 16, 1, 1, 2, 1, 2, false, 0, 0},
    {"d1v256", 1, 2, 2, 11, 11, 1, 0, 0, 0, 0, false, 0, 0},
    /* small tiles (fwd 16 x 8 and 8 x 4, the backward's 8 x 8, 4 x 4, 12 x 8 and 8 x 12): many
     * tiles, masks crossing tiles, every cp rank */
    {"t5v7", 1, 5, 5, 37, 29, 1, 0, 0, 0, 0, true, 0, 0},
    {"t5v7", 2, 6, 2, 23, 23, 1, 0, 0, 0, 0, true, 0, 0},
    {"t5v7", 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, false, 0, 0},
    {"t5v7", 1, 3, 1, 1, 19, 0, 0, 0, 0, 0, false, 0, 0},
    {"t5v7", 1, 2, 1, 18, 36, 1, 0, 2, 0, 2, true, 0, 0},
    {"t5v7", 1, 2, 1, 18, 36, 1, 1, 2, 1, 2, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 40, 1, 0, 4, 0, 4, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 40, 1, 1, 4, 1, 4, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 40, 1, 2, 4, 2, 4, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 40, 1, 3, 4, 3, 4, true, 0, 0},
    {"t5v7", 1, 2, 2, 9, 0, 0, 0, 0, 0, 0, false, 0, 0}, /* S = 0: no key, o = 0, lse = -inf */
    /* one ring block (cp_comm = ring): a rank's rows against another rank's chunks (rows that
     * see none of them: o = 0, lse = -inf) and against its own */
    {"t5v7", 1, 2, 1, 18, 18, 1, 0, 2, 1, -2, true, 0, 0},
    {"t5v7", 1, 2, 1, 18, 18, 1, 1, 2, 0, -2, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 10, 1, 2, 4, 2, -4, false, 0, 0},
    {"t5v7", 1, 1, 1, 10, 10, 1, 1, 4, 3, -4, false, 3, 0},
    {"d64", 1, 2, 1, 36, 36, 1, 1, 2, 0, -2, false, 0, 0},
    /* sliding windows (whole tiles skipped outside the band): 1 key, under a tile, over
     * several, with grouped heads, under a ring */
    {"t5v7", 1, 2, 2, 37, 37, 1, 0, 0, 0, 0, true, 1, 0},
    {"t5v7", 2, 6, 2, 40, 40, 1, 0, 0, 0, 0, true, 6, 0},
    {"t5v7", 1, 2, 1, 40, 40, 1, 0, 0, 0, 0, true, 10, 0}, /* a tile exactly one key inside the window */
    {"t5v7", 1, 2, 1, 40, 40, 1, 0, 0, 0, 0, true, 13, 0},
    {"t5v7", 1, 2, 1, 18, 36, 1, 1, 2, 1, 2, true, 7, 0},
    {"t5v7", 1, 1, 1, 10, 40, 1, 2, 4, 2, 4, false, 9, 0},
    {"d64", 1, 3, 1, 150, 150, 1, 0, 0, 0, 0, false, 40, 0},
    {"t16", 1, 4, 1, 21, 26, 1, 0, 0, 0, 0, true, 0, 0},
    {"t16", 1, 2, 2, 14, 28, 1, 1, 2, 1, 2, false, 0, 0},
    {"t9", 1, 3, 1, 29, 31, 1, 0, 0, 0, 0, true, 0, 0},
    {"t9", 1, 2, 1, 12, 48, 1, 2, 4, 2, 4, true, 0, 0},
    /* the tensor-core kernels (3xTF32 unless tf32): 128 rows or keys a block, key tiles of
     * 64, query tiles of 32; tails of every tile, GQA, context parallelism, windows */
    {"tc64", 1, 3, 3, 150, 150, 1, 0, 0, 0, 0, true, 0, 0},
    {"tc64", 2, 4, 2, 37, 53, 0, 0, 0, 0, 0, false, 0, 0},
    {"tc64", 1, 2, 1, 200, 200, 1, 0, 0, 0, 0, true, 70, 0},
    {"tc64", 1, 2, 1, 72, 144, 1, 1, 2, 1, 2, false, 0, 0},
    {"tc64", 1, 2, 1, 72, 72, 1, 0, 2, 1, -2, false, 0, 0}, /* one ring block */
    {"tc64", 1, 2, 1, 72, 72, 1, 1, 2, 0, -2, false, 0, 0},
    {"tc64", 1, 2, 2, 9, 0, 0, 0, 0, 0, 0, false, 0, 0},
    {"tc64", 1, 2, 1, 129, 129, 1, 0, 0, 0, 0, true, 0, 0}, /* the last row is a warp's first key */
    {"tc64", 1, 2, 1, 130, 130, 1, 0, 0, 0, 0, false, 0, 1},
#ifndef ATTN_EMU_FEW
    {"tc16v40", 1, 4, 2, 140, 140, 1, 0, 0, 0, 0, false, 0, 0},
    {"tc16v40", 1, 2, 2, 33, 290, 0, 0, 0, 0, 0, false, 0, 0},
    {"tc16v40", 1, 1, 1, 40, 160, 1, 2, 4, 2, 4, false, 0, 0},
    {"tc16v40", 1, 3, 1, 100, 100, 1, 0, 0, 0, 0, false, 0, 1},
    {"tc24v16", 2, 2, 1, 129, 129, 1, 0, 0, 0, 0, false, 5, 0},
    {"tc24v16", 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, false, 0, 0},
#endif
    /* the 16-bit tensor-core kernels (inputs rounded to the type first, as they arrive
     * widened from 16-bit activations): key tiles of 64 (forward) and 32 (dq), query tiles
     * of 16 (dkdv); tails, GQA, context parallelism, windows, no key */
    {"h64bf", 1, 3, 3, 150, 150, 1, 0, 0, 0, 0, true, 0, 0},
    {"h64bf", 2, 4, 2, 37, 53, 0, 0, 0, 0, 0, false, 0, 0},
    {"h64bf", 1, 2, 1, 200, 200, 1, 0, 0, 0, 0, true, 70, 0},
    {"h64bf", 1, 2, 1, 72, 144, 1, 1, 2, 1, 2, false, 0, 0},
    {"h64bf", 1, 2, 2, 9, 0, 0, 0, 0, 0, 0, false, 0, 0},
    {"h64bfs", 1, 3, 3, 150, 150, 1, 0, 0, 0, 0, true, 0, 0}, /* q, k, v as stored */
    {"h64bfs", 2, 4, 2, 37, 53, 0, 0, 0, 0, 0, false, 0, 0},
    {"h64bfs", 1, 2, 1, 72, 144, 1, 1, 2, 1, 2, false, 0, 0},
    {"h64f16", 1, 2, 1, 129, 129, 1, 0, 0, 0, 0, true, 0, 0},
    {"h64f16", 2, 2, 1, 40, 90, 0, 0, 0, 0, 0, false, 0, 0},
#ifndef ATTN_EMU_FEW
    {"h16v40bf", 1, 4, 2, 140, 140, 1, 0, 0, 0, 0, false, 0, 0},
    {"h16v40bf", 1, 2, 2, 33, 290, 0, 0, 0, 0, 0, false, 0, 0},
    {"h16v40bf", 1, 1, 1, 40, 160, 1, 2, 4, 2, 4, false, 0, 0},
    {"h24v16f16", 2, 2, 1, 129, 129, 1, 0, 0, 0, 0, false, 5, 0},
    {"h24v16f16", 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, false, 0, 0},
#endif
    /* heads over 64: the forward's one buffer of 32 keys, dq's of 16, dkdv's 128 floats of
     * accumulators a lane */
    {"h128bfs", 1, 2, 1, 150, 150, 1, 0, 0, 0, 0, true, 0, 0},
    {"h128bfs", 2, 4, 2, 37, 53, 0, 0, 0, 0, 0, false, 0, 0},
    {"h128bfs", 1, 2, 1, 200, 200, 1, 0, 0, 0, 0, true, 70, 0},
    {"h128bfs", 1, 2, 1, 72, 144, 1, 1, 2, 1, 2, false, 0, 0},
    {"h128bfs", 1, 2, 2, 9, 0, 0, 0, 0, 0, 0, false, 0, 0},
#ifndef ATTN_EMU_FEW
    {"h128f16s", 1, 2, 1, 129, 129, 1, 0, 0, 0, 0, false, 0, 0},
    {"h128f16s", 2, 2, 1, 40, 90, 0, 0, 0, 0, 0, false, 0, 0},
    {"h72v112bf", 1, 4, 2, 140, 140, 1, 0, 0, 0, 0, false, 0, 0},
    {"h72v112bf", 1, 1, 1, 40, 160, 1, 2, 4, 2, 4, false, 0, 0},
#endif
};

/* ------------------------------------------------------------------ the reference */

static long long zigzag(long long r, long long size, long long local, long long i) {
  long long h = local / 2;
  return i < h ? r * h + i : (2 * size - 1 - r) * h + (i - h);
}

static long long rowpos(const Case &c, long long t) { return c.rs <= 1 ? t : zigzag(c.rr, c.rs, c.T, t); }

static long long colpos(const Case &c, long long j) {
  if (c.cs < -1) return zigzag(c.cr, -c.cs, c.S, j); /* one ring block */
  if (c.cs <= 1) return j;
  long long len = c.S / c.cs, blk = j / len, owner = (c.cr - blk + c.cs) % c.cs;
  return zigzag(owner, c.cs, len, j % len);
}

static bool allowed(const Case &c, long long t, long long j) {
  if (!c.causal) return true;
  const long long d = rowpos(c, t) - colpos(c, j);
  return d >= 0 && (c.window <= 0 || d < c.window);
}

/* out [B, H, T, Dv + 1] in fp64 */
static std::vector<double> ref_forward(const Case &c, int D, int Dv, double scale, const std::vector<float> &q,
                                       const std::vector<float> &k, const std::vector<float> &v) {
  std::vector<double> out((size_t)c.B * c.H * c.T * (Dv + 1)), s(c.S);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.H; h++) {
      long long bh = (long long)b * c.H + h, bhk = (long long)b * c.Hk + h / (c.H / c.Hk);
      for (int t = 0; t < c.T; t++) {
        const float *qt = &q[(bh * c.T + t) * D];
        double mx = -INFINITY;
        for (int j = 0; j < c.S; j++) {
          const float *kj = &k[(bhk * c.S + j) * D];
          double d = 0;
          for (int i = 0; i < D; i++) d += (double)qt[i] * kj[i];
          s[j] = allowed(c, t, j) ? scale * d : -INFINITY;
          mx = s[j] > mx ? s[j] : mx;
        }
        double *o = &out[(bh * c.T + t) * (Dv + 1)];
        if (mx == -INFINITY) {
          o[Dv] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int j = 0; j < c.S; j++) sum += std::exp(s[j] - mx);
        double lse = mx + std::log(sum);
        for (int j = 0; j < c.S; j++) {
          double p = std::exp(s[j] - lse);
          for (int i = 0; i < Dv; i++) o[i] += p * v[(bhk * c.S + j) * Dv + i];
        }
        o[Dv] = lse;
      }
    }
  return out;
}

/* grads = dq, dk, dv in fp64, from the given (float) forward output */
static std::vector<double> ref_backward(const Case &c, int D, int Dv, double scale, const std::vector<float> &q,
                                        const std::vector<float> &k, const std::vector<float> &v,
                                        const std::vector<float> &out, const std::vector<float> &dout) {
  const long long nq = (long long)c.B * c.H * c.T * D, nk = (long long)c.B * c.Hk * c.S * D;
  std::vector<double> g((size_t)(nq + nk + (long long)c.B * c.Hk * c.S * Dv), 0.0);
  double *dq = g.data(), *dk = dq + nq, *dv = dk + nk;
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.H; h++) {
      long long bh = (long long)b * c.H + h, bhk = (long long)b * c.Hk + h / (c.H / c.Hk);
      for (int t = 0; t < c.T; t++) {
        const float *qt = &q[(bh * c.T + t) * D], *o = &out[(bh * c.T + t) * (Dv + 1)];
        const float *go = &dout[(bh * c.T + t) * (Dv + 1)];
        double lse = o[Dv], Dt = 0;
        for (int i = 0; i < Dv; i++) Dt += (double)go[i] * o[i];
        Dt -= go[Dv];
        for (int j = 0; j < c.S; j++) {
          if (!allowed(c, t, j) || lse == -INFINITY) continue;
          const float *kj = &k[(bhk * c.S + j) * D], *vj = &v[(bhk * c.S + j) * Dv];
          double s = 0, dp = 0;
          for (int i = 0; i < D; i++) s += (double)qt[i] * kj[i];
          for (int i = 0; i < Dv; i++) dp += (double)go[i] * vj[i];
          double p = std::exp(scale * s - lse), ds = p * (dp - Dt);
          for (int i = 0; i < D; i++) {
            dq[(bh * c.T + t) * D + i] += scale * ds * kj[i];
            dk[(bhk * c.S + j) * D + i] += scale * ds * qt[i];
          }
          for (int i = 0; i < Dv; i++) dv[(bhk * c.S + j) * Dv + i] += p * go[i];
        }
      }
    }
  return g;
}

/* The header's position helpers against hpdl_cuda.cuh's (the ring's in 32 bits) and
 * against brute force (the tile-skip bounds), over every rank of sizes 1 .. 5 and every
 * range of lengths up to 24. */
static void check_positions() {
  long long n = 0, bad = 0;
  for (int size = 1; size <= 5; size++)
    for (int rank = 0; rank < size; rank++)
      for (int len = 1; len <= 24; len++) {
        const int T = len, S = len * size; /* local rows; keys around the ring */
        for (int j = 0; j < S; j++, n++)
          bad += hpdl_attn_colpos(j, S, rank, size) !=
                 (size <= 1 ? j : (int)hpdl_ring_col_pos(rank, size, S, j));
        for (int t = 0; t < T; t++, n++)
          bad += hpdl_attn_rowpos(t, T, rank, size) != (size <= 1 ? t : (int)hpdl_zigzag_pos(rank, size, T, t));
        /* one ring block of len keys, rank's chunks: the span S = len x size, its first block */
        for (int j = 0; j < len && size > 1; j++, n++)
          bad += hpdl_attn_colpos(j, S, rank, size) != (int)hpdl_zigzag_pos(rank, size, len, j);
        for (int a = 0; a <= S; a++)
          for (int b = a; b <= S; b++, n++) {
            int mn = 0x7fffffff, mx = -1;
            for (int j = a; j < b; j++) mn = std::min(mn, hpdl_attn_colpos(j, S, rank, size));
            for (int t = a; t < b && t < T; t++) mx = std::max(mx, hpdl_attn_rowpos(t, T, rank, size));
            bad += hpdl_attn_colpos_min(a, b, S, rank, size) != mn;
            if (b <= T) bad += hpdl_attn_rowpos_max(a, b, T, rank, size) != mx;
          }
      }
  std::printf("positions: %lld checks of the ring / zigzag helpers and the tile bounds, %lld wrong\n", n, bad);
  check(bad == 0, "position helpers");
}

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
  size_t unwritten(size_t lo, size_t hi) const {
    size_t u = 0;
    for (size_t i = lo; i < hi; i++) u += bits(store[GUARD + i]) == CANARY;
    return u;
  }
};

/* The error of got against ref over [lo, hi), the elements whose index mod `stride` is in
 * [first, first + width) (o or lse of the packed output), as the header says. */
struct Err {
  double worst = 0;
  size_t count = 0;
};

static Err compare(const std::vector<float> &got, const std::vector<double> &ref, size_t lo, size_t hi,
                   size_t stride = 1, size_t first = 0, size_t width = 1) {
  auto in = [&](size_t i) { return (i - lo) % stride >= first && (i - lo) % stride < first + width; };
  double mx = 0;
  for (size_t i = lo; i < hi; i++)
    if (in(i) && std::isfinite(ref[i])) mx = std::fmax(mx, std::fabs(ref[i]));
  Err e;
  for (size_t i = lo; i < hi; i++) {
    if (!in(i)) continue;
    double gv = got[i], r = ref[i], err;
    if (gv == r) err = 0; /* -inf == -inf too */
    else if (!std::isfinite(gv) || !std::isfinite(r)) err = INFINITY;
    else err = std::fabs(gv - r) / std::fmax(mx, 1e-30);
    if (!(err <= e.worst)) e.worst = err; /* NaN sticks */
    e.count++;
  }
  return e;
}

static uint64_t fnv(uint64_t h, const std::vector<float> &v) {
  for (float x : v) {
    uint32_t u = bits(x);
    for (int i = 0; i < 4; i++) h = (h ^ ((u >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

struct Grids {
  int threads, dt_threads;
  long long fwd, dt, dkdv, dq;
};

static Grids grids_of(const Config &f, const Case &c) {
  Grids g;
  if (f.rule) {
    hpdl_attn_launch L;
    bool ok = (f.rule == 2 ? hpdl_attn_plan_tc(f.D, f.Dv, f.h16 != 0, c.B, c.H, c.Hk, c.T, c.S, &L)
                           : hpdl_attn_plan(f.D, f.Dv, c.B, c.H, c.Hk, c.T, c.S, &L)) == 0;
    check(ok && L.tc == (f.rule == 2 ? (f.h16 ? 2 : 1) : 0) && L.threads == f.nt && L.fwd_bq == f.fbq && L.fwd_bk == f.fbk && L.dkdv_bq == f.kbq &&
              L.dkdv_bk == f.kbk && L.dq_bq == f.qbq && L.dq_bk == f.qbk &&
              L.scratch_floats == (long long)c.B * c.H * c.T,
          std::string(f.name) + ": hpdl_attn_plan gives the kernels' tiles");
    g = Grids{L.threads, HPDL_ATTN_THREADS(f.D, f.Dv), L.grid_fwd, L.grid_dt, L.grid_dkdv, L.grid_dq};
  } else {
    auto cdiv = [](long long a, long long b) { return (a + b - 1) / b; };
    g = Grids{f.nt, f.nt, (long long)c.B * c.H * cdiv(c.T, f.fbq), cdiv((long long)c.B * c.H * c.T, f.nt / 32),
              (long long)c.B * c.Hk * cdiv(c.S, f.kbk), (long long)c.B * c.H * cdiv(c.T, f.qbq)};
  }
  return g;
}

/* The four launches with q, k, v of type TQ (fwd, dkdv, dq taking them so); 0 on success. */
template <typename TQ, typename Fwd, typename Bwd>
static int launch4(const Config &f, const Case &c, const Grids &g, float scale, Fwd fwd, Bwd dkdv, Bwd dq, const TQ *q,
                   const TQ *k, const TQ *v, const float *dout, float *out, float *Dt, float *grads, std::string &why) {
  hpdl_kctx hpd;
  std::memset(&hpd, 0, sizeof hpd);
  hpd.flags = c.tf32 ? HPDL_KCTX_TF32 : 0;
  dim3 block((unsigned)g.threads);
  /* the keys' positions: the ring's blocks over S keys, or one block of an S x c span */
  const int cs = c.cs < -1 ? -c.cs : c.cs, Sc = c.cs < -1 ? c.S * cs : c.S;
  int rc = hpdl_emu_launch_named("fwd", fwd, dim3((unsigned)g.fwd), block, 0, hpd, q, k, v, out, c.B, c.H, c.Hk, c.T,
                                 c.S, scale, c.causal, c.window, c.rr, c.rs, c.cr, cs, Sc);
  if (!rc) rc = hpdl_emu_launch_named("dt", f.dt, dim3((unsigned)g.dt), dim3((unsigned)g.dt_threads), 0, hpd, out, dout, Dt, c.B, c.H, c.T);
  if (!rc && g.dkdv > 0) /* S = 0: no key, no launch */
    rc = hpdl_emu_launch_named("dkdv", dkdv, dim3((unsigned)g.dkdv), block, 0, hpd, q, k, v, out, dout, Dt, grads, c.B,
                               c.H, c.Hk, c.T, c.S, scale, c.causal, c.window, c.rr, c.rs, c.cr, cs, Sc);
  if (!rc)
    rc = hpdl_emu_launch_named("dq", dq, dim3((unsigned)g.dq), block, 0, hpd, q, k, v, out, dout, Dt, grads, c.B, c.H,
                               c.Hk, c.T, c.S, scale, c.causal, c.window, c.rr, c.rs, c.cr, cs, Sc);
  if (rc) why = hpdl_emu_last_error();
  return rc;
}

/* The four launches; 0 on success. With the 16-bit kernels reading q, k, v as stored, their
 * bits (exact: run_case rounded the values). */
static int launch_all(const Config &f, const Case &c, const Grids &g, float scale, const float *q, const float *k,
                      const float *v, const float *dout, float *out, float *Dt, float *grads, std::string &why) {
  if (!f.fwd16) return launch4(f, c, g, scale, f.fwd, f.dkdv, f.dq, q, k, v, dout, out, Dt, grads, why);
  auto bits16 = [&](const float *x, size_t n) {
    std::vector<unsigned short> h(n);
    for (size_t i = 0; i < n; i++) h[i] = f.h16 == 1 ? hpdl_bf16_from_f32(x[i]) : hpdl_f16_from_f32(x[i]);
    return h;
  };
  const std::vector<unsigned short> q16 = bits16(q, (size_t)c.B * c.H * c.T * f.D),
                                    k16 = bits16(k, (size_t)c.B * c.Hk * c.S * f.D),
                                    v16 = bits16(v, (size_t)c.B * c.Hk * c.S * f.Dv);
  return launch4(f, c, g, scale, f.fwd16, f.dkdv16, f.dq16, q16.data(), k16.data(), v16.data(), dout, out, Dt, grads, why);
}

static double g_worst[5];           /* o, lse, dq, dk, dv over all fp32 cases */
static double g_worst_h16[2][5];    /* the same over the bf16 and the fp16 kernels' */

static void run_case(int idx, const Case &c) {
  const Config &f = config(c.cfg);
  const int D = f.D, Dv = f.Dv;
  char ctxbuf[200];
  std::snprintf(ctxbuf, sizeof ctxbuf, "%-7s B=%d H=%d Hk=%d T=%-3d S=%-3d %s%s", f.name, c.B, c.H, c.Hk, c.T, c.S,
                c.causal ? (c.window ? "window" : "causal") : "full", c.tf32 ? " tf32" : "");
  const bool coarse = c.tf32 || f.h16; /* products at under fp32's precision */
  const double tol = c.tf32 ? TOL_TF32 : f.h16 == 1 ? TOL_BF16 : f.h16 == 2 ? TOL_F16 : TOL;
  std::string ctx = ctxbuf;
  if (c.rs > 1) {
    std::snprintf(ctxbuf, sizeof ctxbuf, " cp rows %d/%d cols %d/%d", c.rr, c.rs, c.cr, c.cs);
    ctx += ctxbuf;
  }
  const size_t nq = (size_t)c.B * c.H * c.T * D, nk = (size_t)c.B * c.Hk * c.S * D,
               nv = (size_t)c.B * c.Hk * c.S * Dv, no = (size_t)c.B * c.H * c.T * (Dv + 1),
               ng = nq + nk + nv, rows = (size_t)c.B * c.H * c.T;
  Rng rng(1000 + idx);
  std::vector<float> q(nq), k(nk), v(nv), dout(no);
  for (float &x : q) x = float(rng.uniform(-1, 1));
  for (float &x : k) x = float(rng.uniform(-1, 1));
  for (float &x : v) x = float(rng.uniform(-1, 1));
  for (float &x : dout) x = float(rng.uniform(-1, 1));
  if (f.h16) /* the values 16-bit activations widen: exact in the kernels' operand type */
    for (std::vector<float> *a : {&q, &k, &v, &dout})
      for (float &x : *a)
        x = f.h16 == 1 ? hpdl_bf16_to_f32(hpdl_bf16_from_f32(x)) : hpdl_f16_to_f32(hpdl_f16_from_f32(x));
  /* a scale that makes the softmax peaked rather than flat: large scores, exp over a range */
  const float scale = float(2.0 / std::sqrt((double)D));
  const Grids g = grids_of(f, c);

  std::vector<float> first_out, first_grads;
  uint64_t digest = 1469598103934665603ull;
  for (int rep = 0; rep < 3; rep++) {
    Buf out(no), Dt(rows), grads(ng);
    std::string why;
    if (!check(launch_all(f, c, g, scale, q.data(), k.data(), v.data(), dout.data(), out.p(), Dt.p(), grads.p(),
                          why) == 0,
               ctx + ": launches (" + why + ")"))
      return;
    check(out.guards_intact() && Dt.guards_intact() && grads.guards_intact(),
          ctx + ": nothing written outside the arrays");
    check(out.unwritten(0, no) == 0 && Dt.unwritten(0, rows) == 0 && grads.unwritten(0, ng) == 0,
          ctx + ": every output value written");
    std::vector<float> o = out.body(), gr = grads.body();
    if (rep == 0) {
      first_out = o;
      first_grads = gr;
      digest = fnv(fnv(digest, o), gr);
      std::vector<double> ro = ref_forward(c, D, Dv, scale, q, k, v);
      std::vector<double> rg = ref_backward(c, D, Dv, scale, q, k, v, o, dout);
      Err e[5] = {compare(o, ro, 0, no, Dv + 1, 0, Dv), compare(o, ro, 0, no, Dv + 1, Dv, 1), compare(gr, rg, 0, nq),
                  compare(gr, rg, nq, nq + nk), compare(gr, rg, nq + nk, ng)};
      const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
      std::string line = ctx;
      bool ok = true;
      double most = 0;
      for (int i = 0; i < 5; i++) {
        std::snprintf(ctxbuf, sizeof ctxbuf, "  %s %.1e", names[i], e[i].worst);
        line += ctxbuf;
        ok = ok && e[i].worst <= tol;
        most = std::fmax(most, e[i].worst);
        if (!coarse) g_worst[i] = std::fmax(g_worst[i], e[i].worst);
        else if (f.h16) g_worst_h16[f.h16 - 1][i] = std::fmax(g_worst_h16[f.h16 - 1][i], e[i].worst);
      }
      /* else the coarse products did not run (one key: P = 1, exact in 16 bits) */
      if (coarse && c.S > (f.h16 ? 1 : 0)) ok = ok && most >= (f.h16 ? H16_MIN : TF32_MIN);
      std::printf("%s  %s\n", line.c_str(), ok ? "ok" : "FAIL");
      if (!ok) g_failures++;
    } else {
      check(std::memcmp(o.data(), first_out.data(), no * 4) == 0 && std::memcmp(gr.data(), first_grads.data(),
                                                                               ng * 4) == 0,
            ctx + ": run " + std::to_string(rep + 1) + " bit for bit the first");
    }
  }
  std::printf("digest %d %016" PRIx64 "\n", idx, digest);
}

/* The launch rule for a few head sizes: "cfg D Dv: threads, tiles, grids, scratch" for a
 * fixed shape (the driver compares it with the same from C11). */
static void print_cfg() {
  static const int sizes[][2] = {{1, 1}, {3, 3}, {64, 64}, {65, 64}, {128, 64}, {128, 128}, {129, 1}, {1, 256},
                                 {200, 200}, {256, 256}};
  for (const auto &s : sizes) {
    hpdl_attn_launch L = {};
    int rc = hpdl_attn_plan(s[0], s[1], 3, 6, 2, 1000, 777, &L);
    std::printf("cfg %d %d: rc %d threads %d fwd %dx%d dkdv %dx%d dq %dx%d grids %lld %lld %lld %lld scratch %lld\n",
                s[0], s[1], rc, L.threads, L.fwd_bq, L.fwd_bk, L.dkdv_bq, L.dkdv_bk, L.dq_bq, L.dq_bk, L.grid_fwd,
                L.grid_dt, L.grid_dkdv, L.grid_dq, L.scratch_floats);
  }
  hpdl_attn_launch L = {};
  std::printf("cfg refused: %d %d %d %d\n", hpdl_attn_plan(0, 64, 1, 1, 1, 1, 1, &L),
              hpdl_attn_plan(64, 257, 1, 1, 1, 1, 1, &L), hpdl_attn_plan(64, 64, 1, 6, 4, 1, 1, &L),
              hpdl_attn_plan(64, 64, 1, 1, 1, 1LL << 40, 1, &L));
}

int main(int argc, char **argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "cfg") {
    print_cfg();
    return 0;
  }
  if (what != "all" && what != "mutation") {
    std::fprintf(stderr, "usage: attention_emu all|mutation|cfg\n");
    return 2;
  }
  if (what == "all") check_positions();
  int n = 0;
  for (int i = 0; i < int(sizeof CASES / sizeof CASES[0]); i++)
    if (what == "all" || CASES[i].many_tiles) {
      run_case(i, CASES[i]);
      n++;
      if (what == "mutation" && g_failures) break; /* a mutant is caught by its first failure: the rest is time */
    }
  std::printf("max errors (max |got - ref| / max |ref| a tensor; tolerance %.0e): o %.2e lse %.2e dq %.2e dk %.2e "
              "dv %.2e\n",
              TOL, g_worst[0], g_worst[1], g_worst[2], g_worst[3], g_worst[4]);
  for (int e = 0; e < 2; e++)
    std::printf("max errors of the %s kernels (tolerance %.1e): o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                e ? "fp16" : "bf16", e ? TOL_F16 : TOL_BF16, g_worst_h16[e][0], g_worst_h16[e][1], g_worst_h16[e][2],
                g_worst_h16[e][3], g_worst_h16[e][4]);
  std::printf("attention_emu %s: %d cases, %s\n", what.c_str(), n, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
