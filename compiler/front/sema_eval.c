/* sema_eval.c - compile-time evaluation: the constant expressions of
 * parameters, arguments and settings (numbers, bools, strings, tuples and
 * lists, and scalar functions such as sqrt and min), with integer overflow,
 * division by zero and operands of the wrong kind reported where they are. */
#include "sema_internal.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* compile-time evaluation                                             */

int sema_checked_add(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }
static int checked_sub(int64_t a, int64_t b, int64_t *r) { return !__builtin_sub_overflow(a, b, r); }
int sema_checked_mul(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }

static int is_number(const Value *v) { return v->kind == VAL_INT || v->kind == VAL_FLOAT; }

/* An unknown word where a number was wanted is most often a typo of a name. */
void sema_hint_for_word(Sema *S, Binding *env, const Value *v) {
  if (v->kind != VAL_ATOM) return;
  const char *close = sema_suggest(S, env, v->s, 0);
  if (close) diag_hint(S->diag, "did you mean '%s'?", close);
}


static Value eval_binary(Sema *S, Binding *env, const AstExpr *e) {
  Value x = sema_eval_const(S, env, e->u.op.a);
  if (e->u.op.op == OP_AND || e->u.op.op == OP_OR) {
    Value y = sema_eval_const(S, env, e->u.op.b);
    if (x.kind == VAL_NONE || y.kind == VAL_NONE) return sema_none_value(e->span);
    if (x.kind != VAL_BOOL || y.kind != VAL_BOOL) {
      sema_error(S, e->u.op.op_span, "'%s' needs two bools, not %s and %s", ast_op_text(e->u.op.op),
                 val_kind_name(x.kind), val_kind_name(y.kind));
      return sema_none_value(e->span);
    }
    return sema_bool_value(e->u.op.op == OP_AND ? x.b && y.b : x.b || y.b, e->span);
  }
  Value y = sema_eval_const(S, env, e->u.op.b);
  if (x.kind == VAL_NONE || y.kind == VAL_NONE) return sema_none_value(e->span);
  AstOp op = e->u.op.op;
  if (op == OP_EQ || op == OP_NE) {
    int eq = val_equal(&x, &y);
    if ((x.kind == VAL_STRING || x.kind == VAL_ATOM) && (y.kind == VAL_STRING || y.kind == VAL_ATOM))
      eq = strcmp(x.s, y.s) == 0;
    return sema_bool_value(op == OP_EQ ? eq : !eq, e->span);
  }
  if (!is_number(&x) || !is_number(&y)) {
    const Value *bad = is_number(&x) ? &y : &x;
    sema_error(S, bad->span.file >= 0 ? bad->span : e->span, "'%s' needs numbers; this is %s %s",
               ast_op_text(op), bad->kind == VAL_ATOM ? "the unknown name" : val_kind_name(bad->kind),
               val_str(S->arena, bad));
    sema_hint_for_word(S, env, bad);
    return sema_none_value(e->span);
  }
  if (op == OP_MATMUL) {
    sema_error(S, e->u.op.op_span, "'@' multiplies tensors; here both sides are numbers");
    return sema_none_value(e->span);
  }
  if (x.kind == VAL_INT && y.kind == VAL_INT) {
    int64_t r = 0;
    int ok = 1;
    switch (op) {
    case OP_ADD: ok = sema_checked_add(x.i, y.i, &r); break;
    case OP_SUB: ok = checked_sub(x.i, y.i, &r); break;
    case OP_MUL: ok = sema_checked_mul(x.i, y.i, &r); break;
    case OP_DIV:
    case OP_MOD:
      if (y.i == 0) {
        sema_error(S, e->u.op.b->span, "division by zero");
        return sema_none_value(e->span);
      }
      if (x.i == INT64_MIN && y.i == -1) { ok = 0; break; }
      if (op == OP_DIV && x.i % y.i != 0) {
        sema_error(S, e->u.op.op_span, "%s is %" PRId64 " / %" PRId64 ", not a whole number", sema_expr_text(S, e), x.i, y.i);
        diag_hint(S->diag, "integer '/' must divide exactly: choose sizes where %s divides %s (or write %" PRId64 ".0 / %" PRId64
                  " for a float)", sema_expr_text(S, e->u.op.b), sema_expr_text(S, e->u.op.a), x.i, y.i);
        return sema_none_value(e->span);
      }
      r = op == OP_DIV ? x.i / y.i : x.i % y.i;
      break;
    case OP_POW: {
      if (y.i < 0) return sema_float_value(pow((double)x.i, (double)y.i), e->span);
      r = 1;
      for (int64_t k = 0; k < y.i && ok; k++) ok = sema_checked_mul(r, x.i, &r);
      break;
    }
    case OP_LT: return sema_bool_value(x.i < y.i, e->span);
    case OP_LE: return sema_bool_value(x.i <= y.i, e->span);
    case OP_GT: return sema_bool_value(x.i > y.i, e->span);
    case OP_GE: return sema_bool_value(x.i >= y.i, e->span);
    default: break;
    }
    if (!ok) {
      sema_error(S, e->span, "integer overflow in %s %s %s", val_str(S->arena, &x), ast_op_text(op),
                 val_str(S->arena, &y));
      return sema_none_value(e->span);
    }
    return sema_int_value(r, e->span);
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
      return sema_none_value(e->span);
    }
    r = a / b;
    break;
  case OP_MOD:
    if (b == 0) {
      sema_error(S, e->u.op.b->span, "division by zero");
      return sema_none_value(e->span);
    }
    r = fmod(a, b);
    break;
  case OP_POW: r = pow(a, b); break;
  case OP_LT: return sema_bool_value(a < b, e->span);
  case OP_LE: return sema_bool_value(a <= b, e->span);
  case OP_GT: return sema_bool_value(a > b, e->span);
  case OP_GE: return sema_bool_value(a >= b, e->span);
  default: break;
  }
  if (!isfinite(r)) {
    sema_error(S, e->span, "the value of this expression is not a finite number");
    return sema_none_value(e->span);
  }
  return sema_float_value(r, e->span);
}

/* Scalar functions usable in parameter and constant expressions. */
static Value eval_scalar_call(Sema *S, Binding *env, const AstExpr *e, const char *fn, int *handled) {
  static const char *const unary[] = {"sqrt", "exp", "log", "abs", "int", "float"};
  *handled = 0;
  int which = -1;
  for (int k = 0; k < 6; k++)
    if (!strcmp(fn, unary[k])) which = k;
  int is_minmax = !strcmp(fn, "min") || !strcmp(fn, "max");
  if (which < 0 && !is_minmax) return sema_none_value(e->span);
  *handled = 1;
  int want = is_minmax ? 2 : 1;
  if (e->u.call.nargs != want) {
    sema_error(S, e->span, "%s() takes %d argument%s here, not %d", fn, want, want == 1 ? "" : "s",
               e->u.call.nargs);
    return sema_none_value(e->span);
  }
  Value x = sema_eval_const(S, env, e->u.call.args[0].value);
  Value y = is_minmax ? sema_eval_const(S, env, e->u.call.args[1].value) : x;
  if (x.kind == VAL_NONE || y.kind == VAL_NONE) return sema_none_value(e->span);
  if (!is_number(&x) || !is_number(&y)) {
    sema_error(S, e->span, "%s() needs numbers", fn);
    return sema_none_value(e->span);
  }
  double a, b;
  val_as_float(&x, &a);
  val_as_float(&y, &b);
  if (is_minmax) {
    if (x.kind == VAL_INT && y.kind == VAL_INT)
      return sema_int_value(!strcmp(fn, "min") ? (x.i < y.i ? x.i : y.i) : (x.i > y.i ? x.i : y.i), e->span);
    return sema_float_value(!strcmp(fn, "min") ? fmin(a, b) : fmax(a, b), e->span);
  }
  switch (which) {
  case 0:
    if (a < 0) {
      sema_error(S, e->span, "sqrt of a negative number (%g)", a);
      return sema_none_value(e->span);
    }
    return sema_float_value(sqrt(a), e->span);
  case 1: return sema_float_value(exp(a), e->span);
  case 2:
    if (a <= 0) {
      sema_error(S, e->span, "log of a number that is not positive (%g)", a);
      return sema_none_value(e->span);
    }
    return sema_float_value(log(a), e->span);
  case 3: return x.kind == VAL_INT ? sema_int_value(x.i < 0 ? -x.i : x.i, e->span) : sema_float_value(fabs(a), e->span);
  case 4:
    if (!(fabs(a) < 9.0e18)) {
      sema_error(S, e->span, "int() of a number out of range");
      return sema_none_value(e->span);
    }
    return sema_int_value((int64_t)a, e->span);
  default: return sema_float_value(a, e->span);
  }
}

Value sema_eval_const(Sema *S, Binding *env, const AstExpr *e) {
  switch (e->kind) {
  case EX_INT: return sema_int_value(e->u.ival, e->span);
  case EX_FLOAT: {
    Value v = sema_float_value(e->u.fval.value, e->span);
    v.unit = e->u.fval.unit;
    return v;
  }
  case EX_BOOL: return sema_bool_value(e->u.bval, e->span);
  case EX_STRING: {
    Value v = sema_none_value(e->span);
    v.kind = VAL_STRING;
    v.s = e->u.sval;
    return v;
  }
  case EX_NAME: {
    Binding *b = sema_lookup(env, e->u.sval);
    if (b && b->kind == B_VALUE) {
      Value v = b->value; /* VAL_NONE when it failed: reported already */
      v.span = e->span;
      return v;
    }
    if (b) {
      sema_error(S, e->span, "'%s' is a %s, not a value known at compile time", e->u.sval,
                 b->kind == B_CHILD ? "sub-layer" : "tensor");
      return sema_none_value(e->span);
    }
    /* A bare word: an atom such as gelu, column, auto, 1f1b. */
    Value v = sema_none_value(e->span);
    v.kind = VAL_ATOM;
    v.s = e->u.sval;
    return v;
  }
  case EX_UNARY: {
    Value x = sema_eval_const(S, env, e->u.op.a);
    if (x.kind == VAL_NONE) return x;
    if (e->u.op.op == OP_NOT) {
      if (x.kind != VAL_BOOL) {
        sema_error(S, e->span, "'not' needs a bool, not %s", val_kind_name(x.kind));
        return sema_none_value(e->span);
      }
      return sema_bool_value(!x.b, e->span);
    }
    if (x.kind == VAL_INT) {
      if (x.i == INT64_MIN) {
        sema_error(S, e->span, "integer overflow in negation");
        return sema_none_value(e->span);
      }
      return sema_int_value(-x.i, e->span);
    }
    if (x.kind == VAL_FLOAT) {
      Value v = sema_float_value(-x.f, e->span);
      v.unit = x.unit;
      return v;
    }
    sema_error(S, e->span, "'-' needs a number, not %s %s", val_kind_name(x.kind), val_str(S->arena, &x));
    sema_hint_for_word(S, env, &x);
    return sema_none_value(e->span);
  }
  case EX_BINARY: return eval_binary(S, env, e);
  case EX_TUPLE:
  case EX_LIST: {
    Value v = sema_none_value(e->span);
    v.kind = e->kind == EX_TUPLE ? VAL_TUPLE : VAL_LIST;
    v.n = e->u.list.nitems;
    v.items = arena_alloc(S->arena, sizeof(Value) * (size_t)(v.n + 1));
    for (int i = 0; i < v.n; i++) {
      v.items[i] = sema_eval_const(S, env, e->u.list.items[i]);
      if (v.items[i].kind == VAL_NONE) return sema_none_value(e->span);
    }
    return v;
  }
  case EX_CALL: {
    if (e->u.call.callee->kind != EX_NAME) {
      sema_error(S, e->u.call.callee->span, "only named functions can be called here");
      return sema_none_value(e->span);
    }
    const char *fn = e->u.call.callee->u.sval;
    int handled;
    Value r = eval_scalar_call(S, env, e, fn, &handled);
    if (handled) return r;
    /* Anything else is a spec (normal(0, 0.02), adamw(lr = ...)), read by its user. */
    Value v = sema_none_value(e->span);
    v.kind = VAL_CALL;
    v.s = fn;
    v.n = e->u.call.nargs;
    v.items = arena_alloc(S->arena, sizeof(Value) * (size_t)(v.n + 1));
    v.keys = arena_alloc(S->arena, sizeof(char *) * (size_t)(v.n + 1));
    for (int i = 0; i < v.n; i++) {
      v.items[i] = sema_eval_const(S, env, e->u.call.args[i].value);
      v.keys[i] = e->u.call.args[i].name;
      if (v.items[i].kind == VAL_NONE) return sema_none_value(e->span);
    }
    return v;
  }
  case EX_INDEX: {
    /* an item of a compile-time list or tuple: layers[0], layers[-1] */
    Value obj = sema_eval_const(S, env, e->u.index.obj);
    if (obj.kind == VAL_NONE) return obj;
    if (obj.kind != VAL_LIST && obj.kind != VAL_TUPLE) {
      sema_error(S, e->span, "only a list or a tuple can be indexed here; this is %s", val_str(S->arena, &obj));
      return sema_none_value(e->span);
    }
    int64_t i;
    if (e->u.index.nitems != 1 || e->u.index.items[0]->kind == EX_SLICE) {
      sema_error(S, e->span, "a list is indexed by one integer: %s[0]", val_str(S->arena, &obj));
      return sema_none_value(e->span);
    }
    if (!sema_eval_int(S, env, e->u.index.items[0], "a list index", &i)) return sema_none_value(e->span);
    if (i < -obj.n || i >= obj.n) {
      sema_error(S, e->u.index.items[0]->span, "index %" PRId64 " is out of range for %s (%d items)", i,
                 val_str(S->arena, &obj), obj.n);
      return sema_none_value(e->span);
    }
    return obj.items[i < 0 ? i + obj.n : i];
  }
  case EX_MEMBER:
  case EX_SLICE:
  case EX_REPEAT:
    sema_error(S, e->span, "this is not a value known at compile time");
    return sema_none_value(e->span);
  }
  return sema_none_value(e->span);
}

/* Evaluates to an int or reports what it got. */
int sema_eval_int(Sema *S, Binding *env, const AstExpr *e, const char *what, int64_t *out) {
  Value v = sema_eval_const(S, env, e);
  if (v.kind == VAL_NONE) return 0;
  if (v.kind == VAL_INT) {
    *out = v.i;
    return 1;
  }
  sema_error(S, e->span, "%s must be an integer, not %s %s", what,
             v.kind == VAL_ATOM ? "the unknown name" : val_kind_name(v.kind), val_str(S->arena, &v));
  sema_hint_for_word(S, env, &v);
  return 0;
}
