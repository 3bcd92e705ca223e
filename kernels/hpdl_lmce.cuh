/* kernels/hpdl_lmce.cuh - the language model's head and its cross-entropy in one on the GPU
 * (kernels/README.md, "The fused head"): the IR ops LINEAR_CE, LINEAR_LSE and their
 * gradients (core/ir_ops.h) with core/numeric/lmce.c's semantics. The logits z = x W of
 * `rows` rows over a vocabulary of V are made a 64 x 64 tile at a time in registers and
 * never stored, as Liger-Kernel's fused linear cross-entropy keeps them out of memory:
 *
 *   x [rows, C] (fp32, or bf16 bits), W = w [C, ldw] (its first V columns) or, w_rows,
 *   the transpose of w [Vw, C] (a tied embedding table); targets t [rows] (int32)
 *   forward    nll[r] = lse(z_r) - z_r[t_r]  (LINEAR_LSE: lse(z_r), over the V columns
 *              before a padded vocabulary's padding)
 *   backward   g[r, v] = dy[r] (exp(z_rv - lse_r) - [v = t_r]), lse_r = nll_r + z_r[t_r];
 *              dx = g W^T, dw = g in w's layout (x^T g for [C, V], g^T x for [V, C]), 0 in
 *              the padding's columns; under bf16 g is rounded to bf16 before both
 *              products, as the unfused step stores it
 *
 * One file, three readers (as hpdl_conv.cuh): plain C on the host sees the launch rule
 * (hpdl_lmce_plan, for the code generator); NVRTC and the emulation (kernels/cuda_emu.h)
 * also the device functions, each called by a generated kernel of 256 threads a block for
 * blk = blockIdx.x, + gridDim.x, ... below the rule's grid (block-uniform: the barriers hold):
 *
 *   hpdl_lmce_fwd(x, w, t, pm, ps, zt, shape, blk)    a row tile x a vocabulary split:
 *       each thread's running max and sum of exp(z - max) over its columns (online
 *       softmax), merged over the 16 threads of a row by shuffles, written per split
 *       (pm, ps [splits, rows]); the block holding a row's target column writes z_t (zt)
 *   hpdl_lmce_rows(pm, ps, zt, t, out, shape)        grid-stride, a thread a row: the
 *       splits merged in split order, lse = max + log(sum); nll = lse - z_t (or lse)
 *   hpdl_lmce_lse(x, w, t, nll, lse, shape)           a warp a row: lse_r = nll_r + x_r . W[:, t_r]
 *   hpdl_lmce_dx(x, w, t, lse, dy, dx, shape, blk)     a row tile: over the vocabulary's
 *       tiles in order, the tile's g into shared memory, then dx's rows += g W^T in column
 *       tiles of 64 (the block owns its rows: read, add, write; no atomics)
 *   hpdl_lmce_dw(x, w, t, lse, dy, dw, shape, blk)     a vocabulary tile: over the row
 *       tiles in order, g, then dw's columns += x^T g (the block owns its columns)
 *
 * Each product is hpdl_conv.cuh's hpdl_conv_tile (fp32 fused multiply-adds in ascending
 * reduction order); every sum runs in an order fixed by the shapes alone: the same bits
 * every run, no float atomics. The backward makes the logits twice (dx and dw each make
 * their own), so it does four products' work where the unfused head does two; it keeps
 * no [rows, V] tensor. Not bit for bit lmce.c (another summation order, expf for its
 * polynomial); within fp32 rounding. A target outside [0, V) gives its row a loss of 0
 * and a gradient of zeros (range checks are the runtime's: a kernel has no error channel). */
#ifndef HPDL_LMCE_CUH
#define HPDL_LMCE_CUH

#include "hpdl_conv.cuh"

#define HPDL_LMCE_TILE 64    /* rows and columns of a logits tile */
#define HPDL_LMCE_THREADS 256
#define HPDL_LMCE_MIN_BLOCKS 1
#define HPDL_LMCE_FILL_BLOCKS 264 /* the forward's blocks to aim for: two waves of an H100's 132 SMs */

/* The shapes every device function takes. */
typedef struct {
  long long rows, C, V; /* V: the vocabulary's columns that count (a padded shard's prefix) */
  long long Vw, ldw;    /* the weight's vocabulary rows or columns, and [C, V]'s row stride */
  int w_rows;           /* 1: w [Vw, C]; 0: w [C, ldw] */
  int splits;           /* the forward's vocabulary splits (hpdl_lmce_plan) */
  int bf16;             /* x and w bf16: g rounded to bf16 before its products */
} hpdl_lmce_shape;

/* ------------------------------------------------------------------ the launch rule */
#if !defined(__CUDACC_RTC__)

typedef struct {
  long long row_tiles, col_tiles, w_tiles; /* tiles of rows, of the V columns, of w's Vw */
  int splits;
  long long grid_fwd, grid_dx, grid_dw;
  long long scratch_fwd; /* floats: pm and ps [splits, rows], zt [rows] */
} hpdl_lmce_launch;

/* The launch rule, a function of the shapes alone (so the rounding is too): the forward
 * cuts the vocabulary into as many splits as fill HPDL_LMCE_FILL_BLOCKS blocks with the
 * row tiles, at most one a column tile. */
HPDL_CONV_HOST void hpdl_lmce_plan(long long rows, long long Vw, hpdl_lmce_launch *L) {
  const long long T = HPDL_LMCE_TILE;
  L->row_tiles = (rows + T - 1) / T;
  L->w_tiles = (Vw + T - 1) / T;
  L->col_tiles = L->w_tiles;
  long long s = (HPDL_LMCE_FILL_BLOCKS + L->row_tiles - 1) / (L->row_tiles > 0 ? L->row_tiles : 1);
  if (s > L->col_tiles) s = L->col_tiles;
  if (s < 1) s = 1;
  L->splits = (int)s;
  L->grid_fwd = L->row_tiles * s;
  L->grid_dx = L->row_tiles;
  L->grid_dw = L->w_tiles;
  L->scratch_fwd = 2 * s * rows + rows;
}

#endif /* !__CUDACC_RTC__ */

/* ------------------------------------------------------------------ device code */
#if defined(__CUDACC__) || defined(HPDL_EMU)

/* The columns of a vocabulary shard of `local` rows from global row `first` that lie
 * before the vocabulary's `rows` (core/ir.h's ir_vocab_prefix). */
static __device__ __forceinline__ long long hpdl_lmce_prefix(long long rows, long long first, long long local) {
  if (rows <= 0) return local;
  const long long v = rows - first;
  return v < 0 ? 0 : v < local ? v : local;
}

static __device__ __forceinline__ float hpdl_lmce_f(float v) { return v; }
static __device__ __forceinline__ float hpdl_lmce_f(unsigned short v) { return hpdl_bf16_to_f32(v); }

/* z = x W for a tile: A = x's rows from r0 (row m, reduction k), B = W's column `col`
 * (the thread's own, hpdl_conv_tile's loader contract). */
template <class TX, class TW>
struct hpdl_lmce_ld {
  const TX *__restrict__ x;
  const TW *__restrict__ w;
  long long C, ldw, r0, col;
  int rows, w_rows;
  bool ok;
  __device__ float a(int m, int k) const { return m < rows ? hpdl_lmce_f(x[(r0 + m) * C + k]) : 0.0f; }
  __device__ float b(int k) const {
    if (!ok) return 0.0f;
    return w_rows ? hpdl_lmce_f(w[col * C + k]) : hpdl_lmce_f(w[(long long)k * ldw + col]);
  }
};

/* W[c, v] in either layout */
template <class TW>
static __device__ __forceinline__ float hpdl_lmce_w(const TW *__restrict__ w, const hpdl_lmce_shape &s, long long c, long long v) {
  return s.w_rows ? hpdl_lmce_f(w[v * s.C + c]) : hpdl_lmce_f(w[c * s.ldw + v]);
}

/* The logits of rows r0.. x columns v0..: acc[r][c] is row ty 4 + r, column v0 + tx + 16 c. */
template <class TX, class TW>
static __device__ __forceinline__ void hpdl_lmce_logits(const TX *__restrict__ x, const TW *__restrict__ w,
                                                        const hpdl_lmce_shape &s, long long r0, long long v0,
                                                        float (&acc)[4][4]) {
  const long long T = HPDL_LMCE_TILE;
  hpdl_lmce_ld<TX, TW> ld;
  ld.x = x;
  ld.w = w;
  ld.C = s.C;
  ld.ldw = s.ldw;
  ld.r0 = r0;
  ld.rows = (int)(s.rows - r0 < T ? s.rows - r0 : T);
  ld.w_rows = s.w_rows;
  ld.col = v0 + (long long)(threadIdx.x % T);
  ld.ok = ld.col < s.V;
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 4; c++) acc[r][c] = 0.0f;
  hpdl_conv_tile<HPDL_LMCE_TILE, HPDL_LMCE_TILE, 4, 4>(ld, 0, (int)s.C, acc);
}

/* (m, s) <- (m, s) merged with (m2, s2): max and the sum of exp(z - max) */
static __device__ __forceinline__ void hpdl_lmce_merge(float &m, float &s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  if (M == HPDL_NEG_INF) return; /* both empty */
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

template <class TX, class TW, class TT>
static __device__ void hpdl_lmce_fwd(const TX *__restrict__ x, const TW *__restrict__ w, const TT *__restrict__ t,
                                     float *__restrict__ pm, float *__restrict__ ps, float *__restrict__ zt,
                                     const hpdl_lmce_shape s, long long blk) {
  const long long T = HPDL_LMCE_TILE;
  const long long ctiles = (s.V + T - 1) / T, per = (ctiles + s.splits - 1) / s.splits;
  const long long rt = blk / s.splits, split = blk % s.splits, r0 = rt * T;
  const int tx = (int)(threadIdx.x % 16), ty = (int)(threadIdx.x / 16);
  float m[4], sum[4];
  long long tgt[4];
  for (int r = 0; r < 4; r++) {
    const long long row = r0 + ty * 4 + r;
    m[r] = HPDL_NEG_INF;
    sum[r] = 0.0f;
    tgt[r] = t && row < s.rows ? (long long)t[row] : -1;
  }
  const long long vt1 = (split + 1) * per < ctiles ? (split + 1) * per : ctiles;
  for (long long vt = split * per; vt < vt1; vt++) {
    float acc[4][4];
    hpdl_lmce_logits(x, w, s, r0, vt * T, acc);
    for (int r = 0; r < 4; r++) {
      const long long row = r0 + ty * 4 + r;
      if (row >= s.rows) continue;
      for (int c = 0; c < 4; c++) {
        const long long v = vt * T + tx + 16 * c;
        if (v >= s.V) continue;
        const float z = acc[r][c];
        if (z > m[r]) {
          sum[r] = sum[r] * expf(m[r] - z) + 1.0f;
          m[r] = z;
        } else {
          sum[r] += expf(z - m[r]);
        }
        if (v == tgt[r]) zt[row] = z;
      }
    }
  }
  /* the 16 threads of a row are 16 adjacent lanes: a fixed tree over them */
  for (int r = 0; r < 4; r++) {
    for (int off = 8; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off), s2 = __shfl_xor_sync(0xffffffffu, sum[r], off);
      hpdl_lmce_merge(m[r], sum[r], m2, s2);
    }
    const long long row = r0 + ty * 4 + r;
    if (tx == 0 && row < s.rows) {
      pm[split * s.rows + row] = m[r];
      ps[split * s.rows + row] = sum[r];
    }
  }
}

/* nll (t) or lse (t null) of every row from the splits' partials. */
template <class TT>
static __device__ void hpdl_lmce_rows(const float *__restrict__ pm, const float *__restrict__ ps, const float *__restrict__ zt,
                                      const TT *__restrict__ t, float *__restrict__ out, const hpdl_lmce_shape s) {
  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < s.rows;
       row += (long long)gridDim.x * blockDim.x) {
    float m = HPDL_NEG_INF, sum = 0.0f;
    for (int k = 0; k < s.splits; k++) hpdl_lmce_merge(m, sum, pm[k * s.rows + row], ps[k * s.rows + row]);
    const float lse = m == HPDL_NEG_INF ? HPDL_NEG_INF : m + logf(sum);
    if (!t) {
      out[row] = lse;
      continue;
    }
    const long long tg = (long long)t[row];
    out[row] = tg >= 0 && tg < s.V ? lse - zt[row] : 0.0f;
  }
}

/* LINEAR_CE's backward: lse_r = nll_r + z_r[t_r], the target's logit made again (a warp a
 * row, lanes over C, a fixed shuffle tree); a target outside [0, V): lse = nll. */
template <class TX, class TW, class TT>
static __device__ void hpdl_lmce_lse(const TX *__restrict__ x, const TW *__restrict__ w, const TT *__restrict__ t,
                                     const float *__restrict__ nll, float *__restrict__ lse, const hpdl_lmce_shape s) {
  const int lane = (int)(threadIdx.x % 32);
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < s.rows; row += warps) {
    const long long tg = (long long)t[row];
    const bool ok = tg >= 0 && tg < s.V;
    float d = 0.0f;
    if (ok)
      for (long long k = lane; k < s.C; k += 32) d = fmaf(hpdl_lmce_f(x[row * s.C + k]), hpdl_lmce_w(w, s, k, tg), d);
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (lane == 0) lse[row] = nll[row] + d;
  }
}

/* g of a tile into G[64][65]: row ty 4 + r, column tx + 16 c (0 outside the rows, beyond
 * V, and in a row whose target is outside [0, V)). */
template <class TT>
static __device__ __forceinline__ void hpdl_lmce_g(const float (&acc)[4][4], const TT *__restrict__ t,
                                                   const float *__restrict__ lse, const float *__restrict__ dy,
                                                   const hpdl_lmce_shape &s, long long r0, long long v0,
                                                   float (*G)[HPDL_LMCE_TILE + 1]) {
  const int tx = (int)(threadIdx.x % 16), ty = (int)(threadIdx.x / 16);
  for (int r = 0; r < 4; r++) {
    const long long row = r0 + ty * 4 + r;
    const long long tg = t && row < s.rows ? (long long)t[row] : -1;
    const bool live = row < s.rows && (!t || (tg >= 0 && tg < s.V));
    const float l = live ? lse[row] : 0.0f, d = live ? dy[row] : 0.0f;
    for (int c = 0; c < 4; c++) {
      const long long v = v0 + tx + 16 * c;
      float g = 0.0f;
      if (live && v < s.V) g = d * (expf(acc[r][c] - l) - (v == tg ? 1.0f : 0.0f));
      if (s.bf16) g = hpdl_bf16_to_f32(hpdl_bf16_from_f32(g));
      G[ty * 4 + r][tx + 16 * c] = g;
    }
  }
}

template <class TX, class TW, class TT>
static __device__ void hpdl_lmce_dx(const TX *__restrict__ x, const TW *__restrict__ w, const TT *__restrict__ t,
                                    const float *__restrict__ lse, const float *__restrict__ dy, float *__restrict__ dx,
                                    const hpdl_lmce_shape s, long long blk) {
  const long long T = HPDL_LMCE_TILE, r0 = blk * T, ctiles = (s.V + T - 1) / T;
  __shared__ float G[HPDL_LMCE_TILE][HPDL_LMCE_TILE + 1]; /* g [row][v] */
  __shared__ float Ws[HPDL_LMCE_TILE][HPDL_LMCE_TILE + 1]; /* W [v][c] */
  const int tx = (int)(threadIdx.x % 16), ty = (int)(threadIdx.x / 16);
  if (ctiles == 0) { /* a shard of padding alone */
    for (int r = 0; r < 4; r++)
      for (long long c = tx; c < s.C && r0 + ty * 4 + r < s.rows; c += 16) dx[(r0 + ty * 4 + r) * s.C + c] = 0.0f;
    return;
  }
  for (long long vt = 0; vt < ctiles; vt++) {
    float acc[4][4];
    hpdl_lmce_logits(x, w, s, r0, vt * T, acc);
    hpdl_lmce_g(acc, t, lse, dy, s, r0, vt * T, G);
    for (long long c0 = 0; c0 < s.C; c0 += T) {
      for (int e = (int)threadIdx.x; e < T * T; e += HPDL_LMCE_THREADS) {
        /* a warp's loads along w's contiguous axis */
        const int v = s.w_rows ? e / (int)T : e % (int)T, cc = s.w_rows ? e % (int)T : e / (int)T;
        const long long gv = vt * T + v, gc = c0 + cc;
        Ws[v][cc] = gv < s.V && gc < s.C ? hpdl_lmce_w(w, s, gc, gv) : 0.0f;
      }
#ifndef HPDL_MUTATE_LMCE_BARRIER /* the deliberate race of the test cuda.emu.mutation_fused_ce */
      __syncthreads(); /* lmce: g and the W tile are in place */
#endif
      for (int r = 0; r < 4; r++) {
        const long long row = r0 + ty * 4 + r;
        for (int c = 0; c < 4; c++) {
          const long long col = c0 + tx + 16 * c;
          float a = 0.0f;
          for (int v = 0; v < HPDL_LMCE_TILE; v++) a = fmaf(G[ty * 4 + r][v], Ws[v][tx + 16 * c], a);
          if (row < s.rows && col < s.C) dx[row * s.C + col] = (vt == 0 ? 0.0f : dx[row * s.C + col]) + a;
        }
      }
      __syncthreads(); /* lmce: the W tile is read before the next */
    }
  }
}

template <class TX, class TW, class TT>
static __device__ void hpdl_lmce_dw(const TX *__restrict__ x, const TW *__restrict__ w, const TT *__restrict__ t,
                                    const float *__restrict__ lse, const float *__restrict__ dy, float *__restrict__ dw,
                                    const hpdl_lmce_shape s, long long blk) {
  const long long T = HPDL_LMCE_TILE, v0 = blk * T, rtiles = (s.rows + T - 1) / T;
  __shared__ float G[HPDL_LMCE_TILE][HPDL_LMCE_TILE + 1];  /* g [row][v] */
  __shared__ float Xs[HPDL_LMCE_TILE][HPDL_LMCE_TILE + 1]; /* x [row][c] */
  const int tx = (int)(threadIdx.x % 16), ty = (int)(threadIdx.x / 16);
  const bool pad = v0 >= s.V; /* columns of padding alone: zeros */
  for (long long rt = 0; rt < (pad ? 1 : rtiles); rt++) {
    if (!pad) {
      float acc[4][4];
      hpdl_lmce_logits(x, w, s, rt * T, v0, acc);
      hpdl_lmce_g(acc, t, lse, dy, s, rt * T, v0, G);
    }
    for (long long c0 = 0; c0 < s.C; c0 += T) {
      for (int e = (int)threadIdx.x; e < T * T && !pad; e += HPDL_LMCE_THREADS) {
        const int r = e / (int)T, cc = e % (int)T;
        const long long row = rt * T + r, gc = c0 + cc;
        Xs[r][cc] = row < s.rows && gc < s.C ? hpdl_lmce_f(x[row * s.C + gc]) : 0.0f;
      }
      __syncthreads(); /* lmce: g and the x tile are in place */
      for (int i = 0; i < 4; i++) {
        const long long c = c0 + ty * 4 + i;
        for (int j = 0; j < 4; j++) {
          const long long v = v0 + tx + 16 * j;
          float a = 0.0f;
          if (!pad)
            for (int r = 0; r < HPDL_LMCE_TILE; r++) a = fmaf(Xs[r][ty * 4 + i], G[r][tx + 16 * j], a);
          if (c < s.C && v < s.Vw) {
            const long long at = s.w_rows ? v * s.C + c : c * s.ldw + v;
            dw[at] = (rt == 0 ? 0.0f : dw[at]) + a;
          }
        }
      }
      __syncthreads(); /* lmce: the x tile is read before the next */
    }
  }
}

#endif /* device code */
#endif
