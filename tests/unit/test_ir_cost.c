/* test_ir_cost.c - the IR's cost rules: per-op FLOPs and bytes on hand-built
 * graphs, and whole models against published formulas:
 *   - GPT (samples/gpt.hpd) at the sizes of Narayanan et al. 2021, Table 1:
 *     GEMM FLOPs of one forward pass against the paper's Appendix;
 *   - GPT-2 small's 124,439,808 parameters. */
#include "ir_cost.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "lower.h"
#include "sema.h"
#include "test_sample.h"
#include "test_util.h"

/* Lowers samples/<name> as `hpdlc emit ir` does (compiler/driver/main.c), with -D
 * defines and the given micro batch (<= 0: the train block's). */
/* ---- whole models ---- */

/* Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on
 * GPU Clusters Using Megatron-LM", SC'21), Appendix "Floating-Point
 * Operations", counting only the GEMMs:
 *   a transformer layer's forward pass is 24 B s h^2 + 4 B s^2 h FLOPs
 *   (QKV 6Bsh^2, attention scores QK^T 2Bs^2h, attention over values
 *   2Bs^2h, output projection 2Bsh^2, MLP h->4h->h 16Bsh^2);
 *   the logit layer's forward pass is 2 B s h V;
 *   backward = 2x forward; activation recomputation adds a forward of the
 *   layers (not of the logit layer). Hence their Eq. 3, per iteration:
 *     F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
 *       = 4 x l (24Bsh^2 + 4Bs^2h) + 3 x 2BshV.
 * A forward pass is therefore 24 B s l h^2 (1 + s/(6h)) + 2 B s h V. Taking
 * Eq. 3 / 4 = 24 B s l h^2 (1 + s/(6h) + V/(16 l h)) as "the forward" counts
 * the logits as 1.5 BshV (they are not recomputed, so the /4 undercounts
 * them): that form is short of the true forward by exactly 0.5 B s h V,
 * 1.6% for the 1.7B row, 1.0% for 3.6B, under 0.3% from the 39.1B row on
 * and under 0.2% from the 76.1B row on. */
typedef struct {
  const char *name;
  const char *layers, *hidden, *heads;
  double paper_params; /* Table 1, billions */
} GptRow;

static void test_gpt_forward_flops(void) {
  static const GptRow rows[] = {
      {"1.7B", "24", "2304", "24", 1.7},       {"3.6B", "30", "3072", "32", 3.6},
      {"7.5B", "36", "4096", "32", 7.5},       {"18.4B", "40", "6144", "48", 18.4},
      {"39.1B", "48", "8192", "64", 39.1},     {"76.1B", "60", "10240", "80", 76.1},
      {"145.6B", "80", "12288", "96", 145.6},  {"310.1B", "96", "16384", "128", 310.1},
      {"529.6B", "105", "20480", "128", 529.6}, {"1008B", "128", "25600", "160", 1008.0},
  };
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    Arena *arena = arena_new();
    Diag *diag = diag_new(stderr);
    SemDefine defs[] = {{"layers", rows[r].layers, NULL}, {"hidden", rows[r].hidden, NULL},
                        {"heads", rows[r].heads, NULL},   {"seq", "2048", NULL},
                        {"vocab", "51200", NULL}};
    /* Megatron-LM 2021 stored the scores: the materialised chain */
    LowerOptions lo = {0, 1, 0};
    IrModule *m = lower_sample_with(arena, diag, "gpt.hpd", defs, 5, NULL, 0, 1, NULL, &lo);
    EXPECT(m != NULL);
    /* flash attention computes the causal half of the pairs, s (s + 1) / 2
     * per head, each with 2 h / a + 2 h / a FLOPs of products and 4 of the
     * exponential, mask and running statistics (ir_cost.c) */
    IrModule *mf = lower_sample(arena, diag, "gpt.hpd", defs, 5, 1, NULL);
    EXPECT(mf != NULL);
    if (mf) {
      double B = 1, s = 2048, V = 51200, l = atof(rows[r].layers), h = atof(rows[r].hidden), a = atof(rows[r].heads);
      IrCost c = ircost_graph(mf, mf->graphs[0]);
      double pairs = s * (s + 1) / 2;
      EXPECT_NEAR(c.flops_of[IRC_GEMM], l * (24 * B * s * h * h + B * pairs * (4 * h + 4 * a)) + 2 * B * s * h * V, 1e-12);
    }
    if (m) {
      double B = 1, s = 2048, V = 51200, l = atof(rows[r].layers), h = atof(rows[r].hidden);
      IrCost c = ircost_graph(m, m->graphs[0]);
      double gemm = c.flops_of[IRC_GEMM];
      double layer_fwd = 24 * B * s * h * h + 4 * B * s * s * h;
      double logits_fwd = 2 * B * s * h * V;
      double forward = l * layer_fwd + logits_fwd;
      /* term by term, exactly (all counts are integers below 2^53) */
      EXPECT_NEAR(gemm, forward, 1e-12);
      EXPECT_NEAR(gemm, 24 * B * s * l * h * h * (1 + s / (6 * h)) + 2 * B * s * h * V, 1e-12);
      /* Eq. 3 rebuilt from our forward: 4x the layers (fwd, 2x bwd, recompute), 3x the logits */
      double eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
      EXPECT_NEAR(4 * (gemm - logits_fwd) + 3 * logits_fwd, eq3, 1e-12);
      /* Eq. 3 / 4 misses exactly half the logit layer's forward */
      EXPECT_NEAR(gemm - eq3 / 4, 0.5 * B * s * h * V, 1e-9);
      EXPECT((gemm - eq3 / 4) / gemm < 0.017);
      if (l >= 48) EXPECT((gemm - eq3 / 4) / gemm < 0.003);
      if (l >= 60) EXPECT((gemm - eq3 / 4) / gemm < 0.002);
      /* The parameters: 12 l h^2 + 13 l h + (V + s) h (the paper's
       * P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))) + 2h for the final
       * layernorm the paper leaves out; Table 1 rounds (1.65B is its "1.7B"). */
      double params = (double)ircost_param_count(m);
      EXPECT_NEAR(params, 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h, 0);
      EXPECT_NEAR(params / 1e9, rows[r].paper_params, 0.03);
      /* class sums add up */
      double sum = 0;
      for (int k = 0; k < IRC_NCLASSES; k++) sum += c.flops_of[k];
      EXPECT_NEAR(sum, c.flops, 1e-12);
      printf("GPT %-7s forward GEMM FLOPs %.6e; Eq.3/4 %.6e (%.2f%% lower); all FLOPs %.6e; params %.4e\n",
             rows[r].name, gemm, eq3 / 4, 100 * (gemm - eq3 / 4) / gemm, c.flops, params);
    }
    diag_free(diag);
    arena_free(arena);
  }
}

static void test_gpt2_params(void) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  SemModel *sm = NULL;
  IrModule *m = lower_sample(arena, diag, "gpt2.hpd", NULL, 0, 1, &sm);
  EXPECT(m != NULL);
  if (m) {
    /* OpenAI's GPT-2 small as llm.c counts it (wte tied with the output layer) */
    EXPECT(ircost_param_count(m) == 124439808);
    EXPECT(ircost_param_count(m) == sem_param_count(sm));
    EXPECT(ircost_param_bytes(m) == 4 * (int64_t)124439808);
  }
  diag_free(diag);
  arena_free(arena);
}

/* ---- hand-built graphs ---- */

static int arg(IrGraph *g, DType dt, int rank, const int64_t *dims) {
  int64_t a = g->nargs++;
  return ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, dt, rank, dims, NULL);
}

static int op1(IrGraph *g, IrOp op, int x) { return ir_add(g, op, &x, 1, NULL, 0, 0, g->nodes[x].dtype, -1, NULL, NULL); }

static int op2(IrGraph *g, IrOp op, int a, int b) {
  int in[2] = {a, b};
  return ir_add(g, op, in, 2, NULL, 0, 0, g->nodes[a].dtype, -1, NULL, NULL);
}

static void test_ops(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  IrGraph *g = ir_graph_new(m, "forward");
  int64_t d_x[3] = {2, 3, 4}, d_w[2] = {4, 5}, d_v[1] = {4}, d_tab[2] = {10, 4}, d_ids[2] = {2, 3};
  int x = arg(g, DT_F32, 3, d_x);       /* f32[2, 3, 4]: 24 elements, 96 bytes */
  int w = arg(g, DT_BF16, 2, d_w);      /* bf16[4, 5]: 40 bytes */
  int v = arg(g, DT_F32, 1, d_v);
  int tab = arg(g, DT_F32, 2, d_tab);
  int ids = arg(g, DT_I32, 2, d_ids);
  int c = ir_add(g, IR_CONST, NULL, 0, NULL, 0, 2.0, DT_F32, -1, NULL, NULL);

  IrCost k = ircost_node(m, g, x);
  EXPECT(k.cls == IRC_LEAF && k.flops == 0 && k.bytes_read == 0 && k.bytes_written == 0);

  /* matmul [2,3,4] x [4,5]: 2 * (2*3) * 5 * 4 FLOPs; reads both, writes [2,3,5] */
  int y = op2(g, IR_MATMUL, x, w);
  k = ircost_node(m, g, y);
  EXPECT(k.cls == IRC_GEMM);
  EXPECT_NEAR(k.flops, 2.0 * 6 * 5 * 4, 0);
  EXPECT_NEAR(k.bytes_read, 96 + 40, 0);
  EXPECT_NEAR(k.bytes_written, 2 * 3 * 5 * 4, 0);
  EXPECT_NEAR(k.flops_of[IRC_GEMM], k.flops, 0);

  /* a transposed operand: attr[1] = 1 reads b as [N, K] */
  int64_t tb[2] = {0, 1};
  int64_t d_wt[2] = {5, 4};
  int wt = arg(g, DT_F32, 2, d_wt);
  int in2[2] = {x, wt};
  int yt = ir_add(g, IR_MATMUL, in2, 2, tb, 2, 0, DT_F32, -1, NULL, NULL);
  EXPECT(yt >= 0);
  EXPECT_NEAR(ircost_node(m, g, yt).flops, 2.0 * 6 * 5 * 4, 0);

  /* elementwise: per-element constants; a broadcast input is read at its size */
  int a = op2(g, IR_ADD, x, v);
  k = ircost_node(m, g, a);
  EXPECT(k.cls == IRC_ELEMENTWISE);
  EXPECT_NEAR(k.flops, 24, 0);
  EXPECT_NEAR(k.bytes_read, 96 + 16, 0);
  EXPECT_NEAR(k.bytes_written, 96, 0);
  EXPECT_NEAR(ircost_node(m, g, op1(g, IR_GELU, x)).flops, 24 * 9, 0);
  EXPECT_NEAR(ircost_node(m, g, op1(g, IR_EXP, x)).flops, 24, 0);
  EXPECT_NEAR(ircost_node(m, g, op1(g, IR_SIGMOID, x)).flops, 24 * 4, 0);
  EXPECT_NEAR(ircost_node(m, g, op1(g, IR_SILU, x)).flops, 24 * 5, 0);
  /* x * x reads x once; a scalar constant is a kernel argument */
  k = ircost_node(m, g, op2(g, IR_MUL, x, x));
  EXPECT_NEAR(k.bytes_read, 96, 0);
  k = ircost_node(m, g, op2(g, IR_MUL, x, c));
  EXPECT_NEAR(k.bytes_read, 96, 0);
  /* act_grad(gelu): 2 * 9 + 1 per element */
  int64_t ag = IR_GELU;
  int in_ag[2] = {x, x};
  int agn = ir_add(g, IR_ACT_GRAD, in_ag, 2, &ag, 1, 0, DT_F32, -1, NULL, NULL);
  EXPECT(agn >= 0);
  EXPECT_NEAR(ircost_node(m, g, agn).flops, 24 * 19, 0);

  /* reductions: 1 per input element (+1 per output for the mean); softmax 5 */
  int64_t ax[2] = {2, 1};
  int rs = ir_add(g, IR_REDUCE_SUM, &x, 1, ax, 2, 0, DT_F32, -1, NULL, NULL);
  int rm = ir_add(g, IR_REDUCE_MEAN, &x, 1, ax, 2, 0, DT_F32, -1, NULL, NULL);
  int sm = ir_add(g, IR_SOFTMAX, &x, 1, ax, 1, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, rs);
  EXPECT(k.cls == IRC_REDUCTION);
  EXPECT_NEAR(k.flops, 24, 0);
  EXPECT_NEAR(k.bytes_written, 6 * 4, 0);
  EXPECT_NEAR(ircost_node(m, g, rm).flops, 24 + 6, 0);
  EXPECT_NEAR(ircost_node(m, g, sm).flops, 24 * 5, 0);

  /* shape ops: a reshape is a view (free); a transpose reads and writes;
   * a slice reads only the slice */
  int64_t d_r[2] = {6, 4};
  int rsh = ir_add(g, IR_RESHAPE, &x, 1, NULL, 0, 0, DT_F32, 2, d_r, NULL);
  k = ircost_node(m, g, rsh);
  EXPECT(k.cls == IRC_DATA && k.flops == 0 && k.bytes_read == 0 && k.bytes_written == 0);
  int64_t perm[3] = {0, 2, 1};
  int tr = ir_add(g, IR_TRANSPOSE, &x, 1, perm, 3, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, tr);
  EXPECT_NEAR(k.bytes_read, 96, 0);
  EXPECT_NEAR(k.bytes_written, 96, 0);
  int64_t sl[16] = {0};
  sl[2] = 1;
  int64_t d_s[3] = {2, 3, 2};
  int sln = ir_add(g, IR_SLICE, &x, 1, sl, 16, 0, DT_F32, 3, d_s, NULL);
  EXPECT(sln >= 0);
  k = ircost_node(m, g, sln);
  EXPECT_NEAR(k.bytes_read, 48, 0);
  EXPECT_NEAR(k.bytes_written, 48, 0);

  /* embedding: reads the ids and only the gathered rows */
  int in_e[2] = {tab, ids};
  int emb = ir_add(g, IR_EMBEDDING, in_e, 2, NULL, 0, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, emb);
  EXPECT(k.cls == IRC_DATA);
  EXPECT_NEAR(k.bytes_read, 6 * 4 + 6 * 4 * 4, 0);
  EXPECT_NEAR(k.bytes_written, 6 * 4 * 4, 0);

  /* cross-entropy over [2, 3] rows of 4 logits */
  int64_t d_t[2] = {2, 3};
  int tg = arg(g, DT_I32, 2, d_t);
  int ce = op2(g, IR_CROSS_ENTROPY, x, tg);
  EXPECT(ce >= 0);
  EXPECT_NEAR(ircost_node(m, g, ce).flops, 4 * 24 + 3 * 6 + 1, 0);

  /* the router's ops over x [2, 3, 4] (6 rows of 4): topk k = 2 compares k
   * per element; take reads idx and the taken elements; take_bwd adds per dy
   * element and writes the whole [2, 3, 4]; one_hot selects per output */
  int64_t two = 2, four = 4;
  int tk = ir_add(g, IR_TOPK, &x, 1, &two, 1, 0, DT_I32, -1, NULL, NULL);
  k = ircost_node(m, g, tk);
  EXPECT(k.cls == IRC_DATA);
  EXPECT_NEAR(k.flops, 24 * 2, 0);
  EXPECT_NEAR(k.bytes_written, 12 * 4, 0);
  int in_t[2] = {x, tk};
  int tkv = ir_add(g, IR_TAKE, in_t, 2, NULL, 0, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, tkv);
  EXPECT(k.flops == 0);
  EXPECT_NEAR(k.bytes_read, 12 * 4 + 12 * 4, 0);
  EXPECT_NEAR(k.bytes_written, 12 * 4, 0);
  int in_tb[2] = {tkv, tk};
  int tkb = ir_add(g, IR_TAKE_BWD, in_tb, 2, NULL, 0, 0, DT_F32, 3, d_x, NULL);
  k = ircost_node(m, g, tkb);
  EXPECT_NEAR(k.flops, 12, 0);
  EXPECT_NEAR(k.bytes_read, 12 * 4 + 12 * 4, 0);
  EXPECT_NEAR(k.bytes_written, 96, 0);
  int oh = ir_add(g, IR_ONE_HOT, &tk, 1, &four, 1, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, oh);
  EXPECT_NEAR(k.flops, 12 * 4, 0);
  EXPECT_NEAR(k.bytes_written, 12 * 4 * 4, 0);

  /* a collective's payload */
  int64_t grp[2] = {IRG_TP, 0};
  int ar = ir_add(g, IR_ALL_REDUCE, &x, 1, grp, 2, 0, DT_F32, -1, NULL, NULL);
  k = ircost_node(m, g, ar);
  EXPECT(k.cls == IRC_COMM && k.comm_bytes == 96 && k.flops == 0);

  EXPECT(ir_verify(m, stderr) == 0);
  arena_free(arena);
}

/* A CALL counts its graph x the repeat count, recursively. */
static void test_call(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  IrGraph *g0 = ir_graph_new(m, "forward");
  IrGraph *g1 = ir_graph_new(m, "outer");
  IrGraph *g2 = ir_graph_new(m, "inner");
  int64_t d[2] = {8, 8};
  /* inner: y = x @ x + x  (1024 + 64 FLOPs) */
  int x2 = arg(g2, DT_F32, 2, d);
  int mm = op2(g2, IR_MATMUL, x2, x2);
  g2->outputs = arena_alloc(arena, sizeof(int));
  g2->outputs[0] = op2(g2, IR_ADD, mm, x2);
  g2->noutputs = 1;
  g2->count = 3;
  /* outer: exp, then inner x3 */
  int x1 = arg(g1, DT_F32, 2, d);
  int e1 = op1(g1, IR_EXP, x1);
  int64_t call2[2] = {2, 3};
  int c1 = ir_add(g1, IR_CALL, &e1, 1, call2, 2, 0, DT_F32, 2, d, NULL);
  g1->outputs = arena_alloc(arena, sizeof(int));
  g1->outputs[0] = c1;
  g1->noutputs = 1;
  g1->count = 5;
  /* forward: outer x5 */
  int x0 = arg(g0, DT_F32, 2, d);
  int64_t call1[2] = {1, 5};
  int c0 = ir_add(g0, IR_CALL, &x0, 1, call1, 2, 0, DT_F32, 2, d, NULL);
  g0->outputs = arena_alloc(arena, sizeof(int));
  g0->outputs[0] = c0;
  g0->noutputs = 1;
  EXPECT(ir_verify(m, stderr) == 0);

  IrCost inner = ircost_graph(m, g2);
  EXPECT_NEAR(inner.flops, 2.0 * 8 * 8 * 8 + 64, 0);
  IrCost k = ircost_node(m, g0, c0);
  EXPECT(k.cls == IRC_CALL);
  EXPECT_NEAR(k.flops, 5 * (64 + 3 * (1024 + 64)), 0);
  EXPECT_NEAR(k.flops_of[IRC_GEMM], 5 * 3 * 1024, 0);
  EXPECT_NEAR(k.nodes_of[IRC_GEMM], 15, 0);
  IrCost all = ircost_graph(m, g0);
  EXPECT_NEAR(all.flops, k.flops, 0);
  EXPECT_NEAR(all.bytes_read, k.bytes_read, 0);
  arena_free(arena);
}

/* Causal attention's allowed pairs under context parallelism (c = 4 ranks of
 * T = 8 rows, zigzag chunks of h = 4): a rank's rows against the ring's
 * gathered keys count as many as against its blocks one at a time
 * (cp_comm = ring: its own block h (2h + 1), each other 2 h^2), and as the
 * whole sequence's triangle over the ranks. */
static void test_attention_pairs(void) {
  IrNode q = {.rank = 4, .dims = {1, 1, 8, 2}}, kc = {.rank = 4, .dims = {1, 1, 32, 2}}, kb = {.rank = 4, .dims = {1, 1, 8, 2}};
  IrNode gathered = {.op = IR_ATTENTION, .attr = {1, 1 + IRG_CP, 1 + IRG_CP, 0}};
  double all = ircost_attention_pairs(&gathered, &q, &kc), blocks = 0;
  for (int s = 1; s <= 4; s++) {
    IrNode one = {.op = IR_ATTENTION, .attr = {1, 1 + IRG_CP, 1 + IRG_CP, 0, s, 4}};
    double p = ircost_attention_pairs(&one, &q, &kb);
    EXPECT_NEAR(p, s == 1 ? 4 * 9 : 32, 0);
    blocks += p;
  }
  EXPECT_NEAR(blocks, all, 0);
  EXPECT_NEAR(4 * all, 32.0 * 33 / 2, 0);
}

/* Every op has a class and a name for it. */
static void test_classes(void) {
  for (int op = 0; op < IR_OP_COUNT; op++) {
    IrCostClass c = ircost_op_class((IrOp)op);
    EXPECT(c >= 0 && c < IRC_NCLASSES);
    EXPECT(strcmp(ircost_class_name(c), "?") != 0);
    if (ir_op_flags((IrOp)op) & IRF_ELEMENTWISE && op != IR_ACT_GRAD) EXPECT(ircost_elementwise_flops((IrOp)op) >= 0);
  }
  EXPECT(ircost_op_class(IR_MATMUL) == IRC_GEMM);
  EXPECT(ircost_op_class(IR_SOFTMAX) == IRC_REDUCTION);
  EXPECT(ircost_op_class(IR_RESHAPE) == IRC_DATA);
  EXPECT(ircost_op_class(IR_RECV) == IRC_COMM);
  EXPECT(ircost_op_class(IR_PARAM) == IRC_LEAF);
  EXPECT(ircost_elementwise_flops(IR_MATMUL) < 0);
}

int main(void) {
  test_ops();
  test_call();
  test_classes();
  test_attention_pairs();
  test_gpt2_params();
  test_gpt_forward_flops();
  TEST_DONE();
}
