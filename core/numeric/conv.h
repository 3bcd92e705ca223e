/* conv.h - 2-D convolution and pooling over NCHW tensors, the arithmetic of
 * the IR ops CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_FILTER, POOL2D and
 * POOL2D_BWD (ir_ops.h) shared by the reference executor (fp64, direct
 * loops: the definition) and the CPU back end's host ops (fp32: im2col over
 * a chunk of images and one GEMM per group, as Caffe and PyTorch's CPU path
 * do, with the chunk's images side by side in the GEMM's columns).
 *
 * Shapes: x [N, C, H, W], w [O, C/groups, KH, KW], y [N, O, Ho, Wo] with
 *   Ho = (H + 2 ph - dh (KH - 1) - 1) / sh + 1 (floor), Wo likewise
 * (PyTorch's Conv2d). Output channel o reads the input channels of its group,
 * o / (O / groups). */
#ifndef HPDL_CONV_H
#define HPDL_CONV_H

#include <stdint.h>

#include "attn.h"

/* The IR attributes of the three convolution ops. */
enum {
  CONV_A_SH, CONV_A_SW, CONV_A_PH, CONV_A_PW, CONV_A_DH, CONV_A_DW, CONV_A_GROUPS,
  CONV_A_H, CONV_A_W, CONV_A_KH, CONV_A_KW, CONV_NATTR
};

/* The IR attributes of POOL2D and POOL2D_BWD. Adaptive modes carry the
 * output size in KH / KW and no stride or padding. */
enum { POOL_A_MODE, POOL_A_KH, POOL_A_KW, POOL_A_SH, POOL_A_SW, POOL_A_PH, POOL_A_PW, POOL_NATTR };
typedef enum {
  POOL_MAX,          /* max over the window; padding never wins */
  POOL_AVG,          /* mean over the window, padding counted (PyTorch's count_include_pad = True) */
  POOL_ADAPTIVE_AVG, /* output cell i covers [floor(i H / Ho), ceil((i + 1) H / Ho)) */
  POOL_ADAPTIVE_MAX,
  POOL_NMODES
} PoolMode;

typedef struct {
  int64_t N, C, H, W;  /* input */
  int64_t O, KH, KW;   /* filters */
  int64_t Ho, Wo;      /* output */
  int64_t sh, sw, ph, pw, dh, dw, groups;
} ConvShape;

typedef struct {
  int64_t N, C, H, W, Ho, Wo;
  int64_t kh, kw, sh, sw, ph, pw;
  PoolMode mode;
} PoolShape;

/* The output length of one axis, or -1 when the (dilated) kernel is larger
 * than the padded input or an argument is out of range. */
int64_t conv_out_len(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil);

/* From the ops' attributes (CONV_A_*, all of them set), the batch N, the
 * input channels C and the output channels O. */
ConvShape conv_shape_of(int64_t N, int64_t C, int64_t O, const int64_t *attr);
PoolShape pool_shape_of(int64_t N, int64_t C, int64_t H, int64_t W, const int64_t *attr);
/* The output size of a pooling, from its attributes and input size. -1 when invalid. */
int pool_out_size(const int64_t *attr, int64_t H, int64_t W, int64_t *Ho, int64_t *Wo);

/* fp64, direct loops (the reference executor). Outputs are overwritten. */
void conv_forward_f64(const ConvShape *s, const double *x, const double *w, double *y);
void conv_bwd_data_f64(const ConvShape *s, const double *dy, const double *w, double *dx);
void conv_bwd_filter_f64(const ConvShape *s, const double *x, const double *dy, double *dw);
void pool_forward_f64(const PoolShape *s, const double *x, double *y);
void pool_backward_f64(const PoolShape *s, const double *x, const double *dy, double *dx);

/* fp32 through im2col and sgemm (NULL: attn.c's loops); par_for (NULL:
 * sequential) runs the column copies of a chunk's images on the workers (the
 * GEMMs have the BLAS's threads). Outputs are overwritten. NULL on success,
 * else why (out of memory). */
const char *conv_forward_f32(const ConvShape *s, const float *x, const float *w, float *y, AttnSgemm sgemm,
                             AttnParFor par_for, void *par);
const char *conv_bwd_data_f32(const ConvShape *s, const float *dy, const float *w, float *dx, AttnSgemm sgemm,
                              AttnParFor par_for, void *par);
const char *conv_bwd_filter_f32(const ConvShape *s, const float *x, const float *dy, float *dw, AttnSgemm sgemm);
void pool_forward_f32(const PoolShape *s, const float *x, float *y);
void pool_backward_f32(const PoolShape *s, const float *x, const float *dy, float *dx);

#endif
