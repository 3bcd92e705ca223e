/* hostop.h - ops the runtime computes on the host for the CPU back end's
 * generated code (hpd_abi.h, hpd_ctx.host_op): the mixture of experts'
 * routing, dispatch and combine (whose slot assignment is a few loops over a
 * small routing table), the auxiliary loss and its seed, the expert
 * all-to-all, and flash attention and its backward (core/numeric/attn.h: tiles of
 * query rows over BLAS, the scores never stored whole). Buffers are whole tensors of the node's shape, f32, or i32 for
 * indices; the semantics are ir_ops.h's, the same as the reference
 * executor's (interp.c) in fp32. */
#ifndef HPDL_HOSTOP_H
#define HPDL_HOSTOP_H

#include <stddef.h>

#include "attn.h"
#include "ir.h"
#include "lmce.h"

typedef struct {
  double loss_seed;  /* LOSS_SEED: the seed of the step's backward */
  int evaluating;    /* TRAINING reads 0 when set (an evaluation step), else 1 */
  double aux_sum;    /* AUX_LOSS adds weight x value here when counted (forward, not recomputation) */
  int aux_seen;
  /* ALL_TO_ALL: n f32 values to each member of group g, member by member; 0 on success */
  void *comm;
  int (*all_to_all)(void *comm, int group, const float *in, int64_t n, float *out);
  int size[IRG_COUNT]; /* group sizes */
  int rank[IRG_COUNT]; /* this rank's index in each group (attention's context-parallel positions) */
  /* ATTENTION (core/numeric/attn.h): the BLAS product and the workers, NULL for
   * attn.c's own loops and one thread */
  AttnSgemm sgemm;
  AttnParFor par_for;
  void *par;
  int nthreads; /* the rank's threads, for a bf16 GEMM's oneDNN (linear_ce under bf16); 0: its default */
} HostOpEnv;

/* Whether AUX_LOSS node `node` of g counts its loss: in a forward (a step
 * graph's forward part, or a graph that is not a backward), not in the
 * recomputation a backward runs. */
int hostop_aux_counted(const IrGraph *g, int node);

/* Whether op runs on the host. */
int hostop_supported(IrOp op);

/* Flags or-ed into hostop_run's node: HOSTOP_PAIR on a fused head's dx op
 * (LINEAR_CE_BWD, LINEAR_LSE_BWD) whose dw op of the same inputs the kernel
 * computes with it, its output one more buffer after dx; HOSTOP_ADD: the weight's gradient is added into its
 * buffer (a parameter's gradient slot) rather than written. */
enum { HOSTOP_PAIR = 1 << 29, HOSTOP_ADD = 1 << 30 };

/* Runs node `node` (with HOSTOP_* flags) of g with bufs = its inputs, then
 * its output. NULL on success, else the reason in err. */
const char *hostop_run(const IrGraph *g, int node, void **bufs, HostOpEnv *env, char *err, size_t errlen);

#endif
