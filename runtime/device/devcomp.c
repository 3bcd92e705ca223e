/* devcomp.c - the data-parallel sums of 16-bit compressed gradients on a
 * device's buffers (devcomp.h). */
#include "devcomp.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct DevComp {
  Device *dev;
  int bf16;
  DevKctx kctx;
  DevKernel *k_compress, *k_sum, *k_copy;
  float *residual; /* device, NULL without error feedback */
  int64_t residual_len;
  /* the batch's regions: cap bytes of device memory, used up to `used` */
  unsigned char *buf;
  int64_t cap, used;
  void *last_stream; /* the stream the last batch's exchanges ran on */
  long calls;
  int64_t values;
  char err[1200];
};

enum { ALIGN = 256 };

static int fail(DevComp *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(DevComp *z, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(z->err, sizeof z->err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *devz_error(const DevComp *z) { return z->err; }

static int64_t aligned(int64_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }

static unsigned grid_of(int64_t n) {
  int64_t blocks = (n + 1023) / 1024;
  return (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

DevComp *devz_new(Device *dev, int bf16, int64_t residual, char *err, size_t errlen) {
  DevComp *z = calloc(1, sizeof *z);
  if (!z) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  z->dev = dev;
  z->bf16 = bf16;
  static const char *const names[3] = {"hpdl_compress16_f32", "hpdl_sum16_f32", "hpdl_copy_f32"};
  DevKernel **k[3] = {&z->k_compress, &z->k_sum, &z->k_copy};
  for (int i = 0; i < 3; i++)
    if (!(*k[i] = dev->ops->kernel(dev, names[i]))) {
      snprintf(err, errlen, "%s (recompile the artifact: its module has no %s)", dev_error(dev), names[i]);
      free(z);
      return NULL;
    }
  if (residual > 0) {
    if (!(z->residual = dev->ops->alloc(dev, sizeof(float) * (size_t)residual))) {
      snprintf(err, errlen, "error feedback's residual (%" PRId64 " values): %s", residual, dev_error(dev));
      free(z);
      return NULL;
    }
    z->residual_len = residual;
  }
  return z;
}

void devz_free(DevComp *z) {
  if (!z) return;
  if (z->residual) z->dev->ops->release(z->dev, z->residual);
  if (z->buf) z->dev->ops->release(z->dev, z->buf);
  free(z);
}

void devz_counts(const DevComp *z, long *calls, int64_t *values) {
  *calls = z ? z->calls : 0;
  *values = z ? z->values : 0;
}

int64_t devz_all_reduce_bytes(int64_t n, int members, int rs) {
  if (!rs) return aligned(2 * n) + aligned(2 * n * members);
  int64_t slice = (n + members - 1) / members, all = slice * members;
  return 2 * aligned(2 * all) + aligned(4 * slice) + aligned(4 * all);
}

int64_t devz_reduce_scatter_bytes(int64_t n, int members) { return 2 * aligned(2 * n * members); }

int devz_batch(DevComp *z, int64_t bytes) {
  Device *d = z->dev;
  if (z->last_stream && d->ops->stream_wait(d, NULL, z->last_stream))
    return fail(z, "the compressed sums' buffers: %s", dev_error(d));
  z->last_stream = NULL;
  z->used = 0;
  if (bytes <= z->cap) return 0;
  /* a larger region: what may still read the old one finishes first */
  if (z->buf && d->ops->sync(d) < 0) return fail(z, "the compressed sums' buffers: %s", dev_error(d));
  if (z->buf) d->ops->release(d, z->buf);
  z->cap = 0;
  if (!(z->buf = d->ops->alloc(d, (size_t)bytes)))
    return fail(z, "%" PRId64 " bytes of device memory for the compressed sums: %s", bytes, dev_error(d));
  z->cap = bytes;
  return 0;
}

static void *take(DevComp *z, int64_t bytes) {
  if (z->used + aligned(bytes) > z->cap) return NULL;
  void *p = z->buf + z->used;
  z->used += aligned(bytes);
  return p;
}

static int no_room(DevComp *z, int64_t want) {
  return fail(z, "the compressed sums' batch is out of room (%" PRId64 " of %" PRId64 " bytes used, %" PRId64 " more wanted)",
              z->used, z->cap, want);
}

static int launch(DevComp *z, void *stream, DevKernel *k, int64_t n, void **args, int nargs, const char *what) {
  if (n <= 0) return 0;
  if (z->dev->ops->launch_on(z->dev, stream, k, grid_of(n), 256, &z->kctx, args, nargs))
    return fail(z, "%s: %s", what, dev_error(z->dev));
  return 0;
}

/* n values of x rounded to 16 bits into out (the launch stream). */
static int compress(DevComp *z, const float *x, int64_t n, int64_t residual_at, unsigned short *out) {
  float *r = NULL;
  if (z->residual) {
    if (residual_at < 0 || residual_at + n > z->residual_len)
      return fail(z, "compression: values [%" PRId64 ", %" PRId64 ") outside the residual's %" PRId64, residual_at,
                  residual_at + n, z->residual_len);
    r = z->residual + residual_at;
  }
  void *args[5] = {(void *)x, r, out, (void *)(intptr_t)n, (void *)(intptr_t)z->bf16};
  z->calls++;
  z->values += n;
  return launch(z, NULL, z->k_compress, n, args, 5, "rounding the gradients to 16 bits");
}

static int sum(DevComp *z, const DevzWay *w, const unsigned short *in, int64_t n, int64_t stride, float *out) {
  void *args[6] = {(void *)in, out, (void *)(intptr_t)n, (void *)(intptr_t)stride, (void *)(intptr_t)w->members,
                   (void *)(intptr_t)z->bf16};
  return launch(z, w->stream, z->k_sum, n, args, 6, "summing the 16-bit gradients");
}

static int exchange(DevComp *z, const DevzWay *w, DevzHow how, int esize, const void *in, int64_t count, void *out) {
  char err[1000] = "";
  if (w->exchange(w->ctx, how, esize, in, count, out, w->stream, err, sizeof err)) return fail(z, "%s", err);
  if (w->stream) z->last_stream = w->stream;
  return 0;
}

int devz_all_reduce(DevComp *z, const DevzWay *w, int rs, float *buf, int64_t n, int64_t residual_at) {
  int members = w->members;
  if (n <= 0) return 0;
  if (!rs) { /* every member's 16-bit values gathered, each member summing them all */
    unsigned short *pay = take(z, 2 * n), *got = pay ? take(z, 2 * n * members) : NULL;
    if (!got) return no_room(z, devz_all_reduce_bytes(n, members, rs));
    if (compress(z, buf, n, residual_at, pay) || exchange(z, w, DEVZ_ALL_GATHER, 1, pay, 2 * n, got)) return -1;
    return sum(z, w, got, n, n, buf);
  }
  /* the padded values' reduce-scatter, then the fp32 sums all-gathered */
  int64_t slice = (n + members - 1) / members, all = slice * members;
  unsigned short *pay = take(z, 2 * all), *got = pay ? take(z, 2 * all) : NULL;
  float *mine = got ? take(z, 4 * slice) : NULL, *whole = mine ? take(z, 4 * all) : NULL;
  if (!whole) return no_room(z, devz_all_reduce_bytes(n, members, rs));
  Device *d = z->dev;
  /* the padding: +0 in 16 bits, as comm.c's zeros round (their residual stays 0) */
  if (all > n && d->ops->zero(d, pay + n, 2 * (size_t)(all - n))) return fail(z, "%s", dev_error(d));
  if (compress(z, buf, n, residual_at, pay) || exchange(z, w, DEVZ_ALL_TO_ALL, 1, pay, 2 * slice, got) ||
      sum(z, w, got, slice, slice, mine) || exchange(z, w, DEVZ_ALL_GATHER, 4, mine, slice, whole))
    return -1;
  void *args[3] = {whole, buf, (void *)(intptr_t)n};
  return launch(z, w->stream, z->k_copy, n, args, 3, "the summed gradients back");
}

int devz_reduce_scatter(DevComp *z, const DevzWay *w, const float *in, int64_t n, float *out, int64_t residual_at) {
  int members = w->members;
  if (n <= 0) return 0;
  unsigned short *pay = take(z, 2 * n * members), *got = pay ? take(z, 2 * n * members) : NULL;
  if (!got) return no_room(z, devz_reduce_scatter_bytes(n, members));
  if (compress(z, in, n * members, residual_at, pay) || exchange(z, w, DEVZ_ALL_TO_ALL, 1, pay, 2 * n, got)) return -1;
  return sum(z, w, got, n, n, out);
}
