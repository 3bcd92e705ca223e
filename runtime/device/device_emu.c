/* device_emu.c - the device layer without a GPU (device.h): host memory,
 * the generated kernels compiled as C++ through the emulation harness
 * (kernels/cuda_emu.h) into a shared object that `load` opens by path, and
 * the reference GEMM. The shared object has, per launch NAME of the
 * generated source, `int hpd_emul_NAME(const hpdl_kctx *, unsigned grid,
 * unsigned block, void **args)` (the CUDA back end's emulate option).
 * Its streams run in order or held late, as HPDL_EMU_STREAMS says
 * (emustream.h): a launch, GEMM, copy or fill given to a stream that holds
 * its work is packed (arguments copied) and runs when the stream drains. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "emustream.h"

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

/* What the launch stream holds, run now; held work's failure is said by the
 * op that drained it (in d->err). */
static int drain_launches(Device *d) { return emus_drain(NULL, d->err, sizeof d->err); }

/* a copy or a fill held on the launch stream */
typedef struct {
  void *dst;
  const void *src; /* NULL: a fill with zeros */
  size_t n;
} HeldCopy;

static int run_copy(void *arg, char *msg, size_t len) {
  (void)msg, (void)len;
  HeldCopy *h = arg;
  if (h->src) memmove(h->dst, h->src, h->n);
  else memset(h->dst, 0, h->n);
  return 0;
}

static int hold_copy(Device *d, void *dst, const void *src, size_t n) {
  HeldCopy *h = malloc(sizeof *h);
  if (!h) return fail(d, "out of host memory holding a copy");
  *h = (HeldCopy){dst, src, n};
  if (emus_hold(NULL, run_copy, h)) return free(h), fail(d, "out of host memory holding a copy");
  return 0;
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
  /* held work may use p; cuMemFree waits for the device too */
  if (emus_drain_all(d->err, sizeof d->err)) fprintf(stderr, "emulated device: %s\n", d->err);
  free(p);
}

/* to and from the host: after the launch stream's work (cuMemcpyHtoD / DtoH) */
static int emu_host_copy(Device *d, void *dst, const void *src, size_t n) {
  if (drain_launches(d)) return -1;
  memmove(dst, src, n);
  return 0;
}

static int emu_copy(Device *d, void *dst, const void *src, size_t n) {
  if (emus_holds(NULL)) return hold_copy(d, dst, src, n);
  memmove(dst, src, n);
  return 0;
}

static int emu_zero(Device *d, void *p, size_t n) {
  if (emus_holds(NULL)) return hold_copy(d, p, NULL, n);
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

/* a launch held on a stream: the context and the argument pointers copied */
typedef struct {
  DevKernel *k;
  unsigned grid, block;
  DevKctx ctx;
  int has_ctx;
  void *args[];
} HeldLaunch;

static int run_launch(void *arg, char *msg, size_t len) {
  HeldLaunch *h = arg;
  if (h->k->fn(h->has_ctx ? &h->ctx : NULL, h->grid, h->block, h->args))
    return snprintf(msg, len, "the emulated launch of %s failed", h->k->name), -1;
  return 0;
}

static int emu_launch_on(Device *d, void *stream, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx,
                         void *const *args, int nargs) {
  if (!emus_holds(stream)) {
    if (k->fn(ctx, grid, block, args)) return fail(d, "the emulated launch of %s failed (see above)", k->name);
    return 0;
  }
  HeldLaunch *h = calloc(1, sizeof *h + sizeof(void *) * (size_t)(nargs > 0 ? nargs : 1));
  if (!h) return fail(d, "out of host memory holding a launch of %s", k->name);
  h->k = k, h->grid = grid, h->block = block;
  if (ctx) h->ctx = *ctx, h->has_ctx = 1;
  for (int i = 0; i < nargs; i++) h->args[i] = args[i];
  if (emus_hold(stream, run_launch, h)) return free(h), fail(d, "out of host memory holding a launch of %s", k->name);
  return 0;
}

static int emu_launch(Device *d, DevKernel *k, unsigned grid, unsigned block, const DevKctx *ctx, void *const *args,
                      int nargs) {
  return emu_launch_on(d, NULL, k, grid, block, ctx, args, nargs);
}

/* the arguments are pointers to values of sizes the table does not say:
 * not held, but run after what the launch stream holds (its order kept) */
static int emu_launch_raw(Device *d, DevKernel *k, unsigned grid, unsigned block, void **params) {
  if (drain_launches(d)) return -1;
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

/* a GEMM held on the launch stream: the io pointers it reads copied */
typedef struct {
  const DevGemm *g;
  void *io[];
} HeldGemm;

static int run_gemm(void *arg, char *msg, size_t len) {
  (void)msg, (void)len;
  HeldGemm *h = arg;
  dev_gemm_reference(h->g, h->io);
  return 0;
}

static int emu_gemm(Device *d, DevGemmPlan *p, void *const *io) {
  if (!emus_holds(NULL)) {
    dev_gemm_reference(&p->g, io);
    return 0;
  }
  const DevGemm *g = &p->g;
  const int idx[] = {g->a, g->b, g->c, g->bias, g->aux}; /* the io slots it reads and writes (-1: none) */
  enum { NIDX = sizeof idx / sizeof idx[0] };
  int top = 0;
  for (int i = 0; i < NIDX; i++)
    if (idx[i] > top) top = idx[i];
  HeldGemm *h = calloc(1, sizeof *h + sizeof(void *) * (size_t)(top + 1));
  if (!h) return fail(d, "out of host memory holding a GEMM");
  h->g = g; /* the plan lives until close, which drains first */
  for (int i = 0; i < NIDX; i++)
    if (idx[i] >= 0) h->io[idx[i]] = io[idx[i]];
  if (emus_hold(NULL, run_gemm, h)) return free(h), fail(d, "out of host memory holding a GEMM");
  return 0;
}

static int emu_sync(Device *d) { return emus_drain_all(d->err, sizeof d->err); }

static double emu_seconds(Device *d) {
  if (emus_drain_all(d->err, sizeof d->err)) fprintf(stderr, "emulated device: %s\n", d->err);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void emu_close(Device *dd) {
  EmuDev *d = emu_of(dd);
  if (emus_drain_all(dd->err, sizeof dd->err)) fprintf(stderr, "emulated device: %s\n", dd->err);
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

/* In order a stream is a name and a wait is already kept; a stream that
 * holds its work runs it when another waits for it (emustream.h). */
static void *emu_stream_create(Device *d) {
  void *s = emus_create();
  if (!s) fail(d, "out of host memory for a stream");
  return s;
}

static int emu_stream_wait(Device *d, void *waiter, void *waited) {
  (void)waiter; /* what the waiter is given later runs later still */
  return emus_drain(waited, d->err, sizeof d->err);
}

static void emu_stream_destroy(Device *d, void *s) {
  if (s && emus_destroy(s, d->err, sizeof d->err)) fprintf(stderr, "emulated device: %s\n", d->err);
}

static const DevOps emu_ops = {"emulate", emu_alloc,  emu_release,   emu_host_copy, emu_host_copy, emu_copy,    emu_zero,
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
  EmusMode mode;
  const char *st = getenv("HPDL_EMU_STREAMS");
  if (emus_mode_of(st, &mode)) {
    snprintf(err, errlen, "HPDL_EMU_STREAMS=%s: the emulated device's streams run 'order' (the default), 'side-late' or 'launch-late'", st);
    free(d);
    return NULL;
  }
  emus_set_mode(mode);
  snprintf(d->base.what, sizeof d->base.what, "emulated device (host memory, kernels/cuda_emu.h, reference GEMMs%s%s%s)",
           d->base.tf32 ? ", TF32 attention" : "", mode != EMUS_ORDER ? ", streams " : "", mode != EMUS_ORDER ? emus_mode_name(mode) : "");
  return &d->base;
}
