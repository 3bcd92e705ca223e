/* devoptim.c - the optimizer on a device (devoptim.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devoptim.h"
#include "hpdl_optim.cuh"

struct DevOptim {
  Device *dev;
  DevOptKind kind;
  int momentum;
  int moments16; /* the moments in bf16: 2 bytes a value (alloc's zeros are bf16's too) */
  int n;
  int64_t *numel;
  void **m, **v; /* per tensor, NULL where not kept */
  unsigned char *lent; /* per tensor: its moments are the caller's (DevOptTensor.m, v) */
  long long nchunks;
  int *chunk_tensor; /* per chunk: its tensor */
  void *table;       /* device: nchunks hpdl_optim_chunk */
  void *sums;        /* device: nchunks doubles */
  double *host_sums;
  DevKernel *k_step, *k_sumsq;
  char err[1200];
};

static int fail(DevOptim *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(DevOptim *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->err, sizeof o->err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *devopt_error(const DevOptim *o) { return o->err; }

void devopt_free(DevOptim *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) {
    if (o->lent && o->lent[i]) continue;
    if (o->m && o->m[i]) o->dev->ops->release(o->dev, o->m[i]);
    if (o->v && o->v[i]) o->dev->ops->release(o->dev, o->v[i]);
  }
  free(o->lent);
  if (o->table) o->dev->ops->release(o->dev, o->table);
  if (o->sums) o->dev->ops->release(o->dev, o->sums);
  free(o->m);
  free(o->v);
  free(o->numel);
  free(o->chunk_tensor);
  free(o->host_sums);
  free(o);
}

DevOptim *devopt_new(Device *dev, DevOptKind kind, int momentum, int moments16, const DevOptTensor *t, int n, char *err,
                     size_t errlen) {
  DevOptim *o = calloc(1, sizeof *o);
  hpdl_optim_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
  if (!o || !ts) {
    snprintf(err, errlen, "out of memory");
    free(o);
    free(ts);
    return NULL;
  }
  o->dev = dev;
  o->kind = kind;
  o->momentum = momentum;
  o->moments16 = moments16;
  o->n = n;
  o->numel = calloc((size_t)n + 1, sizeof(int64_t));
  o->m = calloc((size_t)n + 1, sizeof(void *));
  o->v = calloc((size_t)n + 1, sizeof(void *));
  o->lent = calloc((size_t)n + 1, 1);
  int rc = !o->numel || !o->m || !o->v || !o->lent ? fail(o, "out of memory") : 0;
  for (int i = 0; i < n && !rc; i++) {
    size_t bytes = (moments16 ? 2 : sizeof(float)) * (size_t)(t[i].numel > 0 ? t[i].numel : 1);
    o->numel[i] = t[i].numel;
    if (t[i].m) { /* the caller's (its moments zeroed or set by it) */
      o->lent[i] = 1;
      o->m[i] = kind == DEVOPT_ADAMW || momentum ? t[i].m : NULL;
      o->v[i] = kind == DEVOPT_ADAMW ? t[i].v : NULL;
    } else {
      if (kind == DEVOPT_ADAMW || momentum) o->m[i] = dev->ops->alloc(dev, bytes);
      if (kind == DEVOPT_ADAMW) o->v[i] = dev->ops->alloc(dev, bytes);
    }
    if ((kind == DEVOPT_ADAMW || momentum) && (!o->m[i] || (kind == DEVOPT_ADAMW && !o->v[i])))
      rc = fail(o, "the optimizer's moments: %s", dev_error(dev));
    ts[i] = (hpdl_optim_tensor){t[i].p, t[i].g, o->m[i], o->v[i], t[i].numel, t[i].decay};
  }
  if (!rc) {
    o->nchunks = hpdl_optim_count_chunks(ts, n, HPDL_OPTIM_CHUNK);
    hpdl_optim_chunk *rows = calloc((size_t)o->nchunks + 1, sizeof *rows);
    o->chunk_tensor = calloc((size_t)o->nchunks + 1, sizeof(int));
    o->host_sums = calloc((size_t)o->nchunks + 1, sizeof(double));
    if (!rows || !o->chunk_tensor || !o->host_sums) rc = fail(o, "out of memory");
    else if (hpdl_optim_build_chunks(ts, n, HPDL_OPTIM_CHUNK, rows) != o->nchunks) rc = fail(o, "the chunk table does not add up");
    long long c = 0;
    for (int i = 0; i < n && !rc; i++)
      for (int64_t off = 0; off < t[i].numel; off += HPDL_OPTIM_CHUNK) o->chunk_tensor[c++] = i;
    if (!rc) {
      size_t tb = sizeof *rows * (size_t)(o->nchunks ? o->nchunks : 1);
      o->table = dev->ops->alloc(dev, tb);
      o->sums = dev->ops->alloc(dev, sizeof(double) * (size_t)(o->nchunks ? o->nchunks : 1));
      if (!o->table || !o->sums || dev->ops->to_device(dev, o->table, rows, tb))
        rc = fail(o, "the optimizer's table: %s", dev_error(dev));
    }
    free(rows);
  }
  if (!rc) {
    const char *step = kind == DEVOPT_ADAMW ? (moments16 ? "hpdl_adamw_bf16m" : "hpdl_adamw_f32")
                                            : (moments16 ? "hpdl_sgd_bf16m" : "hpdl_sgd_f32");
    o->k_step = dev->ops->kernel(dev, step);
    o->k_sumsq = o->k_step ? dev->ops->kernel(dev, "hpdl_sumsq_f32") : NULL;
    if (!o->k_step || !o->k_sumsq)
      rc = fail(o, "the optimizer's kernels: %s (an artifact of an older hpdlc: recompile it)", dev_error(dev));
  }
  free(ts);
  if (rc) {
    snprintf(err, errlen, "%s", o->err);
    devopt_free(o);
    return NULL;
  }
  return o;
}

int devopt_sumsq(DevOptim *o, double *per_tensor) {
  for (int i = 0; i < o->n; i++) per_tensor[i] = 0;
  if (!o->nchunks) return 0;
  long long nc = o->nchunks;
  void *params[3] = {&o->table, &nc, &o->sums};
  Device *d = o->dev;
  if (d->ops->launch_raw(d, o->k_sumsq, hpdl_optim_grid(nc), HPDL_OPTIM_THREADS, params) ||
      d->ops->to_host(d, o->host_sums, o->sums, sizeof(double) * (size_t)nc))
    return fail(o, "the gradient norm: %s", dev_error(d));
  for (long long c = 0; c < nc; c++) per_tensor[o->chunk_tensor[c]] += o->host_sums[c];
  return 0;
}

static int launch_step(DevOptim *o, void *args) {
  if (!o->nchunks) return 0;
  long long nc = o->nchunks;
  void *params[3] = {&o->table, &nc, args};
  if (o->dev->ops->launch_raw(o->dev, o->k_step, hpdl_optim_grid(nc), HPDL_OPTIM_THREADS, params))
    return fail(o, "the optimizer step: %s", dev_error(o->dev));
  return 0;
}

int devopt_adamw(DevOptim *o, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
                 double clip_scale) {
  if (o->kind != DEVOPT_ADAMW) return fail(o, "an AdamW step of an SGD optimizer");
  hpdl_adamw_args a = hpdl_adamw_make_args(lr, beta1, beta2, eps, weight_decay, (long long)t, clip_scale);
  return launch_step(o, &a);
}

int devopt_sgd(DevOptim *o, double lr, double momentum, double weight_decay, int64_t t, double clip_scale) {
  if (o->kind != DEVOPT_SGD) return fail(o, "an SGD step of an AdamW optimizer");
  hpdl_sgd_args a = hpdl_sgd_make_args(lr, momentum, weight_decay, (long long)t, clip_scale);
  return launch_step(o, &a);
}

int devopt_moment(DevOptim *o, int i, int which, float *host, int to_device) {
  if (i < 0 || i >= o->n) return fail(o, "no tensor %d", i);
  void *buf = which ? o->v[i] : o->m[i];
  int64_t n = o->numel[i];
  size_t bytes = sizeof(float) * (size_t)n;
  if (!buf) {
    if (!to_device) memset(host, 0, bytes);
    return 0;
  }
  Device *d = o->dev;
  int rc = o->moments16          ? dev_copy_bf16(d, buf, host, n, to_device)
           : to_device            ? d->ops->to_device(d, buf, host, bytes)
                                  : d->ops->to_host(d, host, buf, bytes);
  if (rc) return fail(o, "the optimizer's moments: %s", dev_error(d));
  return 0;
}
