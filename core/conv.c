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

/* ---- fp32: im2col and a GEMM per image and group ---- */

/* col [Cg KH KW, Ho Wo] of group g of image x (one image, [C, H, W]): row
 * (c, ki, kj) holds the input each output position reads through that tap, 0
 * in the padding. With to_image, the reverse: col's entries added back into x. */
static void im2col(const ConvShape *s, int64_t g, float *x, float *col, int to_image) {
  int64_t Cg = s->C / s->groups, P = s->Ho * s->Wo;
  for (int64_t c = 0; c < Cg; c++)
    for (int64_t ki = 0; ki < s->KH; ki++)
      for (int64_t kj = 0; kj < s->KW; kj++) {
        float *row = col + ((c * s->KH + ki) * s->KW + kj) * P;
        float *plane = x + (g * Cg + c) * s->H * s->W;
        for (int64_t i = 0; i < s->Ho; i++) {
          int64_t hi = i * s->sh - s->ph + ki * s->dh;
          float *r = row + i * s->Wo;
          if (hi < 0 || hi >= s->H) {
            if (!to_image) memset(r, 0, sizeof(float) * (size_t)s->Wo);
            continue;
          }
          for (int64_t j = 0; j < s->Wo; j++) {
            int64_t wi = j * s->sw - s->pw + kj * s->dw;
            if (wi < 0 || wi >= s->W) {
              if (!to_image) r[j] = 0;
            } else if (to_image) {
              plane[hi * s->W + wi] += r[j];
            } else {
              r[j] = plane[hi * s->W + wi];
            }
          }
        }
      }
}

typedef struct {
  const ConvShape *s;
  const float *a, *w; /* x (forward) or dy (data gradient), and the filters */
  float *out;
  AttnSgemm gemm;
  int bwd;
  int failed;
} ConvJob;

/* Images [lo, hi): y = W col(x), or dx = col2im(W^T dy). */
static void conv_images(void *ctx, int64_t lo, int64_t hi) {
  ConvJob *J = ctx;
  const ConvShape *s = J->s;
  int64_t Cg = s->C / s->groups, Og = s->O / s->groups, K = Cg * s->KH * s->KW, P = s->Ho * s->Wo;
  float *col = malloc(sizeof(float) * (size_t)(K * P + 1));
  if (!col) {
    J->failed = 1;
    return;
  }
  for (int64_t n = lo; n < hi; n++)
    for (int64_t g = 0; g < s->groups; g++) {
      const float *wg = J->w + g * Og * K;
      if (!J->bwd) {
        im2col(s, g, (float *)J->a + n * s->C * s->H * s->W, col, 0);
        J->gemm(0, 0, Og, P, K, 1.0f, wg, K, col, P, 0.0f, J->out + (n * s->O + g * Og) * P, P);
      } else {
        J->gemm(1, 0, K, P, Og, 1.0f, wg, K, J->a + (n * s->O + g * Og) * P, P, 0.0f, col, P);
        im2col(s, g, J->out + n * s->C * s->H * s->W, col, 1);
      }
    }
  free(col);
}

static const char *conv_run(const ConvShape *s, const float *a, const float *w, float *out, AttnSgemm sgemm,
                            AttnParFor par_for, void *par, int bwd) {
  ConvJob J = {s, a, w, out, sgemm ? sgemm : attn_loop_sgemm, bwd, 0};
  if (bwd) memset(out, 0, sizeof(float) * (size_t)(s->N * s->C * s->H * s->W));
  if (par_for && s->N > 1) par_for(par, s->N, conv_images, &J);
  else conv_images(&J, 0, s->N);
  return J.failed ? "out of memory for the convolution's column buffer" : NULL;
}

const char *conv_forward_f32(const ConvShape *s, const float *x, const float *w, float *y, AttnSgemm sgemm,
                             AttnParFor par_for, void *par) {
  return conv_run(s, x, w, y, sgemm, par_for, par, 0);
}

const char *conv_bwd_data_f32(const ConvShape *s, const float *dy, const float *w, float *dx, AttnSgemm sgemm,
                              AttnParFor par_for, void *par) {
  return conv_run(s, dy, w, dx, sgemm, par_for, par, 1);
}

/* dW_g += dY_g col^T image by image (the images share dW, so they run in
 * order; the GEMM has the threads). */
const char *conv_bwd_filter_f32(const ConvShape *s, const float *x, const float *dy, float *dw, AttnSgemm sgemm) {
  AttnSgemm gemm = sgemm ? sgemm : attn_loop_sgemm;
  int64_t Cg = s->C / s->groups, Og = s->O / s->groups, K = Cg * s->KH * s->KW, P = s->Ho * s->Wo;
  float *col = malloc(sizeof(float) * (size_t)(K * P + 1));
  if (!col) return "out of memory for the convolution's column buffer";
  memset(dw, 0, sizeof(float) * (size_t)(s->O * K));
  for (int64_t n = 0; n < s->N; n++)
    for (int64_t g = 0; g < s->groups; g++) {
      im2col(s, g, (float *)x + n * s->C * s->H * s->W, col, 0);
      gemm(0, 1, Og, K, P, 1.0f, dy + (n * s->O + g * Og) * P, P, col, P, 1.0f, dw + g * Og * K, K);
    }
  free(col);
  return NULL;
}
