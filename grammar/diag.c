/* diag.c - diagnostics with source excerpts. */
#include "diag.h"
#include "xalloc.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { DIAG_MAX_ERRORS = 50, DIAG_LINE_WINDOW = 120 };

typedef struct {
  char *path;
  char *text;
  size_t len;
  size_t *line_starts; /* computed lazily */
  int nlines;
} SrcFile;

struct Diag {
  FILE *out;
  SrcFile *files;
  int nfiles, capfiles;
  int errors, printed_errors;
  int suppress; /* the last error was suppressed: drop its notes too */
  int color;
  char last[256]; /* the newest error's message, printed or not (diag_last_error) */
};

Diag *diag_new(FILE *out) {
  Diag *d = calloc(1, sizeof *d);
  if (!d) exit(3);
  d->out = out;
  return d;
}

void diag_free(Diag *d) {
  if (!d) return;
  for (int i = 0; i < d->nfiles; i++) {
    free(d->files[i].path);
    free(d->files[i].text);
    free(d->files[i].line_starts);
  }
  free(d->files);
  free(d);
}

void diag_set_color(Diag *d, int on) { d->color = on; }

int diag_add_file(Diag *d, const char *path, const char *text, size_t len) {
  if (d->nfiles == d->capfiles) {
    d->capfiles = d->capfiles ? d->capfiles * 2 : 8;
    d->files = xalloc_realloc(d->files, sizeof(SrcFile) * (size_t)d->capfiles);
  }
  SrcFile *f = &d->files[d->nfiles];
  memset(f, 0, sizeof *f);
  f->path = strdup(path);
  f->text = xalloc_realloc(NULL, len + 1);
  memcpy(f->text, text, len);
  f->text[len] = '\0';
  f->len = len;
  return d->nfiles++;
}

const char *diag_file_path(const Diag *d, int file) {
  return file >= 0 && file < d->nfiles ? d->files[file].path : "<command line>";
}

int diag_file_count(const Diag *d) { return d->nfiles; }

const char *diag_file_text(const Diag *d, int file, size_t *len) {
  if (file < 0 || file >= d->nfiles) return NULL;
  if (len) *len = d->files[file].len;
  return d->files[file].text;
}

static void index_lines(SrcFile *f) {
  if (f->line_starts) return;
  int n = 1;
  for (size_t i = 0; i < f->len; i++)
    if (f->text[i] == '\n') n++;
  f->line_starts = xalloc_realloc(NULL, sizeof(size_t) * (size_t)(n + 1));
  int k = 0;
  f->line_starts[k++] = 0;
  for (size_t i = 0; i < f->len; i++)
    if (f->text[i] == '\n') f->line_starts[k++] = i + 1;
  f->line_starts[k] = f->len + 1;
  f->nlines = n;
}

/* Display width of one byte of a line: continuation bytes of UTF-8 take no
 * column, a tab takes one (it is printed as a space). */
static int byte_width(unsigned char c) { return (c & 0xC0) == 0x80 ? 0 : 1; }

static void put_sanitized(FILE *out, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\t') fputc(' ', out);
    else if (c < 0x20 || c == 0x7f) fputc('?', out);
    else if (c >= 0x80) {
      /* print well-formed UTF-8 as is, anything else as '?' */
      int need = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
      int ok = need > 0 && i + (size_t)need < n;
      for (int k = 1; ok && k <= need; k++)
        if (((unsigned char)s[i + (size_t)k] & 0xC0) != 0x80) ok = 0;
      if (ok) {
        fwrite(s + i, 1, (size_t)need + 1, out);
        i += (size_t)need;
      } else {
        fputc('?', out);
      }
    } else fputc(c, out);
  }
}

static void print_excerpt(Diag *d, Span at) {
  if (at.file < 0 || at.file >= d->nfiles || at.line <= 0) return;
  SrcFile *f = &d->files[at.file];
  index_lines(f);
  if (at.line > f->nlines) return;
  size_t start = f->line_starts[at.line - 1];
  size_t end = f->line_starts[at.line] - 1; /* the '\n' or len */
  if (end > f->len) end = f->len;
  size_t len = end - start;
  if (len && f->text[start + len - 1] == '\r') len--;
  size_t col0 = at.col > 0 ? (size_t)at.col - 1 : 0;
  if (col0 > len) col0 = len;
  size_t col1 = (at.end_line == at.line && at.end_col >= at.col) ? (size_t)at.end_col : col0 + 1;
  if (col1 > len) col1 = len > col0 ? len : col0 + 1;
  /* Long lines (a 10 MB one-liner) are cut to a window around the column. */
  size_t from = 0, to = len;
  if (len > DIAG_LINE_WINDOW) {
    from = col0 > DIAG_LINE_WINDOW / 2 ? col0 - DIAG_LINE_WINDOW / 2 : 0;
    while (from > 0 && byte_width((unsigned char)f->text[start + from]) == 0) from--;
    to = from + DIAG_LINE_WINDOW;
    if (to > len) to = len;
    if (col1 > to) col1 = to > col0 ? to : col0 + 1;
  }
  char gutter[32];
  int gw = snprintf(gutter, sizeof gutter, "%5d", at.line);
  fprintf(d->out, "%s | %s", gutter, from > 0 ? "..." : "");
  put_sanitized(d->out, f->text + start + from, to - from);
  fprintf(d->out, "%s\n", to < len ? "..." : "");
  fprintf(d->out, "%*s | %s", gw, "", from > 0 ? "   " : "");
  int pad = 0;
  for (size_t i = from; i < col0; i++) pad += byte_width((unsigned char)f->text[start + i]);
  fprintf(d->out, "%*s", pad, "");
  if (d->color) fputs("\033[1;32m", d->out);
  fputc('^', d->out);
  for (size_t i = col0 + 1; i < col1; i++)
    if (byte_width((unsigned char)f->text[start + i])) fputc('~', d->out);
  if (d->color) fputs("\033[0m", d->out);
  fputc('\n', d->out);
}

static void vreport(Diag *d, Span at, const char *kind, const char *color, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static void vreport(Diag *d, Span at, const char *kind, const char *color, const char *fmt,
                    va_list ap) {
  if (at.file >= 0)
    fprintf(d->out, "%s:%d:%d: ", diag_file_path(d, at.file), at.line, at.col);
  else
    fprintf(d->out, "hpdlc: ");
  if (d->color) fprintf(d->out, "\033[1;%sm%s:\033[0m ", color, kind);
  else fprintf(d->out, "%s: ", kind);
  vfprintf(d->out, fmt, ap);
  fputc('\n', d->out);
  print_excerpt(d, at);
}

void diag_error(Diag *d, Span at, const char *fmt, ...) {
  d->errors++;
  va_list keep;
  va_start(keep, fmt);
  vsnprintf(d->last, sizeof d->last, fmt, keep);
  va_end(keep);
  if (d->printed_errors >= DIAG_MAX_ERRORS) {
    if (d->printed_errors == DIAG_MAX_ERRORS) {
      fprintf(d->out, "hpdlc: too many errors; stopping here\n");
      d->printed_errors++;
    }
    d->suppress = 1;
    return;
  }
  d->printed_errors++;
  d->suppress = 0;
  va_list ap;
  va_start(ap, fmt);
  vreport(d, at, "error", "31", fmt, ap);
  va_end(ap);
}

void diag_warning(Diag *d, Span at, const char *fmt, ...) {
  if (d->printed_errors >= DIAG_MAX_ERRORS) return;
  d->suppress = 0;
  va_list ap;
  va_start(ap, fmt);
  vreport(d, at, "warning", "35", fmt, ap);
  va_end(ap);
}

void diag_note(Diag *d, Span at, const char *fmt, ...) {
  if (d->suppress) return;
  va_list ap;
  va_start(ap, fmt);
  vreport(d, at, "note", "36", fmt, ap);
  va_end(ap);
}

void diag_hint(Diag *d, const char *fmt, ...) {
  if (d->suppress) return;
  fprintf(d->out, "%s", d->color ? "\033[1;36mhint:\033[0m " : "hint: ");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(d->out, fmt, ap);
  va_end(ap);
  fputc('\n', d->out);
}

const char *diag_last_error(const Diag *d) { return d->errors ? d->last : NULL; }

int diag_error_count(const Diag *d) { return d->errors; }
int diag_saturated(const Diag *d) { return d->printed_errors >= DIAG_MAX_ERRORS; }

static int edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return 1000;
  /* Damerau-Levenshtein (optimal string alignment): a swap of two
   * neighbours ("f23" for "f32") counts as one edit. */
  int d[65][65];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int v = d[i - 1][j - 1] + cost;
      if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v) v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  }
  return d[la][lb];
}

const char *diag_closest(const char *name, const char *const *candidates, int n) {
  const char *best = NULL;
  int best_d = 1000;
  for (int i = 0; i < n; i++) {
    if (!candidates[i] || strcmp(candidates[i], name) == 0) continue;
    int dist = edit_distance(name, candidates[i]);
    if (dist < best_d) {
      best_d = dist;
      best = candidates[i];
    }
  }
  size_t len = strlen(name);
  int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  return best_d <= limit ? best : NULL;
}
