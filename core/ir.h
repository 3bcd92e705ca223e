/* ir.h - the tensor IR: SSA graphs of typed, shaped tensor ops.
 *
 * A module holds graphs: graphs[0] is the model's forward (its output 0 is
 * the loss); a `repeat N Block(...)` becomes its own graph, called by a CALL
 * node with count N, so a 96-layer model is priced and printed as one block.
 * Nodes are stored in topological order: every input has a smaller id.
 * Every dimension is concrete: the symbolic batch B is bound to the micro
 * batch when the checked model is lowered. */
#ifndef HPDL_IR_H
#define HPDL_IR_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "conv.h"
#include "ir_ops.h"
#include "semtypes.h"
#include "span.h"

typedef enum {
#define X(id, name, nin, flags) IR_##id,
  IR_OPS(X)
#undef X
  IR_OP_COUNT
} IrOp;

const char *ir_op_name(IrOp op);
int ir_op_flags(IrOp op);
int ir_op_arity(IrOp op); /* -1 variadic */

/* Process groups a collective runs over. */
/* EP: expert parallelism, ep consecutive data-parallel ranks; EDP: the
 * data-parallel ranks holding the same experts (dp / ep of them), over which
 * expert parameters' gradients are reduced. */
typedef enum { IRG_DP, IRG_TP, IRG_PP, IRG_CP, IRG_EP, IRG_EDP, IRG_COUNT } IrGroup;
const char *ir_group_name(IrGroup g);

enum { IR_MAX_RANK = SEM_MAX_RANK, IR_NATTR = 24 };

typedef struct {
  IrOp op;
  DType dtype;
  int rank;
  int64_t dims[IR_MAX_RANK];
  int *in;      /* input node ids */
  int nin;
  int64_t attr[IR_NATTR];
  double fattr;
  const char *name; /* the source name it was assigned to, or NULL */
  Span span;        /* where it comes from in the .hpd source */
} IrNode;

typedef struct {
  Arena *arena;
  const char *name;  /* "forward", "blocks" */
  IrNode *nodes;
  int nnodes, cap;
  int *outputs;
  int noutputs;
  int nargs;         /* ARG nodes 0..nargs-1 */
  int64_t count;     /* how many times it runs per call (repeat), 1 for graph 0 */
  /* Set by autodiff on the graphs it makes: the last ngrad_params outputs are
   * d loss / d parameter grad_params[k] (copy `layer` of the run), which the
   * executor adds to its gradient store whenever the graph runs; a parameter
   * read in two places (a tied table) may be named twice, once per part. */
  int *grad_params;
  int ngrad_params;
  /* Set by autodiff on the training step (forward.grad): nodes before
   * fb_split are its forward part F (one micro-batch's forward, ending with
   * the activation SEND of a pipeline chunk), the rest its backward part B
   * (the gradient RECV, the backward, the parameter gradients and the input
   * gradient's SEND). A pipeline schedule runs F and B of a micro-batch
   * apart; the values F makes and B reads are its stash (fbsplit.h). 0: the
   * graph is not cut. */
  int fb_split;
} IrGraph;

/* CALL's attr[2], the mode (autodiff's convention; see autodiff.h):
 *   PLAIN     the forward: the inputs are the arguments; layers 0..count-1;
 *             output 0 of one iteration becomes argument 0 of the next.
 *   SAVE      as PLAIN, and the executor also keeps, per layer, the
 *             iteration's arguments and its outputs 1.. (saved activations).
 *   BACKWARD  inputs (dy, the SAVE call it undoes); runs the called backward
 *             graph for layers count-1 down to 0 with the arguments (dy, the
 *             layer's saved arguments, its saved outputs 1..); output 0 (dx)
 *             becomes argument 0 of the next; the result is dx of layer 0. */
enum { IR_CALL_PLAIN = 0, IR_CALL_SAVE = 1, IR_CALL_BACKWARD = 2 };

/* A logical (unsharded) parameter. Parameters of a repeated block exist
 * `count` times: their names contain "{i}" where the layer index goes. */
typedef struct {
  const char *name;  /* "wte.weight", "blocks.{i}.attn.q_proj.weight" */
  DType dtype;
  int rank;
  int64_t dims[IR_MAX_RANK];
  SemInit init;
  ShardKind shard;
  int graph;         /* the graph whose PARAM nodes use it */
  int64_t count;     /* copies (layers of the repeat), 1 otherwise */
  Span span;
  /* After partitioning: the logical shape, and the axis split over
   * split_group (-1 when every rank holds all of it). */
  int64_t full_dims[IR_MAX_RANK];
  int split_axis;
  IrGroup split_group;
  /* An expert shard under tensor parallelism is split twice: its experts
   * over the expert group (split_*), and each expert's matrix along
   * split2_axis over split2_group (the tensor group); -1: once only. */
  int split2_axis;
  IrGroup split2_group;
  /* Vocabulary padding (parallel.vocab_pad): > 0 when axis 0 of full_dims
   * is padded and only its first logical_rows rows are the model's (the
   * rest stay zero; checkpoints and the initial values are logical). */
  int64_t logical_rows;
  /* ZeRO-3 (dpsync.h): the rank holds one of dp_shards pieces of the
   * flattened, zero-padded tensor of shape dp_dims (rank dp_rank) it would
   * hold otherwise, and dims is [piece]; dp_shards is 0 when it holds all. */
  int dp_shards;
  int dp_rank;
  int64_t dp_dims[IR_MAX_RANK];
  /* A running statistic (batch norm's running mean and variance): not
   * trained (no optimizer; its gradient is zeros) but written by the
   * forward's STATE_UPDATE; whole on every rank (never ZeRO-sharded). */
  int state;
} IrParam;

/* An expert shard: a parameter split over the expert group (ZeRO and the
 * gradient sum go over the ranks holding the same experts, IRG_EDP). */
static inline int ir_param_is_expert(const IrParam *p) { return p->split_axis >= 0 && p->split_group == IRG_EP; }
/* The elements of one copy of a parameter (one layer of a repeat), and of
 * all its copies. */
static inline int64_t ir_param_numel(const IrParam *p) {
  int64_t n = 1;
  for (int d = 0; d < p->rank; d++) n *= p->dims[d];
  return n;
}
static inline int64_t ir_param_copies(const IrParam *p) { return p->count > 1 ? p->count : 1; }
static inline int64_t ir_param_numel_all(const IrParam *p) { return ir_param_numel(p) * ir_param_copies(p); }

typedef struct {
  const char *name;
  DType dtype;
  int rank;
  int64_t dims[IR_MAX_RANK];
} IrInput;

/* A tensor shape of an extern's argument or result. */
typedef struct {
  int rank;
  int64_t dims[IR_MAX_RANK];
} IrExternShape;

/* One native function an EXTERN node calls: an `extern` declaration at one
 * binding of its dimension names (lowering makes one entry per declaration
 * and dimensions; call sites with equal dimensions share it). Every type is
 * f32. The calling convention is docs/language.md's ("Extern"). */
typedef struct {
  const char *name;    /* the declaration's name */
  const char *where;   /* "file.hpd:12", where it is declared (messages) */
  const char *library; /* as declared */
  /* What dlopen is given: a library with a slash resolved against the
   * declaring file's folder (compile time), or the artifact's copy (run
   * time); a bare name as declared (the dlopen search path). */
  const char *path;
  const char *symbol;
  const char *grad;    /* the gradient function, or NULL: no gradient flows */
  int nargs;
  IrExternShape *args; /* nargs */
  IrExternShape out;
  int ndims;           /* the dimension names' values, in order of first appearance */
  int64_t *dims;
  Span span;           /* the declaration (span_none when read from a chunk file) */
} IrExtern;

typedef struct {
  Arena *arena;
  IrGraph **graphs;
  int ngraphs, capgraphs;
  IrParam *params;
  int nparams, capparams;
  IrInput *inputs;
  int ninputs;
  int64_t micro_batch;
  IrExtern *externs; /* EXTERN's attr[0] indexes it; shared by the modules derived from this one */
  int nexterns;
  /* the source files a span's `file` indexes, where the module keeps them
   * (one read from a chunk file; the compiler's Diag holds its own) */
  const char **sources;
  int nsources;
} IrModule;

IrModule *ir_module_new(Arena *arena);
IrGraph *ir_graph_new(IrModule *m, const char *name);
/* Room for at least n nodes in g, so that a pass that knows about how many it
 * will add does not regrow the array (each doubling copies every node: a few
 * percent of a layout search, which builds a thousand programs). */
void ir_graph_reserve(IrGraph *g, int n);
int ir_add_param(IrModule *m, const IrParam *p);
/* The index of an extern entry equal to e (name and dimensions), added when new. */
int ir_add_extern(IrModule *m, const IrExtern *e);
/* numel of an extern argument or result shape */
int64_t ir_extern_numel(const IrExternShape *s);

/* ROPE's frequency of pair i of a head of D values is base^(-2i/D) x this
 * gain: 1 without YaRN; with it (attr[2], ir_ops.h) YaRN's blend of
 * interpolated (1 / factor) and kept (1) frequencies over the pairs between
 * the correction dimensions of beta_fast and beta_slow, as Hugging Face's
 * _compute_yarn_parameters computes it. The amplitude YaRN puts on cos and
 * sin (the attention factor) is not the op's: the layer scales the scores. */
double ir_rope_gain(const IrNode *n, int64_t i, int64_t D);
/* 0 without YaRN; else 1 and its factor and the ramp's ends lo < hi (pair
 * indices): gain(i) = (1 - keep) / factor + keep, keep = 1 - clamp((i - lo) /
 * (hi - lo), 0, 1), in that order of operations (the back ends compute it so) */
int ir_rope_yarn_range(const IrNode *n, int64_t D, double *factor, double *lo, double *hi);
/* ROPE's layout (attr[8], ir_ops.h): x is [B, H, T, D] (0) or [B, T, H, D] (1); the axes
 * of its heads and of its positions */
static inline int ir_rope_bthd(const IrNode *n) { return n->attr[8] != 0; }
static inline int ir_rope_heads_axis(const IrNode *n) { return n->attr[8] ? 2 : 1; }
static inline int ir_rope_pos_axis(const IrNode *n) { return n->attr[8] ? 1 : 2; }
/* ROPE's YaRN attributes from the settings (attr[2..8) of attr) */
void ir_rope_set_yarn(int64_t *attr, double factor, double beta_fast, double beta_slow, int64_t original, int truncate);
/* the double a ROPE attribute holds */
double ir_attr_f64(int64_t bits);

/* Appends a node; computes its type with the op's shape rule. `dims`/`rank`
 * give the output shape for ops whose shape is not implied by the inputs
 * (FILL, RESHAPE, EXPAND, SUM_TO, PAD, EMBEDDING_BWD, SLICE, INPUT, PARAM,
 * ARG, RECV); pass rank -1 otherwise. Returns the node id, or -1 when the
 * shape rule rejects the inputs (with the reason in *why when not NULL). */
int ir_add(IrGraph *g, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double fattr,
           DType dtype, int rank, const int64_t *dims, const char **why);

/* Appends a copy of node n (of this graph or another) with its inputs
 * renumbered through map (old id -> id in g). The type is stored as is, not
 * recomputed: ir_verify checks it afterwards. Returns the new node's id. */
int ir_add_copy(IrGraph *g, const IrNode *n, const int *map);

static inline IrNode *ir_node(IrGraph *g, int id) { return &g->nodes[id]; }

int64_t ir_numel(const IrNode *n);

/* Whether n is a TRANSPOSE of its last two axes and nothing else (a GEMM
 * reads such an operand through its op() flag). */
int ir_swaps_last_two(const IrNode *n);
/* Whether n is the heads' TRANSPOSE of split_heads / merge_heads: 4-D, perm
 * (0, 2, 1, 3), [B, T, H, D] <-> [B, H, T, D]. */
int ir_heads_transpose(const IrNode *n);
/* The convolution of a CONV2D, CONV2D_BWD_DATA or CONV2D_BWD_FILTER node
 * (conv.h): its attributes, the batch and the channels from whichever operands
 * hold them ((x, w), (dy, w), (x, dy)). */
ConvShape ir_conv_shape(const IrGraph *g, const IrNode *n);
/* The pooling of a POOL2D or POOL2D_BWD node (input 0 is x for both). */
PoolShape ir_pool_shape(const IrGraph *g, const IrNode *n);
int64_t ir_bytes(const IrNode *n); /* numel x element size */

/* Checks SSA order, arity, and that every node's stored type equals what its
 * shape rule computes. Returns the number of problems, printed to `out`. */
int ir_verify(const IrModule *m, FILE *out);

/* The type in which some PARAM node of m reads parameter p when it is not
 * the parameter's own (a bf16 GEMM's weight read as its 16-bit copy,
 * precision.h); the parameter's dtype when every node reads it as it is. */
DType ir_param_read_type(const IrModule *m, int p);

/* Each of nodes[0, n)'s readers, CSR: node v is read by node[u] at its input slot[u] for
 * u in [start[v], start[v + 1]), the readers in node order (a graph's outputs are none) */
typedef struct {
  int *start, *node, *slot;
} IrReaders;
IrReaders ir_readers(const IrNode *nodes, int n, Arena *a);

/* Removes the nodes of g that nothing reads (no node, no output) and whose
 * op `droppable` accepts, last to first, so that a chain of them goes whole;
 * the rest keep their order, renumbered (fb_split moves with them).
 * Returns how many went. */
int ir_drop_unread(IrGraph *g, int (*droppable)(IrOp op));

/* The fused head's ops (ir_ops.h: LINEAR_CE, LINEAR_LSE and their
 * gradients) by what they make: each row's value, dx or dw; IR_LINEAR_NONE
 * for any other op. ir_linear_targets: the LINEAR_CE family (it reads the
 * targets, input 2). */
typedef enum { IR_LINEAR_NONE = -1, IR_LINEAR_ROWS, IR_LINEAR_DX, IR_LINEAR_DW } IrLinearRole;
IrLinearRole ir_linear_role(IrOp op);
int ir_linear_targets(IrOp op);

/* Whether a kernel that reads value `in` alone and writes value `out` alone
 * may mask the padded logits in place: out is a VOCAB_MASK of in without a
 * tensor group, both of one type (fp32, or bf16 / fp16 as the head's product
 * is stored under 16-bit precision). The CUDA back end generates such a kernel so that
 * it also runs over one buffer (codegen_cuda.c) and the host program runs it
 * so where in dies there (runtime/device/devexec.c): one test for both. */
int ir_vocab_mask_in_place(const IrGraph *g, int in, int out);

/* The columns of a vocabulary shard of `local` rows starting at global row
 * `offset` that lie before the vocabulary's `rows` (its padding excluded);
 * rows <= 0: all of them. */
static inline int64_t ir_vocab_prefix(int64_t rows, int64_t offset, int64_t local) {
  if (rows <= 0) return local;
  int64_t v = rows - offset;
  return v < 0 ? 0 : v < local ? v : local;
}

/* For a step a pipeline schedule runs in halves (IrGraph.fb_split): every
 * pipeline transfer toward the next chunk (the activation) lies in the
 * forward part and every one toward the previous chunk (its gradient) in
 * the backward part, or the halves would wait for the wrong messages.
 * ir_verify checks only that the cut is inside the graph (a single-process
 * graph may loop a transfer back). Returns the number of problems. */
int ir_verify_pipeline_cut(const IrGraph *g, FILE *out);

/* Stable text form (golden tests compare it):
 *   graph forward (count 1) {
 *     %0 = input tokens : i32[4, 64]
 *     %5 = matmul %3, %4 : f32[4, 64, 256]      # gpt2.hpd:14
 *   } -> %42
 */
void ir_print(const IrModule *m, FILE *out);
void ir_print_graph(const IrModule *m, const IrGraph *g, FILE *out);

#endif
