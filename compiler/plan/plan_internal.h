/* plan_internal.h - what the planner's files share (plan.c, plan_search.c,
 * plan_report.c, plan_html.c) and the unit tests look at; not part of the plan.h API. */
#ifndef HPDL_PLAN_INTERNAL_H
#define HPDL_PLAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "catalog.h"
#include "diag.h"
#include "fuse.h"
#include "ir.h"
#include "plan.h"
#include "schedule.h"
#include "sema.h"

/* Work and time of a piece of a program, per execution (additive). Doubles
 * only: plan_cost_add adds two as arrays (its assertion counts the fields). */
typedef struct PlanCost {
  double t;       /* seconds on the rank's critical path: kernels and blocking collectives */
  double t_gemm;  /* of t: GEMM kernels */
  double t_other; /* of t: memory-bound kernels */
  double t_rc;    /* of t: recomputation */
  double t_attn;  /* of t: attention kernels (scores and what reads them) */
  double t_attn_gemm; /* of t_attn: its GEMMs (the rest is its softmax, in t_other) */
  double t_grouped;   /* of t_gemm: the experts' grouped GEMMs (ep 1), a launch an expert */
  double t_comm[IRG_COUNT];
  double t_hidden[IRG_COUNT]; /* of t_comm: overlapped with compute, so not in t (tp_overlap, ring attention) */
  double t_cp_waits;          /* of t_comm[IRG_CP]: exchanges no attention runs under (GInfo.kcp_wait), which wait whole */
  double sent[IRG_COUNT]; /* bytes this rank sends */
  double flops, gemm_flops, rc_flops, rc_gemm_flops;
  double kernels;
  double zparams, zparam_bytes; /* weight tensors read (ZeRO-3 gathers them) */
  double zgrads, zgrad_bytes;   /* gradient tensors written (ZeRO-3 reduce-scatters them) */
} PlanCost;

void plan_cost_add(PlanCost *a, const PlanCost *b, double times);

/* A program: what lowering, partitioning and autodiff depend on. */
typedef struct PlanKey {
  int64_t mb, tp, cp;
  int sp, rc;
  int64_t ep; /* expert parallelism (the experts' all-to-all is in the program) */
  int fce;    /* fused_ce: the head's GEMM and its loss as one op (headloss.h) */
  int64_t rl; /* recompute_layers of the exact chunks (0: all; the parts price every layer under rc) */
  int ef;     /* MoE parallel folding (tp > 1, ep > 1): sequences chunked over tp, the experts whole */
  int ring;   /* cp_comm = ring at cp > 1: one attention a block of keys and values (spmd.c ring_attention) */
} PlanKey;

/* The program key of layout L, its chunks recomputing their first rl layers
 * (0: all, as the parts price them). */
PlanKey plan_layout_key(const PlanLayout *L, int64_t rl);

/* Chunk kinds of a pipeline split. */
enum { PLAN_SINGLE = 0, PLAN_FIRST = 1, PLAN_MIDDLE = 2, PLAN_LAST = 3, PLAN_NKINDS = 4 };

/* The price of one pipeline chunk for one micro-batch. */
typedef struct PlanChunk {
  int64_t layers;
  PlanCost f, b;        /* forward; backward (with recomputation) */
  double saved;         /* bytes kept from its forward to its backward */
  double peak;          /* peak live bytes of one forward + backward */
  double params;        /* local parameters (elements) */
  double shared_params; /* of which also held by another pipeline rank (tied weights) */
  double p2p_bytes;     /* the activation message to the next chunk */
  double memplan_peak;  /* exact chunks: memplan's fused peak (IR dtypes) */
} PlanChunk;

/* plan_evaluate's working arrays (PlanCtx.evbuf), one a purpose. */
enum { EV_SPLIT, EV_KINDS, EV_KP, EV_TF, EV_TB, EV_REP, EV_WREP, EV_INFLIGHT, EV_STAGES, EV_COUNT };

/* What a search that shows no layout says: the result's reason, when it has one. */
const char *plan_search_none_note(const PlanReport *rep);

/* The cached prices of a key, by part of the one-chunk program. */
typedef struct PlanParts {
  PlanKey key;
  int valid;
  char why[400];
  int before_ad;         /* !valid: it failed to lower or partition (whatever the recomputation) */
  int64_t fail_mb;       /* a failure family's entry (key.mb 0): the micro batch it first failed at, */
  int every_mb;          /* and whether another failed with the same reason (it fails at every one) */
  int64_t layers;        /* of the main repeat */
  int64_t units;         /* a forward cut where one value crosses (pipeline.h's by cuts): its pieces, */
  double *unit_w;        /* and each one's forward + backward time (roofline); NULL by layers */
  PlanCost f[2], b[2];   /* prologue [0] and epilogue [1], forward and backward */
  PlanCost lf, lb;       /* one layer: B.fwd, B.grad */
  double lf_peak, lb_peak;
  double saved_reg[2], layer_saved;
  double params_reg[2], layer_params, shared_params;
  double layer_expert_params; /* of layer_params: expert shards (split over ep), reduced over edp */
  double boundary_bytes;
  double cp_recv_layer;  /* bytes one layer's forward receives over the context group (B.fwd's RECVs) */
  double peak_out[PLAN_NKINDS], peak_in[PLAN_NKINDS];
  int64_t **splits;      /* by layers: the balanced split of K chunks at [K] (plan_split_layers), made once */
  int64_t vocab_padded;  /* the vocabulary's rows as the partition padded them (spmd.c's vocab_flow); 0: not padded */
} PlanParts;

/* The real chunks of a K-way split of a key. */
typedef struct PlanExact {
  PlanKey key;
  int64_t K;
  int valid;
  char why[400];
  int64_t *layers; /* [K] the split (plan_split_layers) */
  PlanChunk *ch;   /* [K] every chunk, each distinct (kind, layers) priced once */
  struct PlanExact *next;
} PlanExact;

struct PlanCtx {
  const SemModel *model;
  struct Progress *progress; /* --search on a terminal: the layouts priced so far */
  CatDevice dev;      /* the device (a rank's share of it on a shared CPU machine) */
  double gemm_sustained; /* plan_gemm_sustained(dev), looked up once */
  double overlap_slowdown; /* cost_overlap_slowdown(dev), looked up once (a search asked a million times) */
  /* PLAN_FIT_FIRST: a layout whose pipeline alone takes longer is not priced
   * further (the search's slowest kept layout's step; HUGE_VAL: none) */
  double screen_bound;
  /* The last pipelines simulated (simulate_memo in plan.c), by their whole
   * input: the search's exact re-pricing simulates layouts that differ in
   * what the pipeline does not see (ZeRO, recompute policies that change no
   * chunk's time) with the same chunk times */
  struct PlanSimMemo {
    int kind, pp, v, full;
    int64_t m, K;
    double t_p2p;
    double *times; /* tf then tb, K each */
    double T, bubble_fraction;
    int *inflight; /* pp */
  } sim_memo[16];
  int nsim_memo, sim_memo_next;
  SemCluster cluster;
  int64_t gpus;
  int64_t batch_override; /* > 0: the global batch to plan (scaling), else the train block's */
  Precision prec;
  int act_bytes, weight_bytes;
  /* Low-precision GEMMs (sec. 9.3): under fp8 / mxfp8 / nvfp4 on a device with
   * the format's rate, the blocks' GEMMs run at lowp's peak ("fp8" or "fp4";
   * NULL: every GEMM at the training precision), reading lowp_operand bytes
   * a value (block scales included), after casts of lowp_cast bytes read and
   * written an activation value; lowp_saved bytes a value of an activation
   * only such GEMMs read back. */
  const char *lowp;
  double lowp_operand, lowp_cast, lowp_saved;
  double lowp_k0;         /* cost_gemm_k_overhead at lowp's rate (sec. 3.2) */
  Precision lowp_prec;    /* the format priced: prec, or the one it fell back to on this device */
  double layer_gather_bytes; /* a block's weights as ZeRO gathers them: 1 under FP8 weights (sec. 11.3), else weight_bytes */
  int flash;          /* attention priced as a tiled flash attention (the default); 0: scores materialised */
  CostAttnKernel attn_kernel; /* under flash: the tile model alone, or a generation whose published rate bounds it */
  int tp_overlap;     /* the layout's tp_overlap */
  int cp_comm;        /* parallel.cp_comm: 0 allgather, 1 ring, -1 auto (plan_search tries both at cp > 1) */
  int64_t vocab_pad;  /* the layout's vocab_pad: vocabulary padded to a multiple of it x tp */
  int fused_ce;       /* the model's fused_ce (on: 1), for keys made without a layout (plan_chunk_layers) */
  int explain;        /* reports list the five largest terms of the step (plan_set_explain) */
  int evidence_all;   /* reports list every published run like the plan (plan_set_evidence_all, --evidence) */
  double params;
  double expert_params; /* of params: the experts' (sharded over the expert group) */
  int64_t experts;    /* experts per MoE layer that every expert layer's count divides (their gcd); 0: none */
  int64_t top_k;      /* the most experts a token is routed to (MOE_DISPATCH's K); 0: no MoE layer */
  int moe_drops;      /* a MoE layer drops tokens (its capacity under the sequence's length): over slots at any ep */
  int64_t route_groups, route_group_top_k; /* node-limited routing (sem_moe_route_groups); 1, 1: none */
  Diag *quiet;
  FILE *sink;
  Arena *arena;
  PlanParts **table;
  size_t cap, count;
  int64_t programs;
  int selective_same;    /* 1: RECOMPUTE_SELECTIVE differentiates as NONE here (no attention core); 2: not; 0: unknown */
  int act_same;          /* 1: RECOMPUTE_ACT differentiates as SELECTIVE here (no gated product a GEMM reads); 2: not; 0: unknown */
  FuseCache *fuse_cache; /* fused graphs by content, shared by every program (made on first use) */
  /* The lowered programs (lowered_program in plan.c): the keys of one micro
   * batch and experts' layout lower alike whatever their partitioning and
   * recomputation, and spmd_partition only reads what it is given; in
   * lowered_arena, dropped with the prices */
  struct {
    int64_t mb, ep, etp;
    IrModule *m; /* NULL: it does not lower */
  } *lowered;
  int nlowered, caplowered;
  Arena *lowered_arena;
  /* The last keys' partitioned programs (partitioned_program in plan.c),
   * each in its own arena: keys differing in their recomputation only
   * partition alike, and the search asks for them a few micro batches apart */
  struct {
    PlanKey key; /* rc and rl unused */
    IrModule *m;
    Arena *arena;
  } parted[16];
  int nparted, parted_next;
  const FuseOptions *fuse_opts; /* the fusion priced: the CUDA back end's on an NVIDIA GPU, else the CPU's (NULL); eager ones under fusion off */
  int fusion;                   /* 1: the back end's fused kernels (the default); 0: --fusion off, a kernel an op (plan_set_fusion) */
  PlanExact *exact;
  struct {
    int64_t mb;
    double gemm, all;
  } *mf;
  int nmf, capmf;
  PlanStage *stages; /* the last evaluation's, in evbuf[EV_STAGES] */
  int nstages;
  /* plan_evaluate's working arrays (ev_buf in plan.c), kept between calls:
   * a search evaluates 10^5 layouts, and allocating them was a tenth of its
   * instructions; grown as needed, freed with the context */
  struct {
    void *p;
    size_t cap;
  } evbuf[EV_COUNT];
};

PlanParts *plan_parts(PlanCtx *c, const PlanKey *k);
PlanExact *plan_exact(PlanCtx *c, const PlanKey *k, int64_t K);
/* The layers of each of K chunks under the model's balance setting, from
 * the parts' forward + backward times (pipe_balance); -1 with why when the
 * layers cannot be split so. */
int plan_split_layers(const PlanCtx *c, const PlanParts *pp, int64_t K, int64_t *out, char *why, size_t whylen);
/* A chunk of kind PLAN_SINGLE..PLAN_LAST with n layers, from the parts. */
void plan_chunk_from_parts(const PlanParts *pp, int kind, int64_t n, PlanChunk *ch);

/* The pipeline time T of m micro-batches on pp ranks with v chunks each
 * (per-chunk times tf, tb), from the schedule simulator; the share of T a
 * rank idles, averaged over ranks; the peak (chunk, micro-batch) sets each
 * rank holds. full = 0 extrapolates the steady state beyond 4 pp
 * micro-batches (3 pp for 1F1B without virtual stages) at the period the
 * simulation shows. Returns 0, or -1 with err. */
int plan_pipeline(Schedule kind, int pp, int64_t m, int v, const double *tf, const double *tb, double t_p2p, int full,
                  double *T, double *bubble_fraction, int *inflight, char *err, size_t errlen);

/* One predicted step of a layout, every micro-batch simulated (traces). */
typedef struct PlanTimeline {
  int pp;
  SchedProgram prog;
  SchedSim sim;
  double dp_exposed, optimizer;
} PlanTimeline;

/* The simulated schedule of one step of L; -1 with why filled when it has
 * none (a layout that does not price, or more micro-batches x chunks than
 * PLAN_TIMELINE_MAX_UNITS). */
int plan_timeline(PlanCtx *c, const PlanLayout *L, PlanTimeline *out, char *why, size_t whylen);
void plan_timeline_free(PlanTimeline *t);

/* Fills r->limit: the limiting resource in one sentence (plan_search.c). */
void plan_explain(PlanCtx *c, PlanResult *r);
/* Whether recompute = act differentiates the model otherwise than selective
 * (it has a gated activation a GEMM reads; k: any key of the model, lowered
 * once to find out). */
int plan_act_differs(PlanCtx *c, const PlanKey *k);
/* Whether recompute = selective recomputes an attention core of the model
 * (its scores materialized); without one it differentiates as none, but
 * under context parallelism (the blocks received again, autodiff's
 * cp_rereceive). k: any key of the model. */
int plan_selective_differs(PlanCtx *c, const PlanKey *k);

/* One term of the step time and where its formula comes from (--explain). */
typedef struct PlanTerm {
  const char *name;
  double s;
  const char *source;
} PlanTerm;

/* The terms of r's step time, largest first; returns how many (<= max).
 * The attention's source names the kernel c prices it as. */
int plan_explain_terms(const PlanCtx *c, const PlanResult *r, PlanTerm *out, int max);

/* The rows of the first vocab-split table of the model, and the rows r
 * prices them as (the partition's padding, PlanResult.vocab_priced; the
 * model's rows where r is NULL, invalid or unpadded); 0 when the model has
 * none. */
int64_t plan_vocab(const PlanCtx *c, const PlanResult *r, int64_t *priced);

/* A layout in one line, as the reports print it: "dp=2 tp=1 pp=4 ... rc=none"
 * (plan_report.c). */
const char *plan_layout_str(char *buf, size_t n, const PlanLayout *L);

/* Whether L's MoE layers run over slots under context parallelism, each
 * sequence routed whole on every context rank (docs/compiler.md, its limit). */
int plan_experts_routed_whole(const PlanCtx *c, const PlanLayout *L);

#endif
