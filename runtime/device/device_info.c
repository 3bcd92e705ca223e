/* device_info.c - what `hpdlrun --info` says of the GPU side (device.h):
 * the CUDA driver and its GPUs, NVRTC, cuBLASLt and NCCL, each opened with
 * dlopen as the runtime opens them, with its version or why it is absent.
 * Only the few functions that report versions are looked up, so this runs
 * on any machine. The libraries stay loaded (the process ends right after):
 * what their initialisers allocate stays theirs, not a leak to report. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

void *dev_dlopen_first(const char *const *names, int n, char *tried, size_t len) {
  if (n > 0 && names[0] && *names[0]) n = 1; /* the user's variable: that library or none */
  for (int i = 0; i < n; i++) {
    if (!names[i] || !*names[i]) continue;
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    size_t at = strlen(tried);
    snprintf(tried + at, len - at, "%s%s", at ? ", " : "", names[i]);
  }
  return NULL;
}

/* $CUDA_HOME/<sub>/<lib> into buf, or NULL without CUDA_HOME. */
static const char *in_home(char *buf, size_t n, const char *sub, const char *lib) {
  const char *home = getenv("CUDA_HOME");
  if (!home || !*home) return NULL;
  snprintf(buf, n, "%s/%s/%s", home, sub, lib);
  return buf;
}

/* The library of `label` from names, or NULL after the line saying it is
 * absent and why it matters (hint). */
static void *open_or_say(FILE *out, const char *label, const char *const *names, int n, const char *hint) {
  char tried[2048] = "";
  void *h = dev_dlopen_first(names, n, tried, sizeof tried);
  if (!h) fprintf(out, "  %-12s absent: could not open %s (%s)\n", label, tried, hint);
  return h;
}

typedef int (*IntFn)(int *);
typedef int (*IntIntFn)(int *, int *);

static void driver_info(FILE *out) {
  const char *names[] = {getenv("HPDL_LIBCUDA"), "libcuda.so.1"};
  void *h = open_or_say(out, "CUDA driver", names, 2, "a GPU machine has it from the NVIDIA driver");
  if (!h) return;
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  IntFn version = (IntFn)dlsym(h, "cuDriverGetVersion"), count = (IntFn)dlsym(h, "cuDeviceGetCount");
  int (*get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
  int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(h, "cuDeviceGetName");
  int (*attr)(int *, int, int) = (int (*)(int *, int, int))dlsym(h, "cuDeviceGetAttribute");
  int (*mem)(size_t *, int) = (int (*)(size_t *, int))dlsym(h, "cuDeviceTotalMem_v2");
  int v = 0, n = 0, r = -1;
  if (init && version && count && get && name && attr) {
    version(&v);
    r = init(0);
    if (!r) r = count(&n);
  }
  if (r) {
    fprintf(out, "  CUDA driver  %d.%d, but it sees no GPU (cuInit: error %d)\n", v / 1000, v % 1000 / 10, r);
  } else {
    fprintf(out, "  CUDA driver  %d.%d, %d GPU%s%s%s\n", v / 1000, v % 1000 / 10, n, n == 1 ? "" : "s",
            getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES=" : "",
            getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "");
    if (getenv("CUDA_VISIBLE_DEVICES")) fputs(")", out);
    for (int i = 0; i < n; i++) {
      int dev = 0, major = 0, minor = 0, sms = 0;
      char gpu[128] = "?";
      size_t bytes = 0;
      get(&dev, i);
      name(gpu, sizeof gpu, dev);
      attr(&major, 75, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
      attr(&minor, 76, dev);
      attr(&sms, 16, dev); /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
      if (mem) mem(&bytes, dev);
      fprintf(out, "    GPU %d      %s, sm_%d%d, %d SMs, %.1f GiB\n", i, gpu, major, minor, sms, (double)bytes / (1 << 30));
    }
  }
}

static void nvrtc_info(FILE *out) {
  char home[1024];
  const char *names[] = {getenv("HPDL_NVRTC"), in_home(home, sizeof home, "lib64", "libnvrtc.so"),
                         "/usr/local/cuda/lib64/libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  void *h = open_or_say(out, "NVRTC", names, 6, "hpdlc compile --target cuda needs it; set HPDL_NVRTC");
  if (!h) return;
  IntIntFn version = (IntIntFn)dlsym(h, "nvrtcVersion");
  int major = 0, minor = 0;
  if (version && !version(&major, &minor)) fprintf(out, "  NVRTC        %d.%d\n", major, minor);
  else fprintf(out, "  NVRTC        present, but nvrtcVersion failed\n");
}

static void cublaslt_info(FILE *out) {
  char home[1024];
  const char *names[] = {getenv("HPDL_CUBLASLT"), in_home(home, sizeof home, "lib64", "libcublasLt.so"),
                         "/usr/local/cuda/lib64/libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  void *h = open_or_say(out, "cuBLASLt", names, 6, "the GEMMs on a GPU need it; set HPDL_CUBLASLT");
  if (!h) return;
  size_t (*version)(void) = (size_t (*)(void))dlsym(h, "cublasLtGetVersion");
  if (version) {
    size_t v = version();
    fprintf(out, "  cuBLASLt     %zu.%zu.%zu\n", v / 10000, v / 100 % 100, v % 100);
  } else
    fprintf(out, "  cuBLASLt     present, without cublasLtGetVersion\n");
}

void *dev_nccl_open(char *tried, size_t len) {
  char home1[1024], home2[1024];
  const char *names[] = {getenv("HPDL_NCCL"), in_home(home1, sizeof home1, "lib64", "libnccl.so.2"),
                         in_home(home2, sizeof home2, "lib", "libnccl.so.2"), "/usr/local/cuda/lib64/libnccl.so.2",
                         "libnccl.so.2"};
  return dev_dlopen_first(names, 5, tried, len);
}

int dev_nccl_version_text(void *lib, char *buf, size_t len) {
  IntFn version = (IntFn)dlsym(lib, "ncclGetVersion");
  int v = 0;
  if (!version || version(&v)) return -1;
  /* NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before */
  int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
  snprintf(buf, len, "%d.%d.%d", major, minor, v % 100);
  return 0;
}

static void nccl_info(FILE *out) {
  char tried[2048] = "", v[64];
  void *h = dev_nccl_open(tried, sizeof tried);
  if (!h) {
    fprintf(out, "  %-12s absent: could not open %s (collectives go through MPI in host memory; set HPDL_NCCL)\n", "NCCL", tried);
    return;
  }
  if (!dev_nccl_version_text(h, v, sizeof v))
    fprintf(out, "  NCCL         %s (the collectives of GPUs with one rank each; HPDL_COLLECTIVES=host keeps them in host memory)\n", v);
  else
    fprintf(out, "  NCCL         present, but ncclGetVersion failed\n");
}

void dev_info(FILE *out) {
  driver_info(out);
  nvrtc_info(out);
  cublaslt_info(out);
  nccl_info(out);
}
