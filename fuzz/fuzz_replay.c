/* fuzz_replay.c - main() of a fuzz target outside libFuzzer: runs saved
 * inputs through LLVMFuzzerTestOneInput in the ordinary build, so that a
 * crash the fuzzer found stays a failing test if the bug returns.
 *
 *   replay_<target> [--expect TEXT]... FILE|DIR...
 *
 * A folder stands for its files but the *.expect ones (see
 * tests/reliability.cmake). Prints the readers' messages for each input.
 * With --expect, every TEXT must appear in the messages of every input (the
 * diagnostic the fix gave); exit 1 otherwise. A crash is a signal, a
 * sanitizer report an abort. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

static const char *expect[16];
static int nexpect, failures, inputs;

static void replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    failures++;
    return;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0, got;
  do {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      buf = realloc(buf, cap);
      if (!buf) abort();
    }
    got = fread(buf + len, 1, cap - len, f);
    len += got;
  } while (got);
  fclose(f);
  /* exactly len bytes, as libFuzzer hands them over */
  uint8_t *exact = fuzz_copy(buf, len);
  free(buf);
  fuzz_notes_reset();
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  inputs++;
  printf("== %s (%zu bytes)\n%s", path, len, fuzz_notes());
  for (int i = 0; i < nexpect; i++)
    if (!strstr(fuzz_notes(), expect[i])) {
      printf("replay: FAILED: %s: no message contains \"%s\"\n", path, expect[i]);
      failures++;
    }
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot read %s\n", dir);
    failures++;
    return;
  }
  char **names = NULL;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t nl = strlen(de->d_name);
    if (de->d_name[0] == '.' || (nl > 7 && !strcmp(de->d_name + nl - 7, ".expect"))) continue; /* not inputs */
    names = realloc(names, (n + 1) * sizeof *names);
    if (!names) abort();
    size_t l = strlen(dir) + strlen(de->d_name) + 2;
    names[n] = malloc(l);
    if (!names[n]) abort();
    snprintf(names[n++], l, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    replay_file(names[i]);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  fuzz_verbose = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--expect") && i + 1 < argc && nexpect < 16) {
      expect[nexpect++] = argv[++i];
      continue;
    }
    struct stat st;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) replay_dir(argv[i]);
    else replay_file(argv[i]);
  }
  if (!inputs && !failures) {
    fprintf(stderr, "usage: %s [--expect TEXT]... FILE|DIR...\n", argv[0]);
    return 2;
  }
  printf("replay: %d input%s, %s\n", inputs, inputs == 1 ? "" : "s", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
