/* ast.h - the syntax tree of a .hpd file, as the parser builds it.
 *
 * Nodes live in the compilation's arena and carry their source span. The
 * parser's actions are one-line calls into the builders below. */
#ifndef HPDL_AST_H
#define HPDL_AST_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"

/* Physical units a numeric literal may carry (`300GB/s`, `2us`, `80GiB`);
 * the value is stored in SI units (bytes, bytes/s, seconds, FLOP/s). */
typedef enum {
  UNIT_NONE,
  UNIT_BYTES,
  UNIT_BYTES_PER_S,
  UNIT_SECONDS,
  UNIT_FLOPS_PER_S,
} AstUnit;

typedef enum {
  EX_INT,
  EX_FLOAT,
  EX_BOOL,
  EX_STRING,
  EX_NAME,   /* identifier */
  EX_UNARY,  /* op a */
  EX_BINARY, /* a op b */
  EX_CALL,   /* callee(args) */
  EX_MEMBER, /* obj.name */
  EX_INDEX,  /* obj[items] */
  EX_SLICE,  /* lo:hi inside an index; either may be NULL */
  EX_TUPLE,  /* (a, b, ...) */
  EX_LIST,   /* [a, b, ...] */
  EX_REPEAT, /* repeat count call */
} AstExprKind;

typedef enum {
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MOD, OP_MATMUL, OP_POW,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_AND, OP_OR,
  OP_NEG, OP_NOT,
} AstOp;

const char *ast_op_text(AstOp op);

typedef struct AstExpr AstExpr;

typedef struct {
  const char *name; /* keyword argument name, NULL when positional */
  Span name_span;
  AstExpr *value;
} AstArg;

struct AstExpr {
  AstExprKind kind;
  Span span;
  int depth; /* nesting depth, bounded so tree walks cannot overflow the stack */
  union {
    int64_t ival;
    struct { double value; AstUnit unit; const char *text; } fval;
    int bval;
    const char *sval; /* EX_STRING (unescaped), EX_NAME */
    struct { AstOp op; AstExpr *a, *b; Span op_span; } op; /* unary uses a */
    struct { AstExpr *callee; AstArg *args; int nargs; } call;
    struct { AstExpr *obj; const char *name; Span name_span; } member;
    struct { AstExpr *obj; AstExpr **items; int nitems; } index;
    struct { AstExpr *lo, *hi; } slice;
    struct { AstExpr **items; int nitems; } list; /* EX_TUPLE, EX_LIST */
    struct { AstExpr *count, *call; const char *index; Span index_span; } repeat; /* index: `repeat i in N ...`, or NULL */
  } u;
};

/* A tensor type: `f32[B, T, C]`, or `[in, out]` with the dtype left to the
 * default. */
typedef struct {
  const char *dtype; /* NULL when omitted */
  Span dtype_span;
  AstExpr **dims;
  int ndims;
  Span span;
} AstType;

typedef enum {
  ST_ASSIGN,  /* names = value (in forward: a tensor; in a body: a sub-layer or constant) */
  ST_RETURN,  /* return value */
  ST_IF,      /* if cond { then } else { otherwise } */
  ST_PARAM,   /* param name : type init expr shard expr */
  ST_INPUT,   /* input name : type */
  ST_FORWARD, /* forward(args) { body } */
} AstStmtKind;

typedef struct AstStmt AstStmt;

typedef struct {
  AstStmt **items;
  int n;
} AstBlock;

typedef struct {
  const char *name;
  Span span;
} AstName;

struct AstStmt {
  AstStmtKind kind;
  Span span;
  union {
    struct { AstName *names; int nnames; AstExpr *value; } assign;
    struct { AstExpr *value; } ret;
    struct { AstExpr *cond; AstBlock then, otherwise; int has_else; } if_;
    struct { AstName name; AstType *type; AstExpr *init, *shard; } param;
    struct { AstName name; AstType *type; } input;
    struct { AstName *args; int nargs; int has_args; AstBlock body; } forward;
  } u;
};

/* A parameter of a layer, model or extern: `C: int = 768`. */
typedef struct {
  AstName name;
  const char *type_name; /* "int", "float", "bool", "string"; NULL = from default */
  Span type_span;
  AstType *tensor_type;  /* externs: the tensor type of the argument */
  AstExpr *default_value;
} AstParam;

/* `key = value` or `key { settings }` inside train / parallel / cluster /
 * extern blocks. */
typedef struct AstSetting AstSetting;
typedef struct {
  AstSetting **items;
  int n;
} AstSettings;

struct AstSetting {
  AstName key;
  AstExpr *value;     /* NULL for a nested block */
  AstSettings nested; /* for `key { ... }` */
  int is_block;
  Span span;
};

typedef enum {
  DECL_IMPORT,
  DECL_LAYER,
  DECL_MODEL,
  DECL_TRAIN,
  DECL_PARALLEL,
  DECL_CLUSTER,
  DECL_EXTERN,
} AstDeclKind;

typedef struct {
  AstDeclKind kind;
  Span span;     /* the whole declaration */
  AstName name;  /* layer / model / cluster / extern name; import path */
  AstParam *params;
  int nparams;
  int has_params; /* `model M { }` has none, `model M() { }` has an empty list */
  AstBlock body;  /* layer / model */
  AstSettings settings; /* train / parallel / cluster / extern */
  AstType *result; /* extern */
} AstDecl;

typedef struct {
  const char *path; /* as opened */
  int file;         /* Diag file id */
  AstDecl **decls;
  int ndecls;
} AstFile;

/* ---- builders (the parser's actions) ---- */
AstExpr *ast_int(Arena *a, int64_t v, Span s);
AstExpr *ast_float(Arena *a, double v, AstUnit unit, const char *text, Span s);
AstExpr *ast_bool(Arena *a, int v, Span s);
AstExpr *ast_string(Arena *a, const char *v, Span s);
AstExpr *ast_name(Arena *a, const char *v, Span s);
AstExpr *ast_unary(Arena *a, AstOp op, AstExpr *x, Span op_span);
AstExpr *ast_binary(Arena *a, AstOp op, AstExpr *x, AstExpr *y, Span op_span);
AstExpr *ast_call(Arena *a, AstExpr *callee, PtrVec *args, Span end);
AstArg *ast_arg(Arena *a, const char *name, Span name_span, AstExpr *value);
AstExpr *ast_member(Arena *a, AstExpr *obj, const char *name, Span name_span);
AstExpr *ast_index(Arena *a, AstExpr *obj, PtrVec *items, Span end);
AstExpr *ast_slice(Arena *a, AstExpr *lo, AstExpr *hi, Span s);
AstExpr *ast_tuple(Arena *a, PtrVec *items, Span s);
AstExpr *ast_list(Arena *a, PtrVec *items, Span s);
AstExpr *ast_repeat(Arena *a, AstExpr *count, AstExpr *call, Span s);
/* Sets the span of a parenthesised expression to include the parentheses. */
AstExpr *ast_paren(AstExpr *e, Span s);

AstType *ast_type(Arena *a, const char *dtype, Span dtype_span, PtrVec *dims, Span s);
AstName *ast_names(Arena *a, PtrVec *names, int *count);
AstName *ast_name_node(Arena *a, const char *name, Span s);

AstStmt *ast_assign(Arena *a, PtrVec *names, AstExpr *value, Span s);
AstStmt *ast_return(Arena *a, AstExpr *value, Span s);
AstStmt *ast_if(Arena *a, AstExpr *cond, PtrVec *then, PtrVec *otherwise, int has_else, Span s);
AstStmt *ast_param_stmt(Arena *a, AstName *name, AstType *type, AstExpr *init, AstExpr *shard,
                        Span s);
AstStmt *ast_input(Arena *a, AstName *name, AstType *type, Span s);
AstStmt *ast_forward(Arena *a, PtrVec *args, int has_args, PtrVec *body, Span s);
AstBlock ast_block(PtrVec *stmts);

AstParam *ast_param(Arena *a, AstName *name, const char *type_name, Span type_span,
                    AstType *tensor_type, AstExpr *default_value);
AstSetting *ast_setting(Arena *a, AstName *key, AstExpr *value, Span s);
AstSetting *ast_setting_block(Arena *a, AstName *key, PtrVec *nested, Span s);
AstSettings ast_settings(PtrVec *items);

AstDecl *ast_decl(Arena *a, AstDeclKind kind, Span s);
void ast_decl_set_params(Arena *a, AstDecl *d, PtrVec *params);

/* ---- printing ---- */
/* Canonical source text: parse(print(x)) prints the same again. */
void ast_print_file(FILE *out, const AstFile *f);
void ast_print_expr(FILE *out, const AstExpr *e);
/* An indented tree with node kinds and spans, for `hpdlc emit ast`. */
void ast_dump_file(FILE *out, const AstFile *f);

const char *ast_decl_kind_name(AstDeclKind k);

/* Deepest expression nesting accepted; deeper input is an error, not a crash. */
enum { AST_MAX_DEPTH = 256 };

#endif
