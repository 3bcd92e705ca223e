/* parse.h - the front door of the grammar: text in, syntax tree out. */
#ifndef HPDL_PARSE_H
#define HPDL_PARSE_H

#include "arena.h"
#include "ast.h"
#include "diag.h"

/* Parses the text of a file registered in `diag` as `file`. Syntax errors go
 * to `diag`; the returned tree holds whatever parsed (never NULL). */
AstFile *parse_file(Arena *arena, Diag *diag, int file);

#endif
