/* ast.c - syntax tree builders and printers. */
#include "ast.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

static const char *const op_text[] = {
    [OP_ADD] = "+",  [OP_SUB] = "-", [OP_MUL] = "*",  [OP_DIV] = "/",   [OP_MOD] = "%",
    [OP_MATMUL] = "@", [OP_POW] = "**", [OP_EQ] = "==", [OP_NE] = "!=", [OP_LT] = "<",
    [OP_LE] = "<=",  [OP_GT] = ">",  [OP_GE] = ">=",  [OP_AND] = "and", [OP_OR] = "or",
    [OP_NEG] = "-",  [OP_NOT] = "not",
};

const char *ast_op_text(AstOp op) { return op_text[op]; }

static AstExpr *new_expr(Arena *a, AstExprKind kind, Span s) {
  AstExpr *e = arena_alloc(a, sizeof *e);
  e->kind = kind;
  e->span = s;
  e->depth = 1;
  return e;
}

static int depth_of(const AstExpr *e) { return e ? e->depth : 0; }
static int max_i(int a, int b) { return a > b ? a : b; }

AstExpr *ast_int(Arena *a, int64_t v, Span s) {
  AstExpr *e = new_expr(a, EX_INT, s);
  e->u.ival = v;
  return e;
}

AstExpr *ast_float(Arena *a, double v, AstUnit unit, const char *text, Span s) {
  AstExpr *e = new_expr(a, EX_FLOAT, s);
  e->u.fval.value = v;
  e->u.fval.unit = unit;
  e->u.fval.text = text;
  return e;
}

AstExpr *ast_bool(Arena *a, int v, Span s) {
  AstExpr *e = new_expr(a, EX_BOOL, s);
  e->u.bval = v;
  return e;
}

AstExpr *ast_string(Arena *a, const char *v, Span s) {
  AstExpr *e = new_expr(a, EX_STRING, s);
  e->u.sval = v;
  return e;
}

AstExpr *ast_name(Arena *a, const char *v, Span s) {
  AstExpr *e = new_expr(a, EX_NAME, s);
  e->u.sval = v;
  return e;
}

AstExpr *ast_unary(Arena *a, AstOp op, AstExpr *x, Span op_span) {
  AstExpr *e = new_expr(a, EX_UNARY, span_join(op_span, x->span));
  e->u.op.op = op;
  e->u.op.a = x;
  e->u.op.op_span = op_span;
  e->depth = depth_of(x) + 1;
  return e;
}

AstExpr *ast_binary(Arena *a, AstOp op, AstExpr *x, AstExpr *y, Span op_span) {
  AstExpr *e = new_expr(a, EX_BINARY, span_join(x->span, y->span));
  e->u.op.op = op;
  e->u.op.a = x;
  e->u.op.b = y;
  e->u.op.op_span = op_span;
  e->depth = max_i(depth_of(x), depth_of(y)) + 1;
  return e;
}

static AstExpr **expr_array(Arena *a, PtrVec *v, int *n, int *depth) {
  *n = v ? v->len : 0;
  AstExpr **items = arena_alloc(a, sizeof(AstExpr *) * (size_t)(*n ? *n : 1));
  for (int i = 0; i < *n; i++) {
    items[i] = v->items[i];
    *depth = max_i(*depth, depth_of(items[i]) + 1);
  }
  return items;
}

AstExpr *ast_call(Arena *a, AstExpr *callee, PtrVec *args, Span end) {
  AstExpr *e = new_expr(a, EX_CALL, span_join(callee->span, end));
  e->u.call.callee = callee;
  e->u.call.nargs = args ? args->len : 0;
  e->u.call.args = arena_alloc(a, sizeof(AstArg) * (size_t)(e->u.call.nargs + 1));
  e->depth = depth_of(callee) + 1;
  for (int i = 0; i < e->u.call.nargs; i++) {
    e->u.call.args[i] = *(AstArg *)args->items[i];
    e->depth = max_i(e->depth, depth_of(e->u.call.args[i].value) + 1);
  }
  return e;
}

AstArg *ast_arg(Arena *a, const char *name, Span name_span, AstExpr *value) {
  AstArg *arg = arena_alloc(a, sizeof *arg);
  arg->name = name;
  arg->name_span = name_span;
  arg->value = value;
  return arg;
}

AstExpr *ast_member(Arena *a, AstExpr *obj, const char *name, Span name_span) {
  AstExpr *e = new_expr(a, EX_MEMBER, span_join(obj->span, name_span));
  e->u.member.obj = obj;
  e->u.member.name = name;
  e->u.member.name_span = name_span;
  e->depth = depth_of(obj) + 1;
  return e;
}

AstExpr *ast_index(Arena *a, AstExpr *obj, PtrVec *items, Span end) {
  AstExpr *e = new_expr(a, EX_INDEX, span_join(obj->span, end));
  e->u.index.obj = obj;
  e->depth = depth_of(obj) + 1;
  e->u.index.items = expr_array(a, items, &e->u.index.nitems, &e->depth);
  return e;
}

AstExpr *ast_slice(Arena *a, AstExpr *lo, AstExpr *hi, Span s) {
  AstExpr *e = new_expr(a, EX_SLICE, s);
  e->u.slice.lo = lo;
  e->u.slice.hi = hi;
  e->depth = max_i(depth_of(lo), depth_of(hi)) + 1;
  return e;
}

AstExpr *ast_tuple(Arena *a, PtrVec *items, Span s) {
  AstExpr *e = new_expr(a, EX_TUPLE, s);
  e->u.list.items = expr_array(a, items, &e->u.list.nitems, &e->depth);
  return e;
}

AstExpr *ast_list(Arena *a, PtrVec *items, Span s) {
  AstExpr *e = new_expr(a, EX_LIST, s);
  e->u.list.items = expr_array(a, items, &e->u.list.nitems, &e->depth);
  return e;
}

AstExpr *ast_repeat(Arena *a, AstExpr *count, AstExpr *call, Span s) {
  AstExpr *e = new_expr(a, EX_REPEAT, span_join(s, call->span));
  e->u.repeat.count = count;
  e->u.repeat.call = call;
  e->depth = max_i(depth_of(count), depth_of(call)) + 1;
  return e;
}

AstExpr *ast_paren(AstExpr *e, Span s) {
  e->span = s;
  return e;
}

AstType *ast_type(Arena *a, const char *dtype, Span dtype_span, PtrVec *dims, Span s) {
  AstType *t = arena_alloc(a, sizeof *t);
  t->dtype = dtype;
  t->dtype_span = dtype_span;
  int depth = 0;
  t->dims = expr_array(a, dims, &t->ndims, &depth);
  t->span = s;
  return t;
}

AstName *ast_name_node(Arena *a, const char *name, Span s) {
  AstName *n = arena_alloc(a, sizeof *n);
  n->name = name;
  n->span = s;
  return n;
}

AstName *ast_names(Arena *a, PtrVec *names, int *count) {
  *count = names ? names->len : 0;
  AstName *out = arena_alloc(a, sizeof(AstName) * (size_t)(*count + 1));
  for (int i = 0; i < *count; i++) out[i] = *(AstName *)names->items[i];
  return out;
}

static AstStmt *new_stmt(Arena *a, AstStmtKind kind, Span s) {
  AstStmt *st = arena_alloc(a, sizeof *st);
  st->kind = kind;
  st->span = s;
  return st;
}

AstBlock ast_block(PtrVec *stmts) {
  AstBlock b = {0, 0};
  if (stmts) {
    b.items = (AstStmt **)stmts->items;
    b.n = stmts->len;
  }
  return b;
}

AstStmt *ast_assign(Arena *a, PtrVec *names, AstExpr *value, Span s) {
  AstStmt *st = new_stmt(a, ST_ASSIGN, s);
  st->u.assign.names = ast_names(a, names, &st->u.assign.nnames);
  st->u.assign.value = value;
  return st;
}

AstStmt *ast_return(Arena *a, AstExpr *value, Span s) {
  AstStmt *st = new_stmt(a, ST_RETURN, s);
  st->u.ret.value = value;
  return st;
}

AstStmt *ast_if(Arena *a, AstExpr *cond, PtrVec *then, PtrVec *otherwise, int has_else, Span s) {
  AstStmt *st = new_stmt(a, ST_IF, s);
  st->u.if_.cond = cond;
  st->u.if_.then = ast_block(then);
  st->u.if_.otherwise = ast_block(otherwise);
  st->u.if_.has_else = has_else;
  return st;
}

AstStmt *ast_param_stmt(Arena *a, AstName *name, AstType *type, AstExpr *init, AstExpr *shard,
                        Span s) {
  AstStmt *st = new_stmt(a, ST_PARAM, s);
  st->u.param.name = *name;
  st->u.param.type = type;
  st->u.param.init = init;
  st->u.param.shard = shard;
  return st;
}

AstStmt *ast_input(Arena *a, AstName *name, AstType *type, Span s) {
  AstStmt *st = new_stmt(a, ST_INPUT, s);
  st->u.input.name = *name;
  st->u.input.type = type;
  return st;
}

AstStmt *ast_forward(Arena *a, PtrVec *args, int has_args, PtrVec *body, Span s) {
  AstStmt *st = new_stmt(a, ST_FORWARD, s);
  st->u.forward.args = ast_names(a, args, &st->u.forward.nargs);
  st->u.forward.has_args = has_args;
  st->u.forward.body = ast_block(body);
  return st;
}

AstParam *ast_param(Arena *a, AstName *name, const char *type_name, Span type_span,
                    AstType *tensor_type, AstExpr *default_value) {
  AstParam *p = arena_alloc(a, sizeof *p);
  p->name = *name;
  p->type_name = type_name;
  p->type_span = type_span;
  p->tensor_type = tensor_type;
  p->default_value = default_value;
  return p;
}

AstSetting *ast_setting(Arena *a, AstName *key, AstExpr *value, Span s) {
  AstSetting *st = arena_alloc(a, sizeof *st);
  st->key = *key;
  st->value = value;
  st->span = s;
  return st;
}

AstSettings ast_settings(PtrVec *items) {
  AstSettings s = {0, 0};
  if (items) {
    s.items = (AstSetting **)items->items;
    s.n = items->len;
  }
  return s;
}

AstSetting *ast_setting_block(Arena *a, AstName *key, PtrVec *nested, Span s) {
  AstSetting *st = arena_alloc(a, sizeof *st);
  st->key = *key;
  st->is_block = 1;
  st->nested = ast_settings(nested);
  st->span = s;
  return st;
}

AstDecl *ast_decl(Arena *a, AstDeclKind kind, Span s) {
  AstDecl *d = arena_alloc(a, sizeof *d);
  d->kind = kind;
  d->span = s;
  return d;
}

void ast_decl_set_params(Arena *a, AstDecl *d, PtrVec *params) {
  d->has_params = 1;
  d->nparams = params ? params->len : 0;
  d->params = arena_alloc(a, sizeof(AstParam) * (size_t)(d->nparams + 1));
  for (int i = 0; i < d->nparams; i++) d->params[i] = *(AstParam *)params->items[i];
}

const char *ast_decl_kind_name(AstDeclKind k) {
  static const char *const names[] = {"import", "layer", "model", "train",
                                      "parallel", "cluster", "extern"};
  return names[k];
}

/* ------------------------------------------------------------------ */
/* Canonical printer                                                   */

/* Binding strength, low to high; matches the grammar in parser.y. */
enum { PREC_OR = 1, PREC_AND, PREC_NOT, PREC_CMP, PREC_ADD, PREC_MUL, PREC_NEG, PREC_POW,
       PREC_POSTFIX, PREC_ATOM };

static int binary_prec(AstOp op) {
  switch (op) {
  case OP_OR: return PREC_OR;
  case OP_AND: return PREC_AND;
  case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: return PREC_CMP;
  case OP_ADD: case OP_SUB: return PREC_ADD;
  case OP_MUL: case OP_DIV: case OP_MOD: case OP_MATMUL: return PREC_MUL;
  case OP_POW: return PREC_POW;
  default: return PREC_ATOM;
  }
}

static int expr_prec(const AstExpr *e) {
  switch (e->kind) {
  case EX_BINARY: return binary_prec(e->u.op.op);
  case EX_UNARY: return e->u.op.op == OP_NOT ? PREC_NOT : PREC_NEG;
  case EX_REPEAT: return PREC_OR; /* only valid as the whole value of an assignment */
  case EX_INT: return e->u.ival < 0 ? PREC_NEG : PREC_ATOM;
  case EX_FLOAT: return e->u.fval.value < 0 || signbit(e->u.fval.value) ? PREC_NEG : PREC_ATOM;
  case EX_CALL: case EX_MEMBER: case EX_INDEX: return PREC_POSTFIX;
  default: return PREC_ATOM;
  }
}

static void print_string_lit(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    switch (c) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\n': fputs("\\n", out); break;
    case '\t': fputs("\\t", out); break;
    default:
      if (c < 0x20 || c == 0x7f) fprintf(out, "\\x%02x", c);
      else fputc(c, out);
    }
  }
  fputc('"', out);
}

static void print_expr_prec(FILE *out, const AstExpr *e, int min_prec);

static void print_items(FILE *out, AstExpr *const *items, int n) {
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", out);
    print_expr_prec(out, items[i], 0);
  }
}

static void print_expr_prec(FILE *out, const AstExpr *e, int min_prec) {
  int prec = expr_prec(e);
  int paren = prec < min_prec;
  if (paren) fputc('(', out);
  switch (e->kind) {
  case EX_INT: fprintf(out, "%" PRId64, e->u.ival); break;
  case EX_FLOAT:
    if (e->u.fval.text) fputs(e->u.fval.text, out);
    else {
      char buf[64];
      snprintf(buf, sizeof buf, "%.17g", e->u.fval.value);
      if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
      fputs(buf, out);
    }
    break;
  case EX_BOOL: fputs(e->u.bval ? "true" : "false", out); break;
  case EX_STRING: print_string_lit(out, e->u.sval); break;
  case EX_NAME: fputs(e->u.sval, out); break;
  case EX_UNARY:
    fputs(e->u.op.op == OP_NOT ? "not " : "-", out);
    print_expr_prec(out, e->u.op.a, prec);
    break;
  case EX_BINARY: {
    /* Left-associative except '**'; comparisons do not chain. */
    int right_assoc = e->u.op.op == OP_POW;
    int nonassoc = prec == PREC_CMP;
    print_expr_prec(out, e->u.op.a, right_assoc || nonassoc ? prec + 1 : prec);
    fprintf(out, " %s ", ast_op_text(e->u.op.op));
    print_expr_prec(out, e->u.op.b, right_assoc ? (prec == PREC_POW ? PREC_NEG : prec) : prec + 1);
    break;
  }
  case EX_CALL:
    print_expr_prec(out, e->u.call.callee, PREC_POSTFIX);
    fputc('(', out);
    for (int i = 0; i < e->u.call.nargs; i++) {
      if (i) fputs(", ", out);
      if (e->u.call.args[i].name) fprintf(out, "%s = ", e->u.call.args[i].name);
      print_expr_prec(out, e->u.call.args[i].value, 0);
    }
    fputc(')', out);
    break;
  case EX_MEMBER: {
    /* a number's member in parentheses: `0.p` would lex as the number `0.`
     * with a suffix (the front-end fuzzer's round trip of `0\n.p`) */
    int num = e->u.member.obj->kind == EX_INT || e->u.member.obj->kind == EX_FLOAT;
    if (num) fputc('(', out);
    print_expr_prec(out, e->u.member.obj, PREC_POSTFIX);
    if (num) fputc(')', out);
    fprintf(out, ".%s", e->u.member.name);
    break;
  }
  case EX_INDEX:
    print_expr_prec(out, e->u.index.obj, PREC_POSTFIX);
    fputc('[', out);
    print_items(out, e->u.index.items, e->u.index.nitems);
    fputc(']', out);
    break;
  case EX_SLICE:
    if (e->u.slice.lo) print_expr_prec(out, e->u.slice.lo, 0);
    fputc(':', out);
    if (e->u.slice.hi) print_expr_prec(out, e->u.slice.hi, 0);
    break;
  case EX_TUPLE:
    fputc('(', out);
    print_items(out, e->u.list.items, e->u.list.nitems);
    if (e->u.list.nitems == 1) fputc(',', out);
    fputc(')', out);
    break;
  case EX_LIST:
    fputc('[', out);
    print_items(out, e->u.list.items, e->u.list.nitems);
    fputc(']', out);
    break;
  case EX_REPEAT:
    fputs("repeat ", out);
    if (e->u.repeat.index) fprintf(out, "%s in ", e->u.repeat.index);
    print_expr_prec(out, e->u.repeat.count, PREC_POSTFIX);
    fputc(' ', out);
    print_expr_prec(out, e->u.repeat.call, PREC_POSTFIX);
    break;
  }
  if (paren) fputc(')', out);
}

void ast_print_expr(FILE *out, const AstExpr *e) { print_expr_prec(out, e, 0); }

static void indent(FILE *out, int level) {
  for (int i = 0; i < level; i++) fputs("  ", out);
}

static void print_type(FILE *out, const AstType *t) {
  if (t->dtype) fputs(t->dtype, out);
  fputc('[', out);
  print_items(out, t->dims, t->ndims);
  fputc(']', out);
}

static void print_block(FILE *out, const AstBlock *b, int level);

static void print_stmt(FILE *out, const AstStmt *st, int level) {
  indent(out, level);
  switch (st->kind) {
  case ST_ASSIGN:
    for (int i = 0; i < st->u.assign.nnames; i++)
      fprintf(out, "%s%s", i ? ", " : "", st->u.assign.names[i].name);
    fputs(" = ", out);
    ast_print_expr(out, st->u.assign.value);
    fputc('\n', out);
    break;
  case ST_RETURN:
    fputs("return ", out);
    ast_print_expr(out, st->u.ret.value);
    fputc('\n', out);
    break;
  case ST_IF:
    fputs("if ", out);
    ast_print_expr(out, st->u.if_.cond);
    fputs(" {\n", out);
    print_block(out, &st->u.if_.then, level + 1);
    indent(out, level);
    if (st->u.if_.has_else) {
      fputs("} else {\n", out);
      print_block(out, &st->u.if_.otherwise, level + 1);
      indent(out, level);
    }
    fputs("}\n", out);
    break;
  case ST_PARAM:
    fprintf(out, "param %s : ", st->u.param.name.name);
    print_type(out, st->u.param.type);
    if (st->u.param.init) {
      fputs(" init ", out);
      ast_print_expr(out, st->u.param.init);
    }
    if (st->u.param.shard) {
      fputs(" shard ", out);
      print_expr_prec(out, st->u.param.shard, PREC_POSTFIX);
    }
    fputc('\n', out);
    break;
  case ST_INPUT:
    fprintf(out, "input %s : ", st->u.input.name.name);
    print_type(out, st->u.input.type);
    fputc('\n', out);
    break;
  case ST_FORWARD:
    fputs("forward", out);
    if (st->u.forward.has_args) {
      fputc('(', out);
      for (int i = 0; i < st->u.forward.nargs; i++)
        fprintf(out, "%s%s", i ? ", " : "", st->u.forward.args[i].name);
      fputc(')', out);
    }
    fputs(" {\n", out);
    print_block(out, &st->u.forward.body, level + 1);
    indent(out, level);
    fputs("}\n", out);
    break;
  }
}

static void print_block(FILE *out, const AstBlock *b, int level) {
  for (int i = 0; i < b->n; i++) print_stmt(out, b->items[i], level);
}

static void print_settings(FILE *out, const AstSettings *s, int level) {
  for (int i = 0; i < s->n; i++) {
    const AstSetting *st = s->items[i];
    indent(out, level);
    if (st->is_block) {
      fprintf(out, "%s {\n", st->key.name);
      print_settings(out, &st->nested, level + 1);
      indent(out, level);
      fputs("}\n", out);
    } else {
      fprintf(out, "%s = ", st->key.name);
      ast_print_expr(out, st->value);
      fputc('\n', out);
    }
  }
}

static void print_params(FILE *out, const AstDecl *d) {
  if (!d->has_params) return;
  fputc('(', out);
  for (int i = 0; i < d->nparams; i++) {
    const AstParam *p = &d->params[i];
    if (i) fputs(", ", out);
    fputs(p->name.name, out);
    if (p->type_name) fprintf(out, ": %s", p->type_name);
    if (p->tensor_type) {
      fputs(": ", out);
      print_type(out, p->tensor_type);
    }
    if (p->default_value) {
      fputs(" = ", out);
      ast_print_expr(out, p->default_value);
    }
  }
  fputc(')', out);
}

void ast_print_file(FILE *out, const AstFile *f) {
  for (int i = 0; i < f->ndecls; i++) {
    const AstDecl *d = f->decls[i];
    if (i) fputc('\n', out);
    switch (d->kind) {
    case DECL_IMPORT:
      fputs("import ", out);
      print_string_lit(out, d->name.name);
      fputc('\n', out);
      break;
    case DECL_LAYER:
    case DECL_MODEL:
      fprintf(out, "%s %s", ast_decl_kind_name(d->kind), d->name.name);
      print_params(out, d);
      fputs(" {\n", out);
      print_block(out, &d->body, 1);
      fputs("}\n", out);
      break;
    case DECL_TRAIN:
    case DECL_PARALLEL:
      fprintf(out, "%s {\n", ast_decl_kind_name(d->kind));
      print_settings(out, &d->settings, 1);
      fputs("}\n", out);
      break;
    case DECL_CLUSTER:
      fprintf(out, "cluster %s {\n", d->name.name);
      print_settings(out, &d->settings, 1);
      fputs("}\n", out);
      break;
    case DECL_EXTERN:
      fprintf(out, "extern %s", d->name.name);
      print_params(out, d);
      fputs(" -> ", out);
      print_type(out, d->result);
      fputs(" {\n", out);
      print_settings(out, &d->settings, 1);
      fputs("}\n", out);
      break;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Tree dump                                                           */

static void dump_span(FILE *out, Span s) {
  if (s.file >= 0) fprintf(out, " @%d:%d-%d:%d", s.line, s.col, s.end_line, s.end_col);
}

static const char *const expr_kind_names[] = {
    "int", "float", "bool", "string", "name", "unary", "binary", "call",
    "member", "index", "slice", "tuple", "list", "repeat",
};

static void dump_expr(FILE *out, const AstExpr *e, int level, const char *role) {
  indent(out, level);
  if (role) fprintf(out, "%s: ", role);
  if (!e) {
    fputs("(none)\n", out);
    return;
  }
  fputs(expr_kind_names[e->kind], out);
  switch (e->kind) {
  case EX_INT: fprintf(out, " %" PRId64, e->u.ival); break;
  case EX_FLOAT: fprintf(out, " %.17g", e->u.fval.value); break;
  case EX_BOOL: fputs(e->u.bval ? " true" : " false", out); break;
  case EX_STRING: fputc(' ', out); print_string_lit(out, e->u.sval); break;
  case EX_NAME: fprintf(out, " %s", e->u.sval); break;
  case EX_UNARY: case EX_BINARY: fprintf(out, " '%s'", ast_op_text(e->u.op.op)); break;
  case EX_MEMBER: fprintf(out, " .%s", e->u.member.name); break;
  default: break;
  }
  dump_span(out, e->span);
  fputc('\n', out);
  switch (e->kind) {
  case EX_UNARY: dump_expr(out, e->u.op.a, level + 1, NULL); break;
  case EX_BINARY:
    dump_expr(out, e->u.op.a, level + 1, NULL);
    dump_expr(out, e->u.op.b, level + 1, NULL);
    break;
  case EX_CALL:
    dump_expr(out, e->u.call.callee, level + 1, "callee");
    for (int i = 0; i < e->u.call.nargs; i++)
      dump_expr(out, e->u.call.args[i].value, level + 1,
                e->u.call.args[i].name ? e->u.call.args[i].name : "arg");
    break;
  case EX_MEMBER: dump_expr(out, e->u.member.obj, level + 1, NULL); break;
  case EX_INDEX:
    dump_expr(out, e->u.index.obj, level + 1, NULL);
    for (int i = 0; i < e->u.index.nitems; i++) dump_expr(out, e->u.index.items[i], level + 1, "at");
    break;
  case EX_SLICE:
    dump_expr(out, e->u.slice.lo, level + 1, "lo");
    dump_expr(out, e->u.slice.hi, level + 1, "hi");
    break;
  case EX_TUPLE: case EX_LIST:
    for (int i = 0; i < e->u.list.nitems; i++) dump_expr(out, e->u.list.items[i], level + 1, NULL);
    break;
  case EX_REPEAT:
    if (e->u.repeat.index) fprintf(out, "%*sindex %s\n", 2 * (level + 1), "", e->u.repeat.index);
    dump_expr(out, e->u.repeat.count, level + 1, "count");
    dump_expr(out, e->u.repeat.call, level + 1, "body");
    break;
  default: break;
  }
}

static void dump_type(FILE *out, const AstType *t, int level) {
  indent(out, level);
  fprintf(out, "type %s", t->dtype ? t->dtype : "(default)");
  dump_span(out, t->span);
  fputc('\n', out);
  for (int i = 0; i < t->ndims; i++) dump_expr(out, t->dims[i], level + 1, "dim");
}

static void dump_block(FILE *out, const AstBlock *b, int level);

static void dump_stmt(FILE *out, const AstStmt *st, int level) {
  indent(out, level);
  switch (st->kind) {
  case ST_ASSIGN:
    fputs("assign", out);
    for (int i = 0; i < st->u.assign.nnames; i++) fprintf(out, " %s", st->u.assign.names[i].name);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_expr(out, st->u.assign.value, level + 1, NULL);
    break;
  case ST_RETURN:
    fputs("return", out);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_expr(out, st->u.ret.value, level + 1, NULL);
    break;
  case ST_IF:
    fputs("if", out);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_expr(out, st->u.if_.cond, level + 1, "cond");
    indent(out, level + 1);
    fputs("then\n", out);
    dump_block(out, &st->u.if_.then, level + 2);
    if (st->u.if_.has_else) {
      indent(out, level + 1);
      fputs("else\n", out);
      dump_block(out, &st->u.if_.otherwise, level + 2);
    }
    break;
  case ST_PARAM:
    fprintf(out, "param %s", st->u.param.name.name);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_type(out, st->u.param.type, level + 1);
    if (st->u.param.init) dump_expr(out, st->u.param.init, level + 1, "init");
    if (st->u.param.shard) dump_expr(out, st->u.param.shard, level + 1, "shard");
    break;
  case ST_INPUT:
    fprintf(out, "input %s", st->u.input.name.name);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_type(out, st->u.input.type, level + 1);
    break;
  case ST_FORWARD:
    fputs("forward", out);
    for (int i = 0; i < st->u.forward.nargs; i++) fprintf(out, " %s", st->u.forward.args[i].name);
    dump_span(out, st->span);
    fputc('\n', out);
    dump_block(out, &st->u.forward.body, level + 1);
    break;
  }
}

static void dump_block(FILE *out, const AstBlock *b, int level) {
  for (int i = 0; i < b->n; i++) dump_stmt(out, b->items[i], level);
}

static void dump_settings(FILE *out, const AstSettings *s, int level) {
  for (int i = 0; i < s->n; i++) {
    const AstSetting *st = s->items[i];
    indent(out, level);
    fprintf(out, "setting %s", st->key.name);
    dump_span(out, st->span);
    fputc('\n', out);
    if (st->is_block) dump_settings(out, &st->nested, level + 1);
    else dump_expr(out, st->value, level + 1, NULL);
  }
}

void ast_dump_file(FILE *out, const AstFile *f) {
  fprintf(out, "file %s\n", f->path);
  for (int i = 0; i < f->ndecls; i++) {
    const AstDecl *d = f->decls[i];
    indent(out, 1);
    fprintf(out, "%s", ast_decl_kind_name(d->kind));
    if (d->name.name) fprintf(out, " %s", d->name.name);
    dump_span(out, d->span);
    fputc('\n', out);
    for (int k = 0; k < d->nparams; k++) {
      const AstParam *p = &d->params[k];
      indent(out, 2);
      fprintf(out, "param %s%s%s", p->name.name, p->type_name ? ": " : "",
              p->type_name ? p->type_name : "");
      dump_span(out, p->name.span);
      fputc('\n', out);
      if (p->tensor_type) dump_type(out, p->tensor_type, 3);
      if (p->default_value) dump_expr(out, p->default_value, 3, "default");
    }
    if (d->result) dump_type(out, d->result, 2);
    dump_block(out, &d->body, 2);
    dump_settings(out, &d->settings, 2);
  }
}
