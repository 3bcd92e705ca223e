/* nest.h - a fused loop, row or copy kernel as a loop nest over its
 * iteration space, independent of the back end that emits it.
 *
 * A nest is an iteration space D, the axes a sweep walks for reductions (a
 * row kernel's reduced group; for a loop kernel all of D), a small
 * expression DAG over D's indices and the stores of the kernel's outputs.
 * Each read of memory is an affine function of D's indices, composed
 * through the index maps fusion folded in (transpose, slice, expand,
 * reshape, repeat_kv's head division) and numpy broadcasting; axes that
 * every access walks contiguously are collapsed (nest_collapse), so an
 * elementwise chain over [B, T, C] is one loop over B*T*C with unit strides.
 * Expressions have a level: 0 for values of a point, 1 + the child's for a
 * reduction over the group, so a layernorm is three sweeps (mean, variance,
 * output). The CPU back end (codegen_cpu_kernel.c) turns a nest into LLVM
 * loops; the CUDA back end into a thread or a block per row. */
#ifndef HPDL_NEST_H
#define HPDL_NEST_H

#include <stdint.h>

#include "fuse.h"
#include "ir.h"

/* The kernel a nest is built for, and how the builder reports a problem. */
typedef struct {
  const IrGraph *g;
  const FuseGraph *fg;
  const FuseKernel *K;
  int kp;                   /* K's index in fg */
  const char *backend;      /* "CPU", "CUDA": named in messages */
  int (*dtype_ok)(DType t); /* element types the back end can load and store */
  void (*fail)(void *be, const char *msg);
  void *be;                 /* the back end's kernel state, passed to fail */
} NestKernel;

/* An affine index form: c + sum_j coef[j] * i_j + dcoef * (i_dax / dq) * i_j + dcoef * (i_dax / dq) over a space's axes. */
typedef struct {
  int64_t c;
  int64_t coef[IR_MAX_RANK];
  int dax;
  int64_t dq, dcoef;
} NestAff;

typedef enum { X_LOAD, X_CONST, X_UN, X_BIN, X_ACTGRAD, X_MASK, X_VMASK, X_DROP, X_INDEX, X_CASTI, X_ROUND, X_RED } NestXKind;

typedef struct {
  NestXKind kind;
  IrOp op;
  double p;
  int a, b;
  int full, level;
  int mem;             /* X_LOAD: the value read */
  DType dt;            /* X_LOAD: its dtype; X_ROUND: the 16-bit type a value is rounded to */
  NestAff off;             /* X_LOAD: element offset; X_DROP: linear index; X_INDEX: the index;
                              X_VMASK: the column */
  int redmax;          /* X_RED: max (else sum) */
  int64_t div;         /* X_RED: divide by (a mean), 0 none */
  int64_t attr;        /* X_MASK: 1 + zigzag group; X_DROP: stream */
  int64_t attr_cols;   /* X_MASK: 1 + group whose key blocks are in ring order */
  int64_t below, cols; /* X_VMASK: the vocabulary before padding; the local columns (attr:
                          1 + group whose rank picks the column block) */
  /* the back end's values (the CPU back end's LLVMValueRef) */
  void *v, *pre; /* value; X_DROP: base hash / X_MASK: rank, size */
  void *pre2;
  int recip;       /* a row-level divisor of full values: 1 / v is made with v */
  void *rv;   /* that reciprocal */
  int vsweep;
} NestX;

typedef struct {
  int x;
  int val;
  DType dt;
  NestAff off;
  int add; /* accumulate into memory (scatter-add) instead of storing */
  int full, sweep;
} NestStore;

typedef struct {
  const NestKernel *src;
  int R;
  int64_t D[IR_MAX_RANK];
  int rlo, rhi; /* the fuser's reduced group, for shapes (rlo == rhi: none) */
  int glo, ghi; /* the axes a sweep walks */
  int pinned[IR_MAX_RANK];
  NestX *x;
  int nx, capx;
  NestStore *st;
  int nst, capst;
  int *node_x; /* per graph node: its expression, -1 */
  /* after collapsing: new axes */
  int na;
  int64_t adim[IR_MAX_RANK];
  int afirst[IR_MAX_RANK], alast[IR_MAX_RANK], aset[IR_MAX_RANK];
  int axis_of[IR_MAX_RANK]; /* original axis -> new axis, -1 dropped (size 1) */
  void *iv[IR_MAX_RANK]; /* the back end's loop indices, NULL out of scope */
  int sweep_id;
  int columns;           /* column schedule: every expression is evaluated per point */
  int64_t scratch_bytes; /* the kernel's scratch (column accumulators) */
} Nest;

/* Reports a problem through k->fail, formatted; returns -1. */
int nest_fail(const NestKernel *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether node id belongs to k's kernel (not an input from another). */
int nest_in_kernel(const NestKernel *k, int id);
int nest_is_index_map(IrOp op);
void nest_row_strides(int rank, const int64_t *dims, int64_t *strides);

NestAff nest_aff_const(int64_t c);
NestAff nest_aff_axis(int j);
/* a + s * b; 0 when both have a division term on different axes. */
int nest_aff_addmul(NestAff *a, const NestAff *b, int64_t s);
int nest_aff_full(const Nest *N, const NestAff *a);
int nest_aff_allows(const NestAff *a, int j, int j2, const int64_t *D);
/* The offset of a row-major (or given-stride) walk of dims, from base. */
NestAff nest_contiguous_off(int rank, const int64_t *dims, const int64_t *strides_or_null, int64_t base);

void nest_init(Nest *N, const NestKernel *k, int rank, const int64_t *dims, int rlo, int rhi, int glo, int ghi);
void nest_free(Nest *N);
int nest_in_group(const Nest *N, int j);

int nest_new_x(Nest *N, NestXKind kind);
int nest_x_const(Nest *N, double v);
int nest_x_op(Nest *N, NestXKind kind, IrOp op, double p, int a, int b);
int nest_x_red(Nest *N, int child, int redmax, int64_t div);
int nest_x_load(Nest *N, int mem, DType dt, const NestAff *off);
void nest_add_store(Nest *N, int xi, int val, DType dt, const NestAff *off, int add);

/* The offset of reading value v at index e (affine over D, one per axis of
 * v), composed through the index maps folded into this kernel, down to the
 * memory value it reads (*mem). 0 when the composition is not affine. */
int nest_compose(Nest *N, int v, const NestAff *e, NestAff *off, int *mem);
int nest_node_index(const Nest *N, const IrNode *n, NestAff *e);
/* The expression of input v as read by a reader whose index over D is
 * er[0..rr) (numpy broadcasting aligns v's shape on the right). */
int nest_x_read(Nest *N, const NestAff *er, int rr, int v);
/* The expression of a loop / row kernel's node id. */
int nest_x_node(Nest *N, int id);
/* x as node id stores it: rounded to its 16-bit type when it has one */
int nest_x_stored(Nest *N, int id, int x);
/* The store of node v's value (its own shape, contiguous) as seen from D. */
void nest_store_node(Nest *N, int v, int xi);
/* Merges neighbouring axes every access walks contiguously (N->na, adim...). */
void nest_collapse(Nest *N);

/* What a loop, row, copy or leaf (fill) kernel runs, in order: nests, and
 * zero fills of a whole value (a pad's border: the interior is a nest after
 * it). A back end must finish a step before the next starts. */
typedef struct {
  int zero_value; /* >= 0: set this value's buffer to zero; the nest is unused */
  int loop_row;   /* the nest of a loop or row kernel (not a copy or fill) */
  Nest nest;      /* built, not yet collapsed */
} NestStep;

typedef struct {
  NestStep *step;
  int n, cap;
} NestSteps;

void nest_build_steps(NestSteps *S, const NestKernel *k);
void nest_free_steps(NestSteps *S);

#endif
