/* test_memplan.c - the static memory plan (memplan.h).
 *
 * The key test: the reference executor (interp) runs a rank's training step
 * with its allocation accounting on (interp.h, InterpAccount), and a meter
 * here measures the peak of live bytes from those events: which value is
 * allocated when, and when the executor drops it (after its last use), per
 * graph run, with call nesting and SAVE stashes as they happen. The meter
 * counts views and in-place reuse by the rule of memplan.h (a RESHAPE
 * shares its input's buffer; an elementwise op takes over the first
 * operand's buffer that dies with it, same size), deciding in-place from
 * what the executor actually released, not from the plan's liveness. The
 * plan's peak must equal the measured one, in bytes of the IR's dtypes
 * (the executor computes in fp64, but the accounting is in the program's
 * element sizes, so bytes compare exactly).
 *
 * Cases: samples/mlp.hpd, and gpt2-tiny and llama at tiny sizes under each
 * recompute policy, on one rank and on partitioned ranks (tensor parallel
 * with sequence parallelism, pipeline chunks); the collectives of a
 * partitioned rank go to a stand-in that keeps the sizes right (the values
 * do not matter to memory). Also: stash sizes shrink with recompute
 * (full < selective < none), mem_check passes for the plans with and
 * without fusion, and hand-built graphs pin the view and in-place rules.
 * Fusion is not asserted to save memory: a kernel that sums several
 * GEMM results (a layernorm backward reading the q, k and v input
 * gradients) keeps them all live where the unfused adds free them one by
 * one, so the fused peak can be the higher one; the numbers are printed. */
#include "memplan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "fuse.h"
#include "interp.h"
#include "loader.h"
#include "sema.h"
#include "sim.h"
#include "test_model.h"
#include "test_util.h"

/* ---- the meter: the executor's peak in the plan's model ---- */

enum { MAX_DEPTH = 16 };

typedef struct {
  const IrGraph *g;
  int gi;
  int *buf;       /* per node: the node whose buffer it uses, -1 external */
  int *refs;      /* per owning node: values that hold its buffer */
  int *released;  /* values dropped since `pending` was allocated */
  int nreleased;
  int pending;    /* an elementwise node whose buffer waits for its dying inputs, or -1 */
} Frame;

typedef struct {
  const IrModule *m;
  Frame f[MAX_DEPTH];
  int depth;
  int64_t live, peak;
  int errors;
} Meter;

static void meter_peak(Meter *M) {
  if (M->live > M->peak) M->peak = M->live;
}

static void own(Meter *M, Frame *F, int node) {
  F->buf[node] = node;
  F->refs[node] = 1;
  M->live += ir_bytes(&F->g->nodes[node]);
  meter_peak(M);
}

static void drop(Meter *M, Frame *F, int node) {
  int b = F->buf[node];
  F->buf[node] = -1;
  if (b >= 0 && --F->refs[b] == 0) M->live -= ir_bytes(&F->g->nodes[b]);
}

/* The elementwise node waiting in F: it takes over the buffer of its first
 * operand that the executor released at it, when no other value holds that
 * buffer any more and the sizes agree; else a buffer of its own. */
static void settle(Meter *M, Frame *F) {
  if (F->pending < 0) return;
  int i = F->pending, chosen = -1;
  F->pending = -1;
  const IrNode *n = &F->g->nodes[i];
  for (int k = 0; k < n->nin && chosen < 0; k++) {
    int x = n->in[k], b = F->buf[x], was_released = 0, holders = 0;
    if (b < 0) continue;
    for (int r = 0; r < F->nreleased; r++) {
      was_released |= F->released[r] == x;
      holders += F->released[r] != i && F->buf[F->released[r]] == b;
    }
    if (was_released && holders == F->refs[b] && mem_inplace_ok(F->g, i, k)) chosen = b;
  }
  if (chosen >= 0) {
    F->buf[i] = chosen;
    F->refs[chosen]++;
    meter_peak(M);
  } else {
    own(M, F, i);
  }
  for (int r = 0; r < F->nreleased; r++) drop(M, F, F->released[r]);
  F->nreleased = 0;
}

static void ev_run(void *user, int graph, int64_t layer, int begin) {
  Meter *M = user;
  (void)layer;
  if (M->depth > 0) settle(M, &M->f[M->depth - 1]);
  if (begin) {
    if (M->depth == MAX_DEPTH) {
      M->errors++;
      return;
    }
    Frame *F = &M->f[M->depth++];
    const IrGraph *g = M->m->graphs[graph];
    F->g = g;
    F->gi = graph;
    F->buf = malloc(sizeof(int) * (size_t)(g->nnodes + 1));
    F->refs = calloc((size_t)g->nnodes + 1, sizeof(int));
    F->released = malloc(sizeof(int) * (size_t)(g->nnodes + 1));
    for (int i = 0; i < g->nnodes; i++) F->buf[i] = -1;
    F->nreleased = 0;
    F->pending = -1;
  } else {
    Frame *F = &M->f[--M->depth];
    if (F->gi != graph) M->errors++;
    for (int i = 0; i < F->g->nnodes; i++)
      if (F->refs[i] > 0) M->live -= ir_bytes(&F->g->nodes[i]);
    free(F->buf);
    free(F->refs);
    free(F->released);
  }
}

static void ev_value(void *user, int graph, int node, int alive) {
  Meter *M = user;
  if (M->depth < 1 || M->f[M->depth - 1].gi != graph) {
    M->errors++;
    return;
  }
  Frame *F = &M->f[M->depth - 1];
  const IrNode *n = &F->g->nodes[node];
  if (!alive) {
    if (F->pending >= 0) F->released[F->nreleased++] = node;
    else drop(M, F, node);
    return;
  }
  settle(M, F);
  if (n->op == IR_PARAM || n->op == IR_INPUT || n->op == IR_ARG) return; /* storage outside the run */
  if (n->op == IR_RESHAPE) {                                             /* a view */
    int b = F->buf[n->in[0]];
    F->buf[node] = b;
    if (b >= 0) F->refs[b]++;
  } else if (ir_op_flags(n->op) & IRF_ELEMENTWISE) {
    F->pending = node;
    F->nreleased = 0;
  } else {
    own(M, F, node);
  }
}

static void ev_stash(void *user, int graph, int node, int64_t bytes, int alive) {
  Meter *M = user;
  (void)graph;
  (void)node;
  if (M->depth > 0) settle(M, &M->f[M->depth - 1]);
  M->live += alive ? bytes : -bytes;
  meter_peak(M);
}

/* ---- a stand-in for the other ranks: right sizes, any values ---- */

typedef struct {
  int size[IRG_COUNT];
} Fake;

static const char *fake_all_reduce(void *ctx, IrGroup g, int op, double *data, int64_t n) {
  (void)ctx, (void)g, (void)op, (void)data, (void)n;
  return NULL;
}
static const char *fake_all_gather(void *ctx, IrGroup g, const double *in, int64_t n, double *out) {
  const Fake *f = ctx;
  for (int k = 0; k < f->size[g]; k++) memcpy(out + k * n, in, sizeof(double) * (size_t)n);
  return NULL;
}
static const char *fake_send(void *ctx, IrGroup g, int offset, const double *data, int64_t n) {
  (void)ctx, (void)g, (void)offset, (void)data, (void)n;
  return NULL;
}
static const char *fake_recv(void *ctx, IrGroup g, int offset, double *data, int64_t n) {
  (void)ctx, (void)g, (void)offset;
  memset(data, 0, sizeof(double) * (size_t)n);
  return NULL;
}

/* ---- loading a sample at a size ---- */


/* ---- the comparison ---- */

typedef struct {
  int64_t peak, arena, stash, fused_peak, measured;
} Numbers;

/* Plans chunk `chunk` of the layout and runs its step on the executor with
 * the meter; the two peaks must agree. */
static int compare(const SemModel *model, const SimLayout *L, int chunk, int64_t modulus, const char *what,
                   Numbers *out) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  int fails = test_failures;
  const char *why = NULL;
  SimRankProgram *rp = sim_rank_program(arena, diag, model, L, chunk, NULL, &why);
  if (!rp) {
    fprintf(stderr, "%s: %s\n", what, why);
    EXPECT(rp != NULL);
    diag_free(diag);
    arena_free(arena);
    return 1;
  }
  MemOptions mo;
  mem_options_from_model(model, &mo);
  mo.entry = rp->ad->step;
  mo.fusion = fuse_module(arena, rp->module);
  int fuse_bad = fuse_check(mo.fusion, NULL); /* fuse.c's own tests own that; plan without it then */
  if (fuse_bad) mo.fusion = NULL;
  MemPlan *plan = mem_plan_module(arena, rp->module, &mo);
  EXPECT(plan != NULL);
  if (!plan) {
    fprintf(stderr, "%s: no plan\n", what);
    diag_free(diag);
    arena_free(arena);
    return 1;
  }
  EXPECT(mem_check(plan, stderr) == 0);
  EXPECT(plan->arena >= plan->peak);
  EXPECT(plan->total == plan->params + plan->grads + plan->optimizer + plan->inputs + plan->arena);

  /* the executor */
  const IrModule *m = rp->module;
  Interp *in = interp_new(m);
  Fake fake;
  InterpComm comm;
  memset(&comm, 0, sizeof comm);
  for (int g = 0; g < IRG_COUNT; g++) comm.size[g] = fake.size[g] = 1;
  comm.size[IRG_TP] = fake.size[IRG_TP] = (int)L->tp;
  comm.size[IRG_CP] = fake.size[IRG_CP] = (int)L->cp;
  comm.size[IRG_PP] = fake.size[IRG_PP] = rp->nchunks;
  comm.rank[IRG_PP] = chunk;
  comm.ctx = &fake;
  comm.all_reduce = fake_all_reduce;
  comm.all_gather = fake_all_gather;
  comm.send = fake_send;
  comm.recv = fake_recv;
  interp_set_comm(in, &comm);
  interp_init_params(in, 7);
  for (int i = 0; i < m->ninputs; i++) {
    int64_t n = 1;
    for (int k = 0; k < m->inputs[i].rank; k++) n *= m->inputs[i].dims[k];
    double *data = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) data[k] = (double)((k * 7919 + 13 * i) % modulus);
    interp_set_input(in, i, data);
    free(data);
  }
  Meter meter;
  memset(&meter, 0, sizeof meter);
  meter.m = m;
  InterpAccount acc = {&meter, ev_run, ev_value, ev_stash};
  interp_set_account(in, &acc);
  const char *err = NULL;
  double loss = ad_step(in, rp->ad, 1.0, &err);
  if (err) fprintf(stderr, "%s: the executor failed: %s\n", what, err);
  EXPECT(err == NULL);
  (void)loss;
  EXPECT(meter.errors == 0);
  EXPECT(meter.depth == 0);
  EXPECT(meter.live == 0);
  if (meter.peak != plan->peak) {
    fprintf(stderr, "%s: the plan's peak %" PRId64 " != the executor's %" PRId64 "\n", what, plan->peak,
            meter.peak);
    test_failures++;
  }
  printf("%-58s peak %8" PRId64 " (executor %8" PRId64 ")  arena %8" PRId64 "  stash %7" PRId64
         "  fused peak %8" PRId64 "%s\n",
         what, plan->peak, meter.peak, plan->arena, plan->stash, plan->fused_peak,
         fuse_bad ? " (fuse_check fails)" : "");
  if (out) {
    out->peak = plan->peak;
    out->arena = plan->arena;
    out->stash = plan->stash;
    out->fused_peak = plan->fused_peak;
    out->measured = meter.peak;
  }
  interp_free(in);
  diag_free(diag);
  arena_free(arena);
  return test_failures != fails;
}

static const Recompute policies[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_OPS};

static void test_mlp(void) {
  Loaded L;
  SemModel *m = load(&L, "samples/mlp.hpd", NULL, 0);
  if (!m) return;
  for (int p = 0; p < 3; p++) {
    SimLayout lay = {1, 1, 1, 1, 1, 0, policies[p], 4, 1, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    char what[128];
    snprintf(what, sizeof what, "mlp recompute=%s", sem_recompute_name(policies[p]));
    compare(m, &lay, 0, 10, what, NULL);
  }
  SimLayout tp2 = {1, 2, 1, 1, 1, 0, RECOMPUTE_NONE, 4, 1, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
  compare(m, &tp2, 0, 10, "mlp tp=2", NULL);
  unload(&L);
}

/* One rank, then partitioned ranks, per policy; the stash must shrink with
 * recomputation on one rank. */
static void test_transformer(const char *file, const char *name, const char *const *defs, int ndefs,
                             int64_t modulus) {
  Loaded L;
  SemModel *m = load(&L, file, defs, ndefs);
  if (!m) return;
  Numbers one[4];
  for (int p = 0; p < 4; p++) {
    char what[160];
    SimLayout lay = {1, 1, 1, 1, 1, 0, policies[p], 2, 1, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
    snprintf(what, sizeof what, "%s recompute=%s", name, sem_recompute_name(policies[p]));
    compare(m, &lay, 0, modulus, what, &one[p]);
    static const struct {
      int64_t tp, pp, vpp, cp;
      int sp, chunk;
    } layouts[] = {{2, 1, 1, 1, 1, 0}, {1, 2, 1, 1, 0, 0}, {1, 2, 1, 1, 0, 1}, {2, 2, 2, 1, 0, 3}, {1, 1, 1, 2, 0, 0}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
      SimLayout pl = {1, layouts[k].tp, layouts[k].pp, layouts[k].cp, layouts[k].vpp, layouts[k].sp, policies[p], 2, 1, 0, SCHED_1F1B, 1, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "%s recompute=%s tp=%" PRId64 " sp=%d pp=%" PRId64 "x%" PRId64 " cp=%" PRId64
               " chunk %d", name, sem_recompute_name(policies[p]), pl.tp, pl.sp, pl.pp, pl.vpp, pl.cp,
               layouts[k].chunk);
      compare(m, &pl, layouts[k].chunk, modulus, what, NULL);
    }
  }
  /* recomputation trades stash for work: full keeps only the block inputs;
   * selective drops the attention's scores, which flash attention never
   * stores (so there it keeps what no recomputation keeps), and which the
   * materialised chain does; ops keeps every other weight GEMM's output
   * and the attention's, more than full and less than none */
  EXPECT(one[2].stash < one[1].stash);
  EXPECT(one[1].stash <= one[0].stash);
  EXPECT(one[2].stash < one[3].stash);
  EXPECT(one[3].stash < one[0].stash);
  Numbers mat[2];
  for (int p = 0; p < 2; p++) {
    char what[160];
    SimLayout lay = {1, 1, 1, 1, 1, 0, policies[p], 2, 1, 0, SCHED_1F1B, 1, 1, 0, 0, 0, 0};
    snprintf(what, sizeof what, "%s recompute=%s attention materialized", name, sem_recompute_name(policies[p]));
    compare(m, &lay, 0, modulus, what, &mat[p]);
  }
  EXPECT(mat[1].stash < mat[0].stash);
  EXPECT(one[0].stash < mat[0].stash);
  EXPECT(one[2].peak <= one[1].peak);
  EXPECT(one[1].peak <= one[0].peak);
  unload(&L);
}

/* ---- the rules on hand-built graphs ---- */

static int arg(IrGraph *g, int rank, const int64_t *dims) {
  int64_t a = g->nargs++;
  return ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, DT_F32, rank, dims, NULL);
}
static int op1(IrGraph *g, IrOp op, int x) { return ir_add(g, op, &x, 1, NULL, 0, 0, DT_F32, -1, NULL, NULL); }
static int op2(IrGraph *g, IrOp op, int a, int b) {
  int in[2] = {a, b};
  return ir_add(g, op, in, 2, NULL, 0, 0, DT_F32, -1, NULL, NULL);
}

static void test_rules(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  IrGraph *g = ir_graph_new(m, "forward");
  int64_t d2[2] = {4, 8}, d1[1] = {32}, dr[1] = {8};
  int x = arg(g, 2, d2);                                                      /* %0 external */
  int bias = arg(g, 1, dr);                                                   /* %1 external */
  int a = op1(g, IR_EXP, x);                                                  /* %2 own: x is not ours */
  int r = ir_add(g, IR_RESHAPE, &a, 1, NULL, 0, 0, DT_F32, 1, d1, NULL);      /* %3 view of %2 */
  int c = op1(g, IR_NEG, r);                                                  /* %4 in place of %3 */
  int e = op1(g, IR_EXP, c);                                                  /* %5 in place of %4 */
  int f = op1(g, IR_TANH, e);                                                 /* %6 own: %5 read later */
  int s = op2(g, IR_ADD, e, f);                                               /* %7 in place of %5 */
  int rr = ir_add(g, IR_RESHAPE, &s, 1, NULL, 0, 0, DT_F32, 2, d2, NULL);     /* %8 view of %7 */
  int t = op2(g, IR_ADD, bias, rr);                                           /* %9 in place of %8 */
  int u = op1(g, IR_SQUARE, t);                                               /* %10 own: %9 is an output */
  int outs[2] = {t, u};
  g->outputs = outs;
  g->noutputs = 2;
  EXPECT(ir_verify(m, stderr) == 0);
  MemPlan *p = mem_plan_module(arena, m, NULL);
  EXPECT(p != NULL);
  if (!p) {
    arena_free(arena);
    return;
  }
  const MemGraph *mg = &p->graphs[0];
  EXPECT(mg->values[x].kind == MEM_EXTERNAL && mg->values[bias].kind == MEM_EXTERNAL);
  EXPECT(mg->values[a].kind == MEM_OWN);
  EXPECT(mg->values[r].kind == MEM_VIEW && mg->values[r].of == a);
  EXPECT(mg->values[c].kind == MEM_INPLACE && mg->values[c].of == r);
  EXPECT(mg->values[e].kind == MEM_INPLACE && mg->values[e].of == c);
  EXPECT(mg->values[f].kind == MEM_OWN);
  EXPECT(mg->values[s].kind == MEM_INPLACE && mg->values[s].of == e);
  EXPECT(mg->values[rr].kind == MEM_VIEW && mg->values[rr].of == s);
  EXPECT(mg->values[t].kind == MEM_INPLACE && mg->values[t].of == rr); /* the bias (operand 0) is external */
  EXPECT(mg->values[u].kind == MEM_OWN);
  /* two buffers of 128 bytes live together at most (a's chain and f, then the chain and u) */
  EXPECT(mg->nbufs == 3);
  EXPECT(mg->peak == 256);
  EXPECT(mg->arena == 256);
  EXPECT(mg->values[a].buf == mg->values[t].buf);
  EXPECT(mg->bufs[mg->values[t].buf].last == g->nnodes); /* an output: to the return */
  EXPECT(mem_check(p, stderr) == 0);
  EXPECT(mem_inplace_ok(g, t, 1) && !mem_inplace_ok(g, t, 0)); /* a broadcast operand is never reused */

  /* a value read later blocks reuse even when another operand dies */
  MemValue keep = mg->values[f];
  EXPECT(keep.last == s);

  /* a corrupted plan fails the check: two live buffers at one offset */
  MemGraph *bad = &p->graphs[0];
  int64_t off = bad->bufs[mg->values[f].buf].offset;
  bad->bufs[mg->values[f].buf].offset = bad->bufs[mg->values[a].buf].offset;
  EXPECT(mem_check(p, NULL) > 0);
  bad->bufs[mg->values[f].buf].offset = off;
  EXPECT(mem_check(p, NULL) == 0);
  arena_free(arena);
}

/* The CUDA back end's cross-entropy with its backward (fuse.c's ce_pair)
 * writes the logits' gradient in the logits' place where they die there;
 * the CPU back end's two kernels keep two buffers; logits read after the
 * pair keep theirs. */
static void test_ce_inplace(void) {
  for (int later = 0; later < 2; later++) {
    Arena *arena = arena_new();
    IrModule *m = ir_module_new(arena);
    IrGraph *g = ir_graph_new(m, "forward");
    int64_t dx[2] = {8, 40}, dt[1] = {8}, none[1] = {0};
    int seed = arg(g, 0, none), x = arg(g, 2, dx);
    int64_t a = g->nargs++;
    int t = ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, DT_I32, 1, dt, NULL);
    int logits = op1(g, IR_EXP, x);
    int in[3] = {logits, t, seed};
    int loss = ir_add(g, IR_CROSS_ENTROPY, in, 2, NULL, 0, 0, DT_F32, -1, NULL, NULL);
    int grad = ir_add(g, IR_CROSS_ENTROPY_BWD, in, 3, NULL, 0, 0, DT_F32, -1, NULL, NULL);
    int after = later ? op2(g, IR_ADD, logits, grad) : grad; /* logits read after the pair */
    int outs[3] = {loss, grad, after};
    g->outputs = outs;
    g->noutputs = later ? 3 : 2;
    EXPECT(ir_verify(m, stderr) == 0);
    MemOptions mo;
    memset(&mo, 0, sizeof mo);
    int64_t arena_of[2] = {0, 0};
    for (int cuda = 0; cuda < 2; cuda++) {
      mo.fusion = cuda ? fuse_module_opts(arena, m, &FUSE_CUDA_OPTIONS) : fuse_module(arena, m);
      MemPlan *p = mem_plan_module(arena, m, &mo);
      EXPECT(p != NULL && p->fused != NULL);
      if (!p || !p->fused) continue;
      EXPECT(mem_check(p, stderr) == 0);
      const MemValue *v = &p->fused[0].values[grad];
      int inplace = cuda && !later;
      EXPECT((v->kind == MEM_INPLACE && v->of == logits) == inplace);
      arena_of[cuda] = p->fused[0].arena;
    }
    if (!later) EXPECT(arena_of[1] + 8 * 40 * 4 <= arena_of[0]); /* one [8, 40] buffer fewer */
    arena_free(arena);
  }
}

/* Alignment pads each buffer; the arena is a multiple of it. */
static void test_align(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  IrGraph *g = ir_graph_new(m, "forward");
  int64_t d[1] = {3};
  int x = arg(g, 1, d);
  int a = op1(g, IR_EXP, x), b = op1(g, IR_TANH, x), c = op2(g, IR_MUL, a, b);
  int outs[2] = {c, a};
  g->outputs = outs;
  g->noutputs = 2;
  MemOptions o;
  memset(&o, 0, sizeof o);
  o.align = 256;
  MemPlan *p = mem_plan_module(arena, m, &o);
  EXPECT(p != NULL);
  if (p) {
    EXPECT(p->graphs[0].values[c].kind == MEM_INPLACE && p->graphs[0].values[c].of == b);
    EXPECT(p->graphs[0].peak == 24);
    EXPECT(p->graphs[0].arena == 512);
    EXPECT(mem_check(p, stderr) == 0);
  }
  arena_free(arena);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0); /* results and complaints interleave in order */
  test_rules();
  test_ce_inplace();
  test_align();
  test_mlp();
  static const char *const gpt2[] = {"V=64", "T=8", "C=16", "L=4", "H=4"};
  test_transformer("samples/gpt2-tiny.hpd", "gpt2-tiny", gpt2, 5, 64);
  /* seq 32: in bf16 a head's scores (T x T, 2 bytes) must outweigh flash attention's fp32
   * packed output (T x (Dv + 1), 4 bytes) for the stash comparison above; at seq 8 they
   * did only while the materialised chain also saved fp32 copies of its GEMMs' operands */
  static const char *const llama[] = {"layers=4", "hidden=16", "heads=4", "kv_heads=2", "ffn=32", "seq=32", "vocab=64"};
  test_transformer("samples/llama.hpd", "llama", llama, 7, 64);
  TEST_DONE();
}
