/* value.h - compile-time values: layer arguments, constants, settings. */
#ifndef HPDL_VALUE_H
#define HPDL_VALUE_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "ast.h"

typedef enum {
  VAL_NONE,   /* no value (an error was reported) */
  VAL_INT,
  VAL_FLOAT,
  VAL_BOOL,
  VAL_STRING, /* "text" */
  VAL_ATOM,   /* a bare word: gelu, column, 1f1b, auto, on */
  VAL_TUPLE,  /* (a, b) */
  VAL_LIST,   /* [a, b] */
  VAL_CALL,   /* name(args): an initialiser or optimizer spec, kept for its reader */
} ValKind;

typedef struct Value Value;
struct Value {
  ValKind kind;
  AstUnit unit; /* for VAL_FLOAT / VAL_INT from unit literals */
  int64_t i;
  double f;
  int b;
  const char *s;     /* string, atom, or call name */
  Value *items;      /* tuple / list items, call arguments */
  const char **keys; /* call: keyword of each argument, NULL when positional */
  int n;
  Span span;         /* where the value was written */
};

const char *val_kind_name(ValKind k);
/* Text in .hpd syntax: 768, 0.02, true, "x", gelu, (0.9, 0.95). */
const char *val_str(Arena *a, const Value *v);
int val_equal(const Value *x, const Value *y);
/* True for an int, or a float with an integral value. */
int val_as_int(const Value *v, int64_t *out);
int val_as_float(const Value *v, double *out);
/* String or atom text, else NULL. */
const char *val_as_word(const Value *v);

/* Parses a -D value: integer, float, true/false, a quoted string, else a word. */
Value val_parse_literal(Arena *a, const char *text);

#endif
