/* lmce.h - the language model's head and its cross-entropy in one, on the CPU
 * (ir_ops.h's LINEAR_CE and LINEAR_LSE and their gradients): the logits
 * z = x W of `rows` rows over a vocabulary of V are computed in blocks of
 * rows and columns and never stored whole (scratch is a few blocks per
 * worker plus, in the backward, the partial dx of each vocabulary chunk),
 * as Liger-Kernel's fused linear cross-entropy and torchtune's chunked loss
 * do on GPUs.
 *
 * x [rows, C], targets t [rows] (i32), W = w [C, V] or, with w_rows, the
 * transpose of w [V, C] (a tied embedding table); all contiguous row-major.
 * Forward: nll[r] = lse(z_r) - z_r[t_r]. Backward, with g[r, v] = dy[r]
 * (softmax(z_r)_v - [v = t_r]) and lse_r = nll_r + z_r[t_r]: dx = g W^T and
 * dw = the gradient in w's layout (g^T x for w [V, C], x^T g for w [C, V]).
 *
 * Work items are the vocabulary's chunks (fixed by V alone), each computed
 * in one order by one worker, and the chunks' partial results are combined
 * in chunk order, so the results are bit for bit the same for any number of
 * workers. GEMMs go through attn.h's hook (cblas_sgemm for the runtime). */
#ifndef HPDL_LMCE_H
#define HPDL_LMCE_H

#include <stdint.h>

#include "attn.h"

typedef struct {
  int64_t rows, C, V;
  int w_rows;         /* 1: w is [V, C] (z = x w^T); 0: w is [C, V] */
  AttnSgemm sgemm;    /* NULL: attn.h's plain loops */
  AttnParFor par_for; /* NULL: sequential */
  void *par;
  /* 1: x and w are bf16 bits (train { precision = bf16 }): every GEMM
   * multiplies bf16 operands into fp32 (gemm16.h, oneDNN on nthreads
   * threads, else widened for sgemm), the logits' gradient rounded to bf16
   * before its two GEMMs, as the unfused step stores it. gemm16 runs one
   * product at a time, so the vocabulary's chunks run in order, each GEMM
   * on all the threads, the rows' passes over par_for. */
  int bf16;
  int nthreads;
  /* > V: w [C, V] is the first V columns of a [C, vstride] weight (a padded
   * vocabulary shard's valid prefix); 0: V */
  int64_t vstride;
} LceShape;

/* NULL on success, else a reason (a target outside [0, V), out of memory).
 * x and w: float, or bf16 bits (uint16_t) with s->bf16. t NULL: no targets,
 * nll is each row's log-sum-exp (LINEAR_LSE), and the backward's gradient
 * dy softmax (no one-hot), its nll that log-sum-exp. */
const char *lce_forward(const LceShape *s, const void *x, const void *w, const int32_t *t, float *nll);

/* dx and dw may each be NULL (not wanted); dw_add adds the gradient into dw
 * (a parameter's gradient slot) instead of writing it. */
const char *lce_backward(const LceShape *s, const void *x, const void *w, const int32_t *t, const float *nll, const float *dy,
                         float *dx, float *dw, int dw_add);

/* Bytes of scratch a call allocates at most (docs, the planner). */
int64_t lce_scratch_bytes(const LceShape *s, int nthreads);

#endif
