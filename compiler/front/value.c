/* value.c - compile-time values. */
#include "value.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *val_kind_name(ValKind k) {
  static const char *const names[] = {"nothing", "int", "float", "bool", "string",
                                      "word",    "tuple", "list", "call"};
  return names[k];
}

static void append(Arena *a, char **buf, const char *s) {
  *buf = *buf ? arena_printf(a, "%s%s", *buf, s) : arena_strdup(a, s);
}

const char *val_str(Arena *a, const Value *v) {
  switch (v->kind) {
  case VAL_NONE: return "?";
  case VAL_INT: return arena_printf(a, "%" PRId64, v->i);
  case VAL_FLOAT: {
    char buf[64];
    snprintf(buf, sizeof buf, "%.10g", v->f);
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    return arena_strdup(a, buf);
  }
  case VAL_BOOL: return v->b ? "true" : "false";
  case VAL_STRING: return arena_printf(a, "\"%s\"", v->s);
  case VAL_ATOM: return v->s;
  case VAL_TUPLE:
  case VAL_LIST:
  case VAL_CALL: {
    char *buf = NULL;
    append(a, &buf, v->kind == VAL_CALL ? arena_printf(a, "%s(", v->s) : v->kind == VAL_TUPLE ? "(" : "[");
    for (int i = 0; i < v->n; i++) {
      if (i) append(a, &buf, ", ");
      if (v->keys && v->keys[i]) append(a, &buf, arena_printf(a, "%s = ", v->keys[i]));
      append(a, &buf, val_str(a, &v->items[i]));
    }
    append(a, &buf, v->kind == VAL_LIST ? "]" : ")");
    return buf;
  }
  }
  return "?";
}

int val_equal(const Value *x, const Value *y) {
  if (x->kind != y->kind) {
    double a, b;
    if (val_as_float(x, &a) && val_as_float(y, &b) &&
        (x->kind == VAL_INT || x->kind == VAL_FLOAT) && (y->kind == VAL_INT || y->kind == VAL_FLOAT))
      return a == b;
    return 0;
  }
  switch (x->kind) {
  case VAL_NONE: return 1;
  case VAL_INT: return x->i == y->i;
  case VAL_FLOAT: return x->f == y->f;
  case VAL_BOOL: return x->b == y->b;
  case VAL_STRING:
  case VAL_ATOM: return strcmp(x->s, y->s) == 0;
  case VAL_TUPLE:
  case VAL_LIST:
  case VAL_CALL:
    if (x->n != y->n) return 0;
    if (x->kind == VAL_CALL && strcmp(x->s, y->s) != 0) return 0;
    for (int i = 0; i < x->n; i++) {
      const char *kx = x->keys ? x->keys[i] : NULL, *ky = y->keys ? y->keys[i] : NULL;
      if ((kx == NULL) != (ky == NULL) || (kx && strcmp(kx, ky) != 0)) return 0;
      if (!val_equal(&x->items[i], &y->items[i])) return 0;
    }
    return 1;
  }
  return 0;
}

int val_as_int(const Value *v, int64_t *out) {
  if (v->kind == VAL_INT) {
    *out = v->i;
    return 1;
  }
  if (v->kind == VAL_FLOAT && isfinite(v->f) && v->f == floor(v->f) && fabs(v->f) < 9.0e18) {
    *out = (int64_t)v->f;
    return 1;
  }
  return 0;
}

int val_as_float(const Value *v, double *out) {
  if (v->kind == VAL_INT) {
    *out = (double)v->i;
    return 1;
  }
  if (v->kind == VAL_FLOAT) {
    *out = v->f;
    return 1;
  }
  return 0;
}

const char *val_as_word(const Value *v) {
  return v->kind == VAL_STRING || v->kind == VAL_ATOM ? v->s : NULL;
}

Value val_parse_literal(Arena *a, const char *text) {
  Value v;
  memset(&v, 0, sizeof v);
  v.span = span_none;
  char *end;
  errno = 0;
  long long iv = strtoll(text, &end, 10);
  if (*text && !*end && errno == 0) {
    v.kind = VAL_INT;
    v.i = iv;
    return v;
  }
  errno = 0;
  double fv = strtod(text, &end);
  if (*text && !*end && errno == 0 && isfinite(fv)) {
    v.kind = VAL_FLOAT;
    v.f = fv;
    return v;
  }
  if (!strcmp(text, "true") || !strcmp(text, "false")) {
    v.kind = VAL_BOOL;
    v.b = text[0] == 't';
    return v;
  }
  size_t len = strlen(text);
  if (len >= 2 && text[0] == '"' && text[len - 1] == '"') {
    v.kind = VAL_STRING;
    v.s = arena_strndup(a, text + 1, len - 2);
    return v;
  }
  v.kind = VAL_ATOM;
  v.s = arena_strdup(a, text);
  return v;
}
