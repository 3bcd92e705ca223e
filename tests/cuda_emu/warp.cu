/* warp.cu - the warp and block primitives the CUDA back end may use (tests/cuda_emu),
 * each thread writing what it got so that the host can check it lane by lane.
 *   shuffles      __shfl_sync, _up, _down, _xor for int, unsigned, float, double and
 *                 long long, widths 32, 16 and 8; a 2-D block (warps are formed from
 *                 the linear thread id x + y * blockDim.x)
 *   votes         __ballot_sync, __any_sync, __all_sync, __reduce_*_sync, a sub-warp
 *                 mask, __syncwarp
 *   block_votes   __syncthreads_count / _and / _or
 *   atomics       atomicAdd (int, unsigned long long, float), atomicMax, atomicCAS,
 *                 atomicExch over all blocks; dynamic shared memory as a histogram */
#ifndef HPDL_DYNAMIC_SMEM
#define HPDL_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

/* out[t * 24 + k]: result k of linear thread t, as a double */
extern "C" __global__ void shuffles(double* __restrict__ out) {
  const unsigned t = threadIdx.x + threadIdx.y * blockDim.x, lane = t & 31u;
  double* o = out + (size_t)t * 24;
  const int vi = (int)(t * 3) - 50;
  const unsigned vu = 1000u + t;
  const float vf = 0.5f + (float)t;
  const double vd = 1e10 + (double)t;
  const long long vl = (1ll << 40) + t;
  int k = 0;
  o[k++] = __shfl_sync(0xffffffffu, vi, (int)((lane * 7u) % 32u));
  o[k++] = __shfl_sync(0xffffffffu, vu, 3, 16);
  o[k++] = __shfl_sync(0xffffffffu, vf, 37, 8); /* srcLane beyond width: modulo width */
  o[k++] = __shfl_sync(0xffffffffu, vd, 31);
  o[k++] = (double)(__shfl_sync(0xffffffffu, vl, 5) - (1ll << 40));
  o[k++] = __shfl_up_sync(0xffffffffu, vi, 1);
  o[k++] = __shfl_up_sync(0xffffffffu, vf, 3, 8);
  o[k++] = __shfl_up_sync(0xffffffffu, vd, 16, 16);
  o[k++] = __shfl_down_sync(0xffffffffu, vu, 1);
  o[k++] = __shfl_down_sync(0xffffffffu, vf, 5, 16);
  o[k++] = __shfl_down_sync(0xffffffffu, vd, 2, 8);
  o[k++] = (double)(__shfl_down_sync(0xffffffffu, vl, 31) - (1ll << 40));
  o[k++] = __shfl_xor_sync(0xffffffffu, vi, 1);
  o[k++] = __shfl_xor_sync(0xffffffffu, vu, 16);
  o[k++] = __shfl_xor_sync(0xffffffffu, vf, 8, 8);  /* partner in a later group: own value */
  o[k++] = __shfl_xor_sync(0xffffffffu, vd, 5, 16);
  o[k++] = __shfl_xor_sync(0xffffffffu, vf, 31);
  while (k < 24) o[k++] = 0.0;
}

/* out[t * 12 + k] */
extern "C" __global__ void votes(unsigned* __restrict__ out) {
  const unsigned t = threadIdx.x, lane = t & 31u;
  unsigned* o = out + (size_t)t * 12;
  o[11] = __activemask(); /* no lane has exited yet */
  o[0] = __ballot_sync(0xffffffffu, lane % 3u == 0u);
  o[1] = (unsigned)__any_sync(0xffffffffu, t == 40u);
  o[2] = (unsigned)__all_sync(0xffffffffu, lane < 31u);
  o[3] = (unsigned)__all_sync(0xffffffffu, t < 1000u);
  o[4] = __reduce_add_sync(0xffffffffu, t);
  o[5] = (unsigned)__reduce_min_sync(0xffffffffu, (int)lane - 7);
  o[6] = __reduce_max_sync(0xffffffffu, t * 5u % 37u);
  o[7] = __reduce_xor_sync(0xffffffffu, t);
  o[8] = 0;
  if (lane < 8u) o[8] = __ballot_sync(0x000000ffu, lane & 1u); /* a sub-warp */
  __syncwarp();
  o[9] = __reduce_or_sync(0xffffffffu, 1u << (lane % 5u));
  o[10] = __reduce_and_sync(0xffffffffu, lane | 0x100u);
}

extern "C" __global__ void block_votes(int* __restrict__ out) {
  const unsigned t = threadIdx.x;
  const int c = __syncthreads_count(t % 3u == 0u);
  const int a = __syncthreads_and(t < blockDim.x);
  const int b = __syncthreads_and(t != 7u);
  const int o = __syncthreads_or(t == blockDim.x - 1u);
  if (t == 0) {
    out[blockIdx.x * 4 + 0] = c;
    out[blockIdx.x * 4 + 1] = a;
    out[blockIdx.x * 4 + 2] = b;
    out[blockIdx.x * 4 + 3] = o;
  }
}

/* counters: [0] int sum, [1] max, [2] CAS-incremented, [3] exchanged; hist[bins] */
extern "C" __global__ void atomics(const int* __restrict__ data, int n, int* __restrict__ counters,
                                   unsigned long long* __restrict__ big, float* __restrict__ fsum,
                                   unsigned* __restrict__ hist, int bins) {
  HPDL_DYNAMIC_SMEM(unsigned, local);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0u;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int v = data[i];
    atomicAdd(&counters[0], v);
    atomicMax(&counters[1], v);
    int old = counters[2], seen;
    do {
      seen = old;
      old = atomicCAS(&counters[2], seen, seen + 1);
    } while (old != seen);
    atomicAdd(big, (unsigned long long)v * 1000000007ull);
    atomicAdd(fsum, 0.5f);
    atomicAdd(&local[v % bins], 1u);
  }
  if (threadIdx.x == 0) atomicExch(&counters[3], (int)blockIdx.x + 1000);
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) atomicAdd(&hist[b], local[b]);
}
