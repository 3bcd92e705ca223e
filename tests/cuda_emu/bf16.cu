/* bf16.cu - 16-bit storage, fp32 arithmetic (tests/cuda_emu): plain CUDA C as the CUDA
 * back end writes it.
 *   convert16     float -> bf16 and fp16 (round to nearest even) and back
 *   patterns16    every 16-bit pattern, bf16 and fp16 -> float -> the same type
 *   scale_rowsum  one block per row: y = bf16(x * g) and the row's sum of x * g
 *                 accumulated in fp32 (shuffles, then shared memory), stored as fp32
 *                 and as bf16; pairs of bf16 loaded as __nv_bfloat162 (n even).
 * blockDim.x is a multiple of 32. */
#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

extern "C" __global__ void convert16(const float* __restrict__ in, __nv_bfloat16* __restrict__ b,
                                     float* __restrict__ b_back, __half* __restrict__ h,
                                     float* __restrict__ h_back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __nv_bfloat16 vb = __float2bfloat16(in[i]);
  const __half vh = __float2half(in[i]);
  b[i] = vb;
  h[i] = vh;
  b_back[i] = __bfloat162float(vb);
  h_back[i] = __half2float(vh);
}

extern "C" __global__ void patterns16(unsigned short* __restrict__ b_out, unsigned short* __restrict__ h_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  const float fb = __bfloat162float(__ushort_as_bfloat16((unsigned short)i));
  const float fh = __half2float(__ushort_as_half((unsigned short)i));
  b_out[i] = __bfloat16_as_ushort(__float2bfloat16(fb));
  h_out[i] = __half_as_ushort(__float2half(fh));
}

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void scale_rowsum(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ g,
                                        __nv_bfloat16* __restrict__ y, float* __restrict__ sum32,
                                        __nv_bfloat16* __restrict__ sum16, int n) {
  __shared__ float red[32];
  const size_t base = (size_t)blockIdx.x * n;
  float acc = 0.0f;
  if (n % 2 == 0) {
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(x + base);
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(g);
    __nv_bfloat162* y2 = reinterpret_cast<__nv_bfloat162*>(y + base);
    for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
      const float2 a = __bfloat1622float2(x2[i]), b = __bfloat1622float2(g2[i]);
      const float p0 = a.x * b.x, p1 = a.y * b.y;
      y2[i] = __floats2bfloat162_rn(p0, p1);
      acc += p0 + p1;
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float p = __bfloat162float(x[base + i]) * __bfloat162float(g[i]);
      y[base + i] = __float2bfloat16(p);
      acc += p;
    }
  }
  acc = warp_sum(acc);
  if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; w++) t += red[w];
    sum32[blockIdx.x] = t;
    sum16[blockIdx.x] = __float2bfloat16(t);
  }
}
