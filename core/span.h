/* span.h - where a thing comes from in the .hpd source.
 *
 * In the core because IR nodes, parameters and externs carry their source
 * span through every phase into the artifact's chunk files; the diagnostics
 * that print spans with their source line live in grammar/diag.h. */
#ifndef HPDL_SPAN_H
#define HPDL_SPAN_H

/* A range of source text: 1-based lines and byte columns, end inclusive. */
typedef struct {
  int file; /* index into the Diag's file table; -1 for "no location" */
  int line, col;
  int end_line, end_col;
} Span;

extern const Span span_none;

/* Span covering a..b. */
Span span_join(Span a, Span b);

#endif
