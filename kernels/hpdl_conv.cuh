/* kernels/hpdl_conv.cuh - 2-D convolution and pooling over NCHW tensors on the GPU in fp32
 * (kernels/README.md, "Convolution and pooling"): the IR ops CONV2D, CONV2D_BWD_DATA,
 * CONV2D_BWD_FILTER, POOL2D and POOL2D_BWD with core/conv.c's semantics (core/conv.h,
 * core/ir_ops.h):
 *
 *   x [N, C, H, W], w [O, C/G, KH, KW], y [N, O, Ho, Wo], Ho = (H + 2 ph - dh (KH - 1) - 1) / sh + 1
 *   y[n, o, i, j] = sum over c, ki, kj of x[n, (o / (O/G)) C/G + c, i sh - ph + ki dh, j sw - pw + kj dw]
 *                   w[o, c, ki, kj]   (0 outside the image)
 *   dx = the adjoint in x (CONV2D_BWD_DATA), dw = the adjoint in w (CONV2D_BWD_FILTER);
 *   pooling: max (the window's FIRST max in row-major order; a NaN wins, the first one),
 *   avg (the padding counted, PyTorch's count_include_pad = True), adaptive avg / max
 *   (cell i covers [floor(i H / Ho), ceil((i + 1) H / Ho))); the backward sends dy to that
 *   max, or dy / count to every input of the window.
 *
 * One file, three readers (as hpdl_optim.cuh): plain C11 / C++ on the host sees the shapes
 * and the launch rule (hpdl_conv_plan, for the code generator and the tests); nvcc, NVRTC
 * and the emulation (kernels/cuda_emu.h) also the device functions, which a generated
 * `extern "C" __global__ __launch_bounds__(256)` kernel calls:
 *
 *   hpdl_conv_fwd<BM, BN, TM, TN>(x, w, y, shape, blk)
 *   hpdl_conv_bwd_data<BM, BN, TM, TN>(dy, w, dx, shape, blk)
 *   hpdl_conv_bwd_filter<BM, BN, TM, TN>(x, dy, out, shape, chunk, blk)
 *       one block of HPDL_CONV_THREADS per tile (blk < hpdl_conv_plan's grid; a kernel
 *       walks blk = blockIdx.x, + gridDim.x, ... block-uniformly, so any grid works);
 *   hpdl_conv_sum_splits(part, dw, n, splits)     grid-stride, a thread an element
 *   hpdl_pool_fwd(x, y, pool shape)              grid-stride, a thread an output
 *   hpdl_pool_bwd(x, dy, dx, pool shape)         grid-stride, a thread an INPUT element
 *
 * Convolutions are implicit GEMMs (no im2col buffer, no cuDNN), per group g:
 *
 *   op            rows (M)   columns (N)          reduction (K)           A          B
 *   fwd           O/G  (o)   N Ho Wo (n, i, j)    C/G KH KW (c, ki, kj)   w          x gathered
 *   bwd_data      C/G  (c)   N H W   (n, h, w)    O/G KH KW (o, ki, kj)   w          dy gathered
 *   bwd_filter    O/G  (o)   C/G KH KW (c,ki,kj)  N Ho Wo (n, i, j)       dy         x gathered
 *
 * A block owns a BM x BN tile of the result; the reduction goes through shared memory
 * HPDL_CONV_BK at a time (A as [BK][BM + 1], B as [BK][BN]); each thread keeps TM x TN
 * results in registers (rows ty TM .. ty TM + TM - 1, columns tx, tx + BN / TN, ...: a
 * warp's stores are consecutive), fp32 fused multiply-adds (fmaf: the same bits in the
 * emulation) in ascending reduction order. The data gradient is a gather: input element
 * (n, c, h, w) sums the taps (o, ki, kj) that reach it (h + ph - ki dh a multiple of sh
 * whose quotient is an output row, likewise w), the others read as 0, so no scatter and no
 * atomics. The filter gradient reduces over N Ho Wo: hpdl_conv_plan cuts that reduction
 * into `splits` chunks fixed by the shape alone; each block writes its chunk's partial tile
 * (splits = 1: dw itself), and hpdl_conv_sum_splits adds the partials in split order. No
 * float atomics anywhere: the same bits every run, on every GPU, under every scheduling.
 * Not bit for bit core/conv.c (another summation order; within fp32 rounding).
 *
 * The tile tiers (HPDL_CONV_TIER, by the GEMM's rows M: a depthwise convolution has M = 1,
 * a 1 x 1 convolution a reduction of C/G), all 256 threads:
 *
 *   M          BM x BN     TM x TN   static shared memory
 *   33 ..      64 x 64     4 x 4      8,256 bytes
 *   17 .. 32   32 x 64     2 x 4      6,208
 *   5 .. 16    16 x 128    2 x 4      9,280
 *   2 .. 4      4 x 256    1 x 4     16,704
 *   1           1 x 256    1 x 1     16,512
 *
 * Pooling: a thread per output (forward) reads its window; a thread per input element
 * (backward) visits the output cells whose windows contain it in row-major order, for max
 * recomputing each window's first max (the IR's POOL2D_BWD takes x, not an argmax), and
 * sums what reaches it: a gather, no atomics.
 *
 * Limits (hpdl_conv_plan refuses beyond them): every size, N Ho Wo, N H W, C/G KH KW and
 * O/G KH KW below 2^31 - 256 (element offsets are 64-bit). Not yet: tensor cores, bf16 / fp16,
 * vector or asynchronous loads, double buffering; the data gradient of a strided
 * convolution reads sh sw times the taps it needs (the others are zeros). Correctness and
 * determinism first. */
#ifndef HPDL_CONV_CUH
#define HPDL_CONV_CUH

/* A convolution's shape: core/conv.h's ConvShape in 32-bit sizes. */
typedef struct hpdl_conv_shape {
  int N, C, H, W;   /* input */
  int O, KH, KW;    /* filters */
  int Ho, Wo;       /* output */
  int sh, sw, ph, pw, dh, dw, G;
} hpdl_conv_shape;

/* A pooling's shape: core/conv.h's PoolShape; mode is its PoolMode (0 max, 1 avg with the
 * padding counted, 2 adaptive avg, 3 adaptive max; adaptive: no window, stride, padding). */
typedef struct hpdl_pool_shape {
  int N, C, H, W, Ho, Wo;
  int kh, kw, sh, sw, ph, pw;
  int mode;
} hpdl_pool_shape;

enum { HPDL_POOL_MAX = 0, HPDL_POOL_AVG = 1, HPDL_POOL_ADAPTIVE_AVG = 2, HPDL_POOL_ADAPTIVE_MAX = 3 };
enum { HPDL_CONV_FWD = 0, HPDL_CONV_BWD_DATA = 1, HPDL_CONV_BWD_FILTER = 2 };

#define HPDL_CONV_THREADS 256
/* The convolution kernels' __launch_bounds__(HPDL_CONV_THREADS, HPDL_CONV_MIN_BLOCKS): at
 * most 128 registers. Under __launch_bounds__(256) alone ptxas caps them at 64, where the
 * 4 x 4 tiles spill (20 to 52 bytes on sm_90); at 2 blocks none spills (NVRTC 13: 56 to
 * 112 registers, kernels/README.md). */
#define HPDL_CONV_MIN_BLOCKS 2
/* The pooling kernels' and the split sum's: at most 64 registers (48 used); under
 * __launch_bounds__(256) alone ptxas gives the pooling backward 40 and it spills. */
#define HPDL_POOL_MIN_BLOCKS 4
#define HPDL_CONV_BK 16 /* the reduction a shared-memory step */
/* The filter gradient's split of N Ho Wo: enough blocks to fill a large GPU
 * (HPDL_CONV_TARGET_BLOCKS), at least HPDL_CONV_MIN_SPLIT reductions a split, at most
 * HPDL_CONV_MAX_SPLITS of them and HPDL_CONV_SCRATCH_FLOATS floats of partials (the module
 * keeps them in a static __device__ array per kernel). */
#define HPDL_CONV_TARGET_BLOCKS 512
#define HPDL_CONV_MIN_SPLIT 512
#define HPDL_CONV_MAX_SPLITS 64
#define HPDL_CONV_SCRATCH_FLOATS (1LL << 20)

#define HPDL_CONV_TIER(M) ((M) > 32 ? 0 : (M) > 16 ? 1 : (M) > 4 ? 2 : (M) > 1 ? 3 : 4)
#define HPDL_CONV_BM(t) ((t) == 0 ? 64 : (t) == 1 ? 32 : (t) == 2 ? 16 : (t) == 3 ? 4 : 1)
#define HPDL_CONV_BN(t) ((t) <= 1 ? 64 : (t) == 2 ? 128 : 256)
#define HPDL_CONV_TM(t) ((t) == 0 ? 4 : (t) <= 2 ? 2 : 1)
#define HPDL_CONV_TN(t) ((t) == 4 ? 1 : 4)
#define HPDL_CONV_CDIV(a, b) (((a) + (b) - 1) / (b))

/* ------------------------------------------------------------------ the launch rule */
#if !defined(__CUDACC_RTC__)

/* static inline, and no warning where a file includes the header and calls none of it */
#if defined(__GNUC__) || defined(__clang__)
#define HPDL_CONV_HOST static inline __attribute__((unused))
#else
#define HPDL_CONV_HOST static inline
#endif

/* One convolution's launches. */
typedef struct hpdl_conv_launch {
  int bm, bn, tm, tn;             /* the templates' arguments */
  long long rows, cols, red;      /* the GEMM of a group: M, N, K (the table above) */
  long long grid;                 /* blocks of the main launch (one a tile, and a split) */
  int splits;                     /* filter gradient: chunks of the reduction (else 1) */
  long long chunk;                /* reductions a split (a multiple of HPDL_CONV_BK) */
  long long scratch_floats;       /* splits > 1: the partials, [splits, O, C/G, KH, KW] */
  long long outputs;              /* elements of the result */
} hpdl_conv_launch;

/* The output length of one axis, as core/conv.c's conv_out_len; -1 when invalid. */
HPDL_CONV_HOST long long hpdl_conv_out_len(long long in, long long k, long long st, long long pad, long long dil) {
  if (in < 1 || k < 1 || st < 1 || pad < 0 || dil < 1) return -1;
  long long room = in + 2 * pad - (dil * (k - 1) + 1);
  return room < 0 ? -1 : room / st + 1;
}

/* Fills *L for op (HPDL_CONV_*) over shape s; -1 (L untouched) when the shape is not a
 * valid convolution (sizes, groups, Ho / Wo as the formula gives them) or a count the
 * kernels keep in 32 bits reaches 2^31 - 256. */
HPDL_CONV_HOST int hpdl_conv_plan(int op, const hpdl_conv_shape *s, hpdl_conv_launch *L) {
  const long long lim = 0x7fffffffLL - HPDL_CONV_THREADS; /* a tile's last column and step stay in an int */
  if (op < HPDL_CONV_FWD || op > HPDL_CONV_BWD_FILTER) return -1;
  if (s->N < 1 || s->C < 1 || s->O < 1 || s->G < 1 || s->C % s->G || s->O % s->G) return -1;
  if (hpdl_conv_out_len(s->H, s->KH, s->sh, s->ph, s->dh) != s->Ho ||
      hpdl_conv_out_len(s->W, s->KW, s->sw, s->pw, s->dw) != s->Wo)
    return -1;
  const long long Cg = s->C / s->G, Og = s->O / s->G, taps = (long long)s->KH * s->KW;
  const long long P = (long long)s->Ho * s->Wo, HW = (long long)s->H * s->W;
  if (Cg * taps > lim || Og * taps > lim || s->N * P > lim || s->N * HW > lim) return -1;
  hpdl_conv_launch x;
  x.rows = op == HPDL_CONV_BWD_DATA ? Cg : Og;
  x.cols = op == HPDL_CONV_FWD ? s->N * P : op == HPDL_CONV_BWD_DATA ? s->N * HW : Cg * taps;
  x.red = op == HPDL_CONV_FWD ? Cg * taps : op == HPDL_CONV_BWD_DATA ? Og * taps : s->N * P;
  const int t = HPDL_CONV_TIER(x.rows);
  x.bm = HPDL_CONV_BM(t);
  x.bn = HPDL_CONV_BN(t);
  x.tm = HPDL_CONV_TM(t);
  x.tn = HPDL_CONV_TN(t);
  const long long tiles = (long long)s->G * HPDL_CONV_CDIV(x.rows, x.bm) * HPDL_CONV_CDIV(x.cols, x.bn);
  x.splits = 1;
  x.chunk = HPDL_CONV_CDIV(x.red, HPDL_CONV_BK) * HPDL_CONV_BK;
  x.scratch_floats = 0;
  x.outputs = op == HPDL_CONV_FWD ? s->N * s->O * P : op == HPDL_CONV_BWD_DATA ? s->N * s->C * HW : s->O * Cg * taps;
  if (op == HPDL_CONV_BWD_FILTER) {
    long long S = HPDL_CONV_CDIV(HPDL_CONV_TARGET_BLOCKS, tiles);
    if (S > x.red / HPDL_CONV_MIN_SPLIT) S = x.red / HPDL_CONV_MIN_SPLIT;
    if (S > HPDL_CONV_MAX_SPLITS) S = HPDL_CONV_MAX_SPLITS;
    if (S * x.outputs > HPDL_CONV_SCRATCH_FLOATS) S = HPDL_CONV_SCRATCH_FLOATS / x.outputs;
    if (S > 1) {
      x.chunk = HPDL_CONV_CDIV(HPDL_CONV_CDIV(x.red, S), HPDL_CONV_BK) * HPDL_CONV_BK;
      x.splits = (int)HPDL_CONV_CDIV(x.red, x.chunk); /* no empty split */
    }
    if (x.splits > 1) x.scratch_floats = x.splits * x.outputs;
  }
  x.grid = tiles * x.splits;
  if (x.grid > lim) return -1;
  *L = x;
  return 0;
}
#endif /* !__CUDACC_RTC__ */

/* ------------------------------------------------------------------ device code */
#if defined(__CUDACC__) || defined(HPDL_EMU)

/* acc += A B over reductions [k0, k1) of one tile: the loader stages A (ld.a(m, k), row m
 * of the tile) and B (ld.b(k), the thread's own column t % BN, whose index arithmetic it
 * did once) into shared memory HPDL_CONV_BK at a time; out-of-range rows, columns and
 * reductions read as 0. Every thread of the block calls it with the same k0, k1. */
template <int BM, int BN, int TM, int TN, class Ld>
static __device__ __forceinline__ void hpdl_conv_tile(const Ld &ld, int k0, int k1, float (&acc)[TM][TN]) {
  static_assert((BM / TM) * (BN / TN) == HPDL_CONV_THREADS && BN <= HPDL_CONV_THREADS &&
                    HPDL_CONV_THREADS % BN == 0 && BM % TM == 0 && BN % TN == 0,
                "a conv tile is HPDL_CONV_THREADS threads, each TM x TN results, and a B column a thread");
  __shared__ float As[HPDL_CONV_BK][BM + 1]; /* + 1: the A loads' rows fall in different banks */
  __shared__ float Bs[HPDL_CONV_BK][BN];
  const int t = (int)threadIdx.x, tx = t % (BN / TN), ty = t / (BN / TN);
  for (int kb = k0; kb < k1; kb += HPDL_CONV_BK) {
    for (int e = t; e < BM * HPDL_CONV_BK; e += HPDL_CONV_THREADS) {
      const int m = e / HPDL_CONV_BK, kk = e % HPDL_CONV_BK; /* a row's reductions are adjacent in memory */
      As[kk][m] = kb + kk < k1 ? ld.a(m, kb + kk) : 0.0f;
    }
    for (int kk = t / BN; kk < HPDL_CONV_BK; kk += HPDL_CONV_THREADS / BN)
      Bs[kk][t % BN] = kb + kk < k1 ? ld.b(kb + kk) : 0.0f;
    __syncthreads(); /* igemm: the tile is loaded */
#ifdef __CUDACC__
#pragma unroll 4
#endif
    for (int kk = 0; kk < HPDL_CONV_BK; kk++) {
      float a[TM], b[TN];
      for (int r = 0; r < TM; r++) a[r] = As[kk][ty * TM + r];
      for (int c = 0; c < TN; c++) b[c] = Bs[kk][tx + c * (BN / TN)];
      for (int r = 0; r < TM; r++)
        for (int c = 0; c < TN; c++) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
    }
    __syncthreads(); /* igemm: the tile is read before the next is loaded */
  }
}

/* x through tap k = (c, ki, kj) for a column's output position (n, i, j): the forward's B
 * and the filter gradient's (there k runs over n, i, j instead, see below). */
static __device__ __forceinline__ float hpdl_conv_x_at(const float *__restrict__ xc, const hpdl_conv_shape &s, int c,
                                                       int hi, int wi) {
  return (unsigned)hi < (unsigned)s.H && (unsigned)wi < (unsigned)s.W ? xc[((long long)c * s.H + hi) * s.W + wi] : 0.0f;
}

/* The forward's operands: A = the group's filters [O/G, C/G KH KW] (rows from m0), B = x
 * gathered through the taps, the thread's column an output position. */
struct hpdl_conv_fwd_ld {
  const float *__restrict__ w; /* row m0 of the group's filters */
  const float *__restrict__ xc; /* the column's image, the group's first channel */
  hpdl_conv_shape s;
  int rows, K, hb, wb; /* valid rows of the tile; the reduction; the column's window corner */
  bool ok;             /* the column is an output position */
  __device__ float a(int m, int k) const { return m < rows ? w[(long long)m * K + k] : 0.0f; }
  __device__ float b(int k) const {
    if (!ok) return 0.0f;
    const int taps = s.KH * s.KW, c = k / taps, r = k - c * taps, ki = r / s.KW, kj = r - ki * s.KW;
    return hpdl_conv_x_at(xc, s, c, hb + ki * s.dh, wb + kj * s.dw);
  }
};

/* y = conv2d(x, w): a BM x BN tile of output channels x output positions of one group. */
template <int BM, int BN, int TM, int TN>
static __device__ void hpdl_conv_fwd(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y,
                                     const hpdl_conv_shape s, long long blk) {
  const int Cg = s.C / s.G, Og = s.O / s.G, K = Cg * s.KH * s.KW, P = s.Ho * s.Wo;
  const long long cols = (long long)s.N * P;
  const long long nts = (cols + BN - 1) / BN, mts = (Og + BM - 1) / BM;
  const long long nt = blk % nts, mt = blk / nts % mts, g = blk / nts / mts;
  const int m0 = (int)mt * BM, t = (int)threadIdx.x;
  hpdl_conv_fwd_ld ld;
  ld.s = s;
  ld.K = K;
  ld.rows = Og - m0 < BM ? Og - m0 : BM;
  ld.w = w + ((long long)g * Og + m0) * K;
  const long long col = nt * BN + t % BN;
  ld.ok = col < cols;
  const int n = ld.ok ? (int)(col / P) : 0, p = ld.ok ? (int)(col % P) : 0;
  ld.hb = p / s.Wo * s.sh - s.ph; /* fwd: the window's top row */
  ld.wb = p % s.Wo * s.sw - s.pw;
  ld.xc = x + ((long long)n * s.C + g * Cg) * s.H * s.W; /* fwd: the group's first input channel */
  float acc[TM][TN];
  for (int r = 0; r < TM; r++)
    for (int c = 0; c < TN; c++) acc[r][c] = 0.0f;
  hpdl_conv_tile<BM, BN, TM, TN>(ld, 0, K, acc);
  const int tx = t % (BN / TN), ty = t / (BN / TN);
  for (int c = 0; c < TN; c++) {
    const long long oc = nt * BN + tx + c * (BN / TN);
    if (oc >= cols) continue;
    const long long on = oc / P, op = oc % P;
    for (int r = 0; r < TM; r++) {
      const int m = m0 + ty * TM + r;
      if (m < Og) y[(on * s.O + g * Og + m) * P + op] = acc[r][c];
    }
  }
}

/* The data gradient's operands: A = w read as [C/G, O/G KH KW] (row c: w[o, c, ki, kj] over
 * o, ki, kj of the group), B = dy gathered: the column an input position (n, h, w), tap
 * (o, ki, kj) reading dy[n, o, i, j] when h + ph - ki dh = i sh (likewise w), else 0. */
struct hpdl_conv_bwd_data_ld {
  const float *__restrict__ w;   /* the group's filters, at input channel c0 */
  const float *__restrict__ dyc; /* the column's image of dy, the group's first channel */
  hpdl_conv_shape s;
  int rows, Cg, hp, wp; /* valid rows; channels a group; the column's h + ph, w + pw */
  bool ok;
  __device__ float a(int m, int k) const {
    const int taps = s.KH * s.KW, o = k / taps;
    return m < rows ? w[((long long)o * Cg + m) * taps + (k - o * taps)] : 0.0f;
  }
  __device__ float b(int k) const {
    if (!ok) return 0.0f;
    const int taps = s.KH * s.KW, o = k / taps, r = k - o * taps, ki = r / s.KW, kj = r - ki * s.KW;
    const int th = hp - ki * s.dh, tw = wp - kj * s.dw; /* bwd_data: i sh, j sw when a tap reaches */
    if (th < 0 || tw < 0 || th % s.sh || tw % s.sw) return 0.0f;
    const int i = th / s.sh, j = tw / s.sw;
    return i < s.Ho && j < s.Wo ? dyc[((long long)o * s.Ho + i) * s.Wo + j] : 0.0f;
  }
};

/* dx = conv2d_bwd_data(dy, w): a BM x BN tile of input channels x input positions. */
template <int BM, int BN, int TM, int TN>
static __device__ void hpdl_conv_bwd_data(const float *__restrict__ dy, const float *__restrict__ w,
                                          float *__restrict__ dx, const hpdl_conv_shape s, long long blk) {
  const int Cg = s.C / s.G, Og = s.O / s.G, K = Og * s.KH * s.KW, HW = s.H * s.W;
  const long long cols = (long long)s.N * HW;
  const long long nts = (cols + BN - 1) / BN, mts = (Cg + BM - 1) / BM;
  const long long nt = blk % nts, mt = blk / nts % mts, g = blk / nts / mts;
  const int m0 = (int)mt * BM, t = (int)threadIdx.x;
  hpdl_conv_bwd_data_ld ld;
  ld.s = s;
  ld.Cg = Cg;
  ld.rows = Cg - m0 < BM ? Cg - m0 : BM;
  ld.w = w + (long long)g * Og * Cg * s.KH * s.KW + (long long)m0 * s.KH * s.KW;
  const long long col = nt * BN + t % BN;
  ld.ok = col < cols;
  const int n = ld.ok ? (int)(col / HW) : 0, p = ld.ok ? (int)(col % HW) : 0;
  ld.hp = p / s.W + s.ph; /* bwd_data: the padded row */
  ld.wp = p % s.W + s.pw;
  ld.dyc = dy + ((long long)n * s.O + g * Og) * s.Ho * s.Wo; /* bwd_data: the group's first output channel */
  float acc[TM][TN];
  for (int r = 0; r < TM; r++)
    for (int c = 0; c < TN; c++) acc[r][c] = 0.0f;
  hpdl_conv_tile<BM, BN, TM, TN>(ld, 0, K, acc);
  const int tx = t % (BN / TN), ty = t / (BN / TN);
  for (int c = 0; c < TN; c++) {
    const long long oc = nt * BN + tx + c * (BN / TN);
    if (oc >= cols) continue;
    const long long on = oc / HW, op = oc % HW;
    for (int r = 0; r < TM; r++) {
      const int m = m0 + ty * TM + r;
      if (m < Cg) dx[(on * s.C + g * Cg + m) * HW + op] = acc[r][c];
    }
  }
}

/* The filter gradient's operands: A = dy as [O/G, N Ho Wo] (row o, reduction r = (n, i, j)),
 * B = x gathered: the column a tap (c, ki, kj), reduction r reading x[n, c, i sh - ph + ki dh,
 * j sw - pw + kj dw]. */
struct hpdl_conv_bwd_filter_ld {
  const float *__restrict__ dy; /* the group's first output channel, row m0, image 0 */
  const float *__restrict__ xc; /* the group's first input channel + the column's c, image 0 */
  hpdl_conv_shape s;
  int rows, P, hoff, woff; /* valid rows; Ho Wo; the column's ki dh - ph, kj dw - pw */
  bool ok;
  __device__ float a(int m, int k) const {
    const int n = k / P;
    return m < rows ? dy[((long long)n * s.O + m) * P + (k - n * P)] : 0.0f;
  }
  __device__ float b(int k) const {
    if (!ok) return 0.0f;
    const int n = k / P, p = k - n * P, i = p / s.Wo, j = p - i * s.Wo;
    return hpdl_conv_x_at(xc + (long long)n * s.C * s.H * s.W, s, 0, i * s.sh + hoff, j * s.sw + woff);
  }
};

/* The filter gradient of one BM x BN tile of (output channel) x (c, ki, kj) over split
 * `blk / tiles` of N Ho Wo (reductions [split chunk, min(N Ho Wo, (split + 1) chunk))):
 * written to out at [split, O, C/G, KH, KW] (hpdl_conv_plan's splits; with one split out
 * is dw). */
template <int BM, int BN, int TM, int TN>
static __device__ void hpdl_conv_bwd_filter(const float *__restrict__ x, const float *__restrict__ dy,
                                            float *__restrict__ out, const hpdl_conv_shape s, long long chunk,
                                            long long blk) {
  const int Cg = s.C / s.G, Og = s.O / s.G, taps = s.KH * s.KW, Kt = Cg * taps, P = s.Ho * s.Wo;
  const long long red = (long long)s.N * P;
  const long long nts = (Kt + BN - 1) / BN, mts = (Og + BM - 1) / BM, tiles = nts * mts * s.G;
  const long long split = blk / tiles, tb = blk % tiles;
  const long long nt = tb % nts, mt = tb / nts % mts, g = tb / nts / mts;
  const int m0 = (int)mt * BM, t = (int)threadIdx.x;
  hpdl_conv_bwd_filter_ld ld;
  ld.s = s;
  ld.P = P;
  ld.rows = Og - m0 < BM ? Og - m0 : BM;
  ld.dy = dy + ((long long)g * Og + m0) * P;
  const int col = (int)(nt * BN) + t % BN;
  ld.ok = col < Kt;
  const int c = ld.ok ? col / taps : 0, r = ld.ok ? col - c * taps : 0, ki = r / s.KW, kj = r - ki * s.KW;
  ld.hoff = ki * s.dh - s.ph; /* bwd_filter: the tap's row offset */
  ld.woff = kj * s.dw - s.pw;
  ld.xc = x + ((long long)g * Cg + c) * s.H * s.W; /* bwd_filter: the group's input channel c */
  const long long k0 = split * chunk, k1 = k0 + chunk < red ? k0 + chunk : red; /* the split's reductions */
  float acc[TM][TN];
  for (int rr = 0; rr < TM; rr++)
    for (int cc = 0; cc < TN; cc++) acc[rr][cc] = 0.0f;
  hpdl_conv_tile<BM, BN, TM, TN>(ld, (int)k0, (int)k1, acc);
  const int tx = t % (BN / TN), ty = t / (BN / TN);
  float *o = out + split * (long long)s.O * Kt;
  for (int cc = 0; cc < TN; cc++) {
    const int oc = (int)(nt * BN) + tx + cc * (BN / TN);
    if (oc >= Kt) continue;
    for (int rr = 0; rr < TM; rr++) {
      const int m = m0 + ty * TM + rr;
      if (m < Og) o[(g * Og + m) * (long long)Kt + oc] = acc[rr][cc];
    }
  }
}

/* dw[e] = the splits' partials of element e added in split order (n = O C/G KH KW). */
static __device__ void hpdl_conv_sum_splits(const float *__restrict__ part, float *__restrict__ dw, long long n,
                                            int splits) {
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    float v = part[e];
    for (int q = 1; q < splits; q++) v += part[q * n + e];
    dw[e] = v;
  }
}

/* ---- pooling ---- */

/* The window of output cell i along an axis (0: rows, 1: columns): [lo, hi) inside the
 * input and the divisor of an average, as core/conv.c's pool_window. */
static __device__ __forceinline__ void hpdl_pool_window(const hpdl_pool_shape &s, int axis, int i, int &lo, int &hi,
                                                        int &count) {
  const int L = axis ? s.W : s.H, out = axis ? s.Wo : s.Ho;
  if (s.mode == HPDL_POOL_ADAPTIVE_AVG || s.mode == HPDL_POOL_ADAPTIVE_MAX) {
    lo = (int)((long long)i * L / out);
    hi = (int)(((long long)(i + 1) * L + out - 1) / out); /* adaptive: the ceiling */
    count = hi - lo;
    return;
  }
  const int k = axis ? s.kw : s.kh, st = axis ? s.sw : s.sh, p = axis ? s.pw : s.ph;
  const int a = i * st - p;
  const int b = a + k < L + p ? a + k : L + p;
  count = b - a; /* pool: the padding counted */
  lo = a < 0 ? 0 : a;
  hi = b > L ? L : b;
}

static __device__ __forceinline__ bool hpdl_pool_is_max(const hpdl_pool_shape &s) {
  return s.mode == HPDL_POOL_MAX || s.mode == HPDL_POOL_ADAPTIVE_MAX;
}

/* The index in the plane of window (i, j)'s first max (a NaN beats any number, the first
 * NaN any later one; conv.c's rule), or -1 for an empty window. */
static __device__ __forceinline__ int hpdl_pool_argmax(const float *__restrict__ img, const hpdl_pool_shape &s, int h0,
                                                       int h1, int w0, int w1) {
  int at = -1;
  float best = 0.0f;
  for (int h = h0; h < h1; h++)
    for (int w = w0; w < w1; w++) {
      const float v = img[(long long)h * s.W + w];
      if (at < 0 || v > best || (v != v && best == best)) { /* pool: the first max wins */
        at = h * s.W + w;
        best = v;
      }
    }
  return at;
}

/* y = pool2d(x): a thread per output element. */
static __device__ void hpdl_pool_fwd(const float *__restrict__ x, float *__restrict__ y, const hpdl_pool_shape s) {
  const long long n = (long long)s.N * s.C * s.Ho * s.Wo;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long plane = e / ((long long)s.Ho * s.Wo);
    const int q = (int)(e - plane * s.Ho * s.Wo), i = q / s.Wo, j = q - i * s.Wo;
    int h0, h1, ch, w0, w1, cw;
    hpdl_pool_window(s, 0, i, h0, h1, ch);
    hpdl_pool_window(s, 1, j, w0, w1, cw);
    const float *img = x + plane * s.H * s.W;
    float v = 0.0f;
    if (hpdl_pool_is_max(s)) {
      const int at = hpdl_pool_argmax(img, s, h0, h1, w0, w1);
      v = at >= 0 ? img[at] : 0.0f;
    } else if (h0 < h1 && w0 < w1 && ch * cw > 0) {
      float acc = 0.0f;
      for (int h = h0; h < h1; h++)
        for (int w = w0; w < w1; w++) acc += img[(long long)h * s.W + w];
      v = acc / (float)(ch * cw);
    }
    y[e] = v;
  }
}

/* The output cells along an axis whose windows may hold input index h: [*i0, *i1]
 * (each is checked against its window too). */
static __device__ __forceinline__ void hpdl_pool_cells(const hpdl_pool_shape &s, int axis, int h, int &i0, int &i1) {
  const int L = axis ? s.W : s.H, out = axis ? s.Wo : s.Ho;
  if (s.mode == HPDL_POOL_ADAPTIVE_AVG || s.mode == HPDL_POOL_ADAPTIVE_MAX) {
    i0 = (int)((long long)h * out / L);
    i1 = (int)(((long long)(h + 1) * out + L - 1) / L) - 1;
  } else {
    const int k = axis ? s.kw : s.kh, st = axis ? s.sw : s.sh, p = axis ? s.pw : s.ph;
    const int lo = h + p - k + 1; /* a window [i st - p, i st - p + k) holds h */
    i0 = lo <= 0 ? 0 : (lo + st - 1) / st;
    i1 = (h + p) / st;
  }
  if (i0 < 0) i0 = 0;
  if (i1 > out - 1) i1 = out - 1;
}

/* dx = pool2d_bwd(x, dy): a thread per input element gathers, in row-major order of the
 * output cells, dy of each cell whose window holds it: all of it where it is the window's
 * first max, dy / count for an average. */
static __device__ void hpdl_pool_bwd(const float *__restrict__ x, const float *__restrict__ dy, float *__restrict__ dx,
                                     const hpdl_pool_shape s) {
  const long long n = (long long)s.N * s.C * s.H * s.W;
  const bool mx = hpdl_pool_is_max(s);
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long plane = e / ((long long)s.H * s.W);
    const int q = (int)(e - plane * s.H * s.W), h = q / s.W, w = q - h * s.W;
    const float *img = x + plane * s.H * s.W, *g = dy + plane * s.Ho * s.Wo;
    int i0, i1, j0, j1;
    hpdl_pool_cells(s, 0, h, i0, i1);
    hpdl_pool_cells(s, 1, w, j0, j1);
    float acc = 0.0f;
    for (int i = i0; i <= i1; i++) {
      int h0, h1, ch;
      hpdl_pool_window(s, 0, i, h0, h1, ch);
      if (h < h0 || h >= h1) continue;
      for (int j = j0; j <= j1; j++) {
        int w0, w1, cw;
        hpdl_pool_window(s, 1, j, w0, w1, cw);
        if (w < w0 || w >= w1) continue;
        const float gv = g[(long long)i * s.Wo + j];
        if (!mx) acc += gv / (float)(ch * cw);
        else if (hpdl_pool_argmax(img, s, h0, h1, w0, w1) == q) acc += gv;
      }
    }
    dx[e] = acc;
  }
}

#endif /* __CUDACC__ || HPDL_EMU */
#endif /* HPDL_CONV_CUH */
