/* extcall.c - native extern functions through dlopen and libffi (see extcall.h). */
#include "extcall.h"

#include <dlfcn.h>
#include <ffi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  void *fn;
  ffi_cif cif;
  ffi_type **types;
  int nptr; /* pointer arguments before the dimensions */
} Fn;

typedef struct {
  const IrExtern *e;
  void *lib;
  Fn fwd, grad; /* grad.fn NULL: none */
  int64_t *arg_at; /* element offset of each argument's gradient in the concatenated buffer */
  int64_t grad_numel;
} Entry;

struct ExtCalls {
  Entry *entries;
  int n;
};

static int errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && n) vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return -1;
}

/* A cif for nptr pointers and the entry's dimensions, void result. */
static int prep(Fn *f, int nptr, int ndims) {
  f->nptr = nptr;
  f->types = calloc((size_t)(nptr + ndims + 1), sizeof(ffi_type *));
  if (!f->types) return -1;
  for (int i = 0; i < nptr; i++) f->types[i] = &ffi_type_pointer;
  for (int i = 0; i < ndims; i++) f->types[nptr + i] = &ffi_type_sint64;
  return ffi_prep_cif(&f->cif, FFI_DEFAULT_ABI, (unsigned)(nptr + ndims), &ffi_type_void, f->types) == FFI_OK ? 0 : -1;
}

/* why: the reason alone (callers put the extern's name in front). */
static int find(Entry *x, Fn *f, const char *symbol, char *why, size_t n) {
  dlerror();
  f->fn = dlsym(x->lib, symbol);
  if (!f->fn) return errf(why, n, "library %s has no function %s", x->e->path, symbol);
  return 0;
}

static void entry_close(Entry *en) {
  free(en->fwd.types);
  free(en->grad.types);
  free(en->arg_at);
  if (en->lib) dlclose(en->lib);
  memset(en, 0, sizeof *en);
}

/* Loads one entry's library and functions and prepares the calls. */
static int entry_open(Entry *en, const IrExtern *e, char *why, size_t n) {
  memset(en, 0, sizeof *en);
  en->e = e;
  en->lib = dlopen(e->path, RTLD_NOW | RTLD_LOCAL);
  if (!en->lib) {
    const char *msg = dlerror();
    size_t k = strlen(e->path); /* dlerror names the path first: say it once */
    if (msg && !strncmp(msg, e->path, k) && !strncmp(msg + k, ": ", 2)) msg += k + 2;
    return errf(why, n, "cannot load library %s: %s", e->path, msg ? msg : "?");
  }
  if (find(en, &en->fwd, e->symbol, why, n) < 0 || (e->grad && find(en, &en->grad, e->grad, why, n) < 0)) return -1;
  en->arg_at = calloc((size_t)e->nargs + 1, sizeof(int64_t));
  if (!en->arg_at || prep(&en->fwd, e->nargs + 1, e->ndims) < 0 || (e->grad && prep(&en->grad, 2 * e->nargs + 1, e->ndims) < 0))
    return errf(why, n, "cannot prepare the call (libffi)");
  for (int k = 0; k < e->nargs; k++) {
    en->arg_at[k] = en->grad_numel;
    en->grad_numel += ir_extern_numel(&e->args[k]);
  }
  return 0;
}

int extcall_check(const IrExtern *e, char *why, size_t n) {
  Entry en;
  int rc = entry_open(&en, e, why, n);
  if (rc < 0 && en.lib) rc = -2;
  entry_close(&en);
  return rc;
}

ExtCalls *extcall_open(const IrExtern *ext, int n, char *err, size_t errlen) {
  ExtCalls *x = calloc(1, sizeof *x);
  if (!x || !(x->entries = calloc((size_t)(n > 0 ? n : 1), sizeof(Entry)))) {
    free(x);
    errf(err, errlen, "out of memory loading the extern functions");
    return NULL;
  }
  x->n = n;
  for (int i = 0; i < n; i++) {
    char why[1024];
    if (entry_open(&x->entries[i], &ext[i], why, sizeof why) < 0) {
      errf(err, errlen, "extern %s (declared at %s): %s", ext[i].name, ext[i].where, why);
      extcall_close(x);
      return NULL;
    }
  }
  return x;
}

void extcall_close(ExtCalls *x) {
  if (!x) return;
  for (int i = 0; i < x->n; i++) entry_close(&x->entries[i]);
  free(x->entries);
  free(x);
}

/* ptrs[0..nptr) then the dimensions, through the entry's cif. */
static void call(const Entry *en, const Fn *f, void **ptrs) {
  int na = f->nptr + en->e->ndims;
  void **values = calloc((size_t)na + 1, sizeof(void *));
  int64_t *dims = calloc((size_t)en->e->ndims + 1, sizeof(int64_t));
  if (!values || !dims) abort();
  for (int i = 0; i < f->nptr; i++) values[i] = &ptrs[i];
  for (int i = 0; i < en->e->ndims; i++) {
    dims[i] = en->e->dims[i];
    values[f->nptr + i] = &dims[i];
  }
  ffi_call((ffi_cif *)&f->cif, FFI_FN(f->fn), NULL, values);
  free(values);
  free(dims);
}

static Entry *entry(ExtCalls *x, int index, char *err, size_t errlen) {
  if (!x || index < 0 || index >= x->n) {
    errf(err, errlen, "extern call of an unknown function #%d", index);
    return NULL;
  }
  return &x->entries[index];
}

int extcall_forward(ExtCalls *x, int index, void *const *bufs, char *err, size_t errlen) {
  Entry *en = entry(x, index, err, errlen);
  if (!en) return -1;
  void **ptrs = calloc((size_t)en->fwd.nptr + 1, sizeof(void *));
  if (!ptrs) return errf(err, errlen, "out of memory");
  memcpy(ptrs, bufs, sizeof(void *) * (size_t)en->fwd.nptr);
  call(en, &en->fwd, ptrs);
  free(ptrs);
  return 0;
}

int extcall_grad(ExtCalls *x, int index, void *const *bufs, char *err, size_t errlen) {
  Entry *en = entry(x, index, err, errlen);
  if (!en) return -1;
  if (!en->grad.fn) return errf(err, errlen, "extern %s (declared at %s) has no gradient function", en->e->name, en->e->where);
  int na = en->e->nargs;
  float *dflat = bufs[na + 1];
  memset(dflat, 0, sizeof(float) * (size_t)en->grad_numel);
  void **ptrs = calloc((size_t)en->grad.nptr + 1, sizeof(void *));
  if (!ptrs) return errf(err, errlen, "out of memory");
  memcpy(ptrs, bufs, sizeof(void *) * (size_t)(na + 1));
  for (int k = 0; k < na; k++) ptrs[na + 1 + k] = dflat + en->arg_at[k];
  call(en, &en->grad, ptrs);
  free(ptrs);
  return 0;
}

ExtCalls *extcall_open_artifact(IrExtern *ext, int n, const char *dir, Arena *arena, char *err, size_t errlen) {
  if (errlen) err[0] = '\0';
  if (n <= 0) return NULL;
  for (int i = 0; i < n; i++)
    if (strchr(ext[i].path, '/') && ext[i].path[0] != '/') ext[i].path = arena_printf(arena, "%s/%s", dir, ext[i].path);
  return extcall_open(ext, n, err, errlen);
}
