/* plan_search.c - the layout search, auto fields and scaling tables (see
 * plan.h); the explanation of a plan's limit is plan_explain.c. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost.h"
#include "plan.h"
#include "plan_internal.h"
#include "progress.h"
#include "schedule.h"

/* Bounds of the enumeration (docs/planner.md sec. 13). */
enum {
  PLAN_SEARCH_MAX_MB = 64, /* micro batches beyond this never fit a transformer's activations */
  PLAN_SEARCH_MAX_CP = 32,
  PLAN_SEARCH_MAX_V = 8,   /* virtual stages per rank */
  PLAN_SEARCH_EXACT = 16   /* screened layouts re-priced exactly (at least; 4 x top) */
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *fmt_bytes(char *b, size_t n, double v) { return plan_fmt_bytes(b, n, v); }

/* ------------------------------------------------------------------ */
/* search                                                              */

typedef struct {
  PlanResult *best;
  int n, cap;
  int by_memory; /* rank by memory per GPU first (when nothing fits) */
  /* the screening's bound (PlanCtx.screen_bound, PLAN_FIT_FIRST), which
   * top_insert keeps: once the list is full, a layout whose step is longer
   * than its slowest cannot enter it (a tie in time may, by memory); NULL:
   * none */
  double *bound;
} TopList;

static int better(const TopList *t, const PlanResult *a, const PlanResult *b) {
  if (t->by_memory && a->mem.total != b->mem.total) return a->mem.total < b->mem.total;
  if (a->step_s != b->step_s) return a->step_s < b->step_s;
  return a->mem.total < b->mem.total;
}

static void top_insert(TopList *t, const PlanResult *r) {
  if (t->n == t->cap && !better(t, r, &t->best[t->n - 1])) return;
  int i = t->n < t->cap ? t->n++ : t->cap - 1;
  while (i > 0 && better(t, r, &t->best[i - 1])) {
    t->best[i] = t->best[i - 1];
    i--;
  }
  t->best[i] = *r;
  t->best[i].stages = NULL;
  t->best[i].nstages = 0;
  if (t->bound && t->n == t->cap) *t->bound = t->best[t->n - 1].step_s;
}

static int fixed_ok(int64_t fix, int64_t v) { return fix < 0 || fix == v; }

/* "what it saves, what it costs" against the winner. */
static void why_wins(PlanResult *r, const PlanResult *w, const PlanResult *next, int rank) {
  char a[32], b[32];
  if (rank == 0) {
    /* the winner: what it saves against the runner-up */
    if (next) {
      struct {
        double dv;
        const char *what;
      } gain[5] = {{next->bubble_s - r->bubble_s, "bubble"},
                   {next->comm_exposed_s - r->comm_exposed_s, "exposed communication"},
                   {next->recompute_s - r->recompute_s, "recomputation"},
                   {next->other_s - r->other_s, "memory-bound kernels"},
                   {next->gemm_s - r->gemm_s, "GEMM time of the busiest stage"}};
      int best = 0;
      for (int i = 1; i < 5; i++)
        if (gain[i].dv > gain[best].dv) best = i;
      double d = (next->step_s / r->step_s - 1) * 100;
      if (d >= 0.05 && gain[best].dv > 0)
        snprintf(r->saves, sizeof r->saves, "fastest, %.1f%% ahead of #2, mostly %s (-%s); %.0f%% MFU", d,
                 gain[best].what, plan_fmt_time(b, sizeof b, gain[best].dv), r->mfu * 100);
      else snprintf(r->saves, sizeof r->saves, "fastest (#2 is within 0.05%%); %.0f%% MFU", r->mfu * 100);
    } else {
      snprintf(r->saves, sizeof r->saves, "the only layout that fits; %.0f%% MFU", r->mfu * 100);
    }
    snprintf(r->costs, sizeof r->costs, "%s of %s per GPU", fmt_bytes(a, sizeof a, r->mem.total),
             fmt_bytes(b, sizeof b, r->mem.capacity));
    return;
  }
  double d = (r->step_s / w->step_s - 1) * 100;
  double dm = w->mem.total - r->mem.total;
  /* within a MiB: the same (two programs of one layout can differ by rounding) */
  if (fabs(dm) < 1048576) snprintf(r->saves, sizeof r->saves, "no memory (it needs as much as #1)");
  else if (dm > 0) snprintf(r->saves, sizeof r->saves, "%s less memory per GPU than #1", fmt_bytes(a, sizeof a, dm));
  else snprintf(r->saves, sizeof r->saves, "no memory (it needs %s more than #1)", fmt_bytes(a, sizeof a, -dm));
  struct {
    double dv;
    const char *what;
  } diff[5] = {{r->bubble_s - w->bubble_s, "bubble"},
               {r->comm_exposed_s - w->comm_exposed_s, "exposed communication"},
               {r->recompute_s - w->recompute_s, "recomputation"},
               {r->other_s - w->other_s, "memory-bound kernels"},
               {r->gemm_s - w->gemm_s, "GEMM time of the busiest stage"}};
  int worst = 0;
  for (int i = 1; i < 5; i++)
    if (diff[i].dv > diff[worst].dv) worst = i;
  if (d < 0.05) snprintf(r->costs, sizeof r->costs, "the same step time as #1 (within 0.05%%)");
  else
    snprintf(r->costs, sizeof r->costs, "+%.1f%% step time, mostly %s (+%s)", d, diff[worst].what,
             plan_fmt_time(b, sizeof b, diff[worst].dv > 0 ? diff[worst].dv : 0));
}

/* Full recomputation of only some layers (parallel.recompute_layers): where
 * a fitting layout r recomputes every layer and keeping them all does not
 * fit (none_fits: 1, 0, or -1 unknown), the fewest layers a chunk (its
 * first) that fit, found by bisection: memory falls and time grows with
 * each layer recomputed. Inserted beside r, which stays a candidate. */
static void partial_recompute(PlanCtx *c, const PlanResult *r, int none_fits, int64_t layers, TopList *tl, PlanSearchStats *st) {
  const PlanLayout *L = &r->layout;
  int64_t chunks = L->pp * (L->vpp > 0 ? L->vpp : 1), per = (layers + chunks - 1) / chunks;
  if (per < 2 || none_fits == 1) return; /* keeping every layer is a candidate of its own */
  PlanLayout t = *L;
  PlanResult q;
  if (none_fits < 0) {
    t.recompute = RECOMPUTE_NONE;
    t.recompute_layers = 0;
    st->enumerated++;
    if (plan_evaluate(c, &t, PLAN_FAST | PLAN_FIT_FIRST, &q) != 0) return;
    st->valid++;
    if (q.mem.fits) return;
    t.recompute = L->recompute;
  }
  int64_t lo = 1, hi = per - 1, best = 0;
  PlanResult found;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    t.recompute_layers = mid;
    st->enumerated++;
    int ok = plan_evaluate(c, &t, PLAN_FAST | PLAN_FIT_FIRST, &q) == 0;
    st->valid += ok; /* the search's counts: every layout priced is enumerated, valid, and maybe fits */
    if (ok && q.mem.fits) {
      best = mid;
      found = q;
      hi = mid - 1;
    } else
      lo = mid + 1;
  }
  if (best > 0) {
    st->fit++;
    top_insert(tl, &found);
  }
}

/* The divisors of n (1 <= n <= 2^32, as --gpus allows) in increasing order,
 * in O(sqrt n): the degrees the search tries divide the GPUs, and stepping
 * through every integer up to n took a minute at n = 2^32. No n up to 2^32
 * has more than 1920 divisors (3491888400 has as many). */
enum { SEARCH_MAX_DIVISORS = 2048 };
static int divisors_of(int64_t n, int64_t *out) {
  int lo = 0, hi = 0;
  int64_t high[SEARCH_MAX_DIVISORS];
  for (int64_t i = 1; i * i <= n && lo + hi < SEARCH_MAX_DIVISORS - 1; i++) {
    if (n % i) continue;
    out[lo++] = i;
    if (i != n / i) high[hi++] = n / i;
  }
  while (hi > 0) out[lo++] = high[--hi];
  return lo;
}

/* The search; with nofit set (nothing fits), the layouts that need the
 * least memory per GPU whether they fit or not. */
static int search(PlanCtx *c, const PlanLayout *fix, int top, PlanResult *out, PlanSearchStats *stats, int nofit) {
  double t0 = now_s();
  PlanSearchStats st;
  memset(&st, 0, sizeof st);
  int64_t programs0 = c->programs;
  if (top < 1) top = 1;
  int keep = 4 * top > PLAN_SEARCH_EXACT ? 4 * top : PLAN_SEARCH_EXACT;
  c->screen_bound = HUGE_VAL;
  TopList tl = {calloc((size_t)keep, sizeof(PlanResult)), 0, keep, nofit, nofit ? NULL : &c->screen_bound};
  if (!tl.best) return 0;
  const SemModel *m = c->model;
  int64_t G = c->gpus, gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
  int64_t seq = m->seq_len > 0 ? m->seq_len : 1;
  /* recompute = act is tried only for a model it changes (a gated activation) */
  PlanKey k1 = {1, 1, 1, 0, RECOMPUTE_ACT, 1, 0, 0, 0, 0};
  int act_differs = fix->recompute == RECOMPUTE_ACT || (fixed_ok(fix->recompute, RECOMPUTE_ACT) && plan_act_differs(c, &k1));
  int selective_differs = plan_selective_differs(c, &k1);
  int64_t layers = m->layers > 0 ? m->layers : 1;
  /* chunks of at least one layer; equal ones when the layers must balance by count */
  int equal = m->layout.balance == BALANCE_LAYERS, ends = m->layout.balance == BALANCE_ENDS;
  int ds_engine = m->layout.engine == 1; /* engine = deepspeed: only the layouts DeepSpeed's engine runs */
  int64_t B = m->train.global_batch > 0 ? m->train.global_batch : 0;
  double cap = plan_device(c)->mem_bytes;
  /* the screening: a layout that does not fit is dropped unpriced in time,
   * but where nothing fits and the least memory is sought (its ties broken
   * by time) */
  unsigned screen = nofit ? PLAN_FAST : PLAN_FAST | PLAN_FIT_FIRST;
  PlanResult r;
  int64_t divs[SEARCH_MAX_DIVISORS];
  int ndivs = divisors_of(G, divs);
  for (int ti = 0; ti < ndivs; ti++) {
    int64_t tp = divs[ti];
    if (!fixed_ok(fix->tp, tp)) continue;
    if (tp > gpn && !c->cluster.shared_device) continue; /* tensor parallelism inside a node */
    for (int64_t cp = 1; cp <= G / tp && cp <= PLAN_SEARCH_MAX_CP; cp++) {
      if ((G / tp) % cp || !fixed_ok(fix->cp, cp)) continue;
      if (cp > 1 && seq % (2 * cp)) continue;
      /* a context rank's zigzag chunks at least an attention tile each (unless
       * the command line fixes cp): shorter ones fill no tile of the kernels'
       * 128 rows and only add exchanges - context parallelism is for long
       * sequences */
      if (cp > 1 && fix->cp <= 0 && seq / (2 * cp) < COST_GEMM_TILE) continue;
      /* cp_comm = auto: the gathered program and the ring's, each priced (at cp > 1) */
      int ring_lo = cp > 1 && fix->cp_comm == 1, ring_hi = cp > 1 && fix->cp_comm != 0;
      for (int ring = ring_lo; ring <= ring_hi; ring++) {
      for (int pi = 0; pi < ndivs && divs[pi] <= G / (tp * cp); pi++) {
        int64_t pp = divs[pi]; /* a divisor of G / (tp cp) is one of G */
        if ((G / (tp * cp)) % pp || !fixed_ok(fix->pp, pp)) continue;
        /* (a forward cut into pieces, no single repeat: plan_evaluate says whether they are enough) */
        if (pp > 1 && m->repeats == 1 && !ends && (m->layers < pp || (equal && layers % pp))) continue;
        if (pp > 1 && m->repeats == 1 && ends && (layers + 2) % pp) continue; /* pp x virtual must divide layers + 2 */
        int64_t dp = G / (tp * cp * pp);
        if (!fixed_ok(fix->dp, dp)) continue;
        int64_t Bs = B > 0 ? B : dp;
        if (Bs % dp) continue;
        /* expert parallelism: a divisor of dp that divides the experts; folded
         * (expert_tensor = 1), tp times one; expert_tensor = auto: both, for a
         * model with experts at tp > 1 */
        int fold_lo = fix->expert_fold > 0, fold_hi = fix->expert_fold != 0;
        if (tp == 1 || c->experts <= 0) fold_lo = fold_hi = 0;
        int64_t eps[128];
        int efs[128], neps = 0;
        for (int f = fold_lo; f <= fold_hi; f++)
          for (int di = 0; di < ndivs && divs[di] <= dp && neps < 126; di++) {
            int64_t d = divs[di];
            if (dp % d) continue;
            if (f && d == 1 && fold_lo) eps[neps] = 1, efs[neps++] = 1; /* else the unfolded pass has ep 1 */
            eps[neps] = f ? tp * d : d, efs[neps++] = f;
          }
        for (int ei = 0; ei < neps; ei++) {
        int64_t ep = eps[ei];
        int fold = efs[ei];
        if (fix->ep > 0 && fix->ep != ep) continue;
        if (ep > 1 && (c->experts <= 0 || c->experts % ep)) continue;
        /* a lower bound of the model states of the fullest rank: the dense
         * parameters over tp, the experts' over the expert group too (and tp
         * unless folded), both over pp; 0.9 for the stages' imbalance */
        double lb_params =
            ((c->params - c->expert_params) / (double)tp + c->expert_params / (double)(ep * (fold ? 1 : tp))) / (double)pp * 0.9;
        for (int sp = 0; sp <= (tp > 1 ? 1 : 0); sp++) {
          if (fix->sp >= 0 && tp > 1 && fix->sp != sp) continue;
          if (sp && seq % tp) continue;
          /* which layouts fit keeping every activation, for partial_recompute:
           * [zero][schedule][v][mb], set by the rc = none pass before rc = full's */
          static unsigned char none_fit[4][3][PLAN_SEARCH_MAX_V + 1][PLAN_SEARCH_MAX_MB + 1];
          memset(none_fit, 0, sizeof none_fit);
          /* and by how much one that does not fit is over (bytes), with its micro-batches in flight */
          static double none_over[4][3][PLAN_SEARCH_MAX_V + 1][PLAN_SEARCH_MAX_MB + 1];
          static int none_inflight[4][3][PLAN_SEARCH_MAX_V + 1][PLAN_SEARCH_MAX_MB + 1];
          memset(none_over, 0, sizeof none_over);
          for (int rc = 0; rc <= RECOMPUTE_LAST; rc++) {
            if (!fixed_ok(fix->recompute, rc) || (rc == RECOMPUTE_ACT && !act_differs)) continue;
            for (int64_t zero = 0; zero <= (dp > 1 ? 3 : 0); zero++) {
              if (!fixed_ok(fix->zero, zero)) continue;
              if (ds_engine && pp > 1 && zero >= 2) continue; /* DeepSpeed's pipeline engine: ZeRO 0-1 */
              CostModelStates ms = cost_model_states_m((int64_t)lb_params, (int)zero, (int)dp, c->prec,
                                                       m->train.optimizer, m->train.momentum > 0, m->train.moments_bf16 ? 2 : 4);
              if (ms.total > cap && !nofit) {
                st.enumerated++;
                st.over_memory++;
                continue;
              }
              /* schedules: (kind, v) */
              for (int sk = 0; sk < 3; sk++) {
                int64_t vmax = sk == SCHED_INTERLEAVED ? PLAN_SEARCH_MAX_V : 1;
                if (pp == 1 && sk != SCHED_1F1B) continue;
                if (ds_engine && pp > 1 && sk != SCHED_1F1B) continue; /* and only TrainSchedule's 1F1B */
                if (fix->schedule >= 0 && pp > 1 && fix->schedule != sk) continue;
                for (int64_t v = sk == SCHED_INTERLEAVED ? 2 : 1; v <= vmax; v++) {
                  if (v > 1 && (ends ? (layers + 2) % (pp * v) != 0 : layers < pp * v || (equal && layers % (pp * v))))
                    continue;
                  if (fix->vpp > 0 && pp > 1 && fix->vpp != v) continue;
                  /* a micro batch the user fixed is tried whatever its size */
                  int64_t mb_lo = fix->micro_batch > 0 ? fix->micro_batch : 1;
                  int64_t mb_hi = fix->micro_batch > 0 ? fix->micro_batch : PLAN_SEARCH_MAX_MB;
                  for (int64_t mb = mb_lo; mb <= Bs / dp && mb <= mb_hi; mb++) {
                    if ((Bs / dp) % mb) continue;
                    int64_t nm = Bs / (dp * mb);
                    if (sk == SCHED_INTERLEAVED && nm % pp) continue;
                    /* fused_ce auto: the head fused with its loss only where the logits do
                     * not fit (it costs a pass of the head's GEMM and saves only memory) */
                    int fce = fix->fused_ce == 1;
                    /* recompute = act auto only where keeping every activation does
                     * not fit: it trades a backward pass over each gated product for
                     * the memory, and a layout that fits without it is the faster */
                    if (rc == RECOMPUTE_ACT && fix->recompute != RECOMPUTE_ACT && fixed_ok(fix->recompute, RECOMPUTE_NONE) &&
                        mb <= PLAN_SEARCH_MAX_MB && v <= PLAN_SEARCH_MAX_V && none_fit[zero][sk][v][mb])
                      continue;
                    PlanLayout L = {dp, tp, pp, cp, v, zero, mb, nm, sp, sk, rc, fix->overlap >= 0 ? fix->overlap : 1, ep, fce,
                                    rc != RECOMPUTE_NONE && fix->recompute_layers > 0 ? fix->recompute_layers : 0, fold, ring};
                    /* recompute = selective auto under context parallelism, where the
                     * model has no attention core to recompute (flash): none's program
                     * but for the blocks received again in the backward, which saves
                     * their memory for a little time - so only where none does not fit,
                     * and by no more than those blocks (all of them kept twice over, a
                     * bound: the gathered program keeps their concatenation) on the
                     * rank's layers and micro-batches in flight */
                    if (rc == RECOMPUTE_SELECTIVE && cp > 1 && !selective_differs && fix->recompute != RECOMPUTE_SELECTIVE &&
                        fixed_ok(fix->recompute, RECOMPUTE_NONE) && mb <= PLAN_SEARCH_MAX_MB && v <= PLAN_SEARCH_MAX_V) {
                      if (none_fit[zero][sk][v][mb]) continue;
                      if (none_over[zero][sk][v][mb] > 0) {
                        PlanLayout none = L;
                        none.recompute = RECOMPUTE_NONE;
                        PlanKey kn = plan_layout_key(&none, 0); /* the program none's layout was priced with */
                        const PlanParts *pn = plan_parts(c, &kn);
                        double most = 2 * pn->cp_recv_layer * (double)((layers + pp - 1) / pp + 1) *
                                      (double)none_inflight[zero][sk][v][mb];
                        if (pn->valid && none_over[zero][sk][v][mb] > most) break; /* nor a larger micro batch */
                      }
                    }
                    st.enumerated++;
                    progress_count(c->progress, "%" PRId64 " layouts priced, %" PRId64 " fit", st.enumerated, st.fit);
                    if (plan_evaluate(c, &L, screen, &r) != 0) {
                      if (!st.refused[0]) {
                        char ls[160];
                        snprintf(st.refused, sizeof st.refused, "%s: %.250s", plan_layout_str(ls, sizeof ls, &r.layout), r.why);
                      }
                      continue;
                    }
                    st.valid++;
                    /* fused_ce auto is tried where the fullest rank holds the head
                     * (the last pipeline rank): the head is all it lightens. Elsewhere
                     * only the stages' split could move with it, and the program is
                     * not built for that (docs/planner.md sec. 12) */
                    if (!r.mem.fits && fix->fused_ce < 0 && (L.pp == 1 || r.mem.rank == L.pp - 1)) {
                      if (nofit) top_insert(&tl, &r);
                      PlanResult rf;
                      L.fused_ce = 1;
                      if (plan_evaluate(c, &L, screen, &rf) == 0) r = rf;
                    }
                    int known = mb <= PLAN_SEARCH_MAX_MB && v <= PLAN_SEARCH_MAX_V;
                    if (known && rc == RECOMPUTE_NONE) {
                      none_fit[zero][sk][v][mb] = r.mem.fits ? 1 : 0;
                      none_over[zero][sk][v][mb] = r.mem.total - r.mem.capacity;
                      none_inflight[zero][sk][v][mb] = r.mem.inflight > 0 ? r.mem.inflight : 1;
                    }
                    if (!r.mem.fits && !nofit) break; /* a larger micro batch holds more */
                    st.fit += r.mem.fits;
                    top_insert(&tl, &r);
                    if (r.mem.fits && !nofit && rc == RECOMPUTE_FULL && fix->recompute_layers < 0 && m->repeats == 1)
                      partial_recompute(c, &r, !fixed_ok(fix->recompute, RECOMPUTE_NONE) || !known ? -1 : none_fit[zero][sk][v][mb],
                                        layers, &tl, &st);
                  }
                }
              }
            }
          }
        }
        }
      }
      }
    }
  }
  c->screen_bound = HUGE_VAL;
  /* re-price the best exactly: the real chunks and the schedule simulator */
  TopList ex = {calloc((size_t)keep, sizeof(PlanResult)), 0, keep, nofit, NULL};
  for (int i = 0; i < tl.n && ex.best; i++) {
    if (plan_evaluate(c, &tl.best[i].layout, 0, &r) != 0) continue;
    st.exact++;
    if (r.mem.fits || nofit) top_insert(&ex, &r);
  }
  int n = ex.n < top ? ex.n : top;
  for (int i = 0; i < n; i++) {
    out[i] = ex.best[i];
    plan_explain(c, &out[i]);
    why_wins(&out[i], &out[0], i == 0 && n > 1 ? &ex.best[1] : NULL, i);
  }
  free(tl.best);
  free(ex.best);
  st.programs = c->programs - programs0;
  st.seconds = now_s() - t0;
  if (stats) *stats = st;
  return n;
}

int plan_search(PlanCtx *c, const PlanLayout *fix, int top, PlanResult *out, PlanSearchStats *stats) {
  return search(c, fix, top, out, stats, 0);
}

void plan_search_why_none(const PlanCtx *c, const PlanLayout *fix, const PlanSearchStats *st, char *why, size_t size) {
  const SemModel *m = c->model;
  int64_t G = c->gpus, gpn = c->cluster.gpus_per_node > 0 ? c->cluster.gpus_per_node : 1;
  if (st->enumerated == 0) {
    /* the degrees given first: their product must divide the GPUs */
    static const char *const names[] = {"data", "tensor", "pipeline", "context"};
    const int64_t given[] = {fix->dp, fix->tp, fix->pp, fix->cp};
    char list[160] = "";
    int64_t product = 1;
    int n = 0;
    for (int i = 0; i < 4; i++) {
      if (given[i] <= 0) continue;
      size_t len = strlen(list);
      snprintf(list + len, sizeof list - len, "%s%s %" PRId64, n ? " x " : "", names[i], given[i]);
      product *= given[i];
      n++;
    }
    /* the expert group is carved from the data-parallel ranks: dp a multiple of it */
    if (fix->ep > 1 && fix->dp > 0 && fix->dp % fix->ep) {
      snprintf(why, size, "no layout of %" PRId64 " GPUs to price: expert %" PRId64 " does not divide data %" PRId64
               " (the expert groups are carved from the data-parallel ranks)", G, fix->ep, fix->dp);
      return;
    }
    if (fix->ep > 1 && fix->dp <= 0) {
      size_t len = strlen(list);
      snprintf(list + len, sizeof list - len, "%sdata a multiple of expert %" PRId64, n ? " x " : "", fix->ep);
      product *= fix->ep;
      n++;
    }
    if (n > 0 && (product > G || G % product)) {
      snprintf(why, size,
               "no layout of %" PRId64 " GPUs to price: the settings given (%s = %" PRId64
               " GPUs) %s; leave one of them auto or plan a multiple of %" PRId64 " GPUs",
               G, list, product, product > G ? "need more" : "do not divide them", product);
      return;
    }
    snprintf(why, size,
             "no layout of %" PRId64 " GPUs to price: dp x tp x pp x cp must be %" PRId64 ", with dp dividing the global batch (%" PRId64
             "), tp within a node (%" PRId64 " GPUs) and dividing the sequence (%" PRId64
             ") under sequence parallelism, pp at most the layers (%" PRId64
             ") and the settings given kept; plan fewer GPUs or a larger batch",
             G, G, m->train.global_batch, gpn, m->seq_len, m->layers);
  } else if (st->valid == 0 && !st->refused[0] && st->over_memory > 0) {
    /* every layout dropped before it was built: its weights, gradients and
     * optimizer state alone exceed the device */
    snprintf(why, size,
             "no layout fits %" PRId64 " GPUs: the model states alone (weights, gradients, optimizer state) of each of the %" PRId64
             " layouts tried exceed the %.2f GiB of a GPU; plan more GPUs, a higher ZeRO stage or a device with more memory",
             G, st->over_memory, plan_device(c)->mem_bytes / 1073741824.0);
  } else if (st->valid == 0) {
    char over[96] = "";
    if (st->over_memory > 0)
      snprintf(over, sizeof over, " (%" PRId64 " of them over the memory by their model states alone)", st->over_memory);
    snprintf(why, size, "none of the %" PRId64 " layouts of %" PRId64 " GPUs the search tried can be made for this model%s; the first, %.290s",
             st->enumerated, G, over, st->refused[0] ? st->refused : "refused without a reason");
  } else {
    snprintf(why, size, "no layout fits %" PRId64 " GPUs: %" PRId64 " valid, none within %.2f GiB a GPU", G, st->valid,
             plan_device(c)->mem_bytes / 1073741824.0);
  }
}

int plan_resolve(PlanCtx *c, const PlanLayout *L, PlanResult *out) {
  int autos = L->dp < 0 || L->tp < 0 || L->pp < 0 || L->cp < 0 || L->vpp < 0 || L->zero < 0 || L->micro_batch < 0 ||
              L->sp < 0 || L->schedule < 0 || L->recompute < 0 || L->fused_ce < 0 || L->recompute_layers < 0 ||
              (L->cp_comm < 0 && L->cp != 1);
  if (!autos) return plan_evaluate(c, L, 0, out);
  PlanResult best;
  PlanSearchStats st = {0};
  int n = plan_search(c, L, 1, &best, &st);
  if (n < 1 && search(c, L, 1, &best, NULL, 1) == 1 && plan_evaluate(c, &best.layout, 0, out) == 0) {
    /* nothing fits: price the choice that needs the least memory and say so,
     * rather than no answer (a user sizing a run still learns its time and
     * how far it is from fitting) */
    static const char head[] = "no choice of the auto settings fits; shown: the one needing the least memory. ";
    char lim[sizeof out->limit];
    snprintf(lim, sizeof lim, "%s%.*s", head, (int)(sizeof lim - sizeof head), out->limit);
    memcpy(out->limit, lim, sizeof lim);
    return 0;
  }
  if (n < 1) {
    memset(out, 0, sizeof *out);
    out->layout = *L;
    plan_search_why_none(c, L, &st, out->why, sizeof out->why);
    snprintf(out->limit, sizeof out->limit, "%s", out->why);
    return -1;
  }
  /* evaluate again so that the stages belong to this result */
  return plan_evaluate(c, &best.layout, 0, out);
}

/* ------------------------------------------------------------------ */
/* scaling                                                              */

int plan_scaling(PlanCtx *c, const PlanLayout *L, const int64_t *gpus, int n, PlanScaling *out) {
  memset(out, 0, sizeof *out);
  out->pts = calloc((size_t)(n > 0 ? n : 1), sizeof(PlanScalePoint));
  if (!out->pts) return -1;
  out->n = n;
  int64_t saved_gpus = c->gpus, saved_batch = c->batch_override;
  int64_t B0 = c->model->train.global_batch > 0 ? c->model->train.global_batch : 1;
  int64_t n0 = n > 0 ? gpus[0] : 1;
  double T0s = 0, T0w = 0;
  double xs[64] = {0}, ys[64] = {0}, xw[64] = {0}, yw[64] = {0};
  int ns = 0, nw = 0;
  for (int i = 0; i < n; i++) {
    PlanScalePoint *p = &out->pts[i];
    p->gpus = gpus[i];
    c->gpus = gpus[i];
    int64_t model_par = L->tp * L->pp * L->cp;
    PlanLayout l = *L;
    l.dp = gpus[i] / model_par;
    if (gpus[i] % model_par || l.dp < 1) continue;
    c->batch_override = B0;
    int sok = plan_evaluate(c, &l, 0, &p->strong) == 0 && p->strong.mem.fits;
    p->strong.stages = NULL;
    c->batch_override = B0 * gpus[i] / n0 > 0 ? B0 * gpus[i] / n0 : 1;
    int wok = plan_evaluate(c, &l, 0, &p->weak) == 0 && p->weak.mem.fits;
    p->weak.stages = NULL;
    p->ok = sok || wok;
    double N = (double)gpus[i] / (double)n0;
    if (sok) {
      if (T0s == 0) T0s = p->strong.step_s * N; /* as if at n0 with the same efficiency */
      p->strong_speedup = T0s / p->strong.step_s;
      p->strong_eff = p->strong_speedup / N;
      p->karp_flatt = cost_karp_flatt(p->strong_speedup, N);
      if (ns < 64) xs[ns] = N, ys[ns] = p->strong_speedup, ns++;
    }
    if (wok) {
      if (T0w == 0) T0w = p->weak.step_s;
      p->weak_eff = T0w / p->weak.step_s;
      p->weak_speedup = N * p->weak_eff;
      if (nw < 64) xw[nw] = N, yw[nw] = p->weak_speedup, nw++;
    }
  }
  c->gpus = saved_gpus;
  c->batch_override = saved_batch;
  out->amdahl_f = cost_amdahl_fit(xs, ys, ns);
  /* Gustafson: S = N - f (N - 1), least squares through N = 1 */
  double sxy = 0, sxx = 0;
  for (int i = 0; i < nw; i++) {
    double x = xw[i] - 1, y = xw[i] - yw[i];
    sxy += x * y;
    sxx += x * x;
  }
  out->gustafson_f = sxx > 0 ? sxy / sxx : 0;
  if (out->gustafson_f < 0) out->gustafson_f = 0;
  if (out->gustafson_f > 1) out->gustafson_f = 1;
  return 0;
}

void plan_scaling_free(PlanScaling *s) {
  free(s->pts);
  memset(s, 0, sizeof *s);
}
