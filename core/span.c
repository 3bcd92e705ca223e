/* span.c - "no location" and the join of two spans (span.h). */
#include "span.h"

const Span span_none = {-1, 0, 0, 0, 0};

Span span_join(Span a, Span b) {
  if (a.file < 0) return b;
  if (b.file < 0 || b.file != a.file) return a;
  Span s = a;
  s.end_line = b.end_line;
  s.end_col = b.end_col;
  return s;
}
