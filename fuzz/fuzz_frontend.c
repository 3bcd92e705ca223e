/* fuzz_frontend.c - libFuzzer target for the front end.
 *
 * Any bytes go through the scanner and parser; every diagnostic and printout
 * goes to /dev/null. A crash, a sanitizer report or a hang is a bug. When the
 * input parses cleanly, the canonical printout must parse cleanly too and
 * print the same text again (the round trip `hpdlc emit source` promises).
 * Then the checker and the lowering run over it; their IR must verify.
 * Imports are not followed: the loader is not involved, nothing touches the
 * disk. */
#define _GNU_SOURCE /* open_memstream on older C libraries */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "ir.h"
#include "loader.h"
#include "lower.h"
#include "parse.h"
#include "sema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull(void) {
  static FILE *f;
  if (!f) {
    f = fopen("/dev/null", "w");
    if (!f) abort();
  }
  return f;
}

/* Canonical text of a tree, malloc'ed; *len gets its length. */
static char *print_to_string(const AstFile *file, size_t *len) {
  char *buf = NULL;
  FILE *m = open_memstream(&buf, len);
  if (!m) abort();
  ast_print_file(m, file);
  if (fclose(m) != 0) abort();
  return buf;
}

static void round_trip_failed(const char *why, const uint8_t *input, size_t input_len,
                              const char *first, size_t first_len, const char *second,
                              size_t second_len) {
  fprintf(stderr, "round trip failed: %s\n--- input (%zu bytes)\n", why, input_len);
  fwrite(input, 1, input_len, stderr);
  fprintf(stderr, "\n--- first print (%zu bytes)\n", first_len);
  fwrite(first, 1, first_len, stderr);
  if (second) {
    fprintf(stderr, "\n--- second print (%zu bytes)\n", second_len);
    fwrite(second, 1, second_len, stderr);
  }
  fprintf(stderr, "\n---\n");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(devnull());
  int file = diag_add_file(diag, "fuzz.hpd", (const char *)data, size);
  AstFile *tree = parse_file(arena, diag, file);

  /* Whatever parsed, even next to errors, must print and dump safely. */
  ast_print_file(devnull(), tree);
  ast_dump_file(devnull(), tree);

  if (diag_error_count(diag) == 0) {
    size_t len1 = 0, len2 = 0;
    char *text1 = print_to_string(tree, &len1);

    /* Diagnostics of the reprint go to stderr: when it fails they explain why. */
    Diag *diag2 = diag_new(devnull());
    int file2 = diag_add_file(diag2, "printed.hpd", text1, len1);
    AstFile *tree2 = parse_file(arena, diag2, file2);
    if (diag_error_count(diag2) != 0) {
      Diag *loud = diag_new(stderr);
      int f3 = diag_add_file(loud, "printed.hpd", text1, len1);
      parse_file(arena, loud, f3);
      diag_free(loud);
      round_trip_failed("the printed text does not parse", data, size, text1, len1, NULL, 0);
    }
    char *text2 = print_to_string(tree2, &len2);
    if (len1 != len2 || memcmp(text1, text2, len1) != 0)
      round_trip_failed("printing the reparsed text gives different text", data, size, text1,
                        len1, text2, len2);
    free(text2);
    free(text1);
    diag_free(diag2);

    /* Semantic analysis and lowering of whatever parsed: errors are fine,
     * crashes and IR that does not verify are not. */
    AstFile *files[1] = {tree};
    LoadedProgram prog = {files, 1};
    int bad_cli = 0;
    SemOptions opts = {NULL, 0, NULL, 0, NULL, &bad_cli};
    SemModel *m = sema_check(arena, diag, &prog, &opts);
    if (m && m->train.micro_batch > 0 && m->train.micro_batch < 1024) {
      IrModule *ir = lower_model(arena, diag, m, m->train.micro_batch);
      if (ir && ir_verify(ir, stderr)) abort();
    }
  }

  diag_free(diag);
  arena_free(arena);
  return 0;
}
