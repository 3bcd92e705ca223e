/* device.h - the device layer: the operations the runtime needs from a GPU,
 * behind one table with two implementations (docs/gpu.md).
 *
 *   cuda     the CUDA driver API (libcuda.so.1) and cuBLASLt, both opened
 *            with dlopen, so that nothing is needed at build time and a
 *            machine without them gets a sentence naming what is missing;
 *   emulate  host memory, the generated kernels compiled as C++ through the
 *            emulation harness (kernels/cuda_emu.h) into a shared object,
 *            and a reference GEMM.
 *
 * Everything above the table (devexec.c: the walk over a stage's fused
 * graphs) is shared, so what the tests run on a machine without a GPU is
 * what a GPU runs. Errors: every function returns 0 or -1 and leaves one
 * line in dev_error(). */
#ifndef HPDL_DEVICE_H
#define HPDL_DEVICE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* kernels/hpdl_cuda.cuh's hpdl_kctx: what every generated kernel takes first. */
typedef struct {
  unsigned long long seed;
  long long layer;
  int rank[4];
  int size[4];
  int flags; /* HPDL_KCTX_*: DEV_KCTX_TF32 */
} DevKctx;

#define DEV_KCTX_TF32 1 /* hpdl_cuda.cuh's HPDL_KCTX_TF32 */

enum { DEV_MAX_BATCH_AXES = 8 };

/* BGRAD_A / BGRAD_B: no change to C; `bias` receives the bias gradient, the
 * sum of op(A) over k (m values) or of op(B) over k (n values), the operand
 * stored as [k, m] (A transposed) or [k, n] (B as it is); one matrix. */
typedef enum { DEV_EPI_NONE, DEV_EPI_BIAS, DEV_EPI_BIAS_RELU, DEV_EPI_BIAS_GELU, DEV_EPI_BGRAD_A, DEV_EPI_BGRAD_B } DevEpilogue;

/* The epilogue of a manifest's name ("bias", "bias_relu", "bias_gelu",
 * "bgrad_a", "bgrad_b"; NULL: none), or -1 for a name it does not know. */
int dev_epilogue_of(const char *name);

/* A GEMM of a fused kernel, over its io pointers (indices a, b, c, bias,
 * aux): row-major C[m, n] = alpha op(A)[m, k] op(B)[k, n], op transposing
 * when trans_*; then the epilogue D = act(C + bias[n]) with aux (when >= 0)
 * receiving the pre-activation, or a bias gradient (DEV_EPI_BGRAD_*). A batch of matrices: the output's batch
 * axes bdims[0..batch_axes), matrix i of A at sum idx * sa[axis] matrices
 * of amat elements (B alike), C dense. `batch` and stride_a/b (elements)
 * say the same as one strided batch when the axes walk memory evenly;
 * stride -1 when they do not (then one product per matrix). */
typedef struct {
  int a, b, c, bias, aux;
  int trans_a, trans_b;
  int ab_bf16; /* A and B bf16 (the manifest's "ab_type": "bf16"), C fp32; else all fp32 */
  int c_bf16;  /* D bf16 ("c_type": "bf16"): the bias epilogue's fp32 sum rounded as it is written */
  int64_t m, n, k, lda, ldb, ldc;
  double alpha;
  int64_t batch, stride_a, stride_b, stride_c;
  int batch_axes;
  int64_t bdims[DEV_MAX_BATCH_AXES], sa[DEV_MAX_BATCH_AXES], sb[DEV_MAX_BATCH_AXES];
  int64_t amat, bmat;
  DevEpilogue epilogue;
} DevGemm;

typedef struct Device Device;
typedef struct DevKernel DevKernel; /* a loaded kernel (opaque) */
typedef struct DevGemmPlan DevGemmPlan; /* a GEMM prepared once (opaque) */

typedef struct {
  const char *name; /* "cuda", "emulate" */
  /* memory: device addresses are opaque pointers; alloc zero-fills */
  void *(*alloc)(Device *d, size_t bytes);
  void (*release)(Device *d, void *p);
  int (*to_device)(Device *d, void *dst, const void *src, size_t bytes);
  int (*to_host)(Device *d, void *dst, const void *src, size_t bytes);
  int (*copy)(Device *d, void *dst, const void *src, size_t bytes);
  int (*zero)(Device *d, void *p, size_t bytes);
  /* a stage's module: a cubin (cuda) or the path of the emulation's shared
   * object (emulate); kernels looked up by name */
  int (*load)(Device *d, const void *image, size_t bytes, const char *path);
  DevKernel *(*kernel)(Device *d, const char *name);
  /* a kernel's launch: grid blocks of block threads, each argument a device
   * pointer after the context (the generated signature) */
  int (*launch)(Device *d, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx, void *const *args, int nargs);
  DevGemmPlan *(*gemm_plan)(Device *d, const DevGemm *g);
  int (*gemm)(Device *d, DevGemmPlan *p, void *const *io);
  int (*sync)(Device *d);
  /* seconds since an arbitrary start, after everything queued has run */
  double (*seconds)(Device *d);
  void (*close)(Device *d);
  /* a kernel whose arguments are not the generated signature (the
   * optimizer's: a table and a struct by value): params as cuLaunchKernel's,
   * a pointer to each argument */
  int (*launch_raw)(Device *d, DevKernel *k, unsigned grid, unsigned block, void **params);
  /* A second stream, whose work runs beside the launches' (NCCL's
   * data-parallel reductions), and an order between two streams: `waiter`
   * runs what it is given next only after everything `waited` holds now
   * (NULL names the launch stream). The emulated device runs everything in
   * order, so its are no-ops. */
  void *(*stream_create)(Device *d);
  int (*stream_wait)(Device *d, void *waiter, void *waited);
  void (*stream_destroy)(Device *d, void *stream);
  /* launch on `stream` (NULL: the launch stream), after what it holds: the
   * work that follows a collective on the comm stream (devcomp.c) */
  int (*launch_on)(Device *d, void *stream, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx, void *const *args,
                   int nargs);
} DevOps;

struct Device {
  const DevOps *ops;
  char err[1024];
  char what[256]; /* one line: the device, for the start-up line */
  int sm;         /* the GPU's compute capability as NVRTC names it (90: sm_90); 0 emulated */
  int ngpus;      /* GPUs the driver sees (after CUDA_VISIBLE_DEVICES); 0 emulated */
  int tf32;       /* HPDL_GEMM_TF32=1: TF32 tensor cores for fp32 work (kernels see DEV_KCTX_TF32) */
};

/* An ordinal that names no GPU but a local rank: that rank's GPU is the
 * rank modulo the GPUs visible, so ranks beyond them share. */
#define DEV_ORDINAL_OF_LOCAL_RANK(local) (-1 - (local))

/* Opens a device: "cuda" (GPU `ordinal`, or DEV_ORDINAL_OF_LOCAL_RANK; the libraries searched as
 * device_cuda.c says) or "emulate". NULL with the reason in err. */
Device *dev_open(const char *kind, int ordinal, char *err, size_t errlen);
const char *dev_error(const Device *d);

/* n values between device memory holding bfloat16 and floats on the host:
 * widened exactly on the way out, rounded to nearest even on the way in
 * (half.h), through a 16-bit copy on the host (the optimizer's bf16
 * moments). 0, or -1 with the device's error, or "out of memory" there. */
int dev_copy_bf16(Device *d, void *dev, float *host, int64_t n, int to_device);

/* Options of the cuda device (environment): HPDL_GEMM_TF32=1 lets cuBLASLt
 * use TF32 tensor cores for fp32 GEMMs (as PyTorch's
 * allow_tf32 / set_float32_matmul_precision("high")), and the attention
 * kernels one TF32 product instead of three (3xTF32, fp32's accuracy); off by
 * default. The emulated device reads it too (its kernels' flag; its GEMMs
 * stay fp32). */

Device *dev_cuda_open(int ordinal, char *err, size_t errlen);
Device *dev_emu_open(char *err, size_t errlen);

/* `hpdlrun --info`: the CUDA driver and its GPUs, NVRTC, cuBLASLt and NCCL,
 * one line each with the version or why it is absent (device_info.c). */
void dev_info(FILE *out);
/* dlopen of the first of names that opens (NULL entries skipped); tried
 * collects the ones that did not. names[0] is the user's variable
 * (HPDL_LIBCUDA, ...): when set, only it is tried, so that a user (or a
 * test) can name a library or make one absent. */
void *dev_dlopen_first(const char *const *names, int n, char *tried, size_t len);

/* libnccl (NULL, the names tried in `tried`): $HPDL_NCCL alone when set, else
 * $CUDA_HOME/lib64, $CUDA_HOME/lib, /usr/local/cuda/lib64, the loader's path. */
void *dev_nccl_open(char *tried, size_t len);
/* Its ncclGetVersion as "2.28.9"; -1 when that fails. */
int dev_nccl_version_text(void *lib, char *buf, size_t len);

/* The reference GEMM of the emulated device (also the host's check). */
void dev_gemm_reference(const DevGemm *g, void *const *io);

#endif
