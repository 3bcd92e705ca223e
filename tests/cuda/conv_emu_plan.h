/* conv_emu_plan.h - kernels/hpdl_conv.cuh's launch rule for a few shapes, one line each:
 * tests/cuda/conv_emu.cpp prints it as C++ sees the header, tests/cuda/conv_emu.py's C11
 * program as C does (with the project's warnings), and the driver compares the two. */
#ifndef CONV_EMU_PLAN_H
#define CONV_EMU_PLAN_H

#include <stdio.h>

#include "hpdl_conv.cuh"

static void conv_emu_print_plan(void) {
  static const int shapes[][16] = {
      /* N, C, H, W, O, KH, KW, Ho, Wo, sh, sw, ph, pw, dh, dw, G */
      {32, 64, 56, 56, 64, 3, 3, 56, 56, 1, 1, 1, 1, 1, 1, 1},    /* ResNet's 3x3 */
      {32, 3, 224, 224, 64, 7, 7, 112, 112, 2, 2, 3, 3, 1, 1, 1}, /* its stem */
      {8, 512, 7, 7, 2048, 1, 1, 7, 7, 1, 1, 0, 0, 1, 1, 1},      /* a bottleneck's 1x1 */
      {4, 32, 16, 16, 32, 3, 3, 8, 8, 2, 2, 1, 1, 1, 1, 32},      /* depthwise */
      {2, 4, 7, 6, 8, 3, 3, 7, 6, 1, 1, 1, 1, 2, 2, 2},           /* groups, dilation */
      {2, 2, 24, 24, 3, 3, 3, 24, 24, 1, 1, 1, 1, 1, 1, 1},       /* a split filter gradient */
      {1, 20, 4, 5, 2, 2, 2, 3, 4, 1, 1, 0, 0, 1, 1, 2},
      {2, 8, 8, 8, 8, 3, 3, 9, 8, 1, 1, 1, 1, 1, 1, 1}, /* refused: Ho is 8 */
      {2, 6, 8, 8, 8, 3, 3, 8, 8, 1, 1, 1, 1, 1, 1, 4}, /* refused: 4 groups of 6 channels */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int *a = shapes[i];
    const hpdl_conv_shape s = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
                               a[14], a[15]};
    for (int op = 0; op < 3; op++) {
      hpdl_conv_launch L = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      const int rc = hpdl_conv_plan(op, &s, &L);
      printf("plan %d %d %d %d %d %d: rc %d tile %dx%d %dx%d gemm %lld %lld %lld grid %lld splits %d chunk %lld "
             "scratch %lld outputs %lld\n",
             op, a[0], a[1], a[2], a[4], a[15], rc, L.bm, L.bn, L.tm, L.tn, L.rows, L.cols, L.red, L.grid, L.splits,
             L.chunk, L.scratch_floats, L.outputs);
    }
  }
}

#endif
