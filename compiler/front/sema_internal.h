/* sema_internal.h - what the files of semantic analysis share: the Sema
 * context and the types of its bindings, layers and settings, and the
 * functions one file calls in another. sema.c holds the shared helpers and the
 * entry, sema_eval.c compile-time evaluation, sema_layer.c layer instantiation,
 * sema_expr.c forward checking, sema_blocks.c the train / parallel / cluster
 * blocks; not part of the sema.h API. */
#ifndef HPDL_SEMA_INTERNAL_H
#define HPDL_SEMA_INTERNAL_H

#include <stdint.h>

#include "sema.h"
#include "strmap.h"

/* ------------------------------------------------------------------ */
/* tables (sema.c)                                                     */

typedef struct {
  const char *name;
  int min_args, max_args;
} BuiltinInfo;

extern const BuiltinInfo sema_builtins[]; /* by SemOp */

int sema_find_builtin(const char *name);
int sema_is_unary_elementwise(SemOp op);

/* ------------------------------------------------------------------ */
/* context (sema.c)                                                    */

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

void sema_error(Sema *S, Span at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Source-like text of an expression, for messages. */
const char *sema_expr_text(Sema *S, const AstExpr *e);
Binding *sema_bind(Sema *S, Binding **env, const char *name, BindKind kind, Span span);
Binding *sema_lookup(Binding *env, const char *name);
/* Closest bound name or builtin, for "did you mean" hints. */
const char *sema_suggest(Sema *S, Binding *env, const char *name, int with_builtins);
const AstDecl *sema_find_decl(Sema *S, const char *name, int kind_mask);
const char *sema_suggest_decl(Sema *S, const char *name, int kind_mask);

#define DECL_CALLABLE ((1 << DECL_LAYER) | (1 << DECL_MODEL) | (1 << DECL_EXTERN))

Value sema_none_value(Span at);
Value sema_int_value(int64_t i, Span at);
Value sema_float_value(double f, Span at);
Value sema_bool_value(int b, Span at);

/* ------------------------------------------------------------------ */
/* compile-time evaluation (sema_eval.c)                               */

int sema_checked_add(int64_t a, int64_t b, int64_t *r);
int sema_checked_mul(int64_t a, int64_t b, int64_t *r);
/* The parameters of a child, over its copies (INT64_MAX: overflow). */
int64_t sema_child_params(const SemChild *c);
/* An unknown word where a number was wanted is most often a typo of a name. */
void sema_hint_for_word(Sema *S, Binding *env, const Value *v);
Value sema_eval_const(Sema *S, Binding *env, const AstExpr *e);
/* Evaluates to an int or reports what it got. */
int sema_eval_int(Sema *S, Binding *env, const AstExpr *e, const char *what, int64_t *out);

/* ------------------------------------------------------------------ */
/* layer instantiation (sema_layer.c)                                  */

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

const char *sema_type_name_of(const Value *v);
/* Converts `v` to the declared parameter type; reports a mismatch. */
int sema_coerce_param(Sema *S, const AstParam *p, Value *v, Binding *env, Span at);
/* Checks a declaration's parameter list once; later calls return the verdict. */
int sema_check_param_types(Sema *S, const AstDecl *decl);
int sema_parse_dtype(Sema *S, const AstType *t, DType *out);
int sema_is_layer_instantiation(Sema *S, const AstExpr *v);
SemLayer *sema_instantiate_with(Sema *S, const AstDecl *decl, Value *vals, Binding *param_env, Span site);

/* ------------------------------------------------------------------ */
/* forward checking (sema_expr.c)                                      */

SemFunc *sema_check_forward(Sema *S, SemLayer *layer, SemExpr **args, int nargs, Span site);

/* ------------------------------------------------------------------ */
/* train, parallel and cluster blocks (sema_blocks.c)                  */

typedef enum { K_INT, K_FLOAT, K_BOOL, K_STRING, K_WORD, K_SPEC, K_BLOCK, K_BYTES_PER_S, K_SECONDS, K_ONOFF, K_BYTES, K_FLOPS } KeyKind;

typedef struct {
  const char *key;
  KeyKind kind;
  const char *const *words; /* K_WORD / K_SPEC: the accepted names, NULL-terminated */
  int allow_auto;
} KeySpec;

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

Setting *sema_setting_get(Settings *s, const char *key);
const char *sema_words_list(Sema *S, const char *const *words);
void sema_read_settings(Sema *S, const AstSettings *src, const KeySpec *keys, int nkeys, Settings *out, const char *block);
void sema_read_train(Sema *S, SemModel *m, const AstDecl *decl, Settings *out);
int sema_read_cluster_decl(Sema *S, const AstDecl *decl, SemCluster *c);
void sema_read_layout(Sema *S, SemModel *m, const AstDecl *decl, Settings *ts);
/* The train and parallel blocks are read even when the model has errors, so
 * one run reports the mistakes of every block. */
void sema_check_blocks_only(Sema *S, SemModel *m, const AstDecl *train, const AstDecl *parallel);

#endif
