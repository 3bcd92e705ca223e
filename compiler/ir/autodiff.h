/* autodiff.h - reverse-mode automatic differentiation of the tensor IR.
 *
 * ad_build() differentiates a lowered module (graph 0 the forward with the
 * loss as output 0; graphs 1.. the repeated blocks it CALLs) and appends the
 * graphs of one training step. The forward graphs are left as they were.
 *
 * Calling convention of the appended graphs (a block graph is called B):
 *
 *   forward.grad  the step. Argument #0: the seed, a scalar d objective /
 *                 d loss (1 for one micro-batch; 1/M to average M of them;
 *                 or a loss scale). Body: graph 0's forward, then its
 *                 backward. Outputs: 0 = the loss, then d loss / d each
 *                 parameter graph 0 uses (IrGraph.grad_params, in parameter
 *                 order). Each forward `call B` becomes a SAVE call of B.fwd;
 *                 its gradient is a BACKWARD call of B.grad (ir.h: CALL
 *                 modes), which runs the layers in reverse and threads dy.
 *   B.fwd         B with outputs 1.. = the activations the recompute policy
 *                 keeps, per layer (none with full recompute).
 *   B.grad        run as layer l, for copy l of B's parameters. Arguments:
 *                 #0 = dy (d loss / d B's output 0), #1..#n = B's n
 *                 arguments, #n+1.. = B.fwd's outputs 1.. of that layer.
 *                 Outputs: 0 = d loss / d argument 0, then d loss / d each
 *                 parameter of B, copy l (grad_params).
 *
 * So the parameter gradients of layer l come out of the l-th iteration of
 * the BACKWARD call; the executor adds every graph's gradient outputs to its
 * per-copy store (interp.h), which also makes gradient accumulation over
 * micro-batches a plain loop: zero the store, then for each micro-batch set
 * the inputs and run forward.grad with seed 1/M (ad_accumulate does this).
 * A pipeline schedule calls B.fwd and B.grad per layer directly, with the
 * same arguments.
 *
 * Only argument 0 of a repeated block carries a gradient; other arguments
 * (passed unchanged to every layer) must not depend on parameters.
 *
 * Recompute policies apply to the repeated blocks (graph 0 keeps all its
 * activations): NONE saves every forward value a gradient rule reads; FULL
 * saves only the block's arguments and B.grad re-runs the forward it needs;
 * SELECTIVE recomputes the attention core - the QK^T matmul, the ops up to
 * and including the softmax (scale, mask) and the matmul with V, found
 * structurally as matmul -> elementwise chain -> softmax -> matmul - and
 * saves the rest. All three give identical gradients: recomputation repeats
 * the same deterministic ops (dropout masks depend only on seed, stream,
 * layer and element).
 *
 * Collectives: the gradient of ALL_REDUCE is the identity (Megatron's g
 * operator; its output is replicated, so each rank's dy is already the full
 * gradient); ALL_GATHER and REDUCE_SCATTER are each other's gradient; SEND's
 * gradient is a RECV of dx from the same peer and RECV's a SEND of dy (zeros
 * when the value was unused, so the peer never waits). Megatron's f operator
 * (identity forward, all-reduce backward) has no op of its own: the
 * partitioner inserts that ALL_REDUCE into the backward graph it partitions
 * (the intended order is: autodiff of the global graph, then partitioning of
 * forward and backward together). */
#ifndef HPDL_AUTODIFF_H
#define HPDL_AUTODIFF_H

#include <stdio.h>

#include "interp.h"
#include "ir.h"
#include "sema.h"

typedef struct {
  IrModule *m;
  Recompute recompute;
  int64_t layers; /* ad_build_layers: the policy's layers of a call (0: all) */
  int nforward; /* graphs 0..nforward-1 are the forward module */
  int step;     /* forward.grad */
  int *fwd;     /* per forward graph: its B.fwd, -1 for graph 0 */
  int *grad;    /* per forward graph: its backward graph (graph 0: step) */
  int *nsaved;  /* per forward graph: activations B.fwd saves per layer */
  /* per forward graph, with `layers`: B.keep.fwd and B.keep.grad, the pair
   * of the layers past the policy's (recompute none), else -1; nsaved_keep */
  int *fwd_keep, *grad_keep, *nsaved_keep;
} AdResult;

/* Appends the graphs above to m. NULL with the reason in *err (allocated in
 * m's arena) when a construct cannot be differentiated. */
AdResult *ad_build(IrModule *m, Recompute policy, const char **err);

/* The same, the policy applying to the first `layers` layers of each call of
 * a repeated block (Megatron-LM's --recompute-method block
 * --recompute-num-layers: per pipeline chunk), the rest keeping their
 * activations (none); layers 0: every layer (ad_build). A split call is two
 * SAVE calls in the step (B.fwd for the first layers, B.keep.fwd for the
 * rest) and two BACKWARD calls (B.keep.grad, then B.grad). */
AdResult *ad_build_layers(IrModule *m, Recompute policy, int64_t layers, const char **err);

/* Whether RECOMPUTE_SELECTIVE recomputes anything in m (not yet
 * differentiated): an attention core (a score product, its softmax and the
 * product with V, Korthikanti et al. 2022) in some graph. Without one (a
 * flash attention keeps no scores) the policy differentiates as
 * RECOMPUTE_NONE does - but for the keys and values received under context
 * parallelism, which every policy but none receives again (cp_rereceive). */
int ad_selective_recomputes(const IrModule *m);

/* Whether RECOMPUTE_ACT's program may differ from RECOMPUTE_SELECTIVE's:
 * some graph has a product of two values that are not weights which a GEMM
 * (or another op that is not elementwise) reads - a gated activation. 0: the
 * two policies differentiate m alike. */
int ad_act_recomputes(const IrModule *m);

/* How many of a call's `count` layers run under the policy. */
int64_t ad_policy_layers(const AdResult *r, int64_t count);

/* One forward + backward of forward.grad with the given seed: returns the
 * loss (NaN with *err on failure); the gradients add to the store. */
double ad_step(Interp *in, const AdResult *r, double seed, const char **err);

/* Gradient accumulation: zeroes the store, then for micro-batch i in
 * 0..nmicro-1 calls feed (which sets the inputs) and runs a step with seed
 * 1/nmicro. Returns the mean loss; the store holds the mean gradients. */
typedef void (*AdFeed)(Interp *in, int micro, void *user);
double ad_accumulate(Interp *in, const AdResult *r, int nmicro, AdFeed feed, void *user, const char **err);

/* The appended graphs in the stable text form, each followed by the
 * parameter each gradient output belongs to. */
void ad_print(const AdResult *r, FILE *out);

#endif
