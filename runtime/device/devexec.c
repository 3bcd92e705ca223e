/* devexec.c - a stage's fused graphs on a device (devexec.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devexec.h"
#include "hostop.h"
#include "interp.h"
#include "semtypes.h"

typedef struct {
  size_t bytes;
  void *p;
} PoolBuf;

typedef struct {
  int node; /* the SAVE call */
  int64_t count;
  int per;  /* buffers per layer: the arguments, then outputs 1.. */
  void **t; /* count x per, pool buffers */
  size_t *bytes;
} Stash;

typedef struct {
  DevKernel **k;       /* per launch; NULL for a GEMM */
  DevGemmPlan **plans; /* per launch; NULL for a kernel */
  unsigned char *apart; /* per GEMM launch: its epilogue by a kernel of ours after the bare product (APART_*) */
  DevGemmPlan ***by_rows; /* per grouped launch: its plans by the rows of a run, made as runs of that length come */
  double *secs;        /* per launch, profiling */
  long *calls;
} KernelRes;

struct DevExec {
  Device *dev;
  const DevxProgram *p;
  KernelRes **res; /* [graph][kernel] */
  DevKernel *accumulate;
  DevKernel *bias_grad, *bias_grad16; /* hpdl_bias_grad_f32 / _bf16, where a GEMM's bias gradient runs apart */
  DevKernel *bias16;                  /* hpdl_bias_bf16, where a bias into a bf16 D runs apart */
  void **io_plus;                     /* bias16_apart's io pointers and its product's buffer, grown as needed */
  int io_plus_cap;
  int32_t *ids_host;                  /* grouped_run's copy of the rows' experts */
  int64_t ids_cap;
  DevKernel *round_bf16; /* NULL where no weight is read in bf16 */
  DevKernel *chunk_copy; /* hpdl_chunk_copy_f32, the device collectives' layouts (looked up on first use) */
  /* per parameter copy (goff[p] + copy): where its values and its gradient
   * are (pat NULL: not gathered, ZeRO-3) and its place in the blocks */
  void **pat, **gat;
  int64_t *fat;
  void *flat_p, *flat_g; /* every parameter in one block, every gradient in another (devx_flat) */
  int64_t flat_len;
  /* DevxFlat.experts_apart, state_apart: the parameters kept apart, their gradients and bf16
   * copies in blocks of xlen values, flat indices [flat_len, flat_len + xlen) */
  void *flat_xp, *flat_xg, *flat_x16;
  int64_t xlen;
  int by_layer;          /* the blocks in units: the unrepeated parameters, then each layer's copies */
  int64_t lay_lo, lay_hi; /* the layers the module's calls run (a pipeline stage's): only their copies are held */
  int nunits;
  int64_t *ustart;       /* nunits + 1 */
  DevxLayerHook layer_hook;
  void *layer_ctx;
  /* bf16 copies of the weights some node reads in bf16 (a bf16 GEMM's),
   * rounded once per step (devx_refresh16): laid out as the parameters'
   * block, in flat16 (2 bytes a value), or under ZeRO-3, where that block
   * is released, per unit in u16 while the unit is gathered (u32: where
   * devx_point_unit put its values) */
  unsigned char *read16; /* per parameter: some node reads it in bf16 */
  unsigned char *read32; /* per parameter: some node the step runs reads it as it is (fp32; devx_reads_from) */
  DevKernel *take;       /* hpdl_take_f32 (devx_take, looked up on first use) */
  void *flat16;
  void **u16, **u32;
  void **inputs;
  PoolBuf *free_bufs;
  int nfree, capfree;
  /* per graph (built on its first run): the values whose buffers die after
   * each kernel, in CSR form (dies_at[k] .. dies_at[k + 1] of dies) */
  int **dies, **dies_at;
  char **inplace; /* per graph and kernel: run in place (dead_values) */
  size_t live, peak;
  unsigned long long seed;
  DevxComm comm;
  int nparams, ninputs; /* the module's, for devx_free: the module may be gone by then */
  float *host[2]; /* the collectives' staging, grown as needed */
  size_t host_cap[2];
  int profile;
  float loss_seed; /* the running step's seed (LOSS_SEED) */
  float training;  /* TRAINING: 1, or 0 in an evaluation step (devx_set_evaluating) */
  double aux_sum;  /* AUX_LOSS: weight x loss of the forwards, until devx_take_aux */
  int aux_seen;
  DevxHost host_call; /* extern calls (devx_set_host) */
  DevxTracer tracer; /* hpdlrun --profile (devx_set_tracer) */
  int has_tracer;
  /* devx_set_grad_ready: gradient additions per parameter copy (goff[p] + copy)
   * in this micro-batch (gcur) and in one whole micro-batch (gtotal, learned);
   * goff is every per-copy table's index */
  DevxGradReady ready;
  void *ready_ctx;
  int64_t *goff, *gcur, *gtotal, gn;
  int gknown, garmed;
  char err[1200];
};

static int fail(DevExec *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(DevExec *x, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->err, sizeof x->err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *devx_error(const DevExec *x) { return x->err; }

static size_t round_bytes(size_t n) { return (n + 255) / 256 * 256; }

static size_t value_bytes(const IrNode *n) { return (size_t)(ir_numel(n) * sem_dtype_bytes(n->dtype)); }

static size_t input_bytes(const IrInput *in) {
  int64_t n = 1;
  for (int k = 0; k < in->rank; k++) n *= in->dims[k];
  return (size_t)n * (size_t)sem_dtype_bytes(in->dtype);
}

static void *pool_get(DevExec *x, size_t bytes) {
  size_t n = round_bytes(bytes ? bytes : 1);
  for (int i = x->nfree - 1; i >= 0; i--)
    if (x->free_bufs[i].bytes == n) {
      void *p = x->free_bufs[i].p;
      x->free_bufs[i] = x->free_bufs[--x->nfree];
      return p;
    }
  void *p = x->dev->ops->alloc(x->dev, n);
  if (!p) {
    fail(x, "%s", dev_error(x->dev));
    return NULL;
  }
  x->live += n;
  if (x->live > x->peak) x->peak = x->live;
  return p;
}

static void pool_put(DevExec *x, void *p, size_t bytes) {
  if (!p) return;
  if (x->nfree == x->capfree) {
    x->capfree = x->capfree ? 2 * x->capfree : 256;
    x->free_bufs = realloc(x->free_bufs, sizeof(PoolBuf) * (size_t)x->capfree);
  }
  x->free_bufs[x->nfree++] = (PoolBuf){round_bytes(bytes ? bytes : 1), p};
}

void *devx_buffer(DevExec *x, size_t bytes) { return pool_get(x, bytes); }

void devx_buffer_put(DevExec *x, void *p, size_t bytes) { pool_put(x, p, bytes); }

void devx_memory(const DevExec *x, size_t *now, size_t *peak) {
  if (now) *now = x->live;
  if (peak) *peak = x->peak;
}

void devx_program_free(DevxProgram *p) {
  if (!p) return;
  for (int g = 0; g < p->ngraphs; g++) {
    for (int k = 0; k < p->graphs[g].nkernels; k++) {
      DevxKernel *K = &p->graphs[g].kernels[k];
      for (int l = 0; l < K->nlaunches; l++) free((char *)K->launches[l].name);
      free(K->launches);
      free(K->inputs);
      free(K->outputs);
      free(K->nodes);
    }
    free(p->graphs[g].kernels);
  }
  free(p->graphs);
  memset(p, 0, sizeof *p);
}

static DevKctx kctx(const DevExec *x, int64_t layer);

/* The copies [lo, hi) of P the module's calls read (a repeated parameter's
 * of the stage's layers; an unrepeated one's copy 0). */
static void held_copies(const DevExec *x, const IrParam *P, int64_t *lo, int64_t *hi) {
  if (P->count <= 1) {
    *lo = 0, *hi = 1;
    return;
  }
  *lo = x->lay_lo < P->count ? x->lay_lo : P->count;
  *hi = x->lay_hi < P->count ? x->lay_hi : P->count;
}

/* Blocks for n units of per_block each, at least 1 and at most 65535 (the
 * host program's own grid-stride kernels walk the rest). */
static unsigned capped_grid(int64_t n, int64_t per_block) {
  int64_t blocks = (n + per_block - 1) / per_block;
  return (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

static int is_bgrad(DevEpilogue e) { return e == DEV_EPI_BGRAD_A || e == DEV_EPI_BGRAD_B; }

enum { APART_NONE, APART_BGRAD, APART_BIAS16 };

/* A GEMM's plan. An epilogue of ours that cuBLASLt has no algorithm for -
 * a bias gradient (BGRADA / BGRADB) or a bias into a bf16 D - or that
 * HPDL_GEMM_EPILOGUE=kernel sets apart (the tests' way to run this path on
 * the emulated device) becomes the product alone and a launch of our
 * kernel after it: hpdl_bias_grad_f32 / _bf16 (*apart = APART_BGRAD), or,
 * the product written to a pool buffer (io index nio) in fp32,
 * hpdl_bias_bf16 (APART_BIAS16). Other epilogues are cuBLASLt's alone. */
static DevGemmPlan *gemm_plan(DevExec *x, const DevGemm *g, int nio, unsigned char *apart) {
  Device *dev = x->dev;
  const char *mode = getenv("HPDL_GEMM_EPILOGUE");
  int ours = is_bgrad(g->epilogue) || g->c_bf16;
  DevGemmPlan *p = NULL;
  if (!ours || !(mode && !strcmp(mode, "kernel"))) p = dev->ops->gemm_plan(dev, g);
  if (p || !ours) return p;
  if ((g->batch > 1 && !(g->c_bf16 && g->epilogue == DEV_EPI_NONE)) || g->aux >= 0)
    return NULL; /* fuse.c makes neither with these epilogues */
  DevGemm bare = *g;
  bare.epilogue = DEV_EPI_NONE;
  bare.bias = -1;
  if (g->c_bf16) {
    bare.c_bf16 = 0;
    bare.c = nio;
    if (!x->bias16 && !(x->bias16 = dev->ops->kernel(dev, "hpdl_bias_bf16"))) return NULL;
    *apart = APART_BIAS16;
  } else {
    DevKernel **k = g->ab_bf16 ? &x->bias_grad16 : &x->bias_grad;
    if (!*k && !(*k = dev->ops->kernel(dev, g->ab_bf16 ? "hpdl_bias_grad_bf16" : "hpdl_bias_grad_f32"))) return NULL;
    *apart = APART_BGRAD;
  }
  return dev->ops->gemm_plan(dev, &bare);
}

/* out[j] = the sum over k rows of the GEMM operand's stored [k, x] matrix
 * (hpdl_bias_grad_*: a block per 32 columns, in a fixed order). */
static int bias_grad_apart(DevExec *x, const DevGemm *g, void **io) {
  DevKctx c = kctx(x, 0);
  int side_a = g->epilogue == DEV_EPI_BGRAD_A;
  int64_t cols = side_a ? g->m : g->n, ld = side_a ? g->lda : g->ldb;
  void *args[5] = {io[side_a ? g->a : g->b], io[g->bias], (void *)(intptr_t)g->k, (void *)(intptr_t)cols,
                   (void *)(intptr_t)ld};
  return x->dev->ops->launch(x->dev, g->ab_bf16 ? x->bias_grad16 : x->bias_grad, capped_grid(cols, 32), 256, &c, args, 5);
}

static void *pool_get(DevExec *x, size_t bytes);
static void pool_put(DevExec *x, void *p, size_t bytes);

/* APART_BIAS16: the bare product into a pool buffer (io[nio], fp32), then
 * D = bf16(product + bias) by hpdl_bias_bf16 (no bias: bf16(product)). */
static int bias16_apart(DevExec *x, DevGemmPlan *plan, const DevGemm *g, void **io, int nio) {
  int64_t rows = g->m * (g->batch > 1 ? g->batch : 1); /* a batch's matrices one after another (stride_c m n) */
  size_t bytes = sizeof(float) * (size_t)(rows * g->n);
  if (nio + 1 > x->io_plus_cap) {
    void **grown = realloc(x->io_plus, sizeof(void *) * (size_t)(nio + 1));
    if (!grown) return fail(x, "out of host memory");
    x->io_plus = grown;
    x->io_plus_cap = nio + 1;
  }
  void *c32 = pool_get(x, bytes);
  if (!c32) return -1;
  memcpy(x->io_plus, io, sizeof(void *) * (size_t)nio);
  x->io_plus[nio] = c32;
  int rc = x->dev->ops->gemm(x->dev, plan, x->io_plus);
  DevKctx c = kctx(x, 0);
  void *args[5] = {c32, g->bias >= 0 ? io[g->bias] : NULL, io[g->c], (void *)(intptr_t)rows, (void *)(intptr_t)g->n};
  if (!rc) rc = x->dev->ops->launch(x->dev, x->bias16, capped_grid(rows * g->n, 1024), 256, &c, args, 5);
  pool_put(x, c32, bytes); /* later work on the stream runs after the kernel that read it */
  return rc;
}

DevExec *devx_new(Device *dev, const DevxProgram *p, unsigned long long seed, const DevxFlat *flat_how, char *err, size_t errlen) {
  DevExec *x = calloc(1, sizeof *x);
  x->dev = dev;
  x->p = p;
  x->seed = seed;
  x->training = 1.0f;
  const IrModule *m = p->m;
  x->res = calloc((size_t)p->ngraphs, sizeof *x->res);
  x->dies = calloc((size_t)p->ngraphs + 1, sizeof *x->dies);
  x->dies_at = calloc((size_t)p->ngraphs + 1, sizeof *x->dies_at);
  x->inplace = calloc((size_t)p->ngraphs + 1, sizeof *x->inplace);
  int rc = 0;
  for (int g = 0; g < p->ngraphs && !rc; g++) {
    x->res[g] = calloc((size_t)p->graphs[g].nkernels + 1, sizeof(KernelRes));
    for (int k = 0; k < p->graphs[g].nkernels && !rc; k++) {
      const DevxKernel *K = &p->graphs[g].kernels[k];
      KernelRes *R = &x->res[g][k];
      R->k = calloc((size_t)K->nlaunches + 1, sizeof *R->k);
      R->plans = calloc((size_t)K->nlaunches + 1, sizeof *R->plans);
      R->apart = calloc((size_t)K->nlaunches + 1, 1);
      R->by_rows = calloc((size_t)K->nlaunches + 1, sizeof *R->by_rows);
      R->secs = calloc((size_t)K->nlaunches + 1, sizeof *R->secs);
      R->calls = calloc((size_t)K->nlaunches + 1, sizeof *R->calls);
      for (int l = 0; l < K->nlaunches && !rc; l++) {
        const DevxLaunch *L = &K->launches[l];
        if (L->is_host) continue; /* no device code: run_host */
        if (L->grouped) { /* plans by the rows of a run, as they come (grouped_run) */
          int64_t n = L->grouped == 2 ? L->gemm.k : L->gemm.m;
          R->by_rows[l] = calloc((size_t)n + 1, sizeof(DevGemmPlan *));
          if (!R->by_rows[l]) rc = fail(x, "out of host memory");
        } else if (L->is_gemm) {
          R->plans[l] = gemm_plan(x, &L->gemm, K->ninputs + K->noutputs, &R->apart[l]);
          if (!R->plans[l]) rc = fail(x, "graph %s kernel %d (%s): %s", m->graphs[g]->name, k, L->name, dev_error(dev));
        } else {
          R->k[l] = dev->ops->kernel(dev, L->name);
          if (!R->k[l]) rc = fail(x, "graph %s kernel %d: %s", m->graphs[g]->name, k, dev_error(dev));
        }
      }
    }
  }
  if (!rc) {
    x->accumulate = dev->ops->kernel(dev, "hpdl_accumulate_f32");
    if (!x->accumulate) rc = fail(x, "%s (kernels/hpdl_cuda.cuh defines it)", dev_error(dev));
  }
  x->nparams = m->nparams;
  x->ninputs = m->ninputs;
  x->inputs = calloc((size_t)m->ninputs + 1, sizeof(void *));
  /* The layers the module's calls run: a pipeline stage's module lists every
   * copy of a repeated parameter but reads those of its own layers only, so
   * only they are allocated (and unit by unit under by_layer) */
  x->lay_lo = INT64_MAX;
  x->lay_hi = 0;
  for (int g = 0; g < m->ngraphs; g++)
    for (int k = 0; k < m->graphs[g]->nnodes; k++) {
      const IrNode *n = &m->graphs[g]->nodes[k];
      if (n->op != IR_CALL) continue;
      if (n->attr[3] < x->lay_lo) x->lay_lo = n->attr[3];
      if (n->attr[3] + n->attr[1] > x->lay_hi) x->lay_hi = n->attr[3] + n->attr[1];
    }
  if (x->lay_lo > x->lay_hi) x->lay_lo = x->lay_hi = 0;
  /* The parameters in one block and their gradients in another (devx_flat):
   * each parameter's copies together at a 256-byte boundary, or by_layer in
   * units - the unrepeated parameters, then copy l of every repeated one for
   * each l - each copy at a 256-byte boundary; each unit (the whole block:
   * one unit) padded to a multiple of flat_how->unit values, the padding
   * zero. The program's ZeRO shards the units evenly. */
  int64_t unit = flat_how && flat_how->unit > 0 ? flat_how->unit : 1, ncopies = 0, layers = 0;
  x->by_layer = flat_how && flat_how->by_layer;
  int apart_x = x->by_layer && flat_how->experts_apart, apart_s = x->by_layer && flat_how->state_apart;
#define APART(P) ((apart_x && ir_param_is_expert(P)) || (apart_s && (P)->state))
  x->goff = calloc((size_t)m->nparams + 1, sizeof(int64_t));
  for (int i = 0; x->goff && i < m->nparams; i++) {
    x->goff[i] = ncopies;
    ncopies += ir_param_copies(&m->params[i]);
    if (m->params[i].count > 1 && m->params[i].count > layers) layers = m->params[i].count;
  }
  x->gn = ncopies;
  if (x->goff) x->goff[m->nparams] = ncopies;
  if (layers > x->lay_hi) layers = x->lay_hi;
  x->nunits = x->by_layer ? 1 + (int)(layers > x->lay_lo ? layers - x->lay_lo : 0) : 1;
  x->pat = calloc((size_t)ncopies + 1, sizeof(void *));
  x->gat = calloc((size_t)ncopies + 1, sizeof(void *));
  x->fat = calloc((size_t)ncopies + 1, sizeof(int64_t));
  x->ustart = calloc((size_t)x->nunits + 2, sizeof(int64_t));
  if (!x->inputs || !x->goff || !x->pat || !x->gat || !x->fat || !x->ustart) rc = rc ? rc : fail(x, "out of host memory");
  int64_t flat = 0;
  for (int64_t c = 0; c < ncopies && x->fat; c++) x->fat[c] = -1; /* not held */
  for (int u = 0; u < x->nunits && !rc; u++) {
    x->ustart[u] = flat;
    for (int i = 0; i < m->nparams; i++) {
      const IrParam *P = &m->params[i];
      int64_t n = ir_param_numel(P), lo, hi;
      held_copies(x, P, &lo, &hi);
      if (APART(P)) continue; /* after the units */
      if (!x->by_layer) {
        for (int64_t c = lo; c < hi; c++) x->fat[x->goff[i] + c] = flat + (c - lo) * n;
        flat += (n * (hi > lo ? hi - lo : 0) + 63) / 64 * 64;
      } else if (u == 0 ? P->count <= 1 : P->count > 1 && x->lay_lo + u - 1 >= lo && x->lay_lo + u - 1 < hi) {
        x->fat[x->goff[i] + (u == 0 ? 0 : x->lay_lo + u - 1)] = flat;
        flat += (n + 63) / 64 * 64;
      }
    }
    flat = (flat + unit - 1) / unit * unit;
  }
  x->ustart[x->nunits] = x->flat_len = flat;
  for (int i = 0; (apart_x || apart_s) && i < m->nparams; i++) {
    const IrParam *P = &m->params[i];
    int64_t n = ir_param_numel(P), lo, hi;
    if (!APART(P)) continue;
    held_copies(x, P, &lo, &hi);
    for (int64_t c = lo; c < hi; c++) {
      x->fat[x->goff[i] + c] = x->flat_len + x->xlen;
      x->xlen += (n + 63) / 64 * 64;
    }
  }
#undef APART
  if (!rc && x->xlen) {
    size_t bytes = sizeof(float) * (size_t)x->xlen;
    x->flat_xp = dev->ops->alloc(dev, bytes);
    x->flat_xg = x->flat_xp ? dev->ops->alloc(dev, bytes) : NULL;
    if (!x->flat_xg || dev->ops->zero(dev, x->flat_xp, bytes) || dev->ops->zero(dev, x->flat_xg, bytes))
      rc = fail(x, "the parameters kept apart and their gradients (%.1f MB each): %s", (double)bytes / 1e6, dev_error(dev));
    x->live += 2 * bytes;
  }
  if (!rc) {
    size_t bytes = sizeof(float) * (size_t)(flat ? flat : 1);
    x->flat_p = dev->ops->alloc(dev, bytes);
    x->flat_g = x->flat_p ? dev->ops->alloc(dev, bytes) : NULL;
    if (!x->flat_g || dev->ops->zero(dev, x->flat_p, bytes) || dev->ops->zero(dev, x->flat_g, bytes))
      rc = fail(x, "the parameters and gradients (%.1f MB each): %s", (double)bytes / 1e6, dev_error(dev));
    x->live += 2 * bytes;
  }
  for (int64_t c = 0; c < ncopies && !rc; c++)
    if (x->fat[c] >= 0) {
      x->pat[c] = x->fat[c] < x->flat_len ? (float *)x->flat_p + x->fat[c] : (float *)x->flat_xp + (x->fat[c] - x->flat_len);
      x->gat[c] = x->fat[c] < x->flat_len ? (float *)x->flat_g + x->fat[c] : (float *)x->flat_xg + (x->fat[c] - x->flat_len);
    }
  /* the weights some node reads in bf16: their copies, in a block laid out
   * as the parameters' (the few values no node reads in bf16 - norms,
   * biases - ride along: one rounding launch for the block) */
  x->read16 = calloc((size_t)m->nparams + 1, 1);
  x->read32 = calloc((size_t)m->nparams + 1, 1);
  x->u16 = calloc((size_t)x->nunits + 1, sizeof(void *));
  x->u32 = calloc((size_t)x->nunits + 1, sizeof(void *));
  if ((!x->read16 || !x->read32 || !x->u16 || !x->u32) && !rc) rc = fail(x, "out of memory");
  int any16 = 0;
  for (int q = 0; q < m->nparams && !rc; q++) {
    const IrParam *P = &m->params[q];
    DType t = ir_param_read_type(m, q);
    if (t == P->dtype) continue;
    if (P->dtype != DT_F32 || t != DT_BF16) {
      rc = fail(x, "the module reads parameter %s as %s, which this program does not make of %s (recompile the artifact)", P->name,
                sem_dtype_name(t), sem_dtype_name(P->dtype));
      break;
    }
    x->read16[q] = 1;
    any16 = 1;
  }
  if (any16 && !rc && x->xlen) {
    size_t bytes = 2 * (size_t)x->xlen;
    if (!(x->flat_x16 = dev->ops->alloc(dev, bytes)))
      rc = fail(x, "the bf16 copies of the parameters kept apart (%.1f MB): %s", (double)bytes / 1e6, dev_error(dev));
    x->live += bytes;
  }
  if (any16 && !rc) {
    size_t bytes = 2 * (size_t)(flat ? flat : 1);
    if (!(x->flat16 = dev->ops->alloc(dev, bytes))) rc = fail(x, "the weights' bf16 copies (%.1f MB): %s", (double)bytes / 1e6, dev_error(dev));
    x->live += bytes;
    if (!rc && !(x->round_bf16 = dev->ops->kernel(dev, "hpdl_round_bf16")))
      rc = fail(x, "%s (kernels/hpdl_cuda.cuh defines it)", dev_error(dev));
  }
  for (int i = 0; i < m->ninputs && !rc; i++) {
    const IrInput *in = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < in->rank; k++) n *= in->dims[k];
    x->inputs[i] = dev->ops->alloc(dev, (size_t)n * (size_t)sem_dtype_bytes(in->dtype));
    if (!x->inputs[i]) rc = fail(x, "input %d: %s", i, dev_error(dev));
  }
  x->peak = x->live;
  if (rc) {
    snprintf(err, errlen, "%s", x->err);
    devx_free(x);
    return NULL;
  }
  return x;
}

void devx_free(DevExec *x) {
  if (!x) return;
  free(x->goff);
  free(x->gcur);
  free(x->gtotal);
  for (int g = 0; g < x->p->ngraphs && x->res; g++) {
    for (int k = 0; x->res[g] && k < x->p->graphs[g].nkernels; k++) {
      free(x->res[g][k].k);
      free(x->res[g][k].plans);
      free(x->res[g][k].apart);
      for (int l = 0; x->res[g][k].by_rows && l < x->p->graphs[g].kernels[k].nlaunches; l++) free(x->res[g][k].by_rows[l]);
      free(x->res[g][k].by_rows);
      free(x->res[g][k].secs);
      free(x->res[g][k].calls);
    }
    free(x->res[g]);
  }
  free(x->res);
  for (int g = 0; g < x->p->ngraphs && x->dies; g++) {
    free(x->dies[g]);
    free(x->dies_at[g]);
    free(x->inplace[g]);
  }
  free(x->dies);
  free(x->dies_at);
  free(x->inplace);
  free(x->host[0]);
  free(x->host[1]);
  if (x->flat_p) x->dev->ops->release(x->dev, x->flat_p);
  if (x->flat_g) x->dev->ops->release(x->dev, x->flat_g);
  free(x->pat);
  free(x->gat);
  free(x->fat);
  free(x->ustart);
  if (x->flat16) x->dev->ops->release(x->dev, x->flat16);
  if (x->flat_xp) x->dev->ops->release(x->dev, x->flat_xp);
  if (x->flat_xg) x->dev->ops->release(x->dev, x->flat_xg);
  if (x->flat_x16) x->dev->ops->release(x->dev, x->flat_x16);
  for (int u = 0; x->u16 && u < x->nunits; u++)
    if (x->u16[u]) x->dev->ops->release(x->dev, x->u16[u]);
  free(x->u16);
  free(x->u32);
  free(x->read16);
  free(x->read32);
  free(x->io_plus);
  free(x->ids_host);
  for (int i = 0; i < x->ninputs && x->inputs; i++) x->dev->ops->release(x->dev, x->inputs[i]);
  for (int i = 0; i < x->nfree; i++) x->dev->ops->release(x->dev, x->free_bufs[i].p);
  free(x->free_bufs);
  free(x->inputs);
  free(x);
}

/* Copy `layer` of parameter p between host and device: its values (grad 0)
 * or its gradient (grad 1). */
static int copy_io(DevExec *x, int p, int64_t layer, int grad, int to_device, void *host) {
  const IrParam *P = &x->p->m->params[p];
  int64_t n = ir_param_numel(P);
  if (layer < 0 || layer >= ir_param_copies(P)) return fail(x, "parameter %s has no layer %lld", P->name, (long long)layer);
  void *d = (grad ? x->gat : x->pat)[x->goff[p] + layer];
  if (!d) return fail(x, "parameter %s, layer %lld: not gathered on this rank now (ZeRO-3)", P->name, (long long)layer);
  size_t bytes = sizeof(float) * (size_t)n;
  if (to_device ? x->dev->ops->to_device(x->dev, d, host, bytes) : x->dev->ops->to_host(x->dev, host, d, bytes))
    return fail(x, "%s of %s: %s", grad ? "gradient" : "parameter", P->name, dev_error(x->dev));
  return 0;
}

int devx_set_param(DevExec *x, int p, const float *host) {
  int64_t n = ir_param_numel(&x->p->m->params[p]);
  for (int64_t c = 0; c < ir_param_copies(&x->p->m->params[p]); c++)
    if (copy_io(x, p, c, 0, 1, (void *)(host + c * n))) return -1;
  return 0;
}

int devx_set_input(DevExec *x, int i, const void *host, size_t bytes) {
  if (x->dev->ops->to_device(x->dev, x->inputs[i], host, bytes)) return fail(x, "input %d: %s", i, dev_error(x->dev));
  return 0;
}

int devx_get_grad(DevExec *x, int p, float *host) {
  int64_t n = ir_param_numel(&x->p->m->params[p]);
  for (int64_t c = 0; c < ir_param_copies(&x->p->m->params[p]); c++)
    if (copy_io(x, p, c, 1, 0, host + c * n)) return -1;
  return 0;
}

int devx_set_param_copy(DevExec *x, int p, int64_t layer, const float *host) { return copy_io(x, p, layer, 0, 1, (void *)host); }
int devx_get_grad_copy(DevExec *x, int p, int64_t layer, float *host) { return copy_io(x, p, layer, 1, 0, host); }
int devx_get_param_copy(DevExec *x, int p, int64_t layer, float *host) { return copy_io(x, p, layer, 0, 0, host); }
int devx_set_grad_copy(DevExec *x, int p, int64_t layer, const float *host) { return copy_io(x, p, layer, 1, 1, (void *)host); }

void *devx_param_ptr(DevExec *x, int p, int64_t layer) { return x->pat[x->goff[p] + layer]; }
void *devx_grad_ptr(DevExec *x, int p, int64_t layer) { return x->gat[x->goff[p] + layer]; }

int devx_zero_grads(DevExec *x) {
  if ((x->flat_g && x->flat_len && x->dev->ops->zero(x->dev, x->flat_g, sizeof(float) * (size_t)x->flat_len)) ||
      (x->flat_xg && x->dev->ops->zero(x->dev, x->flat_xg, sizeof(float) * (size_t)x->xlen)))
    return fail(x, "%s", dev_error(x->dev));
  return 0;
}

int64_t devx_flat(DevExec *x, void **params, void **grads) {
  if (params) *params = x->flat_p;
  if (grads) *grads = x->flat_g;
  return x->flat_len;
}

int64_t devx_flat_index(const DevExec *x, int p, int64_t layer) { return x->fat[x->goff[p] + layer]; }

int64_t devx_copy_index(const DevExec *x, int p, int64_t layer) { return x->goff[p] + layer; }

int devx_layer_unit(const DevExec *x, int64_t layer) {
  return x->by_layer && layer >= x->lay_lo && layer < x->lay_hi && 1 + layer - x->lay_lo < x->nunits ? (int)(1 + layer - x->lay_lo) : -1;
}

/* The bf16 copy of copy `copy` of parameter p (read16), or NULL where its
 * unit is not gathered. */
static void *copy16(const DevExec *x, int p, int64_t copy) {
  int64_t f = x->fat[x->goff[p] + copy];
  if (f < 0) return NULL;
  if (f >= x->flat_len) return x->flat_x16 ? (void *)((uint16_t *)x->flat_x16 + (f - x->flat_len)) : NULL;
  if (x->flat16) return (uint16_t *)x->flat16 + f;
  int u = !x->by_layer || x->p->m->params[p].count <= 1 ? 0 : (int)(1 + copy - x->lay_lo);
  return u >= 0 && u < x->nunits && x->u16[u] ? (void *)((uint16_t *)x->u16[u] + (f - x->ustart[u])) : NULL;
}

int devx_units(const DevExec *x, const int64_t **start) {
  *start = x->ustart;
  return x->nunits;
}

static void point(DevExec *x, void **at_of, void *block, int unit, void *base) {
  const IrModule *m = x->p->m;
  for (int p = 0; p < m->nparams; p++)
    for (int64_t c = 0; c < ir_param_copies(&m->params[p]); c++) {
      int64_t at = x->goff[p] + c, f = x->fat[at];
      if (f >= 0 && f >= x->ustart[unit] && f < x->ustart[unit + 1])
        at_of[at] = base ? (float *)base + (f - x->ustart[unit]) : block ? (float *)block + f : NULL;
    }
}

/* Under ZeRO-3 (the parameters' block released) a gathered unit's bf16
 * copies get a pool buffer of their own, back to the pool with the unit. */
void devx_point_unit(DevExec *x, int unit, void *base) {
  point(x, x->pat, x->flat_p, unit, base);
  x->u32[unit] = base;
  size_t bytes = 2 * (size_t)(x->ustart[unit + 1] - x->ustart[unit]);
  if (base && x->round_bf16 && !x->flat16 && !x->u16[unit]) x->u16[unit] = pool_get(x, bytes);
  if (!base && x->u16[unit]) {
    pool_put(x, x->u16[unit], bytes);
    x->u16[unit] = NULL;
  }
}
void devx_point_grad_unit(DevExec *x, int unit, void *base) { point(x, x->gat, x->flat_g, unit, base); }

/* Walks unit u's parameter copies in the block's order: each one's offset
 * in the unit, its values, and whether some node reads it in bf16 / fp32. */
typedef void (*UnitVisit)(void *ctx, int64_t at, int copy, int64_t n, int r16, int r32);
static void unit_walk(const DevExec *x, int unit, UnitVisit fn, void *ctx) {
  const IrModule *m = x->p->m;
  for (int p = 0; p < m->nparams; p++)
    for (int64_t c = 0; c < ir_param_copies(&m->params[p]); c++) {
      int64_t at = x->goff[p] + c, f = x->fat[at];
      if (f >= 0 && f >= x->ustart[unit] && f < x->ustart[unit + 1])
        fn(ctx, f - x->ustart[unit], (int)at, ir_param_numel(&m->params[p]), x->read16[p], x->read32[p]);
    }
}

typedef struct {
  int64_t *off, *len;
  int n, cap, any16;
} Reads;

static void collect_reads(void *ctx, int64_t at, int copy, int64_t n, int r16, int r32) {
  Reads *r = ctx;
  (void)copy;
  r->any16 |= r16;
  if (!r32) return;
  if (r->n < r->cap) {
    r->off[r->n] = at;
    r->len[r->n] = n;
  }
  r->n++;
}

/* read32: the parameters some node of graph root or a graph it calls reads
 * as they are (an evaluation's plain forward, which the step does not
 * call, may read them so where the step reads bf16 copies). */
static int mark_reads32(DevExec *x, int root, unsigned char *seen) {
  const IrModule *m = x->p->m;
  if (root < 0 || root >= m->ngraphs || seen[root]) return 0;
  seen[root] = 1;
  const IrGraph *g = m->graphs[root];
  /* a node read by another or returned (precision.c leaves the fp32 PARAM
   * of a weight it reads as a bf16 one behind, read by nothing) */
  unsigned char *used = calloc((size_t)g->nnodes + 1, 1);
  if (!used) return -1;
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nin; k++) used[g->nodes[i].in[k]] = 1;
  for (int i = 0; i < g->noutputs; i++) used[g->outputs[i]] = 1;
  int rc = 0;
  for (int i = 0; i < g->nnodes && !rc; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op == IR_CALL) rc = mark_reads32(x, (int)n->attr[0], seen);
    if (n->op == IR_PARAM && used[i] && n->attr[0] >= 0 && n->attr[0] < m->nparams && n->dtype == m->params[n->attr[0]].dtype)
      x->read32[n->attr[0]] = 1;
  }
  free(used);
  return rc;
}

int devx_reads_from(DevExec *x, int root) {
  unsigned char *seen = calloc((size_t)x->p->ngraphs + 1, 1);
  if (!seen) return fail(x, "out of memory");
  memset(x->read32, 0, (size_t)x->p->m->nparams);
  int rc = mark_reads32(x, root, seen);
  free(seen);
  return rc ? fail(x, "out of memory") : 0;
}

int devx_unit_reads(const DevExec *x, int unit, int64_t *off, int64_t *len, int cap, int *any16) {
  Reads r = {off, len, 0, cap, 0};
  if (x->round_bf16) unit_walk(x, unit, collect_reads, &r);
  if (any16) *any16 = x->round_bf16 ? r.any16 : 0;
  return r.n;
}

typedef struct {
  DevExec *x;
  float *f32;
  int64_t at;
} Point16;

static void point16(void *ctx, int64_t at, int copy, int64_t n, int r16, int r32) {
  Point16 *q = ctx;
  (void)at;
  (void)r16;
  q->x->pat[copy] = r32 && q->f32 ? q->f32 + q->at : NULL;
  if (r32) q->at += n;
}

void devx_point_unit16(DevExec *x, int unit, void *b16, void *f32) {
  Point16 q = {x, f32, 0};
  unit_walk(x, unit, point16, &q);
  x->u32[unit] = NULL;
  x->u16[unit] = b16;
}

/* Frees a block (*block, every copy's address in at_of with it). */
static void release_block(DevExec *x, void **block, void **at_of) {
  if (!*block) return;
  x->dev->ops->release(x->dev, *block);
  x->live -= sizeof(float) * (size_t)(x->flat_len ? x->flat_len : 1);
  *block = NULL;
  for (int64_t c = 0; c < x->gn; c++)
    if (x->fat[c] < x->flat_len) at_of[c] = NULL; /* the experts' blocks stay */
  x->peak = x->live; /* the block held nothing yet: the peak counts from here */
}

void devx_release_grads(DevExec *x) { release_block(x, &x->flat_g, x->gat); }
void devx_release_params(DevExec *x) {
  release_block(x, &x->flat_p, x->pat);
  if (x->flat16) { /* the bf16 copies go too: a gathered unit's are its own (devx_point_unit) */
    x->dev->ops->release(x->dev, x->flat16);
    x->live -= 2 * (size_t)(x->flat_len ? x->flat_len : 1);
    x->flat16 = NULL;
    x->peak = x->live;
  }
}

void devx_set_layer_hook(DevExec *x, DevxLayerHook fn, void *ctx) {
  x->layer_hook = fn;
  x->layer_ctx = ctx;
}

/* The layer hook around layer `layer` of a call (DevxLayerPhase). */
static int layer_hook(DevExec *x, int64_t layer, int phase) {
  char why[600] = "";
  if (!x->layer_hook || !x->layer_hook(x->layer_ctx, layer, phase, why, sizeof why)) return 0;
  return fail(x, "layer %lld: %s", (long long)layer, why);
}

static DevKctx kctx(const DevExec *x, int64_t layer) {
  DevKctx c;
  memset(&c, 0, sizeof c);
  c.seed = x->seed;
  c.layer = layer;
  c.flags = x->dev->tf32 ? DEV_KCTX_TF32 : 0;
  for (int i = 0; i < 4; i++) {
    c.rank[i] = x->comm.rank[i];
    c.size[i] = x->comm.size[i] > 0 ? x->comm.size[i] : 1;
  }
  return c;
}

void devx_set_comm(DevExec *x, const DevxComm *c) {
  if (c) x->comm = *c;
  else {
    memset(&x->comm, 0, sizeof x->comm);
    for (int i = 0; i < IRG_COUNT; i++) x->comm.size[i] = 1;
  }
}

/* Host staging buffer `which` of at least n floats. */
static float *staging(DevExec *x, int which, int64_t n) {
  size_t want = (size_t)(n > 0 ? n : 1);
  if (x->host_cap[which] < want) {
    float *p = realloc(x->host[which], sizeof(float) * want);
    if (!p) {
      fail(x, "out of host memory for a collective's %zu values", want);
      return NULL;
    }
    x->host[which] = p;
    x->host_cap[which] = want;
  }
  return x->host[which];
}

/* interp_chunk_copy on the device: `parts` chunks of members first,
 * first + 1, ... along `axis` of the local value `node` (its dims), between
 * global and local (the parts one after another). */
static int chunk_copy(DevExec *x, const IrNode *node, int64_t axis, int64_t layout, int first, int size, int parts,
                      void *global, void *local, int to_global) {
  if (!x->chunk_copy && !(x->chunk_copy = x->dev->ops->kernel(x->dev, "hpdl_chunk_copy_f32")))
    return fail(x, "%s (recompile the artifact: its module has no hpdl_chunk_copy_f32)", dev_error(x->dev));
  int64_t outer = 1, inner = 1, len = node->dims[axis];
  for (int64_t i = 0; i < axis; i++) outer *= node->dims[i];
  for (int i = (int)axis + 1; i < node->rank; i++) inner *= node->dims[i];
  DevKctx c = kctx(x, 0);
  void *args[10] = {(void *)(intptr_t)outer, (void *)(intptr_t)len,   (void *)(intptr_t)inner, (void *)(intptr_t)layout,
                    (void *)(intptr_t)first, (void *)(intptr_t)size,  (void *)(intptr_t)parts, global,
                    local,                   (void *)(intptr_t)to_global};
  if (x->dev->ops->launch(x->dev, x->chunk_copy, capped_grid(outer * len * inner * parts, 1024), 256, &c, args, 10))
    return fail(x, "a collective's chunks: %s", dev_error(x->dev));
  return 0;
}

/* Whether member k's chunk along `axis` of a value of dims `node` is one
 * block of memory (nothing outside the axis before it, no zigzag). */
static int chunk_contiguous(const IrNode *node, int64_t axis, int64_t layout) {
  for (int64_t i = 0; i < axis; i++)
    if (node->dims[i] != 1) return 0;
  return layout == 0;
}

/* A collective of the chunk on the device's own buffers (DevxComm's
 * device_buffers: NCCL), the same results as run_comm's through the host;
 * run_comm has checked the types and copied what a group of one leaves as
 * it is. */
static int run_comm_device(DevExec *x, const IrGraph *g, const IrNode *n, void *const *val, void *out) {
  int grp = (int)n->attr[0];
  const IrNode *in = n->nin > 0 ? &g->nodes[n->in[0]] : n;
  void *X = n->nin > 0 ? val[n->in[0]] : NULL;
  int64_t N = ir_numel(n), NX = ir_numel(in);
  const char *op = ir_op_name(n->op), *gname = ir_group_name((IrGroup)grp);
  int size = x->comm.size[grp] > 0 ? x->comm.size[grp] : 1, rank = x->comm.rank[grp];
  Device *d = x->dev;
  char why[512] = "";
  int rc = 0;
  void *tmp = NULL, *tmp2 = NULL;
  size_t bytes = sizeof(float) * (size_t)N, xbytes = sizeof(float) * (size_t)NX;
  switch (n->op) {
  case IR_SEND: rc = x->comm.send(x->comm.ctx, grp, (int)n->attr[1], X, NX, why, sizeof why); break;
  case IR_RECV: rc = x->comm.recv(x->comm.ctx, grp, (int)n->attr[1], out, N, why, sizeof why); break;
  case IR_ALL_REDUCE:
    if (out != X && d->ops->copy(d, out, X, bytes)) return fail(x, "%s: %s", op, dev_error(d));
    rc = x->comm.all_reduce(x->comm.ctx, grp, (int)n->attr[2], out, N, why, sizeof why);
    break;
  case IR_SHARD_SLICE:
    if (NX != N * size) return fail(x, "shard_slice over %s: %" PRId64 " values do not split %d ways", gname, NX, size);
    return chunk_copy(x, n, n->attr[1], n->attr[2], rank, size, 1, X, out, 0);
  case IR_ALL_GATHER:
    if (N != NX * size) return fail(x, "all_gather over %s: the result is not %d times the input", gname, size);
    if (chunk_contiguous(in, n->attr[1], n->attr[2])) {
      rc = x->comm.all_gather(x->comm.ctx, grp, X, NX, out, why, sizeof why);
      break;
    }
    if (!(tmp = pool_get(x, bytes))) return fail(x, "%s: out of device memory", op);
    rc = x->comm.all_gather(x->comm.ctx, grp, X, NX, tmp, why, sizeof why);
    if (!rc && chunk_copy(x, in, n->attr[1], n->attr[2], 0, size, size, out, tmp, 1)) rc = -2;
    break;
  case IR_ALL_TO_ALL: {
    if (N != NX) return fail(x, "all_to_all over %s: the result is not the input's size", gname);
    IrNode piece = *in;
    piece.dims[n->attr[1]] /= size;
    if (!(tmp = pool_get(x, xbytes)) || !(tmp2 = pool_get(x, xbytes))) {
      fail(x, "%s: out of device memory", op);
      rc = -2;
      break;
    }
    /* member k's piece (split axis) to place k, exchanged, each received piece to its place on the concat axis */
    if (chunk_copy(x, &piece, n->attr[1], 0, 0, size, size, X, tmp, 0)) rc = -2;
    if (!rc) rc = x->comm.all_to_all(x->comm.ctx, grp, tmp, NX / size, tmp2, why, sizeof why);
    if (!rc && chunk_copy(x, &piece, n->attr[2], 0, 0, size, size, out, tmp2, 1)) rc = -2;
    break;
  }
  case IR_REDUCE_SCATTER:
    if (NX != N * size) return fail(x, "reduce_scatter over %s: the input is not %d times the result", gname, size);
    if (!x->comm.reduce_scatter) return fail(x, "reduce_scatter over %s of %d ranks: no collectives were set", gname, size);
    if (chunk_contiguous(n, n->attr[1], n->attr[2])) {
      rc = x->comm.reduce_scatter(x->comm.ctx, grp, X, N, out, why, sizeof why);
      break;
    }
    if (!(tmp = pool_get(x, xbytes))) return fail(x, "%s: out of device memory", op);
    if (chunk_copy(x, n, n->attr[1], n->attr[2], 0, size, size, X, tmp, 0)) rc = -2;
    if (!rc) rc = x->comm.reduce_scatter(x->comm.ctx, grp, tmp, N, out, why, sizeof why);
    break;
  default: return fail(x, "%s is not a collective", op);
  }
  if (tmp) pool_put(x, tmp, n->op == IR_ALL_GATHER ? bytes : xbytes);
  if (tmp2) pool_put(x, tmp2, xbytes);
  if (rc == -1) return fail(x, "%s over %s: %s", op, gname, why);
  return rc ? -1 : 0;
}

/* A collective of the chunk (core/interp.c's semantics, in fp32): the value
 * comes to host memory, goes through the DevxComm and back, unless the
 * DevxComm takes the device's buffers (run_comm_device). */
static int run_comm(DevExec *x, const IrGraph *g, const IrNode *n, void *const *val, void *out) {
  int grp = (int)n->attr[0];
  const IrNode *in = n->nin > 0 ? &g->nodes[n->in[0]] : n;
  const void *X = n->nin > 0 ? val[n->in[0]] : NULL;
  int64_t N = ir_numel(n), NX = ir_numel(in);
  const char *op = ir_op_name(n->op);
  if (grp < 0 || grp >= IRG_COUNT) return fail(x, "%s: no such group %d", op, grp);
  int size = x->comm.size[grp] > 0 ? x->comm.size[grp] : 1, rank = x->comm.rank[grp];
  const char *gname = ir_group_name((IrGroup)grp);
  Device *d = x->dev;
  size_t bytes = sizeof(float) * (size_t)N;
  int p2p = n->op == IR_SEND || n->op == IR_RECV;
  /* SEND reads its input and makes no value; RECV is a leaf that fills out */
  if (p2p && sem_dtype_bytes((n->op == IR_SEND ? in : n)->dtype) != 4)
    return fail(x, "%s over %s: the device's transfers move fp32", op, gname);
  if (!p2p && (n->dtype != in->dtype || sem_dtype_bytes(n->dtype) != 4))
    return fail(x, "%s over %s: a value of %d-byte elements; the device's collectives move fp32", op, gname,
                sem_dtype_bytes(n->dtype));
  int same = n->op == IR_COPY_TO_GROUP ||
             (size == 1 && (n->op == IR_ALL_REDUCE || n->op == IR_ALL_GATHER || n->op == IR_ALL_TO_ALL));
  if (same) return d->ops->copy(d, out, X, bytes) ? fail(x, "%s: %s", op, dev_error(d)) : 0;
  if (x->comm.device_buffers) return run_comm_device(x, g, n, val, out);
  if (p2p) {
    int send = n->op == IR_SEND;
    int64_t nv = ir_numel(send ? in : n);
    if (send ? !x->comm.send : !x->comm.recv) return fail(x, "%s over %s: no transfers were set", op, gname);
    float *h = staging(x, 0, nv);
    if (!h) return -1;
    char why[512] = "";
    if (send && x->dev->ops->to_host(x->dev, h, X, sizeof(float) * (size_t)nv)) return fail(x, "%s: %s", op, dev_error(x->dev));
    int offset = (int)n->attr[1];
    if ((send ? x->comm.send(x->comm.ctx, grp, offset, h, nv, why, sizeof why)
              : x->comm.recv(x->comm.ctx, grp, offset, h, nv, why, sizeof why)))
      return fail(x, "%s over %s: %s", op, gname, why);
    if (!send && x->dev->ops->to_device(x->dev, out, h, sizeof(float) * (size_t)nv)) return fail(x, "%s: %s", op, dev_error(x->dev));
    return 0;
  }
  char why[512] = "";
  float *hx = staging(x, 0, NX);
  if (!hx) return -1;
  if (d->ops->to_host(d, hx, X, sizeof(float) * (size_t)NX)) return fail(x, "%s: %s", op, dev_error(d));
  float *ho = hx;
  int rc = 0;
  switch (n->op) {
  case IR_ALL_REDUCE:
    if (!x->comm.all_reduce) return fail(x, "all_reduce over %s of %d ranks: no collectives were set", gname, size);
    rc = x->comm.all_reduce(x->comm.ctx, grp, (int)n->attr[2], hx, N, why, sizeof why);
    break;
  case IR_SHARD_SLICE:
    if (NX != N * size) return fail(x, "shard_slice over %s: %" PRId64 " values do not split %d ways", gname, NX, size);
    if (!(ho = staging(x, 1, N))) return -1;
    interp_chunk_copy(n, n->attr[1], (int)n->attr[2], rank, size, hx, ho, sizeof(float), 0);
    break;
  case IR_ALL_GATHER: {
    if (N != NX * size) return fail(x, "all_gather over %s: the result is not %d times the input", gname, size);
    if (!x->comm.all_gather) return fail(x, "all_gather over %s of %d ranks: no collectives were set", gname, size);
    float *all = staging(x, 1, N);
    if (!all || !(ho = malloc(bytes))) return all ? fail(x, "out of host memory") : -1;
    rc = x->comm.all_gather(x->comm.ctx, grp, hx, NX, all, why, sizeof why);
    for (int k = 0; k < size && !rc; k++)
      interp_chunk_copy(in, n->attr[1], (int)n->attr[2], k, size, ho, all + k * NX, sizeof(float), 1);
    break;
  }
  case IR_ALL_TO_ALL: {
    /* chunks along the split axis out, the received ones along the concat axis in */
    if (N != NX) return fail(x, "all_to_all over %s: the result is not the input's size", gname);
    if (!x->comm.all_to_all) return fail(x, "all_to_all over %s of %d ranks: no collectives were set", gname, size);
    float *send = staging(x, 1, NX);
    if (!send || !(ho = malloc(bytes))) return send ? fail(x, "out of host memory") : -1;
    interp_a2a_pack(in, n->attr[1], size, hx, send, sizeof(float));
    float *recv = hx; /* the input is packed: its buffer takes the received chunks */
    rc = x->comm.all_to_all(x->comm.ctx, grp, send, NX / size, recv, why, sizeof why);
    if (!rc) interp_a2a_unpack(in, n->attr[1], n->attr[2], size, recv, ho, sizeof(float));
    break;
  }
  case IR_REDUCE_SCATTER:
    if (NX != N * size) return fail(x, "reduce_scatter over %s: the input is not %d times the result", gname, size);
    if (!x->comm.all_reduce) return fail(x, "reduce_scatter over %s of %d ranks: no collectives were set", gname, size);
    rc = x->comm.all_reduce(x->comm.ctx, grp, 0, hx, NX, why, sizeof why);
    if (!rc && !(ho = staging(x, 1, N))) return -1;
    if (!rc) interp_chunk_copy(n, n->attr[1], (int)n->attr[2], rank, size, hx, ho, sizeof(float), 0);
    break;
  default: return fail(x, "%s is not a collective", op);
  }
  if (!rc && d->ops->to_device(d, out, ho, bytes)) rc = fail(x, "%s: %s", op, dev_error(d));
  else if (rc) rc = fail(x, "%s over %s: %s", op, gname, why);
  if (n->op == IR_ALL_GATHER || n->op == IR_ALL_TO_ALL) free(ho);
  return rc;
}

static double gemm_flops(const DevGemm *g);

void devx_set_tracer(DevExec *x, const DevxTracer *t) {
  if (t) x->tracer = *t;
  x->has_tracer = t != NULL;
}

void devx_set_host(DevExec *x, const DevxHost *h) {
  if (h) x->host_call = *h;
  else memset(&x->host_call, 0, sizeof x->host_call);
}

/* A "host" launch: the extern's buffers copied to the host, the native function called
 * through the program's hook, its result copied back. */
static int run_host(DevExec *x, int gi, int kp, const DevxLaunch *L, void **io) {
  const DevxKernel *K = &x->p->graphs[gi].kernels[kp];
  const IrGraph *g = x->p->m->graphs[gi];
  Device *d = x->dev;
  if (!x->host_call.call)
    return fail(x, "graph %s kernel %d (%s): an extern call, but the program set no host hook", g->name, kp, L->name);
  void *bufs[16];
  size_t bytes[16];
  int rc = 0, nb = 0;
  for (; nb < L->nhost_io && !rc; nb++) {
    int i = L->host_io[nb];
    int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
    bytes[nb] = value_bytes(&g->nodes[v]);
    bufs[nb] = malloc(bytes[nb] ? bytes[nb] : 1);
    if (!bufs[nb]) rc = fail(x, "%s: out of host memory for %zu bytes", L->name, bytes[nb]);
    /* the last buffer is the one the function writes (extcall zeroes a gradient's) */
    else if (nb < L->nhost_io - 1 && bytes[nb] && d->ops->to_host(d, bufs[nb], io[i], bytes[nb]))
      rc = fail(x, "%s: %s", L->name, dev_error(d));
  }
  char why[1024] = "";
  if (!rc && x->host_call.call(x->host_call.user, L->host_extern, L->host_grad, bufs, why, sizeof why))
    rc = fail(x, "graph %s kernel %d (%s): %s", g->name, kp, L->name, why);
  int last = L->nhost_io - 1;
  if (!rc && bytes[last] && d->ops->to_device(d, io[L->host_io[last]], bufs[last], bytes[last]))
    rc = fail(x, "%s: %s", L->name, dev_error(d));
  for (int b = 0; b < nb; b++) free(bufs[b]);
  return rc;
}

/* Zeroes experts [from, to) of a grouped weight gradient c ([E, X, Y], expert_bytes each). */
static int zero_experts(Device *d, void *c, int64_t from, int64_t to, size_t expert_bytes) {
  return to > from ? d->ops->zero(d, (char *)c + (size_t)from * expert_bytes, (size_t)(to - from) * expert_bytes) : 0;
}

/* A grouped GEMM (DevxLaunch.grouped): the rows' experts read back to the host
 * (which waits for the work queued before), then one GEMM a run of rows of one
 * expert - one an expert, the ids being sorted - on the io pointers moved to the
 * run's rows and the expert's matrix. GROUPED_MM_WGRAD's GEMM writes its
 * expert's gradient whole, so only the experts with no rows are zeroed (their
 * gradient is zero): zeroing all [E, X, Y] first wrote every expert's gradient
 * once more for each layer and micro-batch; its ids must ascend (a second run
 * of one expert would write over the first's sum). Megatron-Core's grouped MLP
 * reads its tokens per expert back alike. Each run length gets its own plan,
 * kept for the next steps. */
static int grouped_run(DevExec *x, const DevxLaunch *L, DevGemmPlan **by_rows, void **io, int nio) {
  Device *d = x->dev;
  const DevGemm *g = &L->gemm;
  int wgrad = L->grouped == 2;
  int64_t N = wgrad ? g->k : g->m, X = wgrad ? g->m : g->k, Y = g->n, E = L->experts;
  size_t ab = g->ab_bf16 ? 2 : 4;
  if (N > x->ids_cap) {
    int32_t *grown = realloc(x->ids_host, sizeof(int32_t) * (size_t)N);
    if (!grown) return fail(x, "out of host memory");
    x->ids_host = grown;
    x->ids_cap = N;
  }
  if (nio > x->io_plus_cap) {
    void **grown = realloc(x->io_plus, sizeof(void *) * (size_t)nio);
    if (!grown) return fail(x, "out of host memory");
    x->io_plus = grown;
    x->io_plus_cap = nio;
  }
  if (N > 0 && d->ops->to_host(d, x->ids_host, io[L->grouped_ids], sizeof(int32_t) * (size_t)N)) return -1;
  size_t expert_bytes = sizeof(float) * (size_t)(X * Y);
  int64_t next = 0; /* wgrad: the first expert not yet written or zeroed */
  void **io2 = x->io_plus;
  for (int64_t r0 = 0, r1; r0 < N; r0 = r1) {
    int32_t e = x->ids_host[r0];
    for (r1 = r0 + 1; r1 < N && x->ids_host[r1] == e; r1++) {
    }
    if (e < 0 || e >= E) return fail(x, "%s: row %lld's expert %d is outside [0, %lld)", L->name, (long long)r0, (int)e, (long long)E);
    if (wgrad) {
      if (e < next)
        return fail(x, "%s: row %lld's expert %d comes after expert %lld's rows (a weight gradient's experts must ascend)",
                    L->name, (long long)r0, (int)e, (long long)(next - 1));
      if (zero_experts(d, io[g->c], next, e, expert_bytes)) return -1;
      next = e + 1;
    }
    int64_t rows = r1 - r0;
    if (!by_rows[rows]) {
      DevGemm t = *g;
      if (wgrad) t.k = rows;
      else t.m = rows;
      if (!(by_rows[rows] = d->ops->gemm_plan(d, &t))) return -1;
    }
    memcpy(io2, io, sizeof(void *) * (size_t)nio);
    io2[g->a] = (char *)io[g->a] + (size_t)(r0 * X) * ab;
    if (wgrad) {
      io2[g->b] = (char *)io[g->b] + (size_t)(r0 * Y) * ab;
      io2[g->c] = (char *)io[g->c] + (size_t)(e * X * Y) * sizeof(float);
    } else {
      io2[g->b] = (char *)io[g->b] + (size_t)(e * X * Y) * ab;
      io2[g->c] = (char *)io[g->c] + (size_t)(r0 * Y) * sizeof(float);
    }
    if (d->ops->gemm(d, by_rows[rows], io2)) return -1;
  }
  if (wgrad && zero_experts(d, io[g->c], next, E, expert_bytes)) return -1;
  return 0;
}

static int run_launches(DevExec *x, int gi, int kp, int64_t layer, void **io) {
  const DevxKernel *K = &x->p->graphs[gi].kernels[kp];
  const KernelRes *R = &x->res[gi][kp];
  DevKctx c = kctx(x, layer);
  int nio = K->ninputs + K->noutputs;
  for (int l = 0; l < K->nlaunches; l++) {
    const DevxLaunch *L = &K->launches[l];
    int timed = x->profile || x->has_tracer;
    double t0 = timed ? x->dev->ops->seconds(x->dev) : 0;
    if (L->is_host) {
      if (run_host(x, gi, kp, L, io)) return -1;
    } else {
      int rc;
      if (L->grouped) rc = grouped_run(x, L, R->by_rows[l], io, nio);
      else if (L->is_gemm && R->apart[l] == APART_BIAS16) rc = bias16_apart(x, R->plans[l], &L->gemm, io, nio);
      else if (L->is_gemm) rc = x->dev->ops->gemm(x->dev, R->plans[l], io);
      else rc = x->dev->ops->launch(x->dev, R->k[l], L->grid, L->block, &c, io, nio);
      if (!rc && L->is_gemm && R->apart[l] == APART_BGRAD) rc = bias_grad_apart(x, &L->gemm, io);
      if (rc) return fail(x, "graph %s kernel %d (%s): %s", x->p->m->graphs[gi]->name, kp, L->name, dev_error(x->dev));
    }
    if (timed) {
      double dt = x->dev->ops->seconds(x->dev) - t0;
      if (x->profile) {
        R->secs[l] += dt;
        R->calls[l]++;
      }
      if (x->has_tracer) x->tracer.launch(x->tracer.user, gi, layer, L, dt, L->is_gemm ? gemm_flops(&L->gemm) : L->flops);
    }
  }
  return 0;
}

void devx_profile(DevExec *x, int on) { x->profile = on; }

typedef struct {
  const DevxLaunch *L;
  double secs;
  long calls;
} ProfRow;

static int by_time(const void *a, const void *b) {
  double d = ((const ProfRow *)b)->secs - ((const ProfRow *)a)->secs;
  return d > 0 ? 1 : d < 0 ? -1 : 0;
}

static double gemm_flops(const DevGemm *g) {
  double nb = 1;
  for (int i = 0; i < g->batch_axes; i++) nb *= (double)g->bdims[i];
  return 2.0 * (double)g->m * (double)g->n * (double)g->k * nb;
}

/* "  123 GB/s (45% of copy)" for b bytes in secs, or nothing */
static void print_bandwidth(FILE *out, double bytes, double secs, double ref_bps) {
  if (bytes <= 0 || secs <= 0) return;
  fprintf(out, "  %.0f GB/s", bytes / secs * 1e-9);
  if (ref_bps > 0) fprintf(out, " (%.0f%% of copy)", 100 * bytes / secs / ref_bps);
}

void devx_profile_report(const DevExec *x, FILE *out, int top, int steps, double ref_bps) {
  int n = 0;
  for (int g = 0; g < x->p->ngraphs; g++)
    for (int k = 0; k < x->p->graphs[g].nkernels; k++) n += x->p->graphs[g].kernels[k].nlaunches;
  ProfRow *rows = calloc((size_t)n + 1, sizeof *rows);
  int nr = 0;
  double total = 0;
  for (int g = 0; g < x->p->ngraphs; g++)
    for (int k = 0; k < x->p->graphs[g].nkernels; k++) {
      const DevxKernel *K = &x->p->graphs[g].kernels[k];
      for (int l = 0; l < K->nlaunches; l++) {
        rows[nr++] = (ProfRow){&K->launches[l], x->res[g][k].secs[l], x->res[g][k].calls[l]};
        total += x->res[g][k].secs[l];
      }
    }
  qsort(rows, (size_t)nr, sizeof *rows, by_time);
  double per = steps > 0 ? 1.0 / steps : 1.0;
  /* per family; the bandwidth over its launches that know their bytes */
  const char *fam[32];
  double fsec[32], fbytes[32], fbsec[32];
  long fcalls[32];
  int nf = 0;
  for (int i = 0; i < nr; i++) {
    int f = 0;
    while (f < nf && strcmp(fam[f], rows[i].L->kind)) f++;
    if (f == nf && nf < 32) {
      fam[nf] = rows[i].L->kind;
      fsec[nf] = fbytes[nf] = fbsec[nf] = 0;
      fcalls[nf++] = 0;
    }
    if (f < nf) {
      fsec[f] += rows[i].secs;
      fcalls[f] += rows[i].calls;
      if (rows[i].L->bytes > 0) {
        fbytes[f] += rows[i].L->bytes * (double)rows[i].calls;
        fbsec[f] += rows[i].secs;
      }
    }
  }
  fprintf(out, "profile: %.2f ms a step in %d launches (each timed alone)", 1e3 * total * per, nr);
  if (ref_bps > 0) fprintf(out, "; a device copy moves %.0f GB/s (read + write)", ref_bps * 1e-9);
  fputc('\n', out);
  for (int f = 0; f < nf; f++) {
    fprintf(out, "  %-10s %8.2f ms %5.1f%%  %6ld launches a step", fam[f], 1e3 * fsec[f] * per,
            total > 0 ? 100 * fsec[f] / total : 0, (long)(fcalls[f] * per));
    if (fbsec[f] > 0) {
      fprintf(out, ";%s", fbsec[f] < fsec[f] * 0.999 ? " one-launch kernels" : "");
      print_bandwidth(out, fbytes[f], fbsec[f], ref_bps);
    }
    fputc('\n', out);
  }
  fprintf(out, "  top launches: ms a step, share, calls a step, achieved\n");
  for (int i = 0; i < nr && i < top; i++) {
    const DevxLaunch *L = rows[i].L;
    fprintf(out, "  %-34s %-8s %8.3f ms %5.1f%% %5ld", L->name, L->kind, 1e3 * rows[i].secs * per,
            total > 0 ? 100 * rows[i].secs / total : 0, (long)(rows[i].calls * per));
    if (L->is_gemm && rows[i].secs > 0)
      fprintf(out, "  %lldx%lldx%lld%s%s%s x%lld %.1f TFLOP/s", (long long)L->gemm.m, (long long)L->gemm.n,
              (long long)L->gemm.k, L->gemm.trans_a ? " A^T" : "", L->gemm.trans_b ? " B^T" : "",
              L->gemm.ab_bf16 ? (L->gemm.c_bf16 ? " bf16" : " bf16->f32") : "",
              (long long)(gemm_flops(&L->gemm) / (2.0 * (double)L->gemm.m * (double)L->gemm.n * (double)L->gemm.k)),
              gemm_flops(&L->gemm) * (double)rows[i].calls / rows[i].secs * 1e-12);
    else {
      fprintf(out, "  grid %u x %u", L->grid, L->block);
      if (L->flops > 0 && rows[i].secs > 0) fprintf(out, "  %.1f TFLOP/s", L->flops * (double)rows[i].calls / rows[i].secs * 1e-12);
      print_bandwidth(out, L->bytes * (double)rows[i].calls, rows[i].secs, ref_bps);
    }
    fputc('\n', out);
  }
  free(rows);
}

int devx_run_kernel(DevExec *x, int graph, int kernel, int64_t layer, void **io) {
  return run_launches(x, graph, kernel, layer, io);
}

/* The bf16 copies of unit `unit`'s parameters (-1: every unit; one launch
 * over the block where it is whole); a unit not gathered (ZeRO-3) is left
 * for its turn. */
static int round16(DevExec *x, const void *src, void *dst, int64_t n) {
  DevKctx k = kctx(x, 0);
  void *args[3] = {(void *)src, dst, (void *)(intptr_t)n};
  if (x->dev->ops->launch(x->dev, x->round_bf16, capped_grid(n, 1024), 256, &k, args, 3))
    return fail(x, "the weights' bf16 copies: %s", dev_error(x->dev));
  return 0;
}

static int refresh16(DevExec *x, int unit) {
  if (!x->round_bf16) return 0; /* no weight read in bf16 */
  if (unit < 0 && x->flat_x16 && round16(x, x->flat_xp, x->flat_x16, x->xlen)) return -1;
  if (unit < 0 && x->flat_p && x->flat16) return round16(x, x->flat_p, x->flat16, x->flat_len);
  for (int u = unit < 0 ? 0 : unit; u < (unit < 0 ? x->nunits : unit + 1); u++) {
    int64_t n = x->ustart[u + 1] - x->ustart[u];
    const void *src = x->flat_p ? (const void *)((float *)x->flat_p + x->ustart[u]) : x->u32[u];
    void *dst = x->flat16 ? (void *)((uint16_t *)x->flat16 + x->ustart[u]) : x->u16[u];
    if (src && dst && n > 0 && round16(x, src, dst, n)) return -1;
  }
  return 0;
}

int devx_round16(DevExec *x, const float *src, void *dst, int64_t n) { return x->round_bf16 ? round16(x, src, dst, n) : fail(x, "no weight is read in bf16"); }

int devx_take(DevExec *x, const float *src, const int64_t *idx, float *dst, int64_t n) {
  if (n <= 0) return 0;
  if (!x->take && !(x->take = x->dev->ops->kernel(x->dev, "hpdl_take_f32")))
    return fail(x, "%s (recompile the artifact: its module has no hpdl_take_f32)", dev_error(x->dev));
  DevKctx k = kctx(x, 0);
  void *args[4] = {(void *)src, (void *)idx, dst, (void *)(intptr_t)n};
  if (x->dev->ops->launch(x->dev, x->take, capped_grid(n, 1024), 256, &k, args, 4)) return fail(x, "a gather by index: %s", dev_error(x->dev));
  return 0;
}

int devx_refresh16(DevExec *x) { return refresh16(x, -1); }
int devx_refresh16_unit(DevExec *x, int unit) { return refresh16(x, unit); }

static int accumulate(DevExec *x, float *dst, const void *src, int64_t n) {
  DevKctx c = kctx(x, 0);
  void *args[3] = {(void *)src, dst, (void *)(intptr_t)n};
  if (x->dev->ops->launch(x->dev, x->accumulate, capped_grid(n, 1024), 256, &c, args, 3))
    return fail(x, "gradient accumulation: %s", dev_error(x->dev));
  return 0;
}

int devx_add(DevExec *x, float *dst, const float *src, int64_t n) { return n > 0 ? accumulate(x, dst, src, n) : 0; }

static int run_graph(DevExec *x, int gi, int64_t layer, void **args, void **outs);

/* A CALL node: its callee `count` times over the layers, carrying output 0
 * into argument 0; the result (the last carry) is copied into out. */
static int run_call(DevExec *x, const IrGraph *g, const IrNode *n, void **val, Stash *stash, int *nstash, void *out) {
  const IrModule *m = x->p->m;
  int callee = (int)n->attr[0];
  int64_t count = n->attr[1], mode = n->attr[2], first = n->attr[3];
  const IrGraph *cg = m->graphs[callee];
  void **outs = calloc((size_t)cg->noutputs + 1, sizeof(void *));
  void *carry = NULL;
  size_t carry_bytes = value_bytes(&cg->nodes[cg->outputs[0]]);
  int rc = 0;
  if (mode == IR_CALL_PLAIN || mode == IR_CALL_SAVE) {
    int nargs = n->nin;
    void **args = calloc((size_t)nargs + 1, sizeof(void *));
    for (int k = 0; k < nargs; k++) args[k] = val[n->in[k]];
    Stash *st = NULL;
    if (mode == IR_CALL_SAVE) {
      st = &stash[(*nstash)++];
      st->node = (int)(n - g->nodes);
      st->count = count;
      st->per = nargs + cg->noutputs - 1;
      st->t = calloc((size_t)(count * st->per) + 1, sizeof(void *));
      st->bytes = calloc((size_t)st->per + 1, sizeof(size_t));
      for (int k = 0; k < nargs; k++) st->bytes[k] = value_bytes(&g->nodes[n->in[k]]);
      for (int k = 1; k < cg->noutputs; k++) st->bytes[nargs + k - 1] = value_bytes(&cg->nodes[cg->outputs[k]]);
    }
    for (int64_t l = 0; l < count && !rc; l++) {
      if (st)
        for (int k = 0; k < nargs && !rc; k++) {
          void *c = pool_get(x, st->bytes[k]);
          if (!c || x->dev->ops->copy(x->dev, c, args[k], st->bytes[k])) rc = c ? fail(x, "%s", dev_error(x->dev)) : -1;
          st->t[l * st->per + k] = c;
        }
      if (rc || (rc = layer_hook(x, first + l, DEVX_LAYER_FWD_BEGIN)) || (rc = run_graph(x, callee, first + l, args, outs)) ||
          (rc = layer_hook(x, first + l, DEVX_LAYER_FWD_END)))
        break;
      pool_put(x, carry, carry_bytes);
      carry = outs[0];
      args[0] = carry;
      for (int k = 1; k < cg->noutputs; k++) {
        if (st) st->t[l * st->per + nargs + k - 1] = outs[k];
        else pool_put(x, outs[k], value_bytes(&cg->nodes[cg->outputs[k]]));
      }
    }
    free(args);
  } else {
    Stash *st = NULL;
    for (int i = 0; i < *nstash; i++)
      if (stash[i].node == n->in[1]) st = &stash[i];
    if (!st || st->count != count) {
      free(outs);
      return fail(x, "backward call of %s: nothing saved", cg->name);
    }
    void **args = calloc((size_t)st->per + 2, sizeof(void *));
    args[0] = val[n->in[0]];
    for (int64_t l = count - 1; l >= 0 && !rc; l--) {
      for (int k = 0; k < st->per; k++) args[1 + k] = st->t[l * st->per + k];
      if ((rc = layer_hook(x, first + l, DEVX_LAYER_BWD_BEGIN)) || (rc = run_graph(x, callee, first + l, args, outs)) ||
          (rc = layer_hook(x, first + l, DEVX_LAYER_BWD_END)))
        break;
      pool_put(x, carry, carry_bytes);
      carry = outs[0];
      args[0] = carry;
      for (int k = 1; k < cg->noutputs; k++) pool_put(x, outs[k], value_bytes(&cg->nodes[cg->outputs[k]]));
      for (int k = 0; k < st->per; k++) {
        pool_put(x, st->t[l * st->per + k], st->bytes[k]);
        st->t[l * st->per + k] = NULL;
      }
    }
    free(args);
  }
  if (!rc && carry && x->dev->ops->copy(x->dev, out, carry, value_bytes(n))) rc = fail(x, "%s", dev_error(x->dev));
  pool_put(x, carry, carry_bytes);
  free(outs);
  return rc;
}

/* Runs graph gi at `layer` on args (device pointers); outs[k] receive pool
 * buffers with its plain outputs (the caller returns them to the pool);
 * gradient outputs are added into the gradient buffers. */
/* One run of a graph: its values, those it owns, the layers a SAVE call
 * stashed, and the next kernel to run, so that a pipeline step can run its
 * forward half and, later, its backward half. */
struct DevxFrame {
  int gi;
  int64_t layer;
  void **args;
  void **val;
  char *own;
  Stash *stash;
  int nstash;
  int next;
  void **inputs; /* the frame's own copies of the model inputs, or NULL: the DevExec's */
  void *seed;    /* a step's: its argument 0 (the loss's gradient seed) */
  void *step_args[2]; /* a step's arguments (args points here): the seed */
};

static DevxFrame *frame_open(DevExec *x, int gi, int64_t layer, void **args) {
  const IrGraph *g = x->p->m->graphs[gi];
  DevxFrame *F = calloc(1, sizeof *F);
  if (!F) return NULL;
  F->gi = gi;
  F->layer = layer;
  F->args = args;
  F->val = calloc((size_t)g->nnodes + 1, sizeof(void *));
  F->own = calloc((size_t)g->nnodes + 1, 1);
  F->stash = calloc((size_t)g->nnodes + 1, sizeof(Stash));
  if (!F->val || !F->own || !F->stash) {
    free(F->val);
    free(F->own);
    free(F->stash);
    free(F);
    return NULL;
  }
  return F;
}

/* Whether kernel K of graph g is one VOCAB_MASK (no tensor group) of a value
 * of its own type read directly (ir_vocab_mask_in_place): its generated kernel also runs
 * in place, filling the padded columns alone when its two pointers are one. */
static int vmask_kernel(const IrGraph *g, const DevxKernel *K) {
  return K->kind == DEVX_RUN && K->ninputs == 1 && K->noutputs == 1 && ir_vocab_mask_in_place(g, K->inputs[0], K->outputs[0]);
}

/* Each value's buffer (root: views, a collective unit's folded reshapes, a
 * SEND and an in-place kernel's output alias their input 0) and the last
 * kernel that reads it or an alias of it; the graph's outputs live to the
 * frame's end (nk: frame_outputs reads them). */
static void value_uses(const IrGraph *g, const DevxGraph *G, const char *inplace, int *root, int *last) {
  int n = g->nnodes, nk = G->nkernels;
  for (int i = 0; i < n; i++) root[i] = i, last[i] = -1;
#define DEVX_USE(v, k) (last[root[v]] = last[root[v]] > (k) ? last[root[v]] : (k))
  for (int k = 0; k < nk; k++) {
    const DevxKernel *K = &G->kernels[k];
    if (inplace[k]) root[K->outputs[0]] = root[K->inputs[0]];
    for (int j = 0; j < K->ninputs; j++) DEVX_USE(K->inputs[j], k);
    for (int j = 0; j < K->noutputs; j++) DEVX_USE(K->outputs[j], k);
    if (K->aux_node >= 0 && g->nodes[K->aux_node].nin > 1) DEVX_USE(g->nodes[K->aux_node].in[1], k); /* the loss it reads after */
    for (int j = 0; j < K->nnodes; j++) {
      int v = K->nodes[j];
      const IrNode *nd = &g->nodes[v];
      int alias = K->kind == DEVX_VIEW || (K->kind == DEVX_COMM && ((nd->op == IR_RESHAPE && nd->nin == 1) || nd->op == IR_SEND));
      if (alias && nd->nin > 0) root[v] = root[nd->in[0]];
      for (int i = 0; i < nd->nin; i++) DEVX_USE(nd->in[i], k);
      DEVX_USE(v, k);
    }
  }
#undef DEVX_USE
  for (int k = 0; k < g->noutputs; k++)
    if (g->outputs[k] >= 0) last[root[g->outputs[k]]] = nk;
}

/* The values of graph gi whose buffers die after each of its kernels, and
 * the kernels that run in place (the padded logits' mask over the GEMM's
 * product where nothing reads that after it). So a frame returns a buffer to
 * the pool as soon as it is dead rather than at its end, and a later
 * kernel's output of the same size takes it (the kernels run in order on one
 * stream, so no reader is still running). */
static int dead_values(DevExec *x, int gi) {
  if (x->dies[gi]) return 0;
  const IrGraph *g = x->p->m->graphs[gi];
  const DevxGraph *G = &x->p->graphs[gi];
  int n = g->nnodes, nk = G->nkernels;
  int *root = malloc(sizeof(int) * (size_t)(n + 1)), *last = malloc(sizeof(int) * (size_t)(n + 1));
  int *at = calloc((size_t)nk + 2, sizeof(int)), *dies = malloc(sizeof(int) * (size_t)(n + 1));
  char *inplace = calloc((size_t)nk + 1, 1), *run_made = calloc((size_t)n + 1, 1);
  int *fill = calloc((size_t)nk + 1, sizeof(int));
  if (!root || !last || !at || !dies || !inplace || !run_made || !fill) {
    free(root), free(last), free(at), free(dies), free(inplace), free(run_made), free(fill);
    return fail(x, "out of host memory");
  }
  value_uses(g, G, inplace, root, last);
  /* in place where the mask's input is a kernel's own output (a buffer the frame owns) that dies there */
  for (int k = 0; k < nk; k++) {
    const DevxKernel *K = &G->kernels[k];
    if (vmask_kernel(g, K) && run_made[K->inputs[0]] && root[K->inputs[0]] == K->inputs[0] && last[K->inputs[0]] == k)
      inplace[k] = 1;
    for (int j = 0; K->kind == DEVX_RUN && j < K->noutputs; j++) run_made[K->outputs[j]] = 1;
  }
  value_uses(g, G, inplace, root, last);
  for (int i = 0; i < n; i++)
    if (root[i] == i && last[i] >= 0 && last[i] < nk) at[last[i] + 1]++;
  for (int k = 0; k < nk; k++) at[k + 1] += at[k];
  for (int i = 0; i < n; i++)
    if (root[i] == i && last[i] >= 0 && last[i] < nk) dies[at[last[i]] + fill[last[i]]++] = i;
  free(fill);
  free(root);
  free(last);
  free(run_made);
  x->dies[gi] = dies;
  x->dies_at[gi] = at;
  x->inplace[gi] = inplace;
  return 0;
}

/* Runs kernels [F->next, to) of the frame's graph. */
static int frame_run(DevExec *x, DevxFrame *F, int to) {
  const IrModule *m = x->p->m;
  const DevxGraph *G = &x->p->graphs[F->gi];
  const IrGraph *g = m->graphs[F->gi];
  int gi = F->gi, rc = 0;
  int64_t layer = F->layer;
  void **val = F->val, **args = F->args;
  char *own = F->own;
  if (dead_values(x, gi)) return -1;
  const int *dies = x->dies[gi], *dies_at = x->dies_at[gi];
  const char *inplace = x->inplace[gi];
  for (int p = F->next; p < to && !rc; p++) {
    const DevxKernel *K = &G->kernels[p];
    switch (K->kind) {
    case DEVX_VIEW:
      for (int j = 0; j < K->nnodes; j++) val[K->nodes[j]] = val[g->nodes[K->nodes[j]].in[0]];
      break;
    case DEVX_LEAF: {
      int id = K->nodes[0];
      const IrNode *n = &g->nodes[id];
      int64_t k = n->attr[0];
      if (n->op == IR_INPUT) val[id] = F->inputs ? F->inputs[k] : x->inputs[k];
      else if (n->op == IR_ARG) val[id] = args[k];
      else if (n->op == IR_PARAM) {
        const IrParam *P = &m->params[k];
        int64_t copy = P->count > 1 ? layer : 0;
        if (n->dtype != P->dtype) /* its bf16 copy (devx_refresh16) */
          val[id] = copy16(x, (int)k, copy);
        else
          val[id] = x->pat[x->goff[k] + copy];
        /* (a PARAM no kernel reads - precision.c's fp32 one of a weight read as
         * bf16 - may have no fp32 values: ZeRO-3's bf16 gathers) */
        if (!val[id] && K->noutputs > 0)
          rc = fail(x, "parameter %s, layer %lld is not gathered on this rank (ZeRO-3: a read outside its layer)", P->name,
                    (long long)copy);
      } else {
        /* a fill, iota or constant: its kernel when it has one (a kernel
         * that reads it inline never looks at the buffer) */
        val[id] = pool_get(x, value_bytes(n));
        own[id] = 1;
        if (!val[id]) rc = -1;
        else if (n->op == IR_LOSS_SEED && x->dev->ops->to_device(x->dev, val[id], &x->loss_seed, sizeof(float)))
          rc = fail(x, "loss_seed: %s", dev_error(x->dev));
        else if (n->op == IR_TRAINING && x->dev->ops->to_device(x->dev, val[id], &x->training, sizeof(float)))
          rc = fail(x, "training: %s", dev_error(x->dev));
        else if (K->nlaunches) rc = run_launches(x, gi, p, layer, &val[id]);
      }
      break;
    }
    case DEVX_CALL: {
      int id = K->nodes[0];
      val[id] = pool_get(x, value_bytes(&g->nodes[id]));
      own[id] = 1;
      rc = val[id] ? run_call(x, g, &g->nodes[id], val, F->stash, &F->nstash, val[id]) : -1;
      break;
    }
    case DEVX_COMM: {
      /* views the fuser folded into the unit (a RESHAPE of its input) alias their input;
       * the other node is the collective */
      int id = K->nodes[0];
      for (int j = 0; j < K->nnodes; j++) {
        const IrNode *v = &g->nodes[K->nodes[j]];
        if (v->op == IR_RESHAPE && v->nin == 1) val[K->nodes[j]] = val[v->in[0]];
        else id = K->nodes[j];
      }
      if (g->nodes[id].op == IR_SEND) { /* its value is its input's (core/interp.c) */
        rc = run_comm(x, g, &g->nodes[id], val, NULL);
        val[id] = val[g->nodes[id].in[0]];
        break;
      }
      val[id] = pool_get(x, value_bytes(&g->nodes[id]));
      own[id] = 1;
      rc = val[id] ? run_comm(x, g, &g->nodes[id], val, val[id]) : -1;
      break;
    }
    case DEVX_RUN: {
      int nio = K->ninputs + K->noutputs;
      void **io = calloc((size_t)nio + 1, sizeof(void *));
      for (int j = 0; j < K->ninputs; j++) io[j] = val[K->inputs[j]];
      for (int j = 0; j < K->noutputs && !rc; j++) {
        int v = K->outputs[j];
        if (inplace[p]) { /* the input's buffer, which dies here (dead_values) */
          val[v] = io[K->ninputs + j] = io[0];
          continue;
        }
        val[v] = pool_get(x, value_bytes(&g->nodes[v]));
        own[v] = 1;
        io[K->ninputs + j] = val[v];
        if (!val[v]) rc = -1;
      }
      if (!rc) rc = run_launches(x, gi, p, layer, io);
      free(io);
      if (!rc && K->aux_node >= 0 && hostop_aux_counted(g, K->aux_node)) {
        /* the auxiliary loss of a forward: weight x its scalar, to the host */
        const IrNode *an = &g->nodes[K->aux_node];
        float v = 0;
        if (x->dev->ops->to_host(x->dev, &v, val[an->in[1]], sizeof v)) rc = fail(x, "aux_loss: %s", dev_error(x->dev));
        x->aux_sum += an->fattr * (double)v;
        x->aux_seen = 1;
      }
      break;
    }
    }
    F->next = p + 1;
    for (int d = dies_at[p]; d < dies_at[p + 1] && !rc; d++)
      if (own[dies[d]]) {
        pool_put(x, val[dies[d]], value_bytes(&g->nodes[dies[d]]));
        own[dies[d]] = 0;
        val[dies[d]] = NULL;
      }
  }
  return rc;
}

/* Returns the frame's buffers to the pool and frees it. */
static void frame_free(DevExec *x, DevxFrame *F) {
  if (!F) return;
  const IrModule *m = x->p->m;
  const IrGraph *g = m->graphs[F->gi];
  for (int i = 0; i < g->nnodes; i++)
    if (F->own[i]) pool_put(x, F->val[i], value_bytes(&g->nodes[i]));
  for (int i = 0; i < F->nstash; i++) {
    for (int64_t k = 0; F->stash[i].t && k < F->stash[i].count * F->stash[i].per; k++)
      pool_put(x, F->stash[i].t[k], F->stash[i].bytes[k % F->stash[i].per]);
    free(F->stash[i].t);
    free(F->stash[i].bytes);
  }
  for (int i = 0; F->inputs && i < m->ninputs; i++) pool_put(x, F->inputs[i], input_bytes(&m->inputs[i]));
  if (F->seed) pool_put(x, F->seed, sizeof(float));
  free(F->inputs);
  free(F->stash);
  free(F->own);
  free(F->val);
  free(F);
}

/* The graph's outputs: the plain ones copied into fresh pool buffers
 * (outs; the caller returns them), the gradient outputs added into the
 * gradient buffers. */
static int frame_outputs(DevExec *x, DevxFrame *F, void **outs) {
  const IrModule *m = x->p->m;
  const IrGraph *g = m->graphs[F->gi];
  int nplain = g->noutputs - g->ngrad_params, rc = 0;
  for (int k = 0; k < g->noutputs && !rc; k++) {
    const IrNode *o = &g->nodes[g->outputs[k]];
    if (k < nplain) {
      outs[k] = pool_get(x, value_bytes(o));
      if (!outs[k] || x->dev->ops->copy(x->dev, outs[k], F->val[g->outputs[k]], value_bytes(o)))
        rc = outs[k] ? fail(x, "%s", dev_error(x->dev)) : -1;
      continue;
    }
    int pi = g->grad_params[k - nplain];
    const IrParam *P = &m->params[pi];
    int64_t copy = P->count > 1 ? F->layer : 0, numel = ir_numel(o);
    if (!x->gat[x->goff[pi] + copy])
      rc = fail(x, "the gradient of %s, layer %lld, has no buffer on this rank now (ZeRO: an addition outside its layer)", P->name,
                (long long)copy);
    else rc = accumulate(x, x->gat[x->goff[pi] + copy], F->val[g->outputs[k]], numel);
    if (!rc && x->gcur) {
      int64_t at = x->goff[pi] + copy, n = ++x->gcur[at];
      char why[600] = "";
      if (x->garmed && n == x->gtotal[at] && x->ready(x->ready_ctx, pi, copy, why, sizeof why))
        rc = fail(x, "the reduction of %s's gradient (copy %" PRId64 "): %s", P->name, copy, why);
    }
  }
  return rc;
}

int devx_set_grad_ready(DevExec *x, DevxGradReady fn, void *ctx) {
  x->ready = fn;
  x->ready_ctx = ctx;
  x->gknown = x->garmed = 0;
  if (!fn) return 0;
  int64_t n = x->gn;
  free(x->gcur);
  free(x->gtotal);
  x->gcur = calloc((size_t)n + 1, sizeof(int64_t));
  x->gtotal = calloc((size_t)n + 1, sizeof(int64_t));
  return x->gcur && x->gtotal ? 0 : fail(x, "out of host memory");
}

void devx_micro_begin(DevExec *x, int last) {
  if (!x->gcur) return;
  memset(x->gcur, 0, sizeof(int64_t) * (size_t)x->gn);
  x->garmed = last && x->gknown;
}

int devx_micro_end(DevExec *x) {
  if (!x->gcur) return 0;
  const IrModule *m = x->p->m;
  int64_t n = x->gn, any = 0;
  for (int64_t i = 0; i < n; i++) any |= x->gcur[i];
  int armed = x->garmed;
  x->garmed = 0;
  if (!any) return 0; /* no backward ran (an evaluation) */
  if (!x->gknown) {
    memcpy(x->gtotal, x->gcur, sizeof(int64_t) * (size_t)n);
    x->gknown = 1;
    return 0;
  }
  for (int p = 0; p < m->nparams; p++)
    for (int64_t c = 0; c < ir_param_copies(&m->params[p]); c++)
      if (x->gcur[x->goff[p] + c] != x->gtotal[x->goff[p] + c]) {
        x->gknown = 0; /* no early reductions from here on */
        if (armed)
          return fail(x, "the gradient of %s (copy %" PRId64 ") had %" PRId64 " additions in the last micro-batch, %" PRId64
                         " in the first: its reduction may have started early",
                      m->params[p].name, c, x->gcur[x->goff[p] + c], x->gtotal[x->goff[p] + c]);
      }
  return 0;
}

int devx_grad_ready_known(const DevExec *x) { return x->gknown; }

/* Runs graph gi (copy `layer`) on args; outs receives pool buffers with
 * its plain outputs (the caller returns them to the pool); gradient
 * outputs are added into the gradient buffers. */
static int run_graph(DevExec *x, int gi, int64_t layer, void **args, void **outs) {
  DevxFrame *F = frame_open(x, gi, layer, args);
  if (!F) return fail(x, "out of host memory");
  int rc = frame_run(x, F, x->p->graphs[gi].nkernels);
  if (!rc) rc = frame_outputs(x, F, outs);
  frame_free(x, F);
  return rc;
}

/* The step's seed argument in device memory. */
static void *seed_buffer(DevExec *x, float seed) {
  void *d = pool_get(x, sizeof(float));
  if (d && x->dev->ops->to_device(x->dev, d, &seed, sizeof seed)) {
    fail(x, "%s", dev_error(x->dev));
    pool_put(x, d, sizeof(float));
    return NULL;
  }
  return d;
}

/* The loss (output 0) to the host, the plain outputs back to the pool. */
static int step_loss(DevExec *x, int graph, void **outs, int rc, float *loss) {
  const IrGraph *g = x->p->m->graphs[graph];
  if (!rc && loss && x->dev->ops->to_host(x->dev, loss, outs[0], sizeof(float))) rc = fail(x, "%s", dev_error(x->dev));
  for (int k = 0; k < g->noutputs - g->ngrad_params; k++) pool_put(x, outs[k], value_bytes(&g->nodes[g->outputs[k]]));
  free(outs);
  return rc;
}

void devx_set_evaluating(DevExec *x, int on) { x->training = on ? 0.0f : 1.0f; }

int devx_step(DevExec *x, int graph, float seed, float *loss) {
  const IrGraph *g = x->p->m->graphs[graph];
  x->loss_seed = seed;
  void *dseed = seed_buffer(x, seed);
  if (!dseed) return -1;
  void *args[2] = {dseed, NULL};
  void **outs = calloc((size_t)g->noutputs + 1, sizeof(void *));
  int rc = run_graph(x, graph, 0, args, outs);
  pool_put(x, dseed, sizeof(float));
  return step_loss(x, graph, outs, rc, loss);
}

int devx_take_aux(DevExec *x, double *sum) {
  int seen = x->aux_seen;
  *sum = x->aux_sum;
  x->aux_sum = 0;
  x->aux_seen = 0;
  return seen;
}

DevxFrame *devx_step_forward(DevExec *x, int graph, float seed) {
  const IrModule *m = x->p->m;
  int cut = x->p->graphs[graph].cut;
  if (cut < 0) {
    fail(x, "graph %s is not cut into a forward and a backward half (recompile the artifact)", m->graphs[graph]->name);
    return NULL;
  }
  DevxFrame *F = frame_open(x, graph, 0, NULL);
  if (!F) {
    fail(x, "out of host memory");
    return NULL;
  }
  F->args = F->step_args;
  x->loss_seed = seed;
  F->inputs = calloc((size_t)m->ninputs + 1, sizeof(void *));
  int rc = !F->inputs ? fail(x, "out of host memory") : 0;
  if (!rc && !(F->seed = seed_buffer(x, seed))) rc = -1;
  F->step_args[0] = F->seed;
  /* the micro-batch's inputs are the frame's: the next forward overwrites the DevExec's */
  for (int i = 0; i < m->ninputs && !rc; i++) {
    size_t bytes = input_bytes(&m->inputs[i]);
    F->inputs[i] = pool_get(x, bytes);
    if (!F->inputs[i] || x->dev->ops->copy(x->dev, F->inputs[i], x->inputs[i], bytes))
      rc = F->inputs[i] ? fail(x, "%s", dev_error(x->dev)) : -1;
  }
  if (!rc) rc = frame_run(x, F, cut);
  if (rc) {
    frame_free(x, F);
    return NULL;
  }
  return F;
}

int devx_step_backward(DevExec *x, DevxFrame *F, float *loss) {
  const IrGraph *g = x->p->m->graphs[F->gi];
  int graph = F->gi;
  int rc = frame_run(x, F, x->p->graphs[F->gi].nkernels);
  void **outs = calloc((size_t)g->noutputs + 1, sizeof(void *));
  if (!rc) rc = frame_outputs(x, F, outs);
  frame_free(x, F);
  return step_loss(x, graph, outs, rc, loss);
}

void devx_frame_drop(DevExec *x, DevxFrame *F) { frame_free(x, F); }
