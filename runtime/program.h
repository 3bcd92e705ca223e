/* program.h - the interface between the training loop (train.h) and the
 * program it runs: the tensors the loop owns, the context of a step, and
 * the table of functions a program exports (docs/runtime.md, "The program
 * interface"). Apart from train.h so that programs (builtin.c, the CPU
 * program of program_exec.c, plug-ins) include the interface and not the
 * loop that includes them. */
#ifndef HPDL_PROGRAM_H
#define HPDL_PROGRAM_H

#include <stdint.h>

#include "artifact.h"
#include "shard.h"
#include "comm.h"
#include "data.h"
#include "optim.h"
#include "rt.h"

/* One local tensor: copy `layer` of a logical parameter, this rank's shard.
 * All data live in four pools (parameters, gradients, and the optimizer's
 * two moments), one allocation each, in the artifact's parameter order. */
typedef struct {
  const ArtParam *param;
  int64_t layer;
  char name[256];          /* "blocks.3.attn.q_proj.weight" */
  int rank;
  int64_t shape[ART_MAX_RANK]; /* local */
  int64_t numel;
  ShardSplit split;        /* where the shard lies in the logical tensor */
  float *data, *grad;
  float *m, *v;            /* AdamW moments; m is SGD's momentum; NULL when unused */
  int in_norm;             /* counted once in the global gradient norm */
} TrainTensor;

/* An expert shard: split over the expert group on this layout, so held
 * alike by the expert-data-parallel members (its gradient sum and ZeRO
 * slices go over COMM_EDP, everything else's over COMM_DP). */
static inline int train_tensor_is_expert(const TrainTensor *t) { return t->split.parts > 1 && t->param->split_group == COMM_EP; }

/* hpdlrun --profile: how a program adds its spans to the rank's timeline
 * (the "program" track; docs/runtime.md, "Profiling"). now() is the
 * timeline's clock in seconds; span() copies the name and the category.
 * mb, chunk, layer -1, bytes 0, flops 0: unknown. Calls from the thread
 * that runs step() only. */
typedef struct {
  void *self;
  double (*now)(void *self);
  void (*span)(void *self, const char *name, const char *cat, double t0, double t1, int mb, int chunk, int64_t layer, int64_t bytes,
               double flops);
} TrainProfiler;

typedef struct {
  const Artifact *art;
  Comm *comm;
  TrainTensor *tensors;    /* this rank's: parameters in manifest order, layers ascending */
  int ntensors;
  void *arena;             /* the memory planner's arena (64-byte aligned), arena_bytes long */
  int64_t arena_bytes;
  int64_t step;            /* the optimizer step being computed, from 0 */
  /* The program adds grad_scale x d(mean loss of a micro-batch)/d(param) to
   * the gradients: grad_scale = 1 / (dp x num_micro_batches), so that after
   * the data-parallel sum they are the gradient of the global mean loss. */
  double grad_scale;
  /* --target cuda: the device hpdlrun --device asked for ("cuda",
   * "emulate"); NULL: the GPU */
  const char *device;
  /* hpdlrun --profile: NULL when profiling is off (one test a span, so
   * off costs nothing). Last, so that a program built before it (which
   * does not read it) still finds the fields above where they were. */
  const TrainProfiler *prof;
  /* Written by a program whose model has auxiliary losses (std/moe's load
   * balance, with_aux_loss): this rank's weighted auxiliary losses summed
   * over its stages, the mean over the step's micro-batches; has_aux 0
   * otherwise. After prof for the same reason. */
  double aux_loss;
  int has_aux;
  /* 1: an evaluation step (hpdlrun --eval-every): the model's TRAINING leaf
   * reads 0 (batch norm normalises with its running statistics and leaves
   * them alone, dropout keeps every value), grad_scale is 0 and the loop
   * discards the gradients. After the fields above for the same reason. */
  int eval;
  /* The rank's threads (hpdlrun --threads, else the cores' share of the
   * rank: cores.h), on which a compiled program runs its kernels' rows; 0
   * or 1: one. After the fields above for the same reason. */
  int nthreads;
  /* Per tensor (the order of tensors): a 16-bit copy of it the program keeps
   * (bf16: a weight a bf16 GEMM multiplies), else NULL, and the step the
   * copy holds the values of. The loop allocates both (NULL, -1); a program
   * sets half[i] at create; the loop's optimizer, when it updates a whole
   * tensor, writes the copy with the update and sets half_step[i] to the
   * next step; the program rounds what is not fresh (half_step[i] != step)
   * itself before the step's graphs run. */
  uint16_t **half;
  int64_t *half_step;
  /* ZeRO 1-3 (docs/runtime.md, "ZeRO"): how the loop shards the optimizer's
   * state, for a program that keeps it (resident); NULL at zero 0. After
   * the fields above for the same reason. */
  const struct TrainShards *shards;
} TrainCtx;

/* The loop's pools (TrainTensor) hold pool_cap values, tensor i from
 * offset[i]; data-parallel member r owns [own_lo, own_lo + own_len) and its
 * moment pools m, v (NULL where the optimizer keeps none) hold that range,
 * value j at m[j - own_lo]. own2_len > 0: the expert shards, from expert_lo
 * on, are owned over COMM_EDP instead ([own2_lo, own2_lo + own2_len), after
 * the own_len values in m and v). At zero 3 the parameters' pool is whole
 * only during a step of the loop's and master holds the owned range. */
typedef struct TrainShards {
  int zero;
  const int64_t *offset;
  int64_t pool_cap, own_lo, own_len, expert_lo, own2_lo, own2_len;
  float *m, *v;
  float *master; /* zero 3: the owned parameters between steps (as m), else NULL */
} TrainShards;

enum { TRAIN_PROGRAM_ABI = 3 };
#define TRAIN_PROGRAM_SYMBOL "hpdl_program_v1" /* const TrainProgram *hpdl_program_v1(void) */

typedef struct TrainProgram {
  int abi;                 /* TRAIN_PROGRAM_ABI */
  const char *name;
  int reduces_dp;          /* 1: the program all-reduces gradients over dp itself (overlap) */
  void *(*create)(TrainCtx *ctx, RtErr *e);
  /* The micro-batches of one step. *has_loss: this rank computed the loss
   * (the last pipeline stage); *loss: the mean over the micro-batches. */
  int (*step)(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss, RtErr *e);
  void (*destroy)(void *self);
  /* Optional (NULL: the loop keeps the parameters, the gradients and the
   * optimizer's state in its pools and updates them). A program that keeps
   * them itself, on a GPU, says so by resident() returning 1 (asked once,
   * after create, when dp = 1 or the gradients go uncompressed or compressed
   * to bf16 / fp16, which the program computes as comm.c does: then the
   * program sums the gradients over dp itself, as the loop's sum, before
   * the norm; under ZeRO (ctx->shards) as it shards them, counting in the
   * norm the part of each counted tensor it owns). The loop leaves its gradient pool alone
   * (the program may use it as staging); each step it asks for the
   * sums of squares of the gradients of the tensors it counts in the norm
   * (count[i] for ctx->tensors[i]) and has the program update (the AdamW /
   * SGD of opt at the 1-based step t, lr after the schedule, the gradients
   * scaled by clip_scale first). state(to_host = 1) brings the parameters
   * and the moments (TrainTensor.data, .m, .v) to the loop's pools before
   * it reads them (a checkpoint); state(to_host = 0) takes them from the
   * pools after it wrote them (initialisation, resuming). */
  int (*resident)(void *self, TrainCtx *ctx);
  int (*grad_sumsq)(void *self, TrainCtx *ctx, const unsigned char *count, double *sumsq, RtErr *e);
  int (*update)(void *self, TrainCtx *ctx, const OptimConfig *opt, int64_t t, double lr, double clip_scale, RtErr *e);
  int (*state)(void *self, TrainCtx *ctx, int to_host, RtErr *e);
} TrainProgram;

#endif
