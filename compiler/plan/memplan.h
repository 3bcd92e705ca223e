/* memplan.h - the static memory plan of a per-rank program.
 *
 * Input: a differentiated module (autodiff.h: a step graph, block graphs
 * B.fwd / B.grad) and optionally its fusion (fuse.h). Output, per graph: the
 * liveness of every value, which values share a buffer (views, in-place
 * reuse), an offset for every buffer in one arena per graph, the arena size
 * and the peak of live bytes; per rank: the regions of parameters,
 * gradients, optimizer state and inputs, and the totals.
 *
 * Model (the executor / code generators must run the program this way; the
 * reference executor's accounting hook, interp.h, follows it exactly):
 *
 *   Steps. A graph's nodes run in id order (the executor's order); node i
 *   is step i, and step nnodes is the return. A value lives from its
 *   definition to its last use, inclusive: at step i the output of node i
 *   and all of its inputs exist together; an input whose last use is i is
 *   released after it. Graph outputs live until the return. A value nothing
 *   reads lives for its own step only.
 *
 *   External values. PARAM, INPUT and ARG nodes read storage the graph does
 *   not own (the parameter region, the input region, the caller's buffers or
 *   stash) and take no arena space; neither does a view of one.
 *
 *   Views. A RESHAPE is a view: it shares its input's buffer, which then
 *   lives until the last use of either.
 *
 *   In-place reuse. An elementwise op (IRF_ELEMENTWISE) writes its output
 *   into the buffer of an input when (1) mem_inplace_ok: the input has the
 *   output's element count and element size (so it is read at the same
 *   index the output is written), (2) the input's buffer is the graph's own
 *   (not external), and (3) that buffer dies at this op: the input and every
 *   view sharing the buffer have their last use here and none of them is a
 *   graph output. The first input in operand order that qualifies is taken.
 *   Reading x[i] before writing y[i] at the same index is safe for every
 *   elementwise op of ir_ops.h.
 *
 *   Calls. A CALL runs its graph `count` times in a workspace: a buffer of
 *   the caller live at the CALL's step only, as large as the callee's arena
 *   (its peak of live bytes when counting the peak). Output 0 of an
 *   iteration is copied into the CALL's own output buffer, which is argument
 *   0 of the next iteration (so the carry needs no extra space); outputs
 *   1.. of a SAVE call are copied into its stash; gradient outputs
 *   (IrGraph.grad_params) are added to the gradient region.
 *
 *   Stashes. A SAVE call keeps, per layer, the iteration's arguments and the
 *   callee's outputs 1.. (autodiff.h) until its BACKWARD call has run: a
 *   stash buffer of count x (bytes per layer) in the caller's arena, live
 *   from the SAVE call's step to the BACKWARD call's step inclusive (to the
 *   return when no BACKWARD call undoes it). It is reserved whole at the SAVE
 *   call.
 *
 *   Peak. A graph's peak is the maximum over its steps of the bytes of the
 *   live buffers, where a workspace counts its callee's peak. It is what a
 *   perfect allocator would need and what the executor's accounting
 *   measures. The arena (offsets of every buffer) is at least the peak: the
 *   buffers are aligned (MemOptions.align) and packing intervals can leave
 *   gaps.
 *
 * Offsets: greedy by size with best fit (Pisarchyk and Lee, "Efficient
 * Memory Management for Deep Neural Net Inference", 2020, "Greedy by Size
 * for Offset Calculation"; TensorFlow Lite's arena planner): buffers are
 * taken largest first (ties: earlier definition, then lower id); each goes
 * into the smallest gap between the buffers already placed whose intervals
 * overlap its own, or after the highest of them when no gap fits.
 *
 * Fusion. Given the module's FuseResult, a second plan per graph runs the
 * kernels in their listed order (step k = kernel k) and gives memory only
 * to values that cross a kernel boundary (a kernel's outputs): values
 * internal to a kernel stay in registers, a CONST read only by loop, row
 * and gemm kernels is an immediate, and a kernel whose result nobody reads
 * still gets a buffer for it (its step only).
 * An unfused RESHAPE (a `view` kernel) is a view; folded shape ops are
 * internal. In-place reuse is narrower than unfused: only a loop kernel,
 * and only into an input whose buffer dies there, that has the iteration
 * space's element count and element size, and that every node of the
 * kernel reads elementwise over the whole space (not through a folded index
 * map such as a transpose, whose reads run ahead of the writes); each
 * output takes the first such input not yet taken. The code generator must
 * then load a loop kernel's inputs at an index before it stores its outputs
 * there. Row kernels (several sweeps over a row), GEMMs and the rest never
 * write in place. The difference of the two peaks is what fusion saves; it
 * can be negative: a kernel that sums several GEMM results keeps them all
 * live where unfused adds free them one by one.
 *
 * Per rank: the parameters the program uses (for a block's parameters, the
 * copies of the layers its CALLs run), their gradients and the optimizer
 * state, sized by cost_model_states (cost.h, docs/planner.md Sec. 5, the
 * planner's own formula) from the element count, the precision, the
 * optimizer and the ZeRO stage over dp ranks; the model inputs; and the
 * entry graph's arena. Values are sized by their IR dtypes, which the
 * lowering makes f32 whatever train.precision says (so a bf16 run is
 * planned with f32 activations until the IR carries the precision).
 * Not modelled: scratch inside an op (communication buckets, a GEMM's
 * workspace) and micro-batches in flight under a pipeline schedule (the
 * plan is one micro-batch's step; a schedule keeping m micro-batches in
 * flight holds m stashes). */
#ifndef HPDL_MEMPLAN_H
#define HPDL_MEMPLAN_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "autodiff.h"
#include "diag.h"
#include "fuse.h"
#include "ir.h"
#include "sema.h"

/* How a value gets its memory. */
typedef enum {
  MEM_EXTERNAL, /* PARAM / INPUT / ARG, or a view of one: storage outside the arena */
  MEM_OWN,      /* a buffer of its own */
  MEM_VIEW,     /* a RESHAPE sharing the buffer of `of` (its input) */
  MEM_INPLACE,  /* an elementwise op writing into the buffer of its input `of` */
  MEM_INTERNAL  /* fused plan: stays inside its kernel (no memory) */
} MemKind;

typedef struct {
  MemKind kind;
  int of;        /* VIEW / INPLACE (and a view of an external value): the input whose buffer it shares; else -1 */
  int buf;       /* index into MemGraph.bufs; -1 for EXTERNAL / INTERNAL */
  int def, last; /* steps: definition and last use (nsteps for a graph output) */
  int64_t bytes; /* the value's own size: numel x element size */
} MemValue;

typedef enum {
  MEMB_VALUE,     /* holds a value (and its views, and what is computed in place into it) */
  MEMB_WORKSPACE, /* the arena of the graph a CALL runs */
  MEMB_STASH      /* the activations a SAVE call keeps for its BACKWARD call */
} MemBufKind;

typedef struct {
  MemBufKind kind;
  int node;       /* VALUE: the value that allocates it; WORKSPACE, STASH: the CALL (the SAVE call) */
  int until;      /* STASH: the BACKWARD call that releases it, -1 when none */
  int def, last;  /* steps it lives */
  int64_t bytes;  /* live bytes: the value's size; a workspace: its callee's peak; a stash: count x per_layer */
  int64_t size;   /* bytes reserved in the arena: bytes aligned up; a workspace: its callee's arena */
  int64_t offset; /* in the graph's arena */
  int64_t count, per_layer; /* STASH: layers and bytes saved per layer */
} MemBuf;

typedef struct {
  int graph;
  int fused;        /* a plan of the kernels (steps are kernels) */
  int nsteps;       /* nnodes, or nkernels for a fused plan; step nsteps is the return */
  MemValue *values; /* per node */
  MemBuf *bufs;
  int nbufs;
  int64_t arena;    /* max over buffers of offset + size */
  int64_t peak;     /* max over steps of live bytes */
  int peak_step;    /* the first step where it is reached */
  int64_t stash;    /* bytes of the stashes of this graph's SAVE calls */
  int nviews, ninplace;
} MemGraph;

typedef struct {
  /* Model states (cost_model_states): training precision, optimizer (SGD
   * keeps a momentum buffer when sgd_momentum), ZeRO stage over dp ranks.
   * A zeroed MemOptions is fp32 SGD without momentum, no ZeRO, dp 1. */
  Precision precision;
  OptimizerKind optimizer;
  int sgd_momentum;
  int moments_bf16; /* the moments at 2 bytes a value (train.moments = bf16) */
  int zero;
  int64_t dp;
  int64_t align;            /* arena alignment of every buffer in bytes; <= 0: MEM_ALIGN */
  int entry;                /* the graph one step runs (autodiff's step); graph 0 by default */
  const FuseResult *fusion; /* optional: of this module; adds the fused plans */
  /* The CPU back end's: a kernel that adds a gradient output into the
   * parameter's gradient itself (fuse_grad_acc_output) has no buffer for it
   * in the fused plan (without the slot the kernel does not run). */
  int grad_into_slots;
} MemOptions;

enum { MEM_ALIGN = 64 }; /* a cache line / AVX-512 vector; every cudaMalloc'd arena base is 256-aligned */

typedef struct {
  const IrModule *m;
  MemOptions opts;
  MemGraph *graphs;  /* per module graph */
  MemGraph *fused;   /* per module graph when opts.fusion, else NULL */
  char *reached;     /* per graph: run by the entry graph (itself, or through CALLs) */
  /* the rank's regions, in bytes */
  int64_t param_elems; /* elements of the parameter copies the program uses */
  int64_t params, grads, optimizer, inputs;
  int64_t stash;       /* of the entry graph's SAVE calls (inside its arena) */
  int64_t arena;       /* the entry graph's arena */
  int64_t peak;        /* the entry graph's peak of live bytes */
  int64_t total;       /* params + grads + optimizer + inputs + arena: the static footprint */
  int64_t total_peak;  /* params + grads + optimizer + inputs + peak */
  int64_t fused_arena, fused_peak; /* the entry graph's, with fusion; 0 without */
} MemPlan;

/* The in-place rule's part that depends on the op only: node `node` of g is
 * elementwise and its input k has its element count and element size. */
int mem_inplace_ok(const IrGraph *g, int node, int k);

/* The fused plan's rule, the part that depends on the kernel: kernel k of
 * fg is a loop kernel, x one of its inputs and y one of its outputs, both
 * of its iteration space's size and one element size, every node reading x
 * elementwise over the whole space; or a cross-entropy with its backward
 * (fuse_ce_pair), x the logits and y their gradient. (The planner's
 * liveness follows it.) */
int mem_fused_inplace_ok(const FuseGraph *fg, const IrGraph *g, int k, int x, int y);

/* Bytes a SAVE call (node `node` of graph `graph`) keeps per layer: its
 * arguments and its callee's outputs 1... */
int64_t mem_stash_per_layer(const IrModule *m, int graph, int node);

/* Plans every graph of a verified module. NULL when the entry graph does
 * not exist, a CALL names a graph that does not exist, graphs call each
 * other in a cycle, or opts->fusion is of another module (none of which a
 * verified module with its own fusion has). Everything lives in `arena`;
 * opts may be NULL (defaults). */
MemPlan *mem_plan_module(Arena *arena, const IrModule *m, const MemOptions *opts);

/* Checks a plan: every buffer inside its arena and aligned; no two buffers
 * whose intervals overlap share a byte; every value lives within its
 * buffer's interval; views are RESHAPEs of their `of`, in-place pairs
 * elementwise with mem_inplace_ok and `of` dying at that step; peak <=
 * arena; workspaces as large as their callee's arena. Returns the number of
 * problems, each printed to `out` when not NULL. */
int mem_check(const MemPlan *p, FILE *out);

/* Stable text form (`hpdlc emit memory`, goldens in tests/memplan): the
 * graphs the entry runs, each with every value that takes arena space, in
 * step order (bytes, offset, [definition, last use]; `ret` is the return),
 * a CALL's workspace and stash after it, then the fused plan's summary; at
 * the end a `rank` block with params, grads, optimizer, inputs, activations
 * and totals. Sizes are bytes.
 *   graph forward.grad (entry; args 1, count 1): arena 9462016, peak 9462016 at %8; 37 buffers, 0 views, 13 in place {
 *     %3 embedding f32[8, 64, 64]: 131072 @9199616 [3, 7]
 *     %7 add f32[8, 64, 64]: in place of %3 @9199616 [7, 8]
 *     %8 call f32[8, 64, 64]: 131072 @9330688 [8, 49]
 *     ws %8 blocks.fwd x 2: 3153920 (peak 3153920) @6045696 [8]
 *     stash %8 until %49: 2 x 3022848 = 6045696 @0 [8, 49]
 *     ...
 *   }
 *   fused forward.grad: 33 kernels, 29 buffers, 3 in place, 18 values inside kernels; arena 9462016, peak 9462016 (+0 vs unfused) */
void mem_print(FILE *out, const MemPlan *p);

/* MemOptions of a checked model's train and parallel blocks (auto dp and
 * ZeRO count as 1 and 0); entry and fusion are left for the caller. */
void mem_options_from_model(const SemModel *model, MemOptions *opts);

#endif
