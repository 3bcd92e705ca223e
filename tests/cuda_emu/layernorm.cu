/* layernorm.cu - LayerNorm forward, one block per row (tests/cuda_emu): plain CUDA C as
 * the CUDA back end writes it. The row is read once into dynamic shared memory
 * (HPDL_DYNAMIC_SMEM: n floats), then mean and variance are two block reductions
 * (warp shuffles, then the warps' partials through shared memory), the variance of
 * x - mean (two passes: no cancellation). Writes y and each row's mean and 1/std.
 * blockDim.x is a multiple of 32. */
#ifndef HPDL_DYNAMIC_SMEM
#define HPDL_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0); /* lane 0 holds the total */
}

static __device__ float block_sum(float v, float* red) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads(); /* red is free */
  if (lane == 0) red[warp] = v;
  __syncthreads(); /* the partials are written */
  if (warp == 0) {
    v = warp_sum(lane < nwarps ? red[lane] : 0.0f);
    if (lane == 0) red[0] = v;
  }
  __syncthreads(); /* the total is written */
  return red[0];
}

extern "C" __global__ void __launch_bounds__(1024)
layernorm_fwd(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
              float* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out, int n, float eps) {
  __shared__ float red[32];
  HPDL_DYNAMIC_SMEM(float, row);
  const float* xr = x + (size_t)blockIdx.x * n;
  float* yr = y + (size_t)blockIdx.x * n;
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    row[i] = xr[i];
    s += row[i];
  }
  const float mean = block_sum(s, red) / (float)n;
  float q = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = row[i] - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q, red) / (float)n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (row[i] - mean) * rstd * gamma[i] + beta[i];
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}
