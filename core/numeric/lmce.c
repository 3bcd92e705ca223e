/* lmce.c - the head's GEMM and the cross-entropy in blocks (lmce.h). */
#include "lmce.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gemm16.h"
#include "half.h"

/* Rows per pass over the vocabulary: bounds the backward's partial dx
 * (chunks x LCE_ROWS x C floats). Columns per GEMM: a block of logits
 * LCE_ROWS x LCE_COLS (1 MB) stays in the worker's cache between the GEMM
 * that makes it and the pass that reads it. */
enum { LCE_ROWS = 512, LCE_COLS = 512, LCE_MAX_CHUNKS = 16 };

/* The vocabulary's chunks: at most LCE_MAX_CHUNKS of whole LCE_COLS blocks,
 * a function of V alone (the work split, and so the rounding, does not
 * depend on the thread count). */
static int64_t chunk_width(int64_t V) {
  int64_t w = (V + LCE_MAX_CHUNKS - 1) / LCE_MAX_CHUNKS;
  w = (w + LCE_COLS - 1) / LCE_COLS * LCE_COLS;
  return w > 0 ? w : LCE_COLS;
}

/* exp(x) in float without a library call, so that the passes over a block
 * of logits vectorise: Cody-Waite reduction x = n ln2 + r (n rounded to
 * nearest by the 1.5 x 2^23 trick), Cephes expf's degree-6 polynomial on r
 * (relative error about 1e-7), 2^n put into the exponent bits; below -87
 * (a logit far under the row's maximum) it gives 0. */
static inline float fast_expf(float x) {
  float xc = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  float t = xc * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

/* The max and the sum of exp(z - m) of a block's row in eight lanes, an
 * order the compiler may keep while it vectorises (no reassociation). */
static float row_max(const float *z, int64_t n) {
  float lane[8];
  for (int l = 0; l < 8; l++) lane[l] = z[0];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) lane[l] = z[j + l] > lane[l] ? z[j + l] : lane[l];
  for (; j < n; j++) lane[0] = z[j] > lane[0] ? z[j] : lane[0];
  float m = lane[0];
  for (int l = 1; l < 8; l++) m = lane[l] > m ? lane[l] : m;
  return m;
}

static float row_sum_exp(const float *z, int64_t n, float m) {
  float lane[8] = {0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) lane[l] += fast_expf(z[j + l] - m);
  for (; j < n; j++) lane[0] += fast_expf(z[j] - m);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* A row's running log-sum-exp (max *m, sum *s of exp(z - max)) taking n
 * more logits z (online softmax) */
static void lse_add(float *m, double *s, const float *z, int64_t n) {
  float bm = row_max(z, n), nm = bm > *m ? bm : *m;
  *s = *s * exp((double)*m - (double)nm) + (double)row_sum_exp(z, n, nm);
  *m = nm;
}

typedef struct {
  const LceShape *s;
  AttnSgemm gemm;
  const float *x, *w, *dy, *lse;
  const int32_t *t;
  int64_t r0, n, cw;   /* this pass's rows [r0, r0 + n), the chunk width */
  float *pm;           /* forward: per chunk and row, the running max */
  double *ps;          /* and the sum of exp(z - max) */
  float *dxp;          /* backward: per chunk, its share of dx [n, C]; NULL: dx not wanted */
  float *dw;           /* backward: the weight's gradient; NULL: not wanted */
  int dw_first_write;  /* the first pass writes dw (beta 0) unless adding */
  atomic_int oom;
} LceJob;

/* The [C, V] layout's row stride: the weight's full width when the columns
 * used are a prefix of it (a padded vocabulary shard). */
static int64_t ldv(const LceShape *s) { return s->vstride > 0 ? s->vstride : s->V; }

/* z[n, nb] = x[r0 .. r0 + n) W[:, v0 .. v0 + nb) */
static void logits_block(const LceJob *J, int64_t v0, int64_t nb, float *z) {
  const LceShape *s = J->s;
  const float *xa = J->x + J->r0 * s->C;
  if (s->w_rows) J->gemm(0, 1, J->n, nb, s->C, 1.0f, xa, s->C, J->w + v0 * s->C, s->C, 0.0f, z, nb);
  else J->gemm(0, 0, J->n, nb, s->C, 1.0f, xa, s->C, J->w + v0, ldv(s), 0.0f, z, nb);
}

static void forward_chunks(void *ctx, int64_t lo, int64_t hi) {
  LceJob *J = ctx;
  const LceShape *s = J->s;
  float *z = malloc(sizeof(float) * (size_t)(J->n * LCE_COLS));
  if (!z) {
    atomic_store(&J->oom, 1);
    return;
  }
  for (int64_t c = lo; c < hi; c++) {
    float *pm = J->pm + c * J->n;
    double *ps = J->ps + c * J->n;
    for (int64_t r = 0; r < J->n; r++) pm[r] = -INFINITY, ps[r] = 0;
    int64_t end = (c + 1) * J->cw < s->V ? (c + 1) * J->cw : s->V;
    for (int64_t v0 = c * J->cw; v0 < end; v0 += LCE_COLS) {
      int64_t nb = end - v0 < LCE_COLS ? end - v0 : LCE_COLS;
      logits_block(J, v0, nb, z);
      for (int64_t r = 0; r < J->n; r++) lse_add(&pm[r], &ps[r], z + r * nb, nb);
    }
  }
  free(z);
}

static void backward_chunks(void *ctx, int64_t lo, int64_t hi) {
  LceJob *J = ctx;
  const LceShape *s = J->s;
  int64_t C = s->C;
  float *g = malloc(sizeof(float) * (size_t)(J->n * LCE_COLS));
  if (!g) {
    atomic_store(&J->oom, 1);
    return;
  }
  for (int64_t c = lo; c < hi; c++) {
    float *dxp = J->dxp ? J->dxp + c * J->n * C : NULL;
    int64_t begin = c * J->cw, end = (c + 1) * J->cw < s->V ? (c + 1) * J->cw : s->V;
    for (int64_t v0 = begin; v0 < end; v0 += LCE_COLS) {
      int64_t nb = end - v0 < LCE_COLS ? end - v0 : LCE_COLS;
      logits_block(J, v0, nb, g);
      for (int64_t r = 0; r < J->n; r++) {
        float *gr = g + r * nb, lse = J->lse[r], d = J->dy[J->r0 + r];
        for (int64_t j = 0; j < nb; j++) gr[j] = d * fast_expf(gr[j] - lse);
        int64_t tj = J->t ? (int64_t)J->t[J->r0 + r] - v0 : -1;
        if (tj >= 0 && tj < nb) gr[tj] -= d;
      }
      const float *xa = J->x + J->r0 * C;
      if (J->dw) {
        float beta = J->dw_first_write ? 0.0f : 1.0f;
        if (s->w_rows) J->gemm(1, 0, nb, C, J->n, 1.0f, g, nb, xa, C, beta, J->dw + v0 * C, C);
        else J->gemm(1, 0, C, nb, J->n, 1.0f, xa, C, g, nb, beta, J->dw + v0, ldv(s));
      }
      if (dxp) {
        float beta = v0 == begin ? 0.0f : 1.0f;
        if (s->w_rows) J->gemm(0, 0, J->n, C, nb, 1.0f, g, nb, J->w + v0 * C, C, beta, dxp, C);
        else J->gemm(0, 1, J->n, C, nb, 1.0f, g, nb, J->w + v0, ldv(s), beta, dxp, C);
      }
    }
  }
  free(g);
}

static int64_t nchunks_of(const LceShape *s) { return (s->V + chunk_width(s->V) - 1) / chunk_width(s->V); }

/* element i of x or w, float or bf16 bits */
static double elem(const void *p, int bf16, int64_t i) {
  return bf16 ? (double)half_bf16_to_f32(((const uint16_t *)p)[i]) : (double)((const float *)p)[i];
}

/* z_r[t_r] for rows [r0, r0 + n): one dot product each, in double, the same
 * in the forward and the backward (which recovers lse from nll with it) */
static void target_logits(const LceShape *s, const void *x, const void *w, const int32_t *t, int64_t r0, int64_t n, float *zt) {
  if (!t) { /* no targets (LINEAR_LSE): the log-sum-exp alone */
    for (int64_t r = 0; r < n; r++) zt[r] = 0;
    return;
  }
  for (int64_t r = 0; r < n; r++) {
    int64_t xr = (r0 + r) * s->C, v = t[r0 + r];
    double dot = 0;
    for (int64_t k = 0; k < s->C; k++) dot += elem(x, s->bf16, xr + k) * elem(w, s->bf16, s->w_rows ? v * s->C + k : k * ldv(s) + v);
    zt[r] = (float)dot;
  }
}

/* dw's columns in use (a prefix of the [C, V] layout's rows), zeroed */
static void zero_dw(const LceShape *s, float *dw) {
  if (s->w_rows) memset(dw, 0, sizeof(float) * (size_t)(s->C * s->V));
  else
    for (int64_t k = 0; k < s->C; k++) memset(dw + k * ldv(s), 0, sizeof(float) * (size_t)s->V);
}

static const char *check(const LceShape *s, const int32_t *t) {
  if (s->rows < 0 || s->C < 1 || s->V < 1) return "linear_ce: bad shape";
  for (int64_t r = 0; t && r < s->rows; r++)
    if (t[r] < 0 || t[r] >= s->V) return "linear_ce: a target outside the vocabulary";
  return NULL;
}

/* ---- bf16 operands: chunk by chunk, each GEMM on all the threads ---- */

typedef struct {
  const LceShape *s;
  int64_t r0, n, nb, v0;
  float *z;           /* the chunk's logits [n, nb] */
  float *m;           /* forward: per row, the running max */
  double *sum;        /* and sum of exp(z - max) */
  const float *lse, *dy;
  const int32_t *t;
  uint16_t *g16;      /* backward: dy (softmax - onehot) in bf16 [n, nb] */
} Rows16;

static void rows16_forward(void *ctx, int64_t lo, int64_t hi) {
  Rows16 *R = ctx;
  for (int64_t r = lo; r < hi; r++) lse_add(&R->m[r], &R->sum[r], R->z + r * R->nb, R->nb);
}

static void rows16_backward(void *ctx, int64_t lo, int64_t hi) {
  Rows16 *R = ctx;
  for (int64_t r = lo; r < hi; r++) {
    const float *zr = R->z + r * R->nb;
    uint16_t *gr = R->g16 + r * R->nb;
    float lse = R->lse[r], d = R->dy[R->r0 + r];
    int64_t tj = R->t ? (int64_t)R->t[R->r0 + r] - R->v0 : -1;
    for (int64_t j = 0; j < R->nb; j++) {
      float g = d * fast_expf(zr[j] - lse) - (j == tj ? d : 0.0f);
      uint32_t bits;
      memcpy(&bits, &g, sizeof bits);
      gr[j] = half_bf16_bits(bits);
    }
  }
}

static void rows16(const LceShape *s, Rows16 *R, void (*fn)(void *, int64_t, int64_t)) {
  if (s->par_for) s->par_for(s->par, R->n, fn, R);
  else fn(R, 0, R->n);
}

/* The bf16 path's chunks: one GEMM each on all the threads, so wider than
 * the fp32 path's work items (8192 columns measured best on GPT-2's head:
 * step 880-945 ms at 3584, 800-830 at 6144-8192, 930-970 at 12288). */
static int64_t chunk_width16(int64_t V) {
  int64_t w = chunk_width(V);
  w = w < 8192 ? 8192 : w;
  return w < V ? w : V;
}

/* z[n, nb] = x16[r0 .. r0 + n) W16[:, v0 .. v0 + nb) */
static int logits16(const LceShape *s, const uint16_t *x, const uint16_t *w, int64_t r0, int64_t n, int64_t v0, int64_t nb, float *z,
                    char *why, int len) {
  const uint16_t *xa = x + r0 * s->C;
  if (s->w_rows) return gemm16_bf16(0, 1, n, nb, s->C, 1.0f, xa, s->C, w + v0 * s->C, s->C, 0.0f, z, nb, s->sgemm, s->nthreads, why, len);
  return gemm16_bf16(0, 0, n, nb, s->C, 1.0f, xa, s->C, w + v0, ldv(s), 0.0f, z, nb, s->sgemm, s->nthreads, why, len);
}

static const char *forward16(const LceShape *s, const uint16_t *x, const uint16_t *w, const int32_t *t, float *nll) {
  static _Thread_local char why[200];
  int64_t cw = chunk_width16(s->V), rows = s->rows < LCE_ROWS ? s->rows : LCE_ROWS;
  float *z = malloc(sizeof(float) * (size_t)(rows * cw + 1)), *m = malloc(sizeof(float) * (size_t)(rows + 1));
  float *zt = malloc(sizeof(float) * (size_t)(rows + 1));
  double *sum = malloc(sizeof(double) * (size_t)(rows + 1));
  const char *e = !z || !m || !zt || !sum ? "linear_ce: out of memory for scratch" : NULL;
  for (int64_t r0 = 0; r0 < s->rows && !e; r0 += LCE_ROWS) {
    Rows16 R = {.s = s, .r0 = r0, .n = s->rows - r0 < LCE_ROWS ? s->rows - r0 : LCE_ROWS, .z = z, .m = m, .sum = sum};
    for (int64_t r = 0; r < R.n; r++) m[r] = -INFINITY, sum[r] = 0;
    for (int64_t v0 = 0; v0 < s->V && !e; v0 += cw) {
      R.v0 = v0, R.nb = s->V - v0 < cw ? s->V - v0 : cw;
      if (logits16(s, x, w, r0, R.n, v0, R.nb, z, why, sizeof why)) e = why;
      else rows16(s, &R, rows16_forward);
    }
    if (e) break;
    target_logits(s, x, w, t, r0, R.n, zt);
    for (int64_t r = 0; r < R.n; r++) nll[r0 + r] = (float)((double)m[r] + log(sum[r]) - (double)zt[r]);
  }
  free(z), free(m), free(zt), free(sum);
  return e;
}

static const char *backward16(const LceShape *s, const uint16_t *x, const uint16_t *w, const int32_t *t, const float *nll,
                              const float *dy, float *dx, float *dw, int dw_add) {
  static _Thread_local char why[200];
  int64_t C = s->C, cw = chunk_width16(s->V), rows = s->rows < LCE_ROWS ? s->rows : LCE_ROWS;
  float *z = malloc(sizeof(float) * (size_t)(rows * cw + 1)), *lse = malloc(sizeof(float) * (size_t)(rows + 1));
  uint16_t *g16 = malloc(sizeof(uint16_t) * (size_t)(rows * cw + 1));
  const char *e = !z || !lse || !g16 ? "linear_ce_bwd: out of memory for scratch" : NULL;
  if (!e && dw && !dw_add && s->rows == 0) zero_dw(s, dw);
  for (int64_t r0 = 0; r0 < s->rows && !e; r0 += LCE_ROWS) {
    Rows16 R = {.s = s, .r0 = r0, .n = s->rows - r0 < LCE_ROWS ? s->rows - r0 : LCE_ROWS, .z = z, .lse = lse, .dy = dy, .t = t,
                .g16 = g16};
    target_logits(s, x, w, t, r0, R.n, lse);
    for (int64_t r = 0; r < R.n; r++) lse[r] += nll[r0 + r];
    const uint16_t *xa = x + r0 * C;
    for (int64_t v0 = 0; v0 < s->V && !e; v0 += cw) {
      R.v0 = v0, R.nb = s->V - v0 < cw ? s->V - v0 : cw;
      if (logits16(s, x, w, r0, R.n, v0, R.nb, z, why, sizeof why)) {
        e = why;
        break;
      }
      rows16(s, &R, rows16_backward);
      int64_t nb = R.nb, n = R.n;
      if (dw) {
        float beta = r0 == 0 && !dw_add ? 0.0f : 1.0f;
        int rc = s->w_rows ? gemm16_bf16(1, 0, nb, C, n, 1.0f, g16, nb, xa, C, beta, dw + v0 * C, C, s->sgemm, s->nthreads, why, sizeof why)
                           : gemm16_bf16(1, 0, C, nb, n, 1.0f, xa, C, g16, nb, beta, dw + v0, ldv(s), s->sgemm, s->nthreads, why, sizeof why);
        if (rc) e = why;
      }
      if (dx && !e) {
        float beta = v0 == 0 ? 0.0f : 1.0f;
        int rc = s->w_rows ? gemm16_bf16(0, 0, n, C, nb, 1.0f, g16, nb, w + v0 * C, C, beta, dx + r0 * C, C, s->sgemm, s->nthreads, why, sizeof why)
                           : gemm16_bf16(0, 1, n, C, nb, 1.0f, g16, nb, w + v0, ldv(s), beta, dx + r0 * C, C, s->sgemm, s->nthreads, why, sizeof why);
        if (rc) e = why;
      }
    }
  }
  free(z), free(lse), free(g16);
  return e;
}

static void run(const LceShape *s, LceJob *J, int64_t items, void (*fn)(void *, int64_t, int64_t)) {
  if (s->par_for) s->par_for(s->par, items, fn, J);
  else fn(J, 0, items);
}

const char *lce_forward(const LceShape *s, const void *xv, const void *wv, const int32_t *t, float *nll) {
  const char *why = check(s, t);
  if (why) return why;
  if (s->bf16) return forward16(s, xv, wv, t, nll);
  const float *x = xv, *w = wv;
  int64_t nc = nchunks_of(s), rows = s->rows < LCE_ROWS ? s->rows : LCE_ROWS;
  LceJob J = {.s = s, .gemm = s->sgemm ? s->sgemm : attn_loop_sgemm, .x = x, .w = w, .t = t, .cw = chunk_width(s->V)};
  J.pm = malloc(sizeof(float) * (size_t)(nc * rows + 1));
  J.ps = malloc(sizeof(double) * (size_t)(nc * rows + 1));
  float *zt = malloc(sizeof(float) * (size_t)(rows + 1));
  if (!J.pm || !J.ps || !zt) {
    free(J.pm), free(J.ps), free(zt);
    return "linear_ce: out of memory for scratch";
  }
  atomic_init(&J.oom, 0);
  for (int64_t r0 = 0; r0 < s->rows && !atomic_load(&J.oom); r0 += LCE_ROWS) {
    J.r0 = r0;
    J.n = s->rows - r0 < LCE_ROWS ? s->rows - r0 : LCE_ROWS;
    run(s, &J, nc, forward_chunks);
    target_logits(s, x, w, t, r0, J.n, zt);
    for (int64_t r = 0; r < J.n; r++) {
      float m = -INFINITY;
      for (int64_t c = 0; c < nc; c++) m = J.pm[c * J.n + r] > m ? J.pm[c * J.n + r] : m;
      double sum = 0;
      for (int64_t c = 0; c < nc; c++) sum += J.ps[c * J.n + r] * exp((double)J.pm[c * J.n + r] - (double)m);
      nll[r0 + r] = (float)((double)m + log(sum) - (double)zt[r]);
    }
  }
  free(J.pm), free(J.ps), free(zt);
  return atomic_load(&J.oom) ? "linear_ce: out of memory for scratch" : NULL;
}

const char *lce_backward(const LceShape *s, const void *xv, const void *wv, const int32_t *t, const float *nll, const float *dy,
                         float *dx, float *dw, int dw_add) {
  const char *why = check(s, t);
  if (why) return why;
  if (!dx && !dw) return NULL;
  if (s->bf16) return backward16(s, xv, wv, t, nll, dy, dx, dw, dw_add);
  const float *x = xv, *w = wv;
  int64_t nc = nchunks_of(s), rows = s->rows < LCE_ROWS ? s->rows : LCE_ROWS;
  LceJob J = {.s = s, .gemm = s->sgemm ? s->sgemm : attn_loop_sgemm, .x = x, .w = w, .t = t, .dy = dy, .cw = chunk_width(s->V),
              .dw = dw};
  float *lse = malloc(sizeof(float) * (size_t)(rows + 1));
  J.dxp = dx ? malloc(sizeof(float) * (size_t)(nc * rows * s->C + 1)) : NULL;
  if (!lse || (dx && !J.dxp)) {
    free(lse), free(J.dxp);
    return "linear_ce_bwd: out of memory for scratch";
  }
  J.lse = lse;
  atomic_init(&J.oom, 0);
  if (dw && !dw_add && s->rows == 0) zero_dw(s, dw);
  for (int64_t r0 = 0; r0 < s->rows && !atomic_load(&J.oom); r0 += LCE_ROWS) {
    J.r0 = r0;
    J.n = s->rows - r0 < LCE_ROWS ? s->rows - r0 : LCE_ROWS;
    J.dw_first_write = r0 == 0 && !dw_add;
    target_logits(s, x, w, t, r0, J.n, lse);
    for (int64_t r = 0; r < J.n; r++) lse[r] += nll[r0 + r];
    run(s, &J, nc, backward_chunks);
    if (!dx) continue;
    for (int64_t r = 0; r < J.n; r++) {
      float *o = dx + (r0 + r) * s->C;
      memcpy(o, J.dxp + r * s->C, sizeof(float) * (size_t)s->C);
      for (int64_t c = 1; c < nc; c++) {
        const float *p = J.dxp + (c * J.n + r) * s->C;
        for (int64_t k = 0; k < s->C; k++) o[k] += p[k];
      }
    }
  }
  free(lse), free(J.dxp);
  return atomic_load(&J.oom) ? "linear_ce_bwd: out of memory for scratch" : NULL;
}

int64_t lce_scratch_bytes(const LceShape *s, int nthreads) {
  if (s->V < 1 || s->C < 1) return -1;
  int64_t nc = nchunks_of(s), rows = s->rows < LCE_ROWS ? s->rows : LCE_ROWS;
  if (s->bf16) { /* a chunk's logits in fp32 and their gradient in bf16 */
    int64_t cw = chunk_width16(s->V);
    return (int64_t)(sizeof(float) + sizeof(uint16_t)) * rows * cw + (int64_t)(2 * sizeof(float) + sizeof(double)) * rows;
  }
  int64_t workers = nthreads < nc ? nthreads : nc;
  return (int64_t)sizeof(float) * (workers * rows * LCE_COLS + nc * rows * s->C + rows) + (int64_t)sizeof(double) * nc * rows;
}
