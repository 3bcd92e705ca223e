/* devexec.h - a stage's fused graphs run on a device (device.h): the host
 * program of the CUDA target, shared by the GPU and the emulated device.
 *
 * A DevxProgram is the stage's IR module plus, per graph, its fused kernels
 * in execution order: what each reads and writes (IR value ids) and the
 * launches that compute it (generated kernels by name with their grid and
 * block, cuBLASLt GEMMs by descriptor). The compiler's back end knows all
 * of it (the test builds it from the fusion result; an artifact will carry
 * it in stageS.kernels.json).
 *
 * The walk: every graph's kernels in order, one device buffer per value
 * (from a pool that keeps freed buffers by size, so a step after the first
 * allocates nothing), views aliasing their input, CALLs in their three
 * modes (core/ir.h: plain, saving each layer's arguments and outputs, and
 * the backward over the saved layers, last layer first), and the gradient
 * outputs of autodiff's graphs added into one gradient buffer per parameter
 * (kernels/hpdl_cuda.cuh's hpdl_accumulate_f32). The chunk's collectives
 * (tensor, sequence and context parallelism) go through the DevxComm the
 * program sets: NCCL on the device's buffers, or MPI through host memory. */
#ifndef HPDL_DEVEXEC_H
#define HPDL_DEVEXEC_H

#include <stdio.h>

#include "device.h"
#include "ir.h"

typedef enum { DEVX_RUN, DEVX_VIEW, DEVX_LEAF, DEVX_CALL, DEVX_COMM } DevxKind;

typedef struct {
  const char *name; /* the generated kernel; for a GEMM a label */
  char kind[16];    /* the back end's family: loop, row, special, gemm ... */
  unsigned grid, block;
  int is_gemm;
  DevGemm gemm; /* is_gemm: over the fused kernel's io (inputs, then outputs) */
  double flops; /* kernels.json's "flops" of a launch that computes (attention), else 0 */
  double bytes; /* kernels.json's "bytes": the least DRAM traffic of a one-launch kernel, else 0 */
  /* kind "host" (is_host): an extern's native function called on host copies of the
   * kernel's buffers (devx_set_host), kernels.json's "host": the module's extern
   * host_extern, its gradient when host_grad, host_io the io index of each buffer in
   * the function's order (the last the one it writes) */
  int is_host, host_extern, host_grad, nhost_io;
  int host_io[16];
  /* kernels.json's "grouped" (is_gemm too): GROUPED_MM (1) or its weight gradient (2), one
   * GEMM an expert over its run of rows; `gemm` the product over all rows (codegen_cuda.h),
   * grouped_ids the io index of the rows' experts (i32), `experts` their count */
  int grouped, grouped_ids;
  int64_t experts;
} DevxLaunch;

typedef struct {
  DevxKind kind;
  int *inputs, ninputs;   /* value ids read (DEVX_RUN) */
  int *outputs, noutputs; /* value ids written */
  int *nodes, nnodes;     /* views: each aliases its input 0; leaf, call, comm: nodes[0] */
  int aux_node;           /* run: its AUX_LOSS node, whose loss the host adds up; else -1 */
  DevxLaunch *launches;
  int nlaunches;
} DevxKernel;

typedef struct {
  DevxKernel *kernels;
  int nkernels;
  int cut; /* a pipeline step's first backward kernel (fuse_can_cut); -1: not cut */
} DevxGraph;

typedef struct {
  const IrModule *m;
  DevxGraph *graphs; /* one per module graph */
  int ngraphs;
} DevxProgram;

/* Frees what the builder malloc()ed: every array above and the names. */
void devx_program_free(DevxProgram *p);

typedef struct DevExec DevExec;

/* How the parameters' and the gradients' blocks are laid out: each unit
 * padded to a multiple of `unit` values (ZeRO's even split over dp; 0 or 1:
 * none), and with by_layer in 1 + L units - the unrepeated parameters, then
 * copy l of every repeated one for each layer l (ZeRO-3 gathers them unit
 * by unit) - else one unit with each parameter's copies together. */
typedef struct {
  int64_t unit;
  int by_layer;
  /* by_layer: the experts' parameters (ir_param_is_expert) kept apart, in
   * blocks of their own that no unit holds and that stay whole (ZeRO over
   * dp cannot shard them: dp members hold other experts); their flat
   * indices (devx_flat_index) run on from the units' end */
  int experts_apart;
  /* by_layer: running statistics (IrParam.state) kept apart likewise (ZeRO
   * 3: the forwards update them in place, micro-batch after micro-batch,
   * which a unit gathered afresh for each layer would lose) */
  int state_apart;
} DevxFlat;

/* Resolves every launch's kernel and prepares every GEMM on `dev` (the
 * module already loaded), and allocates the parameters (every copy of a
 * repeated one) in one block and their gradients in another (flat: NULL
 * for one unpadded unit). NULL with the reason in err. */
DevExec *devx_new(Device *dev, const DevxProgram *p, unsigned long long seed, const DevxFlat *flat, char *err, size_t errlen);
void devx_free(DevExec *x);
const char *devx_error(const DevExec *x);

/* How this rank joins its peers: its index in and the size of each group
 * (IrGroup order, as the kernels' hpdl_kctx), and the collectives over fp32
 * buffers (0, or -1 with a line in err). Every member of a group calls them
 * with its own buffer, as comm.h's. The buffers are in host memory (each
 * value goes to the host and back), or with device_buffers the device's own
 * (NCCL): then the pieces of a gather, a scatter or an exchange that are not
 * contiguous are laid out by kernels (hpdl_chunk_copy_f32) and a
 * reduce_scatter is one call. */
typedef struct {
  int rank[IRG_COUNT], size[IRG_COUNT];
  int device_buffers;
  void *ctx;
  int (*all_reduce)(void *ctx, int group, int op /* 0 sum, 1 max */, float *buf, int64_t n, char *err, size_t errlen);
  /* out: size x n values, member by member */
  int (*all_gather)(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen);
  /* to / from the member `offset` places along the group (context
   * parallelism's ring); a send may be held until its receive */
  int (*send)(void *ctx, int group, int offset, const float *buf, int64_t n, char *err, size_t errlen);
  int (*recv)(void *ctx, int group, int offset, float *buf, int64_t n, char *err, size_t errlen);
  /* n values to each member, member by member (in and out: size x n) */
  int (*all_to_all)(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen);
  /* device_buffers only: in size x n values, out this member's n of their sum */
  int (*reduce_scatter)(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen);
} DevxComm;

/* Without it every group has one member. */
void devx_set_comm(DevExec *x, const DevxComm *c);

/* Host <-> device: parameter p (all copies, fp32), input i (its bytes as
 * the IR's dtype), gradient p. */
int devx_set_param(DevExec *x, int p, const float *host);
int devx_set_input(DevExec *x, int i, const void *host, size_t bytes);
int devx_get_grad(DevExec *x, int p, float *host);
/* One copy (`layer`) of parameter p, or of its gradient. */
int devx_set_param_copy(DevExec *x, int p, int64_t layer, const float *host);
int devx_get_grad_copy(DevExec *x, int p, int64_t layer, float *host);
int devx_set_grad_copy(DevExec *x, int p, int64_t layer, const float *host);
int devx_zero_grads(DevExec *x);
/* The bf16 copies of the weights some node reads in bf16, rounded from the
 * parameters on the device: once per step, after the parameters are set. */
int devx_refresh16(DevExec *x);
/* ZeRO-3: those of one unit's copies, once it is gathered (devx_refresh16
 * skips the copies not gathered). */
int devx_refresh16_unit(DevExec *x, int unit);
/* A hook that learns when each gradient is final, so that its reduction
 * can start while the backward goes on (docs/gpu.md, "Overlap"): the
 * program brackets each micro-batch's backward of a training step with
 * devx_micro_begin / devx_micro_end; the first micro-batch's gradient
 * additions per parameter copy are counted, and in a micro-batch begun with
 * last = 1 the hook runs as soon as a copy has had that many (after the
 * launch of its last addition: work queued on the launch stream after it
 * sees the final gradient). fn returns 0, or -1 with a line in err.
 * devx_micro_end fails where a later micro-batch
 * added a different number of times into a gradient whose reduction it
 * started. fn NULL: off. */
typedef int (*DevxGradReady)(void *ctx, int param, int64_t copy, char *err, size_t errlen);
int devx_set_grad_ready(DevExec *x, DevxGradReady fn, void *ctx);
void devx_micro_begin(DevExec *x, int last);
int devx_micro_end(DevExec *x);
/* 1 once a micro-batch's additions are known (the hook can run). */
int devx_grad_ready_known(const DevExec *x);

/* A device buffer of the executor's pool (NULL: out of memory, the reason
 * in devx_error), and its return: the program's message buffers. Queued
 * work that reads it runs before whatever reuses it (one stream). */
void *devx_buffer(DevExec *x, size_t bytes);
void devx_buffer_put(DevExec *x, void *p, size_t bytes);
/* Device addresses of copy `layer` of parameter p and of its gradient. */
void *devx_param_ptr(DevExec *x, int p, int64_t layer);
void *devx_grad_ptr(DevExec *x, int p, int64_t layer);
/* The blocks of every parameter and of every gradient (device addresses):
 * returns their length in values, padding included (zeros), and where
 * copy `layer` of parameter p starts in them. */
int64_t devx_flat(DevExec *x, void **params, void **grads);
int64_t devx_flat_index(const DevExec *x, int p, int64_t layer);
/* Copy `layer` of parameter p as one index over every parameter's copies
 * (p = the module's parameter count, layer 0: how many there are). */
int64_t devx_copy_index(const DevExec *x, int p, int64_t layer);
/* The blocks' units (DevxFlat): unit u is [start[u], start[u + 1]); the
 * unit of layer `layer`'s copies, or -1. Only the copies the module's calls
 * read are held (a pipeline stage's layers): devx_flat_index of another is
 * -1. */
int devx_units(const DevExec *x, const int64_t **start);
int devx_layer_unit(const DevExec *x, int64_t layer);

/* ZeRO-3 on the device: devx_release_params frees the parameters' block
 * (the program keeps its shards); from then on a unit's parameters are read
 * where devx_point_unit points them (the unit's values laid out as in the
 * block; base NULL: nowhere, and a read fails naming the parameter), and
 * the layer hook learns when each layer of a call begins and ends, forward
 * and backward (the backward recomputes what it needs of the forward
 * inside it), so that the program gathers a layer's unit before it runs
 * (the next one while it runs) and releases it after. fn returns 0, or -1
 * with a line in err. */
typedef enum { DEVX_LAYER_FWD_BEGIN, DEVX_LAYER_FWD_END, DEVX_LAYER_BWD_BEGIN, DEVX_LAYER_BWD_END } DevxLayerPhase;
typedef int (*DevxLayerHook)(void *ctx, int64_t layer, int phase, char *err, size_t errlen);
void devx_release_params(DevExec *x);
/* ZeRO 2 and 3 likewise for the gradients: the block freed, a unit's
 * gradients added where devx_point_grad_unit points them (NULL: nowhere;
 * an addition fails naming it); devx_zero_grads then zeroes nothing. */
void devx_release_grads(DevExec *x);
void devx_point_grad_unit(DevExec *x, int unit, void *base);
/* dst[i] += src[i] for n values (hpdl_accumulate_f32), in launch order. */
int devx_add(DevExec *x, float *dst, const float *src, int64_t n);
void devx_point_unit(DevExec *x, int unit, void *base);
/* ZeRO-3 with bf16 copies (some node reads a weight in bf16):
 * devx_reads_from notes the parameters some node of graph root (the step)
 * or of a graph it calls reads as they are (fp32: norms, biases, a lookup's
 * table; 0, or -1 out of memory). devx_unit_reads gives unit u's copies of
 * those as offsets in the unit and lengths in the block's order (the first
 * cap of them; returns how many), and in *any16 whether some copy of the
 * unit is read in bf16; they are what devx_point_unit16 points at fp32
 * values. devx_point_unit16 points the unit
 * at its bf16 copies b16 (the unit's values laid out as in the block, 2
 * bytes each) and those fp32 copies at f32, one after another in that
 * order; the rest of the unit has no fp32 values (a read fails naming
 * the parameter). NULL, NULL: nowhere. The buffers stay the caller's. */
int devx_reads_from(DevExec *x, int root);
int devx_unit_reads(const DevExec *x, int unit, int64_t *off, int64_t *len, int cap, int *any16);
void devx_point_unit16(DevExec *x, int unit, void *b16, void *f32);
/* dst[i] = bf16(src[i]) for n values (hpdl_round_bf16); dst[i] = src[idx[i]]
 * (hpdl_take_f32, idx on the device), in launch order. */
int devx_round16(DevExec *x, const float *src, void *dst, int64_t n);
int devx_take(DevExec *x, const float *src, const int64_t *idx, float *dst, int64_t n);
void devx_set_layer_hook(DevExec *x, DevxLayerHook fn, void *ctx);
/* Copy `layer` of parameter p to host memory. */
int devx_get_param_copy(DevExec *x, int p, int64_t layer, float *host);

/* The auxiliary losses (AUX_LOSS: weight x loss) the forwards added up since
 * the last call, into *sum; 0 when the program ran none. */
int devx_take_aux(DevExec *x, double *sum);
/* Evaluation steps (on = 1): the TRAINING leaf reads 0; 0: training (the default). */
void devx_set_evaluating(DevExec *x, int on);

/* Runs graph `graph` (autodiff's step: argument 0 is the loss's gradient
 * seed) and returns its output 0 as a float in *loss; gradients accumulate. */
int devx_step(DevExec *x, int graph, float seed, float *loss);

/* A pipeline schedule runs a micro-batch's step in halves (DevxGraph.cut):
 * the forward half returns a frame holding what the backward half reads
 * (the micro-batch's own copy of the inputs set last, its activations and
 * stashed layers), the backward half finishes it as devx_step does. Frames
 * of several micro-batches may be in flight. */
typedef struct DevxFrame DevxFrame;
DevxFrame *devx_step_forward(DevExec *x, int graph, float seed);
int devx_step_backward(DevExec *x, DevxFrame *f, float *loss);
/* A frame whose backward will not run (a failed step). */
void devx_frame_drop(DevExec *x, DevxFrame *f);

/* One fused kernel alone (the kernel-by-kernel check): io holds device
 * pointers, its inputs then its outputs. */
int devx_run_kernel(DevExec *x, int graph, int kernel, int64_t layer, void **io);

/* Profiling: with it on, every launch is timed alone (the device
 * synchronised before and after it, so the step runs slower) and
 * devx_profile_report prints per launch family and the `top` launches by
 * time, per step over `steps` steps, with each GEMM's and attention's achieved
 * FLOP/s and each one-launch kernel's bytes a second (DevxLaunch.bytes), also
 * as a share of `ref_bps` (a copy's bytes read and written a second, measured
 * on the same device; 0: none). */
void devx_profile(DevExec *x, int on);
void devx_profile_report(const DevExec *x, FILE *out, int top, int steps, double ref_bps);

/* hpdlrun --profile: each launch (a generated kernel or a GEMM) timed alone
 * as devx_profile does, and reported after it ran: launch(user, graph,
 * layer, the launch, its seconds, its FLOPs (a GEMM's 2mnk x batch, else
 * 0)). NULL stops it. */
typedef struct {
  void *user;
  void (*launch)(void *user, int graph, int64_t layer, const DevxLaunch *L, double secs, double flops);
} DevxTracer;
void devx_set_tracer(DevExec *x, const DevxTracer *t);

/* Where the program's extern calls go (kind "host" launches): call(user, index, grad,
 * bufs, err, errlen) as core/extcall.h's extcall_forward / extcall_grad take them, on
 * host buffers; 0, or -1 with the reason in err. Without it such a launch fails, saying
 * so. */
typedef struct {
  void *user;
  int (*call)(void *user, int index, int grad, void *const *bufs, char *err, size_t errlen);
} DevxHost;
void devx_set_host(DevExec *x, const DevxHost *h);

/* Device memory the pool holds now and at most (bytes). */
void devx_memory(const DevExec *x, size_t *now, size_t *peak);

#endif
