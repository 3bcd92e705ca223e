/* plan_explain.c - the one-sentence explanation of what limits a plan
 * (PlanResult.limit): the memory that does not fit and the ZeRO stage or
 * recomputation that would fix it, or the largest share of the step (the
 * bubble, a collective, memory-bound kernels) and what would shrink it. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "plan.h"
#include "plan_internal.h"

static const char *fmt_bytes(char *b, size_t n, double v) { return plan_fmt_bytes(b, n, v); }

void plan_explain(PlanCtx *c, PlanResult *r) {
  char a[32], b[32];
  const PlanLayout *L = &r->layout;
  if (!r->valid) {
    snprintf(r->limit, sizeof r->limit, "%s", r->why);
    return;
  }
  if (!r->mem.fits) {
    const PlanMemory *m = &r->mem;
    double states = m->params + m->grads + m->optimizer;
    double dyn = m->activations + m->transient;
    if (states > dyn && L->zero < 3 && L->dp > 1) {
      /* which ZeRO stage would bring the states down enough */
      for (int z = (int)L->zero + 1; z <= 3; z++) {
        OptimizerKind ok = c->model->train.optimizer;
        CostModelStates ms = cost_model_states_m((int64_t)m->rank_params, z, (int)L->dp, c->prec, ok, c->model->train.momentum > 0,
                                                 c->model->train.moments_bf16 ? 2 : 4);
        double tot = m->total - states + ms.total;
        if (tot <= m->capacity || z == 3) {
          snprintf(r->limit, sizeof r->limit,
                   "memory: %s needed of %s on pipeline rank %d, %s of it model states; ZeRO stage %d would need %s",
                   fmt_bytes(a, sizeof a, m->total), fmt_bytes(b, sizeof b, m->capacity), m->rank,
                   plan_fmt_bytes((char[32]){0}, 32, states), z, plan_fmt_bytes((char[32]){0}, 32, tot));
          return;
        }
      }
    }
    PlanKey key = plan_layout_key(L, 0);
    int act = (L->recompute == RECOMPUTE_NONE || L->recompute == RECOMPUTE_SELECTIVE) && plan_act_differs(c, &key);
    const char *fix = act ? "recompute = act, ops or full, a smaller micro batch or more pipeline stages"
                      : L->recompute == RECOMPUTE_NONE || L->recompute == RECOMPUTE_SELECTIVE
                          ? "recompute = ops or full, a smaller micro batch or more pipeline stages"
                      : L->recompute == RECOMPUTE_OPS || L->recompute == RECOMPUTE_ACT
                          ? "full recomputation, a smaller micro batch or more pipeline stages"
                          : "a smaller micro batch, more tensor or pipeline parallelism";
    snprintf(r->limit, sizeof r->limit,
             "memory: %s needed of %s on pipeline rank %d (activations %s for %d micro-batches in flight); try %s",
             fmt_bytes(a, sizeof a, m->total), fmt_bytes(b, sizeof b, m->capacity), m->rank,
             plan_fmt_bytes((char[32]){0}, 32, m->activations), m->inflight, fix);
    return;
  }
  double T = r->step_s > 0 ? r->step_s : 1;
  /* dropless experts at ep 1: a GEMM an expert, each over its few rows */
  if (r->grouped_s > 0.25 * T) {
    snprintf(r->limit, sizeof r->limit,
             "the experts' grouped GEMMs take %.0f%% of the step: one launch an expert over its few rows; under expert "
             "parallelism (ep > 1) a rank's experts run as one batched GEMM over their slots",
             r->grouped_s / T * 100);
    return;
  }
  struct {
    double s;
    int what;
  } item[8] = {{r->bubble_s, 0},
               {r->comm_exposed[IRG_TP], 1},
               {r->comm_exposed[IRG_DP], 2},
               {r->other_s, 3},
               {r->recompute_s, 4},
               {r->comm_exposed[IRG_CP], 5},
               {r->optimizer_s, 6},
               {r->comm_exposed[IRG_EP], 7}};
  int best = 0;
  for (int i = 1; i < 8; i++)
    if (item[i].s > item[best].s) best = i;
  double share = item[best].s / T * 100;
  double gemm_share = r->gemm_s / T * 100;
  if (gemm_share > 70 || share < 5) {
    double rate = r->hfu / (gemm_share / 100 > 0 ? gemm_share / 100 : 1) * 100;
    if (rate >= 10)
      snprintf(r->limit, sizeof r->limit, "compute: GEMMs take %.0f%% of the step at %.0f%% of peak (%.0f TFLOP/s per GPU)",
               gemm_share, rate, r->tflops_per_gpu);
    else
      snprintf(r->limit, sizeof r->limit,
               "compute: GEMMs take %.0f%% of the step but reach only %.2g%% of peak: they are too small to fill the "
               "device (a larger micro batch or model would use it)",
               gemm_share, rate);
    return;
  }
  switch (item[best].what) {
  case 0: {
    int p = (int)L->pp, v = (int)(L->vpp > 0 ? L->vpp : 1);
    int64_t m = L->num_micro;
    /* micro-batches for a 5% bubble: (p-1)/(v m + p-1) <= 0.05 */
    int64_t want = (int64_t)ceil(19.0 * (p - 1) / v);
    if (want < m) want = m;
    double now = r->bubble_fraction * 100;
    if (L->micro_batch > 1 && m * L->micro_batch >= want) {
      int64_t mb = L->micro_batch;
      while (mb > 1 && m * (L->micro_batch / mb) < want) mb /= 2;
      int64_t m2 = m * (L->micro_batch / (mb > 0 ? mb : 1));
      double f = cost_bubble_step_fraction((Schedule)L->schedule, p, m2, v) * 100;
      snprintf(r->limit, sizeof r->limit,
               "bubble %.0f%%: %" PRId64 " micro-batches (micro batch %" PRId64 ") would cut it to %.0f%%", now, m2,
               mb > 0 ? mb : 1, f);
    } else if (L->schedule != SCHED_INTERLEAVED && m % p == 0) {
      double f = cost_bubble_step_fraction(SCHED_INTERLEAVED, p, m, 2) * 100;
      snprintf(r->limit, sizeof r->limit, "bubble %.0f%%: interleaving 2 virtual stages per rank would cut it to %.0f%%",
               now, f);
    } else {
      double f = cost_bubble_step_fraction((Schedule)L->schedule, p, want, v) * 100;
      snprintf(r->limit, sizeof r->limit, "bubble %.0f%%: %" PRId64 " micro-batches per step would cut it to %.0f%%", now,
               want, f);
    }
    return;
  }
  case 1:
    snprintf(r->limit, sizeof r->limit,
             "tensor-parallel collectives take %.0f%% of the step (tp=%" PRId64 ", %s per GPU per step)%s", share, L->tp,
             fmt_bytes(a, sizeof a, r->comm_bytes[IRG_TP]),
             L->sp ? "" : "; sequence parallelism would split the work between them");
    return;
  case 2:
    snprintf(r->limit, sizeof r->limit,
             "data-parallel gradient synchronisation is exposed for %.0f%% of the step (%s per GPU)%s", share,
             fmt_bytes(a, sizeof a, r->comm_bytes[IRG_DP]),
             L->overlap ? "; more micro-batches per step would amortise it" : "; overlap = on would hide most of it");
    return;
  case 3:
    snprintf(r->limit, sizeof r->limit,
             "memory-bound kernels (normalisation, softmax, elementwise) take %.0f%% of the step; GEMMs %.0f%%", share,
             gemm_share);
    return;
  case 4:
    snprintf(r->limit, sizeof r->limit, "recomputation takes %.0f%% of the step (recompute = %s)%s", share,
             sem_recompute_name((Recompute)L->recompute),
             L->recompute == RECOMPUTE_FULL ? "; recompute = ops (or selective) would keep most of it if memory allows" : "");
    return;
  case 5:
    snprintf(r->limit, sizeof r->limit, "context-parallel exchanges take %.0f%% of the step (cp=%" PRId64 ")", share, L->cp);
    return;
  case 7: {
    /* the nodes the expert group spans, as plan.c's key_links places it */
    int64_t gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
    int64_t inner = plan_layout_folded(L) ? 1 : L->tp * L->cp;
    int64_t rep = inner >= gpn ? 1 : (L->ep < gpn / inner ? L->ep : gpn / inner);
    int64_t nodes = (L->ep + (rep > 1 ? rep : 1) - 1) / (rep > 1 ? rep : 1);
    char why[160] = "";
    if (nodes > 1 && c->model->layout.dispatcher == 0 && c->experts > 0)
      snprintf(why, sizeof why, "; dispatcher = deepep (a copy of a token per node, as DeepEP sends it) would put %.0f%% of its "
                                "off-node bytes on the network",
               100 * cost_node_dedup(c->experts, c->top_k, nodes, c->route_groups, c->route_group_top_k));
    else if (nodes > 1 && rep < gpn)
      snprintf(why, sizeof why, "; an expert group of %" PRId64 " ranks or fewer would stay inside a node", gpn / inner);
    snprintf(r->limit, sizeof r->limit, "the experts' all-to-all takes %.0f%% of the step (ep=%" PRId64 " over %" PRId64
                                        " node%s, %s per GPU per step)%s",
             share, L->ep, nodes, nodes > 1 ? "s" : "", fmt_bytes(a, sizeof a, r->comm_bytes[IRG_EP]), why);
    return;
  }
  default:
    snprintf(r->limit, sizeof r->limit, "the optimizer step takes %.0f%% of the step", share);
    return;
  }
}

/* ------------------------------------------------------------------ */
/* --explain: the terms of the step time and their sources              */

static int term_cmp(const void *a, const void *b) {
  double x = ((const PlanTerm *)a)->s, y = ((const PlanTerm *)b)->s;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The step is the pipeline time plus what is exposed after it (sec. 11.6):
 * compute (GEMMs, attention, memory-bound kernels) + exposed tensor and
 * context communication + bubble + exposed data-parallel and pipeline
 * communication + the optimizer step; the terms add up to step_s. */
/* Where the attention's time comes from: the kernel --attention names. */
static const char *attention_source(const PlanCtx *c) {
  if (plan_attention_flash(c)) switch (plan_attention_kernel(c)) {
    case COST_ATTN_FLASH1:
      return "docs/planner.md 9.1: FlashAttention-1 (--attention flash1): the tile model, at least its FLOPs at its "
             "published share of peak (FlashAttention-2 paper, sec. 1; on Hopper derived)";
    case COST_ATTN_FLASH2:
      return "docs/planner.md 9.1: FlashAttention-2 (--attention flash2): the tile model, at least its FLOPs at its "
             "published share of peak (FlashAttention-2 paper on A100, FlashAttention-3 paper on H100)";
    case COST_ATTN_FLASH3:
      return "docs/planner.md 9.1: FlashAttention-3 (--attention flash3): the tile model, at least its FLOPs at its "
             "published share of peak (FlashAttention-3 paper, sec. 4; FlashAttention-2's on Ampere)";
    case COST_ATTN_TILED:
      break;
    }
  if (!plan_attention_flash(c))
    return "docs/planner.md 9.1: scores in memory (--attention materialized, Megatron-LM's 2021 program): the kernels "
           "that write or read them, each priced as any other";
  return "docs/planner.md 9.1: flash attention (causal blocks skipped, one exp per score on the SFUs: FlashAttention-2, "
         "Dao 2023; FlashAttention-3 paper)";
}

#define GEMM_SOURCE                                                                                             \
  "docs/planner.md 3.2: tile x wave x depth x the device's ceiling (mamf-finder), x its GPU generation's sustained " \
  "share (sec. 14)"
#define MEMORY_SOURCE(whose) "docs/planner.md 3.1, 9: roofline, " whose "fused kernels' bytes at 0.90 x the datasheet HBM bandwidth"

int plan_explain_terms(const PlanCtx *c, const PlanResult *r, PlanTerm *out, int max) {
  double attn_other = r->attn_s - r->attn_gemm_s;
  PlanTerm t[] = {
      {"GEMMs (projections, MLP, head)", r->gemm_s - r->attn_gemm_s - r->grouped_s,
       !c->lowp ? GEMM_SOURCE
       : !strcmp(c->lowp, "fp4") ? GEMM_SOURCE "; 9.3: the blocks' GEMMs at the FP4 peak"
                                 : GEMM_SOURCE "; 9.3: the blocks' GEMMs at the FP8 peak"},
      {"attention", r->attn_s, attention_source(c)},
      {"experts' grouped GEMMs (a launch an expert)", r->grouped_s,
       "docs/planner.md 11.3a: dropless experts over their routed rows at ep 1, one GEMM an expert after the rows' "
       "experts are read back (runtime/device/devexec.c), each its own waves"},
      {"memory-bound kernels", r->other_s - attn_other,
       !c->fusion ? "docs/planner.md 3.1, 9.7: roofline, a kernel an op (--fusion off, PyTorch's eager mode) at 0.90 x "
                    "the datasheet HBM bandwidth"
       : c->fuse_opts ? MEMORY_SOURCE("the CUDA back end's ")
                      : MEMORY_SOURCE("")},
      {"tensor-parallel communication (exposed)", r->comm_exposed[IRG_TP],
       "docs/planner.md 1-2: nccl-tests bus-bandwidth model; 9.2: tp_overlap"},
      {"context-parallel communication (exposed)", r->comm_exposed[IRG_CP],
       plan_layout_ring(&r->layout) ? "docs/planner.md 9.2: cp_comm = ring, each block's exchange under the attention of the one before"
                  : "docs/planner.md 9.2: cp_comm = allgather, the keys and values gathered before the attention"},
      {"expert-parallel communication (exposed)", r->comm_exposed[IRG_EP],
       c->model->layout.dispatcher == 1
           ? "docs/planner.md 2, 11.3a: the experts' dispatch and combine, dispatcher = deepep: a token crosses to a node once"
           : "docs/planner.md 2, 11.3a: the experts' dispatch and combine, all-to-alls on the expert group's link"},
      {"expert data-parallel communication (exposed)", r->comm_exposed[IRG_EDP],
       "docs/planner.md 11.3a: the experts' gradients reduced over the ranks that hold the same experts"},
      {"data-parallel / ZeRO communication (exposed)", r->comm_exposed[IRG_DP],
       "docs/planner.md 11.3-11.4a: buckets under the backward; ZeRO-3 / FSDP per-layer gathers under compute; the "
       "GEMMs beside a hidden collective slowed (0.5 on Hopper's persistent GEMMs)"},
      {"pipeline bubble", r->bubble_s, "docs/planner.md 4, 11.1: Narayanan et al. 2021 sec. 2.2, schedule simulator"},
      {"pipeline communication (exposed)", r->comm_exposed[IRG_PP],
       r->p2p_sync_s > 0 ? "docs/planner.md 11.1: engine = deepspeed, its blocking transfers; 11.3: tied weights' all-reduce"
                         : "docs/planner.md 11.3: tied weights' all-reduce"},
      {"optimizer step", r->optimizer_s, "docs/planner.md 11.5: memory bound over the local parameters"},
  };
  int n = (int)(sizeof t / sizeof t[0]);
  qsort(t, (size_t)n, sizeof t[0], term_cmp);
  int k = 0;
  for (int i = 0; i < n && k < max; i++)
    if (t[i].s > 0) out[k++] = t[i];
  return k;
}
