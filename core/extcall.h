/* extcall.h - calls of the native functions `extern` declarations name.
 *
 * The calling convention (docs/language.md, "Extern"): for an extern with
 * arguments a0..aN and dimension names d1..dK (in order of first appearance
 * in the parameter list), the forward is
 *   void symbol(const float *a0, ..., const float *aN, float *out, int64_t d1, ..., int64_t dK)
 * and the gradient
 *   void grad(const float *a0, ..., const float *aN, const float *dout,
 *             float *da0, ..., float *daN, int64_t d1, ..., int64_t dK)
 * with the d-buffers zeroed before the call. The signature depends on the
 * declaration, so the call goes through libffi. Both the reference executor
 * (interp.c) and the runtime's hook for generated code (program_exec.c)
 * call through here; `hpdlc compile` opens the table to check it. */
#ifndef HPDL_EXTCALL_H
#define HPDL_EXTCALL_H

#include <stddef.h>

#include "arena.h"
#include "ir.h"

typedef struct ExtCalls ExtCalls;

/* Loads the library of every entry (dlopen RTLD_NOW | RTLD_LOCAL of
 * IrExtern.path) and finds its functions. NULL with the reason in err,
 * naming the extern and where it is declared. */
ExtCalls *extcall_open(const IrExtern *ext, int n, char *err, size_t errlen);
void extcall_close(ExtCalls *x);

/* An artifact's externs: a path with a slash (not absolute) names the artifact's copy
 * and is made relative to its folder `dir` (rewritten in place, the strings in arena),
 * a bare name is found on the dlopen search path; then extcall_open. NULL with the
 * reason in err; NULL and no error (err empty) when there is no extern. */
ExtCalls *extcall_open_artifact(IrExtern *ext, int n, const char *dir, Arena *arena, char *err, size_t errlen);

/* Loads one entry's library and looks up its functions, then lets go:
 * hpdlc compile's check. 0; -1 when the library does not load, -2 when
 * it has no such function, with the reason alone in why. */
int extcall_check(const IrExtern *e, char *why, size_t n);

/* Entry `index`'s forward; bufs: the arguments, then the result. 0, or -1
 * with the reason in err. */
int extcall_forward(ExtCalls *x, int index, void *const *bufs, char *err, size_t errlen);

/* Entry `index`'s gradient; bufs: the arguments, the result's gradient, then
 * one buffer for the arguments' gradients, concatenated in argument order
 * (EXTERN_GRAD's layout), which this zeroes before the call. */
int extcall_grad(ExtCalls *x, int index, void *const *bufs, char *err, size_t errlen);

#endif
