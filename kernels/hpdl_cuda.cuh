/* hpdl_cuda.cuh - device functions the generated CUDA C includes
 * (compiler/codegen/codegen_cuda.c).
 *
 * The same text compiles under NVRTC for the GPU and, through the emulation
 * harness (kernels/cuda_emu.h, given with -include), as C++ for the CPU, so
 * it uses only what the harness defines. The math follows the CPU back end
 * and the reference executor (core/interp.c) rule for rule: the tanh form of
 * GELU with the same constants, powers by squaring for small integer
 * exponents, integers truncated toward zero. Accumulation is in fp32. */
#ifndef HPDL_CUDA_CUH
#define HPDL_CUDA_CUH

#define HPDL_GELU_K 0.79788456080286535588f /* sqrt(2 / pi) */
#define HPDL_GELU_C 0.044715f
#ifdef __CUDACC__
#define HPDL_NEG_INF __int_as_float(0xff800000) /* NVRTC has no math.h: -inf by its bits */
#else
#define HPDL_NEG_INF (-__builtin_huge_valf())
#endif

/* What every generated kernel takes first, by value: the run's seed (dropout
 * masks), the layer a repeated block's graph runs as, this rank's index and
 * size in each process group (IrGroup order: dp, tp, pp, cp), and the device's
 * flags (HPDL_KCTX_*; runtime/device/device.h's DevKctx is the same struct). */
typedef struct {
  unsigned long long seed;
  long long layer;
  int rank[4];
  int size[4];
  int flags;
} hpdl_kctx;

/* flags: TF32 tensor cores allowed where fp32 is asked for (HPDL_GEMM_TF32=1): the
 * attention kernels then take one TF32 product where they would take three */
#define HPDL_KCTX_TF32 1

/* Context parallelism's zigzag layout: the global position of local row i
 * of rank r of `size`, each rank holding chunks r and 2 size - 1 - r of
 * length local / 2 (core/interp.c's rule). */
static __device__ __forceinline__ long long hpdl_zigzag_pos(long long r, long long size, long long local, long long i) {
  if (size <= 1) return r * local + i;
  long long h = local / 2;
  return i < h ? r * h + i : (2 * size - 1 - r) * h + (i - h);
}

/* The global position of column `col` of keys gathered around a ring of
 * `size` ranks (ring attention): block b = col / len came from rank r - b
 * and holds that rank's zigzag chunks; len = cols / size. */
static __device__ __forceinline__ long long hpdl_ring_col_pos(long long r, long long size, long long cols, long long col) {
  if (size <= 1) return col;
  long long len = cols / size, blk = col / len, owner = (r - blk + size) % size, i = col % len, h = len / 2;
  return i < h ? owner * h + i : (2 * size - 1 - owner) * h + (i - h);
}

/* 16-bit storage (mixed precision): bf16 and fp16 held as their bits,
 * converted with round to nearest even exactly as the CPU back end and
 * core/numeric/half.c do (so every back end stores the same bits). */
static __device__ __forceinline__ float hpdl_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

static __device__ __forceinline__ unsigned short hpdl_bf16_from_f32(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u); /* quiet NaN */
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float hpdl_f16_to_f32(unsigned short h) {
  unsigned x = h, sign = (x & 0x8000u) << 16, e = x & 0x7c00u, m = x & 0x3ffu;
  if (e == 0x7c00u) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-8f)); /* m 2^-24 */
  return __uint_as_float(sign | (((x & 0x7fffu) << 13) + 0x38000000u));
}

static __device__ __forceinline__ unsigned short hpdl_f16_from_f32(float f) {
  unsigned x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, u = x & 0x7fffffffu, h;
  if (u > 0x7f800000u) h = 0x7e00u | ((u >> 13) & 0x3ffu);          /* NaN, kept quiet */
  else if (u >= 0x47800000u) h = 0x7c00u;                            /* past the range: infinity */
  else if (u < 0x38800000u) h = __float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u; /* subnormal */
  else h = (u - 0x38000000u + 0xfffu + ((u >> 13) & 1u)) >> 13;      /* normal, a carry may give infinity */
  return (unsigned short)(sign | h);
}

static __device__ __forceinline__ float hpdl_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static __device__ __forceinline__ float hpdl_gelu(float x) {
  float u = HPDL_GELU_K * (x + HPDL_GELU_C * (x * (x * x)));
  return (0.5f * x) * (1.0f + tanhf(u));
}

static __device__ __forceinline__ float hpdl_gelu_grad(float x) {
  float x2 = x * x;
  float u = HPDL_GELU_K * (x + HPDL_GELU_C * (x * x2));
  float t = tanhf(u);
  float a = 0.5f * (1.0f + t);
  float b = (0.5f * x) * (1.0f - t * t);
  float c = HPDL_GELU_K * (1.0f + (3.0f * HPDL_GELU_C) * x2);
  return a + b * c;
}

/* x^p for a compile-time p: the CPU back end's rule (powf_const). */
static __device__ __forceinline__ float hpdl_pows(float x, float p) {
  if (p == 0.0f) return 1.0f;
  if (p == 0.5f) return sqrtf(x);
  if (p == -0.5f) return 1.0f / sqrtf(x);
  if (p == floorf(p) && fabsf(p) <= 16.0f) {
    int k = (int)fabsf(p);
    float r = 1.0f, base = x;
    int first = 1;
    while (k) {
      if (k & 1) {
        r = first ? base : r * base;
        first = 0;
      }
      k >>= 1;
      if (k) base = base * base;
    }
    return p < 0.0f ? 1.0f / r : r;
  }
  return expf(p * logf(x));
}

static __device__ __forceinline__ float hpdl_abs_grad(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }

/* Dropout's keep decision for element i: splitmix64 of the kernel call's
 * base hash and i, a uniform double in [0, 1) from its top 53 bits
 * (interp.c's stream, bit for bit). */
static __device__ __forceinline__ unsigned long long hpdl_splitmix(unsigned long long s) {
  unsigned long long z = s + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static __device__ __forceinline__ int hpdl_keep(unsigned long long base, long long i, double p) {
  unsigned long long z = hpdl_splitmix(base ^ ((unsigned long long)i * 0xD1B54A32D192ED03ULL));
  double u = (double)(z >> 11) * 1.1102230246251565404e-16; /* 2^-53 */
  return u >= p;
}

/* Reductions of one value per thread over the block: warp shuffles, then
 * one partial per warp through shared memory. Every thread of the block
 * calls them (they contain barriers) and gets the result. blockDim.x is a
 * multiple of 32, at most 1024. */
static __device__ __forceinline__ float hpdl_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ __forceinline__ float hpdl_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

static __device__ float hpdl_block_sum(float v, float *partial /* shared, 32 floats */) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = hpdl_warp_sum(v);
#ifndef HPDL_MUTATE_DROP_BARRIER /* the deliberate race of the test cuda.emu.mutation */
  __syncthreads(); /* the previous use of partial is over */
#endif
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.0f;
  return hpdl_warp_sum(v);
}

static __device__ float hpdl_block_max(float v, float *partial /* shared, 32 floats */) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = hpdl_warp_max(v);
#ifndef HPDL_MUTATE_DROP_BARRIER
  __syncthreads();
#endif
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : HPDL_NEG_INF;
  return hpdl_warp_max(v);
}

/* One value into a running (max m, sum s of exp(x - m)) pair: the online
 * softmax's step (the cross-entropy's row, one pass over the logits). A NaN
 * makes the sum NaN, as it would the two-pass sum. */
static __device__ __forceinline__ void hpdl_lse_add(float *m, float *s, float x) {
  if (x > *m) {
    *s = *s * expf(*m - x) + 1.0f; /* exp(-inf) = 0 for the first value */
    *m = x;
  } else if (x != HPDL_NEG_INF) {
    *s += expf(x - *m);
  }
}

/* A column kernel's reduction (codegen_cuda.c): the block holds `rows`
 * rows (thread % rows; HPDL_COL_ROWS, 16 where the kernel's values are
 * 16-bit) and slices of the group (thread / rows), each thread a partial
 * value of its row; every thread gets its row's total, the slices' partials
 * added in slice order (the same every run). partial: blockDim.x floats of
 * shared memory. */
#define HPDL_COL_ROWS 8

/* Loop unrolling on the GPU (nvcc, NVRTC; nothing in the emulation, whose
 * compiler does not know the pragma): HPDL_UNROLL4 before a loop puts four
 * iterations' loads in flight at once (a column kernel's slice of the group:
 * its sums keep their order), HPDL_ROLLED keeps one where unrolled loads
 * would take the registers the accumulators hold (the attention kernels).
 * HPDL_UNROLL_ALL unrolls a loop of a constant trip count whole: a warp's row
 * held in registers (c<x>_[it_]) needs every index a constant. */
#ifdef __CUDACC__
#define HPDL_UNROLL4 _Pragma("unroll 4")
#define HPDL_ROLLED _Pragma("unroll 1")
#define HPDL_UNROLL_ALL _Pragma("unroll")
#else
#define HPDL_UNROLL4
#define HPDL_ROLLED
#define HPDL_UNROLL_ALL
#endif
static __device__ float hpdl_col_sum(float v, float *partial, int rows = HPDL_COL_ROWS) {
  int r = threadIdx.x % rows, nslices = blockDim.x / rows;
#ifndef HPDL_MUTATE_DROP_BARRIER
  __syncthreads(); /* the previous use of partial is over */
#endif
  partial[threadIdx.x] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nslices; w++) s += partial[w * rows + r];
  return s;
}

static __device__ float hpdl_col_max(float v, float *partial, int rows = HPDL_COL_ROWS) {
  int r = threadIdx.x % rows, nslices = blockDim.x / rows;
#ifndef HPDL_MUTATE_DROP_BARRIER
  __syncthreads();
#endif
  partial[threadIdx.x] = v;
  __syncthreads();
  float m = HPDL_NEG_INF;
  for (int w = 0; w < nslices; w++) m = fmaxf(m, partial[w * rows + r]);
  return m;
}

/* The same over doubles (a reduction whose order must not cost precision:
 * the cross-entropy's mean over rows). */
static __device__ double hpdl_block_sum_d(double v, double *partial /* shared, 32 doubles */) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Exclusive prefix sum of one int per thread in thread order over the block,
 * and the block's total in *total (integers: exact in any order). Every
 * thread calls it; blockDim.x is a multiple of 32. */
static __device__ int hpdl_block_exscan_int(int v, int *partial /* shared, 32 ints */, int *total) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads(); /* the previous use of partial is over */
  if (lane == 31) partial[warp] = x;
  __syncthreads();
  int w = lane < nwarps ? partial[lane] : 0;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, w, o);
    if (lane >= o) w += y;
  }
  /* w: the warps' totals, inclusive, lane by lane */
  int before = __shfl_sync(0xffffffffu, w, warp) - partial[warp];
  *total = __shfl_sync(0xffffffffu, w, 31);
  return before + x - v;
}

/* The host program's own kernel (runtime/devexec.c): a weight's bf16 copy,
 * which a bf16 GEMM multiplies, rounded from its fp32 parameter once per
 * step (compiler/ir/precision.h). Grid-stride. */
extern "C" __global__ void __launch_bounds__(256) hpdl_round_bf16(const hpdl_kctx hpd, const float *__restrict__ src,
                                                                  unsigned short *__restrict__ dst, long long n) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = hpdl_bf16_from_f32(src[i]);
}

/* The host program's own kernel (runtime/devexec.c): the chunks of a
 * collective whose pieces are not contiguous (core/interp.c's
 * interp_chunk_copy, `parts` of them at once). Over the local value
 * [outer, len, inner], part p is member `first + p`'s chunk along the axis,
 * at local + p x outer x len x inner; the global value is [outer, len x size,
 * inner], the chunk at the member's positions (layout 0: a contiguous
 * block; 1: context parallelism's zigzag, halves r and 2 size - 1 - r).
 * to_global copies local into global, else global into local. Grid-stride. */
extern "C" __global__ void __launch_bounds__(256) hpdl_chunk_copy_f32(const hpdl_kctx hpd, long long outer, long long len,
                                                                      long long inner, long long layout, long long first,
                                                                      long long size, long long parts, float *global,
                                                                      float *local, long long to_global) {
  (void)hpd;
  const long long piece = outer * len * inner, n = piece * parts, half = len / 2;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long p = i / piece, at = i - p * piece;
    const long long o = at / (len * inner), q = at / inner % len, j = at % inner;
    const long long r = first + p;
    const long long gp = layout == 0 || size <= 1 ? r * len + q
                         : q < half              ? r * half + q
                                                 : (2 * size - 1 - r) * half + (q - half);
    const long long g = (o * len * size + gp) * inner + j;
    if (to_global)
      global[g] = local[i];
    else
      local[i] = global[g];
  }
}

/* The host program's own kernels (runtime/devexec.c): a GEMM's bias
 * gradient where cuBLASLt has no algorithm with its BGRAD epilogue: out[j] =
 * the sum over q < k of X[q * ld + j], X fp32 or bf16, the sum fp32. A block
 * (256 threads) per 32 columns, grid-stride: lane j's column, each of the 8
 * warps summing rows warp, warp + 8, ..., then warp 0 adding the 8 partials
 * in order - a fixed order, the same bits every run, and a warp's loads are
 * 32 consecutive values. */
static __device__ __forceinline__ float hpdl_value_f32(float v) { return v; }
static __device__ __forceinline__ float hpdl_value_f32(unsigned short v) { return hpdl_bf16_to_f32(v); }

template <typename T>
static __device__ __forceinline__ void hpdl_bias_grad(const T *__restrict__ X, float *__restrict__ out, long long k, long long x,
                                                      long long ld) {
  __shared__ float part[8][33];
  const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
  for (long long c0 = (long long)blockIdx.x * 32; c0 < x; c0 += (long long)gridDim.x * 32) {
    const long long j = c0 + lane;
    float s = 0.0f;
    if (j < x)
      for (long long q = warp; q < k; q += 8) s += hpdl_value_f32(X[q * ld + j]);
    part[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && j < x) {
      float t = 0.0f;
      for (int w = 0; w < 8; w++) t += part[w][lane];
      out[j] = t;
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(256) hpdl_bias_grad_f32(const hpdl_kctx hpd, const float *__restrict__ X,
                                                                     float *__restrict__ out, long long k, long long x,
                                                                     long long ld) {
  (void)hpd;
  hpdl_bias_grad(X, out, k, x, ld);
}

extern "C" __global__ void __launch_bounds__(256) hpdl_bias_grad_bf16(const hpdl_kctx hpd, const unsigned short *__restrict__ X,
                                                                      float *__restrict__ out, long long k, long long x,
                                                                      long long ld) {
  (void)hpd;
  hpdl_bias_grad(X, out, k, x, ld);
}

/* The host program's own kernel (runtime/devexec.c): a bias epilogue into a
 * bf16 D where cuBLASLt has no algorithm for it (FuseOptions.store16): the
 * fp32 product c plus bias[n] per row (none: NULL, the bare product's bf16 D),
 * rounded as it is stored in d.
 * Grid-stride over rows x n. */
extern "C" __global__ void __launch_bounds__(256) hpdl_bias_bf16(const hpdl_kctx hpd, const float *__restrict__ c,
                                                                 const float *__restrict__ bias, unsigned short *__restrict__ d,
                                                                 long long rows, long long n) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * n; i += (long long)gridDim.x * blockDim.x)
    d[i] = hpdl_bf16_from_f32(bias ? c[i] + bias[i % n] : c[i]);
}

/* The host program's own kernel (runtime/devexec.c's devx_take): dst[i] =
 * src[idx[i]], ZeRO-3's packing and unpacking of the fp32 values of a unit
 * gathered in bf16 (runtime/program_cuda.c, Unit16). Grid-stride. */
extern "C" __global__ void __launch_bounds__(256) hpdl_take_f32(const hpdl_kctx hpd, const float *__restrict__ src,
                                                                const long long *__restrict__ idx, float *__restrict__ dst,
                                                                long long n) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[idx[i]];
}

/* The host program's own kernels for the gradients' compressed sums on the
 * device (compression = bf16 | fp16; runtime/device/devcomp.c), bit for bit
 * runtime/comm.c's comm_compress / comm_decompress_add: each member rounds
 * v = x + residual (x + 0 without error feedback, as comm.c adds) to 16
 * bits, the residual keeping v minus what was sent; the receiver sums the
 * members' 16-bit values in fp32 in member order from 0. Explicit _rn
 * operations: no contraction whatever the flags. Grid-stride. */
static __device__ __forceinline__ float hpdl_half_value(unsigned short h, long long bf16) {
  return bf16 ? hpdl_bf16_to_f32(h) : hpdl_f16_to_f32(h);
}

extern "C" __global__ void __launch_bounds__(256) hpdl_compress16_f32(const hpdl_kctx hpd, const float *__restrict__ x,
                                                                      float *__restrict__ residual,
                                                                      unsigned short *__restrict__ out, long long n,
                                                                      long long bf16) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float v = __fadd_rn(x[i], residual ? residual[i] : 0.0f);
    const unsigned short h = bf16 ? hpdl_bf16_from_f32(v) : hpdl_f16_from_f32(v);
    out[i] = h;
    if (residual) residual[i] = __fsub_rn(v, hpdl_half_value(h, bf16));
  }
}

/* out[i] = the sum over m < members of in[m x stride + i], from 0 in order. */
extern "C" __global__ void __launch_bounds__(256) hpdl_sum16_f32(const hpdl_kctx hpd, const unsigned short *__restrict__ in,
                                                                 float *__restrict__ out, long long n, long long stride,
                                                                 long long members, long long bf16) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (long long m = 0; m < members; m++) acc = __fadd_rn(acc, hpdl_half_value(in[m * stride + i], bf16));
    out[i] = acc;
  }
}

/* dst[i] = src[i] on the stream it is launched on (a device copy would take
 * the launch stream). Grid-stride. */
extern "C" __global__ void __launch_bounds__(256) hpdl_copy_f32(const hpdl_kctx hpd, const float *__restrict__ src,
                                                                float *__restrict__ dst, long long n) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

/* The host program's own kernel (runtime/devexec.c): dst[i] += src[i], the
 * gradient outputs of a step added into the gradient buffers. n comes as an
 * 8-byte argument like the pointers. Grid-stride. */
extern "C" __global__ void __launch_bounds__(256) hpdl_accumulate_f32(const hpdl_kctx hpd, const float *__restrict__ src,
                                                                      float *__restrict__ dst, long long n) {
  (void)hpd;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] += src[i];
}

#endif
