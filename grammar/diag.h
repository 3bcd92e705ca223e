/* diag.h - source files and diagnostics.
 *
 * Every diagnostic is `file:line:col: error: message`, then the source line
 * with a caret/underline under the span, then optional notes (pointing at the
 * other end of a mismatch) and a hint. Errors accumulate; a phase reports all
 * of its errors and the driver stops after the phase. */
#ifndef HPDL_DIAG_H
#define HPDL_DIAG_H

#include <stdio.h>

#include "span.h" /* Span, span_none, span_join */

typedef struct Diag Diag;

Diag *diag_new(FILE *out);
void diag_free(Diag *d);

/* Registers a file's text (copied) and returns its id. */
int diag_add_file(Diag *d, const char *path, const char *text, size_t len);
const char *diag_file_path(const Diag *d, int file);
int diag_file_count(const Diag *d);
const char *diag_file_text(const Diag *d, int file, size_t *len);

/* Emits `error: fmt` at span. A note or hint attaches to the last error. */
void diag_error(Diag *d, Span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void diag_warning(Diag *d, Span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void diag_note(Diag *d, Span at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void diag_hint(Diag *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

int diag_error_count(const Diag *d);
/* The newest error's message (without its place), printed or not (a quiet
 * sink's, the planner's); NULL before the first. */
const char *diag_last_error(const Diag *d);
/* True once so many errors were printed that further ones are suppressed. */
int diag_saturated(const Diag *d);
void diag_set_color(Diag *d, int on);

/* The candidate closest to `name` by edit distance, or NULL when none is
 * close enough to be a likely typo. */
const char *diag_closest(const char *name, const char *const *candidates, int n);

#endif
