/* devoptim.h - the optimizer on a device: the parameters' moments kept in
 * device memory beside the parameters and gradients, the gradient norm's
 * sums of squares and the AdamW / SGD update as kernels/hpdl_optim.cuh's
 * multi-tensor launches (a table of 64K-element chunks built once), bit for
 * bit runtime/optim.c's update. Works on any device of device.h: the
 * kernels come with every stage's module (the CUDA back end includes
 * hpdl_optim.cuh), emulated or on a GPU. */
#ifndef HPDL_DEVOPTIM_H
#define HPDL_DEVOPTIM_H

#include <stdint.h>

#include "device.h"

typedef enum { DEVOPT_ADAMW, DEVOPT_SGD } DevOptKind;

/* One tensor (or a slice of one): its parameter and gradient in device
 * memory, and where its moments are to live: m and v the caller's device
 * memory (numel values each, of the optimizer's moment size: 4 bytes, or 2
 * with moments16; kept by the caller), or NULL to have them allocated here. */
typedef struct {
  void *p;
  const void *g;
  int64_t numel;
  int decay; /* weight decay applies */
  void *m, *v;
} DevOptTensor;

typedef struct DevOptim DevOptim;

/* Allocates the moments (zero; AdamW: m and v, SGD with momentum: m) and the
 * table, and finds the kernels in the loaded module. moments16: the moments
 * are bf16 (train.moments = bf16; kernels hpdl_adamw_bf16m, hpdl_sgd_bf16m).
 * NULL with the reason. */
DevOptim *devopt_new(Device *dev, DevOptKind kind, int momentum, int moments16, const DevOptTensor *t, int n, char *err,
                     size_t errlen);
void devopt_free(DevOptim *o);
const char *devopt_error(const DevOptim *o);

/* Per tensor, the sum of squares of its gradient (each chunk's in double on
 * the device, the chunks added here in order). */
int devopt_sumsq(DevOptim *o, double *per_tensor);
/* One update of every tensor: t the 1-based step, lr after the schedule,
 * clip_scale the gradients' factor (1: none). */
int devopt_adamw(DevOptim *o, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
                 double clip_scale);
int devopt_sgd(DevOptim *o, double lr, double momentum, double weight_decay, int64_t t, double clip_scale);
/* Moment `which` (0: m, 1: v) of tensor i to or from host memory (numel
 * floats); a moment the optimizer does not keep reads as zeros. bf16
 * moments are widened on the way out (exactly) and rounded to nearest even
 * on the way in. */
int devopt_moment(DevOptim *o, int i, int which, float *host, int to_device);

#endif
