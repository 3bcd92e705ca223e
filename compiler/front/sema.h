/* sema.h - semantic analysis: names, types, shapes, the parallel layout.
 *
 * sema_check() elaborates the root model: every layer is instantiated with
 * concrete parameter values (defaults and -D overrides), every forward is
 * checked with the shapes that reach it, and the result is the checked
 * model (SemModel) that lowering to the tensor IR reads. Instances with equal
 * arguments are shared, so `repeat 96 Block(...)` is checked once. */
#ifndef HPDL_SEMA_H
#define HPDL_SEMA_H

#include <stdint.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "loader.h"
#include "semtypes.h"
#include "symdim.h"
#include "value.h"


typedef struct {
  DType dtype;
  int rank;
  SymDim *dims[SEM_MAX_RANK];
} TensorType;

/* "f32[B, T, 768]" */
const char *sem_type_str(Arena *a, const TensorType *t);

/* ---- builtin tensor operations (the surface of the language) ----
 * X(id, name, min_args, max_args) */
#define SEM_BUILTINS(X)          \
  X(RELU, "relu", 1, 1)          \
  X(GELU, "gelu", 1, 1)          \
  X(SILU, "silu", 1, 1)          \
  X(SIGMOID, "sigmoid", 1, 1)    \
  X(TANH, "tanh", 1, 1)          \
  X(EXP, "exp", 1, 1)            \
  X(LOG, "log", 1, 1)            \
  X(SQRT, "sqrt", 1, 1)          \
  X(RSQRT, "rsqrt", 1, 1)        \
  X(ABS, "abs", 1, 1)            \
  X(SQUARE, "square", 1, 1)      \
  X(NEG, "neg", 1, 1)            \
  X(ADD, "add", 2, 2)            \
  X(SUB, "sub", 2, 2)            \
  X(MUL, "mul", 2, 2)            \
  X(DIV, "div", 2, 2)            \
  X(POW, "pow", 2, 2)            \
  X(MAXIMUM, "maximum", 2, 2)    \
  X(MINIMUM, "minimum", 2, 2)    \
  X(MATMUL, "matmul", 2, 2)      \
  X(SUM, "sum", 1, 3)            \
  X(MEAN, "mean", 1, 3)          \
  X(MAX, "max", 1, 3)            \
  X(SOFTMAX, "softmax", 1, 2)    \
  X(LOG_SOFTMAX, "log_softmax", 1, 2) \
  X(RESHAPE, "reshape", 2, 2)    \
  X(TRANSPOSE, "transpose", 1, 3) \
  X(SPLIT_HEADS, "split_heads", 2, 2) \
  X(MERGE_HEADS, "merge_heads", 1, 1) \
  X(SPLIT, "split", 2, 3)        \
  X(CONCAT, "concat", 1, 2)      \
  X(SLICE, "slice", 1, 1)        \
  X(EMBEDDING, "embedding", 2, 2) \
  X(ARANGE, "arange", 1, 1)      \
  X(CAUSAL_MASK, "causal_mask", 1, 1) \
  X(ROPE, "rope", 1, 7)          \
  X(REPEAT_KV, "repeat_kv", 2, 2) \
  X(ATTENTION, "attention", 3, 7) \
  X(CROSS_ENTROPY, "cross_entropy", 2, 2) \
  X(DROPOUT, "dropout", 1, 2)    \
  X(TOPK_VALUES, "topk_values", 2, 2) \
  X(TOPK_INDICES, "topk_indices", 2, 2) \
  X(TAKE, "take", 2, 2)          \
  X(ONE_HOT, "one_hot", 2, 2)    \
  X(MOE_DISPATCH, "moe_dispatch", 3, 7) \
  X(MOE_COMBINE, "moe_combine", 3, 3) \
  X(AUX_LOSS, "with_aux_loss", 3, 3) \
  X(CONV2D, "conv2d", 2, 6)      \
  X(MAX_POOL2D, "max_pool2d", 2, 4) \
  X(AVG_POOL2D, "avg_pool2d", 2, 4) \
  X(ADAPTIVE_AVG_POOL2D, "adaptive_avg_pool2d", 2, 2) \
  X(FLATTEN, "flatten", 1, 2)    \
  X(BATCH_NORM, "batch_norm", 3, 8) \
  X(BALANCE_EXPERTS, "balance_experts", 3, 4)

typedef enum {
#define X(id, name, lo, hi) SOP_##id,
  SEM_BUILTINS(X)
#undef X
  SOP_COUNT
} SemOp;

const char *sem_op_name(SemOp op);

typedef struct SemLayer SemLayer;
typedef struct SemExpr SemExpr;

/* ---- parameters (weights) ---- */
/* ShardKind, InitKind, SemInit: semtypes.h */

typedef struct {
  const char *name;
  TensorType type; /* all dims constant */
  int64_t numel;
  SemInit init;
  ShardKind shard;
  Span span;
  /* A running statistic (batch_norm's running_mean / running_var) or a
   * routing bias (balance_experts'): updated by the forward, not trained,
   * not counted among the parameters */
  int state;
} SemParam;

/* A sub-layer: `name = Layer(...)` or `name = repeat N Layer(...)`. */
typedef struct {
  const char *name;
  SemLayer *layer;
  int64_t repeat; /* 1 for a plain sub-layer */
  Span span;
  /* `repeat i in N Layer(...)`: copy k's instance (its arguments evaluated
   * with i = k), the copies applied in sequence and lowered one by one;
   * NULL for a plain repeat (layer is every copy) */
  SemLayer **copies;
} SemChild;

typedef struct {
  const char *name;
  TensorType type; /* may hold symbolic dims (B) */
  Span span;
} SemInput;

/* ---- the checked forward: a DAG of typed expressions ---- */
typedef enum {
  SE_INPUT,  /* model input `index` */
  SE_ARG,    /* forward argument `index` */
  SE_PARAM,  /* this layer's parameter `index` */
  SE_CHILD_PARAM, /* a child's parameter: child `index`, param `index2` */
  SE_SCALAR, /* a compile-time scalar (value.f), broadcast */
  SE_OP,     /* builtin op with args and attributes */
  SE_CALL,   /* call of child `index` (a SemFunc) */
  SE_EXTERN, /* call of an extern declaration */
  SE_TUPLE_GET, /* element `index` of a tuple-valued arg[0] (split) */
} SemExprKind;

typedef struct SemFunc SemFunc;

struct SemExpr {
  SemExprKind kind;
  SemOp op;
  TensorType type;
  int is_tuple; /* split: a tuple of `ntuple` tensors, each of `type` */
  int ntuple;
  int index, index2;
  double scalar;
  /* per op: axis, keepdim, n ...; slice: lo[0..7], hi[8..15], dropped axis[16..23] */
  int64_t attr[SEM_MAX_RANK * 3];
  int nattr;
  SemExpr **args;
  int nargs;
  SemFunc *callee;          /* SE_CALL */
  SemFunc **callees;        /* SE_CALL of an indexed repeat: copy k's forward */
  const AstDecl *ext;       /* SE_EXTERN */
  Span span;
};

/* One checked forward of a layer instance, for one list of argument types. */
struct SemFunc {
  SemLayer *layer;
  TensorType *arg_types;
  int nargs;
  SemExpr *result;
  SemFunc *next; /* other argument types of the same instance */
};

struct SemLayer {
  const AstDecl *decl;
  const char *display; /* "Linear(768, 2304)" */
  Value *args;         /* one per declared parameter, after defaults */
  int nargs;
  SemParam *params;
  int nparams;
  SemChild *children;
  int nchildren;
  SemInput *inputs; /* models only */
  int ninputs;
  const AstStmt *forward;
  SemFunc *funcs;
  int64_t param_count; /* including children x repeat */
  SemLayer *next_instance;
};

/* ---- training and layout ---- */
/* Precision, OptimizerKind, DecayKind, Schedule, Recompute, Compression: semtypes.h */

typedef struct {
  int64_t global_batch, micro_batch, steps, seed, log_every;
  Precision precision;
  double loss_scale; /* 0 = dynamic */
  OptimizerKind optimizer;
  double lr, momentum, beta1, beta2, eps, weight_decay, min_lr, clip;
  int moments_bf16; /* train.moments = bf16: the optimizer's moments (AdamW's m, v; SGD's momentum) in 16 bits */
  int fp8_current;  /* train.fp8_scaling = current: FP8's per-tensor scale from the tensor's own amax, a pass of its
                       own before the cast (Transformer Engine 2's Float8CurrentScaling, torchao's tensorwise dynamic
                       scaling), not the delayed scaling's history (the amax taken inside the cast) */
  int64_t warmup;
  DecayKind decay;
  const char *data;
  int64_t ckpt_every, ckpt_keep;
  const char *ckpt_dir;
  int ckpt_async;
} SemTrain;

/* How pipeline chunks share the layers: balanced by the planner's forward +
 * backward time (plan_chunk_layers, plan.h), equal counts, or equal counts
 * with the prologue (embeddings) and the epilogue (head and loss) counting
 * as one layer each, so that with pipeline x virtual = layers + 2 the first
 * chunk runs only the embeddings and the last only the head (Llama 3's
 * pipeline; Megatron-LM's account_for_embedding_in_pipeline_split and
 * account_for_loss_in_pipeline_split). */
typedef enum { BALANCE_COST, BALANCE_LAYERS, BALANCE_ENDS } PipeBalance; /* the words of `balance` */

/* The word of a balance ("cost", "layers", "ends"). */
const char *sem_balance_name(PipeBalance b);

/* -1 in an int field means `auto` (the planner chooses). */
typedef struct {
  const char *cluster_name;
  int64_t nodes, gpus_per_node, gpus;
  int64_t dp, tp, pp, cp, virtual_stages, zero;
  int64_t ep; /* expert parallelism, carved from dp: 0 not written (none; --search chooses), -1 auto */
  int sp;       /* -1 auto, 0 off, 1 on */
  int overlap;  /* -1 auto, 0 off, 1 on */
  int schedule; /* Schedule or -1 */
  int recompute; /* Recompute or -1 */
  PipeBalance balance;
  Compression compression;
  double topk_ratio;
  int64_t num_micro_batches; /* global_batch / (dp * micro_batch) when known */
  int tp_overlap;   /* 0, 1: tensor-parallel collectives overlapped with the GEMMs next to them */
  int64_t vocab_pad; /* > 0: vocabulary-sized split dimensions padded to a multiple of vocab_pad x tensor; 0: none */
  int fused_ce;      /* 0, 1: the head's GEMM and its cross-entropy as one op, the logits never stored (headloss.h) */
  /* >= 1: the recompute policy takes the first recompute_layers layers of
   * each pipeline chunk, the rest keep their activations (Megatron-LM's
   * --recompute-method block --recompute-num-layers); 0: every layer */
  int64_t recompute_layers;
  /* parallel.expert_tensor: 0 not written (= tensor: each expert split over the
   * tensor group, Megatron-Core's default), 1: the experts whole, the expert
   * group folded over tensor x data ranks (MoE parallel folding; ep_fold) */
  int64_t expert_tensor;
  int ep_fold; /* expert_tensor = 1 with tensor > 1 and expert > 1 */
  /* parallel.dispatcher: how the experts' exchange crosses nodes - 0
   * alltoall (NCCL's or MPI's all-to-all, a copy of a token per destination
   * rank), 1 deepep (a copy per destination node, forwarded inside it over
   * the intra-node fabric, as DeepEP's and HybridEP's kernels; priced by
   * plan, refused by compile) */
  int dispatcher;
  /* parallel.cp_comm: how context parallelism's keys and values reach the
   * attention - 0 allgather (gathered over the context group before the
   * attention, the exchange exposed, as Llama 3 and PyTorch's context
   * parallelism run it), 1 ring (Megatron-LM's p2p ring: one attention a
   * block, each block's transfer under the attention of the one before),
   * -1 auto (plan --search prices both; compile needs one of them) */
  int cp_comm;
  /* parallel.engine: whose training step plan prices - 0 hpdl (the
   * program hpdl's runtime runs), 1 deepspeed (DeepSpeed's PipelineEngine:
   * pipeline transfers split over the tensor group and blocking, bf16
   * gradients added into fp32 copies after every micro-batch's backward,
   * the fp32 gradients all-reduced after the last one; docs/planner.md sec.
   * 11.1; priced by plan, refused by compile) */
  int engine;
} SemLayout;

/* Bounds on a cluster's and a layout's node counts, so that nodes x
 * devices per node cannot overflow (sema_blocks.c). */
enum { SEM_MAX_NODES = 1 << 20, SEM_MAX_GPUS_PER_NODE = 1 << 12 };

/* A cluster: from the catalog or a `cluster` declaration. */
typedef struct {
  const char *name;
  const char *device;
  int64_t gpus_per_node, nodes, nics_per_node;
  double intra_bytes_per_s, intra_latency_s, inter_bytes_per_s, inter_latency_s;
  int shared_device; /* CPU ranks sharing one machine: the layout sets the rank count */
  /* The device's catalog peak FLOP/s (every precision) and memory bandwidth
   * times these (a calibrated cluster, hpdlc plan --calibrate); 0 counts as 1. */
  double compute_scale, memory_scale;
  /* The device's own figures where the declaration gives them: a GPU the
   * catalog lacks, described as the catalog device it is most like (its
   * family: GEMM ceiling, attention kernels' figures). Bit k of `described`
   * set: figure k replaces the catalog's (SEM_FIG_*; a peak of 0 is "no such
   * precision"). The scales above apply on top. */
  unsigned described;
  double figures[10];
} SemCluster;

/* The figures a cluster may give its device (SemCluster.figures), in the
 * order of sem_figure_keys: memory (bytes), memory bandwidth (bytes/s), SMs,
 * then the dense peak FLOP/s of fp64, fp32, tf32, bf16, fp16, fp8, fp4. */
enum { SEM_FIG_MEMORY, SEM_FIG_MEMORY_BANDWIDTH, SEM_FIG_SMS, SEM_FIG_FP64, SEM_FIG_COUNT = 10 };
extern const char *const sem_figure_keys[SEM_FIG_COUNT];

typedef struct {
  SemLayer *model;
  SemFunc *forward; /* the model's forward; result is the loss */
  SemTrain train;
  SemLayout layout;
  SemCluster cluster;
  int has_cluster;
  int64_t seq_len;  /* the sequence dimension of the first input, when constant (0 for images) */
  int images;       /* the first input is a batch of images, float [B, C, H, W] (no sequence) */
  int64_t layers;   /* blocks of the largest repeat (pipeline stages split these) */
  int64_t repeats;  /* repeats of more than one block, outside repeats: one -> a pipeline splits its
                     * layers; none or several -> it cuts the forward where one value crosses (pipeline.h) */
  const AstDecl *train_decl, *parallel_decl;
} SemModel;

/* ---- options from the command line ---- */
typedef struct {
  const char *name;
  const char *value;
  const char *flag; /* the command-line flag it came from ("--tp"), for messages */
} SemDefine;

typedef struct {
  SemDefine *defines;
  int ndefines;
  /* `--dp 4` etc.: the parallel key (`data`, `tensor`, ...) and its text */
  SemDefine *layout;
  int nlayout;
  const char *model_name; /* --model */
  int *cli_error; /* set to 1 when a command-line value is invalid (exit 2) */
} SemOptions;

/* Checks a loaded program. Returns the checked model, or NULL when the root
 * file declares no model (then only declarations are checked) or on errors
 * (reported to diag). */
SemModel *sema_check(Arena *arena, Diag *diag, const LoadedProgram *prog, const SemOptions *opts);

/* Total parameters of the model (tied weights counted once). */
int64_t sem_param_count(const SemModel *m);

/* The parameters one token uses: sem_param_count but for the experts of a mixture of
 * experts, of which top_k of E count (the convention of MoE papers' "active
 * parameters"); the total where the model has no experts. */
int64_t sem_active_param_count(const SemModel *m);

/* The routing's node limit, as the model's (first) moe_dispatch states it: a token's
 * choices within group_top_k of `groups` consecutive blocks of the experts (DeepSeek-V3's
 * node-limited routing); 1 and 1 without one. 0 when the model has no moe_dispatch. */
int sem_moe_route_groups(const SemModel *m, int64_t *groups, int64_t *group_top_k);

#endif
