/* cpubench.h - measures this machine for the `cpu` device of the catalog.
 *
 * The CPU back end runs GEMMs through OpenBLAS, so its peak is what
 * cblas_sgemm reaches here, not a datasheet figure; memory-bound kernels run
 * at what a STREAM-style triad reaches. `hpdlc plan --measure-cpu` measures
 * both (about a second) and plans with them. */
#ifndef HPDL_CPUBENCH_H
#define HPDL_CPUBENCH_H

#include <stddef.h>

typedef struct {
  double sgemm_flops;  /* FLOP/s of a 1024^3 sgemm, best of several runs */
  double bf16_flops;   /* the same product on bf16 operands (core/numeric/gemm16.h: oneDNN where installed) */
  char bf16_how[160];  /* gemm16_backend(): which way it ran */
  double triad_bytes_per_s;
  double mem_bytes;    /* physical memory */
  int used_blas;       /* 0: OpenBLAS was not found, a plain C kernel was timed */
  int threads;
} CpuFigures;

/* 0, or -1 with the reason in why. */
int cpubench_measure(CpuFigures *out, char *why, size_t whylen);

#endif
