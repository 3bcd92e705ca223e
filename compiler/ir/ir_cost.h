/* ir_cost.h - the IR's cost rules: FLOPs and bytes moved, op by op.
 *
 * Every op of ir_ops.h has a rule `ircost_ID` in ir_cost.c (the table is
 * built from the IR_OPS X-macro, so an op without a rule does not compile).
 * A rule gives the work of one execution of a node, derived from its shape:
 *
 *   flops          floating-point operations; a multiply-add counts 2, a
 *                  transcendental evaluated on the special function unit
 *                  (exp, log, tanh, rsqrt, ...) counts 1. The per-element
 *                  constants of every op are listed, with their reasons, at
 *                  the top of ir_cost.c.
 *   bytes_read     what the node reads from memory when it runs as a kernel
 *                  of its own (unfused): each distinct input once, at its
 *                  dtype's element size; an EMBEDDING reads only the gathered
 *                  rows, a SLICE only the slice; scalar constants are kernel
 *                  arguments (0 bytes).
 *   bytes_written  what it writes: its output (0 for a RESHAPE, which is a
 *                  view of a contiguous buffer, and for the leaves that
 *                  already hold their data: INPUT, PARAM, ARG, CONST).
 *   comm_bytes     the payload of a collective or transfer, in the sense of
 *                  nccl-tests' "size" (the full buffer of an all-reduce or
 *                  reduce-scatter, the gathered output of an all-gather).
 *                  Turning it into time (ring/tree, bus bandwidth) is
 *                  cost.c's business, not this file's.
 *
 * Fusion (fuse.h) regroups nodes into kernels; its per-kernel bytes count
 * only the values that cross kernel boundaries, using ircost_read_bytes.
 *
 * Sums are doubles: the counts are integers, exact up to 2^53 (9e15), and a
 * 1T-parameter model's step (1e19 FLOPs) would overflow no double but would
 * come close to int64's limit once multiplied by micro-batches. */
#ifndef HPDL_IR_COST_H
#define HPDL_IR_COST_H

#include <stdint.h>

#include "ir.h"

/* What kind of work a node is; the roofline treats each differently. */
typedef enum {
  IRC_LEAF,        /* INPUT, PARAM, ARG, CONST, FILL, IOTA: no arithmetic */
  IRC_GEMM,        /* MATMUL: compute bound, tensor cores */
  IRC_ELEMENTWISE, /* maps: memory bound */
  IRC_REDUCTION,   /* reductions and row-wise ops (softmax, cross-entropy) */
  IRC_DATA,        /* data movement: transpose, slice, concat, gather, ... */
  IRC_COMM,        /* collectives and point-to-point transfers */
  IRC_CALL,        /* a CALL of a graph: the sum of its nodes */
  IRC_NCLASSES
} IrCostClass;

typedef struct {
  IrCostClass cls; /* a node's class; IRC_CALL for a CALL and for sums */
  double flops;
  double bytes_read;
  double bytes_written;
  double comm_bytes;
  /* The same totals split by class (a CALL's and a graph's sums keep the
   * class of each node inside): flops == sum of flops_of[], etc. */
  double flops_of[IRC_NCLASSES];
  double bytes_of[IRC_NCLASSES]; /* read + written */
  double nodes_of[IRC_NCLASSES]; /* node executions (a CALL's nodes x repeat) */
} IrCost;

const char *ircost_class_name(IrCostClass c);

/* The class of an op (CALL gives IRC_CALL). */
IrCostClass ircost_op_class(IrOp op);

/* FLOPs per output element of an elementwise op (ACT_GRAD: see ircost_node,
 * it depends on the op whose derivative it is); -1 for ops that are not
 * elementwise maps. */
double ircost_elementwise_flops(IrOp op);

/* Query-key pairs attention node n (ATTENTION or its backward) over q and k
 * computes, per head: T x S, or the causal share. */
double ircost_attention_pairs(const IrNode *n, const IrNode *q, const IrNode *k);

/* A convolution op's GEMM (im2col's, ir_cost.c): `batch` independent
 * products [M, K] x [K, N] (batch = groups; the images are folded into N or,
 * for the filter gradient, into K); or the fused head's logit GEMM [rows, C] x
 * [C, V] (LINEAR_CE's; its backward's two counted as batch 2). 0 for other
 * ops. */
int ircost_conv_gemm(const IrGraph *g, const IrNode *n, double *batch, double *M, double *N, double *K);

/* The cost of one execution of `node` of graph `g`. A CALL costs its graph's
 * cost x its repeat count (attr[1]), recursively. */
IrCost ircost_node(const IrModule *m, const IrGraph *g, int node);

/* The cost of one execution of a graph: the sum of its nodes (CALLs
 * included as above). ircost_graph(m, m->graphs[0]) is one micro-batch's
 * forward pass. */
IrCost ircost_graph(const IrModule *m, const IrGraph *g);

/* Bytes that `node` reads from its k-th input: 0 when the input is a scalar
 * CONST (a kernel argument) or when the node is a RESHAPE (a view), the
 * gathered rows for EMBEDDING's table, the slice for SLICE, else the whole
 * input. */
double ircost_read_bytes(const IrModule *m, const IrGraph *g, int node, int k);

/* acc += c x times (class arrays included; acc->cls is left as it is). */
void ircost_accumulate(IrCost *acc, const IrCost *c, double times);

/* Parameters of the model: each logical parameter's elements x its copies
 * (layers of a repeat); a tied weight is one parameter, counted once; state
 * parameters (running statistics) are not counted. */
int64_t ircost_param_count(const IrModule *m);
/* The same in bytes, at each parameter's dtype. */
int64_t ircost_param_bytes(const IrModule *m);

#endif
