/* test_conv.c - the fp32 convolution and pooling of core/numeric/conv.c (im2col and a
 * GEMM per image and group: what the CPU back end's host ops run) against the
 * fp64 loops of the same module (the reference executor's definition, which
 * test_autodiff checks by finite differences): forward, data gradient and
 * filter gradient for strides, padding, dilation, groups (depthwise too), a
 * 1x1 kernel and odd sizes, batches cut into chunks (conv.c's column budget); with the module's own GEMM loops, OpenBLAS
 * (skipped without it), images out of order and on threads, which must give
 * the bits of the sequential run. The fp64 loops are checked against a
 * hand-computed case. Values agree within 1e-5 relative to the tensor's
 * largest |value|. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "test_hooks.h"
#include "test_util.h"

static float *rnd(int64_t n, uint64_t seed) {
  float *x = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
  }
  return x;
}

static double *widen(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static const char *case_name = "";

static void expect_close(const float *got, const double *ref, int64_t n, const char *what) {
  double scale = 1e-30, worst = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]) / scale;
    if (!(e <= worst)) worst = e, at = i;
  }
  if (!(worst <= 1e-5)) {
    fprintf(stderr, "%s %s: element %lld is %.9g, the fp64 loops give %.9g (relative error %.3g)\n", case_name, what,
            (long long)at, got[at], ref[at], worst);
    test_failures++;
  }
}

static void expect_same(const float *a, const float *b, int64_t n, const char *what) {
  if (memcmp(a, b, sizeof(float) * (size_t)n)) {
    fprintf(stderr, "%s %s: differs from the sequential run\n", case_name, what);
    test_failures++;
  }
}

typedef struct {
  int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, g;
} Case;

static void run_case(const Case *c) {
  char name[200];
  snprintf(name, sizeof name, "[N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld]",
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->KH,
           (long long)c->KW, (long long)c->sh, (long long)c->sw, (long long)c->ph, (long long)c->pw, (long long)c->dh,
           (long long)c->dw, (long long)c->g);
  case_name = name;
  int64_t attr[CONV_NATTR] = {c->sh, c->sw, c->ph, c->pw, c->dh, c->dw, c->g, c->H, c->W, c->KH, c->KW};
  ConvShape s = conv_shape_of(c->N, c->C, c->O, attr);
  EXPECT(s.Ho >= 1 && s.Wo >= 1);
  int64_t nx = c->N * c->C * c->H * c->W, nw = c->O * (c->C / c->g) * c->KH * c->KW, ny = c->N * c->O * s.Ho * s.Wo;
  float *x = rnd(nx, 1), *w = rnd(nw, 2), *dy = rnd(ny, 3);
  double *xd = widen(x, nx), *wd = widen(w, nw), *dyd = widen(dy, ny);
  double *y_ref = malloc(sizeof(double) * (size_t)ny), *dx_ref = malloc(sizeof(double) * (size_t)nx);
  double *dw_ref = malloc(sizeof(double) * (size_t)nw);
  conv_forward_f64(&s, xd, wd, y_ref);
  conv_bwd_data_f64(&s, dyd, wd, dx_ref);
  conv_bwd_filter_f64(&s, xd, dyd, dw_ref);
  float *y0 = malloc(sizeof(float) * (size_t)ny), *y = malloc(sizeof(float) * (size_t)ny);
  float *dx0 = malloc(sizeof(float) * (size_t)nx), *dx = malloc(sizeof(float) * (size_t)nx);
  float *dw = malloc(sizeof(float) * (size_t)nw);
  int threads = 3;
  struct {
    AttnSgemm gemm;
    AttnParFor par;
    const char *what;
  } ways[] = {{NULL, NULL, "loops"}, {NULL, reverse_par, "loops, reversed odd ranges"}, {NULL, thread_par, "loops, 3 threads"},
              {blas_sgemm, NULL, "blas"}, {blas_sgemm, thread_par, "blas, 3 threads"}};
  for (size_t k = 0; k < sizeof ways / sizeof *ways; k++) {
    if (ways[k].gemm == blas_sgemm && !cblas) continue;
    int first = !ways[k].par; /* a sequential run: checked against fp64, the base of the parallel ones after it */
    float *yt = first ? y0 : y, *dxt = first ? dx0 : dx;
    memset(yt, 0xff, sizeof(float) * (size_t)ny); /* NaNs: every value must be written */
    memset(dxt, 0xff, sizeof(float) * (size_t)nx);
    memset(dw, 0xff, sizeof(float) * (size_t)nw);
    EXPECT(conv_forward_f32(&s, x, w, yt, ways[k].gemm, ways[k].par, &threads) == NULL);
    EXPECT(conv_bwd_data_f32(&s, dy, w, dxt, ways[k].gemm, ways[k].par, &threads) == NULL);
    EXPECT(conv_bwd_filter_f32(&s, x, dy, dw, ways[k].gemm) == NULL);
    expect_close(dw, dw_ref, nw, ways[k].what);
    if (first) {
      expect_close(y0, y_ref, ny, ways[k].what);
      expect_close(dx0, dx_ref, nx, ways[k].what);
    } else {
      expect_same(y, y0, ny, ways[k].what);
      expect_same(dx, dx0, nx, ways[k].what);
    }
  }
  free(x), free(w), free(dy), free(xd), free(wd), free(dyd), free(y_ref), free(dx_ref), free(dw_ref);
  free(y0), free(y), free(dx0), free(dx), free(dw);
}

/* A case by hand: a 3x3 image of 1..9, a 2x2 filter of ones, stride 1, no
 * padding: each output is the sum of its window; with padding 1 and stride 2
 * the corners read one input each. */
static void test_by_hand(void) {
  double x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 1, 1, 1}, y[4], y2[4];
  int64_t a[CONV_NATTR] = {1, 1, 0, 0, 1, 1, 1, 3, 3, 2, 2};
  ConvShape s = conv_shape_of(1, 1, 1, a);
  EXPECT(s.Ho == 2 && s.Wo == 2);
  conv_forward_f64(&s, x, w, y);
  EXPECT_NEAR(y[0], 12, 0);
  EXPECT_NEAR(y[1], 16, 0);
  EXPECT_NEAR(y[2], 24, 0);
  EXPECT_NEAR(y[3], 28, 0);
  int64_t b[CONV_NATTR] = {2, 2, 1, 1, 1, 1, 1, 3, 3, 2, 2};
  s = conv_shape_of(1, 1, 1, b);
  EXPECT(s.Ho == 2 && s.Wo == 2);
  conv_forward_f64(&s, x, w, y2);
  EXPECT_NEAR(y2[0], 1, 0);
  EXPECT_NEAR(y2[1], 2 + 3, 0);
  EXPECT_NEAR(y2[2], 4 + 7, 0);
  EXPECT_NEAR(y2[3], 5 + 6 + 8 + 9, 0);
  /* output lengths: PyTorch's formula, and -1 for a kernel larger than the padded input */
  EXPECT(conv_out_len(32, 7, 2, 3, 1) == 16);
  EXPECT(conv_out_len(5, 3, 1, 0, 2) == 1);
  EXPECT(conv_out_len(4, 3, 1, 0, 2) == -1);
  EXPECT(conv_out_len(2, 3, 1, 0, 1) == -1);
  EXPECT(conv_out_len(2, 3, 1, 1, 1) == 2);
}

/* Pooling: fp32 against fp64 (the same loops on another type), and by hand:
 * max and average (padding counted), adaptive windows that overlap. */
static void test_pool(void) {
  double x[12] = {1, 5, 2, 0, 3, 4, 9, 1, 7, 6, 8, 2}; /* [1, 1, 3, 4] */
  double y[8], dx[12], dy[4] = {1, 2, 3, 4};
  int64_t mx[POOL_NATTR] = {POOL_MAX, 2, 2, 2, 2, 0, 0};
  PoolShape s = pool_shape_of(1, 1, 3, 4, mx);
  EXPECT(s.Ho == 1 && s.Wo == 2);
  pool_forward_f64(&s, x, y);
  EXPECT_NEAR(y[0], 5, 0);
  EXPECT_NEAR(y[1], 9, 0);
  pool_backward_f64(&s, x, dy, dx);
  EXPECT_NEAR(dx[1], 1, 0);
  EXPECT_NEAR(dx[6], 2, 0);
  EXPECT_NEAR(fabs(dx[0]) + fabs(dx[2]) + fabs(dx[3]) + fabs(dx[4]) + fabs(dx[5]) + fabs(dx[7]), 0, 0);
  int64_t avg[POOL_NATTR] = {POOL_AVG, 2, 2, 2, 2, 1, 1}; /* padded: 2 x 3 outputs, divisor 4 */
  s = pool_shape_of(1, 1, 3, 4, avg);
  EXPECT(s.Ho == 2 && s.Wo == 3);
  pool_forward_f64(&s, x, y);
  EXPECT_NEAR(y[0], 1.0 / 4, 1e-15);
  EXPECT_NEAR(y[1], (5 + 2) / 4.0, 1e-15);
  EXPECT_NEAR(y[4], (4 + 9 + 6 + 8) / 4.0, 1e-15);
  int64_t ad[POOL_NATTR] = {POOL_ADAPTIVE_AVG, 2, 3, 0, 0, 0, 0}; /* rows [0, 2) [1, 3); columns [0, 2) [1, 3) [2, 4) */
  s = pool_shape_of(1, 1, 3, 4, ad);
  pool_forward_f64(&s, x, y);
  EXPECT_NEAR(y[0], (1 + 5 + 3 + 4) / 4.0, 1e-15);
  EXPECT_NEAR(y[5], (9 + 1 + 8 + 2) / 4.0, 1e-15); /* cell (1, 2): rows 1..2, columns 2..3 */
  int64_t modes[][POOL_NATTR] = {{POOL_MAX, 3, 3, 2, 2, 1, 1},     {POOL_AVG, 3, 2, 1, 2, 1, 0},
                                 {POOL_ADAPTIVE_AVG, 3, 2, 0, 0, 0, 0}, {POOL_ADAPTIVE_MAX, 1, 1, 0, 0, 0, 0}};
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
    PoolShape p = pool_shape_of(2, 3, 7, 5, modes[m]);
    int64_t nx = 2 * 3 * 7 * 5, ny = 2 * 3 * p.Ho * p.Wo;
    float *xf = rnd(nx, 5), *dyf = rnd(ny, 6), *yf = malloc(sizeof(float) * (size_t)ny), *dxf = malloc(sizeof(float) * (size_t)nx);
    double *xd = widen(xf, nx), *dyd = widen(dyf, ny), *yd = malloc(sizeof(double) * (size_t)ny),
           *dxd = malloc(sizeof(double) * (size_t)nx);
    case_name = "pool2d";
    pool_forward_f64(&p, xd, yd);
    pool_forward_f32(&p, xf, yf);
    expect_close(yf, yd, ny, "forward");
    pool_backward_f64(&p, xd, dyd, dxd);
    pool_backward_f32(&p, xf, dyf, dxf);
    expect_close(dxf, dxd, nx, "backward");
    free(xf), free(dyf), free(yf), free(dxf), free(xd), free(dyd), free(yd), free(dxd);
  }
}

int main(void) {
  void *blas = open_cblas();
  if (!cblas) fprintf(stderr, "test_conv: no OpenBLAS (cblas_sgemm); the BLAS hook is not tested\n");
  test_by_hand();
  test_pool();
  static const Case cases[] = {
      /* N  C  H  W  O  KH KW sh sw ph pw dh dw g */
      {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},    /* ResNet's 3x3 */
      {3, 4, 9, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1},    /* strided, odd sizes */
      {2, 5, 6, 6, 3, 1, 1, 2, 2, 0, 0, 1, 1, 1},    /* the shortcut's 1x1, stride 2 */
      {1, 3, 16, 16, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1},  /* the ImageNet stem */
      {2, 6, 7, 9, 4, 2, 3, 1, 2, 2, 0, 2, 1, 2},    /* dilation, groups, asymmetric */
      {3, 4, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4},    /* depthwise */
      {1, 2, 3, 3, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1},    /* a 1x1 output */
      {3, 64, 64, 64, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1}, /* columns of 2.4M floats an image: chunks of one image */
      {5, 64, 64, 64, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2}, /* columns of 1.2M floats: chunks of 3 images, then 2, with groups */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
  if (blas) dlclose(blas);
  TEST_DONE();
}
