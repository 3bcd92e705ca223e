/* test_extern.c - `extern` native ops through the reference executor
 * (CTest extern.interp). The model tests/extern/ext_lm.hpd, copied beside the
 * test library (tests/extern/testops.c) into HPDL_EXTERN_DIR, computes its
 * MLP's gelu(x + b) with the native bias_gelu (mode 0), with builtins
 * (mode 1), or with an extern that has no gradient function (mode 2).
 *
 *   1. mode 0's gradients of every entry of mlp.b and of 64 entries of
 *      mlp.fc.weight (they reach the loss only through the extern and its
 *      gradient function) against central finite differences of the loss;
 *   2. mode 0's loss equals mode 1's within 1e-6 relative, and so does
 *      every parameter's gradient (1e-5 of its norm; the native function
 *      computes in fp32, the builtins in fp64);
 *   3. mode 2: the same loss; no gradient flows through the call (its
 *      arguments' parameters, and the norm before it, get exact zeros), the
 *      rest still get theirs;
 *   recompute full (the block's extern called again in the backward) gives
 *   the same gradients bit for bit;
 *   4. errors of the executor: a library that does not load and a missing
 *      symbol, each naming the extern, its library and where it is declared. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "autodiff.h"
#include "interp.h"
#include "loader.h"
#include "lower.h"
#include "sema.h"
#include "test_util.h"

typedef struct {
  Arena *arena;
  Diag *diag;
  IrModule *m;
  AdResult *ad;
  Interp *in;
} Model;

static double *tokens, *targets;
enum { MB = 2, T = 16, V = 256 };

static int load_mode_policy(Model *M, int mode, Recompute policy) {
  memset(M, 0, sizeof *M);
  M->arena = arena_new();
  M->diag = diag_new(stderr);
  char path[1024], defv[32];
  snprintf(path, sizeof path, "%s/ext_lm.hpd", HPDL_EXTERN_DIR);
  snprintf(defv, sizeof defv, "%d", mode);
  LoadedProgram prog = load_program(M->arena, M->diag, path);
  SemDefine defines[] = {{"mode", defv, NULL}}, layout[] = {
      {"parallel.cluster", "cpu", NULL}, {"parallel.data", "1", NULL}, {"parallel.tensor", "1", NULL},
      {"parallel.pipeline", "1", NULL}, {"parallel.context", "1", NULL}, {"train.micro_batch", "2", NULL},
      {"train.batch", "2", NULL}};
  int bad = 0;
  SemOptions opts = {defines, 1, layout, (int)(sizeof layout / sizeof layout[0]), NULL, &bad};
  SemModel *sm = diag_error_count(M->diag) ? NULL : sema_check(M->arena, M->diag, &prog, &opts);
  EXPECT(sm != NULL);
  if (!sm) return -1;
  M->m = lower_model(M->arena, M->diag, sm, MB);
  EXPECT(M->m != NULL);
  if (!M->m) return -1;
  EXPECT(M->m->nexterns == (mode == 1 ? 0 : 1));
  const char *err = NULL;
  M->ad = ad_build(M->m, policy, &err);
  if (!M->ad) fprintf(stderr, "ad_build: %s\n", err);
  EXPECT(M->ad != NULL);
  EXPECT(ir_verify(M->m, stderr) == 0);
  M->in = interp_new(M->m);
  interp_init_params(M->in, 4242);
  interp_set_input(M->in, 0, tokens);
  interp_set_input(M->in, 1, targets);
  return M->ad ? 0 : -1;
}

static int load_mode(Model *M, int mode) { return load_mode_policy(M, mode, RECOMPUTE_NONE); }

static void unload(Model *M) {
  interp_free(M->in);
  diag_free(M->diag);
  arena_free(M->arena);
}

static int param_of(const Model *M, const char *name) {
  for (int p = 0; p < M->m->nparams; p++)
    if (!strcmp(M->m->params[p].name, name)) return p;
  fprintf(stderr, "no parameter %s\n", name);
  test_failures++;
  return 0;
}

static double step(Model *M) {
  const char *err = NULL;
  interp_zero_grads(M->in);
  double loss = ad_step(M->in, M->ad, 1.0, &err);
  if (isnan(loss)) fprintf(stderr, "step: %s\n", err ? err : "nan");
  return loss;
}

/* Sixth-order central difference of the loss in one value. */
static double fd(Interp *in, double *v, double h) {
  static const double w[3] = {45.0, -9.0, 1.0};
  double x = *v, s = 0;
  for (int k = 1; k <= 3; k++) {
    *v = x + k * h;
    double p = interp_loss(in);
    *v = x - k * h;
    s += w[k - 1] * (p - interp_loss(in));
  }
  *v = x;
  return s / (60.0 * h);
}

/* 1: the gradient function against finite differences. The native function
 * rounds its result to fp32, so the loss moves in steps of ~1e-7 relative:
 * h = 1e-2 keeps that noise near 1e-5 absolute in the quotient. */
static void test_finite_differences(void) {
  Model M;
  if (load_mode(&M, 0)) return;
  step(&M);
  const char *names[2] = {"blocks.{i}.mlp.b", "blocks.{i}.mlp.fc.weight"};
  double worst = 0;
  int checked = 0;
  for (int i = 0; i < 2; i++) {
    int p = param_of(&M, names[i]);
    for (int64_t l = 0; l < M.m->params[p].count; l++) {
      int64_t n = 0;
      double *v = interp_param(M.in, p, l, &n), *g = interp_grad(M.in, p, l, NULL);
      EXPECT(g != NULL);
      if (!g) continue;
      double gmax = 0;
      for (int64_t k = 0; k < n; k++) gmax = fmax(gmax, fabs(g[k]));
      EXPECT(gmax > 1e-4); /* the gradient is not trivially zero */
      int64_t stride = i == 0 ? 2 : n / 16;
      for (int64_t k = 0; k < n; k += stride) {
        double want = fd(M.in, &v[k], 1e-2), err = fabs(g[k] - want);
        checked++;
        if (err > 1e-3 * fabs(want) + 2e-5 * gmax) {
          fprintf(stderr, "d loss / d %s[%" PRId64 "] layer %" PRId64 ": gradient function %.9g, finite differences %.9g\n", names[i], k,
                  l, g[k], want);
          test_failures++;
        }
        worst = fmax(worst, err / gmax);
      }
    }
  }
  printf("extern: %d gradient entries against finite differences, worst error %.2e of the largest gradient\n", checked, worst);
  unload(&M);
}

/* 2 and 3: the native model against the builtin one, and the one without a gradient. */
static void test_against_builtins(void) {
  Model a, b, c;
  if (load_mode(&a, 0) || load_mode(&b, 1) || load_mode(&c, 2)) return;
  double la = interp_loss(a.in), lb = interp_loss(b.in), lc = interp_loss(c.in);
  EXPECT_NEAR(la, lb, 1e-6);
  EXPECT_NEAR(lc, lb, 1e-6);
  double sa = step(&a), sb = step(&b), sc = step(&c);
  EXPECT_NEAR(sa, la, 1e-12);
  EXPECT_NEAR(sb, lb, 1e-12);
  EXPECT_NEAR(sc, lc, 1e-12);
  double worst = 0;
  for (int p = 0; p < a.m->nparams; p++)
    for (int64_t l = 0; l < a.m->params[p].count; l++) {
      const char *name = a.m->params[p].name;
      int q = param_of(&b, name), r = param_of(&c, name);
      int64_t n = 0, nb = 0, nc = 0;
      const double *ga = interp_grad(a.in, p, l, &n), *gb = interp_grad(b.in, q, l, &nb), *gc = interp_grad(c.in, r, l, &nc);
      EXPECT(ga && gb && gc && n == nb && n == nc);
      if (!ga || !gb || !gc || n != nb || n != nc) continue;
      double norm = 0, diff = 0, cnorm = 0;
      for (int64_t k = 0; k < n; k++) {
        norm += gb[k] * gb[k];
        diff += (ga[k] - gb[k]) * (ga[k] - gb[k]);
        cnorm += gc[k] * gc[k];
      }
      norm = sqrt(norm), diff = sqrt(diff), cnorm = sqrt(cnorm);
      EXPECT(norm > 0);
      if (diff > 1e-5 * norm) {
        fprintf(stderr, "gradient of %s layer %" PRId64 ": native and builtin differ by %.3g of its norm %.3g\n", name, l, diff / norm, norm);
        test_failures++;
      }
      worst = fmax(worst, diff / norm);
      /* what reaches the loss only through the call: its arguments, and the block's norm before it */
      int through = !strcmp(name, "blocks.{i}.mlp.b") || !strcmp(name, "blocks.{i}.mlp.fc.weight") || !strncmp(name, "blocks.{i}.ln.", 14);
      if (through && cnorm != 0) {
        fprintf(stderr, "without a gradient function, %s still gets a gradient (norm %.3g)\n", name, cnorm);
        test_failures++;
      }
      if (!through) EXPECT(cnorm > 0);
    }
  printf("extern: loss %.12f native, %.12f builtin (rel %.1e); gradients within %.1e of their norms\n", la, lb,
         fabs(la - lb) / fabs(lb), worst);
  unload(&a);
  unload(&b);
  unload(&c);
}

/* The block recomputed in the backward (its extern called again) gives the
 * same gradients, bit for bit. */
static void test_recompute(void) {
  Model a, b;
  if (load_mode(&a, 0) || load_mode_policy(&b, 0, RECOMPUTE_FULL)) return;
  EXPECT(step(&a) == step(&b));
  int same = 1;
  for (int p = 0; p < a.m->nparams; p++)
    for (int64_t l = 0; l < a.m->params[p].count; l++) {
      int64_t n = 0;
      const double *ga = interp_grad(a.in, p, l, &n), *gb = interp_grad(b.in, p, l, NULL);
      same &= ga && gb && !memcmp(ga, gb, sizeof(double) * (size_t)n);
    }
  EXPECT(same);
  printf("extern: recompute full gives the same gradients: %s\n", same ? "yes" : "NO");
  unload(&a);
  unload(&b);
}

/* 4: what the executor says when the library or a symbol is missing. */
static void expect_error(Model *M, const char *want1, const char *want2) {
  InterpTensor outs[1];
  const char *err = NULL;
  memset(outs, 0, sizeof outs);
  int rc = interp_run(M->in, 0, 0, NULL, 0, outs, &err);
  EXPECT(rc != 0 && err);
  if (rc == 0 || !err) return;
  if (!strstr(err, want1) || !strstr(err, want2) || !strstr(err, "extern bias_gelu (declared at ") || !strstr(err, "ext_lm.hpd:")) {
    fprintf(stderr, "unexpected message: %s\n", err);
    test_failures++;
  }
  printf("extern: %s\n", err);
}

static void test_errors(void) {
  Model M;
  if (load_mode(&M, 0)) return;
  IrExtern *e = &M.m->externs[0];
  e->path = "/nonexistent/libhpdl_testops.so";
  expect_error(&M, "cannot load library /nonexistent/libhpdl_testops.so", "No such file");
  unload(&M);
  if (load_mode(&M, 0)) return;
  M.m->externs[0].symbol = "no_such_function";
  expect_error(&M, "library " HPDL_EXTERN_DIR "/libhpdl_testops.so has no function no_such_function", "");
  unload(&M);
}

int main(void) {
  tokens = calloc(MB * T, sizeof(double));
  targets = calloc(MB * T, sizeof(double));
  uint64_t s = 99;
  for (int i = 0; i < MB * T; i++) {
    tokens[i] = (double)(int)(interp_uniform01(&s) * V);
    targets[i] = (double)(int)(interp_uniform01(&s) * V);
  }
  test_finite_differences();
  test_against_builtins();
  test_recompute();
  test_errors();
  free(tokens);
  free(targets);
  TEST_DONE();
}
