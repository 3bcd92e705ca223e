/* loader.h - reads a .hpd file and everything it imports.
 *
 * Import search path: the importing file's folder, then the standard library
 * (`import "std/nn"` names the standard library only). Absolute paths and
 * `..` are refused, so nothing else on disk is reachable from a .hpd file. */
#ifndef HPDL_LOADER_H
#define HPDL_LOADER_H

#include "arena.h"
#include "ast.h"
#include "diag.h"

/* Files larger than this are refused with an error instead of being read. */
enum { LOAD_MAX_FILE_BYTES = 64 * 1024 * 1024 };
/* A program's imports: at most this deep a chain, and this many files. */
enum { LOAD_MAX_IMPORT_DEPTH = 256, LOAD_MAX_FILES = 4096 };

typedef struct {
  AstFile **files; /* the root first, then imports in load order */
  int nfiles;
} LoadedProgram;

/* Directory of the standard library: $HPDL_STDLIB, else the build-time path,
 * else `stdlib/` beside the executable's parent folder. */
const char *load_stdlib_dir(void);

/* Loads `path` and its imports. Errors (missing files, cycles, syntax) go to
 * diag; the result holds every file that could be parsed. */
LoadedProgram load_program(Arena *arena, Diag *diag, const char *path);

/* Reads a whole file into the arena; NULL with errno set on failure.
 * Refuses (errno = EFBIG) files above LOAD_MAX_FILE_BYTES. */
char *load_read_file(Arena *arena, const char *path, size_t *len);

#endif
