/* kernels/hpdl_attention_cfg.h - the launch rule of kernels/hpdl_attention.cuh's attention
 * kernels (kernels/README.md, "Attention"), for the code generator and the runtime (plain
 * C11 or C++ on the host) and for the kernels themselves (nvcc, NVRTC, the emulation).
 *
 * For head sizes D (queries and keys) and Dv (values), each 1 .. 256, by M = max(D, Dv):
 *
 *     M          threads   forward    backward dkdv   backward dq   static shared memory,
 *                          BQ x BK    BQ x BK         BQ x BK       bytes: fwd / dkdv / dq
 *     1 .. 64      256      32 x 32     40 x 32         32 x 48     29056 / 48160 / 48320
 *     65 .. 128    256      16 x 32     26 x 16         16 x 28     43328 / 46984 / 47504
 *     129 .. 256   128       4 x 16     18 x 4           4 x 16     37264 / 46024 / 41488
 *
 * BQ query rows and BK keys a tile; a row is NT / BQ lanes, a key NT / BK lanes, so that a
 * thread holds at most 8 columns of o or dq and 8 + 8 of dk, dv. The shared arrays are
 * sized for the tier's largest head (64, 128, 256: HPDL_ATTN_HEAD_CAP), so every head size
 * of a tier has the shared memory, and so the occupancy and the register budget, of the one
 * cuda.attention.sm_XX compiles; all stay under 48 KB of static shared memory (no opt-in).
 * Registers: under the kernels' __launch_bounds__(256), ptxas aims at the occupancy the
 * shared memory leaves (on sm_90 about 40 registers for a 35 KB block, 48 up to 45.5 KB, 64
 * above) and spills a few registers where that buys one more block a SM; the odd dkdv
 * tiles (26, 18 rows) put its blocks above 45.5 KB for that reason. The checked head sizes
 * do not spill (sm_80, sm_90, NVRTC 13); of 41 head sizes tried, one kernel does (dkdv at
 * D = Dv = 160 on sm_90, 8 bytes). __launch_bounds__(256, 1) on the generated kernels would
 * leave ptxas free: no spill at any of them, 80 registers at most.
 *
 * Every launch is 1-D, `threads` a block:
 *
 *     forward  hpdl_attn_fwd       B * H * ceil(T / fwd BQ) blocks
 *     backward hpdl_attn_bwd_dt    ceil(B * H * T / (threads / 32)) blocks  (a warp a row)
 *              hpdl_attn_bwd_dkdv  B * Hk * ceil(S / dkdv BK) blocks
 *              hpdl_attn_bwd_dq    B * H * ceil(T / dq BQ) blocks
 *
 * the backward's three in that order (dkdv and dq both read what dt writes: B * H * T floats
 * of scratch). A grid of 0 blocks (S = 0) is no launch: CUDA refuses it.
 *
 * Macros, so that they are constant expressions for C and for template arguments alike;
 * hpdl_attn_plan fills them all in on the host. */
#ifndef HPDL_ATTENTION_CFG_H
#define HPDL_ATTENTION_CFG_H

#define HPDL_ATTN_MAX_HEAD 256
#define HPDL_ATTN_M(D, Dv) ((D) > (Dv) ? (D) : (Dv))
#define HPDL_ATTN_TIER(D, Dv) (HPDL_ATTN_M(D, Dv) <= 64 ? 0 : HPDL_ATTN_M(D, Dv) <= 128 ? 1 : 2)
#define HPDL_ATTN_PICK(D, Dv, a, b, c) (HPDL_ATTN_TIER(D, Dv) == 0 ? (a) : HPDL_ATTN_TIER(D, Dv) == 1 ? (b) : (c))
#define HPDL_ATTN_HEAD_CAP(D, Dv) HPDL_ATTN_PICK(D, Dv, 64, 128, 256) /* the shared arrays' row length */
#define HPDL_ATTN_THREADS(D, Dv) HPDL_ATTN_PICK(D, Dv, 256, 256, 128)
#define HPDL_ATTN_FWD_BQ(D, Dv) HPDL_ATTN_PICK(D, Dv, 32, 16, 4)
#define HPDL_ATTN_FWD_BK(D, Dv) HPDL_ATTN_PICK(D, Dv, 32, 32, 16)
#define HPDL_ATTN_DKDV_BQ(D, Dv) HPDL_ATTN_PICK(D, Dv, 40, 26, 18)
#define HPDL_ATTN_DKDV_BK(D, Dv) HPDL_ATTN_PICK(D, Dv, 32, 16, 4)
#define HPDL_ATTN_DQ_BQ(D, Dv) HPDL_ATTN_PICK(D, Dv, 32, 16, 4)
#define HPDL_ATTN_DQ_BK(D, Dv) HPDL_ATTN_PICK(D, Dv, 48, 28, 16)
#define HPDL_ATTN_DT_ROWS(D, Dv) (HPDL_ATTN_THREADS(D, Dv) / 32) /* rows a block of the dt kernel */

#define HPDL_ATTN_CDIV(a, b) (((a) + (b) - 1) / (b))

/* The tensor-core kernels (hpdl_attention.cuh, sm_80 on): head sizes 16 .. 64, multiples
 * of 8 (at 8 ptxas keeps the scores on the stack); 128 threads, 4 warps of 16 query rows
 * (forward, dq) or 16 keys (dkdv) a block; key tiles of 32 (forward) and 16 (dq), query
 * tiles of 16 (dkdv). Their static shared memory at D = Dv = 64: forward 34,944 bytes,
 * dkdv 43,712, dq 43,584 (dt: the SIMT kernel, HPDL_ATTN_THREADS). */
#define HPDL_ATTN_TC(D, Dv) ((D) % 8 == 0 && (Dv) % 8 == 0 && (D) >= 16 && (D) <= 64 && (Dv) >= 16 && (Dv) <= 64)
#define HPDL_ATTN_TC_THREADS 128
#define HPDL_ATTN_TC_MIN_BLOCKS 4 /* __launch_bounds__(128, 4): at most 128 registers */
#define HPDL_ATTN_TC_ROWS 64
#define HPDL_ATTN_TC_KEYS 64
#define HPDL_ATTN_TC_FWD_BK 32
#define HPDL_ATTN_TC_DKDV_BQ 16
#define HPDL_ATTN_TC_DQ_BK 16
/* The 16-bit tensor-core kernels (bf16 / fp16 operands, mma m16n8k16): the same blocks and
 * grids, for head sizes 16 .. 128, multiples of 8 (HPDL_ATTN_TC16: Llama's and Qwen's 128
 * too, at half the TF32 kernels' shared memory a value); their own inner tiles (multiples
 * of 16), by the larger head M = max(D, Dv):
 *
 *     M          forward keys    dkdv rows   dq keys        __launch_bounds__(128, N): N
 *     16 .. 64   64, 2 buffers   16          32, 2 buffers  4 / 4 / 4
 *     72 .. 128  32, 1 buffer    16          16, 1 buffer   3 / 2 / 3   (fwd / dkdv / dq)
 *
 * Static shared memory at D = Dv = 64: forward 46,336 bytes, dkdv 23,232, dq 36,992; at 128:
 * forward 34,944, dkdv 43,712, dq 43,584 (the 64 query rows' q and dO take 34,816 there, so
 * dq's key tile has one buffer of 16 and the forward's one of 32 where two of 16 would fit:
 * half the softmax rescales of o a key). dkdv's dk and dv accumulators at 128 are 128
 * floats a lane: two blocks a multiprocessor (at most 255 registers; NVRTC 13 takes about
 * 220); the forward's 64 floats of o and dq's of its sum fit 128 registers in the tests'
 * kernels, but the generated forward that also writes o in 16 bits spilled 8 bytes at
 * Llama's shape there: three blocks (at most 168 registers; NVRTC 13 takes 147-158 for the
 * forward, 128-139 for dq). */
#define HPDL_ATTN_TC16(D, Dv) \
  ((D) % 8 == 0 && (Dv) % 8 == 0 && (D) >= 16 && (D) <= 128 && (Dv) >= 16 && (Dv) <= 128)
#define HPDL_ATTN_H16_WIDE(D, Dv) (HPDL_ATTN_M(D, Dv) > 64)
#define HPDL_ATTN_H16_FWD_BK(D, Dv) (HPDL_ATTN_H16_WIDE(D, Dv) ? 32 : 64)
#define HPDL_ATTN_H16_FWD_BUFS(D, Dv) (HPDL_ATTN_H16_WIDE(D, Dv) ? 1 : 2)
#define HPDL_ATTN_H16_DKDV_BQ(D, Dv) 16
#define HPDL_ATTN_H16_DQ_BK(D, Dv) (HPDL_ATTN_H16_WIDE(D, Dv) ? 16 : 32)
#define HPDL_ATTN_H16_DQ_BUFS(D, Dv) (HPDL_ATTN_H16_WIDE(D, Dv) ? 1 : 2)
/* the blocks a multiprocessor the kernels' __launch_bounds__ ask for: kind 0 forward, 1
 * dkdv, 2 dq */
#define HPDL_ATTN_H16_MIN_BLOCKS(kind, D, Dv) \
  (!HPDL_ATTN_H16_WIDE(D, Dv) ? HPDL_ATTN_TC_MIN_BLOCKS : (kind) == 1 ? 2 : 3)
#define HPDL_ATTN_FWD_GRID(B, H, T, D, Dv) \
  ((long long)(B) * (long long)(H) * HPDL_ATTN_CDIV((long long)(T), HPDL_ATTN_FWD_BQ(D, Dv)))
#define HPDL_ATTN_DT_GRID(B, H, T, D, Dv) \
  HPDL_ATTN_CDIV((long long)(B) * (long long)(H) * (long long)(T), HPDL_ATTN_DT_ROWS(D, Dv))
#define HPDL_ATTN_DKDV_GRID(B, Hk, S, D, Dv) \
  ((long long)(B) * (long long)(Hk) * HPDL_ATTN_CDIV((long long)(S), HPDL_ATTN_DKDV_BK(D, Dv)))
#define HPDL_ATTN_DQ_GRID(B, H, T, D, Dv) \
  ((long long)(B) * (long long)(H) * HPDL_ATTN_CDIV((long long)(T), HPDL_ATTN_DQ_BQ(D, Dv)))
#define HPDL_ATTN_SCRATCH_FLOATS(B, H, T) ((long long)(B) * (long long)(H) * (long long)(T)) /* Dt */

/* ------------------------------------------------------------------ host helper */
#if !defined(__CUDACC_RTC__)

/* static inline, and no warning where a file includes the header and calls none of it
 * (nvcc warns about unreferenced static functions, #177-D) */
#if defined(__GNUC__) || defined(__clang__)
#define HPDL_ATTN_HOST static inline __attribute__((unused))
#else
#define HPDL_ATTN_HOST static inline
#endif

/* One attention's launches. */
typedef struct hpdl_attn_launch {
  int tc;                              /* the tensor-core kernels (hpdl_attn_plan_tc): 1 TF32, 2 16-bit */
  int threads;                         /* every launch's block but dt's (HPDL_ATTN_THREADS) */
  int fwd_bq, fwd_bk, dkdv_bq, dkdv_bk, dq_bq, dq_bk; /* the tiles of the templates' defaults */
  long long grid_fwd, grid_dt, grid_dkdv, grid_dq; /* blocks; 0: no launch */
  long long scratch_floats;            /* the backward's Dt, B * H * T floats */
} hpdl_attn_launch;

/* Fills *L for this shape; -1 (L untouched) when D or Dv is outside 1 .. 256, a size is
 * negative, H is no multiple of Hk, or a grid needs more than 2^31 - 1 blocks. */
HPDL_ATTN_HOST int hpdl_attn_plan(int D, int Dv, long long B, long long H, long long Hk, long long T, long long S,
                                  hpdl_attn_launch *L) {
  if (D < 1 || D > HPDL_ATTN_MAX_HEAD || Dv < 1 || Dv > HPDL_ATTN_MAX_HEAD) return -1;
  if (B < 0 || H < 1 || Hk < 1 || H % Hk || T < 0 || S < 0) return -1;
  /* the products below stay in range: each factor checked against 2^31 first */
  if (B > 0x7fffffffLL || H > 0x7fffffffLL || T > 0x7fffffffLL || S > 0x7fffffffLL) return -1;
  hpdl_attn_launch x;
  x.tc = 0;
  x.threads = HPDL_ATTN_THREADS(D, Dv);
  x.fwd_bq = HPDL_ATTN_FWD_BQ(D, Dv);
  x.fwd_bk = HPDL_ATTN_FWD_BK(D, Dv);
  x.dkdv_bq = HPDL_ATTN_DKDV_BQ(D, Dv);
  x.dkdv_bk = HPDL_ATTN_DKDV_BK(D, Dv);
  x.dq_bq = HPDL_ATTN_DQ_BQ(D, Dv);
  x.dq_bk = HPDL_ATTN_DQ_BK(D, Dv);
  if (B * H > 0x7fffffffLL) return -1;
  x.grid_fwd = HPDL_ATTN_FWD_GRID(B, H, T, D, Dv);
  x.grid_dt = HPDL_ATTN_DT_GRID(B, H, T, D, Dv);
  x.grid_dkdv = HPDL_ATTN_DKDV_GRID(B, Hk, S, D, Dv);
  x.grid_dq = HPDL_ATTN_DQ_GRID(B, H, T, D, Dv);
  x.scratch_floats = HPDL_ATTN_SCRATCH_FLOATS(B, H, T);
  if (x.grid_fwd > 0x7fffffffLL || x.grid_dt > 0x7fffffffLL || x.grid_dkdv > 0x7fffffffLL ||
      x.grid_dq > 0x7fffffffLL)
    return -1;
  *L = x;
  return 0;
}

/* The tensor-core kernels' launches: hpdl_attn_plan's checks, then -1 too where the heads
 * are not HPDL_ATTN_TC's (the TF32 kernels) or, with h16, HPDL_ATTN_TC16's (the 16-bit
 * ones); the same Dt scratch and dt launch. */
HPDL_ATTN_HOST int hpdl_attn_plan_tc(int D, int Dv, int h16, long long B, long long H, long long Hk, long long T,
                                     long long S, hpdl_attn_launch *L) {
  hpdl_attn_launch x;
  if (!(h16 ? HPDL_ATTN_TC16(D, Dv) : HPDL_ATTN_TC(D, Dv)) || hpdl_attn_plan(D, Dv, B, H, Hk, T, S, &x)) return -1;
  x.tc = h16 ? 2 : 1;
  x.threads = HPDL_ATTN_TC_THREADS; /* the dt launch keeps its HPDL_ATTN_THREADS (x.grid_dt) */
  x.fwd_bq = x.dq_bq = HPDL_ATTN_TC_ROWS;
  x.fwd_bk = h16 ? HPDL_ATTN_H16_FWD_BK(D, Dv) : HPDL_ATTN_TC_FWD_BK;
  x.dkdv_bq = h16 ? HPDL_ATTN_H16_DKDV_BQ(D, Dv) : HPDL_ATTN_TC_DKDV_BQ;
  x.dkdv_bk = HPDL_ATTN_TC_KEYS;
  x.dq_bk = h16 ? HPDL_ATTN_H16_DQ_BK(D, Dv) : HPDL_ATTN_TC_DQ_BK;
  x.grid_fwd = x.grid_dq = B * H * HPDL_ATTN_CDIV(T, HPDL_ATTN_TC_ROWS);
  x.grid_dkdv = B * Hk * HPDL_ATTN_CDIV(S, HPDL_ATTN_TC_KEYS);
  *L = x;
  return 0;
}
#endif /* !__CUDACC_RTC__ */
#endif /* HPDL_ATTENTION_CFG_H */
