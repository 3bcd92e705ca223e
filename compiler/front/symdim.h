/* symdim.h - tensor dimensions that may be symbolic, with exact arithmetic.
 *
 * A SymDim is a canonical polynomial with int64 coefficients over monomials of
 * named symbols (a batch size `B`, an unbound layer parameter `C`): `3*B*T + 2`.
 * Canonical means equal polynomials have equal representations however they
 * were built, so sym_equal and sym_str agree: (B+1)*(B+1) prints and compares
 * as `B^2 + 2*B + 1`.
 *
 * Values are immutable once built and live in the arena passed in; results may
 * share storage with their operands. Nothing needs freeing.
 *
 * Failure: an operation that fails returns NULL. add/sub/mul/subst only fail on
 * int64 overflow (or a symbol power above SYM_MAX_POWER, or a polynomial above
 * SYM_MAX_TERMS terms, both reported as overflow); overflow is detected, never UB.
 * A NULL operand (an earlier failure) gives NULL again, so a chain of arithmetic
 * can be checked once at the end; div/mod/subst/eval report it as SYM_OVERFLOW.
 *
 * Quotients that do not divide: x / y with y not dividing x as a polynomial
 * (over the integers) becomes an opaque atom symbol named "(C/H)", after
 * cancelling the integer content and the common monomial of x and y and making
 * y's leading coefficient positive, so (2*C)/(2*H) is the same atom as C/H.
 * The atom is treated as a fresh symbol, except that it stands for an exact
 * quotient (hpd's integer `/` is an error when it leaves a remainder): a term
 * holding (X/Y) times a multiple of a one-term Y cancels, so H*(C/H) = C and
 * split_heads/merge_heads round-trip. The atom keeps X and Y, so sym_subst and
 * sym_eval compute it once its symbols are bound (and report
 * SYM_NOT_DIVISIBLE then if Y does not divide X). Remainders that are not
 * known to be 0 become atoms "(C%H)" in the same way, without cancellation.
 *
 * Limits: powers up to SYM_MAX_POWER; exact division by a polynomial of more
 * than one term gives up after SYM_MAX_DIV_STEPS steps (the result is then an
 * atom); an intermediate coefficient overflow while summing or dividing is
 * reported as overflow even where the final result would fit. Names given to
 * sym_var must not start with '(' (that prefix is reserved for atoms). */
#ifndef HPDL_SYMDIM_H
#define HPDL_SYMDIM_H

#include <stdint.h>

#include "arena.h"

enum { SYM_MAX_POWER = 1024, SYM_MAX_TERMS = 1 << 16, SYM_MAX_DIV_STEPS = 4096 };

typedef struct SymDim SymDim;

typedef enum {
  SYM_OK,
  SYM_NOT_DIVISIBLE, /* constant / constant with a remainder */
  SYM_DIV_BY_ZERO,
  SYM_OVERFLOW,      /* int64 overflow, or a NULL operand */
  SYM_UNBOUND,       /* sym_eval met a symbol with no value */
} SymStatus;

SymDim *sym_const(Arena *a, int64_t v);
/* The symbol `name` (copied). */
SymDim *sym_var(Arena *a, const char *name);

/* NULL on overflow. */
SymDim *sym_add(Arena *a, const SymDim *x, const SymDim *y);
SymDim *sym_sub(Arena *a, const SymDim *x, const SymDim *y);
SymDim *sym_mul(Arena *a, const SymDim *x, const SymDim *y);

/* x / y: the exact quotient when y divides x ((4*C)/4 = C, (B*T*C)/T = B*C,
 * 12/4 = 3); otherwise NULL with SYM_NOT_DIVISIBLE when both are constants,
 * else an atom "(C/H)" with SYM_OK. NULL with SYM_DIV_BY_ZERO when y is 0, and
 * SYM_OVERFLOW (INT64_MIN / -1). `status` may be NULL. */
SymDim *sym_div(Arena *a, const SymDim *x, const SymDim *y, SymStatus *status);
/* x % y (C's sign rule: the remainder takes the dividend's sign). Constants
 * give a constant; 0 when y divides x ((B*T) % T); otherwise an atom "(C%H)". */
SymDim *sym_mod(Arena *a, const SymDim *x, const SymDim *y, SymStatus *status);

/* 1 when x and y are the same polynomial; 0 otherwise or when either is NULL. */
int sym_equal(const SymDim *x, const SymDim *y);
/* 1 when x is a constant, storing it in *value (when value is not NULL). */
int sym_is_const(const SymDim *x, int64_t *value);

/* Replaces the symbols names[0..n) by values[0..n) (n < 0: up to a NULL name);
 * the rest stays symbolic.
 * Atoms whose operands become constant are computed, which can fail with
 * SYM_NOT_DIVISIBLE or SYM_DIV_BY_ZERO (NULL result). `status` may be NULL. */
SymDim *sym_subst(Arena *a, const SymDim *x, const char *const *names,
                  const int64_t *values, int n, SymStatus *status);

/* Evaluates x with the symbols names[0..n) bound to values[0..n) (n < 0: up
 * to a NULL name) into *out.
 * SYM_UNBOUND when x mentions another symbol; *out is only set on SYM_OK. */
SymStatus sym_eval(const SymDim *x, const char *const *names, const int64_t *values,
                   int n, int64_t *out);

/* Canonical text, in the arena: terms by descending degree, then by symbol
 * name (so the constant comes last), symbols in a term sorted by name, the
 * coefficient first: "768*B*T", "3*B*T + 2", "B^2 - 3*B + 1", "-C", "(C/H)".
 * "0" for zero; "(invalid)" for NULL. */
const char *sym_str(Arena *a, const SymDim *x);

/* Text for a status, for diagnostics. */
const char *sym_status_str(SymStatus s);

#endif
