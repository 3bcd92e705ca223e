/* interp.h - the reference executor: a plain fp64 interpreter of the IR.
 *
 * It is the oracle the back ends are tested against: simple loops, no
 * fusion, every tensor in double precision (integer tensors hold integral
 * doubles). Parameters are initialised deterministically per logical tensor
 * (seeded by its name and layer index, not by rank), so every layout starts
 * from the same weights. */
#ifndef HPDL_INTERP_H
#define HPDL_INTERP_H

#include <stdint.h>

#include "ir.h"

typedef struct {
  int rank;
  int64_t dims[IR_MAX_RANK];
  double *data; /* numel values, row-major */
} InterpTensor;

typedef struct Interp Interp;

/* The ranks of a partitioned program: this rank's index and the size of
 * each group, and the collectives that join it to its peers (a simulator
 * runs one Interp per rank, each in its own thread). Every member of a group
 * calls a collective with its own buffer. Without a comm, groups have one
 * member and SEND / RECV loop back within the interpreter. */
typedef struct {
  int rank[IRG_COUNT];
  int size[IRG_COUNT];
  void *ctx;
  /* in place; op 0 sum, 1 max */
  const char *(*all_reduce)(void *ctx, IrGroup g, int op, double *data, int64_t n);
  /* out receives size x n values, rank by rank */
  const char *(*all_gather)(void *ctx, IrGroup g, const double *in, int64_t n, double *out);
  /* to / from the rank `offset` places along the group (pipeline: +1 next, -1 previous) */
  const char *(*send)(void *ctx, IrGroup g, int offset, const double *data, int64_t n);
  const char *(*recv)(void *ctx, IrGroup g, int offset, double *data, int64_t n);
  /* n values to each member, send member by member; recv gets n from each, member by member.
   * Optional: NULL does ALL_TO_ALL with all_gather (every member's whole input). */
  const char *(*all_to_all)(void *ctx, IrGroup g, const double *send, int64_t n, double *recv);
} InterpComm;

Interp *interp_new(const IrModule *m);
/* Evaluation (on = 1): the TRAINING leaf reads 0 (batch norm normalises with
 * its running statistics and leaves them alone, dropout keeps every value);
 * 0, the default: training. */
void interp_set_evaluating(Interp *in, int on);
void interp_set_comm(Interp *in, const InterpComm *comm);
/* The global position of local index i of a split axis (layout 0 contiguous,
 * 1 zigzag; see ir_ops.h) on rank r of a group of `size`, `local` long here. */
int64_t interp_global_pos(int layout, int r, int size, int64_t local, int64_t i);
/* Moves the rows of a split axis between this rank's chunk (`local`, shaped
 * as local_node) and the whole (`global`, `size` times as long on `axis`):
 * to_global copies local into its places in global, else global's rows into
 * local. Values of `elem` bytes (the reference executor's fp64, a device's
 * fp32). */
void interp_chunk_copy(const IrNode *local_node, int64_t axis, int layout, int rank, int size, void *global, void *local,
                       size_t elem, int to_global);
void interp_free(Interp *in);

/* Checks every op's values as it runs: a NaN or +inf fails the run with the
 * op, its graph and layer, and the .hpd line (when the module has its
 * sources: a chunk file's) named. hpdlrun --detect-anomaly. */
void interp_set_detect_anomaly(Interp *in, int on);

/* Rounds every fp32 value to float as it is stored, as the back ends keep it
 * (off: values stay in double). The kernel tests turn it on, so that a kernel
 * called alone reads exactly what the reference computed from: its error is
 * then its own arithmetic's, not its inputs' rounding amplified by an
 * ill-conditioned op (a row sum that cancels). */
void interp_set_store_f32(Interp *in, int on);

/* Fills every parameter from its initialiser with a generator seeded by
 * (seed, parameter name, layer index). */
void interp_init_params(Interp *in, uint64_t seed);

/* The values of parameter `param`, copy `layer` (0 unless it belongs to a
 * repeated block); writable, so tests can perturb them. */
double *interp_param(Interp *in, int param, int64_t layer, int64_t *numel);

/* Model inputs (graph 0's INPUT nodes). */
void interp_set_input(Interp *in, int input, const double *data);

/* Runs graph `graph` as layer `layer` of its repeat (PARAM nodes read copy
 * `layer`), with the given arguments; writes each graph output to outs[i]
 * (allocated by the interpreter, owned by the caller: free with free()).
 * CALL nodes run their graph `count` times, layer 0 .. count-1, threading
 * output 0 into argument 0 (and, in autodiff's SAVE / BACKWARD modes, keep
 * or use per-layer activations: ir.h). Returns 0, or -1 with a message in
 * *err. */
int interp_run(Interp *in, int graph, int64_t layer, const InterpTensor *args, int nargs, InterpTensor *outs,
               const char **err);

/* A training step in two halves, for pipeline schedules: a graph cut by
 * autodiff (IrGraph.fb_split > 0: forward.grad) runs its forward part F
 * (nodes before the cut: the micro-batch's forward, with its activation
 * SEND) now, and its backward part B (the gradient RECV, the backward, the
 * input gradient's SEND) later, with other micro-batches' halves in
 * between. The frame is the micro-batch's stash: every value F made that B
 * reads, the SAVE calls' per-layer activations, and copies of the model
 * inputs and arguments (the next micro-batch overwrites the Interp's).
 * interp_forward returns NULL with *err on failure; interp_backward runs B,
 * writes the outputs as interp_run does, adds the gradients to the store
 * and frees the frame (also on failure); interp_frame_free drops a frame
 * whose backward will not run. interp_frame_bytes: what the stash holds. */
typedef struct InterpFrame InterpFrame;
InterpFrame *interp_forward(Interp *in, int graph, const InterpTensor *args, int nargs, const char **err);
int interp_backward(InterpFrame *f, InterpTensor *outs, const char **err);
void interp_frame_free(InterpFrame *f);
int64_t interp_frame_bytes(const InterpFrame *f);

/* Gradients. Whenever a graph that autodiff made runs (IrGraph.grad_params;
 * at top level or inside a CALL), its gradient outputs are added to a store
 * kept here per parameter copy, so runs (micro-batches) accumulate until the
 * store is zeroed. interp_grad is NULL for a parameter never given one. */
void interp_zero_grads(Interp *in);
double *interp_grad(Interp *in, int param, int64_t layer, int64_t *numel);

/* Allocation accounting: a listener told of the life of every value a graph
 * run holds, in the model of the static memory plan (memplan.h), so that a
 * test can measure the executor's peak the way the plan computes it. The
 * executor's own transient copies (a call's carried output, returned
 * outputs) are not reported: a compiled program does not make them.
 *   run(graph, layer, 1)    a run of `graph` starts; (.., 0) it ends, dropping
 *                           every value it still holds (its outputs)
 *   value(graph, node, 1)   node's value is allocated, before it is computed
 *                           (so a CALL's nested runs follow); leaves too
 *   value(graph, node, 0)   the run drops it: after its last use, or at once
 *                           when nothing reads it; once per value
 *   stash(graph, node, bytes, 1 / 0)  the SAVE call `node` reserves its
 *                           per-layer activations (count x bytes per layer
 *                           in the IR's dtypes), before its first layer
 *                           runs; its BACKWARD call releases them after its
 *                           last layer ran
 * Events come from the thread that runs the Interp. NULL stops them. */
typedef struct {
  void *user;
  void (*run)(void *user, int graph, int64_t layer, int begin);
  void (*value)(void *user, int graph, int node, int alive);
  void (*stash)(void *user, int graph, int node, int64_t bytes, int alive);
} InterpAccount;
void interp_set_account(Interp *in, const InterpAccount *acc);

/* Op timing (hpdlrun --profile): op(graph, node, layer, t0, t1) after each
 * op that computes a value runs (leaves and CALL nodes, whose graphs' ops
 * are reported themselves, are not), t0 and t1 from now(). NULL stops it;
 * off, each op costs one test. */
typedef struct {
  void *user;
  double (*now)(void *user);
  void (*op)(void *user, int graph, int node, int64_t layer, double t0, double t1);
} InterpTimer;
void interp_set_timer(Interp *in, const InterpTimer *t);

/* Convenience: runs graph 0 and returns output 0 as a scalar (the loss). */
double interp_loss(Interp *in);
/* Mixture of experts (ir_ops.h): the slot of every choice of one sequence
 * (choice [T, K] of experts), e x cap + position, or -1 when its expert is
 * full; count [E] is left with each expert's tokens. Priority: every first
 * choice in token order, then every second... Returns -1, or the index of a
 * choice outside [0, E). Shared by the reference executor and the runtime's
 * host ops (the CPU back end's MoE kernels). */
int64_t interp_moe_slots(const int64_t *choice, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t *slot, int64_t *count);
/* The dropless packed form's rows (ir_ops.h): the row of each of the n choices,
 * sorted by expert and then by choice; count [E + 1] is left with each expert's
 * first row (count[E] = n). Returns -1, or the index of a choice outside [0, E). */
int64_t interp_moe_rows(const int64_t *choice, int64_t n, int64_t E, int64_t *row, int64_t *count);
/* ALL_TO_ALL's local halves (ir_ops.h) on values of elem bytes: x's size
 * chunks along `split` laid out member by member in send; the chunks
 * received, member by member, placed along `concat` of out. Shared by the
 * reference executor and the runtime's host ops. */
void interp_a2a_pack(const IrNode *x, int64_t split, int size, const void *in, void *send, size_t elem);
void interp_a2a_unpack(const IrNode *x, int64_t split, int64_t concat, int size, const void *recv, void *out, size_t elem);
/* TOPK's selection (ir_ops.h) of rows of V values, xd (fp64) or xf (fp32):
 * k passes taking the largest entry not yet taken, the lower position first
 * among equals, NaN never winning; out [rows, K] positions. */
void interp_topk(const double *xd, const float *xf, int64_t rows, int64_t V, int64_t K, int64_t *out);
/* The auxiliary losses the forwards run since the last call added (the sum
 * of weight x value of every AUX_LOSS, std/moe's load balance) into *sum,
 * then zeroes it; returns whether any ran. */
int interp_take_aux(Interp *in, double *sum);

/* A deterministic generator: splitmix64 of a seed; exposed so tests and the
 * runtime initialise identically. */
uint64_t interp_hash_name(uint64_t seed, const char *name, int64_t layer);
double interp_uniform01(uint64_t *state);
double interp_normal(uint64_t *state);

#endif
