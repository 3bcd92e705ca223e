/* parse.c - runs the scanner and parser over one file, resuming after a
 * syntax error at the next declaration so that each broken declaration is
 * reported. */
#include "parse.h"

#include <limits.h>
#include <string.h>

#include "parse_ctx.h"
#include "parser.h"

typedef void *yyscan_t;
int hpdyylex_init_extra(ParseCtx *extra, yyscan_t *scanner);
int hpdyylex_destroy(yyscan_t scanner);
int hpdyylex(HPDYYSTYPE *lval, Span *lloc, void *scanner);
void *hpdyy_scan_bytes(const char *bytes, int len, yyscan_t scanner);

static const char *const decl_keywords[] = {"import", "layer", "model", "train",
                                            "parallel", "cluster", "extern"};

static int starts_decl(const char *p, const char *end) {
  for (size_t k = 0; k < sizeof decl_keywords / sizeof decl_keywords[0]; k++) {
    size_t n = strlen(decl_keywords[k]);
    if ((size_t)(end - p) > n && memcmp(p, decl_keywords[k], n) == 0 &&
        (p[n] == ' ' || p[n] == '\t' || p[n] == '{' || p[n] == '"'))
      return 1;
  }
  return 0;
}

static int starts_decl_word(const char *word) {
  for (size_t k = 0; k < sizeof decl_keywords / sizeof decl_keywords[0]; k++)
    if (!strcmp(word, decl_keywords[k])) return 1;
  return 0;
}

/* Offset of the first line at or after `line`, and past `after`, that starts
 * (at column 1) with a declaration keyword; len when there is none. */
static size_t resume_point(const char *text, size_t len, int line, size_t after,
                           int *resume_line) {
  int cur = 1;
  size_t i = 0;
  while (i < len) {
    if (cur >= line && i > after && starts_decl(text + i, text + len)) {
      *resume_line = cur;
      return i;
    }
    const char *nl = memchr(text + i, '\n', len - i);
    if (!nl) break;
    i = (size_t)(nl - text) + 1;
    cur++;
  }
  return len;
}

AstFile *parse_file(Arena *arena, Diag *diag, int file) {
  AstFile *out = arena_alloc(arena, sizeof *out);
  out->path = diag_file_path(diag, file);
  out->file = file;
  size_t len = 0;
  const char *text = diag_file_text(diag, file, &len);
  ParseCtx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.arena = arena;
  ctx.diag = diag;
  ctx.file = file;
  size_t offset = 0;
  int line = 1;
  while (text && offset < len && len - offset <= (size_t)0x7fffffff) {
    yyscan_t scanner;
    ctx.line = line;
    ctx.col = 1;
    ctx.nbrackets = 0;
    ctx.tokens_since_lex_error = 1000; /* no lexical error yet */
    int errors_before = diag_error_count(diag);
    hpdyylex_init_extra(&ctx, &scanner);
    hpdyy_scan_bytes(text + offset, (int)(len - offset), scanner);
    int failed = hpdyyparse(scanner, &ctx);
    if (failed && diag_error_count(diag) == errors_before) {
      /* a failed parse always says why, even when the echo rule kept quiet */
      Span at = {file, ctx.tok_line, ctx.tok_col, ctx.tok_line, ctx.tok_col};
      diag_error(diag, at, "unexpected '%s'", ctx.tok_text);
    }
    if (!failed || ctx.too_deep || diag_saturated(diag)) {
      hpdyylex_destroy(scanner);
      break;
    }
    /* Resume at the token that failed when it starts a declaration of its
     * own (the one before lacked its '}'); else past the broken one. */
    int from = ctx.tok_line;
    if (!(ctx.tok_col == 1 && starts_decl_word(ctx.tok_text))) {
      if (ctx.decl_start_line + 1 > from) from = ctx.decl_start_line + 1;
    }
    size_t next = resume_point(text, len, from, offset, &line);
    /* Scan the skipped text too, so its lexical errors are reported. */
    HPDYYSTYPE lval;
    Span lloc;
    int stop = next < len ? line : INT_MAX;
    while (ctx.line < stop && !diag_saturated(diag) && hpdyylex(&lval, &lloc, scanner) != 0) {
    }
    hpdyylex_destroy(scanner);
    if (next <= offset) break;
    offset = next;
  }
  out->ndecls = ctx.decls.len;
  out->decls = (AstDecl **)ctx.decls.items;
  return out;
}
