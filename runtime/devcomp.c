/* devcomp.c - the data-parallel sums of 16-bit compressed gradients on a
 * device's buffers (devcomp.h). */
#include "devcomp.h"

#include <inttypes.h>
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
  void *last_stream; /* the stream the last batch's calls queued on */
  int waited;        /* this batch waited for it */
  unsigned char *host; /* staging for exchanges in host memory */
  int64_t host_cap;
  long calls;
  int64_t values;
};

enum { ALIGN = 256 };

static int64_t aligned(int64_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }

static unsigned grid_of(int64_t n) {
  int64_t blocks = (n + 1023) / 1024;
  return (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

DevComp *devz_new(Device *dev, CommCompressKind kind, int64_t residual, const DevKctx *kctx, char *err, size_t errlen) {
  if (kind != COMM_COMPRESS_BF16 && kind != COMM_COMPRESS_FP16) {
    snprintf(err, errlen, "compression %s is not computed on a device (bf16 and fp16 are)", comm_compress_name(kind));
    return NULL;
  }
  DevComp *z = calloc(1, sizeof *z);
  if (!z) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  z->dev = dev;
  z->bf16 = kind == COMM_COMPRESS_BF16;
  if (kctx) z->kctx = *kctx;
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
  free(z->host);
  free(z);
}

void devz_counts(const DevComp *z, long *calls, int64_t *values) {
  *calls = z ? z->calls : 0;
  *values = z ? z->values : 0;
}

/* An all-reduce over fewer than COMM_COMPRESS_RS_FROM members all-gathers
 * the 16-bit values (comm.c does the same). */
static int gathers_halves(int members) { return members < COMM_COMPRESS_RS_FROM; }

int64_t devz_all_reduce_bytes(int64_t n, int members) {
  if (gathers_halves(members)) return aligned(2 * n) + aligned(2 * n * members);
  int64_t slice = (n + members - 1) / members, all = slice * members;
  return 2 * aligned(2 * all) + aligned(4 * slice) + aligned(4 * all);
}

int64_t devz_reduce_scatter_bytes(int64_t n, int members) { return 2 * aligned(2 * n * members); }

int devz_batch(DevComp *z, int64_t bytes, RtErr *e) {
  Device *d = z->dev;
  if (z->last_stream && d->ops->stream_wait(d, NULL, z->last_stream))
    return rt_fail(e, "the compressed sums' buffers: %s", dev_error(d));
  z->last_stream = NULL;
  z->used = 0;
  if (bytes <= z->cap) return 0;
  /* a larger region: what may still read the old one finishes first */
  if (z->buf && (d->ops->sync(d) < 0)) return rt_fail(e, "the compressed sums' buffers: %s", dev_error(d));
  if (z->buf) d->ops->release(d, z->buf);
  z->cap = 0;
  if (!(z->buf = d->ops->alloc(d, (size_t)bytes)))
    return rt_fail(e, "%" PRId64 " bytes of device memory for the compressed sums: %s", bytes, dev_error(d));
  z->cap = bytes;
  return 0;
}

static void *take(DevComp *z, int64_t bytes) {
  if (z->used + aligned(bytes) > z->cap) return NULL;
  void *p = z->buf + z->used;
  z->used += aligned(bytes);
  return p;
}

static int launch(DevComp *z, void *stream, DevKernel *k, int64_t n, void **args, int nargs, const char *what, RtErr *e) {
  if (n <= 0) return 0;
  if (z->dev->ops->launch_on(z->dev, stream, k, grid_of(n), 256, &z->kctx, args, nargs))
    return rt_fail(e, "%s: %s", what, dev_error(z->dev));
  return 0;
}

/* members x n values of x rounded to 16 bits into out (launch stream). */
static int compress(DevComp *z, const float *x, int64_t n, int64_t residual_at, unsigned short *out, RtErr *e) {
  float *r = NULL;
  if (z->residual) {
    if (residual_at < 0 || residual_at + n > z->residual_len)
      return rt_fail(e, "compression: values [%" PRId64 ", %" PRId64 ") outside the residual's %" PRId64, residual_at,
                     residual_at + n, z->residual_len);
    r = z->residual + residual_at;
  }
  void *args[5] = {(void *)x, r, out, (void *)(intptr_t)n, (void *)(intptr_t)z->bf16};
  z->calls++;
  z->values += n;
  return launch(z, NULL, z->k_compress, n, args, 5, "rounding the gradients to 16 bits", e);
}

static int sum(DevComp *z, const DevzWay *w, const unsigned short *in, int64_t n, int64_t stride, int members, float *out,
               RtErr *e) {
  void *args[6] = {(void *)in, out, (void *)(intptr_t)n, (void *)(intptr_t)stride, (void *)(intptr_t)members,
                   (void *)(intptr_t)z->bf16};
  return launch(z, w->stream, z->k_sum, n, args, 6, "summing the 16-bit gradients", e);
}

enum { X_ALL_TO_ALL, X_ALL_GATHER };

/* An exchange of `count` elements of type t a member (all-to-all: in holds
 * members x count, out receives members x count; all-gather: in holds
 * count): NCCL on the device's buffers on w->stream after the launch
 * stream, or through host memory. */
static int exchange(DevComp *z, const DevzWay *w, int how, CommType t, const void *in, int64_t count, void *out, RtErr *e) {
  Device *d = z->dev;
  int members = w->comm->size[w->group];
  int64_t esize = t == COMM_U8 ? 1 : 4, nin = (how == X_ALL_TO_ALL ? members : 1) * count * esize,
          nout = members * count * esize;
  if (w->nccl) {
    if (w->stream && d->ops->stream_wait(d, w->stream, NULL)) return rt_fail(e, "%s", dev_error(d));
    comm_nccl_set_stream(w->comm, w->stream);
    int rc = how == X_ALL_TO_ALL ? comm_all_to_all(w->comm, w->group, t, in, count, out, e)
                                 : comm_all_gather(w->comm, w->group, t, in, count, out, e);
    comm_nccl_set_stream(w->comm, NULL);
    z->last_stream = w->stream;
    return rc < 0 ? -1 : 0;
  }
  if (nin + nout > z->host_cap) {
    unsigned char *h = realloc(z->host, (size_t)(nin + nout));
    if (!h) return rt_fail(e, "out of memory for the compressed sums' staging (%" PRId64 " bytes)", nin + nout);
    z->host = h;
    z->host_cap = nin + nout;
  }
  if (d->ops->to_host(d, z->host, in, (size_t)nin)) return rt_fail(e, "the compressed gradients to the host: %s", dev_error(d));
  if ((how == X_ALL_TO_ALL ? comm_all_to_all(w->comm, w->group, t, z->host, count, z->host + nin, e)
                           : comm_all_gather(w->comm, w->group, t, z->host, count, z->host + nin, e)) < 0)
    return -1;
  if (d->ops->to_device(d, out, z->host + nin, (size_t)nout)) return rt_fail(e, "the compressed gradients to the device: %s", dev_error(d));
  return 0;
}

static int no_room(const DevComp *z, int64_t want, RtErr *e) {
  return rt_fail(e, "the compressed sums' batch is out of room (%" PRId64 " of %" PRId64 " bytes used, %" PRId64 " more wanted)",
                 z->used, z->cap, want);
}

int devz_all_reduce(DevComp *z, const DevzWay *w, float *buf, int64_t n, int64_t residual_at, RtErr *e) {
  int members = w->comm->size[w->group];
  if (n <= 0) return 0;
  if (gathers_halves(members)) {
    unsigned short *pay = take(z, 2 * n), *got = pay ? take(z, 2 * n * members) : NULL;
    if (!got) return no_room(z, devz_all_reduce_bytes(n, members), e);
    if (compress(z, buf, n, residual_at, pay, e) || exchange(z, w, X_ALL_GATHER, COMM_U8, pay, 2 * n, got, e)) return -1;
    return sum(z, w, got, n, n, members, buf, e);
  }
  /* the padded values' reduce-scatter, then the fp32 sums all-gathered */
  int64_t slice = (n + members - 1) / members, all = slice * members;
  unsigned short *pay = take(z, 2 * all), *got = pay ? take(z, 2 * all) : NULL;
  float *mine = got ? take(z, 4 * slice) : NULL, *whole = mine ? take(z, 4 * all) : NULL;
  if (!whole) return no_room(z, devz_all_reduce_bytes(n, members), e);
  Device *d = z->dev;
  /* the padding: +0 in 16 bits, as comm.c's zeros round (their residual stays 0) */
  if (all > n && d->ops->zero(d, pay + n, 2 * (size_t)(all - n))) return rt_fail(e, "%s", dev_error(d));
  if (compress(z, buf, n, residual_at, pay, e) || exchange(z, w, X_ALL_TO_ALL, COMM_U8, pay, 2 * slice, got, e) ||
      sum(z, w, got, slice, slice, members, mine, e) || exchange(z, w, X_ALL_GATHER, COMM_F32, mine, slice, whole, e))
    return -1;
  void *args[3] = {whole, buf, (void *)(intptr_t)n};
  return launch(z, w->stream, z->k_copy, n, args, 3, "the summed gradients back", e);
}

int devz_reduce_scatter(DevComp *z, const DevzWay *w, const float *in, int64_t n, float *out, int64_t residual_at, RtErr *e) {
  int members = w->comm->size[w->group];
  if (n <= 0) return 0;
  unsigned short *pay = take(z, 2 * n * members), *got = pay ? take(z, 2 * n * members) : NULL;
  if (!got) return no_room(z, devz_reduce_scatter_bytes(n, members), e);
  if (compress(z, in, n * members, residual_at, pay, e) || exchange(z, w, X_ALL_TO_ALL, COMM_U8, pay, 2 * n, got, e)) return -1;
  return sum(z, w, got, n, n, members, out, e);
}
