/* test_codegen_cuda.c - the CUDA back end's kernels run on the CPU through
 * the emulation harness (kernels/cuda_emu.h), against the reference
 * executor.
 *
 * The generated source of a sample's module, with the back end's host
 * entries for the harness (CgOptions.emulate), is compiled unchanged as C++
 * by $HPDL_CXX (else c++) with -include cuda_emu.h into a shared library;
 * then every fused kernel of the forward, the block, the training step,
 * B.fwd and B.grad is called alone on the values interp computed for its
 * inputs and its outputs are compared with interp's (test_kernels.h: 1e-5
 * relative, fp32 against fp64) - the same check the CPU back end passes.
 * GEMMs run through the harness's reference product (hpdl_emu_host.h).
 *
 * With --mutate the block reductions lose the barrier that keeps one
 * reduction's shared partials from the next (HPDL_MUTATE_DROP_BARRIER in
 * hpdl_cuda.cuh): the harness must catch the race, so the run passes only
 * when kernels were called and some of them came out wrong.
 *
 * With --misalign every buffer sits 4 bytes past a 16-byte boundary, so
 * the loop kernels take their scalar path instead of float4 loads.
 *
 * Usage: test_codegen_cuda [--mutate] [--misalign] [SAMPLE [-D NAME=VALUE | -L parallel.KEY=VALUE]...];
 * exits 77 (CTest's skip) when no C++ compiler works. HPDL_EMU_ORDER picks
 * the fibers' order. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen.h"
#include "test_kernels.h"

typedef struct {
  char dir[64];
  void *so;
  int mutate;   /* compile with HPDL_MUTATE_DROP_BARRIER: a race that must be caught */
  int misalign; /* hand the kernels buffers 4 bytes off 16-byte alignment: the scalar paths */
} EmuLib;

typedef struct {
  unsigned long long seed;
  long long layer;
  int rank[4];
  int size[4];
} KCtx; /* kernels/hpdl_cuda.cuh's hpdl_kctx */

typedef int (*EmuEntry)(const KCtx *ctx, void **io);

static const char *cxx(void) {
  const char *c = getenv("HPDL_CXX");
  return c && *c ? c : "c++";
}

static int emu_build(void *env, const IrModule *m, const FuseResult *fr) {
  EmuLib *L = env;
  const CgBackend *be = cg_backend("cuda");
  if (!be) {
    fprintf(stderr, "no cuda back end\n");
    return -1;
  }
  CgOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.emulate = 1;
  char err[512] = "";
  CgTarget *t = be->create(m, fr, &opt, err, sizeof err);
  if (!t || be->generate(t)) {
    fprintf(stderr, "generate: %s\n", t ? be->error(t) : err);
    /* the kernels it did generate are still tested; a kernel left out fails below */
  }
  char *src = t ? be->dump(t) : NULL;
  if (t) be->destroy(t);
  if (!src) return -1;
  snprintf(L->dir, sizeof L->dir, "/tmp/hpdl-cuda-XXXXXX");
  if (!mkdtemp(L->dir)) return -1;
  char path[256], so[256], cmd[2048];
  snprintf(path, sizeof path, "%s/k.cu", L->dir);
  snprintf(so, sizeof so, "%s/k.so", L->dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(src, f);
  fclose(f);
  free(src);
  snprintf(cmd, sizeof cmd,
           "%s -std=c++17 -O1 -fPIC -shared -fno-strict-aliasing -w %s -include %s/kernels/cuda_emu.h -I%s/kernels -x c++ %s -o %s",
           cxx(), L->mutate ? "-DHPDL_MUTATE_DROP_BARRIER" : "", HPDL_SOURCE_DIR, HPDL_SOURCE_DIR, path, so);
  if (system(cmd)) {
    fprintf(stderr, "the generated source does not compile as C++: %s\n", cmd);
    return -1;
  }
  L->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!L->so) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return -1;
  }
  return 0;
}

static int emu_call(void *env, const FuseGraph *fg, int p, void **io, const char **err) {
  EmuLib *L = env;
  char sym[200], name[300];
  cg_graph_symbol(fg->graph->name, sym, sizeof sym);
  snprintf(name, sizeof name, "hpd_emu_%s_k%d", sym + strlen("hpd_graph_"), p);
  EmuEntry fn = (EmuEntry)(uintptr_t)dlsym(L->so, name);
  const FuseKernel *K = &fg->kernels[p];
  if (!fn) {
    if (K->kind == FUSE_LEAF || K->kind == FUSE_COMM) return 0; /* nothing to run / the host's */
    *err = "the CUDA back end generated no kernel for it";
    return -1;
  }
  KCtx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.seed = 1337;
  int nio = K->ninputs + K->noutputs, rc;
  if (L->misalign) {
    /* copies at 4 bytes past a 16-byte boundary (values are at most 8 bytes) */
    void **shifted = xmalloc(sizeof(void *) * (size_t)nio), **raw = xmalloc(sizeof(void *) * (size_t)nio);
    for (int i = 0; i < nio; i++) {
      int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
      size_t bytes = (size_t)ir_numel(&fg->graph->nodes[v]) * 8;
      raw[i] = aligned_alloc(16, (bytes + 16 + 15) / 16 * 16);
      shifted[i] = (char *)raw[i] + 4;
      memcpy(shifted[i], io[i], bytes);
    }
    rc = fn(&ctx, shifted);
    for (int i = 0; i < nio; i++) {
      int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
      if (i >= K->ninputs) memcpy(io[i], shifted[i], (size_t)ir_numel(&fg->graph->nodes[v]) * 8);
      free(raw[i]);
    }
    free(shifted);
    free(raw);
  } else {
    rc = fn(&ctx, io);
  }
  if (rc) {
    *err = "the emulated launch failed (see above)";
    return -1;
  }
  return 1;
}

static int cxx_works(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s --version >/dev/null 2>&1", cxx());
  return system(cmd) == 0;
}

int main(int argc, char **argv) {
  if (!cxx_works()) {
    printf("skipped: no C++ compiler (%s) to build the emulated kernels; set HPDL_CXX\n", cxx());
    return 77;
  }
  int mutate = 0, misalign = 0;
  for (; argc > 1 && argv[1][0] == '-' && argv[1][1] == '-'; argc--, argv++) {
    if (!strcmp(argv[1], "--mutate")) mutate = 1;
    else if (!strcmp(argv[1], "--misalign")) misalign = 1;
    else break;
  }
  const char *sample = argc > 1 ? argv[1] : "gpt2-tiny.hpd";
  SemDefine defs[16], layout[16];
  int ndefs = 0, nlayout = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    int is_layout = !strcmp(argv[i], "-L");
    char *eq = strchr(argv[i + 1], '=');
    if ((!is_layout && strcmp(argv[i], "-D")) || !eq || ndefs == 16 || nlayout == 16) {
      fprintf(stderr, "usage: test_codegen_cuda [SAMPLE [-D NAME=VALUE | -L parallel.KEY=VALUE]...]\n");
      return 2;
    }
    *eq = '\0';
    SemDefine *d = is_layout ? &layout[nlayout++] : &defs[ndefs++];
    d->name = argv[i + 1];
    d->value = eq + 1;
    d->flag = is_layout ? "-L" : "-D";
  }
  EmuLib L;
  memset(&L, 0, sizeof L);
  L.mutate = mutate;
  L.misalign = misalign;
  int tested = kernels_suite(sample, defs, ndefs, layout, nlayout, emu_build, emu_call, &L, "CUDA back end, emulated");
  if (mutate) {
    int caught = test_failures;
    printf("mutation (no barrier before a block reduction writes its partials): %s (%d kernels called, %d wrong)\n",
           tested > 50 && caught ? "caught" : "NOT caught", tested, caught);
    test_failures = !(tested > 50 && caught);
  } else {
    EXPECT(tested > 50);
  }
  if (L.so) dlclose(L.so);
  if (L.dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", L.dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", L.dir);
  }
  TEST_DONE();
}
