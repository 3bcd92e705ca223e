/* device_cuda.c - the device layer on a GPU: the CUDA driver API and
 * cuBLASLt, opened with dlopen (device.h).
 *
 * Nothing of CUDA is needed to build this file: the few types and enum
 * values it uses are the published ABI of the driver API (cuda.h) and of
 * cuBLASLt (cublasLt.h, library_types.h), written out below. Libraries,
 * first that opens wins:
 *   driver:   $HPDL_LIBCUDA, libcuda.so.1 (the driver installs it)
 *   cuBLASLt: $HPDL_CUBLASLT, $CUDA_HOME/lib64/libcublasLt.so,
 *             /usr/local/cuda/lib64/libcublasLt.so, libcublasLt.so.13,
 *             libcublasLt.so.12, libcublasLt.so
 * Everything runs on the legacy default stream in order; copies to and from
 * the host are synchronous. GEMMs: fp32 in, fp32 out, compute type 32F
 * (true fp32) unless HPDL_GEMM_TF32=1 allows TF32 tensor cores; the
 * epilogues bias, bias+ReLU and bias+GELU (with the pre-activation kept for
 * GELU: GELU_AUX_BIAS) and the bias gradients (BGRADA / BGRADB). Row-major products are run as their column-major
 * transposes (C^T = op(B)^T op(A)^T), which needs no copy. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"

/* ---- the driver API's ABI (cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
enum { CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76, CU_ATTR_SM_COUNT = 16 };

/* ---- cuBLASLt's ABI (cublasLt.h, library_types.h) ---- */
typedef int cublasStatus_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque *cublasLtMatmulPreference_t;
typedef struct {
  unsigned long long data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;
enum {
  LT_COMPUTE_32F = 68,
  LT_COMPUTE_32F_FAST_TF32 = 77,
  LT_R_32F = 0,
  LT_R_16BF = 14, /* cudaDataType's CUDA_R_16BF */
  LT_OP_N = 0,
  LT_OP_T = 1,
  LT_DESC_TRANSA = 3,
  LT_DESC_TRANSB = 4,
  LT_DESC_EPILOGUE = 7,
  LT_DESC_BIAS_POINTER = 8,
  LT_DESC_AUX_POINTER = 11,
  LT_DESC_AUX_LD = 12,
  LT_DESC_BIAS_DATA_TYPE = 26, /* a bf16 D's bias stays fp32 (the default is D's type) */
  LT_EPI_DEFAULT = 1,
  LT_EPI_BIAS = 4,
  LT_EPI_RELU_BIAS = 6,
  LT_EPI_GELU_BIAS = 36,
  LT_EPI_GELU_AUX_BIAS = 164,
  LT_EPI_BGRADA = 256, /* the sum over k of cuBLASLt's A: our B (row-major C^T = B^T A^T) */
  LT_EPI_BGRADB = 512,
  LT_LAYOUT_BATCH_COUNT = 5,
  LT_LAYOUT_BATCH_OFFSET = 6,
  LT_PREF_MAX_WORKSPACE = 1,
};

#define CU_FUNCS(X)                                                                                            \
  X(CUresult, cuInit, (unsigned))                                                                              \
  X(CUresult, cuDriverGetVersion, (int *))                                                                     \
  X(CUresult, cuDeviceGetCount, (int *))                                                                       \
  X(CUresult, cuDeviceGet, (CUdevice *, int))                                                                  \
  X(CUresult, cuDeviceGetName, (char *, int, CUdevice))                                                        \
  X(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice))                                                    \
  X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                               \
  X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice))                                                        \
  X(CUresult, cuCtxSetCurrent, (CUcontext))                                                                    \
  X(CUresult, cuCtxSynchronize, (void))                                                                        \
  X(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                          \
  X(CUresult, cuMemFree_v2, (CUdeviceptr))                                                                     \
  X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                                            \
  X(CUresult, cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))                                                  \
  X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                              \
  X(CUresult, cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))                                 \
  X(CUresult, cuModuleLoadData, (CUmodule *, const void *))                                                    \
  X(CUresult, cuModuleUnload, (CUmodule))                                                                      \
  X(CUresult, cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                                     \
  X(CUresult, cuLaunchKernel,                                                                                  \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
  X(CUresult, cuGetErrorString, (CUresult, const char **))                                                     \
  X(CUresult, cuStreamCreate, (CUstream *, unsigned))                                                          \
  X(CUresult, cuStreamDestroy_v2, (CUstream))                                                                  \
  X(CUresult, cuEventCreate, (CUevent *, unsigned))                                                            \
  X(CUresult, cuEventRecord, (CUevent, CUstream))                                                              \
  X(CUresult, cuEventDestroy_v2, (CUevent))                                                                    \
  X(CUresult, cuStreamWaitEvent, (CUstream, CUevent, unsigned))

#define LT_FUNCS(X)                                                                                              \
  X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t *))                                                        \
  X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t))                                                         \
  X(size_t, cublasLtGetVersion, (void))                                                                          \
  X(cublasStatus_t, cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t *, int, int))                                \
  X(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t))                                           \
  X(cublasStatus_t, cublasLtMatmulDescSetAttribute, (cublasLtMatmulDesc_t, int, const void *, size_t))           \
  X(cublasStatus_t, cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t *, int, unsigned long long, unsigned long long, long long)) \
  X(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t))                                       \
  X(cublasStatus_t, cublasLtMatrixLayoutSetAttribute, (cublasLtMatrixLayout_t, int, const void *, size_t))       \
  X(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *))                              \
  X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t))                               \
  X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, (cublasLtMatmulPreference_t, int, const void *, size_t)) \
  X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                                              \
    (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, \
     cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *))         \
  X(cublasStatus_t, cublasLtMatmul,                                                                              \
    (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t, const void *,   \
     cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,  \
     const cublasLtMatmulAlgo_t *, void *, size_t, CUstream))

#define DECLARE(ret, name, args) ret(*name) args;
typedef struct {
  CU_FUNCS(DECLARE)
} CuApi;
typedef struct {
  LT_FUNCS(DECLARE)
} LtApi;
#undef DECLARE

enum { WORKSPACE_BYTES = 32 << 20, MAX_MODULES = 16 };

struct DevKernel {
  CUfunction fn;
  char name[200];
  int mod; /* the module it was found in */
  DevKernel *next;
};

struct DevGemmPlan {
  DevGemm g;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* the column-major view: first operand B, second A */
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
  int per_matrix; /* one product per matrix (the batch does not walk memory evenly) */
  DevGemmPlan *next;
};

typedef struct {
  Device base;
  void *libcuda, *liblt;
  CuApi cu;
  LtApi lt;
  CUdevice dev;
  CUcontext ctx;
  CUmodule modules[MAX_MODULES];
  int nmodules;
  cublasLtHandle_t lt_handle;
  cublasLtMatmulPreference_t pref;
  CUdeviceptr workspace;
  int tf32;
  DevKernel *kernels;
  DevGemmPlan *plans;
} CudaDev;

static int fail(CudaDev *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(CudaDev *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->base.err, sizeof d->base.err, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *cu_str(CudaDev *d, CUresult r) {
  const char *s = NULL;
  if (d->cu.cuGetErrorString) d->cu.cuGetErrorString(r, &s);
  return s ? s : "unknown error";
}

#define CU_CHECK(d, call, what)                                                                                \
  do {                                                                                                         \
    CUresult r_ = (call);                                                                                      \
    if (r_) return fail(d, "%s: CUDA error %d (%s)", what, r_, cu_str(d, r_));                                \
  } while (0)

static int resolve(void *lib, const char *name, void **slot, char *missing, size_t len) {
  *slot = dlsym(lib, name);
  if (!*slot && !missing[0]) snprintf(missing, len, "%s", name);
  return *slot ? 0 : -1;
}

static CudaDev *cuda_of(Device *d) { return (CudaDev *)d; }

static void *cu_alloc(Device *dd, size_t bytes) {
  CudaDev *d = cuda_of(dd);
  CUdeviceptr p = 0;
  CUresult r = d->cu.cuMemAlloc_v2(&p, bytes ? bytes : 1);
  if (r) {
    fail(d, "cuMemAlloc of %zu bytes: CUDA error %d (%s)", bytes, r, cu_str(d, r));
    return NULL;
  }
  r = d->cu.cuMemsetD8Async(p, 0, bytes, NULL);
  if (r) {
    d->cu.cuMemFree_v2(p);
    fail(d, "cuMemsetD8 of %zu bytes: CUDA error %d (%s)", bytes, r, cu_str(d, r));
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void cu_release(Device *dd, void *p) {
  if (p) cuda_of(dd)->cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)p);
}

static int cu_to_device(Device *dd, void *dst, const void *src, size_t n) {
  CudaDev *d = cuda_of(dd);
  CU_CHECK(d, d->cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)dst, src, n), "copy to the device");
  return 0;
}

static int cu_to_host(Device *dd, void *dst, const void *src, size_t n) {
  CudaDev *d = cuda_of(dd);
  CU_CHECK(d, d->cu.cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, n), "copy to the host");
  return 0;
}

static int cu_copy(Device *dd, void *dst, const void *src, size_t n) {
  CudaDev *d = cuda_of(dd);
  CU_CHECK(d, d->cu.cuMemcpyDtoDAsync_v2((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, NULL), "device copy");
  return 0;
}

static int cu_zero(Device *dd, void *p, size_t n) {
  CudaDev *d = cuda_of(dd);
  CU_CHECK(d, d->cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)p, 0, n, NULL), "device memset");
  return 0;
}

static int cu_load(Device *dd, const void *image, size_t bytes, const char *path) {
  (void)bytes;
  CudaDev *d = cuda_of(dd);
  if (d->nmodules == MAX_MODULES) return fail(d, "more than %d modules loaded", MAX_MODULES);
  CUmodule m;
  CUresult r = d->cu.cuModuleLoadData(&m, image);
  if (r)
    return fail(d, "loading %s: CUDA error %d (%s)%s", path ? path : "the module", r, cu_str(d, r),
                r == 209 || r == 222 ? " - the cubin is for another GPU architecture and no PTX was given" : "");
  d->modules[d->nmodules++] = m;
  return 0;
}

/* A name is looked up in the latest module first (as the emulated
 * device's: a stage's chunks load modules whose kernels share names). */
static DevKernel *cu_kernel(Device *dd, const char *name) {
  CudaDev *d = cuda_of(dd);
  for (int i = d->nmodules - 1; i >= 0; i--) {
    for (DevKernel *k = d->kernels; k; k = k->next)
      if (k->mod == i && !strcmp(k->name, name)) return k;
    CUfunction f;
    if (d->cu.cuModuleGetFunction(&f, d->modules[i], name)) continue;
    DevKernel *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->fn = f;
    k->mod = i;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->next = d->kernels;
    d->kernels = k;
    return k;
  }
  fail(d, "kernel %s is in no loaded module", name);
  return NULL;
}

static int cu_launch_on(Device *dd, void *stream, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx,
                        void *const *args, int nargs) {
  CudaDev *d = cuda_of(dd);
  enum { MAX_ARGS = 64 };
  if (nargs + 1 > MAX_ARGS) return fail(d, "kernel %s: %d arguments (at most %d)", k->name, nargs, MAX_ARGS - 1);
  void *params[MAX_ARGS];
  CUdeviceptr ptrs[MAX_ARGS];
  params[0] = (void *)ctx;
  for (int i = 0; i < nargs; i++) {
    ptrs[i] = (CUdeviceptr)(uintptr_t)args[i];
    params[i + 1] = &ptrs[i];
  }
  CUresult r = d->cu.cuLaunchKernel(k->fn, grid, 1, 1, block, 1, 1, 0, (CUstream)stream, params, NULL);
  if (r) return fail(d, "launch of %s (grid %u, block %u): CUDA error %d (%s)", k->name, grid, block, r, cu_str(d, r));
  return 0;
}

static int cu_launch(Device *dd, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx, void *const *args,
                     int nargs) {
  return cu_launch_on(dd, NULL, k, grid, block, ctx, args, nargs);
}

static int cu_launch_raw(Device *dd, DevKernel *k, unsigned grid, unsigned block, void **params) {
  CudaDev *d = cuda_of(dd);
  CUresult r = d->cu.cuLaunchKernel(k->fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL);
  if (r) return fail(d, "launch of %s (grid %u, block %u): CUDA error %d (%s)", k->name, grid, block, r, cu_str(d, r));
  return 0;
}

static int lt_check(CudaDev *d, cublasStatus_t s, const char *what) {
  return s ? fail(d, "cuBLASLt %s: status %d", what, s) : 0;
}

static int layout(CudaDev *d, cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld,
                  int64_t batch, int64_t stride) {
  if (lt_check(d, d->lt.cublasLtMatrixLayoutCreate(l, type, (unsigned long long)rows, (unsigned long long)cols, ld),
               "matrix layout"))
    return -1;
  if (batch > 1) {
    int count = (int)batch;
    long long off = stride;
    if (lt_check(d, d->lt.cublasLtMatrixLayoutSetAttribute(*l, LT_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count") ||
        lt_check(d, d->lt.cublasLtMatrixLayoutSetAttribute(*l, LT_LAYOUT_BATCH_OFFSET, &off, sizeof off), "batch stride"))
      return -1;
  }
  return 0;
}

static void plan_free(CudaDev *d, DevGemmPlan *p) {
  if (p->desc) d->lt.cublasLtMatmulDescDestroy(p->desc);
  if (p->la) d->lt.cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) d->lt.cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) d->lt.cublasLtMatrixLayoutDestroy(p->lc);
  free(p);
}

static DevGemmPlan *cu_gemm_plan(Device *dd, const DevGemm *g) {
  CudaDev *d = cuda_of(dd);
  DevGemmPlan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->g = *g;
  p->per_matrix = g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0);
  int64_t batch = p->per_matrix ? 1 : g->batch;
  if (g->epilogue == DEV_EPI_BIAS_RELU && g->aux >= 0) {
    fail(d, "a GEMM with a ReLU epilogue whose pre-activation is read later (cuBLASLt keeps a bit mask, not the values)");
    plan_free(d, p);
    return NULL;
  }
  if (g->aux >= 0 && g->ldc % 8) {
    fail(d, "a GEMM epilogue keeping its pre-activation needs a row length that is a multiple of 8 (it is %lld)",
         (long long)g->ldc);
    plan_free(d, p);
    return NULL;
  }
  /* Column-major: D^T[n, m] = op(B)^T op(A)^T, so cuBLASLt's A is our B. */
  int opa = g->trans_b ? LT_OP_T : LT_OP_N, opb = g->trans_a ? LT_OP_T : LT_OP_N;
  int epi = LT_EPI_DEFAULT;
  if (g->epilogue == DEV_EPI_BIAS) epi = LT_EPI_BIAS;
  else if (g->epilogue == DEV_EPI_BIAS_RELU) epi = LT_EPI_RELU_BIAS;
  else if (g->epilogue == DEV_EPI_BIAS_GELU) epi = g->aux >= 0 ? LT_EPI_GELU_AUX_BIAS : LT_EPI_GELU_BIAS;
  else if (g->epilogue == DEV_EPI_BGRAD_B) epi = LT_EPI_BGRADA;
  else if (g->epilogue == DEV_EPI_BGRAD_A) epi = LT_EPI_BGRADB;
  if (lt_check(d, d->lt.cublasLtMatmulDescCreate(&p->desc, d->tf32 && !g->ab_bf16 ? LT_COMPUTE_32F_FAST_TF32 : LT_COMPUTE_32F, LT_R_32F),
               "matmul descriptor") ||
      lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_TRANSA, &opa, sizeof opa), "transa") ||
      lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_TRANSB, &opb, sizeof opb), "transb") ||
      lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_EPILOGUE, &epi, sizeof epi), "epilogue")) {
    plan_free(d, p);
    return NULL;
  }
  int bias_type = LT_R_32F;
  if (g->c_bf16 && g->epilogue == DEV_EPI_BIAS && lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                            "fp32 bias of a bf16 output")) {
    plan_free(d, p);
    return NULL;
  }
  if (g->aux >= 0) {
    long long ld = g->ldc;
    if (lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_AUX_LD, &ld, sizeof ld), "aux ld")) {
      plan_free(d, p);
      return NULL;
    }
  }
  /* stored shapes (before op), column-major */
  int64_t brows = g->trans_b ? g->k : g->n, bcols = g->trans_b ? g->n : g->k;
  int64_t arows = g->trans_a ? g->m : g->k, acols = g->trans_a ? g->k : g->m;
  /* bf16 operands (train { precision = bf16 }) into an fp32 product, fp32 compute */
  int tab = g->ab_bf16 ? LT_R_16BF : LT_R_32F;
  if (layout(d, &p->la, tab, brows, bcols, g->ldb, batch, g->stride_b) ||
      layout(d, &p->lb, tab, arows, acols, g->lda, batch, g->stride_a) ||
      layout(d, &p->lc, g->c_bf16 ? LT_R_16BF : LT_R_32F, g->n, g->m, g->ldc, batch, g->stride_c)) {
    plan_free(d, p);
    return NULL;
  }
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  cublasStatus_t s = d->lt.cublasLtMatmulAlgoGetHeuristic(d->lt_handle, p->desc, p->la, p->lb, p->lc, p->lc, d->pref, 1, &h, &found);
  if (s || !found) {
    fail(d, "cuBLASLt has no algorithm for a %lld x %lld x %lld product (status %d)", (long long)g->m, (long long)g->n,
         (long long)g->k, s);
    plan_free(d, p);
    return NULL;
  }
  p->algo = h.algo;
  p->workspace = h.workspaceSize;
  p->next = d->plans;
  d->plans = p;
  return p;
}

static int cu_gemm(Device *dd, DevGemmPlan *p, void *const *io) {
  CudaDev *d = cuda_of(dd);
  const DevGemm *g = &p->g;
  float alpha = (float)g->alpha, beta = 0.0f;
  if (g->epilogue != DEV_EPI_NONE) {
    void *bias = io[g->bias];
    if (lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_BIAS_POINTER, &bias, sizeof bias), "bias pointer"))
      return -1;
    if (g->aux >= 0) {
      void *aux = io[g->aux];
      if (lt_check(d, d->lt.cublasLtMatmulDescSetAttribute(p->desc, LT_DESC_AUX_POINTER, &aux, sizeof aux), "aux pointer"))
        return -1;
    }
  }
  int64_t count = p->per_matrix ? g->batch : 1;
  for (int64_t bi = 0; bi < count; bi++) {
    int64_t oa = 0, ob = 0, inner = 1;
    if (p->per_matrix)
      for (int i = g->batch_axes - 1; i >= 0; i--) {
        int64_t idx = (bi / inner) % g->bdims[i];
        oa += idx * g->sa[i];
        ob += idx * g->sb[i];
        inner *= g->bdims[i];
      }
    size_t esz = g->ab_bf16 ? 2 : 4; /* bytes of an operand's element */
    const char *A = (const char *)io[g->a] + (size_t)(oa * g->amat) * esz;
    const char *B = (const char *)io[g->b] + (size_t)(ob * g->bmat) * esz;
    char *C = (char *)io[g->c] + (size_t)(bi * g->m * g->n) * (g->c_bf16 ? 2 : 4);
    cublasStatus_t s = d->lt.cublasLtMatmul(d->lt_handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                            &p->algo, (void *)(uintptr_t)d->workspace, WORKSPACE_BYTES, NULL);
    if (s)
      return fail(d, "cuBLASLt matmul %lld x %lld x %lld: status %d", (long long)g->m, (long long)g->n, (long long)g->k, s);
  }
  return 0;
}

static int cu_sync(Device *dd) {
  CudaDev *d = cuda_of(dd);
  CU_CHECK(d, d->cu.cuCtxSynchronize(), "synchronize (an earlier launch failed)");
  return 0;
}

static double cu_seconds(Device *dd) {
  cu_sync(dd);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void cu_close(Device *dd) {
  CudaDev *d = cuda_of(dd);
  if (!d) return;
  if (d->cu.cuCtxSynchronize && d->ctx) d->cu.cuCtxSynchronize();
  while (d->plans) {
    DevGemmPlan *n = d->plans->next;
    plan_free(d, d->plans);
    d->plans = n;
  }
  while (d->kernels) {
    DevKernel *n = d->kernels->next;
    free(d->kernels);
    d->kernels = n;
  }
  if (d->pref) d->lt.cublasLtMatmulPreferenceDestroy(d->pref);
  if (d->lt_handle) d->lt.cublasLtDestroy(d->lt_handle);
  if (d->workspace) d->cu.cuMemFree_v2(d->workspace);
  for (int i = 0; i < d->nmodules; i++) d->cu.cuModuleUnload(d->modules[i]);
  if (d->ctx) d->cu.cuDevicePrimaryCtxRelease_v2(d->dev);
  if (d->liblt) dlclose(d->liblt);
  if (d->libcuda) dlclose(d->libcuda);
  free(d);
}

/* CU_STREAM_NON_BLOCKING: the stream does not wait for the legacy default
 * stream (the launches'), so the two overlap; CU_EVENT_DISABLE_TIMING: an
 * event that only orders. */
static void *cu_stream_create(Device *dd) {
  CudaDev *d = cuda_of(dd);
  CUstream s = NULL;
  CUresult r = d->cu.cuStreamCreate(&s, 0x1);
  if (r) fail(d, "cuStreamCreate: CUDA error %d (%s)", r, cu_str(d, r));
  return r ? NULL : (void *)s;
}

static int cu_stream_wait(Device *dd, void *waiter, void *waited) {
  CudaDev *d = cuda_of(dd);
  CUevent e = NULL;
  CU_CHECK(d, d->cu.cuEventCreate(&e, 0x2), "cuEventCreate");
  CUresult r = d->cu.cuEventRecord(e, (CUstream)waited);
  if (!r) r = d->cu.cuStreamWaitEvent((CUstream)waiter, e, 0);
  d->cu.cuEventDestroy_v2(e); /* the wait holds what it needs */
  if (r) return fail(d, "ordering two streams: CUDA error %d (%s)", r, cu_str(d, r));
  return 0;
}

static void cu_stream_destroy(Device *dd, void *s) {
  if (s) cuda_of(dd)->cu.cuStreamDestroy_v2((CUstream)s);
}

static const DevOps cuda_ops = {"cuda",    cu_alloc,  cu_release, cu_to_device, cu_to_host, cu_copy, cu_zero,
                                cu_load,   cu_kernel, cu_launch,  cu_gemm_plan, cu_gemm,    cu_sync, cu_seconds,
                                cu_close, cu_launch_raw, cu_stream_create, cu_stream_wait, cu_stream_destroy,
                                cu_launch_on};

Device *dev_cuda_open(int ordinal, char *err, size_t errlen) {
  CudaDev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->base.ops = &cuda_ops;
  char tried[1024] = "", missing[128] = "";
  const char *cu_names[] = {getenv("HPDL_LIBCUDA"), "libcuda.so.1"};
  d->libcuda = dev_dlopen_first(cu_names, 2, tried, sizeof tried);
  if (!d->libcuda) {
    snprintf(err, errlen, "no CUDA driver: could not open %s (a GPU machine has it from the NVIDIA driver)", tried);
    cu_close(&d->base);
    return NULL;
  }
#define RESOLVE(ret, name, args) resolve(d->libcuda, #name, (void **)&d->cu.name, missing, sizeof missing);
  CU_FUNCS(RESOLVE)
#undef RESOLVE
  if (missing[0]) {
    snprintf(err, errlen, "the CUDA driver has no %s (too old a driver?)", missing);
    cu_close(&d->base);
    return NULL;
  }
  int n = 0, version = 0;
  CUresult r = d->cu.cuInit(0);
  if (!r) r = d->cu.cuDeviceGetCount(&n);
  if (r || n == 0) {
    snprintf(err, errlen, "the CUDA driver sees no GPU%s%s%s", r ? " (" : "", r ? cu_str(d, r) : "", r ? ")" : "");
    cu_close(&d->base);
    return NULL;
  }
  if (ordinal < 0) ordinal = (-1 - ordinal) % n; /* DEV_ORDINAL_OF_LOCAL_RANK */
  d->base.ngpus = n;
  if (ordinal >= n) {
    snprintf(err, errlen, "GPU %d asked for, the driver sees %d (CUDA_VISIBLE_DEVICES?)", ordinal, n);
    cu_close(&d->base);
    return NULL;
  }
  d->cu.cuDriverGetVersion(&version);
  if ((r = d->cu.cuDeviceGet(&d->dev, ordinal)) || (r = d->cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev)) ||
      (r = d->cu.cuCtxSetCurrent(d->ctx))) {
    snprintf(err, errlen, "GPU %d: cannot make a context: CUDA error %d (%s)", ordinal, r, cu_str(d, r));
    cu_close(&d->base);
    return NULL;
  }
  char gpu[128] = "?";
  int major = 0, minor = 0, sms = 0;
  d->cu.cuDeviceGetName(gpu, sizeof gpu, d->dev);
  d->cu.cuDeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, d->dev);
  d->cu.cuDeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, d->dev);
  d->cu.cuDeviceGetAttribute(&sms, CU_ATTR_SM_COUNT, d->dev);
  /* cuBLASLt */
  char lt1[1024] = "";
  const char *home = getenv("CUDA_HOME");
  if (home && *home) snprintf(lt1, sizeof lt1, "%s/lib64/libcublasLt.so", home);
  const char *lt_names[] = {getenv("HPDL_CUBLASLT"), lt1, "/usr/local/cuda/lib64/libcublasLt.so", "libcublasLt.so.13",
                            "libcublasLt.so.12", "libcublasLt.so"};
  tried[0] = '\0';
  d->liblt = dev_dlopen_first(lt_names, 6, tried, sizeof tried);
  if (!d->liblt) {
    snprintf(err, errlen, "no cuBLASLt for the GEMMs: could not open %s (set HPDL_CUBLASLT to libcublasLt.so)", tried);
    cu_close(&d->base);
    return NULL;
  }
#define RESOLVE(ret, name, args) resolve(d->liblt, #name, (void **)&d->lt.name, missing, sizeof missing);
  LT_FUNCS(RESOLVE)
#undef RESOLVE
  if (missing[0]) {
    snprintf(err, errlen, "cuBLASLt has no %s", missing);
    cu_close(&d->base);
    return NULL;
  }
  uint64_t ws = WORKSPACE_BYTES;
  if (d->lt.cublasLtCreate(&d->lt_handle) || d->lt.cublasLtMatmulPreferenceCreate(&d->pref) ||
      d->lt.cublasLtMatmulPreferenceSetAttribute(d->pref, LT_PREF_MAX_WORKSPACE, &ws, sizeof ws) ||
      d->cu.cuMemAlloc_v2(&d->workspace, WORKSPACE_BYTES)) {
    snprintf(err, errlen, "cannot set up cuBLASLt on GPU %d", ordinal);
    cu_close(&d->base);
    return NULL;
  }
  d->base.sm = major * 10 + minor;
  const char *tf = getenv("HPDL_GEMM_TF32");
  d->tf32 = tf && !strcmp(tf, "1");
  d->base.tf32 = d->tf32;
  snprintf(d->base.what, sizeof d->base.what, "GPU %d: %s, sm_%d%d, %d SMs, driver %d.%d, cuBLASLt %zu%s", ordinal, gpu,
           major, minor, sms, version / 1000, version % 1000 / 10, d->lt.cublasLtGetVersion(),
           d->tf32 ? ", TF32 GEMMs" : ", fp32 GEMMs");
  return &d->base;
}
