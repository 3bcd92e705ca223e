/* gemm16.h - GEMMs on bf16 operands with fp32 results, for the CPU back end
 * under train { precision = bf16 } (docs/backend.md "16-bit GEMMs").
 *
 * C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, row-major as
 * cblas_sgemm, A and B bf16 bits, C fp32. oneDNN's matmul primitive runs it
 * where the library is installed (libdnnl.so.2, opened at run time, so
 * neither the build nor an artifact needs it): on a CPU with AVX512-BF16 it
 * multiplies the 16-bit values directly, about twice the FLOP/s of sgemm
 * (docs/runtime.md). Otherwise the operands are widened to fp32 (exactly)
 * and the caller's sgemm runs: the same products and sums, a different
 * order. Both accumulate in fp32. */
#ifndef HPDL_GEMM16_H
#define HPDL_GEMM16_H

#include <stdint.h>

/* cblas_sgemm's arguments without the order (row-major), trans as 0 / 1. */
typedef void (*Gemm16Sgemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The product above; 0, or -1 with the reason in why (out of memory, or a
 * library error). nthreads: the threads oneDNN may use (0: its default).
 * `fallback` NULL: the widened operands are multiplied by plain loops. */
int gemm16_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc, Gemm16Sgemm fallback,
                int nthreads, char *why, int whylen);

/* Frees the kept oneDNN primitives, stream and engine (what a library that
 * holds this code must do before it is unloaded: its static table is their
 * only reference); a later product makes them again. */
void gemm16_release(void);

/* Which way the products run (oneDNN is opened to find out): "oneDNN 2.6.3
 * matmul (brg:avx512_core_bf16)", the kernel oneDNN picks on this CPU, or
 * "fp32 sgemm: <why oneDNN is not used>". HPDL_GEMM16=fp32 forces the
 * widening path. */
const char *gemm16_backend(void);

#endif
