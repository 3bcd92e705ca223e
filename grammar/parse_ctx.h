/* parse_ctx.h - state shared by the scanner and the parser (internal). */
#ifndef HPDL_PARSE_CTX_H
#define HPDL_PARSE_CTX_H

#include "arena.h"
#include "ast.h"
#include "diag.h"

enum { PARSE_MAX_NESTING = 200 };

typedef struct {
  char ch;   /* '(' '[' '{' */
  Span at;
} OpenBracket;

typedef struct {
  Arena *arena;
  Diag *diag;
  int file;
  PtrVec decls;
  /* scanner position (1-based) */
  int line, col;
  /* open brackets, for "to match '(' at 3:5" notes and the nesting limit */
  OpenBracket brackets[PARSE_MAX_NESTING];
  int nbrackets;
  int too_deep; /* nesting limit hit: stop parsing */
  char tok_text[48]; /* text of the last token, for syntax errors */
  int tokens_since_lex_error; /* a syntax error right after a lexical one is its echo */
  int decl_start_line;        /* line of the last declaration keyword at depth 0 */
  int tok_line, tok_col;      /* where the last token starts */
} ParseCtx;

#endif
