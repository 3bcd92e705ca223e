/* conv_emu.cu - ready-made kernels over kernels/hpdl_conv.cuh, written as the CUDA back end
 * writes its convolution and pooling kernels (codegen_cuda_special.c: extern "C",
 * __launch_bounds__(256, HPDL_CONV_MIN_BLOCKS or HPDL_POOL_MIN_BLOCKS), the kernel context first, a 1-D grid whose blocks walk the rule's
 * tiles), for tests/cuda/conv_emu.cpp (through the emulation harness) and for the NVRTC
 * checks of tests/cuda/conv_emu.py (CTest cuda.conv.*). The shape comes as an argument
 * here; the code generator writes it in as constants.
 *
 * CONV_TIER_KERNELS instantiates the three convolutions at one tile tier of hpdl_conv_plan
 * (HPDL_CONV_TIER: 0 the largest tile .. 4 one row), under the launch bounds the code
 * generator gives them (HPDL_CONV_MIN_BLOCKS: at most 128 registers). */
#ifndef HPDL_DYNAMIC_SMEM
#define HPDL_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif
#include "hpdl_cuda.cuh"
#include "hpdl_conv.cuh"

#define CONV_TILE(t) HPDL_CONV_BM(t), HPDL_CONV_BN(t), HPDL_CONV_TM(t), HPDL_CONV_TN(t)

#define CONV_BOUNDS __launch_bounds__(HPDL_CONV_THREADS, HPDL_CONV_MIN_BLOCKS)
#define CONV_TIER_KERNELS(T)                                                                                          \
  extern "C" __global__ void CONV_BOUNDS                                                                             \
      conv_fwd_t##T(const hpdl_kctx hpd, const float *x, const float *w, float *y, hpdl_conv_shape s, long long nblk) { \
    (void)hpd;                                                                                                       \
    for (long long blk = blockIdx.x; blk < nblk; blk += gridDim.x) hpdl_conv_fwd<CONV_TILE(T)>(x, w, y, s, blk);      \
  }                                                                                                                  \
  extern "C" __global__ void CONV_BOUNDS                                                                             \
      conv_bwd_data_t##T(const hpdl_kctx hpd, const float *dy, const float *w, float *dx, hpdl_conv_shape s,          \
                         long long nblk) {                                                                           \
    (void)hpd;                                                                                                       \
    for (long long blk = blockIdx.x; blk < nblk; blk += gridDim.x)                                                   \
      hpdl_conv_bwd_data<CONV_TILE(T)>(dy, w, dx, s, blk);                                                           \
  }                                                                                                                  \
  extern "C" __global__ void CONV_BOUNDS                                                                             \
      conv_bwd_filter_t##T(const hpdl_kctx hpd, const float *x, const float *dy, float *out, hpdl_conv_shape s,        \
                           long long chunk, long long nblk) {                                                        \
    (void)hpd;                                                                                                       \
    for (long long blk = blockIdx.x; blk < nblk; blk += gridDim.x)                                                   \
      hpdl_conv_bwd_filter<CONV_TILE(T)>(x, dy, out, s, chunk, blk);                                                 \
  }

CONV_TIER_KERNELS(0) /* 64 x 64, 4 x 4 a thread */
CONV_TIER_KERNELS(1) /* 32 x 64, 2 x 4 */
CONV_TIER_KERNELS(2) /* 16 x 128, 2 x 4 */
CONV_TIER_KERNELS(3) /* 4 x 256, 1 x 4 */
CONV_TIER_KERNELS(4) /* 1 x 256, 1 x 1: depthwise */

#define POOL_BOUNDS __launch_bounds__(HPDL_CONV_THREADS, HPDL_POOL_MIN_BLOCKS)

extern "C" __global__ void POOL_BOUNDS
    conv_sum_splits(const hpdl_kctx hpd, const float *part, float *dw, long long n, int splits) {
  (void)hpd;
  hpdl_conv_sum_splits(part, dw, n, splits);
}

extern "C" __global__ void POOL_BOUNDS pool_fwd(const hpdl_kctx hpd, const float *x, float *y, hpdl_pool_shape s) {
  (void)hpd;
  hpdl_pool_fwd(x, y, s);
}

extern "C" __global__ void POOL_BOUNDS
    pool_bwd(const hpdl_kctx hpd, const float *x, const float *dy, float *dx, hpdl_pool_shape s) {
  (void)hpd;
  hpdl_pool_bwd(x, dy, dx, s);
}
