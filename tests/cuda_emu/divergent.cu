/* divergent.cu - kernels that are wrong in ways the GPU does not report: a hang, or a
 * barrier that silently lets threads through (tests/cuda_emu). The emulation must
 * report each as a launch error, never hang. Plain CUDA C; they compile for sm_80. */

/* half the block returns before a barrier the other half waits at */
extern "C" __global__ void early_return_barrier(int* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

/* odd and even threads wait at different __syncthreads() */
extern "C" __global__ void if_else_barrier(int* out) {
  if (threadIdx.x & 1) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

/* a loop whose trip count differs between threads, with a barrier inside */
extern "C" __global__ void loop_barrier(int* out) {
  for (unsigned i = 0; i < threadIdx.x % 3u; i++) __syncthreads();
  out[threadIdx.x] = 1;
}

/* lanes 0-15 shuffle with a full mask while lanes 16-31 wait at a barrier */
extern "C" __global__ void shuffle_vs_barrier(float* out) {
  float v = (float)threadIdx.x;
  if ((threadIdx.x & 31u) < 16u) v = __shfl_down_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

/* a mask that does not name the calling lane */
extern "C" __global__ void mask_without_caller(float* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, (float)threadIdx.x, 0);
}

/* lanes that meet at different kinds of warp operation */
extern "C" __global__ void mixed_warp_ops(unsigned* out) {
  if (threadIdx.x & 1) out[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
  else out[threadIdx.x] = (unsigned)__shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

extern "C" __global__ void trap_in_one_block(int* out) {
  if (blockIdx.x == 2 && threadIdx.x == 5) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

/* allowed: lanes 16-31 exit, lanes 0-15 shuffle with the full mask (exited lanes may
 * be named). Lane 15 reads exited lane 16: undefined on the GPU, NaN here. */
extern "C" __global__ void exited_lanes_shuffle(float* out) {
  if ((threadIdx.x & 31u) >= 16u) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (float)threadIdx.x, 1);
}

/* correct: a barrier every thread reaches */
extern "C" __global__ void fine(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}
