/* device_emu.c - the device layer without a GPU (device.h): host memory,
 * the generated kernels compiled as C++ through the emulation harness
 * (kernels/cuda_emu.h) into a shared object that `load` opens by path, and
 * the reference GEMM. The shared object has, per launch NAME of the
 * generated source, `int hpd_emul_NAME(const hpdl_kctx *, unsigned grid,
 * unsigned block, void **args)` (the CUDA back end's emulate option). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"

typedef int (*EmuLaunch)(const DevKctx *ctx, unsigned grid, unsigned block, void *const *args);

struct DevKernel {
  EmuLaunch fn;
  char name[200];
  int mod; /* the module it was found in */
  DevKernel *next;
};

struct DevGemmPlan {
  DevGemm g;
  DevGemmPlan *next;
};

enum { MAX_MODULES = 16 };

typedef struct {
  Device base;
  void *so[MAX_MODULES];
  int nso;
  DevKernel *kernels;
  DevGemmPlan *plans;
} EmuDev;

static EmuDev *emu_of(Device *d) { return (EmuDev *)d; }

static int fail(Device *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Device *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->err, sizeof d->err, fmt, ap);
  va_end(ap);
  return -1;
}

static void *emu_alloc(Device *d, size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64 + 64;
  void *p = aligned_alloc(64, n);
  if (!p) {
    fail(d, "out of host memory for %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, n);
  return p;
}

static void emu_release(Device *d, void *p) {
  (void)d;
  free(p);
}

static int emu_copy(Device *d, void *dst, const void *src, size_t n) {
  (void)d;
  memmove(dst, src, n);
  return 0;
}

static int emu_zero(Device *d, void *p, size_t n) {
  (void)d;
  memset(p, 0, n);
  return 0;
}

static int emu_load(Device *dd, const void *image, size_t bytes, const char *path) {
  (void)image;
  (void)bytes;
  EmuDev *d = emu_of(dd);
  if (d->nso == MAX_MODULES) return fail(dd, "more than %d modules loaded", MAX_MODULES);
  if (!path) return fail(dd, "the emulated device loads a shared object by path");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return fail(dd, "loading %s: %s", path, dlerror());
  d->so[d->nso++] = h;
  return 0;
}

/* A name is looked up in the latest module first: the chunks of a
 * pipeline stage (virtual stages) each load a module whose kernels share
 * names, and a chunk resolves its kernels right after loading its own. */
static DevKernel *emu_kernel(Device *dd, const char *name) {
  EmuDev *d = emu_of(dd);
  char sym[256];
  snprintf(sym, sizeof sym, "hpd_emul_%s", name);
  for (int i = d->nso - 1; i >= 0; i--) {
    for (DevKernel *k = d->kernels; k; k = k->next)
      if (k->mod == i && !strcmp(k->name, name)) return k;
    void *f = dlsym(d->so[i], sym);
    if (!f) continue;
    DevKernel *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->fn = (EmuLaunch)(uintptr_t)f;
    k->mod = i;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->next = d->kernels;
    d->kernels = k;
    return k;
  }
  fail(dd, "kernel %s is in no loaded module (no %s)", name, sym);
  return NULL;
}

static int emu_launch(Device *d, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx, void *const *args,
                      int nargs) {
  (void)nargs;
  if (k->fn(ctx, grid, block, args)) return fail(d, "the emulated launch of %s failed (see above)", k->name);
  return 0;
}

/* one order: the stream is moot */
static int emu_launch_on(Device *d, void *stream, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx,
                         void *const *args, int nargs) {
  (void)stream;
  return emu_launch(d, k, grid, block, ctx, args, nargs);
}

static int emu_launch_raw(Device *d, DevKernel *k, unsigned grid, unsigned block, void **params) {
  if (k->fn(NULL, grid, block, params)) return fail(d, "the emulated launch of %s failed (see above)", k->name);
  return 0;
}

static DevGemmPlan *emu_gemm_plan(Device *dd, const DevGemm *g) {
  EmuDev *d = emu_of(dd);
  DevGemmPlan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->g = *g;
  p->next = d->plans;
  d->plans = p;
  return p;
}

static int emu_gemm(Device *d, DevGemmPlan *p, void *const *io) {
  (void)d;
  dev_gemm_reference(&p->g, io);
  return 0;
}

static int emu_sync(Device *d) {
  (void)d;
  return 0;
}

static double emu_seconds(Device *d) {
  (void)d;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void emu_close(Device *dd) {
  EmuDev *d = emu_of(dd);
  while (d->kernels) {
    DevKernel *n = d->kernels->next;
    free(d->kernels);
    d->kernels = n;
  }
  while (d->plans) {
    DevGemmPlan *n = d->plans->next;
    free(d->plans);
    d->plans = n;
  }
  for (int i = 0; i < d->nso; i++) dlclose(d->so[i]);
  free(d);
}

/* One order for everything: a stream is a name, a wait is already kept. */
static void *emu_stream_create(Device *d) {
  static char stream;
  (void)d;
  return &stream;
}

static int emu_stream_wait(Device *d, void *waiter, void *waited) {
  (void)d, (void)waiter, (void)waited;
  return 0;
}

static void emu_stream_destroy(Device *d, void *s) { (void)d, (void)s; }

static const DevOps emu_ops = {"emulate", emu_alloc,  emu_release,   emu_copy, emu_copy, emu_copy,    emu_zero,
                               emu_load,  emu_kernel, emu_launch,    emu_gemm_plan, emu_gemm, emu_sync, emu_seconds,
                               emu_close, emu_launch_raw, emu_stream_create, emu_stream_wait, emu_stream_destroy,
                               emu_launch_on};

Device *dev_emu_open(char *err, size_t errlen) {
  EmuDev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  d->base.ops = &emu_ops;
  const char *tf = getenv("HPDL_GEMM_TF32"); /* the kernels' flag (device.h); the GEMMs stay fp32 */
  d->base.tf32 = tf && !strcmp(tf, "1");
  snprintf(d->base.what, sizeof d->base.what, "emulated device (host memory, kernels/cuda_emu.h, reference GEMMs%s)",
           d->base.tf32 ? ", TF32 attention" : "");
  return &d->base;
}
