/* symdim.c - symbolic dimensions as canonical integer polynomials.
 *
 * A polynomial is an array of terms in descending graded-lex order (total
 * degree, then the exponent of the alphabetically first symbol, ...), with no
 * zero coefficients and no repeated monomials; a term's factors are sorted by
 * name. Graded-lex is a monomial order (compatible with multiplication), which
 * both gives the printing order and makes leading-term division correct. */
#include "symdim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Atom operations: an exact quotient or a remainder of two polynomials. */
typedef struct {
  char kind; /* '/' or '%' */
  const SymDim *num, *den;
} SymOp;

typedef struct {
  const char *name;
  const SymOp *op; /* NULL for a plain symbol */
  int pow;
} Factor;

typedef struct {
  int64_t coef;
  int nfac;
  const Factor *fac;
} Term;

struct SymDim {
  int nterms; /* 0 for the constant 0 */
  const Term *terms;
};

enum { MAX_REWRITE_ROUNDS = 64 };

static void set_status(SymStatus *s, SymStatus v) {
  if (s) *s = v;
}

/* ---- building blocks ---- */

static SymDim *wrap(Arena *a, const Term *terms, int n) {
  SymDim *d = arena_alloc(a, sizeof *d);
  d->nterms = n;
  d->terms = n ? terms : NULL;
  return d;
}

static Term *new_terms(Arena *a, size_t n) {
  return n ? arena_alloc(a, n * sizeof(Term)) : NULL;
}

static SymDim *zero(Arena *a) { return wrap(a, NULL, 0); }

/* A one-term polynomial; the term is copied since callers pass locals. */
static SymDim *from_term(Arena *a, const Term *t) {
  Term *c = new_terms(a, 1);
  *c = *t;
  return wrap(a, c, 1);
}

static int is_const_poly(const SymDim *x) {
  return x->nterms == 0 || (x->nterms == 1 && x->terms[0].nfac == 0);
}

static int64_t const_value(const SymDim *x) { return x->nterms ? x->terms[0].coef : 0; }

static int name_cmp(const char *x, const char *y) { return x == y ? 0 : strcmp(x, y); }

static long degree(const Term *t) {
  long d = 0;
  for (int i = 0; i < t->nfac; i++) d += t->fac[i].pow;
  return d;
}

/* >0 when x's monomial comes first (is larger) in graded-lex order. */
static int mono_cmp(const Term *x, const Term *y) {
  long dx = degree(x), dy = degree(y);
  if (dx != dy) return dx > dy ? 1 : -1;
  int i = 0;
  for (; i < x->nfac && i < y->nfac; i++) {
    int c = name_cmp(x->fac[i].name, y->fac[i].name);
    /* The one holding the earlier name has a positive exponent where the other has 0. */
    if (c) return c < 0 ? 1 : -1;
    if (x->fac[i].pow != y->fac[i].pow) return x->fac[i].pow > y->fac[i].pow ? 1 : -1;
  }
  return (i < x->nfac) - (i < y->nfac);
}

static int term_order(const void *p, const void *q) { return mono_cmp(q, p); }

/* |v| without overflow. */
static uint64_t mag(int64_t v) { return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v; }

/* c / d for d != 0: SYM_OK with *q, SYM_NOT_DIVISIBLE, or SYM_OVERFLOW. */
static SymStatus coef_div(int64_t c, int64_t d, int64_t *q) {
  if (d == -1) { /* INT64_MIN / -1 and INT64_MIN % -1 are UB */
    if (c == INT64_MIN) return SYM_OVERFLOW;
    *q = -c;
    return SYM_OK;
  }
  if (c % d) return SYM_NOT_DIVISIBLE;
  *q = c / d;
  return SYM_OK;
}

/* x's monomial times y's; 0 when a power passes SYM_MAX_POWER. */
static int mono_mul(Arena *a, const Term *x, const Term *y, Term *out) {
  if (!x->nfac || !y->nfac) { /* share the other's factors: nothing to merge */
    const Term *t = x->nfac ? x : y;
    out->nfac = t->nfac;
    out->fac = t->fac;
    return 1;
  }
  Factor *f = arena_alloc(a, (size_t)(x->nfac + y->nfac) * sizeof *f);
  int i = 0, j = 0, n = 0;
  while (i < x->nfac || j < y->nfac) {
    int c = i == x->nfac ? 1 : j == y->nfac ? -1 : name_cmp(x->fac[i].name, y->fac[j].name);
    if (c < 0) {
      f[n++] = x->fac[i++];
    } else if (c > 0) {
      f[n++] = y->fac[j++];
    } else {
      f[n] = x->fac[i];
      f[n].pow = x->fac[i++].pow + y->fac[j++].pow;
      if (f[n++].pow > SYM_MAX_POWER) return 0;
    }
  }
  out->nfac = n;
  out->fac = f;
  return 1;
}

/* 1 when d's monomial divides t's. */
static int mono_divides(const Term *t, const Term *d) {
  int i = 0;
  for (int j = 0; j < d->nfac; j++) {
    while (i < t->nfac && name_cmp(t->fac[i].name, d->fac[j].name) < 0) i++;
    if (i == t->nfac || name_cmp(t->fac[i].name, d->fac[j].name) != 0 ||
        t->fac[i].pow < d->fac[j].pow)
      return 0;
    i++;
  }
  return 1;
}

/* t's monomial over d's (which must divide it). */
static void mono_div(Arena *a, const Term *t, const Term *d, Term *out) {
  if (!d->nfac) {
    out->nfac = t->nfac;
    out->fac = t->fac;
    return;
  }
  Factor *f = t->nfac ? arena_alloc(a, (size_t)t->nfac * sizeof *f) : NULL;
  int n = 0, j = 0;
  for (int i = 0; i < t->nfac; i++) {
    f[n] = t->fac[i];
    if (j < d->nfac && name_cmp(t->fac[i].name, d->fac[j].name) == 0) f[n].pow -= d->fac[j++].pow;
    if (f[n].pow) n++;
  }
  out->nfac = n;
  out->fac = n ? f : NULL;
}

/* Sums runs of equal monomials in a sorted array and drops zero terms;
 * -1 on overflow, else the new length. */
static int combine_sorted(Term *t, int n) {
  int w = 0;
  for (int i = 0; i < n;) {
    int64_t c = t[i].coef;
    int j = i + 1;
    for (; j < n && mono_cmp(&t[i], &t[j]) == 0; j++)
      if (__builtin_add_overflow(c, t[j].coef, &c)) return -1;
    if (c) {
      t[w] = t[i];
      t[w++].coef = c;
    }
    i = j;
  }
  return w;
}

/* ---- ring operations without atom cancellation ---- */

/* x + y, or x - y when negate_y; NULL on overflow. */
static SymDim *add_raw(Arena *a, const SymDim *x, const SymDim *y, int negate_y) {
  int nx = x->nterms, ny = y->nterms;
  Term *t = new_terms(a, (size_t)nx + (size_t)ny);
  int i = 0, j = 0, n = 0;
  while (i < nx || j < ny) {
    int c = i == nx ? -1 : j == ny ? 1 : mono_cmp(&x->terms[i], &y->terms[j]);
    if (c > 0) {
      t[n++] = x->terms[i++];
      continue;
    }
    int64_t yc = y->terms[j].coef, s;
    if (c < 0) {
      if (negate_y && __builtin_sub_overflow((int64_t)0, yc, &yc)) return NULL;
      t[n] = y->terms[j++];
      t[n++].coef = yc;
      continue;
    }
    int ovf = negate_y ? __builtin_sub_overflow(x->terms[i].coef, yc, &s)
                       : __builtin_add_overflow(x->terms[i].coef, yc, &s);
    if (ovf) return NULL;
    if (s) {
      t[n] = x->terms[i];
      t[n++].coef = s;
    }
    i++;
    j++;
  }
  return wrap(a, t, n);
}

static SymDim *mul_raw(Arena *a, const SymDim *x, const SymDim *y) {
  int nx = x->nterms, ny = y->nterms;
  if (!nx || !ny) return zero(a);
  if ((long long)nx * ny > SYM_MAX_TERMS) return NULL;
  Term *t = new_terms(a, (size_t)nx * (size_t)ny);
  int n = 0;
  for (int i = 0; i < nx; i++)
    for (int j = 0; j < ny; j++) {
      if (__builtin_mul_overflow(x->terms[i].coef, y->terms[j].coef, &t[n].coef)) return NULL;
      if (!mono_mul(a, &x->terms[i], &y->terms[j], &t[n])) return NULL;
      n++;
    }
  /* Multiplying by one term keeps the order (a monomial order is compatible
   * with multiplication) and cannot make monomials collide. */
  if (nx == 1 || ny == 1) return wrap(a, t, n);
  qsort(t, (size_t)n, sizeof *t, term_order);
  n = combine_sorted(t, n);
  return n < 0 ? NULL : wrap(a, t, n);
}

static SymDim *pow_raw(Arena *a, const SymDim *b, int e) {
  Term one = {1, 0, NULL};
  SymDim *r = from_term(a, &one);
  const SymDim *base = b;
  while (e) {
    if ((e & 1) && !(r = mul_raw(a, r, base))) return NULL;
    e >>= 1;
    if (e && !(base = mul_raw(a, base, base))) return NULL;
  }
  return r;
}

/* ---- cancelling quotient atoms ---- */

/* When t = c * q * M with q = X/Y an atom, Y a single term that divides c * M,
 * sets *rest = (c * M) / Y and *num = X: t equals rest * X, because hpd's `/` is
 * exact. Only the first such atom in name order is used, so the result is
 * deterministic. */
static int find_cancel(Arena *a, const Term *t, Term *rest, const SymDim **num) {
  for (int i = 0; i < t->nfac; i++) {
    const SymOp *op = t->fac[i].op;
    if (!op || op->kind != '/' || op->den->nterms != 1) continue;
    const Term *d = &op->den->terms[0];
    int64_t c;
    if (coef_div(t->coef, d->coef, &c) != SYM_OK) continue;
    Factor qf = t->fac[i];
    qf.pow = 1;
    Term q = {1, 1, &qf}, without;
    mono_div(a, t, &q, &without);
    if (!mono_divides(&without, d)) continue;
    mono_div(a, &without, d, rest);
    rest->coef = c;
    *num = op->num;
    return 1;
  }
  return 0;
}

static int has_quotient(const SymDim *p) {
  for (int i = 0; i < p->nterms; i++)
    for (int j = 0; j < p->terms[i].nfac; j++)
      if (p->terms[i].fac[j].op && p->terms[i].fac[j].op->kind == '/') return 1;
  return 0;
}

/* Rewrites cancellable terms until none is left (bounded: each rewrite
 * replaces an atom by its strictly smaller numerator). NULL on overflow. */
static SymDim *normalize(Arena *a, SymDim *p) {
  for (int round = 0; p && round < MAX_REWRITE_ROUNDS; round++) {
    if (!has_quotient(p)) return p;
    Term *keep = new_terms(a, (size_t)p->nterms);
    int nk = 0, changed = 0;
    SymDim *extra = zero(a);
    for (int i = 0; i < p->nterms; i++) {
      Term rest;
      const SymDim *num;
      if (find_cancel(a, &p->terms[i], &rest, &num)) {
        SymDim *r = mul_raw(a, from_term(a, &rest), num);
        if (!r || !(extra = add_raw(a, extra, r, 0))) return NULL;
        changed = 1;
      } else {
        keep[nk++] = p->terms[i];
      }
    }
    if (!changed) return p;
    p = add_raw(a, wrap(a, keep, nk), extra, 0);
  }
  return p;
}

/* ---- division ---- */

/* x / t for a single term t, when it divides every term of x. */
static SymDim *div_by_term(Arena *a, const SymDim *x, const Term *d, SymStatus *st) {
  Term *t = new_terms(a, (size_t)x->nterms);
  for (int i = 0; i < x->nterms; i++) {
    SymStatus s = coef_div(x->terms[i].coef, d->coef, &t[i].coef);
    if (s != SYM_OK) {
      *st = s;
      return NULL;
    }
    if (!mono_divides(&x->terms[i], d)) {
      *st = SYM_NOT_DIVISIBLE;
      return NULL;
    }
    mono_div(a, &x->terms[i], d, &t[i]);
  }
  /* Dividing by one monomial keeps the order, as multiplying does. */
  *st = SYM_OK;
  return wrap(a, t, x->nterms);
}

/* The exact quotient over the integers, treating atoms as plain symbols:
 * repeated leading-term division, which finds q whenever x = q*y. */
static SymDim *exact_div(Arena *a, const SymDim *x, const SymDim *y, SymStatus *st) {
  if (y->nterms == 1) return div_by_term(a, x, &y->terms[0], st);
  const SymDim *r = x;
  SymDim *q = zero(a);
  for (int step = 0; r->nterms; step++) {
    Term t;
    SymStatus s = step == SYM_MAX_DIV_STEPS ? SYM_NOT_DIVISIBLE
                                            : coef_div(r->terms[0].coef, y->terms[0].coef, &t.coef);
    if (s == SYM_OK && !mono_divides(&r->terms[0], &y->terms[0])) s = SYM_NOT_DIVISIBLE;
    if (s != SYM_OK) {
      *st = s;
      return NULL;
    }
    mono_div(a, &r->terms[0], &y->terms[0], &t);
    SymDim *tp = from_term(a, &t), *prod;
    if (!(q = add_raw(a, q, tp, 0)) || !(prod = mul_raw(a, tp, y)) ||
        !(r = add_raw(a, r, prod, 1))) {
      *st = SYM_OVERFLOW;
      return NULL;
    }
  }
  *st = SYM_OK;
  return q;
}

/* ---- printing ---- */

/* A writer that only counts when buf is NULL, so sym_str sizes then writes. */
typedef struct {
  char *buf;
  size_t len;
} Out;

static void put(Out *o, const char *s) {
  size_t n = strlen(s);
  if (o->buf) memcpy(o->buf + o->len, s, n);
  o->len += n;
}

static void put_u64(Out *o, uint64_t v) {
  char tmp[24];
  snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  put(o, tmp);
}

static void write_poly(Out *o, const SymDim *x) {
  if (!x->nterms) put(o, "0");
  for (int i = 0; i < x->nterms; i++) {
    const Term *t = &x->terms[i];
    int neg = t->coef < 0;
    uint64_t m = mag(t->coef);
    if (i) put(o, neg ? " - " : " + ");
    else if (neg) put(o, "-");
    if (!t->nfac || m != 1) put_u64(o, m);
    for (int j = 0; j < t->nfac; j++) {
      if (j || m != 1) put(o, "*");
      put(o, t->fac[j].name);
      if (t->fac[j].pow > 1) {
        put(o, "^");
        put_u64(o, (uint64_t)t->fac[j].pow);
      }
    }
  }
}

const char *sym_str(Arena *a, const SymDim *x) {
  if (!x) return "(invalid)";
  Out o = {NULL, 0};
  write_poly(&o, x);
  char *buf = arena_alloc(a, o.len + 1);
  o = (Out){buf, 0};
  write_poly(&o, x);
  return buf;
}

/* ---- atoms ---- */

/* The atom (num kind den) as a polynomial. Its name is canonical because its
 * operands are, and bracketed so that different operands never print alike. */
static SymDim *make_atom(Arena *a, char kind, const SymDim *num, const SymDim *den) {
  const Term *d = &den->terms[0];
  int pn = num->nterms > 1;
  int pd = !(den->nterms == 1 && d->coef > 0 && (d->nfac == 0 || (d->coef == 1 && d->nfac == 1)));
  char k[2] = {kind, '\0'};
  SymOp *op = arena_alloc(a, sizeof *op);
  op->kind = kind;
  op->num = num;
  op->den = den;
  Factor *f = arena_alloc(a, sizeof *f);
  f->name = arena_printf(a, "(%s%s%s%s%s%s%s)", pn ? "(" : "", sym_str(a, num), pn ? ")" : "",
                         k, pd ? "(" : "", sym_str(a, den), pd ? ")" : "");
  f->op = op;
  f->pow = 1;
  Term t = {1, 1, f};
  return from_term(a, &t);
}

static uint64_t gcd_u64(uint64_t x, uint64_t y) {
  while (y) {
    uint64_t r = x % y;
    x = y;
    y = r;
  }
  return x;
}

/* p with every coefficient divided by g (which divides them all, maybe 2^63)
 * and every monomial by cm; negated too when neg. NULL on overflow. */
static SymDim *scale_down(Arena *a, const SymDim *p, uint64_t g, const Term *cm, int neg) {
  Term *t = new_terms(a, (size_t)p->nterms);
  for (int i = 0; i < p->nterms; i++) {
    uint64_t m = mag(p->terms[i].coef) / g;
    int negative = (p->terms[i].coef < 0) != neg;
    if (!negative && m > (uint64_t)INT64_MAX) return NULL;
    /* Written so that m = 2^63 becomes INT64_MIN without an out-of-range conversion. */
    t[i].coef = negative ? -(int64_t)(m - 1) - 1 : (int64_t)m;
    mono_div(a, &p->terms[i], cm, &t[i]);
  }
  return wrap(a, t, p->nterms);
}

/* The atom x/y (y not dividing x), with the common integer content and common
 * monomial cancelled and y's leading coefficient made positive, so equal
 * quotients get equal names. */
static SymDim *quotient_atom(Arena *a, const SymDim *x, const SymDim *y, SymStatus *st) {
  uint64_t g = 0;
  const SymDim *both[2] = {x, y};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < both[k]->nterms; i++) g = gcd_u64(g, mag(both[k]->terms[i].coef));
  /* The common monomial: x's first term's factors at their minimum power. */
  const Term *first = &x->terms[0];
  Factor *cf = first->nfac ? arena_alloc(a, (size_t)first->nfac * sizeof *cf) : NULL;
  int nc = first->nfac;
  if (nc) memcpy(cf, first->fac, (size_t)nc * sizeof *cf);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < both[k]->nterms && nc; i++) {
      const Term *t = &both[k]->terms[i];
      int w = 0;
      for (int c = 0; c < nc; c++) {
        int j = 0;
        while (j < t->nfac && name_cmp(t->fac[j].name, cf[c].name) != 0) j++;
        if (j == t->nfac) continue;
        cf[w] = cf[c];
        if (t->fac[j].pow < cf[w].pow) cf[w].pow = t->fac[j].pow;
        w++;
      }
      nc = w;
    }
  Term cm = {1, nc, nc ? cf : NULL};
  int neg = y->terms[0].coef < 0;
  SymDim *nx = scale_down(a, x, g, &cm, neg), *ny = scale_down(a, y, g, &cm, neg);
  if (!nx || !ny) {
    *st = SYM_OVERFLOW;
    return NULL;
  }
  *st = SYM_OK;
  return make_atom(a, '/', nx, ny);
}

/* ---- public operations ---- */

SymDim *sym_const(Arena *a, int64_t v) {
  Term t = {v, 0, NULL};
  return v ? from_term(a, &t) : zero(a);
}

SymDim *sym_var(Arena *a, const char *name) {
  Factor *f = arena_alloc(a, sizeof *f);
  f->name = arena_strdup(a, name);
  f->pow = 1;
  Term t = {1, 1, f};
  return from_term(a, &t);
}

SymDim *sym_add(Arena *a, const SymDim *x, const SymDim *y) {
  return x && y ? normalize(a, add_raw(a, x, y, 0)) : NULL;
}

SymDim *sym_sub(Arena *a, const SymDim *x, const SymDim *y) {
  return x && y ? normalize(a, add_raw(a, x, y, 1)) : NULL;
}

SymDim *sym_mul(Arena *a, const SymDim *x, const SymDim *y) {
  return x && y ? normalize(a, mul_raw(a, x, y)) : NULL;
}

SymDim *sym_div(Arena *a, const SymDim *x, const SymDim *y, SymStatus *status) {
  SymStatus st = SYM_OVERFLOW;
  SymDim *r = NULL;
  if (x && y) {
    if (!y->nterms) {
      st = SYM_DIV_BY_ZERO;
    } else if (!x->nterms) {
      st = SYM_OK;
      r = zero(a);
    } else if ((r = exact_div(a, x, y, &st))) {
      if (!(r = normalize(a, r))) st = SYM_OVERFLOW;
    } else if (st == SYM_NOT_DIVISIBLE && !(is_const_poly(x) && is_const_poly(y))) {
      r = quotient_atom(a, x, y, &st);
    }
  }
  set_status(status, st);
  return r;
}

SymDim *sym_mod(Arena *a, const SymDim *x, const SymDim *y, SymStatus *status) {
  SymStatus st = SYM_OK;
  SymDim *r = NULL;
  if (!x || !y) {
    st = SYM_OVERFLOW;
  } else if (!y->nterms) {
    st = SYM_DIV_BY_ZERO;
  } else if (is_const_poly(x) && is_const_poly(y)) {
    int64_t d = const_value(y);
    r = sym_const(a, d == -1 ? 0 : const_value(x) % d); /* INT64_MIN % -1 is UB */
  } else {
    SymStatus s;
    /* A quotient that overflows still leaves a meaningful remainder: keep it symbolic. */
    r = !x->nterms || exact_div(a, x, y, &s) ? zero(a) : make_atom(a, '%', x, y);
  }
  set_status(status, st);
  return r;
}

int sym_equal(const SymDim *x, const SymDim *y) {
  if (!x || !y || x->nterms != y->nterms) return 0;
  for (int i = 0; i < x->nterms; i++) {
    const Term *s = &x->terms[i], *t = &y->terms[i];
    if (s->coef != t->coef || s->nfac != t->nfac) return 0;
    for (int j = 0; j < s->nfac; j++)
      if (s->fac[j].pow != t->fac[j].pow || name_cmp(s->fac[j].name, t->fac[j].name)) return 0;
  }
  return 1;
}

int sym_is_const(const SymDim *x, int64_t *value) {
  if (!x || !is_const_poly(x)) return 0;
  if (value) *value = const_value(x);
  return 1;
}

/* ---- substitution and evaluation ---- */

static int lookup(const char *name, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

static int mentions(const SymDim *x, const char *const *names, int n);

static int factor_mentions(const Factor *f, const char *const *names, int n) {
  return f->op ? mentions(f->op->num, names, n) || mentions(f->op->den, names, n)
               : lookup(f->name, names, n) >= 0;
}

static int mentions(const SymDim *x, const char *const *names, int n) {
  for (int i = 0; i < x->nterms; i++)
    for (int j = 0; j < x->terms[i].nfac; j++)
      if (factor_mentions(&x->terms[i].fac[j], names, n)) return 1;
  return 0;
}

static SymDim *subst_poly(Arena *a, const SymDim *x, const char *const *names,
                          const int64_t *values, int n, SymStatus *st);

/* The value of one factor (to the first power) after substitution. */
static SymDim *subst_factor(Arena *a, const Factor *f, const char *const *names,
                            const int64_t *values, int n, SymStatus *st) {
  if (!f->op) return sym_const(a, values[lookup(f->name, names, n)]);
  SymDim *num = subst_poly(a, f->op->num, names, values, n, st);
  if (!num) return NULL;
  SymDim *den = subst_poly(a, f->op->den, names, values, n, st);
  if (!den) return NULL;
  return f->op->kind == '/' ? sym_div(a, num, den, st) : sym_mod(a, num, den, st);
}

static SymDim *subst_poly(Arena *a, const SymDim *x, const char *const *names,
                          const int64_t *values, int n, SymStatus *st) {
  if (!mentions(x, names, n)) return wrap(a, x->terms, x->nterms);
  SymDim *acc = zero(a);
  for (int i = 0; i < x->nterms; i++) {
    const Term *t = &x->terms[i];
    /* Untouched factors stay as they are (a sorted subset is still canonical);
     * the others are multiplied in as polynomials. */
    Factor *kept = t->nfac ? arena_alloc(a, (size_t)t->nfac * sizeof *kept) : NULL;
    int nk = 0;
    for (int j = 0; j < t->nfac; j++)
      if (!factor_mentions(&t->fac[j], names, n)) kept[nk++] = t->fac[j];
    Term base = {t->coef, nk, nk ? kept : NULL};
    SymDim *tp = from_term(a, &base);
    for (int j = 0; j < t->nfac && tp; j++) {
      const Factor *f = &t->fac[j];
      if (!factor_mentions(f, names, n)) continue;
      SymDim *v = subst_factor(a, f, names, values, n, st), *p;
      if (!v) return NULL;
      tp = (p = pow_raw(a, v, f->pow)) ? mul_raw(a, tp, p) : NULL;
    }
    if (!tp || !(acc = add_raw(a, acc, tp, 0))) {
      *st = SYM_OVERFLOW;
      return NULL;
    }
  }
  if (!(acc = normalize(a, acc))) *st = SYM_OVERFLOW;
  return acc;
}

/* n < 0 means names is NULL-terminated. */
static int count_names(const char *const *names, int n) {
  if (n >= 0) return n;
  n = 0;
  while (names && names[n]) n++;
  return n;
}

SymDim *sym_subst(Arena *a, const SymDim *x, const char *const *names, const int64_t *values,
                  int n, SymStatus *status) {
  SymStatus st = SYM_OK;
  n = count_names(names, n);
  SymDim *r = x ? subst_poly(a, x, names, values, n, &st) : NULL;
  if (!x) st = SYM_OVERFLOW;
  set_status(status, r ? SYM_OK : st);
  return r;
}

static SymStatus eval_poly(const SymDim *x, const char *const *names, const int64_t *values,
                           int n, int64_t *out);

static SymStatus eval_factor(const Factor *f, const char *const *names, const int64_t *values,
                             int n, int64_t *out) {
  if (!f->op) {
    int i = lookup(f->name, names, n);
    if (i < 0) return SYM_UNBOUND;
    *out = values[i];
    return SYM_OK;
  }
  int64_t num, den;
  SymStatus s = eval_poly(f->op->num, names, values, n, &num);
  if (s == SYM_OK) s = eval_poly(f->op->den, names, values, n, &den);
  if (s != SYM_OK) return s;
  if (!den) return SYM_DIV_BY_ZERO;
  if (f->op->kind == '/') return coef_div(num, den, out);
  *out = den == -1 ? 0 : num % den;
  return SYM_OK;
}

static SymStatus eval_poly(const SymDim *x, const char *const *names, const int64_t *values,
                           int n, int64_t *out) {
  int64_t acc = 0;
  for (int i = 0; i < x->nterms; i++) {
    const Term *t = &x->terms[i];
    int64_t v = t->coef;
    for (int j = 0; j < t->nfac; j++) {
      int64_t fv;
      SymStatus s = eval_factor(&t->fac[j], names, values, n, &fv);
      if (s != SYM_OK) return s;
      for (int k = 0; k < t->fac[j].pow; k++)
        if (__builtin_mul_overflow(v, fv, &v)) return SYM_OVERFLOW;
    }
    if (__builtin_add_overflow(acc, v, &acc)) return SYM_OVERFLOW;
  }
  *out = acc;
  return SYM_OK;
}

SymStatus sym_eval(const SymDim *x, const char *const *names, const int64_t *values, int n,
                   int64_t *out) {
  if (!x) return SYM_OVERFLOW;
  int64_t v;
  SymStatus s = eval_poly(x, names, values, count_names(names, n), &v);
  if (s == SYM_OK) *out = v;
  return s;
}

const char *sym_status_str(SymStatus s) {
  switch (s) {
  case SYM_OK: return "ok";
  case SYM_NOT_DIVISIBLE: return "not divisible";
  case SYM_DIV_BY_ZERO: return "division by zero";
  case SYM_OVERFLOW: return "integer overflow";
  case SYM_UNBOUND: return "unbound symbol";
  }
  return "?";
}
