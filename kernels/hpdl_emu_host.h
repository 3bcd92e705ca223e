/* hpdl_emu_host.h - the host side of generated CUDA code run through the
 * emulation harness (cuda_emu.h): what cuBLASLt does on a GPU.
 *
 * The CUDA back end's emulation entry points (CgOptions.emulate: one
 * `extern "C" int hpd_emu_<kernel>(const hpdl_kctx *, void **io)` per fused
 * kernel) launch its kernels in order and call hpdl_emu_gemm for a GEMM.
 * Included after the generated kernels, never under NVRTC. */
#ifndef HPDL_EMU_HOST_H
#define HPDL_EMU_HOST_H

/* Element i of a GEMM operand: fp32, or (bf16) the bits of a bf16. */
static inline float hpdl_emu_operand(const void *p, long long i, int bf16) {
  if (!bf16) return ((const float *)p)[i];
  unsigned int u = (unsigned int)((const unsigned short *)p)[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Row-major C[m, n] = alpha op(A)[m, k] op(B)[k, n] (op: transpose when
 * ta / tb), A and B fp32 or (ab_bf16) both bf16, C fp32, per matrix of a
 * batch: matrix bi of the output (batch axes bdims[0..nb)) reads A at
 * sum_i idx_i * sa[i] matrices of A (B alike). Sums in fp32 in order of k,
 * as a reference (the CPU's BLAS blocks it). */
static inline void hpdl_emu_gemm(const void *A, const void *B, int ab_bf16, float *C, int ta, int tb, long long m,
                                 long long n, long long k, long long lda, long long ldb, float alpha, int nb,
                                 const long long *bdims, const long long *sa, const long long *sb, long long amat,
                                 long long bmat) {
  long long nbatch = 1;
  for (int i = 0; i < nb; i++) nbatch *= bdims[i];
  for (long long bi = 0; bi < nbatch; bi++) {
    long long oa = 0, ob = 0, inner = 1;
    for (int i = nb - 1; i >= 0; i--) {
      long long idx = (bi / inner) % bdims[i];
      oa += idx * sa[i];
      ob += idx * sb[i];
      inner *= bdims[i];
    }
    long long a0 = oa * amat, b0 = ob * bmat;
    float *c = C + bi * m * n;
    for (long long i = 0; i < m; i++)
      for (long long j = 0; j < n; j++) {
        float s = 0.0f;
        for (long long q = 0; q < k; q++) {
          float x = hpdl_emu_operand(A, a0 + (ta ? q * lda + i : i * lda + q), ab_bf16);
          float y = hpdl_emu_operand(B, b0 + (tb ? j * ldb + q : q * ldb + j), ab_bf16);
          s += x * y;
        }
        c[i * n + j] = alpha * s;
      }
  }
}

/* GROUPED_MM (wgrad 0: C[r] = A[r] op(W[ids[r]]), W [E, X, Y] or [E, Y, X]
 * with tb) and GROUPED_MM_WGRAD (1: C[e] = sum over e's rows of A[r]^T dY[r],
 * B = dY [N, Y], C [E, X, Y]), as the host program's one GEMM an expert. */
static inline void hpdl_emu_grouped(const void *A, const void *B, const int *ids, float *C, int ab_bf16, int wgrad, int tb,
                                    long long n, long long x, long long y, long long e) {
  if (wgrad) {
    for (long long i = 0; i < e * x * y; i++) C[i] = 0.0f;
    for (long long r = 0; r < n; r++) {
      if (ids[r] < 0 || ids[r] >= e) continue;
      float *c = C + (long long)ids[r] * x * y;
      for (long long i = 0; i < x; i++)
        for (long long j = 0; j < y; j++)
          c[i * y + j] += hpdl_emu_operand(A, r * x + i, ab_bf16) * hpdl_emu_operand(B, r * y + j, ab_bf16);
    }
    return;
  }
  for (long long r = 0; r < n; r++)
    for (long long j = 0; j < y; j++) {
      float s = 0.0f;
      long long w0 = (long long)(ids[r] >= 0 && ids[r] < e ? ids[r] : 0) * x * y;
      for (long long q = 0; q < x; q++)
        s += hpdl_emu_operand(A, r * x + q, ab_bf16) * hpdl_emu_operand(B, w0 + (tb ? j * x + q : q * y + j), ab_bf16);
      C[r * y + j] = s;
    }
}

/* cuBLASLt's epilogue after the product in d (rows x n): d += bias[n]
 * per row; aux (when not null) keeps that pre-activation; then act: 0 none,
 * 1 relu, 2 gelu (the tanh form of hpdl_cuda.cuh, as CUBLASLT_EPILOGUE_GELU). */
static inline void hpdl_emu_epilogue(float *d, const float *bias, float *aux, long long rows, long long n, int act) {
  for (long long i = 0; i < rows; i++)
    for (long long j = 0; j < n; j++) {
      float v = d[i * n + j] + bias[j];
      if (aux) aux[i * n + j] = v;
      d[i * n + j] = act == 1 ? (v > 0.0f ? v : 0.0f) : act == 2 ? hpdl_gelu(v) : v;
    }
}

/* cuBLASLt's bias epilogue into a bf16 D (FuseOptions.store16): the fp32
 * product c (rows x n) plus bias[n] per row (none: NULL), rounded as it is
 * stored in d. */
static inline void hpdl_emu_bias16(unsigned short *d, const float *c, const float *bias, long long rows, long long n) {
  for (long long i = 0; i < rows; i++)
    for (long long j = 0; j < n; j++) d[i * n + j] = hpdl_bf16_from_f32(c[i * n + j] + (bias ? bias[j] : 0.0f));
}

/* cuBLASLt's bias-gradient epilogue (BGRADA / BGRADB): out[j] = the sum over
 * q < k of the operand's stored [k, x] matrix (leading dimension ld), in
 * order of q, fp32; the product is untouched. */
static inline void hpdl_emu_bgrad(float *out, const void *X, int bf16, long long k, long long x, long long ld) {
  for (long long j = 0; j < x; j++) {
    float s = 0.0f;
    for (long long q = 0; q < k; q++) s += hpdl_emu_operand(X, q * ld + j, bf16);
    out[j] = s;
  }
}

/* The launch entry of hpdl_accumulate_f32 (runtime/device/device_emu.c). */
extern "C" int hpd_emul_hpdl_accumulate_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_accumulate_f32, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (float *)args[1],
                         (long long)(unsigned long long)args[2]);
}

/* The launch entry of hpdl_bias_grad_f32 (runtime/device/devexec.c). */
extern "C" int hpd_emul_hpdl_bias_grad_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_bias_grad_f32, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (float *)args[1],
                         (long long)(unsigned long long)args[2], (long long)(unsigned long long)args[3],
                         (long long)(unsigned long long)args[4]);
}

/* The launch entries of hpdl_bias_grad_bf16 and hpdl_bias_bf16 (runtime/device/devexec.c). */
extern "C" int hpd_emul_hpdl_bias_grad_bf16(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_bias_grad_bf16, dim3(grid), dim3(block), 0, *ctx, (const unsigned short *)args[0],
                         (float *)args[1], (long long)(unsigned long long)args[2], (long long)(unsigned long long)args[3],
                         (long long)(unsigned long long)args[4]);
}
extern "C" int hpd_emul_hpdl_bias_bf16(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_bias_bf16, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (const float *)args[1],
                         (unsigned short *)args[2], (long long)(unsigned long long)args[3],
                         (long long)(unsigned long long)args[4]);
}

/* The launch entries of hpdl_compress16_f32, hpdl_sum16_f32 and hpdl_copy_f32 (runtime/device/devcomp.c). */
extern "C" int hpd_emul_hpdl_compress16_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_compress16_f32, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (float *)args[1],
                         (unsigned short *)args[2], (long long)(unsigned long long)args[3],
                         (long long)(unsigned long long)args[4]);
}
extern "C" int hpd_emul_hpdl_sum16_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_sum16_f32, dim3(grid), dim3(block), 0, *ctx, (const unsigned short *)args[0], (float *)args[1],
                         (long long)(unsigned long long)args[2], (long long)(unsigned long long)args[3],
                         (long long)(unsigned long long)args[4], (long long)(unsigned long long)args[5]);
}
extern "C" int hpd_emul_hpdl_copy_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_copy_f32, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (float *)args[1],
                         (long long)(unsigned long long)args[2]);
}

/* The launch entry of hpdl_take_f32 (runtime/device/devexec.c). */
extern "C" int hpd_emul_hpdl_take_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_take_f32, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (const long long *)args[1],
                         (float *)args[2], (long long)(unsigned long long)args[3]);
}

/* The launch entry of hpdl_round_bf16 (runtime/device/devexec.c). */
extern "C" int hpd_emul_hpdl_round_bf16(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  return HPDL_EMU_LAUNCH(hpdl_round_bf16, dim3(grid), dim3(block), 0, *ctx, (const float *)args[0], (unsigned short *)args[1],
                         (long long)(unsigned long long)args[2]);
}

/* The launch entry of hpdl_chunk_copy_f32 (runtime/device/devexec.c). */
extern "C" int hpd_emul_hpdl_chunk_copy_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **args) {
  long long v[6];
  for (int i = 0; i < 6; i++) v[i] = (long long)(unsigned long long)args[i];
  return HPDL_EMU_LAUNCH(hpdl_chunk_copy_f32, dim3(grid), dim3(block), 0, *ctx, v[0], v[1], v[2], v[3], v[4], v[5],
                         (long long)(unsigned long long)args[6], (float *)args[7], (float *)args[8],
                         (long long)(unsigned long long)args[9]);
}

/* The optimizer's kernels (hpdl_optim.cuh) take a table and arguments by
 * value: their entries take cuLaunchKernel's parameter array, a pointer to
 * each argument (device.h's launch_raw; ctx is not used). */
extern "C" int hpd_emul_hpdl_adamw_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **params) {
  (void)ctx;
  return HPDL_EMU_LAUNCH(hpdl_adamw_f32, dim3(grid), dim3(block), 0, *(const hpdl_optim_chunk *const *)params[0],
                         *(const long long *)params[1], *(const hpdl_adamw_args *)params[2]);
}
extern "C" int hpd_emul_hpdl_sgd_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **params) {
  (void)ctx;
  return HPDL_EMU_LAUNCH(hpdl_sgd_f32, dim3(grid), dim3(block), 0, *(const hpdl_optim_chunk *const *)params[0],
                         *(const long long *)params[1], *(const hpdl_sgd_args *)params[2]);
}
#if defined(HPDL_OPTIM_MOMENTS16)
extern "C" int hpd_emul_hpdl_adamw_bf16m(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **params) {
  (void)ctx;
  return HPDL_EMU_LAUNCH(hpdl_adamw_bf16m, dim3(grid), dim3(block), 0, *(const hpdl_optim_chunk *const *)params[0],
                         *(const long long *)params[1], *(const hpdl_adamw_args *)params[2]);
}
extern "C" int hpd_emul_hpdl_sgd_bf16m(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **params) {
  (void)ctx;
  return HPDL_EMU_LAUNCH(hpdl_sgd_bf16m, dim3(grid), dim3(block), 0, *(const hpdl_optim_chunk *const *)params[0],
                         *(const long long *)params[1], *(const hpdl_sgd_args *)params[2]);
}
#endif
extern "C" int hpd_emul_hpdl_sumsq_f32(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **params) {
  (void)ctx;
  return HPDL_EMU_LAUNCH(hpdl_sumsq_f32, dim3(grid), dim3(block), 0, *(const hpdl_optim_chunk *const *)params[0],
                         *(const long long *)params[1], *(double *const *)params[2]);
}

#endif
