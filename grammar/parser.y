/* parser.y - the grammar of .hpd files.
 *
 * A pure LALR(1) parser with locations. Actions are one-line calls into the
 * AST builders of grammar/ast.c. On a syntax error the parse of the current
 * declaration stops; parse_file() resumes at the next line that starts a
 * declaration, so one run reports an error per broken declaration. */
%define api.pure full
%define api.prefix {hpdyy}
%define api.location.type {Span}
%define parse.error custom
%locations
%param {void *scanner}
%parse-param {ParseCtx *ctx}

%code requires {
#include "parse_ctx.h"
}

%code {
#include <string.h>

#define YYLLOC_DEFAULT(Cur, Rhs, N)                         \
  do {                                                      \
    if (N) {                                                \
      (Cur) = YYRHSLOC(Rhs, 1);                             \
      (Cur).end_line = YYRHSLOC(Rhs, N).end_line;           \
      (Cur).end_col = YYRHSLOC(Rhs, N).end_col;             \
    } else {                                                \
      (Cur) = YYRHSLOC(Rhs, 0);                             \
      (Cur).line = (Cur).end_line;                          \
      (Cur).col = (Cur).end_col;                            \
    }                                                       \
  } while (0)

int hpdyylex(HPDYYSTYPE *lval, Span *lloc, void *scanner);

#define A (ctx->arena)
static PtrVec *vec1(ParseCtx *ctx, void *first);
static PtrVec *vec_push(ParseCtx *ctx, PtrVec *v, void *item);
static void hpdyyerror(Span *loc, void *scanner, ParseCtx *ctx, const char *msg);
static int too_deep(ParseCtx *ctx, const AstExpr *e, Span at);

/* Expressions deeper than AST_MAX_DEPTH stop the parse: every later walk of
 * the tree recurses, and a million-term sum must not overflow the stack. */
#define GUARD(e, at) do { if (too_deep(ctx, (e), (at))) YYABORT; } while (0)
}

%union {
  int64_t ival;
  struct { double value; AstUnit unit; const char *text; } fnum;
  const char *sval;
  AstExpr *expr;
  AstType *type;
  AstStmt *stmt;
  AstDecl *decl;
  AstName *name;
  AstParam *param;
  AstSetting *setting;
  AstArg *arg;
  PtrVec *vec;
  int op;
}

%token YYEOF 0 "end of file"
%token <sval> IDENT "name"
%token <sval> STRING "string"
%token <ival> INT "integer"
%token <fnum> FLOAT "number"
%token IMPORT "'import'" LAYER "'layer'" MODEL "'model'" PARAM "'param'" INPUT "'input'"
%token FORWARD "'forward'" RETURN "'return'" IF "'if'" ELSE "'else'" REPEAT "'repeat'" IN "'in'"
%token TRAIN "'train'" PARALLEL "'parallel'" CLUSTER "'cluster'" EXTERN "'extern'"
%token INIT "'init'" SHARD "'shard'" TRUE "'true'" FALSE "'false'"
%token AND "'and'" OR "'or'" NOT "'not'"
%token ARROW "'->'" POW "'**'" EQ "'=='" NE "'!='" LE "'<='" GE "'>='"
%token TOO_DEEP "too deep nesting"

%type <decl> decl layer_head
%type <vec> params_opt params body stmts names names_opt settings args_opt args exprs
%type <vec> exprs_opt index_items else_body else_stmts
%type <param> param
%type <stmt> body_item stmt param_decl body_if stmt_if
%type <setting> setting
%type <type> type
%type <name> pname key_name ident
%type <expr> expr or_expr and_expr not_expr cmp_expr add_expr mul_expr unary power postfix
%type <expr> primary value index_item
%type <arg> arg
%type <op> cmp_op mul_op

%%

file:
    %empty
  | file decl                 { ptrvec_push(A, &ctx->decls, $2); }
  ;

decl:
    IMPORT STRING             { $$ = ast_decl(A, DECL_IMPORT, @$); $$->name.name = $2; $$->name.span = @2; }
  | layer_head '{' body '}'   { $$ = $1; $$->span = @$; $$->body = ast_block($3); }
  | TRAIN '{' settings '}'    { $$ = ast_decl(A, DECL_TRAIN, @$); $$->settings = ast_settings($3); }
  | PARALLEL '{' settings '}' { $$ = ast_decl(A, DECL_PARALLEL, @$); $$->settings = ast_settings($3); }
  | CLUSTER ident '{' settings '}'
                              { $$ = ast_decl(A, DECL_CLUSTER, @$); $$->name = *$2; $$->settings = ast_settings($4); }
  | EXTERN ident '(' params_opt ')' ARROW type '{' settings '}'
                              { $$ = ast_decl(A, DECL_EXTERN, @$); $$->name = *$2; ast_decl_set_params(A, $$, $4);
                                $$->result = $7; $$->settings = ast_settings($9); }
  ;

layer_head:
    LAYER ident               { $$ = ast_decl(A, DECL_LAYER, @$); $$->name = *$2; }
  | LAYER ident '(' params_opt ')'
                              { $$ = ast_decl(A, DECL_LAYER, @$); $$->name = *$2; ast_decl_set_params(A, $$, $4); }
  | MODEL ident               { $$ = ast_decl(A, DECL_MODEL, @$); $$->name = *$2; }
  | MODEL ident '(' params_opt ')'
                              { $$ = ast_decl(A, DECL_MODEL, @$); $$->name = *$2; ast_decl_set_params(A, $$, $4); }
  ;

ident: IDENT                  { $$ = ast_name_node(A, $1, @1); } ;

params_opt:
    %empty                    { $$ = NULL; }
  | params                    { $$ = $1; }
  | params ','                { $$ = $1; }
  ;

params:
    param                     { $$ = vec1(ctx, $1); }
  | params ',' param          { $$ = vec_push(ctx, $1, $3); }
  ;

param:
    pname                     { $$ = ast_param(A, $1, NULL, span_none, NULL, NULL); }
  | pname '=' expr            { $$ = ast_param(A, $1, NULL, span_none, NULL, $3); }
  | pname ':' IDENT           { $$ = ast_param(A, $1, $3, @3, NULL, NULL); }
  | pname ':' IDENT '=' expr  { $$ = ast_param(A, $1, $3, @3, NULL, $5); }
  | pname ':' type            { $$ = ast_param(A, $1, NULL, span_none, $3, NULL); }
  ;

/* Names of parameters and keyword arguments may be words that are keywords
 * elsewhere: Linear(shard = row), `init` as an argument. */
pname:
    key_name
  ;

key_name:
    IDENT                     { $$ = ast_name_node(A, $1, @1); }
  | INIT                      { $$ = ast_name_node(A, "init", @1); }
  | SHARD                     { $$ = ast_name_node(A, "shard", @1); }
  | MODEL                     { $$ = ast_name_node(A, "model", @1); }
  | CLUSTER                   { $$ = ast_name_node(A, "cluster", @1); }
  | TRAIN                     { $$ = ast_name_node(A, "train", @1); }
  | PARALLEL                  { $$ = ast_name_node(A, "parallel", @1); }
  | INPUT                     { $$ = ast_name_node(A, "input", @1); }
  ;

type:
    IDENT '[' exprs_opt ']'   { $$ = ast_type(A, $1, @1, $3, @$); }
  | '[' exprs_opt ']'         { $$ = ast_type(A, NULL, span_none, $2, @$); }
  ;

body:
    %empty                    { $$ = NULL; }
  | body body_item            { $$ = $2 ? vec_push(ctx, $1, $2) : $1; }
  ;

body_item:
    param_decl
  | INPUT ident ':' type      { $$ = ast_input(A, $2, $4, @$); }
  | ident '=' value           { $$ = ast_assign(A, vec1(ctx, $1), $3, @$); }
  | FORWARD '{' stmts '}'     { $$ = ast_forward(A, NULL, 0, $3, @$); }
  | FORWARD '(' names_opt ')' '{' stmts '}'
                              { $$ = ast_forward(A, $3, 1, $6, @$); }
  | IF expr '{' body '}' else_body
                              { $$ = ast_if(A, $2, $4, $6, $6 != NULL, @$); }
  | ';'                       { $$ = NULL; }
  ;

param_decl:
    PARAM ident ':' type                          { $$ = ast_param_stmt(A, $2, $4, NULL, NULL, @$); }
  | PARAM ident ':' type INIT expr                { $$ = ast_param_stmt(A, $2, $4, $6, NULL, @$); }
  | PARAM ident ':' type SHARD postfix            { $$ = ast_param_stmt(A, $2, $4, NULL, $6, @$); }
  | PARAM ident ':' type INIT expr SHARD postfix  { $$ = ast_param_stmt(A, $2, $4, $6, $8, @$); }
  ;

else_body:
    %empty                    { $$ = NULL; }
  | ELSE '{' body '}'         { $$ = $3 ? $3 : arena_alloc(A, sizeof(PtrVec)); }
  | ELSE body_if              { $$ = vec1(ctx, $2); }
  ;

body_if:
    IF expr '{' body '}' else_body
                              { $$ = ast_if(A, $2, $4, $6, $6 != NULL, @$); }
  ;

stmts:
    %empty                    { $$ = NULL; }
  | stmts stmt                { $$ = $2 ? vec_push(ctx, $1, $2) : $1; }
  ;

stmt:
    names '=' value           { $$ = ast_assign(A, $1, $3, @$); }
  | RETURN expr               { $$ = ast_return(A, $2, @$); }
  | IF expr '{' stmts '}' else_stmts
                              { $$ = ast_if(A, $2, $4, $6, $6 != NULL, @$); }
  | ';'                       { $$ = NULL; }
  ;

else_stmts:
    %empty                    { $$ = NULL; }
  | ELSE '{' stmts '}'        { $$ = $3 ? $3 : arena_alloc(A, sizeof(PtrVec)); }
  | ELSE stmt_if              { $$ = vec1(ctx, $2); }
  ;

stmt_if:
    IF expr '{' stmts '}' else_stmts
                              { $$ = ast_if(A, $2, $4, $6, $6 != NULL, @$); }
  ;

names:
    ident                     { $$ = vec1(ctx, $1); }
  | names ',' ident           { $$ = vec_push(ctx, $1, $3); }
  ;

names_opt:
    %empty                    { $$ = NULL; }
  | names                     { $$ = $1; }
  ;

settings:
    %empty                    { $$ = NULL; }
  | settings setting          { $$ = vec_push(ctx, $1, $2); }
  | settings ';'              { $$ = $1; }
  ;

setting:
    key_name '=' expr         { $$ = ast_setting(A, $1, $3, @$); }
  | key_name '{' settings '}' { $$ = ast_setting_block(A, $1, $3, @$); }
  ;

value:
    expr
  | REPEAT primary postfix    { $$ = ast_repeat(A, $2, $3, @1); }
  | REPEAT ident IN primary postfix
                              { $$ = ast_repeat(A, $4, $5, @1); $$->u.repeat.index = $2->name; $$->u.repeat.index_span = $2->span; }
  ;

expr: or_expr ;

or_expr:
    and_expr
  | or_expr OR and_expr       { $$ = ast_binary(A, OP_OR, $1, $3, @2); GUARD($$, @2); }
  ;

and_expr:
    not_expr
  | and_expr AND not_expr     { $$ = ast_binary(A, OP_AND, $1, $3, @2); GUARD($$, @2); }
  ;

not_expr:
    cmp_expr
  | NOT not_expr              { $$ = ast_unary(A, OP_NOT, $2, @1); GUARD($$, @1); }
  ;

cmp_expr:
    add_expr
  | add_expr cmp_op add_expr  { $$ = ast_binary(A, (AstOp)$2, $1, $3, @2); GUARD($$, @2); }
  ;

cmp_op:
    EQ  { $$ = OP_EQ; } | NE  { $$ = OP_NE; } | '<' { $$ = OP_LT; }
  | LE  { $$ = OP_LE; } | '>' { $$ = OP_GT; } | GE  { $$ = OP_GE; }
  ;

add_expr:
    mul_expr
  | add_expr '+' mul_expr     { $$ = ast_binary(A, OP_ADD, $1, $3, @2); GUARD($$, @2); }
  | add_expr '-' mul_expr     { $$ = ast_binary(A, OP_SUB, $1, $3, @2); GUARD($$, @2); }
  ;

mul_expr:
    unary
  | mul_expr mul_op unary     { $$ = ast_binary(A, (AstOp)$2, $1, $3, @2); GUARD($$, @2); }
  ;

mul_op:
    '*' { $$ = OP_MUL; } | '/' { $$ = OP_DIV; } | '%' { $$ = OP_MOD; } | '@' { $$ = OP_MATMUL; }
  ;

unary:
    power
  | '-' unary                 { $$ = ast_unary(A, OP_NEG, $2, @1); GUARD($$, @1); }
  ;

power:
    postfix
  | postfix POW unary         { $$ = ast_binary(A, OP_POW, $1, $3, @2); GUARD($$, @2); }
  ;

postfix:
    primary
  | postfix '(' args_opt ')'  { $$ = ast_call(A, $1, $3, @4); GUARD($$, @2); }
  | postfix '.' IDENT         { $$ = ast_member(A, $1, $3, @3); GUARD($$, @2); }
  | postfix '[' index_items ']'
                              { $$ = ast_index(A, $1, $3, @4); GUARD($$, @2); }
  ;

primary:
    INT                       { $$ = ast_int(A, $1, @1); }
  | FLOAT                     { $$ = ast_float(A, $1.value, $1.unit, $1.text, @1); }
  | STRING                    { $$ = ast_string(A, $1, @1); }
  | TRUE                      { $$ = ast_bool(A, 1, @1); }
  | FALSE                     { $$ = ast_bool(A, 0, @1); }
  | IDENT                     { $$ = ast_name(A, $1, @1); }
  | '(' expr ')'              { $$ = ast_paren($2, @$); }
  | '(' expr ',' exprs_opt ')' { PtrVec *v = vec1(ctx, $2);
                                if ($4) for (int i = 0; i < $4->len; i++) ptrvec_push(A, v, $4->items[i]);
                                $$ = ast_tuple(A, v, @$); }
  | '[' exprs_opt ']'         { $$ = ast_list(A, $2, @$); }
  ;

exprs:
    expr                      { $$ = vec1(ctx, $1); }
  | exprs ',' expr            { $$ = vec_push(ctx, $1, $3); }
  ;

exprs_opt:
    %empty                    { $$ = NULL; }
  | exprs                     { $$ = $1; }
  | exprs ','                 { $$ = $1; }
  ;

args_opt:
    %empty                    { $$ = NULL; }
  | args                      { $$ = $1; }
  | args ','                  { $$ = $1; }
  ;

args:
    arg                       { $$ = vec1(ctx, $1); }
  | args ',' arg              { $$ = vec_push(ctx, $1, $3); }
  ;

arg:
    expr                      { $$ = ast_arg(A, NULL, span_none, $1); }
  | key_name '=' expr         { $$ = ast_arg(A, $1->name, $1->span, $3); }
  ;

index_items:
    index_item                { $$ = vec1(ctx, $1); }
  | index_items ',' index_item
                              { $$ = vec_push(ctx, $1, $3); }
  ;

index_item:
    expr
  | ':'                       { $$ = ast_slice(A, NULL, NULL, @$); }
  | expr ':'                  { $$ = ast_slice(A, $1, NULL, @$); }
  | ':' expr                  { $$ = ast_slice(A, NULL, $2, @$); }
  | expr ':' expr             { $$ = ast_slice(A, $1, $3, @$); }
  ;

%%

static PtrVec *vec1(ParseCtx *ctx, void *first) {
  PtrVec *v = arena_alloc(ctx->arena, sizeof *v);
  ptrvec_push(ctx->arena, v, first);
  return v;
}

static PtrVec *vec_push(ParseCtx *ctx, PtrVec *v, void *item) {
  if (!v) v = arena_alloc(ctx->arena, sizeof *v);
  ptrvec_push(ctx->arena, v, item);
  return v;
}

static int too_deep(ParseCtx *ctx, const AstExpr *e, Span at) {
  if (e->depth <= AST_MAX_DEPTH) return 0;
  diag_error(ctx->diag, at, "expression nested deeper than %d levels", AST_MAX_DEPTH);
  diag_hint(ctx->diag, "split it into named steps");
  ctx->too_deep = 1;
  return 1;
}

static void hpdyyerror(Span *loc, void *scanner, ParseCtx *ctx, const char *msg) {
  (void)scanner;
  if (ctx->too_deep) return;
  if (!strcmp(msg, "memory exhausted")) {
    /* the parser's stack: a right-nested chain such as - - - ... 1 */
    diag_error(ctx->diag, *loc, "expression nested too deeply");
    diag_hint(ctx->diag, "split it into named steps");
    ctx->too_deep = 1;
    return;
  }
  diag_error(ctx->diag, *loc, "%s", msg);
}

static const char *closer_of(char open) { return open == '(' ? "')'" : open == '[' ? "']'" : "'}'"; }

/* "unexpected X; expected A, B or C", with a note on the bracket still open
 * when its closer is among what was expected. */
/* Token kinds that start an expression: "expected an expression" reads
 * better than the list of them. */
static int starts_expression(yysymbol_kind_t k) {
  const char *name = yysymbol_name(k);
  return k == YYSYMBOL_IDENT || k == YYSYMBOL_INT || k == YYSYMBOL_FLOAT || k == YYSYMBOL_STRING || k == YYSYMBOL_TRUE ||
         k == YYSYMBOL_FALSE || k == YYSYMBOL_NOT || !strcmp(name, "'('") || !strcmp(name, "'['") || !strcmp(name, "'-'");
}

static int yyreport_syntax_error(const yypcontext_t *yyctx, void *scanner, ParseCtx *ctx) {
  (void)scanner;
  if (ctx->too_deep) return 0;
  /* right after a lexical error this would only echo it */
  if (ctx->tokens_since_lex_error <= 1) return 0;
  enum { MAX_SHOWN = 6 };
  yysymbol_kind_t expected[YYNTOKENS];
  int n = yypcontext_expected_tokens(yyctx, expected, YYNTOKENS);
  yysymbol_kind_t got = yypcontext_token(yyctx);
  const Span *loc = yypcontext_location(yyctx);
  char what[128];
  if (got == YYSYMBOL_YYEOF)
    snprintf(what, sizeof what, "end of file");
  else if (got == YYSYMBOL_IDENT || got == YYSYMBOL_INT || got == YYSYMBOL_FLOAT || got == YYSYMBOL_STRING)
    snprintf(what, sizeof what, "%s '%s'", yysymbol_name(got), ctx->tok_text);
  else if (got == YYSYMBOL_YYUNDEF)
    snprintf(what, sizeof what, "'%s'", ctx->tok_text);
  else
    snprintf(what, sizeof what, "%s", yysymbol_name(got));
  /* Fold the tokens that start an expression into "an expression" (when a
   * literal would do, not just a name), and the declaration keywords into
   * "a declaration". */
  int want_literal = 0, want_decl = 0;
  for (int i = 0; i < n; i++) {
    want_literal |= expected[i] == YYSYMBOL_INT;
    want_decl |= expected[i] == YYSYMBOL_IMPORT;
  }
  const char *items[YYNTOKENS];
  int nitems = 0, expr = 0, decl = 0;
  for (int i = 0; i < n; i++) {
    yysymbol_kind_t k = expected[i];
    int is_decl = k == YYSYMBOL_IMPORT || k == YYSYMBOL_LAYER || k == YYSYMBOL_MODEL || k == YYSYMBOL_TRAIN ||
                  k == YYSYMBOL_PARALLEL || k == YYSYMBOL_CLUSTER || k == YYSYMBOL_EXTERN || k == YYSYMBOL_YYEOF;
    if (want_literal && starts_expression(k)) {
      if (!expr) items[nitems++] = "an expression";
      expr = 1;
    } else if (want_decl && is_decl) {
      if (!decl) items[nitems++] = "a declaration (import, layer, model, train, parallel, cluster or extern)";
      decl = 1;
    } else {
      items[nitems++] = yysymbol_name(k);
    }
  }
  char list[512] = "";
  size_t len = 0;
  int shown = nitems > MAX_SHOWN + 1 ? MAX_SHOWN : nitems;
  for (int i = 0; i < shown; i++) {
    const char *sep = i == 0 ? "" : (i == nitems - 1) ? " or " : ", ";
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", sep, items[i]);
  }
  if (shown < nitems) snprintf(list + len, sizeof list - len, " or one of %d other tokens", nitems - shown);
  if (n > 0)
    diag_error(ctx->diag, *loc, "unexpected %s; expected %s", what, list);
  else
    diag_error(ctx->diag, *loc, "unexpected %s", what);
  if (ctx->nbrackets > 0) {
    OpenBracket *ob = &ctx->brackets[ctx->nbrackets - 1];
    const char *closer = closer_of(ob->ch);
    int wanted = 0;
    for (int i = 0; i < n; i++)
      if (strcmp(yysymbol_name(expected[i]), closer) == 0) wanted = 1;
    if (wanted || got == YYSYMBOL_YYEOF) diag_note(ctx->diag, ob->at, "to match this '%c'", ob->ch);
  }
  return 0;
}
