/* softmax.cu - row softmax, one block per row, written as the CUDA back end writes
 * kernels (tests/cuda_emu; kernels/README.md, "The CPU emulation harness"): plain
 * CUDA C, no include of the harness (the emulation forces it in with -include).
 *
 * Each row: max, then sum of exp(x - max), each a warp-shuffle reduction followed by
 * a reduction of the warps' partials through shared memory. blockDim.x is a multiple
 * of 32 (the shuffles name all 32 lanes). The mutation test (cuda_emu.mutation)
 * removes each __syncthreads() below in turn and expects the emulation to catch it.
 */
#define HPDL_NEG_INF (-__int_as_float(0x7f800000))

/* op 0: sum, op 1: max */
static __device__ __forceinline__ float warp_reduce(float v, int op) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = op ? fmaxf(v, other) : v + other;
  }
  return v;
}

/* Every thread gets the block's total. red: one float per warp, reused by each call. */
static __device__ float block_reduce(float v, float* red, int op) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads(); /* red is free: every thread has read the previous call's result */
  if (lane == 0) red[warp] = v;
  __syncthreads(); /* the warps' partials are written */
  if (warp == 0) {
    v = lane < nwarps ? red[lane] : (op ? HPDL_NEG_INF : 0.0f);
    v = warp_reduce(v, op);
    if (lane == 0) red[0] = v;
  }
  __syncthreads(); /* the total is written */
  return red[0];
}

extern "C" __global__ void __launch_bounds__(1024)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float red[32];
  const float* xr = x + (size_t)blockIdx.x * n;
  float* yr = y + (size_t)blockIdx.x * n;
  float m = HPDL_NEG_INF;
  for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = block_reduce(m, red, 1);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += __expf(xr[i] - m);
  s = block_reduce(s, red, 0);
  const float inv = __frcp_rn(s);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __expf(xr[i] - m) * inv;
}
