/* test_autodiff.c - every gradient rule against central finite differences
 * in fp64, whole models (gpt2-tiny, a tiny llama) parameter by parameter,
 * recompute policies giving the same gradients, micro-batch accumulation,
 * and the verifier on every backward graph. */
#include "autodiff.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "interp.h"
#include "ir.h"
#include "loader.h"
#include "lower.h"
#include "sema.h"
#include "test_util.h"

/* ---- building small modules by hand ---- */

typedef struct {
  Arena *arena;
  IrModule *m;
  IrGraph *g;
  double *input_data[8]; /* values for the model inputs, set before runs */
} Mod;

static Mod mod_new(void) {
  Mod M;
  memset(&M, 0, sizeof M);
  M.arena = arena_new();
  M.m = ir_module_new(M.arena);
  M.m->micro_batch = 1;
  M.m->inputs = arena_alloc(M.arena, sizeof(IrInput) * 8);
  M.g = ir_graph_new(M.m, "forward");
  return M;
}

static void mod_free(Mod *M) {
  for (int i = 0; i < 8; i++) free(M->input_data[i]);
  arena_free(M->arena);
}

static int add(IrGraph *g, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double f, DType dt,
               int rank, const int64_t *dims) {
  const char *why = NULL;
  int id = ir_add(g, op, in, nin, attr, nattr, f, dt, rank, dims, &why);
  if (id < 0) fprintf(stderr, "ir_add %s: %s\n", ir_op_name(op), why);
  EXPECT(id >= 0);
  return id;
}

static int op1(Mod *M, IrOp op, int a) { return add(M->g, op, &a, 1, NULL, 0, 0, DT_F32, -1, NULL); }
static int op2(Mod *M, IrOp op, int a, int b) {
  int in[2] = {a, b};
  return add(M->g, op, in, 2, NULL, 0, 0, DT_F32, -1, NULL);
}

/* A parameter of `g` (copies: `count`) initialised normal(0, 1) or
 * uniform(lo, hi) when lo < hi. */
static int param_in(Mod *M, IrGraph *g, int gi, int64_t count, const char *name, double lo, double hi, int rank, ...) {
  IrParam p;
  memset(&p, 0, sizeof p);
  p.name = arena_strdup(M->arena, name);
  p.dtype = DT_F32;
  p.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) p.dims[i] = va_arg(ap, int64_t);
  va_end(ap);
  p.init.kind = lo < hi ? INIT_UNIFORM : INIT_NORMAL;
  p.init.a = lo < hi ? lo : 0.0;
  p.init.b = lo < hi ? hi : 1.0;
  p.graph = gi;
  p.count = count;
  int64_t index = ir_add_param(M->m, &p);
  return add(g, IR_PARAM, NULL, 0, &index, 1, 0, DT_F32, rank, p.dims);
}

#define PARAM(M, name, ...) param_in(M, (M)->g, 0, 1, name, 0, 0, __VA_ARGS__)
#define PARAM_POS(M, name, ...) param_in(M, (M)->g, 0, 1, name, 0.5, 2.0, __VA_ARGS__)

/* A model input with deterministic values: floats in [-1, 1), or integers
 * in [0, modulus) when modulus > 0. */
static int input(Mod *M, DType dt, int64_t modulus, int rank, ...) {
  int k = M->m->ninputs++;
  IrInput *in = &M->m->inputs[k];
  in->name = arena_printf(M->arena, "in%d", k);
  in->dtype = dt;
  in->rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) in->dims[i] = va_arg(ap, int64_t);
  va_end(ap);
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= in->dims[i];
  M->input_data[k] = calloc((size_t)n, sizeof(double));
  uint64_t st = interp_hash_name(99, in->name, 0);
  for (int64_t i = 0; i < n; i++)
    M->input_data[k][i] = modulus > 0 ? (double)(int64_t)(interp_uniform01(&st) * (double)modulus)
                                      : 2.0 * interp_uniform01(&st) - 1.0;
  int64_t index = k;
  return add(M->g, IR_INPUT, NULL, 0, &index, 1, 0, dt, rank, in->dims);
}

/* loss = sum(y * R) with R a fixed random input, so every output element
 * carries a different weight. */
static void finish_weighted(Mod *M, int y) {
  IrNode *n = &M->g->nodes[y];
  int rank = n->rank;
  int64_t dims[IR_MAX_RANK], total = ir_numel(n);
  memcpy(dims, n->dims, sizeof dims);
  int r;
  switch (rank) {
  case 0: r = input(M, DT_F32, 0, 0); break;
  case 1: r = input(M, DT_F32, 0, 1, dims[0]); break;
  case 2: r = input(M, DT_F32, 0, 2, dims[0], dims[1]); break;
  case 3: r = input(M, DT_F32, 0, 3, dims[0], dims[1], dims[2]); break;
  default: r = input(M, DT_F32, 0, 4, dims[0], dims[1], dims[2], dims[3]); break;
  }
  int prod = op2(M, IR_MUL, y, r);
  int flat = add(M->g, IR_RESHAPE, &prod, 1, NULL, 0, 0, DT_F32, 1, &total);
  int64_t attr[2] = {0, 0};
  int loss = add(M->g, IR_REDUCE_SUM, &flat, 1, attr, 2, 0, DT_F32, -1, NULL);
  M->g->outputs = arena_alloc(M->arena, sizeof(int));
  M->g->outputs[0] = loss;
  M->g->noutputs = 1;
}

/* ---- finite differences ---- */

/* d loss / d value by the sixth-order central difference: its truncation
 * error (h^6) is far below the rounding noise of the loss (~1e-15 relative)
 * divided by h, so neither limits a 1e-6 comparison. */
static double fd_grad(Interp *in, double *value, double h) {
  static const double w[3] = {45.0, -9.0, 1.0};
  double x = *value, s = 0;
  for (int k = 1; k <= 3; k++) {
    *value = x + k * h;
    double p = interp_loss(in);
    *value = x - k * h;
    double m = interp_loss(in);
    s += w[k - 1] * (p - m);
  }
  *value = x;
  return s / (60.0 * h);
}

static double worst_rel;
static const char *worst_what = "";
static const char *current_what = "";

/* Relative 1e-6, with an absolute floor at the rounding noise of the finite
 * differences (the loss's last bits over h); the reported worst error is
 * over gradients well above that floor. */
static int close_enough(double g, double fd, double rel, double abs_floor) {
  double err = fabs(g - fd), scale = fmax(fabs(g), fabs(fd));
  if (scale > 1e6 * abs_floor && err / scale > worst_rel) {
    worst_rel = err / scale;
    worst_what = current_what;
  }
  return err <= rel * scale + abs_floor;
}

static void set_inputs(Mod *M, Interp *in) {
  for (int i = 0; i < M->m->ninputs; i++) interp_set_input(in, i, M->input_data[i]);
}

static int gradient_checks;

/* Differentiates M, runs one step and compares every entry of every
 * parameter (every copy) with finite differences. */
/* ad_build_layers' layers for check_module (0: every layer) */
static int64_t check_layers = 0;

static void check_module(Mod *M, const char *what, Recompute policy, double h) {
  const char *err = NULL;
  current_what = what;
  EXPECT(ir_verify(M->m, stderr) == 0);
  AdResult *r = ad_build_layers(M->m, policy, check_layers, &err);
  if (!r) {
    fprintf(stderr, "%s: ad_build: %s\n", what, err);
    EXPECT(r != NULL);
    return;
  }
  EXPECT(ir_verify(M->m, stderr) == 0);
  Interp *in = interp_new(M->m);
  interp_init_params(in, 1234);
  set_inputs(M, in);
  interp_zero_grads(in);
  double loss = ad_step(in, r, 1.0, &err);
  if (isnan(loss)) fprintf(stderr, "%s: step failed: %s\n", what, err ? err : "(nan loss)");
  EXPECT(!isnan(loss));
  EXPECT_NEAR(loss, interp_loss(in), 1e-12);
  for (int p = 0; p < M->m->nparams; p++) {
    int64_t copies = M->m->params[p].count > 1 ? M->m->params[p].count : 1;
    for (int64_t l = 0; l < copies; l++) {
      int64_t n = 0;
      double *v = interp_param(in, p, l, &n);
      double *g = interp_grad(in, p, l, NULL);
      EXPECT(g != NULL);
      if (!g) continue;
      for (int64_t k = 0; k < n; k++) {
        double fd = fd_grad(in, &v[k], h);
        gradient_checks++;
        if (!close_enough(g[k], fd, 1e-6, 1e-10)) {
          fprintf(stderr, "%s: d/d %s[%" PRId64 "] copy %" PRId64 ": autodiff %.12g, finite differences %.12g\n", what,
                  M->m->params[p].name, k, l, g[k], fd);
          test_failures++;
        }
      }
    }
  }
  interp_free(in);
}

/* ---- one test per op ---- */

static int ops_tested[IR_OP_COUNT];

static void done(Mod *M, int y, const char *what, IrOp op) {
  finish_weighted(M, y);
  check_module(M, what, RECOMPUTE_NONE, 1e-3);
  ops_tested[op]++;
  mod_free(M);
}

static void test_unary(void) {
  static const IrOp any[] = {IR_NEG, IR_RELU, IR_GELU, IR_SILU, IR_SIGMOID, IR_TANH, IR_EXP, IR_ABS, IR_SQUARE};
  for (size_t i = 0; i < sizeof any / sizeof any[0]; i++) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
    done(&M, op1(&M, any[i], x), ir_op_name(any[i]), any[i]);
  }
  static const IrOp pos[] = {IR_LOG, IR_SQRT, IR_RSQRT};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
    Mod M = mod_new();
    int x = PARAM_POS(&M, "x", 2, (int64_t)3, (int64_t)4);
    done(&M, op1(&M, pos[i], x), ir_op_name(pos[i]), pos[i]);
  }
  double exps[] = {2.5, -1.5, 3.0};
  for (size_t i = 0; i < 3; i++) {
    Mod M = mod_new();
    int x = PARAM_POS(&M, "x", 1, (int64_t)5);
    done(&M, add(M.g, IR_POWS, &x, 1, NULL, 0, exps[i], DT_F32, -1, NULL), "pow", IR_POWS);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
    done(&M, add(M.g, IR_CAST, &x, 1, NULL, 0, 0, DT_F64, -1, NULL), "cast", IR_CAST);
  }
}

/* ACT_GRAD is differentiable in both inputs (second derivatives) */
static void test_act_grad(void) {
  static const IrOp ops[] = {IR_NEG,  IR_RELU, IR_GELU, IR_SILU,   IR_SIGMOID, IR_TANH, IR_EXP,
                             IR_LOG,  IR_SQRT, IR_RSQRT, IR_ABS,   IR_SQUARE,  IR_POWS, IR_CAST};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    int positive = ops[i] == IR_LOG || ops[i] == IR_SQRT || ops[i] == IR_RSQRT || ops[i] == IR_POWS;
    Mod M = mod_new();
    int x = param_in(&M, M.g, 0, 1, "x", positive ? 0.5 : 0, positive ? 2.0 : 0, 2, (int64_t)3, (int64_t)4);
    int dy = PARAM(&M, "dy", 2, (int64_t)3, (int64_t)4);
    int in[2] = {x, dy};
    int64_t attr = ops[i];
    int y = add(M.g, IR_ACT_GRAD, in, 2, &attr, 1, 2.5, DT_F32, -1, NULL);
    char what[64];
    snprintf(what, sizeof what, "act_grad %s", ir_op_name(ops[i]));
    done(&M, y, what, IR_ACT_GRAD);
  }
}

static void test_binary(void) {
  static const IrOp ops[] = {IR_ADD, IR_SUB, IR_MUL, IR_DIV, IR_MAXIMUM, IR_MINIMUM};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    /* shapes: same, broadcast of b ([3,1] against [2,3,4]), broadcast of a */
    for (int shape = 0; shape < 3; shape++) {
      Mod M = mod_new();
      int a, b;
      if (shape == 0) a = PARAM(&M, "a", 2, (int64_t)3, (int64_t)4);
      else if (shape == 1) a = PARAM(&M, "a", 3, (int64_t)2, (int64_t)3, (int64_t)4);
      else a = PARAM(&M, "a", 1, (int64_t)4);
      double lo = ops[i] == IR_DIV ? 0.5 : 0, hi = ops[i] == IR_DIV ? 2.0 : 0;
      if (shape == 0) b = param_in(&M, M.g, 0, 1, "b", lo, hi, 2, (int64_t)3, (int64_t)4);
      else if (shape == 1) b = param_in(&M, M.g, 0, 1, "b", lo, hi, 2, (int64_t)3, (int64_t)1);
      else b = param_in(&M, M.g, 0, 1, "b", lo, hi, 3, (int64_t)2, (int64_t)3, (int64_t)4);
      char what[64];
      snprintf(what, sizeof what, "%s shape %d", ir_op_name(ops[i]), shape);
      done(&M, op2(&M, ops[i], a, b), what, ops[i]);
    }
  }
  /* a value used twice: gradients add */
  Mod M = mod_new();
  int a = PARAM(&M, "a", 2, (int64_t)3, (int64_t)4);
  done(&M, op2(&M, IR_MUL, a, a), "mul a a", IR_MUL);
}

static void test_matmul(void) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int batch = 0; batch < 3; batch++) {
        Mod M = mod_new();
        int a, b;
        /* batch 0: [2,3,4] x [4,5]; 1: [3,4] x [2,4,5]; 2: [2,1,3,4] x [3,4,5] */
        int64_t m = 3, k = 4, n = 5;
        int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
        if (batch == 0) a = PARAM(&M, "a", 3, (int64_t)2, ar, ac);
        else if (batch == 1) a = PARAM(&M, "a", 2, ar, ac);
        else a = PARAM(&M, "a", 4, (int64_t)2, (int64_t)1, ar, ac);
        if (batch == 0) b = PARAM(&M, "b", 2, br, bc);
        else if (batch == 1) b = PARAM(&M, "b", 3, (int64_t)2, br, bc);
        else b = PARAM(&M, "b", 3, (int64_t)3, br, bc);
        int in[2] = {a, b};
        int64_t attr[2] = {ta, tb};
        char what[64];
        snprintf(what, sizeof what, "matmul ta=%d tb=%d batch %d", ta, tb, batch);
        done(&M, add(M.g, IR_MATMUL, in, 2, attr, 2, 0, DT_F32, -1, NULL), what, IR_MATMUL);
      }
}

static void test_reductions(void) {
  static const IrOp ops[] = {IR_REDUCE_SUM, IR_REDUCE_MEAN, IR_REDUCE_MAX};
  for (size_t i = 0; i < 3; i++)
    for (int axis = 0; axis < 3; axis++)
      for (int keep = 0; keep < 2; keep++) {
        Mod M = mod_new();
        int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
        int64_t attr[2] = {axis, keep};
        char what[64];
        snprintf(what, sizeof what, "%s axis %d keep %d", ir_op_name(ops[i]), axis, keep);
        done(&M, add(M.g, ops[i], &x, 1, attr, 2, 0, DT_F32, -1, NULL), what, ops[i]);
      }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)1);
    int64_t dims[3] = {2, 3, 4};
    done(&M, add(M.g, IR_EXPAND, &x, 1, NULL, 0, 0, DT_F32, 3, dims), "expand", IR_EXPAND);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int64_t dims[2] = {3, 1};
    done(&M, add(M.g, IR_SUM_TO, &x, 1, NULL, 0, 0, DT_F32, 2, dims), "sum_to", IR_SUM_TO);
  }
}

static void test_softmax(void) {
  for (int axis = 1; axis < 3; axis++) {
    static const IrOp ops[] = {IR_SOFTMAX, IR_LOG_SOFTMAX};
    for (int i = 0; i < 2; i++) {
      Mod M = mod_new();
      int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
      int64_t attr = axis;
      done(&M, add(M.g, ops[i], &x, 1, &attr, 1, 0, DT_F32, -1, NULL), ir_op_name(ops[i]), ops[i]);
    }
    static const IrOp bwd[] = {IR_SOFTMAX_BWD, IR_LOG_SOFTMAX_BWD};
    for (int i = 0; i < 2; i++) {
      Mod M = mod_new();
      int y = PARAM(&M, "y", 3, (int64_t)2, (int64_t)3, (int64_t)4);
      int dy = PARAM(&M, "dy", 3, (int64_t)2, (int64_t)3, (int64_t)4);
      int in[2] = {y, dy};
      int64_t attr = axis;
      done(&M, add(M.g, bwd[i], in, 2, &attr, 1, 0, DT_F32, -1, NULL), ir_op_name(bwd[i]), bwd[i]);
    }
  }
}

static void test_shape_ops(void) {
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int64_t dims[2] = {6, 4};
    done(&M, add(M.g, IR_RESHAPE, &x, 1, NULL, 0, 0, DT_F32, 2, dims), "reshape", IR_RESHAPE);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int64_t perm[3] = {2, 0, 1};
    done(&M, add(M.g, IR_TRANSPOSE, &x, 1, perm, 3, 0, DT_F32, -1, NULL), "transpose", IR_TRANSPOSE);
  }
  {
    /* x[1, 1:3, 2:5]: axis 0 dropped */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)3, (int64_t)4, (int64_t)5);
    int64_t attr[16] = {1, 1, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, dims[2] = {2, 3};
    done(&M, add(M.g, IR_SLICE, &x, 1, attr, 16, 0, DT_F32, 2, dims), "slice", IR_SLICE);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)2, (int64_t)3);
    int64_t attr[8] = {1, 2}, dims[2] = {4, 6};
    done(&M, add(M.g, IR_PAD, &x, 1, attr, 8, 0, DT_F32, 2, dims), "pad", IR_PAD);
  }
  {
    Mod M = mod_new();
    int a = PARAM(&M, "a", 2, (int64_t)2, (int64_t)3);
    int b = PARAM(&M, "b", 2, (int64_t)2, (int64_t)2);
    int c = PARAM(&M, "c", 2, (int64_t)2, (int64_t)1);
    int in[3] = {a, b, c};
    int64_t axis = 1;
    done(&M, add(M.g, IR_CONCAT, in, 3, &axis, 1, 0, DT_F32, -1, NULL), "concat", IR_CONCAT);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)2, (int64_t)3, (int64_t)2);
    int64_t n = 2;
    done(&M, add(M.g, IR_REPEAT_KV, &x, 1, &n, 1, 0, DT_F32, -1, NULL), "repeat_kv", IR_REPEAT_KV);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)4, (int64_t)3, (int64_t)2);
    int64_t n = 2;
    done(&M, add(M.g, IR_REPEAT_KV_BWD, &x, 1, &n, 1, 0, DT_F32, -1, NULL), "repeat_kv_bwd", IR_REPEAT_KV_BWD);
  }
}

static void test_model_ops(void) {
  {
    Mod M = mod_new();
    int t = PARAM(&M, "table", 2, (int64_t)5, (int64_t)3);
    int ids = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)4);
    done(&M, op2(&M, IR_EMBEDDING, t, ids), "embedding", IR_EMBEDDING);
  }
  {
    Mod M = mod_new();
    int dy = PARAM(&M, "dy", 3, (int64_t)2, (int64_t)4, (int64_t)3);
    int ids = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)4);
    int in[2] = {dy, ids};
    int64_t dims[2] = {5, 3};
    done(&M, add(M.g, IR_EMBEDDING_BWD, in, 2, NULL, 0, 0, DT_F32, 2, dims), "embedding_bwd", IR_EMBEDDING_BWD);
  }
  {
    /* a finite fill, so the loss stays finite; masked entries have gradient 0 */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)4, (int64_t)4);
    done(&M, add(M.g, IR_CAUSAL_MASK, &x, 1, NULL, 0, -2.0, DT_F32, -1, NULL), "causal_mask", IR_CAUSAL_MASK);
  }
  {
    /* the padding of a vocabulary of 5 (of 7 columns): a finite fill, no gradient through it */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)7);
    int64_t attr[2] = {0, 5};
    done(&M, add(M.g, IR_VOCAB_MASK, &x, 1, attr, 2, -3.0, DT_F32, -1, NULL), "vocab_mask", IR_VOCAB_MASK);
  }
  for (int inverse = 0; inverse < 2; inverse++) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)2, (int64_t)3, (int64_t)4);
    int64_t attr = inverse;
    done(&M, add(M.g, IR_ROPE, &x, 1, &attr, 1, 10.0, DT_F32, -1, NULL), "rope", IR_ROPE);
  }
  for (int truncate = 0; truncate < 2; truncate++) {
    /* YaRN's frequencies (D = 8: the ramp falls between pairs 1 and 3 over an
     * original 16 positions at base 10), the inverse rotation its adjoint too */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)2, (int64_t)5, (int64_t)8);
    int64_t attr[8] = {0};
    ir_rope_set_yarn(attr, 4.0, 4.0, 0.5, 16, truncate);
    done(&M, add(M.g, IR_ROPE, &x, 1, attr, 8, 10.0, DT_F32, -1, NULL), truncate ? "rope yarn truncated" : "rope yarn",
         IR_ROPE);
  }
  {
    Mod M = mod_new();
    int l = PARAM(&M, "logits", 3, (int64_t)2, (int64_t)3, (int64_t)5);
    int t = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)3);
    done(&M, op2(&M, IR_CROSS_ENTROPY, l, t), "cross_entropy", IR_CROSS_ENTROPY);
  }
  for (int rows = 0; rows < 2; rows++) {
    /* the head fused with its loss: x [2, 3, 4] and a weight [4, 5], or a table [5, 4] */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int w = rows ? PARAM(&M, "w", 2, (int64_t)5, (int64_t)4) : PARAM(&M, "w", 2, (int64_t)4, (int64_t)5);
    int t = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)3);
    int in[3] = {x, w, t};
    int64_t attr = rows;
    done(&M, add(M.g, IR_LINEAR_CE, in, 3, &attr, 1, 0, DT_F32, -1, NULL), rows ? "linear_ce table" : "linear_ce", IR_LINEAR_CE);
  }
  for (int rows = 0; rows < 2; rows++) {
    /* its vocab-parallel form: each row's log-sum-exp over the first 4 of 5 columns (the 5th padding) */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int w = rows ? PARAM(&M, "w", 2, (int64_t)5, (int64_t)4) : PARAM(&M, "w", 2, (int64_t)4, (int64_t)5);
    int in[2] = {x, w};
    int64_t attr[3] = {rows, 0, 4};
    done(&M, add(M.g, IR_LINEAR_LSE, in, 2, attr, 3, 0, DT_F32, -1, NULL), rows ? "linear_lse table" : "linear_lse", IR_LINEAR_LSE);
  }
  {
    Mod M = mod_new();
    int l = PARAM(&M, "logits", 3, (int64_t)2, (int64_t)3, (int64_t)5);
    int t = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)3);
    int dl = PARAM(&M, "dloss", 0);
    int in[3] = {l, t, dl};
    done(&M, add(M.g, IR_CROSS_ENTROPY_BWD, in, 3, NULL, 0, 0, DT_F32, -1, NULL), "cross_entropy_bwd",
         IR_CROSS_ENTROPY_BWD);
  }
  for (int k = 0; k < 2; k++) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)4, (int64_t)5);
    int64_t stream = 3;
    done(&M, add(M.g, IR_DROPOUT, &x, 1, &stream, 1, k ? 0.3 : 0.0, DT_F32, -1, NULL), "dropout", IR_DROPOUT);
  }
}

/* Single-rank collectives and a SEND / RECV pair through the loopback. */
static void test_comm(void) {
  static const IrOp ops[] = {IR_ALL_REDUCE, IR_ALL_GATHER, IR_REDUCE_SCATTER};
  for (int i = 0; i < 3; i++) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
    int64_t attr[2] = {IRG_TP, 1};
    int y = op1(&M, IR_SQUARE, x);
    int dims_given = ops[i] != IR_ALL_REDUCE;
    int64_t dims[2] = {3, 4};
    done(&M, add(M.g, ops[i], &y, 1, attr, 2, 0, DT_F32, dims_given ? 2 : -1, dims), ir_op_name(ops[i]), ops[i]);
  }
  /* the partitioner's markers, single rank (groups of one): shard_slice
   * and copy_to_group are identities whose gradients are gather / all-reduce */
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
    int64_t attr[3] = {IRG_CP, 1, 1}, dims[2] = {3, 4};
    int y = op1(&M, IR_SQUARE, x);
    done(&M, add(M.g, IR_SHARD_SLICE, &y, 1, attr, 3, 0, DT_F32, 2, dims), "shard_slice", IR_SHARD_SLICE);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
    int64_t attr[1] = {IRG_TP};
    int y = op1(&M, IR_TANH, x);
    done(&M, add(M.g, IR_COPY_TO_GROUP, &y, 1, attr, 1, 0, DT_F32, -1, NULL), "copy_to_group", IR_COPY_TO_GROUP);
  }
  {
    /* expert parallelism's exchange, a group of one: an identity whose
     * gradient is the exchange with the axes swapped (test_layouts runs it
     * over 2 and 4 ranks) */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)4, (int64_t)3);
    int64_t attr[3] = {IRG_EP, 1, 0}, dims[3] = {2, 4, 3};
    int y = op1(&M, IR_TANH, x);
    done(&M, add(M.g, IR_ALL_TO_ALL, &y, 1, attr, 3, 0, DT_F32, 3, dims), "all_to_all", IR_ALL_TO_ALL);
  }
  {
    Mod M = mod_new();
    int z = PARAM(&M, "z", 3, (int64_t)2, (int64_t)3, (int64_t)5);
    int t = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)3);
    done(&M, op2(&M, IR_PICK, z, t), "pick", IR_PICK);
  }
  {
    Mod M = mod_new();
    int dy = PARAM(&M, "dy", 2, (int64_t)2, (int64_t)3);
    int t = input(&M, DT_I32, 5, 2, (int64_t)2, (int64_t)3);
    int in[2] = {dy, t};
    int64_t dims[3] = {2, 3, 5};
    done(&M, add(M.g, IR_PICK_BWD, in, 2, NULL, 0, 0, DT_F32, 3, dims), "pick_bwd", IR_PICK_BWD);
  }
  Mod M = mod_new();
  int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
  int64_t attr[2] = {IRG_PP, 1}, dims[2] = {3, 4};
  int s = add(M.g, IR_SEND, &x, 1, attr, 2, 0, DT_F32, 2, dims);
  (void)s;
  int r = add(M.g, IR_RECV, NULL, 0, attr, 2, 0, DT_F32, 2, dims);
  int y = op1(&M, IR_TANH, r);
  ops_tested[IR_SEND]++;
  done(&M, y, "send/recv", IR_RECV);
}

/* The router's ops (issue 13): take and its scatter-add, topk's values as
 * take(x, topk(x)), and one_hot (no gradient of its own) inside Switch
 * Transformer's load-balancing product. */
static void test_router(void) {
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)3, (int64_t)5);
    int idx = input(&M, DT_I32, 5, 3, (int64_t)2, (int64_t)3, (int64_t)4); /* repeats: the scatter adds */
    int in[2] = {x, idx};
    done(&M, add(M.g, IR_TAKE, in, 2, NULL, 0, 0, DT_F32, -1, NULL), "take", IR_TAKE);
  }
  {
    Mod M = mod_new();
    int dy = PARAM(&M, "dy", 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int idx = input(&M, DT_I32, 5, 3, (int64_t)2, (int64_t)3, (int64_t)4);
    int in[2] = {dy, idx};
    int64_t dims[3] = {2, 3, 5};
    done(&M, add(M.g, IR_TAKE_BWD, in, 2, NULL, 0, 0, DT_F32, 3, dims), "take_bwd", IR_TAKE_BWD);
  }
  for (int64_t k = 1; k <= 6; k += 2) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)6);
    int t = add(M.g, IR_TOPK, &x, 1, &k, 1, 0, DT_I32, -1, NULL);
    int in[2] = {x, t};
    ops_tested[IR_TOPK]++;
    done(&M, add(M.g, IR_TAKE, in, 2, NULL, 0, 0, DT_F32, -1, NULL), "topk values", IR_TAKE);
  }
  {
    /* aux = sum_e (slots routed to e) * softmax(x)_e per row: the gradient
     * flows through the probabilities only */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 2, (int64_t)4, (int64_t)5);
    int64_t ax[2] = {1, 0}, k = 2, n = 5;
    int p = add(M.g, IR_SOFTMAX, &x, 1, ax, 1, 0, DT_F32, -1, NULL);
    int t = add(M.g, IR_TOPK, &p, 1, &k, 1, 0, DT_I32, -1, NULL);
    int oh = add(M.g, IR_ONE_HOT, &t, 1, &n, 1, 0, DT_F32, -1, NULL);
    int routed = add(M.g, IR_REDUCE_SUM, &oh, 1, ax, 2, 0, DT_F32, -1, NULL);
    done(&M, op2(&M, IR_MUL, routed, p), "one_hot load balance", IR_ONE_HOT);
  }
}

/* Mixture of experts (issue 13): dispatch, combine and the gate gradient,
 * each with every float input a parameter, over B = 2 sequences of T = 5
 * tokens choosing K = 2 of E = 3 experts with 2 slots each (so some choices
 * are dropped, and a token may choose one expert twice: random choices). */
static void test_moe(void) {
  int64_t mattr[3] = {3, 2, 2};
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)5, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int w = PARAM(&M, "w", 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {x, idx, w};
    done(&M, add(M.g, IR_MOE_DISPATCH, in, 3, mattr, 3, 0, DT_F32, -1, NULL), "moe_dispatch", IR_MOE_DISPATCH);
  }
  {
    Mod M = mod_new();
    int y = PARAM(&M, "y", 4, (int64_t)2, (int64_t)3, (int64_t)2, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int w = PARAM(&M, "w", 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {y, idx, w};
    done(&M, add(M.g, IR_MOE_COMBINE, in, 3, NULL, 0, 0, DT_F32, -1, NULL), "moe_combine", IR_MOE_COMBINE);
  }
  {
    Mod M = mod_new();
    int a = PARAM(&M, "a", 3, (int64_t)2, (int64_t)5, (int64_t)3);
    int y = PARAM(&M, "y", 4, (int64_t)2, (int64_t)3, (int64_t)2, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {a, y, idx};
    done(&M, add(M.g, IR_MOE_GATE_GRAD, in, 3, NULL, 0, 0, DT_F32, -1, NULL), "moe_gate_grad", IR_MOE_GATE_GRAD);
  }
  /* the dropless packed form (moepack.c): the 20 choices' rows sorted by expert */
  int64_t pattr[3] = {3, 0, 0};
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)5, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int w = PARAM(&M, "w", 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {x, idx, w};
    done(&M, add(M.g, IR_MOE_DISPATCH, in, 3, pattr, 3, 0, DT_F32, -1, NULL), "moe_dispatch packed", IR_MOE_DISPATCH);
  }
  {
    Mod M = mod_new();
    int y = PARAM(&M, "y", 2, (int64_t)20, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int w = PARAM(&M, "w", 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {y, idx, w};
    done(&M, add(M.g, IR_MOE_COMBINE, in, 3, pattr, 1, 0, DT_F32, -1, NULL), "moe_combine packed", IR_MOE_COMBINE);
  }
  {
    Mod M = mod_new();
    int a = PARAM(&M, "a", 3, (int64_t)2, (int64_t)5, (int64_t)3);
    int y = PARAM(&M, "y", 2, (int64_t)20, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int in[3] = {a, y, idx};
    done(&M, add(M.g, IR_MOE_GATE_GRAD, in, 3, pattr, 1, 0, DT_F32, -1, NULL), "moe_gate_grad packed", IR_MOE_GATE_GRAD);
  }
  /* grouped_mm over unsorted ids (runs of one row), w plain and transposed */
  for (int t = 0; t < 2; t++) {
    Mod M = mod_new();
    int a = PARAM(&M, "a", 2, (int64_t)7, (int64_t)3);
    int w = t ? PARAM(&M, "w", 3, (int64_t)3, (int64_t)4, (int64_t)3) : PARAM(&M, "w", 3, (int64_t)3, (int64_t)3, (int64_t)4);
    int ids = input(&M, DT_I32, 3, 1, (int64_t)7);
    int in[3] = {a, w, ids};
    int64_t ga[1] = {t};
    done(&M, add(M.g, IR_GROUPED_MM, in, 3, ga, 1, 0, DT_F32, -1, NULL), t ? "grouped_mm transposed" : "grouped_mm",
         IR_GROUPED_MM);
  }
  {
    /* a packed layer: dispatch, an expert GEMM over moe_expert_ids' sorted runs, combine */
    Mod M = mod_new();
    int x = PARAM(&M, "x", 3, (int64_t)2, (int64_t)5, (int64_t)3);
    int idx = input(&M, DT_I32, 3, 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int w = PARAM(&M, "w", 3, (int64_t)2, (int64_t)5, (int64_t)2);
    int we = PARAM(&M, "we", 3, (int64_t)3, (int64_t)3, (int64_t)3);
    int in[3] = {x, idx, w};
    int d = add(M.g, IR_MOE_DISPATCH, in, 3, pattr, 3, 0, DT_F32, -1, NULL);
    int ids = add(M.g, IR_MOE_EXPERT_IDS, &idx, 1, pattr, 1, 0, DT_I32, -1, NULL);
    int gin[3] = {d, we, ids}, zero = 0;
    int64_t ga[1] = {zero};
    int h = add(M.g, IR_GROUPED_MM, gin, 3, ga, 1, 0, DT_F32, -1, NULL);
    int cin[3] = {h, idx, w};
    done(&M, add(M.g, IR_MOE_COMBINE, cin, 3, pattr, 1, 0, DT_F32, -1, NULL), "packed expert layer", IR_MOE_EXPERT_IDS);
  }
}

/* Flash attention's packed output [o, lse] against finite differences of
 * the reference executor: the weighted loss reaches the log-sum-exp column
 * too, so the backward's d lse term is checked; grouped queries (4 heads
 * over 2 key heads), causal over T = S = 3 and not over S = 4 keys. */
/* Convolutional networks (issue 17): conv2d with strides, padding, dilation
 * and groups at odd sizes; its two gradients as ops of their own (each is
 * the others' adjoint); every pooling mode, and the average's backward. */
static int conv_case(Mod *M, IrOp op, int a, int b, const int64_t *attr) {
  int in[2] = {a, b};
  return add(M->g, op, in, 2, attr, CONV_NATTR, 0, DT_F32, -1, NULL);
}

static void test_conv(void) {
  /* {sh, sw, ph, pw, dh, dw, groups, H, W, KH, KW} */
  static const int64_t plain[CONV_NATTR] = {1, 2, 1, 0, 1, 1, 1, 5, 6, 3, 2};
  static const int64_t grouped[CONV_NATTR] = {2, 1, 2, 1, 2, 1, 2, 7, 6, 2, 3};
  static const int64_t depthwise[CONV_NATTR] = {1, 1, 1, 1, 1, 1, 3, 4, 5, 3, 3};
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)2, (int64_t)3, (int64_t)5, (int64_t)6);
    int w = PARAM(&M, "w", 4, (int64_t)4, (int64_t)3, (int64_t)3, (int64_t)2);
    done(&M, conv_case(&M, IR_CONV2D, x, w, plain), "conv2d stride 1x2 pad 1x0", IR_CONV2D);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)4, (int64_t)7, (int64_t)6);
    int w = PARAM(&M, "w", 4, (int64_t)6, (int64_t)2, (int64_t)2, (int64_t)3);
    done(&M, conv_case(&M, IR_CONV2D, x, w, grouped), "conv2d groups 2 dilation 2x1 stride 2x1", IR_CONV2D);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)2, (int64_t)3, (int64_t)4, (int64_t)5);
    int w = PARAM(&M, "w", 4, (int64_t)3, (int64_t)1, (int64_t)3, (int64_t)3);
    done(&M, conv_case(&M, IR_CONV2D, x, w, depthwise), "conv2d depthwise", IR_CONV2D);
  }
  {
    /* dy [1, 6, Ho, Wo]: Ho = (7 + 4 - 2 - 1) / 2 + 1 = 5, Wo = (6 + 2 - 2 - 1) + 1 = 6 */
    Mod M = mod_new();
    int dy = PARAM(&M, "dy", 4, (int64_t)1, (int64_t)6, (int64_t)5, (int64_t)6);
    int w = PARAM(&M, "w", 4, (int64_t)6, (int64_t)2, (int64_t)2, (int64_t)3);
    done(&M, conv_case(&M, IR_CONV2D_BWD_DATA, dy, w, grouped), "conv2d_bwd_data", IR_CONV2D_BWD_DATA);
  }
  {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)2, (int64_t)3, (int64_t)5, (int64_t)6);
    int dy = PARAM(&M, "dy", 4, (int64_t)2, (int64_t)4, (int64_t)5, (int64_t)3);
    done(&M, conv_case(&M, IR_CONV2D_BWD_FILTER, x, dy, plain), "conv2d_bwd_filter", IR_CONV2D_BWD_FILTER);
  }
  /* {mode, KH, KW, sh, sw, ph, pw} */
  static const int64_t pools[][POOL_NATTR] = {
      {POOL_MAX, 3, 3, 2, 2, 1, 1}, {POOL_MAX, 2, 3, 1, 2, 0, 1},   {POOL_AVG, 3, 2, 2, 1, 1, 1},
      {POOL_AVG, 2, 2, 2, 2, 0, 0}, {POOL_ADAPTIVE_AVG, 2, 3, 0, 0, 0, 0}, {POOL_ADAPTIVE_MAX, 3, 2, 0, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
    Mod M = mod_new();
    int x = PARAM(&M, "x", 4, (int64_t)2, (int64_t)2, (int64_t)5, (int64_t)7);
    int y = add(M.g, IR_POOL2D, &x, 1, pools[i], POOL_NATTR, 0, DT_F32, -1, NULL);
    finish_weighted(&M, y);
    /* a max moves only when two inputs of a window come within h: none of the
     * random inputs does at h = 1e-6 */
    check_module(&M, "pool2d", RECOMPUTE_NONE, pools[i][0] == POOL_MAX || pools[i][0] == POOL_ADAPTIVE_MAX ? 1e-6 : 1e-3);
    ops_tested[IR_POOL2D]++;
    mod_free(&M);
  }
  for (int adaptive = 0; adaptive < 2; adaptive++) {
    Mod M = mod_new();
    const int64_t *a = pools[adaptive ? 4 : 2];
    int64_t Ho = adaptive ? 2 : 3, Wo = adaptive ? 3 : 8;
    int x = input(&M, DT_F32, 0, 4, (int64_t)2, (int64_t)2, (int64_t)5, (int64_t)7);
    int dy = PARAM(&M, "dy", 4, (int64_t)2, (int64_t)2, Ho, Wo);
    int in[2] = {x, dy};
    done(&M, add(M.g, IR_POOL2D_BWD, in, 2, a, POOL_NATTR, 0, DT_F32, -1, NULL), "pool2d_bwd avg", IR_POOL2D_BWD);
  }
}

/* STATE_UPDATE (batch norm's running statistics): x passes through to the
 * loss, the state parameter s takes 0.5 s + 0.5 mean(x^2, axis 0) and gets no
 * gradient; the write happens in the step's forward, once. */
static Mod state_module(void) {
  Mod M = mod_new();
  int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
  int s = PARAM(&M, "s", 1, (int64_t)4);
  M.m->params[1].state = 1;
  int64_t ax[2] = {0, 0};
  int sq = op1(&M, IR_SQUARE, x);
  int mean = add(M.g, IR_REDUCE_MEAN, &sq, 1, ax, 2, 0, DT_F32, -1, NULL);
  int half = add(M.g, IR_CONST, NULL, 0, NULL, 0, 0.5, DT_F32, -1, NULL);
  int nv = op2(&M, IR_ADD, op2(&M, IR_MUL, s, half), op2(&M, IR_MUL, mean, half));
  int th = op1(&M, IR_TANH, x);
  int in[3] = {th, nv, s};
  finish_weighted(&M, add(M.g, IR_STATE_UPDATE, in, 3, NULL, 0, 0, DT_F32, -1, NULL));
  return M;
}

static void test_state_update(void) {
  Mod M = state_module();
  check_module(&M, "state_update", RECOMPUTE_NONE, 1e-3);
  ops_tested[IR_STATE_UPDATE]++;
  mod_free(&M);
  /* the update itself: one step from the initial values, with the forward
   * recomputed in the backward (which must not write again) */
  M = state_module();
  const char *err = NULL;
  AdResult *r = ad_build(M.m, RECOMPUTE_FULL, &err);
  EXPECT(r != NULL);
  if (r) {
    Interp *in = interp_new(M.m);
    interp_init_params(in, 99);
    set_inputs(&M, in);
    double *xv = interp_param(in, 0, 0, NULL), *sv = interp_param(in, 1, 0, NULL), want[4];
    for (int j = 0; j < 4; j++) {
      double m2 = 0;
      for (int i = 0; i < 3; i++) m2 += xv[i * 4 + j] * xv[i * 4 + j] / 3.0;
      want[j] = 0.5 * sv[j] + 0.5 * m2;
    }
    interp_zero_grads(in);
    EXPECT(!isnan(ad_step(in, r, 1.0, &err)));
    for (int j = 0; j < 4; j++) EXPECT_NEAR(sv[j], want[j], 1e-12);
    const double *g = interp_grad(in, 1, 0, NULL);
    EXPECT(g != NULL);
    for (int j = 0; j < 4 && g; j++) EXPECT_NEAR(g[j], 0, 0);
    interp_free(in);
  }
  mod_free(&M);
}

static void test_attention(void) {
  for (int causal = 0; causal < 2; causal++) {
    Mod M = mod_new();
    int64_t S = causal ? 3 : 4;
    int q = PARAM(&M, "q", 4, (int64_t)1, (int64_t)4, (int64_t)3, (int64_t)2);
    int k = PARAM(&M, "k", 4, (int64_t)1, (int64_t)2, S, (int64_t)2);
    int v = PARAM(&M, "v", 4, (int64_t)1, (int64_t)2, S, (int64_t)3);
    int in[3] = {q, k, v};
    int64_t attr[3] = {causal, 0, 0};
    done(&M, add(M.g, IR_ATTENTION, in, 3, attr, 3, 0.7, DT_F32, -1, NULL), "attention", IR_ATTENTION);
  }
  {
    /* a sliding window of 2 keys over 4 */
    Mod M = mod_new();
    int q = PARAM(&M, "q", 4, (int64_t)1, (int64_t)2, (int64_t)4, (int64_t)3);
    int k = PARAM(&M, "k", 4, (int64_t)1, (int64_t)1, (int64_t)4, (int64_t)3);
    int v = PARAM(&M, "v", 4, (int64_t)1, (int64_t)1, (int64_t)4, (int64_t)2);
    int in[3] = {q, k, v};
    int64_t attr[4] = {1, 0, 0, 2};
    done(&M, add(M.g, IR_ATTENTION, in, 3, attr, 4, 0.9, DT_F32, -1, NULL), "attention", IR_ATTENTION);
  }
  {
    /* attention sinks as lower.c writes them (GPT-OSS): o sigmoid(lse - sink_h),
     * lse the packed last column, so its gradient enters attention's backward */
    Mod M = mod_new();
    int q = PARAM(&M, "q", 4, (int64_t)1, (int64_t)2, (int64_t)4, (int64_t)3);
    int k = PARAM(&M, "k", 4, (int64_t)1, (int64_t)1, (int64_t)4, (int64_t)3);
    int v = PARAM(&M, "v", 4, (int64_t)1, (int64_t)1, (int64_t)4, (int64_t)2);
    int sink = PARAM(&M, "sink", 1, (int64_t)2);
    int in[3] = {q, k, v};
    int64_t attr[IR_NATTR] = {1, 0, 0, 3};
    int packed = add(M.g, IR_ATTENTION, in, 3, attr, 4, 0.8, DT_F32, -1, NULL);
    int64_t odims[4] = {1, 2, 4, 2}, ldims[4] = {1, 2, 4, 1}, sdims[4] = {1, 2, 1, 1}, at[IR_NATTR] = {0};
    int o = add(M.g, IR_SLICE, &packed, 1, at, 16, 0, DT_F32, 4, odims);
    at[3] = 2;
    int lse = add(M.g, IR_SLICE, &packed, 1, at, 16, 0, DT_F32, 4, ldims);
    int sk = add(M.g, IR_RESHAPE, &sink, 1, NULL, 0, 0, DT_F32, 4, sdims);
    int f = op1(&M, IR_SIGMOID, op2(&M, IR_SUB, lse, sk));
    done(&M, op2(&M, IR_MUL, o, f), "attention with sinks", IR_ATTENTION);
  }
  for (int causal = 0; causal < 2; causal++) {
    /* ring attention a block at a time (cp_comm = ring): q against two blocks of keys and
     * values (one rank: both blocks' positions 0..S-1), merged by ATTN_MERGE, whose
     * gradient contract (each block's backward against the merged output) must give the
     * merged attention's gradient; the lse column reaches the loss too (sinks' way) */
    Mod M = mod_new();
    int q = PARAM(&M, "q", 4, (int64_t)1, (int64_t)2, (int64_t)3, (int64_t)2);
    int blocks[2];
    for (int s = 0; s < 2; s++) {
      int k = PARAM(&M, s ? "k1" : "k0", 4, (int64_t)1, (int64_t)1, (int64_t)3, (int64_t)2);
      int v = PARAM(&M, s ? "v1" : "v0", 4, (int64_t)1, (int64_t)1, (int64_t)3, (int64_t)3);
      int in[3] = {q, k, v};
      int64_t attr[6] = {causal, 0, 1 + IRG_CP, 0, 1 + s, 2};
      blocks[s] = add(M.g, IR_ATTENTION, in, 3, attr, 6, 0.6, DT_F32, -1, NULL);
    }
    int merged = add(M.g, IR_ATTN_MERGE, blocks, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int64_t odims[4] = {1, 2, 3, 3}, ldims[4] = {1, 2, 3, 1}, at[IR_NATTR] = {0};
    int o = add(M.g, IR_SLICE, &merged, 1, at, 16, 0, DT_F32, 4, odims);
    at[3] = 3;
    int lse = add(M.g, IR_SLICE, &merged, 1, at, 16, 0, DT_F32, 4, ldims);
    int64_t wide[4] = {1, 2, 3, 3};
    done(&M, op2(&M, IR_MUL, o, op1(&M, IR_SIGMOID, add(M.g, IR_EXPAND, &lse, 1, NULL, 0, 0, DT_F32, 4, wide))),
         causal ? "ring attention merged (causal)" : "ring attention merged", IR_ATTN_MERGE);
  }
}

/* loss = sum(tanh(x) r) with, on x, the auxiliary loss v = sum(x^2) / 7:
 * through with_aux_loss (aux = 1) or added to the loss explicitly (aux = 0) */
static Mod aux_module(int aux) {
  Mod M = mod_new();
  int x = PARAM(&M, "x", 2, (int64_t)3, (int64_t)4);
  int64_t twelve = 12, all[2] = {0, 0};
  int flat = add(M.g, IR_RESHAPE, &x, 1, NULL, 0, 0, DT_F32, 1, &twelve);
  int sq = op1(&M, IR_SQUARE, flat);
  int v = add(M.g, IR_REDUCE_SUM, &sq, 1, all, 2, 0, DT_F32, -1, NULL);
  v = op2(&M, IR_DIV, v, add(M.g, IR_CONST, NULL, 0, NULL, 0, 7.0, DT_F32, -1, NULL));
  int y = x;
  if (aux) {
    int in[2] = {x, v};
    y = add(M.g, IR_AUX_LOSS, in, 2, NULL, 0, 0.25, DT_F32, -1, NULL);
  }
  finish_weighted(&M, op1(&M, IR_TANH, y));
  if (!aux) M.g->outputs[0] = op2(&M, IR_ADD, M.g->outputs[0], op2(&M, IR_MUL, v, add(M.g, IR_CONST, NULL, 0, NULL, 0, 0.25, DT_F32, -1, NULL)));
  return M;
}

static void test_aux_loss(void) {
  const char *err = NULL;
  Mod A = aux_module(1), X = aux_module(0);
  AdResult *r = ad_build(A.m, RECOMPUTE_NONE, &err);
  EXPECT(r != NULL);
  if (!r) return;
  Interp *ia = interp_new(A.m), *ix = interp_new(X.m);
  interp_init_params(ia, 1234);
  interp_init_params(ix, 1234);
  set_inputs(&A, ia);
  set_inputs(&X, ix);
  interp_zero_grads(ia);
  double loss = ad_step(ia, r, 3.0, &err), loss_x = interp_loss(ix);
  EXPECT(!isnan(loss));
  /* the value is the main loss alone: X's minus 0.25 v */
  int64_t n = 0;
  double *xa = interp_param(ia, 0, 0, &n), v = 0;
  for (int64_t k = 0; k < n; k++) v += xa[k] * xa[k] / 7.0;
  EXPECT_NEAR(loss, loss_x - 0.25 * v, 1e-12);
  double *g = interp_grad(ia, 0, 0, NULL), *xx = interp_param(ix, 0, 0, NULL);
  for (int64_t k = 0; g && k < n; k++) {
    double fd = 3.0 * fd_grad(ix, &xx[k], 1e-3);
    gradient_checks++;
    if (!close_enough(g[k], fd, 1e-6, 1e-10)) {
      fprintf(stderr, "with_aux_loss: d/d x[%" PRId64 "]: autodiff %.12g, 3 x finite differences of loss + 0.25 v %.12g\n", k, g[k], fd);
      test_failures++;
    }
  }
  ops_tested[IR_AUX_LOSS]++;
  ops_tested[IR_LOSS_SEED]++;
  interp_free(ia);
  interp_free(ix);
  mod_free(&A);
  mod_free(&X);
}

/* Repeated blocks: y = x + tanh(x @ W_l + b) per layer, with a shared
 * (count 1) scale, under each recompute policy; every copy of W and b has
 * its own gradient. */
static void test_call(void) {
  /* then recompute_layers (ad_build_layers): the policy on the first 1 or 2
   * of the 3 layers, the rest keeping their activations, both calls */
  for (int policy = RECOMPUTE_NONE; policy <= RECOMPUTE_LAST + 2 * 3; policy++) {
    check_layers = policy <= RECOMPUTE_LAST ? 0 : 1 + (policy - RECOMPUTE_LAST - 1) / 3;
    Recompute pol = policy <= RECOMPUTE_LAST ? (Recompute)policy : (Recompute)(1 + (policy - RECOMPUTE_LAST - 1) % 3);
    Mod M = mod_new();
    IrGraph *blk = ir_graph_new(M.m, "blk");
    blk->count = 3;
    blk->nargs = 2;
    int64_t xd[2] = {2, 4}, a0 = 0, a1 = 1;
    int arg = add(blk, IR_ARG, NULL, 0, &a0, 1, 0, DT_F32, 2, xd);
    int arg1 = add(blk, IR_ARG, NULL, 0, &a1, 1, 0, DT_F32, 2, xd);
    int w = param_in(&M, blk, 1, 3, "blk.{i}.w", 0, 0, 2, (int64_t)4, (int64_t)4);
    int b = param_in(&M, blk, 1, 3, "blk.{i}.b", 0, 0, 1, (int64_t)4);
    int sc = param_in(&M, blk, 1, 1, "scale", 0, 0, 0);
    int in2[2] = {arg, w};
    int mm = add(blk, IR_MATMUL, in2, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int in3[2] = {mm, b};
    int h = add(blk, IR_ADD, in3, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int t = add(blk, IR_TANH, &h, 1, NULL, 0, 0, DT_F32, -1, NULL);
    int in4[2] = {t, sc};
    int ts = add(blk, IR_MUL, in4, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int in5[2] = {ts, arg1}; /* argument 1 reaches every layer unchanged */
    int ts2 = add(blk, IR_ADD, in5, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int in6[2] = {arg, ts2};
    int out = add(blk, IR_ADD, in6, 2, NULL, 0, 0, DT_F32, -1, NULL);
    blk->outputs = arena_alloc(M.arena, sizeof(int));
    blk->outputs[0] = out;
    blk->noutputs = 1;
    int x = PARAM(&M, "x", 2, (int64_t)2, (int64_t)4);
    int c = input(&M, DT_F32, 0, 2, (int64_t)2, (int64_t)4);
    int cin[2] = {op1(&M, IR_NEG, x), c};
    int64_t attr[3] = {1, 3, IR_CALL_PLAIN};
    int call = add(M.g, IR_CALL, cin, 2, attr, 3, 0, DT_F32, 2, xd);
    finish_weighted(&M, op1(&M, IR_SILU, call));
    char what[96];
    snprintf(what, sizeof what, "call (recompute %s, layers %d)", sem_recompute_name(pol), (int)check_layers);
    check_module(&M, what, pol, 1e-3);
    if (check_layers) { /* the step splits the call: B.fwd x layers, then B.keep.fwd x the rest */
      int saves = 0; /* only the step graph has SAVE calls */
      for (int gi = 0; gi < M.m->ngraphs; gi++)
        for (int i = 0; i < M.m->graphs[gi]->nnodes; i++) {
          const IrNode *cn = &M.m->graphs[gi]->nodes[i];
          if (cn->op != IR_CALL || cn->attr[2] != IR_CALL_SAVE) continue;
          EXPECT(cn->attr[1] == (saves ? 3 - check_layers : check_layers));
          EXPECT(cn->attr[3] == (saves ? check_layers : 0));
          saves++;
        }
      EXPECT(saves == 2);
    }
    check_layers = 0;
    ops_tested[IR_CALL]++;
    mod_free(&M);
  }
}

/* The convention of autodiff.h driven by hand, as a pipeline schedule
 * would: B.fwd per layer (keeping its saved outputs), then B.grad from the
 * last layer down with (dy, the layer's arguments, its saved values); the
 * gradients match the step graph's exactly. Here loss = sum(y * R), so the
 * block's final dy is R. */
static void test_manual_schedule(void) {
  for (int policy = RECOMPUTE_NONE; policy <= RECOMPUTE_LAST; policy++) {
    Mod M = mod_new();
    IrGraph *blk = ir_graph_new(M.m, "blk");
    blk->count = 2;
    blk->nargs = 1;
    int64_t xd[4] = {1, 2, 3, 4}, a0 = 0, ax = 3;
    int arg = add(blk, IR_ARG, NULL, 0, &a0, 1, 0, DT_F32, 4, xd);
    int w = param_in(&M, blk, 1, 2, "blk.{i}.w", 0, 0, 2, (int64_t)4, (int64_t)4);
    int in2[2] = {arg, w};
    int q = add(blk, IR_MATMUL, in2, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int64_t tb[2] = {0, 1};
    int qq[2] = {q, arg};
    int s = add(blk, IR_MATMUL, qq, 2, tb, 2, 0, DT_F32, -1, NULL); /* [1,2,3,3] */
    int msk = add(blk, IR_CAUSAL_MASK, &s, 1, NULL, 0, -INFINITY, DT_F32, -1, NULL);
    int sm = add(blk, IR_SOFTMAX, &msk, 1, &ax, 1, 0, DT_F32, -1, NULL);
    int av[2] = {sm, arg};
    int o = add(blk, IR_MATMUL, av, 2, NULL, 0, 0, DT_F32, -1, NULL);
    int res[2] = {arg, o};
    int out = add(blk, IR_ADD, res, 2, NULL, 0, 0, DT_F32, -1, NULL);
    blk->outputs = arena_alloc(M.arena, sizeof(int));
    blk->outputs[0] = out;
    blk->noutputs = 1;
    int x = PARAM(&M, "x", 4, (int64_t)1, (int64_t)2, (int64_t)3, (int64_t)4);
    int64_t attr[3] = {1, 2, IR_CALL_PLAIN};
    int call = add(M.g, IR_CALL, &x, 1, attr, 3, 0, DT_F32, 4, xd);
    finish_weighted(&M, call);
    const char *err = NULL;
    AdResult *r = ad_build(M.m, (Recompute)policy, &err);
    EXPECT(r != NULL);
    if (!r) return;
    EXPECT(ir_verify(M.m, stderr) == 0);
    /* none keeps q and the softmax; selective recomputes the softmax from q;
     * ops keeps q (its one weight GEMM) and recomputes the scores */
    EXPECT(r->nsaved[1] == (policy == RECOMPUTE_FULL ? 0 : policy == RECOMPUTE_NONE ? 2 : 1));
    Interp *in = interp_new(M.m);
    interp_init_params(in, 21);
    set_inputs(&M, in);
    interp_zero_grads(in);
    EXPECT(!isnan(ad_step(in, r, 1.0, &err)));
    int64_t n = 0;
    double ref_w[2][16], ref_x[24];
    for (int l = 0; l < 2; l++) memcpy(ref_w[l], interp_grad(in, 0, l, &n), sizeof ref_w[l]);
    memcpy(ref_x, interp_grad(in, 1, 0, NULL), sizeof ref_x);
    interp_zero_grads(in);
    const IrGraph *fw = M.m->graphs[r->fwd[1]], *bw = M.m->graphs[r->grad[1]];
    InterpTensor keep[2][8], outs[8];
    InterpTensor a;
    memset(&a, 0, sizeof a);
    a.rank = 4;
    memcpy(a.dims, xd, sizeof xd);
    a.data = interp_param(in, 1, 0, NULL);
    for (int l = 0; l < 2; l++) {
      EXPECT(interp_run(in, r->fwd[1], l, &a, 1, outs, &err) == 0);
      keep[l][0] = a; /* the layer's argument */
      for (int k = 1; k < fw->noutputs; k++) keep[l][k] = outs[k];
      a = outs[0];
    }
    free(a.data);
    InterpTensor dy = a;
    dy.data = M.input_data[0]; /* R */
    double *owned = NULL;
    for (int l = 1; l >= 0; l--) {
      InterpTensor args[8];
      args[0] = dy;
      for (int k = 0; k < fw->noutputs; k++) args[1 + k] = keep[l][k];
      EXPECT(interp_run(in, r->grad[1], l, args, bw->nargs, outs, &err) == 0);
      for (int k = 1; k < bw->noutputs; k++) free(outs[k].data);
      free(owned);
      owned = outs[0].data;
      dy = outs[0];
    }
    for (int l = 0; l < 2; l++) {
      EXPECT(memcmp(ref_w[l], interp_grad(in, 0, l, NULL), sizeof ref_w[l]) == 0);
      for (int k = 1; k < fw->noutputs; k++) free(keep[l][k].data);
    }
    free(keep[1][0].data);
    EXPECT(memcmp(ref_x, owned, sizeof ref_x) == 0);
    free(owned);
    interp_free(in);
    mod_free(&M);
  }
}

/* ---- whole models ---- */

typedef struct {
  Arena *arena;
  Diag *diag;
  IrModule *m;
  SemModel *model;
} Loaded;

static int load_model(Loaded *L, const char *file, const char *const *defs, int ndefs, int64_t micro_batch) {
  memset(L, 0, sizeof *L);
  L->arena = arena_new();
  L->diag = diag_new(stderr);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", HPDL_SOURCE_DIR, file);
  LoadedProgram prog = load_program(L->arena, L->diag, path);
  enum { MAX_DEFINES = 32 };
  SemDefine defines[MAX_DEFINES], layout[MAX_DEFINES];
  memset(defines, 0, sizeof defines);
  memset(layout, 0, sizeof layout);
  int nd = 0, nl = 0;
  for (int i = 0; i < ndefs; i++) {
    const char *eq = strchr(defs[i], '=');
    if (nd == MAX_DEFINES || nl == MAX_DEFINES) { /* a test's list outgrew the arrays */
      fprintf(stderr, "load_model %s: more than %d defines or layout settings\n", file, MAX_DEFINES);
      EXPECT(0);
      break;
    }
    if (defs[i][0] == '-') { /* a layout key: "-parallel.tensor=1" */
      layout[nl].name = arena_strndup(L->arena, defs[i] + 1, (size_t)(eq - defs[i] - 1));
      layout[nl++].value = eq + 1;
    } else {
      defines[nd].name = arena_strndup(L->arena, defs[i], (size_t)(eq - defs[i]));
      defines[nd++].value = eq + 1;
    }
  }
  int bad = 0;
  SemOptions opts = {defines, nd, layout, nl, NULL, &bad};
  L->model = diag_error_count(L->diag) ? NULL : sema_check(L->arena, L->diag, &prog, &opts);
  L->m = L->model ? lower_model(L->arena, L->diag, L->model, micro_batch) : NULL;
  EXPECT(L->m != NULL);
  return L->m != NULL;
}

static void unload(Loaded *L) {
  arena_free(L->arena);
  diag_free(L->diag);
}

/* tokens and targets: deterministic ids below vocab, per micro-batch */
static void feed_tokens(Interp *in, const IrModule *m, int64_t vocab, uint64_t salt) {
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < x->rank; k++) n *= x->dims[k];
    double *d = calloc((size_t)n, sizeof(double));
    uint64_t st = interp_hash_name(salt, x->name, 0);
    for (int64_t k = 0; k < n; k++) d[k] = (double)(int64_t)(interp_uniform01(&st) * (double)vocab);
    interp_set_input(in, i, d);
    free(d);
  }
}

/* d loss / d a few entries of every parameter copy: the largest gradient
 * and a few at random, against finite differences of the loss (step h). */
static void check_model_grads(const char *what, IrModule *m, int64_t vocab, Recompute policy, double h) {
  const char *err = NULL;
  current_what = what;
  AdResult *r = ad_build(m, policy, &err);
  if (!r) fprintf(stderr, "%s: %s\n", what, err);
  EXPECT(r != NULL);
  if (!r) return;
  EXPECT(ir_verify(m, stderr) == 0);
  Interp *in = interp_new(m);
  interp_init_params(in, 7);
  feed_tokens(in, m, vocab, 5);
  interp_zero_grads(in);
  double loss = ad_step(in, r, 1.0, &err);
  EXPECT(!isnan(loss));
  EXPECT_NEAR(loss, interp_loss(in), 1e-12);
  uint64_t pick = 42;
  int checked = 0;
  for (int p = 0; p < m->nparams; p++) {
    int64_t copies = m->params[p].count > 1 ? m->params[p].count : 1;
    for (int64_t l = 0; l < copies; l++) {
      int64_t n = 0, best = 0;
      double *v = interp_param(in, p, l, &n);
      double *g = interp_grad(in, p, l, NULL);
      EXPECT(g != NULL);
      if (!g) continue;
      for (int64_t k = 1; k < n; k++)
        if (fabs(g[k]) > fabs(g[best])) best = k;
      /* Random entries whose gradient is not tiny next to the largest: for
       * those, finite differences measure only their own rounding noise
       * (about 1e-12 absolute). */
      int64_t entries[4] = {best, 0, 0, 0};
      for (int e = 1; e < 4; e++)
        for (int tries = 0; tries < 64; tries++) {
          entries[e] = (int64_t)(interp_uniform01(&pick) * (double)n);
          if (fabs(g[entries[e]]) >= 1e-2 * fabs(g[best])) break;
        }
      for (int e = 0; e < 4; e++) {
        int64_t k = entries[e];
        double fd = fd_grad(in, &v[k], h);
        checked++;
        gradient_checks++;
        if (!close_enough(g[k], fd, 1e-6, 1e-11)) {
          fprintf(stderr, "%s: d loss / d %s[%" PRId64 "] copy %" PRId64 ": autodiff %.12g, finite differences %.12g\n",
                  what, m->params[p].name, k, l, g[k], fd);
          test_failures++;
        }
      }
    }
  }
  EXPECT(checked > 0);
  interp_free(in);
}

static const char *const gpt2_defs[] = {"T=16", "C=32", "H=4", "L=2"};
static const char *const llama_defs[] = {"layers=2", "hidden=32", "heads=4", "kv_heads=2", "ffn=64", "seq=16", "vocab=64",
                                         "-parallel.cluster=laptop", "-parallel.nodes=1", "-parallel.data=1",
                                         "-parallel.tensor=1", "-parallel.sequence=off"};

static void test_gpt2_tiny(void) {
  Loaded L;
  if (!load_model(&L, "samples/gpt2-tiny.hpd", gpt2_defs, 4, 2)) return;
  check_model_grads("gpt2-tiny", L.m, 256, RECOMPUTE_SELECTIVE, 1e-3);
  unload(&L);
}

static void test_llama(void) {
  Loaded L;
  if (!load_model(&L, "samples/llama.hpd", llama_defs, 12, 2)) return;
  check_model_grads("llama (tiny)", L.m, 64, RECOMPUTE_FULL, 1e-3);
  unload(&L);
  if (!load_model(&L, "samples/llama.hpd", llama_defs, 12, 2)) return;
  check_model_grads("llama (tiny), recompute ops", L.m, 64, RECOMPUTE_OPS, 1e-3);
  unload(&L);
  if (!load_model(&L, "samples/llama.hpd", llama_defs, 12, 2)) return;
  check_model_grads("llama (tiny), recompute act", L.m, 64, RECOMPUTE_ACT, 1e-3);
  unload(&L);
}

/* A small ResNet (issue 17): convolutions, batch norm (synchronised, one
 * rank: its all-reduces are the identity), max and adaptive pooling; pixel
 * values and labels in [0, 5). */
static void test_resnet_tiny(void) {
  static const char *const defs[] = {"L=2", "sync=true"};
  Loaded L;
  if (!load_model(&L, "tests/vision/resnet-tiny.hpd", defs, 2, 2)) return;
  /* batch norm centres what ReLU and max pooling see, so kinks lie close:
   * steps of 1e-5 (3e-5 at most) stay clear of them */
  check_model_grads("resnet-tiny", L.m, 5, RECOMPUTE_SELECTIVE, 1e-5);
  unload(&L);
}

/* At init the tied head sees near-zero logits: the loss is about ln V. */
static void test_initial_loss(void) {
  Loaded L;
  if (!load_model(&L, "samples/gpt2-tiny.hpd", NULL, 0, 2)) return;
  Interp *in = interp_new(L.m);
  interp_init_params(in, 1337);
  feed_tokens(in, L.m, 256, 1);
  double loss = interp_loss(in);
  fprintf(stderr, "gpt2-tiny: loss at init %.6f, ln 256 = %.6f\n", loss, log(256.0));
  EXPECT(fabs(loss - log(256.0)) < 0.1);
  interp_free(in);
  unload(&L);
}

/* Gradients of every parameter copy for one policy (caller frees). */
static double *all_grads(IrModule *m, Recompute policy, int64_t vocab, int64_t *total, double *loss) {
  const char *err = NULL;
  AdResult *r = ad_build(m, policy, &err);
  EXPECT(r != NULL);
  if (!r) return NULL;
  EXPECT(ir_verify(m, stderr) == 0);
  Interp *in = interp_new(m);
  interp_init_params(in, 3);
  feed_tokens(in, m, vocab, 11);
  interp_zero_grads(in);
  *loss = ad_step(in, r, 1.0, &err);
  int64_t n = 0;
  for (int p = 0; p < m->nparams; p++) {
    int64_t k = 1;
    for (int d = 0; d < m->params[p].rank; d++) k *= m->params[p].dims[d];
    n += k * (m->params[p].count > 1 ? m->params[p].count : 1);
  }
  double *all = calloc((size_t)n, sizeof(double)), *at = all;
  for (int p = 0; p < m->nparams; p++) {
    int64_t copies = m->params[p].count > 1 ? m->params[p].count : 1;
    for (int64_t l = 0; l < copies; l++) {
      int64_t k = 0;
      double *g = interp_grad(in, p, l, &k);
      EXPECT(g != NULL);
      if (g) memcpy(at, g, sizeof(double) * (size_t)k);
      at += k;
    }
  }
  *total = n;
  interp_free(in);
  return all;
}

static void test_recompute_equal(const char *file, const char *const *defs, int ndefs, int64_t vocab) {
  double *ref = NULL, ref_loss = 0;
  int64_t ref_n = 0;
  for (int policy = RECOMPUTE_NONE; policy <= RECOMPUTE_LAST; policy++) {
    Loaded L;
    if (!load_model(&L, file, defs, ndefs, 2)) return;
    int64_t n = 0;
    double loss = 0;
    double *g = all_grads(L.m, (Recompute)policy, vocab, &n, &loss);
    if (!ref) {
      ref = g;
      ref_n = n;
      ref_loss = loss;
    } else if (g) {
      EXPECT(n == ref_n);
      EXPECT(loss == ref_loss);
      int64_t diffs = 0;
      for (int64_t k = 0; k < n && k < ref_n; k++)
        if (g[k] != ref[k]) diffs++;
      if (diffs) fprintf(stderr, "%s: recompute %s: %" PRId64 " gradient entries differ from none\n", file,
                         sem_recompute_name((Recompute)policy), diffs);
      EXPECT(diffs == 0);
      free(g);
    }
    unload(&L);
  }
  free(ref);
}

/* Two micro-batches of 2 accumulated = one batch of 4 holding both. */
typedef struct {
  double *tokens[2], *targets[2];
} Micro;

static void feed_micro(Interp *in, int micro, void *user) {
  Micro *mb = user;
  interp_set_input(in, 0, mb->tokens[micro]);
  interp_set_input(in, 1, mb->targets[micro]);
}

static void test_accumulation(void) {
  Loaded small, big;
  if (!load_model(&small, "samples/gpt2-tiny.hpd", gpt2_defs, 4, 2)) return;
  if (!load_model(&big, "samples/gpt2-tiny.hpd", gpt2_defs, 4, 4)) return;
  const char *err = NULL;
  AdResult *rs = ad_build(small.m, RECOMPUTE_NONE, &err), *rb = ad_build(big.m, RECOMPUTE_FULL, &err);
  EXPECT(rs && rb);
  if (!rs || !rb) return;
  int64_t T = small.m->inputs[0].dims[1], per = 2 * T;
  Micro mb;
  double *tok = calloc((size_t)(2 * per), sizeof(double)), *tgt = calloc((size_t)(2 * per), sizeof(double));
  uint64_t st = 77;
  for (int64_t k = 0; k < 2 * per; k++) {
    tok[k] = (double)(int64_t)(interp_uniform01(&st) * 256);
    tgt[k] = (double)(int64_t)(interp_uniform01(&st) * 256);
  }
  for (int i = 0; i < 2; i++) {
    mb.tokens[i] = tok + i * per;
    mb.targets[i] = tgt + i * per;
  }
  Interp *is = interp_new(small.m), *ib = interp_new(big.m);
  interp_init_params(is, 9);
  interp_init_params(ib, 9);
  double ls = ad_accumulate(is, rs, 2, feed_micro, &mb, &err);
  interp_set_input(ib, 0, tok);
  interp_set_input(ib, 1, tgt);
  interp_zero_grads(ib);
  double lb = ad_step(ib, rb, 1.0, &err);
  EXPECT_NEAR(ls, lb, 1e-12);
  double worst = 0;
  for (int p = 0; p < small.m->nparams; p++) {
    int64_t copies = small.m->params[p].count > 1 ? small.m->params[p].count : 1;
    for (int64_t l = 0; l < copies; l++) {
      int64_t n = 0;
      double *a = interp_grad(is, p, l, &n), *b = interp_grad(ib, p, l, NULL);
      EXPECT(a && b);
      for (int64_t k = 0; a && b && k < n; k++) {
        double e = fabs(a[k] - b[k]) / fmax(fabs(b[k]), 1e-8);
        worst = e > worst ? e : worst;
      }
    }
  }
  if (worst > 1e-9) fprintf(stderr, "accumulation: worst relative difference %g\n", worst);
  EXPECT(worst <= 1e-9);
  interp_free(is);
  interp_free(ib);
  free(tok);
  free(tgt);
  unload(&small);
  unload(&big);
}

/* Misuse is refused with a reason, not a crash. */
static void test_errors(void) {
  Mod M = mod_new();
  int x = PARAM(&M, "x", 1, (int64_t)3);
  finish_weighted(&M, op1(&M, IR_TANH, x));
  const char *err = NULL;
  EXPECT(ad_build(M.m, RECOMPUTE_NONE, &err) != NULL);
  EXPECT(ad_build(M.m, RECOMPUTE_NONE, &err) == NULL);
  EXPECT(err != NULL);
  mod_free(&M);
}

int main(void) {
  test_unary();
  test_act_grad();
  test_binary();
  test_matmul();
  test_reductions();
  test_softmax();
  test_shape_ops();
  test_model_ops();
  test_comm();
  test_router();
  test_moe();
  test_aux_loss();
  test_attention();
  test_conv();
  test_state_update();
  test_call();
  test_manual_schedule();
  test_errors();
  /* every op with a gradient has been checked by finite differences */
  /* EXTERN needs a native library: tests/extern/test_extern.c checks its
   * gradient by finite differences; EXTERN_GRAD, ATTENTION_BWD, LINEAR_CE_BWD(_W), LINEAR_LSE_BWD(_W) and GROUPED_MM_WGRAD have no derivative, TRAINING
   * (the mode leaf) none either: resnet-tiny's finite differences run through it */
  static const IrOp nondiff[] = {IR_INPUT, IR_PARAM, IR_ARG,         IR_CONST,         IR_FILL,
                                 IR_IOTA,  IR_EXTERN, IR_EXTERN_GRAD, IR_ATTENTION_BWD, IR_TRAINING,
                                 IR_LINEAR_CE_BWD, IR_LINEAR_CE_BWD_W, IR_LINEAR_LSE_BWD, IR_LINEAR_LSE_BWD_W,
                                 IR_GROUPED_MM_WGRAD};
  for (int op = 0; op < IR_OP_COUNT; op++) {
    int skip = 0;
    for (size_t k = 0; k < sizeof nondiff / sizeof nondiff[0]; k++) skip |= (int)nondiff[k] == op;
    if (!skip && !ops_tested[op]) {
      fprintf(stderr, "no finite-difference test of %s\n", ir_op_name((IrOp)op));
      test_failures++;
    }
  }
  int per_op = gradient_checks;
  test_gpt2_tiny();
  test_llama();
  test_resnet_tiny();
  test_initial_loss();
  test_recompute_equal("samples/gpt2-tiny.hpd", gpt2_defs, 4, 256);
  test_recompute_equal("samples/llama.hpd", llama_defs, 12, 64);
  test_accumulation();
  fprintf(stderr, "autodiff: %d entries checked by finite differences (%d in per-op tests), worst relative error %.3g (%s; gradients above 1e6 x the noise floor)\n",
          gradient_checks, per_op, worst_rel, worst_what);
  TEST_DONE();
}
