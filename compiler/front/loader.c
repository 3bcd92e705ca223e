/* loader.c - file reading and import resolution. */
#include "loader.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parse.h"

#ifndef HPDL_STDLIB_DIR
#define HPDL_STDLIB_DIR "stdlib"
#endif

const char *load_stdlib_dir(void) {
  const char *env = getenv("HPDL_STDLIB");
  if (env && *env) return env;
  return HPDL_STDLIB_DIR;
}

char *load_read_file(Arena *arena, const char *path, size_t *len) {
  struct stat st;
  if (stat(path, &st) != 0) return NULL;
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    return NULL;
  }
  if (st.st_size > LOAD_MAX_FILE_BYTES) {
    errno = EFBIG;
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = arena_alloc(arena, cap + 1);
  /* Read until EOF even when stat lied (pipes, /proc), within the limit. */
  for (;;) {
    if (n == cap) {
      if (cap > LOAD_MAX_FILE_BYTES) {
        fclose(f);
        errno = EFBIG;
        return NULL;
      }
      char *bigger = arena_alloc(arena, cap * 2 + 1);
      memcpy(bigger, buf, n);
      buf = bigger;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    errno = EIO;
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

typedef struct {
  Arena *arena;
  Diag *diag;
  PtrVec files;   /* AstFile* loaded */
  PtrVec paths;   /* canonical path of each loaded file */
  PtrVec stack;   /* canonical paths being loaded, for cycle detection */
} Loader;

static char *dir_of(Arena *a, const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return arena_strdup(a, ".");
  if (slash == path) return arena_strdup(a, "/");
  return arena_strndup(a, path, (size_t)(slash - path));
}

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *canonical(Arena *a, const char *path) {
  char buf[PATH_MAX];
  if (realpath(path, buf)) return arena_strdup(a, buf);
  return arena_strdup(a, path);
}

static int load_one(Loader *L, const char *path, const char *display, Span from);

static void load_imports(Loader *L, AstFile *f, const char *dir) {
  for (int i = 0; i < f->ndecls; i++) {
    AstDecl *d = f->decls[i];
    if (d->kind != DECL_IMPORT) continue;
    const char *name = d->name.name;
    Span at = d->name.span;
    if (!*name) {
      diag_error(L->diag, at, "empty import path");
      continue;
    }
    if (name[0] == '/') {
      diag_error(L->diag, at, "import of an absolute path '%s'", name);
      diag_hint(L->diag, "imports are found beside the importing file or in the standard library");
      continue;
    }
    if (strstr(name, "..") && (strncmp(name, "../", 3) == 0 || strstr(name, "/../") ||
                               strcmp(name, "..") == 0)) {
      diag_error(L->diag, at, "import path '%s' leaves the importing file's folder", name);
      diag_hint(L->diag, "imports are found beside the importing file or in the standard library");
      continue;
    }
    size_t nlen = strlen(name);
    const char *ext = nlen > 4 && strcmp(name + nlen - 4, ".hpd") == 0 ? "" : ".hpd";
    char *found = NULL, *display = NULL;
    char *local = NULL, *lib = NULL;
    if (strncmp(name, "std/", 4) == 0) {
      lib = arena_printf(L->arena, "%s/%s%s", load_stdlib_dir(), name + 4, ext);
      if (file_exists(lib)) found = lib, display = arena_printf(L->arena, "%s%s", name, ext);
    } else {
      local = strcmp(dir, ".") ? arena_printf(L->arena, "%s/%s%s", dir, name, ext) : arena_printf(L->arena, "%s%s", name, ext);
      lib = arena_printf(L->arena, "%s/%s%s", load_stdlib_dir(), name, ext);
      if (file_exists(local)) found = local, display = local;
      else if (file_exists(lib)) found = lib, display = arena_printf(L->arena, "std/%s%s", name, ext);
    }
    if (!found) {
      diag_error(L->diag, at, "cannot find module '%s'", name);
      if (local) diag_note(L->diag, span_none, "looked for %s and %s", local, lib);
      else diag_note(L->diag, span_none, "looked for %s", lib);
      continue;
    }
    /* Standard-library files are shown as std/NAME.hpd, wherever they are installed. */
    load_one(L, found, display, at);
  }
}

static int load_one(Loader *L, const char *path, const char *display, Span from) {
  char *canon = canonical(L->arena, path);
  for (int i = 0; i < L->stack.len; i++) {
    if (strcmp(L->stack.items[i], canon) == 0) {
      diag_error(L->diag, from, "import cycle");
      for (int k = i; k < L->stack.len; k++)
        diag_note(L->diag, span_none, "%s imports %s", (char *)L->stack.items[k],
                  k + 1 < L->stack.len ? (char *)L->stack.items[k + 1] : canon);
      return 0;
    }
  }
  for (int i = 0; i < L->paths.len; i++)
    if (strcmp(L->paths.items[i], canon) == 0) return 1; /* already loaded */
  /* The loader recurses once a file; a chain of imports deeper than any
   * program needs is refused before the stack runs out. */
  if (L->stack.len >= LOAD_MAX_IMPORT_DEPTH) {
    diag_error(L->diag, from, "imports nested deeper than %d files", LOAD_MAX_IMPORT_DEPTH);
    diag_note(L->diag, span_none, "%s is imported at the end of a chain that starts at %s", canon,
              (char *)L->stack.items[0]);
    diag_hint(L->diag, "import the files a program needs from fewer levels");
    return 0;
  }
  if (L->paths.len >= LOAD_MAX_FILES) {
    diag_error(L->diag, from, "the program imports more than %d files", LOAD_MAX_FILES);
    return 0;
  }
  size_t len = 0;
  char *text = load_read_file(L->arena, path, &len);
  if (!text) {
    if (errno == EFBIG)
      diag_error(L->diag, from, "%s: file larger than %d MiB", path, LOAD_MAX_FILE_BYTES >> 20);
    else
      diag_error(L->diag, from, "cannot read %s: %s", path, strerror(errno));
    return 0;
  }
  int file = diag_add_file(L->diag, display, text, len);
  ptrvec_push(L->arena, &L->paths, canon);
  AstFile *f = parse_file(L->arena, L->diag, file);
  ptrvec_push(L->arena, &L->files, f);
  ptrvec_push(L->arena, &L->stack, canon);
  load_imports(L, f, dir_of(L->arena, path));
  L->stack.len--;
  return 1;
}

LoadedProgram load_program(Arena *arena, Diag *diag, const char *path) {
  Loader L;
  memset(&L, 0, sizeof L);
  L.arena = arena;
  L.diag = diag;
  load_one(&L, path, path, span_none);
  LoadedProgram p = {(AstFile **)L.files.items, L.files.len};
  return p;
}
