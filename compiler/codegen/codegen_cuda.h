/* codegen_cuda.h - the CUDA back end: CUDA C for every fused kernel
 * (docs/backend.md, "The CUDA back end"). Always built (it needs no CUDA to
 * generate source); use it through cg_backend("cuda"). */
#ifndef HPDL_CODEGEN_CUDA_H
#define HPDL_CODEGEN_CUDA_H

#include <stdio.h>

#include "codegen.h"

const CgBackend *cg_cuda_backend(void);

/* Kernels of a generated module that are not CUDA C of ours: GEMMs (left
 * to cuBLASLt) and special kernels not generated yet. Returns their sum,
 * or -1 when generation failed for another reason (CgBackend.error). */
int cg_cuda_pending(const CgTarget *t, int *gemms, int *specials);

/* After emit: per launch its kernel, resources (registers, shared memory,
 * spills, from ptxas) and launch shape; `hpdlc compile --target cuda -v`. */
void cg_cuda_report(const CgTarget *t, FILE *out);

#endif
