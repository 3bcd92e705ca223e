/* plan.h - the dry-run partition planner (`hpdlc plan`).
 *
 * The planner prices the partitioned program that `hpdlc compile` emits: the
 * checked model is lowered at the micro batch (lower.h), partitioned over
 * tensor / sequence / context parallelism (spmd.h), split into pipeline
 * chunks (pipeline.h) and differentiated per chunk with the recompute policy
 * (autodiff.h); the kernels of fusion (fuse.h) are priced with the roofline
 * and collective primitives of cost.h, and the pipeline schedule with the
 * simulator of schedule.h. Every formula and constant is in docs/planner.md
 * (sections 9-14).
 *
 * Rank order (Megatron-LM's): tensor parallelism varies fastest, then
 * context, then data, then pipeline; so a tensor group sits inside a node
 * and the data-parallel group of tp x cp >= gpus_per_node has one rank per
 * node.
 *
 * A PlanCtx caches, per (micro batch, tp, cp, sp, recompute), the lowered,
 * partitioned and differentiated program's prices, so that a search over
 * thousands of layouts lowers and differentiates each distinct program once. */
#ifndef HPDL_PLAN_H
#define HPDL_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "catalog.h"
#include "cost.h" /* CostAttnKernel */
#include "diag.h"
#include "ir.h"
#include "sema.h"

/* ---- calibrated constants and allowances (docs/planner.md sec. 14) ---- */

/* Sustained fraction of a GEMM's benchmark rate during training: the clock
 * of a GPU running back-to-back GEMMs with communication and memory-bound
 * kernels in between is below the clock of a short GEMM benchmark (power
 * and thermal limits). Fitted on the asserted published runs
 * (docs/planner.md sec. 14): one value for every device and precision
 * (PLAN_GEMM_SUSTAINED, the joint fit), and one for Ampere GPUs, whose
 * asserted rows (Narayanan et al. 2021 Tables 1-2, torchtitan's A100
 * table) are clearly better fitted apart; Hopper's rows prefer 0.71-0.72,
 * within the fit's resolution of the joint value (plan_gemm_sustained). */
#define PLAN_GEMM_SUSTAINED 0.73
#define PLAN_GEMM_SUSTAINED_AMPERE 0.77
/* Gap between two dependent kernels on a GPU: launch latency not hidden by
 * asynchronous launches, tail of the previous kernel. An assumption. */
#define PLAN_KERNEL_OVERHEAD_S 3e-6
/* PyTorch DDP's default gradient bucket (bucket_cap_mb = 25). */
#define PLAN_DP_BUCKET_BYTES (25.0 * 1024 * 1024)
/* Allowance for the CUDA context, library workspaces (cuBLAS, NCCL channel
 * buffers) and what the driver reserves: stated, not measured. */
#define PLAN_WORKSPACE_BYTES (1.0 * 1024 * 1024 * 1024)
/* Allowance for allocator fragmentation, as a share of activation and
 * temporary memory (the caching allocator rounds and splits blocks). */
#define PLAN_FRAGMENTATION 0.05

/* A layout: -1 in an int64 field means `auto` (plan_resolve chooses). */
typedef struct PlanLayout {
  int64_t dp, tp, pp, cp, vpp, zero, micro_batch;
  int64_t num_micro; /* micro-batches per step per replica: global / (dp x micro_batch) */
  int sp;            /* 0 off, 1 on, -1 auto */
  int schedule;      /* Schedule, -1 auto */
  int recompute;     /* Recompute, -1 auto */
  int overlap;       /* data-parallel communication overlapped with the backward: 0, 1 */
  int64_t ep;        /* expert parallelism inside dp (1: none; 0 or -1 in a search: any) */
  int fused_ce;      /* the head's GEMM and its cross-entropy as one op: 0 off, 1 on, -1 auto */
  /* parallel.recompute_layers: under a recompute policy, the first N layers
   * of each pipeline chunk recomputed, the rest keeping their activations
   * (0: all of them; -1 auto: the search tries the fewest that fit) */
  int64_t recompute_layers;
  /* parallel.expert_tensor = 1: MoE parallel folding (the experts whole, the
   * expert group tp x ep / tp data-parallel ranks) where tp > 1 and ep > 1;
   * -1 (expert_tensor = auto): plan_search tries both, plan_evaluate folds
   * nothing */
  int expert_fold;
  /* parallel.cp_comm at cp > 1: 0 allgather (the keys and values gathered
   * before the attention), 1 ring (one attention a block, each block's
   * transfer under the one before; spmd.c ring_attention); -1 auto:
   * plan_search tries both, plan_evaluate gathers */
  int cp_comm;
} PlanLayout;

/* Whether L's expert group is folded: expert_fold 1 with tp > 1 and ep > 1. */
int plan_layout_folded(const PlanLayout *L);
/* Whether L attends a ring block at a time: cp_comm = ring with cp > 1. */
int plan_layout_ring(const PlanLayout *L);

/* Memory of one GPU (bytes). */
typedef struct PlanMemory {
  double params, grads, optimizer; /* model states by precision and ZeRO stage */
  double activations;  /* saved for the backward: micro-batches in flight x per micro-batch */
  double transient;    /* temporaries of one forward / backward beyond the saved (logits, workspaces of ops) */
  double comm_buffers; /* data-parallel buckets, ZeRO-3 gathered layers, pipeline send / receive buffers */
  double workspace;    /* the allowance: context, library workspaces, fragmentation */
  double total, capacity;
  int fits;
  int rank;            /* the pipeline rank these figures are for */
  double rank_params;  /* its local parameters (elements): kept with a copied result, whose stages are not */
  int inflight;        /* (chunk, micro-batch) activation sets it holds at its peak */
} PlanMemory;

/* One pipeline rank (stage) of a plan. */
typedef struct PlanStage {
  double fwd_s, bwd_s; /* one micro-batch, all chunks of the rank, communication on the critical path included */
  double busy_s;       /* per step: computing (forward, backward, recompute) */
  double params;       /* local parameters (elements) */
  int64_t layers;      /* layers of the repeated block it runs (all its chunks); by pieces: the pieces */
  PlanMemory mem;
} PlanStage;

typedef struct PlanResult {
  PlanLayout layout;
  int valid;          /* 0: the layout cannot be built; why says why */
  char why[400];
  int64_t gpus, global_batch, seq_len;
  /* the model, from its graph */
  double params;          /* logical parameters (tied weights once) */
  double model_flops;     /* per step: GEMM FLOPs of forward + backward, no recomputation (MFU) */
  double model_flops_all; /* the same, every op */
  double hw_flops;        /* per step, all GPUs: GEMM FLOPs executed, recomputation included (Narayanan Eq. 3) */
  double hw_flops_all;    /* every op executed on every GPU (replicated ops count on each) */
  double recompute_flops; /* of hw_flops_all: recomputation */
  /* memory of the worst GPU */
  PlanMemory mem;
  /* communication per step per GPU (the worst rank): bytes sent and seconds */
  double comm_bytes[IRG_COUNT];
  double comm_s[IRG_COUNT];      /* time of the group's collectives */
  double comm_exposed[IRG_COUNT];/* of which on the critical path */
  /* time of one step */
  double step_s;
  double compute_s;       /* kernels of the busiest rank: forward, backward, recompute */
  double gemm_s, other_s; /* of compute_s: GEMMs, memory-bound kernels and launch gaps */
  double recompute_s;     /* of compute_s */
  double comm_exposed_s;  /* communication on the critical path */
  double bubble_s;        /* the busiest rank idles in the pipeline (bubble, transfers) */
  double bubble_fraction; /* share of the pipeline time a rank idles (schedule simulator) */
  double optimizer_s;
  double attn_s;          /* of compute_s: attention kernels (flash or materialised) */
  double attn_gemm_s;     /* of attn_s (and gemm_s): its GEMMs */
  double grouped_s;       /* of gemm_s: the experts' grouped GEMMs (dropless at ep 1), a launch an expert */
  double p2p_s;           /* one pipeline message */
  double p2p_sync_s;      /* under engine = deepspeed: one pipeline transfer as DeepSpeed makes it (its piece and the gather), 0 otherwise */
  double p2p_sync_exposed_s; /* of comm_exposed[pipeline]: those transfers of the busiest rank, inside the pipeline time */
  int64_t vocab_priced;   /* the vocabulary's rows as priced, padded by the partition (vocab_pad); 0: not padded */
  int simulated;          /* 1: bubble from sched_simulate; 0: closed form (search screening) */
  /* throughput */
  double tokens_per_s, tflops_per_gpu, mfu, hfu;
  char limit[400];        /* the limiting resource in one sentence */
  char saves[160], costs[160]; /* search: why it wins (filled by plan_search) */
  int nstages;
  int by_pieces;      /* the stages run pieces of a forward cut where one activation crosses, not layers (pipeline.h) */
  PlanStage *stages;      /* owned by the PlanCtx (valid until plan_free) */
} PlanResult;

typedef struct PlanCtx PlanCtx;

/* A planner for a checked model. NULL with an error in diag when the
 * cluster's device is unknown or the model cannot be lowered. */
PlanCtx *plan_new(const SemModel *model, Diag *diag);
/* The catalog device plan_new prices: the cluster's, or "cpu" for a model without one. */
const char *plan_device_name(const SemModel *model);
void plan_free(PlanCtx *c);

const SemModel *plan_model(const PlanCtx *c);

/* How attention is priced (docs/planner.md sec. 9.1): flash = 1 (the
 * default) as a tiled flash attention, scores never stored; flash = 0 with
 * the scores materialised in memory, as Megatron-LM ran it in 2021 (for
 * comparisons with such runs: hpdlc plan --attention materialized). */
void plan_set_attention(PlanCtx *c, int flash);
int plan_attention_flash(const PlanCtx *c);
/* Under flash, which kernel (docs/planner.md sec. 9.1): the tile model
 * alone (COST_ATTN_TILED, the default), or FlashAttention-1, -2 or -3, each
 * at least its FLOPs at its published share of the peak
 * (cost_attention_utilization; hpdlc plan --attention flash1|flash2|flash3). */
void plan_set_attention_kernel(PlanCtx *c, CostAttnKernel k);
CostAttnKernel plan_attention_kernel(const PlanCtx *c);
/* Fusion of the program priced: on (the default), the back end's fused
 * kernels; off, every elementwise op and reduction a kernel of its own
 * (fuse.h's eager options: PyTorch's eager mode; `--fusion off`). */
void plan_set_fusion(PlanCtx *c, int on);
int plan_fusion(const PlanCtx *c);
/* Whether layout L's data-parallel reduction waits for the end of the backward, whatever
 * its overlap flag: under engine = deepspeed with a pipeline or at ZeRO 0-1 (its pipeline
 * engine's ReduceGrads, its engine's allreduce_gradients; docs/planner.md sec. 11.1). */
int plan_reduces_after_backward(const PlanCtx *c, const PlanLayout *L);
/* "materialized", or the kernel's name ("flash", "flash1", ...). */
const char *plan_attention_name(const PlanCtx *c);
/* The precision the blocks' GEMMs are priced in, whose peak MFU is measured
 * against: "fp4", "fp8", or the training precision's 16- or 32-bit name
 * (docs/planner.md 9.3). */
const char *plan_gemm_peak_name(const PlanCtx *c);
/* The format priced: the training precision, or under fp8 / mxfp8 / nvfp4
 * the one the device falls back to (docs/planner.md 9.3). */
Precision plan_gemm_format(const PlanCtx *c);
/* Reports list the five largest terms of the step time with their sources
 * (hpdlc plan --explain). */
void plan_set_explain(PlanCtx *c, int on);
/* --search reports the layouts priced so far to p (core/progress.h) */
struct Progress;
void plan_set_progress(PlanCtx *c, struct Progress *p);
int plan_explain_enabled(const PlanCtx *c);
/* Reports list every published run like the plan, closest first, not only
 * the closest three (hpdlc plan --evidence; docs/planner.md sec. 16.1). */
void plan_set_evidence_all(PlanCtx *c, int on);
int plan_evidence_all(const PlanCtx *c);
const CatDevice *plan_device(const PlanCtx *c);
const SemCluster *plan_cluster(const PlanCtx *c);
/* The figures the cluster gave its device, "memory 96.0 GiB, bf16 148
 * TFLOP/s" (sem_figure_keys' names); "" when it gave none. */
const char *plan_device_figures(const PlanCtx *c, char *buf, size_t n);
int64_t plan_gpus(const PlanCtx *c);

/* The layout of the model's parallel block and train block. */
PlanLayout plan_layout_of(const SemModel *m);
/* Bytes a gradient value moves in the data-parallel reduction: 4 (fp32, as
 * hpdl's runtime reduces them), 2 where the layout rounds them to 16 bits
 * (compression = bf16 | fp16). docs/planner.md sec. 11.3. */
int plan_grad_reduce_bytes(Compression c);
/* What a report says below its layout where the plan priced something other
 * than the file or the flags ask for at face value: the vocabulary padded,
 * the experts routed over whole sequences, a precision the device lacks, a
 * gradient compression. Each a key and its text (the text report's
 * "key: text" lines; the HTML's facts rows and JSON's `notes` alike). */
enum { PLAN_NOTES_MAX = 4 };
typedef struct {
  const char *key;
  char text[480];
} PlanNote;
int plan_notes(PlanCtx *c, const PlanResult *r, PlanNote *notes);
/* The sustained share of a GEMM's benchmark rate on dev (PLAN_GEMM_SUSTAINED_*). */
double plan_gemm_sustained(const CatDevice *dev);

/* The layers each of the K = pp x virtual pipeline chunks runs, for the
 * program of (micro batch, tp, cp, sp, recompute): with the model's
 * `parallel { balance = cost }` (the default) the split that minimises the
 * slowest chunk's forward + backward time, priced as the planner prices
 * them (the prologue, one layer, the epilogue on the cluster's device,
 * pipe_balance); with balance = layers the equal split. Every consumer of a
 * split (compile, the simulator, the memory plan, emit spmd, the planner)
 * asks here, so all see the same one. An array of K in arena, or NULL with
 * *why. */
int64_t *plan_chunk_layers(Arena *arena, const SemModel *model, int64_t micro_batch, int64_t tp, int64_t cp, int sp,
                           int recompute, int64_t K, const char **why);

/* Flags of plan_evaluate. */
enum {
  PLAN_FAST = 1,  /* price from cached parts with the closed-form bubble (search screening) */
  PLAN_FULL_SIM = 2, /* simulate every micro-batch (no extrapolation); needed for a trace */
  /* with PLAN_FAST: price every pipeline rank, where the screening prices
   * three whose middle ranks are alike (the first, the second - the most
   * micro-batches in flight among the middle ones - and the last); for the
   * test that they agree */
  PLAN_ALL_RANKS = 4,
  /* memory first, and where the layout does not fit (or, in a search, its
   * pipeline alone takes longer than the slowest layout the search keeps) no
   * more time: the result's memory is the full evaluation's, its step_s
   * infinite and the other time fields unset (the screening, which drops
   * such layouts) */
  PLAN_FIT_FIRST = 8
};

/* Prices one layout (no auto fields). Returns 0, or -1 when it cannot be
 * built (out->valid = 0, out->why). */
int plan_evaluate(PlanCtx *c, const PlanLayout *L, unsigned flags, PlanResult *out);

/* Chooses the auto fields of L (the best layout with the others fixed);
 * returns plan_evaluate's result for it. */
int plan_resolve(PlanCtx *c, const PlanLayout *L, PlanResult *out);

/* ---- search ---- */
typedef struct PlanSearchStats {
  int64_t enumerated, valid, fit, programs, exact;
  int64_t over_memory; /* of enumerated: dropped unbuilt, their model states alone over the device's memory */
  double seconds;
  char refused[320]; /* the first layout the search could not make, and why ("" when none was refused) */
} PlanSearchStats;

/* Enumerates every layout for the GPU count (dp, tp, pp, cp, sp, zero,
 * micro batch, schedule, virtual stages, recompute); fields of fix that are
 * not -1 are held. Keeps those that fit, ranked by step time; writes the
 * best `top` into out (owned by the caller) and returns how many. */
int plan_search(PlanCtx *c, const PlanLayout *fix, int top, PlanResult *out, PlanSearchStats *stats);
/* Why a search of fix's free settings kept nothing, in one line for the
 * report: no layout to price (the degrees given, named, or the batch, the
 * node, the layers), none buildable (the first refused and why), or none
 * fitting the device's memory. */
void plan_search_why_none(const PlanCtx *c, const PlanLayout *fix, const PlanSearchStats *st, char *why, size_t size);

/* ---- scaling ---- */
typedef struct PlanScalePoint {
  int64_t gpus;
  int ok;             /* 0: no valid or fitting layout at this size */
  PlanResult strong;  /* global batch fixed */
  PlanResult weak;    /* global batch x gpus / gpus of the first point */
  double strong_speedup, strong_eff, karp_flatt;
  double weak_speedup, weak_eff;
} PlanScalePoint;

typedef struct PlanScaling {
  int n;
  PlanScalePoint *pts;     /* malloc'd; plan_scaling_free */
  double amdahl_f;         /* serial fraction fitted to the strong-scaling speed-ups */
  double gustafson_f;      /* serial fraction fitted to the weak-scaling scaled speed-ups */
} PlanScaling;

/* The layout L's tensor / context / pipeline degrees and policies at each
 * GPU count (data parallelism takes the rest). */
int plan_scaling(PlanCtx *c, const PlanLayout *L, const int64_t *gpus, int n, PlanScaling *out);
void plan_scaling_free(PlanScaling *s);

/* ---- reports (plan_report.c) ---- */
typedef struct PlanReport {
  const char *file;
  const PlanResult *plan;
  const PlanResult *search; /* NULL when none */
  int nsearch;
  const PlanSearchStats *stats;
  const PlanScaling *scaling; /* NULL when none */
  void *compare;              /* json_t *: the `compare` object of --compare (plan_compare.h), or NULL */
} PlanReport;

void plan_report_text(FILE *f, PlanCtx *c, const PlanReport *r);
/* The JSON of docs/planner.md sec. 15 (the stable schema); returns 0 or -1. */
int plan_report_json(FILE *f, PlanCtx *c, const PlanReport *r);
int plan_report_html(FILE *f, PlanCtx *c, const PlanReport *r);
/* A Chrome trace (trace event JSON) of one predicted step of L; -1 with why
 * filled when the step has no timeline (plan_timeline). */
int plan_trace(FILE *f, PlanCtx *c, const PlanLayout *L, char *why, size_t whylen);
/* A timeline holds at most this many micro-batch x pipeline chunk pairs
 * (each a forward and a backward event on each stage): a trace of more is
 * gigabytes, and the schedule's counts are ints. */
#define PLAN_TIMELINE_MAX_UNITS 1000000

/* ---- the `hpdlc plan` command (plan_cli.c) ---- */
typedef struct PlanCliOptions {
  const char *format;  /* "text" (default), "json" or "html" */
  const char *output;  /* -o FILE; NULL: standard output */
  const char *trace;   /* --trace FILE: a Chrome trace of one step */
  const char *scaling; /* --scaling 8,16,...: GPU counts */
  int search;          /* --search */
  int top;             /* --top K (search), default 5 */
  int mb_fixed;        /* --micro-batch was given: the search keeps it */
  int measure_cpu;     /* --measure-cpu: time this machine for the `cpu` device first */
  int materialized;    /* --attention materialized: price the scores stored in memory (plan_set_attention) */
  CostAttnKernel attention_kernel; /* --attention flash1|flash2|flash3 (plan_set_attention_kernel); flash: the default */
  int explain;         /* --explain: the five largest terms of the step time with their sources */
  int evidence;        /* --evidence: every published run like the plan, not only the closest three */
  int fusion_off;      /* --fusion off: a kernel an op (plan_set_fusion) */
  int progress;        /* --progress: a ProgressMode (core/progress.h) for --search */
  const char *compare; /* --compare TRACE: an hpdlrun --profile trace beside the plan (plan_compare.h) */
  const char *calibrate; /* --calibrate TRACE -o FILE.hpd: the cluster's device fitted to the trace (plan_calibrate.c) */
} PlanCliOptions;

/* Plans the checked model m of file `path`; returns the exit status (0, 1
 * for a plan that cannot be made, 2 for a bad option value). */
/* --calibrate: fits compute_scale, memory_scale and the link bandwidths of
 * the plan's cluster to the trace and writes them as a cluster file. */
int plan_calibrate(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o);
int plan_command(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o);

/* Human units: "1.50 GiB", "12.3 ms", "135 TFLOP/s" into buf. */
const char *plan_fmt_bytes(char *buf, size_t n, double bytes);
const char *plan_fmt_time(char *buf, size_t n, double s);
const char *plan_fmt_count(char *buf, size_t n, double v);

#endif
