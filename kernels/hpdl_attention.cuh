/* kernels/hpdl_attention.cuh - scaled dot-product attention forward and backward on the
 * GPU in fp32, FlashAttention-2's schedule (kernels/README.md, "Attention"): the T x S
 * score matrix is never stored, each block keeps a tile of it in shared memory.
 *
 * What they compute is core/attn.c's ATTENTION and ATTENTION_BWD (attn.h), the reference
 * executor's semantics: q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv], contiguous
 * row-major, query head h reading key / value head h / (H / Hk); s = scale q[t] . k[j]
 * (the dot in fp32); with `causal`, key j is allowed for row t when colpos(j) <= rowpos(t)
 * (and, with window > 0, rowpos(t) - colpos(j) < window: a sliding window),
 * the positions being t and j, or under context parallelism (size > 1) the row's place in
 * this rank's zigzag chunks and the key's in the ring order (hpdl_cuda.cuh). The forward
 * writes out PACKED [B, H, T, Dv + 1]: o = sum_j P[t][j] v[j], P = exp(s - lse) over the
 * allowed keys, then lse = log sum_j exp(s) (a row with no allowed key: o = 0, lse = -inf).
 * The backward takes q, k, v, that out and its gradient dout (last column d lse) and
 * writes grads = dq, dk, dv one after another (overwritten):
 *     Dt = do . o - dlse,  dS = P (do . v[j] - Dt),
 *     dq[t] = scale sum_j dS k[j],  dk[j] = scale sum_{h, t} dS q[t],  dv[j] = sum_{h, t} P do[t]
 * (dk, dv over the group's query heads).
 *
 * The kernels, each a templated __device__ function that a generated
 * `extern "C" __global__ __launch_bounds__(256)` kernel calls with blockIdx.x as `blk`, in
 * 1-D grids of blockDim.x = NT threads (hpdl_attention_cfg.h: the rule, the grids; the
 * templates' defaults are its tiles):
 *   hpdl_attn_fwd<D, Dv>(q, k, v, out, B, H, Hk, T, S, scale, causal, window, row_rank, row_size,
 *                        col_rank, col_size, blk)
 *       a block per (b, h, tile of BQ query rows): key tiles of BK keys in shared memory one
 *       after another, the online softmax (running max and sum a row), o and lse written
 *       once at the end;
 *   hpdl_attn_bwd_dt<D, Dv>(out, dout, Dt, B, H, T, blk)
 *       Dt a row into the caller's scratch [B * H * T] floats (a warp a row);
 *   hpdl_attn_bwd_dkdv<D, Dv>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal,
 *                             window, row_rank, row_size, col_rank, col_size, blk)
 *       a block per (b, hk, tile of BK keys): the group's heads and all their query tiles in
 *       order, P and dS again from q, k and lse, dk and dv accumulated in registers and
 *       stored once;
 *   hpdl_attn_bwd_dq<D, Dv>(the same arguments as dkdv)
 *       a block per (b, h, tile of BQ query rows): the key tiles in order, dq in registers.
 * The backward's three run in that order (dkdv and dq read Dt). Template arguments after
 * <D, Dv>: NT, BQ, BK (other tiles, for tests). Shapes as core/attn.c checks them: T, S >= 1
 * (S = 0 works but has no dkdv launch), H a multiple of Hk, under context parallelism S a
 * multiple of col_size; every count and position below 2^31 (element offsets are 64-bit).
 * Under a causal mask a tile of keys none of whose pairs with the tile of rows is allowed
 * is skipped (decided from the smallest key position and the largest row position: a
 * rank's row positions increase along its rows, key positions along each ring block); the
 * others are masked pair by pair.
 *
 * Deterministic: no atomics; every value is one thread's sum in a fixed order (d, keys,
 * heads, query tiles ascending) or a butterfly over the lanes of one row (the same in every
 * lane and every run), so results are bit for bit the same run to run and under any
 * scheduling. Not bit for bit core/attn.c (another summation order; within fp32 rounding).
 *
 * Threads. A query row belongs to TPR = NT / BQ consecutive lanes of one warp (the forward
 * and dq), a key to NT / BK lanes (dkdv): a row's scores, its P / dS tile row and its
 * accumulators stay with those lanes, which is why only the barriers around the tile loads
 * are block-wide and the P / dS handoff is a __syncwarp. The rule gives a thread at most 8
 * columns of o or dq and 8 + 8 of dk, dv, and sizes the shared arrays for the tier's largest
 * head (hpdl_attention_cfg.h says why: ptxas's register budget follows the shared memory).
 * Shared rows are padded by one float where lanes read different rows at one column (no
 * bank conflicts for D a multiple of 32).
 *
 * Not yet: tensor cores (mma / wmma) and bf16 / fp16 inputs; register-blocked 2-D thread
 * tiles and vector (float4) or asynchronous (cp.async) tile loads. This is plain fp32 SIMT,
 * about one shared-memory load per multiply-add: correctness and determinism first.
 *
 * Compiles under NVRTC (the folder on --include-path), nvcc and the emulation
 * (kernels/cuda_emu.h), like hpdl_cuda.cuh, which it includes for the positions. */
#ifndef HPDL_ATTENTION_CUH
#define HPDL_ATTENTION_CUH

#include "hpdl_attention_cfg.h"
#include "hpdl_cuda.cuh"

#define HPDL_ATTN_SMEM_LIMIT 49152 /* bytes of static shared memory a kernel may have */

/* The loops over a tile's rows or keys, and over a thread's P / dS elements, stay rolled
 * on the GPU and the dot products unroll by 4 only: fully unrolled, the loads they put in
 * flight need registers that ptxas, which under __launch_bounds__(256) aims at the
 * occupancy the shared memory allows (40 to 80 registers here), then spills. */
#ifdef __CUDACC__
#define HPDL_ATTN_ROLLED _Pragma("unroll 1")
#define HPDL_ATTN_UNROLL4 _Pragma("unroll 4")
#else
#define HPDL_ATTN_ROLLED
#define HPDL_ATTN_UNROLL4
#endif

/* Positions (core/attn.c's row_pos and ring), in int: positions are below 2^31 (T and S
 * are ints, a global position below S). The key's is hpdl_ring_col_pos's formula in 32
 * bits: its long long divisions by a variable become a called subroutine in SASS, whose
 * stack frame shows as spills (tests/cuda/attention_emu.cpp checks both agree). */
static __device__ __forceinline__ int hpdl_attn_rowpos(int t, int T, int rank, int size) {
  return size <= 1 ? t : (int)hpdl_zigzag_pos(rank, size, T, t);
}

static __device__ __forceinline__ int hpdl_attn_colpos(int j, int S, int rank, int size) {
  if (size <= 1) return j;
  const int len = S / size, blk = j / len, owner = (rank - blk + size) % size;
  return (int)hpdl_zigzag_pos(owner, size, len, j - blk * len);
}

/* The largest row position over rows [t0, t1), -1 when empty: the last row's, as positions
 * increase along a rank's rows (chunk r, then chunk 2 size - 1 - r, each in order). */
static __device__ __forceinline__ int hpdl_attn_rowpos_max(int t0, int t1, int T, int rank, int size) {
  return t0 < t1 ? hpdl_attn_rowpos(t1 - 1, T, rank, size) : -1;
}

/* The smallest key position over keys [j0, j1) (INT_MAX when empty): positions increase
 * within each ring block (S / size keys: one rank's two chunks) but not from one block to
 * the next, so the smallest of each block's first key in the range. S must be a multiple
 * of size when size > 1 (core/attn.c checks it). */
static __device__ __forceinline__ int hpdl_attn_colpos_min(int j0, int j1, int S, int rank, int size) {
  if (size <= 1) return j0 < j1 ? j0 : 0x7fffffff;
  const int len = S / size;
  int mn = 0x7fffffff;
  for (int j = j0; j < j1; j += len - j % len) {
    const int p = hpdl_attn_colpos(j, S, rank, size);
    mn = p < mn ? p : mn;
  }
  return mn;
}

/* Whether a key at position cp is allowed for a row at position rp under the causal
 * mask: at or before it, and within the sliding window when window > 0 (ir_ops.h). */
static __device__ __forceinline__ bool hpdl_attn_allowed(int rp, int cp, int window) {
  return cp <= rp && (window <= 0 || rp - cp < window);
}

/* The largest key position over keys [j0, j1) (-1 when empty): each ring block's last key
 * in the range, positions increasing within a block (as hpdl_attn_colpos_min). */
static __device__ __forceinline__ int hpdl_attn_colpos_max(int j0, int j1, int S, int rank, int size) {
  if (size <= 1) return j0 < j1 ? j1 - 1 : -1;
  const int len = S / size;
  int mx = -1;
  for (int j = j0; j < j1;) {
    const int end = j + len - j % len, last = j1 < end ? j1 - 1 : end - 1;
    const int p = hpdl_attn_colpos(last, S, rank, size);
    mx = p > mx ? p : mx;
    j = end;
  }
  return mx;
}

/* A tile of ROWS rows of W floats into shared memory (rows LD floats apart), from rows SLD
 * floats apart in global memory (W: contiguous; Dv + 1: the packed output's gradient), zeros
 * for the rows at and past n; the block's threads share it, consecutive threads consecutive
 * floats. */
template <int ROWS, int W, int SLD, int NT, int LD>
static __device__ __forceinline__ void hpdl_attn_load(float (*dst)[LD], const float *__restrict__ src, int n) {
  for (int e = threadIdx.x; e < ROWS * W; e += NT) {
    const int i = e / W, d = e - i * W;
    dst[i][d] = i < n ? src[SLD == W ? e : i * SLD + d] : 0.0f; /* a tile's offsets fit an int */
  }
}

/* ---------------------------------------------------------------------- forward */

/* out [B, H, T, Dv + 1] for the block `blk` of HPDL_ATTN_FWD_GRID: query rows
 * [t0, t0 + BQ) of (b, h). Thread (r, c) = (tid / TPR, tid % TPR) holds row r's scores for
 * keys c, c + TPR, ... of a tile and its o columns c, c + TPR, ... */
template <int D, int Dv, int NT = HPDL_ATTN_THREADS(D, Dv), int BQ = HPDL_ATTN_FWD_BQ(D, Dv),
          int BK = HPDL_ATTN_FWD_BK(D, Dv)>
static __device__ void hpdl_attn_fwd(const float *__restrict__ q, const float *__restrict__ k,
                                     const float *__restrict__ v, float *__restrict__ out, int B, int H, int Hk,
                                     int T, int S, float scale, int causal, int window, int row_rank, int row_size,
                                     int col_rank, int col_size, long long blk) {
  constexpr int TPR = NT / BQ, NS = (BK + TPR - 1) / TPR, NO = (Dv + TPR - 1) / TPR, P = HPDL_ATTN_HEAD_CAP(D, Dv);
  constexpr bool EVEN = BK % TPR == 0; /* else the last keys of a row's lanes lie past the tile */
  static_assert(D >= 1 && D <= HPDL_ATTN_MAX_HEAD && Dv >= 1 && Dv <= HPDL_ATTN_MAX_HEAD, "head sizes 1 .. 256");
  static_assert(NT % 32 == 0 && NT <= 256 && NT % BQ == 0 && TPR <= 32 && (TPR & (TPR - 1)) == 0,
                "a row is a power-of-2 group of lanes of one warp");
  static_assert(4 * (BQ * (P + 1) + BK * (P + 1) + BK * P + BQ * BK) + 4 * BK <= HPDL_ATTN_SMEM_LIMIT,
                "forward tiles over 48 KB of shared memory");
  __shared__ float Qs[BQ][P + 1];
  __shared__ float Ks[BK][P + 1];
  __shared__ float Vs[BK][P]; /* read along a row only: no padding */
  __shared__ float Ps[BQ][BK];
  __shared__ int Cp[BK]; /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, r = tid / TPR, c = tid % TPR;
  const int nq = (T + BQ - 1) / BQ, bh = (int)blk / nq; /* 32-bit: a 1-D grid has < 2^31 blocks */
  const int t0 = ((int)blk - bh * nq) * BQ, nrows = T - t0 < BQ ? T - t0 : BQ;
  const int bhk = bh / H * Hk + (bh % H) / (H / Hk);
  const float *__restrict__ qt = q + ((long long)bh * T + t0) * D;
  const float *__restrict__ kh = k + (long long)bhk * S * D;
  const float *__restrict__ vh = v + (long long)bhk * S * Dv;
  hpdl_attn_load<BQ, D, D, NT>(Qs, qt, nrows);
  const int rp = causal ? hpdl_attn_rowpos(t0 + r, T, row_rank, row_size) : 0; /* used only for r < nrows */
  const int rmax = causal ? hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) : 0;
  /* rows' positions increase along a rank's rows: the tile's first is its smallest */
  const int rmin = causal && nrows > 0 ? hpdl_attn_rowpos(t0, T, row_rank, row_size) : 0;
  float m = HPDL_NEG_INF, l = 0.0f; /* the row's running max; this lane's part of its sum */
  float o[NO];
  for (int i = 0; i < NO; i++) o[i] = 0.0f;

  for (int j0 = 0; j0 < S; j0 += BK) {
    const int nk = S - j0 < BK ? S - j0 : BK;
    /* the same decision in every thread: the barriers below stay uniform */
    if (causal && window > 0 && rmin - hpdl_attn_colpos_max(j0, j0 + nk, S, col_rank, col_size) >= window)
      continue; /* fwd: the tile is behind the window */
    if (causal && hpdl_attn_colpos_min(j0, j0 + nk, S, col_rank, col_size) > rmax) continue;
    __syncthreads(); /* fwd: the previous tile's Ks, Vs, Ps are read */
    hpdl_attn_load<BK, D, D, NT>(Ks, kh + (long long)j0 * D, nk);
    hpdl_attn_load<BK, Dv, Dv, NT>(Vs, vh + (long long)j0 * Dv, nk); /* zeros: 0 * v stays 0 past S */
    if (causal)
      for (int j = tid; j < BK; j += NT) Cp[j] = j < nk ? hpdl_attn_colpos(j0 + j, S, col_rank, col_size) : 0;
    __syncthreads(); /* fwd: the tile is loaded */

    float s[NS];
    for (int i = 0; i < NS; i++) s[i] = 0.0f;
    HPDL_ATTN_UNROLL4
    for (int d = 0; d < D; d++) {
      const float x = Qs[r][d];
      for (int i = 0; i < NS; i++) {
        const int j = c + TPR * i;
        s[i] += x * Ks[EVEN || j < BK ? j : BK - 1][d]; /* past the tile: masked below */
      }
    }
    float mt = HPDL_NEG_INF;
    for (int i = 0; i < NS; i++) {
      const int j = c + TPR * i;
      const bool ok = r < nrows && j < nk && (!causal || hpdl_attn_allowed(rp, Cp[j], window));
      s[i] = ok ? scale * s[i] : HPDL_NEG_INF;
      mt = fmaxf(mt, s[i]);
    }
    for (int w = TPR / 2; w > 0; w >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, w));
    /* rescale by exp(old max - new max); while no key of the row is allowed (max -inf)
     * subtract 0 instead, so that exp gives 0, not exp(-inf + inf) = NaN */
    const float mnew = fmaxf(m, mt), base = mnew == HPDL_NEG_INF ? 0.0f : mnew, alpha = expf(m - base);
    m = mnew;
    float ls = 0.0f;
    for (int i = 0; i < NS; i++) {
      const int j = c + TPR * i;
      const float p = expf(s[i] - base);
      if (EVEN || j < BK) Ps[r][j] = p;
      ls += p;
    }
    l = l * alpha + ls;
    __syncwarp(0xffffffffu); /* fwd: the row's P is written (its lanes are in this warp) */
    for (int i = 0; i < NO; i++) o[i] *= alpha;
    HPDL_ATTN_ROLLED
    for (int j = 0; j < nk; j++) {
      const float p = Ps[r][j];
      for (int i = 0; i < NO; i++) {
        const int dv = c + TPR * i;
        if (dv < Dv) o[i] += p * Vs[j][dv];
      }
    }
  }

  for (int w = TPR / 2; w > 0; w >>= 1) l += __shfl_xor_sync(0xffffffffu, l, w);
  if (r < nrows) {
    float *__restrict__ orow = out + ((long long)bh * T + t0 + r) * (Dv + 1);
    for (int i = 0; i < NO; i++) {
      const int dv = c + TPR * i;
      if (dv < Dv) orow[dv] = l > 0.0f ? o[i] / l : 0.0f;
    }
    if (c == 0) orow[Dv] = l > 0.0f ? m + logf(l) : HPDL_NEG_INF;
  }
}

/* --------------------------------------------------------------------- backward */

/* Dt[row] = do . o - dlse for the rows of block `blk` of HPDL_ATTN_DT_GRID, a warp a row
 * (out and dout rows are Dv + 1 floats). */
template <int D, int Dv, int NT = HPDL_ATTN_THREADS(D, Dv)>
static __device__ void hpdl_attn_bwd_dt(const float *__restrict__ out, const float *__restrict__ dout,
                                        float *__restrict__ Dt, int B, int H, int T, long long blk) {
  static_assert(NT % 32 == 0 && NT <= 256, "whole warps");
  const long long row = blk * (NT / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= (long long)B * H * T) return; /* whole warps: the shuffles below stay full */
  const float *__restrict__ o = out + row * (Dv + 1);
  const float *__restrict__ g = dout + row * (Dv + 1);
  float acc = 0.0f;
  for (int d = lane; d < Dv; d += 32) acc += g[d] * o[d];
  acc = hpdl_warp_sum(acc);
  if (lane == 0) Dt[row] = acc - g[Dv];
}

/* dk and dv of keys [j0, j0 + BK) of (b, hk), block `blk` of HPDL_ATTN_DKDV_GRID. Thread
 * (j, c) = (tid / TPK, tid % TPK) computes key j's P and dS for rows c, c + TPK, ... of
 * each query tile and holds its dk, dv columns c, c + TPK, ... Dt from hpdl_attn_bwd_dt. */
template <int D, int Dv, int NT = HPDL_ATTN_THREADS(D, Dv), int BQ = HPDL_ATTN_DKDV_BQ(D, Dv),
          int BK = HPDL_ATTN_DKDV_BK(D, Dv)>
static __device__ void hpdl_attn_bwd_dkdv(const float *__restrict__ q, const float *__restrict__ k,
                                          const float *__restrict__ v, const float *__restrict__ out,
                                          const float *__restrict__ dout, const float *__restrict__ Dt,
                                          float *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                          int causal, int window, int row_rank, int row_size, int col_rank, int col_size,
                                          long long blk) {
  constexpr int TPK = NT / BK, NE = (BQ + TPK - 1) / TPK, NDK = (D + TPK - 1) / TPK, NDV = (Dv + TPK - 1) / TPK;
  constexpr int P = HPDL_ATTN_HEAD_CAP(D, Dv);
  static_assert(D >= 1 && D <= HPDL_ATTN_MAX_HEAD && Dv >= 1 && Dv <= HPDL_ATTN_MAX_HEAD, "head sizes 1 .. 256");
  static_assert(NT % 32 == 0 && NT <= 256 && NT % BK == 0 && TPK <= 32 && (TPK & (TPK - 1)) == 0,
                "a key is a power-of-2 group of lanes of one warp");
  static_assert(4 * (2 * BK * (P + 1) + 2 * BQ * (P + 1) + 2 * BQ * BK + 3 * BQ) <= HPDL_ATTN_SMEM_LIMIT,
                "dkdv tiles over 48 KB of shared memory");
  __shared__ float Ks[BK][P + 1];
  __shared__ float Vs[BK][P + 1];
  __shared__ float Qs[BQ][P + 1];
  __shared__ float Gs[BQ][P + 1]; /* do */
  __shared__ float Ps[BQ][BK];
  __shared__ float Ss[BQ][BK]; /* dS */
  __shared__ float Ls[BQ];     /* lse */
  __shared__ float Ds[BQ];     /* Dt */
  __shared__ int Rp[BQ]; /* row positions (causal) */
  const int tid = threadIdx.x, j = tid / TPK, c = tid % TPK, G = H / Hk;
  const int nkt = (S + BK - 1) / BK, bhk = (int)blk / nkt, b = bhk / Hk, hk = bhk - b * Hk;
  const int j0 = ((int)blk - bhk * nkt) * BK, nk = S - j0 < BK ? S - j0 : BK;
  const float *__restrict__ kt = k + ((long long)bhk * S + j0) * D;
  const float *__restrict__ vt = v + ((long long)bhk * S + j0) * Dv;
  hpdl_attn_load<BK, D, D, NT>(Ks, kt, nk);
  hpdl_attn_load<BK, Dv, Dv, NT>(Vs, vt, nk);
  const int kp = causal ? hpdl_attn_colpos(j0 + j, S, col_rank, col_size) : 0; /* used only for j < nk */
  const int kmin = causal ? hpdl_attn_colpos_min(j0, j0 + nk, S, col_rank, col_size) : 0;
  const int kmax = causal && window > 0 ? hpdl_attn_colpos_max(j0, j0 + nk, S, col_rank, col_size) : 0;
  float dka[NDK], dva[NDV];
  for (int i = 0; i < NDK; i++) dka[i] = 0.0f;
  for (int i = 0; i < NDV; i++) dva[i] = 0.0f;

  for (int g = 0; g < G; g++) {
    const int bh = b * H + hk * G + g;
    for (int t0 = 0; t0 < T; t0 += BQ) {
      const int nrows = T - t0 < BQ ? T - t0 : BQ;
      if (causal && hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) < kmin) continue; /* uniform */
      if (causal && window > 0 && hpdl_attn_rowpos(t0, T, row_rank, row_size) - kmax >= window) continue;
      __syncthreads(); /* dkdv: the previous tile's Qs, Gs, Ls, Ds, Rp are read */
      const long long row0 = (long long)bh * T + t0;
      const float *__restrict__ qt = q + row0 * D;
      hpdl_attn_load<BQ, D, D, NT>(Qs, qt, nrows);
      hpdl_attn_load<BQ, Dv, Dv + 1, NT>(Gs, dout + row0 * (Dv + 1), nrows);
      for (int i = tid; i < BQ; i += NT) {
        const bool in = i < nrows;
        Ls[i] = in ? out[(row0 + i) * (Dv + 1) + Dv] : HPDL_NEG_INF;
        Ds[i] = in ? Dt[row0 + i] : 0.0f;
        Rp[i] = in && causal ? hpdl_attn_rowpos(t0 + i, T, row_rank, row_size) : 0;
      }
      __syncthreads(); /* dkdv: the tile is loaded */

      HPDL_ATTN_ROLLED
      for (int i = 0; i < NE; i++) {
        const int t = c + TPK * i;
        if (t >= nrows) continue;
        const float lse = Ls[t];
        float p = 0.0f, ds = 0.0f;
        /* lse = -inf: the row had no allowed key (exp(s - lse) would be inf) */
        if (j < nk && lse != HPDL_NEG_INF && (!causal || hpdl_attn_allowed(Rp[t], kp, window))) {
          float sc = 0.0f, dp = 0.0f;
          HPDL_ATTN_UNROLL4
          for (int d = 0; d < D; d++) sc += Qs[t][d] * Ks[j][d];
          HPDL_ATTN_UNROLL4
          for (int d = 0; d < Dv; d++) dp += Gs[t][d] * Vs[j][d];
          p = expf(scale * sc - lse);
          ds = p * (dp - Ds[t]);
        }
        Ps[t][j] = p;
        Ss[t][j] = ds;
      }
      __syncwarp(0xffffffffu); /* dkdv: key j's P and dS are written (its lanes are in this warp) */
      /* dv, then dk: one set of loads in flight at a time */
      HPDL_ATTN_ROLLED
      for (int t = 0; t < nrows; t++) {
        const float p = Ps[t][j];
        for (int i = 0; i < NDV; i++) {
          const int d = c + TPK * i;
          if (d < Dv) dva[i] += p * Gs[t][d];
        }
      }
      HPDL_ATTN_ROLLED
      for (int t = 0; t < nrows; t++) {
        const float ds = Ss[t][j];
        for (int i = 0; i < NDK; i++) {
          const int d = c + TPK * i;
          if (d < D) dka[i] += ds * Qs[t][d];
        }
      }
    }
  }

  if (j < nk) {
    const long long key = (long long)bhk * S + j0 + j, nq = (long long)B * H * T * D;
    float *__restrict__ dk = grads + nq + key * D;
    float *__restrict__ dv = grads + nq + (long long)B * Hk * S * D + key * Dv;
    for (int i = 0; i < NDK; i++) {
      const int d = c + TPK * i;
      if (d < D) dk[d] = scale * dka[i];
    }
    for (int i = 0; i < NDV; i++) {
      const int d = c + TPK * i;
      if (d < Dv) dv[d] = dva[i];
    }
  }
}

/* dq of query rows [t0, t0 + BQ) of (b, h), block `blk` of HPDL_ATTN_DQ_GRID. Thread
 * (r, c) = (tid / TPR, tid % TPR) computes row r's dS for keys c, c + TPR, ... of each key
 * tile and holds its dq columns c, c + TPR, ... */
template <int D, int Dv, int NT = HPDL_ATTN_THREADS(D, Dv), int BQ = HPDL_ATTN_DQ_BQ(D, Dv),
          int BK = HPDL_ATTN_DQ_BK(D, Dv)>
static __device__ void hpdl_attn_bwd_dq(const float *__restrict__ q, const float *__restrict__ k,
                                        const float *__restrict__ v, const float *__restrict__ out,
                                        const float *__restrict__ dout, const float *__restrict__ Dt,
                                        float *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                        int causal, int window, int row_rank, int row_size, int col_rank, int col_size,
                                        long long blk) {
  constexpr int TPR = NT / BQ, NS = (BK + TPR - 1) / TPR, NQ = (D + TPR - 1) / TPR, P = HPDL_ATTN_HEAD_CAP(D, Dv);
  static_assert(D >= 1 && D <= HPDL_ATTN_MAX_HEAD && Dv >= 1 && Dv <= HPDL_ATTN_MAX_HEAD, "head sizes 1 .. 256");
  static_assert(NT % 32 == 0 && NT <= 256 && NT % BQ == 0 && TPR <= 32 && (TPR & (TPR - 1)) == 0,
                "a row is a power-of-2 group of lanes of one warp");
  static_assert(4 * (2 * BQ * (P + 1) + 2 * BK * (P + 1) + BQ * BK + 3 * BQ + BK) <= HPDL_ATTN_SMEM_LIMIT,
                "dq tiles over 48 KB of shared memory");
  __shared__ float Qs[BQ][P + 1];
  __shared__ float Gs[BQ][P + 1]; /* do */
  __shared__ float Ks[BK][P + 1];
  __shared__ float Vs[BK][P + 1];
  __shared__ float Ss[BQ][BK]; /* dS */
  __shared__ float Ls[BQ], Ds[BQ]; /* lse, Dt: in shared memory, not in registers, for ptxas */
  __shared__ int Rp[BQ];           /* row positions (causal) */
  __shared__ int Cp[BK];           /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, r = tid / TPR, c = tid % TPR;
  const int nq = (T + BQ - 1) / BQ, bh = (int)blk / nq;
  const int t0 = ((int)blk - bh * nq) * BQ, nrows = T - t0 < BQ ? T - t0 : BQ;
  const int bhk = bh / H * Hk + (bh % H) / (H / Hk);
  const float *__restrict__ qt = q + ((long long)bh * T + t0) * D;
  const float *__restrict__ kh = k + (long long)bhk * S * D;
  const float *__restrict__ vh = v + (long long)bhk * S * Dv;
  hpdl_attn_load<BQ, D, D, NT>(Qs, qt, nrows);
  hpdl_attn_load<BQ, Dv, Dv + 1, NT>(Gs, dout + ((long long)bh * T + t0) * (Dv + 1), nrows);
  for (int i = tid; i < BQ; i += NT) {
    const long long row = (long long)bh * T + t0 + i;
    Ls[i] = i < nrows ? out[row * (Dv + 1) + Dv] : HPDL_NEG_INF;
    Ds[i] = i < nrows ? Dt[row] : 0.0f;
    Rp[i] = i < nrows && causal ? hpdl_attn_rowpos(t0 + i, T, row_rank, row_size) : 0;
  }
  const bool in = r < nrows;
  const int rmax = causal ? hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) : 0;
  const int rmin = causal && nrows > 0 ? hpdl_attn_rowpos(t0, T, row_rank, row_size) : 0;
  float acc[NQ];
  for (int i = 0; i < NQ; i++) acc[i] = 0.0f;

  for (int j0 = 0; j0 < S; j0 += BK) {
    const int nk = S - j0 < BK ? S - j0 : BK;
    if (causal && window > 0 && rmin - hpdl_attn_colpos_max(j0, j0 + nk, S, col_rank, col_size) >= window)
      continue; /* dq: the tile is behind the window */
    if (causal && hpdl_attn_colpos_min(j0, j0 + nk, S, col_rank, col_size) > rmax) continue; /* uniform */
    __syncthreads(); /* dq: the previous tile's Ks, Vs, Cp are read */
    hpdl_attn_load<BK, D, D, NT>(Ks, kh + (long long)j0 * D, nk);
    hpdl_attn_load<BK, Dv, Dv, NT>(Vs, vh + (long long)j0 * Dv, nk);
    if (causal)
      for (int j = tid; j < BK; j += NT) Cp[j] = j < nk ? hpdl_attn_colpos(j0 + j, S, col_rank, col_size) : 0;
    __syncthreads(); /* dq: the tile is loaded */

    HPDL_ATTN_ROLLED
    for (int i = 0; i < NS; i++) {
      const int j = c + TPR * i;
      if (!in || j >= nk) continue;
      float ds = 0.0f;
      const float lse = Ls[r];
      if (lse != HPDL_NEG_INF && (!causal || hpdl_attn_allowed(Rp[r], Cp[j], window))) {
        float sc = 0.0f, dp = 0.0f;
        HPDL_ATTN_UNROLL4
        for (int d = 0; d < D; d++) sc += Qs[r][d] * Ks[j][d];
        HPDL_ATTN_UNROLL4
        for (int d = 0; d < Dv; d++) dp += Gs[r][d] * Vs[j][d];
        ds = expf(scale * sc - lse) * (dp - Ds[r]);
      }
      Ss[r][j] = ds;
    }
    __syncwarp(0xffffffffu); /* dq: the row's dS is written (its lanes are in this warp) */
    if (in) {
      HPDL_ATTN_ROLLED
      for (int j = 0; j < nk; j++) {
        const float ds = Ss[r][j];
        for (int i = 0; i < NQ; i++) {
          const int d = c + TPR * i;
          if (d < D) acc[i] += ds * Ks[j][d];
        }
      }
    }
  }

  if (in) {
    float *__restrict__ dq = grads + ((long long)bh * T + t0 + r) * D;
    for (int i = 0; i < NQ; i++) {
      const int d = c + TPR * i;
      if (d < D) dq[d] = scale * acc[i];
    }
  }
}

#endif /* HPDL_ATTENTION_CUH */
