/* plan_report.c - the planner's reports: text, JSON (the stable schema of
 * docs/planner.md sec. 15) and a Chrome trace of one predicted step; the
 * HTML page is plan_html.c. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "plan.h"
#include "plan_evidence.h"
#include "plan_internal.h"
#include "schedule.h"

/* The parameters a token uses (sema.h's sem_active_param_count) on the plan's count,
 * which may pad the vocabulary: the total less the experts a token skips. */
static double plan_active_params(const SemModel *m, const PlanResult *r) {
  return r->params - (double)(sem_param_count(m) - sem_active_param_count(m));
}

static const char *prec_label(Precision p) { return sem_precision_name(p); }

const char *plan_layout_str(char *buf, size_t n, const PlanLayout *L) {
  char sched[48] = "";
  if (L->pp > 1 && L->vpp > 1) snprintf(sched, sizeof sched, " %s/v%" PRId64, sem_schedule_name((Schedule)L->schedule), L->vpp);
  else if (L->pp > 1) snprintf(sched, sizeof sched, " %s", sem_schedule_name((Schedule)L->schedule));
  char ep[32] = "", rl[32] = "";
  if (L->ep > 1) snprintf(ep, sizeof ep, " ep=%" PRId64 "%s", L->ep, plan_layout_folded(L) ? " etp=1" : "");
  if (L->recompute_layers > 0 && L->recompute > 0) snprintf(rl, sizeof rl, "/%" PRId64 "l", L->recompute_layers);
  snprintf(buf, n, "dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 "%s%s sp=%s zero=%" PRId64 " mb=%" PRId64 "%s rc=%s%s%s",
           L->dp, L->tp, L->pp, L->cp, plan_layout_ring(L) ? " ring" : "", ep, L->sp ? "on" : "off", L->zero, L->micro_batch,
           sched, sem_recompute_name((Recompute)L->recompute), rl, L->fused_ce == 1 ? " fce" : "");
  return buf;
}

/* ------------------------------------------------------------------ */
/* text                                                                 */

/* How far to trust the step time: the planner's errors on the published runs
 * most like this plan (plan_evidence.h). */
static void text_evidence(FILE *f, const PlanCtx *c, const PlanResult *r) {
  PlanEvidence e;
  char a[32], b[32], like[256], fit[32];
  if (!(r->step_s > 0) || !isfinite(r->step_s)) return;
  int got = plan_evidence(c, r, &e);
  if (got < 0) {
    fprintf(f, "how far to trust it: %s (docs/planner.md sec. 16.1)\n\n", plan_evidence_none(c, got, like, sizeof like));
    return;
  }
  if (e.fitted == 0) snprintf(fit, sizeof fit, "none");
  else if (e.fitted == e.runs) snprintf(fit, sizeof fit, "all");
  else snprintf(fit, sizeof fit, "%d", e.fitted);
  fprintf(f, "how far to trust it (docs/planner.md sec. 16.1)\n");
  fprintf(f, "  %d published runs like this one (%s), %s of them fitted on:\n", e.runs,
          plan_evidence_like(&e, like, sizeof like), fit);
  fprintf(f, "  the planner's step times were off by %.1f%% in the median, the middle 80%% by %+.1f%% to %+.1f%% (- fast, + slow);\n",
          e.median_abs * 100, e.lo * 100, e.hi * 100);
  fprintf(f, "  off as much here, this step takes %s to %s\n", plan_fmt_time(a, sizeof a, e.step_lo),
          plan_fmt_time(b, sizeof b, e.step_hi));
  /* the closest three, or with --evidence every one, closest first */
  const PlanEvidenceRow **every = plan_evidence_all(c) ? malloc(sizeof *every * (size_t)e.runs) : NULL;
  const PlanEvidenceRow **list = every ? every : e.closest;
  int nlist = every ? plan_evidence_list(c, r, &e, every, e.runs) : e.nclosest;
  const char *head = nlist > e.nclosest ? "runs" : "closest";
  for (int i = 0; i < nlist; i++)
    fprintf(f, "  %-8s %s (%s, %d GPUs, %s parameters): %+.1f%%%s\n", i ? "" : head, list[i]->id, list[i]->set,
            list[i]->gpus, plan_fmt_count(a, sizeof a, list[i]->params), list[i]->error * 100,
            nlist > e.nclosest && list[i]->fitted ? ", fitted on" : "");
  free(every);
  fputc('\n', f);
}

int plan_notes(PlanCtx *c, const PlanResult *r, PlanNote *notes) {
  const SemModel *m = plan_model(c);
  const PlanLayout *L = &r->layout;
  int n = 0;
  if (!r->valid) return 0;
  int64_t vp = 0, v = plan_vocab(c, r, &vp);
  if (v > 0 && vp != v) {
    notes[n].key = "vocabulary";
    snprintf(notes[n++].text, sizeof notes->text,
             "%" PRId64 " rows priced padded to %" PRId64 " (a multiple of vocab_pad %" PRId64 " x tp %" PRId64
             ", as Megatron-LM pads it%s)",
             v, vp, m->layout.vocab_pad, L->tp, L->tp > 1 ? "" : "; aligned rows for the head's GEMMs");
  }
  if (plan_experts_routed_whole(c, L)) {
    notes[n].key = "experts";
    snprintf(notes[n++].text, sizeof notes->text,
             "each sequence routed whole on every context rank, over slots (hpdl's program for a MoE layer that drops "
             "tokens: its capacity is the whole sequence's; docs/compiler.md): the experts' GEMMs%s priced are cp = %" PRId64
             " times those of a program that routes each context rank's own tokens, as a dropless layer does",
             L->ep > 1 ? " and all-to-alls" : "", L->cp);
  }
  if (c->lowp_prec != c->prec) {
    notes[n].key = "precision";
    if (!c->lowp)
      snprintf(notes[n++].text, sizeof notes->text, "%s, but %s has no %s rate: its GEMMs and weights priced in bf16 (docs/planner.md 9.3)",
               sem_precision_name(c->prec), c->dev.name, c->prec == PREC_NVFP4 ? "FP4 or FP8" : "FP8");
    else
      snprintf(notes[n++].text, sizeof notes->text,
               "%s, but %s has no %s: its blocks' GEMMs priced as fp8 with per-tensor scales (docs/planner.md 9.3)",
               sem_precision_name(c->prec), c->dev.name, c->prec == PREC_NVFP4 ? "FP4 rate" : "block-scaled (MX) tensor cores");
  }
  Compression cz = m->layout.compression;
  if (cz != COMPRESS_NONE && L->dp * L->cp > 1) {
    notes[n].key = "compression";
    if (plan_grad_reduce_bytes(cz) == 2)
      snprintf(notes[n++].text, sizeof notes->text,
               "%s, priced as the gradients' reduction in 16 bits, 2 bytes a value (docs/planner.md 11.3)", sem_compression_name(cz));
    else
      snprintf(notes[n++].text, sizeof notes->text, "%s, not priced: planned as an uncompressed reduction in fp32 (docs/planner.md 11.3)",
               sem_compression_name(cz));
  }
  return n;
}

static void text_plan(FILE *f, PlanCtx *c, const char *file, const PlanResult *r) {
  char a[32], b[32], d[32];
  const SemModel *m = plan_model(c);
  const SemCluster *cl = plan_cluster(c);
  const PlanLayout *L = &r->layout;
  fprintf(f, "plan: %s: model %s, %s parameters", file, m->model->decl->name.name, plan_fmt_count(a, sizeof a, r->params));
  if (plan_active_params(m, r) != r->params)
    fprintf(f, ", %s active per token (top_k of the experts)", plan_fmt_count(b, sizeof b, plan_active_params(m, r)));
  fputc('\n', f);
  int64_t gpn = cl->gpus_per_node > 0 ? cl->gpus_per_node : 1;
  fprintf(f, "cluster: %s, %" PRId64 " x %s (%" PRId64 " node%s of %" PRId64 "), %s%s\n", cl->name ? cl->name : "?",
          r->gpus, plan_device(c)->name, (r->gpus + gpn - 1) / gpn, (r->gpus + gpn - 1) / gpn == 1 ? "" : "s", gpn,
          prec_label(m->train.precision),
          plan_gemm_format(c) == PREC_FP8 && m->train.fp8_current ? " (current scaling)" : "");
  char figs[512];
  if (*plan_device_figures(c, figs, sizeof figs))
    fprintf(f, "device: %s as cluster %s describes it: %s\n", plan_device(c)->name, cl->name ? cl->name : "?", figs);
  if (!r->valid) {
    fprintf(f, "layout: not valid: %s\n", r->why);
    return;
  }
  char epx[32] = "";
  if (L->ep > 1) snprintf(epx, sizeof epx, " ep=%" PRId64 "%s", L->ep, plan_layout_folded(L) ? " etp=1" : "");
  fprintf(f,
          "layout: dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 "%s sp=%s zero=%" PRId64
          "; micro batch %" PRId64 " x %" PRId64 " per step (global batch %" PRId64 ")",
          L->dp, L->tp, L->pp, L->cp, epx, L->sp ? "on" : "off", L->zero, L->micro_batch, L->num_micro,
          r->global_batch);
  if (L->pp > 1) {
    fprintf(f, "; schedule %s", sem_schedule_name((Schedule)L->schedule));
    if (L->vpp > 1) fprintf(f, " (%" PRId64 " virtual stages)", L->vpp);
  }
  fprintf(f, "; recompute %s", sem_recompute_name((Recompute)L->recompute));
  if (L->recompute_layers > 0 && L->recompute != RECOMPUTE_NONE)
    fprintf(f, " (the first %" PRId64 " layers of each chunk)", L->recompute_layers);
  /* the overlap the plan priced, not only the flag's */
  if (L->overlap && plan_reduces_after_backward(c, L))
    fprintf(f, "; overlap off (DeepSpeed's engine reduces after the backward)");
  else fprintf(f, "; overlap %s", L->overlap ? "on" : "off");
  if (m->layout.tp_overlap && L->tp > 1) fprintf(f, "; tp_overlap on");
  if (L->fused_ce == 1) fprintf(f, "; fused_ce on");
  if (L->ep > 1 && m->layout.dispatcher == 1) fprintf(f, "; dispatcher deepep");
  if (m->layout.engine == 1) fprintf(f, "; engine deepspeed");
  if (plan_layout_ring(L)) fprintf(f, "; cp_comm ring");
  if (strcmp(plan_attention_name(c), "flash")) fprintf(f, "; attention %s", plan_attention_name(c));
  if (!plan_fusion(c)) fprintf(f, "; fusion off");
  fputc('\n', f);
  PlanNote notes[PLAN_NOTES_MAX];
  for (int i = 0, n = plan_notes(c, r, notes); i < n; i++) fprintf(f, "%s: %s\n", notes[i].key, notes[i].text);
  if (L->pp > 1 && r->stages) {
    fprintf(f, "stages: ");
    for (int s = 0; s < r->nstages; s++) fprintf(f, "%s%" PRId64, s ? "+" : "", r->stages[s].layers);
    fprintf(f, " %s (balance = %s)\n", r->by_pieces ? "pieces of the forward, cut where one activation crosses" : "layers",
            sem_balance_name(m->layout.balance));
  }
  fputc('\n', f);

  const PlanMemory *mm = &r->mem;
  fprintf(f, "memory per GPU (the fullest: pipeline rank %d)\n", mm->rank);
  struct {
    const char *name;
    double v;
    const char *note;
  } rows[] = {
      {"weights", mm->params, ""},
      {"gradients", mm->grads, ""},
      {"optimizer state", mm->optimizer, m->train.moments_bf16 ? "moments in bf16 (train.moments)" : ""},
      {"activations", mm->activations, ""},
      {"temporaries", mm->transient, "largest forward/backward working set"},
      {"comm buffers", mm->comm_buffers, ""},
      {"workspace", mm->workspace, "allowance: context, libraries, fragmentation"},
  };
  char note[96];
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const char *n = rows[i].note;
    if (i == 3) {
      snprintf(note, sizeof note, "%d micro-batch%s in flight", mm->inflight, mm->inflight == 1 ? "" : "es");
      n = note;
    }
    if (*n) fprintf(f, "  %-18s %12s  %s\n", rows[i].name, plan_fmt_bytes(a, sizeof a, rows[i].v), n);
    else fprintf(f, "  %-18s %12s\n", rows[i].name, plan_fmt_bytes(a, sizeof a, rows[i].v));
  }
  fprintf(f, "  %-18s %12s  of %s: %s\n\n", "total", plan_fmt_bytes(a, sizeof a, mm->total),
          plan_fmt_bytes(b, sizeof b, mm->capacity), mm->fits ? "fits" : "DOES NOT FIT");

  double T = r->step_s > 0 ? r->step_s : 1;
  fprintf(f, "time per step%s\n", r->simulated ? "" : " (closed-form bubble)");
  fprintf(f, "  %-18s %12s  %5.1f%%  GEMM %s, memory-bound %s, of which recompute %s\n", "compute",
          plan_fmt_time(a, sizeof a, r->compute_s), r->compute_s / T * 100, plan_fmt_time(b, sizeof b, r->gemm_s),
          plan_fmt_time(d, sizeof d, r->other_s), plan_fmt_time((char[32]){0}, 32, r->recompute_s));
  const char *gname[IRG_COUNT] = {"data-parallel", "tensor-parallel", "pipeline", "context-parallel", "expert-parallel",
                                  "expert-data-par."};
  int order[IRG_COUNT] = {IRG_TP, IRG_CP, IRG_EP, IRG_DP, IRG_EDP, IRG_PP};
  for (int k = 0; k < IRG_COUNT; k++) {
    int g = order[k];
    if (r->comm_s[g] <= 0) continue;
    char lab[40];
    snprintf(lab, sizeof lab, "%s comm", gname[g]);
    fprintf(f, "  %-18s %12s  %5.1f%%  exposed, of %s\n", lab, plan_fmt_time(a, sizeof a, r->comm_exposed[g]),
            r->comm_exposed[g] / T * 100, plan_fmt_time(b, sizeof b, r->comm_s[g]));
  }
  if (L->pp > 1)
    fprintf(f, "  %-18s %12s  %5.1f%%  %.1f%% of the pipeline idle; one transfer %s%s\n", "pipeline bubble",
            plan_fmt_time(a, sizeof a, r->bubble_s), r->bubble_s / T * 100, r->bubble_fraction * 100,
            plan_fmt_time(b, sizeof b, r->p2p_sync_s > 0 ? r->p2p_sync_s : r->p2p_s),
            r->p2p_sync_s > 0 ? ", blocking (DeepSpeed's: a piece per tensor rank, then gathered)" : "");
  fprintf(f, "  %-18s %12s  %5.1f%%\n", "optimizer step", plan_fmt_time(a, sizeof a, r->optimizer_s), r->optimizer_s / T * 100);
  fprintf(f, "  %-18s %12s\n\n", "step", plan_fmt_time(a, sizeof a, r->step_s));
  text_evidence(f, c, r);
  if (plan_explain_enabled(c)) {
    PlanTerm t[5];
    int n = plan_explain_terms(c, r, t, 5);
    fprintf(f, "the five largest terms of the step, and where their formulas come from\n");
    for (int i = 0; i < n; i++)
      fprintf(f, "  %-42s %10s %5.1f%%  %s\n", t[i].name, plan_fmt_time(a, sizeof a, t[i].s), t[i].s / T * 100, t[i].source);
    fputc('\n', f);
  }

  fprintf(f, "communication per GPU per step\n");
  fprintf(f, "  %-18s %12s %12s %12s\n", "group", "bytes sent", "time", "exposed");
  for (int k = 0; k < IRG_COUNT; k++) {
    int g = order[k];
    if ((g == IRG_EP || g == IRG_EDP) && r->comm_bytes[g] <= 0) continue; /* rows of expert parallelism when there is some */
    fprintf(f, "  %-18s %12s %12s %12s\n", gname[g], plan_fmt_bytes(a, sizeof a, r->comm_bytes[g]),
            plan_fmt_time(b, sizeof b, r->comm_s[g]), plan_fmt_time(d, sizeof d, r->comm_exposed[g]));
  }
  fprintf(f, "\nthroughput\n");
  fprintf(f, "  %-18s %12s\n", plan_model(c)->images ? "images/s" : "tokens/s", plan_fmt_count(a, sizeof a, r->tokens_per_s));
  fprintf(f, "  %-18s %12.1f  hardware GEMM FLOPs with recomputation (Narayanan Eq. 3)\n", "TFLOP/s per GPU",
          r->tflops_per_gpu);
  fprintf(f, "  %-18s %11.1f%%  model FLOPs %s per step%s\n", "MFU", r->mfu * 100, plan_fmt_count(a, sizeof a, r->model_flops),
          plan_active_params(plan_model(c), r) != r->params ? ", of the active parameters (each token's top_k experts)" : "");
  fprintf(f, "  %-18s %11.1f%%\n", "HFU", r->hfu * 100);
  if (r->stages && r->nstages > 1) {
    fprintf(f, "\npipeline ranks (one micro-batch)\n");
    fprintf(f, "  %4s %6s %12s %12s %12s %12s %9s\n", "rank", r->by_pieces ? "pieces" : "layers", "forward", "backward", "params", "memory", "in flight");
    for (int s = 0; s < r->nstages; s++) {
      const PlanStage *st = &r->stages[s];
      if (r->nstages > 8 && s > 2 && s < r->nstages - 3) {
        if (s == 3) fprintf(f, "  %4s\n", "...");
        continue;
      }
      fprintf(f, "  %4d %6" PRId64 " %12s %12s %12s %12s %9d\n", s, st->layers, plan_fmt_time(a, sizeof a, st->fwd_s),
              plan_fmt_time(b, sizeof b, st->bwd_s), plan_fmt_count(d, sizeof d, st->params),
              plan_fmt_bytes((char[32]){0}, 32, st->mem.total), st->mem.inflight);
    }
  }
  fprintf(f, "\nlimit: %s\n", r->limit);
}

const char *plan_search_none_note(const PlanReport *rep) {
  return rep->plan && !rep->plan->valid && rep->plan->why[0] ? rep->plan->why : "no layout fits";
}

static void text_search(FILE *f, const PlanReport *rep) {
  char a[32], b[32], ls[160];
  const PlanSearchStats *st = rep->stats;
  fprintf(f, "\nsearch: %" PRId64 " layouts enumerated, %" PRId64 " valid, %" PRId64 " fit; %" PRId64
             " programs priced, %" PRId64 " re-priced exactly\n",
          st ? st->enumerated : 0, st ? st->valid : 0, st ? st->fit : 0, st ? st->programs : 0, st ? st->exact : 0);
  if (rep->nsearch == 0) {
    fprintf(f, "  %s\n", plan_search_none_note(rep));
    return;
  }
  fprintf(f, "  %2s  %-52s %10s %8s %6s %10s\n", "#", "layout", "step", "TFLOP/s", "MFU", "memory");
  for (int i = 0; i < rep->nsearch; i++) {
    const PlanResult *r = &rep->search[i];
    fprintf(f, "  %2d  %-52s %10s %8.1f %5.1f%% %10s\n", i + 1, plan_layout_str(ls, sizeof ls, &r->layout),
            plan_fmt_time(a, sizeof a, r->step_s), r->tflops_per_gpu, r->mfu * 100, plan_fmt_bytes(b, sizeof b, r->mem.total));
    fprintf(f, "      saves: %s; costs: %s\n", r->saves, r->costs);
  }
}

static void text_scaling(FILE *f, const PlanScaling *s) {
  char a[32];
  fprintf(f, "\nstrong scaling (global batch fixed)\n");
  fprintf(f, "  %6s %6s %10s %9s %8s %11s\n", "GPUs", "dp", "step", "speed-up", "eff.", "Karp-Flatt");
  for (int i = 0; i < s->n; i++) {
    const PlanScalePoint *p = &s->pts[i];
    if (!p->ok || !p->strong.valid || !p->strong.mem.fits) {
      fprintf(f, "  %6" PRId64 "  %s\n", p->gpus, p->strong.valid ? "does not fit" : "no layout (degrees do not divide)");
      continue;
    }
    fprintf(f, "  %6" PRId64 " %6" PRId64 " %10s %9.2f %7.1f%% %11.4f\n", p->gpus, p->strong.layout.dp,
            plan_fmt_time(a, sizeof a, p->strong.step_s), p->strong_speedup, p->strong_eff * 100, p->karp_flatt);
  }
  fprintf(f, "  Amdahl serial fraction (least squares): %.4f\n", s->amdahl_f);
  fprintf(f, "\nweak scaling (global batch grows with the GPUs)\n");
  fprintf(f, "  %6s %8s %10s %12s %8s %10s\n", "GPUs", "batch", "step", "scaled S", "eff.", "Gustafson");
  for (int i = 0; i < s->n; i++) {
    const PlanScalePoint *p = &s->pts[i];
    if (!p->ok || !p->weak.valid || !p->weak.mem.fits) {
      fprintf(f, "  %6" PRId64 "  %s\n", p->gpus, p->weak.valid ? "does not fit" : "no layout (degrees do not divide)");
      continue;
    }
    double N = (double)p->gpus / (double)s->pts[0].gpus;
    fprintf(f, "  %6" PRId64 " %8" PRId64 " %10s %12.2f %7.1f%% %10.2f\n", p->gpus, p->weak.global_batch,
            plan_fmt_time(a, sizeof a, p->weak.step_s), p->weak_speedup, p->weak_eff * 100,
            cost_gustafson_speedup(s->gustafson_f, N));
  }
  fprintf(f, "  Gustafson serial fraction (least squares): %.4f\n", s->gustafson_f);
}

void plan_report_text(FILE *f, PlanCtx *c, const PlanReport *rep) {
  if (rep->plan) text_plan(f, c, rep->file, rep->plan);
  if (rep->search) text_search(f, rep);
  if (rep->scaling) text_scaling(f, rep->scaling);
}

/* ------------------------------------------------------------------ */
/* JSON                                                                 */

static json_t *jnum(double v) { return json_real(isfinite(v) ? v : 0.0); }

static json_t *json_layout(const PlanLayout *L) {
  json_t *o = json_object();
  json_object_set_new(o, "dp", json_integer(L->dp));
  json_object_set_new(o, "tp", json_integer(L->tp));
  json_object_set_new(o, "pp", json_integer(L->pp));
  json_object_set_new(o, "cp", json_integer(L->cp));
  json_object_set_new(o, "sp", json_boolean(L->sp == 1));
  json_object_set_new(o, "zero", json_integer(L->zero));
  json_object_set_new(o, "micro_batch", json_integer(L->micro_batch));
  json_object_set_new(o, "num_micro_batches", json_integer(L->num_micro));
  json_object_set_new(o, "schedule", json_string(L->schedule >= 0 ? sem_schedule_name((Schedule)L->schedule) : "auto"));
  json_object_set_new(o, "virtual_stages", json_integer(L->vpp > 0 ? L->vpp : 1));
  json_object_set_new(o, "recompute",
                      json_string(L->recompute >= 0 ? sem_recompute_name((Recompute)L->recompute) : "auto"));
  /* 0: every layer of a chunk under the policy */
  json_object_set_new(o, "recompute_layers", json_integer(L->recompute > 0 && L->recompute_layers > 0 ? L->recompute_layers : 0));
  json_object_set_new(o, "overlap", json_boolean(L->overlap != 0));
  /* expert parallelism: its degree, and the experts whole over a group folded
   * over tensor x data ranks (expert_tensor = 1) or split over the tensor group */
  json_object_set_new(o, "ep", json_integer(L->ep > 1 ? L->ep : 1));
  json_object_set_new(o, "expert_tensor", json_integer(plan_layout_folded(L) ? 1 : L->tp));
  return o;
}

static json_t *json_memory(const PlanMemory *m) {
  json_t *o = json_object();
  json_object_set_new(o, "params", jnum(m->params));
  json_object_set_new(o, "grads", jnum(m->grads));
  json_object_set_new(o, "optimizer", jnum(m->optimizer));
  json_object_set_new(o, "activations", jnum(m->activations));
  json_object_set_new(o, "temporaries", jnum(m->transient));
  json_object_set_new(o, "comm_buffers", jnum(m->comm_buffers));
  json_object_set_new(o, "workspace", jnum(m->workspace));
  json_object_set_new(o, "total", jnum(m->total));
  json_object_set_new(o, "capacity", jnum(m->capacity));
  json_object_set_new(o, "fits", json_boolean(m->fits));
  json_object_set_new(o, "pipeline_rank", json_integer(m->rank));
  json_object_set_new(o, "micro_batches_in_flight", json_integer(m->inflight));
  return o;
}

static json_t *json_groups(const double *v) {
  json_t *o = json_object();
  json_object_set_new(o, "dp", jnum(v[IRG_DP]));
  json_object_set_new(o, "tp", jnum(v[IRG_TP]));
  json_object_set_new(o, "pp", jnum(v[IRG_PP]));
  json_object_set_new(o, "cp", jnum(v[IRG_CP]));
  json_object_set_new(o, "ep", jnum(v[IRG_EP]));
  json_object_set_new(o, "edp", jnum(v[IRG_EDP]));
  return o;
}

static json_t *json_time(const PlanResult *r) {
  json_t *o = json_object();
  json_object_set_new(o, "step_s", jnum(r->step_s));
  json_object_set_new(o, "compute_s", jnum(r->compute_s));
  json_object_set_new(o, "gemm_s", jnum(r->gemm_s));
  json_object_set_new(o, "memory_bound_s", jnum(r->other_s));
  json_object_set_new(o, "recompute_s", jnum(r->recompute_s));
  json_object_set_new(o, "comm_exposed_s", jnum(r->comm_exposed_s));
  json_object_set_new(o, "bubble_s", jnum(r->bubble_s));
  json_object_set_new(o, "bubble_fraction", jnum(r->bubble_fraction));
  json_object_set_new(o, "optimizer_s", jnum(r->optimizer_s));
  json_object_set_new(o, "p2p_transfer_s", jnum(r->p2p_s));
  if (r->p2p_sync_s > 0) json_object_set_new(o, "p2p_deepspeed_transfer_s", jnum(r->p2p_sync_s));
  json_object_set_new(o, "attention_s", jnum(r->attn_s));
  json_object_set_new(o, "grouped_gemm_s", jnum(r->grouped_s));
  json_object_set_new(o, "bubble_simulated", json_boolean(r->simulated));
  return o;
}

static json_t *json_throughput(const PlanResult *r) {
  json_t *o = json_object();
  json_object_set_new(o, "tokens_per_s", jnum(r->tokens_per_s));
  json_object_set_new(o, "tflops_per_gpu", jnum(r->tflops_per_gpu));
  json_object_set_new(o, "mfu", jnum(r->mfu));
  json_object_set_new(o, "hfu", jnum(r->hfu));
  return o;
}

/* One published run of the evidence (closest[], all[] with its fitted flag). */
static json_t *json_evidence_row(const PlanEvidenceRow *row, int with_fitted) {
  json_t *x = json_object();
  json_object_set_new(x, "id", json_string(row->id));
  json_object_set_new(x, "set", json_string(row->set));
  json_object_set_new(x, "gpus", json_integer(row->gpus));
  json_object_set_new(x, "params", jnum(row->params));
  json_object_set_new(x, "error", jnum(row->error));
  if (with_fitted) json_object_set_new(x, "fitted", json_boolean(row->fitted));
  return x;
}

/* The plan's traits, and the planner's errors on the published runs like it
 * (plan_evidence.h); "runs": 0 where none is of its GPU generation. */
static json_t *json_evidence(const PlanCtx *c, const PlanResult *r) {
  json_t *o = json_object(), *tr = json_object();
  PlanEvidence e;
  int got = plan_evidence(c, r, &e);
  for (int k = 0; k < PLAN_TRAIT_COUNT; k++) {
    const char *code = plan_trait_code(k, e.traits.v[k]);
    json_object_set_new(tr, plan_trait_key(k), code ? json_string(code) : json_boolean(e.traits.v[k]));
  }
  json_object_set_new(o, "traits", tr);
  if (got < 0) { /* none like it: another generation, or images */
    json_object_set_new(o, "runs", json_integer(0));
    return o;
  }
  json_t *m = json_array();
  for (int k = 0; k < PLAN_TRAIT_COUNT; k++)
    if (e.matched[k]) json_array_append_new(m, json_string(plan_trait_key(k)));
  json_object_set_new(o, "matched", m);
  json_object_set_new(o, "runs", json_integer(e.runs));
  json_object_set_new(o, "fitted", json_integer(e.fitted));
  json_object_set_new(o, "median_abs_error", jnum(e.median_abs));
  json_object_set_new(o, "error_p10", jnum(e.lo));
  json_object_set_new(o, "error_p90", jnum(e.hi));
  json_object_set_new(o, "step_s_low", jnum(e.step_lo));
  json_object_set_new(o, "step_s_high", jnum(e.step_hi));
  json_t *cl = json_array();
  for (int i = 0; i < e.nclosest; i++) json_array_append_new(cl, json_evidence_row(e.closest[i], 0));
  json_object_set_new(o, "closest", cl);
  const PlanEvidenceRow **list;
  if (plan_evidence_all(c) && (list = malloc(sizeof *list * (size_t)e.runs))) { /* --evidence: every run, closest first */
    int nl = plan_evidence_list(c, r, &e, list, e.runs);
    json_t *all = json_array();
    for (int i = 0; i < nl; i++) json_array_append_new(all, json_evidence_row(list[i], 1));
    json_object_set_new(o, "all", all);
    free(list);
  }
  return o;
}

static json_t *json_result(PlanCtx *c, const PlanResult *r, int brief) {
  json_t *o = json_object();
  json_object_set_new(o, "valid", json_boolean(r->valid));
  if (!r->valid) json_object_set_new(o, "why", json_string(r->why));
  json_t *par = json_layout(&r->layout);
  json_object_set_new(par, "balance", json_string(sem_balance_name(plan_model(c)->layout.balance)));
  json_object_set_new(par, "fused_ce", json_boolean(r->layout.fused_ce == 1));
  json_object_set_new(par, "dispatcher", json_string(plan_model(c)->layout.dispatcher == 1 ? "deepep" : "alltoall"));
  json_object_set_new(par, "engine", json_string(plan_model(c)->layout.engine == 1 ? "deepspeed" : "hpdl"));
  if (c->experts > 0)
    json_object_set_new(par, "expert_routing",
                        json_string(plan_experts_routed_whole(c, &r->layout) ? "whole_sequence" : "own_tokens"));
  json_object_set_new(par, "cp_comm", json_string(r->layout.cp_comm == 1 ? "ring" : r->layout.cp_comm < 0 ? "auto" : "allgather"));
  Compression cz = plan_model(c)->layout.compression;
  json_object_set_new(par, "compression", json_string(sem_compression_name(cz)));
  json_object_set_new(par, "grad_reduce_bytes", json_integer(plan_grad_reduce_bytes(cz)));
  if (r->stages) { /* the layers each pipeline rank runs (its chunks together) */
    json_t *sl = json_array();
    for (int s = 0; s < r->nstages; s++) json_array_append_new(sl, json_integer(r->stages[s].layers));
    json_object_set_new(par, r->by_pieces ? "stage_pieces" : "stage_layers", sl);
  }
  json_object_set_new(o, "parallel", par);
  if (!brief) { /* the text report's notes below its layout line */
    PlanNote notes[PLAN_NOTES_MAX];
    json_t *nj = json_object();
    for (int i = 0, n = plan_notes(c, r, notes); i < n; i++) json_object_set_new(nj, notes[i].key, json_string(notes[i].text));
    json_object_set_new(o, "notes", nj);
  }
  json_object_set_new(o, "memory_per_gpu", json_memory(&r->mem));
  json_object_set_new(o, "comm_per_step", json_groups(r->comm_bytes));
  json_t *ct = json_object();
  json_object_set_new(ct, "total_s", json_groups(r->comm_s));
  json_object_set_new(ct, "exposed_s", json_groups(r->comm_exposed));
  json_object_set_new(o, "comm_time_per_step", ct);
  json_object_set_new(o, "time", json_time(r));
  json_object_set_new(o, "throughput", json_throughput(r));
  json_object_set_new(o, "limit", json_string(r->limit));
  if (!brief && plan_explain_enabled(c)) {
    PlanTerm t[5];
    int n = plan_explain_terms(c, r, t, 5);
    json_t *ex = json_array();
    for (int i = 0; i < n; i++) {
      json_t *e = json_object();
      json_object_set_new(e, "term", json_string(t[i].name));
      json_object_set_new(e, "seconds", jnum(t[i].s));
      json_object_set_new(e, "share", jnum(r->step_s > 0 ? t[i].s / r->step_s : 0));
      json_object_set_new(e, "source", json_string(t[i].source));
      json_array_append_new(ex, e);
    }
    json_object_set_new(o, "explain", ex);
  }
  if (!brief && r->valid && r->step_s > 0 && isfinite(r->step_s)) json_object_set_new(o, "accuracy", json_evidence(c, r));
  if (!brief && r->stages) {
    json_t *st = json_array();
    for (int s = 0; s < r->nstages; s++) {
      json_t *e = json_object();
      json_object_set_new(e, "rank", json_integer(s));
      json_object_set_new(e, "layers", json_integer(r->stages[s].layers));
      json_object_set_new(e, "fwd_s", jnum(r->stages[s].fwd_s));
      json_object_set_new(e, "bwd_s", jnum(r->stages[s].bwd_s));
      json_object_set_new(e, "busy_s", jnum(r->stages[s].busy_s));
      json_object_set_new(e, "params", jnum(r->stages[s].params));
      json_object_set_new(e, "memory", json_memory(&r->stages[s].mem));
      json_array_append_new(st, e);
    }
    json_object_set_new(o, "stages", st);
  }
  (void)c;
  return o;
}

static json_t *json_report(PlanCtx *c, const PlanReport *rep) {
  const SemModel *m = plan_model(c);
  const SemCluster *cl = plan_cluster(c);
  const PlanResult *r = rep->plan;
  json_t *root = r ? json_result(c, r, 0) : json_object();
  json_object_set_new(root, "schema", json_string("hpdl.plan/1"));
  json_object_set_new(root, "file", json_string(rep->file ? rep->file : ""));
  json_t *mo = json_object();
  json_object_set_new(mo, "name", json_string(m->model->decl->name.name));
  json_object_set_new(mo, "params", jnum(r ? r->params : 0));
  json_object_set_new(mo, "active_params", jnum(r ? plan_active_params(m, r) : 0));
  json_object_set_new(mo, "flops_per_step", jnum(r ? r->model_flops : 0));
  json_object_set_new(mo, "flops_per_step_all_ops", jnum(r ? r->model_flops_all : 0));
  json_object_set_new(mo, "hardware_flops_per_step", jnum(r ? r->hw_flops : 0));
  json_object_set_new(mo, "recompute_flops_per_step", jnum(r ? r->recompute_flops : 0));
  json_object_set_new(mo, "seq_len", json_integer(r ? r->seq_len : m->seq_len));
  json_object_set_new(mo, "global_batch", json_integer(r ? r->global_batch : m->train.global_batch));
  json_object_set_new(mo, "tokens_per_step", jnum(r ? (double)r->global_batch * (double)r->seq_len : 0));
  json_object_set_new(mo, "precision", json_string(prec_label(m->train.precision)));
  json_object_set_new(mo, "gemm_format", json_string(prec_label(plan_gemm_format(c))));
  if (plan_gemm_format(c) == PREC_FP8)
    json_object_set_new(mo, "fp8_scaling", json_string(m->train.fp8_current ? "current" : "delayed"));
  json_object_set_new(mo, "moments", json_string(m->train.moments_bf16 ? "bf16" : "fp32"));
  int64_t vpad = 0, voc = plan_vocab(c, r, &vpad);
  if (voc > 0) {
    json_object_set_new(mo, "vocab", json_integer(voc));
    json_object_set_new(mo, "vocab_priced", json_integer(vpad));
  }
  json_object_set_new(mo, "attention", json_string(plan_attention_name(c)));
  json_object_set_new(mo, "fusion", json_string(plan_fusion(c) ? "on" : "off"));
  json_object_set_new(root, "model", mo);
  json_t *co = json_object();
  json_object_set_new(co, "name", json_string(cl->name ? cl->name : ""));
  json_object_set_new(co, "device", json_string(plan_device(c)->name));
  json_object_set_new(co, "gpus", json_integer(plan_gpus(c)));
  json_object_set_new(co, "gpus_per_node", json_integer(cl->gpus_per_node));
  json_object_set_new(co, "peak_flops", jnum(cat_peak_flops(plan_device(c), plan_gemm_peak_name(c))));
  /* the peak of the precision that MFU is measured against (FP8: the FP8 rate) */
  json_object_set_new(co, "hbm_bytes_per_s", jnum(plan_device(c)->hbm_bytes_per_s));
  json_object_set_new(co, "memory_bytes", jnum(plan_device(c)->mem_bytes));
  if (cl->described) {
    /* the device's own figures the cluster gave (before compute_scale / memory_scale) */
    json_t *fo = json_object();
    for (int k = 0; k < SEM_FIG_COUNT; k++)
      if (cl->described >> k & 1u) json_object_set_new(fo, sem_figure_keys[k], jnum(cl->figures[k]));
    json_object_set_new(co, "device_figures", fo);
  }
  json_object_set_new(root, "cluster", co);
  if (rep->search) {
    json_t *arr = json_array();
    for (int i = 0; i < rep->nsearch; i++) {
      json_t *e = json_result(c, &rep->search[i], 1);
      json_object_set_new(e, "rank", json_integer(i + 1));
      json_object_set_new(e, "saves", json_string(rep->search[i].saves));
      json_object_set_new(e, "costs", json_string(rep->search[i].costs));
      json_array_append_new(arr, e);
    }
    json_t *so = json_object();
    json_object_set_new(so, "top", arr);
    if (rep->stats) {
      json_object_set_new(so, "enumerated", json_integer(rep->stats->enumerated));
      json_object_set_new(so, "valid", json_integer(rep->stats->valid));
      json_object_set_new(so, "fit", json_integer(rep->stats->fit));
      json_object_set_new(so, "programs", json_integer(rep->stats->programs));
      json_object_set_new(so, "seconds", jnum(rep->stats->seconds));
    }
    json_object_set_new(root, "search", so);
  }
  if (rep->scaling) {
    const PlanScaling *s = rep->scaling;
    json_t *so = json_object(), *strong = json_array(), *weak = json_array();
    for (int i = 0; i < s->n; i++) {
      const PlanScalePoint *p = &s->pts[i];
      json_t *a = json_object(), *b = json_object();
      json_object_set_new(a, "gpus", json_integer(p->gpus));
      json_object_set_new(b, "gpus", json_integer(p->gpus));
      int sok = p->ok && p->strong.valid && p->strong.mem.fits, wok = p->ok && p->weak.valid && p->weak.mem.fits;
      json_object_set_new(a, "ok", json_boolean(sok));
      json_object_set_new(b, "ok", json_boolean(wok));
      if (sok) {
        json_object_set_new(a, "dp", json_integer(p->strong.layout.dp));
        json_object_set_new(a, "step_s", jnum(p->strong.step_s));
        json_object_set_new(a, "speedup", jnum(p->strong_speedup));
        json_object_set_new(a, "efficiency", jnum(p->strong_eff));
        json_object_set_new(a, "karp_flatt", jnum(p->karp_flatt));
      }
      if (wok) {
        json_object_set_new(b, "global_batch", json_integer(p->weak.global_batch));
        json_object_set_new(b, "step_s", jnum(p->weak.step_s));
        json_object_set_new(b, "scaled_speedup", jnum(p->weak_speedup));
        json_object_set_new(b, "efficiency", jnum(p->weak_eff));
      }
      json_array_append_new(strong, a);
      json_array_append_new(weak, b);
    }
    json_object_set_new(so, "strong", strong);
    json_object_set_new(so, "weak", weak);
    json_object_set_new(so, "amdahl_serial_fraction", jnum(s->amdahl_f));
    json_object_set_new(so, "gustafson_serial_fraction", jnum(s->gustafson_f));
    json_object_set_new(root, "scaling", so);
  }
  return root;
}

int plan_report_json(FILE *f, PlanCtx *c, const PlanReport *rep) {
  json_t *root = json_report(c, rep);
  if (rep->compare) json_object_set(root, "compare", (json_t *)rep->compare);
  int rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
  fputc('\n', f);
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Chrome trace                                                         */

static void trace_event(json_t *ev, const char *name, const char *cat, int tid, double start, double end) {
  json_t *e = json_object();
  json_object_set_new(e, "name", json_string(name));
  json_object_set_new(e, "cat", json_string(cat));
  json_object_set_new(e, "ph", json_string("X"));
  json_object_set_new(e, "pid", json_integer(0));
  json_object_set_new(e, "tid", json_integer(tid));
  json_object_set_new(e, "ts", json_real(start * 1e6));
  json_object_set_new(e, "dur", json_real((end - start) * 1e6));
  json_array_append_new(ev, e);
}

static void trace_thread(json_t *ev, int tid, const char *name) {
  json_t *e = json_object();
  json_object_set_new(e, "name", json_string("thread_name"));
  json_object_set_new(e, "ph", json_string("M"));
  json_object_set_new(e, "pid", json_integer(0));
  json_object_set_new(e, "tid", json_integer(tid));
  json_t *a = json_object();
  json_object_set_new(a, "name", json_string(name));
  json_object_set_new(e, "args", a);
  json_array_append_new(ev, e);
  e = json_object();
  json_object_set_new(e, "name", json_string("thread_sort_index"));
  json_object_set_new(e, "ph", json_string("M"));
  json_object_set_new(e, "pid", json_integer(0));
  json_object_set_new(e, "tid", json_integer(tid));
  a = json_object();
  json_object_set_new(a, "sort_index", json_integer(tid));
  json_object_set_new(e, "args", a);
  json_array_append_new(ev, e);
}

int plan_trace(FILE *f, PlanCtx *c, const PlanLayout *L, char *why, size_t whylen) {
  PlanTimeline tl;
  if (plan_timeline(c, L, &tl, why, whylen) != 0) return -1;
  json_t *root = json_object(), *ev = json_array();
  char name[64];
  for (int r = 0; r < tl.pp; r++) {
    snprintf(name, sizeof name, "stage %d compute", r);
    trace_thread(ev, 2 * r, name);
    snprintf(name, sizeof name, "stage %d communication", r);
    trace_thread(ev, 2 * r + 1, name);
  }
  const SchedSim *s = &tl.sim;
  for (int i = 0; i < s->n_events; i++) {
    const SchedEvent *e = &s->events[i];
    switch (e->op) {
    case SCHED_OP_FWD:
      snprintf(name, sizeof name, "F chunk %d mb %d", e->chunk, e->mb);
      trace_event(ev, name, "forward", 2 * e->rank, e->start, e->end);
      break;
    case SCHED_OP_BWD:
      snprintf(name, sizeof name, "B chunk %d mb %d", e->chunk, e->mb);
      trace_event(ev, name, "backward", 2 * e->rank, e->start, e->end);
      break;
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
      snprintf(name, sizeof name, "%s %d.%d -> %d", e->op == SCHED_OP_SEND_ACT ? "send act" : "send grad", e->chunk, e->mb,
               e->peer);
      trace_event(ev, name, "p2p", 2 * e->rank + 1, e->start, e->end);
      break;
    case SCHED_OP_RECV_ACT:
    case SCHED_OP_RECV_GRAD:
      if (e->end > e->start) {
        snprintf(name, sizeof name, "bubble (wait %d.%d)", e->chunk, e->mb);
        trace_event(ev, name, "bubble", 2 * e->rank, e->start, e->end);
      }
      break;
    default:
      break;
    }
  }
  /* after the pipeline: the exposed gradient synchronisation, the optimizer */
  for (int r = 0; r < tl.pp; r++) {
    double t = tl.sim.makespan;
    if (tl.dp_exposed > 0) trace_event(ev, "data-parallel gradient sync (exposed)", "dp", 2 * r + 1, t, t + tl.dp_exposed);
    t += tl.dp_exposed;
    trace_event(ev, "optimizer step", "optimizer", 2 * r, t, t + tl.optimizer);
  }
  json_object_set_new(root, "traceEvents", ev);
  json_object_set_new(root, "displayTimeUnit", json_string("ms"));
  int rc = json_dumpf(root, f, JSON_COMPACT);
  fputc('\n', f);
  json_decref(root);
  plan_timeline_free(&tl);
  return rc;
}
