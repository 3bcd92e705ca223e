/* main.c - the hpdlc driver: reads the command line and runs the phases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "loader.h"

static int usage_error(const char *what, const char *arg) {
  fprintf(stderr, "hpdlc: %s%s\nTry 'hpdlc --help'.\n", what, arg);
  return 2;
}

static void print_help(void) {
  puts("usage: hpdlc <command> [options] FILE...\n"
       "\n"
       "commands:\n"
       "  check FILE...        check files and report every error\n"
       "  emit ast FILE        print the syntax tree\n"
       "  emit source FILE     print the file in canonical form\n"
       "\n"
       "options:\n"
       "  --help               show help (also: hpdlc <command> --help)\n"
       "  --version            show the version");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_help();
    return 2;
  }
  const char *verb = argv[1];
  if (!strcmp(verb, "--help") || !strcmp(verb, "-h")) {
    print_help();
    return 0;
  }
  if (!strcmp(verb, "--version")) {
    printf("hpdlc %s\n", HPDL_VERSION);
    return 0;
  }
  int emit_ast = 0, emit_src = 0, first = 2;
  if (!strcmp(verb, "emit")) {
    if (argc < 3) return usage_error("emit: missing stage", "");
    if (!strcmp(argv[2], "ast")) emit_ast = 1;
    else if (!strcmp(argv[2], "source")) emit_src = 1;
    else return usage_error("emit: unknown stage ", argv[2]);
    first = 3;
  } else if (strcmp(verb, "check") != 0) {
    return usage_error("unknown command ", verb);
  }
  Diag *diag = diag_new(stderr);
  diag_set_color(diag, isatty(2));
  int status = 0;
  for (int i = first; i < argc; i++) {
    Arena *arena = arena_new();
    LoadedProgram prog = load_program(arena, diag, argv[i]);
    if (diag_error_count(diag) == 0 && prog.nfiles > 0) {
      if (emit_ast) ast_dump_file(stdout, prog.files[0]);
      if (emit_src) ast_print_file(stdout, prog.files[0]);
    }
    if (diag_error_count(diag)) status = 1;
    arena_free(arena);
  }
  diag_free(diag);
  return status;
}
