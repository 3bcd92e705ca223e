/* devcomp.h - the data-parallel sums of gradients compressed to 16 bits
 * (compression = bf16 | fp16) on a device's buffers, bit for bit what the
 * runtime's comm.c computes in host memory (comm_allreduce_compressed,
 * comm_reduce_scatter_compressed), so a resident program (program_cuda.c)
 * keeps its gradients on the device under compression.
 *
 * The three steps are comm.c's: each member rounds its values plus error
 * feedback's residual to 16 bits (kernels/hpdl_cuda.cuh's
 * hpdl_compress16_f32, the residual kept on the device), the 16-bit values
 * go to the members summing them (an all-to-all; an all-reduce over few
 * members all-gathers them instead), which add them in fp32 in member order
 * (hpdl_sum16_f32); an all-reduce in the reduce-scatter form then
 * all-gathers the fp32 sums. Every value's result is that order of fp32
 * additions of the same roundings, so the bits do not depend on how the
 * values are cut into calls.
 *
 * The exchanges are the caller's (DevzWay.exchange: NCCL on the device's
 * buffers, or a Comm through host memory); the rounding runs on the launch
 * stream, the exchanges and the kernels after them on DevzWay.stream. The
 * buffers: one region per call out of a batch (devz_batch), which first has
 * the launch stream wait for the last batch's stream. Errors: -1 and one
 * line in devz_error(). */
#ifndef HPDL_DEVCOMP_H
#define HPDL_DEVCOMP_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"

typedef struct DevComp DevComp;

typedef enum { DEVZ_ALL_TO_ALL, DEVZ_ALL_GATHER } DevzHow;

/* An exchange among the members of device buffers, `count` elements of
 * `esize` bytes (1: the 16-bit values as bytes; 4: fp32 sums) a member:
 * all-to-all (in holds members x count, out receives members x count) or
 * all-gather (in holds count). It runs after everything launched so far and
 * before what `stream` runs next. 0, or -1 with why in err. */
typedef int (*DevzExchange)(void *ctx, DevzHow how, int esize, const void *in, int64_t count, void *out, void *stream,
                            char *err, size_t errlen);

typedef struct {
  DevzExchange exchange;
  void *ctx;
  int members;
  void *stream; /* the exchanges' and the kernels after them (NULL: the launch stream) */
} DevzWay;

/* bf16 (else fp16); residual: error feedback's, this many values (zero at
 * first), 0 for none. The kernels are looked up in the device's loaded
 * modules. NULL with why in err. */
DevComp *devz_new(Device *dev, int bf16, int64_t residual, char *err, size_t errlen);
void devz_free(DevComp *z);
const char *devz_error(const DevComp *z);

/* The device bytes a call of n values over `members` needs in a batch; rs:
 * the all-reduce in the reduce-scatter form (comm.c's COMM_COMPRESS_RS_FROM). */
int64_t devz_all_reduce_bytes(int64_t n, int members, int rs);
int64_t devz_reduce_scatter_bytes(int64_t n, int members);

/* Starts a batch of calls needing `bytes` in all (the sums of the above):
 * the launch stream waits for the stream of the last batch first (its
 * exchanges may still read the regions). */
int devz_batch(DevComp *z, int64_t bytes);

/* buf[0..n) summed over the members in place (rs: the reduce-scatter form);
 * its residual at residual_at (ignored without error feedback). */
int devz_all_reduce(DevComp *z, const DevzWay *w, int rs, float *buf, int64_t n, int64_t residual_at);
/* in holds members x n values (member m's part at m n); out receives this
 * member's n of their sums (out may lie inside in); the residual of in's
 * values at residual_at. */
int devz_reduce_scatter(DevComp *z, const DevzWay *w, const float *in, int64_t n, float *out, int64_t residual_at);

/* Calls and values (members x n) compressed so far (HPDL_PROFILE). */
void devz_counts(const DevComp *z, long *calls, int64_t *values);

#endif
