/* attention_emu.cu - ready-made kernels over kernels/hpdl_attention.cuh, written as the CUDA
 * back end writes its kernels (extern "C", __launch_bounds__(256), the kernel context first,
 * a 1-D grid whose blockIdx.x is the work item), for tests/cuda/attention_emu.cpp (through
 * the emulation harness) and for the NVRTC checks of tests/cuda/attention_emu.py (CTest
 * cuda.attention.*). The shape and the context-parallel ranks come as arguments here; the
 * code generator may as well write them in as constants.
 *
 * Each ATTN_TEST_KERNELS line instantiates the four kernels of one configuration: head
 * sizes D, Dv, then the block's threads and the forward's and the backward's tiles. The
 * "d..." ones take hpdl_attention_cfg.h's rule (the templates' defaults); "t..." ones are
 * smaller tiles, so that small (fast to emulate) shapes still cross many tiles. */
#ifndef HPDL_DYNAMIC_SMEM
#define HPDL_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif
#include "hpdl_attention.cuh"

#define ATTN_TEST_KERNELS(NAME, D, DV, NT, FBQ, FBK, KBQ, KBK, QBQ, QBK)                                                       \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      attn_fwd_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, float *out, int B, int H, \
                      int Hk, int T, int S, float scale, int causal, int window, int row_rank, int row_size, int col_rank,       \
                      int col_size, int Sc) {                                                                                \
    (void)hpd;                                                                                                       \
    hpdl_attn_fwd<D, DV, NT, FBQ, FBK>(q, k, v, out, B, H, Hk, T, S, scale, causal, window, row_rank, row_size, col_rank,   \
                                       col_size, Sc, blockIdx.x);                                                        \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      attn_dt_##NAME(const hpdl_kctx hpd, const float *out, const float *dout, float *Dt, int B, int H, int T) {     \
    (void)hpd;                                                                                                       \
    hpdl_attn_bwd_dt<D, DV, NT>(out, dout, Dt, B, H, T, blockIdx.x);                                                 \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      attn_dkdv_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, const float *out,       \
                       const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,         \
                       float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) {            \
    (void)hpd;                                                                                                       \
    hpdl_attn_bwd_dkdv<D, DV, NT, KBQ, KBK>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank, \
                                            row_size, col_rank, col_size, Sc, blockIdx.x);                               \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                                  \
      attn_dq_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, const float *out,         \
                     const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,           \
                     float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) {              \
    (void)hpd;                                                                                                       \
    hpdl_attn_bwd_dq<D, DV, NT, QBQ, QBK>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank,   \
                                          row_size, col_rank, col_size, Sc, blockIdx.x);                                 \
  }

/* The rule's tiles for (D, Dv). */
#define ATTN_RULE(D, DV)                                                                                         \
  D, DV, HPDL_ATTN_THREADS(D, DV), HPDL_ATTN_FWD_BQ(D, DV), HPDL_ATTN_FWD_BK(D, DV), HPDL_ATTN_DKDV_BQ(D, DV),   \
      HPDL_ATTN_DKDV_BK(D, DV), HPDL_ATTN_DQ_BQ(D, DV), HPDL_ATTN_DQ_BK(D, DV)

/* The tensor-core kernels' tiles (hpdl_attn_plan_tc), in the same order */
#define ATTN_TC_RULE(D, DV)                                                                                      \
  D, DV, HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_ROWS, HPDL_ATTN_TC_FWD_BK, HPDL_ATTN_TC_DKDV_BQ, HPDL_ATTN_TC_KEYS, HPDL_ATTN_TC_ROWS, \
      HPDL_ATTN_TC_DQ_BK

/* ATTN_RULE expands before ATTN_TEST_KERNELS takes its arguments apart */
#define ATTN_TEST_KERNELS_(...) ATTN_TEST_KERNELS(__VA_ARGS__)

ATTN_TEST_KERNELS_(d64, ATTN_RULE(64, 64))       /* 256 threads; fwd 32 x 32, dkdv 40 x 32, dq 32 x 48 */
#ifndef ATTN_EMU_FEW /* the mutation test's builds: only what its multi-tile cases use */
ATTN_TEST_KERNELS_(d128, ATTN_RULE(128, 128))    /* 256 threads; fwd 16 x 32, dkdv 26 x 16, dq 16 x 28 */
ATTN_TEST_KERNELS_(d128v64, ATTN_RULE(128, 64))  /* the same tier, Dv != D */
ATTN_TEST_KERNELS_(d3, ATTN_RULE(3, 3))          /* head sizes no multiple of anything */
ATTN_TEST_KERNELS_(d200, ATTN_RULE(200, 200))    /* 128 threads; fwd 4 x 16, dkdv 18 x 4, dq 4 x 16 */
ATTN_TEST_KERNELS_(d1v256, ATTN_RULE(1, 256))    /* the extremes */
#endif
/* The tensor-core kernels (sm_80 on) of (D, Dv), as the code generator calls them: 3xTF32
 * unless the context's flags allow TF32; the dt kernel is the SIMT one (HPDL_ATTN_THREADS).
 * Under the code generator's launch bounds for them, 128 threads and 4 blocks (at most
 * 128 registers: without the minimum, ptxas aims at the occupancy a small block's shared
 * memory would allow, caps the registers at 64 and puts the fragments on the stack). */
#define ATTN_TC_KERNELS(NAME, D, DV)                                                                                  \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_MIN_BLOCKS)                         \
      attn_fwd_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, float *out, int B, int H,  \
                      int Hk, int T, int S, float scale, int causal, int window, int row_rank, int row_size,          \
                      int col_rank, int col_size, int Sc) {                                                                   \
    hpdl_attn_fwd_tc<D, DV>(q, k, v, out, B, H, Hk, T, S, scale, causal, window, row_rank, row_size, col_rank,        \
                            col_size, Sc, !(hpd.flags & HPDL_KCTX_TF32), blockIdx.x);                                     \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(256)                                                                   \
      attn_dt_##NAME(const hpdl_kctx hpd, const float *out, const float *dout, float *Dt, int B, int H, int T) {      \
    (void)hpd;                                                                                                        \
    hpdl_attn_bwd_dt<D, DV>(out, dout, Dt, B, H, T, blockIdx.x);                                                      \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_MIN_BLOCKS)                         \
      attn_dkdv_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, const float *out,         \
                       const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,          \
                       float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) { \
    hpdl_attn_bwd_dkdv_tc<D, DV>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank,      \
                                 row_size, col_rank, col_size, Sc, !(hpd.flags & HPDL_KCTX_TF32), blockIdx.x);            \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_MIN_BLOCKS)                         \
      attn_dq_##NAME(const hpdl_kctx hpd, const float *q, const float *k, const float *v, const float *out,           \
                     const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,            \
                     float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) {   \
    hpdl_attn_bwd_dq_tc<D, DV>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank,        \
                               row_size, col_rank, col_size, Sc, !(hpd.flags & HPDL_KCTX_TF32), blockIdx.x);              \
  }

ATTN_TC_KERNELS(tc64, 64, 64) /* GPT-2's heads */
#ifndef ATTN_EMU_FEW
ATTN_TC_KERNELS(tc16v40, 16, 40) /* D != Dv, few n tiles */
ATTN_TC_KERNELS(tc24v16, 24, 16) /* the smallest, odd k steps */
#endif

/* The 16-bit tensor-core kernels (mma m16n8k16; E 0 bf16, 1 fp16), as the code generator
 * calls them under 16-bit activations: the same launch bounds and grids; q, k, v of type TQ,
 * float (widened values) or unsigned short (read as stored: precision.h, no cast before). */
#define ATTN_H16_KERNELS(NAME, D, DV, E, TQ)                                                                          \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_H16_MIN_BLOCKS(0, D, DV))                         \
      attn_fwd_##NAME(const hpdl_kctx hpd, const TQ *q, const TQ *k, const TQ *v, float *out, int B, int H, int Hk,  \
                      int T, int S, float scale, int causal, int window, int row_rank, int row_size, int col_rank,    \
                      int col_size, int Sc) {                                                                                 \
    (void)hpd;                                                                                                        \
    hpdl_attn_fwd_h<D, DV, E>(q, k, v, out, B, H, Hk, T, S, scale, causal, window, row_rank, row_size, col_rank,      \
                              col_size, Sc, blockIdx.x);                                                                  \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(256)                                                                   \
      attn_dt_##NAME(const hpdl_kctx hpd, const float *out, const float *dout, float *Dt, int B, int H, int T) {      \
    (void)hpd;                                                                                                        \
    hpdl_attn_bwd_dt<D, DV>(out, dout, Dt, B, H, T, blockIdx.x);                                                      \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_H16_MIN_BLOCKS(1, D, DV))                         \
      attn_dkdv_##NAME(const hpdl_kctx hpd, const TQ *q, const TQ *k, const TQ *v, const float *out,                  \
                       const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,          \
                       float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) { \
    (void)hpd;                                                                                                        \
    hpdl_attn_bwd_dkdv_h<D, DV, E>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank,    \
                                   row_size, col_rank, col_size, Sc, blockIdx.x);                                         \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(HPDL_ATTN_TC_THREADS, HPDL_ATTN_H16_MIN_BLOCKS(2, D, DV))                         \
      attn_dq_##NAME(const hpdl_kctx hpd, const TQ *q, const TQ *k, const TQ *v, const float *out,                    \
                     const float *dout, const float *Dt, float *grads, int B, int H, int Hk, int T, int S,            \
                     float scale, int causal, int window, int row_rank, int row_size, int col_rank, int col_size, int Sc) {   \
    (void)hpd;                                                                                                        \
    hpdl_attn_bwd_dq_h<D, DV, E>(q, k, v, out, dout, Dt, grads, B, H, Hk, T, S, scale, causal, window, row_rank,      \
                                 row_size, col_rank, col_size, Sc, blockIdx.x);                                           \
  }

ATTN_H16_KERNELS(h64bfs, 64, 64, 0, unsigned short) /* GPT-2's heads in bf16, as compiled */
ATTN_H16_KERNELS(h64bf, 64, 64, 0, float) /* GPT-2's heads in bf16, widened */
ATTN_H16_KERNELS(h64f16, 64, 64, 1, float) /* and in fp16 */
#ifndef ATTN_EMU_FEW
ATTN_H16_KERNELS(h16v40bf, 16, 40, 0, float) /* D != Dv, a k dimension padded (40 -> 48) */
ATTN_H16_KERNELS(h24v16f16, 24, 16, 1, float) /* the smallest, q k^T's k padded (24 -> 32) */
#endif
/* heads over 64 (HPDL_ATTN_H16_WIDE: one buffer of 32 keys in the forward, of 16 in dq) */
ATTN_H16_KERNELS(h128bfs, 128, 128, 0, unsigned short) /* Llama's and Qwen's heads in bf16, as compiled */
#ifndef ATTN_EMU_FEW
ATTN_H16_KERNELS(h128f16s, 128, 128, 1, unsigned short) /* and in fp16 */
ATTN_H16_KERNELS(h72v112bf, 72, 112, 0, float) /* D != Dv, q k^T's k padded (72 -> 80) */
#endif

#ifdef HPDL_EMU /* emulation only: tiles no code generator asks for (the NVRTC checks take the rule's) */
ATTN_TEST_KERNELS(t5v7, 5, 7, 64, 16, 8, 8, 8, 8, 8)  /* two warps, many tiles */
ATTN_TEST_KERNELS(t16, 16, 16, 32, 8, 4, 4, 4, 4, 4)  /* one warp; bwd: half the lanes idle in the P phase */
ATTN_TEST_KERNELS(t9, 9, 9, 64, 16, 8, 12, 8, 8, 12)  /* dkdv: rows no multiple of the lanes; dq: keys neither */
#endif
