/* test_interp.c - the reference executor: each op's values on small cases
 * worked out by hand, CALL's layer loop, parameter initialisation, and the
 * single-rank collectives. (Gradients are tested in test_autodiff.c.) */
#include "interp.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "test_util.h"

typedef struct {
  Arena *arena;
  IrModule *m;
  IrGraph *g;
} Mod;

static Mod mod_new(void) {
  Mod M;
  M.arena = arena_new();
  M.m = ir_module_new(M.arena);
  M.m->inputs = arena_alloc(M.arena, sizeof(IrInput) * 8);
  M.g = ir_graph_new(M.m, "forward");
  return M;
}

static int add(IrGraph *g, IrOp op, const int *in, int nin, const int64_t *attr, int nattr, double f, DType dt,
               int rank, const int64_t *dims) {
  const char *why = NULL;
  int id = ir_add(g, op, in, nin, attr, nattr, f, dt, rank, dims, &why);
  if (id < 0) fprintf(stderr, "ir_add %s: %s\n", ir_op_name(op), why);
  EXPECT(id >= 0);
  return id;
}

/* A float model input with the given values. */
static int input(Mod *M, int rank, const int64_t *dims, DType dt) {
  int k = M->m->ninputs++;
  IrInput *in = &M->m->inputs[k];
  in->name = arena_printf(M->arena, "in%d", k);
  in->dtype = dt;
  in->rank = rank;
  memcpy(in->dims, dims, sizeof(int64_t) * (size_t)rank);
  int64_t index = k;
  return add(M->g, IR_INPUT, NULL, 0, &index, 1, 0, dt, rank, dims);
}

/* Runs graph 0 with outputs {node} and compares with want[]. */
static void expect_values(Mod *M, Interp *in, int node, const double *want, int64_t n, double tol, const char *what) {
  M->g->outputs = arena_alloc(M->arena, sizeof(int));
  M->g->outputs[0] = node;
  M->g->noutputs = 1;
  EXPECT(ir_verify(M->m, stderr) == 0);
  InterpTensor out;
  const char *err = NULL;
  int rc = interp_run(in, 0, 0, NULL, 0, &out, &err);
  if (rc) fprintf(stderr, "%s: %s\n", what, err);
  EXPECT(rc == 0);
  if (rc) return;
  EXPECT(ir_numel(&M->g->nodes[node]) == n);
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(out.data[i] - want[i]) <= tol * fmax(1.0, fabs(want[i])))) {
      fprintf(stderr, "%s: [%d] = %.17g, want %.17g\n", what, (int)i, out.data[i], want[i]);
      test_failures++;
    }
  free(out.data);
}

static void test_elementwise(void) {
  Mod M = mod_new();
  int64_t d[1] = {4};
  int x = input(&M, 1, d, DT_F32);
  Interp *in = interp_new(M.m);
  double xv[4] = {-1.0, 0.0, 1.0, 2.0};
  interp_set_input(in, 0, xv);
  /* GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  double gelu[4] = {-0.15880800939172324, 0.0, 0.8411919906082768, 1.954597694087775};
  expect_values(&M, in, add(M.g, IR_GELU, &x, 1, NULL, 0, 0, DT_F32, -1, NULL), gelu, 4, 1e-14, "gelu");
  double silu[4] = {-1.0 / (1.0 + exp(1.0)), 0.0, 1.0 / (1.0 + exp(-1.0)), 2.0 / (1.0 + exp(-2.0))};
  expect_values(&M, in, add(M.g, IR_SILU, &x, 1, NULL, 0, 0, DT_F32, -1, NULL), silu, 4, 1e-15, "silu");
  double relu[4] = {0, 0, 1, 2};
  expect_values(&M, in, add(M.g, IR_RELU, &x, 1, NULL, 0, 0, DT_F32, -1, NULL), relu, 4, 0, "relu");
  double sq[4] = {1, 0, 1, 4};
  expect_values(&M, in, add(M.g, IR_SQUARE, &x, 1, NULL, 0, 0, DT_F32, -1, NULL), sq, 4, 0, "square");
  double cube[4] = {-1, 0, 1, 8};
  expect_values(&M, in, add(M.g, IR_POWS, &x, 1, NULL, 0, 3.0, DT_F32, -1, NULL), cube, 4, 0, "pow");
  /* act_grad: relu'(0) = 0; square' = 2x */
  int in2[2] = {x, x};
  int64_t op = IR_RELU;
  double drelu[4] = {0, 0, 1, 2};
  expect_values(&M, in, add(M.g, IR_ACT_GRAD, in2, 2, &op, 1, 0, DT_F32, -1, NULL), drelu, 4, 0, "act_grad relu");
  op = IR_SQUARE;
  double dsq[4] = {2, 0, 2, 8};
  expect_values(&M, in, add(M.g, IR_ACT_GRAD, in2, 2, &op, 1, 0, DT_F32, -1, NULL), dsq, 4, 0, "act_grad square");
  /* dropout p = 0 is the identity; p = 0.5 keeps about half, doubled */
  int64_t stream = 0;
  expect_values(&M, in, add(M.g, IR_DROPOUT, &x, 1, &stream, 1, 0.0, DT_F32, -1, NULL), xv, 4, 0, "dropout 0");
  interp_free(in);
  arena_free(M.arena);
}

static void test_dropout_mask(void) {
  Mod M = mod_new();
  int64_t d[1] = {1000};
  int x = input(&M, 1, d, DT_F32);
  int64_t stream = 2;
  int y = add(M.g, IR_DROPOUT, &x, 1, &stream, 1, 0.25, DT_F32, -1, NULL);
  M.g->outputs = arena_alloc(M.arena, sizeof(int));
  M.g->outputs[0] = y;
  M.g->noutputs = 1;
  Interp *in = interp_new(M.m);
  interp_init_params(in, 5);
  double *ones = calloc(1000, sizeof(double));
  for (int i = 0; i < 1000; i++) ones[i] = 1.0;
  interp_set_input(in, 0, ones);
  InterpTensor a, b;
  const char *err = NULL;
  EXPECT(interp_run(in, 0, 0, NULL, 0, &a, &err) == 0);
  EXPECT(interp_run(in, 0, 0, NULL, 0, &b, &err) == 0);
  int kept = 0, same = 1;
  for (int i = 0; i < 1000; i++) {
    EXPECT(a.data[i] == 0.0 || fabs(a.data[i] - 1.0 / 0.75) < 1e-15);
    kept += a.data[i] != 0.0;
    same &= a.data[i] == b.data[i];
  }
  EXPECT(same);                     /* deterministic */
  EXPECT(kept > 690 && kept < 810); /* about 75% */
  free(a.data);
  free(b.data);
  free(ones);
  interp_free(in);
  arena_free(M.arena);
}

static void test_broadcast_matmul(void) {
  Mod M = mod_new();
  int64_t da[2] = {2, 3}, db[1] = {3}, dc[2] = {3, 2};
  int a = input(&M, 2, da, DT_F32), b = input(&M, 1, db, DT_F32), c = input(&M, 2, dc, DT_F32);
  Interp *in = interp_new(M.m);
  double av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {10, 20, 30}, cv[6] = {1, 0, 0, 1, 1, 1};
  interp_set_input(in, 0, av);
  interp_set_input(in, 1, bv);
  interp_set_input(in, 2, cv);
  int ab[2] = {a, b};
  double sum[6] = {11, 22, 33, 14, 25, 36};
  expect_values(&M, in, add(M.g, IR_ADD, ab, 2, NULL, 0, 0, DT_F32, -1, NULL), sum, 6, 0, "add broadcast");
  int ac[2] = {a, c};
  double mm[4] = {4, 5, 10, 11}; /* [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] */
  expect_values(&M, in, add(M.g, IR_MATMUL, ac, 2, NULL, 0, 0, DT_F32, -1, NULL), mm, 4, 0, "matmul");
  /* a^T @ a: [3, 3] */
  int aa[2] = {a, a};
  int64_t ta[2] = {1, 0};
  double ata[9] = {17, 22, 27, 22, 29, 36, 27, 36, 45};
  expect_values(&M, in, add(M.g, IR_MATMUL, aa, 2, ta, 2, 0, DT_F32, -1, NULL), ata, 9, 0, "matmul ta");
  int64_t tb[2] = {0, 1};
  double aat[4] = {14, 32, 32, 77};
  expect_values(&M, in, add(M.g, IR_MATMUL, aa, 2, tb, 2, 0, DT_F32, -1, NULL), aat, 4, 0, "matmul tb");
  /* reductions and sum_to / expand */
  int64_t r1[2] = {1, 0};
  double rs[2] = {6, 15};
  expect_values(&M, in, add(M.g, IR_REDUCE_SUM, &a, 1, r1, 2, 0, DT_F32, -1, NULL), rs, 2, 0, "reduce_sum");
  int64_t r0[2] = {0, 1};
  double rm[3] = {4, 5, 6};
  expect_values(&M, in, add(M.g, IR_REDUCE_MAX, &a, 1, r0, 2, 0, DT_F32, -1, NULL), rm, 3, 0, "reduce_max");
  double rmean[3] = {2.5, 3.5, 4.5};
  expect_values(&M, in, add(M.g, IR_REDUCE_MEAN, &a, 1, r0, 2, 0, DT_F32, -1, NULL), rmean, 3, 0, "reduce_mean");
  int64_t to[2] = {1, 3};
  double st[3] = {5, 7, 9};
  expect_values(&M, in, add(M.g, IR_SUM_TO, &a, 1, NULL, 0, 0, DT_F32, 2, to), st, 3, 0, "sum_to");
  int64_t big[3] = {2, 2, 3};
  double ex[12] = {10, 20, 30, 10, 20, 30, 10, 20, 30, 10, 20, 30};
  expect_values(&M, in, add(M.g, IR_EXPAND, &b, 1, NULL, 0, 0, DT_F32, 3, big), ex, 12, 0, "expand");
  interp_free(in);
  arena_free(M.arena);
}

static void test_shapes(void) {
  Mod M = mod_new();
  int64_t d[3] = {2, 3, 4};
  int x = input(&M, 3, d, DT_F32);
  Interp *in = interp_new(M.m);
  double xv[24];
  for (int i = 0; i < 24; i++) xv[i] = i;
  interp_set_input(in, 0, xv);
  /* transpose perm (2, 0, 1): out[k][i][j] = x[i][j][k] */
  int64_t perm[3] = {2, 0, 1};
  double tr[24];
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) tr[(k * 2 + i) * 3 + j] = xv[(i * 3 + j) * 4 + k];
  expect_values(&M, in, add(M.g, IR_TRANSPOSE, &x, 1, perm, 3, 0, DT_F32, -1, NULL), tr, 24, 0, "transpose");
  /* x[1, 1:3, 2:4] with axis 0 dropped */
  int64_t sattr[16] = {1, 1, 2, 0, 0, 0, 0, 0, 1}, sd[2] = {2, 2};
  double sl[4] = {12 + 4 + 2, 12 + 4 + 3, 12 + 8 + 2, 12 + 8 + 3};
  expect_values(&M, in, add(M.g, IR_SLICE, &x, 1, sattr, 16, 0, DT_F32, 2, sd), sl, 4, 0, "slice");
  /* pad [2,3,4] into [2,4,5] at (0, 1, 1) */
  int64_t pattr[8] = {0, 1, 1}, pd[3] = {2, 4, 5};
  double pad[40];
  memset(pad, 0, sizeof pad);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) pad[(i * 4 + j + 1) * 5 + k + 1] = xv[(i * 3 + j) * 4 + k];
  expect_values(&M, in, add(M.g, IR_PAD, &x, 1, pattr, 8, 0, DT_F32, 3, pd), pad, 40, 0, "pad");
  /* concat along axis 2 with itself */
  int xx[2] = {x, x};
  int64_t axis = 2;
  double cat[48];
  for (int r = 0; r < 6; r++)
    for (int k = 0; k < 8; k++) cat[r * 8 + k] = xv[r * 4 + k % 4];
  expect_values(&M, in, add(M.g, IR_CONCAT, xx, 2, &axis, 1, 0, DT_F32, -1, NULL), cat, 48, 0, "concat");
  /* causal mask on the last two dims [3, 4]: column > row gets the fill */
  double cm[24];
  for (int i = 0; i < 2; i++)
    for (int r = 0; r < 3; r++)
      for (int c = 0; c < 4; c++) cm[(i * 3 + r) * 4 + c] = c > r ? -7.0 : xv[(i * 3 + r) * 4 + c];
  expect_values(&M, in, add(M.g, IR_CAUSAL_MASK, &x, 1, NULL, 0, -7.0, DT_F32, -1, NULL), cm, 24, 0, "causal_mask");
  /* a vocabulary of 3 padded to the 4 columns: column 3 gets the fill */
  double vmv[24];
  for (int i = 0; i < 24; i++) vmv[i] = i % 4 >= 3 ? -9.0 : xv[i];
  int64_t vma[2] = {0, 3};
  expect_values(&M, in, add(M.g, IR_VOCAB_MASK, &x, 1, vma, 2, -9.0, DT_F32, -1, NULL), vmv, 24, 0, "vocab_mask");
  /* softmax rows sum to one and keep order */
  int64_t ax = 2;
  double sm[24];
  for (int r = 0; r < 6; r++) {
    double s = 0;
    for (int k = 0; k < 4; k++) s += exp(xv[r * 4 + k]);
    for (int k = 0; k < 4; k++) sm[r * 4 + k] = exp(xv[r * 4 + k]) / s;
  }
  expect_values(&M, in, add(M.g, IR_SOFTMAX, &x, 1, &ax, 1, 0, DT_F32, -1, NULL), sm, 24, 1e-14, "softmax");
  double lsm[24];
  for (int i = 0; i < 24; i++) lsm[i] = log(sm[i]);
  expect_values(&M, in, add(M.g, IR_LOG_SOFTMAX, &x, 1, &ax, 1, 0, DT_F32, -1, NULL), lsm, 24, 1e-14, "log_softmax");
  interp_free(in);
  arena_free(M.arena);
}

/* RoPE of x [1, H, T, 4] (bthd: [1, T, H, 4]) worked out directly: pair i of position t
 * turns by t * base^(-2i/4) */
static void rope_by_hand(const double *x, double *out, double base, int H, int T, int bthd) {
  for (int h = 0; h < H; h++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < 2; i++) {
        int at = (bthd ? t * H + h : h * T + t) * 4 + 2 * i;
        double th = t * pow(base, -2.0 * i / 4.0);
        out[at] = x[at] * cos(th) - x[at + 1] * sin(th);
        out[at + 1] = x[at] * sin(th) + x[at + 1] * cos(th);
      }
}

static void test_attention_ops(void) {
  Mod M = mod_new();
  int64_t d[4] = {1, 2, 3, 4};
  int x = input(&M, 4, d, DT_F32);
  Interp *in = interp_new(M.m);
  double xv[24];
  for (int i = 0; i < 24; i++) xv[i] = 1.0 + i;
  interp_set_input(in, 0, xv);
  /* rope: pair i of position t turns by t * base^(-2i/D) */
  double base = 100.0, ro[24];
  rope_by_hand(xv, ro, base, 2, 3, 0);
  int64_t fwd = 0, inv = 1;
  int r = add(M.g, IR_ROPE, &x, 1, &fwd, 1, base, DT_F32, -1, NULL);
  expect_values(&M, in, r, ro, 24, 1e-14, "rope");
  expect_values(&M, in, add(M.g, IR_ROPE, &r, 1, &inv, 1, base, DT_F32, -1, NULL), xv, 24, 1e-14, "rope inverse");
  /* attr[8] = 1: x read as [B, T, H, D] = [1, 2, 3, 4], the position its axis 1 */
  double rt[24];
  rope_by_hand(xv, rt, base, 3, 2, 1);
  int64_t bthd[9] = {0, 0, 0, 0, 0, 0, 0, 0, 1}, bthd_inv[9] = {1, 0, 0, 0, 0, 0, 0, 0, 1};
  int rb = add(M.g, IR_ROPE, &x, 1, bthd, 9, base, DT_F32, -1, NULL);
  expect_values(&M, in, rb, rt, 24, 1e-14, "rope bthd");
  expect_values(&M, in, add(M.g, IR_ROPE, &rb, 1, bthd_inv, 9, base, DT_F32, -1, NULL), xv, 24, 1e-14, "rope bthd inverse");
  /* repeat_kv n = 2: head h of the output is head h / 2 */
  int64_t n = 2;
  double rep[48];
  for (int h = 0; h < 4; h++)
    for (int k = 0; k < 12; k++) rep[h * 12 + k] = xv[(h / 2) * 12 + k];
  int rk = add(M.g, IR_REPEAT_KV, &x, 1, &n, 1, 0, DT_F32, -1, NULL);
  expect_values(&M, in, rk, rep, 48, 0, "repeat_kv");
  double back[24];
  for (int i = 0; i < 24; i++) back[i] = 2 * xv[i];
  expect_values(&M, in, add(M.g, IR_REPEAT_KV_BWD, &rk, 1, &n, 1, 0, DT_F32, -1, NULL), back, 24, 0, "repeat_kv_bwd");
  interp_free(in);
  arena_free(M.arena);
}

static void test_embedding_loss(void) {
  Mod M = mod_new();
  int64_t dt[2] = {3, 2}, di[2] = {2, 2}, dl[3] = {2, 2, 3};
  int table = input(&M, 2, dt, DT_F32), ids = input(&M, 2, di, DT_I32), logits = input(&M, 3, dl, DT_F32);
  Interp *in = interp_new(M.m);
  double tv[6] = {1, 2, 3, 4, 5, 6}, iv[4] = {2, 0, 2, 1}, lv[12] = {0, 0, 0, 1, 2, 3, 0, 0, 5, -1, 0, 1};
  interp_set_input(in, 0, tv);
  interp_set_input(in, 1, iv);
  interp_set_input(in, 2, lv);
  int ti[2] = {table, ids};
  double emb[8] = {5, 6, 1, 2, 5, 6, 3, 4};
  int e = add(M.g, IR_EMBEDDING, ti, 2, NULL, 0, 0, DT_F32, -1, NULL);
  expect_values(&M, in, e, emb, 8, 0, "embedding");
  /* scatter-add back: row 2 gets two copies */
  int ei[2] = {e, ids};
  double scat[6] = {1, 2, 3, 4, 10, 12};
  expect_values(&M, in, add(M.g, IR_EMBEDDING_BWD, ei, 2, NULL, 0, 0, DT_F32, 2, dt), scat, 6, 0, "embedding_bwd");
  /* cross entropy: mean of -log softmax at the targets (ids as targets) */
  int lt[2] = {logits, ids};
  double want = 0;
  double p[12];
  for (int r = 0; r < 4; r++) {
    double s = 0;
    for (int v = 0; v < 3; v++) s += exp(lv[r * 3 + v]);
    want += (log(s) - lv[r * 3 + (int)iv[r]]) / 4.0;
    for (int v = 0; v < 3; v++) p[r * 3 + v] = exp(lv[r * 3 + v]) / s;
  }
  expect_values(&M, in, add(M.g, IR_CROSS_ENTROPY, lt, 2, NULL, 0, 0, DT_F32, -1, NULL), &want, 1, 1e-14, "cross_entropy");
  /* its backward: dloss (softmax - onehot) / count */
  int two = add(M.g, IR_CONST, NULL, 0, NULL, 0, 2.0, DT_F32, -1, NULL);
  int ltd[3] = {logits, ids, two};
  double grad[12];
  for (int r = 0; r < 4; r++)
    for (int v = 0; v < 3; v++) grad[r * 3 + v] = 2.0 * (p[r * 3 + v] - (v == (int)iv[r])) / 4.0;
  expect_values(&M, in, add(M.g, IR_CROSS_ENTROPY_BWD, ltd, 3, NULL, 0, 0, DT_F32, -1, NULL), grad, 12, 1e-14,
                "cross_entropy_bwd");
  /* uniform logits: the loss is ln V */
  int zeros = add(M.g, IR_FILL, NULL, 0, NULL, 0, 0.0, DT_F32, 3, dl);
  int zt[2] = {zeros, ids};
  double ln3 = log(3.0);
  expect_values(&M, in, add(M.g, IR_CROSS_ENTROPY, zt, 2, NULL, 0, 0, DT_F32, -1, NULL), &ln3, 1, 1e-15, "ce uniform");
  /* iota */
  int64_t n5 = 5;
  double io[5] = {0, 1, 2, 3, 4};
  expect_values(&M, in, add(M.g, IR_IOTA, NULL, 0, NULL, 0, 0, DT_I32, 1, &n5), io, 5, 0, "iota");
  interp_free(in);
  arena_free(M.arena);
}

/* The router's ops: topk's positions (descending, ties to the lower
 * position), take and its scatter-add, one_hot (zeros for an index outside
 * [0, n)), and take's error on an index outside the row. */
static void test_router(void) {
  Mod M = mod_new();
  int64_t dx[2] = {2, 5}, di[2] = {2, 3};
  int x = input(&M, 2, dx, DT_F32), bad = input(&M, 2, di, DT_I32);
  Interp *in = interp_new(M.m);
  double xv[10] = {0.5, 2.0, -1.0, 2.0, 0.5, /* ties: 2.0 at 1 and 3, 0.5 at 0 and 4 */
                   -3.0, -2.0, -1.0, 7.0, -1.0};
  double bv[6] = {0, 1, 5, 0, 0, 0};
  interp_set_input(in, 0, xv);
  interp_set_input(in, 1, bv);
  int64_t k = 4, n = 5;
  int t = add(M.g, IR_TOPK, &x, 1, &k, 1, 0, DT_I32, -1, NULL);
  EXPECT(M.g->nodes[t].dtype == DT_I32 && M.g->nodes[t].dims[1] == 4);
  double pos[8] = {1, 3, 0, 4, 3, 2, 4, 1};
  expect_values(&M, in, t, pos, 8, 0, "topk");
  int xt[2] = {x, t};
  int v = add(M.g, IR_TAKE, xt, 2, NULL, 0, 0, DT_F32, -1, NULL);
  double vals[8] = {2.0, 2.0, 0.5, 0.5, 7.0, -1.0, -1.0, -2.0};
  expect_values(&M, in, v, vals, 8, 0, "take (topk values)");
  int vt[2] = {v, t};
  double scat[10] = {0.5, 2.0, 0, 2.0, 0.5, 0, -2.0, -1.0, 7.0, -1.0};
  expect_values(&M, in, add(M.g, IR_TAKE_BWD, vt, 2, NULL, 0, 0, DT_F32, 2, dx), scat, 10, 0, "take_bwd");
  double oh[30] = {0};
  for (int i = 0; i < 6; i++)
    if (bv[i] < 5) oh[i * 5 + (int)bv[i]] = 1.0;
  expect_values(&M, in, add(M.g, IR_ONE_HOT, &bad, 1, &n, 1, 0, DT_F32, -1, NULL), oh, 30, 0, "one_hot");
  /* k outside [1, V] and a float index do not type */
  int64_t k0 = 0, k6 = 6;
  const char *why = NULL;
  EXPECT(ir_add(M.g, IR_TOPK, &x, 1, &k0, 1, 0, DT_I32, -1, NULL, &why) < 0);
  EXPECT(ir_add(M.g, IR_TOPK, &x, 1, &k6, 1, 0, DT_I32, -1, NULL, &why) < 0);
  int xx[2] = {x, x};
  EXPECT(ir_add(M.g, IR_TAKE, xx, 2, NULL, 0, 0, DT_F32, -1, NULL, &why) < 0);
  /* index 5 of a row of 5 */
  int xb[2] = {x, bad};
  int tb = add(M.g, IR_TAKE, xb, 2, NULL, 0, 0, DT_F32, -1, NULL);
  M.g->outputs[0] = tb;
  InterpTensor out;
  const char *err = NULL;
  EXPECT(interp_run(in, 0, 0, NULL, 0, &out, &err) == -1);
  EXPECT(err && strstr(err, "take"));
  interp_free(in);
  arena_free(M.arena);
}

/* A repeated block y = x * w_l + c (c passed unchanged): CALL runs layers
 * 0..count-1, threading output 0 into argument 0. */
static void test_call_and_params(void) {
  Mod M = mod_new();
  IrGraph *blk = ir_graph_new(M.m, "blk");
  blk->count = 3;
  blk->nargs = 2;
  int64_t d[1] = {2}, a0 = 0, a1 = 1;
  IrParam p;
  memset(&p, 0, sizeof p);
  p.name = "blk.{i}.w";
  p.dtype = DT_F32;
  p.rank = 1;
  p.dims[0] = 2;
  p.init.kind = INIT_CONSTANT;
  p.init.a = 2.0;
  p.graph = 1;
  p.count = 3;
  int64_t pi = ir_add_param(M.m, &p);
  int x = add(blk, IR_ARG, NULL, 0, &a0, 1, 0, DT_F32, 1, d);
  int c = add(blk, IR_ARG, NULL, 0, &a1, 1, 0, DT_F32, 1, d);
  int w = add(blk, IR_PARAM, NULL, 0, &pi, 1, 0, DT_F32, 1, d);
  int xw[2] = {x, w};
  int m = add(blk, IR_MUL, xw, 2, NULL, 0, 0, DT_F32, -1, NULL);
  int mc[2] = {m, c};
  int y = add(blk, IR_ADD, mc, 2, NULL, 0, 0, DT_F32, -1, NULL);
  blk->outputs = arena_alloc(M.arena, sizeof(int));
  blk->outputs[0] = y;
  blk->noutputs = 1;
  int xin = input(&M, 1, d, DT_F32), cin = input(&M, 1, d, DT_F32);
  int args[2] = {xin, cin};
  int64_t attr[3] = {1, 3, IR_CALL_PLAIN};
  int call = add(M.g, IR_CALL, args, 2, attr, 3, 0, DT_F32, 1, d);
  Interp *in = interp_new(M.m);
  interp_init_params(in, 1);
  double xv[2] = {1, -1}, cv[2] = {1, 0.5};
  interp_set_input(in, 0, xv);
  interp_set_input(in, 1, cv);
  /* give layer 1 other weights: ((x*2 + c) * 3 + c) * 2 + c */
  int64_t n = 0;
  double *w1 = interp_param(in, 0, 1, &n);
  EXPECT(n == 2 && w1 && w1[0] == 2.0);
  w1[0] = w1[1] = 3.0;
  double want[2];
  for (int i = 0; i < 2; i++) want[i] = ((xv[i] * 2 + cv[i]) * 3 + cv[i]) * 2 + cv[i];
  expect_values(&M, in, call, want, 2, 0, "call x3");
  EXPECT(interp_param(in, 0, 3, NULL) == NULL); /* no fourth copy */
  interp_free(in);
  arena_free(M.arena);
}

static void test_init(void) {
  Arena *arena = arena_new();
  IrModule *m = ir_module_new(arena);
  ir_graph_new(m, "forward");
  IrParam p;
  memset(&p, 0, sizeof p);
  p.dtype = DT_F32;
  p.rank = 1;
  p.dims[0] = 20000;
  p.count = 2;
  p.name = "a.{i}.normal";
  p.init = (SemInit){INIT_NORMAL, 0.5, 2.0};
  ir_add_param(m, &p);
  p.name = "b.uniform";
  p.count = 1;
  p.init = (SemInit){INIT_UNIFORM, -1.0, 3.0};
  ir_add_param(m, &p);
  p.name = "c.zeros";
  p.init = (SemInit){INIT_ZEROS, 0, 0};
  ir_add_param(m, &p);
  p.name = "d.ones";
  p.init = (SemInit){INIT_ONES, 0, 0};
  ir_add_param(m, &p);
  p.name = "e.const";
  p.init = (SemInit){INIT_CONSTANT, 0.25, 0};
  ir_add_param(m, &p);
  Interp *in = interp_new(m), *in2 = interp_new(m);
  interp_init_params(in, 42);
  interp_init_params(in2, 42);
  int64_t n = 0;
  double *a0 = interp_param(in, 0, 0, &n), *a1 = interp_param(in, 0, 1, NULL);
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) {
    s += a0[i];
    s2 += a0[i] * a0[i];
  }
  double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
  EXPECT(fabs(mean - 0.5) < 0.05);
  EXPECT(fabs(sd - 2.0) < 0.05);
  EXPECT(a0[0] != a1[0]); /* layer copies differ */
  EXPECT(memcmp(a0, interp_param(in2, 0, 0, NULL), sizeof(double) * (size_t)n) == 0); /* deterministic */
  double *u = interp_param(in, 1, 0, NULL), lo = 1e9, hi = -1e9;
  for (int64_t i = 0; i < n; i++) {
    lo = fmin(lo, u[i]);
    hi = fmax(hi, u[i]);
  }
  EXPECT(lo >= -1.0 && hi < 3.0 && lo < -0.99 && hi > 2.99);
  EXPECT(interp_param(in, 2, 0, NULL)[7] == 0.0);
  EXPECT(interp_param(in, 3, 0, NULL)[7] == 1.0);
  EXPECT(interp_param(in, 4, 0, NULL)[7] == 0.25);
  /* the generator depends on the name, the layer and the seed */
  EXPECT(interp_hash_name(1, "x", 0) != interp_hash_name(1, "y", 0));
  EXPECT(interp_hash_name(1, "x", 0) != interp_hash_name(1, "x", 1));
  EXPECT(interp_hash_name(1, "x", 0) != interp_hash_name(2, "x", 0));
  EXPECT(interp_hash_name(1, "x", 0) == interp_hash_name(1, "x", 0));
  interp_free(in);
  interp_free(in2);
  arena_free(arena);
}

/* Single rank: all-reduce is a copy; a SEND goes to the loopback mailbox
 * and the next RECV of that group takes it. */
static void test_comm(void) {
  Mod M = mod_new();
  int64_t d[1] = {3};
  int x = input(&M, 1, d, DT_F32);
  Interp *in = interp_new(M.m);
  double xv[3] = {1, 2, 3};
  interp_set_input(in, 0, xv);
  int64_t g[2] = {IRG_TP, 0};
  expect_values(&M, in, add(M.g, IR_ALL_REDUCE, &x, 1, g, 2, 0, DT_F32, -1, NULL), xv, 3, 0, "all_reduce");
  int64_t pp[2] = {IRG_PP, 1};
  add(M.g, IR_SEND, &x, 1, pp, 2, 0, DT_F32, 1, d);
  int r = add(M.g, IR_RECV, NULL, 0, pp, 2, 0, DT_F32, 1, d);
  expect_values(&M, in, r, xv, 3, 0, "send/recv");
  /* a recv with nothing sent is an error, not a hang */
  IrGraph *g2 = ir_graph_new(M.m, "lonely");
  int r2 = add(g2, IR_RECV, NULL, 0, pp, 2, 0, DT_F32, 1, d);
  g2->outputs = arena_alloc(M.arena, sizeof(int));
  g2->outputs[0] = r2;
  g2->noutputs = 1;
  InterpTensor out;
  const char *err = NULL;
  EXPECT(interp_run(in, 1, 0, NULL, 0, &out, &err) == -1);
  EXPECT(err && strstr(err, "recv"));
  interp_free(in);
  arena_free(M.arena);
}

static void test_errors(void) {
  Mod M = mod_new();
  int64_t dt[2] = {3, 2}, di[1] = {2};
  int table = input(&M, 2, dt, DT_F32), ids = input(&M, 1, di, DT_I32);
  Interp *in = interp_new(M.m);
  double tv[6] = {0}, iv[2] = {1, 3};
  interp_set_input(in, 0, tv);
  interp_set_input(in, 1, iv);
  int ti[2] = {table, ids};
  int e = add(M.g, IR_EMBEDDING, ti, 2, NULL, 0, 0, DT_F32, -1, NULL);
  M.g->outputs = arena_alloc(M.arena, sizeof(int));
  M.g->outputs[0] = e;
  M.g->noutputs = 1;
  InterpTensor out;
  const char *err = NULL;
  EXPECT(interp_run(in, 0, 0, NULL, 0, &out, &err) == -1); /* id 3 of a 3-row table */
  EXPECT(err && strstr(err, "embedding"));
  EXPECT(interp_run(in, 5, 0, NULL, 0, &out, &err) == -1);
  interp_free(in);
  arena_free(M.arena);
}

int main(void) {
  test_elementwise();
  test_dropout_mask();
  test_broadcast_matmul();
  test_shapes();
  test_attention_ops();
  test_embedding_loss();
  test_router();
  test_call_and_params();
  test_init();
  test_comm();
  test_errors();
  TEST_DONE();
}
