/* test_kernels.h - every fused kernel of a sample called alone, on the
 * values the reference executor (interp, fp64) computed for its inputs, its
 * outputs compared with interp's: the CPU back end (test_codegen_cpu.c,
 * part kernels) and the CUDA back end through the emulation harness
 * (test_codegen_cuda.c) both run it, each calling its kernels its own way.
 *
 * Tolerance: |got - want| <= tol * (|want| + mean |want| + floor) per
 * element, tol 1e-5 (fp32 against fp64; the mean term absorbs cancellation
 * in values near zero), floor the mean magnitude of the kernel's float
 * inputs. An element beyond it passes when its error is within what fp32
 * itself cannot tell apart: RESPONSE_FACTOR times the most the kernel's own
 * output moves when each float input moves by one unit in the last place
 * (two random perturbations; kernel_response). That admits a row sum that
 * cancels (sum |x| / |sum x| of 14264 in a tiny DeepSeek-V3's RMSNorm
 * backward: the kernel's fp32 sum, in its own order, 4.7e-4 off the exact
 * one) and nothing a wrong index or a race produces, whose errors do not
 * shrink with the inputs' last bits; and never more than SLACK_CAP of the
 * element's scale (a racing kernel's two runs may differ by anything). */
#ifndef HPDL_TEST_KERNELS_H
#define HPDL_TEST_KERNELS_H

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "fuse.h"
#include "headloss.h"
#include "interp.h"
#include "test_sample.h"
#include "half.h"
#include "test_util.h"

#define HPDL_KERNEL_TOL 1e-5
#define SLACK_CAP 1e-3 /* the most of an element's error the inputs' last bits can excuse */

static inline void *xmalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) abort();
  return p;
}

/* ---- tensors ---- */

/* Bytes a value of dt takes in the buffers to_buffer makes (float for any
 * type it has no case of). */
static inline size_t buffer_elem_size(DType dt) {
  return dt == DT_I64 ? 8 : dt == DT_BF16 || dt == DT_F16 ? 2 : 4;
}

static inline void *to_buffer(DType dt, const double *v, int64_t n) {
  if (dt == DT_I32) {
    int32_t *b = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = (int32_t)v[i];
    return b;
  }
  if (dt == DT_I64) {
    int64_t *b = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = (int64_t)v[i];
    return b;
  }
  if (dt == DT_BF16 || dt == DT_F16) { /* 16-bit storage (mixed precision) */
    uint16_t *b = xmalloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = dt == DT_BF16 ? half_bf16_from_f32((float)v[i]) : half_from_f32((float)v[i]);
    return b;
  }
  float *b = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) b[i] = (float)v[i];
  return b;
}

static inline double elem(DType dt, const void *b, int64_t i) {
  if (dt == DT_BF16) return half_bf16_to_f32(((const uint16_t *)b)[i]);
  if (dt == DT_F16) return half_to_f32(((const uint16_t *)b)[i]);
  if (dt == DT_I32) return ((const int32_t *)b)[i];
  if (dt == DT_I64) return (double)((const int64_t *)b)[i];
  return ((const float *)b)[i];
}

/* The largest error of got against want, in units of the tolerance's scale
 * (floor: an absolute scale below which values count as zero). */
static inline double compare_slack(DType dt, const void *got, const double *want, const double *slack, int64_t n,
                                   double floor, int64_t *at) {
  double mean = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(want[i])) {
      mean += fabs(want[i]);
      finite++;
    }
  mean = finite ? mean / (double)finite : 0;
  double worst = 0;
  *at = -1;
  for (int64_t i = 0; i < n; i++) {
    double g = elem(dt, got, i), w = want[i], e;
    if (isnan(w) || isnan(g)) e = isnan(w) && isnan(g) ? 0 : INFINITY;
    else if (isinf(w) || isinf(g)) e = g == w ? 0 : INFINITY;
    else {
      double den = fabs(w) + mean + floor + 1e-30, allow = slack ? slack[i] : 0;
      if (allow > SLACK_CAP * den) allow = SLACK_CAP * den; /* never past 1e-3: a race's runs may differ by anything */
      double d = fabs(g - w) - allow;
      e = (d > 0 ? d : 0) / den;
    }
    if (e > worst || (*at < 0 && e > 0)) {
      worst = e;
      *at = i;
    }
  }
  return worst;
}

static inline double compare(DType dt, const void *got, const double *want, int64_t n, double floor, int64_t *at) {
  return compare_slack(dt, got, want, NULL, n, floor, at);
}

/* The tolerance of a graph's outputs: HPDL_KERNEL_TOL, or two units in the
 * last place of the 16-bit storage the graph holds values in (mixed
 * precision: the reference rounds its fp64 result, the kernels their fp32
 * one, which may land a unit apart, and what is computed from it inherits
 * that). */
static inline double storage_tol(const IrGraph *g) {
  double tol = HPDL_KERNEL_TOL;
  for (int i = 0; i < g->nnodes; i++) {
    if (g->nodes[i].dtype == DT_BF16 && tol < 0x1p-7) tol = 0x1p-7;
    if (g->nodes[i].dtype == DT_F16 && tol < 0x1p-10) tol = 0x1p-10;
  }
  return tol;
}

static inline int check_tensor_tol(const char *what, DType dt, const void *got, const double *want, int64_t n, double floor,
                                   double tol) {
  int64_t at;
  double e = compare(dt, got, want, n, floor, &at);
  if (e <= tol) return 1;
  fprintf(stderr, "%s: error %.3g (tolerance %g) at element %" PRId64 " of %" PRId64 ": got %.9g, want %.9g\n", what, e,
          tol, at, n, at >= 0 ? elem(dt, got, at) : 0.0, at >= 0 ? want[at] : 0.0);
  test_failures++;
  return 0;
}

/* check_tensor_tol with a per-element allowance (kernel_response); no message, no failure counted. */
static inline int within_slack(DType dt, const void *got, const double *want, const double *slack, int64_t n, double floor,
                               double tol) {
  int64_t at;
  return compare_slack(dt, got, want, slack, n, floor, &at) <= tol;
}

static inline int check_tensor(const char *what, DType dt, const void *got, const double *want, int64_t n, double floor) {
  return check_tensor_tol(what, dt, got, want, n, floor, HPDL_KERNEL_TOL);
}

static uint64_t rng_state __attribute__((unused)) = 0x12345678;
static inline double uniform(void) { return interp_uniform01(&rng_state); }
static inline double normal(void) { return interp_normal(&rng_state); }

static inline double **make_inputs(const IrModule *m, int64_t vocab) {
  double **in = xmalloc(sizeof(double *) * (size_t)(m->ninputs + 1));
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < x->rank; k++) n *= x->dims[k];
    in[i] = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++)
      in[i][k] = sem_dtype_is_float(x->dtype) ? (double)(float)normal() : (double)(int64_t)(uniform() * (double)vocab);
  }
  return in;
}

/* The parameters the library sees are fp32: give interp the same values. */
static inline void round_params(Interp *in, const IrModule *m) {
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    for (int64_t l = 0; l < (P->count > 1 ? P->count : 1); l++) {
      int64_t n;
      double *v = interp_param(in, p, l, &n);
      for (int64_t k = 0; k < n; k++) v[k] = (double)(float)v[k];
    }
  }
}

/* ---- every kernel of a sample, one by one ---- */

/* A copy of m whose graph gi returns every node (no gradient outputs), so
 * interp hands back the value of each. */
static inline IrModule *instrumented(Arena *a, const IrModule *m, int gi) {
  IrModule *c = arena_alloc(a, sizeof *c);
  *c = *m;
  c->graphs = arena_alloc(a, sizeof(IrGraph *) * (size_t)m->ngraphs);
  memcpy(c->graphs, m->graphs, sizeof(IrGraph *) * (size_t)m->ngraphs);
  IrGraph *g = arena_alloc(a, sizeof *g);
  *g = *m->graphs[gi];
  g->outputs = arena_alloc(a, sizeof(int) * (size_t)g->nnodes);
  for (int i = 0; i < g->nnodes; i++) g->outputs[i] = i;
  g->noutputs = g->nnodes;
  g->grad_params = NULL;
  g->ngrad_params = 0;
  c->graphs[gi] = g;
  return c;
}

/* Every node's value of graph gi run with args (interp). NULL on failure. */
static inline InterpTensor *all_values(Arena *a, const IrModule *m, int gi, double **inputs, const InterpTensor *args,
                                int nargs) {
  IrModule *c = instrumented(a, m, gi);
  Interp *in = interp_new(c);
  interp_set_store_f32(in, 1); /* each kernel's inputs as the back ends hold them */
  interp_init_params(in, 1337);
  round_params(in, c);
  for (int i = 0; i < c->ninputs; i++) interp_set_input(in, i, inputs[i]);
  InterpTensor *v = xmalloc(sizeof(InterpTensor) * (size_t)c->graphs[gi]->nnodes);
  const char *err = NULL;
  if (interp_run(in, gi, 0, args, nargs, v, &err)) {
    fprintf(stderr, "interp of %s: %s\n", m->graphs[gi]->name, err);
    test_failures++;
    free(v);
    v = NULL;
  }
  interp_free(in);
  return v;
}

static inline void free_values(InterpTensor *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) free(v[i].data);
  free(v);
}

static inline int arg_node(const IrGraph *g, int a) {
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == IR_ARG && g->nodes[i].attr[0] == a) return i;
  return -1;
}

static inline InterpTensor tensor_copy(const InterpTensor *t) {
  InterpTensor c = *t;
  int64_t n = 1;
  for (int k = 0; k < t->rank; k++) n *= t->dims[k];
  c.data = xmalloc(sizeof(double) * (size_t)n);
  memcpy(c.data, t->data, sizeof(double) * (size_t)n);
  return c;
}

/* Calls kernel p of fg on io (its inputs, then its outputs, each a buffer
 * of the value's dtype). 1 when called, 0 when the back end has no code for
 * it (a leaf it does not materialise), -1 on failure with *err. */
typedef int (*KernelCall)(void *env, const FuseGraph *fg, int p, void **io, const char **err);
/* Builds the back end's code for the module; 0 or -1. */
typedef int (*KernelBuild)(void *env, const IrModule *m, const FuseResult *fr);

enum { RESPONSE_FACTOR = 16 };

/* How far kernel p's float outputs move when each float input moves by one
 * unit in its last place, up or down at random: per element of each
 * output, the most of two such runs times RESPONSE_FACTOR (slack[j], for
 * output j). 0 when the kernel has no fp32 input or a run fails. */
static inline int kernel_response(const FuseGraph *fg, int p, void **io, KernelCall call, void *env, double **slack) {
  const FuseKernel *K = &fg->kernels[p];
  const IrGraph *g = fg->graph;
  int any = 0;
  for (int j = 0; j < K->ninputs; j++) any |= g->nodes[K->inputs[j]].dtype == DT_F32;
  if (!any) return 0;
  uint64_t state = 0x9e3779b97f4a7c15ULL + (uint64_t)p;
  void **pio = xmalloc(sizeof(void *) * (size_t)(K->ninputs + K->noutputs + 1));
  int ok = 1;
  for (int run = 0; run < 2 && ok; run++) {
    for (int j = 0; j < K->ninputs; j++) {
      const IrNode *n = &g->nodes[K->inputs[j]];
      size_t bytes = (size_t)ir_numel(n) * buffer_elem_size(n->dtype);
      pio[j] = xmalloc(bytes);
      memcpy(pio[j], io[j], bytes);
      if (n->dtype != DT_F32) continue;
      float *x = pio[j];
      for (int64_t i = 0; i < ir_numel(n); i++)
        if (isfinite(x[i]) && x[i] != 0) x[i] = nextafterf(x[i], interp_uniform01(&state) < 0.5 ? -INFINITY : INFINITY);
    }
    for (int j = 0; j < K->noutputs; j++) pio[K->ninputs + j] = xmalloc((size_t)(ir_numel(&g->nodes[K->outputs[j]]) * 8 + 8));
    const char *err = NULL;
    ok = call(env, fg, p, pio, &err) > 0;
    for (int j = 0; j < K->noutputs && ok; j++) {
      const IrNode *n = &g->nodes[K->outputs[j]];
      if (!sem_dtype_is_float(n->dtype)) continue;
      for (int64_t i = 0; i < ir_numel(n); i++) {
        double d = fabs(elem(n->dtype, pio[K->ninputs + j], i) - elem(n->dtype, io[K->ninputs + j], i)) * RESPONSE_FACTOR;
        if (!isfinite(d)) d = 0;
        if (d > slack[j][i]) slack[j][i] = d;
      }
    }
    for (int j = 0; j < K->ninputs + K->noutputs; j++) free(pio[j]);
  }
  free(pio);
  return ok;
}

/* Calls each kernel of graph gi alone on vals; compares its outputs. */
static inline void check_kernels(const FuseResult *fr, int gi, const InterpTensor *vals, KernelCall call, void *env,
                                 int *tested, int *failed) {
  const FuseGraph *fg = &fr->graphs[gi];
  const IrGraph *g = fg->graph;
  for (int p = 0; p < fg->nkernels; p++) {
    const FuseKernel *K = &fg->kernels[p];
    if (K->kind == FUSE_VIEW || K->kind == FUSE_CALL) continue;
    void **io = xmalloc(sizeof(void *) * (size_t)(K->ninputs + K->noutputs + 1));
    for (int j = 0; j < K->ninputs; j++) {
      const IrNode *n = &g->nodes[K->inputs[j]];
      io[j] = to_buffer(n->dtype, vals[K->inputs[j]].data, ir_numel(n));
    }
    for (int j = 0; j < K->noutputs; j++) io[K->ninputs + j] = xmalloc((size_t)(ir_numel(&g->nodes[K->outputs[j]]) * 8 + 8));
    const char *err = NULL;
    int rc = call(env, fg, p, io, &err);
    if (rc != 0) (*tested)++;
    int ok = rc >= 0;
    if (rc < 0) {
      fprintf(stderr, "%s k%d (%s): failed: %s\n", g->name, p, fuse_kind_name(K->kind), err ? err : "?");
      test_failures++;
    }
    /* the scale of the kernel's data: its float inputs' mean magnitude */
    double scale = 0;
    int64_t cnt = 0;
    for (int j = 0; j < K->ninputs; j++) {
      const IrNode *n = &g->nodes[K->inputs[j]];
      if (!sem_dtype_is_float(n->dtype)) continue;
      for (int64_t i = 0; i < ir_numel(n); i++)
        if (isfinite(vals[K->inputs[j]].data[i])) scale += fabs(vals[K->inputs[j]].data[i]), cnt++;
    }
    scale = cnt ? scale / (double)cnt : 0;
    double **slack = NULL; /* the kernel's response (kernel_response), once an output is past the tolerance */
    for (int j = 0; j < K->noutputs && rc > 0; j++) {
      const IrNode *n = &g->nodes[K->outputs[j]];
      int64_t at;
      if (compare(n->dtype, io[K->ninputs + j], vals[K->outputs[j]].data, ir_numel(n), scale, &at) <= HPDL_KERNEL_TOL)
        continue;
      if (!slack) {
        slack = xmalloc(sizeof(double *) * (size_t)K->noutputs);
        for (int q = 0; q < K->noutputs; q++) slack[q] = xmalloc(sizeof(double) * (size_t)ir_numel(&g->nodes[K->outputs[q]]));
        kernel_response(fg, p, io, call, env, slack);
      }
      if (within_slack(n->dtype, io[K->ninputs + j], vals[K->outputs[j]].data, slack[j], ir_numel(n), scale, HPDL_KERNEL_TOL))
        continue;
      char what[160];
      snprintf(what, sizeof what, "%s k%d %s: %%%d %s", g->name, p, fuse_kind_name(K->kind), K->outputs[j],
               ir_op_name(n->op));
      ok &= check_tensor(what, n->dtype, io[K->ninputs + j], vals[K->outputs[j]].data, ir_numel(n), scale);
    }
    for (int j = 0; slack && j < K->noutputs; j++) free(slack[j]);
    free(slack);
    if (!ok) { /* what the kernel computes, to find it in `hpdlc emit` */
      fprintf(stderr, "  k%d:", p);
      for (int j = 0; j < K->nnodes; j++) fprintf(stderr, " %%%d %s", K->nodes[j], ir_op_name(g->nodes[K->nodes[j]].op));
      fprintf(stderr, "; inputs");
      for (int j = 0; j < K->ninputs; j++) fprintf(stderr, " %%%d", K->inputs[j]);
      fprintf(stderr, "\n");
    }
    *failed += !ok;
    for (int j = 0; j < K->ninputs + K->noutputs; j++) free(io[j]);
    free(io);
  }
}

/* The sample lowered at micro batch sample_step_micro (2 unless a test
 * says otherwise; under the layout overrides, parallel.fused_ce = on
 * fusing the head with its loss as the partitioner does) and its training
 * step (no recomputation, unless a layout override parallel.recompute says
 * which); NULL after a failed expectation. */
static int64_t sample_step_micro = 2;
static inline AdResult *sample_step(Arena *arena, Diag *diag, const char *sample, SemDefine *defs, int ndefs,
                                    SemDefine *layout, int nlayout, IrModule **m) {
  SemModel *sm = NULL;
  *m = lower_sample_layout(arena, diag, sample, defs, ndefs, layout, nlayout, sample_step_micro, &sm);
  EXPECT(*m != NULL);
  const char *why = NULL;
  if (*m && sm && sm->layout.fused_ce == 1) EXPECT(headloss_fuse(*m, &why) > 0);
  int asked = 0; /* the sample's own policy is not taken: only an override's */
  for (int i = 0; i < nlayout; i++) asked |= layout[i].name && !strcmp(layout[i].name, "parallel.recompute");
  Recompute policy = asked && sm && sm->layout.recompute > 0 ? (Recompute)sm->layout.recompute : RECOMPUTE_NONE;
  AdResult *ad = *m ? ad_build(*m, policy, &why) : NULL;
  EXPECT(ad != NULL);
  return ad;
}

/* Token ids for make_inputs: below the smallest embedding table's rows. */
static inline int64_t sample_vocab(const IrModule *m) {
  int64_t vocab = 256;
  for (int gi = 0; gi < m->ngraphs; gi++)
    for (int i = 0; i < m->graphs[gi]->nnodes; i++) {
      const IrNode *n = &m->graphs[gi]->nodes[i];
      if (n->op == IR_EMBEDDING && n->nin > 0) {
        const IrNode *tbl = &m->graphs[gi]->nodes[n->in[0]];
        if (tbl->rank > 0 && tbl->dims[0] < vocab) vocab = tbl->dims[0];
      }
    }
  return vocab;
}

/* The sample's forward, its block, and after ad_build the step, B.fwd and
 * B.grad: every kernel called alone through call. Returns the number of
 * kernels called (their failures are counted in test_failures). */
static inline int kernels_suite(const char *sample, SemDefine *defs, int ndefs, SemDefine *layout, int nlayout,
                                KernelBuild build, KernelCall call, void *env, const char *label) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  IrModule *m = NULL;
  AdResult *ad = sample_step(arena, diag, sample, defs, ndefs, layout, nlayout, &m);
  if (!ad) {
    diag_free(diag);
    arena_free(arena);
    return 0;
  }
  FuseResult *fr = fuse_module(arena, m);
  if (build(env, m, fr)) {
    test_failures++;
    diag_free(diag);
    arena_free(arena);
    return 0;
  }
  double **inputs = make_inputs(m, sample_vocab(m));
  int tested = 0, failed = 0;
  /* the forward, then the block on the forward's input to the call */
  const IrGraph *g0 = m->graphs[0];
  InterpTensor *v0 = all_values(arena, m, 0, inputs, NULL, 0);
  int callnode = -1;
  for (int i = 0; i < g0->nnodes; i++)
    if (g0->nodes[i].op == IR_CALL) callnode = i;
  if (v0) check_kernels(fr, 0, v0, call, env, &tested, &failed);
  InterpTensor x = {0, {0}, NULL};
  if (v0 && callnode >= 0) x = tensor_copy(&v0[g0->nodes[callnode].in[0]]);
  free_values(v0, g0->nnodes);
  int block = callnode >= 0 ? (int)g0->nodes[callnode].attr[0] : -1;
  if (block > 0 && x.data) {
    InterpTensor *vb = all_values(arena, m, block, inputs, &x, 1);
    if (vb) check_kernels(fr, block, vb, call, env, &tested, &failed);
    free_values(vb, m->graphs[block]->nnodes);
  }
  /* the step: forward.grad with seed 1 */
  double one = 1.0;
  InterpTensor seed = {0, {0}, &one};
  InterpTensor *vs = all_values(arena, m, ad->step, inputs, &seed, 1);
  if (vs) check_kernels(fr, ad->step, vs, call, env, &tested, &failed);
  free_values(vs, m->graphs[ad->step]->nnodes);
  /* B.fwd on the block's input; B.grad on a random dy and what B.fwd saved */
  if (block > 0 && x.data) {
    int bf = ad->fwd[block], bg = ad->grad[block];
    InterpTensor *vf = all_values(arena, m, bf, inputs, &x, 1);
    if (vf) check_kernels(fr, bf, vf, call, env, &tested, &failed);
    const IrGraph *gf = m->graphs[bf], *gg = m->graphs[bg];
    if (vf) {
      InterpTensor *args = xmalloc(sizeof(InterpTensor) * (size_t)gg->nargs);
      const IrNode *dn = &gg->nodes[arg_node(gg, 0)];
      args[0].rank = dn->rank;
      memcpy(args[0].dims, dn->dims, sizeof args[0].dims);
      args[0].data = xmalloc(sizeof(double) * (size_t)ir_numel(dn));
      for (int64_t i = 0; i < ir_numel(dn); i++) args[0].data[i] = (double)(float)(0.1 * normal());
      args[1] = tensor_copy(&x);
      for (int k = 1; k < gf->noutputs && 1 + k < gg->nargs + 1; k++) args[1 + k] = tensor_copy(&vf[gf->outputs[k]]);
      InterpTensor *vg = all_values(arena, m, bg, inputs, args, gg->nargs);
      if (vg) check_kernels(fr, bg, vg, call, env, &tested, &failed);
      free_values(vg, gg->nnodes);
      for (int a = 0; a < gg->nargs; a++) free(args[a].data);
      free(args);
    }
    free_values(vf, gf->nnodes);
  }
  printf("kernels of %s (%s): %d kernels called alone, %d off\n", sample, label, tested, failed);
  free(x.data);
  for (int i = 0; i < m->ninputs; i++) free(inputs[i]);
  free(inputs);
  diag_free(diag);
  arena_free(arena);
  return tested;
}

#endif
