/* conv.c - 2-D convolution and pooling (see conv.h). */
#include "conv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t conv_out_len(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  if (in < 1 || k < 1 || stride < 1 || pad < 0 || dil < 1) return -1;
  int64_t span = dil * (k - 1) + 1, room = in + 2 * pad - span;
  return room < 0 ? -1 : room / stride + 1;
}

ConvShape conv_shape_of(int64_t N, int64_t C, int64_t O, const int64_t *a) {
  ConvShape s = {N, C, a[CONV_A_H], a[CONV_A_W], O, a[CONV_A_KH], a[CONV_A_KW], 0, 0,
                 a[CONV_A_SH], a[CONV_A_SW], a[CONV_A_PH], a[CONV_A_PW], a[CONV_A_DH], a[CONV_A_DW], a[CONV_A_GROUPS]};
  s.Ho = conv_out_len(s.H, s.KH, s.sh, s.ph, s.dh);
  s.Wo = conv_out_len(s.W, s.KW, s.sw, s.pw, s.dw);
  return s;
}

int pool_out_size(const int64_t *a, int64_t H, int64_t W, int64_t *Ho, int64_t *Wo) {
  int64_t m = a[POOL_A_MODE];
  if (m < 0 || m >= POOL_NMODES) return -1;
  if (m == POOL_ADAPTIVE_AVG || m == POOL_ADAPTIVE_MAX) {
    *Ho = a[POOL_A_KH], *Wo = a[POOL_A_KW];
    return *Ho >= 1 && *Wo >= 1 && H >= 1 && W >= 1 ? 0 : -1;
  }
  /* PyTorch: padding at most half the window, so every window holds an input */
  if (2 * a[POOL_A_PH] > a[POOL_A_KH] || 2 * a[POOL_A_PW] > a[POOL_A_KW]) return -1;
  *Ho = conv_out_len(H, a[POOL_A_KH], a[POOL_A_SH], a[POOL_A_PH], 1);
  *Wo = conv_out_len(W, a[POOL_A_KW], a[POOL_A_SW], a[POOL_A_PW], 1);
  return *Ho >= 1 && *Wo >= 1 ? 0 : -1;
}

PoolShape pool_shape_of(int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *a) {
  PoolShape s = {N, C, H, W, 0, 0, a[POOL_A_KH], a[POOL_A_KW], a[POOL_A_SH], a[POOL_A_SW], a[POOL_A_PH], a[POOL_A_PW],
                 (PoolMode)a[POOL_A_MODE]};
  if (pool_out_size(a, H, W, &s.Ho, &s.Wo)) s.Ho = s.Wo = 0;
  return s;
}

/* ---- fp64: the definition, one output (or filter tap) at a time ---- */

/* Calls body with (n, o, i, j, c, ci, hi, wi, xi, wk): output [n, o, i, j]
 * meets input channel ci (c within the group) at (hi, wi) inside the image,
 * x's flat index xi and w's wk. */
#define CONV_FOR_TAPS(s, body)                                                                   \
  do {                                                                                           \
    int64_t Cg_ = (s)->C / (s)->groups, Og_ = (s)->O / (s)->groups;                            \
    for (int64_t n = 0; n < (s)->N; n++)                                                         \
      for (int64_t o = 0; o < (s)->O; o++)                                                       \
        for (int64_t i = 0; i < (s)->Ho; i++)                                                    \
          for (int64_t j = 0; j < (s)->Wo; j++)                                                  \
            for (int64_t c = 0; c < Cg_; c++) {                                                  \
              int64_t ci = (o / Og_) * Cg_ + c;                                                  \
              for (int64_t ki = 0; ki < (s)->KH; ki++) {                                         \
                int64_t hi = i * (s)->sh - (s)->ph + ki * (s)->dh;                               \
                if (hi < 0 || hi >= (s)->H) continue;                                            \
                for (int64_t kj = 0; kj < (s)->KW; kj++) {                                       \
                  int64_t wi = j * (s)->sw - (s)->pw + kj * (s)->dw;                             \
                  if (wi < 0 || wi >= (s)->W) continue;                                          \
                  int64_t xi = ((n * (s)->C + ci) * (s)->H + hi) * (s)->W + wi;                  \
                  int64_t wk = ((o * Cg_ + c) * (s)->KH + ki) * (s)->KW + kj;                    \
                  int64_t yi = ((n * (s)->O + o) * (s)->Ho + i) * (s)->Wo + j;                   \
                  body;                                                                          \
                }                                                                                \
              }                                                                                  \
            }                                                                                    \
  } while (0)

void conv_forward_f64(const ConvShape *s, const double *x, const double *w, double *y) {
  memset(y, 0, sizeof(double) * (size_t)(s->N * s->O * s->Ho * s->Wo));
  CONV_FOR_TAPS(s, y[yi] += x[xi] * w[wk]);
}

void conv_bwd_data_f64(const ConvShape *s, const double *dy, const double *w, double *dx) {
  memset(dx, 0, sizeof(double) * (size_t)(s->N * s->C * s->H * s->W));
  CONV_FOR_TAPS(s, dx[xi] += dy[yi] * w[wk]);
}

void conv_bwd_filter_f64(const ConvShape *s, const double *x, const double *dy, double *dw) {
  memset(dw, 0, sizeof(double) * (size_t)(s->O * (s->C / s->groups) * s->KH * s->KW));
  CONV_FOR_TAPS(s, dw[wk] += x[xi] * dy[yi]);
}

/* ---- pooling, fp64 and fp32 from one body ---- */

/* The window of output cell i along an axis of length L: [*lo, *hi) inside
 * the input, and the divisor of an average (padding counted unless adaptive). */
static void pool_window(const PoolShape *s, int axis, int64_t i, int64_t *lo, int64_t *hi, int64_t *count) {
  int64_t L = axis ? s->W : s->H, out = axis ? s->Wo : s->Ho;
  if (s->mode == POOL_ADAPTIVE_AVG || s->mode == POOL_ADAPTIVE_MAX) {
    *lo = i * L / out;
    *hi = ((i + 1) * L + out - 1) / out;
    *count = *hi - *lo;
    return;
  }
  int64_t k = axis ? s->kw : s->kh, st = axis ? s->sw : s->sh, p = axis ? s->pw : s->ph;
  int64_t a = i * st - p, b = a + k;
  if (b > L + p) b = L + p;
  *count = b - a;
  *lo = a < 0 ? 0 : a;
  *hi = b > L ? L : b;
}

static int pool_is_max(const PoolShape *s) { return s->mode == POOL_MAX || s->mode == POOL_ADAPTIVE_MAX; }

/* Forward: the max (first in row-major window order on ties, as PyTorch's
 * CPU kernel) or the mean; backward: dy to that max, or dy / count to every
 * input of the window. A window with no input gives 0. */
#define POOL_DEFINE(SUFFIX, T)                                                                      \
  void pool_forward_##SUFFIX(const PoolShape *s, const T *x, T *y) {                               \
    for (int64_t p = 0; p < s->N * s->C; p++)                                                      \
      for (int64_t i = 0; i < s->Ho; i++)                                                          \
        for (int64_t j = 0; j < s->Wo; j++) {                                                      \
          int64_t h0, h1, w0, w1, ch, cw;                                                          \
          pool_window(s, 0, i, &h0, &h1, &ch);                                                     \
          pool_window(s, 1, j, &w0, &w1, &cw);                                                     \
          const T *img = x + p * s->H * s->W;                                                      \
          double acc = 0;                                                                          \
          int any = 0;                                                                             \
          for (int64_t h = h0; h < h1; h++)                                                        \
            for (int64_t w = w0; w < w1; w++) {                                                    \
              double v = img[h * s->W + w];                                                        \
              if (pool_is_max(s)) {                                                                \
                if (!any || v > acc || (isnan(v) && !isnan(acc))) acc = v;                                          \
              } else {                                                                             \
                acc += v;                                                                          \
              }                                                                                    \
              any = 1;                                                                             \
            }                                                                                      \
          if (!pool_is_max(s)) acc = ch * cw > 0 ? acc / (double)(ch * cw) : 0;                    \
          y[(p * s->Ho + i) * s->Wo + j] = (T)(any ? acc : 0);                                      \
        }                                                                                          \
  }                                                                                                \
  void pool_backward_##SUFFIX(const PoolShape *s, const T *x, const T *dy, T *dx) {                \
    memset(dx, 0, sizeof(T) * (size_t)(s->N * s->C * s->H * s->W));                               \
    for (int64_t p = 0; p < s->N * s->C; p++)                                                      \
      for (int64_t i = 0; i < s->Ho; i++)                                                          \
        for (int64_t j = 0; j < s->Wo; j++) {                                                      \
          int64_t h0, h1, w0, w1, ch, cw, at = -1;                                                 \
          double best = 0;                                                                         \
          pool_window(s, 0, i, &h0, &h1, &ch);                                                     \
          pool_window(s, 1, j, &w0, &w1, &cw);                                                     \
          const T *img = x + p * s->H * s->W;                                                      \
          T *dimg = dx + p * s->H * s->W, g = dy[(p * s->Ho + i) * s->Wo + j];                     \
          for (int64_t h = h0; h < h1; h++)                                                        \
            for (int64_t w = w0; w < w1; w++) {                                                    \
              if (!pool_is_max(s)) {                                                               \
                dimg[h * s->W + w] += (T)(g / (double)(ch * cw));                                  \
              } else {                                                                             \
                double v = img[h * s->W + w];                                                      \
                if (at < 0 || v > best || (isnan(v) && !isnan(best))) at = h * s->W + w, best = v; \
              }                                                                                    \
            }                                                                                      \
          if (at >= 0) dimg[at] += g;                                                              \
        }                                                                                          \
  }

POOL_DEFINE(f64, double)
POOL_DEFINE(f32, float)

/* ---- fp32: im2col over a chunk of images and one GEMM per group ----
 *
 * The images of a chunk share one column matrix [Cg KH KW, nb Ho Wo] (image b's
 * positions at columns b Ho Wo ..), so each group's product is one GEMM of
 * nb Ho Wo columns, not nb small ones: the late layers of a ResNet have 4 to
 * 64 positions an image, too few for a GEMM of their own. A chunk holds as
 * many images as keep the column matrix near CONV_COL_FLOATS (at least one).
 * The chunks run in order and each GEMM gets the BLAS's threads; the column
 * copies of a chunk's images run on the workers. */
enum { CONV_COL_FLOATS = 1 << 22 }; /* 16 MiB */

/* Image x ([C, H, W]) of group g into (to_image: added back from) the
 * column matrix col, row r at col + r ld: row (c, ki, kj) holds the input each
 * output position reads through that tap, 0 in the padding. */
static void im2col(const ConvShape *s, int64_t g, float *x, float *col, int64_t ld, int to_image) {
  int64_t Cg = s->C / s->groups;
  for (int64_t c = 0; c < Cg; c++)
    for (int64_t ki = 0; ki < s->KH; ki++)
      for (int64_t kj = 0; kj < s->KW; kj++) {
        float *row = col + ((c * s->KH + ki) * s->KW + kj) * ld;
        float *plane = x + (g * Cg + c) * s->H * s->W;
        /* the output columns j whose input column j sw - pw + kj dw is inside
         * the image: [j0, j1), so the copy below has no test */
        int64_t off = kj * s->dw - s->pw, j0 = off >= 0 ? 0 : (-off + s->sw - 1) / s->sw;
        int64_t j1 = s->W - off <= 0 ? 0 : (s->W - off + s->sw - 1) / s->sw;
        if (j1 > s->Wo) j1 = s->Wo;
        if (j0 > j1) j0 = j1;
        for (int64_t i = 0; i < s->Ho; i++) {
          int64_t hi = i * s->sh - s->ph + ki * s->dh;
          float *r = row + i * s->Wo;
          if (hi < 0 || hi >= s->H) {
            if (!to_image) memset(r, 0, sizeof(float) * (size_t)s->Wo);
            continue;
          }
          float *in = plane + hi * s->W + off;
          if (to_image) {
            for (int64_t j = j0; j < j1; j++) in[j * s->sw] += r[j];
            continue;
          }
          for (int64_t j = 0; j < j0; j++) r[j] = 0;
          if (s->sw == 1) memcpy(r + j0, in + j0, sizeof(float) * (size_t)(j1 - j0));
          else
            for (int64_t j = j0; j < j1; j++) r[j] = in[j * s->sw];
          for (int64_t j = j1; j < s->Wo; j++) r[j] = 0;
        }
      }
}

/* Moves group g's rows of a chunk between [nb, O, P] (images, channels,
 * positions) and [Og, nb P] (the GEMM's layout). */
static void gather_rows(const ConvShape *s, int64_t g, int64_t nb, const float *from, float *to, int to_gemm) {
  int64_t Og = s->O / s->groups, P = s->Ho * s->Wo;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t o = 0; o < Og; o++) {
      float *gemm = to_gemm ? to : (float *)from;
      const float *img = to_gemm ? from : to;
      float *gr = gemm + o * nb * P + b * P;
      float *ir = (float *)img + (b * s->O + g * Og + o) * P;
      if (to_gemm) memcpy(gr, ir, sizeof(float) * (size_t)P);
      else memcpy(ir, gr, sizeof(float) * (size_t)P);
    }
}

typedef struct {
  const ConvShape *s;
  float *images; /* the chunk's first image */
  float *col;
  int64_t g, ld;
  int to_image;
} ColJob;

static void col_images(void *ctx, int64_t lo, int64_t hi) {
  ColJob *J = ctx;
  const ConvShape *s = J->s;
  for (int64_t b = lo; b < hi; b++)
    im2col(s, J->g, J->images + b * s->C * s->H * s->W, J->col + b * s->Ho * s->Wo, J->ld, J->to_image);
}

static void chunk_cols(const ConvShape *s, int64_t g, float *images, int64_t nb, float *col, int to_image, AttnParFor par_for,
                       void *par) {
  ColJob J = {s, images, col, g, nb * s->Ho * s->Wo, to_image};
  /* col2im adds into the images: each image is one worker's */
  if (par_for && nb > 1) par_for(par, nb, col_images, &J);
  else col_images(&J, 0, nb);
}

/* Images a chunk takes, and its buffers: the column matrix and the GEMM-layout rows. */
static int64_t chunk_images(const ConvShape *s) {
  int64_t per = (s->C / s->groups) * s->KH * s->KW * s->Ho * s->Wo;
  int64_t nb = per > 0 ? CONV_COL_FLOATS / per : s->N;
  return nb < 1 ? 1 : nb > s->N ? s->N : nb;
}

typedef enum { CONV_FWD, CONV_DATA, CONV_FILTER } ConvPass;

/* One pass over the images in chunks. a: x (forward, filter) or dy (data);
 * b: w (forward, data) or dy (filter). */
static const char *conv_pass(const ConvShape *s, ConvPass pass, const float *a, const float *b, float *out, AttnSgemm sgemm,
                             AttnParFor par_for, void *par) {
  AttnSgemm gemm = sgemm ? sgemm : attn_loop_sgemm;
  int64_t Cg = s->C / s->groups, Og = s->O / s->groups, K = Cg * s->KH * s->KW, P = s->Ho * s->Wo;
  int64_t nb = chunk_images(s), img = s->C * s->H * s->W;
  float *col = malloc(sizeof(float) * (size_t)(K * nb * P + 1));
  float *rows = malloc(sizeof(float) * (size_t)(Og * nb * P + 1));
  if (!col || !rows) {
    free(col);
    free(rows);
    return "out of memory for the convolution's column buffer";
  }
  if (pass == CONV_DATA) memset(out, 0, sizeof(float) * (size_t)(s->N * img));
  if (pass == CONV_FILTER) memset(out, 0, sizeof(float) * (size_t)(s->O * K));
  for (int64_t n0 = 0; n0 < s->N; n0 += nb) {
    int64_t m = s->N - n0 < nb ? s->N - n0 : nb, cols = m * P;
    for (int64_t g = 0; g < s->groups; g++) {
      if (pass == CONV_FWD) {
        chunk_cols(s, g, (float *)a + n0 * img, m, col, 0, par_for, par);
        gemm(0, 0, Og, cols, K, 1.0f, b + g * Og * K, K, col, cols, 0.0f, rows, cols);
        gather_rows(s, g, m, rows, out + n0 * s->O * P, 0);
      } else if (pass == CONV_DATA) {
        gather_rows(s, g, m, a + n0 * s->O * P, rows, 1);
        gemm(1, 0, K, cols, Og, 1.0f, b + g * Og * K, K, rows, cols, 0.0f, col, cols);
        chunk_cols(s, g, out + n0 * img, m, col, 1, par_for, par);
      } else {
        chunk_cols(s, g, (float *)a + n0 * img, m, col, 0, par_for, par);
        gather_rows(s, g, m, b + n0 * s->O * P, rows, 1);
        gemm(0, 1, Og, K, cols, 1.0f, rows, cols, col, cols, 1.0f, out + g * Og * K, K);
      }
    }
  }
  free(col);
  free(rows);
  return NULL;
}

const char *conv_forward_f32(const ConvShape *s, const float *x, const float *w, float *y, AttnSgemm sgemm,
                             AttnParFor par_for, void *par) {
  return conv_pass(s, CONV_FWD, x, w, y, sgemm, par_for, par);
}

const char *conv_bwd_data_f32(const ConvShape *s, const float *dy, const float *w, float *dx, AttnSgemm sgemm,
                              AttnParFor par_for, void *par) {
  return conv_pass(s, CONV_DATA, dy, w, dx, sgemm, par_for, par);
}

const char *conv_bwd_filter_f32(const ConvShape *s, const float *x, const float *dy, float *dw, AttnSgemm sgemm) {
  return conv_pass(s, CONV_FILTER, x, dy, dw, sgemm, NULL, NULL);
}
