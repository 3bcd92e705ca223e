/* sema_layer.c - layer instantiation: a declaration called with concrete
 * argument values is elaborated into a SemLayer (parameters, children,
 * parameter tensors, inputs); instances with equal arguments are shared, and
 * the instantiation chain is kept for the notes of later errors. */
#include "sema_internal.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* layer instantiation                                                 */

static SemLayer *instantiate(Sema *S, const AstDecl *decl, Binding *caller_env, const AstExpr *call,
                             Span site);

const char *sema_type_name_of(const Value *v) {
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
int sema_coerce_param(Sema *S, const AstParam *p, Value *v, Binding *env, Span at) {
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
               sema_type_name_of(v), val_str(S->arena, v));
  sema_hint_for_word(S, env, v);
  diag_note(S->diag, p->name.span, "'%s' declared here", p->name.name);
  return 0;
}

static const char *const scalar_types[] = {"int", "float", "bool", "string"};

static int check_param_types_once(Sema *S, const AstDecl *decl);

/* Checks a declaration's parameter list once; later calls return the verdict. */
int sema_check_param_types(Sema *S, const AstDecl *decl) {
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
    vals[slot] = sema_eval_const(S, caller_env, arg->value);
    if (vals[slot].kind == VAL_NONE) ok = 0;
    else if (!sema_coerce_param(S, &decl->params[slot], &vals[slot], caller_env, arg->value->span)) ok = 0;
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
      vals[k] = sema_eval_const(S, env, p->default_value);
      if (vals[k].kind == VAL_NONE) {
        ok = 0;
        continue;
      }
      if (!sema_coerce_param(S, p, &vals[k], env, p->default_value->span)) ok = 0;
    }
    Binding *b = sema_bind(S, &env, p->name.name, B_VALUE, p->name.span);
    b->value = vals[k];
  }
  *param_env = env;
  return ok ? vals : NULL;
}

int sema_parse_dtype(Sema *S, const AstType *t, DType *out) {
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
  Value v = sema_eval_const(S, env, e);
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
  static const char *const kinds[] = {"replicated", "column", "row", "vocab", "expert_column", "expert_row"};
  *out = SHARD_REPLICATED;
  if (!e) return 1;
  Value v = sema_eval_const(S, env, e);
  if (v.kind == VAL_NONE) return 0;
  const char *w = val_as_word(&v);
  for (int k = 0; w && k < 6; k++)
    if (!strcmp(kinds[k], w)) {
      *out = (ShardKind)k;
      return 1;
    }
  sema_error(S, e->span, "unknown sharding '%s'; it is column, row, vocab, expert_column, expert_row or replicated",
               w ? w : val_str(S->arena, &v));
  const char *close = w ? diag_closest(w, kinds, 6) : NULL;
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
    if (!sema_eval_int(S, box->env, v->u.repeat.count, "the repeat count", &repeat)) return NULL;
    if (repeat < 1) {
      sema_error(S, v->u.repeat.count->span, "the repeat count must be at least 1, not %" PRId64, repeat);
      return NULL;
    }
    if (repeat > SEM_MAX_REPEAT) {
      sema_error(S, v->u.repeat.count->span, "the repeat count %" PRId64 " is more than %" PRId64 " layers", repeat,
                 SEM_MAX_REPEAT);
      diag_hint(S->diag, "published models have at most a few hundred layers; is a size given for the layer count?");
      return NULL;
    }
    call = v->u.repeat.call;
    if (call->kind != EX_CALL || call->u.call.callee->kind != EX_NAME) {
      sema_error(S, call->span, "repeat needs a layer instantiation: repeat N Layer(args)");
      return NULL;
    }
  }
  const char *lname = call->u.call.callee->u.sval;
  const AstDecl *decl = sema_find_decl(S, lname, (1 << DECL_LAYER) | (1 << DECL_MODEL));
  if (!decl) {
    sema_error(S, call->u.call.callee->span, "unknown layer '%s'", lname);
    const char *close = sema_suggest_decl(S, lname, (1 << DECL_LAYER));
    if (close) diag_hint(S->diag, "did you mean '%s'?", close);
    else diag_hint(S->diag, "is an import missing? the standard layers come with import \"std/nn\"");
    return NULL;
  }
  if (decl->kind == DECL_MODEL) {
    sema_error(S, call->u.call.callee->span, "'%s' is a model; only layers can be used inside another layer or model", lname);
    diag_hint(S->diag, "declare it with 'layer' to reuse it");
    return NULL;
  }
  SemLayer **copies = NULL, *child = NULL;
  if (v->kind == EX_REPEAT && v->u.repeat.index) {
    /* each copy instantiated with the index bound to its number */
    copies = arena_alloc(S->arena, sizeof(SemLayer *) * (size_t)repeat);
    for (int64_t k = 0; k < repeat; k++) {
      Binding *env = box->env;
      Binding *b = sema_bind(S, &env, v->u.repeat.index, B_VALUE, v->u.repeat.index_span);
      memset(&b->value, 0, sizeof b->value);
      b->value.kind = VAL_INT;
      b->value.i = k;
      b->value.span = v->u.repeat.index_span;
      if (!(copies[k] = instantiate(S, decl, env, call, call->span))) return NULL;
    }
    child = copies[0];
  } else {
    child = instantiate(S, decl, box->env, call, call->span);
  }
  if (!child) return NULL;
  SemChild *c = arena_alloc(S->arena, sizeof *c);
  c->name = st->u.assign.names[0].name;
  c->layer = child;
  c->repeat = repeat;
  c->span = st->span;
  c->copies = copies;
  return c;
}

int64_t sema_child_params(const SemChild *c) {
  int64_t count = 0, sub;
  if (!c->layer) return INT64_MAX;
  if (!c->copies) return sema_checked_mul(c->layer->param_count, c->repeat, &sub) ? sub : INT64_MAX;
  for (int64_t k = 0; k < c->repeat; k++)
    if (!c->copies[k] || !sema_checked_add(count, c->copies[k]->param_count, &count)) return INT64_MAX;
  return count;
}

int sema_is_layer_instantiation(Sema *S, const AstExpr *v) {
  if (v->kind == EX_REPEAT) return 1;
  if (v->kind != EX_CALL || v->u.call.callee->kind != EX_NAME) return 0;
  const char *name = v->u.call.callee->u.sval;
  if (sema_find_decl(S, name, (1 << DECL_LAYER) | (1 << DECL_MODEL))) return 1;
  /* A capitalised unknown callee is most likely a layer that is missing. */
  return name[0] >= 'A' && name[0] <= 'Z' && sema_find_builtin(name) < 0;
}

static void elaborate_item(Sema *S, LayerBox *box, const AstStmt *st) {
  const AstDecl *decl = box->l.decl;
  switch (st->kind) {
  case ST_PARAM: {
    if (body_name_taken(S, box, &st->u.param.name)) return;
    SemParam *p = arena_alloc(S->arena, sizeof *p);
    p->name = st->u.param.name.name;
    p->span = st->span;
    int ok = sema_parse_dtype(S, st->u.param.type, &p->type.dtype);
    if (st->u.param.type->ndims > SEM_MAX_RANK) {
      sema_error(S, st->u.param.type->span, "tensors have at most %d dimensions", SEM_MAX_RANK);
      return;
    }
    p->type.rank = st->u.param.type->ndims;
    p->numel = 1;
    for (int i = 0; i < p->type.rank; i++) {
      int64_t d;
      const AstExpr *de = st->u.param.type->dims[i];
      if (!sema_eval_int(S, box->env, de, "a parameter dimension", &d)) {
        ok = 0;
        continue;
      }
      if (d < 1) {
        sema_error(S, de->span, "parameter dimension %" PRId64 " is not positive", d);
        ok = 0;
        continue;
      }
      p->type.dims[i] = sym_const(S->arena, d);
      if (!sema_checked_mul(p->numel, d, &p->numel)) {
        sema_error(S, st->u.param.type->span, "parameter '%s' has more elements than fit in 64 bits", p->name);
        ok = 0;
      }
    }
    if (ok && p->numel > SEM_MAX_PARAM_ELEMENTS) {
      sema_error(S, st->u.param.type->span, "parameter '%s' has %.3g elements, more than a tensor may hold (2^48 = %.3g)",
                 p->name, (double)p->numel, (double)SEM_MAX_PARAM_ELEMENTS);
      diag_hint(S->diag, "2^48 fp32 values are 1 PB; is a size or a -D value too large?");
      ok = 0;
    }
    ok &= eval_init(S, box->env, st->u.param.init, &p->init);
    ok &= eval_shard(S, box->env, st->u.param.shard, &p->shard);
    if (ok && p->shard != SHARD_REPLICATED && p->type.rank == 0) {
      sema_error(S, st->span, "a scalar parameter cannot be sharded");
      ok = 0;
    }
    if (ok && (p->shard == SHARD_EXPERT_COLUMN || p->shard == SHARD_EXPERT_ROW) && p->type.rank != 3) {
      sema_error(S, st->span, "%s is for the experts' batched weights [experts, n_in, n_out]; '%s' has %d dimension%s",
                 sem_shard_name(p->shard), p->name, p->type.rank, p->type.rank == 1 ? "" : "s");
      ok = 0;
    }
    if (!ok) return;
    Binding *b = sema_bind(S, &box->env, p->name, B_PARAM, st->u.param.name.span);
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
    if (!sema_parse_dtype(S, t, &in->type.dtype)) return;
    if (t->ndims > SEM_MAX_RANK) {
      sema_error(S, t->span, "tensors have at most %d dimensions", SEM_MAX_RANK);
      return;
    }
    in->type.rank = t->ndims;
    for (int i = 0; i < t->ndims; i++) {
      const AstExpr *de = t->dims[i];
      if (de->kind == EX_NAME && !sema_lookup(box->env, de->u.sval)) {
        in->type.dims[i] = sym_var(S->arena, de->u.sval); /* a symbolic dimension such as B */
        continue;
      }
      int64_t d;
      if (!sema_eval_int(S, box->env, de, "an input dimension", &d)) return;
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
    Binding *b = sema_bind(S, &box->env, in->name, B_TENSOR, st->u.input.name.span);
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
    if (sema_is_layer_instantiation(S, st->u.assign.value)) {
      SemChild *c = add_child(S, box, st);
      if (!c) return;
      Binding *b = sema_bind(S, &box->env, name->name, B_CHILD, name->span);
      b->index = box->children.len;
      ptrvec_push(S->arena, &box->children, c);
      return;
    }
    /* A constant that failed stays bound as "nothing" so its uses stay quiet. */
    Value v = sema_eval_const(S, box->env, st->u.assign.value);
    Binding *b = sema_bind(S, &box->env, name->name, B_VALUE, name->span);
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
    Value c = sema_eval_const(S, box->env, st->u.if_.cond);
    if (c.kind == VAL_NONE) return;
    if (c.kind != VAL_BOOL) {
      sema_error(S, st->u.if_.cond->span, "the condition must be a bool known at compile time, not %s %s",
                 val_kind_name(c.kind), val_str(S->arena, &c));
      sema_hint_for_word(S, box->env, &c);
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

SemLayer *sema_instantiate_with(Sema *S, const AstDecl *decl, Value *vals, Binding *param_env, Span site) {
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
    if ((sub = sema_child_params(&l->children[i])) == INT64_MAX || !sema_checked_add(count, sub, &count)) {
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
  if (!sema_check_param_types(S, decl)) return NULL;
  Binding *param_env = NULL;
  Value *vals = bind_args(S, decl, caller_env, call, &param_env, site);
  if (!vals) {
    return NULL;
  }
  return sema_instantiate_with(S, decl, vals, param_env, site);
}
