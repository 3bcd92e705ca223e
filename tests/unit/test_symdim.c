/* test_symdim.c - symbolic dimension arithmetic: canonical form, division,
 * overflow, substitution and evaluation. */
#include <stdint.h>

#include "symdim.h"
#include "test_util.h"

static Arena *A;

static SymDim *V(const char *name) { return sym_var(A, name); }
static SymDim *K(int64_t v) { return sym_const(A, v); }
static SymDim *add(const SymDim *x, const SymDim *y) { return sym_add(A, x, y); }
static SymDim *sub(const SymDim *x, const SymDim *y) { return sym_sub(A, x, y); }
static SymDim *mul(const SymDim *x, const SymDim *y) { return sym_mul(A, x, y); }
static const char *S(const SymDim *x) { return sym_str(A, x); }

static SymDim *divs(const SymDim *x, const SymDim *y, SymStatus *st) {
  return sym_div(A, x, y, st);
}

static void test_printing(void) {
  SymDim *B = V("B"), *T = V("T"), *C = V("C");
  EXPECT_STR(S(K(0)), "0");
  EXPECT_STR(S(K(-5)), "-5");
  EXPECT_STR(S(B), "B");
  EXPECT_STR(S(add(B, K(1))), "B + 1");
  EXPECT_STR(S(add(K(1), B)), "B + 1");
  EXPECT_STR(S(add(mul(K(3), mul(T, B)), K(2))), "3*B*T + 2");
  EXPECT_STR(S(mul(mul(B, T), K(768))), "768*B*T");
  EXPECT_STR(S(mul(C, K(4))), "4*C");
  EXPECT_STR(S(mul(B, B)), "B^2");
  EXPECT_STR(S(sub(K(1), B)), "-B + 1");
  EXPECT_STR(S(sub(B, mul(K(3), C))), "B - 3*C");
  EXPECT_STR(S(sub(K(0), B)), "-B");
  EXPECT_STR(S(add(T, B)), "B + T");
  /* Degree first, then names; the constant last. */
  EXPECT_STR(S(mul(add(B, K(1)), add(T, K(1)))), "B*T + B + T + 1");
  EXPECT_STR(S(mul(add(C, B), add(B, C))), "B^2 + 2*B*C + C^2");
  EXPECT_STR(S(add(mul(B, mul(B, B)), add(mul(C, C), B))), "B^3 + C^2 + B");
  EXPECT_STR(S(sub(mul(B, B), mul(K(3), B))), "B^2 - 3*B");
  EXPECT_STR(S(mul(K(-1), mul(B, T))), "-B*T");
  EXPECT_STR(S(NULL), "(invalid)");
}

static void test_identities(void) {
  SymDim *B = V("B"), *T = V("T"), *C = V("C");
  SymDim *b1 = add(B, K(1));
  SymDim *sq = add(add(mul(B, B), mul(K(2), B)), K(1));
  EXPECT(sym_equal(mul(b1, b1), sq));
  EXPECT_STR(S(mul(b1, b1)), "B^2 + 2*B + 1");
  EXPECT(sym_equal(mul(mul(B, T), C), mul(B, mul(T, C))));
  EXPECT(sym_equal(mul(B, T), mul(T, V("B"))));
  EXPECT(sym_equal(mul(add(B, T), C), add(mul(C, B), mul(T, C))));
  EXPECT(sym_equal(sub(add(B, T), T), B));
  EXPECT(sym_equal(sub(B, B), K(0)));
  EXPECT(sym_equal(add(B, K(0)), B));
  EXPECT(sym_equal(mul(B, K(1)), B));
  EXPECT(sym_equal(mul(B, K(0)), K(0)));
  EXPECT(!sym_equal(B, T));
  EXPECT(!sym_equal(B, mul(B, B)));
  EXPECT(!sym_equal(B, NULL));
  /* (B - 1)(B + 1) = B^2 - 1: the cross terms cancel. */
  EXPECT_STR(S(mul(sub(B, K(1)), b1)), "B^2 - 1");
  int64_t v = 0;
  EXPECT(sym_is_const(sub(mul(b1, b1), add(mul(B, B), mul(K(2), B))), &v) && v == 1);
  EXPECT(sym_is_const(K(0), &v) && v == 0);
  EXPECT(!sym_is_const(B, &v));
  EXPECT(!sym_is_const(NULL, &v));
}

static void test_exact_division(void) {
  SymDim *B = V("B"), *T = V("T"), *C = V("C");
  SymStatus st = SYM_OVERFLOW;
  EXPECT_STR(S(divs(mul(K(4), C), K(4), &st)), "C");
  EXPECT(st == SYM_OK);
  EXPECT_STR(S(divs(mul(mul(B, T), C), T, &st)), "B*C");
  EXPECT_STR(S(divs(K(12), K(4), &st)), "3");
  EXPECT_STR(S(divs(K(-12), K(4), &st)), "-3");
  EXPECT_STR(S(divs(mul(K(6), mul(B, C)), mul(K(-3), C), &st)), "-2*B");
  EXPECT_STR(S(divs(K(0), B, &st)), "0");
  SymDim *b1 = add(B, K(1));
  EXPECT_STR(S(divs(mul(b1, b1), b1, &st)), "B + 1");
  EXPECT_STR(S(divs(sub(mul(B, T), T), sub(B, K(1)), &st)), "T");
  EXPECT_STR(S(divs(sub(mul(B, mul(B, B)), K(1)), sub(B, K(1)), &st)), "B^2 + B + 1");
  EXPECT(st == SYM_OK);
  EXPECT_STR(S(divs(add(mul(K(4), mul(B, T)), mul(K(8), T)), mul(K(4), T), &st)), "B + 2");
}

static void test_inexact_division(void) {
  SymDim *B = V("B"), *C = V("C"), *H = V("H");
  SymStatus st = SYM_OK;
  EXPECT(divs(K(7), K(2), &st) == NULL && st == SYM_NOT_DIVISIBLE);
  EXPECT(divs(K(7), K(0), &st) == NULL && st == SYM_DIV_BY_ZERO);
  EXPECT(divs(C, K(0), &st) == NULL && st == SYM_DIV_BY_ZERO);
  EXPECT(divs(C, sub(H, H), &st) == NULL && st == SYM_DIV_BY_ZERO);

  SymDim *q = divs(C, H, &st);
  EXPECT_STR(S(q), "(C/H)");
  EXPECT(st == SYM_OK);
  EXPECT(sym_equal(q, divs(V("C"), V("H"), NULL)));
  EXPECT(sym_equal(q, divs(mul(K(2), C), mul(K(2), H), NULL)));
  EXPECT(sym_equal(q, divs(mul(B, C), mul(H, B), NULL)));
  EXPECT(sym_equal(q, divs(mul(K(-1), C), mul(K(-1), H), NULL)));
  EXPECT(!sym_equal(q, divs(H, C, NULL)));
  EXPECT_STR(S(divs(mul(K(3), C), K(2), &st)), "(3*C/2)");
  EXPECT_STR(S(divs(add(B, K(1)), H, &st)), "((B + 1)/H)");
  EXPECT_STR(S(divs(C, mul(K(2), H), &st)), "(C/(2*H))");
  EXPECT_STR(S(divs(C, mul(H, H), &st)), "(C/H^2)");
  EXPECT_STR(S(divs(C, add(H, K(1)), &st)), "(C/(H + 1))");
  EXPECT_STR(S(divs(K(12), H, &st)), "(12/H)");
  EXPECT_STR(S(divs(mul(K(6), C), mul(K(4), H), &st)), "(3*C/(2*H))");
  EXPECT(st == SYM_OK);
  /* An atom then behaves as a symbol. */
  EXPECT_STR(S(add(mul(K(2), q), K(1))), "2*(C/H) + 1");
  EXPECT_STR(S(mul(q, B)), "(C/H)*B");
  EXPECT(sym_equal(sub(q, divs(C, H, NULL)), K(0)));
  EXPECT_STR(S(divs(mul(B, q), q, &st)), "B");

  /* A quotient is exact by the language's rules, so it cancels against its divisor:
   * split_heads then merge_heads gives back C. */
  EXPECT(sym_equal(mul(H, q), C));
  EXPECT(sym_equal(mul(mul(B, H), q), mul(B, C)));
  EXPECT_STR(S(mul(mul(K(3), H), q)), "3*C");
  EXPECT_STR(S(mul(mul(H, H), q)), "C*H");
  SymDim *half = divs(C, K(2), NULL);
  EXPECT_STR(S(half), "(C/2)");
  EXPECT(sym_equal(add(half, half), C));
  EXPECT_STR(S(add(half, C)), "(C/2) + C"); /* names sort bytewise: '(' first */
  SymDim *bq = divs(add(B, K(1)), H, NULL);
  EXPECT_STR(S(mul(bq, H)), "B + 1");
  /* Two-term divisors are not cancelled (documented limit). */
  EXPECT_STR(S(mul(divs(C, add(H, K(1)), NULL), add(H, K(1)))), "(C/(H + 1))*H + (C/(H + 1))");
}

static void test_mod(void) {
  SymDim *B = V("B"), *T = V("T"), *C = V("C"), *H = V("H");
  SymStatus st = SYM_OVERFLOW;
  EXPECT_STR(S(sym_mod(A, K(7), K(3), &st)), "1");
  EXPECT(st == SYM_OK);
  EXPECT_STR(S(sym_mod(A, K(-7), K(3), &st)), "-1");
  EXPECT_STR(S(sym_mod(A, K(INT64_MIN), K(-1), &st)), "0");
  EXPECT_STR(S(sym_mod(A, mul(K(4), C), K(4), &st)), "0");
  EXPECT_STR(S(sym_mod(A, mul(B, T), T, &st)), "0");
  EXPECT_STR(S(sym_mod(A, C, H, &st)), "(C%H)");
  EXPECT(st == SYM_OK);
  EXPECT_STR(S(sym_mod(A, add(C, K(1)), mul(K(2), H), &st)), "((C + 1)%(2*H))");
  EXPECT(sym_mod(A, C, K(0), &st) == NULL && st == SYM_DIV_BY_ZERO);
  EXPECT(sym_mod(A, NULL, C, &st) == NULL && st == SYM_OVERFLOW);
  /* Remainder atoms do not cancel. */
  EXPECT_STR(S(mul(H, sym_mod(A, C, H, NULL))), "(C%H)*H");
}

static void test_overflow(void) {
  SymDim *B = V("B");
  SymStatus st = SYM_OK;
  EXPECT(add(K(INT64_MAX), K(1)) == NULL);
  EXPECT(sub(K(INT64_MIN), K(1)) == NULL);
  EXPECT(sub(K(0), K(INT64_MIN)) == NULL);
  EXPECT(mul(K(INT64_MAX), K(2)) == NULL);
  EXPECT(mul(K(INT64_MIN), K(-1)) == NULL);
  EXPECT(mul(K(INT64_C(1) << 32), K(INT64_C(1) << 31)) == NULL);
  EXPECT(mul(K(INT64_C(1) << 31), K(INT64_C(1) << 31)) != NULL);
  EXPECT(divs(K(INT64_MIN), K(-1), &st) == NULL && st == SYM_OVERFLOW);
  EXPECT(divs(mul(K(INT64_MIN), B), K(-1), &st) == NULL && st == SYM_OVERFLOW);
  EXPECT(add(mul(K(INT64_MAX), B), B) == NULL);
  EXPECT(sub(mul(K(INT64_MIN), B), B) == NULL);
  EXPECT(mul(add(mul(K(INT64_C(1) << 40), B), K(1)), add(mul(K(INT64_C(1) << 30), B), K(1))) == NULL);
  /* At the limits, but representable. */
  EXPECT_STR(S(add(K(INT64_MAX), K(INT64_MIN))), "-1");
  EXPECT_STR(S(K(INT64_MIN)), "-9223372036854775808");
  EXPECT_STR(S(add(B, K(INT64_MIN))), "B - 9223372036854775808");
  EXPECT_STR(S(sub(mul(K(INT64_MIN), B), mul(K(INT64_MIN), B))), "0");
  EXPECT_STR(S(sub(K(-1), K(INT64_MIN))), "9223372036854775807");
  EXPECT_STR(S(divs(K(INT64_MIN), K(2), &st)), "-4611686018427387904");
  /* Content 2^63 cancels without overflow. */
  EXPECT_STR(S(divs(mul(K(INT64_MIN), V("C")), mul(K(INT64_MIN), V("H")), &st)), "(C/H)");
  /* Failure propagates through a chain. */
  EXPECT(mul(add(K(INT64_MAX), K(1)), B) == NULL);
  EXPECT(divs(NULL, B, &st) == NULL && st == SYM_OVERFLOW);
  EXPECT(!sym_equal(NULL, NULL));
  /* Powers are capped. */
  SymDim *p = B;
  for (int i = 0; i < 10; i++) p = mul(p, p);
  EXPECT_STR(S(p), "B^1024");
  EXPECT(mul(p, B) == NULL);
  /* Evaluation overflow. */
  const char *names[] = {"B"};
  int64_t vals[] = {INT64_C(1) << 32}, out = 0;
  EXPECT(sym_eval(mul(B, B), names, vals, 1, &out) == SYM_OVERFLOW);
  EXPECT(sym_eval(add(mul(K(INT64_MAX / 4), B), B), names, vals, 1, &out) == SYM_OVERFLOW);
  EXPECT(sym_eval(NULL, names, vals, 1, &out) == SYM_OVERFLOW);
  EXPECT(sym_subst(A, mul(B, B), names, vals, 1, &st) == NULL && st == SYM_OVERFLOW);
}

static void test_subst_eval(void) {
  SymDim *B = V("B"), *T = V("T"), *C = V("C"), *H = V("H");
  SymStatus st = SYM_OVERFLOW;
  SymDim *x = add(mul(K(3), mul(B, T)), K(2));
  const char *tn[] = {"T"};
  int64_t tv[] = {4};
  EXPECT_STR(S(sym_subst(A, x, tn, tv, 1, &st)), "12*B + 2");
  EXPECT(st == SYM_OK);
  EXPECT(sym_equal(sym_subst(A, x, NULL, NULL, 0, &st), x));
  const char *bt[] = {"T", "B"};
  int64_t btv[] = {4, 5};
  int64_t v = 0;
  EXPECT(sym_is_const(sym_subst(A, x, bt, btv, 2, &st), &v) && v == 62);
  EXPECT(sym_eval(x, bt, btv, 2, &v) == SYM_OK && v == 62);
  EXPECT(sym_eval(x, tn, tv, 1, &v) == SYM_UNBOUND);
  const char *btnull[] = {"T", "B", NULL};
  EXPECT(sym_eval(x, btnull, btv, -1, &v) == SYM_OK && v == 62);
  EXPECT(sym_is_const(sym_subst(A, x, btnull, btv, -1, &st), &v) && v == 62);
  EXPECT(sym_eval(K(0), NULL, NULL, 0, &v) == SYM_OK && v == 0);
  EXPECT(sym_eval(mul(B, mul(B, B)), bt, btv, 2, &v) == SYM_OK && v == 125);

  /* Cancelling substitution: (B + 1)^2 - B^2 at nothing is 2*B + 1. */
  SymDim *b1 = add(B, K(1));
  const char *bn[] = {"B"};
  int64_t bneg[] = {-1};
  EXPECT(sym_is_const(sym_subst(A, mul(b1, b1), bn, bneg, 1, &st), &v) && v == 0);

  /* Atoms are computed once their symbols are bound. */
  SymDim *q = divs(C, H, NULL);
  const char *ch[] = {"C", "H"};
  int64_t ok[] = {768, 12}, bad[] = {10, 3}, zero[] = {10, 0};
  EXPECT(sym_eval(q, ch, ok, 2, &v) == SYM_OK && v == 64);
  EXPECT(sym_eval(q, ch, bad, 2, &v) == SYM_NOT_DIVISIBLE);
  EXPECT(sym_eval(q, ch, zero, 2, &v) == SYM_DIV_BY_ZERO);
  EXPECT(sym_is_const(sym_subst(A, q, ch, ok, 2, &st), &v) && v == 64 && st == SYM_OK);
  EXPECT(sym_subst(A, q, ch, bad, 2, &st) == NULL && st == SYM_NOT_DIVISIBLE);
  EXPECT(sym_subst(A, q, ch, zero, 2, &st) == NULL && st == SYM_DIV_BY_ZERO);
  const char *hn[] = {"H"};
  int64_t h12[] = {12};
  SymDim *q12 = sym_subst(A, mul(B, q), hn, h12, 1, &st);
  EXPECT_STR(S(q12), "(C/12)*B");
  EXPECT(sym_equal(q12, mul(B, divs(C, K(12), NULL))));
  const char *bc[] = {"B", "C"};
  int64_t bcv[] = {2, 768};
  EXPECT(sym_eval(q12, bc, bcv, 2, &v) == SYM_OK && v == 128);
  /* Substituting a multiple makes the quotient exact again. */
  const char *cn[] = {"C"};
  int64_t c48[] = {48};
  EXPECT_STR(S(sym_subst(A, divs(mul(C, T), H, NULL), cn, c48, 1, &st)), "(48*T/H)");
  SymDim *m = sym_mod(A, C, H, NULL);
  int64_t mv[] = {770, 12};
  EXPECT(sym_eval(m, ch, mv, 2, &v) == SYM_OK && v == 2);
  EXPECT(sym_is_const(sym_subst(A, m, ch, mv, 2, &st), &v) && v == 2);
  EXPECT_STR(sym_status_str(SYM_NOT_DIVISIBLE), "not divisible");
}

/* Random expressions over small values: the polynomial must evaluate like the
 * expression, and reassociated forms must compare equal. */
static uint64_t rng = 0x9e3779b97f4a7c15u;

static int64_t rnd(int64_t n) {
  rng = rng * 6364136223846793005u + 1442695040888963407u;
  return (int64_t)((rng >> 33) % (uint64_t)n);
}

static SymDim *random_expr(int depth, const int64_t *vals, int64_t *value) {
  static const char *const names[] = {"B", "C", "H", "T"};
  if (depth == 0 || rnd(4) == 0) {
    if (rnd(2)) {
      int i = (int)rnd(4);
      *value = vals[i];
      return V(names[i]);
    }
    *value = rnd(7) - 3;
    return K(*value);
  }
  int64_t l, r;
  SymDim *x = random_expr(depth - 1, vals, &l), *y = random_expr(depth - 1, vals, &r);
  switch (rnd(3)) {
  case 0: *value = l + r; return add(x, y);
  case 1: *value = l - r; return sub(x, y);
  default: *value = l * r; return mul(x, y);
  }
}

static void test_random(void) {
  const char *names[] = {"B", "C", "H", "T"};
  for (int iter = 0; iter < 2000; iter++) {
    int64_t vals[4];
    for (int i = 0; i < 4; i++) vals[i] = rnd(11) - 5;
    int64_t want, got = 0;
    SymDim *x = random_expr(4, vals, &want);
    EXPECT(sym_eval(x, names, vals, 4, &got) == SYM_OK && got == want);
    /* (x + y) * z == x*z + y*z, and (x*z)/z == x when z != 0. */
    int64_t yv, zv;
    SymDim *y = random_expr(3, vals, &yv), *z = random_expr(2, vals, &zv);
    EXPECT(sym_equal(mul(add(x, y), z), add(mul(x, z), mul(y, z))));
    SymStatus st;
    if (!sym_is_const(z, &zv) || zv != 0) {
      SymDim *q = divs(mul(x, z), z, &st);
      EXPECT(st == SYM_OK && sym_equal(q, x));
    }
    EXPECT(sym_equal(sym_subst(A, sub(add(x, y), y), names, vals, 4, &st), K(want)));
  }
}

int main(void) {
  A = arena_new();
  test_printing();
  test_identities();
  test_exact_division();
  test_inexact_division();
  test_mod();
  test_overflow();
  test_subst_eval();
  test_random();
  arena_free(A);
  TEST_DONE();
}
