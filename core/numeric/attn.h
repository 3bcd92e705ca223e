/* attn.h - scaled dot-product attention forward and backward in fp32 on the
 * CPU (ir_ops.h's ATTENTION and ATTENTION_BWD), tiled by blocks of query
 * rows so that the T x S score matrix is never stored whole: scratch is a
 * few blocks of rows of S scores per worker, linear in the sequence.
 *
 * q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv], contiguous row-major;
 * query head h reads key / value head h / (H / Hk). s[t][j] = scale q[t] .
 * k[j]; with `causal`, key j is allowed when colpos(j) <= rowpos(t), where
 * the positions are t and j, or, under context parallelism (size > 1), the
 * row's position in this rank's zigzag chunks and the key's in the ring
 * order its block arrived in (ir_ops.h, interp_global_pos).
 *
 * The forward writes out PACKED [B, H, T, Dv + 1]: o = sum_j P[t][j] v[j]
 * with P = exp(s - lse) over the allowed keys, then lse = log sum_j exp(s);
 * a row with no allowed key has o = 0, lse = -inf. The backward takes that
 * output and its gradient dout (same shape, last column d lse) and writes
 * grads = dq, dk, dv one after another (overwritten, not accumulated).
 *
 * The GEMMs go through a hook (cblas_sgemm for the runtime) and the work
 * items, one per (batch, key head), through a parallel-for hook. Each item
 * is computed in one fixed order by one worker, so results are bit for bit
 * the same for any split of the items (any thread count). */
#ifndef HPDL_ATTN_H
#define HPDL_ATTN_H

#include <stdint.h>

/* Row-major C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, op = transpose
 * when trans_* is nonzero (cblas_sgemm with CblasRowMajor). beta = 0 means C
 * is written, never read. Called concurrently from the workers. */
typedef void (*AttnSgemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Calls fn(ctx, lo, hi) over ranges covering [0, n) once each, in any order
 * and on any threads, and returns when all are done (par.h's par_for). */
typedef void (*AttnParFor)(void *par, int64_t n, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx);

/* The hook's fallback: plain loops in one fixed order (deterministic; also
 * conv.c's when it has no BLAS). */
void attn_loop_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

typedef struct {
  int64_t B, H, Hk, T, S, D, Dv;
  double scale;
  int causal;
  /* context parallelism: rows are rank row_rank's zigzag chunks of row_size,
   * keys the ring's blocks as seen by col_rank of col_size (<= 1: plain) */
  int row_rank, row_size, col_rank, col_size;
  AttnSgemm sgemm;    /* NULL: plain loops of the module's own */
  AttnParFor par_for; /* NULL: sequential */
  void *par;
  /* > 0: a sliding window under the causal mask: key j allowed when
   * 0 <= rowpos(t) - colpos(j) < window (ir_ops.h); 0: none */
  int64_t window;
  /* the keys' positions span col_span keys (0: S, the ring's blocks); one
   * ring block (ring attention a block at a time, cp_comm = ring): S x
   * col_size, col_rank the block's owner - the span's first block, as
   * kernels/hpdl_attention.cuh's Sc */
  int64_t col_span;
} AttnShape;

/* Query rows per tile. */
#define ATTN_BLOCK 64

/* NULL on success, else a reason (bad shape, out of memory). */
const char *attn_forward(const AttnShape *s, const float *q, const float *k, const float *v, float *out);
const char *attn_backward(const AttnShape *s, const float *q, const float *k, const float *v, const float *out,
                          const float *dout, float *grads);

/* Bytes of scratch the calls allocate at most when par_for runs at most
 * nthreads ranges at once (docs, the planner); -1 for a bad shape. */
int64_t attn_scratch_bytes(const AttnShape *s, int nthreads);

/* Ring attention's merge (ir_ops.h, ATTN_MERGE): c packed outputs
 * parts[s] [rows, Dv + 1] of attention over blocks of keys into the packed
 * output over all of them: lse = log sum_s exp(lse_s) (the largest
 * subtracted first), o = sum_s exp(lse_s - lse) o_s, in blocks' order; a
 * row whose every lse_s is -inf gets o = 0, lse = -inf. */
void attn_merge(const float *const *parts, int c, int64_t rows, int64_t Dv, float *out);

#endif
