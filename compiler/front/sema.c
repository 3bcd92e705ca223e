/* sema.c - semantic analysis by elaboration.
 *
 * The model is instantiated top-down with concrete parameter values; each
 * forward is checked with the argument shapes that reach it. Errors carry
 * notes for the instantiation chain ("in Linear(768, 2304) at gpt2.hpd:14:9")
 * so a mismatch deep in the standard library points back at the user's line. */
#include "sema.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "strmap.h"

/* ------------------------------------------------------------------ */
/* tables                                                              */


typedef struct {
  const char *name;
  int min_args, max_args;
} BuiltinInfo;

static const BuiltinInfo builtins[] = {
#define X(id, name, lo, hi) {name, lo, hi},
    SEM_BUILTINS(X)
#undef X
};

const char *sem_op_name(SemOp op) { return builtins[op].name; }

/* Builtins that are operators, not names a user calls. */
static int builtin_is_callable(SemOp op) {
  return op != SOP_NEG && op != SOP_ADD && op != SOP_SUB && op != SOP_MUL && op != SOP_DIV &&
         op != SOP_POW && op != SOP_MATMUL && op != SOP_SLICE;
}

static int find_builtin(const char *name) {
  for (int i = 0; i < SOP_COUNT; i++)
    if (builtin_is_callable((SemOp)i) && strcmp(builtins[i].name, name) == 0) return i;
  return -1;
}

static int is_unary_elementwise(SemOp op) { return op <= SOP_NEG; }

const char *sem_type_str(Arena *a, const TensorType *t) {
  char *s = arena_printf(a, "%s[", sem_dtype_name(t->dtype));
  for (int i = 0; i < t->rank; i++)
    s = arena_printf(a, "%s%s%s", s, i ? ", " : "", sym_str(a, t->dims[i]));
  return arena_printf(a, "%s]", s);
}

/* ------------------------------------------------------------------ */
/* context                                                             */

typedef enum { B_VALUE, B_TENSOR, B_CHILD, B_PARAM } BindKind;

typedef struct Binding Binding;
struct Binding {
  const char *name;
  BindKind kind;
  Value value;   /* B_VALUE */
  SemExpr *expr; /* B_TENSOR */
  int index;     /* B_CHILD, B_PARAM */
  Span span;
  Binding *next;
};

typedef struct Frame Frame;
struct Frame {
  const char *display;
  Span call_site;
  const AstDecl *decl;
  Frame *up;
  int is_call; /* a forward call rather than an instantiation */
};

typedef struct {
  int64_t heads;
  Span span;
  const char *what; /* the heads argument as written, e.g. "kv_heads" */
  Frame frames[6]; /* where the attention layer was instantiated */
  int nframes;
} HeadSplit;

typedef struct {
  Arena *arena;
  Diag *diag;
  const LoadedProgram *prog;
  const SemOptions *opts;
  SemLayer *instances;
  Frame *frame;
  int depth;
  PtrVec head_splits; /* HeadSplit* */
  Frame pending[6];   /* instantiation notes of the last error */
  int npending;
  StrMap callables;   /* layer / model / extern declarations by name */
  StrMap clusters;    /* cluster declarations by name */
  StrMap param_check; /* declaration name -> its parameter list's verdict */
  const char *cli_prefix; /* "--zero 5" while a command-line value is checked */
} Sema;

/* Limits that keep every check linear enough for hostile input (see the
 * "Limits" section of docs/language.md). */
enum { SEMA_MAX_DEPTH = 48, SEMA_MAX_FRAME_NOTES = 6, SEMA_MAX_PARAMS = 1024, SEMA_MAX_ITEMS = 8192 };

/* The instantiation chain ("in Linear(768, 2304), instantiated here") is
 * printed after the error's own hint and notes: sema_error records it and the
 * next error, or the end of the phase, prints it. */
static void flush_frame_notes(Sema *S) {
  for (int i = 0; i < S->npending; i++)
    diag_note(S->diag, S->pending[i].call_site, "in %s, %s here", S->pending[i].display,
              S->pending[i].is_call ? "called" : "instantiated");
  S->npending = 0;
}

static void record_frame_notes(Sema *S) {
  S->npending = 0;
  for (Frame *f = S->frame; f && S->npending < SEMA_MAX_FRAME_NOTES; f = f->up)
    if (f->call_site.file >= 0) S->pending[S->npending++] = *f;
}

static void sema_error(Sema *S, Span at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sema_error(Sema *S, Span at, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  flush_frame_notes(S);
  if (S->cli_prefix) diag_error(S->diag, at, "%s: %s", S->cli_prefix, buf);
  else diag_error(S->diag, at, "%s", buf);
  record_frame_notes(S);
}

/* Source-like text of an expression, for messages. */
static const char *expr_text(Sema *S, const AstExpr *e) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return "?";
  ast_print_expr(f, e);
  fclose(f);
  const char *r = arena_strdup(S->arena, buf ? buf : "?");
  free(buf);
  return r;
}

static Binding *bind(Sema *S, Binding **env, const char *name, BindKind kind, Span span) {
  Binding *b = arena_alloc(S->arena, sizeof *b);
  b->name = name;
  b->kind = kind;
  b->span = span;
  b->next = *env;
  *env = b;
  return b;
}

static Binding *lookup(Binding *env, const char *name) {
  for (; env; env = env->next)
    if (strcmp(env->name, name) == 0) return env;
  return NULL;
}

/* Closest bound name or builtin, for "did you mean" hints. */
static const char *suggest(Sema *S, Binding *env, const char *name, int with_builtins) {
  PtrVec cands = {0, 0, 0};
  for (Binding *b = env; b; b = b->next) ptrvec_push(S->arena, &cands, (void *)b->name);
  if (with_builtins)
    for (int i = 0; i < SOP_COUNT; i++)
      if (builtin_is_callable((SemOp)i)) ptrvec_push(S->arena, &cands, (void *)builtins[i].name);
  return diag_closest(name, (const char *const *)cands.items, cands.len);
}

static const AstDecl *find_decl(Sema *S, const char *name, int kind_mask) {
  const AstDecl *d = strmap_get(kind_mask & (1 << DECL_CLUSTER) ? &S->clusters : &S->callables, name);
  return d && (kind_mask & (1 << d->kind)) ? d : NULL;
}

#define DECL_CALLABLE ((1 << DECL_LAYER) | (1 << DECL_MODEL) | (1 << DECL_EXTERN))

static const char *suggest_decl(Sema *S, const char *name, int kind_mask) {
  PtrVec cands = {0, 0, 0};
  for (int f = 0; f < S->prog->nfiles; f++) {
    AstFile *file = S->prog->files[f];
    for (int i = 0; i < file->ndecls; i++) {
      const AstDecl *d = file->decls[i];
      if (d->name.name && (kind_mask & (1 << d->kind)))
        ptrvec_push(S->arena, &cands, (void *)d->name.name);
    }
  }
  return diag_closest(name, (const char *const *)cands.items, cands.len);
}

static Value none_value(Span at) {
  Value v;
  memset(&v, 0, sizeof v);
  v.kind = VAL_NONE;
  v.span = at;
  return v;
}

static Value int_value(int64_t i, Span at) {
  Value v = none_value(at);
  v.kind = VAL_INT;
  v.i = i;
  return v;
}

static Value float_value(double f, Span at) {
  Value v = none_value(at);
  v.kind = VAL_FLOAT;
  v.f = f;
  return v;
}

static Value bool_value(int b, Span at) {
  Value v = none_value(at);
  v.kind = VAL_BOOL;
  v.b = b;
  return v;
}

/* ------------------------------------------------------------------ */
/* compile-time evaluation                                             */

static int checked_add(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }
static int checked_sub(int64_t a, int64_t b, int64_t *r) { return !__builtin_sub_overflow(a, b, r); }
static int checked_mul(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }

static int is_number(const Value *v) { return v->kind == VAL_INT || v->kind == VAL_FLOAT; }

/* An unknown word where a number was wanted is most often a typo of a name. */
static void hint_for_word(Sema *S, Binding *env, const Value *v) {
  if (v->kind != VAL_ATOM) return;
  const char *close = suggest(S, env, v->s, 0);
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
}

static Value eval_const(Sema *S, Binding *env, const AstExpr *e);

static Value eval_binary(Sema *S, Binding *env, const AstExpr *e) {
  Value x = eval_const(S, env, e->u.op.a);
  if (e->u.op.op == OP_AND || e->u.op.op == OP_OR) {
    Value y = eval_const(S, env, e->u.op.b);
    if (x.kind == VAL_NONE || y.kind == VAL_NONE) return none_value(e->span);
    if (x.kind != VAL_BOOL || y.kind != VAL_BOOL) {
      sema_error(S, e->u.op.op_span, "'%s' needs two bools, not %s and %s", ast_op_text(e->u.op.op),
                 val_kind_name(x.kind), val_kind_name(y.kind));
      return none_value(e->span);
    }
    return bool_value(e->u.op.op == OP_AND ? x.b && y.b : x.b || y.b, e->span);
  }
  Value y = eval_const(S, env, e->u.op.b);
  if (x.kind == VAL_NONE || y.kind == VAL_NONE) return none_value(e->span);
  AstOp op = e->u.op.op;
  if (op == OP_EQ || op == OP_NE) {
    int eq = val_equal(&x, &y);
    if ((x.kind == VAL_STRING || x.kind == VAL_ATOM) && (y.kind == VAL_STRING || y.kind == VAL_ATOM))
      eq = strcmp(x.s, y.s) == 0;
    return bool_value(op == OP_EQ ? eq : !eq, e->span);
  }
  if (!is_number(&x) || !is_number(&y)) {
    const Value *bad = is_number(&x) ? &y : &x;
    sema_error(S, bad->span.file >= 0 ? bad->span : e->span, "'%s' needs numbers; this is %s %s",
               ast_op_text(op), bad->kind == VAL_ATOM ? "the unknown name" : val_kind_name(bad->kind),
               val_str(S->arena, bad));
    hint_for_word(S, env, bad);
    return none_value(e->span);
  }
  if (op == OP_MATMUL) {
    sema_error(S, e->u.op.op_span, "'@' multiplies tensors; here both sides are numbers");
    return none_value(e->span);
  }
  if (x.kind == VAL_INT && y.kind == VAL_INT) {
    int64_t r = 0;
    int ok = 1;
    switch (op) {
    case OP_ADD: ok = checked_add(x.i, y.i, &r); break;
    case OP_SUB: ok = checked_sub(x.i, y.i, &r); break;
    case OP_MUL: ok = checked_mul(x.i, y.i, &r); break;
    case OP_DIV:
    case OP_MOD:
      if (y.i == 0) {
        sema_error(S, e->u.op.b->span, "division by zero");
        return none_value(e->span);
      }
      if (x.i == INT64_MIN && y.i == -1) { ok = 0; break; }
      if (op == OP_DIV && x.i % y.i != 0) {
        sema_error(S, e->u.op.op_span, "%s is %" PRId64 " / %" PRId64 ", not a whole number", expr_text(S, e), x.i, y.i);
        diag_hint(S->diag, "integer '/' must divide exactly: choose sizes where %s divides %s (or write %" PRId64 ".0 / %" PRId64
                  " for a float)", expr_text(S, e->u.op.b), expr_text(S, e->u.op.a), x.i, y.i);
        return none_value(e->span);
      }
      r = op == OP_DIV ? x.i / y.i : x.i % y.i;
      break;
    case OP_POW: {
      if (y.i < 0) return float_value(pow((double)x.i, (double)y.i), e->span);
      r = 1;
      for (int64_t k = 0; k < y.i && ok; k++) ok = checked_mul(r, x.i, &r);
      break;
    }
    case OP_LT: return bool_value(x.i < y.i, e->span);
    case OP_LE: return bool_value(x.i <= y.i, e->span);
    case OP_GT: return bool_value(x.i > y.i, e->span);
    case OP_GE: return bool_value(x.i >= y.i, e->span);
    default: break;
    }
    if (!ok) {
      sema_error(S, e->span, "integer overflow in %s %s %s", val_str(S->arena, &x), ast_op_text(op),
                 val_str(S->arena, &y));
      return none_value(e->span);
    }
    return int_value(r, e->span);
  }
  double a, b;
  val_as_float(&x, &a);
  val_as_float(&y, &b);
  double r = 0;
  switch (op) {
  case OP_ADD: r = a + b; break;
  case OP_SUB: r = a - b; break;
  case OP_MUL: r = a * b; break;
  case OP_DIV:
    if (b == 0) {
      sema_error(S, e->u.op.b->span, "division by zero");
      return none_value(e->span);
    }
    r = a / b;
    break;
  case OP_MOD:
    if (b == 0) {
      sema_error(S, e->u.op.b->span, "division by zero");
      return none_value(e->span);
    }
    r = fmod(a, b);
    break;
  case OP_POW: r = pow(a, b); break;
  case OP_LT: return bool_value(a < b, e->span);
  case OP_LE: return bool_value(a <= b, e->span);
  case OP_GT: return bool_value(a > b, e->span);
  case OP_GE: return bool_value(a >= b, e->span);
  default: break;
  }
  if (!isfinite(r)) {
    sema_error(S, e->span, "the value of this expression is not a finite number");
    return none_value(e->span);
  }
  return float_value(r, e->span);
}

/* Scalar functions usable in parameter and constant expressions. */
static Value eval_scalar_call(Sema *S, Binding *env, const AstExpr *e, const char *fn, int *handled) {
  static const char *const unary[] = {"sqrt", "exp", "log", "abs", "int", "float"};
  *handled = 0;
  int which = -1;
  for (int k = 0; k < 6; k++)
    if (!strcmp(fn, unary[k])) which = k;
  int is_minmax = !strcmp(fn, "min") || !strcmp(fn, "max");
  if (which < 0 && !is_minmax) return none_value(e->span);
  *handled = 1;
  int want = is_minmax ? 2 : 1;
  if (e->u.call.nargs != want) {
    sema_error(S, e->span, "%s() takes %d argument%s here, not %d", fn, want, want == 1 ? "" : "s",
               e->u.call.nargs);
    return none_value(e->span);
  }
  Value x = eval_const(S, env, e->u.call.args[0].value);
  Value y = is_minmax ? eval_const(S, env, e->u.call.args[1].value) : x;
  if (x.kind == VAL_NONE || y.kind == VAL_NONE) return none_value(e->span);
  if (!is_number(&x) || !is_number(&y)) {
    sema_error(S, e->span, "%s() needs numbers", fn);
    return none_value(e->span);
  }
  double a, b;
  val_as_float(&x, &a);
  val_as_float(&y, &b);
  if (is_minmax) {
    if (x.kind == VAL_INT && y.kind == VAL_INT)
      return int_value(!strcmp(fn, "min") ? (x.i < y.i ? x.i : y.i) : (x.i > y.i ? x.i : y.i), e->span);
    return float_value(!strcmp(fn, "min") ? fmin(a, b) : fmax(a, b), e->span);
  }
  switch (which) {
  case 0:
    if (a < 0) {
      sema_error(S, e->span, "sqrt of a negative number (%g)", a);
      return none_value(e->span);
    }
    return float_value(sqrt(a), e->span);
  case 1: return float_value(exp(a), e->span);
  case 2:
    if (a <= 0) {
      sema_error(S, e->span, "log of a number that is not positive (%g)", a);
      return none_value(e->span);
    }
    return float_value(log(a), e->span);
  case 3: return x.kind == VAL_INT ? int_value(x.i < 0 ? -x.i : x.i, e->span) : float_value(fabs(a), e->span);
  case 4:
    if (!(fabs(a) < 9.0e18)) {
      sema_error(S, e->span, "int() of a number out of range");
      return none_value(e->span);
    }
    return int_value((int64_t)a, e->span);
  default: return float_value(a, e->span);
  }
}

static Value eval_const(Sema *S, Binding *env, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: return int_value(e->u.ival, e->span);
  case EX_FLOAT: {
    Value v = float_value(e->u.fval.value, e->span);
    v.unit = e->u.fval.unit;
    return v;
  }
  case EX_BOOL: return bool_value(e->u.bval, e->span);
  case EX_STRING: {
    Value v = none_value(e->span);
    v.kind = VAL_STRING;
    v.s = e->u.sval;
    return v;
  }
  case EX_NAME: {
    Binding *b = lookup(env, e->u.sval);
    if (b && b->kind == B_VALUE) {
      Value v = b->value; /* VAL_NONE when it failed: reported already */
      v.span = e->span;
      return v;
    }
    if (b) {
      sema_error(S, e->span, "'%s' is a %s, not a value known at compile time", e->u.sval,
                 b->kind == B_CHILD ? "sub-layer" : "tensor");
      return none_value(e->span);
    }
    /* A bare word: an atom such as gelu, column, auto, 1f1b. */
    Value v = none_value(e->span);
    v.kind = VAL_ATOM;
    v.s = e->u.sval;
    return v;
  }
  case EX_UNARY: {
    Value x = eval_const(S, env, e->u.op.a);
    if (x.kind == VAL_NONE) return x;
    if (e->u.op.op == OP_NOT) {
      if (x.kind != VAL_BOOL) {
        sema_error(S, e->span, "'not' needs a bool, not %s", val_kind_name(x.kind));
        return none_value(e->span);
      }
      return bool_value(!x.b, e->span);
    }
    if (x.kind == VAL_INT) {
      if (x.i == INT64_MIN) {
        sema_error(S, e->span, "integer overflow in negation");
        return none_value(e->span);
      }
      return int_value(-x.i, e->span);
    }
    if (x.kind == VAL_FLOAT) {
      Value v = float_value(-x.f, e->span);
      v.unit = x.unit;
      return v;
    }
    sema_error(S, e->span, "'-' needs a number, not %s %s", val_kind_name(x.kind), val_str(S->arena, &x));
    hint_for_word(S, env, &x);
    return none_value(e->span);
  }
  case EX_BINARY: return eval_binary(S, env, e);
  case EX_TUPLE:
  case EX_LIST: {
    Value v = none_value(e->span);
    v.kind = e->kind == EX_TUPLE ? VAL_TUPLE : VAL_LIST;
    v.n = e->u.list.nitems;
    v.items = arena_alloc(S->arena, sizeof(Value) * (size_t)(v.n + 1));
    for (int i = 0; i < v.n; i++) {
      v.items[i] = eval_const(S, env, e->u.list.items[i]);
      if (v.items[i].kind == VAL_NONE) return none_value(e->span);
    }
    return v;
  }
  case EX_CALL: {
    if (e->u.call.callee->kind != EX_NAME) {
      sema_error(S, e->u.call.callee->span, "only named functions can be called here");
      return none_value(e->span);
    }
    const char *fn = e->u.call.callee->u.sval;
    int handled;
    Value r = eval_scalar_call(S, env, e, fn, &handled);
    if (handled) return r;
    /* Anything else is a spec (normal(0, 0.02), adamw(lr = ...)), read by its user. */
    Value v = none_value(e->span);
    v.kind = VAL_CALL;
    v.s = fn;
    v.n = e->u.call.nargs;
    v.items = arena_alloc(S->arena, sizeof(Value) * (size_t)(v.n + 1));
    v.keys = arena_alloc(S->arena, sizeof(char *) * (size_t)(v.n + 1));
    for (int i = 0; i < v.n; i++) {
      v.items[i] = eval_const(S, env, e->u.call.args[i].value);
      v.keys[i] = e->u.call.args[i].name;
      if (v.items[i].kind == VAL_NONE) return none_value(e->span);
    }
    return v;
  }
  case EX_MEMBER:
  case EX_INDEX:
  case EX_SLICE:
  case EX_REPEAT:
    sema_error(S, e->span, "this is not a value known at compile time");
    return none_value(e->span);
  }
  return none_value(e->span);
}

/* Evaluates to an int or reports what it got. */
static int eval_int(Sema *S, Binding *env, const AstExpr *e, const char *what, int64_t *out) {
  Value v = eval_const(S, env, e);
  if (v.kind == VAL_NONE) return 0;
  if (v.kind == VAL_INT) {
    *out = v.i;
    return 1;
  }
  sema_error(S, e->span, "%s must be an integer, not %s %s", what,
             v.kind == VAL_ATOM ? "the unknown name" : val_kind_name(v.kind), val_str(S->arena, &v));
  hint_for_word(S, env, &v);
  return 0;
}

/* ------------------------------------------------------------------ */
/* layer instantiation                                                 */

typedef struct {
  SemLayer l;        /* first, so a SemLayer* is a LayerBox* */
  Binding *env;      /* parameters, constants, children, param tensors */
  PtrVec params;     /* SemParam* while elaborating */
  PtrVec children;   /* SemChild* */
  PtrVec inputs;     /* SemInput* */
  Span site;         /* where it was first instantiated */
  Frame chain[6];    /* the instantiation chain at that point, innermost first */
  int nchain;
} LayerBox;

static SemLayer *instantiate(Sema *S, const AstDecl *decl, Binding *caller_env, const AstExpr *call,
                             Span site);

static const char *type_name_of(const Value *v) {
  switch (v->kind) {
  case VAL_INT: return "int";
  case VAL_FLOAT: return "float";
  case VAL_BOOL: return "bool";
  case VAL_STRING:
  case VAL_ATOM: return "string";
  default: return val_kind_name(v->kind);
  }
}

/* Converts `v` to the declared parameter type; reports a mismatch. */
static int coerce_param(Sema *S, const AstParam *p, Value *v, Binding *env, Span at) {
  const char *want = p->type_name;
  if (!want) {
    if (p->default_value && p->default_value->kind == EX_FLOAT && v->kind == VAL_INT) {
      v->kind = VAL_FLOAT;
      v->f = (double)v->i;
    }
    return 1;
  }
  if (!strcmp(want, "int")) {
    if (v->kind == VAL_INT) return 1;
  } else if (!strcmp(want, "float")) {
    if (v->kind == VAL_FLOAT) return 1;
    if (v->kind == VAL_INT) {
      v->kind = VAL_FLOAT;
      v->f = (double)v->i;
      return 1;
    }
  } else if (!strcmp(want, "bool")) {
    if (v->kind == VAL_BOOL) return 1;
  } else if (!strcmp(want, "string")) {
    if (v->kind == VAL_STRING || v->kind == VAL_ATOM) return 1;
  } else {
    return 1; /* unknown type names are reported where the layer is declared */
  }
  if (v->kind == VAL_ATOM)
    sema_error(S, at, "unknown name '%s' (parameter '%s' needs %s %s)", v->s, p->name.name, !strcmp(want, "int") ? "an" : "a", want);
  else
    sema_error(S, at, "parameter '%s' is %s %s, but this is %s %s", p->name.name, !strcmp(want, "int") ? "an" : "a", want,
               type_name_of(v), val_str(S->arena, v));
  hint_for_word(S, env, v);
  diag_note(S->diag, p->name.span, "'%s' declared here", p->name.name);
  return 0;
}

static const char *const scalar_types[] = {"int", "float", "bool", "string"};

static int check_param_types_once(Sema *S, const AstDecl *decl);

/* Checks a declaration's parameter list once; later calls return the verdict. */
static int check_param_types(Sema *S, const AstDecl *decl) {
  void *verdict = strmap_get(&S->param_check, decl->name.name);
  if (verdict) return verdict == (void *)&S->param_check;
  int ok = check_param_types_once(S, decl);
  strmap_put(S->arena, &S->param_check, decl->name.name, ok ? (void *)&S->param_check : (void *)S);
  return ok;
}

static int check_param_types_once(Sema *S, const AstDecl *decl) {
  int ok = 1;
  if (decl->nparams > SEMA_MAX_PARAMS) {
    sema_error(S, decl->name.span, "%s has %d parameters; the limit is %d", decl->name.name, decl->nparams, SEMA_MAX_PARAMS);
    return 0;
  }
  for (int i = 0; i < decl->nparams; i++) {
    const AstParam *p = &decl->params[i];
    if (decl->kind == DECL_EXTERN) {
      if (!p->tensor_type) {
        sema_error(S, p->name.span, "extern argument '%s' needs a tensor type such as f32[N]", p->name.name);
        ok = 0;
      }
      continue;
    }
    if (p->tensor_type) {
      sema_error(S, p->name.span, "parameter '%s' of %s cannot be a tensor", p->name.name, decl->name.name);
      diag_hint(S->diag, "tensors enter a layer through forward(x, ...); weights are `param` declarations");
      ok = 0;
      continue;
    }
    if (p->type_name) {
      int known = 0;
      for (int k = 0; k < 4; k++) known |= !strcmp(p->type_name, scalar_types[k]);
      if (!known) {
        sema_error(S, p->type_span, "unknown parameter type '%s'", p->type_name);
        const char *close = diag_closest(p->type_name, scalar_types, 4);
        if (close) diag_hint(S->diag, "did you mean '%s'?", close);
        else diag_hint(S->diag, "parameter types are int, float, bool and string");
        ok = 0;
      }
    }
    for (int k = 0; k < i; k++)
      if (!strcmp(decl->params[k].name.name, p->name.name)) {
        sema_error(S, p->name.span, "parameter '%s' declared twice", p->name.name);
        diag_note(S->diag, decl->params[k].name.span, "first declared here");
        ok = 0;
      }
  }
  return ok;
}

static const char *display_of(Sema *S, const AstDecl *decl, const Value *args, int nargs) {
  char *s = arena_printf(S->arena, "%s(", decl->name.name);
  for (int i = 0; i < nargs; i++) {
    const char *v = val_str(S->arena, &args[i]);
    if (strlen(s) > 60) {
      s = arena_printf(S->arena, "%s, ...", s);
      break;
    }
    s = arena_printf(S->arena, "%s%s%s", s, i ? ", " : "", v);
  }
  return arena_printf(S->arena, "%s)", s);
}

/* Binds call arguments to the declared parameters (defaults filled in).
 * Returns NULL after reporting when they do not fit. */
static Value *bind_args(Sema *S, const AstDecl *decl, Binding *caller_env, const AstExpr *call,
                        Binding **param_env, Span site) {
  int n = decl->nparams;
  Value *vals = arena_alloc(S->arena, sizeof(Value) * (size_t)(n + 1));
  int *given = arena_alloc(S->arena, sizeof(int) * (size_t)(n + 1));
  int ok = 1, npos = 0;
  int nargs = call ? call->u.call.nargs : 0;
  for (int i = 0; i < nargs; i++) {
    const AstArg *arg = &call->u.call.args[i];
    int slot = -1;
    if (arg->name) {
      for (int k = 0; k < n; k++)
        if (!strcmp(decl->params[k].name.name, arg->name)) slot = k;
      if (slot < 0) {
        sema_error(S, arg->name_span, "%s has no parameter '%s'", decl->name.name, arg->name);
        const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(n + 1));
        for (int k = 0; k < n; k++) names[k] = decl->params[k].name.name;
        const char *close = diag_closest(arg->name, names, n);
        if (close) diag_hint(S->diag, "did you mean '%s'?", close);
        diag_note(S->diag, decl->name.span, "%s is declared here", decl->name.name);
        ok = 0;
        continue;
      }
    } else {
      slot = npos++;
      if (slot >= n) {
        sema_error(S, arg->value->span, "too many arguments: %s takes %d, %d given", decl->name.name, n, nargs);
        diag_note(S->diag, decl->name.span, "%s is declared here", decl->name.name);
        ok = 0;
        break;
      }
    }
    if (given[slot]) {
      sema_error(S, arg->name ? arg->name_span : arg->value->span, "parameter '%s' given twice",
                 decl->params[slot].name.name);
      ok = 0;
      continue;
    }
    given[slot] = 1;
    vals[slot] = eval_const(S, caller_env, arg->value);
    if (vals[slot].kind == VAL_NONE) ok = 0;
    else if (!coerce_param(S, &decl->params[slot], &vals[slot], caller_env, arg->value->span)) ok = 0;
  }
  if (!ok) return NULL;
  /* Defaults may use earlier parameters: evaluate them in order. */
  Binding *env = NULL;
  for (int k = 0; k < n; k++) {
    const AstParam *p = &decl->params[k];
    if (!given[k]) {
      if (!p->default_value) {
        sema_error(S, site, "missing argument '%s' of %s", p->name.name, decl->name.name);
        diag_note(S->diag, p->name.span, "'%s' declared here without a default", p->name.name);
        ok = 0;
        continue;
      }
      vals[k] = eval_const(S, env, p->default_value);
      if (vals[k].kind == VAL_NONE) {
        ok = 0;
        continue;
      }
      if (!coerce_param(S, p, &vals[k], env, p->default_value->span)) ok = 0;
    }
    Binding *b = bind(S, &env, p->name.name, B_VALUE, p->name.span);
    b->value = vals[k];
  }
  *param_env = env;
  return ok ? vals : NULL;
}

static int parse_dtype(Sema *S, const AstType *t, DType *out) {
  if (!t->dtype) {
    *out = DT_F32;
    return 1;
  }
  for (int i = 0; i < DT_COUNT; i++)
    if (!strcmp(sem_dtype_name((DType)i), t->dtype)) {
      *out = (DType)i;
      return 1;
    }
  sema_error(S, t->dtype_span, "unknown element type '%s'", t->dtype);
  const char *names[DT_COUNT];
  for (int i = 0; i < DT_COUNT; i++) names[i] = sem_dtype_name((DType)i);
  const char *close = diag_closest(t->dtype, names, DT_COUNT);
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
  else diag_hint(S->diag, "element types are f32, f16, bf16, f64, i32, i64 and bool");
  return 0;
}

static int eval_init(Sema *S, Binding *env, const AstExpr *e, SemInit *out) {
  static const char *const inits[] = {"zeros", "ones", "constant", "normal", "uniform", "residual_normal"};
  out->kind = INIT_NORMAL;
  out->a = 0;
  out->b = 0.02;
  if (!e) return 1;
  Value v = eval_const(S, env, e);
  if (v.kind == VAL_NONE) return 0;
  const char *name = v.kind == VAL_ATOM ? v.s : v.kind == VAL_CALL ? v.s : NULL;
  if (!name) {
    sema_error(S, e->span, "an initialiser is zeros, ones, constant(v), normal(mean, std), uniform(lo, hi) or residual_normal(std, layers), not %s",
               val_str(S->arena, &v));
    return 0;
  }
  int which = -1;
  for (int k = 0; k < 6; k++)
    if (!strcmp(inits[k], name)) which = k;
  if (which < 0) {
    sema_error(S, e->span, "unknown initialiser '%s'", name);
    const char *close = diag_closest(name, inits, 6);
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    return 0;
  }
  static const int nwant[] = {0, 0, 1, 2, 2, 2};
  int n = v.kind == VAL_CALL ? v.n : 0;
  if (n != nwant[which]) {
    sema_error(S, e->span, "%s takes %d argument%s, not %d", name, nwant[which], nwant[which] == 1 ? "" : "s", n);
    return 0;
  }
  double x[2] = {0, 0};
  for (int k = 0; k < n; k++)
    if (!val_as_float(&v.items[k], &x[k])) {
      sema_error(S, v.items[k].span, "%s needs numbers, not %s", name, val_str(S->arena, &v.items[k]));
      return 0;
    }
  switch (which) {
  case 0: out->kind = INIT_ZEROS; break;
  case 1: out->kind = INIT_ONES; break;
  case 2: out->kind = INIT_CONSTANT; out->a = x[0]; break;
  case 3: out->kind = INIT_NORMAL; out->a = x[0]; out->b = x[1]; break;
  case 4: out->kind = INIT_UNIFORM; out->a = x[0]; out->b = x[1]; break;
  case 5:
    if (x[1] < 1) {
      sema_error(S, e->span, "residual_normal(std, layers) needs layers >= 1");
      return 0;
    }
    /* GPT-2 (Radford et al. 2019, Sec. 2.3): residual projections scaled by 1/sqrt(N), N = 2 per block. */
    out->kind = INIT_NORMAL; out->a = 0; out->b = x[0] / sqrt(2.0 * x[1]);
    break;
  }
  if ((out->kind == INIT_NORMAL && out->b < 0) || (out->kind == INIT_UNIFORM && out->b < out->a)) {
    sema_error(S, e->span, "%s with a negative spread", name);
    return 0;
  }
  return 1;
}

static int eval_shard(Sema *S, Binding *env, const AstExpr *e, ShardKind *out) {
  static const char *const kinds[] = {"replicated", "column", "row", "vocab"};
  *out = SHARD_REPLICATED;
  if (!e) return 1;
  Value v = eval_const(S, env, e);
  if (v.kind == VAL_NONE) return 0;
  const char *w = val_as_word(&v);
  for (int k = 0; w && k < 4; k++)
    if (!strcmp(kinds[k], w)) {
      *out = (ShardKind)k;
      return 1;
    }
  sema_error(S, e->span, "unknown sharding '%s'; it is column, row, vocab or replicated", w ? w : val_str(S->arena, &v));
  const char *close = w ? diag_closest(w, kinds, 4) : NULL;
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
  return 0;
}

static int body_name_taken(Sema *S, LayerBox *box, const AstName *name) {
  Binding *prev = NULL;
  for (Binding *b = box->env; b; b = b->next)
    if (!strcmp(b->name, name->name) && b->kind != B_VALUE) prev = b;
  if (!prev) return 0;
  sema_error(S, name->span, "'%s' is already defined in %s", name->name, box->l.decl->name.name);
  diag_note(S->diag, prev->span, "previous definition here");
  return 1;
}

static void elaborate_body(Sema *S, LayerBox *box, const AstBlock *body);

static SemChild *add_child(Sema *S, LayerBox *box, const AstStmt *st) {
  const AstExpr *v = st->u.assign.value;
  int64_t repeat = 1;
  const AstExpr *call = v;
  if (v->kind == EX_REPEAT) {
    if (!eval_int(S, box->env, v->u.repeat.count, "the repeat count", &repeat)) return NULL;
    if (repeat < 1) {
      sema_error(S, v->u.repeat.count->span, "the repeat count must be at least 1, not %" PRId64, repeat);
      return NULL;
    }
    call = v->u.repeat.call;
    if (call->kind != EX_CALL || call->u.call.callee->kind != EX_NAME) {
      sema_error(S, call->span, "repeat needs a layer instantiation: repeat N Layer(args)");
      return NULL;
    }
  }
  const char *lname = call->u.call.callee->u.sval;
  const AstDecl *decl = find_decl(S, lname, (1 << DECL_LAYER) | (1 << DECL_MODEL));
  if (!decl) {
    sema_error(S, call->u.call.callee->span, "unknown layer '%s'", lname);
    const char *close = suggest_decl(S, lname, (1 << DECL_LAYER));
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    else diag_hint(S->diag, "is an import missing? the standard layers come with import \"std/nn\"");
    return NULL;
  }
  if (decl->kind == DECL_MODEL) {
    sema_error(S, call->u.call.callee->span, "'%s' is a model; only layers can be used inside another layer or model", lname);
    diag_hint(S->diag, "declare it with 'layer' to reuse it");
    return NULL;
  }
  SemLayer *child = instantiate(S, decl, box->env, call, call->span);
  if (!child) return NULL;
  SemChild *c = arena_alloc(S->arena, sizeof *c);
  c->name = st->u.assign.names[0].name;
  c->layer = child;
  c->repeat = repeat;
  c->span = st->span;
  return c;
}

static int is_layer_instantiation(Sema *S, const AstExpr *v) {
  if (v->kind == EX_REPEAT) return 1;
  if (v->kind != EX_CALL || v->u.call.callee->kind != EX_NAME) return 0;
  const char *name = v->u.call.callee->u.sval;
  if (find_decl(S, name, (1 << DECL_LAYER) | (1 << DECL_MODEL))) return 1;
  /* A capitalised unknown callee is most likely a layer that is missing. */
  return name[0] >= 'A' && name[0] <= 'Z' && find_builtin(name) < 0;
}

static void elaborate_item(Sema *S, LayerBox *box, const AstStmt *st) {
  const AstDecl *decl = box->l.decl;
  switch (st->kind) {
  case ST_PARAM: {
    if (body_name_taken(S, box, &st->u.param.name)) return;
    SemParam *p = arena_alloc(S->arena, sizeof *p);
    p->name = st->u.param.name.name;
    p->span = st->span;
    int ok = parse_dtype(S, st->u.param.type, &p->type.dtype);
    if (st->u.param.type->ndims > SEM_MAX_RANK) {
      sema_error(S, st->u.param.type->span, "tensors have at most %d dimensions", SEM_MAX_RANK);
      return;
    }
    p->type.rank = st->u.param.type->ndims;
    p->numel = 1;
    for (int i = 0; i < p->type.rank; i++) {
      int64_t d;
      const AstExpr *de = st->u.param.type->dims[i];
      if (!eval_int(S, box->env, de, "a parameter dimension", &d)) {
        ok = 0;
        continue;
      }
      if (d < 1) {
        sema_error(S, de->span, "parameter dimension %" PRId64 " is not positive", d);
        ok = 0;
        continue;
      }
      p->type.dims[i] = sym_const(S->arena, d);
      if (!checked_mul(p->numel, d, &p->numel)) {
        sema_error(S, st->u.param.type->span, "parameter '%s' has more elements than fit in 64 bits", p->name);
        ok = 0;
      }
    }
    ok &= eval_init(S, box->env, st->u.param.init, &p->init);
    ok &= eval_shard(S, box->env, st->u.param.shard, &p->shard);
    if (ok && p->shard != SHARD_REPLICATED && p->type.rank == 0) {
      sema_error(S, st->span, "a scalar parameter cannot be sharded");
      ok = 0;
    }
    if (!ok) return;
    Binding *b = bind(S, &box->env, p->name, B_PARAM, st->u.param.name.span);
    b->index = box->params.len;
    ptrvec_push(S->arena, &box->params, p);
    return;
  }
  case ST_INPUT: {
    if (decl->kind != DECL_MODEL) {
      sema_error(S, st->span, "'input' belongs in a model; a layer receives tensors through forward(x, ...)");
      return;
    }
    if (body_name_taken(S, box, &st->u.input.name)) return;
    SemInput *in = arena_alloc(S->arena, sizeof *in);
    in->name = st->u.input.name.name;
    in->span = st->span;
    const AstType *t = st->u.input.type;
    if (!parse_dtype(S, t, &in->type.dtype)) return;
    if (t->ndims > SEM_MAX_RANK) {
      sema_error(S, t->span, "tensors have at most %d dimensions", SEM_MAX_RANK);
      return;
    }
    in->type.rank = t->ndims;
    for (int i = 0; i < t->ndims; i++) {
      const AstExpr *de = t->dims[i];
      if (de->kind == EX_NAME && !lookup(box->env, de->u.sval)) {
        in->type.dims[i] = sym_var(S->arena, de->u.sval); /* a symbolic dimension such as B */
        continue;
      }
      int64_t d;
      if (!eval_int(S, box->env, de, "an input dimension", &d)) return;
      if (d < 1) {
        sema_error(S, de->span, "input dimension %" PRId64 " is not positive", d);
        return;
      }
      in->type.dims[i] = sym_const(S->arena, d);
    }
    SemExpr *x = arena_alloc(S->arena, sizeof *x);
    x->kind = SE_INPUT;
    x->index = box->inputs.len;
    x->type = in->type;
    x->span = st->u.input.name.span;
    Binding *b = bind(S, &box->env, in->name, B_TENSOR, st->u.input.name.span);
    b->expr = x;
    ptrvec_push(S->arena, &box->inputs, in);
    return;
  }
  case ST_ASSIGN: {
    const AstName *name = &st->u.assign.names[0];
    if (st->u.assign.nnames != 1) {
      sema_error(S, st->u.assign.names[1].span, "only one name can be defined here; unpacking belongs in forward");
      return;
    }
    if (body_name_taken(S, box, name)) return;
    if (is_layer_instantiation(S, st->u.assign.value)) {
      SemChild *c = add_child(S, box, st);
      if (!c) return;
      Binding *b = bind(S, &box->env, name->name, B_CHILD, name->span);
      b->index = box->children.len;
      ptrvec_push(S->arena, &box->children, c);
      return;
    }
    /* A constant that failed stays bound as "nothing" so its uses stay quiet. */
    Value v = eval_const(S, box->env, st->u.assign.value);
    Binding *b = bind(S, &box->env, name->name, B_VALUE, name->span);
    b->value = v;
    return;
  }
  case ST_FORWARD:
    if (box->l.forward) {
      sema_error(S, st->span, "%s has two forward blocks", decl->name.name);
      diag_note(S->diag, box->l.forward->span, "the first one is here");
      return;
    }
    if (decl->kind == DECL_MODEL && st->u.forward.has_args) {
      sema_error(S, st->span, "a model's forward takes no arguments; it reads the model's inputs");
      return;
    }
    if (decl->kind == DECL_LAYER && !st->u.forward.has_args) {
      sema_error(S, st->span, "a layer's forward names its arguments: forward(x) { ... }");
      return;
    }
    box->l.forward = st;
    return;
  case ST_IF: {
    Value c = eval_const(S, box->env, st->u.if_.cond);
    if (c.kind == VAL_NONE) return;
    if (c.kind != VAL_BOOL) {
      sema_error(S, st->u.if_.cond->span, "the condition must be a bool known at compile time, not %s %s",
                 val_kind_name(c.kind), val_str(S->arena, &c));
      hint_for_word(S, box->env, &c);
      return;
    }
    elaborate_body(S, box, c.b ? &st->u.if_.then : &st->u.if_.otherwise);
    return;
  }
  case ST_RETURN:
    sema_error(S, st->span, "'return' belongs in forward");
    return;
  }
}

static void elaborate_body(Sema *S, LayerBox *box, const AstBlock *body) {
  for (int i = 0; i < body->n && !diag_saturated(S->diag); i++) elaborate_item(S, box, body->items[i]);
}

static int frame_contains(Sema *S, const AstDecl *decl) {
  for (Frame *f = S->frame; f; f = f->up)
    if (f->decl == decl) return 1;
  return 0;
}

static SemLayer *instantiate_with(Sema *S, const AstDecl *decl, Value *vals, Binding *param_env, Span site) {
  for (SemLayer *l = S->instances; l; l = l->next_instance) {
    if (l->decl != decl) continue;
    int same = 1;
    for (int k = 0; k < decl->nparams && same; k++) same = val_equal(&l->args[k], &vals[k]);
    if (same) return l;
  }
  if (frame_contains(S, decl)) {
    sema_error(S, site, "%s contains itself", decl->name.name);
    return NULL;
  }
  if (S->depth >= SEMA_MAX_DEPTH) {
    sema_error(S, site, "layers nested deeper than %d levels", SEMA_MAX_DEPTH);
    return NULL;
  }
  LayerBox *box = arena_alloc(S->arena, sizeof *box);
  SemLayer *l = &box->l;
  l->decl = decl;
  l->args = vals;
  l->nargs = decl->nparams;
  l->display = display_of(S, decl, vals, decl->nparams);
  box->env = param_env;
  box->site = site;
  for (Frame *f = S->frame; f && box->nchain < 6; f = f->up)
    if (f->call_site.file >= 0) box->chain[box->nchain++] = *f;
  Frame fr = {l->display, site, decl, S->frame, 0};
  S->frame = &fr;
  S->depth++;
  int before = diag_error_count(S->diag);
  elaborate_body(S, box, &decl->body);
  S->frame = fr.up;
  S->depth--;
  if (!l->forward && diag_error_count(S->diag) == before) {
    sema_error(S, decl->name.span, "%s has no forward block", decl->name.name);
    return NULL;
  }
  l->nparams = box->params.len;
  l->params = arena_alloc(S->arena, sizeof(SemParam) * (size_t)(l->nparams + 1));
  for (int i = 0; i < l->nparams; i++) l->params[i] = *(SemParam *)box->params.items[i];
  l->nchildren = box->children.len;
  l->children = arena_alloc(S->arena, sizeof(SemChild) * (size_t)(l->nchildren + 1));
  for (int i = 0; i < l->nchildren; i++) l->children[i] = *(SemChild *)box->children.items[i];
  l->ninputs = box->inputs.len;
  l->inputs = arena_alloc(S->arena, sizeof(SemInput) * (size_t)(l->ninputs + 1));
  for (int i = 0; i < l->ninputs; i++) l->inputs[i] = *(SemInput *)box->inputs.items[i];
  int64_t count = 0;
  for (int i = 0; i < l->nparams; i++) count += l->params[i].numel;
  for (int i = 0; i < l->nchildren; i++) {
    int64_t sub = 0;
    if (!checked_mul(l->children[i].layer->param_count, l->children[i].repeat, &sub) || !checked_add(count, sub, &count)) {
      count = INT64_MAX;
      break;
    }
  }
  l->param_count = count;
  l->next_instance = S->instances;
  S->instances = l;
  if (diag_error_count(S->diag) != before) return NULL;
  return l;
}

static SemLayer *instantiate(Sema *S, const AstDecl *decl, Binding *caller_env, const AstExpr *call, Span site) {
  if (!check_param_types(S, decl)) return NULL;
  Binding *param_env = NULL;
  Value *vals = bind_args(S, decl, caller_env, call, &param_env, site);
  if (!vals) {
    return NULL;
  }
  return instantiate_with(S, decl, vals, param_env, site);
}

/* ------------------------------------------------------------------ */
/* forward checking                                                    */

typedef struct {
  LayerBox *box;
  Binding *env;
} Fwd;

static SemExpr *new_expr(Sema *S, SemExprKind kind, Span at) {
  SemExpr *e = arena_alloc(S->arena, sizeof *e);
  e->kind = kind;
  e->span = at;
  return e;
}

static SemExpr *new_op(Sema *S, SemOp op, Span at, SemExpr **args, int nargs) {
  SemExpr *e = new_expr(S, SE_OP, at);
  e->op = op;
  e->nargs = nargs;
  e->args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(nargs + 1));
  for (int i = 0; i < nargs; i++) e->args[i] = args[i];
  return e;
}

static const char *tstr(Sema *S, const TensorType *t) { return sem_type_str(S->arena, t); }

static const char *ast_type_text(Sema *S, const AstType *t) {
  char *s = arena_printf(S->arena, "%s[", t->dtype ? t->dtype : "f32");
  for (int i = 0; i < t->ndims; i++) s = arena_printf(S->arena, "%s%s%s", s, i ? ", " : "", expr_text(S, t->dims[i]));
  return arena_printf(S->arena, "%s]", s);
}

static int type_equal(const TensorType *a, const TensorType *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (!sym_equal(a->dims[i], b->dims[i])) return 0;
  return 1;
}

static int dim_is(const SymDim *d, int64_t v) {
  int64_t c;
  return sym_is_const(d, &c) && c == v;
}

/* Where a tensor came from, for the second half of a mismatch message. */
static void origin_note(Sema *S, Fwd *F, const SemExpr *x, const char *role) {
  if (x->kind == SE_PARAM) {
    const SemParam *p = F->box->params.items[x->index];
    diag_note(S->diag, p->span, "%s is %s, declared here", role, tstr(S, &x->type));
  } else if (x->kind == SE_INPUT) {
    const SemInput *in = F->box->inputs.items[x->index];
    diag_note(S->diag, in->span, "%s is %s, declared here", role, tstr(S, &x->type));
  } else {
    diag_note(S->diag, x->span, "%s is %s", role, tstr(S, &x->type));
  }
}

static SemExpr *check_expr(Sema *S, Fwd *F, const AstExpr *e);

static int require_float(Sema *S, Fwd *F, const SemExpr *x, const char *what, Span at) {
  if (sem_dtype_is_float(x->type.dtype)) return 1;
  sema_error(S, at, "%s needs a floating-point tensor; this is %s", what, tstr(S, &x->type));
  origin_note(S, F, x, "the operand");
  return 0;
}

static SemExpr *scalar_expr(Sema *S, double v, Span at) {
  SemExpr *e = new_expr(S, SE_SCALAR, at);
  e->scalar = v;
  e->type.dtype = DT_F32;
  e->type.rank = 0;
  return e;
}

/* numpy broadcasting: align from the right; equal dims or a 1 stretch. */
static SemExpr *broadcast_op(Sema *S, Fwd *F, SemOp op, SemExpr *a, SemExpr *b, Span at, const char *sym) {
  if (a->kind != SE_SCALAR && b->kind != SE_SCALAR && a->type.dtype != b->type.dtype) {
    int fa = sem_dtype_is_float(a->type.dtype), fb = sem_dtype_is_float(b->type.dtype);
    if (fa != fb) {
      sema_error(S, at, "'%s' mixes %s and %s tensors", sym, sem_dtype_name(a->type.dtype), sem_dtype_name(b->type.dtype));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  SemExpr *args[2] = {a, b};
  SemExpr *r = new_op(S, op, at, args, 2);
  const TensorType *ta = &a->type, *tb = &b->type;
  int rank = ta->rank > tb->rank ? ta->rank : tb->rank;
  r->type.rank = rank;
  r->type.dtype = a->kind == SE_SCALAR ? tb->dtype : ta->dtype;
  for (int i = 0; i < rank; i++) {
    int ia = ta->rank - rank + i, ib = tb->rank - rank + i;
    SymDim *da = ia >= 0 ? ta->dims[ia] : NULL, *db = ib >= 0 ? tb->dims[ib] : NULL;
    if (!da) r->type.dims[i] = db;
    else if (!db) r->type.dims[i] = da;
    else if (sym_equal(da, db)) r->type.dims[i] = da;
    else if (dim_is(da, 1)) r->type.dims[i] = db;
    else if (dim_is(db, 1)) r->type.dims[i] = da;
    else {
      sema_error(S, at, "shapes do not match for '%s': %s and %s (dimension %d: %s vs %s)", sym, tstr(S, ta), tstr(S, tb),
                 i - rank, sym_str(S->arena, da), sym_str(S->arena, db));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  return r;
}

static SemExpr *matmul_op(Sema *S, Fwd *F, SemExpr *a, SemExpr *b, Span at) {
  const TensorType *ta = &a->type, *tb = &b->type;
  if (ta->rank < 2 || tb->rank < 2) {
    const SemExpr *bad = ta->rank < 2 ? a : b;
    sema_error(S, at, "'@' needs matrices (2 or more dimensions); the %s operand is %s", bad == a ? "left" : "right",
               tstr(S, &bad->type));
    origin_note(S, F, bad, bad == a ? "the left operand" : "the right operand");
    return NULL;
  }
  if (!require_float(S, F, a, "'@'", at) || !require_float(S, F, b, "'@'", at)) return NULL;
  SymDim *k1 = ta->dims[ta->rank - 1], *k2 = tb->dims[tb->rank - 2];
  if (!sym_equal(k1, k2)) {
    sema_error(S, at, "'@' inner dimensions differ: %s is %s, %s is %s (%s vs %s)", "the left operand", tstr(S, ta),
               "the right operand", tstr(S, tb), sym_str(S->arena, k1), sym_str(S->arena, k2));
    origin_note(S, F, a, "the left operand");
    origin_note(S, F, b, "the right operand");
    return NULL;
  }
  SemExpr *args[2] = {a, b};
  SemExpr *r = new_op(S, SOP_MATMUL, at, args, 2);
  r->type.dtype = ta->dtype;
  /* batch dims: [..., M, K] @ [K, N], or equal / broadcast batch dims */
  int ba = ta->rank - 2, bb = tb->rank - 2;
  int batch = ba > bb ? ba : bb;
  r->type.rank = batch + 2;
  for (int i = 0; i < batch; i++) {
    int ia = ba - batch + i, ib = bb - batch + i;
    SymDim *da = ia >= 0 ? ta->dims[ia] : NULL, *db = ib >= 0 ? tb->dims[ib] : NULL;
    if (!da) r->type.dims[i] = db;
    else if (!db) r->type.dims[i] = da;
    else if (sym_equal(da, db) || dim_is(db, 1)) r->type.dims[i] = da;
    else if (dim_is(da, 1)) r->type.dims[i] = db;
    else {
      sema_error(S, at, "'@' batch dimensions differ: %s and %s", tstr(S, ta), tstr(S, tb));
      origin_note(S, F, a, "the left operand");
      origin_note(S, F, b, "the right operand");
      return NULL;
    }
  }
  r->type.dims[batch] = ta->dims[ta->rank - 2];
  r->type.dims[batch + 1] = tb->dims[tb->rank - 1];
  return r;
}

/* Arguments of a builtin: tensors by position, attributes by position or keyword. */
typedef struct {
  const AstExpr *call;
  const char *fn;
} CallArgs;

static const AstExpr *arg_at(const CallArgs *c, int pos, const char *key) {
  int p = 0;
  for (int i = 0; i < c->call->u.call.nargs; i++) {
    const AstArg *a = &c->call->u.call.args[i];
    if (a->name) {
      if (key && !strcmp(a->name, key)) return a->value;
    } else if (p++ == pos) {
      return a->value;
    }
  }
  return NULL;
}

static int check_keywords(Sema *S, const CallArgs *c, const char *const *keys, int nkeys) {
  for (int i = 0; i < c->call->u.call.nargs; i++) {
    const AstArg *a = &c->call->u.call.args[i];
    if (!a->name) continue;
    int ok = 0;
    for (int k = 0; k < nkeys; k++) ok |= !strcmp(keys[k], a->name);
    if (!ok) {
      sema_error(S, a->name_span, "%s() has no argument '%s'", c->fn, a->name);
      const char *close = diag_closest(a->name, keys, nkeys);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return 0;
    }
  }
  return 1;
}

static int attr_int(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, int64_t dflt, int64_t *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  char what[64];
  snprintf(what, sizeof what, "%s's '%s'", c->fn, key);
  return eval_int(S, F->env, e, what, out);
}

static int attr_float(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, double dflt, double *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  Value v = eval_const(S, F->env, e);
  if (v.kind == VAL_NONE) return 0;
  if (!val_as_float(&v, out)) {
    sema_error(S, e->span, "%s's '%s' must be a number, not %s", c->fn, key, val_str(S->arena, &v));
    return 0;
  }
  return 1;
}

static int attr_bool(Sema *S, Fwd *F, const CallArgs *c, int pos, const char *key, int dflt, int *out) {
  const AstExpr *e = arg_at(c, pos, key);
  if (!e) {
    *out = dflt;
    return 1;
  }
  Value v = eval_const(S, F->env, e);
  if (v.kind == VAL_NONE) return 0;
  if (v.kind != VAL_BOOL) {
    sema_error(S, e->span, "%s's '%s' must be true or false, not %s", c->fn, key, val_str(S->arena, &v));
    return 0;
  }
  *out = v.b;
  return 1;
}

static int norm_axis(Sema *S, const CallArgs *c, int64_t axis, int rank, const TensorType *t) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    const AstExpr *e = arg_at(c, 1, "axis");
    sema_error(S, e ? e->span : c->call->span, "axis %" PRId64 " is out of range for %s (rank %d)", axis,
               sem_type_str(S->arena, t), rank);
    return -1;
  }
  return (int)a;
}

static SymDim *dim_div(Sema *S, SymDim *a, SymDim *b, Span at, const char *what) {
  SymStatus st = SYM_OK;
  SymDim *r = sym_div(S->arena, a, b, &st);
  if (!r || st != SYM_OK) {
    sema_error(S, at, "%s: %s is not divisible by %s", what, sym_str(S->arena, a), sym_str(S->arena, b));
    return NULL;
  }
  return r;
}

static SymDim *dim_mul(Sema *S, SymDim *a, SymDim *b, Span at) {
  SymDim *r = sym_mul(S->arena, a, b);
  if (!r) sema_error(S, at, "dimension overflow in %s * %s", sym_str(S->arena, a), sym_str(S->arena, b));
  return r;
}

/* A dimension in reshape(x, [..]): an int, -1, or a symbolic name like B. */
static SymDim *eval_dim(Sema *S, Fwd *F, const AstExpr *e, int *infer) {
  *infer = 0;
  if (e->kind == EX_NAME && !lookup(F->env, e->u.sval)) return sym_var(S->arena, e->u.sval);
  int64_t d;
  if (!eval_int(S, F->env, e, "a dimension", &d)) return NULL;
  if (d == -1) {
    *infer = 1;
    return NULL;
  }
  if (d < 1) {
    sema_error(S, e->span, "dimension %" PRId64 " is not positive", d);
    return NULL;
  }
  return sym_const(S->arena, d);
}

static SymDim *numel_of(Sema *S, const TensorType *t, Span at) {
  SymDim *n = sym_const(S->arena, 1);
  for (int i = 0; i < t->rank && n; i++) n = dim_mul(S, n, t->dims[i], at);
  return n;
}

static int count_positional(const AstExpr *call) {
  int n = 0;
  for (int i = 0; i < call->u.call.nargs; i++) n += call->u.call.args[i].name == NULL;
  return n;
}

static SemExpr *tensor_arg(Sema *S, Fwd *F, const CallArgs *c, int pos) {
  const AstExpr *e = arg_at(c, pos, NULL);
  if (!e) {
    sema_error(S, c->call->span, "%s() needs a tensor as argument %d", c->fn, pos + 1);
    return NULL;
  }
  return check_expr(S, F, e);
}

static SemExpr *check_builtin(Sema *S, Fwd *F, SemOp op, const AstExpr *call, const char *fn) {
  CallArgs c = {call, fn};
  Span at = call->span;
  int npos = count_positional(call);
  const BuiltinInfo *info = &builtins[op];
  if (npos + (call->u.call.nargs - npos) < info->min_args || call->u.call.nargs > info->max_args) {
    if (info->min_args == info->max_args)
      sema_error(S, at, "%s() takes %d argument%s, not %d", fn, info->min_args, info->min_args == 1 ? "" : "s",
                 call->u.call.nargs);
    else
      sema_error(S, at, "%s() takes %d to %d arguments, not %d", fn, info->min_args, info->max_args, call->u.call.nargs);
    return NULL;
  }
  if (is_unary_elementwise(op)) {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    if (x->kind == SE_SCALAR) {
      sema_error(S, at, "%s() of a number: use it on tensors; for constants, sqrt/exp/log work at compile time", fn);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    return r;
  }
  switch (op) {
  case SOP_MAXIMUM:
  case SOP_MINIMUM: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *a = tensor_arg(S, F, &c, 0), *b = a ? tensor_arg(S, F, &c, 1) : NULL;
    if (!a || !b) return NULL;
    return broadcast_op(S, F, op, a, b, at, fn);
  }
  case SOP_SUM:
  case SOP_MEAN:
  case SOP_MAX:
  case SOP_SOFTMAX:
  case SOP_LOG_SOFTMAX: {
    static const char *const keys[] = {"axis", "keepdim"};
    int is_reduce = op == SOP_SUM || op == SOP_MEAN || op == SOP_MAX;
    if (!check_keywords(S, &c, keys, is_reduce ? 2 : 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    int64_t axis;
    int keepdim = 0;
    if (!attr_int(S, F, &c, 1, "axis", -1, &axis)) return NULL;
    if (is_reduce && !attr_bool(S, F, &c, 2, "keepdim", 0, &keepdim)) return NULL;
    if (x->type.rank == 0) {
      sema_error(S, at, "%s() of a scalar", fn);
      return NULL;
    }
    int a = norm_axis(S, &c, axis, x->type.rank, &x->type);
    if (a < 0) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->attr[0] = a;
    r->attr[1] = keepdim;
    r->nattr = 2;
    r->type = x->type;
    if (is_reduce) {
      if (keepdim) r->type.dims[a] = sym_const(S->arena, 1);
      else {
        for (int i = a; i + 1 < x->type.rank; i++) r->type.dims[i] = x->type.dims[i + 1];
        r->type.rank--;
      }
    }
    return r;
  }
  case SOP_RESHAPE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    const AstExpr *shape = arg_at(&c, 1, NULL);
    if (!shape || shape->kind != EX_LIST) {
      sema_error(S, shape ? shape->span : at, "reshape's shape is a list: reshape(x, [B, T, 12, 64])");
      return NULL;
    }
    if (shape->u.list.nitems > SEM_MAX_RANK || shape->u.list.nitems == 0) {
      sema_error(S, shape->span, "a shape has 1 to %d dimensions", SEM_MAX_RANK);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = shape->u.list.nitems;
    int infer_at = -1;
    SymDim *known = sym_const(S->arena, 1);
    for (int i = 0; i < r->type.rank; i++) {
      int infer;
      SymDim *d = eval_dim(S, F, shape->u.list.items[i], &infer);
      if (infer) {
        if (infer_at >= 0) {
          sema_error(S, shape->u.list.items[i]->span, "only one dimension of a reshape can be -1");
          return NULL;
        }
        infer_at = i;
        continue;
      }
      if (!d) return NULL;
      r->type.dims[i] = d;
      known = dim_mul(S, known, d, at);
      if (!known) return NULL;
    }
    SymDim *total = numel_of(S, &x->type, at);
    if (!total) return NULL;
    if (infer_at >= 0) {
      SymStatus st = SYM_OK;
      SymDim *d = sym_div(S->arena, total, known, &st);
      if (!d || st != SYM_OK) {
        sema_error(S, shape->span, "cannot reshape %s (%s elements) with %s: the -1 dimension is not whole",
                   tstr(S, &x->type), sym_str(S->arena, total), sym_str(S->arena, known));
        return NULL;
      }
      r->type.dims[infer_at] = d;
    } else if (!sym_equal(total, known)) {
      sema_error(S, shape->span, "cannot reshape %s (%s elements) into %s elements", tstr(S, &x->type),
                 sym_str(S->arena, total), sym_str(S->arena, known));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    return r;
  }
  case SOP_TRANSPOSE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    int rank = x->type.rank;
    if (rank < 2) {
      sema_error(S, at, "transpose needs 2 or more dimensions; this is %s", tstr(S, &x->type));
      return NULL;
    }
    int64_t a = rank - 2, b = rank - 1;
    if (npos == 2 || npos > 3) {
      sema_error(S, at, "transpose(x) swaps the last two dimensions; transpose(x, a, b) swaps a and b");
      return NULL;
    }
    if (npos == 3 && (!attr_int(S, F, &c, 1, "a", 0, &a) || !attr_int(S, F, &c, 2, "b", 0, &b))) return NULL;
    int na = norm_axis(S, &c, a, rank, &x->type), nb = na < 0 ? -1 : norm_axis(S, &c, b, rank, &x->type);
    if (na < 0 || nb < 0) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[na] = x->type.dims[nb];
    r->type.dims[nb] = x->type.dims[na];
    r->attr[0] = na;
    r->attr[1] = nb;
    r->nattr = 2;
    return r;
  }
  case SOP_SPLIT_HEADS: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t h;
    if (!x || !attr_int(S, F, &c, 1, "heads", 0, &h)) return NULL;
    if (x->type.rank != 3) {
      sema_error(S, at, "split_heads needs [B, T, H*D]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    if (h < 1) {
      sema_error(S, arg_at(&c, 1, NULL)->span, "the number of heads must be positive, not %" PRId64, h);
      return NULL;
    }
    SymDim *d = dim_div(S, x->type.dims[2], sym_const(S->arena, h), at, "split_heads");
    if (!d) return NULL;
    HeadSplit *hs = arena_alloc(S->arena, sizeof *hs);
    hs->heads = h;
    hs->span = arg_at(&c, 1, NULL)->span;
    hs->what = expr_text(S, arg_at(&c, 1, NULL));
    for (Frame *f = S->frame; f && hs->nframes < 6; f = f->up)
      if (f->call_site.file >= 0) hs->frames[hs->nframes++] = *f;
    ptrvec_push(S->arena, &S->head_splits, hs);
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = 4;
    r->type.dims[0] = x->type.dims[0];
    r->type.dims[1] = sym_const(S->arena, h);
    r->type.dims[2] = x->type.dims[1];
    r->type.dims[3] = d;
    r->attr[0] = h;
    r->nattr = 1;
    return r;
  }
  case SOP_MERGE_HEADS: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x) return NULL;
    if (x->type.rank != 4) {
      sema_error(S, at, "merge_heads needs [B, H, T, D]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type.dtype = x->type.dtype;
    r->type.rank = 3;
    r->type.dims[0] = x->type.dims[0];
    r->type.dims[1] = x->type.dims[2];
    r->type.dims[2] = dim_mul(S, x->type.dims[1], x->type.dims[3], at);
    return r->type.dims[2] ? r : NULL;
  }
  case SOP_SPLIT: {
    static const char *const keys[] = {"axis"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t n, axis;
    if (!x || !attr_int(S, F, &c, 1, "parts", 0, &n) || !attr_int(S, F, &c, 2, "axis", -1, &axis)) return NULL;
    if (n < 1 || n > 64) {
      sema_error(S, arg_at(&c, 1, NULL)->span, "split into %" PRId64 " parts: the count must be 1 to 64", n);
      return NULL;
    }
    if (x->type.rank == 0) {
      sema_error(S, at, "split of a scalar");
      return NULL;
    }
    int a = norm_axis(S, &c, axis, x->type.rank, &x->type);
    if (a < 0) return NULL;
    SymDim *d = dim_div(S, x->type.dims[a], sym_const(S->arena, n), at, "split");
    if (!d) return NULL;
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[a] = d;
    r->is_tuple = 1;
    r->ntuple = (int)n;
    r->attr[0] = a;
    r->attr[1] = n;
    r->nattr = 2;
    return r;
  }
  case SOP_CONCAT: {
    static const char *const keys[] = {"axis"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    const AstExpr *list = arg_at(&c, 0, NULL);
    if (!list || list->kind != EX_LIST || list->u.list.nitems < 1) {
      sema_error(S, list ? list->span : at, "concat takes a list of tensors: concat([a, b], axis = -1)");
      return NULL;
    }
    int64_t axis;
    if (!attr_int(S, F, &c, 1, "axis", -1, &axis)) return NULL;
    int n = list->u.list.nitems;
    SemExpr **parts = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)n);
    for (int i = 0; i < n; i++)
      if (!(parts[i] = check_expr(S, F, list->u.list.items[i]))) return NULL;
    int rank = parts[0]->type.rank;
    if (rank == 0) {
      sema_error(S, at, "concat of scalars");
      return NULL;
    }
    int a = norm_axis(S, &c, axis, rank, &parts[0]->type);
    if (a < 0) return NULL;
    SemExpr *r = new_op(S, op, at, parts, n);
    r->type = parts[0]->type;
    for (int i = 1; i < n; i++) {
      const TensorType *t = &parts[i]->type;
      int ok = t->rank == rank && t->dtype == r->type.dtype;
      for (int k = 0; ok && k < rank; k++)
        if (k != a && !sym_equal(t->dims[k], parts[0]->type.dims[k])) ok = 0;
      if (!ok) {
        sema_error(S, list->u.list.items[i]->span, "concat along axis %d: %s does not fit %s", a, tstr(S, t),
                   tstr(S, &parts[0]->type));
        return NULL;
      }
      r->type.dims[a] = sym_add(S->arena, r->type.dims[a], t->dims[a]);
      if (!r->type.dims[a]) return NULL;
    }
    r->attr[0] = a;
    r->nattr = 1;
    return r;
  }
  case SOP_EMBEDDING: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *table = tensor_arg(S, F, &c, 0), *ids = table ? tensor_arg(S, F, &c, 1) : NULL;
    if (!table || !ids) return NULL;
    if (table->type.rank != 2 || !sem_dtype_is_float(table->type.dtype)) {
      sema_error(S, at, "embedding's table is a float [V, C] tensor; this is %s", tstr(S, &table->type));
      origin_note(S, F, table, "the table");
      return NULL;
    }
    if (sem_dtype_is_float(ids->type.dtype) || ids->kind == SE_SCALAR) {
      sema_error(S, at, "embedding's indices must be an integer tensor; this is %s", tstr(S, &ids->type));
      origin_note(S, F, ids, "the indices");
      return NULL;
    }
    if (ids->type.rank + 1 > SEM_MAX_RANK) {
      sema_error(S, at, "too many dimensions");
      return NULL;
    }
    SemExpr *args[2] = {table, ids};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type = ids->type;
    r->type.dtype = table->type.dtype;
    r->type.dims[r->type.rank++] = table->type.dims[1];
    return r;
  }
  case SOP_ARANGE: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    const AstExpr *ne = arg_at(&c, 0, NULL);
    int infer;
    SymDim *n = ne ? eval_dim(S, F, ne, &infer) : NULL;
    if (!n) {
      if (ne && infer) sema_error(S, ne->span, "arange needs a positive length");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, NULL, 0);
    r->type.dtype = DT_I32;
    r->type.rank = 1;
    r->type.dims[0] = n;
    return r;
  }
  case SOP_CAUSAL_MASK: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    if (!x || !require_float(S, F, x, fn, at)) return NULL;
    int r0 = x->type.rank;
    if (r0 < 2 || !sym_equal(x->type.dims[r0 - 1], x->type.dims[r0 - 2])) {
      sema_error(S, at, "causal_mask needs square scores [..., T, T]; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the scores");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    return r;
  }
  case SOP_ROPE: {
    static const char *const keys[] = {"base"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    double base;
    if (!x || !require_float(S, F, x, fn, at) || !attr_float(S, F, &c, 1, "base", 10000.0, &base)) return NULL;
    int64_t d;
    if (x->type.rank != 4 || (sym_is_const(x->type.dims[3], &d) && d % 2 != 0)) {
      sema_error(S, at, "rope needs [B, H, T, D] with an even D; this is %s", tstr(S, &x->type));
      origin_note(S, F, x, "the tensor");
      return NULL;
    }
    if (!(base > 1)) {
      sema_error(S, arg_at(&c, 1, "base")->span, "rope's base must be greater than 1");
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->scalar = base;
    return r;
  }
  case SOP_REPEAT_KV: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    int64_t n;
    if (!x || !attr_int(S, F, &c, 1, "n", 0, &n)) return NULL;
    if (x->type.rank != 4 || n < 1) {
      sema_error(S, at, "repeat_kv needs [B, Hkv, T, D] and a positive count; this is %s and %" PRId64, tstr(S, &x->type), n);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->type.dims[1] = dim_mul(S, x->type.dims[1], sym_const(S->arena, n), at);
    r->attr[0] = n;
    r->nattr = 1;
    return r->type.dims[1] ? r : NULL;
  }
  case SOP_CROSS_ENTROPY: {
    if (!check_keywords(S, &c, NULL, 0)) return NULL;
    SemExpr *logits = tensor_arg(S, F, &c, 0), *targets = logits ? tensor_arg(S, F, &c, 1) : NULL;
    if (!logits || !targets || !require_float(S, F, logits, "cross_entropy's logits", at)) return NULL;
    if (sem_dtype_is_float(targets->type.dtype) || targets->kind == SE_SCALAR) {
      sema_error(S, at, "cross_entropy's targets are integer class ids; this is %s", tstr(S, &targets->type));
      origin_note(S, F, targets, "the targets");
      return NULL;
    }
    int ok = logits->type.rank == targets->type.rank + 1;
    for (int i = 0; ok && i < targets->type.rank; i++) ok = sym_equal(logits->type.dims[i], targets->type.dims[i]);
    if (!ok) {
      sema_error(S, at, "cross_entropy: logits %s do not fit targets %s (logits are [..., V] over targets [...])",
                 tstr(S, &logits->type), tstr(S, &targets->type));
      origin_note(S, F, logits, "the logits");
      origin_note(S, F, targets, "the targets");
      return NULL;
    }
    SemExpr *args[2] = {logits, targets};
    SemExpr *r = new_op(S, op, at, args, 2);
    r->type.dtype = DT_F32;
    r->type.rank = 0;
    return r;
  }
  case SOP_DROPOUT: {
    static const char *const keys[] = {"p"};
    if (!check_keywords(S, &c, keys, 1)) return NULL;
    SemExpr *x = tensor_arg(S, F, &c, 0);
    double p;
    if (!x || !require_float(S, F, x, fn, at) || !attr_float(S, F, &c, 1, "p", 0.0, &p)) return NULL;
    if (p < 0 || p >= 1) {
      sema_error(S, at, "dropout probability %g is outside [0, 1)", p);
      return NULL;
    }
    SemExpr *r = new_op(S, op, at, &x, 1);
    r->type = x->type;
    r->scalar = p;
    return r;
  }
  default:
    sema_error(S, at, "%s() cannot be called", fn);
    return NULL;
  }
}

static SemFunc *check_forward(Sema *S, SemLayer *layer, SemExpr **args, int nargs, Span site);

static SemExpr *check_child_call(Sema *S, Fwd *F, const SemChild *child, int index, const AstExpr *call) {
  int n = call->u.call.nargs;
  SemExpr **args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    if (call->u.call.args[i].name) {
      sema_error(S, call->u.call.args[i].name_span, "sub-layer calls take tensors by position; '%s =' belongs where the layer is instantiated",
                 call->u.call.args[i].name);
      return NULL;
    }
    if (!(args[i] = check_expr(S, F, call->u.call.args[i].value))) return NULL;
    if (args[i]->is_tuple) {
      sema_error(S, call->u.call.args[i].value->span, "this is a tuple of %d tensors; unpack it first: a, b = ...", args[i]->ntuple);
      return NULL;
    }
  }
  if (child->repeat > 1 && n != 1) {
    sema_error(S, call->span, "'%s' repeats %s %" PRId64 " times, so it takes exactly one tensor", child->name,
               child->layer->decl->name.name, child->repeat);
    return NULL;
  }
  SemFunc *fn = check_forward(S, child->layer, args, n, call->span);
  if (!fn) return NULL;
  if (fn->result->is_tuple) {
    sema_error(S, call->span, "a layer returns one tensor");
    return NULL;
  }
  if (child->repeat > 1 && !type_equal(&fn->result->type, &args[0]->type)) {
    sema_error(S, call->span, "'%s' repeats %s, but one block maps %s to %s; repeated blocks must keep the shape",
               child->name, child->layer->display, tstr(S, &args[0]->type), tstr(S, &fn->result->type));
    diag_note(S->diag, child->span, "repeated here");
    return NULL;
  }
  SemExpr *r = new_expr(S, SE_CALL, call->span);
  r->index = index;
  r->callee = fn;
  r->args = args;
  r->nargs = n;
  r->type = fn->result->type;
  return r;
}

/* Extern calls: the declared tensor types bind the dimension names. */
static SemExpr *check_extern_call(Sema *S, Fwd *F, const AstDecl *ext, const AstExpr *call) {
  if (!check_param_types(S, ext)) return NULL;
  int n = call->u.call.nargs;
  if (n != ext->nparams) {
    sema_error(S, call->span, "%s takes %d tensor%s, not %d", ext->name.name, ext->nparams, ext->nparams == 1 ? "" : "s", n);
    diag_note(S->diag, ext->span, "declared here");
    return NULL;
  }
  SemExpr **args = arena_alloc(S->arena, sizeof(SemExpr *) * (size_t)(n + 1));
  Binding *dims = NULL;
  PtrVec dimvals = {0, 0, 0};
  for (int i = 0; i < n; i++) {
    if (!(args[i] = check_expr(S, F, call->u.call.args[i].value))) return NULL;
    const AstType *t = ext->params[i].tensor_type;
    DType dt;
    if (!parse_dtype(S, t, &dt)) return NULL;
    int ok = dt == args[i]->type.dtype && t->ndims == args[i]->type.rank;
    for (int k = 0; ok && k < t->ndims; k++) {
      const AstExpr *de = t->dims[k];
      SymDim *actual = args[i]->type.dims[k];
      if (de->kind == EX_NAME) {
        Binding *b = lookup(dims, de->u.sval);
        if (!b) {
          b = bind(S, &dims, de->u.sval, B_TENSOR, de->span);
          b->index = dimvals.len;
          ptrvec_push(S->arena, &dimvals, actual);
        } else if (!sym_equal(dimvals.items[b->index], actual)) {
          ok = 0;
        }
      } else {
        int64_t d;
        if (!eval_int(S, NULL, de, "an extern dimension", &d)) return NULL;
        ok = dim_is(actual, d);
      }
    }
    if (!ok) {
      sema_error(S, call->u.call.args[i].value->span, "argument %d of %s is %s, which does not fit '%s: %s'", i + 1,
                 ext->name.name, tstr(S, &args[i]->type), ext->params[i].name.name, ast_type_text(S, t));
      if (i > 0) diag_hint(S->diag, "a dimension name stands for the same size in every argument and the result");
      diag_note(S->diag, t->span, "declared here");
      return NULL;
    }
  }
  SemExpr *r = new_expr(S, SE_EXTERN, call->span);
  r->ext = ext;
  r->args = args;
  r->nargs = n;
  if (!parse_dtype(S, ext->result, &r->type.dtype)) return NULL;
  r->type.rank = ext->result->ndims;
  for (int k = 0; k < ext->result->ndims; k++) {
    const AstExpr *de = ext->result->dims[k];
    if (de->kind == EX_NAME) {
      Binding *b = lookup(dims, de->u.sval);
      if (!b) {
        sema_error(S, de->span, "result dimension '%s' is not a dimension of any argument", de->u.sval);
        return NULL;
      }
      r->type.dims[k] = dimvals.items[b->index];
    } else {
      int64_t d;
      if (!eval_int(S, NULL, de, "an extern dimension", &d)) return NULL;
      r->type.dims[k] = sym_const(S->arena, d);
    }
  }
  return r;
}

static SemExpr *check_call(Sema *S, Fwd *F, const AstExpr *e) {
  const AstExpr *callee = e->u.call.callee;
  if (callee->kind == EX_CALL && callee->u.call.callee->kind == EX_NAME &&
      find_decl(S, callee->u.call.callee->u.sval, (1 << DECL_LAYER) | (1 << DECL_MODEL))) {
    const char *lname = callee->u.call.callee->u.sval;
    sema_error(S, callee->span, "layers are instantiated in the body, next to the params, not in forward");
    diag_hint(S->diag, "write `name = %s(...)` in the body, then call name(x) here", lname);
    return NULL;
  }
  if (callee->kind != EX_NAME) {
    sema_error(S, callee->span, "only sub-layers, builtins and externs can be called");
    return NULL;
  }
  const char *name = callee->u.sval;
  Binding *b = lookup(F->env, name);
  if (b && b->kind == B_CHILD)
    return check_child_call(S, F, &F->box->l.children[b->index], b->index, e);
  if (b && b->kind == B_VALUE) {
    if (b->value.kind == VAL_NONE) return NULL; /* reported where it failed */
    const char *w = val_as_word(&b->value);
    int op = w ? find_builtin(w) : -1;
    if (op >= 0) return check_builtin(S, F, (SemOp)op, e, w);
    sema_error(S, callee->span, "'%s' is %s, which cannot be called", name, val_str(S->arena, &b->value));
    if (w) diag_hint(S->diag, "an activation parameter holds a builtin name such as gelu, relu or silu");
    return NULL;
  }
  if (b) {
    sema_error(S, callee->span, "'%s' is a tensor, not a function", name);
    return NULL;
  }
  int op = find_builtin(name);
  if (op >= 0) return check_builtin(S, F, (SemOp)op, e, name);
  const AstDecl *d = find_decl(S, name, DECL_CALLABLE);
  if (d && d->kind == DECL_EXTERN) return check_extern_call(S, F, d, e);
  if (d) {
    sema_error(S, callee->span, "%s '%s' must be instantiated in the body before forward calls it", ast_decl_kind_name(d->kind), name);
    diag_hint(S->diag, "write `name = %s(...)` next to the params, then call name(x)", name);
    return NULL;
  }
  sema_error(S, callee->span, "unknown function '%s'", name);
  const char *close = suggest(S, F->env, name, 1);
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
  return NULL;
}

static SemExpr *check_index(Sema *S, Fwd *F, const AstExpr *e) {
  SemExpr *x = check_expr(S, F, e->u.index.obj);
  if (!x) return NULL;
  int n = e->u.index.nitems;
  if (n > x->type.rank) {
    sema_error(S, e->span, "%d indices for %s", n, tstr(S, &x->type));
    return NULL;
  }
  SemExpr *r = new_op(S, SOP_SLICE, e->span, &x, 1);
  r->type.dtype = x->type.dtype;
  int out = 0;
  for (int i = 0; i < x->type.rank; i++) {
    SymDim *dim = x->type.dims[i];
    const AstExpr *it = i < n ? e->u.index.items[i] : NULL;
    int64_t size = -1;
    sym_is_const(dim, &size);
    int64_t lo = 0, hi = size;
    int drop = 0;
    if (it && it->kind == EX_SLICE) {
      if (it->u.slice.lo && !eval_int(S, F->env, it->u.slice.lo, "a slice bound", &lo)) return NULL;
      if (it->u.slice.hi && !eval_int(S, F->env, it->u.slice.hi, "a slice bound", &hi)) return NULL;
      if ((it->u.slice.lo || it->u.slice.hi) && size < 0) {
        sema_error(S, it->span, "slicing dimension %d needs its size known at compile time; it is %s", i,
                   sym_str(S->arena, dim));
        return NULL;
      }
    } else if (it) {
      if (!eval_int(S, F->env, it, "an index", &lo)) return NULL;
      if (size < 0) {
        sema_error(S, it->span, "indexing dimension %d needs its size known at compile time; it is %s", i, sym_str(S->arena, dim));
        return NULL;
      }
      if (lo < 0) lo += size;
      hi = lo + 1;
      drop = 1;
    }
    if (size >= 0) {
      if (lo < 0) lo += size;
      if (hi < 0) hi += size;
      if (lo < 0 || hi > size || lo >= hi) {
        sema_error(S, it ? it->span : e->span, "slice %" PRId64 ":%" PRId64 " is out of range for dimension %d of size %" PRId64, lo, hi, i, size);
        return NULL;
      }
    }
    r->attr[i] = lo;
    r->attr[SEM_MAX_RANK + i] = size >= 0 ? hi : -1;
    r->attr[2 * SEM_MAX_RANK + i] = drop;
    if (!drop) r->type.dims[out++] = size >= 0 ? sym_const(S->arena, hi - lo) : dim;
  }
  r->type.rank = out;
  r->nattr = 3 * SEM_MAX_RANK;
  return r;
}

static SemExpr *check_expr(Sema *S, Fwd *F, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: return scalar_expr(S, (double)e->u.ival, e->span);
  case EX_FLOAT: return scalar_expr(S, e->u.fval.value, e->span);
  case EX_NAME: {
    Binding *b = lookup(F->env, e->u.sval);
    if (!b) {
      if (find_builtin(e->u.sval) >= 0) {
        sema_error(S, e->span, "'%s' is a function; call it: %s(x)", e->u.sval, e->u.sval);
        return NULL;
      }
      sema_error(S, e->span, "unknown name '%s'", e->u.sval);
      const char *close = suggest(S, F->env, e->u.sval, 0);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return NULL;
    }
    switch (b->kind) {
    case B_TENSOR: return b->expr;
    case B_PARAM: {
      SemExpr *x = new_expr(S, SE_PARAM, e->span);
      x->index = b->index;
      x->type = ((SemParam *)F->box->params.items[b->index])->type;
      return x;
    }
    case B_CHILD:
      sema_error(S, e->span, "'%s' is a sub-layer; call it: %s(x)", e->u.sval, e->u.sval);
      return NULL;
    case B_VALUE: {
      double v;
      if (b->value.kind == VAL_NONE) return NULL; /* its error was reported */
      if (b->value.kind == VAL_BOOL || !val_as_float(&b->value, &v)) {
        sema_error(S, e->span, "'%s' is %s, not a tensor or a number", e->u.sval, val_str(S->arena, &b->value));
        return NULL;
      }
      return scalar_expr(S, v, e->span);
    }
    }
    return NULL;
  }
  case EX_UNARY: {
    if (e->u.op.op == OP_NOT) {
      sema_error(S, e->span, "'not' works on compile-time bools, not tensors");
      return NULL;
    }
    SemExpr *x = check_expr(S, F, e->u.op.a);
    if (!x) return NULL;
    if (x->kind == SE_SCALAR) return scalar_expr(S, -x->scalar, e->span);
    SemExpr *r = new_op(S, SOP_NEG, e->span, &x, 1);
    r->type = x->type;
    return r;
  }
  case EX_BINARY: {
    AstOp op = e->u.op.op;
    if (op == OP_POW) {
      SemExpr *x = check_expr(S, F, e->u.op.a);
      if (!x) return NULL;
      Value p = eval_const(S, F->env, e->u.op.b);
      double pv;
      if (p.kind == VAL_NONE) return NULL;
      if (!val_as_float(&p, &pv)) {
        sema_error(S, e->u.op.b->span, "the exponent must be a number known at compile time");
        return NULL;
      }
      if (x->kind == SE_SCALAR) return scalar_expr(S, pow(x->scalar, pv), e->span);
      if (!require_float(S, F, x, "'**'", e->u.op.op_span)) return NULL;
      SemExpr *r = new_op(S, SOP_POW, e->span, &x, 1);
      r->type = x->type;
      r->scalar = pv;
      return r;
    }
    if (op != OP_ADD && op != OP_SUB && op != OP_MUL && op != OP_DIV && op != OP_MATMUL) {
      sema_error(S, e->u.op.op_span, "'%s' is not a tensor operation; comparisons and logic are compile-time only",
                 ast_op_text(op));
      return NULL;
    }
    SemExpr *a = check_expr(S, F, e->u.op.a);
    SemExpr *b = a ? check_expr(S, F, e->u.op.b) : NULL;
    if (!a || !b) return NULL;
    if (a->is_tuple || b->is_tuple) {
      sema_error(S, (a->is_tuple ? a : b)->span, "this is a tuple of tensors; unpack it first: a, b = ...");
      return NULL;
    }
    if (op == OP_MATMUL) return matmul_op(S, F, a, b, e->u.op.op_span);
    if (a->kind == SE_SCALAR && b->kind == SE_SCALAR) {
      double x = a->scalar, y = b->scalar;
      if (op == OP_DIV && y == 0) {
        sema_error(S, e->u.op.b->span, "division by zero");
        return NULL;
      }
      return scalar_expr(S, op == OP_ADD ? x + y : op == OP_SUB ? x - y : op == OP_MUL ? x * y : x / y, e->span);
    }
    SemOp sop = op == OP_ADD ? SOP_ADD : op == OP_SUB ? SOP_SUB : op == OP_MUL ? SOP_MUL : SOP_DIV;
    SemExpr *r = broadcast_op(S, F, sop, a, b, e->u.op.op_span, ast_op_text(op));
    if (r) r->span = e->span;
    return r;
  }
  case EX_CALL: return check_call(S, F, e);
  case EX_MEMBER: {
    const AstExpr *obj = e->u.member.obj;
    Binding *b = obj->kind == EX_NAME ? lookup(F->env, obj->u.sval) : NULL;
    if (!b || b->kind != B_CHILD) {
      sema_error(S, obj->span, "'.%s' reads a parameter of a sub-layer, and this is not a sub-layer", e->u.member.name);
      return NULL;
    }
    const SemChild *child = &F->box->l.children[b->index];
    if (child->repeat > 1) {
      sema_error(S, e->span, "'%s' is repeated %" PRId64 " times, so '%s.%s' has no single value", child->name,
                 child->repeat, child->name, e->u.member.name);
      return NULL;
    }
    const SemLayer *cl = child->layer;
    for (int i = 0; i < cl->nparams; i++)
      if (!strcmp(cl->params[i].name, e->u.member.name)) {
        SemExpr *x = new_expr(S, SE_CHILD_PARAM, e->span);
        x->index = b->index;
        x->index2 = i;
        x->type = cl->params[i].type;
        return x;
      }
    sema_error(S, e->u.member.name_span, "%s has no parameter '%s'", cl->display, e->u.member.name);
    const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(cl->nparams + 1));
    for (int i = 0; i < cl->nparams; i++) names[i] = cl->params[i].name;
    const char *close = diag_closest(e->u.member.name, names, cl->nparams);
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    return NULL;
  }
  case EX_INDEX: return check_index(S, F, e);
  case EX_BOOL:
  case EX_STRING:
    sema_error(S, e->span, "a %s is not a tensor", e->kind == EX_BOOL ? "bool" : "string");
    return NULL;
  case EX_TUPLE:
  case EX_LIST:
    sema_error(S, e->span, "lists and tuples are not tensors (concat([a, b]) joins tensors)");
    return NULL;
  case EX_SLICE:
  case EX_REPEAT:
    sema_error(S, e->span, "this belongs in the body of a layer, not in forward");
    return NULL;
  }
  return NULL;
}

/* True when `e` needs no tensor: a constant such as 1.0 / sqrt(D). */
static int is_const_expr(Binding *env, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: case EX_FLOAT: case EX_BOOL: case EX_STRING: return 1;
  case EX_NAME: {
    Binding *b = lookup(env, e->u.sval);
    return b ? b->kind == B_VALUE : find_builtin(e->u.sval) < 0;
  }
  case EX_UNARY: return is_const_expr(env, e->u.op.a);
  case EX_BINARY: return e->u.op.op != OP_MATMUL && is_const_expr(env, e->u.op.a) && is_const_expr(env, e->u.op.b);
  case EX_TUPLE: case EX_LIST:
    for (int i = 0; i < e->u.list.nitems; i++)
      if (!is_const_expr(env, e->u.list.items[i])) return 0;
    return 1;
  case EX_CALL: {
    static const char *const scalar_fns[] = {"sqrt", "exp", "log", "abs", "int", "float", "min", "max"};
    if (e->u.call.callee->kind != EX_NAME || lookup(env, e->u.call.callee->u.sval)) return 0;
    int known = 0;
    for (int k = 0; k < 8; k++) known |= !strcmp(scalar_fns[k], e->u.call.callee->u.sval);
    if (!known) return 0;
    for (int i = 0; i < e->u.call.nargs; i++)
      if (!is_const_expr(env, e->u.call.args[i].value)) return 0;
    return 1;
  }
  default: return 0;
  }
}

static int check_stmts(Sema *S, Fwd *F, const AstBlock *body, SemExpr **result, int is_model, int top);

static int check_assign(Sema *S, Fwd *F, const AstStmt *st) {
  const AstExpr *v = st->u.assign.value;
  int n = st->u.assign.nnames;
  for (int i = 0; i < n; i++) {
    Binding *prev = lookup(F->env, st->u.assign.names[i].name);
    if (prev && (prev->kind == B_PARAM || prev->kind == B_CHILD)) {
      sema_error(S, st->u.assign.names[i].span, "'%s' is a %s of %s; choose another name",
                 prev->name, prev->kind == B_PARAM ? "parameter" : "sub-layer", F->box->l.decl->name.name);
      diag_note(S->diag, prev->span, "declared here");
      return 0;
    }
  }
  if (v->kind == EX_REPEAT || is_layer_instantiation(S, v)) {
    if (v->kind == EX_REPEAT || find_decl(S, v->u.call.callee->u.sval, (1 << DECL_LAYER) | (1 << DECL_MODEL))) {
      sema_error(S, v->span, "layers are instantiated in the body, next to the params, not in forward");
      return 0;
    }
  }
  if (n == 1 && is_const_expr(F->env, v)) {
    Value c = eval_const(S, F->env, v);
    if (c.kind == VAL_NONE) return 0;
    Binding *b = bind(S, &F->env, st->u.assign.names[0].name, B_VALUE, st->u.assign.names[0].span);
    b->value = c;
    return 1;
  }
  SemExpr *x = check_expr(S, F, v);
  if (!x) {
    /* Bind the names to "nothing" so their uses stay quiet: one error, not a cascade. */
    for (int i = 0; i < n; i++) {
      Binding *b = bind(S, &F->env, st->u.assign.names[i].name, B_VALUE, st->u.assign.names[i].span);
      b->value = none_value(st->u.assign.names[i].span);
    }
    return 0;
  }
  if (n == 1) {
    if (x->is_tuple) {
      sema_error(S, st->u.assign.names[0].span, "this gives %d tensors; name each: a, b = ...", x->ntuple);
      return 0;
    }
    Binding *b = bind(S, &F->env, st->u.assign.names[0].name, B_TENSOR, st->u.assign.names[0].span);
    b->expr = x;
    return 1;
  }
  if (!x->is_tuple || x->ntuple != n) {
    sema_error(S, st->span, "%d names, but the value is %s", n,
               x->is_tuple ? arena_printf(S->arena, "%d tensors", x->ntuple) : "one tensor");
    return 0;
  }
  for (int i = 0; i < n; i++) {
    SemExpr *g = new_expr(S, SE_TUPLE_GET, st->u.assign.names[i].span);
    g->index = i;
    g->type = x->type;
    g->args = arena_alloc(S->arena, sizeof(SemExpr *));
    g->args[0] = x;
    g->nargs = 1;
    Binding *b = bind(S, &F->env, st->u.assign.names[i].name, B_TENSOR, st->u.assign.names[i].span);
    b->expr = g;
  }
  return 1;
}

static int check_stmts(Sema *S, Fwd *F, const AstBlock *body, SemExpr **result, int is_model, int top) {
  int ok = 1;
  for (int i = 0; i < body->n && !diag_saturated(S->diag); i++) {
    const AstStmt *st = body->items[i];
    switch (st->kind) {
    case ST_ASSIGN:
      ok &= check_assign(S, F, st);
      break;
    case ST_RETURN: {
      if (is_model) {
        sema_error(S, st->span, "a model's forward does not return; it assigns 'loss'");
        ok = 0;
        break;
      }
      if (*result) {
        sema_error(S, st->span, "forward returns twice");
        ok = 0;
        break;
      }
      if (!top || i != body->n - 1) {
        sema_error(S, st->span, "'return' must be the last statement of forward");
        ok = 0;
        break;
      }
      SemExpr *x = check_expr(S, F, st->u.ret.value);
      if (!x) {
        ok = 0;
        break;
      }
      if (x->is_tuple || x->kind == SE_SCALAR) {
        sema_error(S, st->u.ret.value->span, "forward returns one tensor");
        ok = 0;
        break;
      }
      *result = x;
      break;
    }
    case ST_IF: {
      Value c = eval_const(S, F->env, st->u.if_.cond);
      if (c.kind == VAL_NONE) {
        ok = 0;
        break;
      }
      if (c.kind != VAL_BOOL) {
        sema_error(S, st->u.if_.cond->span, "the condition must be a bool known at compile time, not %s", val_str(S->arena, &c));
        ok = 0;
        break;
      }
      ok &= check_stmts(S, F, c.b ? &st->u.if_.then : &st->u.if_.otherwise, result, is_model, 0);
      break;
    }
    default:
      sema_error(S, st->span, "this declaration belongs in the body, not in forward");
      ok = 0;
      break;
    }
  }
  return ok;
}

static SemFunc *check_forward(Sema *S, SemLayer *layer, SemExpr **args, int nargs, Span site) {
  LayerBox *box = (LayerBox *)layer;
  for (SemFunc *f = layer->funcs; f; f = f->next) {
    if (f->nargs != nargs) continue;
    int same = 1;
    for (int i = 0; i < nargs && same; i++) same = type_equal(&f->arg_types[i], &args[i]->type);
    if (same) return f->result ? f : NULL; /* a failed check is reported once */
  }
  const AstStmt *fw = layer->forward;
  int is_model = layer->decl->kind == DECL_MODEL;
  if (!is_model && fw->u.forward.nargs != nargs) {
    sema_error(S, site, "%s's forward takes %d tensor%s, not %d", layer->decl->name.name, fw->u.forward.nargs,
               fw->u.forward.nargs == 1 ? "" : "s", nargs);
    diag_note(S->diag, fw->span, "forward declared here");
    return NULL;
  }
  if (S->depth >= SEMA_MAX_DEPTH) {
    sema_error(S, site, "layers nested deeper than %d levels", SEMA_MAX_DEPTH);
    return NULL;
  }
  SemFunc *fn = arena_alloc(S->arena, sizeof *fn);
  fn->layer = layer;
  fn->nargs = nargs;
  fn->arg_types = arena_alloc(S->arena, sizeof(TensorType) * (size_t)(nargs + 1));
  Fwd F = {box, box->env};
  for (int i = 0; i < nargs; i++) {
    fn->arg_types[i] = args[i]->type;
    SemExpr *a = new_expr(S, SE_ARG, fw->u.forward.args[i].span);
    a->index = i;
    a->type = args[i]->type;
    Binding *b = bind(S, &F.env, fw->u.forward.args[i].name, B_TENSOR, fw->u.forward.args[i].span);
    b->expr = a;
  }
  Frame fr = {layer->display, site, layer->decl, S->frame, 1};
  S->frame = &fr;
  S->depth++;
  SemExpr *result = NULL;
  int ok = check_stmts(S, &F, &fw->u.forward.body, &result, is_model, 1);
  S->frame = fr.up;
  S->depth--;
  /* Remember the argument types even when the check failed (result NULL). */
  fn->next = layer->funcs;
  layer->funcs = fn;
  if (!ok) return NULL;
  if (is_model) {
    Binding *loss = lookup(F.env, "loss");
    if (!loss || loss->kind != B_TENSOR) {
      sema_error(S, fw->span, "model %s's forward never assigns 'loss'", layer->decl->name.name);
      diag_hint(S->diag, "end forward with loss = cross_entropy(logits, targets)");
      return NULL;
    }
    if (loss->expr->type.rank != 0) {
      sema_error(S, loss->span, "'loss' must be a scalar; it is %s", tstr(S, &loss->expr->type));
      diag_hint(S->diag, "reduce it, e.g. mean(x) or cross_entropy(logits, targets)");
      return NULL;
    }
    result = loss->expr;
  } else if (!result) {
    sema_error(S, fw->span, "%s's forward does not return a tensor", layer->decl->name.name);
    return NULL;
  }
  fn->result = result;
  return fn;
}

/* ------------------------------------------------------------------ */
/* train, parallel and cluster blocks                                  */

typedef enum { K_INT, K_FLOAT, K_BOOL, K_STRING, K_WORD, K_SPEC, K_BLOCK, K_BYTES_PER_S, K_SECONDS, K_ONOFF } KeyKind;

typedef struct {
  const char *key;
  KeyKind kind;
  const char *const *words; /* K_WORD / K_SPEC: the accepted names, NULL-terminated */
  int allow_auto;
} KeySpec;

static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
static const char *const optimizers[] = {"sgd", "adamw", NULL};
static const char *const schedules[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const recomputes[] = {"none", "selective", "full", NULL};
static const char *const compressions[] = {"none", "fp16", "int8", "topk", NULL};
static const char *const balances[] = {"cost", "layers", NULL};
static const char *const loss_scales[] = {"dynamic", NULL};

static const KeySpec train_keys[] = {
    {"batch", K_INT, NULL, 0},        {"micro_batch", K_INT, NULL, 1}, {"steps", K_INT, NULL, 0},
    {"precision", K_WORD, precisions, 0}, {"loss_scale", K_WORD, loss_scales, 0},
    {"optimizer", K_SPEC, optimizers, 0}, {"clip", K_FLOAT, NULL, 0}, {"data", K_STRING, NULL, 0},
    {"checkpoint", K_BLOCK, NULL, 0},  {"seed", K_INT, NULL, 0},      {"log_every", K_INT, NULL, 0},
};
static const KeySpec checkpoint_keys[] = {
    {"every", K_INT, NULL, 0}, {"dir", K_STRING, NULL, 0}, {"keep", K_INT, NULL, 0}, {"async", K_BOOL, NULL, 0},
};
static const KeySpec parallel_keys[] = {
    {"cluster", K_STRING, NULL, 0},     {"nodes", K_INT, NULL, 1},     {"gpus_per_node", K_INT, NULL, 0},
    {"gpus", K_INT, NULL, 0},           {"data", K_INT, NULL, 1},      {"tensor", K_INT, NULL, 1},
    {"pipeline", K_INT, NULL, 1},       {"schedule", K_WORD, schedules, 1}, {"virtual", K_INT, NULL, 1},
    {"sequence", K_ONOFF, NULL, 1},     {"context", K_INT, NULL, 1},   {"zero", K_INT, NULL, 1},
    {"recompute", K_WORD, recomputes, 1}, {"overlap", K_ONOFF, NULL, 1},
    {"compression", K_SPEC, compressions, 0}, {"balance", K_WORD, balances, 0},
};
static const KeySpec cluster_keys[] = {
    {"device", K_STRING, NULL, 0},          {"gpus_per_node", K_INT, NULL, 0},   {"nodes", K_INT, NULL, 0},
    {"nics_per_node", K_INT, NULL, 0},      {"intra_bandwidth", K_BYTES_PER_S, NULL, 0},
    {"intra_latency", K_SECONDS, NULL, 0},  {"inter_bandwidth", K_BYTES_PER_S, NULL, 0},
    {"inter_latency", K_SECONDS, NULL, 0},
};
static const KeySpec extern_keys[] = {
    {"library", K_STRING, NULL, 0}, {"symbol", K_STRING, NULL, 0}, {"grad", K_STRING, NULL, 0},
};

#define NKEYS(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
  const KeySpec *spec;
  Value value;
  Span span;     /* the whole setting (or none for the command line) */
  int from_cli;
  const AstSetting *setting;
} Setting;

typedef struct {
  Setting items[32];
  int n;
} Settings;

static Setting *setting_get(Settings *s, const char *key) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->items[i].spec->key, key)) return &s->items[i];
  return NULL;
}

static int word_index(const char *const *words, const char *w) {
  for (int i = 0; w && words[i]; i++)
    if (!strcmp(words[i], w)) return i;
  return -1;
}

static int words_count(const char *const *words) {
  int n = 0;
  while (words[n]) n++;
  return n;
}

static const char *words_list(Sema *S, const char *const *words) {
  char *s = NULL;
  int n = words_count(words);
  for (int i = 0; i < n; i++)
    s = s ? arena_printf(S->arena, "%s%s%s", s, i == n - 1 ? " or " : ", ", words[i]) : arena_strdup(S->arena, words[i]);
  return s ? s : "";
}

/* Checks one value against its key's kind; reports with `at`. */
static int check_setting_value(Sema *S, const KeySpec *spec, Value *v, Span at) {
  const char *w = val_as_word(v);
  if (spec->allow_auto && w && !strcmp(w, "auto")) return 1;
  switch (spec->kind) {
  case K_INT:
    if (v->kind == VAL_INT) {
      if (v->i < 0) break;
      return 1;
    }
    break;
  case K_FLOAT:
    if (v->kind == VAL_INT) {
      v->kind = VAL_FLOAT;
      v->f = (double)v->i;
    }
    if (v->kind == VAL_FLOAT && v->f >= 0) return 1;
    break;
  case K_BOOL:
  case K_ONOFF:
    if (v->kind == VAL_BOOL) return 1;
    if (spec->kind == K_ONOFF && w && (!strcmp(w, "on") || !strcmp(w, "off"))) return 1;
    break;
  case K_STRING:
    if (v->kind == VAL_STRING || v->kind == VAL_ATOM) return 1;
    break;
  case K_WORD:
  case K_SPEC: {
    const char *name = w ? w : v->kind == VAL_CALL && spec->kind == K_SPEC ? v->s : NULL;
    if (!strcmp(spec->key, "loss_scale") && (v->kind == VAL_INT || v->kind == VAL_FLOAT)) return 1;
    if (name && word_index(spec->words, name) >= 0) return 1;
    if (name) {
      sema_error(S, at, "unknown %s '%s'; it is %s", spec->key, name, words_list(S, spec->words));
      const char *close = diag_closest(name, spec->words, words_count(spec->words));
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      return 0;
    }
    break;
  }
  case K_BYTES_PER_S:
  case K_SECONDS: {
    AstUnit want = spec->kind == K_SECONDS ? UNIT_SECONDS : UNIT_BYTES_PER_S;
    double f;
    if (val_as_float(v, &f) && f > 0 && (v->unit == UNIT_NONE || v->unit == want)) {
      v->kind = VAL_FLOAT;
      v->f = f;
      return 1;
    }
    if (val_as_float(v, &f) && v->unit != UNIT_NONE) {
      sema_error(S, at, "'%s' is %s; this literal has another unit", spec->key,
                 want == UNIT_SECONDS ? "a time (ns, us, ms, s)" : "a bandwidth (GB/s, Gb/s, Gbps)");
      return 0;
    }
    break;
  }
  case K_BLOCK:
    sema_error(S, at, "'%s' is a block: %s { ... }", spec->key, spec->key);
    return 0;
  }
  static const char *const kind_text[] = {"a non-negative integer", "a non-negative number", "true or false", "a string", "a name",
                                          "a name", "a block", "a bandwidth such as 200GB/s", "a time such as 5us", "on or off"};
  const char *kind = kind_text[spec->kind];
  if (spec->allow_auto && spec->kind == K_ONOFF) kind = "on, off";
  sema_error(S, at, "'%s' must be %s%s, not %s", spec->key, kind, spec->allow_auto ? " or auto" : "",
             val_str(S->arena, v));
  if (spec->kind == K_WORD || spec->kind == K_SPEC) diag_hint(S->diag, "choose %s", words_list(S, spec->words));
  return 0;
}

static void read_settings(Sema *S, const AstSettings *src, const KeySpec *keys, int nkeys, Settings *out, const char *block) {
  out->n = 0;
  const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(nkeys + 1));
  for (int k = 0; k < nkeys; k++) names[k] = keys[k].key;
  for (int i = 0; i < src->n; i++) {
    const AstSetting *st = src->items[i];
    const KeySpec *spec = NULL;
    for (int k = 0; k < nkeys; k++)
      if (!strcmp(keys[k].key, st->key.name)) spec = &keys[k];
    if (!spec) {
      sema_error(S, st->key.span, "unknown setting '%s' in %s", st->key.name, block);
      const char *close = diag_closest(st->key.name, names, nkeys);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      else diag_hint(S->diag, "%s settings are %s", block, words_list(S, names));
      continue;
    }
    Setting *prev = setting_get(out, spec->key);
    if (prev) {
      sema_error(S, st->key.span, "'%s' is set twice", spec->key);
      diag_note(S->diag, prev->span, "first set here");
      continue;
    }
    if ((spec->kind == K_BLOCK) != st->is_block) {
      sema_error(S, st->span, spec->kind == K_BLOCK ? "'%s' is a block: %s { ... }" : "'%s' takes a value: %s = ...", spec->key,
                 spec->key);
      continue;
    }
    if (out->n == NKEYS(out->items)) break;
    Setting *s = &out->items[out->n];
    memset(s, 0, sizeof *s);
    s->spec = spec;
    s->span = st->span;
    s->setting = st;
    if (!st->is_block) {
      s->value = eval_const(S, NULL, st->value);
      if (s->value.kind == VAL_NONE || !check_setting_value(S, spec, &s->value, st->value->span)) continue;
    }
    out->n++;
  }
}

/* --dp 4 and friends replace what the file says. */
static void apply_cli(Sema *S, Settings *out, const char *block, const KeySpec *keys, int nkeys) {
  size_t blen = strlen(block);
  for (int i = 0; i < S->opts->nlayout; i++) {
    const SemDefine *d = &S->opts->layout[i];
    if (strncmp(d->name, block, blen) != 0 || d->name[blen] != '.') continue;
    const char *key = d->name + blen + 1;
    const KeySpec *spec = NULL;
    for (int k = 0; k < nkeys; k++)
      if (!strcmp(keys[k].key, key)) spec = &keys[k];
    if (!spec) continue;
    Value v = val_parse_literal(S->arena, d->value);
    v.span = span_none;
    if (spec->kind == K_ONOFF && v.kind == VAL_ATOM && (!strcmp(v.s, "true") || !strcmp(v.s, "false"))) {
      v.kind = VAL_BOOL;
      v.b = v.s[0] == 't';
    }
    S->cli_prefix = d->flag ? arena_printf(S->arena, "%s %s", d->flag, d->value) : NULL;
    int ok = check_setting_value(S, spec, &v, span_none);
    S->cli_prefix = NULL;
    if (!ok) {
      if (S->opts->cli_error) *S->opts->cli_error = 1;
      continue;
    }
    Setting *s = setting_get(out, key);
    if (!s) {
      if (out->n == NKEYS(out->items)) continue;
      s = &out->items[out->n++];
    }
    memset(s, 0, sizeof *s);
    s->spec = spec;
    s->value = v;
    s->span = span_none;
    s->from_cli = 1;
  }
}

static int64_t get_int(Settings *s, const char *key, int64_t dflt) {
  Setting *x = setting_get(s, key);
  if (!x) return dflt;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  return x->value.kind == VAL_INT ? x->value.i : dflt;
}

static double get_float(Settings *s, const char *key, double dflt) {
  Setting *x = setting_get(s, key);
  double f;
  return x && val_as_float(&x->value, &f) ? f : dflt;
}

static int get_word(Settings *s, const char *key, const char *const *words, int dflt) {
  Setting *x = setting_get(s, key);
  if (!x) return dflt;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  if (!w && x->value.kind == VAL_CALL) w = x->value.s;
  int i = word_index(words, w);
  return i >= 0 ? i : dflt;
}

static int get_onoff(Settings *s, const char *key, int dflt) {
  Setting *x = setting_get(s, key);
  if (!x) return dflt;
  if (x->value.kind == VAL_BOOL) return x->value.b;
  const char *w = val_as_word(&x->value);
  if (w && !strcmp(w, "auto")) return -1;
  return w && !strcmp(w, "on");
}

/* Reads the keyword or positional arguments of a spec such as adamw(...). */
static int spec_float(Sema *S, const Value *spec, const char *key, int pos, double dflt, double *out) {
  int p = 0;
  for (int i = 0; i < spec->n; i++) {
    int hit = spec->keys[i] ? !strcmp(spec->keys[i], key) : p++ == pos;
    if (!hit) continue;
    if (!val_as_float(&spec->items[i], out)) {
      sema_error(S, spec->items[i].span, "%s's '%s' must be a number, not %s", spec->s, key, val_str(S->arena, &spec->items[i]));
      return 0;
    }
    return 1;
  }
  *out = dflt;
  return 1;
}

static int spec_check_keys(Sema *S, const Value *spec, const char *const *keys, int npos_max) {
  int npos = 0;
  for (int i = 0; i < spec->n; i++) {
    if (!spec->keys[i]) {
      if (++npos > npos_max) {
        sema_error(S, spec->items[i].span, "%s takes at most %d positional argument%s", spec->s, npos_max, npos_max == 1 ? "" : "s");
        return 0;
      }
      continue;
    }
    if (word_index(keys, spec->keys[i]) < 0) {
      sema_error(S, spec->items[i].span, "%s has no argument '%s'", spec->s, spec->keys[i]);
      const char *close = diag_closest(spec->keys[i], keys, words_count(keys));
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      else diag_hint(S->diag, "its arguments are %s", words_list(S, keys));
      return 0;
    }
  }
  return 1;
}

static void read_optimizer(Sema *S, Setting *opt, SemTrain *t) {
  t->optimizer = OPT_ADAMW;
  t->lr = 3e-4;
  t->beta1 = 0.9;
  t->beta2 = 0.999;
  t->eps = 1e-8;
  if (!opt) return;
  const Value *v = &opt->value;
  const char *name = v->kind == VAL_CALL ? v->s : val_as_word(v);
  t->optimizer = !strcmp(name, "sgd") ? OPT_SGD : OPT_ADAMW;
  if (v->kind != VAL_CALL) return;
  if (t->optimizer == OPT_SGD) {
    static const char *const keys[] = {"lr", "momentum", "weight_decay", "warmup", "decay", "min_lr", NULL};
    if (!spec_check_keys(S, v, keys, 1)) return;
  } else {
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay", "warmup", "decay", "min_lr", NULL};
    if (!spec_check_keys(S, v, keys, 1)) return;
  }
  double warmup = 0;
  spec_float(S, v, "lr", 0, t->lr, &t->lr);
  spec_float(S, v, "momentum", -1, 0, &t->momentum);
  spec_float(S, v, "eps", -1, t->eps, &t->eps);
  spec_float(S, v, "weight_decay", -1, 0, &t->weight_decay);
  spec_float(S, v, "min_lr", -1, 0, &t->min_lr);
  spec_float(S, v, "warmup", -1, 0, &warmup);
  t->warmup = (int64_t)warmup;
  if (!(t->lr > 0)) sema_error(S, v->span, "the learning rate must be positive");
  for (int i = 0; i < v->n; i++) {
    if (!v->keys[i]) continue;
    const Value *a = &v->items[i];
    if (!strcmp(v->keys[i], "betas")) {
      double b1, b2;
      if (a->kind != VAL_TUPLE || a->n != 2 || !val_as_float(&a->items[0], &b1) || !val_as_float(&a->items[1], &b2) ||
          b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
        sema_error(S, a->span, "betas is a pair of numbers in [0, 1): betas = (0.9, 0.95)");
        continue;
      }
      t->beta1 = b1;
      t->beta2 = b2;
    } else if (!strcmp(v->keys[i], "decay")) {
      static const char *const decays[] = {"none", "cosine", "linear", NULL};
      int d = word_index(decays, val_as_word(a));
      if (d < 0) {
        sema_error(S, a->span, "decay is none, cosine or linear, not %s", val_str(S->arena, a));
        continue;
      }
      t->decay = (DecayKind)d;
    }
  }
}

static void read_train(Sema *S, SemModel *m, const AstDecl *decl, Settings *out) {
  Settings s;
  read_settings(S, decl ? &decl->settings : &(AstSettings){0, 0}, train_keys, NKEYS(train_keys), &s, "train");
  apply_cli(S, &s, "train", train_keys, NKEYS(train_keys));
  SemTrain *t = &m->train;
  t->micro_batch = get_int(&s, "micro_batch", 1);
  t->global_batch = get_int(&s, "batch", 0); /* 0: one micro-batch per data rank, set by the layout */
  t->steps = get_int(&s, "steps", 1000);
  t->seed = get_int(&s, "seed", 1234);
  t->log_every = get_int(&s, "log_every", 10);
  t->precision = (Precision)get_word(&s, "precision", precisions, PREC_FP32);
  t->clip = get_float(&s, "clip", 0);
  Setting *ls = setting_get(&s, "loss_scale");
  t->loss_scale = ls && ls->value.kind != VAL_ATOM && ls->value.kind != VAL_STRING ? get_float(&s, "loss_scale", 0) : 0;
  Setting *data = setting_get(&s, "data");
  t->data = data ? val_as_word(&data->value) : NULL;
  read_optimizer(S, setting_get(&s, "optimizer"), t);
  Setting *ck = setting_get(&s, "checkpoint");
  t->ckpt_every = 0;
  t->ckpt_keep = 3;
  if (ck && ck->setting) {
    Settings c;
    read_settings(S, &ck->setting->nested, checkpoint_keys, NKEYS(checkpoint_keys), &c, "checkpoint");
    t->ckpt_every = get_int(&c, "every", 0);
    t->ckpt_keep = get_int(&c, "keep", 3);
    Setting *dir = setting_get(&c, "dir");
    t->ckpt_dir = dir ? val_as_word(&dir->value) : "checkpoints";
    Setting *as = setting_get(&c, "async");
    t->ckpt_async = as && as->value.kind == VAL_BOOL && as->value.b;
  }
  Setting *bad = NULL;
  if (t->global_batch == 0 && setting_get(&s, "batch")) bad = setting_get(&s, "batch");
  else if (t->micro_batch == 0) bad = setting_get(&s, "micro_batch");
  else if (t->steps == 0) bad = setting_get(&s, "steps");
  if (bad) {
    sema_error(S, bad->span, "'%s' must be at least 1", bad->spec->key);
    if (bad->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
  }
  *out = s;
}

static const char *normalize_name(Sema *S, const char *name) {
  char *s = arena_strdup(S->arena, name);
  for (char *p = s; *p; p++)
    if (*p == '-') *p = '_';
  return s;
}

static int read_cluster_decl(Sema *S, const AstDecl *decl, SemCluster *c) {
  Settings s;
  int before = diag_error_count(S->diag);
  read_settings(S, &decl->settings, cluster_keys, NKEYS(cluster_keys), &s, "cluster");
  c->name = decl->name.name;
  Setting *dev = setting_get(&s, "device");
  if (!dev) {
    sema_error(S, decl->name.span, "cluster %s names no device", decl->name.name);
    diag_hint(S->diag, "add device = a100_80gb (or another device of docs/catalog.md)");
    return 0;
  }
  const char *dn = val_as_word(&dev->value);
  const CatDevice *d = cat_device(dn);
  if (!d) {
    sema_error(S, dev->setting->value->span, "unknown device '%s'", dn);
    const char *close = cat_closest_device(dn);
    if (close) diag_hint(S->diag, "did you mean %s?", normalize_name(S, close));
    else diag_hint(S->diag, "the devices are listed in docs/catalog.md");
    return 0;
  }
  c->device = d->name;
  c->gpus_per_node = get_int(&s, "gpus_per_node", 1);
  c->nodes = get_int(&s, "nodes", 1);
  c->nics_per_node = get_int(&s, "nics_per_node", 1);
  c->intra_bytes_per_s = get_float(&s, "intra_bandwidth", d->link_bytes_per_s);
  c->intra_latency_s = get_float(&s, "intra_latency", d->link_latency_s);
  c->inter_bytes_per_s = get_float(&s, "inter_bandwidth", 12.5e9);
  c->inter_latency_s = get_float(&s, "inter_latency", 5e-6);
  if (c->gpus_per_node < 1 || c->nodes < 1) {
    sema_error(S, decl->span, "a cluster has at least one node and one device per node");
    return 0;
  }
  return diag_error_count(S->diag) == before;
}

static int resolve_cluster(Sema *S, const char *name, Span at, SemCluster *out) {
  const AstDecl *d = find_decl(S, name, 1 << DECL_CLUSTER);
  if (!d) d = find_decl(S, normalize_name(S, name), 1 << DECL_CLUSTER);
  if (d) return read_cluster_decl(S, d, out);
  const CatCluster *c = cat_cluster(name);
  if (!c) {
    sema_error(S, at, "unknown cluster '%s'", name);
    const char *close = cat_closest_cluster(name);
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    else diag_hint(S->diag, "built-in clusters are listed in docs/catalog.md; a file can declare its own with `cluster name { ... }`");
    if (at.file < 0 && S->opts->cli_error) *S->opts->cli_error = 1;
    return 0;
  }
  out->name = c->name;
  out->device = c->device;
  out->gpus_per_node = c->gpus_per_node;
  out->nodes = 1;
  out->nics_per_node = c->nics_per_node;
  out->intra_bytes_per_s = c->intra_bytes_per_s;
  out->intra_latency_s = c->intra_latency_s;
  out->inter_bytes_per_s = c->nic_bytes_per_s;
  out->inter_latency_s = c->inter_latency_s;
  out->shared_device = c->shared_device;
  return 1;
}

/* ------------------------------------------------------------------ */
/* the parallel layout                                                 */

/* Where a layout number came from, for the other end of a mismatch. */
static void setting_note(Sema *S, Settings *s, const char *key, const char *flag) {
  Setting *x = setting_get(s, key);
  if (x && x->from_cli) diag_note(S->diag, span_none, "%s = %s comes from the command line (%s)", key, val_str(S->arena, &x->value), flag);
  else if (x) diag_note(S->diag, x->span, "%s set here", key);
}

static Span at_or_none(const Setting *x) { return x ? x->span : span_none; }

static void check_divisible(Sema *S, int64_t value, int64_t by, Span at, const char *what, const char *by_what,
                            const char *why, Settings *s, const char *key, const char *flag) {
  if (by <= 1 || value % by == 0) return;
  sema_error(S, at, "%s (%" PRId64 ") is not divisible by %s = %" PRId64, what, value, by_what, by);
  if (why) diag_hint(S->diag, "%s", why);
  setting_note(S, s, key, flag);
}

static void find_layers(const SemLayer *l, int64_t *layers, const SemChild **where) {
  for (int i = 0; i < l->nchildren; i++) {
    if (l->children[i].repeat > *layers) {
      *layers = l->children[i].repeat;
      *where = &l->children[i];
    }
    find_layers(l->children[i].layer, layers, where);
  }
}

static void read_layout(Sema *S, SemModel *m, const AstDecl *decl, Settings *ts) {
  Settings s;
  read_settings(S, decl ? &decl->settings : &(AstSettings){0, 0}, parallel_keys, NKEYS(parallel_keys), &s, "parallel");
  apply_cli(S, &s, "parallel", parallel_keys, NKEYS(parallel_keys));
  SemLayout *L = &m->layout;
  Setting *cl = setting_get(&s, "cluster");
  const char *cluster_name = cl ? val_as_word(&cl->value) : "cpu";
  if (resolve_cluster(S, cluster_name, cl ? (cl->from_cli ? span_none : cl->setting->value->span) : span_none, &m->cluster))
    m->has_cluster = 1;
  L->cluster_name = m->has_cluster ? m->cluster.name : cluster_name;
  L->gpus_per_node = get_int(&s, "gpus_per_node", m->has_cluster ? m->cluster.gpus_per_node : 1);
  L->nodes = get_int(&s, "nodes", m->has_cluster ? m->cluster.nodes : 1);
  L->gpus = get_int(&s, "gpus", L->nodes > 0 ? L->nodes * L->gpus_per_node : -1);
  if (setting_get(&s, "gpus") && !setting_get(&s, "nodes") && L->gpus > 0 && L->gpus_per_node > 0)
    L->nodes = (L->gpus + L->gpus_per_node - 1) / L->gpus_per_node;
  /* On a shared machine (CPU ranks) the layout decides the rank count. */
  if (m->has_cluster && m->cluster.shared_device && !setting_get(&s, "gpus") && !setting_get(&s, "nodes") &&
      !setting_get(&s, "gpus_per_node")) {
    int64_t prod = 1;
    const char *keys[] = {"data", "tensor", "pipeline", "context"};
    for (int k = 0; k < 4; k++) {
      int64_t v = get_int(&s, keys[k], 1);
      prod *= v > 0 ? v : 1;
    }
    L->gpus = L->gpus_per_node = prod;
  }
  L->tp = get_int(&s, "tensor", 1);
  L->pp = get_int(&s, "pipeline", 1);
  L->cp = get_int(&s, "context", 1);
  L->dp = get_int(&s, "data", -2); /* -2: not written, derive it */
  L->virtual_stages = get_int(&s, "virtual", 1);
  L->zero = get_int(&s, "zero", 0);
  L->sp = get_onoff(&s, "sequence", 0);
  L->overlap = get_onoff(&s, "overlap", 1);
  L->schedule = get_word(&s, "schedule", schedules, L->virtual_stages > 1 ? SCHED_INTERLEAVED : SCHED_1F1B);
  L->recompute = get_word(&s, "recompute", recomputes, RECOMPUTE_NONE);
  L->balance = (PipeBalance)get_word(&s, "balance", balances, BALANCE_COST);
  Setting *comp = setting_get(&s, "compression");
  L->compression = (Compression)get_word(&s, "compression", compressions, COMPRESS_NONE);
  L->topk_ratio = 0.01;
  if (comp && comp->value.kind == VAL_CALL && L->compression == COMPRESS_TOPK) {
    static const char *const keys[] = {"ratio", NULL};
    if (spec_check_keys(S, &comp->value, keys, 1)) spec_float(S, &comp->value, "ratio", 0, 0.01, &L->topk_ratio);
    if (!(L->topk_ratio > 0 && L->topk_ratio <= 1)) sema_error(S, comp->span, "topk's ratio must be in (0, 1]");
  }
  for (int i = 0; i < s.n; i++) {
    Setting *x = &s.items[i];
    if (x->value.kind == VAL_INT && x->value.i == 0 && x->spec->kind == K_INT && strcmp(x->spec->key, "zero") != 0) {
      sema_error(S, x->span, "'%s' must be at least 1", x->spec->key);
      if (x->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
      return;
    }
  }
  if (L->zero > 3) {
    Setting *z = setting_get(&s, "zero");
    sema_error(S, z->span, "ZeRO stage %" PRId64 " does not exist; stages are 0, 1, 2 and 3", L->zero);
    if (z->from_cli && S->opts->cli_error) *S->opts->cli_error = 1;
    return;
  }
  if (L->dp == -1 && L->gpus > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 && L->gpus % (L->tp * L->pp * L->cp) == 0)
    L->dp = L->gpus / (L->tp * L->pp * L->cp); /* data = auto: whatever the other degrees leave */
  if (L->dp == -2) {
    int64_t model_par = (L->tp > 0 ? L->tp : 1) * (L->pp > 0 ? L->pp : 1) * (L->cp > 0 ? L->cp : 1);
    L->dp = L->gpus > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 ? L->gpus / model_par : -1;
    if (L->dp == 0) {
      sema_error(S, decl ? decl->span : span_none,
                 "tensor x pipeline x context = %" PRId64 " needs more than the %" PRId64 " devices of the layout", model_par, L->gpus);
      return;
    }
  }
  /* The product of the degrees must use every device. */
  if (L->dp > 0 && L->tp > 0 && L->pp > 0 && L->cp > 0 && L->gpus > 0) {
    int64_t prod = L->dp * L->tp * L->pp * L->cp;
    if (prod != L->gpus) {
      static const char *const keys[] = {"data", "tensor", "pipeline", "context"};
      static const char *const flags[] = {"--dp", "--tp", "--pp", "--cp"};
      Span at = decl ? decl->span : span_none;
      for (int k = 3; k >= 0; k--) {
        Setting *x = setting_get(&s, keys[k]);
        if (x && !x->from_cli) at = x->span;
      }
      sema_error(S, at,
                 "data x tensor x pipeline x context = %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64 " = %" PRId64
                 " devices, but the layout has %" PRId64,
                 L->dp, L->tp, L->pp, L->cp, prod, L->gpus);
      diag_hint(S->diag, "leave data out (or write data = auto) to use every device");
      for (int k = 0; k < 4; k++) setting_note(S, &s, keys[k], flags[k]);
      if (setting_get(&s, "gpus")) setting_note(S, &s, "gpus", "--gpus");
      else
        diag_note(S->diag, span_none, "%" PRId64 " node%s x %" PRId64 " device%s per node on %s", L->nodes, L->nodes == 1 ? "" : "s",
                  L->gpus_per_node, L->gpus_per_node == 1 ? "" : "s", L->cluster_name);
    }
  }
  /* heads and kv_heads by tensor */
  if (L->tp > 1) {
    for (int i = 0; i < S->head_splits.len; i++) {
      HeadSplit *h = S->head_splits.items[i];
      int seen = 0;
      for (int k = 0; k < i; k++) seen |= ((HeadSplit *)S->head_splits.items[k])->heads == h->heads;
      if (seen || h->heads % L->tp == 0) continue;
      sema_error(S, h->span, "split_heads(..., %s): %" PRId64 " heads cannot be split over tensor parallelism %" PRId64, h->what,
                 h->heads, L->tp);
      diag_hint(S->diag, "tensor parallelism gives each rank whole heads; choose a tensor degree that divides %" PRId64, h->heads);
      setting_note(S, &s, "tensor", "--tp");
      for (int k = 0; k < h->nframes; k++)
        diag_note(S->diag, h->frames[k].call_site, "in %s, %s here", h->frames[k].display,
                  h->frames[k].is_call ? "called" : "instantiated");
    }
    /* One error per layer instance, in the order they were created. */
    PtrVec order = {0, 0, 0};
    for (SemLayer *l = S->instances; l; l = l->next_instance) ptrvec_push(S->arena, &order, l);
    for (int k = order.len - 1; k >= 0; k--) {
      SemLayer *l = order.items[k];
      for (int i = 0; i < l->nparams; i++) {
        SemParam *p = &l->params[i];
        if (p->shard == SHARD_REPLICATED || p->type.rank == 0) continue;
        int axis = p->shard == SHARD_COLUMN ? p->type.rank - 1 : 0;
        int64_t d = 0;
        sym_is_const(p->type.dims[axis], &d);
        if (d % L->tp == 0) continue;
        LayerBox *box = (LayerBox *)l;
        sema_error(S, box->site.file >= 0 ? box->site : p->span,
                   "%s is split by %s over tensor parallelism %" PRId64 ", but its '%s' has %" PRId64 " %s, not a multiple of %" PRId64,
                   l->display, sem_shard_name(p->shard), L->tp, p->name, d,
                   p->shard == SHARD_VOCAB ? "rows (the vocabulary)" : p->shard == SHARD_ROW ? "rows" : "columns", L->tp);
        if (p->shard == SHARD_VOCAB) {
          int64_t pad = ((d + 128 * L->tp - 1) / (128 * L->tp)) * 128 * L->tp;
          diag_hint(S->diag, "pad the vocabulary to a multiple of 128 x tensor, e.g. %" PRId64 " (as Megatron-LM does)", pad);
        }
        diag_note(S->diag, p->span, "'%s' declared here", p->name);
        setting_note(S, &s, "tensor", "--tp");
        for (int f = 1; f < box->nchain; f++)
          diag_note(S->diag, box->chain[f].call_site, "in %s, %s here", box->chain[f].display,
                    box->chain[f].is_call ? "called" : "instantiated");
        break;
      }
    }
  }
  /* layers by pipeline x virtual stages */
  const SemChild *rep = NULL;
  int64_t layers = 0;
  find_layers(m->model, &layers, &rep);
  m->layers = layers;
  int64_t stages = (L->pp > 0 ? L->pp : 1) * (L->virtual_stages > 0 ? L->virtual_stages : 1);
  if (stages > 1) {
    if (!rep) {
      sema_error(S, m->model->decl->name.span, "pipeline parallelism splits repeated blocks, and %s has no `repeat`",
                 m->model->decl->name.name);
      setting_note(S, &s, "pipeline", "--pp");
    } else if (layers < stages) {
      sema_error(S, rep->span, "%" PRId64 " layers cannot be split into pipeline x virtual = %" PRId64 " x %" PRId64
                 " stages of at least one layer each", layers, L->pp > 0 ? L->pp : 1, L->virtual_stages > 0 ? L->virtual_stages : 1);
      setting_note(S, &s, "pipeline", "--pp");
      if (L->virtual_stages > 1) setting_note(S, &s, "virtual", "--virtual-stages");
    } else if (L->balance == BALANCE_LAYERS && layers % stages != 0) {
      sema_error(S, rep->span, "%" PRId64 " layers cannot be split equally into pipeline x virtual = %" PRId64 " x %" PRId64 " stages",
                 layers, L->pp > 0 ? L->pp : 1, L->virtual_stages > 0 ? L->virtual_stages : 1);
      diag_hint(S->diag, "balance = cost (the default) gives the stages unequal layer counts");
      setting_note(S, &s, "balance", "--balance");
      setting_note(S, &s, "pipeline", "--pp");
      if (L->virtual_stages > 1) setting_note(S, &s, "virtual", "--virtual-stages");
    }
  }
  if (L->virtual_stages > 1 && L->schedule >= 0 && L->schedule != SCHED_INTERLEAVED) {
    sema_error(S, setting_get(&s, "virtual")->span, "virtual stages need schedule = interleaved, not %s",
               sem_schedule_name((Schedule)L->schedule));
  }
  if (L->schedule == SCHED_INTERLEAVED && L->virtual_stages == 1) {
    Setting *x = setting_get(&s, "schedule");
    sema_error(S, x ? x->span : span_none, "the interleaved schedule needs virtual stages: add virtual = 2 (or more)");
  }
  /* global batch by data x micro batch */
  SemTrain *t = &m->train;
  if (t->global_batch == 0) t->global_batch = (L->dp > 0 ? L->dp : 1) * t->micro_batch;
  if (L->dp > 0 && t->micro_batch > 0 && t->global_batch > 0) {
    int64_t per_step = L->dp * t->micro_batch;
    if (t->global_batch % per_step != 0) {
      Setting *b = setting_get(ts, "batch");
      sema_error(S, b ? b->span : span_none,
                 "the global batch (%" PRId64 ") is not divisible by data x micro_batch = %" PRId64 " x %" PRId64 " = %" PRId64,
                 t->global_batch, L->dp, t->micro_batch, per_step);
      int64_t lo = t->global_batch / per_step * per_step, hi = lo + per_step;
      if (lo > 0) diag_hint(S->diag, "a step runs whole micro-batches on every data rank: try batch = %" PRId64 " or %" PRId64, lo, hi);
      else diag_hint(S->diag, "a step runs whole micro-batches on every data rank: try batch = %" PRId64, hi);
      setting_note(S, ts, "micro_batch", "--micro-batch");
      setting_note(S, &s, "data", "--dp");
    } else {
      L->num_micro_batches = t->global_batch / per_step;
      if (L->schedule == SCHED_INTERLEAVED && L->pp > 1 && L->num_micro_batches % L->pp != 0) {
        sema_error(S, at_or_none(setting_get(&s, "schedule")),
                   "the interleaved schedule needs the micro-batches per step (%" PRId64 ") divisible by pipeline = %" PRId64,
                   L->num_micro_batches, L->pp);
      }
      if (L->pp > 1 && L->num_micro_batches < L->pp)
        diag_warning(S->diag, at_or_none(setting_get(&s, "pipeline")),
                     "%" PRId64 " micro-batch%s per step for %" PRId64 " pipeline stages: most of each step is bubble",
                     L->num_micro_batches, L->num_micro_batches == 1 ? "" : "es", L->pp);
    }
  }
  /* sequence by context and sequence parallelism */
  if (m->seq_len > 0) {
    Span at = m->model->ninputs ? m->model->inputs[0].span : span_none;
    if (L->cp > 1)
      check_divisible(S, m->seq_len, 2 * L->cp, at, "the sequence length", "2 x context",
                      "ring attention gives each context rank two chunks, one early and one late, to balance causal work", &s,
                      "context", "--cp");
    if (L->sp == 1 && L->tp > 1) {
      int64_t before = diag_error_count(S->diag);
      check_divisible(S, m->seq_len, L->tp, at, "the sequence length", "tensor",
                      "sequence parallelism splits the sequence over the tensor ranks", &s, "tensor", "--tp");
      if (diag_error_count(S->diag) != before) setting_note(S, &s, "sequence", "--sp");
    }
  }
  if (!m->cluster.shared_device && L->tp > 0 && L->gpus_per_node > 0 && L->tp > L->gpus_per_node)
    diag_warning(S->diag, at_or_none(setting_get(&s, "tensor")),
                 "tensor parallelism %" PRId64 " spans nodes (%" PRId64 " devices per node): its all-reduces cross the network",
                 L->tp, L->gpus_per_node);
}

/* ------------------------------------------------------------------ */
/* entry                                                               */

static int decl_group(AstDeclKind k) {
  return k == DECL_LAYER || k == DECL_MODEL || k == DECL_EXTERN ? 1 : k == DECL_CLUSTER ? 2 : 0;
}

/* Fills the declaration maps; a name declared twice is an error. */
static void index_declarations(Sema *S) {
  for (int f = 0; f < S->prog->nfiles; f++) {
    const AstFile *file = S->prog->files[f];
    for (int i = 0; i < file->ndecls; i++) {
      AstDecl *d = file->decls[i];
      int g = decl_group(d->kind);
      if (!g) continue;
      StrMap *map = g == 2 ? &S->clusters : &S->callables;
      const AstDecl *first = strmap_put(S->arena, map, d->name.name, d);
      if (first != d) {
        sema_error(S, d->name.span, "'%s' is declared twice", d->name.name);
        diag_note(S->diag, first->name.span, "first declared here");
      }
    }
  }
}

static const AstDecl *unique_block(Sema *S, AstDeclKind kind) {
  const AstDecl *found = NULL;
  for (int f = 0; f < S->prog->nfiles; f++) {
    const AstFile *file = S->prog->files[f];
    for (int i = 0; i < file->ndecls; i++) {
      const AstDecl *d = file->decls[i];
      if (d->kind != kind) continue;
      if (f > 0) {
        sema_error(S, d->span, "a %s block belongs in the file that declares the model, not in an imported module",
                   ast_decl_kind_name(kind));
        continue;
      }
      if (found) {
        sema_error(S, d->span, "a second %s block", ast_decl_kind_name(kind));
        diag_note(S->diag, found->span, "the first is here");
        continue;
      }
      found = d;
    }
  }
  return found;
}

static const AstDecl *pick_model(Sema *S) {
  const AstFile *root = S->prog->files[0];
  const AstDecl *found = NULL;
  int count = 0;
  for (int i = 0; i < root->ndecls; i++) {
    const AstDecl *d = root->decls[i];
    if (d->kind != DECL_MODEL) continue;
    if (S->opts->model_name && strcmp(S->opts->model_name, d->name.name) != 0) continue;
    if (!found) found = d;
    count++;
  }
  if (S->opts->model_name && !found) {
    sema_error(S, span_none, "%s declares no model '%s'", root->path, S->opts->model_name);
    if (S->opts->cli_error) *S->opts->cli_error = 1;
    return NULL;
  }
  if (count > 1) {
    sema_error(S, span_none, "%s declares %d models; choose one with --model NAME", root->path, count);
    if (S->opts->cli_error) *S->opts->cli_error = 1;
    return NULL;
  }
  return found;
}

/* The model's arguments: defaults, with -D overrides in their place. */
static SemLayer *instantiate_model(Sema *S, const AstDecl *decl) {
  if (!check_param_types(S, decl)) return NULL;
  int n = decl->nparams;
  for (int i = 0; i < S->opts->ndefines; i++) {
    int known = 0;
    for (int k = 0; k < n; k++) known |= !strcmp(decl->params[k].name.name, S->opts->defines[i].name);
    if (!known) {
      sema_error(S, span_none, "-D %s: model %s has no parameter '%s'", S->opts->defines[i].name, decl->name.name,
                 S->opts->defines[i].name);
      const char **names = arena_alloc(S->arena, sizeof(char *) * (size_t)(n + 1));
      for (int k = 0; k < n; k++) names[k] = decl->params[k].name.name;
      const char *close = diag_closest(S->opts->defines[i].name, names, n);
      if (close) diag_hint(S->diag, "did you mean '%s'?", close);
      else if (n) diag_hint(S->diag, "its parameters are %s", words_list(S, (const char *const *)names));
      if (S->opts->cli_error) *S->opts->cli_error = 1;
    }
  }
  if (diag_error_count(S->diag)) return NULL;
  Value *vals = arena_alloc(S->arena, sizeof(Value) * (size_t)(n + 1));
  Binding *env = NULL;
  int ok = 1;
  for (int k = 0; k < n; k++) {
    const AstParam *p = &decl->params[k];
    const char *over = NULL;
    for (int i = 0; i < S->opts->ndefines; i++)
      if (!strcmp(S->opts->defines[i].name, p->name.name)) over = S->opts->defines[i].value;
    if (over) {
      vals[k] = val_parse_literal(S->arena, over);
      /* The override takes the parameter's type: declared, or that of its default. */
      const char *want = p->type_name;
      Value dflt = none_value(span_none);
      if (p->default_value) dflt = eval_const(S, env, p->default_value);
      if (!want && dflt.kind != VAL_NONE) want = type_name_of(&dflt);
      Value *v = &vals[k];
      int fits = !want || (!strcmp(want, "int") && v->kind == VAL_INT) ||
                 (!strcmp(want, "float") && (v->kind == VAL_FLOAT || v->kind == VAL_INT)) ||
                 (!strcmp(want, "bool") && v->kind == VAL_BOOL) ||
                 (!strcmp(want, "string") && (v->kind == VAL_STRING || v->kind == VAL_ATOM));
      if (!fits) {
        if (dflt.kind != VAL_NONE)
          sema_error(S, span_none, "-D %s=%s: '%s' is %s %s (default %s)", p->name.name, over, p->name.name,
                     !strcmp(want, "int") ? "an" : "a", want, val_str(S->arena, &dflt));
        else
          sema_error(S, span_none, "-D %s=%s: '%s' is %s %s", p->name.name, over, p->name.name, !strcmp(want, "int") ? "an" : "a", want);
        ok = 0;
        if (S->opts->cli_error) *S->opts->cli_error = 1;
      } else if (!strcmp(want ? want : "", "float") && v->kind == VAL_INT) {
        v->kind = VAL_FLOAT;
        v->f = (double)v->i;
      }
    } else if (p->default_value) {
      vals[k] = eval_const(S, env, p->default_value);
      if (vals[k].kind == VAL_NONE || !coerce_param(S, p, &vals[k], env, p->default_value->span)) ok = 0;
    } else {
      sema_error(S, p->name.span, "model parameter '%s' has no default; give one, or pass -D %s=VALUE", p->name.name, p->name.name);
      ok = 0;
    }
    Binding *b = bind(S, &env, p->name.name, B_VALUE, p->name.span);
    b->value = vals[k];
  }
  if (!ok) return NULL;
  return instantiate_with(S, decl, vals, env, span_none);
}

static int count_items(const AstBlock *b) {
  int n = b->n;
  for (int i = 0; i < b->n; i++) {
    const AstStmt *st = b->items[i];
    if (st->kind == ST_IF) n += count_items(&st->u.if_.then) + count_items(&st->u.if_.otherwise);
    if (st->kind == ST_FORWARD) n += count_items(&st->u.forward.body);
    if (n > SEMA_MAX_ITEMS) break;
  }
  return n;
}

/* Layers no model reaches still get their declarations checked. */
static void check_unused_decls(Sema *S) {
  for (int f = 0; f < S->prog->nfiles; f++) {
    const AstFile *file = S->prog->files[f];
    for (int i = 0; i < file->ndecls; i++) {
      const AstDecl *d = file->decls[i];
      if (d->kind == DECL_LAYER || d->kind == DECL_MODEL || d->kind == DECL_EXTERN) check_param_types(S, d);
      if ((d->kind == DECL_LAYER || d->kind == DECL_MODEL) && count_items(&d->body) > SEMA_MAX_ITEMS) {
        sema_error(S, d->name.span, "%s has more than %d items and statements; the limit is %d", d->name.name, SEMA_MAX_ITEMS,
                   SEMA_MAX_ITEMS);
        diag_hint(S->diag, "split it into layers");
        strmap_put(S->arena, &S->param_check, d->name.name, (void *)S); /* never instantiate it */
      }
      if (d->kind == DECL_EXTERN) {
        Settings s;
        read_settings(S, &d->settings, extern_keys, NKEYS(extern_keys), &s, "extern");
        if (!setting_get(&s, "library"))
          sema_error(S, d->name.span, "extern %s names no library: add library = \"libname.so\"", d->name.name);
        if (!setting_get(&s, "symbol"))
          sema_error(S, d->name.span, "extern %s names no symbol: add symbol = \"function_name\"", d->name.name);
      }
      if (d->kind == DECL_CLUSTER && f == 0) {
        SemCluster c;
        read_cluster_decl(S, d, &c);
      }
    }
  }
}

static SemModel *check_program(Sema *S);

SemModel *sema_check(Arena *arena, Diag *diag, const LoadedProgram *prog, const SemOptions *opts) {
  if (!prog->nfiles) return NULL;
  SemOptions none;
  memset(&none, 0, sizeof none);
  Sema S;
  memset(&S, 0, sizeof S);
  S.arena = arena;
  S.diag = diag;
  S.prog = prog;
  S.opts = opts ? opts : &none;
  SemModel *m = check_program(&S);
  flush_frame_notes(&S);
  return m;
}

/* The train and parallel blocks are read even when the model has errors, so
 * one run reports the mistakes of every block. */
static void check_blocks_only(Sema *S, SemModel *m, const AstDecl *train, const AstDecl *parallel) {
  Settings ts, ps;
  read_train(S, m, train, &ts);
  read_settings(S, parallel ? &parallel->settings : &(AstSettings){0, 0}, parallel_keys, NKEYS(parallel_keys), &ps, "parallel");
  apply_cli(S, &ps, "parallel", parallel_keys, NKEYS(parallel_keys));
}

static SemModel *check_program(Sema *S) {
  Diag *diag = S->diag;
  Arena *arena = S->arena;
  const LoadedProgram *prog = S->prog;
  index_declarations(S);
  check_unused_decls(S);
  const AstDecl *train = unique_block(S, DECL_TRAIN);
  const AstDecl *parallel = unique_block(S, DECL_PARALLEL);
  const AstDecl *model_decl = pick_model(S);
  SemModel *m = arena_alloc(arena, sizeof *m);
  m->train_decl = train;
  m->parallel_decl = parallel;
  if (!model_decl) {
    if (!diag_error_count(diag) && S->opts->ndefines) {
      sema_error(S, span_none, "-D given, but %s declares no model", prog->files[0]->path);
      if (S->opts->cli_error) *S->opts->cli_error = 1;
    }
    if (train || parallel) check_blocks_only(S, m, train, parallel);
    return NULL;
  }
  if (!diag_error_count(diag)) m->model = instantiate_model(S, model_decl);
  if (m->model && m->model->ninputs == 0) {
    sema_error(S, model_decl->name.span, "model %s declares no input", model_decl->name.name);
    diag_hint(diag, "add e.g. input tokens : i32[B, T]");
    m->model = NULL;
  }
  if (m->model) m->forward = check_forward(S, m->model, NULL, 0, span_none);
  if (!m->model || !m->forward) {
    check_blocks_only(S, m, train, parallel);
    return NULL;
  }
  const SemInput *in0 = &m->model->inputs[0];
  if (in0->type.rank >= 2) sym_is_const(in0->type.dims[1], &m->seq_len);
  Settings train_settings;
  read_train(S, m, train, &train_settings);
  read_layout(S, m, parallel, &train_settings);
  return diag_error_count(diag) ? NULL : m;
}

int64_t sem_param_count(const SemModel *m) { return m->model ? m->model->param_count : 0; }
