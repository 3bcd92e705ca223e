/* attn.c - tiled attention forward and backward in fp32 (see attn.h). */
#include "attn.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- positions (context parallelism, ir_ops.h) ---- */

/* Element i of rank r's two zigzag chunks (r and 2 size - 1 - r, local / 2
 * long each) of a sequence split over `size` ranks: interp_global_pos's
 * layout 1, spelled out so that the module needs nothing of the executor. */
static int64_t zigzag(int64_t r, int64_t size, int64_t local, int64_t i) {
  int64_t h = local / 2;
  return i < h ? r * h + i : (2 * size - 1 - r) * h + (i - h);
}

/* Key `col` of the ring's blocks as rank r holds them: block b came from
 * rank r - b, and holds that rank's zigzag chunks; `span` keys in all (one
 * block: the first of a span of S x size, attn.h). */
static int64_t ring(int64_t r, int64_t size, int64_t span, int64_t col) {
  int64_t len = span / size, blk = col / len, owner = (r - blk + size) % size;
  return zigzag(owner, size, len, col % len);
}

static int64_t col_span(const AttnShape *s) { return s->col_span > 0 ? s->col_span : s->S; }

static int64_t row_pos(const AttnShape *s, int64_t t) {
  return s->row_size <= 1 ? t : zigzag(s->row_rank, s->row_size, s->T, t);
}

/* ---- the GEMM ---- */

/* The fallback of a NULL hook: plain loops in one fixed order, so results
 * are deterministic (not those of a BLAS bit for bit). A B^T takes dot
 * products with eight partial sums (contiguous, and vectorisable without
 * reassociating); A B runs row updates C[i] += a B[p]. */
void attn_loop_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++) {
    float *ci = c + i * ldc;
    if (tb) {
      for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * ldb;
        float part[8] = {0};
        int64_t p = 0;
        if (!ta) {
          const float *ai = a + i * lda;
          for (; p + 8 <= k; p += 8)
            for (int l = 0; l < 8; l++) part[l] += ai[p + l] * bj[p + l];
          for (; p < k; p++) part[0] += ai[p] * bj[p];
        } else {
          for (; p < k; p++) part[p & 7] += a[p * lda + i] * bj[p];
        }
        float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        ci[j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * ci[j]);
      }
    } else {
      for (int64_t j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
      for (int64_t p = 0; p < k; p++) {
        float x = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
        const float *bp = b + p * ldb;
        for (int64_t j = 0; j < n; j++) ci[j] += x * bp[j];
      }
    }
  }
}

/* ---- the softmax's rows ---- */

/* exp(x) as plain arithmetic the compiler vectorises (libm's expf is a call
 * per value, most of the forward's time): 2^k e^r with k = round(x / ln 2),
 * e^r by Cephes expf's polynomial, within 1.02 ulp of exp over all of
 * [-87, 88] (checked float by float). Arguments here are scores less their
 * row's max or lse, <= 0 up to rounding: below -87 gives 0 (e^-87 is
 * 2e-38, nothing beside the row's max of 1), above 88 inf, NaN NaN. The
 * range tests are on the bits: under the default -ftrapping-math compilers
 * keep float comparisons as branches, and do not vectorise the loop. */
typedef union {
  float f;
  uint32_t u;
} F32Bits;

static inline float exp_f32(float x) {
  F32Bits in = {x}, xc, kb, pow2, y;
  uint32_t lo = 0u - (uint32_t)(in.u > 0xC2AE0000u);           /* x < -87 (-inf, -NaN) */
  uint32_t hi = 0u - (uint32_t)((int32_t)in.u > 0x42B00000);    /* x > 88 (inf, NaN) */
  uint32_t nan = 0u - (uint32_t)((in.u & 0x7FFFFFFFu) > 0x7F800000u);
  xc.u = (in.u & ~(lo | hi)) | (0xC2AE0000u & lo) | (0x42B00000u & hi); /* clamped to [-87, 88] */
  kb.f = xc.f * 1.44269504088896341f + 12582912.0f; /* 1.5 2^23: k = round(x / ln 2) in the low bits */
  float kf = kb.f - 12582912.0f;
  float r = (xc.f - kf * 0.693359375f) - kf * -2.12194440e-4f;
  /* Estrin's scheme: a shorter dependency chain than Horner's */
  float r2 = r * r, r4 = r2 * r2;
  float p = ((5.0000001201e-1f + 1.6666665459e-1f * r) + (4.1665795894e-2f + 8.3334519073e-3f * r) * r2) +
            (1.3981999507e-3f + 1.9875691500e-4f * r) * r4;
  p = p * r2 + r + 1.0f;
  pow2.u = (kb.u - 0x4B400000u + 127u) << 23; /* 2^k, k in [-126, 127] */
  y.f = p * pow2.f;
  y.u = (y.u & ~(lo | hi)) | (0x7F800000u & hi);
  y.u = (y.u & ~nan) | (in.u & nan);
  return y.f;
}

/* The max of x[0, n): eight running maxima, not one chain of compares
 * (the max is the same whatever the order). */
static float row_max(const float *x, int64_t n) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
  for (int l = 1; l < 8; l++) m[0] = m[l] > m[0] ? m[l] : m[0];
  return m[0];
}

/* x[j] = exp(x[j] - sub) for j < n; returns their sum, in eight partial
 * sums combined in one fixed order. */
static float row_exp(float *x, int64_t n, float sub) {
  float part[8] = {0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) {
      x[j + l] = exp_f32(x[j + l] - sub);
      part[l] += x[j + l];
    }
  for (; j < n; j++) {
    x[j] = exp_f32(x[j] - sub);
    part[0] += x[j];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* ---- the work items ---- */

typedef struct {
  const AttnShape *s;
  const float *q, *k, *v, *out, *dout;
  float *dst; /* out (forward) or grads (backward) */
  int backward;
  AttnSgemm gemm;
  int64_t bq; /* query rows per tile */
  atomic_int oom;
} AttnJob;

/* Scratch of one worker, in floats: scores (and dS in the backward) for a
 * tile and one value per tile row, rounded up to an even count so that the
 * keys' positions, when the causal mask needs them (ring order), come
 * 8-byte aligned after. */
static int64_t worker_tiles(const AttnShape *s, int64_t bq, int backward) {
  return ((backward ? 2 : 1) * bq * s->S + bq + 1) & ~(int64_t)1;
}

static int64_t worker_floats(const AttnShape *s, int64_t bq, int backward) {
  return worker_tiles(s, bq, backward) + (s->causal && s->col_size > 1 ? 2 * s->S : 0);
}

/* The keys a tile of rows [t0, t0 + m) computes scores for: under a causal
 * mask whose keys are in order (no ring), only the prefix up to the
 * furthest row position; else all S. */
static int64_t tile_keys(const AttnShape *s, int64_t t0, int64_t m) {
  if (!s->causal || s->col_size > 1) return s->S;
  int64_t far = 0;
  for (int64_t i = 0; i < m; i++) {
    int64_t p = row_pos(s, t0 + i);
    if (p > far) far = p;
  }
  return far + 1 < s->S ? far + 1 : s->S;
}

/* Row i of a tile (position rp) keeps its allowed scores: the first `lim`
 * of the n computed (returned), the rest set to -inf when the keys are in
 * ring order (colpos). */
static int64_t mask_row(const AttnShape *s, const int64_t *colpos, int64_t rp, float *row, int64_t n) {
  if (!s->causal) return n;
  int64_t W = s->window;
  if (!colpos) {
    int64_t lim = rp + 1 < n ? rp + 1 : n;
    /* a sliding window: the keys before it too (the tile computed them) */
    for (int64_t j = 0; W > 0 && j < lim && j <= rp - W; j++) row[j] = -INFINITY;
    return lim;
  }
  for (int64_t j = 0; j < n; j++)
    if (colpos[j] > rp || (W > 0 && rp - colpos[j] >= W)) row[j] = -INFINITY;
  return n;
}

static void forward_item(AttnJob *jb, int64_t item, float *sc, float *inv, const int64_t *colpos) {
  const AttnShape *s = jb->s;
  int64_t G = s->H / s->Hk, b = item / s->Hk, hk = item % s->Hk, D = s->D, Dv = s->Dv, T = s->T;
  const float *kb = jb->k + item * s->S * D, *vb = jb->v + item * s->S * Dv;
  float scale = (float)s->scale;
  for (int64_t g = 0; g < G; g++) {
    int64_t bh = b * s->H + hk * G + g;
    const float *qh = jb->q + bh * T * D;
    float *oh = jb->dst + bh * T * (Dv + 1);
    for (int64_t t0 = 0; t0 < T; t0 += jb->bq) {
      int64_t m = T - t0 < jb->bq ? T - t0 : jb->bq, n = tile_keys(s, t0, m);
      jb->gemm(0, 1, m, n, D, scale, qh + t0 * D, D, kb, D, 0.0f, sc, n);
      /* softmax rows in fp32: exp(s - max) kept unnormalised, o scaled by 1 / sum after */
      for (int64_t i = 0; i < m; i++) {
        float *row = sc + i * n;
        int64_t lim = mask_row(s, colpos, row_pos(s, t0 + i), row, n);
        float mx = row_max(row, lim);
        if (mx == -INFINITY) lim = 0; /* no allowed key */
        float sum = row_exp(row, lim, mx);
        for (int64_t j = lim; j < n; j++) row[j] = 0.0f;
        inv[i] = lim ? 1.0f / sum : 0.0f;
        oh[(t0 + i) * (Dv + 1) + Dv] = lim ? mx + logf(sum) : -INFINITY;
      }
      /* o straight into the packed output: its rows are Dv + 1 apart */
      float *o = oh + t0 * (Dv + 1);
      jb->gemm(0, 0, m, Dv, n, 1.0f, sc, n, vb, Dv, 0.0f, o, Dv + 1);
      for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < Dv; c++) o[i * (Dv + 1) + c] *= inv[i];
    }
  }
}

static void backward_item(AttnJob *jb, int64_t item, float *P, float *dS, float *Dt, const int64_t *colpos) {
  const AttnShape *s = jb->s;
  int64_t G = s->H / s->Hk, b = item / s->Hk, hk = item % s->Hk, D = s->D, Dv = s->Dv, T = s->T, S = s->S;
  const float *kb = jb->k + item * S * D, *vb = jb->v + item * S * Dv;
  float scale = (float)s->scale;
  /* dk, dv of this key head: written by this item alone, summed over the group's heads in order */
  float *dq = jb->dst, *dk = dq + s->B * s->H * T * D + item * S * D;
  float *dv = jb->dst + s->B * s->H * T * D + s->B * s->Hk * S * D + item * S * Dv;
  memset(dk, 0, sizeof(float) * (size_t)(S * D));
  memset(dv, 0, sizeof(float) * (size_t)(S * Dv));
  for (int64_t g = 0; g < G; g++) {
    int64_t bh = b * s->H + hk * G + g;
    const float *qh = jb->q + bh * T * D, *oh = jb->out + bh * T * (Dv + 1), *doh = jb->dout + bh * T * (Dv + 1);
    float *dqh = dq + bh * T * D;
    for (int64_t t0 = 0; t0 < T; t0 += jb->bq) {
      int64_t m = T - t0 < jb->bq ? T - t0 : jb->bq, n = tile_keys(s, t0, m);
      const float *qt = qh + t0 * D, *dOt = doh + t0 * (Dv + 1);
      /* P again from the forward's lse, never stored whole */
      jb->gemm(0, 1, m, n, D, scale, qt, D, kb, D, 0.0f, P, n);
      for (int64_t i = 0; i < m; i++) {
        float *row = P + i * n;
        const float *oi = oh + (t0 + i) * (Dv + 1), *doi = dOt + i * (Dv + 1);
        float lse = oi[Dv];
        int64_t lim = mask_row(s, colpos, row_pos(s, t0 + i), row, n);
        if (lse == -INFINITY) lim = 0;
        row_exp(row, lim, lse);
        for (int64_t j = lim; j < n; j++) row[j] = 0.0f;
        double d = 0; /* Dt = do . o - dlse: Dv terms a row, in double for free */
        for (int64_t c = 0; c < Dv; c++) d += (double)doi[c] * oi[c];
        Dt[i] = (float)(d - doi[Dv]);
      }
      jb->gemm(0, 1, m, n, Dv, 1.0f, dOt, Dv + 1, vb, Dv, 0.0f, dS, n);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) dS[i * n + j] = P[i * n + j] * (dS[i * n + j] - Dt[i]);
      jb->gemm(0, 0, m, D, n, scale, dS, n, kb, D, 0.0f, dqh + t0 * D, D);
      jb->gemm(1, 0, n, D, m, scale, dS, n, qt, D, 1.0f, dk, D);
      jb->gemm(1, 0, n, Dv, m, 1.0f, P, n, dOt, Dv + 1, 1.0f, dv, Dv);
    }
  }
}

/* One range of work items, with scratch of its own for the range. */
static void run_range(void *ctx, int64_t lo, int64_t hi) {
  AttnJob *jb = ctx;
  const AttnShape *s = jb->s;
  float *scratch = malloc(sizeof(float) * (size_t)worker_floats(s, jb->bq, jb->backward));
  if (!scratch) {
    atomic_store(&jb->oom, 1);
    return;
  }
  int64_t tile = jb->bq * s->S;
  float *rowv = scratch + (jb->backward ? 2 : 1) * tile;
  int64_t *colpos = NULL;
  if (s->causal && s->col_size > 1) {
    colpos = (int64_t *)(void *)(scratch + worker_tiles(s, jb->bq, jb->backward));
    for (int64_t j = 0; j < s->S; j++) colpos[j] = ring(s->col_rank, s->col_size, col_span(s), j);
  }
  for (int64_t item = lo; item < hi; item++) {
    if (jb->backward) backward_item(jb, item, scratch, scratch + tile, rowv, colpos);
    else forward_item(jb, item, scratch, rowv, colpos);
  }
  free(scratch);
}

/* a * b for sizes >= 0, or -1 past what a float array can index. */
static int64_t mulc(int64_t a, int64_t b) {
  int64_t lim = (int64_t)(PTRDIFF_MAX / 16);
  if (a < 0 || b < 0 || (a && b > lim / a)) return -1;
  return a * b;
}

static const char *check(const AttnShape *s) {
  if (!s) return "attention: no shape";
  if (s->T < 1 || s->S < 1) return "attention: T and S must be at least 1";
  if (s->B < 1 || s->H < 1 || s->Hk < 1 || s->D < 1 || s->Dv < 1)
    return "attention: B, H, Hk, D and Dv must be at least 1";
  if (s->H % s->Hk) return "attention: H must be a multiple of Hk";
  if (s->window < 0 || (s->window > 0 && !s->causal)) return "attention: a window needs the causal mask and W >= 1";
  if (s->row_size > 1 && (s->row_rank < 0 || s->row_rank >= s->row_size))
    return "attention: row_rank outside [0, row_size)";
  if (s->col_size > 1 && (s->col_rank < 0 || s->col_rank >= s->col_size))
    return "attention: col_rank outside [0, col_size)";
  if (s->col_size > 1 && (col_span(s) % s->col_size || col_span(s) < s->S))
    return "attention: the keys' span must be a multiple of col_size (ring blocks) and hold S";
  /* every array and the scratch indexable, with room for the sums of a few */
  int64_t rows = mulc(mulc(s->B, s->H), s->T), keys = mulc(mulc(s->B, s->Hk), s->S);
  if (mulc(rows, s->D) < 0 || mulc(rows, s->Dv) < 0 || mulc(keys, s->D) < 0 || mulc(keys, s->Dv) < 0 ||
      mulc(2 * ATTN_BLOCK + 4, s->S) < 0)
    return "attention: shape too large";
  return NULL;
}

static const char *run(const AttnShape *s, int backward, const float *q, const float *k, const float *v,
                       const float *out, const float *dout, float *dst) {
  const char *e = check(s);
  if (e) return e;
  AttnJob jb = {.s = s, .q = q, .k = k, .v = v, .out = out, .dout = dout, .dst = dst, .backward = backward,
                .gemm = s->sgemm ? s->sgemm : attn_loop_sgemm, .bq = s->T < ATTN_BLOCK ? s->T : ATTN_BLOCK};
  atomic_init(&jb.oom, 0);
  int64_t items = s->B * s->Hk;
  if (s->par_for) s->par_for(s->par, items, run_range, &jb);
  else run_range(&jb, 0, items);
  return atomic_load(&jb.oom) ? "attention: out of memory for scratch" : NULL;
}

const char *attn_forward(const AttnShape *s, const float *q, const float *k, const float *v, float *out) {
  return run(s, 0, q, k, v, NULL, NULL, out);
}

const char *attn_backward(const AttnShape *s, const float *q, const float *k, const float *v, const float *out,
                          const float *dout, float *grads) {
  return run(s, 1, q, k, v, out, dout, grads);
}

int64_t attn_scratch_bytes(const AttnShape *s, int nthreads) {
  if (check(s)) return -1;
  int64_t bq = s->T < ATTN_BLOCK ? s->T : ATTN_BLOCK, items = s->B * s->Hk;
  int64_t workers = nthreads < 1 ? 1 : nthreads < items ? nthreads : items;
  /* the backward's is the larger: two tiles */
  return workers * (int64_t)sizeof(float) * worker_floats(s, bq, 1);
}

void attn_merge(const float *const *parts, int c, int64_t rows, int64_t Dv, float *out) {
  for (int64_t t = 0; t < rows; t++) {
    float m = -INFINITY, sum = 0.0f, *o = out + t * (Dv + 1);
    for (int s = 0; s < c; s++) m = fmaxf(m, parts[s][t * (Dv + 1) + Dv]);
    for (int64_t j = 0; j < Dv; j++) o[j] = 0.0f;
    if (m == -INFINITY) {
      o[Dv] = -INFINITY;
      continue;
    }
    for (int s = 0; s < c; s++) sum += expf(parts[s][t * (Dv + 1) + Dv] - m);
    float lse = m + logf(sum);
    for (int s = 0; s < c; s++) {
      const float *a = parts[s] + t * (Dv + 1);
      float w = expf(a[Dv] - lse);
      for (int64_t j = 0; j < Dv; j++) o[j] += w * a[j];
    }
    o[Dv] = lse;
  }
}
