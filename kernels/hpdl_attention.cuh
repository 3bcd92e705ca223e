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
 * this rank's zigzag chunks and the key's in the ring order (hpdl_cuda.cuh) over Sc keys:
 * Sc = S where the keys are all the ring's blocks, S x col_size where they are one block,
 * col_rank its owner's (ring attention a block at a time, hpdl_attn_colpos). The forward
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
 *                        col_rank, col_size, Sc, blk)
 *       a block per (b, h, tile of BQ query rows): key tiles of BK keys in shared memory one
 *       after another, the online softmax (running max and sum a row), o and lse written
 *       once at the end;
 *   hpdl_attn_bwd_dt<D, Dv[, NT, F]>(out, dout, Dt, B, H, T, blk)
 *       Dt a row into the caller's scratch [B * H * T] floats (a warp a row);
 *   hpdl_attn_bwd_dkdv<D, Dv>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal,
 *                             window, row_rank, row_size, col_rank, col_size, Sc, blk)
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
 * These SIMT kernels are plain fp32, about one shared-memory load per multiply-add: the
 * heads and GPUs the tensor-core kernels below (TF32; bf16 / fp16 under 16-bit
 * activations) do not take. Not yet: register-blocked 2-D thread tiles, vector (float4) or
 * asynchronous (cp.async) tile loads.
 *
 * Compiles under NVRTC (the folder on --include-path), nvcc and the emulation
 * (kernels/cuda_emu.h), like hpdl_cuda.cuh, which it includes for the positions. */
#ifndef HPDL_ATTENTION_CUH
#define HPDL_ATTENTION_CUH

#include "hpdl_attention_cfg.h"
#include "hpdl_cuda.cuh"

#define HPDL_ATTN_SMEM_LIMIT 49152 /* bytes of static shared memory a kernel may have */

/* The loops over a tile's rows or keys, and over a thread's P / dS elements, stay rolled
 * on the GPU (HPDL_ROLLED, hpdl_cuda.cuh) and the dot products unroll by 4 only
 * (HPDL_UNROLL4): fully unrolled, the loads they put in flight need registers that ptxas,
 * which under __launch_bounds__(256) aims at the occupancy the shared memory allows (40 to
 * 80 registers here), then spills. */

/* Positions (core/attn.c's row_pos and ring), in int: positions are below 2^31 (T and S
 * are ints, a global position below S). The key's is hpdl_ring_col_pos's formula in 32
 * bits: its long long divisions by a variable become a called subroutine in SASS, whose
 * stack frame shows as spills (tests/cuda/attention_emu.cpp checks both agree). */
static __device__ __forceinline__ int hpdl_attn_rowpos(int t, int T, int rank, int size) {
  return size <= 1 ? t : (int)hpdl_zigzag_pos(rank, size, T, t);
}

/* S is the span the positions refer to, Sc in the kernels: the keys' count S where they are
 * the ring's blocks; where the keys are one block (cp_comm = ring: the block received at ring
 * step s), S x size, with rank = the block's owner (rank - s) mod size - its first block. */
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

/* Whether no pair of the key tile [j0, j0 + nk) (positions over a span of Sc keys, as
 * hpdl_attn_colpos takes them) with rows whose positions lie in [rmin, rmax] is allowed:
 * under the causal mask, every key after the last row, or (with a window) a window or more
 * behind the first. The same in every thread that passes the same bounds,
 * so the barriers after it stay uniform. */
static __device__ __forceinline__ bool hpdl_attn_keys_skipped(int j0, int nk, int Sc, int causal, int window, int rmin,
                                                              int rmax, int col_rank, int col_size) {
  if (!causal) return false;
  if (window > 0 && rmin - hpdl_attn_colpos_max(j0, j0 + nk, Sc, col_rank, col_size) >= window) return true;
  return hpdl_attn_colpos_min(j0, j0 + nk, Sc, col_rank, col_size) > rmax;
}

/* The key tile [j0, j0 + nk) of (b, hk) into shared memory: k's rows, v's (zeros past S:
 * 0 * v stays 0) and, under the causal mask, the keys' positions. */
template <int BK, int D, int Dv, int NT, int LDK, int LDV>
static __device__ __forceinline__ void hpdl_attn_load_keys(float (*Ks)[LDK], float (*Vs)[LDV], int *Cp,
                                                           const float *__restrict__ kh, const float *__restrict__ vh,
                                                           int j0, int nk, int Sc, int causal, int col_rank, int col_size) {
  hpdl_attn_load<BK, D, D, NT>(Ks, kh + (long long)j0 * D, nk);
  hpdl_attn_load<BK, Dv, Dv, NT>(Vs, vh + (long long)j0 * Dv, nk);
  if (causal)
    for (int j = threadIdx.x; j < BK; j += NT) Cp[j] = j < nk ? hpdl_attn_colpos(j0 + j, Sc, col_rank, col_size) : 0;
}

/* dkdv's per-row values of a query tile: lse (from the packed output), Dt and, under the
 * causal mask, the rows' positions; -inf, 0, 0 at and past nrows. */
static __device__ __forceinline__ void hpdl_attn_load_rows(float *Ls, float *Ds, int *Rp, const float *__restrict__ out,
                                                           const float *__restrict__ Dt, long long row0, int t0, int nrows,
                                                           int BQ, int NT, int Dv, int T, int causal, int row_rank,
                                                           int row_size) {
  for (int i = threadIdx.x; i < BQ; i += NT) {
    const bool in = i < nrows;
    Ls[i] = in ? out[(row0 + i) * (Dv + 1) + Dv] : HPDL_NEG_INF;
    Ds[i] = in ? Dt[row0 + i] : 0.0f;
    Rp[i] = in && causal ? hpdl_attn_rowpos(t0 + i, T, row_rank, row_size) : 0;
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
                                     int col_rank, int col_size, int Sc, long long blk) {
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
    if (hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, rmin, rmax, col_rank, col_size)) continue; /* uniform */
    __syncthreads(); /* fwd: the previous tile's Ks, Vs, Ps are read */
    hpdl_attn_load_keys<BK, D, Dv, NT>(Ks, Vs, Cp, kh, vh, j0, nk, Sc, causal, col_rank, col_size);
    __syncthreads(); /* fwd: the tile is loaded */

    float s[NS];
    for (int i = 0; i < NS; i++) s[i] = 0.0f;
    HPDL_UNROLL4
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
    HPDL_ROLLED
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

/* The backward kernels' layout flags (template F; fuse.c's fuse_attn_dout and
 * fuse_attn_grad16 choose them, for the 16-bit kernels). */
#define HPDL_ATTN_DOUT_BTHD 1  /* dO as the projection made it, [B, T, H, Dv], its dlse zero */
#define HPDL_ATTN_GRADS_BTHD 2 /* dq, dk, dv apart, as the projections read them */
#define HPDL_ATTN_QKV_BTHD 4   /* q, k, v as the projections made them, [B, T, H, D] (fuse_attn_qkv) */

/* Dt[row] = do . o - dlse for the rows of block `blk` of HPDL_ATTN_DT_GRID, a warp a row
 * (out and dout rows are Dv + 1 floats; F & HPDL_ATTN_DOUT_BTHD: dout as [B, T, H, Dv],
 * its dlse zero). */
template <int D, int Dv, int NT = HPDL_ATTN_THREADS(D, Dv), int F = 0>
static __device__ void hpdl_attn_bwd_dt(const float *__restrict__ out, const float *__restrict__ dout,
                                        float *__restrict__ Dt, int B, int H, int T, long long blk) {
  static_assert(NT % 32 == 0 && NT <= 256, "whole warps");
  constexpr bool dout_bthd = (F & HPDL_ATTN_DOUT_BTHD) != 0;
  const long long row = blk * (NT / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= (long long)B * H * T) return; /* whole warps: the shuffles below stay full */
  const float *__restrict__ o = out + row * (Dv + 1);
  const long long bh = row / T, t = row - bh * T;
  const float *__restrict__ g = dout_bthd ? dout + ((bh / H * T + t) * H + bh % H) * Dv : dout + row * (Dv + 1);
  float acc = 0.0f;
  for (int d = lane; d < Dv; d += 32) acc += g[d] * o[d];
  acc = hpdl_warp_sum(acc);
  if (lane == 0) Dt[row] = dout_bthd ? acc : acc - g[Dv];
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
                                          int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc,
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
  const int kp = causal ? hpdl_attn_colpos(j0 + j, Sc, col_rank, col_size) : 0; /* used only for j < nk */
  const int kmin = causal ? hpdl_attn_colpos_min(j0, j0 + nk, Sc, col_rank, col_size) : 0;
  const int kmax = causal && window > 0 ? hpdl_attn_colpos_max(j0, j0 + nk, Sc, col_rank, col_size) : 0;
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
      hpdl_attn_load_rows(Ls, Ds, Rp, out, Dt, row0, t0, nrows, BQ, NT, Dv, T, causal, row_rank, row_size);
      __syncthreads(); /* dkdv: the tile is loaded */

      HPDL_ROLLED
      for (int i = 0; i < NE; i++) {
        const int t = c + TPK * i;
        if (t >= nrows) continue;
        const float lse = Ls[t];
        float p = 0.0f, ds = 0.0f;
        /* lse = -inf: the row had no allowed key (exp(s - lse) would be inf) */
        if (j < nk && lse != HPDL_NEG_INF && (!causal || hpdl_attn_allowed(Rp[t], kp, window))) {
          float sc = 0.0f, dp = 0.0f;
          HPDL_UNROLL4
          for (int d = 0; d < D; d++) sc += Qs[t][d] * Ks[j][d];
          HPDL_UNROLL4
          for (int d = 0; d < Dv; d++) dp += Gs[t][d] * Vs[j][d];
          p = expf(scale * sc - lse);
          ds = p * (dp - Ds[t]);
        }
        Ps[t][j] = p;
        Ss[t][j] = ds;
      }
      __syncwarp(0xffffffffu); /* dkdv: key j's P and dS are written (its lanes are in this warp) */
      /* dv, then dk: one set of loads in flight at a time */
      HPDL_ROLLED
      for (int t = 0; t < nrows; t++) {
        const float p = Ps[t][j];
        for (int i = 0; i < NDV; i++) {
          const int d = c + TPK * i;
          if (d < Dv) dva[i] += p * Gs[t][d];
        }
      }
      HPDL_ROLLED
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
                                        int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc,
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
    if (hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, rmin, rmax, col_rank, col_size)) continue; /* uniform */
    __syncthreads(); /* dq: the previous tile's Ks, Vs, Cp are read */
    hpdl_attn_load_keys<BK, D, Dv, NT>(Ks, Vs, Cp, kh, vh, j0, nk, Sc, causal, col_rank, col_size);
    __syncthreads(); /* dq: the tile is loaded */

    HPDL_ROLLED
    for (int i = 0; i < NS; i++) {
      const int j = c + TPR * i;
      if (!in || j >= nk) continue;
      float ds = 0.0f;
      const float lse = Ls[r];
      if (lse != HPDL_NEG_INF && (!causal || hpdl_attn_allowed(Rp[r], Cp[j], window))) {
        float sc = 0.0f, dp = 0.0f;
        HPDL_UNROLL4
        for (int d = 0; d < D; d++) sc += Qs[r][d] * Ks[j][d];
        HPDL_UNROLL4
        for (int d = 0; d < Dv; d++) dp += Gs[r][d] * Vs[j][d];
        ds = expf(scale * sc - lse) * (dp - Ds[r]);
      }
      Ss[r][j] = ds;
    }
    __syncwarp(0xffffffffu); /* dq: the row's dS is written (its lanes are in this warp) */
    if (in) {
      HPDL_ROLLED
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

/* ------------------------------------------------------ tensor cores (TF32 mma) */

/* The same three products on the tensor cores, for head sizes D, Dv in 16 .. 64, multiples
 * of 8 (HPDL_ATTN_TC), on sm_80 and later: mma.sync m16n8k8 with TF32 inputs and fp32
 * accumulators. With `split` (the default: fp32 GEMMs) each product is three of them,
 * 3xTF32: x = hi + lo with both parts TF32, and a b = a.lo b.hi + a.hi b.lo + a.hi b.hi
 * (the lo lo term is below fp32's rounding), which keeps fp32's accuracy; without it
 * (HPDL_GEMM_TF32=1, hpdl_kctx's HPDL_KCTX_TF32) one, at TF32's 10-bit mantissa.
 *
 * A warp owns 16 query rows (the forward, dq) or 16 keys (dkdv): its scores are mma
 * accumulators in registers, in the C fragment layout below, and the second product of
 * each kernel (P v, dS k, P^T do, dS^T q) takes them as its A fragment without a trip
 * through shared memory. That works because a product may run over its k index in any
 * order: in k step j the A fragment's column t stands for key (row) 8 j + 2 t and column
 * t + 4 for 8 j + 2 t + 1, exactly the two a lane holds as accumulators, and the B
 * fragment reads the same rows. A block is 4 warps: 64 query rows (the forward, with key
 * tiles of 32; dq, with key tiles of 16) or 64 keys (dkdv, with query tiles of 16), all
 * in shared memory: the fragments are loaded where they are used, so that registers hold
 * little beyond the accumulators (loop-invariant fragments kept in registers, split in
 * two, took every register and spilled). Tiles in shared memory have rows of D + 4
 * floats, so that the fragment loads (eight rows at one column, or two at eight) hit 32
 * different banks.
 *
 * Deterministic like the SIMT kernels: an mma's sum is the same every run, and every
 * other sum has a fixed order. */

#ifdef __CUDACC__
/* x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero) */
static __device__ __forceinline__ unsigned hpdl_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

/* c += A B for one warp (PTX ISA, mma.m16n8k8 .tf32): A 16 x 8 row-major, B 8 x 8 by
 * columns, C 16 x 8 fp32. Lane (g, t) = (lane / 4, lane % 4) holds
 *   a = A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]     b = B[t][g], B[t + 4][g]
 *   c = C[g][2t], C[g][2t + 1], C[g + 8][2t], C[g + 8][2t + 1] */
static __device__ __forceinline__ void hpdl_mma_tf32(float *c, const unsigned *a, const unsigned *b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
/* The emulation (kernels/cuda_emu.h): cvt.rna on the bits, and the mma as a warp
 * exchange: every lane leaves its fragments in the warp's stage, meets the others at a
 * __syncwarp, computes its four sums from the whole A and B (TF32 products are exact in
 * fp32; the sum in k order), and meets them again before the stage is reused. A block
 * runs on one OS thread, so a thread_local stage per warp is the block's own. */
static inline unsigned hpdl_tf32(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u; /* finite: half an ulp of TF32, on the magnitude */
  return u & 0xffffe000u;
}

/* A lane's fragments of one mma (A's four registers, B's two). */
struct HpdlMmaLane {
  unsigned a[4], b[2];
};

/* Every lane of the warp leaves its fragments in the warp's stage and meets the others at a
 * __syncwarp; returns the stage (32 lanes), which the caller reads and then releases with a
 * second __syncwarp before the next exchange. */
static inline const HpdlMmaLane *hpdl_mma_exchange(const unsigned *a, const unsigned *b) {
  static thread_local HpdlMmaLane stage[32][32];
  const unsigned lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 31;
  for (int i = 0; i < 4; i++) stage[warp][lane].a[i] = a[i];
  for (int i = 0; i < 2; i++) stage[warp][lane].b[i] = b[i];
  __syncwarp(0xffffffffu);
  return stage[warp];
}

static inline void hpdl_mma_tf32(float *c, const unsigned *a, const unsigned *b) {
  const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const HpdlMmaLane *stage = hpdl_mma_exchange(a, b);
  float A[16][8], Bm[8][8];
  for (unsigned l = 0; l < 32; l++) {
    const unsigned lg = l >> 2, lt = l & 3;
    const HpdlMmaLane &x = stage[l];
    A[lg][lt] = __uint_as_float(x.a[0]);
    A[lg + 8][lt] = __uint_as_float(x.a[1]);
    A[lg][lt + 4] = __uint_as_float(x.a[2]);
    A[lg + 8][lt + 4] = __uint_as_float(x.a[3]);
    Bm[lt][lg] = __uint_as_float(x.b[0]);
    Bm[lt + 4][lg] = __uint_as_float(x.b[1]);
  }
  __syncwarp(0xffffffffu);
  for (int i = 0; i < 4; i++) {
    const unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float sum = c[i];
    for (int kk = 0; kk < 8; kk++) sum += A[row][kk] * Bm[kk][col];
    c[i] = sum;
  }
}
#endif

/* c += a b, a and b fp32 fragments (a[4], b[2] as hpdl_mma_tf32 lays them out): three
 * TF32 mmas with `split` (small terms first), else one. Uniform in the warp. */
static __device__ __forceinline__ void hpdl_attn_mma(float *c, const float *a, const float *b, bool split) {
  unsigned ah[4], bh[2];
  for (int i = 0; i < 4; i++) ah[i] = hpdl_tf32(a[i]);
  for (int i = 0; i < 2; i++) bh[i] = hpdl_tf32(b[i]);
  if (split) {
    unsigned al[4], bl[2];
    for (int i = 0; i < 4; i++) al[i] = hpdl_tf32(a[i] - __uint_as_float(ah[i]));
    for (int i = 0; i < 2; i++) bl[i] = hpdl_tf32(b[i] - __uint_as_float(bh[i]));
    hpdl_mma_tf32(c, al, bh);
    hpdl_mma_tf32(c, ah, bl);
  }
  hpdl_mma_tf32(c, ah, bh);
}

/* acc[n] += A X^T over K columns, for n < N / 8: A the warp's 16 rows of a shared tile,
 * X's rows 8 n + g of another (both LD* floats a row). The k steps stay rolled: the
 * fragments are loaded (and split) where they are used, so registers hold accumulators. */
template <int N, int K, int LDA, int LDX>
static __device__ __forceinline__ void hpdl_attn_mma_nt(float (*acc)[4], const float (*A)[LDA], const float (*X)[LDX],
                                                        int g, int t, bool split) {
  HPDL_ROLLED
  for (int kk = 0; kk < K / 8; kk++) {
    const float a[4] = {A[g][8 * kk + t], A[g + 8][8 * kk + t], A[g][8 * kk + t + 4], A[g + 8][8 * kk + t + 4]};
    for (int n = 0; n < N / 8; n++) {
      const float b[2] = {X[8 * n + g][8 * kk + t], X[8 * n + g][8 * kk + t + 4]};
      hpdl_attn_mma(acc[n], a, b, split);
    }
  }
}

/* acc[n] += P X over K rows of X, for n < N / 8: P the warp's accumulators p[K / 8] (C
 * layout, taken as the A fragment in the k order above), X a shared tile's rows 0 .. K - 1. */
template <int N, int K, int LD>
static __device__ __forceinline__ void hpdl_attn_mma_pn(float (*acc)[4], const float (*p)[4], const float (*X)[LD],
                                                        int g, int t, bool split) {
  for (int js = 0; js < K / 8; js++) {
    const float a[4] = {p[js][0], p[js][2], p[js][1], p[js][3]};
    for (int n = 0; n < N / 8; n++) {
      const float b[2] = {X[8 * js + 2 * t][8 * n + g], X[8 * js + 2 * t + 1][8 * n + g]};
      hpdl_attn_mma(acc[n], a, b, split);
    }
  }
}

/* A warp's accumulators (N / 8 fragments of C) to zero. */
template <int N>
static __device__ __forceinline__ void hpdl_attn_zero(float (*acc)[4]) {
  for (int n = 0; n < N / 8; n++)
    for (int i = 0; i < 4; i++) acc[n][i] = 0.0f;
}

/* Whether no pair of the query tile [t0, t0 + nrows) with keys whose positions lie in
 * [kmin, kmax] is allowed (kmax read only with a window): under the causal mask, every
 * row before the first key, or (with a window) a window or more after the last. The same
 * in every thread that passes the same bounds. */
static __device__ __forceinline__ bool hpdl_attn_rows_skipped(int t0, int nrows, int T, int causal, int window, int kmin,
                                                              int kmax, int row_rank, int row_size) {
  if (!causal) return false;
  if (hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) < kmin) return true;
  return window > 0 && hpdl_attn_rowpos(t0, T, row_rank, row_size) - kmax >= window;
}

/* ---- what the tensor-core kernels share (the TF32 ones and the 16-bit ones below) ---- */

/* A block's HPDL_ATTN_TC_ROWS query rows of (b, h) (the forward, dq), its warp's 16 and
 * this lane's two, r0 and r1; under the causal mask their positions and the bounds the
 * tile skips test. */
struct HpdlAttnTcRows {
  int bh, bhk, t0, nrows, w0, wn, r0, r1;
  int rp[2];                  /* rows r0, r1's positions (causal; 0 past T) */
  int rmin, rmax, wmin, wmax; /* the block's and the warp's first and last positions (causal) */
};

static __device__ __forceinline__ HpdlAttnTcRows hpdl_attn_tc_rows(long long blk, int H, int Hk, int T, int causal,
                                                                   int row_rank, int row_size, int warp, int g) {
  constexpr int BQ = HPDL_ATTN_TC_ROWS;
  HpdlAttnTcRows R;
  const int nq = (T + BQ - 1) / BQ;
  R.bh = (int)blk / nq;
  R.t0 = ((int)blk - R.bh * nq) * BQ;
  R.nrows = T - R.t0 < BQ ? T - R.t0 : BQ;
  R.bhk = R.bh / H * Hk + (R.bh % H) / (H / Hk);
  R.w0 = R.t0 + 16 * warp;
  R.wn = T - R.w0 < 0 ? 0 : T - R.w0 < 16 ? T - R.w0 : 16;
  R.r0 = R.w0 + g;
  R.r1 = R.r0 + 8;
  R.rp[0] = causal && R.r0 < T ? hpdl_attn_rowpos(R.r0, T, row_rank, row_size) : 0;
  R.rp[1] = causal && R.r1 < T ? hpdl_attn_rowpos(R.r1, T, row_rank, row_size) : 0;
  R.rmax = causal ? hpdl_attn_rowpos_max(R.t0, R.t0 + R.nrows, T, row_rank, row_size) : 0;
  R.rmin = causal && R.nrows > 0 ? hpdl_attn_rowpos(R.t0, T, row_rank, row_size) : 0;
  R.wmax = causal ? hpdl_attn_rowpos_max(R.w0, R.w0 + R.wn, T, row_rank, row_size) : 0;
  R.wmin = causal && R.wn > 0 ? hpdl_attn_rowpos(R.w0, T, row_rank, row_size) : 0;
  return R;
}

/* The forward's step over a key tile of nk keys: the scores s (C layout: rows r0, r1,
 * keys 8 n + 2 t and + 1) masked and scaled, each row's max m and this lane's sum l
 * brought up to date (o rescaled with them), s turned into exp(s - max). */
template <int BK, int Dv>
static __device__ __forceinline__ void hpdl_attn_tc_softmax(float (*s)[4], float (*o)[4], float *m, float *l,
                                                            const HpdlAttnTcRows &R, int t, int T, int nk, int causal,
                                                            const int *Cp, int window, float scale) {
  float mt[2] = {HPDL_NEG_INF, HPDL_NEG_INF};
  for (int n = 0; n < BK / 8; n++)
    for (int i = 0; i < 4; i++) {
      const int j = 8 * n + 2 * t + (i & 1), row = i < 2 ? R.r0 : R.r1;
      const bool ok = row < T && j < nk && (!causal || hpdl_attn_allowed(R.rp[i >> 1], Cp[j], window));
      s[n][i] = ok ? scale * s[n][i] : HPDL_NEG_INF;
      mt[i >> 1] = fmaxf(mt[i >> 1], s[n][i]);
    }
  float base[2], alpha[2];
  for (int h = 0; h < 2; h++) {
    mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1)); /* a row's four lanes */
    mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
    const float mnew = fmaxf(m[h], mt[h]); /* as the SIMT forward: no NaN while a row has no key */
    base[h] = mnew == HPDL_NEG_INF ? 0.0f : mnew;
    alpha[h] = expf(m[h] - base[h]);
    m[h] = mnew;
    l[h] *= alpha[h];
  }
  for (int n = 0; n < BK / 8; n++)
    for (int i = 0; i < 4; i++) {
      s[n][i] = expf(s[n][i] - base[i >> 1]);
      l[i >> 1] += s[n][i];
    }
  for (int n = 0; n < Dv / 8; n++)
    for (int i = 0; i < 4; i++) o[n][i] *= alpha[i >> 1];
}

/* The forward's rows r0, r1 of out: o / l and lse = m + log l (the row's four lanes' sums
 * added first). With o16 (the 16-bit kernels, E = 0 bf16 or 1 fp16) o also goes there
 * rounded, as the projection reads it: [B, T, H, Dv], row t of head h of sequence b at
 * ((b T + t) H + h) Dv (fuse_attn_out16: the slice, transpose and cast this saves). */
template <int Dv, int E = 0>
static __device__ __forceinline__ void hpdl_attn_tc_store_out(float *__restrict__ out, const float (*o)[4],
                                                              const float *m, float *l, const HpdlAttnTcRows &R, int t,
                                                              int T, unsigned short *__restrict__ o16 = nullptr,
                                                              int H = 1) {
  HPDL_UNROLL_ALL /* o's index 2 h + e constant: o stays in registers (at Dv = 128 the loop stayed rolled, o on the stack) */
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = h ? R.r1 : R.r0;
    if (row >= T) continue;
    /* out may be null where only o16 is read (a forward that keeps nothing for its
     * backward: full recomputation) */
    float *__restrict__ orow = out ? out + ((long long)R.bh * T + row) * (Dv + 1) : nullptr;
    unsigned short *__restrict__ hrow =
        o16 ? o16 + (((long long)(R.bh / H) * T + row) * H + R.bh % H) * Dv : nullptr;
    for (int n = 0; n < Dv / 8; n++)
      for (int e = 0; e < 2; e++) {
        const float v = l[h] > 0.0f ? o[n][2 * h + e] / l[h] : 0.0f;
        if (orow) orow[8 * n + 2 * t + e] = v;
        if (hrow) hrow[8 * n + 2 * t + e] = E == 0 ? hpdl_bf16_from_f32(v) : hpdl_f16_from_f32(v);
      }
    if (t == 0 && orow) orow[Dv] = l[h] > 0.0f ? m[h] + logf(l[h]) : HPDL_NEG_INF;
  }
}

/* A block's HPDL_ATTN_TC_KEYS keys of (b, hk) (dkdv), its warp's 16 and this lane's two,
 * kr0 and kr1; under the causal mask their positions and the bounds the tile skips test. */
struct HpdlAttnTcKeys {
  int bhk, b, hk, j0, nk, k0, wn, kr0, kr1;
  int kp[2];                    /* keys kr0, kr1's positions (causal; 0 past S) */
  int kmin, kmax, wkmin, wkmax; /* the block's and the warp's first and last positions (causal) */
};

static __device__ __forceinline__ HpdlAttnTcKeys hpdl_attn_tc_keys(long long blk, int Hk, int S, int causal, int window,
                                                                   int col_rank, int col_size, int Sc, int warp, int g) {
  constexpr int BK = HPDL_ATTN_TC_KEYS;
  HpdlAttnTcKeys K;
  const int nkt = (S + BK - 1) / BK;
  K.bhk = (int)blk / nkt;
  K.b = K.bhk / Hk;
  K.hk = K.bhk - K.b * Hk;
  K.j0 = ((int)blk - K.bhk * nkt) * BK;
  K.nk = S - K.j0 < BK ? S - K.j0 : BK;
  K.k0 = K.j0 + 16 * warp;
  K.wn = S - K.k0 < 0 ? 0 : S - K.k0 < 16 ? S - K.k0 : 16;
  K.kr0 = K.k0 + g;
  K.kr1 = K.kr0 + 8;
  K.kp[0] = causal && K.kr0 < S ? hpdl_attn_colpos(K.kr0, Sc, col_rank, col_size) : 0;
  K.kp[1] = causal && K.kr1 < S ? hpdl_attn_colpos(K.kr1, Sc, col_rank, col_size) : 0;
  K.kmin = causal ? hpdl_attn_colpos_min(K.j0, K.j0 + K.nk, Sc, col_rank, col_size) : 0;
  K.kmax = causal && window > 0 ? hpdl_attn_colpos_max(K.j0, K.j0 + K.nk, Sc, col_rank, col_size) : 0;
  K.wkmin = causal ? hpdl_attn_colpos_min(K.k0, K.k0 + K.wn, Sc, col_rank, col_size) : 0;
  K.wkmax = causal && window > 0 ? hpdl_attn_colpos_max(K.k0, K.k0 + K.wn, Sc, col_rank, col_size) : 0;
  return K;
}

/* dkdv's P^T and dS^T of a query tile (C layout: keys kr0, kr1 by rows 8 n + 2 t and + 1),
 * from k q^T in p and v do^T in ds: P = exp(scale k.q - lse), dS = P (v.do - Dt). */
template <int BQ>
static __device__ __forceinline__ void hpdl_attn_tc_pds(float (*p)[4], float (*ds)[4], const float *Ls, const float *Ds,
                                                        const int *Rp, const HpdlAttnTcKeys &K, int t, int S, int causal,
                                                        int window, float scale) {
  for (int n = 0; n < BQ / 8; n++)
    for (int i = 0; i < 4; i++) {
      const int r = 8 * n + 2 * t + (i & 1), key = i < 2 ? K.kr0 : K.kr1;
      const float lse = Ls[r]; /* -inf: no allowed key in the row (and rows past T) */
      const bool ok = key < S && lse != HPDL_NEG_INF && (!causal || hpdl_attn_allowed(Rp[r], K.kp[i >> 1], window));
      const float pr = ok ? expf(scale * p[n][i] - lse) : 0.0f;
      ds[n][i] = pr * (ds[n][i] - Ds[r]);
      p[n][i] = pr;
    }
}

/* A gradient into grads' type: fp32 as it is, or 16-bit (E: 0 bf16, 1 fp16) rounded to
 * nearest even, the IR's cast after the attention's gradient, which the code generator
 * takes into the kernel (precision.c, fuse.c's store16) when q, k and v are 16-bit. */
template <int E>
static __device__ __forceinline__ void hpdl_attn_put(float *p, float v) {
  *p = v;
}
template <int E>
static __device__ __forceinline__ void hpdl_attn_put(unsigned short *p, float v) {
  *p = E == 0 ? hpdl_bf16_from_f32(v) : hpdl_f16_from_f32(v);
}

/* dkdv's keys kr0, kr1 of dk (scaled) and dv into grads' [dq, dk, dv]; or, with A (the
 * 16-bit kernels: fuse_attn_grad16), into gk and gv as the projections read them, [B, S,
 * Hk, D] and [B, S, Hk, Dv]. */
template <int D, int Dv, int E = 0, int A = 0, typename TG>
static __device__ __forceinline__ void hpdl_attn_tc_store_dkdv(TG *__restrict__ grads, const float (*dk)[4],
                                                               const float (*dv)[4], const HpdlAttnTcKeys &K, int t, int B,
                                                               int H, int Hk, int T, int S, float scale,
                                                               TG *__restrict__ gk = nullptr, TG *__restrict__ gv = nullptr) {
  const long long nq = (long long)B * H * T * D;
  HPDL_UNROLL_ALL /* dk's and dv's index 2 h + e constant: they stay in registers */
  for (int h = 0; h < 2; h++) {
    const int key = h ? K.kr1 : K.kr0;
    if (key >= S) continue;
    const long long bthd = ((long long)K.b * S + key) * Hk + K.hk; /* (b, key, hk) */
    TG *__restrict__ dkr = A ? gk + bthd * D : grads + nq + ((long long)K.bhk * S + key) * D;
    TG *__restrict__ dvr = A ? gv + bthd * Dv : grads + nq + (long long)B * Hk * S * D + ((long long)K.bhk * S + key) * Dv;
    for (int n = 0; n < D / 8; n++)
      for (int e = 0; e < 2; e++) hpdl_attn_put<E>(&dkr[8 * n + 2 * t + e], scale * dk[n][2 * h + e]);
    for (int n = 0; n < Dv / 8; n++)
      for (int e = 0; e < 2; e++) hpdl_attn_put<E>(&dvr[8 * n + 2 * t + e], dv[n][2 * h + e]);
  }
}

/* dq's rows r0, r1: their lse (from the packed output) and Dt. */
template <int Dv>
static __device__ __forceinline__ void hpdl_attn_tc_dq_rows(float *lse, float *dt, const float *__restrict__ out,
                                                            const float *__restrict__ Dt, const HpdlAttnTcRows &R, int T) {
  for (int h = 0; h < 2; h++) {
    const int row = h ? R.r1 : R.r0;
    const long long at = (long long)R.bh * T + row;
    lse[h] = row < T ? out[at * (Dv + 1) + Dv] : HPDL_NEG_INF;
    dt[h] = row < T ? Dt[at] : 0.0f;
  }
}

/* dq's dS of a key tile in s (C layout), from q k^T in s and do v^T in dp. */
template <int BK>
static __device__ __forceinline__ void hpdl_attn_tc_dq_ds(float (*s)[4], const float (*dp)[4], const float *lse,
                                                          const float *dt, const HpdlAttnTcRows &R, int t, int T, int nk,
                                                          int causal, const int *Cp, int window, float scale) {
  for (int n = 0; n < BK / 8; n++)
    for (int i = 0; i < 4; i++) {
      const int j = 8 * n + 2 * t + (i & 1), h = i >> 1;
      const bool ok = (h ? R.r1 : R.r0) < T && j < nk && lse[h] != HPDL_NEG_INF &&
                      (!causal || hpdl_attn_allowed(R.rp[h], Cp[j], window));
      s[n][i] = ok ? expf(scale * s[n][i] - lse[h]) * (dp[n][i] - dt[h]) : 0.0f;
    }
}

/* dq's rows r0, r1 (scaled) into grads; or, with A (fuse_attn_grad16), into gq as the
 * projection reads it, [B, T, H, D]. */
template <int D, int E = 0, int A = 0, typename TG>
static __device__ __forceinline__ void hpdl_attn_tc_store_dq(TG *__restrict__ grads, const float (*acc)[4],
                                                             const HpdlAttnTcRows &R, int t, int T, float scale,
                                                             TG *__restrict__ gq = nullptr, int H = 1) {
  HPDL_UNROLL_ALL /* acc's index 2 h + e constant: it stays in registers */
  for (int h = 0; h < 2; h++) {
    const int row = h ? R.r1 : R.r0;
    if (row >= T) continue;
    TG *__restrict__ dq = A ? gq + (((long long)(R.bh / H) * T + row) * H + R.bh % H) * D
                            : grads + ((long long)R.bh * T + row) * D;
    for (int n = 0; n < D / 8; n++)
      for (int e = 0; e < 2; e++) hpdl_attn_put<E>(&dq[8 * n + 2 * t + e], scale * acc[n][2 * h + e]);
  }
}

/* The forward on tensor cores: block `blk` of HPDL_ATTN_FWD_GRID for an HPDL_ATTN_TC
 * shape, 64 query rows of (b, h), a warp 16 of them; key tiles of 32. */
template <int D, int Dv>
static __device__ void hpdl_attn_fwd_tc(const float *__restrict__ q, const float *__restrict__ k,
                                        const float *__restrict__ v, float *__restrict__ out, int B, int H, int Hk,
                                        int T, int S, float scale, int causal, int window, int row_rank, int row_size,
                                        int col_rank, int col_size, int Sc, int split, long long blk) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BQ = HPDL_ATTN_TC_ROWS, BK = HPDL_ATTN_TC_FWD_BK;
  static_assert(HPDL_ATTN_TC(D, Dv), "tensor-core attention takes head sizes 16 .. 64, multiples of 8");
  static_assert(BQ == 16 * (NT / 32), "16 rows a warp");
  static_assert(4 * (BQ * (D + 4) + BK * (D + 4) + BK * (Dv + 4) + BK) <= HPDL_ATTN_SMEM_LIMIT, "fwd_tc over 48 KB");
  __shared__ float Qs[BQ][D + 4];
  __shared__ float Ks[BK][D + 4];
  __shared__ float Vs[BK][Dv + 4];
  __shared__ int Cp[BK]; /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, warp = tid / 32, g = (tid & 31) / 4, t = tid & 3;
  const HpdlAttnTcRows R = hpdl_attn_tc_rows(blk, H, Hk, T, causal, row_rank, row_size, warp, g);
  const float *__restrict__ kh = k + (long long)R.bhk * S * D;
  const float *__restrict__ vh = v + (long long)R.bhk * S * Dv;
  hpdl_attn_load<BQ, D, D, NT>(Qs, q + ((long long)R.bh * T + R.t0) * D, R.nrows); /* read after the loop's first barrier */
  float m[2] = {HPDL_NEG_INF, HPDL_NEG_INF}, l[2] = {0.0f, 0.0f}; /* rows r0, r1: max; this lane's sum */
  float o[Dv / 8][4];
  hpdl_attn_zero<Dv>(o);

  for (int j0 = 0; j0 < S; j0 += BK) {
    const int nk = S - j0 < BK ? S - j0 : BK;
    if (hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, R.rmin, R.rmax, col_rank, col_size)) continue; /* uniform */
    __syncthreads(); /* fwd_tc: the previous tile's Ks, Vs, Cp are read */
    hpdl_attn_load_keys<BK, D, Dv, NT>(Ks, Vs, Cp, kh, vh, j0, nk, Sc, causal, col_rank, col_size);
    __syncthreads(); /* fwd_tc: the tile is loaded */
    /* the warp's rows: none, or no allowed pair with the tile; uniform in the warp, and no
     * barrier below */
    if (R.wn == 0 || hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, R.wmin, R.wmax, col_rank, col_size)) continue;

    float s[BK / 8][4];
    hpdl_attn_zero<BK>(s);
    hpdl_attn_mma_nt<BK, D>(s, Qs + 16 * warp, Ks, g, t, split);
    hpdl_attn_tc_softmax<BK, Dv>(s, o, m, l, R, t, T, nk, causal, Cp, window, scale);
    hpdl_attn_mma_pn<Dv, BK>(o, s, Vs, g, t, split);
  }
  hpdl_attn_tc_store_out<Dv>(out, o, m, l, R, t, T);
}

/* dk and dv on tensor cores: block `blk` of HPDL_ATTN_DKDV_GRID for an HPDL_ATTN_TC shape,
 * 64 keys of (b, hk), a warp 16 of them; query tiles of 16 rows of each head of the group
 * in order. Dt from hpdl_attn_bwd_dt. */
template <int D, int Dv>
static __device__ void hpdl_attn_bwd_dkdv_tc(const float *__restrict__ q, const float *__restrict__ k,
                                             const float *__restrict__ v, const float *__restrict__ out,
                                             const float *__restrict__ dout, const float *__restrict__ Dt,
                                             float *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                             int causal, int window, int row_rank, int row_size, int col_rank,
                                             int col_size, int Sc, int split, long long blk) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BK = HPDL_ATTN_TC_KEYS, BQ = HPDL_ATTN_TC_DKDV_BQ;
  static_assert(HPDL_ATTN_TC(D, Dv), "tensor-core attention takes head sizes 16 .. 64, multiples of 8");
  static_assert(BK == 16 * (NT / 32), "16 keys a warp");
  static_assert(4 * (BK * (D + 4) + BK * (Dv + 4) + BQ * (D + 4) + BQ * (Dv + 4) + 3 * BQ) <= HPDL_ATTN_SMEM_LIMIT,
                "dkdv_tc over 48 KB");
  __shared__ float Ks[BK][D + 4];
  __shared__ float Vs[BK][Dv + 4];
  __shared__ float Qs[BQ][D + 4];
  __shared__ float Gs[BQ][Dv + 4]; /* do */
  __shared__ float Ls[BQ];         /* lse */
  __shared__ float Ds[BQ];         /* Dt */
  __shared__ int Rp[BQ];           /* row positions (causal) */
  const int tid = threadIdx.x, warp = tid / 32, g = (tid & 31) / 4, t = tid & 3, G = H / Hk;
  const HpdlAttnTcKeys K = hpdl_attn_tc_keys(blk, Hk, S, causal, window, col_rank, col_size, Sc, warp, g);
  const int wkmin = K.wkmin;
  hpdl_attn_load<BK, D, D, NT>(Ks, k + ((long long)K.bhk * S + K.j0) * D, K.nk); /* read after the first barrier */
  hpdl_attn_load<BK, Dv, Dv, NT>(Vs, v + ((long long)K.bhk * S + K.j0) * Dv, K.nk);
  float dk[D / 8][4], dv[Dv / 8][4];
  hpdl_attn_zero<D>(dk);
  hpdl_attn_zero<Dv>(dv);

  for (int gh = 0; gh < G; gh++) {
    const int bh = K.b * H + K.hk * G + gh;
    for (int t0 = 0; t0 < T; t0 += BQ) {
      const int nrows = T - t0 < BQ ? T - t0 : BQ;
      if (hpdl_attn_rows_skipped(t0, nrows, T, causal, window, K.kmin, K.kmax, row_rank, row_size)) continue; /* uniform */
      __syncthreads(); /* dkdv_tc: the previous tile's Qs, Gs, Ls, Ds, Rp are read */
      const long long row0 = (long long)bh * T + t0;
      hpdl_attn_load<BQ, D, D, NT>(Qs, q + row0 * D, nrows);
      hpdl_attn_load<BQ, Dv, Dv + 1, NT>(Gs, dout + row0 * (Dv + 1), nrows);
      hpdl_attn_load_rows(Ls, Ds, Rp, out, Dt, row0, t0, nrows, BQ, NT, Dv, T, causal, row_rank, row_size);
      __syncthreads(); /* dkdv_tc: the tile is loaded */
      if (K.wn == 0 || (causal && hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size) < wkmin)) continue;
      if (causal && window > 0 && hpdl_attn_rowpos(t0, T, row_rank, row_size) - K.wkmax >= window) continue;

      float p[BQ / 8][4], ds[BQ / 8][4]; /* P^T and dS^T: keys g, g + 8 by rows 8 n + 2 t, + 1 */
      hpdl_attn_zero<BQ>(p);
      hpdl_attn_zero<BQ>(ds);
      hpdl_attn_mma_nt<BQ, D>(p, Ks + 16 * warp, Qs, g, t, split);  /* k q^T */
      hpdl_attn_mma_nt<BQ, Dv>(ds, Vs + 16 * warp, Gs, g, t, split); /* v do^T */
      hpdl_attn_tc_pds<BQ>(p, ds, Ls, Ds, Rp, K, t, S, causal, window, scale);
      hpdl_attn_mma_pn<Dv, BQ>(dv, p, Gs, g, t, split); /* P^T do */
      hpdl_attn_mma_pn<D, BQ>(dk, ds, Qs, g, t, split); /* dS^T q */
    }
  }
  hpdl_attn_tc_store_dkdv<D, Dv>(grads, dk, dv, K, t, B, H, Hk, T, S, scale);
}

/* dq on tensor cores: block `blk` of HPDL_ATTN_DQ_GRID for an HPDL_ATTN_TC shape, 64
 * query rows of (b, h), a warp 16 of them; key tiles of 16. */
template <int D, int Dv>
static __device__ void hpdl_attn_bwd_dq_tc(const float *__restrict__ q, const float *__restrict__ k,
                                           const float *__restrict__ v, const float *__restrict__ out,
                                           const float *__restrict__ dout, const float *__restrict__ Dt,
                                           float *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                           int causal, int window, int row_rank, int row_size, int col_rank,
                                           int col_size, int Sc, int split, long long blk) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BQ = HPDL_ATTN_TC_ROWS, BK = HPDL_ATTN_TC_DQ_BK;
  static_assert(HPDL_ATTN_TC(D, Dv), "tensor-core attention takes head sizes 16 .. 64, multiples of 8");
  static_assert(BQ == 16 * (NT / 32), "16 rows a warp");
  static_assert(4 * (BQ * (D + 4) + BQ * (Dv + 4) + BK * (D + 4) + BK * (Dv + 4) + BK) <= HPDL_ATTN_SMEM_LIMIT,
                "dq_tc over 48 KB");
  __shared__ float Qs[BQ][D + 4];
  __shared__ float Gs[BQ][Dv + 4]; /* do */
  __shared__ float Ks[BK][D + 4];
  __shared__ float Vs[BK][Dv + 4];
  __shared__ int Cp[BK]; /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, warp = tid / 32, g = (tid & 31) / 4, t = tid & 3;
  const HpdlAttnTcRows R = hpdl_attn_tc_rows(blk, H, Hk, T, causal, row_rank, row_size, warp, g);
  const float *__restrict__ kh = k + (long long)R.bhk * S * D;
  const float *__restrict__ vh = v + (long long)R.bhk * S * Dv;
  hpdl_attn_load<BQ, D, D, NT>(Qs, q + ((long long)R.bh * T + R.t0) * D, R.nrows); /* read after the first barrier */
  hpdl_attn_load<BQ, Dv, Dv + 1, NT>(Gs, dout + ((long long)R.bh * T + R.t0) * (Dv + 1), R.nrows);
  float lse[2], dt[2];
  hpdl_attn_tc_dq_rows<Dv>(lse, dt, out, Dt, R, T);
  float acc[D / 8][4];
  hpdl_attn_zero<D>(acc);

  for (int j0 = 0; j0 < S; j0 += BK) {
    const int nk = S - j0 < BK ? S - j0 : BK;
    if (hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, R.rmin, R.rmax, col_rank, col_size)) continue; /* uniform */
    __syncthreads(); /* dq_tc: the previous tile's Ks, Vs, Cp are read */
    hpdl_attn_load_keys<BK, D, Dv, NT>(Ks, Vs, Cp, kh, vh, j0, nk, Sc, causal, col_rank, col_size);
    __syncthreads(); /* dq_tc: the tile is loaded */
    if (R.wn == 0 || hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, R.wmin, R.wmax, col_rank, col_size)) continue;

    float s[BK / 8][4], dp[BK / 8][4];
    hpdl_attn_zero<BK>(s);
    hpdl_attn_zero<BK>(dp);
    hpdl_attn_mma_nt<BK, D>(s, Qs + 16 * warp, Ks, g, t, split);   /* q k^T */
    hpdl_attn_mma_nt<BK, Dv>(dp, Gs + 16 * warp, Vs, g, t, split); /* do v^T */
    hpdl_attn_tc_dq_ds<BK>(s, dp, lse, dt, R, t, T, nk, causal, Cp, window, scale);
    hpdl_attn_mma_pn<D, BK>(acc, s, Ks, g, t, split); /* dS k */
  }
  hpdl_attn_tc_store_dq<D>(grads, acc, R, t, T, scale);
}

/* --------------------------------------- tensor cores, 16-bit operands (bf16, fp16 mma) */

/* Under 16-bit activations (precision.h: q, k, v and the output's gradient arrive
 * widened from bf16 or fp16 values), the same three products with 16-bit operands:
 * mma.sync m16n8k16, E = 0 bf16 or 1 fp16 (the activations' type, so that q, k, v and dO
 * are exact), fp32 accumulators. P and dS are rounded to that type for their products,
 * as FlashAttention-2 does; every sum and the softmax stay fp32. Against the TF32 kernels
 * above: twice the tensor-core rate, half the shared memory a tile and half the
 * fragment loads (two elements a 32-bit load).
 *
 * The m16n8k16 fragments (PTX ISA, mma.m16n8k16 .bf16 / .f16), lane (g, t) = (lane / 4,
 * lane % 4), each register two elements, the lower index in the lower half:
 *   a = A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9]
 *   b = B[2t, 2t+1][g], B[2t+8, 2t+9][g]          c as m16n8k8's (above)
 * so an A fragment is two consecutive columns of a row-major tile and a B fragment two
 * consecutive rows of B's column g: a row of a row-major tile of B^T. Where a product's
 * B is a tile's rows (P v, P^T do, dS^T q, dS k), the tile is also stored transposed.
 * The accumulators of the scores (C layout) are the second product's A fragment as they
 * stand: in k step j, registers s[2j] and s[2j + 1] are A's columns 2t, 2t+1 and 2t+8,
 * 2t+9. Head sizes as HPDL_ATTN_TC (multiples of 8, 16 .. 64); a k dimension over a
 * head is padded with zeros to a multiple of 16. Tiles are rows of the padded width + 8
 * halves: the fragment loads (eight rows at four columns) then hit 32 banks. */

#ifdef __CUDACC__
/* two floats rounded to nearest even into one register: lo in the lower half */
template <int E>
static __device__ __forceinline__ unsigned hpdl_attn_pack(float lo, float hi) {
  unsigned r;
  if (E == 0) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/* c += A B for one warp: A 16 x 16 row-major, B 16 x 8 by columns, C 16 x 8 fp32 */
template <int E>
static __device__ __forceinline__ void hpdl_mma_h16(float *c, const unsigned *a, const unsigned *b) {
  if (E == 0)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ldmatrix: NM (2 or 4) 8 x 8 matrices of 16-bit values from shared memory, lane l giving
 * the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); r[m] is this lane's
 * pair of matrix m: row l / 4, columns 2 (l % 4) and + 1, or under TRANS those of the
 * transposed matrix (rows 2 (l % 4) and + 1 of column l / 4), the mma's fragment layout. */
template <int TRANS, int NM>
static __device__ __forceinline__ void hpdl_attn_ldsm(unsigned *r, const unsigned short *row) {
  static_assert(NM == 2 || NM == 4, "ldmatrix .x2 or .x4");
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  if (NM == 4 && TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else if (NM == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
}
#else
template <int E>
static inline unsigned hpdl_attn_pack(float lo, float hi) {
  return E == 0 ? (unsigned)hpdl_bf16_from_f32(lo) | (unsigned)hpdl_bf16_from_f32(hi) << 16
                : (unsigned)hpdl_f16_from_f32(lo) | (unsigned)hpdl_f16_from_f32(hi) << 16;
}

template <int E>
static inline float hpdl_attn_h2f(unsigned h) {
  return E == 0 ? hpdl_bf16_to_f32((unsigned short)h) : hpdl_f16_to_f32((unsigned short)h);
}

/* The emulation, as hpdl_mma_tf32's: the warp's fragments exchanged through a stage, each
 * lane's four sums in k order (the products of two 16-bit values are exact in fp32). */
template <int E>
static inline void hpdl_mma_h16(float *c, const unsigned *a, const unsigned *b) {
  const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const HpdlMmaLane *stage = hpdl_mma_exchange(a, b);
  float A[16][16], Bm[16][8];
  for (unsigned l = 0; l < 32; l++) {
    const unsigned lg = l >> 2, lt = l & 3;
    const HpdlMmaLane &x = stage[l];
    for (int h = 0; h < 2; h++) {
      A[lg][2 * lt + h] = hpdl_attn_h2f<E>(x.a[0] >> (16 * h) & 0xffffu);
      A[lg + 8][2 * lt + h] = hpdl_attn_h2f<E>(x.a[1] >> (16 * h) & 0xffffu);
      A[lg][2 * lt + 8 + h] = hpdl_attn_h2f<E>(x.a[2] >> (16 * h) & 0xffffu);
      A[lg + 8][2 * lt + 8 + h] = hpdl_attn_h2f<E>(x.a[3] >> (16 * h) & 0xffffu);
      Bm[2 * lt + h][lg] = hpdl_attn_h2f<E>(x.b[0] >> (16 * h) & 0xffffu);
      Bm[2 * lt + 8 + h][lg] = hpdl_attn_h2f<E>(x.b[1] >> (16 * h) & 0xffffu);
    }
  }
  __syncwarp(0xffffffffu);
  for (int i = 0; i < 4; i++) {
    const unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float sum = c[i];
    for (int kk = 0; kk < 16; kk++) sum += A[row][kk] * Bm[kk][col];
    c[i] = sum;
  }
}

/* The emulation: each matrix's row addresses from its eight lanes by warp shuffles, each
 * lane reading its pair (a race on the tile shows as on the GPU: the barriers order it). */
template <int TRANS, int NM>
static inline void hpdl_attn_ldsm(unsigned *r, const unsigned short *row) {
  static_assert(NM == 2 || NM == 4, "ldmatrix .x2 or .x4");
  const unsigned lane = threadIdx.x & 31;
  const unsigned long long mine = (unsigned long long)(uintptr_t)row;
  if (lane < 8u * NM && (mine & 15u)) { /* the GPU's "misaligned address" */
    hpdl_emu::fail("ldmatrix: lane " + std::to_string(lane) + "'s row address is not 16-byte aligned");
    hpdl_emu::stop();
  }
  for (int m = 0; m < NM; m++) {
    if (!TRANS) {
      const unsigned short *p = (const unsigned short *)(uintptr_t)__shfl_sync(0xffffffffu, mine, 8 * m + lane / 4);
      memcpy(&r[m], p + 2 * (lane % 4), 4);
    } else {
      const unsigned short *p0 = (const unsigned short *)(uintptr_t)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * (lane % 4));
      const unsigned short *p1 =
          (const unsigned short *)(uintptr_t)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * (lane % 4) + 1);
      r[m] = (unsigned)p0[lane / 4] | (unsigned)p1[lane / 4] << 16;
    }
  }
}
#endif

#define HPDL_ATTN_PAD16(n) (((n) + 15) / 16 * 16)

/* a value of q, k, v or dO in the operands' type: an fp32 one rounded (exact where it was
 * widened from that type), a 16-bit one (already that type: the code generator's choice)
 * as it is */
template <int E>
static __device__ __forceinline__ unsigned short hpdl_attn_h16(float x) {
  return E == 0 ? hpdl_bf16_from_f32(x) : hpdl_f16_from_f32(x);
}
template <int E>
static __device__ __forceinline__ unsigned short hpdl_attn_h16(unsigned short x) {
  return x;
}

/* Eight 16-bit values from 16-byte aligned p (global memory), and eight into q (a tile's
 * row, 16-byte aligned): one 128-bit access each on the GPU. */
#ifdef __CUDACC__
static __device__ __forceinline__ uint4 hpdl_attn_ld8(const unsigned short *p) { return __ldg((const uint4 *)p); }
static __device__ __forceinline__ void hpdl_attn_st8(unsigned short *q, uint4 u) { *(uint4 *)q = u; }
#else
static inline uint4 hpdl_attn_ld8(const unsigned short *p) {
  uint4 u;
  memcpy(&u, p, 16);
  return u;
}
static inline void hpdl_attn_st8(unsigned short *q, uint4 u) { memcpy(q, &u, 16); }
#endif
/* cp.async (sm_80+): 16 bytes from global src to shared dst without passing registers,
 * `bytes` of them read (0: the 16 bytes zero-filled); a thread's copies since its last
 * commit form a group, and wait<N> returns once all but its N most recent groups have
 * landed (its own copies only: a barrier after it shows them to the block). */
#ifdef __CUDACC__
static __device__ __forceinline__ void hpdl_attn_cp16(unsigned short *dst, const unsigned short *src, int bytes) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void hpdl_attn_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void hpdl_attn_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#else
/* The emulation defers each copy to the wait that must see it, so that a tile read before
 * its wait reads what was there before (as a GPU may): per thread of the block, the copies
 * queued and where each group ends. */
struct HpdlCpAsync {
  unsigned short *dst;
  const unsigned short *src;
  int bytes;
};
struct HpdlCpQueue {
  HpdlCpAsync q[64];
  int n, groups, ends[8];
};
static inline HpdlCpQueue &hpdl_attn_cp_queue() {
  /* blocks run one after another: a thread's slot is its index (on the heap: the library's
   * thread-local block stays small for dlopen) */
  static thread_local std::vector<HpdlCpQueue> queues(1024); /* freed at the thread's exit */
  return queues[threadIdx.x];
}
static inline void hpdl_attn_cp16(unsigned short *dst, const unsigned short *src, int bytes) {
  HpdlCpQueue &Q = hpdl_attn_cp_queue();
  if (Q.n == 64 || ((uintptr_t)dst & 15u) || ((uintptr_t)src & 15u)) {
    hpdl_emu::fail(Q.n == 64 ? "cp.async: more than 64 copies in flight" : "cp.async: an address not 16-byte aligned");
    hpdl_emu::stop();
  }
  Q.q[Q.n++] = HpdlCpAsync{dst, src, bytes};
}
static inline void hpdl_attn_cp_commit() {
  HpdlCpQueue &Q = hpdl_attn_cp_queue();
  if (Q.groups == 8) {
    hpdl_emu::fail("cp.async: more than 8 groups in flight");
    hpdl_emu::stop();
  }
  Q.ends[Q.groups++] = Q.n;
}
template <int N>
static inline void hpdl_attn_cp_wait() {
  HpdlCpQueue &Q = hpdl_attn_cp_queue();
  if (Q.groups <= N) return;
  const int done = Q.ends[Q.groups - N - 1]; /* the copies of every older group */
  for (int i = 0; i < done; i++) {
    unsigned char tmp[16] = {0};
    if (Q.q[i].bytes) memcpy(tmp, Q.q[i].src, (size_t)Q.q[i].bytes);
    memcpy(Q.q[i].dst, tmp, 16);
  }
  for (int i = done; i < Q.n; i++) Q.q[i - done] = Q.q[i];
  Q.n -= done;
  for (int gq = Q.groups - N; gq < Q.groups; gq++) Q.ends[gq - (Q.groups - N)] = Q.ends[gq] - done;
  Q.groups = N;
}
#endif

/* ROWS rows of W 16-bit values (rows SLD apart, 16-byte aligned: hpdl_attn_by8) into a tile
 * by cp.async, eight values a copy; the rows at and past n zero-filled. The tile's columns
 * past W are not written. */
template <int ROWS, int W, int SLD, int NT, int LD>
static __device__ __forceinline__ void hpdl_attn_cp_rows(unsigned short (*dst)[LD], const unsigned short *__restrict__ src,
                                                         int n, long long sld = SLD) {
  constexpr int C = W / 8;
  static_assert(W % 8 == 0 && SLD % 8 == 0 && LD % 8 == 0, "16-byte pieces");
  HPDL_ROLLED
  for (int e = threadIdx.x; e < ROWS * C; e += NT) {
    const int i = e / C, c = e - i * C;
    hpdl_attn_cp16(&dst[i][8 * c], i < n ? src + (long long)i * sld + 8 * c : src, i < n ? 16 : 0);
  }
}

/* Whether rows of W 16-bit values SLD (or sld, at run time) apart from src go eight at a
 * time (128-bit loads): W and the stride multiples of 8 and src 16-byte aligned (the same
 * in every thread). */
template <int W, int SLD, typename TS>
static __device__ __forceinline__ bool hpdl_attn_by8(const TS *src, long long sld = SLD) {
  return sizeof(TS) == 2 && W % 8 == 0 && SLD % 8 == 0 && sld % 8 == 0 && ((unsigned long long)src & 15ULL) == 0;
}

/* ROWS rows of W values (fp32, or 16-bit of the operands' type), rows SLD apart (sld: a
 * stride known at run time, the heads' rows of [B, T, H, D]), into a 16-bit tile (rows LD
 * halves apart): columns W .. WP - 1 and the rows at and past n zeros. 16-bit rows eight
 * values a thread where hpdl_attn_by8 allows. */
template <int E, int ROWS, int W, int WP, int SLD, int NT, int LD, typename TS>
static __device__ __forceinline__ void hpdl_attn_load16(unsigned short (*dst)[LD], const TS *__restrict__ src, int n,
                                                        long long sld = SLD) {
  static_assert(LD % 8 == 0, "16-byte tile rows");
  if (hpdl_attn_by8<W, SLD>(src, sld)) {
    constexpr int C = W / 8 > 0 ? W / 8 : 1; /* eights a row */
    HPDL_ROLLED /* unrolled, the loads in flight take registers the accumulators hold */
    for (int e = threadIdx.x; e < ROWS * C; e += NT) {
      const int i = e / C, c = e - i * C;
      const uint4 u = i < n ? hpdl_attn_ld8((const unsigned short *)src + (long long)i * sld + 8 * c) : make_uint4(0, 0, 0, 0);
      hpdl_attn_st8(&dst[i][8 * c], u);
    }
    constexpr int Z = WP > W ? WP - W : 1; /* the padding's columns */
    if (WP > W)
      for (int e = threadIdx.x; e < ROWS * Z; e += NT) dst[e / Z][W + e % Z] = 0;
    return;
  }
  for (int e = threadIdx.x; e < ROWS * WP; e += NT) {
    const int i = e / WP, d = e - i * WP;
    dst[i][d] = i < n && d < W ? hpdl_attn_h16<E>(src[(long long)i * sld + d]) : (unsigned short)0;
  }
}

/* The output's gradient's rows t0 .. t0 + n of (b, h) into a 16-bit tile as
 * hpdl_attn_load16 loads them: from packed rows [dO, dlse] of Dv + 1 (row bh T + t), or
 * with BTHD from [B, T, H, Dv] (rows H Dv apart; fuse_attn_dout). */
template <int E, int ROWS, int Dv, int KDv, int NT, int BTHD, int LD, typename TS>
static __device__ __forceinline__ void hpdl_attn_load_dout(unsigned short (*dst)[LD], const TS *__restrict__ dout,
                                                           long long row0, int b, int h, int H, int T, int t0, int n) {
  if (!BTHD) { /* row0 = (b H + h) T + t0 */
    hpdl_attn_load16<E, ROWS, Dv, KDv, Dv + 1, NT>(dst, dout + row0 * (Dv + 1), n);
    return;
  }
  const TS *__restrict__ src = dout + (((long long)b * T + t0) * H + h) * Dv;
  const long long sld = (long long)H * Dv;
  for (int e = threadIdx.x; e < ROWS * KDv; e += NT) {
    const int i = e / KDv, d = e - i * KDv;
    dst[i][d] = i < n && d < Dv ? hpdl_attn_h16<E>(src[i * sld + d]) : (unsigned short)0;
  }
}

/* A tile's rows as hpdl_attn_load16 loads them, by cp.async where `async` (16-bit rows that
 * hpdl_attn_by8 takes; the padding columns W .. WP - 1 then zeroed once beforehand, as
 * cp.async leaves them), else by loads and stores now. */
template <int E, int ROWS, int W, int WP, int SLD, int NT, int LD>
static __device__ __forceinline__ void hpdl_attn_tile16(unsigned short (*dst)[LD], const unsigned short *__restrict__ src,
                                                        int n, bool async, long long sld = SLD) {
  if (async) hpdl_attn_cp_rows<ROWS, W, SLD, NT, LD>(dst, src, n, sld);
  else hpdl_attn_load16<E, ROWS, W, WP, SLD, NT, LD>(dst, src, n, sld);
}
template <int E, int ROWS, int W, int WP, int SLD, int NT, int LD>
static __device__ __forceinline__ void hpdl_attn_tile16(unsigned short (*dst)[LD], const float *__restrict__ src, int n,
                                                        bool, long long sld = SLD) {
  hpdl_attn_load16<E, ROWS, W, WP, SLD, NT, LD>(dst, src, n, sld); /* fp32 values rounded: no copy as they are */
}

/* the A fragment of k step kk of the 16 rows of tile X from row r0: one ldmatrix.x4 (its
 * matrices rows r0 .. + 7 and r0 + 8 .. + 15 at columns 16 kk, then at 16 kk + 8) */
template <int LD>
static __device__ __forceinline__ void hpdl_attn_afrag(unsigned *a, const unsigned short (*X)[LD], int r0, int kk,
                                                       int lane) {
  hpdl_attn_ldsm<0, 4>(a, &X[r0 + (lane & 15)][16 * kk + 8 * (lane >> 4)]);
}

/* acc[n] += A B_n for n < N / 8, one k step of 16: A's fragment a, B_n's columns the rows
 * 8 n .. 8 n + 7 of tile X from column k0 (B's k consecutive in a row): two n tiles an
 * ldmatrix.x4 (rows 8 n .. + 15, columns k0 and k0 + 8), an odd last one an .x2. */
template <int E, int N, int LDX>
static __device__ __forceinline__ void hpdl_attn_mma16_b(float (*acc)[4], const unsigned *a,
                                                         const unsigned short (*X)[LDX], int k0, int lane) {
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int n = 0; n + 1 < N / 8; n += 2) {
    unsigned b[4];
    hpdl_attn_ldsm<0, 4>(b, &X[8 * n + (lane & 7) + 8 * (lane >> 4)][k0 + 8 * ((lane >> 3) & 1)]);
    hpdl_mma_h16<E>(acc[n], a, b);
    hpdl_mma_h16<E>(acc[n + 1], a, b + 2);
  }
  if ((N / 8) % 2) {
    unsigned b[2];
    hpdl_attn_ldsm<0, 2>(b, &X[N - 8 + (lane & 7)][k0 + 8 * ((lane >> 3) & 1)]);
    hpdl_mma_h16<E>(acc[N / 8 - 1], a, b);
  }
}

/* acc[n] += A X^T over K (a multiple of 16) columns, for n < N / 8: A the 16 rows of tile
 * As from row r0, X a tile whose rows 8 n .. 8 n + 7 are B's columns. The fragments are
 * loaded where they are used, so that registers hold the accumulators (as the TF32 kernels). */
template <int E, int N, int K, int LDA, int LDX>
static __device__ __forceinline__ void hpdl_attn_mma16_nt(float (*acc)[4], const unsigned short (*As)[LDA], int r0,
                                                          const unsigned short (*X)[LDX], int lane) {
  HPDL_ROLLED
  for (int kk = 0; kk < K / 16; kk++) {
    unsigned a[4];
    hpdl_attn_afrag<LDA>(a, As, r0, kk, lane);
    hpdl_attn_mma16_b<E, N, LDX>(acc, a, X, 16 * kk, lane);
  }
}

/* acc[n] += P X over K (a multiple of 16) keys or rows, for n < N / 8: P the warp's fp32
 * accumulators p[K / 8] (C layout), rounded to 16 bits as the A fragment; X a tile stored
 * by rows (X[j][d]), whose B fragments (key pairs down a column) ldmatrix .trans reads:
 * rows 16 js .. + 15 at columns 8 n and 8 n + 8 an .x4, an odd last column tile an .x2
 * (every tile an .x2 under X4 = 0, which keeps fewer registers live). */
template <int E, int N, int K, int LDX, int X4 = 1>
static __device__ __forceinline__ void hpdl_attn_mma16_pv(float (*acc)[4], const float (*p)[4],
                                                          const unsigned short (*X)[LDX], int lane) {
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int js = 0; js < K / 16; js++) {
    const unsigned a[4] = {hpdl_attn_pack<E>(p[2 * js][0], p[2 * js][1]), hpdl_attn_pack<E>(p[2 * js][2], p[2 * js][3]),
                           hpdl_attn_pack<E>(p[2 * js + 1][0], p[2 * js + 1][1]),
                           hpdl_attn_pack<E>(p[2 * js + 1][2], p[2 * js + 1][3])};
    const unsigned short *row = X[16 * js + (lane & 15)];
    if (X4) {
#ifdef __CUDACC__
#pragma unroll
#endif
      for (int n = 0; n + 1 < N / 8; n += 2) {
        unsigned b[4];
        hpdl_attn_ldsm<1, 4>(b, row + 8 * n + 8 * (lane >> 4));
        hpdl_mma_h16<E>(acc[n], a, b);
        hpdl_mma_h16<E>(acc[n + 1], a, b + 2);
      }
    }
#ifdef __CUDACC__
#pragma unroll
#endif
    for (int n = X4 ? N / 8 - (N / 8) % 2 : 0; n < N / 8; n++) { /* .x2: an odd last tile, or all under !X4 */
      unsigned b[2];
      hpdl_attn_ldsm<1, 2>(b, row + 8 * n);
      hpdl_mma_h16<E>(acc[n], a, b);
    }
  }
}

/* The offset of row t0 of head bh = b H + h of q, k or v, rows of W values: [B, H, T, W] as
 * the attention's operands are, or with BTHD [B, T, H, W] as the projections made them
 * (fuse_attn_qkv: rows H W apart then). */
template <bool BTHD>
static __device__ __forceinline__ long long hpdl_attn_qkv_row(long long bh, int H, int T, int t0, int W) {
  return BTHD ? ((bh / H * T + t0) * H + bh % H) * W : (bh * T + t0) * W;
}

/* The key tiles of a row block (the forward's and dq's loop), in NB buffers. NB = 2: the
 * first tile the block computes, then for each the next one's k and v (BK keys of (b, hk)
 * from kh, vh) copied by cp.async into the other buffer while this one computes, where k
 * and v are 16-bit rows hpdl_attn_by8 takes (else loaded before it computes). NB = 1 (the
 * heads over 64, whose q and dO tiles leave no room for two): each tile copied (or loaded)
 * once the previous one is read, the other blocks of the multiprocessor computing meanwhile.
 * With the tile in Ks[b], Vs[b] and, under the causal mask, its keys' positions in Cp, each
 * warp whose rows see a key of it calls compute(b, nk) between the block's two barriers.
 * skd, svd: the rows' strides of kh, vh (D, Dv; Hk D, Hk Dv where they are [B, S, Hk, D]). */
template <int E, int BK, int D, int Dv, int KD, int KDv, int LK, int LV, int NT, int NB, typename TQ, typename F>
static __device__ __forceinline__ void hpdl_attn_key_tiles(unsigned short (*Ks)[BK][LK], unsigned short (*Vs)[BK][LV],
                                                           int *Cp, const TQ *__restrict__ kh, const TQ *__restrict__ vh,
                                                           int S, const HpdlAttnTcRows &R, int causal, int window,
                                                           int col_rank, int col_size, int Sc, F compute, long long skd = D,
                                                           long long svd = Dv) {
  static_assert(NB == 1 || NB == 2, "one or two buffers");
  const int tid = threadIdx.x;
  const bool async = hpdl_attn_by8<D, D>(kh, skd) && hpdl_attn_by8<Dv, Dv>(vh, svd); /* uniform */
  constexpr int ZP = KD > D ? KD - D : 1; /* k's padding columns, which the copies leave */
  if (async && KD > D)
    for (int e = tid; e < NB * BK * ZP; e += NT) Ks[e / (BK * ZP)][e / ZP % BK][D + e % ZP] = 0;
  auto next_tile = [&](int j) { /* the first tile from j the block computes (uniform) */
    while (j < S && hpdl_attn_keys_skipped(j, S - j < BK ? S - j : BK, Sc, causal, window, R.rmin, R.rmax, col_rank, col_size))
      j += BK;
    return j;
  };
  auto load = [&](int buf, int j, bool by_copy) { /* tile j's k and v into buffer buf */
    const int n = S - j < BK ? S - j : BK;
    hpdl_attn_tile16<E, BK, D, KD, D, NT>(Ks[buf], kh + (long long)j * skd, n, by_copy, skd);
    hpdl_attn_tile16<E, BK, Dv, KDv, Dv, NT>(Vs[buf], vh + (long long)j * svd, n, by_copy, svd);
  };
  int j0 = next_tile(0), b = 0;
  if (NB == 2 && async && j0 < S) load(0, j0, true);
  hpdl_attn_cp_commit();
  while (j0 < S) {
    const int nk = S - j0 < BK ? S - j0 : BK;
    const int jn = next_tile(j0 + BK); /* the next tile computed */
    if (NB == 2 && async && jn < S) load(b ^ 1, jn, true); /* into the other buffer, last read before the previous tile's end barrier */
    if (NB == 1) load(0, j0, async); /* the one buffer, read before the previous tile's end barrier */
    hpdl_attn_cp_commit();
    if (NB == 2 && !async) load(b, j0, false);
    hpdl_attn_cp_wait<NB - 1>(); /* key_tiles: this tile's copies (all but the NB - 1 most recent groups) */
    if (causal)
      for (int j = tid; j < BK; j += NT) Cp[j] = j < nk ? hpdl_attn_colpos(j0 + j, Sc, col_rank, col_size) : 0;
    __syncthreads(); /* key_tiles: the tile is loaded */
    if (R.wn > 0 && !hpdl_attn_keys_skipped(j0, nk, Sc, causal, window, R.wmin, R.wmax, col_rank, col_size))
      compute(b, nk);
    __syncthreads(); /* key_tiles: the tile's Ks, Vs, Cp are read */
    j0 = jn;
    b ^= NB - 1;
  }
  hpdl_attn_cp_wait<0>(); /* none left in flight (the last group is empty) */
}

/* The forward with 16-bit operands: block `blk` of HPDL_ATTN_FWD_GRID for an HPDL_ATTN_TC16
 * shape (hpdl_attn_plan_tc's grid), 64 query rows of (b, h), a warp 16 of them; key tiles
 * of HPDL_ATTN_H16_FWD_BK, v's by rows (P v's fragments through ldmatrix .trans), in
 * HPDL_ATTN_H16_FWD_BUFS buffers: with two and 16-bit k and v the next tile's cp.async
 * copies run while this one computes.
 * o16 (or null): o also in 16 bits as [B, T, H, Dv] (hpdl_attn_tc_store_out); F &
 * HPDL_ATTN_QKV_BTHD: q, k, v read as [B, T, H, D] / [B, S, Hk, D] (hpdl_attn_qkv_row). */
template <int D, int Dv, int E, int F = 0, typename TQ>
static __device__ void hpdl_attn_fwd_h(const TQ *__restrict__ q, const TQ *__restrict__ k,
                                       const TQ *__restrict__ v, float *__restrict__ out, int B, int H, int Hk, int T,
                                       int S, float scale, int causal, int window, int row_rank, int row_size,
                                       int col_rank, int col_size, int Sc, long long blk,
                                       unsigned short *__restrict__ o16 = nullptr) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BQ = HPDL_ATTN_TC_ROWS, BK = HPDL_ATTN_H16_FWD_BK(D, Dv);
  constexpr int NB = HPDL_ATTN_H16_FWD_BUFS(D, Dv);
  /* rows an odd multiple of 16 bytes apart: ldmatrix's eight rows in distinct banks */
  constexpr int KD = HPDL_ATTN_PAD16(D), KDv = HPDL_ATTN_PAD16(Dv), LQ = KD + 8, LV = KDv + 8;
  static_assert(HPDL_ATTN_TC16(D, Dv), "16-bit tensor-core attention takes head sizes 16 .. 128, multiples of 8");
  static_assert(BQ == 16 * (NT / 32) && BK % 16 == 0, "16 rows a warp, key tiles of 16s");
  static_assert(2 * (BQ * LQ + NB * BK * LQ + NB * BK * LV) + 4 * BK <= HPDL_ATTN_SMEM_LIMIT, "fwd_h over 48 KB");
  __shared__ __align__(16) unsigned short Qs[BQ][LQ];
  __shared__ __align__(16) unsigned short Ks[NB][BK][LQ];
  __shared__ __align__(16) unsigned short Vs[NB][BK][LV];
  __shared__ int Cp[BK]; /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, g = lane / 4, t = tid & 3;
  const HpdlAttnTcRows R = hpdl_attn_tc_rows(blk, H, Hk, T, causal, row_rank, row_size, warp, g);
  constexpr bool QB = (F & HPDL_ATTN_QKV_BTHD) != 0;
  const TQ *__restrict__ kh = k + hpdl_attn_qkv_row<QB>(R.bhk, Hk, S, 0, D);
  const TQ *__restrict__ vh = v + hpdl_attn_qkv_row<QB>(R.bhk, Hk, S, 0, Dv);
  hpdl_attn_load16<E, BQ, D, KD, D, NT>(Qs, q + hpdl_attn_qkv_row<QB>(R.bh, H, T, R.t0, D), R.nrows,
                                        QB ? (long long)H * D : D); /* read after the loop's first barrier */
  float m[2] = {HPDL_NEG_INF, HPDL_NEG_INF}, l[2] = {0.0f, 0.0f}; /* rows r0, r1: max; this lane's sum */
  float o[Dv / 8][4];
  hpdl_attn_zero<Dv>(o);
  hpdl_attn_key_tiles<E, BK, D, Dv, KD, KDv, LQ, LV, NT, NB>(
      Ks, Vs, Cp, kh, vh, S, R, causal, window, col_rank, col_size, Sc, [&](int b, int nk) {
        float s[BK / 8][4];
        hpdl_attn_zero<BK>(s);
        hpdl_attn_mma16_nt<E, BK, KD, LQ>(s, Qs, 16 * warp, Ks[b], lane);
        hpdl_attn_tc_softmax<BK, Dv>(s, o, m, l, R, t, T, nk, causal, Cp, window, scale);
        hpdl_attn_mma16_pv<E, Dv, BK, LV, 0>(o, s, Vs[b], lane); /* x2 loads: with .x4 sm_90 spilled */
      }, QB ? (long long)Hk * D : D, QB ? (long long)Hk * Dv : Dv);
  hpdl_attn_tc_store_out<Dv, E>(out, o, m, l, R, t, T, o16, H);
}

/* dk and dv with 16-bit operands: block `blk` of HPDL_ATTN_DKDV_GRID (hpdl_attn_plan_tc's),
 * 64 keys of (b, hk), a warp 16 of them; query tiles of HPDL_ATTN_H16_DKDV_BQ rows of each
 * head of the group in order (by rows: the P^T do and dS^T q fragments through ldmatrix
 * .trans). Dt from hpdl_attn_bwd_dt. F: HPDL_ATTN_GRADS_BTHD, dk and dv into gk and gv as
 * [B, S, Hk, D] instead of into grads (hpdl_attn_tc_store_dkdv); HPDL_ATTN_DOUT_BTHD, dO read
 * as [B, T, H, Dv] (hpdl_attn_load_dout); HPDL_ATTN_QKV_BTHD, q, k, v read as [B, T, H, D] /
 * [B, S, Hk, D] (hpdl_attn_qkv_row). Compile-time, so that the kernels without them keep
 * their registers. */
template <int D, int Dv, int E, int F = 0, typename TQ, typename TG>
static __device__ void hpdl_attn_bwd_dkdv_h(const TQ *__restrict__ q, const TQ *__restrict__ k,
                                            const TQ *__restrict__ v, const float *__restrict__ out,
                                            const float *__restrict__ dout, const float *__restrict__ Dt,
                                            TG *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                            int causal, int window, int row_rank, int row_size, int col_rank,
                                            int col_size, int Sc, long long blk, TG *__restrict__ gk = nullptr,
                                            TG *__restrict__ gv = nullptr) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BK = HPDL_ATTN_TC_KEYS, BQ = HPDL_ATTN_H16_DKDV_BQ(D, Dv);
  constexpr int KD = HPDL_ATTN_PAD16(D), KDv = HPDL_ATTN_PAD16(Dv), LK = KD + 8, LV = KDv + 8;
  static_assert(HPDL_ATTN_TC16(D, Dv), "16-bit tensor-core attention takes head sizes 16 .. 128, multiples of 8");
  static_assert(BK == 16 * (NT / 32) && BQ % 16 == 0, "16 keys a warp, query tiles of 16s");
  static_assert(2 * (BK * LK + BK * LV + BQ * LK + BQ * LV) + 12 * BQ <= HPDL_ATTN_SMEM_LIMIT, "dkdv_h over 48 KB");
  __shared__ __align__(16) unsigned short Ks[BK][LK];
  __shared__ __align__(16) unsigned short Vs[BK][LV];
  __shared__ __align__(16) unsigned short Qs[BQ][LK];
  __shared__ __align__(16) unsigned short Gs[BQ][LV]; /* do */
  __shared__ float Ls[BQ];                            /* lse */
  __shared__ float Ds[BQ];                            /* Dt */
  __shared__ int Rp[BQ];                              /* row positions (causal) */
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, g = lane / 4, t = tid & 3, G = H / Hk;
  const HpdlAttnTcKeys K = hpdl_attn_tc_keys(blk, Hk, S, causal, window, col_rank, col_size, Sc, warp, g);
  const int wkmin = K.wkmin;
  constexpr bool QB = (F & HPDL_ATTN_QKV_BTHD) != 0;
  hpdl_attn_load16<E, BK, D, KD, D, NT>(Ks, k + hpdl_attn_qkv_row<QB>(K.bhk, Hk, S, K.j0, D), K.nk,
                                        QB ? (long long)Hk * D : D); /* read after the first barrier */
  hpdl_attn_load16<E, BK, Dv, KDv, Dv, NT>(Vs, v + hpdl_attn_qkv_row<QB>(K.bhk, Hk, S, K.j0, Dv), K.nk,
                                           QB ? (long long)Hk * Dv : Dv);
  float dk[D / 8][4], dv[Dv / 8][4];
  hpdl_attn_zero<D>(dk);
  hpdl_attn_zero<Dv>(dv);

  for (int gh = 0; gh < G; gh++) {
    const int bh = K.b * H + K.hk * G + gh;
    for (int t0 = 0; t0 < T; t0 += BQ) {
      const int nrows = T - t0 < BQ ? T - t0 : BQ;
      if (hpdl_attn_rows_skipped(t0, nrows, T, causal, window, K.kmin, K.kmax, row_rank, row_size)) continue; /* uniform */
      __syncthreads(); /* dkdv_h: the previous tile's Qs, Gs, Ls, Ds, Rp are read */
      const long long row0 = (long long)bh * T + t0;
      hpdl_attn_load16<E, BQ, D, KD, D, NT>(Qs, q + hpdl_attn_qkv_row<QB>(bh, H, T, t0, D),
                                            nrows, QB ? (long long)H * D : D);
      hpdl_attn_load_dout<E, BQ, Dv, KDv, NT, F & HPDL_ATTN_DOUT_BTHD>(Gs, dout, row0, K.b, bh - K.b * H, H, T, t0, nrows);
      hpdl_attn_load_rows(Ls, Ds, Rp, out, Dt, row0, t0, nrows, BQ, NT, Dv, T, causal, row_rank, row_size);
      __syncthreads(); /* dkdv_h: the tile is loaded */
      if (K.wn == 0 || (causal && wkmin > hpdl_attn_rowpos_max(t0, t0 + nrows, T, row_rank, row_size))) continue;
      if (causal && window > 0 && hpdl_attn_rowpos(t0, T, row_rank, row_size) - K.wkmax >= window) continue;

      float p[BQ / 8][4], ds[BQ / 8][4]; /* P^T and dS^T: keys g, g + 8 by rows 8 n + 2 t, + 1 */
      hpdl_attn_zero<BQ>(p);
      hpdl_attn_zero<BQ>(ds);
      hpdl_attn_mma16_nt<E, BQ, KD, LK>(p, Ks, 16 * warp, Qs, lane);   /* k q^T */
      hpdl_attn_mma16_nt<E, BQ, KDv, LV>(ds, Vs, 16 * warp, Gs, lane); /* v do^T */
      hpdl_attn_tc_pds<BQ>(p, ds, Ls, Ds, Rp, K, t, S, causal, window, scale);
      /* x2 loads: the dk and dv accumulators leave no registers for .x4's (sm_90 spilled) */
      hpdl_attn_mma16_pv<E, Dv, BQ, LV, 0>(dv, p, Gs, lane); /* P^T do */
      hpdl_attn_mma16_pv<E, D, BQ, LK, 0>(dk, ds, Qs, lane); /* dS^T q */
    }
  }
  hpdl_attn_tc_store_dkdv<D, Dv, E, (F & HPDL_ATTN_GRADS_BTHD) != 0>(grads, dk, dv, K, t, B, H, Hk, T, S, scale, gk, gv);
}

/* dq with 16-bit operands: block `blk` of HPDL_ATTN_DQ_GRID (hpdl_attn_plan_tc's), 64 query
 * rows of (b, h), a warp 16 of them; key tiles of HPDL_ATTN_H16_DQ_BK (by rows: dS k's
 * fragments through ldmatrix .trans) in two buffers, as the forward's (hpdl_attn_key_tiles).
 * F as dkdv_h's: dq into gq as [B, T, H, D] instead of into grads (hpdl_attn_tc_store_dq), q,
 * k, v read as [B, T, H, D] (HPDL_ATTN_QKV_BTHD). */
template <int D, int Dv, int E, int F = 0, typename TQ, typename TG>
static __device__ void hpdl_attn_bwd_dq_h(const TQ *__restrict__ q, const TQ *__restrict__ k,
                                          const TQ *__restrict__ v, const float *__restrict__ out,
                                          const float *__restrict__ dout, const float *__restrict__ Dt,
                                          TG *__restrict__ grads, int B, int H, int Hk, int T, int S, float scale,
                                          int causal, int window, int row_rank, int row_size, int col_rank,
                                          int col_size, int Sc, long long blk, TG *__restrict__ gq = nullptr) {
  constexpr int NT = HPDL_ATTN_TC_THREADS, BQ = HPDL_ATTN_TC_ROWS, BK = HPDL_ATTN_H16_DQ_BK(D, Dv);
  constexpr int NB = HPDL_ATTN_H16_DQ_BUFS(D, Dv);
  constexpr int KD = HPDL_ATTN_PAD16(D), KDv = HPDL_ATTN_PAD16(Dv), LK = KD + 8, LV = KDv + 8;
  static_assert(HPDL_ATTN_TC16(D, Dv), "16-bit tensor-core attention takes head sizes 16 .. 128, multiples of 8");
  static_assert(BQ == 16 * (NT / 32) && BK % 16 == 0, "16 rows a warp, key tiles of 16s");
  static_assert(2 * (BQ * LK + BQ * LV + NB * BK * LK + NB * BK * LV) + 4 * BK <= HPDL_ATTN_SMEM_LIMIT, "dq_h over 48 KB");
  __shared__ __align__(16) unsigned short Qs[BQ][LK];
  __shared__ __align__(16) unsigned short Gs[BQ][LV]; /* do */
  __shared__ __align__(16) unsigned short Ks[NB][BK][LK];
  __shared__ __align__(16) unsigned short Vs[NB][BK][LV];
  __shared__ int Cp[BK]; /* key positions (causal) */
  (void)B;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, g = lane / 4, t = tid & 3;
  const HpdlAttnTcRows R = hpdl_attn_tc_rows(blk, H, Hk, T, causal, row_rank, row_size, warp, g);
  constexpr bool QB = (F & HPDL_ATTN_QKV_BTHD) != 0;
  const TQ *__restrict__ kh = k + hpdl_attn_qkv_row<QB>(R.bhk, Hk, S, 0, D);
  const TQ *__restrict__ vh = v + hpdl_attn_qkv_row<QB>(R.bhk, Hk, S, 0, Dv);
  hpdl_attn_load16<E, BQ, D, KD, D, NT>(Qs, q + hpdl_attn_qkv_row<QB>(R.bh, H, T, R.t0, D), R.nrows,
                                        QB ? (long long)H * D : D); /* read after the first barrier */
  hpdl_attn_load_dout<E, BQ, Dv, KDv, NT, F & HPDL_ATTN_DOUT_BTHD>(Gs, dout, (long long)R.bh * T + R.t0, R.bh / H, R.bh % H,
                                                                 H, T, R.t0, R.nrows);
  float lse[2], dt[2];
  hpdl_attn_tc_dq_rows<Dv>(lse, dt, out, Dt, R, T);
  float acc[D / 8][4];
  hpdl_attn_zero<D>(acc);

  hpdl_attn_key_tiles<E, BK, D, Dv, KD, KDv, LK, LV, NT, NB>(
      Ks, Vs, Cp, kh, vh, S, R, causal, window, col_rank, col_size, Sc, [&](int b, int nk) {
        float s[BK / 8][4], dp[BK / 8][4];
        hpdl_attn_zero<BK>(s);
        hpdl_attn_zero<BK>(dp);
        hpdl_attn_mma16_nt<E, BK, KD, LK>(s, Qs, 16 * warp, Ks[b], lane);   /* q k^T */
        hpdl_attn_mma16_nt<E, BK, KDv, LV>(dp, Gs, 16 * warp, Vs[b], lane); /* do v^T */
        hpdl_attn_tc_dq_ds<BK>(s, dp, lse, dt, R, t, T, nk, causal, Cp, window, scale);
        hpdl_attn_mma16_pv<E, D, BK>(acc, s, Ks[b], lane); /* dS k */
      }, QB ? (long long)Hk * D : D, QB ? (long long)Hk * Dv : Dv);
  hpdl_attn_tc_store_dq<D, E, (F & HPDL_ATTN_GRADS_BTHD) != 0>(grads, acc, R, t, T, scale, gq, H);
}

#endif /* HPDL_ATTENTION_CUH */
