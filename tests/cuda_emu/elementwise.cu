/* elementwise.cu - y = silu(x) * scale + r over n floats (tests/cuda_emu): plain CUDA C
 * as the CUDA back end writes an elementwise kernel. A grid-stride loop; 128-bit float4
 * loads and stores when all three pointers are 16-byte aligned, then the tail of
 * n % 4 values (or everything, when a pointer is not aligned) one float at a time. */
static __device__ __forceinline__ float silu_scale_add(float x, float r, float scale) {
  return __fdividef(x, 1.0f + __expf(-x)) * scale + r;
}

extern "C" __global__ void __launch_bounds__(256)
silu_scale_add_f32(const float* __restrict__ x, const float* __restrict__ r, float* __restrict__ y, long long n,
                   float scale) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long done = 0;
  if ((((unsigned long long)x | (unsigned long long)r | (unsigned long long)y) & 15ull) == 0) {
    const long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* r4 = reinterpret_cast<const float4*>(r);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (long long i = tid; i < n4; i += stride) {
      const float4 a = x4[i], b = r4[i];
      y4[i] = make_float4(silu_scale_add(a.x, b.x, scale), silu_scale_add(a.y, b.y, scale),
                          silu_scale_add(a.z, b.z, scale), silu_scale_add(a.w, b.w, scale));
    }
    done = n4 * 4;
  }
  for (long long i = done + tid; i < n; i += stride) y[i] = silu_scale_add(x[i], r[i], scale);
}
