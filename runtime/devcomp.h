/* devcomp.h - the data-parallel sums of gradients compressed to 16 bits
 * (compression = bf16 | fp16) on a device's buffers, bit for bit what
 * comm.c's comm_allreduce_compressed and comm_reduce_scatter_compressed
 * compute in host memory, so a resident program (program_cuda.c) keeps its
 * gradients on the device under compression.
 *
 * The three steps are those of comm.c: each member rounds its values plus
 * error feedback's residual to 16 bits (kernels/hpdl_cuda.cuh's
 * hpdl_compress16_f32, the residual kept on the device), the 16-bit values
 * go to the members summing them (all-to-all; an all-reduce over fewer than
 * COMM_COMPRESS_RS_FROM members all-gathers them instead), which add them
 * in fp32 in member order (hpdl_sum16_f32); an all-reduce from
 * COMM_COMPRESS_RS_FROM members on then all-gathers the fp32 sums. Every
 * value's result is that order of fp32 additions of the same roundings, so
 * the bits do not depend on how the values are cut into calls.
 *
 * The collectives: NCCL on the device's buffers, queued on a stream after
 * the rounding (the summing kernels follow on that stream), or any Comm in
 * host memory through a staging buffer (the emulated device, no NCCL).
 * The buffers: one region per call out of a batch (devz_batch) that keeps
 * the last batch's stream waited for before it is reused. */
#ifndef HPDL_DEVCOMP_H
#define HPDL_DEVCOMP_H

#include <stdint.h>

#include "comm.h"
#include "device.h"
#include "rt.h"

typedef struct DevComp DevComp;

/* How the exchange goes: comm's group g, NCCL on device buffers (nccl 1,
 * on `stream`; NULL: the launch stream) or in host memory (nccl 0). */
typedef struct {
  Comm *comm;
  CommGroup group;
  int nccl;
  void *stream;
} DevzWay;

/* kind: COMM_COMPRESS_BF16 or COMM_COMPRESS_FP16; residual: error
 * feedback's, this many values (zero at first), or 0 for none. The three
 * kernels are looked up in the device's loaded modules. NULL with why. */
DevComp *devz_new(Device *dev, CommCompressKind kind, int64_t residual, const DevKctx *kctx, char *err, size_t errlen);
void devz_free(DevComp *z);

/* The device bytes a call of n values over `members` needs in a batch. */
int64_t devz_all_reduce_bytes(int64_t n, int members);
int64_t devz_reduce_scatter_bytes(int64_t n, int members);

/* Starts a batch of calls needing `bytes` in all (the sums of the above):
 * the launch stream waits for the stream of the last batch first (its
 * exchanges may still read the regions). */
int devz_batch(DevComp *z, int64_t bytes, RtErr *e);

/* buf[0..n) summed over the group in place (the rounding on the launch
 * stream, the rest on w->stream); its residual at residual_at (ignored
 * without error feedback). */
int devz_all_reduce(DevComp *z, const DevzWay *w, float *buf, int64_t n, int64_t residual_at, RtErr *e);
/* in holds members x n values (member m's part at m n); out receives this
 * member's n of their sums (out may lie inside in); the residual of in's
 * values at residual_at. */
int devz_reduce_scatter(DevComp *z, const DevzWay *w, const float *in, int64_t n, float *out, int64_t residual_at, RtErr *e);

/* Calls and values (members x n) compressed so far (HPDL_PROFILE). */
void devz_counts(const DevComp *z, long *calls, int64_t *values);

#endif
