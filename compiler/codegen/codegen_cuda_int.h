/* codegen_cuda_int.h - what the files of the CUDA back end share
 * (codegen_cuda.c: loop nests and the interface; codegen_cuda_special.c:
 * the special kernels). */
#ifndef HPDL_CODEGEN_CUDA_INT_H
#define HPDL_CODEGEN_CUDA_INT_H

#include <stdint.h>

#include "codegen.h"
#include "codegen_cuda.h"
#include "cudacc.h"
#include "gemm.h"
#include "fuse.h"
#include "ir.h"
#include "nest.h"

enum { CU_BLOCK = 256, CU_MAX_GRID = 65535 };
/* A column kernel's rows a block (kernels/hpdl_cuda.cuh's HPDL_COL_ROWS):
 * 8 neighbouring floats are one 32-byte sector, so a warp's loads use every
 * byte they fetch, and a sum over 768 columns still fills 96 blocks; 16 where
 * the kernel reads or writes 16-bit values (16 of them are the sector). */
enum { CU_COL_ROWS = 8, CU_COL_ROWS16 = 16 };
/* Row kernels whose group is at most CU_WROW_MAX values run a warp per row,
 * CU_WROW_ROWS rows (warps) a block. */
enum { CU_WROW_MAX = 4096, CU_WROW_ROWS = 8 };

/* Growable text: the generated source. */
typedef struct {
  char *s;
  size_t len, cap;
} CuText;

void cu_tx(CuText *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef CgCudaLaunch CuLaunch;

struct CgTarget {
  const IrModule *m;
  const FuseResult *fr;
  CgOptions opt;
  CuText src;
  CgStats stats;
  char err[2048];
  int failed;
  CuLaunch *launch;
  int nlaunch, caplaunch;
  /* kernels left to a library or not generated yet */
  int ngemm, nspecial;
  CudaccResult result; /* of the last emit: images, resources */
  int have_result;
  char warning[512];   /* a cache problem (only speed is lost) */
  CuText emu;          /* CgOptions.emulate: the host entries */
  int emu_built;       /* 1: the emulation library compiled, 2: taken from the cache */
  double emu_seconds;  /* its C++ compile's wall time */
};

/* A fused kernel being generated. */
typedef struct {
  CgTarget *t;
  int gi, kp;
  const FuseGraph *fg;
  const FuseKernel *K;
  NestKernel nk;
  char base[160]; /* hpd_<graph>_k<kp> */
  CuText stub;    /* CgOptions.emulate: the body of its host entry */
} CuKern;

/* Records the first problem (the one to fix); later ones are dropped. */
void cu_fail(CgTarget *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *cu_c_type(DType t);
/* The parameter index of value v among the kernel's io, or -1. */
int cu_io_index(const CuKern *k, int v);
/* `extern "C" __global__ void NAME(seed, layer, p0, p1, ...) {` */
void cu_signature(CuKern *k, CuText *o, const char *name);
/* Kernel kp of graph fg's name, hpd_<graph>_k<kp> (CuKern.base). */
void cu_kernel_base(const FuseGraph *fg, int kp, char *buf, size_t n);
/* The same with __launch_bounds__(256, min_blocks) (0: none given): a
 * kernel whose shared memory already bounds its occupancy tells ptxas so,
 * which then need not spill registers to reach a higher one. */
void cu_signature_min(CuKern *k, CuText *o, const char *name, int min_blocks);
/* the same with the block's threads at most max_threads (the launch's) and min_blocks
 * blocks a multiprocessor, which caps ptxas's registers at 65536 / (max_threads x
 * min_blocks) */
void cu_signature_bounds(CuKern *k, CuText *o, const char *name, int max_threads, int min_blocks);
void cu_add_launch(CuKern *k, const char *name, int step, const char *kind, int64_t grid, int64_t block);
/* A float literal of C++ (inf and nan spelled out). */
void cu_float(CuText *o, double v);

/* The element types a kernel moves four at a time: f32 (a float4), bf16 and
 * f16 (8 bytes, a uint2). */
int cu_vec_type(DType t);

/* `IND*(float4 *)(pIO + AT) = ...;`: four values v[0..3] (expressions in
 * fp32) stored together at element offset AT (a C expression), of type dt
 * (cu_vec_type); 16-bit ones rounded as a scalar store rounds them, two a word
 * of a uint2. */
void cu_store4(CuText *o, const char *ind, int io, DType dt, const char *at, const char *const v[4]);

/* Special kernels (codegen_cuda_special.c): 0, or -1 after cu_fail; a kind
 * not generated yet counts in t->nspecial with a comment in the source. */
int cu_special(CuKern *k);

#endif
