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
 * With --mutate-lmce the fused head's dx kernel loses the barrier between
 * writing its tile of g and reading it (HPDL_MUTATE_LMCE_BARRIER in
 * hpdl_lmce.cuh); with --step the run passes only when the step's gradients
 * came out wrong.
 *
 * With --misalign every buffer sits 4 bytes past a 16-byte boundary, so
 * the loop kernels take their scalar path instead of float4 loads.
 *
 * With --step, the whole training step (forward.grad: the forward, the
 * loss, the backward through the saved layers, every parameter gradient)
 * runs through the emulated kernels under a small host program and is
 * compared with the reference executor's loss and gradients.
 *
 * Usage: test_codegen_cuda [--mutate] [--mutate-lmce] [--misalign] [--step] [SAMPLE [-D NAME=VALUE | -L parallel.KEY=VALUE]...];
 * exits 77 (CTest's skip) when no C++ compiler works. HPDL_EMU_ORDER picks
 * the fibers' order. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stddef.h>
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
  int mutate_lmce; /* compile with HPDL_MUTATE_LMCE_BARRIER: likewise in the fused head */
  int misalign; /* hand the kernels buffers 4 bytes off 16-byte alignment: the scalar paths */
  int col_split; /* column kernels with the group in chunks (codegen_cuda.c's col_split), counted */
} EmuLib;

typedef struct {
  unsigned long long seed;
  long long layer;
  int rank[4];
  int size[4];
  int flags; /* 0: fp32 (no HPDL_KCTX_TF32) */
} KCtx; /* kernels/hpdl_cuda.cuh's hpdl_kctx, field for field */
/* a field the kernels read but this copy lacked would be read from past the struct */
_Static_assert(offsetof(KCtx, flags) == 48 && sizeof(KCtx) == 56, "KCtx is hpdl_kctx as the kernels see it");

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
  for (const char *p = src; (p = strstr(p, "_count[cb_], 1u)")); p++) L->col_split++;
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
           cxx(), L->mutate ? "-DHPDL_MUTATE_DROP_BARRIER" : L->mutate_lmce ? "-DHPDL_MUTATE_LMCE_BARRIER" : "", HPDL_SOURCE_DIR,
           HPDL_SOURCE_DIR, path, so);
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

static void emu_free(EmuLib *L) {
  if (L->so) dlclose(L->so);
  if (L->dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", L->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", L->dir);
  }
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
      const IrNode *n = &fg->graph->nodes[v];
      /* the buffers of test_kernels.h: inputs as to_buffer makes them, outputs numel x 8 + 8 */
      size_t bytes = (size_t)ir_numel(n) * (i < K->ninputs ? (n->dtype == DT_I64 ? 8 : 4) : 8);
      raw[i] = aligned_alloc(16, (bytes + 16 + 15) / 16 * 16);
      shifted[i] = (char *)raw[i] + 4;
      memcpy(shifted[i], io[i], bytes);
    }
    rc = fn(&ctx, shifted);
    for (int i = 0; i < nio; i++) {
      if (i >= K->ninputs) memcpy(io[i], shifted[i], (size_t)ir_numel(&fg->graph->nodes[K->outputs[i - K->ninputs]]) * 8);
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


/* ---- a whole training step through the emulated kernels ----
 *
 * A small host program over the fused module, as the runtime's device
 * layer will run it: every graph's kernels in order, one buffer per value
 * (no memory plan), CALLs in their three modes (ir.h: plain, saving the
 * activations per layer, and the backward over the saved layers), and the
 * gradient outputs of autodiff's graphs added into a gradient store. The
 * step's loss and every parameter's gradient are compared with the
 * reference executor's (ad_step). */

typedef struct {
  int node;        /* the SAVE call */
  int64_t count;
  int per;         /* buffers per layer: the arguments, then outputs 1.. */
  void **t;        /* count x per */
} EStash;

typedef struct {
  const IrModule *m;
  const FuseResult *fr;
  EmuLib *L;
  float **params, **grads; /* per parameter, every copy */
  void **inputs;
  int failed;
  float seed; /* the step's gradient seed (LOSS_SEED reads it) */
} Exec;

static size_t value_bytes(const IrNode *n) { return (size_t)(ir_numel(n) * sem_dtype_bytes(n->dtype)); }

static void *dup_bytes(const void *p, size_t n) {
  void *q = xmalloc(n + 16);
  if (p) memcpy(q, p, n);
  return q;
}

static int exec_graph(Exec *X, int gi, int64_t layer, void **args, void **outs);

static int exec_call(Exec *X, const IrGraph *g, const IrNode *n, void **val, EStash *stash, int *nstash, void *out) {
  const IrModule *m = X->m;
  int callee = (int)n->attr[0];
  int64_t count = n->attr[1], mode = n->attr[2], first = n->attr[3];
  const IrGraph *cg = m->graphs[callee];
  void **outs = xmalloc(sizeof(void *) * (size_t)cg->noutputs);
  void *carry = NULL;
  if (mode == IR_CALL_PLAIN || mode == IR_CALL_SAVE) {
    int nargs = n->nin;
    void **args = xmalloc(sizeof(void *) * (size_t)nargs + 8);
    for (int k = 0; k < nargs; k++) args[k] = val[n->in[k]];
    EStash *st = NULL;
    if (mode == IR_CALL_SAVE) {
      st = &stash[(*nstash)++];
      st->node = (int)(n - g->nodes);
      st->count = count;
      st->per = nargs + cg->noutputs - 1;
      st->t = xmalloc(sizeof(void *) * (size_t)(count * st->per));
    }
    for (int64_t l = 0; l < count; l++) {
      if (st)
        for (int k = 0; k < nargs; k++) st->t[l * st->per + k] = dup_bytes(args[k], value_bytes(&g->nodes[n->in[k]]));
      if (exec_graph(X, callee, first + l, args, outs)) return -1;
      free(carry);
      carry = outs[0];
      args[0] = carry;
      for (int k = 1; k < cg->noutputs; k++) {
        if (st) st->t[l * st->per + nargs + k - 1] = outs[k];
        else free(outs[k]);
      }
    }
    free(args);
  } else {
    EStash *st = NULL;
    for (int i = 0; i < *nstash; i++)
      if (stash[i].node == n->in[1]) st = &stash[i];
    if (!st || st->count != count) {
      fprintf(stderr, "backward call of %s: nothing saved\n", cg->name);
      return -1;
    }
    void **args = xmalloc(sizeof(void *) * (size_t)(1 + st->per));
    args[0] = val[n->in[0]];
    for (int64_t l = count - 1; l >= 0; l--) {
      for (int k = 0; k < st->per; k++) args[1 + k] = st->t[l * st->per + k];
      if (exec_graph(X, callee, first + l, args, outs)) return -1;
      free(carry);
      carry = outs[0];
      args[0] = carry;
      for (int k = 1; k < cg->noutputs; k++) free(outs[k]);
    }
    for (int64_t k = 0; k < count * st->per; k++) free(st->t[k]);
    free(st->t);
    st->t = NULL;
    st->count = 0;
    free(args);
  }
  memcpy(out, carry, value_bytes(n));
  free(carry);
  free(outs);
  return 0;
}

/* Runs graph gi at `layer` on args; outs[k] receive fresh copies of its
 * outputs (the caller frees them); gradient outputs go to the store. */
static int exec_graph(Exec *X, int gi, int64_t layer, void **args, void **outs) {
  const IrModule *m = X->m;
  const FuseGraph *fg = &X->fr->graphs[gi];
  const IrGraph *g = fg->graph;
  void **val = xmalloc(sizeof(void *) * (size_t)g->nnodes);
  char *own = xmalloc((size_t)g->nnodes);
  EStash *stash = xmalloc(sizeof(EStash) * (size_t)(g->nnodes + 1));
  int nstash = 0, rc = 0;
  KCtx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.seed = 1337;
  ctx.layer = layer;
  char sym[200];
  cg_graph_symbol(g->name, sym, sizeof sym);
  for (int p = 0; p < fg->nkernels && !rc; p++) {
    const FuseKernel *K = &fg->kernels[p];
    if (K->kind == FUSE_VIEW) {
      for (int j = 0; j < K->nnodes; j++) val[K->nodes[j]] = val[g->nodes[K->nodes[j]].in[0]];
      continue;
    }
    if (K->kind == FUSE_LEAF) {
      const IrNode *n = &g->nodes[K->nodes[0]];
      int id = K->nodes[0];
      int64_t k = n->attr[0];
      if (n->op == IR_INPUT) val[id] = X->inputs[k];
      else if (n->op == IR_ARG) val[id] = args[k];
      else if (n->op == IR_PARAM) {
        const IrParam *P = &m->params[k];
        int64_t copy = P->count > 1 ? layer : 0;
        val[id] = X->params[k] + copy * ir_numel(n);
      } else {
        /* a constant or fill: the back end's fill kernel when it has one,
         * else the value as the reading kernels take it inline */
        val[id] = xmalloc(value_bytes(n) + 16);
        own[id] = 1;
        for (int64_t i = 0; i < ir_numel(n) && n->dtype == DT_F32; i++) ((float *)val[id])[i] = (float)n->fattr;
        if (n->op == IR_LOSS_SEED) ((float *)val[id])[0] = X->seed; /* the host program's: the step's seed */
        if (n->op == IR_TRAINING) ((float *)val[id])[0] = 1.0f;    /* a training step */
        char name[300];
        snprintf(name, sizeof name, "hpd_emu_%s_k%d", sym + strlen("hpd_graph_"), p);
        EmuEntry fn = (EmuEntry)(uintptr_t)dlsym(X->L->so, name);
        if (fn && K->noutputs && fn(&ctx, &val[id])) rc = -1;
      }
      continue;
    }
    if (K->kind == FUSE_CALL) {
      const IrNode *n = &g->nodes[K->nodes[0]];
      int id = K->nodes[0];
      val[id] = xmalloc(value_bytes(n) + 16);
      own[id] = 1;
      if (exec_call(X, g, n, val, stash, &nstash, val[id])) rc = -1;
      continue;
    }
    if (K->kind == FUSE_COMM) {
      fprintf(stderr, "graph %s k%d: collectives need a rank group (one rank here)\n", g->name, p);
      rc = -1;
      break;
    }
    void **io = xmalloc(sizeof(void *) * (size_t)(K->ninputs + K->noutputs + 1));
    for (int j = 0; j < K->ninputs; j++) io[j] = val[K->inputs[j]];
    for (int j = 0; j < K->noutputs; j++) {
      int v = K->outputs[j];
      val[v] = xmalloc(value_bytes(&g->nodes[v]) + 16);
      own[v] = 1;
      io[K->ninputs + j] = val[v];
    }
    /* values of the kernel's other nodes that later kernels read are its outputs */
    char name[300];
    snprintf(name, sizeof name, "hpd_emu_%s_k%d", sym + strlen("hpd_graph_"), p);
    EmuEntry fn = (EmuEntry)(uintptr_t)dlsym(X->L->so, name);
    if (!fn || fn(&ctx, io)) {
      fprintf(stderr, "graph %s k%d (%s): %s\n", g->name, p, fuse_kind_name(K->kind), fn ? "the launch failed" : "no kernel");
      rc = -1;
    }
    free(io);
  }
  if (!rc) {
    int nplain = g->noutputs - g->ngrad_params;
    for (int k = 0; k < g->noutputs; k++) {
      const IrNode *o = &g->nodes[g->outputs[k]];
      if (k < nplain) {
        outs[k] = dup_bytes(val[g->outputs[k]], value_bytes(o));
        continue;
      }
      int pi = g->grad_params[k - nplain];
      const IrParam *P = &m->params[pi];
      int64_t copy = P->count > 1 ? layer : 0, numel = ir_numel(o);
      const float *gsrc = val[g->outputs[k]];
      for (int64_t i = 0; i < numel; i++) X->grads[pi][copy * numel + i] += gsrc[i];
    }
  }
  for (int i = 0; i < g->nnodes; i++)
    if (own[i]) free(val[i]);
  for (int i = 0; i < nstash; i++) {
    for (int64_t k = 0; stash[i].t && k < stash[i].count * stash[i].per; k++) free(stash[i].t[k]);
    free(stash[i].t);
  }
  free(stash);
  free(own);
  free(val);
  return rc;
}

/* The step of `sample` through the emulated kernels against ad_step's. */
static void test_step(const char *sample, SemDefine *defs, int ndefs, SemDefine *layout, int nlayout, EmuLib *L) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  IrModule *m = NULL;
  AdResult *ad = sample_step(arena, diag, sample, defs, ndefs, layout, nlayout, &m);
  const char *why = NULL;
  FuseResult *fr = ad ? fuse_module_opts(arena, m, &FUSE_CUDA_OPTIONS) : NULL;
  if (!fr || emu_build(L, m, fr)) {
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
  Exec X = {m, fr, L, xmalloc(sizeof(float *) * (size_t)m->nparams), xmalloc(sizeof(float *) * (size_t)m->nparams),
            xmalloc(sizeof(void *) * (size_t)(m->ninputs + 1)), 0, 1.0f};
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    int64_t n = 1, copies = P->count > 1 ? P->count : 1;
    for (int i = 0; i < P->rank; i++) n *= P->dims[i];
    X.params[p] = xmalloc(sizeof(float) * (size_t)(n * copies) + 16);
    X.grads[p] = xmalloc(sizeof(float) * (size_t)(n * copies) + 16);
    for (int64_t l = 0; l < copies; l++) {
      const double *v = interp_param(in, p, l, NULL);
      for (int64_t k = 0; k < n; k++) X.params[p][l * n + k] = (float)v[k];
    }
  }
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < x->rank; k++) n *= x->dims[k];
    X.inputs[i] = to_buffer(x->dtype, inputs[i], n);
  }
  /* the step: its argument 0 is the loss's gradient seed */
  const IrGraph *sg = m->graphs[ad->step];
  float seed = 1.0f;
  void *args[2] = {&seed, NULL};
  void **outs = xmalloc(sizeof(void *) * (size_t)sg->noutputs);
  int rc = exec_graph(&X, ad->step, 0, args, outs);
  EXPECT(rc == 0);
  interp_zero_grads(in);
  double want = ad_step(in, ad, 1.0, &why);
  if (!rc) {
    double got = ((float *)outs[0])[0];
    printf("step of %s through the emulated kernels: loss %.9g, reference %.9g\n", sample, got, want);
    EXPECT_NEAR(got, want, HPDL_KERNEL_TOL);
    /* gradients at the scale of all gradients (one that is zero analytically is fp32 noise) */
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
      for (int64_t l = 0; l < (P->count > 1 ? P->count : 1); l++) {
        int64_t n;
        const double *w = interp_grad(in, p, l, &n);
        if (!w) continue;
        char what[200];
        snprintf(what, sizeof what, "%s gradient of %s (layer %" PRId64 ")", sample, P->name, l);
        bad += !check_tensor(what, DT_F32, X.grads[p] + l * n, w, n, rms);
        checked++;
      }
    }
    printf("step of %s: %d parameter gradients within %g of the reference, %d off\n", sample, checked, HPDL_KERNEL_TOL, bad);
    EXPECT(checked > 10);
    for (int k = 0; k < sg->noutputs - sg->ngrad_params; k++) free(outs[k]);
  }
  free(outs);
  for (int p = 0; p < m->nparams; p++) {
    free(X.params[p]);
    free(X.grads[p]);
  }
  for (int i = 0; i < m->ninputs; i++) {
    free(X.inputs[i]);
    free(inputs[i]);
  }
  free(inputs);
  free(X.params);
  free(X.grads);
  free(X.inputs);
  interp_free(in);
  diag_free(diag);
  arena_free(arena);
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
  int mutate = 0, mutate_lmce = 0, misalign = 0, step = 0, want_split = 0;
  for (; argc > 1 && argv[1][0] == '-' && argv[1][1] == '-'; argc--, argv++) {
    if (!strcmp(argv[1], "--col-split")) want_split = 1; /* fail unless some column kernel is split */
    else if (!strcmp(argv[1], "--micro") && argc > 2) { /* the step's micro batch (2) */
      sample_step_micro = atoll(argv[2]);
      argc--, argv++;
    }
    else if (!strcmp(argv[1], "--mutate")) mutate = 1;
    else if (!strcmp(argv[1], "--mutate-lmce")) mutate_lmce = 1;
    else if (!strcmp(argv[1], "--misalign")) misalign = 1;
    else if (!strcmp(argv[1], "--step")) step = 1;
    else break;
  }
  const char *sample = argc > 1 ? argv[1] : "gpt2-tiny.hpd";
  SemDefine defs[32], layout[16];
  int ndefs = 0, nlayout = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    int is_layout = !strcmp(argv[i], "-L");
    char *eq = strchr(argv[i + 1], '=');
    if ((!is_layout && strcmp(argv[i], "-D")) || !eq || ndefs == 32 || nlayout == 16) {
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
  L.mutate_lmce = mutate_lmce;
  L.misalign = misalign;
  if (step) {
    test_step(sample, defs, ndefs, layout, nlayout, &L);
    if (mutate_lmce) { /* the race must show in the step's results */
      int caught = test_failures;
      printf("mutation (no barrier before the fused head's dx reads its g tile): %s\n", caught ? "caught" : "NOT caught");
      test_failures = !caught;
    }
    printf("%d column kernel%s with the group in chunks\n", L.col_split, L.col_split == 1 ? "" : "s");
    if (want_split) EXPECT(L.col_split > 0);
    emu_free(&L);
    TEST_DONE();
  }
  int tested = kernels_suite(sample, defs, ndefs, layout, nlayout, emu_build, emu_call, &L, "CUDA back end, emulated");
  if (mutate) {
    int caught = test_failures;
    printf("mutation (no barrier before a block reduction writes its partials): %s (%d kernels called, %d wrong)\n",
           tested > 50 && caught ? "caught" : "NOT caught", tested, caught);
    test_failures = !(tested > 50 && caught);
  } else {
    EXPECT(tested > 50);
  }
  emu_free(&L);
  TEST_DONE();
}
