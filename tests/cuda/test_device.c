/* test_device.c - the CUDA back end's kernels and the device layer's host
 * program (runtime/device/devexec.c) on a device: the GPU (--device cuda) or the
 * emulated device (--device emulate), against the reference executor.
 *
 *   --kernels  every fused kernel of the forward, the block, the step, B.fwd
 *              and B.grad alone on the values interp computed for its inputs
 *              (test_kernels.h, 1e-5), its io copied to the device and back
 *   --step     the whole training step through devexec (CALLs, saved
 *              layers, gradient accumulation): loss and every gradient
 *   --bench N  N timed steps after 2 warm-up ones (no reference): ms a
 *              step, tokens/s, achieved FLOP/s, the pool's peak memory;
 *              with HPDL_PROFILE=N, 3 more steps with every launch timed
 *              alone and the N longest launches listed; --attention
 *              materialized times the stored-scores chain instead of the
 *              flash attention op (hpdlc's option of the same name)
 *
 * The GPU path compiles the generated source with NVRTC for the GPU's own
 * architecture and loads the cubin; the emulated path compiles it as C++
 * with kernels/cuda_emu.h into a shared object. Both run through the same
 * devexec and the same device table, so the emulated runs in CI check the
 * host program the GPU runs.
 *
 * Usage: test_device [--device cuda|emulate] (--kernels | --step | --bench N)
 *        [--micro B] [--attention flash|materialized] SAMPLE [-D NAME=VALUE | -L parallel.KEY=VALUE]...
 * Exits 77 (CTest's skip) when the device cannot be opened (no GPU, no
 * driver, no cuBLASLt, no NVRTC; the reason is printed) or, emulated, when
 * no C++ compiler works. HPDL_SOURCE_DIR and HPDL_STDLIB point it at a
 * source tree other than the one it was built from. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *source_dir(void) {
  const char *e = getenv("HPDL_SOURCE_DIR");
  return e && *e ? e : HPDL_BUILT_SOURCE_DIR;
}
#define HPDL_SOURCE_DIR source_dir()

#include "codegen.h"
#include "codegen_cuda.h"
#include "cudacc.h"
#include "devexec.h"
#include "test_kernels.h"

typedef struct {
  const char *kind; /* "cuda" or "emulate" */
  Device *dev;
  DevxProgram prog;
  DevExec *x;
  char dir[64];
  const FuseResult *fr;
} Ctx;

static const char *cxx(void) {
  const char *c = getenv("HPDL_CXX");
  return c && *c ? c : "c++";
}

static int write_text(const char *path, const char *s) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(s, f);
  return fclose(f);
}

static void to_dev_gemm(const CgCudaLaunch *l, DevGemm *g) {
  memset(g, 0, sizeof *g);
  g->a = l->gemm_a;
  g->b = l->gemm_b;
  g->c = l->gemm_c;
  g->bias = l->bias;
  g->aux = l->aux;
  g->trans_a = l->trans_a;
  g->trans_b = l->trans_b;
  g->m = l->m;
  g->n = l->n;
  g->k = l->k;
  g->lda = l->lda;
  g->ldb = l->ldb;
  g->ldc = l->ldc;
  g->alpha = l->alpha;
  g->batch = l->batch;
  g->stride_a = l->stride_a;
  g->stride_b = l->stride_b;
  g->stride_c = l->stride_c;
  g->batch_axes = l->batch_axes;
  for (int i = 0; i < l->batch_axes && i < DEV_MAX_BATCH_AXES; i++) {
    g->bdims[i] = l->bdims[i];
    g->sa[i] = l->sa[i];
    g->sb[i] = l->sb[i];
  }
  g->amat = l->amat;
  g->bmat = l->bmat;
  g->epilogue = (DevEpilogue)dev_epilogue_of(l->epilogue);
}

static int *dup_ints(const int *v, int n) {
  int *o = xmalloc(sizeof(int) * (size_t)(n + 1));
  if (n) memcpy(o, v, sizeof(int) * (size_t)n);
  return o;
}

/* The host program's view of the fused module and the back end's launches. */
static void build_program(const IrModule *m, const FuseResult *fr, const CgCudaLaunch *ls, int nl, DevxProgram *p) {
  p->m = m;
  p->ngraphs = fr->ngraphs;
  p->graphs = xmalloc(sizeof(DevxGraph) * (size_t)fr->ngraphs);
  for (int gi = 0; gi < fr->ngraphs; gi++) {
    const FuseGraph *fg = &fr->graphs[gi];
    DevxGraph *G = &p->graphs[gi];
    G->nkernels = fg->nkernels;
    G->cut = -1;
    G->kernels = xmalloc(sizeof(DevxKernel) * (size_t)(fg->nkernels + 1));
    for (int kp = 0; kp < fg->nkernels; kp++) {
      const FuseKernel *K = &fg->kernels[kp];
      DevxKernel *D = &G->kernels[kp];
      D->kind = K->kind == FUSE_VIEW ? DEVX_VIEW : K->kind == FUSE_LEAF ? DEVX_LEAF : K->kind == FUSE_CALL ? DEVX_CALL
              : K->kind == FUSE_COMM ? DEVX_COMM : DEVX_RUN;
      D->inputs = dup_ints(K->inputs, K->ninputs);
      D->ninputs = K->ninputs;
      D->outputs = dup_ints(K->outputs, K->noutputs);
      D->noutputs = K->noutputs;
      D->nodes = dup_ints(K->nodes, K->nnodes);
      D->nnodes = K->nnodes;
      D->aux_node = cg_cuda_aux_node(fg, kp); /* as kernels.json says it */
      D->launches = xmalloc(sizeof(DevxLaunch) * (size_t)(nl + 1));
      for (int i = 0; i < nl; i++) {
        if (ls[i].graph != gi || ls[i].kernel != kp) continue;
        DevxLaunch *L = &D->launches[D->nlaunches++];
        L->name = strdup(ls[i].name);
        L->grid = (unsigned)ls[i].grid;
        L->block = (unsigned)ls[i].block;
        snprintf(L->kind, sizeof L->kind, "%s", ls[i].kind);
        L->flops = ls[i].flops;
        L->bytes = ls[i].bytes;
        if (!strcmp(ls[i].kind, "host")) {
          L->is_host = 1;
          L->host_extern = ls[i].host_extern;
          L->host_grad = ls[i].host_grad;
          L->nhost_io = ls[i].nhost_io;
          memcpy(L->host_io, ls[i].host_io, sizeof L->host_io);
        }
        L->is_gemm = !strcmp(ls[i].kind, "gemm");
        if (L->is_gemm) to_dev_gemm(&ls[i], &L->gemm);
      }
    }
  }
}

/* Generates the module's CUDA C, builds it for the device, loads it, and
 * makes the host program. */
static int build(void *env, const IrModule *m, const FuseResult *fr) {
  Ctx *C = env;
  int emulate = !strcmp(C->kind, "emulate");
  const CgBackend *be = cg_backend("cuda");
  CgOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.emulate = emulate;
  char err[1024] = "";
  CgTarget *t = be->create(m, fr, &opt, err, sizeof err);
  if (!t || be->generate(t)) {
    fprintf(stderr, "generate: %s\n", t ? be->error(t) : err);
    if (t) be->destroy(t);
    return -1;
  }
  char *src = be->dump(t);
  int nl = 0;
  const CgCudaLaunch *ls = cg_cuda_launches(t, &nl);
  build_program(m, fr, ls, nl, &C->prog);
  be->destroy(t);
  char kdir[4096];
  snprintf(kdir, sizeof kdir, "%s/kernels", source_dir());
  int rc = 0;
  if (emulate) {
    snprintf(C->dir, sizeof C->dir, "/tmp/hpdl-dev-XXXXXX");
    if (!mkdtemp(C->dir)) return -1;
    char path[256], so[256], cmd[16384];
    snprintf(path, sizeof path, "%s/k.cu", C->dir);
    snprintf(so, sizeof so, "%s/k.so", C->dir);
    if (write_text(path, src)) return -1;
    snprintf(cmd, sizeof cmd, "%s -std=c++17 -O1 -fPIC -shared -fno-strict-aliasing -w -include %s/cuda_emu.h -I%s -x c++ %s -o %s",
             cxx(), kdir, kdir, path, so);
    if (system(cmd)) {
      fprintf(stderr, "the generated source does not compile as C++: %s\n", cmd);
      rc = -1;
    } else if (C->dev->ops->load(C->dev, NULL, 0, so)) {
      fprintf(stderr, "%s\n", dev_error(C->dev));
      rc = -1;
    }
  } else {
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d", C->dev->sm);
    const char *incs[1] = {kdir};
    CudaccRequest rq = {src, "hpdl.cu", arch, NULL, 0, incs, 1, 1};
    CudaccResult r;
    if (cudacc_compile(&rq, &r, err, sizeof err)) {
      fprintf(stderr, "NVRTC: %s\n%s\n", err, r.log ? r.log : "");
      rc = -1;
    } else {
      printf("NVRTC %d.%d compiled %zu kernels for %s in %.2f s%s\n", r.nvrtc_major, r.nvrtc_minor, r.n_kernels, arch,
             r.seconds, r.cache_hit ? " (cached)" : "");
      if (C->dev->ops->load(C->dev, r.cubin, r.cubin_size, "the module's cubin")) {
        fprintf(stderr, "%s\n", dev_error(C->dev));
        rc = -1;
      }
    }
    cudacc_result_free(&r);
  }
  free(src);
  if (rc) return -1;
  C->fr = fr;
  C->x = devx_new(C->dev, &C->prog, 1337, NULL, err, sizeof err);
  if (!C->x) {
    fprintf(stderr, "devexec: %s\n", err);
    return -1;
  }
  return 0;
}

static size_t value_bytes(const IrNode *n) { return (size_t)(ir_numel(n) * sem_dtype_bytes(n->dtype)); }

/* One kernel through devexec: its io to the device, its launches, its outputs back. */
static int call(void *env, const FuseGraph *fg, int p, void **io, const char **err) {
  Ctx *C = env;
  const FuseKernel *K = &fg->kernels[p];
  int gi = (int)(fg - C->fr->graphs);
  const DevxKernel *D = &C->prog.graphs[gi].kernels[p];
  if (K->kind == FUSE_COMM) return 0;
  if (!D->nlaunches) {
    if (K->kind == FUSE_LEAF) return 0;
    *err = "the CUDA back end generated no launch for it";
    return -1;
  }
  int nio = K->ninputs + K->noutputs, rc = 1;
  void **dio = xmalloc(sizeof(void *) * (size_t)(nio + 1));
  size_t *bytes = xmalloc(sizeof(size_t) * (size_t)(nio + 1));
  Device *d = C->dev;
  for (int i = 0; i < nio && rc > 0; i++) {
    int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
    bytes[i] = value_bytes(&fg->graph->nodes[v]);
    dio[i] = d->ops->alloc(d, bytes[i] + 16);
    if (!dio[i] || (i < K->ninputs && d->ops->to_device(d, dio[i], io[i], bytes[i]))) rc = -1;
  }
  if (rc > 0 && devx_run_kernel(C->x, gi, p, 0, dio)) rc = -1;
  for (int i = K->ninputs; i < nio && rc > 0; i++)
    if (d->ops->to_host(d, io[i], dio[i], bytes[i])) rc = -1;
  if (rc > 0 && d->ops->sync(d)) rc = -1;
  if (rc < 0) {
    static char msg[1300];
    snprintf(msg, sizeof msg, "%s", devx_error(C->x)[0] ? devx_error(C->x) : dev_error(d));
    *err = msg;
  }
  for (int i = 0; i < nio; i++) d->ops->release(d, dio[i]);
  free(dio);
  free(bytes);
  return rc;
}

static void ctx_free(Ctx *C) {
  devx_free(C->x);
  C->x = NULL;
  devx_program_free(&C->prog);
  if (C->dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", C->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", C->dir);
    C->dir[0] = '\0';
  }
}

/* The step through devexec against ad_step's loss and gradients. */
static void test_step(Ctx *C, const char *sample, SemDefine *defs, int ndefs, SemDefine *layout, int nlayout) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  IrModule *m = NULL;
  AdResult *ad = sample_step(arena, diag, sample, defs, ndefs, layout, nlayout, &m);
  const char *why = NULL;
  FuseResult *fr = ad ? fuse_module_opts(arena, m, &FUSE_CUDA_OPTIONS) : NULL;
  if (!fr || build(C, m, fr)) {
    test_failures++;
    diag_free(diag);
    arena_free(arena);
    return;
  }
  Interp *in = interp_new(m);
  interp_init_params(in, 1337);
  round_params(in, m);
  double **inputs = make_inputs(m, sample_vocab(m));
  for (int i = 0; i < m->ninputs; i++) interp_set_input(in, i, inputs[i]);
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    int64_t n = 1, copies = P->count > 1 ? P->count : 1;
    for (int i = 0; i < P->rank; i++) n *= P->dims[i];
    float *h = xmalloc(sizeof(float) * (size_t)(n * copies));
    for (int64_t l = 0; l < copies; l++) {
      const double *v = interp_param(in, p, l, NULL);
      for (int64_t k = 0; k < n; k++) h[l * n + k] = (float)v[k];
    }
    EXPECT(devx_set_param(C->x, p, h) == 0);
    free(h);
  }
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < x->rank; k++) n *= x->dims[k];
    void *b = to_buffer(x->dtype, inputs[i], n);
    EXPECT(devx_set_input(C->x, i, b, (size_t)n * (size_t)sem_dtype_bytes(x->dtype)) == 0);
    free(b);
  }
  float loss = NAN;
  int rc = devx_zero_grads(C->x) || devx_step(C->x, ad->step, 1.0f, &loss);
  if (rc) fprintf(stderr, "step: %s\n", devx_error(C->x));
  EXPECT(rc == 0);
  interp_zero_grads(in);
  double want = ad_step(in, ad, 1.0, &why);
  if (!rc) {
    printf("step of %s on the %s device (recompute %s): loss %.9g, reference %.9g\n", sample, C->kind,
           sem_recompute_name(ad->recompute), loss, want);
    EXPECT_NEAR(loss, want, HPDL_KERNEL_TOL);
    double rms = 0;
    int64_t cnt = 0;
    for (int p = 0; p < m->nparams; p++)
      for (int64_t l = 0; l < (m->params[p].count > 1 ? m->params[p].count : 1); l++) {
        int64_t n;
        const double *w = interp_grad(in, p, l, &n);
        for (int64_t k = 0; w && k < n; k++) rms += w[k] * w[k];
        cnt += w ? n : 0;
      }
    rms = cnt ? sqrt(rms / (double)cnt) : 0;
    int checked = 0, bad = 0;
    for (int p = 0; p < m->nparams; p++) {
      const IrParam *P = &m->params[p];
      int64_t n0 = 1, copies = P->count > 1 ? P->count : 1;
      for (int i = 0; i < P->rank; i++) n0 *= P->dims[i];
      float *gh = xmalloc(sizeof(float) * (size_t)(n0 * copies));
      EXPECT(devx_get_grad(C->x, p, gh) == 0);
      for (int64_t l = 0; l < copies; l++) {
        int64_t n;
        const double *w = interp_grad(in, p, l, &n);
        if (!w) continue;
        char what[200];
        snprintf(what, sizeof what, "%s gradient of %s (layer %" PRId64 ")", sample, P->name, l);
        bad += !check_tensor(what, DT_F32, gh + l * n, w, n, rms);
        checked++;
      }
      free(gh);
    }
    printf("step of %s: %d parameter gradients within %g of the reference, %d off\n", sample, checked, HPDL_KERNEL_TOL, bad);
    EXPECT(checked > 10);
  }
  for (int i = 0; i < m->ninputs; i++) free(inputs[i]);
  free(inputs);
  interp_free(in);
  ctx_free(C);
  diag_free(diag);
  arena_free(arena);
}

static uint64_t bench_rng = 0x9e3779b97f4a7c15ull;
static double bench_uniform(void) {
  bench_rng ^= bench_rng << 13;
  bench_rng ^= bench_rng >> 7;
  bench_rng ^= bench_rng << 17;
  return (double)(bench_rng >> 11) / 9007199254740992.0;
}

/* N timed steps (forward, loss, backward, gradients; no optimizer). */
static int bench_materialized; /* --attention materialized */

/* A device-to-device copy of 512 MiB, 5 times after one: bytes read and written a
 * second, the profile's reference for memory-bound kernels (0 if it failed). */
static double copy_bandwidth(Device *d) {
  const size_t n = (size_t)512 << 20;
  void *a = d->ops->alloc(d, n), *b = a ? d->ops->alloc(d, n) : NULL;
  double bps = 0;
  if (b && !d->ops->copy(d, b, a, n) && !d->ops->sync(d)) {
    double t0 = d->ops->seconds(d);
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++) rc = d->ops->copy(d, b, a, n);
    double t1 = d->ops->seconds(d);
    if (!rc && t1 > t0) bps = 2.0 * 5.0 * (double)n / (t1 - t0);
  }
  if (b) d->ops->release(d, b);
  if (a) d->ops->release(d, a);
  return bps;
}

static void bench(Ctx *C, int steps, int64_t micro, const char *sample, SemDefine *defs, int ndefs, SemDefine *layout,
                  int nlayout) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  LowerOptions lo = {0, 0, 0};
  lo.materialize_attention = bench_materialized;
  IrModule *m = lower_sample_with(arena, diag, sample, defs, ndefs, layout, nlayout, micro, NULL, &lo);
  const char *why = NULL;
  AdResult *ad = m ? ad_build(m, RECOMPUTE_NONE, &why) : NULL;
  FuseResult *fr = ad ? fuse_module_opts(arena, m, &FUSE_CUDA_OPTIONS) : NULL;
  if (!fr || build(C, m, fr)) {
    fprintf(stderr, "bench: could not build %s%s%s\n", sample, why ? ": " : "", why ? why : "");
    test_failures++;
    diag_free(diag);
    arena_free(arena);
    return;
  }
  int64_t nparams = 0, vocab = sample_vocab(m);
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    int64_t n = 1, copies = P->count > 1 ? P->count : 1;
    for (int i = 0; i < P->rank; i++) n *= P->dims[i];
    nparams += n * copies;
    float *h = xmalloc(sizeof(float) * (size_t)(n * copies));
    int ones = strstr(P->name, "ln") && strstr(P->name, "weight"); /* norms' gains */
    for (int64_t k = 0; k < n * copies; k++) h[k] = ones ? 1.0f : (float)(0.04 * (bench_uniform() - 0.5));
    devx_set_param(C->x, p, h);
    free(h);
  }
  int64_t tokens = 0;
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < x->rank; k++) n *= x->dims[k];
    if (i == 0) tokens = n;
    int32_t *b = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t k = 0; k < n; k++) b[k] = (int32_t)(bench_uniform() * (double)vocab);
    devx_set_input(C->x, i, b, sizeof(int32_t) * (size_t)n);
    free(b);
  }
  double flops = fr->graphs[ad->step].flops;
  float loss = NAN;
  int rc = 0;
  for (int s = 0; s < 2 && !rc; s++) rc = devx_zero_grads(C->x) || devx_step(C->x, ad->step, 1.0f, &loss);
  double t0 = C->dev->ops->seconds(C->dev), best = 1e30;
  for (int s = 0; s < steps && !rc; s++) {
    double a = C->dev->ops->seconds(C->dev);
    rc = devx_zero_grads(C->x) || devx_step(C->x, ad->step, 1.0f, NULL);
    double b = C->dev->ops->seconds(C->dev);
    if (b - a < best) best = b - a;
  }
  double t1 = C->dev->ops->seconds(C->dev);
  if (rc) {
    fprintf(stderr, "bench: %s\n", devx_error(C->x));
    test_failures++;
  } else {
    size_t now, peak;
    devx_memory(C->x, &now, &peak);
    double mean = (t1 - t0) / steps;
    printf("bench %s on %s: %" PRId64 " parameters, %" PRId64 " tokens a step, loss %.4f\n", sample, C->dev->what, nparams,
           tokens, loss);
    printf("bench: forward+backward %.2f ms a step (mean of %d, best %.2f), %.0f tokens/s, %.1f TFLOP/s, pool peak %.2f GiB\n",
           1e3 * mean, steps, 1e3 * best, (double)tokens / mean, flops / mean * 1e-12, (double)peak / (1 << 30));
    EXPECT(isfinite(loss));
    if (getenv("HPDL_PROFILE")) { /* the steps again, each launch timed alone */
      devx_profile(C->x, 1);
      for (int s = 0; s < 3 && !rc; s++) rc = devx_zero_grads(C->x) || devx_step(C->x, ad->step, 1.0f, NULL);
      devx_profile_report(C->x, stdout, atoi(getenv("HPDL_PROFILE")) > 0 ? atoi(getenv("HPDL_PROFILE")) : 25, 3,
                          copy_bandwidth(C->dev));
    }
  }
  ctx_free(C);
  diag_free(diag);
  arena_free(arena);
}

int main(int argc, char **argv) {
  const char *kind = "emulate";
  int kernels = 0, step = 0, steps = 0;
  int64_t micro = 2;
  for (; argc > 1 && argv[1][0] == '-' && argv[1][1] == '-'; argc--, argv++) {
    if (!strcmp(argv[1], "--device") && argc > 2) kind = argv[2], argc--, argv++;
    else if (!strcmp(argv[1], "--kernels")) kernels = 1;
    else if (!strcmp(argv[1], "--step")) step = 1;
    else if (!strcmp(argv[1], "--bench") && argc > 2) steps = atoi(argv[2]), argc--, argv++;
    else if (!strcmp(argv[1], "--micro") && argc > 2) micro = atoll(argv[2]), argc--, argv++;
    else if (!strcmp(argv[1], "--attention") && argc > 2 &&
             (!strcmp(argv[2], "flash") || !strcmp(argv[2], "materialized")))
      bench_materialized = !strcmp(argv[2], "materialized"), argc--, argv++;
    else {
      fprintf(stderr, "test_device: unknown option %s\n", argv[1]);
      return 2;
    }
  }
  if (!kernels && !step && !steps) {
    fprintf(stderr, "usage: test_device [--device cuda|emulate] (--kernels | --step | --bench N) [--micro B] "
                    "[--attention flash|materialized] SAMPLE "
                    "[-D NAME=VALUE | -L parallel.KEY=VALUE]...\n");
    return 2;
  }
  const char *sample = argc > 1 ? argv[1] : "gpt2-tiny.hpd";
  SemDefine defs[32], layout[16];
  int ndefs = 0, nlayout = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    int is_layout = !strcmp(argv[i], "-L");
    char *eq = strchr(argv[i + 1], '=');
    if ((!is_layout && strcmp(argv[i], "-D")) || !eq || ndefs == 32 || nlayout == 16) {
      fprintf(stderr, "test_device: bad definition %s %s\n", argv[i], argv[i + 1]);
      return 2;
    }
    *eq = '\0';
    SemDefine *d = is_layout ? &layout[nlayout++] : &defs[ndefs++];
    d->name = argv[i + 1];
    d->value = eq + 1;
    d->flag = is_layout ? "-L" : "-D";
  }
  if (!getenv("HPDL_STDLIB")) {
    static char std[4200];
    snprintf(std, sizeof std, "%s/stdlib", source_dir());
    setenv("HPDL_STDLIB", std, 0);
  }
  if (!strcmp(kind, "emulate")) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --version >/dev/null 2>&1", cxx());
    if (system(cmd)) {
      printf("skipped: no C++ compiler (%s) to build the emulated kernels; set HPDL_CXX\n", cxx());
      return 77;
    }
  }
  char err[1024] = "";
  Ctx C;
  memset(&C, 0, sizeof C);
  C.kind = kind;
  C.dev = dev_open(kind, 0, err, sizeof err);
  if (!C.dev) {
    printf("skipped: %s\n", err);
    return 77;
  }
  if (!strcmp(kind, "cuda")) {
    const CudaccNvrtc *nv = cudacc_nvrtc(err, sizeof err);
    if (!nv) {
      printf("skipped: %s\n", err);
      C.dev->ops->close(C.dev);
      return 77;
    }
  }
  printf("device: %s\n", C.dev->what);
  if (steps) bench(&C, steps, micro, sample, defs, ndefs, layout, nlayout);
  else if (step) test_step(&C, sample, defs, ndefs, layout, nlayout);
  else {
    int tested = kernels_suite(sample, defs, ndefs, layout, nlayout, build, call, &C, kind);
    printf("%d kernels called on the %s device\n", tested, kind);
    EXPECT(tested > 50);
    ctx_free(&C);
  }
  C.dev->ops->close(C.dev);
  TEST_DONE();
}
