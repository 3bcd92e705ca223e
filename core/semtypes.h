/* semtypes.h - the value types the checked model, the IR and the artifact
 * share: element types, parameter sharding and initialisers, and the
 * training settings a compiled program carries (precision, optimizer,
 * pipeline schedule, recomputation).
 *
 * In the core (not the front end's sema.h, which includes this) because the
 * runtime reads them from artifacts without the compiler. Named sem_ as the
 * checker defines their words. */
#ifndef HPDL_SEMTYPES_H
#define HPDL_SEMTYPES_H

/* ---- element types ---- */
#define SEM_DTYPES(X) \
  X(F32, "f32", 4, 1) \
  X(F16, "f16", 2, 1) \
  X(BF16, "bf16", 2, 1) \
  X(F64, "f64", 8, 1) \
  X(I32, "i32", 4, 0) \
  X(I64, "i64", 8, 0) \
  X(BOOL, "bool", 1, 0)

typedef enum {
#define X(id, name, bytes, is_float) DT_##id,
  SEM_DTYPES(X)
#undef X
  DT_COUNT
} DType;

const char *sem_dtype_name(DType t);
int sem_dtype_bytes(DType t);
int sem_dtype_is_float(DType t);

enum { SEM_MAX_RANK = 8 };

/* Bounds on what a model may ask for, so that no count the compiler, the
 * planner or the runtime forms overflows 64 bits and no hostile -D makes
 * them allocate terabytes (docs/reliability.md). A parameter, all its
 * copies in a repeat together: 2^48 elements (1 PB in fp32; the artifact
 * reader enforces the same, ART_MAX_ELEMENTS). One value of a micro-batch
 * before partitioning: 2^50 elements (4.5 PB in fp32). A repeat: 65,536
 * layers (published models have at most a few hundred). */
#define SEM_MAX_PARAM_ELEMENTS ((int64_t)1 << 48)
#define SEM_MAX_VALUE_ELEMENTS ((int64_t)1 << 50)
#define SEM_MAX_REPEAT ((int64_t)65536)

/* ---- parameters ---- */
/* EXPERT_COLUMN / EXPERT_ROW: an expert's batched weight [E, n_in, n_out]:
 * axis 0 (the experts) over expert parallelism, and column / row over tensor
 * parallelism when there is no expert parallelism. */
typedef enum { SHARD_REPLICATED, SHARD_COLUMN, SHARD_ROW, SHARD_VOCAB, SHARD_EXPERT_COLUMN, SHARD_EXPERT_ROW } ShardKind;
const char *sem_shard_name(ShardKind k);

typedef enum { INIT_ZEROS, INIT_ONES, INIT_CONSTANT, INIT_NORMAL, INIT_UNIFORM } InitKind;

typedef struct {
  InitKind kind;
  double a, b; /* constant: a; normal: mean a, std b; uniform: lo a, hi b */
} SemInit;

/* ---- training and layout ---- */
/* PREC_FP8: Transformer-Engine-style FP8 training (GEMM inputs in FP8 with
 * per-tensor scales, the rest in bf16, fp32 master weights); PREC_MXFP8 the
 * same with OCP microscaling (a power-of-two scale a block of 32 values);
 * PREC_NVFP4 NVIDIA's 4-bit recipe (E2M1 values, an FP8 scale a block of
 * 16, a per-tensor one; Hadamard-rotated weight-gradient inputs). The
 * planner prices them, no back end runs them yet (sem_precision_priced_only). */
typedef enum { PREC_FP32, PREC_BF16, PREC_FP16, PREC_FP8, PREC_MXFP8, PREC_NVFP4 } Precision;
typedef enum { OPT_SGD, OPT_ADAMW } OptimizerKind;
typedef enum { DECAY_NONE, DECAY_COSINE, DECAY_LINEAR } DecayKind;
typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } Schedule;
/* RECOMPUTE_OPS: op-level selective recomputation as torchtitan's
 * "selective op" activation checkpointing - a block keeps its attention
 * outputs, its collectives' outputs and every other weight GEMM's output and
 * recomputes the rest (autodiff.c). RECOMPUTE_ACT (last: artifacts store the
 * number): selective's, and a gated activation's product (SwiGLU's
 * silu(gate) x up, the down projection's input) made again in the backward
 * rather than kept, as Megatron-Core's recompute module moe_act. */
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_OPS, RECOMPUTE_ACT } Recompute;
#define RECOMPUTE_LAST RECOMPUTE_ACT
typedef enum { COMPRESS_NONE, COMPRESS_FP16, COMPRESS_INT8, COMPRESS_TOPK, COMPRESS_BF16 } Compression;

const char *sem_schedule_name(Schedule s);
const char *sem_recompute_name(Recompute r);
const char *sem_compression_name(Compression c);
/* Compression's names in its order, NULL-terminated: the language's words,
 * the manifest's and the runtime's (comm.h's CommCompressKind agrees) */
extern const char *const sem_compression_names[];
int sem_compression_parse(const char *s); /* -1 when unknown */
/* 1 for the precisions hpdlc plan prices and no back end runs (fp8, mxfp8, nvfp4). */
int sem_precision_priced_only(Precision p);
const char *sem_precision_name(Precision p);

#endif
