/* codegen_cpu.h - the CPU back end: LLVM code for every fused kernel and
 * graph, linked into a shared library (docs/backend.md). Built only when
 * CMake found LLVM (HPDL_HAVE_LLVM); use it through cg_backend("cpu"). */
#ifndef HPDL_CODEGEN_CPU_H
#define HPDL_CODEGEN_CPU_H

#include "codegen.h"

const CgBackend *cg_cpu_backend(void);

#endif
