/* test_fuse.c - kernel fusion: the patterns it must find (layernorm in one
 * row kernel, matmul + bias + gelu as one GEMM with an epilogue, diamonds),
 * the ones it must refuse (cross-row reads, cycles through a GEMM, index
 * maps over values of their own kernel), and whole models - forward and,
 * through autodiff, a training step - whose fusion must pass fuse_check and
 * keep every FLOP. */
#include "fuse.h"

#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "loader.h"
#include "lower.h"
#include "sema.h"
#include "test_sample.h"
#include "test_util.h"

/* ---- building graphs by hand ---- */

typedef struct {
  Arena *arena;
  IrModule *m;
  IrGraph *g;
} Built;

static Built begin(void) {
  Built b;
  b.arena = arena_new();
  b.m = ir_module_new(b.arena);
  b.g = ir_graph_new(b.m, "forward");
  return b;
}

static void finish(Built *b, const int *outs, int nouts) {
  b->g->outputs = arena_alloc(b->arena, sizeof(int) * (size_t)nouts);
  memcpy(b->g->outputs, outs, sizeof(int) * (size_t)nouts);
  b->g->noutputs = nouts;
  EXPECT(ir_verify(b->m, stderr) == 0);
}

static int arg(IrGraph *g, int rank, const int64_t *dims) {
  int64_t a = g->nargs++;
  return ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, DT_F32, rank, dims, NULL);
}

static int cst(IrGraph *g, double v) { return ir_add(g, IR_CONST, NULL, 0, NULL, 0, v, DT_F32, -1, NULL, NULL); }
static int op1(IrGraph *g, IrOp op, int x) { return ir_add(g, op, &x, 1, NULL, 0, 0, DT_F32, -1, NULL, NULL); }
static int op2(IrGraph *g, IrOp op, int a, int b) {
  int in[2] = {a, b};
  return ir_add(g, op, in, 2, NULL, 0, 0, DT_F32, -1, NULL, NULL);
}
static int reduce(IrGraph *g, IrOp op, int x, int axis, int keepdim) {
  int64_t attr[2] = {axis, keepdim};
  return ir_add(g, op, &x, 1, attr, 2, 0, DT_F32, -1, NULL, NULL);
}
static int transpose(IrGraph *g, int x, const int64_t *perm, int rank) {
  return ir_add(g, IR_TRANSPOSE, &x, 1, perm, rank, 0, DT_F32, -1, NULL, NULL);
}

static FuseResult *fuse_ok(Built *b) {
  FuseResult *r = fuse_module(b->arena, b->m);
  EXPECT(fuse_check(r, stderr) == 0);
  return r;
}

static const FuseKernel *kernel_of(const FuseResult *r, int node) {
  return &r->graphs[0].kernels[r->graphs[0].kernel_of[node]];
}

static int computing_kernels(const FuseResult *r) {
  return r->graphs[0].nkernels - fuse_count(r, 0, FUSE_LEAF) - fuse_count(r, 0, FUSE_VIEW);
}

/* ---- patterns ---- */

/* LayerNorm as std/layers lowers it: mean, sub, square, mean, add eps,
 * rsqrt, mul, mul weight, add bias -> one row kernel (at most two). */
static void test_layernorm(void) {
  Built b = begin();
  int64_t dx[3] = {4, 16, 32}, dw[1] = {32};
  int x = arg(b.g, 3, dx), w = arg(b.g, 1, dw), bias = arg(b.g, 1, dw);
  int mu = reduce(b.g, IR_REDUCE_MEAN, x, 2, 1);
  int xc = op2(b.g, IR_SUB, x, mu);
  int sq = op1(b.g, IR_SQUARE, xc);
  int var = reduce(b.g, IR_REDUCE_MEAN, sq, 2, 1);
  int ve = op2(b.g, IR_ADD, var, cst(b.g, 1e-5));
  int rs = op1(b.g, IR_RSQRT, ve);
  int y0 = op2(b.g, IR_MUL, xc, rs);
  int y1 = op2(b.g, IR_MUL, y0, w);
  int y = op2(b.g, IR_ADD, y1, bias);
  finish(&b, &y, 1);
  FuseResult *r = fuse_ok(&b);
  int rows = fuse_count(r, 0, FUSE_ROW), loops = fuse_count(r, 0, FUSE_LOOP);
  EXPECT(rows + loops <= 2);
  EXPECT(computing_kernels(r) == rows + loops);
  /* in fact one: the row kernel holds all nine */
  const FuseKernel *k = kernel_of(r, mu);
  EXPECT(k->kind == FUSE_ROW && k->nnodes == 9 && k->red_lo == 2 && k->red_hi == 3);
  EXPECT(kernel_of(r, y) == k);
  EXPECT(k->noutputs == 1 && k->outputs[0] == y);
  EXPECT(k->ninputs == 4); /* x, eps, weight, bias */
  /* the fused kernel reads x once and writes y once */
  EXPECT_NEAR(k->bytes_read, 4.0 * (4 * 16 * 32 + 32 + 32), 0);
  EXPECT_NEAR(k->bytes_written, 4.0 * 4 * 16 * 32, 0);
  (void)rs;
  arena_free(b.arena);
}

/* RMSNorm and a softmax with its scale and mask: one row kernel each. */
static void test_rmsnorm_softmax(void) {
  Built b = begin();
  int64_t dx[3] = {2, 8, 16}, da[4] = {2, 4, 8, 8};
  int x = arg(b.g, 3, dx), s = arg(b.g, 4, da);
  int ms = reduce(b.g, IR_REDUCE_MEAN, op1(b.g, IR_SQUARE, x), 2, 1);
  int y = op2(b.g, IR_MUL, x, op1(b.g, IR_RSQRT, op2(b.g, IR_ADD, ms, cst(b.g, 1e-6))));
  int sc = op2(b.g, IR_MUL, s, cst(b.g, 0.125));
  int64_t ax = 3;
  int sm = ir_add(b.g, IR_SOFTMAX, (int[]){op1(b.g, IR_CAUSAL_MASK, sc)}, 1, &ax, 1, 0, DT_F32, -1, NULL, NULL);
  int outs[2] = {y, sm};
  finish(&b, outs, 2);
  FuseResult *r = fuse_ok(&b);
  EXPECT(fuse_count(r, 0, FUSE_ROW) == 2 && fuse_count(r, 0, FUSE_LOOP) == 0);
  EXPECT(kernel_of(r, y)->nnodes == 5); /* square, mean, add, rsqrt, mul */
  EXPECT(kernel_of(r, sm)->nnodes == 3 && kernel_of(r, sm)->red_lo == 3);
  arena_free(b.arena);
}

/* x @ W + b then gelu: one GEMM kernel, epilogue bias + gelu (cuBLASLt
 * GELU_BIAS); relu likewise; the scale of attention scores is alpha. */
static void test_gemm_epilogue(void) {
  Built b = begin();
  int64_t dx[3] = {2, 8, 16}, dw[2] = {16, 32}, db[1] = {32};
  int x = arg(b.g, 3, dx), w = arg(b.g, 2, dw), bias = arg(b.g, 1, db);
  int mm = op2(b.g, IR_MATMUL, x, w);
  int ad = op2(b.g, IR_ADD, bias, mm); /* either side */
  int ge = op1(b.g, IR_GELU, ad);
  finish(&b, &ge, 1);
  FuseResult *r = fuse_ok(&b);
  EXPECT(computing_kernels(r) == 1);
  const FuseKernel *k = kernel_of(r, mm);
  EXPECT(k->kind == FUSE_GEMM && k->nnodes == 3);
  EXPECT(k->epilogue == (FUSE_EPI_BIAS | FUSE_EPI_ACT) && k->act == IR_GELU);
  EXPECT(kernel_of(r, ge) == k && k->noutputs == 1 && k->outputs[0] == ge);
  EXPECT(k->ninputs == 3);
  EXPECT_NEAR(k->flops, 2.0 * 16 * 32 * 16 + 16 * 32 + 9 * 16 * 32, 0);
  arena_free(b.arena);

  /* scale, bias and relu, in cuBLASLt's order */
  b = begin();
  int64_t d1[2] = {8, 16}, d2[2] = {16, 4}, d3[2] = {1, 4};
  x = arg(b.g, 2, d1), w = arg(b.g, 2, d2), bias = arg(b.g, 2, d3);
  mm = op2(b.g, IR_MATMUL, x, w);
  int y = op1(b.g, IR_RELU, op2(b.g, IR_ADD, op2(b.g, IR_MUL, mm, cst(b.g, 0.5)), bias));
  finish(&b, &y, 1);
  r = fuse_ok(&b);
  k = kernel_of(r, y);
  EXPECT(k->kind == FUSE_GEMM && k->epilogue == (FUSE_EPI_SCALE | FUSE_EPI_BIAS | FUSE_EPI_ACT) && k->act == IR_RELU);
  EXPECT(computing_kernels(r) == 1);
  arena_free(b.arena);
}

/* What is not an epilogue: a matmul read twice, a bias that is a matrix, a
 * relu after a value others read, silu (no cuBLASLt epilogue); a gelu after
 * a value others read is, with the pre-activation as a second output
 * (GELU_AUX_BIAS). */
static void test_gemm_epilogue_refused(void) {
  Built b = begin();
  int64_t dx[2] = {8, 16}, dw[2] = {16, 16}, db[1] = {16};
  int x = arg(b.g, 2, dx), w = arg(b.g, 2, dw), bias = arg(b.g, 1, db);
  int mm1 = op2(b.g, IR_MATMUL, x, w);
  int a1 = op2(b.g, IR_ADD, mm1, bias);
  int t1 = op1(b.g, IR_TANH, mm1);              /* mm1 has two consumers */
  int mm2 = op2(b.g, IR_MATMUL, x, w);
  int a2 = op2(b.g, IR_ADD, mm2, x);            /* a matrix, not a bias */
  int mm3 = op2(b.g, IR_MATMUL, x, w);
  int a3 = op2(b.g, IR_ADD, mm3, bias);
  int r3 = op1(b.g, IR_RELU, a3);
  int n3 = op1(b.g, IR_NEG, a3);                /* a3 read twice: no relu */
  int mm4 = op2(b.g, IR_MATMUL, x, w);
  int a4 = op2(b.g, IR_ADD, mm4, bias);
  int g4 = op1(b.g, IR_GELU, a4);
  int n4 = op1(b.g, IR_NEG, a4);                /* gelu with aux output */
  int mm5 = op2(b.g, IR_MATMUL, x, w);
  int s5 = op1(b.g, IR_SILU, mm5);
  int outs[] = {a1, t1, a2, r3, n3, g4, n4, s5};
  finish(&b, outs, 8);
  FuseResult *r = fuse_ok(&b);
  EXPECT(kernel_of(r, mm1)->epilogue == 0 && kernel_of(r, a1) != kernel_of(r, mm1));
  EXPECT(kernel_of(r, mm2)->epilogue == 0 && kernel_of(r, a2)->kind == FUSE_LOOP);
  EXPECT(kernel_of(r, mm3)->epilogue == FUSE_EPI_BIAS && kernel_of(r, r3) != kernel_of(r, mm3));
  const FuseKernel *k4 = kernel_of(r, mm4);
  EXPECT(k4->epilogue == (FUSE_EPI_BIAS | FUSE_EPI_ACT) && kernel_of(r, g4) == k4);
  EXPECT(k4->noutputs == 2 && k4->outputs[0] == a4 && k4->outputs[1] == g4);
  EXPECT(kernel_of(r, mm5)->epilogue == 0 && kernel_of(r, s5)->kind == FUSE_LOOP);
  arena_free(b.arena);
}

static FuseResult *fuse_cuda(Built *b) {
  FuseResult *r = fuse_module_opts(b->arena, b->m, &FUSE_CUDA_OPTIONS);
  EXPECT(fuse_check(r, stderr) == 0);
  return r;
}

static int matmul_t(IrGraph *g, int a, int b, int ta, int tb) {
  int in[2] = {a, b};
  int64_t attr[2] = {ta, tb};
  return ir_add(g, IR_MATMUL, in, 2, attr, 2, 0, DT_F32, -1, NULL, NULL);
}

static int reshape(IrGraph *g, int x, int rank, const int64_t *dims) {
  return ir_add(g, IR_RESHAPE, &x, 1, NULL, 0, 0, DT_F32, rank, dims, NULL);
}

static int sum_to(IrGraph *g, int x, int rank, const int64_t *dims) {
  return ir_add(g, IR_SUM_TO, &x, 1, NULL, 0, 0, DT_F32, rank, dims, NULL);
}

/* Rule 8 (FuseOptions.bias_grad): a linear layer's backward - the bias
 * gradient, a sum of dy over the rows, and the weight gradient h^T dy - is
 * one GEMM kernel with a bias-gradient epilogue (cuBLASLt's BGRADA: our B),
 * and h's and dy's roles swapped (dy^T h, a weight stored [out, in]) the
 * sum is over A (BGRADB); without the option the sum stays a row kernel.
 * Not absorbed: a sum over the other axis of an operand (dx = dy W^T sums
 * over N, not K), a GEMM with a forward epilogue, a sum on a path to the
 * GEMM (a cycle), a sum fused with the activation's backward that computes
 * the operand. */
static void test_bias_grad(void) {
  Built b = begin();
  int64_t ddy[3] = {4, 8, 16}, dh[3] = {4, 8, 32}, dy2[2] = {32, 16}, dh2[2] = {32, 32}, dbias[1] = {16};
  int dy = arg(b.g, 3, ddy), h = arg(b.g, 3, dh);
  int db = sum_to(b.g, dy, 1, dbias);
  int dw = matmul_t(b.g, reshape(b.g, h, 2, dh2), reshape(b.g, dy, 2, dy2), 1, 0); /* [32, 16] */
  int dwt = matmul_t(b.g, reshape(b.g, dy, 2, dy2), reshape(b.g, h, 2, dh2), 1, 0); /* [16, 32] */
  int outs[] = {db, dw, dwt};
  finish(&b, outs, 3);
  FuseResult *r = fuse_ok(&b);
  EXPECT(kernel_of(r, db)->kind == FUSE_ROW && kernel_of(r, dw)->epilogue == 0);
  r = fuse_cuda(&b);
  const FuseKernel *k = kernel_of(r, dw);
  EXPECT(kernel_of(r, db) == k && k->kind == FUSE_GEMM && k->epilogue == FUSE_EPI_BGRAD && k->bgrad == db);
  EXPECT(k->noutputs == 2 && k->outputs[0] == db && k->outputs[1] == dw);
  EXPECT(fuse_bgrad_side(&r->graphs[0], r->graphs[0].kernel_of[dw]) == 1);
  EXPECT(kernel_of(r, dwt)->epilogue == 0 && computing_kernels(r) == 2);
  arena_free(b.arena);

  /* the weight stored [out, in]: dy^T h, the sum over A */
  b = begin();
  dy = arg(b.g, 3, ddy), h = arg(b.g, 3, dh);
  dwt = matmul_t(b.g, reshape(b.g, dy, 2, dy2), reshape(b.g, h, 2, dh2), 1, 0);
  db = sum_to(b.g, dy, 1, dbias);
  int outs2[] = {dwt, db};
  finish(&b, outs2, 2);
  r = fuse_cuda(&b);
  EXPECT(kernel_of(r, db) == kernel_of(r, dwt) && fuse_bgrad_side(&r->graphs[0], r->graphs[0].kernel_of[db]) == 0);
  arena_free(b.arena);

  /* refused */
  b = begin();
  int64_t dw2[2] = {32, 16}, dvec[1] = {32};
  dy = arg(b.g, 2, dy2), h = arg(b.g, 2, dh2);
  int w = arg(b.g, 2, dw2), bias = arg(b.g, 1, dvec);
  int dx = matmul_t(b.g, dy, w, 0, 1);            /* [32, 32]: dy's rows are M */
  int s1 = sum_to(b.g, dy, 1, dbias);
  int fwd = op2(b.g, IR_ADD, matmul_t(b.g, h, h, 1, 0), bias); /* a bias epilogue already */
  /* s2 sums dyc but reaches cyc's other operand through a GEMM and a loop */
  int64_t d116[2] = {1, 16}, d1632[2] = {16, 32};
  int dyc = arg(b.g, 2, dy2), w1632 = arg(b.g, 2, d1632);
  int s2 = sum_to(b.g, dyc, 1, dbias);
  int hs = op2(b.g, IR_ADD, h, matmul_t(b.g, reshape(b.g, s2, 2, d116), w1632, 0, 0));
  int cyc = matmul_t(b.g, hs, dyc, 1, 0);          /* [32, 16] */
  int g3 = op2(b.g, IR_MUL, op1(b.g, IR_TANH, h), h);
  int s3 = sum_to(b.g, g3, 1, dvec);               /* fused with the value it sums */
  int wg3 = matmul_t(b.g, h, g3, 1, 0);
  int outs3[] = {dx, s1, fwd, cyc, s3, wg3};
  finish(&b, outs3, 6);
  r = fuse_cuda(&b);
  EXPECT(kernel_of(r, s1)->kind == FUSE_ROW && kernel_of(r, dx)->epilogue == 0);
  EXPECT(kernel_of(r, fwd)->epilogue == FUSE_EPI_BIAS && kernel_of(r, cyc)->epilogue == 0);
  EXPECT(kernel_of(r, s2)->kind == FUSE_ROW && kernel_of(r, s2)->nnodes == 1);
  EXPECT(kernel_of(r, s3)->kind == FUSE_ROW && kernel_of(r, s3) == kernel_of(r, g3));
  EXPECT(kernel_of(r, wg3)->epilogue == 0);
  arena_free(b.arena);
}

/* FuseOptions.store16 (train { precision = bf16 } on the CUDA back end): a
 * bias ADD stored in bf16 over the fp32 product of bf16 operands ends its
 * GEMM's epilogue (cuBLASLt adds in fp32 and rounds into a bf16 D); the GELU
 * after it, which reads the rounded sum, is a loop kernel of its own; a bf16
 * add over fp32 operands, and any 16-bit add without the option, stays out.
 * Rule 8 over bf16 operands: the bias gradient of a bf16 dy joins its
 * weight-gradient product (the sum in fp32). */
static int arg16(IrGraph *g, int rank, const int64_t *dims) {
  int64_t a = g->nargs++;
  return ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, DT_BF16, rank, dims, NULL);
}

/* ir_add infers a node's type from its inputs; precision.c sets it (a
 * GEMM's fp32 product of bf16 operands, a 16-bit sum of fp32 values) */
static int typed(IrGraph *g, int id, DType t) {
  g->nodes[id].dtype = t;
  return id;
}

static int typed2(IrGraph *g, IrOp op, int a, int b, DType t) {
  int in[2] = {a, b};
  return typed(g, ir_add(g, op, in, 2, NULL, 0, 0, t, -1, NULL, NULL), t);
}

static int matmul32(IrGraph *g, int a, int b, int ta, int tb) { return typed(g, matmul_t(g, a, b, ta, tb), DT_F32); }

/* Rule 6 with FuseOptions.ce_pair (the CUDA back end): a CROSS_ENTROPY_BWD
 * joins its CROSS_ENTROPY's special kernel (one pass over the logits makes
 * the loss and their gradient), reading the logits, the targets and the
 * seed, writing both; without the option they stay two kernels. Refused: a
 * seed computed in the step (not a leaf), a pipeline's step (a SEND to the
 * next stage), a loss a forward node reads. */
static int targets(IrGraph *g, int rank, const int64_t *dims) {
  int64_t a = g->nargs++;
  return ir_add(g, IR_ARG, NULL, 0, &a, 1, 0, DT_I32, rank, dims, NULL);
}

static int ce2(IrGraph *g, IrOp op, int x, int t, int dl) {
  int in[3] = {x, t, dl};
  return ir_add(g, op, in, op == IR_CROSS_ENTROPY ? 2 : 3, NULL, 0, 0, DT_F32, -1, NULL, NULL);
}

static void test_ce_pair(void) {
  int64_t dx[2] = {8, 40}, dt[1] = {8}, none[1] = {0};
  for (int variant = 0; variant < 4; variant++) {
    Built b = begin();
    int seed = arg(b.g, 0, none), x = arg(b.g, 2, dx), t = targets(b.g, 1, dt);
    int loss = ce2(b.g, IR_CROSS_ENTROPY, x, t, -1);
    int reader = variant == 3 ? op1(b.g, IR_NEG, loss) : -1; /* a forward node reading the loss */
    if (variant >= 2) b.g->fb_split = b.g->nnodes;
    if (variant == 1) seed = op1(b.g, IR_NEG, seed); /* a computed seed */
    if (variant == 2) {
      int64_t pp[2] = {IRG_PP, 1};
      int act = ir_add(b.g, IR_SEND, &x, 1, pp, 2, 0, DT_F32, -1, NULL, NULL);
      (void)act;
    }
    int grad = ce2(b.g, IR_CROSS_ENTROPY_BWD, x, t, seed);
    int outs[3] = {loss, grad, reader};
    finish(&b, outs, variant == 3 ? 3 : 2);
    FuseResult *r = fuse_ok(&b);
    EXPECT(kernel_of(r, loss) != kernel_of(r, grad) && !fuse_ce_pair(&r->graphs[0], r->graphs[0].kernel_of[loss]));
    r = fuse_cuda(&b);
    const FuseKernel *k = kernel_of(r, loss);
    int paired = fuse_ce_pair(&r->graphs[0], r->graphs[0].kernel_of[loss]);
    EXPECT(paired == (variant == 0));
    EXPECT((kernel_of(r, grad) == k) == (variant == 0));
    if (variant == 0) {
      EXPECT(k->kind == FUSE_SPECIAL && k->ninputs == 3 && k->noutputs == 2);
      EXPECT(k->outputs[0] == loss && k->outputs[1] == grad);
      /* the logits read once: a kernel's bytes count its boundary */
      EXPECT(k->bytes_read < 2 * 8 * 40 * 4);
    }
    arena_free(b.arena);
  }
}

/* FuseOptions.store16: q, k and v that a 16-bit attention reads as the heads' transposes
 * of [B, T, H, D] values join its special kernel (fuse_attn_qkv: its kernels read them
 * in place); not without the option, not with fp32 operands, and none of the three when
 * one transpose is read by another node too. */
static int attn_operands(Built *b, DType t, int extra_reader, int *att, int *tr) {
  int64_t dq[4] = {2, 8, 4, 16}, dk[4] = {2, 8, 2, 16}, perm[4] = {0, 2, 1, 3};
  int x[3];
  for (int i = 0; i < 3; i++) {
    x[i] = typed(b->g, arg(b->g, 4, i ? dk : dq), t);
    tr[i] = typed(b->g, transpose(b->g, x[i], perm, 4), t);
  }
  int64_t attr[4] = {1, 0, 0, 0};
  *att = typed(b->g, ir_add(b->g, IR_ATTENTION, tr, 3, attr, 4, 0.25, t, -1, NULL, NULL), DT_F32);
  int outs[2] = {*att, extra_reader ? op1(b->g, IR_NEG, tr[1]) : *att};
  finish(b, outs, extra_reader ? 2 : 1);
  return 0;
}

static void test_attn_qkv(void) {
  for (int variant = 0; variant < 3; variant++) {
    Built b = begin();
    int att, tr[3];
    attn_operands(&b, variant == 1 ? DT_F32 : DT_BF16, variant == 2, &att, tr);
    FuseResult *r = fuse_ok(&b);
    EXPECT(kernel_of(r, tr[0]) != kernel_of(r, att));
    r = fuse_cuda(&b);
    for (int i = 0; i < 3; i++) {
      EXPECT((kernel_of(r, tr[i]) == kernel_of(r, att)) == (variant == 0));
      EXPECT((fuse_attn_qkv(b.g, tr[i]) == att) == (variant == 0));
    }
    if (variant == 0) EXPECT(kernel_of(r, att)->ninputs == 3 && kernel_of(r, att)->nnodes == 4);
    arena_free(b.arena);
  }
}

static void test_store16(void) {
  Built b = begin();
  int64_t dx[2] = {32, 16}, dw[2] = {16, 16}, dv[1] = {16};
  int x16 = arg16(b.g, 2, dx), w16 = arg16(b.g, 2, dw), x32 = arg(b.g, 2, dx), w32 = arg(b.g, 2, dw);
  int bias = arg(b.g, 1, dv);
  int a16 = typed2(b.g, IR_ADD, matmul32(b.g, x16, w16, 0, 0), bias, DT_BF16);
  int g16 = ir_add(b.g, IR_GELU, &a16, 1, NULL, 0, 0, DT_BF16, -1, NULL, NULL);
  int a32 = typed2(b.g, IR_ADD, matmul_t(b.g, x32, w32, 0, 0), bias, DT_BF16); /* fp32 operands */
  int m3 = matmul32(b.g, x16, w16, 0, 1);
  int a3 = typed2(b.g, IR_ADD, m3, bias, DT_F32); /* the fp32 sum: as before */
  int outs[] = {g16, a32, a3};
  finish(&b, outs, 3);
  FuseResult *r = fuse_ok(&b);
  EXPECT(kernel_of(r, a16)->kind == FUSE_LOOP && kernel_of(r, a3)->kind == FUSE_GEMM);
  r = fuse_cuda(&b);
  const FuseKernel *k = kernel_of(r, a16);
  EXPECT(k->kind == FUSE_GEMM && k->epilogue == FUSE_EPI_BIAS && k->noutputs == 1 && k->outputs[0] == a16);
  EXPECT(kernel_of(r, g16)->kind == FUSE_LOOP && kernel_of(r, g16) != k);
  EXPECT(kernel_of(r, a32)->kind == FUSE_LOOP);
  EXPECT(kernel_of(r, a3)->kind == FUSE_GEMM && kernel_of(r, a3)->epilogue == FUSE_EPI_BIAS);
  FuseOptions only_bgrad = {.bias_grad = 1};
  r = fuse_module_opts(b.arena, b.m, &only_bgrad);
  EXPECT(fuse_check(r, stderr) == 0 && kernel_of(r, a16)->kind == FUSE_LOOP);
  arena_free(b.arena);

  /* rule 8 over bf16 operands: h^T dy with dy bf16, its sum fp32 */
  b = begin();
  int64_t ddy[2] = {32, 16}, dh[2] = {32, 32};
  int dy = arg16(b.g, 2, ddy), h = arg16(b.g, 2, dh);
  int db = typed(b.g, ir_add(b.g, IR_SUM_TO, &dy, 1, NULL, 0, 0, DT_F32, 1, dv, NULL), DT_F32);
  int dwg = matmul32(b.g, h, dy, 1, 0); /* [32, 16] */
  int outs2[] = {db, dwg};
  finish(&b, outs2, 2);
  r = fuse_cuda(&b);
  EXPECT(kernel_of(r, db) == kernel_of(r, dwg) && kernel_of(r, dwg)->epilogue == FUSE_EPI_BGRAD);
  arena_free(b.arena);
}

/* a -> b, a -> c, (b, c) -> d: one kernel; so is d over two independent
 * chains (their kernels merge). */
static void test_diamond(void) {
  Built b = begin();
  int64_t d[2] = {16, 16};
  int x = arg(b.g, 2, d), y = arg(b.g, 2, d), z = arg(b.g, 2, d);
  int a = op1(b.g, IR_EXP, x);
  int bb = op1(b.g, IR_NEG, a);
  int c = op1(b.g, IR_TANH, a);
  int dd = op2(b.g, IR_ADD, bb, c);
  int e1 = op1(b.g, IR_SQRT, y);
  int e2 = op1(b.g, IR_LOG, z);
  int f = op2(b.g, IR_MUL, e1, e2);
  int outs[2] = {dd, f};
  finish(&b, outs, 2);
  FuseResult *r = fuse_ok(&b);
  const FuseKernel *k = kernel_of(r, a);
  EXPECT(k->kind == FUSE_LOOP && k->nnodes == 4 && kernel_of(r, dd) == k);
  EXPECT(k->ninputs == 1 && k->noutputs == 1 && k->outputs[0] == dd);
  EXPECT(kernel_of(r, e1) == kernel_of(r, f) && kernel_of(r, e2) == kernel_of(r, f));
  EXPECT(fuse_count(r, 0, FUSE_LOOP) == 2);
  arena_free(b.arena);
}

/* Rule 9: a loop kernel reading a value that a row or loop kernel reads
 * too, over its full space, joins it (the value read once: x's two loops join
 * the row kernel, w's two each other); not when a path through another kernel
 * joins them (y's). */
static void test_siblings(void) {
  Built b = begin();
  int64_t d[2] = {8, 16}, dv[1] = {16}, dw[2] = {16, 16};
  int x = arg(b.g, 2, d), y = arg(b.g, 2, d), w = arg(b.g, 2, dw);
  int g = op1(b.g, IR_GELU, x);                 /* loop */
  int act = op2(b.g, IR_MUL, y, x);             /* full value of the row kernel */
  int s = ir_add(b.g, IR_SUM_TO, &act, 1, NULL, 0, 0, DT_F32, 1, dv, NULL);
  int e = op1(b.g, IR_EXP, x);                  /* a second loop kernel over x */
  int v = op1(b.g, IR_ABS, w), v2 = op1(b.g, IR_SQRT, w); /* two loop kernels over w */
  int n = op1(b.g, IR_NEG, y);                  /* loop over y ... */
  int m = matmul32(b.g, n, w, 0, 0);            /* ... whose GEMM ... */
  int z = op2(b.g, IR_MUL, m, y);               /* ... a row kernel reads: a path */
  int zs = ir_add(b.g, IR_SUM_TO, &z, 1, NULL, 0, 0, DT_F32, 1, dv, NULL);
  int outs[] = {g, act, s, e, zs, v, v2};
  finish(&b, outs, 7);
  FuseResult *r = fuse_ok(&b);
  const FuseKernel *k = kernel_of(r, s);
  EXPECT(k->kind == FUSE_ROW && kernel_of(r, g) == k && kernel_of(r, act) == k);
  EXPECT(kernel_of(r, e) == k); /* every sibling over x joins */
  EXPECT(kernel_of(r, n) != kernel_of(r, zs) && kernel_of(r, z) == kernel_of(r, zs));
  EXPECT(kernel_of(r, v) == kernel_of(r, v2) && kernel_of(r, v)->kind == FUSE_LOOP); /* two loops join too */
  arena_free(b.arena);
}

/* A reduction whose result feeds a GEMM ends its kernel there: the GEMM is
 * a kernel of its own, and a consumer of both the reduction's kernel and
 * the GEMM cannot go back into the first (that would be a cycle). */
static void test_reduction_into_gemm(void) {
  Built b = begin();
  int64_t dx[2] = {4, 8}, dw[2] = {1, 8};
  int x = arg(b.g, 2, dx), w = arg(b.g, 2, dw);
  int e = op1(b.g, IR_EXP, x);
  int s = reduce(b.g, IR_REDUCE_SUM, e, 1, 1); /* [4, 1] */
  int mm = op2(b.g, IR_MATMUL, s, w);          /* [4, 8] */
  int y = op2(b.g, IR_ADD, e, mm);
  finish(&b, &y, 1);
  FuseResult *r = fuse_ok(&b);
  const FuseKernel *kr = kernel_of(r, s), *kg = kernel_of(r, mm), *ky = kernel_of(r, y);
  EXPECT(kr->kind == FUSE_ROW && kernel_of(r, e) == kr);
  EXPECT(kg->kind == FUSE_GEMM && kg != kr);
  EXPECT(ky != kr && ky != kg && ky->kind == FUSE_LOOP);
  EXPECT(kr < kg && kg < ky); /* execution order */
  EXPECT(kr->noutputs == 2 && kr->outputs[0] == e && kr->outputs[1] == s);
  arena_free(b.arena);
}

/* Rows stay rows: a reduction without keepdim, broadcast back with numpy's
 * right alignment, reads other rows' sums ([i, j] + s[j]) - a separate
 * kernel; with keepdim ([i, j] + s[i, 0]) it fuses. */
static void test_row_consistency(void) {
  Built b = begin();
  int64_t d[2] = {8, 8};
  int x = arg(b.g, 2, d);
  int s1 = reduce(b.g, IR_REDUCE_SUM, x, 1, 0);
  int y1 = op2(b.g, IR_SUB, x, s1);
  int s2 = reduce(b.g, IR_REDUCE_MAX, x, 1, 1);
  int y2 = op2(b.g, IR_SUB, x, s2);
  int outs[2] = {y1, y2};
  finish(&b, outs, 2);
  FuseResult *r = fuse_ok(&b);
  EXPECT(kernel_of(r, y1) != kernel_of(r, s1));
  EXPECT(kernel_of(r, y2) == kernel_of(r, s2));
  arena_free(b.arena);

  /* a sum over the leading axes (a bias gradient) is one reduced group */
  b = begin();
  int64_t d3[3] = {4, 8, 16}, dv[1] = {16}, dg[3] = {1, 8, 1};
  x = arg(b.g, 3, d3);
  int gx = op1(b.g, IR_NEG, x);
  int st = ir_add(b.g, IR_SUM_TO, &gx, 1, NULL, 0, 0, DT_F32, 1, dv, NULL);
  int st2 = ir_add(b.g, IR_SUM_TO, &x, 1, NULL, 0, 0, DT_F32, 3, dg, NULL); /* axes 0 and 2 */
  int outs2[2] = {st, st2};
  finish(&b, outs2, 2);
  r = fuse_ok(&b);
  const FuseKernel *k = kernel_of(r, st);
  EXPECT(k->kind == FUSE_ROW && k->red_lo == 0 && k->red_hi == 2 && kernel_of(r, gx) == k);
  EXPECT(kernel_of(r, st2)->kind == FUSE_SPECIAL);
  arena_free(b.arena);
}

/* Shape ops: a last-two-axes transpose into a GEMM is a layout flag; a
 * head transpose feeding a GEMM is a copy (with the reshape before it
 * folded in); a transpose read by an elementwise op is an index map; a
 * reshape read twice is a view; an index map never reads its own kernel. */
static void test_shape_ops(void) {
  Built b = begin();
  int64_t dq[3] = {2, 8, 16}, dh[4] = {2, 8, 4, 4}, dm[2] = {16, 16};
  int64_t swap4[4] = {0, 1, 3, 2}, heads[4] = {0, 2, 1, 3}, swap2[2] = {1, 0};
  int q = arg(b.g, 3, dq), w = arg(b.g, 2, dm);
  int qh = ir_add(b.g, IR_RESHAPE, &q, 1, NULL, 0, 0, DT_F32, 4, dh, NULL);
  int qt = transpose(b.g, qh, heads, 4);   /* [2, 4, 8, 4] */
  int kt = transpose(b.g, qt, swap4, 4);   /* [2, 4, 4, 8] */
  int sc = op2(b.g, IR_MATMUL, qt, kt);    /* [2, 4, 8, 8] */
  int wt = transpose(b.g, w, swap2, 2);
  int y = op2(b.g, IR_MATMUL, q, wt);      /* tied-weight style */
  int tu = transpose(b.g, w, swap2, 2), u = op1(b.g, IR_EXP, tu);
  int rv = ir_add(b.g, IR_RESHAPE, &w, 1, NULL, 0, 0, DT_F32, 2, dm, NULL);
  int v1 = op1(b.g, IR_NEG, rv), v2 = op1(b.g, IR_ABS, rv);
  /* exp(w) + transpose(exp(w)): the transpose reads a value computed in a
   * kernel, so it must not be an index map of that same kernel */
  int ew = op1(b.g, IR_EXP, w);
  int z = op2(b.g, IR_ADD, ew, transpose(b.g, ew, swap2, 2));
  int outs[] = {sc, y, u, v1, v2, z};
  finish(&b, outs, 6);
  FuseResult *r = fuse_ok(&b);
  EXPECT(kernel_of(r, kt) == kernel_of(r, sc));   /* transb */
  EXPECT(kernel_of(r, qt)->kind == FUSE_COPY);    /* a head transpose is copied */
  EXPECT(kernel_of(r, qh) == kernel_of(r, qt));   /* with its reshape folded */
  EXPECT(kernel_of(r, wt) == kernel_of(r, y));
  EXPECT(kernel_of(r, u)->kind == FUSE_LOOP && kernel_of(r, tu) == kernel_of(r, u)); /* an index map of u's kernel */
  EXPECT(kernel_of(r, rv)->kind == FUSE_VIEW);
  EXPECT(kernel_of(r, z) != kernel_of(r, ew));
  EXPECT(fuse_count(r, 0, FUSE_GEMM) == 2 && fuse_count(r, 0, FUSE_COPY) == 1);
  /* a copy kernel with a folded view reads and writes the tensor once */
  const FuseKernel *cp = kernel_of(r, qt);
  EXPECT_NEAR(cp->bytes_read, 4.0 * 2 * 8 * 16, 0);
  EXPECT_NEAR(cp->bytes_written, 4.0 * 2 * 8 * 16, 0);
  arena_free(b.arena);
}

/* fuse_check finds broken results: a kernel order against a dependency, a
 * node in two kernels, an output left off the list, an index map over its
 * own kernel's value. */
static void test_check_catches(void) {
  Built b = begin();
  int64_t d[2] = {8, 8};
  int x = arg(b.g, 2, d), w = arg(b.g, 2, d);
  int e = op1(b.g, IR_EXP, x);
  int mm = op2(b.g, IR_MATMUL, e, w);
  int y = op1(b.g, IR_NEG, mm);
  finish(&b, &y, 1);
  FuseResult *r = fuse_ok(&b);
  FuseGraph *fg = &r->graphs[0];
  int ke = fg->kernel_of[e], km = fg->kernel_of[mm];
  EXPECT(ke < km);
  /* swap the two kernels: the GEMM now runs before its input exists */
  FuseKernel t = fg->kernels[ke];
  fg->kernels[ke] = fg->kernels[km];
  fg->kernels[km] = t;
  fg->kernel_of[e] = km;
  fg->kernel_of[mm] = ke;
  EXPECT(fuse_check(r, NULL) > 0);
  fg->kernels[km] = fg->kernels[ke];
  fg->kernels[ke] = t;
  fg->kernel_of[e] = ke;
  fg->kernel_of[mm] = km;
  EXPECT(fuse_check(r, NULL) == 0);
  /* an output missing */
  int saved = fg->kernels[ke].noutputs;
  fg->kernels[ke].noutputs = 0;
  EXPECT(fuse_check(r, NULL) > 0);
  fg->kernels[ke].noutputs = saved;
  /* a node listed twice */
  FuseKernel *k = &fg->kernels[km];
  int *nodes = arena_alloc(b.arena, sizeof(int) * (size_t)(k->nnodes + 1));
  memcpy(nodes, k->nodes, sizeof(int) * (size_t)k->nnodes);
  nodes[k->nnodes] = e;
  int *old = k->nodes;
  k->nodes = nodes;
  k->nnodes++;
  EXPECT(fuse_check(r, NULL) > 0);
  k->nodes = old;
  k->nnodes--;
  EXPECT(fuse_check(r, NULL) == 0);
  arena_free(b.arena);
}

/* ---- whole models ---- */

/* Fusion keeps every FLOP and never adds traffic. */
static void check_totals(const FuseResult *r) {
  for (int gi = 0; gi < r->ngraphs; gi++) {
    const FuseGraph *fg = &r->graphs[gi];
    IrCost c = ircost_graph(r->module, fg->graph);
    EXPECT_NEAR(fg->flops, c.flops, 1e-12);
    EXPECT(fg->bytes_read <= c.bytes_read && fg->bytes_written <= c.bytes_written);
  }
}

static void test_models(void) {
  static const char *const samples[] = {"mlp.hpd", "gpt2-tiny.hpd", "gpt2.hpd", "llama.hpd", "gpt.hpd"};
  for (size_t s = 0; s < sizeof samples / sizeof samples[0]; s++) {
    for (int policy = -1; policy <= RECOMPUTE_LAST; policy++) {
      Arena *arena = arena_new();
      Diag *diag = diag_new(stderr);
      IrModule *m = lower_sample(arena, diag, samples[s], NULL, 0, 2, NULL);
      EXPECT(m != NULL);
      if (m && policy >= 0) {
        /* a training step: forward + backward graphs, then fused */
        const char *why = NULL;
        AdResult *ad = ad_build(m, (Recompute)policy, &why);
        if (!ad) fprintf(stderr, "%s: autodiff: %s\n", samples[s], why ? why : "?");
        EXPECT(ad != NULL);
        EXPECT(ir_verify(m, stderr) == 0);
      }
      if (m) {
        FuseResult *r = fuse_module(arena, m);
        int problems = fuse_check(r, stderr);
        if (problems) fprintf(stderr, "%s (recompute %d): %d fusion problems\n", samples[s], policy, problems);
        EXPECT(problems == 0);
        check_totals(r);
        if (policy < 0 && !strcmp(samples[s], "gpt2-tiny.hpd")) {
          /* the block: 6 GEMMs with bias (+gelu), two layernorms (the
           * second with the residual add) and the attention, a kernel of
           * its own (flash: no score GEMMs, no softmax) */
          EXPECT(fuse_count(r, 1, FUSE_GEMM) == 6);
          EXPECT(fuse_count(r, 1, FUSE_ROW) == 2);
          EXPECT(fuse_count(r, 1, FUSE_LOOP) == 1);
          EXPECT(fuse_count(r, 1, FUSE_SPECIAL) == 1);
        }
      }
      diag_free(diag);
      arena_free(arena);
    }
  }
}

/* Fusion off (fuse_options(cuda, 0), `--fusion off`: PyTorch's eager mode):
 * over whole training steps, every loop and row kernel computes one node
 * (shape ops folded in as index maps aside), no GEMM has an epilogue but
 * the 16-bit store of the CUDA options, no bias gradient and no
 * cross-entropy pair joins a kernel; the FLOPs are kept, the bytes moved
 * are at least the fused program's, and the kernels more. */
static void test_eager(void) {
  static const char *const samples[] = {"mlp.hpd", "gpt2-tiny.hpd", "llama.hpd", "moe-tiny.hpd"};
  EXPECT(fuse_options(0, 1) == NULL && fuse_options(1, 1) == &FUSE_CUDA_OPTIONS);
  EXPECT(fuse_options(0, 0)->eager && fuse_options(1, 0)->eager && fuse_options(1, 0)->store16);
  EXPECT(!fuse_options(1, 0)->bias_grad && !fuse_options(1, 0)->ce_pair);
  for (size_t s = 0; s < sizeof samples / sizeof samples[0]; s++) {
    for (int cuda = 0; cuda <= 1; cuda++) {
      Arena *arena = arena_new();
      Diag *diag = diag_new(stderr);
      IrModule *m = lower_sample(arena, diag, samples[s], NULL, 0, 2, NULL);
      const char *why = NULL;
      EXPECT(m && ad_build(m, RECOMPUTE_SELECTIVE, &why));
      if (m) {
        FuseResult *fused = fuse_module_opts(arena, m, fuse_options(cuda, 1));
        FuseResult *eager = fuse_module_opts(arena, m, fuse_options(cuda, 0));
        EXPECT(fuse_check(eager, stderr) == 0);
        check_totals(eager);
        int kf = 0, ke = 0, computing = 0;
        double bf = 0, be = 0;
        for (int gi = 0; gi < m->ngraphs; gi++) {
          const FuseGraph *fe = &eager->graphs[gi], *ff = &fused->graphs[gi];
          kf += ff->nkernels;
          ke += fe->nkernels;
          bf += ff->bytes_read + ff->bytes_written;
          be += fe->bytes_read + fe->bytes_written;
          for (int k = 0; k < fe->nkernels; k++) {
            const FuseKernel *K = &fe->kernels[k];
            if (K->kind == FUSE_GEMM) {
              EXPECT((K->epilogue & ~FUSE_EPI_CAST) == 0 && K->bgrad < 0);
              if (!cuda) EXPECT(K->epilogue == 0);
            }
            if (K->kind != FUSE_LOOP && K->kind != FUSE_ROW) continue;
            int ops = 0;
            for (int j = 0; j < K->nnodes; j++)
              ops += !(ir_op_flags(fe->graph->nodes[K->nodes[j]].op) & IRF_SHAPE);
            if (ops != 1) fprintf(stderr, "%s graph %d kernel %d: %d ops under fusion off\n", samples[s], gi, k, ops);
            EXPECT(ops == 1);
            computing++;
          }
        }
        EXPECT(ke > kf && be >= bf && computing > 0);
      }
      diag_free(diag);
      arena_free(arena);
    }
  }
}

/* The printed form is stable: printing twice gives the same text. */
static void test_print(void) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  IrModule *m = lower_sample(arena, diag, "mlp.hpd", NULL, 0, 0, NULL);
  EXPECT(m != NULL);
  if (m) {
    FuseResult *r = fuse_module(arena, m);
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FILE *fa = open_memstream(&a, &na), *fb = open_memstream(&b, &nb);
    fuse_print(r, fa);
    fuse_print(fuse_module(arena, m), fb);
    fclose(fa);
    fclose(fb);
    EXPECT(na == nb && !memcmp(a, b, na));
    EXPECT(strstr(a, "gemm+bias+relu f32[64, 64] [%2 matmul, %4 add, %5 relu] (%0, %1, %3) -> (%5)") != NULL);
    free(a);
    free(b);
  }
  diag_free(diag);
  arena_free(arena);
}

static char *print_fused(const FuseResult *r) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fuse_print(r, f);
  fclose(f);
  return text;
}

/* The cache (the planner's): a module fused through it prints as fused
 * without it, whether its graphs were found or fused; the same module
 * again is found graph by graph; another micro batch is not (its shapes
 * differ) except for graphs it leaves alike; a policy's layer forward and
 * its training step are found when another policy fused them - the step's
 * callees differ, and its CALL kernels' figures (printed) are this
 * module's. */
static void test_cache(void) {
  static const char *const samples[] = {"mlp.hpd", "gpt2-tiny.hpd", "llama.hpd"};
  FuseCache *cache = fuse_cache_new();
  int64_t fused = 0, found = 0, graphs = 0;
  for (size_t s = 0; s < sizeof samples / sizeof samples[0]; s++) {
    for (int micro = 1; micro <= 2; micro++) {
      for (int policy = RECOMPUTE_NONE; policy <= RECOMPUTE_LAST; policy++) {
        for (int again = 0; again < 2; again++) {
          Arena *arena = arena_new();
          Diag *diag = diag_new(stderr);
          IrModule *m = lower_sample(arena, diag, samples[s], NULL, 0, micro, NULL);
          const char *why = NULL;
          EXPECT(m && ad_build(m, (Recompute)policy, &why));
          if (m) {
            int64_t f0, n0;
            fuse_cache_counts(cache, &f0, &n0);
            char *plain = print_fused(fuse_module(arena, m));
            FuseResult *r = fuse_module_cached(arena, m, NULL, cache);
            char *cached = print_fused(r);
            EXPECT(!strcmp(plain, cached));
            EXPECT(fuse_check(r, stderr) == 0);
            fuse_cache_counts(cache, &fused, &found);
            EXPECT(fused - f0 + found - n0 == m->ngraphs);
            if (again) EXPECT(found - n0 == m->ngraphs); /* every graph again */
            if (!again && policy > RECOMPUTE_NONE) EXPECT(found - n0 >= 2); /* the forward and the step, at least */
            graphs += m->ngraphs;
            free(plain);
            free(cached);
          }
          diag_free(diag);
          arena_free(arena);
        }
      }
    }
  }
  EXPECT(fused + found == graphs);
  EXPECT(found > graphs / 2);
  /* options are part of the content */
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  IrModule *m = lower_sample(arena, diag, "mlp.hpd", NULL, 0, 1, NULL);
  const char *why = NULL;
  EXPECT(m && ad_build(m, RECOMPUTE_NONE, &why));
  if (m) {
    int64_t f0, f1;
    fuse_cache_counts(cache, &f0, NULL);
    FuseOptions o = {.bias_grad = 1};
    char *plain = print_fused(fuse_module_opts(arena, m, &o));
    char *cached = print_fused(fuse_module_cached(arena, m, &o, cache));
    fuse_cache_counts(cache, &f1, NULL);
    EXPECT(f1 - f0 == m->ngraphs);
    EXPECT(!strcmp(plain, cached));
    free(plain);
    free(cached);
    /* and fusion off is other content than on */
    plain = print_fused(fuse_module_opts(arena, m, fuse_options(0, 0)));
    cached = print_fused(fuse_module_cached(arena, m, fuse_options(0, 0), cache));
    int64_t f2;
    fuse_cache_counts(cache, &f2, NULL);
    EXPECT(f2 - f1 == m->ngraphs);
    EXPECT(!strcmp(plain, cached));
    free(plain);
    free(cached);
  }
  diag_free(diag);
  arena_free(arena);
  fuse_cache_free(cache);
}

int main(void) {
  test_cache();
  test_layernorm();
  test_rmsnorm_softmax();
  test_gemm_epilogue();
  test_gemm_epilogue_refused();
  test_bias_grad();
  test_store16();
  test_ce_pair();
  test_attn_qkv();
  test_diamond();
  test_siblings();
  test_reduction_into_gemm();
  test_row_consistency();
  test_shape_ops();
  test_check_catches();
  test_print();
  test_models();
  test_eager();
  TEST_DONE();
}
