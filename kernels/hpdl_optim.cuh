/* kernels/hpdl_optim.cuh - the optimizer step on the GPU: AdamW and SGD with momentum
 * over every parameter tensor in one launch (multi-tensor, as apex's
 * multi_tensor_apply), bit for bit runtime/optim.c's update (kernels/README.md,
 * "The multi-tensor optimizer").
 *
 * One file, three readers:
 *   - plain C (C11) and C++ on the host: the chunk table, the per-step arguments and
 *     the static inline helpers that build them (what the runtime includes);
 *   - nvcc and NVRTC: the same, plus the kernels (NVRTC: the host helpers are left
 *     out, and the file includes nothing, so it compiles alone);
 *   - the CPU emulation (c++ -include kernels/cuda_emu.h): as under nvcc.
 *
 * The launch. The host lists its tensors (hpdl_optim_tensor: the four pointers of the
 * parameter, its gradient and the two moments, its element count, whether weight decay
 * applies) and cuts them into chunks of at most chunk_elems elements
 * (hpdl_optim_build_chunks): one row of the table per chunk, 48 bytes, in device memory.
 * The table does not depend on the step (the learning rate and the bias corrections are
 * arguments), so the runtime builds and copies it once, when the pools are allocated.
 * Each step then launches
 *
 *     hpdl_adamw_f32<<<grid, HPDL_OPTIM_THREADS>>>(table, nchunks, hpdl_adamw_make_args(...))
 *     hpdl_sgd_f32  <<<grid, HPDL_OPTIM_THREADS>>>(table, nchunks, hpdl_sgd_make_args(...))
 *
 * (hpdl_adamw_bf16m / hpdl_sgd_bf16m where the moments are bf16: train.moments = bf16)
 * with any grid (a block takes chunks blockIdx.x, blockIdx.x + gridDim.x, ...;
 * hpdl_optim_grid gives min(nchunks, 65535)) and at most HPDL_OPTIM_THREADS threads a
 * block. In a chunk, the elements before the first 16-byte boundary go one a thread, then
 * float4 loads and stores of all four arrays, then the tail one a thread; when the four
 * pointers are not equally aligned (a ZeRO shard whose moments start at another offset
 * than its parameters) the whole chunk goes one a thread.
 *
 * Bit for bit. Every value is what optim.c computes, not within a tolerance: the per-step
 * scalars are made on the host exactly as optim.c makes them (in double, then rounded to
 * float once: hpdl_adamw_make_args, hpdl_sgd_make_args), and each element goes through
 * the same float operations in the same order, each rounded on its own. nvcc and NVRTC
 * contract a*b + c into one fused multiply-add by default (--fmad=true), which rounds once
 * where the C code rounds twice: so every operation here is an explicit __fmul_rn /
 * __fadd_rn / __fsub_rn / __fdiv_rn / __fsqrt_rn, which the compiler never contracts or
 * reassociates, whatever --fmad, -prec-div or -prec-sqrt say (in the emulation they are
 * the plain float operations; compile the emulation with -ffp-contract=off). Not with
 * --use_fast_math (refused below under NVRTC; nvcc 13 defines no macro for it) or
 * -ftz=true (flushes subnormal results, which the CPU keeps): cuda.optim.sm_XX checks
 * the PTX has no fma/mad f32, no .ftz, no .approx. The CPU side must not contract either:
 * optim.c is compiled as ISO C (-std=c11), where GCC does not contract, and x86-64
 * without -mfma has no FMA instruction. NaN payloads may differ (the GPU makes canonical
 * NaNs), moot as train.c stops on a non-finite gradient norm before the update.
 *
 * The gradient-clipping scale is folded in: optim.c scales the gradients in place first
 * (g *= (float)scale, skipped when the scale is 1, as multiplying by 1.0f would be exact
 * anyway); the kernels multiply the same way but never write the gradients. Weight decay is per tensor, as train.c decides it: the
 * parameter's weight_decay flag picks decay[1] (the configured rate) or decay[0] (none).
 */
#ifndef HPDL_OPTIM_CUH
#define HPDL_OPTIM_CUH

/* Threads a block (the kernels' __launch_bounds__) and the chunk the runtime should cut
 * its tensors into: 64 Ki elements, a block's worth of work (64 elements a thread), as
 * apex. A multiple of 4 keeps the chunks of an aligned tensor aligned. */
#define HPDL_OPTIM_THREADS 256
#define HPDL_OPTIM_CHUNK 65536

/* hpdl_optim_chunk.flags: weight decay applies to this tensor (decay[1], else decay[0]) */
#define HPDL_OPTIM_DECAY 1

/* One row of the chunk table: elements [offset, offset + count) of one tensor. The four
 * pointers are the tensor's (element 0), not the chunk's; m and v are NULL where the
 * optimizer keeps no such moment (SGD: v always, m without momentum). */
typedef struct hpdl_optim_chunk {
  float *p;          /* the parameter */
  const float *g;    /* its gradient (read only) */
  float *m;          /* AdamW: first moment; SGD: momentum buffer */
  float *v;          /* AdamW: second moment */
  long long offset;  /* the chunk's first element in the tensor */
  int count;         /* its elements, 1 .. chunk_elems */
  int flags;         /* HPDL_OPTIM_DECAY */
} hpdl_optim_chunk;

/* One step of AdamW, by value. optim.c's names in brackets. */
typedef struct hpdl_adamw_args {
  float lr;          /* [step] (float)lr, the learning rate after the schedule */
  float beta1, beta2, eps; /* [b1, b2, eps] (float) of the configuration's */
  float bc1, bc2;    /* (float)(1 - beta1^t), (float)(1 - beta2^t), t = 1, 2, ... */
  float decay[2];    /* [decay] (float)(1 - lr wd): [0] with wd = 0, [1] the configured wd */
  float gscale;      /* (float) the clipping scale, 1 when not clipped */
} hpdl_adamw_args;

/* One step of SGD, by value. */
typedef struct hpdl_sgd_args {
  float lr;          /* [step] (float)lr */
  float momentum;    /* [mu] (float)momentum; 0: no buffer is read or written */
  float wd[2];       /* [w] (float)wd: [0] 0, [1] the configured wd */
  float gscale;      /* (float) the clipping scale */
  int first;         /* t <= 1: the buffer starts as the gradient */
} hpdl_sgd_args;

/* The layout host and device agree on (LP64 on both). */
#if defined(__cplusplus)
static_assert(sizeof(hpdl_optim_chunk) == 48, "hpdl_optim_chunk is 48 bytes");
static_assert(sizeof(hpdl_adamw_args) == 36 && sizeof(hpdl_sgd_args) == 24, "hpdl optim args");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(hpdl_optim_chunk) == 48, "hpdl_optim_chunk is 48 bytes");
_Static_assert(sizeof(hpdl_adamw_args) == 36 && sizeof(hpdl_sgd_args) == 24, "hpdl optim args");
#endif

/* ------------------------------------------------------------------ host helpers */
#if !defined(__CUDACC_RTC__)
#include <math.h>

/* static inline, and no warning where a file includes the header and calls none of
 * them (nvcc warns about unreferenced static functions, #177-D) */
#if defined(__GNUC__) || defined(__clang__)
#define HPDL_OPTIM_HOST static inline __attribute__((unused))
#else
#define HPDL_OPTIM_HOST static inline
#endif

/* One tensor as the host lists it (device pointers). */
typedef struct hpdl_optim_tensor {
  float *p;
  const float *g;
  float *m, *v;
  long long numel;
  int decay;         /* 1: weight decay applies (ArtParam.weight_decay) */
} hpdl_optim_tensor;

/* Rows of the table for these tensors cut into chunks of chunk_elems (> 0). */
HPDL_OPTIM_HOST long long hpdl_optim_count_chunks(const hpdl_optim_tensor *t, int ntensors, int chunk_elems) {
  long long n = 0;
  for (int i = 0; i < ntensors; i++)
    if (t[i].numel > 0) n += (t[i].numel + chunk_elems - 1) / chunk_elems;
  return n;
}

/* Writes the table (hpdl_optim_count_chunks rows) to out, tensor by tensor in the
 * order given, each tensor's chunks in order; returns the rows written, or -1 when
 * chunk_elems is not in [1, 2^30] (the kernels count a chunk's elements in int).
 * Tensors with no elements get no row. */
HPDL_OPTIM_HOST long long hpdl_optim_build_chunks(const hpdl_optim_tensor *t, int ntensors, int chunk_elems,
                                                  hpdl_optim_chunk *out) {
  if (chunk_elems <= 0 || chunk_elems > (1 << 30)) return -1;
  long long k = 0;
  for (int i = 0; i < ntensors; i++) {
    for (long long off = 0; off < t[i].numel; off += chunk_elems) {
      hpdl_optim_chunk *c = &out[k++];
      long long left = t[i].numel - off;
      c->p = t[i].p;
      c->g = t[i].g;
      c->m = t[i].m;
      c->v = t[i].v;
      c->offset = off;
      c->count = (int)(left < chunk_elems ? left : chunk_elems);
      c->flags = t[i].decay ? HPDL_OPTIM_DECAY : 0;
    }
  }
  return k;
}

/* A grid for nchunks rows: one block a chunk, at most 65535 blocks. */
HPDL_OPTIM_HOST unsigned hpdl_optim_grid(long long nchunks) {
  return nchunks < 1 ? 1u : nchunks > 65535 ? 65535u : (unsigned)nchunks;
}

/* The step's scalars as optim_adamw makes them: lr after the schedule (optim_lr_at),
 * the configuration's betas, eps and weight decay, t the 1-based step, the clipping
 * scale (optim_clip_scale; 1 when off). */
HPDL_OPTIM_HOST hpdl_adamw_args hpdl_adamw_make_args(double lr, double beta1, double beta2, double eps,
                                                     double weight_decay, long long t, double clip_scale) {
  hpdl_adamw_args a;
  a.lr = (float)lr;
  a.beta1 = (float)beta1;
  a.beta2 = (float)beta2;
  a.eps = (float)eps;
  a.bc1 = (float)(1.0 - pow(beta1, (double)t));
  a.bc2 = (float)(1.0 - pow(beta2, (double)t));
  a.decay[0] = (float)(1.0 - lr * 0.0);
  a.decay[1] = (float)(1.0 - lr * weight_decay);
  a.gscale = (float)clip_scale;
  return a;
}

/* The same for optim_sgd. */
HPDL_OPTIM_HOST hpdl_sgd_args hpdl_sgd_make_args(double lr, double momentum, double weight_decay, long long t,
                                                 double clip_scale) {
  hpdl_sgd_args a;
  a.lr = (float)lr;
  a.momentum = (float)momentum;
  a.wd[0] = (float)0.0;
  a.wd[1] = (float)weight_decay;
  a.gscale = (float)clip_scale;
  a.first = t <= 1;
  return a;
}
#endif /* !__CUDACC_RTC__ */

/* ----------------------------------------------------------------------- kernels */
#if defined(__CUDACC__) || defined(HPDL_EMU)

#if defined(__USE_FAST_MATH__) && __USE_FAST_MATH__
/* NVRTC defines __USE_FAST_MATH__ to 1 under --use_fast_math (nvcc 13 defines nothing) */
#error "kernels/hpdl_optim.cuh: compile without --use_fast_math (subnormals flushed: not optim.c's update)"
#endif

/* Where a chunk's float4 part lies: elements [0, head) and [head + 4 n4, count) one a
 * thread, [head, head + 4 n4) four a thread. The float4 part exists only when the four
 * pointers (b stands in for an absent moment) are equally aligned mod 16 bytes. */
static __device__ __forceinline__ int hpdl_optim_head(const float *p, const float *g, const float *m, const float *v,
                                                      int count, int *n4) {
  const unsigned long long a = (unsigned long long)p;
  if ((((a ^ (unsigned long long)g) | (a ^ (unsigned long long)m) | (a ^ (unsigned long long)v)) & 15ull) != 0) {
    *n4 = 0;
    return count;
  }
  int head = (int)(((16ull - (a & 15ull)) & 15ull) >> 2);
  if (head > count) head = count;
  *n4 = (count - head) >> 2;
  return head;
}

/* One element of optim_adamw, operation for operation:
 *   g  *= scale                                     (optim_scale)
 *   mi  = b1 * m + (1 - b1) * g
 *   vi  = b2 * v + (1 - b2) * g * g                 ((1 - b2) * g first)
 *   p   = p * decay - step * (mi / bc1) / (sqrtf(vi / bc2) + eps)
 * omb1 = 1 - b1 and omb2 = 1 - b2 are float subtractions, as in optim.c's loop. */
static __device__ __forceinline__ void hpdl_adamw_elem(float &p, float g, float &m, float &v,
                                                       const hpdl_adamw_args &a, float decay, float omb1,
                                                       float omb2) {
  const float gi = __fmul_rn(g, a.gscale);
  const float mi = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(omb1, gi));
  const float vi = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(omb2, gi), gi));
  m = mi;
  v = vi;
  const float mhat = __fdiv_rn(mi, a.bc1), vhat = __fdiv_rn(vi, a.bc2);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(a.lr, mhat), __fadd_rn(__fsqrt_rn(vhat), a.eps)));
}

/* hpdl_adamw_elem on the four lanes of a float4 group (the fp32 and bf16-moment
 * kernels' four-wide paths). */
static __device__ __forceinline__ void hpdl_adamw_elem4(float4 &P, const float4 &G, float4 &M, float4 &V,
                                                        const hpdl_adamw_args &a, float decay, float omb1,
                                                        float omb2) {
  hpdl_adamw_elem(P.x, G.x, M.x, V.x, a, decay, omb1, omb2);
  hpdl_adamw_elem(P.y, G.y, M.y, V.y, a, decay, omb1, omb2);
  hpdl_adamw_elem(P.z, G.z, M.z, V.z, a, decay, omb1, omb2);
  hpdl_adamw_elem(P.w, G.w, M.w, V.w, a, decay, omb1, omb2);
}

/* The chunk's weight decay: the configured one where its tensor decays (decay[1],
 * wd[1]), else none. */
static __device__ __forceinline__ float hpdl_adamw_decay(const hpdl_optim_chunk &k, const hpdl_adamw_args &a) {
  return (k.flags & HPDL_OPTIM_DECAY) ? a.decay[1] : a.decay[0];
}

static __device__ __forceinline__ float hpdl_sgd_wd(const hpdl_optim_chunk &k, const hpdl_sgd_args &a) {
  return (k.flags & HPDL_OPTIM_DECAY) ? a.wd[1] : a.wd[0];
}

/* AdamW over the chunks of the table. m and v must not be NULL. */
extern "C" __global__ void __launch_bounds__(HPDL_OPTIM_THREADS)
hpdl_adamw_f32(const hpdl_optim_chunk *__restrict__ table, long long nchunks, const hpdl_adamw_args a) {
  const float omb1 = __fsub_rn(1.0f, a.beta1), omb2 = __fsub_rn(1.0f, a.beta2);
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const hpdl_optim_chunk k = table[c];
    float *__restrict__ p = k.p + k.offset;
    const float *__restrict__ g = k.g + k.offset;
    float *__restrict__ m = k.m + k.offset;
    float *__restrict__ v = k.v + k.offset;
    const float decay = hpdl_adamw_decay(k, a);
    int n4;
    const int head = hpdl_optim_head(p, g, m, v, k.count, &n4);
    for (int i = threadIdx.x; i < head; i += blockDim.x)
      hpdl_adamw_elem(p[i], __ldg(g + i), m[i], v[i], a, decay, omb1, omb2);
    float4 *p4 = reinterpret_cast<float4 *>(p + head);
    const float4 *g4 = reinterpret_cast<const float4 *>(g + head);
    float4 *m4 = reinterpret_cast<float4 *>(m + head);
    float4 *v4 = reinterpret_cast<float4 *>(v + head);
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 P = p4[i], M = m4[i], V = v4[i];
      const float4 G = __ldg(g4 + i);
      hpdl_adamw_elem4(P, G, M, V, a, decay, omb1, omb2);
      p4[i] = P;
      m4[i] = M;
      v4[i] = V;
    }
    for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count; i += blockDim.x)
      hpdl_adamw_elem(p[i], __ldg(g + i), m[i], v[i], a, decay, omb1, omb2);
  }
}

/* One element of optim_sgd:
 *   g  *= scale                                     (optim_scale)
 *   gi  = g + w * p
 *   mu != 0:  gi = first ? gi : mu * buf + gi;  buf = gi
 *   p   = p - step * gi */
static __device__ __forceinline__ void hpdl_sgd_elem(float &p, float g, float &buf, const hpdl_sgd_args &a, float w) {
  float gi = __fadd_rn(__fmul_rn(g, a.gscale), __fmul_rn(w, p));
  if (a.momentum != 0.0f) {
    gi = a.first ? gi : __fadd_rn(__fmul_rn(a.momentum, buf), gi);
    buf = gi;
  }
  p = __fsub_rn(p, __fmul_rn(a.lr, gi));
}

/* hpdl_sgd_elem on the four lanes of a float4 group. */
static __device__ __forceinline__ void hpdl_sgd_elem4(float4 &P, const float4 &G, float4 &B, const hpdl_sgd_args &a,
                                                      float w) {
  hpdl_sgd_elem(P.x, G.x, B.x, a, w);
  hpdl_sgd_elem(P.y, G.y, B.y, a, w);
  hpdl_sgd_elem(P.z, G.z, B.z, a, w);
  hpdl_sgd_elem(P.w, G.w, B.w, a, w);
}

/* Element i alone; the buffer is read and written only with momentum (b may stand
 * in for it otherwise). */
static __device__ __forceinline__ void hpdl_sgd_scalar(float *__restrict__ p, const float *__restrict__ g,
                                                       float *__restrict__ b, int i, const hpdl_sgd_args &a, float w,
                                                       bool mom) {
  float pi = p[i], bi = 0.0f;
  if (mom) bi = b[i];
  hpdl_sgd_elem(pi, __ldg(g + i), bi, a, w);
  p[i] = pi;
  if (mom) b[i] = bi;
}

/* SGD over the chunks of the table: m is the momentum buffer (NULL allowed when
 * a.momentum is 0), v is not used. */
extern "C" __global__ void __launch_bounds__(HPDL_OPTIM_THREADS)
hpdl_sgd_f32(const hpdl_optim_chunk *__restrict__ table, long long nchunks, const hpdl_sgd_args a) {
  const bool mom = a.momentum != 0.0f;
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const hpdl_optim_chunk k = table[c];
    float *__restrict__ p = k.p + k.offset;
    const float *__restrict__ g = k.g + k.offset;
    float *__restrict__ b = mom ? k.m + k.offset : p; /* p: a stand-in that is never written as b */
    const float w = hpdl_sgd_wd(k, a);
    int n4;
    const int head = hpdl_optim_head(p, g, b, p, k.count, &n4);
    for (int i = threadIdx.x; i < head; i += blockDim.x) hpdl_sgd_scalar(p, g, b, i, a, w, mom);
    float4 *p4 = reinterpret_cast<float4 *>(p + head);
    const float4 *g4 = reinterpret_cast<const float4 *>(g + head);
    float4 *b4 = reinterpret_cast<float4 *>(b + head);
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 P = p4[i], B = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 G = __ldg(g4 + i);
      if (mom) B = b4[i];
      hpdl_sgd_elem4(P, G, B, a, w);
      p4[i] = P;
      if (mom) b4[i] = B;
    }
    for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count; i += blockDim.x)
      hpdl_sgd_scalar(p, g, b, i, a, w, mom);
  }
}

#if defined(HPDL_OPTIM_MOMENTS16)
/* ---- the moments in bf16 (train.moments = bf16; compiled where the includer
 * defines HPDL_OPTIM_MOMENTS16, as hpdlc does for such a run only) ----
 * The table is the same, but m and v point at 16-bit values (bfloat16's bits; the
 * runtime allocates them so and casts the pointers). Each element reads its moments
 * exactly (bf16 -> float is the high half of the float), updates them and the
 * parameter as the fp32 kernels do (the parameter moved by the unrounded moments), and
 * stores them rounded to nearest even: optim.c's optim_adamw16_mt / optim_sgd16_mt,
 * bit for bit. As the fp32 kernels, four elements a thread where the arrays allow it
 * (float4 parameters and gradients, ushort4 moments: 16- and 8-byte accesses), one a
 * thread in the head and tail; the same operations on each element either way. */
static __device__ __forceinline__ float hpdl_optim_bf16_get(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

/* hpdl_optim_head for 16-bit moments: p and g as hpdl_optim_head places them, and the
 * four-wide part only where m and v are equally aligned mod 8 bytes and each element
 * sits at the same place in its 8-byte group of m (byte 2i) as in its 16-byte group of
 * p (byte 4i) (m and v NULL: p and g alone). */
static __device__ __forceinline__ int hpdl_optim_head16(const float *p, const float *g, const unsigned short *m,
                                                        const unsigned short *v, int count, int *n4) {
  const unsigned long long a = (unsigned long long)p, b = m ? (unsigned long long)m : a >> 1;
  const unsigned long long c = v ? (unsigned long long)v : b;
  if (((b ^ c) & 7ull) != 0 || (b & 7ull) != ((a & 15ull) >> 1)) {
    *n4 = 0;
    return count;
  }
  return hpdl_optim_head(p, g, p, p, count, n4);
}

static __device__ __forceinline__ float4 hpdl_optim_bf16_get4(ushort4 h) {
  return make_float4(hpdl_optim_bf16_get(h.x), hpdl_optim_bf16_get(h.y), hpdl_optim_bf16_get(h.z),
                     hpdl_optim_bf16_get(h.w));
}

/* half.h's half_bf16_bits: round to nearest even, a NaN kept quiet */
static __device__ __forceinline__ unsigned short hpdl_optim_bf16_rn(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned nan = (x & 0x7fffffffu) > 0x7f800000u;
  const unsigned rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (unsigned short)(nan ? (x >> 16) | 0x40u : rounded);
}

static __device__ __forceinline__ ushort4 hpdl_optim_bf16_rn4(float4 f) {
  return make_ushort4(hpdl_optim_bf16_rn(f.x), hpdl_optim_bf16_rn(f.y), hpdl_optim_bf16_rn(f.z), hpdl_optim_bf16_rn(f.w));
}

/* One element of hpdl_adamw_bf16m: its moments read exactly, updated in float, the
 * parameter moved by the unrounded moments, the moments stored rounded. */
static __device__ __forceinline__ void hpdl_adamw16_scalar(float *__restrict__ p, const float *__restrict__ g,
                                                           unsigned short *__restrict__ m,
                                                           unsigned short *__restrict__ v, int i,
                                                           const hpdl_adamw_args &a, float decay, float omb1,
                                                           float omb2) {
  float mi = hpdl_optim_bf16_get(m[i]), vi = hpdl_optim_bf16_get(v[i]);
  hpdl_adamw_elem(p[i], __ldg(g + i), mi, vi, a, decay, omb1, omb2);
  m[i] = hpdl_optim_bf16_rn(mi);
  v[i] = hpdl_optim_bf16_rn(vi);
}

/* One element of hpdl_sgd_bf16m; the buffer is read and written only with momentum. */
static __device__ __forceinline__ void hpdl_sgd16_scalar(float *__restrict__ p, const float *__restrict__ g,
                                                         unsigned short *__restrict__ b, int i,
                                                         const hpdl_sgd_args &a, float w, bool mom) {
  float pi = p[i], bi = mom ? hpdl_optim_bf16_get(b[i]) : 0.0f;
  hpdl_sgd_elem(pi, __ldg(g + i), bi, a, w);
  p[i] = pi;
  if (mom) b[i] = hpdl_optim_bf16_rn(bi);
}

/* AdamW over the chunks, the moments in bf16. m and v must not be NULL. */
extern "C" __global__ void __launch_bounds__(HPDL_OPTIM_THREADS)
hpdl_adamw_bf16m(const hpdl_optim_chunk *__restrict__ table, long long nchunks, const hpdl_adamw_args a) {
  const float omb1 = __fsub_rn(1.0f, a.beta1), omb2 = __fsub_rn(1.0f, a.beta2);
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const hpdl_optim_chunk k = table[c];
    float *__restrict__ p = k.p + k.offset;
    const float *__restrict__ g = k.g + k.offset;
    unsigned short *__restrict__ m = reinterpret_cast<unsigned short *>(k.m) + k.offset;
    unsigned short *__restrict__ v = reinterpret_cast<unsigned short *>(k.v) + k.offset;
    const float decay = hpdl_adamw_decay(k, a);
    int n4;
    const int head = hpdl_optim_head16(p, g, m, v, k.count, &n4);
    for (int i = threadIdx.x; i < head; i += blockDim.x) hpdl_adamw16_scalar(p, g, m, v, i, a, decay, omb1, omb2);
    float4 *p4 = reinterpret_cast<float4 *>(p + head);
    const float4 *g4 = reinterpret_cast<const float4 *>(g + head);
    ushort4 *m4 = reinterpret_cast<ushort4 *>(m + head);
    ushort4 *v4 = reinterpret_cast<ushort4 *>(v + head);
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 P = p4[i], M = hpdl_optim_bf16_get4(m4[i]), V = hpdl_optim_bf16_get4(v4[i]);
      const float4 G = __ldg(g4 + i);
      hpdl_adamw_elem4(P, G, M, V, a, decay, omb1, omb2);
      p4[i] = P;
      m4[i] = hpdl_optim_bf16_rn4(M);
      v4[i] = hpdl_optim_bf16_rn4(V);
    }
    for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count; i += blockDim.x)
      hpdl_adamw16_scalar(p, g, m, v, i, a, decay, omb1, omb2);
  }
}

/* SGD over the chunks, the momentum buffer (m) in bf16 (NULL allowed when
 * a.momentum is 0). */
extern "C" __global__ void __launch_bounds__(HPDL_OPTIM_THREADS)
hpdl_sgd_bf16m(const hpdl_optim_chunk *__restrict__ table, long long nchunks, const hpdl_sgd_args a) {
  const bool mom = a.momentum != 0.0f;
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const hpdl_optim_chunk k = table[c];
    float *__restrict__ p = k.p + k.offset;
    const float *__restrict__ g = k.g + k.offset;
    unsigned short *__restrict__ b = mom ? reinterpret_cast<unsigned short *>(k.m) + k.offset : nullptr;
    const float w = hpdl_sgd_wd(k, a);
    int n4;
    const int head = hpdl_optim_head16(p, g, b, b, k.count, &n4);
    for (int i = threadIdx.x; i < head; i += blockDim.x) hpdl_sgd16_scalar(p, g, b, i, a, w, mom);
    float4 *p4 = reinterpret_cast<float4 *>(p + head);
    const float4 *g4 = reinterpret_cast<const float4 *>(g + head);
    ushort4 *b4 = mom ? reinterpret_cast<ushort4 *>(b + head) : nullptr;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 P = p4[i], B = mom ? hpdl_optim_bf16_get4(b4[i]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 G = __ldg(g4 + i);
      hpdl_sgd_elem4(P, G, B, a, w);
      p4[i] = P;
      if (mom) b4[i] = hpdl_optim_bf16_rn4(B);
    }
    for (int i = head + 4 * n4 + (int)threadIdx.x; i < k.count; i += blockDim.x) hpdl_sgd16_scalar(p, g, b, i, a, w, mom);
  }
}
#endif /* HPDL_OPTIM_MOMENTS16 */

/* The sum of squares of each chunk's gradient, in double: out[c] for row c
 * (a block a chunk, its threads' partial sums added in thread order through
 * shared memory, so the same every run). The runtime adds the rows of the
 * tensors it counts, in order, for the gradient norm. */
extern "C" __global__ void __launch_bounds__(HPDL_OPTIM_THREADS)
hpdl_sumsq_f32(const hpdl_optim_chunk *__restrict__ table, long long nchunks, double *__restrict__ out) {
  __shared__ double part[HPDL_OPTIM_THREADS];
  for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const hpdl_optim_chunk k = table[c];
    const float *__restrict__ g = k.g + k.offset;
    double s = 0.0;
    for (int i = threadIdx.x; i < k.count; i += blockDim.x) {
      const double x = (double)__ldg(g + i);
      s += x * x;
    }
    __syncthreads(); /* the previous chunk's part is read */
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (unsigned i = 0; i < blockDim.x; i++) t += part[i];
      out[c] = t;
    }
  }
}

#endif /* __CUDACC__ || HPDL_EMU */
#endif /* HPDL_OPTIM_CUH */
