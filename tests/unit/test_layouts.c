/* test_layouts.c - layout equivalence: the partitioned program, run on
 * simulated ranks in fp64, gives the loss and every parameter gradient of
 * the unpartitioned model within 1e-9 relative, for the combinations of
 * data, tensor, pipeline (with virtual stages), sequence and context
 * parallelism (ring attention over 2 and 4 ranks), each recompute policy
 * and each ZeRO stage: the data-parallel gradient all-reduce or
 * reduce-scatter, and ZeRO-3's gathered parameter pieces, are IR collectives
 * the simulator runs (dpsync.h), and the pieces each data-parallel rank keeps
 * are what is compared. A model of 5 layers runs every pipeline layout on
 * unequal stages (the cost-balanced split, plan_chunk_layers: 5 layers cannot
 * split equally). A mixture-of-experts model adds expert parallelism, and a
 * small ResNet data and pipeline parallelism with batch norm (issue 17). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "sema.h"
#include "sim.h"
#include "test_model.h"
#include "test_util.h"

/* Inputs for the whole global batch: token ids in [0, vocab). */
static double **make_inputs(const SemModel *m, int64_t rows, int64_t vocab, uint64_t seed) {
  int n = m->model->ninputs;
  double **in = calloc((size_t)n, sizeof(double *));
  for (int i = 0; i < n; i++) {
    int64_t per = 1;
    for (int k = 1; k < m->model->inputs[i].type.rank; k++) sym_is_const(m->model->inputs[i].type.dims[k], &per);
    int64_t T = m->seq_len;
    per = T;
    in[i] = malloc(sizeof(double) * (size_t)(rows * per));
    uint64_t s = seed + (uint64_t)i * 7919;
    for (int64_t k = 0; k < rows * per; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      in[i][k] = (double)((s >> 33) % (uint64_t)vocab);
    }
  }
  return in;
}

static double max_abs(const double *a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
  return m;
}

/* Each gradient within 1e-9 of its own scale; gradients that are zero in
 * exact arithmetic (a key bias under softmax) are rounding noise, judged
 * against 1e-6 of the largest gradient of the model. */
static int compare(const SimResult *ref, const SimResult *got, const char *what) {
  int bad = 0;
  double global = 0;
  for (int p = 0; p < ref->nparams; p++) {
    double s = max_abs(ref->grads[p], ref->numel[p]);
    global = s > global ? s : global;
  }
  double lerr = fabs(ref->loss - got->loss) / fabs(ref->loss);
  if (!(lerr <= 1e-9)) {
    fprintf(stderr, "%s: loss %.17g vs reference %.17g (rel %.3g)\n", what, got->loss, ref->loss, lerr);
    bad = 1;
  }
  for (int p = 0; p < ref->nparams; p++) {
    double scale = max_abs(ref->grads[p], ref->numel[p]);
    double worst = 0;
    for (int64_t k = 0; k < ref->numel[p]; k++) {
      double e = fabs(ref->grads[p][k] - got->grads[p][k]);
      worst = e > worst ? e : worst;
    }
    double floor = scale > 1e-6 * global ? scale : 1e-6 * global;
    if (!(worst <= 1e-9 * floor) || global == 0) {
      fprintf(stderr, "%s: gradient of %s differs by %.3g (scale %.3g)\n", what, ref->names[p], worst, scale);
      bad = 1;
    }
  }
  return bad;
}

typedef struct {
  int64_t dp, tp, pp, vpp, cp;
  int sp;
} Combo;

static int run_matrix(const char *file, const char *const *defs, int ndefs, int64_t vocab, int64_t layers, int64_t tp_max,
                      int64_t seq, int pipelines_only) {
  Loaded L;
  SemModel *m = load(&L, file, defs, ndefs);
  if (!m) return 1;
  const int64_t micro = 2, num_micro = 2;
  int64_t rows = 2 * num_micro * micro; /* dp = 2 at most */
  double **inputs = make_inputs(m, rows, vocab, 42);
  int failures = 0, runs = 0, per_zero[2][4] = {{0}};
  static const Recompute policies[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_OPS};
  int runs_of_dp[2] = {0, 0};
  for (int pol = 0; pol < 4; pol++) {
    /* the reference: one rank, every micro-batch of the global batch in turn */
    SimLayout ref_layout = {1, 1, 1, 1, 1, 0, policies[pol], micro, rows / micro, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    SimResult ref;
    char err[512];
    if (sim_step(m, &ref_layout, 1234, inputs, &ref, err, sizeof err)) {
      fprintf(stderr, "%s reference: %s\n", file, err);
      failures++;
      continue;
    }
    static const int64_t dps[] = {1, 2}, tps[] = {1, 2, 4}, pps[] = {1, 2, 4}, cps[] = {1, 2, 4};
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 3; b++)
        for (int c = 0; c < 3; c++)
          for (int v = 1; v <= 2; v++)
            for (int d = 0; d < 3; d++)
              for (int sp = 0; sp <= 1; sp++) {
                Combo k = {dps[a], tps[b], pps[c], v, cps[d], sp};
                if (k.tp > tp_max || (k.sp && k.tp == 1) || (k.vpp > 1 && k.pp == 1)) continue;
                /* a ring of four (ring attention passes three blocks): a few layouts suffice */
                if (k.cp == 4 && (k.tp > 2 || k.pp > 2 || k.dp > 1 || k.sp || seq % 8)) continue;
                if (layers < k.pp * k.vpp) continue; /* a chunk runs at least one layer */
                if (pipelines_only && (k.pp == 1 || k.cp > 2)) continue;
                /* keep the suite short: each recompute policy covers a third of the layouts */
                if ((a + b + c + v + d + sp) % 3 != pol) continue;
                /* ZeRO stages in turn, separately for dp = 1 and 2, so each
                 * meets tensor, pipeline, context and sequence parallelism */
                int zero = runs_of_dp[a]++ % 4;
                per_zero[a][zero]++;
                /* the pipeline ranks run a schedule's instruction lists (GPipe or
                 * 1F1B, interleaved with v = 2) over 4 micro-batches (2 with dp = 2) */
                Schedule sched = k.vpp > 1 ? SCHED_INTERLEAVED : (a + b + d + sp) % 2 ? SCHED_GPIPE : SCHED_1F1B;
                SimLayout lay = {k.dp, k.tp, k.pp, k.cp, k.vpp, k.sp, policies[pol], micro, num_micro * 2 / k.dp, zero, sched, 1, 0, 0, 0, 0, 0};
                SimResult got;
                char what[220];
                snprintf(what, sizeof what, "%s dp=%" PRId64 " zero=%d tp=%" PRId64 " pp=%" PRId64 " v=%" PRId64 " cp=%" PRId64 " sp=%d recompute=%s schedule=%s",
                         file, k.dp, zero, k.tp, k.pp, k.vpp, k.cp, k.sp, sem_recompute_name(policies[pol]), sem_schedule_name(sched));
                runs++;
                if (sim_step(m, &lay, 1234, inputs, &got, err, sizeof err)) {
                  fprintf(stderr, "%s: %s\n", what, err);
                  failures++;
                  continue;
                }
                failures += compare(&ref, &got, what);
                sim_result_free(&got);
              }
    sim_result_free(&ref);
  }
  fprintf(stderr, "%s: %d layouts compared, %d failed; dp=2 with zero 0/1/2/3: %d/%d/%d/%d\n", file, runs, failures,
          per_zero[1][0], per_zero[1][1], per_zero[1][2], per_zero[1][3]);
  for (int i = 0; i < m->model->ninputs; i++) free(inputs[i]);
  free(inputs);
  unload(&L);
  return failures;
}

/* One layout against the reference: 0, or the failures (a step that does
 * not run counts one). */
static int run_layout(const SemModel *m, const SimLayout *lay, uint64_t seed, double **inputs, const SimResult *ref,
                      const char *what) {
  char err[512];
  SimResult got;
  if (sim_step(m, lay, seed, inputs, &got, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", what, err);
    return 1;
  }
  int bad = compare(ref, &got, what);
  sim_result_free(&got);
  return bad;
}

/* Three data-parallel ranks: no tensor of these models divides by 3, so
 * ZeRO-2/3's flat pieces are zero-padded (dpsync.h) - the padding and the
 * last, shorter piece are checked here. */
static int run_dp3(const char *file, const char *const *defs, int ndefs, int64_t vocab) {
  Loaded L;
  SemModel *m = load(&L, file, defs, ndefs);
  if (!m) return 1;
  const int64_t micro = 2, num_micro = 2, rows = 3 * num_micro * micro;
  double **inputs = make_inputs(m, rows, vocab, 7);
  SimLayout ref_layout = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, micro, rows / micro, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
  SimResult ref;
  char err[512];
  int failures = 0;
  if (sim_step(m, &ref_layout, 99, inputs, &ref, err, sizeof err)) {
    fprintf(stderr, "%s reference: %s\n", file, err);
    failures++;
  } else {
    static const struct {
      int64_t tp, pp, cp;
      int sp;
      Recompute rc;
      int zero;
    } lays[] = {
        {1, 1, 1, 0, RECOMPUTE_NONE, 2},      {2, 1, 1, 1, RECOMPUTE_SELECTIVE, 2}, {1, 1, 1, 0, RECOMPUTE_NONE, 3},
        {2, 2, 1, 0, RECOMPUTE_FULL, 3},      {1, 1, 2, 0, RECOMPUTE_SELECTIVE, 3}, {1, 2, 1, 0, RECOMPUTE_NONE, 0},
    };
    for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
      SimLayout lay = {3, lays[i].tp, lays[i].pp, lays[i].cp, 1, lays[i].sp, lays[i].rc, micro, num_micro, lays[i].zero, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
      char what[200];
      snprintf(what, sizeof what, "%s dp=3 zero=%d tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64 " sp=%d recompute=%s", file,
               lays[i].zero, lays[i].tp, lays[i].pp, lays[i].cp, lays[i].sp, sem_recompute_name(lays[i].rc));
      failures += run_layout(m, &lay, 99, inputs, &ref, what);
    }
    sim_result_free(&ref);
    fprintf(stderr, "%s: %zu layouts with dp=3 compared, %d failed\n", file, sizeof lays / sizeof lays[0], failures);
  }
  for (int i = 0; i < m->model->ninputs; i++) free(inputs[i]);
  free(inputs);
  unload(&L);
  return failures;
}

/* A layout of the lists below. */
typedef struct {
  int64_t dp, tp, pp, vpp, cp, ep;
  int sp;
  Recompute rc;
  int zero;
} Lay;

/* A token model (file with defs) under each of lays against one rank, micro
 * 2, rows rows: with per_dp the reference runs dp x micro rows a micro-batch
 * (a model whose state moves by the data-parallel micro-batch: the
 * balancing bias), else micro rows; fold: expert parallelism folded over the
 * tensor group (SimLayout.ep_fold). */
static int run_list(const char *label, const char *file, const char *const *defs, int ndefs, int64_t rows, uint64_t seed,
                    const Lay *lays, size_t n, int per_dp, int64_t vocab, int fold) {
  Loaded L;
  SemModel *m = load(&L, file, defs, ndefs);
  if (!m) return 1;
  const int64_t micro = 2;
  double **inputs = make_inputs(m, rows, vocab, seed);
  int failures = 0;
  for (size_t i = 0; i < n; i++) {
    const Lay *y = &lays[i];
    int64_t rmicro = per_dp ? micro * y->dp : micro;
    SimLayout ref_layout = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, rmicro, rows / rmicro, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    /* the language's default vocab_pad: a vocabulary tensor does not divide is padded */
    SimLayout lay = {y->dp, y->tp, y->pp, y->cp, y->vpp, y->sp, y->rc, micro, rows / (micro * y->dp), y->zero,
                     y->vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B, y->ep, 0, 128, 0, fold, 0};
    SimResult ref;
    char err[512], what[220];
    snprintf(what, sizeof what, "%s dp=%" PRId64 " tp=%" PRId64 " sp=%d pp=%" PRId64 " v=%" PRId64 " cp=%" PRId64 " ep=%" PRId64
             " zero=%d recompute=%s", label, y->dp, y->tp, y->sp, y->pp, y->vpp, y->cp, y->ep, y->zero, sem_recompute_name(y->rc));
    if (sim_step(m, &ref_layout, seed, inputs, &ref, err, sizeof err)) {
      fprintf(stderr, "%s reference: %s\n", what, err);
      failures++;
      continue;
    }
    failures += run_layout(m, &lay, seed, inputs, &ref, what);
    sim_result_free(&ref);
  }
  fprintf(stderr, "%s: %zu layouts compared, %d failed\n", label, n, failures);
  for (int i = 0; i < m->model->ninputs; i++) free(inputs[i]);
  free(inputs);
  unload(&L);
  return failures;
}

/* Mixture of experts (samples/moe-tiny.hpd at capacity factor 1, so that
 * tokens are dropped, with the load-balancing loss): expert parallelism 1, 2
 * and 4 combined with data, tensor and pipeline parallelism, recompute and
 * ZeRO 1, 2 and 3;
 * the experts' slots travel by all-to-all and their gradients are summed over
 * the ranks holding the same experts. */
static int run_moe(void) {
  static const char *const defs[] = {"V=64", "T=8", "C=16", "L=2", "H=4", "KV=2", "E=4", "K=2", "F=16", "capacity_factor=1.0"};
  Loaded L;
  SemModel *m = load(&L, "samples/moe-tiny.hpd", defs, 10);
  if (!m) return 1;
  const int64_t micro = 2, rows = 8;
  double **inputs = make_inputs(m, rows, 64, 5);
  SimLayout ref_layout = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, micro, rows / micro, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
  SimResult ref;
  char err[512];
  int failures = 0;
  static const struct {
    int64_t dp, tp, pp, ep;
    Recompute rc;
    int zero;
  } lays[] = {
      {2, 1, 1, 1, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, RECOMPUTE_NONE, 0},      {1, 1, 2, 1, RECOMPUTE_NONE, 0},
      {2, 1, 1, 2, RECOMPUTE_NONE, 0}, {4, 1, 1, 2, RECOMPUTE_NONE, 1},      {4, 1, 1, 4, RECOMPUTE_NONE, 0},
      {2, 2, 1, 2, RECOMPUTE_NONE, 1}, {2, 1, 2, 2, RECOMPUTE_SELECTIVE, 0}, {2, 1, 1, 2, RECOMPUTE_FULL, 0},
      {2, 2, 2, 2, RECOMPUTE_NONE, 2}, {4, 2, 1, 4, RECOMPUTE_FULL, 1},      {2, 1, 1, 1, RECOMPUTE_NONE, 3},
      {4, 1, 1, 2, RECOMPUTE_SELECTIVE, 2}, {4, 1, 2, 4, RECOMPUTE_NONE, 2},
      {4, 1, 1, 2, RECOMPUTE_NONE, 3},      {2, 2, 1, 2, RECOMPUTE_FULL, 3},      {4, 1, 2, 4, RECOMPUTE_SELECTIVE, 3},
      {2, 2, 1, 2, RECOMPUTE_OPS, 1},       {4, 1, 2, 4, RECOMPUTE_OPS, 3},
  };
  if (sim_step(m, &ref_layout, 31, inputs, &ref, err, sizeof err)) {
    fprintf(stderr, "moe-tiny reference: %s\n", err);
    failures++;
  } else {
    for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
      SimLayout lay = {lays[i].dp, lays[i].tp, lays[i].pp, 1, 1, 0, lays[i].rc, micro, rows / (micro * lays[i].dp), lays[i].zero,
                       SCHED_1F1B, lays[i].ep, 0, 0, 0, 0, 0};
      char what[200];
      snprintf(what, sizeof what, "moe-tiny dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " ep=%" PRId64 " zero=%d recompute=%s",
               lays[i].dp, lays[i].tp, lays[i].pp, lays[i].ep, lays[i].zero, sem_recompute_name(lays[i].rc));
      failures += run_layout(m, &lay, 31, inputs, &ref, what);
    }
    sim_result_free(&ref);
    fprintf(stderr, "moe-tiny: %zu layouts (expert parallelism 1, 2, 4) compared, %d failed\n", sizeof lays / sizeof lays[0],
            failures);
  }
  for (int i = 0; i < m->model->ninputs; i++) free(inputs[i]);
  free(inputs);
  unload(&L);
  return failures;
}


/* moe-tiny's small sizes; the last define is the layer's kind (dropping at
 * capacity 1, or dropless) */
static const char *const moe_drop_defs[] = {"V=64", "T=8", "C=16", "L=2", "H=4", "KV=2", "E=4", "K=2", "F=16", "capacity_factor=1.0"};
static const char *const moe_dropless_defs[] = {"V=64", "T=8", "C=16", "L=2", "H=4", "KV=2", "E=4", "K=2", "F=16", "drop=false"};

/* Experts under context and sequence parallelism (unfolded: each expert
 * split over the tensor group): a capacity of 1, so that tokens drop, and
 * the dropless layer, each with expert parallelism beside context
 * parallelism, tensor parallelism with and without sequence parallelism,
 * and all four (a layout layout_sweep.py drew on 2026-12-05: dp 2 x ep 2 x
 * tp 2 x cp 2 with sequence parallelism). */
static int run_moe_cp(void) {
  /* {dp, tp, pp, vpp, cp, ep, sp, recompute, zero} */
  static const Lay lays[] = {{1, 1, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0}, {2, 1, 1, 1, 2, 2, 0, RECOMPUTE_NONE, 0},
                             {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_NONE, 0}, {2, 2, 1, 1, 1, 2, 1, RECOMPUTE_NONE, 0},
                             {1, 2, 1, 1, 2, 1, 1, RECOMPUTE_NONE, 0}, {2, 2, 1, 1, 2, 2, 0, RECOMPUTE_NONE, 0},
                             {2, 2, 1, 1, 2, 2, 1, RECOMPUTE_NONE, 0}, {2, 2, 1, 1, 2, 2, 1, RECOMPUTE_FULL, 1}};
  size_t n = sizeof lays / sizeof lays[0];
  return run_list("moe-tiny (drop) under cp and sp", "samples/moe-tiny.hpd", moe_drop_defs, 10, 8, 37, lays, n, 0, 64, 0) +
         run_list("moe-tiny (dropless) under cp and sp", "samples/moe-tiny.hpd", moe_dropless_defs, 10, 8, 37, lays, n, 0, 64, 0);
}

/* MoE parallel folding (SimLayout.ep_fold: the experts whole, the expert group
 * the tensor group times ep / tp data-parallel ranks, each tensor rank routing
 * its own chunk of the sequences; dropless, so the slots hold every token)
 * against one rank of the same dropless layer: data, tensor and pipeline
 * parallelism, sequence parallelism, ZeRO 1-3 and recomputation, and context
 * parallelism beside it. */
static int run_moe_folded(void) {
  static const Lay lays[] = {
      {1, 2, 1, 1, 1, 2, 0, RECOMPUTE_NONE, 0},      {1, 2, 1, 1, 1, 2, 1, RECOMPUTE_NONE, 0},
      {2, 2, 1, 1, 1, 4, 1, RECOMPUTE_NONE, 1},      {2, 2, 1, 1, 1, 2, 1, RECOMPUTE_SELECTIVE, 2},
      {2, 2, 1, 1, 1, 4, 0, RECOMPUTE_FULL, 3},      {2, 2, 1, 1, 1, 2, 1, RECOMPUTE_NONE, 3},
      {1, 2, 2, 1, 1, 2, 1, RECOMPUTE_NONE, 0},      {4, 2, 1, 1, 1, 4, 1, RECOMPUTE_OPS, 1},
      /* under context parallelism: each rank routes its piece of its context chunk (spmd.c, fold_cp) */
      {1, 2, 1, 1, 2, 2, 0, RECOMPUTE_NONE, 0},      {1, 2, 1, 1, 2, 2, 1, RECOMPUTE_NONE, 0},
      {2, 2, 1, 1, 2, 4, 1, RECOMPUTE_FULL, 1},      {2, 2, 1, 1, 2, 2, 1, RECOMPUTE_SELECTIVE, 3},
  };
  return run_list("moe-tiny folded (expert_tensor = 1)", "samples/moe-tiny.hpd", moe_dropless_defs, 10, 8, 37, lays,
                  sizeof lays / sizeof lays[0], 0, 64, 1);
}

/* Non-uniform layers: moe-tiny with 2 dense blocks before 3 MoE ones
 * (DeepSeek-V3's shape, two repeats), so the pipeline cuts the forward
 * into pieces (pipeline.h, by cuts), a piece per layer of either repeat,
 * and a chunk may end inside one; with tensor, expert and data
 * parallelism, ZeRO and an interleaved schedule. */
static int run_stacks(void) {
  static const char *const defs[] = {"V=64", "T=8", "C=16", "L=3", "H=4", "KV=2", "E=4", "K=2", "F=16", "capacity_factor=1.0",
                                     "D=2"};
  static const Lay lays[] = {
      {1, 1, 2, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 1, 3, 1, 1, 1, 0, RECOMPUTE_NONE, 0},      {1, 1, 4, 1, 1, 1, 0, RECOMPUTE_FULL, 0},
      {1, 1, 2, 2, 1, 1, 0, RECOMPUTE_NONE, 0}, {2, 1, 2, 1, 1, 2, 0, RECOMPUTE_SELECTIVE, 1}, {2, 2, 2, 1, 1, 1, 0, RECOMPUTE_NONE, 2},
      {2, 1, 3, 1, 1, 2, 0, RECOMPUTE_NONE, 3},
  };
  return run_list("moe-tiny with 2 dense blocks before 3 MoE ones", "samples/moe-tiny.hpd", defs, 11, 8, 13, lays,
                  sizeof lays / sizeof lays[0], 0, 64, 0);
}

/* DeepSeek-V3's routing (tests/moe/sigmoid-balance.hpd): sigmoid scores, a
 * routing bias moved after each micro-batch by the data-parallel
 * micro-batch's loads (balance_experts), scaled gates, a shared expert, a
 * dense block before the MoE ones; the biases route every later
 * micro-batch alike, which the gradients of the step show. */
static int run_sigmoid_balance(void) {
  static const Lay lays[] = {
      {2, 1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_NONE, 0},      {1, 1, 2, 1, 1, 1, 0, RECOMPUTE_FULL, 0},
      {2, 1, 1, 1, 1, 2, 0, RECOMPUTE_NONE, 1}, {1, 1, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0},      {2, 2, 2, 1, 1, 2, 0, RECOMPUTE_SELECTIVE, 2},
      {4, 1, 1, 1, 1, 4, 0, RECOMPUTE_NONE, 3},
  };
  return run_list("sigmoid-balance (DeepSeek-V3's routing)", "tests/moe/sigmoid-balance.hpd", NULL, 0, 16, 41, lays,
                  sizeof lays / sizeof lays[0], 1, 64, 0);
}

/* samples/deepseek-v3.hpd at a tiny size: multi-head latent attention
 * (slices, a shared RoPE key, a value width of its own), 2 dense blocks and
 * 2 DeepSeekMoE blocks (two repeats: a forward cut by pieces), sigmoid
 * routing with the balancing bias, node-limited (2 blocks of 2 experts, a
 * token's within its best). */
static int run_deepseek(void) {
  static const char *const defs[] = {"layers=4", "dense=2",    "hidden=16", "heads=4", "q_lora=12",    "kv_lora=8",
                                     "qk_nope=4", "qk_rope=4", "v_head_dim=6", "ffn=32", "moe_ffn=8", "experts=4",
                                     "top_k=2",  "seq=8",      "vocab=64",  "capacity_factor=2.0", "groups=2", "group_top_k=1"};
  static const Lay lays[] = {
      {2, 1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_SELECTIVE, 0},
      {1, 1, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0}, {1, 1, 2, 1, 1, 1, 0, RECOMPUTE_FULL, 0}, {1, 1, 4, 1, 1, 1, 0, RECOMPUTE_NONE, 0},
      {2, 1, 2, 1, 1, 2, 0, RECOMPUTE_NONE, 1}, {2, 2, 1, 1, 1, 2, 0, RECOMPUTE_FULL, 3},
  };
  /* folded (expert_tensor = 1): the shared expert, sigmoid routing and the balancing bias beside the folded experts */
  static const Lay folded[] = {
      {1, 2, 1, 1, 1, 2, 1, RECOMPUTE_NONE, 0}, {2, 2, 1, 1, 1, 4, 1, RECOMPUTE_FULL, 1}, {1, 2, 2, 1, 1, 2, 0, RECOMPUTE_NONE, 0},
  };
  return run_list("deepseek-v3 (tiny: MLA, dense then DeepSeekMoE blocks)", "samples/deepseek-v3.hpd", defs, 18, 8, 43, lays,
                  sizeof lays / sizeof lays[0], 1, 64, 0) +
         run_list("deepseek-v3 (tiny) folded", "samples/deepseek-v3.hpd", defs, 18, 8, 43, folded, sizeof folded / sizeof folded[0], 1,
                  64, 1);
}

/* samples/gpt-oss.hpd at a tiny size: attention sinks (o sigmoid(lse -
 * sink), lse's gradient through attention's backward), a sliding window
 * alternating with full attention (a pair of blocks repeated), attention
 * and expert biases, the clamped SwiGLU, the down biases weighted by the
 * gates. */
static int run_gpt_oss(void) {
  static const char *const defs[] = {"layers=4", "hidden=16", "heads=4", "kv_heads=2", "head_dim=4", "experts=4",
                                     "top_k=2",  "ffn=8",     "window=3", "seq=8",     "vocab=64"};
  static const Lay lays[] = {
      {2, 1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_SELECTIVE, 0},
      {1, 1, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0}, {1, 1, 2, 1, 1, 1, 0, RECOMPUTE_FULL, 0}, {2, 1, 1, 1, 1, 2, 0, RECOMPUTE_NONE, 1},
      {2, 2, 2, 1, 1, 2, 0, RECOMPUTE_NONE, 2},
  };
  /* folded (expert_tensor = 1): the expert biases, whole, beside the folded experts */
  static const Lay folded[] = {
      {1, 2, 1, 1, 1, 2, 0, RECOMPUTE_NONE, 0}, {2, 2, 1, 1, 1, 4, 1, RECOMPUTE_NONE, 3},
  };
  return run_list("gpt-oss (tiny: sinks, alternating windows, expert biases)", "samples/gpt-oss.hpd", defs, 11, 8, 47, lays,
                  sizeof lays / sizeof lays[0], 0, 64, 0) +
         run_list("gpt-oss (tiny) folded", "samples/gpt-oss.hpd", defs, 11, 8, 47, folded, sizeof folded / sizeof folded[0], 0, 64, 1);
}

/* Blocks that differ by their index (tests/models/per-layer.hpd, `repeat i
 * in L`): windows on every other block, QK-norm on the later ones; the
 * copies lowered one by one, so the pipeline cuts between any two. */
static int run_per_layer(void) {
  static const Lay lays[] = {
      {2, 1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 1}, {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_SELECTIVE, 0}, {1, 1, 2, 1, 1, 1, 0, RECOMPUTE_FULL, 0},
      {1, 1, 4, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 1, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0},      {2, 2, 2, 1, 1, 1, 0, RECOMPUTE_NONE, 3},
  };
  return run_list("per-layer (repeat i in L)", "tests/models/per-layer.hpd", NULL, 0, 8, 53, lays, sizeof lays / sizeof lays[0], 0, 64, 0);
}

/* A vocabulary that tensor does not divide (61 rows), padded to a multiple
 * of 128 x tensor (parallel.vocab_pad): 256 rows at tp 2, 512 at tp 4 (two
 * ranks hold padding only); the tied output layer's padded columns masked
 * before the cross-entropy, so every layout is the unpadded model's, with
 * the embedding's gradient compared on its 61 logical rows. */
static int run_padded_vocab(void) {
  static const char *const defs[] = {"V=61", "T=8", "C=16", "L=4", "H=4"};
  static const Lay lays[] = {
      {1, 2, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0}, {1, 4, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 0},      {1, 2, 1, 1, 1, 1, 1, RECOMPUTE_SELECTIVE, 0},
      {2, 2, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 1}, {1, 2, 2, 1, 1, 1, 0, RECOMPUTE_FULL, 0},      {2, 2, 2, 1, 1, 1, 0, RECOMPUTE_NONE, 3},
      {1, 2, 1, 1, 2, 1, 0, RECOMPUTE_NONE, 0}, {2, 4, 1, 1, 1, 1, 1, RECOMPUTE_NONE, 2},
  };
  return run_list("gpt2-tiny with 61 tokens (padded vocabulary)", "samples/gpt2-tiny.hpd", defs, 5, 8, 59, lays,
                  sizeof lays / sizeof lays[0], 0, 61, 0);
}

/* Images: input 0 uniform in [-1, 1) over [rows, C, H, W], input 1 labels in [0, classes). */
static double **make_images(const SemModel *m, int64_t rows, int64_t classes, uint64_t seed) {
  double **in = calloc(2, sizeof(double *));
  int64_t per = 1, d;
  for (int k = 1; k < 4; k++) per *= sym_is_const(m->model->inputs[0].type.dims[k], &d) ? d : 1;
  in[0] = malloc(sizeof(double) * (size_t)(rows * per));
  in[1] = malloc(sizeof(double) * (size_t)rows);
  uint64_t s = seed;
  for (int64_t k = 0; k < rows * per + rows; k++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    if (k < rows * per) in[0][k] = (double)(s >> 11) / 9007199254740992.0 * 2 - 1;
    else in[1][k - rows * per] = (double)((s >> 33) % (uint64_t)classes);
  }
  return in;
}

/* Convolutional networks (tests/vision/resnet-tiny.hpd, issue 17) under data
 * and pipeline parallelism, tensor parallelism of its classifier, recompute
 * and ZeRO. Batch norm synchronised over dp: every layout equals one rank
 * running the whole data-parallel micro-batch (micro x dp rows at a time);
 * per rank (sync = false, DDP's): equal to one rank fed the same per-rank
 * micro-batches in turn (micro rows at a time). */
static int run_vision(void) {
  int failures = 0;
  for (int sync = 1; sync >= 0; sync--) {
    const char *defs[] = {sync ? "sync=true" : "sync=false"};
    Loaded L;
    SemModel *m = load(&L, "tests/vision/resnet-tiny.hpd", defs, 1);
    if (!m) return 1;
    const int64_t micro = 2, rows = 16;
    double **inputs = make_images(m, rows, 5, 11);
    static const struct {
      int64_t dp, tp, pp;
      Recompute rc;
      int zero;
    } lays[] = {
        {2, 1, 1, RECOMPUTE_NONE, 0}, {4, 1, 1, RECOMPUTE_NONE, 1},      {1, 1, 2, RECOMPUTE_NONE, 0},
        {2, 1, 2, RECOMPUTE_FULL, 0}, {4, 1, 2, RECOMPUTE_SELECTIVE, 2}, {2, 2, 1, RECOMPUTE_NONE, 3},
        {2, 2, 2, RECOMPUTE_NONE, 1}, {1, 2, 1, RECOMPUTE_FULL, 0},
    };
    int runs = 0, before = failures;
    for (int64_t rdp = 1; rdp <= 4; rdp *= 2) {
      /* the reference for layouts of rdp data-parallel ranks */
      int64_t rmicro = sync ? micro * rdp : micro;
      SimLayout ref_layout = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, rmicro, rows / rmicro, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
      SimResult ref;
      char err[512];
      if (sim_step(m, &ref_layout, 77, inputs, &ref, err, sizeof err)) {
        fprintf(stderr, "resnet-tiny sync=%d reference: %s\n", sync, err);
        failures++;
        continue;
      }
      for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
        if (lays[i].dp != rdp) continue;
        SimLayout lay = {lays[i].dp, lays[i].tp, lays[i].pp, 1, 1, 0, lays[i].rc, micro, rows / (micro * lays[i].dp),
                         lays[i].zero, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
        char what[200];
        snprintf(what, sizeof what, "resnet-tiny sync=%d dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " zero=%d recompute=%s", sync,
                 lays[i].dp, lays[i].tp, lays[i].pp, lays[i].zero, sem_recompute_name(lays[i].rc));
        runs++;
        failures += run_layout(m, &lay, 77, inputs, &ref, what);
      }
      sim_result_free(&ref);
    }
    fprintf(stderr, "resnet-tiny sync=%d: %d layouts compared, %d failed\n", sync, runs, failures - before);
    /* the statistics differ: per-rank batch norm at dp = 2 is not one rank with the whole batch */
    if (sync == 0) {
      SimLayout whole = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, 2 * micro, rows / (2 * micro), 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
      SimLayout dp2 = {2, 1, 1, 1, 1, 0, RECOMPUTE_NONE, micro, rows / (2 * micro), 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
      SimResult a, b;
      char err[512];
      if (!sim_step(m, &whole, 77, inputs, &a, err, sizeof err) && !sim_step(m, &dp2, 77, inputs, &b, err, sizeof err)) {
        EXPECT(fabs(a.loss - b.loss) > 1e-6 * fabs(a.loss));
        sim_result_free(&a);
        sim_result_free(&b);
      } else {
        failures++;
      }
    }
    for (int i = 0; i < 2; i++) free(inputs[i]);
    free(inputs);
    unload(&L);
  }
  return failures;
}

/* samples/resnet18.hpd itself at width 4 (torchvision's ResNet-18 layer for
 * layer: the 7x7 stem and max pooling, four stages, the shortcut
 * projections), synchronised batch norm, at dp 2 and 4 with ZeRO, at tp 2
 * and at pp 2 and 4, against one rank with the dp-wide micro-batch. Its
 * stages repeat one block each, so a pipeline cuts its forward where one
 * activation crosses (between blocks, pipeline.h), not inside a repeat. */
static int run_resnet18(void) {
  static const char *const defs[] = {"width=4", "sync=true", "classes=5"};
  Loaded L;
  SemModel *m = load(&L, "samples/resnet18.hpd", defs, 3);
  if (!m) return 1;
  const int64_t micro = 1, rows = 8;
  double **inputs = make_images(m, rows, 5, 21);
  static const struct {
    int64_t dp, tp, pp;
    Recompute rc;
    int zero;
  } lays[] = {{2, 1, 1, RECOMPUTE_NONE, 0},      {2, 1, 1, RECOMPUTE_FULL, 3}, {4, 1, 1, RECOMPUTE_SELECTIVE, 1},
              {4, 2, 1, RECOMPUTE_NONE, 2},      {1, 1, 2, RECOMPUTE_NONE, 0}, {2, 1, 2, RECOMPUTE_FULL, 1},
              {4, 1, 2, RECOMPUTE_SELECTIVE, 2}, {1, 1, 4, RECOMPUTE_NONE, 0}, {2, 2, 2, RECOMPUTE_NONE, 3}};
  int failures = 0, runs = 0;
  for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
    SimLayout ref_layout = {1, 1, 1, 1, 1, 0, RECOMPUTE_NONE, micro * lays[i].dp, rows / (micro * lays[i].dp), 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    SimLayout lay = {lays[i].dp, lays[i].tp, lays[i].pp, 1, 1, 0, lays[i].rc, micro, rows / (micro * lays[i].dp), lays[i].zero,
                     SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    SimResult ref;
    char err[512], what[200];
    snprintf(what, sizeof what, "resnet18 (width 4) dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " zero=%d recompute=%s", lays[i].dp,
             lays[i].tp, lays[i].pp, lays[i].zero, sem_recompute_name(lays[i].rc));
    if (sim_step(m, &ref_layout, 5, inputs, &ref, err, sizeof err)) {
      fprintf(stderr, "%s reference: %s\n", what, err);
      failures++;
      continue;
    }
    runs++;
    failures += run_layout(m, &lay, 5, inputs, &ref, what);
    sim_result_free(&ref);
  }
  fprintf(stderr, "resnet18 (width 4, sync batch norm): %d layouts compared, %d failed\n", runs, failures);
  for (int i = 0; i < 2; i++) free(inputs[i]);
  free(inputs);
  unload(&L);
  return failures;
}

int main(int argc, char **argv) {
  /* test_layouts vision: only the convolutional network's layouts */
  if (argc > 1 && !strcmp(argv[1], "stacks")) {
    EXPECT(run_stacks() == 0);
    EXPECT(run_sigmoid_balance() == 0);
    EXPECT(run_deepseek() == 0);
    EXPECT(run_gpt_oss() == 0);
    EXPECT(run_per_layer() == 0);
    EXPECT(run_padded_vocab() == 0);
    TEST_DONE();
  }
  if (argc > 1 && !strcmp(argv[1], "moe_cp")) {
    EXPECT(run_moe_cp() == 0);
    TEST_DONE();
  }
  if (argc > 1 && !strcmp(argv[1], "vision")) {
    EXPECT(run_vision() == 0);
    EXPECT(run_resnet18() == 0);
    TEST_DONE();
  }
  static const char *const gpt2[] = {"V=64", "T=8", "C=16", "L=8", "H=4"};
  EXPECT(run_matrix("samples/gpt2-tiny.hpd", gpt2, 5, 64, 8, 4, 8, 0) == 0);
  static const char *const gpt2_uneven[] = {"V=64", "T=8", "C=16", "L=5", "H=4"};
  EXPECT(run_matrix("samples/gpt2-tiny.hpd", gpt2_uneven, 5, 64, 5, 2, 8, 1) == 0);
  static const char *const llama[] = {"layers=4", "hidden=16", "heads=4", "kv_heads=2", "ffn=32", "seq=8", "vocab=64"};
  EXPECT(run_matrix("samples/llama.hpd", llama, 7, 64, 4, 2, 8, 0) == 0);
  EXPECT(run_dp3("samples/gpt2-tiny.hpd", gpt2, 5, 64) == 0);
  EXPECT(run_dp3("samples/llama.hpd", llama, 7, 64) == 0);
  /* Qwen3's attention: a head width other than C / H, RMSNorm of queries and keys,
   * grouped queries, and a sliding window of 3 keys (across the ring under cp) */
  static const char *const qwen3[] = {"layers=2", "hidden=16", "heads=4", "kv_heads=2", "head_dim=8",
                                      "ffn=32",   "seq=8",     "vocab=64", "window=3"};
  EXPECT(run_matrix("samples/qwen3.hpd", qwen3, 9, 64, 2, 2, 8, 0) == 0);
  EXPECT(run_moe() == 0);
  EXPECT(run_moe_folded() == 0);
  EXPECT(run_moe_cp() == 0);
  EXPECT(run_stacks() == 0);
  EXPECT(run_sigmoid_balance() == 0);
  EXPECT(run_deepseek() == 0);
  EXPECT(run_gpt_oss() == 0);
  EXPECT(run_per_layer() == 0);
  EXPECT(run_padded_vocab() == 0);
  EXPECT(run_vision() == 0);
  EXPECT(run_resnet18() == 0);
  TEST_DONE();
}
