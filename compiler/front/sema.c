/* sema.c - semantic analysis by elaboration.
 *
 * The model is instantiated top-down with concrete parameter values; each
 * forward is checked with the argument shapes that reach it. Errors carry
 * notes for the instantiation chain ("in Linear(768, 2304) at gpt2.hpd:14:9")
 * so a mismatch deep in the standard library points back at the user's line.
 *
 * This file holds the state and helpers the parts share (sema_internal.h) and
 * the entry: the declaration index, the choice of model and sema_check. The
 * parts are sema_eval.c (compile-time evaluation), sema_layer.c (layer
 * instantiation), sema_expr.c (forward checking) and sema_blocks.c (the train,
 * parallel and cluster blocks and the parallel layout). */
#include "sema_internal.h"
#include "xalloc.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* tables                                                              */

const BuiltinInfo sema_builtins[] = {
#define X(id, name, lo, hi) {name, lo, hi},
    SEM_BUILTINS(X)
#undef X
};

const char *sem_op_name(SemOp op) { return sema_builtins[op].name; }

/* Builtins that are operators, not names a user calls. */
static int builtin_is_callable(SemOp op) {
  return op != SOP_NEG && op != SOP_ADD && op != SOP_SUB && op != SOP_MUL && op != SOP_DIV &&
         op != SOP_POW && op != SOP_MATMUL && op != SOP_SLICE;
}

int sema_find_builtin(const char *name) {
  for (int i = 0; i < SOP_COUNT; i++)
    if (builtin_is_callable((SemOp)i) && strcmp(sema_builtins[i].name, name) == 0) return i;
  return -1;
}

int sema_is_unary_elementwise(SemOp op) { return op <= SOP_NEG; }

const char *sem_type_str(Arena *a, const TensorType *t) {
  char *s = arena_printf(a, "%s[", sem_dtype_name(t->dtype));
  for (int i = 0; i < t->rank; i++)
    s = arena_printf(a, "%s%s%s", s, i ? ", " : "", sym_str(a, t->dims[i]));
  return arena_printf(a, "%s]", s);
}

/* ------------------------------------------------------------------ */
/* context                                                             */

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

void sema_error(Sema *S, Span at, const char *fmt, ...) {
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
const char *sema_expr_text(Sema *S, const AstExpr *e) {
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

Binding *sema_bind(Sema *S, Binding **env, const char *name, BindKind kind, Span span) {
  Binding *b = arena_alloc(S->arena, sizeof *b);
  b->name = name;
  b->kind = kind;
  b->span = span;
  b->next = *env;
  *env = b;
  return b;
}

Binding *sema_lookup(Binding *env, const char *name) {
  for (; env; env = env->next)
    if (strcmp(env->name, name) == 0) return env;
  return NULL;
}

/* Closest bound name or builtin, for "did you mean" hints. */
const char *sema_suggest(Sema *S, Binding *env, const char *name, int with_builtins) {
  PtrVec cands = {0, 0, 0};
  for (Binding *b = env; b; b = b->next) ptrvec_push(S->arena, &cands, (void *)b->name);
  if (with_builtins)
    for (int i = 0; i < SOP_COUNT; i++)
      if (builtin_is_callable((SemOp)i)) ptrvec_push(S->arena, &cands, (void *)sema_builtins[i].name);
  return diag_closest(name, (const char *const *)cands.items, cands.len);
}

const AstDecl *sema_find_decl(Sema *S, const char *name, int kind_mask) {
  const AstDecl *d = strmap_get(kind_mask & (1 << DECL_CLUSTER) ? &S->clusters : &S->callables, name);
  return d && (kind_mask & (1 << d->kind)) ? d : NULL;
}

const char *sema_suggest_decl(Sema *S, const char *name, int kind_mask) {
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

Value sema_none_value(Span at) {
  Value v;
  memset(&v, 0, sizeof v);
  v.kind = VAL_NONE;
  v.span = at;
  return v;
}

Value sema_int_value(int64_t i, Span at) {
  Value v = sema_none_value(at);
  v.kind = VAL_INT;
  v.i = i;
  return v;
}

Value sema_float_value(double f, Span at) {
  Value v = sema_none_value(at);
  v.kind = VAL_FLOAT;
  v.f = f;
  return v;
}

Value sema_bool_value(int b, Span at) {
  Value v = sema_none_value(at);
  v.kind = VAL_BOOL;
  v.b = b;
  return v;
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
  if (!sema_check_param_types(S, decl)) return NULL;
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
      else if (n) diag_hint(S->diag, "its parameters are %s", sema_words_list(S, (const char *const *)names));
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
      Value dflt = sema_none_value(span_none);
      if (p->default_value) dflt = sema_eval_const(S, env, p->default_value);
      if (!want && dflt.kind != VAL_NONE) want = sema_type_name_of(&dflt);
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
      vals[k] = sema_eval_const(S, env, p->default_value);
      if (vals[k].kind == VAL_NONE || !sema_coerce_param(S, p, &vals[k], env, p->default_value->span)) ok = 0;
    } else {
      sema_error(S, p->name.span, "model parameter '%s' has no default; give one, or pass -D %s=VALUE", p->name.name, p->name.name);
      ok = 0;
    }
    Binding *b = sema_bind(S, &env, p->name.name, B_VALUE, p->name.span);
    b->value = vals[k];
  }
  if (!ok) return NULL;
  return sema_instantiate_with(S, decl, vals, env, span_none);
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

static const KeySpec extern_keys[] = {
    {"library", K_STRING, NULL, 0}, {"symbol", K_STRING, NULL, 0}, {"grad", K_STRING, NULL, 0},
};

/* Native code only from where the file says, relative to itself: an
 * absolute path would load whatever that machine has there, and a bare name
 * whatever the dlopen search path (LD_LIBRARY_PATH, the system's folders)
 * finds first. */
static void check_library_path(Sema *S, const AstDecl *d, const Setting *lib) {
  const char *path = lib->value.s;
  if (path[0] == '/' || path[0] == '~') {
    sema_error(S, lib->span, "extern %s: library \"%s\" is an absolute path; an extern's library is found only relative to the file "
                             "that declares it", d->name.name, path);
    diag_hint(S->diag, "copy the library beside the file (or below its folder) and name it from there, e.g. \"./%s\"",
              strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
  } else if (!strchr(path, '/')) {
    sema_error(S, lib->span, "extern %s: library \"%s\" is a bare name, which the dlopen search path would look for anywhere on "
                             "the machine; an extern's library is found only relative to the file that declares it", d->name.name, path);
    diag_hint(S->diag, "put the library beside the file and write library = \"./%s\"", path);
  }
}

/* Layers no model reaches still get their declarations checked. */
static void check_unused_decls(Sema *S) {
  for (int f = 0; f < S->prog->nfiles; f++) {
    const AstFile *file = S->prog->files[f];
    for (int i = 0; i < file->ndecls; i++) {
      const AstDecl *d = file->decls[i];
      if (d->kind == DECL_LAYER || d->kind == DECL_MODEL || d->kind == DECL_EXTERN) sema_check_param_types(S, d);
      if ((d->kind == DECL_LAYER || d->kind == DECL_MODEL) && count_items(&d->body) > SEMA_MAX_ITEMS) {
        sema_error(S, d->name.span, "%s has more than %d items and statements; the limit is %d", d->name.name, SEMA_MAX_ITEMS,
                   SEMA_MAX_ITEMS);
        diag_hint(S->diag, "split it into layers");
        strmap_put(S->arena, &S->param_check, d->name.name, (void *)S); /* never instantiate it */
      }
      if (d->kind == DECL_EXTERN) {
        Settings s;
        sema_read_settings(S, &d->settings, extern_keys, NKEYS(extern_keys), &s, "extern");
        Setting *lib = sema_setting_get(&s, "library");
        if (!lib)
          sema_error(S, d->name.span, "extern %s names no library: add library = \"libname.so\"", d->name.name);
        else if (lib->value.kind == VAL_STRING)
          check_library_path(S, d, lib);
        if (!sema_setting_get(&s, "symbol"))
          sema_error(S, d->name.span, "extern %s names no symbol: add symbol = \"function_name\"", d->name.name);
      }
      if (d->kind == DECL_CLUSTER && f == 0) {
        SemCluster c;
        sema_read_cluster_decl(S, d, &c);
      }
    }
  }
}

static SemModel *check_program(Sema *S);

/* The forward marks running statistics as state (batch_norm), which are not
 * parameters in the count (PyTorch's buffers): every instance's count again,
 * children first (S->instances is newest first, and a child is finished
 * before its parent). */
static void recount_params(Sema *S) {
  int n = 0;
  for (SemLayer *l = S->instances; l; l = l->next_instance) n++;
  SemLayer **order = xalloc_calloc((size_t)n + 1, sizeof *order);
  n = 0;
  for (SemLayer *l = S->instances; l; l = l->next_instance) order[n++] = l;
  for (int k = n - 1; k >= 0; k--) {
    SemLayer *l = order[k];
    int64_t count = 0, sub = 0;
    for (int i = 0; i < l->nparams; i++) count += l->params[i].state ? 0 : l->params[i].numel;
    for (int i = 0; i < l->nchildren && count != INT64_MAX; i++)
      if ((sub = sema_child_params(&l->children[i])) == INT64_MAX || !sema_checked_add(count, sub, &count))
        count = INT64_MAX;
    l->param_count = count;
  }
  free(order);
}


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
    if (train || parallel) sema_check_blocks_only(S, m, train, parallel);
    return NULL;
  }
  if (!diag_error_count(diag)) m->model = instantiate_model(S, model_decl);
  if (m->model && m->model->ninputs == 0) {
    sema_error(S, model_decl->name.span, "model %s declares no input", model_decl->name.name);
    diag_hint(diag, "add e.g. input tokens : i32[B, T]");
    m->model = NULL;
  }
  if (m->model) m->forward = sema_check_forward(S, m->model, NULL, 0, span_none);
  if (m->forward) recount_params(S);
  if (!m->model || !m->forward) {
    sema_check_blocks_only(S, m, train, parallel);
    return NULL;
  }
  const SemInput *in0 = &m->model->inputs[0];
  m->images = in0->type.rank == 4 && sem_dtype_is_float(in0->type.dtype);
  if (in0->type.rank >= 2 && !m->images) sym_is_const(in0->type.dims[1], &m->seq_len);
  Settings train_settings;
  sema_read_train(S, m, train, &train_settings);
  sema_read_layout(S, m, parallel, &train_settings);
  return diag_error_count(diag) ? NULL : m;
}

int64_t sem_param_count(const SemModel *m) { return m->model ? m->model->param_count : 0; }

/* The first moe_dispatch in e's expression DAG (seen: the nodes visited, so shared
 * subexpressions are walked once): its experts E and choices per token K. */
typedef struct {
  const SemExpr **v;
  int n, cap;
} Seen;

static const SemExpr *dispatch_of(const SemExpr *e, Seen *seen) {
  if (!e) return NULL;
  for (int i = 0; i < seen->n; i++)
    if (seen->v[i] == e) return NULL;
  if (seen->n == seen->cap) {
    seen->cap = seen->cap ? 2 * seen->cap : 64;
    seen->v = xalloc_realloc(seen->v, sizeof *seen->v * (size_t)seen->cap);
  }
  seen->v[seen->n++] = e;
  if (e->kind == SE_OP && e->op == SOP_MOE_DISPATCH && e->nattr >= 5) return e;
  for (int i = 0; i < e->nargs; i++) {
    const SemExpr *d = dispatch_of(e->args[i], seen);
    if (d) return d;
  }
  return NULL;
}

/* The node limit of the first moe_dispatch under layer L (0 when none). */
static int route_groups(const SemLayer *L, int64_t *groups, int64_t *group_top_k) {
  Seen seen = {0};
  const SemExpr *d = NULL;
  for (const SemFunc *f = L->funcs; f && !d; f = f->next) d = dispatch_of(f->result, &seen);
  free(seen.v);
  if (d) {
    *groups = d->attr[3];
    *group_top_k = d->attr[4];
    return 1;
  }
  for (int i = 0; i < L->nchildren; i++) {
    const SemChild *c = &L->children[i];
    const SemLayer *sub = c->copies ? (c->repeat > 0 ? c->copies[0] : NULL) : c->layer;
    if (sub && route_groups(sub, groups, group_top_k)) return 1;
  }
  return 0;
}

int sem_moe_route_groups(const SemModel *m, int64_t *groups, int64_t *group_top_k) {
  *groups = *group_top_k = 1;
  return m->model ? route_groups(m->model, groups, group_top_k) : 0;
}

static int find_dispatch(const SemExpr *e, Seen *seen, int64_t *E, int64_t *K) {
  if (!e) return 0;
  for (int i = 0; i < seen->n; i++)
    if (seen->v[i] == e) return 0;
  if (seen->n == seen->cap) {
    seen->cap = seen->cap ? 2 * seen->cap : 64;
    seen->v = xalloc_realloc(seen->v, sizeof *seen->v * (size_t)seen->cap);
  }
  seen->v[seen->n++] = e;
  if (e->kind == SE_OP && e->op == SOP_MOE_DISPATCH && e->nargs == 2 &&
      sym_is_const(e->args[1]->type.dims[e->args[1]->type.rank - 1], K)) {
    *E = e->attr[0];
    return 1;
  }
  for (int i = 0; i < e->nargs; i++)
    if (find_dispatch(e->args[i], seen, E, K)) return 1;
  return 0;
}

/* Parameters a token uses in layer L and below: an expert parameter ([E, ...], shard
 * expert_column / expert_row) counts K / E of itself under the layer whose forward
 * dispatches to E experts K a token (the nearest above it), every other in full. */
static int64_t active_count(const SemLayer *L, int64_t E, int64_t K) {
  Seen seen = {0};
  for (const SemFunc *f = L->funcs; f; f = f->next)
    if (find_dispatch(f->result, &seen, &E, &K)) break;
  free(seen.v);
  int64_t n = 0;
  for (int i = 0; i < L->nparams; i++) {
    const SemParam *p = &L->params[i];
    int expert = p->shard == SHARD_EXPERT_COLUMN || p->shard == SHARD_EXPERT_ROW;
    if (p->state) continue; /* running statistics are not parameters */
    n += expert && E > 0 ? p->numel / E * K : p->numel;
  }
  for (int i = 0; i < L->nchildren; i++) {
    const SemChild *c = &L->children[i];
    if (c->copies)
      for (int64_t k = 0; k < c->repeat; k++) n += active_count(c->copies[k], E, K);
    else if (c->layer)
      n += c->repeat * active_count(c->layer, E, K);
  }
  return n;
}

int64_t sem_active_param_count(const SemModel *m) { return m->model ? active_count(m->model, 0, 1) : 0; }
